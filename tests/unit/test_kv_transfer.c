/* KV block transfer for prefill/decode disaggregation (src/kv/transfer.h, src/engine/offload.h).
 *
 * The protocol on loopback: held blocks come back byte for byte by hash, in any order, with the ones a
 * transfer does not hold reported missing; another engine id or block size and an unknown transfer are
 * refused with a message saying which; a release frees the copies (a later fetch finds no transfer);
 * an unpulled transfer is dropped at its timeout and the oldest are pushed out by new ones past the
 * buffer's size; a malformed request is answered and counted, and the server goes on serving; a fetch
 * from a port nobody listens on fails cleanly.
 *
 * Two engines in one process (tiny f32 model): a producer computes a prompt with do_remote_decode and
 * returns a transfer id with its full blocks; a consumer given that id loads them, computes only the
 * rest, and gives exactly the tokens of a co-located engine (greedy and seeded sampling); the producer's
 * copies are released after the pull. A producer that cannot be reached, one with another hash seed
 * (another engine id) and a transfer already released all make the consumer recompute: same tokens,
 * the blocks counted as failed. Requests the roles do not allow are refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <cmocka.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu_test_models.h"
#include "kv/transfer.h"
#include "osprey/engine.h"

/* tests/gpu/test_gpu_kv_transfer.c compiles this file again with TEST_DEVICE OSP_DEVICE_CUDA: the
 * engines' pages on the GPU (blocks copied to the host to be held, and back after the fetch). */
#ifndef TEST_DEVICE
#define TEST_DEVICE OSP_DEVICE_CPU
#endif
static const bool g_gpu = TEST_DEVICE == OSP_DEVICE_CUDA;
static char g_tiny[512];

#define BB 4096

static void fill(uint8_t *p, int seed) {
    for (int i = 0; i < BB; i++) p[i] = (uint8_t)(seed * 131 + i * 7);
}

static osp_block_hash hash_of(int k) { return (osp_block_hash){.lo = 1000u + (uint64_t)k, .hi = 7, .ext = {3, (uint64_t)k}}; }

static osp_status read_block(void *ctx, int32_t i, void *dst) {
    const int *seeds = ctx;
    fill(dst, seeds[i]);
    return OSP_OK;
}

static osp_kv_xfer_server *server(size_t cap_blocks, double timeout_s) {
    const osp_kv_xfer_server_config c = {.ip = "127.0.0.1", .port = 0, .block_bytes = BB, .engine_id = 42,
                                         .cap_bytes = cap_blocks * BB, .timeout_s = timeout_s, .io_timeout_s = 2};
    osp_kv_xfer_server *s = NULL;
    assert_int_equal(osp_kv_xfer_server_create(&c, &s), OSP_OK);
    assert_true(osp_kv_xfer_server_port(s) > 0);
    return s;
}

static uint64_t hold3(osp_kv_xfer_server *s, int first) {
    const osp_block_hash h[3] = {hash_of(first), hash_of(first + 1), hash_of(first + 2)};
    int seeds[3] = {first, first + 1, first + 2};
    osp_status err;
    const uint64_t id = osp_kv_xfer_server_hold(s, h, 3, read_block, seeds, &err);
    assert_int_equal(err, OSP_OK);
    return id;
}

