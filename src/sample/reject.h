/* Sorting-free top-k / top-p / min-p sampling by rejection (see reject.c for the algorithm). */
#ifndef OSP_SAMPLE_REJECT_H
#define OSP_SAMPLE_REJECT_H

#include <stdint.h>

/* Where one step's uniforms come from (rng.h): (seed, sample index, output position), draw r. */
typedef struct osp_rng_addr {
    uint64_t seed;
    uint32_t sample_index;
    uint64_t position;
} osp_rng_addr;

/* Rounds of rejection before the exact (sorting) fallback. */
#define OSP_REJECT_MAX_ROUNDS 32

/* Draws one token from the distribution proportional to w[i] restricted to the filtered set
 *     F = top-p( top-k( min-p(w) ) )        (vLLM V1 order: min-p, then top-k, then top-p)
 * where
 *     min-p:  keep w_i >= min_p * max w                           (min_p <= 0: off)
 *     top-k:  keep w_i >= the k-th largest kept weight (ties at the boundary all kept)   (k <= 0: off)
 *     top-p:  keep w_i if the kept mass strictly above w_i is < top_p * (kept mass); the largest
 *             weight is always kept, so top_p = 0 keeps exactly the tokens tied at the max
 *                                                                  (top_p >= 1: off)
 * w [n]: unnormalized probabilities, finite, >= 0, with max exactly 1.0f (exp(l - max l)); zero
 *        weights are never drawn. Overwritten (candidates are compacted in place).
 * ids [n]: scratch, int32.
 * Returns the token index in [0, n) of the original w; never fails when max w == 1. `rounds` (may be
 * NULL) receives the number of rejection rounds used, OSP_REJECT_MAX_ROUNDS + 1 for the fallback. */
int32_t osp_reject_sample(float *w, int32_t *ids, int32_t n, int32_t top_k, float top_p, float min_p,
                          const osp_rng_addr *rng, int32_t *rounds);

/* The same with the number of rejection rounds before the fallback given (0: fallback at once);
 * tests use it to check the fallback taken midway. `rounds` gets max_rounds + 1 for a fallback. */
int32_t osp_reject_sample_ex(float *w, int32_t *ids, int32_t n, int32_t top_k, float top_p, float min_p,
                             const osp_rng_addr *rng, int32_t max_rounds, int32_t *rounds);

/* The same draw by sorting (heapsort of the min-p candidates, cumulative sums, cut, renormalize),
 * exact up to float rounding: the rejection sampler's fallback, and its cross-check in tests. Uses
 * draw index OSP_REJECT_MAX_ROUNDS of the stream. Same arguments and contract as above. */
int32_t osp_reject_sample_sorted(float *w, int32_t *ids, int32_t n, int32_t top_k, float top_p, float min_p,
                                 const osp_rng_addr *rng);

#endif
