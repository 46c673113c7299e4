/* KV cache scale calibration (kv_calib.h says what is kept and how the scales are chosen). The
 * histograms are fixed-size, so a calibration run of any length holds a few MB; the candidate errors
 * are exact (the cache's own encoders), summed in double. */
#include "kv/kv_calib.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/status_internal.h"
#include "kv/kv_cache.h"

typedef struct head_acc {
    int64_t n, zeros, under;       /* values; exact zeros; 0 < |x| < 2^LOG2_MIN */
    double absmax, sumsq;
    int64_t hist[OSP_KVC_BINS];    /* |x| in [2^(LOG2_MIN + i / SUB), 2^(LOG2_MIN + (i + 1) / SUB)) */
    double sse_fp8[OSP_KVC_NCAND]; /* squared error under fp8 scale 2^(E_MIN + j) */
} head_acc;

typedef struct layer_acc {
    int64_t blocks, zero_blocks;
    double sumsq;
    int64_t hist[OSP_KVC_BINS];    /* micro-block amax, bins as head_acc.hist */
    double sse_nv[OSP_KVC_NCAND], sse_rot[OSP_KVC_NCAND]; /* nvfp4 under T = 2^(E_MIN + j): plain, rotated */
    double sse_search; /* nvfp4 at the default T with each micro-block's scale searched (see below) */
} layer_acc;

struct osp_kv_calib {
    int32_t n_layer, n_head_kv, head_dim;
    head_acc *heads;   /* [n_layer, 2, n_head_kv] */
    layer_acc *layers; /* [n_layer, 2] */
    float e4m3[256];   /* decode table */
};

static head_acc *head_of(const osp_kv_calib *c, int32_t l, int w, int32_t h) {
    return c->heads + ((size_t)l * 2 + (size_t)w) * (size_t)c->n_head_kv + (size_t)h;
}
static layer_acc *layer_of(const osp_kv_calib *c, int32_t l, int w) { return c->layers + (size_t)l * 2 + (size_t)w; }

osp_status osp_kv_calib_create(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, osp_kv_calib **out) {
    *out = NULL;
    if (n_layer <= 0 || n_head_kv <= 0 || head_dim <= 0 || head_dim % 16 || head_dim > 1024 ||
        n_layer > OSP_KVS_MAX_LAYERS || n_head_kv > OSP_KVS_MAX_HEADS)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv calibration: shape %d layers x %d KV heads x %d (head_dim a "
                                                  "multiple of 16, <= 1024)", n_layer, n_head_kv, head_dim);
    osp_kv_calib *c = calloc(1, sizeof *c);
    if (c) {
        c->heads = calloc((size_t)n_layer * 2 * (size_t)n_head_kv, sizeof *c->heads);
        c->layers = calloc((size_t)n_layer * 2, sizeof *c->layers);
    }
    if (!c || !c->heads || !c->layers) {
        osp_kv_calib_free(c);
        return osp_set_error(OSP_ERR_NOMEM, "kv calibration: out of memory");
    }
    c->n_layer = n_layer, c->n_head_kv = n_head_kv, c->head_dim = head_dim;
    for (int i = 0; i < 256; i++) c->e4m3[i] = osp_e4m3_to_fp32((uint8_t)i);
    *out = c;
    return OSP_OK;
}

void osp_kv_calib_free(osp_kv_calib *c) {
    if (!c) return;
    free(c->heads), free(c->layers), free(c);
}

static int bin_of(float a) { /* a > 0 */
    if (a < ldexpf(1.0f, OSP_KVC_LOG2_MIN)) return -1;
    int i = (int)floorf((log2f(a) - (float)OSP_KVC_LOG2_MIN) * (float)OSP_KVC_SUB);
    return i < 0 ? 0 : i >= OSP_KVC_BINS ? OSP_KVC_BINS - 1 : i;
}
static double bin_lo(int i) { return exp2((double)OSP_KVC_LOG2_MIN + (double)i / OSP_KVC_SUB); }
static double bin_hi(int i) { return bin_lo(i + 1); }

