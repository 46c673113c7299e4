/* One-level activations for the K-quants (see qdot8k.h for the arithmetic every kernel shares):
 * the quantizer, the portable kernels (the definition), on AVX512-VNNI the GEMV (one token against
 * four rows; also the one-token kernel) and the tiles over token pairs on packs, and on AVX2 one-token
 * kernels (no tiles there: prompts run them token by token).
 *
 * The integer part on AVX512: vpmaddubsw (unsigned codes x signed activation codes, pairs summed in
 * int16: |pair| <= 2 * 63 * 127 = 16002, no saturation for codes up to 6 bits) then vpdpwssd with the
 * sub-block scales as int16 (4 products a 32-bit lane, exactly the lane L[l] of qdot8k.h), accumulated
 * in int32 over the super-block: |L[l]| <= 8 * 128 * 4 * 63 * 127 < 2^25 (Q6_K's int8 scales are the
 * largest), so every partial sum is exact and the order of the integer operations does not matter.
 * Weight layouts: ggml-common.h (the K-quant blocks); the activation block is Q8_K's layout. */
#include "backend/cpu/qdot8k.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/qdot.h"
#include "core/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define OSP_X86 1
#endif

/* ---- quantizer ---------------------------------------------------------------------------------- */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
/* One block on AVX512 (false, nothing written, if a value is not finite): the scalar loop's arithmetic
 * value for value (amax exact in any order, x * id rounded to nearest even by the conversion; the
 * integer sums exact). */
static bool quantize_q8k_avx512(const float *xb, osp_q8k_block *o) {
    __m512 mx = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (int k = 0; k < 16; k++) {
        const __m512 v = _mm512_loadu_ps(xb + 16 * k), z = _mm512_sub_ps(v, v); /* NaN exactly for NaN, inf */
        bad |= _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(v));
    }
    if (bad) return false;
    const float amax = _mm512_reduce_max_ps(mx);
    const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    for (int k = 0; k < 16; k++) {
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16 * k), idv));
        _mm_storeu_si128((__m128i *)(void *)(o->qs + 16 * k), _mm512_cvtepi32_epi8(q));
        o->bsums[k] = (int16_t)_mm512_reduce_add_epi32(q);
    }
    o->d = d;
    return true;
}
#endif

void osp_quantize_row_q8k(const float *restrict x, osp_q8k_block *restrict y, int64_t n) {
    for (int64_t b = 0; b < n / OSP_Q8K_BLOCK; b++) {
        const float *xb = x + b * OSP_Q8K_BLOCK;
        osp_q8k_block *o = y + b;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
        if (quantize_q8k_avx512(xb, o)) continue;
#endif
        float amax = 0.0f;
        bool finite = true;
        for (int i = 0; i < OSP_Q8K_BLOCK; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            finite = finite && isfinite(xb[i]);
        }
        if (!finite) { /* non-finite activations give NaN results, never UB in the casts */
            memset(o, 0, sizeof *o);
            o->d = NAN;
            continue;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
        for (int k = 0; k < 16; k++) {
            int s = 0;
            for (int i = 16 * k; i < 16 * k + 16; i++) {
                const int q = (int)nearbyintf(xb[i] * id); /* |x id| <= 127 */
                o->qs[i] = (int8_t)q;
                s += q;
            }
            o->bsums[k] = (int16_t)s;
        }
        o->d = d;
    }
}

bool osp_qdot8k_supports(uint32_t type) {
    return type == OSP_DTYPE_Q2_K || type == OSP_DTYPE_Q3_K || type == OSP_DTYPE_Q4_K || type == OSP_DTYPE_Q5_K ||
           type == OSP_DTYPE_Q6_K;
}

/* ---- the portable kernels ------------------------------------------------------------------------ */

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return osp_fp16_to_fp32(h);
}

/* Q4_K/Q5_K's eight 6-bit scales and mins from their 12 packed bytes (core/dtype.c's layout), four
 * at a time in 32-bit words: bytes 0-3 hold sc0..3 (low 6 bits) and sc4..7's top 2 bits, bytes 4-7
 * m0..3 and m4..7's top bits, bytes 8-11 sc4..7's low 4 bits and m4..7's (high nibble). */
static inline void k4_scales8(const uint8_t *p, uint8_t *sc, uint8_t *m) {
    uint32_t u0, u1, u2;
    memcpy(&u0, p, 4);
    memcpy(&u1, p + 4, 4);
    memcpy(&u2, p + 8, 4);
    const uint32_t s03 = u0 & 0x3f3f3f3fu, m03 = u1 & 0x3f3f3f3fu;
    const uint32_t s47 = (u2 & 0x0f0f0f0fu) | ((u0 >> 2) & 0x30303030u);
    const uint32_t m47 = ((u2 >> 4) & 0x0f0f0f0fu) | ((u1 >> 2) & 0x30303030u);
    memcpy(sc, &s03, 4);
    memcpy(sc + 4, &s47, 4);
    memcpy(m, &m03, 4);
    memcpy(m + 4, &m47, 4);
}

/* One super-block's float steps (qdot8k.h): the lanes L[l] from the codes q[256] and the scales of
 * the 16-value groups scl[16], then acc[l] += L[l] (dw d_a) and off -= M (dmw d_a), each fused. */
