/* osprey perplexity: perplexity of a model over a text, and KL divergence against a saved base run
 * (issue 13: what a quantized KV cache costs; issue 15 measures sparse attention with it).
 *
 * llama.cpp's llama-perplexity is the model, chunk for chunk: the text is tokenized once (with BOS
 * when the vocabulary adds one), cut into n = tokens / ctx chunks of ctx tokens, each chunk evaluated
 * from an empty cache with its first token replaced by BOS (when the vocabulary adds one), and the
 * logits at positions j = ctx / 2 .. ctx - 2 score the token at j + 1: the first half of every chunk
 * is context only. PPL = exp(mean NLL) over all scored tokens, with the standard error of the mean
 * NLL carried through exp.
 *
 * --save-kl-base FILE writes every scored position's top-k log-probabilities (src/format/kl_base.h);
 * --kl-base FILE compares this run with one: the mean KL(base || this) over the distributions
 * coarsened to the base's top k ids plus the rest (a lower bound of the full KL), its percentiles,
 * the share of positions whose argmax is the base's top id, and mean ln(PPL / PPL_base). The base
 * must come from the same model vocabulary, ctx and tokens (the file's hash of them is checked).
 *
 * Each chunk is fed in micro-batches of --ubatch tokens, writing the KV cache of the dtype
 * --kv-cache-dtype names, so later positions read the quantized K/V of earlier ones, as in serving. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey/kv_cache.h"
#include "osprey/tokenizer.h"
#include "osprey_internal.h"

#define PPL_BLOCK 16

static const char *k_help =
    "usage: osprey perplexity -m FILE -f TEXT [options]\n"
    "  perplexity over TEXT in chunks of --ctx tokens (llama-perplexity's chunking: the second half of\n"
    "  every chunk is scored), and KL divergence against a saved base run\n"
    "  -m, --model FILE        the GGUF model (required)\n"
    "  -f, --file TEXT         the text file (required)\n"
    "  --ctx N                 tokens a chunk, 4..65536 (default 512)\n"
    "  --chunks N              evaluate the first N chunks only (default: all)\n"
    "  --ubatch N              tokens a forward pass, 1..ctx (default: min(ctx, 512))\n"
    "  -t, --threads N         CPU threads, 1..1024 (default: all cores)\n"
    "  --device D              cpu | cuda | auto (default: cpu)\n"
    CLI_GPU_WEIGHTS_HELP
    CLI_CPU_ACT_HELP
    "  --exact                 fp32 activations in every matmul (the reference the quantized activations\n"
    "                          are measured against with --kl-base); the KV cache stays f16 unless given\n"
    CLI_KV_DTYPE_HELP
    "  --kv-draft-view R       read int8_hier pages as QuantSpec's draft does: upper 4-bit halves only,\n"
    "                          except each query's last R keys (R >= 0; default: off, both halves)\n"
    "  --draft-4bit-weights    compute with QuantSpec's draft weights: matrices above 5 bits a weight\n"
    "                          as a Q4_0 copy made at load (CPU; with --kv-draft-view: the whole self-draft)\n"
    CLI_KV_SCALES_HELP
    "  --save-kl-base FILE     write this run's top-k log-probabilities of every scored position\n"
    "  --kl-top K              entries a position in --save-kl-base, 1..64 (default 32)\n"
    "  --kl-base FILE          compare with a saved base: KL divergence, same top-1, ln(PPL ratio)\n";

typedef struct {
    double sum, sum2;
    int64_t n;
} ppl_acc;

static void acc_add(ppl_acc *a, double x) { a->sum += x, a->sum2 += x * x, a->n++; }
static double acc_mean(const ppl_acc *a) { return a->n ? a->sum / (double)a->n : 0.0; }
/* standard error of the mean */
static double acc_se(const ppl_acc *a) {
    if (a->n < 2) return 0.0;
    const double m = acc_mean(a), var = (a->sum2 - (double)a->n * m * m) / (double)(a->n - 1);
    return var > 0 ? sqrt(var / (double)a->n) : 0.0;
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

/* the k largest of l[0..V) into ids/val (value descending, lower id first on ties): a min-heap of k
 * whose root is the weakest kept entry */
static bool weaker(float va, int32_t ia, float vb, int32_t ib) { return va < vb || (va == vb && ia > ib); }
static void top_k(const float *l, int32_t V, int k, int32_t *ids, float *val) {
    int n = 0;
    for (int32_t i = 0; i < V; i++) {
        const float x = l[i];
        if (n == k && !weaker(val[0], ids[0], x, i)) continue;
        int c;
        if (n < k) { /* sift up from the end */
            c = n++;
            while (c > 0) {
                const int p = (c - 1) / 2;
                if (!weaker(x, i, val[p], ids[p])) break;
                val[c] = val[p], ids[c] = ids[p], c = p;
            }
        } else { /* replace the root, sift down */
            c = 0;
            for (;;) {
                const int a = 2 * c + 1, b = a + 1;
                int w = c;
                float wv = x;
                int32_t wi = i;
                if (a < n && weaker(val[a], ids[a], wv, wi)) w = a, wv = val[a], wi = ids[a];
                if (b < n && weaker(val[b], ids[b], wv, wi)) w = b;
                if (w == c) break;
                val[c] = val[w], ids[c] = ids[w], c = w;
            }
        }
        val[c] = x, ids[c] = i;
    }
    /* heap -> descending order: pop the weakest to the back */
    for (int end = n - 1; end > 0; end--) {
        const float tv = val[0];
        const int32_t ti = ids[0];
        val[0] = val[end], ids[0] = ids[end];
        int c = 0;
        for (;;) {
            const int a = 2 * c + 1, b = a + 1;
            int w = c;
            if (a < end && weaker(val[a], ids[a], val[w], ids[w])) w = a;
            if (b < end && weaker(val[b], ids[b], val[w], ids[w])) w = b;
            if (w == c) break;
            const float sv = val[c];
            const int32_t si = ids[c];
            val[c] = val[w], ids[c] = ids[w], val[w] = sv, ids[w] = si, c = w;
        }
        val[end] = tv, ids[end] = ti;
    }
}

#define CMD_NAME "perplexity"
#define MAX_TEXT_BYTES ((size_t)1 << 30) /* a corpus file: wikitext-103's test split is 1.3 MB */

static char *read_text(const char *path, size_t *n) {
    char *buf;
    const osp_status s = osp_read_file(path, MAX_TEXT_BYTES, "text", &buf, n);
    if (s != OSP_OK) cli_die(s, CMD_NAME);
    return buf;
}

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *text_path = NULL, *save_base = NULL, *kl_base_path = NULL, *scales_path = NULL;
    int ctx = 512, ubatch = 0, n_threads = 0, kl_top = 32, draft_recent = -1;
    long long max_chunks = 0;
    osp_device dev = OSP_DEVICE_CPU;
    bool gpu_quant = false; /* --gpu-weights quant */
    osp_cpu_activations cpu_act = OSP_CPU_ACT_TWO_LEVEL; /* --cpu-activations */
    bool exact = false; /* --exact */
    bool draft_weights = false; /* --draft-4bit-weights */
    cli_kv_types kvt = {0}; /* --kv-cache-dtype, -ctk, -ctv */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) cli_help(k_help);
        bool has_v = v != NULL;
        if (!strcmp(f, "-m") || !strcmp(f, "--model")) model = v, i++;
        else if (!strcmp(f, "-f") || !strcmp(f, "--file")) text_path = v, i++;
        else if (!strcmp(f, "--ctx")) ctx = (int)cli_int(f, v, 4, 65536), i++;
        else if (!strcmp(f, "--chunks")) max_chunks = cli_int(f, v, 1, 1 << 30), i++;
        else if (!strcmp(f, "--ubatch")) ubatch = (int)cli_int(f, v, 1, 65536), i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "--device")) dev = cli_device(f, v), i++;
        else if (!strcmp(f, "--gpu-weights")) gpu_quant = cli_gpu_weights(f, v), i++;
        else if (!strcmp(f, "--cpu-activations")) cpu_act = cli_cpu_activations(f, v), i++;
        else if (!strcmp(f, "--exact")) exact = true, has_v = true;
        else if (cli_kv_types_arg(&kvt, f, v)) i++;
        else if (!strcmp(f, "--kv-scales")) scales_path = v, i++;
        else if (!strcmp(f, "--kv-draft-view")) draft_recent = (int)cli_int(f, v, 0, 1 << 30), i++;
        else if (!strcmp(f, "--draft-4bit-weights")) draft_weights = true, has_v = true;
        else if (!strcmp(f, "--save-kl-base")) save_base = v, i++;
        else if (!strcmp(f, "--kl-top")) kl_top = (int)cli_int(f, v, 1, OSP_KLB_MAX_TOP), i++;
        else if (!strcmp(f, "--kl-base")) kl_base_path = v, i++;
        else cli_die(OSP_OK, "perplexity: unknown option '%s' (osprey perplexity --help)", f);
        if (!has_v) cli_die(OSP_OK, "%s needs a value", f);
    }
    cli_check_exact_activations(exact, cpu_act);
    if (!model || !text_path) cli_die(OSP_OK, "perplexity needs -m FILE and -f TEXT (osprey perplexity --help)");
    if (ubatch == 0) ubatch = ctx < 512 ? ctx : 512;
    if (ubatch > ctx) cli_die(OSP_OK, "--ubatch %d is larger than --ctx %d", ubatch, ctx);

    /* the base and the scales first: a bad file fails before the model loads */
    osp_kv_scales scales;
    cli_kv_scales_load(scales_path, &scales);
    osp_kl_base base = {0};
    if (kl_base_path) {
        const osp_status s = osp_kl_base_load(kl_base_path, &base);
        if (s != OSP_OK) cli_die(s, "--kl-base");
    }

    osp_model_params mp = osp_model_default_params();
    mp.n_threads = n_threads;
    mp.device = dev;
    mp.gpu_quant_weights = gpu_quant;
    mp.cpu_activations = cpu_act;
    mp.exact = exact;
    mp.draft_4bit_weights = draft_weights;
    mp.progress = cli_load_progress;
    osp_model *m;
    osp_status s = osp_model_load(model, &mp, &m);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    const int32_t V = osp_model_config_get(m)->n_vocab;
    osp_tokenizer *tok;
    s = osp_tokenizer_load(osp_model_gguf(m), &tok);
    if (s != OSP_OK) cli_die(s, "the model has no usable tokenizer");
    size_t text_len = 0;
    char *text = read_text(text_path, &text_len);
    int32_t *ids = NULL;
    size_t n_ids = 0;
    s = osp_tokenizer_encode(tok, text, text_len, true, false, &ids, &n_ids);
    if (s != OSP_OK) cli_die(s, "cannot tokenize %s", text_path);
    free(text);
    const bool add_bos = osp_tokenizer_add_bos(tok) && osp_tokenizer_bos(tok) >= 0;
    int64_t n_chunks = (int64_t)n_ids / ctx;
    if ((int64_t)n_ids < 2 * (int64_t)ctx) /* llama-perplexity's minimum */
        cli_die(OSP_OK, "%s has %zu tokens: perplexity needs at least 2 x --ctx (%d)", text_path, n_ids, 2 * ctx);
    if (max_chunks > 0 && max_chunks < n_chunks) n_chunks = max_chunks;
    const int first = ctx / 2, n_scored = ctx - 1 - first;
    uint64_t hash = OSP_FNV64_OFFSET;
    for (int64_t c = 0; c < n_chunks; c++) hash = osp_fnv1a64_ids(hash, ids + c * ctx, (size_t)ctx);
    if (kl_base_path) {
        if (base.n_vocab != (uint32_t)V || base.ctx != (uint32_t)ctx || base.n_chunks != (uint64_t)n_chunks ||
            base.n_scored != (uint32_t)n_scored || base.tokens_hash != hash)
            cli_die(OSP_OK,
                    "--kl-base %s was made from another run: vocabulary %u, ctx %u, %u chunks, tokens %016llx; "
                    "this run: %d, %d, %lld, %016llx",
                    kl_base_path, base.n_vocab, base.ctx, base.n_chunks, (unsigned long long)base.tokens_hash, (int)V,
                    ctx, (long long)n_chunks, (unsigned long long)hash);
    }

    const int32_t nblk = (ctx + PPL_BLOCK - 1) / PPL_BLOCK;
    osp_kv_dtype kvd, kvd_v;
    cli_kv_types_resolve(&kvt, OSP_KV_DTYPE_F16, &kvd, &kvd_v);
    cli_kv_types_check_exact(exact, kvd, kvd_v);
    char kv_name[64];
    osp_kv_cache *kv = cli_kv_cache_create(m, nblk, PPL_BLOCK, kvd, kvd_v, &scales, scales_path);
    if (draft_recent >= 0) { /* QuantSpec's draft view of int8_hier pages (kv/kv_cache.h) */
        if (dev != OSP_DEVICE_CPU) /* the GPU's window is a sequence's last R keys, not each query's */
            cli_die(OSP_OK, "--kv-draft-view needs --device cpu (the CUDA kernel reads a chunk's last R keys in full, "
                            "not each query's own)");
        if ((s = osp_kv_cache_set_hier_view(kv, draft_recent)) != OSP_OK)
            cli_die(s, "--kv-draft-view (give --kv-cache-dtype int8_hier, or -ctk / -ctv int8_hier)");
    }
    char draft[128] = "";
    if (draft_recent >= 0)
        snprintf(draft, sizeof draft, ", QuantSpec draft view (upper halves but the last %d keys)%s", draft_recent,
                 draft_weights ? " and 4-bit weights" : "");
    else if (draft_weights)
        snprintf(draft, sizeof draft, ", QuantSpec draft's 4-bit weights");
    fprintf(stderr, "perplexity: %s: %zu tokens, %lld chunks of %d (%d scored each), kv %s%s%s%s, device %s, %d threads\n",
            text_path, n_ids, (long long)n_chunks, ctx, n_scored, cli_kv_types_name(kvd, kvd_v, kv_name, sizeof kv_name),
            scales_path ? " scales " : "", scales_path ? scales_path : "", draft, osp_device_name(dev), osp_model_n_threads(m));
    osp_kv_scales_free(&scales);

    const size_t n_pos = (size_t)n_chunks * (size_t)n_scored;
    osp_kl_base out = {.n_vocab = (uint32_t)V, .ctx = (uint32_t)ctx, .n_chunks = (uint32_t)n_chunks,
                       .n_scored = (uint32_t)n_scored, .k = (uint32_t)kl_top, .tokens_hash = hash};
    if (save_base) {
        if (!osp_kl_base_file_bytes(out.n_chunks, out.n_scored, out.k)) cli_die(OSP_OK, "--save-kl-base: too many positions");
        out.ids = malloc(n_pos * (size_t)kl_top * sizeof *out.ids);
        out.logprob = malloc(n_pos * (size_t)kl_top * sizeof *out.logprob);
        out.logprob_rest = malloc(n_pos * sizeof *out.logprob_rest);
        out.nll = malloc(n_pos * sizeof *out.nll);
        if (!out.ids || !out.logprob || !out.logprob_rest || !out.nll) cli_die(OSP_ERR_NOMEM, "--save-kl-base");
    }
    double *kls = kl_base_path ? malloc(n_pos * sizeof *kls) : NULL;
    if (kl_base_path && !kls) cli_die(OSP_ERR_NOMEM, "KL values");

    int32_t *bt = malloc((size_t)nblk * sizeof *bt), *pos = malloc((size_t)ubatch * sizeof *pos),
            *slot = malloc((size_t)ubatch * sizeof *slot), *li = malloc((size_t)ubatch * sizeof *li),
            *in = malloc((size_t)ctx * sizeof *in);
    float *logits = malloc((size_t)ubatch * (size_t)V * sizeof *logits);
    int32_t top_ids[OSP_KLB_MAX_TOP];
    float top_val[OSP_KLB_MAX_TOP];
    if (!bt || !pos || !slot || !li || !in || !logits) cli_die(OSP_ERR_NOMEM, "perplexity buffers");
    for (int32_t b = 0; b < nblk; b++) bt[b] = b;

    ppl_acc nll = {0}, kl = {0}, dnll = {0};
    int64_t same_top = 0;
    size_t pi = 0; /* scored position index */
    const double t0 = cli_now_s();
    for (int64_t c = 0; c < n_chunks; c++) {
        memcpy(in, ids + c * ctx, (size_t)ctx * sizeof *in);
        if (add_bos) in[0] = osp_tokenizer_bos(tok);
        for (int u0 = 0; u0 < ctx; u0 += ubatch) {
            const int nb = ctx - u0 < ubatch ? ctx - u0 : ubatch;
            int nl = 0;
            for (int j = 0; j < nb; j++) {
                const int p = u0 + j;
                pos[j] = p, slot[j] = bt[p / PPL_BLOCK] * PPL_BLOCK + p % PPL_BLOCK;
                if (p >= first && p <= ctx - 2) li[nl++] = j;
            }
            const int32_t qsl[2] = {0, nb}, sl[1] = {u0 + nb};
            const osp_batch b = {.num_tokens = nb, .token_ids = in + u0, .positions = pos, .slot_mapping = slot,
                                 .num_seqs = 1, .query_start_loc = qsl, .seq_lens = sl, .block_table = bt,
                                 .max_blocks_per_seq = nblk, .num_logits = nl, .logits_indices = li};
            s = osp_model_forward(m, kv, &b, logits);
            if (s != OSP_OK) cli_die(s, "forward pass failed");
            for (int r = 0; r < nl; r++, pi++) {
                const float *l = logits + (size_t)r * V;
                const int p = u0 + li[r];
                const int32_t target = ids[c * ctx + p + 1];
                float mx = -INFINITY;
                int32_t am = 0;
                for (int32_t v = 0; v < V; v++)
                    if (l[v] > mx) mx = l[v], am = v;
                if (!isfinite(mx)) cli_die(OSP_OK, "chunk %lld position %d: logits are not finite", (long long)c + 1, p);
                double S = 0;
                for (int32_t v = 0; v < V; v++) S += exp((double)l[v] - mx);
                const double lse = mx + log(S), x = lse - (double)l[target];
                acc_add(&nll, x);
                if (save_base) {
                    top_k(l, V, kl_top, top_ids, top_val);
                    double T = 0;
                    for (int j = 0; j < kl_top; j++) {
                        out.ids[pi * kl_top + j] = top_ids[j];
                        out.logprob[pi * kl_top + j] = (float)((double)top_val[j] - lse);
                        T += exp((double)top_val[j] - mx);
                    }
                    /* distinct logits can round to one float log-probability: ties lower id first */
                    osp_kl_base_order_ties(out.ids + pi * kl_top, out.logprob + pi * kl_top, (uint32_t)kl_top);
                    out.logprob_rest[pi] = S - T > 0 ? (float)log((S - T) / S) : -INFINITY;
                    out.nll[pi] = (float)x;
                }
                if (kl_base_path) {
                    const int32_t *bid = base.ids + pi * base.k;
                    const float *blp = base.logprob + pi * base.k;
                    double k_sum = 0, Tq = 0;
                    for (uint32_t j = 0; j < base.k; j++) {
                        const double pj = exp((double)blp[j]), lq = (double)l[bid[j]] - lse;
                        k_sum += pj * ((double)blp[j] - lq);
                        Tq += exp((double)l[bid[j]] - mx);
                    }
                    if (base.logprob_rest[pi] > -INFINITY) {
                        const double pr = exp((double)base.logprob_rest[pi]);
                        const double qr = S - Tq > 0 ? (S - Tq) / S : DBL_MIN;
                        k_sum += pr * ((double)base.logprob_rest[pi] - log(qr));
                    }
                    if (k_sum < 0) k_sum = 0; /* rounding of an exact match */
                    kls[kl.n] = k_sum;
                    acc_add(&kl, k_sum);
                    acc_add(&dnll, x - (double)base.nll[pi]);
                    same_top += am == bid[0];
                }
            }
        }
        printf("[%lld]%.4f,", (long long)c + 1, exp(acc_mean(&nll)));
        fflush(stdout);
    }
    printf("\n");
    const double ppl = exp(acc_mean(&nll));
    printf("Final estimate: PPL = %.4f +/- %.5f (%lld scored tokens, %.1f s)\n", ppl, ppl * acc_se(&nll),
           (long long)nll.n, cli_now_s() - t0);
    if (kl_base_path) {
        qsort(kls, (size_t)kl.n, sizeof *kls, cmp_double);
        const double p = (double)same_top / (double)kl.n;
        printf("KL divergence against %s (its top %u ids + the rest):\n", kl_base_path, base.k);
        printf("Mean ln(PPL/PPL_base): %.6f +/- %.6f\n", acc_mean(&dnll), acc_se(&dnll));
        printf("Mean KLD: %.6f +/- %.6f\n", acc_mean(&kl), acc_se(&kl));
        printf("Maximum KLD: %.6f, 99.9%%: %.6f, 99%%: %.6f, median: %.6f\n", kls[kl.n - 1],
               kls[(size_t)((double)(kl.n - 1) * 0.999)], kls[(size_t)((double)(kl.n - 1) * 0.99)], kls[(kl.n - 1) / 2]);
        printf("Same top: %.3f +/- %.3f %%\n", 100.0 * p, 100.0 * sqrt(p * (1 - p) / (double)kl.n));
    }
    if (save_base) {
        s = osp_kl_base_save(save_base, &out);
        if (s != OSP_OK) cli_die(s, "--save-kl-base");
        fprintf(stderr, "perplexity: KL base (top %d) written to %s\n", kl_top, save_base);
    }
    free(kls), free(bt), free(pos), free(slot), free(li), free(in), free(logits), free(ids);
    osp_kl_base_free(&out);
    osp_kl_base_free(&base);
    osp_kv_cache_free(kv);
    osp_tokenizer_free(tok);
    osp_model_free(m);
    return 0;
}
