/* kv_accuracy: what quantized KV pages cost in accuracy, by teacher forcing (issue 13).
 *
 * The text's first N tokens run through the model in chunks (prefill, every position's logits kept),
 * once per KV dtype, on the CPU backend. The f16 run is the baseline (osprey's default KV); every
 * other dtype is compared with it position by position:
 *   top-1  share of positions whose argmax equals f16's
 *   KL     mean over positions of KL(p_f16 || p_dtype), nats (softmax in double)
 *   dlogit max |logit_dtype - logit_f16| over positions and vocabulary
 *   ppl    exp(mean NLL of the text's next token), for every dtype including f16
 * Every chunk's attention reads the pages the earlier chunks wrote, so the quantized K/V of every
 * earlier token is what each position sees (as in decode).
 *
 * usage: kv_accuracy -m MODEL -f TEXT [-n TOKENS (512)] [--chunk C (128)] [-t THREADS]
 *                    [--fp8-scale S (default)] [--nvfp4-scale T (default)] [--dtypes f32,fp8,nvfp4]
 * Prints one table row per dtype. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv/kv_cache.h"
#include "osprey/kv_cache.h"
#include "osprey/model.h"
#include "osprey/tokenizer.h"

static void die(const char *what) {
    fprintf(stderr, "kv_accuracy: %s: %s\n", what, osp_last_error());
    exit(1);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kv_accuracy: cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (!buf || fread(buf, 1, (size_t)len, f) != (size_t)len) exit(1);
    buf[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* Runs ids [0, n) through m with a fresh cache of `dt` in chunks; logits [n, V] out. */
static void run(osp_model *m, osp_kv_dtype dt, float scale, const int32_t *ids, int32_t n, int32_t chunk, float *logits,
                int32_t V) {
    const int32_t BS = 16, nb = (n + BS - 1) / BS;
    osp_kv_cache *kv;
    const osp_model_config *c = osp_model_config_get(m);
    const int32_t per = dt == OSP_KV_DTYPE_FP8 ? c->n_head_kv : 1;
    float *sc = malloc(sizeof *sc * (size_t)(c->n_layer * per));
    for (int32_t i = 0; i < c->n_layer * per; i++) sc[i] = scale;
    if (osp_kv_cache_create_with_scales(m, nb, BS, dt, dt, scale > 0 ? sc : NULL, scale > 0 ? sc : NULL, &kv) != OSP_OK)
        die("kv cache");
    free(sc);
    int32_t *bt = malloc(sizeof *bt * (size_t)nb), *pos = malloc(sizeof *pos * (size_t)chunk),
            *li = malloc(sizeof *li * (size_t)chunk);
    for (int32_t i = 0; i < nb; i++) bt[i] = i;
    for (int32_t t0 = 0; t0 < n; t0 += chunk) {
        const int32_t k = n - t0 < chunk ? n - t0 : chunk;
        for (int32_t i = 0; i < k; i++) pos[i] = t0 + i, li[i] = i;
        int32_t qsl[2] = {0, k}, sl[1] = {t0 + k};
        osp_batch b = {.num_tokens = k, .token_ids = ids + t0, .positions = pos, .slot_mapping = pos, .num_seqs = 1,
                       .query_start_loc = qsl, .seq_lens = sl, .block_table = bt, .max_blocks_per_seq = nb,
                       .num_logits = k, .logits_indices = li};
        if (osp_model_forward(m, kv, &b, logits + (size_t)t0 * (size_t)V) != OSP_OK) die("forward");
    }
    free(bt), free(pos), free(li);
    osp_kv_cache_free(kv);
}

static double log_sum_exp(const float *x, int32_t V) {
    float mx = -INFINITY;
    for (int32_t i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int32_t i = 0; i < V; i++) s += exp((double)x[i] - mx);
    return mx + log(s);
}