static void test_protocol(void **state) {
    (void)state;
    osp_kv_xfer_server *s = server(16, 60);
    const int port = osp_kv_xfer_server_port(s);
    const uint64_t id = hold3(s, 0);
    assert_true(id != 0);
    /* blocks 2, 0, an unknown one, 1: found by hash in any order */
    const osp_block_hash ask[4] = {hash_of(2), hash_of(0), hash_of(99), hash_of(1)};
    uint8_t *dst = malloc(4 * BB), want[BB];
    osp_kv_read_result res[4];
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id, BB, ask, 4, false, 2, dst, res), OSP_OK);
    const int seeds[4] = {2, 0, -1, 1};
    for (int i = 0; i < 4; i++) {
        if (seeds[i] < 0) {
            assert_int_equal(res[i], OSP_KV_READ_MISSING);
            continue;
        }
        assert_int_equal(res[i], OSP_KV_READ_OK);
        fill(want, seeds[i]);
        assert_memory_equal(dst + (size_t)i * BB, want, BB);
    }
    osp_kv_xfer_server_stats st = osp_kv_xfer_server_get_stats(s);
    assert_int_equal(st.sent_blocks, 3);
    assert_int_equal(st.held, 1);
    assert_int_equal(st.held_blocks, 3);
    /* refusals: another engine id, another block size, an unknown transfer */
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 43, id, BB, ask, 1, false, 2, dst, res), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "another engine id"));
    assert_int_equal(res[0], OSP_KV_READ_MISSING);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id, BB / 2, ask, 1, false, 2, dst, res), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id + 1, BB, ask, 1, false, 2, dst, res), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "no such transfer"));
    assert_int_equal(osp_kv_xfer_server_get_stats(s).bad_requests, 2);
    /* the last fetch releases: the copies are gone */
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id, BB, ask, 1, true, 2, dst, res), OSP_OK);
    assert_int_equal(res[0], OSP_KV_READ_OK);
    st = osp_kv_xfer_server_get_stats(s);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.held_blocks, 0);
    assert_int_equal(st.released, 1);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id, BB, ask, 1, false, 2, dst, res), OSP_ERR_INVALID_ARG);
    /* a release alone (n = 0) */
    const uint64_t id2 = hold3(s, 10);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id2, BB, NULL, 0, true, 2, NULL, NULL), OSP_OK);
    assert_int_equal(osp_kv_xfer_server_get_stats(s).held, 0);
    /* a release alone from a proxy that knows no block size (0); another engine id is still refused */
    const uint64_t id3 = hold3(s, 20);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 41, id3, 0, NULL, 0, true, 2, NULL, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_xfer_server_get_stats(s).held, 1);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id3, 0, NULL, 0, true, 2, NULL, NULL), OSP_OK);
    assert_int_equal(osp_kv_xfer_server_get_stats(s).held, 0);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id3, 0, ask, 1, false, 2, dst, res), OSP_ERR_INVALID_ARG);
    free(dst);
    osp_kv_xfer_server_destroy(s);
}

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void test_drops(void **state) {
    (void)state;
    /* room for 4 blocks: a second transfer of 3 pushes the first out */
    osp_kv_xfer_server *s = server(4, 60);
    const int port = osp_kv_xfer_server_port(s);
    const uint64_t a = hold3(s, 0), b = hold3(s, 3);
    assert_true(a != 0 && b != 0 && a != b);
    osp_kv_xfer_server_stats st = osp_kv_xfer_server_get_stats(s);
    assert_int_equal(st.held, 1);
    assert_int_equal(st.dropped, 1);
    uint8_t *dst = malloc(BB);
    osp_kv_read_result res[1];
    const osp_block_hash h0 = hash_of(0), h3 = hash_of(3);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, a, BB, &h0, 1, false, 2, dst, res), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, b, BB, &h3, 1, false, 2, dst, res), OSP_OK);
    assert_int_equal(res[0], OSP_KV_READ_OK);
    /* more than the whole buffer: nothing held */
    const osp_block_hash h5[5] = {hash_of(0), hash_of(1), hash_of(2), hash_of(3), hash_of(4)};
    int seeds[5] = {0, 1, 2, 3, 4};
    osp_status err;
    assert_int_equal(osp_kv_xfer_server_hold(s, h5, 5, read_block, seeds, &err), 0);
    assert_int_equal(err, OSP_OK);
    osp_kv_xfer_server_destroy(s);
    /* a transfer nobody pulls is dropped at its timeout (the serving thread sweeps every 200 ms) */
    s = server(16, 0.2);
    hold3(s, 0);
    for (int i = 0; i < 100 && osp_kv_xfer_server_get_stats(s).held > 0; i++) sleep_s(0.05);
    st = osp_kv_xfer_server_get_stats(s);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.dropped, 1);
    osp_kv_xfer_server_destroy(s);
    free(dst);
}

