/* Reference quantizers: fp32 rows -> F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q8_K blocks
 * (core/quantize.h).
 *
 * Written from the behaviour of ggml's scalar references (ggml-quants.c quantize_row_*_ref): same
 * choice of scale, same float32 arithmetic in the same order, same rounding, so the bytes match
 * ggml and gguf-py. Two things keep that true in C: the scale is rounded to f16 only when stored
 * (the quantized values use the fp32 scale), and no multiply-add is contracted into an FMA (the
 * project builds with -std=c17, where GCC's default is -ffp-contract=off); the test against the
 * gguf-py fixture would catch a change. Float-to-integer casts are clamped first, so even NaN input
 * is free of undefined behaviour. */
#include "core/quantize.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "core/status_internal.h"

enum { QK = 32, QK_K = 256 }; /* values per block of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; of Q8_K */

static void put_half(uint8_t *p, float f) {
    uint16_t h = osp_fp32_to_fp16(f);
    memcpy(p, &h, 2);
}

/* block_q8_0 { half d; int8 qs[32]; } */
static void q_q8_0(const float *restrict x, uint8_t *restrict b) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float a = fabsf(x[j]);
        amax = amax > a ? amax : a;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(b, d);
    int8_t *qs = (int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) {
        const float r = roundf(x[j] * id); /* half away from zero, like ggml and gguf-py's np_roundf */
        qs[j] = (int8_t)(r >= 127.0f ? 127 : r <= -128.0f ? -128 : r == r ? (int)r : 0);
    }
}

/* block_q4_0 { half d; uint8 qs[16]; }: value j in the low nibble of qs[j], value j+16 in the high */
static void q_q4_0(const float *restrict x, uint8_t *restrict b) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++) {
        if (amax < fabsf(x[j])) { /* strict: the first value of largest magnitude wins */
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(b, d);
    uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        const float v0 = x[j] * id + 8.5f, v1 = x[j + QK / 2] * id + 8.5f;
        const int q0 = v0 >= 15.0f ? 15 : v0 > 0.0f ? (int)v0 : 0; /* trunc, then min(15, .) */
        const int q1 = v1 >= 15.0f ? 15 : v1 > 0.0f ? (int)v1 : 0;
        qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* block_q4_1 { half d; half m; uint8 qs[16]; } */
static void q_q4_1(const float *restrict x, uint8_t *restrict b) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(b, d);
    put_half(b + 2, min);
    uint8_t *qs = b + 4;
    for (int j = 0; j < QK / 2; j++) {
        const float v0 = (x[j] - min) * id + 0.5f, v1 = (x[j + QK / 2] - min) * id + 0.5f;
        const int q0 = v0 >= 15.0f ? 15 : v0 > 0.0f ? (int)v0 : 0;
        const int q1 = v1 >= 15.0f ? 15 : v1 > 0.0f ? (int)v1 : 0;
        qs[j] = (uint8_t)(q0 | (q1 << 4));
    }
}

/* The 32 5-bit values of Q5_0/Q5_1: low nibbles packed as in Q4_0 (value j low, j+16 high nibble of
 * qs[j]), bit 4 of value j at bit j of the little-endian u32 qh. */
static void pack5(const int *restrict q, uint8_t *restrict qh_out, uint8_t *restrict qs) {
    uint32_t qh = 0;
    for (int j = 0; j < QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | (q[j + QK / 2] & 0x0f) << 4);
        qh |= (uint32_t)(q[j] >> 4 & 1) << j | (uint32_t)(q[j + QK / 2] >> 4 & 1) << (j + QK / 2);
    }
    memcpy(qh_out, &qh, 4);
}

/* block_q5_0 { half d; uint8 qh[4]; uint8 qs[16]; }: like Q4_0 with 32 levels */
static void q_q5_0(const float *restrict x, uint8_t *restrict b) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(b, d);
    int q[QK];
    for (int j = 0; j < QK; j++) {
        const float v = x[j] * id + 16.5f;
        q[j] = v >= 31.0f ? 31 : v > 0.0f ? (int)v : 0; /* trunc, then min(31, .) */
    }
    pack5(q, b + 2, b + 6);
}

