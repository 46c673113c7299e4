/* The CUDA backend's C interface: device memory, streams, events, graphs, cuBLASLt GEMMs and the
 * kernels of the llama-family forward pass and the sampler, each an extern "C" launcher defined in
 * its own .cu file under src/backend/cuda/ and checked against a CPU reference (tests/gpu/).
 *
 * Only src/backend/cuda/ includes CUDA headers; this header is plain C, so model/ and engine/ code
 * calls the backend without them. Streams are passed as `void *` (a cudaStream_t; NULL = the legacy
 * default stream). Every pointer named `d_*` or documented "device" is device memory; shapes are
 * row-major, innermost last: [num_tokens, hidden] means num_tokens rows of hidden values.
 *
 * Types on the device: weights and GEMM inputs are bf16 (uint16_t bit patterns here), the residual
 * stream and logits fp32, KV pages f16 (default), f32 (exact), FP8 E4M3, NVFP4 (issue 13) or INT8_HIER
 * (QuantSpec's hierarchical INT8, issue 14) in the CPU cache's layout [num_blocks, block_size, n_head_kv,
 * head_dim] per layer (src/kv/kv_cache.h).
 *
 * Launchers only enqueue work: they do not synchronize, allocate nothing, and are safe inside CUDA
 * graph capture. They return OSP_OK, or OSP_ERR_INVALID_ARG for a shape they do not support (checked
 * on the host before launching), or OSP_ERR_INTERNAL when the launch itself failed (cudaGetLastError;
 * the message names the kernel and CUDA's error string).
 *
 * Only CUDA builds have these functions (OSPREY_CUDA on): the rest of osprey reaches them through the
 * CUDA backend (backend_cuda.c), which builds without CUDA replace by backend_cuda_stub.c. */
#ifndef OSP_BACKEND_CUDA_OPS_H
#define OSP_BACKEND_CUDA_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- runtime (runtime.cu) ----------------------------------------------------------------------- */

/* True when osprey was built with the CUDA backend. */
bool osp_cuda_built(void);
/* Number of CUDA devices usable now (0 without a driver, a device, or the CUDA build). Never fails. */
int osp_cuda_device_count(void);
/* "NVIDIA H200, 132 SMs, 139.8 GiB, sm_90" into buf (always NUL-terminated). */
osp_status osp_cuda_device_name(char *buf, size_t n);
/* GPU 0's name ("NVIDIA H200") into name [n], its compute capability (9, 0 for sm_90), the driver's
 * CUDA version (cudaDriverGetVersion: 12040 for 12.4) and its L2 size in bytes. */
osp_status osp_cuda_device_props(char *name, size_t n, int *cc_major, int *cc_minor, int *driver_version,
                                 size_t *l2_bytes);
/* Free and total bytes of device memory. */
osp_status osp_cuda_mem_info(size_t *free_bytes, size_t *total_bytes);

/* Device allocation of `bytes` (cudaMalloc). `what` names the buffer in the error message. */
osp_status osp_cuda_malloc(void **d_ptr, size_t bytes, const char *what);
void osp_cuda_free(void *d_ptr); /* NULL is fine */
/* Pinned host allocation (cudaMallocHost): the source/destination of asynchronous copies. */
osp_status osp_cuda_host_alloc(void **ptr, size_t bytes, const char *what);
void osp_cuda_host_free(void *ptr);
/* Page-locks [ptr, ptr + bytes) of ordinary host memory (cudaHostRegister) so copies from and to it are
 * DMA, asynchronous to the host, and maps it into the device's address space where the driver allows
 * (osp_cuda_copy_many's kernel then reads and writes it in place); OSP_ERR_NOMEM when the driver refuses.
 * Unregister before freeing it. */
osp_status osp_cuda_host_register(void *ptr, size_t bytes);
void osp_cuda_host_unregister(void *ptr);

osp_status osp_cuda_stream_create(void **stream);
void osp_cuda_stream_destroy(void *stream);
osp_status osp_cuda_stream_sync(void *stream);
/* Asynchronous copies on `stream` (host memory should be pinned for them to be asynchronous). */
osp_status osp_cuda_h2d(void *d_dst, const void *src, size_t bytes, void *stream);
osp_status osp_cuda_d2h(void *dst, const void *d_src, size_t bytes, void *stream);
osp_status osp_cuda_d2d(void *d_dst, const void *d_src, size_t bytes, void *stream);
/* n copies between device memory and host memory in one direction (to_host: dst[i] host, src[i] device;
 * else the reverse), bytes[i] each (0 allowed, any alignment), done when it returns (it synchronizes
 * `stream`). When every host side lies in memory registered by osp_cuda_host_register and mapped, one
 * kernel moves them all over the mapped addresses (a KV block is n_layer x K/V segments of a few
 * dozen KiB: one cudaMemcpyAsync each costs ~10 us of overhead); otherwise, or with
 * OSPREY_CUDA_COPY_KERNEL=0, one cudaMemcpyAsync a copy. The copies must not overlap. Calls are
 * serialized (one descriptor buffer). */
osp_status osp_cuda_copy_many(bool to_host, int32_t n, void *const *dst, const void *const *src, const size_t *bytes,
                              void *stream);
osp_status osp_cuda_memset(void *d_dst, int byte, size_t bytes, void *stream);
/* n copies inside device memory (dst[i], src[i] device addresses of this process, including memory
 * mapped from another process by osp_cuda_ipc_open), bytes[i] each (0 allowed, any alignment), done when
 * it returns (it synchronizes `stream`): one copy_many kernel for all of them (or, with
 * OSPREY_CUDA_COPY_KERNEL=0, one cudaMemcpyAsync a copy). The copies must not overlap. Serialized with
 * osp_cuda_copy_many (one descriptor buffer). */
osp_status osp_cuda_copy_many_d2d(int32_t n, void *const *dst, const void *const *src, const size_t *bytes,
                                  void *stream);

/* ---- CUDA IPC (prefill/decode disaggregation on one GPU: src/kv/transfer.h) ----------------------- */

#define OSP_CUDA_IPC_HANDLE_BYTES 64 /* sizeof(cudaIpcMemHandle_t) */
#define OSP_CUDA_UUID_BYTES 16       /* sizeof(cudaUUID_t) */

/* The current device's UUID (cudaDeviceProp.uuid): two processes on one GPU see the same bytes, whatever
 * CUDA_VISIBLE_DEVICES numbers it. */
osp_status osp_cuda_device_uuid(uint8_t uuid[OSP_CUDA_UUID_BYTES]);
/* The IPC handle of d_ptr, the start of an allocation made by osp_cuda_malloc (cudaIpcGetMemHandle):
 * another process on the same device opens it with osp_cuda_ipc_open. */
