/* The paged-attention kernels alone on the GPU (issue 12's kernel rows): decode (one query token per
 * sequence, B sequences at context ctx) and causal prefill (one sequence of n tokens from position
 * 0), at the 8B shape (32 query heads, 8 KV heads, head_dim 128, f16 pages in blocks of 16 handed
 * out in a shuffled order). Each row is timed with CUDA events around `iters` back-to-back launches
 * after a warm-up, the median of 5 such samples; the inputs are random (never zeros).
 *
 * Prints one JSON object per row on stdout: {"kind", "B", "ctx", "kernel", "us", "gbps", "tflops"}
 * with gbps = K + V bytes read once (B * ctx * n_kv * D * 2 bytes * 2) over the time, tflops =
 * causal FLOPs (2 * 2 * n^2 / 2 * D * n_head) over the time; bench/gpu/attention.sh puts PyTorch's
 * SDPA on the same shapes beside it. kernel: "v2" (the tensor-core kernel with wgmma, its own choice of
 * mode), "v2-fold" (the same in fold mode), "v1" (mma.sync), "v0" (the CUDA-core fallback), "v4" (decode:
 * split mode with the keys on the long side of the products, attention_dec.cu).
 *
 * Usage: attn_bench [decode|prefill|all] (default all; ATTN_KERNEL=v2|v2-fold|v1|v0: that kernel only;
 *        ATTN_ORDER=slot: fold mode's query tiles in slot order, not longest first; ATTN_BS=N: N tokens a
 *        page (default 16); ATTN_PAGES=seq: block tables in pool order (default shuffled); ATTN_SUM=1: each row
 *        also prints "sum", an FNV-1a 64 hash of its first launch's output bits, to compare two
 *        builds' kernels on the same inputs, which every run draws alike; ATTN_KV=fp8 | nvfp4 | int8h |
 *        int8h-upper: quantized pages; int8_hier runs v0 and "v0-fold", fold mode forced, and gbps counts
 *        the bytes the view reads)
 *        attn_bench one decode|prefill B ctx v2|v2-fold|v1|v0   one row, one kernel (for ncu:
 *        bench/gpu/profile_attention.sh) */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/attention_v1.h"
#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"

#define H 32
#define HKV 8
#define D 128
static int BS = 16;     /* tokens a page (ATTN_BS; the engine's default 16) */
static bool g_seq_pages; /* ATTN_PAGES=seq: block tables in pool order, not shuffled */

