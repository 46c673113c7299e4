/* The paged KV cache on a backend (see kv_cache.h): page formats (f32, f16, fp8, nvfp4, int8_hier and
 * their second pools), one allocation per cache, block copies for copy-on-write (data and scales together). */
#include "kv/kv_cache.h"

#include <math.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/status_internal.h"

/* Names: the canonical one first, then the aliases vLLM's --kv-cache-dtype accepts. */
static const struct { const char *name; osp_kv_dtype d; } k_names[] = {
    {"f16", OSP_KV_DTYPE_F16},   {"f32", OSP_KV_DTYPE_F32},     {"bf16", OSP_KV_DTYPE_BF16},
    {"fp8", OSP_KV_DTYPE_FP8},   {"nvfp4", OSP_KV_DTYPE_NVFP4}, {"int8_hier", OSP_KV_DTYPE_INT8_HIER},
    {"auto", OSP_KV_DTYPE_F16},
    {"fp16", OSP_KV_DTYPE_F16},  {"float16", OSP_KV_DTYPE_F16}, {"bfloat16", OSP_KV_DTYPE_BF16},
    {"fp8_e4m3", OSP_KV_DTYPE_FP8}, {"float32", OSP_KV_DTYPE_F32},
};

const char *osp_kv_dtype_name(osp_kv_dtype d) {
    for (size_t i = 0; i < 6; i++) /* the canonical names */
        if (k_names[i].d == d) return k_names[i].name;
    return NULL;
}

osp_status osp_kv_dtype_parse(const char *name, osp_kv_dtype *out) {
    for (size_t i = 0; name && i < sizeof k_names / sizeof k_names[0]; i++)
        if (!strcmp(name, k_names[i].name)) return *out = k_names[i].d, OSP_OK;
    return osp_set_error(OSP_ERR_INVALID_ARG,
                         "kv cache dtype '%s' is not one of auto, f16, bf16, f32, fp8, nvfp4, int8_hier (or fp16, "
                         "bfloat16, fp8_e4m3)", name ? name : "(null)");
}

osp_status osp_kv_dtype_available(osp_kv_dtype d) {
    if (!osp_kv_dtype_name(d)) return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: unknown dtype %d", (int)d);
    if (d == OSP_KV_DTYPE_BF16)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: bf16 pages are not implemented by any backend "
                                                  "(use f16, f32, fp8, nvfp4 or int8_hier)");
    return OSP_OK;
}

bool osp_kv_dtype_quantized(osp_kv_dtype d) {
    return d == OSP_KV_DTYPE_FP8 || d == OSP_KV_DTYPE_NVFP4 || d == OSP_KV_DTYPE_INT8_HIER;
}

osp_status osp_kv_page_format_of(const osp_kv_shape *c, osp_kv_dtype dtype, osp_kv_page_format *out) {
    memset(out, 0, sizeof *out);
    if (!osp_kv_dtype_name(dtype)) return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: unknown dtype %d", (int)dtype);
    if (c->n_layer <= 0 || c->n_head_kv <= 0 || c->head_dim <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: %d layers, %d KV heads, head_dim %d must be > 0",
                             c->n_layer, c->n_head_kv, c->head_dim);
    OSP_TRY(osp_kv_dtype_available(dtype));
    if (dtype == OSP_KV_DTYPE_F16 && c->head_dim > 1024)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: f16 pages need head_dim <= 1024 (model has %d)", c->head_dim);
    if (osp_kv_dtype_quantized(dtype) && c->head_dim > 1024)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: %s pages need head_dim <= 1024 (model has %d)",
                             osp_kv_dtype_name(dtype), c->head_dim);
    if (dtype == OSP_KV_DTYPE_NVFP4 && c->head_dim % 16)
        return osp_set_error(OSP_ERR_UNSUPPORTED,
                             "kv cache: nvfp4 pages need head_dim a multiple of 16 (micro-blocks of 16; model has %d)",
                             c->head_dim);
    if (dtype == OSP_KV_DTYPE_INT8_HIER && c->head_dim % 2)
        return osp_set_error(OSP_ERR_UNSUPPORTED,
                             "kv cache: int8_hier pages need an even head_dim (two 4-bit codes a byte; model has %d)",
                             c->head_dim);
    out->dtype = dtype;
    out->kv_row = (int64_t)c->n_head_kv * c->head_dim;
    out->head_dim = c->head_dim;
    switch (dtype) {
    case OSP_KV_DTYPE_F16: out->elem_type = OSP_DTYPE_F16, out->bytes_per_token = (size_t)out->kv_row * 2; break;
    case OSP_KV_DTYPE_F32: out->elem_type = OSP_DTYPE_F32, out->bytes_per_token = (size_t)out->kv_row * 4; break;
    case OSP_KV_DTYPE_FP8:
        out->elem_type = OSP_KV_DTYPE_FP8;
        out->bytes_per_token = (size_t)out->kv_row;
        out->fixed_scales_per_layer = c->n_head_kv;
        break;
    case OSP_KV_DTYPE_INT8_HIER: /* upper codes + scale and minimum in the pages, lower codes in the pool */
        out->elem_type = OSP_KV_DTYPE_INT8_HIER;
        out->bytes_per_token = (size_t)c->n_head_kv * ((size_t)c->head_dim / 2 + 4);
        out->scale_bytes_per_token = (size_t)out->kv_row / 2;
        break;
    default: /* NVFP4 */
        out->elem_type = OSP_KV_DTYPE_NVFP4;
        out->bytes_per_token = (size_t)out->kv_row / 2;
        out->scale_bytes_per_token = (size_t)out->kv_row / 16;
        out->fixed_scales_per_layer = 1;
        break;
    }
    return OSP_OK;
}

