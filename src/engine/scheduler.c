/* The token-budget scheduler (see scheduler.h), after vLLM V1's Scheduler.schedule(): running
 * requests first, then waiting ones; blocks from the pool with prefix-cache hits taken on admission;
 * preemption by recompute. Queues are plain arrays of request pointers (a few hundred at most): the
 * running list in admission order, the waiting list in service order (FCFS: preempted requests go to
 * the front; PRIORITY: sorted by (priority, arrival)). */
#include "engine/scheduler.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

struct osp_scheduler {
    osp_scheduler_config cfg;
    int32_t *eos;               /* [cfg.num_eos] */
    osp_block_pool *pool;
    osp_request **running;      /* [max_num_seqs] */
    int32_t num_running;
    osp_request **waiting;      /* [cap_waiting] */
    int32_t num_waiting, cap_waiting;
    osp_sched_output out;
    int32_t cap_entries;
    uint64_t *removed;          /* ids removed since the last schedule() */
    int32_t num_removed, cap_removed;
    int32_t *hit_ids;           /* [max blocks per request] scratch for prefix hits */
    int32_t cap_hits;
    int32_t num_reserved;       /* seats of not yet forked children of running requests */
    osp_sched_tier tier;        /* tiered offload; tier.start NULL: none */
    int32_t *tier_ids;          /* [cap_hits] scratch for tier loads */
    struct tier_pending {       /* background loads: the request, its hit and load blocks held meanwhile */
        osp_request *r;
        uint64_t token;
        int32_t n_hits, n_load;
        int32_t *ids;           /* [n_hits + n_load] */
    } *pend;
    int32_t n_pend, cap_pend;
    osp_scheduler_stats stats;
};

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

osp_status osp_scheduler_create(const osp_scheduler_config *cfg, osp_scheduler **out) {
    *out = NULL;
    if (cfg->max_num_seqs <= 0 || cfg->max_num_batched_tokens <= 0 || cfg->max_model_len <= 1 ||
        cfg->block_size <= 0 || cfg->num_blocks <= 0 || cfg->num_eos < 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "scheduler: max_num_seqs, max_num_batched_tokens, block_size and "
                                                  "num_blocks must be > 0 and max_model_len > 1");
    osp_scheduler *s = calloc(1, sizeof *s);
    if (!s) return osp_set_error(OSP_ERR_NOMEM, "scheduler: out of memory");
    s->cfg = *cfg;
    s->cap_waiting = 64;
    s->cap_entries = cfg->max_num_seqs;
    s->cap_removed = 64;
    s->cap_hits = cdiv(cfg->max_model_len, cfg->block_size) + 1;
    s->eos = malloc(sizeof *s->eos * (size_t)(cfg->num_eos + 1));
    s->running = malloc(sizeof *s->running * (size_t)cfg->max_num_seqs);
    s->waiting = malloc(sizeof *s->waiting * (size_t)s->cap_waiting);
    s->out.entries = malloc(sizeof *s->out.entries * (size_t)s->cap_entries);
    s->removed = malloc(sizeof *s->removed * (size_t)s->cap_removed);
    s->out.removed_ids = malloc(sizeof *s->removed * (size_t)s->cap_removed);
    s->hit_ids = malloc(sizeof *s->hit_ids * (size_t)s->cap_hits);
    s->tier_ids = malloc(sizeof *s->tier_ids * (size_t)s->cap_hits);
    s->out.touched = malloc(sizeof *s->out.touched * (size_t)cfg->max_num_seqs);
    s->out.copy_src = malloc(sizeof(int32_t) * (size_t)cfg->max_num_seqs);
    s->out.copy_dst = malloc(sizeof(int32_t) * (size_t)cfg->max_num_seqs);
    if (s->cfg.max_prompt_logprob_tokens <= 0 || s->cfg.max_prompt_logprob_tokens > OSP_MAX_PROMPT_LP_PER_STEP)
        s->cfg.max_prompt_logprob_tokens = OSP_MAX_PROMPT_LP_PER_STEP;
    osp_status st = OSP_OK;
    if (!s->eos || !s->running || !s->waiting || !s->out.entries || !s->removed || !s->out.removed_ids || !s->hit_ids || !s->tier_ids ||
        !s->out.touched || !s->out.copy_src || !s->out.copy_dst)
        st = osp_set_error(OSP_ERR_NOMEM, "scheduler: out of memory");
    else st = osp_block_pool_create(cfg->num_blocks, cfg->enable_prefix_caching, &s->pool);
    if (st != OSP_OK) {
        osp_scheduler_destroy(s);
        return st;
    }
    if (cfg->num_eos) memcpy(s->eos, cfg->eos_ids, sizeof *s->eos * (size_t)cfg->num_eos);
    s->cfg.eos_ids = s->eos;
    *out = s;
    return OSP_OK;
}

