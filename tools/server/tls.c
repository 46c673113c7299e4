/* --ssl-keyfile / --ssl-certfile: the PEM files read with a size bound, their shape checked, and the
 * pair tried by GnuTLS (through a libmicrohttpd daemon that never listens) before the command loads a
 * model, so that a wrong file is one clear line at start-up rather than a daemon that fails later
 * with no reason given. Contracts in tls.h. */
#include "tls.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Reads `path` (a regular file of 1..SRV_TLS_MAX_PEM bytes, no NUL byte) into a NUL-terminated buffer
 * the caller frees; NULL with why filled otherwise. */
static char *read_pem(const char *flag, const char *path, char *why, size_t cap) {
    /* O_NONBLOCK: opening a FIFO for reading must not wait for a writer (it is refused below) */
    const int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(why, cap, "%s: cannot open '%s': %s", flag, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    char *buf = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, cap, "%s: '%s' is not a regular file", flag, path);
        goto fail;
    }
    if ((unsigned long long)st.st_size > SRV_TLS_MAX_PEM) {
        snprintf(why, cap, "%s: '%s' is larger than %zu bytes (not a PEM key or certificate)", flag, path, SRV_TLS_MAX_PEM);
        goto fail;
    }
    buf = malloc(SRV_TLS_MAX_PEM + 1);
    if (!buf) {
        snprintf(why, cap, "%s: out of memory", flag);
        goto fail;
    }
    size_t n = 0;
    for (;;) { /* the file may grow after fstat: read at most one byte past the bound to see it */
        const ssize_t r = read(fd, buf + n, SRV_TLS_MAX_PEM + 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            snprintf(why, cap, "%s: cannot read '%s': %s", flag, path, strerror(errno));
            goto fail;
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n > SRV_TLS_MAX_PEM) {
            snprintf(why, cap, "%s: '%s' is larger than %zu bytes (not a PEM key or certificate)", flag, path, SRV_TLS_MAX_PEM);
            goto fail;
        }
    }
    if (n == 0) {
        snprintf(why, cap, "%s: '%s' is empty", flag, path);
        goto fail;
    }
    if (memchr(buf, '\0', n)) {
        snprintf(why, cap, "%s: '%s' holds a NUL byte (DER?): give the PEM form", flag, path);
        goto fail;
    }
    buf[n] = '\0';
    close(fd);
    char *fit = realloc(buf, n + 1); /* kept while the daemon runs: no need for the whole bound */
    return fit ? fit : buf;
fail:
    free(buf);
    close(fd);
    return NULL;
}

/* Whether text has a line "-----BEGIN <label>-----" whose label ends with `suffix` (RFC 7468 §2);
 * *label_out (when not NULL) gets the first such label's start. */
static bool has_pem_block(const char *text, const char *suffix, const char **label_out) {
    const size_t ns = strlen(suffix);
    for (const char *p = strstr(text, "-----BEGIN "); p; p = strstr(p + 1, "-----BEGIN ")) {
        const char *label = p + 11, *end = strstr(label, "-----");
        const char *nl = strchr(label, '\n');
        if (!end || (nl && nl < end) || (size_t)(end - label) < ns) continue;
        if (memcmp(end - ns, suffix, ns) == 0) {
            if (label_out) *label_out = label;
            return true;
        }
    }
    return false;
}

typedef struct probe_log {
    char msg[256]; /* libmicrohttpd's first message (GnuTLS's reason), one line */
} probe_log;

static void probe_logger(void *cls, const char *fmt, va_list ap) {
    probe_log *l = cls;
    if (l->msg[0]) return;
    vsnprintf(l->msg, sizeof l->msg, fmt, ap);
    l->msg[strcspn(l->msg, "\r\n")] = '\0';
}

static enum MHD_Result probe_handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                     const char *version, const char *data, size_t *size, void **state) {
    (void)cls, (void)c, (void)url, (void)method, (void)version, (void)data, (void)size, (void)state;
    return MHD_NO; /* never called: the probe has no socket */
}

