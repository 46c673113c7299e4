/* Unit tests for the GGUF writer (src/model/gguf_write.c, the writer section of osprey/gguf.h).
 *
 * Round trips through the reader (osp_gguf_open): every metadata value and every tensor byte
 * written comes back equal, tensor offsets and the data section are aligned to 32, fill callbacks
 * are called in row order over several chunks, and copying every pair with add_value gives a
 * byte-identical file. Plus the refusals: duplicate keys and names, bad shapes, a failing fill
 * (which must leave no file behind) and an unwritable path. */
#include <math.h>
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

#include "core/dtype.h"
#include "osprey/gguf.h"

static char g_dir[64];

static int setup(void **state) {
    (void)state;
    strcpy(g_dir, "/tmp/osp_gguf_write_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *tmp_path(const char *name) {
    static char p[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    return p[k];
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return p;
}

/* ---- a fill callback that checks it is called in row order ------------------------------------- */

typedef struct fill_ctx {
    int64_t next_row;  /* the row the writer must ask for next */
    int64_t row_bytes;
    int calls;
} fill_ctx;

static uint8_t pattern(int64_t row, int64_t i) { return (uint8_t)(row * 31 + i * 7 + (row >> 8)); }

static osp_status fill_pattern(void *user, int64_t row0, int64_t n_rows, void *dst) {
    fill_ctx *c = user;
    assert_int_equal(row0, c->next_row);
    uint8_t *d = dst;
    for (int64_t r = 0; r < n_rows; r++)
        for (int64_t i = 0; i < c->row_bytes; i++) d[r * c->row_bytes + i] = pattern(row0 + r, i);
    c->next_row += n_rows;
    c->calls++;
    return OSP_OK;
}

static osp_status fill_fail(void *user, int64_t row0, int64_t n_rows, void *dst) {
    (void)user, (void)row0, (void)n_rows, (void)dst;
    return OSP_ERR_INTERNAL;
}

/* ---- round trip ------------------------------------------------------------------------------- */

static const char *k_strs[] = {"hello", "", "wörld", "a b c", "\xc4\xa0the"};
static const int32_t k_i32[] = {0, -1, 2147483647, -2147483647 - 1, 42};
static const float k_f32[] = {0.0f, -0.0f, 1.5f, 1e-30f, INFINITY, 3.14159265f};

static void test_round_trip(void **state) {
    (void)state;
    osp_gguf_writer *w;
    assert_int_equal(osp_gguf_writer_create(&w), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_str(w, "general.architecture", "llama"), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_u32(w, "k.u32", 4000000000u), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_i32(w, "k.i32", -123456), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_f32(w, "k.f32", 1e-5f), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_bool(w, "k.true", true), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_bool(w, "k.false", false), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_str(w, "k.empty", ""), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_arr_str(w, "k.strs", k_strs, 5), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_arr_i32(w, "k.i32s", k_i32, 5), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_arr_f32(w, "k.f32s", k_f32, 6), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_arr_i32(w, "k.none", NULL, 0), OSP_OK);

    /* add_value: the other scalar types and a nested array */
    osp_gguf_value v = {.type = OSP_GGUF_TYPE_UINT8, .v.u64 = 200};
    assert_int_equal(osp_gguf_writer_add_value(w, "v.u8", &v), OSP_OK);
    v = (osp_gguf_value){.type = OSP_GGUF_TYPE_INT16, .v.i64 = -30000};
    assert_int_equal(osp_gguf_writer_add_value(w, "v.i16", &v), OSP_OK);
    v = (osp_gguf_value){.type = OSP_GGUF_TYPE_UINT64, .v.u64 = UINT64_MAX - 5};
    assert_int_equal(osp_gguf_writer_add_value(w, "v.u64", &v), OSP_OK);
    v = (osp_gguf_value){.type = OSP_GGUF_TYPE_INT64, .v.i64 = INT64_MIN + 7};
    assert_int_equal(osp_gguf_writer_add_value(w, "v.i64", &v), OSP_OK);
    v = (osp_gguf_value){.type = OSP_GGUF_TYPE_FLOAT64, .v.f64 = 0.1};
    assert_int_equal(osp_gguf_writer_add_value(w, "v.f64", &v), OSP_OK);
    const uint16_t u16s[3] = {1, 65535, 7};
    osp_gguf_value inner[2] = {
        {.type = OSP_GGUF_TYPE_ARRAY, .v.arr = {.elem_type = OSP_GGUF_TYPE_UINT16, .n = 3, .raw = (const uint8_t *)u16s}},
        {.type = OSP_GGUF_TYPE_ARRAY, .v.arr = {.elem_type = OSP_GGUF_TYPE_STRING, .n = 1,
                                                .strs = &(osp_gguf_str){"xyz", 3}}},
    };
    v = (osp_gguf_value){.type = OSP_GGUF_TYPE_ARRAY, .v.arr = {.elem_type = OSP_GGUF_TYPE_ARRAY, .n = 2, .elems = inner}};
    assert_int_equal(osp_gguf_writer_add_value(w, "v.nested", &v), OSP_OK);

    /* tensors: data buffers of odd sizes (so padding shows), a 3-d one, and a big filled one
     * (more than one 4 MiB chunk) */
    float a[5] = {1, 2, 3, 4, 5};
    uint16_t h[64 * 3];
    for (int i = 0; i < 64 * 3; i++) h[i] = osp_fp32_to_fp16((float)i * 0.25f - 3.0f);
    uint8_t q[34 * 2 * 2 * 3];
    for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)(i * 13 + 1);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "a", OSP_DTYPE_F32, 1, (int64_t[]){5}, a, NULL, NULL), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "h", OSP_DTYPE_F16, 2, (int64_t[]){64, 3}, h, NULL, NULL), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "q3d", OSP_DTYPE_Q8_0, 3, (int64_t[]){64, 2, 3}, q, NULL, NULL),
                     OSP_OK);
    fill_ctx fc = {.row_bytes = (int64_t)osp_dtype_row_size(OSP_DTYPE_Q4_1, 4096)};
    assert_int_equal(osp_gguf_writer_add_tensor(w, "big", OSP_DTYPE_Q4_1, 2, (int64_t[]){4096, 2000}, NULL,
                                                fill_pattern, &fc),
                     OSP_OK);
    const char *path = tmp_path("rt.gguf");
    assert_int_equal(osp_gguf_writer_write(w, path), OSP_OK);
    assert_int_equal(fc.next_row, 2000);
    assert_true(fc.calls > 1);
    assert_false(file_exists(tmp_path("rt.gguf.tmp")));
    osp_gguf_writer_free(w);

    osp_gguf *g;
    osp_status s = osp_gguf_open(path, &g);
    if (s != OSP_OK) fail_msg("%s", osp_last_error());
    assert_int_equal(osp_gguf_version(g), 3);
    assert_int_equal(osp_gguf_alignment(g), 32);
    assert_int_equal(osp_gguf_data_offset(g) % 32, 0);
    assert_int_equal(osp_gguf_n_kv(g), 18);
    assert_string_equal(osp_gguf_kv_at(g, 0)->key, "general.alignment");

    uint32_t u32;
    int64_t i64;
    float f;
    bool b;
    osp_gguf_str str;
    assert_int_equal(osp_gguf_get_str(g, "general.architecture", &str), OSP_OK);
    assert_int_equal(str.len, 5);
    assert_memory_equal(str.data, "llama", 5);
    assert_int_equal(osp_gguf_get_u32(g, "k.u32", &u32), OSP_OK);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(osp_gguf_find(g, "k.i32")->value.type, OSP_GGUF_TYPE_INT32);
    assert_int_equal(osp_gguf_get_i64(g, "k.i32", &i64), OSP_OK);
    assert_int_equal(i64, -123456);
    assert_int_equal(osp_gguf_get_f32(g, "k.f32", &f), OSP_OK);
    assert_true(f == 1e-5f);
    assert_int_equal(osp_gguf_get_bool(g, "k.true", &b), OSP_OK);
    assert_true(b);
    assert_int_equal(osp_gguf_get_bool(g, "k.false", &b), OSP_OK);
    assert_false(b);
    assert_int_equal(osp_gguf_get_str(g, "k.empty", &str), OSP_OK);
    assert_int_equal(str.len, 0);

    const osp_gguf_value *arr;
    assert_int_equal(osp_gguf_get_arr(g, "k.strs", OSP_GGUF_TYPE_STRING, &arr), OSP_OK);
    assert_int_equal(arr->v.arr.n, 5);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(arr->v.arr.strs[i].len, strlen(k_strs[i]));
        if (strlen(k_strs[i])) assert_memory_equal(arr->v.arr.strs[i].data, k_strs[i], strlen(k_strs[i]));
    }
    assert_int_equal(osp_gguf_get_arr(g, "k.i32s", OSP_GGUF_TYPE_INT32, &arr), OSP_OK);
    assert_int_equal(arr->v.arr.n, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(osp_gguf_arr_i64(arr, (uint64_t)i), k_i32[i]);
    assert_int_equal(osp_gguf_get_arr(g, "k.f32s", OSP_GGUF_TYPE_FLOAT32, &arr), OSP_OK);
    assert_int_equal(arr->v.arr.n, 6);
    assert_memory_equal(arr->v.arr.raw, k_f32, sizeof k_f32); /* bit-exact, -0.0 and inf included */
    assert_int_equal(osp_gguf_get_arr(g, "k.none", OSP_GGUF_TYPE_INT32, &arr), OSP_OK);
    assert_int_equal(arr->v.arr.n, 0);

    const osp_gguf_kv *kv = osp_gguf_find(g, "v.u8");
    assert_int_equal(kv->value.type, OSP_GGUF_TYPE_UINT8);
    assert_int_equal(kv->value.v.u64, 200);
    kv = osp_gguf_find(g, "v.i16");
    assert_int_equal(kv->value.type, OSP_GGUF_TYPE_INT16);
    assert_int_equal(kv->value.v.i64, -30000);
    kv = osp_gguf_find(g, "v.u64");
    assert_int_equal(kv->value.type, OSP_GGUF_TYPE_UINT64);
    assert_true(kv->value.v.u64 == UINT64_MAX - 5);
    kv = osp_gguf_find(g, "v.i64");
    assert_true(kv->value.type == OSP_GGUF_TYPE_INT64 && kv->value.v.i64 == INT64_MIN + 7);
    kv = osp_gguf_find(g, "v.f64");
    assert_true(kv->value.type == OSP_GGUF_TYPE_FLOAT64 && kv->value.v.f64 == 0.1);
    kv = osp_gguf_find(g, "v.nested");
    assert_int_equal(kv->value.v.arr.elem_type, OSP_GGUF_TYPE_ARRAY);
    assert_int_equal(kv->value.v.arr.n, 2);
    const osp_gguf_value *e0 = &kv->value.v.arr.elems[0], *e1 = &kv->value.v.arr.elems[1];
    assert_int_equal(e0->v.arr.elem_type, OSP_GGUF_TYPE_UINT16);
    assert_int_equal(e0->v.arr.n, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(osp_gguf_arr_i64(e0, (uint64_t)i), u16s[i]);
    assert_int_equal(e1->v.arr.elem_type, OSP_GGUF_TYPE_STRING);
    assert_int_equal(e1->v.arr.strs[0].len, 3);
    assert_memory_equal(e1->v.arr.strs[0].data, "xyz", 3);

    assert_int_equal(osp_gguf_n_tensors(g), 4);
    const osp_gguf_tensor *t = osp_gguf_tensor_at(g, 0);
    assert_string_equal(t->name, "a");
    assert_int_equal(t->n_dims, 1);
    assert_int_equal(t->ne[0], 5);
    assert_int_equal(t->ne[1], 1);
    assert_int_equal(t->type, OSP_DTYPE_F32);
    assert_int_equal(t->nbytes, sizeof a);
    assert_memory_equal(t->data, a, sizeof a);
    t = osp_gguf_find_tensor(g, "h");
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[1], 3);
    assert_int_equal(t->type, OSP_DTYPE_F16);
    assert_int_equal(t->offset, 32); /* 20 bytes of "a", padded */
    assert_memory_equal(t->data, h, sizeof h);
    t = osp_gguf_find_tensor(g, "q3d");
    assert_int_equal(t->n_dims, 3);
    assert_true(t->ne[0] == 64 && t->ne[1] == 2 && t->ne[2] == 3 && t->ne[3] == 1);
    assert_int_equal(t->type, OSP_DTYPE_Q8_0);
    assert_int_equal(t->nbytes, sizeof q);
    assert_memory_equal(t->data, q, sizeof q);
    t = osp_gguf_find_tensor(g, "big");
    assert_int_equal(t->nbytes, (uint64_t)fc.row_bytes * 2000);
    const uint8_t *d = t->data;
    for (int64_t r = 0; r < 2000; r++)
        for (int64_t i = 0; i < fc.row_bytes; i++)
            if (d[r * fc.row_bytes + i] != pattern(r, i)) fail_msg("big: row %lld byte %lld differs", (long long)r, (long long)i);
    for (uint64_t i = 0; i < osp_gguf_n_tensors(g); i++) {
        assert_int_equal(osp_gguf_tensor_at(g, i)->offset % 32, 0);
        assert_int_equal(((uintptr_t)osp_gguf_tensor_at(g, i)->data - (uintptr_t)osp_gguf_tensor_at(g, 0)->data) % 32, 0);
    }

    /* copying every pair (but the writer's own general.alignment) and every tensor with add_value
     * reproduces the file byte for byte */
    osp_gguf_writer *w2;
    assert_int_equal(osp_gguf_writer_create(&w2), OSP_OK);
    for (uint64_t i = 1; i < osp_gguf_n_kv(g); i++)
        assert_int_equal(osp_gguf_writer_add_value(w2, osp_gguf_kv_at(g, i)->key, &osp_gguf_kv_at(g, i)->value), OSP_OK);
    for (uint64_t i = 0; i < osp_gguf_n_tensors(g); i++) {
        const osp_gguf_tensor *ti = osp_gguf_tensor_at(g, i);
        assert_int_equal(osp_gguf_writer_add_tensor(w2, ti->name, ti->type, ti->n_dims, ti->ne, ti->data, NULL, NULL),
                         OSP_OK);
    }
    const char *path2 = tmp_path("copy.gguf");
    assert_int_equal(osp_gguf_writer_write(w2, path2), OSP_OK);
    osp_gguf_writer_free(w2);
    size_t n1, n2;
    uint8_t *b1 = slurp(path, &n1), *b2 = slurp(path2, &n2);
    assert_int_equal(n1, n2);
    assert_int_equal(n1 % 32, 0); /* the last tensor is padded too */
    assert_memory_equal(b1, b2, n1);
    free(b1);
    free(b2);
    osp_gguf_close(g);
}

