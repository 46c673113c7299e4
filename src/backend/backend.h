/* The backend interface: what runs a model's op list (src/backend/op.h) on one device. A backend
 * owns its device memory (weights are placed through it, KV pages are allocated through it), runs
 * one step's op list over the step's inputs, samples on its device and hands logits back when asked.
 *
 * Implementations: src/backend/cpu/backend_cpu.c (the thread pool, one region per op list, barriers
 * between ops) and src/backend/cuda/backend_cuda.c (one stream, pinned step inputs, cuBLASLt, CUDA
 * graphs per decode batch size and KV cache); src/backend/cuda/backend_cuda_stub.c stands in for the latter
 * in builds without nvcc. Nothing outside src/backend/ knows which device runs: callers go through
 * the functions below (the same shape as ggml's backend vtable and vLLM's platform + attention
 * backend split). */
#ifndef OSP_BACKEND_BACKEND_H
#define OSP_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/op.h"
#include "osprey/batch.h"
#include "backend/kv_layout.h"
#include "osprey/model.h"
#include "sample/sampler.h"

typedef struct osp_backend osp_backend;

#define OSP_BACKEND_UUID_BYTES 16       /* a device's UUID (CUDA's cudaUUID_t) */
#define OSP_BACKEND_IPC_HANDLE_BYTES 64 /* a memory handle for another process (cudaIpcMemHandle_t) */
typedef struct osp_threadpool osp_threadpool;

typedef struct osp_backend_params {
    osp_threadpool *pool; /* host worker threads lent by the model (CPU ops; dequantizing at upload) */
    bool exact;           /* CPU: fp32 activations in every matmul (osp_model_params.exact) */
    bool emulate_bf16;    /* CPU: round to bf16 where the CUDA backend stores bf16 (op.h) */
    bool act_q8;          /* CPU: one-level activations for K-quant weights (qdot8k.h;
                             osp_model_params.cpu_activations == OSP_CPU_ACT_Q8); ignored with exact */
    bool no_mmap;         /* CPU: matrices copied out of the mapping onto 2 MB pages (osp_model_params.no_mmap) */
    /* Benchmarks (bench/kernels/): time every run's ops on the device, for run_device_us. Off (the
     * default) costs nothing; on, a run records two device timestamps around its ops and nothing else
     * changes (the same kernels, results and synchronization). Backends without a device clock ignore it. */
    bool time_runs;
    /* CUDA: keep Q8_0 / Q4_0 / Q4_1 / Q4_K / Q6_K matrices in their blocks (qmatmul.cu) instead of
     * dequantizing every matrix to bf16 at load (osp_model_params.gpu_quant_weights). CPU: ignored. */
    bool quant_weights;
    /* Tensor parallelism: the ranks' communicator for ALL_REDUCE ops and this backend's rank in it
     * (src/backend/comm.h); NULL: one rank. The CPU backend only (the CUDA backend refuses one). */
    osp_comm *comm;
    int32_t tp_rank;
} osp_backend_params;

/* Where a placed weight's values come from: rows of a stored tensor (GGUF mapping), or seeded random
 * values drawn on the device (osp_model_load_random; only backends that can). */
typedef struct osp_weight_src {
    const void *data; /* stored rows, `type`, row_bytes apart; NULL: random */
    uint32_t type;
    int64_t rows;
    size_t row_bytes;
    uint64_t random_key;  /* data == NULL: the counter-based stream's key (src/model/presets.h) */
    float random_scale;   /* data == NULL: value = offset + scale * (Irwin-Hall draw) */
    float random_offset;
    bool mapped; /* data lies in a read-only file mapping that outlives the backend (the GGUF's): a backend
                  * that copies it may drop the copied pages from the process (MADV_DONTNEED) */
    bool lookup; /* rows are read by index (an untied embedding table), never streamed whole */
} osp_weight_src;

/* Activations a run sets from, or copies to, host memory: fp32 rows [rows of the act's kind, cols]
 * (converted from / to the activation's dtype). Inputs are written after the step's buffers are sized
 * and before the first op; outputs are read after the last op. For op tests (tests/ops/) and for
 * outputs such as the hidden states a drafter reads. */
