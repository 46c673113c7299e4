/* The paged KV cache on a backend (see kv_cache.h): page formats, one allocation per cache, block
 * copies for copy-on-write. */
#include "kv/kv_cache.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/status_internal.h"

const char *osp_kv_dtype_name(osp_kv_dtype d) {
    return d == OSP_KV_DTYPE_F32 ? "f32" : d == OSP_KV_DTYPE_F16 ? "f16" : NULL;
}

osp_status osp_kv_dtype_parse(const char *name, osp_kv_dtype *out) {
    if (name && !strcmp(name, "f32")) *out = OSP_KV_DTYPE_F32;
    else if (name && !strcmp(name, "f16")) *out = OSP_KV_DTYPE_F16;
    else return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache dtype '%s' is not one of f32, f16", name ? name : "(null)");
    return OSP_OK;
}

osp_status osp_kv_page_format_of(const osp_kv_shape *c, osp_kv_dtype dtype, osp_kv_page_format *out) {
    memset(out, 0, sizeof *out);
    if (!osp_kv_dtype_name(dtype)) return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: unknown dtype %d", (int)dtype);
    if (dtype == OSP_KV_DTYPE_F16 && c->head_dim > 1024)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: f16 pages need head_dim <= 1024 (model has %d)", c->head_dim);
    out->dtype = dtype;
    out->elem_type = dtype == OSP_KV_DTYPE_F16 ? OSP_DTYPE_F16 : OSP_DTYPE_F32;
    out->kv_row = (int64_t)c->n_head_kv * c->head_dim;
    out->bytes_per_token = (size_t)out->kv_row * (dtype == OSP_KV_DTYPE_F16 ? 2 : 4);
    out->scale_bytes_per_block = 0;
    return OSP_OK;
}

osp_status osp_kv_cache_create_on(osp_backend *be, const osp_kv_shape *c, int32_t num_blocks,
                                  int32_t block_size, osp_kv_dtype dtype, osp_kv_cache **out) {
    *out = NULL;
    if (num_blocks <= 0 || block_size <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: num_blocks %d and block_size %d must be > 0",
                             num_blocks, block_size);
    osp_kv_page_format fmt;
    OSP_TRY(osp_kv_page_format_of(c, dtype, &fmt));
    osp_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv) return osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory");
    static _Atomic uint64_t next_id = 1;
    kv->id = next_id++;
    kv->num_blocks = num_blocks;
    kv->block_size = block_size;
    kv->n_layer = c->n_layer;
    kv->fmt = fmt;
    kv->be = be;
    osp_backend_retain(be); /* the pages are freed through it, maybe after the model */
    /* every product checked: a cache too large for size_t is refused, not wrapped */
    size_t slots, page, scales, per_layer;
    const size_t pad = 255;
    if (__builtin_mul_overflow((size_t)num_blocks, (size_t)block_size, &slots) ||
        __builtin_mul_overflow(slots, fmt.bytes_per_token, &page) ||
        __builtin_mul_overflow((size_t)num_blocks, fmt.scale_bytes_per_block, &scales) || page > SIZE_MAX / 4 - pad ||
        scales > SIZE_MAX / 4 - pad ||
        __builtin_mul_overflow(2 * (((page + pad) & ~pad) + ((scales + pad) & ~pad)), (size_t)1, &per_layer) ||
        __builtin_mul_overflow(per_layer, (size_t)kv->n_layer, &kv->bytes)) {
        osp_kv_cache_free(kv);
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: %d blocks of %d tokens do not fit in memory sizes",
                             num_blocks, block_size);
    }
    kv->k = calloc((size_t)kv->n_layer, sizeof *kv->k);
    kv->v = calloc((size_t)kv->n_layer, sizeof *kv->v);
    kv->k_scale = calloc((size_t)kv->n_layer, sizeof *kv->k_scale);
    kv->v_scale = calloc((size_t)kv->n_layer, sizeof *kv->v_scale);
    osp_status s = OSP_OK;
    if (!kv->k || !kv->v || !kv->k_scale || !kv->v_scale) s = osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory");
    if (s == OSP_OK) s = be->vt->buffer_alloc(be, kv->bytes, "the KV cache", &kv->pages);
    if (s != OSP_OK) {
        osp_kv_cache_free(kv);
        if (s == OSP_ERR_NOMEM)
            return osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory for %d blocks of %d tokens (%zu bytes)",
                                 num_blocks, block_size, per_layer * (size_t)c->n_layer);
        return s;
    }
    char *p = kv->pages;
    const size_t page_al = (page + pad) & ~pad, scale_al = (scales + pad) & ~pad;
    for (int32_t l = 0; l < kv->n_layer; l++) {
        kv->k[l] = p, p += page_al;
        kv->v[l] = p, p += page_al;
        kv->k_scale[l] = scales ? p : NULL, p += scale_al;
        kv->v_scale[l] = scales ? p : NULL, p += scale_al;
    }
    *out = kv;
    return OSP_OK;
}

void osp_kv_cache_free(osp_kv_cache *kv) {
    if (!kv) return;
    if (kv->pages) kv->be->vt->buffer_free(kv->be, kv->pages);
    osp_backend_free(kv->be); /* our reference */
    free(kv->k);
    free(kv->v);
    free(kv->k_scale);
    free(kv->v_scale);
    free(kv);
}

int32_t osp_kv_cache_block_size(const osp_kv_cache *kv) { return kv->block_size; }
int32_t osp_kv_cache_num_blocks(const osp_kv_cache *kv) { return kv->num_blocks; }
osp_kv_dtype osp_kv_cache_dtype(const osp_kv_cache *kv) { return kv->fmt.dtype; }

size_t osp_kv_cache_bytes(const osp_kv_cache *kv) {
    return 2 * (size_t)kv->n_layer * (size_t)kv->num_blocks *
           ((size_t)kv->block_size * kv->fmt.bytes_per_token + kv->fmt.scale_bytes_per_block);
}

osp_status osp_kv_cache_copy_block(osp_kv_cache *kv, int32_t src, int32_t dst) {
    if (src < 0 || src >= kv->num_blocks || dst < 0 || dst >= kv->num_blocks)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache: copy of block %d to %d outside the %d blocks", src, dst,
                             kv->num_blocks);
    const size_t bytes = (size_t)kv->block_size * kv->fmt.bytes_per_token, sb = kv->fmt.scale_bytes_per_block;
    for (int32_t l = 0; l < kv->n_layer; l++) {
        OSP_TRY(kv->be->vt->copy(kv->be, (char *)kv->k[l] + (size_t)dst * bytes, (const char *)kv->k[l] + (size_t)src * bytes,
                                 bytes));
        OSP_TRY(kv->be->vt->copy(kv->be, (char *)kv->v[l] + (size_t)dst * bytes, (const char *)kv->v[l] + (size_t)src * bytes,
                                 bytes));
        if (sb) {
            OSP_TRY(kv->be->vt->copy(kv->be, (char *)kv->k_scale[l] + (size_t)dst * sb,
                                     (const char *)kv->k_scale[l] + (size_t)src * sb, sb));
            OSP_TRY(kv->be->vt->copy(kv->be, (char *)kv->v_scale[l] + (size_t)dst * sb,
                                     (const char *)kv->v_scale[l] + (size_t)src * sb, sb));
        }
    }
    return OSP_OK;
}
