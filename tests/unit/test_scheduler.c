/* Scheduler, host-only, with a fake model: the token sampled after position n of request `id` is a fixed
 * function f(id, n), so every request's output is known in advance whatever the batching. A simulated
 * KV cache records which token each slot was computed from, and after every step each scheduled
 * request's positions [0, computed) must read back its own tokens through its block table: this catches
 * wrong sharing, eviction of blocks in use and stale prefix hits. Invariants are checked every step.
 *
 * Asserts: budget and max_num_seqs respected; chunks of 7/7/6 for a 20-token prompt at budget 7;
 * prefix hits of exactly k-1 blocks for k*block_size prompt tokens and k for k*block_size + 1; a small
 * pool forces preemptions and every request still ends with its own tokens; priority order; admission
 * refusals; thousands of random steps with arrivals, aborts and lengths leave every block free. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/scheduler.h"

#define VOCAB 1000
#define EOS 999
#define BS 4

static int32_t f(uint64_t id, int32_t n) {
    uint64_t x = id * 0x9e3779b97f4a7c15ull + (uint64_t)n * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 29;
    return (int32_t)(x % VOCAB);
}

typedef struct sim {
    osp_scheduler *s;
    osp_scheduler_config cfg;
    int32_t *kv;         /* [num_blocks * BS] token whose K/V the slot holds, -1 = never written */
    int64_t steps, arrival;
} sim;

static int32_t g_lp_tokens; /* sim_init: max_prompt_logprob_tokens (0: the default) */

static void sim_init(sim *m, int32_t num_blocks, int32_t budget, int32_t max_seqs, bool caching, osp_sched_policy pol) {
    static const int32_t eos[1] = {EOS};
    memset(m, 0, sizeof *m);
    m->cfg = (osp_scheduler_config){.max_num_seqs = max_seqs, .max_num_batched_tokens = budget, .max_model_len = 256,
                                    .block_size = BS, .num_blocks = num_blocks, .policy = pol,
                                    .enable_prefix_caching = caching, .max_prompt_logprob_tokens = g_lp_tokens,
                                    .hasher = osp_prefix_hasher_make(OSP_PREFIX_HASH_XXH3_128, true, 3),
                                    .eos_ids = eos, .num_eos = 1};
    assert_int_equal(osp_scheduler_create(&m->cfg, &m->s), OSP_OK);
    m->kv = malloc(sizeof *m->kv * (size_t)num_blocks * BS);
    for (int i = 0; i < num_blocks * BS; i++) m->kv[i] = -1;
}

static void sim_free(sim *m) {
    osp_scheduler_destroy(m->s);
    free(m->kv);
}

static osp_request *make_req(sim *m, uint64_t id, int32_t n_prompt, int32_t max_tokens, const int32_t *prompt) {
    int32_t buf[512];
    for (int i = 0; i < n_prompt; i++) buf[i] = prompt ? prompt[i] : (int32_t)((id * 7 + (uint64_t)i) % 500);
    osp_request_params rp = osp_request_default_params();
    rp.request_id = id;
    rp.prompt = buf;
    rp.num_prompt = n_prompt;
    rp.max_tokens = max_tokens;
    osp_request *r;
    assert_int_equal(osp_request_create(&rp, m->cfg.max_model_len, BS, m->arrival++, &r), OSP_OK);
    return r;
}

/* One step: schedule, "run" the fake model (write the sim KV, check every read), update. */
static osp_sched_output *sim_step(sim *m) {
    osp_sched_output *o;
    assert_int_equal(osp_scheduler_schedule(m->s, &o), OSP_OK);
    assert_true(o->total_tokens <= m->cfg.max_num_batched_tokens);
    assert_true(o->num_entries <= m->cfg.max_num_seqs);
    int32_t sum = 0;
    for (int e = 0; e < o->num_entries; e++) {
        osp_sched_entry *en = &o->entries[e];
        osp_request *r = en->req;
        assert_true(en->num_scheduled_tokens > 0);
        sum += en->num_scheduled_tokens;
        const int32_t end = r->num_computed_tokens + en->num_scheduled_tokens;
        assert_true(end <= r->num_tokens);
        assert_true(r->num_blocks * BS >= end);
        for (int32_t p = r->num_computed_tokens; p < end; p++) m->kv[r->block_ids[p / BS] * BS + p % BS] = r->tokens[p];
    }
    for (int e = 0; e < o->num_entries; e++) { /* reads after all writes of the step, as the model */
        osp_request *r = o->entries[e].req;
        const int32_t end = r->num_computed_tokens + o->entries[e].num_scheduled_tokens;
        for (int32_t p = 0; p < end; p++)
            if (m->kv[r->block_ids[p / BS] * BS + p % BS] != r->tokens[p])
                fail_msg("step %lld: request %llu position %d reads token %d, expected %d", (long long)m->steps,
                         (unsigned long long)r->id, p, m->kv[r->block_ids[p / BS] * BS + p % BS], r->tokens[p]);
        o->entries[e].sampled = end == r->num_tokens ? f(r->id, r->num_tokens) : -1;
    }
    assert_int_equal(sum, o->total_tokens);
    osp_scheduler_update(m->s, o);
    osp_status st = osp_scheduler_check_invariants(m->s);
    if (st != OSP_OK) fail_msg("step %lld: %s", (long long)m->steps, osp_last_error());
    m->steps++;
    return o;
}

