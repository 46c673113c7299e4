/* KV block transfer over TCP, and by CUDA IPC arena offsets between processes on one device (see
 * transfer.h). The device work itself (the arena, mapping it, the copies) is the caller's, through
 * callbacks into the backend (kv_cache.h): this file only moves bytes, offsets and handles. */
#include "kv/transfer.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/le.h"
#include "core/status_internal.h"

#define REQ_MAGIC "OSPKVQ01"
#define RESP_MAGIC "OSPKVR01"
#define DEV_MAGIC "OSPKVD01" /* an answer by arena offsets (CUDA IPC) */
#define REQ_HEADER 40  /* magic, engine id, transfer id, block bytes, n, flags */
#define RESP_HEADER 16 /* magic, status, n */
#define REQ_IPC_TAIL (OSP_KV_XFER_UUID_BYTES + 8) /* after the hashes with FLAG_IPC: device UUID, nonce */
#define DEV_TAIL (16 + OSP_KV_XFER_HANDLE_BYTES)   /* after a DEV_MAGIC header: arena id, bytes, handle */
#define FLAG_RELEASE 1u
#define FLAG_IPC 2u
#define NO_OFFSET UINT64_MAX
enum { ST_OK = 0, ST_NO_TRANSFER = 1, ST_FOREIGN = 2, ST_MALFORMED = 3 };

/* osp_kv_xfer_process_nonce: drawn again in a forked child (which inherits the parent's) */
static pthread_mutex_t g_nonce_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_nonce;
static pid_t g_nonce_pid;

