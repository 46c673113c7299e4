/* Offline throughput through the engine (issue 4's benchmark), built and run by offline_throughput.sh.
 *
 *   offline_throughput MODEL batch   N PROMPT GEN THREADS   all N requests at once (greedy, ignore_eos)
 *   offline_throughput MODEL single  N PROMPT GEN THREADS   the same requests one at a time
 *   offline_throughput MODEL prefix  N SYS    SUFFIX THREADS CACHING(0|1)
 *        N requests sharing a SYS-token system prompt (+ SUFFIX own tokens, 1 generated token each),
 *        submitted one after another: mean time to first token and the prefix-cache hit rate.
 * Prints one line "RESULT key=value ..." for the script. Prompts are random token ids (fixed seed).
 * Environment: CPU_ACTIVATIONS=q8 (--cpu-activations), DEVICE=cpu|cuda (--device; cuda sizes the KV cache
 * for every sequence), TRACE=FILE (--trace: the step timeline, its summary on stderr at the end),
 * SPARSE=topk:PAGES[,...] (--sparse-attention), SPEC=JSON (--speculative-config: k drafts every step, as
 * OSPREY_SPEC_FIXED_K=1, and the acceptance printed), KV=DTYPE (--kv-cache-dtype, e.g. int8_hier for
 * quantspec), QUANT_WEIGHTS=1 (--gpu-weights quant). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "osprey/engine.h"
#include "osprey/sparse.h"
#include "osprey/spec.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static osp_engine *make(const char *model, int threads, int max_seqs, int max_len, bool caching) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = model;
    p.n_threads = threads;
    p.max_num_seqs = max_seqs;
    p.max_model_len = max_len;
    p.enable_prefix_caching = caching;
    /* CPU_ACTIVATIONS=q8 (bench/offline_throughput.sh passes it on): --cpu-activations q8 */
    const char *act = getenv("CPU_ACTIVATIONS");
    if (act && osp_cpu_activations_parse(act, &p.cpu_activations) != OSP_OK) {
        fprintf(stderr, "CPU_ACTIVATIONS: %s\n", osp_last_error());
        exit(2);
    }
    /* DEVICE=cuda: the model on the GPU; TRACE=FILE: the step timeline (--trace), whose summary line
       (the GPU's idle share between decode steps) the engine logs when it is freed */
    const char *dev = getenv("DEVICE"), *trace = getenv("TRACE");
    if (dev && *dev && osp_device_parse(dev, &p.device) != OSP_OK) {
        fprintf(stderr, "DEVICE: %s\n", osp_last_error());
        exit(2);
    }
    if (trace && *trace) p.trace_path = trace;
    /* SPARSE=topk:PAGES[,...]: --sparse-attention */
    const char *sparse = getenv("SPARSE");
    if (sparse && *sparse && osp_sparse_config_parse(sparse, &p.sparse_attention) != OSP_OK) {
        fprintf(stderr, "SPARSE: %s\n", osp_last_error());
        exit(2);
    }
    const char *spec = getenv("SPEC"), *kv = getenv("KV"), *qw = getenv("QUANT_WEIGHTS");
    if (spec && *spec) {
        if (osp_spec_config_parse(spec, &p.speculative) != OSP_OK) {
            fprintf(stderr, "SPEC: %s\n", osp_last_error());
            exit(2);
        }
        p.speculative_fixed_k = true;
    }
    if (kv && *kv && osp_kv_dtype_parse(kv, &p.kv_dtype) != OSP_OK) {
        fprintf(stderr, "KV: %s\n", osp_last_error());
        exit(2);
    }
    if (qw && !strcmp(qw, "1")) p.gpu_quant_weights = true;
    /* on the GPU a cache for every sequence at once (kv_cache_memory 0: max_num_seqs x max_model_len,
       within gpu_memory_utilization); the default 512 MiB holds 4,096 tokens of an 8B model, and the
       batch would run preempted */
    if (p.device == OSP_DEVICE_CUDA) p.kv_cache_memory = 0;
    osp_engine *e;
    if (osp_engine_create(&p, &e) != OSP_OK) {
        fprintf(stderr, "engine: %s\n", osp_last_error());
        exit(1);
    }
    return e;
}

