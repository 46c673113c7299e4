/* libFuzzer target for the router's backend-URL parser (rt_url_parse, tools/router/http_client.h: an
 * "http://host:port[/]" read through libcurl's URL API).
 *
 * Input: the bytes as the URL text (NUL-terminated copy). An accepted URL must come back as
 * "http://HOST:PORT" (NUL-terminated, no space or control byte, PORT 1..65535 without leading zeros)
 * and parse again to the very same text; a crash, a sanitizer report or a result that breaks these is
 * a bug. Seeds: tests/fuzz/corpus/router_url/. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http_client.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = 0;
    rt_url u;
    memset(&u, 0x5a, sizeof u);
    if (rt_url_parse(text, &u)) {
        const char *end = memchr(u.base, 0, sizeof u.base);
        if (!end || strncmp(u.base, "http://", 7)) abort();
        for (const char *p = u.base; p < end; p++)
            if ((unsigned char)*p <= ' ' || *p == 0x7f) abort();
        const char *colon = strrchr(u.base, ':');
        if (!colon || colon < u.base + 7 || colon[1] == '0') abort();
        char *num_end = NULL;
        const long port = strtol(colon + 1, &num_end, 10);
        if (port < 1 || port > 65535 || *num_end) abort();
        rt_url again;
        if (!rt_url_parse(u.base, &again) || strcmp(again.base, u.base)) abort();
    }
    free(text);
    return 0;
}