/* Sizes of one layer's page region and scale pool for K (format fk) and for V (fv), each padded to 256
 * bytes, and of the whole allocation (per layer: K pages, V pages, K scales, V scales); false when a
 * product overflows size_t. */
typedef struct kv_sizes { size_t page[2], scale[2], total; } kv_sizes; /* [0] K, [1] V */

static bool sizes_of(const osp_kv_page_format *fk, const osp_kv_page_format *fv, int32_t n_layer, int32_t num_blocks,
                     int32_t block_size, kv_sizes *z) {
    const size_t pad = 255;
    size_t slots, per_layer = 0;
    if (__builtin_mul_overflow((size_t)num_blocks, (size_t)block_size, &slots)) return false;
    for (int i = 0; i < 2; i++) {
        const osp_kv_page_format *f = i ? fv : fk;
        size_t page, scales;
        if (__builtin_mul_overflow(slots, f->bytes_per_token, &page) ||
            __builtin_mul_overflow(slots, f->scale_bytes_per_token, &scales) || page > SIZE_MAX / 4 - pad ||
            scales > SIZE_MAX / 4 - pad)
            return false;
        z->page[i] = (page + pad) & ~pad;
        z->scale[i] = (scales + pad) & ~pad;
        per_layer += z->page[i] + z->scale[i]; /* each term < SIZE_MAX / 4: no overflow */
    }
    return !__builtin_mul_overflow(per_layer, (size_t)n_layer, &z->total);
}

/* The K and V formats of a cache of k_dtype / v_dtype pages for shape c (osp_kv_page_format_of's errors,
 * naming the side that fails in a split cache). */
static osp_status formats_of(const osp_kv_shape *c, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, osp_kv_page_format *fk,
                             osp_kv_page_format *fv) {
    osp_status s = osp_kv_page_format_of(c, k_dtype, fk);
    if (s == OSP_OK) s = osp_kv_page_format_of(c, v_dtype, fv);
    if (s != OSP_OK && k_dtype != v_dtype) {
        char msg[400];
        snprintf(msg, sizeof msg, "%s", osp_last_error());
        return osp_set_error(s, "%s (split cache: K %s, V %s)", msg, osp_kv_dtype_name(k_dtype) ? osp_kv_dtype_name(k_dtype) : "?",
                             osp_kv_dtype_name(v_dtype) ? osp_kv_dtype_name(v_dtype) : "?");
    }
    return s;
}

osp_status osp_kv_cache_size(const osp_kv_shape *c, int32_t num_blocks, int32_t block_size, osp_kv_dtype k_dtype,
                             osp_kv_dtype v_dtype, size_t *bytes) {
    *bytes = 0;
    if (num_blocks <= 0 || block_size <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: num_blocks %d and block_size %d must be > 0",
                             num_blocks, block_size);
    osp_kv_page_format fk, fv;
    OSP_TRY(formats_of(c, k_dtype, v_dtype, &fk, &fv));
    kv_sizes z;
    if (!sizes_of(&fk, &fv, c->n_layer, num_blocks, block_size, &z))
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: %d blocks of %d tokens do not fit in memory sizes",
                             num_blocks, block_size);
    *bytes = z.total;
    return OSP_OK;
}

