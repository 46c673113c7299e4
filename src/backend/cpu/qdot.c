/* Quantized-activation dot products (see qdot.h): portable reference, AVX2 and AVX512-VNNI.
 *
 * Block algebra (weights w, activations a ~ d_a * q_a, per block of 32):
 *   Q8_0: w = d_w * q_w          -> d_w d_a sum(q_w q_a)
 *   Q4_0: w = d_w * (q_w - 8)    -> d_w d_a sum(q_w q_a) - 8 d_w s_a       (q_w in 0..15)
 *   Q4_1: w = d_w * q_w + m_w    -> d_w d_a sum(q_w q_a) + m_w s_a
 *   Q5_0, Q5_1: as Q4_0 (offset 16) and Q4_1 with a fifth bit per code
 * with s_a = d_a sum(q_a); the K-quants (super-blocks of 256 with sub-block scales) are described
 * above their reference kernels. The integer sums are exact; x86 has an unsigned x signed byte product
 * (vpmaddubsw, vpdpbusd), which the 4-bit weights fit directly; for Q8_0 the sign of w is moved onto
 * a (|w| * sign(a, w)), as ggml does. Layouts of the weight blocks: ggml-common.h. */
#include "backend/cpu/qdot.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "core/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define OSP_X86 1
#endif

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return osp_fp16_to_fp32(h);
}

/* ---- activation quantization ------------------------------------------------------------------- */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
/* One block of 32 values on AVX512 (false, nothing written, if one is not finite), the scalar loop's
 * arithmetic value for value (amax exact in any order, x * id and
 * r * id2 rounded to nearest even by the conversion, r = x - d q as a multiply then a subtract);
 * the integer sums are exact in any order. */
static bool quantize_block_avx512(const float *xb, osp_q8_block *y) {
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    /* non-finite lanes: x - x is NaN exactly for NaN and +-inf */
    const __mmask16 bad = _mm512_cmp_ps_mask(_mm512_sub_ps(v0, v0), _mm512_sub_ps(v0, v0), _CMP_UNORD_Q) |
                          _mm512_cmp_ps_mask(_mm512_sub_ps(v1, v1), _mm512_sub_ps(v1, v1), _CMP_UNORD_Q);
    if (bad) return false; /* the scalar path's NaN block */
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
    const float d2 = d * (1.0f / 256.0f), id2 = d != 0.0f ? 256.0f / d : 0.0f;
    int sum = 0, sum2 = 0, sum0 = 0, sum20 = 0;
    for (int h = 0; h < 2; h++) {
        const __m512 v = _mm512_loadu_ps(xb + 16 * h);
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(id)));
        const __m512 r = _mm512_sub_ps(v, _mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(q)));
        __m512i q2 = _mm512_cvtps_epi32(_mm512_mul_ps(r, _mm512_set1_ps(id2)));
        q2 = _mm512_max_epi32(_mm512_min_epi32(q2, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
        _mm_storeu_si128((__m128i *)(void *)(y->qs + 16 * h), _mm512_cvtepi32_epi8(q));
        _mm_storeu_si128((__m128i *)(void *)(y->qs2 + 16 * h), _mm512_cvtepi32_epi8(q2));
        const int s1 = _mm512_reduce_add_epi32(q), s2 = _mm512_reduce_add_epi32(q2);
        if (h == 0) sum0 = s1, sum20 = s2;
        sum += s1, sum2 += s2;
    }
    y->d = d;
    y->d2 = d2;
    y->s = d * (float)sum + d2 * (float)sum2;
    y->s0 = d * (float)sum0 + d2 * (float)sum20;
    return true;
}
#endif

void osp_quantize_row_q8(const float *restrict x, osp_q8_block *restrict y, int64_t n) {
    for (int64_t b = 0; b < n / OSP_Q8_BLOCK; b++) {
        const float *xb = x + b * OSP_Q8_BLOCK;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
        if (quantize_block_avx512(xb, &y[b])) continue;
#endif
        float amax = 0.0f;
        bool finite = true;
        for (int i = 0; i < OSP_Q8_BLOCK; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            finite = finite && isfinite(xb[i]);
        }
        if (!finite) { /* NaN/inf activations stay non-finite (a NaN scale), never UB in the casts */
            memset(y[b].qs, 0, sizeof y[b].qs);
            memset(y[b].qs2, 0, sizeof y[b].qs2);
            y[b].d = y[b].d2 = y[b].s = y[b].s0 = NAN;
            continue;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
        const float d2 = d * (1.0f / 256.0f), id2 = d != 0.0f ? 256.0f / d : 0.0f; /* d = 256 d2 exactly */
        int sum = 0, sum2 = 0, sum0 = 0, sum20 = 0;
        for (int i = 0; i < OSP_Q8_BLOCK; i++) {
            if (i == OSP_Q8_BLOCK / 2) sum0 = sum, sum20 = sum2;
            const int q = (int)nearbyintf(xb[i] * id);
            const float r = xb[i] - d * (float)q;
            int q2 = (int)nearbyintf(r * id2);
            q2 = q2 > 127 ? 127 : q2 < -127 ? -127 : q2;
            y[b].qs[i] = (int8_t)q;
            y[b].qs2[i] = (int8_t)q2;
            sum += q;
            sum2 += q2;
        }
        y[b].d = d;
        y[b].d2 = d2;
        y[b].s = d * (float)sum + d2 * (float)sum2;
        y[b].s0 = d * (float)sum0 + d2 * (float)sum20;
    }
}

/* ---- portable reference kernels ---------------------------------------------------------------- */

static float dot_q8_0_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, p += 34) {
        const int8_t *q = (const int8_t *)(p + 2);
        int isum = 0, isum2 = 0;
        for (int i = 0; i < 32; i++) isum += q[i] * a[b].qs[i], isum2 += q[i] * a[b].qs2[i];
        acc += half_at(p) * (a[b].d * (float)isum + a[b].d2 * (float)isum2);
    }
    return acc;
}

static float dot_q4_0_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, p += 18) {
        const uint8_t *q = p + 2;
        int isum = 0, isum2 = 0;
        for (int i = 0; i < 16; i++) {
            isum += (q[i] & 0x0f) * a[b].qs[i] + (q[i] >> 4) * a[b].qs[i + 16];
            isum2 += (q[i] & 0x0f) * a[b].qs2[i] + (q[i] >> 4) * a[b].qs2[i + 16];
        }
        const float dw = half_at(p);
        acc += dw * (a[b].d * (float)isum + a[b].d2 * (float)isum2) - 8.0f * dw * a[b].s;
    }
    return acc;
}

static float dot_q4_1_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, p += 20) {
        const uint8_t *q = p + 4;
        int isum = 0, isum2 = 0;
        for (int i = 0; i < 16; i++) {
            isum += (q[i] & 0x0f) * a[b].qs[i] + (q[i] >> 4) * a[b].qs[i + 16];
            isum2 += (q[i] & 0x0f) * a[b].qs2[i] + (q[i] >> 4) * a[b].qs2[i + 16];
        }
        acc += half_at(p) * (a[b].d * (float)isum + a[b].d2 * (float)isum2) + half_at(p + 2) * a[b].s;
    }
    return acc;
}

/* Q5_0 / Q5_1: the Q4 nibbles plus a fifth bit, bit j of the little-endian u32 qh for value j. */
static inline int q5_at(const uint8_t *qs, uint32_t qh, int i) {
    return i < 16 ? (qs[i] & 0x0f) | (int)((qh >> i) & 1u) << 4 : (qs[i - 16] >> 4) | (int)((qh >> i) & 1u) << 4;
}

static float dot_q5_0_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, p += 22) {
        uint32_t qh;
        memcpy(&qh, p + 2, 4);
        int isum = 0, isum2 = 0;
        for (int i = 0; i < 32; i++) {
            const int q = q5_at(p + 6, qh, i);
            isum += q * a[b].qs[i];
            isum2 += q * a[b].qs2[i];
        }
        const float dw = half_at(p);
        acc += dw * (a[b].d * (float)isum + a[b].d2 * (float)isum2) - 16.0f * dw * a[b].s;
    }
    return acc;
}

static float dot_q5_1_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++, p += 24) {
        uint32_t qh;
        memcpy(&qh, p + 4, 4);
        int isum = 0, isum2 = 0;
        for (int i = 0; i < 32; i++) {
            const int q = q5_at(p + 8, qh, i);
            isum += q * a[b].qs[i];
            isum2 += q * a[b].qs2[i];
        }
        acc += half_at(p) * (a[b].d * (float)isum + a[b].d2 * (float)isum2) + half_at(p + 2) * a[b].s;
    }
    return acc;
}

/* K-quants: a super-block of 256 values meets activation blocks 8 sb .. 8 sb + 7; nb is in blocks of
 * 32, so a row has nb / 8 super-blocks. With sub-block scale sc (and min m) and super-block d, dmin:
 *   Q4_K, Q5_K (sub-blocks of 32): w = d sc q - dmin m  -> d sc (d_a I + d2_a I2) - dmin m s_a
 *   Q6_K (16): w = d sc (q - 32); Q3_K (16): w = d sc (q' - 4) with q' = q + 4 in 0..7;
 *   Q2_K (16): w = d sc q - dmin m
 * For 16-value sub-blocks an activation block holds two scales: the integer sums are taken per half
 * and the offsets use the half sums s0 and s - s0. */

/* Q4_K/Q5_K's eight 6-bit scales and mins from their 12 packed bytes (layout: core/dtype.c). */
static inline void k4_scales(const uint8_t *p, uint8_t *sc, uint8_t *m) {
    for (int j = 0; j < 4; j++) {
        sc[j] = p[j] & 63;
        m[j] = p[j + 4] & 63;
        sc[j + 4] = (uint8_t)((p[j + 8] & 0x0f) | (p[j] >> 6) << 4);
        m[j + 4] = (uint8_t)((p[j + 8] >> 4) | (p[j + 4] >> 6) << 4);
    }
}

/* Q3_K's sixteen 6-bit scales (stored + 32) from their 12 packed bytes, as signed values. */
static inline void k3_scales(const uint8_t *p, int8_t *sc) {
    for (int k = 0; k < 16; k++) {
        const int lo = k < 8 ? p[k] & 0x0f : p[k - 8] >> 4;
        const int hi = (p[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
        sc[k] = (int8_t)((lo | hi << 4) - 32);
    }
}

/* One activation block against 32 weight codes q (0..255) with scales sc0 (values 0..15) and sc1
 * (16..31): d_a (sc0 I_lo + sc1 I_hi) + d2_a (same on the second level). */
static inline float block16_ref(const uint8_t *q, int sc0, int sc1, const osp_q8_block *blk) {
    int i0 = 0, i1 = 0, j0 = 0, j1 = 0;
    for (int l = 0; l < 16; l++) {
        i0 += q[l] * blk->qs[l], j0 += q[l] * blk->qs2[l];
        i1 += q[l + 16] * blk->qs[l + 16], j1 += q[l + 16] * blk->qs2[l + 16];
    }
    return blk->d * (float)(sc0 * i0 + sc1 * i1) + blk->d2 * (float)(sc0 * j0 + sc1 * j1);
}

/* The same with one scale for the whole block: d_a I + d2_a I2. */
static inline float block32_ref(const uint8_t *q, const osp_q8_block *blk) {
    int i0 = 0, j0 = 0;
    for (int l = 0; l < 32; l++) i0 += q[l] * blk->qs[l], j0 += q[l] * blk->qs2[l];
    return blk->d * (float)i0 + blk->d2 * (float)j0;
}

/* sc0 s0 + sc1 (s - s0): an offset weighted per 16-value half. */
static inline float halves(int sc0, int sc1, const osp_q8_block *blk) {
    const float h0 = (float)sc0 * blk->s0; /* separate statements: no FMA contraction, so the pair */
    const float s1 = blk->s - blk->s0;     /* tiles' lane-wise vector form gives the same bits */
    const float h1 = (float)sc1 * s1;
    return h0 + h1;
}

/* sum_j halves(sc[2j], sc[2j+1], a + j) over a super-block's eight activation blocks, summed as a
 * tree: one serial chain of eight float adds would cost more than the integer work of a super-block. */
static inline float halves8(const int8_t *sc, const osp_q8_block *a) {
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = halves(sc[2 * j], sc[2 * j + 1], a + j);
    const float u0 = t[0] + t[1], u1 = t[2] + t[3], u2 = t[4] + t[5], u3 = t[6] + t[7];
    const float v0 = u0 + u1, v1 = u2 + u3;
    return v0 + v1;
}

static float dot_q4_k_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 144, a += 8) {
        const float d = half_at(p), dmin = half_at(p + 2);
        uint8_t sc[8], m[8], q[32];
        k4_scales(p + 4, sc, m);
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++) q[l] = (p[16 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0f;
            acc += d * (float)sc[j] * block32_ref(q, a + j) - dmin * (float)m[j] * a[j].s;
        }
    }
    return acc;
}

