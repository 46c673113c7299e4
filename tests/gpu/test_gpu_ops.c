/* The CUDA elementwise and row kernels (src/backend/cuda/ops.cu) against the CPU reference
 * (src/backend/cpu/ops.h, core/dtype.h, and a copy of make-random-model's randn), on seeded random
 * inputs of many shapes: odd lengths, 1..133 rows, the vectorized and the scalar paths (shapes that
 * are not multiples of 4, and pointers offset by one element), every RoPE / KV-write variant.
 *
 * Every output buffer is poisoned (0xFF bytes: NaN as fp32, bf16 and f16) before each launch, and
 * every comparison fails on NaN (!(|got - ref| <= tol)), so an element a kernel forgot to write fails.
 * KV pages: the slots named in slot_mapping must hold the result, every other slot its poison.
 *
 * Tolerances (ref is the CPU's fp32 value y, got the GPU's output):
 *   exact    embed (bf16 -> fp32 widening), the residual add, fp32 -> bf16, the random fill, V pages
 *            (same single float operations and the same round-to-nearest-even conversions).
 *   bf16     the GPU computes y' in fp32 with |y' - y| <= d, then rounds to bf16 (8 significant bits,
 *            unit roundoff u = 2^-8): |bf16(y') - y'| <= 2^-8 |y'|, so
 *            |got - y| <= 2^-8 |y| + (1 + 2^-8) d. For the norms and silu d is a few fp32 roundings
 *            plus the fp32 (GPU) vs double (CPU) sum of squares, under 1e-6 |y|: bounded by 2^-15 |y|,
 *            tol = (2^-8 + 2^-15) |y|.
 *   RoPE     cos / sin differ by a few fp32 ulps (CUDA's sincosf <= 2 ulp, glibc's <= 1 ulp: |dc|, |ds|
 *            <= 3 * 2^-24) and the q/k norm's scale by ~1e-6 relative (fp32 vs double sum), so the
 *            rotated value x0 c - x1 s differs by d <= ~1e-6 (|x0| + |x1|); with 10x margin
 *            d = 1e-5 (|x0| + |x1|) (x0, x1 the pair before rotation; x0 = x1 = x for an unrotated
 *            dim). bf16 q: tol = 2^-8 |y| + d. f16 K pages (11 significant bits, u = 2^-11, subnormal
 *            spacing 2^-24): tol = 2^-11 |y| + 2^-24 + d. fp32 K pages: tol = d.
 *   argmax   exact index (ties: the smallest; NaN never wins; an all-NaN row gives -1).
 *
 * Exits 77 (skipped) without a CUDA device. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/cuda_ops.h"
#include "core/dtype.h"
#include "test_rng.h"
#include "osprey/status.h"

/* Built without CUDA (OSPREY_CUDA off) the kernels' launchers do not exist: the test only skips. */
#ifdef OSPREY_HAVE_CUDA

/* ---- random inputs --------------------------------------------------------------------------------- */


/* ---- device memory: one arena, reset by each run (every run ends synchronized) --------------------- */

static void *g_stream;
static uint8_t *g_arena;
static size_t g_arena_cap, g_arena_used;
#define ARENA_BYTES ((size_t)128 << 20)

static void *dev(size_t bytes) {
    const size_t off = (g_arena_used + 255) & ~(size_t)255;
    assert_true(off + bytes <= g_arena_cap);
    g_arena_used = off + bytes;
    return g_arena + off;
}
static void dev_reset(void) { g_arena_used = 0; }

static void wait_stream(void) {
    const osp_status s = osp_cuda_stream_sync(g_stream);
    if (s != OSP_OK) fail_msg("stream sync: %s", osp_last_error());
}
static void up(void *d, const void *h, size_t bytes) {
    assert_int_equal(osp_cuda_h2d(d, h, bytes, g_stream), OSP_OK);
    wait_stream();
}
static void down(void *h, const void *d, size_t bytes) {
    assert_int_equal(osp_cuda_d2h(h, d, bytes, g_stream), OSP_OK);
    wait_stream();
}
static void poison(void *d, size_t bytes) { assert_int_equal(osp_cuda_memset(d, 0xFF, bytes, g_stream), OSP_OK); }

static void ok(osp_status s, const char *what) {
    if (s != OSP_OK) fail_msg("%s: %s (%s)", what, osp_status_str(s), osp_last_error());
}

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

/* ---- comparisons ----------------------------------------------------------------------------------- */

typedef struct cmp {
    const char *what;
    int64_t bad;
} cmp;

static void close_to(cmp *c, int64_t i, float got, float ref, float tol) {
    if (fabsf(got - ref) <= tol) return; /* false for NaN */
    if (c->bad < 5) printf("  %s[%lld]: got %.9g, want %.9g (tol %.3g)\n", c->what, (long long)i, got, ref, tol);
    c->bad++;
}
static void same_bits(cmp *c, int64_t i, uint32_t got, uint32_t want) {
    if (got == want) return;
    if (c->bad < 5) printf("  %s[%lld]: got bits 0x%x, want 0x%x\n", c->what, (long long)i, got, want);
    c->bad++;
}
static void done(const cmp *c, const char *shape) {
    if (c->bad) fail_msg("%s: %lld mismatches (%s)", c->what, (long long)c->bad, shape);
}

#define TOL_BF16 (1.0f / 256.0f + 1.0f / 32768.0f) /* 2^-8 + 2^-15, relative (see the top) */

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static const int64_t k_T[] = {1, 3, 17, 64, 133};
#define N_T (sizeof k_T / sizeof k_T[0])

/* ---- embedding --------------------------------------------------------------------------------------- */

