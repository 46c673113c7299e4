/* tools/server/toolcall.c: tool calling and reasoning (issue 19). Each parser on fake model outputs,
 * compared with the exact OpenAI structures ({"id", "type": "function", "function": {"name",
 * "arguments": JSON text}}, content outside the calls or null); forced choices (required, named);
 * the <think> split, whole and as a growing prefix (streaming); the request's tool fields and their
 * 400s; and real chat templates (../shared/testdata/chat-templates) rendered with tools and a tool
 * round trip (assistant tool_calls + a tool message). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/chat_template.h"
#include "server.h"

#define SEED 0x1234abcdull

/* The call srv_tool_parse should produce: call k of parser p with this name and arguments text. */
static json_t *want_call(srv_tool_parser p, size_t k, const char *name, const char *args) {
    char id[40];
    srv_tool_call_id(p, SEED, k, id, sizeof id);
    return json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name", name, "arguments", args);
}

/* Parses text with p and checks content (NULL: none) and the calls (NULL-terminated name/args pairs). */
static void check_parse(srv_tool_parser p, const char *text, const char *content, const char *const *calls) {
    srv_tool_result r;
    assert_int_equal(srv_tool_parse(p, text, strlen(text), SEED, &r), 0);
    if (content) {
        assert_non_null(r.content);
        assert_string_equal(r.content, content);
    } else {
        assert_null(r.content);
    }
    if (!calls || !calls[0]) {
        assert_null(r.calls);
    } else {
        json_t *want = json_array();
        for (size_t k = 0; calls[2 * k]; k++) json_array_append_new(want, want_call(p, k, calls[2 * k], calls[2 * k + 1]));
        if (!json_equal(want, r.calls)) {
            char *got = json_dumps(r.calls, JSON_COMPACT);
            fail_msg("calls differ: %s", got);
        }
        json_decref(want);
    }
    srv_tool_result_free(&r);
}

static void test_call_ids(void **state) {
    (void)state;
    char a[40], b[40], m[40];
    srv_tool_call_id(SRV_TOOL_PARSER_HERMES, SEED, 0, a, sizeof a);
    srv_tool_call_id(SRV_TOOL_PARSER_HERMES, SEED, 1, b, sizeof b);
    srv_tool_call_id(SRV_TOOL_PARSER_MISTRAL, SEED, 0, m, sizeof m);
    assert_int_equal(strlen(a), 29);
    assert_memory_equal(a, "call_", 5);
    assert_string_not_equal(a, b);
    assert_int_equal(strlen(m), 9); /* Mistral's templates refuse any other length */
    for (size_t i = 0; i < 9; i++) assert_true((m[i] >= 'a' && m[i] <= 'z') || (m[i] >= 'A' && m[i] <= 'Z') || (m[i] >= '0' && m[i] <= '9'));
}

