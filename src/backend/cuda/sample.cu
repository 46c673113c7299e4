/* The sampler on the GPU (cuda_sample.h): the CPU sampler's steps in the CPU's order and arithmetic
 * (src/sample/sampler.c, reject.c, rng.c, logprobs.c are the spec), so a seeded row draws the same
 * token on either backend except where a sum rounded in a different order lands on the other side of
 * a boundary. The passes over the whole vocabulary run on slices of 4,096 values, a block of 512
 * threads each (see "the sliced passes" below); the row's last block then runs the steps below on
 * the slices' candidate lists, or on the whole row where the lists do not provably hold the answer.
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
 * its 8. Passes where order does not matter are striped (coalesced; 8 float4 loads in flight a thread
 * where the array is 16-byte aligned, else 16 scalar loads).
 *
 * Scratch per row (layout_for): w [vocab] floats, cnt [vocab] uint32, the slices' lists and parts and
 * the RowState, each padded to 256 bytes. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_sample.h"
/* reject.h has no extern "C" guard; only its OSP_REJECT_MAX_ROUNDS is used here */
extern "C" {
#include "sample/reject.h"
}

namespace {

/* OSPREY_SAMPLE_PHASES (a profiling build only, bench/gpu/sample_phases.sh): clock64 marks in the finisher
 * and globaltimer marks around each CTA of the sliced passes, read back by osp_cuda_sample_phases. */
#ifdef OSPREY_SAMPLE_PHASES
/* per row: clock at entry, preamble, gather, draw, exit; n_u, path, rounds; then inside reject_sample: top-k's
 * threshold found (8), its aggregate (9), round 0's draw (10), kth_largest's level 0 with its compaction (11) */
__device__ long long g_fin[256][16];
/* scan (0) / select (1) per CTA (x + y * gridDim.x): start, end ns; select's first slice: weights and their
 * aggregate done (2), list threshold found (3) */
__device__ long long g_cta[2][8192][4];
__device__ __forceinline__ long long gtimer() {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define PH_FIN(row, i, v) do { if (threadIdx.x == 0 && (row) < 256) g_fin[row][i] = (v); } while (0)
#define PH_CTA(k, i) do { const unsigned c_ = blockIdx.x + blockIdx.y * gridDim.x; if (threadIdx.x == 0 && c_ < 8192) g_cta[k][c_][i] = gtimer(); } while (0)
#define PH_SUB(s, i) do { if (threadIdx.x == 0 && (s).ph_row >= 0 && (s).ph_row < 256) g_fin[(s).ph_row][i] = clock64(); } while (0)
#else
#define PH_SUB(s, i) do { } while (0)
#define PH_FIN(row, i, v) do { } while (0)
#define PH_CTA(k, i) do { } while (0)
#endif

constexpr int kThreads = 512;             /* every kernel's block: a slice's CTA, the finishing CTA of a row */
constexpr int kItems = 8;                 /* consecutive values per thread in ordered (chunked) passes */
constexpr int kUnroll = 16;               /* loads in flight per thread in striped passes */
constexpr int kChunk = kThreads * kItems; /* values per chunk of an ordered pass */
constexpr int kBins = 1024;               /* radix select: 10 bits per level */
constexpr int32_t kMaxVocab = 1 << 30;
static_assert(kBins % kThreads == 0, "radix bins must split evenly over the block (and a warp)");
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

struct ArgMax2 { /* the raw and the processed argmax, reduced together */
    ArgMax raw, best;
};
struct ArgMax2Op {
    __device__ ArgMax2 operator()(const ArgMax2 &a, const ArgMax2 &b) const {
        return ArgMax2{ArgMaxOp()(a.raw, b.raw), ArgMaxOp()(a.best, b.best)};
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

struct MaxMin { /* a slice's largest and smallest logit */
    float mx, mn;
};
struct MaxMinOp {
    __device__ MaxMin operator()(const MaxMin &a, const MaxMin &b) const {
        return MaxMin{fmaxf(a.mx, b.mx), fminf(a.mn, b.mn)};
    }
};
struct MaxFloatOp {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct MinFloatOp {
    __device__ float operator()(float a, float b) const { return fminf(a, b); }
};

struct MaxIntOp {
    __device__ int operator()(int a, int b) const { return a > b ? a : b; }
};
struct SumIntOp {
    __device__ int operator()(int a, int b) const { return a + b; }
};
struct MinIntOp {
    __device__ int operator()(int a, int b) const { return a < b ? a : b; }
};

union TempStorage {
    cub::BlockReduce<ArgMax, kThreads>::TempStorage r_argmax;
    cub::BlockReduce<ArgMax2, kThreads>::TempStorage r_argmax2;
    cub::BlockReduce<Agg, kThreads>::TempStorage r_agg;
    cub::BlockReduce<LpAgg, kThreads>::TempStorage r_lp;
    cub::BlockReduce<int, kThreads>::TempStorage r_int;
    cub::BlockReduce<float, kThreads>::TempStorage r_float;
    cub::BlockReduce<MaxMin, kThreads>::TempStorage r_maxmin;
    cub::BlockScan<double, kThreads>::TempStorage s_double;
    cub::BlockScan<int, kThreads>::TempStorage s_int;
};

/* The sampler's switches a kernel passes down (Shared::opts): the slices' lists on 10-bit radix levels
 * (list_threshold_fine), top-k's radix histograms with warp-aggregated increments (hist_add). */
constexpr int kOptFineLists = 1;
constexpr int kOptHistAgg = 2;
constexpr int kOptOnePass = 4; /* see "one pass" below */
constexpr int kOptTau = 8;     /* see "tau lists" below */
constexpr int kOptTauPre = 16;  /* sample_tau_kernel ran before the scan: tau rows read tau from the RowState */

struct Shared {
    TempStorage tmp;
    uint32_t hist[kBins];
    int bcast[3];
    int opts; /* kOpt* bits, set by the kernel before its first barrier */
#ifdef OSPREY_SAMPLE_PHASES
    int ph_row; /* the row finish_row works on (-1 before), for PH_SUB */
#endif
};

/* hist[bin] += 1 for every lane with `valid`. All 32 lanes of the warp call it together. agg: lanes
 * holding the same bin add once, through their lowest lane (__match_any_sync), so a skewed histogram (the
 * weights crowd a few exponents) costs one shared atomic per distinct bin a warp instead of one per lane
 * on the same address; the counts are the same either way. Measured (H100, 2026-12-06, sample_phases):
 * in kth_largest, whose view is U's ~1,800 weights with a floor, level 0 and its compaction fell from
 * 7.8 to 5.1 us at B = 128 and from 4.6 to 4.0 at B = 1; in the slices' list thresholds (8 values a
 * thread, every thread) the match cost more than the conflicts (3 levels 2.0 -> 6.7 us a slice), so they
 * add plainly. */
__device__ __forceinline__ void hist_add(uint32_t *hist, uint32_t bin, bool valid, bool agg) {
    if (!agg) {
        if (valid) atomicAdd(&hist[bin], 1u);
        return;
    }
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, valid ? bin : 0xFFFFFFFFu);
    if (valid && (int)(threadIdx.x & 31u) == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
}

/* Every thread, before the kernel's first barrier: the switches (kOpt*) into s (thread 0). */
__device__ __forceinline__ void shared_init(Shared &s, int opts) {
    if (threadIdx.x != 0) return;
    s.opts = opts;
#ifdef OSPREY_SAMPLE_PHASES
    s.ph_row = -1;
#endif
}

/* x from lane (this lane ^ mask), word by word (any trivially copyable T of whole 32-bit words). */
template <typename T>
__device__ __forceinline__ T shfl_xor_words(const T &x, int mask) {
    static_assert(sizeof(T) % 4 == 0, "whole words");
    uint32_t w[sizeof(T) / 4];
    memcpy(w, &x, sizeof(T));
#pragma unroll
    for (int i = 0; i < (int)(sizeof(T) / 4); i++) w[i] = __shfl_xor_sync(0xFFFFFFFFu, w[i], mask);
    T r;
    memcpy(&r, w, sizeof(T));
    return r;
}

/* A butterfly over the warp: each step combines a lane's value with its partner's, op(a, b) and op(b, a)
 * being equal for these commutative ops, so every lane ends with the same bits. */
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T x, Op op) {
#pragma unroll
    for (int m = 16; m >= 1; m >>= 1) x = op(x, shfl_xor_words(x, m));
    return x;
}

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

/* Who runs the working-view algorithms below (draws, counts, compaction, radix select): the whole block
 * (BlockGrp), or warp 0 alone (WarpGrp) for small views, where a block's barriers cost more than the
 * work (see kWarpView). The same steps in the same order over the view; each member (thread or lane)
 * owns the same kind of pieces (kItems consecutive values of a chunk of N x kItems, or the striped
 * groups of for_each), so only the trees that combine the members' partial sums differ: a row's
 * result depends on which group ran it, and that is chosen from the row's own view size alone. */
struct BlockGrp {
    static constexpr int N = kThreads;
    __device__ static int rank() { return (int)threadIdx.x; }
    __device__ static void sync() { __syncthreads(); }
    template <typename T, typename Op>
    __device__ static T reduce(T x, Op op, Shared &s) { return block_reduce(x, op, s); }
    template <typename T>
    __device__ static T exsum(T x, T *total, Shared &s) { return block_exclusive_sum(x, total, s); }
};

struct WarpGrp { /* called by the 32 lanes of warp 0 together, nobody else */
    static constexpr int N = 32;
    __device__ static int rank() { return (int)(threadIdx.x & 31u); }
    __device__ static void sync() { __syncwarp(); }
    template <typename T, typename Op>
    __device__ static T reduce(T x, Op op, Shared &) { return warp_reduce(x, op); } /* the same bits on every lane */
    /* exclusive prefix sum over lanes (Kogge-Stone), *total the sum of all, the same on every lane */
    template <typename T>
    __device__ static T exsum(T x, T *total, Shared &) {
        const int lane = rank();
        T incl = x;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const T y = __shfl_up_sync(0xFFFFFFFFu, incl, d);
            if (lane >= d) incl = incl + y;
        }
        *total = __shfl_sync(0xFFFFFFFFu, incl, 31);
        const T excl = __shfl_up_sync(0xFFFFFFFFu, incl, 1);
        __syncwarp(); /* as the block's scan: every lane's earlier reads are done */
        return lane ? excl : (T)0;
    }
};

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

/* f(i, x[i]) for the i < n this thread owns in a striped pass, in increasing i (so per-thread sums have
 * a fixed order and strict > keeps the lowest id). Where x is 16-byte aligned the thread owns float4
 * groups tid, tid + 512, ... (then the tail's i = 4 * (n / 4) + tid), 8 float4 loads in flight, so one
 * block streams a 128k row from L2 at several times the rate of scalar loads; else i = tid, tid + 512,
 * ..., kUnroll scalar loads at a time. Which one depends only on x and n (block-uniform). */
template <typename G, typename F>
__device__ __forceinline__ void for_each(const float *x, int n, F f) {
    constexpr int kU4 = 8;
    if ((reinterpret_cast<uintptr_t>(x) & 15u) == 0) {
        const int n4 = n / 4;
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
        for (int base = G::rank(); base < n4; base += kU4 * G::N) {
            float4 v[kU4];
#pragma unroll
            for (int u = 0; u < kU4; u++) {
                const int i = base + u * G::N;
                v[u] = i < n4 ? x4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
#pragma unroll
            for (int u = 0; u < kU4; u++) {
                const int i = base + u * G::N;
                if (i < n4) f(4 * i, v[u].x), f(4 * i + 1, v[u].y), f(4 * i + 2, v[u].z), f(4 * i + 3, v[u].w);
            }
        }
        const int i = 4 * n4 + G::rank();
        if (i < n) f(i, x[i]);
        return;
    }
    for (int base = G::rank(); base < n; base += kUnroll * G::N) {
        float v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int i = base + u * G::N;
            v[u] = i < n ? x[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            const int i = base + u * G::N;
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
template <typename G>
__device__ Agg aggregate2(const View &v, float p0, float p1, Shared &s) {
    Agg a{0, 0, 0.0, 0.0};
    for_each<G>(v.w, v.n, [&](int, float x) {
        if (x > p0) a.c0++, a.m0 += (double)x;
        if (x > p1) a.c1++, a.m1 += (double)x;
    });
    return G::reduce(a, AggOp(), s);
}

/* Moves the candidates {w > lo} to the front, keeping their order (stable, in place: a chunk is read
 * entirely before any of it is written, and writes never pass the chunk being read). */
template <typename G>
__device__ void compact(View &v, float lo, Shared &s) {
    int m = 0;
    for (int base = 0; base < v.n; base += G::N * kItems) {
        const int first = base + G::rank() * kItems;
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
        int pos = m + G::exsum(cnt, &total, s); /* every thread has read its chunk */
#pragma unroll
        for (int j = 0; j < kItems; j++)
            if (x[j] > lo) {
                v.w[pos] = x[j];
                v.ids[pos] = id[j];
                pos++;
            }
        m += total;
    }
    G::sync(); /* the compacted view is visible to every thread */
    v.n = m;
    v.have_ids = true;
    v.ids_used = v.ids_used > m ? v.ids_used : m;
}

/* reject.c's rule: compact when the candidates are under half of a view of more than 256. */
template <typename G>
__device__ void maybe_compact(View &v, float lo, int count_lo, Shared &s) {
    if (v.n > 256 && 2ll * count_lo < (long long)v.n) compact<G>(v, lo, s);
}

/* The view position where the running mass of {w > lo}, in view order, first exceeds target (inverse
 * CDF); the last candidate if rounding leaves target beyond the total (0 if there is none). */
template <typename G>
__device__ int draw_index(const View &v, float lo, double target, Shared &s) {
    double running = 0.0;
    for (int base = 0; base < v.n; base += G::N * kItems) {
        const int first = base + G::rank() * kItems;
        float x[kItems];
        load_items<float, float4>(v.w, v.n, first, x);
        double tsum = 0.0;
#pragma unroll
        for (int j = 0; j < kItems; j++) {
            x[j] = x[j] > lo ? x[j] : 0.0f;
            tsum += (double)x[j];
        }
        double total;
        const double excl = running + G::exsum(tsum, &total, s);
        if (running + total > target) { /* block-uniform: the crossing is in this chunk */
            int owner = G::reduce(tsum > 0.0 && excl + tsum > target ? G::rank() : G::N, MinIntOp(), s);
            if (owner == G::N) /* rounding: the prefix sums disagree by an ulp; take the last mass */
                owner = G::reduce(tsum > 0.0 ? G::rank() : -1, MaxIntOp(), s);
            if (G::rank() == owner) {
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
            G::sync();
            const int j = s.bcast[0];
            G::sync();
            return j;
        }
        running += total;
    }
    int last = -1;
    for_each<G>(v.w, v.n, [&](int i, float x) {
        if (x > lo) last = i;
    });
    last = G::reduce(last, MaxIntOp(), s);
    return last > 0 ? last : 0;
}

/* The k-th largest weight among {w > lo} (more than k of them), exactly: reject.c's radix select on
 * the float bit patterns, three levels of 10 bits, compacting the view after the first level. */
template <typename G>
__device__ float kth_largest(View &v, float lo, int k, Shared &s) {
    if (G::N == kThreads && v.n <= kThreads && (s.opts & kOptTau)) {
        /* a view of at most one value a thread (tau rows' U), under OSPREY_SAMPLE_TAU=1 until measured: each
         * counts the values above its own, and the k-th largest is the smallest value with fewer than k
         * above it: one pass, one reduction, the same value as the radix levels below */
        const int i = G::rank();
        const float x = i < v.n ? v.w[i] : 0.0f;
        int above = 0;
        for (int j = 0; j < v.n; j++) {
            const float y = v.w[j];
            above += y > lo && y > x;
        }
        const float cand = i < v.n && x > lo && above < k ? x : INFINITY;
        return G::reduce(cand, MinFloatOp(), s);
    }
    uint32_t prefix = 0; /* bits of the k-th value fixed so far */
    int need = k;        /* its rank among the values that share the prefix */
    for (int level = 0; level < 3; level++) {
        const int sh = 20 - 10 * level;
        for (int b = G::rank(); b < kBins; b += G::N) s.hist[b] = 0;
        G::sync();
        if (s.opts & kOptHistAgg) { /* every lane the same trip count: hist_add needs the whole warp */
            for (int base = 0; base < v.n; base += 4 * G::N) {
                float x[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const int i = base + u * G::N + G::rank();
                    x[u] = i < v.n ? v.w[i] : 0.0f; /* 0 is never > lo >= 0 */
                }
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const uint32_t bits = __float_as_uint(x[u]);
                    hist_add(s.hist, (bits >> sh) & 1023u, x[u] > lo && (level == 0 || (bits >> (sh + 10)) == prefix),
                             true);
                }
            }
        } else {
            for_each<G>(v.w, v.n, [&](int, float x) {
                const uint32_t bits = __float_as_uint(x);
                if (x > lo && (level == 0 || (bits >> (sh + 10)) == prefix)) atomicAdd(&s.hist[(bits >> sh) & 1023u], 1u);
            });
        }
        G::sync();
        /* bins in descending order: member t holds positions t * kBins / N + j */
        constexpr int kPer = kBins / G::N;
        int h[kPer], hs = 0;
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            h[j] = (int)s.hist[kBins - 1 - (G::rank() * kPer + j)];
            hs += h[j];
        }
        int total;
        int excl = G::exsum(hs, &total, s);
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            const int b = kBins - 1 - (G::rank() * kPer + j);
            const int incl = excl + h[j];
            /* the first bin (from the top) where the count reaches `need`; bin 0 if none does (the
             * CPU's loop stops there): exactly one thread writes */
            if ((incl >= need || b == 0) && excl < need) s.bcast[0] = b, s.bcast[1] = need - excl, s.bcast[2] = incl;
            excl = incl;
        }
        G::sync();
        const int bucket = s.bcast[0], at_or_above = s.bcast[2];
        need = s.bcast[1];
        G::sync();
        prefix = (prefix << 10) | (uint32_t)bucket;
        if (level == 0) { /* keep the bucket and everything above it */
            const uint32_t first = prefix << 20;
            const float below = first ? __uint_as_float(first - 1u) : 0.0f;
            if (below > lo) lo = below;
            maybe_compact<G>(v, lo, at_or_above, s);
            PH_SUB(s, 11);
        }
    }
    return __uint_as_float(prefix);
}

/* View position of the m-th (0-based, view order) weight equal to `value`, or -1. */
template <typename G>
__device__ int nth_equal(const View &v, float value, int m, Shared &s) {
    int running = 0;
    for (int base = 0; base < v.n; base += G::N * kItems) {
        const int first = base + G::rank() * kItems;
        float x[kItems];
        load_items<float, float4>(v.w, v.n, first, x);
        int cnt = 0;
#pragma unroll
        for (int j = 0; j < kItems; j++) cnt += first + j < v.n && x[j] == value;
        int total;
        const int excl = running + G::exsum(cnt, &total, s);
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
            G::sync();
            const int j = s.bcast[0];
            G::sync();
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
template <typename G>
__device__ int sorted_draw(const View &v, float cut, double u, Shared &s) {
    const Agg g = aggregate2<G>(v, cut, cut, s);
    const double t = u * g.m0;
    uint32_t a = __float_as_uint(cut) + 1u, b = __float_as_uint(1.0f); /* mass{w >= a} = g.m0 > t */
    while (a < b) {
        const uint32_t mid = a + (b - a + 1u) / 2u;
        const float x = __uint_as_float(mid);
        const Agg h = aggregate2<G>(v, nextafterf(x, 0.0f), x, s);
        if (h.m0 > t) a = mid;
        else b = mid - 1u;
    }
    const float val = __uint_as_float(a);
    const Agg h = aggregate2<G>(v, val, nextafterf(val, 0.0f), s); /* m0: mass above val; c1 - c0: ties */
    const int neq = h.c1 - h.c0;
    const double d = (t - h.m0) / (double)val;
    const int m = !(d > 0.0) ? 0 : d >= (double)(neq - 1) ? (neq > 0 ? neq - 1 : 0) : (int)floor(d);
    const int j = neq > 0 ? nth_equal<G>(v, val, m, s) : -1;
    return view_id(v, j >= 0 ? j : draw_index<G>(v, cut, t, s)); /* the second arm is unreachable */
}

/* reject.c's osp_reject_sample_ex on the view (weights with max exactly 1), the mass and count of
 * {w > lo} already known from the exponentiation pass. Returns the token id; *rounds as the CPU's.
 * kth_floor: a value at most top-k's threshold (0: none known) when top-k and top-p are both on; the
 * radix select then skips the weights below it (the same threshold, fewer values to count). guard: the
 * largest weight of the row missing from the view (0: none; see "one pass"): -1 is returned, with
 * nothing drawn, when it would be a candidate once the first pivot is settled. */
template <typename G>
__device__ int reject_sample(View &v, int top_k, float top_p, float lo, int count_lo, double mass_lo,
                             uint64_t seed, uint32_t sample_index, uint64_t position, int max_rounds, int *rounds,
                             float kth_floor, float guard, Shared &s) {
    *rounds = 0;
    bool p_on = top_p < 1.0f;
    int k = top_k > 0 && top_k < count_lo ? top_k : 0;
    if (k == 1 || (p_on && top_p <= 0.0f)) { /* only the maximum and its ties */
        lo = nextafterf(1.0f, 0.0f);
        const Agg g = aggregate2<G>(v, lo, lo, s);
        count_lo = g.c0, mass_lo = g.m0;
        k = 0, p_on = false;
    }
    if (k && p_on) { /* top-k first: its threshold becomes the pivot, top-p by rejection inside it */
        const float t = kth_largest<G>(v, fmaxf(lo, kth_floor), k, s);
        PH_SUB(s, 8);
        lo = nextafterf(t, 0.0f);
        const Agg g = aggregate2<G>(v, lo, lo, s);
        count_lo = g.c0, mass_lo = g.m0;
        k = 0;
        PH_SUB(s, 9);
    }
    if (guard > lo) return -1; /* block-uniform: every member has the same lo */
    const double target = p_on ? (double)top_p * mass_lo : 0.0;
    float hi = 1.0f;
    for (int r = 0; r < max_rounds; r++) {
        const double u = uniform_at(seed, sample_index, position, (uint32_t)r);
        maybe_compact<G>(v, lo, count_lo, s);
        const int j = draw_index<G>(v, lo, u * mass_lo, s);
        if (r == 0) PH_SUB(s, 10);
        if (!k && !p_on) return view_id(v, j); /* min-p only (or nothing): one draw */
        const float q = v.w[j];
        *rounds = r + 1;
        const float p1 = __fmul_rn(0.5f, __fadd_rn(q, hi));
        const Agg g = aggregate2<G>(v, q, p1, s);
        const bool acc0 = (!k || g.c0 < k) && (!p_on || g.m0 < target || q >= 1.0f);
        if (acc0) return view_id(v, j);
        const bool acc1 = (!k || g.c1 < k) && (!p_on || g.m1 < target || p1 >= 1.0f);
        if (acc1) lo = q, hi = p1, count_lo = g.c0, mass_lo = g.m0;
        else lo = p1, count_lo = g.c1, mass_lo = g.m1;
    }
    /* exact fallback on {w > lo}, an upper set holding every kept token */
    *rounds = max_rounds + 1;
    compact<G>(v, lo, s);
    const double u = uniform_at(seed, sample_index, position, OSP_REJECT_MAX_ROUNDS);
    float cut = lo;
    if (k) {
        if (v.n > k) cut = nextafterf(kth_largest<G>(v, lo, k, s), 0.0f);
    } else if (p_on) {
        /* the smallest x with mass{w > x} < target (mass measured over the whole filtered set: the
         * tokens removed so far all lie below the cut); it is kept, everything below is not */
        uint32_t a = __float_as_uint(lo) + 1u, b = __float_as_uint(1.0f);
        while (a < b) {
            const uint32_t mid = a + (b - a) / 2u;
            const float x = __uint_as_float(mid);
            if (aggregate2<G>(v, x, x, s).m0 < target) b = mid;
            else a = mid + 1u;
        }
        cut = nextafterf(__uint_as_float(a), 0.0f);
    }
    return sorted_draw<G>(v, cut, u, s);
}

/* ---- logprobs (logprobs.c) ------------------------------------------------------------------------ */

__device__ __forceinline__ float floor_lp(double x) {
    return x < (double)OSP_LOGPROB_FLOOR ? OSP_LOGPROB_FLOOR : (float)x;
}

__device__ void fill_logprobs(const float *x, int vocab, int token, int num_top, float mx, osp_logprobs *out,
                              Shared &s) {
    const float chosen = x[token];
    LpAgg a{0.0, 0};
    for_each<BlockGrp>(x, vocab, [&](int, float xi) {
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
        for_each<BlockGrp>(x, vocab, [&](int i, float xi) {
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

/* sampler.c's check_params on the scalars, plus what the packed form adds (offsets, logits_row >= 0).
 * Reads only the row (cheap enough for every CTA of the row to call). */
__device__ bool scalars_ok(const osp_cuda_sample_row &p, const int32_t *ids, const int32_t *bias_ids,
                           const float *bias_vals) {
    return p.temperature >= 0.0f && !isinf(p.temperature) && p.top_k >= -1 && p.top_p >= 0.0f && p.top_p <= 1.0f &&
           p.min_p >= 0.0f && p.min_p <= 1.0f && isfinite(p.presence_penalty) && isfinite(p.frequency_penalty) &&
           p.repetition_penalty > 0.0f && !isinf(p.repetition_penalty) && p.num_logprobs >= -1 &&
           p.num_logprobs <= OSP_MAX_LOGPROBS && p.logits_row >= 0 && list_ok(p.n_bias, p.bias_off, bias_ids) &&
           (p.n_bias == 0 || bias_vals != nullptr) && list_ok(p.n_stop, p.stop_off, ids) &&
           list_ok(p.n_prompt, p.prompt_off, ids) && list_ok(p.n_output, p.output_off, ids);
}

/* The rest of check_params: every listed id in [0, vocab), every bias finite. Reads the whole lists,
 * so one CTA of the row calls it; all threads of that block must (it ends in a block vote). */
__device__ bool lists_ok(const osp_cuda_sample_row &p, int32_t vocab, const int32_t *ids, const int32_t *bias_ids,
                         const float *bias_vals) {
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

__device__ __forceinline__ bool row_modified(const osp_cuda_sample_row &p) {
    return p.n_bias > 0 || (p.n_output < p.min_tokens && p.n_stop > 0) || p.repetition_penalty != 1.0f ||
           p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

/* Bias, min_tokens and penalties on w (sampler.c's process_logits) for the ids in [id_lo, id_hi) only:
 * a CTA applies what falls in its own slice, so slices never touch each other's entries (and an id out
 * of [0, vocab), which fails the row, is never written). cnt zero on entry and exit in that range. */
__device__ void process_logits(const osp_cuda_sample_row &p, float *w, uint32_t *cnt, const int32_t *ids,
                               const int32_t *bias_ids, const float *bias_vals, int32_t id_lo, int32_t id_hi) {
    auto mine = [&](int32_t id) { return id >= id_lo && id < id_hi; };
    if (p.n_bias > 0) {
        const int32_t *bid = bias_ids + p.bias_off;
        const float *bv = bias_vals + p.bias_off;
        for (int e = threadIdx.x; e < p.n_bias; e += kThreads)
            if (mine(bid[e])) atomicAdd(&cnt[bid[e]], 1u);
        __syncthreads();
        for (int e = threadIdx.x; e < p.n_bias; e += kThreads) {
            const int32_t id = bid[e];
            if (!mine(id)) continue;
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
        for (int e = threadIdx.x; e < p.n_bias; e += kThreads)
            if (mine(bid[e])) cnt[bid[e]] = 0u;
        __syncthreads();
    }
    if (p.n_output < p.min_tokens && p.n_stop > 0) {
        for (int e = threadIdx.x; e < p.n_stop; e += kThreads) {
            const int32_t id = ids[(int64_t)p.stop_off + e];
            if (mine(id)) w[id] = -INFINITY;
        }
        __syncthreads();
    }
    const bool rep = p.repetition_penalty != 1.0f;
    const bool freq = p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
    if (!rep && !freq) return;
    const int32_t *out_ids = ids + p.output_off, *prompt_ids = ids + p.prompt_off;
    const int n_prompt = rep ? p.n_prompt : 0;
    for (int e = threadIdx.x; e < p.n_output; e += kThreads)
        if (mine(out_ids[e])) atomicAdd(&cnt[out_ids[e]], 1u);
    for (int e = threadIdx.x; e < n_prompt; e += kThreads)
        if (mine(prompt_ids[e])) atomicOr(&cnt[prompt_ids[e]], 0x80000000u);
    __syncthreads();
    /* each distinct id once: whoever clears its entry applies it */
    const float r = p.repetition_penalty, f = p.frequency_penalty, pres = p.presence_penalty;
    for (int e = threadIdx.x; e < p.n_output + n_prompt; e += kThreads) {
        const int32_t id = e < p.n_output ? out_ids[e] : prompt_ids[e - p.n_output];
        if (!mine(id)) continue;
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

/* ---- the sliced passes ------------------------------------------------------------------------------
 *
 * A row is cut into slices of kSlice values (one CTA each: grid = slices x rows), so a full pass over a
 * 128k vocabulary is 32 CTAs reading 16 KB each instead of one CTA reading 512 KB. The slice size is a
 * constant, so a row's slices, sums and lists depend on the vocabulary alone, never on the batch. Three
 * launches for large grids; the first two are lean (40 registers: three CTAs of 512 threads an SM; 64 and
 * two when a CTA preloads its next slice), the third carries the algorithm. Grids of at most kFusedCtas
 * CTAs run scan + select/finish in two launches, or (OSPREY_SAMPLE_ONE_LAUNCH=1, opt-in) all three in one
 * cooperative launch (sample_one_launch_kernel: a row barrier where the scan's kernel boundary was).
 *
 *   sample_scan_kernel    per slice: bias/penalties for the slice's ids (modified rows, into w), raw
 *                         and processed argmax, finiteness; the row's last CTA to finish combines the
 *                         slices into the row's RowState (ok, greedy, the two argmaxes).
 *   sample_select_kernel  per slice of a row still to sample: the weights e = exp((l - max) / T) (in
 *                         registers), the count and mass of {e > lo} (lo: min-p's pivot), and a
 *                         candidate list: the slice's e > lo at or above a threshold under which at least
 *                         K of them lie (K: top_k when 1 <= top_k <= kListKMax, else kListKDefault), found
 *                         by a radix histogram over the float bits, at most kListCap entries, in id order.
 *   sample_finish_kernel  one CTA per row: greedy and failed rows from the RowState; the others sample
 *                         as below (the rejection rounds over a small U on warp 0 alone when
 *                         OSPREY_SAMPLE_WARP_VIEW allows it, see kWarpView), then logprobs.
 *
 * Why the lists suffice. A token left out of its slice's list has at least K weights of its slice
 * strictly above it, so every token with fewer than K weights above it in the row is in the union U of
 * the lists. That covers: the top-k set {e >= t} when top_k <= K (each member has fewer than k above it),
 * the maximum's tie group (top_k = 1, top_p = 0), and the whole candidate set when it has at most K
 * members. reject_sample on U (with the row's count and mass of {e > lo}) then takes exactly the steps it
 * takes on the whole row: top-k's threshold is U's k-th largest, and everything after it stays inside
 * {e >= t}. A row with neither top-k nor top-p draws once: the slice whose running mass crosses the
 * target, then the token inside it (draw_index's chunks are the slices). Anything else (top-p alone over
 * more than K candidates, top-k alone or above kListKMax, a list that overflowed) runs the one-block
 * algorithm over the whole row, as before the slices. */

constexpr int kSlice = kChunk;     /* values a CTA in the sliced passes: 512 threads x 8 consecutive */
constexpr int kListCap = 512;      /* candidate list entries a slice */
constexpr int kListKMax = 256;     /* top_k up to this builds lists of at least top_k */
constexpr int kListKDefault = 64;  /* the lists' depth otherwise (covers min-p sets of up to 64 tokens) */
static_assert(kListCap <= kThreads, "the finisher gathers a list per thread pass");

struct SlicePart {      /* one slice's results (scan: raw..nan0; select: c0..m0) */
    float raw_v, best_v;
    int raw_i, best_i;
    int bad;            /* a non-finite raw logit in the slice; slice 0 also: a list entry out of range */
    int nan0;           /* slice 0 of a modified row: the processed w[0] is NaN (the CPU's scan fails) */
    int c0, list_n;     /* #{e > lo} in the slice; entries in its list */
    int overflow;       /* the list would exceed kListCap (ties): the row takes the one-block path */
    uint32_t thr;       /* the list holds the slice's e > lo with bits >= thr (list_n of them, not overflowed) */
    double m0;          /* sum{e > lo} over the slice, each thread's 8 in order, then the block's tree */
    /* one pass (the scan built the list; see below): e, thr and m0 are relative to the slice's own largest
     * logit `ref`, the list holds logits; mn: the slice's smallest logit; guard: the largest logit left out
     * of the list (-inf: none) */
    float ref, mn, guard;
};

struct RowState {       /* a row's combined scan and the last-CTA tickets (zero between launches) */
    unsigned arrive_scan, arrive_select;
    unsigned arrive_row, gen_row; /* row_barrier's count (zero between launches) and generation */
    int ok, greedy;
    int one_pass; /* the scan built the slices' lists (is_one_pass_row, and no weight underflows) */
    int tau;      /* ... and cut them at tau (is_tau_row) */
    float tau_v;  /* tau, when sample_tau_kernel found it (kOptTauPre) */
    float raw_v, best_v;
    int raw_i, best_i;
};

struct Layout {         /* byte offsets inside a row's scratch (osp_cuda_sample_scratch_bytes) */
    size_t row_bytes, cnt, list_w, list_id, parts, state;
};

struct RowPtrs {
    float *w;
    uint32_t *cnt;
    float *list_w;
    int32_t *list_id;
    SlicePart *parts;
    RowState *st;
};

__device__ __forceinline__ RowPtrs row_ptrs(unsigned char *scratch, const Layout &L, int row) {
    unsigned char *b = scratch + (size_t)row * L.row_bytes;
    return RowPtrs{reinterpret_cast<float *>(b), reinterpret_cast<uint32_t *>(b + L.cnt),
                   reinterpret_cast<float *>(b + L.list_w), reinterpret_cast<int32_t *>(b + L.list_id),
                   reinterpret_cast<SlicePart *>(b + L.parts), reinterpret_cast<RowState *>(b + L.state)};
}

/* This thread's kItems values of a slice pass: a[first .. first + kItems), 0 past n. */
__device__ __forceinline__ void load_slice(const float *a, int n, int first, float x[kItems]) {
    if (first + kItems <= n && (reinterpret_cast<uintptr_t>(a + first) & 15u) == 0) {
        load_items<float, float4>(a, n, first, x);
    } else {
#pragma unroll
        for (int j = 0; j < kItems; j++) x[j] = first + j < n ? a[first + j] : 0.0f;
    }
}

/* The last CTA of a row to arrive at *ticket (after making its writes visible) gets true, resets the
 * ticket for the next launch and sees every other CTA's writes. All threads must call it. */
__device__ bool last_to_arrive(unsigned *ticket, unsigned ctas) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(ticket, 1u) == ctas - 1u;
        if (last) *ticket = 0u;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

/* The lowest threshold bit pattern thr such that the slice's e > lo with bits >= thr are at least `need`
 * (need <= their count) and at most kListCap, by a radix histogram over the bits (levels of 8, 8, 8 and
 * 6 bits under bit 30: weights lie in [0, 1]); *count gets how many lie at or above it, > kListCap only
 * when ties of one exact value exceed the cap. */
__device__ uint32_t list_threshold(const float e[kItems], float lo, int need, int *count, Shared &s) {
    constexpr int kShift[4] = {22, 14, 6, 0};
    constexpr uint32_t kMask[4] = {0xFFu, 0xFFu, 0xFFu, 0x3Fu};
    uint32_t prefix = 0; /* the bits above the level's, fixed so far */
    int above = 0;       /* values in higher buckets of earlier levels */
    for (int level = 0; level < 4; level++) {
        const int sh = kShift[level];
        for (int b = threadIdx.x; b < 256; b += kThreads) s.hist[b] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kItems; j++) {
            const uint32_t bits = __float_as_uint(e[j]);
            if (e[j] > lo && (level == 0 || (bits >> kShift[level - 1]) == prefix))
                atomicAdd(&s.hist[(bits >> sh) & kMask[level]], 1u);
        }
        __syncthreads();
        const int h = threadIdx.x < 256 ? (int)s.hist[255 - threadIdx.x] : 0; /* bins from the top */
        int total;
        const int excl = block_exclusive_sum(h, &total, s);
        const int rem = need - above;
        if (h > 0 && excl < rem && excl + h >= rem) s.bcast[0] = 255 - (int)threadIdx.x, s.bcast[1] = excl, s.bcast[2] = h;
        __syncthreads();
        const int b = s.bcast[0], ex = s.bcast[1], hb = s.bcast[2];
        __syncthreads();
        prefix = level == 0 ? (uint32_t)b : (prefix << (kShift[level - 1] - sh)) | (uint32_t)b;
        *count = above + ex + hb;
        if (*count <= kListCap || level == 3) return prefix << sh;
        above += ex;
    }
    return 0; /* unreachable */
}

/* list_threshold on finer radix levels, 10, 10 and 10 bits (the default; OSPREY_SAMPLE_LIST_BITS=8 takes
 * list_threshold): list_threshold's level 0 of 8 bits has buckets a factor of ~1.5 in weight wide, so a list
 * often holds twice its `need` (sample_bench's rows on an H100: U 2,634 entries a row for top_k 50 at B = 128,
 * 1,816 here). Same contract as list_threshold. */
__device__ uint32_t list_threshold_fine(const float e[kItems], float lo, int need, int *count, Shared &s) {
    constexpr int kShift[3] = {20, 10, 0};
    constexpr int kPer = kBins / kThreads;
    static_assert(kPer == 2, "two bins a thread");
    uint32_t prefix = 0; /* the bits above the level's, fixed so far */
    int above = 0;       /* values in higher buckets of earlier levels */
    for (int level = 0; level < 3; level++) {
        const int sh = kShift[level];
        for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kItems; j++) {
            const uint32_t bits = __float_as_uint(e[j]);
            if (e[j] > lo && (level == 0 || (bits >> (sh + 10)) == prefix))
                atomicAdd(&s.hist[(bits >> sh) & (uint32_t)(kBins - 1)], 1u);
        }
        __syncthreads();
        /* bins from the top: thread t holds positions 2t, 2t + 1 */
        int h[kPer], hs = 0;
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            h[j] = (int)s.hist[kBins - 1 - ((int)threadIdx.x * kPer + j)];
            hs += h[j];
        }
        int total;
        int excl = block_exclusive_sum(hs, &total, s);
        const int rem = need - above;
#pragma unroll
        for (int j = 0; j < kPer; j++) {
            if (h[j] > 0 && excl < rem && excl + h[j] >= rem)
                s.bcast[0] = kBins - 1 - ((int)threadIdx.x * kPer + j), s.bcast[1] = excl, s.bcast[2] = h[j];
            excl += h[j];
        }
        __syncthreads();
        const int b = s.bcast[0], ex = s.bcast[1], hb = s.bcast[2];
        __syncthreads();
        prefix = (prefix << 10) | (uint32_t)b;
        *count = above + ex + hb;
        if (*count <= kListCap || level == 2) return prefix << sh;
        above += ex;
    }
    return 0; /* unreachable */
}

/* ---- one pass (OSPREY_SAMPLE_ONE_PASS=1; opt-in until measured on a device) ----------------------------
 * The select pass reads the logits a second time once the scan has the row's maximum, which at B = 128 is
 * half of the sampler's ~131 MB of reads. For a row that modifies no logit and has no min-p, the scan
 * builds each slice's list itself with weights relative to the slice's own largest logit `ref`: the
 * weights are monotone in the logit for any reference, so the list (every e >= thr, by list_threshold on
 * those weights) is an upper set of the slice's logits, and it stores the logits. The finisher then
 * computes every list entry's weight against the row's maximum (the same exp_shifted, so the same bits as
 * the select pass and the CPU), scales each slice's mass by exp((ref - max) / T) (the sums then differ from
 * the select pass's in rounding only: the same standing as the CPU's different order), and the top-k floor
 * from the lists' thresholds less a margin of 1e-4 (exp_shifted's rounding is ~1e-6 relative).
 * Two things the weights against the row's maximum could change are checked where they would matter:
 *   - underflow: a value whose weight against the row's maximum is 0 is not a candidate, so the slices'
 *     counts hold only where no weight underflows: the row's smallest logit must have weight > 0
 *     (combine_scan; else the row takes the select pass as before);
 *   - ties across the list's edge: a logit just below a list's smallest could round to the same weight
 *     against the row's maximum. The finisher takes the largest weight left out of any list (`guard`,
 *     the slices' largest logit outside their lists); where it is a candidate (guard > the pivot that
 *     reject_sample settles on before its rounds), the row runs the one-block algorithm instead.
 * Which rows take one pass depends on the row alone (its parameters and logits), never on the batch. */
__device__ __forceinline__ bool one_pass_params(const osp_cuda_sample_row &p) {
    return !row_modified(p) && !(p.min_p > 0.0f) && !(p.temperature < OSP_SAMPLING_EPS);
}

/* A row whose lists the scan cuts at a row-wide logit threshold tau (see "tau lists"): one pass's rows with
 * both top-k (2 .. kListKMax) and top-p (0 < top_p < 1) on. */
__device__ __forceinline__ bool is_tau_row(const osp_cuda_sample_row &p, int opts) {
    return (opts & kOptTau) && one_pass_params(p) && p.top_k >= 2 && p.top_k <= kListKMax && p.top_p > 0.0f &&
           p.top_p < 1.0f;
}

__device__ __forceinline__ bool is_one_pass_row(const osp_cuda_sample_row &p, int opts) {
    return ((opts & kOptOnePass) && one_pass_params(p)) || is_tau_row(p, opts);
}

/* Slice c's list by the one pass (the select pass's steps on weights relative to the slice's own largest
 * logit): v, this thread's kItems logits from `first`. All threads of the block call it. */
__device__ void one_pass_slice(const float v[kItems], int first, int32_t vocab, int c, const osp_cuda_sample_row &p,
                               const RowPtrs &rp, Shared &s) {
    const float inv_t = __fdiv_rn(1.0f, p.temperature);
    const int K = p.top_k >= 1 && p.top_k <= kListKMax ? p.top_k : kListKDefault;
    MaxMin mm{-INFINITY, INFINITY};
#pragma unroll
    for (int j = 0; j < kItems; j++)
        if (first + j < vocab) mm = MaxMin{fmaxf(mm.mx, v[j]), fminf(mm.mn, v[j])};
    mm = block_reduce(mm, MaxMinOp(), s);
    float e[kItems];
    Agg a{0, 0, 0.0, 0.0};
#pragma unroll
    for (int j = 0; j < kItems; j++) {
        e[j] = first + j < vocab ? exp_shifted(v[j], mm.mx, inv_t) : 0.0f;
        if (e[j] > 0.0f) a.c0++, a.m0 += (double)e[j];
    }
    a = block_reduce(a, AggOp(), s);
    const int need = a.c0 < K ? a.c0 : K;
    int count = 0;
    const uint32_t thr = need <= 0                     ? 0xFFFFFFFFu
                         : (s.opts & kOptFineLists) ? list_threshold_fine(e, 0.0f, need, &count, s)
                                                    : list_threshold(e, 0.0f, need, &count, s);
    const bool overflow = count > kListCap;
    int keep = 0;
    float guard = -INFINITY;
#pragma unroll
    for (int j = 0; j < kItems; j++) {
        const bool k = !overflow && e[j] > 0.0f && __float_as_uint(e[j]) >= thr;
        keep += k;
        if (!k && first + j < vocab) guard = fmaxf(guard, v[j]);
    }
    int total;
    int pos = c * kListCap + block_exclusive_sum(keep, &total, s);
#pragma unroll
    for (int j = 0; j < kItems; j++)
        if (!overflow && e[j] > 0.0f && __float_as_uint(e[j]) >= thr)
            rp.list_w[pos] = v[j], rp.list_id[pos] = first + j, pos++;
    guard = block_reduce(guard, MaxFloatOp(), s);
    if (threadIdx.x == 0) {
        SlicePart *d = &rp.parts[c];
        d->c0 = a.c0, d->m0 = a.m0, d->list_n = total, d->overflow = overflow, d->thr = thr;
        d->ref = mm.mx, d->mn = mm.mn, d->guard = guard;
    }
}

/* ---- tau lists (calls of kTauAutoRows rows or more; OSPREY_SAMPLE_TAU=1 / 0: always / never) ---------
 * One pass still runs a radix select per slice to cut its list (three levels of histogram, ~10 block-wide
 * steps a slice, which is where its time goes). A row with top-k and top-p both on needs only the row's
 * top-k set {e >= t} (top-p then works inside it, reject.c), so one row-wide cut does: every CTA of the row
 * computes the same logit threshold tau from a fixed sample of the row (the first kTauPerSlice values of each
 * slice, at most kTauSample values), the value of rank r in the sample with r chosen so that about
 * kTauMult * top_k of the row's logits are expected at or above it (r = top_k when the sample is the whole
 * row), and each slice's list is then its logits >= tau: one compare and one block scan a slice.
 * Nothing rests on tau being a good guess; the three ways it can fail are caught:
 *   - too high: U, every logit >= tau, must hold more than top_k values, or t (top-k's threshold) may lie
 *     outside it: else the row runs the one-block algorithm;
 *   - an edge: a logit below tau whose weight reaches t (ties in weight after rounding, or a guess just
 *     under the k-th value): one pass's guard (the largest logit left out of the lists) catches it;
 *   - too low (a slice with more than kListCap at or above tau): the slice overflows, the row takes the
 *     one-block algorithm.
 * tau depends on the row's logits and top_k alone, so which path a row takes never depends on the batch. */
constexpr int kTauPerSlice = 256; /* sampled values a slice (its first ones) */
constexpr int kTauSample = 8192;  /* sampled values a row at most */
constexpr int kTauMult = 4;       /* expected row values at or above tau, in units of top_k */
static_assert(kTauSample % kThreads == 0, "tau: the sample splits over the block");

/* order-preserving map of a float's bits to an unsigned key (larger float, larger key), and back */
__device__ __forceinline__ uint32_t float_key(float x) {
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}
__device__ __forceinline__ float key_float(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? k & 0x7FFFFFFFu : ~k);
}

/* tau for row logits x (see "tau lists"): the smallest float of the 20-bit key prefix (two radix levels of
 * 10 bits) that holds the sample's value of rank r, so at least r sampled values are >= tau. All threads of
 * the block call it and get the same value. */
__device__ float tau_threshold(const float *x, int32_t vocab, int top_k, Shared &s) {
    const int G = (vocab + kSlice - 1) / kSlice;
    int samp = (kTauSample / G) & ~3;
    samp = samp > kTauPerSlice ? kTauPerSlice : samp < 4 ? 4 : samp;
    const int gs = G < kTauSample / samp ? G : kTauSample / samp; /* slices sampled */
    const int last_len = vocab - (gs - 1) * kSlice < kSlice ? vocab - (gs - 1) * kSlice : kSlice;
    const int n_samp = (gs - 1) * samp + (last_len < samp ? last_len : samp); /* <= kTauSample */
    int r;
    if (n_samp >= vocab) {
        r = top_k;
    } else {
        const long long num = (long long)kTauMult * top_k * n_samp;
        r = (int)((num + vocab - 1) / vocab);
    }
    r = r < 1 ? 1 : r > n_samp ? n_samp : r;
    /* every sampled value loaded before any is used: one memory latency, not one a load */
    constexpr int kPer = kTauSample / kThreads;
    uint32_t key[kPer];
    unsigned valid = 0;
#pragma unroll
    for (int i = 0; i < kPer; i++) {
        const int e = (int)threadIdx.x + i * kThreads, c = e / samp;
        const int idx = c * kSlice + (e - c * samp);
        const bool ok = c < gs && idx < vocab;
        key[i] = ok ? __float_as_uint(__ldg(&x[idx])) : 0u;
        valid |= (unsigned)ok << i;
    }
#pragma unroll
    for (int i = 0; i < kPer; i++) key[i] = float_key(__uint_as_float(key[i]));
    uint32_t prefix = 0;
    int need = r;
    for (int level = 0; level < 2; level++) {
        const int sh = 22 - 10 * level;
        for (int b = threadIdx.x; b < kBins; b += kThreads) s.hist[b] = 0;
        __syncthreads();
#pragma unroll
        for (int i = 0; i < kPer; i++) {
            const bool in = ((valid >> i) & 1u) && (level == 0 || (key[i] >> 22) == prefix);
            /* level 0 (sign, exponent, one mantissa bit) crowds a few bins: warp-aggregated adds */
            if (level == 0) hist_add(s.hist, (key[i] >> sh) & 1023u, in, true);
            else if (in) atomicAdd(&s.hist[(key[i] >> sh) & 1023u], 1u);
        }
        __syncthreads();
        constexpr int kBinsPer = kBins / kThreads;
        int h[kBinsPer], hs = 0;
#pragma unroll
        for (int j = 0; j < kBinsPer; j++) {
            h[j] = (int)s.hist[kBins - 1 - ((int)threadIdx.x * kBinsPer + j)];
            hs += h[j];
        }
        int total;
        int excl = block_exclusive_sum(hs, &total, s);
#pragma unroll
        for (int j = 0; j < kBinsPer; j++) {
            const int b = kBins - 1 - ((int)threadIdx.x * kBinsPer + j);
            const int incl = excl + h[j];
            if ((incl >= need || b == 0) && excl < need) s.bcast[0] = b, s.bcast[1] = need - excl;
            excl = incl;
        }
        __syncthreads();
        const int bucket = s.bcast[0];
        need = s.bcast[1];
        __syncthreads();
        prefix = (prefix << 10) | (uint32_t)bucket;
    }
    return key_float(prefix << 12);
}

/* Slice c's tau list: its logits >= tau in id order (v: this thread's kItems from `first`); list_n and
 * overflow into the slice's part; *guard (this thread's running maximum of the logits left out) and *mn
 * (its running minimum) for the CTA's single reduction after its slices. All threads call it. */
__device__ void tau_slice(const float v[kItems], int first, int32_t vocab, int c, float tau, const RowPtrs &rp,
                          float *guard, float *mn, Shared &s) {
    int keep = 0;
#pragma unroll
    for (int j = 0; j < kItems; j++)
        if (first + j < vocab) {
            const bool k = v[j] >= tau;
            keep += k;
            if (!k) *guard = fmaxf(*guard, v[j]);
            *mn = fminf(*mn, v[j]);
        }
    int total;
    int pos = c * kListCap + block_exclusive_sum(keep, &total, s);
    const bool overflow = total > kListCap;
    if (!overflow) {
#pragma unroll
        for (int j = 0; j < kItems; j++)
            if (first + j < vocab && v[j] >= tau) rp.list_w[pos] = v[j], rp.list_id[pos] = first + j, pos++;
    }
    if (threadIdx.x == 0) {
        SlicePart *d = &rp.parts[c];
        d->c0 = vocab - c * kSlice < kSlice ? vocab - c * kSlice : kSlice; /* every weight > 0 (see "one pass") */
        d->m0 = 0.0, d->thr = 0u, d->list_n = overflow ? 0 : total, d->overflow = overflow;
    }
}

/* One CTA's part of the scan: slices [b * spc, + spc) of a row (p: its parameters, in shared memory): copy
 * (modified rows), bias and penalties of the slices' ids, argmaxes, finiteness, into parts[b] (the argmax
 * is order-free, so how slices group into CTAs changes no bit). sok: scalars_ok of the row. preload: load
 * each next slice before working on the current one (CTAs of several slices). All threads of the block
 * call it. */
template <bool kOnePass>
__device__ void scan_part(const float *__restrict__ logits, int32_t vocab, const osp_cuda_sample_row &p,
                          const int32_t *__restrict__ ids, const int32_t *__restrict__ bias_ids,
                          const float *__restrict__ bias_vals, const RowPtrs &rp, bool sok, int b, int spc,
                          bool preload, Shared &s) {
    const int G = (vocab + kSlice - 1) / kSlice;
    const int c_end = (b + 1) * spc < G ? (b + 1) * spc : G;
    const bool modified = row_modified(p), one = kOnePass && sok && is_one_pass_row(p, s.opts);
    const bool tau_row = kOnePass && one && is_tau_row(p, s.opts);
    int bad = 0, nan0 = 0;
    ArgMax2 am{{0.0f, -1}, {0.0f, -1}};
    MaxMin gm{-INFINITY, INFINITY}; /* tau rows: the largest logit left out of the lists, the smallest logit */
    if (sok) {
        if (b == 0 && !lists_ok(p, vocab, ids, bias_ids, bias_vals)) bad = 1;
        const float *x = logits + (size_t)p.logits_row * (size_t)vocab;
        bool nf = false;
        float nx[kItems]; /* preload: the next slice's raw values, loaded before this one's work */
        if (preload && b * spc < c_end) load_slice(x, vocab, b * spc * kSlice + (int)threadIdx.x * kItems, nx);
        /* after the first preload, so the slice's loads are in flight while tau is found; or found once a
         * row before the scan (kOptTauPre: sample_tau_kernel, for grids of many CTAs a row) */
        const float tau = !tau_row                  ? 0.0f
                          : (s.opts & kOptTauPre) ? __ldcg(&rp.st->tau_v)
                                                  : tau_threshold(x, vocab, p.top_k, s);
        for (int c = b * spc; c < c_end; c++) {
            const int first = c * kSlice + (int)threadIdx.x * kItems;
            float v[kItems];
            if (preload) {
#pragma unroll
                for (int j = 0; j < kItems; j++) v[j] = nx[j];
                if (c + 1 < c_end) load_slice(x, vocab, first + kSlice, nx);
            } else {
                load_slice(x, vocab, first, v);
            }
#pragma unroll
            for (int j = 0; j < kItems; j++)
                if (first + j < vocab) {
                    nf |= !(fabsf(v[j]) <= FLT_MAX);
                    if (am.raw.i < 0 || v[j] > am.raw.v) am.raw = ArgMax{v[j], first + j};
                }
            if (modified) {
#pragma unroll
                for (int j = 0; j < kItems; j++)
                    if (first + j < vocab) rp.w[first + j] = v[j];
                __syncthreads();
                const int32_t hi = vocab - c * kSlice < kSlice ? vocab : c * kSlice + kSlice;
                process_logits(p, rp.w, rp.cnt, ids, bias_ids, bias_vals, c * kSlice, hi);
                load_slice(rp.w, vocab, first, v);
                if (c == 0 && threadIdx.x == 0) nan0 = isnan(rp.w[0]);
            }
#pragma unroll
            for (int j = 0; j < kItems; j++)
                if (first + j < vocab && !isnan(v[j]) && (am.best.i < 0 || v[j] > am.best.v))
                    am.best = ArgMax{v[j], first + j};
            if (tau_row) tau_slice(v, first, vocab, c, tau, rp, &gm.mx, &gm.mn, s);
            else if (one) one_pass_slice(v, first, vocab, c, p, rp, s);
        }
        if (__syncthreads_or(nf)) bad = 1;
        am = block_reduce(am, ArgMax2Op(), s);
        if (tau_row) gm = block_reduce(gm, MaxMinOp(), s);
    }
    if (threadIdx.x == 0) {
        SlicePart *q = &rp.parts[b];
        q->raw_v = am.raw.v, q->raw_i = am.raw.i, q->best_v = am.best.v, q->best_i = am.best.i;
        q->bad = bad, q->nan0 = nan0;
        /* tau rows: the CTA's guard and minimum stand for each of its slices (the finisher and combine_scan
         * take the row's maximum and minimum over the slices: the same for any grouping); ref only scales
         * the zero masses and thresholds */
        if (tau_row)
            for (int c = b * spc; c < c_end; c++) rp.parts[c].ref = am.best.v, rp.parts[c].mn = gm.mn, rp.parts[c].guard = gm.mx;
    }
}

/* The row's scan from its CTAs' parts [0, nparts) (larger value, lower id: any grouping gives the same),
 * into the RowState when `write` (thread 0). Every thread of the block calls it and gets the same. */
struct ScanOut { /* what the select pass needs of a row's scan */
    bool ok, greedy, one_pass;
    ArgMax best;
};

template <bool kOnePass>
__device__ ScanOut combine_scan(const RowPtrs &rp, const osp_cuda_sample_row &p, int nparts, int G, bool sok,
                                bool write, Shared &s) {
    const bool modified = row_modified(p);
    ArgMax2 r{{0.0f, -1}, {0.0f, -1}};
    int anybad = 0;
    for (int i = threadIdx.x; i < nparts; i += kThreads) {
        const SlicePart *q = &rp.parts[i];
        r = ArgMax2Op()(r, ArgMax2{{__ldcg(&q->raw_v), __ldcg(&q->raw_i)}, {__ldcg(&q->best_v), __ldcg(&q->best_i)}});
        anybad |= __ldcg(&q->bad);
    }
    r = block_reduce(r, ArgMax2Op(), s);
    anybad = __syncthreads_or(anybad);
    bool ok = sok && !anybad;
    /* a modified row fails like the CPU's scan: no non-NaN value, a non-finite maximum, or w[0] NaN */
    if (ok && modified) ok = r.best.i >= 0 && isfinite(r.best.v) && !__ldcg(&rp.parts[0].nan0);
    const bool greedy = p.temperature < OSP_SAMPLING_EPS;
    bool one = kOnePass && ok && !greedy && is_one_pass_row(p, s.opts);
    if (one) { /* no weight underflows against the row's maximum (see "one pass") */
        float mn = INFINITY;
        for (int i = threadIdx.x; i < G; i += kThreads) mn = fminf(mn, __ldcg(&rp.parts[i].mn));
        mn = block_reduce(mn, MinFloatOp(), s);
        one = __fmul_rn(__fsub_rn(mn, r.best.v), __fdiv_rn(1.0f, p.temperature)) >= -87.0f;
    }
    if (write && threadIdx.x == 0) {
        rp.st->ok = ok;
        rp.st->greedy = greedy;
        rp.st->one_pass = one;
        rp.st->tau = one && is_tau_row(p, s.opts);
        rp.st->raw_v = r.raw.v, rp.st->raw_i = r.raw.i, rp.st->best_v = r.best.v, rp.st->best_i = r.best.i;
    }
    return ScanOut{ok, greedy, one, r.best};
}

/* tau for each tau row (one CTA a row) into its RowState, before the scan kernel reads it (kOptTauPre): a
 * row of many CTAs finds it once instead of in every CTA. The same function as the scan's own: the same
 * value. */
__global__ void __launch_bounds__(kThreads)
    sample_tau_kernel(const float *__restrict__ logits, int32_t vocab, const osp_cuda_sample_row *__restrict__ rows,
                      const int32_t *__restrict__ ids, const int32_t *__restrict__ bias_ids,
                      const float *__restrict__ bias_vals, unsigned char *scratch, Layout L, int opts) {
    osp_pdl_begin();
    __shared__ Shared s;
    __shared__ osp_cuda_sample_row p;
    shared_init(s, opts);
    if (threadIdx.x == 0) p = rows[blockIdx.x];
    __syncthreads();
    if (!scalars_ok(p, ids, bias_ids, bias_vals) || !is_tau_row(p, s.opts)) return;
    const RowPtrs rp = row_ptrs(scratch, L, (int)blockIdx.x);
    const float tau = tau_threshold(logits + (size_t)p.logits_row * (size_t)vocab, vocab, p.top_k, s);
    if (threadIdx.x == 0) rp.st->tau_v = tau;
}

/* Per CTA, slices [blockIdx.x * spc, + spc) of row blockIdx.y (scan_part); the row's last CTA combines
 * the parts into the RowState. kPreload (several slices a CTA): each next slice loaded before the current
 * one's work, 8 more registers a thread, so two CTAs an SM instead of three (40 registers spill).
 * kOnePass: eligible rows also build their lists (one_pass_slice; at 40 registers it spilled 652 bytes,
 * so two CTAs an SM as well). */
#ifndef OSPREY_SAMPLE_SCAN_CTAS
#define OSPREY_SAMPLE_SCAN_CTAS 3 /* the plain scan kernel's CTAs an SM (its register bound) */
#endif
template <bool kPreload, bool kOnePass>
__global__ void __launch_bounds__(kThreads, kPreload || kOnePass ? 2 : OSPREY_SAMPLE_SCAN_CTAS)
    sample_scan_kernel(const float *__restrict__ logits, int32_t vocab, const osp_cuda_sample_row *__restrict__ rows,
                       const int32_t *__restrict__ ids, const int32_t *__restrict__ bias_ids,
                       const float *__restrict__ bias_vals, unsigned char *scratch, Layout L, int spc, int opts) {
    osp_pdl_begin();
    __shared__ Shared s;
    __shared__ osp_cuda_sample_row p;
    shared_init(s, opts);
    if (threadIdx.x == 0) p = rows[blockIdx.y];
    __syncthreads();
    PH_CTA(0, 0);
    const RowPtrs rp = row_ptrs(scratch, L, (int)blockIdx.y);
    const bool sok = scalars_ok(p, ids, bias_ids, bias_vals);
    scan_part<kOnePass>(logits, vocab, p, ids, bias_ids, bias_vals, rp, sok, (int)blockIdx.x, spc, kPreload, s);
    PH_CTA(0, 1);
    if (!last_to_arrive(&rp.st->arrive_scan, gridDim.x)) return;
    combine_scan<kOnePass>(rp, p, (int)gridDim.x, (vocab + kSlice - 1) / kSlice, sok, true, s);
}

/* The weight of token i (< vocab) with logit l: the maximum's own is exactly 1. */
__device__ __forceinline__ float weight(int i, float l, const ArgMax &best, float inv_t) {
    return i == best.i ? 1.0f : exp_shifted(l, best.v, inv_t);
}

struct RowParams { /* what the select and finish kernels derive from a row */
    const float *x, *src;
    float inv_t, lo;
    int K;
};

__device__ __forceinline__ RowParams row_params(const osp_cuda_sample_row &p, const float *logits, int32_t vocab,
                                                const RowPtrs &rp) {
    RowParams r;
    r.x = logits + (size_t)p.logits_row * (size_t)vocab;
    r.src = row_modified(p) ? rp.w : r.x;
    r.inv_t = __fdiv_rn(1.0f, p.temperature);
    r.lo = p.min_p > 0.0f ? nextafterf(fminf(p.min_p, 1.0f), 0.0f) : 0.0f;
    r.K = p.top_k >= 1 && p.top_k <= kListKMax ? p.top_k : kListKDefault;
    return r;
}

/* Slices [c_begin, c_end) of a row still to sample, each on its own (a slice's results do not depend on
 * how slices group into CTAs): weights, count and mass above lo, the candidate list. fine: list_threshold_fine's
 * levels; preload: as scan_part's. */
__device__ void select_slices(const RowPtrs &rp, const RowParams &q, const ArgMax &best, int32_t vocab, int c_begin,
                              int c_end, bool fine, bool preload, Shared &s) {
    float nx[kItems]; /* preload: the next slice's values, loaded before this one's work */
    if (preload && c_begin < c_end) load_slice(q.src, vocab, c_begin * kSlice + (int)threadIdx.x * kItems, nx);
    for (int c = c_begin; c < c_end; c++) {
    const int first = c * kSlice + (int)threadIdx.x * kItems;
    float e[kItems];
    if (preload) {
#pragma unroll
        for (int j = 0; j < kItems; j++) e[j] = nx[j];
        if (c + 1 < c_end) load_slice(q.src, vocab, first + kSlice, nx);
    } else {
        load_slice(q.src, vocab, first, e);
    }
    Agg a{0, 0, 0.0, 0.0};
#pragma unroll
    for (int j = 0; j < kItems; j++) {
        e[j] = first + j < vocab ? weight(first + j, e[j], best, q.inv_t) : 0.0f;
        if (e[j] > q.lo) a.c0++, a.m0 += (double)e[j];
    }
    a = block_reduce(a, AggOp(), s);
    if (c == c_begin) PH_CTA(1, 2);
    const int need = a.c0 < q.K ? a.c0 : q.K;
    int count = 0;
    const uint32_t thr = need <= 0 ? 0xFFFFFFFFu
                         : fine    ? list_threshold_fine(e, q.lo, need, &count, s)
                                   : list_threshold(e, q.lo, need, &count, s);
    if (c == c_begin) PH_CTA(1, 3);
    const bool overflow = count > kListCap;
    int keep = 0;
#pragma unroll
    for (int j = 0; j < kItems; j++) keep += !overflow && e[j] > q.lo && __float_as_uint(e[j]) >= thr;
    int total;
    int pos = c * kListCap + block_exclusive_sum(keep, &total, s);
#pragma unroll
    for (int j = 0; j < kItems; j++)
        if (!overflow && e[j] > q.lo && __float_as_uint(e[j]) >= thr)
            rp.list_w[pos] = e[j], rp.list_id[pos] = first + j, pos++;
    if (threadIdx.x == 0) {
        SlicePart *d = &rp.parts[c];
        d->c0 = a.c0, d->m0 = a.m0, d->list_n = total, d->overflow = overflow, d->thr = thr;
    }
    }
}

/* The select pass alone: slices [blockIdx.x * spc, + spc) of row blockIdx.y (kPreload: as the scan's). */
template <bool kPreload>
__global__ void __launch_bounds__(kThreads, kPreload ? 2 : 3)
    sample_select_kernel(const float *__restrict__ logits, int32_t vocab, const osp_cuda_sample_row *__restrict__ rows,
                         unsigned char *scratch, Layout L, int spc, int opts) {
    osp_pdl_begin();
    __shared__ Shared s;
    __shared__ osp_cuda_sample_row p;
    const int row = blockIdx.y, G = (vocab + kSlice - 1) / kSlice;
    const RowPtrs rp = row_ptrs(scratch, L, row);
    if (!rp.st->ok || rp.st->greedy || rp.st->one_pass) return; /* written by the scan kernel, which has completed */
    shared_init(s, opts);
    if (threadIdx.x == 0) p = rows[row];
    __syncthreads();
    const ArgMax best{rp.st->best_v, rp.st->best_i};
    const int c_end = ((int)blockIdx.x + 1) * spc < G ? ((int)blockIdx.x + 1) * spc : G;
    PH_CTA(1, 0);
    select_slices(rp, row_params(p, logits, vocab, rp), best, vocab, (int)blockIdx.x * spc, c_end,
                  opts & kOptFineLists, kPreload, s);
    PH_CTA(1, 1);
}

/* The finishing kernel's view of the slices, a tile of kThreads slices at a time in shared memory. */
struct TileParts {
    double m0[kThreads];
    int c0[kThreads], list_n[kThreads], off[kThreads];
};

/* exp((ref - mx) / T) in double: a one-pass slice's mass (relative to its own largest logit ref) against
 * the row's maximum mx */
__device__ __forceinline__ double one_pass_scale(const SlicePart *d, float mx, float inv_t) {
    return exp(((double)__ldcg(&d->ref) - (double)mx) * (double)inv_t);
}

/* Loads slices [t0, t0 + kThreads) (those < G) into the tile; returns the tile's size. one: the slices'
 * masses are one pass's, scaled to the row's maximum mx (one_pass_scale). */
__device__ int load_tile(const SlicePart *parts, int G, int t0, TileParts &t, bool one = false, float mx = 0.0f,
                         float inv_t = 0.0f) {
    __syncthreads(); /* the previous tile is no longer read */
    const int i = t0 + (int)threadIdx.x;
    const bool in = i < G;
    /* through L2 (ld.global.cg): in the fused launch other CTAs of this kernel wrote them */
    t.m0[threadIdx.x] = in ? __ldcg(&parts[i].m0) * (one ? one_pass_scale(&parts[i], mx, inv_t) : 1.0) : 0.0;
    t.c0[threadIdx.x] = in ? __ldcg(&parts[i].c0) : 0;
    t.list_n[threadIdx.x] = in ? __ldcg(&parts[i].list_n) : 0;
    __syncthreads();
    return G - t0 < kThreads ? G - t0 : kThreads;
}

/* One draw over {e > lo} (temperature, min-p only: reject_sample's first round with neither filter):
 * the slice where the running mass, in slice order, crosses u * mass, then the token in it as
 * draw_index finds it in a chunk; the last candidate if rounding leaves the target at the total. The
 * slice is chosen by its select-pass mass (a block reduction) and the token by a block scan of the same
 * weights: where the two sums differ in the last bit and no thread crosses, the slice's last candidate
 * is taken (rounding only, as draw_index's own fallback). */
__device__ int draw_over_slices(const RowPtrs &rp, const RowParams &q, const ArgMax &best, int32_t vocab, int G,
                                double target, bool one, TileParts &t, Shared &s) {
    __shared__ int sh_slice, sh_last;
    __shared__ double sh_run;
    int found = -1, last_nz = 0; /* thread 0's walk, in registers across tiles */
    double run = 0.0;
    for (int t0 = 0; t0 < G; t0 += kThreads) {
        const int n = load_tile(rp.parts, G, t0, t, one, best.v, q.inv_t);
        if (threadIdx.x == 0)
            for (int j = 0; j < n && found < 0; j++) {
                if (t.c0[j] > 0) last_nz = t0 + j;
                if (run + t.m0[j] > target) found = t0 + j;
                else run += t.m0[j];
            }
    }
    if (threadIdx.x == 0) sh_slice = found, sh_last = last_nz, sh_run = run;
    __syncthreads();
    const int hit = sh_slice, sl = hit >= 0 ? hit : sh_last;
    const int f = sl * kSlice + (int)threadIdx.x * kItems;
    float y[kItems];
    load_slice(q.src, vocab, f, y);
    double tsum = 0.0;
    int last = -1;
#pragma unroll
    for (int j = 0; j < kItems; j++) {
        y[j] = f + j < vocab ? weight(f + j, y[j], best, q.inv_t) : 0.0f;
        y[j] = y[j] > q.lo ? y[j] : 0.0f;
        tsum += (double)y[j];
        if (y[j] > 0.0f) last = f + j;
    }
    if (hit < 0) return block_reduce(last, MaxIntOp(), s);
    double tot;
    const double excl = sh_run + block_exclusive_sum(tsum, &tot, s);
    int owner = block_reduce(tsum > 0.0 && excl + tsum > target ? (int)threadIdx.x : kThreads, MinIntOp(), s);
    if (owner == kThreads) owner = block_reduce(tsum > 0.0 ? (int)threadIdx.x : -1, MaxIntOp(), s);
    if ((int)threadIdx.x == owner) {
        double acc = excl;
        int pick = f;
#pragma unroll
        for (int j = 0; j < kItems; j++)
            if (y[j] > 0.0f && !(acc > target)) acc += (double)y[j], pick = f + j;
        s.bcast[0] = pick;
    }
    __syncthreads();
    const int token = s.bcast[0];
    __syncthreads();
    return token;
}

/* U, the slices' lists in slice order (each in id order, so view order is id order), into uw / uid. one:
 * the lists hold logits (one pass), turned into weights against the row's maximum here. */
__device__ int gather_lists(const RowPtrs &rp, int G, float *uw, int32_t *uid, bool one, const ArgMax &best,
                            float inv_t, TileParts &t, Shared &s) {
    int n = 0;
    for (int t0 = 0; t0 < G; t0 += kThreads) {
        const int m = load_tile(rp.parts, G, t0, t);
        int total;
        t.off[threadIdx.x] = block_exclusive_sum(t.list_n[threadIdx.x], &total, s);
        __syncthreads();
        /* entry o of the tile: slice j with off[j] <= o < off[j] + list_n[j], by binary search */
        for (int o = threadIdx.x; o < total; o += kThreads) {
            int a = 0, b = m - 1;
            while (a < b) {
                const int mid = (a + b + 1) / 2;
                if (t.off[mid] <= o) a = mid;
                else b = mid - 1;
            }
            const size_t src = (size_t)(t0 + a) * kListCap + (size_t)(o - t.off[a]);
            const float w = __ldcg(&rp.list_w[src]);
            const int32_t id = __ldcg(&rp.list_id[src]);
            uw[n + o] = one ? weight(id, w, best, inv_t) : w;
            uid[n + o] = id;
        }
        n += total;
    }
    __syncthreads();
    return n;
}

/* Entries of U the finishing kernel keeps in shared memory (its dynamic part: values and ids, 24 KB) when
 * OSPREY_SAMPLE_SMEM_U is not 0; a larger U stays in the row's scratch. Same operations, same bits. */
constexpr int kUCap = 3072;
constexpr size_t kUSmemBytes = (size_t)kUCap * 8u;

/* Grids of at most this many CTAs (rows x slices) run select and finish as one launch (one CTA an SM:
 * the finishing code needs 128 registers a thread), the same bits; OSPREY_SAMPLE_FUSED=0 launches them
 * apart. Default since 2026-12-05 (H200, bench/gpu/sample.sh: never slower, B = 128 top-k + top-p
 * 423 -> 351 us with the grouping below, greedy 194 -> 123). */
constexpr int64_t kFusedCtas = 132;

/* The integer value of the environment variable `name`, or `dflt` when it is unset; read once into
 * *cache (INT64_MIN before). The sampler's launch-shape switches below; every shape gives the same bits. */
int64_t env_int(const char *name, int64_t dflt, int64_t *cache) {
    if (*cache == INT64_MIN) {
        const char *e = getenv(name);
        *cache = e ? atoll(e) : dflt;
    }
    return *cache;
}

bool sample_fused(void) {
    static int64_t v = INT64_MIN;
    return env_int("OSPREY_SAMPLE_FUSED", 1, &v) == 1;
}

/* A sliced pass whose grid would pass N CTAs gives each CTA several slices (the same bits: see
 * sample_scan_kernel): N = OSPREY_SAMPLE_GRID_CTAS, default 1024 (measured with kFusedCtas above);
 * 0: one slice a CTA whatever the grid. */
int64_t sample_grid_ctas(void) {
    static int64_t v = INT64_MIN;
    const int64_t n = env_int("OSPREY_SAMPLE_GRID_CTAS", 1024, &v);
    return n > 0 ? n : 0;
}

/* OSPREY_SAMPLE_SMEM_U=0 keeps U in the row's scratch (see kUCap) */
bool sample_smem_u(void) {
    static int64_t v = INT64_MIN;
    return env_int("OSPREY_SAMPLE_SMEM_U", 1, &v) != 0;
}

/* Views of U of at most this many entries run reject_sample on warp 0 alone (WarpGrp), larger ones on
 * the block: the finisher's ~50 block-wide steps (radix levels, scans, rounds) are each a fraction of
 * a microsecond of barriers, a warp's are a few shuffles, and a warp pass over 3,072 values in shared
 * memory is ~100 loads a lane. OSPREY_SAMPLE_WARP_VIEW=N turns it on for U <= N (kWarpView suggested; 0,
 * the default until it is measured outside ncu: always the block); passed test_gpu_sampler on an H100
 * (2026-12-06). The choice depends on the row's U alone, so never on the batch. */
constexpr int64_t kWarpView = 3072; /* the bound to try (U in shared memory holds up to kUCap) */
static_assert(kWarpView <= kUCap, "a warp's view stays in shared memory");

int64_t sample_warp_view(void) {
    static int64_t v = INT64_MIN;
    const int64_t n = env_int("OSPREY_SAMPLE_WARP_VIEW", 0, &v);
    return n > 0 ? (n < (1 << 30) ? n : (1 << 30)) : 0;
}

/* Row `row`'s token (p: its parameters, in shared memory), from the RowState and, for rows sampled, the
 * slices' parts: greedy and failed rows at once, the others as "the sliced passes" say; then logprobs.
 * dyn: kUSmemBytes of shared memory for U when smem_u; warp_view: see kWarpView. All threads of the block
 * call it. */
__device__ void finish_row(const float *__restrict__ logits, int32_t vocab, const osp_cuda_sample_row &p, int row,
                           unsigned char *scratch, const Layout &L, int32_t *__restrict__ tokens,
                           osp_status *__restrict__ status, osp_logprobs *__restrict__ lps, int max_rounds,
                           int32_t *__restrict__ rounds_out, int smem_u, int warp_view, unsigned char *dyn,
                           Shared &s) {
    __shared__ TileParts t;
    __shared__ double sh_mass;
    __shared__ int sh_token, sh_rounds, sh_used;
    const int G = (vocab + kSlice - 1) / kSlice;
    const RowPtrs rp = row_ptrs(scratch, L, row);
    /* through L2: in the one-launch kernel another CTA of this launch wrote them */
    const bool ok = __ldcg(&rp.st->ok), greedy = __ldcg(&rp.st->greedy), one = __ldcg(&rp.st->one_pass);
    const bool tau = one && __ldcg(&rp.st->tau);
    const ArgMax best{__ldcg(&rp.st->best_v), __ldcg(&rp.st->best_i)};
    int token = 0, rounds = 0;
#ifdef OSPREY_SAMPLE_PHASES
    if (threadIdx.x == 0) s.ph_row = row; /* read by thread 0 alone (PH_SUB) */
#endif
    PH_FIN(row, 0, clock64());
    PH_FIN(row, 6, 0);
    if (ok && greedy) {
        token = best.i;
    } else if (ok) {
        const RowParams q = row_params(p, logits, vocab, rp);
        /* the row's count and mass of {e > lo}: counts by the block, the mass in slice order */
        /* floor: the highest list threshold of a slice whose list holds >= top_k values (>= top_k of the
         * row's weights lie at or above it, so top-k's threshold does too); one pass: that threshold
         * against the row's maximum, less a margin (see "one pass"), and guard_bits the largest weight
         * left out of a list (0: none) */
        int cnt_lo = 0, ovf = 0, n_u = 0, floor_bits = 0, guard_bits = 0;
        if (threadIdx.x == 0) sh_mass = 0.0;
        for (int t0 = 0; t0 < G; t0 += kThreads) {
            const int n = load_tile(rp.parts, G, t0, t, one, best.v, q.inv_t);
            cnt_lo += t.c0[threadIdx.x];
            n_u += t.list_n[threadIdx.x];
            if ((int)threadIdx.x < n) {
                const SlicePart *d = &rp.parts[t0 + (int)threadIdx.x];
                const int o = __ldcg(&d->overflow);
                int thr = (int)__ldcg(&d->thr);
                ovf |= o;
                if (one) {
                    const float g = __ldcg(&d->guard);
                    const int gb = g > -INFINITY ? __float_as_int(exp_shifted(g, best.v, q.inv_t)) : 0;
                    guard_bits = gb > guard_bits ? gb : guard_bits;
                    if (!o && t.list_n[threadIdx.x] > 0)
                        thr = __float_as_int((float)((double)__int_as_float(thr) * one_pass_scale(d, best.v, q.inv_t) *
                                                     (1.0 - 1e-4)));
                }
                if (!o && p.top_k >= 1 && t.list_n[threadIdx.x] >= p.top_k && thr > floor_bits) floor_bits = thr;
            }
            if (threadIdx.x == 0)
                for (int j = 0; j < n; j++) sh_mass += t.m0[j];
        }
        cnt_lo = block_reduce(cnt_lo, SumIntOp(), s); /* also publishes sh_mass */
        n_u = block_reduce(n_u, SumIntOp(), s);
        floor_bits = block_reduce(floor_bits, MaxIntOp(), s);
        guard_bits = block_reduce(guard_bits, MaxIntOp(), s);
        ovf = __syncthreads_or(ovf);
        const double mass_lo = sh_mass;
        PH_FIN(row, 1, clock64());
        PH_FIN(row, 5, n_u);
        const bool p_on = p.top_p < 1.0f;
        const int k = p.top_k > 0 && p.top_k < cnt_lo ? p.top_k : 0;
        /* a tau row's U must hold more than top_k values (see "tau lists") */
        const bool covered = !ovf && (!tau || n_u > p.top_k) &&
                             (k == 1 || (p_on && p.top_p <= 0.0f) || cnt_lo <= q.K || (k > 0 && p_on && k <= q.K));
        bool whole = false; /* the one-block algorithm over the whole row */
        if (covered) {
            const bool in_smem = smem_u && n_u <= kUCap;
            float *uw = in_smem ? reinterpret_cast<float *>(dyn) : rp.w;
            int32_t *uid = in_smem ? reinterpret_cast<int32_t *>(dyn + (size_t)kUCap * 4u)
                                   : reinterpret_cast<int32_t *>(rp.cnt);
            const int n = gather_lists(rp, G, uw, uid, one, best, q.inv_t, t, s);
            View v{uw, uid, n, true, n};
            /* floor_bits came from weights > lo >= 0: a float in (0, 1], or 0 for none */
            const float kth_floor = floor_bits > 0 ? nextafterf(__int_as_float(floor_bits), 0.0f) : 0.0f;
            const float guard = __int_as_float(guard_bits);
            PH_FIN(row, 2, clock64());
            PH_FIN(row, 6, n <= warp_view ? 1 : 2);
            if (n <= warp_view) {
                if (threadIdx.x < 32) {
                    int r = 0;
                    const int tok = reject_sample<WarpGrp>(v, p.top_k, p.top_p, q.lo, cnt_lo, mass_lo, p.seed,
                                                           p.sample_index, p.output_pos, max_rounds, &r, kth_floor,
                                                           guard, s);
                    if (threadIdx.x == 0) sh_token = tok, sh_rounds = r, sh_used = v.ids_used;
                }
                __syncthreads();
                token = sh_token, rounds = sh_rounds, v.ids_used = sh_used;
            } else {
                token = reject_sample<BlockGrp>(v, p.top_k, p.top_p, q.lo, cnt_lo, mass_lo, p.seed, p.sample_index,
                                                p.output_pos, max_rounds, &rounds, kth_floor, guard, s);
            }
            PH_FIN(row, 3, clock64());
            if (!in_smem) {
                __syncthreads();
                for (int i = threadIdx.x; i < v.ids_used; i += kThreads) rp.cnt[i] = 0u;
            }
            whole = token < 0; /* one pass: a weight left out of a list ties with the candidates' edge */
        } else if (!k && !p_on && max_rounds > 0) {
            PH_FIN(row, 6, 3);
            const double target = uniform_at(p.seed, p.sample_index, p.output_pos, 0) * mass_lo;
            token = draw_over_slices(rp, q, best, vocab, G, target, one, t, s);
        } else {
            whole = true;
        }
        if (whole) {
            PH_FIN(row, 6, 4);
            __syncthreads(); /* U (in rp.w when not in shared memory) is no longer read */
            for_each<BlockGrp>(q.src, vocab, [&](int i, float l) { rp.w[i] = weight(i, l, best, q.inv_t); });
            __syncthreads();
            View v{rp.w, reinterpret_cast<int32_t *>(rp.cnt), vocab, false, 0};
            token = reject_sample<BlockGrp>(v, p.top_k, p.top_p, q.lo, cnt_lo, mass_lo, p.seed, p.sample_index,
                                            p.output_pos, max_rounds, &rounds, 0.0f, 0.0f, s);
            if (v.ids_used > 0) {
                __syncthreads();
                for (int i = threadIdx.x; i < v.ids_used; i += kThreads) rp.cnt[i] = 0u;
            }
        }
    }
    PH_FIN(row, 7, rounds);
    PH_FIN(row, 4, clock64());
    if (ok && lps && p.num_logprobs >= 0)
        fill_logprobs(logits + (size_t)p.logits_row * (size_t)vocab, vocab, token, p.num_logprobs, __ldcg(&rp.st->raw_v),
                      &lps[row], s);
    if (threadIdx.x == 0) {
        tokens[row] = ok ? token : 0;
        status[row] = ok ? OSP_OK : OSP_ERR_INVALID_ARG;
        if (rounds_out) rounds_out[row] = ok ? rounds : 0;
    }
}

/* One CTA per row: finish_row. Dynamic shared memory: 0, or kUSmemBytes for U. */
__global__ void __launch_bounds__(kThreads)
    sample_finish_kernel(const float *__restrict__ logits, int32_t vocab, const osp_cuda_sample_row *__restrict__ rows,
                         unsigned char *scratch, Layout L, int32_t *__restrict__ tokens,
                         osp_status *__restrict__ status, osp_logprobs *__restrict__ lps, int max_rounds,
                         int32_t *__restrict__ rounds_out, int smem_u, int warp_view, int opts) {
    osp_pdl_begin();
    extern __shared__ __align__(16) unsigned char dyn[];
    __shared__ Shared s;
    __shared__ osp_cuda_sample_row p;
    shared_init(s, opts);
    if (threadIdx.x == 0) p = rows[blockIdx.x];
    __syncthreads();
    finish_row(logits, vocab, p, (int)blockIdx.x, scratch, L, tokens, status, lps, max_rounds, rounds_out, smem_u,
               warp_view, dyn, s);
}

/* The select pass and the finish in one launch, for small grids (one slice a CTA): the row's last CTA to
 * finish its slice runs finish_row (the same function as sample_finish_kernel's: the same bits). A row
 * the scan finished (greedy, failed) is finished by its CTA 0 alone. */
__global__ void __launch_bounds__(kThreads)
    sample_select_finish_kernel(const float *__restrict__ logits, int32_t vocab,
                                const osp_cuda_sample_row *__restrict__ rows, unsigned char *scratch, Layout L,
                                int32_t *__restrict__ tokens, osp_status *__restrict__ status,
                                osp_logprobs *__restrict__ lps, int max_rounds, int32_t *__restrict__ rounds_out,
                                int smem_u, int warp_view, int opts) {
    osp_pdl_begin();
    extern __shared__ __align__(16) unsigned char dyn[];
    __shared__ Shared s;
    __shared__ osp_cuda_sample_row p;
    const int row = blockIdx.y, c = blockIdx.x;
    const RowPtrs rp = row_ptrs(scratch, L, row);
    /* written by the scan kernel, which has completed */
    const bool done = !rp.st->ok || rp.st->greedy || rp.st->one_pass;
    if (done && c != 0) return;
    shared_init(s, opts);
    if (threadIdx.x == 0) p = rows[row];
    __syncthreads();
    if (!done) {
        const ArgMax best{rp.st->best_v, rp.st->best_i};
        PH_CTA(1, 0);
        select_slices(rp, row_params(p, logits, vocab, rp), best, vocab, c, c + 1, opts & kOptFineLists, false, s);
        PH_CTA(1, 1);
        if (!last_to_arrive(&rp.st->arrive_select, gridDim.x)) return;
    }
    finish_row(logits, vocab, p, row, scratch, L, tokens, status, lps, max_rounds, rounds_out, smem_u, warp_view, dyn,
               s);
}

/* A barrier among the `ctas` CTAs of a row, every one of them resident (the cooperative launch below
 * guarantees it): the last to arrive resets the count and moves the generation on, the others wait for
 * the generation to move (read before arriving). Makes each CTA's earlier writes visible to the others.
 * All threads of each CTA call it. */
__device__ void row_barrier(unsigned *count, unsigned *gen, unsigned ctas) {
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *vg = gen;
        const unsigned g = *vg;
        __threadfence();
        if (atomicAdd(count, 1u) == ctas - 1u) {
            *count = 0u;
            __threadfence();
            atomicExch(gen, g + 1u);
        } else {
            while (*vg == g) __nanosleep(32);
        }
        __threadfence();
    }
    __syncthreads();
}

/* The scan, the select pass and the finish in one launch for small grids (one slice a CTA, all CTAs
 * resident: a cooperative launch): a row barrier stands where the kernel boundary was, and every CTA
 * combines the row's parts itself (the same reduction as the scan's last CTA: the same bits; CTA 0
 * stores it for finish_row). Then as sample_select_finish_kernel. Saves a launch and the scan's tail. */
__global__ void __launch_bounds__(kThreads)
    sample_one_launch_kernel(const float *__restrict__ logits, int32_t vocab,
                             const osp_cuda_sample_row *__restrict__ rows, const int32_t *__restrict__ ids,
                             const int32_t *__restrict__ bias_ids, const float *__restrict__ bias_vals,
                             unsigned char *scratch, Layout L, int32_t *__restrict__ tokens,
                             osp_status *__restrict__ status, osp_logprobs *__restrict__ lps, int max_rounds,
                             int32_t *__restrict__ rounds_out, int smem_u, int warp_view, int opts) {
    osp_pdl_begin();
    extern __shared__ __align__(16) unsigned char dyn[];
    __shared__ Shared s;
    __shared__ osp_cuda_sample_row p;
    const int row = blockIdx.y, c = blockIdx.x;
    shared_init(s, opts);
    if (threadIdx.x == 0) p = rows[row];
    __syncthreads();
    const RowPtrs rp = row_ptrs(scratch, L, row);
    const bool sok = scalars_ok(p, ids, bias_ids, bias_vals);
    PH_CTA(0, 0);
    /* tau rows load their slice first, so the loads overlap finding tau */
    scan_part<true>(logits, vocab, p, ids, bias_ids, bias_vals, rp, sok, c, 1, is_tau_row(p, s.opts), s);
    row_barrier(&rp.st->arrive_row, &rp.st->gen_row, gridDim.x);
    PH_CTA(0, 1);
    const ScanOut so = combine_scan<true>(rp, p, (int)gridDim.x, (vocab + kSlice - 1) / kSlice, sok, c == 0, s);
    __syncthreads(); /* CTA 0: thread 0's RowState is visible to its block */
    if (!so.ok || so.greedy || so.one_pass) {
        if (c == 0)
            finish_row(logits, vocab, p, row, scratch, L, tokens, status, lps, max_rounds, rounds_out, smem_u,
                       warp_view, dyn, s);
        return;
    }
    PH_CTA(1, 0);
    select_slices(rp, row_params(p, logits, vocab, rp), so.best, vocab, c, c + 1, opts & kOptFineLists, false, s);
    PH_CTA(1, 1);
    if (!last_to_arrive(&rp.st->arrive_select, gridDim.x)) return;
    finish_row(logits, vocab, p, row, scratch, L, tokens, status, lps, max_rounds, rounds_out, smem_u, warp_view, dyn,
               s);
}

/* The slices' lists by the fine radix levels (list_threshold_fine), the default since 2026-12-06
 * (H100, bench/gpu/sample.sh: never slower, top-k 50 + top-p 0.9 at B = 128 169.2 -> 161.4 us, U 2,634 ->
 * 1,816 entries a row); OSPREY_SAMPLE_LIST_BITS=8: list_threshold's coarse levels. */
bool sample_list_fine(void) {
    static int64_t v = INT64_MIN;
    return env_int("OSPREY_SAMPLE_LIST_BITS", 10, &v) != 8;
}

/* top-k's radix select (kth_largest) adds through hist_add's warp aggregation (see there; the same counts,
 * so the same bits); OSPREY_SAMPLE_HIST_AGG=0: plain atomics. */
bool sample_hist_agg(void) {
    static int64_t v = INT64_MIN;
    return env_int("OSPREY_SAMPLE_HIST_AGG", 1, &v) != 0;
}

/* OSPREY_SAMPLE_ONE_PASS=1: rows that modify no logit and have no min-p build their lists in the scan
 * (see "one pass"); opt-in until measured on a device. */
bool sample_one_pass(void) {
    static int64_t v = INT64_MIN;
    return env_int("OSPREY_SAMPLE_ONE_PASS", 0, &v) == 1;
}

/* Whether rows with top-k and top-p both on cut their lists at one row-wide threshold in the scan (see "tau
 * lists") in a call of num_rows rows: from kTauAutoRows rows on (OSPREY_SAMPLE_TAU=1: always, 0: never).
 * Measured on an H100 (bench/gpu/DECODE.md, fifteenth session), top-k 50 + top-p 0.9 at vocab 128,256:
 * B = 1 / 8 / 32 44.2 / 50.5 / 78.4 us with it against 37.4 / 44.5 / 73.6 without; the default then gave
 * 134.7 / 210.6 us at B = 128 / 256 against 161.4 / 276.2 before. A row's token is the same on either path
 * (both draw exactly from the same distribution with the same uniforms: test_gpu_sampler's batch invariance
 * mixes calls of 48, 1 and 96 rows and passed with the default), so choosing by the call's size keeps a
 * request's tokens independent of its batch. */
constexpr int32_t kTauAutoRows = 64;
bool sample_tau(int32_t num_rows) {
    static int64_t v = INT64_MIN;
    const int64_t e = env_int("OSPREY_SAMPLE_TAU", -1, &v);
    return e == 1 || (e != 0 && num_rows >= kTauAutoRows);
}

/* tau found once a row by sample_tau_kernel before the scan where a row has several scan CTAs
 * (OSPREY_SAMPLE_TAU_PRE=0: every CTA finds it itself, as in one launch) */
bool sample_tau_pre(void) {
    static int64_t v = INT64_MIN;
    return env_int("OSPREY_SAMPLE_TAU_PRE", 1, &v) != 0;
}

/* OSPREY_SAMPLE_PRELOAD=1: the sliced passes' CTAs of several slices load each next slice before working on
 * the current one (kPreload); opt-in until measured on a device */
bool sample_preload(void) {
    static int64_t v = INT64_MIN;
    return env_int("OSPREY_SAMPLE_PRELOAD", 0, &v) == 1;
}

/* Small grids run in sample_one_launch_kernel (the same bits), the default since 2026-12-06 (H100,
 * bench/gpu/sample.sh: B = 1 top-k 50 + top-p 0.9 38.9 -> 37.5 us, greedy 15.3 -> 11.8, T = 1 26.1 ->
 * 24.1; B = 8 the same within 0.4 us); OSPREY_SAMPLE_ONE_LAUNCH=0: scan, then select with finish. */
bool sample_one_launch(void) {
    static int64_t v = INT64_MIN;
    return env_int("OSPREY_SAMPLE_ONE_LAUNCH", 1, &v) != 0;
}

/* How many CTAs of sample_one_launch_kernel (dyn bytes of dynamic shared memory) can be resident at once
 * on the current device (0 if unknown): a larger grid may not launch cooperatively. Cached per device. */
int one_launch_capacity(size_t dyn) {
    static int cap[64][2];
    static bool known[64][2];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    const int d = dyn ? 1 : 0;
    if (!known[dev][d]) {
        int sms = 0, per_sm = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sample_one_launch_kernel, kThreads, dyn) !=
                cudaSuccess)
            sms = 0, per_sm = 0;
        cap[dev][d] = sms * per_sm;
        known[dev][d] = true;
    }
    return cap[dev][d];
}

size_t round_up_256(size_t b) { return (b + 255u) & ~(size_t)255u; }

/* A row's scratch: w [vocab] f32 | cnt [vocab] u32 | list values [slices x kListCap] f32 | list ids
 * (same) | SlicePart [slices] | RowState, each part 256-byte aligned. */
Layout layout_for(int32_t vocab) {
    const size_t slices = ((size_t)vocab + kSlice - 1) / kSlice;
    Layout L;
    const size_t w = round_up_256((size_t)vocab * 4u), list = round_up_256(slices * kListCap * 4u);
    L.cnt = w;
    L.list_w = L.cnt + w;
    L.list_id = L.list_w + list;
    L.parts = L.list_id + list;
    L.state = L.parts + round_up_256(slices * sizeof(SlicePart));
    L.row_bytes = L.state + round_up_256(sizeof(RowState));
    return L;
}

} /* namespace */

extern "C" {

#ifdef OSPREY_SAMPLE_PHASES
/* The profiling build's marks (see OSPREY_SAMPLE_PHASES): fin [256 * 16], cta [2 * 8192 * 4]. */
void osp_cuda_sample_phases(long long *fin, long long *cta) {
    cudaDeviceSynchronize();
    cudaMemcpyFromSymbol(fin, g_fin, sizeof g_fin);
    cudaMemcpyFromSymbol(cta, g_cta, sizeof g_cta);
}
int osp_cuda_sample_phases_clock_khz(void) {
    int dev = 0, khz = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev);
    return khz;
}
void osp_cuda_sample_phases_clear(void) {
    static long long z[2][8192][4];
    cudaMemcpyToSymbol(g_cta, z, sizeof z);
}
#endif

size_t osp_cuda_sample_scratch_bytes(int32_t max_rows, int32_t vocab) {
    if (max_rows <= 0 || vocab <= 0 || vocab > kMaxVocab) return 0;
    return (size_t)max_rows * layout_for(vocab).row_bytes;
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
    const Layout L = layout_for(vocab);
    const int64_t slices = ((int64_t)vocab + kSlice - 1) / kSlice;
    for (int32_t r0 = 0; r0 < num_rows; r0 += 65535) { /* the grid's second dimension holds 65,535 rows */
        const int32_t n = num_rows - r0 < 65535 ? num_rows - r0 : 65535;
        unsigned char *sc = (unsigned char *)d_scratch + (size_t)r0 * L.row_bytes;
        osp_logprobs *lp = d_logprobs ? d_logprobs + r0 : NULL;
        int32_t *rd = d_rounds ? d_rounds + r0 : NULL;
        /* slices a CTA: one, or (OSPREY_SAMPLE_GRID_CTAS) more once the grid would pass that many CTAs,
         * so a large batch is not thousands of CTAs of fixed overhead each (no bit depends on it) */
        const int smem_u = sample_smem_u() ? 1 : 0;
        const int warp_view = (int)sample_warp_view();
        const size_t dyn = smem_u ? kUSmemBytes : 0;
        const int opts = (sample_list_fine() ? kOptFineLists : 0) | (sample_hist_agg() ? kOptHistAgg : 0) |
                         (sample_one_pass() ? kOptOnePass : 0) | (sample_tau(num_rows) ? kOptTau : 0);
        if ((int64_t)n * slices <= kFusedCtas && sample_fused() && sample_one_launch() &&
            (int64_t)n * slices <= one_launch_capacity(dyn)) { /* a small grid: everything in one launch */
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeCooperative;
            attr[0].val.cooperative = 1;
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)slices, (unsigned)n);
            cfg.blockDim = dim3(kThreads);
            cfg.dynamicSmemBytes = dyn;
            cfg.stream = (cudaStream_t)stream;
            cfg.attrs = attr;
            cfg.numAttrs = 1;
            (void)cudaLaunchKernelEx(&cfg, sample_one_launch_kernel, d_logits, vocab, d_rows + r0, d_ids, d_bias_ids,
                                     d_bias_vals, sc, L, d_tokens + r0, d_status + r0, lp, (int)max_rounds, rd, smem_u,
                                     warp_view, opts);
            OSP_CUDA_LAUNCH_CHECK("sample_one_launch_kernel");
            continue;
        }
        const int64_t grid_ctas = sample_grid_ctas();
        int64_t spc = grid_ctas > 0 ? ((int64_t)n * slices + grid_ctas - 1) / grid_ctas : 1;
        spc = spc < 1 ? 1 : spc > slices ? slices : spc;
        const dim3 grid((unsigned)((slices + spc - 1) / spc), (unsigned)n);
        const bool preload = spc > 1 && sample_preload();
        const bool one_pass = (opts & (kOptOnePass | kOptTau)) != 0;
        /* tau once a row (sample_tau_kernel) where the row's CTAs would each find it again */
        int sopts = opts;
        if ((opts & kOptTau) && (slices + spc - 1) / spc > 1 && sample_tau_pre()) {
            osp_launch(sample_tau_kernel, dim3((unsigned)n), kThreads, 0, (cudaStream_t)stream, d_logits, vocab,
                       d_rows + r0, d_ids, d_bias_ids, d_bias_vals, sc, L, opts);
            OSP_CUDA_LAUNCH_CHECK("sample_tau_kernel");
            sopts |= kOptTauPre;
        }
        osp_launch(preload ? (one_pass ? sample_scan_kernel<true, true> : sample_scan_kernel<true, false>)
                           : (one_pass ? sample_scan_kernel<false, true> : sample_scan_kernel<false, false>),
                   grid, kThreads, 0,
                   (cudaStream_t)stream, d_logits, vocab, d_rows + r0, d_ids, d_bias_ids, d_bias_vals, sc, L, (int)spc,
                   sopts);
        OSP_CUDA_LAUNCH_CHECK("sample_scan_kernel");
        if ((int64_t)n * slices <= kFusedCtas && sample_fused()) { /* a small grid: select and finish in one */
            osp_launch(sample_select_finish_kernel, dim3((unsigned)slices, (unsigned)n), kThreads, dyn,
                       (cudaStream_t)stream, d_logits, vocab, d_rows + r0, sc, L, d_tokens + r0, d_status + r0, lp,
                       (int)max_rounds, rd, smem_u, warp_view, opts);
            OSP_CUDA_LAUNCH_CHECK("sample_select_finish_kernel");
            continue;
        }
        osp_launch(preload ? sample_select_kernel<true> : sample_select_kernel<false>, grid, kThreads, 0,
                   (cudaStream_t)stream, d_logits, vocab, d_rows + r0, sc, L, (int)spc, opts);
        OSP_CUDA_LAUNCH_CHECK("sample_select_kernel");
        osp_launch(sample_finish_kernel, dim3((unsigned)n), kThreads, dyn, (cudaStream_t)stream, d_logits, vocab,
                   d_rows + r0, sc, L, d_tokens + r0, d_status + r0, lp, (int)max_rounds, rd, smem_u, warp_view, opts);
        OSP_CUDA_LAUNCH_CHECK("sample_finish_kernel");
    }
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
