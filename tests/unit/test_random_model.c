/* `osprey make-random-model` and the tiny models committed under tests/models/.
 *
 * 1. Provenance: scripts/make-test-models.sh run into a temp directory with the built binary
 *    ($OSPREY_BIN) gives files byte-identical to the committed ones, so they are the tool's output.
 * 2. Determinism: the thread count changes nothing; another seed changes the weights.
 * 3. The files are usable: the <arch> keys and tensor shapes the loader reads (llama, llama with
 *    llama3 rope scaling, qwen2 biases, qwen3 q/k norms and head_dim 32), a generated
 *    vocabulary that round-trips text through osp_tokenizer (with merges in use), and
 *    `osprey generate --temp 0` runs on each model and gives the same text twice.
 * Skips (77) when the binary is missing. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/dtype.h"
#include "osprey/gguf.h"
#include "osprey/tokenizer.h"

static char g_dir[64];
static const char *g_bin, *g_root;
static char g_out[1 << 16], g_err[1 << 16];

/* What each committed model must hold. */
typedef struct model_case {
    const char *file, *arch;
    bool untied, rope_freqs, qkv_bias, qk_norm;
    int head_dim;
    uint32_t n_ff; /* 0: 128 */
} model_case;

static const model_case k_models[] = {
    {"tiny-llama-f32.gguf", "llama", false, false, false, false, 16, 0},
    {"tiny-llama-q8_0.gguf", "llama", false, false, false, false, 16, 0},
    {"tiny-llama-untied-q4_1.gguf", "llama", true, false, false, false, 16, 0},
    {"tiny-llama3-q8_0.gguf", "llama", true, true, false, false, 16, 0},
    {"tiny-qwen2-q4_1.gguf", "qwen2", false, false, true, false, 16, 0},
    {"tiny-qwen3-f32.gguf", "qwen3", true, false, false, true, 32, 0},
    {"tiny-llama-ffn96-q8_0.gguf", "llama", true, false, false, false, 16, 96}, /* test_tp's unequal FFN split */
};
enum { N_MODELS = sizeof k_models / sizeof k_models[0] };

static uint8_t *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc((size_t)len + 1);
    assert_non_null(p);
    assert_int_equal(fread(p, 1, (size_t)len, f), (size_t)len);
    p[len] = 0;
    fclose(f);
    *n = (size_t)len;
    return p;
}

static void slurp_text(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f) fclose(f);
}

/* Runs a shell command line with stdout/stderr to files; returns the exit status. */
static int sh(const char *cmdline) {
    char cmd[8192], o[128], e[128];
    snprintf(o, sizeof o, "%s/out", g_dir);
    snprintf(e, sizeof e, "%s/err", g_dir);
    snprintf(cmd, sizeof cmd, "%s >'%s' 2>'%s' </dev/null", cmdline, o, e);
    int st = system(cmd);
    slurp_text(o, g_out, sizeof g_out);
    slurp_text(e, g_err, sizeof g_err);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int setup(void **state) {
    (void)state;
    g_bin = getenv("OSPREY_BIN");
    g_root = getenv("OSPREY_ROOT");
    if (!g_root) g_root = ".";
    if (!g_bin || access(g_bin, X_OK) != 0) {
        fprintf(stderr, "skip: OSPREY_BIN not set or not executable\n");
        exit(77);
    }
    strcpy(g_dir, "/tmp/osp_random_model_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static bool same_file(const char *a, const char *b) {
    size_t na, nb;
    uint8_t *pa = slurp(a, &na), *pb = slurp(b, &nb);
    bool same = na == nb && memcmp(pa, pb, na) == 0;
    free(pa);
    free(pb);
    return same;
}

static void test_committed_models_are_the_tools_output(void **state) {
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "sh '%s/scripts/make-test-models.sh' '%s' '%s/regen'", g_root, g_bin, g_dir);
    int rc = sh(cmd);
    if (rc != 0) fail_msg("make-test-models.sh exited %d: %s", rc, g_err);
    for (int i = 0; i < N_MODELS; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/tests/models/%s", g_root, k_models[i].file);
        snprintf(b, sizeof b, "%s/regen/%s", g_dir, k_models[i].file);
        size_t n;
        free(slurp(a, &n));
        if (n >= 1000000) fail_msg("%s is %zu bytes, meant to stay under 1 MB", a, n);
        if (!same_file(a, b)) fail_msg("%s differs from what scripts/make-test-models.sh makes now", a);
    }
}

static void test_deterministic(void **state) {
    (void)state;
    char cmd[2048], p[4][256];
    const char *variants[4] = {"--seed 7 -t 1", "--seed 7 -t 2", "--seed 7 -t 3", "--seed 8 -t 2"};
    for (int i = 0; i < 4; i++) {
        snprintf(p[i], sizeof p[i], "%s/det%d.gguf", g_dir, i);
        snprintf(cmd, sizeof cmd, "'%s' make-random-model --preset tiny-untied --dtype q4_0 --vocab-size 300 %s -o '%s'",
                 g_bin, variants[i], p[i]);
        int rc = sh(cmd);
        if (rc != 0) fail_msg("exit %d: %s", rc, g_err);
    }
    assert_true(same_file(p[0], p[1]));
    assert_true(same_file(p[0], p[2]));
    assert_false(same_file(p[0], p[3]));
    /* bad arguments: one error line, exit 1 */
    const char *bad[] = {"--preset nope -o x.gguf", "--preset tiny --dtype q5_0 -o x.gguf", "--preset tiny",
                         "--preset tiny --vocab-size 100 -o x.gguf", "--preset tiny --vocab-from /nonexistent.gguf -o x.gguf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd '%s' && '%s' make-random-model %s", g_dir, g_bin, bad[i]);
        int rc = sh(cmd);
        if (rc != 1 || !strstr(g_err, "osprey: error:")) fail_msg("'%s': exit %d, stderr: %s", bad[i], rc, g_err);
    }
}

