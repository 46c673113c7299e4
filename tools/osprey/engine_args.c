/* The engine's flags, parsed once for every subcommand that loads a model into the engine.
 * (--kv-cache-dtype: auto|f16|bf16|f32|fp8|nvfp4 and vLLM's aliases, for generate, chat and serve.)
 *
 * osprey generate, chat and serve each took -m/--model, -t/--threads and --device (generate also
 * --kv-cache-dtype and --exact) with copied code; here they are parsed in one place so each flag has
 * one meaning, one default and one error message everywhere. A command runs its own flag loop and
 * hands each argument to cli_engine_arg first; what it does not take (a flag outside `accept`) stays
 * the command's to reject, with its own "unknown option" message. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey_internal.h"

void cli_kv_scales_load(const char *path, osp_kv_scales *s) {
    memset(s, 0, sizeof *s);
    if (!path) return;
    const osp_status st = osp_kv_scales_load(path, s);
    if (st != OSP_OK) cli_die(st, "--kv-scales");
}

osp_kv_cache *cli_kv_cache_create(osp_model *m, int32_t num_blocks, int32_t block_size, osp_kv_dtype k_dtype,
                                  osp_kv_dtype v_dtype, const osp_kv_scales *s, const char *path) {
    const float *k = NULL, *v = NULL;
    if (s && s->n_layer) {
        const osp_model_config *c = osp_model_config_get(m);
        const osp_status st = osp_kv_scales_check_shape(s, c->n_layer, c->n_head_kv, c->head_dim);
        if (st != OSP_OK) cli_die(st, "--kv-scales %s", path ? path : "");
        osp_kv_scales_for(s, k_dtype, v_dtype, &k, &v);
    }
    osp_kv_cache *kv;
    const osp_status st = osp_kv_cache_create_with_scales(m, num_blocks, block_size, k_dtype, v_dtype, k, v, &kv);
    if (st != OSP_OK) cli_die(st, "cannot create the KV cache");
    return kv;
}

cli_engine_args cli_engine_args_default(void) {
    cli_engine_args a = {.kv_dtype = OSP_KV_DTYPE_F16, .kv_dtype_v = OSP_KV_DTYPE_F16, .spec = osp_spec_default_config(),
                         .sparse = osp_sparse_default_config()};
    a.device = cli_device("--device", "auto");
    return a;
}

bool cli_engine_arg(cli_engine_args *a, unsigned accept, int argc, char **argv, int *i) {
    const char *f = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model = v, ++*i;
    else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) a->n_threads = (int)cli_int(f, v, 1, 1024), ++*i;
    else if (!strcmp(f, "--device")) a->device = cli_device(f, v), ++*i;
    else if (!strcmp(f, "--gpu-weights")) a->gpu_quant_weights = cli_gpu_weights(f, v), ++*i;
    else if (!strcmp(f, "--gpu-memory-utilization")) a->gpu_memory_utilization = (float)cli_float(f, v, 0.01, 1.0), ++*i;
    else if (!strcmp(f, "--cpu-activations")) a->cpu_activations = cli_cpu_activations(f, v), ++*i;
    else if (!strcmp(f, "--no-mmap")) a->no_mmap = true;
    else if (!strcmp(f, "-tp") || !strcmp(f, "--tensor-parallel-size")) a->tensor_parallel_size = (int32_t)cli_int(f, v, 1, 64), ++*i;
    else if (!strcmp(f, "--kernel-table")) {
        if (!v) cli_die(OSP_OK, "--kernel-table needs a file (osprey bench-kernels --make-table writes one)");
        a->kernel_table = v, ++*i;
    }
    else if (!strcmp(f, "--speculative-config")) {
        if (!v || !*v) /* '' is not a config: leave the flag out for no speculation */
            cli_die(OSP_OK, "--speculative-config needs a JSON object, e.g. "
                            "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4}' (leave the flag out for none)");
        const osp_status s = osp_spec_config_parse(v, &a->spec);
        if (s != OSP_OK) cli_die(s, "--speculative-config");
        ++*i;
    }
    else if (!strcmp(f, "--prefix-caching-hash-algo")) {
        if (v && !strcmp(v, "xxh3_128")) a->hash_algo = OSP_PREFIX_HASH_XXH3_128;
        else if (v && !strcmp(v, "sha256")) a->hash_algo = OSP_PREFIX_HASH_SHA256;
        else if (v && !strcmp(v, "sha256_cbor")) a->hash_algo = OSP_PREFIX_HASH_SHA256_CBOR;
        else cli_die(OSP_OK, "--prefix-caching-hash-algo: '%s' is not xxh3_128, sha256 or sha256_cbor (vLLM's; "
                             "the one whose hashes vLLM and llm-d reproduce)", v ? v : "");
        ++*i;
    } else if (!strcmp(f, "--prefix-caching-hash-seed")) {
        if (!v || !cli_parse_hash_seed(v, &a->hash_seed))
            cli_die(OSP_OK, "--prefix-caching-hash-seed: '%s' is not a decimal integer in [0, 2^64) without sign or "
                            "leading zeros", v ? v : "");
        a->hash_seed_set = true;
        ++*i;
    }
    else if (!strcmp(f, "--sparse-attention")) {
        if (!v) cli_die(OSP_OK, "--sparse-attention needs a value: topk:PAGES[,recent:R][,sink:S] or off");
        const osp_status s = osp_sparse_config_parse(v, &a->sparse);
        if (s != OSP_OK) cli_die(s, "--sparse-attention %s", v);
        ++*i;
    }
    else if (!strcmp(f, "--trace")) {
        if (!v || !*v) cli_die(OSP_OK, "--trace needs a file (the step timeline, Chrome trace-event JSON)");
        a->trace = v, ++*i;
    }
    else if (!strcmp(f, "--kv-offloading-size")) a->kv_offload_host_bytes = cli_gib(f, v), a->kv_offload_host_set = true, ++*i;
    else if (!strcmp(f, "--kv-offload-disk-size"))
        a->kv_offload_disk_bytes = cli_gib(f, v), a->kv_offload_disk_size_set = true, ++*i;
    else if (!strcmp(f, "--kv-offload-disk")) {
        if (!v || !*v) cli_die(OSP_OK, "--kv-offload-disk needs a directory (created if missing)");
        a->kv_offload_disk = v, ++*i;
    }
    else if ((accept & CLI_ENGINE_EXACT) && !strcmp(f, "--exact")) {
        a->exact = true;
    } else if ((accept & CLI_ENGINE_KV_DTYPE) && cli_kv_types_arg(&a->kv_types, f, v)) {
        ++*i;
    } else if ((accept & CLI_ENGINE_KV_DTYPE) && !strcmp(f, "--kv-scales")) {
        if (!v) cli_die(OSP_OK, "--kv-scales needs a file (osprey calibrate-kv -o FILE writes one)");
        osp_kv_scales s; /* a bad file fails here, at parse time; the engine checks the model's shape */
        cli_kv_scales_load(v, &s);
        osp_kv_scales_free(&s);
        a->kv_scales = v, ++*i;
    } else return false;
    /* a side no flag names: f16, or f32 with --exact (the fp32 reference path) */
    cli_kv_types_resolve(&a->kv_types, a->exact ? OSP_KV_DTYPE_F32 : OSP_KV_DTYPE_F16, &a->kv_dtype, &a->kv_dtype_v);
    /* either order: a quantized cache is not exact, nor are q8 activations */
    cli_kv_types_check_exact(a->exact, a->kv_dtype, a->kv_dtype_v);
    cli_check_exact_activations(a->exact, a->cpu_activations);
    return true;
}

