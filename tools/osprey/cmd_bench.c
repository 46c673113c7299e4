/* osprey bench: prompt-processing and generation speed of the forward pass, measured the way
 * llama-bench measures llama.cpp (pp: one batch of N prompt tokens; tg: N single-token decode steps
 * after it), so bench/cpu_generate.sh can print the two side by side.
 *
 * Token ids are pseudo-random (fixed seed) and EOS is ignored: the figure is the engine's arithmetic,
 * not the text. As in llama-bench, pp and tg are separate tests that each start from an empty KV
 * cache (tg decodes positions 0..N-1 one token at a time). Prints one line per test:
 *   pp<N> <tokens/s mean> <stddev>   and   tg<N> <tokens/s mean> <stddev>
 * --depth D (as llama-bench -d): the decode tests start D tokens deep (a prefill of D tokens, not timed,
 * before each timed decode), and their lines say so: tg<N>@d<D>.
 * --batch B (B > 1) adds a batched test: B sequences, each prefilled with -p tokens (or D with --depth;
 * timed apart: pp<P>@b<B>, tokens/s over all B prefills), then -n decode steps together (one token per
 * sequence per step; tokens/s counts all B): tg<N>@b<B>[@d<D>] <tokens/s mean> <stddev>
 * On the GPU (--device cuda) every decode step also samples (greedy, on the device) and copies back
 * only the token ids, as the engine does; the logits never leave the GPU. Every timed region starts and
 * ends with the device idle (osp_model_sync), so no enqueued work of one test is counted in another.
 * A header line starting with '#' gives the shape, the KV dtypes and the CPU activation mode (--cpu-activations).
 *
 * --output FORMAT (as llama-bench -o): text (the default: the '#' shape line, a '#' column header
 * "test  t/s", then one line per test "<test> <mean> ± <sd>", so `awk '$1 ~ /^tg/ {print $2}'` still
 * reads the mean), md (llama-bench's markdown table: model, backend, threads, type_k, test, t/s as
 * "mean ± sd"), csv (a header row, then one row per test with llama-bench's column names: avg_ts,
 * stddev_ts, n_prompt, n_gen, n_depth, ...) or json (an array of one object per test, those keys plus
 * samples_ts, each repetition's tokens/s). Every format prints each test as soon as it is measured. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey_internal.h"
#include "osprey/model.h"

#define BLOCK_SIZE 16

/* --trace FILE: every timed forward (with its sampling, on the GPU) as a step of the engine's timeline
 * (engine/timeline.h): prepare = the batch's host setup, forward = the enqueue, sample = the GPU
 * sampler's call; no schedule or update phase here. The device times are read after the step's
 * sampler has waited (a prefill without one, the batch rounds' B prefills: after its own wait, which
 * bench adds then, so pp@bB is measured with a wait between prefills when tracing). Warm-up runs are
 * not traced. */
static struct {
    osp_timeline *tl;
    osp_timeline_step cur;
    int64_t steps;
} g_trace;

static void trace_begin(int32_t rows, int32_t tokens, bool decode) {
    if (!g_trace.tl) return;
    osp_timeline_step *t = &g_trace.cur;
    memset(t, 0, sizeof *t);
    t->step = g_trace.steps++, t->rows = rows, t->tokens = tokens, t->decode_only = decode;
    for (int i = 0; i <= OSP_TL_PHASES; i++) t->host[i] = cli_now_s();
}

/* phase boundary i (OSP_TL_FORWARD: the forward's enqueue starts, OSP_TL_SAMPLE: it returned,
 * OSP_TL_UPDATE: sampling returned): every later boundary moves with it */
static void trace_mark(int i) {
    if (!g_trace.tl) return;
    const double now = cli_now_s();
    for (int j = i; j <= OSP_TL_PHASES; j++) g_trace.cur.host[j] = now;
}

static void trace_end(osp_model *m) {
    if (!g_trace.tl) return;
    osp_status s = osp_model_timeline_get(m, &g_trace.cur.dev);
    if (s != OSP_OK) cli_die(s, "--trace: device times");
    osp_timeline_add(g_trace.tl, &g_trace.cur);
}

