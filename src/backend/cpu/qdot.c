/* Quantized-activation dot products (see qdot.h): portable reference, AVX2 and AVX512-VNNI.
 *
 * Block algebra (weights w, activations a ~ d_a * q_a, per block of 32):
 *   Q8_0: w = d_w * q_w          -> d_w d_a sum(q_w q_a)
 *   Q4_0: w = d_w * (q_w - 8)    -> d_w d_a sum(q_w q_a) - 8 d_w s_a       (q_w in 0..15)
 *   Q4_1: w = d_w * q_w + m_w    -> d_w d_a sum(q_w q_a) + m_w s_a
 * with s_a = d_a sum(q_a). The integer sums are exact; x86 has an unsigned x signed byte product
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

void osp_quantize_row_q8(const float *restrict x, osp_q8_block *restrict y, int64_t n) {
    for (int64_t b = 0; b < n / OSP_Q8_BLOCK; b++) {
        const float *xb = x + b * OSP_Q8_BLOCK;
        float amax = 0.0f;
        bool finite = true;
        for (int i = 0; i < OSP_Q8_BLOCK; i++) {
            amax = fmaxf(amax, fabsf(xb[i]));
            finite = finite && isfinite(xb[i]);
        }
        if (!finite) { /* NaN/inf activations stay non-finite (a NaN scale), never UB in the casts */
            memset(y[b].qs, 0, sizeof y[b].qs);
            memset(y[b].qs2, 0, sizeof y[b].qs2);
            y[b].d = y[b].d2 = y[b].s = NAN;
            y[b].pad = 0.0f;
            continue;
        }
        const float d = amax / 127.0f, id = d != 0.0f ? 127.0f / amax : 0.0f;
        const float d2 = d / 254.0f, id2 = d != 0.0f ? 254.0f / d : 0.0f;
        int sum = 0, sum2 = 0;
        for (int i = 0; i < OSP_Q8_BLOCK; i++) {
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
        y[b].pad = 0.0f;
        y[b].s = d * (float)sum + d2 * (float)sum2;
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

/* Block b adds dw * (d * dot(qw, qs) + d2 * dot(qw, qs2)) (qw unsigned bytes). Even and odd blocks
 * and the two levels go to four separate accumulators, so consecutive FMAs do not wait on each
 * other's 4-cycle latency (one chain would bound the loop at 8 cycles per block). */
#define LEVELS(acc1, acc2, qw, blk, dw, DOT)                                                       \
    do {                                                                                           \
        acc1 = _mm256_fmadd_ps(                                                                    \
            _mm256_cvtepi32_ps(DOT(qw, _mm256_loadu_si256((const __m256i *)(const void *)(blk)->qs))), \
            _mm256_set1_ps((dw) * (blk)->d), acc1);                                                \
        acc2 = _mm256_fmadd_ps(                                                                    \
            _mm256_cvtepi32_ps(DOT(qw, _mm256_loadu_si256((const __m256i *)(const void *)(blk)->qs2))), \
            _mm256_set1_ps((dw) * (blk)->d2), acc2);                                               \
    } while (0)

/* The Q4 kernels differ only in block size, where the nibbles start and the offset term. */
#define Q4_KERNEL(NAME, TGT, DOT, BYTES, QOFF, OFFSET_TERM)                                        \
    TGT static float NAME(const void *w, const osp_q8_block *a, int64_t nb) {                      \
        const uint8_t *p = w;                                                                      \
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0;                                \
        float off = 0.0f;                                                                          \
        int64_t b = 0;                                                                             \
        for (; b + 2 <= nb; b += 2, p += 2 * (BYTES)) {                                            \
            const __m256i q0 = unpack_nibbles(p + (QOFF)), q1 = unpack_nibbles(p + (BYTES) + (QOFF)); \
            const float d0 = half_f16c(p), d1 = half_f16c(p + (BYTES));                            \
            LEVELS(a0, b0, q0, a + b, d0, DOT);                                                    \
            LEVELS(a1, b1, q1, a + b + 1, d1, DOT);                                                \
            off += OFFSET_TERM(p, d0, a + b) + OFFSET_TERM(p + (BYTES), d1, a + b + 1);            \
        }                                                                                          \
        for (; b < nb; b++, p += (BYTES)) {                                                        \
            const float d0 = half_f16c(p);                                                         \
            LEVELS(a0, b0, unpack_nibbles(p + (QOFF)), a + b, d0, DOT);                            \
            off += OFFSET_TERM(p, d0, a + b);                                                      \
        }                                                                                          \
        return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1))) + off;           \
    }