bool cli_kv_types_arg(cli_kv_types *t, const char *f, const char *v) {
    if (!strcmp(f, "--kv-cache-dtype")) t->both = cli_kv_dtype(f, v), t->both_set = true;
    else if (!strcmp(f, "--cache-type-k") || !strcmp(f, "-ctk")) t->k = cli_kv_dtype(f, v), t->k_set = true;
    else if (!strcmp(f, "--cache-type-v") || !strcmp(f, "-ctv")) t->v = cli_kv_dtype(f, v), t->v_set = true;
    else return false;
    return true;
}

void cli_kv_types_resolve(const cli_kv_types *t, osp_kv_dtype dflt, osp_kv_dtype *k, osp_kv_dtype *v) {
    const osp_kv_dtype both = t->both_set ? t->both : dflt;
    *k = t->k_set ? t->k : both;
    *v = t->v_set ? t->v : both;
}

const char *cli_kv_types_name(osp_kv_dtype k, osp_kv_dtype v, char *buf, size_t n) {
    const char *kn = osp_kv_dtype_name(k) ? osp_kv_dtype_name(k) : "?", *vn = osp_kv_dtype_name(v) ? osp_kv_dtype_name(v) : "?";
    if (k == v) snprintf(buf, n, "%s", kn);
    else snprintf(buf, n, "K %s, V %s", kn, vn);
    return buf;
}

