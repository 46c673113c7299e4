/* The paged KV cache (vLLM's PagedAttention, Kwon et al. 2023, §4): per layer, K and V pages
 * [num_blocks, block_size, n_head_kv, head_dim] in a backend's memory, addressed by block ids from
 * the block pool (src/kv/block_pool.c). What a page holds is described by a page format; ops read the
 * format and the page pointers (src/backend/kv_layout.h), nothing else, so the model code does not
 * change with it.
 *
 * Formats (per layer, separately for K and V; "row" = one token's values of one KV head, head_dim):
 *  f32, f16   pages of plain values; f16 rounds to nearest even on write.
 *  fp8        pages [num_blocks, block_size, n_head_kv, head_dim] of FP8 E4M3 codes (OCP 8-bit Floating
 *             Point spec v1.0 §5.1, "e4m3fn": no infinities, max 448): x is stored as
 *             e4m3(x / s[layer][kv_head]) rounded to nearest even and saturated at +-448 (NaN -> NaN
 *             code); read back as e4m3 * s. The per-head scales s are fp32, fixed at creation
 *             (k_fixed / v_fixed, [n_layer, n_head_kv]); no scale pool.
 *  nvfp4      pages [num_blocks, block_size, n_head_kv, head_dim / 2] bytes of FP4 E2M1 codes (OCP
 *             Microscaling Formats spec v1.0 §5.3.3: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives), two a
 *             byte: value 2i in the low nibble of byte i, 2i + 1 in the high nibble (as core/dtype.c).
 *             Micro-blocks of 16 consecutive head_dim values of one token and KV head (NVIDIA's NVFP4:
 *             "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", NVIDIA technical
 *             blog, 2025, and the PTX ISA's block-scaled mma with scale_vec::4X) each carry an E4M3
 *             scale in a scale pool beside the pages, [num_blocks, block_size, n_head_kv, head_dim / 16]
 *             bytes, addressed by the same block id and slot as the data. The micro-block scale is
 *             e4m3(amax / 6 / T) (nearest even, saturating), so amax lands on E2M1's 6; each value is
 *             e2m1(x / (scale * T)), nearest even, saturating at +-6. T is one fp32 tensor scale per
 *             layer for K and one for V (k_fixed / v_fixed, [n_layer, 1]), fixed at creation. Read
 *             back as e2m1 * (e4m3(scale) * T), the product of the two scales taken in fp32 first.
 *             head_dim must be a multiple of 16.
 *  int8_hier  QuantSpec's hierarchical INT8 (Tiwari et al. 2025, section 4.1; the row format and its
 *             rounding: core/dtype.h osp_int8h_quantize_row), one row per token and KV head (head_dim
 *             values, even). The pages hold, per token and KV head, head_dim / 2 bytes of upper 4-bit codes
 *             followed by the row's f16 scale S and f16 minimum M (4 bytes): [num_blocks, block_size,
 *             n_head_kv, head_dim / 2 + 4] bytes. The second pool beside them (where nvfp4 keeps its
 *             scales) holds the lower 4-bit codes, [num_blocks, block_size, n_head_kv, head_dim / 2]
 *             bytes. A reader of the upper halves only (QuantSpec's draft: osp_kv_cache.hier_upper_only)
 *             touches the pages alone, head_dim / 2 + 4 bytes a row instead of head_dim + 4; the full
 *             reader (the target) reads both, an 8-bit value with error <= range / 480 per row. No fixed
 *             scales: each row carries its own, so nothing needs calibrating. Per-token rows (not the
 *             paper's per-channel K groups of 128 tokens) keep each write to its own slot, as the other
 *             formats; K's outlier channels are spread first by the Hadamard rotation (k_hadamard).
 * K and V may have different formats (a split cache: llama.cpp's --cache-type-k / --cache-type-v),
 * e.g. K fp8 and V nvfp4: each side has its own bytes per token, scale pool (only an nvfp4 side has
 * one) and fixed scales (k_fixed in K's format, v_fixed in V's), so a block's bytes differ for K and V.
 * Layout of the one allocation, per layer: K pages, V pages, K scale pool, V scale pool, each padded to
 * 256 bytes (the same offsets as before for K and V of one format).
 * Every token's K and V rows are quantized on their own (a write touches only its slot's bytes and
 * its slot's scales), so a block copy (copy-on-write), a prefix-cache hit or a preemption handles a
 * quantized block exactly as an f16 one: data and scales move together by block id.
 *
 * Fixed scales without a scales file (OSP_KV_FP8_DEFAULT_SCALE, OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE):
 *  fp8: 1.0, vLLM's default k_scale / v_scale when a checkpoint has none. E4M3 then covers |x| up to
 *       448 with a relative step of 2^-3 (normal codes from 2^-6 up), which holds post-RoPE keys of a
 *       few units to a few hundred and values (usually |v| < 10) without saturating.
 *  nvfp4: 1/16. The micro-block scale e4m3(amax / 6 / T) is a normal E4M3 number (3 mantissa bits)
 *       for amax in [6 * 2^-6 * T, 6 * 448 * T] = [0.0059, 168]: micro-blocks of keys of a few units to
 *       tens, and of small values, keep full scale precision; with T = 1 any micro-block whose amax is
 *       below 0.09 would get a subnormal (coarser) scale, and amax up to 2688 is far more headroom than
 *       K/V rows need. A micro-block with amax above 168 saturates its scale (its values clamp).
 * With a scales file (src/format/kv_scales.h: `osprey calibrate-kv` writes it, `--kv-scales` /
 * osp_engine_params.kv_scales_path load it) the fixed scales are the file's, chosen from the model's
 * own K/V rows (src/kv/kv_calib.h).
 *
 * Internal to src/ (the public face is osprey/model.h's osp_kv_cache_* functions). */
