/* The KL-divergence base file of `osprey perplexity` (issue 13): one run's next-token distributions
 * at every scored position, saved so that a later run (another KV cache dtype, another device) can be
 * compared with it without recomputing the base.
 *
 * llama.cpp's llama-perplexity --kl-divergence-base keeps every logit of every scored position (a
 * uint16 per vocabulary entry: ~1 GB for 10k positions of a 49k vocabulary). This file keeps each
 * position's top k log-probabilities and the log of the mass left over, so the divergence a later run
 * reports is KL(P || Q) between the two distributions coarsened to the k base ids plus one "rest"
 * outcome: a lower bound of the full KL (the data-processing inequality), equal to it where the rest
 * holds no mass. Top-1 agreement and the base's NLL are exact.
 *
 * Layout (all little-endian, no padding):
 *   header, 48 bytes:
 *     char magic[8]      "OSPKLB01"
 *     u32  n_vocab       the model's vocabulary
 *     u32  ctx           tokens a chunk (the perplexity window)
 *     u32  n_chunks
 *     u32  n_scored      scored positions a chunk (1 .. ctx - 1)
 *     u32  k             top entries a position, 1 .. OSP_KLB_MAX_TOP
 *     u32  reserved      0
 *     u64  tokens_hash   FNV-1a 64 over the little-endian bytes of every chunk's ctx token ids, in
 *                        order (the text, tokenizer and chunking the base was made from)
 *     u64  reserved2     0
 *   then n_chunks * n_scored records, position order, each 8 k + 8 bytes:
 *     i32  ids[k]        base top ids, log-probability descending, lower id first on ties
 *     f32  logprob[k]    their log-probabilities (natural log, <= 0, non-increasing)
 *     f32  logprob_rest  log(1 - sum exp(logprob)): the rest's mass; -inf when none is left
 *     f32  nll           the base's negative log-likelihood of the scored token (finite, >= 0)
 * A file that does not match this exactly (size, magic, ranges, ordering, NaN) is refused whole. */
#ifndef OSP_FORMAT_KL_BASE_H
#define OSP_FORMAT_KL_BASE_H

#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"

#define OSP_KLB_MAX_TOP 64
#define OSP_KLB_HEADER_BYTES 48

typedef struct osp_kl_base {
    uint32_t n_vocab, ctx, n_chunks, n_scored, k;
    uint64_t tokens_hash;
    int32_t *ids;        /* [n_chunks * n_scored * k] */
    float *logprob;      /* [n_chunks * n_scored * k] */
    float *logprob_rest; /* [n_chunks * n_scored] */
    float *nll;          /* [n_chunks * n_scored] */
} osp_kl_base;

/* Bytes of a file with these counts (header + records); 0 when they overflow size_t or are invalid. */
size_t osp_kl_base_file_bytes(uint32_t n_chunks, uint32_t n_scored, uint32_t k);

/* Parses a whole file image buf[0..len) into *out (arrays malloc'd; osp_kl_base_free releases them).
 * Errors: OSP_ERR_FORMAT with what is wrong (size, magic, a field out of range, an id outside the
 * vocabulary, log-probabilities not descending or positive, a NaN), OSP_ERR_NOMEM. *out is zeroed
 * on error. Untrusted input: fuzzed by tests/fuzz/fuzz_kl_base.c. */
osp_status osp_kl_base_parse(const void *buf, size_t len, osp_kl_base *out);
/* Reads and parses `path` (OSP_ERR_IO naming it when it cannot be read). */
osp_status osp_kl_base_load(const char *path, osp_kl_base *out);
/* Writes *b to `path` in the layout above (the arrays as described; *b is not validated beyond the
 * counts). OSP_ERR_IO naming the path on failure (a partial file is removed). */
osp_status osp_kl_base_save(const char *path, const osp_kl_base *b);
void osp_kl_base_free(osp_kl_base *b); /* NULL is fine; zeroes *b */

/* One record's k entries ids [k], logprob [k], already in non-increasing logprob order (a top-k by
 * logit, each logit minus one log-sum-exp rounded to float), put in the file's order: equal
 * log-probabilities lower id first (distinct logits can round to one float). In place. */
void osp_kl_base_order_ties(int32_t *ids, const float *logprob, uint32_t k);

/* FNV-1a 64 of the little-endian bytes of ids[0..n), continuing from h (start: OSP_FNV64_OFFSET). */
#define OSP_FNV64_OFFSET 0xcbf29ce484222325ull
uint64_t osp_fnv1a64_ids(uint64_t h, const int32_t *ids, size_t n);

#endif
