/* f16 KV pages on the CPU: K/V are rounded to f16 (nearest even) when written at slot_mapping and
 * widened back to fp32 (exact) when attention reads them (osp_cpu_paged_attention), so the attention
 * arithmetic is the fp32 reference's, over f16-rounded inputs. F16C does the conversions 8 at a time when the build has it;
 * both paths give bit-identical results. */
#include <math.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "core/dtype.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

void osp_cpu_f32_to_f16_row(const float *restrict x, uint16_t *restrict y, int64_t n) {
    int64_t i = 0;
#if defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) y[i] = osp_fp32_to_fp16(x[i]);
}

void osp_cpu_f16_to_f32_row(const uint16_t *restrict x, float *restrict y, int64_t n) {
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
        if (slot_mapping[t] < 0) continue; /* a padding row: no write (as the CUDA kernel) */
        const size_t slot = (size_t)slot_mapping[t];
        osp_cpu_f32_to_f16_row(k + t * kv_row, kp + slot * (size_t)kv_row, kv_row);
        osp_cpu_f32_to_f16_row(v + t * kv_row, vp + slot * (size_t)kv_row, kv_row);
    }
}
