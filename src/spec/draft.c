/* The draft-model proposer (vLLM's "draft_model"; Leviathan et al. 2023, Chen et al. 2023): a smaller
 * model with the target's tokenizer drafts k tokens per step, one forward pass each, and the target
 * verifies them all in one pass.
 *
 * The draft drafts its argmax (vLLM V1 drafts the same way): the draft is deterministic, so the
 * engine's point-mass verification (verify.h) keeps outputs exactly the target's, greedy and sampled
 * alike, and a seeded request gives the tokens it gives without speculation.
 *
 * State: the draft's own paged KV cache (the target's block size and block count, the target's K
 * dtype), and per sequence (keyed by uid) the token ids whose K/V the draft cache holds and the blocks
 * holding them. That state is a cache of work done, never needed for correctness: each step a
 * sequence's cached ids are cut to their longest common prefix with the sequence's tokens (which drops
 * the drafts the target rejected: rollback), the rest is run through the draft (a prompt catches up
 * in chunks of max_num_batched_tokens), then k - 1 single-token passes draft the rest. When the cache
 * runs out of blocks, the sequences least recently drafted for (not in this call) give theirs back;
 * a sequence that still does not fit gets no drafts this step.
 *
 * One step, n sequences, k drafts: the catch-up passes (typically 1 + accepted tokens a sequence),
 * then k - 1 passes of n tokens; every pass is one batch over all the sequences. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "osprey/tokenizer.h"
#include "spec/proposer.h"

typedef struct draft_seq {
    uint64_t uid;
    bool live;
    int32_t *ids; /* [cap_ids] the tokens whose K/V the draft cache holds, positions 0..num_cached) */
    int32_t num_cached, cap_ids;
    int32_t *blocks; /* [num_blocks] */
    int32_t num_blocks;
    uint64_t last_used; /* the propose call that last used it */
    /* this call */
    osp_spec_seq *q;    /* NULL: not in this call */
    int32_t k;          /* drafts wanted (0 when it does not fit) */
    int32_t done;       /* catch-up tokens run so far this call (from num_cached) */
} draft_seq;

typedef struct draft_proposer {
    osp_proposer base;
    osp_model *model;
    osp_kv_cache *kv;
    int32_t block_size, max_blocks_per_seq, budget, n_vocab; /* n_vocab: ids drafted are below it */
    int32_t max_pos;  /* positions the draft may write: [0, max_pos) */
    int32_t *free_blocks, num_free;
    draft_seq *seqs;
    int32_t num_seqs, cap_seqs;
    uint64_t tick;
    /* one pass's batch, sized for budget tokens and cap_rows sequences */
    int32_t *tok, *pos, *slot, *qsl, *lens, *bt, *lidx, *row_of;
    int32_t cap_rows;
    float *logits; /* [cap_rows, n_vocab_model] */
    int32_t n_vocab_model;
} draft_proposer;

static void seq_drop(draft_proposer *d, draft_seq *s) {
    for (int32_t i = 0; i < s->num_blocks; i++) d->free_blocks[d->num_free++] = s->blocks[i];
    free(s->ids);
    free(s->blocks);
    memset(s, 0, sizeof *s);
}

static draft_seq *seq_find(draft_proposer *d, uint64_t uid) {
    for (int32_t i = 0; i < d->num_seqs; i++)
        if (d->seqs[i].live && d->seqs[i].uid == uid) return &d->seqs[i];
    return NULL;
}

/* A state for uid in a free slot; the caller made room (seqs_room), so d->seqs does not move. */
static draft_seq *seq_new(draft_proposer *d, uint64_t uid) {
    draft_seq *s = NULL;
    for (int32_t i = 0; i < d->num_seqs && !s; i++)
        if (!d->seqs[i].live) s = &d->seqs[i];
    if (!s) s = &d->seqs[d->num_seqs++];
    memset(s, 0, sizeof *s);
    if (!(s->blocks = malloc(sizeof *s->blocks * (size_t)d->max_blocks_per_seq))) return NULL;
    s->live = true, s->uid = uid;
    return s;
}

