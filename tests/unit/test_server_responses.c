/* tools/server/responses.c: a /v1/responses body -> the chat request it runs as, and the response
 * store. Input items become the chat messages the chat route would get (a string: one user message;
 * input_text parts joined; consecutive function_call items one assistant message's tool_calls;
 * function_call_output a tool message; reasoning items dropped), instructions lead as a system
 * message, history sits between them and the input, flat function tools become the nested form and
 * force their grammar with tool_choice required, text.format json_schema its grammar,
 * max_output_tokens the chat's max_tokens; the echoed fields carry OpenAI's defaults; unsupported
 * fields are 400s naming them, chat-side errors are named in Responses terms. The store is an LRU:
 * capacity respected, a get refreshes, delete, replace, capacity 0 keeps nothing. */
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

static const srv_parse_limits k_lim = {.n_vocab = 1000};

/* Parses body and turns it into a chat request with history (NULL: none); asserts success. */
static void to_chat(const char *body, const char *history, srv_responses_request *rq, srv_gen_request *req) {
    srv_error err = {0};
    int rc = srv_responses_parse(body, strlen(body), rq, &err);
    if (rc) fprintf(stderr, "parse: %s (%s)\n", err.message, err.param);
    assert_int_equal(rc, 0);
    json_t *h = history ? json_loads(history, 0, NULL) : NULL;
    rc = srv_responses_to_chat(rq, h, &k_lim, req, &err);
    if (rc) fprintf(stderr, "to_chat: %s (%s)\n", err.message, err.param);
    assert_int_equal(rc, 0);
    json_decref(h);
    assert_true(req->responses);
}

static void assert_json(const json_t *got, const char *want) {
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    assert_non_null(w);
    if (!json_equal((json_t *)got, w)) {
        char *g = json_dumps(got, JSON_COMPACT);
        fprintf(stderr, "got  %s\nwant %s\n", g, want);
        free(g);
    }
    assert_true(json_equal((json_t *)got, w));
    json_decref(w);
}

static void test_string_input(void **state) {
    (void)state;
    srv_responses_request rq;
    srv_gen_request req;
    to_chat("{\"model\": \"m\", \"input\": \"hi\", \"instructions\": \"be brief\", \"max_output_tokens\": 7, "
            "\"temperature\": 0.5, \"top_p\": 0.9, \"user\": \"u\", \"metadata\": {\"a\": \"b\"}, \"store\": false}",
            NULL, &rq, &req);
    assert_json(req.messages, "[{\"role\": \"system\", \"content\": \"be brief\"}, {\"role\": \"user\", \"content\": \"hi\"}]");
    assert_json(req.resp_conversation, "[{\"role\": \"user\", \"content\": \"hi\"}]");
    assert_int_equal(req.max_tokens, 7);
    assert_true(req.temperature == 0.5f && req.top_p == 0.9f);
    assert_string_equal(req.model, "m");
    assert_string_equal(req.user, "u");
    assert_false(req.resp_store);
    assert_int_equal(req.n, 1);
    assert_null(req.grammar);
    assert_json(json_object_get(req.resp_echo, "metadata"), "{\"a\": \"b\"}");
    assert_json(json_object_get(req.resp_echo, "instructions"), "\"be brief\"");
    assert_json(json_object_get(req.resp_echo, "max_output_tokens"), "7");
    srv_gen_request_free(&req);
    srv_responses_request_free(&rq);
}

static void test_defaults_echoed(void **state) {
    (void)state;
    srv_responses_request rq;
    srv_gen_request req;
    to_chat("{\"input\": \"hi\"}", NULL, &rq, &req);
    assert_json(req.resp_echo, "{\"instructions\": null, \"max_output_tokens\": null, \"metadata\": {}, "
                               "\"parallel_tool_calls\": true, \"previous_response_id\": null, \"store\": true, "
                               "\"temperature\": 1.0, \"top_p\": 1.0, \"tool_choice\": \"auto\", \"tools\": [], "
                               "\"text\": {\"format\": {\"type\": \"text\"}}, \"truncation\": \"disabled\", \"user\": null}");
    assert_true(req.resp_store);
    assert_int_equal(req.max_tokens, -1);
    srv_gen_request_free(&req);
    srv_responses_request_free(&rq);
}