typedef struct osp_act_io {
    int32_t act;
    float *host;
    bool input; /* true: host -> activation before the ops; false: activation -> host after them */
} osp_act_io;

/* One ATTENTION op as an attention hook sees it (host memory: the CPU backend only). */
typedef struct osp_attn_call {
    const osp_op *op;        /* the op: layer, p.attn (n_head, n_head_kv, head_dim, window, scale) */
    const osp_batch *b;      /* the step */
    const osp_kv_cache *kv;  /* the cache, pages on the host; this step's K/V already written */
    const float *q;          /* [num_tokens, n_head, head_dim] fp32 */
    float *out;              /* [num_tokens, n_head, head_dim] fp32 */
    int32_t n_threads;       /* threads that will call run (ith < n_threads) */
} osp_attn_call;

/* A replacement for the backend's paged attention, e.g. sparse attention (src/sparse/engine_hook.h).
 * For each ATTENTION op the CPU backend calls prepare once (on one thread), meets every thread at a
 * barrier, then has each thread call run for its share [item_begin, item_end) of the num_tokens *
 * n_head (token, head) items (ith: the thread's index, for per-thread workspaces). A prepare error
 * skips the runs of that op and of every later ATTENTION op in the step, and the run returns it. */
typedef struct osp_attn_hook {
    osp_status (*prepare)(void *ctx, const osp_attn_call *c);
    void (*run)(void *ctx, const osp_attn_call *c, int ith, int64_t item_begin, int64_t item_end);
    void *ctx;
} osp_attn_hook;

/* Sparse attention that a backend runs on its own device (the CUDA backend; the CPU takes an
 * osp_attn_hook instead): Quest top-k pages (Tang et al. 2024, §3.2-3.3) with the semantics of
 * src/sparse/quest.h's osp_quest_select, per (query token, KV head), for every ATTENTION op without a
 * sliding window. Made by src/sparse/engine_hook.h's osp_sparse_runtime_create_device, which owns the
 * summaries; the backend reads the config and the summaries and adds to the counters at every run.
 *  - summaries: kmin / kmax, backend memory [n_layer, num_blocks, n_head_kv, head_dim] f16 each (16-byte
 *    aligned per layer), the channel-wise min / max of each page's written keys, indexed by physical
 *    block; the backend recomputes a page's entry whenever a step writes into it (from the page's first
 *    positions[t] % block_size + 1 slots, t the step's last token writing there), so their initial
 *    contents are never read;
 *  - a token at position p whose context fits the budget (p / block_size + 1 <= topk_pages) attends
 *    densely (the backend's dense kernel, the same bits as without sparse attention); the others read
 *    the sink, recent and best-scoring pages only.
 * The counters have osp_sparse_runtime_stats' meaning ((token, layer) pairs). */
typedef struct osp_dev_sparse {
    int32_t topk_pages, recent_pages, sink_pages; /* osprey/sparse.h's osp_sparse_config fields */
    int32_t n_layer, num_blocks, block_size, n_head_kv, head_dim; /* the cache the summaries are for */
    uint64_t kv_id;        /* that cache's osp_kv_cache.id: runs over another cache are refused */
    void *kmin, *kmax;     /* see above */
    /* counters, added to by run: ATTENTION ops run with it, then (token, layer) pairs as in
     * osp_sparse_runtime_stats */
    int64_t calls, dense_tokens, sparse_tokens, tiles_read, tiles_dense, bytes_read;
} osp_dev_sparse;

typedef struct osp_run_io {
    float *logits; /* [num_logits, n_vocab] on the host, or NULL: they stay in the backend */
    const osp_act_io *acts;
    int32_t n_acts;
    const osp_attn_hook *attn_hook; /* NULL: the backend's own attention. CPU backend only (others:
                                     * OSP_ERR_UNSUPPORTED) */
    osp_dev_sparse *dev_sparse;     /* NULL: dense attention. Backends with supports_dev_sparse only (others:
                                     * OSP_ERR_UNSUPPORTED); not together with attn_hook */
} osp_run_io;