static void sb_step(const uint8_t *q, const int32_t *scl, int32_t M, float dw, float dmw, const osp_q8k_block *a,
                    float *acc, float *off) {
    int32_t L[8] = {0};
    for (int j = 0; j < 8; j++)
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int i = 0; i < 4; i++) s += (int32_t)q[32 * j + 4 * l + i] * a->qs[32 * j + 4 * l + i];
            L[l] += scl[2 * j + (l >= 4)] * s;
        }
    const float dd = dw * a->d, dm = dmw * a->d;
    for (int l = 0; l < 8; l++) acc[l] = fmaf((float)L[l], dd, acc[l]);
    *off = fmaf(-(float)M, dm, *off);
}

/* hsum8's order (qdot.c): lanes l and l + 4, then 0 + 2 and 1 + 3, then those two; then + off. */
static inline float finish(const float *acc, float off) {
    const float t0 = acc[0] + acc[4], t1 = acc[1] + acc[5], t2 = acc[2] + acc[6], t3 = acc[3] + acc[7];
    const float u0 = t0 + t2, u1 = t1 + t3;
    const float s = u0 + u1;
    return s + off;
}

static float dot8k_q4_k_ref(const void *w, const osp_q8k_block *a, int64_t nsb) {
    const uint8_t *p = w;
    float acc[8] = {0}, off = 0.0f;
    for (int64_t s = 0; s < nsb; s++, p += 144, a++) {
        uint8_t sc[8], m[8], q[256];
        int32_t scl[16], M = 0;
        k4_scales8(p + 4, sc, m);
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++) q[32 * j + l] = (p[16 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0f;
            scl[2 * j] = scl[2 * j + 1] = sc[j];
            M += m[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
        }
        sb_step(q, scl, M, half_at(p), half_at(p + 2), a, acc, &off);
    }
    return finish(acc, off);
}

static float dot8k_q5_k_ref(const void *w, const osp_q8k_block *a, int64_t nsb) {
    const uint8_t *p = w;
    float acc[8] = {0}, off = 0.0f;
    for (int64_t s = 0; s < nsb; s++, p += 176, a++) {
        uint8_t sc[8], m[8], q[256];
        int32_t scl[16], M = 0;
        k4_scales8(p + 4, sc, m);
        for (int j = 0; j < 8; j++) {
            for (int l = 0; l < 32; l++)
                q[32 * j + l] = (uint8_t)(((p[48 + 32 * (j / 2) + l] >> (4 * (j & 1))) & 0x0f) | ((p[16 + l] >> j) & 1) << 4);
            scl[2 * j] = scl[2 * j + 1] = sc[j];
            M += m[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
        }
        sb_step(q, scl, M, half_at(p), half_at(p + 2), a, acc, &off);
    }
    return finish(acc, off);
}

static float dot8k_q6_k_ref(const void *w, const osp_q8k_block *a, int64_t nsb) {
    const uint8_t *p = w;
    float acc[8] = {0}, off = 0.0f;
    for (int64_t s = 0; s < nsb; s++, p += 210, a++) {
        const uint8_t *ql = p, *qh = p + 128;
        const int8_t *sc = (const int8_t *)(p + 192);
        uint8_t q[256];
        int32_t scl[16], M = 0;
        for (int j = 0; j < 8; j++) { /* j = 4h + s4 */
            const int h = j / 4, s4 = j % 4;
            for (int l = 0; l < 32; l++)
                q[32 * j + l] = (uint8_t)(((ql[64 * h + 32 * (s4 & 1) + l] >> (4 * (s4 >> 1))) & 0x0f) |
                                          ((qh[32 * h + l] >> (2 * s4)) & 3) << 4);
        }
        for (int k = 0; k < 16; k++) scl[k] = sc[k], M += sc[k] * a->bsums[k];
        const float d = half_at(p + 208);
        sb_step(q, scl, 32 * M, d, d, a, acc, &off);
    }
    return finish(acc, off);
}

static float dot8k_q3_k_ref(const void *w, const osp_q8k_block *a, int64_t nsb) {
    const uint8_t *p = w;
    float acc[8] = {0}, off = 0.0f;
    for (int64_t s = 0; s < nsb; s++, p += 110, a++) {
        const uint8_t *hm = p, *qs = p + 32, *ps = p + 96;
        uint8_t q[256];
        int32_t scl[16], M = 0;
        for (int j = 0; j < 8; j++) {
            const int h = j / 4, s4 = j % 4;
            for (int l = 0; l < 32; l++)
                q[32 * j + l] = (uint8_t)(((qs[32 * h + l] >> (2 * s4)) & 3) | ((hm[l] >> j) & 1) << 2);
        }
        for (int k = 0; k < 16; k++) { /* 6-bit scales stored + 32 (qdot.c's k3_scales) */
            const int lo = k < 8 ? ps[k] & 0x0f : ps[k - 8] >> 4;
            const int hi = (ps[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
            scl[k] = (lo | hi << 4) - 32;
            M += scl[k] * a->bsums[k];
        }
        const float d = half_at(p + 108);
        sb_step(q, scl, 4 * M, d, d, a, acc, &off);
    }
    return finish(acc, off);
}

static float dot8k_q2_k_ref(const void *w, const osp_q8k_block *a, int64_t nsb) {
    const uint8_t *p = w;
    float acc[8] = {0}, off = 0.0f;
    for (int64_t s = 0; s < nsb; s++, p += 84, a++) {
        const uint8_t *sc = p, *qs = p + 16;
        uint8_t q[256];
        int32_t scl[16], M = 0;
        for (int j = 0; j < 8; j++) {
            const int h = j / 4, s4 = j % 4;
            for (int l = 0; l < 32; l++) q[32 * j + l] = (qs[32 * h + l] >> (2 * s4)) & 3;
        }
        for (int k = 0; k < 16; k++) scl[k] = sc[k] & 0x0f, M += (sc[k] >> 4) * a->bsums[k];
        sb_step(q, scl, M, half_at(p + 80), half_at(p + 82), a, acc, &off);
    }
    return finish(acc, off);
}

osp_qdot8k_fn osp_qdot8k_ref_for(uint32_t type) {
    switch (type) {
    case OSP_DTYPE_Q2_K: return dot8k_q2_k_ref;
    case OSP_DTYPE_Q3_K: return dot8k_q3_k_ref;
    case OSP_DTYPE_Q4_K: return dot8k_q4_k_ref;
    case OSP_DTYPE_Q5_K: return dot8k_q5_k_ref;
    case OSP_DTYPE_Q6_K: return dot8k_q6_k_ref;
    default: return NULL;
    }
}

/* ---- the pack (the tiles' layout; portable) ---------------------------------------------------- */

static inline int32_t i16pair(int lo, int hi) { return (int32_t)((uint32_t)(uint16_t)lo | (uint32_t)(uint16_t)hi << 16); }

void osp_pack_q8k(const osp_q8k_block *a, int64_t a_stride, int64_t nsb, osp_q8k_pack *pk) {
    for (int64_t s = 0; s < nsb; s++)
        for (int j = 0; j < 8; j++) { /* token j: half j % 2 of pair j / 2 */
            const osp_q8k_block *blk = a + j * a_stride + s;
            osp_q8k_pack *o = pk + s;
            const int k = j / 2, h = j % 2;
            for (int sub = 0; sub < 8; sub++) memcpy(o->qs[sub][k] + 32 * h, blk->qs + 32 * sub, 32);
            for (int l = 0; l < 8; l++) o->dp[k][8 * h + l] = blk->d;
            o->d[j] = blk->d;
            const int16_t *b = blk->bsums;
            for (int i = 0; i < 4; i++) o->s32[i][j] = i16pair(b[4 * i] + b[4 * i + 1], b[4 * i + 2] + b[4 * i + 3]);
            for (int i = 0; i < 8; i++) o->s16[i][j] = i16pair(b[2 * i], b[2 * i + 1]);
        }
}

/* ---- AVX512-VNNI ------------------------------------------------------------------------------- */

#ifdef OSP_X86
#define TGT8K __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define FORCE_INLINE8K inline __attribute__((always_inline))
#define UNROLL8K _Pragma("GCC unroll 16")
#ifndef GEMV8K_PREFETCH
#define GEMV8K_PREFETCH 16384 /* qdot.c's GEMV_PREFETCH and hint, measured there */
#endif
#ifndef GEMV8K_PF_HINT
#define GEMV8K_PF_HINT _MM_HINT_T1
#endif

TGT8K static inline float hsum8k(__m256 v) { /* finish()'s order */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

TGT8K static inline float half8k(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

#define BCAST32(ptr) _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)(ptr)))
#define LOAD512(ptr) _mm512_loadu_si512((const void *)(ptr))
/* isum += sum of 4 products per lane, times the int16 scales sv (vpmaddubsw, vpdpwssd) */
#define MAC(isum, q, act, sv) isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(q, act), sv)
/* the two 256-bit halves' lanes added (exact in int32) */
#define FOLD(v) _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1))

/* GEMV rows (and the one-token kernel at NR = 1): one token's 64-byte activation chunk c holds
 * sub-blocks 2c and 2c + 1, against the weight codes of the same two sub-blocks in the low and high
 * halves; each half's lanes scaled by its sub-block's scale; the halves folded at the end of the
 * super-block give L[l]. Q4_K / Q5_K: chunk c's codes are the 32 bytes at qs + 32 c, low nibbles
 * (sub-block 2c) in the low half, high nibbles in the high half; Q5_K's fifth bits are bit 2c (low)
 * and 2c + 1 (high) of the 32 qh bytes, tested into a byte mask and added as 0x10. */
#define GEMV8K_NR 4
TGT8K static FORCE_INLINE8K void q45k_rows(const uint8_t *w, size_t rb, const osp_q8k_block *a, int64_t nsb, float *y,
                                           const int NR, const int FIVE) {
    const int BYTES = FIVE ? 176 : 144;
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i nib_shift = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL,
                                               0x0004000400040004LL, 0, 0, 0, 0);
    /* vpermw indices: 16-bit lanes 0-15 take scale 2c, 16-31 scale 2c + 1 (c added below) */
    const __m512i idx0 = _mm512_set_epi64(0x0001000100010001LL, 0x0001000100010001LL, 0x0001000100010001LL,
                                          0x0001000100010001LL, 0, 0, 0, 0);
    __m256 acc[GEMV8K_NR];
    float off[GEMV8K_NR];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps(), off[r] = 0.0f;
    for (int64_t s = 0; s < nsb; s++) {
        const osp_q8k_block *as = a + s;
        __m512i act[4];
        for (int c = 0; c < 4; c++) act[c] = LOAD512(as->qs + 64 * c);
        int32_t s32[8];
        for (int j = 0; j < 8; j++) s32[j] = as->bsums[2 * j] + as->bsums[2 * j + 1];
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
            const uint8_t *p = w + (size_t)r * rb + (size_t)s * (size_t)BYTES;
            for (int l = 0; l < BYTES; l += 64) _mm_prefetch((const char *)(p + GEMV8K_PREFETCH + l), GEMV8K_PF_HINT);
            uint8_t sc[8], m[8];
            k4_scales8(p + 4, sc, m);
            uint64_t sc64;
            memcpy(&sc64, sc, 8);
            const __m512i scl = _mm512_castsi256_si512(_mm256_castsi128_si256(
                _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc64))));
            const uint8_t *qs = p + (FIVE ? 48 : 16);
            const __m512i qh = FIVE ? BCAST32(p + 16) : _mm512_setzero_si512();
            __m512i isum = _mm512_setzero_si512();
            for (int c = 0; c < 4; c++) {
                __m512i q = _mm512_and_si512(_mm512_srlv_epi16(BCAST32(qs + 32 * c), nib_shift), m4);
                if (FIVE) {
                    const __m512i bit = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * c))),
                                                           _mm256_set1_epi8((char)(1 << (2 * c + 1))), 1);
                    q = _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bit), q, _mm512_set1_epi8(0x10));
                }
                const __m512i sv = _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, _mm512_set1_epi16((short)(2 * c))), scl);
                MAC(isum, q, act[c], sv);
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(FOLD(isum)), _mm256_set1_ps(half8k(p) * as->d), acc[r]);
            int32_t M = 0;
            for (int j = 0; j < 8; j++) M += m[j] * s32[j];
            off[r] = fmaf(-(float)M, half8k(p + 2) * as->d, off[r]);
        }
    }
    for (int r = 0; r < NR; r++) y[r] = hsum8k(acc[r]) + off[r];
}

