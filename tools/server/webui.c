/* The web page's routing, apart from libmicrohttpd so it is unit-tested: which embedded file a path
 * serves, and whether a conditional GET's If-None-Match matches its ETag (then routes.c answers 304).
 * The files themselves (tools/server/webui/: HTML, CSS and JS written here, no libraries, nothing
 * fetched from elsewhere) are C arrays generated at build time by cmake/embed_webui.cmake. */
#include <string.h>

#include "server.h"

const srv_webui_asset *srv_webui_find(const char *url) {
    if (!url) return NULL;
    if (!strcmp(url, "/") || !strcmp(url, "/dashboard")) url = "/webui/index.html";
    for (int i = 0; i < srv_webui_n_assets; i++)
        if (!strcmp(url, srv_webui_assets[i].path)) return &srv_webui_assets[i];
    return NULL;
}

bool srv_webui_etag_match(const char *inm, const char *etag) {
    if (!inm || !etag) return false;
    const size_t n = strlen(etag);
    const char *p = inm;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == ',') p++;
        if (!*p) return false;
        if (*p == '*') return true;
        if (p[0] == 'W' && p[1] == '/') p += 2; /* weak comparison: the W/ prefix does not count */
        const char *end = p;
        if (*end == '"') { /* a quoted tag: to its closing quote */
            end = strchr(end + 1, '"');
            if (!end) return false;
            end++;
        } else {
            while (*end && *end != ',') end++;
        }
        if ((size_t)(end - p) == n && !memcmp(p, etag, n)) return true;
        p = end;
    }
}
