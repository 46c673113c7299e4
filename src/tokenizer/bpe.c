/* Encoding: special-token partition, pre-tokenization, GPT-2 byte mapping and BPE merges. The
 * partition and the BOS/EOS handling are shared with SentencePiece vocabularies, whose raw
 * fragments go to spm.c instead.
 *
 * Byte-level BPE (Radford et al. 2019; Sennrich et al. 2016): every word from the pre-tokenizer is
 * turned into its UTF-8 bytes, each byte into one of 256 printable unicode chars, and adjacent
 * symbols are merged, always the pair with the lowest merge rank first (leftmost on ties), until
 * no adjacent pair has a rank. Candidate pairs live in a binary heap keyed (rank, left index); a
 * popped pair whose symbols changed since it was pushed is skipped, so a word of n symbols costs
 * O(n log n). This is the order llama.cpp's llm_tokenizer_bpe_session uses, so ids agree.
 *
 * Special tokens are cut out first, exactly as llama.cpp's tokenizer_st_partition does: for each
 * special token, longest text first, every occurrence in every still-raw fragment is replaced. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "tokenizer/tokenizer_internal.h"
#include "tokenizer/unicode.h"

/* ---------------------------------------------------------------------------------------------- */
/* BPE merges over one word                                                                       */

typedef struct symbol {
    uint32_t off, len; /* bytes of the encoded word; len 0 = merged away */
    int32_t prev, next;
} symbol;

typedef struct bigram {
    int32_t rank;
    int32_t left, right;
    uint32_t left_len, right_len; /* to detect pairs that went stale */
} bigram;

typedef struct bpe_work {
    symbol *sym;
    size_t sym_cap;
    bigram *heap;
    size_t heap_n, heap_cap;
    char *key;
    size_t key_cap;
} bpe_work;

static bool bigram_less(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static bool heap_push(bpe_work *w, bigram b) {
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        bigram *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return false;
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_less(&b, &w->heap[p])) break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = b;
    return true;
}

static bigram heap_pop(bpe_work *w) {
    bigram top = w->heap[0];
    bigram last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bigram_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* rank of merging symbols `l` and `r` of `word`, -1 if there is no such merge */
static int32_t pair_rank(const osp_tokenizer *t, bpe_work *w, const char *word, const symbol *l, const symbol *r) {
    size_t klen = 4 + l->len + r->len;
    if (klen > w->key_cap) {
        size_t cap = klen * 2;
        char *k = realloc(w->key, cap);
        if (!k) return -2;
        w->key = k;
        w->key_cap = cap;
    }
    uint32_t ll = l->len;
    memcpy(w->key, &ll, 4);
    memcpy(w->key + 4, word + l->off, l->len);
    memcpy(w->key + 4 + l->len, word + r->off, r->len);
    return osp_strmap_get(&t->merges, w->key, klen);
}

static bool add_bigram(const osp_tokenizer *t, bpe_work *w, const char *word, int32_t left, int32_t right, bool *oom) {
    if (left < 0 || right < 0) return true;
    const symbol *l = &w->sym[left], *r = &w->sym[right];
    int32_t rank = pair_rank(t, w, word, l, r);
    if (rank == -2) {
        *oom = true;
        return false;
    }
    if (rank < 0) return true;
    bigram b = {rank, left, right, l->len, r->len};
    if (!heap_push(w, b)) {
        *oom = true;
        return false;
    }
    return true;
}

/* Tokenizes one byte-encoded word (valid UTF-8 of GPT-2 chars) into out. */
static bool bpe_word(const osp_tokenizer *t, bpe_work *w, const char *word, size_t len, osp_idvec *out) {
    if (t->ignore_merges) {
        int32_t id = osp_strmap_get(&t->vocab, word, len);
        if (id >= 0) return osp_idvec_push(out, id);
    }
    if (len > w->sym_cap) {
        size_t cap = len * 2;
        symbol *s = realloc(w->sym, cap * sizeof *s);
        if (!s) return false;
        w->sym = s;
        w->sym_cap = cap;
    }
    int32_t n = 0;
    for (size_t off = 0; off < len;) {
        unsigned char c = (unsigned char)word[off];
        size_t cl = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
        if (cl > len - off) cl = len - off;
        w->sym[n] = (symbol){(uint32_t)off, (uint32_t)cl, n - 1, off + cl == len ? -1 : n + 1};
        off += cl;
        n++;
    }
    w->heap_n = 0;
    bool oom = false;
    for (int32_t i = 1; i < n; i++)
        if (!add_bigram(t, w, word, i - 1, i, &oom)) return false;
    while (w->heap_n) {
        bigram b = heap_pop(w);
        symbol *l = &w->sym[b.left], *r = &w->sym[b.right];
        if (l->len == 0 || r->len == 0 || l->len != b.left_len || r->len != b.right_len || l->next != b.right)
            continue; /* stale */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = b.left;
        if (!add_bigram(t, w, word, l->prev, b.left, &oom)) return false;
        if (!add_bigram(t, w, word, b.left, l->next, &oom)) return false;
    }
    for (int32_t i = 0; i != -1 && n > 0; i = w->sym[i].next) {
        const symbol *s = &w->sym[i];
        int32_t id = osp_strmap_get(&t->vocab, word + s->off, s->len);
        if (id >= 0) {
            if (!osp_idvec_push(out, id)) return false;
            continue;
        }
        /* no such token: fall back to single-byte tokens of the encoded text, dropping misses */
        for (uint32_t j = 0; j < s->len; j++) {
            int32_t bid = osp_strmap_get(&t->vocab, word + s->off + j, 1);
            if (bid >= 0 && !osp_idvec_push(out, bid)) return false;
        }
    }
    return true;
}

/* Pre-tokenizes and BPE-encodes the raw text fragment s[0..len). */
static osp_status encode_fragment(const osp_tokenizer *t, bpe_work *w, const char *s, size_t len, osp_idvec *out) {
    osp_status st = OSP_OK;
    uint32_t *cps = malloc(len * sizeof *cps);
    size_t *lens = NULL, n_words = 0;
    char *word = NULL;
    if (!cps) goto oom;
    size_t n = osp_utf8_decode_lenient(s, len, cps);
    st = osp_pretok_split(t->pre, cps, n, &lens, &n_words);
    if (st != OSP_OK) goto done;
    size_t maxw = 0;
    for (size_t i = 0; i < n_words; i++)
        if (lens[i] > maxw) maxw = lens[i];
    word = malloc(maxw * 8 + 1); /* each code point: up to 4 bytes, each byte up to 2 */
    if (!word) goto oom;
    size_t start = 0;
    for (size_t i = 0; i < n_words; i++) {
        size_t wl = 0;
        for (size_t k = start; k < start + lens[i]; k++) {
            char u[4];
            int nb = osp_utf8_encode(cps[k], u);
            for (int j = 0; j < nb; j++) wl += (size_t)osp_utf8_encode(osp_byte_to_unicode((uint8_t)u[j]), word + wl);
        }
        start += lens[i];
        if (wl && !bpe_word(t, w, word, wl, out)) goto oom;
    }
    goto done;
oom:
    st = osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
done:
    free(cps);
    free(lens);
    free(word);
    return st;
}

/* ---------------------------------------------------------------------------------------------- */
/* special-token partition                                                                        */

typedef struct fragment {
    int32_t token; /* -1: raw text */
    size_t off, len;
} fragment;

typedef struct fragvec {
    fragment *v;
    size_t n, cap;
} fragvec;

static bool fv_push(fragvec *f, fragment x) {
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 16;
        fragment *v = realloc(f->v, cap * sizeof *v);
        if (!v) return false;
        f->v = v;
        f->cap = cap;
    }
    f->v[f->n++] = x;
    return true;
}

