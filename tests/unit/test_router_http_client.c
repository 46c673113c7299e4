/* The router's libcurl client (tools/router/http_client.h) against a scripted one-connection server
 * on loopback: a chunked text/event-stream arrives decoded, byte for byte, whatever the chunk and
 * packet boundaries; the request carries its method, path, JSON body, extra header and no
 * "Expect: 100-continue"; a 100 Continue before the response is skipped; a body far larger than the
 * client's buffer (the transfer pauses and resumes) arrives whole; a Content-Length body cut short and
 * a total timeout are errors; a refused connection is -1 (nothing sent, safe to retry) and a server
 * that reads the request and hangs up is -2; closing a response mid-body closes the connection (the
 * backend sees EOF). rt_url_parse accepts only http://host:port[/]. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "http_client.h"

/* ---- the scripted server --------------------------------------------------------------------- */

typedef struct server {
    int lfd;
    int port;
    void (*script)(struct server *, int fd);
    pthread_t th;
    char req[1 << 16]; /* the request as received: head and body */
    size_t req_len;
    bool saw_eof; /* "close" script: the client closed while the server waited */
    size_t big;   /* "big" script: body size */
} server;

static void send_str(int fd, const char *s, size_t n) {
    while (n > 0) {
        const ssize_t k = send(fd, s, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        s += k, n -= (size_t)k;
    }
}

static void sendf(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sendf(int fd, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    send_str(fd, buf, (size_t)n);
}

/* Reads the request head and, per its Content-Length, its body into s->req. */
static void read_request(server *s, int fd) {
    s->req_len = 0;
    size_t need = 0;
    for (;;) {
        const ssize_t k = recv(fd, s->req + s->req_len, sizeof s->req - 1 - s->req_len, 0);
        if (k <= 0) return;
        s->req_len += (size_t)k;
        s->req[s->req_len] = 0;
        const char *end = strstr(s->req, "\r\n\r\n");
        if (!end) continue;
        if (!need) {
            const char *cl = strcasestr(s->req, "\r\nContent-Length:");
            need = (size_t)(end + 4 - s->req) + (cl && cl < end ? strtoul(cl + 17, NULL, 10) : 0);
        }
        if (s->req_len >= need) return;
    }
}

static void *server_main(void *arg) {
    server *s = arg;
    const int fd = accept(s->lfd, NULL, NULL);
    if (fd >= 0) {
        s->script(s, fd);
        close(fd);
    }
    return NULL;
}

static void server_start(server *s, void (*script)(server *, int)) {
    memset(s, 0, sizeof *s);
    s->script = script;
    s->lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(s->lfd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(s->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s->lfd, 4), 0);
    assert_int_equal(getsockname(s->lfd, (struct sockaddr *)&a, &al), 0);
    s->port = ntohs(a.sin_port);
    assert_int_equal(pthread_create(&s->th, NULL, server_main, s), 0);
}

static void server_join(server *s) {
    pthread_join(s->th, NULL);
    close(s->lfd);
}

static rt_url url_of(const server *s) {
    char text[64];
    snprintf(text, sizeof text, "http://127.0.0.1:%d", s->port);
    rt_url u;
    assert_true(rt_url_parse(text, &u));
    return u;
}

/* ---- scripts --------------------------------------------------------------------------------- */

static const char *const k_events[] = {"data: {\"text\": \"h\\u00e9llo\"}\n\n", ": a comment line\n\n",
                                       "data: {\"text\": \" world\"}\n\n", "data: [DONE]\n\n"};

/* A chunked SSE response written in awkward pieces: the head split from the first chunk, a chunk
 * size line split across writes, two chunks in one write, a chunk extension, then a trailer. */
static void script_sse(server *s, int fd) {
    read_request(s, fd);
    sendf(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n");
    sendf(fd, "Transfer-Encoding: chunked\r\n\r\n");
    sendf(fd, "%zx\r\n%s\r\n", strlen(k_events[0]), k_events[0]);
    sendf(fd, "%zx", strlen(k_events[1]));
    sendf(fd, ";ext=1\r\n%s\r\n%zx\r\n%s\r\n", k_events[1], strlen(k_events[2]), k_events[2]);
    sendf(fd, "%zx\r\n%s\r\n0\r\nX-Trailer: 1\r\n\r\n", strlen(k_events[3]), k_events[3]);
}

static void script_continue(server *s, int fd) {
    read_request(s, fd);
    sendf(fd, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
              "Content-Length: 2\r\n\r\n{}");
}

static void script_big(server *s, int fd) {
    read_request(s, fd);
    sendf(fd, "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %zu\r\n\r\n", s->big);
    char block[8192];
    for (size_t off = 0; off < s->big; off += sizeof block) {
        const size_t n = s->big - off < sizeof block ? s->big - off : sizeof block;
        for (size_t i = 0; i < n; i++) block[i] = (char)((off + i) * 7 % 251);
        send_str(fd, block, n);
    }
}

static void script_cut(server *s, int fd) {
    read_request(s, fd);
    sendf(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nonly these bytes");
}

static void script_hang_up(server *s, int fd) { read_request(s, fd); }

/* Headers and one chunk, then wait (up to 20 s) for the client to close the connection. */
static void script_close(server *s, int fd) {
    read_request(s, fd);
    sendf(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    sendf(fd, "%zx\r\n%s\r\n", strlen(k_events[0]), k_events[0]);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    char c;
    s->saw_eof = poll(&p, 1, 20000) == 1 && recv(fd, &c, 1, 0) <= 0;
}

/* Headers, then silence until the client goes (its total timeout, 1.5 s, ends it). */
static void script_stall(server *s, int fd) {
    read_request(s, fd);
    sendf(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10\r\n\r\nabc");
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, 20000);
}

/* ---- tests ----------------------------------------------------------------------------------- */

static void test_sse_byte_for_byte(void **state) {
    (void)state;
    server s;
    server_start(&s, script_sse);
    const rt_url u = url_of(&s);
    rt_http_resp resp;
    const char *body = "{\"prompt\": \"hi\", \"stream\": true}";
    const char *extra[] = {"Authorization: Bearer k1", NULL};
    assert_int_equal(rt_http_request(&u, "POST", "/v1/completions", extra, body, strlen(body), 2000, 0, &resp), 0);
    assert_int_equal(resp.status, 200);
    assert_string_equal(resp.content_type, "text/event-stream");
    char want[512] = "", got[512];
    for (int i = 0; i < 4; i++) strcat(want, k_events[i]);
    size_t n = 0;
    for (ssize_t k; (k = rt_http_read_body(&resp, got + n, 7)) != 0;) { /* small reads: the caller's cap is kept */
        assert_true(k > 0 && k <= 7);
        n += (size_t)k;
        assert_true(n < sizeof got);
    }
    assert_int_equal(n, strlen(want));
    assert_memory_equal(got, want, n);
    assert_int_equal(rt_http_read_body(&resp, got, sizeof got), 0); /* stays at the end */
    rt_http_close(&resp);
    rt_http_close(&resp); /* idempotent */
    server_join(&s);
    /* what the backend received */
    assert_true(!strncmp(s.req, "POST /v1/completions HTTP/1.1\r\n", 31));
    assert_non_null(strcasestr(s.req, "\r\nContent-Type: application/json\r\n"));
    assert_non_null(strcasestr(s.req, "\r\nAuthorization: Bearer k1\r\n"));
    assert_non_null(strcasestr(s.req, "\r\nConnection: close\r\n"));
    assert_null(strcasestr(s.req, "\r\nExpect:"));
    const char *b = strstr(s.req, "\r\n\r\n");
    assert_non_null(b);
    assert_string_equal(b + 4, body);
}

static void test_interim_response_skipped(void **state) {
    (void)state;
    server s;
    server_start(&s, script_continue);
    const rt_url u = url_of(&s);
    rt_http_resp resp;
    assert_int_equal(rt_http_request(&u, "GET", "/v1/models", NULL, NULL, 0, 2000, 5000, &resp), 0);
    assert_int_equal(resp.status, 201);
    assert_string_equal(resp.content_type, "application/json");
    size_t n = 0;
    char *all = rt_http_read_all(&resp, 1024, &n);
    assert_non_null(all);
    assert_string_equal(all, "{}");
    assert_int_equal(n, 2);
    free(all);
    rt_http_close(&resp);
    server_join(&s);
    assert_true(!strncmp(s.req, "GET /v1/models HTTP/1.1\r\n", 25));
}

static void test_big_body_pauses_and_resumes(void **state) {
    (void)state;
    server s;
    server_start(&s, script_big);
    s.big = (5u << 20) + 123; /* past the client's 1 MiB buffer several times */
    const rt_url u = url_of(&s);
    rt_http_resp resp;
    assert_int_equal(rt_http_request(&u, "GET", "/big", NULL, NULL, 0, 2000, 0, &resp), 0);
    char buf[3000];
    size_t off = 0;
    for (ssize_t k; (k = rt_http_read_body(&resp, buf, sizeof buf)) != 0;) {
        assert_true(k > 0);
        for (ssize_t i = 0; i < k; i++) assert_int_equal((unsigned char)buf[i], (off + (size_t)i) * 7 % 251);
        off += (size_t)k;
        assert_true(resp.w - resp.r <= (1u << 20) + CURL_MAX_WRITE_SIZE); /* bounded */
    }
    assert_int_equal(off, s.big);
    rt_http_close(&resp);
    server_join(&s);
    /* rt_http_read_all refuses a body past its max */
    server_start(&s, script_big);
    s.big = 100000;
    const rt_url u2 = url_of(&s);
    assert_int_equal(rt_http_request(&u2, "GET", "/big", NULL, NULL, 0, 2000, 0, &resp), 0);
    assert_null(rt_http_read_all(&resp, 50000, NULL));
    rt_http_close(&resp);
    server_join(&s);
}

static void test_body_cut_short(void **state) {
    (void)state;
    server s;
    server_start(&s, script_cut);
    const rt_url u = url_of(&s);
    rt_http_resp resp;
    assert_int_equal(rt_http_request(&u, "GET", "/x", NULL, NULL, 0, 2000, 0, &resp), 0);
    char buf[256];
    size_t n = 0;
    ssize_t k;
    while ((k = rt_http_read_body(&resp, buf + n, sizeof buf - n)) > 0) n += (size_t)k;
    assert_int_equal(k, -1);
    assert_int_equal(n, strlen("only these bytes"));
    assert_true(resp.error[0] != 0);
    rt_http_close(&resp);
    server_join(&s);
}

static void test_refused_and_hang_up(void **state) {
    (void)state;
    /* a port nobody listens on: bind one, then close it */
    server s;
    server_start(&s, script_hang_up);
    const rt_url u = url_of(&s);
    rt_http_resp resp;
    assert_int_equal(rt_http_request(&u, "POST", "/v1/completions", NULL, "{}", 2, 2000, 0, &resp), -2);
    assert_true(resp.error[0] != 0);
    assert_null(resp.easy);
    server_join(&s); /* the listener is closed now */
    assert_int_equal(rt_http_request(&u, "POST", "/v1/completions", NULL, "{}", 2, 2000, 0, &resp), -1);
    assert_true(resp.error[0] != 0);
    assert_int_equal(rt_http_read_body(&resp, (char[8]){0}, 8), -1); /* closed: an error, not an end */
    rt_http_close(&resp);
}

static void test_close_mid_body_reaches_backend(void **state) {
    (void)state;
    server s;
    server_start(&s, script_close);
    const rt_url u = url_of(&s);
    rt_http_resp resp;
    assert_int_equal(rt_http_request(&u, "POST", "/v1/completions", NULL, "{}", 2, 2000, 0, &resp), 0);
    char buf[256];
    assert_true(rt_http_read_body(&resp, buf, sizeof buf) > 0);
    rt_http_close(&resp);
    server_join(&s);
    assert_true(s.saw_eof);
}

static void test_total_timeout(void **state) {
    (void)state;
    server s;
    server_start(&s, script_stall);
    const rt_url u = url_of(&s);
    rt_http_resp resp;
    assert_int_equal(rt_http_request(&u, "GET", "/x", NULL, NULL, 0, 2000, 1500, &resp), 0);
    char buf[64];
    ssize_t k, n = 0;
    while ((k = rt_http_read_body(&resp, buf, sizeof buf)) > 0) n += k;
    assert_int_equal(k, -1);
    assert_int_equal(n, 3);
    rt_http_close(&resp);
    server_join(&s);
}

static void test_url_parse(void **state) {
    (void)state;
    rt_url u;
    assert_true(rt_url_parse("http://127.0.0.1:8001", &u));
    assert_string_equal(u.base, "http://127.0.0.1:8001");
    assert_true(rt_url_parse("http://osprey-0.osprey.default.svc.cluster.local:8000/", &u));
    assert_string_equal(u.base, "http://osprey-0.osprey.default.svc.cluster.local:8000");
    assert_true(rt_url_parse("http://[::1]:9000", &u));
    assert_string_equal(u.base, "http://[::1]:9000");
    const char *bad[] = {"", "127.0.0.1:8000", "https://h:8000", "HTTP://h:8000", "http://h", "http://h:",
                         "http://h:0", "http://h:65536", "http://h:80x", "http://h:8000/v1", "http://h:8000?a=1",
                         "http://h:8000/#f", "http://u:p@h:8000", "http://:8000", "http://h :8000", "ftp://h:21",
                         "http://h:8000\r\nX: y"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (rt_url_parse(bad[i], &u)) fail_msg("accepted '%s'", bad[i]);
    }
    assert_false(rt_url_parse(NULL, &u));
}

int main(void) {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url_parse),
        cmocka_unit_test(test_sse_byte_for_byte),
        cmocka_unit_test(test_interim_response_skipped),
        cmocka_unit_test(test_big_body_pauses_and_resumes),
        cmocka_unit_test(test_body_cut_short),
        cmocka_unit_test(test_refused_and_hang_up),
        cmocka_unit_test(test_close_mid_body_reaches_backend),
        cmocka_unit_test(test_total_timeout),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
