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
 * Status: test_gpu_gemm passes with it on an H100 (cuBLASLt's unsplit bits for every T), but at decode it
 * is slower than cuBLASLt with the engine's fixed split: its 16-row chains are latency-bound on the
 * 4096-row matrices (bench/gpu/DECODE.md, eighth to tenth sessions; a wgmma version of the chain, e3971b9,
 * gave the same bits and ran 2.3-3.2x slower still, and was removed). osp_cuda_gemm_bf16 uses it only under OSPREY_CUDA_GEMM_SKINNY=M (scripts/gpu-test.sh ops
 * runs test_gpu_gemm so; bench/gpu/gemm_bench times it).
 * Requirements (else the caller uses cuBLASLt): K % 16 == 0, x and w 16-byte aligned (K % 8 == 0 makes
 * every row aligned then), 1 <= T <= OSP_CUDA_SKINNY_MAX_T, compute capability 9.0 (cp.async.bulk). */
#include <stdlib.h>

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

/* A warp's outputs after its chain: acc[j] holds (row n0, tokens 8 j + 2 cq, + 1) and (row n0 + 8, the same
 * tokens), n0 = the warp's first row + g (mma.m16n8's accumulator); rows >= N and
 * tokens >= T are not stored. y: fp32, or bf16 rounded to nearest even; ldy elements a token row. */
template <int NJ>
__device__ __forceinline__ void store_acc(const float (&acc)[NJ][4], void *y, int y_f32, int n0, int cq, int N, int T,
                                          long long ldy) {
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

/* A persistent launch's grid: the device's SMs times the CTAs of `smem` bytes that fit one, at most ntiles.
 * The kernel's shared-memory limit and its occupancy are set up by the first call of each instantiation and
 * size (c: that launcher's cache; host work before any graph capture, as cuBLASLt's plans). */
struct fit_cache {
    int sm_count, per_sm;
    size_t smem;
};
template <typename Kern>
osp_status persistent_grid(Kern kern, int threads, size_t smem, int ntiles, fit_cache &c, int *grid) {
    if (c.smem != smem) {
        int dev = 0;
        OSP_CUDA_TRY(cudaGetDevice(&dev));
        OSP_CUDA_TRY(cudaDeviceGetAttribute(&c.sm_count, cudaDevAttrMultiProcessorCount, dev));
        OSP_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        OSP_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&c.per_sm, kern, threads, smem));
        if (c.per_sm < 1) return osp_set_error(OSP_ERR_UNSUPPORTED, "skinny GEMM: a CTA does not fit an SM (%zu bytes)", smem);
        c.smem = smem;
    }
    *grid = ntiles < c.sm_count * c.per_sm ? ntiles : c.sm_count * c.per_sm;
    return OSP_OK;
}

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
        store_acc(acc, y, y_f32, tile * 16 * W + 16 * warp + g, cq, N, T, ldy);
    }
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
    static fit_cache fit;
    int grid = 0;
    OSP_TRY(persistent_grid(kern, (W + 1) * 32, smem, (N + 16 * W - 1) / (16 * W), fit, &grid));
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