/* Q6_K: per half h, chunks [4h | 4h + 1] and [4h + 2 | 4h + 3] (qdot.c's q6_k_rows codes); each half of
 * a chunk has two 16-value scales (lanes 0-3, 4-7). */
TGT8K static FORCE_INLINE8K void q6k_rows(const uint8_t *w, size_t rb, const osp_q8k_block *a, int64_t nsb, float *y,
                                          const int NR) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);
    const __m512i sh_lo = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL, 0x0002000200020002LL,
                                           0x0002000200020002LL, 0x0004000400040004LL, 0x0004000400040004LL,
                                           0x0004000400040004LL, 0x0004000400040004LL);
    const __m512i sh_hi = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL, 0x0002000200020002LL,
                                           0x0002000200020002LL, 0, 0, 0, 0);
    /* vpermw indices for the chunk [j | j + 1]: scales 2j, 2j + 1 | 2j + 2, 2j + 3, 8 lanes each */
    const __m512i idx0 = _mm512_set_epi64(0x0003000300030003LL, 0x0003000300030003LL, 0x0002000200020002LL,
                                          0x0002000200020002LL, 0x0001000100010001LL, 0x0001000100010001LL, 0, 0);
    __m256 acc[GEMV8K_NR];
    float off[GEMV8K_NR];
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps(), off[r] = 0.0f;
    for (int64_t s = 0; s < nsb; s++) {
        const osp_q8k_block *as = a + s;
        const __m256i bs = _mm256_loadu_si256((const __m256i *)(const void *)as->bsums);
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {
            const uint8_t *p = w + (size_t)r * rb + (size_t)s * 210;
            for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)(p + GEMV8K_PREFETCH + l), GEMV8K_PF_HINT);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p + 192)));
            const __m512i scl = _mm512_castsi256_si512(sc16);
            __m512i isum = _mm512_setzero_si512();
            for (int h = 0; h < 2; h++) {
                const __m512i l = LOAD512(p + 64 * h), qh = BCAST32(p + 128 + 32 * h);
                const __m512i q01 =
                    _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(qh, sh_lo), m30));
                const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                    _mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), m30));
                const __m512i sv01 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, _mm512_set1_epi16((short)(8 * h))), scl);
                const __m512i sv23 = _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, _mm512_set1_epi16((short)(8 * h + 4))), scl);
                MAC(isum, q01, LOAD512(as->qs + 128 * h), sv01);
                MAC(isum, q23, LOAD512(as->qs + 128 * h + 64), sv23);
            }
            const float d = half8k(p + 208);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(FOLD(isum)), _mm256_set1_ps(d * as->d), acc[r]);
            const __m256i mm = _mm256_madd_epi16(sc16, bs); /* sc_k S16_k in pairs: exact */
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(mm), _mm256_extracti128_si256(mm, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4e));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xb1));
            const int32_t M = 32 * _mm_cvtsi128_si32(t);
            off[r] = fmaf(-(float)M, d * as->d, off[r]);
        }
    }
    for (int r = 0; r < NR; r++) y[r] = hsum8k(acc[r]) + off[r];
}

