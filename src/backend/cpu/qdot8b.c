/* One-level activations for the 32-value block types (see qdot8b.h for the arithmetic every kernel
 * shares): the quantizer, the packs, the portable kernels (the definition), the AVX2 and AVX512-VNNI
 * one-token kernels (256 bits: a block's 32 products are one register, summed to one int32), AVX2
 * tiles of 4 and 8 tokens on packs, and on AVX512-VNNI the strips (16 weight rows in the 16 lanes of a
 * register, two or more tokens) and a one-token GEMV in the weights' own layout, which the matmul schedules
 * (backend_cpu.c, matmul_onelevel).
 *
 * Per (16 weight rows, token, block) a strip does 8 vpdpbusd (the block's 32 products for 16 rows, the
 * token's codes broadcast from memory 4 at a time), one conversion, the dw d_a product and one FMA (Q4_1 /
 * Q5_1 one more for the min): 11-12 operations on the vector ports for 16 rows, where the pair tiles
 * before them did 4 per (row, 2 tokens). The weight block's values are built two rows to a register as
 * the pair kernels built them (Q4: 16 bytes broadcast to the 128-bit lanes, lanes 1 and 3 shifted by 4,
 * masked; Q5: the fifth bits as a byte mask) and transposed (24 permutes) once per (strip, block) for
 * all the tokens.
 * The 16-row strips layout (qdot8b.h; made at load by the CPU backend with --no-mmap) stores those
 * transposed registers' dword order (Q4 / Q5 before the nibble split), so its GEMV and strip
 * (gemv16s, strip8s) load them with no transpose or gather.
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
    o->n128 = -128 * sum;
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
            o->n128 = 0;
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
        o->n128 = -128 * sum;
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

void osp_q8b_block_major(const osp_q8b_block *a, int64_t a_stride, int64_t nb, int64_t n, osp_q8b_block *out) {
    for (int64_t j = 0; j < n; j++)
        for (int64_t b = 0; b < nb; b++) out[b * n + j] = a[j * a_stride + b];
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
    float A = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int v[32];
        const int bytes = block_values(type, p, v);
        int32_t I = 0;
        for (int i = 0; i < 32; i++) I += v[i] * a[b].qs[i];
        const float sc = half_at(p) * a[b].d;
        A = fmaf((float)I, sc, A);
        if (has_min) A = fmaf(half_at(p + 2), a[b].s, A);
        p += bytes;
    }
    return A;
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
    static void NAME(const void *w, size_t rb, const osp_q8b_block *a, int64_t nb, float *y, int64_t nrows) { \
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

TGT8B_AVX2 static inline int32_t hsum8b_i32(__m256i v) { /* exact in any order */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
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
        float A = 0.0f;                                                                            \
        for (int64_t b = 0; b < nb; b++, p += (BYTES)) {                                           \
            const __m256i q = CODES(p), qa = LOAD256B(a[b].qs);                                    \
            __m256i I;                                                                             \
            if (MIN) {                                                                             \
                I = UDOT(q, qa);                                                                   \
            } else {                                                                               \
                const __m256i v = (SUB) ? _mm256_sub_epi8(q, _mm256_set1_epi8(SUB)) : q;           \
                I = UDOT(_mm256_sign_epi8(v, v), _mm256_sign_epi8(qa, v));                         \
            }                                                                                      \
            const float sc = half8b(p) * a[b].d;                                                   \
            A = fmaf((float)hsum8b_i32(I), sc, A);                                                 \
            if (MIN) A = fmaf(half8b(p + 2), a[b].s, A);                                           \
        }                                                                                          \
        return A;                                                                                  \
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
        float A[4] = {0.0f, 0.0f, 0.0f, 0.0f};                                                     \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const uint8_t *p = w + b * (BYTES);                                                    \
            const __m256i q = CODES(p);                                                            \
            const float dw = half8b(p);                                                            \
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
                const float sc = dw * pr->d[8 * h];                                                \
                A[j] = fmaf((float)hsum8b_i32(I), sc, A[j]);                                       \
                if (MIN) A[j] = fmaf(half8b(p + 2), pk[b].s[t0 + j], A[j]);                        \
            }                                                                                      \
        }                                                                                          \
        UNROLL8B for (int j = 0; j < 4; j++) y[j * ys] = A[j];                                     \
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

/* ---- AVX512-VNNI strips: 16 weight rows in the 16 lanes ----
 * Per block, two rows' 32 values as unsigned codes in one register (row 2q in the low 256 bits, 2q + 1
 * in the high: Q8_0 w + 128, Q4_0 / Q5_0 the codes q, Q4_1 / Q5_1 the codes), eight such registers
 * transposed so that register k's lane r holds row r's codes 4k..4k+3; vpdpbusd of register k with the
 * token's signed codes 4k..4k+3 broadcast adds their 4 products to every row's lane. Q8_0 / Q4_0 / Q5_0
 * start from the token block's -128 / -8 / -16 x sum(a.qs) (n128, shifted), which makes each lane the
 * exact int32 I of qdot8b.h; Q4_1 / Q5_1 start from zero. */
#define NIB_SHIFT8B                                                                                \
    _mm512_set_epi64(4 * 0x0001000100010001LL, 4 * 0x0001000100010001LL, 0, 0, 4 * 0x0001000100010001LL, \
                     4 * 0x0001000100010001LL, 0, 0)
