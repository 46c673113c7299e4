/* tools/server/access.c: the API key comparison (right answers for every near miss; constant time is
 * by construction, every byte of the key looked at with no early exit, which no test without a clock
 * can see) and CORS as vLLM (Starlette's CORSMiddleware) answers: the expected headers below are what
 * starlette/middleware/cors.py sends for the same policy and request. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "server.h"

static void test_secret_equal(void **state) {
    (void)state;
    assert_true(srv_secret_equal("sekrit", "sekrit"));
    assert_false(srv_secret_equal("sekri", "sekrit"));
    assert_false(srv_secret_equal("sekritt", "sekrit"));
    assert_false(srv_secret_equal("Sekrit", "sekrit"));
    assert_false(srv_secret_equal("sekriT", "sekrit"));
    assert_false(srv_secret_equal("", "sekrit"));
    assert_false(srv_secret_equal(NULL, "sekrit"));
    assert_true(srv_secret_equal("", ""));
    assert_false(srv_secret_equal("x", ""));
}

static void test_bearer(void **state) {
    (void)state;
    assert_true(srv_bearer_ok(NULL, NULL)); /* no key configured */
    assert_true(srv_bearer_ok("anything", NULL));
    assert_true(srv_bearer_ok("Bearer sekrit", "sekrit"));
    assert_false(srv_bearer_ok("Bearer sekri", "sekrit"));
    assert_false(srv_bearer_ok("Bearer sekrit ", "sekrit"));
    assert_false(srv_bearer_ok("bearer sekrit", "sekrit"));
    assert_false(srv_bearer_ok("sekrit", "sekrit"));
    assert_false(srv_bearer_ok("Basic sekrit", "sekrit"));
    assert_false(srv_bearer_ok(NULL, "sekrit"));
    assert_false(srv_bearer_ok("Bearer ", "sekrit"));
}

typedef struct hdrs {
    int n;
    char text[2048];
} hdrs;

static void add(void *ctx, const char *name, const char *value) {
    hdrs *h = ctx;
    const size_t len = strlen(h->text);
    snprintf(h->text + len, sizeof h->text - len, "%s: %s\n", name, value);
    h->n++;
}

static void test_cors_defaults(void **state) {
    (void)state;
    srv_cors c;
    assert_int_equal(srv_cors_default(&c), 0);
    hdrs h = {0};
    char body[128];
    assert_int_equal(srv_cors_preflight(&c, "http://a.example", "POST", "authorization, content-type", add, &h, body, sizeof body), 200);
    assert_string_equal(body, "OK");
    assert_string_equal(h.text, "Access-Control-Allow-Origin: *\n"
                                "Access-Control-Allow-Methods: DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT\n"
                                "Access-Control-Max-Age: 600\n"
                                "Access-Control-Allow-Headers: authorization, content-type\n");
    h = (hdrs){0};
    assert_int_equal(srv_cors_preflight(&c, "http://a.example", "TRACE", NULL, add, &h, body, sizeof body), 400);
    assert_string_equal(body, "Disallowed CORS method");
    h = (hdrs){0};
    srv_cors_simple(&c, "http://a.example", false, add, &h);
    assert_string_equal(h.text, "Access-Control-Allow-Origin: *\n");
    h = (hdrs){0};
    srv_cors_simple(&c, "http://a.example", true, add, &h); /* a cookie: the origin itself */
    assert_string_equal(h.text, "Access-Control-Allow-Origin: http://a.example\nVary: Origin\n");
    h = (hdrs){0};
    srv_cors_simple(&c, NULL, false, add, &h); /* no Origin: nothing */
    assert_int_equal(h.n, 0);
    srv_cors_free(&c);
}

static void test_cors_lists(void **state) {
    (void)state;
    srv_cors c;
    char why[256], body[128];
    assert_int_equal(srv_cors_default(&c), 0);
    assert_int_equal(srv_cors_set(&c, SRV_CORS_ORIGINS, "[\"http://a.example\", \"http://b.example\"]", why, sizeof why), 0);
    assert_int_equal(srv_cors_set(&c, SRV_CORS_METHODS, "GET,POST", why, sizeof why), 0);
    assert_int_equal(srv_cors_set(&c, SRV_CORS_HEADERS, "[\"Authorization\"]", why, sizeof why), 0);
    assert_int_equal(c.n_origins, 2);
    assert_int_equal(c.n_methods, 2);
    assert_int_equal(srv_cors_set(&c, SRV_CORS_ORIGINS, "[1]", why, sizeof why), -1);
    assert_non_null(strstr(why, "JSON list"));
    assert_int_equal(srv_cors_set(&c, SRV_CORS_ORIGINS, "[\"http://a.example\", \"http://b.example\"]", why, sizeof why), 0);
    c.credentials = true;
    hdrs h = {0};
    assert_int_equal(srv_cors_preflight(&c, "http://b.example", "POST", "Authorization", add, &h, body, sizeof body), 200);
    assert_string_equal(h.text, "Vary: Origin\n"
                                "Access-Control-Allow-Origin: http://b.example\n"
                                "Access-Control-Allow-Methods: GET, POST\n"
                                "Access-Control-Max-Age: 600\n"
                                "Access-Control-Allow-Headers: Accept, Accept-Language, Authorization, Content-Language, Content-Type\n"
                                "Access-Control-Allow-Credentials: true\n");
    h = (hdrs){0};
    assert_int_equal(srv_cors_preflight(&c, "http://evil.example", "PUT", "x-other, content-type", add, &h, body, sizeof body), 400);
    assert_string_equal(body, "Disallowed CORS origin, method, headers");
    assert_null(strstr(h.text, "Access-Control-Allow-Origin"));
    h = (hdrs){0};
    assert_int_equal(srv_cors_preflight(&c, "http://a.example", "GET", " content-type ,ACCEPT", add, &h, body, sizeof body), 200);
    h = (hdrs){0};
    srv_cors_simple(&c, "http://a.example", false, add, &h);
    assert_string_equal(h.text, "Access-Control-Allow-Origin: http://a.example\nVary: Origin\nAccess-Control-Allow-Credentials: true\n");
    h = (hdrs){0};
    srv_cors_simple(&c, "http://evil.example", false, add, &h); /* answered, but the browser may not read it */
    assert_string_equal(h.text, "Access-Control-Allow-Credentials: true\n");
    srv_cors_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_secret_equal),
        cmocka_unit_test(test_bearer),
        cmocka_unit_test(test_cors_defaults),
        cmocka_unit_test(test_cors_lists),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
