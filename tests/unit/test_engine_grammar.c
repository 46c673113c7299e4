/* Structured output through the engine on SmolLM2 (CPU): requests with a grammar (from a JSON
 * schema) generate greedy, sampled and with n = 3 (children share the parent's grammar automaton);
 * every output that ends with EOS is a complete sentence of the grammar and parses as JSON with the
 * schema's required keys, one that hits max_tokens is a viable prefix and ends "length". Bad grammars
 * are refused at add. With speculative decoding (n-gram proposer, k = 4): the same tokens and
 * logprobs as without, greedy and seeded sampling, n = 1 and 2, with the grammar's forced
 * continuations drafted and mostly accepted. Skips without OSPREY_MODEL.
 * tests/gpu/test_gpu_engine_grammar.c compiles this file again with TEST_DEVICE OSP_DEVICE_CUDA: the model
 * on the GPU, its grammar rows sampled on the host from their logits (the GPU sampler takes no masks). */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grammar/grammar.h"
#include "osprey/engine.h"
#include "osprey/gguf.h"
#include "osprey/spec.h"
#include "osprey/tokenizer.h"

#ifndef TEST_DEVICE
#define TEST_DEVICE OSP_DEVICE_CPU
#endif

static const char *g_model;
static osp_tokenizer *g_tok;

static const char SCHEMA[] = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 16}, "
                             "\"age\": {\"type\": \"integer\"}, \"city\": {\"enum\": [\"Paris\", \"Rome\", \"Oslo\"]}}, "
                             "\"required\": [\"name\", \"age\", \"city\"]}";

static int setup(void **st) {
    (void)st;
    g_model = getenv("OSPREY_MODEL");
    osp_gguf *gg;
    if (!g_model || osp_gguf_open(g_model, &gg) != OSP_OK) {
        g_model = NULL;
        return 0;
    }
    if (osp_tokenizer_load(gg, &g_tok) != OSP_OK) g_model = NULL;
    osp_gguf_close(gg);
    return 0;
}

static int teardown(void **st) {
    (void)st;
    osp_tokenizer_free(g_tok);
    return 0;
}

/* The text of ids[0..n), EOG tokens left out. */
static char *detok(const int32_t *ids, int32_t n) {
    char *s = malloc((size_t)n * 64 + 1);
    size_t len = 0;
    for (int32_t i = 0; i < n; i++) {
        if (osp_tokenizer_is_eog(g_tok, ids[i])) continue;
        size_t k;
        assert_int_equal(osp_tokenizer_token_bytes(g_tok, ids[i], s + len, 64, &k), OSP_OK);
        len += k;
    }
    s[len] = 0;
    return s;
}

static void check_output(const osp_grammar *g, const int32_t *ids, int32_t n, osp_finish_reason why) {
    char *text = detok(ids, n);
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    if (osp_grammar_matcher_accept_bytes(m, (const uint8_t *)text, strlen(text)) != OSP_OK)
        fail_msg("output does not follow the grammar: %s", text);
    if (why == OSP_FINISH_STOP) {
        if (!osp_grammar_matcher_is_complete(m)) fail_msg("stopped before the grammar was complete: %s", text);
        json_error_t je;
        json_t *j = json_loads(text, 0, &je);
        if (!j) fail_msg("not JSON: %s (%s)", text, je.text);
        assert_true(json_is_string(json_object_get(j, "name")));
        assert_true(strlen(json_string_value(json_object_get(j, "name"))) <= 16);
        assert_true(json_is_integer(json_object_get(j, "age")));
        assert_true(json_is_string(json_object_get(j, "city")));
        assert_int_equal(json_object_size(j), 3);
        json_decref(j);
    } else {
        assert_int_equal(why, OSP_FINISH_LENGTH);
    }
    printf("  %s: %s\n", why == OSP_FINISH_STOP ? "stop  " : "length", text);
    osp_grammar_matcher_free(m);
    free(text);
}

/* The engine both tests run: SmolLM2 on TEST_DEVICE, invariants checked every step. */
static osp_engine_params engine_params(void) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = g_model;
    p.n_threads = 2;
    p.max_model_len = 512;
    p.device = TEST_DEVICE;
    p.check_invariants = true;
    return p;
}

/* The chat prompt both tests send, as token ids (the caller frees them). */
static int32_t *person_prompt(size_t *n_ids) {
    const char *prompt = "<|im_start|>user\nGive a person as JSON with name, age and city.<|im_end|>\n<|im_start|>assistant\n";
    int32_t *ids;
    assert_int_equal(osp_tokenizer_encode(g_tok, prompt, strlen(prompt), false, true, &ids, n_ids), OSP_OK);
    return ids;
}

