/* Token-mask micro-benchmark (issue 19): time per token of osp_grammar_matcher_fill_mask over a real
 * vocabulary, along a JSON document of a 20-property schema as the model's tokenizer splits it.
 *
 *   grammar_bench -m MODEL.gguf [-r REPS]
 *
 * Pass "cold": a fresh automaton, so every step may build states and walk the whole trie (what the
 * first request with a new schema pays). Pass "warm": a second document with other values through a
 * clone of the same start state (shared automaton): repeated states hit the per-state mask cache,
 * new ones (other digits, other string lengths) still walk. Each prints median / p90 / max microseconds per token over REPS runs, one core. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar/grammar.h"
#include "osprey/gguf.h"
#include "osprey/tokenizer.h"

static const char SCHEMA[] =
    "{\"type\": \"object\", \"properties\": {"
    "\"id\": {\"type\": \"integer\"}, \"name\": {\"type\": \"string\"}, \"email\": {\"type\": \"string\"},"
    "\"age\": {\"type\": \"integer\"}, \"score\": {\"type\": \"number\"}, \"active\": {\"type\": \"boolean\"},"
    "\"role\": {\"enum\": [\"admin\", \"user\", \"guest\"]}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 5},"
    "\"city\": {\"type\": \"string\"}, \"country\": {\"type\": \"string\"}, \"zip\": {\"type\": \"string\", \"maxLength\": 10},"
    "\"phone\": {\"type\": [\"string\", \"null\"]}, \"created\": {\"type\": \"string\", \"format\": \"date\"},"
    "\"height\": {\"type\": \"number\"}, \"weight\": {\"type\": \"number\"}, \"notes\": {\"type\": \"string\"},"
    "\"manager\": {\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\"}, \"name\": {\"type\": \"string\"}}, \"required\": [\"id\", \"name\"]},"
    "\"level\": {\"type\": \"integer\"}, \"verified\": {\"type\": \"boolean\"}, \"nickname\": {\"type\": \"string\"}},"
    "\"required\": [\"id\", \"name\", \"email\", \"age\", \"score\", \"active\", \"role\", \"tags\", \"city\", \"country\","
    "\"zip\", \"phone\", \"created\", \"height\", \"weight\", \"notes\", \"manager\", \"level\", \"verified\", \"nickname\"]}";

static const char DOC1[] =
    "{\"id\": 12345, \"name\": \"Ada Lovelace\", \"email\": \"ada@example.com\", \"age\": 36, \"score\": 98.5, "
    "\"active\": true, \"role\": \"admin\", \"tags\": [\"math\", \"engines\"], \"city\": \"London\", \"country\": \"UK\", "
    "\"zip\": \"W1\", \"phone\": null, \"created\": \"1843-07-10\", \"height\": 1.65, \"weight\": 55.0, "
    "\"notes\": \"Wrote the first program for the Analytical Engine.\", \"manager\": {\"id\": 1, \"name\": \"Charles Babbage\"}, "
    "\"level\": 9, \"verified\": false, \"nickname\": \"Enchantress of Numbers\"}";
static const char DOC2[] =
    "{\"id\": 7, \"name\": \"Alan Turing\", \"email\": \"alan@example.org\", \"age\": 41, \"score\": 99.25, "
    "\"active\": false, \"role\": \"user\", \"tags\": [\"logic\", \"codes\", \"biology\"], \"city\": \"Wilmslow\", "
    "\"country\": \"England\", \"zip\": \"SK9\", \"phone\": \"+44 1625 000000\", \"created\": \"1912-06-23\", \"height\": 1.78, "
    "\"weight\": 70.3, \"notes\": \"Proposed the imitation game; broke Enigma traffic.\", \"manager\": {\"id\": 2, "
    "\"name\": \"Max Newman\"}, \"level\": 10, \"verified\": true, \"nickname\": \"Prof\"}";

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, double *t, size_t n) {
    qsort(t, n, sizeof *t, cmp_d);
    printf("%-5s  tokens %4zu  median %8.2f us  p90 %8.2f us  max %9.2f us\n", name, n, t[n / 2], t[n * 9 / 10], t[n - 1]);
}

/* Runs doc through m, timing fill_mask per token into t[0..n); returns n, or 0 on a failure. */
static size_t run_doc(osp_grammar_matcher *m, const osp_token_trie *tr, const int32_t *ids, size_t n, uint32_t *mask,
                      double *t) {
    for (size_t i = 0; i < n; i++) {
        const double t0 = now_us();
        if (osp_grammar_matcher_fill_mask(m, tr, mask) != OSP_OK) return fprintf(stderr, "mask: %s\n", osp_last_error()), 0;
        t[i] = now_us() - t0;
        if (!((mask[ids[i] >> 5] >> (ids[i] & 31)) & 1)) return fprintf(stderr, "token %zu masked\n", i), 0;
        if (osp_grammar_matcher_accept_token(m, tr, ids[i]) != OSP_OK) return fprintf(stderr, "accept: %s\n", osp_last_error()), 0;
    }
    return n;
}