osp_status osp_cuda_ipc_handle(void *d_ptr, uint8_t handle[OSP_CUDA_IPC_HANDLE_BYTES]);
/* Maps another process's allocation (its handle) into this one (cudaIpcOpenMemHandle, lazy peer access):
 * *d_ptr is its first byte here. Fails (OSP_ERR_INTERNAL with CUDA's message) in the exporting process
 * itself, on another device, or when the exporter has freed it or exited. Close with osp_cuda_ipc_close. */
osp_status osp_cuda_ipc_open(const uint8_t handle[OSP_CUDA_IPC_HANDLE_BYTES], void **d_ptr);
void osp_cuda_ipc_close(void *d_ptr); /* NULL is fine */

/* Events for timing: elapsed milliseconds between two recorded events (synchronizes on `end`). */
osp_status osp_cuda_event_create(void **ev);
void osp_cuda_event_destroy(void *ev);
osp_status osp_cuda_event_record(void *ev, void *stream);
osp_status osp_cuda_event_elapsed_ms(void *start, void *end, float *ms);

/* CUDA graphs: capture everything enqueued on `stream` between begin and end into an executable
 * graph; launch replays it on `stream`. */
osp_status osp_cuda_graph_begin(void *stream);
osp_status osp_cuda_graph_end(void *stream, void **graph_exec);
osp_status osp_cuda_graph_launch(void *graph_exec, void *stream);
void osp_cuda_graph_destroy(void *graph_exec);

/* ---- GEMM through cuBLASLt (gemm.cu) ------------------------------------------------------------- */

/* The KV page element types the kernels read and write (ggml type ids, as the page format's
 * elem_type: src/backend/kv_layout.h); another value is OSP_ERR_INVALID_ARG. */
#define OSP_KV_PAGE_F32 0u
#define OSP_KV_PAGE_F16 1u
/* The quantized page formats (issues 13 and 14; layouts, scales and rounding in src/kv/kv_cache.h): the
 * page format's elem_type for them is the osp_kv_dtype value (osprey/batch.h's OSP_KV_DTYPE_FP8 / NVFP4 /
 * INT8_HIER). INT8_HIER pages hold per token and KV head D / 2 bytes of upper 4-bit codes, then the row's
 * f16 scale S and f16 minimum M: [num_slots, n_head_kv, D / 2 + 4] bytes; the lower 4-bit codes are in
 * the second pool (d_k_scale / d_v_scale below), [num_slots, n_head_kv, D / 2] bytes. */
#define OSP_KV_PAGE_FP8 128u
#define OSP_KV_PAGE_NVFP4 129u
#define OSP_KV_PAGE_INT8H 130u

/* The scales of one layer's quantized pages, as the kernels take them (NULL for f16 / f32 pages):
 *   d_k_fixed, d_v_fixed: device fp32, the scales fixed at cache creation (kv_cache.h's k_fixed /
 *     v_fixed rows of this layer): fp8 [n_head_kv] (one per KV head), nvfp4 [1] (the tensor scale);
 *     NULL for int8_hier (each row carries its own);
 *   d_k_scale, d_v_scale: device, the second pools of this layer (NULL for fp8), addressed by slot as the
 *     pages: nvfp4's micro-block scales [num_slots, n_head_kv, D / 16] E4M3 codes, or int8_hier's lower
 *     codes [num_slots, n_head_kv, D / 2] bytes;
 *   hier_upper_only, hier_full_recent: how attention reads int8_hier pages (kv_layout.h's osp_kv_cache
 *     fields; the KV write ignores them): false, both halves everywhere (the target's view); true, the
 *     upper halves only except keys at positions >= seq_len - hier_full_recent (>= 0) of each sequence,
 *     read in full (QuantSpec's draft view; attention.cu says why seq_len). Ignored for other page types.
 * The pointers are read when the kernels run (a captured graph keeps them, not their contents); the two
 * hier fields are kernel arguments (a captured graph keeps their values). */
typedef struct osp_cuda_kv_quant {
    const float *d_k_fixed, *d_v_fixed;
    uint8_t *d_k_scale, *d_v_scale;
    bool hier_upper_only;
    int32_t hier_full_recent;
} osp_cuda_kv_quant;

typedef struct osp_cuda_gemm osp_cuda_gemm;

/* A cuBLASLt handle with one workspace of `workspace_bytes` (allocated here, once) and a cache of
 * matmul plans by shape. */
osp_status osp_cuda_gemm_create(size_t workspace_bytes, osp_cuda_gemm **out);
void osp_cuda_gemm_destroy(osp_cuda_gemm *g);

/* y[t, n] = sum_k x[t, k] * w[n, k] (y = x w^T), bf16 inputs, fp32 accumulation.
 * d_x: [T, K] bf16, d_w: [N, K] bf16 (a weight stored as N rows of K), d_y: [T, N] of bf16
 * (y_f32 false) or fp32 (y_f32 true). The first call for a shape picks the plan (host work, not
 * capturable: run every shape once before capturing a graph); later calls only enqueue. */
osp_status osp_cuda_gemm_bf16(osp_cuda_gemm *g, const uint16_t *d_x, const uint16_t *d_w, void *d_y, bool y_f32,
                              int64_t T, int64_t N, int64_t K, void *stream);

/* As osp_cuda_gemm_bf16 with the output's rows ldy >= N elements apart: the N columns land at d_y
 * (which may point into a wider [T, ldy] output, e.g. one row range of a matrix done in chunks). */
osp_status osp_cuda_gemm_bf16_ld(osp_cuda_gemm *g, const uint16_t *d_x, const uint16_t *d_w, void *d_y, bool y_f32,
                                 int64_t T, int64_t N, int64_t K, int64_t ldy, void *stream);

/* ---- skinny GEMMs (gemm_skinny.cu) -------------------------------------------------------------- */

/* The largest T the skinny kernel takes. */
#define OSP_CUDA_SKINNY_MAX_T 64

/* Whether osp_cuda_skinny_bf16 takes these arguments: compute capability >= 9.0, 1 <= T <=
 * OSP_CUDA_SKINNY_MAX_T, K a multiple of 16, d_x and d_w 16-byte aligned. */
bool osp_cuda_skinny_supported(const void *d_x, const void *d_w, int64_t T, int64_t N, int64_t K);

/* y = x w^T as osp_cuda_gemm_bf16_ld (same shapes, types and ldy), for the few rows of a decode step:
 * weights streamed through shared memory by TMA, N spread over the SMs, and every output the fp32 chain
 * of tensor-core k16 steps in K order that cuBLASLt's unsplit plans compute, so its bits equal theirs
 * (measured by tests/gpu/test_gpu_gemm.c; gemm_skinny.cu has the design). Enqueue only; no host work
 * after the first call of a configuration (capturable). Errors: OSP_ERR_INVALID_ARG where
 * osp_cuda_skinny_supported is false. */
