/* Counter-based random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3", SC 2011, §4.2). A stream is addressed by a 64-bit key (the seed) and a 128-bit counter,
 * so any draw can be recomputed from (seed, position) alone, whatever else ran before it. */
#ifndef OSP_SAMPLE_RNG_H
#define OSP_SAMPLE_RNG_H

#include <stdint.h>

/* Four 32-bit outputs for counter (c0, c1, c2, c3) and key (k0, k1). */
void osp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A uniform float in [0, 1) with 24 random bits, for draw `index` of the stream keyed by `seed`
 * at counter word `offset` (e.g. the output position). */
float osp_rng_uniform(uint64_t seed, uint64_t offset, uint32_t index);

#endif
