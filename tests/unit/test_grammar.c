/* Unit tests of the grammar engine (src/grammar/): GBNF parsing and its errors, the matcher on
 * strings the grammar must accept or reject, clones, token masks on a hand-made vocabulary and on
 * SmolLM2's (every mask bit checked against feeding that token to a clone of the matcher), and JSON
 * Schema -> grammar. SmolLM2's vocabulary comes from OSPREY_MODEL; those cases skip without it. */
#include <setjmp.h>
#include <stdarg.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "grammar/grammar.h"
#include "osprey/gguf.h"
#include "osprey/tokenizer.h"

/* ---- helpers ----------------------------------------------------------------------------------- */

static osp_grammar *parse_ok(const char *src) {
    osp_grammar *g = NULL;
    const osp_status st = osp_grammar_parse(src, strlen(src), NULL, &g);
    if (st != OSP_OK) fail_msg("grammar failed to parse: %s\n%s", osp_last_error(), src);
    return g;
}

/* 1: the whole string is a sentence; 0: a viable prefix only; -1: rejected. */
static int run(const osp_grammar *g, const char *s) {
    osp_grammar_matcher *m = NULL;
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    int r;
    if (osp_grammar_matcher_accept_bytes(m, (const uint8_t *)s, strlen(s)) != OSP_OK) r = -1;
    else r = osp_grammar_matcher_is_complete(m) ? 1 : 0;
    if (osp_grammar_matcher_check_invariants(m) != OSP_OK) fail_msg("%s", osp_last_error());
    osp_grammar_matcher_free(m);
    return r;
}

static void expect(const char *grammar, const char *const *yes, const char *const *prefix, const char *const *no) {
    osp_grammar *g = parse_ok(grammar);
    for (; yes && *yes; yes++)
        if (run(g, *yes) != 1) fail_msg("expected '%s' accepted by\n%s", *yes, grammar);
    for (; prefix && *prefix; prefix++)
        if (run(g, *prefix) != 0) fail_msg("expected '%s' a prefix only of\n%s", *prefix, grammar);
    for (; no && *no; no++)
        if (run(g, *no) != -1) fail_msg("expected '%s' rejected by\n%s", *no, grammar);
    osp_grammar_free(g);
}