static void test_hermes(void **state) {
    (void)state;
    const char *one[] = {"get_weather", "{\"city\":\"Paris\",\"unit\":\"c\"}", NULL};
    check_parse(SRV_TOOL_PARSER_HERMES,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
                NULL, one);
    check_parse(SRV_TOOL_PARSER_HERMES,
                "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call>",
                "Let me look.\n", one);
    const char *two[] = {"a", "{\"x\":1}", "b", "{}", NULL};
    check_parse(SRV_TOOL_PARSER_HERMES,
                "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>\n<tool_call>{\"name\": \"b\"}</tool_call> done",
                "\n done", two);
    /* the last block cut short (EOS before </tool_call>) still parses when its JSON is whole */
    const char *a1[] = {"a", "{\"x\":1}", NULL};
    check_parse(SRV_TOOL_PARSER_HERMES, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n", NULL, a1);
    /* arguments given as a JSON string stay that string */
    const char *s1[] = {"a", "{\"x\": 1}", NULL};
    check_parse(SRV_TOOL_PARSER_HERMES, "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>", NULL, s1);
    /* not calls: the whole reply is content, as vLLM */
    check_parse(SRV_TOOL_PARSER_HERMES, "Just text.", "Just text.", NULL);
    check_parse(SRV_TOOL_PARSER_HERMES, "x <tool_call>{\"name\": \"a\", \"argu", "x <tool_call>{\"name\": \"a\", \"argu", NULL);
    check_parse(SRV_TOOL_PARSER_HERMES, "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", NULL);
    check_parse(SRV_TOOL_PARSER_HERMES, "<tool_call>[1]</tool_call>", "<tool_call>[1]</tool_call>", NULL);
    check_parse(SRV_TOOL_PARSER_HERMES, "  \n", NULL, NULL);
}

static void test_llama3_json(void **state) {
    (void)state;
    const char *one[] = {"get_weather", "{\"city\":\"Rome\"}", NULL};
    check_parse(SRV_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", NULL, one);
    check_parse(SRV_TOOL_PARSER_LLAMA3_JSON, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", NULL, one);
    const char *two[] = {"a", "{}", "b", "{\"k\":[1,2]}", NULL};
    check_parse(SRV_TOOL_PARSER_LLAMA3_JSON, " {\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"k\": [1, 2]}}", NULL, two);
    check_parse(SRV_TOOL_PARSER_LLAMA3_JSON, "The answer is {42}.", "The answer is {42}.", NULL);
    check_parse(SRV_TOOL_PARSER_LLAMA3_JSON, "{\"title\": \"no name\"}", "{\"title\": \"no name\"}", NULL);
    check_parse(SRV_TOOL_PARSER_LLAMA3_JSON, "{\"name\": \"a\", \"param", "{\"name\": \"a\", \"param", NULL);
}

static void test_mistral(void **state) {
    (void)state;
    const char *one[] = {"get_weather", "{\"city\":\"Oslo\"}", NULL};
    check_parse(SRV_TOOL_PARSER_MISTRAL, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]", NULL, one);
    check_parse(SRV_TOOL_PARSER_MISTRAL, "Sure. [TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]",
                "Sure. ", one);
    /* v11+ tokenizers: [TOOL_CALLS]name[ARGS]{...}, repeated */
    check_parse(SRV_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}", NULL, one);
    const char *two[] = {"a", "{\"x\":1}", "b", "{}", NULL};
    check_parse(SRV_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]a[ARGS]{\"x\": 1}[TOOL_CALLS]b[ARGS]{}", NULL, two);
    check_parse(SRV_TOOL_PARSER_MISTRAL, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]",
                NULL, two);
    check_parse(SRV_TOOL_PARSER_MISTRAL, "No tools needed.", "No tools needed.", NULL);
    check_parse(SRV_TOOL_PARSER_MISTRAL, "[TOOL_CALLS][{\"name\": ", "[TOOL_CALLS][{\"name\": ", NULL);
    check_parse(SRV_TOOL_PARSER_MISTRAL, "[TOOL_CALLS]a b[ARGS]{}", "[TOOL_CALLS]a b[ARGS]{}", NULL);
    check_parse(SRV_TOOL_PARSER_MISTRAL, "[TOOL_CALLS][]", "[TOOL_CALLS][]", NULL);
}

static void test_forced(void **state) {
    (void)state;
    srv_tool_result r;
    const char *req = "[{\"name\": \"a\", \"parameters\": {\"x\": 1}}, {\"name\": \"b\", \"parameters\": {}}]";
    assert_int_equal(srv_tool_parse_forced(SRV_TOOL_CHOICE_REQUIRED, NULL, req, strlen(req), SEED, &r), 0);
    json_t *want = json_pack("[o, o]", want_call(SRV_TOOL_PARSER_NONE, 0, "a", "{\"x\":1}"), want_call(SRV_TOOL_PARSER_NONE, 1, "b", "{}"));
    assert_true(json_equal(want, r.calls));
    assert_null(r.content);
    json_decref(want);
    srv_tool_result_free(&r);
    /* cut by max_tokens: no calls, the text as content */
    const char *cut = "[{\"name\": \"a\", \"param";
    assert_int_equal(srv_tool_parse_forced(SRV_TOOL_CHOICE_REQUIRED, NULL, cut, strlen(cut), SEED, &r), 0);
    assert_null(r.calls);
    assert_string_equal(r.content, cut);
    srv_tool_result_free(&r);
    /* named: the text is the arguments */
    const char *args = "{\"city\": \"Paris\"}";
    assert_int_equal(srv_tool_parse_forced(SRV_TOOL_CHOICE_NAMED, "get_weather", args, strlen(args), SEED, &r), 0);
    want = json_pack("[o]", want_call(SRV_TOOL_PARSER_NONE, 0, "get_weather", args));
    assert_true(json_equal(want, r.calls));
    json_decref(want);
    srv_tool_result_free(&r);
}

static void check_split(srv_reasoning_parser p, const char *text, const char *reasoning, const char *content) {
    srv_span rs, cs;
    const size_t n = strlen(text);
    srv_reasoning_split(p, text, n, true, &rs, &cs);
    assert_int_equal(rs.len, strlen(reasoning));
    assert_memory_equal(text + rs.off, reasoning, rs.len);
    assert_int_equal(cs.len, strlen(content));
    assert_memory_equal(text + cs.off, content, cs.len);
    /* streamed: every prefix's spans are prefixes of the next ones' (nothing handed out is taken back) */
    size_t r_prev = 0, c_prev = 0, r_off = 0, c_off = 0;
    bool c_started = false;
    for (size_t k = 0; k <= n; k++) {
        srv_reasoning_split(p, text, k, k == n, &rs, &cs);
        assert_true(rs.len >= r_prev);
        if (r_prev) assert_int_equal(rs.off, r_off);
        if (c_prev || (c_started && cs.len)) assert_int_equal(cs.off, c_off);
        assert_true(cs.len >= c_prev);
        r_prev = rs.len, r_off = rs.off;
        if (cs.len) c_started = true, c_prev = cs.len, c_off = cs.off;
    }
    assert_int_equal(r_prev, strlen(reasoning));
    assert_int_equal(c_prev, strlen(content));
}

static void test_reasoning(void **state) {
    (void)state;
    check_split(SRV_REASONING_DEEPSEEK_R1, "<think>\nhmm</think>\n\nYes.", "\nhmm", "\n\nYes.");
    check_split(SRV_REASONING_DEEPSEEK_R1, "hmm, so 2</think>Four.", "hmm, so 2", "Four.");
    check_split(SRV_REASONING_DEEPSEEK_R1, "still thinking <", "still thinking <", ""); /* no </think>: all reasoning */
    check_split(SRV_REASONING_QWEN3, "<think>a < b</think>B", "a < b", "B");
    check_split(SRV_REASONING_QWEN3, "No thoughts</think> here", "", "No thoughts</think> here");
    check_split(SRV_REASONING_QWEN3, "<think>cut short", "cut short", "");
    check_split(SRV_REASONING_QWEN3, "<thin", "", "<thin");
    check_split(SRV_REASONING_NONE, "<think>x</think>y", "", "<think>x</think>y");
    /* a prefix that may become </think> is held back while streaming */
    srv_span rs, cs;
    srv_reasoning_split(SRV_REASONING_DEEPSEEK_R1, "abc</thi", 8, false, &rs, &cs);
    assert_int_equal(rs.len, 3);
    assert_int_equal(cs.len, 0);
}

static void test_content_prefix(void **state) {
    (void)state;
    const char *t = "Let me check <tool";
    assert_int_equal(srv_tool_content_prefix(SRV_TOOL_PARSER_HERMES, t, strlen(t)), strlen("Let me check "));
    t = "Hi <tool_call>{";
    assert_int_equal(srv_tool_content_prefix(SRV_TOOL_PARSER_HERMES, t, strlen(t)), 3);
    t = "a < b";
    assert_int_equal(srv_tool_content_prefix(SRV_TOOL_PARSER_HERMES, t, strlen(t)), strlen(t));
    t = "ok [TOOL_";
    assert_int_equal(srv_tool_content_prefix(SRV_TOOL_PARSER_MISTRAL, t, strlen(t)), 3);
    t = "  {\"name\"";
    assert_int_equal(srv_tool_content_prefix(SRV_TOOL_PARSER_LLAMA3_JSON, t, strlen(t)), 0);
    t = "<|python";
    assert_int_equal(srv_tool_content_prefix(SRV_TOOL_PARSER_LLAMA3_JSON, t, strlen(t)), 0);
    t = "Hello";
    assert_int_equal(srv_tool_content_prefix(SRV_TOOL_PARSER_LLAMA3_JSON, t, strlen(t)), 5);
}

/* ---- the request ---------------------------------------------------------------------------- */

#define TOOLS                                                                                                          \
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather in a city\", "       \
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}]"
#define MSGS "\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}]"