/* the 16 nibble bytes at p + QOFF (low 256 bits) and p1 + QOFF (high) in value order: the bytes in
 * 128-bit lanes, lanes 1 and 3 shifted by 4, masked */
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
/* Q5's codes: + 0x10 under the mask */
#define Q5_CODES(q4, qh0, qh1) _mm512_mask_add_epi8(q4, fifth_mask(qh0, qh1), q4, _mm512_set1_epi8(0x10))
#define U_Q8_0(p, p1)                                                                              \
    _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(LOAD256B((p) + 2)), LOAD256B((p1) + 2), 1), \
                     _mm512_set1_epi8((char)0x80))
#define U_Q4_0(p, p1) TWO_Q4(p, p1, 2)
#define U_Q4_1(p, p1) TWO_Q4(p, p1, 4)
#define U_Q5_0(p, p1) Q5_CODES(TWO_Q4(p, p1, 6), (p) + 2, (p1) + 2)
#define U_Q5_1(p, p1) Q5_CODES(TWO_Q4(p, p1, 8), (p) + 4, (p1) + 4)

static inline int u32at(const uint8_t *p) {
    int v;
    memcpy(&v, p, 4);
    return v;
}

/* Z[q] = rows 2q (dwords 0..7) and 2q + 1 (8..15) of a 16 x 8 dword matrix M -> W[k] = column k (lane r =
 * M[r][k]): rows 4j..4j+3 x 4 columns, then 8 rows x 2 columns, then 16 rows x 1 column (8 + 8 two-source
 * permutes and 8 128-bit shuffles). */
TGT8B_VNNI static inline __attribute__((always_inline)) void transpose16x8(const __m512i *Z, __m512i *W) {
    const __m512i ia0 = _mm512_setr_epi32(0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27);
    const __m512i ia1 = _mm512_setr_epi32(4, 12, 20, 28, 5, 13, 21, 29, 6, 14, 22, 30, 7, 15, 23, 31);
    const __m512i ib0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i ib1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    __m512i A[2][4], B[2][2][2];
    UNROLL8B for (int j = 0; j < 4; j++) {
        A[0][j] = _mm512_permutex2var_epi32(Z[2 * j], ia0, Z[2 * j + 1]); /* columns 0..3: lane 4c + row */
        A[1][j] = _mm512_permutex2var_epi32(Z[2 * j], ia1, Z[2 * j + 1]); /* columns 4..7 */
    }
    UNROLL8B for (int i = 0; i < 2; i++) UNROLL8B for (int x = 0; x < 2; x++) { /* lane 8c + row */
        B[i][x][0] = _mm512_permutex2var_epi32(A[x][2 * i], ib0, A[x][2 * i + 1]);
        B[i][x][1] = _mm512_permutex2var_epi32(A[x][2 * i], ib1, A[x][2 * i + 1]);
    }
    UNROLL8B for (int x = 0; x < 2; x++) UNROLL8B for (int h = 0; h < 2; h++) {
        W[4 * x + 2 * h] = _mm512_shuffle_i64x2(B[0][x][h], B[1][x][h], 0x44);
        W[4 * x + 2 * h + 1] = _mm512_shuffle_i64x2(B[0][x][h], B[1][x][h], 0xee);
    }
}

/* prefetch distance of the strips' weight reads, in strips (the GEMV streams the weights from memory;
 * the hardware prefetcher stops at the mmap'd file's 4 KiB pages) */
#ifndef STRIP8B_PREFETCH
#define STRIP8B_PREFETCH 1
#endif
#ifndef STRIP8B_PF_HINT
#define STRIP8B_PF_HINT _MM_HINT_T0
#endif

/* TG tokens (a: token 0's block; token j's at a + j, the block-major layout) against one transposed
 * block: acc + 16 j holds the accumulators A of token j's 16 rows, +0.0 where first. CSH: the correction
 * n128 >> CSH (Q8_0 0, Q4_0 4, Q5_0 3), or -1 for none (Q4_1 / Q5_1). One base pointer for the tokens'
 * blocks and one for the accumulators keep every address a constant displacement. */
TGT8B_VNNI static inline __attribute__((always_inline)) void strip8b_tokens(const __m512i *W, __m512 dw, __m512 m,
                                                                          const osp_q8b_block *a, float *acc,
                                                                          bool first, const int TG, const int CSH,
                                                                          const bool MIN) {
    __m512i I[16];
    UNROLL8B for (int j = 0; j < TG; j++) {
        const __m512i c = _mm512_set1_epi32(a[j].n128);
        I[j] = CSH < 0 ? _mm512_setzero_si512() : CSH == 0 ? c : _mm512_srai_epi32(c, CSH);
    }
    UNROLL8B for (int k = 0; k < 8; k++) UNROLL8B for (int j = 0; j < TG; j++)
        I[j] = _mm512_dpbusd_epi32(I[j], W[k], _mm512_set1_epi32(u32at((const uint8_t *)a[j].qs + 4 * k)));
    UNROLL8B for (int j = 0; j < TG; j++) {
        float *aj = acc + 16 * j;
        __m512 A = first ? _mm512_setzero_ps() : _mm512_load_ps(aj);
        A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[j]), _mm512_mul_ps(dw, _mm512_set1_ps(a[j].d)), A);
        if (MIN) A = _mm512_fmadd_ps(m, _mm512_set1_ps(a[j].s), A);
        _mm512_store_ps(aj, A);
    }
}

