/* One-level activations for the 32-value block types (see qdot8b.h for the arithmetic every kernel
 * shares): the quantizer, the packs, the portable kernels (the definition), the AVX2 and AVX512-VNNI
 * one-token kernels (256 bits: a block's 32 products are one register), AVX2 tiles of 4 and 8 tokens
 * on packs, and on AVX512-VNNI the GEMV (block pairs in 512 bits, four rows at a time) and the tiles
 * over token pairs on packs (4, 6, 8 and 16 tokens), which the matmul schedules as it does the
 * K-quants' (backend_cpu.c, matmul_onelevel).
 *
 * Per (weight row, token pair, block) a tile does one vpdpbusd (the integer sum, started from the
 * weight block's correction), one conversion, the dw d_a product and one FMA: 4 operations on the
 * vector ports where the two-level tiles (qdot.c) do 6-7, and 2 loads from the pack (codes, scales).
 * The weight block's values are built in 512 bits as qdot.c's pair tiles build them (Q4: 16 bytes
 * broadcast to the four 128-bit lanes, lanes 1 and 3 shifted by 4, masked; Q5: the fifth bits as a
 * byte mask), once per block for all the tile's tokens.
 * Weight layouts: ggml-common.h (block_q8_0, block_q4_0, block_q4_1, block_q5_0, block_q5_1). */
#include "backend/cpu/qdot8b.h"

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
 * value for value (amax exact in any order, x * id rounded to nearest even by the conversion, the
 * integer sum exact). */
static bool quantize_q8b_avx512(const float *xb, osp_q8b_block *o) {
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    const __m512 z0 = _mm512_sub_ps(v0, v0), z1 = _mm512_sub_ps(v1, v1); /* NaN exactly for NaN, inf */
    if (_mm512_cmp_ps_mask(z0, z0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(z1, z1, _CMP_UNORD_Q)) return false;
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
    const __m512 idv = _mm512_set1_ps(id);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, idv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, idv));
    _mm_storeu_si128((__m128i *)(void *)o->qs, _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128((__m128i *)(void *)(o->qs + 16), _mm512_cvtepi32_epi8(q1));
    const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    o->d = d;
    o->s = d * (float)sum;
    return true;
}
#endif

void osp_quantize_row_q8b(const float *restrict x, osp_q8b_block *restrict y, int64_t n) {
    for (int64_t b = 0; b < n / OSP_Q8B_BLOCK; b++) {
        const float *xb = x + b * OSP_Q8B_BLOCK;
        osp_q8b_block *o = y + b;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
        if (quantize_q8b_avx512(xb, o)) continue;
#endif
        float amax = 0.0f;
        bool finite = true;
        for (int i = 0; i < OSP_Q8B_BLOCK; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            finite = finite && isfinite(xb[i]);
        }
        if (!finite) { /* non-finite activations give NaN results, never UB in the casts */
            memset(o->qs, 0, sizeof o->qs);
            o->d = o->s = NAN;
            continue;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        for (int i = 0; i < OSP_Q8B_BLOCK; i++) {
            const int q = (int)nearbyintf(xb[i] * id); /* |x id| <= 127 */
            o->qs[i] = (int8_t)q;
            sum += q;
        }
        o->d = d;
        o->s = d * (float)sum;
    }
}

bool osp_qdot8b_supports(uint32_t type) {
    return type == OSP_DTYPE_Q8_0 || type == OSP_DTYPE_Q4_0 || type == OSP_DTYPE_Q4_1 || type == OSP_DTYPE_Q5_0 ||
           type == OSP_DTYPE_Q5_1;
}

/* ---- the packs ---------------------------------------------------------------------------------- */

/* the codes' storage of osp_q8b_pair: XOR 0x80 (+ 128) for the types with signed weight values */
static uint8_t code_xor(uint32_t type) {
    return type == OSP_DTYPE_Q8_0 || type == OSP_DTYPE_Q4_0 || type == OSP_DTYPE_Q5_0 ? 0x80 : 0;
}

/* half h of pair o from block blk (zeros where blk is NULL) */
static void pair_half(const osp_q8b_block *blk, uint8_t x, int h, osp_q8b_pair *o) {
    for (int i = 0; i < 32; i++) o->qs[32 * h + i] = blk ? (int8_t)((uint8_t)blk->qs[i] ^ x) : 0;
    for (int l = 0; l < 8; l++) o->d[8 * h + l] = blk ? blk->d : 0.0f;
}

#if defined(__x86_64__)
/* The same on AVX512 (about 1 % of a tile's work where the portable loops took 3-4 % of a prompt). */
__attribute__((target("avx2,avx512f,avx512bw,avx512vl"))) static void pack_q8b_avx512(uint8_t x, const osp_q8b_block *a,
                                                                                    int64_t as, int64_t nb,
                                                                                    osp_q8b_pack *pk) {
    const __m512i xv = _mm512_set1_epi8((char)x);
    for (int64_t b = 0; b < nb; b++) {
        for (int k = 0; k < 4; k++) {
            const osp_q8b_block *a0 = a + 2 * k * as + b, *a1 = a0 + as;
            const __m512i q = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)a0->qs)),
                _mm256_loadu_si256((const __m256i *)(const void *)a1->qs), 1);
            _mm512_store_si512((void *)pk[b].pair[k].qs, _mm512_xor_si512(q, xv));
            _mm512_store_ps(pk[b].pair[k].d, _mm512_mask_broadcastss_ps(_mm512_set1_ps(a0->d), 0xff00, _mm_set_ss(a1->d)));
            pk[b].s[2 * k] = a0->s, pk[b].s[2 * k + 1] = a1->s;
        }
    }
}
#endif

