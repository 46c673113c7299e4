/* Matrices kept in their GGUF block-quantized form on the device (cuda_ops.h, "quantized weights"):
 * Q8_0, Q4_0, Q4_1, Q4_K and Q6_K rows exactly as the file stores them (ggml-common.h's block
 * layouts, the same that core/dtype.c reads), dequantized inside the kernels that read them:
 *
 *   qdequant   rows of a quantized matrix written out as bf16 (for the tests and the benchmark:
 *              bit-identical to core/dtype.c's osp_dequant_row rounded to bf16, the values the bf16
 *              weight path uploads; it proves each type's piece() below).
 *   qembed     token embedding rows gathered from a quantized table (the bf16 path's values, times scale).
 *   qmma       y = x w^T for every T on the integer tensor cores (below, before its kernels).
 *
 * The dequantization is core/dtype.c's arithmetic spelled with __fmul_rn / __fadd_rn / __fsub_rn (the
 * CPU is ISO C17 without FMA contraction), so every weight value equals the CPU's fp32 value.
 *
 * For qdequant and qembed a matrix row is cut into pieces of 8 consecutive values that one thread loads
 * (a few loads of the block's bytes it needs) and dequantizes; consecutive threads take consecutive
 * pieces, so every warp access is one contiguous span. (qgemv, the fp32 kernel for T <= 8 that qmma
 * replaced, is described in bench/gpu/DECODE.md.) */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/qx.cuh"
#include "core/dtype.h"

namespace {


__device__ __forceinline__ float half_bits(uint32_t h) { return osp_f16_to_f((uint16_t)h); }

/* 8 bytes from a 2-byte aligned address as two 32-bit words (byte i of the span is byte i % 4 of word
 * i / 4), and from 4- and 8-byte aligned ones */
__device__ __forceinline__ void load8_a2(const uint8_t *p, uint32_t w[2]) {
    const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
    w[0] = (uint32_t)__ldg(h) | (uint32_t)__ldg(h + 1) << 16;
    w[1] = (uint32_t)__ldg(h + 2) | (uint32_t)__ldg(h + 3) << 16;
}
__device__ __forceinline__ void load8_a4(const uint8_t *p, uint32_t w[2]) {
    const uint32_t *q = reinterpret_cast<const uint32_t *>(p);
    w[0] = __ldg(q), w[1] = __ldg(q + 1);
}
__device__ __forceinline__ void load8_a8(const uint8_t *p, uint32_t w[2]) {
    const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
    w[0] = v.x, w[1] = v.y;
}
__device__ __forceinline__ int byte_of(const uint32_t *w, int i) { return (int)((w[i >> 2] >> (8 * (i & 3))) & 0xffu); }
__device__ __forceinline__ float half_at(const uint8_t *p) { return half_bits(__ldg(reinterpret_cast<const uint16_t *>(p))); }

/* (float)(q - BIAS) for 0 <= q < 2^23 without an int-to-float conversion (a quarter-rate instruction):
 * 2^23 + q as float bits, minus 2^23 + BIAS, both exact. */
template <int BIAS> __device__ __forceinline__ float qf(int q) {
    return __fsub_rn(__int_as_float(0x4B000000 | q), (float)(8388608 + BIAS));
}

/* ---- the block types ----------------------------------------------------------------------------
 * A row is a sequence of units (VALS values); a unit is PIECES pieces of 8 values. piece() loads what
 * piece p of unit u needs and dequantizes it (core/dtype.c's arithmetic); xoff() is the index of its
 * first value in the row (a piece's 8 values are consecutive). Threads take consecutive pieces, so a
 * warp's loads of weights, of activations and its bf16 stores each cover one contiguous span. */

template <uint32_t TYPE> struct qt;

/* block_q8_0 { half d; i8 qs[32]; } (34 bytes): x = q d */
template <> struct qt<OSP_DTYPE_Q8_0> {
    static constexpr int VALS = 32, PIECES = 4, BLOCK_BYTES = 34, BLOCK_VALS = 32;
    static_assert(VALS == 8 * PIECES && BLOCK_VALS % VALS == 0, "a unit is whole pieces, a block whole units");
    static __device__ __forceinline__ void piece(const uint8_t *row, int64_t u, int p, float w[8]) {
        const uint8_t *b = row + u * BLOCK_BYTES;
        const float d = half_at(b);
        uint32_t q[2];
        load8_a2(b + 2 + 8 * p, q);
#pragma unroll
        for (int i = 0; i < 8; i++) w[i] = __fmul_rn(qf<128>(byte_of(q, i) ^ 0x80), d); /* the int8 */
    }
    static __device__ __forceinline__ int64_t xoff(int64_t u, int p) { return 32 * u + 8 * p; }
};

/* block_q4_0 { half d; u8 qs[16]; } (18 bytes): value j < 16 is the low nibble of qs[j], 16 + j its
 * high nibble; x = (q - 8) d */
template <> struct qt<OSP_DTYPE_Q4_0> {
    static constexpr int VALS = 32, PIECES = 4, BLOCK_BYTES = 18, BLOCK_VALS = 32;
    static_assert(VALS == 8 * PIECES && BLOCK_VALS % VALS == 0, "a unit is whole pieces, a block whole units");
    static __device__ __forceinline__ void piece(const uint8_t *row, int64_t u, int p, float w[8]) {
        const uint8_t *b = row + u * BLOCK_BYTES;
        const float d = half_at(b);
        uint32_t q[2];
        load8_a2(b + 2 + 8 * (p & 1), q);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int by = byte_of(q, i);
            w[i] = __fmul_rn(qf<8>(p < 2 ? (by & 15) : (by >> 4)), d);
        }
    }
    static __device__ __forceinline__ int64_t xoff(int64_t u, int p) { return 32 * u + 8 * p; }
};

/* block_q4_1 { half d; half m; u8 qs[16]; } (20 bytes): as Q4_0 with x = q d + m */
template <> struct qt<OSP_DTYPE_Q4_1> {
    static constexpr int VALS = 32, PIECES = 4, BLOCK_BYTES = 20, BLOCK_VALS = 32;
    static_assert(VALS == 8 * PIECES && BLOCK_VALS % VALS == 0, "a unit is whole pieces, a block whole units");
    static __device__ __forceinline__ void piece(const uint8_t *row, int64_t u, int p, float w[8]) {
        const uint8_t *b = row + u * BLOCK_BYTES;
        const uint32_t dm = __ldg(reinterpret_cast<const uint32_t *>(b));
        const float d = half_bits(dm & 0xffffu), m = half_bits(dm >> 16);
        uint32_t q[2];
        load8_a4(b + 4 + 8 * (p & 1), q);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int by = byte_of(q, i);
            w[i] = __fadd_rn(__fmul_rn(qf<0>(p < 2 ? (by & 15) : (by >> 4)), d), m);
        }
    }
    static __device__ __forceinline__ int64_t xoff(int64_t u, int p) { return 32 * u + 8 * p; }
};

/* block_q4_K { half d; half dmin; u8 scales[12]; u8 qs[128]; } (144 bytes, 256 values). Unit u is the
 * pair of sub-blocks (2c, 2c + 1), c = u % 4, of superblock u / 4: values 64c + l (the low nibble of
 * qs[32c + l]) and 64c + 32 + l (its high nibble); pieces 0-3 are sub-block 2c, 4-7 sub-block 2c + 1.
 * x = (d sc) q - dmin m, the 6-bit sc and m unpacked as core/dtype.c's k4_scales. The block's first
 * 16 bytes (d, dmin, scales) are one aligned load. */
template <> struct qt<OSP_DTYPE_Q4_K> {
    static constexpr int VALS = 64, PIECES = 8, BLOCK_BYTES = 144, BLOCK_VALS = 256;
    static_assert(VALS == 8 * PIECES && BLOCK_VALS % VALS == 0, "a unit is whole pieces, a block whole units");
    static __device__ __forceinline__ void piece(const uint8_t *row, int64_t u, int p, float w[8]) {
        const uint8_t *b = row + (u >> 2) * BLOCK_BYTES;
        const int c = (int)(u & 3), j = 2 * c + (p >> 2);
        const uint4 hdr = __ldg(reinterpret_cast<const uint4 *>(b));
        /* scales[i] is byte i % 4 of word i / 4 of (hdr.y, hdr.z, hdr.w); j is a runtime value, so the
         * bytes are picked by selects (an indexed array would live in local memory) */
        const int jj = j & 3;
        const uint32_t lo = j < 4 ? hdr.y : hdr.w, mid = hdr.z; /* scales[j or j + 4 (j >= 4)], scales[j + 4 or j] */
        const int b_j = (int)((hdr.y >> (8 * jj)) & 0xffu), b_j4 = (int)((mid >> (8 * jj)) & 0xffu);
        const int b_j8 = (int)((lo >> (8 * jj)) & 0xffu); /* scales[j + 4] for j >= 4, i.e. word w */
        int sc, m;
        if (j < 4) {
            sc = b_j & 63;   /* scales[j] */
            m = b_j4 & 63;   /* scales[j + 4] */
        } else {             /* j >= 4: scales[j + 4] = byte jj of hdr.w, scales[j - 4] = byte jj of hdr.y, scales[j] = byte jj of hdr.z */
            sc = (b_j8 & 0x0f) | (b_j >> 6) << 4;
            m = (b_j8 >> 4) | (b_j4 >> 6) << 4;
        }
        const float dl = __fmul_rn(half_bits(hdr.x & 0xffffu), (float)sc);
        const float ml = __fmul_rn(half_bits(hdr.x >> 16), (float)m);
        uint32_t q[2];
        load8_a8(b + 16 + 32 * c + 8 * (p & 3), q);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int by = byte_of(q, i);
            w[i] = __fsub_rn(__fmul_rn(dl, qf<0>(p < 4 ? (by & 15) : (by >> 4))), ml);
        }
    }
    static __device__ __forceinline__ int64_t xoff(int64_t u, int p) { return 64 * u + 8 * p; }
};

