/* osprey: the command-line entry point. Each subcommand lives in its own cmd_*.c file. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli.h"
#include "osprey/version.h"

static const char *k_usage =
    "usage: osprey <command> [options]     osprey --version     osprey --help\n"
    "\n"
    "commands:\n"
    "  (osprey <command> --help lists a command's flags and their defaults)\n"
    "\n"
    "  generate -m FILE -p TEXT [-n N] [--temp T] [--top-k K] [--top-p P] [--seed S] [-t THREADS]\n"
    "           [--kv-cache-dtype D] [--exact] [--device cpu|cuda|auto] [--kernel-table FILE]\n"
    "           [--speculative-config JSON]\n"
    "           continue TEXT with the model, streaming tokens; timings on stderr\n"
    "  chat     -m FILE [-t THREADS] [--device D] [--kv-cache-dtype D] [--temp T] [--top-k K] [--top-p P] [--seed S] [--system TEXT]\n"
    "           [--chat-template FILE] [-n MAX_TOKENS] [--ignore-eos] [--history FILE | --no-history] [--speculative-config JSON]\n"
    "           chat in the terminal with the model's chat template (Ctrl-C stops a reply; /help, /save, /load, /reset, /exit)\n"
    "  tokenize -m FILE -p TEXT [--no-special] [--no-bos]\n"
    "           print the token ids of TEXT as a JSON array\n"
    "  bench    -m FILE [-p N] [-n N] [-d DEPTH] [-t THREADS] [-r REPS] [--exact] [--device D] [--batch B]\n"
    "           [--kv-cache-dtype D] [--random-weights PRESET (GPU: no file)]\n"
    "           prompt (pp) and generation (tg) tokens/s of the forward pass, like llama-bench\n"
    "  bench-kernels [--op NAME] [--solution cpu|cpu-exact|cuda|DEVICE:KIND/vN] [--gate-only] [--hidden N] [--seed S]\n"
    "           [--out FILE] | --list | --make-table REPORT.json... -o TABLE.json\n"
    "           every op's definitions (bench/kernels/defs): correctness gate against fp64 references, then timing\n"
    "  info     -m FILE\n"
    "           print a GGUF file's metadata and tensors\n"
    "  make-random-model --preset NAME [--dtype f32|f16|bf16|q8_0|q4_0|q4_1] [--seed S]\n"
    "           [--vocab-from FILE] [--vocab-size N] [-t THREADS] -o FILE  (--list-presets)\n"
    "           write a GGUF model with random weights in a real architecture's shapes\n"
    "  serve    MODEL (or -m MODEL) [--host H] [--port N] [--api-key K] [--ssl-keyfile K --ssl-certfile C] ...\n"
    "           OpenAI-compatible HTTP server (osprey serve --help lists the flags)\n"
    "  router   --backends URL,URL,... [--port N] [--weights prefix=3,queue=2,kv=1,active=1] ...\n"
    "           prefix- and load-aware proxy over osprey serve replicas (osprey router --help)\n"
    "  render-template (--template FILE | -m FILE) --messages JSON [--add-generation-prompt]\n"
    "           [--bos T] [--eos T] [--kwargs JSON] [--tools JSON]\n"
    "           print a chat template rendered as transformers would (--help for all flags)\n"
    "  version  (or --version) the version, commit, build type and flags, whether CUDA is built in\n"
    "  plan     -m FILE [--max-model-len N] [--kv-cache-dtype D] [--kv-cache-memory B] [--block-size N]\n"
    "           KV bytes per token, blocks in a memory budget, sequences that fit (every KV dtype side by side)\n"
    "  perplexity -m FILE -f TEXT [--ctx N] [--chunks N] [--kv-cache-dtype D] [--device D]\n"
    "           [--save-kl-base FILE] [--kl-base FILE]\n"
    "           perplexity over a text (llama-perplexity's chunks), KL divergence against a saved base run\n"
    "  calibrate-kv -m FILE --data TEXT -o SCALES [--ctx N] [--max-tokens N]\n"
    "           K/V statistics per layer and KV head, and the fp8 / nvfp4 scales file --kv-scales loads\n"
    "\n"
    "  --kv-cache-dtype D: auto|f16|bf16|f32|fp8|nvfp4 (auto = f16; vLLM's fp16, bfloat16, fp8_e4m3 accepted);\n"
    "  fp8 / nvfp4 run on the CPU and CUDA backends; bf16 pages are refused (no backend has them);\n"
    "  -ctk / --cache-type-k D and -ctv / --cache-type-v D (llama.cpp's) set K's or V's pages alone, wherever\n"
    "  --kv-cache-dtype is taken, e.g. -ctk fp8 -ctv nvfp4 (a K/V split: CPU only)\n";

noreturn void cli_help(const char *text) {
    fputs(text, stdout);
    exit(0);
}

noreturn void cli_die(osp_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("osprey: error: ", stderr);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    if (s != OSP_OK) fprintf(stderr, ": %s", osp_last_error());
    fputc('\n', stderr);
    exit(1);
}

long long cli_int(const char *flag, const char *v, long long lo, long long hi) {
    if (!v) cli_die(OSP_OK, "%s needs a value", flag);
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi)
        cli_die(OSP_OK, "%s: '%s' is not an integer in [%lld, %lld]", flag, v, lo, hi);
    return x;
}

double cli_float(const char *flag, const char *v, double lo, double hi) {
    if (!v) cli_die(OSP_OK, "%s needs a value", flag);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi))
        cli_die(OSP_OK, "%s: '%s' is not a number in [%g, %g]", flag, v, lo, hi);
    return x;
}

osp_device cli_device(const char *flag, const char *v) {
    osp_device d;
    if (osp_device_parse(v, &d) != OSP_OK) cli_die(OSP_OK, "%s: '%s' is not one of cpu, cuda, auto", flag, v ? v : "");
    return d;
}

bool cli_gpu_weights(const char *flag, const char *v) {
    if (v && !strcmp(v, "quant")) return true;
    if (v && !strcmp(v, "bf16")) return false;
    cli_die(OSP_OK, "%s: '%s' is not one of bf16, quant", flag, v ? v : "");
    return false;
}

osp_cpu_activations cli_cpu_activations(const char *flag, const char *v) {
    osp_cpu_activations a = OSP_CPU_ACT_TWO_LEVEL;
    if (osp_cpu_activations_parse(v, &a) != OSP_OK) cli_die(OSP_OK, "%s: '%s' is not one of two-level, q8", flag, v ? v : "");
    return a;
}

void cli_check_exact_activations(bool exact, osp_cpu_activations a) {
    if (exact && a == OSP_CPU_ACT_Q8)
        cli_die(OSP_OK, "--exact (the f32 reference path) quantizes no activations, so --cpu-activations q8 would be "
                        "ignored: drop one of --exact and --cpu-activations q8");
}

void cli_load_progress(void *ctx, float fraction) {
    (void)ctx;
    static int last = -1;
    const int pct = (int)(fraction * 100.0f);
    if (pct == last) return;
    last = pct;
    fprintf(stderr, "\rloading weights to the GPU: %3d%%%s", pct, pct >= 100 ? "\n" : "");
}

void cli_report_device(const osp_engine *e) {
    const osp_model *m = osp_engine_model(e);
    if (osp_model_device(m) != OSP_DEVICE_CUDA) return;
    fprintf(stderr, "cuda: weights %.1f MiB, KV cache %.1f MiB on the GPU\n",
            (double)osp_model_device_weight_bytes(m) / 1048576.0, (double)osp_engine_kv_cache_bytes(e) / 1048576.0);
}

double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* `osprey --version` / `osprey version`: the build information of include/osprey/version.h (the same
 * facts serve's GET /version returns): osp_version_line() on the first line, then every fact of
 * osp_build_info_json() as a "key: value" line (booleans as on / off, nulls left out), C flags included. */
