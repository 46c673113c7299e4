/* Quantized-activation dot products for the fast CPU path.
 *
 * Activations are quantized per row in blocks of 32 to int8 with one fp32 scale (the idea of ggml's
 * Q8_0/Q8_1 activation blocks; here the scale stays fp32 for accuracy). A weight row of a block type
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants Q2_K..Q6_K, whose super-blocks of 256 meet eight
 * activation blocks) is then multiplied in integers, 32 products per block, and scaled once per
 * block — about a third of the work of dequantizing to fp32 first. Each row is quantized on its own,
 * so results stay batch-invariant.
 *
 * Kernels are chosen at run time: AVX512-VNNI (256-bit, vpdpbusd), AVX2+FMA (vpmaddubsw), or the
 * portable C version. The portable version is the reference the SIMD ones are tested against; their
 * results differ only by float summation order. */
#ifndef OSP_BACKEND_CPU_QDOT_H
#define OSP_BACKEND_CPU_QDOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define OSP_Q8_BLOCK 32

/* 32 activations in two int8 levels: x_i ~ d * qs[i] + d2 * qs2[i], where qs2 quantizes the rounding
 * residual of the first level (|residual| <= d / 2) with d2 = d / 256 (exact, so the kernels combine
 * the levels in int32 as 256 dot(w, qs) + dot(w, qs2) and scale once by d2; a residual of exactly
 * d / 2 saturates at 127, an error of one d2 in that rare case). One level alone has a relative
 * error of ~2e-3 per value, which over 30 layers moved the argmax at ~3% of positions; two levels
 * bring it to ~1e-5. s = sum of the represented values (for the
 * offset and min terms of Q4/Q5 and the K-quants), s0 = the sum of the first 16 of them (the K-quants
 * with 16-value sub-blocks need both halves: s0 and s - s0). 80 bytes. */
typedef struct osp_q8_block {
    float d, d2, s, s0;
    int8_t qs[OSP_Q8_BLOCK];
    int8_t qs2[OSP_Q8_BLOCK];
} osp_q8_block;

/* y[n / 32] <- x[n], n a multiple of 32. d = max|x| / 127, q = round-to-nearest-even(x / d),
 * d2 = d / 256, q2 = round-to-nearest-even((x - d q) / d2) saturated to [-127, 127]. */
void osp_quantize_row_q8(const float *x, osp_q8_block *y, int64_t n);

/* dot(weight row of `nblocks` blocks, activation blocks). */
typedef float (*osp_qdot_fn)(const void *w, const osp_q8_block *a, int64_t nblocks);

/* The fastest kernel for weight type `type` on this CPU, or NULL when the type has no quantized
 * path (F32, F16, BF16: those use the fp32 path). */
osp_qdot_fn osp_qdot_for(uint32_t type);
/* Eight tokens' activation blocks packed for the AVX512-VNNI pair tiles: block b of tokens 2k and
 * 2k + 1 (k < 4) is pk[b].pair[k], laid out as the 512-bit registers the tile multiplies (low 256 bits
 * token 2k, high 256 bits token 2k + 1), so a tile loads each operand once and every weight row of
 * the matmul reuses the pack. bias holds, per vpdpbusd lane (4 codes), -128 (256 L1 + L2) with L1,
 * L2 the lane's sums of qs and qs2: Q8_0's tile multiplies the unsigned codes w + 128 and adds it,
 * which gives exactly the int32 of the signed product (256 dot(w, qs) + dot(w, qs2)). 256 bytes. */
typedef struct osp_q8_pair {
    _Alignas(64) int8_t qs[64];
    int8_t qs2[64];
    float d2[16];
    int32_t bias[16];
} osp_q8_pair;
/* Block b of the 8 tokens: the 4 pairs, and the tokens' s and s0 in token order (the offset terms,
 * 8 tokens in one vector). 1088 bytes. */
typedef struct osp_q8_pack {
    osp_q8_pair pair[4];
    float s[8], s0[8];
} osp_q8_pack;
_Static_assert(sizeof(osp_q8_pair) == 256 && sizeof(osp_q8_pack) == 1088, "the pack layouts' sizes");
#define OSP_Q8_PACK_TOKENS 8
/* pk[nb] <- the blocks 0..nb-1 of activation rows a + j * a_stride, j < 8. pk 64-byte aligned. */
void osp_pack_q8(const osp_q8_block *a, int64_t a_stride, int64_t nb, osp_q8_pack *pk);

/* One token's blocks as pairs for the GEMV kernels: bp[i] holds blocks 2i (low 256 bits) and 2i + 1
 * (high; zeros past the end when nb is odd) in osp_q8_pair's fields, i < (nb + 1) / 2, followed by the
 * nb blocks' sums s as floats (the offset terms, two at a time). bp: 64-aligned, at least
 * (nb + 1) / 2 * 256 + nb * 4 bytes. */
