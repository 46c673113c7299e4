/* One choice's output text: tokens go through the incremental detokenizer (whole UTF-8 characters
 * only), and stop strings are searched in the text itself, so a stop inside one token or spread over
 * several is found the same way. Text that could still turn out to be the start of a stop string is
 * held back; nothing of a stop string is ever handed out (unless include_stop_str_in_output), so the
 * streamed pieces concatenate to exactly the final text. */
#include <stdlib.h>
#include <string.h>

#include "server.h"

int srv_text_init(srv_text *t, const osp_tokenizer *tok, bool skip_special, char **stops, int32_t n_stops,
                  bool include_stop) {
    memset(t, 0, sizeof *t);
    t->stops = stops;
    t->n_stops = n_stops;
    t->include_stop = include_stop;
    t->tmp_cap = 3 * (osp_tokenizer_max_token_bytes(tok) + 4) + 16;
    t->tmp = malloc(t->tmp_cap);
    if (!t->tmp || osp_detokenizer_new(tok, &t->dt) != OSP_OK) return -1;
    osp_detokenizer_skip_special(t->dt, skip_special);
    return 0;
}

void srv_text_free(srv_text *t) {
    osp_detokenizer_free(t->dt);
    free(t->buf);
    free(t->tmp);
    memset(t, 0, sizeof *t);
}

static int append(srv_text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *b = realloc(t->buf, cap);
        if (!b) return -1;
        t->buf = b;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, s, n);
    t->len += n;
    t->buf[t->len] = 0;
    return 0;
}

/* Earliest stop string in buf[from, len): cuts the text there and returns 1. */
static int find_stop(srv_text *t, size_t from) {
    size_t best = SIZE_MAX, best_len = 0;
    for (int32_t i = 0; i < t->n_stops; i++) {
        const size_t sl = strlen(t->stops[i]);
        if (t->len - from < sl) continue;
        const char *p = memmem(t->buf + from, t->len - from, t->stops[i], sl);
        if (p && (size_t)(p - t->buf) < best) best = (size_t)(p - t->buf), best_len = sl;
    }
    if (best == SIZE_MAX) return 0;
    t->len = best + (t->include_stop ? best_len : 0);
    t->buf[t->len] = 0;
    t->stopped = true;
    return 1;
}

int srv_text_push(srv_text *t, int32_t id) {
    if (t->stopped || t->flushed) return t->stopped ? 1 : 0;
    size_t n;
    if (osp_detokenizer_push(t->dt, id, t->tmp, t->tmp_cap, &n) != OSP_OK) {
        if (n + 1 <= t->tmp_cap) return 0; /* an id outside the vocabulary: no text */
        char *b = realloc(t->tmp, n + 1);
        if (!b) return -1;
        t->tmp = b;
        t->tmp_cap = n + 1;
        if (osp_detokenizer_push(t->dt, id, t->tmp, t->tmp_cap, &n) != OSP_OK) return 0; /* bad id: no text */
    }
    if (n == 0) return 0;
    if (append(t, t->tmp, n)) return -1;
    /* A match cannot start before `sent`: such a start would have been held back (srv_text_ready). */
    return find_stop(t, t->sent);
}

int srv_text_finish(srv_text *t) {
    if (t->flushed) return 0;
    t->flushed = true;
    if (t->stopped) return 0;
    size_t n;
    if (osp_detokenizer_flush(t->dt, t->tmp, t->tmp_cap, &n) == OSP_OK && n) {
        if (append(t, t->tmp, n)) return -1;
        find_stop(t, t->sent);
    }
    return 0;
}

size_t srv_text_ready(const srv_text *t) {
    if (t->stopped || t->flushed || t->n_stops == 0) return t->len;
    /* hold back the longest suffix of buf[sent, len) that is a proper prefix of some stop string */
    size_t hold = 0;
    for (int32_t i = 0; i < t->n_stops; i++) {
        const size_t sl = strlen(t->stops[i]);
        size_t k = sl - 1 < t->len - t->sent ? sl - 1 : t->len - t->sent;
        for (; k > hold; k--)
            if (!memcmp(t->buf + t->len - k, t->stops[i], k)) break;
        if (k > hold) hold = k;
    }
    return t->len - hold;
}