static int parse(const char *body, const srv_parse_limits *lim, srv_gen_request *r, srv_error *err) {
    return srv_parse_gen_request(body, strlen(body), SRV_ROUTE_CHAT, lim, r, err);
}

static void expect_400(const char *body, const srv_parse_limits *lim, const char *param, const char *in_message) {
    srv_gen_request r;
    srv_error err = {0};
    assert_int_equal(parse(body, lim, &r, &err), -1);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.param, param);
    if (in_message && !strstr(err.message, in_message)) fail_msg("message '%s' lacks '%s'", err.message, in_message);
    srv_gen_request_free(&r);
}

static void test_request_fields(void **state) {
    (void)state;
    const srv_parse_limits none = {.n_vocab = 100};
    const srv_parse_limits hermes = {.n_vocab = 100, .auto_tool_choice = true, .tool_parser = SRV_TOOL_PARSER_HERMES};
    srv_gen_request r;
    srv_error err = {0};
    /* required: a grammar over the calls */
    assert_int_equal(parse("{" MSGS ", \"tools\": " TOOLS ", \"tool_choice\": \"required\"}", &none, &r, &err), 0);
    assert_int_equal(r.tool_choice, SRV_TOOL_CHOICE_REQUIRED);
    assert_non_null(r.grammar);
    assert_non_null(r.tools);
    assert_true(r.parallel_tool_calls);
    srv_gen_request_free(&r);
    /* named */
    assert_int_equal(parse("{" MSGS ", \"tools\": " TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"get_weather\"}}, \"parallel_tool_calls\": false}", &none, &r, &err), 0);
    assert_int_equal(r.tool_choice, SRV_TOOL_CHOICE_NAMED);
    assert_string_equal(r.tool_name, "get_weather");
    assert_false(r.parallel_tool_calls);
    assert_non_null(r.grammar);
    srv_gen_request_free(&r);
    /* auto (the default with tools) needs the server's parser */
    expect_400("{" MSGS ", \"tools\": " TOOLS "}", &none, "tool_choice", "--enable-auto-tool-choice");
    assert_int_equal(parse("{" MSGS ", \"tools\": " TOOLS "}", &hermes, &r, &err), 0);
    assert_int_equal(r.tool_choice, SRV_TOOL_CHOICE_AUTO);
    assert_int_equal(r.tool_parser, SRV_TOOL_PARSER_HERMES);
    assert_null(r.grammar);
    srv_gen_request_free(&r);
    /* none with tools: rendered, not parsed */
    assert_int_equal(parse("{" MSGS ", \"tools\": " TOOLS ", \"tool_choice\": \"none\"}", &none, &r, &err), 0);
    assert_int_equal(r.tool_choice, SRV_TOOL_CHOICE_NONE);
    srv_gen_request_free(&r);
    /* bad input */
    expect_400("{" MSGS ", \"tools\": " TOOLS ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"nope\"}}}", &none,
               "tool_choice", "not in 'tools'");
    expect_400("{" MSGS ", \"tool_choice\": \"required\"}", &none, "tool_choice", "needs 'tools'");
    expect_400("{" MSGS ", \"tools\": " TOOLS ", \"tool_choice\": \"sometimes\"}", &none, "tool_choice", NULL);
    expect_400("{" MSGS ", \"tools\": {}, \"tool_choice\": \"required\"}", &none, "tools", NULL);
    expect_400("{" MSGS ", \"tools\": [{\"type\": \"retrieval\"}], \"tool_choice\": \"required\"}", &none, "tools", NULL);
    expect_400("{" MSGS ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}], \"tool_choice\": \"required\"}", &none,
               "tools", NULL);
    expect_400("{" MSGS ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}], \"tool_choice\": \"required\"}",
               &none, "tools", NULL);
    expect_400("{" MSGS ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"required\"}",
               &none, "tools", "twice");
    /* a parameters schema the grammar cannot enforce: a 400 naming the keyword */
    expect_400("{" MSGS ", \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": {\"s\": {\"type\": \"string\", \"pattern\": \"^a\"}}}}}], \"tool_choice\": \"required\"}",
               &none, "tools", "pattern");
    expect_400("{" MSGS ", \"tools\": " TOOLS ", \"tool_choice\": \"required\", \"response_format\": {\"type\": \"json_object\"}}", &none,
               "tool_choice", "cannot be combined");
    expect_400("{" MSGS ", \"parallel_tool_calls\": 1}", &none, "parallel_tool_calls", NULL);
    /* tools on /v1/completions: refused (only "no tools" passes) */
    const char *cbody = "{\"prompt\": \"x\", \"tools\": " TOOLS "}";
    assert_int_equal(srv_parse_gen_request(cbody, strlen(cbody), SRV_ROUTE_COMPLETIONS, &none, &r, &err), -1);
    assert_string_equal(err.param, "tools");
    srv_gen_request_free(&r);
}

