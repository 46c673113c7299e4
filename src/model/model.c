/* The model: a GGUF file (or a preset's random weights), its architecture (src/model/arch_*.c), the
 * weights placed on a backend, and the op lists the architecture built for them. A forward pass is
 * check the batch -> pick the op list -> the backend runs it; nothing here knows which device runs.
 *
 *   model file --(arch.read_config, arch.bind via loader.c)--> placed weights
 *              --(arch.build)--> op lists (with / without the logits tail)
 *   osp_model_forward(batch) --> backend.run(op list, KV cache, batch) */
#include "osprey/model.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/status_internal.h"
#include "core/threadpool.h"
#include "kv/kv_cache.h"
#include "backend/comm.h"
#include "model/arch.h"
#include "model/model_exec.h"
#include "model/presets.h"

struct osp_model {
    osp_gguf *gguf; /* NULL for random weights */
    osp_model_config cfg;
    const osp_arch *arch;
    void *weights; /* the arch's bound tensors */
    osp_loader loader;
    osp_backend *be;
    osp_threadpool *pool;
    int n_threads;
    osp_graph graph[4]; /* [with_logits + 2 * with_embd]: bit 0 the logits tail, bit 1 the output norm of
                         * every token (osp_model_forward_embd) */
    const osp_attn_hook *attn_hook; /* osp_model_set_attn_hook, or NULL */
    osp_dev_sparse *dev_sparse;     /* osp_model_set_dev_sparse, or NULL */
    struct tp_driver *tp;           /* tensor parallelism driven from here (rank 0 is this model), or NULL */
};

/* ---- tensor parallelism: one model that drives its ranks ------------------------------------------
 * osp_model_load with tensor_parallel_size N > 1 and no communicator: this model is rank 0 and owns a local
 * communicator, the models of ranks 1..N-1 and one thread each. A forward hands the batch to the rank
 * threads (the step's "broadcast": the same host batch, read-only), runs rank 0 on the caller's thread and
 * waits for all; every rank computes the same logits (comm.h), rank 0's go to the caller. A rank that fails
 * aborts the communicator, so no rank waits forever, and the forward returns the first rank's error; the
 * communicator stays aborted (later forwards fail): the caller drops the model. */
typedef struct tp_driver {
    int32_t n;
    osp_comm *comm;
    struct tp_rank {      /* [n]: rank r's model, thread and outputs ([0]: this model; only msg used) */
        struct tp_driver *d;
        int32_t r;
        osp_model *m;
        pthread_t thread;
        osp_status st;
        float *logits, *embd; /* its own outputs (the same values as rank 0's) */
        size_t cap, cap_embd;
        char msg[256];    /* a failed rank's message (set on its thread) */
    } *rank;
    int32_t n_threads_started;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    uint64_t gen;
    int32_t pending;
    bool quit;
    /* the job */
    osp_kv_cache *kv;
    const osp_batch *b;
    bool embd;
} tp_driver;

osp_model_params osp_model_default_params(void) {
    osp_model_params p = {.n_threads = 0};
    return p;
}

osp_status osp_cpu_activations_parse(const char *name, osp_cpu_activations *out) {
    if (name && !strcmp(name, "two-level")) *out = OSP_CPU_ACT_TWO_LEVEL;
    else if (name && !strcmp(name, "q8")) *out = OSP_CPU_ACT_Q8;
    else return osp_set_error(OSP_ERR_INVALID_ARG, "CPU activations '%s' are not one of two-level, q8", name ? name : "(null)");
    return OSP_OK;
}

const char *osp_cpu_activations_name(osp_cpu_activations a) {
    return a == OSP_CPU_ACT_TWO_LEVEL ? "two-level" : a == OSP_CPU_ACT_Q8 ? "q8" : NULL;
}

const char *osp_device_name(osp_device d) { return d == OSP_DEVICE_CUDA ? "cuda" : "cpu"; }

osp_status osp_device_parse(const char *name, osp_device *out) {
    if (name && !strcmp(name, "cpu")) *out = OSP_DEVICE_CPU;
    else if (name && !strcmp(name, "cuda")) *out = OSP_DEVICE_CUDA;
    else if (name && !strcmp(name, "auto"))
        *out = osp_backend_device_count(OSP_DEVICE_CUDA) > 0 ? OSP_DEVICE_CUDA : OSP_DEVICE_CPU;
    else return osp_set_error(OSP_ERR_INVALID_ARG, "device '%s' is not one of cpu, cuda, auto", name ? name : "(null)");
    return OSP_OK;
}

int osp_device_count(osp_device d) { return osp_backend_device_count(d); }

