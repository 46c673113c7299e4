/* A vector exp for the CPU backend's `--cpu-activations q8` mode (issue 21): softmax in attention and
 * SiLU there call it instead of glibc's expf, which was ~12 % of a SmolLM2 prompt in that mode. The
 * default (two-level) path keeps expf, so its bits and golden tests do not move.
 *
 * The arithmetic (written here, one definition, every kernel gives its bits):
 *   x  = min(89, x), then max(-104, x)         (NaN stays NaN: the compare order of vminps/vmaxps)
 *   n  = rne(x * log2(e))                      (the product rounded to float, then to an integer)
 *   r  = fma(n, -LN2_HI, x); r = fma(n, -LN2_LO, r)   (Cody-Waite: LN2_HI + LN2_LO = ln 2 to ~2^-40)
 *   p  = C6; p = fma(p, r, C5) ... fma(p, r, C1); p = fma(p, r, 1)   (|r| <= ln2 / 2 + a little)
 *   y  = p * 2^n                               (one rounding: vscalefps / ldexpf, exact unless it
 *                                               lands in the subnormals or overflows)
 * C1..C6 approximate (e^r - 1) / r on [-ln2/2, ln2/2] by a Chebyshev fit (computed for this file with
 * mpmath.chebyfit, then rounded to float; relative error of the float polynomial 1.04e-8 = 0.17 ulp of
 * 2^-24 before the evaluation's roundings). Beyond the clamps: e^89 > FLT_MAX gives +inf through the
 * scaling, e^-104 < 2^-150 gives +0, as expf does. tests/unit/test_vexp.c measures the error against
 * (float)exp((double)x) over a dense sweep of [-104, 89] (every 61st float) and [-1, 1] (every 7th):
 * at most 1 ulp, subnormal results included; and checks the scalar and AVX512 kernels give the same bits.
 *
 * Only the q8 mode uses it, and there everywhere (prefill tiles, decode, any batch), so a request's
 * tokens never depend on their batch. */
#ifndef OSP_BACKEND_CPU_VEXP_H
#define OSP_BACKEND_CPU_VEXP_H

#include <math.h>
#include <stdint.h>

#define OSP_VEXP_LO (-104.0f)
#define OSP_VEXP_HI 89.0f
#define OSP_VEXP_LOG2E 1.44269502162933349609375f /* log2(e) rounded to float */
#define OSP_VEXP_LN2_HI 0.693145751953125f         /* 0x3f317200: ln 2 to 16 bits, n * LN2_HI exact */
#define OSP_VEXP_LN2_LO 1.428606765330187045e-06f  /* ln 2 - LN2_HI */
#define OSP_VEXP_C6 0x1.6d4324p-10f
#define OSP_VEXP_C5 0x1.123d9p-7f
#define OSP_VEXP_C4 0x1.5554eap-5f
#define OSP_VEXP_C3 0x1.55547cp-3f
#define OSP_VEXP_C2 0.5f
#define OSP_VEXP_C1 1.0f

/* e^x for one float, the arithmetic above in scalar C (fmaf, nearbyintf in the default rounding mode,
 * ldexpf): the reference every vector kernel of the mode matches bit for bit, and the kernel itself
 * where the build has no AVX512. NaN in, the same quiet NaN out (x + x). */
static inline float osp_vexp_scalar(float x) {
    if (x != x) return x + x;
    x = OSP_VEXP_HI < x ? OSP_VEXP_HI : x;
    x = OSP_VEXP_LO > x ? OSP_VEXP_LO : x;
    const float t = x * OSP_VEXP_LOG2E;
    const float n = nearbyintf(t);
    float r = fmaf(n, -OSP_VEXP_LN2_HI, x);
    r = fmaf(n, -OSP_VEXP_LN2_LO, r);
    float p = OSP_VEXP_C6;
    p = fmaf(p, r, OSP_VEXP_C5);
    p = fmaf(p, r, OSP_VEXP_C4);
    p = fmaf(p, r, OSP_VEXP_C3);
    p = fmaf(p, r, OSP_VEXP_C2);
    p = fmaf(p, r, OSP_VEXP_C1);
    p = fmaf(p, r, 1.0f);
    return ldexpf(p, (int)n);
}

#if defined(__AVX512F__)
#include <immintrin.h>
/* osp_vexp_scalar on 16 lanes, lane for lane the same bits (NaN lanes: the quiet input NaN). */
static inline __m512 osp_vexp16(__m512 x) {
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    x = _mm512_min_ps(_mm512_set1_ps(OSP_VEXP_HI), x); /* hi < x ? hi : x */
    x = _mm512_max_ps(_mm512_set1_ps(OSP_VEXP_LO), x); /* lo > x ? lo : x */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(OSP_VEXP_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-OSP_VEXP_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-OSP_VEXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(OSP_VEXP_C6);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(OSP_VEXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(OSP_VEXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(OSP_VEXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(OSP_VEXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(OSP_VEXP_C1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512 y = _mm512_scalef_ps(p, n);
    return _mm512_mask_add_ps(y, nan, x, x);
}
#endif

#endif