static void add(osp_engine *e, uint64_t id, const int32_t *prompt, int n, int gen) {
    osp_request_params rp = osp_request_default_params();
    rp.request_id = id;
    rp.prompt = prompt;
    rp.num_prompt = n;
    rp.max_tokens = gen;
    rp.ignore_eos = true;
    if (osp_engine_add(e, &rp) != OSP_OK) {
        fprintf(stderr, "add: %s\n", osp_last_error());
        exit(1);
    }
}

static void run_to_end(osp_engine *e) {
    while (osp_engine_has_unfinished(e))
        if (osp_engine_step(e, NULL) != OSP_OK) {
            fprintf(stderr, "step: %s\n", osp_last_error());
            exit(1);
        }
}

int main(int argc, char **argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: see the file's header\n");
        return 2;
    }
    const char *model = argv[1], *mode = argv[2];
    if (argc > (strcmp(mode, "prefix") ? 7 : 8)) { /* e.g. a flag: the activation mode is CPU_ACTIVATIONS */
        fprintf(stderr, "offline_throughput: unexpected argument '%s' (see the file's header)\n",
                argv[strcmp(mode, "prefix") ? 7 : 8]);
        return 2;
    }
    const int n = atoi(argv[3]), a = atoi(argv[4]), b = atoi(argv[5]), threads = atoi(argv[6]);
    srand(1234);
    if (!strcmp(mode, "batch") || !strcmp(mode, "single")) {
        int32_t *prompts = malloc(sizeof(int32_t) * (size_t)n * (size_t)a);
        for (int i = 0; i < n * a; i++) prompts[i] = 100 + rand() % 40000;
        const bool batch = !strcmp(mode, "batch");
        osp_engine *e = make(model, threads, batch ? n : 1, a + b + 16, false);
        const double t0 = now();
        for (int i = 0; i < n; i++) {
            add(e, (uint64_t)i, prompts + (size_t)i * a, a, b);
            if (!batch) run_to_end(e);
        }
        run_to_end(e);
        const double dt = now() - t0;
        const osp_engine_stats st = osp_engine_get_stats(e);
        printf("RESULT mode=%s requests=%d prompt=%d gen=%d seconds=%.2f generated=%lld total_tokens=%lld "
               "gen_tok_s=%.1f total_tok_s=%.1f steps=%lld drafts=%lld accepted=%lld\n",
               mode, n, a, b, dt, (long long)st.num_generated_tokens, (long long)(n * (a + b)),
               (double)st.num_generated_tokens / dt, (double)(n * (a + b)) / dt, (long long)st.num_steps,
               (long long)st.spec_num_draft_tokens, (long long)st.spec_num_accepted_tokens);
        osp_engine_free(e);
        free(prompts);
    } else if (!strcmp(mode, "prefix")) {
        const bool caching = argc > 7 && atoi(argv[7]);
        int32_t *p = malloc(sizeof(int32_t) * (size_t)(a + b));
        for (int i = 0; i < a; i++) p[i] = 100 + rand() % 40000;
        osp_engine *e = make(model, threads, n, a + b + 16, caching);
        double ttft = 0;
        for (int r = 0; r < n; r++) {
            for (int i = 0; i < b; i++) p[a + i] = 100 + rand() % 40000;
            const double t0 = now();
            add(e, (uint64_t)r, p, a + b, 1);
            run_to_end(e);
            ttft += now() - t0;
        }
        const osp_engine_stats st = osp_engine_get_stats(e);
        printf("RESULT mode=prefix caching=%d requests=%d system=%d suffix=%d mean_ttft_ms=%.1f hit_rate=%.3f "
               "hit_tokens=%lld query_tokens=%lld\n",
               caching, n, a, b, 1e3 * ttft / n,
               st.prefix_queries_tokens ? (double)st.prefix_hits_tokens / (double)st.prefix_queries_tokens : 0.0,
               (long long)st.prefix_hits_tokens, (long long)st.prefix_queries_tokens);
        osp_engine_free(e);
        free(p);
    }
    return 0;
}
