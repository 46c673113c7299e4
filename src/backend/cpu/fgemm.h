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

#endif