/* An empty writer is a valid file with one key and no tensors. */
static void test_empty(void **state) {
    (void)state;
    osp_gguf_writer *w;
    assert_int_equal(osp_gguf_writer_create(&w), OSP_OK);
    const char *path = tmp_path("empty.gguf");
    assert_int_equal(osp_gguf_writer_write(w, path), OSP_OK);
    osp_gguf_writer_free(w);
    osp_gguf *g;
    assert_int_equal(osp_gguf_open(path, &g), OSP_OK);
    assert_int_equal(osp_gguf_n_kv(g), 1);
    assert_int_equal(osp_gguf_n_tensors(g), 0);
    osp_gguf_close(g);
}

static void test_refusals(void **state) {
    (void)state;
    osp_gguf_writer *w;
    assert_int_equal(osp_gguf_writer_create(&w), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_u32(w, "general.alignment", 64), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "general.alignment"));
    assert_int_equal(osp_gguf_writer_add_u32(w, "x", 1), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_str(w, "x", "again"), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_gguf_writer_add_u32(w, "", 1), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_gguf_writer_add_str(w, "s", NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_gguf_writer_add_arr_f32(w, "fs", NULL, 3), OSP_ERR_INVALID_ARG);
    const char *bad_strs[2] = {"ok", NULL};
    assert_int_equal(osp_gguf_writer_add_arr_str(w, "ss", bad_strs, 2), OSP_ERR_INVALID_ARG);
    osp_gguf_value bad = {.type = (osp_gguf_type)99};
    assert_int_equal(osp_gguf_writer_add_value(w, "bad", &bad), OSP_ERR_INVALID_ARG);
    /* a failed add leaves no trace: the key is still free */
    assert_int_equal(osp_gguf_writer_add_u32(w, "bad", 2), OSP_OK);

    float x[64] = {0};
    assert_int_equal(osp_gguf_writer_add_tensor(w, "t", OSP_DTYPE_F32, 1, (int64_t[]){64}, x, NULL, NULL), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "t", OSP_DTYPE_F32, 1, (int64_t[]){64}, x, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "u", OSP_DTYPE_Q8_0, 1, (int64_t[]){48}, x, NULL, NULL),
                     OSP_ERR_INVALID_ARG); /* not a whole number of blocks */
    assert_int_equal(osp_gguf_writer_add_tensor(w, "u", OSP_DTYPE_F32, 0, (int64_t[]){1}, x, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "u", OSP_DTYPE_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, x, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "u", OSP_DTYPE_F32, 2, (int64_t[]){4, 0}, x, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "u", 4 /* removed Q4_2 */, 1, (int64_t[]){32}, x, NULL, NULL),
                     OSP_ERR_UNSUPPORTED);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "u", OSP_DTYPE_F32, 1, (int64_t[]){4}, NULL, NULL, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_gguf_writer_add_tensor(w, "u", OSP_DTYPE_F32, 1, (int64_t[]){4}, x, fill_fail, NULL),
                     OSP_ERR_INVALID_ARG);
    char long_name[80];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    assert_int_equal(osp_gguf_writer_add_tensor(w, long_name, OSP_DTYPE_F32, 1, (int64_t[]){4}, x, NULL, NULL),
                     OSP_ERR_INVALID_ARG);

    /* unwritable path */
    assert_int_equal(osp_gguf_writer_write(w, "/nonexistent-dir/x.gguf"), OSP_ERR_IO);
    assert_non_null(strstr(osp_last_error(), "/nonexistent-dir/x.gguf"));

    /* a failing fill aborts the write and leaves neither the file nor the temporary */
    assert_int_equal(osp_gguf_writer_add_tensor(w, "f", OSP_DTYPE_F32, 1, (int64_t[]){8}, NULL, fill_fail, NULL), OSP_OK);
    const char *path = tmp_path("fail.gguf");
    assert_int_equal(osp_gguf_writer_write(w, path), OSP_ERR_INTERNAL);
    assert_false(file_exists(path));
    assert_false(file_exists(tmp_path("fail.gguf.tmp")));
    osp_gguf_writer_free(w);
    osp_gguf_writer_free(NULL);
    assert_int_equal(osp_gguf_writer_create(NULL), OSP_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