/* block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; half d; } (210 bytes, 256 values). In half h,
 * value 128h + 32s + l has its low nibble in ql[64h + 32(s & 1) + l] (the low nibble for s < 2, the
 * high for s >= 2) and its top two bits at bits 2s, 2s + 1 of qh[32h + l]; its scale is sub-block
 * (128h + 32s + l) / 16. Unit u of superblock u / 4 is (h, s0) = ((u % 4) / 2, u % 2): pieces 0-3
 * are s = s0, 4-7 s = s0 + 2 (which share their ql bytes). x = (d sc) (q - 32). */
template <> struct qt<OSP_DTYPE_Q6_K> {
    static constexpr int VALS = 64, PIECES = 8, BLOCK_BYTES = 210, BLOCK_VALS = 256;
    static_assert(VALS == 8 * PIECES && BLOCK_VALS % VALS == 0, "a unit is whole pieces, a block whole units");
    static __device__ __forceinline__ void piece(const uint8_t *row, int64_t u, int p, float w[8]) {
        const uint8_t *b = row + (u >> 2) * BLOCK_BYTES;
        const int h = (int)((u & 3) >> 1), s0 = (int)(u & 1), s = s0 + (p >> 2) * 2, l0 = 8 * (p & 3);
        const float d = half_at(b + 208);
        const float dl = __fmul_rn(d, (float)(int8_t)__ldg(b + 192 + 8 * h + 2 * s + (l0 >> 4)));
        uint32_t ql[2], qh[2];
        load8_a2(b + 64 * h + 32 * s0 + l0, ql);
        load8_a2(b + 128 + 32 * h + l0, qh);
        /* a shift of the whole word by 2s <= 6: bits 0-1 of every byte still come from that byte */
        qh[0] >>= 2 * s, qh[1] >>= 2 * s;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int lo = p < 4 ? (byte_of(ql, i) & 15) : (byte_of(ql, i) >> 4);
            w[i] = __fmul_rn(dl, qf<32>(lo | (byte_of(qh, i) & 3) << 4));
        }
    }
    static __device__ __forceinline__ int64_t xoff(int64_t u, int p) {
        return 256 * (u >> 2) + 128 * ((u & 3) >> 1) + 32 * (u & 1) + (p < 4 ? 8 * p : 64 + 8 * (p - 4));
    }
};

/* ---- qdequant and qembed --------------------------------------------------------------------------- */

/* One thread per (row, piece): 8 bf16 values, one 16-byte store; a warp writes 512 contiguous bytes. */
template <uint32_t TYPE>
__global__ void qdequant_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t rows, int64_t K,
                                uint16_t *__restrict__ dst) {
    osp_pdl_begin();
    using Q = qt<TYPE>;
    const int64_t pieces = K / 8, total = rows * pieces;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / pieces, q = i % pieces, u = q / Q::PIECES;
        const int p = (int)(q % Q::PIECES);
        float v[8];
        Q::piece(w + (size_t)row * row_bytes, u, p, v);
        uint32_t h[4];
#pragma unroll
        for (int j = 0; j < 4; j++) { /* round to nearest even, two a conversion (osp_f_to_bf16 for finite values) */
            const __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * j], v[2 * j + 1]);
            h[j] = *reinterpret_cast<const uint32_t *>(&b);
        }
        *reinterpret_cast<uint4 *>(dst + (size_t)row * (size_t)K + Q::xoff(u, p)) = make_uint4(h[0], h[1], h[2], h[3]);
    }
}

/* x[t, :] = bf16(table[ids[t], :]) * scale, fp32: the bf16 weight path's embed_kernel on the same values. */
template <uint32_t TYPE>
__global__ void qembed_kernel(const uint8_t *__restrict__ table, size_t row_bytes, const int32_t *__restrict__ ids,
                              float *__restrict__ x, int64_t T, int64_t E, float scale) {
    osp_pdl_begin();
    using Q = qt<TYPE>;
    const int64_t pieces = E / 8;
    for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
        const uint8_t *row = table + (size_t)ids[t] * row_bytes;
        for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < pieces; q += (int64_t)gridDim.x * blockDim.x) {
            const int64_t u = q / Q::PIECES;
            const int p = (int)(q % Q::PIECES);
            float v[8];
            Q::piece(row, u, p, v);
            float *o = x + (size_t)t * (size_t)E + Q::xoff(u, p);
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = __fmul_rn(osp_bf16_to_f(osp_f_to_bf16(v[j])), scale);
        }
    }
}

/* ---- qmma: y = x w^T on the integer tensor cores, for every T -----------------------------------
 *
 * Activations are quantized first (qx_kernel, qx256_kernel) per row in blocks of 32 in two int8 levels,
 * the CPU's osp_q8_block scheme (backend/cpu/qdot.h): x_i ~ d q1_i + d2 q2_i, d2 = d / 256, the second
 * level quantizing the first's rounding residual, with d = amax / 127 over a group of 32 values (Q8_0,
 * Q4_0, Q4_1: relative error ~1e-5, below bf16's 2^-9) or 256 (Q4_K, Q6_K: a super-block's values
 * share d). A weight block of 32 codes (unsigned 0..63 for Q4/Q6, the int8 itself for Q8_0) then
 * meets an activation block in mma.sync m16n8k32 s8 x s8 -> s32, once per level: the integer sums are
 * exact, so the tensor cores' summation order is irrelevant. Group 32 (fold_tile): each (weight row,
 * activation row) output folds its blocks in K order in fp32:
 *     v = (256 I1 + I2) d2,   y = fma(a, v, y),   y = fma(o, s, y)
 * with the block's weight scale a and offset o (Q4_0: a = d, o = -8 d; Q4_1: a = d, o = m; Q8_0:
 * a = d, no offset) and the activation block's value sum s. The s32 accumulators start at the bits of
 * 1.5 * 2^23, so a sum |I| < 2^22 (Q8_0's bound is 32 * 128 * 127) reads back as a float with one FADD.
 * Group 256 (ifold_unit): a unit's blocks are summed times their integer sub-block scales in int32,
 * exactly, and fold into y once a unit (Q4_K: 256 values, Q6_K: 128) in K order; measured on the H200
 * against the group-32 fold (bench/gpu/DECODE.md, fourth session): Q4_K T = 1 -13 %, T = 512 -26 %.
 *
 * A CTA owns 16 weight rows (the mma's M) and up to 64 activation rows (eight n-tiles of 8); its 8
 * warps split the row's blocks into 8 fixed K slices (a function of K alone) and the CTA adds the 8
 * partial sums in warp order. Every output's arithmetic therefore depends only on K and its own two
 * rows: not on T, on the n-tile or CTA it lands in, or on the other rows (batch invariance).
 * Lane (g, c) = (lane / 4, lane % 4) holds weight rows g and g + 8. The mma's k positions are
 * permuted (the same permutation in A and B, which leaves the sum unchanged): the lane's k 4c..4c+3
 * and 16+4c..16+4c+3 are the block's values 8c .. 8c+7, so it loads 8 consecutive codes per row and
 * 8 consecutive bytes of each activation level. */

constexpr int QM_WARPS = 8;    /* K slices of a CTA, one warp each */
constexpr int QM_ROWS = 16;    /* weight rows of a CTA */
constexpr int QM_TCHUNK = 64;  /* activation rows of a CTA (8 n-tiles) */
constexpr int QM_MAGIC = 0x4B400000; /* 1.5 * 2^23 as float bits */
constexpr int64_t QX_BLOCK_BYTES = 64 + 16; /* a row's block in the workspace: 64 codes, a float4 of scales */

__device__ __forceinline__ uint16_t ld16(const uint8_t *p) { return __ldg(reinterpret_cast<const uint16_t *>(p)); }

/* the value of one s32 accumulator that started at QM_MAGIC (exact for |I| < 2^22) */
__device__ __forceinline__ float magic_f(int v) { return __int_as_float(v) - 12582912.0f; }

__device__ __forceinline__ void mma_s8_16832(int c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Per type: a unit is UB blocks of 32 values that one load step fetches (Raw: this lane's bytes of
 * one row); codes() gives block j's values 8c .. 8c+3 (lo) and 8c+4 .. 8c+7 (hi) as bytes. INT = false
 * (group-32 activations, fold_tile): scales() gives the block's float a and o. INT = true (group 256,
 * ifold_unit): iscales() gives its integer scales (sc[0]; per 16-value half sc[0], sc[1] where HALVES)
 * and integer min m, unit_d() / unit_o() the unit's float factors of the main and offset terms.
 * HAS_O: the group-32 type has a float offset term (fold_tile); Q6_K's offset is ifold_unit's. */
template <uint32_t TYPE> struct qm;

template <> struct qm<OSP_DTYPE_Q8_0> {
    static constexpr int UB = 2;
    static constexpr bool HALVES = false, HAS_O = false, INT = false;
    struct Raw { uint32_t q[2][2]; uint32_t d[2]; };
    static __device__ __forceinline__ void load(const uint8_t *row, int u, int c, Raw &r) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint8_t *b = row + (2 * u + j) * 34;
            r.d[j] = ld16(b);
            load8_a2(b + 2 + 8 * c, r.q[j]);
        }
    }
    static __device__ __forceinline__ void codes(const Raw &r, int j, int c, uint32_t &lo, uint32_t &hi) {
        (void)c;
        lo = r.q[j][0], hi = r.q[j][1];
    }
    static __device__ __forceinline__ void scales(const Raw &r, int j, float &a, float &o) {
        a = half_bits(r.d[j]), o = 0.0f;
    }
};