#define GEMV8K(NAME, BODY_NR)                                                                      \
    TGT8K static void NAME(const void *w, size_t rb, const osp_q8k_block *a, int64_t nsb, float *y, int64_t nrows) { \
        int64_t r = 0;                                                                             \
        for (; r + GEMV8K_NR <= nrows; r += GEMV8K_NR) BODY_NR((const uint8_t *)w + (size_t)r * rb, rb, a, nsb, y + r, GEMV8K_NR); \
        for (; r < nrows; r++) BODY_NR((const uint8_t *)w + (size_t)r * rb, rb, a, nsb, y + r, 1); \
    }                                                                                              \
    TGT8K static float NAME##_one(const void *w, const osp_q8k_block *a, int64_t nsb) {           \
        float y;                                                                                   \
        BODY_NR((const uint8_t *)w, 0, a, nsb, &y, 1);                                             \
        return y;                                                                                  \
    }
#define Q4K_BODY(w, rb, a, nsb, y, NR) q45k_rows(w, rb, a, nsb, y, NR, 0)
#define Q5K_BODY(w, rb, a, nsb, y, NR) q45k_rows(w, rb, a, nsb, y, NR, 1)
#define Q6K_BODY(w, rb, a, nsb, y, NR) q6k_rows(w, rb, a, nsb, y, NR)
GEMV8K(gemv8k_q4_k_vnni, Q4K_BODY)
GEMV8K(gemv8k_q5_k_vnni, Q5K_BODY)
GEMV8K(gemv8k_q6_k_vnni, Q6K_BODY)