#ifndef OSP_KV_KV_CACHE_H
#define OSP_KV_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/kv_layout.h"
#include "osprey/kv_cache.h"

/* The attention shape a cache serves (from the model's config). */
typedef struct osp_kv_shape {
    int32_t n_layer, n_head_kv, head_dim;
} osp_kv_shape;

/* Fixed scales used when no scales file is given (see the header comment for why these values). */
#define OSP_KV_FP8_DEFAULT_SCALE 1.0f
#define OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE 0.0625f

/* The page format of `dtype` for shape `sh`. OSP_ERR_INVALID_ARG for an unknown dtype,
 * OSP_ERR_UNSUPPORTED when the shapes do not fit it (f16: head_dim > 1024; nvfp4: head_dim not a
 * multiple of 16; bf16: no backend has bf16 pages). */
osp_status osp_kv_page_format_of(const osp_kv_shape *sh, osp_kv_dtype dtype, osp_kv_page_format *out);

/* Whether a cache of format `fmt` created on `be` stores K rotated (osp_kv_page_format.k_hadamard):
 * fp8 / nvfp4 pages, head_dim a power of two, a backend whose RoPE+KV-write op rotates, and the
 * environment variable OSPREY_KV_HADAMARD not "0" (a diagnostic switch for A/B accuracy runs; the
 * README lists it). Why on by default: on SmolLM2-135M (ctx 1024, 8 chunks, bench/RESULTS.md) it
 * takes fp8's perplexity cost from +0.71 % to +0.62 % and nvfp4's from +17.5 % to +7.5 %. */
bool osp_kv_k_hadamard_default(const osp_backend *be, const osp_kv_page_format *fmt);

/* Creates a cache of num_blocks blocks on backend `be` for shape `sh`. The cache holds a reference to
 * the backend, so it may be freed after the model. Errors: OSP_ERR_INVALID_ARG (non-positive sizes,
 * unknown dtype, sizes beyond size_t), OSP_ERR_NOMEM. */
osp_status osp_kv_cache_create_on(osp_backend *be, const osp_kv_shape *sh, int32_t num_blocks,
                                  int32_t block_size, osp_kv_dtype dtype, osp_kv_cache **out);

