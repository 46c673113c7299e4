/* Skinny bf16 GEMMs: y = x w^T for a few rows of x (T <= OSP_CUDA_SKINNY_MAX_T), the decode step's
 * weight stream (issue 17: weights at bandwidth), with the bits of cuBLASLt's plans that do not split K.
 *
 * Why its own kernel. cuBLASLt without split-K gives a row of y the same bits whatever T and whatever
 * tile it picks (measured, tests/gpu/test_gpu_gemm.c): every output is one fp32 chain of tensor-core
 * k16 steps in K order from zero. At decode's T it then runs a few CTAs over a narrow N (o and down of
 * an 8B model: N = 4096), which is why its heuristic splits K there, and a split changes the bits
 * (bench/gpu/DECODE.md, seventh session). This kernel keeps the chain (so every T gives cuBLASLt's
 * unsplit bits) and finds its parallelism in N instead: every warp owns 16 weight rows and streams them.
 *
 *   chain      per output y[t, n]: acc = -0; for k0 = 0, 16, .. K - 16: acc = mma(w[n, k0 .. k0 + 15],
 *              x[t, k0 .. k0 + 15], acc) by mma.sync m16n8k16 (A = 16 weight rows, B = 8 tokens), the
 *              canonical k-slot layout (ldmatrix of row-major tiles, no permutation); y = acc (fp32) or
 *              bf16(acc) rounded to nearest even (-0 is the identity of IEEE addition: a sum of
 *              products that are all -0 stays -0, as a first step with no accumulator gives). That equals cuBLASLt's unsplit result bit for bit is a
 *              measurement (test_gpu_gemm compares every T against cuBLASLt at T = 2048), not a documented
 *              property of the tensor core.
 *   stream     a CTA = W consumer warps (16 W rows) + 1 producer warp. The producer brings chunks of KC
 *              values of every row (and of the T rows of x) to shared memory with cp.async.bulk (TMA, one
 *              copy a row), S stages deep, each stage handed over by an mbarrier pair (full: the bytes
 *              landed; empty: every consumer warp has read it). CTAs are persistent: tile b, b + grid, ..
 *              so the pipeline runs on across tiles. Rows padded by 16 bytes in shared memory: ldmatrix's
 *              8 rows fall in 8 distinct 16-byte bank groups.
 *   tails      rows past N are neither loaded nor stored (their accumulators are junk from stale shared
 *              memory: row m of an mma's output depends only on row m of A); token rows past T are zero
 *              (written once at the start, never loaded over) and their columns are not stored.
 * Status: test_gpu_gemm passes with it on an H100 (cuBLASLt's unsplit bits for every T, both this kernel
 * and the wgmma variant below), but at decode it is slower than cuBLASLt with the engine's fixed split:
 * its 16-row chains are latency-bound on the 4096-row matrices (bench/gpu/DECODE.md, eighth to tenth
 * sessions). osp_cuda_gemm_bf16 uses it only under OSPREY_CUDA_GEMM_SKINNY=M (scripts/gpu-test.sh ops
 * runs test_gpu_gemm so; bench/gpu/gemm_bench times it).
 * Requirements (else the caller uses cuBLASLt): K % 16 == 0, x and w 16-byte aligned (K % 8 == 0 makes
 * every row aligned then), 1 <= T <= OSP_CUDA_SKINNY_MAX_T, compute capability 9.0 (cp.async.bulk). */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace {

/* ---- PTX wrappers: mbarrier (PTX ISA 9.7.13.15), cp.async.bulk (9.7.9.25), ldmatrix, mma -------- */
__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
}
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar, uint64_t policy) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar), "l"(policy)
                 : "memory");
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x2(uint32_t addr, uint32_t &r0, uint32_t &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr int kMaxStages = 8;

/* shared memory: [S][16 W + 8 NT rows][KC * 2 + 16 bytes], then full[S] and empty[S] (8 bytes each) */
template <int KC> __host__ __device__ constexpr int row_bytes() { return KC * 2 + 16; }

template <int W, int NT, int KC>
__global__ void __launch_bounds__((W + 1) * 32) skinny_kernel(const uint16_t *__restrict__ x,
                                                              const uint16_t *__restrict__ w, void *__restrict__ y,
                                                              int y_f32, int T, int N, int K, long long ldy, int S) {
    extern __shared__ __align__(128) unsigned char smem[];
    constexpr int RB = row_bytes<KC>();
    constexpr int ROWS = 16 * W + 8 * NT; /* a stage's rows: the weights', then x's */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const uint32_t base = smem_addr(smem);
    const uint32_t bars = base + (uint32_t)(S * ROWS * RB);
    /* token rows T .. 8 NT - 1 of every stage: zero, never loaded over */
    for (int s = 0; s < S; s++)
        for (int i = threadIdx.x; i < (8 * NT - T) * RB / 16; i += blockDim.x) {
            const int r = 16 * W + T + i / (RB / 16), c = i % (RB / 16);
            *(uint4 *)(smem + ((size_t)s * ROWS + r) * RB + (size_t)c * 16) = make_uint4(0, 0, 0, 0);
        }
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) mbar_init(bars + 8u * s, 1), mbar_init(bars + 8u * (S + s), W);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int ntiles = (N + 16 * W - 1) / (16 * W);
    const int nchunks = (K + KC - 1) / KC;
    if (warp == W) { /* the producer */
        uint64_t stream_w, keep_x; /* weights read once: evict first; x, read by every CTA: normal */
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(stream_w));
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(keep_x));
        /* The weights are no kernel's output: the first S stages' weight rows are requested before
         * waiting for the previous kernel (programmatic dependent launch: they stream while it ends),
         * x's rows of those stages after the wait. Every stage's full barrier expects both, so no
         * consumer reads a stage before its x has landed. */
        int it = 0;
        bool waited = false;
        for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
            const int row0 = tile * 16 * W, nrows = min(16 * W, N - row0);
            for (int c = 0; c < nchunks; c++, it++) {
                const int s = it % S, k0 = c * KC, kc = min(KC, K - k0);
                if (it >= S) mbar_wait(bars + 8u * (S + s), ((it / S) & 1) ^ 1);
                const uint32_t full = bars + 8u * s, bytes = (uint32_t)kc * 2u;
                if (lane == 0) mbar_arrive_expect_tx(full, bytes * (uint32_t)(nrows + T));
                __syncwarp();
                const uint32_t st = base + (uint32_t)(s * ROWS * RB);
                for (int r = lane; r < nrows; r += 32)
                    bulk_g2s(st + (uint32_t)(r * RB), w + (size_t)(row0 + r) * K + k0, bytes, full, stream_w);
                if (!waited && (it == S - 1 || (tile + (int)gridDim.x >= ntiles && c == nchunks - 1))) {
                    /* the prologue's last stage (or the CTA's last): wait, then x for stages 0 .. it */
                    osp_pdl_begin();
                    waited = true;
                    for (int j = 0; j <= it; j++) {
                        const int jc = j % nchunks, jk0 = jc * KC, jkc = min(KC, K - jk0);
                        for (int t = lane; t < T; t += 32)
                            bulk_g2s(base + (uint32_t)((j * ROWS + 16 * W + t) * RB), x + (size_t)t * K + jk0,
                                     (uint32_t)jkc * 2u, bars + 8u * j, keep_x);
                    }
                } else if (waited) {
                    for (int t = lane; t < T; t += 32)
                        bulk_g2s(st + (uint32_t)((16 * W + t) * RB), x + (size_t)t * K + k0, bytes, full, keep_x);
                }
            }
        }
        if (!waited) osp_pdl_begin(); /* a CTA without tiles */
        return;
        /* The consumers never execute osp_pdl_begin() (an exception to its every-thread rule): each of
         * their y stores follows a full barrier whose x bytes were requested after this warp's wait, so
         * it comes after the previous grid has completed and flushed (T >= 1: every stage holds x). */
    }
    /* a consumer: rows 16 warp .. 16 warp + 15 of each tile */
    const int g = lane >> 2, cq = lane & 3;
    /* ldmatrix lane addresses within a stage: A's four 8 x 8 matrices (rows 0-7 / 8-15 x k 0-7 / 8-15),
     * B's two (tokens 0-7 x k 0-7 / 8-15) */
    const uint32_t a_off = (uint32_t)((16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * RB + (lane >> 4) * 16);
    const uint32_t b_off = (uint32_t)((16 * W + (lane & 7)) * RB + ((lane >> 3) & 1) * 16);
    int it = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = -0.0f;
        for (int c = 0; c < nchunks; c++, it++) {
            const int s = it % S, kc = min(KC, K - c * KC);
            mbar_wait(bars + 8u * s, (it / S) & 1);
            const uint32_t st = base + (uint32_t)(s * ROWS * RB);
            /* one k16 step: A's 16 rows, then every token tile's B against them (the chain's order) */
#pragma unroll 4
            for (int ks = 0; ks < kc / 16; ks++) {
                uint32_t a[4];
                ldsm_x4(st + a_off + ks * 32, a[0], a[1], a[2], a[3]);
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    uint32_t b0, b1;
                    ldsm_x2(st + b_off + (uint32_t)(j * 8 * RB) + ks * 32, b0, b1);
                    mma_bf16(acc[j], a, b0, b1);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(bars + 8u * (S + s));
        }
        /* acc[j]: (row g, tokens 8 j + 2 cq, + 1), (row g + 8, the same tokens) */
        const int n0 = tile * 16 * W + 16 * warp + g;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = n0 + (e >> 1) * 8, t = 8 * j + 2 * cq + (e & 1);
                if (n >= N || t >= T) continue;
                if (y_f32)
                    ((float *)y)[(size_t)t * ldy + n] = acc[j][e];
                else
                    ((uint16_t *)y)[(size_t)t * ldy + n] = osp_f_to_bf16(acc[j][e]);
            }
    }
}