static void test_malformed_and_unreachable(void **state) {
    (void)state;
    osp_kv_xfer_server *s = server(16, 60);
    const int port = osp_kv_xfer_server_port(s);
    const uint64_t id = hold3(s, 0);
    /* garbage: answered (status 3) and counted; a request cut short: dropped */
    for (int k = 0; k < 2; k++) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
        char junk[64];
        memset(junk, k ? 'O' : 'x', sizeof junk);
        const size_t n = k ? 10 : sizeof junk; /* 10 bytes: shorter than a header */
        assert_int_equal(send(fd, junk, n, 0), (ssize_t)n);
        shutdown(fd, SHUT_WR);
        char back[32];
        const ssize_t got = recv(fd, back, sizeof back, 0);
        if (k == 0) {
            assert_int_equal(got, 16);
            assert_memory_equal(back, "OSPKVR01", 8);
        } else {
            assert_int_equal(got, 0);
        }
        close(fd);
    }
    assert_int_equal(osp_kv_xfer_server_get_stats(s).bad_requests, 1);
    /* a client that sends one byte and stalls holds only its own connection: others are answered */
    const int stall = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    assert_int_equal(connect(stall, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(send(stall, "O", 1, 0), 1);
    /* still serving */
    uint8_t *dst = malloc(BB);
    osp_kv_read_result res[1];
    const osp_block_hash h = hash_of(1);
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id, BB, &h, 1, false, 2, dst, res), OSP_OK);
    assert_int_equal(res[0], OSP_KV_READ_OK);
    osp_kv_xfer_server_destroy(s); /* returns once the stalled connection's deadline (2 s) ends it */
    close(stall);
    /* a producer that answers a valid header, then trickles: the fetch ends by its deadline */
    const int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in la = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &la.sin_addr);
    assert_int_equal(bind(lfd, (struct sockaddr *)&la, sizeof la), 0);
    assert_int_equal(listen(lfd, 4), 0);
    socklen_t ll = sizeof la;
    getsockname(lfd, (struct sockaddr *)&la, &ll);
    const pid_t child = fork();
    if (child == 0) {
        const int c = accept(lfd, NULL, NULL);
        char req[40 + 32];
        recv(c, req, sizeof req, MSG_WAITALL);
        uint8_t hdr[16] = "OSPKVR01";
        hdr[12] = 1; /* status 0, n = 1 */
        send(c, hdr, sizeof hdr, 0);
        send(c, "\1", 1, 0); /* found */
        for (;;) { /* then a byte every 100 ms, until killed: never the whole block */
            if (send(c, "x", 1, MSG_NOSIGNAL) != 1) _exit(0);
            sleep_s(0.1);
        }
    }
    /* it returns (ended by its deadline, 2 x 0.5 s plus the payload's time: without one it would wait for
       ever, each byte resetting the stall limit) */
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", ntohs(la.sin_port), 42, id, BB, &h, 1, false, 0.5, dst, res), OSP_ERR_IO);
    assert_int_equal(res[0], OSP_KV_READ_MISSING);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    close(lfd);
    /* nobody listens there now */
    assert_int_equal(osp_kv_xfer_fetch("127.0.0.1", port, 42, id, BB, &h, 1, false, 2, dst, res), OSP_ERR_IO);
    assert_int_equal(res[0], OSP_KV_READ_MISSING);
    assert_int_equal(osp_kv_xfer_fetch("no-such-host.invalid", port, 42, id, BB, &h, 1, false, 2, dst, res), OSP_ERR_IO);
    /* bad listening settings */
    osp_kv_xfer_server_config c = {.ip = "127.0.0.1", .port = 70000, .block_bytes = BB, .cap_bytes = BB};
    osp_kv_xfer_server *t = NULL;
    assert_int_equal(osp_kv_xfer_server_create(&c, &t), OSP_ERR_INVALID_ARG);
    c.port = 0;
    c.ip = "203.0.113.77"; /* TEST-NET-3: not an address of this machine */
    assert_int_equal(osp_kv_xfer_server_create(&c, &t), OSP_ERR_IO);
    assert_null(t);
    free(dst);
}

/* ---- the CUDA IPC protocol without a GPU ----------------------------------------------------------
 * The "device arena" is a shared anonymous mapping made before fork: the producer (a child process)
 * holds blocks in its slots, and the consumer's "mapping" of the handle is the same mapping. Everything
 * but the device copies themselves runs as on the GPU: offsets instead of payloads, the done byte, the
 * release that frees the slots, the fallbacks to TCP, a killed producer. */

#define SLOTS 4
static uint8_t *g_arena; /* [SLOTS * BB], shared with the child */
static int g_opens, g_closes;

static osp_status arena_to_host(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
    return OSP_OK;
}

static osp_status fill_slots(void *ctx, int32_t n, void *const *dsts) {
    const int *seeds = ctx;
    for (int32_t i = 0; i < n; i++) fill(dsts[i], seeds[i]);
    return OSP_OK;
}

static osp_status open_arena(void *ctx, const uint8_t handle[OSP_KV_XFER_HANDLE_BYTES], void **base) {
    const bool refuse = ctx != NULL;
    if (refuse || memcmp(handle, "SHMARENA", 8) != 0) return OSP_ERR_INTERNAL; /* another IPC namespace, say */
    g_opens++;
    *base = g_arena;
    return OSP_OK;
}

static void close_arena(void *ctx, void *base) {
    (void)ctx;
    if (base == g_arena) g_closes++;
}

typedef struct ipc_sink {
    uint8_t *out; /* [n * BB]: what the consumer's "pages" received */
    int calls;
} ipc_sink;

static osp_status write_pages(void *wctx, int32_t n, const void *const *srcs) {
    ipc_sink *k = wctx;
    k->calls++;
    for (int32_t i = 0; i < n; i++)
        if (srcs[i]) memcpy(k->out + (size_t)i * BB, srcs[i], BB);
    return OSP_OK;
}

static osp_kv_xfer_device arena_dev(const char *uuid_char) {
    osp_kv_xfer_device d = {.base = g_arena, .bytes = SLOTS * BB, .to_host = arena_to_host};
    memcpy(d.handle, "SHMARENA", 8);
    memset(d.uuid, uuid_char[0], sizeof d.uuid);
    return d;
}

static osp_kv_xfer_peers *peers_on(char uuid_char, bool refuse) {
    osp_kv_xfer_ipc xi = {.open = open_arena, .close = close_arena, .ctx = refuse ? (void *)1 : NULL};
    memset(xi.uuid, uuid_char, sizeof xi.uuid);
    osp_kv_xfer_peers *p = NULL;
    assert_int_equal(osp_kv_xfer_peers_create(&xi, &p), OSP_OK);
    return p;
}

/* The producer child: a server with the shared arena, 3 blocks held there (seeds 0..2); writes its port
 * and the transfer id to `up`, then answers commands from `down`: 'h' holds 3 more (seeds 10..12) and
 * writes the id, 's' writes its stats, 'q' ends. */
