/* KV cache events (include/osprey/kv_events.h) from the block pool, host-only: the scheduler runs
 * random traffic through a small pool (a fake model samples f(id, n)) with a sink that keeps the index
 * a router would keep. Every callback is checked as it comes (a stored hash is not already indexed, its
 * parent is, it carries block_size tokens; a removed hash is indexed) and after every step the index
 * must equal the pool's cached hashes exactly; evictions and hits must both have happened. Also: the
 * --kv-events-config parser (vLLM's keys, unknown keys and bad values rejected with a message, nothing
 * changed on error), and the publisher's batch counting with the "null" publisher. The wire format
 * over ZeroMQ is checked by tests/integration/test_kv_events.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/scheduler.h"
#include "kv/prefix_cache.h"
#include "osprey/kv_events.h"

#define BS 4
#define MAXIDX 4096

static int32_t f(uint64_t id, int32_t n) {
    uint64_t x = id * 0x9e3779b97f4a7c15ull + (uint64_t)n * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    return (int32_t)(x % 500);
}

typedef struct index_sink {
    uint64_t h[MAXIDX];
    int n;
    int64_t stored, removed, cleared, steps;
    bool bad;
    char why[256];
} index_sink;

static int find(const index_sink *x, uint64_t h) {
    for (int i = 0; i < x->n; i++)
        if (x->h[i] == h) return i;
    return -1;
}

static void fail_why(index_sink *x, const char *what, uint64_t h) {
    if (!x->bad) snprintf(x->why, sizeof x->why, "%s %016llx", what, (unsigned long long)h);
    x->bad = true;
}

static void on_stored(void *ctx, uint64_t h, bool has_parent, uint64_t parent, const int32_t *toks, int32_t n) {
    index_sink *x = ctx;
    if (find(x, h) >= 0) fail_why(x, "stored twice:", h);
    if (has_parent && find(x, parent) < 0) fail_why(x, "stored with an unknown parent:", parent);
    if (n != BS || !toks) fail_why(x, "stored without its block's tokens:", h);
    if (x->n < MAXIDX) x->h[x->n++] = h;
    x->stored++;
}

static void on_removed(void *ctx, uint64_t h) {
    index_sink *x = ctx;
    const int i = find(x, h);
    if (i < 0) fail_why(x, "removed but not stored:", h);
    else x->h[i] = x->h[--x->n];
    x->removed++;
}

static void on_cleared(void *ctx) {
    index_sink *x = ctx;
    x->n = 0;
    x->cleared++;
}

static void on_end(void *ctx) { ((index_sink *)ctx)->steps++; }

/* The index equals the pool's cached hashes (as a set; both are duplicate-free). */
static void expect_index_is_pool(const index_sink *x, const osp_block_pool *p, osp_prefix_hash_algo algo) {
    int cached = 0;
    for (int32_t id = 0; id < osp_block_pool_num_blocks(p); id++) {
        osp_block_hash h;
        if (!osp_block_pool_block_hash(p, id, &h)) continue;
        cached++;
        if (find(x, osp_block_hash_external(&h, algo)) < 0)
            fail_msg("block %d's hash %016llx is cached but not in the event index", id,
                     (unsigned long long)osp_block_hash_external(&h, algo));
    }
    assert_int_equal(cached, x->n);
}