void osp_pack_q8b(uint32_t type, const osp_q8b_block *a, int64_t a_stride, int64_t nb, osp_q8b_pack *pk) {
    const uint8_t x = code_xor(type);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
        pack_q8b_avx512(x, a, a_stride, nb, pk);
        return;
    }
#endif
    for (int64_t b = 0; b < nb; b++)
        for (int j = 0; j < 8; j++) { /* token j: half j % 2 of pair j / 2 */
            const osp_q8b_block *blk = a + j * a_stride + b;
            pair_half(blk, x, j % 2, &pk[b].pair[j / 2]);
            pk[b].s[j] = blk->s;
        }
}

size_t osp_pack_q8b_row_bytes(int64_t nb) {
    return (size_t)(nb + 1) / 2 * sizeof(osp_q8b_pair) + (size_t)nb * sizeof(float);
}

void osp_pack_q8b_row(uint32_t type, const osp_q8b_block *a, int64_t nb, osp_q8b_pair *bp) {
    const uint8_t x = code_xor(type);
    float *s = (float *)(void *)(bp + (nb + 1) / 2);
    for (int64_t i = 0; i < (nb + 1) / 2; i++) {
        pair_half(a + 2 * i, x, 0, bp + i);
        pair_half(2 * i + 1 < nb ? a + 2 * i + 1 : NULL, x, 1, bp + i);
    }
    for (int64_t b = 0; b < nb; b++) s[b] = a[b].s;
}

/* ---- the portable kernels ------------------------------------------------------------------------ */

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return osp_fp16_to_fp32(h);
}

/* The block's 32 weight values as signed integers (qdot8b.h's v), its size and whether it has a min. */
static int block_values(uint32_t type, const uint8_t *p, int *v) {
    uint32_t qh;
    switch (type) {
    case OSP_DTYPE_Q8_0:
        for (int i = 0; i < 32; i++) v[i] = ((const int8_t *)(p + 2))[i];
        return 34;
    case OSP_DTYPE_Q4_0:
    case OSP_DTYPE_Q4_1: {
        const uint8_t *q = p + (type == OSP_DTYPE_Q4_0 ? 2 : 4);
        const int sub = type == OSP_DTYPE_Q4_0 ? 8 : 0;
        for (int i = 0; i < 16; i++) v[i] = (q[i] & 0x0f) - sub, v[i + 16] = (q[i] >> 4) - sub;
        return type == OSP_DTYPE_Q4_0 ? 18 : 20;
    }
    default: { /* Q5_0: qh at 2, nibbles at 6; Q5_1: at 4 and 8 */
        const int five0 = type == OSP_DTYPE_Q5_0, sub = five0 ? 16 : 0;
        memcpy(&qh, p + (five0 ? 2 : 4), 4);
        const uint8_t *q = p + (five0 ? 6 : 8);
        for (int i = 0; i < 16; i++) {
            v[i] = ((q[i] & 0x0f) | (int)((qh >> i) & 1u) << 4) - sub;
            v[i + 16] = ((q[i] >> 4) | (int)((qh >> (i + 16)) & 1u) << 4) - sub;
        }
        return five0 ? 22 : 24;
    }
    }
}

static float dot8b_ref(uint32_t type, const void *w, const osp_q8b_block *a, int64_t nb) {
    const uint8_t *p = w;
    const bool has_min = type == OSP_DTYPE_Q4_1 || type == OSP_DTYPE_Q5_1;
    float A[2][8] = {{0}}, off = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int v[32];
        const int bytes = block_values(type, p, v);
        const float sc = half_at(p) * a[b].d;
        for (int l = 0; l < 8; l++) {
            int32_t I = 0;
            for (int i = 0; i < 4; i++) I += v[4 * l + i] * a[b].qs[4 * l + i];
            A[b & 1][l] = fmaf((float)I, sc, A[b & 1][l]);
        }
        if (has_min) off = fmaf(half_at(p + 2), a[b].s, off);
        p += bytes;
    }
    float t[8];
    for (int l = 0; l < 8; l++) t[l] = A[0][l] + A[1][l];
    const float u0 = t[0] + t[4], u1 = t[1] + t[5], u2 = t[2] + t[6], u3 = t[3] + t[7];
    const float v0 = u0 + u2, v1 = u1 + u3;
    const float y = v0 + v1;
    return has_min ? y + off : y;
}
static float dot8b_q8_0_ref(const void *w, const osp_q8b_block *a, int64_t nb) { return dot8b_ref(OSP_DTYPE_Q8_0, w, a, nb); }
static float dot8b_q4_0_ref(const void *w, const osp_q8b_block *a, int64_t nb) { return dot8b_ref(OSP_DTYPE_Q4_0, w, a, nb); }
static float dot8b_q4_1_ref(const void *w, const osp_q8b_block *a, int64_t nb) { return dot8b_ref(OSP_DTYPE_Q4_1, w, a, nb); }
static float dot8b_q5_0_ref(const void *w, const osp_q8b_block *a, int64_t nb) { return dot8b_ref(OSP_DTYPE_Q5_0, w, a, nb); }
static float dot8b_q5_1_ref(const void *w, const osp_q8b_block *a, int64_t nb) { return dot8b_ref(OSP_DTYPE_Q5_1, w, a, nb); }