/* Room for n more states without moving d->seqs. */
static osp_status seqs_room(draft_proposer *d, int32_t n) {
    if (d->num_seqs + n <= d->cap_seqs) return OSP_OK;
    int32_t cap = d->cap_seqs ? d->cap_seqs : 16;
    while (cap < d->num_seqs + n) cap *= 2;
    draft_seq *v = realloc(d->seqs, sizeof *v * (size_t)cap);
    if (!v) return osp_set_error(OSP_ERR_NOMEM, "draft model: out of memory");
    d->seqs = v, d->cap_seqs = cap;
    return OSP_OK;
}

/* Blocks for tokens [0, ntok) of s; frees the least recently used other sequences' blocks when
 * short. false when it cannot (s keeps what it had). */
static bool seq_reserve(draft_proposer *d, draft_seq *s, int32_t ntok) {
    const int32_t want = (ntok + d->block_size - 1) / d->block_size;
    if (want > d->max_blocks_per_seq) return false;
    while (s->num_blocks < want) {
        if (d->num_free == 0) {
            draft_seq *lru = NULL;
            for (int32_t i = 0; i < d->num_seqs; i++) {
                draft_seq *o = &d->seqs[i];
                if (o->live && !o->q && o->num_blocks > 0 && (!lru || o->last_used < lru->last_used)) lru = o;
            }
            if (!lru) return false;
            seq_drop(d, lru);
            continue;
        }
        s->blocks[s->num_blocks++] = d->free_blocks[--d->num_free];
    }
    return true;
}

static osp_status ids_reserve(draft_seq *s, int32_t n) {
    if (n <= s->cap_ids) return OSP_OK;
    int32_t cap = s->cap_ids ? s->cap_ids : 64;
    while (cap < n) cap *= 2;
    int32_t *v = realloc(s->ids, sizeof *v * (size_t)cap);
    if (!v) return osp_set_error(OSP_ERR_NOMEM, "draft model: out of memory");
    s->ids = v, s->cap_ids = cap;
    return OSP_OK;
}

/* Adds tokens of s to the pass under construction: ids ids[0..n) at positions from pos0; logits of the
 * last one when want_logits. */
static void add_row(draft_proposer *d, osp_batch *b, draft_seq *s, const int32_t *ids, int32_t n, int32_t pos0,
                    bool want_logits, int32_t row_tag) {
    int32_t *tok = d->tok + b->num_tokens, *pos = d->pos + b->num_tokens, *slot = d->slot + b->num_tokens;
    for (int32_t i = 0; i < n; i++) {
        const int32_t p = pos0 + i;
        tok[i] = ids[i];
        pos[i] = p;
        slot[i] = s->blocks[p / d->block_size] * d->block_size + p % d->block_size;
    }
    const int32_t r = b->num_seqs;
    memcpy(d->bt + (size_t)r * (size_t)d->max_blocks_per_seq, s->blocks, sizeof *s->blocks * (size_t)s->num_blocks);
    d->lens[r] = pos0 + n;
    b->num_tokens += n;
    d->qsl[r + 1] = b->num_tokens;
    b->num_seqs++;
    if (want_logits) {
        d->lidx[b->num_logits] = b->num_tokens - 1;
        d->row_of[b->num_logits++] = row_tag;
    }
}

static void batch_begin(draft_proposer *d, osp_batch *b) {
    *b = (osp_batch){.token_ids = d->tok, .positions = d->pos, .slot_mapping = d->slot, .query_start_loc = d->qsl,
                     .seq_lens = d->lens, .block_table = d->bt, .max_blocks_per_seq = d->max_blocks_per_seq,
                     .logits_indices = d->lidx};
    d->qsl[0] = 0;
}