static osp_status fixed_scales(const float *src, float dflt, int32_t n, const char *what, float **out) {
    *out = malloc((size_t)n * sizeof **out);
    if (!*out) return osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory");
    for (int32_t i = 0; i < n; i++) {
        const float x = src ? src[i] : dflt;
        if (!(x > 0.0f) || !isfinite(x))
            return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: %s scale %d is %g (must be finite and > 0)", what, i,
                                 (double)x);
        (*out)[i] = x;
    }
    return OSP_OK;
}

bool osp_kv_k_hadamard_default(const osp_backend *be, const osp_kv_page_format *fmt) {
    const bool quantized = osp_kv_dtype_quantized(fmt->dtype);
    const int32_t d = fmt->head_dim;
    const char *env = getenv("OSPREY_KV_HADAMARD");
    return quantized && d > 0 && (d & (d - 1)) == 0 && be->vt->kv_k_hadamard && !(env && !strcmp(env, "0"));
}

osp_status osp_kv_cache_create_on(osp_backend *be, const osp_kv_shape *c, int32_t num_blocks,
                                  int32_t block_size, osp_kv_dtype dtype, osp_kv_cache **out) {
    return osp_kv_cache_create_scaled(be, c, num_blocks, block_size, dtype, dtype, NULL, NULL, out);
}

static float default_fixed_scale(osp_kv_dtype d) {
    return d == OSP_KV_DTYPE_FP8 ? OSP_KV_FP8_DEFAULT_SCALE : OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE;
}

osp_status osp_kv_cache_create_scaled(osp_backend *be, const osp_kv_shape *c, int32_t num_blocks, int32_t block_size,
                                      osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, const float *k_fixed,
                                      const float *v_fixed, osp_kv_cache **out) {
    *out = NULL;
    if (num_blocks <= 0 || block_size <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: num_blocks %d and block_size %d must be > 0",
                             num_blocks, block_size);
    osp_kv_page_format fk, fv;
    OSP_TRY(formats_of(c, k_dtype, v_dtype, &fk, &fv));
    char why[256] = "";
    if (be->vt->supports_kv && !be->vt->supports_kv(be, k_dtype, v_dtype, why, sizeof why))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: %s", why);
    fk.k_hadamard = osp_kv_k_hadamard_default(be, &fk); /* V is never rotated */
    kv_sizes z;
    if (!sizes_of(&fk, &fv, c->n_layer, num_blocks, block_size, &z))
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: %d blocks of %d tokens do not fit in memory sizes",
                             num_blocks, block_size);
    osp_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory");
    static _Atomic uint64_t next_id = 1;
    kv->id = next_id++;
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->n_layer = c->n_layer;
    kv->k_fmt = fk;
    kv->v_fmt = fv;
    kv->be = be;
    kv->bytes = z.total;
    osp_backend_retain(be); /* the pages are freed through it, maybe after the model */
    osp_status s = OSP_OK;
    if (fk.fixed_scales_per_layer &&
        (s = fixed_scales(k_fixed, default_fixed_scale(k_dtype), c->n_layer * fk.fixed_scales_per_layer, "K",
                          &kv->k_fixed)) != OSP_OK) {
        osp_kv_cache_free(kv);
        return s;
    }
    if (fv.fixed_scales_per_layer &&
        (s = fixed_scales(v_fixed, default_fixed_scale(v_dtype), c->n_layer * fv.fixed_scales_per_layer, "V",
                          &kv->v_fixed)) != OSP_OK) {
        osp_kv_cache_free(kv);
        return s;
    }
    kv->k = calloc((size_t)kv->n_layer, sizeof *kv->k);
    kv->v = calloc((size_t)kv->n_layer, sizeof *kv->v);
    kv->k_scale = calloc((size_t)kv->n_layer, sizeof *kv->k_scale);
    kv->v_scale = calloc((size_t)kv->n_layer, sizeof *kv->v_scale);
    if (!kv->k || !kv->v || !kv->k_scale || !kv->v_scale) s = osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory");
    if (s == OSP_OK) s = be->vt->buffer_alloc(be, kv->bytes, "the KV cache", &kv->pages);
    if (s != OSP_OK) {
        osp_kv_cache_free(kv);
        if (s == OSP_ERR_NOMEM)
            return osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory for %d blocks of %d tokens (%zu bytes)",
                                 num_blocks, block_size, z.total);
        return s;
    }
    char *p = kv->pages;
    for (int32_t l = 0; l < kv->n_layer; l++) {
        kv->k[l] = p, p += z.page[0];
        kv->v[l] = p, p += z.page[1];
        kv->k_scale[l] = fk.scale_bytes_per_token ? p : NULL, p += z.scale[0];
        kv->v_scale[l] = fv.scale_bytes_per_token ? p : NULL, p += z.scale[1];
    }
    *out = kv;
    return OSP_OK;
}

