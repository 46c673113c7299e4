/* Shared between the tokenizer's files: the osp_tokenizer struct and a string -> int32 hash map. */
#ifndef OSP_TOKENIZER_INTERNAL_H
#define OSP_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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

struct osp_tokenizer {
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
    osp_strmap merges;     /* u32 len(left) + left + right -> rank (the first rank wins) */
    int32_t bos, eos, eot, eom, unk, pad;
    bool add_bos, add_eos, ignore_merges;
    osp_pretok *pre;
    char pre_name[64];
};

static inline const char *osp_tok_text(const osp_tokenizer *t, int32_t id, size_t *len) {
    *len = (size_t)(t->text_off[id + 1] - t->text_off[id] - 1);
    return t->text_pool + t->text_off[id];
}

#endif