static void tp_driver_free(tp_driver *d);

void osp_model_free(osp_model *m) {
    if (!m) return;
    tp_driver *tp = m->tp;
    if (tp) tp_driver_free(tp); /* the rank threads and models; the communicator last, below */
    if (m->be) (void)m->be->vt->sync(m->be);
    for (int i = 0; i < 4; i++) osp_graph_free(&m->graph[i]);
    if (m->arch && m->weights) m->arch->free_weights(m->weights);
    osp_loader_free(&m->loader);
    osp_backend_free(m->be);
    osp_threadpool_free(m->pool);
    osp_gguf_close(m->gguf);
    free(m);
    if (tp) {
        osp_comm_free(tp->comm);
        free(tp);
    }
}

static osp_status tp_driver_load(osp_model *m, const osp_model_params *params, const osp_model_preset *preset,
                                 uint64_t seed, const char *path);

/* Threads, backend, binding and op lists, once cfg (and gguf or the preset) are set. */
static osp_status finish_load(osp_model *m, const osp_model_params *params, const osp_model_preset *preset,
                              uint64_t seed, const char *path) {
    if (params && params->tensor_parallel_size > 1 && !params->comm) return tp_driver_load(m, params, preset, seed, path);
    m->n_threads = params && params->n_threads > 0 ? params->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (m->n_threads < 1) m->n_threads = 1;
    OSP_TRY(osp_threadpool_create(m->n_threads, &m->pool));
    const osp_device dev = params ? params->device : OSP_DEVICE_CPU;
    const int32_t tp = params && params->tensor_parallel_size > 1 ? params->tensor_parallel_size : 1;
    if (params && (params->tensor_parallel_size < 0 || (tp == 1 && (params->comm || params->tensor_parallel_rank != 0))))
        return osp_set_error(OSP_ERR_INVALID_ARG, "model: tensor_parallel_size %d with %s and rank %d",
                             params->tensor_parallel_size, params->comm ? "a communicator" : "no communicator",
                             params->tensor_parallel_rank);
    if (tp > 1) {
        if (!params->comm || osp_comm_world(params->comm) != tp || params->tensor_parallel_rank < 0 ||
            params->tensor_parallel_rank >= tp)
            return osp_set_error(OSP_ERR_INVALID_ARG,
                                 "model: tensor parallelism needs a communicator of %d ranks and a rank in 0..%d (rank %d)",
                                 tp, tp - 1, params->tensor_parallel_rank);
        if (dev != OSP_DEVICE_CPU)
            return osp_set_error(OSP_ERR_UNSUPPORTED, "model: tensor parallelism runs on the CPU backend only so far "
                                                      "(the GPU needs NCCL collectives, not built yet)");
        if (params->draft_4bit_weights)
            return osp_set_error(OSP_ERR_UNSUPPORTED, "model: QuantSpec's 4-bit draft weights do not split across ranks");
        if (params->no_mmap) /* the copies are made whole, before the split: every rank would hold all the weights */
            return osp_set_error(OSP_ERR_UNSUPPORTED, "model: --no-mmap copies every matrix whole before the "
                                                      "tensor-parallel split (each rank would hold all the weights)");
        if (!m->arch->shard)
            return osp_set_error(OSP_ERR_UNSUPPORTED, "model: architecture %s has no tensor-parallel split yet", m->cfg.arch);
    }
    osp_backend_params bp = {
        .pool = m->pool,
        .exact = params && (params->exact || (params->emulate_bf16 && dev == OSP_DEVICE_CPU)),
        .emulate_bf16 = params && params->emulate_bf16 && dev == OSP_DEVICE_CPU,
        .act_q8 = params && params->cpu_activations == OSP_CPU_ACT_Q8,
        .no_mmap = params && params->no_mmap,
        .quant_weights = params && params->gpu_quant_weights,
        .comm = tp > 1 ? params->comm : NULL,
        .tp_rank = tp > 1 ? params->tensor_parallel_rank : 0,
    };
    OSP_TRY(osp_backend_create(dev, &bp, &m->be));
    m->be->n_vocab = m->cfg.n_vocab;
    char why[256] = "";
    /* on a device the 4-bit copies (Q4_K / Q4_0) stay 4-bit only as quantized weights (bf16 otherwise) */
    if (params && params->draft_4bit_weights && dev != OSP_DEVICE_CPU && !params->gpu_quant_weights)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "model: 4-bit draft weights (QuantSpec) on the GPU need "
                                                  "gpu_quant_weights (kept in their 4-bit blocks)");
    m->loader = (osp_loader){.gguf = m->gguf, .seed = seed, .preset = preset, .be = m->be, .path = path,
                             .requant_4bit = params && params->draft_4bit_weights,
                             .requant_k = dev != OSP_DEVICE_CPU, .pool = m->pool};
    /* only a device backend copies (and reports progress): on the CPU the weights stay mapped */
    if (params && params->progress && dev != OSP_DEVICE_CPU) {
        m->loader.progress = params->progress;
        m->loader.progress_ctx = params->progress_ctx;
        for (uint64_t i = 0; m->gguf && i < osp_gguf_n_tensors(m->gguf); i++)
            m->loader.total_bytes += osp_gguf_tensor_at(m->gguf, i)->nbytes;
    }
    OSP_TRY(m->arch->bind(&m->loader, &m->cfg, &m->weights));
    if (tp > 1) { /* from here on the model is the rank's share */
        osp_model_config rc;
        OSP_TRY(m->arch->shard(&m->loader, &m->cfg, params->tensor_parallel_rank, tp, m->weights, &rc));
        m->cfg = rc;
    }
    if (m->loader.progress) m->loader.progress(m->loader.progress_ctx, 1.0f);
    osp_build_opts bo = {.tp_world = tp};
    if (params && params->n_hidden_layers > 0) {
        if (params->n_hidden_layers > 8)
            return osp_set_error(OSP_ERR_INVALID_ARG, "model: at most 8 hidden-state layers (%d asked)", params->n_hidden_layers);
        for (int32_t i = 0; i < params->n_hidden_layers; i++)
            if (params->hidden_layers[i] < 0 || params->hidden_layers[i] >= m->cfg.n_layer ||
                (i > 0 && params->hidden_layers[i] <= params->hidden_layers[i - 1]))
                return osp_set_error(OSP_ERR_INVALID_ARG,
                                     "model: hidden-state layers must increase within 0..%d (got %d at %d)",
                                     m->cfg.n_layer - 1, params->hidden_layers[i], i);
        bo.n_hidden_layers = params->n_hidden_layers;
        bo.hidden_layers = params->hidden_layers;
    }
    for (int i = 0; i < 4; i++) {
        bo.final_norm = i >= 2;
        OSP_TRY(osp_graph_init(&m->graph[i]));
        OSP_TRY(m->arch->build(&m->cfg, m->weights, (i & 1) != 0, &bo, &m->graph[i]));
        for (int32_t k = 0; k < m->graph[i].n_ops; k++) {
            const osp_op *op = &m->graph[i].ops[k];
            if (!m->be->vt->supports_op(m->be, &m->graph[i], op, why, sizeof why))
                return osp_set_error(OSP_ERR_UNSUPPORTED, "%s backend: op %s (layer %d): %s", m->be->vt->name,
                                     osp_op_name(op->kind), op->layer, why);
        }
    }
    return OSP_OK;
}