/* The output a request has alone: f until EOS (STOP) or max_len (LENGTH). */
static void expect_alone(const osp_request *r) {
    int32_t n = r->num_prompt;
    osp_finish_reason why = OSP_FINISH_NONE;
    while (why == OSP_FINISH_NONE) {
        const int32_t t = f(r->id, n);
        if (r->tokens[n] != t) fail_msg("request %llu: token %d is %d, alone %d", (unsigned long long)r->id, n, r->tokens[n], t);
        n++;
        if (n >= r->max_len) why = OSP_FINISH_LENGTH;
        else if (t == EOS) why = OSP_FINISH_STOP;
    }
    assert_int_equal(r->num_tokens, n);
    assert_int_equal(r->finish_reason, why);
}

static void test_chunked_prefill(void **state) {
    (void)state;
    sim m;
    sim_init(&m, 64, 7, 8, false, OSP_SCHED_FCFS);
    osp_request *r = make_req(&m, 1, 20, 3, NULL);
    assert_int_equal(osp_scheduler_add(m.s, r), OSP_OK);
    const int32_t chunks[3] = {7, 7, 6};
    for (int i = 0; i < 3; i++) {
        osp_sched_output *o = sim_step(&m);
        assert_int_equal(o->num_entries, 1);
        assert_int_equal(o->entries[0].num_scheduled_tokens, chunks[i]);
        assert_int_equal(o->entries[0].is_new, i == 0);
    }
    while (osp_scheduler_has_unfinished(m.s)) assert_int_equal(sim_step(&m)->total_tokens, 1);
    expect_alone(r);
    assert_int_equal(osp_block_pool_num_free(osp_scheduler_pool(m.s)), 64);
    osp_request_destroy(r);
    sim_free(&m);
}

/* Repeating a prompt hits k-1 blocks for k*BS tokens and k for k*BS + 1, counted exactly. */
static void test_prefix_hits_counted(void **state) {
    (void)state;
    for (int extra = 0; extra <= 1; extra++) {
        sim m;
        sim_init(&m, 64, 64, 8, true, OSP_SCHED_FCFS);
        const int k = 5, n = k * BS + extra;
        osp_request *a = make_req(&m, 10, n, 2, NULL), *b = make_req(&m, 11, n, 2, a->tokens);
        assert_int_equal(osp_scheduler_add(m.s, a), OSP_OK);
        while (osp_scheduler_has_unfinished(m.s)) sim_step(&m);
        assert_int_equal(a->num_cached_tokens, 0);
        assert_int_equal(osp_scheduler_add(m.s, b), OSP_OK);
        osp_sched_output *o = sim_step(&m);
        const int hit_blocks = extra ? k : k - 1;
        assert_int_equal(b->num_cached_tokens, hit_blocks * BS);
        assert_int_equal(o->entries[0].num_scheduled_tokens, n - hit_blocks * BS);
        const osp_scheduler_stats st = osp_scheduler_get_stats(m.s);
        assert_int_equal(st.prefix_queries_tokens, 2 * n);
        assert_int_equal(st.prefix_hits_tokens, hit_blocks * BS);
        while (osp_scheduler_has_unfinished(m.s)) sim_step(&m);
        osp_request_destroy(a);
        osp_request_destroy(b);
        sim_free(&m);
    }
}

