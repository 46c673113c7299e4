/* Golden tests of the tokenizer against llama.cpp.
 *
 * 1. tests/golden/fixtures/tokenizer/<vocab>.txt (written by make_tokenizer_fixtures.py from
 *    llama.cpp's llama-tokenize): ids must match exactly for every string, in every mode recorded;
 *    for valid UTF-8 inputs, the concatenated token bytes must give the input back (SentencePiece:
 *    less the leading space it adds, and not for inputs holding U+2581 or where text follows a
 *    special token, which gets a space prefix too).
 *    "<vocab>@<pre>.txt" runs <vocab> with tokenizer.ggml.pre replaced by <pre> (built in memory),
 *    which reaches pre-tokenizers whose own vocabularies are not in ../shared.
 * 2. tests/golden/fixtures/tokenizer/detok/<vocab>.txt (SentencePiece vocabularies): the text
 *    llama_detokenize gives for the ids of each string, rendering special tokens or not; osprey's
 *    token bytes and its detokenizer (lstrip_first on) must give the same bytes.
 * 3. llama.cpp's own test files ../shared/testdata/vocab/ggml-vocab-<vocab>.gguf.inp/.out, run as
 *    its test-tokenizer-0 runs them (add_special = false, parse_special = false).
 *
 * The vocabularies live outside the repository (the models under models/: smollm2 the default model,
 * gemma3 the opt-in Gemma 3 270M, whose fixtures make_gemma3_fixture.sh --tokenizer writes; the
 * others in ../shared);
 * a vocabulary that is absent is skipped with a message, and the whole test exits 77 (skipped) when
 * none is there. */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/tokenizer.h"

typedef struct vocab_case {
    char name[64];
    char pre[64]; /* "" or the pre-tokenizer that replaces the file's (fixture "<vocab>@<pre>") */
    char gguf[1200];
    char fixture[1400];
} vocab_case;

static vocab_case g_vocabs[64];
static int g_n_vocabs;
static char g_shared[1024];

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

static bool file_exists(const char *p) {
    FILE *f = fopen(p, "rb");
    if (f) fclose(f);
    return f != NULL;
}

/* Size of the GGUF value of type `t` at p (bounds are trusted: vocabulary files from ../shared). */
static size_t gguf_value_size(const unsigned char *p, uint32_t t) {
    static const size_t sizes[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    uint64_t n;
    if (t == 8) {
        memcpy(&n, p, 8);
        return 8 + (size_t)n;
    }
    if (t == 9) {
        uint32_t et;
        memcpy(&et, p, 4);
        memcpy(&n, p + 4, 8);
        size_t off = 12;
        if (et != 8 && et != 9) return off + sizes[et] * (size_t)n;
        for (uint64_t i = 0; i < n; i++) off += gguf_value_size(p + off, et);
        return off;
    }
    return sizes[t];
}

/* A copy of the tensor-less vocabulary file `data` with tokenizer.ggml.pre set to `pre` (the same
 * bytes make_tokenizer_fixtures.py gives llama.cpp). Returns malloc'd, length in *out_len. */
static unsigned char *gguf_with_pre(const unsigned char *data, size_t len, const char *pre, size_t *out_len) {
    unsigned char *out = malloc(len + strlen(pre) + 128);
    uint64_t n_kv, n_t, kept = 0;
    memcpy(&n_t, data + 8, 8);
    memcpy(&n_kv, data + 16, 8);
    if (n_t != 0) {
        free(out);
        return NULL;
    }
    memcpy(out, data, 8);
    memset(out + 8, 0, 16);
    size_t pos = 24, o = 24;
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t kl;
        uint32_t t;
        memcpy(&kl, data + pos, 8);
        memcpy(&t, data + pos + 8 + kl, 4);
        size_t end = pos + 12 + (size_t)kl + gguf_value_size(data + pos + 12 + kl, t);
        if (!(kl == 18 && memcmp(data + pos + 8, "tokenizer.ggml.pre", 18) == 0)) {
            memcpy(out + o, data + pos, end - pos);
            o += end - pos;
            kept++;
        }
        pos = end;
    }
    uint64_t kl = 18, pl = strlen(pre);
    uint32_t t = 8;
    memcpy(out + o, &kl, 8);
    memcpy(out + o + 8, "tokenizer.ggml.pre", 18);
    memcpy(out + o + 26, &t, 4);
    memcpy(out + o + 30, &pl, 8);
    memcpy(out + o + 38, pre, pl);
    o += 38 + pl;
    kept++;
    memcpy(out + 16, &kept, 8);
    while (o % 32) out[o++] = 0;
    *out_len = o;
    return out;
}