static void *tp_worker(void *arg) {
    struct tp_rank *rk = arg;
    tp_driver *d = rk->d;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&d->mu);
        while (!d->quit && d->gen == seen) pthread_cond_wait(&d->go, &d->mu);
        if (d->quit) {
            pthread_mutex_unlock(&d->mu);
            return NULL;
        }
        seen = d->gen;
        pthread_mutex_unlock(&d->mu);
        osp_status s = osp_model_forward_embd(rk->m, d->kv->tp_ranks[rk->r], d->b, rk->logits, NULL,
                                              d->embd ? rk->embd : NULL);
        if (s != OSP_OK) {
            snprintf(rk->msg, sizeof rk->msg, "%s", osp_last_error());
            osp_comm_abort(d->comm); /* the ranks waiting in a collective for this one return */
        }
        pthread_mutex_lock(&d->mu);
        rk->st = s;
        if (--d->pending == 0) pthread_cond_signal(&d->done);
        pthread_mutex_unlock(&d->mu);
    }
}

static void tp_driver_free(tp_driver *d) {
    pthread_mutex_lock(&d->mu);
    d->quit = true;
    pthread_cond_broadcast(&d->go);
    pthread_mutex_unlock(&d->mu);
    for (int32_t r = 1; r <= d->n_threads_started; r++) pthread_join(d->rank[r].thread, NULL);
    for (int32_t r = 1; d->rank && r < d->n; r++) {
        osp_model_free(d->rank[r].m);
        free(d->rank[r].logits);
        free(d->rank[r].embd);
    }
    pthread_cond_destroy(&d->go);
    pthread_cond_destroy(&d->done);
    pthread_mutex_destroy(&d->mu);
    free(d->rank);
}

