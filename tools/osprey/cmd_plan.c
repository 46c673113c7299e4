/* osprey plan: how much KV cache a model needs and how many sequences fit.
 *
 * Prints the KV bytes per token (2 * n_layer * n_head_kv * head_dim * element bytes: K and V of every
 * layer, plus nvfp4's micro-block scales), the block count that a KV memory budget buys at the
 * engine's block size (the exact allocation: scale pools and the 256-byte alignment of every pool
 * included), how many sequences of a few lengths fit at once (each sequence rounds up to whole blocks,
 * as in the engine), and then the same budget for every KV dtype side by side. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey/engine.h"
#include "osprey/model.h"

/* "512M", "2G", "1000000" -> bytes (K/M/G are binary). */
static long long parse_bytes(const char *flag, const char *v) {
    if (!v) cli_die(OSP_OK, "%s needs a value", flag);
    char *end;
    double x = strtod(v, &end);
    long long mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1ll << 10, end++;
    else if (*end == 'M' || *end == 'm') mul = 1ll << 20, end++;
    else if (*end == 'G' || *end == 'g') mul = 1ll << 30, end++;
    if (*end == 'i') end++;
    if (*end == 'B' || *end == 'b') end++;
    if (end == v || *end || !(x > 0) || x * (double)mul > 9e18)
        cli_die(OSP_OK, "%s: '%s' is not a byte count (e.g. 536870912, 512M, 2G)", flag, v);
    return (long long)(x * (double)mul);
}

/* Scale bytes per token over all layers of one side (K or V): nvfp4's E4M3 micro-block scales, one per 16;
 * int8_hier's f16 scale and minimum per KV head row. */
static long long side_scale_bytes(const osp_model_config *c, osp_kv_dtype d) {
    if (d == OSP_KV_DTYPE_INT8_HIER) return (long long)c->n_layer * c->n_head_kv * 4;
    return d == OSP_KV_DTYPE_NVFP4 ? (long long)c->n_layer * c->n_head_kv * (c->head_dim / 16) : 0;
}
/* ... of K (pages of k) and V (pages of v) together. */
static long long scale_bytes(const osp_model_config *c, osp_kv_dtype k, osp_kv_dtype v) {
    return side_scale_bytes(c, k) + side_scale_bytes(c, v);
}

/* The most blocks whose whole allocation (pages, scale pools, 256-byte alignment) fits in mem. */
static long long blocks_in(const osp_model_config *c, osp_kv_dtype k, osp_kv_dtype v, int block_size, long long mem) {
    const long long bpt = osp_kv_cache_bytes_per_token(c, k, v);
    if (bpt <= 0) return 0;
    long long n = mem / (bpt * block_size);
    if (n > INT32_MAX) n = INT32_MAX;
    while (n > 0 && osp_kv_cache_bytes_for(c, k, v, (int32_t)n, block_size) > mem) n--;
    return n;
}

static const char *elem_bytes(osp_kv_dtype d) {
    return d == OSP_KV_DTYPE_F32    ? "4 bytes"
           : d == OSP_KV_DTYPE_F16  ? "2 bytes"
           : d == OSP_KV_DTYPE_FP8  ? "1 byte"
           : d == OSP_KV_DTYPE_INT8_HIER ? "1 byte (4-bit upper + 4-bit lower half)"
                                    : "1/2 byte";
}