template <> struct qm<OSP_DTYPE_Q4_0> {
    static constexpr int UB = 2;
    static constexpr bool HALVES = false, HAS_O = true, INT = false;
    struct Raw { uint32_t q[2][2]; uint32_t d[2]; };
    static __device__ __forceinline__ void load(const uint8_t *row, int u, int c, Raw &r) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint8_t *b = row + (2 * u + j) * 18;
            r.d[j] = ld16(b);
            load8_a2(b + 2 + 8 * (c & 1), r.q[j]); /* values 8c..8c+7: low nibbles (c < 2) or high of these bytes */
        }
    }
    static __device__ __forceinline__ void codes(const Raw &r, int j, int c, uint32_t &lo, uint32_t &hi) {
        const int sh = 4 * (c >> 1);
        lo = (r.q[j][0] >> sh) & 0x0F0F0F0Fu, hi = (r.q[j][1] >> sh) & 0x0F0F0F0Fu;
    }
    static __device__ __forceinline__ void scales(const Raw &r, int j, float &a, float &o) {
        a = half_bits(r.d[j]), o = -8.0f * a;
    }
};

template <> struct qm<OSP_DTYPE_Q4_1> {
    static constexpr int UB = 2;
    static constexpr bool HALVES = false, HAS_O = true, INT = false;
    struct Raw { uint32_t q[2][2]; uint32_t dm[2]; };
    static __device__ __forceinline__ void load(const uint8_t *row, int u, int c, Raw &r) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint8_t *b = row + (2 * u + j) * 20;
            r.dm[j] = __ldg(reinterpret_cast<const uint32_t *>(b));
            load8_a4(b + 4 + 8 * (c & 1), r.q[j]);
        }
    }
    static __device__ __forceinline__ void codes(const Raw &r, int j, int c, uint32_t &lo, uint32_t &hi) {
        const int sh = 4 * (c >> 1);
        lo = (r.q[j][0] >> sh) & 0x0F0F0F0Fu, hi = (r.q[j][1] >> sh) & 0x0F0F0F0Fu;
    }
    static __device__ __forceinline__ void scales(const Raw &r, int j, float &a, float &o) {
        a = half_bits(r.dm[j] & 0xffffu), o = half_bits(r.dm[j] >> 16);
    }
};

/* a unit is a super-block: the 16-byte header and, for sub-block pair i, bytes 32 i + 8c .. + 7 of qs
 * (low nibbles: sub-block 2i, high: 2i + 1) */
template <> struct qm<OSP_DTYPE_Q4_K> {
    static constexpr int UB = 8;
    static constexpr bool HALVES = false, HAS_O = true, INT = true;
    struct Raw { uint4 hdr; uint2 q[4]; };
    static __device__ __forceinline__ void load(const uint8_t *row, int u, int c, Raw &r) {
        const uint8_t *b = row + u * 144;
        r.hdr = __ldg(reinterpret_cast<const uint4 *>(b));
#pragma unroll
        for (int i = 0; i < 4; i++) r.q[i] = __ldg(reinterpret_cast<const uint2 *>(b + 16 + 32 * i + 8 * c));
    }
    static __device__ __forceinline__ void codes(const Raw &r, int j, int c, uint32_t &lo, uint32_t &hi) {
        (void)c;
        const int sh = 4 * (j & 1);
        lo = (r.q[j >> 1].x >> sh) & 0x0F0F0F0Fu, hi = (r.q[j >> 1].y >> sh) & 0x0F0F0F0Fu;
    }
    /* block j's 6-bit scale and min in core/dtype.c's k4 scale layout, four 6-bit values a word: sc 0-3
     * = scales[0..3] & 63, m 0-3 = scales[4..7] & 63, sc 4-7 = scales[8..11] low nibbles | (scales[0..3]
     * >> 6) << 4, m 4-7 = the high nibbles | (scales[4..7] >> 6) << 4; the unit's d, and the offset's
     * factor -dmin */
    static __device__ __forceinline__ void iscales(const Raw &r, int j, int sc[2], int &m) {
        const uint32_t y = r.hdr.y, z = r.hdr.z, w = r.hdr.w;
        const uint32_t scw = j < 4 ? y & 0x3F3F3F3Fu : (w & 0x0F0F0F0Fu) | ((y >> 2) & 0x30303030u);
        const uint32_t mw = j < 4 ? z & 0x3F3F3F3Fu : ((w >> 4) & 0x0F0F0F0Fu) | ((z >> 2) & 0x30303030u);
        sc[0] = (int)__byte_perm(scw, 0u, 0x4440u | (unsigned)(j & 3)), sc[1] = 0;
        m = (int)__byte_perm(mw, 0u, 0x4440u | (unsigned)(j & 3));
    }
    static __device__ __forceinline__ float unit_d(const Raw &r) { return half_bits(r.hdr.x & 0xffffu); }
    static __device__ __forceinline__ float unit_o(const Raw &r) { return -half_bits(r.hdr.x >> 16); }
};

/* a unit is half a super-block (h = u % 2: 128 values, sub-blocks s = 0..3 of 32): ql bytes 64h +
 * 32(s & 1) + 8c .. + 7 (low nibbles for s < 2, high for s >= 2), qh bytes 128 + 32h + 8c .. + 7 (bits
 * 2s, 2s + 1), the half's 8 scales (16 values each) and d */
template <> struct qm<OSP_DTYPE_Q6_K> {
    static constexpr int UB = 4;
    static constexpr bool HALVES = true, INT = true; /* the offset -32 x scale: ifold_unit */
    struct Raw { uint32_t ql[2][2]; uint32_t qh[2]; uint32_t sc[2]; uint32_t d; };
    /* A 210-byte block is only 2-byte aligned: each 8-byte span (at a multiple of 4 in the block) comes
     * as 32-bit words from the block's 4-byte aligned base, shifted by 0 or 16 bits (3 loads, the third
     * only when misaligned, so nothing past the block is read; 4 16-bit loads before) */
    static __device__ __forceinline__ void load(const uint8_t *row, int u, int c, Raw &r) {
        const uint8_t *b = row + (u >> 1) * 210;
        const int h = (int)(u & 1);
        const uintptr_t a = reinterpret_cast<uintptr_t>(b);
        const uint32_t *w = reinterpret_cast<const uint32_t *>(a & ~(uintptr_t)3);
        const unsigned sh = (unsigned)(a & 2u) * 8u; /* 0 or 16 */
        auto span = [&](int o, uint32_t v[2]) {
            const uint32_t *p = w + (o >> 2);
            const uint32_t w0 = __ldg(p), w1 = __ldg(p + 1), w2 = sh ? __ldg(p + 2) : 0u;
            v[0] = __funnelshift_r(w0, w1, sh), v[1] = __funnelshift_r(w1, w2, sh);
        };
        span(64 * h + 8 * c, r.ql[0]);
        span(64 * h + 32 + 8 * c, r.ql[1]);
        span(128 + 32 * h + 8 * c, r.qh);
        span(192 + 8 * h, r.sc);
        r.d = ld16(b + 208);
    }
    static __device__ __forceinline__ void codes(const Raw &r, int s, int c, uint32_t &lo, uint32_t &hi) {
        (void)c;
        const int sh = 4 * (s >> 1);
        lo = ((r.ql[s & 1][0] >> sh) & 0x0F0F0F0Fu) | ((r.qh[0] >> (2 * s)) & 0x03030303u) << 4;
        hi = ((r.ql[s & 1][1] >> sh) & 0x0F0F0F0Fu) | ((r.qh[1] >> (2 * s)) & 0x03030303u) << 4;
    }
    /* the int8 scales of block s's two 16-value halves (scales 2s and 2s + 1 of the half: bytes 2(s & 1),
     * + 1); the offset -32 is folded by ifold_unit */
    static __device__ __forceinline__ void iscales(const Raw &r, int s, int sc[2], int &m) {
        const uint32_t wd = r.sc[s >> 1] >> (16 * (s & 1));
        sc[0] = (int)(int8_t)(wd & 0xffu), sc[1] = (int)(int8_t)((wd >> 8) & 0xffu), m = 0;
    }
    static __device__ __forceinline__ float unit_d(const Raw &r) { return half_bits(r.d); }
    static __device__ __forceinline__ float unit_o(const Raw &r) { (void)r; return 0.0f; }
};

/* One warp per (block, row), osp_qx_block's arithmetic (qx.cuh); rows t in [T, Tp) are zero. */
__global__ void qx_kernel(const uint16_t *__restrict__ x, int64_t T, int64_t Tp, int64_t K, int8_t *__restrict__ codes,
                          float4 *__restrict__ sc) {
    osp_pdl_begin();
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), nb = K / 32;
    if (item >= nb * Tp) return;
    const int64_t b = item / Tp, t = item % Tp;
    const float v = t < T ? osp_bf16_to_f(x[(size_t)t * (size_t)K + (size_t)b * 32 + lane]) : 0.0f;
    osp_qx_block(v, lane, codes + item * 64, sc + item);
}

/* group 256 (the K-quant types): one warp per (256-value group, row), osp_qx_group256 (qx.cuh); rows t
 * in [T, Tp) are zero. x's rows 16-byte aligned (K % 256 == 0 keeps them so). */
