/* One-level ("q8") activations for the 32-value block types Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: the other
 * half of the CPU matmuls' opt-in fast mode (osp_model_params.cpu_activations = OSP_CPU_ACT_Q8, the
 * CLI's --cpu-activations q8; qdot8k.h is the K-quants' half).
 *
 * The default path (qdot.h) quantizes activations in blocks of 32 with two int8 levels; here a block of
 * 32 gets ONE int8 level and one fp32 scale, plus s = d * sum(codes) (the layout of ggml's Q8_1, whose
 * accuracy llama.cpp's CPU matmuls have for these types, with fp32 instead of fp16 scales). A weight
 * block then costs one integer dot product per token instead of two; one level has a relative error
 * of ~2e-3 per value (two levels ~1e-5): bench/cpu/NOTES.md ("Seventh pass") records what it costs.
 *
 * The arithmetic, identical in every kernel (portable reference, AVX2 / AVX512-VNNI one-token, GEMV,
 * tiles, strips), per weight row and token; block b of the row with fp16 scale dw (and Q4_1/Q5_1's fp16
 * min m), and the token's block a (ggml-common.h: block_q8_0, block_q4_0, block_q4_1, block_q5_0,
 * block_q5_1 for the weights):
 *   I = the int32 sum_{i<32} v[i] * a.qs[i], v the block's 32 weight values in order as signed integers
 *       (Q8_0 qs; Q4_0 q - 8; Q5_0 q - 16; Q4_1/Q5_1 the codes q): exact, |I| <= 32 * 128 * 127 < 2^24,
 *       so (float)I is exact too;
 *   A = fmaf((float)I, dw * a.d, A);   Q4_1/Q5_1 then A = fmaf(m, a.s, A);   (one chain, block by block)
 * from A = +0.0, and y = A after the last block. Integer sums are exact in any order, so the SIMD kernels
 * form I with any instructions (the strips multiply unsigned weight codes by the signed activation codes
 * and start from the activation block's correction: Q8_0's codes w + 128 from -128 sum(a.qs), Q4_0 / Q5_0
 * codes q from -8 / -16 sum(a.qs)); the float steps are the same operations in the same order
 * everywhere, so every kernel gives the same bits and a token's result never depends on how many tokens
 * share the matmul (test_qdot8b asserts it).
 * (Until the ninth pass of bench/cpu/NOTES.md the float steps ran on the 8 int32 lanes of 4 products
 * each, two accumulators and a final tree: one conversion, product and FMA per 4 products, which fixed
 * the weight row in the vector lanes. With one int32 per block a vector's lanes can be 16 weight rows
 * instead, the strips below, at a third of the vector operations.) */
#ifndef OSP_BACKEND_CPU_QDOT8B_H
#define OSP_BACKEND_CPU_QDOT8B_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OSP_Q8B_BLOCK 32

/* 32 activations x_i ~ d * qs[i]: d = max|x| / 127, qs = round-to-nearest-even(x * (127 / max|x|)) in
 * [-127, 127] (all zeros: d = 0, codes 0), s = d * (float)sum(qs), n128 = -128 * sum(qs) (the strips'
 * correction: exact, |n128| <= 128 * 32 * 127). A block with a non-finite value has d = s = NaN, zero
 * codes and n128 = 0 (its results are NaN). 44 bytes. */
typedef struct osp_q8b_block {
    float d, s;
    int32_t n128;
    int8_t qs[OSP_Q8B_BLOCK];
} osp_q8b_block;

/* y[n / 32] <- x[n], n a multiple of 32. */
void osp_quantize_row_q8b(const float *x, osp_q8b_block *y, int64_t n);

/* Whether `type` has one-level block-of-32 kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1). */
bool osp_qdot8b_supports(uint32_t type);

/* dot(weight row of nb blocks at w, the token's nb activation blocks a): the arithmetic above. */
typedef float (*osp_qdot8b_fn)(const void *w, const osp_q8b_block *a, int64_t nb);
/* The portable kernel (the arithmetic written out in C), or NULL for a type without the mode. */
osp_qdot8b_fn osp_qdot8b_ref_for(uint32_t type);
/* The fastest one-token kernel on this CPU (osp_qdot_isa's family: AVX512-VNNI or AVX2 256-bit
 * kernels, else the portable one; all bit-identical to the portable one), or NULL as above. */
