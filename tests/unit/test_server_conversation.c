/* tools/server/chat.c srv_conversation_parse: the conversation files osprey chat's /save writes and
 * /load reads. What loads is what /v1/chat/completions accepts, normalized the same way (text parts
 * joined with "\n", an assistant's null content ""); both file shapes (a messages array, a request
 * body's "messages"); the empty conversation; every malformed file a 400 with a message that says
 * where; the size bound checked before parsing; and the round trip save -> load as a fixed point. */
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

/* Parses s; on success returns the messages compact (malloc'd) and *err untouched. */
static char *parse_ok(const char *s) {
    json_t *m = NULL;
    srv_error err = {0};
    const int rc = srv_conversation_parse(s, strlen(s), &m, &err);
    if (rc != 0) fprintf(stderr, "unexpected error: %s\n", err.message);
    assert_int_equal(rc, 0);
    assert_non_null(m);
    char *out = json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER);
    assert_non_null(out);
    json_decref(m);
    return out;
}

/* Parses s[len]; it must fail with a 400 whose message contains `want`. */
static void parse_bad(const char *s, size_t len, const char *want) {
    json_t *m = (json_t *)1;
    srv_error err = {0};
    assert_int_equal(srv_conversation_parse(s, len, &m, &err), -1);
    assert_null(m);
    assert_int_equal(err.status, 400);
    if (!strstr(err.message, want)) fprintf(stderr, "message '%s' lacks '%s'\n", err.message, want);
    assert_non_null(strstr(err.message, want));
}

static void parse_bad_s(const char *s, const char *want) { parse_bad(s, strlen(s), want); }

static void test_array_and_body(void **state) {
    (void)state;
    char *a = parse_ok("[{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]");
    assert_string_equal(a, "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":\"yo\"}]");
    /* a /v1/chat/completions body: the other fields are ignored */
    char *b = parse_ok("{\"model\": \"x\", \"max_tokens\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"hi\"},"
                       " {\"role\": \"assistant\", \"content\": \"yo\"}]}");
    assert_string_equal(a, b);
    free(a), free(b);
    char *e = parse_ok(" [ ] \n");
    assert_string_equal(e, "[]");
    free(e);
}

static void test_normalized_as_the_server(void **state) {
    (void)state;
    char *a = parse_ok("[{\"role\": \"system\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]},"
                       " {\"role\": \"assistant\", \"content\": null}, {\"role\": \"user\", \"content\": \"caf\xc3\xa9\", \"name\": \"ann\"}]");
    assert_string_equal(a, "[{\"role\":\"system\",\"content\":\"a\\nb\"},{\"role\":\"assistant\",\"content\":\"\"},"
                           "{\"role\":\"user\",\"content\":\"caf\xc3\xa9\",\"name\":\"ann\"}]");
    free(a);
}

static void test_bad_files(void **state) {
    (void)state;
    const char *not_json = "[{\"role\": \"user\",\n \"content\": }]";
    parse_bad(not_json, strlen(not_json), "line 2");
    parse_bad_s("", "not JSON");
    parse_bad_s("[] []", "not JSON");
    parse_bad_s("\"hello\"", "a JSON array of messages");
    parse_bad_s("{\"model\": \"x\"}", "a JSON array of messages");
    parse_bad_s("{\"messages\": {}}", "a JSON array of messages");
    parse_bad_s("[1]", "messages[0] must be an object");
    parse_bad_s("[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"wizard\", \"content\": \"b\"}]",
              "messages[1].role 'wizard'");
    parse_bad_s("[{\"role\": \"user\"}]", "messages[0].content");
    parse_bad_s("[{\"role\": \"user\", \"content\": \"\xc3\x28\"}]", "not JSON");
    parse_bad_s("[{\"role\": \"user\", \"content\": \"a\\u0000b\"}]", "not JSON");
    /* not NUL-terminated: only len bytes are read */
    const char buf[] = {'[', ']', 'x'};
    json_t *m = NULL;
    srv_error err = {0};
    assert_int_equal(srv_conversation_parse(buf, 2, &m, &err), 0);
    assert_int_equal(json_array_size(m), 0);
    json_decref(m);
}

static void test_size_bound(void **state) {
    (void)state;
    /* one byte over the bound is refused before parsing (the text is valid JSON) */
    const size_t n = SRV_CONVERSATION_MAX_BYTES + 1;
    char *big = malloc(n);
    assert_non_null(big);
    memset(big, ' ', n);
    big[0] = '[', big[n - 1] = ']';
    parse_bad(big, n, "more than the 8 MiB");
    json_t *m = NULL;
    srv_error err = {0};
    big[n - 2] = ']'; /* at the bound exactly it loads */
    assert_int_equal(srv_conversation_parse(big, n - 1, &m, &err), 0);
    json_decref(m);
    free(big);
}

static void test_round_trip(void **state) {
    (void)state;
    const char *in = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"x\"}]},"
                     " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
                     " \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"k\\\": 1}\"}}]},"
                     " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"2\"}]}";
    json_t *m1 = NULL, *m2 = NULL;
    srv_error err = {0};
    assert_int_equal(srv_conversation_parse(in, strlen(in), &m1, &err), 0);
    char *saved = json_dumps(m1, JSON_INDENT(2) | JSON_PRESERVE_ORDER); /* as /save writes it */
    assert_non_null(saved);
    assert_int_equal(srv_conversation_parse(saved, strlen(saved), &m2, &err), 0);
    assert_true(json_equal(m1, m2));
    /* the arguments given as JSON text are an object once normalized */
    assert_true(json_is_object(json_object_get(
        json_object_get(json_array_get(json_object_get(json_array_get(m1, 1), "tool_calls"), 0), "function"), "arguments")));
    free(saved);
    json_decref(m1);
    json_decref(m2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_array_and_body),
        cmocka_unit_test(test_normalized_as_the_server),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_size_bound),
        cmocka_unit_test(test_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