static void test_message_tool_fields(void **state) {
    (void)state;
    const srv_parse_limits none = {.n_vocab = 100};
    srv_gen_request r;
    srv_error err = {0};
    const char *body =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"18C\"}]}";
    assert_int_equal(parse(body, &none, &r, &err), 0);
    json_t *want = json_loads("[{\"role\": \"user\", \"content\": \"Weather?\"},"
                              " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]},"
                              " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"18C\"}]", 0, NULL);
    assert_true(json_equal(want, r.messages));
    json_decref(want);
    srv_gen_request_free(&r);
    expect_400("{\"messages\": [{\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": \"f\", \"arguments\": \"not json\"}}]}]}",
               &none, "messages", "arguments");
    expect_400("{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}", &none, "messages", NULL);
    expect_400("{\"messages\": [{\"role\": \"tool\", \"content\": \"x\", \"tool_call_id\": 3}]}", &none, "messages", NULL);
}

/* ---- templates rendered with tools ---------------------------------------------------------- */

static char *read_template(const char *name) {
    const char *shared = getenv("OSPREY_SHARED");
    char path[1024];
    snprintf(path, sizeof path, "%s/testdata/chat-templates/%s", shared ? shared : "../shared", name);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = 0;
    fclose(f);
    return s;
}

/* The round trip (user, assistant tool call, tool result) with tools, rendered by template `name`;
 * each of `want` must appear in the prompt. Returns false when the template file is absent. */