static osp_status tp_driver_load(osp_model *m, const osp_model_params *params, const osp_model_preset *preset,
                                 uint64_t seed, const char *path) {
    const int32_t n = params->tensor_parallel_size;
    if (preset || !m->gguf)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "model: tensor parallelism loads a GGUF file (not random weights)");
    if (params->tensor_parallel_rank != 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "model: tensor_parallel_rank %d without a communicator (the model "
                             "that drives the ranks is rank 0)", params->tensor_parallel_rank);
    if (n > 64) return osp_set_error(OSP_ERR_INVALID_ARG, "model: tensor_parallel_size %d (at most 64)", n);
    tp_driver *d = calloc(1, sizeof *d);
    if (!d) return osp_set_error(OSP_ERR_NOMEM, "model: out of memory");
    d->n = n;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->go, NULL);
    pthread_cond_init(&d->done, NULL);
    m->tp = d; /* from here osp_model_free cleans up */
    d->rank = calloc((size_t)n, sizeof *d->rank);
    if (!d->rank) return osp_set_error(OSP_ERR_NOMEM, "model: out of memory");
    for (int32_t r = 0; r < n; r++) d->rank[r].d = d, d->rank[r].r = r;
    OSP_TRY(osp_comm_local_create(n, &d->comm));
    osp_model_params rp = *params;
    const int nt = params->n_threads > 0 ? params->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    rp.n_threads = nt / n > 0 ? nt / n : 1; /* the cores shared among the ranks */
    rp.comm = d->comm;
    rp.tensor_parallel_rank = 0;
    OSP_TRY(finish_load(m, &rp, preset, seed, path));
    rp.progress = NULL;
    for (int32_t r = 1; r < n; r++) {
        rp.tensor_parallel_rank = r;
        OSP_TRY(osp_model_load(path, &rp, &d->rank[r].m));
    }
    for (int32_t r = 1; r < n; r++) {
        if (pthread_create(&d->rank[r].thread, NULL, tp_worker, &d->rank[r]) != 0)
            return osp_set_error(OSP_ERR_INTERNAL, "model: cannot start the thread of tensor-parallel rank %d", r);
        d->n_threads_started = r;
    }
    return OSP_OK;
}

/* A KV cache for a driver: rank 0's in kv itself, the others' beside it (kv_layout.h). */
static osp_status tp_kv_attach(const osp_model *m, osp_kv_cache *kv, int32_t num_blocks, int32_t block_size,
                               osp_kv_dtype k_dtype, osp_kv_dtype v_dtype) {
    const tp_driver *d = m->tp;
    kv->tp_ranks = calloc((size_t)d->n, sizeof *kv->tp_ranks);
    if (!kv->tp_ranks) return osp_set_error(OSP_ERR_NOMEM, "kv cache: out of memory");
    kv->tp_n = d->n;
    for (int32_t r = 1; r < d->n; r++)
        OSP_TRY(osp_kv_cache_create_with_scales(d->rank[r].m, num_blocks, block_size, k_dtype, v_dtype, NULL, NULL,
                                                &kv->tp_ranks[r]));
    return OSP_OK;
}

/* A GGUF's model config as osp_model_load reads it: general.architecture, its family (*arch), n_vocab from
 * token_embd's rows, then the family's hyper-parameters. Errors name path. */
static osp_status read_file_config(const osp_gguf *g, const char *path, osp_model_config *c, const osp_arch **arch) {
    osp_gguf_str name;
    OSP_TRY(osp_gguf_get_str(g, "general.architecture", &name));
    if (name.len >= sizeof c->arch) name.len = sizeof c->arch - 1;
    memcpy(c->arch, name.data, name.len);
    c->arch[name.len] = '\0';
    *arch = osp_arch_find(c->arch);
    if (!*arch)
        return osp_set_error(OSP_ERR_UNSUPPORTED,
                             "%s: general.architecture '%s' is not supported (supported: llama, qwen2, qwen3, gemma3)",
                             path, c->arch);
    const osp_gguf_tensor *emb = osp_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return osp_set_error(OSP_ERR_FORMAT, "%s: tensor 'token_embd.weight' is missing", path);
    if (emb->ne[1] < 1 || emb->ne[1] > INT32_MAX)
        return osp_set_error(OSP_ERR_FORMAT, "%s: token_embd.weight has a bad vocabulary size", path);
    c->n_vocab = (int32_t)emb->ne[1];
    return (*arch)->read_config(g, c);
}