uint64_t osp_kv_xfer_process_nonce(void) {
    pthread_mutex_lock(&g_nonce_mu);
    const pid_t pid = getpid();
    if (g_nonce == 0 || g_nonce_pid != pid) {
        if (getrandom(&g_nonce, sizeof g_nonce, 0) != (ssize_t)sizeof g_nonce)
            g_nonce = XXH3_64bits_withSeed(&g_nonce, sizeof g_nonce, (uint64_t)time(NULL) ^ ((uint64_t)pid << 32));
        if (g_nonce == 0) g_nonce = 1;
        g_nonce_pid = pid;
    }
    const uint64_t n = g_nonce;
    pthread_mutex_unlock(&g_nonce_mu);
    return n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void put_hash(uint8_t *p, const osp_block_hash *h) {
    osp_put_le64(p, h->lo);
    osp_put_le64(p + 8, h->hi);
    osp_put_le64(p + 16, h->ext[0]);
    osp_put_le64(p + 24, h->ext[1]);
}

static osp_block_hash get_hash(const uint8_t *p) {
    return (osp_block_hash){.lo = osp_get_le64(p), .hi = osp_get_le64(p + 8),
                            .ext = {osp_get_le64(p + 16), osp_get_le64(p + 24)}};
}

static bool hash_eq(const osp_block_hash *a, const osp_block_hash *b) {
    return a->lo == b->lo && a->hi == b->hi && a->ext[0] == b->ext[0] && a->ext[1] == b->ext[1];
}

/* ---- sockets ------------------------------------------------------------------------------------ */

static void set_timeouts(int fd, double s) {
    struct timeval tv = {.tv_sec = (time_t)s, .tv_usec = (suseconds_t)((s - (double)(time_t)s) * 1e6)};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* All n bytes, or false (EOF, error, a stall past the socket's timeout, or past `deadline`, a
 * CLOCK_MONOTONIC time in seconds; 0: none): a peer that trickles a byte at a time cannot hold the
 * reader longer than the deadline. */
static bool read_full_by(int fd, void *buf, size_t n, double deadline) {
    uint8_t *p = buf;
    while (n > 0) {
        if (deadline > 0) {
            const double left = deadline - now_s();
            if (left <= 0) return false;
            struct pollfd pfd = {.fd = fd, .events = POLLIN};
            const int r = poll(&pfd, 1, (int)(left * 1000) + 1);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return false;
        }
        const ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return false;
        p += r, n -= (size_t)r;
    }
    return true;
}

/* Sends the iovecs whole (MSG_NOSIGNAL: a closed peer is an error, not a signal), or false. */
static bool send_all(int fd, struct iovec *iov, int cnt) {
    while (cnt > 0) {
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        while (cnt > 0 && (size_t)w >= iov->iov_len) w -= (ssize_t)iov->iov_len, iov++, cnt--;
        if (cnt > 0) iov->iov_base = (uint8_t *)iov->iov_base + w, iov->iov_len -= (size_t)w;
    }
    return true;
}

/* ---- the producer's server ----------------------------------------------------------------------- */

typedef struct xfer {
    uint64_t id;
    int32_t n;
    osp_block_hash *h; /* [n] */
    uint8_t *data;     /* [n * block_bytes] host copies, or NULL when held in the device arena */
    int32_t *slots;    /* [n] the arena slot of each block (device-held), or NULL */
    double deadline;
    int32_t refs;      /* answers in progress (the serving thread) */
    bool listed;       /* false once dropped or released: freed when refs reaches 0 */
    struct xfer *next; /* oldest first */
} xfer;

struct osp_kv_xfer_server {
    osp_kv_xfer_server_config cfg;
    int fd, port;
    pthread_t thread;
    bool started;
    atomic_bool stop;
    pthread_mutex_t mu;
    xfer *head, *tail; /* under mu */
    size_t bytes;      /* of the listed transfers, under mu */
    uint64_t next_id;  /* under mu */
    int32_t n_conns;   /* connection threads running, under mu */
    pthread_cond_t conns_done;
    osp_kv_xfer_server_stats st; /* under mu */
    /* the device arena (CUDA IPC), when cfg.device was given */
    bool has_dev;
    osp_kv_xfer_device dev;
    uint64_t arena_id;   /* random: a consumer's mapping is of this arena, not a predecessor's */
    int32_t n_slots;
    int32_t *free_slots; /* [n_slots] a stack of the free ones, n_free deep, under mu */
    int32_t n_free;
};

/* Frees x, its arena slots back to the free stack (mu held, or the server going). */
static void xfer_free(osp_kv_xfer_server *s, xfer *x) {
    if (!x) return;
    for (int32_t i = 0; x->slots && i < x->n; i++) s->free_slots[s->n_free++] = x->slots[i];
    free(x->h);
    free(x->data);
    free(x->slots);
    free(x);
}

/* Takes x out of the list (mu held); frees it unless an answer is using it. */
static void unlist(osp_kv_xfer_server *s, xfer *x) {
    xfer **pp = &s->head, *prev = NULL;
    while (*pp && *pp != x) prev = *pp, pp = &(*pp)->next;
    if (!*pp) return;
    *pp = x->next;
    if (s->tail == x) s->tail = prev;
    x->next = NULL;
    x->listed = false;
    if (x->slots) s->st.held_device_blocks -= x->n;
    else s->bytes -= (size_t)x->n * s->cfg.block_bytes;
    s->st.held--;
    s->st.held_blocks -= x->n;
    if (x->refs == 0) xfer_free(s, x);
}

/* Drops the oldest listed transfer held on the device (device) or in host memory; false when none is. */
static bool drop_oldest(osp_kv_xfer_server *s, bool device) {
    xfer *x = s->head;
    while (x && (x->slots != NULL) != device) x = x->next;
    if (!x) return false;
    s->st.dropped++;
    unlist(s, x);
    return true;
}

static void sweep_expired(osp_kv_xfer_server *s) {
    const double t = now_s();
    pthread_mutex_lock(&s->mu);
    for (xfer *x = s->head, *next; x; x = next) {
        next = x->next;
        if (x->deadline <= t) {
            s->st.dropped++;
            unlist(s, x);
        }
    }
    pthread_mutex_unlock(&s->mu);
}

static void answer_status(int fd, uint32_t status) {
    uint8_t hdr[RESP_HEADER];
    memcpy(hdr, RESP_MAGIC, 8);
    osp_put_le32(hdr + 8, status);
    osp_put_le32(hdr + 12, 0);
    struct iovec iov = {.iov_base = hdr, .iov_len = sizeof hdr};
    send_all(fd, &iov, 1);
}

/* The answer by arena offsets to the n hashes of raw (x referenced by the caller, dropped here), then the
 * wait for the consumer's done byte: until then x (and so its slots) stays referenced. A release is done
 * then, unless the consumer answered 0 (its copies did not happen: it may ask again over TCP). */
static void serve_ipc(osp_kv_xfer_server *s, int fd, xfer *x, const uint8_t *raw, uint32_t n, bool release) {
    const size_t len = RESP_HEADER + DEV_TAIL + (size_t)n * 8;
    uint8_t *a = malloc(len);
    int32_t found = 0;
    if (a) {
        memcpy(a, DEV_MAGIC, 8);
        osp_put_le32(a + 8, ST_OK);
        osp_put_le32(a + 12, n);
        osp_put_le64(a + 16, s->arena_id);
        osp_put_le64(a + 24, (uint64_t)s->dev.bytes);
        memcpy(a + 32, s->dev.handle, OSP_KV_XFER_HANDLE_BYTES);
        int32_t at = 0; /* as the TCP answer: a consumer asks in the transfer's order */
        for (uint32_t i = 0; i < n; i++) {
            const osp_block_hash h = get_hash(raw + (size_t)i * OSP_KV_XFER_HASH_BYTES);
            int32_t j = -1;
            for (int32_t k = 0; k < x->n && j < 0; k++) {
                const int32_t c = (at + k) % x->n;
                if (hash_eq(&x->h[c], &h)) j = c;
            }
            osp_put_le64(a + RESP_HEADER + DEV_TAIL + (size_t)i * 8,
                         j >= 0 ? (uint64_t)x->slots[j] * (uint64_t)s->cfg.block_bytes : NO_OFFSET);
            if (j >= 0) at = j + 1, found++;
        }
        pthread_mutex_lock(&s->mu); /* counted before it goes, as the TCP answer's */
        s->st.sent_blocks += found;
        s->st.ipc_blocks += found;
        pthread_mutex_unlock(&s->mu);
        struct iovec iov = {.iov_base = a, .iov_len = len};
        uint8_t done = 1;
        if (send_all(fd, &iov, 1)) {
            /* the consumer's copies: a few ms for hundreds of MiB; any answer, a close or the deadline end
               the wait (a consumer closes only after its copies are synchronized, or when its process is
               gone, which ends them) */
            const double deadline = now_s() + 2 * s->cfg.io_timeout_s + (double)n * (double)s->cfg.block_bytes / 1e9;
            if (!read_full_by(fd, &done, 1, deadline)) done = 1;
        }
        free(a);
        pthread_mutex_lock(&s->mu);
        if (release && done && x->listed) {
            s->st.released++;
            unlist(s, x);
        }
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    if (--x->refs == 0 && !x->listed) xfer_free(s, x); /* released, or dropped while it was being read */
    pthread_mutex_unlock(&s->mu);
}

static void serve_one(osp_kv_xfer_server *s, int fd) {
    set_timeouts(fd, s->cfg.io_timeout_s);
    const double deadline = now_s() + s->cfg.io_timeout_s; /* the whole request (it is small) */
    uint8_t hdr[REQ_HEADER];
    if (!read_full_by(fd, hdr, sizeof hdr, deadline)) return;
    const uint64_t engine_id = osp_get_le64(hdr + 8), id = osp_get_le64(hdr + 16), bb = osp_get_le64(hdr + 24);
    const uint32_t n = osp_get_le32(hdr + 32), flags = osp_get_le32(hdr + 36);
    if (memcmp(hdr, REQ_MAGIC, 8) != 0 || n > OSP_KV_XFER_MAX_BLOCKS || (flags & ~(FLAG_RELEASE | FLAG_IPC)) != 0) {
        pthread_mutex_lock(&s->mu);
        s->st.bad_requests++;
        pthread_mutex_unlock(&s->mu);
        answer_status(fd, ST_MALFORMED);
        return;
    }
    uint8_t *raw = n ? malloc((size_t)n * OSP_KV_XFER_HASH_BYTES) : NULL;
    if (n && !raw) return; /* out of memory: the consumer sees a cut answer and recomputes */
    uint8_t tail[REQ_IPC_TAIL];
    if ((n && !read_full_by(fd, raw, (size_t)n * OSP_KV_XFER_HASH_BYTES, deadline)) ||
        ((flags & FLAG_IPC) && !read_full_by(fd, tail, sizeof tail, deadline))) {
        free(raw);
        return;
    }
    if (engine_id != s->cfg.engine_id || (bb != s->cfg.block_bytes && n > 0)) { /* a release alone: any size */
        free(raw);
        pthread_mutex_lock(&s->mu);
        s->st.bad_requests++;
        pthread_mutex_unlock(&s->mu);
        answer_status(fd, ST_FOREIGN);
        return;
    }
    pthread_mutex_lock(&s->mu);
    xfer *x = s->head;
    while (x && x->id != id) x = x->next;
    if (x) x->refs++;
    /* by arena offsets: a consumer on this device (UUID) in another process (nonce), a transfer held there */
    const bool ipc = x && (flags & FLAG_IPC) && n > 0 && x->slots && s->has_dev &&
                     !memcmp(tail, s->dev.uuid, OSP_KV_XFER_UUID_BYTES) &&
                     osp_get_le64(tail + OSP_KV_XFER_UUID_BYTES) != osp_kv_xfer_process_nonce();
    if (x && (flags & FLAG_RELEASE) && !ipc) { /* released now (the answer's reference keeps it until sent):
                                                  the consumer may ask the stats right after it has read the
                                                  answer. By IPC: at the consumer's done (serve_ipc) */
        s->st.released++;
        unlist(s, x);
    }
    pthread_mutex_unlock(&s->mu);
    if (!x) {
        free(raw);
        answer_status(fd, ST_NO_TRANSFER);
        return;
    }
    if (ipc) {
        serve_ipc(s, fd, x, raw, n, (flags & FLAG_RELEASE) != 0);
        free(raw);
        return;
    }
    uint8_t *bounce = x->slots ? malloc(s->cfg.block_bytes) : NULL; /* a device-held block, on its way out */
    if (x->slots && !bounce) {
        free(raw);
        pthread_mutex_lock(&s->mu);
        if (--x->refs == 0 && !x->listed) xfer_free(s, x);
        pthread_mutex_unlock(&s->mu);
        return; /* out of memory: the consumer sees a cut answer and recomputes */
    }
    uint8_t rh[RESP_HEADER];
    memcpy(rh, RESP_MAGIC, 8);
    osp_put_le32(rh + 8, ST_OK);
    osp_put_le32(rh + 12, n);
    struct iovec iov[3] = {{.iov_base = rh, .iov_len = sizeof rh}};
    bool ok = send_all(fd, iov, 1);
    int32_t at = 0; /* where the last block was found: a consumer asks in the transfer's order */
    /* the answer within 2 stalls plus its bytes at 50 MB/s: a consumer that reads slowly cannot hold its
       thread (and the transfer) longer */
    const double send_deadline = now_s() + 2 * s->cfg.io_timeout_s + (double)n * (double)s->cfg.block_bytes / 50e6;
    for (uint32_t i = 0; ok && i < n && now_s() < send_deadline; i++) {
        const osp_block_hash h = get_hash(raw + (size_t)i * OSP_KV_XFER_HASH_BYTES);
        int32_t j = -1;
        for (int32_t k = 0; k < x->n && j < 0; k++) {
            const int32_t c = (at + k) % x->n;
            if (hash_eq(&x->h[c], &h)) j = c;
        }
        uint8_t found = j >= 0, sum[8];
        iov[0] = (struct iovec){.iov_base = &found, .iov_len = 1};
        int cnt = 1;
        if (j >= 0 && x->slots) { /* from the arena first (a consumer on another device or host) */
            const uint8_t *src = (const uint8_t *)s->dev.base + (size_t)x->slots[j] * s->cfg.block_bytes;
            if (s->dev.to_host(s->dev.ctx, bounce, src, s->cfg.block_bytes) != OSP_OK) break; /* cut: recomputed */
        }
        if (j >= 0) {
            const uint8_t *p = x->slots ? bounce : x->data + (size_t)j * s->cfg.block_bytes;
            osp_put_le64(sum, XXH3_64bits(p, s->cfg.block_bytes));
            iov[1] = (struct iovec){.iov_base = (void *)p, .iov_len = s->cfg.block_bytes};
            iov[2] = (struct iovec){.iov_base = sum, .iov_len = 8};
            cnt = 3;
            at = j + 1;
        }
        if (j >= 0) { /* counted before it goes: a consumer may read the stats once it has the bytes */
            pthread_mutex_lock(&s->mu);
            s->st.sent_blocks++;
            pthread_mutex_unlock(&s->mu);
        }
        ok = send_all(fd, iov, cnt);
    }
    free(raw);
    free(bounce);
    pthread_mutex_lock(&s->mu);
    if (--x->refs == 0 && !x->listed) xfer_free(s, x); /* released, or dropped while it was being sent */
    pthread_mutex_unlock(&s->mu);
}

#define MAX_CONNS 16 /* answers at once; a further connection waits in the listen backlog */

typedef struct conn {
    osp_kv_xfer_server *s;
    int fd;
} conn;

static void *conn_main(void *arg) {
    conn *c = arg;
    serve_one(c->s, c->fd);
    close(c->fd);
    pthread_mutex_lock(&c->s->mu);
    c->s->n_conns--;
    pthread_cond_signal(&c->s->conns_done);
    pthread_mutex_unlock(&c->s->mu);
    free(c);
    return NULL;
}

/* Accepts; each connection is answered on a thread of its own (at most MAX_CONNS), so one slow or stuck
 * consumer does not hold the others. */
static void *serve_main(void *arg) {
    osp_kv_xfer_server *s = arg;
    while (!atomic_load(&s->stop)) {
        pthread_mutex_lock(&s->mu);
        const bool room = s->n_conns < MAX_CONNS;
        pthread_mutex_unlock(&s->mu);
        struct pollfd pfd = {.fd = s->fd, .events = POLLIN};
        const int r = room ? poll(&pfd, 1, 200) : (poll(NULL, 0, 20), 0);
        sweep_expired(s);
        if (r <= 0) continue;
        const int fd = accept(s->fd, NULL, NULL);
        if (fd < 0) continue;
        conn *c = malloc(sizeof *c);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (c) {
            *c = (conn){.s = s, .fd = fd};
            pthread_mutex_lock(&s->mu);
            s->n_conns++;
            pthread_mutex_unlock(&s->mu);
            if (pthread_create(&t, &at, conn_main, c) != 0) {
                pthread_mutex_lock(&s->mu);
                s->n_conns--;
                pthread_mutex_unlock(&s->mu);
                free(c);
                c = NULL;
            }
        }
        pthread_attr_destroy(&at);
        if (!c) { /* no thread: answered here */
            serve_one(s, fd);
            close(fd);
        }
    }
    pthread_mutex_lock(&s->mu); /* answers in progress end (their deadlines bound them) before the memory goes */
    while (s->n_conns > 0) pthread_cond_wait(&s->conns_done, &s->mu);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

osp_status osp_kv_xfer_server_create(const osp_kv_xfer_server_config *cfg, osp_kv_xfer_server **out) {
    *out = NULL;
    if (!cfg || cfg->block_bytes == 0 || cfg->port < 0 || cfg->port > 65535)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv transfer: bad server configuration (block bytes %zu, port %d)",
                             cfg ? cfg->block_bytes : 0, cfg ? cfg->port : -1);
    osp_kv_xfer_server *s = calloc(1, sizeof *s);
    if (!s) return osp_set_error(OSP_ERR_NOMEM, "kv transfer: out of memory");
    s->cfg = *cfg;
    s->cfg.device = NULL; /* copied below */
    if (s->cfg.io_timeout_s <= 0) s->cfg.io_timeout_s = 10.0;
    if (cfg->device && cfg->device->base && cfg->device->to_host && cfg->device->bytes >= cfg->block_bytes &&
        cfg->device->bytes / cfg->block_bytes <= (size_t)INT32_MAX) {
        s->dev = *cfg->device;
        s->n_slots = (int32_t)(s->dev.bytes / cfg->block_bytes);
        if (!(s->free_slots = malloc(sizeof *s->free_slots * (size_t)s->n_slots))) {
            free(s);
            return osp_set_error(OSP_ERR_NOMEM, "kv transfer: out of memory");
        }
        for (int32_t i = 0; i < s->n_slots; i++) s->free_slots[i] = s->n_slots - 1 - i; /* slot 0 on top */
        s->n_free = s->n_slots;
        s->has_dev = true;
    }
    const char *ip = cfg->ip && cfg->ip[0] ? cfg->ip : "127.0.0.1";
    s->cfg.ip = NULL; /* not kept: the caller's string */
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    const int gai = getaddrinfo(ip, port, &hints, &ai);
    if (gai != 0) {
        free(s->free_slots);
        free(s);
        return osp_set_error(OSP_ERR_IO, "kv transfer: cannot resolve the listening address %s: %s", ip, gai_strerror(gai));
    }
    s->fd = -1;
    int err = 0;
    for (struct addrinfo *a = ai; a && s->fd < 0; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
            s->fd = fd;
            struct sockaddr_storage ss;
            socklen_t len = sizeof ss;
            if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
                s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                                   : ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else {
            err = errno;
            close(fd);
        }
    }
    freeaddrinfo(ai);
    if (s->fd < 0) {
        free(s->free_slots);
        free(s);
        return osp_set_error(OSP_ERR_IO, "kv transfer: cannot listen on %s:%d: %s", ip, cfg->port, strerror(err));
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->conns_done, NULL);
    /* transfer ids: a random start, so a restarted producer does not reuse its predecessor's ids */
    if (getrandom(&s->next_id, sizeof s->next_id, 0) != (ssize_t)sizeof s->next_id)
        s->next_id = XXH3_64bits_withSeed(&s, sizeof s, (uint64_t)time(NULL) ^ (uint64_t)getpid());
    s->arena_id = XXH3_64bits_withSeed(&s->next_id, sizeof s->next_id, osp_kv_xfer_process_nonce());
    atomic_store(&s->stop, false);
    if (pthread_create(&s->thread, NULL, serve_main, s) != 0) {
        close(s->fd);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->conns_done);
        free(s->free_slots);
        free(s);
        return osp_set_error(OSP_ERR_NOMEM, "kv transfer: cannot start the serving thread");
    }
    s->started = true;
    *out = s;
    return OSP_OK;
}

void osp_kv_xfer_server_destroy(osp_kv_xfer_server *s) {
    if (!s) return;
    atomic_store(&s->stop, true);
    if (s->started) pthread_join(s->thread, NULL);
    close(s->fd);
    for (xfer *x = s->head, *next; x; x = next) next = x->next, xfer_free(s, x);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->conns_done);
    free(s->free_slots);
    free(s);
}

int32_t osp_kv_xfer_server_port(const osp_kv_xfer_server *s) { return s->port; }

/* Lists x (its blocks in place) under a new id, which it returns; mu held. */
static uint64_t list_xfer(osp_kv_xfer_server *s, xfer *x) {
    x->deadline = now_s() + (s->cfg.timeout_s > 0 ? s->cfg.timeout_s : 120.0);
    x->listed = true;
    if (++s->next_id == 0) s->next_id = 1;
    x->id = s->next_id;
    if (s->tail) s->tail->next = x;
    else s->head = x;
    s->tail = x;
    if (x->slots) s->st.held_device_blocks += x->n;
    else s->bytes += (size_t)x->n * s->cfg.block_bytes;
    s->st.held++;
    s->st.held_blocks += x->n;
    return x->id;
}

uint64_t osp_kv_xfer_server_hold(osp_kv_xfer_server *s, const osp_block_hash *hashes, int32_t n,
                                 osp_status (*read)(void *ctx, int32_t i, void *dst), void *ctx, osp_status *err) {
    *err = OSP_OK;
    const size_t bb = s->cfg.block_bytes;
    if (n <= 0 || n > OSP_KV_XFER_MAX_BLOCKS || (size_t)n > s->cfg.cap_bytes / bb) return 0;
    xfer *x = calloc(1, sizeof *x);
    if (x && (!(x->h = malloc(sizeof *x->h * (size_t)n)) || !(x->data = malloc(bb * (size_t)n)))) {
        xfer_free(s, x);
        x = NULL;
    }
    if (!x) return 0;
    x->n = n;
    memcpy(x->h, hashes, sizeof *hashes * (size_t)n);
    for (int32_t i = 0; i < n; i++) {
        const osp_status st = read(ctx, i, x->data + (size_t)i * bb);
        if (st != OSP_OK) {
            *err = st;
            xfer_free(s, x);
            return 0;
        }
    }
    pthread_mutex_lock(&s->mu);
    while (s->bytes + (size_t)n * bb > s->cfg.cap_bytes && drop_oldest(s, false)) {} /* the oldest make room */
    const uint64_t id = list_xfer(s, x);
    pthread_mutex_unlock(&s->mu);
    return id;
}

uint64_t osp_kv_xfer_server_hold_device(osp_kv_xfer_server *s, const osp_block_hash *hashes, int32_t n,
                                        osp_status (*copy)(void *ctx, int32_t n, void *const *dsts), void *ctx,
                                        osp_status *err) {
    *err = OSP_OK;
    if (!s->has_dev || n <= 0 || n > OSP_KV_XFER_MAX_BLOCKS || n > s->n_slots) return 0;
    xfer *x = calloc(1, sizeof *x);
    void **dsts = malloc(sizeof *dsts * (size_t)n);
    if (x && (!(x->h = malloc(sizeof *x->h * (size_t)n)) || !(x->slots = malloc(sizeof *x->slots * (size_t)n)))) {
        free(x->h);
        free(x->slots);
        free(x);
        x = NULL;
    }
    if (!x || !dsts) {
        free(x);
        free(dsts);
        return 0;
    }
    x->n = n;
    memcpy(x->h, hashes, sizeof *hashes * (size_t)n);
    pthread_mutex_lock(&s->mu);
    /* room: the free slots plus those of the listed transfers no consumer is reading now; only when that
       is enough are the oldest dropped (a transfer being read keeps its slots until the reader is done) */
    int64_t could = s->n_free;
    for (const xfer *y = s->head; y && could < n; y = y->next)
        if (y->slots && y->refs == 0) could += y->n;
    if (could >= n)
        while (s->n_free < n && drop_oldest(s, true)) {}
    const bool room = s->n_free >= n;
    for (int32_t i = 0; room && i < n; i++) x->slots[i] = s->free_slots[--s->n_free]; /* taken, not yet listed */
    pthread_mutex_unlock(&s->mu);
    if (!room) {
        free(x->h);
        free(x->slots);
        free(x);
        free(dsts);
        return 0;
    }
    for (int32_t i = 0; i < n; i++) dsts[i] = (uint8_t *)s->dev.base + (size_t)x->slots[i] * s->cfg.block_bytes;
    const osp_status st = copy(ctx, n, dsts);
    free(dsts);
    pthread_mutex_lock(&s->mu);
    uint64_t id = 0;
    if (st == OSP_OK) id = list_xfer(s, x);
    else xfer_free(s, x); /* its slots back */
    pthread_mutex_unlock(&s->mu);
    *err = st;
    return id;
}

osp_kv_xfer_server_stats osp_kv_xfer_server_get_stats(osp_kv_xfer_server *s) {
    pthread_mutex_lock(&s->mu);
    const osp_kv_xfer_server_stats st = s->st;
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---- the consumer's fetch ------------------------------------------------------------------------- */

/* A connected socket to host:port within timeout_s, or -1 (errno-like reason in *why). */
static int dial(const char *host, int32_t port, double timeout_s, char *why, size_t cap) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    const int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0) {
        snprintf(why, cap, "cannot resolve %s: %s", host, gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    snprintf(why, cap, "no address for %s", host);
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        int r = connect(fd, a->ai_addr, a->ai_addrlen), e = r == 0 ? 0 : errno;
        if (r != 0 && e == EINPROGRESS) {
            struct pollfd pfd = {.fd = fd, .events = POLLOUT};
            r = poll(&pfd, 1, (int)(timeout_s * 1000));
            socklen_t len = sizeof e;
            if (r == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0 && e == 0) r = 0;
            else if (r == 0) e = ETIMEDOUT, r = -1;
            else r = -1;
        }
        if (r != 0) {
            snprintf(why, cap, "cannot connect to %s:%d: %s", host, port, strerror(e));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd >= 0) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        set_timeouts(fd, timeout_s);
    }
    return fd;
}

/* ---- the consumer's mapped arenas ---------------------------------------------------------------- */

#define MAX_PEERS 16

typedef struct peer {
    char host[256];
    int32_t port;
    uint64_t arena_id; /* of base */
    void *base;        /* the producer's arena mapped here, or NULL */
    bool no_ipc;       /* it refused the offer (older), or its arena would not map here: TCP only */
    double used;       /* the last fetch (the least recently used entry is replaced) */
} peer;

struct osp_kv_xfer_peers {
    osp_kv_xfer_ipc ipc;
    peer p[MAX_PEERS];
    int32_t n;
};

osp_status osp_kv_xfer_peers_create(const osp_kv_xfer_ipc *ipc, osp_kv_xfer_peers **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return osp_set_error(OSP_ERR_NOMEM, "kv transfer: out of memory");
    (*out)->ipc = *ipc;
    return OSP_OK;
}

static void peer_unmap(osp_kv_xfer_peers *ps, peer *pe) {
    if (pe->base) ps->ipc.close(ps->ipc.ctx, pe->base);
    pe->base = NULL;
    pe->arena_id = 0;
}

void osp_kv_xfer_peers_destroy(osp_kv_xfer_peers *ps) {
    if (!ps) return;
    for (int32_t i = 0; i < ps->n; i++) peer_unmap(ps, &ps->p[i]);
    free(ps);
}

int32_t osp_kv_xfer_peers_mapped(const osp_kv_xfer_peers *ps) {
    int32_t k = 0;
    for (int32_t i = 0; ps && i < ps->n; i++) k += ps->p[i].base != NULL;
    return k;
}

/* host:port's entry, made (replacing the least recently used, its arena unmapped) when add. */
static peer *peer_of(osp_kv_xfer_peers *ps, const char *host, int32_t port, bool add) {
    for (int32_t i = 0; i < ps->n; i++)
        if (ps->p[i].port == port && !strcmp(ps->p[i].host, host)) return &ps->p[i];
    if (!add) return NULL;
    peer *pe = NULL;
    if (ps->n < MAX_PEERS) {
        pe = &ps->p[ps->n++];
    } else {
        pe = &ps->p[0];
        for (int32_t i = 1; i < ps->n; i++)
            if (ps->p[i].used < pe->used) pe = &ps->p[i];
        peer_unmap(ps, pe);
    }
    *pe = (peer){.port = port};
    snprintf(pe->host, sizeof pe->host, "%s", host);
    return pe;
}

/* ---- the consumer's fetch ------------------------------------------------------------------------- */

enum { GOT_TCP = 0, GOT_IPC = 1, RETRY_TCP = 2 }; /* how an exchange ended (fetch_once) */

/* The answer by arena offsets after its 16-byte header rh: maps the arena, has write copy the blocks,
 * answers done. The caller closes fd. */
static osp_status take_ipc(osp_kv_xfer_peers *ps, peer *pe, int fd, const uint8_t *rh, const char *host, int32_t port,
                           size_t block_bytes, int32_t n, double deadline,
                           osp_status (*write)(void *, int32_t, const void *const *), void *wctx,
                           osp_kv_read_result *res, int *how) {
    uint8_t tail[DEV_TAIL];
    uint8_t *offs = malloc((size_t)n * 8 + 1);
    const void **srcs = malloc(sizeof *srcs * (size_t)n + 1);
    osp_status st = OSP_OK;
    if (!offs || !srcs) {
        st = osp_set_error(OSP_ERR_NOMEM, "kv transfer: out of memory");
    } else if (osp_get_le32(rh + 8) != ST_OK || osp_get_le32(rh + 12) != (uint32_t)n ||
               !read_full_by(fd, tail, sizeof tail, deadline) || !read_full_by(fd, offs, (size_t)n * 8, deadline)) {
        st = osp_set_error(OSP_ERR_IO, "kv transfer: the arena answer from %s:%d broke off", host, port);
    }
    const uint64_t arena_id = st == OSP_OK ? osp_get_le64(tail) : 0, arena_bytes = st == OSP_OK ? osp_get_le64(tail + 8) : 0;
    for (int32_t i = 0; st == OSP_OK && i < n; i++) {
        const uint64_t o = osp_get_le64(offs + (size_t)i * 8);
        if (o != NO_OFFSET && (arena_bytes < block_bytes || o > arena_bytes - block_bytes || o % block_bytes != 0))
            st = osp_set_error(OSP_ERR_IO, "kv transfer: %s:%d answered an offset outside its arena", host, port);
    }
    if (st == OSP_OK && pe->base && pe->arena_id != arena_id) peer_unmap(ps, pe); /* a restarted producer */
    if (st == OSP_OK && !pe->base) {
        void *base = NULL;
        if (ps->ipc.open(ps->ipc.ctx, tail + 16, &base) != OSP_OK) { /* another IPC namespace, say: by TCP */
            pe->no_ipc = true;
            *how = RETRY_TCP;
            const uint8_t no = 0;
            struct iovec iov = {.iov_base = (void *)&no, .iov_len = 1};
            send_all(fd, &iov, 1);
            free(offs);
            free(srcs);
            return OSP_OK;
        }
        pe->base = base;
        pe->arena_id = arena_id;
    }
    if (st == OSP_OK) {
        int32_t found = 0;
        for (int32_t i = 0; i < n; i++) {
            const uint64_t o = osp_get_le64(offs + (size_t)i * 8);
            srcs[i] = o == NO_OFFSET ? NULL : (const uint8_t *)pe->base + o;
            found += o != NO_OFFSET;
        }
        st = found > 0 ? write(wctx, n, srcs) : OSP_OK;
        /* done: the producer may reuse the slots. A producer that cannot be told is gone: the copies are
           not trusted (every block missing), and its mapping is dropped by the caller */
        const uint8_t done = 1; /* finished with the slots, copied or not (0 would keep the transfer: TCP next) */
        struct iovec iov = {.iov_base = (void *)&done, .iov_len = 1};
        const bool told = send_all(fd, &iov, 1);
        if (st == OSP_OK && !told)
            st = osp_set_error(OSP_ERR_IO, "kv transfer: %s:%d went away during the copies", host, port);
        for (int32_t i = 0; st == OSP_OK && i < n; i++) res[i] = srcs[i] ? OSP_KV_READ_OK : OSP_KV_READ_MISSING;
        if (st == OSP_OK) *how = GOT_IPC;
    }
    free(offs);
    free(srcs);
    return st;
}

/* One exchange: the request (offering IPC when pe), the answer read into dst / res (TCP) or through write
 * (IPC). *how says which, or RETRY_TCP: ask again without the offer. */
static osp_status fetch_once(osp_kv_xfer_peers *ps, peer *pe, const char *host, int32_t port, uint64_t engine_id,
                             uint64_t transfer_id, size_t block_bytes, const osp_block_hash *hashes, int32_t n,
                             bool release, double timeout_s, osp_status (*write)(void *, int32_t, const void *const *),
                             void *wctx, uint8_t *dst, osp_kv_read_result *res, int *how) {
    *how = GOT_TCP;
    /* the whole answer within 2 stalls plus its bytes at 50 MB/s: a producer that trickles cannot hold the
       consumer's loader longer */
    const double deadline = now_s() + 2 * timeout_s + (double)n * (double)block_bytes / 50e6;
    char why[320];
    const int fd = dial(host, port, timeout_s, why, sizeof why);
    if (fd < 0) return osp_set_error(OSP_ERR_IO, "kv transfer: %s", why);
    osp_status st = OSP_OK;
    uint8_t hdr[REQ_HEADER];
    memcpy(hdr, REQ_MAGIC, 8);
    osp_put_le64(hdr + 8, engine_id);
    osp_put_le64(hdr + 16, transfer_id);
    osp_put_le64(hdr + 24, (uint64_t)block_bytes);
    osp_put_le32(hdr + 32, (uint32_t)n);
    osp_put_le32(hdr + 36, (release ? FLAG_RELEASE : 0) | (pe ? FLAG_IPC : 0));
    uint8_t *raw = n ? malloc((size_t)n * OSP_KV_XFER_HASH_BYTES) : NULL;
    if (n && !raw) {
        close(fd);
        return osp_set_error(OSP_ERR_NOMEM, "kv transfer: out of memory");
    }
    for (int32_t i = 0; i < n; i++) put_hash(raw + (size_t)i * OSP_KV_XFER_HASH_BYTES, &hashes[i]);
    uint8_t tail[REQ_IPC_TAIL];
    if (pe) {
        memcpy(tail, ps->ipc.uuid, OSP_KV_XFER_UUID_BYTES);
        osp_put_le64(tail + OSP_KV_XFER_UUID_BYTES, osp_kv_xfer_process_nonce());
    }
    struct iovec iov[3] = {{.iov_base = hdr, .iov_len = sizeof hdr},
                           {.iov_base = raw, .iov_len = (size_t)n * OSP_KV_XFER_HASH_BYTES},
                           {.iov_base = tail, .iov_len = pe ? sizeof tail : 0}};
    uint8_t rh[RESP_HEADER];
    if (!send_all(fd, iov, 3) || !read_full_by(fd, rh, sizeof rh, deadline)) { /* empty iovecs are skipped */
        st = osp_set_error(OSP_ERR_IO, "kv transfer: %s:%d sent no answer", host, port);
    } else if (pe && !memcmp(rh, DEV_MAGIC, 8)) {
        st = take_ipc(ps, pe, fd, rh, host, port, block_bytes, n, deadline, write, wctx, res, how);
    } else if (memcmp(rh, RESP_MAGIC, 8) != 0) {
        st = osp_set_error(OSP_ERR_IO, "kv transfer: %s:%d sent no answer", host, port);
    } else if (osp_get_le32(rh + 8) == ST_MALFORMED && pe) { /* a producer older than the IPC offer */
        pe->no_ipc = true;
        *how = RETRY_TCP;
    } else if (osp_get_le32(rh + 8) != ST_OK) {
        const uint32_t code = osp_get_le32(rh + 8);
        st = osp_set_error(OSP_ERR_INVALID_ARG, "kv transfer: %s:%d refused transfer %016llx: %s", host, port,
                           (unsigned long long)transfer_id,
                           code == ST_NO_TRANSFER ? "it holds no such transfer (released, timed out or pushed out)"
                           : code == ST_FOREIGN   ? "another engine id or block size (another model, page format, "
                                                    "device or --prefix-caching-hash-seed)"
                                                  : "a malformed request");
    } else if (osp_get_le32(rh + 12) != (uint32_t)n) {
        st = osp_set_error(OSP_ERR_IO, "kv transfer: %s:%d answered for another block count", host, port);
    } else {
        for (int32_t i = 0; i < n; i++) {
            uint8_t found, sum[8];
            if (!read_full_by(fd, &found, 1, deadline)) {
                st = osp_set_error(OSP_ERR_IO, "kv transfer: the answer from %s:%d broke off", host, port);
                break;
            }
            if (!found) continue;
            uint8_t *p = dst + (size_t)i * block_bytes;
            if (!read_full_by(fd, p, block_bytes, deadline) || !read_full_by(fd, sum, 8, deadline)) {
                st = osp_set_error(OSP_ERR_IO, "kv transfer: the answer from %s:%d broke off", host, port);
                break;
            }
            res[i] = osp_get_le64(sum) == XXH3_64bits(p, block_bytes) ? OSP_KV_READ_OK : OSP_KV_READ_CORRUPT;
        }
    }
    if (st != OSP_OK)
        for (int32_t i = 0; i < n; i++) res[i] = OSP_KV_READ_MISSING; /* nothing of a failed exchange counts */
    free(raw);
    close(fd);
    return st;
}

static osp_status fetch_args_ok(const char *host, int32_t port, size_t block_bytes, int32_t n) {
    if (!host || port <= 0 || port > 65535 || n < 0 || n > OSP_KV_XFER_MAX_BLOCKS || (block_bytes == 0 && n > 0))
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv transfer: bad fetch (host %s, port %d, %d blocks)",
                             host ? host : "(none)", port, n);
    return OSP_OK;
}