/* ---- the wgmma variant (OSPREY_CUDA_SKINNY_KIND=wg, T <= 16) -------------------------------------
 * Why: the mma.sync kernel above is bound by its chains on the N = 4096 matrices of an 8B model (o, down):
 * 256 chains of 16 rows, each a dependent mma.sync a k-step, ~128 cycles a step (ncu, bench/gpu/DECODE.md
 * tenth session); an mma.sync waits for its accumulator, while a warpgroup's wgmma on one accumulator are
 * queued and run back to back by the tensor core. Same chain, same bits (the k16 steps in K order from
 * -0; attention v2/v4 measured wgmma and mma.sync rounding alike; test_gpu_gemm compares with cuBLASLt):
 *   a CTA = one consumer warpgroup (64 weight rows: warp w's 16 rows as wgmma's A from registers, by
 *   ldmatrix from padded rows, the layout of the kernel above) + one producer warp; a stage holds KC = 256
 *   values of the 64 rows (cp.async.bulk a row) and of x's T rows as wgmma's B, K-major in 128-byte
 *   swizzled blocks of 64 values ([KC / 64][NB rows][128 bytes], chunk j of row t at j ^ (t & 7)),
 *   copied 16 bytes at a time by cp.async whose completion the stage's full barrier also counts; rows
 *   T .. NB - 1 are zero (written once, never loaded over). Each stage's 16 k-steps go out as two groups of
 *   8 wgmma (A double-buffered: the second group's ldmatrix while the first runs), then the stage is
 *   released once both completed.
 * Measured on an H100 (bench/gpu/DECODE.md, tenth session): cuBLASLt's unsplit bits (test_gpu_gemm
 * passes), but a dependent wgmma on one accumulator took ~330 cycles a k-step, no better than mma.sync,
 * and m64 has a quarter of m16's chains: 2.3-3.2x slower than the mma.sync kernel on the N = 4096
 * matrices, about equal on gate_up and the head. Kept as an opt-in variant, not used by default. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_arrive_noinc(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
template <int NJ> __device__ __forceinline__ void wg_fence_acc(float (&d)[NJ][4]) {
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[j][e])::"memory");
}
/* 128-byte swizzle, K-major: start address, LBO (unused: 16), SBO 1024 (8-row atoms), all >> 4 */
__device__ __forceinline__ uint64_t wg_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}
/* d += a b: m64nNk16 (N = 8 NJ), bf16 in, fp32 accumulate (scale-d 1: the accumulator starts at -0) */
__device__ __forceinline__ void wgmma_bf16(float (&d)[1][4], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1, 0;\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}
__device__ __forceinline__ void wgmma_bf16(float (&d)[2][4], const uint32_t (&a)[4], uint64_t desc) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
                 "%12, 1, 1, 1, 0;\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
                   "+f"(d[1][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

constexpr int kWgKC = 256, kWgRows = 64;
template <int NB> __host__ __device__ constexpr int wg_x_bytes() { return (kWgKC / 64) * NB * 128; }
template <int NB> __host__ __device__ constexpr int wg_stage_bytes() {
    return (wg_x_bytes<NB>() + kWgRows * row_bytes<kWgKC>() + 1023) / 1024 * 1024;
}

template <int NB>
__global__ void __launch_bounds__(160) skinny_wg_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                                                        void *__restrict__ y, int y_f32, int T, int N, int K, long long ldy,
                                                        int S) {
    extern __shared__ __align__(1024) unsigned char smem_wg[];
    constexpr int RB = row_bytes<kWgKC>(), XB = wg_x_bytes<NB>(), STB = wg_stage_bytes<NB>(), NJ = NB / 8;
    osp_pdl_begin();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    /* the swizzle atoms need 1024-byte alignment: the launch adds 1024 bytes of slack */
    const uint32_t raw = smem_addr(smem_wg), base = (raw + 1023u) & ~1023u;
    unsigned char *gbase = smem_wg + (base - raw);
    const uint32_t bars = base + (uint32_t)(S * STB);
    for (int i = threadIdx.x; i < S * XB / 16; i += blockDim.x) { /* every stage's x region: zero */
        const int st = i / (XB / 16), c = i % (XB / 16);
        *(uint4 *)(gbase + (size_t)st * STB + (size_t)c * 16) = make_uint4(0, 0, 0, 0);
    }
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) mbar_init(bars + 8u * s, 1 + 32), mbar_init(bars + 8u * (S + s), 4);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int ntiles = (N + kWgRows - 1) / kWgRows, nchunks = (K + kWgKC - 1) / kWgKC;
    if (warp == 4) { /* the producer */
        uint64_t stream_w;
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(stream_w));
        int it = 0;
        for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
            const int row0 = tile * kWgRows, nrows = min(kWgRows, N - row0);
            for (int c = 0; c < nchunks; c++, it++) {
                const int s = it % S, k0 = c * kWgKC, kc = min(kWgKC, K - k0);
                if (it >= S) mbar_wait(bars + 8u * (S + s), ((it / S) & 1) ^ 1);
                const uint32_t full = bars + 8u * s, bytes = (uint32_t)kc * 2u, xs = base + (uint32_t)(s * STB),
                               ws = xs + (uint32_t)XB;
                if (lane == 0) mbar_arrive_expect_tx(full, bytes * (uint32_t)nrows);
                __syncwarp();
                for (int r = lane; r < nrows; r += 32)
                    bulk_g2s(ws + (uint32_t)(r * RB), w + (size_t)(row0 + r) * K + k0, bytes, full, stream_w);
                const int pieces = kc / 8; /* 16-byte pieces a token row */
                for (int p = lane; p < T * pieces; p += 32) {
                    const int t = p / pieces, q = p % pieces, b = q >> 3, cc = q & 7;
                    cp_async16(xs + (uint32_t)(b * NB * 128 + t * 128 + ((cc ^ (t & 7)) << 4)), x + (size_t)t * K + k0 + q * 8);
                }
                cp_async_arrive_noinc(full);
            }
        }
        return;
    }
    /* the consumer warpgroup: rows 16 warp .. + 15 of each tile */
    const int g = lane >> 2, cq = lane & 3;
    const uint32_t a_off = (uint32_t)((16 * warp + (lane & 7) + ((lane >> 3) & 1) * 8) * RB + (lane >> 4) * 16);
    int it = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        float acc[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = -0.0f;
        for (int c = 0; c < nchunks; c++, it++) {
            const int s = it % S, nks = min(kWgKC, K - c * kWgKC) / 16;
            mbar_wait(bars + 8u * s, (it / S) & 1);
            fence_proxy_async(); /* x's cp.async (generic proxy) writes, read by wgmma (async proxy) */
            const uint32_t xs = base + (uint32_t)(s * STB), ws = xs + (uint32_t)XB;
            if (nks == kWgKC / 16) { /* a whole chunk: no branch between the wgmma (ptxas serializes those) */
                uint32_t a[2][8][4];
#pragma unroll
                for (int grp = 0; grp < 2; grp++) {
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        ldsm_x4(ws + a_off + (uint32_t)((8 * grp + i) * 32), a[grp][i][0], a[grp][i][1], a[grp][i][2], a[grp][i][3]);
                    wg_fence();
#pragma unroll
                    for (int i = 0; i < 8; i++) {
                        const int ks = 8 * grp + i;
                        wgmma_bf16(acc, a[grp][i], wg_desc(xs + (uint32_t)((ks >> 2) * NB * 128 + (ks & 3) * 32)));
                    }
                    wg_commit();
                    wg_fence_acc(acc);
                }
                wg_wait<0>();
                wg_fence_acc(acc);
            } else { /* K's last chunk, shorter: one k-step at a time */
                for (int ks = 0; ks < nks; ks++) {
                    uint32_t a1[4];
                    ldsm_x4(ws + a_off + (uint32_t)(ks * 32), a1[0], a1[1], a1[2], a1[3]);
                    wg_fence();
                    wgmma_bf16(acc, a1, wg_desc(xs + (uint32_t)((ks >> 2) * NB * 128 + (ks & 3) * 32)));
                    wg_commit();
                    wg_wait<0>();
                    wg_fence_acc(acc);
                }
            }
            __syncwarp();
            if (lane == 0) mbar_arrive(bars + 8u * (S + s));
        }
        const int n0 = tile * kWgRows + 16 * warp + g;
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int n = n0 + (e >> 1) * 8, t = 8 * j + 2 * cq + (e & 1);
                if (n >= N || t >= T) continue;
                if (y_f32)
                    ((float *)y)[(size_t)t * ldy + n] = acc[j][e];
                else
                    ((uint16_t *)y)[(size_t)t * ldy + n] = osp_f_to_bf16(acc[j][e]);
            }
    }
}

