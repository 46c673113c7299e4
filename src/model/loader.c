/* GGUF tensors or seeded random values -> backend tensors (see loader.h). */
#include "model/loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/quantize.h"
#include "core/status_internal.h"
#include "core/threadpool.h"
#include "model/presets.h"

/* A fresh tensor slot owned by the loader (its own struct; host copies it needs are kept there too). */
static osp_status new_tensor(osp_loader *ld, osp_tensor **out) {
    if (ld->n_tensors == ld->cap_tensors) {
        const int32_t cap = ld->cap_tensors ? 2 * ld->cap_tensors : 64;
        osp_tensor **t = realloc(ld->tensors, (size_t)cap * sizeof *t);
        if (!t) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
        ld->tensors = t;
        ld->cap_tensors = cap;
    }
    osp_tensor *t = calloc(1, sizeof *t);
    if (!t) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
    ld->tensors[ld->n_tensors++] = t;
    *out = t;
    return OSP_OK;
}

/* Counts n sources' stored bytes as placed and reports the fraction (kept below 1 until the model
 * says it is done: tied or unused tensors are never placed). */
static void placed(osp_loader *ld, const osp_weight_src *src, int32_t n) {
    if (!ld->progress || !ld->total_bytes) return;
    for (int32_t i = 0; i < n; i++) ld->done_bytes += (size_t)src[i].rows * src[i].row_bytes;
    double f = (double)ld->done_bytes / (double)ld->total_bytes;
    ld->progress(ld->progress_ctx, (float)(f < 0.999 ? f : 0.999));
}

/* The source of tensor `name` [cols, rows] (rows == 1 accepts a 1-d tensor); *found false when
 * absent. */
static osp_status source(osp_loader *ld, const char *name, int64_t cols, int64_t rows, bool norm, osp_weight_src *src,
                         bool *found) {
    memset(src, 0, sizeof *src);
    *found = true;
    src->rows = rows;
    if (!ld->gguf) { /* random: the stream of the tensor's name, as make-random-model draws it */
        src->random_key = osp_rw_name_key(ld->seed, name);
        src->random_scale = (float)((norm ? OSP_RW_NORM_NOISE_STD : OSP_RW_WEIGHT_STD) / OSP_RW_IRWIN_HALL_STD);
        src->random_offset = norm ? 1.0f : 0.0f;
        src->type = OSP_DTYPE_BF16;
        return OSP_OK;
    }
    const osp_gguf *g = ld->gguf;
    const osp_gguf_tensor *t = osp_gguf_find_tensor(g, name);
    if (!t) {
        *found = false;
        return OSP_OK;
    }
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return osp_set_error(OSP_ERR_FORMAT,
                             "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld]",
                             osp_gguf_path(g), name, (long long)t->ne[0], (long long)t->ne[1],
                             (long long)t->ne[2], (long long)t->ne[3], (long long)cols, (long long)rows);
    if (!osp_dtype_can_dequant(t->type))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor '%s' has type %s, which osprey cannot compute with yet",
                             osp_gguf_path(g), name, osp_dtype_name(t->type));
    src->data = t->data;
    src->type = t->type;
    src->row_bytes = osp_dtype_row_size(t->type, cols);
    src->mapped = true;
    return OSP_OK;
}

/* Keeps p in ld->host (freed with the loader); frees it and fails when the list cannot grow. */
static osp_status keep_host(osp_loader *ld, void *p) {
    if (ld->n_host == ld->cap_host) {
        const int32_t cap = ld->cap_host ? 2 * ld->cap_host : 8;
        void **h = realloc(ld->host, (size_t)cap * sizeof *h);
        if (!h) {
            free(p);
            return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
        }
        ld->host = h;
        ld->cap_host = cap;
    }
    ld->host[ld->n_host++] = p;
    return OSP_OK;
}

/* requant_4bit's rows over the pool's threads: thread ith takes rows ith, ith + nth, ... with its own
 * fp32 row (rows[ith]); the first failure a thread meets goes to st[ith] */
typedef struct requant_job {
    const osp_weight_src *src;
    uint32_t type;
    int64_t cols;
    size_t rb;
    uint8_t *copy;
    float **rows;
    osp_status *st;
} requant_job;