static void print_bytes_per_token(const osp_model_config *c, osp_kv_dtype k, osp_kv_dtype v, long long bpt) {
    if (k == v)
        printf("bytes per token: %lld (2 x %d layers x %d KV heads x %d dims x %s", bpt, c->n_layer, c->n_head_kv,
               c->head_dim, elem_bytes(k));
    else
        printf("bytes per token: %lld (%d layers x %d KV heads x %d dims x (K %s %s + V %s %s)", bpt, c->n_layer,
               c->n_head_kv, c->head_dim, osp_kv_dtype_name(k), elem_bytes(k), osp_kv_dtype_name(v), elem_bytes(v));
    /* each kind of scale counted over the sides that have it (a split may have both) */
    const long long nv = (k == OSP_KV_DTYPE_NVFP4 ? side_scale_bytes(c, k) : 0) +
                         (v == OSP_KV_DTYPE_NVFP4 ? side_scale_bytes(c, v) : 0);
    const long long ih = (k == OSP_KV_DTYPE_INT8_HIER ? side_scale_bytes(c, k) : 0) +
                         (v == OSP_KV_DTYPE_INT8_HIER ? side_scale_bytes(c, v) : 0);
    if (nv) printf(", + one E4M3 scale byte per 16 values: %lld", nv);
    if (ih) printf(", + an f16 scale and minimum per KV head row: %lld", ih);
    const int fp8_sides = (k == OSP_KV_DTYPE_FP8) + (v == OSP_KV_DTYPE_FP8);
    if (fp8_sides) printf("; %d fp32 per-head scales per layer, fixed, on the host", fp8_sides * c->n_head_kv);
    printf(")\n");
}

static const char k_help[] =
    "usage: osprey plan -m FILE [options]\n"
    "  KV bytes per token, blocks in a memory budget, sequences that fit (every KV dtype side by side)\n"
    "\n"
    "  -m, --model FILE        the GGUF model (required)\n"
    "  --max-model-len N       longest sequence, 2..2^30 tokens (default: the model's training context)\n"
    CLI_KV_DTYPE_HELP
    "  --kv-cache-memory B     bytes for the KV cache: 536870912, 512M, 2G, 1.5GiB (default: 512M, as generate\n"
    "                          and chat on the CPU; serve's CPU default is 1G; on the GPU all three take room for\n"
    "                          max_num_seqs whole sequences within 90% of the GPU)\n"
    "  --block-size N          tokens per KV block (default: 16)\n"
    "  -h, --help              this text\n";