/* gcc cannot see that block 0 writes every accumulator the copy-out reads */
#if defined(__clang__)
#define STRIP8B_NOWARN_BEGIN
#define STRIP8B_NOWARN_END
#else
#define STRIP8B_NOWARN_BEGIN _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define STRIP8B_NOWARN_END _Pragma("GCC diagnostic pop")
#endif
/* One block's n tokens (ab: token 0's block, the block-major run) in groups of 16, 8, 4, 2, 1. */
TGT8B_VNNI static inline __attribute__((always_inline)) void strip8b_block(const __m512i *W, __m512 dw, __m512 m,
                                                                         const osp_q8b_block *ab, int64_t n, float *acc,
                                                                         bool first, const int CSH, const bool MIN) {
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) strip8b_tokens(W, dw, m, ab + j, acc + 16 * j, first, 16, CSH, MIN);
    if (n - j >= 8) strip8b_tokens(W, dw, m, ab + j, acc + 16 * j, first, 8, CSH, MIN), j += 8;
    if (n - j >= 4) strip8b_tokens(W, dw, m, ab + j, acc + 16 * j, first, 4, CSH, MIN), j += 4;
    if (n - j >= 2) strip8b_tokens(W, dw, m, ab + j, acc + 16 * j, first, 2, CSH, MIN), j += 2;
    if (n - j >= 1) strip8b_tokens(W, dw, m, ab + j, acc + 16 * j, first, 1, CSH, MIN);
}
/* The n tokens' accumulators out, ys apart (block 0 wrote acc[0, 16 n) when nb >= 1; nb = 0 gives +0.0 as
 * the portable kernel). */
STRIP8B_NOWARN_BEGIN
TGT8B_VNNI static inline __attribute__((always_inline)) void strip8b_store(const float *acc, int64_t n, int64_t nb, float *y,
                                                                         int64_t ys) {
    for (int64_t j = 0; j < n; j++) _mm512_storeu_ps(y + j * ys, nb ? _mm512_load_ps(acc + 16 * j) : _mm512_setzero_ps());
}
STRIP8B_NOWARN_END
#define STRIP8B_KERNEL(NAME, UC, BYTES, MIN, CSH)                                                  \
    TGT8B_VNNI static void NAME(const void *w, size_t rb, int64_t nb, const osp_q8b_block *a, int64_t n, float *y, \
                                int64_t ys) {                                                      \
        const __m512i nib_shift = NIB_SHIFT8B;                                                     \
        (void)nib_shift;                                                                           \
        _Alignas(64) float acc[OSP_Q8B_STRIP_TOKENS * 16];                                         \
        /* row r's offset for the scales' gather (15 rb < 2^31: checked by backend_cpu.c) */        \
        const __m512i rowoff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), \
                                                  _mm512_set1_epi32((int)rb));                     \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            const uint8_t *p = (const uint8_t *)w + (size_t)b * (BYTES);                           \
            _Pragma("GCC unroll 16") for (int r = 0; r < 16; r++)                                  \
                _mm_prefetch((const char *)(p + (size_t)(16 * STRIP8B_PREFETCH + r) * rb), STRIP8B_PF_HINT); \
            __m512i Z[8], W[8];                                                                    \
            UNROLL8B for (int q = 0; q < 8; q++) Z[q] = UC(p + (size_t)(2 * q) * rb, p + (size_t)(2 * q + 1) * rb); \
            transpose16x8(Z, W);                                                                   \
            /* d (and Q4_1 / Q5_1's m) of the 16 rows: the first 4 bytes of each row's block */    \
            const __m512i dmv = _mm512_i32gather_epi32(rowoff, (const void *)p, 1);                \
            const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dmv));                         \
            const __m512 m = (MIN) ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dmv, 16))) : _mm512_setzero_ps(); \
            strip8b_block(W, dw, m, a + b * n, n, acc, b == 0, CSH, MIN);                          \
        }                                                                                          \
        strip8b_store(acc, n, nb, y, ys);                                                          \
    }
STRIP8B_KERNEL(strip8b_q8_0, U_Q8_0, 34, 0, 0)
STRIP8B_KERNEL(strip8b_q4_0, U_Q4_0, 18, 0, 4)
STRIP8B_KERNEL(strip8b_q4_1, U_Q4_1, 20, 1, -1)
STRIP8B_KERNEL(strip8b_q5_0, U_Q5_0, 22, 0, 3)
STRIP8B_KERNEL(strip8b_q5_1, U_Q5_1, 24, 1, -1)

