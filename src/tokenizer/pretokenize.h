/* Pre-tokenizers: split text (as code points) into the words BPE runs on, one configuration per
 * `tokenizer.ggml.pre` name, reproducing llama.cpp's llm_tokenizer_bpe + unicode_regex_split. */
#ifndef OSP_TOKENIZER_PRETOKENIZE_H
#define OSP_TOKENIZER_PRETOKENIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"

typedef struct osp_pretok osp_pretok;

/* Per-name tokenizer flags llama.cpp sets next to the pre-tokenizer choice. */
typedef struct osp_pretok_flags {
    bool add_bos;       /* default for add_bos_token before metadata overrides it */
    bool ignore_merges; /* a word that is itself a token is emitted whole */
    bool no_bos;        /* the BOS id is cleared (chatglm) */
} osp_pretok_flags;

/* Compiles the pre-tokenizer `name` ("" or "default" for llama.cpp's default). Unknown names give
 * OSP_ERR_UNSUPPORTED naming `name`; a PCRE2 compile failure gives OSP_ERR_INTERNAL. */
osp_status osp_pretok_create(const char *name, osp_pretok **out, osp_pretok_flags *flags);
void osp_pretok_free(osp_pretok *p);

/* Splits cps[0..n) into words. On success *lens (malloc'd, caller frees) holds *n_words word
 * lengths in code points, summing to n; empty words are never produced. */
osp_status osp_pretok_split(const osp_pretok *p, const uint32_t *cps, size_t n, size_t **lens,
                            size_t *n_words);

#endif
