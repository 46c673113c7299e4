/* Quantized weights on the GPU (issue 17; src/backend/cuda/qmatmul.cu) against the CPU:
 *  - osp_cuda_qdequant_bf16 equals core/dtype.c's osp_dequant_row rounded to bf16, bit for bit, for
 *    Q8_0, Q4_0, Q4_1, Q4_K and Q6_K rows (reference-quantized rows and rows of random bytes, so every
 *    bit pattern of the packed scales and quants is read), whole matrices and row ranges;
 *  - osp_cuda_qembed equals the bf16 table's values times the scale, bit for bit;
 *  - qmma (osp_cuda_qx_quantize + osp_cuda_qmatmul) is within its two-level activation bound for T
 *    1..130 against a double-precision sum over the CPU's fp32 weights (activations quantized in the
 *    type's group: 32 values for Q8_0 / Q4_0 / Q4_1, 256 for Q4_K / Q6_K), writes only its N columns of a
 *    wider output, and gives each row the same bits alone, in any batch, any 64-row chunk, either
 *    kernel mode and either split of the matrix into launches (batch invariance), also where the
 *    persistent kernels take several tiles a CTA;
 *  - the GLU kernel that writes its output quantized gives the bytes of the kernel followed by
 *    osp_cuda_qx_quantize, in either group, and so does the residual add + RMSNorm (x, out and the
 *    workspace, its row over several CTAs);
 *  - bad arguments are refused with the right status and nothing is launched.
 * Outputs are poisoned (0xff bytes: NaN) before each call, so unwritten values fail. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "core/quantize.h"
#include "gpu_test_mem.h"
#include "gpu_test_rng.h"

static const uint32_t k_types[] = {OSP_DTYPE_Q8_0, OSP_DTYPE_Q4_0, OSP_DTYPE_Q4_1, OSP_DTYPE_Q4_K, OSP_DTYPE_Q6_K};
#define N_TYPES (sizeof k_types / sizeof k_types[0])


/* A finite f16 of magnitude in [2^-12, 2^-4), either sign when `sign`. */
static uint16_t rnd_scale_f16(bool sign) {
    const uint16_t e = (uint16_t)(15 - 12 + rnd_int(8)), m = (uint16_t)rnd_int(1024);
    return (uint16_t)((sign && rnd_int(2) ? 0x8000u : 0u) | e << 10 | m);
}

/* Byte offsets of a block's f16 fields (d, and dmin / m where the type has one). */
static void half_fields(uint32_t t, int *d_off, int *m_off) {
    *m_off = -1;
    switch (t) {
    case OSP_DTYPE_Q4_1: *d_off = 0, *m_off = 2; break;
    case OSP_DTYPE_Q4_K: *d_off = 0, *m_off = 2; break;
    case OSP_DTYPE_Q6_K: *d_off = 208; break;
    default: *d_off = 0; break;
    }
}

/* rows x K of type t: even rows quantized from random values by core/quantize.c, odd rows random bytes
 * with finite f16 scales. */
static uint8_t *make_rows(uint32_t t, int64_t rows, int64_t K) {
    const size_t rb = osp_dtype_row_size(t, K), bb = osp_dtype_type_size(t);
    const int64_t nb = K / osp_dtype_block_size(t);
    uint8_t *w = xmalloc((size_t)rows * rb);
    float *v = xmalloc((size_t)K * sizeof *v);
    int d_off, m_off;
    half_fields(t, &d_off, &m_off);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = w + (size_t)r * rb;
        if (r % 2 == 0) {
            const float amp = 0.01f + 2.0f * (rnd_unit() + 1.0f);
            for (int64_t i = 0; i < K; i++) v[i] = amp * rnd_unit() * (rnd_int(16) == 0 ? 4.0f : 1.0f);
            assert_int_equal(osp_quantize_row(t, v, row, K), OSP_OK);
        } else {
            for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)rnd64();
            for (int64_t b = 0; b < nb; b++) {
                uint16_t h = rnd_scale_f16(t != OSP_DTYPE_Q4_K);
                memcpy(row + (size_t)b * bb + d_off, &h, 2);
                if (m_off >= 0) {
                    h = rnd_scale_f16(t == OSP_DTYPE_Q4_1);
                    memcpy(row + (size_t)b * bb + m_off, &h, 2);
                }
            }
        }
    }
    free(v);
    return w;
}

/* The CPU's fp32 values of rows x K. */
static float *cpu_dequant(uint32_t t, const uint8_t *w, int64_t rows, int64_t K) {
    const size_t rb = osp_dtype_row_size(t, K);
    float *f = xmalloc((size_t)rows * (size_t)K * sizeof *f);
    for (int64_t r = 0; r < rows; r++)
        assert_int_equal(osp_dequant_row(t, w + (size_t)r * rb, f + (size_t)r * (size_t)K, K), OSP_OK);
    return f;
}