void osp_scheduler_destroy(osp_scheduler *s) {
    if (!s) return;
    osp_block_pool_destroy(s->pool);
    free(s->eos);
    free(s->running);
    free(s->waiting);
    free(s->out.entries);
    free(s->removed);
    free(s->out.removed_ids);
    free(s->hit_ids);
    free(s->tier_ids);
    for (int32_t i = 0; i < s->n_pend; i++) {
        if (s->tier.cancel) s->tier.cancel(s->tier.ctx, s->pend[i].token);
        free(s->pend[i].ids);
    }
    free(s->pend);
    free(s->out.touched);
    free(s->out.copy_src);
    free(s->out.copy_dst);
    free(s);
}

osp_block_pool *osp_scheduler_pool(osp_scheduler *s) { return s->pool; }

void osp_scheduler_set_tier(osp_scheduler *s, const osp_sched_tier *t) {
    s->tier = t ? *t : (osp_sched_tier){0};
}

osp_status osp_scheduler_admissible(const osp_scheduler *s, const osp_request *r) {
    if (r->max_len > s->cfg.max_model_len)
        return osp_set_error(OSP_ERR_INVALID_ARG, "request %llu: %d tokens exceed max_model_len %d",
                             (unsigned long long)r->id, r->max_len, s->cfg.max_model_len);
    /* the last token is never computed, so a request needs KV for at most max_len - 1 tokens; an
       embedding request computes all of its max_len (= prompt) tokens */
    const int32_t need = cdiv(r->pooling != OSP_POOLING_NONE ? r->max_len : r->max_len - 1, s->cfg.block_size);
    if (need > osp_block_pool_num_blocks(s->pool))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "request %llu: up to %d tokens need %d KV blocks, the cache has only %d",
                             (unsigned long long)r->id, r->max_len, need, osp_block_pool_num_blocks(s->pool));
    return OSP_OK;
}

/* ---- queues ---------------------------------------------------------------------------------- */

static bool before(const osp_scheduler *s, const osp_request *a, const osp_request *b) {
    if (s->cfg.policy == OSP_SCHED_PRIORITY && a->priority != b->priority) return a->priority < b->priority;
    return a->arrival < b->arrival;
}

static osp_status waiting_insert(osp_scheduler *s, osp_request *r, bool front) {
    if (s->num_waiting == s->cap_waiting) {
        osp_request **w = realloc(s->waiting, sizeof *w * (size_t)s->cap_waiting * 2);
        if (!w) return osp_set_error(OSP_ERR_NOMEM, "scheduler: out of memory");
        s->waiting = w;
        s->cap_waiting *= 2;
    }
    int32_t at = s->num_waiting;
    if (s->cfg.policy == OSP_SCHED_PRIORITY) {
        at = 0;
        while (at < s->num_waiting && !before(s, r, s->waiting[at])) at++;
    } else if (front) {
        at = 0;
    }
    memmove(s->waiting + at + 1, s->waiting + at, sizeof *s->waiting * (size_t)(s->num_waiting - at));
    s->waiting[at] = r;
    s->num_waiting++;
    return OSP_OK;
}

static void list_remove(osp_request **list, int32_t *n, const osp_request *r) {
    for (int32_t i = 0; i < *n; i++)
        if (list[i] == r) {
            memmove(list + i, list + i + 1, sizeof *list * (size_t)(*n - i - 1));
            (*n)--;
            return;
        }
}

static void note_removed(osp_scheduler *s, uint64_t id) {
    if (s->num_removed == s->cap_removed) {
        uint64_t *a = realloc(s->removed, sizeof *a * (size_t)s->cap_removed * 2);
        uint64_t *b = realloc(s->out.removed_ids, sizeof *b * (size_t)s->cap_removed * 2);
        if (a) s->removed = a;
        if (b) s->out.removed_ids = b;
        if (!a || !b) return; /* cannot happen in practice; the runner then keeps a stale row until reuse */
        s->cap_removed *= 2;
    }
    s->removed[s->num_removed++] = id;
}

/* Releases all of r's blocks, last first (its tail is evicted before its possibly shared prefix). */
static void free_blocks(osp_scheduler *s, osp_request *r) {
    for (int32_t i = r->num_blocks - 1; i >= 0; i--) osp_block_pool_release(s->pool, &r->block_ids[i], 1);
    r->num_blocks = 0;
    r->num_cached_blocks = 0;
}

