/* osprey make-random-model: a GGUF model with random weights in a real architecture's shapes.
 *
 * Tests use tiny ones (committed under tests/models/, made by scripts/make-test-models.sh); GPU
 * benchmarks use big ones (Llama-3.1-8B shapes) written on the GPU machine, never carried. The
 * file is a deterministic function of (preset, --dtype, --seed, --vocab-size, the --vocab-from file):
 * weight i of tensor T is drawn from a counter-based hash of (seed, name of T, i), so the thread
 * count and the chunking of the writer change nothing, and the bytes are the same on every machine.
 *
 * Weights: "normal-ish" values with std 0.02 (the sum of four uniform 16-bit draws, Irwin-Hall,
 * bounded at +-3.5 sigma), norm weights 1 + 0.01 * the same. Matrices and the token embedding are
 * stored in --dtype (quantized by core/quantize.c, ggml's reference quantizers); norms are F32.
 * --random-blocks (speed benchmarks): quantized matrices are instead random block bytes with fixed
 * small scales (every quant drawn uniformly from the same hash), seconds where the K-quant reference
 * quantizer takes minutes for an 8B model; the values are no longer the normal draws above.
 *
 * Vocabulary: --vocab-from FILE.gguf copies every tokenizer.* key of FILE (its token count must be
 * the model's vocabulary size). Without it the file carries a small self-contained byte-level BPE
 * vocabulary (tokenizer.ggml.model gpt2, pre smollm) of exactly the model's vocabulary size:
 *   0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|> (control; the SmolLM2 ids: bos 1, eos 2),
 *   3..258 the 256 byte tokens (GPT-2's byte-to-unicode mapping, byte order),
 *   259.. merged tokens: the strings over {a..z} and the same preceded by 'Ġ' (a space), shortest
 *         first ("Ġa".."Ġz", "aa".."zz", "Ġaa", ...), each the merge "<prefix> <last letter>",
 *         merges ranked in token order.
 * So any text tokenizes (bytes at worst), every sampled id detokenizes, and lower-case words merge.
 *
 * Architectures (what src/model/llama.c runs): llama (optionally Llama 3.x rope scaling, stored as
 * llama.cpp's converter stores it: a rope_freqs.weight tensor of per-frequency divisors computed from
 * rope_scaling {factor, low_freq_factor, high_freq_factor, original context}), qwen2 (q/k/v biases,
 * drawn like weights) and qwen3 (per-head q/k norm weights, drawn like norms; head_dim may differ
 * from hidden / heads and is then written as attention.key_length / value_length). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "osprey_internal.h"
#include "osprey/gguf.h"

typedef osp_model_preset preset;

static const struct {
    const char *name;
    uint32_t type;
    uint32_t file_type; /* llama.cpp's LLAMA_FTYPE_ALL_F32 / MOSTLY_* */
} k_dtypes[] = {
    {"f32", OSP_DTYPE_F32, 0},    {"f16", OSP_DTYPE_F16, 1},   {"bf16", OSP_DTYPE_BF16, 32},
    {"q8_0", OSP_DTYPE_Q8_0, 7},  {"q4_0", OSP_DTYPE_Q4_0, 2}, {"q4_1", OSP_DTYPE_Q4_1, 3},
    {"q4_k", OSP_DTYPE_Q4_K, 14}, {"q6_k", OSP_DTYPE_Q6_K, 18}, {"q4_k_m", OSP_DTYPE_Q4_K, 15},
};

/* q4_k_m: llama.cpp's Q4_K_M mix without an importance matrix, as its quantizer picks types for a
 * llama-family model: Q6_K for output.weight and for attn_v and ffn_down in the layers where
 * use_more_bits(l, n) holds (the first and last eighth, and every third layer between), Q4_K for every
 * other matrix. */
static bool use_more_bits(int l, int n) { return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2; }

/* ---- random values ------------------------------------------------------------------------------ */

#define name_key osp_rw_name_key
#define randn osp_rw_randn
#define IRWIN_HALL_STD OSP_RW_IRWIN_HALL_STD
#define WEIGHT_STD OSP_RW_WEIGHT_STD
#define NORM_NOISE_STD OSP_RW_NORM_NOISE_STD

typedef struct fill_ctx {
    uint64_t key;
    uint32_t type;
    int64_t ne0;
    bool norm; /* 1 + noise instead of noise */
} fill_ctx;

static bool g_random_blocks; /* --random-blocks */

