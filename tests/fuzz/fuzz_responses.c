/* libFuzzer target for the /v1/responses request parser (tools/server/responses.c): arbitrary bytes
 * as a Responses body, the first byte choosing the server's tool parser and whether a stored
 * conversation (history) comes before the input. Whatever the input, srv_responses_parse and
 * srv_responses_to_chat must not crash or leak and must return 0 or -1 with a 4xx/5xx status and a
 * message (the error JSON is rendered for every rejection); what they accept holds its invariants:
 * one choice, a non-empty conversation that is history + input and a message list that is
 * [instructions] + that conversation, the echoed fields all present, a forced tool_choice with its
 * grammar. The conversation of an accepted request, with an assistant turn appended, is accepted
 * again as history (what the store hands the next turn). Seeds: tests/fuzz/corpus/responses/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

#define VOCAB 512

static void check_error(const srv_error *err) {
    if (err->status < 400 || err->status > 599 || !err->message[0]) abort();
    char *j = srv_error_json(err);
    if (!j) abort();
    free(j);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const srv_tool_parser tp = (srv_tool_parser)(data[0] & 3);
    const srv_parse_limits lim = {.n_vocab = VOCAB, .auto_tool_choice = tp != SRV_TOOL_PARSER_NONE, .tool_parser = tp};
    json_t *history = (data[0] & 4) ? json_loads("[{\"role\": \"user\", \"content\": \"h\"}, {\"role\": \"assistant\", \"content\": "
                                                 "\"\", \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": "
                                                 "{\"name\": \"f\", \"arguments\": {}}}]}]",
                                                 0, NULL)
                                      : NULL;
    srv_responses_request rq;
    srv_gen_request r;
    memset(&r, 0, sizeof r);
    srv_error err = {0};
    int rc = srv_responses_parse((const char *)data + 1, size - 1, &rq, &err);
    if (rc == 0) {
        if (!rq.chat || !rq.input || json_array_size(rq.input) < 1 || !rq.echo || json_object_size(rq.echo) != 13) abort();
        rc = srv_responses_to_chat(&rq, history, &lim, &r, &err);
    }
    if (rc != 0) {
        if (rc != -1) abort();
        check_error(&err);
    } else {
        const size_t nh = json_array_size(history), ni = json_array_size(rq.input), nc = json_array_size(r.resp_conversation);
        if (!r.responses || r.n != 1 || r.route != SRV_ROUTE_CHAT || nc != nh + ni) abort();
        if (json_array_size(r.messages) != nc + (rq.instructions ? 1 : 0)) abort();
        if (json_object_size(r.resp_echo) != 13 || r.resp_store != rq.store) abort();
        if ((r.tool_choice == SRV_TOOL_CHOICE_REQUIRED || r.tool_choice == SRV_TOOL_CHOICE_NAMED) && (!r.grammar || !r.tools)) abort();
        /* the next turn: this conversation + an answer, as the store keeps it, is accepted as history */
        json_t *next = json_copy(r.resp_conversation);
        json_array_append_new(next, json_pack("{s:s, s:s}", "role", "assistant", "content", "ok"));
        srv_responses_request rq2;
        srv_gen_request r2;
        srv_error e2 = {0};
        static const char body2[] = "{\"input\": \"again\"}";
        if (srv_responses_parse(body2, sizeof body2 - 1, &rq2, &e2)) abort();
        if (srv_responses_to_chat(&rq2, next, &lim, &r2, &e2) && e2.status != 500 && e2.status != 400) abort();
        srv_gen_request_free(&r2);
        srv_responses_request_free(&rq2);
        json_decref(next);
    }
    srv_gen_request_free(&r);
    srv_responses_request_free(&rq);
    json_decref(history);
    return 0;
}
