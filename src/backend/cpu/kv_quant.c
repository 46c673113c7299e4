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
#include "backend/cpu/vexp.h"
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

void osp_cpu_kv_write_row(uint32_t type, const float *fixed, void *pages, uint8_t *scales, const float *x, int32_t slot,
                          int64_t n_head_kv, int64_t head_dim) {
    if (slot < 0) return; /* a padding row: no write */
    const int64_t kv_row = n_head_kv * head_dim;
    switch (type) {
    case OSP_DTYPE_F32: memcpy((float *)pages + (size_t)slot * (size_t)kv_row, x, (size_t)kv_row * sizeof(float)); break;
    case OSP_DTYPE_F16: osp_cpu_f32_to_f16_row(x, (uint16_t *)pages + (size_t)slot * (size_t)kv_row, kv_row); break;
    case OSP_KV_DTYPE_FP8: {
        uint8_t *dst = (uint8_t *)pages + (size_t)slot * (size_t)kv_row;
        for (int64_t h = 0; h < n_head_kv; h++) {
            const float s = fixed[h];
            for (int64_t d = 0; d < head_dim; d++) dst[h * head_dim + d] = osp_fp32_to_e4m3(x[h * head_dim + d] / s);
        }
        break;
    }
    case OSP_KV_DTYPE_INT8_HIER: { /* per KV head: upper codes + S + M in the pages, lower codes in the pool */
        const size_t rb = (size_t)head_dim / 2 + 4;
        uint8_t *dst = (uint8_t *)pages + (size_t)slot * (size_t)n_head_kv * rb;
        uint8_t *lo = scales + (size_t)slot * (size_t)(kv_row / 2);
        for (int64_t h = 0; h < n_head_kv; h++) {
            uint16_t sm[2];
            osp_int8h_quantize_row(x + h * head_dim, head_dim, dst + h * rb, lo + h * (head_dim / 2), sm);
            memcpy(dst + h * rb + head_dim / 2, sm, sizeof sm);
        }
        break;
    }
    default: { /* NVFP4 */
        uint8_t *dst = (uint8_t *)pages + (size_t)slot * (size_t)(kv_row / 2);
        uint8_t *sc = scales + (size_t)slot * (size_t)(kv_row / 16);
        for (int64_t j = 0; j < kv_row / 16; j++) osp_nvfp4_quantize16(x + 16 * j, fixed[0], dst + 8 * j, sc + j);
        break;
    }
    }
}

void osp_cpu_kv_write_quant(const osp_cpu_kv_pages *kv, void *k_pages, void *v_pages, uint8_t *k_scales,
                            uint8_t *v_scales, const float *k, const float *v, int32_t slot, int64_t n_head_kv,
                            int64_t head_dim) {
    osp_cpu_kv_write_row(kv->k_type, kv->k_fixed, k_pages, k_scales, k, slot, n_head_kv, head_dim);
    osp_cpu_kv_write_row(kv->v_type, kv->v_fixed, v_pages, v_scales, v, slot, n_head_kv, head_dim);
}

/* An int8_hier row (core/dtype.h osp_int8h_dequantize_row's formulas and fp32 operations, so the values are
 * bit-identical to it): the codes are first spread into 16-bit integers (h = 32 u + 2 l, or u alone), a
 * loop the compiler vectorizes, then widened and scaled in a second one. */
static inline void int8h_row(const uint8_t *restrict up, const uint8_t *restrict lo, float *restrict y,
                             uint16_t *restrict h, int64_t D) {
    uint16_t sm[2];
    memcpy(sm, up + D / 2, sizeof sm);
    const float S = osp_fp16_to_fp32(sm[0]), M = osp_fp16_to_fp32(sm[1]);
    if (lo) {
        for (int64_t i = 0; i < D / 2; i++) {
            const uint16_t b = up[i], c = lo[i];
            h[2 * i] = (uint16_t)(32 * (b & 15) + 2 * (c & 15));
            h[2 * i + 1] = (uint16_t)(32 * (b >> 4) + 2 * (c >> 4));
        }
        const float S32 = S * 0.03125f;
        for (int64_t i = 0; i < D; i++) y[i] = M + S32 * (float)((int32_t)h[i] - 15);
    } else {
        for (int64_t i = 0; i < D / 2; i++) h[2 * i] = up[i] & 15, h[2 * i + 1] = up[i] >> 4;
        for (int64_t i = 0; i < D; i++) y[i] = M + S * (float)h[i];
    }
}

