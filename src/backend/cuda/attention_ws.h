/* Paged attention v3 (attention_ws.cu): fold mode at head_dim 128 on f16 pages, warp-specialized
 * (a producer warpgroup and two consumer warpgroups, ping-pong). C++ only; internal to the CUDA
 * backend: attention_mma.cu's launcher calls it where v3 is enabled (osp_cuda_attention_ws). */
#ifndef OSP_BACKEND_CUDA_ATTENTION_WS_H
#define OSP_BACKEND_CUDA_ATTENTION_WS_H

#include "backend/cuda/attention_mma.cuh" /* Params */
#include "osprey/status.h"

namespace osp_attn {

/* query rows a v3 CTA serves (the `rows` of its attn_tiling): 128 */
int ws_rows();
/* Launches v3 over prm (prm.tl tiled with ws_rows() rows; fold mode's parameters, no workspace).
 * stages: K/V tiles in flight (3 or 4; others mean 4); pingpong: the consumers' products in turns.
 * Neither changes a result bit: the rows are v2's bits. */
osp_status ws_launch(const Params &prm, int stages, bool pingpong, void *stream);

} // namespace osp_attn

#endif
