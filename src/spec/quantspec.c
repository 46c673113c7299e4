/* QuantSpec self-speculation (Tiwari et al. 2025, "QuantSpec: Self-Speculative Decoding with Hierarchical
 * Quantized KV Cache"): the draft is the target itself with 4-bit weights, reading the target's own KV
 * cache, and int8_hier pages by their upper 4-bit halves (the paper's hierarchical cache: the target
 * reads both halves, an 8-bit value; the draft the upper ones, a 4-bit value) except the most recent
 * OSP_QUANTSPEC_FULL_RECENT keys, read in full.
 *
 * Where the candidates' K/V go. The draft's passes write K/V for positions P0 .. P0 + k - 1 (P0 the
 * sequence's last token, whose K/V the target writes only in the verification step). Those slots are
 * not the sequence's yet (its blocks cover its computed tokens), and the partly filled last block may be
 * a block the target must not see changed. So every pass writes into staging blocks the pool never
 * hands out (the paper's staging area for candidates): the sequence's partly filled last block is
 * copied into the first staging block, and the draft's block table is the sequence's full blocks
 * followed by the staging ones. The target's verification then writes its own K/V for those positions
 * into the sequence's blocks; a rejected candidate's K/V is simply never read. Nothing to roll back,
 * no state between steps.
 *
 * The draft drafts its argmax (as the draft_model proposer), so the engine's point-mass verification
 * keeps outputs exactly the target's, greedy and sampled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/status_internal.h"
#include "kv/kv_cache.h"
#include "spec/proposer.h"

typedef struct qs_proposer {
    osp_proposer base;
    osp_model *model;  /* the target's GGUF, 4-bit weights */
    osp_kv_cache *kv;  /* the target's cache (borrowed): staging-block copies go through it */
    osp_kv_cache view; /* a shallow copy of it with the draft's read view, run on the draft's backend
                        * (osp_kv_cache_view_for; never freed) */
    bool on_device;    /* the target (and so the draft) is on a GPU: two streams to order */
    int32_t block_size, staging0, staging_per_seq, max_blocks_per_seq, n_vocab;
    /* one pass's batch: up to OSP_QUANTSPEC_MAX_SEQS rows of one token */
    int32_t tok[OSP_QUANTSPEC_MAX_SEQS], pos[OSP_QUANTSPEC_MAX_SEQS], slot[OSP_QUANTSPEC_MAX_SEQS];
    int32_t qsl[OSP_QUANTSPEC_MAX_SEQS + 1], lens[OSP_QUANTSPEC_MAX_SEQS], lidx[OSP_QUANTSPEC_MAX_SEQS];
    int32_t *bt;    /* [OSP_QUANTSPEC_MAX_SEQS, max_blocks_per_seq] */
    float *logits;  /* [OSP_QUANTSPEC_MAX_SEQS, n_vocab] */
} qs_proposer;

int32_t osp_quantspec_staging_blocks(int32_t k, int32_t block_size) {
    if (k < 1 || block_size < 1) return 0;
    /* the last block's block_size - 1 computed tokens at most, then k candidates */
    return OSP_QUANTSPEC_MAX_SEQS * ((block_size - 1 + k + block_size - 1) / block_size);
}