/* ---- AVX512-VNNI GEMV (one token): the weights in their own layout, the sums transposed ----
 * A strip at one token pays its transpose (24 permutes and the code loads' unpacking for 16 row-blocks
 * that one token then uses once). Here 4 rows' block b sit in the 4 128-bit lanes of a register as they
 * lie in memory: lo holds values 0..15 (a 16-byte quarter of each row), hi values 16..31, so two
 * vpdpbusd against the token's codes 0..15 and 16..31 (each broadcast to the 4 lanes) leave every row 4
 * partial sums in its lane. Four such registers (16 rows) reduce to one by two unpack-and-add steps:
 * 9 operations, ending with row 4 i + k in dword 4 k + i, put in row order by one permute. From there it
 * is the strip's arithmetic lane for lane: the correction (the exact int32 I of qdot8b.h), the conversion,
 * the dw d_a product, the FMA (Q4_1 / Q5_1: and the min's). The scales (and Q5's fifth bits) of the 16
 * rows come from one gather. */
#define LOAD128B(ptr) _mm_loadu_si128((const __m128i *)(const void *)(ptr))
/* the 16 bytes at q + k rb in 128-bit lane k (k < 4); rb3 = 3 rb */
TGT8B_VNNI static inline __attribute__((always_inline)) __m512i four_rows128(const uint8_t *q, size_t rb, size_t rb3) {
    __m512i x = _mm512_castsi128_si512(LOAD128B(q));
    x = _mm512_inserti32x4(x, LOAD128B(q + rb), 1);
    x = _mm512_inserti32x4(x, LOAD128B(q + 2 * rb), 2);
    return _mm512_inserti32x4(x, LOAD128B(q + rb3), 3);
}
/* P[g] (lane k: row 4 g + k's 4 partials) -> one register, row r's I in dword r */
TGT8B_VNNI static inline __attribute__((always_inline)) __m512i reduce4x4(const __m512i *P) {
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi64(P[0], P[1]), _mm512_unpackhi_epi64(P[0], P[1]));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi64(P[2], P[3]), _mm512_unpackhi_epi64(P[2], P[3]));
    const __m512 f01 = _mm512_castsi512_ps(s01), f23 = _mm512_castsi512_ps(s23);
    const __m512i t = _mm512_add_epi32(_mm512_castps_si512(_mm512_shuffle_ps(f01, f23, 0x88)),
                                       _mm512_castps_si512(_mm512_shuffle_ps(f01, f23, 0xdd)));
    /* dword 4 k + i holds row 4 i + k */
    return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), t);
}
/* prefetch distance of the GEMV, in 16-row strips ahead (each block step prefetches its share of the strip
 * that far ahead, so every line of it is asked for once), and the cache level it asks for. Into L2, 3 strips
 * ahead, since 2026-12-06: on an AMD EPYC (Zen 4) dev box whose DRAM the weights stream from (2 threads,
 * tg128 in q8 mode, rounds of A/B runs), L1 at 2 strips (the earlier setting) gave SmolLM2 Q4_1 ~160-200
 * t/s, L2 at 2 / 3 / 4 / 6 strips 243-266 / 228-286 / 238-288 / 217-276; SmolLM2-shaped Q8_0 114 -> 182,
 * Qwen2.5-0.5B (its Q5_0 / Q8_0 matrices) 50 -> 61; no prefetch at all: 100 (bench/cpu/NOTES.md). */
#ifndef GEMV16_PREFETCH
#define GEMV16_PREFETCH 3
#endif
#ifndef GEMV16_PF_HINT
#define GEMV16_PF_HINT _MM_HINT_T1
#endif
/* KIND: 0 Q8_0 (codes at 2, + 128 by XOR), 4 Q4 (nibbles at QOFF), 5 Q5 (nibbles at QOFF, fifth bits at
 * QHOFF); CSH as the strips' (the correction n128 >> CSH, -1 none); MIN: Q4_1 / Q5_1 */