osp_status osp_cuda_skinny_bf16(const uint16_t *d_x, const uint16_t *d_w, void *d_y, bool y_f32, int64_t T, int64_t N,
                                int64_t K, int64_t ldy, void *stream);

/* Moves when a plan needed a larger workspace (split-K partials of a large T) and it was reallocated:
 * a CUDA graph captured before holds the old workspace and must be dropped. */
uint64_t osp_cuda_gemm_generation(const osp_cuda_gemm *g);

/* ---- quantized weights (qmatmul.cu) ---------------------------------------------------------------- */

/* Matrices the CUDA backend keeps in their GGUF block-quantized form (issue 17): rows of `type`
 * exactly as ggml-common.h lays them out (the file's bytes), row_bytes = K / block values * block
 * bytes apart. True for Q8_0, Q4_0, Q4_1, Q4_K and Q6_K. */
bool osp_cuda_qtype_supported(uint32_t type);

/* Activations quantized for osp_cuda_qmatmul: T rows of K values in blocks of 32, two int8 levels
 * per block (x ~ d q1 + d2 q2, d2 = d / 256, the second level quantizing the first's residual: the
 * CPU's osp_q8_block scheme, backend/cpu/qdot.h), with one d = amax / 127 per `group` values: 32 (the
 * CPU's scheme; Q8_0, Q4_0, Q4_1 read it) or 256 (the K-quant types: a super-block's sub-blocks then
 * share the activation scale and qmma folds them in integers; ~2^-15 of the group's amax instead of
 * the block's). Rows padded to Tp = T rounded up to 8. Points into the caller's workspace. */
typedef struct osp_cuda_qx {
    const void *codes;  /* [K / 32][Tp][64] int8: a block's 32 first-level codes, then its 32 second-level */
    const void *scales; /* [K / 32][Tp] float4: group 32: {d2, sum of all 32 values, of values 0..15, of
                         * 16..31}; group 256: {d2 of the group, then as int32 bits S = 256 s1 + s2 (s1, s2
                         * the level's code sums) over the block's 32 values, its values 0..15, 16..31} */
    int64_t T, Tp, K;
    int32_t group; /* values sharing one d: 32 or 256 */
} osp_cuda_qx;

/* The group osp_cuda_qmatmul reads for `type`: 256 for Q4_K and Q6_K, 32 for Q8_0, Q4_0, Q4_1, 0 for
 * types it does not take. */
int32_t osp_cuda_qmatmul_group(uint32_t type);

/* Workspace bytes osp_cuda_qx_quantize needs for T rows of K values (0 for T or K <= 0): 80 a block,
 * for either group. */
size_t osp_cuda_qx_workspace_bytes(int64_t T, int64_t K);

/* Quantizes d_x [T, K] bf16 (K % group == 0; group 32 or 256; for 256, d_x 16-byte aligned) into d_ws
 * (16-byte aligned, >= the workspace bytes) and describes it in *qx. Each row is quantized on its own
 * (its codes do not depend on T). A block (group 32) or group (256) with a non-finite value makes its
 * outputs NaN. Errors: OSP_ERR_INVALID_ARG (shapes, group, workspace), OSP_ERR_INTERNAL (launch).
 * Enqueues only. */
osp_status osp_cuda_qx_quantize(const uint16_t *d_x, int64_t T, int64_t K, int32_t group, void *d_ws, size_t ws_bytes,
                                osp_cuda_qx *qx, void *stream);

/* Programmatic dependent launch for the kernels launched after this (cuda_common.cuh: osp_launch)
 * when OSPREY_CUDA_PDL is unset; process-wide. The CUDA backend turns it on where its matrices are
 * quantized (every kernel of a step is then ours). */
void osp_cuda_set_pdl_default(bool on);

/* Describes in *qx where T rows of K values lie quantized in d_ws (the layout osp_cuda_qx_quantize
 * writes), checking what it checks; writes nothing on the device. */
osp_status osp_cuda_qx_layout(void *d_ws, size_t ws_bytes, int64_t T, int64_t K, int32_t group, osp_cuda_qx *qx);

/* Whether osp_cuda_qmatmul takes `type` with K columns (K % 64 == 0 for Q8_0, Q4_0, Q4_1; K % 256
 * == 0 for Q4_K, Q6_K). */
bool osp_cuda_qmatmul_supported(uint32_t type, int64_t K);

/* y[t, n] = sum_k x[t, k] w[n, k] for t < qx->T, n < N, any T: d_w N rows of `type` (row_bytes apart;
 * 16-byte aligned for Q4_K, 4 for Q4_1, 2 for the others), x as quantized by osp_cuda_qx_quantize (K = qx->K,
 * qx->group = osp_cuda_qmatmul_group(type)), d_y [T, ldy] fp32 (y_f32) or bf16, columns [0, N) written.
 * The products of each 32-value block run on the integer tensor cores (exact); Q8_0 / Q4_0 / Q4_1 fold
 * every block into the output in fp32, Q4_K / Q6_K sum a unit's blocks times their sub-block scales in
 * int32 (exact) and fold once a unit; in K order over 8 K slices fixed by K: a row's result is the same
 * bits for any T and any place in the batch (issue 17's batch invariance). Errors:
 * OSP_ERR_UNSUPPORTED (type, K), OSP_ERR_INVALID_ARG (also a qx of the wrong group), OSP_ERR_INTERNAL.
 * Enqueues only (graph-capturable). */
osp_status osp_cuda_qmatmul(uint32_t type, const void *d_w, size_t row_bytes, int64_t N, const osp_cuda_qx *qx, void *d_y,
                            int64_t ldy, bool y_f32, void *stream);

/* d_dst[r, :] = bf16(row r of d_w) for r < rows, [rows, K] bf16 (16-byte aligned): the values of
 * core/dtype.c's osp_dequant_row rounded to nearest even, bit for bit (what the bf16 weight path
 * uploads; the tests' proof of the per-type decoding). Errors: OSP_ERR_UNSUPPORTED (type),
 * OSP_ERR_INVALID_ARG (shapes, alignment), OSP_ERR_INTERNAL (launch). Enqueues only. */
osp_status osp_cuda_qdequant_bf16(uint32_t type, const void *d_w, size_t row_bytes, int64_t rows, int64_t K,
                                  uint16_t *d_dst, void *stream);

/* d_x[t, :] = bf16(row d_ids[t] of d_table) * scale in fp32, for t < T rows of E values: osp_cuda_embed
 * on the bf16 copy of the table, bit for bit. Ids are not checked (the engine validates them). */
osp_status osp_cuda_qembed(uint32_t type, const void *d_table, size_t row_bytes, const int32_t *d_ids, float *d_x,
                           int64_t T, int64_t E, float scale, void *stream);

