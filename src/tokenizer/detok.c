/* Incremental detokenizer: token ids in, UTF-8 text out, never a partial character.
 *
 * Byte-level BPE tokens are arbitrary byte strings, so one character can be split over several
 * tokens (an emoji is often 2-4 tokens). Each push appends the token's bytes to the (at most 3)
 * bytes held back from before and emits every complete, well-formed sequence. A byte is replaced by
 * U+FFFD as soon as it can no longer be part of a well-formed sequence, one U+FFFD per maximal
 * ill-formed subpart (Unicode 15 chapter 3, "U+FFFD Substitution of Maximal Subparts", Table 3-7
 * for the well-formed byte ranges); a valid but unfinished prefix at the end is held for the next
 * push, and flush() replaces it with one U+FFFD.
 *
 * SentencePiece pieces carry their leading space ("▁Hello" is " Hello"), so a whole sequence decoded
 * from its start begins with the space the tokenizer added; with lstrip_first on, the first token
 * loses it, as in llama_detokenize. */
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"
#include "tokenizer/tokenizer_internal.h"

struct osp_detokenizer {
    const osp_tokenizer *t;
    bool skip_special;
    bool lstrip_first;     /* drop one leading space of the first token (llama_detokenize) */
    bool started;          /* a token was pushed since new/reset/flush */
    unsigned char pend[4]; /* an incomplete but so far valid sequence */
    size_t n_pend;
    unsigned char *in;     /* (in_cap) scratch: pending bytes + token bytes */
    size_t in_cap;
    char *out;             /* (out_cap) scratch for the text before it is copied out */
    size_t out_cap;
};

osp_status osp_detokenizer_new(const osp_tokenizer *t, osp_detokenizer **out) {
    if (!t || !out) return osp_set_error(OSP_ERR_INVALID_ARG, "detokenizer: NULL argument");
    osp_detokenizer *d = calloc(1, sizeof *d);
    if (!d) return osp_set_error(OSP_ERR_NOMEM, "detokenizer: out of memory");
    d->t = t;
    d->in_cap = osp_tokenizer_max_token_bytes(t) + 8;
    d->out_cap = 3 * d->in_cap + 1;
    d->in = malloc(d->in_cap);
    d->out = malloc(d->out_cap);
    if (!d->in || !d->out) {
        osp_detokenizer_free(d);
        return osp_set_error(OSP_ERR_NOMEM, "detokenizer: out of memory");
    }
    *out = d;
    return OSP_OK;
}

void osp_detokenizer_free(osp_detokenizer *d) {
    if (!d) return;
    free(d->in);
    free(d->out);
    free(d);
}

void osp_detokenizer_skip_special(osp_detokenizer *d, bool skip) { d->skip_special = skip; }

void osp_detokenizer_lstrip_first(osp_detokenizer *d, bool on) { d->lstrip_first = on; }

void osp_detokenizer_reset(osp_detokenizer *d) {
    d->n_pend = 0;
    d->started = false;
}

/* Length of the sequence lead byte `c` starts and the allowed range of its second byte; 0 when c
 * cannot start a sequence (continuation bytes, C0, C1, F5..FF). */
static int seq_len(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Converts in[0..n) to well-formed UTF-8 in out; returns bytes written. When !final, an unfinished
 * valid tail is copied to pend instead of being replaced. */
static size_t sanitize(const unsigned char *in, size_t n, bool final, char *out, unsigned char *pend, size_t *n_pend) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t o = 0, i = 0;
    *n_pend = 0;
    while (i < n) {
        unsigned char lo, hi;
        int need = seq_len(in[i], &lo, &hi);
        if (need == 1) {
            out[o++] = (char)in[i++];
            continue;
        }
        if (need == 0) {
            memcpy(out + o, fffd, 3);
            o += 3;
            i++;
            continue;
        }
        int k = 1;
        bool bad = false;
        for (; k < need; k++) {
            if (i + (size_t)k >= n) break; /* ran out: unfinished */
            unsigned char c = in[i + (size_t)k];
            unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
            if (c < l || c > h) {
                bad = true;
                break;
            }
        }
        if (k == need) {
            memcpy(out + o, in + i, (size_t)need);
            o += (size_t)need;
            i += (size_t)need;
        } else if (bad || final) {
            memcpy(out + o, fffd, 3); /* the maximal subpart in[i..i+k) */
            o += 3;
            i += (size_t)k;
        } else {
            memcpy(pend, in + i, n - i);
            *n_pend = n - i;
            i = n;
        }
    }
    return o;
}

static osp_status emit(osp_detokenizer *d, const unsigned char *in, size_t n, bool final, char *out, size_t cap,
                       size_t *n_out) {
    unsigned char pend[4];
    size_t n_pend;
    size_t len = sanitize(in, n, final, d->out, pend, &n_pend);
    *n_out = len;
    if (!out || len + 1 > cap)
        return osp_set_error(OSP_ERR_INVALID_ARG, "detokenizer: output needs %zu bytes, buffer has %zu", len + 1, cap);
    memcpy(out, d->out, len);
    out[len] = '\0';
    memcpy(d->pend, pend, n_pend);
    d->n_pend = n_pend;
    return OSP_OK;
}

osp_status osp_detokenizer_push(osp_detokenizer *d, int32_t id, char *out, size_t cap, size_t *n) {
    const osp_tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab) {
        *n = 0;
        return osp_set_error(OSP_ERR_INVALID_ARG, "detokenizer: token id %d out of range", (int)id);
    }
    const char *piece = t->piece_pool + t->piece_off[id];
    size_t plen = (size_t)(t->piece_off[id + 1] - t->piece_off[id]);
    if (d->skip_special && (t->attr[id] & (OSP_TOKEN_ATTR_CONTROL | OSP_TOKEN_ATTR_UNKNOWN))) plen = 0;
    /* llama_detokenize strips at most one space, from the first token only, even when that token
     * renders as nothing (a skipped BOS): the space after BOS is kept */
    if (!d->started && d->lstrip_first && t->add_space_prefix && plen > 0 && piece[0] == ' ') {
        piece++;
        plen--;
    }
    memcpy(d->in, d->pend, d->n_pend);
    memcpy(d->in + d->n_pend, piece, plen);
    osp_status st = emit(d, d->in, d->n_pend + plen, false, out, cap, n);
    if (st == OSP_OK) d->started = true;
    return st;
}

osp_status osp_detokenizer_flush(osp_detokenizer *d, char *out, size_t cap, size_t *n) {
    unsigned char in[4];
    memcpy(in, d->pend, d->n_pend);
    osp_status st = emit(d, in, d->n_pend, true, out, cap, n);
    if (st == OSP_OK) d->started = false;
    return st;
}