static void requant_rows(void *ctx, int ith, int nth) {
    const requant_job *j = ctx;
    osp_status s = OSP_OK;
    for (int64_t r = ith; r < j->src->rows && s == OSP_OK; r += nth) {
        s = osp_dequant_row(j->src->type, (const uint8_t *)j->src->data + (size_t)r * j->src->row_bytes, j->rows[ith],
                            j->cols);
        if (s == OSP_OK) s = osp_quantize_row(j->type, j->rows[ith], j->copy + (size_t)r * j->rb, j->cols);
    }
    j->st[ith] = s;
}

/* QuantSpec's 4-bit draft weights (Tiwari et al. 2025, section 4.2: the draft is the target with its
 * weights quantized to 4 bits): a source stored at more than 5 bits a weight (F32, F16, BF16, Q8_0,
 * Q5_0, Q5_1, Q5_K, Q6_K, ...) whose rows are whole Q4_0 blocks is replaced by a 4-bit copy, each row
 * dequantized to fp32 and rounded by osp_quantize_row: Q4_K (ggml's reference, 4.5 bits a weight as Q4_0)
 * when ld->requant_k and the rows are whole 256-value super-blocks (a device's quantized kernels read it
 * faster), else Q4_0 (a scale per 32, amax / -8). Sources at 5 bits or fewer (Q4_0, Q4_1, Q4_K, Q2_K,
 * Q3_K, the IQ types) are already the draft's precision and stay as stored. */
static osp_status requant_4bit(osp_loader *ld, osp_weight_src *src, int64_t cols) {
    const double bpw = 8.0 * (double)osp_dtype_type_size(src->type) / (double)osp_dtype_block_size(src->type);
    if (bpw <= 5.0 || cols % 32 != 0 || !src->data) return OSP_OK;
    const uint32_t type = ld->requant_k && cols % 256 == 0 ? OSP_DTYPE_Q4_K : OSP_DTYPE_Q4_0;
    const size_t rb = osp_dtype_row_size(type, cols);
    const int nth = ld->pool ? osp_threadpool_n_threads(ld->pool) : 1;
    uint8_t *copy = malloc(rb * (size_t)src->rows);
    float **rows = calloc((size_t)nth, sizeof *rows);
    osp_status *st = calloc((size_t)nth, sizeof *st);
    bool ok = copy && rows && st;
    for (int i = 0; ok && i < nth; i++) ok = (rows[i] = malloc(sizeof(float) * (size_t)cols)) != NULL;
    osp_status s = ok ? OSP_OK : osp_set_error(OSP_ERR_NOMEM, "%s: out of memory for a 4-bit draft copy", ld->path);
    if (s == OSP_OK) {
        requant_job j = {.src = src, .type = type, .cols = cols, .rb = rb, .copy = copy, .rows = rows, .st = st};
        if (ld->pool && nth > 1) osp_threadpool_run(ld->pool, requant_rows, &j);
        else requant_rows(&j, 0, 1);
        for (int i = 0; i < nth && s == OSP_OK; i++) {
            s = st[i];
            /* another thread's message is in that thread's error buffer: say it here */
            if (s != OSP_OK && i > 0) s = osp_set_error(s, "%s: the 4-bit draft copy failed", ld->path);
        }
    }
    for (int i = 0; rows && i < nth; i++) free(rows[i]);
    free(rows), free(st);
    if (s != OSP_OK) {
        free(copy);
        return s;
    }
    OSP_TRY(keep_host(ld, copy));
    src->data = copy, src->type = type, src->row_bytes = rb, src->mapped = false;
    return OSP_OK;
}