static osp_status grow_rows(draft_proposer *d, int32_t rows) {
    if (rows <= d->cap_rows) return OSP_OK;
    int32_t cap = d->cap_rows ? d->cap_rows : 8;
    while (cap < rows) cap *= 2;
    int32_t *qsl = realloc(d->qsl, sizeof *qsl * (size_t)(cap + 1));
    if (qsl) d->qsl = qsl;
    int32_t *lens = realloc(d->lens, sizeof *lens * (size_t)cap);
    if (lens) d->lens = lens;
    int32_t *bt = realloc(d->bt, sizeof *bt * (size_t)cap * (size_t)d->max_blocks_per_seq);
    if (bt) d->bt = bt;
    int32_t *lidx = realloc(d->lidx, sizeof *lidx * (size_t)cap);
    if (lidx) d->lidx = lidx;
    int32_t *row_of = realloc(d->row_of, sizeof *row_of * (size_t)cap);
    if (row_of) d->row_of = row_of;
    float *lg = realloc(d->logits, sizeof *lg * (size_t)cap * (size_t)d->n_vocab_model);
    if (lg) d->logits = lg;
    /* token arrays: a catch-up pass takes budget tokens, a drafting pass one a sequence */
    const size_t nt = (size_t)(cap > d->budget ? cap : d->budget);
    int32_t *tok = realloc(d->tok, sizeof *tok * nt);
    if (tok) d->tok = tok;
    int32_t *pos = realloc(d->pos, sizeof *pos * nt);
    if (pos) d->pos = pos;
    int32_t *slot = realloc(d->slot, sizeof *slot * nt);
    if (slot) d->slot = slot;
    if (!qsl || !lens || !bt || !lidx || !row_of || !lg || !tok || !pos || !slot)
        return osp_set_error(OSP_ERR_NOMEM, "draft model: out of memory");
    d->cap_rows = cap;
    return OSP_OK;
}

