/* Unit tests of the SentencePiece tokenizer (tokenizer.ggml.model = llama) on a tiny vocabulary
 * written with the GGUF writer: <unk> <s> </s>, the 256 <0xXX> byte tokens, a few pieces whose
 * scores decide the merge order, and a user-defined token. Needs no files besides a temporary one.
 * The expected ids follow llama.cpp's llm_tokenizer_spm_session by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "osprey/gguf.h"
#include "osprey/tokenizer.h"

#define ESC "\xe2\x96\x81" /* U+2581, SentencePiece's space */

enum { ID_UNK, ID_BOS, ID_EOS, ID_BYTE0, ID_PIECES = ID_BYTE0 + 256 };

/* pieces after the byte tokens: text, score (higher merges first) */
static const struct {
    const char *text;
    float score;
} k_pieces[] = {
    {ESC, -10}, {"h", -10},  {"e", -10}, {"l", -10}, {"o", -10},         {ESC "h", -5}, {"he", -3},
    {ESC "he", -2}, {"ll", -4}, {"llo", -1}, {ESC "hello", -6}, {"x", -10}, {"y", -10}, {"z", -10},
    {"xy", -7}, {"yz", -7}, {"<user>", 0},
};
enum { N_PIECES = sizeof k_pieces / sizeof k_pieces[0], N_VOCAB = ID_PIECES + N_PIECES };

static int32_t piece(const char *text) {
    for (int i = 0; i < N_PIECES; i++)
        if (strcmp(k_pieces[i].text, text) == 0) return ID_PIECES + i;
    fail_msg("no piece %s", text);
    return -1;
}

/* Writes the vocabulary (int_scores: scores as an int32 array; space_prefix < 0: key absent). */
static osp_tokenizer *make_tokenizer(bool int_scores, int space_prefix) {
    static char names[256][8];
    const char *toks[N_VOCAB];
    float scores[N_VOCAB];
    int32_t iscores[N_VOCAB], types[N_VOCAB];
    toks[ID_UNK] = "<unk>";
    toks[ID_BOS] = "<s>";
    toks[ID_EOS] = "</s>";
    types[ID_UNK] = 2; /* UNKNOWN */
    types[ID_BOS] = types[ID_EOS] = 3; /* CONTROL */
    for (int b = 0; b < 256; b++) {
        snprintf(names[b], sizeof names[b], "<0x%02X>", b);
        toks[ID_BYTE0 + b] = names[b];
        types[ID_BYTE0 + b] = 6; /* BYTE */
    }
    for (int i = 0; i < N_PIECES; i++) {
        toks[ID_PIECES + i] = k_pieces[i].text;
        types[ID_PIECES + i] = strcmp(k_pieces[i].text, "<user>") == 0 ? 4 : 1; /* USER_DEFINED, NORMAL */
    }
    for (int i = 0; i < N_VOCAB; i++) {
        scores[i] = i >= ID_PIECES ? k_pieces[i - ID_PIECES].score : 0.0f;
        iscores[i] = (int32_t)scores[i];
    }
    osp_gguf_writer *w;
    assert_int_equal(osp_gguf_writer_create(&w), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama"), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", toks, N_VOCAB), OSP_OK);
    if (int_scores) assert_int_equal(osp_gguf_writer_add_arr_i32(w, "tokenizer.ggml.scores", iscores, N_VOCAB), OSP_OK);
    else assert_int_equal(osp_gguf_writer_add_arr_f32(w, "tokenizer.ggml.scores", scores, N_VOCAB), OSP_OK);
    assert_int_equal(osp_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, N_VOCAB), OSP_OK);
    if (space_prefix >= 0)
        assert_int_equal(osp_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", space_prefix), OSP_OK);
    char path[] = "/tmp/osprey_spm_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(osp_gguf_writer_write(w, path), OSP_OK);
    osp_gguf_writer_free(w);
    osp_gguf *g;
    assert_int_equal(osp_gguf_open(path, &g), OSP_OK);
    osp_tokenizer *t = NULL;
    assert_int_equal(osp_tokenizer_load(g, &t), OSP_OK);
    osp_gguf_close(g);
    unlink(path);
    return t;
}

