/* The router's endpoint picker (tools/router/picker.h) on hand-made backend snapshots: filters drop
 * unhealthy backends and ones serving another model (and -1 when none is left); the longest prefix
 * wins at equal load; a hot spot (queue over hot_queue) loses its prefix advantage; the queue scorer
 * prefers the shorter queue, the kv scorer the emptier cache, the active scorer the less busy; equal
 * backends take turns as rr advances; the reported scores are the weighted sums. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "picker.h"

static rt_backend_view ok(void) { return (rt_backend_view){.healthy = true, .serves_model = true}; }

static void test_filters(void **state) {
    (void)state;
    const rt_weights w = rt_default_weights();
    rt_backend_view b[3] = {ok(), ok(), ok()};
    b[0].healthy = false;
    b[1].serves_model = false;
    double sc[3];
    assert_int_equal(rt_pick(b, 3, 0, &w, 0, sc), 2);
    assert_true(sc[0] == -1 && sc[1] == -1 && sc[2] > 0);
    b[2].healthy = false;
    assert_int_equal(rt_pick(b, 3, 0, &w, 0, NULL), -1);
    assert_int_equal(rt_pick(b, 0, 0, &w, 0, NULL), -1);
}

static void test_prefix_and_hot_spot(void **state) {
    (void)state;
    rt_weights w = rt_default_weights();
    rt_backend_view b[3] = {ok(), ok(), ok()};
    b[1].prefix_blocks = 6, b[2].prefix_blocks = 3;
    for (uint32_t rr = 0; rr < 3; rr++) assert_int_equal(rt_pick(b, 3, 8, &w, rr, NULL), 1);
    /* backend 1 is a hot spot: its queue exceeds hot_queue, so the next longest prefix wins */
    b[1].num_waiting = 9;
    assert_int_equal(rt_pick(b, 3, 8, &w, 0, NULL), 2);
    /* the only prefix holder is a hot spot: with protection another backend wins; without, its prefix
       (6/8 * 3 = 2.25) outweighs its worst queue score (0 against 2) */
    b[2].prefix_blocks = 0;
    assert_int_equal(rt_pick(b, 3, 8, &w, 0, NULL), 0);
    w.hot_queue = -1;
    assert_int_equal(rt_pick(b, 3, 8, &w, 0, NULL), 1);
    /* prefix_blocks beyond the request's blocks count as all of them */
    b[0].prefix_blocks = 100, b[1].num_waiting = 0;
    double sc[3];
    assert_int_equal(rt_pick(b, 3, 8, &w, 0, sc), 0);
    assert_true(sc[0] == 3.0 + 2.0 + 1.0 + 1.0);
}

static void test_load_scorers(void **state) {
    (void)state;
    const rt_weights w = rt_default_weights();
    rt_backend_view b[2] = {ok(), ok()};
    b[0].num_waiting = 4;
    assert_int_equal(rt_pick(b, 2, 0, &w, 0, NULL), 1); /* shorter queue */
    b[0].num_waiting = 0, b[1].kv_usage = 0.9;
    assert_int_equal(rt_pick(b, 2, 0, &w, 1, NULL), 0); /* emptier KV cache */
    b[1].kv_usage = 0, b[0].active = 3;
    assert_int_equal(rt_pick(b, 2, 0, &w, 0, NULL), 1); /* fewer requests in flight from the router */
}

static void test_ties_take_turns(void **state) {
    (void)state;
    const rt_weights w = rt_default_weights();
    rt_backend_view b[3] = {ok(), ok(), ok()};
    int seen[3] = {0};
    for (uint32_t rr = 0; rr < 30; rr++) seen[rt_pick(b, 3, 4, &w, rr, NULL)]++;
    assert_true(seen[0] == 10 && seen[1] == 10 && seen[2] == 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_filters),
        cmocka_unit_test(test_prefix_and_hot_spot),
        cmocka_unit_test(test_load_scorers),
        cmocka_unit_test(test_ties_take_turns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
