/* Loading a byte-level BPE or SentencePiece vocabulary from GGUF metadata, and the per-token queries.
 *
 * Follows llama.cpp's llama_vocab::impl::load for `tokenizer.ggml.model = gpt2` and `llama`: the
 * token list and types, merges (gpt2: rank = index, the first occurrence of a pair wins) or scores
 * (llama), special-token ids with their defaults (gpt2: BOS = EOS = 11; llama: UNK 0, BOS 1, EOS 2,
 * add_bos on; out-of-range ids disabled), the name-based fix-ups (tokens such as "<|im_end|>"
 * become CONTROL and end generation), the special token list matched first (longest first) and the
 * decoded bytes of every token (gpt2: GPT-2 chars back to bytes; llama: '▁' back to ' ', "<0xXX>"
 * to its byte). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

/* tokenizer.ggml.token_type values (gguf-py TokenType) */
enum { TT_UNDEFINED, TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE };

static bool in_list(const char *s, const char *const *list) {
    for (; *list; list++)
        if (strcmp(s, *list) == 0) return true;
    return false;
}

/* token texts llama.cpp treats as end of generation (special_eog_ids) */
static const char *const k_eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", "[e~[", NULL};
static const char *const k_eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
    "<end_of_utterance>", NULL};
static const char *const k_fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const k_fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>",
                                              "<reponame>", NULL};
static const char *const k_fim_sep_texts[] = {"<|file_sep|>", NULL};

/* ---------------------------------------------------------------------------------------------- */

void osp_tokenizer_free(osp_tokenizer *t) {
    if (!t) return;
    free(t->text_pool);
    free(t->text_off);
    free(t->attr);
    free(t->piece_pool);
    free(t->piece_off);
    free(t->eog);
    free(t->special);
    free(t->score);
    osp_strmap_free(&t->vocab);
    osp_strmap_free(&t->merges);
    osp_pretok_free(t->pre);
    free(t);
}

/* llama.cpp's llama_decode_text: GPT-2 chars back to bytes; a char outside the map is written as
 * "[UNK_BYTE_0x<hex>" + whole token text + "]". Appends to *buf (grown as needed). */
static bool decode_bpe_text(const char *text, size_t len, char **buf, size_t *n, size_t *cap) {
    uint32_t stack_cps[64];
    uint32_t *cps = len <= 64 ? stack_cps : malloc(len * sizeof *cps);
    if (!cps) return false;
    size_t ncp = osp_utf8_decode_lenient(text, len, cps);
    bool ok = true;
    for (size_t i = 0; i < ncp && ok; i++) {
        int b = osp_unicode_to_byte(cps[i]);
        size_t need = b >= 0 ? 1 : 12 + 8 + len + 1;
        if (*n + need > *cap) {
            size_t c = *cap ? *cap : 1 << 16;
            while (c < *n + need) c *= 2;
            char *p = realloc(*buf, c);
            if (!p) {
                ok = false;
                break;
            }
            *buf = p;
            *cap = c;
        }
        if (b >= 0) {
            (*buf)[(*n)++] = (char)b;
        } else {
            char u[4];
            int k = osp_utf8_encode(cps[i], u);
            memcpy(*buf + *n, "[UNK_BYTE_0x", 12);
            *n += 12;
            static const char hex[] = "0123456789abcdef";
            for (int j = 0; j < k; j++) {
                (*buf)[(*n)++] = hex[(unsigned char)u[j] >> 4];
                (*buf)[(*n)++] = hex[(unsigned char)u[j] & 15];
            }
            memcpy(*buf + *n, text, len);
            *n += len;
            (*buf)[(*n)++] = ']';
        }
    }
    if (cps != stack_cps) free(cps);
    return ok;
}

