/* osprey generate: continue a prompt with the model, streaming the text as it is produced.
 *
 * One sequence through the same flattened-batch forward pass the engine uses: the prompt in one
 * prefill step, then one decode step per token, K/V in a paged cache (block size 16). Timings go to
 * stderr: load time, prompt tokens/s (prefill), generation tokens/s (decode). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey/model.h"
#include "osprey/tokenizer.h"
#include "sample/sampler.h"

#define BLOCK_SIZE 16

typedef struct gen_args {
    const char *model, *prompt;
    int n_predict, n_threads;
    osp_sampling_params sp;
    bool seed_set;
} gen_args;

static gen_args parse(int argc, char **argv) {
    gen_args a = {.n_predict = 128, .n_threads = 0, .sp = osp_sampling_default_params()};
    a.sp.temperature = 0.8f; /* llama.cpp's default */
    a.sp.top_k = 40;
    a.sp.top_p = 0.95f;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) a.model = v, i++;
        else if (!strcmp(f, "-p") || !strcmp(f, "--prompt")) a.prompt = v, i++;
        else if (!strcmp(f, "-n") || !strcmp(f, "--n-predict")) a.n_predict = (int)cli_int(f, v, 0, 1 << 20), i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) a.n_threads = (int)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "--temp")) a.sp.temperature = (float)cli_float(f, v, 0, 100), i++;
        else if (!strcmp(f, "--top-k")) a.sp.top_k = (int)cli_int(f, v, -1, 1 << 30), i++;
        else if (!strcmp(f, "--top-p")) a.sp.top_p = (float)cli_float(f, v, 0, 1), i++;
        else if (!strcmp(f, "--seed")) a.sp.seed = (uint64_t)cli_int(f, v, 0, (long long)UINT32_MAX), a.seed_set = true, i++;
        else cli_die(OSP_OK, "generate: unknown option '%s'", f);
    }
    if (!a.model || !a.prompt) cli_die(OSP_OK, "generate needs -m FILE and -p TEXT");
    return a;
}

/* Runs tokens [start, start + n) of `ids` as one step; logits of the last one into `logits`. */
static void step(osp_model *m, osp_kv_cache *kv, const int32_t *ids, int32_t start, int32_t n,
                 const int32_t *block_table, int32_t max_blocks, int32_t *pos, int32_t *slot,
                 float *logits) {
    for (int32_t i = 0; i < n; i++) {
        pos[i] = start + i;
        slot[i] = block_table[(start + i) / BLOCK_SIZE] * BLOCK_SIZE + (start + i) % BLOCK_SIZE;
    }
    const int32_t qsl[2] = {0, n}, seq_len = start + n, last = n - 1;
    const osp_batch b = {.num_tokens = n, .token_ids = ids + start, .positions = pos,
                         .slot_mapping = slot, .num_seqs = 1, .query_start_loc = qsl,
                         .seq_lens = &seq_len, .block_table = block_table,
                         .max_blocks_per_seq = max_blocks, .num_logits = 1, .logits_indices = &last};
    osp_status s = osp_model_forward(m, kv, &b, logits);
    if (s != OSP_OK) cli_die(s, "forward pass failed");
}