template <int NB>
osp_status launch_wg(const uint16_t *x, const uint16_t *w, void *y, bool y_f32, int T, int N, int K, int64_t ldy, int S,
                     cudaStream_t st) {
    auto kern = skinny_wg_kernel<NB>;
    while (S > 2 && (size_t)S * (wg_stage_bytes<NB>() + 16) + 1024 > 220u * 1024) S--;
    const size_t smem = (size_t)S * (size_t)wg_stage_bytes<NB>() + 16u * (size_t)S + 1024u;
    static int sm_count = 0, per_sm = 0;
    static size_t smem_set = 0;
    if (smem_set != smem) {
        int dev = 0;
        OSP_CUDA_TRY(cudaGetDevice(&dev));
        OSP_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev));
        OSP_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        OSP_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, 160, smem));
        if (per_sm < 1) return osp_set_error(OSP_ERR_UNSUPPORTED, "skinny GEMM (wgmma): a CTA does not fit an SM (%zu bytes)", smem);
        smem_set = smem;
    }
    const int ntiles = (N + kWgRows - 1) / kWgRows;
    const int grid = ntiles < sm_count * per_sm ? ntiles : sm_count * per_sm;
    osp_launch(kern, dim3((unsigned)grid), dim3(160u), smem, st, x, w, y, (int)y_f32, T, N, K, (long long)ldy, S);
    OSP_CUDA_LAUNCH_CHECK("skinny_wg_kernel");
    return OSP_OK;
}

