/* SmolLM2-135M (OSPREY_MODEL) on the GPU against the CPU reference path (--exact: fp32 activations,
 * f32 KV cache), and CUDA-graph replay against eager execution. Skipped (77) without a CUDA device or
 * the model file.
 *
 * Teacher forcing: each prompt runs as one prefill on both backends with logits at every position.
 * Tolerance, derived: the GPU rounds weights and every GEMM input to bf16 (unit roundoff u = 2^-9
 * each, so a product's relative error is ~2u = 2^-8) and keeps the residual stream in fp32. The
 * 2L = 60 sub-layers add errors that are independent in sign, so the final hidden state's relative
 * error grows like sqrt(2L) * 2^-8 ~= 0.03, and a logit z inherits about that times the typical
 * logit size. Per position: max |dz| <= 4 * sqrt(2L) * 2^-8 * rms(z - mean z) (4 sigma). The argmax may
 * differ only where the reference's top-2 margin is below twice that bound; over all positions top-1
 * must agree at >= 99% (the floor).
 * Greedy: 48 tokens from each prompt on both backends must be identical up to the first position
 * where the CPU's top-2 margin is below delta = 2 * that bound (then the rest is not compared), and the
 * GPU text is printed.
 * Graphs: decode steps at batch sizes 1, 3 and 8 replayed from CUDA graphs give bitwise the same logits
 * as eager execution of the same padded shapes (OSPREY_CUDA_GRAPHS=0).
 * Random weights: a preset drawn on the GPU equals the GGUF make-random-model writes (same logits). */
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

#include "backend/cuda/cuda_ops.h"
#include "osprey/model.h"
#include "osprey/tokenizer.h"

#define BS 16
#define MAX_LEN 512
#define N_GEN 48

static const char *g_path;
static osp_model *g_cpu, *g_gpu;
static osp_tokenizer *g_tok;

static const char *k_prompts[] = {
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "Water boils at 100 degrees Celsius at sea level. At higher altitudes, the boiling point",
    "<|im_start|>user\nList three fruits that are red.<|im_end|>\n<|im_start|>assistant\n",
};
#define N_PROMPTS ((int)(sizeof k_prompts / sizeof k_prompts[0]))

/* One sequence occupying blocks 0.. of its cache: positions [p0, p0 + n). */
typedef struct seq_batch {
    int32_t ids[MAX_LEN], pos[MAX_LEN], slot[MAX_LEN], lidx[MAX_LEN], qsl[2], seq_len, bt[MAX_LEN / BS];
    osp_batch b;
} seq_batch;

static void make_batch(seq_batch *s, const int32_t *ids, int32_t p0, int32_t n, bool all_logits) {
    for (int32_t i = 0; i < MAX_LEN / BS; i++) s->bt[i] = i;
    for (int32_t i = 0; i < n; i++) {
        s->ids[i] = ids[i];
        s->pos[i] = p0 + i;
        s->slot[i] = p0 + i;
        s->lidx[i] = all_logits ? i : n - 1;
    }
    s->qsl[0] = 0, s->qsl[1] = n;
    s->seq_len = p0 + n;
    s->b = (osp_batch){.num_tokens = n, .token_ids = s->ids, .positions = s->pos, .slot_mapping = s->slot,
                       .num_seqs = 1, .query_start_loc = s->qsl, .seq_lens = &s->seq_len, .block_table = s->bt,
                       .max_blocks_per_seq = MAX_LEN / BS, .num_logits = all_logits ? n : 1, .logits_indices = s->lidx};
}

static int32_t argmax(const float *z, int32_t n, float *margin) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (z[i] > z[b]) b = i;
    float second = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (i != b && z[i] > second) second = z[i];
    if (margin) *margin = z[b] - second;
    return b;
}

static float row_bound(const float *z, int32_t n, int32_t n_layer) {
    double mean = 0, var = 0;
    for (int32_t i = 0; i < n; i++) mean += z[i];
    mean /= n;
    for (int32_t i = 0; i < n; i++) var += (z[i] - mean) * (z[i] - mean);
    return (float)(4.0 * sqrt(2.0 * n_layer) * ldexp(1.0, -8) * sqrt(var / n));
}

static int32_t encode(const char *text, int32_t *ids) {
    int32_t *tmp;
    size_t n;
    if (osp_tokenizer_encode(g_tok, text, strlen(text), true, true, &tmp, &n) != OSP_OK) fail_msg("%s", osp_last_error());
    if (n > MAX_LEN - N_GEN) n = MAX_LEN - N_GEN;
    memcpy(ids, tmp, n * sizeof *ids);
    free(tmp);
    return (int32_t)n;
}