static void expect_error(const char *grammar, const char *msg_part) {
    osp_grammar *g = NULL;
    const osp_status st = osp_grammar_parse(grammar, strlen(grammar), NULL, &g);
    if (st != OSP_ERR_FORMAT) fail_msg("expected a format error for\n%s\n(got %s)", grammar, osp_status_str(st));
    assert_null(g);
    if (!strstr(osp_last_error(), msg_part)) fail_msg("error '%s' lacks '%s'", osp_last_error(), msg_part);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ---- parsing ----------------------------------------------------------------------------------- */

static void test_basics(void **st) {
    (void)st;
    expect("root ::= \"ab\" | \"c\"", L("ab", "c"), L("", "a"), L("b", "abc", "cc"));
    expect("root ::= (\"a\" | \"b\")* \"!\"", L("!", "a!", "abba!"), L("", "ab"), L("c", "!a"));
    expect("root ::= [a-c]+ [0-9]?", L("a", "abc", "cab7"), L(""), L("7", "a77", "d"));
    expect("root ::= \"x\"{2,3}", L("xx", "xxx"), L("", "x"), L("xxxx"));
    expect("root ::= \"x\"{2}", L("xx"), L("x"), L("xxx"));
    expect("root ::= \"x\"{2,} \"y\"", L("xxy", "xxxxxy"), L("x", "xx"), L("xy"));
    expect("root ::= \"ab\"{0,2}", L("", "ab", "abab"), L("a", "aba"), L("ababa", "b"));
    /* a rule per line; comments; '|' at a line end or the start of the next; newlines in groups */
    expect("# comment\nroot ::= a b # trailing\na ::= \"a\" |\n  \"A\"\nb ::= \"b\"\n  | \"B\"\n", L("ab", "AB", "aB"),
           NULL, L("ba"));
    expect("root ::= (\n  \"a\"\n  \"b\"\n)", L("ab"), NULL, L("a b"));
    expect("root ::= \"\" | \"z\"", L("", "z"), NULL, L("zz"));
    /* escapes: \n \t \" \\ \x \u (code points, UTF-8 encoded) */
    expect("root ::= \"\\n\\t\\\"\\\\\\x41\\u00e9\"", L("\n\t\"\\A\xc3\xa9"), NULL, L("\n\t\"\\A\xe9"));
    /* classes over code points: negation covers multi-byte characters, ranges span lengths */
    expect("root ::= [^a]", L("b", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"), L("\xe2\x82"), L("a", "\xff", "\xc0\x80"));
    expect("root ::= [\\u00e0-\\u20ac]", L("\xc3\xa0", "\xe2\x82\xac", "\xdf\xbf", "\xe0\xa0\x80"), NULL,
           L("\xc3\x9f", "\xe2\x82\xad", "a"));
    expect("root ::= .+", L("a", "\xc3\xa9z"), L("\xc3"), L("\xed\xa0\x80", "\x80")); /* no surrogates */
    expect("root ::= [\\]\\[\\-^]", L("]", "[", "-", "^"), NULL, L("a"));
    expect("root ::= [a-]", L("a", "-"), NULL, L("b"));
    expect("root ::= x\nx ::= \"(\" x \")\" | \"\"", L("", "()", "(())"), L("(", "(()"), L(")", "())"));
    expect("root ::= name-2_x\nname-2_x ::= \"ok\"", L("ok"), NULL, NULL);
}

/* The layout GBNF files are written in: rules spread over lines inside groups, an empty first
 * alternative, comments after elements, classes with escapes and \x ranges, counted repetition. */
static void test_multiline_file(void **st) {
    (void)st;
    const char *g =
        "root ::= item (\",\" sp item)*   # a list\n"
        "\n"
        "item ::=\n"
        "  \"<\" (\n"
        "      word\n"
        "    | num     # either\n"
        "  )? \">\"\n"
        "word ::= [^<>,\\\\\\x00-\\x1F]+\n"
        "num ::= (\"-\"? [1-9] [0-9]{0,3}) (\".\" [0-9]+)?\n"
        "sp ::= | \" \" | \"\\n\" [ \\t]{0,2}\n";
    expect(g, L("<>", "<ab>", "<-12.5>", "<x>, <9>,<y>", "<a>,\n\t\t<b>"), L("<ab", "<a>,"),
           L("<a,b>", "<a\tb>", "<\\>", "<a>,\n\t\t\t<b>"));
}

static void test_errors(void **st) {
    (void)st;
    expect_error("root ::= \"a", "grammar:1:10: unterminated literal");
    expect_error("root ::= a\n", "grammar:1:10: undefined rule 'a'");
    expect_error("root := \"a\"", "grammar:1:6: expected '::='");
    expect_error("root ::= \"a\"\nroot ::= \"b\"", "grammar:2:1: rule 'root' defined twice");
    expect_error("start ::= \"a\"", "no rule named 'root'");
    expect_error("root ::= root \"a\" | \"b\"", "left-recursive");
    expect_error("root ::= x\nx ::= \"\"? x", "left-recursive");
    expect_error("root ::= (\"a\"?)*", "left-recursive");
    /* a start rule that matches no string (found by a fresh-user walkthrough: it was a 200 ending in
     * finish_reason "error"): a class that allows nothing, recursion without an end */
    expect_error("root ::= [^\\x00-\\U0010FFFF]", "matches no string");
    expect_error("root ::= \"a\" root", "matches no string");
    expect_error("root ::= x \"b\"\nx ::= \"a\" x | [^\\x00-\\U0010FFFF]", "matches no string");
    expect_error("root ::= [a-", "unterminated character class");
    expect_error("root ::= [z-a]", "range end before its start");
    expect_error("root ::= * \"a\"", "grammar:1:10: '*' with nothing before it");
    expect_error("root ::= \"a\"{3,2}", "n < m");
    expect_error("root ::= \"a\"{1000000}", "repetition count above");
    expect_error("root ::= \"a\"{1000}{1000}{1000}", "grammar too large");
    expect_error("root ::= (\"a\"", "'(' without its ')'");
    expect_error("root ::= \"a\")", "unmatched ')'");
    expect_error("root ::= \"\\q\"", "unknown escape");
    expect_error("root ::= \"\\x4\"", "escape needs 2 hex digits");
    expect_error("root ::= \"\\ud800\"", "not a Unicode scalar value");
    expect_error("root ::= <[123]>", "token references");
    expect_error("root ::= \"a\"\n  \"b\"", "grammar:2:3: expected a rule name");
    expect_error("root ::= \"\xff\"", "malformed UTF-8");
    char deep[1024] = "root ::= ";
    for (int i = 0; i < 300; i++) strcat(deep, "(");
    expect_error(deep, "nested too deep");
    /* NUL bytes inside the text are just bad characters, not the end */
    osp_grammar *g = NULL;
    assert_int_equal(osp_grammar_parse("root ::= \"a\"\0x", 14, NULL, &g), OSP_ERR_FORMAT);
    assert_int_equal(osp_grammar_parse("x ::= \"a\"", 9, "x", &g), OSP_OK);
    assert_int_equal(run(g, "a"), 1);
    osp_grammar_free(g);
}

static void test_json_grammar(void **st) {
    (void)st;
    osp_grammar *g = parse_ok(osp_json_object_gbnf());
    assert_int_equal(run(g, "{}"), 1);
    assert_int_equal(run(g, "{\"a\": [1, -2.5e3, \"x\\u00e9\\n\", true, null, {}], \"b\" : {\"c\":[]}}"), 1);
    assert_int_equal(run(g, "{\"a\": \"\xc3\xa9\"}"), 1);
    assert_int_equal(run(g, "{\"a\":"), 0);
    assert_int_equal(run(g, "{\"a\":}"), -1);
    assert_int_equal(run(g, "[1]"), -1);
    assert_int_equal(run(g, "{\"a\": 01}"), -1);
    assert_int_equal(run(g, "{\"a\": \"\n\"}"), -1);
    assert_int_equal(run(g, " {}"), -1);
    char *dump = osp_grammar_dump(g);
    assert_non_null(dump);
    assert_non_null(strstr(dump, "root ::= object"));
    free(dump);
    osp_grammar_free(g);
}

static void test_clone(void **st) {
    (void)st;
    osp_grammar *g = parse_ok("root ::= \"a\" (\"b\" | \"c\") \"d\"");
    osp_grammar_matcher *m, *c;
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"a", 1), OSP_OK);
    assert_int_equal(osp_grammar_matcher_clone(m, &c), OSP_OK);
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"bd", 2), OSP_OK);
    assert_int_equal(osp_grammar_matcher_accept_bytes(c, (const uint8_t *)"bx", 2), OSP_ERR_INVALID_ARG);
    assert_false(osp_grammar_matcher_is_complete(c)); /* unchanged by the rejected call */
    assert_int_equal(osp_grammar_matcher_accept_bytes(c, (const uint8_t *)"cd", 2), OSP_OK);
    assert_true(osp_grammar_matcher_is_complete(m));
    assert_true(osp_grammar_matcher_is_complete(c));
    assert_false(osp_grammar_matcher_can_continue(c));
    osp_grammar_matcher_free(m); /* the clone keeps the shared automaton alive */
    assert_true(osp_grammar_matcher_is_complete(c));
    osp_grammar_matcher_free(c);
    osp_grammar_free(g);
}

