/* Pieces of `osprey serve`'s start-up log that are pure text: the load progress bar (drawn only when
 * stderr is a terminal; a log file never gets it) and the URL to open. Contracts in server.h. */
#include <stdio.h>
#include <string.h>

#include "server.h"

size_t srv_progress_bar(char *out, size_t cap, double fraction) {
    if (!cap) return 0;
    if (!(fraction >= 0)) fraction = 0; /* NaN too */
    if (fraction > 1) fraction = 1;
    enum { WIDTH = 30 };
    const int filled = (int)(fraction * WIDTH + 1e-9), pct = (int)(fraction * 100 + 1e-9);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++) bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    const int n = snprintf(out, cap, "loading weights [%s] %3d%%", bar, pct);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

size_t srv_local_url(char *out, size_t cap, const char *scheme, const char *host, unsigned port) {
    if (!cap) return 0;
    /* a wildcard address is reachable from this machine at loopback */
    if (!host || !host[0] || !strcmp(host, "0.0.0.0")) host = "127.0.0.1";
    else if (!strcmp(host, "::") || !strcmp(host, "[::]")) host = "::1";
    const bool v6 = strchr(host, ':') && host[0] != '[';
    const int n = snprintf(out, cap, "%s://%s%s%s:%u", scheme, v6 ? "[" : "", host, v6 ? "]" : "", port);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}