/* 12 requests, a pool that holds about three of them: preemptions, and everyone gets its own tokens. */
static void test_preemption(void **state) {
    (void)state;
    sim m;
    sim_init(&m, 24, 64, 12, true, OSP_SCHED_FCFS);
    osp_request *rs[12];
    for (int i = 0; i < 12; i++) {
        rs[i] = make_req(&m, 100 + (uint64_t)i, 9 + i, 20, NULL);
        assert_int_equal(osp_scheduler_admissible(m.s, rs[i]), OSP_OK);
        assert_int_equal(osp_scheduler_add(m.s, rs[i]), OSP_OK);
    }
    while (osp_scheduler_has_unfinished(m.s)) {
        sim_step(&m);
        assert_true(m.steps < 10000);
    }
    assert_true(osp_scheduler_get_stats(m.s).num_preemptions > 0);
    for (int i = 0; i < 12; i++) {
        expect_alone(rs[i]);
        osp_request_destroy(rs[i]);
    }
    assert_int_equal(osp_block_pool_num_free(osp_scheduler_pool(m.s)), 24);
    sim_free(&m);
}

/* A request preempted in the step that had already given it blocks for a chunk (it was scheduled before
 * the request that ran out of blocks) never computes that chunk: the blocks it had cached for it must not
 * keep their hashes, or a later request with the same prompt reads KV that was never written. The
 * scenario: priorities put the low-priority victim first in the running list (admitted first) and its
 * prompt logprobs cap its chunks at 8 positions, so it is still in prefill when a higher-priority request
 * admitted after it needs a block of an exhausted pool. A copy of the victim's prompt then asks the prefix
 * cache (the sim reads every computed position back through the block table). */
static void test_preempted_chunk_uncached(void **state) {
    (void)state;
    sim m;
    g_lp_tokens = 12; /* the victim's chunks: 12 positions (3 blocks) */
    sim_init(&m, 10, 32, 4, true, OSP_SCHED_PRIORITY);
    g_lp_tokens = 0;
    int32_t prompt[40];
    for (int i = 0; i < 40; i++) prompt[i] = 100 + i;
    osp_request *victim = make_req(&m, 1, 36, 4, prompt);
    victim->priority = 1;
    victim->prompt_logprobs = 0;
    assert_int_equal(osp_scheduler_admissible(m.s, victim), OSP_OK); /* 39 tokens of KV: 10 blocks */
    assert_int_equal(osp_scheduler_add(m.s, victim), OSP_OK);
    sim_step(&m); /* victim: positions 0-11 (blocks 0-2) */
    osp_request *needy = make_req(&m, 2, 4, 30, NULL);
    needy->priority = 0;
    assert_int_equal(osp_scheduler_add(m.s, needy), OSP_OK);
    sim_step(&m); /* victim: 12-23 (blocks 3-5); needy admitted: 0-3 (1 block); 7 of 10 blocks used */
    sim_step(&m); /* victim given 24-35 (blocks 6-8, cached at once), then preempted: needy's decode needs a block */
    assert_int_equal(osp_scheduler_get_stats(m.s).num_preemptions, 1);
    /* the victim's first 28 tokens and one more: its blocks 0-5 were computed, block 6 never was */
    osp_request *copy = make_req(&m, 3, 29, 4, prompt);
    copy->priority = 0;
    assert_int_equal(osp_scheduler_add(m.s, copy), OSP_OK);
    sim_step(&m); /* the sim reads every hit back: a hit on block 6 would read never-written slots */
    assert_int_equal(copy->num_cached_tokens, 24);
    while (osp_scheduler_has_unfinished(m.s)) {
        sim_step(&m);
        assert_true(m.steps < 10000);
    }
    expect_alone(victim);
    expect_alone(needy);
    expect_alone(copy);
    osp_request_destroy(victim);
    osp_request_destroy(needy);
    osp_request_destroy(copy);
    sim_free(&m);
}

