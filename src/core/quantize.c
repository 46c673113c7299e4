/* Reference quantizers: fp32 rows -> F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q8_K, Q4_K, Q6_K
 * blocks (core/quantize.h).
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

static float get_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return osp_fp16_to_fp32(h);
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

/* ---- K-quants: Q4_K and Q6_K (ggml's quantize_row_q4_K_ref / q6_K_ref, no importance weights) ---- */

/* Round to nearest, ties to even (ggml's nearest_int, default rounding mode); NaN gives 0 and huge
 * values saturate, so the int conversion is always defined. */
static int rint_i(float v) {
    const float r = nearbyintf(v);
    return r >= 4194303.0f ? 4194303 : r <= -4194303.0f ? -4194303 : r == r ? (int)r : 0;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Fits x[i] ~ scale*L[i] - mn with L in [0, nmax], minimizing the weighted squared error: start from
 * the min/max grid, then try nstep+1 grids with nmax + rmin + k*rdelta steps over [min, max], each
 * followed by the weighted least-squares scale and offset for its L (offset forced to <= 0: the min
 * is never above zero). Keeps the best; returns the scale, *neg_min = -offset (>= 0). */
static float fit_affine(int n, int nmax, const float *restrict x, const float *restrict w, uint8_t *restrict L,
                        float *neg_min, float rmin, float rdelta, int nstep) {
    float lo = x[0], hi = x[0], sw = w[0], sx = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < lo) lo = x[i];
        if (x[i] > hi) hi = x[i];
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (lo > 0) lo = 0;
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *neg_min = -lo;
        return 0.0f;
    }
    float inv = (float)nmax / (hi - lo), scale = 1.0f / inv, err = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(rint_i(inv * (x[i] - lo)), 0, nmax);
        const float e = scale * (float)L[i] + lo - x[i];
        err += w[i] * (e * e);
    }
    uint8_t T[32];
    for (int k = 0; k <= nstep; k++) {
        inv = (rmin + rdelta * (float)k + (float)nmax) / (hi - lo);
        float sl = 0.0f, sl2 = 0.0f, sxl = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(rint_i(inv * (x[i] - lo)), 0, nmax);
            T[i] = (uint8_t)l;
            const float wl = w[i] * (float)l;
            sl += wl;
            sl2 += wl * (float)l;
            sxl += wl * x[i];
        }
        const float det = sw * sl2 - sl * sl;
        if (!(det > 0.0f)) continue;
        float sc = (sw * sxl - sx * sl) / det, off = (sl2 * sx - sl * sxl) / det;
        if (off > 0.0f) {
            off = 0.0f;
            sc = sxl / sl2;
        }
        float e2 = 0.0f;
        for (int i = 0; i < n; i++) {
            const float e = sc * (float)T[i] + off - x[i];
            e2 += w[i] * (e * e);
        }
        if (e2 < err) {
            memcpy(L, T, (size_t)n);
            err = e2;
            scale = sc;
            lo = off;
        }
    }
    *neg_min = -lo;
    return scale;
}

/* block_q4_K { half d; half dmin; uint8 scales[12]; uint8 qs[128]; } (layout: core/dtype.c) */
static void q_q4_k(const float *restrict x, uint8_t *restrict b) {
    uint8_t L[QK_K];
    float sc[8], mn[8], w[32], max_sc = 0.0f, max_mn = 0.0f;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        float s2 = 0.0f;
        for (int l = 0; l < 32; l++) s2 += xs[l] * xs[l];
        const float rms = sqrtf(s2 / 32.0f);
        for (int l = 0; l < 32; l++) w[l] = rms + fabsf(xs[l]);
        sc[j] = fit_affine(32, 15, xs, w, L + 32 * j, &mn[j], -1.0f, 0.1f, 20);
        if (sc[j] > max_sc) max_sc = sc[j];
        if (mn[j] > max_mn) max_mn = mn[j];
    }
    const float isc = max_sc > 0.0f ? 63.0f / max_sc : 0.0f, imn = max_mn > 0.0f ? 63.0f / max_mn : 0.0f;
    uint8_t *sb = b + 4;
    int ls[8], lm[8];
    for (int j = 0; j < 8; j++) { /* 6-bit codes; an out-of-range one wraps to 8 bits first, as in ggml */
        const int cs = rint_i(isc * sc[j]) & 0xff, cm = rint_i(imn * mn[j]) & 0xff;
        ls[j] = cs < 63 ? cs : 63;
        lm[j] = cm < 63 ? cm : 63;
    }
    for (int j = 0; j < 4; j++) {
        sb[j] = (uint8_t)(ls[j] | (ls[j + 4] >> 4) << 6);
        sb[j + 4] = (uint8_t)(lm[j] | (lm[j + 4] >> 4) << 6);
        sb[j + 8] = (uint8_t)((ls[j + 4] & 0x0f) | (lm[j + 4] & 0x0f) << 4);
    }
    put_half(b, max_sc / 63.0f);
    put_half(b + 2, max_mn / 63.0f);
    const float d = get_half(b), dmin = get_half(b + 2);
    for (int j = 0; j < 8; j++) { /* requantize with the stored scales; a sub-block of scale 0 keeps the fit */
        const float dj = d * (float)ls[j];
        if (dj == 0.0f) continue;
        const float mj = dmin * (float)lm[j];
        for (int l = 0; l < 32; l++) L[32 * j + l] = (uint8_t)clampi(rint_i((x[32 * j + l] + mj) / dj), 0, 15);
    }
    uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) qs[32 * c + l] = (uint8_t)(L[64 * c + l] | L[64 * c + 32 + l] << 4);
}