static void test_embed(void **state) {
    (void)state;
    const int64_t Es[] = {64, 576, 4096, 4099, 2050, 3};
    const int64_t V = 97;
    for (size_t ei = 0; ei < sizeof Es / sizeof Es[0]; ei++)
        for (size_t ti = 0; ti < N_T; ti++)
            for (int off = 0; off < 2; off++) { /* off: pointers one element in, the scalar path */
                const int64_t E = Es[ei], T = k_T[ti];
                uint16_t *tab = xmalloc((size_t)(V * E) * 2);
                int32_t *ids = xmalloc((size_t)T * 4);
                float *x = xmalloc((size_t)(T * E) * 4);
                for (int64_t i = 0; i < V * E; i++) tab[i] = osp_fp32_to_bf16(frand() * 3.0f);
                for (int64_t t = 0; t < T; t++) ids[t] = (int32_t)(rnd() % V);
                dev_reset();
                uint16_t *d_tab = (uint16_t *)dev((size_t)(V * E + 1) * 2) + off;
                int32_t *d_ids = dev((size_t)T * 4);
                float *d_x = (float *)dev((size_t)(T * E + 1) * 4) + off;
                up(d_tab, tab, (size_t)(V * E) * 2);
                up(d_ids, ids, (size_t)T * 4);
                poison(d_x, (size_t)(T * E) * 4);
                ok(osp_cuda_embed(d_tab, d_ids, d_x, T, E, 1.0f, g_stream), "osp_cuda_embed");
                down(x, d_x, (size_t)(T * E) * 4);
                cmp c = {"embed x", 0};
                for (int64_t t = 0; t < T; t++)
                    for (int64_t e = 0; e < E; e++)
                        same_bits(&c, t * E + e, f32_bits(x[t * E + e]), (uint32_t)tab[ids[t] * E + e] << 16);
                char shape[96];
                snprintf(shape, sizeof shape, "T %lld E %lld off %d", (long long)T, (long long)E, off);
                done(&c, shape);
                free(tab), free(ids), free(x);
            }
}

/* ---- RMSNorm ----------------------------------------------------------------------------------------- */

static void fill_activations(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = frand() * 2.0f * (rnd() % 50 == 0 ? 30.0f : 1.0f);
}

static void test_add_rmsnorm(void **state) {
    (void)state;
    const int64_t Es[] = {64, 576, 4096, 4099, 2050};
    const float eps = 1e-5f;
    int run = 0;
    for (size_t ei = 0; ei < sizeof Es / sizeof Es[0]; ei++)
        for (size_t ti = 0; ti < N_T; ti++)
            for (int with_delta = 0; with_delta < 2; with_delta++, run++) {
                const int64_t E = Es[ei], T = k_T[ti];
                const int off = run % 5 == 4; /* now and then the scalar path for a multiple of 4 */
                const size_t n = (size_t)(T * E);
                float *x = xmalloc(n * 4), *w = xmalloc((size_t)E * 4), *xr = xmalloc(n * 4), *ref = xmalloc(n * 4);
                float *xg = xmalloc(n * 4);
                uint16_t *delta = xmalloc(n * 2), *out = xmalloc(n * 2);
                fill_activations(x, (int64_t)n);
                if (T == 3) memset(x + E, 0, (size_t)E * 4); /* an all-zero row: out 0 */
                for (int64_t i = 0; i < E; i++) w[i] = 1.0f + 0.1f * frand();
                for (size_t i = 0; i < n; i++) delta[i] = osp_fp32_to_bf16(frand());
                if (T == 3) memset(delta + E, 0, (size_t)E * 2);
                for (size_t i = 0; i < n; i++) xr[i] = with_delta ? x[i] + osp_bf16_to_fp32(delta[i]) : x[i];
                osp_cpu_rmsnorm(xr, w, ref, T, E, eps);

                dev_reset();
                float *d_x = (float *)dev((n + 1) * 4) + off, *d_w = (float *)dev((size_t)(E + 1) * 4) + off;
                uint16_t *d_delta = (uint16_t *)dev((n + 1) * 2) + off, *d_out = (uint16_t *)dev((n + 1) * 2) + off;
                up(d_x, x, n * 4);
                up(d_w, w, (size_t)E * 4);
                up(d_delta, delta, n * 2);
                poison(d_out, n * 2);
                ok(osp_cuda_add_rmsnorm(d_x, with_delta ? d_delta : NULL, d_w, d_out, T, E, eps, g_stream),
                   "osp_cuda_add_rmsnorm");
                down(out, d_out, n * 2);
                down(xg, d_x, n * 4);

                char shape[96];
                snprintf(shape, sizeof shape, "T %lld E %lld delta %d off %d", (long long)T, (long long)E,
                         with_delta, off);
                cmp cx = {"add_rmsnorm x", 0}, co = {"add_rmsnorm out", 0};
                for (size_t i = 0; i < n; i++) same_bits(&cx, (int64_t)i, f32_bits(xg[i]), f32_bits(xr[i]));
                for (size_t i = 0; i < n; i++)
                    close_to(&co, (int64_t)i, osp_bf16_to_fp32(out[i]), ref[i], TOL_BF16 * fabsf(ref[i]));
                done(&cx, shape);
                done(&co, shape);
                free(x), free(w), free(xr), free(ref), free(xg), free(delta), free(out);
            }
}

static void test_gather_rmsnorm(void **state) {
    (void)state;
    const int64_t Es[] = {64, 576, 4096, 4099, 2050};
    const int64_t rows = 37;
    const float eps = 1e-6f;
    int run = 0;
    for (size_t ei = 0; ei < sizeof Es / sizeof Es[0]; ei++)
        for (size_t ti = 0; ti < N_T; ti++, run++) {
            const int64_t E = Es[ei], n = k_T[ti];
            const int off = run % 4 == 3;
            float *x = xmalloc((size_t)(rows * E) * 4), *w = xmalloc((size_t)E * 4);
            float *ref = xmalloc((size_t)(n * E) * 4);
            int32_t *idx = xmalloc((size_t)n * 4);
            uint16_t *out = xmalloc((size_t)(n * E) * 2);
            fill_activations(x, rows * E);
            for (int64_t i = 0; i < E; i++) w[i] = 1.0f + 0.1f * frand();
            for (int64_t i = 0; i < n; i++) idx[i] = (int32_t)(rnd() % rows); /* repeats allowed */
            for (int64_t i = 0; i < n; i++) osp_cpu_rmsnorm(x + idx[i] * E, w, ref + i * E, 1, E, eps);

            dev_reset();
            float *d_x = (float *)dev((size_t)(rows * E + 1) * 4) + off, *d_w = (float *)dev((size_t)(E + 1) * 4) + off;
            int32_t *d_idx = dev((size_t)n * 4);
            uint16_t *d_out = (uint16_t *)dev((size_t)(n * E + 1) * 2) + off;
            up(d_x, x, (size_t)(rows * E) * 4);
            up(d_w, w, (size_t)E * 4);
            up(d_idx, idx, (size_t)n * 4);
            poison(d_out, (size_t)(n * E) * 2);
            ok(osp_cuda_gather_rmsnorm(d_x, d_idx, d_w, d_out, n, E, eps, g_stream), "osp_cuda_gather_rmsnorm");
            down(out, d_out, (size_t)(n * E) * 2);

            char shape[96];
            snprintf(shape, sizeof shape, "n %lld E %lld off %d", (long long)n, (long long)E, off);
            cmp c = {"gather_rmsnorm out", 0};
            for (int64_t i = 0; i < n * E; i++)
                close_to(&c, i, osp_bf16_to_fp32(out[i]), ref[i], TOL_BF16 * fabsf(ref[i]));
            done(&c, shape);
            free(x), free(w), free(ref), free(idx), free(out);
        }
}