osp_qdot8b_fn osp_qdot8b_ref_for(uint32_t type) {
    switch (type) {
    case OSP_DTYPE_Q8_0: return dot8b_q8_0_ref;
    case OSP_DTYPE_Q4_0: return dot8b_q4_0_ref;
    case OSP_DTYPE_Q4_1: return dot8b_q4_1_ref;
    case OSP_DTYPE_Q5_0: return dot8b_q5_0_ref;
    case OSP_DTYPE_Q5_1: return dot8b_q5_1_ref;
    default: return NULL;
    }
}

/* the GEMV of a CPU without a SIMD one: the one-token kernel row by row */
#define GEMV8B_LOOP(NAME, DOT)                                                                     \
    static void NAME(const void *w, size_t rb, const osp_q8b_block *a, const osp_q8b_pair *bp, int64_t nb, float *y, \
                     int64_t nrows) {                                                              \
        (void)bp;                                                                                  \
        for (int64_t r = 0; r < nrows; r++) y[r] = DOT((const uint8_t *)w + (size_t)r * rb, a, nb); \
    }
GEMV8B_LOOP(gemv8b_q8_0_ref, dot8b_q8_0_ref)
GEMV8B_LOOP(gemv8b_q4_0_ref, dot8b_q4_0_ref)
GEMV8B_LOOP(gemv8b_q4_1_ref, dot8b_q4_1_ref)
GEMV8B_LOOP(gemv8b_q5_0_ref, dot8b_q5_0_ref)
GEMV8B_LOOP(gemv8b_q5_1_ref, dot8b_q5_1_ref)

/* ---- x86: one-token kernels in 256 bits (AVX2 and AVX512-VNNI) ----------------------------------
 * A block's 32 values are one register in value order (byte i = value i); lane l's int32 is I[l]:
 * for the signed values (Q8_0, Q4_0, Q5_0) the sign moves onto the activations (|v| * sign(a, v), as
 * ggml does; |v| <= 128 fits vpmaddubsw's pairs: 2 * 128 * 127 < 2^15), then vpmaddwd by ones (AVX2)
 * or one vpdpbusd (VNNI). */
#ifdef OSP_X86
#define TGT8B_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TGT8B_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define UNROLL8B _Pragma("GCC unroll 16")

TGT8B_AVX2 static inline float hsum8b(__m256 v) { /* the order of qdot8b.h's final sum */
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
TGT8B_AVX2 static inline float half8b(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
#define LOAD256B(ptr) _mm256_loadu_si256((const __m256i *)(const void *)(ptr))
/* the nibbles of 16 bytes in value order: low nibbles (values 0..15), then high (16..31) */
TGT8B_AVX2 static inline __m256i nibbles256(const uint8_t *q) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)(const void *)q);
    const __m128i m4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}
/* 0x10 in byte i where bit i of the u32 at qh is set */
TGT8B_AVX2 static inline __m256i fifth_bits256(const uint8_t *qh) {
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h),
                                               _mm256_set_epi64x(0x0303030303030303LL, 0x0202020202020202LL,
                                                                 0x0101010101010101LL, 0));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}