osp_status osp_model_probe(const char *path, osp_model_config *cfg, int64_t *device_bytes) {
    if (!path || !cfg) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_model_probe: NULL argument");
    memset(cfg, 0, sizeof *cfg);
    if (device_bytes) *device_bytes = 0;
    osp_gguf *g = NULL;
    OSP_TRY(osp_gguf_open(path, &g));
    const osp_arch *a;
    const osp_status s = read_file_config(g, path, cfg, &a);
    if (s == OSP_OK && device_bytes) {
        int64_t bytes = 0;
        for (uint64_t i = 0; i < osp_gguf_n_tensors(g); i++) {
            const osp_gguf_tensor *t = osp_gguf_tensor_at(g, i);
            int64_t n = 1;
            for (uint32_t d = 0; d < t->n_dims; d++) n *= t->ne[d];
            bytes += (t->n_dims < 2 ? 4 : 2) * n; /* vectors fp32, matrices bf16 */
        }
        *device_bytes = bytes;
    }
    osp_gguf_close(g);
    if (s != OSP_OK) memset(cfg, 0, sizeof *cfg);
    return s;
}

osp_status osp_model_load(const char *path, const osp_model_params *params, osp_model **out) {
    if (!path || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_model_load: NULL argument");
    *out = NULL;
    osp_model *m = calloc(1, sizeof *m);
    if (!m) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", path);
    osp_status s = osp_gguf_open(path, &m->gguf);
    if (s != OSP_OK) goto fail;
    if (params && params->no_mmap) osp_gguf_advise_copy_out(m->gguf); /* copied out and dropped: small pages */
    if ((s = read_file_config(m->gguf, path, &m->cfg, &m->arch)) != OSP_OK) goto fail;
    if ((s = finish_load(m, params, NULL, 0, path)) != OSP_OK) goto fail;
    *out = m;
    return OSP_OK;
fail:
    osp_model_free(m);
    return s;
}

osp_status osp_model_load_random(const char *preset, uint64_t seed, const osp_model_params *params, osp_model **out) {
    if (!out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_model_load_random: NULL argument");
    *out = NULL;
    const osp_model_preset *p = osp_model_preset_find(preset);
    if (!p)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "--random-weights: unknown preset '%s' (see osprey make-random-model --list-presets)",
                             preset ? preset : "(null)");
    if (!params || params->device != OSP_DEVICE_CUDA)
        return osp_set_error(OSP_ERR_UNSUPPORTED,
                             "--random-weights fills the weights on the GPU (--device cuda); on the CPU "
                             "write a GGUF with osprey make-random-model --preset %s",
                             preset);
    osp_model *m = calloc(1, sizeof *m);
    if (!m) return osp_set_error(OSP_ERR_NOMEM, "out of memory");
    osp_model_config *c = &m->cfg;
    snprintf(c->arch, sizeof c->arch, "%s", p->arch);
    osp_status s = OSP_OK;
    m->arch = osp_arch_find(c->arch);
    if (!m->arch || !m->arch->preset_config)
        s = osp_set_error(OSP_ERR_UNSUPPORTED, "--random-weights: preset '%s' has no architecture builder", preset);
    if (s == OSP_OK) s = m->arch->preset_config(p, c);
    if (s == OSP_OK) s = finish_load(m, params, p, seed, preset);
    if (s != OSP_OK) {
        osp_model_free(m);
        return s;
    }
    *out = m;
    return OSP_OK;
}

const osp_model_config *osp_model_config_get(const osp_model *m) { return &m->cfg; }
osp_device osp_model_device(const osp_model *m) { return m->be->vt->device; }
size_t osp_model_device_weight_bytes(const osp_model *m) { return m->be->vt->weight_bytes(m->be); }
const osp_gguf *osp_model_gguf(const osp_model *m) { return m->gguf; }
int osp_model_n_threads(const osp_model *m) { return m->n_threads; }
void osp_model_run_parallel(osp_model *m, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    osp_threadpool_run(m->pool, fn, ctx);
}

static osp_kv_shape kv_shape(const osp_model_config *c) {
    return (osp_kv_shape){c->n_layer, c->n_head_kv, c->head_dim};
}

osp_status osp_kv_cache_view_for(const osp_kv_cache *kv, const osp_model *reader, osp_kv_cache *view) {
    if (!kv || !reader || !view) return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache view: NULL argument");
    if (kv->tp_n > 1 || reader->tp)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache view: not across tensor-parallel ranks");
    if (kv->be->vt->device != reader->be->vt->device)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache view: the cache is on the %s, the reader on the %s",
                             kv->be->vt->name, reader->be->vt->name);
    if (kv->n_layer != reader->cfg.n_layer || kv->k_fmt.kv_row != (int64_t)reader->cfg.n_head_kv * reader->cfg.head_dim)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv cache view: the cache was made for a model of another shape");
    *view = *kv;
    view->be = reader->be; /* borrowed, not retained: a view is never freed */
    return OSP_OK;
}