static void test_items_and_history(void **state) {
    (void)state;
    srv_responses_request rq;
    srv_gen_request req;
    to_chat("{\"input\": ["
            "{\"role\": \"developer\", \"content\": \"dev\"},"
            "{\"type\": \"message\", \"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"a\"}, {\"type\": \"input_text\", \"text\": \"b\"}]},"
            "{\"type\": \"reasoning\", \"id\": \"rs_1\", \"summary\": []},"
            "{\"type\": \"message\", \"id\": \"msg_1\", \"status\": \"completed\", \"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"t\", \"annotations\": []}]},"
            "{\"type\": \"function_call\", \"id\": \"fc_1\", \"call_id\": \"c1\", \"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\", \"status\": \"completed\"},"
            "{\"type\": \"function_call\", \"call_id\": \"c2\", \"name\": \"g\", \"arguments\": \"{}\"},"
            "{\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": \"one\"},"
            "{\"type\": \"function_call_output\", \"call_id\": \"c2\", \"output\": \"two\"}]}",
            "[{\"role\": \"user\", \"content\": \"old\"}, {\"role\": \"assistant\", \"content\": \"reply\"}]", &rq, &req);
    const char *conv =
        "[{\"role\": \"user\", \"content\": \"old\"}, {\"role\": \"assistant\", \"content\": \"reply\"},"
        "{\"role\": \"developer\", \"content\": \"dev\"}, {\"role\": \"user\", \"content\": \"a\\nb\"},"
        "{\"role\": \"assistant\", \"content\": \"t\"},"
        "{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": ["
        "{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}},"
        "{\"id\": \"c2\", \"type\": \"function\", \"function\": {\"name\": \"g\", \"arguments\": {}}}]},"
        "{\"role\": \"tool\", \"content\": \"one\", \"tool_call_id\": \"c1\"},"
        "{\"role\": \"tool\", \"content\": \"two\", \"tool_call_id\": \"c2\"}]";
    assert_json(req.messages, conv);
    assert_json(req.resp_conversation, conv);
    srv_gen_request_free(&req);
    srv_responses_request_free(&rq);
}

static void test_tools_and_format(void **state) {
    (void)state;
    srv_responses_request rq;
    srv_gen_request req;
    to_chat("{\"input\": \"w\", \"tool_choice\": \"required\", \"parallel_tool_calls\": false, \"tools\": [{\"type\": \"function\", "
            "\"name\": \"get\", \"description\": \"d\", \"parameters\": {\"type\": \"object\", \"properties\": {\"c\": {\"type\": \"string\"}}}}]}",
            NULL, &rq, &req);
    assert_int_equal(req.tool_choice, SRV_TOOL_CHOICE_REQUIRED);
    assert_non_null(req.grammar);
    assert_false(req.parallel_tool_calls);
    assert_json(req.tools, "[{\"type\": \"function\", \"function\": {\"name\": \"get\", \"description\": \"d\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"c\": {\"type\": \"string\"}}}}}]");
    /* the echo keeps the flat shape the client sent */
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(req.resp_echo, "tools"), 0), "name")), "get");
    srv_gen_request_free(&req);
    srv_responses_request_free(&rq);

    to_chat("{\"input\": \"w\", \"tools\": [{\"type\": \"function\", \"name\": \"get\", \"parameters\": {\"type\": \"object\"}}],"
            "\"tool_choice\": {\"type\": \"function\", \"name\": \"get\"}}", NULL, &rq, &req);
    assert_int_equal(req.tool_choice, SRV_TOOL_CHOICE_NAMED);
    assert_string_equal(req.tool_name, "get");
    srv_gen_request_free(&req);
    srv_responses_request_free(&rq);

    to_chat("{\"input\": \"w\", \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"n\", \"strict\": true, "
            "\"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}, \"required\": [\"a\"]}}}}",
            NULL, &rq, &req);
    assert_non_null(req.grammar);
    srv_gen_request_free(&req);
    srv_responses_request_free(&rq);

    to_chat("{\"input\": \"w\", \"text\": {\"format\": {\"type\": \"text\"}}, \"tool_choice\": \"none\", \"tools\": []}", NULL, &rq, &req);
    assert_null(req.grammar);
    assert_int_equal(req.tool_choice, SRV_TOOL_CHOICE_NONE);
    srv_gen_request_free(&req);
    srv_responses_request_free(&rq);
}

