/* KV cache scale calibration (issue 13, `osprey calibrate-kv`): statistics of the K and V rows a model
 * writes for a calibration text, and the fixed scales (src/format/kv_scales.h) that minimise the
 * reconstruction error of the quantized pages.
 *
 * Fed with the fp32 rows of an f32 cache after each forward pass (post-RoPE K and V, exactly what a
 * quantized cache would quantize), it keeps, per layer, K or V and KV head:
 *  - absmax, sum of squares, count, and a log2 histogram of |x| (OSP_KVC_SUB bins an octave over
 *    [2^OSP_KVC_LOG2_MIN, 2^OSP_KVC_LOG2_MAX), plus zeros and values below the range), from which the
 *    99.9 / 99.99 percentiles (upper bin edge: within 2^(1/OSP_KVC_SUB) = 2.2 % above) and the outlier
 *    share (values above OSP_KVC_OUTLIER_RMS x the head's RMS) are read;
 *  - the exact squared error of FP8 E4M3 storage under each candidate per-head scale s = 2^e,
 *    e in [OSP_KVC_E_MIN, OSP_KVC_E_MAX] (powers of two: dequantizing multiplies exactly, and any other
 *    s only moves E4M3's relative grid by less than one step);
 * and per layer, K or V:
 *  - a log2 histogram of NVFP4 micro-block amax (16 consecutive head_dim values of one token and KV
 *    head), from which the share of micro-blocks whose E4M3 scale amax / 6 / T would saturate (> 448),
 *    be subnormal (< 2^-6) or round to zero (< 2^-10) under a tensor scale T is read;
 *  - the exact squared error of NVFP4 storage (core/dtype.c's osp_nvfp4_quantize16, the cache's own
 *    encoder) under each candidate tensor scale T = 2^e, and the same for the rows first rotated by
 *    the orthonormal Walsh-Hadamard transform along head_dim (QuaRot, Ashkboos et al. 2024, §3; what
 *    the error would be if keys and queries, values and outputs, were rotated; measured only, the
 *    pages do not rotate).
 * The chosen scales minimise the squared error: per head for FP8, per layer for NVFP4. The error is
 * flat over a wide run of scales, so of the candidates within OSP_KVC_FLAT of the least error the
 * middle one is kept (the most headroom against underflow and saturation on another text). Internal
 * to src/. */
#ifndef OSP_KV_KV_CALIB_H
#define OSP_KV_KV_CALIB_H

#include <stdint.h>

#include "backend/kv_layout.h"
#include "format/kv_scales.h"
#include "kv/kv_cache.h" /* the default scales, OSP_KV_*_DEFAULT_* */
#include "osprey/status.h"

#define OSP_KVC_SUB 32
#define OSP_KVC_LOG2_MIN (-24)
#define OSP_KVC_LOG2_MAX 16
#define OSP_KVC_BINS ((OSP_KVC_LOG2_MAX - OSP_KVC_LOG2_MIN) * OSP_KVC_SUB)
#define OSP_KVC_E_MIN (-16)
#define OSP_KVC_E_MAX 2
#define OSP_KVC_NCAND (OSP_KVC_E_MAX - OSP_KVC_E_MIN + 1)
#define OSP_KVC_OUTLIER_RMS 6.0
#define OSP_KVC_FLAT 1e-3 /* candidates within 0.1 % of the least error count as equally good */

typedef struct osp_kv_calib osp_kv_calib;

/* Statistics of one layer's K (which 0) or V (1), one KV head (head >= 0) or all heads (head -1). */
typedef struct osp_kv_calib_stats {
    int64_t n;              /* values seen */
    double absmax, rms;     /* max |x|, sqrt(mean x^2) */
    double p999, p9999;     /* 99.9th and 99.99th percentile of |x| (upper bin edge) */
    double outlier_share;   /* share of values with |x| > OSP_KVC_OUTLIER_RMS * rms (head >= 0 only) */
} osp_kv_calib_stats;