static void tier_forget(osp_scheduler *s, const osp_request *r);

osp_status osp_scheduler_add(osp_scheduler *s, osp_request *r) {
    r->state = OSP_REQ_WAITING;
    return waiting_insert(s, r, false);
}

static void touch_req(osp_scheduler *s, osp_request *r) {
    if (s->out.num_touched < s->cfg.max_num_seqs) s->out.touched[s->out.num_touched++] = r;
}

/* A parent finishing before its fork takes its children along. */
static void drop_children(osp_scheduler *s, osp_request *r, osp_finish_reason reason) {
    if (!r->children) return;
    if (r->state == OSP_REQ_RUNNING) s->num_reserved -= r->num_children;
    for (int32_t k = 0; k < r->num_children; k++) {
        osp_request *c = r->children[k];
        if (c->state == OSP_REQ_FINISHED) continue;
        c->state = OSP_REQ_FINISHED;
        c->finish_reason = reason;
        memcpy(c->error, r->error, sizeof c->error);
        touch_req(s, c);
    }
    free(r->children);
    r->children = NULL;
    r->num_children = 0;
}

void osp_scheduler_finish(osp_scheduler *s, osp_request *r, osp_finish_reason reason) {
    if (r->state == OSP_REQ_FINISHED) return;
    drop_children(s, r, reason);
    if (r->state == OSP_REQ_RUNNING) {
        list_remove(s->running, &s->num_running, r);
        note_removed(s, r->uid);
    } else {
        list_remove(s->waiting, &s->num_waiting, r);
        if (r->tier_loading) tier_forget(s, r);
    }
    free_blocks(s, r);
    r->state = OSP_REQ_FINISHED;
    r->finish_reason = reason;
}

/* ---- block allocation ------------------------------------------------------------------------ */

/* Gives r the blocks for num_computed + n_hits blocks of hits + n_new tokens: the hit blocks (touched)
 * then fresh ones; offers newly full blocks to the prefix cache. All or nothing. */
static bool allocate_slots(osp_scheduler *s, osp_request *r, const int32_t *hits, int32_t n_hits, int32_t n_new) {
    const int32_t bs = s->cfg.block_size;
    const int32_t total = r->num_computed_tokens + n_hits * bs + n_new;
    const int32_t need = cdiv(total, bs) - r->num_blocks - n_hits;
    int32_t evictable = 0;
    for (int32_t i = 0; i < n_hits; i++) evictable += osp_block_pool_ref_count(s->pool, hits[i]) == 0;
    if (need > osp_block_pool_num_free(s->pool) - evictable) return false;
    if (n_hits > 0) {
        osp_block_pool_touch(s->pool, hits, n_hits);
        memcpy(r->block_ids + r->num_blocks, hits, sizeof *hits * (size_t)n_hits);
        r->num_blocks += n_hits;
    }
    if (need > 0) {
        osp_block_pool_alloc(s->pool, need, r->block_ids + r->num_blocks); /* cannot fail: checked above */
        r->num_blocks += need;
    }
    if (s->cfg.enable_prefix_caching) {
        osp_request_update_hashes(r, &s->cfg.hasher, bs);
        /* only blocks of real tokens: draft slots (past r->num_tokens) have no hash yet */
        const int32_t full = total / bs < r->num_hashes ? total / bs : r->num_hashes;
        for (int32_t b = r->num_cached_blocks; b < full; b++)
            osp_block_pool_cache_block(s->pool, r->block_ids[b], &r->hashes[b], b ? &r->hashes[b - 1] : NULL,
                                       r->tokens + (size_t)b * bs, bs);
        if (full > r->num_cached_blocks) r->num_cached_blocks = full;
    }
    return true;
}

static osp_status preempt(osp_scheduler *s, osp_request *r) {
    /* blocks this step cached for tokens it was about to compute hold no such KV: forget their hashes
       (else a later prefix hit, or a tier, would take whatever the pages hold) */
    for (int32_t b = r->num_computed_tokens / s->cfg.block_size; b < r->num_blocks; b++)
        if (osp_block_pool_ref_count(s->pool, r->block_ids[b]) == 1) osp_block_pool_uncache(s->pool, r->block_ids[b]);
    list_remove(s->running, &s->num_running, r);
    if (r->children) s->num_reserved -= r->num_children;
    note_removed(s, r->uid);
    free_blocks(s, r);
    r->num_computed_tokens = 0;
    r->num_spec = 0;
    r->state = OSP_REQ_PREEMPTED;
    r->num_preemptions++;
    s->stats.num_preemptions++;
    return waiting_insert(s, r, true);
}

