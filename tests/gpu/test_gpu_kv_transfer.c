/* KV transfer between two engines (tests/unit/test_kv_transfer.c) with the KV pages on the CUDA device:
 * the producer's blocks held in its device arena (one batched device copy), the consumer's loaded into
 * its device pages, token for token against a co-located engine on the same device. In one process the
 * arena cannot be mapped (CUDA IPC refuses the exporting process), so those engines go over TCP, the
 * producer reading the arena out.
 *
 * Then CUDA IPC proper, between this process (the consumer) and a child running this binary again
 * (exec'd: a forked child of a process that has touched CUDA cannot use it), on the same GPU:
 *  - arena: the child's server holds blocks of known bytes in a cudaMalloc'd arena; this process maps
 *    it, copies the blocks device to device by the offsets it was answered, and gets them byte for byte;
 *    the mapping is opened once; a release frees the slots (a new hold fits without dropping anything);
 *    another device's UUID gets the bytes over TCP; a killed child fails the fetch cleanly (every block
 *    missing) and the mapping is closed.
 *  - engines: a producer engine in the child, a consumer engine here: the same tokens as a co-located
 *    engine (greedy and seeded), every block by IPC, the producer's copies released; a killed producer
 *    makes the consumer recompute (same tokens, blocks counted failed).
 * Skipped (77) without a CUDA device. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#define TEST_GPU_IPC 1
#include "../unit/test_kv_transfer.c"

#include "backend/cuda/cuda_ops.h"

/* ---- the child ------------------------------------------------------------------------------------ */

#define GSLOTS 4

static void *g_stream; /* this process's copies */

static osp_status dev_to_host(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    osp_status s = osp_cuda_d2h(dst, src, bytes, g_stream);
    if (s == OSP_OK) s = osp_cuda_stream_sync(g_stream);
    return s;
}

static osp_status dev_fill(void *ctx, int32_t n, void *const *dsts) {
    const int *seeds = ctx;
    uint8_t buf[BB];
    for (int32_t i = 0; i < n; i++) {
        fill(buf, seeds[i]);
        osp_status s = osp_cuda_h2d(dsts[i], buf, BB, g_stream);
        if (s == OSP_OK) s = osp_cuda_stream_sync(g_stream);
        if (s != OSP_OK) return s;
    }
    return OSP_OK;
}

/* --ipc-arena UP DOWN: producer_child's protocol (tests/unit/test_kv_transfer.c) over a device arena. */
static int child_arena(int up, int down) {
    if (osp_cuda_stream_create(&g_stream) != OSP_OK) return 1;
    osp_kv_xfer_device d = {.bytes = GSLOTS * BB, .to_host = dev_to_host};
    if (osp_cuda_malloc(&d.base, d.bytes, "test arena") != OSP_OK || osp_cuda_ipc_handle(d.base, d.handle) != OSP_OK ||
        osp_cuda_device_uuid(d.uuid) != OSP_OK)
        return 1;
    const osp_kv_xfer_server_config c = {.ip = "127.0.0.1", .block_bytes = BB, .engine_id = 42, .cap_bytes = 16 * BB,
                                         .timeout_s = 60, .io_timeout_s = 2, .device = &d};
    osp_kv_xfer_server *s = NULL;
    if (osp_kv_xfer_server_create(&c, &s) != OSP_OK) return 1;
    const osp_block_hash h[3] = {hash_of(0), hash_of(1), hash_of(2)};
    int seeds[3] = {0, 1, 2};
    osp_status err;
    const uint64_t id = osp_kv_xfer_server_hold_device(s, h, 3, dev_fill, seeds, &err);
    const int32_t port = osp_kv_xfer_server_port(s);
    if (write(up, &port, sizeof port) != sizeof port || write(up, &id, sizeof id) != sizeof id) return 1;
    char cmd;
    while (read(down, &cmd, 1) == 1 && cmd != 'q') {
        if (cmd == 'h') {
            const osp_block_hash h2[3] = {hash_of(10), hash_of(11), hash_of(12)};
            int seeds2[3] = {10, 11, 12};
            const uint64_t id2 = osp_kv_xfer_server_hold_device(s, h2, 3, dev_fill, seeds2, &err);
            if (write(up, &id2, sizeof id2) != sizeof id2) return 1;
        } else if (cmd == 's') {
            const osp_kv_xfer_server_stats st = osp_kv_xfer_server_get_stats(s);
            if (write(up, &st, sizeof st) != sizeof st) return 1;
        }
    }
    osp_kv_xfer_server_destroy(s);
    osp_cuda_free(d.base);
    return 0;
}

