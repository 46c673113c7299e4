/* Paged attention v3: fold mode at head_dim 128 on f16 pages, warp-specialized as FlashAttention-3
 * (Shah et al. 2024, sections 3.1 and 3.2): a CTA of three warpgroups, one producer and two consumers.
 *   producer   brings the K/V tiles of 64 keys to shared memory by cp.async through the block table
 *              (paged KV with 16-key pages: TMA's boxes were measured slower, bench/gpu/NOTES.md), ST
 *              stages deep, each stage handed over by an mbarrier pair (full: landed and fenced for
 *              the async proxy; empty: both consumers done with it). setmaxnreg 56.
 *   consumers  64 query rows each (128 a CTA sharing every K/V tile: half the tile loads of v2 per
 *              row), v2's products and online softmax: S = Q K^T by 8 wgmma m64n64k16 with Q and K
 *              by descriptor, O += P V by 4 wgmma m64n128k16 with P from registers. setmaxnreg 224:
 *              o, the fold state, S and P in registers.
 *   ping-pong  with two consumers, named barriers give the tensor cores to them in turns: a turn
 *              issues one consumer's P_t V_t and S_{t+1} = Q K_{t+1} back to back, and the other
 *              consumer's turn comes while this one runs its softmax (section 3.2's inter-warpgroup
 *              overlap). Every row still sees v2's serial order: o *= alpha_t, o += P_t V_t, in tile
 *              order, chunks folded as fold_state says.
 * The reduction a row sees is v2's (attention_mma.cu), operation for operation: tiles of 64 keys,
 * chunks of kChunk, the same scale, mask, max, ex2, sums, rounding of P to f16, rescale skipped only
 * where it would multiply by 1 and the same fold; so v3's bits are v2's in fold and in split mode, and
 * test_gpu_attention asserts it. */
#include "backend/cuda/attention_ws.h"

#include "backend/cuda/cuda_common.cuh" /* OSP_CUDA_LAUNCH_CHECK, OSP_CUDA_TRY, osp_f_to_bf16 */

#include <type_traits>

namespace osp_attn {
namespace {

constexpr int kD = 128;
constexpr int kKeys = 64;                       /* keys per tile: v2's, part of the numerics */
constexpr int kConsumers = 2;                   /* consumer warpgroups */
constexpr int kThreadsWs = 128 * (1 + kConsumers);
constexpr int kTileBytes = kKeys * kD * 2;      /* one K (or V) tile: 16 KiB */
constexpr int kQBytes = 64 * kD * 2;            /* one consumer's Q: 16 KiB */
constexpr int kProducerRegs = 56, kConsumerRegs = 224; /* 128 x 56 + 256 x 224 = 384 x 168 */

/* Shared memory from a 1024-byte aligned base: sQ [kConsumers], then K [ST] and V [ST] tiles, each in
 * v2's layout ([2 column groups][64 rows][128 bytes], 128-byte swizzle), then the mbarriers full[ST]
 * and empty[ST]. (The fold state lives in registers: o, the fold state, S and P are 176 of a
 * consumer's 224.) */
template <int ST> constexpr int ws_smem_bytes() { return 1024 + kConsumers * kQBytes + 2 * ST * kTileBytes + 2 * ST * 8; }

/* ---- PTX wrappers: mbarrier (PTX ISA 9.7.13.15), named barriers, setmaxnreg (9.7.19.6) --------- */
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* returns once the phase of this parity has completed */
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
/* named barrier ID for THREADS threads (ID and count immediates) */
template <int ID, int THREADS> __device__ __forceinline__ void named_sync() {
    asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}
template <int ID, int THREADS> __device__ __forceinline__ void named_arrive() {
    asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}
/* the consumers' turns: consumer c waits for its turn on barrier 1 + c and ends it on the other's
 * (the ID in a register: no branch between a product's issue and its wait) */
__device__ __forceinline__ void turn_begin(int c) { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + c) : "memory"); }
__device__ __forceinline__ void turn_end(int c) { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - c) : "memory"); }
template <int R> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }

/* d (+)= a b, m64n64k16, A and B by descriptor, both K-major (Q: rows x D, K: keys x D) */
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[8][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

/* d += a b over 64 keys: the four k-steps of O += P V (m64n128k16, A = P from registers, B = V by
 * descriptor, N-major) in one asm statement, so that no copy of d can fall between them (ptxas C7519) */
__device__ __forceinline__ void wgmma_pv4(float (&d)[16][4], const uint32_t (&a)[4][4], uint64_t b0, uint64_t b1,
                                          uint64_t b2, uint64_t b3) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %80, 1, 1, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%68, %69, %70, %71}, %81, 1, 1, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%72, %73, %74, %75}, %82, 1, 1, 1, 1;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%76, %77, %78, %79}, %83, 1, 1, 1, 1;\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                   "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                   "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
                   "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                   "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
                   "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                   "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0][0]), "r"(a[0][1]), "r"(a[0][2]), "r"(a[0][3]), "r"(a[1][0]), "r"(a[1][1]), "r"(a[1][2]), "r"(a[1][3]), "r"(a[2][0]), "r"(a[2][1]), "r"(a[2][2]), "r"(a[2][3]), "r"(a[3][0]), "r"(a[3][1]), "r"(a[3][2]), "r"(a[3][3]),
                   "l"(b0), "l"(b1), "l"(b2), "l"(b3));
}

/* byte offset of the 16-byte chunk `part` (0 .. 15) of row r in a [2][64][128 B] swizzled tile */
__device__ __forceinline__ uint32_t swz_off(int r, int part) {
    return (uint32_t)((part >> 3) * (64 * 128) + r * 128 + (((part & 7) ^ (r & 7)) << 4));
}