static float dot_q5_k_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 176, a += 8) {
        const float d = half_at(p), dmin = half_at(p + 2);
        uint8_t sc[8], m[8], q[32];
        k4_scales(p + 4, sc, m);
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(((p[48 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0f) | ((p[16 + l] >> j) & 1) << 4);
            acc += d * (float)sc[j] * block32_ref(q, a + j) - dmin * (float)m[j] * a[j].s;
        }
    }
    return acc;
}

static float dot_q6_k_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 210, a += 8) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        const float d = half_at(p + 208);
        uint8_t q[32];
        for (int j = 0; j < 8; j++) { /* j = 4h + s */
            const int h = j / 4, s = j % 4;
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(((ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0x0f) |
                                 ((qh[32 * h + l] >> (2 * s)) & 3) << 4);
            acc += d * (block16_ref(q, sc[2 * j], sc[2 * j + 1], a + j) -
                        32.0f * halves(sc[2 * j], sc[2 * j + 1], a + j));
        }
    }
    return acc;
}

static float dot_q3_k_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 110, a += 8) {
        const uint8_t *hm = p, *qs = p + 32;
        const float d = half_at(p + 108);
        int8_t sc[16];
        uint8_t q[32];
        k3_scales(p + 96, sc);
        for (int j = 0; j < 8; j++) { /* j = 4h + s */
            const int h = j / 4, s = j % 4;
            for (int l = 0; l < 32; l++)
                q[l] = (uint8_t)(((qs[32 * h + l] >> (2 * s)) & 3) | ((hm[l] >> j) & 1) << 2);
            acc += d * (block16_ref(q, sc[2 * j], sc[2 * j + 1], a + j) -
                        4.0f * halves(sc[2 * j], sc[2 * j + 1], a + j));
        }
    }
    return acc;
}

static float dot_q2_k_ref(const void *w, const osp_q8_block *a, int64_t nb) {
    const uint8_t *p = w;
    float acc = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 84, a += 8) {
        const uint8_t *sc = p, *qs = p + 16;
        const float d = half_at(p + 80), dmin = half_at(p + 82);
        uint8_t q[32];
        for (int j = 0; j < 8; j++) {
            const int h = j / 4, s = j % 4;
            for (int l = 0; l < 32; l++) q[l] = (qs[32 * h + l] >> (2 * s)) & 3;
            acc += d * block16_ref(q, sc[2 * j] & 0x0f, sc[2 * j + 1] & 0x0f, a + j) -
                   dmin * halves(sc[2 * j] >> 4, sc[2 * j + 1] >> 4, a + j);
        }
    }
    return acc;
}

/* ---- AVX2 / AVX512-VNNI ------------------------------------------------------------------------ */

#ifdef OSP_X86
#define TGT_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TGT_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

TGT_AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TGT_AVX2 static inline float half_f16c(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 packed nibble bytes -> 32 bytes: low nibbles (elements 0..15) then high nibbles (16..31). */
TGT_AVX2 static inline __m256i unpack_nibbles(const uint8_t *q) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)q);
    const __m128i lo = _mm_and_si128(raw, _mm_set1_epi8(0x0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0f));
    return _mm256_set_m128i(hi, lo);
}

TGT_AVX2 static inline __m256i dot_u8s8_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

TGT_VNNI static inline __m256i dot_u8s8_vnni(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

/* Both activation levels against the same unsigned bytes u, combined exactly in int32:
 * 256 dot(u, s1) + dot(u, s2) per lane (4 products a lane; |lane| <= 4 * 255 * 127, so the sum stays
 * far inside int32). With d = 256 d2 exactly (osp_quantize_row_q8), d dot1 + d2 dot2 = d2 * this. */
TGT_AVX2 static inline __m256i dot2_avx2(__m256i u, __m256i s1, __m256i s2) {
    return _mm256_add_epi32(_mm256_slli_epi32(dot_u8s8_avx2(u, s1), 8), dot_u8s8_avx2(u, s2));
}

TGT_VNNI static inline __m256i dot2_vnni(__m256i u, __m256i s1, __m256i s2) {
    return _mm256_dpbusd_epi32(_mm256_slli_epi32(dot_u8s8_vnni(u, s1), 8), u, s2);
}

/* Block b adds dw * d2 * (256 dot(qw, qs) + dot(qw, qs2)) (qw unsigned bytes; DOT is dot2_*): one
 * conversion and one FMA for both levels. Even and odd blocks go to separate accumulators, so
 * consecutive FMAs of a token do not wait on each other's 4-cycle latency. */
#define LEVEL(acc, qw, blk, dw, DOT)                                                               \
    acc = _mm256_fmadd_ps(                                                                         \
        _mm256_cvtepi32_ps(DOT(qw, _mm256_loadu_si256((const __m256i *)(const void *)(blk)->qs),   \
                               _mm256_loadu_si256((const __m256i *)(const void *)(blk)->qs2))),    \
        _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_broadcast_ss(&(blk)->d2)), acc)

/* ---- kernels over NT tokens at once (a GEMM tile: one weight row by NT tokens) ----
 * Each kernel computes y[j * ys] = dot(w, a + j * as, nb) for j < NT: a weight block is loaded and
 * unpacked once and multiplied by NT tokens' activation blocks, so a prompt or a batched decode step
 * unpacks every weight block once per NT tokens instead of once per token. Every token keeps its own
 * four accumulators and offset sum and sees exactly the operations, in exactly the order, of the
 * one-token kernel -- which is the NT = 1 instance of the same macro -- so a token's result never
 * depends on how many tokens share its tile (batch invariance holds by construction; test_qdot
 * asserts the bits). The token loops have a constant trip count and unroll completely, keeping the
 * 2 NT accumulators in registers (AVX2 has 16 vector registers: NT = 4). On AVX512-VNNI Q2_K and
 * Q3_K take 4 tokens here, and every other type 8 as 4 token pairs in 512-bit vectors on packed
 * activations (the pair kernels below; measured, bench/cpu/NOTES.md). */
/* every token loop unrolls completely, so the per-token accumulators are registers, not arrays */
#define UNROLL_NT _Pragma("GCC unroll 16")
#define TILE_ARGS                                                                                  \
    const void *w, const osp_q8_block *a, int64_t nb, int64_t as, const osp_q8_pack *pk, float *y, int64_t ys
#define ACC_DECL(NT)                                                                               \
    __m256 A0[NT], A1[NT];                                                                         \
    float OFF[NT];                                                                                 \
    (void)pk; /* these tiles read the rows, not packs */                                           \
    UNROLL_NT for (int j = 0; j < (NT); j++) A0[j] = A1[j] = _mm256_setzero_ps(), OFF[j] = 0.0f
#define ACC_SUM(j) hsum8(_mm256_add_ps(A0[j], A1[j]))
#define ACC_STORE(NT)                                                                              \
    UNROLL_NT for (int j = 0; j < (NT); j++) y[j * ys] = ACC_SUM(j) + OFF[j]

/* The Q4 kernels differ only in block size, where the nibbles start and the offset term. */
#define Q4_KERNEL(NAME, TGT, DOT, BYTES, QOFF, FACTOR, NT)                                    \
    TGT static void NAME(TILE_ARGS) {                                                              \
        const uint8_t *p = w;                                                                      \
        ACC_DECL(NT);                                                                              \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= nb; b += 2, p += 2 * (BYTES)) {                                            \
            const __m256i q0 = unpack_nibbles(p + (QOFF)), q1 = unpack_nibbles(p + (BYTES) + (QOFF)); \
            const float d0 = half_f16c(p), d1 = half_f16c(p + (BYTES));                            \
            UNROLL_NT for (int j = 0; j < (NT); j++) {                                                       \
                const osp_q8_block *aj = a + j * as + b;                                           \
                LEVEL(A0[j], q0, aj, d0, DOT);                                             \
                LEVEL(A1[j], q1, aj + 1, d1, DOT);                                         \
                OFFSET_PAIR(OFF[j], FACTOR(p, d0), aj->s, FACTOR(p + (BYTES), d1), aj[1].s);           \
            }                                                                                      \
        }                                                                                          \
        for (; b < nb; b++, p += (BYTES)) {                                                        \
            const __m256i q0 = unpack_nibbles(p + (QOFF));                                         \
            const float d0 = half_f16c(p);                                                         \
            UNROLL_NT for (int j = 0; j < (NT); j++) {                                                       \
                const osp_q8_block *aj = a + j * as + b;                                           \
                LEVEL(A0[j], q0, aj, d0, DOT);                                             \
                OFFSET_ONE(OFF[j], FACTOR(p, d0), aj->s);                                                  \
            }                                                                                      \
        }                                                                                          \
        ACC_STORE(NT);                                                                             \
    }

/* The offset terms' per-block factors f: the term is f * s_a (Q4_1's minimum m_w, Q4_0's -8 d_w;
 * -8 d_w is exact). Every kernel forms a token's offset sum as OFF + (f0 s0 + f1 s1) over a pair of
 * blocks (OFF + f0 s0 for a last odd block), each product and sum rounded on its own (OFFSET_PAIR:
 * separate statements, so no compiler contracts them into an FMA), which the pair tiles repeat in
 * 8 lanes for 8 tokens at once. */
#define Q4_1_FACTOR(p, dw) half_f16c((p) + 2)
#define Q4_0_FACTOR(p, dw) (-8.0f * (dw))
#define OFFSET_PAIR(off, f0, s0, f1, s1)                                                           \
    do {                                                                                           \
        const float t0_ = (f0) * (s0);                                                             \
        const float t1_ = (f1) * (s1);                                                             \
        const float t_ = t0_ + t1_;                                                                \
        (off) += t_;                                                                               \
    } while (0)
#define OFFSET_ONE(off, f0, s0)                                                                    \
    do {                                                                                           \
        const float t0_ = (f0) * (s0);                                                             \
        (off) += t0_;                                                                              \
    } while (0)

/* ---- Q5 and K-quant kernels ---- */

/* Q5's fifth bits: bit i of the u32 at qh becomes 0x10 in byte i (values 0..31, the unpack_nibbles
 * order). Each byte takes qh's byte i/8 and tests bit i%8. */
TGT_AVX2 static inline __m256i q5_high_bits(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h), _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                     0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

/* 32 unsigned codes against an activation level with two int16 scales (lanes 0..7 for values 0..15,
 * 8..15 for 16..31): 8 int32 sums of scale * code * activation. |code| <= 63 keeps maddubs exact. */
TGT_AVX2 static inline __m256i dot_sc16(__m256i q, const int8_t *qa, __m256i sc) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)(const void *)qa)), sc);
}

/* int16 scales for activation block j from 16 int8 sub-block scales: 2j in the low lane, 2j+1 high.
 * `sel` holds bytes 2j (x8) then 2j+1 (x8). */
TGT_AVX2 static inline __m256i sc16_pair(__m128i sc8, __m128i sel) {
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, sel));
}

/* Block j with per-16 scales: acc += dw d2 (256 first-level + second-level scaled int sums). A lane
 * holds 4 products times a sub-block scale: |lane| <= 4 * 63 * 127 * 128 (Q6_K), so 256 |lane| + |lane|
 * < 2^31: the combination is exact in int32. */
#define LEVEL_SC(acc, qw, scv, blk, dw, SUFFIX)                                                    \
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SC_DOT_##SUFFIX(qw, scv, blk)),                       \
                          _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_broadcast_ss(&(blk)->d2)), acc)

/* The scaled integer sums of LEVEL_SC per family, the same int32 in every lane:
 * sc (256 S1 + S2) = 256 (sc S1) + sc S2 exactly (the bound above), S1, S2 the lane's 4 products of
 * each level. AVX2 scales the int16 pair sums with vpmaddwd (scv: 16 int16 scales, SC_SEL0 picks
 * bytes 2j x8, 2j+1 x8); AVX512-VNNI forms 256 S1 + S2 with two vpdpbusd (dot2_vnni) and scales the
 * 8 lanes with one vpmulld (scv: 8 int32 scales, bytes 2j x4, 2j+1 x4): 8 operations instead of 12. */
#define SC_SEL0_avx2 _mm_set_epi64x(0x0101010101010101LL, 0)
#define SC_SEL0_vnni _mm_set_epi64x(0, 0x0101010100000000LL)
#define SC_VEC_avx2(sc8, sel) sc16_pair(sc8, sel)
#define SC_VEC_vnni(sc8, sel) _mm256_cvtepi8_epi32(_mm_shuffle_epi8(sc8, sel))
#define SC_DOT_avx2(qw, scv, blk)                                                                  \
    _mm256_add_epi32(_mm256_slli_epi32(dot_sc16(qw, (blk)->qs, scv), 8), dot_sc16(qw, (blk)->qs2, scv))