static int64_t k_for(uint32_t t, int i) {
    static const int64_t small[] = {96, 512, 2048 + 32, 4096};
    static const int64_t big[] = {256, 768, 2048 + 256, 4096};
    return osp_dtype_block_size(t) == 256 ? big[i] : small[i];
}

static void test_dequant(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = k_types[ti];
        for (int ki = 0; ki < 4; ki++) {
            g_rng = 1000 + 10 * ti + (uint64_t)ki;
            const int64_t K = k_for(t, ki), rows = 37;
            const size_t rb = osp_dtype_row_size(t, K);
            uint8_t *w = make_rows(t, rows, K);
            float *ref = cpu_dequant(t, w, rows, K);
            void *dw = dev_put(w, (size_t)rows * rb);
            uint16_t *dd = dev_alloc_fill((size_t)rows * (size_t)K * 2, 0xff);
            uint16_t *got = xmalloc((size_t)rows * (size_t)K * 2);
            /* the whole matrix, then rows [5, 29) into the start of a poisoned buffer */
            for (int pass = 0; pass < 2; pass++) {
                const int64_t r0 = pass ? 5 : 0, n = pass ? 24 : rows;
                assert_int_equal(osp_cuda_memset(dd, 0xff, (size_t)rows * (size_t)K * 2, NULL), OSP_OK);
                assert_int_equal(osp_cuda_qdequant_bf16(t, (const uint8_t *)dw + (size_t)r0 * rb, rb, n, K, dd, NULL), OSP_OK);
                dev_get(got, dd, (size_t)n * (size_t)K * 2);
                int64_t bad = 0;
                for (int64_t i = 0; i < n * K; i++) {
                    const uint16_t want = osp_fp32_to_bf16(ref[(size_t)r0 * (size_t)K + (size_t)i]);
                    if (got[i] != want && bad++ < 4)
                        printf("  %s K %lld row %lld col %lld: got 0x%04x, want 0x%04x (%g)\n", osp_dtype_name(t),
                               (long long)K, (long long)(r0 + i / K), (long long)(i % K), got[i], want,
                               (double)ref[(size_t)r0 * (size_t)K + (size_t)i]);
                }
                assert_int_equal(bad, 0);
            }
            printf("dequant %-4s K %5lld: %lld rows bit-identical to the CPU's (bf16)\n", osp_dtype_name(t), (long long)K,
                   (long long)rows);
            osp_cuda_free(dw), osp_cuda_free(dd);
            free(w), free(ref), free(got);
        }
    }
}

static void test_embed(void **state) {
    (void)state;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = k_types[ti];
        g_rng = 2000 + ti;
        const int64_t E = k_for(t, 1), V = 50, T = 13;
        const size_t rb = osp_dtype_row_size(t, E);
        uint8_t *w = make_rows(t, V, E);
        float *ref = cpu_dequant(t, w, V, E);
        int32_t ids[13];
        for (int i = 0; i < T; i++) ids[i] = rnd_int((int)V);
        ids[3] = ids[7]; /* a repeated id */
        const float scale = 1.7f;
        void *dw = dev_put(w, (size_t)V * rb), *di = dev_put(ids, sizeof ids);
        float *dx = dev_alloc_fill((size_t)T * (size_t)E * 4, 0xff), *got = xmalloc((size_t)T * (size_t)E * 4);
        assert_int_equal(osp_cuda_qembed(t, dw, rb, di, dx, T, E, scale, NULL), OSP_OK);
        dev_get(got, dx, (size_t)T * (size_t)E * 4);
        for (int64_t i = 0; i < T; i++)
            for (int64_t c = 0; c < E; c++) {
                const float want = osp_bf16_to_fp32(osp_fp32_to_bf16(ref[(size_t)ids[i] * (size_t)E + (size_t)c])) * scale;
                const float g = got[(size_t)i * (size_t)E + (size_t)c];
                if (memcmp(&g, &want, 4) != 0) {
                    printf("  %s embed row %lld col %lld: got %g want %g\n", osp_dtype_name(t), (long long)i, (long long)c,
                           (double)g, (double)want);
                    fail();
                }
            }
        printf("embed %-4s E %lld: %lld rows bit-identical to the bf16 table's\n", osp_dtype_name(t), (long long)E,
               (long long)T);
        osp_cuda_free(dw), osp_cuda_free(di), osp_cuda_free(dx);
        free(w), free(ref), free(got);
    }
}

