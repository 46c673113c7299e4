/* The KV cache scales file (kv_scales.h says the layout and why). Parsing is strict and whole: the
 * size is computed from the counts before anything else is read, the checksum is checked before any
 * scale is looked at, and nothing is handed out unless every field is valid. */
#include "format/kv_scales.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "core/status_internal.h"

static const char kMagic[6] = {'O', 'S', 'P', 'K', 'V', 'S'};
static const char kVersion[2] = {'0', '1'};
#define MAX_FILE_BYTES ((size_t)64 << 20) /* far above any valid file: 4096 x 1024 x 8 bytes = 32 MiB */

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static float rdf(const uint8_t *p) {
    const uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void wr32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}
static void wr64(uint8_t *p, uint64_t v) { wr32(p, (uint32_t)v), wr32(p + 4, (uint32_t)(v >> 32)); }
static void wrf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    wr32(p, u);
}

/* FNV-1a 64 over bytes */
static uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static bool counts_ok(uint32_t L, uint32_t H, uint32_t D) {
    return L >= 1 && L <= OSP_KVS_MAX_LAYERS && H >= 1 && H <= OSP_KVS_MAX_HEADS && D >= 1 && D <= OSP_KVS_MAX_HEAD_DIM;
}

static bool scale_ok(float x) { return isfinite(x) && x >= OSP_KVS_MIN_SCALE && x <= OSP_KVS_MAX_SCALE; }

size_t osp_kv_scales_file_bytes(uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim) {
    if (!counts_ok(n_layer, n_head_kv, head_dim)) return 0;
    return OSP_KVS_HEADER_BYTES + 8 * (size_t)n_layer * ((size_t)n_head_kv + 1) + 8;
}

void osp_kv_scales_free(osp_kv_scales *s) {
    if (!s) return;
    free(s->fp8_k), free(s->fp8_v), free(s->nvfp4_k), free(s->nvfp4_v);
    memset(s, 0, sizeof *s);
}

osp_status osp_kv_scales_init(osp_kv_scales *out, uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim) {
    memset(out, 0, sizeof *out);
    if (!counts_ok(n_layer, n_head_kv, head_dim))
        return osp_set_error(OSP_ERR_INVALID_ARG, "KV scales: %u layers, %u KV heads, head_dim %u out of range",
                             n_layer, n_head_kv, head_dim);
    const size_t nh = (size_t)n_layer * n_head_kv;
    out->fp8_k = malloc(nh * sizeof(float)), out->fp8_v = malloc(nh * sizeof(float));
    out->nvfp4_k = malloc(n_layer * sizeof(float)), out->nvfp4_v = malloc(n_layer * sizeof(float));
    if (!out->fp8_k || !out->fp8_v || !out->nvfp4_k || !out->nvfp4_v) {
        osp_kv_scales_free(out);
        return osp_set_error(OSP_ERR_NOMEM, "KV scales: out of memory");
    }
    out->n_layer = n_layer, out->n_head_kv = n_head_kv, out->head_dim = head_dim;
    for (size_t i = 0; i < nh; i++) out->fp8_k[i] = out->fp8_v[i] = 1.0f;
    for (uint32_t i = 0; i < n_layer; i++) out->nvfp4_k[i] = out->nvfp4_v[i] = 1.0f;
    return OSP_OK;
}

/* the four arrays in file order, with their names and lengths */
static void arrays_of(const osp_kv_scales *s, float *a[4], size_t n[4]) {
    a[0] = s->fp8_k, a[1] = s->fp8_v, a[2] = s->nvfp4_k, a[3] = s->nvfp4_v;
    n[0] = n[1] = (size_t)s->n_layer * s->n_head_kv;
    n[2] = n[3] = s->n_layer;
}
static const char *const kArrayName[4] = {"fp8 K", "fp8 V", "nvfp4 K", "nvfp4 V"};