/* ---- bias + q/k norm + RoPE + KV write ------------------------------------------------------------- */

typedef struct rope_case {
    int64_t T;
    int n_head, n_head_kv, D, n_rot;
    bool neox, bias, qk_norm, kv_f16, padding;
    float theta;
} rope_case;

/* The partner of dim d in its rotation pair, or d itself when d is not rotated. */
static int partner(int d, int n_rot, bool neox) {
    if (d >= n_rot) return d;
    if (neox) return d < n_rot / 2 ? d + n_rot / 2 : d - n_rot / 2;
    return d ^ 1;
}

static void run_rope_case(const rope_case *rc) {
    const int64_t T = rc->T;
    const int H = rc->n_head, HK = rc->n_head_kv, D = rc->D, n_rot = rc->n_rot;
    const int64_t QD = (int64_t)H * D, KD = (int64_t)HK * D, ROW = QD + 2 * KD;
    const int64_t num_slots = T + 5;
    const float eps = 1e-6f;
    char shape[160];
    snprintf(shape, sizeof shape, "T %lld heads %d/%d D %d n_rot %d %s bias %d qk_norm %d %s padding %d",
             (long long)T, H, HK, D, n_rot, rc->neox ? "neox" : "interleaved", rc->bias, rc->qk_norm,
             rc->kv_f16 ? "f16" : "f32", rc->padding);

    float *qkv = xmalloc((size_t)(T * ROW) * 4), *bias = xmalloc((size_t)ROW * 4);
    float *qn = xmalloc((size_t)D * 4), *kn = xmalloc((size_t)D * 4);
    float *inv_freq = xmalloc((size_t)(n_rot / 2 + 1) * 4);
    int32_t *pos = xmalloc((size_t)T * 4), *slots = xmalloc((size_t)T * 4), *perm = xmalloc((size_t)num_slots * 4);
    for (int64_t i = 0; i < T * ROW; i++) qkv[i] = frand() * 2.0f;
    for (int64_t i = 0; i < ROW; i++) bias[i] = 0.5f * frand();
    for (int i = 0; i < D; i++) qn[i] = 1.0f + 0.1f * frand(), kn[i] = 1.0f + 0.1f * frand();
    for (int i = 0; i < n_rot / 2; i++) /* as src/model/llama.c: in double, rounded once */
        inv_freq[i] = (float)(1.0 / pow((double)rc->theta, (2.0 * i) / (double)n_rot));
    for (int64_t t = 0; t < T; t++) pos[t] = (int32_t)(rnd() % 4096);
    pos[0] = 0;
    if (T > 2) pos[T - 1] = 131071; /* large angles */
    if (T > 5) pos[2] = 40000 + (int32_t)(rnd() % 1000);
    for (int64_t s = 0; s < num_slots; s++) perm[s] = (int32_t)s;
    for (int64_t s = num_slots - 1; s > 0; s--) { /* Fisher-Yates: distinct slots */
        const int64_t j = rnd() % (s + 1);
        const int32_t tmp = perm[s];
        perm[s] = perm[j], perm[j] = tmp;
    }
    for (int64_t t = 0; t < T; t++) slots[t] = perm[t];
    if (rc->padding) slots[T - 1] = -1; /* a padding row: no KV write */

    /* CPU reference, in src/model/llama.c's order: bias, q/k norm, rope, KV write */
    float *q = xmalloc((size_t)(T * QD) * 4), *k = xmalloc((size_t)(T * KD) * 4), *v = xmalloc((size_t)(T * KD) * 4);
    for (int64_t t = 0; t < T; t++) {
        for (int64_t j = 0; j < QD; j++) q[t * QD + j] = qkv[t * ROW + j] + (rc->bias ? bias[j] : 0.0f);
        for (int64_t j = 0; j < KD; j++) k[t * KD + j] = qkv[t * ROW + QD + j] + (rc->bias ? bias[QD + j] : 0.0f);
        for (int64_t j = 0; j < KD; j++)
            v[t * KD + j] = qkv[t * ROW + QD + KD + j] + (rc->bias ? bias[QD + KD + j] : 0.0f);
    }
    if (!rc->bias) /* x + 0.0f changes -0.0 to +0.0: the kernel adds nothing without a bias */
        for (int64_t t = 0; t < T; t++) {
            memcpy(q + t * QD, qkv + t * ROW, (size_t)QD * 4);
            memcpy(k + t * KD, qkv + t * ROW + QD, (size_t)KD * 4);
            memcpy(v + t * KD, qkv + t * ROW + QD + KD, (size_t)KD * 4);
        }
    if (rc->qk_norm) {
        osp_cpu_rmsnorm(q, qn, q, T * H, D, eps);
        osp_cpu_rmsnorm(k, kn, k, T * HK, D, eps);
    }
    float *q_pre = xmalloc((size_t)(T * QD) * 4), *k_pre = xmalloc((size_t)(T * KD) * 4);
    memcpy(q_pre, q, (size_t)(T * QD) * 4);
    memcpy(k_pre, k, (size_t)(T * KD) * 4);
    if (rc->neox) {
        osp_cpu_rope_neox(q, pos, T, H, D, n_rot, inv_freq);
        osp_cpu_rope_neox(k, pos, T, HK, D, n_rot, inv_freq);
    } else {
        osp_cpu_rope_interleaved(q, pos, T, H, D, n_rot, inv_freq);
        osp_cpu_rope_interleaved(k, pos, T, HK, D, n_rot, inv_freq);
    }
    const size_t esz = rc->kv_f16 ? 2 : 4, page_bytes = (size_t)(num_slots * KD) * esz;
    uint8_t *k_ref = xmalloc(page_bytes), *v_ref = xmalloc(page_bytes);
    memset(k_ref, 0xFF, page_bytes);
    memset(v_ref, 0xFF, page_bytes);
    for (int64_t t = 0; t < T; t++) {
        if (slots[t] < 0) continue;
        if (rc->kv_f16) {
            osp_cpu_kv_write_f16(k + t * KD, v + t * KD, k_ref, v_ref, &slots[t], 1, KD);
        } else {
            memcpy(k_ref + (size_t)slots[t] * (size_t)KD * 4, k + t * KD, (size_t)KD * 4);
            memcpy(v_ref + (size_t)slots[t] * (size_t)KD * 4, v + t * KD, (size_t)KD * 4);
        }
    }
    int64_t *slot_token = xmalloc((size_t)num_slots * 8); /* which token wrote a slot, -1 none */
    for (int64_t s = 0; s < num_slots; s++) slot_token[s] = -1;
    for (int64_t t = 0; t < T; t++)
        if (slots[t] >= 0) slot_token[slots[t]] = t;

    /* GPU */
    dev_reset();
    float *d_qkv = dev((size_t)(T * ROW) * 4), *d_bias = dev((size_t)ROW * 4);
    float *d_qn = dev((size_t)D * 4), *d_kn = dev((size_t)D * 4), *d_inv = dev((size_t)(n_rot / 2 + 1) * 4);
    int32_t *d_pos = dev((size_t)T * 4), *d_slots = dev((size_t)T * 4);
    uint16_t *d_q = dev((size_t)(T * QD) * 2);
    void *d_k = dev(page_bytes), *d_v = dev(page_bytes);
    up(d_qkv, qkv, (size_t)(T * ROW) * 4);
    up(d_bias, bias, (size_t)ROW * 4);
    up(d_qn, qn, (size_t)D * 4);
    up(d_kn, kn, (size_t)D * 4);
    up(d_inv, inv_freq, (size_t)(n_rot / 2 + 1) * 4);
    up(d_pos, pos, (size_t)T * 4);
    up(d_slots, slots, (size_t)T * 4);
    poison(d_q, (size_t)(T * QD) * 2);
    poison(d_k, page_bytes);
    poison(d_v, page_bytes);
    ok(osp_cuda_rope_kv_write(d_qkv, rc->bias ? d_bias : NULL, rc->qk_norm ? d_qn : NULL, rc->qk_norm ? d_kn : NULL,
                              d_pos, d_inv, d_slots, d_q, d_k, d_v, rc->kv_f16 ? OSP_KV_PAGE_F16 : OSP_KV_PAGE_F32,
                              T, H, HK, D, n_rot, rc->neox, eps, g_stream),
       "osp_cuda_rope_kv_write");
    uint16_t *q_out = xmalloc((size_t)(T * QD) * 2);
    uint8_t *k_got = xmalloc(page_bytes), *v_got = xmalloc(page_bytes);
    down(q_out, d_q, (size_t)(T * QD) * 2);
    down(k_got, d_k, page_bytes);
    down(v_got, d_v, page_bytes);

    cmp cq = {"rope q_out", 0}, ck = {"k pages", 0}, cv = {"v pages", 0};
    for (int64_t t = 0; t < T; t++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                const int64_t i = t * QD + (int64_t)h * D, p = partner(d, n_rot, rc->neox);
                const float y = q[i + d], mag = fabsf(q_pre[i + d]) + fabsf(q_pre[i + p]);
                close_to(&cq, i + d, osp_bf16_to_fp32(q_out[i + d]), y, ldexpf(fabsf(y), -8) + 1e-5f * mag);
            }
    for (int64_t s = 0; s < num_slots; s++)
        for (int64_t j = 0; j < KD; j++) {
            const int64_t e = s * KD + j, t = slot_token[s];
            uint32_t kb, vb, kw, vw;
            if (rc->kv_f16) {
                uint16_t a, b, c2, d2;
                memcpy(&a, k_got + e * 2, 2), memcpy(&b, v_got + e * 2, 2);
                memcpy(&c2, k_ref + e * 2, 2), memcpy(&d2, v_ref + e * 2, 2);
                kb = a, vb = b, kw = c2, vw = d2;
            } else {
                memcpy(&kb, k_got + e * 4, 4), memcpy(&vb, v_got + e * 4, 4);
                memcpy(&kw, k_ref + e * 4, 4), memcpy(&vw, v_ref + e * 4, 4);
            }
            same_bits(&cv, e, vb, vw); /* V: bias add and rounding only, bit-exact; poison where unwritten */
            if (t < 0) {
                same_bits(&ck, e, kb, kw); /* the poison */
                continue;
            }
            const int d = (int)(j % D), p = partner(d, n_rot, rc->neox);
            const int64_t i = t * KD + j;
            const float y = k[i], mag = fabsf(k_pre[i]) + fabsf(k_pre[i - d + p]);
            if (rc->kv_f16)
                close_to(&ck, e, osp_fp16_to_fp32((uint16_t)kb), y,
                         ldexpf(fabsf(y), -11) + ldexpf(1.0f, -24) + 1e-5f * mag);
            else
                close_to(&ck, e, bits_f32(kb), y, 1e-5f * mag);
        }
    done(&cq, shape);
    done(&ck, shape);
    done(&cv, shape);
    free(qkv), free(bias), free(qn), free(kn), free(inv_freq), free(pos), free(slots), free(perm);
    free(q), free(k), free(v), free(q_pre), free(k_pre), free(k_ref), free(v_ref), free(slot_token);
    free(q_out), free(k_got), free(v_got);
}

