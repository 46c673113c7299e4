/* CPU reference ops: plain loops over fp32 activations, the ground truth that every fast kernel
 * (SIMD, CUDA) is checked against. Each op is deterministic and batch-invariant: a row's result
 * depends only on that row's inputs, never on how many rows are processed together, because every
 * row goes through the same code path with the same summation order.
 *
 * Shapes follow ggml's convention: a weight of ne = [in, out] stores `out` rows of `in` values. */
#ifndef OSP_BACKEND_CPU_OPS_H
#define OSP_BACKEND_CPU_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A weight matrix viewed in place: `rows` rows of `cols` values of ggml type `type`, each row
 * `row_bytes` bytes apart, starting at `data` (usually inside the GGUF mapping). */
typedef struct osp_weight {
    const void *data;
    uint32_t type;
    int64_t cols; /* ne[0], the reduction dimension */
    int64_t rows; /* ne[1] */
    size_t row_bytes;
    bool round_bf16; /* osp_cpu_matmul_rows rounds each dequantized row to bf16 first (the CUDA
                      * backend's weights; for the bf16-emulating reference of its tests) */
} osp_weight;

/* dot(a, b) over n floats with a fixed summation order (16 interleaved partial sums, then a fixed
 * tree), so the compiler may vectorize it and results never depend on the caller. */
float osp_cpu_dot(const float *a, const float *b, int64_t n);

#if defined(__AVX512F__) && defined(__AVX512DQ__)
#include <immintrin.h>
/* osp_cpu_dot's arithmetic for n % 16 == 0, lane for lane: one 16-lane accumulator of rounded
 * products added in order, folded 8, 4, 2, 1 (acc[j] += acc[j + w]). osp_cpu_dot itself uses this for
 * such n, so every caller gets the same bits whether it inlines or calls. */
static inline float osp_cpu_dot16_avx512(const float *a, const float *b, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16)
        acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    const __m256 t8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    const __m128 t4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
    const __m128 t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)));
}
#endif

/* osp_cpu_dot for the attention loops: inlined where n % 16 == 0 on AVX512, the same bits. */
static inline float osp_cpu_dot_inline(const float *a, const float *b, int64_t n) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    if (n % 16 == 0) return osp_cpu_dot16_avx512(a, b, n);
#endif
    return osp_cpu_dot(a, b, n);
}

/* y[t * ldy + r] = sum_c W[r, c] * x[t, c] for t < n_tokens and weight rows r in [r0, r1),
 * single-threaded (the caller splits rows over a thread pool). x: [n_tokens, W.cols] fp32; y must not
 * alias x. row: [W.cols] floats of workspace (each row is dequantized into it, rounded to bf16 first
 * when W.round_bf16). Each output is one osp_cpu_dot, so results do not depend on the split. W's type
 * must satisfy osp_dtype_can_dequant (checked at load). */
void osp_cpu_matmul_rows(const osp_weight *w, const float *x, float *y, int64_t ldy, int64_t n_tokens, int64_t r0,
                         int64_t r1, float *row);

/* out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, for each of n_tokens rows of n floats.
 * Sum of squares accumulated in double (as ggml). out may alias x. */
void osp_cpu_rmsnorm(const float *x, const float *weight, float *out, int64_t n_tokens, int64_t n,
                     float eps);

/* In-place rotary embedding, interleaved pairs (x[2i], x[2i+1]) as ggml's GGML_ROPE_TYPE_NORMAL
 * (GGUF llama checkpoints have Q/K rows permuted for it). x: [n_tokens, n_heads, head_dim];
 * the first n_rot dims of each head rotate by positions[t] * inv_freq[i], inv_freq: [n_rot / 2].
 * RoFormer (Su et al. 2021), eq. 34. */
void osp_cpu_rope_interleaved(float *x, const int32_t *positions, int64_t n_tokens, int64_t n_heads,
                              int64_t head_dim, int64_t n_rot, const float *inv_freq);

/* As osp_cpu_rope_interleaved, with NeoX-style pairs (x[i], x[i + n_rot/2]) as ggml's
 * GGML_ROPE_TYPE_NEOX and HF's rotate_half (qwen2 / qwen3 GGUFs keep HF's unpermuted Q/K rows). */
void osp_cpu_rope_neox(float *x, const int32_t *positions, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                       int64_t n_rot, const float *inv_freq);

/* x <- H x for each of the n_rows rows of n floats (n a power of two, 1..4096), H the orthonormal
 * Walsh-Hadamard matrix of order n in Sylvester's (natural) order, scaled by 1/sqrt(n): the butterfly
 * of the fast Walsh-Hadamard transform, log2(n) passes of (a + b, a - b), then one scale. H is
 * symmetric and its own inverse. The rotation of quantized K pages (kv_layout.h's k_hadamard). */
void osp_cpu_hadamard(float *x, int64_t n_rows, int64_t n);