/* in-place orthonormal Walsh-Hadamard transform of x[n], n a power of two */
static void fwht(float *x, int n) {
    for (int len = 1; len < n; len <<= 1)
        for (int i = 0; i < n; i += 2 * len)
            for (int j = i; j < i + len; j++) {
                const float a = x[j], b = x[j + len];
                x[j] = a + b, x[j + len] = a - b;
            }
    const float s = 1.0f / sqrtf((float)n);
    for (int i = 0; i < n; i++) x[i] *= s;
}

static void nvfp4_sse(const float *x, int n, double *sse) {
    uint8_t packed[8], sc;
    float y[16];
    for (int j = 0; j < OSP_KVC_NCAND; j++) {
        const float t = ldexpf(1.0f, OSP_KVC_E_MIN + j);
        double e = 0;
        for (int b = 0; b < n; b += 16) {
            osp_nvfp4_quantize16(x + b, t, packed, &sc);
            osp_nvfp4_dequantize16(packed, sc, t, y);
            for (int i = 0; i < 16; i++) {
                const double d = (double)x[b + i] - (double)y[i];
                e += d * d;
            }
        }
        sse[j] += e;
    }
}

/* NVFP4 with the micro-block scale searched instead of amax / 6: of the E4M3 scale codes c0 - 3 .. c0
 * + 1 around the amax code c0, the one with the least squared error of the block (a smaller scale
 * clips the largest value to 6 but resolves the rest more finely). Measured only: the pages use amax /
 * 6 (kv_cache.h), and a searched scale would have to be the same on every backend's encoder. */
static double nvfp4_searched_sse(const osp_kv_calib *c, const float *x, float t) {
    uint8_t packed[8], c0;
    float y[16];
    osp_nvfp4_quantize16(x, t, packed, &c0);
    osp_nvfp4_dequantize16(packed, c0, t, y);
    double best = 0;
    for (int i = 0; i < 16; i++) best += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    const int base = c0 & 0x7F;
    for (int code = base - 3; code <= base + 1; code++) {
        if (code <= 0 || code >= 0x7F || code == base) continue;
        const float s = c->e4m3[code] * t;
        double e = 0;
        for (int i = 0; i < 16; i++) {
            const double q = (double)(osp_e2m1_to_fp32(osp_fp32_to_e2m1(x[i] / s)) * s);
            e += ((double)x[i] - q) * ((double)x[i] - q);
        }
        if (e < best) best = e;
    }
    return best;
}

void osp_kv_calib_add_rows(osp_kv_calib *c, int32_t layer, int which, const float *rows, int64_t n_tokens) {
    const int32_t H = c->n_head_kv, D = c->head_dim;
    const bool pow2 = (D & (D - 1)) == 0;
    layer_acc *la = layer_of(c, layer, which);
    float inv[OSP_KVC_NCAND], sc[OSP_KVC_NCAND], rot[1024];
    for (int j = 0; j < OSP_KVC_NCAND; j++) sc[j] = ldexpf(1.0f, OSP_KVC_E_MIN + j), inv[j] = 1.0f / sc[j];
    for (int64_t t = 0; t < n_tokens; t++)
        for (int32_t h = 0; h < H; h++) {
            const float *x = rows + ((size_t)t * (size_t)H + (size_t)h) * (size_t)D;
            head_acc *ha = head_of(c, layer, which, h);
            for (int32_t d = 0; d < D; d++) {
                const float a = fabsf(x[d]);
                if (!isfinite(a)) continue; /* a non-finite activation is not a scale's business */
                ha->n++;
                ha->sumsq += (double)a * a;
                if (a > ha->absmax) ha->absmax = a;
                if (a == 0.0f) ha->zeros++;
                else {
                    const int b = bin_of(a);
                    if (b < 0) ha->under++;
                    else ha->hist[b]++;
                }
                for (int j = 0; j < OSP_KVC_NCAND; j++) {
                    const double q = (double)(c->e4m3[osp_fp32_to_e4m3(x[d] * inv[j])] * sc[j]);
                    ha->sse_fp8[j] += ((double)x[d] - q) * ((double)x[d] - q);
                }
            }
            for (int32_t b = 0; b < D; b += 16) {
                float amax = 0;
                for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[b + i]));
                la->blocks++;
                if (amax == 0.0f) la->zero_blocks++;
                else {
                    const int k = bin_of(amax);
                    la->hist[k < 0 ? 0 : k]++;
                }
            }
            for (int32_t d = 0; d < D; d++) la->sumsq += (double)x[d] * x[d];
            nvfp4_sse(x, D, la->sse_nv);
            for (int32_t b = 0; b < D; b += 16) la->sse_search += nvfp4_searched_sse(c, x + b, OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE);
            if (pow2) {
                memcpy(rot, x, (size_t)D * sizeof *rot);
                fwht(rot, D);
                nvfp4_sse(rot, D, la->sse_rot);
            }
        }
}