#define GEMV16_KERNEL(NAME, BYTES, KIND, QOFF, QHOFF, CSH, MIN)                                    \
    TGT8B_VNNI static void NAME(const void *w, size_t rb, const osp_q8b_block *a, int64_t nb, float *y, int64_t nrows) { \
        const __m512i m0f = _mm512_set1_epi8(0x0f), x80 = _mm512_set1_epi8((char)0x80), x10 = _mm512_set1_epi8(0x10); \
        const size_t rb3 = 3 * rb;                                                                 \
        const __m512i rowoff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), \
                                                  _mm512_set1_epi32((int)rb));                     \
        (void)m0f, (void)x80, (void)x10, (void)rowoff;                                             \
        int64_t r = 0;                                                                             \
        for (; r + 16 <= nrows; r += 16) {                                                         \
            const uint8_t *s = (const uint8_t *)w + (size_t)r * rb;                                \
            const uint8_t *pf = s + (size_t)(16 * GEMV16_PREFETCH) * rb;                           \
            __m512 A = _mm512_setzero_ps();                                                        \
            for (int64_t b = 0; b < nb; b++) {                                                     \
                const uint8_t *p = s + (size_t)b * (BYTES);                                        \
                for (int o = 0; o < 16 * (BYTES); o += 64) _mm_prefetch((const char *)(pf + b * 16 * (BYTES) + o), GEMV16_PF_HINT); \
                const __m512i alo = _mm512_broadcast_i32x4(LOAD128B(a[b].qs)), ahi = _mm512_broadcast_i32x4(LOAD128B(a[b].qs + 16)); \
                __m512 dw, m = _mm512_setzero_ps();                                                \
                __mmask64 qlo[4] = {0, 0, 0, 0}, qhi[4] = {0, 0, 0, 0};                            \
                (void)qlo, (void)qhi, (void)m;                                                     \
                if ((KIND) == 5) { /* 8 bytes a row: d (and m), then qh */                         \
                    const __m512i g0 = _mm512_i32gather_epi64(_mm512_castsi512_si256(rowoff), (const void *)p, 1); \
                    const __m512i g1 = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(rowoff, 1), (const void *)p, 1); \
                    dw = _mm512_cvtph_ps(_mm256_set_m128i(_mm512_cvtepi64_epi16(g1), _mm512_cvtepi64_epi16(g0))); \
                    if (MIN)                                                                       \
                        m = _mm512_cvtph_ps(_mm256_set_m128i(_mm512_cvtepi64_epi16(_mm512_srli_epi64(g1, 16)), \
                                                             _mm512_cvtepi64_epi16(_mm512_srli_epi64(g0, 16)))); \
                    const int sh = 8 * (QHOFF);                                                    \
                    const __m128i l0 = _mm512_cvtepi64_epi16(_mm512_srli_epi64(g0, sh)), l1 = _mm512_cvtepi64_epi16(_mm512_srli_epi64(g1, sh)); \
                    const __m128i h0 = _mm512_cvtepi64_epi16(_mm512_srli_epi64(g0, sh + 16)), h1 = _mm512_cvtepi64_epi16(_mm512_srli_epi64(g1, sh + 16)); \
                    qlo[0] = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(l0)), qlo[1] = _cvtu64_mask64((uint64_t)_mm_extract_epi64(l0, 1)); \
                    qlo[2] = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(l1)), qlo[3] = _cvtu64_mask64((uint64_t)_mm_extract_epi64(l1, 1)); \
                    qhi[0] = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(h0)), qhi[1] = _cvtu64_mask64((uint64_t)_mm_extract_epi64(h0, 1)); \
                    qhi[2] = _cvtu64_mask64((uint64_t)_mm_cvtsi128_si64(h1)), qhi[3] = _cvtu64_mask64((uint64_t)_mm_extract_epi64(h1, 1)); \
                } else {                                                                           \
                    const __m512i dmv = _mm512_i32gather_epi32(rowoff, (const void *)p, 1);        \
                    dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dmv));                              \
                    if (MIN) m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dmv, 16))); \
                }                                                                                  \
                __m512i P[4];                                                                      \
                UNROLL8B for (int gq = 0; gq < 4; gq++) {                                          \
                    const uint8_t *q = p + (size_t)(4 * gq) * rb;                                  \
                    __m512i lo, hi;                                                                \
                    if ((KIND) == 0) {                                                             \
                        lo = _mm512_xor_si512(four_rows128(q + 2, rb, rb3), x80);                  \
                        hi = _mm512_xor_si512(four_rows128(q + 18, rb, rb3), x80);                 \
                    } else {                                                                       \
                        const __m512i x = four_rows128(q + (QOFF), rb, rb3);                      \
                        lo = _mm512_and_si512(x, m0f);                                             \
                        hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), m0f);                       \
                        if ((KIND) == 5) {                                                         \
                            lo = _mm512_mask_add_epi8(lo, qlo[gq], lo, x10);                       \
                            hi = _mm512_mask_add_epi8(hi, qhi[gq], hi, x10);                       \
                        }                                                                          \
                    }                                                                              \
                    P[gq] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo), hi, ahi); \
                }                                                                                  \
                __m512i I = reduce4x4(P);                                                          \
                if ((CSH) >= 0) I = _mm512_add_epi32(I, _mm512_srai_epi32(_mm512_set1_epi32(a[b].n128), (CSH) < 0 ? 0 : (CSH))); \
                A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(dw, _mm512_set1_ps(a[b].d)), A); \
                if (MIN) A = _mm512_fmadd_ps(m, _mm512_set1_ps(a[b].s), A);                        \
            }                                                                                      \
            _mm512_storeu_ps(y + r, A);                                                            \
        }                                                                                          \
        for (; r < nrows; r++) y[r] = NAME##_one((const uint8_t *)w + (size_t)r * rb, a, nb);     \
    }
#define gemv16_q8_0_one dot8b_q8_0_vnni
#define gemv16_q4_0_one dot8b_q4_0_vnni
#define gemv16_q4_1_one dot8b_q4_1_vnni
#define gemv16_q5_0_one dot8b_q5_0_vnni
#define gemv16_q5_1_one dot8b_q5_1_vnni
GEMV16_KERNEL(gemv16_q8_0, 34, 0, 2, 0, 0, 0)
GEMV16_KERNEL(gemv16_q4_0, 18, 4, 2, 0, 4, 0)
GEMV16_KERNEL(gemv16_q4_1, 20, 4, 4, 0, -1, 1)
GEMV16_KERNEL(gemv16_q5_0, 22, 5, 6, 2, 3, 0)
GEMV16_KERNEL(gemv16_q5_1, 24, 5, 8, 4, -1, 1)
#endif

/* ---- dispatch ---------------------------------------------------------------------------------- */

static bool have_vnni(void) { return osp_qdot_isa_family() == OSP_QDOT_ISA_VNNI; }
static bool have_avx2(void) { return osp_qdot_isa_family() == OSP_QDOT_ISA_AVX2; }