static void test_rope_kv_write(void **state) {
    (void)state;
    const int Ds[] = {32, 64, 128};
    const int gqa[][2] = {{4, 4}, {6, 2}, {8, 2}, {16, 2}, {3, 1}}; /* ratios 1, 3, 4, 8, 3 */
    int run = 0;
    for (size_t di = 0; di < sizeof Ds / sizeof Ds[0]; di++)
        for (size_t gi = 0; gi < sizeof gqa / sizeof gqa[0]; gi++)
            for (int flags = 0; flags < 16; flags++, run++) {
                rope_case rc;
                rc.T = k_T[run % N_T];
                rc.n_head = gqa[gi][0], rc.n_head_kv = gqa[gi][1], rc.D = Ds[di];
                rc.neox = flags & 1, rc.bias = (flags >> 1) & 1, rc.qk_norm = (flags >> 2) & 1;
                rc.kv_f16 = (flags >> 3) & 1;
                rc.n_rot = run % 3 == 2 ? Ds[di] / 2 : Ds[di]; /* partial rotary now and then */
                rc.padding = rc.T > 1 && run % 2 == 1;
                rc.theta = run % 2 ? 1000000.0f : 10000.0f;
                run_rope_case(&rc);
            }
    /* a head_dim of 256 (Gemma-like) and an odd one with no rotation */
    rope_case big = {17, 8, 2, 256, 256, true, true, true, true, true, 10000.0f};
    run_rope_case(&big);
    rope_case odd = {3, 2, 1, 50, 0, false, true, false, false, false, 10000.0f};
    run_rope_case(&odd);
}