osp_status osp_kv_calib_add_cache(osp_kv_calib *c, const osp_kv_cache *kv, const int32_t *block_table,
                                  int32_t n_tokens) {
    if (kv->k_fmt.dtype != OSP_KV_DTYPE_F32 || kv->v_fmt.dtype != OSP_KV_DTYPE_F32 || kv->n_layer != c->n_layer ||
        kv->k_fmt.kv_row != (int64_t)c->n_head_kv * c->head_dim || kv->k_fmt.head_dim != c->head_dim)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv calibration: needs an f32 cache of %d layers x %d KV heads x %d",
                             c->n_layer, c->n_head_kv, c->head_dim);
    const int32_t bs = kv->block_size;
    for (int32_t b = 0; b < (n_tokens + bs - 1) / bs; b++)
        if (block_table[b] < 0 || block_table[b] >= kv->num_blocks)
            return osp_set_error(OSP_ERR_INVALID_ARG, "kv calibration: block id %d outside the cache's %d",
                                 block_table[b], kv->num_blocks);
    const size_t row = (size_t)kv->k_fmt.kv_row;
    for (int32_t l = 0; l < c->n_layer; l++)
        for (int w = 0; w < 2; w++) {
            const float *pages = (const float *)(w ? kv->v[l] : kv->k[l]);
            for (int32_t p0 = 0; p0 < n_tokens; p0 += bs) { /* a block's slots are consecutive */
                const int32_t n = n_tokens - p0 < bs ? n_tokens - p0 : bs;
                osp_kv_calib_add_rows(c, l, w, pages + (size_t)block_table[p0 / bs] * (size_t)bs * row, n);
            }
        }
    return OSP_OK;
}

/* the value below which a share q of the counted values lie (upper bin edge) */
static double percentile(int64_t n, int64_t low, const int64_t *hist, double q) {
    const double want = q * (double)n;
    double acc = (double)low;
    if (acc >= want) return bin_lo(0);
    for (int i = 0; i < OSP_KVC_BINS; i++) {
        acc += (double)hist[i];
        if (acc >= want) return bin_hi(i);
    }
    return bin_hi(OSP_KVC_BINS - 1);
}

