/* The sampler on the GPU (cuda_sample.h): one thread block of 512 threads per row, the CPU sampler's
 * steps in the CPU's order and arithmetic (src/sample/sampler.c, reject.c, rng.c, logprobs.c are the
 * spec), so a seeded row draws the same token on either backend except where a sum rounded in a
 * different order lands on the other side of a boundary.
 *
 * Per row (block-uniform control flow; every decision is made by all threads from broadcast values):
 *   1. parameter and id-list checks, then one pass over the raw logits: finiteness, the raw argmax
 *      (lowest id on ties), and a copy into the row's scratch w[] when the row modifies logits;
 *   2. logit_bias (duplicate ids add in list order, as the CPU's loop does), min_tokens (stop ids to
 *      -inf), penalties: the row's count array cnt[] gets the output-id counts (atomicAdd) and a
 *      "seen in the prompt" bit (atomicOr of bit 31); each distinct id is then claimed exactly once by
 *      atomicExch(cnt[id], 0), which also leaves cnt[] zeroed, and penalized with the CPU's
 *      operations (repetition, then frequency + presence);
 *   3. argmax of the processed logits (NaN never wins; w[0] NaN fails the row like the CPU's scan);
 *      temperature < 1e-5: greedy, that argmax;
 *   4. otherwise the weights exp((l - max) / T) with the CPU's Cephes polynomial spelled with
 *      __fmul_rn / __fadd_rn (the CPU is ISO C17, no FMA contraction), so they are bit-identical;
 *   5. reject.c's dual-pivot rejection sampler: min-p as the first pivot, top-k's threshold by radix
 *      select when top-p is also on, rounds r = 0..31 drawing with Philox word (seed, sample_index,
 *      output_pos, r), candidates compacted in place when under half of the view (ids kept in the
 *      count array, which is zeroed again afterwards). The exact fallback after 32 rounds does not
 *      sort: binary searches over the float bit patterns of the weights find top-p's cut (the smallest
 *      weight x whose strictly-higher mass is < top_p * mass) and then the token where the cumulative
 *      mass in (weight descending, id ascending) order crosses u * mass: the CPU's sorted draw;
 *   6. logprobs of the raw logits: log-sum-exp in double, rank = 1 + #strictly higher, top N by N
 *      rounds of block argmax excluding what came before in (value descending, id ascending) order.
 * Sums: each thread accumulates its elements in double in a fixed order and cub's block reductions
 * and scans combine them in a fixed tree, so a row's result depends only on that row (not on the
 * batch, not on the run). The CPU sums in float lanes and double across blocks; the two agree to
 * ~1e-6 relative, which is the only source of different tokens for the same uniforms.
 *
 * Inverse-CDF draws walk the view in chunks of 512 x 8 values: each thread sums its 8, a block scan
 * gives the prefix, and the first thread whose running mass exceeds the target finds the token among
 * its 8. Passes where order does not matter are striped (coalesced, 16 loads in flight per thread).
 *
 * Scratch per row: w [vocab] floats and cnt [vocab] uint32, each padded to 256 bytes. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sample.h"
/* reject.h has no extern "C" guard; only its OSP_REJECT_MAX_ROUNDS is used here */
extern "C" {
#include "sample/reject.h"
}