/* --random-blocks: a row of a block-quantized type as hash bytes, then each block's f16 scale fields
 * (ggml-common.h offsets) set to small constants (d 2^-12, a Q4_1 / Q4_K min of 2^-12; Q6_K d 2^-14):
 * finite values of the order of the normal draws'. */
static void fill_blocks(const fill_ctx *c, int64_t row, uint8_t *dst) {
    const size_t rb = osp_dtype_row_size(c->type, c->ne0), bb = osp_dtype_type_size(c->type);
    const int64_t nb = c->ne0 / osp_dtype_block_size(c->type);
    for (size_t i = 0; i < rb; i += 8) {
        uint64_t z = c->key + ((uint64_t)row * (uint64_t)rb + i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        memcpy(dst + i, &z, rb - i < 8 ? rb - i : 8);
    }
    const uint16_t d12 = 0x0C00, d14 = 0x0400; /* f16 2^-12, 2^-14 */
    int d_off = 0, m_off = -1;
    uint16_t d = d12;
    if (c->type == OSP_DTYPE_Q4_1 || c->type == OSP_DTYPE_Q4_K) m_off = 2;
    if (c->type == OSP_DTYPE_Q6_K) d_off = 208, d = d14;
    for (int64_t b = 0; b < nb; b++) {
        memcpy(dst + (size_t)b * bb + (size_t)d_off, &d, 2);
        if (m_off >= 0) memcpy(dst + (size_t)b * bb + (size_t)m_off, &d12, 2);
    }
}

static osp_threadpool *g_pool; /* the writer's threads (-t), the library's thread pool */

typedef struct fill_job {
    const fill_ctx *c;
    int64_t row0, n_rows;
    void *dst;
    _Atomic int failed;
} fill_job;

/* This thread's share of the chunk's rows: drawn, then quantized to the tensor's type. */
static void fill_task(void *arg, int ith, int nth) {
    fill_job *j = arg;
    const fill_ctx *c = j->c;
    const size_t row_bytes = osp_dtype_row_size(c->type, c->ne0);
    const float scale = (float)((c->norm ? NORM_NOISE_STD : WEIGHT_STD) / IRWIN_HALL_STD);
    long long r0, r1;
    osp_split(j->n_rows, ith, nth, &r0, &r1);
    if (r0 == r1) return;
    float *row = malloc((size_t)c->ne0 * sizeof *row);
    if (!row) {
        j->failed = 1;
        return;
    }
    const bool blocks = g_random_blocks && !c->norm && osp_dtype_block_size(c->type) > 1;
    for (long long r = r0; r < r1; r++) {
        if (blocks) {
            fill_blocks(c, j->row0 + r, (uint8_t *)j->dst + (size_t)r * row_bytes);
            continue;
        }
        const uint64_t base = (uint64_t)(j->row0 + r) * (uint64_t)c->ne0;
        for (int64_t i = 0; i < c->ne0; i++) row[i] = (c->norm ? 1.0f : 0.0f) + randn(c->key, base + (uint64_t)i, scale);
        if (osp_quantize_row(c->type, row, (uint8_t *)j->dst + (size_t)r * row_bytes, c->ne0) != OSP_OK) j->failed = 1;
    }
    free(row);
}

static osp_status fill_random(void *user, int64_t row0, int64_t n_rows, void *dst) {
    fill_job j = {.c = user, .row0 = row0, .n_rows = n_rows, .dst = dst};
    osp_threadpool_run(g_pool, fill_task, &j);
    return j.failed ? OSP_ERR_NOMEM : OSP_OK; /* quantize cannot fail on a checked type and shape */
}

/* rope_freqs.weight as llama.cpp's converter computes it for rope_type llama3: the divisor of inverse
 * frequency i = theta^(-2i / head_dim): 1 for wavelengths below orig / high, factor above orig / low,
 * and in between 1 / ((1 - smooth) / factor + smooth), smooth = (orig / wavelength - low) / (high - low). */
typedef struct freqs_ctx {
    osp_rope_llama3 r;
    float theta;
    int dim;
} freqs_ctx;

static osp_status fill_rope_freqs(void *user, int64_t row0, int64_t n_rows, void *dst) {
    const freqs_ctx *c = user;
    (void)row0, (void)n_rows;
    osp_rope_llama3_factors(&c->r, c->theta, c->dim, dst);
    return OSP_OK;
}

/* ---- vocabulary ---------------------------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the rest to U+0100 + k. */
static unsigned byte_to_cp(unsigned b) {
    if ((b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff)) return b;
    unsigned k = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || (x >= 0xae && x <= 0xff))) k++;
    return 0x100 + k;
}