static void run_traffic(osp_prefix_hash_algo algo, uint32_t seed) {
    srand(seed);
    static const int32_t eos[1] = {499};
    const osp_scheduler_config cfg = {.max_num_seqs = 6, .max_num_batched_tokens = 24, .max_model_len = 128,
                                      .block_size = BS, .num_blocks = 40, .enable_prefix_caching = true,
                                      .hasher = osp_prefix_hasher_make(algo, true, 42), .eos_ids = eos, .num_eos = 1};
    osp_scheduler *s;
    assert_int_equal(osp_scheduler_create(&cfg, &s), OSP_OK);
    index_sink *x = calloc(1, sizeof *x);
    assert_non_null(x);
    const osp_kv_event_sink sink = {.ctx = x, .block_stored = on_stored, .block_removed = on_removed,
                                    .all_cleared = on_cleared, .end_step = on_end};
    osp_block_pool_set_event_sink(osp_scheduler_pool(s), &sink, algo);
    enum { MAXR = 600 };
    osp_request *all[MAXR];
    int n_all = 0;
    int32_t shared[40];
    for (int i = 0; i < 40; i++) shared[i] = rand() % 500;
    for (int step = 0; step < 800 || osp_scheduler_has_unfinished(s); step++) {
        if (step < 800 && rand() % 3 == 0 && n_all < MAXR) {
            int32_t pr[40];
            const int32_t np = 1 + rand() % 40;
            for (int i = 0; i < np; i++) pr[i] = i < 20 && rand() % 3 ? shared[i] : rand() % 499;
            osp_request_params rp = osp_request_default_params();
            rp.request_id = (uint64_t)n_all;
            rp.prompt = pr;
            rp.num_prompt = np;
            rp.max_tokens = 1 + rand() % 20;
            osp_request *r;
            assert_int_equal(osp_request_create(&rp, cfg.max_model_len, BS, n_all, &r), OSP_OK);
            if (osp_scheduler_admissible(s, r) == OSP_OK) {
                assert_int_equal(osp_scheduler_add(s, r), OSP_OK);
                all[n_all++] = r;
            } else osp_request_destroy(r);
        }
        if (n_all > 0 && rand() % 12 == 0) osp_scheduler_finish(s, all[rand() % n_all], OSP_FINISH_ABORT);
        osp_sched_output *o;
        assert_int_equal(osp_scheduler_schedule(s, &o), OSP_OK);
        for (int e = 0; e < o->num_entries; e++) {
            osp_request *r = o->entries[e].req;
            const int32_t end = r->num_computed_tokens + o->entries[e].num_scheduled_tokens;
            o->entries[e].sampled = end == r->num_tokens ? f(r->id, r->num_tokens) : -1;
        }
        osp_scheduler_update(s, o);
        sink.end_step(sink.ctx);
        if (x->bad) fail_msg("step %d: %s", step, x->why);
        expect_index_is_pool(x, osp_scheduler_pool(s), algo);
        assert_true(step < 100000);
    }
    printf("algo %d: %lld stored, %lld removed, %d indexed at the end, %lld steps\n", (int)algo, (long long)x->stored,
           (long long)x->removed, x->n, (long long)x->steps);
    assert_true(x->removed > 0 && x->stored > x->removed); /* evictions happened; some blocks stay cached */
    assert_true(osp_scheduler_get_stats(s).prefix_hits_tokens > 0);
    /* a reset reports AllBlocksCleared and empties the index, as it empties the pool */
    osp_block_pool_reset_cache(osp_scheduler_pool(s));
    assert_int_equal(x->cleared, 1);
    expect_index_is_pool(x, osp_scheduler_pool(s), algo);
    for (int i = 0; i < n_all; i++) osp_request_destroy(all[i]);
    osp_scheduler_destroy(s);
    free(x);
}

static void test_index_equals_pool(void **state) {
    (void)state;
    run_traffic(OSP_PREFIX_HASH_XXH3_128, 11);
    run_traffic(OSP_PREFIX_HASH_SHA256_CBOR, 12);
}