static int print_version(void) {
    puts(osp_version_line());
    json_t *o = json_loads(osp_build_info_json(), 0, NULL);
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (json_is_string(v)) printf("%s: %s\n", k, json_string_value(v));
        else if (json_is_boolean(v)) printf("%s: %s\n", k, json_is_true(v) ? "on" : "off");
    }
    json_decref(o);
    return 0;
}

/* The command's status, or 1 when its standard output could not be written (a full disk, a closed
 * pipe, /dev/full): what a command printed must have arrived for it to succeed. */
static int finish(int rc) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "osprey: error: cannot write the output: %s\n", strerror(errno));
        return rc ? rc : 1;
    }
    return rc;
}

static int dispatch(int argc, char **argv);

int main(int argc, char **argv) { return finish(dispatch(argc, argv)); }

static int dispatch(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        fputs(k_usage, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V") || !strcmp(argv[1], "version")) return print_version();
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "chat")) return cmd_chat(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(argv[1], "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench-kernels")) return cmd_bench_kernels(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plan")) return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(argv[1], "perplexity")) return cmd_perplexity(argc - 1, argv + 1);
    if (!strcmp(argv[1], "calibrate-kv")) return cmd_calibrate_kv(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 1, argv + 1);
    if (!strcmp(argv[1], "router")) return cmd_router(argc - 1, argv + 1);
    if (!strcmp(argv[1], "__engine-core")) return cmd_engine_core(argc - 1, argv + 1);
    if (!strcmp(argv[1], "__api-server")) return cmd_api_server(argc - 1, argv + 1);
    if (!strcmp(argv[1], "render-template")) return cmd_render_template(argc - 1, argv + 1);
    if (!strcmp(argv[1], "make-random-model")) return cmd_make_random_model(argc - 1, argv + 1);
    fprintf(stderr, "osprey: error: unknown command '%s'\n\n%s", argv[1], k_usage);
    return 2;
}
