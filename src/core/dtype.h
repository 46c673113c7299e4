/* Tensor element types. The numeric values are ggml's type ids (ggml.h `enum ggml_type`), so a GGUF
 * tensor's type field maps onto osp_dtype without translation. Block-quantized types store
 * `block_size` values in `type_size` bytes; the layouts reproduce ggml's exactly (ggml-common.h).
 *
 * Every type ggml defines is known here (name and sizes), so a GGUF file can be validated and listed
 * even when osprey cannot compute with its tensors; `osp_dtype_can_dequant()` says which it can. */
#ifndef OSP_CORE_DTYPE_H
#define OSP_CORE_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"

typedef enum osp_dtype {
    OSP_DTYPE_F32 = 0,
    OSP_DTYPE_F16 = 1,
    OSP_DTYPE_Q4_0 = 2,
    OSP_DTYPE_Q4_1 = 3,
    OSP_DTYPE_Q5_0 = 6,
    OSP_DTYPE_Q5_1 = 7,
    OSP_DTYPE_Q8_0 = 8,
    OSP_DTYPE_Q8_1 = 9,
    OSP_DTYPE_Q2_K = 10,
    OSP_DTYPE_Q3_K = 11,
    OSP_DTYPE_Q4_K = 12,
    OSP_DTYPE_Q5_K = 13,
    OSP_DTYPE_Q6_K = 14,
    OSP_DTYPE_Q8_K = 15,
    OSP_DTYPE_IQ2_XXS = 16,
    OSP_DTYPE_IQ2_XS = 17,
    OSP_DTYPE_IQ3_XXS = 18,
    OSP_DTYPE_IQ1_S = 19,
    OSP_DTYPE_IQ4_NL = 20,
    OSP_DTYPE_IQ3_S = 21,
    OSP_DTYPE_IQ2_S = 22,
    OSP_DTYPE_IQ4_XS = 23,
    OSP_DTYPE_I8 = 24,
    OSP_DTYPE_I16 = 25,
    OSP_DTYPE_I32 = 26,
    OSP_DTYPE_I64 = 27,
    OSP_DTYPE_F64 = 28,
    OSP_DTYPE_IQ1_M = 29,
    OSP_DTYPE_BF16 = 30,
    OSP_DTYPE_TQ1_0 = 34,
    OSP_DTYPE_TQ2_0 = 35,
    OSP_DTYPE_MXFP4 = 39,
    OSP_DTYPE_COUNT = 40,
} osp_dtype;

/* Name ("Q4_1"), or NULL for an id ggml does not define (or has removed). */
const char *osp_dtype_name(uint32_t t);
/* Values per block (1 for plain types); 0 for an unknown id. */
int64_t osp_dtype_block_size(uint32_t t);
/* Bytes per block; 0 for an unknown id. */
size_t osp_dtype_type_size(uint32_t t);
/* Bytes of a row of `n` values; n must be a multiple of the block size (callers check). */
size_t osp_dtype_row_size(uint32_t t, int64_t n);
/* True if osp_dequant_row() handles the type. */
bool osp_dtype_can_dequant(uint32_t t);

/* Converts `n` values of type `t` starting at `src` (a whole number of blocks) to fp32 in `dst`
 * ([n] floats, caller-owned). Returns OSP_ERR_UNSUPPORTED for types that cannot be dequantized,
 * OSP_ERR_INVALID_ARG if n is not a multiple of the block size. Layouts: ggml-common.h. */
osp_status osp_dequant_row(uint32_t t, const void *src, float *dst, int64_t n);

/* IEEE half and bfloat16 conversions (round-to-nearest-even on the way down, as ggml). */
float osp_fp16_to_fp32(uint16_t h);
uint16_t osp_fp32_to_fp16(float f);
float osp_bf16_to_fp32(uint16_t h);
uint16_t osp_fp32_to_bf16(float f);