static void expect(const osp_tokenizer *t, const char *text, bool add_special, bool parse_special, const int32_t *want,
                   size_t n_want) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(osp_tokenizer_encode(t, text, strlen(text), add_special, parse_special, &ids, &n), OSP_OK);
    if (n != n_want || (n && memcmp(ids, want, n * sizeof *ids) != 0)) {
        print_error("for '%s':", text);
        for (size_t i = 0; i < n; i++) print_error(" %d", ids[i]);
        print_error("\n");
        fail();
    }
    free(ids);
}
#define EXPECT(t, text, as, ps, ...)                                                   \
    do {                                                                               \
        const int32_t w_[] = {__VA_ARGS__};                                            \
        expect(t, text, as, ps, w_, sizeof w_ / sizeof w_[0]);                         \
    } while (0)

static void test_metadata(void **state) {
    (void)state;
    osp_tokenizer *t = make_tokenizer(false, -1);
    assert_string_equal(osp_tokenizer_model_name(t), "llama");
    assert_int_equal(osp_tokenizer_bos(t), ID_BOS);
    assert_int_equal(osp_tokenizer_eos(t), ID_EOS);
    assert_true(osp_tokenizer_add_bos(t));
    assert_false(osp_tokenizer_add_eos(t));
    assert_true(osp_tokenizer_add_space_prefix(t));
    assert_true(osp_tokenizer_is_eog(t, ID_EOS));
    assert_int_equal(osp_tokenizer_attr(t, ID_BYTE0 + 0x41), OSP_TOKEN_ATTR_BYTE);
    osp_tokenizer_free(t);
}

static void test_merge_order(void **state) {
    (void)state;
    osp_tokenizer *t = make_tokenizer(false, -1);
    /* he (-3) before ll (-4); then ▁he (-2); ll; llo (-1); ▁he+llo = ▁hello (-6) */
    EXPECT(t, "hello", false, false, piece(ESC "hello"));
    EXPECT(t, "hello", true, false, ID_BOS, piece(ESC "hello"));
    /* equal scores: the leftmost pair wins ("xy" before "yz"); "▁x" is no piece */
    EXPECT(t, "xyz", false, false, piece(ESC), piece("xy"), piece("z"));
    /* spaces are escaped; two spaces give "▁" "▁hello" */
    EXPECT(t, " hello", false, false, piece(ESC), piece(ESC "hello"));
    EXPECT(t, "", true, false, ID_BOS);
    int32_t *ids = (int32_t *)1;
    size_t n = 1;
    assert_int_equal(osp_tokenizer_encode(t, "", 0, false, false, &ids, &n), OSP_OK);
    assert_int_equal(n, 0);
    /* int32 scores give the same order */
    osp_tokenizer *ti = make_tokenizer(true, -1);
    EXPECT(ti, "hello", false, false, piece(ESC "hello"));
    EXPECT(ti, "xyz", false, false, piece(ESC), piece("xy"), piece("z"));
    osp_tokenizer_free(ti);
    osp_tokenizer_free(t);
}

static void test_byte_fallback(void **state) {
    (void)state;
    osp_tokenizer *t = make_tokenizer(false, -1);
    /* "q" and "é" are no pieces: their bytes */
    EXPECT(t, "q\xc3\xa9", false, false, piece(ESC), ID_BYTE0 + 'q', ID_BYTE0 + 0xC3, ID_BYTE0 + 0xA9);
    /* an invalid lead byte takes as many bytes as its high nibble says (0xF? = 4), like llama.cpp */
    EXPECT(t, "\xffhel", false, false, piece(ESC), ID_BYTE0 + 0xFF, ID_BYTE0 + 'h', ID_BYTE0 + 'e', ID_BYTE0 + 'l');
    osp_tokenizer_free(t);
}