/* Row (slot, kvh) of K (which 0) or V (1) as fp32: a pointer into f32 pages, or `row` filled. full:
 * int8_hier rows read with both halves (else the upper ones alone); other types ignore it. */
static inline const float *read_row(const osp_cpu_kv_pages *kv, int which, int64_t slot, int64_t kvh,
                                    int64_t n_head_kv, int64_t head_dim, float *restrict row, uint16_t *restrict half,
                                    bool full) {
    const int64_t kv_row = n_head_kv * head_dim;
    const void *pages = which ? kv->v : kv->k;
    switch (which ? kv->v_type : kv->k_type) { /* K and V may differ (a split cache) */
    case OSP_KV_DTYPE_INT8_HIER: {
        const int64_t rb = head_dim / 2 + 4;
        const uint8_t *up = (const uint8_t *)pages + (slot * n_head_kv + kvh) * rb;
        const uint8_t *lo = (which ? kv->v_scale : kv->k_scale) + (slot * kv_row + kvh * head_dim) / 2;
        int8h_row(up, full ? lo : NULL, row, half, head_dim);
        return row;
    }
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

/* One tile of attention items sharing a sequence (block table) and a KV head: item j reads query row
 * qs[j], writes output row os[j], and attends to keys [p0s[j], n_ctxs[j]). Each K and V row in the union
 * of the ranges is read (and widened from f16/fp8/nvfp4) once for the whole tile; every item keeps its
 * own scores (row j of sc, stride sc_stride), maximum, sum and output, computed with exactly the
 * operations, in the order, of a tile of one (three passes: scores and max, exp and sum, weighted V sum,
 * each in increasing position), so an item's result never depends on its tile. */
typedef struct attn_tile {
    int64_t m;
    const float *qs[OSP_CPU_ATTN_MAX_TILE];
    float *os[OSP_CPU_ATTN_MAX_TILE];
    int64_t p0s[OSP_CPU_ATTN_MAX_TILE], n_ctxs[OSP_CPU_ATTN_MAX_TILE];
} attn_tile;

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define ATTN_KBLK 16 /* keys a block in the blocked path */
#define ATTN_KBLK_MAX_D 128

/* out[i] = osp_cpu_dot(q, k[i], D) for 16 keys, bit for bit: each key's 16-lane accumulator of rounded
 * products is built as osp_cpu_dot16_avx512 builds it, then the 16 accumulators are folded together, two
 * keys a shuffle, in exactly its tree (acc[j] += acc[j + w], w = 8, 4, 2, 1): after the four stages the
 * float at 4 q + r holds key 4 r + q, put back in order by one permute. D % 16 == 0. */
static inline void dot16_keys(const float *q, const float *const *k, int64_t D, float *out) {
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        for (int i = 0; i < 16; i++) acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(qv, _mm512_loadu_ps(k[i] + d)));
    }
    __m512 c[8], e[4], f[2];
    for (int i = 0; i < 8; i++) /* w = 8: [A lo8 + A hi8 | B lo8 + B hi8] */
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++) /* w = 4: one key's 4 sums a 128-bit lane */
        e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++) /* w = 2 */
        f[i] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)), /* w = 1 */
                                   _mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, r));
}

/* Asks for the f16 K (which 0) or V (1) rows of keys [p0, min(p0 + ATTN_KBLK, hi)) (other page types:
 * nothing). A batched decode step reads every sequence's K and V once, 128 bytes a row and KV head at
 * head_dim 64, through the block table, and the block loops below stalled on those loads
 * (bench/cpu/NOTES.md, tenth pass), so each block of keys asks for the next one's rows first. */
static inline void prefetch_block(const osp_cpu_kv_pages *kv, int which, const int32_t *bt, int32_t block_size,
                                  int64_t p0, int64_t hi, int64_t kvh, int64_t n_head_kv, int64_t D) {
    if ((which ? kv->v_type : kv->k_type) != OSP_DTYPE_F16) return;
    const uint16_t *base = (const uint16_t *)(which ? kv->v : kv->k);
    const int64_t p1 = hi - p0 < ATTN_KBLK ? hi : p0 + ATTN_KBLK;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
        const char *h = (const char *)(base + (slot * n_head_kv + kvh) * D);
        for (int64_t o = 0; o < 2 * D; o += 64) _mm_prefetch(h + o, _MM_HINT_T0);
    }
}

