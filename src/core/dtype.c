/* Element types: the ggml type table (names, block sizes, bytes per block) and the reference
 * dequantizers, written straight from the block layouts in ggml-common.h. These plain loops are the
 * ground truth that fast kernels are checked against. */
#include "core/dtype.h"

#include <math.h>
#ifdef __F16C__
#include <immintrin.h>
#endif
#include <string.h>

#include "core/status_internal.h"

typedef struct dtype_info {
    const char *name;
    int64_t block_size;
    size_t type_size;
} dtype_info;

/* Indexed by ggml type id; ids ggml has removed (4, 5, 31-33, 36-38) have no name. */
static const dtype_info k_types[OSP_DTYPE_COUNT] = {
    [OSP_DTYPE_F32] = {"F32", 1, 4},
    [OSP_DTYPE_F16] = {"F16", 1, 2},
    [OSP_DTYPE_Q4_0] = {"Q4_0", 32, 2 + 16},
    [OSP_DTYPE_Q4_1] = {"Q4_1", 32, 2 + 2 + 16},
    [OSP_DTYPE_Q5_0] = {"Q5_0", 32, 2 + 4 + 16},
    [OSP_DTYPE_Q5_1] = {"Q5_1", 32, 2 + 2 + 4 + 16},
    [OSP_DTYPE_Q8_0] = {"Q8_0", 32, 2 + 32},
    [OSP_DTYPE_Q8_1] = {"Q8_1", 32, 2 + 2 + 32},
    [OSP_DTYPE_Q2_K] = {"Q2_K", 256, 16 + 64 + 2 + 2},
    [OSP_DTYPE_Q3_K] = {"Q3_K", 256, 32 + 64 + 12 + 2},
    [OSP_DTYPE_Q4_K] = {"Q4_K", 256, 2 + 2 + 12 + 128},
    [OSP_DTYPE_Q5_K] = {"Q5_K", 256, 2 + 2 + 12 + 32 + 128},
    [OSP_DTYPE_Q6_K] = {"Q6_K", 256, 128 + 64 + 16 + 2},
    [OSP_DTYPE_Q8_K] = {"Q8_K", 256, 4 + 256 + 32},
    [OSP_DTYPE_IQ2_XXS] = {"IQ2_XXS", 256, 2 + 64},
    [OSP_DTYPE_IQ2_XS] = {"IQ2_XS", 256, 2 + 64 + 8},
    [OSP_DTYPE_IQ3_XXS] = {"IQ3_XXS", 256, 2 + 96},
    [OSP_DTYPE_IQ1_S] = {"IQ1_S", 256, 2 + 32 + 16},
    [OSP_DTYPE_IQ4_NL] = {"IQ4_NL", 32, 2 + 16},
    [OSP_DTYPE_IQ3_S] = {"IQ3_S", 256, 2 + 64 + 8 + 32 + 4},
    [OSP_DTYPE_IQ2_S] = {"IQ2_S", 256, 2 + 64 + 16},
    [OSP_DTYPE_IQ4_XS] = {"IQ4_XS", 256, 2 + 2 + 4 + 128},
    [OSP_DTYPE_I8] = {"I8", 1, 1},
    [OSP_DTYPE_I16] = {"I16", 1, 2},
    [OSP_DTYPE_I32] = {"I32", 1, 4},
    [OSP_DTYPE_I64] = {"I64", 1, 8},
    [OSP_DTYPE_F64] = {"F64", 1, 8},
    [OSP_DTYPE_IQ1_M] = {"IQ1_M", 256, 32 + 16 + 8},
    [OSP_DTYPE_BF16] = {"BF16", 1, 2},
    [OSP_DTYPE_TQ1_0] = {"TQ1_0", 256, 48 + 4 + 2},
    [OSP_DTYPE_TQ2_0] = {"TQ2_0", 256, 64 + 2},
    [OSP_DTYPE_MXFP4] = {"MXFP4", 32, 1 + 16},
};