static void producer_child(int up, int down) {
    const osp_kv_xfer_device d = arena_dev("U");
    const osp_kv_xfer_server_config c = {.ip = "127.0.0.1", .block_bytes = BB, .engine_id = 42, .cap_bytes = 16 * BB,
                                         .timeout_s = 60, .io_timeout_s = 2, .device = &d};
    osp_kv_xfer_server *s = NULL;
    if (osp_kv_xfer_server_create(&c, &s) != OSP_OK) _exit(1);
    const osp_block_hash h[3] = {hash_of(0), hash_of(1), hash_of(2)};
    int seeds[3] = {0, 1, 2};
    osp_status err;
    const uint64_t id = osp_kv_xfer_server_hold_device(s, h, 3, fill_slots, seeds, &err);
    const int32_t port = osp_kv_xfer_server_port(s);
    if (write(up, &port, sizeof port) != sizeof port || write(up, &id, sizeof id) != sizeof id) _exit(1);
    char cmd;
    while (read(down, &cmd, 1) == 1 && cmd != 'q') {
        if (cmd == 'h') {
            const osp_block_hash h2[3] = {hash_of(10), hash_of(11), hash_of(12)};
            int seeds2[3] = {10, 11, 12};
            const uint64_t id2 = osp_kv_xfer_server_hold_device(s, h2, 3, fill_slots, seeds2, &err);
            if (write(up, &id2, sizeof id2) != sizeof id2) _exit(1);
        } else if (cmd == 's') {
            const osp_kv_xfer_server_stats st = osp_kv_xfer_server_get_stats(s);
            if (write(up, &st, sizeof st) != sizeof st) _exit(1);
        }
    }
    osp_kv_xfer_server_destroy(s);
    _exit(0);
}

static osp_kv_xfer_server_stats child_stats(int up, int down) {
    osp_kv_xfer_server_stats st;
    assert_int_equal(write(down, "s", 1), 1);
    assert_int_equal(read(up, &st, sizeof st), (ssize_t)sizeof st);
    return st;
}

static void check_seeds(const uint8_t *got, const int *seeds, const osp_kv_read_result *res, int n) {
    uint8_t want[BB];
    for (int i = 0; i < n; i++) {
        if (seeds[i] < 0) {
            assert_int_equal(res[i], OSP_KV_READ_MISSING);
            continue;
        }
        assert_int_equal(res[i], OSP_KV_READ_OK);
        fill(want, seeds[i]);
        assert_memory_equal(got + (size_t)i * BB, want, BB);
    }
}

