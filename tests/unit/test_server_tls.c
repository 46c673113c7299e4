/* tools/server/tls.c (--ssl-keyfile / --ssl-certfile) and startup_log.c (the load bar, the URL).
 *
 * srv_tls_load against the committed test-only pair (tests/integration/fixtures/tls: a P-256 key, its
 * self-signed certificate, and a key that is not the certificate's) and against files made here:
 * every refusal is -1 with a reason naming the flag, *t left off (nothing to free), and GnuTLS's own
 * word for a pair that does not belong together. A loaded pair gives MHD_USE_TLS and the two
 * MHD_OPTION_HTTPS_MEM_* options with the files' text. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "server.h"
#include "tls.h"

static char g_fix[512], g_dir[64];

static const char *fix(const char *name) {
    static char p[4][640];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_fix, name);
    return p[k];
}

static const char *tmp(const char *name, const char *text, size_t n) {
    static char p[4][640];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", g_dir, name);
    FILE *f = fopen(p[k], "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, n, f), n);
    fclose(f);
    return p[k];
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char buf[8192];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* srv_tls_load must refuse with a reason holding `frag`, leaving t off. */
static void expect_refused(const char *key, const char *cert, const char *frag) {
    srv_tls t;
    char why[768] = "";
    if (srv_tls_load(&t, key, cert, why, sizeof why) != -1) fail_msg("accepted key %s cert %s", key, cert);
    if (!strstr(why, frag)) fail_msg("'%s' not in: %s", frag, why);
    assert_false(srv_tls_on(&t));
    assert_null(t.key_pem);
    assert_null(t.cert_pem);
    assert_int_equal(srv_tls_daemon_flags(&t), 0);
    assert_int_equal(srv_tls_daemon_options(&t)[0].option, MHD_OPTION_END);
}

static void test_off(void **state) {
    (void)state;
    srv_tls t;
    char why[64] = "";
    assert_int_equal(srv_tls_load(&t, NULL, NULL, why, sizeof why), 0);
    assert_false(srv_tls_on(&t));
    assert_string_equal(srv_tls_scheme(&t), "http");
    assert_int_equal(srv_tls_daemon_flags(&t), 0);
    assert_int_equal(srv_tls_daemon_options(&t)[0].option, MHD_OPTION_END);
    srv_tls_free(&t);
    srv_tls_free(NULL);
}

static void test_loads_the_pair(void **state) {
    (void)state;
    srv_tls t;
    char why[768] = "";
    if (srv_tls_load(&t, fix("key.pem"), fix("cert.pem"), why, sizeof why) != 0) fail_msg("%s", why);
    assert_true(srv_tls_on(&t));
    assert_string_equal(srv_tls_scheme(&t), "https");
    assert_int_equal(srv_tls_daemon_flags(&t), MHD_USE_TLS);
    const struct MHD_OptionItem *o = srv_tls_daemon_options(&t);
    assert_int_equal(o[0].option, MHD_OPTION_HTTPS_MEM_KEY);
    assert_string_equal((const char *)o[0].ptr_value, slurp(fix("key.pem")));
    assert_int_equal(o[1].option, MHD_OPTION_HTTPS_MEM_CERT);
    assert_string_equal((const char *)o[1].ptr_value, slurp(fix("cert.pem")));
    assert_int_equal(o[2].option, MHD_OPTION_END);
    srv_tls_free(&t);
    assert_false(srv_tls_on(&t));
    assert_int_equal(srv_tls_daemon_options(&t)[0].option, MHD_OPTION_END);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refused(fix("key.pem"), NULL, "--ssl-keyfile needs --ssl-certfile too");
    expect_refused(NULL, fix("cert.pem"), "--ssl-certfile needs --ssl-keyfile too");
    expect_refused("/nonexistent/k.pem", fix("cert.pem"), "--ssl-keyfile: cannot open '/nonexistent/k.pem'");
    expect_refused(fix("key.pem"), "/nonexistent/c.pem", "--ssl-certfile: cannot open '/nonexistent/c.pem'");
    expect_refused(g_dir, fix("cert.pem"), "is not a regular file");
    expect_refused(tmp("empty.pem", "", 0), fix("cert.pem"), "is empty");
    expect_refused(fix("key.pem"), tmp("nul.pem", "-----BEGIN CERTIFICATE-----\n\0x", 30), "holds a NUL byte");
    /* a key that is not the certificate's: GnuTLS says so */
    expect_refused(fix("other-key.pem"), fix("cert.pem"), "The certificate and the given key do not match");
    /* swapped, or one file for both */
    expect_refused(fix("cert.pem"), fix("key.pem"), "holds no PEM private key");
    expect_refused(fix("key.pem"), fix("key.pem"), "holds no PEM certificate");
    /* encrypted keys: PKCS#8 and the legacy OpenSSL header */
    const char enc8[] = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nMIIB\n-----END ENCRYPTED PRIVATE KEY-----\n";
    expect_refused(tmp("enc8.pem", enc8, sizeof enc8 - 1), fix("cert.pem"), "is an encrypted key");
    const char encl[] = "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00\n\nMIIB\n"
                        "-----END RSA PRIVATE KEY-----\n";
    expect_refused(tmp("encl.pem", encl, sizeof encl - 1), fix("cert.pem"), "is an encrypted key");
    /* the right labels around bytes that are not a key or certificate: GnuTLS's reason */
    const char junk[] = "-----BEGIN PRIVATE KEY-----\nnot base64 at all !!\n-----END PRIVATE KEY-----\n";
    expect_refused(tmp("junk.pem", junk, sizeof junk - 1), fix("cert.pem"), "GnuTLS cannot use them");
    const char junkc[] = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    expect_refused(fix("key.pem"), tmp("junkc.pem", junkc, sizeof junkc - 1), "GnuTLS cannot use them");
}