/* ---- tiles: NP token pairs on NG = ceil(NP / 4) packs of 8 tokens ----
 * Each pair's register holds tokens 2k (low) and 2k + 1 (high); the weight sub-block's codes are
 * broadcast to both halves, so each half's lanes are that token's L[l] (one int32 accumulator per
 * pair over the super-block). The offsets of each 8 tokens are one 256-bit vector: M by vpmaddwd of
 * the pack's int16 sum pairs with the weight's scale pairs. The per-super-block scale vectors are
 * broadcast from small arrays in memory (vpbroadcastd from memory is a load, not a shuffle):
 * measured, the super-block's setup (scales, mins, codes, the float step) is about as much work as
 * its multiplies at 4 pairs, hence the 8-pair (16-token) tiles. */
#ifndef TILE8K_PF
#define TILE8K_PF 1024 /* bytes ahead; measured: K = 8960 (ffn_down) tiles 30 % faster, K = 1536 unchanged */
#endif
#define TILE8K_PREFETCH(p, BYTES)                                                                  \
    do {                                                                                           \
        if (TILE8K_PF) for (int l_ = 0; l_ < (BYTES); l_ += 64) _mm_prefetch((const char *)(p) + TILE8K_PF + l_, _MM_HINT_T0); \
    } while (0)
#define TILE8K_ARGS const void *w, int64_t nsb, const osp_q8k_pack *pk, float *y, int64_t ys
#define TILE8K_DECL(NP, ODD)                                                                       \
    enum { NG = (2 * (NP) + (ODD) + 7) / 8 };                                                      \
    __m512 acc[NP];                                                                                \
    __m256 acc1 = _mm256_setzero_ps(); /* the odd token's (ODD) */                                 \
    __m256 off[NG];                                                                                \
    UNROLL8K for (int k = 0; k < (NP); k++) acc[k] = _mm512_setzero_ps();                          \
    UNROLL8K for (int g = 0; g < NG; g++) off[g] = _mm256_setzero_ps()
/* pair k of super-block s: pack k / 4 of the tile's groups */
#define PB(k) (pk + ((k) / 4) * nsb + s)
#define TILE8K_STORE(NP, ODD)                                                                      \
    do {                                                                                           \
        float OFF[8 * NG];                                                                         \
        UNROLL8K for (int g = 0; g < NG; g++) _mm256_storeu_ps(OFF + 8 * g, off[g]);               \
        UNROLL8K for (int k = 0; k < (NP); k++) {                                                  \
            y[2 * k * ys] = hsum8k(_mm512_castps512_ps256(acc[k])) + OFF[2 * k];                   \
            y[(2 * k + 1) * ys] =                                                                  \
                hsum8k(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[k]), 1))) + OFF[2 * k + 1]; \
        }                                                                                          \
        if (ODD) y[2 * (NP) * ys] = hsum8k(acc1) + OFF[2 * (NP)];                                  \
    } while (0)
#define TILE8K_FLOAT(NP, ODD, dv)                                                                  \
    UNROLL8K for (int k = 0; k < (NP); k++) acc[k] = _mm512_fmadd_ps(                              \
        _mm512_cvtepi32_ps(isum[k]), _mm512_mul_ps(dv, _mm512_load_ps(PB(k)->dp[(k) % 4])), acc[k]); \
    if (ODD) acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum1),                                     \
                                    _mm256_mul_ps(_mm512_castps512_ps256(dv), _mm256_load_ps(PB(NP)->dp[(NP) % 4])), acc1)
/* the odd token's MAC: token 2 NP, the low half of pair NP's slot, on 256 bits (half the work of a pair) */
#define MAC1(isum, q, actp, sv)                                                                    \
    isum = _mm256_dpwssd_epi32(isum, _mm256_maddubs_epi16(_mm512_castsi512_si256(q),               \
                                                          _mm256_load_si256((const __m256i *)(const void *)(actp))), \
                               _mm512_castsi512_si256(sv))
/* off[g] -= M_g (dmw d_a) for each 8 tokens: M_g = sum_i vpmaddwd(the pack's pairs, pairs[i]) (exact) */
#define TILE8K_OFFSET(NPAIRS, SUMS, pairs, dmw, SHIFT)                                             \
    UNROLL8K for (int g = 0; g < NG; g++) {                                                        \
        const osp_q8k_pack *pg = pk + g * nsb + s;                                                 \
        __m256i M = _mm256_setzero_si256();                                                        \
        UNROLL8K for (int i = 0; i < (NPAIRS); i++)                                                \
            M = _mm256_add_epi32(M, _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(const void *)pg->SUMS[i]), \
                                                      _mm256_set1_epi32(pairs[i])));               \
        off[g] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_slli_epi32(M, SHIFT)),                 \
                                  _mm256_mul_ps(_mm256_set1_ps(dmw), _mm256_load_ps(pg->d)), off[g]); \
    }