/* attend_tile's arithmetic in blocks of 16 keys (head_dim a multiple of 16, at most 128): a block's K (V)
 * rows are read once into a buffer; each item's 16 scores come from one dot16_keys; each item's output
 * stays in registers, 64 dims at a time, across a block's keys. Every score, maximum, sum and output value
 * is computed with the operations, in the order, of attend_tile's one-key-at-a-time loops (products
 * rounded then added, keys in increasing position), so the results are the same bits. */
static void attend_tile_blocked(const attn_tile *tl, const osp_cpu_kv_pages *kv, const int32_t *bt,
                                int32_t block_size, int64_t kvh, int64_t n_head_kv, int64_t head_dim, float scale,
                                float *sc, int64_t sc_stride, uint16_t *half, int64_t lo, int64_t hi,
                                int64_t full_from) {
    const int64_t m = tl->m, D = head_dim;
    float buf[ATTN_KBLK * ATTN_KBLK_MAX_D];
    const float *rp[ATTN_KBLK];
    float mx[OSP_CPU_ATTN_MAX_TILE], sum[OSP_CPU_ATTN_MAX_TILE];
    for (int64_t j = 0; j < m; j++) mx[j] = -INFINITY;
    for (int64_t pb = lo; pb < hi; pb += ATTN_KBLK) {
        const int64_t nb = hi - pb < ATTN_KBLK ? hi - pb : ATTN_KBLK;
        prefetch_block(kv, pb + ATTN_KBLK >= hi, bt, block_size, pb + ATTN_KBLK < hi ? pb + ATTN_KBLK : lo, hi, kvh,
                       n_head_kv, D);
        for (int64_t i = 0; i < nb; i++) {
            const int64_t p = pb + i, slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
            rp[i] = read_row(kv, 0, slot, kvh, n_head_kv, D, buf + i * D, half, p >= full_from);
        }
        for (int64_t i = nb; i < ATTN_KBLK; i++) rp[i] = rp[0]; /* scores computed, never used */
        for (int64_t j = 0; j < m; j++) {
            const int64_t a = pb > tl->p0s[j] ? pb : tl->p0s[j], b = pb + nb < tl->n_ctxs[j] ? pb + nb : tl->n_ctxs[j];
            if (a >= b) continue;
            float s16[ATTN_KBLK];
            dot16_keys(tl->qs[j], rp, D, s16);
            float *scj = sc + j * sc_stride;
            for (int64_t p = a; p < b; p++) {
                scj[p] = s16[p - pb] * scale;
                if (scj[p] > mx[j]) mx[j] = scj[p];
            }
        }
    }
    for (int64_t j = 0; j < m; j++) {
        float *scj = sc + j * sc_stride, acc = 0.0f;
        const float mj = mx[j];
        for (int64_t p = tl->p0s[j]; p < tl->n_ctxs[j]; p++) {
            const float e = expf(scj[p] - mj);
            scj[p] = e;
            acc += e;
        }
        sum[j] = acc;
        memset(tl->os[j], 0, (size_t)D * sizeof(float));
    }
    for (int64_t pb = lo; pb < hi; pb += ATTN_KBLK) {
        const int64_t nb = hi - pb < ATTN_KBLK ? hi - pb : ATTN_KBLK;
        prefetch_block(kv, 1, bt, block_size, pb + ATTN_KBLK, hi, kvh, n_head_kv, D);
        for (int64_t i = 0; i < nb; i++) {
            const int64_t p = pb + i, slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
            rp[i] = read_row(kv, 1, slot, kvh, n_head_kv, D, buf + i * D, half, p >= full_from);
        }
        for (int64_t j = 0; j < m; j++) {
            const int64_t a = pb > tl->p0s[j] ? pb : tl->p0s[j], b = pb + nb < tl->n_ctxs[j] ? pb + nb : tl->n_ctxs[j];
            if (a >= b) continue;
            const float *w = sc + j * sc_stride;
            float *o = tl->os[j];
            int64_t d0 = 0;
            for (; d0 + 64 <= D; d0 += 64) { /* 64 dims in four registers across the block's keys */
                __m512 a0 = _mm512_loadu_ps(o + d0), a1 = _mm512_loadu_ps(o + d0 + 16),
                       a2 = _mm512_loadu_ps(o + d0 + 32), a3 = _mm512_loadu_ps(o + d0 + 48);
                for (int64_t p = a; p < b; p++) {
                    const __m512 wv = _mm512_set1_ps(w[p]);
                    const float *vr = rp[p - pb] + d0;
                    a0 = _mm512_add_ps(a0, _mm512_mul_ps(wv, _mm512_loadu_ps(vr)));
                    a1 = _mm512_add_ps(a1, _mm512_mul_ps(wv, _mm512_loadu_ps(vr + 16)));
                    a2 = _mm512_add_ps(a2, _mm512_mul_ps(wv, _mm512_loadu_ps(vr + 32)));
                    a3 = _mm512_add_ps(a3, _mm512_mul_ps(wv, _mm512_loadu_ps(vr + 48)));
                }
                _mm512_storeu_ps(o + d0, a0), _mm512_storeu_ps(o + d0 + 16, a1);
                _mm512_storeu_ps(o + d0 + 32, a2), _mm512_storeu_ps(o + d0 + 48, a3);
            }
            for (; d0 < D; d0 += 16) { /* head_dim 16, 32, 48, 80, 96, 112: the rest, 16 at a time */
                __m512 a0 = _mm512_loadu_ps(o + d0);
                for (int64_t p = a; p < b; p++)
                    a0 = _mm512_add_ps(a0, _mm512_mul_ps(_mm512_set1_ps(w[p]), _mm512_loadu_ps(rp[p - pb] + d0)));
                _mm512_storeu_ps(o + d0, a0);
            }
        }
    }
    for (int64_t j = 0; j < m; j++) {
        const float inv = 1.0f / sum[j];
        float *oj = tl->os[j];
        for (int64_t d = 0; d < D; d++) oj[d] *= inv;
    }
}

