/* url.h: the URL unescape step shared by osprey serve and osprey router. */
#include "url.h"

static int hex_digit(char ch) {
    return ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
}

size_t srv_unescape(void *cls, struct MHD_Connection *c, char *s) {
    (void)cls, (void)c; /* libmicrohttpd's callback signature */
    char *w = s;
    for (const char *r = s; *r;) {
        if (r[0] == '%' && hex_digit(r[1]) >= 0 && hex_digit(r[2]) >= 0) {
            const int v = hex_digit(r[1]) * 16 + hex_digit(r[2]);
            if (v != 0) {
                *w++ = (char)v;
                r += 3;
                continue;
            }
        }
        *w++ = *r++;
    }
    *w = '\0';
    return (size_t)(w - s);
}