/* Loads the vocabulary at `path`, with its pre-tokenizer replaced by `pre` unless pre is NULL. */
static osp_tokenizer *load(const char *path, const char *pre) {
    osp_gguf *g = NULL;
    osp_tokenizer *t = NULL;
    unsigned char *patched = NULL;
    if (pre) {
        size_t len, plen;
        char *raw = read_file(path, &len);
        if (raw) patched = gguf_with_pre((const unsigned char *)raw, len, pre, &plen);
        free(raw);
        if (!patched || osp_gguf_open_memory(patched, plen, path, &g) != OSP_OK) {
            print_error("open %s with pre %s: %s\n", path, pre, osp_last_error());
            free(patched);
            return NULL;
        }
    } else if (osp_gguf_open(path, &g) != OSP_OK) {
        print_error("open %s: %s\n", path, osp_last_error());
        return NULL;
    }
    if (osp_tokenizer_load(g, &t) != OSP_OK) print_error("load %s: %s\n", path, osp_last_error());
    osp_gguf_close(g);
    free(patched); /* the tokenizer copied what it needs */
    return t;
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

/* True when every ASCII byte of in[] has a token of its own. Not all vocabularies cover all 256
 * bytes (Falcon has no token for 0x0B), and llama.cpp drops a byte it cannot find, so such
 * inputs cannot round-trip. */
static bool bytes_covered(const osp_tokenizer *t, const char *in, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if ((unsigned char)in[i] >= 0x80) continue;
        int32_t *ids = NULL;
        size_t k = 0;
        if (osp_tokenizer_encode(t, in + i, 1, false, false, &ids, &k) != OSP_OK) return false;
        free(ids);
        if (k == 0) return false;
    }
    return true;
}

/* Decodes with osp_tokenizer_token_bytes and compares with the input. With a SentencePiece space
 * prefix the first token's leading space is dropped, as llama_detokenize does; the same text must
 * then also come out of a detokenizer with lstrip_first on. */
static bool roundtrip(const osp_tokenizer *t, const int32_t *ids, size_t n, const char *in, size_t in_len) {
    size_t cap = in_len * 4 + 64, o = 0;
    char *buf = malloc(cap);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        size_t k;
        if (osp_tokenizer_token_bytes(t, ids[i], buf + o, cap - o, &k) != OSP_OK) {
            ok = false;
        } else if (i == 0 && k > 0 && buf[0] == ' ' && osp_tokenizer_add_space_prefix(t)) {
            memmove(buf, buf + 1, k - 1);
            o += k - 1;
        } else {
            o += k;
        }
    }
    ok = ok && o == in_len && memcmp(buf, in, in_len) == 0;
    if (ok && osp_tokenizer_add_space_prefix(t)) {
        osp_detokenizer *d;
        size_t dcap = 3 * (osp_tokenizer_max_token_bytes(t) + 4) + 1, k;
        char *piece = malloc(dcap);
        assert_int_equal(osp_detokenizer_new(t, &d), OSP_OK);
        osp_detokenizer_lstrip_first(d, true);
        o = 0;
        for (size_t i = 0; i < n && ok; i++) {
            ok = osp_detokenizer_push(d, ids[i], piece, dcap, &k) == OSP_OK && o + k <= cap;
            if (ok) {
                memcpy(buf + o, piece, k);
                o += k;
            }
        }
        ok = ok && osp_detokenizer_flush(d, piece, dcap, &k) == OSP_OK && k == 0;
        ok = ok && o == in_len && memcmp(buf, in, in_len) == 0;
        osp_detokenizer_free(d);
        free(piece);
    }
    free(buf);
    return ok;
}

/* SentencePiece cannot give back an input with U+2581 in it (it is its escaped space and decodes
 * as ' '), and puts a space in front of text that follows a special token. */
