/* Quantized KV against f16 KV on SmolLM2-135M (issue 13): the cross-dtype rule the engine tests
 * refer to. The first 128 tokens of the GPL-3 text (/usr/share/common-licenses/GPL-3, Debian's
 * base-files; the test skips where it is absent) are teacher-forced in two chunks of 64 with f16, f32,
 * fp8 and nvfp4 KV pages on the default (fast) CPU path, and every position's argmax and distribution
 * are compared with the f16 run's, and a split cache (K fp8 + V nvfp4) too.
 *
 * Why agreement rates and not equal tokens: fp8 (3 mantissa bits) and nvfp4 (E2M1 in micro-blocks of
 * 16) perturb every K and V by a few percent, which moves logits by up to several units on this small
 * model (bench/kv/kv_accuracy: max |dlogit| 6 for fp8, 19 for nvfp4 over 512 tokens), so greedy
 * tokens part from f16's at the first near-tie. Measured here (x86-64, AVX-512): top-1 agreement 0.945
 * (fp8, K rotated) and 0.805 (nvfp4), mean KL 0.014 and 0.27 nats. Asserted with room for another CPU's matmul
 * rounding: f32 agrees with f16 on >= 0.98 of positions with KL < 1e-3 (f16 rounding alone is tiny),
 * fp8 on >= 0.85 with KL < 0.1, nvfp4 on >= 0.65 with KL < 0.6, and fp8 is closer than nvfp4 in KL (a
 * format or scale regression shows up as a drop below these, a decoding bug as agreement near 0). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "osprey/model.h"
#include "osprey/tokenizer.h"

#define N 128
#define CHUNK 64

static osp_model *g_m;
static int32_t g_ids[N];
static int32_t g_V;

/* K pages of dk and V pages of dv (the default fixed scales). */
static void forward_kv(osp_kv_dtype dk, osp_kv_dtype dv, float *logits) {
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create_with_scales(g_m, N / 16, 16, dk, dv, NULL, NULL, &kv), OSP_OK);
    int32_t bt[N / 16], pos[CHUNK], li[CHUNK];
    for (int32_t i = 0; i < N / 16; i++) bt[i] = N / 16 - 1 - i; /* blocks in reverse order */
    for (int32_t t0 = 0; t0 < N; t0 += CHUNK) {
        int32_t slot[CHUNK];
        for (int32_t i = 0; i < CHUNK; i++) {
            pos[i] = t0 + i, li[i] = i;
            slot[i] = bt[(t0 + i) / 16] * 16 + (t0 + i) % 16;
        }
        int32_t qsl[2] = {0, CHUNK}, sl[1] = {t0 + CHUNK};
        osp_batch b = {.num_tokens = CHUNK, .token_ids = g_ids + t0, .positions = pos, .slot_mapping = slot,
                       .num_seqs = 1, .query_start_loc = qsl, .seq_lens = sl, .block_table = bt,
                       .max_blocks_per_seq = N / 16, .num_logits = CHUNK, .logits_indices = li};
        assert_int_equal(osp_model_forward(g_m, kv, &b, logits + (size_t)t0 * (size_t)g_V), OSP_OK);
    }
    osp_kv_cache_free(kv);
}

static void forward_all(osp_kv_dtype dt, float *logits) { forward_kv(dt, dt, logits); }

static double lse(const float *x) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < g_V; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int32_t i = 0; i < g_V; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

