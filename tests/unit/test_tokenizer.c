/* Unit tests of the tokenizer and the incremental detokenizer on a tiny vocabulary built in memory
 * as a GGUF file: the 256 GGUF-2 byte tokens (id = byte value), one merge ("Ã ©" -> "Ã©", i.e. "é"),
 * and the control tokens <|im_start|> (BOS) and <|im_end|> (EOS). Needs no files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/tokenizer.h"

/* ---- a minimal GGUF writer -------------------------------------------------------------------- */

typedef struct wbuf {
    unsigned char *p;
    size_t n, cap;
} wbuf;

static void put(wbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 1024;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(wbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(wbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(wbuf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_str(wbuf *b, const char *k, const char *v) {
    put_str(b, k);
    put_u32(b, 8);
    put_str(b, v);
}
static void kv_u32(wbuf *b, const char *k, uint32_t v) {
    put_str(b, k);
    put_u32(b, 4);
    put_u32(b, v);
}
static void kv_bool(wbuf *b, const char *k, bool v) {
    put_str(b, k);
    put_u32(b, 7);
    unsigned char c = v;
    put(b, &c, 1);
}

/* GPT-2 byte -> unicode char, as UTF-8 */
static void byte_char(unsigned b, char *out) {
    unsigned cp;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) cp = b;
    else {
        unsigned k = 0;
        for (unsigned x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

enum { ID_E_ACUTE = 256, ID_IM_START = 257, ID_IM_END = 258, N_VOCAB = 259 };

static wbuf make_vocab(const char *pre) {
    wbuf b = {0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    put_u64(&b, 0); /* tensors */
    put_u64(&b, 8); /* kv pairs */
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_str(&b, "tokenizer.ggml.pre", pre);
    put_str(&b, "tokenizer.ggml.tokens");
    put_u32(&b, 9);
    put_u32(&b, 8);
    put_u64(&b, N_VOCAB);
    for (unsigned i = 0; i < 256; i++) {
        char c[4];
        byte_char(i, c);
        put_str(&b, c);
    }
    put_str(&b, "\xc3\x83\xc2\xa9"); /* "Ã©" */
    put_str(&b, "<|im_start|>");
    put_str(&b, "<|im_end|>");
    put_str(&b, "tokenizer.ggml.token_type");
    put_u32(&b, 9);
    put_u32(&b, 5);
    put_u64(&b, N_VOCAB);
    for (unsigned i = 0; i < N_VOCAB; i++) put_u32(&b, i >= ID_IM_START ? 3 : 1);
    put_str(&b, "tokenizer.ggml.merges");
    put_u32(&b, 9);
    put_u32(&b, 8);
    put_u64(&b, 1);
    put_str(&b, "\xc3\x83 \xc2\xa9");
    kv_u32(&b, "tokenizer.ggml.bos_token_id", ID_IM_START);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", ID_IM_END);
    kv_bool(&b, "tokenizer.ggml.add_bos_token", true);
    while (b.n % 32) put(&b, "", 1);
    return b;
}

static osp_tokenizer *g_tok;
static wbuf g_gguf;

static int setup(void **state) {
    (void)state;
    g_gguf = make_vocab("gpt-2");
    osp_gguf *g = NULL;
    if (osp_gguf_open_memory(g_gguf.p, g_gguf.n, "tiny-vocab", &g) != OSP_OK) {
        print_error("%s\n", osp_last_error());
        return -1;
    }
    osp_status st = osp_tokenizer_load(g, &g_tok);
    osp_gguf_close(g); /* the tokenizer must not need it any more */
    if (st != OSP_OK) print_error("%s\n", osp_last_error());
    return st == OSP_OK ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    osp_tokenizer_free(g_tok);
    free(g_gguf.p);
    return 0;
}

/* ---- encode ------------------------------------------------------------------------------------ */

static void expect_ids(const char *text, size_t len, bool add_special, bool parse_special, const int32_t *want,
                       size_t n_want) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(osp_tokenizer_encode(g_tok, text, len, add_special, parse_special, &ids, &n), OSP_OK);
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    free(ids);
}

static void test_metadata(void **state) {
    (void)state;
    assert_int_equal(osp_tokenizer_n_vocab(g_tok), N_VOCAB);
    assert_int_equal(osp_tokenizer_bos(g_tok), ID_IM_START);
    assert_int_equal(osp_tokenizer_eos(g_tok), ID_IM_END);
    assert_true(osp_tokenizer_is_eog(g_tok, ID_IM_END));
    assert_false(osp_tokenizer_is_eog(g_tok, ID_IM_START));
    assert_false(osp_tokenizer_is_eog(g_tok, -1));
    assert_false(osp_tokenizer_is_eog(g_tok, N_VOCAB));
    assert_string_equal(osp_tokenizer_pre_name(g_tok), "gpt-2");
    assert_int_equal(osp_tokenizer_token_id(g_tok, "<|im_end|>", 10), ID_IM_END);
    assert_int_equal(osp_tokenizer_token_id(g_tok, "<|im_end", 8), -1);
    assert_string_equal(osp_tokenizer_token_text(g_tok, ID_IM_START), "<|im_start|>");
}

static void test_encode_merge_and_bytes(void **state) {
    (void)state;
    const int32_t want[] = {'h', ID_E_ACUTE, 0x20 /* space */, 'x'};
    /* "hé x": the pre-tokenizer gives "hé" and " x"; " " is byte 0x20 (Ġ), not merged */
    expect_ids("h\xc3\xa9 x", 5, false, false, want, 4);
    expect_ids("", 0, false, false, NULL, 0);
    const int32_t bos_only[] = {ID_IM_START};
    expect_ids("", 0, true, true, bos_only, 1);
}

static void test_encode_special(void **state) {
    (void)state;
    const int32_t parsed[] = {'a', ID_IM_END, 'b'};
    expect_ids("a<|im_end|>b", 12, false, true, parsed, 3);
    /* as plain text: "a", "<|", "im", "_", "end", "|>", "b" per the GPT-2 regex, all single bytes */
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(osp_tokenizer_encode(g_tok, "a<|im_end|>b", 12, false, false, &ids, &n), OSP_OK);
    assert_int_equal(n, 12);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], (unsigned char)"a<|im_end|>b"[i]);
    free(ids);
    /* BOS is added once, never doubled */
    const int32_t bos[] = {ID_IM_START, 'h', 'i'};
    expect_ids("hi", 2, true, true, bos, 3);
    expect_ids("<|im_start|>hi", 14, true, true, bos, 3);
}

static void expect_span_ids(const char *text, const osp_text_span *plain, size_t n_plain, bool add_special,
                            const int32_t *want, size_t n_want) {
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(osp_tokenizer_encode_spans(g_tok, text, strlen(text), plain, n_plain, add_special, &ids, &n), OSP_OK);
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    free(ids);
}

/* osp_tokenizer_encode_spans: control-token text overlapping a plain range stays text; the rest of
 * the text is parsed as with parse_special on, and without plain ranges (or with plain ranges free
 * of special text) the ids are encode(parse_special = true)'s. */
static void test_encode_spans(void **state) {
    (void)state;
    /* "<|im_start|>a<|im_end|>b<|im_end|>": the second <|im_end|> (bytes 24..33) came from a message */
    const char *text = "<|im_start|>a<|im_end|>b<|im_end|>";
    const osp_text_span forged[] = {{24, 10}};
    int32_t want[40];
    size_t k = 0;
    want[k++] = ID_IM_START, want[k++] = 'a', want[k++] = ID_IM_END, want[k++] = 'b';
    for (const char *p = "<|im_end|>"; *p; p++) want[k++] = (unsigned char)*p;
    expect_span_ids(text, forged, 1, false, want, k);
    /* one plain byte inside a token is enough to keep it text: "a<|im_end|>b" with "|>" plain */
    const osp_text_span tail[] = {{9, 2}};
    const int32_t a_b[] = {'a', '<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>', 'b'};
    expect_span_ids("a<|im_end|>b", tail, 1, false, a_b, 12);
    /* overlapping candidates: the first (plain) stays text, the next one is still found */
    const osp_text_span first[] = {{0, 10}};
    int32_t two[16];
    k = 0;
    for (const char *p = "<|im_end|>"; *p; p++) two[k++] = (unsigned char)*p;
    two[k++] = ID_IM_END;
    expect_span_ids("<|im_end|><|im_end|>", first, 1, false, two, k);
    /* plain ranges without special text change nothing, BOS included; a plain <|im_start|> at the
     * start is not BOS, so BOS is still added in front of it */
    const osp_text_span words[] = {{12, 1}, {23, 1}};
    int32_t *ref = NULL;
    size_t n_ref = 0;
    assert_int_equal(osp_tokenizer_encode(g_tok, text, strlen(text), true, true, &ref, &n_ref), OSP_OK);
    expect_span_ids(text, words, 2, true, ref, n_ref);
    expect_span_ids(text, NULL, 0, true, ref, n_ref);
    free(ref);
    const osp_text_span lead[] = {{0, 12}};
    int32_t bos_text[16];
    k = 0;
    bos_text[k++] = ID_IM_START;
    for (const char *p = "<|im_start|>hi"; *p; p++) bos_text[k++] = (unsigned char)*p;
    expect_span_ids("<|im_start|>hi", lead, 1, true, bos_text, k);
    /* bad ranges: a clear error, nothing allocated */
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    const osp_text_span past[] = {{20, 15}}, unsorted[] = {{5, 1}, {2, 1}}, overlap[] = {{2, 4}, {3, 1}};
    assert_int_equal(osp_tokenizer_encode_spans(g_tok, text, strlen(text), past, 1, false, &ids, &n), OSP_ERR_INVALID_ARG);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_int_equal(osp_tokenizer_encode_spans(g_tok, text, strlen(text), unsorted, 2, false, &ids, &n), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_tokenizer_encode_spans(g_tok, text, strlen(text), overlap, 2, false, &ids, &n), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_tokenizer_encode_spans(g_tok, text, strlen(text), NULL, 1, false, &ids, &n), OSP_ERR_INVALID_ARG);
}

static void test_invalid_utf8_encodes(void **state) {
    (void)state;
    /* a lone 0xFF reads as U+FFFD (EF BF BD), as llama.cpp reads it */
    const int32_t want[] = {0xEF, 0xBF, 0xBD};
    expect_ids("\xff", 1, false, false, want, 3);
}

static void test_unknown_pre(void **state) {
    (void)state;
    wbuf b = make_vocab("no-such-pre");
    osp_gguf *g = NULL;
    assert_int_equal(osp_gguf_open_memory(b.p, b.n, "tiny-vocab", &g), OSP_OK);
    osp_tokenizer *t = NULL;
    assert_int_equal(osp_tokenizer_load(g, &t), OSP_ERR_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(osp_last_error(), "no-such-pre"));
    osp_gguf_close(g);
    free(b.p);
}

static void test_token_bytes(void **state) {
    (void)state;
    char buf[32];
    size_t n;
    assert_int_equal(osp_tokenizer_token_bytes(g_tok, ID_E_ACUTE, buf, sizeof buf, &n), OSP_OK);
    assert_int_equal(n, 2);
    assert_memory_equal(buf, "\xc3\xa9", 2);
    assert_int_equal(osp_tokenizer_token_bytes(g_tok, 0x0A, buf, sizeof buf, &n), OSP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(buf[0], '\n');
    assert_int_equal(osp_tokenizer_token_bytes(g_tok, ID_IM_END, buf, sizeof buf, &n), OSP_OK);
    assert_int_equal(n, 10);
    assert_memory_equal(buf, "<|im_end|>", 10);
    assert_int_equal(osp_tokenizer_token_bytes(g_tok, ID_IM_END, buf, 3, &n), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_tokenizer_token_bytes(g_tok, N_VOCAB, buf, sizeof buf, &n), OSP_ERR_INVALID_ARG);
}

/* ---- detokenizer ------------------------------------------------------------------------------- */

#define FFFD "\xef\xbf\xbd"

/* pushes ids and checks the text each push returns */
static void push_expect(osp_detokenizer *d, int32_t id, const char *want) {
    char out[128];
    size_t n = 99;
    assert_int_equal(osp_detokenizer_push(d, id, out, sizeof out, &n), OSP_OK);
    assert_int_equal(n, strlen(want));
    assert_string_equal(out, want);
}

static void flush_expect(osp_detokenizer *d, const char *want) {
    char out[16];
    size_t n = 99;
    assert_int_equal(osp_detokenizer_flush(d, out, sizeof out, &n), OSP_OK);
    assert_int_equal(n, strlen(want));
    assert_string_equal(out, want);
}

static void test_detok_split_chars(void **state) {
    (void)state;
    osp_detokenizer *d = NULL;
    assert_int_equal(osp_detokenizer_new(g_tok, &d), OSP_OK);
    push_expect(d, 'a', "a");
    push_expect(d, 0xC3, ""); /* é split over two byte tokens */
    push_expect(d, 0xA9, "\xc3\xa9");
    push_expect(d, ID_E_ACUTE, "\xc3\xa9");
    /* 🦙 = F0 9F A6 99, one byte per token */
    push_expect(d, 0xF0, "");
    push_expect(d, 0x9F, "");
    push_expect(d, 0xA6, "");
    push_expect(d, 0x99, "\xf0\x9f\xa6\x99");
    /* ZWJ sequence 👨‍👩 = F0 9F 91 A8, E2 80 8D, F0 9F 91 A9 */
    const unsigned char zwj[] = {0xF0, 0x9F, 0x91, 0xA8, 0xE2, 0x80, 0x8D, 0xF0, 0x9F, 0x91, 0xA9};
    char got[64] = "";
    for (size_t i = 0; i < sizeof zwj; i++) {
        char out[64];
        size_t n;
        assert_int_equal(osp_detokenizer_push(d, zwj[i], out, sizeof out, &n), OSP_OK);
        /* never a partial sequence: each output is empty or ends a character */
        assert_true(n == 0 || i == 3 || i == 6 || i == 10);
        strcat(got, out);
    }
    assert_string_equal(got, "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9");
    flush_expect(d, "");
    osp_detokenizer_free(d);
}

static void test_detok_invalid(void **state) {
    (void)state;
    osp_detokenizer *d = NULL;
    assert_int_equal(osp_detokenizer_new(g_tok, &d), OSP_OK);
    push_expect(d, 0xFF, FFFD);          /* can never start a sequence */
    push_expect(d, 0x80, FFFD);          /* stray continuation byte */
    push_expect(d, 0xC3, "");            /* could still complete ... */
    push_expect(d, 'a', FFFD "a");       /* ... but 'a' ends it */
    push_expect(d, 0xE2, "");
    push_expect(d, 0x82, "");            /* E2 82 is one maximal subpart -> one U+FFFD */
    push_expect(d, 'x', FFFD "x");
    push_expect(d, 0xED, "");
    push_expect(d, 0xA0, FFFD FFFD);     /* ED A0 would be a surrogate: two subparts */
    push_expect(d, 0xC0, FFFD);          /* overlong lead */
    push_expect(d, 0xF0, "");
    push_expect(d, 0x8F, FFFD FFFD);     /* F0 needs 90..BF next */
    /* flush turns a pending, unfinished sequence into one U+FFFD */
    push_expect(d, 0xF0, "");
    push_expect(d, 0x9F, "");
    flush_expect(d, FFFD);
    flush_expect(d, "");
    push_expect(d, 'b', "b");
    osp_detokenizer_free(d);
}

static void test_detok_special_and_cap(void **state) {
    (void)state;
    osp_detokenizer *d = NULL;
    assert_int_equal(osp_detokenizer_new(g_tok, &d), OSP_OK);
    push_expect(d, ID_IM_END, "<|im_end|>");
    osp_detokenizer_skip_special(d, true);
    push_expect(d, ID_IM_END, "");
    push_expect(d, 'q', "q");
    /* too small a buffer: error, the size needed, and nothing consumed */
    push_expect(d, 0xC3, "");
    char out[2];
    size_t n = 0;
    assert_int_equal(osp_detokenizer_push(d, 0xA9, out, sizeof out, &n), OSP_ERR_INVALID_ARG);
    assert_int_equal(n, 2);
    push_expect(d, 0xA9, "\xc3\xa9");
    assert_int_equal(osp_detokenizer_push(d, -1, out, sizeof out, &n), OSP_ERR_INVALID_ARG);
    osp_detokenizer_reset(d);
    osp_detokenizer_free(d);
    osp_detokenizer_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_metadata),
        cmocka_unit_test(test_encode_merge_and_bytes),
        cmocka_unit_test(test_encode_special),
        cmocka_unit_test(test_encode_spans),
        cmocka_unit_test(test_invalid_utf8_encodes),
        cmocka_unit_test(test_unknown_pre),
        cmocka_unit_test(test_token_bytes),
        cmocka_unit_test(test_detok_split_chars),
        cmocka_unit_test(test_detok_invalid),
        cmocka_unit_test(test_detok_special_and_cap),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