__global__ void qx256_kernel(const uint16_t *__restrict__ x, int64_t T, int64_t Tp, int64_t K, int8_t *__restrict__ codes,
                             float4 *__restrict__ sc) {
    osp_pdl_begin();
    const int lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), ng = K / 256;
    if (item >= ng * Tp) return;
    const int64_t gi = item / Tp, t = item % Tp;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (t < T) {
        const uint4 r = *reinterpret_cast<const uint4 *>(x + (size_t)t * (size_t)K + (size_t)gi * 256 + 8 * lane);
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = osp_bf16_to_f((uint16_t)(w[i >> 1] >> (16 * (i & 1))));
    }
    const int64_t it = osp_qx_item(8 * gi, t, Tp);
    osp_qx_group256(v, lane, codes + it * 64, sc + it, Tp);
}

/* An activation block's scales {d2, s, s_lo, s_hi} from global memory, loading only what the type
 * reads: d2 alone (no offset term), d2 and s (one scale a block), all four (Q6_K's halves). Fewer
 * registers for the loads the compiler hoists over a unit's blocks (Q4_K at T = 1 spilled with float4s). */
template <uint32_t TYPE> __device__ __forceinline__ float4 scales_at(const float4 *p) {
    using Q = qm<TYPE>;
    if constexpr (Q::HALVES) return __ldg(p);
    else if constexpr (Q::HAS_O) {
        const float2 v = __ldg(reinterpret_cast<const float2 *>(p));
        return make_float4(v.x, v.y, 0.0f, 0.0f);
    } else return make_float4(__ldg(reinterpret_cast<const float *>(p)), 0.0f, 0.0f, 0.0f);
}

/* Q8_0, Q4_0, Q4_1 (activations in groups of 32): one n-tile of one block, the two levels' products on
 * the tensor cores, then each of this lane's four outputs (rows g, g + 8; columns 2c, 2c + 1) folds the
 * block in: v = (256 I1 + I2) d2, acc = fma(a, v, acc), acc = fma(o, s, acc). a: the A fragment (rows
 * g, g + 8, values 8c..8c+3, then rows g, g + 8, values 8c+4..8c+7); sa / so: the rows' scales; b1 / b2:
 * this lane's activation codes of column g (levels 1 and 2); s0 / s1: columns 2c and 2c + 1's {d2, s,
 * s_lo, s_hi}. Every kernel calls this, so an output's arithmetic is the same whichever computes it.
 * T1: only column 0 counts (one activation row). */
template <uint32_t TYPE, bool T1>
__device__ __forceinline__ void fold_tile(float acc[4], const uint32_t a[4], const float sa[2], const float so[2],
                                          uint2 b1, uint2 b2, float4 s0, float4 s1) {
    using Q = qm<TYPE>;
    static_assert(!Q::INT && !Q::HALVES, "the group-32 types");
    int c1[4], c2[4];
#pragma unroll
    for (int e = 0; e < 4; e++) c1[e] = QM_MAGIC, c2[e] = QM_MAGIC;
    mma_s8_16832(c1, a, b1.x, b1.y);
    mma_s8_16832(c2, a, b2.x, b2.y);
#pragma unroll
    for (int e = 0; e < 4; e++) {
        if (T1 && (e & 1)) continue;
        const int r = e >> 1;
        const float4 sv = (e & 1) ? s1 : s0;
        const float I = fmaf(magic_f(c1[e]), 256.0f, magic_f(c2[e]));
        float v = fmaf(sa[r], I * sv.x, acc[e]);
        if (Q::HAS_O) v = fmaf(so[r], sv.y, v);
        acc[e] = v;
    }
}

/* Q4_K and Q6_K (INT; activations in groups of 256, cuda_ops.h's osp_cuda_qx): one unit's blocks for
 * one n-tile, folded into acc[4] once. Block j's two levels run on the tensor cores as in fold_tile
 * (Q6_K: a mma a half with the other half's A lanes zero, or at T = 1 (SH) one mma a level with the
 * activation's halves in B's columns 0 and 1, so lane c = 0's accumulators come out split by half); then, in int32 and so exactly, per output (row r, column k)
 *     A1 += sc c1,   A2 += sc c2,   M += m S
 * with the sub-block's integer scale sc (Q6_K: each half's) and, for the offset, Q4_K's 6-bit min m
 * times the column's block code sum S = 256 s1 + s2 (Q6_K: each half's scale times its half's sum).
 * Once a unit: acc = fma(d d2, (float)(256 A1 + A2), acc) then acc = fma(-dmin d2, (float)M, acc)
 * (Q4_K), acc = fma(d d2, (float)(256 A1 + A2 - 32 M), acc) (Q6_K), 256 A1 + A2 - 32 M in int64, d2
 * the column's group scale. int32 holds the sums: Q4_K |A| <= 8 blocks x 32 x 15 x 127 x 63 < 2^25,
 * |M| <= 8 x 63 x (257 x 32 x 127) < 2^30; Q6_K (4 blocks, 8 halves) |A| <= 8 x 16 x 63 x 127 x 128
 * < 2^28, |M| <= 8 x 128 x (257 x 16 x 127) < 2^30. Against fold_tile's per-block fold this is one
 * fp32 epilogue per 256 (Q4_K) or 128 (Q6_K) values instead of 8 or 4. ld(j, b1, b2, s0, s1) gives
 * block j's activation codes of this lane's column g (levels 1, 2) and the scales of columns 2c and
 * 2c + 1 ({d2, S, S_lo, S_hi}, the ints as bits); it is called for j = 0, 1, .. in order. Every kernel
 * calls this, so an output's bits do not depend on which one computes it. */
template <uint32_t TYPE, bool T1, bool SH, class LD>
__device__ __forceinline__ void ifold_unit(const typename qm<TYPE>::Raw r[2], int c, float acc[4], LD &&ld) {
    using Q = qm<TYPE>;
    static_assert(Q::INT, "integer fold: the group-256 types");
    static_assert(!SH || (Q::HALVES && T1), "SH: Q6_K at T = 1");
    int A1[4] = {0, 0, 0, 0}, A2[4] = {0, 0, 0, 0}, M[4] = {0, 0, 0, 0};
    float d2c[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < Q::UB; j++) {
        uint32_t a[4];
        Q::codes(r[0], j, c, a[0], a[2]);
        Q::codes(r[1], j, c, a[1], a[3]);
        int sc[2][2], mo[2];
        Q::iscales(r[0], j, sc[0], mo[0]);
        Q::iscales(r[1], j, sc[1], mo[1]);
        uint2 b1, b2;
        float4 s0, s1;
        ld(j, b1, b2, s0, s1);
        if (j == 0) d2c[0] = s0.x, d2c[1] = s1.x;
        if constexpr (SH) {
            /* columns 0 and 1 of the mma are the one row's halves: lane c = 0's c[2 r + h] */
            int c1[4] = {0, 0, 0, 0}, c2[4] = {0, 0, 0, 0};
            mma_s8_16832(c1, a, b1.x, b1.y);
            mma_s8_16832(c2, a, b2.x, b2.y);
            const int lo = __float_as_int(s0.z), hi = __float_as_int(s0.w);
#pragma unroll
            for (int rr = 0; rr < 2; rr++) {
                A1[2 * rr] += sc[rr][0] * c1[2 * rr] + sc[rr][1] * c1[2 * rr + 1];
                A2[2 * rr] += sc[rr][0] * c2[2 * rr] + sc[rr][1] * c2[2 * rr + 1];
                M[2 * rr] += sc[rr][0] * lo + sc[rr][1] * hi;
            }
        } else if constexpr (Q::HALVES) {
            int c1[2][4], c2[2][4];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                uint32_t ah[4];
                const bool mine = (h == 0) == (c < 2); /* lanes c < 2 hold values 0..15 */
#pragma unroll
                for (int i = 0; i < 4; i++) ah[i] = mine ? a[i] : 0u;
#pragma unroll
                for (int e = 0; e < 4; e++) c1[h][e] = 0, c2[h][e] = 0;
                mma_s8_16832(c1[h], ah, b1.x, b1.y);
                mma_s8_16832(c2[h], ah, b2.x, b2.y);
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (T1 && (e & 1)) continue;
                const int rr = e >> 1;
                const float4 sv = (e & 1) ? s1 : s0;
                A1[e] += sc[rr][0] * c1[0][e] + sc[rr][1] * c1[1][e];
                A2[e] += sc[rr][0] * c2[0][e] + sc[rr][1] * c2[1][e];
                M[e] += sc[rr][0] * __float_as_int(sv.z) + sc[rr][1] * __float_as_int(sv.w);
            }
        } else {
            int c1[4] = {0, 0, 0, 0}, c2[4] = {0, 0, 0, 0};
            mma_s8_16832(c1, a, b1.x, b1.y);
            mma_s8_16832(c2, a, b2.x, b2.y);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if (T1 && (e & 1)) continue;
                const int rr = e >> 1;
                A1[e] += sc[rr][0] * c1[e];
                A2[e] += sc[rr][0] * c2[e];
                M[e] += mo[rr] * __float_as_int((e & 1) ? s1.y : s0.y);
            }
        }
    }
    const float dr[2] = {Q::unit_d(r[0]), Q::unit_d(r[1])};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        if (T1 && (e & 1)) continue;
        const int rr = e >> 1;
        const float d2 = d2c[e & 1];
        long long I = (long long)A1[e] * 256 + A2[e];
        if constexpr (Q::HALVES) I -= 32LL * M[e];
        float v = fmaf(__fmul_rn(dr[rr], d2), (float)I, acc[e]);
        if constexpr (!Q::HALVES) v = fmaf(__fmul_rn(Q::unit_o(r[rr]), d2), (float)M[e], v);
        acc[e] = v;
    }
}