static void test_teacher_forcing(void **state) {
    (void)state;
    const osp_model_config *c = osp_model_config_get(g_cpu);
    const int32_t V = c->n_vocab;
    float *zc = malloc(sizeof(float) * MAX_LEN * (size_t)V), *zg = malloc(sizeof(float) * MAX_LEN * (size_t)V);
    assert_non_null(zc);
    assert_non_null(zg);
    long positions = 0, top1 = 0;
    double max_d = 0, max_ratio = 0, sum_d = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        int32_t ids[MAX_LEN];
        const int32_t n = encode(k_prompts[p], ids);
        osp_kv_cache *kc, *kg;
        assert_int_equal(osp_kv_cache_create(g_cpu, MAX_LEN / BS, BS, OSP_KV_DTYPE_F32, &kc), OSP_OK);
        assert_int_equal(osp_kv_cache_create(g_gpu, MAX_LEN / BS, BS, OSP_KV_DTYPE_F16, &kg), OSP_OK);
        seq_batch sb;
        make_batch(&sb, ids, 0, n, true);
        for (size_t i = 0; i < (size_t)n * (size_t)V; i++) zg[i] = NAN; /* poison */
        assert_int_equal(osp_model_forward(g_cpu, kc, &sb.b, zc), OSP_OK);
        if (osp_model_forward(g_gpu, kg, &sb.b, zg) != OSP_OK) fail_msg("gpu forward: %s", osp_last_error());
        for (int32_t t = 0; t < n; t++) {
            const float *a = zc + (size_t)t * V, *b = zg + (size_t)t * V;
            const float bound = row_bound(a, V, c->n_layer);
            double md = 0;
            for (int32_t i = 0; i < V; i++) {
                const double d = fabs((double)a[i] - (double)b[i]);
                if (!(d <= bound)) /* NaN fails too */
                    fail_msg("prompt %d position %d token %d: cpu %g gpu %g (bound %g)", p, t, i, (double)a[i], (double)b[i],
                             (double)bound);
                md = d > md ? d : md;
                sum_d += d;
            }
            max_d = md > max_d ? md : max_d;
            max_ratio = md / bound > max_ratio ? md / bound : max_ratio;
            top1 += argmax(a, V, NULL) == argmax(b, V, NULL);
            positions++;
        }
        osp_kv_cache_free(kc);
        osp_kv_cache_free(kg);
    }
    printf("teacher forcing: %ld positions, top-1 agreement %ld/%ld (%.2f%%), max |dlogit| %.4f, mean %.5f, "
           "max |dlogit| / bound %.3f\n",
           positions, top1, positions, 100.0 * (double)top1 / (double)positions, max_d,
           sum_d / ((double)positions * V), max_ratio);
    assert_true(top1 * 100 >= positions * 99);
    free(zc);
    free(zg);
}

/* Greedy decoding of one prompt on one backend; margins[i] the top-2 margin at output i. */
static void greedy(osp_model *m, osp_kv_dtype kd, const int32_t *ids, int32_t n, int32_t *out, float *margins) {
    const int32_t V = osp_model_config_get(m)->n_vocab;
    float *z = malloc(sizeof(float) * (size_t)V);
    osp_kv_cache *kv;
    assert_int_equal(osp_kv_cache_create(m, MAX_LEN / BS, BS, kd, &kv), OSP_OK);
    seq_batch sb;
    make_batch(&sb, ids, 0, n, false);
    assert_int_equal(osp_model_forward(m, kv, &sb.b, z), OSP_OK);
    for (int32_t k = 0; k < N_GEN; k++) {
        out[k] = argmax(z, V, &margins[k]);
        make_batch(&sb, &out[k], n + k, 1, false);
        if (osp_model_forward(m, kv, &sb.b, z) != OSP_OK) fail_msg("forward: %s", osp_last_error());
    }
    osp_kv_cache_free(kv);
    free(z);
}

