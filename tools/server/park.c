/* osprey serve: parked connections, how a request waits without holding a thread.
 *
 * libmicrohttpd runs a pool of --http-threads event-loop threads (epoll), each serving many
 * connections, so a handler must never block one. A request that waits (for its engine's tokens, for
 * a --max-queued-requests slot under --queue-wait-timeout) parks its connection: the handler or the
 * content reader calls MHD_suspend_connection (libmicrohttpd's "suspend/resume" API) and returns;
 * whoever has news (the engine callback, a request that frees a slot, the watcher below) calls
 * MHD_resume_connection and libmicrohttpd calls the handler or reader again on its thread.
 *
 * While a connection is suspended libmicrohttpd neither times it out nor notices its client leave
 * (its documentation says so), so one watcher thread looks every SRV_PARK_WATCH_MS at the socket of
 * every listed park (a running request's or a queued one's, suspended or not): poll(2) with POLLRDHUP
 * (a peer that closed or half-closed its end is gone even with bytes of its own still unread), a peek
 * that reads 0 bytes, a reset. A gone client's park is marked and resumed, so its request is aborted
 * and its KV blocks freed within ~0.1 s whatever the token rate. It also ends queue waits that
 * reached their deadline.
 *
 * Locking: each park has its own mutex (p->mu) over its state, so the engine's callback, which wakes
 * a park per output, meets only that connection's pool thread; srv->park_mu guards the watch list
 * (and each park's listed/queue fields). Order: j->mu -> srv->park_mu -> p->mu; under p->mu only
 * libmicrohttpd's own cleanup mutex is taken (by suspend and resume), and libmicrohttpd calls no
 * callback under that. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "serve_internal.h"

enum { SRV_PARK_WATCH_MS = 100 };

/* srv_now_s()'s clock (CLOCK_MONOTONIC seconds), here so that this file links without serve.c. */
static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Under p->mu: resume p if suspended, else leave it a note not to suspend. */
static void wake_locked(srv_park *p) {
    if (p->suspended) {
        p->suspended = false;
        MHD_resume_connection(p->conn);
    } else {
        p->wake = true;
    }
}

void srv_park_init(srv_park *p, struct MHD_Connection *c) {
    *p = (srv_park){.conn = c, .fd = -1};
    pthread_mutex_init(&p->mu, NULL);
    p->inited = true;
    const union MHD_ConnectionInfo *ci = c ? MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD) : NULL;
    if (ci) p->fd = ci->connect_fd;
}

void srv_park_destroy(srv_park *p) {
    if (p->inited) pthread_mutex_destroy(&p->mu);
    p->inited = false;
}

void srv_park_watch(srv_server *srv, srv_park *p, bool queue, double deadline) {
    pthread_mutex_lock(&srv->park_mu);
    if (!p->listed) {
        p->prev = NULL;
        p->next = srv->parks;
        if (srv->parks) srv->parks->prev = p;
        srv->parks = p;
        p->listed = true;
        srv->n_parks++;
    }
    if (queue && !p->queue) srv->n_queue_parks++;
    if (!queue && p->queue) srv->n_queue_parks--;
    p->queue = queue;
    pthread_mutex_lock(&p->mu);
    p->deadline = deadline;
    p->expired = false;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&srv->park_mu);
}

void srv_park_unwatch(srv_server *srv, srv_park *p) {
    pthread_mutex_lock(&srv->park_mu);
    if (p->listed) {
        if (p->prev) p->prev->next = p->next;
        else srv->parks = p->next;
        if (p->next) p->next->prev = p->prev;
        p->prev = p->next = NULL;
        p->listed = false;
        srv->n_parks--;
        if (p->queue) srv->n_queue_parks--;
        p->queue = false;
    }
    pthread_mutex_unlock(&srv->park_mu);
}

srv_park_result srv_park_suspend(srv_server *srv, srv_park *p) {
    pthread_mutex_lock(&p->mu);
    srv_park_result r;
    if (p->gone || atomic_load(&srv->park_stopping)) r = SRV_PARK_GONE;
    else if (p->expired) r = SRV_PARK_EXPIRED;
    else if (p->wake) r = SRV_PARK_AGAIN;
    else r = SRV_PARK_SUSPENDED;
    p->wake = false;
    if (r == SRV_PARK_SUSPENDED) {
        p->suspended = true;
        MHD_suspend_connection(p->conn);
    }
    pthread_mutex_unlock(&p->mu);
    return r;
}

bool srv_park_gone(srv_server *srv, srv_park *p) {
    pthread_mutex_lock(&p->mu);
    const bool gone = p->gone || atomic_load(&srv->park_stopping);
    pthread_mutex_unlock(&p->mu);
    return gone;
}