/* ST: K/V stages; kPing: the consumers take the tensor cores in turns (named barriers 1 and 2) */
template <int ST, bool kPing>
__global__ void __launch_bounds__(kThreadsWs, 1) attn_ws_kernel(const Params p) {
    osp_pdl_begin();
    static_assert(ST >= 2, "stages");
    constexpr int NB = kKeys / 8, ND = kD / 8, KT = kD / 16;
    extern __shared__ uint4 smem_u4[];
    const uint32_t base = (smem_u32(smem_u4) + 1023u) & ~1023u;
    const uint32_t sQ = base, sK = sQ + kConsumers * kQBytes, sV = sK + ST * kTileBytes;
    const uint32_t full0 = sV + ST * kTileBytes, empty0 = full0 + ST * 8;

    const int tid = (int)threadIdx.x, wtid = tid & 127;
    /* wg 0: producer; 1, 2: consumers. Read through a shuffle so that ptxas sees it warp-uniform: a
     * wgmma on a path it thinks divergent is serialized (C7520). */
    const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);

    AttnCtaWork w; /* sequence s, tokens [t0, t0 + ntok), kv head kvh, query heads [h0, h0 + nh) */
    if (!attn_cta_work(p.tl, p.qsl, p.num_seqs, w, p.heavy_first)) return;
    const int s = w.s, t0 = w.t0, ntok = w.ntok, kvh = w.kvh, nh = w.nh, h0 = w.h0;
    const int rows = ntok * nh;
    const int consumers = rows > 64 ? 2 : 1; /* a consumer with no rows leaves at once */

    int kb, ke; /* the keys this CTA walks, v2's (never empty in fold mode: every row has its own key) */
    (void)cta_key_range<kKeys, false>(p, w, tid, (int)blockDim.x, kb, ke);
    const int n_tiles = (ke - kb + kKeys - 1) / kKeys;

    if (tid == 0) {
        for (int i = 0; i < ST; i++) {
            mbar_init(full0 + 8 * i, 128);             /* every producer thread, after its copies landed */
            mbar_init(empty0 + 8 * i, 4 * consumers);  /* every consumer warp, after its products */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    /* each consumer's Q rows into sQ as f16 (v2's conversion), swizzled as K; rows past the tile zero */
    if (wg > 0 && wg <= consumers) {
        const uint32_t q_wg = sQ + (wg - 1) * kQBytes;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int c = wtid + 128 * u, rl = c >> 4, part = c & 15, r = 64 * (wg - 1) + rl;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (r < rows) {
                const int64_t qrow = (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh;
                const uint4 b = *reinterpret_cast<const uint4 *>(p.q + qrow * kD + part * 8);
                const uint32_t pair[4] = {b.x, b.y, b.z, b.w};
                uint32_t o4[4];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float lo_f = __uint_as_float(pair[i] << 16), hi_f = __uint_as_float(pair[i] & 0xffff0000u);
                    o4[i] = pack_f16x2(clamp_f16_range(lo_f), clamp_f16_range(hi_f));
                }
                v = make_uint4(o4[0], o4[1], o4[2], o4[3]);
            }
            asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(q_wg + swz_off(rl, part)), "r"(v.x), "r"(v.y),
                         "r"(v.z), "r"(v.w)
                         : "memory");
        }
        fence_proxy_async(); /* the Q rows are read by wgmma */
    }
    __syncthreads(); /* barriers initialized, sQ written */

    if (wg == 0) {
        /* ---- producer: tile i of keys [kb + 64 i, +64) into stage i mod ST ---- */
        setmaxnreg_dec<kProducerRegs>();
        constexpr int CPT = kKeys * 16 / 128; /* 16-byte chunks a thread a K (or V) tile: 8 */
        const int part = wtid & 15, jrow = wtid >> 4;
        const int32_t *bt = p.block_table + (int64_t)s * p.max_blocks;
        const int64_t row_elems = (int64_t)p.n_head_kv * kD;
        const uint16_t *kbase = p.k_pages + (int64_t)kvh * kD + part * 8, *vbase = p.v_pages + (int64_t)kvh * kD + part * 8;
        /* the tile's copies are issued, then the previous tile is handed over once landed */
        auto hand_over = [&](int i) {
            if (i > 0) {
                cp_async_wait<1>();
                fence_proxy_async();
                mbar_arrive(full0 + 8 * ((i - 1) % ST));
            }
        };
        if (p.block_size % 8 == 0) {
            /* Pages of a multiple of 8 keys: a thread copies chunk `part` of the 8 consecutive keys
             * 8 jrow .. 8 jrow + 7 of a tile, which lie in one page: one block-table entry a tile
             * (read a tile ahead) instead of one a key, and the rows 1 apart in the page. */
            auto page_slot = [&](int k0) { /* the slot of key k0 + 8 jrow, or -1 past ke */
                const int key = k0 + 8 * jrow;
                const int blk = p.bdiv.div(key);
                return key < ke ? bt[blk] * p.block_size + (key - blk * p.block_size) : -1;
            };
            int slot = page_slot(kb);
            for (int i = 0; i < n_tiles; i++) {
                const int st = i % ST, k0 = kb + i * kKeys;
                if (i >= ST) mbar_wait(empty0 + 8 * st, (uint32_t)((i / ST - 1) & 1));
                const uint32_t dk = sK + st * kTileBytes, dv = sV + st * kTileBytes;
                const int64_t off = slot >= 0 ? (int64_t)slot * row_elems : 0;
                const uint16_t *kp = kbase + off, *vp = vbase + off;
                const int nvalid = slot >= 0 ? min(CPT, ke - (k0 + 8 * jrow)) : 0;
#pragma unroll
                for (int u = 0; u < CPT; u++) {
                    const bool valid = u < nvalid;
                    const uint32_t so = swz_off(8 * jrow + u, part);
                    cp_async16(dk + so, valid ? kp + u * row_elems : kbase, valid);
                    cp_async16(dv + so, valid ? vp + u * row_elems : vbase, valid);
                }
                cp_async_commit();
                if (i + 1 < n_tiles) slot = page_slot(k0 + kKeys); /* lands while tile i copies */
                hand_over(i);
            }
        } else {
            /* any page size: chunk `part` of keys jrow + 8 u (u < 8), a block-table entry each */
            const uint32_t off0 = swz_off(jrow, part); /* rows jrow + 8 u: the same swizzle (mod 8) */
            int slot[CPT];
            auto fetch_slots = [&](int k0) {
#pragma unroll
                for (int u = 0; u < CPT; u++) {
                    const int key = k0 + jrow + 8 * u;
                    const int blk = p.bdiv.div(key);
                    slot[u] = key < ke ? bt[blk] * p.block_size + (key - blk * p.block_size) : -1;
                }
            };
            fetch_slots(kb);
            for (int i = 0; i < n_tiles; i++) {
                const int st = i % ST;
                if (i >= ST) mbar_wait(empty0 + 8 * st, (uint32_t)((i / ST - 1) & 1));
                const uint32_t dk = sK + st * kTileBytes + off0, dv = sV + st * kTileBytes + off0;
#pragma unroll
                for (int u = 0; u < CPT; u++) {
                    const bool valid = slot[u] >= 0;
                    const int64_t off = valid ? (int64_t)slot[u] * row_elems : 0;
                    cp_async16(dk + u * 8 * 128, kbase + off, valid);
                    cp_async16(dv + u * 8 * 128, vbase + off, valid);
                }
                cp_async_commit();
                if (i + 1 < n_tiles) fetch_slots(kb + (i + 1) * kKeys); /* lands while tile i copies */
                hand_over(i);
            }
        }
        cp_async_wait<0>(); /* n_tiles >= 1 */
        fence_proxy_async();
        mbar_arrive(full0 + 8 * ((n_tiles - 1) % ST));
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();
    const int c = wg - 1;
    if (c >= consumers) return;

    /* ---- consumer c: rows 64 c .. 64 c + 63; this thread's rows A and B as in v2 ---- */
    const int lane = tid & 31, warp = wtid >> 5; /* warp within the warpgroup */
    const int g = lane >> 2, tq = lane & 3;
    const int wrow0 = 64 * c + 16 * warp;
    int lim[2], first[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = wrow0 + g + 8 * i;
        lim[i] = r < rows ? p.positions[t0 + r / nh] + 1 : 0;
        first[i] = p.window > 0 && lim[i] > p.window ? lim[i] - p.window : 0;
    }
    const uint32_t q_wg = sQ + c * kQBytes;

    float o[ND][4], sc[NB][4];
    float oa[ND][4]; /* the fold state of this thread's rows (fold mode's O) */
    uint32_t pa[kKeys / 16][4];
    float m[2], l[2], Ms[2], Ls[2];
#pragma unroll
    for (int i = 0; i < 2; i++) m[i] = -INFINITY, l[i] = 0.0f, Ms[i] = -INFINITY, Ls[i] = 0.0f;
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[n][e] = 0.0f, oa[n][e] = 0.0f;
#pragma unroll
    for (int n = 0; n < NB; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
    for (int j = 0; j < kKeys / 16; j++) pa[j][0] = pa[j][1] = pa[j][2] = pa[j][3] = 0u;

    /* The descriptors of stage 0; another stage or k-step adds its byte offset >> 4 to the start
     * address field (addresses < 2^18 and 16-byte aligned: the field never carries) */
    const uint64_t dq0 = wg_desc(q_wg, 16, 1024), dk0 = wg_desc(sK, 16, 1024), dv0 = wg_desc(sV, kKeys * 128, 1024);
    /* S = Q K^T of the tile in stage st (k-step kk: column group kk / 4, bytes 32 (kk mod 4) of a row) */
    auto issue_s = [&](int st) {
        const uint64_t dk = dk0 + (uint64_t)(st * (kTileBytes >> 4));
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            const uint64_t o_k = (uint64_t)(((kk / 4) * kKeys * 128 + (kk % 4) * 32) >> 4);
            wgmma_m64n64_ss(sc, dq0 + o_k, dk + o_k, kk > 0);
        }
    };
    /* O += P V of the tile in stage st (V N-major: column groups kKeys * 128 bytes apart) */
    auto issue_pv = [&](int st) {
        const uint64_t dv = dv0 + (uint64_t)(st * (kTileBytes >> 4));
        static_assert(kKeys == 64, "P V is four k-steps");
        wgmma_pv4(o, pa, dv, dv + (uint64_t)((16 * 128) >> 4), dv + (uint64_t)((32 * 128) >> 4), dv + (uint64_t)((48 * 128) >> 4));
    };
    /* v2's scale, mask and online softmax of S for keys [k0, k0 + 64): m, l updated, P = 2^(s - m) left
     * in sc, o's factor in alpha; o_zero: the row's o held nothing yet (its rescale may be skipped). A
     * warp with no rows needs no branch of its own: its lim is 0, so every key is masked and P is 0. */
    float alpha[2];
    bool o_zero[2];
    auto softmax_p = [&](int k0) {
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[n][e] = __fmul_rn(sc[n][e], p.qscale);
        if (k0 + kKeys > min(lim[0], lim[1]) || k0 < max(first[0], first[1])) {
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1, key = k0 + n * 8 + 2 * tq + (e & 1);
                    if (key >= lim[i] || key < first[i]) sc[n][e] = -INFINITY;
                }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            o_zero[i] = m[i] == -INFINITY;
            /* the row's max as a tree (depth 4, not v2's chain of 16): fmaxf is exact and ignores
             * NaN, so any order gives v2's value, -INFINITY included when every element is NaN */
            float t[NB];
#pragma unroll
            for (int n = 0; n < NB; n++) t[n] = fmaxf(sc[n][2 * i], sc[n][2 * i + 1]);
#pragma unroll
            for (int w = NB / 2; w > 0; w /= 2)
#pragma unroll
                for (int n = 0; n < w; n++) t[n] = fmaxf(t[n], t[n + w]);
            const float mx = fmaxf(-INFINITY, t[0]);
            const float m_new = fmaxf(m[i], quad_max(mx));
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            alpha[i] = ex2(m[i] - m_use);
            float ls = 0.0f;
#pragma unroll
            for (int n = 0; n < NB; n++) {
                sc[n][2 * i] = ex2(__fsub_rn(sc[n][2 * i], m_use));
                sc[n][2 * i + 1] = ex2(__fsub_rn(sc[n][2 * i + 1], m_use));
                ls = __fadd_rn(ls, __fadd_rn(sc[n][2 * i], sc[n][2 * i + 1]));
            }
            l[i] = __fmaf_rn(l[i], alpha[i], ls);
            m[i] = m_new;
        }
    };
    /* o *= alpha (skipped where every row of the warp keeps its max or has an empty o: the same
     * bits), then P into pa, the A operand of the next P V */
    auto rescale_pack = [&]() {
        if (!__all_sync(0xffffffffu, (alpha[0] == 1.0f || o_zero[0]) && (alpha[1] == 1.0f || o_zero[1]))) {
#pragma unroll
            for (int n = 0; n < ND; n++) {
                o[n][0] = __fmul_rn(o[n][0], alpha[0]), o[n][1] = __fmul_rn(o[n][1], alpha[0]);
                o[n][2] = __fmul_rn(o[n][2], alpha[1]), o[n][3] = __fmul_rn(o[n][3], alpha[1]);
            }
        }
#pragma unroll
        for (int j = 0; j < kKeys / 16; j++) {
            pa[j][0] = pack_f16x2(sc[2 * j][0], sc[2 * j][1]), pa[j][1] = pack_f16x2(sc[2 * j][2], sc[2 * j][3]);
            pa[j][2] = pack_f16x2(sc[2 * j + 1][0], sc[2 * j + 1][1]);
            pa[j][3] = pack_f16x2(sc[2 * j + 1][2], sc[2 * j + 1][3]);
        }
    };
    /* The fold at a chunk's end, in two halves: the (m, l) state (fold_state: the weights wA, wc of
     * each row, or nothing to fold) and a fresh (m, l); then, once o is final, the accumulators
     * (fold_elem) and a fresh o. Each element sees v2's operations in v2's order. */
    float fw[2][2];
    bool fdo[2];
    auto fold_ml = [&]() {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const float lc = quad_sum(l[r]);
            fdo[r] = fold_state(Ms[r], Ls[r], m[r], lc, fw[r][0], fw[r][1]);
            m[r] = -INFINITY, l[r] = 0.0f;
        }
    };
    auto fold_o = [&]() {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            if (fdo[r]) {
#pragma unroll
                for (int n = 0; n < ND; n++) {
                    float &a0 = oa[n][2 * r], &a1 = oa[n][2 * r + 1];
                    a0 = fold_elem(a0, fw[r][0], o[n][2 * r], fw[r][1]);
                    a1 = fold_elem(a1, fw[r][0], o[n][2 * r + 1], fw[r][1]);
                }
            }
#pragma unroll
            for (int n = 0; n < ND; n++) o[n][2 * r] = o[n][2 * r + 1] = 0.0f;
        }
    };

    /* The consumer's loop, compiled twice: with turns (ping-pong, two consumers) and without. No
     * branch may separate a wgmma from its wait (ptxas then serializes every wgmma: C7511 / C7520),
     * so whether turns are taken is decided once, here, not around each product. */
    auto consume = [&](auto ping_tag) {
        constexpr bool ping = decltype(ping_tag)::value;
        /* the first turn: S of tile 0 (n_tiles >= 1: every row has key 0 .. position, kb < ke) */
        if (ping && c == 1) named_arrive<1, 256>(); /* consumer 0 takes the first turn */
        mbar_wait(full0, 0u);
        if (ping) turn_begin(c);
        wg_fence_operands(sc);
        wg_fence();
        issue_s(0);
        wg_commit();
        if (ping) turn_end(c);
        wg_wait_all();
        wg_fence_operands(sc);
        softmax_p(kb);
        rescale_pack();
        /* tile i: a turn issuing P_i V_i and, but for the last tile (kNext false: peeled, so that no
         * wgmma sits under a branch), S_{i + 1}; then the chunk fold and tile i + 1's softmax.
         * (FlashAttention-3's intra-warpgroup overlap, S_{i + 1} awaited alone and its softmax run
         * under P_i V_i, was built here too: ptxas 13.0 serialized its products, C7511, at 224 and at
         * 240 registers, so it was removed unmeasured.) */
        auto step = [&](int i, auto next_tag) {
            constexpr bool next = decltype(next_tag)::value;
            const int k0 = kb + i * kKeys, st = i % ST;
            const bool chunk_end = (k0 + kKeys) % kChunk == 0 || !next;
            if (next) mbar_wait(full0 + 8 * ((i + 1) % ST), (uint32_t)(((i + 1) / ST) & 1));
            if (ping) turn_begin(c);
            wg_fence_operands(o);
            wg_fence_operands(pa);
            wg_fence_operands(sc);
            wg_fence();
            issue_pv(st);
            if constexpr (next) issue_s((i + 1) % ST);
            wg_commit();
            if (ping) turn_end(c);
            wg_wait_all();
            wg_fence_operands(o);
            wg_fence_operands(pa);
            wg_fence_operands(sc);
            __syncwarp();
            if (lane == 0) mbar_arrive(empty0 + 8 * st); /* this warp is done with stage st */
            if (chunk_end) fold_ml(), fold_o();
            if constexpr (next) softmax_p(k0 + kKeys), rescale_pack();
        };
        for (int i = 0; i + 1 < n_tiles; i++) step(i, std::true_type{});
        step(n_tiles - 1, std::false_type{});
        /* consumer 1's last turn_end had no turn of consumer 0 left to open: consumed here, so both named
         * barriers end the CTA balanced */
        if (ping && c == 0) named_sync<1, 256>();
    };
    if (kPing && consumers == 2) consume(std::true_type{});
    else consume(std::false_type{});

    /* out = O / L for this thread's rows A and B, columns n * 8 + 2 tq, + 1 */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = wrow0 + g + 8 * i;
        if (r >= rows) continue;
        const int64_t orow = (int64_t)(t0 + r / nh) * p.n_head + h0 + r % nh;
        const float inv = out_scale(Ls[i]);
        uint16_t *dst = p.out + orow * kD;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            const uint32_t v = (uint32_t)osp_f_to_bf16(__fmul_rn(oa[n][2 * i], inv)) |
                               ((uint32_t)osp_f_to_bf16(__fmul_rn(oa[n][2 * i + 1], inv)) << 16);
            *reinterpret_cast<uint32_t *>(dst + n * 8 + 2 * tq) = v;
        }
    }
}

template <int ST, bool kPing> osp_status launch_ws(const Params &prm, dim3 grid, cudaStream_t st) {
    constexpr int smem = ws_smem_bytes<ST>();
    static_assert(smem <= 227 * 1024, "shared memory of one CTA");
    OSP_CUDA_TRY(cudaFuncSetAttribute(attn_ws_kernel<ST, kPing>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    osp_launch(attn_ws_kernel<ST, kPing>, grid, kThreadsWs, smem, st, prm);
    OSP_CUDA_LAUNCH_CHECK("attn_ws_kernel");
    return OSP_OK;
}

} // namespace

int ws_rows() { return 64 * kConsumers; }

osp_status ws_launch(const Params &prm, int stages, bool pingpong, void *stream) {
    const dim3 grid((unsigned)prm.tl.n_tiles, (unsigned)(prm.n_head_kv * prm.tl.head_chunks), 1u);
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    if (stages == 3) return pingpong ? launch_ws<3, true>(prm, grid, st) : launch_ws<3, false>(prm, grid, st);
    return pingpong ? launch_ws<4, true>(prm, grid, st) : launch_ws<4, false>(prm, grid, st);
}

} // namespace osp_attn