static void test_greedy(void **state) {
    (void)state;
    const osp_model_config *c = osp_model_config_get(g_cpu);
    long compared = 0, total = 0;
    for (int p = 0; p < N_PROMPTS; p++) {
        int32_t ids[MAX_LEN], oc[N_GEN], og[N_GEN];
        float mc[N_GEN], mg[N_GEN];
        const int32_t n = encode(k_prompts[p], ids);
        greedy(g_cpu, OSP_KV_DTYPE_F32, ids, n, oc, mc);
        greedy(g_gpu, OSP_KV_DTYPE_F16, ids, n, og, mg);
        /* delta: twice the teacher-forcing bound at a typical logit spread (rms ~ 3 for SmolLM2 rows) */
        const float delta = 2.0f * (float)(4.0 * sqrt(2.0 * c->n_layer) * ldexp(1.0, -8)) * 3.0f;
        int32_t k = 0;
        for (; k < N_GEN && mc[k] >= delta; k++)
            if (oc[k] != og[k]) fail_msg("prompt %d: greedy token %d differs (cpu %d, gpu %d) at margin %.3f >= %.3f", p, k, oc[k], og[k], (double)mc[k], (double)delta);
        int32_t same = 0;
        while (same < N_GEN && oc[same] == og[same]) same++;
        compared += k;
        total += N_GEN;
        osp_detokenizer *dt;
        assert_int_equal(osp_detokenizer_new(g_tok, &dt), OSP_OK);
        char text[4096] = {0};
        size_t len = 0;
        for (int32_t i = 0; i < N_GEN; i++) {
            char piece[256];
            size_t pl = 0;
            if (osp_detokenizer_push(dt, og[i], piece, sizeof piece, &pl) == OSP_OK && len + pl < sizeof text - 1) {
                memcpy(text + len, piece, pl);
                len += pl;
            }
        }
        osp_detokenizer_free(dt);
        printf("prompt %d: %d/%d greedy tokens identical (compared up to margin < %.3f: %d); gpu text: %.*s\n", p, same,
               N_GEN, (double)delta, k, (int)len, text);
    }
    printf("greedy: %ld of %ld tokens compared before a small margin, all identical\n", compared, total);
}

static void test_graphs_match_eager(void **state) {
    (void)state;
    osp_model *eager;
    osp_model_params mp = osp_model_default_params();
    mp.device = OSP_DEVICE_CUDA;
    setenv("OSPREY_CUDA_GRAPHS", "0", 1);
    assert_int_equal(osp_model_load(g_path, &mp, &eager), OSP_OK);
    unsetenv("OSPREY_CUDA_GRAPHS");
    const int32_t V = osp_model_config_get(eager)->n_vocab;
    const int sizes[3] = {1, 3, 8};
    for (int si = 0; si < 3; si++) {
        const int S = sizes[si];
        osp_kv_cache *ka, *kb;
        assert_int_equal(osp_kv_cache_create(eager, 64, BS, OSP_KV_DTYPE_F16, &ka), OSP_OK);
        assert_int_equal(osp_kv_cache_create(g_gpu, 64, BS, OSP_KV_DTYPE_F16, &kb), OSP_OK);
        /* S sequences of 2 blocks each; prefill 20 tokens each (eager on both), then 6 decode steps */
        int32_t ids[8 * 20], pos[8 * 20], slot[8 * 20], qsl[9], lens[8], bt[8 * 2], lidx[8 * 20];
        for (int s = 0; s < S; s++) {
            bt[s * 2] = 2 * s, bt[s * 2 + 1] = 2 * s + 1;
            lens[s] = 20;
            qsl[s] = s * 20;
            for (int i = 0; i < 20; i++) {
                const int t = s * 20 + i;
                ids[t] = 100 + (s * 7 + i * 13) % 900, pos[t] = i, slot[t] = 2 * s * BS + i, lidx[t] = t;
            }
        }
        qsl[S] = S * 20;
        osp_batch b = {S * 20, ids, pos, slot, S, qsl, lens, bt, 2, S, lidx};
        for (int s = 0; s < S; s++) lidx[s] = s * 20 + 19;
        float *za = malloc(sizeof(float) * (size_t)S * V), *zb = malloc(sizeof(float) * (size_t)S * V);
        assert_int_equal(osp_model_forward(eager, ka, &b, za), OSP_OK);
        assert_int_equal(osp_model_forward(g_gpu, kb, &b, zb), OSP_OK);
        for (int step = 0; step < 6; step++) {
            for (int s = 0; s < S; s++) {
                ids[s] = argmax(za + (size_t)s * V, V, NULL);
                pos[s] = 20 + step;
                slot[s] = 2 * s * BS + 20 + step;
                qsl[s] = s;
                lens[s] = 21 + step;
                lidx[s] = s;
            }
            qsl[S] = S;
            osp_batch d = {S, ids, pos, slot, S, qsl, lens, bt, 2, S, lidx};
            assert_int_equal(osp_model_forward(eager, ka, &d, za), OSP_OK);
            assert_int_equal(osp_model_forward(g_gpu, kb, &d, zb), OSP_OK); /* step 0 captures, then replays */
            if (memcmp(za, zb, sizeof(float) * (size_t)S * V) != 0)
                fail_msg("batch %d decode step %d: graph replay differs from eager execution", S, step);
        }
        free(za);
        free(zb);
        osp_kv_cache_free(ka);
        osp_kv_cache_free(kb);
    }
    osp_model_free(eager);
}