void osp_pack_q8_row(const osp_q8_block *a, int64_t nb, osp_q8_pair *bp);
/* y[r] = dot(w + r * row_bytes, a, nb) for r < nrows weight rows and one token, on the token's
 * osp_pack_q8_row pairs bp (and its blocks a, for the offset terms): each bit-identical to
 * osp_qdot_for(type), at about half its instructions, four rows at a time. */
typedef void (*osp_qdot_gemv_fn)(const void *w, size_t row_bytes, const osp_q8_block *a, const osp_q8_pair *bp,
                                 int64_t nb, float *y, int64_t nrows);
/* The GEMV kernel for `type` on this CPU (AVX512-VNNI: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K), or NULL: use osp_qdot_for. */
osp_qdot_gemv_fn osp_qdot_gemv_for(uint32_t type);

/* A GEMM tile: one weight row (`nb` blocks at w) against n tokens' activation rows (a + j * a_stride
 * blocks, j < n): y[j * y_stride] = dot(w, a + j * a_stride, nb). Each weight block is unpacked once
 * for all n tokens. Every y is bit-identical to osp_qdot_for(type)(w, a + j * a_stride, nb) -- the
 * one-token kernel is the same code at n = 1 -- so a token's result never depends on how many tokens
 * share its tile (batch invariance). A tile that reads packs (osp_qdot_tile_for's *packed) also takes
 * those rows' osp_pack_q8 in pk (pk + g nb for tokens 8g .. 8g + 7); the others ignore pk. */
typedef void (*osp_qdot_tile_fn)(const void *w, const osp_q8_block *a, int64_t nb, int64_t a_stride,
                                 const osp_q8_pack *pk, float *y, int64_t y_stride);
/* The widest tile kernel for `type`, of at most max_n tokens, in the family osp_qdot_for picks, with
 * its width in *n and in *packed whether it reads packs (osp_pack_q8 of each 8 of its tokens, the g-th
 * at pk + g nb), or NULL with *n = 1 where there is none (max_n too small; the portable kernels;
 * F32/F16/BF16). AVX512-VNNI: 16 tokens (8 pairs in 512-bit vectors) for Q4_0, Q4_1, Q5_0, Q5_1 and
 * Q8_0, 8 (4 pairs) for those and Q4_K, Q5_K, Q6_K, 4 (256-bit) for every type; AVX2: 4. */
osp_qdot_tile_fn osp_qdot_tile_for(uint32_t type, int64_t max_n, int *n, bool *packed);
/* The tokens left at the end of a matmul (n_left < 8, where osp_qdot_tile_for's widest tile no longer
 * fits) in one weight pass instead of a GEMV pass each: a packed tile of *n >= n_left tokens (4, 6 or
 * 8: token pairs in 512-bit vectors, the 8-token tiles' operations on fewer pairs), run on one pack
 * (osp_pack_q8) of the n_left tokens' rows followed by any 8 - n_left rows in bounds (their values do
 * not matter: every token's lanes are its own). It writes *n results (y must have room for them, ys
 * apart); the first n_left are the tokens' results, bit-identical to the one-token kernel's.
 * NULL with *n = 1 where none pays (n_left < OSP_QDOT_PAD_MIN or > 8; Q8_0 below 4, whose GEMV runs
 * 3 tokens faster than a 4-token tile; the CPU without AVX512-VNNI; types without pair tiles: Q2_K,
 * Q3_K, floats). Measured, whole SmolLM2 / Qwen2.5-Coder-1.5B steps of 3-7 tokens on 2 Emerald Rapids
 * cores: Q4_1 1.2-1.5x, Q4_K_M 1.5-1.8x, Q8_0 (4-7) 1.2-1.4x faster than the GEMV / 4-token passes. */
#define OSP_QDOT_PAD_MIN 3
osp_qdot_tile_fn osp_qdot_tile_padded_for(uint32_t type, int64_t n_left, int *n);
/* The portable reference kernel for `type` (NULL as above). */
osp_qdot_fn osp_qdot_ref_for(uint32_t type);
/* "avx512vnni", "avx2" or "scalar": the kernel family osp_qdot_for picks. */
const char *osp_qdot_isa(void);
/* The same family without a string (the *_for pickers ask once a matmul chunk: no strcmp there). */
typedef enum { OSP_QDOT_ISA_SCALAR, OSP_QDOT_ISA_AVX2, OSP_QDOT_ISA_VNNI } osp_qdot_isa_kind;
osp_qdot_isa_kind osp_qdot_isa_family(void);
/* Caps the kernel family ("avx512vnni", "avx2", "scalar") for tests and benchmarks; returns false
 * (and changes nothing) if the CPU lacks it or the name is unknown. Not thread-safe: call at start. */
bool osp_qdot_force_isa(const char *name);

#endif
