/* libFuzzer target for the GBNF parser and the matcher (src/grammar/).
 *
 * Input: a grammar text, optionally followed by a NUL byte and bytes to feed the matcher. A rejected
 * grammar must fail with OSP_ERR_FORMAT and a "grammar..." message, and leave the output alone. An
 * accepted one runs: the bytes are fed one at a time (a rejected byte leaves the state as it was: the
 * same completeness and the same mask), and at every step the mask over a small fixed vocabulary must
 * equal feeding each token to a clone; at the end the automaton's invariants hold. Sizes are capped by the parser (OSP_GRAMMAR_MAX_ELEMS), so a
 * slow input is a bug too. Seeds: tests/fuzz/corpus/grammar/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *const VOCAB[] = {"a", "b", "ab", "\"", "{", "}", "[", "]", ",", ":", " ", "\n", "0", "12", "-",
                                    "true", "null", "\xc3\xa9", "\xc3", "\xa9", "x\"", "\":", "\\", "", "<eos>"};
#define NV ((int32_t)(sizeof VOCAB / sizeof *VOCAB))

static void check_mask(osp_grammar_matcher *m, const osp_token_trie *t) {
    uint32_t mask[(NV + 31) / 32];
    const osp_status st = osp_grammar_matcher_fill_mask(m, t, mask);
    if (st == OSP_ERR_UNSUPPORTED) return; /* too ambiguous: refused, not hung */
    if (st != OSP_OK) abort();
    for (int32_t id = 0; id < NV; id++) {
        osp_grammar_matcher *c;
        if (osp_grammar_matcher_clone(m, &c) != OSP_OK) abort();
        const osp_status s = osp_grammar_matcher_accept_token(c, t, id);
        osp_grammar_matcher_free(c);
        if (s == OSP_ERR_UNSUPPORTED) continue;
        if ((s == OSP_OK) != (int)((mask[id >> 5] >> (id & 31)) & 1)) abort();
    }
}

/* The forced continuation's drafts: each accepted in turn by a clone (a draft the grammar refuses would
 * be a bug: the engine's verification never keeps one, but it would waste every step), none EOG, at
 * most cap, and the matcher itself unchanged. */
static void check_forced(osp_grammar_matcher *m, const osp_token_trie *t) {
    int32_t d[8];
    uint32_t before[(NV + 31) / 32], after[(NV + 31) / 32];
    const bool masked = osp_grammar_matcher_fill_mask(m, t, before) == OSP_OK;
    const int32_t n = osp_grammar_matcher_forced_tokens(m, t, d, 8);
    if (n < 0 || n > 8) abort();
    osp_grammar_matcher *c;
    if (osp_grammar_matcher_clone(m, &c) != OSP_OK) abort();
    for (int32_t i = 0; i < n; i++) {
        if (d[i] < 0 || d[i] >= NV - 1) abort();
        const osp_status s = osp_grammar_matcher_accept_token(c, t, d[i]);
        if (s != OSP_OK && s != OSP_ERR_UNSUPPORTED) abort();
        if (s != OSP_OK) break;
    }
    osp_grammar_matcher_free(c);
    if (masked && (osp_grammar_matcher_fill_mask(m, t, after) != OSP_OK || memcmp(before, after, sizeof before) != 0))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, 0, size);
    const size_t glen = nul ? (size_t)(nul - data) : size;
    osp_grammar *g = (osp_grammar *)&glen; /* must stay untouched on failure */
    const osp_status st = osp_grammar_parse((const char *)data, glen, NULL, &g);
    if (st != OSP_OK) {
        if (st != OSP_ERR_FORMAT || strncmp(osp_last_error(), "grammar", 7) != 0) abort();
        if (g != (osp_grammar *)&glen) abort();
        return 0;
    }
    char *dump = osp_grammar_dump(g);
    if (!dump) abort();
    free(dump);
    const uint8_t *bytes[NV];
    size_t lens[NV];
    for (int32_t i = 0; i < NV; i++) bytes[i] = (const uint8_t *)VOCAB[i], lens[i] = strlen(VOCAB[i]);
    const int32_t eog = NV - 1;
    osp_token_trie *t;
    osp_grammar_matcher *m;
    if (osp_token_trie_new(NV, bytes, lens, NULL, &eog, 1, &t) != OSP_OK) abort();
    const osp_status ms = osp_grammar_matcher_new(g, &m);
    if (ms == OSP_ERR_UNSUPPORTED) {
        osp_token_trie_free(t);
        osp_grammar_free(g);
        return 0;
    }
    if (ms != OSP_OK) abort();
    check_mask(m, t);
    const uint8_t *in = nul ? nul + 1 : data + size;
    const size_t n_in = nul ? size - glen - 1 : 0;
    for (size_t i = 0; i < n_in && i < 64; i++) {
        const bool was = osp_grammar_matcher_is_complete(m);
        if (osp_grammar_matcher_accept_bytes(m, in + i, 1) != OSP_OK) {
            if (osp_grammar_matcher_is_complete(m) != was) abort();
            continue;
        }
        if (i % 8 == 0) check_mask(m, t), check_forced(m, t);
    }
    check_mask(m, t);
    check_forced(m, t);
    if (osp_grammar_matcher_check_invariants(m) != OSP_OK) abort();
    osp_grammar_matcher_free(m);
    osp_token_trie_free(t);
    osp_grammar_free(g);
    return 0;
}