static void test_ipc_protocol(void **state) {
    (void)state;
    g_arena = mmap(NULL, SLOTS * BB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(g_arena != MAP_FAILED);
    int upf[2], downf[2];
    assert_int_equal(pipe(upf), 0);
    assert_int_equal(pipe(downf), 0);
    const pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        close(upf[0]), close(downf[1]);
        producer_child(upf[1], downf[0]);
    }
    close(upf[1]), close(downf[0]);
    const int up = upf[0], down = downf[1];
    int32_t port;
    uint64_t id;
    assert_int_equal(read(up, &port, sizeof port), (ssize_t)sizeof port);
    assert_int_equal(read(up, &id, sizeof id), (ssize_t)sizeof id);
    assert_true(id != 0);
    osp_kv_xfer_server_stats st = child_stats(up, down);
    assert_int_equal(st.held_device_blocks, 3);

    /* same device, another process: by offsets, straight into the "pages", byte for byte; dst untouched */
    osp_kv_xfer_peers *peers = peers_on('U', false);
    const osp_block_hash ask[4] = {hash_of(2), hash_of(0), hash_of(99), hash_of(1)};
    const int seeds[4] = {2, 0, -1, 1};
    uint8_t *dst = calloc(4, BB), *pages = calloc(4, BB);
    ipc_sink sink = {.out = pages};
    osp_kv_read_result res[4];
    bool via = false;
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", port, 42, id, BB, ask, 4, false, 2, write_pages, &sink,
                                           dst, res, &via), OSP_OK);
    assert_true(via);
    assert_int_equal(sink.calls, 1);
    check_seeds(pages, seeds, res, 4);
    for (int i = 0; i < 4 * BB; i++) assert_int_equal(dst[i], 0);
    assert_int_equal(g_opens, 1);
    assert_int_equal(osp_kv_xfer_peers_mapped(peers), 1);
    st = child_stats(up, down);
    assert_int_equal(st.ipc_blocks, 3);
    assert_int_equal(st.held, 1);
    /* the last fetch releases once the consumer is done: the slots are free again (a hold of 3 more into the
       4 slots drops nothing); the mapping is reused */
    memset(pages, 0, 4 * BB);
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", port, 42, id, BB, ask, 4, true, 2, write_pages, &sink,
                                           dst, res, &via), OSP_OK);
    assert_true(via);
    check_seeds(pages, seeds, res, 4);
    assert_int_equal(g_opens, 1);
    for (int i = 0; i < 100 && child_stats(up, down).held > 0; i++) sleep_s(0.02);
    st = child_stats(up, down);
    assert_int_equal(st.held, 0);
    assert_int_equal(st.held_device_blocks, 0);
    assert_int_equal(st.released, 1);
    assert_int_equal(write(down, "h", 1), 1);
    uint64_t id2;
    assert_int_equal(read(up, &id2, sizeof id2), (ssize_t)sizeof id2);
    assert_true(id2 != 0);
    st = child_stats(up, down);
    assert_int_equal(st.held_device_blocks, 3);
    assert_int_equal(st.dropped, 0);

    /* a consumer on another device: the payload over TCP, read out of the arena */
    osp_kv_xfer_peers *other = peers_on('V', false);
    const osp_block_hash ask2[2] = {hash_of(11), hash_of(10)};
    const int seeds2[2] = {11, 10};
    sink.calls = 0;
    assert_int_equal(osp_kv_xfer_fetch_ipc(other, "127.0.0.1", port, 42, id2, BB, ask2, 2, false, 2, write_pages, &sink,
                                           dst, res, &via), OSP_OK);
    assert_false(via);
    assert_int_equal(sink.calls, 0);
    check_seeds(dst, seeds2, res, 2);
    osp_kv_xfer_peers_destroy(other);
    /* an arena that does not map here: asked again over TCP (the release with it), not offered again */
    osp_kv_xfer_peers *refusing = peers_on('U', true);
    memset(dst, 0, 4 * BB);
    assert_int_equal(osp_kv_xfer_fetch_ipc(refusing, "127.0.0.1", port, 42, id2, BB, ask2, 2, true, 2, write_pages, &sink,
                                           dst, res, &via), OSP_OK);
    assert_false(via);
    check_seeds(dst, seeds2, res, 2);
    assert_int_equal(osp_kv_xfer_peers_mapped(refusing), 0);
    for (int i = 0; i < 100 && child_stats(up, down).held > 0; i++) sleep_s(0.02);
    assert_int_equal(child_stats(up, down).held_device_blocks, 0);
    osp_kv_xfer_peers_destroy(refusing);

    /* a killed producer: a clean failure, every block missing, its mapping dropped */
    assert_int_equal(write(down, "h", 1), 1);
    assert_int_equal(read(up, &id2, sizeof id2), (ssize_t)sizeof id2);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    sink.calls = 0;
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", port, 42, id2, BB, ask2, 2, true, 1, write_pages, &sink,
                                           dst, res, &via), OSP_ERR_IO);
    assert_false(via);
    assert_int_equal(sink.calls, 0);
    assert_int_equal(res[0], OSP_KV_READ_MISSING);
    assert_int_equal(res[1], OSP_KV_READ_MISSING);
    assert_int_equal(osp_kv_xfer_peers_mapped(peers), 0);
    assert_int_equal(g_closes, 1);
    osp_kv_xfer_peers_destroy(peers);
    close(up), close(down);

    /* a producer in this process (its arena cannot be mapped where it was made): TCP, by the nonce */
    const osp_kv_xfer_device d = arena_dev("U");
    const osp_kv_xfer_server_config c = {.ip = "127.0.0.1", .block_bytes = BB, .engine_id = 42, .cap_bytes = 16 * BB,
                                         .timeout_s = 60, .io_timeout_s = 2, .device = &d};
    osp_kv_xfer_server *s = NULL;
    assert_int_equal(osp_kv_xfer_server_create(&c, &s), OSP_OK);
    int sd[3] = {5, 6, 7};
    const osp_block_hash h3[3] = {hash_of(5), hash_of(6), hash_of(7)};
    osp_status err;
    const uint64_t id3 = osp_kv_xfer_server_hold_device(s, h3, 3, fill_slots, sd, &err);
    assert_true(id3 != 0);
    /* a hold of more blocks than the arena has slots holds nothing there (the caller holds on the host) */
    const osp_block_hash h5[5] = {hash_of(0), hash_of(1), hash_of(2), hash_of(3), hash_of(4)};
    int s5[5] = {0, 1, 2, 3, 4};
    assert_int_equal(osp_kv_xfer_server_hold_device(s, h5, 5, fill_slots, s5, &err), 0);
    assert_int_equal(err, OSP_OK);
    peers = peers_on('U', false);
    sink.calls = 0;
    const int seeds3[3] = {5, 6, 7};
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", osp_kv_xfer_server_port(s), 42, id3, BB, h3, 3, true, 2,
                                           write_pages, &sink, dst, res, &via), OSP_OK);
    assert_false(via);
    assert_int_equal(sink.calls, 0);
    check_seeds(dst, seeds3, res, 3);
    osp_kv_xfer_peers_destroy(peers);
    osp_kv_xfer_server_destroy(s);

    /* a producer older than the IPC offer: it refuses the flag (malformed), the consumer asks again without
       it and answers what that producer says; not offered to it again */
    const int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in la = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &la.sin_addr);
    assert_int_equal(bind(lfd, (struct sockaddr *)&la, sizeof la), 0);
    assert_int_equal(listen(lfd, 4), 0);
    socklen_t ll = sizeof la;
    getsockname(lfd, (struct sockaddr *)&la, &ll);
    const pid_t old = fork();
    if (old == 0) {
        for (int k = 0; k < 3; k++) {
            const int cfd = accept(lfd, NULL, NULL);
            uint8_t hdr[40];
            if (recv(cfd, hdr, sizeof hdr, MSG_WAITALL) != 40) _exit(1);
            uint8_t ans[16] = "OSPKVR01";
            ans[8] = hdr[36] & 2 ? 3 : 1; /* the IPC bit: malformed; else: no such transfer */
            if (send(cfd, ans, sizeof ans, MSG_NOSIGNAL) != 16) _exit(1);
            if (k == 0 && !(hdr[36] & 2)) _exit(2); /* the first must offer */
            if (k == 2 && (hdr[36] & 2)) _exit(3);  /* the third must not */
            close(cfd);
        }
        _exit(0);
    }
    peers = peers_on('U', false);
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", ntohs(la.sin_port), 42, 7, BB, h3, 1, false, 2,
                                           write_pages, &sink, dst, res, &via), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "no such transfer"));
    assert_int_equal(osp_kv_xfer_fetch_ipc(peers, "127.0.0.1", ntohs(la.sin_port), 42, 7, BB, h3, 1, false, 2,
                                           write_pages, &sink, dst, res, &via), OSP_ERR_INVALID_ARG);
    int wst = 0;
    waitpid(old, &wst, 0);
    assert_true(WIFEXITED(wst));
    assert_int_equal(WEXITSTATUS(wst), 0);
    close(lfd);
    osp_kv_xfer_peers_destroy(peers);
    free(dst);
    free(pages);
    munmap(g_arena, SLOTS * BB);
}

