/* A small blocking HTTP/1.1 client for `osprey router` (plain http:// to backends on a trusted network;
 * no TLS, no redirects, no keep-alive: every request sends "Connection: close"). Responses are read
 * through rt_http_resp: the status line and headers first, then the body as it arrives, chunked
 * transfer coding decoded (RFC 9112 §7.1), so a text/event-stream passes through unbuffered. */
#ifndef OSPREY_TOOLS_ROUTER_HTTP_CLIENT_H
#define OSPREY_TOOLS_ROUTER_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct rt_url {
    char host[256];
    char port[8];
} rt_url;

/* Parses "http://host:port" (an optional trailing "/"); false for anything else. */
bool rt_url_parse(const char *s, rt_url *out);

typedef struct rt_http_resp {
    int fd;
    int status;              /* from the status line */
    char content_type[128];  /* "" when absent */
    bool chunked;            /* Transfer-Encoding: chunked */
    long long content_left;  /* Content-Length left to read, -1: until EOF or chunked */
    long long chunk_left;    /* chunked: bytes left in the current chunk; -1: read a size line next */
    bool eof;                /* the body ended (cleanly) */
    char buf[16384];
    size_t r, w;             /* buf[r..w) read from fd, not consumed */
} rt_http_resp;

/* Connects to u (timeout_ms for the connect), sends method path with extra_headers (each line ending
 * "\r\n", may be NULL) and body[0..len), and reads the status line and headers into *resp. Returns 0,
 * -1 when the connection could not be made (nothing was sent: safe to retry elsewhere), -2 when it
 * failed after that (the backend may have seen the request). On error resp->fd is closed (-1). */
int rt_http_request(const rt_url *u, const char *method, const char *path, const char *extra_headers,
                    const char *body, size_t len, int timeout_ms, rt_http_resp *resp);

/* Reads up to cap body bytes into out (blocking until some arrive). Returns the count, 0 at the
 * clean end of the body, -1 on an error or a body cut short (the backend went away). */
ssize_t rt_http_read_body(rt_http_resp *resp, char *out, size_t cap);

/* Reads the whole body (at most max bytes) into a malloc'd NUL-terminated string; NULL on error. */
char *rt_http_read_all(rt_http_resp *resp, size_t max, size_t *len);

void rt_http_close(rt_http_resp *resp);

#endif