int cmd_plan(int argc, char **argv) {
    const char *model = NULL;
    osp_engine_params ep = osp_engine_default_params();
    long long mem = ep.kv_cache_memory;
    int max_len = 0, block_size = ep.block_size;
    cli_kv_types kvt = {0}; /* --kv-cache-dtype, -ctk, -ctv */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) cli_help(k_help);
        else if (!strcmp(f, "-m") || !strcmp(f, "--model")) model = v, i++;
        else if (!strcmp(f, "--max-model-len")) max_len = (int)cli_int(f, v, 2, 1 << 30), i++;
        else if (!strcmp(f, "--block-size")) block_size = (int)cli_int(f, v, 1, 1 << 16), i++;
        else if (!strcmp(f, "--kv-cache-memory")) mem = parse_bytes(f, v), i++;
        else if (cli_kv_types_arg(&kvt, f, v)) i++;
        else cli_die(OSP_OK, "plan: unknown option '%s'", f);
    }
    if (!model) cli_die(OSP_OK, "plan needs -m FILE");
    osp_model *m;
    osp_status s = osp_model_load(model, NULL, &m);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    const osp_model_config *c = osp_model_config_get(m);
    if (max_len == 0) max_len = c->n_ctx_train;
    osp_kv_dtype dk, dv;
    cli_kv_types_resolve(&kvt, ep.kv_dtype, &dk, &dv);
    char kv_name[64];
    cli_kv_types_name(dk, dv, kv_name, sizeof kv_name);
    const long long bpt = osp_kv_cache_bytes_per_token(c, dk, dv), block_bytes = bpt * block_size;
    if (bpt == 0) cli_die(OSP_OK, "kv cache dtype %s: this model's shape (head_dim %d) cannot take it", kv_name, c->head_dim);
    const long long blocks = blocks_in(c, dk, dv, block_size, mem);
    printf("model: %s (%s, %d layers, %d KV heads x %d dims)\n", model, c->arch, c->n_layer, c->n_head_kv, c->head_dim);
    printf("kv cache dtype: %s\n", kv_name);
    print_bytes_per_token(c, dk, dv, bpt);
    printf("block: %d tokens, %lld bytes\n", block_size, block_bytes);
    printf("kv cache memory: %lld bytes -> %lld blocks (%lld tokens)\n", mem, blocks, blocks * block_size);
    const long long per_max = (max_len + block_size - 1) / block_size;
    printf("max model len: %d tokens -> %lld blocks per sequence%s\n", max_len, per_max,
           per_max > blocks ? " (does not fit: requests that long are refused)" : "");
    printf("sequences that fit at once:\n");
    const int lens[] = {128, 512, 1024, 2048, 4096, 8192, 32768, 131072};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        if (lens[i] >= max_len) break;
        const long long per = (lens[i] + block_size - 1) / block_size;
        printf("  %7d tokens: %lld\n", lens[i], blocks / per);
    }
    printf("  %7d tokens: %lld  (max model len)\n", max_len, blocks / per_max);
    /* every dtype side by side, at the same budget and block size */
    printf("every kv cache dtype in %lld bytes, blocks of %d tokens:\n", mem, block_size);
    printf("  %-9s %15s %15s %19s %10s %12s %8s\n", "dtype", "bytes/token", "of which scales", "with alignment",
           "blocks", "tokens", "x f16");
    /* the six dtypes for K and V, then the K/V split the accuracy runs favour (K fp8 + V nvfp4,
     * bench/RESULTS.md), then the chosen split when it is another */
    osp_kv_dtype all[][2] = {{OSP_KV_DTYPE_F32, OSP_KV_DTYPE_F32}, {OSP_KV_DTYPE_F16, OSP_KV_DTYPE_F16},
                             {OSP_KV_DTYPE_BF16, OSP_KV_DTYPE_BF16}, {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_FP8},
                             {OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_NVFP4}, {OSP_KV_DTYPE_INT8_HIER, OSP_KV_DTYPE_INT8_HIER},
                             {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4}, {dk, dv}};
    size_t n_all = 7;
    if (dk != dv && !(dk == OSP_KV_DTYPE_FP8 && dv == OSP_KV_DTYPE_NVFP4)) n_all = 8;
    const long long f16_blocks = blocks_in(c, OSP_KV_DTYPE_F16, OSP_KV_DTYPE_F16, block_size, mem);
    for (size_t i = 0; i < n_all; i++) {
        const osp_kv_dtype k = all[i][0], v = all[i][1];
        char name[32];
        if (k == v) snprintf(name, sizeof name, "%s", osp_kv_dtype_name(k));
        else snprintf(name, sizeof name, "%s/%s", osp_kv_dtype_name(k), osp_kv_dtype_name(v)); /* K/V */
        const long long b = osp_kv_cache_bytes_per_token(c, k, v);
        if (b == 0) {
            printf("  %-9s %s\n", name,
                   k == OSP_KV_DTYPE_BF16 ? "not available: no backend has bf16 pages"
                                          : "not available for this shape (nvfp4: head_dim % 16 == 0)");
            continue;
        }
        const long long nb = blocks_in(c, k, v, block_size, mem);
        const long long total = nb > 0 ? osp_kv_cache_bytes_for(c, k, v, (int32_t)nb, block_size) : 0;
        printf("  %-9s %15lld %15lld %19.2f %10lld %12lld %8.2f\n", name, b, scale_bytes(c, k, v),
               nb > 0 ? (double)total / (double)(nb * block_size) : 0.0, nb, nb * block_size,
               f16_blocks > 0 ? (double)nb / (double)f16_blocks : 0.0);
    }
    printf("  (a/b: K pages a, V pages b: -ctk a -ctv b; CPU only)\n");
    osp_model_free(m);
    return 0;
}