/* ---- two engines ------------------------------------------------------------------------------- */

#define MAXOUT 32

static osp_engine_params base(osp_kv_role role, uint64_t hash_seed) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = g_tiny;
    p.n_threads = 2;
    p.kv_dtype = OSP_KV_DTYPE_F32;
    p.max_model_len = 256;
    p.num_blocks = 32;
    p.check_invariants = true;
    p.hash_seed_set = true;
    p.hash_seed = hash_seed;
    p.device = TEST_DEVICE;
    p.kv_role = role;
    p.kv_transfer_ip = "127.0.0.1";
    return p;
}

typedef struct run {
    int32_t out[MAXOUT], n_out, cached;
    uint64_t xfer_id;
    int32_t xfer_blocks;
} run;

static uint64_t g_next_id = 1;

/* One request through e to completion. */
static run run_one(osp_engine *e, const int32_t *prompt, int32_t n_prompt, int32_t max_tokens, float temperature,
                   const osp_kv_transfer_params *kt) {
    osp_request_params rp = osp_request_default_params();
    rp.request_id = g_next_id++;
    rp.prompt = prompt;
    rp.num_prompt = n_prompt;
    rp.max_tokens = max_tokens;
    rp.ignore_eos = true;
    rp.temperature = temperature;
    rp.has_seed = true;
    rp.seed = 1234;
    rp.kv_transfer = kt;
    assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
    while (osp_engine_has_unfinished(e)) assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
    run r = {0};
    osp_request_output o;
    assert_int_equal(osp_engine_poll(e, rp.request_id, r.out, MAXOUT, &o, 0), OSP_OK);
    assert_true(o.finished);
    r.n_out = o.num_tokens;
    r.cached = o.num_cached_tokens;
    r.xfer_id = o.kv_transfer_id;
    r.xfer_blocks = o.kv_transfer_num_blocks;
    return r;
}

/* The consumer's parameters from a producer's answer (what the router passes on). */
static osp_kv_transfer_params answer(osp_engine *producer, const run *pr) {
    const osp_kv_transfer_info info = osp_engine_kv_transfer_info(producer);
    osp_kv_transfer_params t = {.do_remote_prefill = true, .remote_port = info.port, .remote_engine_id = info.engine_id,
                                .remote_request_id = pr->xfer_id, .remote_num_blocks = pr->xfer_blocks};
    snprintf(t.remote_host, sizeof t.remote_host, "%s", info.host);
    return t;
}

static void wait_held(osp_engine *e, int64_t want) {
    for (int i = 0; i < 200 && osp_engine_get_stats(e).kv_transfer_held != want; i++) sleep_s(0.02);
    assert_int_equal(osp_engine_get_stats(e).kv_transfer_held, want);
}