/* More than 65536 states (AUTO_MAX_STATES): the automaton is rebuilt from the states its matchers
 * hold, and every member of the family (a clone left behind too) keeps its place. */
static void test_compaction(void **st) {
    (void)st;
    osp_grammar *g = parse_ok("root ::= \"a\"{0,70000} \"b\"");
    osp_grammar_matcher *m, *c = NULL;
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    for (int i = 0; i < 69000; i++) {
        assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"a", 1), OSP_OK);
        if (i == 9) assert_int_equal(osp_grammar_matcher_clone(m, &c), OSP_OK); /* 10 a's */
    }
    int32_t nodes, states;
    assert_int_equal(osp_grammar_matcher_check_invariants(m), OSP_OK);
    osp_grammar_matcher_stats(m, &nodes, &states, NULL);
    assert_true(states < 5000); /* rebuilt once past 65536 (about 3500 grown since) */
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"aaab", 4), OSP_OK);
    assert_true(osp_grammar_matcher_is_complete(m));
    assert_false(osp_grammar_matcher_can_continue(m));
    /* the clone: 10 a's, so 69990 more may come, then b */
    assert_false(osp_grammar_matcher_is_complete(c));
    assert_int_equal(osp_grammar_matcher_accept_bytes(c, (const uint8_t *)"aaaaab", 6), OSP_OK);
    assert_true(osp_grammar_matcher_is_complete(c));
    osp_grammar_matcher_free(m);
    osp_grammar_matcher_free(c);
    osp_grammar_free(g);
}