osp_qdot8b_fn osp_qdot8b_for(uint32_t type);

/* Two tokens' blocks as the AVX2 tiles read them (each token a 256-bit half), low first: qs the codes,
 * d the scales (8 lanes each). For Q8_0, Q4_0 and Q5_0 the codes are stored + 128 (XOR 0x80: unsigned,
 * 1..255); Q4_1/Q5_1 store them as they are. 128 bytes. */
typedef struct osp_q8b_pair {
    _Alignas(64) int8_t qs[64];
    float d[16];
} osp_q8b_pair;
/* Block b of 8 tokens for the AVX2 tiles: pair[k] holds tokens 2k (low) and 2k + 1 (high); s the 8
 * tokens' s in token order (Q4_1/Q5_1's min terms, 8 tokens in one vector). 576 bytes, 64-aligned. */
typedef struct osp_q8b_pack {
    osp_q8b_pair pair[4];
    float s[8];
} osp_q8b_pack;
_Static_assert(sizeof(osp_q8b_pair) == 128 && sizeof(osp_q8b_pack) == 576, "the pack layouts' sizes");
#define OSP_Q8B_PACK_TOKENS 8
/* pk[b] <- block b (b < nb) of the 8 activation rows a + j * a_stride (j < 8), for weights of `type`
 * (the codes' storage depends on it). pk 64-aligned. */
void osp_pack_q8b(uint32_t type, const osp_q8b_block *a, int64_t a_stride, int64_t nb, osp_q8b_pack *pk);
/* y[r] = dot(w + r * row_bytes, a, nb) for r < nrows (one token against nrows weight rows), each
 * bit-identical to osp_qdot8b_for(type). 15 row_bytes < 2^31 (AVX512-VNNI gathers the scales of 16 rows at
 * int32 offsets, as the strips do). */
typedef void (*osp_qdot8b_gemv_fn)(const void *w, size_t row_bytes, const osp_q8b_block *a, int64_t nb, float *y,
                                   int64_t nrows);
/* The GEMV for `type` on this CPU (AVX512-VNNI: 16 rows a pass with the weights as they lie, 4 rows' blocks
 * in the 128-bit lanes of a register and the partial sums reduced across registers, the one-token kernel
 * for the last nrows % 16; else the one-token kernel row by row), or NULL for a type without the mode.
 * (A strip at one token would transpose 16 row-blocks for a single use: bench/cpu/NOTES.md, tenth pass.) */
osp_qdot8b_gemv_fn osp_qdot8b_gemv_for(uint32_t type);

/* A strip (AVX512-VNNI): 16 weight rows (w + r * row_bytes, r < 16, nb blocks each) against n tokens,
 * 1 <= n <= OSP_Q8B_STRIP_TOKENS, whose blocks are block-major: block b of token j at a[b * n + j]
 * (osp_q8b_block_major; for n = 1 that is the token's row as quantized): y[j * ys + r] = dot(row r,
 * token j), each bit-identical to the one-token kernel; 15 row_bytes < 2^31 (the scales are gathered at
 * int32 offsets). Per block the 16 rows' 32 values are transposed once into 8 registers (lane r: row r's
 * values 4k..4k+3), then each token costs 8 vpdpbusd against its codes broadcast 4 at a time, one
 * conversion, the dw d_a product and the FMA(s) for all 16 rows. */
typedef void (*osp_qdot8b_strip_fn)(const void *w, size_t row_bytes, int64_t nb, const osp_q8b_block *a, int64_t n,
                                    float *y, int64_t ys);
#define OSP_Q8B_STRIP_ROWS 16
#define OSP_Q8B_STRIP_TOKENS 64
/* out[b * n + j] <- a[j * a_stride + b] for b < nb, j < n: n token rows made block-major for a strip. */
void osp_q8b_block_major(const osp_q8b_block *a, int64_t a_stride, int64_t nb, int64_t n, osp_q8b_block *out);
/* The strip for `type` on this CPU, or NULL (no AVX512-VNNI, or a type without the mode). */
osp_qdot8b_strip_fn osp_qdot8b_strip_for(uint32_t type);