static int32_t argmax(const float *x, int32_t V) {
    int32_t a = 0;
    for (int32_t i = 1; i < V; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

int main(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *dtypes = "f32,fp8,nvfp4";
    int32_t n = 512, chunk = 128, threads = 0;
    float fp8_scale = 0, nvfp4_scale = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) fprintf(stderr, "kv_accuracy: %s needs a value\n", f), exit(2);
        if (!strcmp(f, "-m")) model = v;
        else if (!strcmp(f, "-f")) text = v;
        else if (!strcmp(f, "-n")) n = atoi(v);
        else if (!strcmp(f, "--chunk")) chunk = atoi(v);
        else if (!strcmp(f, "-t")) threads = atoi(v);
        else if (!strcmp(f, "--fp8-scale")) fp8_scale = (float)atof(v);
        else if (!strcmp(f, "--nvfp4-scale")) nvfp4_scale = (float)atof(v);
        else if (!strcmp(f, "--dtypes")) dtypes = v;
        else fprintf(stderr, "kv_accuracy: unknown option %s\n", f), exit(2);
        i++;
    }
    if (!model || !text || n < 2 || chunk < 1) fprintf(stderr, "usage: kv_accuracy -m MODEL -f TEXT [-n N]\n"), exit(2);
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = threads;
    osp_model *m;
    if (osp_model_load(model, &mp, &m) != OSP_OK) die("model");
    osp_tokenizer *tok;
    if (osp_tokenizer_load(osp_model_gguf(m), &tok) != OSP_OK) die("tokenizer");
    size_t len, n_ids;
    char *txt = read_all(text, &len);
    int32_t *ids;
    if (osp_tokenizer_encode(tok, txt, len, true, false, &ids, &n_ids) != OSP_OK) die("tokenize");
    if ((size_t)n > n_ids) n = (int32_t)n_ids;
    const int32_t V = osp_model_config_get(m)->n_vocab;
    float *base = malloc(sizeof *base * (size_t)n * (size_t)V), *other = malloc(sizeof *other * (size_t)n * (size_t)V);
    if (!base || !other) die("memory");
    run(m, OSP_KV_DTYPE_F16, 0, ids, n, chunk, base, V);
    double nll = 0;
    for (int32_t t = 0; t + 1 < n; t++) nll += log_sum_exp(base + (size_t)t * V, V) - base[(size_t)t * V + ids[t + 1]];
    printf("# kv_accuracy: %s, %s, %d tokens teacher-forced in chunks of %d, baseline f16 KV\n", model, text, n, chunk);
    printf("| KV dtype | scales | top-1 agreement vs f16 | mean KL(f16 || dtype), nats | max |dlogit| | perplexity |\n");
    printf("|---|---|---|---|---|---|\n");
    printf("| f16 | - | 1 | 0 | 0 | %.4f |\n", exp(nll / (n - 1)));
    char list[128];
    snprintf(list, sizeof list, "%s", dtypes);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        osp_kv_dtype dt;
        if (osp_kv_dtype_parse(name, &dt) != OSP_OK) die("--dtypes");
        const float scale = dt == OSP_KV_DTYPE_FP8 ? fp8_scale : dt == OSP_KV_DTYPE_NVFP4 ? nvfp4_scale : 0;
        run(m, dt, scale, ids, n, chunk, other, V);
        int32_t agree = 0;
        double kl = 0, dmax = 0, nll_d = 0;
        for (int32_t t = 0; t < n; t++) {
            const float *a = base + (size_t)t * V, *b = other + (size_t)t * V;
            agree += argmax(a, V) == argmax(b, V);
            const double la = log_sum_exp(a, V), lb = log_sum_exp(b, V);
            double k = 0;
            for (int32_t i = 0; i < V; i++) {
                const double lpa = a[i] - la, lpb = b[i] - lb;
                k += exp(lpa) * (lpa - lpb);
                const double d = fabs((double)a[i] - b[i]);
                if (d > dmax) dmax = d;
            }
            kl += k;
            if (t + 1 < n) nll_d += lb - b[ids[t + 1]];
        }
        char sc[32] = "-";
        if (dt == OSP_KV_DTYPE_FP8 || dt == OSP_KV_DTYPE_NVFP4)
            snprintf(sc, sizeof sc, "%g%s", scale > 0 ? (double)scale
                                 : dt == OSP_KV_DTYPE_FP8 ? (double)OSP_KV_FP8_DEFAULT_SCALE
                                                          : (double)OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE,
                     scale > 0 ? "" : " (default)");
        printf("| %s | %s | %.4f (%d/%d) | %.6f | %.4f | %.4f |\n", name, sc, (double)agree / n, agree, n, kl / n, dmax,
               exp(nll_d / (n - 1)));
        fflush(stdout);
    }
    free(base), free(other), free(ids), free(txt);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return 0;
}
