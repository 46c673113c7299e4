/* tools/server/webui.c and the table cmake/embed_webui.cmake generates: every file of
 * tools/server/webui/ is embedded byte for byte (read back from the source tree, $OSPREY_ROOT) under
 * /webui/<name> with the Content-Type of its extension and a quoted 16-hex-digit ETag; "/" and
 * "/dashboard" serve the page; other paths serve nothing; If-None-Match is matched as RFC 9110 §13.1.2
 * says (lists, "*", weak comparison). The HTTP side (status codes, headers, --no-webui) is
 * tests/integration/test_webui.py's. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "server.h"

static bool ends_with(const char *s, const char *suffix) {
    const size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static void test_table(void **state) {
    (void)state;
    assert_true(srv_webui_n_assets >= 6);
    for (int i = 0; i < srv_webui_n_assets; i++) {
        const srv_webui_asset *a = &srv_webui_assets[i];
        assert_int_equal(strncmp(a->path, "/webui/", 7), 0);
        assert_non_null(strchr(a->path + 7, '.'));
        assert_true(a->len > 0);
        assert_int_equal(a->bytes[a->len], 0); /* NUL past the end */
        const char *want = ends_with(a->path, ".html") ? "text/html; charset=utf-8"
                           : ends_with(a->path, ".css") ? "text/css; charset=utf-8"
                           : ends_with(a->path, ".js")  ? "text/javascript; charset=utf-8"
                           : ends_with(a->path, ".svg") ? "image/svg+xml"
                                                        : "?";
        assert_string_equal(a->content_type, want);
        assert_int_equal(strlen(a->etag), 18);
        assert_int_equal(a->etag[0], '"');
        assert_int_equal(a->etag[17], '"');
        for (int k = 1; k < 17; k++) assert_non_null(strchr("0123456789abcdef", a->etag[k]));
        assert_ptr_equal(srv_webui_find(a->path), a);
        if (i > 0) assert_true(strcmp(srv_webui_assets[i - 1].path, a->path) < 0); /* sorted, no duplicates */
        for (int j = 0; j < i; j++) assert_string_not_equal(srv_webui_assets[j].etag, a->etag);
    }
}

/* Every file in the source directory is in the table with the same bytes, and nothing else is. */
static void test_matches_source_tree(void **state) {
    (void)state;
    const char *root = getenv("OSPREY_ROOT");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tools/server/webui", root ? root : ".");
    DIR *d = opendir(dir);
    if (!d) skip();
    int n_files = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[4096 + 256], url[300];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(url, sizeof url, "/webui/%s", e->d_name);
        const srv_webui_asset *a = srv_webui_find(url);
        assert_non_null(a);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        unsigned char *buf = malloc(a->len + 1);
        assert_non_null(buf);
        const size_t got = fread(buf, 1, a->len + 1, f);
        fclose(f);
        assert_int_equal(got, a->len); /* neither shorter nor longer */
        assert_memory_equal(buf, a->bytes, a->len);
        free(buf);
        n_files++;
    }
    closedir(d);
    assert_int_equal(n_files, srv_webui_n_assets);
}

static void test_find(void **state) {
    (void)state;
    const srv_webui_asset *page = srv_webui_find("/webui/index.html");
    assert_non_null(page);
    assert_ptr_equal(srv_webui_find("/"), page);
    assert_ptr_equal(srv_webui_find("/dashboard"), page);
    assert_non_null(strstr((const char *)page->bytes, "<!DOCTYPE html>"));
    /* the page's scripts and stylesheet are all embedded */
    const char *names[] = {"/webui/app.js", "/webui/chat.js", "/webui/dashboard.js", "/webui/markdown.js", "/webui/style.css",
                           "/webui/favicon.svg"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        assert_non_null(srv_webui_find(names[i]));
        char ref[64];
        snprintf(ref, sizeof ref, "\"%s\"", names[i]);
        assert_non_null(strstr((const char *)page->bytes, ref));
    }
    assert_null(srv_webui_find(NULL));
    assert_null(srv_webui_find(""));
    assert_null(srv_webui_find("/index.html"));
    assert_null(srv_webui_find("/webui/"));
    assert_null(srv_webui_find("/webui"));
    assert_null(srv_webui_find("/webui/../webui/app.js"));
    assert_null(srv_webui_find("/webui/app.js/"));
    assert_null(srv_webui_find("/dashboard/"));
    assert_null(srv_webui_find("/v1/models"));
    assert_null(srv_webui_find("/WEBUI/app.js"));
}

static void test_etag_match(void **state) {
    (void)state;
    const char *t = "\"0123456789abcdef\"";
    assert_true(srv_webui_etag_match("\"0123456789abcdef\"", t));
    assert_true(srv_webui_etag_match("W/\"0123456789abcdef\"", t)); /* weak comparison */
    assert_true(srv_webui_etag_match("*", t));
    assert_true(srv_webui_etag_match("\"x\", \"0123456789abcdef\"", t));
    assert_true(srv_webui_etag_match("\"x\",W/\"0123456789abcdef\" , \"y\"", t));
    assert_true(srv_webui_etag_match(" \t\"0123456789abcdef\"", t));
    assert_false(srv_webui_etag_match(NULL, t));
    assert_false(srv_webui_etag_match("", t));
    assert_false(srv_webui_etag_match("\"0123456789abcde\"", t));
    assert_false(srv_webui_etag_match("\"0123456789abcdef0\"", t));
    assert_false(srv_webui_etag_match("0123456789abcdef", t)); /* unquoted: not the tag */
    assert_false(srv_webui_etag_match("\"0123456789abcdef", t)); /* unterminated */
    assert_false(srv_webui_etag_match("\"x\", \"y\"", t));
    assert_false(srv_webui_etag_match("W/", t));
    assert_false(srv_webui_etag_match(",,,", t));
    assert_false(srv_webui_etag_match(t, NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_matches_source_tree),
        cmocka_unit_test(test_find),
        cmocka_unit_test(test_etag_match),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
