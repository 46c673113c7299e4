/* The router's HTTP client on libcurl (see http_client.h). One easy handle in its own multi handle per
 * exchange, driven from the caller's thread: curl_multi_perform + curl_multi_poll until the final
 * response's headers have arrived (the header callback sees the blank line ending a block whose
 * status is not 1xx), then again whenever the caller wants body bytes and none are buffered. The
 * write callback appends to a buffer; past RT_BUF_MAX it pauses the transfer (CURL_WRITEFUNC_PAUSE)
 * until the caller has drained it, so a fast backend and a slow client cannot grow it without end. */
#include "http_client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define RT_BUF_MAX (1u << 20) /* body bytes buffered before the transfer is paused */

bool rt_url_parse(const char *s, rt_url *out) {
    if (!s || strncmp(s, "http://", 7)) return false;
    for (const char *c = s; *c; c++) /* no percent escapes, spaces, controls or non-ASCII bytes at all */
        if (*c == '%' || (unsigned char)*c <= ' ' || (unsigned char)*c >= 0x7f) return false;
    CURLU *h = curl_url();
    if (!h) return false;
    char *host = NULL, *port = NULL, *path = NULL, *part = NULL;
    bool ok = false;
    if (curl_url_set(h, CURLUPART_URL, s, 0) != CURLUE_OK) goto out;
    if (curl_url_get(h, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host[0]) goto out;
    /* a backend is a DNS name or an IP literal: letters, digits, '.', '-' ([ ] : for IPv6); anything
     * else (percent escapes, bytes >= 0x80 that curl would have to encode) is refused, so the
     * "http://HOST:PORT" written below parses back to itself (fuzz_router_url) */
    for (const char *c = host; *c; c++) {
        const bool v6 = host[0] == '[';
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
              *c == '-' || (v6 && (*c == '[' || *c == ']' || *c == ':'))))
            goto out;
    }
    if (curl_url_get(h, CURLUPART_PORT, &port, 0) != CURLUE_OK) goto out; /* CURLUE_NO_PORT: none given */
    const long p = strtol(port, NULL, 10);
    if (p < 1 || p > 65535) goto out;
    if (curl_url_get(h, CURLUPART_PATH, &path, 0) != CURLUE_OK || strcmp(path, "/")) goto out;
    /* nothing else may be there: a query, a fragment, credentials */
    const CURLUPart none[] = {CURLUPART_QUERY, CURLUPART_FRAGMENT, CURLUPART_USER, CURLUPART_PASSWORD, CURLUPART_OPTIONS};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        const CURLUcode rc = curl_url_get(h, none[i], &part, 0);
        curl_free(part);
        part = NULL;
        if (rc == CURLUE_OK) goto out;
    }
    const int n = snprintf(out->base, sizeof out->base, "http://%s:%ld", host, p);
    ok = n > 0 && (size_t)n < sizeof out->base;
out:
    curl_free(host);
    curl_free(port);
    curl_free(path);
    curl_url_cleanup(h);
    return ok;
}

/* libcurl's header callback: each header line of every response block (1xx interim ones, the final
 * one, then any chunked trailer), CRLF included. The blank line ending a non-1xx block ends the wait. */
static size_t on_header(char *p, size_t size, size_t n, void *ud) {
    rt_http_resp *r = ud;
    const size_t len = size * n;
    if (!r->headers_done && (len == 0 || p[0] == '\r' || p[0] == '\n')) {
        long code = 0;
        curl_easy_getinfo(r->easy, CURLINFO_RESPONSE_CODE, &code);
        if (code >= 200) {
            char *ct = NULL;
            curl_easy_getinfo(r->easy, CURLINFO_CONTENT_TYPE, &ct);
            snprintf(r->content_type, sizeof r->content_type, "%s", ct ? ct : "");
            r->status = (int)code;
            r->headers_done = true;
        }
    }
    return len;
}

