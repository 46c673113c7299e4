/* Verification rules of speculative decoding (see verify.h for the argument that both are lossless). */
#include "spec/verify.h"

#include <stddef.h>

int32_t osp_spec_verify_point(const int32_t *draft, int32_t num_spec, const int32_t *target) {
    int32_t a = 0;
    while (a < num_spec && draft[a] == target[a]) a++;
    return a;
}

/* The token at u (in [0, 1)) of the cumulative distribution w [n] / sum (sum > 0). */
static int32_t draw(const float *w, const float *sub, int32_t n, double sum, double u) {
    const double target = u * sum;
    double acc = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        const double v = sub ? (double)w[i] - (double)sub[i] : (double)w[i];
        if (v <= 0) continue;
        acc += v;
        last = i;
        if (target < acc) return i;
    }
    return last >= 0 ? last : 0; /* rounding: the last token with mass */
}

int32_t osp_spec_accept_or_resample(const float *p, const float *q, int32_t n, int32_t x, double u_accept,
                                    double u_resample, bool *accepted) {
    if (u_accept * (double)q[x] < (double)p[x]) {
        *accepted = true;
        return x;
    }
    *accepted = false;
    double res = 0;
    for (int32_t i = 0; i < n; i++)
        if (p[i] > q[i]) res += (double)p[i] - (double)q[i];
    if (res > 0) return draw(p, q, n, res, u_resample);
    double sp = 0;
    for (int32_t i = 0; i < n; i++) sp += p[i] > 0 ? p[i] : 0;
    return draw(p, NULL, n, sp, u_resample);
}