/* Block j of unit `cur` (rows g and g + 8) of a group-32 type: the A fragment and the rows' scales. */
template <uint32_t TYPE>
__device__ __forceinline__ void block_frag(const typename qm<TYPE>::Raw cur[2], int j, int c, uint32_t a[4], float sa[2],
                                           float so[2]) {
    using Q = qm<TYPE>;
    Q::codes(cur[0], j, c, a[0], a[2]);
    Q::codes(cur[1], j, c, a[1], a[3]);
    Q::scales(cur[0], j, sa[0], so[0]);
    Q::scales(cur[1], j, sa[1], so[1]);
}

/* Split mode (small T): a CTA is 16 weight rows x up to 64 activation rows; warp w takes K slice w (its
 * units u0 .. u1) and the CTA adds the 8 slices' sums in order. Activation codes come from global memory
 * (L1/L2); lanes whose column is past T load nothing. */
template <uint32_t TYPE, int NTT, bool T1>
__global__ void __launch_bounds__(QM_WARPS * 32)
    qmma_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t N, int64_t n_units,
                const int8_t *__restrict__ xc, const float4 *__restrict__ xs, int64_t T, int64_t Tp,
                void *__restrict__ y, int64_t ldy, bool y_f32) {
    osp_pdl_begin();
    using Q = qm<TYPE>;
    __shared__ float part[QM_WARPS][QM_ROWS][QM_TCHUNK];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t n0 = (int64_t)blockIdx.x * QM_ROWS, t0 = (int64_t)blockIdx.y * QM_TCHUNK;
    const int tc = (int)(T - t0 < QM_TCHUNK ? T - t0 : QM_TCHUNK), ntiles = (tc + 7) / 8;
    const int64_t u0 = n_units * warp / QM_WARPS, u1 = n_units * (warp + 1) / QM_WARPS;
    const uint8_t *rp[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int64_t n = n0 + g + 8 * i;
        rp[i] = w + (size_t)(n < N ? n : N - 1) * row_bytes;
    }
    float acc[NTT][4];
#pragma unroll
    for (int tt = 0; tt < NTT; tt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[tt][e] = 0.0f;
    typename Q::Raw cur[2], nxt[2];
    if (u0 < u1) Q::load(rp[0], u0, c, cur[0]), Q::load(rp[1], u0, c, cur[1]);
    for (int64_t u = u0; u < u1; u++) {
        if (u + 1 < u1) Q::load(rp[0], u + 1, c, nxt[0]), Q::load(rp[1], u + 1, c, nxt[1]);
        if constexpr (Q::INT) {
#pragma unroll
            for (int tt = 0; tt < NTT; tt++) {
                if (tt >= ntiles) continue;
                const bool live = tt * 8 + g < tc; /* padding columns: zeros, no load */
                auto ld = [&](int j, uint2 &b1, uint2 &b2, float4 &s0, float4 &s1) {
                    const int64_t blk = u * Q::UB + j;
                    const int8_t *xb = xc + ((size_t)blk * (size_t)Tp + (size_t)(t0 + tt * 8 + g)) * 64 + 8 * c;
                    const float4 *sb = xs + (size_t)blk * (size_t)Tp + (size_t)(t0 + tt * 8 + 2 * c);
                    b1 = make_uint2(0, 0), b2 = make_uint2(0, 0);
                    if (live) {
                        b1 = __ldg(reinterpret_cast<const uint2 *>(xb));
                        b2 = __ldg(reinterpret_cast<const uint2 *>(xb + 32));
                    }
                    s0 = scales_at<TYPE>(sb), s1 = T1 ? s0 : scales_at<TYPE>(sb + 1);
                };
                ifold_unit<TYPE, T1, false>(cur, c, acc[tt], ld);
            }
        } else {
#pragma unroll
            for (int j = 0; j < Q::UB; j++) {
                uint32_t a[4];
                float sa[2], so[2];
                block_frag<TYPE>(cur, j, c, a, sa, so);
                const int64_t blk = u * Q::UB + j;
                const int8_t *xb = xc + ((size_t)blk * (size_t)Tp + (size_t)(t0 + g)) * 64 + 8 * c;
                const float4 *sb = xs + (size_t)blk * (size_t)Tp + (size_t)(t0 + 2 * c);
#pragma unroll
                for (int tt = 0; tt < NTT; tt++) {
                    if (tt >= ntiles) continue;
                    const bool live = tt * 8 + g < tc; /* padding columns: zeros, no load */
                    uint2 b1 = make_uint2(0, 0), b2 = make_uint2(0, 0);
                    if (live) {
                        b1 = __ldg(reinterpret_cast<const uint2 *>(xb + tt * 8 * 64));
                        b2 = __ldg(reinterpret_cast<const uint2 *>(xb + tt * 8 * 64 + 32));
                    }
                    const float4 s0 = scales_at<TYPE>(sb + tt * 8), s1 = T1 ? s0 : scales_at<TYPE>(sb + tt * 8 + 1);
                    fold_tile<TYPE, T1>(acc[tt], a, sa, so, b1, b2, s0, s1);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < 2; i++) cur[i] = nxt[i];
    }
#pragma unroll
    for (int tt = 0; tt < NTT; tt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (tt < ntiles) part[warp][g + 8 * (e >> 1)][tt * 8 + 2 * c + (e & 1)] = acc[tt][e];
    __syncthreads();
    for (int i = threadIdx.x; i < QM_ROWS * tc; i += blockDim.x) {
        const int r = i / tc, col = i % tc;
        if (n0 + r >= N) continue;
        float s = part[0][r][col];
#pragma unroll
        for (int k = 1; k < QM_WARPS; k++) s += part[k][r][col];
        const size_t o = (size_t)(t0 + col) * (size_t)ldy + (size_t)(n0 + r);
        if (y_f32) static_cast<float *>(y)[o] = s;
        else static_cast<uint16_t *>(y)[o] = osp_f_to_bf16(s);
    }
}

/* Persistent split mode (T <= 8 unless OSPREY_QMMA_PERSIST=0): as many CTAs as fit on the device at
 * once, CTA b taking the 16-row tiles b, b + gridDim.x, ...; warp w folds slice w of each tile with the
 * split kernel's calls in the split kernel's order, and the CTA adds the slices in warp order as there
 * (the same bits: test_gpu_qmatmul compares rows across T and modes). What differs is the loading: a
 * warp's register double buffer runs on across tiles, so the first unit of its next tile is in flight
 * while the CTA adds the current tile's slices, and no CTA pays a cold start per 16 rows. The slice sums
 * go through a double-buffered shared array: one barrier a tile. */
template <uint32_t TYPE, bool T1>
__global__ void __launch_bounds__(QM_WARPS * 32, 2)
    qmma_persist_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t N, int64_t n_units,
                        const int8_t *__restrict__ xc, const float4 *__restrict__ xs, int64_t T, int64_t Tp,
                        void *__restrict__ y, int64_t ldy, bool y_f32) {
    using Q = qm<TYPE>;
    __shared__ float part[2][QM_WARPS][QM_ROWS][8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int tc = (int)T; /* <= 8: one n-tile */
    /* SH: Q6_K at T = 1 takes a half a column (ifold_unit): columns 0 and 1 are the one activation
     * row's halves, loaded by the lanes of column g = c / 2 */
    constexpr bool SH = qm<TYPE>::HALVES && T1;
    const bool live = SH ? g < 2 && (c >> 1) == g : g < tc;
    const int u0 = (int)(n_units * warp / QM_WARPS), u1 = (int)(n_units * (warp + 1) / QM_WARPS);
    const int64_t n_tiles = (N + QM_ROWS - 1) / QM_ROWS;
    auto rows_of = [&](int64_t tile, const uint8_t *rp[2]) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int64_t n = tile * QM_ROWS + g + 8 * i;
            rp[i] = w + (size_t)(n < N ? n : N - 1) * row_bytes;
        }
    };
    int64_t tile = blockIdx.x;
    const uint8_t *rp[2], *np[2];
    rows_of(tile, rp);
    typename Q::Raw cur[2], nxt[2];
    if (tile < n_tiles && u0 < u1) Q::load(rp[0], u0, c, cur[0]), Q::load(rp[1], u0, c, cur[1]);
    /* the first unit's weights are in flight before the wait: no kernel writes them (osp_pdl_begin's
     * contract), so their latency overlaps the kernel before this one */
    osp_pdl_begin();
    /* this lane's activation codes (column g) and scales (columns 2c, 2c + 1) of the slice's first block;
     * block b + 1's lie xstep bytes / Tp float4s after block b's. Walked by pointer increments: the
     * products blk * Tp of every block in 64 bits were ~200 of a Q4_K unit's 618 instructions (SASS). */
    const size_t xstep = (size_t)Tp * 64;
    const int8_t *const xb0 = xc + ((size_t)(u0 * Q::UB) * (size_t)Tp + (size_t)(SH ? 0 : g)) * 64 + 8 * c;
    const float4 *const sb0 = xs + (size_t)(u0 * Q::UB) * (size_t)Tp + (size_t)(2 * c);
    /* fold unit u (held in r) into acc: the blocks in K order, the activation pointers walked along */
    const int8_t *xb = xb0;
    const float4 *sb = sb0;
    auto fold_unit = [&](const typename Q::Raw r[2], float acc[4], int u) {
        if constexpr (Q::INT) {
            /* T <= 8, so Tp = 8: block j of the unit is 8 items on, an immediate offset (32-bit
             * indices) */
            const int it = u * Q::UB * 8;
            const int8_t *xu = xc + (size_t)(it + (SH ? 0 : g)) * 64 + 8 * c;
            const float4 *su = xs + (it + 2 * c);
            /* lanes of columns past T load nothing (zeros): at T = 1 the other 7 rows' loads would be
             * 8x the activation traffic (measured slower) */
            auto ld = [&](int j, uint2 &b1, uint2 &b2, float4 &s0, float4 &s1) {
                b1 = make_uint2(0, 0), b2 = make_uint2(0, 0);
                if (live) {
                    b1 = __ldg(reinterpret_cast<const uint2 *>(xu + 512 * j));
                    b2 = __ldg(reinterpret_cast<const uint2 *>(xu + 512 * j + 32));
                }
                s0 = scales_at<TYPE>(su + 8 * j), s1 = T1 ? s0 : scales_at<TYPE>(su + 8 * j + 1);
            };
            ifold_unit<TYPE, T1, SH>(r, c, acc, ld);
        } else {
#pragma unroll
            for (int j = 0; j < Q::UB; j++, xb += xstep, sb += Tp) {
                uint32_t a[4];
                float sa[2], so[2];
                block_frag<TYPE>(r, j, c, a, sa, so);
                uint2 b1 = make_uint2(0, 0), b2 = make_uint2(0, 0);
                if (live) {
                    b1 = __ldg(reinterpret_cast<const uint2 *>(xb));
                    b2 = __ldg(reinterpret_cast<const uint2 *>(xb + 32));
                }
                const float4 s0 = scales_at<TYPE>(sb), s1 = T1 ? s0 : scales_at<TYPE>(sb + 1);
                fold_tile<TYPE, T1>(acc, a, sa, so, b1, b2, s0, s1);
            }
        }
    };
    for (int buf = 0; tile < n_tiles; tile += gridDim.x, buf ^= 1) {
        const int64_t next = tile + gridDim.x;
        rows_of(next < n_tiles ? next : tile, np);
        const bool more = next < n_tiles;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        xb = xb0, sb = sb0;
        /* units in pairs, cur and nxt trading roles (no register copies); each load is issued before
         * the fold of the unit before it, the next tile's first unit after this tile's last */
        int u = u0;
        for (; u + 1 < u1; u += 2) {
            Q::load(rp[0], u + 1, c, nxt[0]), Q::load(rp[1], u + 1, c, nxt[1]);
            fold_unit(cur, acc, u);
            if (u + 2 < u1) Q::load(rp[0], u + 2, c, cur[0]), Q::load(rp[1], u + 2, c, cur[1]);
            else if (more) Q::load(np[0], u0, c, cur[0]), Q::load(np[1], u0, c, cur[1]);
            fold_unit(nxt, acc, u + 1);
        }
        if (u < u1) { /* an odd unit count: the last unit alone, then one copy a tile */
            if (more) Q::load(np[0], u0, c, nxt[0]), Q::load(np[1], u0, c, nxt[1]);
            fold_unit(cur, acc, u);
#pragma unroll
            for (int i = 0; i < 2; i++) cur[i] = nxt[i];
        }
        rp[0] = np[0], rp[1] = np[1];
#pragma unroll
        for (int e = 0; e < 4; e++) part[buf][warp][g + 8 * (e >> 1)][2 * c + (e & 1)] = acc[e];
        __syncthreads();
        for (int i = threadIdx.x; i < QM_ROWS * tc; i += blockDim.x) {
            const int r = i / tc, col = i % tc;
            const int64_t n = tile * QM_ROWS + r;
            if (n >= N) continue;
            float sum = part[buf][0][r][col];
#pragma unroll
            for (int k = 1; k < QM_WARPS; k++) sum += part[buf][k][r][col];
            const size_t o = (size_t)col * (size_t)ldy + (size_t)n;
            if (y_f32) static_cast<float *>(y)[o] = sum;
            else static_cast<uint16_t *>(y)[o] = osp_f_to_bf16(sum);
        }
    }
}

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    const uint32_t sa = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

/* Wide mode (large T): a CTA is 8 warps x 16 = 128 weight rows x 64 activation rows, each warp running the
 * whole K for its 16 rows; a unit's activation codes and scales for the CTA's 64 columns are staged in
 * shared memory once (cp.async, double-buffered) for all 8 warps. The warp folds K slice s (split
 * mode's slices) into a fresh sum and adds it to the total in slice order: split mode's arithmetic,
 * bit for bit, with 8x less activation traffic. */
template <uint32_t TYPE> struct wide_smem {
    static constexpr int UB = qm<TYPE>::UB;
    static constexpr size_t CODES = (size_t)UB * QM_TCHUNK * 64, SCALES = (size_t)UB * QM_TCHUNK * 16;
    static constexpr size_t BYTES = 2 * (CODES + SCALES);
};

template <uint32_t TYPE, int NTT>
__global__ void __launch_bounds__(QM_WARPS * 32)
    qmma_wide_kernel(const uint8_t *__restrict__ w, size_t row_bytes, int64_t N, int64_t n_units,
                     const int8_t *__restrict__ xc, const float4 *__restrict__ xs, int64_t T, int64_t Tp,
                     void *__restrict__ y, int64_t ldy, bool y_f32) {
    osp_pdl_begin();
    using Q = qm<TYPE>;
    using S = wide_smem<TYPE>;
    extern __shared__ __align__(16) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t n0 = (int64_t)blockIdx.x * (QM_ROWS * QM_WARPS) + QM_ROWS * warp;
    const int64_t t0 = (int64_t)blockIdx.y * QM_TCHUNK;
    const int tc = (int)(T - t0 < QM_TCHUNK ? T - t0 : QM_TCHUNK), ntiles = (tc + 7) / 8;
    const int cols = ntiles * 8; /* staged columns (< Tp - t0 + 1: Tp is a multiple of 8) */
    const uint8_t *rp[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int64_t n = n0 + g + 8 * i;
        rp[i] = w + (size_t)(n < N ? n : N - 1) * row_bytes;
    }
    /* stage unit u's activations into buffer b: UB blocks x cols x (64 code bytes, 16 scale bytes) */
    auto stage = [&](int64_t u, int b) {
        uint8_t *codes = smem + (size_t)b * (S::CODES + S::SCALES), *scl = codes + S::CODES;
        const int code_chunks = Q::UB * cols * 4, scale_chunks = Q::UB * cols; /* 16-byte pieces */
        for (int i = threadIdx.x; i < code_chunks + scale_chunks; i += blockDim.x) {
            if (i < code_chunks) {
                const int j = i / (cols * 4), r = i % (cols * 4); /* block j, piece r of its cols x 64 bytes */
                const int64_t blk = u * Q::UB + j;
                cp_async16(codes + ((size_t)j * QM_TCHUNK * 64 + (size_t)r * 16),
                           xc + ((size_t)blk * (size_t)Tp + (size_t)t0) * 64 + (size_t)r * 16);
            } else {
                const int k = i - code_chunks, j = k / cols, col = k % cols;
                const int64_t blk = u * Q::UB + j;
                cp_async16(scl + ((size_t)j * QM_TCHUNK + (size_t)col) * 16, xs + (size_t)blk * (size_t)Tp + (size_t)(t0 + col));
            }
        }
    };
    float total[NTT][4], acc[NTT][4];
#pragma unroll
    for (int tt = 0; tt < NTT; tt++)
#pragma unroll
        for (int e = 0; e < 4; e++) total[tt][e] = 0.0f, acc[tt][e] = 0.0f;
    typename Q::Raw cur[2], nxt[2];
    int slice = 0;
    int64_t slice_end = n_units / QM_WARPS; /* split mode's u1 of warp 0 */
    while (slice < QM_WARPS - 1 && slice_end == 0) slice++, slice_end = n_units * (slice + 1) / QM_WARPS;
    Q::load(rp[0], 0, c, cur[0]), Q::load(rp[1], 0, c, cur[1]);
    stage(0, 0);
    cp_async_wait_all();
    __syncthreads();
    for (int64_t u = 0; u < n_units; u++) {
        const int buf = (int)(u & 1);
        if (u + 1 < n_units) {
            Q::load(rp[0], u + 1, c, nxt[0]), Q::load(rp[1], u + 1, c, nxt[1]);
            stage(u + 1, buf ^ 1);
        }
        const uint8_t *codes = smem + (size_t)buf * (S::CODES + S::SCALES);
        const float4 *scl = reinterpret_cast<const float4 *>(codes + S::CODES);
        if constexpr (Q::INT) {
#pragma unroll
            for (int tt = 0; tt < NTT; tt++) {
                if (tt >= ntiles) continue;
                const bool live = tt * 8 + g < tc;
                auto ld = [&](int j, uint2 &b1, uint2 &b2, float4 &s0, float4 &s1) {
                    const uint8_t *xb = codes + ((size_t)j * QM_TCHUNK + (size_t)(tt * 8 + g)) * 64 + 8 * c;
                    const float4 *sb = scl + (size_t)j * QM_TCHUNK + tt * 8 + 2 * c;
                    b1 = make_uint2(0, 0), b2 = make_uint2(0, 0);
                    if (live) {
                        b1 = *reinterpret_cast<const uint2 *>(xb);
                        b2 = *reinterpret_cast<const uint2 *>(xb + 32);
                    }
                    s0 = sb[0], s1 = sb[1];
                };
                ifold_unit<TYPE, false, false>(cur, c, acc[tt], ld);
            }
        } else {
#pragma unroll
            for (int j = 0; j < Q::UB; j++) {
                uint32_t a[4];
                float sa[2], so[2];
                block_frag<TYPE>(cur, j, c, a, sa, so);
                const uint8_t *xb = codes + ((size_t)j * QM_TCHUNK + (size_t)g) * 64 + 8 * c;
                const float4 *sb = scl + (size_t)j * QM_TCHUNK + 2 * c;
#pragma unroll
                for (int tt = 0; tt < NTT; tt++) {
                    if (tt >= ntiles) continue;
                    const bool live = tt * 8 + g < tc;
                    uint2 b1 = make_uint2(0, 0), b2 = make_uint2(0, 0);
                    if (live) {
                        b1 = *reinterpret_cast<const uint2 *>(xb + tt * 8 * 64);
                        b2 = *reinterpret_cast<const uint2 *>(xb + tt * 8 * 64 + 32);
                    }
                    fold_tile<TYPE, false>(acc[tt], a, sa, so, b1, b2, sb[tt * 8], sb[tt * 8 + 1]);
                }
            }
        }
        if (u + 1 == slice_end) { /* the end of a K slice: total += its sum (total = it, for the first) */
#pragma unroll
            for (int tt = 0; tt < NTT; tt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    total[tt][e] = slice == 0 ? acc[tt][e] : total[tt][e] + acc[tt][e];
                    acc[tt][e] = 0.0f;
                }
            slice++;
            /* empty slices (n_units < 8): split mode adds their 0.0 too */
            while (slice < QM_WARPS && n_units * (slice + 1) / QM_WARPS == u + 1) {
#pragma unroll
                for (int tt = 0; tt < NTT; tt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) total[tt][e] = total[tt][e] + 0.0f;
                slice++;
            }
            slice_end = slice < QM_WARPS ? n_units * (slice + 1) / QM_WARPS : -1;
        }
#pragma unroll
        for (int i = 0; i < 2; i++) cur[i] = nxt[i];
        cp_async_wait_all();
        __syncthreads();
    }
#pragma unroll
    for (int tt = 0; tt < NTT; tt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int64_t n = n0 + g + 8 * (e >> 1);
            const int col = tt * 8 + 2 * c + (e & 1);
            if (tt >= ntiles || n >= N || col >= tc) continue;
            const size_t o = (size_t)(t0 + col) * (size_t)ldy + (size_t)n;
            if (y_f32) static_cast<float *>(y)[o] = total[tt][e];
            else static_cast<uint16_t *>(y)[o] = osp_f_to_bf16(total[tt][e]);
        }
}

/* T above which the wide mode runs (OSPREY_QMMA_WIDE_T; read once). Both modes give the same bits. */
int qmma_wide_t(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("OSPREY_QMMA_WIDE_T");
        v = e ? atoi(e) : 16;
        if (v < 0) v = 0;
    }
    return v;
}

/* OSPREY_QMMA_PERSIST=0 runs steps of T <= 8 on the split kernel instead of the persistent one (the same
 * bits; read once) */
bool qmma_persist(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("OSPREY_QMMA_PERSIST");
        v = e && !strcmp(e, "0") ? 0 : 1;
    }
    return v == 1;
}