static void test_engines(void **state) {
    (void)state;
    int32_t prompt[90];
    srand(5);
    for (int i = 0; i < 90; i++) prompt[i] = 3 + rand() % 500;
    osp_engine *prod, *cons, *ref;
    osp_engine_params pp = base(OSP_KV_ROLE_PRODUCER, 11), cp = base(OSP_KV_ROLE_CONSUMER, 11), rp = base(OSP_KV_ROLE_NONE, 11);
    assert_int_equal(osp_engine_create(&pp, &prod), OSP_OK);
    assert_int_equal(osp_engine_create(&cp, &cons), OSP_OK);
    assert_int_equal(osp_engine_create(&rp, &ref), OSP_OK);
    const osp_kv_transfer_info pi = osp_engine_kv_transfer_info(prod), ci = osp_engine_kv_transfer_info(cons);
    assert_int_equal(pi.role, OSP_KV_ROLE_PRODUCER);
    assert_true(pi.port > 0);
    assert_int_equal(ci.role, OSP_KV_ROLE_CONSUMER);
    assert_true(pi.engine_id == ci.engine_id); /* same model, format, device and hash seed */
    assert_int_equal(osp_engine_kv_transfer_info(ref).role, OSP_KV_ROLE_NONE);
    const osp_kv_transfer_params decode_there = {.do_remote_decode = true};
    for (int sampled = 0; sampled < 2; sampled++) {
        const float temp = sampled ? 0.8f : 0.0f;
        const run want = run_one(ref, prompt, 90, 12, temp, NULL);
        assert_int_equal(want.n_out, 12);
        /* the producer: one token, its 5 full blocks held */
        const run pr = run_one(prod, prompt, 90, 1, temp, &decode_there);
        assert_true(pr.xfer_id != 0);
        assert_int_equal(pr.xfer_blocks, 90 / 16);
        wait_held(prod, 1);
        /* the consumer: those 5 blocks loaded, the last 10 tokens computed, the same tokens */
        const osp_kv_transfer_params t = answer(prod, &pr);
        const osp_engine_stats before = osp_engine_get_stats(cons);
        const run got = run_one(cons, prompt, 90, 12, temp, &t);
        assert_int_equal(got.n_out, 12);
        assert_memory_equal(got.out, want.out, sizeof want.out[0] * 12);
        const osp_engine_stats after = osp_engine_get_stats(cons);
        assert_int_equal(after.kv_transfer_recv_blocks - before.kv_transfer_recv_blocks, 5);
        assert_int_equal(after.kv_transfer_failed_blocks, 0);
        assert_int_equal(got.cached, 5 * 16);
        wait_held(prod, 0); /* released by the last fetch */
        /* the consumer's own prefix cache serves it next time: nothing fetched */
        osp_engine_free(cons);
        assert_int_equal(osp_engine_create(&cp, &cons), OSP_OK);
    }
    assert_int_equal(osp_engine_get_stats(prod).kv_transfer_sent_blocks, 10);
    /* a short prompt: nothing held */
    const run small = run_one(prod, prompt, 10, 1, 0, &decode_there);
    assert_int_equal(small.xfer_blocks, 0);
    assert_int_equal(small.xfer_id, 0);

    /* failures: the consumer recomputes, with the same tokens, and counts the blocks */
    const run want = run_one(ref, prompt, 90, 12, 0, NULL);
    const run pr = run_one(prod, prompt, 90, 1, 0, &decode_there);
    osp_kv_transfer_params t = answer(prod, &pr);
    t.remote_request_id ^= 1; /* a transfer the producer does not hold */
    run got = run_one(cons, prompt, 90, 12, 0, &t);
    assert_memory_equal(got.out, want.out, sizeof want.out[0] * 12);
    assert_int_equal(osp_engine_get_stats(cons).kv_transfer_failed_blocks, 5);
    assert_int_equal(got.cached, 0);
    osp_engine_free(cons);
    assert_int_equal(osp_engine_create(&cp, &cons), OSP_OK);
    t = answer(prod, &pr);
    t.remote_port = 1; /* nobody listens */
    got = run_one(cons, prompt, 90, 12, 0, &t);
    assert_memory_equal(got.out, want.out, sizeof want.out[0] * 12);
    assert_int_equal(osp_engine_get_stats(cons).kv_transfer_failed_blocks, 5);
    osp_engine_free(cons);
    /* a consumer with another hash seed: another engine id, refused before any fetch */
    osp_engine_params cp2 = base(OSP_KV_ROLE_CONSUMER, 12);
    assert_int_equal(osp_engine_create(&cp2, &cons), OSP_OK);
    assert_true(osp_engine_kv_transfer_info(cons).engine_id != pi.engine_id);
    t = answer(prod, &pr);
    got = run_one(cons, prompt, 90, 12, 0, &t);
    assert_memory_equal(got.out, want.out, sizeof want.out[0] * 12);
    assert_int_equal(osp_engine_get_stats(cons).kv_transfer_failed_blocks, 5);
    assert_int_equal(osp_engine_get_stats(cons).kv_transfer_recv_blocks, 0);
    osp_engine_free(cons);
    /* the last transfer was never pulled: dropped when the producer goes */
    osp_engine_free(prod);
    osp_engine_free(ref);
}

