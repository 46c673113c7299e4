/* SentencePiece encoding (`tokenizer.ggml.model = llama`): greedy merging by piece score, with
 * byte fallback.
 *
 * SentencePiece (Kudo & Richardson 2018) writes a space as U+2581 LOWER ONE EIGHTH BLOCK ('▁') and,
 * with add_space_prefix, puts one in front of the text, so "Hello world" is encoded as
 * "▁Hello▁world". The text is then cut into characters (a lead byte alone decides how many bytes a
 * character takes, as llama.cpp's unicode_len_utf8 does, so invalid UTF-8 still splits
 * deterministically), and adjacent symbols are merged while some pair spells a vocabulary piece:
 * always the pair whose piece has the highest score (tokenizer.ggml.scores), the leftmost one on
 * ties. This is llama.cpp's llm_tokenizer_spm_session, the "BPE by scores" approximation of
 * SentencePiece's own unigram search that llama.cpp uses for every Llama-family vocabulary; ids
 * therefore match llama_tokenize, not necessarily the sentencepiece library.
 *
 * A symbol left over that is not a piece (only single characters can be: every merge produces a
 * piece) becomes one token per byte: "<0xXX>", else the one-byte piece, else nothing (llama.cpp
 * throws there; every real SPM vocabulary has all 256 byte tokens). llama.cpp's resegment() also
 * consults a map of merged texts before falling back to bytes, but a text can only be in that map if
 * it is a piece, so the lookup never succeeds there and is left out.
 *
 * Candidate pairs live in a binary max-heap keyed (score, -left). A popped pair is stale when one of
 * its symbols was merged away or grew since it was pushed (the sizes no longer add up); while both
 * symbols are alive, left's successor is always right, so this test is exact. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

typedef struct spm_sym {
    uint32_t off, n; /* bytes of the escaped text; n = 0 once merged into its left neighbour */
    int32_t prev, next;
} spm_sym;

typedef struct spm_pair {
    float score;
    int32_t left, right;
    uint32_t size; /* left.n + right.n when pushed */
} spm_pair;

typedef struct spm_work {
    const osp_tokenizer *t;
    const char *text; /* the escaped text */
    spm_sym *sym;
    spm_pair *heap;
    size_t heap_n, heap_cap;
} spm_work;

/* true when a should be popped before b */
static bool pair_before(const spm_pair *a, const spm_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static bool heap_push(spm_work *w, spm_pair p) {
    if (w->heap_n == w->heap_cap) {
        size_t cap = w->heap_cap ? w->heap_cap * 2 : 64;
        spm_pair *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return false;
        w->heap = h;
        w->heap_cap = cap;
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!pair_before(&p, &w->heap[up])) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = p;
    return true;
}

static spm_pair heap_pop(spm_work *w) {
    spm_pair top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pair_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!pair_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

/* Pushes the pair (left, right) if their concatenation is a piece. Adjacent symbols are contiguous
 * in the text, so the candidate piece is a slice of it. */
static bool try_pair(spm_work *w, int32_t left, int32_t right) {
    if (left < 0 || right < 0) return true;
    const spm_sym *l = &w->sym[left];
    uint32_t size = l->n + w->sym[right].n;
    int32_t id = osp_strmap_get(&w->t->vocab, w->text + l->off, size);
    if (id < 0) return true;
    return heap_push(w, (spm_pair){w->t->score[id], left, right, size});
}

/* One token per byte of a symbol that is not a piece. */
static bool push_bytes(const osp_tokenizer *t, const char *s, uint32_t n, osp_idvec *out) {
    for (uint32_t j = 0; j < n; j++) {
        int32_t id = t->byte_tok[(unsigned char)s[j]];
        if (id >= 0 && !osp_idvec_push(out, id)) return false;
    }
    return true;
}

bool osp_spm_encode_fragment(const osp_tokenizer *t, const char *s, size_t len, bool space_prefix, osp_idvec *out) {
    static const char k_esc[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* U+2581 */
    if (len > (UINT32_MAX - 3) / 3) return false;
    bool ok = false;
    spm_work w = {.t = t};
    char *text = malloc(len * 3 + 3);
    if (!text) return false;
    size_t tl = 0;
    if (space_prefix) {
        memcpy(text, k_esc, 3);
        tl = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(text + tl, k_esc, 3);
            tl += 3;
        } else {
            text[tl++] = s[i];
        }
    }
    w.text = text;
    w.sym = malloc((tl ? tl : 1) * sizeof *w.sym);
    if (!w.sym) goto done;

    /* characters: the lead byte's high nibble gives the length (1 for continuation bytes) */
    static const uint8_t k_len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    int32_t n_sym = 0;
    for (size_t off = 0; off < tl;) {
        size_t cl = k_len[(unsigned char)text[off] >> 4];
        if (cl > tl - off) cl = tl - off;
        w.sym[n_sym] = (spm_sym){(uint32_t)off, (uint32_t)cl, n_sym - 1, off + cl == tl ? -1 : n_sym + 1};
        off += cl;
        n_sym++;
    }
    for (int32_t i = 1; i < n_sym; i++)
        if (!try_pair(&w, i - 1, i)) goto done;

    while (w.heap_n) {
        spm_pair p = heap_pop(&w);
        spm_sym *l = &w.sym[p.left], *r = &w.sym[p.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != p.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w.sym[r->next].prev = p.left;
        if (!try_pair(&w, l->prev, p.left) || !try_pair(&w, p.left, l->next)) goto done;
    }

    for (int32_t i = 0; n_sym > 0 && i != -1; i = w.sym[i].next) {
        const spm_sym *sy = &w.sym[i];
        int32_t id = osp_strmap_get(&t->vocab, text + sy->off, sy->n);
        if (id >= 0) {
            if (!osp_idvec_push(out, id)) goto done;
        } else if (!push_bytes(t, text + sy->off, sy->n, out)) {
            goto done;
        }
    }
    ok = true;
done:
    free(text);
    free(w.sym);
    free(w.heap);
    return ok;
}