void osp_kv_cache_free(osp_kv_cache *kv) {
    if (!kv) return;
    for (int32_t r = 1; r < kv->tp_n; r++) osp_kv_cache_free(kv->tp_ranks[r]);
    free(kv->tp_ranks);
    if (kv->pages) kv->be->vt->buffer_free(kv->be, kv->pages);
    osp_backend_free(kv->be); /* our reference */
    free(kv->k);
    free(kv->v);
    free(kv->k_scale);
    free(kv->v_scale);
    free(kv->k_fixed);
    free(kv->v_fixed);
    free(kv);
}

osp_status osp_kv_cache_set_hier_view(osp_kv_cache *kv, int32_t full_recent) {
    if (kv->k_fmt.dtype != OSP_KV_DTYPE_INT8_HIER && kv->v_fmt.dtype != OSP_KV_DTYPE_INT8_HIER)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: a draft view reads int8_hier pages; this cache has K %s, V %s",
                             osp_kv_dtype_name(kv->k_fmt.dtype), osp_kv_dtype_name(kv->v_fmt.dtype));
    kv->hier_upper_only = full_recent >= 0;
    kv->hier_full_recent = full_recent >= 0 ? full_recent : 0;
    return OSP_OK;
}

osp_status osp_kv_cache_sync(osp_kv_cache *kv) { return kv->be->vt->sync(kv->be); }

int32_t osp_kv_cache_block_size(const osp_kv_cache *kv) { return kv->block_size; }
int32_t osp_kv_cache_num_blocks(const osp_kv_cache *kv) { return kv->num_blocks; }
osp_kv_dtype osp_kv_cache_dtype(const osp_kv_cache *kv) { return kv->k_fmt.dtype; }
osp_kv_dtype osp_kv_cache_dtype_v(const osp_kv_cache *kv) { return kv->v_fmt.dtype; }

size_t osp_kv_cache_bytes(const osp_kv_cache *kv) {
    size_t n = (size_t)kv->n_layer * (size_t)kv->num_blocks * (size_t)kv->block_size *
               (kv->k_fmt.bytes_per_token + kv->k_fmt.scale_bytes_per_token + kv->v_fmt.bytes_per_token +
                kv->v_fmt.scale_bytes_per_token);
    for (int32_t r = 1; r < kv->tp_n; r++) n += osp_kv_cache_bytes(kv->tp_ranks[r]); /* a driver's ranks' caches */
    return n;
}

osp_status osp_kv_cache_copy_block(osp_kv_cache *kv, int32_t src, int32_t dst) {
    if (src < 0 || src >= kv->num_blocks || dst < 0 || dst >= kv->num_blocks)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: copy of block %d to %d outside the %d blocks", src, dst,
                             kv->num_blocks);
    for (int32_t l = 0; l < kv->n_layer; l++) {
        for (int i = 0; i < 2; i++) { /* K, then V, each in its own format */
            const osp_kv_page_format *f = i ? &kv->v_fmt : &kv->k_fmt;
            char *pages = i ? kv->v[l] : kv->k[l], *scales = i ? kv->v_scale[l] : kv->k_scale[l];
            const size_t bytes = (size_t)kv->block_size * f->bytes_per_token,
                         sb = (size_t)kv->block_size * f->scale_bytes_per_token;
            OSP_TRY(kv->be->vt->copy(kv->be, pages + (size_t)dst * bytes, pages + (size_t)src * bytes, bytes));
            if (sb) OSP_TRY(kv->be->vt->copy(kv->be, scales + (size_t)dst * sb, scales + (size_t)src * sb, sb));
        }
    }
    return OSP_OK;
}

