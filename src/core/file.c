/* Bounded whole-file reads (see file.h). */
#include "core/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

osp_status osp_read_file(const char *path, size_t max_bytes, const char *what, char **out, size_t *len) {
    *out = NULL, *len = 0;
    if (!what) what = "file";
    if (!path) return osp_set_error(OSP_ERR_IO, "%s: no path given", what);
    FILE *f = fopen(path, "rb");
    if (!f) return osp_set_error(OSP_ERR_IO, "cannot open %s %s: %s", what, path, strerror(errno));
    char *buf = NULL;
    size_t n = 0, cap = 0;
    const size_t limit = max_bytes < (size_t)-2 ? max_bytes + 1 : max_bytes; /* read one byte past: too large? */
    for (;;) {
        if (n == cap) {
            if (cap >= limit) break;
            size_t nc = cap ? cap * 2 : 4096;
            if (nc < cap || nc > limit) nc = limit;
            char *nb = realloc(buf, nc + 1);
            if (!nb) {
                free(buf), fclose(f);
                return osp_set_error(OSP_ERR_NOMEM, "reading %s %s: out of memory", what, path);
            }
            buf = nb, cap = nc;
        }
        const size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    const int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return osp_set_error(OSP_ERR_IO, "cannot read %s %s", what, path);
    }
    if (n > max_bytes) {
        free(buf);
        return osp_set_error(OSP_ERR_IO, "%s %s is larger than %zu bytes", what, path, max_bytes);
    }
    if (!buf && !(buf = malloc(1))) return osp_set_error(OSP_ERR_NOMEM, "reading %s %s: out of memory", what, path);
    buf[n] = '\0';
    *out = buf, *len = n;
    return OSP_OK;
}