/* A grammar whose stack set grows exponentially ("(" can open a nested root or be the '.'): refused
 * as too ambiguous after a while, quickly, never hung; the state stays usable. */
static void test_too_ambiguous(void **st) {
    (void)st;
    osp_grammar *g = parse_ok("root ::= (\"(\" root*) . (\"(\" root*) .");
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    osp_status s = OSP_OK;
    int i = 0;
    for (; i < 200 && s == OSP_OK; i++) s = osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"(", 1);
    assert_int_equal(s, OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "too ambiguous"));
    assert_true(i > 5);
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"(", 1), OSP_ERR_INVALID_ARG); /* dead now */
    assert_int_equal(osp_grammar_matcher_check_invariants(m), OSP_OK);
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
}

/* ---- masks ------------------------------------------------------------------------------------- */

static int bit(const uint32_t *mask, int32_t id) { return (mask[id >> 5] >> (id & 31)) & 1; }

/* Every bit of m's mask equals "a clone of m accepts that token". */
static void check_mask_brute(osp_grammar_matcher *m, const osp_token_trie *t, int32_t *n_allowed) {
    const int32_t nv = osp_token_trie_n_vocab(t);
    uint32_t *mask = calloc((size_t)(nv + 31) / 32, 4);
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
    int32_t n = 0;
    for (int32_t id = 0; id < nv; id++) {
        osp_grammar_matcher *c;
        assert_int_equal(osp_grammar_matcher_clone(m, &c), OSP_OK);
        const int ok = osp_grammar_matcher_accept_token(c, t, id) == OSP_OK;
        osp_grammar_matcher_free(c);
        if (ok != bit(mask, id)) fail_msg("token %d: mask says %d, accept says %d", id, bit(mask, id), ok);
        n += ok;
    }
    if (osp_grammar_matcher_check_invariants(m) != OSP_OK) fail_msg("%s", osp_last_error());
    /* the cached mask (second call) is the same */
    uint32_t *again = calloc((size_t)(nv + 31) / 32, 4);
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, again), OSP_OK);
    assert_memory_equal(mask, again, (size_t)(nv + 31) / 32 * 4);
    free(again);
    free(mask);
    if (n_allowed) *n_allowed = n;
}

static void test_mask_small_vocab(void **st) {
    (void)st;
    /* 0 "a", 1 "b", 2 "ab", 3 "{", 4 "}", 5 "é" (2 bytes), 6 first byte of "é", 7 "" (unused),
     * 8 "<eos>" (EOG), 9 "<ctl>" (excluded control), 10 "aab", 11 "b" again (duplicate bytes) */
    const char *toks[] = {"a", "b", "ab", "{", "}", "\xc3\xa9", "\xc3", "", "<eos>", "<ctl>", "aab", "b"};
    const int32_t nv = 12;
    const uint8_t *bytes[12];
    size_t lens[12];
    bool excl[12] = {0};
    excl[9] = true;
    for (int i = 0; i < nv; i++) bytes[i] = (const uint8_t *)toks[i], lens[i] = strlen(toks[i]);
    const int32_t eog = 8;
    osp_token_trie *t;
    assert_int_equal(osp_token_trie_new(nv, bytes, lens, excl, &eog, 1, &t), OSP_OK);
    assert_true(osp_token_trie_is_eog(t, 8));

    osp_grammar *g = parse_ok("root ::= \"a\"+ \"b\"");
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    uint32_t mask[1];
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
    assert_int_equal(mask[0], (1u << 0) | (1u << 2) | (1u << 10));
    float logits[12];
    for (int i = 0; i < nv; i++) logits[i] = (float)i;
    osp_grammar_apply_mask(logits, nv, mask);
    for (int i = 0; i < nv; i++) assert_true(bit(mask, i) ? logits[i] == (float)i : logits[i] == -INFINITY);
    check_mask_brute(m, t, NULL);
    assert_int_equal(osp_grammar_matcher_accept_token(m, t, 0), OSP_OK);
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
    assert_int_equal(mask[0], (1u << 0) | (1u << 1) | (1u << 2) | (1u << 10) | (1u << 11));
    assert_int_equal(osp_grammar_matcher_accept_token(m, t, 8), OSP_ERR_INVALID_ARG); /* not complete yet */
    assert_int_equal(osp_grammar_matcher_accept_token(m, t, 11), OSP_OK);
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
    assert_int_equal(mask[0], 1u << 8); /* complete, nothing can follow: EOS only */
    assert_int_equal(osp_grammar_matcher_accept_token(m, t, 8), OSP_OK);
    assert_true(osp_grammar_matcher_is_terminated(m));
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
    assert_int_equal(mask[0], 0);
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);

    /* a character split over tokens: "\xc3" alone is allowed, as the start of é */
    g = parse_ok("root ::= [^a-z{}]*");
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
    assert_int_equal(mask[0], (1u << 5) | (1u << 6) | (1u << 8));
    assert_int_equal(osp_grammar_matcher_accept_token(m, t, 6), OSP_OK);
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
    assert_int_equal(mask[0], 0); /* no token is a lone continuation byte; EOS not mid-character */
    assert_false(osp_grammar_matcher_is_complete(m));
    check_mask_brute(m, t, NULL);
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
    osp_token_trie_free(t);
}

