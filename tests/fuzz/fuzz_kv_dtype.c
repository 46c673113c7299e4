/* libFuzzer target for the KV cache dtype parser (--kv-cache-dtype, src/kv/kv_cache.c) and the page
 * format / size arithmetic it leads to.
 *
 * Input: the first 16 bytes, when present, give a shape (layers, KV heads, head_dim, blocks, block
 * size, 16 bits each, a K dtype id and a V dtype id, 16 bits each: a split cache when they differ); the
 * rest is a dtype name. A parsed name must round-trip through
 * osp_kv_dtype_name; a rejected one must say why and leave the output alone. The shape goes through
 * osp_kv_page_format_of and osp_kv_cache_size: either an error with a message, or sizes at least the
 * pages and scales need (no wrapped products). A crash, a sanitizer report or a silent rejection is a
 * bug. Seeds: tests/fuzz/corpus/kv_dtype/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_cache.h"
#include "osprey/kv_cache.h"
#include "osprey/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int32_t u16(const uint8_t *p) { return (int32_t)(p[0] | p[1] << 8); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= 16) {
        const osp_kv_shape sh = {u16(data), u16(data + 2), u16(data + 4)};
        const int32_t nb = u16(data + 6) * 64, bs = u16(data + 8);
        const osp_kv_dtype dt = (osp_kv_dtype)(data[10] | data[11] << 8), dv = (osp_kv_dtype)(data[12] | data[13] << 8);
        osp_kv_page_format f, fv;
        size_t bytes = 1;
        const osp_status s = osp_kv_page_format_of(&sh, dt, &f);
        const osp_status sv = osp_kv_page_format_of(&sh, dv, &fv);
        const osp_status z = osp_kv_cache_size(&sh, nb, bs, dt, dv, &bytes);
        if ((s != OSP_OK || sv != OSP_OK || z != OSP_OK) && !osp_last_error()[0]) abort();
        if (z != OSP_OK && bytes != 0) abort();
        if (s == OSP_OK && sv == OSP_OK && z == OSP_OK) {
            const unsigned __int128 need = (unsigned __int128)(unsigned)sh.n_layer * (unsigned)nb * (unsigned)bs *
                                           (f.bytes_per_token + f.scale_bytes_per_token + fv.bytes_per_token +
                                            fv.scale_bytes_per_token);
            if (need > bytes) abort();
            if (dt == OSP_KV_DTYPE_NVFP4 && (sh.head_dim % 16 || f.scale_bytes_per_token * 16 != (size_t)f.kv_row)) abort();
            if (dv == OSP_KV_DTYPE_NVFP4 && (sh.head_dim % 16 || fv.scale_bytes_per_token * 16 != (size_t)fv.kv_row)) abort();
            /* int8_hier: an even head_dim, upper codes + S + M a row in the pages, lower codes in the pool */
            if (dt == OSP_KV_DTYPE_INT8_HIER &&
                (sh.head_dim % 2 || f.scale_bytes_per_token * 2 != (size_t)f.kv_row ||
                 f.bytes_per_token != (size_t)sh.n_head_kv * ((size_t)sh.head_dim / 2 + 4)))
                abort();
            if (dv == OSP_KV_DTYPE_INT8_HIER &&
                (sh.head_dim % 2 || fv.scale_bytes_per_token * 2 != (size_t)fv.kv_row ||
                 fv.bytes_per_token != (size_t)sh.n_head_kv * ((size_t)sh.head_dim / 2 + 4)))
                abort();
        }
        /* the size is a success exactly when both formats are */
        if ((z == OSP_OK) != (s == OSP_OK && sv == OSP_OK) && nb > 0 && bs > 0 && z != OSP_ERR_INVALID_ARG) abort();
        data += 16, size -= 16;
    }
    char name[64];
    const size_t n = size < sizeof name - 1 ? size : sizeof name - 1;
    memcpy(name, data, n);
    name[n] = 0;
    osp_kv_dtype d = (osp_kv_dtype)12345;
    if (osp_kv_dtype_parse(name, &d) != OSP_OK) {
        if (!osp_last_error()[0] || d != (osp_kv_dtype)12345) abort();
        return 0;
    }
    const char *canon = osp_kv_dtype_name(d);
    osp_kv_dtype back;
    if (!canon || osp_kv_dtype_parse(canon, &back) != OSP_OK || back != d) abort();
    return 0;
}