/* libcurl's write callback: the body, chunked coding undone, as it arrives. */
static size_t on_body(char *p, size_t size, size_t n, void *ud) {
    rt_http_resp *r = ud;
    const size_t len = size * n;
    if (r->r == r->w) r->r = r->w = 0;
    if (r->w + len > r->cap && r->r > 0) { /* move the unread bytes to the front first */
        memmove(r->buf, r->buf + r->r, r->w - r->r);
        r->w -= r->r, r->r = 0;
    }
    if (r->w + len > r->cap) {
        if (r->w > 0 && r->w + len > RT_BUF_MAX) { /* full: libcurl keeps this data until the caller drains */
            r->paused = true;
            return CURL_WRITEFUNC_PAUSE;
        }
        size_t cap = r->cap ? r->cap : 16384;
        while (cap < r->w + len) cap *= 2;
        char *b = realloc(r->buf, cap);
        if (!b) return 0; /* libcurl fails the transfer with CURLE_WRITE_ERROR */
        r->buf = b, r->cap = cap;
    }
    memcpy(r->buf + r->w, p, len);
    r->w += len;
    return len;
}

static bool have(const rt_http_resp *r, bool want_headers) { return want_headers ? r->headers_done : r->w > r->r; }

/* The watched socket is readable: its peer closed it (end-of-file or an error on a peek), or it has
 * bytes for us, which end the watch (nothing is read from it). */
static void check_watch(rt_http_resp *r) {
    char c;
    const ssize_t k = recv(r->watch_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k > 0) r->watch_fd = -1;
    else if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        r->gone = true, r->done = true, r->result = CURLE_ABORTED_BY_CALLBACK;
        snprintf(r->error, sizeof r->error, "the client went away");
    }
}

/* Runs the transfer until the headers (want_headers) or some body bytes are there, or it is done. */
static void drive(rt_http_resp *r, bool want_headers) {
    while (!have(r, want_headers) && !r->done) {
        int running = 0;
        CURLMcode mc = curl_multi_perform(r->multi, &running);
        int left = 0;
        for (CURLMsg *m; mc == CURLM_OK && (m = curl_multi_info_read(r->multi, &left));)
            if (m->msg == CURLMSG_DONE) r->done = true, r->result = m->data.result;
        if (mc == CURLM_OK && !have(r, want_headers) && !r->done) {
            struct curl_waitfd w = {.fd = r->watch_fd, .events = CURL_WAIT_POLLIN};
            mc = curl_multi_poll(r->multi, r->watch_fd >= 0 ? &w : NULL, r->watch_fd >= 0 ? 1 : 0, 1000, NULL);
            if (mc == CURLM_OK && r->watch_fd >= 0 && w.revents) check_watch(r);
        }
        if (mc != CURLM_OK) {
            snprintf(r->error, sizeof r->error, "%s", curl_multi_strerror(mc));
            r->done = true, r->result = CURLE_RECV_ERROR;
        }
    }
}

static bool add_header(rt_http_resp *r, const char *line) {
    struct curl_slist *h = curl_slist_append(r->hdrs, line);
    if (h) r->hdrs = h;
    return h != NULL;
}

int rt_http_request(const rt_url *u, const char *method, const char *path, const char *const *headers,
                    const char *body, size_t len, long connect_timeout_ms, long total_timeout_ms, rt_http_resp *resp) {
    return rt_http_request_watched(u, method, path, headers, body, len, connect_timeout_ms, total_timeout_ms, -1, resp);
}