osp_status osp_kv_cache_create(const osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype dtype,
                               osp_kv_cache **out) {
    return osp_kv_cache_create_with_scales(m, num_blocks, block_size, dtype, dtype, NULL, NULL, out);
}

osp_status osp_kv_cache_create_with_scales(const osp_model *m, int32_t num_blocks, int32_t block_size,
                                           osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, const float *k_fixed,
                                           const float *v_fixed, osp_kv_cache **out) {
    const osp_kv_shape sh = kv_shape(&m->cfg);
    if (m->tp && (k_fixed || v_fixed))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: fixed KV scales (a scales file) are not split across "
                                                  "tensor-parallel ranks yet");
    OSP_TRY(osp_kv_cache_create_scaled(m->be, &sh, num_blocks, block_size, k_dtype, v_dtype, k_fixed, v_fixed, out));
    if (!m->tp) return OSP_OK;
    const osp_status s = tp_kv_attach(m, *out, num_blocks, block_size, k_dtype, v_dtype);
    if (s != OSP_OK) {
        osp_kv_cache_free(*out);
        *out = NULL;
    }
    return s;
}

osp_status osp_kv_cache_check(const osp_model *m, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype) {
    const osp_kv_shape sh = kv_shape(&m->cfg);
    size_t bytes; /* the page formats of both sides fit the shape (osp_kv_cache_size checks both) */
    OSP_TRY(osp_kv_cache_size(&sh, 1, 1, k_dtype, v_dtype, &bytes));
    char why[256] = "";
    if (m->be->vt->supports_kv && !m->be->vt->supports_kv(m->be, k_dtype, v_dtype, why, sizeof why))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "kv cache: %s", why);
    return OSP_OK;
}

int64_t osp_kv_cache_bytes_per_token(const osp_model_config *c, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype) {
    const osp_kv_shape sh = kv_shape(c);
    osp_kv_page_format fk, fv;
    if (osp_kv_page_format_of(&sh, k_dtype, &fk) != OSP_OK || osp_kv_page_format_of(&sh, v_dtype, &fv) != OSP_OK) return 0;
    return (int64_t)c->n_layer *
           (int64_t)(fk.bytes_per_token + fk.scale_bytes_per_token + fv.bytes_per_token + fv.scale_bytes_per_token);
}

int64_t osp_kv_cache_bytes_for(const osp_model_config *c, osp_kv_dtype k_dtype, osp_kv_dtype v_dtype, int32_t num_blocks,
                               int32_t block_size) {
    const osp_kv_shape sh = kv_shape(c);
    size_t bytes;
    if (osp_kv_cache_size(&sh, num_blocks, block_size, k_dtype, v_dtype, &bytes) != OSP_OK || bytes > INT64_MAX) return 0;
    return (int64_t)bytes;
}

/* ---- forward ----------------------------------------------------------------------------------- */