const char *osp_dtype_name(uint32_t t) { return t < OSP_DTYPE_COUNT ? k_types[t].name : NULL; }
int64_t osp_dtype_block_size(uint32_t t) { return t < OSP_DTYPE_COUNT ? k_types[t].block_size : 0; }
size_t osp_dtype_type_size(uint32_t t) { return t < OSP_DTYPE_COUNT ? k_types[t].type_size : 0; }

size_t osp_dtype_row_size(uint32_t t, int64_t n) {
    int64_t bs = osp_dtype_block_size(t);
    return bs ? (size_t)(n / bs) * osp_dtype_type_size(t) : 0;
}

bool osp_dtype_can_dequant(uint32_t t) {
    switch (t) {
    case OSP_DTYPE_F32: case OSP_DTYPE_F16: case OSP_DTYPE_BF16:
    case OSP_DTYPE_Q4_0: case OSP_DTYPE_Q4_1: case OSP_DTYPE_Q8_0:
    case OSP_DTYPE_Q5_0: case OSP_DTYPE_Q5_1:
    case OSP_DTYPE_Q2_K: case OSP_DTYPE_Q3_K: case OSP_DTYPE_Q4_K: case OSP_DTYPE_Q5_K:
    case OSP_DTYPE_Q6_K: case OSP_DTYPE_Q8_K:
        return true;
    default:
        return false;
    }
}

/* ---- half precision ---------------------------------------------------------------------------- */

float osp_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13); /* inf / nan */
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: value = man * 2^-24 */
            float f = (float)man * 5.9604644775390625e-8f;
            memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t osp_fp32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00 | (abs > 0x7f800000u ? 0x200 : 0));
    if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* rounds to >= 65520: inf */
    if (abs < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        float a;
        memcpy(&a, &abs, 4);
        /* a * 2^24 rounded to nearest even gives the subnormal mantissa. */
        float m = nearbyintf(a * 16777216.0f);
        return (uint16_t)(sign | (uint32_t)m);
    }
    uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u); /* round to nearest even at bit 13 */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float osp_bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t osp_fp32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 64); /* quiet nan */
    return (uint16_t)((x + (0x7fffu + ((x >> 16) & 1u))) >> 16);
}

/* ---- block dequantizers (ggml-common.h layouts) ------------------------------------------------ */

static inline float rd_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#ifdef __F16C__
    return _cvtsh_ss(h); /* exact, like the portable path */
#else
    return osp_fp16_to_fp32(h);
#endif
}

/* block_q4_0 { half d; u8 qs[16]; }: low nibbles are values 0..15, high nibbles 16..31; x = (q-8)d */
static void dq_q4_0(const uint8_t *restrict b, float *restrict y) {
    float d = rd_half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)((qs[j] & 0x0f) - 8) * d;
        y[j + 16] = (float)((qs[j] >> 4) - 8) * d;
    }
}

/* block_q4_1 { half d; half m; u8 qs[16]; }: x = q*d + m */
static void dq_q4_1(const uint8_t *restrict b, float *restrict y) {
    float d = rd_half(b), m = rd_half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = (float)(qs[j] & 0x0f) * d + m;
        y[j + 16] = (float)(qs[j] >> 4) * d + m;
    }
}

/* block_q8_0 { half d; i8 qs[32]; }: x = q*d */
static void dq_q8_0(const uint8_t *restrict b, float *restrict y) {
    float d = rd_half(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < 32; j++) y[j] = (float)qs[j] * d;
}

/* block_q5_0 { half d; u8 qh[4]; u8 qs[16]; }: value j (< 16) has its low 4 bits in the low nibble of
 * qs[j], value j+16 in the high nibble; bit j of the little-endian u32 qh is bit 4 of value j.
 * x = (q-16)d */
static void dq_q5_0(const uint8_t *restrict b, float *restrict y) {
    float d = rd_half(b);
    uint32_t qh;
    memcpy(&qh, b + 2, 4);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1u) << 4;
        const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = (float)(lo - 16) * d;
        y[j + 16] = (float)(hi - 16) * d;
    }
}

