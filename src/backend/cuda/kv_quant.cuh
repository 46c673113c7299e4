/* Quantized KV pages on the GPU (issue 13): the device-side FP8 E4M3 / FP4 E2M1 / NVFP4 encoders used by
 * the KV write (ops.cu) and the decoders used by the CUDA-core attention kernel (attention.cu). The
 * formats, layouts and scales are src/kv/kv_cache.h's; the CPU's write (src/backend/cpu/kv_quant.c,
 * core/dtype.c) is the reference, and the encoders here are the same integer and fp32 operations
 * (IEEE divisions by __fdiv_rn, multiplies by __fmul_rn, rintf for round-half-to-even, no fast-math
 * flush of subnormals), so a given fp32 row gives the same codes and scales bit for bit:
 *  E4M3 (OCP 8-bit FP spec v1.0 §5.1, "e4m3fn"): round to nearest even; |x| >= 464 and infinities
 *       saturate to +-448 (code 0x7E, CUDA's __NV_SATFINITE); NaN -> 0x7F with the input's sign.
 *  E2M1 (OCP MX spec v1.0 §5.3.3): round to nearest even, saturate at +-6, NaN -> 0x8 (-0).
 *  NVFP4 micro-block of 16: scale = e4m3((amax / 6) / T) (amax by fmaxf, which drops NaN), s =
 *       e4m3(scale) * T in fp32, value = e2m1(x / s), or 0 when s is 0; two values a byte, the even
 *       one in the low nibble.
 * The software encoders are deliberate: the hardware cvt.rn.satfinite.e4m3x2.f32 gives NaN one sign,
 * and the write runs once per token, so its cost does not matter. The decoders are exact (every E4M3
 * and E2M1 number is a half and an fp32): E4M3 by the hardware cvt to f16x2 (sm_89+; NaN codes give
 * NaN), E2M1 by a 16-entry nibble table and an fp32 constant, then one fp32 product with the scale --
 * the same rounded product core/dtype.c's dequantizers and the CPU's attention read form.
 * INT8_HIER (QuantSpec's hierarchical INT8: Tiwari et al. 2025, "QuantSpec: Self-Speculative Decoding
 * with Hierarchical Quantized KV Cache", section 4.1; the row format and its rounding are core/dtype.h's
 * osp_int8h_quantize_row): a warp encodes one row (min / max by warp reductions, then S and M rounded
 * to f16 as core/dtype.c rounds them, then the two 4-bit codes of each value), and the decoders give the
 * upper-only value M + S u or the full value M + (S/32)(32 u + 2 l - 15), osp_int8h_dequantize_row's
 * fp32 operations. The per-value helpers are __host__ __device__ (the intrinsics only on the device, the
 * same IEEE operations on the host), so a host program can run the very same code against core/dtype.c.
 * Internal to src/backend/cuda/. */
#ifndef OSP_BACKEND_CUDA_KV_QUANT_CUH
#define OSP_BACKEND_CUDA_KV_QUANT_CUH

#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* fp32 -> E4M3 code: the bits of core/dtype.c's osp_fp32_to_e4m3. */
static __device__ __forceinline__ uint32_t osp_dev_fp32_to_e4m3(float f) {
    const uint32_t b = __float_as_uint(f);
    const uint32_t sign = (b >> 31) << 7;
    if (isnan(f)) return sign | 0x7Fu;
    const float a = fabsf(f);
    if (a >= 464.0f) return sign | 0x7Eu; /* rounds past 448 (to NaN's code): saturate */
    if (a < 0.015625f) return sign | (uint32_t)rintf(__fmul_rn(a, 512.0f)); /* subnormals m 2^-9; exact scaling */
    const int e = (int)((b >> 23) & 0xFFu) - 127; /* -6 .. 8 */
    const uint32_t mant = b & 0x7FFFFFu, rem = mant & 0xFFFFFu, half = 0x80000u;
    uint32_t code = ((uint32_t)(e + 7) << 3) | (mant >> 20);
    if (rem > half || (rem == half && (code & 1u))) code++; /* a carry moves into the exponent: right */
    return sign | code;
}

