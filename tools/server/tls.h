/* HTTPS for `osprey serve` and `osprey router`: vLLM's --ssl-keyfile / --ssl-certfile, served through
 * libmicrohttpd's TLS (MHD_USE_TLS with MHD_OPTION_HTTPS_MEM_KEY / MHD_OPTION_HTTPS_MEM_CERT; Debian
 * builds libmicrohttpd with GnuTLS).
 *
 * A command parses the two paths with its flags, then calls srv_tls_load once at start-up, before
 * anything slow (the model load): it reads both PEM files (at most SRV_TLS_MAX_PEM bytes each), checks
 * their shape, and starts a daemon without a listening socket on them so that GnuTLS itself says
 * whether the key and the certificate load and belong together. Every failure is one message for the
 * command to print before it exits non-zero; nothing is left allocated. The loaded srv_tls then gives
 * the daemon flags and an MHD_OPTION_ARRAY to append to the real MHD_start_daemon call, and must
 * outlive that daemon (libmicrohttpd keeps pointers to the PEM text).
 *
 * Not implemented: client certificates (vLLM's --ssl-ca-certs, --ssl-cert-reqs other than 0) and
 * encrypted keys (uvicorn's --ssl-keyfile-password): the commands refuse them by name. */
#ifndef OSPREY_TOOLS_SERVER_TLS_H
#define OSPREY_TOOLS_SERVER_TLS_H

#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

/* Largest PEM file read (a certificate chain of a few certificates is a few KiB). */
#define SRV_TLS_MAX_PEM ((size_t)1 << 20)

typedef struct srv_tls {
    char *key_pem;  /* NUL-terminated PEM text of --ssl-keyfile, owned; NULL: TLS off */
    char *cert_pem; /* NUL-terminated PEM text of --ssl-certfile (a chain: leaf first), owned */
    struct MHD_OptionItem opts[3]; /* HTTPS_MEM_KEY, HTTPS_MEM_CERT, END (only END when off) */
} srv_tls;

/* Loads the key and certificate files into *t (zeroed first) and checks them.
 * keyfile, certfile: the flag values; both NULL: TLS off (*t usable, returns 0).
 * Returns 0, or -1 with a one-line reason in why[cap] (naming the flag and the file) and *t zeroed:
 *   - one of the two paths without the other;
 *   - this libmicrohttpd built without TLS (MHD_is_feature_supported(MHD_FEATURE_TLS));
 *   - a file that cannot be opened or read, is not a regular file, is empty, holds a NUL byte or
 *     exceeds SRV_TLS_MAX_PEM;
 *   - a key file with no "-----BEGIN ... PRIVATE KEY-----" block, or an encrypted key; a certificate
 *     file with no "-----BEGIN CERTIFICATE-----" block;
 *   - GnuTLS refusing the pair (bad PEM or DER inside, a key that does not match the certificate):
 *     its own message, e.g. "The certificate and the given key do not match.".
 * Source: libmicrohttpd manual, "HTTPS" (MHD_OPTION_HTTPS_MEM_KEY, _MEM_CERT); RFC 7468 (PEM labels). */
int srv_tls_load(srv_tls *t, const char *keyfile, const char *certfile, char *why, size_t cap);

/* The checks of srv_tls_load after the files are read: key and cert are NUL-terminated PEM texts
 * (borrowed, unchanged); keyfile and certfile only name them in messages. Returns 0, or -1 with the
 * reason in why[cap]. Pure apart from GnuTLS's global state; thread-safe as libmicrohttpd is. */
int srv_tls_check_pem(const char *key, const char *cert, const char *keyfile, const char *certfile, char *why,
                      size_t cap);

/* Whether TLS is on (a pair was loaded). */
bool srv_tls_on(const srv_tls *t);
/* MHD_USE_TLS when on, else 0: to OR into MHD_start_daemon's flags. */
unsigned srv_tls_daemon_flags(const srv_tls *t);
/* The value of an MHD_OPTION_ARRAY argument for MHD_start_daemon: the key and certificate options
 * when on, an empty list (just MHD_OPTION_END) when off. Points into *t. */
struct MHD_OptionItem *srv_tls_daemon_options(srv_tls *t);
/* "https" when on, else "http": for the start-up log and URLs. */
const char *srv_tls_scheme(const srv_tls *t);
/* Frees the PEM text and zeroes *t; after the daemon that used it has stopped. NULL is fine. */
void srv_tls_free(srv_tls *t);

#endif