/* CTAs of qmma_persist_kernel<TYPE, T1> resident on the current device at once (>= 1) */
template <uint32_t TYPE, bool T1> int persist_grid() {
    static int ctas = 0; /* one per instantiation; the backend drives one device per process */
    if (!ctas) {
        int dev = 0, sms = 0, per_sm = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qmma_persist_kernel<TYPE, T1>, QM_WARPS * 32, 0) !=
                cudaSuccess)
            sms = 132, per_sm = 1;
        ctas = (sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
    }
    return ctas;
}

template <uint32_t TYPE>
osp_status launch_qmma(const void *d_w, size_t row_bytes, int64_t N, int64_t K, const osp_cuda_qx *qx, void *d_y,
                       int64_t ldy, bool y_f32, cudaStream_t st) {
    const int64_t n_units = K / (32 * qm<TYPE>::UB);
    const uint8_t *w = static_cast<const uint8_t *>(d_w);
    const int8_t *xc = static_cast<const int8_t *>(qx->codes);
    const float4 *xs = static_cast<const float4 *>(qx->scales);
    const unsigned chunks = (unsigned)((qx->T + QM_TCHUNK - 1) / QM_TCHUNK);
    if (qx->T > qmma_wide_t()) {
        const size_t sm = wide_smem<TYPE>::BYTES;
        static bool attr = false; /* one per TYPE instantiation */
        if (!attr) {
            if (cudaFuncSetAttribute(qmma_wide_kernel<TYPE, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
                    cudaSuccess ||
                cudaFuncSetAttribute(qmma_wide_kernel<TYPE, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) !=
                    cudaSuccess)
                return osp_set_error(OSP_ERR_INTERNAL, "qmma: cannot allow %zu bytes of shared memory", sm);
            attr = true;
        }
        const dim3 grid((unsigned)((N + QM_ROWS * QM_WARPS - 1) / (QM_ROWS * QM_WARPS)), chunks);
        if (qx->T <= 32)
            osp_launch(qmma_wide_kernel<TYPE, 4>, grid, QM_WARPS * 32, sm, st, w, row_bytes, N, n_units, xc, xs, qx->T,
                       qx->Tp, d_y, ldy, y_f32);
        else
            osp_launch(qmma_wide_kernel<TYPE, 8>, grid, QM_WARPS * 32, sm, st, w, row_bytes, N, n_units, xc, xs, qx->T,
                       qx->Tp, d_y, ldy, y_f32);
        OSP_CUDA_LAUNCH_CHECK("qmma_wide_kernel");
        return OSP_OK;
    }
    if (qx->T <= 8 && qx->Tp == 8 && qmma_persist()) { /* Tp = 8: ifold_unit's offsets */
        const int64_t tiles = (N + QM_ROWS - 1) / QM_ROWS;
        if (qx->T == 1) {
            const int64_t ctas = persist_grid<TYPE, true>();
            osp_launch(qmma_persist_kernel<TYPE, true>, (unsigned)(tiles < ctas ? tiles : ctas), QM_WARPS * 32, 0, st,
                       w, row_bytes, N, n_units, xc, xs, qx->T, qx->Tp, d_y, ldy, y_f32);
        } else {
            const int64_t ctas = persist_grid<TYPE, false>();
            osp_launch(qmma_persist_kernel<TYPE, false>, (unsigned)(tiles < ctas ? tiles : ctas), QM_WARPS * 32, 0, st,
                       w, row_bytes, N, n_units, xc, xs, qx->T, qx->Tp, d_y, ldy, y_f32);
        }
        OSP_CUDA_LAUNCH_CHECK("qmma_persist_kernel");
        return OSP_OK;
    }
    const dim3 grid((unsigned)((N + QM_ROWS - 1) / QM_ROWS), chunks);
#define OSP_QMMA_LAUNCH(NTT, T1)                                                                                     \
    osp_launch(qmma_kernel<TYPE, NTT, T1>, grid, QM_WARPS * 32, 0, st, w, row_bytes, N, n_units, xc, xs, qx->T,     \
               qx->Tp, d_y, ldy, y_f32)
    if (qx->T == 1) OSP_QMMA_LAUNCH(1, true);
    else if (qx->T <= 8) OSP_QMMA_LAUNCH(1, false);
    else if (qx->T <= 16) OSP_QMMA_LAUNCH(2, false);
    else if (qx->T <= 32) OSP_QMMA_LAUNCH(4, false);
    else OSP_QMMA_LAUNCH(8, false);
#undef OSP_QMMA_LAUNCH
    OSP_CUDA_LAUNCH_CHECK("qmma_kernel");
    return OSP_OK;
}

template <uint32_t TYPE>
osp_status launch_dequant(const void *d_w, size_t row_bytes, int64_t rows, int64_t K, uint16_t *d_dst, cudaStream_t st) {
    const int64_t total = rows * (K / 8);
    int64_t blocks = (total + 255) / 256;
    if (blocks > 1048576) blocks = 1048576;
    osp_launch(qdequant_kernel<TYPE>, (unsigned)blocks, 256, 0, st, static_cast<const uint8_t *>(d_w), row_bytes, rows,
               K, d_dst);
    OSP_CUDA_LAUNCH_CHECK("qdequant_kernel");
    return OSP_OK;
}

template <uint32_t TYPE>
osp_status launch_embed(const void *d_table, size_t row_bytes, const int32_t *d_ids, float *d_x, int64_t T, int64_t E,
                        float scale, cudaStream_t st) {
    const int64_t pieces = E / 8;
    const dim3 grid((unsigned)((pieces + 127) / 128), (unsigned)(T < 65535 ? T : 65535));
    osp_launch(qembed_kernel<TYPE>, grid, 128, 0, st, static_cast<const uint8_t *>(d_table), row_bytes, d_ids, d_x, T,
               E, scale);
    OSP_CUDA_LAUNCH_CHECK("qembed_kernel");
    return OSP_OK;
}

int64_t block_vals(uint32_t type) {
    switch (type) {
    case OSP_DTYPE_Q8_0: return qt<OSP_DTYPE_Q8_0>::BLOCK_VALS;
    case OSP_DTYPE_Q4_0: return qt<OSP_DTYPE_Q4_0>::BLOCK_VALS;
    case OSP_DTYPE_Q4_1: return qt<OSP_DTYPE_Q4_1>::BLOCK_VALS;
    case OSP_DTYPE_Q4_K: return qt<OSP_DTYPE_Q4_K>::BLOCK_VALS;
    case OSP_DTYPE_Q6_K: return qt<OSP_DTYPE_Q6_K>::BLOCK_VALS;
    default: return 0;
    }
}

int64_t block_bytes(uint32_t type) {
    switch (type) {
    case OSP_DTYPE_Q8_0: return qt<OSP_DTYPE_Q8_0>::BLOCK_BYTES;
    case OSP_DTYPE_Q4_0: return qt<OSP_DTYPE_Q4_0>::BLOCK_BYTES;
    case OSP_DTYPE_Q4_1: return qt<OSP_DTYPE_Q4_1>::BLOCK_BYTES;
    case OSP_DTYPE_Q4_K: return qt<OSP_DTYPE_Q4_K>::BLOCK_BYTES;
    case OSP_DTYPE_Q6_K: return qt<OSP_DTYPE_Q6_K>::BLOCK_BYTES;
    default: return 0;
    }
}

/* Shape checks shared by the launchers: K whole blocks, rows exactly K's blocks apart, row starts
 * aligned as the widest load of the type needs (16 bytes for Q4_K, 4 for Q4_1, 2 otherwise). */
osp_status check(const char *fn, uint32_t type, const void *d_w, size_t row_bytes, int64_t K) {
    const int64_t bv = block_vals(type);
    if (!bv) return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: no kernel for weight type %u", fn, type);
    if (K <= 0 || K % bv != 0 || row_bytes != (size_t)(K / bv * block_bytes(type)))
        return osp_set_error(OSP_ERR_INVALID_ARG, "%s: %lld columns, %zu bytes a row: not whole blocks of the type", fn,
                             (long long)K, row_bytes);
    const size_t align = type == OSP_DTYPE_Q4_K ? 16 : type == OSP_DTYPE_Q4_1 ? 4 : 2;
    if ((uintptr_t)d_w % align != 0 || row_bytes % align != 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "%s: weight rows not %zu-byte aligned", fn, align);
    return OSP_OK;
}

} // namespace