struct skinny_cfg {
    int W, NT, KC, S;
};

template <int W, int NT, int KC>
osp_status launch_cfg(const uint16_t *x, const uint16_t *w, void *y, bool y_f32, int T, int N, int K, int64_t ldy,
                      int S, cudaStream_t st) {
    auto kern = skinny_kernel<W, NT, KC>;
    const size_t stage = (size_t)(16 * W + 8 * NT) * row_bytes<KC>();
    while (S > 2 && (size_t)S * (stage + 16) > 220u * 1024) S--; /* within an SM's 227 KiB */
    const size_t smem = (size_t)S * (stage + 16);
    /* per instantiation, set up by its first call (host work: before any graph capture, as cuBLASLt's
     * plans): the shared-memory limit, the device's SMs and how many CTAs fit one */
    static int sm_count = 0, per_sm = 0;
    static size_t smem_set = 0;
    if (smem_set != smem) {
        int dev = 0;
        OSP_CUDA_TRY(cudaGetDevice(&dev));
        OSP_CUDA_TRY(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, dev));
        OSP_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        OSP_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, (W + 1) * 32, smem));
        if (per_sm < 1) return osp_set_error(OSP_ERR_UNSUPPORTED, "skinny GEMM: a CTA does not fit an SM (%zu bytes)", smem);
        smem_set = smem;
    }
    const int ntiles = (N + 16 * W - 1) / (16 * W);
    const int grid = ntiles < sm_count * per_sm ? ntiles : sm_count * per_sm;
    osp_launch(kern, dim3((unsigned)grid), dim3((unsigned)((W + 1) * 32)), smem, st, x, w, y, (int)y_f32, T, N, K,
               (long long)ldy, S);
    OSP_CUDA_LAUNCH_CHECK("skinny_kernel");
    return OSP_OK;
}

