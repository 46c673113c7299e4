/* The router's HTTP/1.1 client (see http_client.h): connect with a timeout, send, parse the status
 * line and the few headers the proxy needs, then a body reader that undoes chunked coding. */
#include "http_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

bool rt_url_parse(const char *s, rt_url *out) {
    if (strncmp(s, "http://", 7)) return false;
    s += 7;
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s || (size_t)(colon - s) >= sizeof out->host) return false;
    memcpy(out->host, s, (size_t)(colon - s));
    out->host[colon - s] = 0;
    const char *p = colon + 1;
    size_t n = 0;
    while (p[n] >= '0' && p[n] <= '9') n++;
    if (n == 0 || n > 5 || (p[n] && strcmp(p + n, "/"))) return false;
    memcpy(out->port, p, n);
    out->port[n] = 0;
    return atoi(out->port) > 0 && atoi(out->port) < 65536;
}

static int connect_to(const rt_url *u, int timeout_ms) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(u->host, u->port, &hints, &ai) != 0 || !ai) return -1;
    int fd = -1;
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        const int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            int err = 0;
            socklen_t el = sizeof err;
            rc = poll(&p, 1, timeout_ms) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0 ? 0 : -1;
        }
        if (rc != 0) {
            close(fd);
            fd = -1;
            continue;
        }
        fcntl(fd, F_SETFL, fl);
    }
    freeaddrinfo(ai);
    return fd;
}

static bool send_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k, n -= (size_t)k;
    }
    return true;
}

static bool fill(rt_http_resp *r) {
    if (r->r > 0 && r->r == r->w) r->r = r->w = 0;
    if (r->w == sizeof r->buf) {
        if (r->r == 0) return false; /* a line longer than the buffer */
        memmove(r->buf, r->buf + r->r, r->w - r->r);
        r->w -= r->r, r->r = 0;
    }
    for (;;) {
        const ssize_t k = recv(r->fd, r->buf + r->w, sizeof r->buf - r->w, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        r->w += (size_t)k;
        return true;
    }
}

/* One line without its CRLF into line[cap]; false at EOF or error. */
static bool read_line(rt_http_resp *r, char *line, size_t cap) {
    for (;;) {
        char *nl = memchr(r->buf + r->r, '\n', r->w - r->r);
        if (nl) {
            size_t n = (size_t)(nl - (r->buf + r->r));
            const size_t take = n;
            if (n > 0 && r->buf[r->r + n - 1] == '\r') n--;
            if (n >= cap) n = cap - 1;
            memcpy(line, r->buf + r->r, n);
            line[n] = 0;
            r->r += take + 1;
            return true;
        }
        if (!fill(r)) return false;
    }
}

int rt_http_request(const rt_url *u, const char *method, const char *path, const char *extra_headers,
                    const char *body, size_t len, int timeout_ms, rt_http_resp *resp) {
    memset(resp, 0, sizeof *resp);
    resp->fd = connect_to(u, timeout_ms);
    if (resp->fd < 0) return -1;
    char head[2048];
    const int hn = snprintf(head, sizeof head,
                            "%s %s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\nContent-Length: %zu\r\n%s%s\r\n",
                            method, path, u->host, u->port, len, body ? "Content-Type: application/json\r\n" : "",
                            extra_headers ? extra_headers : "");
    if (hn <= 0 || (size_t)hn >= sizeof head || !send_all(resp->fd, head, (size_t)hn) || (len && !send_all(resp->fd, body, len)))
        goto fail;
    char line[1024];
    if (!read_line(resp, line, sizeof line) || strncmp(line, "HTTP/1.", 7) || strlen(line) < 12) goto fail;
    resp->status = atoi(line + 9);
    if (resp->status < 100 || resp->status > 599) goto fail;
    resp->content_left = -1;
    resp->chunk_left = -1;
    for (;;) {
        if (!read_line(resp, line, sizeof line)) goto fail;
        if (!line[0]) break;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        *colon = 0;
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t') v++;
        if (!strcasecmp(line, "Content-Type")) snprintf(resp->content_type, sizeof resp->content_type, "%s", v);
        else if (!strcasecmp(line, "Transfer-Encoding") && strcasestr(v, "chunked")) resp->chunked = true;
        else if (!strcasecmp(line, "Content-Length")) resp->content_left = atoll(v);
    }
    if (resp->chunked) resp->content_left = -1;
    return 0;
fail:
    rt_http_close(resp);
    return -2;
}

ssize_t rt_http_read_body(rt_http_resp *r, char *out, size_t cap) {
    if (r->eof || cap == 0) return 0;
    if (r->chunked) {
        if (r->chunk_left == 0) { /* the CRLF after a chunk's data */
            char crlf[8];
            if (!read_line(r, crlf, sizeof crlf) || crlf[0]) return -1;
            r->chunk_left = -1;
        }
        if (r->chunk_left < 0) {
            char line[256];
            if (!read_line(r, line, sizeof line)) return -1;
            char *end;
            const long long n = strtoll(line, &end, 16);
            if (end == line || n < 0) return -1;
            if (n == 0) { /* the last chunk: skip the trailer */
                do {
                    if (!read_line(r, line, sizeof line)) return -1;
                } while (line[0]);
                r->eof = true;
                return 0;
            }
            r->chunk_left = n;
        }
        if (r->r == r->w && !fill(r)) return -1;
        size_t n = r->w - r->r;
        if ((long long)n > r->chunk_left) n = (size_t)r->chunk_left;
        if (n > cap) n = cap;
        memcpy(out, r->buf + r->r, n);
        r->r += n, r->chunk_left -= (long long)n;
        return (ssize_t)n;
    }
    if (r->content_left == 0) {
        r->eof = true;
        return 0;
    }
    if (r->r == r->w && !fill(r)) {
        if (r->content_left < 0) { /* until EOF: a clean close ends the body */
            r->eof = true;
            return 0;
        }
        return -1;
    }
    size_t n = r->w - r->r;
    if (r->content_left >= 0 && (long long)n > r->content_left) n = (size_t)r->content_left;
    if (n > cap) n = cap;
    memcpy(out, r->buf + r->r, n);
    r->r += n;
    if (r->content_left > 0) r->content_left -= (long long)n;
    return (ssize_t)n;
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
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
}