/* ---- tiers below the pool --------------------------------------------------------------------- */

/* Releases a pending load's blocks (loads first, tail first, then the hits) and forgets the entry. */
static void pend_drop(osp_scheduler *s, int32_t k) {
    struct tier_pending *p = &s->pend[k];
    for (int32_t i = p->n_hits + p->n_load - 1; i >= 0; i--) osp_block_pool_release(s->pool, &p->ids[i], 1);
    p->r->tier_loading = false;
    free(p->ids);
    s->pend[k] = s->pend[--s->n_pend];
}

/* Caches the first n_ok of a load's blocks (block indices first..) under r's hashes. */
static void cache_loaded(osp_scheduler *s, osp_request *r, const int32_t *ids, int32_t first, int32_t n_ok) {
    const int32_t bs = s->cfg.block_size;
    for (int32_t i = 0; i < n_ok; i++) {
        const int32_t b = first + i;
        osp_block_pool_cache_block(s->pool, ids[i], &r->hashes[b], b ? &r->hashes[b - 1] : NULL,
                                   r->tokens + (size_t)b * bs, bs);
    }
    s->stats.tier_hits_tokens += (int64_t)n_ok * bs;
}

/* Background loads that finished: their blocks cached (those that loaded) and freed for the prefix match. */
static void tier_collect(osp_scheduler *s) {
    uint64_t token;
    int32_t n_ok;
    while (s->tier.poll(s->tier.ctx, &token, &n_ok)) {
        for (int32_t k = 0; k < s->n_pend; k++) {
            struct tier_pending *p = &s->pend[k];
            if (p->token != token) continue;
            cache_loaded(s, p->r, p->ids + p->n_hits, p->n_hits, n_ok < p->n_load ? n_ok : p->n_load);
            pend_drop(s, k);
            break;
        }
    }
}

/* A waiting request leaves (finished or aborted) while its blocks load: the load is cancelled. */
static void tier_forget(osp_scheduler *s, const osp_request *r) {
    for (int32_t k = 0; k < s->n_pend; k++)
        if (s->pend[k].r == r) {
            s->tier.cancel(s->tier.ctx, s->pend[k].token);
            pend_drop(s, k);
            return;
        }
}

/* r's prefix continues past its n_hits pool hits (in s->hit_ids) into blocks the tier holds: loads what
 * the cost model allows into free pool blocks. Returns the new hit count (s->hit_ids refilled), or -1
 * when the load goes on in the background (r waits; its blocks are held in s->pend). */
static int32_t tier_fill(osp_scheduler *s, osp_request *r, int32_t n_hits, int32_t max_hit) {
    int32_t n = 0;
    while (n_hits + n < max_hit && s->tier.contains(s->tier.ctx, r, n_hits + n, &r->hashes[n_hits + n])) n++;
    if (n == 0) return n_hits;
    const int32_t bs = s->cfg.block_size;
    if (!s->tier.worth(s->tier.ctx, r, n)) {
        s->stats.tier_skipped_tokens += (int64_t)n * bs;
        return n_hits;
    }
    /* the hits are free cached blocks too: hold them so the allocation cannot evict them */
    osp_block_pool_touch(s->pool, s->hit_ids, n_hits);
    const int32_t room = osp_block_pool_num_free(s->pool);
    if (n > room) n = room;
    uint64_t token = 0;
    int32_t took = 0, n_ok = 0;
    if (n > 0 && osp_block_pool_alloc(s->pool, n, s->tier_ids) == OSP_OK) {
        took = s->tier.start(s->tier.ctx, r, s->tier_ids, r->hashes + n_hits, n_hits, n, &token, &n_ok);
        if (took < 0) took = 0;
        for (int32_t i = n - 1; i >= took; i--) osp_block_pool_release(s->pool, &s->tier_ids[i], 1);
    }
    if (token != 0 && took > 0) {
        if (s->n_pend == s->cap_pend) {
            const int32_t cap = s->cap_pend ? 2 * s->cap_pend : 8;
            struct tier_pending *pp = realloc(s->pend, sizeof *pp * (size_t)cap);
            if (pp) s->pend = pp, s->cap_pend = cap;
        }
        int32_t *ids = s->n_pend < s->cap_pend ? malloc(sizeof *ids * (size_t)(n_hits + took)) : NULL;
        if (ids) {
            memcpy(ids, s->hit_ids, sizeof *ids * (size_t)n_hits);
            memcpy(ids + n_hits, s->tier_ids, sizeof *ids * (size_t)took);
            s->pend[s->n_pend++] = (struct tier_pending){.r = r, .token = token, .n_hits = n_hits, .n_load = took, .ids = ids};
            r->tier_loading = true;
            return -1;
        }
        s->tier.cancel(s->tier.ctx, token); /* out of memory: recompute instead */
        n_ok = 0;
    }
    cache_loaded(s, r, s->tier_ids, n_hits, n_ok < took ? n_ok : took);
    for (int32_t i = took - 1; i >= 0; i--) osp_block_pool_release(s->pool, &s->tier_ids[i], 1); /* tail first */
    for (int32_t i = n_hits - 1; i >= 0; i--) osp_block_pool_release(s->pool, &s->hit_ids[i], 1);
    if (n_ok == 0) return n_hits;
    return osp_prefix_cache_match(s->pool, r->hashes, max_hit, s->hit_ids);
}

