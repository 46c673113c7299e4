/* Sorting-free top-k / top-p / min-p sampling by rejection.
 *
 * Source: FlashInfer's sampling kernels (flashinfer/sampling.cuh; "Sorting-Free GPU Kernels for LLM
 * Sampling", FlashInfer blog, 2025): draw from the current distribution, test the draw against the
 * filter with a pivot, raise the pivot and draw again (dual-pivot rejection sampling). Here on the
 * CPU, one row at a time; the passes are plain loops the compiler vectorizes.
 *
 * Every filter keeps an upper set {w >= t} of the weights, and whether a token with weight v is
 * kept depends on v alone (ties are all in or all out), through
 *     C(v) = #{i : w_i > v}   and   S(v) = sum{w_i : w_i > v}
 * top-k keeps v iff C(v) < k, top-p keeps v iff S(v) < top_p * (mass kept so far) or v is the max.
 * Both tests are monotone: if v fails, every v' <= v fails. Rejection round (state: a pivot `lo`
 * below which nothing is kept, and `hi`, a value known to pass):
 *   1. draw j from w restricted to {w > lo} (inverse CDF with one uniform);
 *   2. one pass computes C, S at pivot0 = w_j and at pivot1 = (w_j + hi) / 2;
 *   3. if w_j passes, return j; else if pivot1 passes, lo = w_j and hi = pivot1; else lo = pivot1.
 * Why it is exact: conditioned on landing in F (which is a subset of {w > lo} at every round), a draw
 * from w restricted to {w > lo} is distributed as w restricted to F; a rejected round only removes
 * tokens that are certainly outside F. Each round removes at least the drawn token; after
 * OSP_REJECT_MAX_ROUNDS rounds the remaining candidates are sorted and cut exactly (fallback).
 *
 * Order and combination (vLLM V1): min-p first (a known threshold min_p * max, so it just sets the
 * first pivot), then top-k, then top-p on the renormalized top-k distribution. When top-k and top-p
 * are both on, top-k's threshold (the k-th largest weight) is found first, exactly and without
 * sorting, by radix select over the float bit patterns (three histogram passes; the role of
 * FlashInfer's top_k_renorm_probs before top_p_sampling in vLLM's top_k_first order); then
 * top-p runs by rejection inside it. Ties: top-k keeps every token tied with the k-th largest (vLLM's
 * `logits < kth_value` mask); top-p keeps a whole tie group when the mass strictly above it is below
 * top_p, i.e. FlashInfer's test (vLLM's sort-based path cuts inside a tie group in sort order).
 *
 * top_k = 1 and top_p = 0 keep only the maximum and its ties, which are drawn from directly.
 *
 * Passes shrink: once the candidates {w > lo} are under half of the working array, they are
 * compacted in place (w and ids), so later rounds scan only them. Exact up to float rounding of the
 * masses (float lanes within blocks of 512 weights, double across blocks) and the 32-bit uniform. */
#include "sample/reject.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "sample/rng.h"

/* ---- passes ------------------------------------------------------------------------------- */

typedef struct agg2 {
    int64_t c0, c1; /* #{w > p0}, #{w > p1} */
    double m0, m1;  /* sum{w > p0}, sum{w > p1} */
} agg2;

/* Counts and masses above two pivots in one pass. Float lanes over blocks of 512 (so a lane adds at
 * most 64 weights <= 1: relative error ~4e-6), double across blocks. */
static agg2 aggregate2(const float *restrict w, int32_t n, float p0, float p1) {
    agg2 a = {0, 0, 0.0, 0.0};
    for (int32_t b = 0; b < n; b += 512) {
        const int32_t e = n - b < 512 ? n : b + 512;
        float s0[8] = {0}, s1[8] = {0};
        int32_t k0[8] = {0}, k1[8] = {0};
        int32_t i = b;
        for (; i + 8 <= e; i += 8)
            for (int j = 0; j < 8; j++) {
                const float x = w[i + j];
                const int32_t g0 = x > p0, g1 = x > p1;
                s0[j] += g0 ? x : 0.0f;
                s1[j] += g1 ? x : 0.0f;
                k0[j] += g0;
                k1[j] += g1;
            }
        for (; i < e; i++) {
            const float x = w[i];
            if (x > p0) s0[0] += x, k0[0]++;
            if (x > p1) s1[0] += x, k1[0]++;
        }
        for (int j = 0; j < 8; j++) a.m0 += s0[j], a.m1 += s1[j], a.c0 += k0[j], a.c1 += k1[j];
    }
    return a;
}