/* ---- SiLU-gated product ---------------------------------------------------------------------------- */

static void test_silu_mul(void **state) {
    (void)state;
    const int64_t Fs[] = {64, 576, 4096, 4099, 1536, 14336, 5};
    int run = 0;
    for (size_t fi = 0; fi < sizeof Fs / sizeof Fs[0]; fi++)
        for (size_t ti = 0; ti < N_T; ti++, run++) {
            const int64_t F = Fs[fi], T = k_T[ti];
            const int off = run % 4 == 3;
            const size_t n = (size_t)(T * F);
            uint16_t *gu = xmalloc(2 * n * 2), *out = xmalloc(n * 2);
            float *g = xmalloc(n * 4), *u = xmalloc(n * 4), *ref = xmalloc(n * 4);
            for (size_t i = 0; i < 2 * n; i++) gu[i] = osp_fp32_to_bf16(frand() * 8.0f);
            for (int64_t t = 0; t < T; t++)
                for (int64_t j = 0; j < F; j++) {
                    g[t * F + j] = osp_bf16_to_fp32(gu[t * 2 * F + j]);
                    u[t * F + j] = osp_bf16_to_fp32(gu[t * 2 * F + F + j]);
                }
            osp_cpu_silu_mul(g, u, ref, (int64_t)n);

            dev_reset();
            uint16_t *d_gu = (uint16_t *)dev((2 * n + 1) * 2) + off, *d_out = (uint16_t *)dev((n + 1) * 2) + off;
            up(d_gu, gu, 2 * n * 2);
            poison(d_out, n * 2);
            ok(osp_cuda_silu_mul(d_gu, d_out, T, F, g_stream), "osp_cuda_silu_mul");
            down(out, d_out, n * 2);

            char shape[96];
            snprintf(shape, sizeof shape, "T %lld F %lld off %d", (long long)T, (long long)F, off);
            cmp c = {"silu_mul out", 0};
            for (size_t i = 0; i < n; i++)
                close_to(&c, (int64_t)i, osp_bf16_to_fp32(out[i]), ref[i], TOL_BF16 * fabsf(ref[i]));
            done(&c, shape);
            free(gu), free(out), free(g), free(u), free(ref);
        }
}

/* ---- argmax ------------------------------------------------------------------------------------------ */

static int32_t ref_argmax(const float *x, int64_t V) {
    int32_t b = -1;
    for (int64_t i = 0; i < V; i++)
        if (!isnan(x[i]) && (b < 0 || x[i] > x[b])) b = (int32_t)i;
    return b;
}

/* Row r of a batch: kind r % 9 picks random values, ties, NaNs, infinities or an all-NaN row. */
static void fill_logits_row(float *x, int64_t V, int kind) {
    for (int64_t i = 0; i < V; i++) x[i] = frand() * 10.0f;
    const int64_t a = rnd() % V, b = rnd() % V, c = rnd() % V;
    switch (kind) {
    case 0: break;
    case 1: x[a] = x[b] = x[c] = 20.0f; break;                  /* a three-way tie */
    case 2: x[0] = NAN, x[a] = NAN, x[V - 1] = NAN; break;       /* NaNs, maybe where the max was */
    case 3: for (int64_t i = 0; i < V; i++) x[i] = NAN; break;   /* all NaN: -1 */
    case 4: for (int64_t i = 0; i < V; i++) x[i] = -INFINITY; break; /* all -inf: index 0 */
    case 5: x[a] = INFINITY, x[b] = INFINITY, x[c] = NAN; break;
    case 6:                                                       /* NaN everywhere but one -inf */
        for (int64_t i = 0; i < V; i++) x[i] = NAN;
        x[b] = -INFINITY;
        break;
    case 7: x[V - 1] = 25.0f, x[a] = 25.0f; break;                /* a tie with the last element */
    default: /* a tie of -0 and +0 above all others: the earlier of the two */
        for (int64_t i = 0; i < V; i++) x[i] = -1.5f;
        x[a] = -0.0f, x[b] = 0.0f;
        break;
    }
}

static void test_argmax(void **state) {
    (void)state;
    const int64_t Vs[] = {1, 7, 64, 1000, 4099, 49152, 151936, 128257};
    const int64_t Rs[] = {1, 3, 17};
    int run = 0;
    for (size_t vi = 0; vi < sizeof Vs / sizeof Vs[0]; vi++)
        for (size_t ri = 0; ri < sizeof Rs / sizeof Rs[0]; ri++, run++) {
            const int64_t V = Vs[vi], R = Rs[ri];
            const int off = run % 3 == 2;
            float *x = xmalloc((size_t)(R * V) * 4);
            int32_t *out = xmalloc((size_t)R * 4);
            for (int64_t r = 0; r < R; r++) fill_logits_row(x + r * V, V, (int)((r + run) % 9));
            dev_reset();
            float *d_x = (float *)dev((size_t)(R * V + 1) * 4) + off;
            int32_t *d_out = dev((size_t)R * 4);
            up(d_x, x, (size_t)(R * V) * 4);
            assert_int_equal(osp_cuda_memset(d_out, 0x7B, (size_t)R * 4, g_stream), OSP_OK); /* not -1 */
            ok(osp_cuda_argmax(d_x, d_out, R, V, g_stream), "osp_cuda_argmax");
            down(out, d_out, (size_t)R * 4);
            for (int64_t r = 0; r < R; r++) {
                const int32_t want = ref_argmax(x + r * V, V);
                if (out[r] != want)
                    fail_msg("argmax R %lld V %lld off %d row %lld (kind %d): got %d, want %d", (long long)R,
                             (long long)V, off, (long long)r, (int)((r + run) % 9), out[r], want);
            }
            free(x), free(out);
        }
}