size_t osp_kv_cache_block_bytes(const osp_kv_cache *kv) {
    const size_t per_token = kv->k_fmt.bytes_per_token + kv->k_fmt.scale_bytes_per_token + kv->v_fmt.bytes_per_token +
                             kv->v_fmt.scale_bytes_per_token;
    return (size_t)kv->n_layer * (size_t)kv->block_size * per_token;
}

/* The segments of block id in osp_kv_cache_block_read's order into dst / src / bytes from *m on (host
 * the block's bytes; read: pages to host). */
static void block_segments(osp_kv_cache *kv, int32_t id, uint8_t *host, bool read, void **dst, const void **src,
                           size_t *bytes, int32_t *m) {
    for (int32_t l = 0; l < kv->n_layer; l++) {
        for (int i = 0; i < 4; i++) { /* K pages, V pages, K scales, V scales */
            const osp_kv_page_format *f = i & 1 ? &kv->v_fmt : &kv->k_fmt;
            const size_t per_token = i < 2 ? f->bytes_per_token : f->scale_bytes_per_token;
            const size_t n = (size_t)kv->block_size * per_token;
            if (n == 0) continue;
            char *base = i == 0 ? kv->k[l] : i == 1 ? kv->v[l] : i == 2 ? kv->k_scale[l] : kv->v_scale[l];
            char *dev = base + (size_t)id * n;
            dst[*m] = read ? (void *)host : (void *)dev;
            src[*m] = read ? (const void *)dev : (const void *)host;
            bytes[(*m)++] = n;
            host += n;
        }
    }
}

enum { MOVE_HOST = 0, MOVE_DEV = 1, MOVE_DEV_SIDE = 2 }; /* where blocks_move's other ends are */

/* Moves blocks ids[0..n) to or from hosts[0..n) (MOVE_HOST; or device memory: MOVE_DEV on the run stream,
 * MOVE_DEV_SIDE on the side stream, backend.h copy_dev_many): in one backend call where it has one (every
 * segment enqueued, one wait), else a copy a segment. */
static osp_status blocks_move_to(osp_kv_cache *kv, int32_t n, const int32_t *ids, uint8_t *const *hosts, bool read,
                                 int where) {
    if (where != MOVE_HOST && !kv->be->vt->copy_dev_many)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: the %s backend has no device-to-device block copies",
                             kv->be->vt->name);
    for (int32_t b = 0; b < n; b++)
        if (ids[b] < 0 || ids[b] >= kv->num_blocks)
            return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: block %d outside the %d blocks", ids[b], kv->num_blocks);
    const size_t per_block = (size_t)kv->n_layer * 4;
    void **dst = malloc(sizeof *dst * per_block * (size_t)(n > 0 ? n : 1));
    const void **src = malloc(sizeof *src * per_block * (size_t)(n > 0 ? n : 1));
    size_t *bytes = malloc(sizeof *bytes * per_block * (size_t)(n > 0 ? n : 1));
    osp_status s = OSP_OK;
    if (!dst || !src || !bytes) {
        s = osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory");
    } else {
        int32_t m = 0;
        for (int32_t b = 0; b < n; b++) block_segments(kv, ids[b], hosts[b], read, dst, src, bytes, &m);
        if (where != MOVE_HOST) {
            s = kv->be->vt->copy_dev_many(kv->be, where == MOVE_DEV_SIDE, false, m, dst, src, bytes);
        } else if (kv->be->vt->copy_host_many) {
            s = kv->be->vt->copy_host_many(kv->be, read, m, dst, src, bytes);
        } else {
            for (int32_t i = 0; i < m && s == OSP_OK; i++)
                s = read ? kv->be->vt->to_host(kv->be, dst[i], src[i], bytes[i])
                         : kv->be->vt->from_host(kv->be, dst[i], src[i], bytes[i]);
        }
    }
    free(dst);
    free((void *)src);
    free(bytes);
    return s;
}

static osp_status blocks_move(osp_kv_cache *kv, int32_t n, const int32_t *ids, uint8_t *const *hosts, bool read) {
    return blocks_move_to(kv, n, ids, hosts, read, MOVE_HOST);
}

static osp_status block_move(osp_kv_cache *kv, int32_t id, uint8_t *host, bool read) {
    return blocks_move(kv, 1, &id, &host, read);
}

bool osp_kv_cache_host_register(osp_kv_cache *kv, void *p, size_t bytes) {
    return p && bytes > 0 && kv->be->vt->host_register && kv->be->vt->host_register(kv->be, p, bytes) == OSP_OK;
}