/* 16-row strips: a weight layout the CPU backend makes at load (backend_cpu.c cpu_place, with --no-mmap
 * and one-level activations on AVX512-VNNI) so that a one-token GEMV streams each matrix front to back
 * in whole 64-byte vectors, with no gathers, inserts or cross-lane reductions (bench/cpu/NOTES.md,
 * fourteenth pass). Rows [0, 16 floor(rows / 16)) lie in strips of 16; strip s's block b is the 16
 * rows' block b in 16 x (the type's block bytes) at (s nb + b) 16 bytes_of_block:
 *   the 16 rows' d (f16, 32 bytes); Q4_1 / Q5_1: their m (32 bytes); Q5: the fifth bits as eight 64-bit
 *   masks, mask c bit 4 r + i = row r's value 4 c + i; then the codes in groups of 64 bytes, dword r of
 *   group c holding row r's: Q8_0 (8 groups) codes of values 4 c .. 4 c + 3, each + 128 as a byte; Q4 / Q5
 *   (4 groups) stored qs bytes 4 c .. 4 c + 3 (low nibbles values 4 c .., high nibbles 16 + 4 c ..).
 * The rows past the last whole strip follow as stored. The same bytes as the stored matrix, and the same
 * results: every kernel below gives each row's bits of osp_qdot8b_for(type). */
/* Whether `type` has the layout and its GEMV on this CPU (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; AVX512-VNNI). */
bool osp_q8b_strips_supports(uint32_t type);
/* dst (rows x row_bytes bytes) <- the stored matrix src (rows of nb blocks, row_bytes apart) in strips. */
void osp_q8b_strips_pack(uint32_t type, const void *src, size_t row_bytes, int64_t rows, int64_t nb, void *dst);
/* Row r of a matrix in strips, in the stored layout: unpacked into buf (row_bytes), or where it already
 * lies as stored (a row past the last whole strip). Returns the row. */
const void *osp_q8b_strips_row(uint32_t type, const void *strips, size_t row_bytes, int64_t rows, int64_t nb, int64_t r,
                               void *buf);
/* y[r] = dot(row r, the token's nb blocks a) for r0 <= r < r1 of a matrix of `rows` rows in strips, each
 * bit-identical to osp_qdot8b_for(type); whole strips inside [r0, r1) 16 rows a pass (8 vpdpbusd a block),
 * the other rows one at a time, unpacked into buf (row_bytes). */
typedef void (*osp_qdot8b_gemv_strips_fn)(const void *w, size_t row_bytes, int64_t rows, const osp_q8b_block *a,
                                          int64_t nb, float *y, int64_t r0, int64_t r1, void *buf);
/* The strips GEMV for `type` on this CPU, or NULL (see osp_q8b_strips_supports). */
osp_qdot8b_gemv_strips_fn osp_qdot8b_gemv_strips_for(uint32_t type);
/* The strip (16 rows against n tokens, as osp_qdot8b_strip_fn: a block-major, 1 <= n <= OSP_Q8B_STRIP_TOKENS,
 * y[j * ys + r]) on strip s of a matrix in strips, given at w = its first byte, (s nb) 16 bytes_of_block
 * into the matrix; each result bit-identical to osp_qdot8b_for(type). NULL as the GEMV. */
typedef void (*osp_qdot8b_strip_strips_fn)(const void *w, int64_t nb, const osp_q8b_block *a, int64_t n, float *y,
                                           int64_t ys);
osp_qdot8b_strip_strips_fn osp_qdot8b_strip_strips_for(uint32_t type);

/* A tile: one weight row (nb blocks at w) against n tokens of packs: token j in pack row
 * pk + (j / 8) * nb, y[j * ys] = dot(w, token j) for j < n, bit-identical to the one-token kernel
 * whatever the packs' other tokens hold. */
typedef void (*osp_qdot8b_tile_fn)(const void *w, int64_t nb, const osp_q8b_pack *pk, float *y, int64_t ys);
/* The tile for `type` and n_left tokens still to do: on AVX2 4 tokens for n_left 3-4, else 8 (one pack;
 * 256-bit kernels, the 8-token tile runs the 4-token body on each half). A tile wider than n_left reads
 * the pack's rows past n_left (the caller packs rows in bounds there and drops their outputs). *n = the
 * tile's width. NULL with *n = 1 where there is none (n_left < 3; the portable family; AVX512-VNNI,
 * which has the strips instead; a type without the mode): use the GEMV. */
osp_qdot8b_tile_fn osp_qdot8b_tile_for(uint32_t type, int64_t n_left, int *n);

#endif
