/* Shared helpers of the osprey CLI subcommands. Only tools/ may print to stdout or exit. */
#ifndef OSPREY_TOOLS_CLI_H
#define OSPREY_TOOLS_CLI_H

#include <stdbool.h>
#include <stdnoreturn.h>

#include "osprey/engine.h"
#include "osprey/model.h"
#include "osprey/status.h"

/* Prints "osprey: error: <msg>" (and osp_last_error() when s != OSP_OK) to stderr and exits 1. */
noreturn void cli_die(osp_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a number or dies naming the flag. */
long long cli_int(const char *flag, const char *v, long long lo, long long hi);
double cli_float(const char *flag, const char *v, double lo, double hi);
double cli_now_s(void);
/* Prints `text` (a subcommand's own usage: its flags with their defaults) to stdout and exits 0.
 * Every subcommand calls it for -h / --help, wherever it stands among the arguments. */
noreturn void cli_help(const char *text);
/* The --help lines of the engine flags cli_engine_arg always takes (-m, -t, --device, --kernel-table),
 * with their defaults, for the commands that take them (a string literal, to concatenate). */
#define CLI_ENGINE_HELP                                                                                        \
    "  -m, --model FILE        the GGUF model (required)\n"                                                    \
    "  -t, --threads N         CPU threads, 1..1024 (default: all cores)\n"                                    \
    "  --device D              cpu | cuda | auto (default: auto, cuda when a GPU is present)\n"                \
    "  --gpu-memory-utilization F  share of the GPU's memory for the weights, the KV cache (a draft's\n"      \
    "                          too) and a 3 GiB reserve, 0.01..1 (vLLM's flag; GPU only; default: 0.9)\n"    \
    CLI_GPU_WEIGHTS_HELP                                                                                       \
    CLI_CPU_ACT_HELP                                                                                           \
    CLI_NO_MMAP_HELP                                                                                           \
    "  -tp, --tensor-parallel-size N  split the model over N ranks (vLLM's flag; CPU only so far: N threads\n"  \
    "                          share the cores; llama / qwen2 / qwen3; default: 1)\n"                           \
    "  --kernel-table FILE     kernel choices from osprey bench-kernels --make-table\n"                         \
    "                          (default: $OSPREY_KERNEL_TABLE, else built-in)\n"                                \
    "  --speculative-config J  speculative decoding, vLLM's JSON: {\"method\": \"ngram\",\n"                     \
    "                          \"num_speculative_tokens\": K, \"prompt_lookup_min\": N, \"prompt_lookup_max\": M}\n" \
    "                          or {\"method\": \"draft_model\", \"model\": DRAFT.gguf, \"num_speculative_tokens\": K}\n" \
    "                          or {\"method\": \"quantspec\", \"num_speculative_tokens\": K} (the target drafts\n"     \
    "                          for itself with 4-bit weights; best with --kv-cache-dtype int8_hier)\n"            \
    "                          (default: off)\n"                                                               \
    "  --sparse-attention S    topk:PAGES[,recent:R][,sink:S]: each query reads at most PAGES KV pages per\n"  \
    "                          KV head (Quest top-k; R last and S first pages always); a context within\n"     \
    "                          the budget is dense (default: off; GPU: f16 pages, head_dim 64 / 128,\n"     \
    "                          groups of at most 16 heads)\n"                                             \
    "  --prefix-caching-hash-algo A  xxh3_128 (default) | sha256 | sha256_cbor: the block hashes' algorithm\n" \
    "  --prefix-caching-hash-seed N  block-hash seed (default: $OSPREY_HASH_SEED, else $PYTHONHASHSEED, else\n" \
    "                          random per run); a fixed one finds a disk tier's blocks again on the next run\n" \
    "  --trace FILE            the step timeline as Chrome trace-event JSON (host phases; on the GPU device\n" \
    "                          spans too, and the GPU's idle share between decode steps logged at the end)\n" \
    "  --kv-offloading-size G  host-memory tier of G GiB for prefix KV blocks the cache evicts (GPU only)\n"  \
    "  --kv-offload-disk DIR   disk tier for them, with --kv-offload-disk-size G (GiB); loaded back when that\n" \
    "                          beats recomputing (default: no tiers)\n"
/* The --help line of --kv-cache-dtype and the K/V split flags (the same values everywhere). */
#define CLI_KV_DTYPE_HELP                                                                                      \
    "  --kv-cache-dtype D      auto | f16 | bf16 | f32 | fp8 | nvfp4 | int8_hier for K and V (default: auto =\n" \
    "                          f16; int8_hier: QuantSpec's 4+4-bit pages;\n"                                \
    "                          vLLM's fp16, bfloat16, fp8_e4m3 accepted; bf16 is refused: no backend has it)\n" \
    "  -ctk, --cache-type-k D  K pages only, -ctv, --cache-type-v D  V pages only (llama.cpp's; win over\n"     \
    "                          --kv-cache-dtype; e.g. -ctk fp8 -ctv nvfp4; a split needs --device cpu)\n"

/* The KV dtype flags as given: --kv-cache-dtype (both), --cache-type-k / -ctk, --cache-type-v / -ctv.
 * A side's own flag wins over --kv-cache-dtype, in either order; the last of the same flag wins. */
typedef struct cli_kv_types {
    osp_kv_dtype both, k, v;
    bool both_set, k_set, v_set;
} cli_kv_types;
/* When f is one of the flags above, parses its value v into *t (cli_kv_dtype: dies on a bad or missing
 * value) and returns true; false, *t unchanged, for any other flag. */
bool cli_kv_types_arg(cli_kv_types *t, const char *f, const char *v);
/* The K and V dtypes *t picks: a side's own flag, else --kv-cache-dtype, else dflt. */
void cli_kv_types_resolve(const cli_kv_types *t, osp_kv_dtype dflt, osp_kv_dtype *k, osp_kv_dtype *v);
/* "fp8" when k == v, else "K fp8, V nvfp4" into buf (n bytes); returns buf. */
const char *cli_kv_types_name(osp_kv_dtype k, osp_kv_dtype v, char *buf, size_t n);
/* Dies when exact and k or v is quantized (--exact needs f32 / f16 pages), naming the flag. */
void cli_kv_types_check_exact(bool exact, osp_kv_dtype k, osp_kv_dtype v);
/* The --help line of --kv-scales (generate, chat, serve, bench, perplexity). */
#define CLI_KV_SCALES_HELP                                                                                     \
    "  --kv-scales FILE        fixed fp8 / nvfp4 KV scales from osprey calibrate-kv (default: the\n"           \
    "                          documented constants; a file for another model is refused)\n"
/* Parses --device cpu|cuda|auto or dies. */
osp_device cli_device(const char *flag, const char *v);
/* Parses --gpu-weights bf16|quant or dies: true for quant (osp_model_params.gpu_quant_weights). */
bool cli_gpu_weights(const char *flag, const char *v);
/* Parses --cpu-activations two-level|q8 or dies naming the accepted values. */
osp_cpu_activations cli_cpu_activations(const char *flag, const char *v);
/* Dies when exact and the activations are q8: --exact is the f32 reference path, which quantizes no matmul
 * input, so a q8 request would be silently ignored (generate, chat, serve, bench, perplexity). */
void cli_check_exact_activations(bool exact, osp_cpu_activations a);
/* The --help lines of --cpu-activations (generate, chat, serve, bench, perplexity). */
#define CLI_NO_MMAP_HELP                                                                                       \
    "  --no-mmap               CPU: copy the weight matrices out of the file mapping onto 2 MB pages\n"          \
    "                          (llama.cpp's --no-mmap, with transparent huge pages: faster decode, a longer\n" \
    "                          load; the same results; with --cpu-activations q8 on AVX512-VNNI the Q8_0/Q4_0/\n" \
    "                          Q4_1/Q5_0/Q5_1 matrices in 16-row strips, the same bytes) (default: off)\n"
#define CLI_CPU_ACT_HELP                                                                                       \
    "  --cpu-activations A     two-level | q8: how the CPU quantizes matmul inputs: two int8 levels per 32\n"  \
    "                          values (default), or one level (llama.cpp's accuracy: per 256 values for\n" \
    "                          K-quant weights, per 32 for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1, bf16 inputs for BF16\n" \
    "                          weights on AVX512-BF16; faster prompts, results differ from the default's; KL\n" \
    "                          in bench/cpu/NOTES.md)\n"
/* The --help line of --gpu-weights (generate, chat, serve, bench, perplexity). */
#define CLI_GPU_WEIGHTS_HELP                                                                                   \
    "  --gpu-weights W         bf16 | quant: on the GPU dequantize every matrix to bf16 at load (default), or\n" \
    "                          keep Q8_0/Q4_0/Q4_1/Q4_K/Q6_K matrices in their GGUF blocks (less memory,\n"  \
    "                          activations quantized to two int8 levels for the tensor cores)\n"

/* osp_model_params.progress for the CLI: a percentage on stderr while weights go to the GPU. */
void cli_load_progress(void *ctx, float fraction);
/* One stderr line with the device and, on the GPU, the memory of the weights and the KV cache. */
void cli_report_device(const osp_engine *e);

/* --kv-scales for the commands that create their own cache (perplexity, bench): cli_kv_scales_load reads
 * and parses `path` into *s (dies with the parser's message; NULL path: *s zeroed, nothing read), before
 * the model loads; cli_kv_cache_create creates m's cache of K pages of k_dtype and V pages of v_dtype
 * with those scales (s->n_layer == 0:
 * the defaults), dying when they were made for another shape or the cache cannot be created. */
typedef struct osp_kv_scales osp_kv_scales;
void cli_kv_scales_load(const char *path, osp_kv_scales *s);
osp_kv_cache *cli_kv_cache_create(osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype k_dtype,
                                  osp_kv_dtype v_dtype, const osp_kv_scales *s, const char *path);

/* ---- engine flags (engine_args.c), shared by generate, chat and serve ---- */

typedef struct cli_engine_args {
    const char *model;     /* -m, --model FILE; NULL when absent (the command says what it needs) */
    int n_threads;         /* -t, --threads N in [1, 1024]; 0 (the default): all cores */
    osp_device device;     /* --device cpu|cuda|auto; auto (cuda when a GPU is present) by default */
    bool gpu_quant_weights; /* --gpu-weights quant (default bf16): osp_engine_params.gpu_quant_weights */
    float gpu_memory_utilization; /* --gpu-memory-utilization F in [0.01, 1] (osp_engine_params'); 0: not given */
    osp_cpu_activations cpu_activations; /* --cpu-activations two-level|q8 (osp_engine_params.cpu_activations) */
    bool no_mmap;          /* --no-mmap (osp_engine_params.no_mmap) */
    int32_t tensor_parallel_size; /* -tp, --tensor-parallel-size N in [1, 64] (osp_engine_params.tensor_parallel_size) */
    cli_kv_types kv_types; /* --kv-cache-dtype, -ctk / --cache-type-k, -ctv / --cache-type-v as given */
    osp_kv_dtype kv_dtype; /* K pages, resolved from kv_types after each flag (default f16; f32 with --exact) */
    osp_kv_dtype kv_dtype_v; /* V pages, likewise (osp_engine_params.kv_dtype_v) */
    const char *kv_scales; /* --kv-scales FILE (osp_engine_params.kv_scales_path), taken with --kv-cache-dtype; NULL: none */
    bool exact;            /* --exact: fp32 activations and an f32 KV cache (the reference path);
                              --kv-cache-dtype, before or after, still picks the cache, but a quantized
                              one (fp8, nvfp4, int8_hier) with --exact is an error at parse time */
    const char *kernel_table; /* --kernel-table FILE (osp_engine_params.kernel_table); NULL: $OSPREY_KERNEL_TABLE */
    const char *trace;     /* --trace FILE: the step timeline (osp_engine_params.trace_path); NULL: none */
    osp_spec_config spec;  /* --speculative-config JSON (osp_spec_config_parse); off by default */
    osp_prefix_hash_algo hash_algo; /* --prefix-caching-hash-algo xxh3_128|sha256|sha256_cbor (xxh3_128) */
    bool hash_seed_set;    /* a shared seed: --prefix-caching-hash-seed N, else $OSPREY_HASH_SEED, else
                              $PYTHONHASHSEED (vLLM's; "random" there means unset); else random */
    uint64_t hash_seed;
    osp_sparse_config sparse; /* --sparse-attention topk:PAGES[,recent:R][,sink:S] (osp_sparse_config_parse); off */
    int64_t kv_offload_host_bytes; /* --kv-offloading-size GIB (vLLM's): host-memory KV tier; 0: none */
    const char *kv_offload_disk;   /* --kv-offload-disk DIR: disk KV tier; NULL: none */
    int64_t kv_offload_disk_bytes; /* --kv-offload-disk-size GIB, needed with --kv-offload-disk */
    bool kv_offload_host_set, kv_offload_disk_size_set; /* the size flags were given */
} cli_engine_args;

/* The flags a command takes beyond -m, -t and --device (which every caller takes). */
enum { CLI_ENGINE_KV_DTYPE = 1u << 0, CLI_ENGINE_EXACT = 1u << 1 };

/* The defaults above. */
cli_engine_args cli_engine_args_default(void);
/* Parses flag's value v as a KV cache dtype (osp_kv_dtype_parse: auto, f16, bf16, f32, fp8, nvfp4, int8_hier,
 * fp16, bfloat16, fp8_e4m3, ...); dies naming the flag and the accepted values otherwise, and with
 * osp_kv_dtype_available's reason for a dtype no backend has (bf16). */
osp_kv_dtype cli_kv_dtype(const char *flag, const char *v);
/* When argv[*i] is an engine flag (-m, -t, --device, --gpu-memory-utilization, --kernel-table, --speculative-config, and those in `accept`), parses it and its value
 * argv[*i + 1] into *a, moves *i onto the last argument used and returns true; false, with nothing
 * changed, for any other argument. A bad value dies naming the flag (cli_int, cli_device,
 * "--kv-cache-dtype: 'X' is not one of ..."); --exact together with a quantized --kv-cache-dtype
 * dies too, in either order; a missing value too, except -m's, which leaves model NULL. */
bool cli_engine_arg(cli_engine_args *a, unsigned accept, int argc, char **argv, int *i);
/* Parses a prefix-caching hash seed: decimal digits only, no sign, no leading zero (but "0"), at most
 * 2^64 - 1, so that str(seed) is the text itself (sha256_cbor hashes that text as vLLM hashes
 * PYTHONHASHSEED). Returns false for anything else. */
bool cli_parse_hash_seed(const char *v, uint64_t *out);
/* The environment's seed into *a unless a seed is already set: $OSPREY_HASH_SEED, else $PYTHONHASHSEED
 * ("random" or empty: none). A malformed value dies naming the variable. */
void cli_engine_env_seed(cli_engine_args *a);
/* Parses flag's value v as a size in GiB (a plain decimal number, at most 1 PiB) into bytes; dies naming
 * the flag. */
int64_t cli_gib(const char *flag, const char *v);
/* Dies when the KV offload flags do not go together (a disk directory without a size, or the reverse). */
void cli_engine_offload_check(const cli_engine_args *a);
/* $OSPREY_KV_OFFLOAD_ALWAYS_LOAD set and not "0": load every block an offload tier holds, whatever the
 * cost model measures (osp_engine_params.kv_offload_no_cost_model; tests and A/B runs). */
bool cli_offload_always_load(void);
/* osp_engine_default_params() with the model, threads, device, KV cache dtype, exact and the prefix
 * hash (algorithm; seed from *a or, when unset there, from the environment: cli_engine_env_seed) taken from *a
 * and load_progress = cli_load_progress. The command sets the rest (block size, max_num_seqs, ...). */
osp_engine_params cli_engine_params(const cli_engine_args *a);

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_kernels(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_calibrate_kv(int argc, char **argv);
int cmd_serve(int argc, char **argv); /* tools/server/serve.c */
int cmd_router(int argc, char **argv); /* tools/router/router.c */
/* The hidden `osprey __engine-core ENDPOINT EPOCH <serve args>`: the EngineCore process that
 * `osprey serve --engine-process` starts (tools/server/core_proc.c); not for users. */
int cmd_engine_core(int argc, char **argv);
/* The hidden `osprey __api-server K ENDPOINT <serve args>`: API server K of `serve --api-server-count N`. */
int cmd_api_server(int argc, char **argv);
int cmd_make_random_model(int argc, char **argv);
int cmd_render_template(int argc, char **argv);

#endif