static int put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    o[0] = (char)(0xc0 | (cp >> 6));
    o[1] = (char)(0x80 | (cp & 0x3f));
    return 2; /* byte_to_cp never exceeds U+0143 */
}

/* The generated vocabulary (see the top of the file): n tokens, n - 259 merges. */
static void add_byte_vocab(osp_gguf_writer *w, int n) {
    char **tok = calloc((size_t)n, sizeof *tok), **merges = calloc((size_t)n, sizeof *merges);
    int32_t *types = calloc((size_t)n, sizeof *types);
    if (!tok || !merges || !types) cli_die(OSP_OK, "out of memory");
    const char *specials[3] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 3; i++) {
        tok[i] = strdup(specials[i]);
        types[i] = 3; /* CONTROL */
    }
    for (unsigned b = 0; b < 256; b++) {
        char s[4];
        s[put_utf8(s, byte_to_cp(b))] = '\0';
        tok[3 + b] = strdup(s);
        types[3 + b] = 1; /* NORMAL, as byte tokens are in GPT-2-style GGUF vocabularies */
    }
    /* Breadth-first: level 1 is {Ġ, a..z} (existing byte tokens); each level appends a..z to every
     * string of the level before, in order. */
    int n_merges = 0, next = 259, lvl_begin = 0, lvl_end = 0;
    const char **level = malloc(sizeof *level * (size_t)(n + 27));
    if (!level) cli_die(OSP_OK, "out of memory");
    level[lvl_end++] = tok[3 + ' '];
    for (char c = 'a'; c <= 'z'; c++) level[lvl_end++] = tok[3 + (unsigned char)c];
    int lvl_fill = lvl_end;
    while (next < n) {
        for (int i = lvl_begin; i < lvl_end && next < n; i++) {
            for (char c = 'a'; c <= 'z' && next < n; c++) {
                const size_t len = strlen(level[i]);
                char *s = malloc(len + 2), *m = malloc(len + 3);
                if (!s || !m) cli_die(OSP_OK, "out of memory");
                memcpy(s, level[i], len);
                s[len] = c, s[len + 1] = '\0';
                memcpy(m, level[i], len);
                m[len] = ' ', m[len + 1] = c, m[len + 2] = '\0';
                tok[next] = s;
                types[next] = 1;
                merges[n_merges++] = m;
                level[lvl_fill++] = tok[next++];
            }
        }
        lvl_begin = lvl_end;
        lvl_end = lvl_fill;
    }
    osp_status s;
    if ((s = osp_gguf_writer_add_str(w, "tokenizer.ggml.model", "gpt2")) != OSP_OK ||
        (s = osp_gguf_writer_add_str(w, "tokenizer.ggml.pre", "smollm")) != OSP_OK ||
        (s = osp_gguf_writer_add_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n)) != OSP_OK ||
        (s = osp_gguf_writer_add_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)n)) != OSP_OK ||
        (s = osp_gguf_writer_add_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, (uint64_t)n_merges)) != OSP_OK ||
        (s = osp_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1)) != OSP_OK ||
        (s = osp_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2)) != OSP_OK ||
        (s = osp_gguf_writer_add_u32(w, "tokenizer.ggml.unknown_token_id", 0)) != OSP_OK ||
        (s = osp_gguf_writer_add_u32(w, "tokenizer.ggml.padding_token_id", 2)) != OSP_OK ||
        (s = osp_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false)) != OSP_OK ||
        (s = osp_gguf_writer_add_str(w, "tokenizer.chat_template",
                                     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                                     "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                                     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")) != OSP_OK)
        cli_die(s, "cannot add the vocabulary");
    for (int i = 0; i < n; i++) free(tok[i]);
    for (int i = 0; i < n_merges; i++) free(merges[i]);
    free(tok);
    free(merges);
    free(types);
    free(level);
}