static osp_status matrix(osp_loader *ld, const char *const *names, const int64_t *rows, int32_t n, int64_t cols,
                         bool optional, bool lookup, const osp_tensor **out) {
    *out = NULL;
    if (n < 1 || n > OSP_TENSOR_MAX_PARTS) return osp_set_error(OSP_ERR_INTERNAL, "loader: %d parts", n);
    osp_weight_src src[OSP_TENSOR_MAX_PARTS];
    for (int32_t i = 0; i < n; i++) {
        bool found;
        OSP_TRY(source(ld, names[i], cols, rows[i], false, &src[i], &found));
        if (!found && optional && i == 0) return OSP_OK;
        if (!found) return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s' is missing", ld->path, names[i]);
    }
    if (ld->requant_4bit && ld->gguf)
        for (int32_t i = 0; i < n; i++) OSP_TRY(requant_4bit(ld, &src[i], cols));
    for (int32_t i = 0; i < n; i++) src[i].lookup = lookup;
    osp_tensor *t;
    OSP_TRY(new_tensor(ld, &t));
    OSP_TRY(ld->be->vt->place(ld->be, src, n, cols, false, t));
    placed(ld, src, n);
    *out = t;
    return OSP_OK;
}

osp_status osp_loader_matrix(osp_loader *ld, const char *const *names, const int64_t *rows, int32_t n, int64_t cols,
                             bool optional, const osp_tensor **out) {
    return matrix(ld, names, rows, n, cols, optional, false, out);
}

osp_status osp_loader_table(osp_loader *ld, const char *name, int64_t rows, int64_t cols, const osp_tensor **out) {
    return matrix(ld, &name, &rows, 1, cols, false, true, out);
}

static osp_status vectors(osp_loader *ld, const char *const *names, const int64_t *lens, int32_t n, bool norm,
                          bool optional, const osp_tensor **out) {
    *out = NULL;
    int64_t total = 0;
    osp_weight_src src[OSP_TENSOR_MAX_PARTS];
    for (int32_t i = 0; i < n; i++) {
        bool found;
        OSP_TRY(source(ld, names[i], lens[i], 1, norm, &src[i], &found));
        if (!found && optional && i == 0) return OSP_OK;
        if (!found) return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s' is missing", ld->path, names[i]);
        if (ld->gguf && src[i].type != OSP_DTYPE_F32)
            return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor '%s' is %s, expected F32", ld->path, names[i],
                                 osp_dtype_name(src[i].type));
        if (ld->gguf && ((uintptr_t)src[i].data & 3u) != 0)
            return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s' is not 4-byte aligned", ld->path, names[i]);
        if (!ld->gguf) src[i].type = OSP_DTYPE_F32;
        /* a vector of lens[i] values is one row of that many columns: stacked as one row of the sum */
        total += lens[i];
    }
    osp_tensor *t;
    OSP_TRY(new_tensor(ld, &t));
    /* a concatenation of vectors is one row: the backend places each part's values one after another */
    for (int32_t i = 0; i < n; i++) src[i].row_bytes = (size_t)lens[i] * sizeof(float);
    OSP_TRY(ld->be->vt->place(ld->be, src, n, total, true, t));
    placed(ld, src, n);
    *out = t;
    return OSP_OK;
}

osp_status osp_loader_vector(osp_loader *ld, const char *name, int64_t n, bool norm, bool optional,
                             const osp_tensor **out) {
    return vectors(ld, &name, &n, 1, norm, optional, out);
}

osp_status osp_loader_vectors(osp_loader *ld, const char *const *names, const int64_t *lens, int32_t n,
                              const osp_tensor **out) {
    return vectors(ld, names, lens, n, false, false, out);
}

osp_status osp_loader_constant(osp_loader *ld, const float *values, int64_t n, const osp_tensor **out) {
    *out = NULL;
    /* the host copy lives as long as the loader (the CPU backend points at it) */
    float *copy = malloc((size_t)(n > 0 ? n : 1) * sizeof *copy);
    if (!copy) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", ld->path);
    memcpy(copy, values, (size_t)n * sizeof *copy);
    OSP_TRY(keep_host(ld, copy));
    osp_tensor *t;
    OSP_TRY(new_tensor(ld, &t));
    osp_weight_src src = {.data = copy, .type = OSP_DTYPE_F32, .rows = 1, .row_bytes = (size_t)n * sizeof(float)};
    OSP_TRY(ld->be->vt->place(ld->be, &src, 1, n, true, t));
    *out = t;
    return OSP_OK;
}

