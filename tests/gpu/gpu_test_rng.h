/* Deterministic random inputs for the GPU kernel tests (test_gpu_attention, test_gpu_kv_quant):
 * splitmix64 (Steele, Lea & Flood 2014) from a state each test case seeds through g_rng, so a case's
 * inputs do not depend on the cases before it. Header-only, static: one stream per executable. */
#ifndef OSPREY_TESTS_GPU_GPU_TEST_RNG_H
#define OSPREY_TESTS_GPU_GPU_TEST_RNG_H

#include <stdint.h>

static uint64_t g_rng;
static inline uint64_t rnd64(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline int rnd_int(int n) { return (int)(rnd64() % (uint64_t)n); }                 /* [0, n) */
static inline float rnd_unit(void) { return (float)(rnd64() >> 40) / 8388608.0f - 1.0f; } /* [-1, 1) */

#endif