/* ATTENTION IN Q8 MODE (kv->q8_arith, `--cpu-activations q8`; AVX512, head_dim % 16 == 0, <= 128). The
 * default path's bits stay the default path's; this mode has its own arithmetic, the same for an item
 * whatever its tile (prefill blocks, decode, any batch), so its results do not depend on the batch:
 *   score s_p = dot16_keys's lanes and fold, each lane a chain of fused multiply-adds over the 16-dim
 *             chunks (fma(q, k, acc), not a rounded product then an add), times scale;
 *   mx        = the largest s_p (exact in any order);
 *   e_p       = osp_vexp16(s_p - mx) (vexp.h); sum = 16 lanes, lane (p - p0) % 16 adding its e_p in
 *             increasing p, then _mm512_reduce_add_ps's fixed tree;
 *   o[d]      = from 0, fma(e_p, V_p[d], o[d]) for p increasing; then o[d] * (1 / sum).
 * FMAs halve the score and V sums' vector operations and the exp is ~16x cheaper than glibc's expf. */
/* kb: the block's 16 K rows, row i at kb + i D. Inlined with a constant D (64, 128) the row offsets are
 * immediates. */
static inline __attribute__((always_inline)) __m512 dot16_keys_fma(const float *q, const float *kb, int64_t D) {
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
        const __m512 qv = _mm512_loadu_ps(q + d);
        for (int i = 0; i < 16; i++) acc[i] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kb + i * D + d), acc[i]);
    }
    __m512 c[8], e[4], f[2];
    for (int i = 0; i < 8; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(acc[2 * i], acc[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; i++)
        e[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; i++)
        f[i] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(e[2 * i], e[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(idx, r);
}

/* lanes [a, b) of 16 (0 <= a <= b <= 16) */
static inline __mmask16 lanes_between(int64_t a, int64_t b) {
    return (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u));
}

/* o[0..63] of items (one or two: n) += e_p V_p over keys [a, b) of the block, chains in increasing p */
static inline void v_sum64(float *const *o, const float *const *w, int n, const float *const *rp, int64_t pb,
                           int64_t a, int64_t b, int64_t d0) {
    if (n == 2) {
        __m512 x0 = _mm512_loadu_ps(o[0] + d0), x1 = _mm512_loadu_ps(o[0] + d0 + 16),
               x2 = _mm512_loadu_ps(o[0] + d0 + 32), x3 = _mm512_loadu_ps(o[0] + d0 + 48);
        __m512 y0 = _mm512_loadu_ps(o[1] + d0), y1 = _mm512_loadu_ps(o[1] + d0 + 16),
               y2 = _mm512_loadu_ps(o[1] + d0 + 32), y3 = _mm512_loadu_ps(o[1] + d0 + 48);
        for (int64_t p = a; p < b; p++) {
            const float *vr = rp[p - pb] + d0;
            const __m512 v0 = _mm512_loadu_ps(vr), v1 = _mm512_loadu_ps(vr + 16), v2 = _mm512_loadu_ps(vr + 32),
                         v3 = _mm512_loadu_ps(vr + 48);
            const __m512 wx = _mm512_set1_ps(w[0][p]), wy = _mm512_set1_ps(w[1][p]);
            x0 = _mm512_fmadd_ps(wx, v0, x0), x1 = _mm512_fmadd_ps(wx, v1, x1);
            x2 = _mm512_fmadd_ps(wx, v2, x2), x3 = _mm512_fmadd_ps(wx, v3, x3);
            y0 = _mm512_fmadd_ps(wy, v0, y0), y1 = _mm512_fmadd_ps(wy, v1, y1);
            y2 = _mm512_fmadd_ps(wy, v2, y2), y3 = _mm512_fmadd_ps(wy, v3, y3);
        }
        _mm512_storeu_ps(o[0] + d0, x0), _mm512_storeu_ps(o[0] + d0 + 16, x1);
        _mm512_storeu_ps(o[0] + d0 + 32, x2), _mm512_storeu_ps(o[0] + d0 + 48, x3);
        _mm512_storeu_ps(o[1] + d0, y0), _mm512_storeu_ps(o[1] + d0 + 16, y1);
        _mm512_storeu_ps(o[1] + d0 + 32, y2), _mm512_storeu_ps(o[1] + d0 + 48, y3);
        return;
    }
    __m512 x0 = _mm512_loadu_ps(o[0] + d0), x1 = _mm512_loadu_ps(o[0] + d0 + 16),
           x2 = _mm512_loadu_ps(o[0] + d0 + 32), x3 = _mm512_loadu_ps(o[0] + d0 + 48);
    for (int64_t p = a; p < b; p++) {
        const float *vr = rp[p - pb] + d0;
        const __m512 wx = _mm512_set1_ps(w[0][p]);
        x0 = _mm512_fmadd_ps(wx, _mm512_loadu_ps(vr), x0), x1 = _mm512_fmadd_ps(wx, _mm512_loadu_ps(vr + 16), x1);
        x2 = _mm512_fmadd_ps(wx, _mm512_loadu_ps(vr + 32), x2), x3 = _mm512_fmadd_ps(wx, _mm512_loadu_ps(vr + 48), x3);
    }
    _mm512_storeu_ps(o[0] + d0, x0), _mm512_storeu_ps(o[0] + d0 + 16, x1);
    _mm512_storeu_ps(o[0] + d0 + 32, x2), _mm512_storeu_ps(o[0] + d0 + 48, x3);
}

/* K (which 0) or V (1) row of key p into row (D floats, D % 16 == 0): f16 pages widened here 16 at a time
 * (the same exact conversion as osp_cpu_f16_to_f32_row, without a call per row), other types by read_row
 * (f32 pages copied). */
static inline void load_row_q8(const osp_cpu_kv_pages *kv, int which, const int32_t *bt, int32_t block_size,
                               int64_t p, int64_t kvh, int64_t n_head_kv, int64_t D, float *row, uint16_t *half,
                               bool full) {
    const int64_t slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
    if ((which ? kv->v_type : kv->k_type) == OSP_DTYPE_F16) {
        const uint16_t *h = (const uint16_t *)(which ? kv->v : kv->k) + (slot * n_head_kv + kvh) * D;
        for (int64_t d = 0; d < D; d += 16)
            _mm512_storeu_ps(row + d, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(h + d))));
        return;
    }
    const float *r = read_row(kv, which, slot, kvh, n_head_kv, D, row, half, full);
    if (r != row) memcpy(row, r, (size_t)D * sizeof(float));
}

