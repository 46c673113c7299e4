/* Paged attention v4 (attention_dec.cu): short query tiles (decode, speculative verification) in split
 * or fold mode on f16 and E4M3 pages at head_dim 64 / 128 with v2's numerics row for row, and on NVFP4
 * pages. C++ only; internal to the CUDA backend: attention_mma.cu's launcher calls it where v4 is
 * enabled (osp_cuda_attention_dec, osp_cuda_attention_v4_nvfp4) and then, in split mode, runs its own
 * merge over the partials. */
#ifndef OSP_BACKEND_CUDA_ATTENTION_DEC_H
#define OSP_BACKEND_CUDA_ATTENTION_DEC_H

#include "backend/cuda/attention_mma.cuh" /* Params */
#include "osprey/status.h"

namespace osp_attn {

/* query rows a v4 CTA serves (the `rows` of its attn_tiling) for a GQA group of `group` heads: 8 up
 * to 8 heads, 16 up to 16; 0 where v4 does not serve the group */
int dec_rows(int group);
/* the page kinds v4 reads (its `kv` arguments) */
enum { OSP_CUDA_DEC_F16 = 0, OSP_CUDA_DEC_FP8 = 1, OSP_CUDA_DEC_NVFP4 = 2 };
/* dynamic shared memory of one v4 CTA, bytes */
int dec_smem_bytes(int D, int kv, int rows, int stages);
/* K/V stages in flight by default, measured best at B 8, 32k on an H100: f16 and E4M3 pages 3
 * (bench/gpu/NOTES.md), NVFP4 pages 4 (216 / 223 / 197 us at 2 / 3 / 4; bench/kv/NOTES.md) */
int dec_default_stages(int kv);
/* Launches v4 over prm (prm.tl tiled with dec_rows rows), grid (tiles, KV heads x head chunks, fold ? 1
 * : n_groups). Split mode (fold false; the workspace, ws_stride, chunks_per_cta set): writes every
 * chunk's partial exactly as v2's split mode does (the same (m, l) and accumulator bits) and the caller
 * merges them. Fold mode: folds every chunk of the tile as v2's fold mode and writes prm.out (no
 * workspace). stages: 2 .. 4 (others mean the default). D 64 or 128. */
osp_status dec_launch(const Params &prm, bool fold, unsigned n_groups, int D, int kv, int stages, void *stream);

} // namespace osp_attn

#endif
