/* Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC 2011, §4.2). A stream is addressed by a 64-bit key (the seed) and a 128-bit counter,
 * so any draw can be recomputed from (seed, position) alone, whatever else ran before it.
 *
 * The sampler's address of one uniform is (seed, sample index among the request's n children,
 * output position, draw index within that step):
 *     key     = (seed lo, seed hi)
 *     counter = (draw / 4, position lo, position hi, sample index), output word draw % 4.
 * A sequence's draws therefore never depend on the batch it runs in. With sample index 0 this is
 * the same stream osp_rng_uniform() has always used. */
#ifndef OSP_SAMPLE_RNG_H
#define OSP_SAMPLE_RNG_H

#include <stdint.h>

/* Four 32-bit outputs for counter (c0, c1, c2, c3) and key (k0, k1). */
void osp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A uniform float in [0, 1) with 24 random bits, for draw `index` of the stream keyed by `seed`
 * at counter word `offset` (e.g. the output position). Equals osp_rng_uniform_at(seed, 0, offset,
 * index) rounded down to 24 bits. */
float osp_rng_uniform(uint64_t seed, uint64_t offset, uint32_t index);

/* The raw 32-bit word at the address above. */
uint32_t osp_rng_u32_at(uint64_t seed, uint32_t sample_index, uint64_t position, uint32_t draw);

/* A uniform double in [0, 1) with 32 random bits (k * 2^-32) at the address above. */
double osp_rng_uniform_at(uint64_t seed, uint32_t sample_index, uint64_t position, uint32_t draw);

/* A fresh 64-bit seed from the operating system (getrandom), for requests that did not give one:
 * the engine draws it once at admission and keeps it with the request, so a preempted and
 * recomputed request continues the same stream. Falls back to a clock-and-counter mix if the
 * system call fails. Thread-safe. */
uint64_t osp_rng_entropy_seed(void);

#endif