/* body must be refused: by the parser, or by the chat rules; status 400 and err.param == param. */
static void bad(const char *body, const char *param) {
    srv_responses_request rq;
    srv_gen_request req;
    srv_error err = {0};
    int rc = srv_responses_parse(body, strlen(body), &rq, &err);
    if (rc == 0) {
        rc = srv_responses_to_chat(&rq, NULL, &k_lim, &req, &err);
        srv_gen_request_free(&req);
    }
    srv_responses_request_free(&rq);
    if (rc != -1 || strcmp(err.param, param)) fprintf(stderr, "%s: rc %d param '%s' (%s)\n", body, rc, err.param, err.message);
    assert_int_equal(rc, -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.param, param);
    assert_true(err.message[0] != 0);
}

static void test_refused(void **state) {
    (void)state;
    bad("[1]", "");
    bad("{\"input\": \"x\"", "");
    bad("{}", "input");
    bad("{\"input\": []}", "input");
    bad("{\"input\": 3}", "input");
    bad("{\"input\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "input");
    bad("{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", \"image_url\": \"u\"}]}]}", "input");
    bad("{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"output_text\", \"text\": \"u\"}]}]}", "input");
    bad("{\"input\": [{\"role\": \"user\", \"content\": \"x\", \"name\": \"n\"}]}", "input");
    bad("{\"input\": [{\"type\": \"function_call\", \"name\": \"f\", \"arguments\": \"{}\"}]}", "input");
    bad("{\"input\": [{\"type\": \"function_call\", \"call_id\": \"c\", \"name\": \"f\", \"arguments\": \"[1\"}]}", "input");
    bad("{\"input\": [{\"type\": \"function_call_output\", \"call_id\": \"c\"}]}", "input");
    bad("{\"input\": [{\"type\": \"reasoning\", \"encrypted_content\": \"zz\"}]}", "input");
    bad("{\"input\": [{\"type\": \"item_reference\", \"id\": \"x\"}]}", "input");
    bad("{\"input\": \"x\", \"reasoning\": {}}", "reasoning");
    bad("{\"input\": \"x\", \"background\": true}", "background");
    bad("{\"input\": \"x\", \"conversation\": \"c\"}", "conversation");
    bad("{\"input\": \"x\", \"stream_options\": {}}", "stream_options");
    bad("{\"input\": \"x\", \"tools\": [{\"type\": \"web_search\"}]}", "tools");
    bad("{\"input\": \"x\", \"tools\": {}}", "tools");
    bad("{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"f\", \"x\": 1}]}", "tools");
    bad("{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"f\"}], \"tool_choice\": {\"type\": \"function\", \"name\": \"g\"}}",
        "tool_choice");
    bad("{\"input\": \"x\", \"tools\": [{\"type\": \"function\", \"name\": \"f\"}]}", "tool_choice"); /* auto without a parser */
    bad("{\"input\": \"x\", \"tool_choice\": {\"type\": \"file_search\"}}", "tool_choice");
    bad("{\"input\": \"x\", \"tool_choice\": 3}", "tool_choice");
    bad("{\"input\": \"x\", \"text\": 1}", "text");
    bad("{\"input\": \"x\", \"text\": {\"verbosity\": \"low\"}}", "text");
    bad("{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"yaml\"}}}", "text.format");
    bad("{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\"}}}", "text.format");
    bad("{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_object\", \"schema\": {}}}}", "text.format");
    bad("{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", \"schema\": {\"type\": \"string\", \"pattern\": \"a\"}}}}",
        "text.format");
    bad("{\"input\": \"x\", \"max_output_tokens\": 0}", "max_output_tokens");
    bad("{\"input\": \"x\", \"max_output_tokens\": \"5\"}", "max_output_tokens");
    bad("{\"input\": \"x\", \"temperature\": 101}", "temperature");
    bad("{\"input\": \"x\", \"stream\": 1}", "stream");
    bad("{\"input\": \"x\", \"store\": 1}", "store");
    bad("{\"input\": \"x\", \"metadata\": []}", "metadata");
    bad("{\"input\": \"x\", \"metadata\": {\"a\": 1}}", "metadata");
    bad("{\"input\": \"x\", \"include\": [\"reasoning.encrypted_content\"]}", "include");
    bad("{\"input\": \"x\", \"truncation\": \"auto\"}", "truncation");
    bad("{\"input\": \"x\", \"previous_response_id\": \"\"}", "previous_response_id");
    bad("{\"input\": \"x\", \"instructions\": 3}", "instructions");
    bad("{\"input\": \"x\", \"n\": 2}", "n"); /* a chat field is not a Responses field */
    bad("{\"input\": \"x\", \"messages\": []}", "messages");
}

static void test_advisory_and_nulls(void **state) {
    (void)state;
    srv_responses_request rq;
    srv_gen_request req;
    to_chat("{\"input\": \"x\", \"service_tier\": \"auto\", \"safety_identifier\": \"s\", \"prompt_cache_key\": \"k\", "
            "\"truncation\": \"disabled\", \"include\": [], \"reasoning\": null, \"tools\": null, \"previous_response_id\": null}",
            NULL, &rq, &req);
    assert_null(rq.previous_response_id);
    srv_gen_request_free(&req);
    srv_responses_request_free(&rq);
    srv_error err = {0};
    const char *body = "{\"input\": \"x\", \"previous_response_id\": \"resp_1\"}";
    assert_int_equal(srv_responses_parse(body, strlen(body), &rq, &err), 0);
    assert_string_equal(rq.previous_response_id, "resp_1");
    srv_responses_request_free(&rq);
}

static json_t *num(int i) { return json_integer(i); }

static void test_store_lru(void **state) {
    (void)state;
    srv_resp_store *st = srv_resp_store_new(2);
    assert_non_null(st);
    assert_int_equal(srv_resp_store_put(st, "a", num(1), json_array()), 0);
    assert_int_equal(srv_resp_store_put(st, "b", num(2), json_array()), 0);
    json_t *r = NULL, *c = NULL;
    assert_int_equal(srv_resp_store_get(st, "a", &r, &c), 0); /* a is now the most recent */
    assert_int_equal(json_integer_value(r), 1);
    assert_true(json_is_array(c));
    json_decref(r);
    json_decref(c);
    assert_int_equal(srv_resp_store_put(st, "c", num(3), json_array()), 0); /* evicts b */
    assert_int_equal(srv_resp_store_size(st), 2);
    assert_int_equal(srv_resp_store_get(st, "b", NULL, NULL), -1);
    assert_int_equal(srv_resp_store_get(st, "a", NULL, NULL), 0);
    assert_int_equal(srv_resp_store_get(st, "c", NULL, NULL), 0);
    assert_int_equal(srv_resp_store_put(st, "c", num(4), json_array()), 0); /* replace, no eviction */
    assert_int_equal(srv_resp_store_size(st), 2);
    assert_int_equal(srv_resp_store_get(st, "c", &r, NULL), 0);
    assert_int_equal(json_integer_value(r), 4);
    json_decref(r);
    assert_int_equal(srv_resp_store_delete(st, "a"), 0);
    assert_int_equal(srv_resp_store_delete(st, "a"), -1);
    assert_int_equal(srv_resp_store_size(st), 1);
    srv_resp_store_free(st);

    st = srv_resp_store_new(0); /* keeps nothing */
    assert_int_equal(srv_resp_store_put(st, "a", num(1), json_array()), 0);
    assert_int_equal(srv_resp_store_size(st), 0);
    assert_int_equal(srv_resp_store_get(st, "a", NULL, NULL), -1);
    srv_resp_store_free(st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_string_input),     cmocka_unit_test(test_defaults_echoed), cmocka_unit_test(test_items_and_history),
        cmocka_unit_test(test_tools_and_format), cmocka_unit_test(test_refused),         cmocka_unit_test(test_advisory_and_nulls),
        cmocka_unit_test(test_store_lru),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