#define CK(x)                                                                                    \
    do {                                                                                         \
        cudaError_t e_ = (x);                                                                    \
        if (e_ != cudaSuccess) {                                                                 \
            fprintf(stderr, "attn_bench: %s: %s\n", #x, cudaGetErrorString(e_));                 \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)
#define OK(x)                                                                                    \
    do {                                                                                         \
        if ((x) != OSP_OK) {                                                                     \
            fprintf(stderr, "attn_bench: %s: %s\n", #x, osp_last_error());                       \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

static uint64_t g_rng = 0x5EED;
static float rnd_unit(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) / 8388608.0f - 1.0f;
}

/* n random K/V values on the device, f16 in [-1, 1) or (fp8, ATTN_KV=fp8) E4M3 codes of magnitude
 * 2^-6 .. 1.875 (codes 0 .. 0x3F) and either sign: a random pattern of `pat` values, tiled with a
 * per-tile offset so the tiles differ */
static void *random_pages(size_t n, bool fp8) {
    const size_t pat = fp8 ? 1u << 20 : 1u << 19, esz = fp8 ? 1 : 2;
    uint8_t *h = malloc(pat * esz);
    for (size_t i = 0; i < pat; i++) {
        const float u = rnd_unit();
        if (fp8) h[i] = (uint8_t)(((uint32_t)((u + 1.0f) * 32.0f) & 0x3Fu) | (u < 0.0f ? 0x80u : 0u));
        else ((uint16_t *)h)[i] = osp_fp32_to_fp16(u);
    }
    void *d;
    OK(osp_cuda_malloc(&d, n * esz, "pages"));
    for (size_t off = 0; off < n; off += pat - 7) {
        const size_t m = n - off < pat ? n - off : pat;
        CK(cudaMemcpy((uint8_t *)d + off * esz, h, m * esz, cudaMemcpyHostToDevice));
    }
    free(h);
    return d;
}

static int cmp_f(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    const char *kind;
    int B, ctx;      /* decode: B sequences at ctx; prefill: B = 1, ctx = n tokens */
} shape;

static const char *g_only; /* one kernel by name, or NULL: all */
static bool g_fp8;         /* ATTN_KV=fp8: E4M3 pages (issue 13), scales 1 */
static bool g_nv;          /* ATTN_KV=nvfp4: NVFP4 pages (random codes and E4M3 micro-block scales), tensor scales 1 */
static int g_h;            /* ATTN_KV=int8h (1) / int8h-upper (2): int8_hier pages (issue 14), the target's full
                            * view or the draft's upper-only view (recent 0); random codes, S and M finite f16 */
static int g_ws_stages; /* v3's K/V stages (ATTN_WS_STAGES; 0: the default) */
static bool g_sum;      /* ATTN_SUM=1: print a hash of each row's output */

static void run(const shape *sh) {
    const bool prefill = sh->kind[0] == 'p';
    const int B = sh->B, ctx = sh->ctx;
    const int64_t T = prefill ? ctx : B;
    const int32_t nb_seq = (ctx + BS - 1) / BS;
    const int64_t nblocks = (int64_t)B * nb_seq;
    const size_t nval = (size_t)(nblocks * BS * HKV * D);
    /* NVFP4: any byte is two E2M1 codes; the micro-block scales are E4M3 codes as fp8's */
    /* int8_hier: a (slot, head) page row is D / 2 upper-code bytes then f16 S and M (bytes of fp8's pattern:
     * bit 6 clear, so every f16 is finite), the lower codes D / 2 bytes in their own pools */
    const size_t pbytes = g_h ? nval / D * (D / 2 + 4) : g_nv ? nval / 2 : nval;
    void *k = random_pages(pbytes, g_fp8 || g_nv || g_h), *v = random_pages(pbytes, g_fp8 || g_nv || g_h);
    void *kscl = g_nv ? random_pages(nval / 16, true) : g_h ? random_pages(nval / 2, true) : NULL;
    void *vscl = g_nv ? random_pages(nval / 16, true) : g_h ? random_pages(nval / 2, true) : NULL;
    float ones[HKV];
    for (int i = 0; i < HKV; i++) ones[i] = 1.0f;
    float *d_fix = NULL;
    OK(osp_cuda_malloc((void **)&d_fix, sizeof ones, "scales"));
    CK(cudaMemcpy(d_fix, ones, sizeof ones, cudaMemcpyHostToDevice));
    const osp_cuda_kv_quant kq = {d_fix, d_fix, (uint8_t *)kscl, (uint8_t *)vscl, g_h == 2, 0};
    /* block tables: a shuffled pool */
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)nblocks);
    for (int64_t i = 0; i < nblocks; i++) perm[i] = (int32_t)i;
    for (int64_t i = nblocks - 1; i > 0 && !g_seq_pages; i--) {
        const int64_t j = (int64_t)((rnd_unit() + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int32_t *qsl = malloc(sizeof(int32_t) * (size_t)(B + 1)), *pos = malloc(sizeof(int32_t) * (size_t)T);
    for (int s = 0; s <= B; s++) qsl[s] = prefill ? (s ? (int32_t)T : 0) : s;
    for (int64_t t = 0; t < T; t++) pos[t] = prefill ? (int32_t)t : ctx - 1;
    uint16_t *q = malloc(sizeof(uint16_t) * (size_t)(T * H * D));
    for (int64_t i = 0; i < T * H * D; i++) q[i] = osp_fp32_to_bf16(rnd_unit() * 2.0f);
    int32_t *d_qsl, *d_pos, *d_bt;
    uint16_t *d_q, *d_out;
    void *d_ws = NULL;
    const size_t ws = osp_cuda_attention_workspace_bytes(T, H, D, ctx);
    OK(osp_cuda_malloc((void **)&d_qsl, sizeof(int32_t) * (size_t)(B + 1), "qsl"));
    OK(osp_cuda_malloc((void **)&d_pos, sizeof(int32_t) * (size_t)T, "pos"));
    OK(osp_cuda_malloc((void **)&d_bt, sizeof(int32_t) * (size_t)nblocks, "bt"));
    OK(osp_cuda_malloc((void **)&d_q, sizeof(uint16_t) * (size_t)(T * H * D), "q"));
    OK(osp_cuda_malloc((void **)&d_out, sizeof(uint16_t) * (size_t)(T * H * D), "out"));
    if (ws) OK(osp_cuda_malloc(&d_ws, ws, "ws"));
    CK(cudaMemcpy(d_qsl, qsl, sizeof(int32_t) * (size_t)(B + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_pos, pos, sizeof(int32_t) * (size_t)T, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_bt, perm, sizeof(int32_t) * (size_t)nblocks, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_q, q, sizeof(uint16_t) * (size_t)(T * H * D), cudaMemcpyHostToDevice));

    /* ws: v3 (attention_ws.cu) for fold mode at D 128, with ping-pong (v3) or without (v3-np); v2 never */
    /* dec: v4 (attention_dec.cu, split mode for short query tiles) every launch it serves, or never */
    static const struct { const char *name; int mode, mma, ws, dec; } ks[] = {
        {"v4", OSP_CUDA_ATTN_V2, 0, OSP_CUDA_ATTN_WS_OFF, OSP_CUDA_ATTN_DEC_ALL},
        {"v3", OSP_CUDA_ATTN_V2, 0, OSP_CUDA_ATTN_WS_PINGPONG, OSP_CUDA_ATTN_DEC_OFF},
        {"v3-np", OSP_CUDA_ATTN_V2, 0, OSP_CUDA_ATTN_WS_ON, OSP_CUDA_ATTN_DEC_OFF},
        {"v2", OSP_CUDA_ATTN_V2, 0, OSP_CUDA_ATTN_WS_OFF, OSP_CUDA_ATTN_DEC_OFF},
        {"v2-fold", OSP_CUDA_ATTN_FOLD, OSP_CUDA_ATTN_MMA_WGMMA, OSP_CUDA_ATTN_WS_OFF, OSP_CUDA_ATTN_DEC_OFF},
        {"v1", OSP_CUDA_ATTN_V1, 0, OSP_CUDA_ATTN_WS_OFF, OSP_CUDA_ATTN_DEC_OFF},
        {"v0", OSP_CUDA_ATTN_V0, 0, OSP_CUDA_ATTN_WS_OFF, OSP_CUDA_ATTN_DEC_OFF},
        /* fold mode forced: for int8_hier (v0 whatever the mode) v0's fold, a CTA walking all its keys (one
         * split before); for the other page types the fold of whichever kernel serves them (run by name only) */
        {"v0-fold", OSP_CUDA_ATTN_FOLD, 0, OSP_CUDA_ATTN_WS_OFF, OSP_CUDA_ATTN_DEC_OFF}};
    /* bytes read a value: int8_hier full D + 4 bytes a (key, head) row, the upper view D / 2 + 4 */
    const double bpv = g_h == 1 ? (D + 4.0) / D : g_h == 2 ? (D / 2 + 4.0) / D : g_nv ? 0.5625 : g_fp8 ? 1.0 : 2.0;
    const double kv_bytes = (double)B * ctx * HKV * D * 2.0 * bpv;
    const double flops = prefill ? 4.0 * (double)ctx * (double)ctx / 2.0 * D * H : 4.0 * (double)B * ctx * D * H;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        if (g_only && strcmp(g_only, ks[ki].name)) continue;
        const bool v0k = ks[ki].mode == OSP_CUDA_ATTN_V0 || !strcmp(ks[ki].name, "v0-fold");
        if (!g_only && (g_h ? !v0k : !strcmp(ks[ki].name, "v0-fold"))) continue; /* int8_hier: v0 only */
        if (!g_only && ks[ki].mode == OSP_CUDA_ATTN_FOLD && prefill) continue; /* prefill is fold mode already */
        if (!g_only && ks[ki].ws != OSP_CUDA_ATTN_WS_OFF && (!prefill || D != 128)) continue; /* v3: fold mode, D 128 */
        if (!g_only && ks[ki].dec != OSP_CUDA_ATTN_DEC_OFF && prefill) continue; /* v4: short query tiles */
        if (ks[ki].mode == OSP_CUDA_ATTN_V0 && prefill && ctx > 16384) continue; /* v0: ~0.5 s a launch */
        osp_cuda_attention_force_mode(ks[ki].mode);
        osp_cuda_attention_force_mma(ks[ki].mma);
        osp_cuda_attention_ws(ks[ki].ws, g_ws_stages);
        osp_cuda_attention_dec(ks[ki].dec);
#define LAUNCH()                                                                                     \
    OK(osp_cuda_paged_attention_q(d_q, k, v, g_h ? OSP_KV_PAGE_INT8H : g_nv ? OSP_KV_PAGE_NVFP4 : g_fp8 ? OSP_KV_PAGE_FP8 : OSP_KV_PAGE_F16, &kq, \
                                  d_out, B, d_qsl, d_pos, \
                                  d_bt, nb_seq, BS, T, H, HKV, D, 0.08838834764f, 0, ctx, d_ws, NULL))
        LAUNCH();
        CK(cudaDeviceSynchronize());
        char sum[40] = "";
        if (g_sum) {
            const size_t n = (size_t)(T * H * D);
            uint16_t *h = malloc(sizeof(uint16_t) * n);
            CK(cudaMemcpy(h, d_out, sizeof(uint16_t) * n, cudaMemcpyDeviceToHost));
            uint64_t fnv = 0xcbf29ce484222325ull;
            for (size_t i = 0; i < n; i++) fnv = (fnv ^ h[i]) * 0x100000001b3ull;
            free(h);
            snprintf(sum, sizeof sum, ", \"sum\": \"%016llx\"", (unsigned long long)fnv);
        }
        CK(cudaEventRecord(e0, NULL));
        LAUNCH();
        CK(cudaEventRecord(e1, NULL));
        CK(cudaEventSynchronize(e1));
        float one = 0.0f;
        CK(cudaEventElapsedTime(&one, e0, e1));
        int iters = (int)(20.0f / (one > 0.001f ? one : 0.001f)); /* ~20 ms a sample */
        if (iters < 1) iters = 1;
        if (iters > 2000) iters = 2000;
        float samples[5];
        for (int r = 0; r < 5; r++) {
            CK(cudaEventRecord(e0, NULL));
            for (int i = 0; i < iters; i++) LAUNCH();
            CK(cudaEventRecord(e1, NULL));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            samples[r] = ms / (float)iters;
        }
        qsort(samples, 5, sizeof(float), cmp_f);
        const double us = samples[2] * 1e3;
        printf("{\"kind\": \"%s\", \"B\": %d, \"ctx\": %d, \"kernel\": \"%s%s\", \"us\": %.2f, \"gbps\": %.1f, "
               "\"tflops\": %.2f%s}\n",
               sh->kind, B, ctx, ks[ki].name, g_h == 1 ? "-int8h" : g_h == 2 ? "-int8h-upper" : g_nv ? "-nvfp4" : g_fp8 ? "-fp8" : "", us, kv_bytes / (us * 1e3),
               flops / (us * 1e6), sum);
        fflush(stdout);
    }
    osp_cuda_attention_force_mode(OSP_CUDA_ATTN_AUTO);
    osp_cuda_attention_force_mma(OSP_CUDA_ATTN_MMA_AUTO);
    osp_cuda_attention_ws(-1, 0);
    osp_cuda_attention_dec(-1);
    cudaEventDestroy(e0), cudaEventDestroy(e1);
    osp_cuda_free(d_fix);
    osp_cuda_free(k), osp_cuda_free(v), osp_cuda_free(kscl), osp_cuda_free(vscl), osp_cuda_free(d_qsl), osp_cuda_free(d_pos), osp_cuda_free(d_bt);
    osp_cuda_free(d_q), osp_cuda_free(d_out), osp_cuda_free(d_ws);
    free(perm), free(qsl), free(pos), free(q);
}

int main(int argc, char **argv) {
    const char *what = argc > 1 ? argv[1] : "all";
    /* v1's launch shape, for tuning runs: ATTN_FOLD_STAGES, ATTN_SPLIT_STAGES, ATTN_SPLIT_WAVES,
     * ATTN_CHUNKS_PER_CTA (unset: the defaults) */
    const char *e1 = getenv("ATTN_FOLD_STAGES"), *e2 = getenv("ATTN_SPLIT_STAGES"), *e3 = getenv("ATTN_SPLIT_WAVES"),
               *e4 = getenv("ATTN_CHUNKS_PER_CTA");
    osp_cuda_attention_v1_tune(e1 ? atoi(e1) : 0, e2 ? atoi(e2) : 0, e3 ? atoi(e3) : 0, e4 ? atoi(e4) : 0);
    const char *e8 = getenv("ATTN_KV"); /* fp8: E4M3 pages (v2's tensor-core path, or v0 under v1 / v0) */
    g_fp8 = e8 && !strcmp(e8, "fp8");
    g_nv = e8 && !strcmp(e8, "nvfp4");
    g_h = e8 && !strcmp(e8, "int8h") ? 1 : e8 && !strcmp(e8, "int8h-upper") ? 2 : 0;
    g_only = getenv("ATTN_KERNEL"); /* one kernel (v3, v3-np, v2, v2-fold, v1 or v0) instead of all */
    const char *e7 = getenv("ATTN_WS_STAGES"); /* v3's K/V stages (3 or 4; unset: the default) */
    g_ws_stages = e7 ? atoi(e7) : 0;
    const char *e10 = getenv("ATTN_BS"), *e11 = getenv("ATTN_PAGES");
    if (e10) BS = atoi(e10) > 0 ? atoi(e10) : 16;
    g_seq_pages = e11 && !strcmp(e11, "seq");
    const char *e9 = getenv("ATTN_SUM");
    g_sum = e9 && !strcmp(e9, "1");
    const char *e6 = getenv("ATTN_ORDER"); /* slot: fold mode's query tiles in slot order, not longest first */
    osp_cuda_attention_tile_order(!e6 || strcmp(e6, "slot") != 0);
    if (osp_cuda_device_count() == 0) {
        fprintf(stderr, "attn_bench: no CUDA device\n");
        return 77;
    }
    if (!strcmp(what, "one")) {
        if (argc != 6) {
            fprintf(stderr, "usage: attn_bench one decode|prefill B ctx v3|v3-np|v2|v2-fold|v1|v0\n");
            return 2;
        }
        const shape sh = {!strcmp(argv[2], "prefill") ? "prefill" : "decode", atoi(argv[3]), atoi(argv[4])};
        if (sh.B < 1 || sh.ctx < 1 || (sh.kind[0] == 'p' && sh.B != 1)) {
            fprintf(stderr, "attn_bench: B >= 1 and ctx >= 1 (prefill: B = 1)\n");
            return 2;
        }
        g_only = argv[5];
        run(&sh);
        return 0;
    }
    static const int Bs[] = {1, 2, 8, 64}, ctxs[] = {1024, 8192, 32768, 131072};
    if (!strcmp(what, "decode") || !strcmp(what, "all"))
        for (int bi = 0; bi < 4; bi++)
            for (int ci = 0; ci < 4; ci++) {
                if (ctxs[ci] == 131072 && Bs[bi] > 8) continue;
                const shape sh = {"decode", Bs[bi], ctxs[ci]};
                run(&sh);
            }
    if (!strcmp(what, "prefill") || !strcmp(what, "all")) {
        static const int ns[] = {4096, 8192, 16384, 32768};
        for (int i = 0; i < 4; i++) {
            const shape sh = {"prefill", 1, ns[i]};
            run(&sh);
        }
    }
    return 0;
}