/* Forced continuations as drafts: bytes the grammar alone allows, cut by longest match into whole
 * tokens; nothing where the model chooses (alternatives, a class of several bytes, a complete input). */
static void test_forced_tokens(void **st) {
    (void)st;
    /* 0 "{", 1 "\"", 2 "{\"", 3 "na", 4 "name", 5 "\":", 6 " ", 7 "a", 8 "b", 9 "<eos>", 10 "m", 11 "e" */
    const char *toks[] = {"{", "\"", "{\"", "na", "name", "\":", " ", "a", "b", "<eos>", "m", "e"};
    const int32_t nv = 12;
    const uint8_t *bytes[12];
    size_t lens[12];
    bool excl[12] = {0};
    for (int i = 0; i < nv; i++) bytes[i] = (const uint8_t *)toks[i], lens[i] = strlen(toks[i]);
    const int32_t eog = 9;
    osp_token_trie *t;
    assert_int_equal(osp_token_trie_new(nv, bytes, lens, excl, &eog, 1, &t), OSP_OK);
    osp_grammar *g = parse_ok("root ::= \"{\\\"name\\\": \" [ab]+ \"}\" | \"{\\\"nam\" [x]");
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    int32_t d[16];
    /* forced: {"nam (the alternatives part after it): longest match {" + na, then "m" */
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 16), 3);
    assert_int_equal(d[0], 2), assert_int_equal(d[1], 3), assert_int_equal(d[2], 10);
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 2), 2); /* cap */
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"{\"name", 6), OSP_OK);
    /* forced: ": then the space; [ab]+ is the model's */
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 16), 2);
    assert_int_equal(d[0], 5), assert_int_equal(d[1], 6);
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"\": ", 3), OSP_OK);
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 16), 0); /* a class of two bytes */
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"ab}", 3), OSP_OK);
    assert_true(osp_grammar_matcher_is_complete(m));
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 16), 0); /* complete: EOS is the model's */
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
    /* optional whitespace drafted as left out only before a colon inside a run: "{" alone from the
     * start (the layout after it is the model's); from inside the key, name then ":, then stop (the
     * layout after the colon is the model's) */
    g = parse_ok("root ::= \"{\" ws \"\\\"nam\" [e] \"\\\"\" ws \":\" ws \"a\" \"}\"\nws ::= [ \\t\\n]*");
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 16), 1);
    assert_int_equal(d[0], 0);
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"{ \n", 3), OSP_OK);
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 16), 0); /* whitespace or the quote */
    assert_int_equal(osp_grammar_matcher_accept_bytes(m, (const uint8_t *)"\"", 1), OSP_OK);
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 16), 2); /* name, ": (not "a") */
    assert_int_equal(d[0], 4), assert_int_equal(d[1], 5);
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
    /* a forced byte no token starts with: no draft */
    g = parse_ok("root ::= \"}}\" [ab]");
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    assert_int_equal(osp_grammar_matcher_forced_tokens(m, t, d, 16), 0);
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
    osp_token_trie_free(t);
}