osp_status osp_kv_xfer_fetch(const char *host, int32_t port, uint64_t engine_id, uint64_t transfer_id,
                             size_t block_bytes, const osp_block_hash *hashes, int32_t n, bool release,
                             double timeout_s, uint8_t *dst, osp_kv_read_result *res) {
    for (int32_t i = 0; i < n; i++) res[i] = OSP_KV_READ_MISSING;
    OSP_TRY(fetch_args_ok(host, port, block_bytes, n));
    int how;
    return fetch_once(NULL, NULL, host, port, engine_id, transfer_id, block_bytes, hashes, n, release,
                      timeout_s > 0 ? timeout_s : 10.0, NULL, NULL, dst, res, &how);
}

osp_status osp_kv_xfer_fetch_ipc(osp_kv_xfer_peers *peers, const char *host, int32_t port, uint64_t engine_id,
                                 uint64_t transfer_id, size_t block_bytes, const osp_block_hash *hashes, int32_t n,
                                 bool release, double timeout_s,
                                 osp_status (*write)(void *wctx, int32_t n, const void *const *srcs), void *wctx,
                                 uint8_t *dst, osp_kv_read_result *res, bool *via_ipc) {
    if (via_ipc) *via_ipc = false;
    for (int32_t i = 0; i < n; i++) res[i] = OSP_KV_READ_MISSING;
    OSP_TRY(fetch_args_ok(host, port, block_bytes, n));
    if (timeout_s <= 0) timeout_s = 10.0;
    peer *pe = peers && n > 0 && write ? peer_of(peers, host, port, true) : NULL;
    if (pe) pe->used = now_s();
    int how = GOT_TCP;
    osp_status st = fetch_once(peers, pe && !pe->no_ipc ? pe : NULL, host, port, engine_id, transfer_id, block_bytes,
                               hashes, n, release, timeout_s, write, wctx, dst, res, &how);
    if (st == OSP_OK && how == RETRY_TCP)
        st = fetch_once(peers, NULL, host, port, engine_id, transfer_id, block_bytes, hashes, n, release, timeout_s,
                        NULL, NULL, dst, res, &how);
    if (st == OSP_ERR_IO && pe) peer_unmap(peers, pe); /* unreachable, cut or gone: perhaps dead, its arena too */
    if (via_ipc) *via_ipc = st == OSP_OK && how == GOT_IPC;
    return st;
}
