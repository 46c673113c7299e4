/* The bf16 weight path of a decode step (issue 17), beside the device's measured copy bandwidth, in one
 * process: y = x w^T for the 8B model's matrices at T = 1 .. 64 rows through
 *   skinny     osp_cuda_gemm_bf16 with OSPREY_CUDA_GEMM_SKINNY=64 (gemm_skinny.cu for T <= 64, no split-K)
 *   lt-split   cuBLASLt with every plan split as its T = 1 plan (the default path)
 *   lt-nosplit cuBLASLt without split-K (what the skinny kernel's bits equal)
 * Figures: us a launch and weight bytes read per second. Every matrix has enough copies to exceed
 * 256 MiB, used in turn, so the weights come from DRAM and not from the 50 MiB L2. Each figure: 5
 * warm-up launches, then the mean of `reps` launches timed with events around all of them (the
 * device's time, not the enqueue's).
 * Usage: gemm_bench [reps]        (prints one table; exit 77 without a device)
 * GEMM_BENCH_SKINNY_ONLY=1 times the skinny column only (with OSPREY_CUDA_SKINNY_W / _STAGES / _KC: tuning). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_ops.h"

#define CHECK(x)                                                                                   \
    do {                                                                                           \
        osp_status s_ = (x);                                                                       \
        if (s_ != OSP_OK) {                                                                        \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, osp_last_error());                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static void *ev0, *ev1;

typedef struct shape {
    const char *name;
    int64_t N, K;
} shape;

typedef struct run {
    osp_cuda_gemm *g;
    uint16_t *x, **w;
    void *y;
    int nw, next;
    int64_t T, N, K;
} run;

static double time_us(run *r, int reps) {
    for (int i = 0; i < 5; i++, r->next = (r->next + 1) % r->nw)
        CHECK(osp_cuda_gemm_bf16(r->g, r->x, r->w[r->next], r->y, false, r->T, r->N, r->K, NULL));
    CHECK(osp_cuda_event_record(ev0, NULL));
    for (int i = 0; i < reps; i++, r->next = (r->next + 1) % r->nw)
        CHECK(osp_cuda_gemm_bf16(r->g, r->x, r->w[r->next], r->y, false, r->T, r->N, r->K, NULL));
    CHECK(osp_cuda_event_record(ev1, NULL));
    float ms;
    CHECK(osp_cuda_event_elapsed_ms(ev0, ev1, &ms));
    return 1000.0 * (double)ms / reps;
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    if (osp_cuda_device_count() <= 0) {
        printf("gemm_bench: no CUDA device\n");
        return 77;
    }
    static const shape shapes[] = {
        {"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}, {"lm_head", 128256, 4096},
    };
    enum { NS = sizeof shapes / sizeof shapes[0] };
    static const int64_t Ts[] = {1, 2, 4, 8, 16, 32, 64};
    enum { NT = sizeof Ts / sizeof Ts[0] };
    char name[256] = "";
    CHECK(osp_cuda_device_name(name, sizeof name));
    CHECK(osp_cuda_event_create(&ev0));
    CHECK(osp_cuda_event_create(&ev1));
    /* copy bandwidth: 1 GiB device to device, read + write */
    const size_t copy_bytes = (size_t)1 << 30;
    void *src, *dst;
    CHECK(osp_cuda_malloc(&src, copy_bytes, "copy source"));
    CHECK(osp_cuda_malloc(&dst, copy_bytes, "copy destination"));
    CHECK(osp_cuda_memset(src, 1, copy_bytes, NULL));
    for (int i = 0; i < 3; i++) CHECK(osp_cuda_d2d(dst, src, copy_bytes, NULL));
    CHECK(osp_cuda_event_record(ev0, NULL));
    for (int i = 0; i < 10; i++) CHECK(osp_cuda_d2d(dst, src, copy_bytes, NULL));
    CHECK(osp_cuda_event_record(ev1, NULL));
    float cms;
    CHECK(osp_cuda_event_elapsed_ms(ev0, ev1, &cms));
    const double copy_gbs = 2.0 * (double)copy_bytes * 10 / cms / 1e6;
    osp_cuda_free(src), osp_cuda_free(dst);
    printf("device: %s\ncopy (d2d, 1 GiB): %.1f GB/s (read + write)\n", name, copy_gbs);

    /* x: 64 rows of the widest K, small values; weights: random bf16 in [-1, 1) as bit patterns */
    uint16_t *x;
    const int64_t KMAX = 14336;
    CHECK(osp_cuda_malloc((void **)&x, 2u * 64 * (size_t)KMAX, "x"));
    CHECK(osp_cuda_memset(x, 0x3c, 2u * 64 * (size_t)KMAX, NULL)); /* 0x3c3c: 0.0115 */
    void *y;
    CHECK(osp_cuda_malloc(&y, 2u * 64 * 128256, "y"));
    double us[3][NS][NT];
    const char *labels[3] = {"skinny", "lt-split", "lt-nosplit"};
    for (int s = 0; s < NS; s++) {
        const size_t wbytes = 2u * (size_t)shapes[s].N * (size_t)shapes[s].K;
        const int nw = (int)(((size_t)256 << 20) / wbytes) + 1;
        uint16_t **w = malloc(sizeof *w * (size_t)nw);
        if (!w) return 1;
        for (int i = 0; i < nw; i++) {
            CHECK(osp_cuda_malloc((void **)&w[i], wbytes, "w"));
            CHECK(osp_cuda_memset(w[i], 0x3b + i, wbytes, NULL));
        }
        const char *only = getenv("GEMM_BENCH_SKINNY_ONLY"); /* "1": the skinny column only (tuning runs) */
        const int modes = only && !strcmp(only, "1") ? 1 : 3;
        for (int mode = 0; mode < 3; mode++) {
            if (mode >= modes) {
                for (int t = 0; t < NT; t++) us[mode][s][t] = 0.0 / 0.0;
                continue;
            }
            unsetenv("OSPREY_CUDA_GEMM_SPLITK");
            setenv("OSPREY_CUDA_GEMM_SKINNY", mode == 0 ? "64" : "0", 1);
            if (mode == 2) setenv("OSPREY_CUDA_GEMM_SPLITK", "0", 1);
            osp_cuda_gemm *g;
            CHECK(osp_cuda_gemm_create(64u << 20, &g));
            for (int t = 0; t < NT; t++) {
                run r = {.g = g, .x = x, .w = w, .y = y, .nw = nw, .T = Ts[t], .N = shapes[s].N, .K = shapes[s].K};
                us[mode][s][t] = time_us(&r, reps);
            }
            CHECK(osp_cuda_stream_sync(NULL));
            osp_cuda_gemm_destroy(g);
        }
        for (int i = 0; i < nw; i++) osp_cuda_free(w[i]);
        free(w);
    }
    unsetenv("OSPREY_CUDA_GEMM_SKINNY"), unsetenv("OSPREY_CUDA_GEMM_SPLITK");
    printf("\n| matrix | N x K | T | skinny us (GB/s, %% of copy) | lt-split us (GB/s) | lt-nosplit us (GB/s) | skinny / lt-split |\n");
    printf("|---|---|---|---|---|---|---|\n");
    for (int s = 0; s < NS; s++)
        for (int t = 0; t < NT; t++) {
            const double b = 2.0 * (double)shapes[s].N * (double)shapes[s].K / 1e3; /* GB/s = bytes / us / 1e3 */
            printf("| %s | %lld x %lld | %lld | %.1f (%.0f, %.0f %%) | %.1f (%.0f) | %.1f (%.0f) | %.2fx |\n", shapes[s].name,
                   (long long)shapes[s].N, (long long)shapes[s].K, (long long)Ts[t], us[0][s][t], b / us[0][s][t],
                   100.0 * b / us[0][s][t] / copy_gbs, us[1][s][t], b / us[1][s][t], us[2][s][t], b / us[2][s][t],
                   us[1][s][t] / us[0][s][t]);
        }
    /* a decode step's matrices (32 layers of qkv, o, gate_up, down, and the head) */
    printf("\n| 8B step's matmuls (32 layers + head), T | %s ms | %s ms | %s ms |\n|---|---|---|---|\n", labels[0],
           labels[1], labels[2]);
    for (int t = 0; t < NT; t++) {
        double sum[3] = {0, 0, 0};
        for (int m = 0; m < 3; m++)
            for (int s = 0; s < NS; s++) sum[m] += us[m][s][t] * (s == NS - 1 ? 1 : 32);
        printf("| %lld | %.3f | %.3f | %.3f |\n", (long long)Ts[t], sum[0] / 1e3, sum[1] / 1e3, sum[2] / 1e3);
    }
    printf("(the weights' bytes at the copy's rate: %.3f ms)\n",
           (32.0 * 2 * (6144.0 * 4096 + 4096.0 * 4096 + 28672.0 * 4096 + 4096.0 * 14336) + 2.0 * 128256 * 4096) /
               copy_gbs / 1e6);
    return 0;
}