/* SentencePiece pieces: U+2581 back to a space (llama_unescape_whitespace). Appends to *buf. */
static bool unescape_spm_text(const char *text, size_t len, char **buf, size_t *n, size_t *cap) {
    if (*n + len > *cap) {
        size_t c = *cap ? *cap : 1 << 16;
        while (c < *n + len) c *= 2;
        char *p = realloc(*buf, c);
        if (!p) return false;
        *buf = p;
        *cap = c;
    }
    for (size_t i = 0; i < len; i++) {
        if (i + 2 < len && memcmp(text + i, "\xe2\x96\x81", 3) == 0) {
            (*buf)[(*n)++] = ' ';
            i += 2;
        } else {
            (*buf)[(*n)++] = text[i];
        }
    }
    return true;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* token_to_piece(special = true) for every token, cached as llama.cpp caches it */
static osp_status build_pieces(osp_tokenizer *t) {
    size_t n = 0, cap = 0;
    char *buf = NULL;
    t->piece_off = malloc((size_t)(t->n_vocab + 1) * sizeof *t->piece_off);
    if (!t->piece_off) goto oom;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = n;
        size_t len;
        const char *text = osp_tok_text(t, id, &len);
        uint32_t a = t->attr[id];
        const char *src = NULL;
        size_t src_len = 0;
        char byte;
        if (a & (OSP_TOKEN_ATTR_UNKNOWN | OSP_TOKEN_ATTR_CONTROL | OSP_TOKEN_ATTR_USER_DEFINED)) {
            src = text;
            src_len = len;
        } else if ((a & OSP_TOKEN_ATTR_NORMAL) && t->model == OSP_TOK_SPM) {
            if (!unescape_spm_text(text, len, &buf, &n, &cap)) goto oom;
        } else if (a & OSP_TOKEN_ATTR_NORMAL) {
            if (!decode_bpe_text(text, len, &buf, &n, &cap)) goto oom;
        } else if (a & OSP_TOKEN_ATTR_BYTE) { /* "<0xAB>" */
            int hi = len >= 5 ? hexval(text[3]) : -1, lo = len >= 5 ? hexval(text[4]) : -1;
            byte = (char)((hi < 0 ? 0 : hi) * 16 + (lo < 0 ? 0 : lo));
            src = &byte;
            src_len = 1;
        }
        if (src) {
            if (n + src_len > cap) {
                size_t c = cap ? cap : 1 << 16;
                while (c < n + src_len) c *= 2;
                char *p = realloc(buf, c);
                if (!p) goto oom;
                buf = p;
                cap = c;
            }
            memcpy(buf + n, src, src_len);
            n += src_len;
        }
        size_t plen = n - t->piece_off[id];
        if (plen > t->max_piece) t->max_piece = plen;
    }
    t->piece_off[t->n_vocab] = n;
    t->piece_pool = buf ? buf : malloc(1);
    if (!t->piece_pool) goto oom;
    return OSP_OK;
oom:
    free(buf);
    return osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
}

static int cmp_special(const void *a, const void *b, void *ctx) {
    const osp_tokenizer *t = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = t->text_off[x + 1] - t->text_off[x], ly = t->text_off[y + 1] - t->text_off[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : (x > y);
}

/* insertion-free merge sort is overkill here: the list is short; use a simple stable sort */
static void sort_special(osp_tokenizer *t) {
    for (int32_t i = 1; i < t->n_special; i++) {
        int32_t v = t->special[i];
        int32_t j = i - 1;
        while (j >= 0 && cmp_special(&t->special[j], &v, t) > 0) {
            t->special[j + 1] = t->special[j];
            j--;
        }
        t->special[j + 1] = v;
    }
}

static bool str_contains_ci(const char *hay, const char *needle) {
    size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t i = 0;
        while (i < n && hay[i] && tolower((unsigned char)hay[i]) == needle[i]) i++;
        if (i == n) return true;
    }
    return false;
}

static void set_attr_by_text(osp_tokenizer *t, const char *text, uint32_t bit, bool on) {
    int32_t id = osp_strmap_get(&t->vocab, text, strlen(text));
    if (id < 0) return;
    if (on) t->attr[id] |= bit;
    else t->attr[id] &= ~bit;
}

