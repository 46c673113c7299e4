/* The loader: GGUF tensors (or a preset's seeded random values) -> tensors placed on a backend. Shared
 * by every architecture; the backend decides the stored form (the CPU keeps the GGUF mapping's rows in
 * place, the CUDA backend dequantizes to bf16 on the device). */
#ifndef OSP_MODEL_LOADER_H
#define OSP_MODEL_LOADER_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/op.h"
#include "osprey/gguf.h"

typedef struct osp_backend osp_backend;

typedef struct osp_loader {
    const osp_gguf *gguf; /* NULL: random weights */
    uint64_t seed;        /* random weights: the preset's seed */
    const struct osp_model_preset *preset; /* random weights: the preset (NULL with a file) */
    osp_backend *be;
    const char *path;     /* for messages */
    /* placed tensors, owned by the loader (freed with osp_loader_free) */
    osp_tensor **tensors;
    int32_t n_tensors, cap_tensors;
    /* progress over the file's tensor bytes (NULL: silent) */
    void (*progress)(void *ctx, float fraction);
    void *progress_ctx;
    size_t done_bytes, total_bytes;
    /* QuantSpec's self-draft (osp_model_params.draft_4bit_weights): matrices stored at more than 5 bits a
     * weight are placed as a 4-bit copy made here (kept in `host`): Q4_0, or Q4_K where requant_k and the
     * rows are whole super-blocks (the GPU's quantized kernels read Q4_K ~2.8x faster than Q4_0 at decode:
     * bench/gpu/DECODE.md); the rows quantized on `pool`'s threads when it is set */
    bool requant_4bit;
    bool requant_k;
    struct osp_threadpool *pool;
    /* host copies of constants (the CPU backend points at them) */

    void **host;
    int32_t n_host, cap_host;
} osp_loader;

/* A matrix of `cols` columns stacked from the tensors `names[0..n)` (each [cols, rows[i]]; rows[i]
 * checked against the file) placed on the backend; *out stays valid until osp_loader_free.
 * optional: a missing first tensor gives *out = NULL and OSP_OK. Errors: OSP_ERR_FORMAT (missing,
 * wrong shape), OSP_ERR_UNSUPPORTED (a type osprey cannot compute with), the backend's. */
osp_status osp_loader_matrix(osp_loader *ld, const char *const *names, const int64_t *rows, int32_t n, int64_t cols,
                             bool optional, const osp_tensor **out);
/* A matrix whose rows are read by index, never streamed whole (an untied embedding table): as
 * osp_loader_matrix with one tensor; backends that copy weights may leave it where it is. */
osp_status osp_loader_table(osp_loader *ld, const char *name, int64_t rows, int64_t cols, const osp_tensor **out);
/* One fp32 vector of n values (norm weights, biases, RoPE factors), kept fp32 on every backend; norm:
 * random values are 1 + noise. Same errors; the stored type must be F32. */
osp_status osp_loader_vector(osp_loader *ld, const char *name, int64_t n, bool norm, bool optional,
                             const osp_tensor **out);
/* Concatenated fp32 vectors (q, k and v biases). */
osp_status osp_loader_vectors(osp_loader *ld, const char *const *names, const int64_t *lens, int32_t n,
                              const osp_tensor **out);
/* A constant computed on the host (RoPE inverse frequencies), n fp32 values, placed on the backend. */
osp_status osp_loader_constant(osp_loader *ld, const float *values, int64_t n, const osp_tensor **out);
/* Tensor parallelism's views of a placed matrix t (no bytes copied; *out owned by the loader):
 * view_rows stacks the n row ranges [row0[i], row0[i] + nrows[i]) of t in order (a range may span t's
 * parts; at most OSP_TENSOR_MAX_PARTS parts in all); view_cols keeps columns [col0, col0 + ncols) of every
 * row (each part's data moved by col0's bytes, its row_bytes unchanged), col0 and ncols whole blocks of
 * every part's type. Both need the parts as stored (not the CPU's 16-row strips). Errors:
 * OSP_ERR_UNSUPPORTED (strips, partial blocks, too many parts, with the reason), OSP_ERR_INTERNAL (a
 * range outside t), OSP_ERR_NOMEM. */
osp_status osp_loader_view_rows(osp_loader *ld, const osp_tensor *t, int32_t n, const int64_t *row0, const int64_t *nrows,
                                const osp_tensor **out);
osp_status osp_loader_view_cols(osp_loader *ld, const osp_tensor *t, int64_t col0, int64_t ncols, const osp_tensor **out);
/* Host view of an fp32 vector in the file (RoPE factors read at build time), or NULL if absent. */
const float *osp_loader_host_f32(osp_loader *ld, const char *name, int64_t n);
void osp_loader_free(osp_loader *ld);

#endif