extern "C" bool osp_cuda_qtype_supported(uint32_t type) { return block_vals(type) != 0; }

extern "C" size_t osp_cuda_qx_workspace_bytes(int64_t T, int64_t K) {
    if (T <= 0 || K <= 0) return 0;
    const int64_t Tp = (T + 7) / 8 * 8;
    return (size_t)Tp * (size_t)(K / 32) * (size_t)QX_BLOCK_BYTES;
}

extern "C" osp_status osp_cuda_qx_layout(void *d_ws, size_t ws_bytes, int64_t T, int64_t K, int32_t group,
                                         osp_cuda_qx *qx) {
    if (!d_ws || !qx || T <= 0 || K <= 0 || (group != 32 && group != 256) || K % group != 0 ||
        (uintptr_t)d_ws % 16 != 0 || ws_bytes < osp_cuda_qx_workspace_bytes(T, K))
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "osp_cuda_qx: bad arguments (T %lld, K %lld, group %d, %zu workspace bytes)", (long long)T,
                             (long long)K, (int)group, ws_bytes);
    const int64_t Tp = (T + 7) / 8 * 8, items = K / 32 * Tp;
    int8_t *codes = static_cast<int8_t *>(d_ws);
    *qx = (osp_cuda_qx){.codes = codes, .scales = codes + (size_t)items * 64, .T = T, .Tp = Tp, .K = K, .group = group};
    return OSP_OK;
}