/* x[i] = bf16(x[i]) for i < n (round to nearest even, as core/dtype.c's osp_fp32_to_bf16). */
void osp_cpu_round_bf16(float *x, int64_t n);

/* out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)). n floats. out may alias gate. */
void osp_cpu_silu_mul(const float *gate, const float *up, float *out, int64_t n);
/* osp_cpu_silu_mul for `--cpu-activations q8` (vexp.h): out[i] = (g / (1 + e)) * up[i] with
 * e = osp_vexp_scalar(-g), g = gate[i], each operation rounded in that order -- the same bits from the
 * AVX512 kernel (16 at a time, the tail masked) and the scalar loop. n floats; out may alias gate. */
void osp_cpu_silu_mul_q8(const float *gate, const float *up, float *out, int64_t n);
/* y[i] = osp_vexp_scalar(x[i]) for i < n (vexp.h; AVX512 16 at a time, the same bits). y may alias x. */
void osp_cpu_vexp_row(const float *x, float *y, int64_t n);
/* out[i] = gelu(gate[i]) * up[i] with GELU's tanh approximation (Hendrycks & Gimpel 2016, §2;
 * PyTorch gelu(approximate="tanh")): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
void osp_cpu_gelu_mul(const float *gate, const float *up, float *out, int64_t n);

/* Causal attention of each query token over its sequence's paged K/V (GQA: query head h reads
 * kv head h / (n_head / n_head_kv)).
 * q:   [num_tokens, n_head, head_dim]      out: [num_tokens, n_head, head_dim]
 * k,v: pages [num_blocks, block_size, n_head_kv, head_dim] of kv_type: OSP_DTYPE_F32, or OSP_DTYPE_F16
 *      (each row widened to fp32 as it is read; head_dim <= 1024); the caller checks the type
 * Token t of sequence s (query_start_loc[s] <= t < query_start_loc[s+1]) attends to the positions
 * lo..positions[t] of s, found through block_table[s * max_blocks + p / block_size]; lo = 0, or
 * positions[t] - window + 1 when window > 0 (a sliding-window layer).
 * Only the work items [item_begin, item_end) of the num_tokens * n_head (token, head) pairs are
 * computed (item = t * n_head + h), single-threaded: the caller splits items over a thread pool.
 * scores: this thread's workspace of max_seq_len floats. softmax(q k^T * scale) v in fp32. */
void osp_cpu_paged_attention(const float *q, const void *k, const void *v, uint32_t kv_type, float *out,
                             int32_t num_seqs, const int32_t *query_start_loc,
                             const int32_t *positions, const int32_t *block_table,
                             int32_t max_blocks, int32_t block_size, int64_t n_head,
                             int64_t n_head_kv, int64_t head_dim, float scale, int32_t window, float *scores,
                             int64_t item_begin, int64_t item_end);

/* One layer's KV pages as attention and the KV write see them (layouts: src/kv/kv_cache.h).
 * k_type, v_type: the K and V pages' types, each OSP_DTYPE_F32, OSP_DTYPE_F16, OSP_KV_DTYPE_FP8 or
 * OSP_KV_DTYPE_NVFP4 (the page formats' elem_type; they differ in a split cache, e.g. K fp8 + V nvfp4).
 * k, v: pages [num_blocks, block_size, n_head_kv, head_dim] of their type (nvfp4: head_dim / 2 bytes a
 * row). k_scale, v_scale: nvfp4's E4M3 micro-block scales [num_blocks, block_size, n_head_kv,
 * head_dim / 16] of an nvfp4 side, else NULL. k_fixed, v_fixed: this layer's fixed fp32 scales of a
 * quantized side (fp8: [n_head_kv]; nvfp4: [1], the tensor scale), else NULL. All borrowed.
 * OSP_KV_DTYPE_INT8_HIER sides: k, v hold the upper codes with each row's scale and minimum, k_scale,
 * v_scale the lower codes (src/kv/kv_cache.h). */
typedef struct osp_cpu_kv_pages {
    uint32_t k_type, v_type;
    const void *k, *v;
    const uint8_t *k_scale, *v_scale;
    const float *k_fixed, *v_fixed;
    bool hier_upper_only;     /* int8_hier sides: upper halves only (a QuantSpec draft's view), except */
    int32_t hier_full_recent; /* each item's last hier_full_recent keys, read in full (kv_layout.h) */
    bool q8_arith; /* attention with `--cpu-activations q8`'s arithmetic (kv_quant.c, ATTENTION IN Q8
                    * MODE): vexp.h's exp and fused multiply-adds; false: the default path's bits */
} osp_cpu_kv_pages;

/* osp_cpu_paged_attention over pages of any type in `kv` (same shapes, items and workspace): fp8 and
 * nvfp4 rows are decoded to fp32 in a stack buffer as they are read (kv_quant.c), the same values
 * core/dtype.c's dequantizers give, then the same fp32 arithmetic as for f32 pages. head_dim <= 1024;
 * nvfp4 needs head_dim % 16 == 0 (the caller checks). */
