/* Philox4x32-10, as specified in Salmon et al. (SC 2011) with the constants of Random123, and the
 * sampler's addressing of it (see rng.h). */
#include "sample/rng.h"

#include <stdatomic.h>
#include <sys/random.h>
#include <time.h>

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void osp_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        const uint64_t p0 = (uint64_t)PHILOX_M0 * c0, p1 = (uint64_t)PHILOX_M1 * c2;
        const uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        const uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint32_t osp_rng_u32_at(uint64_t seed, uint32_t sample_index, uint64_t position, uint32_t draw) {
    const uint32_t ctr[4] = {draw / 4u, (uint32_t)position, (uint32_t)(position >> 32), sample_index};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    osp_philox4x32_10(ctr, key, out);
    return out[draw % 4u];
}

double osp_rng_uniform_at(uint64_t seed, uint32_t sample_index, uint64_t position, uint32_t draw) {
    return (double)osp_rng_u32_at(seed, sample_index, position, draw) * (1.0 / 4294967296.0);
}

float osp_rng_uniform(uint64_t seed, uint64_t offset, uint32_t index) {
    return (float)(osp_rng_u32_at(seed, 0, offset, index) >> 8) * (1.0f / 16777216.0f);
}

uint64_t osp_rng_entropy_seed(void) {
    uint64_t s;
    if (getrandom(&s, sizeof s, 0) == (ssize_t)sizeof s) return s;
    /* Fallback: clock plus a process-wide counter, mixed through Philox. */
    static atomic_uint_fast64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const uint64_t c = atomic_fetch_add(&counter, 1);
    const uint32_t ctr[4] = {(uint32_t)ts.tv_nsec, (uint32_t)ts.tv_sec, (uint32_t)c, (uint32_t)(c >> 32)};
    const uint32_t key[2] = {0x6f737072u, 0x65790000u};
    uint32_t out[4];
    osp_philox4x32_10(ctr, key, out);
    return (uint64_t)out[0] | (uint64_t)out[1] << 32;
}