#define CODES256_Q8_0(p) LOAD256B((p) + 2)
#define CODES256_Q4_0(p) nibbles256((p) + 2)
#define CODES256_Q4_1(p) nibbles256((p) + 4)
#define CODES256_Q5_0(p) _mm256_or_si256(nibbles256((p) + 6), fifth_bits256((p) + 2))
#define CODES256_Q5_1(p) _mm256_or_si256(nibbles256((p) + 8), fifth_bits256((p) + 4))
TGT8B_AVX2 static inline __m256i udot_avx2(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
TGT8B_VNNI static inline __m256i udot_vnni(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }

/* SUB: the offset of the signed values (Q4_0 8, Q5_0 16, Q8_0 0); MIN: Q4_1/Q5_1 (unsigned codes, min) */
#define ONE8B(NAME, TGT, UDOT, CODES, BYTES, SUB, MIN)                                             \
    TGT static float NAME(const void *w, const osp_q8b_block *a, int64_t nb) {                     \
        const uint8_t *p = w;                                                                      \
        __m256 A0 = _mm256_setzero_ps(), A1 = _mm256_setzero_ps();                                 \
        float off = 0.0f;                                                                          \
        for (int64_t b = 0; b < nb; b++, p += (BYTES)) {                                           \
            const __m256i q = CODES(p), qa = LOAD256B(a[b].qs);                                    \
            __m256i I;                                                                             \
            if (MIN) {                                                                             \
                I = UDOT(q, qa);                                                                   \
            } else {                                                                               \
                const __m256i v = (SUB) ? _mm256_sub_epi8(q, _mm256_set1_epi8(SUB)) : q;           \
                I = UDOT(_mm256_sign_epi8(v, v), _mm256_sign_epi8(qa, v));                         \
            }                                                                                      \
            const __m256 sc = _mm256_set1_ps(half8b(p) * a[b].d);                                  \
            if (b & 1) A1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), sc, A1);                        \
            else A0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), sc, A0);                              \
            if (MIN) off = fmaf(half8b(p + 2), a[b].s, off);                                       \
        }                                                                                          \
        const float y = hsum8b(_mm256_add_ps(A0, A1));                                             \
        return (MIN) ? y + off : y;                                                                \
    }
#define ONE8B_FAMILY(SUFFIX, TGT, UDOT)                                                            \
    ONE8B(dot8b_q8_0_##SUFFIX, TGT, UDOT, CODES256_Q8_0, 34, 0, 0)                                 \
    ONE8B(dot8b_q4_0_##SUFFIX, TGT, UDOT, CODES256_Q4_0, 18, 8, 0)                                 \
    ONE8B(dot8b_q4_1_##SUFFIX, TGT, UDOT, CODES256_Q4_1, 20, 0, 1)                                 \
    ONE8B(dot8b_q5_0_##SUFFIX, TGT, UDOT, CODES256_Q5_0, 22, 16, 0)                                \
    ONE8B(dot8b_q5_1_##SUFFIX, TGT, UDOT, CODES256_Q5_1, 24, 0, 1)
ONE8B_FAMILY(avx2, TGT8B_AVX2, udot_avx2)
ONE8B_FAMILY(vnni, TGT8B_VNNI, udot_vnni)
/* AVX2's GEMV: the one-token kernel row by row (AVX512-VNNI has its own below) */
GEMV8B_LOOP(gemv8b_q8_0_avx2, dot8b_q8_0_avx2)
GEMV8B_LOOP(gemv8b_q4_0_avx2, dot8b_q4_0_avx2)
GEMV8B_LOOP(gemv8b_q4_1_avx2, dot8b_q4_1_avx2)
GEMV8B_LOOP(gemv8b_q5_0_avx2, dot8b_q5_0_avx2)
GEMV8B_LOOP(gemv8b_q5_1_avx2, dot8b_q5_1_avx2)

/* AVX2 tiles on the packs (4 and 8 tokens: 4 tokens' accumulators fill the 16 registers, so the 8-token
 * tile runs the 4-token body on each half of the pack): each token's 256-bit lanes do the one-token
 * kernel's operations. The packed codes of Q8_0 are XORed back to signed for the sign trick; Q4_0 / Q5_0
 * multiply the unsigned codes + 128 by the small signed values directly (|pair| <= 2 * 255 * 16 < 2^15)
 * and add the block's correction -128 sum(v); Q4_1 / Q5_1 read the signed codes as stored. */
#define TILE8B_AVX2_BODY(NAME, CODES, BYTES, SUB, MIN)                                              \
    TGT8B_AVX2 static inline __attribute__((always_inline)) void NAME##_body(                      \
        const uint8_t *w, int64_t nb, const osp_q8b_pack *pk, int t0, float *y, int64_t ys) {      \
        const __m256i ones16 = _mm256_set1_epi16(1);                                               \
        __m256 A0[4], A1[4], off = _mm256_setzero_ps();                                            \
        UNROLL8B for (int j = 0; j < 4; j++) A0[j] = A1[j] = _mm256_setzero_ps();                  \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const uint8_t *p = w + b * (BYTES);                                                    \
            const __m256i q = CODES(p);                                                            \
            const __m256 dw = _mm256_set1_ps(half8b(p));                                           \
            const __m256i v = (SUB) ? _mm256_sub_epi8(q, _mm256_set1_epi8(SUB)) : q;              \
            const __m256i av = _mm256_sign_epi8(v, v);                                             \
            const __m256i corr = (SUB) ? _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(  \
                                             _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), v), ones16), 7)) \
                                       : _mm256_setzero_si256();                                   \
            UNROLL8B for (int j = 0; j < 4; j++) {                                                 \
                const osp_q8b_pair *pr = &pk[b].pair[(t0 + j) / 2];                                \
                const int h = (t0 + j) % 2;                                                        \
                const __m256i qa = LOAD256B(pr->qs + 32 * h);                                      \
                __m256i I;                                                                         \
                if (MIN) I = _mm256_madd_epi16(_mm256_maddubs_epi16(q, qa), ones16);               \
                else if (SUB) I = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(qa, v), ones16), corr); \
                else I = _mm256_madd_epi16(_mm256_maddubs_epi16(av, _mm256_sign_epi8(_mm256_xor_si256(qa, _mm256_set1_epi8((char)0x80)), v)), ones16); \
                const __m256 sc = _mm256_mul_ps(dw, _mm256_loadu_ps(pr->d + 8 * h));               \
                if (b & 1) A1[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), sc, A1[j]);              \
                else A0[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(I), sc, A0[j]);                    \
            }                                                                                      \
            if (MIN) off = _mm256_fmadd_ps(_mm256_set1_ps(half8b(p + 2)), _mm256_loadu_ps(pk[b].s), off); \
        }                                                                                          \
        float OFF[8];                                                                              \
        _mm256_storeu_ps(OFF, off);                                                                \
        UNROLL8B for (int j = 0; j < 4; j++) {                                                     \
            const float s = hsum8b(_mm256_add_ps(A0[j], A1[j]));                                   \
            y[j * ys] = (MIN) ? s + OFF[t0 + j] : s;                                               \
        }                                                                                          \
    }                                                                                              \
    TGT8B_AVX2 static void NAME##_4(const void *w, int64_t nb, const osp_q8b_pack *pk, float *y, int64_t ys) { \
        NAME##_body(w, nb, pk, 0, y, ys);                                                          \
    }                                                                                              \
    TGT8B_AVX2 static void NAME##_8(const void *w, int64_t nb, const osp_q8b_pack *pk, float *y, int64_t ys) { \
        NAME##_body(w, nb, pk, 0, y, ys);                                                          \
        NAME##_body(w, nb, pk, 4, y + 4 * ys, ys);                                                 \
    }
