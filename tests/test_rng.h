/* Deterministic random inputs for tests: one xorshift64 stream per test executable (header-only,
 * static), the same sequence in every run. */
#ifndef OSPREY_TESTS_TEST_RNG_H
#define OSPREY_TESTS_TEST_RNG_H

#include <stdint.h>

static uint64_t test_rng_state = 0x9E3779B97F4A7C15ull;

static inline uint32_t rnd(void) {
    test_rng_state ^= test_rng_state << 13;
    test_rng_state ^= test_rng_state >> 7;
    test_rng_state ^= test_rng_state << 17;
    return (uint32_t)(test_rng_state >> 11);
}

/* Uniform on [-1, 1] in steps of 1e-6. */
static inline float frand(void) { return (float)(rnd() % 2000001) / 1e6f - 1.0f; }

#endif