/* Index of the token where the running mass of {w > lo} first exceeds `target` (inverse CDF).
 * Blocks of 64 are summed first (vectorized) and only the block that crosses is scanned. If rounding
 * leaves target beyond the total, the last candidate is returned. There is at least one candidate. */
static int32_t draw_index(const float *restrict w, int32_t n, float lo, double target) {
    double acc = 0.0;
    for (int32_t b = 0; b < n; b += 64) {
        const int32_t e = n - b < 64 ? n : b + 64;
        float s[8] = {0};
        int32_t i = b;
        for (; i + 8 <= e; i += 8)
            for (int j = 0; j < 8; j++) s[j] += w[i + j] > lo ? w[i + j] : 0.0f;
        for (; i < e; i++) s[0] += w[i] > lo ? w[i] : 0.0f;
        const double bs = (double)(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])));
        if (acc + bs > target) {
            for (i = b; i < e; i++)
                if (w[i] > lo) {
                    acc += w[i];
                    if (acc > target) return i;
                }
        } else {
            acc += bs;
        }
    }
    for (int32_t i = n - 1; i > 0; i--)
        if (w[i] > lo) return i;
    return 0;
}

/* Moves the candidates {w > lo} to the front of w (and their ids to the front of ids); returns how
 * many. `have_ids` false means ids are implicit (index) and get written now. */
static int32_t compact(float *restrict w, int32_t *restrict ids, int32_t n, float lo, bool have_ids) {
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++)
        if (w[i] > lo) {
            w[m] = w[i];
            ids[m] = have_ids ? ids[i] : i;
            m++;
        }
    return m;
}

/* ---- exact cut by sorting (fallback) ------------------------------------------------------ */

/* Order: weight descending, id ascending. */
static bool before(float wa, int32_t ia, float wb, int32_t ib) { return wa > wb || (wa == wb && ia < ib); }

static void sift(float *w, int32_t *id, int32_t root, int32_t n) {
    for (;;) {
        int32_t c = 2 * root + 1;
        if (c >= n) return;
        /* min-heap by `before`, so popping to the end leaves the array in `before` order */
        if (c + 1 < n && before(w[c], id[c], w[c + 1], id[c + 1])) c++;
        if (!before(w[root], id[root], w[c], id[c])) return;
        /* the child comes later in the order than the root: swap to keep the heap "latest on top" */
        float tw = w[c];
        w[c] = w[root], w[root] = tw;
        int32_t ti = id[c];
        id[c] = id[root], id[root] = ti;
        root = c;
    }
}

/* Heapsort of parallel arrays into `before` order (no allocation; O(m log m)). */
static void heapsort_desc(float *w, int32_t *id, int32_t m) {
    for (int32_t i = m / 2 - 1; i >= 0; i--) sift(w, id, i, m);
    for (int32_t end = m - 1; end > 0; end--) {
        float tw = w[0];
        w[0] = w[end], w[end] = tw;
        int32_t ti = id[0];
        id[0] = id[end], id[end] = ti;
        sift(w, id, 0, end);
    }
}

/* Sorted candidates w[0..m) (ids alongside, upper set of all weights): cut by top-k (k <= 0 off),
 * then top-p (top_p >= 1 off) on the renormalized rest, draw with u in [0, 1). */
