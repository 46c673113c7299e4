/* libFuzzer target for the GGUF reader (src/model/gguf.c).
 *
 * Feeds the input bytes to osp_gguf_open_memory() and, when the reader accepts them, touches
 * everything it exposes: every key/value pair (recursing into nested arrays and reading every
 * element of fixed-size arrays), every tensor's info and data bytes, the lookups, and every typed
 * getter on every key. A malformed file must come back as a non-OK osp_status with a message;
 * anything else (a crash, an ASan/UBSan report, a leak) is a bug in the reader.
 * Seed corpus: tests/fuzz/corpus/gguf/ (written by tests/fuzz/make_gguf_seeds.py). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "osprey/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Keeps the compiler from dropping reads whose results are otherwise unused. */
static volatile uint64_t g_sink;

static void sink_bytes(const void *p, uint64_t n) {
    const uint8_t *b = p;
    uint64_t h = 0;
    for (uint64_t i = 0; i < n; i++) h = h * 31 + b[i];
    g_sink += h;
}

static void walk_value(const osp_gguf_value *v, int depth) {
    /* A valid reader bounds nesting; this guard only keeps a buggy one from overflowing our stack
     * before ASan can say where. */
    if (depth > 64) abort();
    (void)osp_gguf_type_name(v->type);
    switch (v->type) {
    case OSP_GGUF_TYPE_UINT8:
    case OSP_GGUF_TYPE_UINT16:
    case OSP_GGUF_TYPE_UINT32:
    case OSP_GGUF_TYPE_UINT64:
    case OSP_GGUF_TYPE_BOOL: g_sink += v->v.u64; break;
    case OSP_GGUF_TYPE_INT8:
    case OSP_GGUF_TYPE_INT16:
    case OSP_GGUF_TYPE_INT32:
    case OSP_GGUF_TYPE_INT64: g_sink += (uint64_t)v->v.i64; break;
    case OSP_GGUF_TYPE_FLOAT32:
    case OSP_GGUF_TYPE_FLOAT64: g_sink += (uint64_t)(v->v.f64 == v->v.f64); break;
    case OSP_GGUF_TYPE_STRING: sink_bytes(v->v.str.data, v->v.str.len); break;
    case OSP_GGUF_TYPE_ARRAY: {
        uint64_t n = v->v.arr.n;
        (void)osp_gguf_type_name(v->v.arr.elem_type);
        if (v->v.arr.elem_type == OSP_GGUF_TYPE_STRING) {
            for (uint64_t i = 0; i < n; i++) sink_bytes(v->v.arr.strs[i].data, v->v.arr.strs[i].len);
        } else if (v->v.arr.elem_type == OSP_GGUF_TYPE_ARRAY) {
            for (uint64_t i = 0; i < n; i++) walk_value(&v->v.arr.elems[i], depth + 1);
        } else {
            /* Both readers on every fixed-size element type (float -> int must saturate). */
            for (uint64_t i = 0; i < n; i++) {
                double d = osp_gguf_arr_f64(v, i);
                g_sink += (uint64_t)(d == d) + (uint64_t)osp_gguf_arr_i64(v, i);
            }
        }
        break;
    }
    default: break;
    }
}

static void walk_getters(const osp_gguf *g, const char *key) {
    uint32_t u32;
    int64_t i64;
    float f32;
    bool b;
    osp_gguf_str s;
    const osp_gguf_value *arr;
    if (osp_gguf_get_u32(g, key, &u32) == OSP_OK) g_sink += u32;
    if (osp_gguf_get_i64(g, key, &i64) == OSP_OK) g_sink += (uint64_t)i64;
    if (osp_gguf_get_f32(g, key, &f32) == OSP_OK) g_sink += (uint64_t)(f32 == f32);
    if (osp_gguf_get_bool(g, key, &b) == OSP_OK) g_sink += b;
    if (osp_gguf_get_str(g, key, &s) == OSP_OK) sink_bytes(s.data, s.len);
    if (osp_gguf_get_arr(g, key, -1, &arr) == OSP_OK) g_sink += arr->v.arr.n;
    for (int t = OSP_GGUF_TYPE_UINT8; t <= OSP_GGUF_TYPE_FLOAT64; t++) {
        if (osp_gguf_get_arr(g, key, t, &arr) == OSP_OK) g_sink += arr->v.arr.n;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    osp_gguf *g = NULL;
    osp_status st = osp_gguf_open_memory(data, size, "fuzz.gguf", &g);
    if (st != OSP_OK) {
        /* Failure must leave a message and no handle. */
        if (g != NULL || osp_last_error()[0] == '\0') abort();
        return 0;
    }
    g_sink += osp_gguf_version(g) + osp_gguf_alignment(g) + osp_gguf_data_offset(g);
    sink_bytes(osp_gguf_path(g), strlen(osp_gguf_path(g)));

    uint64_t n_kv = osp_gguf_n_kv(g);
    for (uint64_t i = 0; i < n_kv; i++) {
        const osp_gguf_kv *kv = osp_gguf_kv_at(g, i);
        if (kv == NULL) abort();
        if (osp_gguf_find(g, kv->key) != kv) abort(); /* keys are unique */
        walk_value(&kv->value, 0);
        walk_getters(g, kv->key);
    }
    if (osp_gguf_kv_at(g, n_kv) != NULL) abort();
    walk_getters(g, "no.such.key");

    uint64_t n_tensors = osp_gguf_n_tensors(g);
    for (uint64_t i = 0; i < n_tensors; i++) {
        const osp_gguf_tensor *t = osp_gguf_tensor_at(g, i);
        if (t == NULL) abort();
        if (osp_gguf_find_tensor(g, t->name) != t) abort(); /* names are unique */
        g_sink += t->n_dims + t->type + t->offset;
        for (int d = 0; d < 4; d++) g_sink += (uint64_t)t->ne[d];
        /* The data must lie inside the buffer; touch its first and last byte. */
        if (t->nbytes > 0) {
            const uint8_t *p = t->data;
            if (p < data || p + t->nbytes > data + size) abort();
            g_sink += p[0] + p[t->nbytes - 1];
        }
    }
    if (osp_gguf_tensor_at(g, n_tensors) != NULL) abort();
    (void)osp_gguf_find_tensor(g, "no.such.tensor");

    osp_gguf_close(g);
    return 0;
}