/* Does [a, a + n) overlap one of the sorted ranges guard[0..ng)? (binary search) */
static bool overlaps_guard(const osp_text_span *guard, size_t ng, size_t a, size_t n) {
    size_t lo = 0, hi = ng;
    while (lo < hi) { /* first range ending past a */
        size_t mid = lo + (hi - lo) / 2;
        if (guard[mid].off + guard[mid].len <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo < ng && guard[lo].off < a + n;
}

/* Cuts special tokens out of the raw fragments. With `guard` (sorted byte ranges of text), an
 * occurrence of a CONTROL/UNKNOWN token that overlaps a guarded byte stays raw text, as if
 * parse_special were off for those bytes; the search goes on one byte later. */
static bool partition(const osp_tokenizer *t, const char *text, bool parse_special, const osp_text_span *guard,
                      size_t n_guard, fragvec *cur) {
    fragvec next = {0};
    bool ok = false;
    for (int32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        uint32_t attr = t->attr[id];
        const bool ctl = (attr & (OSP_TOKEN_ATTR_CONTROL | OSP_TOKEN_ATTR_UNKNOWN)) != 0;
        if (!parse_special && ctl) continue;
        const bool guarded = ctl && n_guard > 0;
        size_t slen;
        const char *stxt = osp_tok_text(t, id, &slen);
        next.n = 0;
        for (size_t f = 0; f < cur->n; f++) {
            fragment fr = cur->v[f];
            if (fr.token >= 0 || fr.len < slen) {
                if (!fv_push(&next, fr)) goto done;
                continue;
            }
            size_t base = fr.off, blen = fr.len, from = base;
            for (;;) {
                const size_t fend = base + blen;
                const char *m = NULL;
                while (fend - from >= slen && (m = memmem(text + from, fend - from, stxt, slen)) != NULL && guarded &&
                       overlaps_guard(guard, n_guard, (size_t)(m - text), slen)) {
                    from = (size_t)(m - text) + 1;
                    m = NULL;
                }
                if (!m) {
                    if (blen > 0 && !fv_push(&next, (fragment){-1, base, blen})) goto done;
                    break;
                }
                size_t mpos = (size_t)(m - text);
                if (mpos > base) {
                    size_t ll = mpos - base;
                    if (attr & OSP_TOKEN_ATTR_LSTRIP)
                        while (ll > 0 && isspace((unsigned char)text[base + ll - 1])) ll--;
                    if (ll > 0 && !fv_push(&next, (fragment){-1, base, ll})) goto done;
                }
                if (!fv_push(&next, (fragment){id, 0, 0})) goto done;
                size_t rend = base + blen, roff = mpos + slen;
                if (roff >= rend) break;
                size_t rlen = rend - roff;
                if (attr & OSP_TOKEN_ATTR_RSTRIP)
                    while (rlen > 0 && isspace((unsigned char)text[roff])) {
                        roff++;
                        rlen--;
                    }
                base = roff;
                blen = rlen;
                from = base;
            }
        }
        fragvec tmp = *cur;
        *cur = next;
        next = tmp;
    }
    ok = true;
done:
    free(next.v);
    return ok;
}

/* ---------------------------------------------------------------------------------------------- */

static osp_status encode(const osp_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                         const osp_text_span *guard, size_t n_guard, int32_t **ids, size_t *n_ids);

osp_status osp_tokenizer_encode(const osp_tokenizer *t, const char *text, size_t len, bool add_special,
                                bool parse_special, int32_t **ids, size_t *n_ids) {
    return encode(t, text, len, add_special, parse_special, NULL, 0, ids, n_ids);
}

osp_status osp_tokenizer_encode_spans(const osp_tokenizer *t, const char *text, size_t len,
                                      const osp_text_span *plain, size_t n_plain, bool add_special, int32_t **ids,
                                      size_t *n_ids) {
    if (ids) *ids = NULL;
    if (n_ids) *n_ids = 0;
    if (n_plain && !plain) return osp_set_error(OSP_ERR_INVALID_ARG, "tokenizer: NULL span list");
    for (size_t i = 0; i < n_plain; i++) {
        const osp_text_span s = plain[i];
        if (s.off > len || s.len > len - s.off || (i > 0 && s.off < plain[i - 1].off + plain[i - 1].len))
            return osp_set_error(OSP_ERR_INVALID_ARG,
                                 "tokenizer: plain-text span %zu [%zu, +%zu) is outside the text (%zu bytes) or out of order",
                                 i, s.off, s.len, len);
    }
    return encode(t, text, len, add_special, true, plain, n_plain, ids, n_ids);
}

static osp_status encode(const osp_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                         const osp_text_span *guard, size_t n_guard, int32_t **ids, size_t *n_ids) {
    if (!t || (!text && len) || !ids || !n_ids)
        return osp_set_error(OSP_ERR_INVALID_ARG, "tokenizer: NULL argument to encode");
    *ids = NULL;
    *n_ids = 0;
    osp_status st = OSP_OK;
    fragvec frags = {0};
    osp_idvec out = {0};
    bpe_work w = {0};
    if (len > 0) {
        if (!fv_push(&frags, (fragment){-1, 0, len}) || !partition(t, text, parse_special, guard, n_guard, &frags)) goto oom;
    }
    bool add_bos = add_special && t->add_bos && t->bos >= 0;
    if (add_bos && frags.n > 0 && frags.v[0].token == t->bos) add_bos = false; /* never doubled */
    if (add_bos && !osp_idvec_push(&out, t->bos)) goto oom;
    /* SPM: a raw fragment at the start or right after a special token gets the space prefix
     * (llama.cpp's is_prev_special, true at the start whether or not BOS was added) */
    bool prev_special = true;
    for (size_t f = 0; f < frags.n; f++) {
        const fragment *fr = &frags.v[f];
        if (fr->token >= 0) {
            if (!osp_idvec_push(&out, fr->token)) goto oom;
            prev_special = true;
        } else if (t->model == OSP_TOK_SPM) {
            if (!osp_spm_encode_fragment(t, text + fr->off, fr->len, t->add_space_prefix && prev_special, &out))
                goto oom;
            prev_special = false;
        } else {
            st = encode_fragment(t, &w, text + fr->off, fr->len, &out);
            if (st != OSP_OK) goto done;
        }
    }
    if (add_special && t->add_eos && t->eos >= 0) {
        bool ends_with_eos = frags.n > 0 && frags.v[frags.n - 1].token == t->eos;
        if (!ends_with_eos && !osp_idvec_push(&out, t->eos)) goto oom;
    }
    *ids = out.v;
    *n_ids = out.n;
    out.v = NULL;
    goto done;
oom:
    st = osp_set_error(OSP_ERR_NOMEM, "tokenizer: out of memory");
done:
    free(out.v);
    free(frags.v);
    free(w.sym);
    free(w.heap);
    free(w.key);
    return st;
}