static osp_status qs_propose(osp_proposer *p, osp_spec_seq *seqs, int32_t n) {
    qs_proposer *q = (qs_proposer *)p;
    const int32_t bs = q->block_size, W = q->max_blocks_per_seq, per = q->staging_per_seq;
    osp_spec_seq *rows[OSP_QUANTSPEC_MAX_SEQS];
    int32_t m = 0, kmax = 0;
    /* 1. the sequences this call drafts for (row i's staging blocks: staging0 + i * per ...), each one's
     *    partly filled last block copied into its first staging block */
    for (int32_t i = 0; i < n; i++) {
        osp_spec_seq *s = &seqs[i];
        s->num_draft = 0;
        const int32_t p0 = s->num_tokens - 1; /* the last token: the first pass's input */
        if (m == OSP_QUANTSPEC_MAX_SEQS || s->max_draft < 1 || p0 < 0 || s->num_computed != p0 || !s->block_ids ||
            s->num_blocks != (p0 + bs - 1) / bs || p0 / bs + per > W || (p0 % bs + s->max_draft - 1) / bs >= per)
            continue;
        if (p0 % bs) OSP_TRY(osp_kv_cache_copy_block(q->kv, s->block_ids[p0 / bs], q->staging0 + m * per));
        if (s->max_draft > kmax) kmax = s->max_draft;
        rows[m++] = s;
    }
    /* on a device the copies (and the target's last writes) run on the target's stream, the draft's
     * passes on its own: they must be done before the draft reads them */
    if (m > 0 && q->on_device) OSP_TRY(osp_kv_cache_sync(q->kv));
    /* 2. k passes of one token a sequence (the last token, then each draft); a row's block table is its
     *    full blocks, then its staging blocks */
    for (int32_t j = 0; j < kmax; j++) {
        int32_t r = 0;
        osp_spec_seq *in[OSP_QUANTSPEC_MAX_SEQS];
        q->qsl[0] = 0;
        for (int32_t i = 0; i < m; i++) {
            osp_spec_seq *s = rows[i];
            if (s->max_draft <= j) continue; /* its drafts are done (each pass adds one to every row) */
            const int32_t p0 = s->num_tokens - 1, full = p0 / bs, off = p0 % bs + j, stage0 = q->staging0 + i * per;
            int32_t *bt = q->bt + (size_t)r * (size_t)W;
            memcpy(bt, s->block_ids, sizeof *bt * (size_t)full);
            for (int32_t b = 0; b < per; b++) bt[full + b] = stage0 + b;
            q->tok[r] = j == 0 ? s->tokens[p0] : s->draft[j - 1];
            q->pos[r] = p0 + j;
            q->slot[r] = (stage0 + off / bs) * bs + off % bs;
            q->lens[r] = p0 + j + 1;
            q->lidx[r] = r;
            q->qsl[r + 1] = r + 1;
            in[r++] = s;
        }
        if (r == 0) break;
        const osp_batch b = {.num_tokens = r, .token_ids = q->tok, .positions = q->pos, .slot_mapping = q->slot,
                             .num_seqs = r, .query_start_loc = q->qsl, .seq_lens = q->lens, .block_table = q->bt,
                             .max_blocks_per_seq = W, .logits_indices = q->lidx, .num_logits = r};
        const osp_status st = osp_model_forward(q->model, &q->view, &b, q->logits);
        if (st != OSP_OK) {
            for (int32_t i = 0; i < n; i++) seqs[i].num_draft = 0;
            return st;
        }
        for (int32_t l = 0; l < r; l++) in[l]->draft[in[l]->num_draft++] = osp_spec_argmax(q->logits + (size_t)l * (size_t)q->n_vocab, q->n_vocab);
    }
    return OSP_OK;
}

int64_t osp_quantspec_draft_device_bytes(const osp_model *target) {
    const osp_gguf *g = target ? osp_model_gguf(target) : NULL;
    if (!g) return 0;
    int64_t bytes = 256ll << 20;
    for (uint64_t i = 0; i < osp_gguf_n_tensors(g); i++) {
        const osp_gguf_tensor *t = osp_gguf_tensor_at(g, i);
        int64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= t->ne[d];
        if (t->n_dims < 2) {
            bytes += 4 * n;
        } else if (8.0 * (double)t->nbytes > 5.0 * (double)n && t->ne[0] % 32 == 0) {
            bytes += n / 32 * 18; /* the loader's 4-bit copy, Q4_0 or Q4_K alike (loader.c requant_4bit) */
        } else if (t->type == OSP_DTYPE_Q4_0 || t->type == OSP_DTYPE_Q4_1 || t->type == OSP_DTYPE_Q4_K) {
            bytes += (int64_t)t->nbytes;
        } else {
            bytes += 2 * n; /* bf16 */
        }
    }
    return bytes;
}