/* attend_tile_blocked's structure (blocks of 16 keys, each K and V row widened once per tile) with the
 * q8 mode's arithmetic above. */
static void attend_tile_blocked_q8(const attn_tile *tl, const osp_cpu_kv_pages *kv, const int32_t *bt,
                                   int32_t block_size, int64_t kvh, int64_t n_head_kv, int64_t head_dim, float scale,
                                   float *sc, int64_t sc_stride, uint16_t *half, int64_t lo, int64_t hi,
                                   int64_t full_from) {
    const int64_t m = tl->m, D = head_dim;
    float buf[ATTN_KBLK * ATTN_KBLK_MAX_D];
    const float *rp[ATTN_KBLK];
    __m512 mxv[OSP_CPU_ATTN_MAX_TILE];
    float sum[OSP_CPU_ATTN_MAX_TILE];
    const __m512 vscale = _mm512_set1_ps(scale);
    for (int64_t j = 0; j < m; j++) mxv[j] = _mm512_set1_ps(-INFINITY);
    for (int64_t pb = lo; pb < hi; pb += ATTN_KBLK) {
        const int64_t nb = hi - pb < ATTN_KBLK ? hi - pb : ATTN_KBLK;
        /* the next block's K rows, or (the last block) the first V rows */
        prefetch_block(kv, pb + ATTN_KBLK >= hi, bt, block_size, pb + ATTN_KBLK < hi ? pb + ATTN_KBLK : lo, hi, kvh,
                       n_head_kv, D);
        for (int64_t i = 0; i < nb; i++) /* every row in buf */
            load_row_q8(kv, 0, bt, block_size, pb + i, kvh, n_head_kv, D, buf + i * D, half, pb + i >= full_from);
        if (nb < ATTN_KBLK) /* scores computed, never used */
            memset(buf + nb * D, 0, (size_t)((ATTN_KBLK - nb) * D) * sizeof(float));
        for (int64_t j = 0; j < m; j++) {
            const int64_t a = pb > tl->p0s[j] ? pb : tl->p0s[j], b = pb + nb < tl->n_ctxs[j] ? pb + nb : tl->n_ctxs[j];
            if (a >= b) continue;
            const __mmask16 mk = lanes_between(a - pb, b - pb);
            const __m512 dots = D == 64    ? dot16_keys_fma(tl->qs[j], buf, 64)
                                : D == 128 ? dot16_keys_fma(tl->qs[j], buf, 128)
                                           : dot16_keys_fma(tl->qs[j], buf, D);
            const __m512 s = _mm512_mul_ps(dots, vscale);
            _mm512_mask_storeu_ps(sc + j * sc_stride + pb, mk, s);
            mxv[j] = _mm512_mask_max_ps(mxv[j], mk, mxv[j], s);
        }
    }
    for (int64_t j = 0; j < m; j++) {
        float *scj = sc + j * sc_stride;
        const __m512 mj = _mm512_set1_ps(_mm512_reduce_max_ps(mxv[j]));
        __m512 acc = _mm512_setzero_ps();
        for (int64_t p = tl->p0s[j]; p < tl->n_ctxs[j]; p += 16) {
            const __mmask16 mk = tl->n_ctxs[j] - p >= 16 ? (__mmask16)0xFFFF : lanes_between(0, tl->n_ctxs[j] - p);
            const __m512 e = osp_vexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, scj + p), mj));
            _mm512_mask_storeu_ps(scj + p, mk, e);
            acc = _mm512_mask_add_ps(acc, mk, acc, e);
        }
        sum[j] = _mm512_reduce_add_ps(acc);
        memset(tl->os[j], 0, (size_t)D * sizeof(float));
    }
    for (int64_t pb = lo; pb < hi; pb += ATTN_KBLK) {
        const int64_t nb = hi - pb < ATTN_KBLK ? hi - pb : ATTN_KBLK;
        prefetch_block(kv, 1, bt, block_size, pb + ATTN_KBLK, hi, kvh, n_head_kv, D);
        for (int64_t i = 0; i < nb; i++) {
            load_row_q8(kv, 1, bt, block_size, pb + i, kvh, n_head_kv, D, buf + i * D, half, pb + i >= full_from);
            rp[i] = buf + i * D;
        }
        for (int64_t j = 0; j < m;) {
            const int64_t a = pb > tl->p0s[j] ? pb : tl->p0s[j], b = pb + nb < tl->n_ctxs[j] ? pb + nb : tl->n_ctxs[j];
            if (a >= b) {
                j++;
                continue;
            }
            /* two items with the same keys in this block share the V loads (each keeps its own chains) */
            int n = 1;
            if (j + 1 < m) {
                const int64_t a1 = pb > tl->p0s[j + 1] ? pb : tl->p0s[j + 1],
                              b1 = pb + nb < tl->n_ctxs[j + 1] ? pb + nb : tl->n_ctxs[j + 1];
                if (a1 == a && b1 == b) n = 2;
            }
            float *os[2] = {tl->os[j], n == 2 ? tl->os[j + 1] : NULL};
            const float *ws[2] = {sc + j * sc_stride, n == 2 ? sc + (j + 1) * sc_stride : NULL};
            int64_t d0 = 0;
            for (; d0 + 64 <= D; d0 += 64) v_sum64(os, ws, n, rp, pb, a, b, d0);
            for (; d0 < D; d0 += 16) /* head_dim 16, 32, 48, 80, 96, 112: the rest, 16 at a time */
                for (int u = 0; u < n; u++) {
                    __m512 a0 = _mm512_loadu_ps(os[u] + d0);
                    for (int64_t p = a; p < b; p++)
                        a0 = _mm512_fmadd_ps(_mm512_set1_ps(ws[u][p]), _mm512_loadu_ps(rp[p - pb] + d0), a0);
                    _mm512_storeu_ps(os[u] + d0, a0);
                }
            j += n;
        }
    }
    for (int64_t j = 0; j < m; j++) {
        const float inv = 1.0f / sum[j];
        float *oj = tl->os[j];
        for (int64_t d = 0; d < D; d++) oj[d] *= inv;
    }
}
#endif