extern "C" osp_status osp_cuda_qx_quantize(const uint16_t *d_x, int64_t T, int64_t K, int32_t group, void *d_ws,
                                           size_t ws_bytes, osp_cuda_qx *qx, void *stream) {
    if (!d_x || (group == 256 && (uintptr_t)d_x % 16 != 0))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_qx_quantize: no activations, or not 16-byte aligned");
    osp_cuda_qx q;
    OSP_TRY(osp_cuda_qx_layout(d_ws, ws_bytes, T, K, group, &q));
    const int64_t items = K / group * q.Tp; /* a warp each */
    if (group == 256)
        osp_launch(qx256_kernel, (unsigned)((items + 7) / 8), 256, 0, (cudaStream_t)stream, d_x, T, q.Tp, K,
                   (int8_t *)q.codes, (float4 *)q.scales);
    else
        osp_launch(qx_kernel, (unsigned)((items + 7) / 8), 256, 0, (cudaStream_t)stream, d_x, T, q.Tp, K,
                   (int8_t *)q.codes, (float4 *)q.scales);
    OSP_CUDA_LAUNCH_CHECK("qx_kernel");
    *qx = q;
    return OSP_OK;
}

extern "C" int32_t osp_cuda_qmatmul_group(uint32_t type) {
    switch (type) {
    case OSP_DTYPE_Q8_0:
    case OSP_DTYPE_Q4_0:
    case OSP_DTYPE_Q4_1: return 32;
    case OSP_DTYPE_Q4_K:
    case OSP_DTYPE_Q6_K: return 256;
    default: return 0;
    }
}

extern "C" bool osp_cuda_qmatmul_supported(uint32_t type, int64_t K) {
    switch (type) {
    case OSP_DTYPE_Q8_0:
    case OSP_DTYPE_Q4_0:
    case OSP_DTYPE_Q4_1: return K > 0 && K % 64 == 0;
    case OSP_DTYPE_Q4_K:
    case OSP_DTYPE_Q6_K: return K > 0 && K % 256 == 0;
    default: return false;
    }
}

extern "C" osp_status osp_cuda_qmatmul(uint32_t type, const void *d_w, size_t row_bytes, int64_t N, const osp_cuda_qx *qx,
                                       void *d_y, int64_t ldy, bool y_f32, void *stream) {
    if (!qx) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_qmatmul: no quantized activations");
    const int64_t K = qx->K;
    OSP_TRY(check("osp_cuda_qmatmul", type, d_w, row_bytes, K));
    if (!osp_cuda_qmatmul_supported(type, K))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "osp_cuda_qmatmul: %lld columns of type %u: not whole units of the kernel",
                             (long long)K, type);
    if (!d_y || N <= 0 || ldy < N || qx->T <= 0 || qx->Tp < qx->T || qx->Tp % 8 != 0 || !qx->codes || !qx->scales)
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_qmatmul: bad arguments (N %lld, T %lld, ldy %lld)",
                             (long long)N, (long long)qx->T, (long long)ldy);
    if (qx->group != osp_cuda_qmatmul_group(type))
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_qmatmul: activations quantized in groups of %d, type %u reads %d",
                             (int)qx->group, type, (int)osp_cuda_qmatmul_group(type));
    cudaStream_t st = (cudaStream_t)stream;
    switch (type) {
    case OSP_DTYPE_Q8_0: return launch_qmma<OSP_DTYPE_Q8_0>(d_w, row_bytes, N, K, qx, d_y, ldy, y_f32, st);
    case OSP_DTYPE_Q4_0: return launch_qmma<OSP_DTYPE_Q4_0>(d_w, row_bytes, N, K, qx, d_y, ldy, y_f32, st);
    case OSP_DTYPE_Q4_1: return launch_qmma<OSP_DTYPE_Q4_1>(d_w, row_bytes, N, K, qx, d_y, ldy, y_f32, st);
    case OSP_DTYPE_Q4_K: return launch_qmma<OSP_DTYPE_Q4_K>(d_w, row_bytes, N, K, qx, d_y, ldy, y_f32, st);
    default: return launch_qmma<OSP_DTYPE_Q6_K>(d_w, row_bytes, N, K, qx, d_y, ldy, y_f32, st);
    }
}

extern "C" osp_status osp_cuda_qdequant_bf16(uint32_t type, const void *d_w, size_t row_bytes, int64_t rows, int64_t K,
                                             uint16_t *d_dst, void *stream) {
    OSP_TRY(check("osp_cuda_qdequant_bf16", type, d_w, row_bytes, K));
    if (!d_dst || rows < 0 || (uintptr_t)d_dst % 16 != 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_qdequant_bf16: bad arguments");
    if (rows == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    switch (type) {
    case OSP_DTYPE_Q8_0: return launch_dequant<OSP_DTYPE_Q8_0>(d_w, row_bytes, rows, K, d_dst, st);
    case OSP_DTYPE_Q4_0: return launch_dequant<OSP_DTYPE_Q4_0>(d_w, row_bytes, rows, K, d_dst, st);
    case OSP_DTYPE_Q4_1: return launch_dequant<OSP_DTYPE_Q4_1>(d_w, row_bytes, rows, K, d_dst, st);
    case OSP_DTYPE_Q4_K: return launch_dequant<OSP_DTYPE_Q4_K>(d_w, row_bytes, rows, K, d_dst, st);
    default: return launch_dequant<OSP_DTYPE_Q6_K>(d_w, row_bytes, rows, K, d_dst, st);
    }
}

extern "C" osp_status osp_cuda_qembed(uint32_t type, const void *d_table, size_t row_bytes, const int32_t *d_ids,
                                      float *d_x, int64_t T, int64_t E, float scale, void *stream) {
    OSP_TRY(check("osp_cuda_qembed", type, d_table, row_bytes, E));
    if (!d_ids || !d_x || T < 0) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_qembed: bad arguments");
    if (T == 0) return OSP_OK;
    cudaStream_t st = (cudaStream_t)stream;
    switch (type) {
    case OSP_DTYPE_Q8_0: return launch_embed<OSP_DTYPE_Q8_0>(d_table, row_bytes, d_ids, d_x, T, E, scale, st);
    case OSP_DTYPE_Q4_0: return launch_embed<OSP_DTYPE_Q4_0>(d_table, row_bytes, d_ids, d_x, T, E, scale, st);
    case OSP_DTYPE_Q4_1: return launch_embed<OSP_DTYPE_Q4_1>(d_table, row_bytes, d_ids, d_x, T, E, scale, st);
    case OSP_DTYPE_Q4_K: return launch_embed<OSP_DTYPE_Q4_K>(d_table, row_bytes, d_ids, d_x, T, E, scale, st);
    default: return launch_embed<OSP_DTYPE_Q6_K>(d_table, row_bytes, d_ids, d_x, T, E, scale, st);
    }
}
