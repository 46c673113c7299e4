/* osprey calibrate-kv: the fixed scales of a quantized KV cache, chosen from a text run through the
 * model (issue 13). The text is tokenized and cut into chunks of --ctx tokens (BOS first when the
 * vocabulary adds one, as `osprey perplexity` does); each chunk runs through the model on the CPU from
 * an empty f32 cache, and the post-RoPE K and V rows it wrote go to the calibrator (src/kv/kv_calib.h),
 * which keeps per layer and KV head the statistics and the exact reconstruction error of every
 * candidate scale. The scales with the least error are written to -o (src/format/kv_scales.h), and a
 * report goes to stdout: per layer and K/V, absmax, 99.9 / 99.99 percentiles, outlier share, the
 * NVFP4 micro-block scale saturation / underflow rates under the default and the chosen tensor scale,
 * and the relative reconstruction error (sum (x - q(x))^2 / sum x^2) of fp8 and nvfp4 with the default
 * and the chosen scales, and of nvfp4 on Hadamard-rotated rows and with searched micro-block scales
 * (both measured only: what the pages would gain). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey/kv_cache.h"
#include "osprey/tokenizer.h"
#include "osprey_internal.h"

#define CAL_BLOCK 16

static const char *k_help =
    "usage: osprey calibrate-kv -m FILE --data TEXT -o SCALES [options]\n"
    "  runs TEXT through the model (CPU), records K/V statistics per layer and KV head, and writes the\n"
    "  fp8 / nvfp4 scales with the least reconstruction error to SCALES (for --kv-scales)\n"
    "  -m, --model FILE        the GGUF model (required)\n"
    "  --data TEXT             the calibration text file (required)\n"
    "  -o, --output SCALES     the scales file to write (required)\n"
    "  --ctx N                 tokens a chunk, 16..65536 (default 1024)\n"
    "  --max-tokens N          use the text's first N tokens only (default: all)\n"
    "  -t, --threads N         CPU threads, 1..1024 (default: all cores)\n"
    "  --rule R                how -o's scales are chosen: mse (the least reconstruction error over\n"
    "                          power-of-two scales), absmax (fp8 absmax / 448 per head, nvfp4 the largest\n"
    "                          micro-block amax / (6 x 448) per layer) or p99.99 (the same with the\n"
    "                          99.99th percentile; larger values clip) (default: mse)\n"
    "  --also RULE=FILE        also write the scales of another rule to FILE (repeatable)\n"
    "  -q, --quiet             no per-layer report on stdout\n";

static bool parse_rule(const char *v, osp_kv_calib_rule *r) {
    if (!strcmp(v, "mse")) *r = OSP_KVC_RULE_MSE;
    else if (!strcmp(v, "absmax")) *r = OSP_KVC_RULE_ABSMAX;
    else if (!strcmp(v, "p99.99")) *r = OSP_KVC_RULE_P9999;
    else return false;
    return true;
}

#define CMD_NAME "calibrate-kv"
#define MAX_TEXT_BYTES ((size_t)1 << 30) /* a corpus file: wikitext-103's test split is 1.3 MB */

static char *read_text(const char *path, size_t *n) {
    char *buf;
    const osp_status s = osp_read_file(path, MAX_TEXT_BYTES, "text", &buf, n);
    if (s != OSP_OK) cli_die(s, CMD_NAME);
    return buf;
}