/* Copies every tokenizer.* key of `path`; its token count must be n_vocab. */
static void add_vocab_from(osp_gguf_writer *w, const char *path, int n_vocab) {
    osp_gguf *g;
    osp_status s = osp_gguf_open(path, &g);
    if (s != OSP_OK) cli_die(s, "--vocab-from");
    const osp_gguf_value *tokens;
    s = osp_gguf_get_arr(g, "tokenizer.ggml.tokens", OSP_GGUF_TYPE_STRING, &tokens);
    if (s != OSP_OK) cli_die(s, "--vocab-from %s", path);
    if (tokens->v.arr.n != (uint64_t)n_vocab)
        cli_die(OSP_OK, "--vocab-from %s: %llu tokens, but the model's vocabulary has %d (see --vocab-size)", path,
                (unsigned long long)tokens->v.arr.n, n_vocab);
    for (uint64_t i = 0; i < osp_gguf_n_kv(g); i++) {
        const osp_gguf_kv *kv = osp_gguf_kv_at(g, i);
        if (strncmp(kv->key, "tokenizer.", 10) != 0) continue;
        if ((s = osp_gguf_writer_add_value(w, kv->key, &kv->value)) != OSP_OK) cli_die(s, "--vocab-from %s", path);
    }
    osp_gguf_close(g);
}

/* ---- the command --------------------------------------------------------------------------------- */

static void usage_presets(FILE *f) {
    fputs("presets:\n", f);
    for (size_t i = 0; i < osp_model_preset_count(); i++) {
        const preset *p = osp_model_preset_at(i);
        fprintf(f, "  %-13s %s %s: hidden %d, %d layers, %d heads (%d kv), ffn %d, vocab %d\n", p->name,
                p->arch ? p->arch : "llama", p->desc, p->n_embd, p->n_layer, p->n_head, p->n_head_kv, p->n_ff,
                p->n_vocab);
    }
}

static const char k_help[] =
    "usage: osprey make-random-model --preset NAME -o FILE [options]\n"
    "  write a GGUF model with random weights in a real architecture's shapes\n"
    "\n"
    "  --preset NAME           the architecture and shapes (required; --list-presets names them)\n"
    "  -o, --output FILE       the GGUF file to write (required)\n"
    "  --dtype D               f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q4_k | q6_k | q4_k_m (llama.cpp's mix)\n"
    "                          for the weight matrices (default: f32; the K types need multiples of 256)\n"
    "  --seed S                weight seed (default: 0)\n"
    "  --vocab-from FILE       take the vocabulary (tokenizer) from this GGUF (default: a generated byte-level one)\n"
    "  --vocab-size N          override the preset's vocabulary size (default: the preset's)\n"
    "  -t, --threads N         threads filling the weights (default: all cores)\n"
    "  --random-blocks         quantized types: random block bytes with fixed small scales instead of\n"
    "                          quantized normal draws (seconds instead of minutes; speed benchmarks)\n"
    "  --list-presets          list the presets and exit\n"
    "  -h, --help              this text\n";

int cmd_make_random_model(int argc, char **argv) {
    const char *preset_name = NULL, *dtype_name = "f32", *out = NULL, *vocab_from = NULL;
    uint64_t seed = 0;
    int n_vocab_override = 0, n_threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) cli_help(k_help);
        else if (!strcmp(f, "--preset")) preset_name = v, i++;
        else if (!strcmp(f, "--dtype")) dtype_name = v, i++;
        else if (!strcmp(f, "--seed")) seed = (uint64_t)cli_int(f, v, 0, INT64_MAX), i++;
        else if (!strcmp(f, "--vocab-from")) vocab_from = v, i++;
        else if (!strcmp(f, "--vocab-size")) n_vocab_override = (int)cli_int(f, v, 1, 1 << 24), i++;
        else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) n_threads = (int)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "-o") || !strcmp(f, "--output")) out = v, i++;
        else if (!strcmp(f, "--random-blocks")) g_random_blocks = true;
        else if (!strcmp(f, "--list-presets")) {
            usage_presets(stdout);
            return 0;
        } else cli_die(OSP_OK, "make-random-model: unknown option '%s'", f);
    }
    if (!preset_name || !out) {
        usage_presets(stderr);
        cli_die(OSP_OK, "make-random-model needs --preset NAME and -o FILE");
    }
    if (!dtype_name || (vocab_from && !vocab_from[0])) cli_die(OSP_OK, "make-random-model: an option needs a value");
    const preset *pp = osp_model_preset_find(preset_name);
    if (!pp) {
        usage_presets(stderr);
        cli_die(OSP_OK, "make-random-model: unknown preset '%s'", preset_name);
    }
    preset p = *pp;
    int di = -1;
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (!strcmp(k_dtypes[i].name, dtype_name)) di = (int)i;
    if (di < 0) cli_die(OSP_OK, "--dtype: '%s' is not one of f32 f16 bf16 q8_0 q4_0 q4_1 q4_k q6_k q4_k_m", dtype_name);
    const uint32_t wtype = k_dtypes[di].type;
    const bool k_mix = !strcmp(k_dtypes[di].name, "q4_k_m");
    if (n_vocab_override) p.n_vocab = n_vocab_override;
    if (!vocab_from && p.n_vocab < 259)
        cli_die(OSP_OK, "the generated vocabulary needs --vocab-size >= 259 (3 specials + 256 bytes)");
    if (!n_threads) n_threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (osp_threadpool_create(n_threads > 0 ? n_threads : 1, &g_pool) != OSP_OK) cli_die(OSP_OK, "cannot start %d threads", n_threads);
    const int head_dim = p.head_dim ? p.head_dim : p.n_embd / p.n_head;
    const char *arch = p.arch ? p.arch : "llama";
    {
        const int64_t bs = k_mix ? 256 : osp_dtype_block_size(wtype), qd = (int64_t)p.n_head * head_dim;
        if (p.n_embd % bs || qd % bs || p.n_ff % bs)
            cli_die(OSP_OK, "--dtype %s: the matrices' rows (%d, %lld, %d values) must be whole blocks of %lld", dtype_name,
                    p.n_embd, (long long)qd, p.n_ff, (long long)bs);
    }

    osp_gguf_writer *w;
    osp_status s = osp_gguf_writer_create(&w);
    if (s != OSP_OK) cli_die(s, "make-random-model");
    char name[128];
    snprintf(name, sizeof name, "random %s %s seed %llu", p.name, dtype_name, (unsigned long long)seed);
