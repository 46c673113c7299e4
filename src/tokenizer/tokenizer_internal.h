/* Shared between the tokenizer's files: the osp_tokenizer struct, a string -> int32 hash map, a
 * growable id vector and the special-token partition both encoders run first. */
#ifndef OSP_TOKENIZER_INTERNAL_H
#define OSP_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "osprey/tokenizer.h"
#include "tokenizer/pretokenize.h"

/* Open-addressing map from byte strings to int32 values. Keys live in one growing pool. */
typedef struct osp_strmap {
    uint32_t *slots;   /* (cap) entry index + 1, 0 = empty */
    uint64_t *key_off; /* (n) offset of key i in pool */
    uint32_t *key_len; /* (n) */
    uint32_t *hash;    /* (n) */
    int32_t *val;      /* (n) */
    char *pool;
    size_t n, n_cap, cap, pool_len, pool_cap;
} osp_strmap;

/* Inserts or, if `overwrite`, replaces; an existing key keeps its value when !overwrite. */
bool osp_strmap_put(osp_strmap *m, const char *key, size_t len, int32_t val, bool overwrite);
/* Value of key, or -1 when absent. */
int32_t osp_strmap_get(const osp_strmap *m, const char *key, size_t len);
void osp_strmap_free(osp_strmap *m);

/* Which algorithm encodes raw text (tokenizer.ggml.model). */
typedef enum osp_tok_model {
    OSP_TOK_BPE, /* "gpt2": byte-level BPE over pre-tokenized words (bpe.c) */
    OSP_TOK_SPM, /* "llama": SentencePiece pieces by score, byte fallback (spm.c) */
} osp_tok_model;

struct osp_tokenizer {
    osp_tok_model model;
    int32_t n_vocab;
    char *text_pool;       /* vocabulary strings, NUL-terminated, back to back */
    uint64_t *text_off;    /* (n_vocab + 1) offsets into text_pool; length = off[i+1] - off[i] - 1 */
    uint32_t *attr;        /* (n_vocab) OSP_TOKEN_ATTR_* bits */
    char *piece_pool;      /* decoded bytes of every token (token_bytes), back to back */
    uint64_t *piece_off;   /* (n_vocab + 1) */
    size_t max_piece;
    uint8_t *eog;          /* (n_vocab) 1 = end of generation */
    int32_t *special;      /* (n_special) CONTROL/USER_DEFINED/UNKNOWN ids, longest text first */
    int32_t n_special;
    osp_strmap vocab;      /* token text -> id (the last id wins for duplicate texts) */
    osp_strmap merges;     /* u32 len(left) + left + right -> rank (the first rank wins); BPE only */
    float *score;          /* (n_vocab) tokenizer.ggml.scores; SPM only */
    int32_t byte_tok[256]; /* SPM: id of "<0xXX>" (else of the one-byte text) for each byte, -1 if none */
    bool add_space_prefix; /* SPM: a space in front of the text, and after each special token */
    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, ignore_merges;
    osp_pretok *pre;       /* BPE only */
    char pre_name[64];
};

static inline const char *osp_tok_text(const osp_tokenizer *t, int32_t id, size_t *len) {
    *len = (size_t)(t->text_off[id + 1] - t->text_off[id] - 1);
    return t->text_pool + t->text_off[id];
}

/* Growable vector of token ids. */
typedef struct osp_idvec {
    int32_t *v;
    size_t n, cap;
} osp_idvec;

static inline bool osp_idvec_push(osp_idvec *o, int32_t id) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) return false;
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
    return true;
}

/* Appends the SentencePiece ids of the raw text fragment s[0..len) to out; with `space_prefix` a
 * space is put in front first. Returns false when out of memory (spm.c). */
bool osp_spm_encode_fragment(const osp_tokenizer *t, const char *s, size_t len, bool space_prefix, osp_idvec *out);

#endif