static void report(const osp_kv_calib *cal, const osp_model_config *c, const osp_kv_scales *sc) {
    const int32_t H = c->n_head_kv;
    float *dflt8 = malloc(sizeof(float) * (size_t)H);
    if (!dflt8) cli_die(OSP_ERR_NOMEM, "report");
    for (int32_t h = 0; h < H; h++) dflt8[h] = OSP_KV_FP8_DEFAULT_SCALE;
    const float d4 = OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE;
    printf("# per layer, K and V (all KV heads): |x| statistics; relative squared error sum (x-q)^2/sum x^2 of\n"
           "# fp8 and nvfp4 with the default scales (fp8 %g, nvfp4 T %g) and the chosen ones; nvfp4 on Hadamard-\n"
           "# rotated rows (chosen T) and with searched micro-block scales (default T), both measured only; nvfp4\n"
           "# micro-block scales saturated / subnormal / zero (%%) under the default and the chosen T\n",
           (double)OSP_KV_FP8_DEFAULT_SCALE, (double)d4);
    printf("%-5s %-2s %9s %9s %9s %9s %7s | %9s %9s | %9s %9s %9s %9s %9s | %-20s %-20s\n", "layer", "kv", "absmax", "p99.9",
           "p99.99", "rms", "outl%", "fp8 dflt", "fp8 cal", "nv4 dflt", "nv4 cal", "T cal", "nv4 rot", "nv4 srch", "rates dflt",
           "rates cal");
    double tot[6][2] = {{0}};
    for (int32_t l = 0; l < c->n_layer; l++)
        for (int w = 0; w < 2; w++) {
            osp_kv_calib_stats st;
            osp_kv_calib_stats_of(cal, l, w, -1, &st);
            double outl = 0;
            for (int32_t h = 0; h < H; h++) {
                osp_kv_calib_stats sh;
                osp_kv_calib_stats_of(cal, l, w, h, &sh);
                outl += sh.outlier_share * (double)sh.n;
            }
            outl /= st.n ? (double)st.n : 1.0;
            const float *f8 = (w ? sc->fp8_v : sc->fp8_k) + (size_t)l * (size_t)H;
            const float t = (w ? sc->nvfp4_v : sc->nvfp4_k)[l];
            const double e[6] = {osp_kv_calib_fp8_rel_err(cal, l, w, dflt8), osp_kv_calib_fp8_rel_err(cal, l, w, f8),
                                 osp_kv_calib_nvfp4_rel_err(cal, l, w, d4, 0), osp_kv_calib_nvfp4_rel_err(cal, l, w, t, 0),
                                 osp_kv_calib_nvfp4_rel_err(cal, l, w, t, 1),
                                 osp_kv_calib_nvfp4_searched_rel_err(cal, l, w)};
            for (int k = 0; k < 6; k++) tot[k][w] += e[k] / c->n_layer;
            osp_kv_calib_nvfp4_rates ra, rb;
            osp_kv_calib_nvfp4_rates_of(cal, l, w, d4, &ra);
            osp_kv_calib_nvfp4_rates_of(cal, l, w, t, &rb);
            printf("%-5d %-2s %9.4g %9.4g %9.4g %9.4g %7.3f | %9.3e %9.3e | %9.3e %9.3e %9.3g %9.3e %9.3e | %5.2f/%5.2f/%5.2f    "
                   "%5.2f/%5.2f/%5.2f\n",
                   l, w ? "V" : "K", st.absmax, st.p999, st.p9999, st.rms, 100 * outl, e[0], e[1], e[2], e[3], (double)t,
                   e[4], e[5], 100 * ra.saturated, 100 * ra.subnormal, 100 * ra.zero, 100 * rb.saturated, 100 * rb.subnormal,
                   100 * rb.zero);
        }
    for (int w = 0; w < 2; w++)
        printf("mean over layers, %s: fp8 %.3e -> %.3e, nvfp4 %.3e -> %.3e, nvfp4 rotated %.3e, nvfp4 searched "
               "micro-block scales %.3e\n", w ? "V" : "K", tot[0][w], tot[1][w], tot[2][w], tot[3][w], tot[4][w], tot[5][w]);
    free(dflt8);
}