void cli_kv_types_check_exact(bool exact, osp_kv_dtype k, osp_kv_dtype v) {
    if (!exact || (!osp_kv_dtype_quantized(k) && !osp_kv_dtype_quantized(v))) return;
    if (k == v)
        cli_die(OSP_OK, "--exact needs an exact KV cache (f32 or f16), not %s: drop one of --exact and "
                        "--kv-cache-dtype %s", osp_kv_dtype_name(k), osp_kv_dtype_name(k));
    const bool kq = osp_kv_dtype_quantized(k);
    cli_die(OSP_OK, "--exact needs an exact KV cache (f32 or f16), not %s %s pages: drop one of --exact and "
                    "--cache-type-%c %s", kq ? "K" : "V", osp_kv_dtype_name(kq ? k : v), kq ? 'k' : 'v',
            osp_kv_dtype_name(kq ? k : v));
}

osp_kv_dtype cli_kv_dtype(const char *flag, const char *v) {
    osp_kv_dtype d;
    if (!v || osp_kv_dtype_parse(v, &d) != OSP_OK)
        cli_die(OSP_OK, "%s: '%s' is not one of auto, f16, bf16, f32, fp8, nvfp4, int8_hier (vLLM's fp16, bfloat16 and fp8_e4m3 "
                        "are accepted too)", flag, v ? v : "");
    const osp_status s = osp_kv_dtype_available(d); /* bf16: named, refused, never stored as another type */
    if (s != OSP_OK) cli_die(s, "%s %s", flag, v);
    return d;
}

bool cli_parse_hash_seed(const char *v, uint64_t *out) {
    if (!v || !v[0] || (v[0] == '0' && v[1])) return false;
    uint64_t x = 0;
    for (const char *p = v; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        const uint64_t d = (uint64_t)(*p - '0');
        if (x > (UINT64_MAX - d) / 10) return false;
        x = x * 10 + d;
    }
    *out = x;
    return true;
}

void cli_engine_env_seed(cli_engine_args *a) {
    if (a->hash_seed_set) return;
    static const char *const vars[] = {"OSPREY_HASH_SEED", "PYTHONHASHSEED"};
    for (int k = 0; k < 2; k++) {
        const char *v = getenv(vars[k]);
        if (!v || !v[0] || !strcmp(v, "random")) continue;
        if (!cli_parse_hash_seed(v, &a->hash_seed))
            cli_die(OSP_OK, "$%s: '%s' is not a decimal integer in [0, 2^64) without sign or leading zeros", vars[k], v);
        a->hash_seed_set = true;
        return;
    }
}

