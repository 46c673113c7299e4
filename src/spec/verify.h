/* Lossless verification of drafted tokens (Leviathan et al. 2023, "Fast Inference from Transformers via
 * Speculative Decoding", §2.3 and Algorithm 1; Chen et al. 2023, "Accelerating Large Language Model
 * Decoding with Speculative Sampling", Algorithm 2).
 *
 * The general rule, for a draft x drawn from the proposer's distribution q where the target's is p:
 * accept x with probability min(1, p(x) / q(x)); on rejection draw from max(0, p - q) normalized;
 * the token kept is then distributed exactly as p. osp_spec_accept_or_resample is that rule for one
 * position (a draft model's proposer will use it).
 *
 * The n-gram proposer drafts deterministically, q is a point mass at the draft d: the rule becomes
 * "accept d with probability p(d), else draw from p with d removed, renormalized". Drawing y ~ p and
 * accepting iff y == d is that same rule (P(accept) = p(d); given y != d, y ~ p restricted to != d), so
 * the engine samples every position of a verification row with the request's ordinary sampler (the
 * target's p under its temperature, top-k/top-p/min-p, penalties and bias) at the Philox address plain
 * decoding would use for that output position, and osp_spec_verify_point keeps the drafts up to the
 * first mismatch plus the target's draw there. Greedy is the special case where the draw is the
 * argmax. A seeded request therefore produces the very tokens it produces without speculation. */
#ifndef OSP_SPEC_VERIFY_H
#define OSP_SPEC_VERIFY_H

#include <stdbool.h>
#include <stdint.h>

/* Point-mass verification of one row: draft [num_spec], target [num_spec + 1] where target[j] is the
 * token the target drew at the position after the row's last token and draft[0..j). Returns a, the
 * number of leading drafts equal to the target's draws, in [0, num_spec]; the row's output is
 * draft[0..a) then target[a]. */
int32_t osp_spec_verify_point(const int32_t *draft, int32_t num_spec, const int32_t *target);

/* One position of the general rule: p [n] and q [n] probabilities (each summing to ~1, >= 0), the
 * draft x in [0, n) drawn from q, u_accept and u_resample independent uniforms in [0, 1). Accepts x
 * when u_accept * q(x) < p(x) (probability min(1, p(x)/q(x))); otherwise returns the token at
 * u_resample of the cumulative residual max(0, p - q) (when the residual is all zero, which needs
 * p == q, the draw is from p). *accepted says which. Allocates nothing; O(n). */
int32_t osp_spec_accept_or_resample(const float *p, const float *q, int32_t n, int32_t x, double u_accept,
                                    double u_resample, bool *accepted);

#endif