void srv_park_wake(srv_server *srv, srv_park *p) {
    (void)srv; /* one park's lock: the engine's callback meets no other connection here */
    pthread_mutex_lock(&p->mu);
    wake_locked(p);
    pthread_mutex_unlock(&p->mu);
}

/* Marks p gone or expired (under p->mu) and wakes it, once per mark; neither: a plain wake. */
static void mark_wake(srv_park *p, bool gone, bool expired) {
    pthread_mutex_lock(&p->mu);
    bool news = !gone && !expired; /* a plain wake */
    if (gone && !p->gone) p->gone = news = true;
    if (expired && !p->expired) p->expired = news = true;
    if (news) wake_locked(p);
    pthread_mutex_unlock(&p->mu);
}

void srv_park_wake_queue(srv_server *srv) {
    pthread_mutex_lock(&srv->park_mu);
    if (srv->n_queue_parks > 0)
        for (srv_park *p = srv->parks; p; p = p->next)
            if (p->queue) mark_wake(p, false, false);
    pthread_mutex_unlock(&srv->park_mu);
}

/* Is a socket whose poll(2) gave revents gone? (A hang-up, a reset, an error; readable with a peek
 * that reads 0 bytes: an orderly close.) */
static bool revents_gone(int fd, short revents) {
    if (revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) return true;
    if (revents & POLLIN) {
        char c;
        const ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (r == 0) return true;
        if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    }
    return false;
}

bool srv_fd_alive(int fd) {
    if (fd < 0) return true;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    int n;
    while ((n = poll(&p, 1, 0)) < 0 && errno == EINTR) {
    }
    return n <= 0 || !revents_gone(fd, p.revents);
}

/* The watcher: every SRV_PARK_WATCH_MS, every listed park's socket and deadline. The sockets are
 * looked at under park_mu (a listed park's connection is open: its owner unlists it before the
 * connection can close), each with a non-blocking poll. */
static void *watch_main(void *arg) {
    srv_server *srv = arg;
    struct pollfd *pf = NULL; /* [cap] one poll(2) over the listed sockets */
    srv_park **who = NULL;    /* [cap] their parks */
    size_t cap = 0;
    pthread_mutex_lock(&srv->park_mu);
    while (!srv->park_quit) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SRV_PARK_WATCH_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&srv->park_cv, &srv->park_mu, &ts);
        if (srv->park_quit) break;
        if ((size_t)srv->n_parks > cap) {
            const size_t want = (size_t)srv->n_parks * 2;
            struct pollfd *a = realloc(pf, sizeof *pf * want);
            if (a) pf = a;
            srv_park **b = realloc(who, sizeof *who * want);
            if (b) who = b;
            if (a && b) cap = want;
        }
        /* p->fd and p->deadline are set before the park is listed and do not change while listed */
        size_t n = 0;
        for (srv_park *p = srv->parks; p && n < cap; p = p->next)
            if (p->fd >= 0) pf[n] = (struct pollfd){.fd = p->fd, .events = POLLIN | POLLRDHUP}, who[n++] = p;
        int got;
        while ((got = poll(pf, (nfds_t)n, 0)) < 0 && errno == EINTR) {
        }
        for (size_t i = 0; got > 0 && i < n; i++)
            if (pf[i].revents && revents_gone(pf[i].fd, pf[i].revents)) mark_wake(who[i], true, false);
        const double now = mono_s();
        for (srv_park *p = srv->parks; p; p = p->next)
            if (p->deadline > 0 && now >= p->deadline) mark_wake(p, false, true);
    }
    pthread_mutex_unlock(&srv->park_mu);
    free(pf);
    free(who);
    return NULL;
}

int srv_park_start(srv_server *srv) {
    pthread_mutex_init(&srv->park_mu, NULL);
    pthread_cond_init(&srv->park_cv, NULL);
    if (pthread_create(&srv->park_thread, NULL, watch_main, srv) != 0) return -1;
    srv->park_started = true;
    return 0;
}

void srv_park_stop_all(srv_server *srv) {
    atomic_store(&srv->park_stopping, true); /* before the wakes: a park that looks after one sees it */
    pthread_mutex_lock(&srv->park_mu);
    for (srv_park *p = srv->parks; p; p = p->next) mark_wake(p, false, false);
    pthread_mutex_unlock(&srv->park_mu);
}

void srv_park_join(srv_server *srv) {
    if (!srv->park_started) return;
    pthread_mutex_lock(&srv->park_mu);
    srv->park_quit = true;
    pthread_cond_broadcast(&srv->park_cv);
    pthread_mutex_unlock(&srv->park_mu);
    pthread_join(srv->park_thread, NULL);
    srv->park_started = false;
}
