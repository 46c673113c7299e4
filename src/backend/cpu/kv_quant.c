/* Quantized KV pages on the CPU (issue 13): FP8 E4M3 and NVFP4 (layouts, scales and rounding in
 * src/kv/kv_cache.h). The KV write quantizes each token's K and V rows at slot_mapping on their own,
 * so a decode step writes only its own slot's bytes and micro-block scales. Attention reads the pages
 * directly: each K or V row is decoded into a head_dim-float buffer on the stack as it is used (the
 * same per-row widening the f16 pages get), never into a copy of the cache. The decoded value is
 * e4m3(code) * scale (fp8) or e2m1(code) * (e4m3(block scale) * tensor scale) (nvfp4), the same fp32
 * products as core/dtype.c's dequantizers, so attention over the pages equals attention over their
 * dequantized copy bit for bit (tests/ops/test_kv_quant.c). The codes are widened through IEEE half
 * (integer shifts, then F16C 8 at a time where the build has it), see below. */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "core/dtype.h"
#include "osprey/batch.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kv_quant.c packs two halves per uint32 in little-endian order"
#endif

/* Decoding by way of IEEE half (so F16C converts 8 at a time, as for f16 pages):
 *  E4M3 s.eeee.mmm -> half s.0eeee.mmm0000000: the half's exponent field is e and its top mantissa
 *  bits are m, so half = 2^(e-15) (1 + m/8) (normal) or 2^-14 m/8 (e = 0), exactly 2^-8 times the E4M3
 *  value (2^(e-7) (1 + m/8), or 2^-6 m/8) -- every E4M3 number is a half, subnormals included.
 *  E2M1 s.ee.m -> half s.000ee.m000000000: likewise exactly 2^-14 times the E2M1 value.
 * The power of two goes into the scale: x * (2^8 * s) rounds the same real number x_e4m3 * s as
 * core/dtype.c's osp_e4m3_to_fp32(c) * s (2^8 * s is exact), so the decoded values are bit-identical to
 * the dequantizers'. E4M3's NaN codes (S.1111.111) would map to 480; they are put back to NaN. */
static inline uint16_t e4m3_half_bits(uint8_t c) { return (uint16_t)(((c & 0x7Fu) << 7) | ((c & 0x80u) << 8)); }

void osp_cpu_kv_write_quant(const osp_cpu_kv_pages *kv, void *k_pages, void *v_pages, uint8_t *k_scales,
                            uint8_t *v_scales, const float *k, const float *v, int32_t slot, int64_t n_head_kv,
                            int64_t head_dim) {
    if (slot < 0) return; /* a padding row: no write */
    const int64_t kv_row = n_head_kv * head_dim;
    for (int which = 0; which < 2; which++) {
        const float *x = which ? v : k;
        const float *fixed = which ? kv->v_fixed : kv->k_fixed;
        if (kv->type == OSP_KV_DTYPE_FP8) {
            uint8_t *dst = (uint8_t *)(which ? v_pages : k_pages) + (size_t)slot * (size_t)kv_row;
            for (int64_t h = 0; h < n_head_kv; h++) {
                const float s = fixed[h];
                for (int64_t d = 0; d < head_dim; d++) dst[h * head_dim + d] = osp_fp32_to_e4m3(x[h * head_dim + d] / s);
            }
        } else { /* NVFP4 */
            uint8_t *dst = (uint8_t *)(which ? v_pages : k_pages) + (size_t)slot * (size_t)(kv_row / 2);
            uint8_t *sc = (which ? v_scales : k_scales) + (size_t)slot * (size_t)(kv_row / 16);
            for (int64_t j = 0; j < kv_row / 16; j++) osp_nvfp4_quantize16(x + 16 * j, fixed[0], dst + 8 * j, sc + j);
        }
    }
}