osp_status osp_kv_scales_parse(const void *buf, size_t len, osp_kv_scales *out) {
    memset(out, 0, sizeof *out);
    const uint8_t *p = buf;
    if (len < OSP_KVS_HEADER_BYTES + 8)
        return osp_set_error(OSP_ERR_FORMAT, "KV scales file is truncated: %zu bytes, a header alone is %d", len,
                             OSP_KVS_HEADER_BYTES + 8);
    if (memcmp(p, kMagic, 6) != 0) return osp_set_error(OSP_ERR_FORMAT, "not a KV scales file (no OSPKVS magic)");
    if (memcmp(p + 6, kVersion, 2) != 0)
        return osp_set_error(OSP_ERR_FORMAT, "KV scales file version '%c%c' is not supported (this osprey reads 01)",
                             p[6] >= 32 && p[6] < 127 ? p[6] : '?', p[7] >= 32 && p[7] < 127 ? p[7] : '?');
    const uint32_t L = rd32(p + 8), H = rd32(p + 12), D = rd32(p + 16), reserved = rd32(p + 20);
    if (!counts_ok(L, H, D))
        return osp_set_error(OSP_ERR_FORMAT,
                             "KV scales file: %u layers, %u KV heads, head_dim %u out of range (1..%d, 1..%d, 1..%d)",
                             L, H, D, OSP_KVS_MAX_LAYERS, OSP_KVS_MAX_HEADS, OSP_KVS_MAX_HEAD_DIM);
    if (reserved != 0) return osp_set_error(OSP_ERR_FORMAT, "KV scales file: reserved header field is %u, not 0", reserved);
    const size_t want = osp_kv_scales_file_bytes(L, H, D);
    if (len != want)
        return osp_set_error(OSP_ERR_FORMAT, "KV scales file is %s: %zu bytes, %u layers x %u KV heads need %zu",
                             len < want ? "truncated" : "too long", len, L, H, want);
    const uint64_t sum = rd64(p + len - 8), got = fnv1a64(p, len - 8);
    if (sum != got)
        return osp_set_error(OSP_ERR_FORMAT, "KV scales file is corrupt: checksum %016llx, contents hash to %016llx",
                             (unsigned long long)sum, (unsigned long long)got);
    osp_kv_scales s;
    OSP_TRY(osp_kv_scales_init(&s, L, H, D));
    float *a[4];
    size_t n[4];
    arrays_of(&s, a, n);
    const uint8_t *q = p + OSP_KVS_HEADER_BYTES;
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < n[k]; i++, q += 4) {
            a[k][i] = rdf(q);
            if (!scale_ok(a[k][i])) {
                const size_t per = k < 2 ? H : 1;
                const double x = a[k][i];
                osp_kv_scales_free(&s);
                return osp_set_error(OSP_ERR_FORMAT, "KV scales file: %s scale of layer %zu%s%zu is %g (must be in [%g, %g])",
                                     kArrayName[k], i / per, k < 2 ? " head " : "", k < 2 ? i % per : (size_t)0, x,
                                     (double)OSP_KVS_MIN_SCALE, (double)OSP_KVS_MAX_SCALE);
            }
        }
    *out = s;
    return OSP_OK;
}

osp_status osp_kv_scales_load(const char *path, osp_kv_scales *out) {
    memset(out, 0, sizeof *out);
    char *buf;
    size_t len;
    OSP_TRY(osp_read_file(path, MAX_FILE_BYTES, "KV scales file", &buf, &len));
    const osp_status s = osp_kv_scales_parse(buf, len, out);
    free(buf);
    if (s != OSP_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", osp_last_error());
        return osp_set_error(s, "%s: %s", path, msg);
    }
    return OSP_OK;
}

osp_status osp_kv_scales_save(const char *path, const osp_kv_scales *s) {
    const size_t bytes = osp_kv_scales_file_bytes(s->n_layer, s->n_head_kv, s->head_dim);
    if (!bytes) return osp_set_error(OSP_ERR_INVALID_ARG, "KV scales: counts out of range");
    float *a[4];
    size_t n[4];
    arrays_of(s, a, n);
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < n[k]; i++)
            if (!scale_ok(a[k][i]))
                return osp_set_error(OSP_ERR_INVALID_ARG, "KV scales: %s scale %zu is %g (must be in [%g, %g])",
                                     kArrayName[k], i, (double)a[k][i], (double)OSP_KVS_MIN_SCALE,
                                     (double)OSP_KVS_MAX_SCALE);
    uint8_t *img = malloc(bytes);
    if (!img) return osp_set_error(OSP_ERR_NOMEM, "KV scales: out of memory");
    memcpy(img, kMagic, 6), memcpy(img + 6, kVersion, 2);
    wr32(img + 8, s->n_layer), wr32(img + 12, s->n_head_kv), wr32(img + 16, s->head_dim), wr32(img + 20, 0);
    uint8_t *q = img + OSP_KVS_HEADER_BYTES;
    for (int k = 0; k < 4; k++)
        for (size_t i = 0; i < n[k]; i++, q += 4) wrf(q, a[k][i]);
    wr64(q, fnv1a64(img, bytes - 8));
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(img);
        return osp_set_error(OSP_ERR_IO, "cannot create KV scales file %s", path);
    }
    bool ok = fwrite(img, 1, bytes, f) == bytes;
    free(img);
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        remove(path);
        return osp_set_error(OSP_ERR_IO, "cannot write KV scales file %s", path);
    }
    return OSP_OK;
}

osp_status osp_kv_scales_check_shape(const osp_kv_scales *s, int32_t n_layer, int32_t n_head_kv, int32_t head_dim) {
    if ((int64_t)s->n_layer != n_layer || (int64_t)s->n_head_kv != n_head_kv || (int64_t)s->head_dim != head_dim)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "KV scales were calibrated for another model: %u layers, %u KV heads, head_dim %u; this "
                             "model has %d layers, %d KV heads, head_dim %d (run osprey calibrate-kv on it)",
                             s->n_layer, s->n_head_kv, s->head_dim, n_layer, n_head_kv, head_dim);
    return OSP_OK;
}

void osp_kv_scales_for(const osp_kv_scales *s, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, const float **k_fixed,
                       const float **v_fixed) {
    *k_fixed = *v_fixed = NULL;
    if (!s) return;
    if (k_dtype == OSP_KV_DTYPE_FP8) *k_fixed = s->fp8_k;
    else if (k_dtype == OSP_KV_DTYPE_NVFP4) *k_fixed = s->nvfp4_k;
    if (v_dtype == OSP_KV_DTYPE_FP8) *v_fixed = s->fp8_v;
    else if (v_dtype == OSP_KV_DTYPE_NVFP4) *v_fixed = s->nvfp4_v;
}