#define SC_DOT_vnni(qw, scv, blk)                                                                  \
    _mm256_mullo_epi32(dot2_vnni(qw, _mm256_loadu_si256((const __m256i *)(const void *)(blk)->qs),  \
                                 _mm256_loadu_si256((const __m256i *)(const void *)(blk)->qs2)),    \
                       scv)

#define Q5_0_FACTOR(p, dw) (-16.0f * (dw))
#define Q5_1_FACTOR(p, dw) half_f16c((p) + 2)

/* Q5_0 / Q5_1: nibbles at QOFF, fifth bits at HOFF. */
#define Q5_KERNEL(NAME, TGT, DOT, BYTES, HOFF, QOFF, FACTOR, NT)                              \
    TGT static void NAME(TILE_ARGS) {                                                              \
        const uint8_t *p = w;                                                                      \
        ACC_DECL(NT);                                                                              \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= nb; b += 2, p += 2 * (BYTES)) {                                            \
            const uint8_t *p1 = p + (BYTES);                                                       \
            const __m256i q0 = _mm256_or_si256(unpack_nibbles(p + (QOFF)), q5_high_bits(p + (HOFF))); \
            const __m256i q1 = _mm256_or_si256(unpack_nibbles(p1 + (QOFF)), q5_high_bits(p1 + (HOFF))); \
            const float d0 = half_f16c(p), d1 = half_f16c(p1);                                     \
            UNROLL_NT for (int j = 0; j < (NT); j++) {                                                       \
                const osp_q8_block *aj = a + j * as + b;                                           \
                LEVEL(A0[j], q0, aj, d0, DOT);                                             \
                LEVEL(A1[j], q1, aj + 1, d1, DOT);                                         \
                OFFSET_PAIR(OFF[j], FACTOR(p, d0), aj->s, FACTOR(p1, d1), aj[1].s);                    \
            }                                                                                      \
        }                                                                                          \
        for (; b < nb; b++, p += (BYTES)) {                                                        \
            const __m256i q0 = _mm256_or_si256(unpack_nibbles(p + (QOFF)), q5_high_bits(p + (HOFF))); \
            const float d0 = half_f16c(p);                                                         \
            UNROLL_NT for (int j = 0; j < (NT); j++) {                                                       \
                const osp_q8_block *aj = a + j * as + b;                                           \
                LEVEL(A0[j], q0, aj, d0, DOT);                                             \
                OFFSET_ONE(OFF[j], FACTOR(p, d0), aj->s);                                                  \
            }                                                                                      \
        }                                                                                          \
        ACC_STORE(NT);                                                                             \
    }

/* sum_j m_j s_j over a super-block's eight blocks as a tree, every product and sum rounded on its
 * own (separate statements: no FMA contraction), the order the pair tiles repeat lane-wise. */
static inline float mins8(const uint8_t *m, const osp_q8_block *a) {
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = (float)m[j] * a[j].s;
    const float u0 = t[0] + t[1], u1 = t[2] + t[3], u2 = t[4] + t[5], u3 = t[6] + t[7];
    const float v0 = u0 + u1, v1 = u2 + u3;
    return v0 + v1;
}

/* Q4_K / Q5_K: one scale per activation block, folded into the float factor d sc_j d_a; the mins
 * give -dmin sum_j m_j s_j. Q5_K's fifth bit of value 32j + l is bit j of qh[l]: qh is shifted right
 * by two per pair of blocks and bit 0 (then bit 1) of each byte moved to 0x10. */
#define QK45_KERNEL(NAME, TGT, DOT, BYTES, FIVE, NT)                                               \
    TGT static void NAME(TILE_ARGS) {                                                              \
        const uint8_t *p = w;                                                                      \
        const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);                      \
        ACC_DECL(NT);                                                                              \
        for (int64_t sb = 0; sb < nb / 8; sb++, p += (BYTES)) {                                    \
            const float d = half_f16c(p), dmin = half_f16c(p + 2);                                 \
            uint8_t sc[8], m[8];                                                                   \
            k4_scales(p + 4, sc, m);                                                               \
            const uint8_t *qs = p + ((FIVE) ? 48 : 16);                                            \
            __m256i qh = (FIVE) ? _mm256_loadu_si256((const __m256i *)(const void *)(p + 16))      \
                                : _mm256_setzero_si256();                                          \
            for (int c = 0; c < 4; c++) {                                                          \
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * c)); \
                __m256i lo = _mm256_and_si256(raw, m4);                                            \
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);                      \
                if (FIVE) {                                                                        \
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));     \
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(                                    \
                                                 _mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4)); \
                    qh = _mm256_srli_epi16(qh, 2);                                                 \
                }                                                                                  \
                const float dlo = d * (float)sc[2 * c], dhi = d * (float)sc[2 * c + 1];            \
                UNROLL_NT for (int j = 0; j < (NT); j++) {                                                   \
                    const osp_q8_block *aj = a + j * as + 8 * sb;                                  \
                    LEVEL(A0[j], lo, aj + 2 * c, dlo, DOT);                                \
                    LEVEL(A1[j], hi, aj + 2 * c + 1, dhi, DOT);                            \
                }                                                                                  \
            }                                                                                      \
            UNROLL_NT for (int j = 0; j < (NT); j++) {                                                       \
                const float t_ = dmin * mins8(m, a + j * as + 8 * sb);                             \
                OFF[j] -= t_;                                                                      \
            }                                                                                      \
        }                                                                                          \
        ACC_STORE(NT);                                                                             \
    }

/* Q6_K: per half h, codes of block 4h+s from ql (low/high nibbles of two 32-byte rows) and qh
 * (bits 2s..2s+1 moved to 0x30); the -32 offset per 16-value sub-block uses the half sums. */
#define Q6K_STEP(NT, ACC, q, k, SUFFIX)                                                            \
    do {                                                                                           \
        const __m256i scv = SC_VEC_##SUFFIX(sc8, sel);                                             \
        sel = _mm_add_epi8(sel, two);                                                              \
        UNROLL_NT for (int j = 0; j < (NT); j++)                                                   \
            LEVEL_SC(ACC[j], q, scv, a + j * as + 8 * sb + 4 * h + (k), d, SUFFIX);                \
    } while (0)
#define Q6K_KERNEL(NAME, TGT, SUFFIX, NT)                                                          \
    TGT static void NAME(TILE_ARGS) {                                                              \
        const uint8_t *p = w;                                                                      \
        const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);                   \
        const __m128i sel0 = SC_SEL0_##SUFFIX, two = _mm_set1_epi8(2);           \
        ACC_DECL(NT);                                                                              \
        for (int64_t sb = 0; sb < nb / 8; sb++, p += 210) {                                        \
            const int8_t *sc = (const int8_t *)(p + 192);                                          \
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)sc);                \
            const float d = half_f16c(p + 208);                                                    \
            __m128i sel = sel0;                                                                    \
            for (int h = 0; h < 2; h++) {                                                          \
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)(p + 64 * h)); \
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(p + 64 * h + 32)); \
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(const void *)(p + 128 + 32 * h)); \
                const __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4),                       \
                                                   _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30)); \
                const __m256i q1 = _mm256_or_si256(_mm256_and_si256(l1, m4),                       \
                                                   _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30)); \
                const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), \
                                                   _mm256_and_si256(qh, m30));                     \
                const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), \
                                                   _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30)); \
                Q6K_STEP(NT, A0, q0, 0, SUFFIX);                                                       \
                Q6K_STEP(NT, A1, q1, 1, SUFFIX);                                                       \
                Q6K_STEP(NT, A0, q2, 2, SUFFIX);                                                       \
                Q6K_STEP(NT, A1, q3, 3, SUFFIX);                                                       \
            }                                                                                      \
            UNROLL_NT for (int j = 0; j < (NT); j++) {                                             \
                const float t_ = 32.0f * d * halves8(sc, a + j * as + 8 * sb);                     \
                OFF[j] -= t_;                                                                      \
            }                                                                                      \
        }                                                                                          \
        ACC_STORE(NT);                                                                             \
    }

/* Q2_K / Q3_K: block 4h+s takes bits 2s..2s+1 of qs[32h + l] (Q3_K adds bit 4h+s of hmask[l] as 4);
 * scales per 16 values (Q2_K nibbles, Q3_K decoded 6-bit values minus 32); offsets on the half sums:
 * Q2_K -dmin m, Q3_K -4 d sc. */
#define Q23K_KERNEL(NAME, TGT, SUFFIX, THREE, NT)                                                          \
    TGT static void NAME(TILE_ARGS) {                                                              \
        const uint8_t *p = w;                                                                      \
        const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);                         \
        const __m128i sel0 = SC_SEL0_##SUFFIX, two = _mm_set1_epi8(2);           \
        ACC_DECL(NT);                                                                              \
        for (int64_t sb = 0; sb < nb / 8; sb++, p += (THREE) ? 110 : 84) {                         \
            int8_t sc[16];                                                                         \
            int8_t mn[16];                                                                         \
            float d;                                                                               \
            const uint8_t *qs;                                                                     \
            __m256i hm = _mm256_setzero_si256();                                                   \
            if (THREE) {                                                                           \
                k3_scales(p + 96, sc);                                                             \
                d = half_f16c(p + 108);                                                            \
                qs = p + 32;                                                                       \
                hm = _mm256_loadu_si256((const __m256i *)(const void *)p);                         \
                UNROLL_NT for (int j = 0; j < (NT); j++) { /* product, then subtract: no contraction */ \
                    const float t_ = 4.0f * d * halves8(sc, a + j * as + 8 * sb);                  \
                    OFF[j] -= t_;                                                                  \
                }                                                                                  \
            } else {                                                                               \
                for (int k = 0; k < 16; k++) sc[k] = (int8_t)(p[k] & 0x0f), mn[k] = (int8_t)(p[k] >> 4); \
                d = half_f16c(p + 80);                                                             \
                qs = p + 16;                                                                       \
                UNROLL_NT for (int j = 0; j < (NT); j++) {                                         \
                    const float t_ = half_f16c(p + 82) * halves8(mn, a + j * as + 8 * sb);         \
                    OFF[j] -= t_;                                                                  \
                }                                                                                  \
            }                                                                                      \
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)sc);                \
            __m128i sel = sel0;                                                                    \
            for (int h = 0; h < 2; h++) {                                                          \
                __m256i raw = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * h));    \
                for (int s = 0; s < 4; s++) {                                                      \
                    __m256i q = _mm256_and_si256(raw, m3);                                         \
                    if (THREE) {                                                                   \
                        q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(hm, one), 2));   \
                        hm = _mm256_srli_epi16(hm, 1);                                             \
                    }                                                                              \
                    raw = _mm256_srli_epi16(raw, 2);                                               \
                    const __m256i scv = SC_VEC_##SUFFIX(sc8, sel);                                       \
                    sel = _mm_add_epi8(sel, two);                                                  \
                    UNROLL_NT for (int j = 0; j < (NT); j++) {                                               \
                        const osp_q8_block *blk = a + j * as + 8 * sb + 4 * h + s;                 \
                        if (s & 1)                                                                 \
                            LEVEL_SC(A1[j], q, scv, blk, d, SUFFIX);                               \
                        else                                                                       \
                            LEVEL_SC(A0[j], q, scv, blk, d, SUFFIX);                               \
                    }                                                                              \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        ACC_STORE(NT);                                                                             \
    }

/* Q8_0: |w| against sign(a, w); no offset term (the sum is returned as is, so -0.0 stays -0.0). */
#define Q8_0_KERNEL(NAME, TGT, DOT, NT)                                                            \
    TGT static void NAME(TILE_ARGS) {                                                              \
        const uint8_t *p = w;                                                                      \
        ACC_DECL(NT);                                                                              \
        (void)OFF;                                                                                 \
        for (int64_t b = 0; b < nb; b++, p += 34) {                                                \
            const __m256i qw = _mm256_loadu_si256((const __m256i *)(const void *)(p + 2));          \
            const __m256i aw = _mm256_sign_epi8(qw, qw);                                           \
            const float dw = half_f16c(p);                                                         \
            UNROLL_NT for (int j = 0; j < (NT); j++) {                                                       \
                const osp_q8_block *aj = a + j * as + b;                                           \
                const __m256i qa = _mm256_loadu_si256((const __m256i *)(const void *)aj->qs);       \
                const __m256i qa2 = _mm256_loadu_si256((const __m256i *)(const void *)aj->qs2);     \
                const __m256 s12 =                                                                 \
                    _mm256_cvtepi32_ps(DOT(aw, _mm256_sign_epi8(qa, qw), _mm256_sign_epi8(qa2, qw)));  \
                if (b & 1)                                                                         \
                    A1[j] = _mm256_fmadd_ps(s12, _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_broadcast_ss(&aj->d2)), A1[j]);              \
                else                                                                               \
                    A0[j] = _mm256_fmadd_ps(s12, _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_broadcast_ss(&aj->d2)), A0[j]);              \
            }                                                                                      \
        }                                                                                          \
        UNROLL_NT for (int j = 0; j < (NT); j++) y[j * ys] = ACC_SUM(j);                                     \
    }