static void engine_prompt(int32_t *prompt) {
    srand(5);
    for (int i = 0; i < 90; i++) prompt[i] = 3 + rand() % 500;
}

/* --ipc-engine UP DOWN MODEL: a producer engine; 'g' / 'r' (greedy / seeded at 0.8) runs the prompt with
 * do_remote_decode and writes the consumer's osp_kv_transfer_params; 's' writes its osp_engine_stats. */
static int child_engine(int up, int down, const char *model) {
    snprintf(g_tiny, sizeof g_tiny, "%s", model);
    osp_engine *prod = NULL;
    osp_engine_params pp = base(OSP_KV_ROLE_PRODUCER, 11);
    if (osp_engine_create(&pp, &prod) != OSP_OK) return 1;
    int32_t prompt[90];
    engine_prompt(prompt);
    const osp_kv_transfer_params decode_there = {.do_remote_decode = true};
    char cmd;
    while (read(down, &cmd, 1) == 1 && cmd != 'q') {
        if (cmd == 'g' || cmd == 'r') {
            const run pr = run_one(prod, prompt, 90, 1, cmd == 'r' ? 0.8f : 0.0f, &decode_there);
            const osp_kv_transfer_params t = answer(prod, &pr);
            if (write(up, &t, sizeof t) != sizeof t) return 1;
        } else if (cmd == 's') {
            const osp_engine_stats st = osp_engine_get_stats(prod);
            if (write(up, &st, sizeof st) != sizeof st) return 1;
        }
    }
    osp_engine_free(prod);
    return 0;
}

static int gpu_ipc_child(int argc, char **argv) {
    if (argc < 4) return 2;
    const int up = atoi(argv[2]), down = atoi(argv[3]);
    if (!strcmp(argv[1], "--ipc-arena")) return child_arena(up, down);
    if (!strcmp(argv[1], "--ipc-engine") && argc >= 5) return child_engine(up, down, argv[4]);
    return 2;
}

/* ---- this process: the consumer ------------------------------------------------------------------ */

typedef struct kid {
    pid_t pid;
    int up, down; /* its answers, our commands */
} kid;

static kid spawn(const char *mode, const char *extra) {
    int upf[2], downf[2];
    assert_int_equal(pipe(upf), 0);
    assert_int_equal(pipe(downf), 0);
    kid k = {.up = upf[0], .down = downf[1]};
    k.pid = fork();
    assert_true(k.pid >= 0);
    if (k.pid == 0) {
        close(upf[0]), close(downf[1]);
        char a[16], b[16];
        snprintf(a, sizeof a, "%d", upf[1]);
        snprintf(b, sizeof b, "%d", downf[0]);
        execl("/proc/self/exe", "test_gpu_kv_transfer", mode, a, b, extra, (char *)NULL);
        _exit(127);
    }
    close(upf[1]), close(downf[0]);
    return k;
}

static void kid_end(kid *k, bool kill_it) {
    if (kill_it) kill(k->pid, SIGKILL);
    else assert_int_equal(write(k->down, "q", 1), 1);
    int st = 0;
    waitpid(k->pid, &st, 0);
    if (!kill_it) assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(k->up), close(k->down);
}

static osp_kv_xfer_server_stats arena_stats(const kid *k) { return child_stats(k->up, k->down); }

static osp_status map_open(void *ctx, const uint8_t handle[OSP_KV_XFER_HANDLE_BYTES], void **base) {
    (void)ctx;
    const osp_status s = osp_cuda_ipc_open(handle, base);
    if (s == OSP_OK) g_opens++;
    return s;
}

static void map_close(void *ctx, void *base) {
    (void)ctx;
    osp_cuda_ipc_close(base);
    g_closes++;
}

typedef struct dev_sink {
    uint8_t *d_pages; /* [n * BB] device: what the "pages" received */
    int calls;
} dev_sink;

static osp_status dev_write(void *wctx, int32_t n, const void *const *srcs) {
    dev_sink *k = wctx;
    k->calls++;
    void *dsts[8];
    const void *from[8];
    size_t bytes[8];
    int32_t m = 0;
    for (int32_t i = 0; i < n && m < 8; i++)
        if (srcs[i]) dsts[m] = k->d_pages + (size_t)i * BB, from[m] = srcs[i], bytes[m++] = BB;
    return osp_cuda_copy_many_d2d(m, dsts, from, bytes, g_stream); /* the copy kernel, over the mapping */
}