/* The device's bf16 GEMM rate, measured: a GEMM of [T, K] x [N, K]^T with bf16 output (the layout and
 * path of osp_cuda_gemm_bf16, fp32 accumulation), its operands filled on the device with pseudo-random
 * values in [-1, 1) (constant data draws less power and would overstate the peak), 5 warm-up calls,
 * then `reps` calls timed with events on a stream of its own. *gflops = 2 T N K reps / seconds / 1e9
 * (0 on error). Allocates 2 (T K + N K + T N) bytes and a 32 MiB workspace on GPU 0 for the call and
 * frees them before returning; synchronous. Errors: OSP_ERR_INVALID_ARG (a dimension or reps <= 0),
 * OSP_ERR_NOMEM / OSP_ERR_INTERNAL from CUDA or cuBLASLt. Meant for benchmarks (bench/kernels/): a
 * 8192^3 call takes ~50 ms on an H200. */
osp_status osp_cuda_gemm_peak_gflops(int64_t T, int64_t N, int64_t K, int reps, double *gflops);

/* ---- elementwise and row kernels (ops.cu) ---------------------------------------------------------- */

/* x[t, :] = float(table[ids[t], :]) * scale (one fp32 multiply; Gemma scales by sqrt(E), others 1).
 * d_table: [V, E] bf16; d_ids: [T] (each < V, checked by the caller); d_x: [T, E] fp32. */
osp_status osp_cuda_embed(const uint16_t *d_table, const int32_t *d_ids, float *d_x, int64_t T, int64_t E,
                          float scale, void *stream);

/* Fused residual add + RMSNorm (Zhang & Sennrich 2019), per row t < T of E values:
 *   if d_delta: x[t] += float(delta[t])          (x updated in place: the residual stream)
 *   out[t] = bf16(x[t] / sqrt(mean(x[t]^2) + eps) * w)
 * d_x: [T, E] fp32 (in/out), d_delta: [T, E] bf16 or NULL, d_w: [E] fp32, d_out: [T, E] bf16.
 * d_out NULL (then d_w may be NULL): the residual add alone. */
osp_status osp_cuda_add_rmsnorm(float *d_x, const uint16_t *d_delta, const float *d_w, uint16_t *d_out, int64_t T,
                                int64_t E, float eps, void *stream);

/* osp_cuda_add_rmsnorm with d_out (and d_w) given, for T <= 8 rows, that also quantizes out for
 * osp_cuda_qmatmul in `group` into d_ws and describes it in *qx: x's and out's bits are
 * osp_cuda_add_rmsnorm's, the workspace bytes osp_cuda_qx_quantize(d_out, T, E, group, ...)'s (the CUDA
 * backend runs this when a quantized matmul reads the norm next: one launch instead of two, and a row
 * spread over up to 8 CTAs instead of one). d_sync: 16 unsigned (a barrier per row: its arrivals and
 * generation; zero when first used, then left to this function; not shared with concurrent launches).
 * d_x 16-byte, d_w
 * 16-byte, d_out and d_delta 8-byte aligned, E % 4 == 0, E % group == 0. Errors: OSP_ERR_INVALID_ARG
 * (shapes, pointers, workspace), OSP_ERR_INTERNAL (launch). */
bool osp_cuda_add_rmsnorm_qx_supported(int64_t T, int64_t E, int32_t group);
osp_status osp_cuda_add_rmsnorm_qx(float *d_x, const uint16_t *d_delta, const float *d_w, uint16_t *d_out, int64_t T,
                                   int64_t E, float eps, int32_t group, unsigned *d_sync, void *d_ws,
                                   size_t ws_bytes, osp_cuda_qx *qx, void *stream);

/* RMSNorm of the rows in idx: out[i] = bf16(rmsnorm(x[idx[i]]) * w) for i < n.
 * d_x: [*, E] fp32, d_idx: [n], d_w: [E] fp32, d_out: [n, E] bf16 (the lm_head's input). */
osp_status osp_cuda_gather_rmsnorm(const float *d_x, const int32_t *d_idx, const float *d_w, uint16_t *d_out,
                                   int64_t n, int64_t E, float eps, void *stream);

/* RoPE and the KV write, per token t < T (one launch for q, k and v):
 *   q, k, v = the three column ranges of d_qkv[t] = [QD | KD | KD] (QD = n_head * D, KD = n_head_kv * D), fp32;
 *   + d_bias ([QD + 2 KD] fp32, or NULL: qwen2's q/k/v biases);
 *   each head of q and k RMS-normalized with d_q_norm / d_k_norm ([D] fp32, or NULL: qwen3), eps;
 *   the first n_rot dims of each q and k head rotated by positions[t] * inv_freq[i] (d_inv_freq:
 *   [n_rot / 2] fp32), pairs (2i, 2i+1) when neox is false (ggml's NORMAL rope, llama GGUFs), pairs
 *   (i, i + n_rot/2) when true (qwen2/qwen3), the angle computed in fp32 as the CPU reference does;
 *   d_q_out[t] = bf16(q) ([T, QD]); k and v written to slot slot_mapping[t] of the pages
 *   (element [slot, h, d] of d_k_pages / d_v_pages: [num_slots, n_head_kv, D] of f16 (kv_type OSP_KV_PAGE_F16)
 *   or fp32). A negative slot skips the write (padding rows of a CUDA graph). */
osp_status osp_cuda_rope_kv_write(const float *d_qkv, const float *d_bias, const float *d_q_norm,
                                  const float *d_k_norm, const int32_t *d_positions, const float *d_inv_freq,
                                  const int32_t *d_slot_mapping, uint16_t *d_q_out, void *d_k_pages,
                                  void *d_v_pages, uint32_t kv_type, int64_t T, int n_head, int n_head_kv, int D,
                                  int n_rot, bool neox, float eps, void *stream);
/* The same for any page type, quantized ones included (kv_type OSP_KV_PAGE_FP8 / NVFP4 / INT8H with kq
 * their scales or pools; kq is ignored, and may be NULL, for f16 / f32). Each token's K and V rows are
 * quantized on their own at their slot, producing the bytes and micro-block scales of the CPU's write
 * (src/backend/cpu/kv_quant.c, core/dtype.c's osp_fp32_to_e4m3 / osp_nvfp4_quantize16 /
 * osp_int8h_quantize_row: the same divisions, round to nearest even, saturation, NaN codes), so a given
 * fp32 K/V row gives the same page bytes on both backends. fp8: page byte [slot, h, d] = e4m3(x /
 * d_k_fixed[h]); nvfp4: byte [slot, h, d / 2] holds value d in its low nibble (d even) or high nibble,
 * and scale byte [slot, h, d / 16] the micro-block's E4M3 scale; int8_hier (QuantSpec, Tiwari et al.
 * 2025, section 4.1): page bytes [slot, h, 0 .. D / 2) the upper codes (nibbles as nvfp4's), then S and
 * M (f16, little-endian), lower-pool bytes [slot, h, 0 .. D / 2) the lower codes (d_k_scale /
 * d_v_scale). nvfp4 needs D % 16 == 0, int8_hier an even D. OSP_ERR_INVALID_ARG also for a quantized
 * type without kq or its pointers. */
