/* Golden test: one tiny random model per architecture against HF transformers.
 *
 * tests/golden/make_arch_fixtures.py built each model with transformers from a seeded config (vocab
 * 512, hidden 64, 2 layers, 4 heads / 2 kv heads, weights scaled so logits spread over several
 * units), saved it as F32 GGUF the way llama.cpp's converter lays it out, and recorded transformers'
 * fp32 CPU logits (top 20 + log-sum-exp per position) for four fixed token-id prompts and their
 * 32-token greedy continuations:
 *   llama3   LlamaForCausalLM, llama3 rope scaling (rope_freqs.weight), untied, interleaved RoPE
 *   mistral  MistralForCausalLM (GGUF arch llama), head_dim 32 != hidden / heads, untied
 *   qwen2    Qwen2ForCausalLM: q/k/v biases, tied output, NeoX RoPE
 *   qwen3    Qwen3ForCausalLM: per-head q/k RMSNorm, head_dim 32, untied, NeoX RoPE
 *   gemma3   Gemma3ForCausalLM: 7 layers (layer 5 global, the rest sliding with a window of
 *            8 keys so the 40-token prompt crosses it), local/global RoPE bases, q/k norms, pre- and
 *            post-norms, GELU(tanh) MLP, embeddings scaled by sqrt(hidden), tied, head_dim 32 with
 *            4 heads of a 64 hidden (q-proj 64 -> 128), 1 kv head
 * Each model runs in exact mode (fp32 activations, f32 KV cache).
 *
 * Tolerance, derived as in test_logits.c. Same weights, fp32 on both sides; they differ in summation
 * order, libm sin/cos/exp and how the rope frequencies are rounded. One dot product of length
 * K <= 128 carries ~sqrt(K) u = 6.7e-7 relative error (u = 2^-24); 2 layers x 7 matmuls plus the
 * per-head norms add as a random walk, ~sqrt(16) x 6.7e-7 = 2.7e-6 relative. The rope angle
 * pos * inv_freq (pos < 80) differs by about one ulp of inv_freq times pos plus one ulp of the angle,
 * ~5e-6 rad at pos 80, which dominates: ~5e-6 relative in q and k, so ~5e-5 in attention scores of
 * magnitude ~10, carried through the softmax to the attention output and, through the lm_head,
 * to logits of |z| <= ~20: ~1e-3 absolute at the very worst. We assert |dlogit| <= 1e-3 and
 * |dlse| <= 1e-3 (measured ~1e-5, printed per architecture).
 * Greedy tokens must be identical wherever transformers' top-2 margin exceeds 2 * tol; at a closer
 * near-tie the comparison of that prompt stops there (reported).
 * Batch invariance: the four prompts teacher-forced in one batch give bit-identical logits to each
 * prompt run alone. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/model.h"

#define TOL 1e-3
#define TOP 20
#define MAX_PROMPTS 8
#define MAX_IDS 128

typedef struct golden_pos {
    double lse;
    int32_t id[TOP];
    double logit[TOP];
} golden_pos;

typedef struct golden_prompt {
    int n_prompt, n_total;
    int32_t ids[MAX_IDS];
    golden_pos pos[MAX_IDS];
} golden_prompt;

/* What the loader must make of each file. */
typedef struct arch_case {
    const char *name;
    const char *arch;
    osp_rope_type rope_type;
    bool tied, qkv_bias, qk_norm, freq_factors;
    int head_dim;
} arch_case;

static const arch_case k_cases[] = {
    {"llama3", "llama", OSP_ROPE_NORM, false, false, false, true, 16},
    {"mistral", "llama", OSP_ROPE_NORM, false, false, false, false, 32},
    {"qwen2", "qwen2", OSP_ROPE_NEOX, true, true, false, false, 16},
    {"qwen3", "qwen3", OSP_ROPE_NEOX, false, false, true, false, 32},
    {"gemma3", "gemma3", OSP_ROPE_NEOX, true, false, true, false, 32},
};

static char *fixture_path(const char *name) {
    static char buf[4096];
    const char *root = getenv("OSPREY_ROOT");
    snprintf(buf, sizeof buf, "%s/tests/golden/fixtures/%s", root ? root : ".", name);
    return buf;
}

static int load_fixture(const char *file, golden_prompt *prompts) {
    FILE *f = fopen(fixture_path(file), "r");
    if (!f) return -1;
    static char line[1 << 16];
    golden_prompt *cur = NULL;
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        if (strncmp(p, "prompt ", 7) == 0 && n < MAX_PROMPTS) {
            cur = &prompts[n++];
            int k;
            if (sscanf(p + 7, "%d %d %d", &k, &cur->n_prompt, &cur->n_total) != 3 || cur->n_total > MAX_IDS) {
                fclose(f);
                return -1;
            }
        } else if (strncmp(p, "ids ", 4) == 0 && cur) {
            p += 4;
            for (int i = 0; i < cur->n_total; i++) cur->ids[i] = (int32_t)strtol(p, &p, 10);
        } else if (strncmp(p, "pos ", 4) == 0 && cur) {
            p += 4;
            int pos = (int)strtol(p, &p, 10);
            if (pos < 0 || pos >= cur->n_total) continue;
            golden_pos *gp = &cur->pos[pos];
            gp->lse = strtod(p, &p);
            for (int j = 0; j < TOP; j++) {
                gp->id[j] = (int32_t)strtol(p, &p, 10);
                p++; /* ':' */
                gp->logit[j] = strtod(p, &p);
            }
        }
    }
    fclose(f);
    return n;
}