/* Every family at NT tokens: tile_<type>_<suffix><NT>; the K-quants alone at KNT (their tiles hold
 * a super-block's decoded scales and codes beside the accumulators). */
#define DEFINE_X86_KTILES(SUFFIX, TGT, DOT, NT)                                                    \
    QK45_KERNEL(tile_q4_k_##SUFFIX##NT, TGT, DOT, 144, 0, NT)                                      \
    QK45_KERNEL(tile_q5_k_##SUFFIX##NT, TGT, DOT, 176, 1, NT)                                      \
    Q6K_KERNEL(tile_q6_k_##SUFFIX##NT, TGT, SUFFIX, NT)                                            \
    Q23K_KERNEL(tile_q2_k_##SUFFIX##NT, TGT, SUFFIX, 0, NT)                                        \
    Q23K_KERNEL(tile_q3_k_##SUFFIX##NT, TGT, SUFFIX, 1, NT)
#define DEFINE_X86_TILES(SUFFIX, TGT, DOT, NT)                                                     \
    Q4_KERNEL(tile_q4_1_##SUFFIX##NT, TGT, DOT, 20, 4, Q4_1_FACTOR, NT)                            \
    Q4_KERNEL(tile_q4_0_##SUFFIX##NT, TGT, DOT, 18, 2, Q4_0_FACTOR, NT)                            \
    Q5_KERNEL(tile_q5_0_##SUFFIX##NT, TGT, DOT, 22, 2, 6, Q5_0_FACTOR, NT)                         \
    Q5_KERNEL(tile_q5_1_##SUFFIX##NT, TGT, DOT, 24, 4, 8, Q5_1_FACTOR, NT)

/* The one-token dot products: the NT = 1 tiles. */
#define ONE(TYPE, SUFFIX, TGT)                                                                     \
    TGT static float dot_##TYPE##_##SUFFIX(const void *w, const osp_q8_block *a, int64_t nb) {     \
        float y;                                                                                   \
        tile_##TYPE##_##SUFFIX##1(w, a, nb, 0, NULL, &y, 0);                                             \
        return y;                                                                                  \
    }
#define DEFINE_X86_KERNELS(SUFFIX, TGT, DOT)                                                       \
    DEFINE_X86_TILES(SUFFIX, TGT, DOT, 1)                                                          \
    DEFINE_X86_KTILES(SUFFIX, TGT, DOT, 1)                                                         \
    Q8_0_KERNEL(tile_q8_0_##SUFFIX##1, TGT, DOT, 1)                                                \
    ONE(q4_1, SUFFIX, TGT) ONE(q4_0, SUFFIX, TGT) ONE(q5_0, SUFFIX, TGT) ONE(q5_1, SUFFIX, TGT)   \
    ONE(q4_k, SUFFIX, TGT) ONE(q5_k, SUFFIX, TGT) ONE(q6_k, SUFFIX, TGT) ONE(q2_k, SUFFIX, TGT)   \
    ONE(q3_k, SUFFIX, TGT) ONE(q8_0, SUFFIX, TGT)

DEFINE_X86_KERNELS(avx2, TGT_AVX2, dot2_avx2)
DEFINE_X86_KERNELS(vnni, TGT_VNNI, dot2_vnni)
DEFINE_X86_TILES(avx2, TGT_AVX2, dot2_avx2, 4)
DEFINE_X86_KTILES(avx2, TGT_AVX2, dot2_avx2, 4)
Q8_0_KERNEL(tile_q8_0_avx24, TGT_AVX2, dot2_avx2, 4)
/* AVX512-VNNI's 4-token tiles: every K-quant (Q2_K and Q3_K have no wider ones; the others use them
 * for 4-7 tokens left, a small batched decode step, rather than one GEMV pass per token) */
DEFINE_X86_KTILES(vnni, TGT_VNNI, dot2_vnni, 4)

/* The tiles over token pairs in 512-bit vectors (AVX512-VNNI; Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): the low
 * 256 bits carry token 2k, the high 256 bits token 2k + 1, against the weight block's codes broadcast
 * to both halves, so each instruction does two tokens' work; 8 tokens = 4 pairs (16 measured 4-6 %
 * slower). The activations come packed (osp_pack_q8_pairs: each operand one 512-bit load, made once
 * per matmul for all weight rows) -- the unpacked rows cost a 256-bit load and a masked broadcast
 * per operand, and the d2 vector two broadcasts, per pair and block. Every 32-bit lane sees exactly
 * the one-token kernel's operations: the int32 256 dot(w, qs) + dot(w, qs2) of its 4 codes, the
 * conversion, the dw * d2 product and the FMA into the even or odd block's accumulator; each half is
 * summed as ACC_SUM sums a 256-bit pair, and the Q4/Q5 offset terms stay per token in scalar as in
 * Q4_KERNEL and Q5_KERNEL. So the bits are the one-token kernel's (test_qdot).
 *
 * Q8_0's signed codes: the one-token kernel moves w's sign onto the activations (vpsignb); here the
 * tile multiplies the unsigned u = w + 128 (w XOR 0x80) and starts the second level from the pack's
 * bias -128 (256 L1 + L2): 256 (dot(w, qs) + 128 L1) + (dot(w, qs2) + 128 L2) - 128 (256 L1 + L2) is
 * the same int32 (every partial < 2^26: 4 * 255 * 127 * 256 + 128 * 257 * 508). That takes the
 * two sign-masked negations off each pair's step: 7 operations where the unpacked tile had 13. */

/* One osp_q8_pair from block `lo` (low 256 bits) and block `hi` (high; zeros where hi is NULL). */
TGT_VNNI static inline void pack_pair_vnni(const osp_q8_block *lo, const osp_q8_block *hi, osp_q8_pair *o) {
    const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi8(1);
    const __m256i z = _mm256_setzero_si256();
    const __m512i qs = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)lo->qs)),
        hi ? _mm256_loadu_si256((const __m256i *)(const void *)hi->qs) : z, 1);
    const __m512i qs2 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)lo->qs2)),
        hi ? _mm256_loadu_si256((const __m256i *)(const void *)hi->qs2) : z, 1);
    const __m512i lsum = _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_dpbusd_epi32(zero, ones, qs), 8), ones,
                                             qs2); /* 256 L1 + L2 per lane, exact */
    _mm512_store_si512((void *)o->qs, qs);
    _mm512_store_si512((void *)o->qs2, qs2);
    _mm512_store_ps(o->d2, _mm512_mask_broadcastss_ps(_mm512_set1_ps(lo->d2), 0xff00, _mm_set_ss(hi ? hi->d2 : 0.0f)));
    _mm512_store_si512((void *)o->bias, _mm512_sub_epi32(zero, _mm512_slli_epi32(lsum, 7)));
}

TGT_VNNI static void pack_q8_vnni(const osp_q8_block *a, int64_t as, int64_t nb, osp_q8_pack *pk) {
    for (int64_t b = 0; b < nb; b++)
        for (int k = 0; k < 4; k++) {
            const osp_q8_block *a0 = a + 2 * k * as + b, *a1 = a0 + as;
            pk[b].s[2 * k] = a0->s, pk[b].s[2 * k + 1] = a1->s;
            pk[b].s0[2 * k] = a0->s0, pk[b].s0[2 * k + 1] = a1->s0;
            pack_pair_vnni(a0, a1, &pk[b].pair[k]);
        }
}

#define PK_LOAD(pp, f) _mm512_load_si512((const void *)(pp)->f)
/* pair k of block b for a tile of 2 NP tokens: tokens 8g .. 8g + 7 come from the g-th pack of nb
 * blocks (pk + g nb, osp_pack_q8 of those 8 tokens) */
#define PK_PAIR(b, k) (&pk[((k) / 4) * nb + (b)].pair[(k) % 4])
/* acc += cvt(256 dot(u, qs) + [bias] + dot(u, qs2)) * (dw * d2) for one packed pair; BIAS(pp) is the
 * second level's starting value (zero, or the pack's bias for Q8_0's offset codes). */
#define LEVEL_PACKED(acc, u, pp, dwz, BIAS)                                                        \
    acc = _mm512_fmadd_ps(                                                                         \
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(                                                    \
            BIAS(_mm512_slli_epi32(_mm512_dpbusd_epi32(zero, u, PK_LOAD(pp, qs)), 8), pp), u,      \
            PK_LOAD(pp, qs2))),                                                                    \
        _mm512_mul_ps(dwz, _mm512_load_ps((pp)->d2)), acc)
#define NO_BIAS(x, pp) (x)
#define Q8_BIAS(x, pp) _mm512_add_epi32(x, PK_LOAD(pp, bias))
/* the halves of A0[k] + A1[k], each summed as ACC_SUM sums one token's two accumulators, then
 * PLUS_OFF0 / PLUS_OFF1 (`+ OFF[..]`, or empty for Q8_0, which adds no offset) */
#define PAIR_STORE(k, PLUS_OFF0, PLUS_OFF1)                                                        \
    do {                                                                                           \
        const __m512d s0 = _mm512_castps_pd(A0[k]), s1 = _mm512_castps_pd(A1[k]);                  \
        y[2 * (k) * ys] =                                                                          \
            hsum8(_mm256_add_ps(_mm512_castps512_ps256(A0[k]), _mm512_castps512_ps256(A1[k]))) PLUS_OFF0; \
        y[(2 * (k) + 1) * ys] = hsum8(_mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(s0, 1)), \
                                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(s1, 1)))) \
                                    PLUS_OFF1;                                                     \
    } while (0)

/* The pair tiles read their weight row 1 KiB ahead into L1 (qdot8k.c's TILE8K_PF, measured there:
 * the tiles at K = 8960 were ~30 % faster, K = 1536 unchanged). */
#ifndef PAIR_PF
#define PAIR_PF 1024
#endif
#define PAIR_PREFETCH(p, BYTES)                                                                    \
    do {                                                                                           \
        if (PAIR_PF) for (int l_ = 0; l_ < (BYTES); l_ += 64) _mm_prefetch((const char *)(p) + PAIR_PF + l_, _MM_HINT_T0); \
    } while (0)

/* Q8_0: u = w XOR 0x80 broadcast to both halves; no offset term (the sum is returned as is, so -0.0
 * stays -0.0: adding 0.0f would turn it into +0.0). */
#define Q8_0_CODES(wp) \
    _mm512_xor_si512(_mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)((wp) + 2))), \
                     _mm512_set1_epi8((char)0x80))
#define Q8_0_PAIR_KERNEL(NAME, NP)                                                                 \
    TGT_VNNI static void NAME(TILE_ARGS) {                                                         \
        (void)a, (void)as;                                                                         \
        const uint8_t *p = w;                                                                      \
        const __m512i zero = _mm512_setzero_si512();                                               \
        __m512 A0[NP], A1[NP];                                                                     \
        UNROLL_NT for (int k = 0; k < (NP); k++) A0[k] = A1[k] = _mm512_setzero_ps();              \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= nb; b += 2, p += 68) {                                                     \
            PAIR_PREFETCH(p, 68);                                                                  \
            const __m512i u0 = Q8_0_CODES(p), u1 = Q8_0_CODES(p + 34);                             \
            const __m512 dw0 = _mm512_set1_ps(half_f16c(p)), dw1 = _mm512_set1_ps(half_f16c(p + 34)); \
            UNROLL_NT for (int k = 0; k < (NP); k++) {                                             \
                LEVEL_PACKED(A0[k], u0, PK_PAIR(b, k), dw0, Q8_BIAS);                              \
                LEVEL_PACKED(A1[k], u1, PK_PAIR(b + 1, k), dw1, Q8_BIAS);                          \
            }                                                                                      \
        }                                                                                          \
        if (b < nb) {                                                                              \
            const __m512i u0 = Q8_0_CODES(p);                                                      \
            const __m512 dw0 = _mm512_set1_ps(half_f16c(p));                                       \
            UNROLL_NT for (int k = 0; k < (NP); k++) LEVEL_PACKED(A0[k], u0, PK_PAIR(b, k), dw0, Q8_BIAS); \
        }                                                                                          \
        UNROLL_NT for (int k = 0; k < (NP); k++) PAIR_STORE(k, , );                                \
    }