#define PICK5(PREFIX, SUFFIX)                                                                      \
    switch (type) {                                                                                \
    case OSP_DTYPE_Q8_0: return PREFIX##q8_0##SUFFIX;                                              \
    case OSP_DTYPE_Q4_0: return PREFIX##q4_0##SUFFIX;                                              \
    case OSP_DTYPE_Q4_1: return PREFIX##q4_1##SUFFIX;                                              \
    case OSP_DTYPE_Q5_0: return PREFIX##q5_0##SUFFIX;                                              \
    case OSP_DTYPE_Q5_1: return PREFIX##q5_1##SUFFIX;                                              \
    default: return NULL;                                                                          \
    }

/* ---- 16-row strips: a layout made at load for the one-token GEMV (qdot8b.h) --------------------- */

/* The stored block's field offsets (ggml-common.h) and the strip block's, per type, and the kernels'
 * correction shift. */
typedef struct strip_fmt {
    int bytes;           /* stored block bytes */
    int qs, qh, m;       /* stored offsets: the codes, the fifth bits (Q5: 4 bytes; else -1), the min (else -1) */
    int s_m, s_qh, s_qs; /* strip block offsets: the 16 mins, the 8 fifth-bit masks, the code groups */
    bool q8;             /* Q8_0: 8 groups, a code byte + 128 a value; else 4 groups of the stored qs bytes */
    int csh;             /* the correction n128 >> csh (strip8b's CSH), or -1 (Q4_1 / Q5_1: the min term) */
} strip_fmt;
/* the formats as constants (the kernels and the pack are inlined per type with them) */
#define STRIP_FMT_Q8_0 ((strip_fmt){34, 2, -1, -1, -1, -1, 32, true, 0})
#define STRIP_FMT_Q4_0 ((strip_fmt){18, 2, -1, -1, -1, -1, 32, false, 4})
#define STRIP_FMT_Q4_1 ((strip_fmt){20, 4, -1, 2, 32, -1, 64, false, -1})
#define STRIP_FMT_Q5_0 ((strip_fmt){22, 6, 2, -1, -1, 32, 96, false, 3})
#define STRIP_FMT_Q5_1 ((strip_fmt){24, 8, 4, 2, 32, 64, 128, false, -1})

static bool strip_fmt_of(uint32_t type, strip_fmt *f) {
    switch (type) {
    case OSP_DTYPE_Q8_0: *f = STRIP_FMT_Q8_0; return true;
    case OSP_DTYPE_Q4_0: *f = STRIP_FMT_Q4_0; return true;
    case OSP_DTYPE_Q4_1: *f = STRIP_FMT_Q4_1; return true;
    case OSP_DTYPE_Q5_0: *f = STRIP_FMT_Q5_0; return true;
    case OSP_DTYPE_Q5_1: *f = STRIP_FMT_Q5_1; return true;
    default: return false;
    }
}

bool osp_q8b_strips_supports(uint32_t type) {
    strip_fmt f;
    return have_vnni() && strip_fmt_of(type, &f);
}

/* One block between the stored layout (blk) and row r of strip block sb, either way, a word at a time. */
static inline __attribute__((always_inline)) void strip_block_move(const strip_fmt *f, uint8_t *blk, uint8_t *sb, int r,
                                                                    bool to_strip) {
#define MOVE(stored, strip, n) (to_strip ? memcpy((strip), (stored), (n)) : memcpy((stored), (strip), (n)))
    MOVE(blk, sb + 2 * r, 2);
    if (f->m >= 0) MOVE(blk + f->m, sb + f->s_m + 2 * r, 2);
    for (int c = 0; c < (f->q8 ? 8 : 4); c++) { /* Q8_0: + 128 a byte (the XOR is its own inverse) */
        uint32_t w;
        uint8_t *s = sb + f->s_qs + 64 * c + 4 * r, *q = blk + f->qs + 4 * c;
        memcpy(&w, to_strip ? q : s, 4);
        if (f->q8) w ^= 0x80808080u;
        memcpy(to_strip ? s : q, &w, 4);
    }
#undef MOVE
    if (f->qh < 0) return;
    /* mask c (8 bytes, little-endian), bits 4 r .. 4 r + 3: qh bits 4 c .. 4 c + 3 */
    uint32_t qh = 0;
    if (to_strip) memcpy(&qh, blk + f->qh, 4);
    for (int c = 0; c < 8; c++) {
        uint8_t *mp = sb + f->s_qh + 8 * c + r / 2;
        const unsigned sh = 4u * (unsigned)(r % 2);
        if (to_strip) *mp = (uint8_t)((*mp & ~(0xFu << sh)) | ((qh >> (4 * c)) & 0xFu) << sh);
        else qh |= (uint32_t)((*mp >> sh) & 0xFu) << (4 * c);
    }
    if (!to_strip) memcpy(blk + f->qh, &qh, 4);
}

