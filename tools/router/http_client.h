/* The HTTP client of `osprey router`, on libcurl (plain http:// to backends on a trusted network: no
 * TLS, no redirects, no proxy from the environment, no connection reuse: each request has its own
 * connection, closed when the response is closed, so a backend sees a client that left at once).
 *
 * A request is driven through libcurl's multi interface from the caller's thread, in pull form:
 * rt_http_request returns once the status line and headers have arrived, then rt_http_read_body
 * hands out body bytes as libcurl's write callback delivers them (chunked coding already undone,
 * RFC 9112 §7.1), so a text/event-stream passes through unbuffered, chunk by chunk, into a
 * libmicrohttpd content-reader callback. Nothing here is shared between threads: one rt_http_resp
 * belongs to one thread at a time. curl_global_init must have run before the first request (the
 * router calls it at start-up, before any thread). */
#ifndef OSPREY_TOOLS_ROUTER_HTTP_CLIENT_H
#define OSPREY_TOOLS_ROUTER_HTTP_CLIENT_H

#include <curl/curl.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct rt_url {
    char base[300]; /* "http://host:port", as libcurl normalized it (no trailing "/") */
} rt_url;

/* Parses "http://host:port" with an optional trailing "/" (host: a name, IPv4, or [IPv6]) through
 * libcurl's URL API; false for anything else: another scheme, no explicit port, a port outside
 * 1..65535, a path, query, fragment or credentials. */
bool rt_url_parse(const char *s, rt_url *out);

typedef struct rt_http_resp {
    CURL *easy;              /* NULL once closed */
    CURLM *multi;
    struct curl_slist *hdrs; /* the request's extra header lines */
    int status;              /* the final response's status code (1xx interim responses skipped) */
    char content_type[128];  /* "" when absent */
    bool headers_done;       /* the final response's header block ended */
    bool done;               /* libcurl finished the transfer (result says how) */
    bool paused;             /* the write callback paused the transfer: buf is full */
    bool eof;                /* the caller ended the body: rt_http_read_body returns 0 from now on */
    CURLcode result;         /* the transfer's outcome once done */
    char *buf;               /* body bytes received and not yet consumed: buf[r..w), capacity cap */
    size_t cap, r, w;
    char error[CURL_ERROR_SIZE]; /* libcurl's message for a failure, "" otherwise */
    int watch_fd;            /* the client's socket, watched while waiting (-1: none; see rt_http_request_watched) */
    bool gone;               /* the watched socket's peer closed it: the exchange was abandoned */
} rt_http_resp;

/* Sends method ("GET" or "POST") path to u with body[0..len) (POST: Content-Type application/json;
 * copied, so the caller may free it on return) and the extra header lines of headers (a
 * NULL-terminated list of "Name: value", no CRLF; NULL for none), then waits for the status line and
 * headers. connect_timeout_ms bounds the TCP connect; total_timeout_ms (0: none) bounds the whole
 * exchange, body included (the proxy passes 0: a stream lasts as long as generation does).
 * Returns 0 with *resp open (the body still to read; close it with rt_http_close), -1 when nothing was
 * sent (the connection could not be made or named: safe to retry elsewhere), -2 when the exchange
 * failed after bytes were sent (the backend may have seen the request). On -1/-2 *resp is closed and
 * resp->error says why. */
int rt_http_request(const rt_url *u, const char *method, const char *path, const char *const *headers,
                    const char *body, size_t len, long connect_timeout_ms, long total_timeout_ms, rt_http_resp *resp);

/* rt_http_request, and while it (and later rt_http_read_body) waits for the backend, watch_fd (a
 * connected socket: the router's client; -1 for none) is polled too: when its peer has closed it (a
 * peek reads end-of-file or a reset) the exchange is abandoned at once, resp->gone is set and the
 * backend's connection is closed when the caller closes resp, so the backend aborts the request. Bytes
 * waiting on watch_fd (a pipelined request, a TLS record) end the watch: nothing is consumed from it.
 * Returns as rt_http_request, and -3 when the client went away before the headers came (*resp closed). */
int rt_http_request_watched(const rt_url *u, const char *method, const char *path, const char *const *headers,
                            const char *body, size_t len, long connect_timeout_ms, long total_timeout_ms, int watch_fd,
                            rt_http_resp *resp);

/* Copies up to cap body bytes into out, blocking until some arrive. Returns the count, 0 at the clean
 * end of the body (or once resp->eof is set), -1 on an error or a body cut short (the backend went
 * away, a Content-Length or chunked body ended early, the total timeout passed, the watched client
 * went away: resp->gone). */
ssize_t rt_http_read_body(rt_http_resp *resp, char *out, size_t cap);

/* Reads the whole body (at most max bytes) into a malloc'd NUL-terminated string (*len its length
 * when len is not NULL); NULL on error or past max. */
char *rt_http_read_all(rt_http_resp *resp, size_t max, size_t *len);

/* Ends the exchange (closing the connection if the body was not read to the end) and frees what
 * *resp holds. Idempotent; safe on a zeroed or already-closed resp. */
void rt_http_close(rt_http_resp *resp);

#endif