static osp_tokenizer *g_smol;

static int load_smol(void **st) {
    (void)st;
    const char *path = getenv("OSPREY_MODEL");
    osp_gguf *gg = NULL;
    if (!path || osp_gguf_open(path, &gg) != OSP_OK) return 0;
    if (osp_tokenizer_load(gg, &g_smol) != OSP_OK) g_smol = NULL;
    osp_gguf_close(gg);
    return 0;
}

static int free_smol(void **st) {
    (void)st;
    osp_tokenizer_free(g_smol);
    return 0;
}

/* Walks a JSON text token by token (as SmolLM2 tokenizes it) under the json_object grammar, checking
 * every mask against the brute force and that each next token is allowed. */
static void test_mask_smollm2(void **st) {
    (void)st;
    if (!g_smol) skip();
    osp_token_trie *t;
    assert_int_equal(osp_token_trie_from_tokenizer(g_smol, &t), OSP_OK);
    assert_int_equal(osp_token_trie_n_vocab(t), osp_tokenizer_n_vocab(g_smol));
    osp_grammar *g = parse_ok(osp_json_object_gbnf());
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, &m), OSP_OK);
    const char *doc = "{\"name\": \"Ana \xc3\xa9\", \"n\": [1, 2.5],\n \"ok\": true}";
    int32_t *ids;
    size_t n;
    assert_int_equal(osp_tokenizer_encode(g_smol, doc, strlen(doc), false, false, &ids, &n), OSP_OK);
    const int32_t nv = osp_token_trie_n_vocab(t);
    uint32_t *mask = calloc((size_t)(nv + 31) / 32, 4);
    for (size_t i = 0; i < n; i++) {
        int32_t allowed;
        if (i < 6 || i + 2 >= n) check_mask_brute(m, t, &allowed); /* brute force: a clone per token */
        if (i == 1) assert_true(allowed > 40000); /* after {": inside a key, nearly everything */
        assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
        if (!bit(mask, ids[i])) fail_msg("token %zu (id %d) of the document is masked", i, ids[i]);
        assert_int_equal(osp_grammar_matcher_accept_token(m, t, ids[i]), OSP_OK);
    }
    assert_true(osp_grammar_matcher_is_complete(m));
    assert_int_equal(osp_grammar_matcher_fill_mask(m, t, mask), OSP_OK);
    const int32_t eos = osp_tokenizer_eos(g_smol);
    assert_true(bit(mask, eos));
    for (int32_t id = 0; id < nv; id++)
        if (bit(mask, id)) assert_true(osp_token_trie_is_eog(t, id)); /* after the closing }: only EOG */
    free(ids);
    free(mask);
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
    osp_token_trie_free(t);
}

/* ---- JSON Schema ------------------------------------------------------------------------------- */

static osp_grammar *schema_grammar(const char *schema) {
    char *gbnf = NULL;
    const osp_status st = osp_json_schema_to_gbnf(schema, strlen(schema), &gbnf);
    if (st != OSP_OK) fail_msg("schema failed: %s\n%s", osp_last_error(), schema);
    osp_grammar *g = NULL;
    if (osp_grammar_parse(gbnf, strlen(gbnf), NULL, &g) != OSP_OK) fail_msg("schema grammar: %s\n%s", osp_last_error(), gbnf);
    free(gbnf);
    return g;
}

static void schema_expect(const char *schema, const char *const *yes, const char *const *no) {
    osp_grammar *g = schema_grammar(schema);
    for (; yes && *yes; yes++)
        if (run(g, *yes) != 1) fail_msg("schema %s should accept %s", schema, *yes);
    for (; no && *no; no++)
        if (run(g, *no) == 1) fail_msg("schema %s should not accept %s", schema, *no);
    osp_grammar_free(g);
}

static void schema_error(const char *schema, osp_status want, const char *msg_part) {
    char *gbnf = NULL;
    const osp_status st = osp_json_schema_to_gbnf(schema, strlen(schema), &gbnf);
    if (st != want) fail_msg("schema %s: got %s (%s)", schema, osp_status_str(st), osp_last_error());
    assert_null(gbnf);
    if (!strstr(osp_last_error(), msg_part)) fail_msg("error '%s' lacks '%s'", osp_last_error(), msg_part);
}

