/* libFuzzer target for the key / certificate checks of --ssl-keyfile / --ssl-certfile
 * (srv_tls_check_pem, tools/server/tls.h): the PEM block search, the encrypted-key refusal, then
 * GnuTLS parsing the pair through a libmicrohttpd daemon that never listens.
 *
 * Input: the key text, a NUL byte, the certificate text (no NUL: all of it is the key, the
 * certificate empty). The result must be 0 or -1, with a non-empty, NUL-terminated reason on -1;
 * a crash, a sanitizer report or a leak is a bug. Seeds: tests/fuzz/corpus/tls_pem/ (the fixture
 * pair, the mismatched key, swapped files, junk inside the labels). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tls.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 64 * 1024) return 0;
    char *buf = malloc(size + 2);
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = buf[size + 1] = 0;
    const char *key = buf, *cert = buf + strlen(buf) + 1; /* past the first NUL (or the empty string at the end) */
    if (cert > buf + size) cert = buf + size + 1;
    char why[512];
    memset(why, 0x5a, sizeof why);
    const int r = srv_tls_check_pem(key, cert, "k", "c", why, sizeof why);
    if (r != 0 && r != -1) abort();
    if (r == -1 && (!memchr(why, 0, sizeof why) || !why[0])) abort();
    free(buf);
    return 0;
}