namespace {

constexpr int kThreads = 512;             /* one block per row */
constexpr int kItems = 8;                 /* consecutive values per thread in ordered (chunked) passes */
constexpr int kUnroll = 16;               /* loads in flight per thread in striped passes */
constexpr int kChunk = kThreads * kItems; /* values per chunk of an ordered pass */
constexpr int kBins = 1024;               /* radix select: 10 bits per level */
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int32_t kMaxVocab = 1 << 30;
static_assert(kBins % kThreads == 0, "radix bins must split evenly over the block");
static_assert(kItems % 4 == 0, "ordered passes load float4s");

/* ---- Philox4x32-10 (rng.c, Salmon et al. SC 2011) ------------------------------------------------ */

__device__ __forceinline__ uint32_t philox_word(uint64_t seed, uint32_t sample_index, uint64_t position,
                                                uint32_t draw) {
    uint32_t c0 = draw / 4u, c1 = (uint32_t)position, c2 = (uint32_t)(position >> 32), c3 = sample_index;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    const uint32_t w = draw % 4u;
    return w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
}

/* osp_rng_uniform_at: k * 2^-32, exact in double. */
__device__ __forceinline__ double uniform_at(uint64_t seed, uint32_t sample_index, uint64_t position, uint32_t draw) {
    return (double)philox_word(seed, sample_index, position, draw) * (1.0 / 4294967296.0);
}

/* ---- sampler.c's exp_shifted, operation for operation ------------------------------------------ */

__device__ __forceinline__ float exp_shifted(float w, float mx, float inv_t) {
    float x = __fmul_rn(__fsub_rn(w, mx), inv_t);
    const bool under = !(x >= -87.0f); /* also -inf and NaN */
    x = under ? 0.0f : x;
    const float t = __fadd_rn(__fmul_rn(x, 1.44269504088896341f), 12582912.0f);
    const float nf = __fsub_rn(t, 12582912.0f);
    const int32_t ni = __float_as_int(t) - 0x4B400000;
    const float r = __fadd_rn(__fsub_rn(x, __fmul_rn(nf, 0.693359375f)), __fmul_rn(nf, 2.12194440e-4f));
    float q = 1.9875691500e-4f;
    q = __fadd_rn(__fmul_rn(q, r), 1.3981999507e-3f);
    q = __fadd_rn(__fmul_rn(q, r), 8.3334519073e-3f);
    q = __fadd_rn(__fmul_rn(q, r), 4.1665795894e-2f);
    q = __fadd_rn(__fmul_rn(q, r), 1.6666665459e-1f);
    q = __fadd_rn(__fmul_rn(q, r), 5.0000001201e-1f);
    q = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(q, r), r), r), 1.0f);
    const float scale = __int_as_float((ni + 127) << 23);
    return under ? 0.0f : __fmul_rn(q, scale);
}

/* ---- block-wide reductions and scans (fixed order: deterministic) ------------------------------- */

struct ArgMax { /* i < 0: empty; v is never NaN */
    float v;
    int i;
};
struct ArgMaxOp { /* larger value, then lower id */
    __device__ ArgMax operator()(const ArgMax &a, const ArgMax &b) const {
        if (a.i < 0) return b;
        if (b.i < 0) return a;
        if (a.v != b.v) return a.v > b.v ? a : b;
        return a.i < b.i ? a : b;
    }
};

struct Agg { /* counts and masses above two pivots */
    int c0, c1;
    double m0, m1;
};
struct AggOp {
    __device__ Agg operator()(const Agg &a, const Agg &b) const {
        return Agg{a.c0 + b.c0, a.c1 + b.c1, a.m0 + b.m0, a.m1 + b.m1};
    }
};

struct LpAgg {
    double sum;
    int above;
};
struct LpAggOp {
    __device__ LpAgg operator()(const LpAgg &a, const LpAgg &b) const { return LpAgg{a.sum + b.sum, a.above + b.above}; }
};

