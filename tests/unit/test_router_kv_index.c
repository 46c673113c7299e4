/* The router's KV-event index (tools/router/kv_index.h) fed by hand-made msgpack batches in both of
 * vLLM's forms (maps tagged "type"; positional arrays), hashes as integers and as byte strings (last
 * 8 bytes, big-endian): stored blocks are found per backend, the leading-run match stops at the first
 * missing block, removals and AllBlocksCleared take blocks out of one backend only, and payloads that
 * are not an EventBatch are refused without changing anything. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include "kv_index.h"
#include "osprey/kv_events.h"

static void pstr(msgpack_packer *pk, const char *s) {
    msgpack_pack_str(pk, strlen(s));
    msgpack_pack_str_body(pk, s, strlen(s));
}

static const char *g_medium; /* batch(): a medium field in the map form (NULL: none); the array form's ("GPU" if NULL) */

/* A batch with one event of kind tag over hashes[0..n) in the map or the array form. */
static void batch(msgpack_sbuffer *sb, bool array_like, const char *tag, const uint64_t *h, int n) {
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    const bool stored = !strcmp(tag, "BlockStored"), cleared = !strcmp(tag, "AllBlocksCleared");
    if (array_like) {
        msgpack_pack_array(&pk, 2);
        msgpack_pack_double(&pk, 1.0);
        msgpack_pack_array(&pk, 1);
        msgpack_pack_array(&pk, cleared ? 1 : stored ? 7 : 3);
        pstr(&pk, tag);
        if (cleared) return;
        msgpack_pack_array(&pk, (size_t)n);
        for (int i = 0; i < n; i++) msgpack_pack_uint64(&pk, h[i]);
        if (stored) {
            msgpack_pack_nil(&pk);
            msgpack_pack_array(&pk, 0);
            msgpack_pack_int(&pk, 16);
            msgpack_pack_nil(&pk);
        }
        pstr(&pk, g_medium ? g_medium : "GPU");
        return;
    }
    msgpack_pack_map(&pk, 2);
    pstr(&pk, "ts"), msgpack_pack_double(&pk, 1.0);
    pstr(&pk, "events"), msgpack_pack_array(&pk, 1);
    msgpack_pack_map(&pk, cleared ? 1 : g_medium ? 3 : 2);
    pstr(&pk, "type"), pstr(&pk, tag);
    if (cleared) return;
    if (g_medium) pstr(&pk, "medium"), pstr(&pk, g_medium);
    pstr(&pk, "block_hashes");
    msgpack_pack_array(&pk, (size_t)n);
    for (int i = 0; i < n; i++) { /* odd positions as 32-byte strings ending in the hash, big-endian */
        if (i % 2) {
            uint8_t b[32] = {0};
            for (int k = 0; k < 8; k++) b[24 + k] = (uint8_t)(h[i] >> (56 - 8 * k));
            msgpack_pack_bin(&pk, 32);
            msgpack_pack_bin_body(&pk, b, 32);
        } else msgpack_pack_uint64(&pk, h[i]);
    }
}

static void test_both_forms(void **state) {
    (void)state;
    const char *eps[2] = {NULL, NULL};
    char why[128];
    rt_kv_index *x = rt_kv_index_start(eps, NULL, 2, why, sizeof why);
    assert_non_null(x);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    const uint64_t h[4] = {0xffffffffffffffffull, 2, 3, 0x8000000000000001ull};
    for (int form = 0; form < 2; form++) {
        batch(&sb, form, "BlockStored", h, 3);
        assert_true(rt_kv_index_apply(x, form, sb.data, sb.size));
        assert_int_equal(rt_kv_index_size(x, form), 3);
    }
    int32_t pre[2];
    rt_kv_index_match(x, h, 4, pre);
    assert_int_equal(pre[0], -1); /* no event source: the caller falls back */
    batch(&sb, false, "BlockRemoved", h + 1, 1);
    assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
    assert_int_equal(rt_kv_index_size(x, 0), 2);
    assert_int_equal(rt_kv_index_size(x, 1), 3); /* the other backend keeps block 2 */
    batch(&sb, true, "AllBlocksCleared", NULL, 0);
    assert_true(rt_kv_index_apply(x, 1, sb.data, sb.size));
    assert_int_equal(rt_kv_index_size(x, 1), 0);
    assert_int_equal(rt_kv_index_size(x, 0), 2);
    /* refused: not msgpack, not a batch, a backend out of range; nothing changes */
    assert_false(rt_kv_index_apply(x, 0, "\xc1", 1));
    assert_false(rt_kv_index_apply(x, 0, "\x93\x01\x02\x03", 4)); /* [1, 2, 3]: events is not an array */
    assert_false(rt_kv_index_apply(x, 0, "\x80", 1));
    batch(&sb, false, "BlockStored", h, 1);
    assert_false(rt_kv_index_apply(x, 5, sb.data, sb.size));
    assert_int_equal(rt_kv_index_size(x, 0), 2);
    msgpack_sbuffer_destroy(&sb);
    rt_kv_index_stop(x);
}

