/* osprey bench: prompt-processing and generation speed of the forward pass, measured the way
 * llama-bench measures llama.cpp (pp: one batch of N prompt tokens; tg: N single-token decode steps
 * after it), so bench/cpu_generate.sh can print the two side by side.
 *
 * Token ids are pseudo-random (fixed seed) and EOS is ignored: the figure is the engine's arithmetic,
 * not the text. As in llama-bench, pp and tg are separate tests that each start from an empty KV
 * cache (tg decodes positions 0..N-1 one token at a time). Prints one line per test:
 *   pp<N> <tokens/s mean> <stddev>   and   tg<N> <tokens/s mean> <stddev> */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey/model.h"

#define BLOCK_SIZE 16

static void run_step(osp_model *m, osp_kv_cache *kv, const int32_t *ids, int32_t start, int32_t n,
                     const int32_t *bt, int32_t max_blocks, int32_t *pos, int32_t *slot, float *logits) {
    for (int32_t i = 0; i < n; i++) {
        pos[i] = start + i;
        slot[i] = start + i; /* identity block table */
    }
    const int32_t qsl[2] = {0, n}, seq_len = start + n, last = n - 1;
    const osp_batch b = {.num_tokens = n, .token_ids = ids + start, .positions = pos, .slot_mapping = slot,
                         .num_seqs = 1, .query_start_loc = qsl, .seq_lens = &seq_len, .block_table = bt,
                         .max_blocks_per_seq = max_blocks, .num_logits = 1, .logits_indices = &last};
    osp_status s = osp_model_forward(m, kv, &b, logits);
    if (s != OSP_OK) cli_die(s, "forward pass failed");
}

static void report(const char *name, int n, const double *t, int reps) {
    double mean = 0, var = 0;
    for (int r = 0; r < reps; r++) mean += n / t[r];
    mean /= reps;
    for (int r = 0; r < reps; r++) var += (n / t[r] - mean) * (n / t[r] - mean);
    printf("%s%d %.2f %.2f\n", name, n, mean, reps > 1 ? sqrt(var / (reps - 1)) : 0.0);
    fflush(stdout);
}

int cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    int n_prompt = 128, n_gen = 128, n_threads = 0, reps = 3;
    bool exact = false;
    osp_kv_dtype kvd = OSP_KV_DTYPE_F16;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) model = v, i++;
        else if (!strcmp(f, "-p") || !strcmp(f, "--n-prompt")) n_prompt = (int)cli_int(f, v, 0, 1 << 16), i++;
        else if (!strcmp(f, "-n") || !strcmp(f, "--n-gen")) n_gen = (int)cli_int(f, v, 0, 1 << 16), i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "-r") || !strcmp(f, "--repetitions")) reps = (int)cli_int(f, v, 1, 1000), i++;
        else if (!strcmp(f, "--exact")) exact = true, kvd = OSP_KV_DTYPE_F32;
        else cli_die(OSP_OK, "bench: unknown option '%s'", f);
    }
    if (!model) cli_die(OSP_OK, "bench needs -m FILE");
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = n_threads;
    mp.exact = exact;
    osp_model *m;
    osp_status s = osp_model_load(model, &mp, &m);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    const osp_model_config *c = osp_model_config_get(m);
    const int32_t n_total = n_prompt + n_gen + 1;
    const int32_t max_blocks = (n_total + BLOCK_SIZE - 1) / BLOCK_SIZE;
    osp_kv_cache *kv;
    s = osp_kv_cache_create(m, max_blocks, BLOCK_SIZE, kvd, &kv);
    if (s != OSP_OK) cli_die(s, "cannot allocate the KV cache");
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n_total), *bt = malloc(sizeof(int32_t) * (size_t)max_blocks);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_total), *slot = malloc(sizeof(int32_t) * (size_t)n_total);
    float *logits = malloc(sizeof(float) * (size_t)c->n_vocab);
    double *tp = calloc((size_t)reps, sizeof(double)), *tg = calloc((size_t)reps, sizeof(double));
    if (!ids || !bt || !pos || !slot || !logits || !tp || !tg) cli_die(OSP_OK, "out of memory");
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int32_t i = 0; i < n_total; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)c->n_vocab);
    }
    for (int32_t i = 0; i < max_blocks; i++) bt[i] = i;
    /* warm-up: one short prefill and a decode step touch every weight page */
    run_step(m, kv, ids, 0, n_prompt > 0 ? (n_prompt < 8 ? n_prompt : 8) : 1, bt, max_blocks, pos, slot, logits);
    for (int r = 0; r < reps; r++) {
        if (n_prompt > 0) {
            const double t0 = cli_now_s();
            run_step(m, kv, ids, 0, n_prompt, bt, max_blocks, pos, slot, logits);
            tp[r] = cli_now_s() - t0;
        }
        if (n_gen > 0) {
            const double t0 = cli_now_s();
            for (int32_t i = 0; i < n_gen; i++) run_step(m, kv, ids, i, 1, bt, max_blocks, pos, slot, logits);
            tg[r] = cli_now_s() - t0;
        }
    }
    if (n_prompt > 0) report("pp", n_prompt, tp, reps);
    if (n_gen > 0) report("tg", n_gen, tg, reps);
    free(tp);
    free(tg);
    free(logits);
    free(slot);
    free(pos);
    free(bt);
    free(ids);
    osp_kv_cache_free(kv);
    osp_model_free(m);
    return 0;
}