int main(int argc, char **argv) {
    const char *model = NULL;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else return fprintf(stderr, "usage: grammar_bench -m MODEL.gguf [-r REPS]\n"), 2;
    }
    if (!model) return fprintf(stderr, "usage: grammar_bench -m MODEL.gguf [-r REPS]\n"), 2;
    osp_gguf *gg;
    osp_tokenizer *tok;
    if (osp_gguf_open(model, &gg) != OSP_OK || osp_tokenizer_load(gg, &tok) != OSP_OK)
        return fprintf(stderr, "%s\n", osp_last_error()), 1;
    osp_gguf_close(gg);
    double t0 = now_us();
    osp_token_trie *tr;
    if (osp_token_trie_from_tokenizer(tok, &tr) != OSP_OK) return fprintf(stderr, "%s\n", osp_last_error()), 1;
    printf("vocab %d, trie %d nodes, built in %.1f ms\n", osp_token_trie_n_vocab(tr), osp_token_trie_n_nodes(tr),
           (now_us() - t0) / 1e3);
    char *gbnf;
    osp_grammar *g;
    t0 = now_us();
    if (osp_json_schema_to_gbnf(SCHEMA, strlen(SCHEMA), &gbnf) != OSP_OK ||
        osp_grammar_parse(gbnf, strlen(gbnf), NULL, &g) != OSP_OK)
        return fprintf(stderr, "%s\n", osp_last_error()), 1;
    printf("schema: 20 properties -> %d rules, %d elements, compiled in %.1f ms\n", osp_grammar_n_rules(g),
           osp_grammar_n_elems(g), (now_us() - t0) / 1e3);
    int32_t *id1, *id2;
    size_t n1, n2;
    if (osp_tokenizer_encode(tok, DOC1, strlen(DOC1), false, false, &id1, &n1) != OSP_OK ||
        osp_tokenizer_encode(tok, DOC2, strlen(DOC2), false, false, &id2, &n2) != OSP_OK)
        return fprintf(stderr, "%s\n", osp_last_error()), 1;
    uint32_t *mask = malloc((size_t)(osp_token_trie_n_vocab(tr) + 31) / 32 * 4);
    double *cold = malloc(n1 * (size_t)reps * sizeof *cold), *warm = malloc(n2 * (size_t)reps * sizeof *warm);
    size_t nc = 0, nw = 0;
    for (int r = 0; r < reps; r++) {
        osp_grammar_matcher *start, *m;
        osp_grammar_matcher_new(g, &start);
        osp_grammar_matcher_clone(start, &m);
        const size_t a = run_doc(m, tr, id1, n1, mask, cold + nc);
        osp_grammar_matcher_free(m);
        osp_grammar_matcher_clone(start, &m);
        const size_t b = run_doc(m, tr, id2, n2, mask, warm + nw);
        osp_grammar_matcher_free(m);
        if (!a || !b) return 1;
        nc += a, nw += b;
        int32_t nn, ns, nm;
        osp_grammar_matcher_stats(start, &nn, &ns, &nm);
        if (r == 0) printf("automaton after both documents: %d stack nodes, %d states, %d cached masks\n", nn, ns, nm);
        osp_grammar_matcher_free(start);
    }
    printf("%s, 20-property schema", osp_tokenizer_pre_name(tok)), printf(", one core, %d reps:\n", reps);
    report("cold", cold, nc);
    report("warm", warm, nw);
    free(mask), free(cold), free(warm), free(id1), free(id2), free(gbnf);
    osp_grammar_free(g);
    osp_token_trie_free(tr);
    osp_tokenizer_free(tok);
    return 0;
}