static bool render_round_trip(const char *name, const char *const *want) {
    char *src = read_template(name);
    if (!src) return false;
    osp_chat_template *t = NULL;
    assert_int_equal(osp_chat_template_parse(src, strlen(src), &t), OSP_OK);
    const srv_parse_limits lim = {.n_vocab = 100, .auto_tool_choice = true, .tool_parser = SRV_TOOL_PARSER_HERMES};
    const char *body =
        "{\"tools\": " TOOLS ", \"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
        " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"abcDEF123\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]},"
        " {\"role\": \"tool\", \"tool_call_id\": \"abcDEF123\", \"content\": \"18 degrees\"}]}";
    srv_gen_request r;
    srv_error err = {0};
    assert_int_equal(parse(body, &lim, &r, &err), 0);
    const srv_chat_env env = {.parsed = t, .bos_token = "<s>", .eos_token = "</s>"};
    char *out = NULL;
    if (srv_chat_render(&env, &r, &out, &err)) fail_msg("%s: %s", name, err.message);
    for (size_t k = 0; want[k]; k++)
        if (!strstr(out, want[k])) fail_msg("%s: the prompt lacks '%s':\n%s", name, want[k], out);
    free(out);
    srv_gen_request_free(&r);
    osp_chat_template_free(t);
    free(src);
    return true;
}

static void test_templates_with_tools(void **state) {
    (void)state;
    int rendered = 0;
    const char *qwen[] = {"<tools>", "\"name\": \"get_weather\"", "Weather in a city",
                          "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                          "<tool_response>\n18 degrees\n</tool_response>", NULL};
    rendered += render_round_trip("Qwen-Qwen2.5-7B-Instruct.jinja", qwen);
    const char *hermes[] = {"<tools>", "get_weather", "<tool_call>", "18 degrees", NULL};
    rendered += render_round_trip("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", hermes);
    const char *llama[] = {"\"name\": \"get_weather\"", "Weather in a city", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
                           "ipython", "18 degrees", NULL};
    rendered += render_round_trip("meta-llama-Llama-3.1-8B-Instruct.jinja", llama);
    const char *mistral[] = {"[AVAILABLE_TOOLS]", "get_weather", "[TOOL_CALLS]", "[TOOL_RESULTS]", "18 degrees", NULL};
    rendered += render_round_trip("mistralai-Mistral-Nemo-Instruct-2407.jinja", mistral);
    if (rendered == 0) skip(); /* ../shared absent */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_call_ids),        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_llama3_json),     cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_forced),          cmocka_unit_test(test_reasoning),
        cmocka_unit_test(test_content_prefix),  cmocka_unit_test(test_request_fields),
        cmocka_unit_test(test_message_tool_fields), cmocka_unit_test(test_templates_with_tools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
