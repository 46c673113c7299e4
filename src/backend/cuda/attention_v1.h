/* Paged attention v1 (attention_mma.cu): the tensor-core kernel behind osp_cuda_paged_attention for
 * f16 pages and head_dim 32 / 64 / 128. Internal to the CUDA backend and its tests. */
#ifndef OSP_BACKEND_CUDA_ATTENTION_V1_H
#define OSP_BACKEND_CUDA_ATTENTION_V1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Keys per chunk: every row reduces over its keys in chunks of this many keys from key 0, folded in
 * order (attention_mma.cu says why). Part of the numerics: changing it changes results. */
#define OSP_CUDA_ATTN_CHUNK 256
/* The most workspace split mode uses; a launch whose partials would need more runs in fold mode. */
#define OSP_CUDA_ATTN_SPLIT_BUDGET ((size_t)128 << 20)

/* Which kernel serves a launch and how the tensor-core kernel spreads its work (its results are the
 * same bits either way): AUTO is the default kernel (OSP_CUDA_ATTN_V1_DEFAULT) picking its mode per
 * launch from host scalars; V0 the CUDA-core kernel; V1 the tensor-core kernel with mma.sync where it
 * applies (v0 elsewhere); V2 the same kernel with its two products by wgmma where that applies (f16
 * pages, D 64 / 128; mma.sync at D 32); FOLD and SPLIT the tensor-core kernel in that mode (SPLIT where
 * the workspace allows) with the instruction osp_cuda_attention_force_mma names.
 * The instruction is chosen from the model's shape alone (head_dim, page type), never from the batch:
 * mma.sync and wgmma need not round alike, and a row's bits may not depend on its batch. */
enum {
    OSP_CUDA_ATTN_AUTO = 0,
    OSP_CUDA_ATTN_V0 = 1,
    OSP_CUDA_ATTN_V1 = 2,
    OSP_CUDA_ATTN_FOLD = 3,
    OSP_CUDA_ATTN_SPLIT = 4,
    OSP_CUDA_ATTN_V2 = 5
};
/* The matrix instruction of AUTO, FOLD and SPLIT: AUTO wgmma where it applies when
 * OSP_CUDA_ATTN_V2_DEFAULT, SYNC mma.sync, WGMMA wgmma where it applies. */
enum { OSP_CUDA_ATTN_MMA_AUTO = 0, OSP_CUDA_ATTN_MMA_SYNC = 1, OSP_CUDA_ATTN_MMA_WGMMA = 2 };
/* the tensor-core kernel is the default where it applies (f16 pages, D 32 / 64 / 128);
 * OSPREY_CUDA_ATTENTION=v0 selects the CUDA-core kernel for comparison */
#define OSP_CUDA_ATTN_V1_DEFAULT 1
/* its products by wgmma by default where that applies (D 64 / 128; test_gpu_attention, test_gpu_model and
 * the GPU engine tests pass under it on the H200); OSPREY_CUDA_ATTENTION=v1 selects mma.sync */
#define OSP_CUDA_ATTN_V2_DEFAULT 1
void osp_cuda_attention_force_mode(int mode); /* process-wide; tests and benchmarks */
void osp_cuda_attention_force_mma(int mma);   /* process-wide; tests and benchmarks */
/* Fold mode's CTA order: the query tiles longest first (heavy_first 1, the default: a causal prefill
 * ends on short tiles) or in slot order (0). No result bit changes. Process-wide; benchmarks. (TMA
 * loads and FlashAttention-3's intra-warpgroup overlap were built as alternatives to this kernel's
 * loop, measured slower on the H200 and removed: bench/gpu/NOTES.md, commit 338ec1a has them.) */
void osp_cuda_attention_tile_order(int heavy_first);
/* v3 (attention_ws.cu): fold mode at D 128 under wgmma by a warp-specialized CTA (a producer warpgroup,
 * two consumer warpgroups of 64 rows sharing each K/V tile), the consumers' products unordered (ON) or
 * in turns (PINGPONG, the default: 1.43-1.51x v2's prefill on the H200 at 87be3bd, bench/gpu/NOTES.md); its rows
 * are v2's bits (test_gpu_attention asserts it), so it is the default wherever v2 would fold.
 * OSPREY_CUDA_ATTN_WS=off / on / pingpong overrides the default. */
enum { OSP_CUDA_ATTN_WS_OFF = 0, OSP_CUDA_ATTN_WS_ON = 1, OSP_CUDA_ATTN_WS_PINGPONG = 2 };
#define OSP_CUDA_ATTN_WS_DEFAULT OSP_CUDA_ATTN_WS_PINGPONG
/* process-wide, tests and benchmarks: mode OSP_CUDA_ATTN_WS_* (anything else: back to the environment /
 * default), stages 3 or 4 K/V tiles in flight (anything else: the default, 4). No result bit changes. */
void osp_cuda_attention_ws(int mode, int stages);
/* v4 (attention_dec.cu): short query tiles (8 or 16 rows a CTA) with the keys on the long side of
 * mma.sync's products, so a decode tile's work scales with its real rows, in split or fold mode; f16
 * and E4M3 pages (D 64 / 128, GQA groups up to 16) under the wgmma family, where its rows are v2's bits
 * (test_gpu_attention and test_gpu_kv_quant assert it; measured on an H100), so which launches take it
 * is free: OFF never, AUTO decode launches (at most 4 query tokens a sequence on average) on E4M3
 * pages (faster than v2 there; on f16 pages v2 is faster past 8k), DECODE decode launches on f16 and
 * E4M3 pages, ALL every launch it can serve (tests). NVFP4 pages take v4 whatever this says
 * (osp_cuda_attention_v4_nvfp4). */