static bool spm_lossy(const osp_tokenizer *t, const char *in, size_t n_in, const int32_t *ids, size_t n) {
    if (strcmp(osp_tokenizer_model_name(t), "llama") != 0) return false;
    if (memmem(in, n_in, "\xe2\x96\x81", 3)) return true;
    if (!osp_tokenizer_add_space_prefix(t)) return false;
    const uint32_t special = OSP_TOKEN_ATTR_CONTROL | OSP_TOKEN_ATTR_USER_DEFINED | OSP_TOKEN_ATTR_UNKNOWN;
    for (size_t i = 0; i + 1 < n; i++)
        if ((osp_tokenizer_attr(t, ids[i]) & special) && !(osp_tokenizer_attr(t, ids[i + 1]) & special)) return true;
    return false;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* One fixture file: "<P><A> <hex|-> <ids|->" per line. */
static void run_fixture(const vocab_case *vc, int *n_cases, int *n_fail, int *n_rt, int *n_rt_fail) {
    osp_tokenizer *t = load(vc->gguf, vc->pre[0] ? vc->pre : NULL);
    assert_non_null(t);
    size_t len;
    char *text = read_file(vc->fixture, &len);
    assert_non_null(text);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#' || !line[0]) continue;
        static char mode[8], hex[65536], idtxt[65536];
        if (sscanf(line, "%7s %65535s %65535[^\n]", mode, hex, idtxt) != 3) fail_msg("bad fixture line: %s", line);
        bool ps = mode[0] == '1', as = mode[1] == '1';
        size_t n_in = 0;
        static char in[32768];
        if (strcmp(hex, "-") != 0)
            for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) in[n_in++] = (char)(hexval(hex[i]) * 16 + hexval(hex[i + 1]));
        static int32_t want[8192];
        size_t n_want = 0;
        if (strcmp(idtxt, "-") != 0)
            for (char *p = idtxt; *p;) {
                char *end;
                long v = strtol(p, &end, 10);
                if (end == p) break;
                want[n_want++] = (int32_t)v;
                p = end;
            }
        int32_t *ids = NULL;
        size_t n_ids = 0;
        assert_int_equal(osp_tokenizer_encode(t, in, n_in, as, ps, &ids, &n_ids), OSP_OK);
        (*n_cases)++;
        /* documented deviation: llama.cpp doubles BOS (EOS) when the text starts (ends) with it and
         * add_special is on, with a warning; osprey adds none then */
        int32_t bos = osp_tokenizer_bos(t), eos = osp_tokenizer_eos(t);
        if (as && n_want >= 2 && n_ids == n_want - 1) {
            if (want[0] == bos && want[1] == bos && osp_tokenizer_add_bos(t) &&
                memcmp(ids, want + 1, n_ids * sizeof *ids) == 0) {
                n_want--;
                memmove(want, want + 1, n_want * sizeof *want);
            } else if (want[n_want - 1] == eos && want[n_want - 2] == eos && osp_tokenizer_add_eos(t) &&
                       memcmp(ids, want, n_ids * sizeof *ids) == 0) {
                n_want--;
            }
        }
        if (n_ids != n_want || (n_ids && memcmp(ids, want, n_ids * sizeof *ids) != 0)) {
            (*n_fail)++;
            print_error("  %s: mismatch for mode %s input %s\n", vc->name, mode, hex);
            print_ids("llama.cpp", want, n_want);
            print_ids("osprey   ", ids, n_ids);
        } else if (ps && !as && valid_utf8((const unsigned char *)in, n_in) && bytes_covered(t, in, n_in) &&
                   !spm_lossy(t, in, n_in, ids, n_ids)) {
            (*n_rt)++;
            if (!roundtrip(t, ids, n_ids, in, n_in)) {
                (*n_rt_fail)++;
                print_error("  %s: decode(encode(s)) != s for %s\n", vc->name, hex);
            }
        }
        free(ids);
    }
    free(text);
    osp_tokenizer_free(t);
}

static void test_fixtures(void **state) {
    (void)state;
    int total_fail = 0, total_rt_fail = 0;
    for (int v = 0; v < g_n_vocabs; v++) {
        int n = 0, f = 0, rt = 0, rtf = 0;
        run_fixture(&g_vocabs[v], &n, &f, &rt, &rtf);
        print_message("  %-22s %4d/%d match llama.cpp, %d/%d round-trip\n", g_vocabs[v].name, n - f, n, rt - rtf, rt);
        total_fail += f;
        total_rt_fail += rtf;
    }
    assert_int_equal(total_fail, 0);
    assert_int_equal(total_rt_fail, 0);
}

static size_t parse_hex(const char *hex, char *out) {
    size_t n = 0;
    if (strcmp(hex, "-") != 0)
        for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) out[n++] = (char)(hexval(hex[i]) * 16 + hexval(hex[i + 1]));
    return n;
}