static void test_schema(void **st) {
    (void)st;
    schema_expect("{\"type\": \"integer\"}", L("0", "-12", "1234567890123456"), L("01", "1.5", "\"1\"", "12345678901234567"));
    schema_expect("{\"type\": \"number\"}", L("0", "-1.25", "3e10", "2.5E-3"), L(".5", "1.", "nan"));
    schema_expect("{\"type\": [\"string\", \"null\"]}", L("\"\"", "\"a\\\"b\"", "null"), L("1", "'a'"));
    schema_expect("{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 3}", L("\"ab\"", "\"a\xc3\xa9\"", "\"\\n\\tx\""),
                  L("\"a\"", "\"abcd\""));
    schema_expect("{\"enum\": [\"red\", 2, null, {\"k\": [1]}]}", L("\"red\"", "2", "null", "{\"k\":[1]}"), L("\"blue\"", "3"));
    schema_expect("{\"const\": \"x\\u00e9\\\"\"}", L("\"x\xc3\xa9\\\"\""), L("\"x\""));
    schema_expect("{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"boolean\"}, "
                  "\"c\": {\"type\": \"null\"}}, \"required\": [\"b\"]}",
                  L("{\"b\": true}", "{\"a\": 1, \"b\": false}", "{\"b\":true,\"c\":null}", "{ \"a\" : 1 , \"b\" : true , \"c\" : null }"),
                  L("{}", "{\"a\": 1}", "{\"b\": true, \"a\": 1}", "{\"b\": true,}", "{\"a\": 1, \"c\": null}", "{\"b\": 1}"));
    schema_expect("{\"properties\": {\"x\": {}, \"y\": {}}}", L("{}", "{\"x\": [1]}", "{\"y\": {\"q\": 1}}", "{\"x\": 1, \"y\": 2}"),
                  L("{\"y\": 1, \"x\": 2}", "{\"z\": 1}"));
    schema_expect("{\"type\": \"array\", \"items\": {\"type\": \"integer\"}, \"minItems\": 1, \"maxItems\": 3}",
                  L("[1]", "[1, 2, 3]", "[ 1 ,2 ]"), L("[]", "[1, 2, 3, 4]", "[\"a\"]"));
    schema_expect("{\"type\": \"array\", \"maxItems\": 2}", L("[]", "[1, \"a\"]"), L("[1, 2, 3]"));
    schema_expect("{\"type\": \"array\", \"maxItems\": 0}", L("[]"), L("[1]"));
    schema_expect("{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 1}]}", L("1", "\"a\""), L("\"ab\"", "true"));
    schema_expect("{\"oneOf\": [{\"const\": 1}, {\"const\": 2}], \"title\": \"t\"}", L("1", "2"), L("3"));
    schema_expect("{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}", L("{}", "{\"a\": 1, \"b\": 2}"),
                  L("{\"a\": \"x\"}"));
    schema_expect("{\"type\": \"object\", \"additionalProperties\": false}", L("{}"), L("{\"a\": 1}"));
    /* $ref, recursion included */
    schema_expect("{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"v\": {\"type\": \"integer\"}, \"next\": "
                  "{\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, {\"type\": \"null\"}]}}, \"required\": [\"v\", \"next\"]}}, "
                  "\"$ref\": \"#/$defs/node\"}",
                  L("{\"v\": 1, \"next\": null}", "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}"),
                  L("{\"v\": 1}", "{\"v\": 1, \"next\": {\"v\": 2}}"));
    schema_expect("{\"type\": \"object\", \"properties\": {\"kids\": {\"type\": \"array\", \"items\": {\"$ref\": \"#\"}}}}",
                  L("{}", "{\"kids\": [{}, {\"kids\": []}]}"), L("{\"kids\": [1]}"));
    schema_expect("{\"type\": \"string\", \"format\": \"date\"}", L("\"2024-02-29\""), L("\"2024-13-01\"", "\"24-01-01\""));
    schema_expect("{\"type\": \"string\", \"format\": \"date-time\"}", L("\"2024-02-29T12:30:00Z\"", "\"2024-02-29T12:30:00.5+01:00\""),
                  L("\"2024-02-29 12:30:00Z\""));
    schema_expect("{\"type\": \"string\", \"format\": \"uuid\"}", L("\"123e4567-e89b-12d3-a456-426614174000\""), L("\"123\""));
    schema_expect("true", L("1", "{\"a\": [null]}", "\"s\""), L("", "nul"));
    schema_expect("{}", L("[1, {}]"), NULL);
    schema_expect("{\"allOf\": [{\"type\": \"boolean\"}]}", L("true"), L("1"));
    schema_expect("{\"type\": \"string\", \"enum\": [\"a\", \"b\"]}", L("\"a\""), L("\"c\""));
    /* enum / const beside type: only the values of that type (the walkthrough's {"type": "integer",
     * "enum": ["a"]} produced "a") */
    schema_expect("{\"type\": \"integer\", \"enum\": [\"a\", 2, 3.0, 2.5]}", L("2", "3.0"), L("\"a\"", "2.5"));
    schema_expect("{\"type\": [\"string\", \"null\"], \"enum\": [\"a\", null, 1]}", L("\"a\"", "null"), L("1"));

    schema_error("{\"type\": \"integer\", \"minimum\": 0}", OSP_ERR_UNSUPPORTED, "json_schema: #: unsupported keyword 'minimum'");
    schema_error("{\"properties\": {\"age\": {\"type\": \"string\", \"pattern\": \"^a\"}}}", OSP_ERR_UNSUPPORTED,
                 "#/properties/age: unsupported keyword 'pattern'");
    schema_error("{\"type\": \"array\", \"uniqueItems\": true}", OSP_ERR_UNSUPPORTED, "'uniqueItems'");
    schema_error("{\"type\": \"string\", \"format\": \"email\"}", OSP_ERR_UNSUPPORTED, "format 'email'");
    schema_error("{\"$ref\": \"http://x/y.json\"}", OSP_ERR_UNSUPPORTED, "$ref");
    schema_error("{\"$ref\": \"#/$defs/nope\"}", OSP_ERR_INVALID_ARG, "points at nothing");
    schema_error("{\"allOf\": [{}, {}]}", OSP_ERR_UNSUPPORTED, "allOf");
    schema_error("{\"anyOf\": [{}], \"type\": \"object\"}", OSP_ERR_UNSUPPORTED, "'type' beside 'anyOf'");
    schema_error("{\"type\": \"object\", \"required\": [\"x\"]}", OSP_ERR_UNSUPPORTED, "required property 'x'");
    schema_error("{\"type\": \"frog\"}", OSP_ERR_UNSUPPORTED, "unknown type 'frog'");
    schema_error("false", OSP_ERR_UNSUPPORTED, "accepts nothing");
    schema_error("{\"type\": \"integer\", \"enum\": [\"a\"]}", OSP_ERR_UNSUPPORTED, "accepts nothing");
    schema_error("{\"type\": \"string\", \"const\": 1}", OSP_ERR_UNSUPPORTED, "accepts nothing");
    schema_error("{\"type\": ", OSP_ERR_INVALID_ARG, "not JSON");
    schema_error("[1]", OSP_ERR_INVALID_ARG, "must be an object or a boolean");
    schema_error("{\"a\": 1, \"a\": 2}", OSP_ERR_INVALID_ARG, "not JSON");
    /* a schema that is only a reference to itself compiles, and the grammar parser refuses it */
    char *gbnf = NULL;
    assert_int_equal(osp_json_schema_to_gbnf("{\"$ref\": \"#\"}", 13, &gbnf), OSP_OK);
    osp_grammar *g = NULL;
    assert_int_equal(osp_grammar_parse(gbnf, strlen(gbnf), NULL, &g), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "left-recursive"));
    free(gbnf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_multiline_file),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_json_grammar),
        cmocka_unit_test(test_clone),
        cmocka_unit_test(test_compaction),
        cmocka_unit_test(test_too_ambiguous),
        cmocka_unit_test(test_mask_small_vocab),
        cmocka_unit_test(test_forced_tokens),
        cmocka_unit_test(test_mask_smollm2),
        cmocka_unit_test(test_schema),
    };
    return cmocka_run_group_tests(tests, load_smol, free_smol);
}