/* ---- fp32 -> bf16 ------------------------------------------------------------------------------------ */

static void test_f32_to_bf16(void **state) {
    (void)state;
    const int64_t ns[] = {1, 3, 4, 5, 1000, 4099, (1 << 20) + 3};
    const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, /* +-0, +-inf */
        0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7fbfffffu, /* NaNs, signalling ones too */
        0x00000001u, 0x807fffffu, 0x00008000u, 0x00018000u, /* subnormals, ties among them */
        0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,             /* the largest floats: round to inf */
        0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, /* ties to even, just below a tie */
    };
    const size_t n_special = sizeof special / sizeof special[0];
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int off = 0; off < 2; off++) {
            const int64_t n = ns[ni];
            float *in = xmalloc((size_t)n * 4);
            uint16_t *out = xmalloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) {
                const uint32_t r = rnd() % 4;
                uint32_t bits = r == 0 ? (rnd() << 11) ^ rnd() /* any bit pattern */
                                       : f32_bits(frand() * 100.0f);
                if (i < (int64_t)n_special && (n < 8 ? rnd() % 2 == 0 : 1)) bits = special[i];
                in[i] = bits_f32(bits);
            }
            dev_reset();
            float *d_in = (float *)dev((size_t)(n + 1) * 4) + off;
            uint16_t *d_out = (uint16_t *)dev((size_t)(n + 1) * 2) + off;
            up(d_in, in, (size_t)n * 4);
            poison(d_out, (size_t)n * 2);
            ok(osp_cuda_f32_to_bf16(d_in, d_out, n, g_stream), "osp_cuda_f32_to_bf16");
            down(out, d_out, (size_t)n * 2);
            char shape[64];
            snprintf(shape, sizeof shape, "n %lld off %d", (long long)n, off);
            cmp c = {"f32_to_bf16", 0};
            for (int64_t i = 0; i < n; i++) {
                if (isnan(in[i])) { /* NaN stays NaN (the payload may differ) */
                    if (!isnan(osp_bf16_to_fp32(out[i]))) same_bits(&c, i, out[i], osp_fp32_to_bf16(in[i]));
                    continue;
                }
                same_bits(&c, i, out[i], osp_fp32_to_bf16(in[i]));
            }
            done(&c, shape);
            free(in), free(out);
        }
}

/* ---- random fill: a copy of tools/osprey/cmd_make_random_model.c's mix64() and randn() ---------------- */

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float randn(uint64_t key, uint64_t i, float scale) {
    const uint64_t r = mix64(key + (i + 1) * 0x9e3779b97f4a7c15ull);
    const int32_t s = (int32_t)(r & 0xffff) + (int32_t)((r >> 16) & 0xffff) + (int32_t)((r >> 32) & 0xffff) +
                      (int32_t)(r >> 48) - 131070;
    return (float)s * scale;
}

static void test_fill_randn(void **state) {
    (void)state;
    const int64_t ns[] = {1, 3, 5, 1000, 4099, (1 << 20) + 1};
    const uint64_t keys[] = {0, 0x0123456789abcdefull, 0xfedcba9876543210ull};
    const uint64_t bases[] = {0, 12345, (uint64_t)1 << 40};
    const float scales[] = {(float)(0.02 / 37837.227), (float)(0.01 / 37837.227), 1.0f};
    const float offsets[] = {0.0f, 1.0f, 0.0f};
    int run = 0;
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++)
        for (int kind = 0; kind < 3; kind++, run++) {
            const int64_t n = ns[ni];
            const int off = run % 2;
            const uint64_t key = keys[run % 3], base = bases[(run / 3) % 3];
            const float scale = scales[kind], offset = offsets[kind];
            float *want = xmalloc((size_t)n * 4), *got32 = xmalloc((size_t)n * 4);
            uint16_t *got16 = xmalloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) want[i] = offset + randn(key, base + (uint64_t)i, scale);
            dev_reset();
            uint16_t *d16 = (uint16_t *)dev((size_t)(n + 1) * 2) + off;
            float *d32 = (float *)dev((size_t)(n + 1) * 4) + off;
            poison(d16, (size_t)n * 2);
            poison(d32, (size_t)n * 4);
            ok(osp_cuda_fill_randn_bf16(d16, n, key, base, scale, offset, g_stream), "osp_cuda_fill_randn_bf16");
            ok(osp_cuda_fill_randn_f32(d32, n, key, base, scale, offset, g_stream), "osp_cuda_fill_randn_f32");
            down(got16, d16, (size_t)n * 2);
            down(got32, d32, (size_t)n * 4);
            char shape[128];
            snprintf(shape, sizeof shape, "n %lld key %llx base %llu scale %g offset %g off %d", (long long)n,
                     (unsigned long long)key, (unsigned long long)base, scale, offset, off);
            cmp c16 = {"fill_randn_bf16", 0}, c32 = {"fill_randn_f32", 0};
            for (int64_t i = 0; i < n; i++) {
                same_bits(&c16, i, got16[i], osp_fp32_to_bf16(want[i]));
                same_bits(&c32, i, f32_bits(got32[i]), f32_bits(want[i]));
            }
            done(&c16, shape);
            done(&c32, shape);
            free(want), free(got32), free(got16);
        }
}

/* ---- a CUDA graph replays the same launches bit for bit ------------------------------------------------- */

