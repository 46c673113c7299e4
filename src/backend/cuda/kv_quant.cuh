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
 * the same rounded product core/dtype.c's dequantizers and the CPU's attention read form. Internal to
 * src/backend/cuda/. */
#ifndef OSP_BACKEND_CUDA_KV_QUANT_CUH
#define OSP_BACKEND_CUDA_KV_QUANT_CUH

#include <cuda_fp8.h>
#include <math.h>
#include <stdint.h>

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

#endif