void osp_kv_calib_stats_of(const osp_kv_calib *c, int32_t layer, int which, int32_t head, osp_kv_calib_stats *out) {
    memset(out, 0, sizeof *out);
    static _Thread_local int64_t hist[OSP_KVC_BINS];
    memset(hist, 0, sizeof hist);
    int64_t low = 0;
    double sumsq = 0;
    for (int32_t h = head < 0 ? 0 : head; h < (head < 0 ? c->n_head_kv : head + 1); h++) {
        const head_acc *ha = head_of(c, layer, which, h);
        out->n += ha->n, low += ha->zeros + ha->under, sumsq += ha->sumsq;
        if (ha->absmax > out->absmax) out->absmax = ha->absmax;
        for (int i = 0; i < OSP_KVC_BINS; i++) hist[i] += ha->hist[i];
    }
    if (!out->n) return;
    out->rms = sqrt(sumsq / (double)out->n);
    out->p999 = percentile(out->n, low, hist, 0.999);
    out->p9999 = percentile(out->n, low, hist, 0.9999);
    if (out->p999 > out->absmax) out->p999 = out->absmax;
    if (out->p9999 > out->absmax) out->p9999 = out->absmax;
    int64_t above = 0;
    for (int i = 0; i < OSP_KVC_BINS; i++)
        if (bin_lo(i) >= OSP_KVC_OUTLIER_RMS * out->rms) above += hist[i];
    out->outlier_share = (double)above / (double)out->n;
}

void osp_kv_calib_nvfp4_rates_of(const osp_kv_calib *c, int32_t layer, int which, float t,
                                 osp_kv_calib_nvfp4_rates *out) {
    memset(out, 0, sizeof *out);
    const layer_acc *la = layer_of(c, layer, which);
    const int64_t nz = la->blocks - la->zero_blocks;
    if (nz <= 0) return;
    for (int i = 0; i < OSP_KVC_BINS; i++) {
        if (!la->hist[i]) continue;
        const double s = sqrt(bin_lo(i) * bin_hi(i)) / 6.0 / (double)t; /* the bin's geometric middle */
        if (s > 448.0) out->saturated += (double)la->hist[i];
        if (s < 0x1p-6) out->subnormal += (double)la->hist[i];
        if (s < 0x1p-10) out->zero += (double)la->hist[i];
    }
    out->saturated /= (double)nz, out->subnormal /= (double)nz, out->zero /= (double)nz;
}

static int cand_of(float s) {
    int e;
    const float m = frexpf(s, &e); /* s = m 2^e, m in [0.5, 1) */
    if (m != 0.5f || e - 1 < OSP_KVC_E_MIN || e - 1 > OSP_KVC_E_MAX) return -1;
    return e - 1 - OSP_KVC_E_MIN;
}

double osp_kv_calib_fp8_rel_err(const osp_kv_calib *c, int32_t layer, int which, const float *fp8) {
    double e = 0, x2 = 0;
    for (int32_t h = 0; h < c->n_head_kv; h++) {
        const int j = cand_of(fp8[h]);
        if (j < 0) return NAN;
        const head_acc *ha = head_of(c, layer, which, h);
        e += ha->sse_fp8[j], x2 += ha->sumsq;
    }
    return x2 > 0 ? e / x2 : NAN;
}

double osp_kv_calib_nvfp4_rel_err(const osp_kv_calib *c, int32_t layer, int which, float t, int rotated) {
    const int j = cand_of(t);
    const layer_acc *la = layer_of(c, layer, which);
    if (j < 0 || !(la->sumsq > 0)) return NAN;
    if (rotated && (c->head_dim & (c->head_dim - 1))) return NAN;
    return (rotated ? la->sse_rot[j] : la->sse_nv[j]) / la->sumsq;
}

double osp_kv_calib_nvfp4_searched_rel_err(const osp_kv_calib *c, int32_t layer, int which) {
    const layer_acc *la = layer_of(c, layer, which);
    return la->sumsq > 0 ? la->sse_search / la->sumsq : NAN;
}

/* The candidate to keep: the error is flat over a wide run of scales (powers of two only move which
 * values fall into E4M3's subnormals or saturate), and the edges of that run are where a text other
 * than the calibration text would start to underflow or clip. So: the middle of the run of candidates
 * whose error is within OSP_KVC_FLAT of the least (rounded towards `dflt`, the documented default). */