static void test_graph_capture(void **state) {
    (void)state;
    const int64_t T = 5, E = 576, V = 11;
    uint16_t *tab = xmalloc((size_t)(V * E) * 2), *delta = xmalloc((size_t)(T * E) * 2);
    float *w = xmalloc((size_t)E * 4);
    int32_t ids[5] = {3, 0, 10, 3, 7};
    for (int64_t i = 0; i < V * E; i++) tab[i] = osp_fp32_to_bf16(frand());
    for (int64_t i = 0; i < T * E; i++) delta[i] = osp_fp32_to_bf16(frand());
    for (int64_t i = 0; i < E; i++) w[i] = 1.0f + 0.1f * frand();
    dev_reset();
    uint16_t *d_tab = dev((size_t)(V * E) * 2), *d_delta = dev((size_t)(T * E) * 2), *d_out = dev((size_t)(T * E) * 2);
    float *d_w = dev((size_t)E * 4), *d_x = dev((size_t)(T * E) * 4);
    int32_t *d_ids = dev(sizeof ids), *d_am = dev((size_t)T * 4);
    up(d_tab, tab, (size_t)(V * E) * 2);
    up(d_delta, delta, (size_t)(T * E) * 2);
    up(d_w, w, (size_t)E * 4);
    up(d_ids, ids, sizeof ids);

    float *x[2];
    uint16_t *out[2];
    int32_t am[2][5];
    for (int pass = 0; pass < 2; pass++) { /* 0: eager, 1: captured, replayed twice */
        x[pass] = xmalloc((size_t)(T * E) * 4);
        out[pass] = xmalloc((size_t)(T * E) * 2);
        void *graph = NULL;
        poison(d_x, (size_t)(T * E) * 4);
        poison(d_out, (size_t)(T * E) * 2);
        wait_stream();
        if (pass == 1) ok(osp_cuda_graph_begin(g_stream), "osp_cuda_graph_begin");
        ok(osp_cuda_embed(d_tab, d_ids, d_x, T, E, 1.0f, g_stream), "osp_cuda_embed");
        ok(osp_cuda_add_rmsnorm(d_x, d_delta, d_w, d_out, T, E, 1e-5f, g_stream), "osp_cuda_add_rmsnorm");
        ok(osp_cuda_argmax(d_x, d_am, T, E, g_stream), "osp_cuda_argmax");
        if (pass == 1) {
            ok(osp_cuda_graph_end(g_stream, &graph), "osp_cuda_graph_end");
            ok(osp_cuda_graph_launch(graph, g_stream), "osp_cuda_graph_launch");
            ok(osp_cuda_graph_launch(graph, g_stream), "osp_cuda_graph_launch");
        }
        down(x[pass], d_x, (size_t)(T * E) * 4);
        down(out[pass], d_out, (size_t)(T * E) * 2);
        down(am[pass], d_am, sizeof am[pass]);
        osp_cuda_graph_destroy(graph);
    }
    assert_memory_equal(x[0], x[1], (size_t)(T * E) * 4);
    assert_memory_equal(out[0], out[1], (size_t)(T * E) * 2);
    assert_memory_equal(am[0], am[1], sizeof am[0]);
    for (int64_t t = 0; t < T; t++) assert_int_equal(am[0][t], ref_argmax(x[0] + t * E, E));
    for (int p = 0; p < 2; p++) free(x[p]), free(out[p]);
    free(tab), free(delta), free(w);
}

/* ---- many small host <-> device copies (osp_cuda_copy_many) -------------------------------------------- */

/* Segments of every alignment and length (0, odd, 16-byte multiples, one large), laid out in host order
 * and scattered in reverse order on the device; host memory registered (the kernel path), pageable (the
 * cudaMemcpyAsync path), and mixed (one pageable segment sends the call down the second). Every segment
 * must arrive, and every byte between segments keep its poison. */
#define CM_SEGS 257
#define CM_BYTES ((size_t)6 << 20)
static void copy_many_case(uint8_t *h_src, uint8_t *h_dst, uint8_t *d, const char *what) {
    void *dst[CM_SEGS];
    const void *src[CM_SEGS];
    size_t len[CM_SEGS], hoff[CM_SEGS], doff[CM_SEGS];
    size_t at = 0;
    for (int i = 0; i < CM_SEGS; i++) { /* host layout */
        const uint32_t r = (uint32_t)rnd();
        len[i] = i == 7 ? 0 : i == 100 ? ((size_t)1 << 20) : (i % 3 == 0) ? (size_t)(r % 64 + 1) * 16 : (size_t)(r % 3000 + 1);
        at += (i % 4 == 0) ? 16 : (r % 37);
        hoff[i] = at;
        at += len[i];
    }
    assert_true(at <= CM_BYTES);
    at = 0;
    for (int i = CM_SEGS - 1; i >= 0; i--) { /* device layout: reversed, other gaps */
        at += (i % 5 == 0) ? 32 : (size_t)(i % 13);
        doff[i] = at;
        at += len[i];
    }
    assert_true(at <= CM_BYTES);
    for (size_t i = 0; i < CM_BYTES; i++) h_src[i] = (uint8_t)(i * 131u + 7u);
    poison(d, CM_BYTES);
    wait_stream();
    for (int i = 0; i < CM_SEGS; i++) dst[i] = d + doff[i], src[i] = h_src + hoff[i];
    ok(osp_cuda_copy_many(false, CM_SEGS, dst, src, len, g_stream), "osp_cuda_copy_many (to the device)");
    uint8_t *got = xmalloc(CM_BYTES), *mark = xmalloc(CM_BYTES);
    down(got, d, CM_BYTES);
    memset(mark, 0, CM_BYTES);
    cmp c = {what, 0};
    for (int i = 0; i < CM_SEGS; i++)
        for (size_t k = 0; k < len[i]; k++) same_bits(&c, (int64_t)(doff[i] + k), got[doff[i] + k], h_src[hoff[i] + k]), mark[doff[i] + k] = 1;
    for (size_t k = 0; k < CM_BYTES; k++)
        if (!mark[k]) same_bits(&c, (int64_t)k, got[k], 0xFF);
    done(&c, "to the device");
    /* and back, gathered from the device into the host layout */
    memset(h_dst, 0xA5, CM_BYTES);
    for (int i = 0; i < CM_SEGS; i++) dst[i] = h_dst + hoff[i], src[i] = d + doff[i];
    ok(osp_cuda_copy_many(true, CM_SEGS, dst, src, len, g_stream), "osp_cuda_copy_many (to the host)");
    memset(mark, 0, CM_BYTES);
    for (int i = 0; i < CM_SEGS; i++)
        for (size_t k = 0; k < len[i]; k++) same_bits(&c, (int64_t)(hoff[i] + k), h_dst[hoff[i] + k], h_src[hoff[i] + k]), mark[hoff[i] + k] = 1;
    for (size_t k = 0; k < CM_BYTES; k++)
        if (!mark[k]) same_bits(&c, (int64_t)k, h_dst[k], 0xA5);
    done(&c, "to the host");
    free(got), free(mark);
}