static void test_size_bound_and_fifo(void **state) {
    (void)state;
    /* one byte over the bound, though it starts like a key */
    const size_t n = SRV_TLS_MAX_PEM + 1;
    char *big = malloc(n);
    assert_non_null(big);
    memset(big, 'A', n);
    memcpy(big, "-----BEGIN PRIVATE KEY-----\n", 28);
    expect_refused(tmp("big.pem", big, n), fix("cert.pem"), "is larger than 1048576 bytes");
    free(big);
    /* a FIFO is refused at once (opening it must not wait for a writer) */
    char fifo[640];
    snprintf(fifo, sizeof fifo, "%s/fifo.pem", g_dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    expect_refused(fix("key.pem"), fifo, "is not a regular file");
}

static void test_check_pem_directly(void **state) {
    (void)state;
    char why[768] = "";
    static char key[8192], cert[8192];
    memcpy(key, slurp(fix("key.pem")), sizeof key);
    memcpy(cert, slurp(fix("cert.pem")), sizeof cert);
    assert_int_equal(srv_tls_check_pem(key, cert, "k", "c", why, sizeof why), 0);
    assert_int_equal(srv_tls_check_pem("", cert, "k", "c", why, sizeof why), -1);
    assert_non_null(strstr(why, "--ssl-keyfile: 'k'"));
    /* a label split across lines is no PEM block */
    assert_int_equal(srv_tls_check_pem("-----BEGIN PRIVATE\n KEY-----\n", cert, "k", "c", why, sizeof why), -1);
    assert_non_null(strstr(why, "holds no PEM private key"));
    assert_int_equal(srv_tls_check_pem(key, "-----BEGIN TRUSTED CERTIFICATE-----\n", "k", "c", why, sizeof why), -1);
    assert_non_null(strstr(why, "holds no PEM certificate"));
}

static void test_progress_bar(void **state) {
    (void)state;
    char b[128] = "";
    const size_t n0 = srv_progress_bar(b, sizeof b, 0.0);
    assert_int_equal(n0, strlen(b));
    assert_string_equal(b, "loading weights [..............................]   0%");
    srv_progress_bar(b, sizeof b, 0.5);
    assert_string_equal(b, "loading weights [###############...............]  50%");
    srv_progress_bar(b, sizeof b, 1.0);
    assert_string_equal(b, "loading weights [##############################] 100%");
    srv_progress_bar(b, sizeof b, 7.0); /* clamped */
    assert_string_equal(b, "loading weights [##############################] 100%");
    srv_progress_bar(b, sizeof b, -1.0);
    assert_string_equal(b, "loading weights [..............................]   0%");
    srv_progress_bar(b, sizeof b, (double)NAN);
    assert_string_equal(b, "loading weights [..............................]   0%");
    srv_progress_bar(b, sizeof b, 0.999);
    assert_string_equal(b, "loading weights [#############################.]  99%");
    assert_int_equal(srv_progress_bar(b, 8, 0.5), 7); /* truncated, terminated */
    assert_string_equal(b, "loading");
    assert_int_equal(srv_progress_bar(b, 0, 0.5), 0);
}

static void test_local_url(void **state) {
    (void)state;
    char u[64];
    srv_local_url(u, sizeof u, "http", "127.0.0.1", 8000);
    assert_string_equal(u, "http://127.0.0.1:8000");
    srv_local_url(u, sizeof u, "https", "0.0.0.0", 443);
    assert_string_equal(u, "https://127.0.0.1:443");
    srv_local_url(u, sizeof u, "http", "::", 8000);
    assert_string_equal(u, "http://[::1]:8000");
    srv_local_url(u, sizeof u, "http", "::1", 1);
    assert_string_equal(u, "http://[::1]:1");
    srv_local_url(u, sizeof u, "http", "fe80::2", 80);
    assert_string_equal(u, "http://[fe80::2]:80");
    srv_local_url(u, sizeof u, "https", "osprey-0.osprey", 8000);
    assert_string_equal(u, "https://osprey-0.osprey:8000");
    srv_local_url(u, sizeof u, "http", NULL, 8000);
    assert_string_equal(u, "http://127.0.0.1:8000");
    assert_int_equal(srv_local_url(u, 10, "https", "localhost", 8000), 9);
    assert_string_equal(u, "https://l");
}

static int setup(void **state) {
    (void)state;
    const char *root = getenv("OSPREY_ROOT");
    snprintf(g_fix, sizeof g_fix, "%s/tests/integration/fixtures/tls", root ? root : ".");
    char probe[640];
    snprintf(probe, sizeof probe, "%s/key.pem", g_fix);
    if (access(probe, R_OK) != 0) {
        fprintf(stderr, "no TLS fixtures at %s\n", g_fix);
        return -1;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/osprey-tls-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    const char *names[] = {"empty.pem", "nul.pem", "enc8.pem", "encl.pem", "junk.pem", "junkc.pem", "big.pem", "fifo.pem"};
    char p[640];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", g_dir, names[i]);
        unlink(p);
    }
    rmdir(g_dir);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_off),
        cmocka_unit_test(test_loads_the_pair),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_size_bound_and_fifo),
        cmocka_unit_test(test_check_pem_directly),
        cmocka_unit_test(test_progress_bar),
        cmocka_unit_test(test_local_url),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
