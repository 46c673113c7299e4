/* The KV cache scales file (issue 13): the fp32 scales a quantized KV cache fixes at creation, as
 * `osprey calibrate-kv` chooses them from a text run through the model, for `--kv-scales FILE`.
 *
 * One file serves both quantized page formats of src/kv/kv_cache.h: it holds the FP8 per-(layer, KV
 * head) scales s (a value x is stored as e4m3(x / s)) and the NVFP4 per-layer tensor scales T (the
 * micro-block scale is e4m3(amax / 6 / T)), each for K and for V. A file is for one attention shape:
 * loading it for a model with other layer, KV head or head_dim counts is refused.
 *
 * Layout, version 1 (all little-endian, no padding):
 *   header, 24 bytes:
 *     char magic[8]      "OSPKVS01" (the last two characters are the version)
 *     u32  n_layer       1 .. OSP_KVS_MAX_LAYERS
 *     u32  n_head_kv     1 .. OSP_KVS_MAX_HEADS
 *     u32  head_dim      1 .. OSP_KVS_MAX_HEAD_DIM
 *     u32  reserved      0
 *   body, 8 * n_layer * (n_head_kv + 1) bytes, fp32 (IEEE binary32), layer-major:
 *     f32  fp8_k[n_layer][n_head_kv]
 *     f32  fp8_v[n_layer][n_head_kv]
 *     f32  nvfp4_k[n_layer]
 *     f32  nvfp4_v[n_layer]
 *   trailer, 8 bytes:
 *     u64  checksum      FNV-1a 64 over every byte before it (header and body)
 * Every scale is finite and in [OSP_KVS_MIN_SCALE, OSP_KVS_MAX_SCALE]. A file that does not match
 * this exactly (size, magic or version, a count out of range, reserved bits, checksum, a scale out of
 * range or NaN) is refused whole: nothing of it is used. */
#ifndef OSP_FORMAT_KV_SCALES_H
#define OSP_FORMAT_KV_SCALES_H

#include <stddef.h>
#include <stdint.h>

#include "osprey/batch.h"
#include "osprey/status.h"

#define OSP_KVS_HEADER_BYTES 24
#define OSP_KVS_MAX_LAYERS 4096
#define OSP_KVS_MAX_HEADS 1024
#define OSP_KVS_MAX_HEAD_DIM 4096
#define OSP_KVS_MIN_SCALE 1e-30f
#define OSP_KVS_MAX_SCALE 1e30f

typedef struct osp_kv_scales {
    uint32_t n_layer, n_head_kv, head_dim;
    float *fp8_k;   /* [n_layer, n_head_kv] */
    float *fp8_v;   /* [n_layer, n_head_kv] */
    float *nvfp4_k; /* [n_layer] */
    float *nvfp4_v; /* [n_layer] */
} osp_kv_scales;

/* Bytes of a file for this shape; 0 when a count is out of range. */
size_t osp_kv_scales_file_bytes(uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim);

/* Allocates the arrays of *out for the shape (every scale set to 1.0). OSP_ERR_INVALID_ARG for a count
 * out of range, OSP_ERR_NOMEM; *out is zeroed on error. Release with osp_kv_scales_free. */
osp_status osp_kv_scales_init(osp_kv_scales *out, uint32_t n_layer, uint32_t n_head_kv, uint32_t head_dim);

/* Parses a whole file image buf[0..len) into *out (arrays malloc'd). Errors: OSP_ERR_FORMAT saying what
 * is wrong (truncated or too long, magic, version, a count, reserved, checksum, which scale is bad),
 * OSP_ERR_NOMEM. *out is zeroed on error. Untrusted input: fuzzed by tests/fuzz/fuzz_kv_scales.c. */
osp_status osp_kv_scales_parse(const void *buf, size_t len, osp_kv_scales *out);
/* Reads and parses `path`; errors as osp_kv_scales_parse, or OSP_ERR_IO naming the path. The message
 * of a parse error names the path too. */
osp_status osp_kv_scales_load(const char *path, osp_kv_scales *out);
/* Writes *s to `path` in the layout above. OSP_ERR_INVALID_ARG when a count or a scale is out of range
 * (nothing written), OSP_ERR_IO naming the path (a partial file is removed). */
osp_status osp_kv_scales_save(const char *path, const osp_kv_scales *s);
void osp_kv_scales_free(osp_kv_scales *s); /* NULL is fine; zeroes *s */

/* Checks that *s was made for an attention shape of n_layer layers, n_head_kv KV heads of head_dim:
 * OSP_ERR_INVALID_ARG naming both shapes otherwise. */
osp_status osp_kv_scales_check_shape(const osp_kv_scales *s, int32_t n_layer, int32_t n_head_kv, int32_t head_dim);

/* The fixed scales a cache of K pages of k_dtype and V pages of v_dtype takes from *s (kv_cache.h's
 * k_fixed / v_fixed: fp8 [n_layer, n_head_kv], nvfp4 [n_layer]; each side from its own dtype's set, so
 * a split K fp8 + V nvfp4 cache takes fp8_k and nvfp4_v); NULL for a side when s is NULL or that side's
 * dtype has no fixed scales (f16, f32), so the cache then takes its defaults. The pointers borrow from *s. */
void osp_kv_scales_for(const osp_kv_scales *s, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, const float **k_fixed,
                       const float **v_fixed);

#endif