/* Sequences s = 0..n_seqs-1, each ids_s[start, start + n_s) with KV blocks [s * nb, (s + 1) * nb) in
 * order; logits for the last n_logits_s tokens of each. */
typedef struct seq_chunk {
    const int32_t *ids;
    int start, n, n_logits;
} seq_chunk;

static void run_batch(osp_model *m, osp_kv_cache *kv, const seq_chunk *sq, int n_seqs, int nb, float *logits) {
    int T = 0, L = 0;
    for (int s = 0; s < n_seqs; s++) T += sq[s].n, L += sq[s].n_logits;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)T), *pos = malloc(sizeof(int32_t) * (size_t)T);
    int32_t *slot = malloc(sizeof(int32_t) * (size_t)T), *li = malloc(sizeof(int32_t) * (size_t)(L + 1));
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)(n_seqs * nb));
    int32_t qsl[MAX_PROMPTS + 1], sl[MAX_PROMPTS];
    int t = 0, l = 0;
    qsl[0] = 0;
    for (int s = 0; s < n_seqs; s++) {
        for (int i = 0; i < nb; i++) bt[s * nb + i] = s * nb + i;
        for (int i = 0; i < sq[s].n; i++, t++) {
            tok[t] = sq[s].ids[sq[s].start + i];
            pos[t] = sq[s].start + i;
            slot[t] = bt[s * nb + pos[t] / osp_kv_cache_block_size(kv)] * osp_kv_cache_block_size(kv) +
                      pos[t] % osp_kv_cache_block_size(kv);
        }
        for (int i = 0; i < sq[s].n_logits; i++) li[l++] = t - sq[s].n_logits + i;
        qsl[s + 1] = t;
        sl[s] = sq[s].start + sq[s].n;
    }
    osp_batch b = {.num_tokens = T, .token_ids = tok, .positions = pos, .slot_mapping = slot,
                   .num_seqs = n_seqs, .query_start_loc = qsl, .seq_lens = sl, .block_table = bt,
                   .max_blocks_per_seq = nb, .num_logits = L, .logits_indices = li};
    osp_status st = osp_model_forward(m, kv, &b, logits);
    if (st != OSP_OK) fail_msg("forward: %s", osp_last_error());
    free(tok);
    free(pos);
    free(slot);
    free(li);
    free(bt);
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

#define BLOCK 16
#define NB ((MAX_IDS + BLOCK - 1) / BLOCK)