#define QK45_TILE8K(NAME, FIVE, NP, ODD)                                                           \
    TGT8K static void NAME(TILE8K_ARGS) {                                                          \
        const uint8_t *p = w;                                                                      \
        const __m512i m4 = _mm512_set1_epi8(0x0f);                                                 \
        TILE8K_DECL(NP, ODD);                                                                      \
        for (int64_t s = 0; s < nsb; s++, p += (FIVE) ? 176 : 144) {                               \
            TILE8K_PREFETCH(p, (FIVE) ? 176 : 144);                                                \
            uint8_t sc[8], m[8];                                                                   \
            k4_scales8(p + 4, sc, m);                                                              \
            int32_t scd[8], mp[4]; /* scales as int16 pairs (sc, sc); mins as pairs (m_2i, m_2i+1) */ \
            for (int j = 0; j < 8; j++) scd[j] = (int32_t)(sc[j] * 0x10001u);                     \
            for (int i = 0; i < 4; i++) mp[i] = i16pair(m[2 * i], m[2 * i + 1]);                   \
            const uint8_t *qs = p + ((FIVE) ? 48 : 16);                                            \
            const __m512i qh = (FIVE) ? BCAST32(p + 16) : _mm512_setzero_si512();                  \
            __m512i isum[NP];                                                                      \
            __m256i isum1 = _mm256_setzero_si256();                                                \
            UNROLL8K for (int k = 0; k < (NP); k++) isum[k] = _mm512_setzero_si512();              \
            for (int c = 0; c < 4; c++) {                                                          \
                const __m512i raw = BCAST32(qs + 32 * c);                                          \
                __m512i lo = _mm512_and_si512(raw, m4), hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4); \
                if (FIVE) {                                                                        \
                    const __m512i x10 = _mm512_set1_epi8(0x10);                                    \
                    lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << (2 * c)))), lo, x10); \
                    hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << (2 * c + 1)))), hi, x10); \
                }                                                                                  \
                const __m512i slo = _mm512_set1_epi32(scd[2 * c]), shi = _mm512_set1_epi32(scd[2 * c + 1]); \
                UNROLL8K for (int k = 0; k < (NP); k++) {                                          \
                    MAC(isum[k], lo, _mm512_load_si512((const void *)PB(k)->qs[2 * c][k % 4]), slo); \
                    MAC(isum[k], hi, _mm512_load_si512((const void *)PB(k)->qs[2 * c + 1][k % 4]), shi); \
                }                                                                                  \
                if (ODD) {                                                                         \
                    MAC1(isum1, lo, PB(NP)->qs[2 * c][(NP) % 4], slo);                             \
                    MAC1(isum1, hi, PB(NP)->qs[2 * c + 1][(NP) % 4], shi);                         \
                }                                                                                  \
            }                                                                                      \
            const __m512 dv = _mm512_set1_ps(half8k(p));                                           \
            TILE8K_FLOAT(NP, ODD, dv);                                                             \
            TILE8K_OFFSET(4, s32, mp, half8k(p + 2), 0);                                           \
        }                                                                                          \
        TILE8K_STORE(NP, ODD);                                                                     \
    }
QK45_TILE8K(tile8k_q4_k_16, 0, 8, 0)
QK45_TILE8K(tile8k_q4_k_8, 0, 4, 0)
QK45_TILE8K(tile8k_q4_k_7, 0, 3, 1)
QK45_TILE8K(tile8k_q4_k_6, 0, 3, 0)
QK45_TILE8K(tile8k_q4_k_5, 0, 2, 1)
QK45_TILE8K(tile8k_q4_k_4, 0, 2, 0)
QK45_TILE8K(tile8k_q4_k_3, 0, 1, 1)
QK45_TILE8K(tile8k_q5_k_16, 1, 8, 0)
QK45_TILE8K(tile8k_q5_k_8, 1, 4, 0)
QK45_TILE8K(tile8k_q5_k_7, 1, 3, 1)
QK45_TILE8K(tile8k_q5_k_6, 1, 3, 0)
QK45_TILE8K(tile8k_q5_k_5, 1, 2, 1)
QK45_TILE8K(tile8k_q5_k_4, 1, 2, 0)
QK45_TILE8K(tile8k_q5_k_3, 1, 1, 1)

/* Q6_K: qdot.c's pair-kernel codes (four sub-blocks per half from ql's two rows and qh, broadcast to
 * both halves); sub-block j's two 16-value scales by vpermw from the 16 widened int8 scales, whose
 * int16 pairs (sc_2i, sc_2i+1) are also M's multipliers. */