/* ---- schedule / update ----------------------------------------------------------------------- */

static bool wants_prompt_lp(const osp_request *r) {
    return r->prompt_logprobs >= 0 && r->num_prompt_lp < r->num_prompt - 1;
}

/* Caps a chunk [c0, c0 + n) of r so that at most *budget prompt positions needing logprobs are in it
 * (positions [num_prompt_lp, num_prompt - 1)); consumes the budget. */
static int32_t cap_prompt_lp(const osp_request *r, int32_t c0, int32_t n, int32_t *budget) {
    if (!wants_prompt_lp(r)) return n;
    const int32_t lo = c0 > r->num_prompt_lp ? c0 : r->num_prompt_lp, hi_all = r->num_prompt - 1;
    if (c0 + n > lo + *budget) n = lo + *budget - c0;
    if (n < 0) n = 0;
    int32_t hi = c0 + n < hi_all ? c0 + n : hi_all;
    if (hi > lo) *budget -= hi - lo;
    return n;
}

osp_status osp_scheduler_schedule(osp_scheduler *s, osp_sched_output **outp) {
    osp_sched_output *out = &s->out;
    out->num_entries = 0;
    out->total_tokens = 0;
    int32_t budget = s->cfg.max_num_batched_tokens;
    int32_t lp_budget = s->cfg.max_prompt_logprob_tokens;
    bool preempted_any = false;
    out->num_touched = 0;
    out->num_copies = 0;
    if (s->tier.poll) tier_collect(s); /* also frees the buffers of cancelled loads */

    /* running requests, in admission order */
    int32_t i = 0;
    while (i < s->num_running && budget > 0) {
        osp_request *r = s->running[i];
        int32_t n_new = r->num_tokens - r->num_computed_tokens;
        if (n_new > budget) n_new = budget;
        int32_t lp_left = lp_budget;
        n_new = cap_prompt_lp(r, r->num_computed_tokens, n_new, &lp_left);
        if (n_new <= 0) {
            i++;
            continue;
        }
        /* a decode with drafts: 1 + n_spec tokens, within the budget and leaving room under max_len for
           the target's token after the last draft */
        int32_t n_spec = n_new == 1 ? r->num_spec : 0;
        if (n_spec > budget - 1) n_spec = budget - 1;
        if (n_spec > r->max_len - r->num_tokens - 1) n_spec = r->max_len - r->num_tokens - 1;
        if (n_spec < 0) n_spec = 0;
        if (n_spec > 0 && !allocate_slots(s, r, NULL, 0, 1 + n_spec)) n_spec = 0; /* no room: plain decode */
        if (n_spec > 0) n_new += n_spec;
        bool self_preempted = false;
        while (n_spec == 0 && !allocate_slots(s, r, NULL, 0, n_new)) {
            /* victim: the latest-arrived (lowest-priority) running request */
            int32_t v = 0;
            for (int32_t j = 1; j < s->num_running; j++)
                if (before(s, s->running[v], s->running[j])) v = j;
            osp_request *victim = s->running[v];
            for (int32_t e = 0; e < out->num_entries; e++)
                if (out->entries[e].req == victim) { /* already scheduled this step: give its tokens back */
                    budget += out->entries[e].num_scheduled_tokens;
                    out->total_tokens -= out->entries[e].num_scheduled_tokens;
                    memmove(out->entries + e, out->entries + e + 1, sizeof *out->entries * (size_t)(out->num_entries - e - 1));
                    out->num_entries--;
                    break;
                }
            if (v < i) i--;
            OSP_TRY(preempt(s, victim));
            preempted_any = true;
            if (victim == r) {
                self_preempted = true;
                break;
            }
        }
        if (self_preempted) break;
        lp_budget = lp_left;
        out->entries[out->num_entries++] = (osp_sched_entry){.req = r, .num_scheduled_tokens = n_new,
                                                             .is_new = r->needs_row, .sampled = -1, .num_spec = n_spec};
        r->needs_row = false;
        out->total_tokens += n_new;
        budget -= n_new;
        i++;
    }

    /* waiting requests, in service order; none in a step that had to preempt. One whose prefix blocks
       load in the background is passed over until they are in. */
    int32_t w = 0;
    while (!preempted_any && w < s->num_waiting && budget > 0 && s->num_running < s->cfg.max_num_seqs) {
        osp_request *r = s->waiting[w];
        if (r->tier_loading) {
            w++;
            continue;
        }
        const int32_t seats = 1 + (r->children ? r->num_children : 0);
        if (s->num_running + s->num_reserved + seats > s->cfg.max_num_seqs) break;
        int32_t n_hits = 0;
        /* an embedding request pools every token's hidden state: nothing may come from the cache */
        if (s->cfg.enable_prefix_caching && r->num_computed_tokens == 0 && !wants_prompt_lp(r) &&
            r->pooling == OSP_POOLING_NONE) {
            osp_request_update_hashes(r, &s->cfg.hasher, s->cfg.block_size);
            int32_t max_hit = (r->num_tokens - 1) / s->cfg.block_size; /* always compute the last token */
            if (max_hit > r->num_hashes) max_hit = r->num_hashes;
            n_hits = osp_prefix_cache_match(s->pool, r->hashes, max_hit, s->hit_ids);
            if (s->tier.start && n_hits < max_hit && (n_hits = tier_fill(s, r, n_hits, max_hit)) < 0) {
                w++; /* loading: the next one may go first */
                continue;
            }
        }
        const int32_t computed = n_hits * s->cfg.block_size;
        int32_t n_new = r->num_tokens - computed;
        if (n_new > budget) n_new = budget;
        int32_t lp_left = lp_budget;
        n_new = cap_prompt_lp(r, computed, n_new, &lp_left);
        if (n_new <= 0 || !allocate_slots(s, r, s->hit_ids, n_hits, n_new)) break;
        lp_budget = lp_left;
        s->num_reserved += seats - 1;
        r->needs_row = false;
        r->num_spec = 0;
        r->num_computed_tokens = computed;
        if (s->cfg.enable_prefix_caching) {
            s->stats.prefix_queries_tokens += r->num_tokens;
            s->stats.prefix_hits_tokens += computed;
        }
        if (r->num_cached_tokens < 0) r->num_cached_tokens = computed;
        memmove(s->waiting + w, s->waiting + w + 1, sizeof *s->waiting * (size_t)(s->num_waiting - w - 1));
        s->num_waiting--;
        s->running[s->num_running++] = r;
        r->state = OSP_REQ_RUNNING;
        out->entries[out->num_entries++] =
            (osp_sched_entry){.req = r, .num_scheduled_tokens = n_new, .is_new = true, .sampled = -1};
        out->total_tokens += n_new;
        budget -= n_new;
    }

    memcpy(out->removed_ids, s->removed, sizeof *s->removed * (size_t)s->num_removed);
    out->num_removed = s->num_removed;
    s->num_removed = 0;
    *outp = out;
    return OSP_OK;
}

