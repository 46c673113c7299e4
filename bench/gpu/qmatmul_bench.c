/* The quantized-weight kernels alone (src/backend/cuda/qmatmul.cu, issue 17), beside the device's
 * measured copy bandwidth and cuBLASLt on the bf16 copy of the same matrix, in one process:
 *   qmma       T = 1, 2, 8, 64, 512 rows (osp_cuda_qmatmul on activations quantized once before the
 *              timing), and "qx+qmma" with the activations' quantization inside each launch: weight
 *              bytes read per second
 *   qdequant   bf16 bytes written per second
 *   cuBLASLt   T = 1, 64, 512 on the bf16 copy (the --gpu-weights bf16 path): bf16 bytes read per second
 * Matrix: N x K (default 14336 x 4096, Llama-3.1-8B's gate / up), random block bytes with small fixed
 * scales (values do not change the time). Each figure: 5 warm-up launches, then the mean of `reps`
 * launches timed with events around all of them (the device's time, not the enqueue's).
 * Usage: qmatmul_bench [N K reps] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        osp_status s_ = (x);                                                                       \
        if (s_ != OSP_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, osp_last_error());                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *ev0, *ev1;

typedef osp_status (*launch_fn)(void *ctx);

static double time_ms(launch_fn f, void *ctx, int reps) {
    for (int i = 0; i < 5; i++) CHECK(f(ctx));
    CHECK(osp_cuda_event_record(ev0, NULL));
    for (int i = 0; i < reps; i++) CHECK(f(ctx));
    CHECK(osp_cuda_event_record(ev1, NULL));
    float ms;
    CHECK(osp_cuda_event_elapsed_ms(ev0, ev1, &ms));
    return (double)ms / reps;
}

typedef struct ctx {
    uint32_t type;
    void *w, *y, *src, *dst;
    uint16_t *x, *wb;
    size_t row_bytes, copy_bytes;
    int64_t N, K, T;
    osp_cuda_gemm *gemm;
    void *ws;
    size_t ws_bytes;
    osp_cuda_qx qx;
} ctx;

static osp_status run_qmma(void *p) {
    ctx *c = p;
    return osp_cuda_qmatmul(c->type, c->w, c->row_bytes, c->N, &c->qx, c->y, c->N, false, NULL);
}
static osp_status run_qx_qmma(void *p) {
    ctx *c = p;
    osp_status s = osp_cuda_qx_quantize(c->x, c->T, c->K, osp_cuda_qmatmul_group(c->type), c->ws, c->ws_bytes, &c->qx, NULL);
    return s != OSP_OK ? s : run_qmma(p);
}
static osp_status run_dequant(void *p) {
    ctx *c = p;
    return osp_cuda_qdequant_bf16(c->type, c->w, c->row_bytes, c->N, c->K, c->wb, NULL);
}
static osp_status run_gemm(void *p) {
    ctx *c = p;
    return osp_cuda_gemm_bf16(c->gemm, c->x, c->wb, c->y, false, c->T, c->N, c->K, NULL);
}
static osp_status run_copy(void *p) {
    ctx *c = p;
    return osp_cuda_d2d(c->dst, c->src, c->copy_bytes, NULL);
}

/* rows of random bytes with every block's f16 scale fields set to 2^-12 (make-random-model
 * --random-blocks' convention) */
static uint8_t *random_rows(uint32_t t, int64_t N, int64_t K, size_t *row_bytes) {
    const size_t rb = osp_dtype_row_size(t, K), bb = osp_dtype_type_size(t);
    uint8_t *h = malloc((size_t)N * rb);
    if (!h) exit(1);
    uint64_t z = 88172645463325252ull;
    for (size_t i = 0; i < (size_t)N * rb; i++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        h[i] = (uint8_t)z;
    }
    const uint16_t d = 0x0C00;
    const int d_off = t == OSP_DTYPE_Q6_K ? 208 : 0, m_off = (t == OSP_DTYPE_Q4_1 || t == OSP_DTYPE_Q4_K) ? 2 : -1;
    for (size_t b = 0; b < (size_t)N * rb / bb; b++) {
        memcpy(h + b * bb + d_off, &d, 2);
        if (m_off >= 0) memcpy(h + b * bb + m_off, &d, 2);
    }
    *row_bytes = rb;
    return h;
}