/* osp_q8b_strips_pack for one format, inlined with f constant (the moves unrolled per type) */
static inline __attribute__((always_inline)) void strips_pack_fmt(const strip_fmt f, const void *src, size_t row_bytes,
                                                                  int64_t rows, int64_t nb, void *dst) {
    const int64_t ns = rows / OSP_Q8B_STRIP_ROWS;
    const size_t sbb = (size_t)OSP_Q8B_STRIP_ROWS * (size_t)f.bytes;
    for (int64_t s = 0; s < ns; s++) {
        uint8_t *blk0 = (uint8_t *)(uintptr_t)src + (size_t)(OSP_Q8B_STRIP_ROWS * s) * row_bytes;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *sb = (uint8_t *)dst + ((size_t)s * (size_t)nb + (size_t)b) * sbb; /* every byte written below */
            for (int r = 0; r < OSP_Q8B_STRIP_ROWS; r++)
                strip_block_move(&f, blk0 + (size_t)r * row_bytes + (size_t)b * (size_t)f.bytes, sb, r, true);
        }
    }
    const size_t done = (size_t)ns * OSP_Q8B_STRIP_ROWS * row_bytes;
    memcpy((uint8_t *)dst + done, (const uint8_t *)src + done, (size_t)(rows - ns * OSP_Q8B_STRIP_ROWS) * row_bytes);
}

void osp_q8b_strips_pack(uint32_t type, const void *src, size_t row_bytes, int64_t rows, int64_t nb, void *dst) {
    strip_fmt f;
    if (!strip_fmt_of(type, &f)) return;
    switch (type) {
    case OSP_DTYPE_Q8_0: strips_pack_fmt(STRIP_FMT_Q8_0, src, row_bytes, rows, nb, dst); break;
    case OSP_DTYPE_Q4_0: strips_pack_fmt(STRIP_FMT_Q4_0, src, row_bytes, rows, nb, dst); break;
    case OSP_DTYPE_Q4_1: strips_pack_fmt(STRIP_FMT_Q4_1, src, row_bytes, rows, nb, dst); break;
    case OSP_DTYPE_Q5_0: strips_pack_fmt(STRIP_FMT_Q5_0, src, row_bytes, rows, nb, dst); break;
    default: strips_pack_fmt(STRIP_FMT_Q5_1, src, row_bytes, rows, nb, dst); break;
    }
}

const void *osp_q8b_strips_row(uint32_t type, const void *strips, size_t row_bytes, int64_t rows, int64_t nb, int64_t r,
                               void *buf) {
    strip_fmt f;
    if (r >= rows / OSP_Q8B_STRIP_ROWS * OSP_Q8B_STRIP_ROWS || !strip_fmt_of(type, &f))
        return (const uint8_t *)strips + (size_t)r * row_bytes;
    const size_t sbb = (size_t)OSP_Q8B_STRIP_ROWS * (size_t)f.bytes;
    const size_t s = (size_t)(r / OSP_Q8B_STRIP_ROWS);
    for (int64_t b = 0; b < nb; b++)
        strip_block_move(&f, (uint8_t *)buf + (size_t)b * (size_t)f.bytes,
                         (uint8_t *)(uintptr_t)strips + (s * (size_t)nb + (size_t)b) * sbb, (int)(r % OSP_Q8B_STRIP_ROWS), false);
    return buf;
}

#ifdef OSP_X86
/* the 64-bit mask stored at p (any alignment) */
TGT8B_VNNI static inline __mmask64 mask_at8b(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return _cvtu64_mask64(v);
}
/* Strip block p's codes as strip8b's transposed registers (W[k] lane r: row r's unsigned codes of values
 * 4k..4k+3): Q8_0's groups as they lie; Q4 / Q5 each group's low nibbles (W[c]) and high ones (W[c + 4]),
 * Q5 adding 16 under the stored masks. */
TGT8B_VNNI static inline __attribute__((always_inline)) void strip_regs(const strip_fmt f, const uint8_t *p, __m512i *W) {
    const __m512i m0f = _mm512_set1_epi8(0x0f), x10 = _mm512_set1_epi8(0x10);
    if (f.q8) {
        UNROLL8B for (int c = 0; c < 8; c++) W[c] = _mm512_loadu_si512(p + f.s_qs + 64 * c);
        return;
    }
    UNROLL8B for (int c = 0; c < 4; c++) {
        const __m512i x = _mm512_loadu_si512(p + f.s_qs + 64 * c);
        W[c] = _mm512_and_si512(x, m0f), W[c + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), m0f);
        if (f.s_qh >= 0) {
            W[c] = _mm512_mask_add_epi8(W[c], mask_at8b(p + f.s_qh + 8 * c), W[c], x10);
            W[c + 4] = _mm512_mask_add_epi8(W[c + 4], mask_at8b(p + f.s_qh + 8 * c + 32), W[c + 4], x10);
        }
    }
}
/* The strips GEMV on format f: per strip block, the registers above against the token's codes broadcast 4
 * at a time (8 vpdpbusd, two accumulators: integer sums, the same value in any order), then the correction,
 * conversion, dw d_a product and FMA(s) of gemv16, so lane r is row r's bits of the one-token kernel. Rows
 * outside whole strips of [r0, r1) go through the one-token kernel `one` on the row unpacked into buf. */