TILE8B_AVX2_BODY(tile8b_avx2_q8_0, CODES256_Q8_0, 34, 0, 0)
TILE8B_AVX2_BODY(tile8b_avx2_q4_0, CODES256_Q4_0, 18, 8, 0)
TILE8B_AVX2_BODY(tile8b_avx2_q4_1, CODES256_Q4_1, 20, 0, 1)
TILE8B_AVX2_BODY(tile8b_avx2_q5_0, CODES256_Q5_0, 22, 16, 0)
TILE8B_AVX2_BODY(tile8b_avx2_q5_1, CODES256_Q5_1, 24, 0, 1)

/* ---- AVX512-VNNI: the weight values in 512 bits ----
 * Q8_0, Q4_0, Q5_0 (signed values v, the signed operand of vpdpbusd against the pack's activation
 * codes + 128): I[l] = sum (a + 128) v - 128 sum v, the lane's correction -128 sum v formed once per
 * weight block (a vpdpbusd of 0x80 bytes with v, negated). Q4_1 / Q5_1: the unsigned codes against
 * the pack's signed activation codes, from zero. */
#define NIB_SHIFT8B                                                                                \
    _mm512_set_epi64(4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL, 0, 0, 4 * 0x0001000100010001LL, \
                     4 * 0x0001000100010001LL, 0, 0)
/* a block's 16 nibble bytes in value order in both 256-bit halves (the tiles), or the blocks at p (low)
 * and p1 (high) (the GEMV): the bytes in 128-bit lanes, lanes 1 and 3 shifted by 4, masked */
#define BC_Q4(p, QOFF)                                                                             \
    _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)((p) + (QOFF)))), \
                                       nib_shift),                                                 \
                     _mm512_set1_epi8(0x0f))
#define TWO_Q4(p, p1, QOFF)                                                                        \
    _mm512_and_si512(                                                                              \
        _mm512_srlv_epi16(                                                                         \
            _mm512_mask_broadcast_i32x4(                                                           \
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)((p) + (QOFF)))), 0xff00, \
                _mm_loadu_si128((const __m128i *)(const void *)((p1) + (QOFF)))),                  \
            nib_shift),                                                                            \
        _mm512_set1_epi8(0x0f))
/* the fifth bits (the u32 at qh0 for the low half, qh1 for the high) as a byte mask */
TGT8B_VNNI static inline __mmask64 fifth_mask(const uint8_t *qh0, const uint8_t *qh1) {
    uint32_t h0, h1;
    memcpy(&h0, qh0, 4);
    memcpy(&h1, qh1, 4);
    return (__mmask64)h0 | (__mmask64)h1 << 32;
}
/* Q5_1's codes: + 0x10 under the mask; Q5_0's values q - 16: - 16 where the fifth bit is clear */
#define Q5_CODES(q4, qh0, qh1) _mm512_mask_add_epi8(q4, fifth_mask(qh0, qh1), q4, _mm512_set1_epi8(0x10))
#define Q5_VALUES(q4, qh0, qh1) _mm512_mask_sub_epi8(q4, ~fifth_mask(qh0, qh1), q4, _mm512_set1_epi8(0x10))
/* one block in both halves (tiles: _T) or two blocks (GEMV: _G) */
#define W_Q8_0_T(p) _mm512_broadcast_i64x4(LOAD256B((p) + 2))
#define W_Q4_0_T(p) _mm512_sub_epi8(BC_Q4(p, 2), _mm512_set1_epi8(8))
#define W_Q4_1_T(p) BC_Q4(p, 4)
#define W_Q5_0_T(p) Q5_VALUES(BC_Q4(p, 6), (p) + 2, (p) + 2)
#define W_Q5_1_T(p) Q5_CODES(BC_Q4(p, 8), (p) + 4, (p) + 4)
#define W_Q8_0_G(p, p1) _mm512_inserti64x4(_mm512_castsi256_si512(LOAD256B((p) + 2)), LOAD256B((p1) + 2), 1)
#define W_Q4_0_G(p, p1) _mm512_sub_epi8(TWO_Q4(p, p1, 2), _mm512_set1_epi8(8))
#define W_Q4_1_G(p, p1) TWO_Q4(p, p1, 4)
#define W_Q5_0_G(p, p1) Q5_VALUES(TWO_Q4(p, p1, 6), (p) + 2, (p1) + 2)
#define W_Q5_1_G(p, p1) Q5_CODES(TWO_Q4(p, p1, 8), (p) + 4, (p1) + 4)