int64_t cli_gib(const char *flag, const char *v) {
    /* a plain decimal: digits with an optional fraction (no sign, hex, exponent or spaces) */
    bool ok = v && *v, digits = false;
    for (const char *c = v; ok && *c; c++) {
        if (*c >= '0' && *c <= '9') digits = true;
        else if (*c != '.' || strchr(c + 1, '.')) ok = false;
    }
    if (!ok || !digits) cli_die(OSP_OK, "%s: '%s' is not a size in GiB (a decimal number, e.g. 4 or 0.5)", flag, v ? v : "");
    const double x = strtod(v, NULL);
    if (x > 1048576.0) cli_die(OSP_OK, "%s: %s GiB is more than the 1048576 GiB (1 PiB) it takes", flag, v);
    return (int64_t)(x * 1073741824.0);
}

bool cli_offload_always_load(void) {
    const char *v = getenv("OSPREY_KV_OFFLOAD_ALWAYS_LOAD");
    return v && *v && strcmp(v, "0") != 0;
}

void cli_engine_offload_check(const cli_engine_args *a) {
    if (a->kv_offload_disk && !a->kv_offload_disk_size_set)
        cli_die(OSP_OK, "--kv-offload-disk %s needs --kv-offload-disk-size GIB (how much of the disk the KV blocks may take)",
                a->kv_offload_disk);
    if (a->kv_offload_disk_size_set && !a->kv_offload_disk) cli_die(OSP_OK, "--kv-offload-disk-size needs --kv-offload-disk DIR");
    if (a->kv_offload_disk && a->kv_offload_disk_bytes <= 0)
        cli_die(OSP_OK, "--kv-offload-disk-size must be more than 0 GiB (it holds whole KV blocks)");
    if (a->kv_offload_host_set && a->kv_offload_host_bytes <= 0)
        cli_die(OSP_OK, "--kv-offloading-size must be more than 0 GiB (leave the flag out for no host tier)");
}

osp_engine_params cli_engine_params(const cli_engine_args *a) {
    osp_engine_params ep = osp_engine_default_params();
    ep.model_path = a->model;
    ep.n_threads = a->n_threads;
    ep.kv_dtype = a->kv_dtype;
    ep.kv_dtype_v = a->kv_dtype_v;
    ep.kv_dtype_v_set = true;
    ep.kv_scales_path = a->kv_scales;
    ep.exact = a->exact;
    ep.device = a->device;
    /* on the GPU the cache holds a whole max_model_len sequence within gpu_memory_utilization (vLLM's
       sizing; serve does the same): the library's 512 MiB default holds 4,096 tokens of an 8B model */
    if (ep.device == OSP_DEVICE_CUDA) ep.kv_cache_memory = 0;
    if (a->gpu_memory_utilization > 0 && ep.device != OSP_DEVICE_CUDA)
        cli_die(OSP_OK, "--gpu-memory-utilization sizes the GPU's KV cache: it needs --device cuda (the CPU's cache "
                        "holds the sequence)");
    ep.gpu_memory_utilization = a->gpu_memory_utilization;
    ep.gpu_quant_weights = a->gpu_quant_weights;
    ep.cpu_activations = a->cpu_activations;
    ep.no_mmap = a->no_mmap;
    ep.tensor_parallel_size = a->tensor_parallel_size;
    ep.kernel_table = a->kernel_table;
    ep.trace_path = a->trace;
    ep.speculative = a->spec;
    /* measurements of adaptive k against fixed (bench/spec.sh FIXED_K=1): k drafts every step */
    const char *fk = getenv("OSPREY_SPEC_FIXED_K");
    ep.speculative_fixed_k = fk && *fk && strcmp(fk, "0") != 0;
    cli_engine_args seeded = *a;
    cli_engine_env_seed(&seeded);
    ep.hash_algo = a->hash_algo;
    ep.hash_seed_set = seeded.hash_seed_set;
    ep.hash_seed = seeded.hash_seed;
    ep.sparse_attention = a->sparse;
    cli_engine_offload_check(a);
    ep.kv_offload_host_bytes = a->kv_offload_host_bytes;
    ep.kv_offload_disk_dir = a->kv_offload_disk;
    ep.kv_offload_disk_bytes = a->kv_offload_disk_bytes;
    ep.kv_offload_no_cost_model = cli_offload_always_load();
    ep.load_progress = cli_load_progress;
    return ep;
}