osp_status osp_loader_view_rows(osp_loader *ld, const osp_tensor *t, int32_t n, const int64_t *row0, const int64_t *nrows,
                                const osp_tensor **out) {
    *out = NULL;
    osp_tensor v = {.cols = t->cols, .round_bf16 = t->round_bf16};
    for (int32_t i = 0; i < n; i++) {
        if (row0[i] < 0 || nrows[i] < 1 || row0[i] + nrows[i] > t->rows)
            return osp_set_error(OSP_ERR_INTERNAL, "%s: rows %lld..%lld of a %lld-row matrix", ld->path,
                                 (long long)row0[i], (long long)(row0[i] + nrows[i]), (long long)t->rows);
        int64_t r = row0[i], left = nrows[i], base = 0; /* base: the first row of part p */
        for (int32_t p = 0; p < t->n_parts && left > 0; base += t->parts[p].rows, p++) {
            const osp_tensor_part *tp = &t->parts[p];
            if (r >= base + tp->rows) continue;
            if (tp->layout != OSP_PART_STORED)
                return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor parallelism splits rows as stored (not the CPU's "
                                     "--no-mmap strips of the q8 mode)", ld->path);
            if (v.n_parts == OSP_TENSOR_MAX_PARTS)
                return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: a tensor-parallel view needs more than %d parts", ld->path,
                                     OSP_TENSOR_MAX_PARTS);
            const int64_t take = base + tp->rows - r < left ? base + tp->rows - r : left;
            osp_tensor_part *vp = &v.parts[v.n_parts++];
            *vp = *tp;
            vp->data = (const uint8_t *)tp->data + (size_t)(r - base) * tp->row_bytes;
            vp->rows = take;
            v.rows += take, r += take, left -= take;
        }
    }
    osp_tensor *nt;
    OSP_TRY(new_tensor(ld, &nt));
    *nt = v;
    *out = nt;
    return OSP_OK;
}

osp_status osp_loader_view_cols(osp_loader *ld, const osp_tensor *t, int64_t col0, int64_t ncols, const osp_tensor **out) {
    *out = NULL;
    if (col0 < 0 || ncols < 1 || col0 + ncols > t->cols)
        return osp_set_error(OSP_ERR_INTERNAL, "%s: columns %lld..%lld of a %lld-column matrix", ld->path, (long long)col0,
                             (long long)(col0 + ncols), (long long)t->cols);
    osp_tensor v = *t;
    v.cols = ncols;
    for (int32_t p = 0; p < t->n_parts; p++) {
        const osp_tensor_part *tp = &t->parts[p];
        const int64_t bs = osp_dtype_block_size(tp->type);
        if (tp->layout != OSP_PART_STORED)
            return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor parallelism splits rows as stored (not the CPU's "
                                 "--no-mmap strips of the q8 mode)", ld->path);
        if (bs < 1 || col0 % bs != 0 || ncols % bs != 0)
            return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor parallelism: a rank's columns %lld..%lld of a "
                                 "row-parallel matrix (attention output or FFN down) are not whole %s blocks of %lld "
                                 "(fewer ranks may split it)", ld->path, (long long)col0, (long long)(col0 + ncols),
                                 osp_dtype_name(tp->type), (long long)bs);
        v.parts[p].data = (const uint8_t *)tp->data + osp_dtype_row_size(tp->type, col0);
    }
    osp_tensor *nt;
    OSP_TRY(new_tensor(ld, &nt));
    *nt = v;
    *out = nt;
    return OSP_OK;
}

const float *osp_loader_host_f32(osp_loader *ld, const char *name, int64_t n) {
    if (!ld->gguf) return NULL;
    const osp_gguf_tensor *t = osp_gguf_find_tensor(ld->gguf, name);
    if (!t || t->type != OSP_DTYPE_F32 || t->ne[0] != n || t->ne[1] != 1 || ((uintptr_t)t->data & 3u)) return NULL;
    return t->data;
}

void osp_loader_free(osp_loader *ld) {
    if (!ld) return;
    for (int32_t i = 0; i < ld->n_tensors; i++) free(ld->tensors[i]);
    for (int32_t i = 0; i < ld->n_host; i++) free(ld->host[i]);
    free(ld->tensors);
    free(ld->host);
    ld->tensors = NULL;
    ld->host = NULL;
    ld->n_tensors = ld->cap_tensors = ld->n_host = ld->cap_host = 0;
}
