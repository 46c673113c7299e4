/* The host's monotonic clock in seconds (CLOCK_MONOTONIC, POSIX clock_gettime): the one clock of the
 * engine's step timings, the step timeline (engine/timeline.h) and the CUDA backend's timeline events,
 * so their readings compare. Header-only. */
#ifndef OSP_CORE_CLOCK_H
#define OSP_CORE_CLOCK_H

#include <time.h>

static inline double osp_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