#define PLOAD(ptr) _mm512_load_si512((const void *)(ptr))
static inline int u32at(const uint8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return v;
}
/* the correction of the signed types' lanes: -128 x each lane's 4 weight values summed */
#define CORR8B(MIN, wv) \
    ((MIN) ? _mm512_setzero_si512() : _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), wv)))
/* I[l] of a pair register: weight values wv against the pair's codes at qsp (exact int32) */
#define ISUM8B(MIN, wv, corr, qsp)                                                                 \
    ((MIN) ? _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, PLOAD(qsp)) : _mm512_dpbusd_epi32(corr, PLOAD(qsp), wv))

/* ---- AVX512-VNNI GEMV: blocks 2i and 2i + 1 of one token in the low and high halves of a register, so
 * the low half is A_0 and the high half A_1, lane for lane the one-token kernel's operations; a last
 * odd block updates the low half alone (masked: adding zeros could turn a -0.0 into +0.0). Four rows
 * at a time share the activation loads; each row's stream prefetches GEMV8B_PREFETCH bytes ahead
 * (qdot.c's GEMV_PREFETCH, measured there: mmap'd pages stop the hardware prefetcher). */
#define GEMV8B_NR 4
#ifndef GEMV8B_PREFETCH
#define GEMV8B_PREFETCH 8192
#endif
TGT8B_VNNI static inline float hsum_halves8b(__m512 acc) {
    return hsum8b(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1))));
}
#define GEMV8B_KERNEL(NAME, TWO, BYTES, MIN)                                                       \
    TGT8B_VNNI static inline __attribute__((always_inline)) void NAME##_rows(                      \
        const uint8_t *w, size_t rb, const osp_q8b_pair *bp, int64_t nb, float *y, const int NR) { \
        const float *sums = (const float *)(const void *)(bp + (nb + 1) / 2);                      \
        const __m512i nib_shift = NIB_SHIFT8B;                                                     \
        const __m512i idx02 = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);      \
        __m512 acc[GEMV8B_NR];                                                                     \
        __m128 off[GEMV8B_NR]; /* lane 0 */                                                        \
        (void)nib_shift;                                                                           \
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) acc[r] = _mm512_setzero_ps(), off[r] = _mm_setzero_ps(); \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= nb; b += 2) {                                                              \
            const osp_q8b_pair *pr = bp + b / 2;                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {                                 \
                const uint8_t *p = w + (size_t)r * rb + (size_t)b * (BYTES), *p1 = p + (BYTES);    \
                _mm_prefetch((const char *)(p + GEMV8B_PREFETCH), _MM_HINT_T0);                    \
                uint32_t h0, h1; /* [d0, x0, d1, x1]: x the min of Q4_1/Q5_1, else unused */      \
                memcpy(&h0, p, 4);                                                                 \
                memcpy(&h1, p1, 4);                                                                \
                const __m128 f = _mm_cvtph_ps(_mm_insert_epi32(_mm_cvtsi32_si128((int)h0), (int)h1, 1)); \
                const __m512 dw = _mm512_permutexvar_ps(idx02, _mm512_castps128_ps512(f));         \
                const __m512i wv = TWO(p, p1);                                                     \
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ISUM8B(MIN, wv, CORR8B(MIN, wv), pr->qs)), \
                                         _mm512_mul_ps(dw, _mm512_load_ps(pr->d)), acc[r]);        \
                if (MIN) {                                                                         \
                    const __m128 m = _mm_movehdup_ps(f); /* [m0, m0, m1, m1] */                    \
                    off[r] = _mm_fmadd_ss(m, _mm_set_ss(sums[b]), off[r]);                         \
                    off[r] = _mm_fmadd_ss(_mm_movehl_ps(m, m), _mm_set_ss(sums[b + 1]), off[r]);   \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        if (b < nb) {                                                                              \
            const osp_q8b_pair *pr = bp + b / 2;                                                   \
            _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {                                 \
                const uint8_t *p = w + (size_t)r * rb + (size_t)b * (BYTES);                       \
                const __m512 dw = _mm512_set1_ps(half8b(p));                                       \
                const __m512i wv = TWO(p, p);                                                      \
                acc[r] = _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(ISUM8B(MIN, wv, CORR8B(MIN, wv), pr->qs)), \
                                               _mm512_mul_ps(dw, _mm512_load_ps(pr->d)), acc[r], 0x00ff); \
                if (MIN) off[r] = _mm_fmadd_ss(_mm_set_ss(half8b(p + 2)), _mm_set_ss(sums[b]), off[r]); \
            }                                                                                      \
        }                                                                                          \
        _Pragma("GCC unroll 4") for (int r = 0; r < NR; r++) {                                     \
            const float s = hsum_halves8b(acc[r]);                                                 \
            y[r] = (MIN) ? s + _mm_cvtss_f32(off[r]) : s;                                          \
        }                                                                                          \
    }                                                                                              \
    TGT8B_VNNI static void NAME(const void *w, size_t rb, const osp_q8b_block *a, const osp_q8b_pair *bp, int64_t nb, \
                                float *y, int64_t nrows) {                                         \
        (void)a;                                                                                   \
        int64_t r = 0;                                                                             \
        for (; r + GEMV8B_NR <= nrows; r += GEMV8B_NR) NAME##_rows((const uint8_t *)w + (size_t)r * rb, rb, bp, nb, y + r, GEMV8B_NR); \
        for (; r < nrows; r++) NAME##_rows((const uint8_t *)w + (size_t)r * rb, rb, bp, nb, y + r, 1); \
    }
