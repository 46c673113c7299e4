/* osprey plan: how much KV cache a model needs and how many sequences fit.
 *
 * Prints the KV bytes per token (2 * n_layer * n_head_kv * head_dim * element bytes: K and V of every
 * layer), the block count that a KV memory budget buys at the engine's block size, and how many
 * sequences of a few lengths fit at once (each sequence rounds up to whole blocks, as in the engine). */
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

int cmd_plan(int argc, char **argv) {
    const char *model = NULL;
    osp_engine_params ep = osp_engine_default_params();
    long long mem = ep.kv_cache_memory;
    int max_len = 0, block_size = ep.block_size;
    osp_kv_dtype dt = ep.kv_dtype;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) model = v, i++;
        else if (!strcmp(f, "--max-model-len")) max_len = (int)cli_int(f, v, 2, 1 << 30), i++;
        else if (!strcmp(f, "--block-size")) block_size = (int)cli_int(f, v, 1, 1 << 16), i++;
        else if (!strcmp(f, "--kv-cache-memory")) mem = parse_bytes(f, v), i++;
        else if (!strcmp(f, "--kv-cache-dtype")) {
            if (osp_kv_dtype_parse(v, &dt) != OSP_OK) cli_die(OSP_OK, "--kv-cache-dtype: '%s' is not f16 or f32", v ? v : "");
            i++;
        } else cli_die(OSP_OK, "plan: unknown option '%s'", f);
    }
    if (!model) cli_die(OSP_OK, "plan needs -m FILE");
    osp_model *m;
    osp_status s = osp_model_load(model, NULL, &m);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    const osp_model_config *c = osp_model_config_get(m);
    if (max_len == 0) max_len = c->n_ctx_train;
    const long long bpt = osp_kv_cache_bytes_per_token(c, dt), block_bytes = bpt * block_size;
    const long long blocks = mem / block_bytes;
    printf("model: %s (%s, %d layers, %d KV heads x %d dims)\n", model, c->arch, c->n_layer, c->n_head_kv, c->head_dim);
    printf("kv cache dtype: %s\n", osp_kv_dtype_name(dt));
    printf("bytes per token: %lld (2 x %d layers x %d KV heads x %d dims x %d bytes)\n", bpt, c->n_layer, c->n_head_kv,
           c->head_dim, dt == OSP_KV_DTYPE_F16 ? 2 : 4);
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
    osp_model_free(m);
    return 0;
}