static int32_t exact_pick(float *w, int32_t *id, int32_t m, int32_t k, double top_p, double u) {
    heapsort_desc(w, id, m);
    int32_t end = m;
    if (k > 0 && k < m) {
        end = k;
        while (end < m && w[end] == w[k - 1]) end++;
    }
    double mass = 0.0;
    for (int32_t i = 0; i < end; i++) mass += w[i];
    if (top_p < 1.0) {
        const double target = top_p * mass;
        double above = 0.0;
        int32_t i = 0;
        while (i < end) {
            int32_t g = i;
            double gm = 0.0;
            while (g < end && w[g] == w[i]) gm += w[g], g++;
            if (!(above < target) && i > 0) break;
            above += gm;
            i = g;
        }
        end = i;
        mass = above;
    }
    const double t = u * mass;
    double acc = 0.0;
    for (int32_t i = 0; i < end; i++) {
        acc += w[i];
        if (acc > t) return id[i];
    }
    return id[end - 1];
}

int32_t osp_reject_sample_sorted(float *w, int32_t *ids, int32_t n, int32_t top_k, float top_p, float min_p,
                                 const osp_rng_addr *rng) {
    const float lo = min_p > 0.0f ? nextafterf(fminf(min_p, 1.0f), 0.0f) : 0.0f;
    const int32_t m = compact(w, ids, n, lo, false);
    return exact_pick(w, ids, m, top_k, top_p,
                      osp_rng_uniform_at(rng->seed, rng->sample_index, rng->position, OSP_REJECT_MAX_ROUNDS));
}

/* ---- the rejection sampler ---------------------------------------------------------------- */