#define Q6K_TILE8K(NAME, NP, ODD)                                                                  \
    TGT8K static void NAME(TILE8K_ARGS) {                                                          \
        const uint8_t *p = w;                                                                      \
        const __m512i m4 = _mm512_set1_epi8(0x0f), m30 = _mm512_set1_epi8(0x30);                   \
        const __m512i idx0 = _mm512_set_epi64(0x0001000100010001LL, 0x0001000100010001LL, 0, 0,    \
                                              0x0001000100010001LL, 0x0001000100010001LL, 0, 0);   \
        TILE8K_DECL(NP, ODD);                                                                      \
        for (int64_t s = 0; s < nsb; s++, p += 210) {                                              \
            TILE8K_PREFETCH(p, 210);                                                               \
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(p + 192))); \
            const __m512i scl = _mm512_castsi256_si512(sc16);                                      \
            _Alignas(32) int32_t sp[8];                                                            \
            _mm256_store_si256((__m256i *)(void *)sp, sc16);                                       \
            __m512i isum[NP];                                                                      \
            __m256i isum1 = _mm256_setzero_si256();                                                \
            UNROLL8K for (int k = 0; k < (NP); k++) isum[k] = _mm512_setzero_si512();              \
            for (int h = 0; h < 2; h++) {                                                          \
                const __m512i l0 = BCAST32(p + 64 * h), l1 = BCAST32(p + 64 * h + 32), qh = BCAST32(p + 128 + 32 * h); \
                const __m512i q[4] = {                                                             \
                    _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30)), \
                    _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30)), \
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(qh, m30)), \
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),                \
                                    _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30)),              \
                };                                                                                 \
                UNROLL8K for (int s4 = 0; s4 < 4; s4++) {                                          \
                    const int j = 4 * h + s4;                                                      \
                    const __m512i sv = _mm512_permutexvar_epi16(_mm512_add_epi16(idx0, _mm512_set1_epi16((short)(2 * j))), scl); \
                    UNROLL8K for (int k = 0; k < (NP); k++)                                        \
                        MAC(isum[k], q[s4], _mm512_load_si512((const void *)PB(k)->qs[j][k % 4]), sv); \
                    if (ODD) MAC1(isum1, q[s4], PB(NP)->qs[j][(NP) % 4], sv);                      \
                }                                                                                  \
            }                                                                                      \
            const float d = half8k(p + 208);                                                       \
            const __m512 dv = _mm512_set1_ps(d);                                                   \
            TILE8K_FLOAT(NP, ODD, dv);                                                             \
            TILE8K_OFFSET(8, s16, sp, d, 5);                                                       \
        }                                                                                          \
        TILE8K_STORE(NP, ODD);                                                                     \
    }
Q6K_TILE8K(tile8k_q6_k_16, 8, 0)
Q6K_TILE8K(tile8k_q6_k_8, 4, 0)
Q6K_TILE8K(tile8k_q6_k_7, 3, 1)
Q6K_TILE8K(tile8k_q6_k_6, 3, 0)
Q6K_TILE8K(tile8k_q6_k_5, 2, 1)
Q6K_TILE8K(tile8k_q6_k_4, 2, 0)
Q6K_TILE8K(tile8k_q6_k_3, 1, 1)
#endif

/* the GEMV of the types without a SIMD one: the one-token kernel row by row */
#define GEMV_LOOP(NAME, DOT)                                                                       \
    static void NAME(const void *w, size_t rb, const osp_q8k_block *a, int64_t nsb, float *y, int64_t nrows) { \
        for (int64_t r = 0; r < nrows; r++) y[r] = DOT((const uint8_t *)w + (size_t)r * rb, a, nsb); \
    }
/* ---- AVX2 (no AVX512-VNNI): one-token kernels --------------------------------------------------
 * A sub-block of 32 codes is one 256-bit vector, so vpmaddubsw then vpmaddwd by the sub-block's int16
 * scales gives its 8 lanes' contributions to L[l] directly; the same float steps as everywhere. */
#ifdef OSP_X86
#define TGT8K_AVX2 __attribute__((target("avx2,fma,f16c")))
TGT8K_AVX2 static inline float hsum8k_avx2(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}
TGT8K_AVX2 static inline float half8k_avx2(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
#define LOAD256(ptr) _mm256_loadu_si256((const __m256i *)(const void *)(ptr))
/* acc += L (dd), L[l] = sum_j scv[j] (4 products of sub-block j's lane l) */
TGT8K_AVX2 static inline __m256 sb_avx2(const __m256i *q, const __m256i *scv, const osp_q8k_block *a, float dd, __m256 acc) {
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++)
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], LOAD256(a->qs + 32 * j)), scv[j]));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dd), acc);
}
TGT8K_AVX2 static inline float q45k_avx2(const void *w, const osp_q8k_block *a, int64_t nsb, const int FIVE) {
    const uint8_t *p = w;
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t s = 0; s < nsb; s++, a++, p += FIVE ? 176 : 144) {
        uint8_t sc[8], m[8];
        k4_scales8(p + 4, sc, m);
        const uint8_t *qs = p + (FIVE ? 48 : 16);
        const __m256i qh = FIVE ? LOAD256(p + 16) : _mm256_setzero_si256();
        __m256i q[8], scv[8];
        int32_t M = 0;
        for (int j = 0; j < 8; j++) {
            const __m256i raw = LOAD256(qs + 32 * (j / 2));
            q[j] = _mm256_and_si256(j & 1 ? _mm256_srli_epi16(raw, 4) : raw, m4);
            if (FIVE) q[j] = _mm256_or_si256(q[j], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, j), one), 4));
            scv[j] = _mm256_set1_epi16((short)sc[j]);
            M += m[j] * (a->bsums[2 * j] + a->bsums[2 * j + 1]);
        }
        acc = sb_avx2(q, scv, a, half8k_avx2(p) * a->d, acc);
        off = fmaf(-(float)M, half8k_avx2(p + 2) * a->d, off);
    }
    return hsum8k_avx2(acc) + off;
}
TGT8K_AVX2 static float dot8k_q4_k_avx2(const void *w, const osp_q8k_block *a, int64_t nsb) { return q45k_avx2(w, a, nsb, 0); }
TGT8K_AVX2 static float dot8k_q5_k_avx2(const void *w, const osp_q8k_block *a, int64_t nsb) { return q45k_avx2(w, a, nsb, 1); }
TGT8K_AVX2 static float dot8k_q6_k_avx2(const void *w, const osp_q8k_block *a, int64_t nsb) {
    const uint8_t *p = w;
    const __m256i m4 = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    float off = 0.0f;
    for (int64_t s = 0; s < nsb; s++, a++, p += 210) {
        const int8_t *sc = (const int8_t *)(p + 192);
        __m256i q[8], scv[8];
        for (int h = 0; h < 2; h++) {
            const __m256i l0 = LOAD256(p + 64 * h), l1 = LOAD256(p + 64 * h + 32), qh = LOAD256(p + 128 + 32 * h);
            q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
            q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        }
        int32_t M = 0;
        for (int j = 0; j < 8; j++) /* values 0..15 of sub-block j: scale 2j; 16..31: 2j + 1 */
            scv[j] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * j + 1]), _mm_set1_epi16(sc[2 * j]));
        for (int k = 0; k < 16; k++) M += sc[k] * a->bsums[k];
        const float d = half8k_avx2(p + 208);
        acc = sb_avx2(q, scv, a, d * a->d, acc);
        off = fmaf(-(float)(32 * M), d * a->d, off);
    }
    return hsum8k_avx2(acc) + off;
}
GEMV_LOOP(gemv8k_q4_k_avx2, dot8k_q4_k_avx2)
GEMV_LOOP(gemv8k_q5_k_avx2, dot8k_q5_k_avx2)
GEMV_LOOP(gemv8k_q6_k_avx2, dot8k_q6_k_avx2)
#endif