/* qmma (osp_cuda_qx_quantize + osp_cuda_qmatmul) into columns [c0, c0 + N) of a [T, ldy] output for
 * T from 1 to 130 (three 64-row chunks), against a double-precision sum over the CPU's fp32 weights and
 * the bf16 activations. The bound: the activations' two-level quantization moves each value by at most
 * 1.5 d2 (d2 = its group's amax / 127 / 256, the group the type reads; 2 d2 allowed), plus fp32
 * rounding in each block's or unit's fold (a few ulps a block of everything it adds). Then batch invariance, bit for bit: rows of T = 130 alone
 * (T = 1) and as a batch of 9 starting at row 60 (rows that sat in two chunks), the bf16 output the
 * rounding of the fp32 one, and a non-finite activation row that leaves the others' bits untouched. */
static int64_t qmma_k_for(uint32_t t, int i) {
    static const int64_t small[] = {64, 576, 2048 + 64, 4096};
    static const int64_t big[] = {256, 768, 2048 + 256, 4096};
    return osp_dtype_block_size(t) == 256 ? big[i] : small[i];
}

static void run_qmma(uint32_t t, const void *dw, size_t rb, int64_t N, int64_t K, const uint16_t *dx, int64_t T,
                     void *ws, size_t ws_bytes, void *dy, int64_t ldy, bool f32) {
    osp_cuda_qx qx;
    assert_int_equal(osp_cuda_qx_quantize(dx, T, K, osp_cuda_qmatmul_group(t), ws, ws_bytes, &qx, NULL), OSP_OK);
    assert_int_equal(osp_cuda_qmatmul(t, dw, rb, N, &qx, dy, ldy, f32, NULL), OSP_OK);
}