/* A step's device work on the host's clock (CLOCK_MONOTONIC seconds), for the step timeline: run =
 * [before its inputs are copied, after its last op], sample = [after the host packed the sampler's rows
 * (or asked for logits), before the wait for the results]; {-1, -1} when the step had none. */
typedef struct osp_backend_step_times {
    double run[2], sample[2];
} osp_backend_step_times;

typedef struct osp_backend_vtable {
    const char *name; /* "cpu", "cuda" */
    osp_device device;
    void (*free)(osp_backend *be);
    /* Places a matrix of `cols` columns stacked from n parts (op.h) as *out; the backend keeps the
     * memory until it is freed. f32_exact: keep fp32 (norms, biases, RoPE tables), else the
     * backend's weight format (CPU: the stored type, in place; CUDA: bf16). */
    osp_status (*place)(osp_backend *be, const osp_weight_src *parts, int32_t n, int64_t cols, bool f32_exact,
                        osp_tensor *out);
    /* Bytes of device memory the placed weights take (0 on the CPU). */
    size_t (*weight_bytes)(const osp_backend *be);
    /* Memory for KV pages (zeroed), freed with buffer_free. */
    osp_status (*buffer_alloc)(osp_backend *be, size_t bytes, const char *what, void **out);
    void (*buffer_free)(osp_backend *be, void *p);
    /* Copies bytes inside backend memory, ordered before the next run (copy-on-write of KV blocks). */
    osp_status (*copy)(osp_backend *be, void *dst, const void *src, size_t bytes);
    /* Copies bytes of backend memory (KV pages) to host memory, after every run enqueued before;
     * returns when they are there. The way out for tools that read pages (bench/kernels/; KV offload
     * later). */
    osp_status (*to_host)(osp_backend *be, void *dst, const void *src, size_t bytes);
    /* Copies bytes of host memory into backend memory, ordered before the next run; returns when the
     * host buffer may be reused. */
    osp_status (*from_host)(osp_backend *be, void *dst, const void *src, size_t bytes);
    /* n such copies in one go (to_host: backend memory to host memory, else the other way), ordered as
     * to_host / from_host are; returns when every one is done (one wait on the GPU instead of n: a KV
     * block is n_layer x 2 segments). NULL: the loop of single copies. */
    osp_status (*copy_host_many)(osp_backend *be, bool to_host, int32_t n, void *const *dst, const void *const *src,
                                 const size_t *bytes);
    /* Page-locks host memory the backend copies from and to often (the KV offload's host tier), so those
     * copies run as DMA; unregister before freeing it. NULL: nothing to do (the CPU backend). */
    osp_status (*host_register)(osp_backend *be, void *p, size_t bytes);
    void (*host_unregister)(osp_backend *be, void *p);
    osp_status (*mem_info)(osp_backend *be, size_t *free_bytes, size_t *total_bytes);
    /* CUDA IPC, for prefill/decode disaggregation between two processes on one device (src/kv/transfer.h).
     * All NULL where the backend has no such thing (the CPU). device_uuid: the device's UUID, the same
     * bytes in every process on that device. ipc_handle: the handle of p, an allocation of buffer_alloc,
     * which another process on the device maps with ipc_open (*out: its first byte there; fails in the
     * exporting process itself) until ipc_close. */
    osp_status (*device_uuid)(osp_backend *be, uint8_t uuid[OSP_BACKEND_UUID_BYTES]);
    osp_status (*ipc_handle)(osp_backend *be, void *p, uint8_t handle[OSP_BACKEND_IPC_HANDLE_BYTES]);
    osp_status (*ipc_open)(osp_backend *be, const uint8_t handle[OSP_BACKEND_IPC_HANDLE_BYTES], void **out);
    void (*ipc_close)(osp_backend *be, void *p);
    /* n copies out of backend memory (src[i]: KV pages, an arena, memory ipc_open mapped), bytes[i] each,
     * into backend memory (dst[i]) or, with to_host, host memory; done when it returns. side false: on
     * the run stream, after every run enqueued before (the thread that runs steps only). side true: on a
     * stream of the backend's own, from any thread while runs go on, in no order with them (the memory
     * must be out of their use; nothing run later needs a wait). NULL: not offered (the CPU). */
    osp_status (*copy_dev_many)(osp_backend *be, bool side, bool to_host, int32_t n, void *const *dst,
                                const void *const *src, const size_t *bytes);
    /* Whether op kind `op` with these operands runs here (OSP_ERR_UNSUPPORTED text in `why`). */
    bool (*supports_op)(osp_backend *be, const osp_graph *g, const osp_op *op, char *why, size_t why_len);
    /* Whether this backend's KV write and attention read K pages of `k_dtype` together with V pages of
     * `v_dtype` (osprey/batch.h; equal for an unsplit cache); when not, the reason in `why`. Asked once,
     * when a KV cache is created on the backend (kv_cache.c), so a dtype or a K/V pair the backend lacks
     * fails at start-up, before any page is allocated. */
    bool (*supports_kv)(osp_backend *be, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, char *why, size_t why_len);
    /* Whether this backend runs osp_dev_sparse (osp_run_io.dev_sparse) over cache kv for a model with
     * n_head query heads; when not, the reason in `why`. NULL: no device sparse attention (the CPU, which
     * takes an osp_attn_hook). Asked once, when the sparse runtime is made, so a shape the kernels lack
     * fails at start-up. */
    bool (*supports_dev_sparse)(osp_backend *be, const osp_kv_cache *kv, int32_t n_head, char *why, size_t why_len);
    /* Whether this backend's RoPE+KV-write op honours osp_kv_page_format.k_hadamard (rotates q and K
     * per head). Caches created on a backend without it never set the flag. */
    bool kv_k_hadamard;
    /* Runs graph `g` for the checked batch `b` over the KV cache `kv`. The logits stay in the
     * backend (rows [0, num_logits)) for sample / logits_to_host; when io->logits is non-NULL they are
     * also copied there, and the call waits for them (as for any output in io->acts). Otherwise the
     * call may return before the device has finished. io may be NULL. */
    osp_status (*run)(osp_backend *be, const osp_graph *g, osp_kv_cache *kv, const osp_batch *b, const osp_run_io *io);
    /* Samples rows[i] from row logits_rows[i] of the last run's logits (src/sample/sampler.h rules).
     * tokens [n], status [n], logprobs [n] (NULL: none). Returns once the results are on the host;
     * OSP_OK unless the call itself failed (row failures are in status). */
    osp_status (*sample)(osp_backend *be, const osp_sampler_row *rows, const int32_t *logits_rows, int32_t n,
                         int32_t *tokens, osp_logprobs *logprobs, osp_status *status);
    /* Copies rows [row0, row0 + n) of the last run's logits to dst [n, n_vocab] (synchronous). */
    osp_status (*logits_to_host)(osp_backend *be, int32_t row0, int32_t n, float *dst);
    osp_status (*sync)(osp_backend *be);
    /* Optional: NULL where the backend has no device clock (the CPU: callers time runs with the wall
     * clock). The device time of the last `run`'s ops, in microseconds, into *us: from after the step's
     * inputs (the packed metadata and io->acts inputs) are on the device to after the last op's work,
     * so host work, input and output copies and the final sync are outside it; an idle gap while the
     * host launches the first op is inside it. Waits for that run's ops to finish. Needs a backend
     * created with osp_backend_params.time_runs. *us is 0 on error. Errors: OSP_ERR_UNSUPPORTED when
     * time_runs was off; OSP_ERR_INVALID_ARG when no run has been timed, or the last run failed before
     * its ops were enqueued; OSP_ERR_INTERNAL from the device. */
    osp_status (*run_device_us)(osp_backend *be, double *us);
    /* Optional (NULL where the backend has no device clock: the CPU): the step timeline (osprey
     * --trace). timeline_enable waits for the device, then takes a reference event and the host's
     * CLOCK_MONOTONIC beside it; from then on every run records an event before its inputs go to the
     * device and one after its last op, and the calls that wait for a step's results (sample,
     * logits_to_host, a run with io->logits) record one after the host has packed their inputs and one
     * just before they wait. timeline_get gives the last run's spans on the host's clock (waits for its
     * events); a span not recorded since that run is {-1, -1}. Errors: OSP_ERR_INTERNAL from the device;
     * OSP_ERR_INVALID_ARG from timeline_get before timeline_enable. */
    osp_status (*timeline_enable)(osp_backend *be);
    osp_status (*timeline_get)(osp_backend *be, osp_backend_step_times *t);
} osp_backend_vtable;