/* A block in the pool and in offload tiers ("CPU", "DISK") is one entry per medium: removing it from one
 * medium leaves the others (a backend holds it while any medium does). */
static void test_media(void **state) {
    (void)state;
    const char *eps[1] = {NULL};
    char why[128];
    rt_kv_index *x = rt_kv_index_start(eps, NULL, 1, why, sizeof why);
    assert_non_null(x);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    const uint64_t h[1] = {77};
    static const char *const media[3] = {"GPU", "CPU", "DISK"};
    for (int form = 0; form < 2; form++) {
        for (int m = 0; m < 3; m++) {
            g_medium = media[m];
            batch(&sb, form, "BlockStored", h, 1);
            assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
        }
        assert_int_equal(rt_kv_index_size(x, 0), 3);
        for (int m = 0; m < 3; m++) {
            g_medium = media[(m + form) % 3];
            batch(&sb, !form, "BlockRemoved", h, 1);
            assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
            assert_int_equal(rt_kv_index_size(x, 0), 2 - m);
        }
    }
    g_medium = NULL;
    msgpack_sbuffer_destroy(&sb);
    rt_kv_index_stop(x);
}

static void test_leading_run(void **state) {
    (void)state;
    /* a source makes match count: an endpoint nobody publishes on is fine for a SUB socket */
    const char *eps[2] = {"tcp://127.0.0.1:9", NULL};
    char why[128];
    rt_kv_index *x = rt_kv_index_start(eps, NULL, 2, why, sizeof why);
    assert_non_null(x);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    const uint64_t h[4] = {10, 11, 12, 13};
    batch(&sb, false, "BlockStored", h, 2);
    assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
    batch(&sb, false, "BlockStored", h + 3, 1);
    assert_true(rt_kv_index_apply(x, 0, sb.data, sb.size));
    int32_t pre[2];
    rt_kv_index_match(x, h, 4, pre);
    assert_int_equal(pre[0], 2); /* 10, 11 held; 12 missing stops the run before 13 */
    assert_int_equal(pre[1], -1);
    msgpack_sbuffer_destroy(&sb);
    rt_kv_index_stop(x);
    const char *bad[1] = {"nonsense://x"};
    assert_null(rt_kv_index_start(bad, NULL, 1, why, sizeof why));
    assert_non_null(strstr(why, "nonsense://x"));
}

/* n distinct free TCP ports (the probe sockets stay open until all are picked). */
static void free_tcp_ports(int *port, int n) {
    int fd[8];
    for (int i = 0; i < n; i++) {
        fd[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
        socklen_t len = sizeof a;
        assert_int_equal(bind(fd[i], (struct sockaddr *)&a, sizeof a), 0);
        assert_int_equal(getsockname(fd[i], (struct sockaddr *)&a, &len), 0);
        port[i] = ntohs(a.sin_port);
    }
    for (int i = 0; i < n; i++) close(fd[i]);
}

/* Forwards one multipart message from `from` to `to` (or drops it); false when none came in 50 ms. */
static bool relay_one(void *from, void *to, bool drop) {
    zmq_pollitem_t it = {.socket = from, .events = ZMQ_POLLIN};
    if (zmq_poll(&it, 1, 50) <= 0) return false;
    int more = 1;
    size_t ms = sizeof more;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        assert_true(zmq_msg_recv(&m, from, 0) >= 0);
        zmq_getsockopt(from, ZMQ_RCVMORE, &more, &ms);
        if (!drop) assert_true(zmq_msg_send(&m, to, more ? ZMQ_SNDMORE : 0) >= 0);
        else zmq_msg_close(&m);
    }
    return true;
}

/* The router's index against osprey's own publisher (src/kv/kv_events.c) with a batch lost on the way: a
 * relay between the publisher and two indexes drops one batch. The index given the publisher's replay
 * endpoint asks it for the missing batch and applies it before the next one (no gap counted, the block
 * it stored is held); the one without counts a gap and lacks the block. */