osp_status osp_cuda_rope_kv_write_q(const float *d_qkv, const float *d_bias, const float *d_q_norm,
                                    const float *d_k_norm, const int32_t *d_positions, const float *d_inv_freq,
                                    const int32_t *d_slot_mapping, uint16_t *d_q_out, void *d_k_pages,
                                    void *d_v_pages, uint32_t kv_type, const osp_cuda_kv_quant *kq, int64_t T,
                                    int n_head, int n_head_kv, int D, int n_rot, bool neox, float eps, void *stream);

/* out[t, j] = bf16(silu(gu[t, j]) * gu[t, F + j]) for j < F: d_gu: [T, 2F] bf16 (gate | up, one
 * GEMM's output), d_out: [T, F] bf16. silu(x) = x / (1 + exp(-x)) in fp32. */
osp_status osp_cuda_silu_mul(const uint16_t *d_gu, uint16_t *d_out, int64_t T, int64_t F, void *stream);
/* d_out[i] = scale * d_in[i], and d_out[i] = cap * tanh(d_in[i] / cap) (logit softcapping, Gemma 2;
 * cap > 0), over n fp32 values; d_in may equal d_out. */
osp_status osp_cuda_scale_f32(const float *d_in, float *d_out, int64_t n, float scale, void *stream);
osp_status osp_cuda_softcap_f32(const float *d_in, float *d_out, int64_t n, float cap, void *stream);
/* The same with GELU's tanh approximation in place of silu (Gemma's gelu_pytorch_tanh). */
osp_status osp_cuda_gelu_mul(const uint16_t *d_gu, uint16_t *d_out, int64_t T, int64_t F, void *stream);
/* silu_mul (gelu_mul when gelu) that also quantizes out for osp_cuda_qmatmul into d_ws and describes
 * it in *qx: out's bits and the bytes osp_cuda_qx_quantize(d_out, T, F, group, ...) writes (F % group == 0),
 * without its launch (the CUDA backend runs this when a quantized matmul reads the product next).
 * Errors as both. (The RMSNorm's counterpart, osp_cuda_add_rmsnorm_qx, spreads a row over several CTAs:
 * with one thread block a row quantizing its 128 blocks in turn it was slower; bench/gpu/DECODE.md.) */
osp_status osp_cuda_glu_qx(const uint16_t *d_gu, uint16_t *d_out, int64_t T, int64_t F, bool gelu, int32_t group,
                           void *d_ws, size_t ws_bytes, osp_cuda_qx *qx, void *stream);

/* out[r] = the index of the largest of logits[r, 0..V) (the smallest such index on ties; a NaN
 * never wins unless the row is all NaN, then -1). d_logits: [R, V] fp32, d_out: [R] int32. */
osp_status osp_cuda_argmax(const float *d_logits, int32_t *d_out, int64_t R, int64_t V, void *stream);

/* Conversions for loading weights: d_out[i] = bf16(d_in[i]) (round to nearest even, NaN kept). */
osp_status osp_cuda_f32_to_bf16(const float *d_in, uint16_t *d_out, int64_t n, void *stream);

/* Seeded random weights, the same values tools/osprey make-random-model writes (its randn: the sum
 * of four uniform 16-bit draws of splitmix64(key + (i + 1) * golden), minus its mean, times scale):
 *   d_out[i] = offset + randn(key, base + i, scale), i < n, as bf16 (fill_bf16) or fp32 (fill_f32). */
osp_status osp_cuda_fill_randn_bf16(uint16_t *d_out, int64_t n, uint64_t key, uint64_t base, float scale,
                                    float offset, void *stream);
osp_status osp_cuda_fill_randn_f32(float *d_out, int64_t n, uint64_t key, uint64_t base, float scale, float offset,
                                   void *stream);

/* ---- paged attention (attention.cu) ---------------------------------------------------------------- */

/* Causal attention over the paged KV cache for a mixed batch (prefill chunks and decodes together),
 * the CUDA counterpart of osp_cpu_paged_attention (src/backend/cpu/ops.h):
 *   d_q:   [T, n_head, D] bf16          d_out: [T, n_head, D] bf16
 *   pages: [num_blocks, block_size, n_head_kv, D] of f16 (kv_type OSP_KV_PAGE_F16) or fp32 (OSP_KV_PAGE_F32)
 *   token t of sequence s (query_start_loc[s] <= t < query_start_loc[s + 1]) attends to positions
 *   0..positions[t] of s, whose K/V sit in block block_table[s * max_blocks + p / block_size] at
 *   offset p % block_size; query head h reads kv head h / (n_head / n_head_kv).
 *   out = softmax(q k^T * scale) v, fp32 softmax and accumulation (online softmax, Milakov &
 *   Gimelshein 2018; FlashAttention, Dao et al. 2022), split over the KV length for long contexts
 *   (FlashDecoding) with the partial results merged by their log-sum-exp. Two kernels:
 *   attention.cu (v0, CUDA cores) and attention_mma.cu (v1, tensor cores, f16 pages at D <= 128,
 *   a row's result independent of its batch); attention_v1.h says which serves a launch.
 * All index arrays are device memory: d_query_start_loc [num_seqs + 1] (0 first, T last),
 * d_positions [T], d_block_table [num_seqs, max_blocks] (entries past a sequence's blocks are never
 * read). Sequences with no tokens are allowed (query_start_loc equal): they produce nothing.
 * max_seq_len bounds every positions[t] + 1; it only caps the number of KV splits (the grid depends on
 * T, num_seqs, the head counts and max_seq_len, never on the device arrays: keep them fixed, e.g.
 * max_seq_len = max_model_len, when capturing a graph; the split length adapts to each query tile's
 * own context on the device). d_q, d_out, the pages and d_workspace must be 16-byte aligned (any
 * cudaMalloc'd buffer and any row or layer offset into one is). OSP_ERR_INVALID_ARG for an
 * unsupported shape, bad sizes, NULL or misaligned pointers.
 * osp_cuda_attention_supported: head_dim D 32, 64, 128 or 256 and n_head a multiple of n_head_kv
 * (any group size; up to 16 query heads of a group share one CTA's K/V loads).
 * osp_cuda_attention_workspace_bytes: what d_workspace must hold for any T <= max_tokens at this
 * max_seq_len (0 when max_seq_len <= 256, then d_workspace may be NULL; never more than the larger of
 * 32768 * (4 D + 8) bytes for v0 and OSP_CUDA_ATTN_SPLIT_BUDGET, 128 MiB, for v1). */