int cmd_calibrate_kv(int argc, char **argv) {
    const char *model = NULL, *data = NULL, *out_path = NULL;
    int ctx = 1024, n_threads = 0;
    long long max_tokens = 0;
    bool quiet = false;
    osp_kv_calib_rule rule = OSP_KVC_RULE_MSE;
    enum { MAX_ALSO = 8 };
    osp_kv_calib_rule also_rule[MAX_ALSO];
    const char *also_path[MAX_ALSO];
    int n_also = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) cli_help(k_help);
        if (!strcmp(f, "-q") || !strcmp(f, "--quiet")) {
            quiet = true;
            continue;
        }
        const bool has_v = v != NULL;
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) model = v, i++;
        else if (!strcmp(f, "--data")) data = v, i++;
        else if (!strcmp(f, "-o") || !strcmp(f, "--output")) out_path = v, i++;
        else if (!strcmp(f, "--ctx")) ctx = (int)cli_int(f, v, 16, 65536), i++;
        else if (!strcmp(f, "--max-tokens")) max_tokens = cli_int(f, v, 16, 1ll << 40), i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "--rule")) {
            if (!v || !parse_rule(v, &rule)) cli_die(OSP_OK, "--rule: '%s' is not mse, absmax or p99.99", v ? v : "");
            i++;
        } else if (!strcmp(f, "--also")) {
            char name[16];
            const char *eq = v ? strchr(v, '=') : NULL;
            if (!eq || eq == v || (size_t)(eq - v) >= sizeof name || !eq[1])
                cli_die(OSP_OK, "--also needs RULE=FILE, e.g. absmax=absmax.kvs");
            memcpy(name, v, (size_t)(eq - v)), name[eq - v] = '\0';
            if (n_also == MAX_ALSO) cli_die(OSP_OK, "--also: at most %d", MAX_ALSO);
            if (!parse_rule(name, &also_rule[n_also])) cli_die(OSP_OK, "--also: '%s' is not mse, absmax or p99.99", name);
            also_path[n_also++] = eq + 1, i++;
        }
        else cli_die(OSP_OK, "calibrate-kv: unknown option '%s' (osprey calibrate-kv --help)", f);
        if (!has_v) cli_die(OSP_OK, "%s needs a value", f);
    }
    if (!model || !data || !out_path)
        cli_die(OSP_OK, "calibrate-kv needs -m FILE, --data TEXT and -o SCALES (osprey calibrate-kv --help)");

    osp_model_params mp = osp_model_default_params();
    mp.n_threads = n_threads;
    mp.device = OSP_DEVICE_CPU; /* the calibrator reads the f32 pages on the host */
    osp_model *m;
    osp_status s = osp_model_load(model, &mp, &m);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    const osp_model_config *c = osp_model_config_get(m);
    osp_tokenizer *tok;
    s = osp_tokenizer_load(osp_model_gguf(m), &tok);
    if (s != OSP_OK) cli_die(s, "the model has no usable tokenizer");
    size_t text_len = 0;
    char *text = read_text(data, &text_len);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    s = osp_tokenizer_encode(tok, text, text_len, true, false, &ids, &n_ids);
    if (s != OSP_OK) cli_die(s, "cannot tokenize %s", data);
    free(text);
    if (max_tokens > 0 && (size_t)max_tokens < n_ids) n_ids = (size_t)max_tokens;
    if (n_ids < 16) cli_die(OSP_OK, "%s has %zu tokens: calibration needs at least 16", data, n_ids);
    if (ctx > c->n_ctx_train) ctx = c->n_ctx_train;
    const bool add_bos = osp_tokenizer_add_bos(tok) && osp_tokenizer_bos(tok) >= 0;

    osp_kv_calib *cal;
    s = osp_kv_calib_create(c->n_layer, c->n_head_kv, c->head_dim, &cal);
    if (s != OSP_OK) cli_die(s, "calibrate-kv");
    const int32_t nblk = (ctx + CAL_BLOCK - 1) / CAL_BLOCK, ub = ctx < 512 ? ctx : 512;
    osp_kv_cache *kv;
    s = osp_kv_cache_create(m, nblk, CAL_BLOCK, OSP_KV_DTYPE_F32, &kv);
    if (s != OSP_OK) cli_die(s, "cannot create the KV cache");
    int32_t *bt = malloc((size_t)nblk * sizeof *bt), *pos = malloc((size_t)ub * sizeof *pos),
            *slot = malloc((size_t)ub * sizeof *slot), *in = malloc((size_t)ctx * sizeof *in);
    float *logits = malloc((size_t)c->n_vocab * sizeof *logits);
    if (!bt || !pos || !slot || !in || !logits) cli_die(OSP_ERR_NOMEM, "calibration buffers");
    for (int32_t b = 0; b < nblk; b++) bt[b] = b;
    fprintf(stderr, "calibrate-kv: %s: %zu tokens in chunks of %d, %d layers x %d KV heads x %d, %d threads\n", data,
            n_ids, ctx, c->n_layer, c->n_head_kv, c->head_dim, osp_model_n_threads(m));
    const double t0 = cli_now_s();
    for (size_t c0 = 0; c0 < n_ids; c0 += (size_t)ctx) {
        const int n = n_ids - c0 < (size_t)ctx ? (int)(n_ids - c0) : ctx;
        if (n < 16 && c0 > 0) break; /* a short tail adds little */
        memcpy(in, ids + c0, (size_t)n * sizeof *in);
        if (add_bos) in[0] = osp_tokenizer_bos(tok);
        for (int u0 = 0; u0 < n; u0 += ub) {
            const int nb = n - u0 < ub ? n - u0 : ub;
            for (int j = 0; j < nb; j++) pos[j] = u0 + j, slot[j] = u0 + j; /* identity block table */
            const int32_t qsl[2] = {0, nb}, sl[1] = {u0 + nb}, li[1] = {nb - 1};
            const osp_batch b = {.num_tokens = nb, .token_ids = in + u0, .positions = pos, .slot_mapping = slot,
                                 .num_seqs = 1, .query_start_loc = qsl, .seq_lens = sl, .block_table = bt,
                                 .max_blocks_per_seq = nblk, .num_logits = 1, .logits_indices = li};
            s = osp_model_forward(m, kv, &b, logits);
            if (s != OSP_OK) cli_die(s, "forward pass failed");
        }
        s = osp_kv_calib_add_cache(cal, kv, bt, n);
        if (s != OSP_OK) cli_die(s, "calibrate-kv");
        fprintf(stderr, "\rcalibrate-kv: %zu / %zu tokens (%.0f s)", c0 + (size_t)n, n_ids, cli_now_s() - t0);
    }
    fprintf(stderr, "\n");
    osp_kv_scales sc;
    for (int k = 0; k < n_also; k++) {
        s = osp_kv_calib_choose(cal, also_rule[k], &sc);
        if (s == OSP_OK) s = osp_kv_scales_save(also_path[k], &sc);
        if (s != OSP_OK) cli_die(s, "calibrate-kv");
        osp_kv_scales_free(&sc);
        fprintf(stderr, "calibrate-kv: --also scales written to %s\n", also_path[k]);
    }
    s = osp_kv_calib_choose(cal, rule, &sc);
    if (s != OSP_OK) cli_die(s, "calibrate-kv");
    s = osp_kv_scales_save(out_path, &sc);
    if (s != OSP_OK) cli_die(s, "calibrate-kv");
    if (!quiet) report(cal, c, &sc);
    fprintf(stderr, "calibrate-kv: scales written to %s (%.0f s)\n", out_path, cli_now_s() - t0);
    osp_kv_scales_free(&sc);
    free(bt), free(pos), free(slot), free(in), free(logits), free(ids);
    osp_kv_calib_free(cal);
    osp_kv_cache_free(kv);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return 0;
}