GEMV8B_KERNEL(gemv8b_q8_0_vnni512, W_Q8_0_G, 34, 0)
GEMV8B_KERNEL(gemv8b_q4_0_vnni512, W_Q4_0_G, 18, 0)
GEMV8B_KERNEL(gemv8b_q4_1_vnni512, W_Q4_1_G, 20, 1)
GEMV8B_KERNEL(gemv8b_q5_0_vnni512, W_Q5_0_G, 22, 0)
GEMV8B_KERNEL(gemv8b_q5_1_vnni512, W_Q5_1_G, 24, 1)

/* ---- AVX512-VNNI tiles: NP token pairs on NG = ceil(NP / 4) packs of 8 tokens ----
 * Pair k's register holds tokens 2k (low) and 2k + 1 (high) against the weight block's values
 * broadcast to both halves; A0[k] / A1[k] the even / odd blocks' accumulators of both tokens. Per pair
 * and block: vpdpbusd (from the block's correction), conversion, dw d_a product, FMA. Q4_1/Q5_1's min
 * terms are one 256-bit FMA per block for each 8 tokens (the pack's s in token order). */
#define TILE8B_PAIR(g, k, b) (&pk[(g) * nb + (b)].pair[k])
#define TILE8B_STEP(A, pp, bb, WV, MIN, NP)                                                        \
    do {                                                                                           \
        const __m512i wv_ = WV(pp);                                                                \
        const __m512i corr_ = CORR8B(MIN, wv_);                                                    \
        /* Q4_1/Q5_1: d and m from one 32-bit broadcast, [d, m, d, m, ...] as floats, then split */ \
        const __m512 dm_ = (MIN) ? _mm512_cvtph_ps(_mm256_set1_epi32(u32at(pp))) : _mm512_setzero_ps(); \
        const __m512 dw_ = (MIN) ? _mm512_moveldup_ps(dm_) : _mm512_set1_ps(half8b(pp));          \
        UNROLL8B for (int k = 0; k < (NP); k++) {                                                  \
            const osp_q8b_pair *pr_ = TILE8B_PAIR(k / 4, k % 4, bb);                               \
            A[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ISUM8B(MIN, wv_, corr_, pr_->qs)),           \
                                   _mm512_mul_ps(dw_, _mm512_load_ps(pr_->d)), A[k]);              \
        }                                                                                          \
        if (MIN) {                                                                                 \
            const __m256 m_ = _mm512_castps512_ps256(_mm512_movehdup_ps(dm_));                     \
            UNROLL8B for (int g = 0; g < NG; g++) off[g] = _mm256_fmadd_ps(m_, _mm256_load_ps(pk[g * nb + (bb)].s), off[g]); \
        }                                                                                          \
    } while (0)