int rt_http_request_watched(const rt_url *u, const char *method, const char *path, const char *const *headers,
                            const char *body, size_t len, long connect_timeout_ms, long total_timeout_ms, int watch_fd,
                            rt_http_resp *resp) {
    memset(resp, 0, sizeof *resp);
    resp->watch_fd = watch_fd;
    char url[2048];
    const int un = snprintf(url, sizeof url, "%s%s", u->base, path);
    if (un <= 0 || (size_t)un >= sizeof url) {
        snprintf(resp->error, sizeof resp->error, "the URL is too long");
        return -1;
    }
    resp->easy = curl_easy_init();
    resp->multi = curl_multi_init();
    bool ok = resp->easy && resp->multi;
    /* "Expect:" empty: no 100-continue round trip before a large body */
    const char *fixed[] = {"Connection: close", "Expect:", body && len ? "Content-Type: application/json" : NULL};
    for (size_t i = 0; ok && i < 3; i++)
        if (fixed[i]) ok = add_header(resp, fixed[i]);
    for (size_t i = 0; ok && headers && headers[i]; i++) ok = add_header(resp, headers[i]);
    CURL *e = resp->easy;
    ok = ok && !curl_easy_setopt(e, CURLOPT_URL, url) && !curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L) &&
         !curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http") && !curl_easy_setopt(e, CURLOPT_PROXY, "") &&
         !curl_easy_setopt(e, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1) &&
         !curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout_ms) &&
         !curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, total_timeout_ms > 0 ? total_timeout_ms : 0L) &&
         !curl_easy_setopt(e, CURLOPT_FORBID_REUSE, 1L) && !curl_easy_setopt(e, CURLOPT_FRESH_CONNECT, 1L) &&
         !curl_easy_setopt(e, CURLOPT_ERRORBUFFER, resp->error) && !curl_easy_setopt(e, CURLOPT_HTTPHEADER, resp->hdrs) &&
         !curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header) && !curl_easy_setopt(e, CURLOPT_HEADERDATA, resp) &&
         !curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body) && !curl_easy_setopt(e, CURLOPT_WRITEDATA, resp);
    if (ok && !strcmp(method, "POST"))
        ok = !curl_easy_setopt(e, CURLOPT_POST, 1L) && !curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len) &&
             !curl_easy_setopt(e, CURLOPT_COPYPOSTFIELDS, body && len ? body : "");
    else if (ok && strcmp(method, "GET"))
        ok = !curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    if (!ok || curl_multi_add_handle(resp->multi, e) != CURLM_OK) {
        rt_http_close(resp);
        if (!resp->error[0]) snprintf(resp->error, sizeof resp->error, "cannot set up the request (out of memory?)");
        return -1;
    }
    drive(resp, true);
    if (resp->headers_done) return 0;
    /* failed before a response: was anything sent? (libcurl counts the request bytes it wrote) */
    long sent = 0;
    curl_easy_getinfo(e, CURLINFO_REQUEST_SIZE, &sent);
    if (!resp->error[0]) snprintf(resp->error, sizeof resp->error, "%s", curl_easy_strerror(resp->result));
    const bool gone = resp->gone;
    rt_http_close(resp);
    return gone ? -3 : sent > 0 ? -2 : -1;
}

ssize_t rt_http_read_body(rt_http_resp *r, char *out, size_t cap) {
    if (r->eof || cap == 0) return 0;
    if (!r->easy) return -1;
    if (r->r == r->w) {
        if (r->paused) { /* drained: let libcurl hand over what it held back */
            r->paused = false;
            if (curl_easy_pause(r->easy, CURLPAUSE_CONT) != CURLE_OK) return -1;
        }
        drive(r, false);
    }
    if (r->w > r->r) {
        size_t n = r->w - r->r;
        if (n > cap) n = cap;
        memcpy(out, r->buf + r->r, n);
        r->r += n;
        return (ssize_t)n;
    }
    if (r->done && r->result == CURLE_OK) {
        r->eof = true;
        return 0;
    }
    if (!r->error[0]) snprintf(r->error, sizeof r->error, "%s", curl_easy_strerror(r->result));
    return -1;
}

char *rt_http_read_all(rt_http_resp *r, size_t max, size_t *len) {
    size_t cap = 4096, n = 0;
    char *s = malloc(cap + 1);
    if (!s) return NULL;
    for (;;) {
        if (n == cap) {
            if (cap >= max) goto fail;
            char *t = realloc(s, cap * 2 + 1);
            if (!t) goto fail;
            s = t, cap *= 2;
        }
        const ssize_t k = rt_http_read_body(r, s + n, cap - n);
        if (k < 0) goto fail;
        if (k == 0) break;
        n += (size_t)k;
    }
    s[n] = 0;
    if (len) *len = n;
    return s;
fail:
    free(s);
    return NULL;
}

void rt_http_close(rt_http_resp *r) {
    if (r->easy) {
        if (r->multi) curl_multi_remove_handle(r->multi, r->easy);
        curl_easy_cleanup(r->easy); /* an unfinished transfer's connection is closed, never kept */
    }
    if (r->multi) curl_multi_cleanup(r->multi);
    curl_slist_free_all(r->hdrs);
    free(r->buf);
    r->easy = NULL, r->multi = NULL, r->hdrs = NULL, r->buf = NULL;
    r->cap = r->r = r->w = 0;
}