static void test_refusals(void **state) {
    (void)state;
    osp_engine *prod, *none;
    osp_engine_params pp = base(OSP_KV_ROLE_PRODUCER, 11), np = base(OSP_KV_ROLE_NONE, 11);
    assert_int_equal(osp_engine_create(&pp, &prod), OSP_OK);
    assert_int_equal(osp_engine_create(&np, &none), OSP_OK);
    int32_t prompt[20] = {5, 6, 7};
    osp_request_params rp = osp_request_default_params();
    rp.request_id = g_next_id++;
    rp.prompt = prompt;
    rp.num_prompt = 20;
    rp.max_tokens = 1;
    osp_kv_transfer_params t = {.do_remote_decode = true};
    rp.kv_transfer = &t;
    assert_int_equal(osp_engine_add(none, &rp), OSP_ERR_INVALID_ARG); /* no role */
    t = (osp_kv_transfer_params){.do_remote_prefill = true, .remote_port = 5, .remote_num_blocks = 1};
    snprintf(t.remote_host, sizeof t.remote_host, "127.0.0.1");
    assert_int_equal(osp_engine_add(prod, &rp), OSP_ERR_INVALID_ARG); /* a producer only */
    t.do_remote_decode = true;
    assert_int_equal(osp_engine_add(prod, &rp), OSP_ERR_INVALID_ARG); /* both */
    t = (osp_kv_transfer_params){.do_remote_decode = true};
    rp.n = 2;
    assert_int_equal(osp_engine_add(prod, &rp), OSP_ERR_INVALID_ARG);
    assert_non_null(strstr(osp_last_error(), "n > 1"));
    rp.n = 1;
    rp.prompt_logprobs = 1; /* fine: computed, nothing held (its blocks are not cached) */
    assert_int_equal(osp_engine_add(prod, &rp), OSP_OK);
    while (osp_engine_has_unfinished(prod)) assert_int_equal(osp_engine_step(prod, NULL), OSP_OK);
    rp.request_id = g_next_id++;
    rp.prompt_logprobs = -1;
    t = (osp_kv_transfer_params){0}; /* both false: nothing asked */
    assert_int_equal(osp_engine_add(none, &rp), OSP_OK);
    while (osp_engine_has_unfinished(none)) assert_int_equal(osp_engine_step(none, NULL), OSP_OK);
    osp_engine_free(prod);
    osp_engine_free(none);
    /* a transfer role needs prefix caching; a port out of range is refused */
    osp_engine *e;
    pp.enable_prefix_caching = false;
    assert_int_equal(osp_engine_create(&pp, &e), OSP_ERR_UNSUPPORTED);
    pp = base(OSP_KV_ROLE_PRODUCER, 11);
    pp.kv_transfer_port = 70000;
    assert_int_equal(osp_engine_create(&pp, &e), OSP_ERR_INVALID_ARG);
    pp.kv_transfer_port = 0;
    pp.kv_transfer_buffer_bytes = 1000; /* smaller than one block */
    assert_int_equal(osp_engine_create(&pp, &e), OSP_ERR_INVALID_ARG);
}

#ifdef TEST_GPU_IPC /* tests/gpu/test_gpu_kv_transfer.c: CUDA IPC between this process and a child */
static int gpu_ipc_child(int argc, char **argv);
static int gpu_ipc_tests(void);
#endif

int main(int argc, char **argv) {
#ifdef TEST_GPU_IPC
    if (argc >= 2 && !strncmp(argv[1], "--ipc-", 6)) return gpu_ipc_child(argc, argv); /* the producer child */
#else
    (void)argc, (void)argv;
#endif
    const char *root = getenv("OSPREY_ROOT");
    snprintf(g_tiny, sizeof g_tiny, "%s/tests/models/tiny-llama-f32.gguf", root ? root : ".");
    if (g_gpu && osp_device_count(OSP_DEVICE_CUDA) == 0) {
        printf("test_gpu_kv_transfer: skipped: no CUDA device\n");
        return 77;
    }
    if (g_gpu && gpu_test_model("gpu-transfer-f32", "f32", g_tiny, sizeof g_tiny) != 0) return 1;
    const struct CMUnitTest proto[] = {
        cmocka_unit_test(test_protocol),
        cmocka_unit_test(test_drops),
        cmocka_unit_test(test_malformed_and_unreachable),
        cmocka_unit_test(test_ipc_protocol),
    };
    int rc = g_gpu ? 0 : cmocka_run_group_tests(proto, NULL, NULL);
    FILE *f = fopen(g_tiny, "rb");
    if (!f) {
        fprintf(stderr, "SKIP engine tests: %s missing\n", g_tiny);
        return rc;
    }
    fclose(f);
    const struct CMUnitTest engine[] = {
        cmocka_unit_test(test_engines),
        cmocka_unit_test(test_refusals),
    };
    rc |= cmocka_run_group_tests(engine, NULL, NULL);
#ifdef TEST_GPU_IPC
    rc |= gpu_ipc_tests();
#endif
    if (g_gpu) remove(g_tiny);
    return rc;
}