static bool is_stop(const osp_scheduler *s, const osp_request *r, int32_t tok) {
    if (!r->ignore_eos)
        for (int32_t i = 0; i < s->cfg.num_eos; i++)
            if (s->eos[i] == tok) return true;
    for (int32_t i = 0; i < r->num_stop_ids; i++)
        if (r->stop_ids[i] == tok) return true;
    return false;
}

/* Appends `tok` to r and returns why r finishes now (OSP_FINISH_NONE: it goes on). */
static osp_finish_reason append(const osp_scheduler *s, osp_request *r, int32_t tok) {
    if (tok == OSP_SAMPLED_ERROR) return OSP_FINISH_ERROR;
    r->tokens[r->num_tokens++] = tok;
    if (r->num_tokens >= r->max_len) return OSP_FINISH_LENGTH;
    if (osp_request_num_output(r) >= r->min_tokens && is_stop(s, r, tok)) return OSP_FINISH_STOP;
    return OSP_FINISH_NONE;
}

/* r's prompt is computed and its first token appended: the children take their first tokens and
 * r's blocks. */
static void fork_children(osp_scheduler *s, osp_request *r) {
    const int32_t bs = s->cfg.block_size;
    s->num_reserved -= r->num_children;
    for (int32_t k = 0; k < r->num_children; k++) {
        osp_request *c = r->children[k];
        if (c->state == OSP_REQ_FINISHED) continue; /* aborted meanwhile */
        touch_req(s, c);
        c->arrival = r->arrival;
        c->num_cached_tokens = r->num_cached_tokens;
        const osp_finish_reason why = append(s, c, c->fork_token);
        if (why != OSP_FINISH_NONE) {
            c->state = OSP_REQ_FINISHED;
            c->finish_reason = why;
            continue;
        }
        int32_t src, dst;
        if (osp_block_pool_fork(s->pool, r->block_ids, r->num_blocks, r->num_computed_tokens, bs, c->block_ids, &src,
                                &dst) != OSP_OK) {
            c->state = OSP_REQ_PREEMPTED; /* no block for the copy: recompute it later */
            if (waiting_insert(s, c, true) != OSP_OK) c->state = OSP_REQ_FINISHED, c->finish_reason = OSP_FINISH_ERROR;
            continue;
        }
        c->num_blocks = r->num_blocks;
        c->num_computed_tokens = r->num_computed_tokens;
        memcpy(c->hashes, r->hashes, sizeof *c->hashes * (size_t)r->num_hashes);
        c->num_hashes = r->num_hashes;
        c->num_cached_blocks = r->num_cached_blocks;
        c->state = OSP_REQ_RUNNING;
        c->needs_row = true;
        s->running[s->num_running++] = c;
        if (src >= 0) {
            s->out.copy_src[s->out.num_copies] = src;
            s->out.copy_dst[s->out.num_copies++] = dst;
        }
    }
    free(r->children);
    r->children = NULL;
    r->num_children = 0;
}