/* ---- dispatch ---------------------------------------------------------------------------------- */

static bool have_vnni(void) { return osp_qdot_isa_family() == OSP_QDOT_ISA_VNNI; }
static bool have_avx2(void) { return osp_qdot_isa_family() == OSP_QDOT_ISA_AVX2; }

osp_qdot8k_fn osp_qdot8k_for(uint32_t type) {
#ifdef OSP_X86
    if (have_vnni()) switch (type) {
        case OSP_DTYPE_Q4_K: return gemv8k_q4_k_vnni_one;
        case OSP_DTYPE_Q5_K: return gemv8k_q5_k_vnni_one;
        case OSP_DTYPE_Q6_K: return gemv8k_q6_k_vnni_one;
        default: break;
        }
    if (have_avx2()) switch (type) {
        case OSP_DTYPE_Q4_K: return dot8k_q4_k_avx2;
        case OSP_DTYPE_Q5_K: return dot8k_q5_k_avx2;
        case OSP_DTYPE_Q6_K: return dot8k_q6_k_avx2;
        default: break;
        }
#endif
    return osp_qdot8k_ref_for(type);
}

GEMV_LOOP(gemv8k_q2_k_ref, dot8k_q2_k_ref)
GEMV_LOOP(gemv8k_q3_k_ref, dot8k_q3_k_ref)
GEMV_LOOP(gemv8k_q4_k_ref, dot8k_q4_k_ref)
GEMV_LOOP(gemv8k_q5_k_ref, dot8k_q5_k_ref)
GEMV_LOOP(gemv8k_q6_k_ref, dot8k_q6_k_ref)

osp_qdot8k_gemv_fn osp_qdot8k_gemv_for(uint32_t type) {
#ifdef OSP_X86
    if (have_vnni()) switch (type) {
        case OSP_DTYPE_Q4_K: return gemv8k_q4_k_vnni;
        case OSP_DTYPE_Q5_K: return gemv8k_q5_k_vnni;
        case OSP_DTYPE_Q6_K: return gemv8k_q6_k_vnni;
        default: break;
        }
    if (have_avx2()) switch (type) {
        case OSP_DTYPE_Q4_K: return gemv8k_q4_k_avx2;
        case OSP_DTYPE_Q5_K: return gemv8k_q5_k_avx2;
        case OSP_DTYPE_Q6_K: return gemv8k_q6_k_avx2;
        default: break;
        }
#endif
    switch (type) {
    case OSP_DTYPE_Q2_K: return gemv8k_q2_k_ref;
    case OSP_DTYPE_Q3_K: return gemv8k_q3_k_ref;
    case OSP_DTYPE_Q4_K: return gemv8k_q4_k_ref;
    case OSP_DTYPE_Q5_K: return gemv8k_q5_k_ref;
    case OSP_DTYPE_Q6_K: return gemv8k_q6_k_ref;
    default: return NULL;
    }
}

osp_qdot8k_tile_fn osp_qdot8k_tile_for(uint32_t type, int64_t n_left, int *n) {
    *n = 1;
#ifdef OSP_X86
    if (!have_vnni() || n_left < 3) return NULL;
    const int wd = n_left >= 16 ? 16 : n_left >= 8 ? 8 : (int)n_left;
#define PICK(P) do { const osp_qdot8k_tile_fn t[] = {P##3, P##4, P##5, P##6, P##7, P##8, P##16}; return *n = wd, t[wd == 16 ? 6 : wd - 3]; } while (0)
    switch (type) {
    case OSP_DTYPE_Q4_K: PICK(tile8k_q4_k_);
    case OSP_DTYPE_Q5_K: PICK(tile8k_q5_k_);
    case OSP_DTYPE_Q6_K: PICK(tile8k_q6_k_);
    default: break;
    }
#undef PICK
#else
    (void)type;
    (void)n_left;
#endif
    return NULL;
}