enum { OSP_CUDA_ATTN_DEC_OFF = 0, OSP_CUDA_ATTN_DEC_AUTO = 1, OSP_CUDA_ATTN_DEC_DECODE = 2, OSP_CUDA_ATTN_DEC_ALL = 3 };
#define OSP_CUDA_ATTN_DEC_DEFAULT OSP_CUDA_ATTN_DEC_AUTO
/* process-wide, tests and benchmarks: OSP_CUDA_ATTN_DEC_* (anything else: back to the environment,
 * OSPREY_CUDA_ATTN_DEC=off / auto / decode / all, or the default) */
void osp_cuda_attention_dec(int mode);
/* v1's launch shape (process-wide, for benchmarks; 0 keeps the default): K/V stages in flight in fold
 * and in split mode (2 .. 4), the waves of resident CTAs split mode spreads its chunks over, or a fixed
 * count of chunks per split CTA. None of them changes a result bit. */
void osp_cuda_attention_v1_tune(int fold_stages, int split_stages, int split_waves, int chunks_per_cta);
/* the forced mode; before any force_mode call, the one the environment names: OSPREY_CUDA_ATTENTION=v0,
 * v1, v2, fold or split (anything else or unset: auto), to compare kernels under a whole model */
int osp_cuda_attention_forced_mode(void);
/* true where launches of this mode, page type and head_dim run v1 */
bool osp_cuda_attention_uses_v1(int mode, uint32_t kv_type, int D);

/* true where the tensor-core kernel may serve a launch: f16 pages (OSP_KV_PAGE_F16) at D 32, 64 or 128,
 * E4M3 pages (OSP_KV_PAGE_FP8, issue 13) at D 64 or 128 (under wgmma only). */
bool osp_cuda_attention_v1_supported(uint32_t kv_type, int D);
/* true where the wgmma products apply: f16 or E4M3 pages and D 64 or 128 (sm_90a). */
bool osp_cuda_attention_v2_supported(uint32_t kv_type, int D);
/* true where the tensor-core kernel serves a launch of this page type and head_dim under the forced
 * mode and instruction (E4M3 pages: only with wgmma; elsewhere the CUDA-core kernel, v0). */
bool osp_cuda_attention_tc_serves(uint32_t kv_type, int D);
/* true where a launch of this mode, instruction choice (OSP_CUDA_ATTN_MMA_*), page type and head_dim
 * runs the tensor-core kernel with wgmma */
bool osp_cuda_attention_uses_wgmma(int mode, int mma, uint32_t kv_type, int D);
/* Chunk partials (the layout split mode writes, shared by v0's quantized pages): a row's partials sit
 * at [row][chunk] in d_ws_acc (fp32, D a chunk) and, after osp_cuda_attention_chunk_stride(max_seq_len) x
 * T x n_head x D floats, its (m, l) pairs at [row][chunk] (float2, m in the log2 domain); chunk c covers
 * keys [c OSP_CUDA_ATTN_CHUNK, (c + 1) OSP_CUDA_ATTN_CHUNK). osp_cuda_attention_merge_chunks folds row
 * (t, h)'s chunks 0 .. ceil((positions[t] + 1) / OSP_CUDA_ATTN_CHUNK) - 1 in chunk order (the fold of
 * attention_mma.cuh: chunks with l = 0 leave the state as it is) and writes out = O / L as bf16
 * [T, n_head, D]. ws_stride: chunks a row (even). D 32 / 64 / 128 / 256. OSP_ERR_INVALID_ARG on bad
 * arguments. */
int64_t osp_cuda_attention_chunk_stride(int32_t max_seq_len);
osp_status osp_cuda_attention_merge_chunks(const float *d_ws_acc, const void *d_ws_ml, uint16_t *d_out,
                                           const int32_t *d_positions, int64_t T, int n_head, int D,
                                           int64_t ws_stride, void *stream);
/* Bytes of split-mode partials for `tokens` query tokens at this max_seq_len (0: never splits). */
size_t osp_cuda_attention_v1_split_bytes(int64_t tokens, int n_head, int D, int32_t max_seq_len);
/* true where NVFP4 launches (issue 13) of this forced mode, head_dim and GQA group run v4 (attention_dec.cu:
 * every such launch, in fold or split mode, whatever OSP_CUDA_ATTN_DEC_* says, so their rows have one
 * numerics): D 64 / 128, groups up to 16, any mode but v0; elsewhere NVFP4 runs v0. */
bool osp_cuda_attention_v4_nvfp4(int mode, int D, int group);
/* The launcher; arguments as osp_cuda_paged_attention_q, already validated by it: kv_type
 * OSP_KV_PAGE_F16, or OSP_KV_PAGE_FP8 with the layer's fixed scales d_k_fixed / d_v_fixed ([n_head_kv]
 * fp32; NULL for f16) where osp_cuda_attention_tc_serves says so, or OSP_KV_PAGE_NVFP4 with its tensor
 * scales d_k_fixed / d_v_fixed ([1] fp32) and micro-block scale pools d_k_scale / d_v_scale where
 * osp_cuda_attention_v4_nvfp4 says so (NULL otherwise). */
osp_status osp_cuda_paged_attention_v1(const uint16_t *d_q, const void *d_k_pages, const void *d_v_pages,
                                       uint32_t kv_type, const float *d_k_fixed, const float *d_v_fixed,
                                       const uint8_t *d_k_scale, const uint8_t *d_v_scale, uint16_t *d_out, int32_t num_seqs, const int32_t *d_query_start_loc,
                                       const int32_t *d_positions, const int32_t *d_block_table, int32_t max_blocks,
                                       int32_t block_size, int64_t T, int n_head, int n_head_kv, int D, float scale,
                                       int32_t window, int32_t max_seq_len, void *d_workspace, void *stream);

#ifdef __cplusplus
}
#endif
#endif
