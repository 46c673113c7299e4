/* f16 KV pages on the CPU: K/V are rounded to f16 (nearest even) when written at slot_mapping and
 * widened back to fp32 (exact) when attention reads them, so the attention arithmetic is the fp32
 * reference's, over f16-rounded inputs. F16C does the conversions 8 at a time when the build has it;
 * both paths give bit-identical results. */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "core/dtype.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

static void to_f16(const float *restrict x, uint16_t *restrict y, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = osp_fp32_to_fp16(x[i]);
}

static void to_f32(const uint16_t *restrict x, float *restrict y, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(x + i))));
#endif
    for (; i < n; i++) y[i] = osp_fp16_to_fp32(x[i]);
}

void osp_cpu_kv_write_f16(const float *k, const float *v, void *k_pages, void *v_pages, const int32_t *slot_mapping,
                          int64_t num_tokens, int64_t kv_row) {
    uint16_t *kp = k_pages, *vp = v_pages;
    for (int64_t t = 0; t < num_tokens; t++) {
        const size_t slot = (size_t)slot_mapping[t];
        to_f16(k + t * kv_row, kp + slot * (size_t)kv_row, kv_row);
        to_f16(v + t * kv_row, vp + slot * (size_t)kv_row, kv_row);
    }
}

#define MAX_HEAD_DIM 1024

void osp_cpu_paged_attention_f16(const float *q, const void *k_pages, const void *v_pages, float *out,
                                 int32_t num_seqs, const int32_t *query_start_loc, const int32_t *positions,
                                 const int32_t *block_table, int32_t max_blocks, int32_t block_size,
                                 int64_t n_head, int64_t n_head_kv, int64_t head_dim, float scale, float *sc,
                                 int64_t item_begin, int64_t item_end) {
    const uint16_t *k = k_pages, *v = v_pages;
    const int64_t group = n_head / n_head_kv;
    const int64_t kv_row = n_head_kv * head_dim;
    float row[MAX_HEAD_DIM];
    int32_t s = 0;
    for (int64_t item = item_begin; item < item_end; item++) {
        const int64_t t = item / n_head, h = item % n_head;
        while (s < num_seqs - 1 && t >= query_start_loc[s + 1]) s++;
        while (s > 0 && t < query_start_loc[s]) s--;
        const int32_t *bt = block_table + (size_t)s * max_blocks;
        const int64_t kvh = h / group;
        const float *qh = q + (t * n_head + h) * head_dim;
        const int64_t n_ctx = (int64_t)positions[t] + 1;
        float mx = -INFINITY;
        for (int64_t p = 0; p < n_ctx; p++) {
            const int64_t slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
            to_f32(k + slot * kv_row + kvh * head_dim, row, head_dim);
            sc[p] = osp_cpu_dot(qh, row, head_dim) * scale;
            if (sc[p] > mx) mx = sc[p];
        }
        float sum = 0.0f;
        for (int64_t p = 0; p < n_ctx; p++) {
            sc[p] = expf(sc[p] - mx);
            sum += sc[p];
        }
        float *o = out + (t * n_head + h) * head_dim;
        memset(o, 0, (size_t)head_dim * sizeof *o);
        for (int64_t p = 0; p < n_ctx; p++) {
            const int64_t slot = (int64_t)bt[p / block_size] * block_size + p % block_size;
            to_f32(v + slot * kv_row + kvh * head_dim, row, head_dim);
            const float w = sc[p];
            for (int64_t d = 0; d < head_dim; d++) o[d] += w * row[d];
        }
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < head_dim; d++) o[d] *= inv;
    }
}