bool osp_cuda_attention_supported(int n_head, int n_head_kv, int D);
size_t osp_cuda_attention_workspace_bytes(int64_t max_tokens, int n_head, int D, int32_t max_seq_len);
osp_status osp_cuda_paged_attention(const uint16_t *d_q, const void *d_k_pages, const void *d_v_pages, uint32_t kv_type,
                                    uint16_t *d_out, int32_t num_seqs, const int32_t *d_query_start_loc,
                                    const int32_t *d_positions, const int32_t *d_block_table, int32_t max_blocks,
                                    int32_t block_size, int64_t T, int n_head, int n_head_kv, int D, float scale,
                                    int32_t window, int32_t max_seq_len, void *d_workspace, void *stream);
/* The same for any page type: kv_type OSP_KV_PAGE_FP8, NVFP4 or INT8H with kq their scales or pools (kq
 * ignored, may be NULL, for f16 / f32). Quantized pages are read directly, never through a dequantized
 * copy:
 *   fp8 at D 64 / 128 under wgmma (the default; osp_cuda_attention_tc_serves): the tensor-core kernel
 *     (attention_mma.cu) converts each 64-key tile's codes once, exactly, into an f16 tile in shared
 *     memory (decode: v4, attention_dec.cu, into the fragments, with v2's bits); the KV head's scales
 *     factor out of both products (scores times d_k_fixed[kv head], the output times d_v_fixed[kv head]
 *     after the fold), a row's bits independent of its batch as for f16;
 *   nvfp4 at D 64 / 128 with GQA groups up to 16, any forced mode but v0 (osp_cuda_attention_v4_nvfp4):
 *     v4 (attention_dec.cu) widens each 64-key tile's E2M1 codes times their E4M3 micro-block scales,
 *     exactly, straight into the mma fragments in registers; the tensor scales factor out as fp8's head
 *     scales do;
 *   int8_hier, always (whatever mode is forced), and otherwise: the CUDA-core kernel (v0), keys in chunks
 *     of OSP_CUDA_ATTN_CHUNK folded in order (split over the chunks when the query tiles leave the GPU
 *     under-filled and the workspace holds the partials, with the same bits; fold mode otherwise):
 *     each 32-key K/V tile decoded once into fp32 shared memory as e4m3(code) * d_*_fixed[kv head] (fp8),
 *     e2m1(code) * (e4m3(scale) * tensor scale) (nvfp4), each one fp32 product, or M + S u (int8_hier's
 *     upper-only value) / M + (S / 32)(32 u + 2 l - 15) (its full value; which one per key: kq's hier
 *     fields), the values core/dtype.c's dequantizers and the CPU's read give; then the same online
 *     softmax as for f16 pages. int8_hier's pools must be 16-byte aligned (the pages too, as for every
 *     type). */
osp_status osp_cuda_paged_attention_q(const uint16_t *d_q, const void *d_k_pages, const void *d_v_pages,
                                      uint32_t kv_type, const osp_cuda_kv_quant *kq, uint16_t *d_out, int32_t num_seqs,
                                      const int32_t *d_query_start_loc, const int32_t *d_positions,
                                      const int32_t *d_block_table, int32_t max_blocks, int32_t block_size, int64_t T,
                                      int n_head, int n_head_kv, int D, float scale, int32_t window,
                                      int32_t max_seq_len, void *d_workspace, void *stream);

/* ---- block-sparse paged decode attention (attention_sparse.cu, issue 15) ----------------------------
 *
 * Decode attention (one query token a sequence) over the KV tiles a work table lists, the CUDA half of
 * src/sparse/sparse_attention.h (osp_sparse_attention_cpu is its reference; the table's format is
 * src/sparse/worktable.h's, built with q_tile = 1, so row r = t * groups + g for flat token t).
 * An element (token t at position p = d_positions[t] of sequence s = d_token_seq[t], query head h, key
 * position kv in entry e of h's row, kv = indices[e] * block_size + i) is kept when kv < seq_lens[s] and:
 * flags[e] & OSP_WT_SELF: kv == p; else flags[e] & OSP_WT_FULL: always; else (partial) bit i of tmask[e]
 * and the built-in mask (*mask: causal when NULL) keeps (p, kv). A query with no kept key gets v at its
 * own position (worktable.h, empty rows). out = softmax(q k^T * scale) v over the kept keys, fp32
 * softmax and accumulation, P rounded to f16 for the P V product (as the dense v1 / v4 kernels).
 *
 * Work split (batch invariant: a row's bits depend on its own entries only, never on the batch): a
 * row's entries are cut into chunks of osp_cuda_sparse_chunk_entries(row's entries, block_size) entries;
 * a CTA per (row, chunk) gathers the chunk's kept keys (only their K / V rows are read: a token-level
 * selection reads its tokens, not whole pages), walks them in 64-key tiles (mma.sync, keys on the long
 * side as attention_dec.cu) and writes the chunk's partial (m, l, acc) to the workspace; a second
 * kernel folds a row's partials in chunk order. A row of one chunk is written directly.
 *
 * Arguments: the table's device arrays in *wt (d_indptr [num_rows + 1], d_indices / d_pages / d_flags
 * [nnz], d_tmask [nnz, mask_words]; groups = n_head_kv: a row serves the KV head's n_head / n_head_kv query
 * heads with one K/V read, or groups = n_head: a row per query head); max_row_tiles >= the most entries of
 * any row (host value: sizes the grid and the workspace; keep it fixed, e.g. the most pages a sequence can
 * have, when capturing a graph). d_q [T, n_head, D] bf16, d_out [T, n_head, D] bf16, pages [num_blocks,
 * block_size, n_head_kv, D] f16 (kv_type OSP_KV_PAGE_F16), d_positions [T], d_token_seq [T] (the table's
 * qtile_seq), d_seq_lens [num_seqs], d_block_table [num_seqs, max_blocks] (read only for empty rows' own
 * position). D 64 or 128, n_head / n_head_kv <= 16, block_size 1 .. 256. d_workspace: at least
 * osp_cuda_sparse_workspace_bytes(T, n_head, D, max_row_tiles, block_size) bytes, 16-byte aligned (may be
 * NULL when that is 0). d_q, pages and d_out 16-byte aligned. mask: kind an osp_mask_kind of
 * src/sparse/block_mask.h other than DOCUMENT and CUSTOM (0 causal, 1 sliding window, 2 sink window,
 * 4 prefix-LM) with its window / sinks / prefix_len. Errors: OSP_ERR_INVALID_ARG (shapes, pointers,
 * workspace too small, mask kind), OSP_ERR_INTERNAL (launch). Enqueues only; allocates nothing. */