Q8_0_PAIR_KERNEL(tile_q8_0_vnni8, 4)
Q8_0_PAIR_KERNEL(tile_q8_0_vnni16, 8)
Q8_0_PAIR_KERNEL(tile_q8_0_vnnip4, 2)
Q8_0_PAIR_KERNEL(tile_q8_0_vnnip6, 3)

/* A block's 32 codes in both 256-bit halves (unpack_nibbles' order: low nibbles are values 0..15,
 * high nibbles 16..31), built in 512 bits: the 16 bytes broadcast to the four 128-bit lanes, lanes 1
 * and 3 shifted right by 4, masked to 0x0f -- 3 operations where unpacking in 256 bits and
 * broadcasting took 5. Q5's fifth bits are the u32 at HOFF as a byte mask (bit i = value i, for both
 * halves), added as 0x10 under it: 2 operations (q5_high_bits' spread and compare took 6). */
#define Q4_CODES(p, QOFF, HOFF)                                                                    \
    _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(_mm_loadu_si128(                     \
                                           (const __m128i *)(const void *)((p) + (QOFF)))),        \
                                       nib_shift),                                                 \
                     _mm512_set1_epi8(0x0f))
#define Q5_CODES(p, QOFF, HOFF) q5_codes512(Q4_CODES(p, QOFF, HOFF), (p) + (HOFF))
TGT_VNNI static inline __m512i q5_codes512(__m512i q4, const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    return _mm512_mask_add_epi8(q4, (__mmask64)h | (__mmask64)h << 32, q4, _mm512_set1_epi8(0x10));
}
#define Q45_PAIR_KERNEL(NAME, CODES, BYTES, QOFF, HOFF, FACTOR, NP)                                \
    TGT_VNNI static void NAME(TILE_ARGS) {                                                         \
        enum { NG = ((NP) + 3) / 4 };                                                                    \
        (void)a, (void)as;                                                                         \
        const uint8_t *p = w;                                                                      \
        const __m512i zero = _mm512_setzero_si512();                                               \
        const __m512i nib_shift = _mm512_set_epi64(4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL, 0, 0, \
                                                   4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL, 0, 0); \
        __m512 A0[NP], A1[NP];                                                                     \
        __m256 off[NG]; /* each 8 tokens' offset sums, OFFSET_PAIR lane-wise */                    \
        UNROLL_NT for (int g = 0; g < NG; g++) off[g] = _mm256_setzero_ps();                       \
        UNROLL_NT for (int k = 0; k < NP; k++) A0[k] = A1[k] = _mm512_setzero_ps();                \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= nb; b += 2, p += 2 * (BYTES)) {                                            \
            PAIR_PREFETCH(p, 1); /* one line a block pair (36-48 bytes) */                         \
            const uint8_t *p1 = p + (BYTES);                                                       \
            const __m512i q0 = CODES(p, QOFF, HOFF), q1 = CODES(p1, QOFF, HOFF);                   \
            const float d0 = half_f16c(p), d1 = half_f16c(p1);                                     \
            const __m512 dw0 = _mm512_set1_ps(d0), dw1 = _mm512_set1_ps(d1);                       \
            UNROLL_NT for (int k = 0; k < NP; k++) {                                               \
                LEVEL_PACKED(A0[k], q0, PK_PAIR(b, k), dw0, NO_BIAS);                              \
                LEVEL_PACKED(A1[k], q1, PK_PAIR(b + 1, k), dw1, NO_BIAS);                          \
            }                                                                                      \
            const __m256 f0 = _mm256_set1_ps(FACTOR(p, d0)), f1 = _mm256_set1_ps(FACTOR(p1, d1));  \
            UNROLL_NT for (int g = 0; g < NG; g++) {                                               \
                const __m256 t0 = _mm256_mul_ps(f0, _mm256_load_ps(pk[g * nb + b].s));             \
                const __m256 t1 = _mm256_mul_ps(f1, _mm256_load_ps(pk[g * nb + b + 1].s));         \
                off[g] = _mm256_add_ps(off[g], _mm256_add_ps(t0, t1));                             \
            }                                                                                      \
        }                                                                                          \
        for (; b < nb; b++, p += (BYTES)) {                                                        \
            const __m512i q0 = CODES(p, QOFF, HOFF);                                               \
            const float d0 = half_f16c(p);                                                         \
            const __m512 dw0 = _mm512_set1_ps(d0);                                                 \
            UNROLL_NT for (int k = 0; k < NP; k++) LEVEL_PACKED(A0[k], q0, PK_PAIR(b, k), dw0, NO_BIAS); \
            UNROLL_NT for (int g = 0; g < NG; g++)                                                 \
                off[g] = _mm256_add_ps(off[g], _mm256_mul_ps(_mm256_set1_ps(FACTOR(p, d0)),         \
                                                             _mm256_load_ps(pk[g * nb + b].s)));   \
        }                                                                                          \
        float OFF[8 * NG];                                                                         \
        UNROLL_NT for (int g = 0; g < NG; g++) _mm256_storeu_ps(OFF + 8 * g, off[g]);              \
        UNROLL_NT for (int k = 0; k < NP; k++) PAIR_STORE(k, +OFF[2 * k], +OFF[2 * k + 1]);          \
    }
Q45_PAIR_KERNEL(tile_q4_1_vnni8, Q4_CODES, 20, 4, 0, Q4_1_FACTOR, 4)
Q45_PAIR_KERNEL(tile_q4_0_vnni8, Q4_CODES, 18, 2, 0, Q4_0_FACTOR, 4)
Q45_PAIR_KERNEL(tile_q5_0_vnni8, Q5_CODES, 22, 6, 2, Q5_0_FACTOR, 4)
Q45_PAIR_KERNEL(tile_q5_1_vnni8, Q5_CODES, 24, 8, 4, Q5_1_FACTOR, 4)
Q45_PAIR_KERNEL(tile_q4_1_vnni16, Q4_CODES, 20, 4, 0, Q4_1_FACTOR, 8)
Q45_PAIR_KERNEL(tile_q4_0_vnni16, Q4_CODES, 18, 2, 0, Q4_0_FACTOR, 8)
Q45_PAIR_KERNEL(tile_q5_0_vnni16, Q5_CODES, 22, 6, 2, Q5_0_FACTOR, 8)
Q45_PAIR_KERNEL(tile_q5_1_vnni16, Q5_CODES, 24, 8, 4, Q5_1_FACTOR, 8)
Q45_PAIR_KERNEL(tile_q4_1_vnnip4, Q4_CODES, 20, 4, 0, Q4_1_FACTOR, 2)
Q45_PAIR_KERNEL(tile_q4_0_vnnip4, Q4_CODES, 18, 2, 0, Q4_0_FACTOR, 2)
Q45_PAIR_KERNEL(tile_q5_0_vnnip4, Q5_CODES, 22, 6, 2, Q5_0_FACTOR, 2)
Q45_PAIR_KERNEL(tile_q5_1_vnnip4, Q5_CODES, 24, 8, 4, Q5_1_FACTOR, 2)
Q45_PAIR_KERNEL(tile_q4_1_vnnip6, Q4_CODES, 20, 4, 0, Q4_1_FACTOR, 3)
Q45_PAIR_KERNEL(tile_q4_0_vnnip6, Q4_CODES, 18, 2, 0, Q4_0_FACTOR, 3)
Q45_PAIR_KERNEL(tile_q5_0_vnnip6, Q5_CODES, 22, 6, 2, Q5_0_FACTOR, 3)
Q45_PAIR_KERNEL(tile_q5_1_vnnip6, Q5_CODES, 24, 8, 4, Q5_1_FACTOR, 3)

/* Q4_K / Q5_K over token pairs (QK45_KERNEL's steps on packs): each block's codes broadcast to both
 * halves, the float factor d sc_j per block, and the mins' tree (mins8) in 8 lanes for 8 tokens. */
#define QK45_PAIR_KERNEL(NAME, BYTES, FIVE, NP)                                                     \
    TGT_VNNI static void NAME(TILE_ARGS) {                                                         \
        (void)a, (void)as;                                                                         \
        const uint8_t *p = w;                                                                      \
        const __m512i m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1);                      \
        const __m512i zero = _mm512_setzero_si512();                                               \
        __m512 A0[NP], A1[NP];                                                                     \
        __m256 off = _mm256_setzero_ps();                                                          \
        UNROLL_NT for (int k = 0; k < NP; k++) A0[k] = A1[k] = _mm512_setzero_ps();                \
        for (int64_t sb = 0; sb < nb / 8; sb++, p += (BYTES)) {                                    \
            PAIR_PREFETCH(p, BYTES);                                                               \
            const float d = half_f16c(p), dmin = half_f16c(p + 2);                                 \
            uint8_t sc[8], m[8];                                                                   \
            k4_scales(p + 4, sc, m);                                                               \
            const uint8_t *qs = p + ((FIVE) ? 48 : 16);                                            \
            __m512i qh = (FIVE) ? _mm512_broadcast_i64x4(                                          \
                                      _mm256_loadu_si256((const __m256i *)(const void *)(p + 16))) \
                                : _mm512_setzero_si512();                                          \
            const osp_q8_pack *pb = pk + 8 * sb;                                                   \
            for (int c = 0; c < 4; c++) { /* codes built in 512 bits: the 32 bytes broadcast */     \
                const __m512i raw =                                                                \
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * c))); \
                __m512i lo2 = _mm512_and_si512(raw, m4);                                           \
                __m512i hi2 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);                     \
                if (FIVE) {                                                                        \
                    lo2 = _mm512_or_si512(lo2, _mm512_slli_epi16(_mm512_and_si512(qh, one), 4));   \
                    hi2 = _mm512_or_si512(hi2, _mm512_slli_epi16(                                  \
                                                   _mm512_and_si512(_mm512_srli_epi16(qh, 1), one), 4)); \
                    qh = _mm512_srli_epi16(qh, 2);                                                 \
                }                                                                                  \
                const __m512 dlo = _mm512_set1_ps(d * (float)sc[2 * c]);                           \
                const __m512 dhi = _mm512_set1_ps(d * (float)sc[2 * c + 1]);                       \
                UNROLL_NT for (int k = 0; k < NP; k++) {                                           \
                    LEVEL_PACKED(A0[k], lo2, &pb[2 * c].pair[k], dlo, NO_BIAS);                    \
                    LEVEL_PACKED(A1[k], hi2, &pb[2 * c + 1].pair[k], dhi, NO_BIAS);                \
                }                                                                                  \
            }                                                                                      \
            __m256 t[8];                                                                           \
            UNROLL_NT for (int j = 0; j < 8; j++)                                                  \
                t[j] = _mm256_mul_ps(_mm256_set1_ps((float)m[j]), _mm256_load_ps(pb[j].s));        \
            const __m256 v0 = _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]));  \
            const __m256 v1 = _mm256_add_ps(_mm256_add_ps(t[4], t[5]), _mm256_add_ps(t[6], t[7]));  \
            off = _mm256_sub_ps(off, _mm256_mul_ps(_mm256_set1_ps(dmin), _mm256_add_ps(v0, v1)));  \
        }                                                                                          \
        float OFF[8];                                                                               \
        _mm256_storeu_ps(OFF, off);                                                                \
        UNROLL_NT for (int k = 0; k < NP; k++) PAIR_STORE(k, +OFF[2 * k], +OFF[2 * k + 1]);          \
    }
QK45_PAIR_KERNEL(tile_q4_k_vnni8, 144, 0, 4)
QK45_PAIR_KERNEL(tile_q5_k_vnni8, 176, 1, 4)
QK45_PAIR_KERNEL(tile_q4_k_vnnip4, 144, 0, 2)
QK45_PAIR_KERNEL(tile_q5_k_vnnip4, 176, 1, 2)
QK45_PAIR_KERNEL(tile_q4_k_vnnip6, 144, 0, 3)
QK45_PAIR_KERNEL(tile_q5_k_vnnip6, 176, 1, 3)

/* Q6_K over token pairs (Q6K_KERNEL's steps on packs): each block's codes broadcast to both halves,
 * its two 16-value scales as int32 lanes (sc[2j] for lanes 0-3 of each half, sc[2j + 1] for 4-7:
 * one shuffle and one widening a block), and the -32 offset's halves8 tree in 8 lanes for 8 tokens. */
