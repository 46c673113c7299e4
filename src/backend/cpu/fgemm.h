/* fp32 GEMM tiles for the weights the CPU backend multiplies in floats: F32, F16 and BF16 weights on
 * every path, and every other type on the exact path (rows dequantized into a panel first).
 *
 * A tile is up to 4 weight rows x 6 tokens (AVX512; x 2 tokens on AVX2): each weight vector is loaded
 * (and widened from F16 / BF16) once and multiplied by every token of the tile, and each token vector
 * by every row. Every output keeps its own 16-lane accumulator and does osp_cpu_dot's arithmetic on
 * it, lane for lane: the product rounded, then added (no FMA), lanes folded 8, 4, 2, 1. So each output
 * has exactly osp_cpu_matmul_rows' bits, whatever the tile, the row split or the batch: the tile is a
 * schedule, not a different sum. */
#ifndef OSP_BACKEND_CPU_FGEMM_H
#define OSP_BACKEND_CPU_FGEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/ops.h"

/* Floats of workspace a thread needs for W.cols = cols: the `panel` argument below must have room for
 * osp_cpu_fgemm_panel_floats(cols) of them (a row block of dequantized rows; at least 4 rows). */
int64_t osp_cpu_fgemm_panel_floats(int64_t cols);

/* y[t * ldy + r] = sum_c W[r, c] * x[t, c] for t < n_tokens and r in [r0, r1): osp_cpu_matmul_rows'
 * contract and bits (see there), in tiles where W.cols % 16 == 0 and the CPU has AVX2 or AVX512
 * (osp_qdot_isa_family(), so osp_qdot_force_isa caps it too); otherwise it is osp_cpu_matmul_rows.
 * Cache blocking: the rows go in blocks of about 256 KB as fp32 (F32 / F16 / BF16 rows read in place
 * for up to 8 tokens, else dequantized once into `panel`), and each block meets all tokens, a tile's
 * worth at a time, before the next block. One-token tiles prefetch their rows 16 KB ahead (a decode
 * step streams every weight from memory once). */
void osp_cpu_fgemm_rows(const osp_weight *w, const float *x, float *y, int64_t ldy, int64_t n_tokens, int64_t r0,
                        int64_t r1, float *panel);

/* The one-level activation mode's path for BF16 weights (`--cpu-activations q8`: llama.cpp's accuracy,
 * as its BF16 dot products): each token's row rounded to bf16 (nearest even) and multiplied by VDPBF16PS
 * (Intel SDM, "VDPBF16PS": per fp32 lane, two bf16 products added; denormal inputs read as zero), 4 rows x 6
 * tokens a tile, lane sums folded as osp_cpu_dot's. True where it applies: W is BF16 (not round_bf16),
 * W.cols % 32 == 0 and small enough for a token group's bf16 rows to fit the panel, and the CPU has
 * AVX512-BF16 with the avx512vnni kernel family. The choice depends on the machine and the weight alone,
 * and every output is one fixed lane order whatever the tile, so results stay batch-invariant. */
bool osp_cpu_fgemm_bf16_ok(const osp_weight *w);
/* osp_cpu_fgemm_rows' contract with the arithmetic above; only where osp_cpu_fgemm_bf16_ok(w). */
void osp_cpu_fgemm_bf16_rows(const osp_weight *w, const float *x, float *y, int64_t ldy, int64_t n_tokens, int64_t r0,
                             int64_t r1, float *panel);

#endif