struct osp_backend {
    const osp_backend_vtable *vt;
    int64_t n_vocab; /* set by the model after creation: the logits' row width */
    _Atomic int refs; /* owners: the model, and every KV cache made on it (which may outlive it) */
    /* Work items the backend has started since it was made, for benchmarks (launches per run): CUDA,
     * one per kernel launcher call and per graph replay (a launcher may start more than one kernel:
     * attention's split mode adds its combine, cuBLASLt may add a reduction; copies are not counted);
     * CPU, one per thread-pool region. Only the backend's own thread writes it. */
    uint64_t launches;
};

/* The device a backend runs on, as a kernel selection table records it. */
typedef struct osp_device_info {
    osp_device device;
    char name[128];       /* "NVIDIA H200", or the CPU's model name */
    int32_t arch;         /* CUDA compute capability major * 10 + minor (90); 0 on the CPU */
    int32_t driver_major; /* the CUDA driver's major version (12 for 12.4); 0 on the CPU */
    size_t cache_bytes;   /* the last-level cache: the GPU's L2, the CPU's L3 (0: unknown) */
} osp_device_info;

/* Describes device d (GPU 0 for CUDA) into *out. Creates no backend; on CUDA it initializes the CUDA
 * runtime in this process. Errors: OSP_ERR_UNSUPPORTED when d is CUDA and no device is present or
 * CUDA is not built; OSP_ERR_INTERNAL from CUDA. */