/* E4M3 code -> fp32, exactly (core/dtype.c's osp_e4m3_to_fp32; NaN codes give NaN). */
static __device__ __forceinline__ float osp_dev_e4m3_to_fp32(uint32_t c) {
    const uint32_t e = (c >> 3) & 0xFu, m = c & 7u;
    float mag;
    if (e == 15u && m == 7u) mag = __uint_as_float(0x7FC00000u);
    else if (e == 0u) mag = __fmul_rn((float)m, 0.001953125f); /* m 2^-9, exact */
    else mag = __uint_as_float(((e + 120u) << 23) | (m << 20));
    return __uint_as_float(__float_as_uint(mag) | ((c & 0x80u) << 24));
}

/* fp32 -> E2M1 code (low 4 bits): the bits of core/dtype.c's osp_fp32_to_e2m1. */
static __device__ __forceinline__ uint32_t osp_dev_fp32_to_e2m1(float f) {
    if (isnan(f)) return 0x8u;
    const uint32_t b = __float_as_uint(f);
    const uint32_t sign = (b >> 31) << 3;
    const float a = fabsf(f);
    if (a > 5.0f) return sign | 0x7u; /* past 5 the nearest is 6, or beyond it: saturate at 6 */
    if (a < 1.0f) return sign | (uint32_t)rintf(__fmul_rn(a, 2.0f)); /* 0, 0.5 (code 1) or 1.0 (code 2) */
    const int e = (int)((b >> 23) & 0xFFu) - 127; /* 0 .. 2 */
    const uint32_t mant = b & 0x7FFFFFu, rem = mant & 0x3FFFFFu, half = 0x200000u;
    uint32_t code = ((uint32_t)(e + 1) << 1) | (mant >> 22);
    if (rem > half || (rem == half && (code & 1u))) code++;
    return sign | (code > 7u ? 7u : code);
}

/* One NVFP4 micro-block: x[16] (any memory) -> packed[8] bytes as two uint32 words (value 2i in the low
 * nibble of byte i, byte 0 lowest in the word) and the E4M3 scale code; core/dtype.c's
 * osp_nvfp4_quantize16 bit for bit. tensor_scale > 0. */
static __device__ __forceinline__ void osp_dev_nvfp4_quantize16(const float *x, float tensor_scale, uint32_t &lo_word,
                                                                uint32_t &hi_word, uint32_t &scale) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[i])); /* fmaxf drops NaN */
    scale = osp_dev_fp32_to_e4m3(__fdiv_rn(__fdiv_rn(amax, 6.0f), tensor_scale));
    const float s = __fmul_rn(osp_dev_e4m3_to_fp32(scale), tensor_scale);
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t c = s > 0.0f ? osp_dev_fp32_to_e2m1(__fdiv_rn(x[i], s)) : 0u;
        w[i >> 3] |= c << (4 * (i & 7));
    }
    lo_word = w[0];
    hi_word = w[1];
}

/* E2M1 code (low 4 bits of c) -> fp32, exactly: the magnitude from a nibble table of 2 |value|
 * (0 1 2 3 4 6 8 12) put into the mantissa of 2^22, whose ulp is 0.5, minus 2^22; then the sign. */
static __device__ __forceinline__ float osp_dev_e2m1_to_fp32(uint32_t c) {
    const uint32_t twice = (0xC8643210u >> ((c & 7u) << 2)) & 0xFu;
    const float mag = __uint_as_float(0x4A800000u | twice) - 4194304.0f;
    return __uint_as_float(__float_as_uint(mag) | ((c & 8u) << 28));
}

/* Two E4M3 codes (the low byte first) -> fp32, exactly, by the hardware conversion to f16x2. */
static __device__ __forceinline__ float2 osp_dev_e4m3x2_to_float2(uint32_t two_codes) {
    const __half2 h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two_codes & 0xFFFFu), __NV_E4M3);
    return __half22float2(h);
}

/* ---- INT8_HIER ------------------------------------------------------------------------------------ */

/* The fp32 operations of core/dtype.c's int8_hier code, one IEEE rounding each: the _rn intrinsics on the
 * device (nvcc never fuses them into FMAs), the plain operators on the host (an emulation built with
 * -ffp-contract=off, as the library's ISO C is). */
