/* The engine path's glue around the Quest kernels (issue 15; quest.cu selects, attention_sparse.cu
 * attends): the two small kernels the CUDA backend's ATTENTION op needs to run sparse attention inside a
 * step (backend_cuda.c, osp_dev_sparse in backend.h). Contracts in cuda_ops.h.
 *
 *   quest_refresh_kernel  recomputes the f16 min / max summary of each page a step wrote, from the page's
 *                         first n_valid keys: a CTA a page, a thread a (KV head, channel), the keys walked
 *                         in slot order with the CPU reference's comparisons (src/sparse/quest.c's
 *                         osp_quest_summarize_block: k < min, k > max, starting from +inf / -inf). Each
 *                         output element has one writer and no atomics: deterministic, and the min / max
 *                         of f16 keys are f16 keys, so the f16 summaries are exact.
 *   rows_copy_kernel      gathers (dst[i] = src[idx[i]]) or scatters (dst[idx[i]] = src[i]) whole rows of
 *                         16-byte words: the sparse rows of a step's q into a dense block for the Quest
 *                         kernels, and their outputs back. */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int kRefreshThreads = 256;
constexpr int kCopyThreads = 128;

/* blockIdx.x: entry e of the list (blocks[e] < 0: nothing); thread: channels c = h * D + d of the page */
__global__ void __launch_bounds__(kRefreshThreads)
    quest_refresh_kernel(const __half *k_pages, const int32_t *blocks, const int32_t *n_valid, int block_size, int row,
                         __half *kmin, __half *kmax) {
    osp_pdl_begin();
    const int e = (int)blockIdx.x;
    const int b = blocks[e];
    if (b < 0) return;
    const int n = min(n_valid[e], block_size);
    const __half *pg = k_pages + (int64_t)b * block_size * row;
    for (int c = (int)threadIdx.x; c < row; c += kRefreshThreads) {
        float mn = INFINITY, mx = -INFINITY;
        for (int i = 0; i < n; i++) {
            const float k = __half2float(pg[(int64_t)i * row + c]);
            if (k < mn) mn = k;
            if (k > mx) mx = k;
        }
        /* exact: f16 values, or +-inf (a page of NaN keys only, as the reference leaves it) */
        kmin[(int64_t)b * row + c] = __float2half_rn(mn);
        kmax[(int64_t)b * row + c] = __float2half_rn(mx);
    }
}

/* blockIdx.x: row i; scatter false: dst[i] = src[idx[i]] (zeros where idx[i] < 0); true: dst[idx[i]] =
 * src[i] where idx[i] >= 0 */
__global__ void __launch_bounds__(kCopyThreads)
    rows_copy_kernel(const uint4 *src, uint4 *dst, const int32_t *idx, int64_t words, bool scatter) {
    osp_pdl_begin();
    const int64_t i = blockIdx.x;
    const int j = idx[i];
    if (scatter && j < 0) return;
    const uint4 *s = scatter ? src + i * words : src + (int64_t)(j < 0 ? 0 : j) * words;
    uint4 *d = scatter ? dst + (int64_t)j * words : dst + i * words;
    for (int64_t w = threadIdx.x; w < words; w += kCopyThreads) d[w] = j < 0 ? make_uint4(0u, 0u, 0u, 0u) : s[w];
}

} // namespace

extern "C" osp_status osp_cuda_quest_refresh(const void *d_k_pages, const int32_t *d_blocks, const int32_t *d_n_valid,
                                             int32_t n, int32_t block_size, int n_head_kv, int D, void *d_kmin,
                                             void *d_kmax, void *stream) {
    if (n < 0 || block_size < 1 || n_head_kv < 1 || D < 1 || (int64_t)n_head_kv * D > INT32_MAX / 2)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest refresh: %d pages, block %d, %d x %d", n, block_size, n_head_kv, D);
    if (n == 0) return OSP_OK;
    if (!d_k_pages || !d_blocks || !d_n_valid || !d_kmin || !d_kmax)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quest refresh: NULL argument");
    osp_launch(quest_refresh_kernel, dim3((unsigned)n), kRefreshThreads, 0, static_cast<cudaStream_t>(stream),
               static_cast<const __half *>(d_k_pages), d_blocks, d_n_valid, (int)block_size, n_head_kv * D,
               static_cast<__half *>(d_kmin), static_cast<__half *>(d_kmax));
    OSP_CUDA_LAUNCH_CHECK("quest_refresh_kernel");
    return OSP_OK;
}

extern "C" osp_status osp_cuda_rows_copy(const void *d_src, void *d_dst, const int32_t *d_idx, int64_t n,
                                         size_t row_bytes, bool scatter, void *stream) {
    if (n < 0 || n > 0x7fffffff || row_bytes % 16 || row_bytes == 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "rows copy: %lld rows of %zu bytes (a multiple of 16)", (long long)n,
                             row_bytes);
    if (n == 0) return OSP_OK;
    if (!d_src || !d_dst || !d_idx || (((uintptr_t)d_src | (uintptr_t)d_dst) & 15u))
        return osp_set_error(OSP_ERR_INVALID_ARG, "rows copy: NULL or unaligned argument");
    osp_launch(rows_copy_kernel, dim3((unsigned)n), kCopyThreads, 0, static_cast<cudaStream_t>(stream),
               static_cast<const uint4 *>(d_src), static_cast<uint4 *>(d_dst), d_idx, (int64_t)(row_bytes / 16), scatter);
    OSP_CUDA_LAUNCH_CHECK("rows_copy_kernel");
    return OSP_OK;
}