/* The text of ids[0..n) as llama_detokenize makes it, from osprey's token bytes (specials skipped
 * when `skip`), and again through an osprey detokenizer; both must equal want[0..n_want). The
 * detokenizer writes well-formed UTF-8 only, so it is compared only when `want` is well-formed. */
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

/* detok/<vocab>.txt: "<A> <hex input> <ids> <hex text, specials rendered> <hex text, skipped>" */
static void test_detok_fixtures(void **state) {
    (void)state;
    int total_fail = 0, ran = 0;
    char dir[1024];
    const char *root = getenv("OSPREY_ROOT");
    snprintf(dir, sizeof dir, "%s/tests/golden/fixtures/tokenizer/detok", root ? root : ".");
    for (int v = 0; v < g_n_vocabs; v++) {
        if (g_vocabs[v].pre[0]) continue;
        char path[1200];
        if (snprintf(path, sizeof path, "%s/%s.txt", dir, g_vocabs[v].name) >= (int)sizeof path) continue;
        size_t len;
        char *text = read_file(path, &len);
        if (!text) continue;
        osp_tokenizer *t = load(g_vocabs[v].gguf, NULL);
        assert_non_null(t);
        int n = 0, f = 0;
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            if (line[0] == '#' || !line[0]) continue;
            static char add[8], hex[65536], idtxt[65536], h1[65536], h2[65536];
            if (sscanf(line, "%7s %65535s %65535s %65535s %65535s", add, hex, idtxt, h1, h2) != 5)
                fail_msg("bad detok fixture line: %s", line);
            static char in[32768], t1[32768], t2[32768];
            size_t n_in = parse_hex(hex, in), n1 = parse_hex(h1, t1), n2 = parse_hex(h2, t2);
            static int32_t want[8192];
            size_t n_want = 0;
            if (strcmp(idtxt, "-") != 0)
                for (char *p = idtxt; *p;) {
                    char *end;
                    long id = strtol(p, &end, 10);
                    if (end == p) break;
                    want[n_want++] = (int32_t)id;
                    p = *end == ',' ? end + 1 : end;
                }
            /* the ids are llama.cpp's own; encode must agree (a doubled BOS is the known deviation) */
            int32_t *ids = NULL;
            size_t n_ids = 0;
            assert_int_equal(osp_tokenizer_encode(t, in, n_in, add[0] == '1', true, &ids, &n_ids), OSP_OK);
            size_t skip = (n_want == n_ids + 1 && n_want >= 2 && want[0] == want[1] && want[0] == osp_tokenizer_bos(t));
            bool ok = n_ids + skip == n_want && (n_ids == 0 || memcmp(ids, want + skip, n_ids * sizeof *ids) == 0);
            free(ids);
            ok = ok && detok_matches(t, want, n_want, false, t1, n1) && detok_matches(t, want, n_want, true, t2, n2);
            n++;
            if (!ok) {
                f++;
                print_error("  %s: detok mismatch for add_special %s input %s\n", g_vocabs[v].name, add, hex);
            }
        }
        print_message("  %-16s %4d/%d llama_detokenize texts match\n", g_vocabs[v].name, n - f, n);
        total_fail += f;
        ran++;
        free(text);
        osp_tokenizer_free(t);
    }
    if (!ran) print_message("  no detok fixtures for the vocabularies present\n");
    assert_int_equal(total_fail, 0);
}

/* splits off the next '\n'-terminated line (kept even when empty); NULL at the end */
static char *next_line(char **cur) {
    if (!*cur || !**cur) return NULL;
    char *line = *cur, *nl = strchr(line, '\n');
    if (nl) {
        *nl = '\0';
        *cur = nl + 1;
    } else {
        *cur = line + strlen(line);
    }
    return line;
}