/* block_q5_1 { half d; half m; uint8 qh[4]; uint8 qs[16]; }: like Q4_1 with 32 levels */
static void q_q5_1(const float *restrict x, uint8_t *restrict b) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK; j++) {
        if (x[j] < min) min = x[j];
        if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    put_half(b, d);
    put_half(b + 2, min);
    int q[QK];
    for (int j = 0; j < QK; j++) {
        const float v = (x[j] - min) * id + 0.5f;
        q[j] = v >= 31.0f ? 31 : v > 0.0f ? (int)v : 0;
    }
    pack5(q, b + 4, b + 8);
}

/* block_q8_K { float d; int8 qs[256]; int16 bsums[16]; } (ggml's intermediate type for K-quant dot
 * products): the value of largest magnitude m (first on ties) maps to -127: iscale = -127/m,
 * q = min(127, nearest-even(iscale x)), d = 1/iscale stored as fp32, bsums[k] = sum of q[16k..16k+15].
 * An all-zero block gets d = 0 and zero quants and sums (ggml leaves bsums unwritten there). */
static void q_q8_k(const float *restrict x, uint8_t *restrict b) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK_K; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    int8_t *qs = (int8_t *)(b + 4);
    if (amax == 0.0f) {
        memset(b, 0, 4 + QK_K + 2 * QK_K / 16);
        return;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; j++) {
        /* nearbyintf: round half to even, as ggml's nearest_int (default rounding mode) */
        const float r = nearbyintf(iscale * x[j]);
        qs[j] = (int8_t)(r >= 127.0f ? 127 : r <= -128.0f ? -128 : r == r ? (int)r : 0);
    }
    for (int k = 0; k < QK_K / 16; k++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += qs[16 * k + j];
        const int16_t s16 = (int16_t)sum;
        memcpy(b + 4 + QK_K + 2 * k, &s16, 2);
    }
    const float d = 1.0f / iscale;
    memcpy(b, &d, 4);
}

bool osp_dtype_can_quantize(uint32_t t) {
    switch (t) {
    case OSP_DTYPE_F32: case OSP_DTYPE_F16: case OSP_DTYPE_BF16:
    case OSP_DTYPE_Q8_0: case OSP_DTYPE_Q4_0: case OSP_DTYPE_Q4_1:
    case OSP_DTYPE_Q5_0: case OSP_DTYPE_Q5_1: case OSP_DTYPE_Q8_K:
        return true;
    default:
        return false;
    }
}

osp_status osp_quantize_row(uint32_t t, const float *src, void *dst, int64_t n) {
    if (!osp_dtype_can_quantize(t))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "quantization to %s is not supported",
                             osp_dtype_name(t) ? osp_dtype_name(t) : "an unknown type");
    if (!src || !dst || n < 0 || n % osp_dtype_block_size(t) != 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "quantize: NULL pointer or %lld values are not whole %s blocks",
                             (long long)n, osp_dtype_name(t));
    uint8_t *d = dst;
    const size_t ts = osp_dtype_type_size(t);
    switch (t) {
    case OSP_DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case OSP_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) put_half(d + 2 * i, src[i]);
        break;
    case OSP_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = osp_fp32_to_bf16(src[i]);
            memcpy(d + 2 * i, &h, 2);
        }
        break;
    case OSP_DTYPE_Q8_0:
        for (int64_t i = 0; i < n / QK; i++) q_q8_0(src + i * QK, d + (size_t)i * ts);
        break;
    case OSP_DTYPE_Q4_0:
        for (int64_t i = 0; i < n / QK; i++) q_q4_0(src + i * QK, d + (size_t)i * ts);
        break;
    case OSP_DTYPE_Q4_1:
        for (int64_t i = 0; i < n / QK; i++) q_q4_1(src + i * QK, d + (size_t)i * ts);
        break;
    case OSP_DTYPE_Q5_0:
        for (int64_t i = 0; i < n / QK; i++) q_q5_0(src + i * QK, d + (size_t)i * ts);
        break;
    case OSP_DTYPE_Q5_1:
        for (int64_t i = 0; i < n / QK; i++) q_q5_1(src + i * QK, d + (size_t)i * ts);
        break;
    default: /* Q8_K */
        for (int64_t i = 0; i < n / QK_K; i++) q_q8_k(src + i * QK_K, d + (size_t)i * ts);
        break;
    }
    return OSP_OK;
}