static void test_qmma(void **state) {
    (void)state;
    static const int64_t Ts[] = {1, 2, 5, 8, 9, 17, 33, 64, 65, 130};
    enum { TMAX = 130 };
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = k_types[ti];
        for (int ki = 0; ki < 4; ki++) {
            g_rng = 5000 + 10 * ti + (uint64_t)ki;
            const int64_t K = qmma_k_for(t, ki), N = 67, c0 = 5, ldy = N + 11;
            assert_true(osp_cuda_qmatmul_supported(t, K));
            const size_t rb = osp_dtype_row_size(t, K);
            uint8_t *w = make_rows(t, N, K);
            float *wf = cpu_dequant(t, w, N, K);
            uint16_t *x = xmalloc((size_t)TMAX * (size_t)K * 2);
            for (int64_t i = 0; i < TMAX * K; i++)
                x[i] = osp_fp32_to_bf16(rnd_unit() * (rnd_int(32) ? 1.0f : 8.0f) * (i / K % 7 == 3 ? 1e-3f : 1.0f));
            const size_t ws_bytes = osp_cuda_qx_workspace_bytes(TMAX, K), ybytes = (size_t)TMAX * (size_t)ldy * 4;
            void *dw = dev_put(w, (size_t)N * rb), *ws = dev_alloc_fill(ws_bytes, 0x5a);
            uint16_t *dx = dev_put(x, (size_t)TMAX * (size_t)K * 2);
            void *dy = dev_alloc_fill(ybytes, 0xff);
            float *yf = xmalloc(ybytes), *yref = xmalloc(ybytes);
            uint16_t *yb = xmalloc(ybytes / 2);
            double max_rel = 0.0;
            for (size_t k = 0; k < sizeof Ts / sizeof Ts[0]; k++) {
                const int64_t T = Ts[k];
                assert_int_equal(osp_cuda_memset(dy, 0xff, ybytes, NULL), OSP_OK);
                run_qmma(t, dw, rb, N, K, dx, T, ws, ws_bytes, (float *)dy + c0, ldy, true);
                dev_get(yf, dy, (size_t)T * (size_t)ldy * 4);
                for (int64_t r = 0; r < T; r++) {
                    /* the row's block maxima, for the quantization bound */
                    for (int64_t c = 0; c < ldy; c++) {
                        const size_t i = (size_t)r * (size_t)ldy + (size_t)c;
                        if (c < c0 || c >= c0 + N) { /* untouched: still the poison */
                            assert_true(isnan(yf[i]));
                            continue;
                        }
                        const int64_t n = c - c0;
                        const float *wr = wf + (size_t)n * (size_t)K;
                        const uint16_t *xr = x + (size_t)r * (size_t)K;
                        double s = 0.0, a = 0.0, eq = 0.0, wmax = 0.0, xa = 0.0;
                        for (int64_t j = 0; j < K; j++) wmax = fmax(wmax, fabs((double)wr[j]));
                        const int64_t grp = osp_cuda_qmatmul_group(t);
                        for (int64_t b0 = 0; b0 < K; b0 += grp) {
                            double amax = 0.0;
                            for (int64_t j = b0; j < b0 + grp; j++) amax = fmax(amax, fabs((double)osp_bf16_to_fp32(xr[j])));
                            for (int64_t j = b0; j < b0 + grp; j++) {
                                const double xv = (double)osp_bf16_to_fp32(xr[j]), p = (double)wr[j] * xv;
                                s += p, a += fabs(p), xa += fabs(xv);
                                eq += fabs((double)wr[j]) * 2.0 * amax / 127.0 / 256.0;
                            }
                        }
                        const double tol = eq + (double)(K / 32 + 16) * 0x1p-22 * (a + wmax * xa) + 1e-30;
                        const double err = fabs((double)yf[i] - s);
                        if (!(err <= tol)) {
                            printf("  %s K %lld T %lld row %lld col %lld: got %.9g want %.9g (tol %.3g)\n",
                                   osp_dtype_name(t), (long long)K, (long long)T, (long long)r, (long long)n,
                                   (double)yf[i], s, tol);
                            fail();
                        }
                        if (a > 0) max_rel = fmax(max_rel, err / a);
                        if (T == TMAX) yref[i] = yf[i];
                    }
                }
            }
            /* invariance: rows alone, and 9 rows from row 60 (in T = 130 they sat in chunks 0 and 1) */
            static const int64_t alone[] = {0, 1, 7, 63, 64, 65, 129};
            for (size_t k = 0; k < sizeof alone / sizeof alone[0]; k++) {
                const int64_t r = alone[k];
                assert_int_equal(osp_cuda_memset(dy, 0xff, ybytes, NULL), OSP_OK);
                run_qmma(t, dw, rb, N, K, dx + (size_t)r * (size_t)K, 1, ws, ws_bytes, dy, N, true);
                dev_get(yf, dy, (size_t)N * 4);
                assert_memory_equal(yf, yref + (size_t)r * (size_t)ldy + (size_t)c0, (size_t)N * 4);
            }
            run_qmma(t, dw, rb, N, K, dx + (size_t)60 * (size_t)K, 9, ws, ws_bytes, dy, N, true);
            dev_get(yf, dy, (size_t)9 * (size_t)N * 4);
            for (int64_t r = 0; r < 9; r++)
                assert_memory_equal(yf + (size_t)r * (size_t)N, yref + (size_t)(60 + r) * (size_t)ldy + (size_t)c0,
                                    (size_t)N * 4);
            /* the rows in two launches of 40 and 27 rows (the CUDA backend runs adjacent parts of one type
             * as one launch): a row's bits do not depend on the launch or tile it is in, at T = 1 (the
             * persistent kernel) and T = 130 (the wide one) */
            for (int pass = 0; pass < 2; pass++) {
                const int64_t T = pass ? TMAX : 1, n1 = 40;
                assert_int_equal(osp_cuda_memset(dy, 0xff, ybytes, NULL), OSP_OK);
                run_qmma(t, dw, rb, n1, K, dx, T, ws, ws_bytes, (float *)dy + c0, ldy, true);
                run_qmma(t, (char *)dw + (size_t)n1 * rb, rb, N - n1, K, dx, T, ws, ws_bytes, (float *)dy + c0 + n1,
                         ldy, true);
                dev_get(yf, dy, (size_t)T * (size_t)ldy * 4);
                for (int64_t r = 0; r < T; r++)
                    assert_memory_equal(yf + (size_t)r * (size_t)ldy + (size_t)c0, yref + (size_t)r * (size_t)ldy + (size_t)c0,
                                        (size_t)N * 4);
            }
            /* bf16 output: the fp32 result rounded */
            run_qmma(t, dw, rb, N, K, dx, 33, ws, ws_bytes, dy, ldy, false);
            dev_get(yb, dy, (size_t)33 * (size_t)ldy * 2);
            for (int64_t r = 0; r < 33; r++)
                for (int64_t n = 0; n < N; n++) {
                    const size_t i = (size_t)r * (size_t)ldy + (size_t)n;
                    assert_int_equal(yb[i], osp_fp32_to_bf16(yref[i + (size_t)c0]));
                }
            /* a non-finite activation (row 3 of 9) makes only its row NaN */
            const uint16_t inf = 0x7f80;
            assert_int_equal(osp_cuda_h2d(dx + (size_t)63 * (size_t)K + (size_t)(K / 2), &inf, 2, NULL), OSP_OK);
            run_qmma(t, dw, rb, N, K, dx + (size_t)60 * (size_t)K, 9, ws, ws_bytes, dy, N, true);
            dev_get(yf, dy, (size_t)9 * (size_t)N * 4);
            for (int64_t r = 0; r < 9; r++)
                for (int64_t n = 0; n < N; n++) {
                    const float v = yf[(size_t)r * (size_t)N + (size_t)n];
                    if (r == 3) assert_true(isnan(v));
                    else assert_memory_equal(&v, &yref[(size_t)(60 + r) * (size_t)ldy + (size_t)(c0 + n)], 4);
                }
            printf("qmma %-4s K %5lld N %lld: T 1..130 within the two-level bound (max |err|/sum|p| %.2g), rows "
                   "bit-identical alone, moved and split over two launches, bf16 = rounded fp32, a NaN row stays its own\n",
                   osp_dtype_name(t), (long long)K, (long long)N, max_rel);
            osp_cuda_free(dw), osp_cuda_free(ws), osp_cuda_free(dx), osp_cuda_free(dy);
            free(w), free(wf), free(x), free(yf), free(yref), free(yb);
        }
    }
}