#define Q6_BCAST32(ptr) _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(ptr)))
#define Q6K_PAIR_KERNEL(NAME, NP)                                                                                           \
TGT_VNNI static void NAME(TILE_ARGS) {                                                                                      \
    (void)a, (void)as;                                                                                                      \
    const uint8_t *p = w;                                                                                                   \
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);                                                \
    const __m128i two = _mm_set1_epi8(2);                                                                                   \
    const __m512i zero = _mm512_setzero_si512();                                                                            \
    __m512 A0[NP], A1[NP];                                                                                                  \
    __m256 off = _mm256_setzero_ps();                                                                                       \
    UNROLL_NT for (int k = 0; k < NP; k++) A0[k] = A1[k] = _mm512_setzero_ps();                                             \
    for (int64_t sb = 0; sb < nb / 8; sb++, p += 210) {                                                                     \
        PAIR_PREFETCH(p, 210);                                                                                              \
        const int8_t *sc = (const int8_t *)(p + 192);                                                                       \
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)sc);                                             \
        const float d = half_f16c(p + 208);                                                                                 \
        const __m512 dv = _mm512_set1_ps(d);                                                                                \
        const osp_q8_pack *pb = pk + 8 * sb;                                                                                \
        __m128i sel = _mm_set_epi64x(0x0101010100000000LL, 0x0101010100000000LL);                                           \
        for (int h = 0; h < 2; h++) {                                                                                       \
            /* the codes built in 512 bits from the rows broadcast to both halves */                                        \
            const __m512i l0 = Q6_BCAST32(p + 64 * h), l1 = Q6_BCAST32(p + 64 * h + 32), qh = Q6_BCAST32(p + 128 + 32 * h); \
            const __m512i q[4] = {                                                                                          \
                _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30)),                 \
                _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30)),                 \
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(qh, m30)),                 \
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),                                             \
                                _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30)),                                           \
            };                                                                                                              \
            for (int s4 = 0; s4 < 4; s4++) {                                                                                \
                const __m512i scv = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc8, sel));                                       \
                sel = _mm_add_epi8(sel, two);                                                                               \
                const osp_q8_pair *pp = pb[4 * h + s4].pair;                                                                \
                UNROLL_NT for (int k = 0; k < NP; k++) {                                                                    \
                    const __m512i x = _mm512_mullo_epi32(                                                                   \
                        _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_dpbusd_epi32(zero, q[s4], PK_LOAD(pp + k, qs)), 8),    \
                                            q[s4], PK_LOAD(pp + k, qs2)),                                                   \
                        scv);                                                                                               \
                    const __m512 f = _mm512_mul_ps(dv, _mm512_load_ps(pp[k].d2));                                           \
                    if (s4 & 1)                                                                                             \
                        A1[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), f, A1[k]);                                           \
                    else                                                                                                    \
                        A0[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), f, A0[k]);                                           \
                }                                                                                                           \
            }                                                                                                               \
        }                                                                                                                   \
        __m256 t[8];                                                                                                        \
        UNROLL_NT for (int j = 0; j < 8; j++) {                                                                             \
            const __m256 s0 = _mm256_load_ps(pb[j].s0), s1 = _mm256_sub_ps(_mm256_load_ps(pb[j].s), s0);                    \
            t[j] = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps((float)sc[2 * j]), s0),                                       \
                                 _mm256_mul_ps(_mm256_set1_ps((float)sc[2 * j + 1]), s1));                                  \
        }                                                                                                                   \
        const __m256 v0 = _mm256_add_ps(_mm256_add_ps(t[0], t[1]), _mm256_add_ps(t[2], t[3]));                              \
        const __m256 v1 = _mm256_add_ps(_mm256_add_ps(t[4], t[5]), _mm256_add_ps(t[6], t[7]));                              \
        off = _mm256_sub_ps(off, _mm256_mul_ps(_mm256_set1_ps(32.0f * d), _mm256_add_ps(v0, v1)));                          \
    }                                                                                                                       \
    float OFF[8];                                                                                                           \
    _mm256_storeu_ps(OFF, off);                                                                                             \
    UNROLL_NT for (int k = 0; k < NP; k++) PAIR_STORE(k, +OFF[2 * k], +OFF[2 * k + 1]);                                     \
}
Q6K_PAIR_KERNEL(tile_q6_k_vnni8, 4)
Q6K_PAIR_KERNEL(tile_q6_k_vnnip4, 2)
Q6K_PAIR_KERNEL(tile_q6_k_vnnip6, 3)

/* ---- one token against a weight row on AVX512-VNNI: block pairs in 512-bit vectors (GEMV) ----
 * The one-token kernels keep even blocks in accumulator A0 and odd blocks in A1 and return
 * hsum8(A0 + A1) (+ OFF); here blocks 2i and 2i + 1 share one 512-bit vector, low half even, high
 * half odd, so the low half IS A0 and the high half A1, lane for lane the same operations (the int32
 * of the 4 codes, the conversion, the dw d2 product, the FMA) -- the same bits (test_qdot) at half
 * the instructions, which a decode step needs: one token's matmuls stream every weight once, and the
 * 256-bit kernels ran below the memory's rate. The activations come as the token's block pairs in
 * osp_q8_pair form (osp_pack_q8_row, once per token and matmul); a last odd block updates the low
 * half alone (masked: adding zeros could turn a -0.0 in A1 into +0.0). Offsets stay scalar, as in
 * the one-token kernels. */

/* [h(p0), h(p1), 0, 0]: two fp16 values as floats */
TGT_VNNI static inline __m128 half2(const uint8_t *p0, const uint8_t *p1) {
    uint16_t h0, h1;
    memcpy(&h0, p0, 2);
    memcpy(&h1, p1, 2);
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)h0 | (uint32_t)h1 << 16)));
}
/* [x[0] x 8 | x[1] x 8] */
TGT_VNNI static inline __m512 spread2(__m128 x) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                 _mm512_castps128_ps512(x));
}
/* the row's scales of blocks b, b + 1 as [d_b x 8 | d_b+1 x 8] (fp16 at p0 and p1) */
TGT_VNNI static inline __m512 half_pair(const uint8_t *p0, const uint8_t *p1) { return spread2(half2(p0, p1)); }
/* [x0 x 8 | x1 x 8] from two floats */
TGT_VNNI static inline __m512 float_pair(float x0, float x1) {
    return _mm512_permutexvar_ps(_mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                                 _mm512_castps128_ps512(_mm_set_ps(0.0f, 0.0f, x1, x0)));
}
TGT_VNNI static inline float hsum_halves(__m512 acc) {
    const __m512d v = _mm512_castps_pd(acc);
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(v, 1))));
}
/* Each kernel runs NR = 4 rows at once (then the last rows one at a time): one row's pairs form
 * a single chain of dependent FMAs (4 cycles each), which held a lone row at the 256-bit kernels'
 * rate; four rows' chains interleave, and the activation pairs are loaded once for the four.
 * Each row's stream prefetches GEMV_PREFETCH bytes ahead (one prefetch per step of at most 64
 * bytes): the weights come from mmap'd file pages, whose 4 KiB pages stop the hardware prefetcher
 * at every boundary. Measured on the dev box (Emerald Rapids, 2 threads, tg64 A/B pairs): 512 B
 * 0.94x of 1 KiB, 2 KiB 1.13-1.19x of 1 KiB, 8 KiB 1.18x of 2 KiB, 16 KiB 1.00x and 32 KiB 0.96x
 * of 8 KiB; 8 KiB against none: Qwen2.5 Q4_K_M tg 1.6x (bench/cpu/NOTES.md). Into L2, 16 KiB ahead, since
 * 2026-12-07: on an AMD EPYC (Zen 4) box whose DRAM the weights stream from, the L1 hint at 8 or 16 KiB gave
 * Qwen2.5-0.5B tg128 41-43 t/s and the L2 hint 49-53 (16 or 32 KiB), SmolLM2 Q4_1 155-182 against 184-200
 * (bench/cpu/NOTES.md, fourteenth pass): streamed lines parked in L1 evict the activations. */
#define GEMV_ARGS                                                                                  \
    const void *w, size_t row_bytes, const osp_q8_block *a, const osp_q8_pair *bp, int64_t nb, float *y, int64_t nrows
#define GEMV_NR 4
#ifndef GEMV_PREFETCH
#define GEMV_PREFETCH 16384
#endif
#ifndef GEMV_PF_HINT
#define GEMV_PF_HINT _MM_HINT_T1
#endif
#define ROWS_UNROLL _Pragma("GCC unroll 4")
#define FORCE_INLINE inline __attribute__((always_inline))
/* the low half only (a last odd block): lanes 8..15 of acc untouched */
#define LEVEL_LOW(acc, u, pp, dwz, BIAS)                                                           \
    acc = _mm512_mask3_fmadd_ps(                                                                   \
        _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(                                                    \
            BIAS(_mm512_slli_epi32(_mm512_dpbusd_epi32(zero, u, PK_LOAD(pp, qs)), 8), pp), u,      \
            PK_LOAD(pp, qs2))),                                                                    \
        _mm512_mul_ps(dwz, _mm512_load_ps((pp)->d2)), acc, 0x00ff)
/* the driver: rows in groups of GEMV_NR through BODY(..., GEMV_NR), the rest through BODY(..., 1) */
#define GEMV_DRIVER(NAME, BODY)                                                                    \
    TGT_VNNI static void NAME(GEMV_ARGS) {                                                         \
        int64_t r = 0;                                                                             \
        for (; r + GEMV_NR <= nrows; r += GEMV_NR)                                                 \
            BODY((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, a, bp, nb, y + r, GEMV_NR); \
        for (; r < nrows; r++) BODY((const uint8_t *)w + (size_t)r * row_bytes, row_bytes, a, bp, nb, y + r, 1); \
    }

/* Q8_0: the two blocks' codes side by side (34-byte blocks: two loads), u = w XOR 0x80 */
#define Q8_0_CODES2(p)                                                                             \
    _mm512_xor_si512(                                                                              \
        _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)((p) + 2))), \
                           _mm256_loadu_si256((const __m256i *)(const void *)((p) + 36)), 1),      \
        _mm512_set1_epi8((char)0x80))
TGT_VNNI static FORCE_INLINE void q8_0_rows(const uint8_t *w, size_t row_bytes, const osp_q8_block *a,
                                            const osp_q8_pair *bp, int64_t nb, float *y, const int NR) {
    (void)a;
    const __m512i zero = _mm512_setzero_si512();
    __m512 acc[GEMV_NR];
    ROWS_UNROLL for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 2 <= nb; b += 2) {
        ROWS_UNROLL for (int r = 0; r < NR; r++) {
            const uint8_t *p = w + (size_t)r * row_bytes + (size_t)b * 34;
            _mm_prefetch((const char *)(p + GEMV_PREFETCH), GEMV_PF_HINT);
            LEVEL_PACKED(acc[r], Q8_0_CODES2(p), bp + b / 2, half_pair(p, p + 34), Q8_BIAS);
        }
    }
    if (b < nb)
        ROWS_UNROLL for (int r = 0; r < NR; r++) {
            const uint8_t *p = w + (size_t)r * row_bytes + (size_t)b * 34;
            const __m512i u = _mm512_xor_si512(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)(p + 2))),
                _mm512_set1_epi8((char)0x80));
            LEVEL_LOW(acc[r], u, bp + b / 2, _mm512_set1_ps(half_f16c(p)), Q8_BIAS);
        }
    ROWS_UNROLL for (int r = 0; r < NR; r++) y[r] = hsum_halves(acc[r]);
}
GEMV_DRIVER(gemv_q8_0_vnni, q8_0_rows)

/* Q4/Q5: the two blocks' 16 nibble bytes in 128-bit lanes 0-1 and 2-3, then Q4_CODES' shift and mask
 * (and Q5's fifth bits of both blocks as one 64-bit mask) */
#define Q4_CODES2(p, p1, QOFF, HOFF)                                                               \
    _mm512_and_si512(                                                                              \
        _mm512_srlv_epi16(                                                                         \
            _mm512_mask_broadcast_i32x4(                                                           \
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)((p) + (QOFF)))), 0xff00, \
                _mm_loadu_si128((const __m128i *)(const void *)((p1) + (QOFF)))),                  \
            nib_shift),                                                                            \
        _mm512_set1_epi8(0x0f))
#define Q5_CODES2(p, p1, QOFF, HOFF) q5_codes512_2(Q4_CODES2(p, p1, QOFF, HOFF), (p) + (HOFF), (p1) + (HOFF))
TGT_VNNI static inline __m512i q5_codes512_2(__m512i q4, const uint8_t *qh0, const uint8_t *qh1) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    return _mm512_mask_add_epi8(q4, (__mmask64)h0 | (__mmask64)h1 << 32, q4, _mm512_set1_epi8(0x10));
}
#define NIB_SHIFT                                                                                  \
    _mm512_set_epi64(4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL, 0, 0, 4 * 0x0001000100010001LL, \
                     4 * 0x0001000100010001LL, 0, 0)