/* block_q5_1 { half d; half m; u8 qh[4]; u8 qs[16]; }: bits as in Q5_0; x = q*d + m */
static void dq_q5_1(const uint8_t *restrict b, float *restrict y) {
    float d = rd_half(b), m = rd_half(b + 2);
    uint32_t qh;
    memcpy(&qh, b + 4, 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        const int lo = (qs[j] & 0x0f) | (int)((qh >> j) & 1u) << 4;
        const int hi = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1u) << 4;
        y[j] = (float)lo * d + m;
        y[j + 16] = (float)hi * d + m;
    }
}

/* The K-quants: super-blocks of 256 values made of sub-blocks of 16 or 32, each with a small integer
 * scale (and min) that a half-precision super-block scale multiplies. The float arithmetic below is
 * ggml's: sub-block scale first (d * sc), then times the quant, then minus the min term. */

/* block_q2_K { u8 scales[16]; u8 qs[64]; half d; half dmin; }. Value i = 128h + 32s + l (h < 2,
 * s < 4, l < 32) is bits 2s..2s+1 of qs[32h + l]; sub-block i/16 has scale nibble sc & 15 and min
 * nibble sc >> 4 of scales[i/16]. x = (d*sc)q - dmin*m */
static void dq_q2_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *sc = b, *qs = b + 16;
    const float d = rd_half(b + 80), dmin = rd_half(b + 82);
    for (int k = 0; k < 16; k++) { /* sub-block k = 8h + 2s + g holds l = 16g .. 16g+15 */
        const int h = k >> 3, s = (k >> 1) & 3, l0 = 16 * (k & 1);
        const float dl = d * (float)(sc[k] & 0x0f), ml = dmin * (float)(sc[k] >> 4);
        for (int l = l0; l < l0 + 16; l++)
            y[16 * k + l - l0] = dl * (float)((qs[32 * h + l] >> (2 * s)) & 3) - ml;
    }
}

/* block_q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d; }. Value i = 128h + 32s + l: low two
 * bits as in Q2_K, and q = low - 4 unless bit (4h + s) of hmask[l] is set. The 16 sub-block scales
 * are 6 bits, stored minus 32: scale k has low nibble scales[k] & 15 (k < 8) or scales[k-8] >> 4, and
 * high two bits (scales[8 + k%4] >> 2(k/4)) & 3. x = (d*(sc-32))q */
static void dq_q3_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *hm = b, *qs = b + 32, *sb = b + 96;
    const float d = rd_half(b + 108);
    float dl[16];
    for (int k = 0; k < 16; k++) {
        const int lo = k < 8 ? sb[k] & 0x0f : sb[k - 8] >> 4;
        const int hi = (sb[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
        dl[k] = d * (float)((lo | hi << 4) - 32);
    }
    for (int k = 0; k < 16; k++) {
        const int h = k >> 3, s = (k >> 1) & 3, l0 = 16 * (k & 1);
        for (int l = l0; l < l0 + 16; l++) {
            const int q = ((qs[32 * h + l] >> (2 * s)) & 3) - ((hm[l] >> (4 * h + s)) & 1 ? 0 : 4);
            y[16 * k + l - l0] = dl[k] * (float)q;
        }
    }
}

/* The 6-bit scales and mins of Q4_K/Q5_K's eight sub-blocks of 32, packed in 12 bytes: for j < 4,
 * scale = p[j] & 63 and min = p[j+4] & 63; for j >= 4 the low nibbles come from p[j+4] (scale) and
 * its high nibble (min), the top two bits from the spare top bits of p[j-4] (scale) and p[j] (min). */
static void k4_scales(const uint8_t *restrict p, float d, float dmin, float *restrict dl, float *restrict ml) {
    for (int j = 0; j < 8; j++) {
        int sc, m;
        if (j < 4) {
            sc = p[j] & 63;
            m = p[j + 4] & 63;
        } else {
            sc = (p[j + 4] & 0x0f) | (p[j - 4] >> 6) << 4;
            m = (p[j + 4] >> 4) | (p[j] >> 6) << 4;
        }
        dl[j] = d * (float)sc;
        ml[j] = dmin * (float)m;
    }
}

/* block_q4_K { half d; half dmin; u8 scales[12]; u8 qs[128]; }. Value 64c + l (l < 32) is the low
 * nibble of qs[32c + l] (sub-block 2c), value 64c + 32 + l its high nibble (sub-block 2c+1).
 * x = (d*sc)q - dmin*m */
static void dq_q4_k(const uint8_t *restrict b, float *restrict y) {
    float dl[8], ml[8];
    k4_scales(b + 4, rd_half(b), rd_half(b + 2), dl, ml);
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = dl[2 * c] * (float)(qs[32 * c + l] & 0x0f) - ml[2 * c];
            y[64 * c + 32 + l] = dl[2 * c + 1] * (float)(qs[32 * c + l] >> 4) - ml[2 * c + 1];
        }
    }
}