/* Row (slot, kvh) of K (which 0) or V (1) as fp32: a pointer into f32 pages, or `row` filled. */
static inline const float *read_row(const osp_cpu_kv_pages *kv, int which, int64_t slot, int64_t kvh,
                                    int64_t n_head_kv, int64_t head_dim, float *restrict row, uint16_t *restrict half) {
    const int64_t kv_row = n_head_kv * head_dim;
    const void *pages = which ? kv->v : kv->k;
    switch (kv->type) {
    case OSP_DTYPE_F32: return (const float *)pages + slot * kv_row + kvh * head_dim;
    case OSP_DTYPE_F16:
        osp_cpu_f16_to_f32_row((const uint16_t *)pages + slot * kv_row + kvh * head_dim, row, head_dim);
        return row;
    case OSP_KV_DTYPE_FP8: {
        const uint8_t *c = (const uint8_t *)pages + slot * kv_row + kvh * head_dim;
        const float s = (which ? kv->v_fixed : kv->k_fixed)[kvh] * 256.0f;
        for (int64_t d = 0; d < head_dim; d++) half[d] = e4m3_half_bits(c[d]);
        osp_cpu_f16_to_f32_row(half, row, head_dim);
        for (int64_t d = 0; d < head_dim; d++) row[d] = (c[d] & 0x7F) == 0x7F ? NAN : row[d] * s;
        return row;
    }
    default: { /* NVFP4 */
        const uint8_t *c = (const uint8_t *)pages + (slot * kv_row + kvh * head_dim) / 2;
        const uint8_t *sc = (which ? kv->v_scale : kv->k_scale) + (slot * kv_row + kvh * head_dim) / 16;
        const float t = (which ? kv->v_fixed : kv->k_fixed)[0];
        /* both nibbles of a byte at once: the low one's half in the low 16 bits (value 2i first in
         * memory on this little-endian host), the high one's in the high 16 */
        for (int64_t i = 0; i < head_dim / 2; i++) {
            const uint32_t b = c[i];
            const uint32_t w = ((b & 7u) << 9) | ((b & 8u) << 12) | ((b & 0x70u) << 21) | ((b & 0x80u) << 24);
            memcpy(half + 2 * i, &w, sizeof w);
        }
        osp_cpu_f16_to_f32_row(half, row, head_dim);
        /* the micro-block's scale as core/dtype.c forms it (e4m3 * tensor scale), times 2^14 */
        for (int64_t j = 0; j < head_dim / 16; j++) {
            const float bs = (sc[j] & 0x7F) == 0x7F ? NAN /* never written: the scale saturates at 448 */
                                                    : osp_fp16_to_fp32(e4m3_half_bits(sc[j])) * 256.0f * t * 16384.0f;
            for (int i = 0; i < 16; i++) row[16 * j + i] *= bs;
        }
        return row;
    }
    }
}

#define MAX_HEAD_DIM 1024

/* Items (t, h), h fastest, are taken in tiles: the heads of one KV head's group at one token (those of
 * them in [item_begin, item_end)), at most `max_tile`. Each K and V row is read (and widened from
 * f16/fp8/nvfp4) once per tile instead of once per item; every item keeps its own scores, maximum, sum
 * and output, computed with exactly the operations, in the order, of a tile of one (three passes: scores
 * and max, exp and sum, weighted V sum), so the result never depends on the tile. */