int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && v[0] ? atoi(v) : dflt;
}

} // namespace

extern "C" bool osp_cuda_skinny_supported(const void *d_x, const void *d_w, int64_t T, int64_t N, int64_t K) {
    static int cc = -1;
    if (cc < 0) {
        int dev = 0, major = 0;
        cc = cudaGetDevice(&dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess
                 ? major
                 : 0;
    }
    /* cc 9 only: the code is sm_90a (other architectures get cuBLASLt, not a launch error); N leaves
     * room for the tile count's rounding in int */
    return cc == 9 && T >= 1 && T <= OSP_CUDA_SKINNY_MAX_T && N >= 1 && N <= INT32_MAX - 64 && K >= 16 && K % 16 == 0 &&
           K <= INT32_MAX / 2 && (uintptr_t)d_x % 16 == 0 && (uintptr_t)d_w % 16 == 0;
}

extern "C" osp_status osp_cuda_skinny_bf16(const uint16_t *d_x, const uint16_t *d_w, void *d_y, bool y_f32, int64_t T,
                                           int64_t N, int64_t K, int64_t ldy, void *stream) {
    if (!d_x || !d_w || !d_y || ldy < N || !osp_cuda_skinny_supported(d_x, d_w, T, N, K))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_skinny_bf16: unsupported arguments (T %lld, N %lld, K %lld)",
                             (long long)T, (long long)N, (long long)K);
    cudaStream_t st = (cudaStream_t)stream;
    /* OSPREY_CUDA_SKINNY_W (1, 2, 4: weight tiles of 16 W rows a CTA), _STAGES (2 .. 8) and _KC (128,
     * 256: values of a row a stage): diagnostics for tuning; the bits do not depend on them */
    static int Wc = 0, S = 0, KCc = 0; /* read once */
    if (!Wc) {
        const int wv = env_int("OSPREY_CUDA_SKINNY_W", 1), sv = env_int("OSPREY_CUDA_SKINNY_STAGES", 4);
        S = sv < 2 ? 2 : sv > kMaxStages ? kMaxStages : sv;
        KCc = env_int("OSPREY_CUDA_SKINNY_KC", 256) == 128 ? 128 : 256; /* T <= 16's chunk; past 16: 128 */
        Wc = wv == 2 || wv == 4 ? wv : 1; /* 1: the fastest on an H100 (bench/gpu/DECODE.md, eighth session) */
    }
    const int t = (int)T, n = (int)N, k = (int)K;
    /* OSPREY_CUDA_SKINNY_KIND=wg: the wgmma kernel for T <= 16 (its stages: OSPREY_CUDA_SKINNY_STAGES, default 3) */
    static int kind = -1;
    static int wg_stages = 3;
    if (kind < 0) {
        const char *kv = getenv("OSPREY_CUDA_SKINNY_KIND");
        kind = kv && !strcmp(kv, "wg") ? 1 : 0;
        const char *sv = getenv("OSPREY_CUDA_SKINNY_STAGES");
        if (sv && sv[0]) wg_stages = atoi(sv) < 2 ? 2 : atoi(sv) > kMaxStages ? kMaxStages : atoi(sv);
    }
    if (kind == 1 && T <= 8) return launch_wg<8>(d_x, d_w, d_y, y_f32, t, n, k, ldy, wg_stages, st);
    if (kind == 1 && T <= 16) return launch_wg<16>(d_x, d_w, d_y, y_f32, t, n, k, ldy, wg_stages, st);
#define SKINNY_CASE(Wv, NTv, KCv)                                                                  \
    if (Wc == Wv && T <= 8 * NTv && (KCv == 128 || KCc == KCv))                                   \
    return launch_cfg<Wv, NTv, KCv>(d_x, d_w, d_y, y_f32, t, n, k, ldy, S, st)
#define SKINNY_W(Wv)                                                                               \
    SKINNY_CASE(Wv, 1, 256);                                                                       \
    SKINNY_CASE(Wv, 1, 128);                                                                       \
    SKINNY_CASE(Wv, 2, 256);                                                                       \
    SKINNY_CASE(Wv, 2, 128);                                                                       \
    SKINNY_CASE(Wv, 4, 128);                                                                       \
    SKINNY_CASE(Wv, 8, 128)
    SKINNY_W(1);
    SKINNY_W(4);
    SKINNY_W(2);
#undef SKINNY_W
#undef SKINNY_CASE
    return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_skinny_bf16: T %lld over %d", (long long)T,
                         OSP_CUDA_SKINNY_MAX_T);
}