static void attend_tile(const attn_tile *tl, const osp_cpu_kv_pages *kv, const int32_t *bt, int32_t block_size,
                        int64_t kvh, int64_t n_head_kv, int64_t head_dim, float scale, float *sc, int64_t sc_stride,
                        float *row, uint16_t *half) {
    const int64_t m = tl->m;
    int64_t lo = tl->p0s[0], hi = tl->n_ctxs[0];
    for (int64_t j = 1; j < m; j++) {
        if (tl->p0s[j] < lo) lo = tl->p0s[j];
        if (tl->n_ctxs[j] > hi) hi = tl->n_ctxs[j];
    }
    /* int8_hier: keys from full_from on are read with both halves (all of them unless the draft's view);
     * a tile's items share one n_ctx but a query block's (never a draft's), where the latest one counts */
    const int64_t full_from = kv->hier_upper_only ? hi - kv->hier_full_recent : 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    if (head_dim % 16 == 0 && head_dim <= ATTN_KBLK_MAX_D && kv->q8_arith) {
        attend_tile_blocked_q8(tl, kv, bt, block_size, kvh, n_head_kv, head_dim, scale, sc, sc_stride, half, lo, hi,
                               full_from);
        return;
    }
    if (head_dim % 16 == 0 && head_dim <= ATTN_KBLK_MAX_D) {
        attend_tile_blocked(tl, kv, bt, block_size, kvh, n_head_kv, head_dim, scale, sc, sc_stride, half, lo, hi,
                            full_from);
        return;
    }
#endif
    float mx[OSP_CPU_ATTN_MAX_TILE] = {0}, sum[OSP_CPU_ATTN_MAX_TILE] = {0};
    for (int64_t j = 0; j < m; j++) mx[j] = -INFINITY;
    for (int64_t p = lo; p < hi; p++) {
        const int64_t slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
        const float *kr = read_row(kv, 0, slot, kvh, n_head_kv, head_dim, row, half, p >= full_from);
        for (int64_t j = 0; j < m; j++) {
            if (p < tl->p0s[j] || p >= tl->n_ctxs[j]) continue;
            float *scj = sc + j * sc_stride;
            scj[p] = osp_cpu_dot_inline(tl->qs[j], kr, head_dim) * scale;
            if (scj[p] > mx[j]) mx[j] = scj[p];
        }
    }
    for (int64_t j = 0; j < m; j++) {
        float *scj = sc + j * sc_stride;
        sum[j] = 0.0f;
        for (int64_t p = tl->p0s[j]; p < tl->n_ctxs[j]; p++) {
            scj[p] = kv->q8_arith ? osp_vexp_scalar(scj[p] - mx[j]) : expf(scj[p] - mx[j]); /* vexp.h */
            sum[j] += scj[p];
        }
        memset(tl->os[j], 0, (size_t)head_dim * sizeof(float));
    }
    for (int64_t p = lo; p < hi; p++) {
        const int64_t slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
        const float *vp = read_row(kv, 1, slot, kvh, n_head_kv, head_dim, row, half, p >= full_from);
        for (int64_t j = 0; j < m; j++) {
            if (p < tl->p0s[j] || p >= tl->n_ctxs[j]) continue;
            const float w = sc[j * sc_stride + p];
            float *oj = tl->os[j];
            for (int64_t d = 0; d < head_dim; d++) oj[d] += w * vp[d];
        }
    }
    for (int64_t j = 0; j < m; j++) {
        const float inv = 1.0f / sum[j];
        float *oj = tl->os[j];
        for (int64_t d = 0; d < head_dim; d++) oj[d] *= inv;
    }
}

