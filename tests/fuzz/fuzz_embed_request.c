/* libFuzzer target for the /v1/embeddings request parser (tools/server/request.c, route
 * SRV_ROUTE_EMBEDDINGS): arbitrary bytes as the body. Whatever the input, srv_parse_gen_request must not
 * crash or leak, must return 0 or -1 with a 4xx/5xx status and a message (the error JSON rendered for
 * every rejection), and what it accepts must hold its invariants: 1..SRV_MAX_N inputs, each a non-empty
 * text or non-empty ids in the vocabulary, n 1, nothing a generation field would set (no stream, no
 * grammar, no stop strings). Seeds: tests/fuzz/corpus/embed_request/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

#define VOCAB 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const srv_parse_limits lim = {.n_vocab = VOCAB, .n_embd = 64};
    srv_gen_request r;
    srv_error err = {0};
    const int rc = srv_parse_gen_request((const char *)data, size, SRV_ROUTE_EMBEDDINGS, &lim, &r, &err);
    if (rc != 0) {
        if (rc != -1 || err.status < 400 || err.status > 599 || !err.message[0]) abort();
        char *j = srv_error_json(&err);
        if (!j) abort();
        free(j);
    } else {
        if (r.route != SRV_ROUTE_EMBEDDINGS || r.n != 1 || r.n_prompts < 1 || r.n_prompts > SRV_MAX_N) abort();
        if (r.stream || r.grammar || r.n_stop || r.messages || r.n_bias || r.logprobs != -1) abort();
        for (int32_t p = 0; p < r.n_prompts; p++) {
            const srv_prompt *q = &r.prompts[p];
            if (q->text ? !q->text[0] : q->n_ids < 1) abort();
            for (int32_t i = 0; i < q->n_ids; i++)
                if (q->ids[i] < 0 || q->ids[i] >= VOCAB) abort();
        }
    }
    srv_gen_request_free(&r);
    return 0;
}