static void run_step(osp_model *m, osp_kv_cache *kv, const int32_t *ids, int32_t start, int32_t n,
                     const int32_t *bt, int32_t max_blocks, int32_t *pos, int32_t *slot, float *logits) {
    for (int32_t i = 0; i < n; i++) {
        pos[i] = start + i;
        slot[i] = bt[0] * BLOCK_SIZE + start + i; /* consecutive blocks from bt[0] */
    }
    const int32_t qsl[2] = {0, n}, seq_len = start + n, last = n - 1;
    const osp_batch b = {.num_tokens = n, .token_ids = ids + start, .positions = pos, .slot_mapping = slot,
                         .num_seqs = 1, .query_start_loc = qsl, .seq_lens = &seq_len, .block_table = bt,
                         .max_blocks_per_seq = max_blocks, .num_logits = 1, .logits_indices = &last};
    trace_mark(OSP_TL_FORWARD);
    osp_status s = osp_model_forward(m, kv, &b, osp_model_device(m) == OSP_DEVICE_CUDA ? NULL : logits);
    if (s != OSP_OK) cli_die(s, "forward pass failed");
    trace_mark(OSP_TL_SAMPLE);
}

/* On the GPU: greedy tokens for the n logits rows of the last step, on the device (what an engine step
 * adds to the forward pass). No-op on the CPU. */
static void gpu_sample(osp_model *m, int32_t n) {
    if (osp_model_device(m) != OSP_DEVICE_CUDA) return;
    static osp_sampler_row rows[1024];
    static int32_t lrows[1024], toks[1024];
    static osp_status st[1024];
    for (int32_t i = 0; i < n; i++) {
        rows[i] = osp_sampler_row_default();
        rows[i].temperature = 0.0f;
        lrows[i] = i;
    }
    osp_status s = osp_model_sample(m, rows, lrows, n, toks, NULL, st);
    if (s != OSP_OK) cli_die(s, "sampling failed");
    trace_mark(OSP_TL_UPDATE);
}

/* One decode step for B sequences at position p (sequence s owns blocks [s * mb, (s + 1) * mb)). */
static void run_batch_step(osp_model *m, osp_kv_cache *kv, const int32_t *ids, int32_t B, int32_t p, const int32_t *bt,
                           int32_t mb, int32_t *pos, int32_t *slot, int32_t *qsl, int32_t *lens, int32_t *lidx,
                           float *logits) {
    trace_begin(B, B, true);
    for (int32_t s = 0; s < B; s++) {
        pos[s] = p;
        slot[s] = s * mb * BLOCK_SIZE + p;
        qsl[s] = s;
        lens[s] = p + 1;
        lidx[s] = s;
    }
    qsl[B] = B;
    const osp_batch b = {.num_tokens = B, .token_ids = ids, .positions = pos, .slot_mapping = slot, .num_seqs = B,
                         .query_start_loc = qsl, .seq_lens = lens, .block_table = bt, .max_blocks_per_seq = mb,
                         .num_logits = B, .logits_indices = lidx};
    trace_mark(OSP_TL_FORWARD);
    osp_status s = osp_model_forward(m, kv, &b, osp_model_device(m) == OSP_DEVICE_CUDA ? NULL : logits);
    if (s != OSP_OK) cli_die(s, "forward pass failed");
    trace_mark(OSP_TL_SAMPLE);
    gpu_sample(m, B);
    trace_end(m);
}

typedef enum { OUT_TEXT, OUT_MD, OUT_CSV, OUT_JSON } out_format;

/* What every result row repeats (the run's shape), and how many rows were printed (json's commas). */
typedef struct bench_out {
    out_format fmt;
    const char *model, *backend, *type_k, *type_v; /* type_k / type_v: the K and V pages' dtypes (llama-bench's) */
    int threads, rows;
} bench_out;

/* The table's opening: text's and md's column header, csv's header row, json's '['. */
static void report_begin(const bench_out *o) {
    switch (o->fmt) {
    case OUT_TEXT: printf("%-20s %12s\n", "# test", "t/s"); break;
    case OUT_MD:
        printf("| model | backend | threads | type_k | type_v | test | t/s |\n");
        printf("| ----- | ------- | ------: | ------ | ------ | ---: | --: |\n");
        break;
    case OUT_CSV:
        printf("model_filename,backend,n_threads,type_k,type_v,n_prompt,n_gen,n_depth,n_seqs,test,avg_ts,stddev_ts\n");
        break;
    case OUT_JSON: printf("["); break;
    }
    fflush(stdout);
}