static void test_copy_many(void **state) {
    (void)state;
    dev_reset();
    uint8_t *d = dev(CM_BYTES);
    uint8_t *reg = aligned_alloc(4096, 2 * CM_BYTES), *page = xmalloc(2 * CM_BYTES);
    assert_non_null(reg);
    ok(osp_cuda_host_register(reg, 2 * CM_BYTES), "osp_cuda_host_register");
    copy_many_case(reg, reg + CM_BYTES, d, "registered");
    copy_many_case(page, page + CM_BYTES, d, "pageable");
    copy_many_case(reg, page, d, "registered to pageable");
    copy_many_case(page, reg, d, "pageable to registered");
    /* a segment that runs past the registered range's end goes the cudaMemcpyAsync way, whole */
    const size_t tail = 1000;
    uint8_t *edge = reg + 2 * CM_BYTES - tail, *after = xmalloc(2 * tail);
    for (size_t k = 0; k < tail; k++) edge[k] = (uint8_t)(k * 7u + 1u);
    memset(after, 0x5A, 2 * tail);
    void *dst1[1] = {d};
    const void *src1[1] = {edge};
    size_t n1[1] = {tail};
    ok(osp_cuda_copy_many(false, 1, dst1, src1, n1, g_stream), "osp_cuda_copy_many (edge)");
    down(after, d, tail);
    assert_memory_equal(after, edge, tail);
    assert_int_equal(osp_cuda_copy_many(false, 0, NULL, NULL, NULL, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_copy_many(false, 2, NULL, NULL, NULL, g_stream), OSP_ERR_INVALID_ARG);
    osp_cuda_host_unregister(reg);
    free(reg), free(page), free(after);
}

/* ---- argument checks ----------------------------------------------------------------------------------- */

static void test_invalid_args(void **state) {
    (void)state;
    dev_reset();
    void *d = dev(1 << 20);
    float *f = d;
    uint16_t *h = d;
    int32_t *ids = d;
    /* rope: head_dim over the limit, odd n_rot, n_rot > head_dim, no heads */
    assert_int_equal(osp_cuda_rope_kv_write(f, NULL, NULL, NULL, ids, f, ids, h, d, d, OSP_KV_PAGE_F16, 1, 1, 1, 2048, 64, true,
                                            1e-6f, g_stream),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_rope_kv_write(f, NULL, NULL, NULL, ids, f, ids, h, d, d, OSP_KV_PAGE_F16, 1, 1, 1, 64, 63, true,
                                            1e-6f, g_stream),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_rope_kv_write(f, NULL, NULL, NULL, ids, f, ids, h, d, d, OSP_KV_PAGE_F16, 1, 1, 1, 64, 128, true,
                                            1e-6f, g_stream),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_rope_kv_write(f, NULL, NULL, NULL, ids, f, ids, h, d, d, OSP_KV_PAGE_F16, 1, 0, 1, 64, 64, true,
                                            1e-6f, g_stream),
                     OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_argmax(f, ids, 1, 0, g_stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_add_rmsnorm(f, NULL, f, h, 1, 0, 1e-5f, g_stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_embed(NULL, ids, f, 1, 64, 1.0f, g_stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_silu_mul(h, h, -1, 64, g_stream), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_cuda_f32_to_bf16(f, NULL, 5, g_stream), OSP_ERR_INVALID_ARG);
    /* empty batches are fine and launch nothing */
    assert_int_equal(osp_cuda_embed(h, ids, f, 0, 64, 1.0f, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_add_rmsnorm(f, NULL, f, h, 0, 64, 1e-5f, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_gather_rmsnorm(f, ids, f, h, 0, 64, 1e-5f, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_rope_kv_write(f, NULL, NULL, NULL, ids, f, ids, h, d, d, OSP_KV_PAGE_F16, 0, 1, 1, 64, 64, true,
                                            1e-6f, g_stream),
                     OSP_OK);
    assert_int_equal(osp_cuda_silu_mul(h, h, 0, 64, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_argmax(f, ids, 0, 64, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_f32_to_bf16(f, h, 0, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_fill_randn_bf16(h, 0, 1, 0, 1.0f, 0.0f, g_stream), OSP_OK);
    assert_int_equal(osp_cuda_fill_randn_f32(f, 0, 1, 0, 1.0f, 0.0f, g_stream), OSP_OK);
    wait_stream();
}

int main(void) {
    if (osp_cuda_device_count() == 0) {
        printf("test_gpu_ops: skipped: no CUDA device\n");
        return 77;
    }
    char name[256];
    if (osp_cuda_device_name(name, sizeof name) == OSP_OK) printf("test_gpu_ops: %s\n", name);
    void *arena = NULL;
    if (osp_cuda_stream_create(&g_stream) != OSP_OK || osp_cuda_malloc(&arena, ARENA_BYTES, "test arena") != OSP_OK) {
        fprintf(stderr, "test_gpu_ops: %s\n", osp_last_error());
        return 1;
    }
    g_arena = arena;
    g_arena_cap = ARENA_BYTES;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embed),          cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_gather_rmsnorm), cmocka_unit_test(test_rope_kv_write),
        cmocka_unit_test(test_silu_mul),       cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_f32_to_bf16),    cmocka_unit_test(test_fill_randn),
        cmocka_unit_test(test_graph_capture),  cmocka_unit_test(test_invalid_args),
        cmocka_unit_test(test_copy_many),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    osp_cuda_free(arena);
    osp_cuda_stream_destroy(g_stream);
    return rc;
}

#else
int main(void) {
    printf("test_gpu_ops: skipped: osprey was built without CUDA\n");
    return 77;
}
#endif