struct MaxIntOp {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct MinIntOp {
    __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};

union TempStorage {
    cub::BlockReduce<ArgMax, kThreads>::TempStorage r_argmax;
    cub::BlockReduce<Agg, kThreads>::TempStorage r_agg;
    cub::BlockReduce<LpAgg, kThreads>::TempStorage r_lp;
    cub::BlockReduce<int, kThreads>::TempStorage r_int;
    cub::BlockScan<double, kThreads>::TempStorage s_double;
    cub::BlockScan<int, kThreads>::TempStorage s_int;
};

struct Shared {
    TempStorage tmp;
    uint32_t hist[kBins];
    int bcast[3];
};

/* The reduction of x over the block, returned to every thread. All threads must call it. */
template <typename T, typename Op>
__device__ T block_reduce(T x, Op op, Shared &s) {
    using R = cub::BlockReduce<T, kThreads>;
    static_assert(sizeof(typename R::TempStorage) <= sizeof(TempStorage), "add the type to TempStorage");
    __shared__ T result;
    T r = R(*reinterpret_cast<typename R::TempStorage *>(&s.tmp)).Reduce(x, op);
    if (threadIdx.x == 0) result = r;
    __syncthreads();
    r = result;
    __syncthreads(); /* result and the temp storage are free again */
    return r;
}

/* Exclusive prefix sum over threads in thread order; *total gets the sum of all. */
template <typename T>
__device__ T block_exclusive_sum(T x, T *total, Shared &s) {
    using S = cub::BlockScan<T, kThreads>;
    static_assert(sizeof(typename S::TempStorage) <= sizeof(TempStorage), "add the type to TempStorage");
    T out, agg;
    S(*reinterpret_cast<typename S::TempStorage *>(&s.tmp)).ExclusiveSum(x, out, agg);
    __syncthreads();
    *total = agg;
    return out;
}

/* ---- the working view (reject.c's `view`) --------------------------------------------------------- */

/* w[0..n): the weights, candidates compacted to the front; ids[i] their token ids once have_ids
 * (otherwise the id is i). ids is the row's count array: ids_used entries are zeroed on exit. */
struct View {
    float *w;
    int32_t *ids;
    int n;
    bool have_ids;
    int ids_used;
};

__device__ __forceinline__ int view_id(const View &v, int i) { return v.have_ids ? v.ids[i] : i; }

/* f(i, x[i]) for the i < n this thread owns in a striped pass (i = tid, tid + 512, ...), in
 * increasing i (so per-thread sums have a fixed order and strict > keeps the lowest id), the loads
 * issued kUnroll at a time to keep enough bytes in flight. */
template <typename F>
__device__ __forceinline__ void for_each(const float *x, int n, F f) {
    for (int base = threadIdx.x; base < n; base += kUnroll * kThreads) {
        float v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int i = base + u * kThreads;
            v[u] = i < n ? x[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int i = base + u * kThreads;
            if (i < n) f(i, v[u]);
        }
    }
}

/* The kItems values a[first..first+kItems) (0 past n) of an ordered pass; first is a multiple of
 * kItems and a is 16-byte aligned (256 in the scratch), so whole groups load as float4s. */
template <typename T, typename T4>
__device__ __forceinline__ void load_items(const T *a, int n, int first, T x[kItems]) {
    if (first + kItems <= n) {
#pragma unroll
        for (int q = 0; q < kItems / 4; q++) {
            const T4 v = reinterpret_cast<const T4 *>(a + first)[q];
            x[4 * q] = v.x, x[4 * q + 1] = v.y, x[4 * q + 2] = v.z, x[4 * q + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < kItems; j++) x[j] = first + j < n ? a[first + j] : (T)0;
    }
}

/* Counts and masses of the view above p0 and above p1 (reject.c's aggregate2). */
__device__ Agg aggregate2(const View &v, float p0, float p1, Shared &s) {
    Agg a{0, 0, 0.0, 0.0};
    for_each(v.w, v.n, [&](int, float x) {
        if (x > p0) a.c0++, a.m0 += (double)x;
        if (x > p1) a.c1++, a.m1 += (double)x;
    });
    return block_reduce(a, AggOp(), s);
}

/* Moves the candidates {w > lo} to the front, keeping their order (stable, in place: a chunk is read
 * entirely before any of it is written, and writes never pass the chunk being read). */
__device__ void compact(View &v, float lo, Shared &s) {
    int m = 0;
    for (int base = 0; base < v.n; base += kChunk) {
        const int first = base + (int)threadIdx.x * kItems;
        float x[kItems];
        int id[kItems];
        load_items<float, float4>(v.w, v.n, first, x);
        if (v.have_ids) load_items<int, int4>(v.ids, v.n, first, id);
        int cnt = 0;
#pragma unroll
        for (int j = 0; j < kItems; j++) {
            if (!v.have_ids) id[j] = first + j;
            cnt += x[j] > lo; /* padding is 0, never > lo >= 0 */
        }
        int total;
        int pos = m + block_exclusive_sum(cnt, &total, s); /* every thread has read its chunk */
#pragma unroll
        for (int j = 0; j < kItems; j++)
            if (x[j] > lo) {
                v.w[pos] = x[j];
                v.ids[pos] = id[j];
                pos++;
            }
        m += total;
    }
    __syncthreads(); /* the compacted view is visible to every thread */
    v.n = m;
    v.have_ids = true;
    v.ids_used = v.ids_used > m ? v.ids_used : m;
}

/* reject.c's rule: compact when the candidates are under half of a view of more than 256. */
__device__ void maybe_compact(View &v, float lo, int count_lo, Shared &s) {
    if (v.n > 256 && 2ll * count_lo < (long long)v.n) compact(v, lo, s);
}

/* The view position where the running mass of {w > lo}, in view order, first exceeds target (inverse
 * CDF); the last candidate if rounding leaves target beyond the total (0 if there is none). */
__device__ int draw_index(const View &v, float lo, double target, Shared &s) {
    double running = 0.0;
    for (int base = 0; base < v.n; base += kChunk) {
        const int first = base + (int)threadIdx.x * kItems;
        float x[kItems];
        load_items<float, float4>(v.w, v.n, first, x);
        double tsum = 0.0;
#pragma unroll
        for (int j = 0; j < kItems; j++) {
            x[j] = x[j] > lo ? x[j] : 0.0f;
            tsum += (double)x[j];
        }
        double total;
        const double excl = running + block_exclusive_sum(tsum, &total, s);
        if (running + total > target) { /* block-uniform: the crossing is in this chunk */
            int owner = block_reduce(tsum > 0.0 && excl + tsum > target ? (int)threadIdx.x : kThreads, MinIntOp(), s);
            if (owner == kThreads) /* rounding: the prefix sums disagree by an ulp; take the last mass */
                owner = block_reduce(tsum > 0.0 ? (int)threadIdx.x : -1, MaxIntOp(), s);
            if ((int)threadIdx.x == owner) {
                double acc = excl;
                int pick = first;
#pragma unroll
                for (int j = 0; j < kItems; j++)
                    if (x[j] > 0.0f && !(acc > target)) {
                        acc += (double)x[j];
                        pick = first + j; /* the crossing, or the thread's last candidate */
                    }
                s.bcast[0] = pick;
            }
            __syncthreads();
            const int j = s.bcast[0];
            __syncthreads();
            return j;
        }
        running += total;
    }
    int last = -1;
    for_each(v.w, v.n, [&](int i, float x) {
        if (x > lo) last = i;
    });
    last = block_reduce(last, MaxIntOp(), s);
    return last > 0 ? last : 0;
}

/* The k-th largest weight among {w > lo} (more than k of them), exactly: reject.c's radix select on
 * the float bit patterns, three levels of 10 bits, compacting the view after the first level. */
__device__ float kth_largest(View &v, float lo, int k, Shared &s) {
    uint32_t prefix = 0; /* bits of the k-th value fixed so far */
    int need = k;        /* its rank among the values that share the prefix */
    for (int level = 0; level < 3; level++) {
        const int sh = 20 - 10 * level;
        for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
        __syncthreads();
        for_each(v.w, v.n, [&](int, float x) {
            const uint32_t bits = __float_as_uint(x);
            if (x > lo && (level == 0 || (bits >> (sh + 10)) == prefix)) atomicAdd(&s.hist[(bits >> sh) & 1023u], 1u);
        });
        __syncthreads();
        /* bins in descending order: thread t holds positions t * kBinsPerThread + j */
        int h[kBinsPerThread], hs = 0;
#pragma unroll
        for (int j = 0; j < kBinsPerThread; j++) {
            h[j] = (int)s.hist[kBins - 1 - ((int)threadIdx.x * kBinsPerThread + j)];
            hs += h[j];
        }
        int total;
        int excl = block_exclusive_sum(hs, &total, s);
#pragma unroll
        for (int j = 0; j < kBinsPerThread; j++) {
            const int b = kBins - 1 - ((int)threadIdx.x * kBinsPerThread + j);
            const int incl = excl + h[j];
            /* the first bin (from the top) where the count reaches `need`; bin 0 if none does (the
             * CPU's loop stops there): exactly one thread writes */
            if ((incl >= need || b == 0) && excl < need) s.bcast[0] = b, s.bcast[1] = need - excl, s.bcast[2] = incl;
            excl = incl;
        }
        __syncthreads();
        const int bucket = s.bcast[0], at_or_above = s.bcast[2];
        need = s.bcast[1];
        __syncthreads();
        prefix = (prefix << 10) | (uint32_t)bucket;
        if (level == 0) { /* keep the bucket and everything above it */
            const uint32_t first = prefix << 20;
            const float below = first ? __uint_as_float(first - 1u) : 0.0f;
            if (below > lo) lo = below;
            maybe_compact(v, lo, at_or_above, s);
        }
    }
    return __uint_as_float(prefix);
}

/* View position of the m-th (0-based, view order) weight equal to `value`, or -1. */
__device__ int nth_equal(const View &v, float value, int m, Shared &s) {
    int running = 0;
    for (int base = 0; base < v.n; base += kChunk) {
        const int first = base + (int)threadIdx.x * kItems;
        float x[kItems];
        load_items<float, float4>(v.w, v.n, first, x);
        int cnt = 0;
#pragma unroll
        for (int j = 0; j < kItems; j++) cnt += first + j < v.n && x[j] == value;
        int total;
        const int excl = running + block_exclusive_sum(cnt, &total, s);
        if (running + total > m) {
            if (excl <= m && m < excl + cnt) {
                int left = m - excl;
#pragma unroll
                for (int j = 0; j < kItems; j++)
                    if (first + j < v.n && x[j] == value) {
                        if (left == 0) s.bcast[0] = first + j;
                        left--;
                    }
            }
            __syncthreads();
            const int j = s.bcast[0];
            __syncthreads();
            return j;
        }
        running += total;
    }
    return -1;
}

/* reject.c's exact_pick without sorting: among {w > cut}, the token where the cumulative mass in
 * (weight descending, id ascending) order first exceeds u * mass. A binary search over the float
 * bit patterns finds the largest weight value x with mass{w >= x} > u * mass (a candidate's value);
 * within its tie group (view order = id order) the member is the one the CPU's running sum reaches. */
__device__ int sorted_draw(const View &v, float cut, double u, Shared &s) {
    const Agg g = aggregate2(v, cut, cut, s);
    const double t = u * g.m0;
    uint32_t a = __float_as_uint(cut) + 1u, b = __float_as_uint(1.0f); /* mass{w >= a} = g.m0 > t */
    while (a < b) {
        const uint32_t mid = a + (b - a + 1u) / 2u;
        const float x = __uint_as_float(mid);
        const Agg h = aggregate2(v, nextafterf(x, 0.0f), x, s);
        if (h.m0 > t) a = mid;
        else b = mid - 1u;
    }
    const float val = __uint_as_float(a);
    const Agg h = aggregate2(v, val, nextafterf(val, 0.0f), s); /* m0: mass above val; c1 - c0: ties */
    const int neq = h.c1 - h.c0;
    const double d = (t - h.m0) / (double)val;
    const int m = !(d > 0.0) ? 0 : d >= (double)(neq - 1) ? (neq > 0 ? neq - 1 : 0) : (int)floor(d);
    const int j = neq > 0 ? nth_equal(v, val, m, s) : -1;
    return view_id(v, j >= 0 ? j : draw_index(v, cut, t, s)); /* the second arm is unreachable */
}

/* reject.c's osp_reject_sample_ex on the view (weights with max exactly 1), the mass and count of
 * {w > lo} already known from the exponentiation pass. Returns the token id; *rounds as the CPU's. */
__device__ int reject_sample(View &v, int top_k, float top_p, float lo, int count_lo, double mass_lo,
                             uint64_t seed, uint32_t sample_index, uint64_t position, int max_rounds, int *rounds,
                             Shared &s) {
    *rounds = 0;
    bool p_on = top_p < 1.0f;
    int k = top_k > 0 && top_k < count_lo ? top_k : 0;
    if (k == 1 || (p_on && top_p <= 0.0f)) { /* only the maximum and its ties */
        lo = nextafterf(1.0f, 0.0f);
        const Agg g = aggregate2(v, lo, lo, s);
        count_lo = g.c0, mass_lo = g.m0;
        k = 0, p_on = false;
    }
    if (k && p_on) { /* top-k first: its threshold becomes the pivot, top-p by rejection inside it */
        const float t = kth_largest(v, lo, k, s);
        lo = nextafterf(t, 0.0f);
        const Agg g = aggregate2(v, lo, lo, s);
        count_lo = g.c0, mass_lo = g.m0;
        k = 0;
    }
    const double target = p_on ? (double)top_p * mass_lo : 0.0;
    float hi = 1.0f;
    for (int r = 0; r < max_rounds; r++) {
        const double u = uniform_at(seed, sample_index, position, (uint32_t)r);
        maybe_compact(v, lo, count_lo, s);
        const int j = draw_index(v, lo, u * mass_lo, s);
        if (!k && !p_on) return view_id(v, j); /* min-p only (or nothing): one draw */
        const float q = v.w[j];
        *rounds = r + 1;
        const float p1 = __fmul_rn(0.5f, __fadd_rn(q, hi));
        const Agg g = aggregate2(v, q, p1, s);
        const bool acc0 = (!k || g.c0 < k) && (!p_on || g.m0 < target || q >= 1.0f);
        if (acc0) return view_id(v, j);
        const bool acc1 = (!k || g.c1 < k) && (!p_on || g.m1 < target || p1 >= 1.0f);
        if (acc1) lo = q, hi = p1, count_lo = g.c0, mass_lo = g.m0;
        else lo = p1, count_lo = g.c1, mass_lo = g.m1;
    }
    /* exact fallback on {w > lo}, an upper set holding every kept token */
    *rounds = max_rounds + 1;
    compact(v, lo, s);
    const double u = uniform_at(seed, sample_index, position, OSP_REJECT_MAX_ROUNDS);
    float cut = lo;
    if (k) {
        if (v.n > k) cut = nextafterf(kth_largest(v, lo, k, s), 0.0f);
    } else if (p_on) {
        /* the smallest x with mass{w > x} < target (mass measured over the whole filtered set: the
         * tokens removed so far all lie below the cut); it is kept, everything below is not */
        uint32_t a = __float_as_uint(lo) + 1u, b = __float_as_uint(1.0f);
        while (a < b) {
            const uint32_t mid = a + (b - a) / 2u;
            const float x = __uint_as_float(mid);
            if (aggregate2(v, x, x, s).m0 < target) b = mid;
            else a = mid + 1u;
        }
        cut = nextafterf(__uint_as_float(a), 0.0f);
    }
    return sorted_draw(v, cut, u, s);
}

/* ---- logprobs (logprobs.c) ------------------------------------------------------------------------ */

__device__ __forceinline__ float floor_lp(double x) {
    return x < (double)OSP_LOGPROB_FLOOR ? OSP_LOGPROB_FLOOR : (float)x;
}

__device__ void fill_logprobs(const float *x, int vocab, int token, int num_top, float mx, osp_logprobs *out,
                              Shared &s) {
    const float chosen = x[token];
    LpAgg a{0.0, 0};
    for_each(x, vocab, [&](int, float xi) {
        a.sum += exp((double)__fsub_rn(xi, mx));
        a.above += xi > chosen;
    });
    a = block_reduce(a, LpAggOp(), s);
    const double lse = (double)mx + log(a.sum);
    const int n = num_top < vocab ? num_top : vocab;
    ArgMax prev{0.0f, -1};
    for (int j = 0; j < n; j++) {
        /* the next in (value descending, id ascending) order after prev */
        ArgMax am{0.0f, -1};
        for_each(x, vocab, [&](int i, float xi) {
            const bool after = prev.i < 0 || xi < prev.v || (xi == prev.v && i > prev.i);
            if (after && (am.i < 0 || xi > am.v)) am = ArgMax{xi, i};
        });
        am = block_reduce(am, ArgMaxOp(), s);
        if (threadIdx.x == 0) {
            out->top_ids[j] = am.i;
            out->top_logprobs[j] = floor_lp((double)am.v - lse);
        }
        prev = am;
    }
    if (threadIdx.x == 0) {
        out->token_id = token;
        out->logprob = floor_lp((double)chosen - lse);
        out->rank = a.above + 1;
        out->n_top = n;
    }
}

/* ---- the row ------------------------------------------------------------------------------------- */

__device__ __forceinline__ bool list_ok(int32_t n, int32_t off, const void *base) {
    return n >= 0 && (n == 0 || (base != nullptr && off >= 0));
}

/* sampler.c's check_params, plus what the packed form adds (offsets, logits_row >= 0). */
__device__ bool params_ok(const osp_cuda_sample_row &p, int32_t vocab, const int32_t *ids, const int32_t *bias_ids,
                          const float *bias_vals) {
    const bool scalars = p.temperature >= 0.0f && !isinf(p.temperature) && p.top_k >= -1 && p.top_p >= 0.0f &&
                         p.top_p <= 1.0f && p.min_p >= 0.0f && p.min_p <= 1.0f && isfinite(p.presence_penalty) &&
                         isfinite(p.frequency_penalty) && p.repetition_penalty > 0.0f &&
                         !isinf(p.repetition_penalty) && p.num_logprobs >= -1 &&
                         p.num_logprobs <= OSP_MAX_LOGPROBS && p.logits_row >= 0 &&
                         list_ok(p.n_bias, p.bias_off, bias_ids) && (p.n_bias == 0 || bias_vals != nullptr) &&
                         list_ok(p.n_stop, p.stop_off, ids) && list_ok(p.n_prompt, p.prompt_off, ids) &&
                         list_ok(p.n_output, p.output_off, ids);
    if (!scalars) return false; /* block-uniform */
    bool bad = false;
    for (int e = threadIdx.x; e < p.n_bias; e += kThreads) {
        const int32_t id = bias_ids[(int64_t)p.bias_off + e];
        bad |= id < 0 || id >= vocab || !isfinite(bias_vals[(int64_t)p.bias_off + e]);
    }
    const int32_t offs[3] = {p.stop_off, p.prompt_off, p.output_off}, ns[3] = {p.n_stop, p.n_prompt, p.n_output};
    for (int l = 0; l < 3; l++)
        for (int e = threadIdx.x; e < ns[l]; e += kThreads) {
            const int32_t id = ids[(int64_t)offs[l] + e];
            bad |= id < 0 || id >= vocab;
        }
    return !__syncthreads_or(bad);
}

/* Bias, min_tokens and penalties on w (sampler.c's process_logits), cnt all zero on entry and exit. */
__device__ void process_logits(const osp_cuda_sample_row &p, float *w, uint32_t *cnt, const int32_t *ids,
                               const int32_t *bias_ids, const float *bias_vals) {
    if (p.n_bias > 0) {
        const int32_t *bid = bias_ids + p.bias_off;
        const float *bv = bias_vals + p.bias_off;
        for (int e = threadIdx.x; e < p.n_bias; e += kThreads) atomicAdd(&cnt[bid[e]], 1u);
        __syncthreads();
        for (int e = threadIdx.x; e < p.n_bias; e += kThreads) {
            const int32_t id = bid[e];
            if (cnt[id] == 1u) {
                w[id] = __fadd_rn(w[id], bv[e]);
                continue;
            }
            /* a repeated id: its first entry adds all of them, in list order */
            bool first = true;
            for (int f = 0; f < e && first; f++) first = bid[f] != id;
            if (!first) continue;
            float x = w[id];
            for (int f = e; f < p.n_bias; f++)
                if (bid[f] == id) x = __fadd_rn(x, bv[f]);
            w[id] = x;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < p.n_bias; e += kThreads) cnt[bid[e]] = 0u;
        __syncthreads();
    }
    if (p.n_output < p.min_tokens && p.n_stop > 0) {
        for (int e = threadIdx.x; e < p.n_stop; e += kThreads) w[ids[(int64_t)p.stop_off + e]] = -INFINITY;
        __syncthreads();
    }
    const bool rep = p.repetition_penalty != 1.0f;
    const bool freq = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    if (!rep && !freq) return;
    const int32_t *out_ids = ids + p.output_off, *prompt_ids = ids + p.prompt_off;
    const int n_prompt = rep ? p.n_prompt : 0;
    for (int e = threadIdx.x; e < p.n_output; e += kThreads) atomicAdd(&cnt[out_ids[e]], 1u);
    for (int e = threadIdx.x; e < n_prompt; e += kThreads) atomicOr(&cnt[prompt_ids[e]], 0x80000000u);
    __syncthreads();
    /* each distinct id once: whoever clears its entry applies it */
    const float r = p.repetition_penalty, f = p.frequency_penalty, pres = p.presence_penalty;
    for (int e = threadIdx.x; e < p.n_output + n_prompt; e += kThreads) {
        const int32_t id = e < p.n_output ? out_ids[e] : prompt_ids[e - p.n_output];
        const uint32_t old = atomicExch(&cnt[id], 0u);
        if (!old) continue;
        float x = w[id];
        if (rep) x = x > 0.0f ? __fdiv_rn(x, r) : __fmul_rn(x, r);
        const uint32_t count = old & 0x7FFFFFFFu;
        if (count && freq) x = __fsub_rn(x, __fadd_rn(__fmul_rn(f, (float)count), pres));
        w[id] = x;
    }
    __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(const float *__restrict__ logits, int32_t vocab, const osp_cuda_sample_row *__restrict__ rows,
                  const int32_t *__restrict__ ids, const int32_t *__restrict__ bias_ids,
                  const float *__restrict__ bias_vals, unsigned char *scratch, size_t row_bytes, size_t cnt_offset,
                  int32_t *__restrict__ tokens, osp_status *__restrict__ status, osp_logprobs *__restrict__ lps,
                  int max_rounds, int32_t *__restrict__ rounds_out) {
    osp_pdl_begin();
    __shared__ Shared s;
    __shared__ osp_cuda_sample_row p; /* the row's parameters (kept out of registers) */
    const int row = blockIdx.x;
    if (threadIdx.x == 0) p = rows[row];
    __syncthreads();
    float *w = reinterpret_cast<float *>(scratch + (size_t)row * row_bytes);
    uint32_t *cnt = reinterpret_cast<uint32_t *>(scratch + (size_t)row * row_bytes + cnt_offset);
    int rounds = 0;

    bool ok = params_ok(p, vocab, ids, bias_ids, bias_vals);
    const float *x = logits + (size_t)(ok ? p.logits_row : 0) * (size_t)vocab;
    const bool modified = p.n_bias > 0 || (p.n_output < p.min_tokens && p.n_stop > 0) ||
                          p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;

    /* pass over the raw logits: finite?, raw argmax, copy when the row modifies them */
    ArgMax raw{0.0f, -1};
    if (ok) {
        bool bad = false;
        for_each(x, vocab, [&](int i, float v) {
            bad |= !(fabsf(v) <= FLT_MAX);
            if (modified) w[i] = v;
            if (raw.i < 0 || v > raw.v) raw = ArgMax{v, i};
        });
        ok = !__syncthreads_or(bad);
    }
    if (ok) raw = block_reduce(raw, ArgMaxOp(), s);

    ArgMax best = raw;
    if (ok && modified) {
        process_logits(p, w, cnt, ids, bias_ids, bias_vals);
        ArgMax am{0.0f, -1};
        for_each(w, vocab, [&](int i, float v) {
            if (!isnan(v) && (am.i < 0 || v > am.v)) am = ArgMax{v, i};
        });
        best = block_reduce(am, ArgMaxOp(), s);
        /* the CPU's scan starts at w[0]: a NaN there is never replaced, so the row fails */
        ok = best.i >= 0 && isfinite(best.v) && !isnan(w[0]);
    }

    int token = 0;
    if (ok && p.temperature >= OSP_SAMPLING_EPS) {
        /* weights with max exactly 1 (exp(-inf) = 0 for masked tokens), and the count and mass of
         * the min-p candidates {w > lo} in the same pass */
        const float *src = modified ? w : x;
        const float inv_t = __fdiv_rn(1.0f, p.temperature);
        const float lo = p.min_p > 0.0f ? nextafterf(fminf(p.min_p, 1.0f), 0.0f) : 0.0f;
        Agg a{0, 0, 0.0, 0.0};
        for_each(src, vocab, [&](int i, float l) {
            const float e = i == best.i ? 1.0f : exp_shifted(l, best.v, inv_t);
            w[i] = e;
            if (e > lo) a.c0++, a.m0 += (double)e;
        });
        a = block_reduce(a, AggOp(), s); /* also makes w visible to the block */
        View v{w, reinterpret_cast<int32_t *>(cnt), vocab, false, 0};
        token = reject_sample(v, p.top_k, p.top_p, lo, a.c0, a.m0, p.seed, p.sample_index, p.output_pos,
                              max_rounds, &rounds, s);
        if (v.ids_used > 0) { /* the count array held ids: zero it again */
            __syncthreads();
            for (int i = threadIdx.x; i < v.ids_used; i += kThreads) cnt[i] = 0u;
        }
    } else if (ok) {
        token = best.i;
    }

    if (ok && lps && p.num_logprobs >= 0) fill_logprobs(x, vocab, token, p.num_logprobs, raw.v, &lps[row], s);
    if (threadIdx.x == 0) {
        tokens[row] = ok ? token : 0;
        status[row] = ok ? OSP_OK : OSP_ERR_INVALID_ARG;
        if (rounds_out) rounds_out[row] = ok ? rounds : 0;
    }
}

size_t round_up_256(size_t b) { return (b + 255u) & ~(size_t)255u; }

} /* namespace */

extern "C" {

size_t osp_cuda_sample_scratch_bytes(int32_t max_rows, int32_t vocab) {
    if (max_rows <= 0 || vocab <= 0 || vocab > kMaxVocab) return 0;
    return (size_t)max_rows * 2u * round_up_256((size_t)vocab * 4u);
}

osp_status osp_cuda_sample_ex(const float *d_logits, int32_t vocab, const osp_cuda_sample_row *d_rows,
                              int32_t num_rows, const int32_t *d_ids, const int32_t *d_bias_ids,
                              const float *d_bias_vals, void *d_scratch, int32_t *d_tokens, osp_status *d_status,
                              osp_logprobs *d_logprobs, int32_t max_rounds, int32_t *d_rounds, void *stream) {
    if (vocab <= 0 || vocab > kMaxVocab || num_rows < 0 || max_rounds < 0 || max_rounds > OSP_REJECT_MAX_ROUNDS)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "cuda sample: vocab %d (1..%d), num_rows %d, max_rounds %d (0..%d) out of range", vocab,
                             kMaxVocab, num_rows, max_rounds, OSP_REJECT_MAX_ROUNDS);
    if (num_rows == 0) return OSP_OK;
    if (!d_logits || !d_rows || !d_scratch || !d_tokens || !d_status)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda sample: logits, rows, scratch, tokens and status are required");
    if ((uintptr_t)d_scratch % 16u)
        return osp_set_error(OSP_ERR_INVALID_ARG, "cuda sample: scratch must be 16-byte aligned");
    const size_t half = round_up_256((size_t)vocab * 4u);
    osp_launch(sample_kernel, (unsigned)num_rows, kThreads, 0, (cudaStream_t)stream,
        d_logits, vocab, d_rows, d_ids, d_bias_ids, d_bias_vals, (unsigned char *)d_scratch, 2u * half, half, d_tokens,
        d_status, d_logprobs, max_rounds, d_rounds);
    OSP_CUDA_LAUNCH_CHECK("sample_kernel");
    return OSP_OK;
}

osp_status osp_cuda_sample(const float *d_logits, int32_t vocab, const osp_cuda_sample_row *d_rows, int32_t num_rows,
                           const int32_t *d_ids, const int32_t *d_bias_ids, const float *d_bias_vals,
                           void *d_scratch, int32_t *d_tokens, osp_status *d_status, osp_logprobs *d_logprobs,
                           void *stream) {
    return osp_cuda_sample_ex(d_logits, vocab, d_rows, num_rows, d_ids, d_bias_ids, d_bias_vals, d_scratch, d_tokens,
                              d_status, d_logprobs, OSP_REJECT_MAX_ROUNDS, NULL, stream);
}

} /* extern "C" */