static osp_status check_batch(const osp_model *m, const osp_kv_cache *kv, const osp_batch *b) {
    const int64_t n_slots = (int64_t)kv->num_blocks * kv->block_size;
    if (b->num_tokens <= 0 || b->num_seqs <= 0 || b->num_logits < 0 || b->max_blocks_per_seq <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "batch: empty or negative sizes");
    if (b->query_start_loc[0] != 0 || b->query_start_loc[b->num_seqs] != b->num_tokens)
        return osp_set_error(OSP_ERR_INVALID_ARG, "batch: query_start_loc must run from 0 to num_tokens");
    for (int32_t s = 0; s < b->num_seqs; s++) {
        const int32_t lo = b->query_start_loc[s], hi = b->query_start_loc[s + 1];
        if (hi <= lo) return osp_set_error(OSP_ERR_INVALID_ARG, "batch: sequence %d has no tokens", s);
        const int32_t len = b->seq_lens[s];
        if (len < hi - lo || (int64_t)len > (int64_t)b->max_blocks_per_seq * kv->block_size)
            return osp_set_error(OSP_ERR_INVALID_ARG, "batch: seq_lens[%d] = %d is out of range", s, len);
        for (int32_t i = 0; i < (len + kv->block_size - 1) / kv->block_size; i++) {
            const int32_t blk = b->block_table[(size_t)s * b->max_blocks_per_seq + i];
            if (blk < 0 || blk >= kv->num_blocks)
                return osp_set_error(OSP_ERR_INVALID_ARG, "batch: block_table[%d][%d] = %d is not a block", s, i, blk);
        }
        for (int32_t t = lo; t < hi; t++) {
            if (b->positions[t] < 0 || b->positions[t] >= len)
                return osp_set_error(OSP_ERR_INVALID_ARG, "batch: position %d of token %d is outside seq_lens %d",
                                     b->positions[t], t, len);
            const int32_t p = b->positions[t];
            const int64_t slot = (int64_t)b->block_table[(size_t)s * b->max_blocks_per_seq + p / kv->block_size] *
                                     kv->block_size + p % kv->block_size;
            if (b->slot_mapping[t] != slot)
                return osp_set_error(OSP_ERR_INVALID_ARG,
                                     "batch: slot_mapping[%d] = %d does not match block_table (%lld)", t,
                                     b->slot_mapping[t], (long long)slot);
        }
    }
    for (int32_t t = 0; t < b->num_tokens; t++) {
        if (b->token_ids[t] < 0 || b->token_ids[t] >= m->cfg.n_vocab)
            return osp_set_error(OSP_ERR_INVALID_ARG, "batch: token id %d is outside the vocabulary (%d)",
                                 b->token_ids[t], m->cfg.n_vocab);
        if (b->slot_mapping[t] < 0 || b->slot_mapping[t] >= n_slots)
            return osp_set_error(OSP_ERR_INVALID_ARG, "batch: slot_mapping[%d] = %d is outside the cache", t,
                                 b->slot_mapping[t]);
    }
    for (int32_t i = 0; i < b->num_logits; i++)
        if (b->logits_indices[i] < 0 || b->logits_indices[i] >= b->num_tokens)
            return osp_set_error(OSP_ERR_INVALID_ARG, "batch: logits_indices[%d] = %d is out of range", i,
                                 b->logits_indices[i]);
    return OSP_OK;
}

osp_status osp_model_forward(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits) {
    return osp_model_forward_hidden(m, kv, b, logits, NULL);
}

osp_status osp_model_forward_hidden(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits, float *const *hidden) {
    return osp_model_forward_embd(m, kv, b, logits, hidden, NULL);
}

static osp_status forward_check(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits);
static osp_status forward_run(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits, float *const *hidden,
                              float *embd);
static osp_status tp_forward(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits, float *const *hidden,
                             float *embd);

osp_status osp_model_forward_embd(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits,
                                  float *const *hidden, float *embd) {
    if (m->tp) return tp_forward(m, kv, b, logits, hidden, embd);
    OSP_TRY(forward_check(m, kv, b, logits));
    return forward_run(m, kv, b, logits, hidden, embd);
}

/* The op list on the model's backend (arguments checked). */
static osp_status forward_run(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits, float *const *hidden,
                              float *embd) {
    const osp_graph *g = &m->graph[(b->num_logits > 0) + (embd ? 2 : 0)];
    osp_act_io acts[9];
    int32_t n_acts = 0;
    for (int32_t i = 0; hidden && i < g->n_hidden; i++) acts[n_acts++] = (osp_act_io){g->hidden[i], hidden[i], false};
    if (embd) acts[n_acts++] = (osp_act_io){g->embd, embd, false};
    const osp_run_io io = {.logits = logits, .acts = acts, .n_acts = n_acts, .attn_hook = m->attn_hook,
                           .dev_sparse = m->dev_sparse};
    return m->be->vt->run(m->be, g, kv, b, &io);
}

/* The arguments of a forward (every rank's are the same: the driver checks them once, before any rank
 * starts, so bad input never aborts the communicator). */
static osp_status forward_check(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits) {
    const bool host = m->be->vt->device == OSP_DEVICE_CPU;
    if (!kv || !b || (b->num_logits > 0 && !logits && host)) /* on a device NULL keeps them there */
        return osp_set_error(OSP_ERR_INVALID_ARG, "forward: NULL argument");
    /* A cache serves any model of its shape on the CPU (host pages); on a device only the model it
     * was made for (its pages are ordered on that model's stream). */
    if (kv->n_layer != m->cfg.n_layer || kv->k_fmt.kv_row != (int64_t)m->cfg.n_head_kv * m->cfg.head_dim)
        return osp_set_error(OSP_ERR_INVALID_ARG, "forward: the KV cache was made for a model of another shape");
    if (kv->be->vt->device != m->be->vt->device) /* the CPU path would dereference device pages */
        return osp_set_error(OSP_ERR_INVALID_ARG, "forward: the KV cache is on the %s, the model on the %s",
                             kv->be->vt->name, m->be->vt->name);
    if (!host && kv->be != m->be)
        return osp_set_error(OSP_ERR_INVALID_ARG, "forward: the KV cache was made for another model on the %s",
                             m->be->vt->name);
    return check_batch(m, kv, b);
}