#define TILE8B_KERNEL(NAME, WV, BYTES, MIN, NP)                                                    \
    TGT8B_VNNI static void NAME(const void *w, int64_t nb, const osp_q8b_pack *pk, float *y, int64_t ys) { \
        enum { NG = ((NP) + 3) / 4 };                                                              \
        const uint8_t *p = w;                                                                      \
        const __m512i nib_shift = NIB_SHIFT8B;                                                     \
        (void)nib_shift;                                                                           \
        __m512 A0[NP], A1[NP];                                                                     \
        __m256 off[NG];                                                                            \
        UNROLL8B for (int k = 0; k < (NP); k++) A0[k] = A1[k] = _mm512_setzero_ps();               \
        UNROLL8B for (int g = 0; g < NG; g++) off[g] = _mm256_setzero_ps();                        \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= nb; b += 2, p += 2 * (BYTES)) {                                            \
            TILE8B_STEP(A0, p, b, WV, MIN, NP);                                                    \
            TILE8B_STEP(A1, p + (BYTES), b + 1, WV, MIN, NP);                                      \
        }                                                                                          \
        if (b < nb) TILE8B_STEP(A0, p, b, WV, MIN, NP);                                            \
        float OFF[8 * NG];                                                                         \
        UNROLL8B for (int g = 0; g < NG; g++) _mm256_storeu_ps(OFF + 8 * g, off[g]);               \
        UNROLL8B for (int k = 0; k < (NP); k++) {                                                  \
            const __m512d s0 = _mm512_castps_pd(A0[k]), s1 = _mm512_castps_pd(A1[k]);              \
            const float lo = hsum8b(_mm256_add_ps(_mm512_castps512_ps256(A0[k]), _mm512_castps512_ps256(A1[k]))); \
            const float hi = hsum8b(_mm256_add_ps(_mm256_castpd_ps(_mm512_extractf64x4_pd(s0, 1)),  \
                                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(s1, 1)))); \
            y[2 * k * ys] = (MIN) ? lo + OFF[2 * k] : lo;                                          \
            y[(2 * k + 1) * ys] = (MIN) ? hi + OFF[2 * k + 1] : hi;                                \
        }                                                                                          \
    }
#define TILE8B_WIDTHS(T, WV, BYTES, MIN)                                                           \
    TILE8B_KERNEL(tile8b_##T##_4, WV, BYTES, MIN, 2)                                               \
    TILE8B_KERNEL(tile8b_##T##_6, WV, BYTES, MIN, 3)                                               \
    TILE8B_KERNEL(tile8b_##T##_8, WV, BYTES, MIN, 4)                                               \
    TILE8B_KERNEL(tile8b_##T##_16, WV, BYTES, MIN, 8)
TILE8B_WIDTHS(q8_0, W_Q8_0_T, 34, 0)
TILE8B_WIDTHS(q4_0, W_Q4_0_T, 18, 0)
TILE8B_WIDTHS(q4_1, W_Q4_1_T, 20, 1)
TILE8B_WIDTHS(q5_0, W_Q5_0_T, 22, 0)
TILE8B_WIDTHS(q5_1, W_Q5_1_T, 24, 1)
#endif

/* ---- dispatch ---------------------------------------------------------------------------------- */

static bool have_vnni(void) { return !strcmp(osp_qdot_isa(), "avx512vnni"); }
static bool have_avx2(void) { return !strcmp(osp_qdot_isa(), "avx2"); }

#define PICK5(PREFIX, SUFFIX)                                                                      \
    switch (type) {                                                                                \
    case OSP_DTYPE_Q8_0: return PREFIX##q8_0##SUFFIX;                                              \
    case OSP_DTYPE_Q4_0: return PREFIX##q4_0##SUFFIX;                                              \
    case OSP_DTYPE_Q4_1: return PREFIX##q4_1##SUFFIX;                                              \
    case OSP_DTYPE_Q5_0: return PREFIX##q5_0##SUFFIX;                                              \
    case OSP_DTYPE_Q5_1: return PREFIX##q5_1##SUFFIX;                                              \
    default: return NULL;                                                                          \
    }

osp_qdot8b_fn osp_qdot8b_for(uint32_t type) {
#ifdef OSP_X86
    if (have_vnni()) PICK5(dot8b_, _vnni)
    if (have_avx2()) PICK5(dot8b_, _avx2)
#endif
    return osp_qdot8b_ref_for(type);
}

osp_qdot8b_gemv_fn osp_qdot8b_gemv_for(uint32_t type) {
#ifdef OSP_X86
    if (have_vnni()) PICK5(gemv8b_, _vnni512)
    if (have_avx2()) PICK5(gemv8b_, _avx2)
#endif
    PICK5(gemv8b_, _ref)
}

osp_qdot8b_tile_fn osp_qdot8b_tile_for(uint32_t type, int64_t n_left, int *n) {
    *n = 1;
#ifdef OSP_X86
    if (n_left < 3 || !osp_qdot8b_supports(type)) return NULL;
    if (have_avx2()) { /* 4 tokens, or 8 as two halves of one pack */
        *n = n_left <= 4 ? 4 : 8;
        if (*n == 4) PICK5(tile8b_avx2_, _4)
        PICK5(tile8b_avx2_, _8)
    }
    if (!have_vnni()) return NULL;
    const int wd = n_left >= 16 ? 16 : n_left <= 4 ? 4 : n_left <= 6 ? 6 : 8;
    *n = wd;
    switch (wd) {
    case 4: PICK5(tile8b_, _4)
    case 6: PICK5(tile8b_, _6)
    case 8: PICK5(tile8b_, _8)
    default: PICK5(tile8b_, _16)
    }
#else
    (void)type;
    (void)n_left;
    return NULL;
#endif
}