static void qs_destroy(osp_proposer *p) {
    qs_proposer *q = (qs_proposer *)p;
    if (!q) return;
    osp_model_free(q->model);
    free(q->bt);
    free(q->logits);
    free(q);
}

static const osp_proposer_ops qs_ops = {.name = "quantspec", .propose = qs_propose, .release = NULL, .destroy = qs_destroy};

osp_status osp_quantspec_proposer_create(const osp_spec_config *c, const osp_proposer_target *t, osp_proposer **out) {
    *out = NULL;
    if (!t || !t->model || !t->kv || t->block_size < 1 || t->max_model_len < 2)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quantspec: needs the target model and its KV cache");
    const int32_t need = osp_quantspec_staging_blocks(c->num_speculative_tokens, t->block_size);
    if (t->num_staging_blocks < need || t->staging_block0 < 0 ||
        t->staging_block0 + t->num_staging_blocks > osp_kv_cache_num_blocks(t->kv))
        return osp_set_error(OSP_ERR_INVALID_ARG, "quantspec: %d staging blocks from %d in a cache of %d (%d needed)",
                             t->num_staging_blocks, t->staging_block0, osp_kv_cache_num_blocks(t->kv), need);
    const osp_gguf *g = osp_model_gguf(t->model);
    if (!g) return osp_set_error(OSP_ERR_UNSUPPORTED, "quantspec: the target must be a GGUF model");
    qs_proposer *q = calloc(1, sizeof *q);
    if (!q) return osp_set_error(OSP_ERR_NOMEM, "quantspec: out of memory");
    q->base.ops = &qs_ops;
    osp_model_params mp = osp_model_default_params();
    mp.device = osp_model_device(t->model);
    mp.n_threads = t->n_threads;
    mp.exact = t->exact;
    mp.cpu_activations = t->cpu_activations;
    mp.draft_4bit_weights = true;
    /* on the GPU the 4-bit copies are multiplied in their blocks (the decode-floor issue's kernels) */
    q->on_device = mp.device != OSP_DEVICE_CPU;
    mp.gpu_quant_weights = q->on_device;
    osp_status s = osp_model_load(osp_gguf_path(g), &mp, &q->model);
    if (s != OSP_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", osp_last_error());
        s = osp_set_error(s, "quantspec: loading the 4-bit draft: %s", msg);
        goto fail;
    }
    q->kv = t->kv;
    if ((s = osp_kv_cache_view_for(t->kv, q->model, &q->view)) != OSP_OK) goto fail;
    if (t->kv->k_fmt.dtype == OSP_KV_DTYPE_INT8_HIER || t->kv->v_fmt.dtype == OSP_KV_DTYPE_INT8_HIER)
        (void)osp_kv_cache_set_hier_view(&q->view, OSP_QUANTSPEC_FULL_RECENT);
    q->block_size = t->block_size;
    q->staging0 = t->staging_block0;
    q->staging_per_seq = need / OSP_QUANTSPEC_MAX_SEQS;
    q->max_blocks_per_seq = (t->max_model_len + t->block_size - 1) / t->block_size + q->staging_per_seq;
    q->n_vocab = osp_model_config_get(q->model)->n_vocab;
    q->bt = calloc((size_t)OSP_QUANTSPEC_MAX_SEQS * (size_t)q->max_blocks_per_seq, sizeof *q->bt);
    q->logits = malloc(sizeof *q->logits * (size_t)OSP_QUANTSPEC_MAX_SEQS * (size_t)q->n_vocab);
    if (!q->bt || !q->logits) {
        s = osp_set_error(OSP_ERR_NOMEM, "quantspec: out of memory");
        goto fail;
    }
    *out = &q->base;
    return OSP_OK;
fail:
    qs_destroy(&q->base);
    return s;
}