/* As osp_kv_cache_create_on, with K pages of k_dtype and V pages of v_dtype (equal: an unsplit cache)
 * and the fixed fp32 scales of a quantized side given: k_fixed [n_layer, K format's
 * fixed_scales_per_layer], v_fixed [n_layer, V format's] (fp8: n_head_kv per layer; nvfp4: 1), copied;
 * NULL takes the default constant of that side's dtype. Ignored for an f16 / f32 side. Each scale must
 * be finite and > 0 (OSP_ERR_INVALID_ARG otherwise). The backend may refuse a dtype or the pair (its
 * supports_kv hook; CUDA refuses K != V): OSP_ERR_UNSUPPORTED with its reason, before anything is
 * allocated. */
osp_status osp_kv_cache_create_scaled(osp_backend *be, const osp_kv_shape *sh, int32_t num_blocks, int32_t block_size,
                                      osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, const float *k_fixed,
                                      const float *v_fixed, osp_kv_cache **out);

/* Sets how attention reads the int8_hier sides of kv (kv_layout.h hier_upper_only): full_recent >= 0 gives
 * QuantSpec's draft view, upper 4-bit halves except each query's last full_recent keys; full_recent < 0
 * reads both halves again (the default). The perplexity tool measures the view with it; a draft sharing
 * the target's pages uses a shallow copy of the cache with the view set. OSP_ERR_INVALID_ARG when
 * neither side is int8_hier (nothing would change). */
osp_status osp_kv_cache_set_hier_view(osp_kv_cache *kv, int32_t full_recent);

/* Waits until every write and copy issued to kv's pages (through its backend: forwards of its model,
 * osp_kv_cache_copy_block) is done. A no-op on the CPU. Errors: the backend's (a device fault). */
osp_status osp_kv_cache_sync(osp_kv_cache *kv);

/* A read view of kv for another model on the same device (QuantSpec's self-draft reads its target's
 * pages): *view becomes a shallow copy of kv whose forwards run on `reader` (view->be is reader's
 * backend, so osp_model_forward(reader, view, ...) passes the check that a device cache belongs to the
 * model; the pages stay kv's). On a device the two models have their own streams: the caller orders
 * them (syncs kv's backend after its writes and copies before the reader's forward reads them, and the
 * reader's before the owner writes what the reader reads). A view owns nothing: never pass it to
 * osp_kv_cache_free, and drop it before kv is freed. Implemented in model/model.c (it needs the
 * model's backend). OSP_ERR_INVALID_ARG: NULL, another device, another shape; OSP_ERR_UNSUPPORTED:
 * tensor-parallel caches or readers. */
struct osp_model;
osp_status osp_kv_cache_view_for(const osp_kv_cache *kv, const struct osp_model *reader, osp_kv_cache *view);

/* The exact size of a cache's one allocation with K pages of k_dtype and V pages of v_dtype (pages,
 * scale pools, each pool padded to 256 bytes per layer), as osp_kv_cache_create_scaled computes it.
 * OSP_ERR_INVALID_ARG on overflow or bad sizes, and the page formats' errors (osp_kv_page_format_of);
 * *bytes is 0 on any error. */
osp_status osp_kv_cache_size(const osp_kv_shape *sh, int32_t num_blocks, int32_t block_size, osp_kv_dtype k_dtype,
                             osp_kv_dtype v_dtype, size_t *bytes);

/* One block's bytes over every layer: per layer, K pages, V pages, K scale pool, V scale pool (each
 * block_size tokens; absent pools take no bytes). The unit of KV offload (src/kv/offload.h). */
size_t osp_kv_cache_block_bytes(const osp_kv_cache *kv);

/* Copies block id's bytes (osp_kv_cache_block_bytes, in that order) to host memory dst, after every run
 * enqueued before; returns when they are there. OSP_ERR_INVALID_ARG for an id outside the cache. */
osp_status osp_kv_cache_block_read(osp_kv_cache *kv, int32_t id, void *dst);