static void check_arch(const arch_case *ac) {
    char file[128];
    golden_prompt *gp = calloc(MAX_PROMPTS, sizeof *gp);
    snprintf(file, sizeof file, "arch-%s_logits.txt", ac->name);
    const int n_prompts = load_fixture(file, gp);
    if (n_prompts <= 0) fail_msg("cannot read %s", fixture_path(file));
    snprintf(file, sizeof file, "arch-%s.gguf", ac->name);
    osp_model_params mp = osp_model_default_params();
    mp.exact = true;
    osp_model *m;
    if (osp_model_load(fixture_path(file), &mp, &m) != OSP_OK) fail_msg("load %s: %s", file, osp_last_error());
    const osp_model_config *c = osp_model_config_get(m);
    assert_string_equal(c->arch, ac->arch);
    assert_int_equal(c->rope_type, ac->rope_type);
    assert_int_equal(c->tied_output, ac->tied);
    assert_int_equal(c->qkv_bias, ac->qkv_bias);
    assert_int_equal(c->qk_norm, ac->qk_norm);
    assert_int_equal(c->rope_freq_factors, ac->freq_factors);
    assert_int_equal(c->head_dim, ac->head_dim);
    const int V = c->n_vocab;

    /* teacher-forced, one prompt at a time */
    double worst_logit = 0, worst_lse = 0;
    int positions = 0, top1 = 0, total = 0;
    for (int k = 0; k < n_prompts; k++) total += gp[k].n_total;
    float *alone = malloc(sizeof(float) * (size_t)V * (size_t)total);
    float *row = alone;
    for (int k = 0; k < n_prompts; k++) {
        osp_kv_cache *kv;
        assert_int_equal(osp_kv_cache_create(m, NB, BLOCK, OSP_KV_DTYPE_F32, &kv), OSP_OK);
        seq_chunk sq = {gp[k].ids, 0, gp[k].n_total, gp[k].n_total};
        run_batch(m, kv, &sq, 1, NB, row);
        for (int p = 0; p < gp[k].n_total; p++, row += V) {
            const golden_pos *ref = &gp[k].pos[p];
            double mx = -INFINITY, sum = 0;
            for (int i = 0; i < V; i++) mx = row[i] > mx ? row[i] : mx;
            for (int i = 0; i < V; i++) sum += exp(row[i] - mx);
            const double dl = fabs(mx + log(sum) - ref->lse);
            worst_lse = dl > worst_lse ? dl : worst_lse;
            if (dl > TOL) fail_msg("%s prompt %d pos %d: lse %f vs %f", ac->name, k, p, mx + log(sum), ref->lse);
            for (int j = 0; j < TOP; j++) {
                const double d = fabs(row[ref->id[j]] - ref->logit[j]);
                worst_logit = d > worst_logit ? d : worst_logit;
                if (d > TOL)
                    fail_msg("%s prompt %d pos %d: logit of %d is %f, transformers %f", ac->name, k, p, ref->id[j],
                             row[ref->id[j]], ref->logit[j]);
            }
            /* a different top-1 is allowed only at a near-tie (two answers within tol of the truth) */
            const int am = argmax(row, V);
            if (am != ref->id[0] && ref->logit[0] - ref->logit[1] > 2 * TOL)
                fail_msg("%s prompt %d pos %d: top-1 %d, transformers %d", ac->name, k, p, am, ref->id[0]);
            top1 += am == ref->id[0];
            positions++;
        }
        osp_kv_cache_free(kv);
    }

    /* the same prompts in one batch: bit-identical rows */
    {
        osp_kv_cache *kv;
        assert_int_equal(osp_kv_cache_create(m, NB * n_prompts, BLOCK, OSP_KV_DTYPE_F32, &kv), OSP_OK);
        seq_chunk sq[MAX_PROMPTS];
        for (int k = 0; k < n_prompts; k++) sq[k] = (seq_chunk){gp[k].ids, 0, gp[k].n_total, gp[k].n_total};
        float *batched = malloc(sizeof(float) * (size_t)V * (size_t)total);
        run_batch(m, kv, sq, n_prompts, NB, batched);
        assert_memory_equal(batched, alone, sizeof(float) * (size_t)V * (size_t)total);
        free(batched);
        osp_kv_cache_free(kv);
    }

    /* greedy: prefill the prompt, then one token at a time through the paged cache */
    float *logits = malloc(sizeof(float) * (size_t)V);
    int compared = 0, near_ties = 0;
    for (int k = 0; k < n_prompts; k++) {
        osp_kv_cache *kv;
        assert_int_equal(osp_kv_cache_create(m, NB, BLOCK, OSP_KV_DTYPE_F32, &kv), OSP_OK);
        int32_t ids[MAX_IDS];
        memcpy(ids, gp[k].ids, sizeof(int32_t) * (size_t)gp[k].n_prompt);
        seq_chunk sq = {ids, 0, gp[k].n_prompt, 1};
        run_batch(m, kv, &sq, 1, NB, logits);
        for (int n = gp[k].n_prompt; n < gp[k].n_total; n++) {
            ids[n] = argmax(logits, V);
            const golden_pos *ref = &gp[k].pos[n - 1];
            if (ref->logit[0] - ref->logit[1] <= 2 * TOL && ids[n] != gp[k].ids[n]) {
                printf("%s prompt %d: near-tie at token %d (margin %.2e): comparison stops\n", ac->name, k,
                       n - gp[k].n_prompt, ref->logit[0] - ref->logit[1]);
                near_ties++;
                break;
            }
            if (ids[n] != gp[k].ids[n])
                fail_msg("%s prompt %d: greedy token %d is %d, transformers %d", ac->name, k, n - gp[k].n_prompt,
                         ids[n], gp[k].ids[n]);
            compared++;
            if (n + 1 < gp[k].n_total) {
                sq = (seq_chunk){ids, n, 1, 1};
                run_batch(m, kv, &sq, 1, NB, logits);
            }
        }
        osp_kv_cache_free(kv);
    }
    printf("%-8s %d positions: max |dlogit| %.2e, max |dlse| %.2e (tol %.0e), top-1 %d/%d; greedy %d tokens "
           "identical (%d near-tie stops); batched == alone\n",
           ac->name, positions, worst_logit, worst_lse, TOL, top1, positions, compared, near_ties);
    assert_true(compared >= n_prompts * 16);
    free(logits);
    free(alone);
    free(gp);
    osp_model_free(m);
}

static void test_llama3(void **state) { (void)state; check_arch(&k_cases[0]); }
static void test_mistral(void **state) { (void)state; check_arch(&k_cases[1]); }
static void test_qwen2(void **state) { (void)state; check_arch(&k_cases[2]); }
static void test_qwen3(void **state) { (void)state; check_arch(&k_cases[3]); }
static void test_gemma3(void **state) { (void)state; check_arch(&k_cases[4]); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gemma3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