static void test_models_are_usable(void **state) {
    (void)state;
    for (int i = 0; i < N_MODELS; i++) {
        char path[512];
        const model_case *mc = &k_models[i];
        snprintf(path, sizeof path, "%s/tests/models/%s", g_root, mc->file);
        osp_gguf *g;
        osp_status s = osp_gguf_open(path, &g);
        if (s != OSP_OK) fail_msg("%s", osp_last_error());
        osp_gguf_str arch;
        uint32_t v;
        assert_int_equal(osp_gguf_get_str(g, "general.architecture", &arch), OSP_OK);
        assert_true(arch.len == strlen(mc->arch) && memcmp(arch.data, mc->arch, arch.len) == 0);
        const struct { const char *key; uint32_t want; } keys[] = {
            {"embedding_length", 64}, {"block_count", 2},          {"attention.head_count", 4},
            {"attention.head_count_kv", 2}, {"feed_forward_length", mc->n_ff ? mc->n_ff : 128u},
            {"rope.dimension_count", (uint32_t)mc->head_dim},
            {"vocab_size", 512},
        };
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            char key[96];
            snprintf(key, sizeof key, "%s.%s", mc->arch, keys[k].key);
            assert_int_equal(osp_gguf_get_u32(g, key, &v), OSP_OK);
            assert_int_equal(v, keys[k].want);
        }
        const int hd = mc->head_dim;
        assert_int_equal(osp_gguf_n_tensors(g), 2 + (9 + (mc->qkv_bias ? 3 : 0) + (mc->qk_norm ? 2 : 0)) * 2 +
                                                    (mc->untied ? 1 : 0) + (mc->rope_freqs ? 1 : 0));
        const osp_gguf_tensor *t = osp_gguf_find_tensor(g, "token_embd.weight");
        assert_non_null(t);
        assert_true(t->ne[0] == 64 && t->ne[1] == 512);
        assert_int_equal(osp_gguf_find_tensor(g, "output.weight") != NULL, mc->untied);
        t = osp_gguf_find_tensor(g, "blk.1.attn_k.weight");
        assert_true(t && t->ne[0] == 64 && t->ne[1] == 2 * hd);
        t = osp_gguf_find_tensor(g, "blk.0.ffn_down.weight");
        assert_true(t && t->ne[0] == (mc->n_ff ? mc->n_ff : 128u) && t->ne[1] == 64);
        t = osp_gguf_find_tensor(g, "blk.1.attn_v.bias");
        assert_true(mc->qkv_bias ? (t && t->ne[0] == 2 * hd && t->type == OSP_DTYPE_F32) : t == NULL);
        t = osp_gguf_find_tensor(g, "blk.1.attn_k_norm.weight");
        assert_true(mc->qk_norm ? (t && t->ne[0] == hd && t->type == OSP_DTYPE_F32) : t == NULL);
        t = osp_gguf_find_tensor(g, "rope_freqs.weight");
        if (mc->rope_freqs) {
            /* head_dim 16, theta 5e5, original context 256: 2 kept, 1 interpolated, 5 divided by 8 */
            assert_true(t && t->ne[0] == hd / 2 && t->type == OSP_DTYPE_F32);
            const float *ff = t->data;
            assert_true(ff[0] == 1.0f && ff[1] == 1.0f && ff[2] > 1.0f && ff[2] < 8.0f);
            for (int j = 3; j < hd / 2; j++) assert_true(ff[j] == 8.0f);
        } else {
            assert_null(t);
        }
        /* norms are F32 near 1, weights have std near 0.02 */
        t = osp_gguf_find_tensor(g, "output_norm.weight");
        assert_int_equal(t->type, OSP_DTYPE_F32);
        const float *nw = t->data;
        for (int j = 0; j < 64; j++) assert_true(nw[j] > 0.9f && nw[j] < 1.1f);
        t = osp_gguf_find_tensor(g, "blk.0.ffn_up.weight");
        float *w = malloc(sizeof(float) * 64 * 128);
        assert_int_equal(osp_dequant_row(t->type, t->data, w, 64 * 128), OSP_OK);
        double ss = 0, sum = 0;
        for (int j = 0; j < 64 * 128; j++) sum += w[j], ss += (double)w[j] * w[j];
        const double mean = sum / (64 * 128), sd = sqrt(ss / (64 * 128) - mean * mean);
        if (!(sd > 0.018 && sd < 0.022 && fabs(mean) < 0.001)) fail_msg("%s: mean %g std %g", mc->file, mean, sd);
        free(w);

        /* the generated vocabulary: text round-trips, merges shorten it */
        osp_tokenizer *tok;
        s = osp_tokenizer_load(g, &tok);
        if (s != OSP_OK) fail_msg("%s", osp_last_error());
        assert_int_equal(osp_tokenizer_n_vocab(tok), 512);
        const char *text = "Hello world, the quick brown fox. \xc3\xa9t\xc3\xa9 \xf0\x9f\x90\xa6 <|im_end|>";
        int32_t *ids;
        size_t n_ids;
        assert_int_equal(osp_tokenizer_encode(tok, text, strlen(text), false, true, &ids, &n_ids), OSP_OK);
        assert_true(n_ids < strlen(text) - 10);
        assert_int_equal(ids[n_ids - 1], 2); /* <|im_end|> */
        char buf[512];
        size_t off = 0;
        for (size_t k = 0; k < n_ids; k++) {
            size_t n;
            assert_int_equal(osp_tokenizer_token_bytes(tok, ids[k], buf + off, sizeof buf - off, &n), OSP_OK);
            off += n;
        }
        assert_int_equal(off, strlen(text));
        assert_memory_equal(buf, text, off);
        free(ids);
        osp_tokenizer_free(tok);
        osp_gguf_close(g);

        /* generate runs and is reproducible at temperature 0 */
        char cmd[2048];
        static char first[sizeof g_out];
        snprintf(cmd, sizeof cmd, "'%s' generate -m '%s' -p 'Once upon a time' -n 24 --temp 0 -t 1", g_bin, path);
        int rc = sh(cmd);
        if (rc != 0) fail_msg("%s: generate exited %d: %s", mc->file, rc, g_err);
        if (strncmp(g_out, "Once upon a time", 16) != 0 || strlen(g_out) <= 16)
            fail_msg("%s: unexpected output '%s'", mc->file, g_out);
        memcpy(first, g_out, sizeof first);
        assert_int_equal(sh(cmd), 0);
        assert_string_equal(g_out, first);
        printf("%s: generate --temp 0: '%s'\n", mc->file, first);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_committed_models_are_the_tools_output),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_models_are_usable),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