/* Micro-block scale behaviour of one layer's K or V under NVFP4 tensor scale t (shares of micro-blocks,
 * all-zero micro-blocks excluded): scale amax / 6 / t above 448 (saturates: its values clamp), below
 * 2^-6 (a subnormal E4M3 scale: fewer mantissa bits), below 2^-10 (rounds to a zero scale: the block
 * reads back as zeros). */
typedef struct osp_kv_calib_nvfp4_rates {
    double saturated, subnormal, zero;
} osp_kv_calib_nvfp4_rates;

/* A calibrator for a cache shape (head_dim a multiple of 16, <= 1024). OSP_ERR_INVALID_ARG, OSP_ERR_NOMEM. */
osp_status osp_kv_calib_create(int32_t n_layer, int32_t n_head_kv, int32_t head_dim, osp_kv_calib **out);
void osp_kv_calib_free(osp_kv_calib *c);

/* Adds the rows of tokens [0, n_tokens) of one sequence held in `kv`, an f32 cache on the host (the CPU
 * backend) of the calibrator's shape, whose token p sits at slot block_table[p / block_size] *
 * block_size + p % block_size. OSP_ERR_INVALID_ARG for another dtype or shape, a block id out of the
 * cache; nothing is added then. */
osp_status osp_kv_calib_add_cache(osp_kv_calib *c, const osp_kv_cache *kv, const int32_t *block_table,
                                  int32_t n_tokens);
/* Adds rows [n_tokens, n_head_kv, head_dim] fp32 of layer's K (which 0) or V (1). */
void osp_kv_calib_add_rows(osp_kv_calib *c, int32_t layer, int which, const float *rows, int64_t n_tokens);

void osp_kv_calib_stats_of(const osp_kv_calib *c, int32_t layer, int which, int32_t head, osp_kv_calib_stats *out);
void osp_kv_calib_nvfp4_rates_of(const osp_kv_calib *c, int32_t layer, int which, float t,
                                 osp_kv_calib_nvfp4_rates *out);
/* Relative squared error sum (x - q(x))^2 / sum x^2 of one layer's K or V (all heads) under: fp8 with
 * per-head scales fp8[n_head_kv] (each must be a candidate 2^e), or nvfp4 with tensor scale t (a
 * candidate) on plain (rotated 0) or Hadamard-rotated (1) rows. NaN when no values were seen or a
 * scale is not a candidate. */
double osp_kv_calib_fp8_rel_err(const osp_kv_calib *c, int32_t layer, int which, const float *fp8);
double osp_kv_calib_nvfp4_rel_err(const osp_kv_calib *c, int32_t layer, int which, float t, int rotated);
/* The same for nvfp4 at the default tensor scale with each micro-block's E4M3 scale searched over the
 * codes c0 - 3 .. c0 + 1 around amax / 6's code c0 for the least error (measured only: not what the
 * pages store). */
double osp_kv_calib_nvfp4_searched_rel_err(const osp_kv_calib *c, int32_t layer, int which);

/* How the scales are chosen:
 *  MSE     the least squared error over the power-of-two candidates (see above);
 *  ABSMAX  the range rule: fp8 s = absmax / 448 per head (the largest value lands on E4M3's largest);
 *          nvfp4 T = largest micro-block amax / (6 * 448) per layer (its block scale lands on 448);
 *  P9999   the same with the 99.99th percentile in place of the maximum (values above it clip). */
typedef enum osp_kv_calib_rule { OSP_KVC_RULE_MSE, OSP_KVC_RULE_ABSMAX, OSP_KVC_RULE_P9999 } osp_kv_calib_rule;

/* The scales of `rule` into *out (osp_kv_scales_init'd here; free with osp_kv_scales_free); a head or
 * layer that saw only zeros keeps the documented default. OSP_ERR_INVALID_ARG when no rows were added
 * or the rule is unknown, OSP_ERR_NOMEM. */
osp_status osp_kv_calib_choose(const osp_kv_calib *c, osp_kv_calib_rule rule, osp_kv_scales *out);

#endif