/* Items (t, h), h fastest. Where whole tokens of one sequence lie in the range, a block of up to
 * max_tile / group consecutive tokens is done one KV head at a time, all of that head's group at all the
 * block's tokens in one tile (a query block against the keys: each K and V row read once for them all);
 * elsewhere (a range's cut tokens, groups wider than a tile) the tile is the heads of one group at one
 * token, at most max_tile. */
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
    attn_tile tl;
    for (int64_t item = item_begin; item < item_end;) {
        const int64_t t = item / n_head, h0 = item % n_head;
        while (s < num_seqs - 1 && t >= query_start_loc[s + 1]) s++;
        while (s > 0 && t < query_start_loc[s]) s--;
        const int32_t *bt = block_table + (size_t)s * max_blocks;
        /* whole tokens of this sequence from t on, inside the range, as many as a tile holds groups of */
        int64_t nt = 0;
        if (h0 == 0)
            while (nt < max_tile / group && (t + nt + 1) * n_head <= item_end && t + nt < query_start_loc[s + 1]) nt++;
        if (nt >= 2) {
            for (int64_t kvh = 0; kvh < n_head_kv; kvh++) {
                tl.m = nt * group;
                for (int64_t u = 0; u < nt; u++) {
                    const int64_t n_ctx = (int64_t)positions[t + u] + 1;
                    for (int64_t g = 0; g < group; g++) {
                        const int64_t j = u * group + g, it = (t + u) * n_head + kvh * group + g;
                        tl.qs[j] = q + it * head_dim;
                        tl.os[j] = out + it * head_dim;
                        tl.n_ctxs[j] = n_ctx;
                        tl.p0s[j] = window > 0 && n_ctx > window ? n_ctx - window : 0; /* sliding window */
                    }
                }
                attend_tile(&tl, kv, bt, block_size, kvh, n_head_kv, head_dim, scale, sc, sc_stride, row, half);
            }
            item = (t + nt) * n_head;
            continue;
        }
        /* heads h0.. of h0's group at token t, inside the range, at most max_tile */
        const int64_t kvh = h0 / group, group_end = (kvh + 1) * group;
        int64_t m = group_end - h0;
        if (m > item_end - item) m = item_end - item;
        if (m > max_tile) m = max_tile;
        const int64_t n_ctx = (int64_t)positions[t] + 1;
        tl.m = m;
        for (int64_t j = 0; j < m; j++) {
            tl.qs[j] = q + (item + j) * head_dim;
            tl.os[j] = out + (item + j) * head_dim;
            tl.n_ctxs[j] = n_ctx;
            tl.p0s[j] = window > 0 && n_ctx > window ? n_ctx - window : 0;
        }
        attend_tile(&tl, kv, bt, block_size, kvh, n_head_kv, head_dim, scale, sc, sc_stride, row, half);
        item += m;
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
    return read_row(kv, which, slot, kvh, n_head_kv, head_dim, row, half, !kv->hier_upper_only);
}
