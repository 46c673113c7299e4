/* CPU reference ops (see ops.h). Written for clarity and determinism first; the caller (the CPU
 * backend, backend_cpu.c) splits the independent rows (matmul output rows, attention heads) over its
 * thread pool without changing any row's arithmetic. */
#include "backend/cpu/ops.h"

#include <math.h>
#include <string.h>

#include "backend/cpu/vexp.h"
#include "core/dtype.h"

float osp_cpu_dot(const float *restrict a, const float *restrict b, int64_t n) {
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    if (n % 16 == 0) return osp_cpu_dot16_avx512(a, b, n); /* the loop below, lane for lane */
#endif
    float acc[16] = {0};
    int64_t i = 0;
    /* the product and the add are separate statements: no compiler contracts them into an FMA
     * (clang's default -ffp-contract=on fuses within one expression), so every build rounds alike */
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            const float p = a[i + j] * b[i + j];
            acc[j] += p;
        }
    for (int j = 0; i < n; i++, j++) {
        const float p = a[i] * b[i];
        acc[j] += p;
    }
    for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    return acc[0];
}

void osp_cpu_matmul_rows(const osp_weight *w, const float *x, float *y, int64_t ldy, int64_t n_tokens, int64_t r0,
                         int64_t r1, float *row) {
    const int64_t cols = w->cols;
    const uint8_t *base = w->data;
    for (int64_t r = r0; r < r1; r++) {
        const float *wr;
        if (w->type == OSP_DTYPE_F32 && !w->round_bf16) {
            wr = (const float *)(const void *)(base + (size_t)r * w->row_bytes);
        } else {
            osp_dequant_row(w->type, base + (size_t)r * w->row_bytes, row, cols);
            if (w->round_bf16) osp_cpu_round_bf16(row, cols);
            wr = row;
        }
        for (int64_t t = 0; t < n_tokens; t++) y[t * ldy + r] = osp_cpu_dot(wr, x + t * cols, cols);
    }
}

void osp_cpu_round_bf16(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = osp_bf16_to_fp32(osp_fp32_to_bf16(x[i]));
}

void osp_cpu_rmsnorm(const float *x, const float *weight, float *out, int64_t n_tokens, int64_t n,
                     float eps) {
    for (int64_t t = 0; t < n_tokens; t++) {
        const float *xr = x + t * n;
        float *o = out + t * n;
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float scale = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
        for (int64_t i = 0; i < n; i++) o[i] = xr[i] * scale * weight[i];
    }
}

void osp_cpu_rope_interleaved(float *x, const int32_t *positions, int64_t n_tokens, int64_t n_heads,
                              int64_t head_dim, int64_t n_rot, const float *inv_freq) {
    for (int64_t t = 0; t < n_tokens; t++) {
        const float pos = (float)positions[t];
        for (int64_t i = 0; i < n_rot / 2; i++) {
            const float theta = pos * inv_freq[i];
            const float c = cosf(theta), s = sinf(theta);
            for (int64_t h = 0; h < n_heads; h++) {
                float *p = x + (t * n_heads + h) * head_dim + 2 * i;
                const float x0 = p[0], x1 = p[1];
                p[0] = x0 * c - x1 * s;
                p[1] = x0 * s + x1 * c;
            }
        }
    }
}

void osp_cpu_hadamard(float *x, int64_t n_rows, int64_t n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (int64_t r = 0; r < n_rows; r++) {
        float *row = x + r * n;
        for (int64_t h = 1; h < n; h *= 2)
            for (int64_t i = 0; i < n; i += 2 * h)
                for (int64_t j = i; j < i + h; j++) {
                    const float a = row[j], b = row[j + h];
                    row[j] = a + b, row[j + h] = a - b;
                }
        for (int64_t i = 0; i < n; i++) row[i] *= scale;
    }
}

void osp_cpu_rope_neox(float *x, const int32_t *positions, int64_t n_tokens, int64_t n_heads, int64_t head_dim,
                       int64_t n_rot, const float *inv_freq) {
    const int64_t half = n_rot / 2;
    for (int64_t t = 0; t < n_tokens; t++) {
        const float pos = (float)positions[t];
        for (int64_t i = 0; i < half; i++) {
            const float theta = pos * inv_freq[i];
            const float c = cosf(theta), s = sinf(theta);
            for (int64_t h = 0; h < n_heads; h++) {
                float *p = x + (t * n_heads + h) * head_dim + i;
                const float x0 = p[0], x1 = p[half];
                p[0] = x0 * c - x1 * s;
                p[half] = x0 * s + x1 * c;
            }
        }
    }
}

void osp_cpu_silu_mul(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

void osp_cpu_silu_mul_q8(const float *gate, const float *up, float *out, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), sign)); /* -g */
        const __m512 e = osp_vexp16(neg);
        _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), u));
    }
#endif
    for (; i < n; i++) {
        const float g = gate[i];
        const float e = osp_vexp_scalar(-g);
        const float d = 1.0f + e;
        const float s = g / d;
        out[i] = s * up[i];
    }
}

void osp_cpu_vexp_row(const float *x, float *y, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, m, osp_vexp16(_mm512_maskz_loadu_ps(m, x + i)));
    }
#endif
    for (; i < n; i++) y[i] = osp_vexp_scalar(x[i]);
}

void osp_cpu_gelu_mul(const float *gate, const float *up, float *out, int64_t n) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        const float x = gate[i];
        out[i] = 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x))) * up[i];
    }
}

void osp_cpu_paged_attention(const float *q, const void *k, const void *v, uint32_t kv_type, float *out,
                             int32_t num_seqs, const int32_t *query_start_loc,
                             const int32_t *positions, const int32_t *block_table,
                             int32_t max_blocks, int32_t block_size, int64_t n_head,
                             int64_t n_head_kv, int64_t head_dim, float scale, int32_t window, float *sc,
                             int64_t item_begin, int64_t item_end) {
    const uint32_t t = kv_type == OSP_DTYPE_F16 ? OSP_DTYPE_F16 : OSP_DTYPE_F32;
    const osp_cpu_kv_pages kv = {.k_type = t, .v_type = t, .k = k, .v = v};
    osp_cpu_paged_attention_kv(q, &kv, out, num_seqs, query_start_loc, positions, block_table, max_blocks, block_size,
                               n_head, n_head_kv, head_dim, scale, window, sc, item_begin, item_end);
}