typedef struct osp_cuda_sparse_table {
    const int32_t *d_indptr, *d_indices, *d_pages, *d_flags;
    const uint32_t *d_tmask;
    int32_t num_rows, groups, mask_words, max_row_tiles;
} osp_cuda_sparse_table;
typedef struct osp_cuda_sparse_mask {
    int32_t kind, window, sinks, prefix_len;
} osp_cuda_sparse_mask;
/* entries a chunk of a row of row_tiles entries (the smallest power of two that cuts the row into <= 16
 * chunks, at least 64 keys' worth and at most 1,024 keys a chunk): part of the numerics */
int32_t osp_cuda_sparse_chunk_entries(int32_t row_tiles, int32_t block_size);
/* the most chunks any row of <= max_row_tiles entries has (the grid's and the workspace's chunk count) */
int32_t osp_cuda_sparse_max_chunks(int32_t max_row_tiles, int32_t block_size);
size_t osp_cuda_sparse_workspace_bytes(int64_t T, int n_head, int D, int32_t max_row_tiles, int32_t block_size);
osp_status osp_cuda_sparse_attention_decode(const osp_cuda_sparse_table *wt, const uint16_t *d_q, const void *d_k_pages,
                                            const void *d_v_pages, uint32_t kv_type, uint16_t *d_out, int64_t T,
                                            const int32_t *d_positions, const int32_t *d_token_seq,
                                            const int32_t *d_seq_lens, const int32_t *d_block_table, int32_t max_blocks,
                                            int32_t block_size, int n_head, int n_head_kv, int D, float scale,
                                            const osp_cuda_sparse_mask *mask, void *d_workspace, size_t workspace_bytes,
                                            void *stream);

/* Quest's top-k page selection on the GPU (quest.cu; Tang et al. 2024, §3.2-3.3), the selection of
 * src/sparse/quest.c's osp_quest_select for every (token t, KV head) row, the same pages (the scores are
 * computed with the reference's fp32 operations in its order, and ties go to the lower page):
 *   n_ctx = d_positions[t] / block_size + 1 pages; n_ctx <= topk: pages 0 .. n_ctx - 1; else the sink
 *   pages [0, sink), the recent pages [n_ctx - recent, n_ctx) and the topk - sink - recent other pages
 *   with the largest score, a page's score being the largest Quest bound sum_i max(q_i min_i, q_i max_i)
 *   over the KV head's query heads (q the bf16 d_q widened to fp32).
 * d_kmin / d_kmax: one layer's summaries [num_blocks, n_head_kv, D] (quest.h's layout for that layer,
 * 16-byte aligned) of the type `summary`: fp32 as quest.h keeps them, or f16 / bf16 (the min and max of f16
 * or bf16 keys are those keys' values, so a cache of f16 / bf16 pages loses nothing in 16-bit summaries and
 * reads half the bytes; the scores are the same bits as from fp32 summaries of the same values), indexed by the physical block d_block_table[d_token_seq[t] * max_blocks + j]. d_q [T,
 * n_head, D] bf16. d_scores: workspace [T * n_head_kv, max_blocks] fp32. Writes d_pages_out [T * n_head_kv,
 * topk] (row t * n_head_kv + kvh: its pages ascending, d_counts[row] of them). D a multiple of 4 (of 8
 * with 16-bit summaries) up to 1,024, groups up to 16, T * n_head_kv <= 65,535, sink + recent <= topk. Errors: OSP_ERR_INVALID_ARG,
 * OSP_ERR_INTERNAL (launch). Enqueues two kernels; allocates nothing. */
typedef enum { OSP_CUDA_QUEST_F32 = 0, OSP_CUDA_QUEST_F16 = 1, OSP_CUDA_QUEST_BF16 = 2 } osp_cuda_quest_summary;
osp_status osp_cuda_quest_select(const void *d_kmin, const void *d_kmax, osp_cuda_quest_summary summary,
                                 const uint16_t *d_q,
                                 const int32_t *d_positions, const int32_t *d_token_seq, const int32_t *d_block_table,
                                 int32_t max_blocks, int32_t block_size, int64_t T, int n_head, int n_head_kv, int D,
                                 int32_t topk, int32_t sink, int32_t recent, float *d_scores, int32_t *d_pages_out,
                                 int32_t *d_counts, void *stream);

/* The work table of a Quest selection, built on the device (quest.cu): the arrays osp_sparse_wt_build
 * makes on the host (src/sparse/worktable.h; q_tile 1, rows per KV head, the causal mask) from the
 * candidates the CPU engine hook gives it (every position <= p of each selected page), so the selection
 * never goes back to the host: row r = t * n_head_kv + kvh has d_counts[r] entries, entry i the selected
 * logical page j = d_sel[r * topk + i] (ascending, as osp_cuda_quest_select writes them): indices j, pages
 * d_block_table[d_token_seq[t] * max_blocks + j], tmask the slots o with j * block_size + o <= min(p,
 * seq_len - 1), flags OSP_WT_FULL when the whole page lies below both (else partial). Writes d_indptr
 * [T * n_head_kv + 1] and the entries (capacity T * n_head_kv * topk each; d_tmask times ceil(block_size /
 * 32) words); osp_cuda_sparse_attention_decode reads them with max_row_tiles = topk. No empty rows can
 * arise (every selected page holds a position <= p). Errors: OSP_ERR_INVALID_ARG, OSP_ERR_INTERNAL. */
osp_status osp_cuda_quest_table(const int32_t *d_sel, const int32_t *d_counts, int32_t topk, const int32_t *d_positions,
                                const int32_t *d_token_seq, const int32_t *d_seq_lens, const int32_t *d_block_table,
                                int32_t max_blocks, int32_t block_size, int64_t T, int n_head_kv, int32_t *d_indptr,
                                int32_t *d_indices, int32_t *d_pages, int32_t *d_flags, uint32_t *d_tmask,
                                void *stream);

/* The engine path's Quest glue (sparse_engine.cu, issue 15; the CUDA backend's ATTENTION op with an
 * osp_dev_sparse, backend_cuda.c).
 *
 * osp_cuda_quest_refresh: for each entry e < n with d_blocks[e] >= 0, recomputes physical page
 * b = d_blocks[e]'s summaries from its first min(d_n_valid[e], block_size) keys (>= 1) of one layer's f16 K
 * pages d_k_pages [num_blocks, block_size, n_head_kv, D]: d_kmin / d_kmax [num_blocks, n_head_kv, D] f16
 * (that layer's summaries) get, per channel, the smallest / largest key in slot order by the reference's
 * comparisons (src/sparse/quest.c's osp_quest_summarize_block; +inf / -inf where every key is NaN).
 * Entries with d_blocks[e] < 0 do nothing (a graph's fixed grid, padded). No two entries may name one
 * page. Deterministic (one writer an element, no atomics). Enqueues one kernel; allocates nothing.
 * Errors: OSP_ERR_INVALID_ARG (shapes, NULL), OSP_ERR_INTERNAL (launch).
 *
 * osp_cuda_rows_copy: n rows of row_bytes (a multiple of 16; pointers 16-byte aligned). scatter false
 * (gather): row i of d_dst = row d_idx[i] of d_src, or zeros where d_idx[i] < 0; scatter true: row
 * d_idx[i] of d_dst = row i of d_src where d_idx[i] >= 0 (distinct indices), other rows untouched.
 * Enqueues one kernel. Errors: OSP_ERR_INVALID_ARG, OSP_ERR_INTERNAL. */