static void report_end(const bench_out *o) {
    if (o->fmt == OUT_JSON) printf("%s]\n", o->rows ? "\n" : "");
    fflush(stdout);
}

/* One test's row: its name "<name><n_label><suffix>", tokens/s mean and sample standard deviation over
 * reps timings t[] (seconds) of n tokens each; the label's count is per sequence for batched tests
 * (n_label), the rate counts all n tokens. n_prompt / n_gen / depth / n_seqs: the test's shape, for the
 * csv and json columns. */
static void report_n(bench_out *o, const char *name, int n_label, const char *suffix, double n, const double *t,
                     int reps, int n_prompt, int n_gen, int depth, int n_seqs) {
    double mean = 0, var = 0;
    for (int r = 0; r < reps; r++) mean += n / t[r];
    mean /= reps;
    for (int r = 0; r < reps; r++) var += (n / t[r] - mean) * (n / t[r] - mean);
    const double sd = reps > 1 ? sqrt(var / (reps - 1)) : 0.0;
    char test[96];
    snprintf(test, sizeof test, "%s%d%s", name, n_label, suffix);
    switch (o->fmt) {
    case OUT_TEXT: printf("%-20s %12.2f ± %.2f\n", test, mean, sd); break;
    case OUT_MD:
        printf("| %s | %s | %d | %s | %s | %s | %.2f ± %.2f |\n", o->model, o->backend, o->threads, o->type_k, o->type_v,
               test, mean, sd);
        break;
    case OUT_CSV: {
        putchar('"'); /* the path quoted as csv wants it: "" for " */
        for (const char *c = o->model; *c; c++) {
            if (*c == '"') putchar('"');
            putchar(*c);
        }
        printf("\",%s,%d,%s,%s,%d,%d,%d,%d,%s,%.6f,%.6f\n", o->backend, o->threads, o->type_k, o->type_v, n_prompt, n_gen, depth,
               n_seqs, test, mean, sd);
        break;
    }
    case OUT_JSON: {
        json_t *samples = json_array();
        for (int r = 0; r < reps; r++) json_array_append_new(samples, json_real(n / t[r]));
        json_t *row = json_pack("{s:s, s:s, s:i, s:s, s:s, s:i, s:i, s:i, s:i, s:s, s:f, s:f, s:o}", "model_filename",
                                o->model, "backend", o->backend, "n_threads", o->threads, "type_k", o->type_k, "type_v", o->type_v,
                                "n_prompt", n_prompt, "n_gen", n_gen, "n_depth", depth, "n_seqs", n_seqs, "test",
                                test, "avg_ts", mean, "stddev_ts", sd, "samples_ts", samples);
        char *s = row ? json_dumps(row, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (!s) cli_die(OSP_OK, "out of memory");
        printf("%s\n  %s", o->rows ? "," : "", s);
        free(s);
        json_decref(row);
        break;
    }
    }
    o->rows++;
    fflush(stdout);
}

static void sync_or_die(osp_model *m) {
    osp_status s = osp_model_sync(m);
    if (s != OSP_OK) cli_die(s, "device sync failed");
}

static const char k_help[] =
    "usage: osprey bench (-m FILE | --random-weights PRESET) [options]\n"
    "  prompt (pp) and generation (tg) tokens/s of the forward pass, like llama-bench; random token ids\n"
    "\n"
    "  -m, --model FILE        the GGUF model\n"
    "  --random-weights PRESET random weights in a preset's shapes instead of a file (GPU; see\n"
    "                          osprey make-random-model --list-presets)\n"
    "  -p, --n-prompt N        prompt tokens of the pp test, 0 = no pp test (default: 128)\n"
    "  -n, --n-gen N           decode steps of the tg test, 0 = no tg test (default: 128)\n"
    "  -d, --depth D           the tg tests start D tokens deep (default: 0)\n"
    "  --batch B               also B sequences together: pp<P>@b<B> and tg<N>@b<B> (default: 1, off)\n"
    "  -r, --repetitions R     runs of each test; mean and sd over them (default: 3)\n"
    "  -t, --threads N         CPU threads, 1..1024 (default: all cores)\n"
    "  --device D              cpu | cuda | auto (default: cpu)\n"
    CLI_GPU_WEIGHTS_HELP
    CLI_CPU_ACT_HELP
    CLI_NO_MMAP_HELP
    CLI_KV_DTYPE_HELP
    CLI_KV_SCALES_HELP
    "  --exact                 fp32 activations and an f32 KV cache (or f16 with --kv-cache-dtype f16;\n"
    "                          a quantized cache is refused) (default: off)\n"
    "  -o, --output FORMAT     text | md | csv | json: llama-bench's table shapes (default: text,\n"
    "                          one '<test> <t/s> ± <sd>' line per test)\n"
    "  --trace FILE            the timed steps as a step timeline (Chrome trace-event JSON; on the GPU with\n"
    "                          device spans, and the idle share between decode steps printed at the end)\n"
    "  -h, --help              this text\n";

int cmd_bench(int argc, char **argv) {
    const char *model = NULL, *random_preset = NULL, *scales_path = NULL, *trace_path = NULL;
    int n_prompt = 128, n_gen = 128, n_threads = 0, reps = 3;
    bool exact = false;
    int batch = 1, depth = 0;
    osp_device dev = OSP_DEVICE_CPU;
    bool gpu_quant = false; /* --gpu-weights quant */
    osp_cpu_activations cpu_act = OSP_CPU_ACT_TWO_LEVEL; /* --cpu-activations */
    bool no_mmap = false; /* --no-mmap */
    cli_kv_types kvt = {0}; /* --kv-cache-dtype, -ctk, -ctv */
    out_format fmt = OUT_TEXT;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) cli_help(k_help);
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model = v, i++;
        else if (!strcmp(f, "-p") || !strcmp(f, "--n-prompt")) n_prompt = (int)cli_int(f, v, 0, 1 << 16), i++;
        else if (!strcmp(f, "-n") || !strcmp(f, "--n-gen")) n_gen = (int)cli_int(f, v, 0, 1 << 16), i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "-r") || !strcmp(f, "--repetitions")) reps = (int)cli_int(f, v, 1, 1000), i++;
        else if (!strcmp(f, "--exact")) exact = true;
        else if (cli_kv_types_arg(&kvt, f, v)) i++;
        else if (!strcmp(f, "--kv-scales")) {
            if (!v) cli_die(OSP_OK, "--kv-scales needs a file (osprey calibrate-kv -o FILE writes one)");
            scales_path = v, i++;
        }
        else if (!strcmp(f, "--batch")) batch = (int)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "--depth") || !strcmp(f, "-d")) depth = (int)cli_int(f, v, 0, 1 << 20), i++;
        else if (!strcmp(f, "--device")) dev = cli_device(f, v), i++;
        else if (!strcmp(f, "--gpu-weights")) gpu_quant = cli_gpu_weights(f, v), i++;
        else if (!strcmp(f, "--cpu-activations")) cpu_act = cli_cpu_activations(f, v), i++;
        else if (!strcmp(f, "--no-mmap")) no_mmap = true;
        else if (!strcmp(f, "--random-weights")) random_preset = v, i++;
        else if (!strcmp(f, "--trace")) {
            if (!v || !*v) cli_die(OSP_OK, "--trace needs a file (the step timeline, Chrome trace-event JSON)");
            trace_path = v, i++;
        }
        else if (!strcmp(f, "-o") || !strcmp(f, "--output")) {
            if (v && !strcmp(v, "text")) fmt = OUT_TEXT;
            else if (v && !strcmp(v, "md")) fmt = OUT_MD;
            else if (v && !strcmp(v, "csv")) fmt = OUT_CSV;
            else if (v && !strcmp(v, "json")) fmt = OUT_JSON;
            else cli_die(OSP_OK, "%s: '%s' is not one of text, md, csv, json", f, v ? v : "");
            i++;
        }
        else cli_die(OSP_OK, "bench: unknown option '%s'", f);
    }
    osp_kv_dtype kvd, kvd_v; /* a side no flag names: f16, or f32 with --exact */
    cli_kv_types_resolve(&kvt, exact ? OSP_KV_DTYPE_F32 : OSP_KV_DTYPE_F16, &kvd, &kvd_v);
    cli_kv_types_check_exact(exact, kvd, kvd_v);
    cli_check_exact_activations(exact, cpu_act);
    if (n_prompt == 0 && n_gen == 0)
        cli_die(OSP_OK, "bench: -p 0 and -n 0 leave nothing to measure: give -p N (a prompt of N tokens), -n N (N "
                        "generated tokens), or both");
    char kv_name[64];
    if (!model && !random_preset) cli_die(OSP_OK, "bench needs -m FILE or --random-weights PRESET (with --device cuda)");
    osp_kv_scales scales; /* before the model: a bad file fails fast */
    cli_kv_scales_load(scales_path, &scales);
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = n_threads;
    mp.exact = exact;
    mp.device = dev;
    mp.gpu_quant_weights = gpu_quant;
    mp.cpu_activations = cpu_act;
    mp.no_mmap = no_mmap;
    mp.progress = cli_load_progress;
    osp_model *m;
    osp_status s = random_preset ? osp_model_load_random(random_preset, 0, &mp, &m) : osp_model_load(model, &mp, &m);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    const osp_model_config *c = osp_model_config_get(m);
    const int32_t n_ctx0 = n_prompt > depth ? n_prompt : depth; /* the longest context before decoding */
    const int32_t n_total = n_ctx0 + n_gen + 1;
    const int32_t max_blocks = (n_total + BLOCK_SIZE - 1) / BLOCK_SIZE;
    osp_kv_cache *kv = cli_kv_cache_create(m, max_blocks * (batch > 1 ? batch : 1), BLOCK_SIZE, kvd, kvd_v, &scales, scales_path);
    osp_kv_scales_free(&scales);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n_total + batch)),
            *bt = malloc(sizeof(int32_t) * (size_t)max_blocks * (size_t)batch);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_total), *slot = malloc(sizeof(int32_t) * (size_t)n_total);
    float *logits = malloc(sizeof(float) * (size_t)c->n_vocab * (size_t)batch);
    int32_t *bpos = malloc(sizeof(int32_t) * (size_t)batch * 5 + 4);
    double *tp = calloc((size_t)reps, sizeof(double)), *tg = calloc((size_t)reps, sizeof(double));
    if (!ids || !bt || !pos || !slot || !logits || !bpos || !tp || !tg) cli_die(OSP_OK, "out of memory");
    uint64_t x = 0x2545F4914F6CDD1Dull;
    for (int32_t i = 0; i < n_total + batch; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)c->n_vocab);
    }
    for (int32_t i = 0; i < max_blocks * batch; i++) bt[i] = i;
    /* how the CPU quantizes matmul inputs (--cpu-activations), which moves CPU figures: f32 with --exact;
       the GPU ignores the flag */
    const char *act = exact ? "f32 (exact)" : dev == OSP_DEVICE_CUDA ? "n/a (GPU)" : osp_cpu_activations_name(cpu_act);
    if (fmt == OUT_TEXT)
        printf("# osprey bench: %s, device %s, threads %d, kv %s, cpu activations %s,%s pp %d, tg %d, depth %d, batch %d, "
               "%d repetitions\n",
               model ? model : random_preset, osp_device_name(dev), osp_model_n_threads(m),
               cli_kv_types_name(kvd, kvd_v, kv_name, sizeof kv_name), act,
               no_mmap && dev == OSP_DEVICE_CPU ? " weights copied (--no-mmap)," : "", n_prompt, n_gen, depth, batch, reps);
    bench_out out = {.fmt = fmt, .model = model ? model : random_preset, .backend = osp_device_name(dev),
                     .type_k = osp_kv_dtype_name(kvd), .type_v = osp_kv_dtype_name(kvd_v), .threads = osp_model_n_threads(m)};
    report_begin(&out);
    char dsuf[32] = "";
    if (depth > 0) snprintf(dsuf, sizeof dsuf, "@d%d", depth);
    /* warm-up: one short prefill and a decode step touch every weight page */
    run_step(m, kv, ids, 0, n_prompt > 0 ? (n_prompt < 8 ? n_prompt : 8) : 1, bt, max_blocks, pos, slot, logits);
    if (dev == OSP_DEVICE_CUDA) { /* and on the GPU: the GEMM plans of both shapes, the batch-1 graph */
        if (n_prompt > 0) run_step(m, kv, ids, 0, n_prompt, bt, max_blocks, pos, slot, logits);
        run_step(m, kv, ids, 0, 1, bt, max_blocks, pos, slot, logits);
        run_step(m, kv, ids, 1, 1, bt, max_blocks, pos, slot, logits);
        gpu_sample(m, 1);
    }
    if (trace_path) { /* after the warm-up: the timed steps only (and the batch rounds' warm-up round) */
        bool dev_clock = false;
        const char *keep[2] = {model, scales_path};
        s = osp_model_timeline_enable(m, &dev_clock);
        if (s == OSP_OK) s = osp_timeline_open(trace_path, dev_clock, keep, 2, &g_trace.tl);
        if (s != OSP_OK) cli_die(s, "--trace");
    }
    for (int r = 0; r < reps; r++) {
        if (n_prompt > 0) {
            sync_or_die(m);
            const double t0 = cli_now_s();
            trace_begin(1, n_prompt, false);
            run_step(m, kv, ids, 0, n_prompt, bt, max_blocks, pos, slot, logits);
            gpu_sample(m, 1); /* the first token (on the GPU this also waits for the pass to finish) */
            trace_end(m);
            sync_or_die(m);
            tp[r] = cli_now_s() - t0;
        }
        if (n_gen > 0) {
            if (depth > 0) run_step(m, kv, ids, 0, depth, bt, max_blocks, pos, slot, logits); /* not timed */
            sync_or_die(m);
            const double t0 = cli_now_s();
            for (int32_t i = 0; i < n_gen; i++) {
                trace_begin(1, 1, true);
                run_step(m, kv, ids, depth + i, 1, bt, max_blocks, pos, slot, logits);
                gpu_sample(m, 1);
                trace_end(m);
            }
            sync_or_die(m);
            tg[r] = cli_now_s() - t0;
        }
    }
    if (n_prompt > 0) report_n(&out, "pp", n_prompt, "", n_prompt, tp, reps, n_prompt, 0, 0, 1);
    if (n_gen > 0) report_n(&out, "tg", n_gen, dsuf, n_gen, tg, reps, 0, n_gen, depth, 1);
    if (batch > 1 && n_gen > 0) {
        /* B sequences: each prefilled with the same -p prompt tokens (one prefill per sequence, its own
         * blocks), then n_gen decode steps of B tokens each */
        int32_t *qsl = bpos + batch, *lens = qsl + batch + 1, *lidx = lens + batch, *bslot = lidx + batch;
        const int32_t np = depth > 0 ? depth : n_prompt > 0 ? n_prompt : 1;
        double *tb = calloc((size_t)reps, sizeof(double)), *tpb = calloc((size_t)reps, sizeof(double));
        if (!tb || !tpb) cli_die(OSP_OK, "out of memory");
        osp_timeline *tl = g_trace.tl;
        for (int r = 0; r < reps + 1; r++) { /* the first round warms up (graph capture): not traced */
            g_trace.tl = r > 0 ? tl : NULL;
            sync_or_die(m);
            const double tp0 = cli_now_s();
            for (int32_t sq = 0; sq < batch; sq++) { /* traced, each prefill waits for its device times */
                trace_begin(1, np, false);
                run_step(m, kv, ids, 0, np, bt + (size_t)sq * (size_t)max_blocks, max_blocks, pos, slot, logits);
                trace_end(m);
            }
            sync_or_die(m); /* the prefills are done before the decode timer starts */
            const double t0 = cli_now_s();
            for (int32_t i = 0; i < n_gen; i++)
                run_batch_step(m, kv, ids + i % n_total, batch, np + i, bt, max_blocks, bpos, bslot, qsl, lens, lidx,
                               logits);
            sync_or_die(m);
            if (r > 0) tpb[r - 1] = t0 - tp0, tb[r - 1] = cli_now_s() - t0;
        }
        g_trace.tl = tl;
        char name[64];
        snprintf(name, sizeof name, "@b%d", batch);
        /* tokens/s over the B prefills of np each */
        report_n(&out, "pp", np, name, (double)np * batch, tpb, reps, np, 0, 0, batch);
        snprintf(name, sizeof name, "@b%d%s", batch, dsuf);
        report_n(&out, "tg", n_gen, name, (double)n_gen * batch, tb, reps, 0, n_gen, depth, batch);
        free(tb);
        free(tpb);
    }
    report_end(&out);
    if (g_trace.tl) {
        char line[512];
        osp_timeline_summary(g_trace.tl, line, sizeof line);
        fprintf(stderr, "%s\n", line);
        s = osp_timeline_close(g_trace.tl);
        g_trace.tl = NULL;
        if (s != OSP_OK) cli_die(s, "--trace");
    }
    free(bpos);
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