static int32_t argmax(const float *x) {
    int32_t a = 0;
    for (int32_t i = 1; i < g_V; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* Top-1 agreement (count) and mean KL(base || other) in nats over the N positions. */
static double compare(const float *base, const float *other, int *agree_out) {
    int agree = 0;
    double kl = 0;
    for (int32_t t = 0; t < N; t++) {
        const float *a = base + (size_t)t * g_V, *b = other + (size_t)t * g_V;
        agree += argmax(a) == argmax(b);
        const double la = lse(a), lb = lse(b);
        for (int32_t i = 0; i < g_V; i++) kl += exp(a[i] - la) * ((a[i] - la) - (b[i] - lb));
    }
    *agree_out = agree;
    return kl / N;
}

static void test_agreement_with_f16(void **state) {
    (void)state;
    if (!g_m) skip();
    float *base = malloc(sizeof *base * N * (size_t)g_V), *other = malloc(sizeof *other * N * (size_t)g_V);
    assert_non_null(base), assert_non_null(other);
    forward_all(OSP_KV_DTYPE_F16, base);
    const osp_kv_dtype dts[3] = {OSP_KV_DTYPE_F32, OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4};
    const double min_agree[3] = {0.98, 0.85, 0.65}, max_kl[3] = {1e-3, 0.1, 0.6};
    double kls[3];
    for (int d = 0; d < 3; d++) {
        forward_all(dts[d], other);
        int agree;
        const double kl = kls[d] = compare(base, other, &agree);
        printf("kv %s vs f16: top-1 agreement %d/%d, mean KL %.6f nats\n", osp_kv_dtype_name(dts[d]), agree, N, kl);
        if ((double)agree / N < min_agree[d] || !(kl < max_kl[d]))
            fail_msg("kv %s: agreement %d/%d (>= %.2f wanted), KL %.4f (< %.3g wanted)", osp_kv_dtype_name(dts[d]), agree,
                     N, min_agree[d], kl, max_kl[d]);
    }
    assert_true(kls[1] < kls[2]);
    /* the K/V split, K fp8 (rotated) + V nvfp4 (a split cache: K and V pages of their own dtypes).
     * Measured here (x86-64, AVX-512): agreement 117/128, mean KL 0.0444 nats, between fp8's 0.0145 and
     * nvfp4's 0.269 (nvfp4's loss is mostly K's; bench/RESULTS.md). Asserted: agreement >= 0.80, KL <
     * 0.15, and below half of nvfp4's (a split that stored K in nvfp4, or V in fp8's format, fails) */
    forward_kv(OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, other);
    int agree;
    const double kl = compare(base, other, &agree);
    printf("kv fp8/nvfp4 (K/V) vs f16: top-1 agreement %d/%d, mean KL %.6f nats\n", agree, N, kl);
    if ((double)agree / N < 0.80 || !(kl < 0.15) || !(kl < 0.5 * kls[2]))
        fail_msg("kv fp8/nvfp4: agreement %d/%d (>= 0.80 wanted), KL %.4f (< 0.15 and < %.4f wanted)", agree, N, kl,
                 0.5 * kls[2]);
    free(base), free(other);
}

/* The rotated-K pages (kv_layout.h's k_hadamard, on by default for fp8 / nvfp4 on the CPU) against the
 * same pages unrotated (OSPREY_KV_HADAMARD=0). Measured here (x86-64, AVX-512): fp8's KL to f16 drops
 * 0.0247 -> 0.0145 nats (agreement 118 -> 121 of 128); nvfp4's barely moves on these 128 positions
 * (0.2703 -> 0.2686: its loss over the first tokens is not K's outliers; over 4088 positions at ctx 1024
 * the perplexity cost falls from +17.5 % to +7.5 %, bench/RESULTS.md). Asserted: fp8's KL falls by a
 * fifth at least, nvfp4's does not grow by more than 10 %. A rotation applied to K but not to q, or
 * twice, fails both by a wide margin. */
static void test_hadamard_k(void **state) {
    (void)state;
    if (!g_m) skip();
    float *base = malloc(sizeof *base * N * (size_t)g_V), *other = malloc(sizeof *other * N * (size_t)g_V);
    assert_non_null(base), assert_non_null(other);
    forward_all(OSP_KV_DTYPE_F16, base);
    double kl[2][2];
    for (int rot = 0; rot < 2; rot++) {
        if (rot) unsetenv("OSPREY_KV_HADAMARD");
        else setenv("OSPREY_KV_HADAMARD", "0", 1);
        for (int d = 0; d < 2; d++) {
            forward_all(d ? OSP_KV_DTYPE_NVFP4 : OSP_KV_DTYPE_FP8, other);
            int agree;
            kl[rot][d] = compare(base, other, &agree);
            printf("kv %s, K %s: top-1 agreement %d/%d, mean KL %.6f nats\n", d ? "nvfp4" : "fp8",
                   rot ? "rotated" : "plain", agree, N, kl[rot][d]);
        }
    }
    unsetenv("OSPREY_KV_HADAMARD");
    assert_true(kl[1][0] < 0.8 * kl[0][0]);
    assert_true(kl[1][1] < 1.1 * kl[0][1]);
    free(base), free(other);
}

int main(void) {
    const char *path = getenv("OSPREY_MODEL");
    FILE *f = fopen("/usr/share/common-licenses/GPL-3", "rb");
    if (!path || access(path, R_OK) != 0 || !f) {
        printf("SKIP: OSPREY_MODEL or /usr/share/common-licenses/GPL-3 missing\n");
        if (f) fclose(f);
        return 77;
    }
    static char text[8192];
    const size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = 2;
    if (osp_model_load(path, &mp, &g_m) != OSP_OK) return 1;
    osp_tokenizer *tok;
    if (osp_tokenizer_load(osp_model_gguf(g_m), &tok) != OSP_OK) return 1;
    int32_t *ids;
    size_t n;
    if (osp_tokenizer_encode(tok, text, len, true, false, &ids, &n) != OSP_OK || n < N) return 1;
    memcpy(g_ids, ids, sizeof g_ids);
    free(ids);
    osp_tokenizer_free(tok);
    g_V = osp_model_config_get(g_m)->n_vocab;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_agreement_with_f16), cmocka_unit_test(test_hadamard_k)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    osp_model_free(g_m);
    return rc;
}