/* Matrices of more 16-row tiles than the device holds CTAs at once (6,000 rows: 375 tiles, against
 * 2-3 CTAs an SM), so the persistent and streamed kernels (T <= 8) take several tiles a CTA and run
 * their loads on across tiles: rows at T = 1 and T = 5 have the bits of T = 130 (the wide kernel). */
static void test_qmma_many_tiles(void **state) {
    (void)state;
    enum { TMAX = 130 };
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = k_types[ti];
        g_rng = 7000 + ti;
        const int64_t K = qmma_k_for(t, 2), N = 6000;
        const size_t rb = osp_dtype_row_size(t, K);
        uint8_t *w = make_rows(t, N, K);
        uint16_t *x = xmalloc((size_t)TMAX * (size_t)K * 2);
        for (int64_t i = 0; i < TMAX * K; i++) x[i] = osp_fp32_to_bf16(rnd_unit());
        const size_t ws_bytes = osp_cuda_qx_workspace_bytes(TMAX, K), ybytes = (size_t)TMAX * (size_t)N * 4;
        void *dw = dev_put(w, (size_t)N * rb), *ws = dev_alloc_fill(ws_bytes, 0x5a), *dy = dev_alloc_fill(ybytes, 0xff);
        uint16_t *dx = dev_put(x, (size_t)TMAX * (size_t)K * 2);
        float *yref = xmalloc(ybytes), *yf = xmalloc(ybytes);
        run_qmma(t, dw, rb, N, K, dx, TMAX, ws, ws_bytes, dy, N, true);
        dev_get(yref, dy, ybytes);
        static const int64_t first[] = {0, 129, 40};
        static const int64_t count[] = {1, 1, 5};
        for (int k = 0; k < 3; k++) {
            assert_int_equal(osp_cuda_memset(dy, 0xff, ybytes, NULL), OSP_OK);
            run_qmma(t, dw, rb, N, K, dx + (size_t)first[k] * (size_t)K, count[k], ws, ws_bytes, dy, N, true);
            dev_get(yf, dy, (size_t)count[k] * (size_t)N * 4);
            for (int64_t r = 0; r < count[k]; r++)
                assert_memory_equal(yf + (size_t)r * (size_t)N, yref + (size_t)(first[k] + r) * (size_t)N,
                                    (size_t)N * 4);
        }
        printf("qmma %-4s K %lld N %lld: rows at T = 1 and 5 bit-identical to T = %d\n", osp_dtype_name(t),
               (long long)K, (long long)N, TMAX);
        osp_cuda_free(dw), osp_cuda_free(ws), osp_cuda_free(dx), osp_cuda_free(dy);
        free(w), free(x), free(yref), free(yf);
    }
}

/* The producer that writes its output quantized (osp_cuda_glu_qx: the CUDA backend's fusion of the GLU
 * with the quantized matmul after it) against the two launches it replaces: the same bf16 output and
 * the same workspace bytes (codes and scales of every row up to Tp, the padding rows included), for
 * T = 1, 3 and 9 (Tp 8, 8, 16), widths of 128 and 17 blocks (group 32) and 128 and 24 (group 256),
 * silu and gelu. The workspaces start from different poison, so a byte written by one path and not
 * the other fails. */