static void test_priority_and_admission(void **state) {
    (void)state;
    sim m;
    sim_init(&m, 8, 64, 1, false, OSP_SCHED_PRIORITY);
    osp_request *lo = make_req(&m, 1, 3, 1, NULL), *hi = make_req(&m, 2, 3, 1, NULL);
    lo->priority = 5;
    hi->priority = -1;
    assert_int_equal(osp_scheduler_add(m.s, lo), OSP_OK);
    assert_int_equal(osp_scheduler_add(m.s, hi), OSP_OK);
    osp_sched_output *o = sim_step(&m);
    assert_int_equal(o->num_entries, 1);
    assert_ptr_equal(o->entries[0].req, hi); /* max_num_seqs 1: the better priority goes first */
    while (osp_scheduler_has_unfinished(m.s)) sim_step(&m);
    /* 8 blocks of 4 = 32 tokens: a request that may reach 34 tokens can never fit */
    osp_request *big = make_req(&m, 3, 10, 24, NULL);
    assert_int_equal(osp_scheduler_admissible(m.s, big), OSP_ERR_INVALID_ARG);
    osp_request *fits = make_req(&m, 4, 10, 23, NULL); /* 33 tokens, the last never computed */
    assert_int_equal(osp_scheduler_admissible(m.s, fits), OSP_OK);
    osp_request_params rp = osp_request_default_params();
    int32_t p[4] = {1, 2, 3, 4};
    rp.prompt = p;
    rp.num_prompt = 4;
    rp.max_tokens = 253;
    osp_request *bad;
    assert_int_equal(osp_request_create(&rp, 256, BS, 0, &bad), OSP_ERR_INVALID_ARG); /* over max_model_len */
    rp.num_prompt = 0;
    assert_int_equal(osp_request_create(&rp, 256, BS, 0, &bad), OSP_ERR_INVALID_ARG);
    osp_request_destroy(lo);
    osp_request_destroy(hi);
    osp_request_destroy(big);
    osp_request_destroy(fits);
    sim_free(&m);
}

/* Thousands of steps: random arrivals (sometimes sharing prefixes), aborts and lengths, a small pool,
 * random budgets and policies. */
static void test_randomized(void **state) {
    (void)state;
    srand(777);
    enum { MAXR = 4000 };
    osp_request **all = calloc(MAXR, sizeof *all);
    int64_t total_steps = 0, preemptions = 0, hits = 0;
    for (int round = 0; round < 4; round++) {
        sim m;
        const int32_t budgets[4] = {1, 7, 16, 64};
        sim_init(&m, 20 + rand() % 30, budgets[round], 1 + rand() % 8, round != 2,
                 round == 3 ? OSP_SCHED_PRIORITY : OSP_SCHED_FCFS);
        int n_all = 0;
        int32_t shared[64];
        for (int i = 0; i < 64; i++) shared[i] = rand() % 500;
        for (int step = 0; step < 1500 || osp_scheduler_has_unfinished(m.s); step++) {
            if (step < 1500 && rand() % 3 == 0 && n_all < MAXR) {
                const int32_t np = 1 + rand() % 40;
                int32_t pr[64];
                for (int i = 0; i < np; i++) pr[i] = i < 24 && rand() % 2 ? shared[i] : rand() % 500;
                osp_request *r = make_req(&m, (uint64_t)n_all + 1000u * (uint64_t)round, np, 1 + rand() % 30,
                                          rand() % 2 ? shared : pr);
                r->priority = rand() % 3;
                if (osp_scheduler_admissible(m.s, r) == OSP_OK) {
                    assert_int_equal(osp_scheduler_add(m.s, r), OSP_OK);
                    all[n_all++] = r;
                } else {
                    osp_request_destroy(r);
                }
            }
            if (n_all > 0 && rand() % 10 == 0) osp_scheduler_finish(m.s, all[rand() % n_all], OSP_FINISH_ABORT);
            sim_step(&m);
            assert_true(step < 100000);
        }
        for (int i = 0; i < n_all; i++) {
            if (all[i]->finish_reason != OSP_FINISH_ABORT) expect_alone(all[i]);
            osp_request_destroy(all[i]);
        }
        osp_block_pool *p = osp_scheduler_pool(m.s);
        assert_int_equal(osp_block_pool_num_free(p), osp_block_pool_num_blocks(p));
        total_steps += m.steps;
        preemptions += osp_scheduler_get_stats(m.s).num_preemptions;
        hits += osp_scheduler_get_stats(m.s).prefix_hits_tokens;
        sim_free(&m);
    }
    printf("randomized: %lld steps, %lld preemptions, %lld prefix-hit tokens\n", (long long)total_steps,
           (long long)preemptions, (long long)hits);
    assert_true(preemptions > 0 && hits > 0);
    free(all);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chunked_prefill),
        cmocka_unit_test(test_prefix_hits_counted),
        cmocka_unit_test(test_preemption),
        cmocka_unit_test(test_priority_and_admission),
        cmocka_unit_test(test_preempted_chunk_uncached),
        cmocka_unit_test(test_randomized),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