#define Q4_1_OFFSET(p, dw, blk) (half_f16c((p) + 2) * (blk)->s)
#define Q4_0_OFFSET(p, dw, blk) (-8.0f * (dw) * (blk)->s)

#define DEFINE_X86_KERNELS(SUFFIX, TGT, DOT)                                                       \
    Q4_KERNEL(dot_q4_1_##SUFFIX, TGT, DOT, 20, 4, Q4_1_OFFSET)                                     \
    Q4_KERNEL(dot_q4_0_##SUFFIX, TGT, DOT, 18, 2, Q4_0_OFFSET)                                     \
    TGT static float dot_q8_0_##SUFFIX(const void *w, const osp_q8_block *a, int64_t nb) {         \
        const uint8_t *p = w;                                                                      \
        __m256 a0 = _mm256_setzero_ps(), b0 = a0, a1 = a0, b1 = a0;                                \
        int64_t b = 0;                                                                             \
        for (; b < nb; b++, p += 34) {                                                             \
            const __m256i qw = _mm256_loadu_si256((const __m256i *)(const void *)(p + 2));          \
            const __m256i qa = _mm256_loadu_si256((const __m256i *)(const void *)a[b].qs);          \
            const __m256i qa2 = _mm256_loadu_si256((const __m256i *)(const void *)a[b].qs2);        \
            const __m256i aw = _mm256_sign_epi8(qw, qw);                                           \
            const __m256 s1 = _mm256_cvtepi32_ps(DOT(aw, _mm256_sign_epi8(qa, qw)));               \
            const __m256 s2 = _mm256_cvtepi32_ps(DOT(aw, _mm256_sign_epi8(qa2, qw)));              \
            const float dw = half_f16c(p);                                                         \
            if (b & 1) {                                                                           \
                a1 = _mm256_fmadd_ps(s1, _mm256_set1_ps(dw * a[b].d), a1);                         \
                b1 = _mm256_fmadd_ps(s2, _mm256_set1_ps(dw * a[b].d2), b1);                        \
            } else {                                                                               \
                a0 = _mm256_fmadd_ps(s1, _mm256_set1_ps(dw * a[b].d), a0);                         \
                b0 = _mm256_fmadd_ps(s2, _mm256_set1_ps(dw * a[b].d2), b0);                        \
            }                                                                                      \
        }                                                                                          \
        return hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1)));                 \
    }

DEFINE_X86_KERNELS(avx2, TGT_AVX2, dot_u8s8_avx2)
DEFINE_X86_KERNELS(vnni, TGT_VNNI, dot_u8s8_vnni)
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

const char *osp_qdot_isa(void) {
    switch (detect()) {
    case ISA_VNNI: return "avx512vnni";
    case ISA_AVX2: return "avx2";
    default: return "scalar";
    }
}

osp_qdot_fn osp_qdot_ref_for(uint32_t type) {
    switch (type) {
    case OSP_DTYPE_Q8_0: return dot_q8_0_ref;
    case OSP_DTYPE_Q4_0: return dot_q4_0_ref;
    case OSP_DTYPE_Q4_1: return dot_q4_1_ref;
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
        default: return NULL;
        }
    }
    if (isa == ISA_AVX2) {
        switch (type) {
        case OSP_DTYPE_Q8_0: return dot_q8_0_avx2;
        case OSP_DTYPE_Q4_0: return dot_q4_0_avx2;
        case OSP_DTYPE_Q4_1: return dot_q4_1_avx2;
        default: return NULL;
        }
    }
#endif
    return osp_qdot_ref_for(type);
}
