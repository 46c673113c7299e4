/* tools/server/park.c without libmicrohttpd: srv_fd_alive on real loopback TCP sockets (a peer that is
 * there, one that sent bytes and stays, one that closed, one that closed leaving bytes unread, one
 * that half-closed, one that reset), and the watcher thread marking a listed park gone when its peer
 * closes and expired when its deadline passes, a wake making the next srv_park_suspend say AGAIN. The
 * parks here are never suspended (that needs a daemon: the integration suite does it). Waits poll
 * for a state with a generous bound; nothing is timed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve_internal.h"

/* A connected loopback TCP pair: *srv_end (accepted), *cli_end. */
static void tcp_pair(int *srv_end, int *cli_end) {
    const int l = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(l >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(l, 1), 0);
    socklen_t n = sizeof a;
    assert_int_equal(getsockname(l, (struct sockaddr *)&a, &n), 0);
    *cli_end = socket(AF_INET, SOCK_STREAM, 0);
    assert_int_equal(connect(*cli_end, (struct sockaddr *)&a, sizeof a), 0);
    *srv_end = accept(l, NULL, NULL);
    assert_true(*srv_end >= 0);
    close(l);
}

/* srv_fd_alive(fd) once the peer's last action has arrived: polled until it says `want` or ~10 s. */
static bool settles_to(int fd, bool want) {
    for (int i = 0; i < 1000; i++) {
        if (srv_fd_alive(fd) == want) return true;
        usleep(10000);
    }
    return false;
}

static void test_fd_alive(void **state) {
    (void)state;
    int s, c;
    tcp_pair(&s, &c); /* there, silent */
    assert_true(srv_fd_alive(s));
    assert_int_equal(write(c, "GET /", 5), 5); /* there, with bytes pipelined */
    assert_true(settles_to(s, true));
    usleep(50000);
    assert_true(srv_fd_alive(s));
    close(c); /* gone, its bytes still unread (a peek alone would see them and call it alive) */
    assert_true(settles_to(s, false));
    close(s);

    tcp_pair(&s, &c); /* an orderly close */
    close(c);
    assert_true(settles_to(s, false));
    close(s);

    tcp_pair(&s, &c); /* half-closed: it will send nothing more, so its request is abandoned */
    assert_int_equal(shutdown(c, SHUT_WR), 0);
    assert_true(settles_to(s, false));
    close(s), close(c);

    tcp_pair(&s, &c); /* a reset */
    const struct linger lg = {.l_onoff = 1, .l_linger = 0};
    assert_int_equal(setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg), 0);
    close(c);
    assert_true(settles_to(s, false));
    close(s);

    assert_true(srv_fd_alive(-1)); /* unknown: never taken for gone */
}

static bool park_flag(srv_park *p, const bool *flag) {
    for (int i = 0; i < 1000; i++) {
        pthread_mutex_lock(&p->mu);
        const bool v = *flag;
        pthread_mutex_unlock(&p->mu);
        if (v) return true;
        usleep(10000);
    }
    return false;
}

static void test_watcher(void **state) {
    (void)state;
    srv_server srv;
    memset(&srv, 0, sizeof srv);
    assert_int_equal(srv_park_start(&srv), 0);
    int s, c;
    tcp_pair(&s, &c);
    srv_park p;
    srv_park_init(&p, NULL);
    p.fd = s;
    srv_park_watch(&srv, &p, false, 0);
    srv_park_wake(&srv, &p); /* news before the suspend: it is not lost */
    assert_int_equal(srv_park_suspend(&srv, &p), SRV_PARK_AGAIN);
    usleep(300000); /* a few watcher rounds over a live peer */
    assert_false(srv_park_gone(&srv, &p));
    close(c);
    assert_true(park_flag(&p, &p.gone));
    assert_true(srv_park_gone(&srv, &p));
    assert_int_equal(srv_park_suspend(&srv, &p), SRV_PARK_GONE);
    srv_park_unwatch(&srv, &p);
    srv_park_destroy(&p);
    close(s);

    /* a queue wait's deadline; srv_park_wake_queue wakes it, others not */
    tcp_pair(&s, &c);
    srv_park q, r;
    srv_park_init(&q, NULL), srv_park_init(&r, NULL);
    q.fd = r.fd = s;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* srv_now_s()'s clock */
    srv_park_watch(&srv, &q, true, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + 0.2);
    srv_park_watch(&srv, &r, false, 0);
    srv_park_wake_queue(&srv);
    pthread_mutex_lock(&q.mu);
    assert_true(q.wake);
    q.wake = false;
    pthread_mutex_unlock(&q.mu);
    pthread_mutex_lock(&r.mu);
    assert_false(r.wake);
    pthread_mutex_unlock(&r.mu);
    assert_true(park_flag(&q, &q.expired));
    assert_int_equal(srv_park_suspend(&srv, &q), SRV_PARK_EXPIRED);
    srv_park_unwatch(&srv, &q);
    srv_park_unwatch(&srv, &r);
    assert_int_equal(srv.n_parks, 0);
    assert_int_equal(srv.n_queue_parks, 0);
    /* the daemon stops: every park reads gone */
    srv_park_stop_all(&srv);
    assert_int_equal(srv_park_suspend(&srv, &r), SRV_PARK_GONE);
    srv_park_join(&srv);
    srv_park_destroy(&q), srv_park_destroy(&r);
    close(s), close(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fd_alive), cmocka_unit_test(test_watcher)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