static __host__ __device__ __forceinline__ float osp_kq_add(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
static __host__ __device__ __forceinline__ float osp_kq_sub(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}
static __host__ __device__ __forceinline__ float osp_kq_mul(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
static __host__ __device__ __forceinline__ float osp_kq_div(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}
static __host__ __device__ __forceinline__ uint32_t osp_kq_bits(float f) {
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}
static __host__ __device__ __forceinline__ float osp_kq_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* fp32 -> IEEE half bits, round to nearest even, overflow to infinity: core/dtype.c's osp_fp32_to_fp16
 * step for step (its subnormal path: a * 2^24, exact, rounded to an integer by rintf). */
static __host__ __device__ __forceinline__ uint32_t osp_dev_fp32_to_f16_bits(float f) {
    const uint32_t x = osp_kq_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7FFFFFFFu;
    if (a >= 0x7F800000u) return sign | 0x7C00u | (a > 0x7F800000u ? 0x200u : 0u); /* inf, NaN */
    if (a >= 0x477FF000u) return sign | 0x7C00u;                                     /* rounds to >= 65520 */
    if (a < 0x38800000u) return sign | (uint32_t)rintf(osp_kq_mul(osp_kq_float(a), 16777216.0f)); /* subnormal */
    const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
    return sign | ((r - 0x38000000u) >> 13);
}

/* IEEE half bits (low 16 bits of h) -> fp32, exactly: core/dtype.c's osp_fp16_to_fp32. */
static __host__ __device__ __forceinline__ float osp_dev_f16_bits_to_fp32(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1Fu) return osp_kq_float(sign | 0x7F800000u | (m << 13));
    if (e == 0u) {
        if (m == 0u) return osp_kq_float(sign);
        return osp_kq_float(osp_kq_bits(osp_kq_mul((float)m, 5.9604644775390625e-8f)) | sign); /* m 2^-24, exact */
    }
    return osp_kq_float(sign | ((e + 112u) << 23) | (m << 13));
}

/* Half bits of v rounded down (toward -inf) or up: the nearest half, stepped one unit when it lies on the
 * wrong side of v (core/dtype.c's fp16_directed). */
static __host__ __device__ __forceinline__ uint32_t osp_dev_f16_directed(float v, bool up) {
    const uint32_t h = osp_dev_fp32_to_f16_bits(v);
    const float back = osp_dev_f16_bits_to_fp32(h);
    if (up ? back >= v : back <= v) return h;
    const bool neg = (h & 0x8000u) != 0u, mag0 = (h & 0x7FFFu) == 0u;
    if (up) return mag0 ? 0x0001u : neg ? h - 1u : h + 1u;
    return mag0 ? 0x8001u : neg ? h + 1u : h - 1u;
}

/* A row's stored scale S and minimum M (half bits) from its fminf / fmaxf minimum and maximum (NaN
 * dropped; an all-NaN row gives mn = +inf > mx = -inf): M = mn rounded down, S = (mx - M) / 15 rounded
 * up, S = 0 when mx <= M. */
static __host__ __device__ __forceinline__ void osp_dev_int8h_scale(float mn, float mx, uint32_t &s_bits,
                                                                    uint32_t &m_bits) {
    if (!(mn <= mx)) mn = mx = 0.0f; /* all NaN */
    m_bits = osp_dev_f16_directed(mn, false);
    const float M = osp_dev_f16_bits_to_fp32(m_bits);
    s_bits = mx > M ? osp_dev_f16_directed(osp_kq_div(osp_kq_sub(mx, M), 15.0f), true) : 0u;
}

/* The upper code u (bits 0..3) and lower code l (bits 4..7) of value v in a row of scale S and minimum M
 * (their fp32 values): u = clamp(rint((v - M) / S)), l = clamp(rint((v - (M + S u)) * 16 / S + 7.5)), a
 * NaN code (v NaN or infinite against S) giving u = 0 / l = 8, and u = 0, l = 8 when S is 0. */
static __host__ __device__ __forceinline__ uint32_t osp_dev_int8h_codes(float v, float S, float M) {
    if (!(S > 0.0f)) return 8u << 4;
    float cu = rintf(osp_kq_div(osp_kq_sub(v, M), S));
    cu = cu < 0.0f ? 0.0f : cu > 15.0f ? 15.0f : cu; /* NaN stays NaN */
    const float r = osp_kq_sub(v, osp_kq_add(M, osp_kq_mul(S, cu))); /* (v - (M + S u)) * 16 / S + 7.5 */
    float cl = rintf(osp_kq_add(osp_kq_div(osp_kq_mul(r, 16.0f), S), 7.5f));
    cl = cl < 0.0f ? 0.0f : cl > 15.0f ? 15.0f : cl;
    const uint32_t u = cu == cu ? (uint32_t)cu : 0u, l = cl == cl ? (uint32_t)cl : 8u;
    return u | (l << 4);
}

/* Decoders (osp_int8h_dequantize_row's fp32 operations): upper-only M + S u; full M + S32 (32 u + 2 l - 15)
 * with S32 = S * 2^-5 (exact). */
static __host__ __device__ __forceinline__ float osp_dev_int8h_upper(uint32_t u, float S, float M) {
    return osp_kq_add(M, osp_kq_mul(S, (float)u));
}
static __host__ __device__ __forceinline__ float osp_dev_int8h_full(uint32_t u, uint32_t l, float S32, float M) {
    return osp_kq_add(M, osp_kq_mul(S32, (float)((int)(32u * u + 2u * l) - 15)));
}

/* One int8_hier row x[D] (shared memory, D even; all 32 lanes of the warp call it, with the row written
 * before a __syncwarp): upper[D / 2] code bytes, sm[4] (S then M, little-endian half bits) and lower[D / 2]
 * code bytes, value 2i in the low nibble of byte i, 2i + 1 in the high one: osp_int8h_quantize_row's bytes.
 * fminf / fmaxf drop NaN and are exact, so the lanes' partial minima and the butterfly give the CPU's
 * minimum and maximum whatever the order, except in two corners where the CPU's loop (GCC calls
 * fminf(x[i], mn) / fmaxf(x[i], mx); glibc's x86-64 fminf / fmaxf, minss / maxss, return the second
 * argument on equal operands and a quiet NaN for a signalling one) depends on its order, reproduced here:
 *  - a zero minimum takes the sign of the first zero the loop meets (only M's stored bits depend on it:
 *    every code and decoded value is the same for M = +0 and -0);
 *  - a signalling NaN (no GPU arithmetic makes one; a raw copy of the input can carry it) turns the
 *    running minimum and maximum into NaN, which the next number replaces: only the values after the
 *    row's last signalling NaN count.
 * Byte stores: the write runs once per token and row, and a row of D / 2 + 4 bytes has no alignment to
 * exploit. */
static __device__ __forceinline__ void osp_dev_int8h_quantize_row_warp(const float *x, int D, uint8_t *upper,
                                                                       uint8_t *sm, uint8_t *lower, int lane) {
    int last_snan = -1; /* the largest index of a signalling NaN */
    for (int d = lane; d < D; d += 32) {
        const uint32_t b = __float_as_uint(x[d]);
        if ((b & 0x7FC00000u) == 0x7F800000u && (b & 0x003FFFFFu)) last_snan = d;
    }
    float mn = INFINITY, mx = -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) last_snan = max(last_snan, __shfl_xor_sync(0xffffffffu, last_snan, o));
    for (int d = lane; d < D; d += 32)
        if (d > last_snan) mn = fminf(mn, x[d]), mx = fmaxf(mx, x[d]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    if (mn == 0.0f) { /* warp-uniform: which zero */
        int first = D;
        for (int d = lane; d < D; d += 32)
            if (d > last_snan && x[d] == 0.0f) {
                first = d;
                break;
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
        mn = x[first];
    }
    uint32_t s_bits, m_bits;
    osp_dev_int8h_scale(mn, mx, s_bits, m_bits);
    const float S = osp_dev_f16_bits_to_fp32(s_bits), M = osp_dev_f16_bits_to_fp32(m_bits);
    for (int i = lane; i < D / 2; i += 32) {
        const uint32_t c0 = osp_dev_int8h_codes(x[2 * i], S, M), c1 = osp_dev_int8h_codes(x[2 * i + 1], S, M);
        upper[i] = (uint8_t)((c0 & 0xFu) | ((c1 & 0xFu) << 4));
        lower[i] = (uint8_t)((c0 >> 4) | (c1 & 0xF0u));
    }
    if (lane == 0) {
        sm[0] = (uint8_t)(s_bits & 0xFFu), sm[1] = (uint8_t)(s_bits >> 8);
        sm[2] = (uint8_t)(m_bits & 0xFFu), sm[3] = (uint8_t)(m_bits >> 8);
    }
}

#endif
