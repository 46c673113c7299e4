/* Batch invariance of the bf16 GEMM (src/backend/cuda/gemm.cu: cuBLASLt, and gemm_skinny.cu for T <=
 * OSP_CUDA_SKINNY_MAX_T): a row of y = x w^T must have the same bits whatever the number of rows T
 * computed with it, because a request's rows are computed in steps whose size depends on the rest of
 * the batch (and on its prefix-cache hits). Checked on the 8B model's shapes (q/k/v fused, o, gate/up
 * fused, down), SmolLM2's gate/up and a shape with tails (N not a multiple of a tile, K not one of a
 * chunk): the first rows of T = 1 .. 256 (the skinny kernel's every token-tile width, and cuBLASLt past
 * it) against T = 2048's (cuBLASLt), bit for bit, for fp32 and bf16 outputs and an output with ldy > N.
 * That the skinny kernel's mma.sync chain gives cuBLASLt's unsplit bits is what this measures.
 * OSPREY_CUDA_GEMM_LOG=1 prints the algorithm, tile and split-K count cuBLASLt picked for each T;
 * OSPREY_CUDA_SKINNY_W / _STAGES pick the skinny kernel's shape (run under each by scripts/gpu-test.sh).
 * Skipped (77) without a CUDA device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cuda/cuda_ops.h"
#include "osprey/model.h"

static uint16_t bf16_of(uint32_t x) { /* a value in [-1, 1) as bf16 from a hash */
    x ^= x >> 16, x *= 0x7feb352d, x ^= x >> 15, x *= 0x846ca68b, x ^= x >> 16;
    const float f = (float)(int32_t)(x >> 8) / 8388608.0f - 1.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

#define TMAX 2048

/* The first rows of T = Ts[i] against T = TMAX's, bit for bit; outputs fp32 (y_f32) or bf16, rows ldy
 * apart (ldy >= N; the columns past N must stay untouched). */
static void check_out(osp_cuda_gemm *g, void *stream, const void *dx, const void *dw, void *dy, int64_t N, int64_t K,
                      bool y_f32, int64_t ldy) {
    static const int64_t Ts[] = {1, 2, 3, 4, 5, 8, 9, 11, 16, 17, 24, 32, 33, 40, 63, 64, 65, 256};
    const size_t esz = y_f32 ? 4 : 2, bytes = esz * (size_t)(TMAX * ldy);
    unsigned char *ref = malloc(bytes), *got = malloc(bytes);
    assert_true(ref && got);
    assert_int_equal(osp_cuda_memset(dy, 0x7f, bytes, stream), OSP_OK);
    assert_int_equal(osp_cuda_gemm_bf16_ld(g, dx, dw, dy, y_f32, TMAX, N, K, ldy, stream), OSP_OK);
    assert_int_equal(osp_cuda_d2h(ref, dy, bytes, stream), OSP_OK);
    assert_int_equal(osp_cuda_stream_sync(stream), OSP_OK);
    int bad = 0;
    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
        const int64_t T = Ts[t];
        assert_int_equal(osp_cuda_memset(dy, 0x7f, bytes, stream), OSP_OK); /* poison */
        assert_int_equal(osp_cuda_gemm_bf16_ld(g, dx, dw, dy, y_f32, T, N, K, ldy, stream), OSP_OK);
        assert_int_equal(osp_cuda_d2h(got, dy, bytes, stream), OSP_OK);
        assert_int_equal(osp_cuda_stream_sync(stream), OSP_OK);
        int64_t diff = 0;
        for (int64_t i = 0; i < T * ldy; i++) diff += memcmp(got + i * (int64_t)esz, ref + i * (int64_t)esz, esz) != 0;
        for (size_t i = esz * (size_t)(T * ldy); i < bytes; i++) diff += got[i] != 0x7f; /* rows past T untouched */
        if (diff) {
            fprintf(stderr, "N %lld K %lld (%s, ldy %lld): T = %lld gives %lld of %lld values other bits than T = %d\n",
                    (long long)N, (long long)K, y_f32 ? "fp32" : "bf16", (long long)ldy, (long long)T, (long long)diff,
                    (long long)(T * ldy), TMAX);
            bad++;
        }
    }
    free(ref), free(got);
    assert_int_equal(bad, 0);
}

static void check_shape(int64_t N, int64_t K) {
    void *stream = NULL, *dx = NULL, *dw = NULL, *dy = NULL;
    const int64_t ldy = N + 24;
    assert_int_equal(osp_cuda_stream_create(&stream), OSP_OK);
    uint16_t *x = malloc(sizeof *x * (size_t)(TMAX * K)), *w = malloc(sizeof *w * (size_t)(N * K));
    assert_true(x && w);
    for (int64_t i = 0; i < TMAX * K; i++) x[i] = bf16_of((uint32_t)i * 2u + 1u);
    for (int64_t i = 0; i < N * K; i++) w[i] = bf16_of((uint32_t)i * 2u);
    assert_int_equal(osp_cuda_malloc(&dx, sizeof *x * (size_t)(TMAX * K), "x"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dw, sizeof *w * (size_t)(N * K), "w"), OSP_OK);
    assert_int_equal(osp_cuda_malloc(&dy, 4u * (size_t)(TMAX * ldy), "y"), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dx, x, sizeof *x * (size_t)(TMAX * K), stream), OSP_OK);
    assert_int_equal(osp_cuda_h2d(dw, w, sizeof *w * (size_t)(N * K), stream), OSP_OK);
    osp_cuda_gemm *g = NULL;
    const char *wsmb = getenv("OSPREY_CUDA_GEMM_WS_MB"); /* the backend's knob: room for split-K partials */
    assert_int_equal(osp_cuda_gemm_create(wsmb && atoi(wsmb) > 0 ? (size_t)atoi(wsmb) << 20 : 32u << 20, &g), OSP_OK);
    check_out(g, stream, dx, dw, dy, N, K, true, N);
    check_out(g, stream, dx, dw, dy, N, K, false, N);
    check_out(g, stream, dx, dw, dy, N, K, false, ldy);
    osp_cuda_gemm_destroy(g);
    osp_cuda_free(dx);
    osp_cuda_free(dw);
    osp_cuda_free(dy);
    free(x), free(w);
}

static void test_8b_qkv(void **state) { (void)state, check_shape(6144, 4096); }
static void test_8b_o(void **state) { (void)state, check_shape(4096, 4096); }
static void test_8b_gate_up(void **state) { (void)state, check_shape(28672, 4096); }
static void test_8b_down(void **state) { (void)state, check_shape(4096, 14336); }
static void test_smollm2_gate_up(void **state) { (void)state, check_shape(3072, 576); }
/* 6.25 tiles of 32; K 896 = 3.5 chunks of 256 */
static void test_tails(void **state) { (void)state, check_shape(200, 896); }
/* more tiles than CTAs and fewer chunks than stages: the PDL prologue's stages span tiles (1.5 chunks
 * of 256, 3 of 128; 512.5 tiles of 32) */
static void test_stages_span_tiles(void **state) { (void)state, check_shape(16400, 384); }

int main(void) {
    if (osp_device_count(OSP_DEVICE_CUDA) == 0) {
        printf("test_gpu_gemm: skipped: no CUDA device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_8b_qkv),     cmocka_unit_test(test_8b_o),           cmocka_unit_test(test_8b_gate_up),
        cmocka_unit_test(test_8b_down),    cmocka_unit_test(test_smollm2_gate_up),
        cmocka_unit_test(test_tails),      cmocka_unit_test(test_stages_span_tiles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