#define ADD(call)                                                                                  \
    do {                                                                                           \
        if ((s = (call)) != OSP_OK) cli_die(s, "make-random-model");                               \
    } while (0)
    ADD(osp_gguf_writer_add_str(w, "general.architecture", arch));
    ADD(osp_gguf_writer_add_str(w, "general.type", "model"));
    ADD(osp_gguf_writer_add_str(w, "general.name", name));
    ADD(osp_gguf_writer_add_u32(w, "general.file_type", k_dtypes[di].file_type));
    char key[96];
#define KEY(suffix) (snprintf(key, sizeof key, "%s." suffix, arch), key)
    ADD(osp_gguf_writer_add_u32(w, KEY("block_count"), (uint32_t)p.n_layer));
    ADD(osp_gguf_writer_add_u32(w, KEY("context_length"), (uint32_t)p.n_ctx));
    ADD(osp_gguf_writer_add_u32(w, KEY("embedding_length"), (uint32_t)p.n_embd));
    ADD(osp_gguf_writer_add_u32(w, KEY("feed_forward_length"), (uint32_t)p.n_ff));
    ADD(osp_gguf_writer_add_u32(w, KEY("attention.head_count"), (uint32_t)p.n_head));
    ADD(osp_gguf_writer_add_u32(w, KEY("attention.head_count_kv"), (uint32_t)p.n_head_kv));
    ADD(osp_gguf_writer_add_f32(w, KEY("rope.freq_base"), p.rope_theta));
    ADD(osp_gguf_writer_add_f32(w, KEY("attention.layer_norm_rms_epsilon"), p.rms_eps));
    ADD(osp_gguf_writer_add_u32(w, KEY("vocab_size"), (uint32_t)p.n_vocab));
    ADD(osp_gguf_writer_add_u32(w, KEY("rope.dimension_count"), (uint32_t)head_dim));
    if (head_dim != p.n_embd / p.n_head) {
        ADD(osp_gguf_writer_add_u32(w, KEY("attention.key_length"), (uint32_t)head_dim));
        ADD(osp_gguf_writer_add_u32(w, KEY("attention.value_length"), (uint32_t)head_dim));
    }
#undef KEY
    if (vocab_from) add_vocab_from(w, vocab_from, p.n_vocab);
    else add_byte_vocab(w, p.n_vocab);
    if (wtype != OSP_DTYPE_F32 && wtype != OSP_DTYPE_F16 && wtype != OSP_DTYPE_BF16)
        ADD(osp_gguf_writer_add_u32(w, "general.quantization_version", 2));

    /* Tensors in llama.cpp's convert order. ne = [input features, output features]. */
    const int64_t E = p.n_embd, QD = (int64_t)p.n_head * head_dim, KD = (int64_t)p.n_head_kv * head_dim,
                  F = p.n_ff, V = p.n_vocab;
    const bool rope_freqs = p.rope.factor > 0.0f;
    const int n_tensors =
        2 + (9 + (p.qkv_bias ? 3 : 0) + (p.qk_norm ? 2 : 0)) * p.n_layer + (p.tied ? 0 : 1) + (rope_freqs ? 1 : 0);
    fill_ctx *ctx = calloc((size_t)n_tensors, sizeof *ctx);
    if (!ctx) cli_die(OSP_OK, "out of memory");
    int k = 0;
    uint64_t n_params = 0;