osp_status osp_cuda_quest_refresh(const void *d_k_pages, const int32_t *d_blocks, const int32_t *d_n_valid, int32_t n,
                                  int32_t block_size, int n_head_kv, int D, void *d_kmin, void *d_kmax, void *stream);
osp_status osp_cuda_rows_copy(const void *d_src, void *d_dst, const int32_t *d_idx, int64_t n, size_t row_bytes,
                              bool scatter, void *stream);

/* ---- the DeepSeek Sparse Attention lightning indexer (dsa_indexer.cu, issue 15) ---------------------
 *
 * The GPU half of src/sparse/dsa_indexer.h (osp_dsa_select is the reference; DeepSeek-AI, "DeepSeek-V3.2-
 * Exp", 2025, §2.1 eq. 1), decode shapes: one query token t a sequence, at position p = d_positions[t] of
 * sequence d_token_seq[t], attends to the top_k tokens s <= p by I(t, s) = sum_j w(t, j) ReLU(q_I(t, j) .
 * k_I(s)) under the total order "score descending, then position ascending" (a NaN score as -inf), or to
 * all p + 1 tokens when p + 1 <= top_k. Three launches (timed apart by the benchmark), all on the device:
 *
 * osp_cuda_dsa_score: d_scores [T, max_ctx] fp32 gets I(t, s) for s <= p (other entries untouched) and
 * d_hist [T, 4,096] uint32 (workspace, zeroed here by a memset on the stream) a histogram of the scores'
 * top 12 key bits for the top-k. d_q [T, n_heads, head_dim] bf16 (q_I: the projection's output type on
 * the GPU; its values are exact in the f16 the tensor cores take when within f16's range, else clamped
 * to +-65504), d_w [T, n_heads] fp32 (w(t, j): 256 bytes a token, kept at the reference's precision for
 * the fp32 sum of the heads), the index-key pages exactly as the CPU cache holds them (osp_dsa_key_write):
 * d_k_codes [num_blocks, block_size, head_dim] E4M3 codes, d_k_scales [num_blocks, block_size] fp32 (key
 * = e4m3(code) * scale, the scale > 0), through d_block_table [num_seqs, max_blocks]. Arithmetic: dots of
 * the f16-widened codes with q_I on the tensor cores (wgmma, fp32 accumulation), per key sum_j w_j ReLU(dot_j) in
 * fp32 in a fixed order, times the key's scale: not the CPU's rounding (test_gpu_dsa.c derives the bound),
 * the same instructions for every key whatever the batch. n_heads 16 / 32 / 64, head_dim 64 / 128; the
 * caller guarantees p < max_ctx (keys past max_ctx - 1 are ignored) and p < max_blocks * block_size.
 *
 * osp_cuda_dsa_topk: from d_scores and d_hist, the exact top-k: d_idx [T, top_k] the selected positions
 * ascending (d_count[t] = min(p + 1, top_k) of them; the rest of the row -1), and the selection staged by
 * page for the table: d_ent_n[t] pages holding a selected token, ascending, d_ent_j [T, top_k] their
 * logical page indices and d_ent_mask [T, top_k, ceil(block_size / 32)] their selected slots (bit i: token
 * j * block_size + i). A radix select (12-bit histogram, then 20 bits over that bin's keys in shared
 * memory, or over all keys when the bin holds > 12,288), ties to the lowest positions, by a cluster of 8
 * CTAs a token reading each score once into a shared bitmap (OSPREY_DSA_TOPK=cluster8: the four-pass
 * cluster kernel; =cta: one CTA a token; the same bytes from all three). block_size <= 256, T <= 65,535.
 *
 * osp_cuda_dsa_table: the work table (src/sparse/worktable.h; q_tile 1, the causal mask) that
 * osp_sparse_wt_build makes from the selected positions as each row's candidates, for T * groups rows (row
 * r = t * groups + g; every group of token t gets the token's selection: groups = n_head_kv for a GQA
 * model, whose KV heads all read the DSA tokens): d_indptr [T * groups + 1], and per entry (capacity T *
 * groups * top_k) d_indices (logical page), d_pages (d_block_table[d_token_seq[t] * max_blocks + j]),
 * d_flags (OSP_WT_FULL when every slot of the page is selected, else 0), d_tmask [.., ceil(block_size / 32)]
 * (the selected slots). osp_cuda_sparse_attention_decode reads it with max_row_tiles = top_k. No empty
 * rows (every token selects >= 1 position).
 *
 * Errors: OSP_ERR_INVALID_ARG (shapes, NULL, alignment: d_q and d_k_codes 16-byte aligned),
 * OSP_ERR_INTERNAL (launch). Enqueue only; allocate nothing; graph-capturable. */
osp_status osp_cuda_dsa_score(const uint16_t *d_q, const float *d_w, const uint8_t *d_k_codes, const float *d_k_scales,
                              const int32_t *d_positions, const int32_t *d_token_seq, const int32_t *d_block_table,
                              int32_t max_blocks, int32_t block_size, int64_t T, int n_heads, int head_dim,
                              int32_t max_ctx, float *d_scores, uint32_t *d_hist, void *stream);
osp_status osp_cuda_dsa_topk(const float *d_scores, const uint32_t *d_hist, const int32_t *d_positions, int64_t T,
                             int32_t max_ctx, int32_t top_k, int32_t block_size, int32_t *d_idx, int32_t *d_count,
                             int32_t *d_ent_j, uint32_t *d_ent_mask, int32_t *d_ent_n, void *stream);
osp_status osp_cuda_dsa_table(const int32_t *d_ent_j, const uint32_t *d_ent_mask, const int32_t *d_ent_n, int32_t top_k,
                              const int32_t *d_token_seq, const int32_t *d_block_table, int32_t max_blocks,
                              int32_t block_size, int64_t T, int groups, int32_t *d_indptr, int32_t *d_indices,
                              int32_t *d_pages, int32_t *d_flags, uint32_t *d_tmask, void *stream);

#ifdef __cplusplus
}
#endif
#endif