#define Q45_GEMV_KERNEL(NAME, CODES2, BYTES, QOFF, HOFF, FACTOR, FACTORV)                          \
    TGT_VNNI static FORCE_INLINE void NAME##_rows(const uint8_t *w, size_t row_bytes, const osp_q8_block *a, \
                                                  const osp_q8_pair *bp, int64_t nb, float *y, const int NR) { \
        const float *sums = (const float *)(const void *)(bp + (nb + 1) / 2); /* osp_pack_q8_row */ \
        (void)a;                                                                                   \
        const __m512i zero = _mm512_setzero_si512(), nib_shift = NIB_SHIFT;                        \
        const __m512i idx02 = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);      \
        __m512 acc[GEMV_NR];                                                                       \
        __m128 OFF[GEMV_NR]; /* lane 0 */                                                          \
        ROWS_UNROLL for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps(), OFF[r] = _mm_setzero_ps(); \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= nb; b += 2) {                                                              \
            const __m128 s2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)(sums + b))); \
            const __m128 s22 = _mm_unpacklo_ps(s2, s2); /* [s0, s0, s1, s1] */                     \
            ROWS_UNROLL for (int r = 0; r < NR; r++) {                                             \
                const uint8_t *p = w + (size_t)r * row_bytes + (size_t)b * (BYTES), *p1 = p + (BYTES); \
                _mm_prefetch((const char *)(p + GEMV_PREFETCH), GEMV_PF_HINT);                      \
                /* [d0, x0, d1, x1] from two 32-bit loads (x: Q4_1/Q5_1's minimum m, else bytes of  \
                 * no use to us), then the scale pair [d0 x 8 | d1 x 8] and OFFSET_PAIR in lanes 0 and \
                 * 2: [f0 s0, ., f1 s1, .] and OFF + (t0 + t1) */                                  \
                uint32_t h0, h1;                                                                   \
                memcpy(&h0, p, 4);                                                                 \
                memcpy(&h1, p1, 4);                                                                \
                const __m128 f = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)h0), (int)h1, 1)); \
                LEVEL_PACKED(acc[r], CODES2(p, p1, QOFF, HOFF), bp + b / 2,                        \
                             _mm512_permutexvar_ps(idx02, _mm512_castps128_ps512(f)), NO_BIAS);     \
                const __m128 t = _mm_mul_ps(FACTORV(f), s22);                                      \
                OFF[r] = _mm_add_ss(OFF[r], _mm_add_ss(t, _mm_movehl_ps(t, t)));                   \
            }                                                                                      \
        }                                                                                          \
        if (b < nb)                                                                                \
            ROWS_UNROLL for (int r = 0; r < NR; r++) {                                             \
                const uint8_t *p = w + (size_t)r * row_bytes + (size_t)b * (BYTES);                \
                LEVEL_LOW(acc[r], CODES2(p, p, QOFF, HOFF), bp + b / 2, _mm512_set1_ps(half_f16c(p)), NO_BIAS); \
                float off = _mm_cvtss_f32(OFF[r]);                                                 \
                OFFSET_ONE(off, FACTOR(p, half_f16c(p)), sums[b]);                                 \
                OFF[r] = _mm_set_ss(off);                                                          \
            }                                                                                      \
        ROWS_UNROLL for (int r = 0; r < NR; r++) y[r] = hsum_halves(acc[r]) + _mm_cvtss_f32(OFF[r]); \
    }                                                                                              \
    GEMV_DRIVER(NAME, NAME##_rows)
/* the offset factors of blocks b, b + 1 in lanes 0 and 2 from [d0, x0, d1, x1], as the FACTOR macros */
#define Q4_1_FACTORV(f) _mm_movehdup_ps(f)
#define Q4_0_FACTORV(f) _mm_mul_ps(_mm_set1_ps(-8.0f), f)
#define Q5_0_FACTORV(f) _mm_mul_ps(_mm_set1_ps(-16.0f), f)
#define Q5_1_FACTORV(f) _mm_movehdup_ps(f)
Q45_GEMV_KERNEL(gemv_q4_1_vnni, Q4_CODES2, 20, 4, 0, Q4_1_FACTOR, Q4_1_FACTORV)
Q45_GEMV_KERNEL(gemv_q4_0_vnni, Q4_CODES2, 18, 2, 0, Q4_0_FACTOR, Q4_0_FACTORV)
Q45_GEMV_KERNEL(gemv_q5_0_vnni, Q5_CODES2, 22, 6, 2, Q5_0_FACTOR, Q5_0_FACTORV)
Q45_GEMV_KERNEL(gemv_q5_1_vnni, Q5_CODES2, 24, 8, 4, Q5_1_FACTOR, Q5_1_FACTORV)

/* Q4_K / Q5_K: chunk c's 32 bytes hold blocks 2c (low nibbles) and 2c + 1 (high): broadcast to both
 * halves and shifted by 0 | 4; Q5_K's fifth bits j = 2c, 2c + 1 shifted the same way */
#define QK45_GEMV_KERNEL(NAME, BYTES, FIVE)                                                        \
    TGT_VNNI static FORCE_INLINE void NAME##_rows(const uint8_t *w, size_t row_bytes, const osp_q8_block *a, \
                                                  const osp_q8_pair *bp, int64_t nb, float *y, const int NR) { \
        const __m512i zero = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0f), one = _mm512_set1_epi8(1); \
        const __m512i half_shift = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL,     \
                                                    0x0004000400040004LL, 0x0004000400040004LL, 0, 0, 0, 0); \
        __m512 acc[GEMV_NR];                                                                       \
        float OFF[GEMV_NR];                                                                        \
        ROWS_UNROLL for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps(), OFF[r] = 0.0f;       \
        for (int64_t sb = 0; sb < nb / 8; sb++) {                                                  \
            ROWS_UNROLL for (int r = 0; r < NR; r++) {                                             \
                const uint8_t *p = w + (size_t)r * row_bytes + (size_t)sb * (BYTES);               \
                for (int l = 0; l < (BYTES); l += 64) _mm_prefetch((const char *)(p + GEMV_PREFETCH + l), GEMV_PF_HINT); \
                const float d = half_f16c(p), dmin = half_f16c(p + 2);                             \
                uint8_t sc[8], m[8];                                                               \
                k4_scales(p + 4, sc, m);                                                           \
                const uint8_t *qs = p + ((FIVE) ? 48 : 16);                                        \
                /* qh's bits (2c, 2c + 1) at bit 0 of each half: low half unshifted, high >> 1 */  \
                __m512i qh = (FIVE) ? _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256(   \
                                                            (const __m256i *)(const void *)(p + 16))), \
                                                        _mm512_srli_epi16(half_shift, 2))          \
                                    : zero;                                                        \
                for (int c = 0; c < 4; c++) {                                                      \
                    __m512i q = _mm512_and_si512(                                                  \
                        _mm512_srlv_epi16(_mm512_broadcast_i64x4(_mm256_loadu_si256(                \
                                              (const __m256i *)(const void *)(qs + 32 * c))),      \
                                          half_shift),                                             \
                        m4);                                                                       \
                    if (FIVE) {                                                                    \
                        q = _mm512_or_si512(q, _mm512_slli_epi16(_mm512_and_si512(qh, one), 4));   \
                        qh = _mm512_srli_epi16(qh, 2);                                             \
                    }                                                                              \
                    LEVEL_PACKED(acc[r], q, bp + 4 * sb + c,                                       \
                                 float_pair(d * (float)sc[2 * c], d * (float)sc[2 * c + 1]), NO_BIAS); \
                }                                                                                  \
                const float t_ = dmin * mins8(m, a + 8 * sb);                                      \
                OFF[r] -= t_;                                                                      \
            }                                                                                      \
        }                                                                                          \
        ROWS_UNROLL for (int r = 0; r < NR; r++) y[r] = hsum_halves(acc[r]) + OFF[r];              \
    }                                                                                              \
    GEMV_DRIVER(NAME, NAME##_rows)
QK45_GEMV_KERNEL(gemv_q4_k_vnni, 144, 0)
QK45_GEMV_KERNEL(gemv_q5_k_vnni, 176, 1)

/* Q6_K: per half h, blocks (4h, 4h + 1) from ql's 64 bytes [l0 | l1] in one load and qh shifted
 * 4 | 2 (mask 0x30), blocks (4h + 2, 4h + 3) from [l0 | l1] >> 4 and qh shifted 0 | 2 right; each
 * block's two 16-value scales as int32 lanes (4 scales a pair: one shuffle and one widening). */
TGT_VNNI static FORCE_INLINE void q6_k_rows(const uint8_t *w, size_t row_bytes, const osp_q8_block *a,
                                            const osp_q8_pair *bp, int64_t nb, float *y, const int NR) {
    const __m512i zero = _mm512_setzero_si512(), m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i sh_lo = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL, 0x0002000200020002LL,
                                           0x0002000200020002LL, 0x0004000400040004LL, 0x0004000400040004LL,
                                           0x0004000400040004LL, 0x0004000400040004LL);
    const __m512i sh_hi = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL, 0x0002000200020002LL,
                                           0x0002000200020002LL, 0, 0, 0, 0);
    const __m128i four = _mm_set1_epi8(4);
    __m512 acc[GEMV_NR];
    float OFF[GEMV_NR];
    ROWS_UNROLL for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps(), OFF[r] = 0.0f;
    for (int64_t sb = 0; sb < nb / 8; sb++) {
        ROWS_UNROLL for (int r = 0; r < NR; r++) {
            const uint8_t *p = w + (size_t)r * row_bytes + (size_t)sb * 210;
            for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)(p + GEMV_PREFETCH + l), GEMV_PF_HINT);
            const int8_t *sc = (const int8_t *)(p + 192);
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)sc);
            const __m512 dv = _mm512_set1_ps(half_f16c(p + 208));
            __m128i sel = _mm_set_epi64x(0x0303030302020202LL, 0x0101010100000000LL);
            for (int h = 0; h < 2; h++) {
                const __m512i l = _mm512_loadu_si512((const void *)(p + 64 * h));
                const __m512i qh =
                    _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(p + 128 + 32 * h)));
                const __m512i q01 =
                    _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, sh_lo), m30));
                const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                    _mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m30));
                for (int s2 = 0; s2 < 2; s2++) {
                    const __m512i scv = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(sc8, sel));
                    sel = _mm_add_epi8(sel, four);
                    const osp_q8_pair *pp = bp + 4 * sb + 2 * h + s2;
                    const __m512i q = s2 ? q23 : q01;
                    const __m512i x = _mm512_mullo_epi32(
                        _mm512_dpbusd_epi32(_mm512_slli_epi32(_mm512_dpbusd_epi32(zero, q, PK_LOAD(pp, qs)), 8), q,
                                            PK_LOAD(pp, qs2)),
                        scv);
                    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(x), _mm512_mul_ps(dv, _mm512_load_ps(pp->d2)), acc[r]);
                }
            }
            const float t_ = 32.0f * half_f16c(p + 208) * halves8(sc, a + 8 * sb);
            OFF[r] -= t_;
        }
    }
    ROWS_UNROLL for (int r = 0; r < NR; r++) y[r] = hsum_halves(acc[r]) + OFF[r];
}
GEMV_DRIVER(gemv_q6_k_vnni, q6_k_rows)

TGT_VNNI static void pack_q8_row_vnni(const osp_q8_block *a, int64_t nb, osp_q8_pair *bp) {
    for (int64_t b = 0; b < nb; b += 2) pack_pair_vnni(a + b, b + 1 < nb ? a + b + 1 : NULL, bp + b / 2);
}
#endif

/* ---- dispatch ---------------------------------------------------------------------------------- */

typedef enum { ISA_UNSET, ISA_SCALAR, ISA_AVX2, ISA_VNNI } isa_t;
static isa_t g_isa = ISA_UNSET;

static isa_t detect(void) {
    if (g_isa != ISA_UNSET) return g_isa;
    isa_t isa = ISA_SCALAR;
#ifdef OSP_X86
    __builtin_cpu_init();
    /* every AVX2 CPU (Haswell, Zen and later) has F16C; clang cannot query "f16c" */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        isa = ISA_AVX2;
        if (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512bw"))
            isa = ISA_VNNI;
    }
#endif
    g_isa = isa; /* benign race: every thread computes the same value */
    return isa;
}

bool osp_qdot_force_isa(const char *name) {
    g_isa = ISA_UNSET;
    const isa_t best = detect();
    isa_t want = !strcmp(name, "avx512vnni") ? ISA_VNNI : !strcmp(name, "avx2") ? ISA_AVX2
               : !strcmp(name, "scalar") ? ISA_SCALAR : ISA_UNSET;
    if (want == ISA_UNSET || want > best) return false;
    g_isa = want;
    return true;
}

osp_qdot_isa_kind osp_qdot_isa_family(void) {
    switch (detect()) {
    case ISA_VNNI: return OSP_QDOT_ISA_VNNI;
    case ISA_AVX2: return OSP_QDOT_ISA_AVX2;
    default: return OSP_QDOT_ISA_SCALAR;
    }
}