int srv_tls_check_pem(const char *key, const char *cert, const char *keyfile, const char *certfile, char *why,
                      size_t cap) {
    const char *label = NULL;
    if (!has_pem_block(key, "PRIVATE KEY", &label)) {
        snprintf(why, cap, "--ssl-keyfile: '%s' holds no PEM private key (-----BEGIN PRIVATE KEY----- or "
                           "-----BEGIN RSA/EC PRIVATE KEY-----)", keyfile);
        return -1;
    }
    if (!strncmp(label, "ENCRYPTED ", 10) || strstr(key, "Proc-Type: 4,ENCRYPTED")) {
        snprintf(why, cap, "--ssl-keyfile: '%s' is an encrypted key, which is not supported (no password flag): "
                           "decrypt it, e.g. openssl pkey -in KEY -out PLAIN", keyfile);
        return -1;
    }
    if (!has_pem_block(cert, "CERTIFICATE", &label) || strncmp(label, "CERTIFICATE-----", 16) != 0) {
        snprintf(why, cap, "--ssl-certfile: '%s' holds no PEM certificate (-----BEGIN CERTIFICATE-----)", certfile);
        return -1;
    }
    /* GnuTLS decides whether the pair loads and matches: a daemon with no listening socket runs the
     * same certificate set-up the real one will */
    struct MHD_OptionItem opts[3] = {{MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)key},
                                     {MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)cert},
                                     {MHD_OPTION_END, 0, NULL}};
    probe_log log = {{0}};
    struct MHD_Daemon *d = MHD_start_daemon(MHD_USE_TLS | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                                            probe_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER, probe_logger, &log,
                                            MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    if (!d) {
        const char *m = log.msg[0] ? log.msg : "libmicrohttpd could not set up TLS";
        const char *reason = strstr(m, "certificate/key: ");
        snprintf(why, cap, "--ssl-keyfile '%s' / --ssl-certfile '%s': %s%s", keyfile, certfile,
                 reason ? "GnuTLS cannot use them: " : "", reason ? reason + 17 : m);
        return -1;
    }
    MHD_stop_daemon(d);
    return 0;
}

int srv_tls_load(srv_tls *t, const char *keyfile, const char *certfile, char *why, size_t cap) {
    memset(t, 0, sizeof *t);
    t->opts[0].option = MHD_OPTION_END;
    if (!keyfile && !certfile) return 0;
    if (!keyfile || !certfile) {
        snprintf(why, cap, "%s needs %s too (TLS takes a private key and its certificate)",
                 keyfile ? "--ssl-keyfile" : "--ssl-certfile", keyfile ? "--ssl-certfile" : "--ssl-keyfile");
        return -1;
    }
    if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(why, cap, "--ssl-keyfile: this libmicrohttpd is built without TLS support (Debian's is built with "
                           "GnuTLS: install libmicrohttpd12 from Debian)");
        return -1;
    }
    char *key = read_pem("--ssl-keyfile", keyfile, why, cap), *cert = NULL;
    if (!key) return -1;
    if (!(cert = read_pem("--ssl-certfile", certfile, why, cap)) ||
        srv_tls_check_pem(key, cert, keyfile, certfile, why, cap) != 0) {
        free(key);
        free(cert);
        return -1;
    }
    t->key_pem = key, t->cert_pem = cert;
    t->opts[0] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, t->key_pem};
    t->opts[1] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, t->cert_pem};
    t->opts[2] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    return 0;
}

bool srv_tls_on(const srv_tls *t) { return t && t->key_pem; }

unsigned srv_tls_daemon_flags(const srv_tls *t) { return srv_tls_on(t) ? (unsigned)MHD_USE_TLS : 0u; }

struct MHD_OptionItem *srv_tls_daemon_options(srv_tls *t) { return t->opts; }

const char *srv_tls_scheme(const srv_tls *t) { return srv_tls_on(t) ? "https" : "http"; }

void srv_tls_free(srv_tls *t) {
    if (!t) return;
    free(t->key_pem);
    free(t->cert_pem);
    memset(t, 0, sizeof *t);
    t->opts[0].option = MHD_OPTION_END;
}