static inline uint32_t fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline float bitsf(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Working view: w[0..n) with ids (implicit until the first compaction). */
typedef struct view {
    float *w;
    int32_t *ids;
    int32_t n;
    bool have_ids;
} view;

static inline int32_t view_id(const view *v, int32_t i) { return v->have_ids ? v->ids[i] : i; }

/* Compacts to {w > lo} when those are under half of the view (and the view is not tiny). */
static void maybe_compact(view *v, float lo, int64_t count_lo) {
    if (v->n > 256 && count_lo * 2 < v->n) {
        v->n = compact(v->w, v->ids, v->n, lo, v->have_ids);
        v->have_ids = true;
    }
}

/* The k-th largest weight among {w > lo} (count_lo of them, count_lo > k), exactly, by radix select
 * on the float bit patterns (for w >= 0 they order like the values): a histogram of the top bits
 * (>> 20: sign, exponent, 3 mantissa bits) finds the bucket holding the k-th largest, the view is
 * compacted to that bucket and above (a superset of the top-k set), and two more histograms of
 * 10 bits each, over that bucket only, pin the value down. One full pass plus one compaction; the
 * later passes see a few hundred values. */
static float kth_largest(view *v, float lo, int32_t k) {
    uint32_t h[1024];
    uint32_t prefix = 0; /* bits of the k-th value fixed so far (above `shift`) */
    int32_t need = k;    /* its rank among the values that share the prefix */
    static const int shifts[3] = {20, 10, 0};
    for (int level = 0; level < 3; level++) {
        const int sh = shifts[level];
        const uint32_t pre_sh = sh + 10;
        memset(h, 0, sizeof h);
        for (int32_t i = 0; i < v->n; i++) {
            const float x = v->w[i];
            const uint32_t b = fbits(x);
            if (x > lo && (level == 0 || (b >> pre_sh) == prefix)) h[(b >> sh) & 1023u]++;
        }
        int32_t bucket = 1023;
        for (; bucket > 0; bucket--) {
            if ((int64_t)h[bucket] >= need) break;
            need -= (int32_t)h[bucket];
        }
        prefix = (prefix << 10) | (uint32_t)bucket;
        if (level == 0) {
            /* keep the bucket and everything above it */
            const uint32_t first = prefix << 20;
            const float below = first ? bitsf(first - 1) : 0.0f;
            if (below > lo) lo = below;
            int64_t count = 0;
            for (int32_t bb = bucket; bb < 1024; bb++) count += h[bb];
            maybe_compact(v, lo, count);
        }
    }
    return bitsf(prefix);
}

int32_t osp_reject_sample(float *w, int32_t *ids, int32_t n, int32_t top_k, float top_p, float min_p,
                          const osp_rng_addr *rng, int32_t *rounds) {
    return osp_reject_sample_ex(w, ids, n, top_k, top_p, min_p, rng, OSP_REJECT_MAX_ROUNDS, rounds);
}

int32_t osp_reject_sample_ex(float *w, int32_t *ids, int32_t n, int32_t top_k, float top_p, float min_p,
                             const osp_rng_addr *rng, int32_t max_rounds, int32_t *rounds) {
    view v = {w, ids, n, false};
    if (rounds) *rounds = 0;
    /* min-p: a known threshold (max w is 1), so it is the first pivot: candidates are {w > lo}. */
    float lo = min_p > 0.0f ? nextafterf(fminf(min_p, 1.0f), 0.0f) : 0.0f;
    agg2 g = aggregate2(v.w, v.n, lo, lo);
    int64_t count_lo = g.c0;
    double mass_lo = g.m0;
    bool p_on = top_p < 1.0f;
    int32_t k = top_k > 0 && top_k < count_lo ? top_k : 0;
    if (k == 1 || (p_on && top_p <= 0.0f)) {
        /* only the maximum (and its ties) can be kept: make it the candidate set, draw once */
        lo = nextafterf(1.0f, 0.0f);
        g = aggregate2(v.w, v.n, lo, lo);
        count_lo = g.c0, mass_lo = g.m0;
        k = 0, p_on = false;
    }
    if (k && p_on) {
        /* top-k first: fold its threshold into the pivot, then top-p by rejection inside it */
        const float t = kth_largest(&v, lo, k);
        lo = nextafterf(t, 0.0f);
        g = aggregate2(v.w, v.n, lo, lo);
        count_lo = g.c0, mass_lo = g.m0;
        k = 0;
    }
    const double target = p_on ? (double)top_p * mass_lo : 0.0;
    float hi = 1.0f;
    for (int32_t r = 0; r < max_rounds; r++) {
        const double u = osp_rng_uniform_at(rng->seed, rng->sample_index, rng->position, (uint32_t)r);
        maybe_compact(&v, lo, count_lo);
        const int32_t j = draw_index(v.w, v.n, lo, u * mass_lo);
        if (!k && !p_on) return view_id(&v, j); /* min-p only (or nothing): one draw */
        const float q = v.w[j];
        if (rounds) *rounds = r + 1;
        float p1 = 0.5f * (q + hi);
        g = aggregate2(v.w, v.n, q, p1);
        const bool acc0 = (!k || g.c0 < k) && (!p_on || g.m0 < target || q >= 1.0f);
        if (acc0) return view_id(&v, j);
        const bool acc1 = (!k || g.c1 < k) && (!p_on || g.m1 < target || p1 >= 1.0f);
        if (acc1) lo = q, hi = p1, count_lo = g.c0, mass_lo = g.m0;
        else lo = p1, count_lo = g.c1, mass_lo = g.m1;
    }
    /* Exact fallback on what is left: every kept token is in {w > lo}, an upper set, so counts and
     * masses above any candidate are the same within it as over the whole row. */
    if (rounds) *rounds = max_rounds + 1;
    const int32_t m = compact(v.w, v.ids, v.n, lo, v.have_ids);
    const double u = osp_rng_uniform_at(rng->seed, rng->sample_index, rng->position, OSP_REJECT_MAX_ROUNDS);
    if (k) return exact_pick(v.w, v.ids, m, k, 1.0f, u);
    /* top-p: the target was fixed against the mass of the top-k/min-p set; express it as a fraction
     * of what is left (the tokens removed were all below the cut, so the cut does not move). */
    double left = 0.0;
    for (int32_t i = 0; i < m; i++) left += v.w[i];
    return exact_pick(v.w, v.ids, m, 0, target / left, u);
}
