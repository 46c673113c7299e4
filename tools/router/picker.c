/* The endpoint picker (see picker.h): filters, min-max normalized scorers, a weighted sum, a
 * rotating tie-break. */
#include "picker.h"

#include <stddef.h>

rt_weights rt_default_weights(void) {
    return (rt_weights){.prefix = 3, .queue = 2, .kv = 1, .active = 1, .hot_queue = 8};
}

static bool candidate(const rt_backend_view *v) { return v->healthy && v->serves_model; }

/* (hi - x) / (hi - lo), 1 when every candidate has the same value */
static double minmax_low_is_good(double x, double lo, double hi) { return hi > lo ? (hi - x) / (hi - lo) : 1.0; }

int32_t rt_pick(const rt_backend_view *b, int32_t n, int32_t total_blocks, const rt_weights *w, uint32_t rr,
                double *scores) {
    double qlo = 0, qhi = 0, alo = 0, ahi = 0;
    bool any = false;
    for (int32_t i = 0; i < n; i++) {
        if (!candidate(&b[i])) continue;
        const double q = b[i].num_waiting, a = (double)b[i].active;
        if (!any || q < qlo) qlo = q;
        if (!any || q > qhi) qhi = q;
        if (!any || a < alo) alo = a;
        if (!any || a > ahi) ahi = a;
        any = true;
    }
    int32_t best = -1;
    double best_score = 0;
    for (int32_t k = 0; k < n; k++) {
        const int32_t i = (int32_t)((rr + (uint32_t)k) % (uint32_t)n);
        if (!candidate(&b[i])) {
            if (scores) scores[i] = -1;
            continue;
        }
        const bool hot = w->hot_queue >= 0 && b[i].num_waiting > w->hot_queue;
        double prefix = 0;
        if (total_blocks > 0 && !hot) {
            const int32_t m = b[i].prefix_blocks < total_blocks ? b[i].prefix_blocks : total_blocks;
            prefix = m > 0 ? (double)m / (double)total_blocks : 0;
        }
        const double kv = b[i].kv_usage < 0 ? 1 : b[i].kv_usage > 1 ? 0 : 1 - b[i].kv_usage;
        const double s = w->prefix * prefix + w->queue * minmax_low_is_good(b[i].num_waiting, qlo, qhi) + w->kv * kv +
                         w->active * minmax_low_is_good((double)b[i].active, alo, ahi);
        if (scores) scores[i] = s;
        if (best < 0 || s > best_score) best = i, best_score = s;
    }
    return best;
}