osp_status osp_backend_device_info(osp_device d, osp_device_info *out);
osp_status osp_backend_cuda_device_info(osp_device_info *out); /* backend_cuda.c or the stub */

/* The device's measured bf16 GEMM rate in GFLOP/s (2 M N K per GEMM), a compute ceiling for
 * benchmarks (bench/kernels/): on CUDA, GPU 0 through cuBLASLt on 8192 x 8192 x 8192 bf16 operands of
 * pseudo-random values (osp_cuda_gemm_peak_gflops: ~0.4 GiB of device memory for the call, ~0.1 s on
 * an H200), each call measuring afresh. Creates no backend. *gflops is 0 on error. Errors:
 * OSP_ERR_UNSUPPORTED on the CPU (a CPU backend's rate depends on its thread pool and path: measure
 * its matmul op instead) and when CUDA is not built or no device is present; OSP_ERR_NOMEM /
 * OSP_ERR_INTERNAL from CUDA. */
osp_status osp_backend_gemm_peak_gflops(osp_device d, double *gflops);
osp_status osp_backend_cuda_gemm_peak_gflops(double *gflops); /* backend_cuda.c or the stub */

/* Creates the backend for `device`. Errors: OSP_ERR_UNSUPPORTED when that backend is not built or
 * no such device is present (the message says which), OSP_ERR_NOMEM. */
osp_status osp_backend_create(osp_device device, const osp_backend_params *p, osp_backend **out);
/* Drops one reference; the last frees the backend (and the memory placed through it). NULL is fine. */
void osp_backend_free(osp_backend *be);
/* One more reference (a KV cache keeps its backend alive until it is freed). */
void osp_backend_retain(osp_backend *be);
/* The number of devices the backend for `device` can use now (1 for the CPU, 0 without CUDA). */
int osp_backend_device_count(osp_device device);

/* The backends, by name (their files). */
osp_status osp_backend_cpu_create(const osp_backend_params *p, osp_backend **out);
osp_status osp_backend_cuda_create(const osp_backend_params *p, osp_backend **out);
int osp_backend_cuda_device_count(void);

#endif