osp_status osp_tokenizer_load(const osp_gguf *g, osp_tokenizer **out) {
    osp_status st;
    osp_gguf_str s;
    const osp_gguf_value *tokens = NULL, *types = NULL, *merges = NULL;
    if (!g || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "tokenizer: NULL argument");
    *out = NULL;

    st = osp_gguf_get_str(g, "tokenizer.ggml.model", &s);
    if (st != OSP_OK) return st;
    osp_tok_model model;
    if (s.len == 4 && memcmp(s.data, "gpt2", 4) == 0) model = OSP_TOK_BPE;
    else if (s.len == 5 && memcmp(s.data, "llama", 5) == 0) model = OSP_TOK_SPM;
    else
        return osp_set_error(OSP_ERR_UNSUPPORTED,
                             "%s: tokenizer.ggml.model '%.*s' is not supported (gpt2 byte-level BPE and llama "
                             "SentencePiece are)",
                             osp_gguf_path(g), (int)(s.len > 64 ? 64 : s.len), s.data);

    osp_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
    t->model = model;

    /* pre-tokenizer (BPE only: llama.cpp ignores tokenizer.ggml.pre for SentencePiece) */
    osp_pretok_flags flags = {0};
    if (model == OSP_TOK_BPE && osp_gguf_get_str(g, "tokenizer.ggml.pre", &s) == OSP_OK) {
        size_t n = s.len < sizeof t->pre_name - 1 ? s.len : sizeof t->pre_name - 1;
        memcpy(t->pre_name, s.data, n);
        t->pre_name[n] = '\0';
    }
    osp_clear_error();
    if (!t->pre_name[0]) strcpy(t->pre_name, "default");
    if (model == OSP_TOK_BPE) {
        st = osp_pretok_create(t->pre_name, &t->pre, &flags);
        if (st != OSP_OK) goto fail;
    } else {
        flags.add_bos = true;
    }

    /* tokens and types */
    st = osp_gguf_get_arr(g, "tokenizer.ggml.tokens", OSP_GGUF_TYPE_STRING, &tokens);
    if (st != OSP_OK) goto fail;
    if (tokens->v.arr.n == 0 || tokens->v.arr.n > INT32_MAX) {
        st = osp_set_error(OSP_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %llu entries", osp_gguf_path(g),
                           (unsigned long long)tokens->v.arr.n);
        goto fail;
    }
    t->n_vocab = (int32_t)tokens->v.arr.n;
    if (osp_gguf_find(g, "tokenizer.ggml.token_type")) {
        st = osp_gguf_get_arr(g, "tokenizer.ggml.token_type", OSP_GGUF_TYPE_INT32, &types);
        if (st != OSP_OK) goto fail;
        if (types->v.arr.n < (uint64_t)t->n_vocab) {
            st = osp_set_error(OSP_ERR_FORMAT, "%s: tokenizer.ggml.token_type has %llu < %d entries",
                               osp_gguf_path(g), (unsigned long long)types->v.arr.n, t->n_vocab);
            goto fail;
        }
    }
    if (model == OSP_TOK_BPE) {
        st = osp_gguf_get_arr(g, "tokenizer.ggml.merges", OSP_GGUF_TYPE_STRING, &merges);
        if (st != OSP_OK) goto fail;
    }
    /* scores: float32 or int32, at least one per token; absent means all 0 */
    if (model == OSP_TOK_SPM) {
        t->score = calloc((size_t)(uint32_t)t->n_vocab, sizeof *t->score);
        if (!t->score) goto oom;
        if (osp_gguf_find(g, "tokenizer.ggml.scores")) {
            const osp_gguf_value *sc;
            st = osp_gguf_get_arr(g, "tokenizer.ggml.scores", -1, &sc);
            if (st != OSP_OK) goto fail;
            osp_gguf_type et = sc->v.arr.elem_type;
            if ((et != OSP_GGUF_TYPE_FLOAT32 && et != OSP_GGUF_TYPE_INT32) || sc->v.arr.n < (uint64_t)t->n_vocab) {
                st = osp_set_error(OSP_ERR_FORMAT, "%s: tokenizer.ggml.scores is not float32/int32 with %d entries",
                                   osp_gguf_path(g), t->n_vocab);
                goto fail;
            }
            for (int32_t i = 0; i < t->n_vocab; i++)
                t->score[i] = et == OSP_GGUF_TYPE_FLOAT32 ? (float)osp_gguf_arr_f64(sc, (uint64_t)i)
                                                          : (float)osp_gguf_arr_i64(sc, (uint64_t)i);
        }
    }

    size_t pool = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) pool += tokens->v.arr.strs[i].len + 24;
    t->text_pool = malloc(pool);
    size_t nv = (size_t)(uint32_t)t->n_vocab;
    t->text_off = malloc((nv + 1) * sizeof *t->text_off);
    t->attr = calloc(nv, sizeof *t->attr);
    t->eog = calloc(nv, 1);
    if (!t->text_pool || !t->text_off || !t->attr || !t->eog) goto oom;
    size_t off = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        const osp_gguf_str *w = &tokens->v.arr.strs[i];
        t->text_off[i] = off;
        if (w->len == 0) off += (size_t)sprintf(t->text_pool + off, "[EMPTY_%d]", i);
        else {
            memcpy(t->text_pool + off, w->data, w->len);
            off += w->len;
        }
        t->text_pool[off++] = '\0';
        t->text_off[i + 1] = off;
        size_t len;
        const char *txt = osp_tok_text(t, i, &len);
        if (!osp_strmap_put(&t->vocab, txt, len, i, true)) goto oom;
        uint32_t a = OSP_TOKEN_ATTR_NORMAL;
        if (types) {
            switch (osp_gguf_arr_i64(types, (uint64_t)i)) {
            case TT_UNKNOWN: a = OSP_TOKEN_ATTR_UNKNOWN; break;
            case TT_UNUSED: a = OSP_TOKEN_ATTR_UNUSED; break;
            case TT_NORMAL: a = OSP_TOKEN_ATTR_NORMAL; break;
            case TT_CONTROL: a = OSP_TOKEN_ATTR_CONTROL; break;
            case TT_USER_DEFINED: a = OSP_TOKEN_ATTR_USER_DEFINED; break;
            case TT_BYTE: a = OSP_TOKEN_ATTR_BYTE; break;
            default: a = OSP_TOKEN_ATTR_UNDEFINED; break;
            }
        }
        t->attr[i] = a;
    }

    /* merges: "left right", split at the first space after the first byte */
    {
        char *key = NULL;
        size_t key_cap = 0;
        for (uint64_t i = 0; merges && i < merges->v.arr.n && i < INT32_MAX; i++) {
            const osp_gguf_str *m = &merges->v.arr.strs[i];
            const char *sp = m->len > 1 ? memchr(m->data + 1, ' ', m->len - 1) : NULL;
            uint32_t ll = sp ? (uint32_t)(sp - m->data) : 0;
            size_t rl = sp ? m->len - ll - 1 : 0;
            size_t klen = 4 + ll + rl;
            if (klen > key_cap) {
                key_cap = klen * 2;
                char *k = realloc(key, key_cap);
                if (!k) {
                    free(key);
                    goto oom;
                }
                key = k;
            }
            memcpy(key, &ll, 4);
            if (ll) memcpy(key + 4, m->data, ll);
            if (rl) memcpy(key + 4 + ll, sp + 1, rl);
            if (!osp_strmap_put(&t->merges, key, klen, (int32_t)i, false)) {
                free(key);
                goto oom;
            }
        }
        free(key);
    }

    /* special ids: gpt2 / llama defaults, then metadata (an out-of-range value keeps the default) */
    int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1, sep = -1,
            mask = -1;
    t->bos = flags.no_bos ? -1 : model == OSP_TOK_SPM ? 1 : 11;
    t->eos = model == OSP_TOK_SPM ? 2 : 11;
    t->eot = t->eom = t->unk = t->pad = -1;
    if (model == OSP_TOK_SPM) t->unk = 0;
    {
        struct {
            const char *key;
            int32_t *id;
        } keys[] = {
            {"tokenizer.ggml.bos_token_id", &t->bos},        {"tokenizer.ggml.eos_token_id", &t->eos},
            {"tokenizer.ggml.eot_token_id", &t->eot},        {"tokenizer.ggml.eom_token_id", &t->eom},
            {"tokenizer.ggml.unknown_token_id", &t->unk},    {"tokenizer.ggml.seperator_token_id", &sep},
            {"tokenizer.ggml.padding_token_id", &t->pad},    {"tokenizer.ggml.mask_token_id", &mask},
            {"tokenizer.ggml.fim_pre_token_id", &fim_pre},   {"tokenizer.ggml.fim_suf_token_id", &fim_suf},
            {"tokenizer.ggml.fim_mid_token_id", &fim_mid},   {"tokenizer.ggml.fim_pad_token_id", &fim_pad},
            {"tokenizer.ggml.fim_rep_token_id", &fim_rep},   {"tokenizer.ggml.fim_sep_token_id", &fim_sep},
            {"tokenizer.ggml.prefix_token_id", &fim_pre},    {"tokenizer.ggml.suffix_token_id", &fim_suf},
            {"tokenizer.ggml.middle_token_id", &fim_mid},
        };
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            int32_t *id = keys[k].id;
            if (*id >= t->n_vocab) *id = -1;
            uint32_t v;
            if (osp_gguf_get_u32(g, keys[k].key, &v) == OSP_OK && v < (uint32_t)t->n_vocab) *id = (int32_t)v;
        }
        osp_clear_error();
    }
    t->add_bos = flags.add_bos;
    t->add_eos = false;
    t->ignore_merges = flags.ignore_merges;
    t->add_space_prefix = model == OSP_TOK_SPM;
    {
        bool b;
        if (osp_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b) == OSP_OK) t->add_space_prefix = b;
        if (osp_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b) == OSP_OK) t->add_bos = b;
        if (osp_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b) == OSP_OK) t->add_eos = b;
        osp_clear_error();
    }

    /* name-based detection; only the id a text maps to counts (duplicates: the last) */
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *txt = osp_tok_text(t, id, &len);
        if (osp_strmap_get(&t->vocab, txt, len) != id) continue;
        uint32_t *a = &t->attr[id];
        if (t->eot < 0 && in_list(txt, k_eot_texts)) {
            t->eot = id;
            *a |= OSP_TOKEN_ATTR_CONTROL;
        }
        if (t->eom < 0 && strcmp(txt, "<|eom_id|>") == 0) {
            t->eom = id;
            *a |= OSP_TOKEN_ATTR_CONTROL;
        }
        if (fim_pad < 0 && in_list(txt, k_fim_pad_texts)) {
            fim_pad = id;
            *a |= OSP_TOKEN_ATTR_CONTROL;
        }
        if (fim_rep < 0 && in_list(txt, k_fim_rep_texts)) {
            fim_rep = id;
            *a |= OSP_TOKEN_ATTR_CONTROL;
        }
        if (fim_sep < 0 && in_list(txt, k_fim_sep_texts)) {
            fim_sep = id;
            *a |= OSP_TOKEN_ATTR_CONTROL;
        }
    }
    /* FIM prefix/suffix/middle only gain CONTROL; detect them the same way */
    {
        static const char *const pre_t[] = {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
                                            "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
        static const char *const suf_t[] = {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>", "<SUF>",
                                            "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
        static const char *const mid_t[] = {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
                                            "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
                                            "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
        for (int32_t id = 0; id < t->n_vocab; id++) {
            size_t len;
            const char *txt = osp_tok_text(t, id, &len);
            if (osp_strmap_get(&t->vocab, txt, len) != id) continue;
            if (fim_pre < 0 && in_list(txt, pre_t)) { fim_pre = id; t->attr[id] |= OSP_TOKEN_ATTR_CONTROL; }
            if (fim_suf < 0 && in_list(txt, suf_t)) { fim_suf = id; t->attr[id] |= OSP_TOKEN_ATTR_CONTROL; }
            if (fim_mid < 0 && in_list(txt, mid_t)) { fim_mid = id; t->attr[id] |= OSP_TOKEN_ATTR_CONTROL; }
        }
    }
    /* CONTROL tokens named "unused" are unused */
    for (int32_t id = 0; id < t->n_vocab; id++)
        if ((t->attr[id] & OSP_TOKEN_ATTR_CONTROL) && strstr(t->text_pool + t->text_off[id], "unused"))
            t->attr[id] |= OSP_TOKEN_ATTR_UNUSED;

    /* end-of-generation set */
    if (fim_pad >= 0) t->eog[fim_pad] = 1;
    if (fim_rep >= 0) t->eog[fim_rep] = 1;
    if (fim_sep >= 0) t->eog[fim_sep] = 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        size_t len;
        const char *txt = osp_tok_text(t, id, &len);
        if (osp_strmap_get(&t->vocab, txt, len) != id) continue;
        if (in_list(txt, k_eog_texts)) {
            t->eog[id] = 1;
            t->attr[id] |= OSP_TOKEN_ATTR_CONTROL;
        }
        static const char *const always_render[] = {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};
        if (in_list(txt, always_render)) t->attr[id] = OSP_TOKEN_ATTR_USER_DEFINED;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    if (t->eom >= 0) t->eog[t->eom] = 1;
    {
        /* o200k_harmony / solar-open: "<|end|>" is not EOG when "<|return|>"+"<|call|>" (or
         * "<|calls|>"+"<|flush|>") are; "</s>" is a normal token next to gemma4/plamo markers */
        bool has_return = false, has_call = false, has_flush = false, has_marker = false;
        int32_t end_id = -1, s_id = -1;
        for (int32_t id = 0; id < t->n_vocab; id++) {
            if (!t->eog[id]) continue;
            const char *txt = t->text_pool + t->text_off[id];
            if (!strcmp(txt, "<|return|>")) has_return = true;
            else if (!strcmp(txt, "<|call|>") || !strcmp(txt, "<|calls|>")) has_call = true;
            else if (!strcmp(txt, "<|flush|>")) has_flush = true;
            else if (!strcmp(txt, "<|end|>")) end_id = id;
            if (!strcmp(txt, "<|tool_response>") || !strcmp(txt, "<|plamo:eos|>")) has_marker = true;
            else if (!strcmp(txt, "</s>")) s_id = id;
        }
        if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
            t->eog[end_id] = 0;
            t->attr[end_id] = OSP_TOKEN_ATTR_USER_DEFINED;
        }
        if (has_marker && s_id >= 0) {
            t->eog[s_id] = 0;
            t->attr[s_id] = OSP_TOKEN_ATTR_NORMAL;
        }
    }

    /* tokens matched whole before BPE, longest first */
    t->special = malloc((size_t)t->n_vocab * sizeof *t->special);
    if (!t->special) goto oom;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (t->attr[id] & (OSP_TOKEN_ATTR_CONTROL | OSP_TOKEN_ATTR_USER_DEFINED | OSP_TOKEN_ATTR_UNKNOWN))
            t->special[t->n_special++] = id;
    sort_special(t);

    st = build_pieces(t);
    if (st != OSP_OK) goto fail;

    /* SPM byte fallback: "<0xXX>" (upper-case hex), else the one-byte piece (llama byte_to_token) */
    for (int b = 0; b < 256; b++) {
        static const char hex[] = "0123456789ABCDEF";
        char name[6] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};
        char one = (char)b;
        t->byte_tok[b] = osp_strmap_get(&t->vocab, name, 6);
        if (t->byte_tok[b] < 0) t->byte_tok[b] = osp_strmap_get(&t->vocab, &one, 1);
    }

    /* strip attributes llama.cpp sets by model name (after the piece cache, as it does) */
    {
        char name[256] = "", arch[128] = "";
        if (osp_gguf_get_str(g, "general.name", &s) == OSP_OK)
            snprintf(name, sizeof name, "%.*s", (int)(s.len > 255 ? 255 : s.len), s.data);
        if (osp_gguf_get_str(g, "general.architecture", &s) == OSP_OK)
            snprintf(arch, sizeof arch, "%.*s", (int)(s.len > 127 ? 127 : s.len), s.data);
        osp_clear_error();
        if (strstr(t->pre_name, "jina-v2-de") || strstr(t->pre_name, "jina-v2-es") ||
            strstr(t->pre_name, "jina-v2-code") || strstr(arch, "nomic-bert-moe") || strstr(arch, "jina-bert-v3")) {
            set_attr_by_text(t, "<mask>", OSP_TOKEN_ATTR_LSTRIP, true);
        } else if (str_contains_ci(name, "phi-3") || str_contains_ci(name, "phi3")) {
            for (int32_t k = 0; k < t->n_special; k++) t->attr[t->special[k]] |= OSP_TOKEN_ATTR_RSTRIP;
            set_attr_by_text(t, "</s>", OSP_TOKEN_ATTR_RSTRIP, true);
            set_attr_by_text(t, "<unk>", OSP_TOKEN_ATTR_RSTRIP, false);
            set_attr_by_text(t, "<s>", OSP_TOKEN_ATTR_RSTRIP, false);
            set_attr_by_text(t, "<|endoftext|>", OSP_TOKEN_ATTR_RSTRIP, false);
        } else if (str_contains_ci(name, "modern-bert")) {
            set_attr_by_text(t, "[MASK]", OSP_TOKEN_ATTR_LSTRIP, true);
        }
    }
    (void)sep;
    (void)mask;
    *out = t;
    return OSP_OK;
oom:
    st = osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
fail:
    osp_tokenizer_free(t);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* queries                                                                                        */

int32_t osp_tokenizer_n_vocab(const osp_tokenizer *t) { return t->n_vocab; }
int32_t osp_tokenizer_bos(const osp_tokenizer *t) { return t->bos; }
int32_t osp_tokenizer_eos(const osp_tokenizer *t) { return t->eos; }
int32_t osp_tokenizer_eot(const osp_tokenizer *t) { return t->eot; }
bool osp_tokenizer_add_bos(const osp_tokenizer *t) { return t->add_bos; }
bool osp_tokenizer_add_eos(const osp_tokenizer *t) { return t->add_eos; }
const char *osp_tokenizer_pre_name(const osp_tokenizer *t) { return t->pre_name; }
bool osp_tokenizer_add_space_prefix(const osp_tokenizer *t) { return t->add_space_prefix; }
const char *osp_tokenizer_model_name(const osp_tokenizer *t) { return t->model == OSP_TOK_SPM ? "llama" : "gpt2"; }
size_t osp_tokenizer_max_token_bytes(const osp_tokenizer *t) { return t->max_piece; }

uint32_t osp_tokenizer_attr(const osp_tokenizer *t, int32_t id) {
    return (id >= 0 && id < t->n_vocab) ? t->attr[id] : 0;
}

const char *osp_tokenizer_token_text(const osp_tokenizer *t, int32_t id) {
    return (id >= 0 && id < t->n_vocab) ? t->text_pool + t->text_off[id] : NULL;
}

int32_t osp_tokenizer_token_id(const osp_tokenizer *t, const char *text, size_t len) {
    return (t && text) ? osp_strmap_get(&t->vocab, text, len) : -1;
}

bool osp_tokenizer_is_eog(const osp_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

osp_status osp_tokenizer_token_bytes(const osp_tokenizer *t, int32_t id, char *buf, size_t cap, size_t *n) {
    if (!t || id < 0 || id >= t->n_vocab)
        return osp_set_error(OSP_ERR_INVALID_ARG, "tokenizer: token id %d out of range", (int)id);
    size_t len = (size_t)(t->piece_off[id + 1] - t->piece_off[id]);
    *n = len;
    if (len > cap) return osp_set_error(OSP_ERR_INVALID_ARG, "tokenizer: token %d needs %zu bytes, buffer has %zu", (int)id, len, cap);
    if (len) memcpy(buf, t->piece_pool + t->piece_off[id], len);
    return OSP_OK;
}