static void pages_to_host(const dev_sink *k, uint8_t *host, int n) {
    assert_int_equal(osp_cuda_d2h(host, k->d_pages, (size_t)n * BB, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(g_stream), OSP_OK);
}

static osp_kv_xfer_peers *cuda_peers(bool other_device) {
    osp_kv_xfer_ipc xi = {.open = map_open, .close = map_close};
    assert_int_equal(osp_cuda_device_uuid(xi.uuid), OSP_OK);
    if (other_device) xi.uuid[0] ^= 0xff;
    osp_kv_xfer_peers *p = NULL;
    assert_int_equal(osp_kv_xfer_peers_create(&xi, &p), OSP_OK);
    return p;
}

static void test_gpu_ipc_arena(void **state) {
    (void)state;
    if (!g_stream) assert_int_equal(osp_cuda_stream_create(&g_stream), OSP_OK);
    g_opens = g_closes = 0;
    kid k = spawn("--ipc-arena", NULL);
    int32_t port;
    uint64_t id;
    assert_int_equal(read(k.up, &port, sizeof port), (ssize_t)sizeof port);
    assert_int_equal(read(k.up, &id, sizeof id), (ssize_t)sizeof id);
    assert_true(id != 0);
    assert_int_equal(arena_stats(&k).held_device_blocks, 3);
    dev_sink sink = {0};
    assert_int_equal(osp_cuda_malloc((void **)&sink.d_pages, 4 * BB, "test pages"), OSP_OK);
    assert_int_equal(osp_cuda_memset(sink.d_pages, 0, 4 * BB, g_stream), OSP_OK);
    osp_kv_xfer_peers *peers = cuda_peers(false);
    const osp_block_hash ask[4] = {hash_of(2), hash_of(0), hash_of(99), hash_of(1)};
    const int seeds[4] = {2, 0, -1, 1};
    uint8_t *dst = calloc(4, BB), *got = calloc(4, BB);
    osp_kv_read_result res[4];
    bool via = false;
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", port, 42, id, BB, ask, 4, false, 2, dev_write, &sink, dst,
                                           res, &via), OSP_OK);
    assert_true(via);
    pages_to_host(&sink, got, 4);
    check_seeds(got, seeds, res, 4);
    assert_int_equal(g_opens, 1);
    assert_int_equal(arena_stats(&k).ipc_blocks, 3);
    /* again, with the release: the mapping is reused, the slots come free */
    assert_int_equal(osp_cuda_memset(sink.d_pages, 0, 4 * BB, g_stream), OSP_OK);
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", port, 42, id, BB, ask, 4, true, 2, dev_write, &sink, dst,
                                           res, &via), OSP_OK);
    assert_true(via);
    pages_to_host(&sink, got, 4);
    check_seeds(got, seeds, res, 4);
    assert_int_equal(g_opens, 1);
    for (int i = 0; i < 100 && arena_stats(&k).held > 0; i++) sleep_s(0.02);
    osp_kv_xfer_server_stats st = arena_stats(&k);
    assert_int_equal(st.held_device_blocks, 0);
    assert_int_equal(st.released, 1);
    assert_int_equal(write(k.down, "h", 1), 1);
    uint64_t id2;
    assert_int_equal(read(k.up, &id2, sizeof id2), (ssize_t)sizeof id2);
    assert_true(id2 != 0);
    st = arena_stats(&k);
    assert_int_equal(st.held_device_blocks, 3);
    assert_int_equal(st.dropped, 0);
    /* another device: over TCP, read out of the arena by the producer */
    osp_kv_xfer_peers *other = cuda_peers(true);
    const osp_block_hash ask2[2] = {hash_of(11), hash_of(10)};
    const int seeds2[2] = {11, 10};
    sink.calls = 0;
    assert_int_equal(osp_kv_xfer_fetch_ipc(other, "127.0.0.1", port, 42, id2, BB, ask2, 2, false, 2, dev_write, &sink,
                                           dst, res, &via), OSP_OK);
    assert_false(via);
    assert_int_equal(sink.calls, 0);
    check_seeds(dst, seeds2, res, 2);
    osp_kv_xfer_peers_destroy(other);
    /* the producer killed: a clean failure, nothing written, the mapping closed */
    kid_end(&k, true);
    sink.calls = 0;
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", port, 42, id2, BB, ask2, 2, true, 1, dev_write, &sink,
                                           dst, res, &via), OSP_ERR_IO);
    assert_false(via);
    assert_int_equal(sink.calls, 0);
    assert_int_equal(res[0], OSP_KV_READ_MISSING);
    assert_int_equal(res[1], OSP_KV_READ_MISSING);
    assert_int_equal(osp_kv_xfer_peers_mapped(peers), 0);
    assert_int_equal(g_closes, 1);
    osp_kv_xfer_peers_destroy(peers);
    osp_cuda_free(sink.d_pages);
    free(dst);
    free(got);
}

