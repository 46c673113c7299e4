/* libFuzzer target for the server's request parser (tools/server/request.c): arbitrary bytes as a
 * /v1/completions or /v1/chat/completions body (the first byte picks the route). Whatever the input,
 * srv_parse_gen_request must not crash or leak, must return 0 or -1 with a 4xx/5xx status and a
 * message, and what it accepts must hold its invariants (n in range, ids in the vocabulary, stop
 * strings non-empty, a chat conversation rendered by its own chat_template, when it has one; tool
 * fields consistent: a forced tool_choice has its grammar, auto only with a parser; the first byte's
 * bits 1-4 pick the server's tool and reasoning parsers, bits 5-6 its kv_role; kv_transfer_params
 * accepted only as that role allows, with one flag and a prefill's remote fields). The error JSON is
 * rendered for every rejection. Seeds: tests/fuzz/corpus/request/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

#define VOCAB 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const srv_route route = (data[0] & 1) ? SRV_ROUTE_CHAT : SRV_ROUTE_COMPLETIONS;
    /* bits 1-2: the server's --tool-call-parser (0: none; else with --enable-auto-tool-choice) */
    const srv_tool_parser tp = (srv_tool_parser)((data[0] >> 1) & 3);
    const srv_parse_limits lim = {.n_vocab = VOCAB, .auto_tool_choice = tp != SRV_TOOL_PARSER_NONE, .tool_parser = tp,
                                  .reasoning_parser = (srv_reasoning_parser)((data[0] >> 3) % 3),
                                  .kv_role = (osp_kv_role)((data[0] >> 5) & 3)};
    srv_gen_request r;
    srv_error err = {0};
    const int rc = srv_parse_gen_request((const char *)data + 1, size - 1, route, &lim, &r, &err);
    if (rc != 0) {
        if (rc != -1 || err.status < 400 || err.status > 599 || !err.message[0]) abort();
        char *j = srv_error_json(&err);
        if (!j) abort();
        free(j);
    } else {
        if (r.n < 1 || r.n > SRV_MAX_N || r.n_stop > SRV_MAX_STOPS) abort();
        if (r.logprobs < -1 || r.logprobs > SRV_MAX_LOGPROBS) abort();
        for (int32_t i = 0; i < r.n_stop; i++)
            if (!r.stop[i][0]) abort();
        for (int32_t i = 0; i < r.n_bias; i++)
            if (r.bias_ids[i] < 0 || r.bias_ids[i] >= VOCAB || r.bias_values[i] < -100 || r.bias_values[i] > 100) abort();
        if (r.kv_transfer_set) {
            const osp_kv_transfer_params *k = &r.kv_transfer;
            const bool prod = lim.kv_role == OSP_KV_ROLE_PRODUCER || lim.kv_role == OSP_KV_ROLE_BOTH;
            const bool cons = lim.kv_role == OSP_KV_ROLE_CONSUMER || lim.kv_role == OSP_KV_ROLE_BOTH;
            if (k->do_remote_decode == k->do_remote_prefill || (k->do_remote_decode && !prod) || (k->do_remote_prefill && !cons))
                abort();
            if (k->do_remote_decode && (r.stream || r.n != 1 || r.n_prompts > 1)) abort();
            if (k->do_remote_prefill && (!k->remote_host[0] || k->remote_port < 1 || k->remote_port > 65535 ||
                                         k->remote_num_blocks < 0 || !memchr(k->remote_host, 0, sizeof k->remote_host)))
                abort();
        }
        if (route == SRV_ROUTE_COMPLETIONS) {
            if (r.n_prompts < 1) abort();
            for (int32_t p = 0; p < r.n_prompts; p++) {
                const srv_prompt *q = &r.prompts[p];
                if (!q->text && q->n_ids < 1) abort();
                for (int32_t i = 0; i < q->n_ids; i++)
                    if (q->ids[i] < 0 || q->ids[i] >= VOCAB) abort();
            }
        } else {
            if (json_array_size(r.messages) < 1) abort();
            /* tools: a forced choice always has its grammar; a named one names a given tool */
            if ((r.tool_choice == SRV_TOOL_CHOICE_REQUIRED || r.tool_choice == SRV_TOOL_CHOICE_NAMED) && (!r.grammar || !r.tools))
                abort();
            if (r.tool_choice == SRV_TOOL_CHOICE_NAMED && !r.tool_name) abort();
            if (r.tool_choice == SRV_TOOL_CHOICE_AUTO && tp == SRV_TOOL_PARSER_NONE) abort();
            /* a per-request template from the input itself exercises the renderer too */
            const srv_chat_env env = {.template_text = NULL};
            char *text = NULL;
            if (srv_chat_render(&env, &r, &text, &err) == 0) {
                if (!text) abort();
                free(text);
            } else if (err.status < 400) {
                abort();
            }
        }
    }
    srv_gen_request_free(&r);
    return 0;
}