/* block_q5_K { half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }: Q4_K plus a fifth bit,
 * bit k of qh[l] for value 32k + l. */
static void dq_q5_k(const uint8_t *restrict b, float *restrict y) {
    float dl[8], ml[8];
    k4_scales(b + 4, rd_half(b), rd_half(b + 2), dl, ml);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            const int q0 = (qs[32 * c + l] & 0x0f) | ((qh[l] >> (2 * c)) & 1) << 4;
            const int q1 = (qs[32 * c + l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4;
            y[64 * c + l] = dl[2 * c] * (float)q0 - ml[2 * c];
            y[64 * c + 32 + l] = dl[2 * c + 1] * (float)q1 - ml[2 * c + 1];
        }
    }
}

/* block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; half d; }. In half h (128 values), value
 * 128h + 32s + l (s < 4, l < 32) has its low nibble in ql[64h + 32(s&1) + l] (low nibble for s < 2,
 * high for s >= 2) and its top two bits at bits 2s..2s+1 of qh[32h + l]; sub-block (128h+32s+l)/16.
 * x = (d*sc)(q-32) */
static void dq_q6_k(const uint8_t *restrict b, float *restrict y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = rd_half(b + 208);
    for (int k = 0; k < 16; k++) {
        const int h = k >> 3, s = (k >> 1) & 3, l0 = 16 * (k & 1);
        const float dl = d * (float)sc[k];
        for (int l = l0; l < l0 + 16; l++) {
            const int lo = (ql[64 * h + 32 * (s & 1) + l] >> (4 * (s >> 1))) & 0x0f;
            const int hi = (qh[32 * h + l] >> (2 * s)) & 3;
            y[16 * k + l - l0] = dl * (float)((lo | hi << 4) - 32);
        }
    }
}

/* block_q8_K { float d; i8 qs[256]; i16 bsums[16]; }: x = d*q (bsums are for dot products only) */
static void dq_q8_k(const uint8_t *restrict b, float *restrict y) {
    float d;
    memcpy(&d, b, 4);
    const int8_t *qs = (const int8_t *)(b + 4);
    for (int j = 0; j < 256; j++) y[j] = d * (float)qs[j];
}

