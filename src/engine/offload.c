/* Tiered KV offload, the engine's side (see offload.h). */
#include "engine/offload.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <xxhash.h>

#include "backend/kv_layout.h"
#include "core/status_internal.h"
#include "kv/kv_cache.h"
#include "kv/prefix_cache.h"

#define EMA_WEIGHT 0.25         /* of the newest measurement */
#define PROMPT_STEP_TOKENS 64   /* steps at least this long measure the prompt rate */

struct osp_offload {
    osp_kv_offload *store;
    osp_kv_cache *kv;
    void *buf;                  /* one block, host */
    osp_status err;
    bool no_cost_model;
    const osp_kv_event_sink *sink;
    osp_prefix_hash_algo algo;
    double load_s, prefill_s;   /* EMAs: seconds per block loaded, per prompt token computed (0: none yet) */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void ema(double *x, double v) { *x = *x > 0 ? (1 - EMA_WEIGHT) * *x + EMA_WEIGHT * v : v; }

/* ---- hooks ------------------------------------------------------------------------------------ */

static void on_evict(void *ctx, int32_t id, const osp_block_hash *h) {
    osp_offload *o = ctx;
    if (o->err != OSP_OK) return;
    const osp_status s = osp_kv_cache_block_read(o->kv, id, o->buf);
    if (s != OSP_OK) {
        o->err = s;
        return;
    }
    osp_kv_offload_put(o->store, h, o->buf);
}

static void on_tier_change(void *ctx, const osp_block_hash *h, int tier, bool stored) {
    const osp_offload *o = ctx;
    const char *medium = tier == OSP_KV_TIER_HOST ? "CPU" : "DISK";
    const uint64_t x = osp_block_hash_external(h, o->algo);
    if (stored && o->sink->tier_stored) o->sink->tier_stored(o->sink->ctx, x, medium);
    if (!stored && o->sink->tier_removed) o->sink->tier_removed(o->sink->ctx, x, medium);
}

static bool tier_contains(void *ctx, const osp_block_hash *h) {
    const osp_offload *o = ctx;
    return o->err == OSP_OK && osp_kv_offload_where(o->store, h) >= 0;
}

static bool tier_worth(void *ctx, int32_t n_blocks) {
    (void)n_blocks; /* both sides scale with the count */
    const osp_offload *o = ctx;
    const int32_t bs = o->kv->block_size;
    return o->no_cost_model || o->load_s <= 0 || o->prefill_s <= 0 || o->load_s < (double)bs * o->prefill_s;
}

static bool tier_load(void *ctx, int32_t id, const osp_block_hash *h) {
    osp_offload *o = ctx;
    if (o->err != OSP_OK) return false;
    const double t0 = now_s();
    if (!osp_kv_offload_get(o->store, h, o->buf)) return false;
    const osp_status s = osp_kv_cache_block_write(o->kv, id, o->buf);
    if (s != OSP_OK) {
        o->err = s;
        return false;
    }
    ema(&o->load_s, now_s() - t0);
    return true;
}

/* ---- fingerprint ------------------------------------------------------------------------------- */

static uint64_t fingerprint(const osp_offload_identity *id, const osp_kv_cache *kv) {
    char text[PATH_MAX + 512];
    int n = 0;
    if (id->model_path) {
        char real[PATH_MAX];
        struct stat sb = {0};
        const char *path = realpath(id->model_path, real) ? real : id->model_path;
        stat(path, &sb);
        n = snprintf(text, sizeof text, "model=%s size=%lld mtime=%lld.%09ld", path, (long long)sb.st_size,
                     (long long)sb.st_mtim.tv_sec, (long)sb.st_mtim.tv_nsec);
    } else {
        n = snprintf(text, sizeof text, "random=%s seed=%llu", id->random_weights ? id->random_weights : "",
                     (unsigned long long)id->random_seed);
    }
    if (n < 0 || n >= (int)sizeof text) n = (int)sizeof text - 1;
    snprintf(text + n, sizeof text - (size_t)n,
             " device=%d exact=%d qw=%d layers=%d block=%d k=%d/%zu/%zu/%d v=%d/%zu/%zu/%d", id->device, id->exact,
             id->gpu_quant_weights, kv->n_layer, kv->block_size, (int)kv->k_fmt.elem_type, kv->k_fmt.bytes_per_token,
             kv->k_fmt.scale_bytes_per_token, kv->k_fmt.k_hadamard, (int)kv->v_fmt.elem_type, kv->v_fmt.bytes_per_token,
             kv->v_fmt.scale_bytes_per_token, kv->v_fmt.k_hadamard);
    XXH3_state_t *st = XXH3_createState();
    uint64_t fp = 0;
    if (st) {
        XXH3_64bits_reset(st);
        XXH3_64bits_update(st, text, strlen(text));
        /* fixed scales: the same codes mean other values under other scales */
        if (kv->k_fixed) XXH3_64bits_update(st, kv->k_fixed, sizeof(float) * (size_t)kv->n_layer * kv->k_fmt.fixed_scales_per_layer);
        if (kv->v_fixed) XXH3_64bits_update(st, kv->v_fixed, sizeof(float) * (size_t)kv->n_layer * kv->v_fmt.fixed_scales_per_layer);
        fp = XXH3_64bits_digest(st);
        XXH3_freeState(st);
    } else {
        fp = XXH3_64bits(text, strlen(text));
    }
    return fp;
}

/* ---- public ------------------------------------------------------------------------------------ */

osp_status osp_offload_create(const osp_offload_config *cfg, const osp_offload_identity *id, osp_kv_cache *kv,
                              osp_scheduler *sched, osp_offload **out) {
    *out = NULL;
    osp_offload *o = calloc(1, sizeof *o);
    if (!o) return osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory");
    o->kv = kv;
    o->no_cost_model = cfg->no_cost_model;
    o->sink = cfg->sink;
    o->algo = cfg->hash_algo;
    const size_t bytes = osp_kv_cache_block_bytes(kv);
    osp_kv_offload_config tiers = cfg->tiers;
    tiers.listener = o->sink ? on_tier_change : NULL;
    tiers.listener_ctx = o;
    osp_status s = osp_kv_offload_create(&tiers, bytes, fingerprint(id, kv), &o->store);
    if (s == OSP_OK && !(o->buf = malloc(bytes))) s = osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory");
    if (s != OSP_OK) {
        osp_offload_destroy(o, NULL);
        return s;
    }
    osp_block_pool_set_evict_hook(osp_scheduler_pool(sched), on_evict, o);
    const osp_sched_tier t = {.ctx = o, .contains = tier_contains, .worth = tier_worth, .load = tier_load};
    osp_scheduler_set_tier(sched, &t);
    *out = o;
    return OSP_OK;
}

void osp_offload_destroy(osp_offload *o, osp_scheduler *sched) {
    if (!o) return;
    if (sched) {
        osp_block_pool_set_evict_hook(osp_scheduler_pool(sched), NULL, NULL);
        osp_scheduler_set_tier(sched, NULL);
    }
    osp_kv_offload_destroy(o->store);
    free(o->buf);
    free(o);
}

void osp_offload_note_step(osp_offload *o, int32_t tokens, double seconds) {
    if (tokens >= PROMPT_STEP_TOKENS && seconds > 0) ema(&o->prefill_s, seconds / tokens);
}

osp_status osp_offload_status(const osp_offload *o) { return o->err; }

osp_offload_stats osp_offload_get_stats(const osp_offload *o) {
    return (osp_offload_stats){.store = osp_kv_offload_get_stats(o->store), .load_s_per_block = o->load_s,
                               .prefill_s_per_token = o->prefill_s};
}