void osp_cpu_paged_attention_tiled(const float *q, const osp_cpu_kv_pages *kv, float *out, int32_t num_seqs,
                                   const int32_t *query_start_loc, const int32_t *positions,
                                   const int32_t *block_table, int32_t max_blocks, int32_t block_size, int64_t n_head,
                                   int64_t n_head_kv, int64_t head_dim, float scale, int32_t window, float *sc,
                                   int64_t sc_stride, int max_tile, int64_t item_begin, int64_t item_end) {
    const int64_t group = n_head / n_head_kv;
    float row[MAX_HEAD_DIM];
    uint16_t half[MAX_HEAD_DIM];
    int32_t s = 0;
    if (max_tile < 1) max_tile = 1;
    if (max_tile > OSP_CPU_ATTN_MAX_TILE) max_tile = OSP_CPU_ATTN_MAX_TILE;
    for (int64_t item = item_begin; item < item_end;) {
        const int64_t t = item / n_head, h0 = item % n_head;
        /* the tile: heads h0.. of h0's group at token t, inside the range, at most max_tile */
        const int64_t kvh = h0 / group, group_end = (kvh + 1) * group;
        int64_t m = group_end - h0;
        if (m > item_end - item) m = item_end - item;
        if (m > max_tile) m = max_tile;
        item += m;
        while (s < num_seqs - 1 && t >= query_start_loc[s + 1]) s++;
        while (s > 0 && t < query_start_loc[s]) s--;
        const int32_t *bt = block_table + (size_t)s * max_blocks;
        const int64_t n_ctx = (int64_t)positions[t] + 1;
        const int64_t p0 = window > 0 && n_ctx > window ? n_ctx - window : 0; /* sliding window */
        const float *qh = q + (t * n_head + h0) * head_dim;
        float mx[OSP_CPU_ATTN_MAX_TILE] = {0}, sum[OSP_CPU_ATTN_MAX_TILE] = {0};
        for (int64_t j = 0; j < m; j++) mx[j] = -INFINITY;
        for (int64_t p = p0; p < n_ctx; p++) {
            const int64_t slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
            const float *kr = read_row(kv, 0, slot, kvh, n_head_kv, head_dim, row, half);
            for (int64_t j = 0; j < m; j++) {
                float *scj = sc + j * sc_stride;
                scj[p] = osp_cpu_dot_inline(qh + j * head_dim, kr, head_dim) * scale;
                if (scj[p] > mx[j]) mx[j] = scj[p];
            }
        }
        for (int64_t j = 0; j < m; j++) {
            float *scj = sc + j * sc_stride;
            sum[j] = 0.0f;
            for (int64_t p = p0; p < n_ctx; p++) {
                scj[p] = expf(scj[p] - mx[j]);
                sum[j] += scj[p];
            }
        }
        float *o = out + (t * n_head + h0) * head_dim;
        memset(o, 0, (size_t)(m * head_dim) * sizeof *o);
        for (int64_t p = p0; p < n_ctx; p++) {
            const int64_t slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
            const float *vp = read_row(kv, 1, slot, kvh, n_head_kv, head_dim, row, half);
            for (int64_t j = 0; j < m; j++) {
                const float w = sc[j * sc_stride + p];
                float *oj = o + j * head_dim;
                for (int64_t d = 0; d < head_dim; d++) oj[d] += w * vp[d];
            }
        }
        for (int64_t j = 0; j < m; j++) {
            const float inv = 1.0f / sum[j];
            float *oj = o + j * head_dim;
            for (int64_t d = 0; d < head_dim; d++) oj[d] *= inv;
        }
    }
}

void osp_cpu_paged_attention_kv(const float *q, const osp_cpu_kv_pages *kv, float *out, int32_t num_seqs,
                                const int32_t *query_start_loc, const int32_t *positions, const int32_t *block_table,
                                int32_t max_blocks, int32_t block_size, int64_t n_head, int64_t n_head_kv,
                                int64_t head_dim, float scale, int32_t window, float *sc, int64_t item_begin,
                                int64_t item_end) {
    osp_cpu_paged_attention_tiled(q, kv, out, num_seqs, query_start_loc, positions, block_table, max_blocks,
                                  block_size, n_head, n_head_kv, head_dim, scale, window, sc, 0, 1, item_begin,
                                  item_end);
}

const float *osp_cpu_kv_read_row(const osp_cpu_kv_pages *kv, int which, int64_t slot, int64_t kvh, int64_t n_head_kv,
                                 int64_t head_dim, float *row, uint16_t *half) {
    return read_row(kv, which, slot, kvh, n_head_kv, head_dim, row, half);
}