/* llama.cpp's .inp/.out pairs (test-tokenizer-0: add_special = false, parse_special = false) */
static void test_llama_vocab_files(void **state) {
    (void)state;
    int total_fail = 0, ran = 0;
    for (int v = 0; v < g_n_vocabs; v++) {
        if (g_vocabs[v].pre[0]) continue;
        char inp[1300], outp[1300];
        if (snprintf(inp, sizeof inp, "%s.inp", g_vocabs[v].gguf) >= (int)sizeof inp ||
            snprintf(outp, sizeof outp, "%s.out", g_vocabs[v].gguf) >= (int)sizeof outp)
            continue;
        size_t li, lo;
        char *si = read_file(inp, &li), *so = read_file(outp, &lo);
        if (!si || !so) {
            free(si);
            free(so);
            continue;
        }
        osp_tokenizer *t = load(g_vocabs[v].gguf, NULL);
        assert_non_null(t);
        const char *sep = "\n__ggml_vocab_test__\n";
        size_t seplen = strlen(sep);
        const char *p = si, *end = si + li;
        char *ocur = so; /* output lines, empty ones included (an empty input has no ids) */
        char *oline = next_line(&ocur);
        int n = 0, f = 0;
        while (p < end) {
            const char *next = memmem(p, (size_t)(end - p), sep, seplen);
            size_t n_in = next ? (size_t)(next - p) : (size_t)(end - p);
            if (!oline) fail_msg("%s: fewer output lines than inputs", inp);
            static int32_t want[8192];
            size_t n_want = 0;
            for (char *q = oline; *q;) {
                char *e;
                long val = strtol(q, &e, 10);
                if (e == q) break;
                want[n_want++] = (int32_t)val;
                q = e;
            }
            int32_t *ids = NULL;
            size_t n_ids = 0;
            assert_int_equal(osp_tokenizer_encode(t, p, n_in, false, false, &ids, &n_ids), OSP_OK);
            n++;
            if (n_ids != n_want || (n_ids && memcmp(ids, want, n_ids * sizeof *ids) != 0)) {
                f++;
                print_error("  %s.inp case %d (%zu bytes) mismatch\n", g_vocabs[v].name, n, n_in);
                print_ids("llama.cpp", want, n_want);
                print_ids("osprey   ", ids, n_ids);
            }
            free(ids);
            oline = next_line(&ocur);
            if (!next) break;
            p = next + seplen;
        }
        print_message("  %-16s %4d/%d of llama.cpp's .inp/.out cases match\n", g_vocabs[v].name, n - f, n);
        total_fail += f;
        ran++;
        free(si);
        free(so);
        osp_tokenizer_free(t);
    }
    if (!ran) print_message("  no .inp/.out pairs found for the vocabularies present\n");
    assert_int_equal(total_fail, 0);
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    const char *model = getenv("OSPREY_MODEL"), *gemma3 = getenv("OSPREY_GEMMA3_MODEL");
    const char *shared = getenv("OSPREY_SHARED");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tests/golden/fixtures/tokenizer", root ? root : ".");
    snprintf(g_shared, sizeof g_shared, "%s", shared ? shared : "../shared");
    DIR *d = opendir(dir);
    if (!d) {
        printf("skip: no fixtures in %s\n", dir);
        return 77;
    }
    struct dirent *e;
    while ((e = readdir(d)) && g_n_vocabs < 64) {
        size_t n = strlen(e->d_name);
        if (n < 5 || strcmp(e->d_name + n - 4, ".txt") != 0 || n - 4 >= 64) continue;
        vocab_case *vc = &g_vocabs[g_n_vocabs];
        memcpy(vc->name, e->d_name, n - 4);
        vc->name[n - 4] = '\0';
        snprintf(vc->fixture, sizeof vc->fixture, "%s/%s", dir, e->d_name);
        char name[64];
        memcpy(name, vc->name, sizeof name);
        char *at = strchr(name, '@');
        vc->pre[0] = '\0';
        if (at) {
            *at = '\0';
            snprintf(vc->pre, sizeof vc->pre, "%s", at + 1);
        }
        int w;
        if (strcmp(name, "smollm2") == 0)
            w = snprintf(vc->gguf, sizeof vc->gguf, "%s", model ? model : "models/SmolLM2-135M-Instruct.Q4_1.gguf");
        else if (strcmp(name, "gemma3") == 0) /* opt-in: scripts/fetch-model.sh gemma3 */
            w = snprintf(vc->gguf, sizeof vc->gguf, "%s", gemma3 ? gemma3 : "models/gemma-3-270m-q4_k_m.gguf");
        else
            w = snprintf(vc->gguf, sizeof vc->gguf, "%s/testdata/vocab/ggml-vocab-%s.gguf", g_shared, name);
        if (w >= (int)sizeof vc->gguf) continue;
        if (!file_exists(vc->gguf)) {
            printf("skip vocabulary %s: %s is absent\n", vc->name, vc->gguf);
            continue;
        }
        g_n_vocabs++;
    }
    closedir(d);
    if (g_n_vocabs == 0) {
        printf("skip: none of the vocabularies is present (model under models/, the rest in %s/testdata/vocab)\n", g_shared);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_detok_fixtures),
        cmocka_unit_test(test_llama_vocab_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