/* --random-weights draws on the GPU exactly the weights make-random-model writes: the same batch gives
 * bitwise the same logits from the GGUF (bf16, loaded and uploaded) and from the preset (drawn there). */
static void test_random_weights_match_gguf(void **state) {
    (void)state;
    const char *bin = getenv("OSPREY_BIN");
    if (!bin) skip();
    char path[256], cmd[768];
    snprintf(path, sizeof path, "/tmp/osprey-test-random-%d.gguf", (int)getpid());
    snprintf(cmd, sizeof cmd, "%s make-random-model --preset smollm2-135m --dtype bf16 --seed 7 -o %s 2>/dev/null", bin, path);
    if (system(cmd) != 0) fail_msg("%s failed", cmd);
    osp_model_params mp = osp_model_default_params();
    mp.device = OSP_DEVICE_CUDA;
    osp_model *a, *b;
    if (osp_model_load(path, &mp, &a) != OSP_OK) fail_msg("load: %s", osp_last_error());
    if (osp_model_load_random("smollm2-135m", 7, &mp, &b) != OSP_OK) fail_msg("random: %s", osp_last_error());
    remove(path);
    const int32_t V = osp_model_config_get(a)->n_vocab;
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = 3 + (i * 37) % 1000;
    osp_kv_cache *ka, *kb;
    assert_int_equal(osp_kv_cache_create(a, MAX_LEN / BS, BS, OSP_KV_DTYPE_F16, &ka), OSP_OK);
    assert_int_equal(osp_kv_cache_create(b, MAX_LEN / BS, BS, OSP_KV_DTYPE_F16, &kb), OSP_OK);
    seq_batch sb;
    make_batch(&sb, ids, 0, 40, true);
    float *za = malloc(sizeof(float) * 40 * (size_t)V), *zb = malloc(sizeof(float) * 40 * (size_t)V);
    assert_int_equal(osp_model_forward(a, ka, &sb.b, za), OSP_OK);
    assert_int_equal(osp_model_forward(b, kb, &sb.b, zb), OSP_OK);
    assert_memory_equal(za, zb, sizeof(float) * 40 * (size_t)V);
    free(za);
    free(zb);
    osp_kv_cache_free(ka);
    osp_kv_cache_free(kb);
    osp_model_free(a);
    osp_model_free(b);
}

int main(void) {
    if (osp_cuda_device_count() == 0) {
        printf("test_gpu_model: skipped: no CUDA device\n");
        return 77;
    }
    g_path = getenv("OSPREY_MODEL");
    FILE *f = g_path ? fopen(g_path, "rb") : NULL;
    if (!f) {
        printf("test_gpu_model: skipped: OSPREY_MODEL (SmolLM2-135M-Instruct Q4_1) not found\n");
        return 77;
    }
    fclose(f);
    osp_model_params mp = osp_model_default_params();
    mp.exact = true;
    if (osp_model_load(g_path, &mp, &g_cpu) != OSP_OK) {
        fprintf(stderr, "load (cpu): %s\n", osp_last_error());
        return 1;
    }
    mp.exact = false;
    mp.device = OSP_DEVICE_CUDA;
    if (osp_model_load(g_path, &mp, &g_gpu) != OSP_OK) {
        fprintf(stderr, "load (cuda): %s\n", osp_last_error());
        return 1;
    }
    if (osp_tokenizer_load(osp_model_gguf(g_cpu), &g_tok) != OSP_OK) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_teacher_forcing),
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_graphs_match_eager),
        cmocka_unit_test(test_random_weights_match_gguf),
    };
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    osp_tokenizer_free(g_tok);
    osp_model_free(g_gpu);
    osp_model_free(g_cpu);
    return rc;
}