TGT8B_VNNI static inline __attribute__((always_inline)) void gemv16s(const strip_fmt f, uint32_t type, osp_qdot8b_fn one,
                                                                   const void *w, size_t row_bytes, int64_t rows,
                                                                   const osp_q8b_block *a, int64_t nb, float *y,
                                                                   int64_t r0, int64_t r1, void *buf) {
    const size_t sbb = 16 * (size_t)f.bytes;
    const int64_t full = rows / 16 * 16, up = (r0 + 15) / 16 * 16;
    const int64_t a0 = up < r1 ? up : r1, e = (r1 < full ? r1 : full) / 16 * 16, a1 = e > a0 ? e : a0;
    for (int64_t r = r0; r < a0; r++) y[r] = one(osp_q8b_strips_row(type, w, row_bytes, rows, nb, r, buf), a, nb);
    for (int64_t r = a0; r < a1; r += 16) {
        const uint8_t *s = (const uint8_t *)w + (size_t)(r / 16) * (size_t)nb * sbb;
        __m512 A = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *p = s + (size_t)b * sbb;
            __m512i W[8], I0 = _mm512_setzero_si512(), I1 = _mm512_setzero_si512();
            strip_regs(f, p, W);
            UNROLL8B for (int k = 0; k < 8; k += 2) {
                I0 = _mm512_dpbusd_epi32(I0, W[k], _mm512_set1_epi32(u32at((const uint8_t *)a[b].qs + 4 * k)));
                I1 = _mm512_dpbusd_epi32(I1, W[k + 1], _mm512_set1_epi32(u32at((const uint8_t *)a[b].qs + 4 * k + 4)));
            }
            __m512i I = _mm512_add_epi32(I0, I1);
            if (f.csh >= 0) I = _mm512_add_epi32(I, _mm512_srai_epi32(_mm512_set1_epi32(a[b].n128), f.csh < 0 ? 0 : f.csh));
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
            A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), _mm512_mul_ps(dw, _mm512_set1_ps(a[b].d)), A);
            if (f.m >= 0)
                A = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + f.s_m))),
                                    _mm512_set1_ps(a[b].s), A);
        }
        _mm512_storeu_ps(y + r, A);
    }
    for (int64_t r = a1; r < r1; r++) y[r] = one(osp_q8b_strips_row(type, w, row_bytes, rows, nb, r, buf), a, nb);
}
/* The strips' multi-token kernel on format f: strip8b's per-token work (strip8b_block) on the registers
 * loaded as they lie, so no transpose and no gather. w: the strip (its block b at w + b 16 bytes). */
TGT8B_VNNI static inline __attribute__((always_inline)) void strip8s(const strip_fmt f, const void *w, int64_t nb,
                                                                   const osp_q8b_block *a, int64_t n, float *y,
                                                                   int64_t ys) {
    _Alignas(64) float acc[OSP_Q8B_STRIP_TOKENS * 16];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *p = (const uint8_t *)w + (size_t)b * 16 * (size_t)f.bytes;
        __m512i W[8];
        strip_regs(f, p, W);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)p));
        const __m512 m = f.m >= 0 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + f.s_m)))
                                  : _mm512_setzero_ps();
        strip8b_block(W, dw, m, a + b * n, n, acc, b == 0, f.csh, f.m >= 0);
    }
    strip8b_store(acc, n, nb, y, ys);
}
#define STRIPS_KERNELS(T, TYPE)                                                                    \
    TGT8B_VNNI static void gemv16s_##T(const void *w, size_t row_bytes, int64_t rows, const osp_q8b_block *a, int64_t nb, \
                                       float *y, int64_t r0, int64_t r1, void *buf) {              \
        gemv16s(STRIP_FMT_##TYPE, OSP_DTYPE_##TYPE, dot8b_##T##_vnni, w, row_bytes, rows, a, nb, y, r0, r1, buf); \
    }                                                                                              \
    TGT8B_VNNI static void strip8s_##T(const void *w, int64_t nb, const osp_q8b_block *a, int64_t n, float *y, int64_t ys) { \
        strip8s(STRIP_FMT_##TYPE, w, nb, a, n, y, ys);                                             \
    }
STRIPS_KERNELS(q8_0, Q8_0)
STRIPS_KERNELS(q4_0, Q4_0)
STRIPS_KERNELS(q4_1, Q4_1)
STRIPS_KERNELS(q5_0, Q5_0)
STRIPS_KERNELS(q5_1, Q5_1)
#endif

osp_qdot8b_strip_strips_fn osp_qdot8b_strip_strips_for(uint32_t type) {
#ifdef OSP_X86
    if (have_vnni()) PICK5(strip8s_, )
#endif
    (void)type;
    return NULL;
}

osp_qdot8b_gemv_strips_fn osp_qdot8b_gemv_strips_for(uint32_t type) {
#ifdef OSP_X86
    if (have_vnni()) PICK5(gemv16s_, )
#endif
    (void)type;
    return NULL;
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
    if (have_vnni()) PICK5(gemv16_, )
    if (have_avx2()) PICK5(gemv8b_, _avx2)
#endif
    PICK5(gemv8b_, _ref)
}

osp_qdot8b_strip_fn osp_qdot8b_strip_for(uint32_t type) {
#ifdef OSP_X86
    if (have_vnni()) PICK5(strip8b_, )
#endif
    (void)type;
    return NULL;
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
    return NULL; /* AVX512-VNNI: the strips */
#else
    (void)type;
    (void)n_left;
    return NULL;
#endif
}