static void test_gpu_ipc_engines(void **state) {
    (void)state;
    kid k = spawn("--ipc-engine", g_tiny);
    int32_t prompt[90];
    engine_prompt(prompt);
    osp_engine *cons, *ref;
    osp_engine_params cp = base(OSP_KV_ROLE_CONSUMER, 11), rp = base(OSP_KV_ROLE_NONE, 11);
    assert_int_equal(osp_engine_create(&cp, &cons), OSP_OK);
    assert_int_equal(osp_engine_create(&rp, &ref), OSP_OK);
    osp_engine_stats pst;
    for (int sampled = 0; sampled < 2; sampled++) {
        const float temp = sampled ? 0.8f : 0.0f;
        const run want = run_one(ref, prompt, 90, 12, temp, NULL);
        assert_int_equal(write(k.down, sampled ? "r" : "g", 1), 1);
        osp_kv_transfer_params t;
        assert_int_equal(read(k.up, &t, sizeof t), (ssize_t)sizeof t);
        assert_true(t.remote_request_id != 0);
        assert_int_equal(t.remote_num_blocks, 90 / 16);
        const osp_engine_stats before = osp_engine_get_stats(cons);
        const run got = run_one(cons, prompt, 90, 12, temp, &t);
        assert_int_equal(got.n_out, 12);
        assert_memory_equal(got.out, want.out, sizeof want.out[0] * 12);
        const osp_engine_stats after = osp_engine_get_stats(cons);
        assert_int_equal(after.kv_transfer_recv_blocks - before.kv_transfer_recv_blocks, 5);
        assert_int_equal(after.kv_transfer_ipc_blocks - before.kv_transfer_ipc_blocks, 5);
        assert_int_equal(after.kv_transfer_failed_blocks, 0);
        assert_int_equal(got.cached, 5 * 16);
        for (int i = 0; i < 100; i++) { /* released at the consumer's done */
            assert_int_equal(write(k.down, "s", 1), 1);
            assert_int_equal(read(k.up, &pst, sizeof pst), (ssize_t)sizeof pst);
            if (pst.kv_transfer_held == 0) break;
            sleep_s(0.02);
        }
        assert_int_equal(pst.kv_transfer_held, 0);
        osp_engine_free(cons); /* its own prefix cache would serve the next one */
        assert_int_equal(osp_engine_create(&cp, &cons), OSP_OK);
    }
    assert_int_equal(pst.kv_transfer_ipc_blocks, 10);
    /* the producer killed after it held the prompt: the consumer recomputes, the same tokens */
    const run want = run_one(ref, prompt, 90, 12, 0, NULL);
    assert_int_equal(write(k.down, "g", 1), 1);
    osp_kv_transfer_params t;
    assert_int_equal(read(k.up, &t, sizeof t), (ssize_t)sizeof t);
    kid_end(&k, true);
    const run got = run_one(cons, prompt, 90, 12, 0, &t);
    assert_memory_equal(got.out, want.out, sizeof want.out[0] * 12);
    assert_int_equal(osp_engine_get_stats(cons).kv_transfer_failed_blocks, 5);
    assert_int_equal(osp_engine_get_stats(cons).kv_transfer_recv_blocks, 0);
    assert_int_equal(osp_engine_check_invariants(cons), OSP_OK);
    osp_engine_free(cons);
    osp_engine_free(ref);
}

static int gpu_ipc_tests(void) {
    const struct CMUnitTest ipc[] = {
        cmocka_unit_test(test_gpu_ipc_arena),
        cmocka_unit_test(test_gpu_ipc_engines),
    };
    const int rc = cmocka_run_group_tests(ipc, NULL, NULL);
    osp_cuda_stream_destroy(g_stream);
    return rc;
}
