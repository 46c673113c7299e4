/* sparse_accuracy: what --sparse-attention topk costs in accuracy, by teacher forcing (issue 15).
 *
 * The text's first N tokens run through the model in chunks (every position's logits kept), once
 * densely and once per budget with the sparse-attention hook (src/sparse/engine_hook.h: Quest pages per
 * query token and KV head), on the CPU with f16 KV pages. Each budget is compared with dense position by
 * position: top-1 agreement, mean KL(dense || sparse) in nats, perplexity of the text's next token; the
 * same over the "tail" alone (positions whose context exceeds the budget, the only ones that differ),
 * and the share of KV tiles read against dense. Every chunk's queries select among the pages the
 * earlier chunks wrote, as decode would.
 *
 * usage: sparse_accuracy -m MODEL -f TEXT [-n TOKENS (1024)] [--chunk C (128)] [-t THREADS]
 *                        [--budgets "topk:32;topk:16,recent:2;..."] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_exec.h"
#include "osprey/kv_cache.h"
#include "osprey/model.h"
#include "osprey/sparse.h"
#include "osprey/tokenizer.h"
#include "sparse/engine_hook.h"

static void die(const char *what) {
    fprintf(stderr, "sparse_accuracy: %s: %s\n", what, osp_last_error());
    exit(1);
}

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fprintf(stderr, "sparse_accuracy: cannot open %s\n", path), exit(1);
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

/* ids [0, n) through m in chunks with a fresh f16 cache; cfg NULL: dense. logits [n, V]; *st the hook's
 * counters. */
static void run(osp_model *m, const osp_sparse_config *cfg, const int32_t *ids, int32_t n, int32_t chunk, float *logits,
                int32_t V, osp_sparse_runtime_stats *st) {
    const int32_t BS = 16, nb = (n + BS - 1) / BS;
    osp_kv_cache *kv;
    if (osp_kv_cache_create(m, nb, BS, OSP_KV_DTYPE_F16, &kv) != OSP_OK) die("kv cache");
    osp_sparse_runtime *rt = NULL;
    if (cfg) {
        if (osp_sparse_runtime_create(cfg, kv, &rt) != OSP_OK) die("sparse runtime");
        osp_model_set_attn_hook(m, osp_sparse_runtime_hook(rt));
    }
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
    if (rt) {
        *st = osp_sparse_runtime_get_stats(rt);
        osp_model_set_attn_hook(m, NULL);
        osp_sparse_runtime_free(rt);
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
    const char *model = NULL, *text = NULL, *budgets = "topk:64;topk:32;topk:16;topk:8";
    int32_t n = 1024, chunk = 128, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) fprintf(stderr, "sparse_accuracy: %s needs a value\n", f), exit(2);
        if (!strcmp(f, "-m")) model = v;
        else if (!strcmp(f, "-f")) text = v;
        else if (!strcmp(f, "-n")) n = atoi(v);
        else if (!strcmp(f, "--chunk")) chunk = atoi(v);
        else if (!strcmp(f, "-t")) threads = atoi(v);
        else if (!strcmp(f, "--budgets")) budgets = v;
        else fprintf(stderr, "sparse_accuracy: unknown option %s\n", f), exit(2);
        i++;
    }
    if (!model || !text || n < 2 || chunk < 1) fprintf(stderr, "usage: sparse_accuracy -m MODEL -f TEXT [-n N]\n"), exit(2);
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
    osp_sparse_runtime_stats st = {0};
    run(m, NULL, ids, n, chunk, base, V, &st);
    double nll = 0;
    for (int32_t t = 0; t + 1 < n; t++) nll += log_sum_exp(base + (size_t)t * V, V) - base[(size_t)t * V + ids[t + 1]];
    printf("# sparse_accuracy: %s, %s, %d tokens teacher-forced in chunks of %d, f16 KV, pages of 16; baseline dense\n",
           model, text, n, chunk);
    printf("| budget | tiles read vs dense | top-1 agreement | mean KL(dense || sparse), nats | perplexity | "
           "tail positions | tail top-1 | tail KL | tail ppl (dense -> sparse) |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    printf("| dense | 1 | 1 | 0 | %.4f | - | - | - | - |\n", exp(nll / (n - 1)));
    fflush(stdout);
    char list[256];
    snprintf(list, sizeof list, "%s", budgets);
    for (char *save = NULL, *name = strtok_r(list, ";", &save); name; name = strtok_r(NULL, ";", &save)) {
        osp_sparse_config cfg;
        if (osp_sparse_config_parse(name, &cfg) != OSP_OK || cfg.method == OSP_SPARSE_NONE) die("--budgets");
        run(m, &cfg, ids, n, chunk, other, V, &st);
        int32_t agree = 0, tail = 0, tail_agree = 0;
        double kl = 0, nll_s = 0, tail_kl = 0, tail_nll_d = 0, tail_nll_s = 0;
        for (int32_t t = 0; t < n; t++) {
            const float *a = base + (size_t)t * V, *b = other + (size_t)t * V;
            const bool ag = argmax(a, V) == argmax(b, V);
            const double la = log_sum_exp(a, V), lb = log_sum_exp(b, V);
            double k = 0;
            for (int32_t i = 0; i < V; i++) {
                const double lpa = a[i] - la, lpb = b[i] - lb;
                k += exp(lpa) * (lpa - lpb);
            }
            agree += ag, kl += k;
            const bool in_tail = t / 16 + 1 > cfg.topk_pages;
            if (in_tail) tail++, tail_agree += ag, tail_kl += k;
            if (t + 1 < n) {
                nll_s += lb - b[ids[t + 1]];
                if (in_tail) tail_nll_d += la - a[ids[t + 1]], tail_nll_s += lb - b[ids[t + 1]];
            }
        }
        const int32_t tn = tail - (n > 0 && (n - 1) / 16 + 1 > cfg.topk_pages); /* the last position has no next token */
        printf("| %s | %.3f (%lld/%lld) | %.4f | %.6f | %.4f | %d | %.4f | %.6f | %.4f -> %.4f (%+.1f%%) |\n", name,
               st.tiles_dense ? (double)st.tiles_read / (double)st.tiles_dense : 1.0, (long long)st.tiles_read,
               (long long)st.tiles_dense, (double)agree / n, kl / n, exp(nll_s / (n - 1)), tail,
               tail ? (double)tail_agree / tail : 1.0, tail ? tail_kl / tail : 0.0, tn > 0 ? exp(tail_nll_d / tn) : 0.0,
               tn > 0 ? exp(tail_nll_s / tn) : 0.0, tn > 0 ? 100.0 * (exp((tail_nll_s - tail_nll_d) / tn) - 1.0) : 0.0);
        fflush(stdout);
    }
    free(base), free(other), free(ids), free(txt);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return 0;
}