/* Symmetric fit of 16 values: L in [0, 2 nmax) stands for L - nmax; x ~ scale*(L - nmax) with
 * weights x^2. Starts from iscale = -nmax/m (m: the value of largest magnitude, first on ties), then
 * tries -(nmax + k/10)/m for k = -9..9 (k != 0) and keeps the least-squares scale of the best grid. */
static float fit_sym16(int nmax, const float *restrict x, uint8_t *restrict L) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < 16; i++) {
        if (fabsf(x[i]) > amax) {
            amax = fabsf(x[i]);
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        memset(L, 0, 16);
        return 0.0f;
    }
    float inv = (float)-nmax / max, slx = 0.0f, sl2 = 0.0f;
    for (int i = 0; i < 16; i++) {
        const int l = clampi(rint_i(inv * x[i]), -nmax, nmax - 1);
        L[i] = (uint8_t)(l + nmax);
        const float w = x[i] * x[i];
        slx += w * x[i] * (float)l;
        sl2 += w * (float)l * (float)l;
    }
    float scale = sl2 != 0.0f ? slx / sl2 : 0.0f, best = scale * slx;
    for (int k = -9; k <= 9; k++) {
        if (k == 0) continue;
        inv = -((float)nmax + 0.1f * (float)k) / max;
        slx = sl2 = 0.0f;
        for (int i = 0; i < 16; i++) {
            const int l = clampi(rint_i(inv * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            slx += w * x[i] * (float)l;
            sl2 += w * (float)l * (float)l;
        }
        if (sl2 > 0.0f && slx * slx > best * sl2) {
            for (int i = 0; i < 16; i++) L[i] = (uint8_t)(clampi(rint_i(inv * x[i]), -nmax, nmax - 1) + nmax);
            scale = slx / sl2;
            best = scale * slx;
        }
    }
    return scale;
}

/* block_q6_K { uint8 ql[128]; uint8 qh[64]; int8 scales[16]; half d; } (layout: core/dtype.c) */
static void q_q6_k(const float *restrict x, uint8_t *restrict b) {
    uint8_t L[QK_K];
    float sc[16], amax = 0.0f, max = 0.0f;
    for (int k = 0; k < 16; k++) {
        sc[k] = fit_sym16(32, x + 16 * k, L + 16 * k);
        if (fabsf(sc[k]) > amax) {
            amax = fabsf(sc[k]);
            max = sc[k];
        }
    }
    memset(b, 0, 210);
    if (amax < 1e-15f) return; /* all zero */
    const float iscale = -128.0f / max;
    put_half(b + 208, 1.0f / iscale);
    const float d = get_half(b + 208);
    int8_t *scales = (int8_t *)(b + 192);
    for (int k = 0; k < 16; k++) {
        const int v = rint_i(iscale * sc[k]);
        scales[k] = (int8_t)(v > 127 ? 127 : v < -128 ? -128 : v);
        const float dk = d * (float)scales[k];
        if (dk == 0.0f) continue; /* keeps the fit's values */
        for (int i = 0; i < 16; i++) L[16 * k + i] = (uint8_t)(clampi(rint_i(x[16 * k + i] / dk), -32, 31) + 32);
    }
    uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++) {
        const uint8_t *Lh = L + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[64 * h + l] = (uint8_t)((Lh[l] & 0x0f) | (Lh[l + 64] & 0x0f) << 4);
            ql[64 * h + 32 + l] = (uint8_t)((Lh[l + 32] & 0x0f) | (Lh[l + 96] & 0x0f) << 4);
            qh[32 * h + l] = (uint8_t)(Lh[l] >> 4 | (Lh[l + 32] >> 4) << 2 | (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
        }
    }
}

bool osp_dtype_can_quantize(uint32_t t) {
    switch (t) {
    case OSP_DTYPE_F32: case OSP_DTYPE_F16: case OSP_DTYPE_BF16:
    case OSP_DTYPE_Q8_0: case OSP_DTYPE_Q4_0: case OSP_DTYPE_Q4_1:
    case OSP_DTYPE_Q5_0: case OSP_DTYPE_Q5_1: case OSP_DTYPE_Q8_K:
    case OSP_DTYPE_Q4_K: case OSP_DTYPE_Q6_K:
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
    case OSP_DTYPE_Q4_K:
        for (int64_t i = 0; i < n / QK_K; i++) q_q4_k(src + i * QK_K, d + (size_t)i * ts);
        break;
    case OSP_DTYPE_Q6_K:
        for (int64_t i = 0; i < n / QK_K; i++) q_q6_k(src + i * QK_K, d + (size_t)i * ts);
        break;
    default: /* Q8_K */
        for (int64_t i = 0; i < n / QK_K; i++) q_q8_k(src + i * QK_K, d + (size_t)i * ts);
        break;
    }
    return OSP_OK;
}