static void test_space_prefix_and_specials(void **state) {
    (void)state;
    osp_tokenizer *t = make_tokenizer(false, -1);
    /* each raw fragment after a special token gets the prefix too */
    EXPECT(t, "<user>hello", false, false, piece("<user>"), piece(ESC "hello"));
    EXPECT(t, "hello</s>hello", false, true, piece(ESC "hello"), ID_EOS, piece(ESC "hello"));
    /* control tokens are plain text without parse_special: "<", "/", "s", ">" are bytes */
    EXPECT(t, "</s>", false, false, piece(ESC), ID_BYTE0 + '<', ID_BYTE0 + '/', ID_BYTE0 + 's', ID_BYTE0 + '>');
    osp_tokenizer_free(t);
    /* add_space_prefix = false: no leading '▁' ("he" then "llo") */
    t = make_tokenizer(false, 0);
    assert_false(osp_tokenizer_add_space_prefix(t));
    EXPECT(t, "hello", false, false, piece("he"), piece("llo"));
    EXPECT(t, "a hello", false, false, ID_BYTE0 + 'a', piece(ESC "hello"));
    osp_tokenizer_free(t);
}

static void detok_expect(const osp_tokenizer *t, bool lstrip, bool skip, const int32_t *ids, size_t n, const char *want) {
    osp_detokenizer *d;
    assert_int_equal(osp_detokenizer_new(t, &d), OSP_OK);
    osp_detokenizer_lstrip_first(d, lstrip);
    osp_detokenizer_skip_special(d, skip);
    char out[256], buf[64];
    size_t o = 0, k;
    for (int pass = 0; pass < 2; pass++) { /* the second pass checks that flush starts a new sequence */
        o = 0;
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(osp_detokenizer_push(d, ids[i], buf, sizeof buf, &k), OSP_OK);
            memcpy(out + o, buf, k);
            o += k;
        }
        assert_int_equal(osp_detokenizer_flush(d, buf, sizeof buf, &k), OSP_OK);
        memcpy(out + o, buf, k);
        o += k;
        out[o] = '\0';
        assert_string_equal(out, want);
    }
    osp_detokenizer_free(d);
}

static void test_decode(void **state) {
    (void)state;
    osp_tokenizer *t = make_tokenizer(false, -1);
    char buf[32];
    size_t n;
    assert_int_equal(osp_tokenizer_token_bytes(t, piece(ESC "he"), buf, sizeof buf, &n), OSP_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(buf, " he", 3);
    assert_int_equal(osp_tokenizer_token_bytes(t, ID_BYTE0 + 0x41, buf, sizeof buf, &n), OSP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(buf[0], 'A');
    const int32_t hello[] = {piece(ESC "hello"), piece(ESC "hello")};
    detok_expect(t, false, false, hello, 2, " hello hello");
    detok_expect(t, true, false, hello, 2, "hello hello");
    /* BOS first: llama_detokenize keeps the space after it, rendered or not */
    const int32_t bos_hello[] = {ID_BOS, piece(ESC "hello")};
    detok_expect(t, true, false, bos_hello, 2, "<s> hello");
    detok_expect(t, true, true, bos_hello, 2, " hello");
    /* one space at most; byte tokens of one character across pushes */
    const int32_t sp[] = {piece(ESC), piece(ESC "hello"), ID_BYTE0 + 0xC3, ID_BYTE0 + 0xA9};
    detok_expect(t, true, false, sp, 4, " hello\xc3\xa9");
    osp_tokenizer_free(t);
    /* without a space prefix nothing is stripped */
    t = make_tokenizer(false, 0);
    detok_expect(t, true, false, hello, 2, " hello hello");
    osp_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_merge_order),
        cmocka_unit_test(test_byte_fallback),
        cmocka_unit_test(test_space_prefix_and_specials),
        cmocka_unit_test(test_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