static int best_of(const double *sse, int dflt) {
    int best = 0;
    for (int j = 1; j < OSP_KVC_NCAND; j++)
        if (sse[j] < sse[best]) best = j;
    const double lim = sse[best] * (1.0 + OSP_KVC_FLAT);
    int lo = best, hi = best;
    while (lo > 0 && sse[lo - 1] <= lim) lo--;
    while (hi < OSP_KVC_NCAND - 1 && sse[hi + 1] <= lim) hi++;
    const int mid2 = lo + hi; /* twice the middle */
    return mid2 % 2 == 0 ? mid2 / 2 : (mid2 / 2 + (dflt > mid2 / 2 ? 1 : 0));
}

/* the largest micro-block amax (upper edge of the highest non-empty bin) or its 99.99th percentile */
static double block_amax(const layer_acc *la, bool p9999) {
    const int64_t nz = la->blocks - la->zero_blocks;
    if (nz <= 0) return 0;
    if (p9999) return percentile(nz, 0, la->hist, 0.9999);
    for (int i = OSP_KVC_BINS - 1; i >= 0; i--)
        if (la->hist[i]) return bin_hi(i);
    return 0;
}

static float range_scale(double x, double top, float dflt) {
    const double s = x / top;
    return s >= OSP_KVS_MIN_SCALE && s <= OSP_KVS_MAX_SCALE && isfinite(s) ? (float)s : dflt;
}

osp_status osp_kv_calib_choose(const osp_kv_calib *c, osp_kv_calib_rule rule, osp_kv_scales *out) {
    if (!c->heads[0].n) return osp_set_error(OSP_ERR_INVALID_ARG, "kv calibration: no rows were added");
    if (rule != OSP_KVC_RULE_MSE && rule != OSP_KVC_RULE_ABSMAX && rule != OSP_KVC_RULE_P9999)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv calibration: unknown rule %d", (int)rule);
    if (rule != OSP_KVC_RULE_MSE) {
        OSP_TRY(osp_kv_scales_init(out, (uint32_t)c->n_layer, (uint32_t)c->n_head_kv, (uint32_t)c->head_dim));
        const bool p = rule == OSP_KVC_RULE_P9999;
        for (int32_t l = 0; l < c->n_layer; l++)
            for (int w = 0; w < 2; w++) {
                float *f8 = (w ? out->fp8_v : out->fp8_k) + (size_t)l * (size_t)c->n_head_kv;
                for (int32_t h = 0; h < c->n_head_kv; h++) {
                    osp_kv_calib_stats st;
                    osp_kv_calib_stats_of(c, l, w, h, &st);
                    f8[h] = range_scale(p ? st.p9999 : st.absmax, 448.0, OSP_KV_FP8_DEFAULT_SCALE);
                }
                (w ? out->nvfp4_v : out->nvfp4_k)[l] =
                    range_scale(block_amax(layer_of(c, l, w), p), 6.0 * 448.0, OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE);
            }
        return OSP_OK;
    }
    OSP_TRY(osp_kv_scales_init(out, (uint32_t)c->n_layer, (uint32_t)c->n_head_kv, (uint32_t)c->head_dim));
    const int d8 = cand_of(OSP_KV_FP8_DEFAULT_SCALE), d4 = cand_of(OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE);
    for (int32_t l = 0; l < c->n_layer; l++)
        for (int w = 0; w < 2; w++) {
            float *f8 = (w ? out->fp8_v : out->fp8_k) + (size_t)l * (size_t)c->n_head_kv;
            for (int32_t h = 0; h < c->n_head_kv; h++)
                f8[h] = ldexpf(1.0f, OSP_KVC_E_MIN + best_of(head_of(c, l, w, h)->sse_fp8, d8));
            (w ? out->nvfp4_v : out->nvfp4_k)[l] = ldexpf(1.0f, OSP_KVC_E_MIN + best_of(layer_of(c, l, w)->sse_nv, d4));
        }
    return OSP_OK;
}
