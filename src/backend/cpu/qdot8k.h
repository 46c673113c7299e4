/* One-level ("q8") activations for the K-quant weight types: the opt-in fast mode of the CPU matmuls
 * (osp_model_params.cpu_activations = OSP_CPU_ACT_Q8, the CLI's --cpu-activations q8).
 *
 * The default path (qdot.h) quantizes activations in blocks of 32 with two int8 levels; here a row is
 * quantized in super-blocks of 256 values with ONE int8 level and one fp32 scale (the layout of ggml's
 * Q8_K: d, the codes, and their sums per 16 values). A K-quant weight super-block (Q2_K..Q6_K, also 256
 * values) then meets exactly one activation scale, so its sub-block scales (and mins) are applied in
 * int32 and the float conversion and scale product happen once per 256 values instead of once per 32:
 * about half the integer work of the two-level path and a fraction of its float work. The price is
 * accuracy: one int8 level has a relative error of ~2e-3 per value (two levels ~1e-5); bench/cpu/NOTES.md
 * records its KL divergence against the default on the target models.
 *
 * The arithmetic, identical in every kernel (scalar reference, one-token, GEMV, tiles), per weight row
 * and token; super-block s of the row with weight scale dw, min scale dmw, and the token's block a:
 *   L[l], l < 8: the int32 "lane" sum_{j<8} sc(j, l) * sum_{i<4} qw[32 j + 4 l + i] * a.qs[32 j + 4 l + i]
 *                (qw the unsigned codes, sc(j, l) the scale of sub-block j's values 4l..4l+3: Q4_K/Q5_K
 *                sc_j; Q6_K/Q3_K/Q2_K the 16-value scale 2j + (l >= 4));
 *   M:           the int32 offset term (Q4_K/Q5_K sum_j m_j S32_j, Q2_K sum_k m_k S16_k, Q6_K
 *                32 sum_k sc_k S16_k, Q3_K 4 sum_k sc_k S16_k; S the activation code sums);
 *   acc[l] = fmaf((float)L[l], dw * a.d, acc[l]);   off = fmaf(-(float)M, dmw * a.d, off)
 *                (dmw: dmin for Q4_K/Q5_K/Q2_K, d for Q6_K/Q3_K);
 * and at the end y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)) + off. Integer sums
 * are exact in any order, so the SIMD kernels may form them with any instructions; the float steps are
 * the same operations in the same order everywhere, so every kernel gives the same bits and a token's
 * result never depends on how many tokens share the matmul (test_qdot8k asserts it). */
#ifndef OSP_BACKEND_CPU_QDOT8K_H
#define OSP_BACKEND_CPU_QDOT8K_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OSP_Q8K_BLOCK 256

/* 256 activations x_i ~ d * qs[i], d = max|x| / 127, qs = round-to-nearest-even(x / d) in [-127, 127];
 * bsums[k] = sum of qs[16 k .. 16 k + 15]. A block with a non-finite value has d = NaN, zero codes and
 * sums (its results are NaN). 292 bytes. */
typedef struct osp_q8k_block {
    float d;
    int16_t bsums[16];
    int8_t qs[OSP_Q8K_BLOCK];
} osp_q8k_block;

/* y[n / 256] <- x[n], n a multiple of 256 (the K-quants' row lengths always are). */
void osp_quantize_row_q8k(const float *x, osp_q8k_block *y, int64_t n);

/* Whether `type` has one-level kernels (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K). */
bool osp_qdot8k_supports(uint32_t type);

/* dot(weight row of nsb super-blocks at w, the token's nsb activation blocks a), the arithmetic above. */
typedef float (*osp_qdot8k_fn)(const void *w, const osp_q8k_block *a, int64_t nsb);
/* The portable kernel (the arithmetic written out in C), or NULL for a type without the mode. */
osp_qdot8k_fn osp_qdot8k_ref_for(uint32_t type);
/* The fastest one-token kernel on this CPU (osp_qdot_isa's family: AVX512-VNNI or AVX2 for Q4_K, Q5_K,
 * Q6_K, else the portable one; all bit-identical to the portable one). */
osp_qdot8k_fn osp_qdot8k_for(uint32_t type);

/* y[r] = dot(w + r * row_bytes, a, nsb) for r < nrows (one token against nrows weight rows), each
 * bit-identical to osp_qdot8k_for(type). */
typedef void (*osp_qdot8k_gemv_fn)(const void *w, size_t row_bytes, const osp_q8k_block *a, int64_t nsb, float *y,
                                   int64_t nrows);
/* The GEMV kernel for `type` on this CPU (AVX512-VNNI: Q4_K, Q5_K, Q6_K four rows at a time; else a
 * loop over osp_qdot8k_for's one-token kernel), or NULL for a type without the mode. */
osp_qdot8k_gemv_fn osp_qdot8k_gemv_for(uint32_t type);

/* Super-block s of 8 tokens packed for the AVX512-VNNI pair tiles (token pairs 2k, 2k + 1 as the low
 * and high 256 bits of one register): qs[j][k] the two tokens' codes of sub-block j (32 each), dp[k]
 * their scales d (8 times each), d the 8 tokens' scales, s32[i] the 8 tokens' 32-value code sums of
 * sub-blocks 2i and 2i + 1 as an int16 pair (low, high), s16[i] their 16-value sums bsums[2i], bsums[2i + 1]
 * likewise. 2752 bytes, 64-aligned. */
typedef struct osp_q8k_pack {
    _Alignas(64) int8_t qs[8][4][64];
    float dp[4][16];
    float d[8];
    int32_t s32[4][8];
    int32_t s16[8][8];
} osp_q8k_pack;
_Static_assert(sizeof(osp_q8k_pack) == 2752, "the pack layout's size");
#define OSP_Q8K_PACK_TOKENS 8
/* pk[s] <- super-block s (s < nsb) of the 8 activation rows a + j * a_stride, j < 8. pk 64-aligned. */
void osp_pack_q8k(const osp_q8k_block *a, int64_t a_stride, int64_t nsb, osp_q8k_pack *pk);

/* A tile: one weight row (nsb super-blocks at w) against n tokens of packs: token j in pack row
 * pk + (j / 8) * nsb (pk[0..nsb) for tiles of at most 8 tokens), y[j * ys] = dot(w, token j) for j < n,
 * bit-identical to the one-token kernel whatever the packs' other tokens hold. */
typedef void (*osp_qdot8k_tile_fn)(const void *w, int64_t nsb, const osp_q8k_pack *pk, float *y, int64_t ys);
/* The tile for `type` and n_left tokens still to do: 16 tokens (two packs) when n_left >= 16, 8 when
 * n_left >= 8, else exactly n_left (3..7: the odd widths are pairs plus one token on 256 bits, so a
 * speculative verification row of k + 1 tokens pays for k + 1, not for the next even width). *n = the
 * tile's width (never more than n_left). NULL with *n = 1 where there is none (n_left < 3; a CPU without
 * AVX512-VNNI; Q2_K, Q3_K): use the GEMV. */
osp_qdot8k_tile_fn osp_qdot8k_tile_for(uint32_t type, int64_t n_left, int *n);

#endif