int main(int argc, char **argv) {
    const int64_t N = argc > 2 ? atoll(argv[1]) : 14336, K = argc > 2 ? atoll(argv[2]) : 4096;
    const int reps = argc > 3 ? atoi(argv[3]) : 50;
    if (osp_cuda_device_count() <= 0) {
        printf("qmatmul_bench: no CUDA device\n");
        return 77;
    }
    char name[256] = "";
    CHECK(osp_cuda_device_name(name, sizeof name));
    CHECK(osp_cuda_event_create(&ev0));
    CHECK(osp_cuda_event_create(&ev1));
    ctx c = {.N = N, .K = K};
    CHECK(osp_cuda_gemm_create(32u << 20, &c.gemm));
    c.copy_bytes = (size_t)1 << 30;
    CHECK(osp_cuda_malloc(&c.src, c.copy_bytes, "copy source"));
    CHECK(osp_cuda_malloc(&c.dst, c.copy_bytes, "copy destination"));
    CHECK(osp_cuda_memset(c.src, 1, c.copy_bytes, NULL));
    const double copy_ms = time_ms(run_copy, &c, 20);
    const double copy_gbs = 2.0 * (double)c.copy_bytes / copy_ms / 1e6; /* read + write */
    printf("# %s; N %lld, K %lld, %d launches a figure\n", name, (long long)N, (long long)K, reps);
    printf("copy (d2d, 1 GiB): %.1f GB/s (read + write)\n", copy_gbs);
    CHECK(osp_cuda_malloc((void **)&c.x, (size_t)512 * (size_t)K * 2, "x"));
    CHECK(osp_cuda_memset(c.x, 0x3c, (size_t)512 * (size_t)K * 2, NULL)); /* bf16 0x3c3c: ~0.011 */
    CHECK(osp_cuda_malloc(&c.y, (size_t)512 * (size_t)N * 4, "y"));
    c.ws_bytes = osp_cuda_qx_workspace_bytes(512, K);
    CHECK(osp_cuda_malloc(&c.ws, c.ws_bytes, "qx workspace"));
    CHECK(osp_cuda_malloc((void **)&c.wb, (size_t)N * (size_t)K * 2, "bf16 copy"));
    const uint32_t types[] = {OSP_DTYPE_Q4_K, OSP_DTYPE_Q6_K, OSP_DTYPE_Q8_0, OSP_DTYPE_Q4_0};
    printf("%-6s %-14s %10s %10s %8s\n", "type", "kernel", "us", "GB/s", "of copy");
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        c.type = types[i];
        uint8_t *h = random_rows(c.type, N, K, &c.row_bytes);
        const size_t wbytes = (size_t)N * c.row_bytes;
        CHECK(osp_cuda_malloc(&c.w, wbytes, "weights"));
        CHECK(osp_cuda_h2d(c.w, h, wbytes, NULL));
        CHECK(osp_cuda_stream_sync(NULL));
        free(h);
        const char *tn = osp_dtype_name(c.type);
        static const int64_t qTs[] = {1, 2, 8, 64, 512};
        for (size_t k = 0; k < sizeof qTs / sizeof qTs[0]; k++) {
            c.T = qTs[k];
            CHECK(osp_cuda_qx_quantize(c.x, c.T, K, osp_cuda_qmatmul_group(c.type), c.ws, c.ws_bytes, &c.qx, NULL));
            const double ms = time_ms(run_qmma, &c, reps), ms2 = time_ms(run_qx_qmma, &c, reps);
            char kn[32];
            snprintf(kn, sizeof kn, "qmma T=%lld", (long long)c.T);
            printf("%-6s %-14s %10.1f %10.1f %7.0f%%\n", tn, kn, ms * 1e3, (double)wbytes / ms / 1e6,
                   100.0 * (double)wbytes / ms / 1e6 / copy_gbs);
            snprintf(kn, sizeof kn, "qx+qmma T=%lld", (long long)c.T);
            printf("%-6s %-14s %10.1f %10.1f %7.0f%%\n", tn, kn, ms2 * 1e3, (double)wbytes / ms2 / 1e6,
                   100.0 * (double)wbytes / ms2 / 1e6 / copy_gbs);
        }
        const double dq = time_ms(run_dequant, &c, reps);
        printf("%-6s %-14s %10.1f %10.1f %7.0f%%\n", tn, "qdequant", dq * 1e3, (double)N * K * 2 / dq / 1e6,
               100.0 * (double)N * K * 2 / dq / 1e6 / copy_gbs);
        for (int64_t T = 1; T <= 512; T *= T == 1 ? 64 : 8) {
            c.T = T;
            const double gm = time_ms(run_gemm, &c, reps);
            char kn[32];
            snprintf(kn, sizeof kn, "cuBLAS T=%lld", (long long)T);
            printf("%-6s %-14s %10.1f %10.1f %7.0f%%\n", tn, kn, gm * 1e3, (double)N * K * 2 / gm / 1e6,
                   100.0 * (double)N * K * 2 / gm / 1e6 / copy_gbs);
        }
        osp_cuda_free(c.w);
    }
    return 0;
}