/* grows *buf to n floats */
static osp_status tp_grow(float **buf, size_t *cap, size_t n) {
    if (n <= *cap) return OSP_OK;
    float *p = realloc(*buf, n * sizeof *p);
    if (!p) return osp_set_error(OSP_ERR_NOMEM, "forward: out of memory for a tensor-parallel rank's outputs");
    *buf = p, *cap = n;
    return OSP_OK;
}

static osp_status tp_forward(osp_model *m, osp_kv_cache *kv, const osp_batch *b, float *logits, float *const *hidden,
                             float *embd) {
    tp_driver *d = m->tp;
    if (m->attn_hook || m->dev_sparse)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "forward: sparse attention does not run across tensor-parallel ranks yet");
    OSP_TRY(forward_check(m, kv, b, logits));
    if (kv->tp_n != d->n)
        return osp_set_error(OSP_ERR_INVALID_ARG, "forward: the KV cache was not made for this tensor-parallel model");
    for (int32_t r = 1; r < d->n; r++) {
        struct tp_rank *rk = &d->rank[r];
        OSP_TRY(tp_grow(&rk->logits, &rk->cap, (size_t)b->num_logits * (size_t)m->cfg.n_vocab + 1));
        if (embd) OSP_TRY(tp_grow(&rk->embd, &rk->cap_embd, (size_t)b->num_tokens * (size_t)m->cfg.n_embd));
    }
    pthread_mutex_lock(&d->mu);
    d->kv = kv, d->b = b, d->embd = embd != NULL;
    d->pending = d->n - 1;
    d->gen++;
    pthread_cond_broadcast(&d->go);
    pthread_mutex_unlock(&d->mu);
    /* rank 0 here: this model's own graph, over its own share of the cache */
    const osp_status s0 = forward_run(m, kv, b, logits, hidden, embd);
    if (s0 != OSP_OK) {
        snprintf(d->rank[0].msg, sizeof d->rank[0].msg, "%s", osp_last_error());
        osp_comm_abort(d->comm);
    }
    pthread_mutex_lock(&d->mu);
    while (d->pending > 0) pthread_cond_wait(&d->done, &d->mu);
    pthread_mutex_unlock(&d->mu);
    if (s0 != OSP_OK) return osp_set_error(s0, "tensor-parallel rank 0: %s", d->rank[0].msg);
    for (int32_t r = 1; r < d->n; r++)
        if (d->rank[r].st != OSP_OK) return osp_set_error(d->rank[r].st, "tensor-parallel rank %d: %s", r, d->rank[r].msg);
    return OSP_OK;
}

/* ---- device-side results (model_exec.h) -------------------------------------------------------- */

osp_status osp_model_sample(osp_model *m, const osp_sampler_row *rows, const int32_t *logits_rows, int32_t n,
                            int32_t *tokens, osp_logprobs *logprobs, osp_status *status) {
    return m->be->vt->sample(m->be, rows, logits_rows, n, tokens, logprobs, status);
}

osp_status osp_model_logits_to_host(osp_model *m, int32_t row0, int32_t n, float *dst) {
    return m->be->vt->logits_to_host(m->be, row0, n, dst);
}

bool osp_model_samples_on_device(const osp_model *m) { return m->be->vt->device != OSP_DEVICE_CPU; }

osp_status osp_model_sync(osp_model *m) { return m->be->vt->sync(m->be); }

osp_status osp_model_timeline_enable(osp_model *m, bool *enabled) {
    *enabled = false;
    if (!m->be->vt->timeline_enable) return OSP_OK;
    OSP_TRY(m->be->vt->timeline_enable(m->be));
    *enabled = true;
    return OSP_OK;
}

osp_status osp_model_timeline_get(osp_model *m, osp_backend_step_times *t) {
    t->run[0] = t->run[1] = t->sample[0] = t->sample[1] = -1.0;
    return m->be->vt->timeline_get ? m->be->vt->timeline_get(m->be, t) : OSP_OK;
}

osp_status osp_model_mem_info(osp_model *m, size_t *free_bytes, size_t *total_bytes) {
    return m->be->vt->mem_info(m->be, free_bytes, total_bytes);
}

const osp_graph *osp_model_graph(const osp_model *m, bool with_logits) { return &m->graph[with_logits]; }

void osp_model_set_attn_hook(osp_model *m, const osp_attn_hook *hook) { m->attn_hook = hook; }

void osp_model_set_dev_sparse(osp_model *m, osp_dev_sparse *ds) { m->dev_sparse = ds; }
