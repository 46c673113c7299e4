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

#endif
