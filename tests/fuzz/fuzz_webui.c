/* libFuzzer target for the web server's request-side parsing (tools/server/webui.c, url.c): the
 * If-None-Match list (srv_webui_etag_match, against every embedded asset's ETag), the path lookup
 * (srv_webui_find) and the URL unescaping (srv_unescape: the result is no longer than the input, holds
 * no NUL, equals the input where it has no '%', and never decodes a %00). Input: the header value, a
 * NUL byte, the path (no NUL: the path is empty).
 * A match must be explainable (the value holds "*" or the tag's text); a lookup returns NULL or an
 * entry of the table whose path is the input (or the page for "/" and "/dashboard"); a crash, a
 * sanitizer report or a hang is a bug. Seeds: tests/fuzz/corpus/webui/. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "url.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 16 * 1024) return 0;
    char *buf = malloc(size + 2);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = buf[size + 1] = 0;
    const char *inm = buf, *path = buf + strlen(buf) + 1;
    if (path > buf + size) path = buf + size + 1;
    for (int i = 0; i < srv_webui_n_assets; i++) {
        const srv_webui_asset *a = &srv_webui_assets[i];
        const bool explained = strchr(inm, '*') || strstr(inm, a->etag); /* the quoted tag itself */
        if (srv_webui_etag_match(inm, a->etag) && !explained) abort();
    }
    const srv_webui_asset *a = srv_webui_find(path);
    if (a) {
        const bool page = !strcmp(path, "/") || !strcmp(path, "/dashboard");
        if (page ? strcmp(a->path, "/webui/index.html") : strcmp(a->path, path)) abort();
        if (a < srv_webui_assets || a >= srv_webui_assets + srv_webui_n_assets) abort();
    }
    /* the unescaping of the path, in place on a copy */
    const size_t n = strlen(path);
    char *u = malloc(n + 1);
    if (!u) abort();
    memcpy(u, path, n + 1);
    const size_t m = srv_unescape(NULL, NULL, u);
    if (m > n || strlen(u) != m) abort();
    if (!strchr(path, '%') && strcmp(u, path)) abort();
    if (strstr(path, "%00") && !strstr(u, "%00")) abort(); /* the three characters stay */
    free(u);
    free(buf);
    return 0;
}