/* A verification row's outcome: the accepted drafts then the target's token, each appended and
 * checked for stops in turn (a stop cuts the rest, as plain decoding would have stopped there); the
 * rejected drafts' slots are dropped from num_computed_tokens and blocks holding only them go back to
 * the pool (never cached: they were past r->num_tokens, so no hash covered them). */
static osp_finish_reason apply_verified(osp_scheduler *s, osp_sched_entry *en) {
    osp_request *r = en->req;
    const int32_t a = en->num_accepted < 0 ? 0 : en->num_accepted > en->num_spec ? en->num_spec : en->num_accepted;
    const int32_t n0 = r->num_tokens;
    r->num_computed_tokens += en->num_scheduled_tokens - (en->num_spec - a);
    s->stats.spec_num_drafts++;
    s->stats.spec_num_draft_tokens += en->num_spec;
    s->stats.spec_num_accepted_tokens += a;
    for (int32_t i = 0; i < a; i++) s->stats.spec_accepted_per_pos[i]++;
    osp_finish_reason why = OSP_FINISH_NONE;
    for (int32_t i = 0; i < a && why == OSP_FINISH_NONE; i++) why = append(s, r, r->spec_tokens[i]);
    if (why == OSP_FINISH_NONE) why = append(s, r, en->sampled);
    r->num_spec = 0;
    en->num_new_tokens = r->num_tokens - n0;
    /* cannot fail: the kept blocks are this request's own past its shared prefix (a partial last block
       of a fork was copied on write) */
    if (why == OSP_FINISH_NONE &&
        osp_block_pool_free_tail(s->pool, r->block_ids, &r->num_blocks, r->num_computed_tokens, s->cfg.block_size) != OSP_OK)
        why = OSP_FINISH_ERROR, snprintf(r->error, sizeof r->error, "speculative rollback: %s", osp_last_error());
    if (r->num_cached_blocks > r->num_blocks) r->num_cached_blocks = r->num_blocks;
    return why;
}

void osp_scheduler_update(osp_scheduler *s, osp_sched_output *out) {
    for (int32_t e = 0; e < out->num_entries; e++) {
        osp_sched_entry *en = &out->entries[e];
        osp_request *r = en->req;
        en->num_new_tokens = 0;
        if (en->num_spec > 0 && en->sampled != -1) {
            const osp_finish_reason why = apply_verified(s, en);
            if (why != OSP_FINISH_NONE) osp_scheduler_finish(s, r, why);
            continue;
        }
        r->num_computed_tokens += en->num_scheduled_tokens;
        if (r->pooling != OSP_POOLING_NONE) { /* prefill only: done once every prompt token is computed */
            if (en->sampled == OSP_SAMPLED_ERROR) osp_scheduler_finish(s, r, OSP_FINISH_ERROR);
            else if (r->num_computed_tokens >= r->num_tokens) osp_scheduler_finish(s, r, OSP_FINISH_STOP);
            continue;
        }
        if (en->sampled == -1) continue;
        const osp_finish_reason why = append(s, r, en->sampled);
        en->num_new_tokens = why == OSP_FINISH_ERROR ? 0 : 1;
        if (r->children && why != OSP_FINISH_ERROR) fork_children(s, r);
        if (why != OSP_FINISH_NONE) osp_scheduler_finish(s, r, why);
    }
}

