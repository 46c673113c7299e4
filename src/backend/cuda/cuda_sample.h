/* The sampler on the GPU (sample.cu): the same rules, order, random streams and per-row errors as
 * the CPU sampler (src/sample/sampler.h, whose contract this follows point for point), no sort:
 * min-p / top-k / top-p by pivot rejection as in src/sample/reject.c, with the same Philox4x32-10
 * addresses (seed, sample_index, output_pos, draw), so a seeded request draws from the same uniforms
 * on either backend (and, the weights being bit-identical, almost always the same token: only sums
 * rounded in another order can differ). The full-vocabulary passes run over slices of 4,096 values,
 * one thread block each (three launches: scan, select, finish; two when select and finish are fused);
 * the finishing block samples from the slices' candidate lists where they provably hold the filtered
 * set, else over the whole row. The exact
 * fallback after 32 rounds finds the CPU's sorted-order draw by binary searches over the weights' bit
 * patterns, not a sort.
 *
 * Plain C header (no CUDA types): the engine fills the rows on the host, copies them and the packed
 * id lists to the device, and reads back only the tokens, statuses and (when asked) logprobs. */
#ifndef OSP_BACKEND_CUDA_SAMPLE_H
#define OSP_BACKEND_CUDA_SAMPLE_H

#include <stdint.h>

#include "osprey/status.h"
#include "sample/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One row's parameters, position-independent (offsets into the packed arrays below) so the whole
 * array is one host-to-device copy. Fields mean what osp_sampler_row's do. */
typedef struct osp_cuda_sample_row {
    float temperature, top_p, min_p;
    float presence_penalty, frequency_penalty, repetition_penalty;
    int32_t top_k, min_tokens, num_logprobs;
    uint32_t sample_index;
    uint64_t seed, output_pos;
    int32_t logits_row;           /* row of d_logits this row samples from (children share a row) */
    int32_t bias_off, n_bias;     /* d_bias_ids / d_bias_vals [bias_off, bias_off + n_bias) */
    int32_t stop_off, n_stop;     /* d_ids [stop_off, +n_stop): stop token ids (min_tokens) */
    int32_t prompt_off, n_prompt; /* d_ids [prompt_off, +n_prompt): prompt ids (repetition penalty) */
    int32_t output_off, n_output; /* d_ids [output_off, +n_output): generated ids (all penalties) */
} osp_cuda_sample_row;

/* Device scratch of osp_cuda_sample_scratch_bytes(max_rows, vocab) bytes (0 for max_rows or vocab
 * <= 0 or vocab > 2^30): per row a [vocab] float working copy, a [vocab] uint32 count array, the
 * slices' candidate lists (512 values and ids a slice of 4,096) and per-slice results, ~1.13x the
 * bytes of the first two. Zero it once with osp_cuda_memset before first use with a given vocab (the
 * layout depends on it); the kernels leave its count arrays and arrival counters zeroed again. The pointer must be
 * 16-byte aligned (cudaMalloc's are), and every launch must have num_rows <= max_rows. */
size_t osp_cuda_sample_scratch_bytes(int32_t max_rows, int32_t vocab);

/* Samples one token per row r < num_rows from d_logits[rows[r].logits_row] ([*, vocab] fp32, not
 * modified; logits_row must be a row of d_logits: only a negative one is caught, failing the row).
 * d_rows [num_rows]; d_ids, d_bias_ids, d_bias_vals: the packed lists (may be NULL when no row uses
 * them). Outputs (device): d_tokens [num_rows]; d_status [num_rows] (OSP_OK or
 * OSP_ERR_INVALID_ARG: non-finite logits, bad parameters, every token masked; the token is then 0);
 * d_logprobs [num_rows] (osp_logprobs, filled for rows with num_logprobs >= 0; may be NULL).
 * Enqueues only (graph-capturable); errors as the launchers of cuda_ops.h. */
osp_status osp_cuda_sample(const float *d_logits, int32_t vocab, const osp_cuda_sample_row *d_rows, int32_t num_rows,
                           const int32_t *d_ids, const int32_t *d_bias_ids, const float *d_bias_vals,
                           void *d_scratch, int32_t *d_tokens, osp_status *d_status, osp_logprobs *d_logprobs,
                           void *stream);

/* The same with the number of rejection rounds before the exact fallback given (0..32; 32 is
 * osp_cuda_sample's), the counterpart of osp_reject_sample_ex for tests, and d_rounds [num_rows] (or
 * NULL) receiving each row's rounds as osp_reject_sample_ex reports them (0 for greedy and for rows
 * with neither top-k nor top-p, max_rounds + 1 for the fallback). Note: with max_rounds 0 a row with
 * neither top-k nor top-p still draws from its whole (min-p) set here, where the CPU's fallback keeps
 * only the maximum's tie group (target 0 there); osp_cuda_sample never takes that path. */
osp_status osp_cuda_sample_ex(const float *d_logits, int32_t vocab, const osp_cuda_sample_row *d_rows,
                              int32_t num_rows, const int32_t *d_ids, const int32_t *d_bias_ids,
                              const float *d_bias_vals, void *d_scratch, int32_t *d_tokens, osp_status *d_status,
                              osp_logprobs *d_logprobs, int32_t max_rounds, int32_t *d_rounds, void *stream);

#ifdef __cplusplus
}
#endif
#endif