void osp_kv_cache_host_unregister(osp_kv_cache *kv, void *p) {
    if (p && kv->be->vt->host_unregister) kv->be->vt->host_unregister(kv->be, p);
}

osp_status osp_kv_cache_blocks_read(osp_kv_cache *kv, int32_t n, const int32_t *ids, void *const *dsts) {
    return blocks_move(kv, n, ids, (uint8_t *const *)dsts, true);
}

osp_status osp_kv_cache_blocks_write(osp_kv_cache *kv, int32_t n, const int32_t *ids, const void *const *srcs) {
    return blocks_move(kv, n, ids, (uint8_t *const *)(uintptr_t)srcs, false);
}

osp_status osp_kv_cache_block_read(osp_kv_cache *kv, int32_t id, void *dst) { return block_move(kv, id, dst, true); }

osp_status osp_kv_cache_block_write(osp_kv_cache *kv, int32_t id, const void *src) {
    return block_move(kv, id, (uint8_t *)(uintptr_t)src, false);
}

/* ---- CUDA IPC ---------------------------------------------------------------------------------- */

_Static_assert(OSP_KV_UUID_BYTES == OSP_BACKEND_UUID_BYTES && OSP_KV_IPC_HANDLE_BYTES == OSP_BACKEND_IPC_HANDLE_BYTES,
               "kv_cache.h's IPC sizes are the backend's");

#define NO_IPC(kv) osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: the %s backend has no CUDA IPC", (kv)->be->vt->name)

bool osp_kv_cache_ipc_capable(const osp_kv_cache *kv) {
    const osp_backend_vtable *vt = kv->be->vt;
    return vt->device_uuid && vt->ipc_handle && vt->ipc_open && vt->ipc_close && vt->copy_dev_many;
}

osp_status osp_kv_cache_device_uuid(osp_kv_cache *kv, uint8_t uuid[OSP_KV_UUID_BYTES]) {
    if (!osp_kv_cache_ipc_capable(kv)) return NO_IPC(kv);
    return kv->be->vt->device_uuid(kv->be, uuid);
}

osp_status osp_kv_cache_arena_create(osp_kv_cache *kv, size_t bytes, void **out,
                                     uint8_t handle[OSP_KV_IPC_HANDLE_BYTES]) {
    *out = NULL;
    if (!osp_kv_cache_ipc_capable(kv)) return NO_IPC(kv);
    void *p = NULL;
    OSP_TRY(kv->be->vt->buffer_alloc(kv->be, bytes, "the KV transfer arena (CUDA IPC)", &p));
    const osp_status s = kv->be->vt->ipc_handle(kv->be, p, handle);
    if (s != OSP_OK) {
        kv->be->vt->buffer_free(kv->be, p);
        return s;
    }
    *out = p;
    return OSP_OK;
}

void osp_kv_cache_arena_free(osp_kv_cache *kv, void *p) {
    if (p) kv->be->vt->buffer_free(kv->be, p);
}

osp_status osp_kv_cache_ipc_open(osp_kv_cache *kv, const uint8_t handle[OSP_KV_IPC_HANDLE_BYTES], void **out) {
    *out = NULL;
    if (!osp_kv_cache_ipc_capable(kv)) return NO_IPC(kv);
    return kv->be->vt->ipc_open(kv->be, handle, out);
}

void osp_kv_cache_ipc_close(osp_kv_cache *kv, void *p) {
    if (p && kv->be->vt->ipc_close) kv->be->vt->ipc_close(kv->be, p);
}

osp_status osp_kv_cache_blocks_read_device(osp_kv_cache *kv, int32_t n, const int32_t *ids, void *const *devs) {
    return blocks_move_to(kv, n, ids, (uint8_t *const *)devs, true, MOVE_DEV);
}

osp_status osp_kv_cache_blocks_write_device(osp_kv_cache *kv, int32_t n, const int32_t *ids, const void *const *srcs) {
    return blocks_move_to(kv, n, ids, (uint8_t *const *)(uintptr_t)srcs, false, MOVE_DEV_SIDE);
}

osp_status osp_kv_cache_device_to_host(osp_kv_cache *kv, void *dst, const void *src, size_t bytes) {
    if (!kv->be->vt->copy_dev_many) return NO_IPC(kv);
    return kv->be->vt->copy_dev_many(kv->be, true, true, 1, &dst, &src, &bytes);
}