bool osp_scheduler_has_unfinished(const osp_scheduler *s) { return s->num_running + s->num_waiting > 0; }

osp_scheduler_stats osp_scheduler_get_stats(const osp_scheduler *s) {
    osp_scheduler_stats st = s->stats;
    st.num_running = s->num_running;
    st.num_waiting = s->num_waiting;
    for (int32_t i = 0; i < s->num_running; i++) st.num_running_without_row += s->running[i]->needs_row;
    return st;
}

osp_status osp_scheduler_check_invariants(const osp_scheduler *s) {
    OSP_TRY(osp_block_pool_check_invariants(s->pool));
    const int32_t nb = osp_block_pool_num_blocks(s->pool), bs = s->cfg.block_size;
    if (s->num_running > s->cfg.max_num_seqs)
        return osp_set_error(OSP_ERR_INTERNAL, "scheduler: %d running > max_num_seqs %d", s->num_running, s->cfg.max_num_seqs);
    int32_t *refs = calloc((size_t)nb, sizeof *refs);
    if (!refs) return osp_set_error(OSP_ERR_NOMEM, "scheduler: out of memory");
    osp_status st = OSP_OK;
    for (int32_t i = 0; i < s->num_waiting && st == OSP_OK; i++) {
        const osp_request *r = s->waiting[i];
        if (r->num_blocks != 0 || r->num_computed_tokens != 0 || (r->state != OSP_REQ_WAITING && r->state != OSP_REQ_PREEMPTED))
            st = osp_set_error(OSP_ERR_INTERNAL, "scheduler: waiting request %llu holds %d blocks / %d computed tokens, state %d",
                               (unsigned long long)r->id, r->num_blocks, r->num_computed_tokens, r->state);
    }
    for (int32_t i = 0; i < s->num_running && st == OSP_OK; i++) {
        const osp_request *r = s->running[i];
        /* computed < tokens: a running request always has its last token to compute (else it would never
           be scheduled again) */
        if (r->state != OSP_REQ_RUNNING || r->num_computed_tokens >= r->num_tokens || r->num_tokens > r->max_len ||
            r->num_blocks != cdiv(r->num_computed_tokens, bs) || r->num_spec < 0 || r->num_spec > r->spec_k)
            st = osp_set_error(OSP_ERR_INTERNAL,
                               "scheduler: running request %llu: state %d, %d computed of %d tokens (max %d), %d blocks, "
                               "%d drafts", (unsigned long long)r->id, r->state, r->num_computed_tokens, r->num_tokens,
                               r->max_len, r->num_blocks, r->num_spec);
        for (int32_t b = 0; b < r->num_blocks && st == OSP_OK; b++) {
            const int32_t id = r->block_ids[b];
            if (id < 0 || id >= nb) st = osp_set_error(OSP_ERR_INTERNAL, "scheduler: request %llu holds block %d",
                                                       (unsigned long long)r->id, id);
            else refs[id]++;
        }
    }
    for (int32_t k = 0; k < s->n_pend && st == OSP_OK; k++) { /* background loads hold their hits and blocks */
        if (!s->pend[k].r->tier_loading || s->pend[k].r->state == OSP_REQ_RUNNING)
            st = osp_set_error(OSP_ERR_INTERNAL, "scheduler: request %llu has a background load but is not waiting on it",
                               (unsigned long long)s->pend[k].r->id);
        for (int32_t i = 0; i < s->pend[k].n_hits + s->pend[k].n_load; i++) refs[s->pend[k].ids[i]]++;
    }
    for (int32_t b = 0; b < nb && st == OSP_OK; b++)
        if (refs[b] != osp_block_pool_ref_count(s->pool, b))
            st = osp_set_error(OSP_ERR_INTERNAL, "scheduler: block %d has ref count %d but %d running requests hold it", b,
                               osp_block_pool_ref_count(s->pool, b), refs[b]);
    free(refs);
    return st;
}