/* Copies host bytes src (osp_kv_cache_block_read's layout) into block id, ordered before the next run. */
osp_status osp_kv_cache_block_write(osp_kv_cache *kv, int32_t id, const void *src);
/* Blocks ids[0..n) from srcs[0..n) at once (one wait on the GPU for all of them; from page-locked memory
 * the copies are DMA). Returns when the host buffers may be reused. OSP_ERR_INVALID_ARG for an id
 * outside the cache (nothing copied), OSP_ERR_NOMEM. */
osp_status osp_kv_cache_blocks_write(osp_kv_cache *kv, int32_t n, const int32_t *ids, const void *const *srcs);
/* Blocks ids[0..n) into dsts[0..n) at once (after every run enqueued before; one wait on the GPU). */
osp_status osp_kv_cache_blocks_read(osp_kv_cache *kv, int32_t n, const int32_t *ids, void *const *dsts);

/* Page-locks host memory that blocks are copied from and to often (a KV offload's host tier) where the
 * backend copies by DMA (CUDA); true when it did (then unregister before freeing it), false when the
 * backend has nothing to do or the driver refused (copies still work, slower). */
bool osp_kv_cache_host_register(osp_kv_cache *kv, void *p, size_t bytes);
void osp_kv_cache_host_unregister(osp_kv_cache *kv, void *p);

/* ---- CUDA IPC: a producer's blocks handed to a consumer process on the same device (src/kv/transfer.h)
 * without a host copy. Each call fails with OSP_ERR_UNSUPPORTED on a backend without it (the CPU). */

#define OSP_KV_UUID_BYTES 16       /* a device's UUID (backend.h OSP_BACKEND_UUID_BYTES) */
#define OSP_KV_IPC_HANDLE_BYTES 64 /* an arena's handle (backend.h OSP_BACKEND_IPC_HANDLE_BYTES) */

/* Whether kv's backend has the calls below. */
bool osp_kv_cache_ipc_capable(const osp_kv_cache *kv);
/* The device's UUID (16 bytes): equal in two processes exactly when they run on the same device. */
osp_status osp_kv_cache_device_uuid(osp_kv_cache *kv, uint8_t uuid[OSP_KV_UUID_BYTES]);
/* A zeroed device allocation of `bytes` that another process can map, and its handle (64 bytes) for
 * osp_kv_cache_ipc_open there. Free with osp_kv_cache_arena_free (NULL ok). OSP_ERR_NOMEM when the device
 * has no room. */
osp_status osp_kv_cache_arena_create(osp_kv_cache *kv, size_t bytes, void **out,
                                     uint8_t handle[OSP_KV_IPC_HANDLE_BYTES]);
void osp_kv_cache_arena_free(osp_kv_cache *kv, void *p);
/* Maps another process's arena by its handle (*out: its first byte in this process); fails in the process
 * that made it, on another device, or once that process has freed it or exited. Unmap with
 * osp_kv_cache_ipc_close (NULL ok). */
osp_status osp_kv_cache_ipc_open(osp_kv_cache *kv, const uint8_t handle[OSP_KV_IPC_HANDLE_BYTES], void **out);
void osp_kv_cache_ipc_close(osp_kv_cache *kv, void *p);
/* Blocks ids[0..n) into device memory devs[0..n) (block_bytes each, osp_kv_cache_block_read's layout),
 * after every run enqueued before, in one batched copy; returns when they are there. Call from the thread
 * that runs steps. OSP_ERR_INVALID_ARG for an id outside the cache (nothing copied). */
osp_status osp_kv_cache_blocks_read_device(osp_kv_cache *kv, int32_t n, const int32_t *ids, void *const *devs);
/* Blocks ids[0..n) from device memory srcs[0..n) (that layout; e.g. a mapped arena), in one batched copy
 * on a stream apart from the runs', so any thread may call it while steps run: the blocks must be out of
 * every run's use until it returns (a background load's blocks). Returns when they are written. */
osp_status osp_kv_cache_blocks_write_device(osp_kv_cache *kv, int32_t n, const int32_t *ids, const void *const *srcs);
/* bytes of device memory src (an arena) to host memory dst, apart from the runs (any thread). */
osp_status osp_kv_cache_device_to_host(osp_kv_cache *kv, void *dst, const void *src, size_t bytes);

#endif
