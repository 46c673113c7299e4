/* fp32 -> ggml element types: the reference quantizers osprey writes weights with.
 *
 * Each quantizer reproduces ggml's scalar reference (ggml-quants.c quantize_row_<type>_ref, and the
 * fp32 -> f16 / bf16 conversions of ggml-impl.h), so a row quantized here has the bytes llama.cpp
 * and gguf-py would produce for it (checked against gguf-py in tests/unit/test_quantize.c). Blocks
 * use the layouts of ggml-common.h, the same ones osp_dequant_row() (core/dtype.h) reads. */
#ifndef OSP_CORE_QUANTIZE_H
#define OSP_CORE_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "osprey/status.h"

/* True if osp_quantize_row() handles type `t`: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q8_K,
 * Q4_K, Q6_K. */
bool osp_dtype_can_quantize(uint32_t t);

/* Converts `n` fp32 values at `src` ([n] floats) to type `t`, writing osp_dtype_row_size(t, n)
 * bytes to `dst` (caller-owned; must not overlap src). n must be a multiple of the type's block size
 * (32 for the Q types, 256 for the K types). Per block (ggml's reference, round-to-nearest-even for the
 * halfs):
 *   Q8_0: d = amax/127, q = round-half-away(x/d) in [-127, 127]; stores half(d), q.
 *   Q4_0: d = m/-8 where m is the value of largest magnitude (first one on ties),
 *         q = min(15, trunc(x/d + 8.5)); stores half(d), q packed (j, j+16) as (low, high) nibbles.
 *   Q4_1: d = (max-min)/15, q = min(15, trunc((x-min)/d + 0.5)); stores half(d), half(min), q.
 *   Q5_0, Q5_1: as Q4_0 and Q4_1 with 32 levels: Q5_0 d = m/-16, q = min(31, trunc(x/d + 16.5));
 *         Q5_1 d = (max-min)/31; bit 4 of each q goes to the 32-bit qh field.
 *   Q8_K (block of 256, ggml's dot-product intermediate): iscale = -127/m where m is the value of
 *         largest magnitude (first on ties), q = min(127, round-half-even(iscale x)); stores fp32
 *         d = 1/iscale, q, and the int16 sums of each 16 quants.
 *   Q4_K, Q6_K (blocks of 256): ggml's reference without importance weights. Q4_K fits each
 *         sub-block of 32 with a scale and a min (weighted least squares over 21 candidate grids),
 *         quantizes those to 6 bits against half-precision super-block scales, then requantizes
 *         the values to 4 bits; Q6_K fits each sub-block of 16 symmetrically (19 candidate grids,
 *         weights x^2), quantizes the scales to int8 against one half scale, then the values to 6
 *         bits. The result is ggml's bytes, but no independent implementation (gguf-py has no
 *         quantizer for them) checks that in the tests.
 * An all-zero (Q4_1, Q5_1: constant) block gets d = 0. Inputs should be finite: NaN or inf give
 * blocks that are memory-safe but unspecified. Returns OSP_ERR_UNSUPPORTED for other types,
 * OSP_ERR_INVALID_ARG for a NULL pointer or n not a whole number of blocks. Thread-safe; allocates
 * nothing. */
osp_status osp_quantize_row(uint32_t t, const float *src, void *dst, int64_t n);

#endif