const char *osp_qdot_isa(void) {
    switch (osp_qdot_isa_family()) {
    case OSP_QDOT_ISA_VNNI: return "avx512vnni";
    case OSP_QDOT_ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

osp_qdot_fn osp_qdot_ref_for(uint32_t type) {
    switch (type) {
    case OSP_DTYPE_Q8_0: return dot_q8_0_ref;
    case OSP_DTYPE_Q4_0: return dot_q4_0_ref;
    case OSP_DTYPE_Q4_1: return dot_q4_1_ref;
    case OSP_DTYPE_Q5_0: return dot_q5_0_ref;
    case OSP_DTYPE_Q5_1: return dot_q5_1_ref;
    case OSP_DTYPE_Q2_K: return dot_q2_k_ref;
    case OSP_DTYPE_Q3_K: return dot_q3_k_ref;
    case OSP_DTYPE_Q4_K: return dot_q4_k_ref;
    case OSP_DTYPE_Q5_K: return dot_q5_k_ref;
    case OSP_DTYPE_Q6_K: return dot_q6_k_ref;
    default: return NULL;
    }
}

osp_qdot_fn osp_qdot_for(uint32_t type) {
#ifdef OSP_X86
    const isa_t isa = detect();
    if (isa == ISA_VNNI) {
        switch (type) {
        case OSP_DTYPE_Q8_0: return dot_q8_0_vnni;
        case OSP_DTYPE_Q4_0: return dot_q4_0_vnni;
        case OSP_DTYPE_Q4_1: return dot_q4_1_vnni;
        case OSP_DTYPE_Q5_0: return dot_q5_0_vnni;
        case OSP_DTYPE_Q5_1: return dot_q5_1_vnni;
        case OSP_DTYPE_Q2_K: return dot_q2_k_vnni;
        case OSP_DTYPE_Q3_K: return dot_q3_k_vnni;
        case OSP_DTYPE_Q4_K: return dot_q4_k_vnni;
        case OSP_DTYPE_Q5_K: return dot_q5_k_vnni;
        case OSP_DTYPE_Q6_K: return dot_q6_k_vnni;
        default: return NULL;
        }
    }
    if (isa == ISA_AVX2) {
        switch (type) {
        case OSP_DTYPE_Q8_0: return dot_q8_0_avx2;
        case OSP_DTYPE_Q4_0: return dot_q4_0_avx2;
        case OSP_DTYPE_Q4_1: return dot_q4_1_avx2;
        case OSP_DTYPE_Q5_0: return dot_q5_0_avx2;
        case OSP_DTYPE_Q5_1: return dot_q5_1_avx2;
        case OSP_DTYPE_Q2_K: return dot_q2_k_avx2;
        case OSP_DTYPE_Q3_K: return dot_q3_k_avx2;
        case OSP_DTYPE_Q4_K: return dot_q4_k_avx2;
        case OSP_DTYPE_Q5_K: return dot_q5_k_avx2;
        case OSP_DTYPE_Q6_K: return dot_q6_k_avx2;
        default: return NULL;
        }
    }
#endif
    return osp_qdot_ref_for(type);
}

/* The portable packers (the layouts' definition; tests and non-x86 builds): half h of pair o from
 * block blk -- its codes, d2 eight times, and the bias -128 (256 L1 + L2) of each 4-code lane. */
static void pack_half_ref(const osp_q8_block *blk, osp_q8_pair *o, int h) {
    memcpy(o->qs + 32 * h, blk->qs, 32);
    memcpy(o->qs2 + 32 * h, blk->qs2, 32);
    for (int l = 0; l < 8; l++) {
        int32_t l1 = 0, l2 = 0;
        for (int i = 0; i < 4; i++) l1 += blk->qs[4 * l + i], l2 += blk->qs2[4 * l + i];
        o->d2[8 * h + l] = blk->d2;
        o->bias[8 * h + l] = -128 * (256 * l1 + l2);
    }
}

static void pack_q8_ref(const osp_q8_block *a, int64_t as, int64_t nb, osp_q8_pack *pk) {
    for (int64_t b = 0; b < nb; b++)
        for (int j = 0; j < 8; j++) { /* token j: half j % 2 of pair j / 2 */
            const osp_q8_block *blk = a + j * as + b;
            pk[b].s[j] = blk->s;
            pk[b].s0[j] = blk->s0;
            pack_half_ref(blk, &pk[b].pair[j / 2], j % 2);
        }
}

void osp_pack_q8(const osp_q8_block *a, int64_t a_stride, int64_t nb, osp_q8_pack *pk) {
#ifdef OSP_X86
    if (detect() == ISA_VNNI) {
        pack_q8_vnni(a, a_stride, nb, pk);
        return;
    }
#endif
    pack_q8_ref(a, a_stride, nb, pk);
}

static void pack_q8_row_ref(const osp_q8_block *a, int64_t nb, osp_q8_pair *bp) {
    for (int64_t b = 0; b < nb; b += 2) {
        memset(&bp[b / 2], 0, sizeof bp[0]); /* a last odd block's high half stays zero */
        for (int h = 0; h < 2 && b + h < nb; h++) pack_half_ref(a + b + h, &bp[b / 2], h);
    }
}

void osp_pack_q8_row(const osp_q8_block *a, int64_t nb, osp_q8_pair *bp) {
#ifdef OSP_X86
    if (detect() == ISA_VNNI)
        pack_q8_row_vnni(a, nb, bp);
    else
#endif
        pack_q8_row_ref(a, nb, bp);
    float *sums = (float *)(void *)(bp + (nb + 1) / 2);
    for (int64_t b = 0; b < nb; b++) sums[b] = a[b].s;
}

osp_qdot_gemv_fn osp_qdot_gemv_for(uint32_t type) {
#ifdef OSP_X86
    if (detect() == ISA_VNNI) {
        switch (type) {
        case OSP_DTYPE_Q8_0: return gemv_q8_0_vnni;
        case OSP_DTYPE_Q4_0: return gemv_q4_0_vnni;
        case OSP_DTYPE_Q4_1: return gemv_q4_1_vnni;
        case OSP_DTYPE_Q5_0: return gemv_q5_0_vnni;
        case OSP_DTYPE_Q5_1: return gemv_q5_1_vnni;
        case OSP_DTYPE_Q4_K: return gemv_q4_k_vnni;
        case OSP_DTYPE_Q5_K: return gemv_q5_k_vnni;
        case OSP_DTYPE_Q6_K: return gemv_q6_k_vnni;
        default: return NULL;
        }
    }
#else
    (void)type;
#endif
    return NULL;
}

osp_qdot_tile_fn osp_qdot_tile_padded_for(uint32_t type, int64_t n_left, int *n) {
    *n = 1;
#ifdef OSP_X86
    if (detect() != ISA_VNNI || n_left < OSP_QDOT_PAD_MIN || n_left > 8) return NULL;
    if (type == OSP_DTYPE_Q8_0 && n_left < 4) return NULL; /* its GEMV is cheaper for 3 (measured) */
    const int w = n_left <= 4 ? 4 : n_left <= 6 ? 6 : 8;
#define PAD(T4, T6, T8) return *n = w, w == 4 ? (T4) : w == 6 ? (T6) : (T8)
    switch (type) {
    case OSP_DTYPE_Q8_0: PAD(tile_q8_0_vnnip4, tile_q8_0_vnnip6, tile_q8_0_vnni8);
    case OSP_DTYPE_Q4_0: PAD(tile_q4_0_vnnip4, tile_q4_0_vnnip6, tile_q4_0_vnni8);
    case OSP_DTYPE_Q4_1: PAD(tile_q4_1_vnnip4, tile_q4_1_vnnip6, tile_q4_1_vnni8);
    case OSP_DTYPE_Q5_0: PAD(tile_q5_0_vnnip4, tile_q5_0_vnnip6, tile_q5_0_vnni8);
    case OSP_DTYPE_Q5_1: PAD(tile_q5_1_vnnip4, tile_q5_1_vnnip6, tile_q5_1_vnni8);
    case OSP_DTYPE_Q4_K: PAD(tile_q4_k_vnnip4, tile_q4_k_vnnip6, tile_q4_k_vnni8);
    case OSP_DTYPE_Q5_K: PAD(tile_q5_k_vnnip4, tile_q5_k_vnnip6, tile_q5_k_vnni8);
    case OSP_DTYPE_Q6_K: PAD(tile_q6_k_vnnip4, tile_q6_k_vnnip6, tile_q6_k_vnni8);
    default: break;
    }
#undef PAD
#else
    (void)type;
    (void)n_left;
#endif
    return NULL;
}

osp_qdot_tile_fn osp_qdot_tile_for(uint32_t type, int64_t max_n, int *n, bool *packed) {
    *n = 1;
    *packed = false;
#ifdef OSP_X86
    const isa_t isa = detect();
#define TILE(NAME, NT, PK) return *n = (NT), *packed = (PK), NAME
    if (isa == ISA_VNNI && max_n >= 16)
        switch (type) {
        case OSP_DTYPE_Q8_0: TILE(tile_q8_0_vnni16, 16, true);
        case OSP_DTYPE_Q4_0: TILE(tile_q4_0_vnni16, 16, true);
        case OSP_DTYPE_Q4_1: TILE(tile_q4_1_vnni16, 16, true);
        case OSP_DTYPE_Q5_0: TILE(tile_q5_0_vnni16, 16, true);
        case OSP_DTYPE_Q5_1: TILE(tile_q5_1_vnni16, 16, true);
        default: break;
        }
    if (isa == ISA_VNNI && max_n >= 8)
        switch (type) {
        case OSP_DTYPE_Q8_0: TILE(tile_q8_0_vnni8, 8, true);
        case OSP_DTYPE_Q4_0: TILE(tile_q4_0_vnni8, 8, true);
        case OSP_DTYPE_Q4_1: TILE(tile_q4_1_vnni8, 8, true);
        case OSP_DTYPE_Q5_0: TILE(tile_q5_0_vnni8, 8, true);
        case OSP_DTYPE_Q5_1: TILE(tile_q5_1_vnni8, 8, true);
        case OSP_DTYPE_Q4_K: TILE(tile_q4_k_vnni8, 8, true);
        case OSP_DTYPE_Q5_K: TILE(tile_q5_k_vnni8, 8, true);
        case OSP_DTYPE_Q6_K: TILE(tile_q6_k_vnni8, 8, true);
        default: break;
        }
    if (isa == ISA_VNNI && max_n >= 4) /* 4-7 tokens: one weight pass for them all, not one each */
        switch (type) {
        case OSP_DTYPE_Q2_K: TILE(tile_q2_k_vnni4, 4, false);
        case OSP_DTYPE_Q3_K: TILE(tile_q3_k_vnni4, 4, false);
        case OSP_DTYPE_Q4_K: TILE(tile_q4_k_vnni4, 4, false);
        case OSP_DTYPE_Q5_K: TILE(tile_q5_k_vnni4, 4, false);
        case OSP_DTYPE_Q6_K: TILE(tile_q6_k_vnni4, 4, false);
        /* the AVX2 tiles: bit-identical to the AVX512-VNNI one-token kernels (test_families_agree) */
        case OSP_DTYPE_Q8_0: TILE(tile_q8_0_avx24, 4, false);
        case OSP_DTYPE_Q4_0: TILE(tile_q4_0_avx24, 4, false);
        case OSP_DTYPE_Q4_1: TILE(tile_q4_1_avx24, 4, false);
        case OSP_DTYPE_Q5_0: TILE(tile_q5_0_avx24, 4, false);
        case OSP_DTYPE_Q5_1: TILE(tile_q5_1_avx24, 4, false);
        default: break;
        }
    if (isa == ISA_AVX2 && max_n >= 4)
        switch (type) {
        case OSP_DTYPE_Q8_0: TILE(tile_q8_0_avx24, 4, false);
        case OSP_DTYPE_Q4_0: TILE(tile_q4_0_avx24, 4, false);
        case OSP_DTYPE_Q4_1: TILE(tile_q4_1_avx24, 4, false);
        case OSP_DTYPE_Q5_0: TILE(tile_q5_0_avx24, 4, false);
        case OSP_DTYPE_Q5_1: TILE(tile_q5_1_avx24, 4, false);
        case OSP_DTYPE_Q2_K: TILE(tile_q2_k_avx24, 4, false);
        case OSP_DTYPE_Q3_K: TILE(tile_q3_k_avx24, 4, false);
        case OSP_DTYPE_Q4_K: TILE(tile_q4_k_avx24, 4, false);
        case OSP_DTYPE_Q5_K: TILE(tile_q5_k_avx24, 4, false);
        case OSP_DTYPE_Q6_K: TILE(tile_q6_k_avx24, 4, false);
        default: break;
        }
#undef TILE
#else
    (void)type;
    (void)max_n;
#endif
    return NULL;
}