/* FP8 E4M3 ("e4m3fn": OCP 8-bit floating point spec v1.0, section 5.1; 1 sign, 4 exponent bits with
 * bias 7, 3 mantissa bits; no infinities, S.1111.111 is NaN; largest finite 448, smallest subnormal
 * 2^-9). fp32 -> E4M3 rounds to nearest even and saturates: finite values and infinities beyond 448
 * become +-448 (CUDA's __NV_SATFINITE, what KV-cache writers use), NaN becomes 0x7F (with its sign). */
float osp_e4m3_to_fp32(uint8_t c);
uint8_t osp_fp32_to_e4m3(float f);
/* FP4 E2M1 (OCP Microscaling Formats spec v1.0, section 5.3.3; 1 sign, 2 exponent bits with bias 1,
 * 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6), in the low 4 bits. fp32 -> E2M1 rounds to nearest even
 * and saturates at +-6; NaN becomes 0x8 (-0), as ml_dtypes' float4_e2m1fn does. */
float osp_e2m1_to_fp32(uint8_t c);
uint8_t osp_fp32_to_e2m1(float f);

/* NVFP4 (NVIDIA's 4-bit format: E2M1 values in micro-blocks of 16, one E4M3 scale per micro-block,
 * one fp32 scale per tensor): x[16] -> packed[8] (value 2i in the low nibble of byte i, 2i + 1 in the
 * high one) and *scale (E4M3). The micro-block's scale is amax / 6 / tensor_scale rounded to E4M3, so
 * its largest value maps onto E2M1's 6; each value is x / (scale * tensor_scale) rounded to E2M1.
 * tensor_scale > 0. */
void osp_nvfp4_quantize16(const float *x, float tensor_scale, uint8_t *packed, uint8_t *scale);
/* The inverse: y[i] = e2m1(value i) * e4m3(scale) * tensor_scale. */
void osp_nvfp4_dequantize16(const uint8_t *packed, uint8_t scale, float tensor_scale, float *y);

/* QuantSpec's hierarchical INT8 (Tiwari et al. 2025, "QuantSpec: Self-Speculative Decoding with
 * Hierarchical Quantized KV Cache", section 4.1): a row x[n] (n even) is an asymmetric 4-bit code per
 * value (the upper half) plus a 4-bit code of its rounding residual (the lower half), so the upper
 * halves alone are a round-to-nearest INT4 row and both together an 8-bit one.
 *   M = min(x) rounded down to f16, S = (max(x) - M) / 15 rounded up to f16 (both stored: sm[0] = S,
 *   sm[1] = M, IEEE half bits), so every (x - M) / S lies in [0, 15];
 *   u = clamp(rint((x - M) / S), 0, 15), the upper code;
 *   l = clamp(rint((x - (M + S u)) * 16 / S + 7.5), 0, 15), the lower code (the residual, which lies in
 *       [-S/2, S/2], in 16 steps of S/16 centred on 0);
 *   upper-only value: M + S * u                       (error <= S/2 = range/30)
 *   full value:       M + (S/32) * (32 u + 2 l - 15)  (= M + S u + (S/16)(l - 7.5); error <= S/32 = range/480)
 * S = 0 (a constant row) stores u = 0, l = 8. Values beyond f16's range (|x| > 65504) are not
 * representable (as with f16 pages). upper, lower: n/2 bytes each, value 2i in the low nibble of byte
 * i, 2i + 1 in the high one. */
void osp_int8h_quantize_row(const float *x, int64_t n, uint8_t *upper, uint8_t *lower, uint16_t sm[2]);
/* The inverse: y[n] from the upper codes alone (lower == NULL) or from both halves, by the formulas
 * above, in exactly that fp32 arithmetic (the CPU attention reads the same values). */
void osp_int8h_dequantize_row(const uint8_t *upper, const uint8_t *lower, const uint16_t sm[2], float *y, int64_t n);

#endif