static osp_status draft_propose(osp_proposer *p, osp_spec_seq *seqs, int32_t n) {
    draft_proposer *d = (draft_proposer *)p;
    d->tick++;
    OSP_TRY(grow_rows(d, n));
    OSP_TRY(seqs_room(d, n));
    draft_seq **ds = calloc((size_t)(n ? n : 1), sizeof *ds); /* NULL until set: the error path skips them */
    if (!ds) return osp_set_error(OSP_ERR_NOMEM, "draft model: out of memory");
    osp_status st = OSP_OK;
    /* 1. find or make each sequence's state, cut its cache to the common prefix, reserve its blocks */
    for (int32_t i = 0; i < n; i++) {
        osp_spec_seq *q = &seqs[i];
        q->num_draft = 0;
        draft_seq *s = seq_find(d, q->uid);
        if (!s && !(s = seq_new(d, q->uid))) {
            st = osp_set_error(OSP_ERR_NOMEM, "draft model: out of memory");
            goto out;
        }
        ds[i] = s;
        s->q = q;
        s->last_used = d->tick;
        s->done = 0;
        int32_t lcp = 0;
        const int32_t lim = s->num_cached < q->num_tokens - 1 ? s->num_cached : q->num_tokens - 1;
        while (lcp < lim && s->ids[lcp] == q->tokens[lcp]) lcp++;
        s->num_cached = lcp; /* rollback: what follows (rejected drafts, another past) is overwritten */
        s->k = q->max_draft;
        if (q->num_tokens < 1 || q->num_tokens + s->k - 1 > d->max_pos) s->k = 0;
        /* the draft's embedding may have fewer rows than the target's (Qwen2.5-7B 152,064, 0.5B
           151,936, one tokenizer): a sequence holding an id past the draft's gets no drafts, never a
           failed step */
        for (int32_t t = lcp; t < q->num_tokens && s->k > 0; t++)
            if (q->tokens[t] < 0 || q->tokens[t] >= d->n_vocab_model) s->k = 0;
    }
    for (int32_t i = 0; i < n; i++) { /* blocks after every state is marked in use (no evicting each other) */
        draft_seq *s = ds[i];
        if (s->k > 0 && !seq_reserve(d, s, s->q->num_tokens + s->k - 1)) s->k = 0;
        if (s->k > 0 && (st = ids_reserve(s, s->q->num_tokens + s->k)) != OSP_OK) goto out;
    }
    /* 2. catch up: tokens [num_cached, num_tokens) of each sequence, in passes of at most budget tokens;
     *    the pass holding a sequence's last token gives its first draft */
    for (;;) {
        osp_batch b;
        batch_begin(d, &b);
        for (int32_t i = 0; i < n && b.num_tokens < d->budget; i++) {
            draft_seq *s = ds[i];
            if (s->k <= 0) continue;
            const int32_t from = s->num_cached + s->done, left = s->q->num_tokens - from;
            if (left <= 0) continue;
            const int32_t take = left < d->budget - b.num_tokens ? left : d->budget - b.num_tokens;
            add_row(d, &b, s, s->q->tokens + from, take, from, take == left, i);
            s->done += take;
        }
        if (b.num_tokens == 0) break;
        if ((st = osp_model_forward(d->model, d->kv, &b, d->logits)) != OSP_OK) goto out;
        for (int32_t l = 0; l < b.num_logits; l++) {
            osp_spec_seq *q = seqs + d->row_of[l];
            q->draft[0] = osp_spec_argmax(d->logits + (size_t)l * (size_t)d->n_vocab_model, d->n_vocab);
            q->num_draft = 1;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        draft_seq *s = ds[i];
        if (s->k <= 0) continue;
        memcpy(s->ids + s->num_cached, s->q->tokens + s->num_cached, sizeof *s->ids * (size_t)(s->q->num_tokens - s->num_cached));
        s->num_cached = s->q->num_tokens;
    }
    /* 3. drafts 2..k: one pass of one token a sequence each */
    for (int32_t j = 1;; j++) {
        osp_batch b;
        batch_begin(d, &b);
        for (int32_t i = 0; i < n; i++) {
            draft_seq *s = ds[i];
            if (s->k <= j || s->q->num_draft != j) continue;
            const int32_t prev = s->q->draft[j - 1];
            add_row(d, &b, s, &prev, 1, s->q->num_tokens + j - 1, true, i);
            s->ids[s->num_cached++] = prev;
        }
        if (b.num_tokens == 0) break;
        if ((st = osp_model_forward(d->model, d->kv, &b, d->logits)) != OSP_OK) goto out;
        for (int32_t l = 0; l < b.num_logits; l++) {
            osp_spec_seq *q = seqs + d->row_of[l];
            q->draft[q->num_draft++] = osp_spec_argmax(d->logits + (size_t)l * (size_t)d->n_vocab_model, d->n_vocab);
        }
    }
out:
    for (int32_t i = 0; i < n; i++)
        if (ds[i]) {
            if (st != OSP_OK) ds[i]->num_cached = 0; /* whatever a failed pass left is not trusted */
            ds[i]->q = NULL;
        }
    if (st != OSP_OK)
        for (int32_t i = 0; i < n; i++) seqs[i].num_draft = 0;
    free(ds);
    return st;
}

static void draft_release(osp_proposer *p, uint64_t uid) {
    draft_proposer *d = (draft_proposer *)p;
    draft_seq *s = seq_find(d, uid);
    if (s) seq_drop(d, s);
}

static void draft_destroy(osp_proposer *p) {
    draft_proposer *d = (draft_proposer *)p;
    if (!d) return;
    for (int32_t i = 0; i < d->num_seqs; i++)
        if (d->seqs[i].live) seq_drop(d, &d->seqs[i]);
    free(d->seqs);
    free(d->free_blocks);
    free(d->tok), free(d->pos), free(d->slot), free(d->qsl), free(d->lens), free(d->bt), free(d->lidx);
    free(d->row_of), free(d->logits);
    osp_kv_cache_free(d->kv);
    osp_model_free(d->model);
    free(d);
}

static const osp_proposer_ops draft_ops = {.name = "draft_model", .propose = draft_propose, .release = draft_release,
                                           .destroy = draft_destroy};

/* The draft's tokenizer must be the target's: the same number of tokens, each with the same text. */
static osp_status same_vocab(const osp_model *target, const osp_model *draft, const char *path) {
    const osp_gguf *gt = osp_model_gguf(target), *gd = osp_model_gguf(draft);
    if (!gt || !gd)
        return osp_set_error(OSP_ERR_INVALID_ARG, "draft model %s: the target or the draft has no tokenizer to compare",
                             path);
    osp_tokenizer *tt = NULL, *td = NULL;
    osp_status s = osp_tokenizer_load(gt, &tt);
    if (s == OSP_OK) s = osp_tokenizer_load(gd, &td);
    if (s == OSP_OK) {
        const int32_t nt = osp_tokenizer_n_vocab(tt), nd = osp_tokenizer_n_vocab(td);
        if (nt != nd) {
            s = osp_set_error(OSP_ERR_INVALID_ARG, "draft model %s: its vocabulary has %d tokens, the target's %d (the "
                                                   "draft must share the target's tokenizer)", path, nd, nt);
        } else {
            for (int32_t i = 0; i < nt; i++) {
                const char *a = osp_tokenizer_token_text(tt, i), *b = osp_tokenizer_token_text(td, i);
                if (strcmp(a ? a : "", b ? b : "")) {
                    s = osp_set_error(OSP_ERR_INVALID_ARG, "draft model %s: token %d is \"%.40s\" in the draft and "
                                                           "\"%.40s\" in the target (the draft must share the target's "
                                                           "tokenizer)", path, i, b ? b : "", a ? a : "");
                    break;
                }
            }
        }
    }
    osp_tokenizer_free(tt);
    osp_tokenizer_free(td);
    return s;
}

osp_status osp_draft_proposer_create(const osp_spec_config *c, const osp_proposer_target *t, osp_proposer **out) {
    *out = NULL;
    if (!t || !t->model || t->block_size < 1 || t->num_blocks < 1 || t->max_model_len < 2 || t->max_num_batched_tokens < 1)
        return osp_set_error(OSP_ERR_INVALID_ARG, "draft model: bad target sizes");
    draft_proposer *d = calloc(1, sizeof *d);
    if (!d) return osp_set_error(OSP_ERR_NOMEM, "draft model: out of memory");
    d->base.ops = &draft_ops;
    osp_model_params mp = osp_model_default_params();
    mp.device = osp_model_device(t->model);
    mp.n_threads = t->n_threads;
    mp.exact = t->exact; /* the target's arithmetic: a model drafting for itself then agrees always */
    mp.cpu_activations = t->cpu_activations;
    mp.no_mmap = t->no_mmap; /* the same bits either way; with q8 on AVX512-VNNI the strips' faster GEMV */
    osp_status s = osp_model_load(c->model, &mp, &d->model);
    if (s != OSP_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", osp_last_error());
        s = osp_set_error(s, "draft model: %s", msg);
        goto fail;
    }
    if ((s = same_vocab(t->model, d->model, c->model)) != OSP_OK) goto fail;
    const osp_model_config *tc = osp_model_config_get(t->model), *dc = osp_model_config_get(d->model);
    d->n_vocab_model = dc->n_vocab;
    d->n_vocab = dc->n_vocab < tc->n_vocab ? dc->n_vocab : tc->n_vocab;
    d->block_size = t->block_size;
    /* a sequence holds max_model_len tokens; drafting writes k - 1 past its last one */
    d->max_pos = t->max_model_len + OSP_SPEC_MAX_TOKENS;
    if (d->max_pos > dc->n_ctx_train) d->max_pos = dc->n_ctx_train; /* no drafts past the draft's context */
    d->max_blocks_per_seq = (d->max_pos + d->block_size - 1) / d->block_size;
    d->budget = t->max_num_batched_tokens;
    if ((s = osp_kv_cache_create(d->model, t->num_blocks, t->block_size, t->kv_dtype, &d->kv)) != OSP_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", osp_last_error());
        s = osp_set_error(s, "draft model: KV cache: %s", msg);
        goto fail;
    }
    d->free_blocks = malloc(sizeof *d->free_blocks * (size_t)t->num_blocks);
    if (!d->free_blocks) {
        s = osp_set_error(OSP_ERR_NOMEM, "draft model: out of memory");
        goto fail;
    }
    for (int32_t i = 0; i < t->num_blocks; i++) d->free_blocks[i] = t->num_blocks - 1 - i;
    d->num_free = t->num_blocks;
    if ((s = grow_rows(d, 8)) != OSP_OK) goto fail;
    *out = &d->base;
    return OSP_OK;
fail:
    draft_destroy(&d->base);
    return s;
}