void osp_cpu_paged_attention_kv(const float *q, const osp_cpu_kv_pages *kv, float *out, int32_t num_seqs,
                                const int32_t *query_start_loc, const int32_t *positions, const int32_t *block_table,
                                int32_t max_blocks, int32_t block_size, int64_t n_head, int64_t n_head_kv,
                                int64_t head_dim, float scale, int32_t window, float *scores, int64_t item_begin,
                                int64_t item_end);

/* osp_cpu_paged_attention_kv in tiles of up to max_tile items (<= OSP_CPU_ATTN_MAX_TILE): a KV head's
 * group at a block of consecutive tokens of one sequence (a query block against the keys), or at one
 * token, shares each K and V row read, so f16/fp8/nvfp4 rows are widened once per tile. Results are
 * bit-identical to osp_cpu_paged_attention_kv's for any max_tile and item range (each item's arithmetic
 * is unchanged). scores: max_tile rows of sc_stride floats (sc_stride >= the largest position + 1 of
 * the items). */
#define OSP_CPU_ATTN_MAX_TILE 32
void osp_cpu_paged_attention_tiled(const float *q, const osp_cpu_kv_pages *kv, float *out, int32_t num_seqs,
                                   const int32_t *query_start_loc, const int32_t *positions,
                                   const int32_t *block_table, int32_t max_blocks, int32_t block_size, int64_t n_head,
                                   int64_t n_head_kv, int64_t head_dim, float scale, int32_t window, float *scores,
                                   int64_t sc_stride, int max_tile, int64_t item_begin, int64_t item_end);

/* Row (slot, kvh) of K (which = 0) or V (which = 1) of pages of any type in kv, as fp32: a pointer into
 * f32 pages, or `row` [head_dim] filled (half: [head_dim] workspace), the same values attention reads
 * (for the block-sparse reference, src/sparse/). head_dim <= 1024. An int8_hier side is read in full, or by
 * its upper halves alone under hier_upper_only (no recent window: the caller knows no query here). */
const float *osp_cpu_kv_read_row(const osp_cpu_kv_pages *kv, int which, int64_t slot, int64_t kvh, int64_t n_head_kv,
                                 int64_t head_dim, float *row, uint16_t *half);

/* Quantizes one token's K and V rows k, v: [n_head_kv * head_dim] fp32 into slot `slot` of fp8 or nvfp4
 * pages (kv->k_type for K, kv->v_type for V, each fp8 or nvfp4; kv->k_fixed / v_fixed the layer's fixed
 * scales; the pointers in kv other than those are ignored): fp8 writes head_dim bytes per head at the slot, nvfp4 head_dim / 2 bytes per head and
 * head_dim / 16 scales per head into k_scales / v_scales at the slot. Nothing else is touched (no
 * other slot, no shared scale). slot < 0 writes nothing (a padding row). */
void osp_cpu_kv_write_quant(const osp_cpu_kv_pages *kv, void *k_pages, void *v_pages, uint8_t *k_scales,
                            uint8_t *v_scales, const float *k, const float *v, int32_t slot, int64_t n_head_kv,
                            int64_t head_dim);

/* Writes one token's K (or V) row x: [n_head_kv * head_dim] fp32 into slot `slot` of pages of `type`
 * (OSP_DTYPE_F32, OSP_DTYPE_F16 rounded to nearest even, OSP_KV_DTYPE_FP8 or OSP_KV_DTYPE_NVFP4 as
 * osp_cpu_kv_write_quant; fixed: the layer's fixed scales of that side, NULL for f32 / f16; scales: the
 * nvfp4 micro-block scale pool of that side, else unused). Only that slot's bytes and scales are
 * touched; slot < 0 writes nothing (a padding row). K and V of a split cache are written by one call
 * each, in their own formats. */
void osp_cpu_kv_write_row(uint32_t type, const float *fixed, void *pages, uint8_t *scales, const float *x, int32_t slot,
                          int64_t n_head_kv, int64_t head_dim);

/* f16 pages (kv_f16.c). Writes K/V rows k, v: [num_tokens, kv_row] fp32 into f16 pages at
 * slot_mapping (round to nearest even); a negative slot writes nothing. */
void osp_cpu_kv_write_f16(const float *k, const float *v, void *k_pages, void *v_pages, const int32_t *slot_mapping,
                          int64_t num_tokens, int64_t kv_row);
/* Rounds n fp32 values to f16, nearest even (F16C when the build has it; both paths bit-identical). */
void osp_cpu_f32_to_f16_row(const float *x, uint16_t *y, int64_t n);
/* Widens n f16 values to fp32 (exact; F16C when the build has it). */
void osp_cpu_f16_to_f32_row(const uint16_t *x, float *y, int64_t n);

#endif