static void test_fused_qx(void **state) {
    (void)state;
    static const int64_t Ts[] = {1, 3, 9};
    static const int64_t Fs[] = {4096, 544, 4096, 768};
    static const int32_t groups[] = {32, 32, 256, 256};
    g_rng = 9100;
    for (size_t fi = 0; fi < 4; fi++)
        for (size_t ti = 0; ti < 3; ti++) {
            const int64_t F = Fs[fi], T = Ts[ti];
            const int32_t grp = groups[fi];
            const size_t wsb = osp_cuda_qx_workspace_bytes(T, F), ob = (size_t)T * (size_t)F * 2;
            uint16_t *gu = xmalloc(2 * ob);
            for (int64_t i = 0; i < T * 2 * F; i++) gu[i] = osp_fp32_to_bf16(3.0f * rnd_unit());
            void *dgu = dev_put(gu, 2 * ob), *o1 = dev_alloc_fill(ob, 0x11), *o2 = dev_alloc_fill(ob, 0x22);
            void *ws1 = dev_alloc_fill(wsb, 0x5a), *ws2 = dev_alloc_fill(wsb, 0xa5);
            uint8_t *h1 = xmalloc(wsb + ob), *h2 = xmalloc(wsb + ob);
            for (int gelu = 0; gelu < 2; gelu++) {
                osp_cuda_qx q1, q2;
                assert_int_equal(osp_cuda_memset(ws1, 0x5a, wsb, NULL), OSP_OK);
                assert_int_equal(osp_cuda_memset(ws2, 0xa5, wsb, NULL), OSP_OK);
                assert_int_equal(gelu ? osp_cuda_gelu_mul(dgu, o1, T, F, NULL) : osp_cuda_silu_mul(dgu, o1, T, F, NULL),
                                 OSP_OK);
                assert_int_equal(osp_cuda_qx_quantize(o1, T, F, grp, ws1, wsb, &q1, NULL), OSP_OK);
                assert_int_equal(osp_cuda_glu_qx(dgu, o2, T, F, gelu, grp, ws2, wsb, &q2, NULL), OSP_OK);
                assert_true(q1.codes == ws1 && q2.codes == ws2 && q1.T == q2.T && q1.Tp == q2.Tp && q1.K == q2.K &&
                            q1.group == grp && q2.group == grp);
                assert_true((const char *)q2.scales - (const char *)q2.codes ==
                            (const char *)q1.scales - (const char *)q1.codes);
                dev_get(h1, ws1, wsb), dev_get(h2, ws2, wsb);
                assert_memory_equal(h1, h2, wsb);
                dev_get(h1, o1, ob), dev_get(h2, o2, ob);
                assert_memory_equal(h1, h2, ob);
            }
            printf("fused qx: F %lld T %lld group %d: glu_qx (silu, gelu) = the kernel + osp_cuda_qx_quantize, byte "
                   "for byte\n",
                   (long long)F, (long long)T, (int)grp);
            osp_cuda_free(dgu), osp_cuda_free(o1), osp_cuda_free(o2), osp_cuda_free(ws1), osp_cuda_free(ws2);
            free(gu), free(h1), free(h2);
        }
    /* refused: no workspace, a workspace too small, a width not whole blocks or groups, a group qmma
     * does not read */
    osp_cuda_qx q;
    void *d = dev_alloc_fill(4096 * 8, 0);
    assert_int_equal(osp_cuda_glu_qx(d, d, 1, 64, false, 32, NULL, 4096, &q, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_glu_qx(d, d, 1, 64, false, 32, d, osp_cuda_qx_workspace_bytes(1, 64) - 1, &q, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_glu_qx(d, d, 1, 48, false, 32, d, 4096, &q, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_glu_qx(d, d, 1, 288, false, 256, d, 4096 * 8, &q, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_glu_qx(d, d, 1, 64, false, 64, d, 4096, &q, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);
    osp_cuda_free(d);
}

/* The residual add + RMSNorm that writes its output quantized (osp_cuda_add_rmsnorm_qx: a row over
 * several CTAs, the residual updated in place behind a per-row arrival counter) against
 * osp_cuda_add_rmsnorm followed by osp_cuda_qx_quantize: the same x, the same out and the same
 * workspace bytes, for T = 1, 3 and 8, widths 4096 and 768 (group 256) and 4096 and 576 (group 32),
 * with and without delta (8, 3, 8 and 6 CTAs a row, so the row barriers see different counts in turn);
 * each case run 12 times from the same x (the barriers carry over between launches, and a CTA writing x
 * before another has read it would change a sum; every CTA does the same work before the barrier, so a
 * missing barrier might still pass: the test cannot force the race). */
static void test_fused_norm_qx(void **state) {
    (void)state;
    static const int64_t Ts[] = {1, 3, 8};
    static const int64_t Es[] = {4096, 768, 4096, 576};
    static const int32_t groups[] = {256, 256, 32, 32};
    const float eps = 1e-5f;
    unsigned *sync = dev_alloc_fill(16 * sizeof(unsigned), 0);
    g_rng = 9300;
    for (size_t ei = 0; ei < 4; ei++)
        for (size_t ti = 0; ti < 3; ti++)
            for (int with_delta = 0; with_delta < 2; with_delta++) {
                const int64_t E = Es[ei], T = Ts[ti];
                const int32_t grp = groups[ei];
                const size_t xb = (size_t)T * (size_t)E * 4, ob = (size_t)T * (size_t)E * 2;
                const size_t wsb = osp_cuda_qx_workspace_bytes(T, E);
                float *x = xmalloc(xb), *w = xmalloc((size_t)E * 4);
                uint16_t *dl = xmalloc(ob);
                for (int64_t i = 0; i < T * E; i++) {
                    x[i] = 4.0f * rnd_unit() * (rnd_int(64) ? 1.0f : 30.0f);
                    dl[i] = osp_fp32_to_bf16(2.0f * rnd_unit());
                }
                for (int64_t i = 0; i < E; i++) w[i] = 0.5f + rnd_unit();
                float *dx0 = dev_put(x, xb), *dxa = dev_alloc_fill(xb, 0), *dxb = dev_alloc_fill(xb, 0);
                float *dw = dev_put(w, (size_t)E * 4);
                uint16_t *ddl = dev_put(dl, ob), *oa = dev_alloc_fill(ob, 0x11), *obb = dev_alloc_fill(ob, 0x22);
                void *wsa = dev_alloc_fill(wsb, 0x5a), *wsbb = dev_alloc_fill(wsb, 0xa5);
                uint8_t *h1 = xmalloc(wsb + xb), *h2 = xmalloc(wsb + xb);
                const uint16_t *delta = with_delta ? ddl : NULL;
                osp_cuda_qx qa, qb;
                assert_int_equal(osp_cuda_d2d(dxa, dx0, xb, NULL), OSP_OK);
                assert_int_equal(osp_cuda_add_rmsnorm(dxa, delta, dw, oa, T, E, eps, NULL), OSP_OK);
                assert_int_equal(osp_cuda_qx_quantize(oa, T, E, grp, wsa, wsb, &qa, NULL), OSP_OK);
                for (int rep = 0; rep < 12; rep++) {
                    assert_int_equal(osp_cuda_d2d(dxb, dx0, xb, NULL), OSP_OK);
                    assert_int_equal(osp_cuda_memset(obb, 0x22, ob, NULL), OSP_OK);
                    assert_int_equal(osp_cuda_memset(wsbb, 0xa5, wsb, NULL), OSP_OK);
                    assert_int_equal(
                        osp_cuda_add_rmsnorm_qx(dxb, delta, dw, obb, T, E, eps, grp, sync, wsbb, wsb, &qb, NULL), OSP_OK);
                    assert_true(qb.codes == wsbb && qb.T == T && qb.Tp == qa.Tp && qb.K == E && qb.group == grp);
                    dev_get(h1, dxa, xb), dev_get(h2, dxb, xb);
                    assert_memory_equal(h1, h2, xb);
                    dev_get(h1, oa, ob), dev_get(h2, obb, ob);
                    assert_memory_equal(h1, h2, ob);
                    dev_get(h1, wsa, wsb), dev_get(h2, wsbb, wsb);
                    assert_memory_equal(h1, h2, wsb);
                }
                printf("fused norm qx: E %lld T %lld group %d %s: x, out and the workspace = add_rmsnorm + "
                       "osp_cuda_qx_quantize, byte for byte, 12 times\n",
                       (long long)E, (long long)T, (int)grp, with_delta ? "with delta" : "no delta");
                osp_cuda_free(dx0), osp_cuda_free(dxa), osp_cuda_free(dxb), osp_cuda_free(dw), osp_cuda_free(ddl);
                osp_cuda_free(oa), osp_cuda_free(obb), osp_cuda_free(wsa), osp_cuda_free(wsbb);
                free(x), free(w), free(dl), free(h1), free(h2);
            }
    /* refused: T past 8, a width not whole groups, no counters */
    osp_cuda_qx q;
    void *d = dev_alloc_fill(1 << 20, 0);
    assert_false(osp_cuda_add_rmsnorm_qx_supported(9, 4096, 256));
    assert_false(osp_cuda_add_rmsnorm_qx_supported(1, 4096 + 32, 256));
    assert_true(osp_cuda_add_rmsnorm_qx_supported(8, 576, 32));
    assert_int_equal(osp_cuda_add_rmsnorm_qx(d, NULL, d, d, 9, 256, eps, 256, sync, d, 1 << 20, &q, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_add_rmsnorm_qx(d, NULL, d, d, 1, 288, eps, 256, sync, d, 1 << 20, &q, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_add_rmsnorm_qx(d, NULL, d, d, 1, 256, eps, 256, NULL, d, 1 << 20, &q, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);
    osp_cuda_free(d), osp_cuda_free(sync);
}

static void test_arguments(void **state) {
    (void)state;
    const int64_t K = 256;
    const size_t rb = osp_dtype_row_size(OSP_DTYPE_Q4_K, K);
    void *dw = dev_alloc_fill(4 * rb, 0), *dx = dev_alloc_fill(16 * (size_t)K * 2, 0), *dy = dev_alloc_fill(4096, 0);
    assert_false(osp_cuda_qtype_supported(OSP_DTYPE_Q5_K));
    assert_false(osp_cuda_qtype_supported(OSP_DTYPE_F16));
    assert_true(osp_cuda_qtype_supported(OSP_DTYPE_Q6_K));
    assert_int_equal(osp_cuda_qdequant_bf16(OSP_DTYPE_Q4_K, dw, rb, 4, K, (uint16_t *)((char *)dy + 2), NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qembed(OSP_DTYPE_Q8_0, dw, 34, NULL, dy, 1, 32, 1.0f, NULL), OSP_ERR_INVALID_ARG);
    /* qmma: a width that is not whole units, a workspace too small, no activations */
    osp_cuda_qx qx;
    const size_t wsb = osp_cuda_qx_workspace_bytes(16, K);
    void *ws = dev_alloc_fill(wsb, 0);
    assert_false(osp_cuda_qmatmul_supported(OSP_DTYPE_Q4_1, 96));
    assert_false(osp_cuda_qmatmul_supported(OSP_DTYPE_Q5_K, 256));
    assert_int_equal(osp_cuda_qx_quantize(dx, 16, K, 256, ws, wsb - 1, &qx, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qx_quantize(dx, 1, 100, 32, ws, wsb, &qx, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qx_quantize(dx, 1, 288, 256, ws, wsb, &qx, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qx_quantize(dx, 1, K, 128, ws, wsb, &qx, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qx_quantize((const uint16_t *)((char *)dx + 2), 1, K, 256, ws, wsb, &qx, NULL),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qmatmul_group(OSP_DTYPE_Q4_K), 256);
    assert_int_equal(osp_cuda_qmatmul_group(OSP_DTYPE_Q4_1), 32);
    assert_int_equal(osp_cuda_qmatmul_group(OSP_DTYPE_Q5_K), 0);
    /* activations in the wrong group for the type */
    assert_int_equal(osp_cuda_qx_quantize(dx, 1, K, 32, ws, wsb, &qx, NULL), OSP_OK);
    assert_int_equal(osp_cuda_qmatmul(OSP_DTYPE_Q4_K, dw, rb, 4, &qx, dy, 4, true, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qx_quantize(dx, 1, K, 256, ws, wsb, &qx, NULL), OSP_OK);
    assert_int_equal(osp_cuda_qmatmul(OSP_DTYPE_Q4_0, dw, 144, 4, &qx, dy, 4, true, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qmatmul(OSP_DTYPE_Q5_K, dw, rb, 4, &qx, dy, 4, true, NULL), OSP_ERR_UNSUPPORTED);
    assert_int_equal(osp_cuda_qmatmul(OSP_DTYPE_Q4_K, dw, rb, 4, NULL, dy, 4, true, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qmatmul(OSP_DTYPE_Q4_K, dw, rb, 4, &qx, dy, 3, true, NULL), OSP_ERR_INVALID_ARG);
    /* rows that are not whole blocks, weights not 16-byte aligned for Q4_K */
    assert_int_equal(osp_cuda_qmatmul(OSP_DTYPE_Q4_K, dw, rb + 2, 4, &qx, dy, 4, true, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_qmatmul(OSP_DTYPE_Q4_K, (char *)dw + 4, rb, 4, &qx, dy, 4, true, NULL), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_stream_sync(NULL), OSP_OK);
    osp_cuda_free(dw), osp_cuda_free(dx), osp_cuda_free(dy), osp_cuda_free(ws);
}

int main(void) {
    if (osp_cuda_device_count() == 0) {
        printf("test_gpu_qmatmul: skipped: no CUDA device\n");
        return 77;
    }
    char name[256];
    if (osp_cuda_device_name(name, sizeof name) == OSP_OK) printf("device: %s\n", name);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arguments),
        cmocka_unit_test(test_dequant),
        cmocka_unit_test(test_embed),
        cmocka_unit_test(test_qmma),
        cmocka_unit_test(test_qmma_many_tiles),
        cmocka_unit_test(test_fused_qx),
        cmocka_unit_test(test_fused_norm_qx),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