static void test_engine_structured(void **st) {
    (void)st;
    if (!g_model) skip();
    char *gbnf;
    assert_int_equal(osp_json_schema_to_gbnf(SCHEMA, strlen(SCHEMA), &gbnf), OSP_OK);
    osp_grammar *g;
    assert_int_equal(osp_grammar_parse(gbnf, strlen(gbnf), NULL, &g), OSP_OK);

    osp_engine_params p = engine_params();
    osp_engine *e;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);

    size_t n_ids;
    int32_t *ids = person_prompt(&n_ids);

    osp_request_params rp = osp_request_default_params();
    rp.prompt = ids;
    rp.num_prompt = (int32_t)n_ids;
    rp.grammar = "root ::= \"a\" (";
    assert_int_equal(osp_engine_add(e, &rp), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "grammar:1:"));
    rp.grammar = gbnf;
    /* 0: greedy, 1: sampled with n = 3, 2: greedy cut short by max_tokens */
    rp.request_id = 0, rp.max_tokens = 60;
    assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
    rp.request_id = 1, rp.temperature = 1.0f, rp.has_seed = true, rp.seed = 7, rp.n = 3;
    assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
    rp.request_id = 2, rp.temperature = 0.0f, rp.n = 1, rp.max_tokens = 5;
    assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
    while (osp_engine_has_unfinished(e)) assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
    int stops = 0;
    for (uint64_t id = 0; id < 3; id++)
        for (uint32_t k = 0; k < (id == 1 ? 3u : 1u); k++) {
            int32_t out[128];
            osp_request_output o;
            assert_int_equal(osp_engine_poll_seq(e, id, k, out, NULL, 128, NULL, &o, 0), OSP_OK);
            assert_true(o.finished);
            if (o.finish_reason == OSP_FINISH_ERROR) fail_msg("request %d.%u failed: %s", (int)id, k, o.error);
            check_output(g, out, o.num_tokens, o.finish_reason);
            if (id == 2) assert_int_equal(o.finish_reason, OSP_FINISH_LENGTH);
            stops += o.finish_reason == OSP_FINISH_STOP;
        }
    assert_true(stops >= 1); /* the greedy one at least finishes its object within 60 tokens */
    free(ids);
    osp_engine_free(e);
    osp_grammar_free(g);
    free(gbnf);
}

/* Outputs of the jobs below (tokens and logprobs of every sequence), with speculation (k drafts) or
 * without (k = 0); the engine's stats out. */
#define NSEQ 4
typedef struct job_out {
    int32_t ids[NSEQ][96];
    osp_token_logprobs lp[NSEQ][96];
    int32_t n[NSEQ];
    osp_finish_reason why[NSEQ];
} job_out;

static void run_structured(const char *gbnf, int32_t k, job_out *o, osp_engine_stats *st) {
    osp_engine_params p = engine_params();
    if (k > 0) {
        p.speculative = osp_spec_default_config();
        p.speculative.method = OSP_SPEC_NGRAM;
        p.speculative.num_speculative_tokens = k;
        p.speculative.prompt_lookup_min = 2, p.speculative.prompt_lookup_max = 4;
        p.speculative_fixed_k = true; /* drafts every step: no pause, no switch */
    }
    osp_engine *e;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    size_t n_ids;
    int32_t *ids = person_prompt(&n_ids);
    osp_request_params rp = osp_request_default_params();
    rp.prompt = ids;
    rp.num_prompt = (int32_t)n_ids;
    rp.grammar = gbnf;
    rp.logprobs = 0; /* the sampled token's logprob */
    /* 0: greedy; 1: sampled, seeded, n = 2; 2: greedy cut short by max_tokens */
    rp.request_id = 0, rp.max_tokens = 80;
    assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
    rp.request_id = 1, rp.temperature = 0.8f, rp.has_seed = true, rp.seed = 11, rp.n = 2;
    assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
    rp.request_id = 2, rp.temperature = 0.0f, rp.n = 1, rp.max_tokens = 9;
    assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
    while (osp_engine_has_unfinished(e)) assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
    int seq = 0;
    for (uint64_t id = 0; id < 3; id++)
        for (uint32_t c = 0; c < (id == 1 ? 2u : 1u); c++, seq++) {
            osp_request_output ro;
            assert_int_equal(osp_engine_poll_seq(e, id, c, o->ids[seq], o->lp[seq], 96, NULL, &ro, 0), OSP_OK);
            assert_true(ro.finished);
            if (ro.finish_reason == OSP_FINISH_ERROR) fail_msg("request %d.%u failed: %s", (int)id, c, ro.error);
            o->n[seq] = ro.num_tokens;
            o->why[seq] = ro.finish_reason;
        }
    *st = osp_engine_get_stats(e);
    free(ids);
    osp_engine_free(e);
}

static void test_engine_structured_spec(void **st) {
    (void)st;
    if (!g_model) skip();
    char *gbnf;
    assert_int_equal(osp_json_schema_to_gbnf(SCHEMA, strlen(SCHEMA), &gbnf), OSP_OK);
    osp_grammar *g;
    assert_int_equal(osp_grammar_parse(gbnf, strlen(gbnf), NULL, &g), OSP_OK);
    static job_out base, spec;
    osp_engine_stats s0, s1;
    run_structured(gbnf, 0, &base, &s0);
    run_structured(gbnf, 4, &spec, &s1);
    assert_int_equal(s0.spec_num_draft_tokens, 0);
    printf("  speculative under the grammar: %lld rows, %lld drafts, %lld accepted\n", (long long)s1.spec_num_drafts,
           (long long)s1.spec_num_draft_tokens, (long long)s1.spec_num_accepted_tokens);
    assert_true(s1.spec_num_accepted_tokens > 0);
    for (int i = 0; i < NSEQ; i++) {
        assert_int_equal(spec.n[i], base.n[i]);
        assert_int_equal(spec.why[i], base.why[i]);
        assert_memory_equal(spec.ids[i], base.ids[i], sizeof(int32_t) * (size_t)base.n[i]);
        for (int32_t t = 0; t < base.n[i]; t++) /* logprobs: the target's at each position, computed in a
                                                    verification row or a plain one (fp32, the same forward) */
            assert_true(fabsf(spec.lp[i][t].logprob - base.lp[i][t].logprob) <= 1e-3f);
        check_output(g, base.ids[i], base.n[i], base.why[i]);
    }
    osp_grammar_free(g);
    free(gbnf);
}

int main(void) {
    if (TEST_DEVICE == OSP_DEVICE_CUDA && osp_device_count(OSP_DEVICE_CUDA) == 0) {
        printf("test_gpu_engine_grammar: skipped: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_engine_structured),
                                       cmocka_unit_test(test_engine_structured_spec)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