#define TENSOR(nm, type_, cols, rows, is_norm)                                                     \
    do {                                                                                           \
        ctx[k] = (fill_ctx){name_key(seed, nm), (type_), (cols), (is_norm)};                       \
        const int64_t ne_[2] = {(cols), (rows)};                                                   \
        ADD(osp_gguf_writer_add_tensor(w, nm, (type_), (rows) == 1 ? 1 : 2, ne_, NULL, fill_random, &ctx[k])); \
        n_params += (uint64_t)(cols) * (uint64_t)(rows);                                           \
        k++;                                                                                       \
    } while (0)
    TENSOR("token_embd.weight", wtype, E, V, false);
    freqs_ctx fctx = {p.rope, p.rope_theta, head_dim};
    if (rope_freqs) {
        const int64_t ne_[1] = {head_dim / 2};
        ADD(osp_gguf_writer_add_tensor(w, "rope_freqs.weight", OSP_DTYPE_F32, 1, ne_, NULL, fill_rope_freqs, &fctx));
    }
    for (int l = 0; l < p.n_layer; l++) {
        char nm[64];
#define LAYER(suffix, type_, cols, rows, is_norm)                                                  \
    snprintf(nm, sizeof nm, "blk.%d." suffix ".weight", l);                                        \
    TENSOR(nm, type_, cols, rows, is_norm)
        LAYER("attn_norm", OSP_DTYPE_F32, E, 1, true);
        LAYER("attn_q", wtype, E, QD, false);
        LAYER("attn_k", wtype, E, KD, false);
        LAYER("attn_v", k_mix && use_more_bits(l, p.n_layer) ? OSP_DTYPE_Q6_K : wtype, E, KD, false);
        if (p.qkv_bias) { /* ggml_add of a [rows] vector: 1-d F32 tensors */
            snprintf(nm, sizeof nm, "blk.%d.attn_q.bias", l);
            TENSOR(nm, OSP_DTYPE_F32, QD, 1, false);
            snprintf(nm, sizeof nm, "blk.%d.attn_k.bias", l);
            TENSOR(nm, OSP_DTYPE_F32, KD, 1, false);
            snprintf(nm, sizeof nm, "blk.%d.attn_v.bias", l);
            TENSOR(nm, OSP_DTYPE_F32, KD, 1, false);
        }
        if (p.qk_norm) {
            LAYER("attn_q_norm", OSP_DTYPE_F32, head_dim, 1, true);
            LAYER("attn_k_norm", OSP_DTYPE_F32, head_dim, 1, true);
        }
        LAYER("attn_output", wtype, QD, E, false);
        LAYER("ffn_norm", OSP_DTYPE_F32, E, 1, true);
        LAYER("ffn_gate", wtype, E, F, false);
        LAYER("ffn_up", wtype, E, F, false);
        LAYER("ffn_down", k_mix && use_more_bits(l, p.n_layer) ? OSP_DTYPE_Q6_K : wtype, F, E, false);
#undef LAYER
    }
    TENSOR("output_norm.weight", OSP_DTYPE_F32, E, 1, true);
    if (!p.tied) TENSOR("output.weight", k_mix ? OSP_DTYPE_Q6_K : wtype, E, V, false);
#undef TENSOR
    const double t0 = cli_now_s();
    ADD(osp_gguf_writer_write(w, out));
#undef ADD
    const double dt = cli_now_s() - t0;
    struct stat st;
    const long long bytes = stat(out, &st) == 0 ? (long long)st.st_size : -1;
    fprintf(stderr, "wrote %s: %s, %s, seed %llu, %.1fM parameters, vocab %d (%s), %.1f MB in %.1f s\n", out, p.name,
            dtype_name, (unsigned long long)seed, (double)n_params / 1e6, p.n_vocab,
            vocab_from ? vocab_from : "generated byte-level", (double)bytes / 1e6, dt);
    free(ctx);
    osp_gguf_writer_free(w);
    osp_threadpool_free(g_pool);
    return 0;
}