static void test_replay_fills_a_gap(void **state) {
    (void)state;
    char pub_ep[64], pub_bind[64], replay_ep[64], relay_ep[64];
    int port[3];
    free_tcp_ports(port, 3);
    snprintf(pub_ep, sizeof pub_ep, "tcp://127.0.0.1:%d", port[0]);
    snprintf(pub_bind, sizeof pub_bind, "tcp://*:%d", port[0]); /* '*': the publisher binds (vLLM's rule) */
    snprintf(replay_ep, sizeof replay_ep, "tcp://127.0.0.1:%d", port[1]);
    snprintf(relay_ep, sizeof relay_ep, "tcp://127.0.0.1:%d", port[2]);
    osp_kv_events_config cfg = osp_kv_events_default_config();
    cfg.enable_kv_cache_events = true;
    cfg.publisher_zmq = true;
    snprintf(cfg.endpoint, sizeof cfg.endpoint, "%s", pub_bind);
    snprintf(cfg.replay_endpoint, sizeof cfg.replay_endpoint, "%s", replay_ep);
    cfg.buffer_steps = 100;
    const osp_kv_publisher_params pp = {.block_size = 16, .medium = "GPU", .topic = "kv@test@m"};
    osp_kv_publisher *pub;
    if (osp_kv_publisher_create(&cfg, &pp, &pub) != OSP_OK) fail_msg("publisher: %s", osp_last_error());
    const osp_kv_event_sink *sink = osp_kv_publisher_sink(pub);
    void *ctx = zmq_ctx_new();
    void *in = zmq_socket(ctx, ZMQ_SUB), *out = zmq_socket(ctx, ZMQ_PUB);
    const int linger = 0;
    zmq_setsockopt(in, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(out, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_setsockopt(in, ZMQ_SUBSCRIBE, "", 0), 0);
    assert_int_equal(zmq_connect(in, pub_ep), 0);
    assert_int_equal(zmq_bind(out, relay_ep), 0);
    const char *eps[1] = {relay_ep}, *rps[1] = {replay_ep};
    char why[256];
    rt_kv_index *with = rt_kv_index_start(eps, rps, 1, why, sizeof why), *without = rt_kv_index_start(eps, NULL, 1, why, sizeof why);
    assert_non_null(with);
    assert_non_null(without);
    /* both ZeroMQ hops join late (PUB drops what no subscriber takes yet): publish until both indexes
       have seen a batch */
    int64_t nb[2], gaps[2], rep[2];
    for (uint64_t h = 1;; h++) {
        assert_true(h < 400);
        sink->block_stored(sink->ctx, h, false, 0, NULL, 0);
        sink->end_step(sink->ctx);
        while (relay_one(in, out, false)) {
        }
        rt_kv_index_counts(with, 0, &nb[0], &gaps[0], &rep[0]);
        rt_kv_index_counts(without, 0, &nb[1], &gaps[1], &rep[1]);
        if (nb[0] > 0 && nb[1] > 0) break;
    }
    const int64_t before[2] = {nb[0], nb[1]};
    sink->block_stored(sink->ctx, 1000, false, 0, NULL, 0); /* this batch is lost on the way */
    sink->end_step(sink->ctx);
    bool got = false;
    for (int i = 0; i < 100 && !got; i++) got = relay_one(in, out, true); /* up to 5 s on a loaded machine */
    assert_true(got);
    sink->block_stored(sink->ctx, 1001, false, 0, NULL, 0);
    sink->end_step(sink->ctx);
    got = false;
    for (int i = 0; i < 100 && !got; i++) got = relay_one(in, out, false);
    assert_true(got);
    for (int i = 0; i < 500; i++) { /* both take the batch after the gap (the replay waits up to 1 s) */
        rt_kv_index_counts(with, 0, &nb[0], &gaps[0], &rep[0]);
        rt_kv_index_counts(without, 0, &nb[1], &gaps[1], &rep[1]);
        if (nb[0] > before[0] && nb[1] > before[1]) break;
        usleep(10000);
    }
    assert_int_equal(nb[0], before[0] + 1);
    assert_int_equal(nb[1], before[1] + 1);
    const uint64_t h[2] = {1000, 1001};
    int32_t pre[1];
    rt_kv_index_match(with, h, 2, pre);
    assert_int_equal(pre[0], 2); /* 1000 came from the replay endpoint */
    assert_int_equal(gaps[0], 0);
    assert_int_equal(rep[0], 1);
    rt_kv_index_match(without, h, 2, pre);
    assert_int_equal(pre[0], 0); /* 1000 lost */
    assert_int_equal(gaps[1], 1);
    assert_int_equal(rep[1], 0);
    rt_kv_index_stop(with);
    rt_kv_index_stop(without);
    zmq_close(in);
    zmq_close(out);
    zmq_ctx_term(ctx);
    osp_kv_publisher_free(pub);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both_forms),
        cmocka_unit_test(test_leading_run),
        cmocka_unit_test(test_media),
        cmocka_unit_test(test_replay_fills_a_gap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