int cmd_generate(int argc, char **argv) {
    gen_args a = parse(argc, argv);
    if (!a.seed_set) a.sp.seed = (uint64_t)(cli_now_s() * 1e6);

    double t0 = cli_now_s();
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = a.n_threads;
    osp_model *m;
    osp_status s = osp_model_load(a.model, &mp, &m);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    osp_tokenizer *tok;
    s = osp_tokenizer_load(osp_model_gguf(m), &tok);
    if (s != OSP_OK) cli_die(s, "cannot load tokenizer");
    const osp_model_config *cfg = osp_model_config_get(m);
    const double t_load = cli_now_s() - t0;

    int32_t *prompt_ids;
    size_t n_prompt;
    s = osp_tokenizer_encode(tok, a.prompt, strlen(a.prompt), true, true, &prompt_ids, &n_prompt);
    if (s != OSP_OK) cli_die(s, "cannot tokenize the prompt");
    if (n_prompt == 0) cli_die(OSP_OK, "the prompt is empty after tokenization");
    const int64_t n_total = (int64_t)n_prompt + a.n_predict;
    if (n_total > cfg->n_ctx_train)
        cli_die(OSP_OK, "prompt (%zu tokens) + %d new tokens exceed the context length %d", n_prompt,
                a.n_predict, cfg->n_ctx_train);

    const int32_t max_blocks = (int32_t)((n_total + BLOCK_SIZE - 1) / BLOCK_SIZE);
    osp_kv_cache *kv;
    s = osp_kv_cache_create(m, max_blocks, BLOCK_SIZE, OSP_KV_DTYPE_F16, &kv);
    if (s != OSP_OK) cli_die(s, "cannot allocate the KV cache");
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_total);
    int32_t *block_table = malloc(sizeof(int32_t) * (size_t)max_blocks);
    int32_t *pos = malloc(sizeof(int32_t) * n_prompt), *slot = malloc(sizeof(int32_t) * n_prompt);
    float *logits = malloc(sizeof(float) * (size_t)cfg->n_vocab);
    float *work = malloc(sizeof(float) * 2 * (size_t)cfg->n_vocab);
    osp_detokenizer *dt;
    const size_t text_cap = 3 * (osp_tokenizer_max_token_bytes(tok) + 4) + 1;
    char *text = malloc(text_cap);
    if (!ids || !block_table || !pos || !slot || !logits || !work || !text ||
        osp_detokenizer_new(tok, &dt) != OSP_OK)
        cli_die(OSP_OK, "out of memory");
    for (int32_t i = 0; i < max_blocks; i++) block_table[i] = i;
    memcpy(ids, prompt_ids, sizeof(int32_t) * n_prompt);
    free(prompt_ids);

    fputs(a.prompt, stdout);
    fflush(stdout);
    double t1 = cli_now_s();
    step(m, kv, ids, 0, (int32_t)n_prompt, block_table, max_blocks, pos, slot, logits);
    const double t_prompt = cli_now_s() - t1;

    int32_t n = (int32_t)n_prompt, n_gen = 0, n_decode = 0;
    double t2 = cli_now_s();
    size_t len;
    while (n_gen < a.n_predict) {
        int32_t next;
        s = osp_sample(logits, cfg->n_vocab, &a.sp, (uint64_t)n_gen, work, &next);
        if (s != OSP_OK) cli_die(s, "sampling failed");
        ids[n++] = next;
        n_gen++;
        if (osp_tokenizer_is_eog(tok, next)) break;
        if (osp_detokenizer_push(dt, next, text, text_cap, &len) == OSP_OK && len) {
            fwrite(text, 1, len, stdout);
            fflush(stdout);
        }
        if (n_gen < a.n_predict) {
            step(m, kv, ids, n - 1, 1, block_table, max_blocks, pos, slot, logits);
            n_decode++;
        }
    }
    if (osp_detokenizer_flush(dt, text, text_cap, &len) == OSP_OK && len) fwrite(text, 1, len, stdout);
    const double t_gen = cli_now_s() - t2;
    putchar('\n');
    fflush(stdout);
    fprintf(stderr, "\nload: %.0f ms | prompt: %zu tokens, %.0f ms, %.1f tokens/s | generation: %d tokens, %d decode steps in %.0f ms, %.1f tokens/s\n",
            t_load * 1e3, n_prompt, t_prompt * 1e3, (double)n_prompt / t_prompt, n_gen, n_decode,
            t_gen * 1e3, n_decode > 0 ? (double)n_decode / t_gen : 0.0);

    osp_detokenizer_free(dt);
    free(text);
    free(work);
    free(logits);
    free(pos);
    free(slot);
    free(block_table);
    free(ids);
    osp_kv_cache_free(kv);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return 0;
}
