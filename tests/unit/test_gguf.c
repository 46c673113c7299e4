/* Unit tests for the GGUF reader (src/model/gguf.c, include/osprey/gguf.h).
 *
 * Every file here is built byte by byte by a small writer (gb_*), following ggml/docs/gguf.md, so
 * each test states exactly which field is wrong. The good files check that every metadata value
 * type (nested arrays included), general.alignment, v2 and v3 and the tensor infos read back as
 * written; the bad ones check that the reader answers with the right non-OK osp_status and a message
 * naming the file and the field (osp_last_error()), and never crashes: the ASan build
 * (make test-asan) runs the same tests, and memory inputs are exact-size heap copies so a read one
 * byte too far is caught. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "osprey/gguf.h"

/* ---- a GGUF writer ----------------------------------------------------------------------------- */

enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 };
enum { GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_1 = 3, GGML_Q8_0 = 8 };

typedef struct gb {
    uint8_t *p; /* [n] bytes written so far */
    size_t n, cap;
} gb;

static void gb_put(gb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        assert_non_null(b->p);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
/* GGUF is little-endian, and so is every machine osprey runs on. */
static void gb_u8(gb *b, uint8_t v) { gb_put(b, &v, 1); }
static void gb_u16(gb *b, uint16_t v) { gb_put(b, &v, 2); }
static void gb_u32(gb *b, uint32_t v) { gb_put(b, &v, 4); }
static void gb_u64(gb *b, uint64_t v) { gb_put(b, &v, 8); }
static void gb_f32(gb *b, float v) { gb_put(b, &v, 4); }
static void gb_f64(gb *b, double v) { gb_put(b, &v, 8); }
static void gb_str(gb *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static void gb_pad(gb *b, size_t align) {
    while (b->n % align) gb_u8(b, 0);
}
static void gb_free(gb *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}
static void gb_header(gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
/* A key and its value type; the caller writes the value. */
static void gb_key(gb *b, const char *key, uint32_t type) {
    gb_str(b, key);
    gb_u32(b, type);
}
static void gb_kv_u32(gb *b, const char *key, uint32_t v) {
    gb_key(b, key, T_U32);
    gb_u32(b, v);
}
static void gb_kv_str(gb *b, const char *key, const char *v) {
    gb_key(b, key, T_STR);
    gb_str(b, v);
}
/* A tensor info with up to 4 dimensions (ne[0] first). */
static void gb_tensor(gb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                      uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gb_u64(b, ne[d]);
    gb_u32(b, type);
    gb_u64(b, offset);
}
/* Data section of `n` bytes 0, 1, 2, ... after padding to `align`. */
static void gb_data(gb *b, size_t align, size_t n) {
    gb_pad(b, align);
    for (size_t i = 0; i < n; i++) gb_u8(b, (uint8_t)i);
}

/* ---- the reference file: every value type, nested arrays, two tensors -------------------------- */

#define N_ALL_KV 30

/* Writes the reference file. alignment 0: no general.alignment key (default 32). The last tensor's
 * data ends exactly at the end of the file, so every shorter prefix is malformed. */
static void build_all_types(gb *b, uint32_t version, uint32_t alignment) {
    uint32_t align = alignment ? alignment : 32;
    gb_header(b, version, 2, N_ALL_KV - (alignment ? 0 : 1));
    gb_kv_str(b, "general.architecture", "llama");
    if (alignment) gb_kv_u32(b, "general.alignment", alignment);
    gb_key(b, "t.u8", T_U8), gb_u8(b, 200);
    gb_key(b, "t.i8", T_I8), gb_u8(b, (uint8_t)-100);
    gb_key(b, "t.u16", T_U16), gb_u16(b, 65535);
    gb_key(b, "t.i16", T_I16), gb_u16(b, (uint16_t)-30000);
    gb_key(b, "t.u32", T_U32), gb_u32(b, 4000000000u);
    gb_key(b, "t.i32", T_I32), gb_u32(b, (uint32_t)-2000000000);
    gb_key(b, "t.f32", T_F32), gb_f32(b, 1.5f);
    gb_key(b, "t.bool", T_BOOL), gb_u8(b, 1);
    gb_key(b, "t.false", T_BOOL), gb_u8(b, 0);
    gb_key(b, "t.str", T_STR), gb_str(b, "h\xc3\xa9llo");
    gb_key(b, "t.empty", T_STR), gb_str(b, "");
    gb_key(b, "t.u64", T_U64), gb_u64(b, UINT64_MAX);
    gb_key(b, "t.i64", T_I64), gb_u64(b, (uint64_t)INT64_MIN);
    gb_key(b, "t.f64", T_F64), gb_f64(b, -0.25);
    gb_key(b, "a.u8", T_ARR), gb_u32(b, T_U8), gb_u64(b, 3), gb_u8(b, 1), gb_u8(b, 2), gb_u8(b, 255);
    gb_key(b, "a.i8", T_ARR), gb_u32(b, T_I8), gb_u64(b, 2), gb_u8(b, (uint8_t)-1), gb_u8(b, 7);
    gb_key(b, "a.u16", T_ARR), gb_u32(b, T_U16), gb_u64(b, 2), gb_u16(b, 1), gb_u16(b, 65535);
    gb_key(b, "a.i16", T_ARR), gb_u32(b, T_I16), gb_u64(b, 1), gb_u16(b, (uint16_t)-2);
    gb_key(b, "a.u32", T_ARR), gb_u32(b, T_U32), gb_u64(b, 2), gb_u32(b, 7), gb_u32(b, UINT32_MAX);
    gb_key(b, "a.i32", T_ARR), gb_u32(b, T_I32), gb_u64(b, 2), gb_u32(b, (uint32_t)-7), gb_u32(b, 9);
    gb_key(b, "a.f32", T_ARR), gb_u32(b, T_F32), gb_u64(b, 2), gb_f32(b, 0.5f), gb_f32(b, -3.0f);
    gb_key(b, "a.bool", T_ARR), gb_u32(b, T_BOOL), gb_u64(b, 2), gb_u8(b, 0), gb_u8(b, 1);
    gb_key(b, "a.u64", T_ARR), gb_u32(b, T_U64), gb_u64(b, 1), gb_u64(b, UINT64_MAX);
    gb_key(b, "a.i64", T_ARR), gb_u32(b, T_I64), gb_u64(b, 1), gb_u64(b, (uint64_t)-5);
    gb_key(b, "a.f64", T_ARR), gb_u32(b, T_F64), gb_u64(b, 1), gb_f64(b, 1e300);
    gb_key(b, "a.str", T_ARR), gb_u32(b, T_STR), gb_u64(b, 3);
    gb_str(b, "<s>"), gb_str(b, ""), gb_str(b, "world");
    gb_key(b, "a.empty", T_ARR), gb_u32(b, T_U32), gb_u64(b, 0);
    /* [[1, 2], ["x"], [[-1]], []] */
    gb_key(b, "a.nested", T_ARR), gb_u32(b, T_ARR), gb_u64(b, 4);
    gb_u32(b, T_U8), gb_u64(b, 2), gb_u8(b, 1), gb_u8(b, 2);
    gb_u32(b, T_STR), gb_u64(b, 1), gb_str(b, "x");
    gb_u32(b, T_ARR), gb_u64(b, 1), gb_u32(b, T_I32), gb_u64(b, 1), gb_u32(b, (uint32_t)-1);
    gb_u32(b, T_F32), gb_u64(b, 0);
    /* Tensors: w [8, 2] f32 (64 bytes) at 0, n [align/2] f16 (align bytes) right after. */
    uint64_t ne_w[2] = {8, 2}, ne_n[1] = {align / 2};
    uint64_t off_n = (64 + align - 1) / align * align;
    gb_tensor(b, "w", 2, ne_w, GGML_F32, 0);
    gb_tensor(b, "n", 1, ne_n, GGML_F16, off_n);
    gb_data(b, align, off_n + align);
}

/* ---- fixtures and helpers ---------------------------------------------------------------------- */

static char g_dir[64];

static int setup_dir(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/osp_test_gguf_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* Writes b to <tmp>/<name> and returns the path (static storage, valid until the next call). */
static const char *write_file(const char *name, const gb *b) {
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (b->n) assert_int_equal(fwrite(b->p, 1, b->n, f), b->n);
    assert_int_equal(fclose(f), 0);
    return path;
}

/* Opens the first n bytes of b from an exact-size heap copy (so ASan sees any over-read). The copy
 * is kept in *keep when the open succeeds (the handle points into it). */
static osp_status open_mem(const gb *b, size_t n, const char *name, osp_gguf **g, uint8_t **keep) {
    uint8_t *copy = malloc(n ? n : 1);
    assert_non_null(copy);
    if (n) memcpy(copy, b->p, n);
    *g = NULL;
    osp_status s = osp_gguf_open_memory(copy, n, name, g);
    if (s == OSP_OK) {
        *keep = copy;
    } else {
        assert_null(*g);
        free(copy);
    }
    return s;
}

/* Asserts status `want` and that the message names `name` (the file) and `field`. */
#define assert_error(got, want, name, field) assert_error_at(got, want, name, field, __FILE__, __LINE__)
static void assert_error_at(osp_status got, osp_status want, const char *name, const char *field,
                            const char *file, int line) {
    const char *msg = osp_last_error();
    if (got != want || !strstr(msg, name) || (field && !strstr(msg, field))) {
        print_error("%s:%d: got %s, want %s; message \"%s\" should name \"%s\" and \"%s\"\n", file,
                    line, osp_status_str(got), osp_status_str(want), msg, name, field ? field : "");
        fail();
    }
}

/* Builds a file with the given bytes in memory, expects the error, and also checks it through a
 * real file (osp_gguf_open) so both entry points agree. */
#define expect_error(b, name, want, field) expect_error_at(b, name, want, field, __FILE__, __LINE__)
static void expect_error_at(const gb *b, const char *name, osp_status want, const char *field,
                            const char *file, int line) {
    osp_gguf *g;
    uint8_t *keep = NULL;
    osp_status s = open_mem(b, b->n, name, &g, &keep);
    assert_error_at(s, want, name, field, file, line);
    const char *path = write_file(name, b);
    g = (osp_gguf *)0x1;
    s = osp_gguf_open(path, &g);
    assert_error_at(s, want, path, field, file, line);
    assert_null(g);
}

/* ---- good files -------------------------------------------------------------------------------- */

static void check_all_types(osp_gguf *g, uint32_t version, uint32_t align) {
    assert_int_equal(osp_gguf_version(g), version);
    assert_int_equal(osp_gguf_alignment(g), align);
    assert_int_equal(osp_gguf_n_kv(g), osp_gguf_find(g, "general.alignment") ? N_ALL_KV : N_ALL_KV - 1);
    assert_int_equal(osp_gguf_data_offset(g) % align, 0);

    /* Scalars, through the decoded values... */
    const osp_gguf_kv *kv = osp_gguf_find(g, "t.u8");
    assert_non_null(kv);
    assert_string_equal(kv->key, "t.u8");
    assert_int_equal(kv->value.type, OSP_GGUF_TYPE_UINT8);
    assert_int_equal(kv->value.v.u64, 200);
    assert_int_equal(osp_gguf_find(g, "t.i8")->value.v.i64, -100);
    assert_int_equal(osp_gguf_find(g, "t.u16")->value.v.u64, 65535);
    assert_int_equal(osp_gguf_find(g, "t.i16")->value.v.i64, -30000);
    assert_int_equal(osp_gguf_find(g, "t.u32")->value.v.u64, 4000000000u);
    assert_int_equal(osp_gguf_find(g, "t.i32")->value.v.i64, -2000000000);
    assert_true(osp_gguf_find(g, "t.f32")->value.v.f64 == 1.5);
    assert_int_equal(osp_gguf_find(g, "t.bool")->value.type, OSP_GGUF_TYPE_BOOL);
    assert_true(osp_gguf_find(g, "t.u64")->value.v.u64 == UINT64_MAX);
    assert_true(osp_gguf_find(g, "t.i64")->value.v.i64 == INT64_MIN);
    assert_int_equal(osp_gguf_find(g, "t.f64")->value.type, OSP_GGUF_TYPE_FLOAT64);
    assert_true(osp_gguf_find(g, "t.f64")->value.v.f64 == -0.25);

    /* ... and through the typed getters. */
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    osp_gguf_str s;
    assert_int_equal(osp_gguf_get_u32(g, "t.u8", &u32), OSP_OK);
    assert_int_equal(u32, 200);
    assert_int_equal(osp_gguf_get_u32(g, "t.u32", &u32), OSP_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(osp_gguf_get_i64(g, "t.i16", &i64), OSP_OK);
    assert_int_equal(i64, -30000);
    assert_int_equal(osp_gguf_get_i64(g, "t.u32", &i64), OSP_OK);
    assert_int_equal(i64, 4000000000);
    assert_int_equal(osp_gguf_get_i64(g, "t.i64", &i64), OSP_OK);
    assert_true(i64 == INT64_MIN);
    assert_int_equal(osp_gguf_get_f32(g, "t.f32", &f32), OSP_OK);
    assert_true(f32 == 1.5f);
    assert_int_equal(osp_gguf_get_f32(g, "t.f64", &f32), OSP_OK);
    assert_true(f32 == -0.25f);
    assert_int_equal(osp_gguf_get_bool(g, "t.bool", &b), OSP_OK);
    assert_true(b);
    assert_int_equal(osp_gguf_get_bool(g, "t.false", &b), OSP_OK);
    assert_false(b);
    assert_int_equal(osp_gguf_get_str(g, "t.str", &s), OSP_OK);
    assert_int_equal(s.len, 6);
    assert_memory_equal(s.data, "h\xc3\xa9llo", 6);
    assert_int_equal(osp_gguf_get_str(g, "t.empty", &s), OSP_OK);
    assert_int_equal(s.len, 0);
    assert_int_equal(osp_gguf_get_str(g, "general.architecture", &s), OSP_OK);
    assert_int_equal(s.len, 5);
    assert_memory_equal(s.data, "llama", 5);

    /* Fixed-size arrays: element type, count, and every element through the readers. */
    const osp_gguf_value *a;
    assert_int_equal(osp_gguf_get_arr(g, "a.u8", OSP_GGUF_TYPE_UINT8, &a), OSP_OK);
    assert_int_equal(a->v.arr.n, 3);
    assert_int_equal(osp_gguf_arr_i64(a, 0), 1);
    assert_int_equal(osp_gguf_arr_i64(a, 2), 255);
    assert_int_equal(osp_gguf_get_arr(g, "a.i8", OSP_GGUF_TYPE_INT8, &a), OSP_OK);
    assert_int_equal(osp_gguf_arr_i64(a, 0), -1);
    assert_int_equal(osp_gguf_arr_i64(a, 1), 7);
    assert_int_equal(osp_gguf_get_arr(g, "a.u16", OSP_GGUF_TYPE_UINT16, &a), OSP_OK);
    assert_int_equal(osp_gguf_arr_i64(a, 1), 65535);
    assert_int_equal(osp_gguf_get_arr(g, "a.i16", OSP_GGUF_TYPE_INT16, &a), OSP_OK);
    assert_int_equal(osp_gguf_arr_i64(a, 0), -2);
    assert_int_equal(osp_gguf_get_arr(g, "a.u32", OSP_GGUF_TYPE_UINT32, &a), OSP_OK);
    assert_int_equal(osp_gguf_arr_i64(a, 0), 7);
    assert_int_equal(osp_gguf_arr_i64(a, 1), UINT32_MAX);
    assert_int_equal(osp_gguf_get_arr(g, "a.i32", OSP_GGUF_TYPE_INT32, &a), OSP_OK);
    assert_int_equal(osp_gguf_arr_i64(a, 0), -7);
    assert_true(osp_gguf_arr_f64(a, 1) == 9.0);
    assert_int_equal(osp_gguf_get_arr(g, "a.f32", OSP_GGUF_TYPE_FLOAT32, &a), OSP_OK);
    assert_true(osp_gguf_arr_f64(a, 0) == 0.5);
    assert_true(osp_gguf_arr_f64(a, 1) == -3.0);
    assert_int_equal(osp_gguf_get_arr(g, "a.bool", OSP_GGUF_TYPE_BOOL, &a), OSP_OK);
    assert_int_equal(osp_gguf_arr_i64(a, 0), 0);
    assert_int_equal(osp_gguf_arr_i64(a, 1), 1);
    assert_int_equal(osp_gguf_get_arr(g, "a.u64", OSP_GGUF_TYPE_UINT64, &a), OSP_OK);
    assert_true(osp_gguf_arr_f64(a, 0) == 18446744073709551615.0);
    assert_int_equal(osp_gguf_get_arr(g, "a.i64", OSP_GGUF_TYPE_INT64, &a), OSP_OK);
    assert_int_equal(osp_gguf_arr_i64(a, 0), -5);
    assert_int_equal(osp_gguf_get_arr(g, "a.f64", OSP_GGUF_TYPE_FLOAT64, &a), OSP_OK);
    assert_true(osp_gguf_arr_f64(a, 0) == 1e300);
    assert_true(osp_gguf_arr_i64(a, 0) == INT64_MAX); /* saturates, no undefined cast */
    assert_int_equal(osp_gguf_get_arr(g, "a.empty", -1, &a), OSP_OK);
    assert_int_equal(a->v.arr.elem_type, OSP_GGUF_TYPE_UINT32);
    assert_int_equal(a->v.arr.n, 0);

    /* Strings. */
    assert_int_equal(osp_gguf_get_arr(g, "a.str", OSP_GGUF_TYPE_STRING, &a), OSP_OK);
    assert_int_equal(a->v.arr.n, 3);
    assert_int_equal(a->v.arr.strs[0].len, 3);
    assert_memory_equal(a->v.arr.strs[0].data, "<s>", 3);
    assert_int_equal(a->v.arr.strs[1].len, 0);
    assert_int_equal(a->v.arr.strs[2].len, 5);
    assert_memory_equal(a->v.arr.strs[2].data, "world", 5);

    /* Nested: [[1, 2], ["x"], [[-1]], []]. */
    assert_int_equal(osp_gguf_get_arr(g, "a.nested", OSP_GGUF_TYPE_ARRAY, &a), OSP_OK);
    assert_int_equal(a->v.arr.n, 4);
    const osp_gguf_value *e = a->v.arr.elems;
    assert_int_equal(e[0].type, OSP_GGUF_TYPE_ARRAY);
    assert_int_equal(e[0].v.arr.elem_type, OSP_GGUF_TYPE_UINT8);
    assert_int_equal(e[0].v.arr.n, 2);
    assert_int_equal(osp_gguf_arr_i64(&e[0], 1), 2);
    assert_int_equal(e[1].v.arr.elem_type, OSP_GGUF_TYPE_STRING);
    assert_int_equal(e[1].v.arr.n, 1);
    assert_memory_equal(e[1].v.arr.strs[0].data, "x", 1);
    assert_int_equal(e[2].v.arr.elem_type, OSP_GGUF_TYPE_ARRAY);
    assert_int_equal(e[2].v.arr.n, 1);
    assert_int_equal(e[2].v.arr.elems[0].v.arr.elem_type, OSP_GGUF_TYPE_INT32);
    assert_int_equal(osp_gguf_arr_i64(&e[2].v.arr.elems[0], 0), -1);
    assert_int_equal(e[3].v.arr.elem_type, OSP_GGUF_TYPE_FLOAT32);
    assert_int_equal(e[3].v.arr.n, 0);

    /* Pairs come back in file order. */
    assert_string_equal(osp_gguf_kv_at(g, 0)->key, "general.architecture");
    assert_null(osp_gguf_kv_at(g, osp_gguf_n_kv(g)));

    /* Tensors. */
    assert_int_equal(osp_gguf_n_tensors(g), 2);
    const osp_gguf_tensor *w = osp_gguf_find_tensor(g, "w");
    const osp_gguf_tensor *n = osp_gguf_find_tensor(g, "n");
    assert_non_null(w);
    assert_non_null(n);
    assert_ptr_equal(w, osp_gguf_tensor_at(g, 0));
    assert_null(osp_gguf_tensor_at(g, 2));
    assert_null(osp_gguf_find_tensor(g, "nope"));
    assert_int_equal(w->n_dims, 2);
    assert_int_equal(w->ne[0], 8);
    assert_int_equal(w->ne[1], 2);
    assert_int_equal(w->ne[2], 1);
    assert_int_equal(w->ne[3], 1);
    assert_int_equal(w->type, GGML_F32);
    assert_int_equal(w->offset, 0);
    assert_int_equal(w->nbytes, 64);
    assert_int_equal(n->n_dims, 1);
    assert_int_equal(n->ne[0], align / 2);
    assert_int_equal(n->type, GGML_F16);
    assert_int_equal(n->nbytes, align);
    assert_int_equal(n->offset % align, 0);
    assert_true(n->offset >= 64);
    /* The data section holds bytes 0, 1, 2, ... so a tensor's first byte is its offset (mod 256). */
    assert_int_equal(((const uint8_t *)w->data)[1], 1);
    assert_int_equal(((const uint8_t *)n->data)[0], (uint8_t)n->offset);
}

static void test_all_types_v3(void **state) {
    (void)state;
    gb b = {0};
    build_all_types(&b, 3, 64);
    osp_gguf *g;
    uint8_t *keep = NULL;
    assert_int_equal(open_mem(&b, b.n, "all.gguf", &g, &keep), OSP_OK);
    assert_string_equal(osp_gguf_path(g), "all.gguf");
    check_all_types(g, 3, 64);
    osp_gguf_close(g);
    free(keep);

    const char *path = write_file("all_v3.gguf", &b);
    assert_int_equal(osp_gguf_open(path, &g), OSP_OK);
    assert_string_equal(osp_gguf_path(g), path);
    check_all_types(g, 3, 64);
    osp_gguf_close(g);
    gb_free(&b);
}

static void test_all_types_v2(void **state) {
    (void)state;
    gb b = {0};
    build_all_types(&b, 2, 64);
    const char *path = write_file("all_v2.gguf", &b);
    osp_gguf *g;
    assert_int_equal(osp_gguf_open(path, &g), OSP_OK);
    check_all_types(g, 2, 64);
    osp_gguf_close(g);
    gb_free(&b);
}

static void test_default_alignment(void **state) {
    (void)state;
    gb b = {0};
    build_all_types(&b, 3, 0);
    osp_gguf *g;
    uint8_t *keep = NULL;
    assert_int_equal(open_mem(&b, b.n, "noalign.gguf", &g, &keep), OSP_OK);
    assert_null(osp_gguf_find(g, "general.alignment"));
    check_all_types(g, 3, 32);
    osp_gguf_close(g);
    free(keep);
    gb_free(&b);
}

static void test_alignment_8_and_quant_types(void **state) {
    (void)state;
    gb b = {0};
    gb_header(&b, 3, 2, 1);
    gb_kv_u32(&b, "general.alignment", 8);
    uint64_t ne_q4[2] = {64, 3}, ne_q8[1] = {32};
    gb_tensor(&b, "q4", 2, ne_q4, GGML_Q4_1, 0);    /* 2 blocks * 3 rows * 20 bytes = 120 */
    gb_tensor(&b, "q8", 1, ne_q8, GGML_Q8_0, 120);  /* 1 block of 34 bytes */
    gb_data(&b, 8, 154);
    osp_gguf *g;
    uint8_t *keep = NULL;
    assert_int_equal(open_mem(&b, b.n, "q.gguf", &g, &keep), OSP_OK);
    assert_int_equal(osp_gguf_alignment(g), 8);
    assert_int_equal(osp_gguf_find_tensor(g, "q4")->nbytes, 120);
    assert_int_equal(osp_gguf_find_tensor(g, "q8")->nbytes, 34);
    osp_gguf_close(g);
    free(keep);
    gb_free(&b);
}

static void test_getter_errors(void **state) {
    (void)state;
    gb b = {0};
    build_all_types(&b, 3, 32);
    osp_gguf *g;
    uint8_t *keep = NULL;
    assert_int_equal(open_mem(&b, b.n, "get.gguf", &g, &keep), OSP_OK);
    uint32_t u32;
    int64_t i64;
    float f32;
    bool bl;
    osp_gguf_str s;
    const osp_gguf_value *a;
    assert_error(osp_gguf_get_u32(g, "no.such", &u32), OSP_ERR_NOT_FOUND, "get.gguf", "no.such");
    assert_error(osp_gguf_get_str(g, "no.such", &s), OSP_ERR_NOT_FOUND, "get.gguf", "no.such");
    assert_error(osp_gguf_get_u32(g, "t.i8", &u32), OSP_ERR_FORMAT, "get.gguf", "t.i8");
    assert_error(osp_gguf_get_u32(g, "t.u64", &u32), OSP_ERR_FORMAT, "get.gguf", "t.u64");
    assert_error(osp_gguf_get_i64(g, "t.u64", &i64), OSP_ERR_FORMAT, "get.gguf", "t.u64");
    assert_error(osp_gguf_get_i64(g, "t.str", &i64), OSP_ERR_FORMAT, "get.gguf", "t.str");
    assert_error(osp_gguf_get_f32(g, "t.u32", &f32), OSP_ERR_FORMAT, "get.gguf", "t.u32");
    assert_error(osp_gguf_get_bool(g, "t.u8", &bl), OSP_ERR_FORMAT, "get.gguf", "t.u8");
    assert_error(osp_gguf_get_str(g, "a.str", &s), OSP_ERR_FORMAT, "get.gguf", "a.str");
    assert_error(osp_gguf_get_arr(g, "t.str", -1, &a), OSP_ERR_FORMAT, "get.gguf", "t.str");
    assert_error(osp_gguf_get_arr(g, "a.u8", OSP_GGUF_TYPE_INT32, &a), OSP_ERR_FORMAT, "get.gguf",
                 "a.u8");
    osp_gguf_close(g);
    free(keep);
    gb_free(&b);
}

/* ---- missing, empty, truncated ----------------------------------------------------------------- */

static void test_missing_and_empty(void **state) {
    (void)state;
    char path[256];
    snprintf(path, sizeof path, "%s/does-not-exist.gguf", g_dir);
    osp_gguf *g = (osp_gguf *)0x1;
    assert_error(osp_gguf_open(path, &g), OSP_ERR_IO, path, NULL);
    assert_null(g);

    gb b = {0};
    const char *empty = write_file("empty.gguf", &b);
    assert_error(osp_gguf_open(empty, &g), OSP_ERR_IO, empty, NULL);
    assert_null(g);
    assert_error(osp_gguf_open(g_dir, &g), OSP_ERR_IO, g_dir, NULL); /* a directory */
    assert_error(osp_gguf_open_memory("", 0, "mem-empty", &g), OSP_ERR_IO, "mem-empty", NULL);
}

static void test_every_prefix_is_rejected(void **state) {
    (void)state;
    gb b = {0};
    build_all_types(&b, 3, 32);
    osp_gguf *g;
    uint8_t *keep = NULL;
    assert_int_equal(open_mem(&b, b.n, "full.gguf", &g, &keep), OSP_OK);
    osp_gguf_close(g);
    free(keep);
    for (size_t n = 0; n < b.n; n++) {
        char name[64];
        snprintf(name, sizeof name, "prefix-%zu.gguf", n);
        osp_status s = open_mem(&b, n, name, &g, &keep);
        assert_error(s, n == 0 ? OSP_ERR_IO : OSP_ERR_FORMAT, name, NULL);
    }
    /* The same through real (mmapped) files, for a spread of lengths. */
    for (size_t n = 1; n < b.n; n += 37) {
        gb p = {0};
        gb_put(&p, b.p, n);
        const char *path = write_file("prefix.gguf", &p);
        g = (osp_gguf *)0x1;
        assert_error(osp_gguf_open(path, &g), OSP_ERR_FORMAT, path, NULL);
        assert_null(g);
        gb_free(&p);
    }
    gb_free(&b);
}

/* ---- header ------------------------------------------------------------------------------------ */

static void test_bad_magic(void **state) {
    (void)state;
    gb b = {0};
    build_all_types(&b, 3, 32);
    memcpy(b.p, "GGML", 4);
    expect_error(&b, "magic.gguf", OSP_ERR_FORMAT, "magic");
    gb_free(&b);
}

static void test_bad_version(void **state) {
    (void)state;
    static const uint32_t bad[] = {0, 1, 4, 0x03000000u /* v3 written big-endian */, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gb b = {0};
        build_all_types(&b, bad[i], 32);
        expect_error(&b, "version.gguf", OSP_ERR_UNSUPPORTED, "version");
        gb_free(&b);
    }
}

static void test_huge_counts(void **state) {
    (void)state;
    gb b = {0};
    gb_header(&b, 3, 0, UINT64_MAX);
    gb_kv_u32(&b, "k", 1);
    expect_error(&b, "nkv.gguf", OSP_ERR_FORMAT, "metadata_kv_count");
    gb_free(&b);

    gb_header(&b, 3, (uint64_t)1 << 62, 0);
    gb_data(&b, 32, 64);
    expect_error(&b, "ntensors.gguf", OSP_ERR_FORMAT, "tensor_count");
    gb_free(&b);

    /* Array counts: fixed-size, string and nested elements. */
    static const uint32_t elem[] = {T_U8, T_U64, T_STR, T_ARR};
    for (size_t i = 0; i < 4; i++) {
        gb_header(&b, 3, 0, 1);
        gb_key(&b, "big.array", T_ARR);
        gb_u32(&b, elem[i]);
        gb_u64(&b, (uint64_t)1 << 61);
        gb_data(&b, 1, 64);
        expect_error(&b, "arr.gguf", OSP_ERR_FORMAT, "big.array");
        gb_free(&b);
    }
    /* A nested array whose inner count is huge. */
    gb_header(&b, 3, 0, 1);
    gb_key(&b, "nest", T_ARR), gb_u32(&b, T_ARR), gb_u64(&b, 1);
    gb_u32(&b, T_U32), gb_u64(&b, UINT64_MAX / 2);
    gb_data(&b, 1, 16);
    expect_error(&b, "nest.gguf", OSP_ERR_FORMAT, "nest");
    gb_free(&b);
}

/* ---- metadata ---------------------------------------------------------------------------------- */

static void test_string_past_eof(void **state) {
    (void)state;
    gb b = {0};
    /* A key whose length runs past the end. */
    gb_header(&b, 3, 0, 1);
    gb_u64(&b, 1000);
    gb_put(&b, "general.name", 12);
    expect_error(&b, "key.gguf", OSP_ERR_FORMAT, "key");
    gb_free(&b);
    /* A string value, a string in an array, and a length of 2^64 - 1 (overflow bait). */
    static const uint64_t lens[] = {100, UINT64_MAX, UINT64_MAX - 7};
    for (size_t i = 0; i < 3; i++) {
        gb_header(&b, 3, 0, 1);
        gb_key(&b, "general.name", T_STR);
        gb_u64(&b, lens[i]);
        gb_put(&b, "abc", 3);
        expect_error(&b, "val.gguf", OSP_ERR_FORMAT, "general.name");
        gb_free(&b);

        gb_header(&b, 3, 0, 1);
        gb_key(&b, "tokenizer.ggml.tokens", T_ARR), gb_u32(&b, T_STR), gb_u64(&b, 2);
        gb_str(&b, "a");
        gb_u64(&b, lens[i]);
        gb_put(&b, "bcdefghijk", 10);
        expect_error(&b, "arrstr.gguf", OSP_ERR_FORMAT, "tokenizer.ggml.tokens");
        gb_free(&b);
    }
    /* A tensor name running past the end. */
    gb_header(&b, 3, 1, 0);
    gb_u64(&b, UINT64_MAX);
    gb_put(&b, "token_embd.weight-and-then-some-more-bytes", 40);
    expect_error(&b, "tname.gguf", OSP_ERR_FORMAT, "tensor");
    gb_free(&b);
}

static void test_duplicate_keys(void **state) {
    (void)state;
    gb b = {0};
    gb_header(&b, 3, 0, 3);
    gb_kv_str(&b, "general.architecture", "llama");
    gb_kv_u32(&b, "llama.block_count", 30);
    gb_kv_u32(&b, "llama.block_count", 31);
    expect_error(&b, "dup.gguf", OSP_ERR_FORMAT, "llama.block_count");
    gb_free(&b);

    /* Keys equal up to an embedded NUL would be indistinguishable as C strings. */
    gb_header(&b, 3, 0, 2);
    gb_kv_u32(&b, "a.b", 1);
    gb_u64(&b, 5), gb_put(&b, "a.b\0x", 5), gb_u32(&b, T_U32), gb_u32(&b, 2);
    osp_gguf *g;
    uint8_t *keep = NULL;
    assert_error(open_mem(&b, b.n, "nul.gguf", &g, &keep), OSP_ERR_FORMAT, "nul.gguf", NULL);
    gb_free(&b);
}

static void test_bad_value_types(void **state) {
    (void)state;
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_key(&b, "odd.type", 13);
    gb_u64(&b, 0);
    expect_error(&b, "vt.gguf", OSP_ERR_FORMAT, "odd.type");
    gb_free(&b);

    gb_header(&b, 3, 0, 1);
    gb_key(&b, "odd.elem", T_ARR), gb_u32(&b, 77), gb_u64(&b, 0);
    expect_error(&b, "et.gguf", OSP_ERR_FORMAT, "odd.elem");
    gb_free(&b);

    /* Arrays nested 64 deep: the reader must refuse (bounded recursion), not overflow the stack. */
    gb_header(&b, 3, 0, 1);
    gb_key(&b, "deep", T_ARR);
    for (int i = 0; i < 64; i++) gb_u32(&b, T_ARR), gb_u64(&b, 1);
    gb_u32(&b, T_U8), gb_u64(&b, 1), gb_u8(&b, 1);
    expect_error(&b, "deep.gguf", OSP_ERR_FORMAT, "deep");
    gb_free(&b);
}

static void test_bad_alignment(void **state) {
    (void)state;
    static const uint32_t bad[] = {0, 3, 48, 0x80000000u};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gb b = {0};
        gb_header(&b, 3, 0, 1);
        gb_kv_u32(&b, "general.alignment", bad[i]);
        expect_error(&b, "align.gguf", OSP_ERR_FORMAT, "general.alignment");
        gb_free(&b);
    }
    gb b = {0};
    gb_header(&b, 3, 0, 1);
    gb_key(&b, "general.alignment", T_U64), gb_u64(&b, 32);
    expect_error(&b, "align64.gguf", OSP_ERR_FORMAT, "general.alignment");
    gb_free(&b);
}

/* ---- tensors ----------------------------------------------------------------------------------- */

/* One or two tensors named "first" and "second" ([ne0] of type t at the given offsets), `data`
 * bytes of data after 32-byte padding. */
static void build_tensors(gb *b, int n, uint64_t ne0, uint32_t type, uint64_t off0, uint64_t off1,
                          size_t data) {
    gb_header(b, 3, (uint64_t)n, 1);
    gb_kv_str(b, "general.architecture", "llama");
    uint64_t ne[1] = {ne0};
    gb_tensor(b, "first", 1, ne, type, off0);
    if (n > 1) gb_tensor(b, "second", 1, ne, GGML_F32, off1);
    gb_data(b, 32, data);
}

static void test_tensor_offsets_past_eof(void **state) {
    (void)state;
    gb b = {0};
    build_tensors(&b, 1, 8, GGML_F32, 32, 0, 48); /* [32, 64) but only 48 bytes */
    expect_error(&b, "past.gguf", OSP_ERR_FORMAT, "first");
    gb_free(&b);
    build_tensors(&b, 1, 8, GGML_F32, (uint64_t)1 << 40, 0, 64);
    expect_error(&b, "far.gguf", OSP_ERR_FORMAT, "first");
    gb_free(&b);
    /* offset + size overflows 64 bits. */
    build_tensors(&b, 1, 8, GGML_F32, UINT64_MAX - 31, 0, 64);
    expect_error(&b, "wrap.gguf", OSP_ERR_FORMAT, "first");
    gb_free(&b);
    /* Element count that overflows: ne0 = 2^62 f32 values is 2^64 bytes. */
    build_tensors(&b, 1, (uint64_t)1 << 62, GGML_F32, 0, 0, 64);
    expect_error(&b, "huge.gguf", OSP_ERR_FORMAT, "first");
    gb_free(&b);
    /* The data section itself starts past the end (nothing after the tensor infos). */
    gb_header(&b, 3, 1, 0);
    uint64_t ne[1] = {8};
    gb_tensor(&b, "first", 1, ne, GGML_F32, 0);
    expect_error(&b, "nodata.gguf", OSP_ERR_FORMAT, NULL);
    gb_free(&b);
}

static void test_tensor_overlap_and_alignment(void **state) {
    (void)state;
    gb b = {0};
    build_tensors(&b, 2, 8, GGML_F32, 0, 0, 64); /* both at 0 */
    expect_error(&b, "same.gguf", OSP_ERR_FORMAT, "second");
    gb_free(&b);
    build_tensors(&b, 2, 16, GGML_F32, 0, 32, 128); /* first is [0, 64), second starts at 32 */
    expect_error(&b, "overlap.gguf", OSP_ERR_FORMAT, "first");
    gb_free(&b);
    build_tensors(&b, 2, 16, GGML_F32, 64, 32, 128); /* same, listed out of order */
    expect_error(&b, "overlap2.gguf", OSP_ERR_FORMAT, "second");
    gb_free(&b);
    build_tensors(&b, 1, 8, GGML_F32, 4, 0, 64); /* offset 4 with alignment 32 */
    expect_error(&b, "misaligned.gguf", OSP_ERR_FORMAT, "first");
    gb_free(&b);
}

static void test_tensor_bad_shapes_and_types(void **state) {
    (void)state;
    gb b = {0};
    static const uint32_t unknown[] = {4 /* Q4_2, removed */, 5, 200, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        build_tensors(&b, 1, 8, unknown[i], 0, 0, 64);
        expect_error(&b, "type.gguf", OSP_ERR_UNSUPPORTED, "first");
        gb_free(&b);
    }
    build_tensors(&b, 1, 48, GGML_Q4_1, 0, 0, 64); /* 48 is not a multiple of the block size 32 */
    expect_error(&b, "block.gguf", OSP_ERR_FORMAT, "first");
    gb_free(&b);

    static const uint32_t dims[] = {0, 5, 1000};
    for (size_t i = 0; i < 3; i++) {
        gb_header(&b, 3, 1, 0);
        gb_str(&b, "first");
        gb_u32(&b, dims[i]);
        for (int d = 0; d < 5; d++) gb_u64(&b, 1);
        gb_u32(&b, GGML_F32), gb_u64(&b, 0);
        gb_data(&b, 32, 64);
        expect_error(&b, "ndims.gguf", OSP_ERR_FORMAT, "first");
        gb_free(&b);
    }

    gb_header(&b, 3, 2, 0);
    uint64_t ne[1] = {8};
    gb_tensor(&b, "twin", 1, ne, GGML_F32, 0);
    gb_tensor(&b, "twin", 1, ne, GGML_F32, 32);
    gb_data(&b, 32, 64);
    expect_error(&b, "twins.gguf", OSP_ERR_FORMAT, "twin");
    gb_free(&b);
}

/* ---- the real model, when fetched -------------------------------------------------------------- */

static void test_real_model(void **state) {
    (void)state;
    const char *path = getenv("OSPREY_MODEL");
    if (!path || access(path, R_OK) != 0) skip();
    osp_gguf *g;
    assert_int_equal(osp_gguf_open(path, &g), OSP_OK);
    assert_int_equal(osp_gguf_version(g), 3);
    osp_gguf_str arch;
    assert_int_equal(osp_gguf_get_str(g, "general.architecture", &arch), OSP_OK);
    assert_int_equal(arch.len, 5);
    assert_memory_equal(arch.data, "llama", 5);
    uint32_t n_layer;
    assert_int_equal(osp_gguf_get_u32(g, "llama.block_count", &n_layer), OSP_OK);
    assert_int_equal(n_layer, 30);
    const osp_gguf_value *tokens;
    assert_int_equal(osp_gguf_get_arr(g, "tokenizer.ggml.tokens", OSP_GGUF_TYPE_STRING, &tokens),
                     OSP_OK);
    assert_int_equal(tokens->v.arr.n, 49152);
    assert_int_equal(osp_gguf_n_tensors(g), 272);
    assert_non_null(osp_gguf_find_tensor(g, "token_embd.weight"));
    osp_gguf_close(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_types_v3),
        cmocka_unit_test(test_all_types_v2),
        cmocka_unit_test(test_default_alignment),
        cmocka_unit_test(test_alignment_8_and_quant_types),
        cmocka_unit_test(test_getter_errors),
        cmocka_unit_test(test_missing_and_empty),
        cmocka_unit_test(test_every_prefix_is_rejected),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_string_past_eof),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_bad_value_types),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_tensor_offsets_past_eof),
        cmocka_unit_test(test_tensor_overlap_and_alignment),
        cmocka_unit_test(test_tensor_bad_shapes_and_types),
        cmocka_unit_test(test_real_model),
    };
    return cmocka_run_group_tests_name("gguf", tests, setup_dir, teardown_dir);
}
