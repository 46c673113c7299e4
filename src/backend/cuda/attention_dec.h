/* Paged attention v4 (attention_dec.cu): split mode for short query tiles (decode, speculative
 * verification) on f16 and E4M3 pages at head_dim 64 / 128, with v2's numerics row for row. C++
 * only; internal to the CUDA backend: attention_mma.cu's launcher calls it where v4 is enabled
 * (osp_cuda_attention_dec) and then runs its own merge over the partials. */
#ifndef OSP_BACKEND_CUDA_ATTENTION_DEC_H
#define OSP_BACKEND_CUDA_ATTENTION_DEC_H

#include "backend/cuda/attention_mma.cuh" /* Params */
#include "osprey/status.h"

namespace osp_attn {

/* query rows a v4 CTA serves (the `rows` of its attn_tiling) for a GQA group of `group` heads: 8 up
 * to 8 heads, 16 up to 16; 0 where v4 does not serve the group */
int dec_rows(int group);
/* dynamic shared memory of one v4 CTA, bytes */
int dec_smem_bytes(int D, bool fp8, int rows, int stages);
/* K/V stages in flight by default (f16 pages 2, E4M3 pages 3: three CTAs an SM either way) */
int dec_default_stages(bool fp8);
/* Launches v4 over prm (prm.tl tiled with dec_rows rows; split mode's parameters: the workspace,
 * ws_stride, chunks_per_cta), grid (tiles, KV heads x head chunks, n_groups). stages: 2 .. 4 (others
 * mean the default). D 64 or 128. Writes every chunk's partial exactly as v2's split mode does (the
 * same (m, l) and accumulator bits); the caller merges them. */
osp_status dec_launch(const Params &prm, unsigned n_groups, int D, bool fp8, int stages, void *stream);

} // namespace osp_attn

#endif