static void test_config_parse(void **state) {
    (void)state;
    osp_kv_events_config c = osp_kv_events_default_config();
    assert_false(c.enable_kv_cache_events);
    assert_string_equal(c.endpoint, "tcp://*:5557");
    assert_int_equal(c.buffer_steps, 10000);
    assert_int_equal(osp_kv_events_config_parse("{\"enable_kv_cache_events\": true}", &c), OSP_OK);
    assert_true(c.enable_kv_cache_events && c.publisher_zmq && !c.topic_set && !c.replay_endpoint[0]);
    assert_int_equal(osp_kv_events_config_parse(
                         "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:6000\","
                         " \"replay_endpoint\": \"tcp://*:6001\", \"buffer_steps\": 5, \"hwm\": 10,"
                         " \"max_queue_size\": 7, \"topic\": \"kv@pod@m\"}",
                         &c),
                     OSP_OK);
    assert_string_equal(c.endpoint, "tcp://*:6000");
    assert_string_equal(c.replay_endpoint, "tcp://*:6001");
    assert_string_equal(c.topic, "kv@pod@m");
    assert_true(c.topic_set && c.buffer_steps == 5 && c.hwm == 10 && c.max_queue_size == 7);
    assert_int_equal(osp_kv_events_config_parse("{\"enable_kv_cache_events\": true, \"publisher\": \"null\"}", &c), OSP_OK);
    assert_false(c.publisher_zmq);
    assert_int_equal(osp_kv_events_config_parse("{\"replay_endpoint\": null}", &c), OSP_OK);
    assert_false(c.enable_kv_cache_events || c.publisher_zmq); /* off unless enabled, as vLLM */
    static const struct {
        const char *json, *says;
    } bad[] = {
        {"{\"enable_kv_cache_events\": true, \"bogus\": 1}", "unknown key 'bogus'"},
        {"{\"enable_kv_cache_events\": 1}", "true or false"},
        {"{\"publisher\": \"kafka\"}", "'publisher'"},
        {"{\"buffer_steps\": 0}", "'buffer_steps'"},
        {"{\"hwm\": -1}", "'hwm'"},
        {"{\"hwm\": 1.5}", "'hwm'"},
        {"{\"endpoint\": 5}", "'endpoint'"},
        {"{\"endpoint\": \"\"}", "'endpoint'"},
        {"{\"topic\": null}", "'topic'"},
        {"[1]", "JSON object"},
        {"{\"enable_kv_cache_events\": true", "not JSON"},
        {"{\"hwm\": 1, \"hwm\": 2}", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        osp_kv_events_config d = osp_kv_events_default_config();
        d.hwm = 77;
        assert_int_equal(osp_kv_events_config_parse(bad[i].json, &d), OSP_ERR_INVALID_ARG);
        if (!strstr(osp_last_error(), bad[i].says)) fail_msg("%s: message '%s' lacks '%s'", bad[i].json, osp_last_error(), bad[i].says);
        assert_int_equal(d.hwm, 77); /* unchanged */
    }
    char big[600] = "{\"topic\": \"";
    memset(big + strlen(big), 'x', 300);
    strcpy(big + 11 + 300, "\"}");
    assert_int_equal(osp_kv_events_config_parse(big, &c), OSP_ERR_INVALID_ARG);
}

static void test_null_publisher_counts(void **state) {
    (void)state;
    osp_kv_events_config c;
    assert_int_equal(osp_kv_events_config_parse("{\"enable_kv_cache_events\": true, \"publisher\": \"null\"}", &c), OSP_OK);
    const osp_kv_publisher_params pp = {.block_size = BS, .medium = "CPU"};
    osp_kv_publisher *p;
    assert_int_equal(osp_kv_publisher_create(&c, &pp, &p), OSP_OK);
    const osp_kv_event_sink *k = osp_kv_publisher_sink(p);
    const int32_t t[BS] = {1, 2, 3, 4};
    k->end_step(k->ctx); /* nothing happened: no batch */
    assert_int_equal(osp_kv_publisher_num_batches(p), 0);
    k->block_stored(k->ctx, 10, false, 0, t, BS);
    k->block_stored(k->ctx, 11, true, 10, t, BS);
    k->block_removed(k->ctx, 10);
    k->end_step(k->ctx);
    k->all_cleared(k->ctx);
    k->end_step(k->ctx);
    assert_int_equal(osp_kv_publisher_num_batches(p), 2);
    osp_kv_publisher_free(p);
    /* a bad endpoint fails at create, naming it */
    assert_int_equal(osp_kv_events_config_parse("{\"enable_kv_cache_events\": true, \"endpoint\": \"bogus://x\"}", &c), OSP_OK);
    assert_int_equal(osp_kv_publisher_create(&c, &pp, &p), OSP_ERR_IO);
    assert_non_null(strstr(osp_last_error(), "bogus://x"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_equals_pool),
        cmocka_unit_test(test_config_parse),
        cmocka_unit_test(test_null_publisher_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