osp_status osp_dequant_row(uint32_t t, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    int64_t bs = osp_dtype_block_size(t);
    if (!osp_dtype_can_dequant(t))
        return osp_set_error(OSP_ERR_UNSUPPORTED, "dequantization of %s is not supported",
                             osp_dtype_name(t) ? osp_dtype_name(t) : "an unknown type");
    if (n % bs != 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "%lld values are not whole %s blocks", (long long)n,
                             osp_dtype_name(t));
    size_t ts = osp_dtype_type_size(t);
    switch (t) {
    case OSP_DTYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case OSP_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = rd_half(s + 2 * i);
        break;
    case OSP_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = osp_bf16_to_fp32(h);
        }
        break;
    case OSP_DTYPE_Q4_0:
        for (int64_t i = 0; i < n / bs; i++) dq_q4_0(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q4_1:
        for (int64_t i = 0; i < n / bs; i++) dq_q4_1(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q8_0:
        for (int64_t i = 0; i < n / bs; i++) dq_q8_0(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q5_0:
        for (int64_t i = 0; i < n / bs; i++) dq_q5_0(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q5_1:
        for (int64_t i = 0; i < n / bs; i++) dq_q5_1(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q2_K:
        for (int64_t i = 0; i < n / bs; i++) dq_q2_k(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q3_K:
        for (int64_t i = 0; i < n / bs; i++) dq_q3_k(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q4_K:
        for (int64_t i = 0; i < n / bs; i++) dq_q4_k(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q5_K:
        for (int64_t i = 0; i < n / bs; i++) dq_q5_k(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q6_K:
        for (int64_t i = 0; i < n / bs; i++) dq_q6_k(s + i * ts, dst + i * bs);
        break;
    case OSP_DTYPE_Q8_K:
        for (int64_t i = 0; i < n / bs; i++) dq_q8_k(s + i * ts, dst + i * bs);
        break;
    }
    return OSP_OK;
}

/* ---- FP8 E4M3, FP4 E2M1, NVFP4 micro-blocks (dtype.h says which specs) ------------------------- */

float osp_e4m3_to_fp32(uint8_t c) {
    const float sign = c & 0x80 ? -1.0f : 1.0f;
    const int e = (c >> 3) & 0xF, m = c & 7;
    if (e == 15 && m == 7) return sign * NAN;
    if (e == 0) return sign * ldexpf((float)m, -9); /* subnormal: m 2^-9 */
    return sign * ldexpf(1.0f + (float)m / 8.0f, e - 7);
}

uint8_t osp_fp32_to_e4m3(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    const uint8_t sign = (uint8_t)((b >> 31) << 7);
    if (isnan(f)) return sign | 0x7F;
    const float a = fabsf(f);
    if (a >= 464.0f) return sign | 0x7E; /* rounds past 448 (to 480, which is NaN's code): saturate */
    if (a < 0.015625f) {                 /* below 2^-6: subnormals m 2^-9, m = 8 is 2^-6 (code 8) */
        const float m = nearbyintf(a * 512.0f); /* exact scaling; the default mode rounds to even */
        return sign | (uint8_t)m;
    }
    const int e = (int)((b >> 23) & 0xFF) - 127; /* -6 .. 8 */
    const uint32_t mant = b & 0x7FFFFF, rem = mant & 0xFFFFF, half = 0x80000;
    uint32_t code = ((uint32_t)(e + 7) << 3) | (mant >> 20);
    if (rem > half || (rem == half && (code & 1))) code++; /* a carry moves into the exponent: right */
    return sign | (uint8_t)code;
}

float osp_e2m1_to_fp32(uint8_t c) {
    const float sign = c & 0x8 ? -1.0f : 1.0f;
    const int e = (c >> 1) & 3, m = c & 1;
    if (e == 0) return sign * 0.5f * (float)m;
    return sign * ldexpf(1.0f + 0.5f * (float)m, e - 1);
}

uint8_t osp_fp32_to_e2m1(float f) {
    if (isnan(f)) return 0x8;
    uint32_t b;
    memcpy(&b, &f, 4);
    const uint8_t sign = (uint8_t)((b >> 31) << 3);
    const float a = fabsf(f);
    if (a > 5.0f) return sign | 0x7; /* past 5 the nearest is 6, or beyond it: saturate at 6 */
    if (a < 1.0f) return sign | (uint8_t)nearbyintf(a * 2.0f); /* 0, 0.5 (code 1) or 1.0 (code 2) */
    const int e = (int)((b >> 23) & 0xFF) - 127; /* 0 .. 2 */
    const uint32_t mant = b & 0x7FFFFF, rem = mant & 0x3FFFFF, half = 0x200000;
    uint32_t code = ((uint32_t)(e + 1) << 1) | (mant >> 22);
    if (rem > half || (rem == half && (code & 1))) code++;
    return sign | (uint8_t)(code > 7 ? 7 : code);
}

void osp_nvfp4_quantize16(const float *x, float tensor_scale, uint8_t *packed, uint8_t *scale) {
    float amax = 0.0f;
    for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[i])); /* fmaxf drops NaN */
    *scale = osp_fp32_to_e4m3(amax / 6.0f / tensor_scale);
    const float s = osp_e4m3_to_fp32(*scale) * tensor_scale;
    for (int i = 0; i < 8; i++) {
        const uint8_t lo = s > 0.0f ? osp_fp32_to_e2m1(x[2 * i] / s) : 0, hi = s > 0.0f ? osp_fp32_to_e2m1(x[2 * i + 1] / s) : 0;
        packed[i] = (uint8_t)(lo | (hi << 4));
    }
}

void osp_nvfp4_dequantize16(const uint8_t *packed, uint8_t scale, float tensor_scale, float *y) {
    const float s = osp_e4m3_to_fp32(scale) * tensor_scale;
    for (int i = 0; i < 8; i++) {
        y[2 * i] = osp_e2m1_to_fp32(packed[i] & 0xF) * s;
        y[2 * i + 1] = osp_e2m1_to_fp32(packed[i] >> 4) * s;
    }
}

/* f16 bits of v rounded toward -inf (down) or +inf (up): the nearest f16, stepped one unit when it lies on
 * the wrong side of v. Finite v within f16's range. */
static uint16_t fp16_directed(float v, bool up) {
    uint16_t h = osp_fp32_to_fp16(v);
    const float back = osp_fp16_to_fp32(h);
    if (up ? back >= v : back <= v) return h;
    const bool neg = h & 0x8000u, mag0 = (h & 0x7FFFu) == 0;
    if (up) return mag0 ? 0x0001u : neg ? (uint16_t)(h - 1) : (uint16_t)(h + 1);
    return mag0 ? 0x8001u : neg ? (uint16_t)(h + 1) : (uint16_t)(h - 1);
}

void osp_int8h_quantize_row(const float *x, int64_t n, uint8_t *upper, uint8_t *lower, uint16_t sm[2]) {
    float mn = INFINITY, mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]); /* fminf/fmaxf drop NaN */
    if (!(mn <= mx)) mn = mx = 0.0f;                                            /* all NaN */
    sm[1] = fp16_directed(mn, false);
    const float M = osp_fp16_to_fp32(sm[1]);
    sm[0] = mx > M ? fp16_directed((mx - M) / 15.0f, true) : 0;
    const float S = osp_fp16_to_fp32(sm[0]);
    for (int64_t i = 0; i < n; i += 2) {
        uint8_t u[2] = {0, 0}, l[2] = {8, 8};
        for (int j = 0; j < 2 && S > 0.0f; j++) {
            const float v = x[i + j];
            float cu = rintf((v - M) / S);
            cu = cu < 0.0f ? 0.0f : cu > 15.0f ? 15.0f : cu; /* NaN stays NaN: the cast below is guarded */
            float cl = rintf((v - (M + S * cu)) * 16.0f / S + 7.5f);
            cl = cl < 0.0f ? 0.0f : cl > 15.0f ? 15.0f : cl;
            u[j] = cu == cu ? (uint8_t)cu : 0, l[j] = cl == cl ? (uint8_t)cl : 8;
        }
        upper[i / 2] = (uint8_t)(u[0] | (u[1] << 4));
        lower[i / 2] = (uint8_t)(l[0] | (l[1] << 4));
    }
}

void osp_int8h_dequantize_row(const uint8_t *upper, const uint8_t *lower, const uint16_t sm[2], float *y, int64_t n) {
    const float S = osp_fp16_to_fp32(sm[0]), M = osp_fp16_to_fp32(sm[1]), S32 = S * 0.03125f;
    for (int64_t i = 0; i < n; i++) {
        const int u = (upper[i / 2] >> (4 * (i & 1))) & 0xF;
        if (!lower) {
            y[i] = M + S * (float)u;
        } else {
            const int l = (lower[i / 2] >> (4 * (i & 1))) & 0xF;
            y[i] = M + S32 * (float)(32 * u + 2 * l - 15);
        }
    }
}
