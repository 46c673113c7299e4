/* The osprey CLI end to end: bad files give one clear line naming the file and the field, and a
 * non-zero exit, never a crash; tokenize/info/generate work on the real model and vocab-only files.
 *
 * Runs the built binary ($OSPREY_BIN) with stdout and stderr sent to files under a temp directory.
 * Broken models are made by copying the default model and cutting or patching it. Needs the model
 * ($OSPREY_MODEL); skips (77) without it. */
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
#include <jansson.h>

#include "format/kv_scales.h"
#include "osprey/model.h"
#include "osprey/version.h"


static char g_dir[256];
static const char *g_bin, *g_model;
static char g_out[1 << 16], g_err[1 << 16];

static void slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f) fclose(f);
}

/* Runs `osprey <args>`; returns the exit status (-1 if killed by a signal), fills g_out/g_err. */
static int run(const char *args) {
    char cmd[8192], o[512], e[512];
    snprintf(o, sizeof o, "%s/out", g_dir);
    snprintf(e, sizeof e, "%s/err", g_dir);
    snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>'%s' </dev/null", g_bin, args, o, e);
    int st = system(cmd);
    slurp(o, g_out, sizeof g_out);
    slurp(e, g_err, sizeof g_err);
    if (WIFSIGNALED(st)) return -1;
    return WEXITSTATUS(st);
}

/* Copies the model's first `n` bytes (all when n == 0) to dir/name and returns the path. */
static const char *copy_model(const char *name, size_t n, unsigned char **data, size_t *size) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *in = fopen(g_model, "rb");
    assert_non_null(in);
    fseek(in, 0, SEEK_END);
    size_t total = (size_t)ftell(in);
    fseek(in, 0, SEEK_SET);
    if (n == 0 || n > total) n = total;
    unsigned char *buf = malloc(n);
    assert_int_equal(fread(buf, 1, n, in), n);
    fclose(in);
    *data = buf;
    *size = n;
    return path;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static unsigned char *find(unsigned char *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return hay + i;
    return NULL;
}

/* One error line on stderr containing every given fragment; nothing on stdout; exit 1. */
static void expect_error(int rc, const char *frag1, const char *frag2) {
    if (rc != 1) fail_msg("exit %d, expected 1; stderr: %s", rc, g_err);
    if (!strstr(g_err, "osprey: error:")) fail_msg("no error line: %s", g_err);
    if (frag1 && !strstr(g_err, frag1)) fail_msg("'%s' not in: %s", frag1, g_err);
    if (frag2 && !strstr(g_err, frag2)) fail_msg("'%s' not in: %s", frag2, g_err);
    assert_int_equal(strlen(g_out), 0);
}

static void test_missing_empty_and_not_gguf(void **state) {
    (void)state;
    char args[1024], path[512];
    snprintf(args, sizeof args, "info -m '%s/nope.gguf'", g_dir);
    expect_error(run(args), "nope.gguf", "cannot open");
    snprintf(path, sizeof path, "%s/empty.gguf", g_dir);
    write_file(path, "", 0);
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 1", path);
    expect_error(run(args), "empty.gguf", "empty");
    snprintf(path, sizeof path, "%s/text.gguf", g_dir);
    write_file(path, "hello, I am not a model\n", 24);
    snprintf(args, sizeof args, "tokenize -m '%s' -p hi", path);
    expect_error(run(args), "text.gguf", "magic");
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 1", g_dir); /* a directory */
    expect_error(run(args), g_dir, NULL);
}

static void test_truncated(void **state) {
    (void)state;
    const size_t cuts[] = {3, 10, 24, 1000, 200000, 50000000};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        unsigned char *d;
        size_t n;
        const char *p = copy_model("cut.gguf", cuts[i], &d, &n);
        write_file(p, d, n);
        free(d);
        char args[1024];
        snprintf(args, sizeof args, "generate -m '%s' -p hi -n 1", p);
        int rc = run(args);
        expect_error(rc, "cut.gguf", cuts[i] > 200000 ? "past the end" : "truncated");
    }
}

static void test_unsupported_architecture_and_type(void **state) {
    (void)state;
    unsigned char *d;
    size_t n;
    const char *p = copy_model("arch.gguf", 0, &d, &n);
    unsigned char *key = find(d, 1 << 20, "general.architecture");
    assert_non_null(key);
    unsigned char *val = find(key, 64, "llama");
    assert_non_null(val);
    memcpy(val, "mamba", 5);
    write_file(p, d, n);
    memcpy(val, "llama", 5);
    char args[1024];
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 1", p);
    expect_error(run(args), "arch.gguf", "general.architecture 'mamba' is not supported");

    /* tensor info: name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset */
    unsigned char *name = find(d, 1 << 22, "blk.0.attn_norm.weight");
    assert_non_null(name);
    unsigned char *info = name + strlen("blk.0.attn_norm.weight");
    uint32_t n_dims;
    memcpy(&n_dims, info, 4);
    unsigned char *type = info + 4 + 8 * n_dims;
    const uint32_t bogus = 99;
    memcpy(type, &bogus, 4);
    char tpath[512];
    snprintf(tpath, sizeof tpath, "%s/type.gguf", g_dir);
    p = tpath;
    write_file(p, d, n);
    snprintf(args, sizeof args, "info -m '%s'", p);
    expect_error(run(args), "blk.0.attn_norm.weight", "unknown tensor type 99");

    const uint32_t f32 = 0;
    memcpy(type, &f32, 4);
    /* IQ2_XXS: a type ggml defines but osprey cannot compute with yet (sizes stay consistent) */
    name = find(d, 1 << 22, "blk.0.ffn_down.weight");
    assert_non_null(name);
    info = name + strlen("blk.0.ffn_down.weight");
    memcpy(&n_dims, info, 4);
    type = info + 4 + 8 * n_dims;
    const uint32_t iq2_xxs = 16;
    memcpy(type, &iq2_xxs, 4);
    write_file(p, d, n);
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 1", p);
    expect_error(run(args), "blk.0.ffn_down.weight", "IQ2_XXS");
    free(d);
}

static void test_bad_flags(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n -5", g_model);
    expect_error(run(args), "-n", NULL);
    snprintf(args, sizeof args, "generate -m '%s' -p hi --top-p 1.5", g_model);
    expect_error(run(args), "--top-p", NULL);
    snprintf(args, sizeof args, "generate -m '%s' --bogus", g_model);
    expect_error(run(args), "--bogus", NULL);
    expect_error(run("generate -p hi"), "-m FILE", NULL);
    assert_int_equal(run("frobnicate"), 2);
    /* devices: an unknown name; CUDA where there is none (CI); random weights off the GPU */
    snprintf(args, sizeof args, "generate -m '%s' -p hi --device gpu", g_model);
    expect_error(run(args), "--device", "cpu, cuda, auto");
    if (osp_device_count(OSP_DEVICE_CUDA) == 0) {
        snprintf(args, sizeof args, "generate -m '%s' -p hi -n 1 --device cuda", g_model);
        expect_error(run(args), "--device cuda", NULL);
    }
    /* --gpu-memory-utilization: out of (0, 1], and only where it sizes something (the GPU's cache) */
    snprintf(args, sizeof args, "generate -m '%s' -p hi --gpu-memory-utilization 1.5", g_model);
    expect_error(run(args), "--gpu-memory-utilization", "[0.01, 1]");
    snprintf(args, sizeof args, "chat -m '%s' --device cpu --gpu-memory-utilization 0.5", g_model);
    expect_error(run(args), "--gpu-memory-utilization", "--device cuda");
    expect_error(run("bench --random-weights tiny -p 4 -n 4"), "--random-weights", "--device cuda");
    expect_error(run("bench --random-weights nope --device cuda"), "unknown preset 'nope'", NULL);
}

static void test_tokenize_and_info(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "tokenize -m '%s' -p 'The three primary colors are'", g_model);
    assert_int_equal(run(args), 0);
    assert_string_equal(g_out, "[504, 1296, 3003, 4683, 359]\n"); /* llama.cpp's ids */
    snprintf(args, sizeof args, "tokenize -m '%s' -p '<|im_start|>user'", g_model);
    assert_int_equal(run(args), 0);
    assert_string_equal(g_out, "[1, 4093]\n");
    snprintf(args, sizeof args, "tokenize -m '%s' -p '<|im_start|>user' --no-special", g_model);
    assert_int_equal(run(args), 0);
    assert_string_equal(g_out, "[44, 108, 306, 79, 3738, 108, 46, 4093]\n"); /* llama.cpp, parse_special off */
    snprintf(args, sizeof args, "info -m '%s'", g_model);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "general.architecture"));
    assert_non_null(strstr(g_out, "token_embd.weight"));
    assert_non_null(strstr(g_out, "Q4_1"));
    assert_non_null(strstr(g_out, "tensors (272)"));
}

static void test_generate_greedy(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "generate -m '%s' -p 'The three primary colors are' -n 20 --temp 0 -t 2 --exact", g_model);
    assert_int_equal(run(args), 0);
    /* transformers' greedy continuation (tests/golden/fixtures/smollm2_logits.txt, prompt 0) */
    const char *want = "The three primary colors are the primary colors of the RGB color model: red, blue, and green.";
    if (strncmp(g_out, want, strlen(want)) != 0) fail_msg("got: %s", g_out);
    assert_non_null(strstr(g_err, "generation: 20 tokens"));
    assert_non_null(strstr(g_err, "tokens/s"));
}

/* --speculative-config (issue 14): vLLM's JSON; each mistake one error line; greedy output unchanged. */
static void test_speculative_config(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 4 --speculative-config '{\"method\": \"ngram\"'", g_model);
    expect_error(run(args), "--speculative-config", "not JSON");
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 4 --speculative-config '{\"method\": \"magic\", "
                                "\"num_speculative_tokens\": 2}'", g_model);
    expect_error(run(args), "--speculative-config", "unknown method \"magic\"");
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 4 --speculative-config '{\"method\": \"eagle\", "
                                "\"num_speculative_tokens\": 2}'", g_model);
    expect_error(run(args), "--speculative-config", "not implemented yet");
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 4 --speculative-config '{\"method\": \"draft_model\", "
                                "\"num_speculative_tokens\": 2}'", g_model);
    expect_error(run(args), "--speculative-config", "draft_model needs \"model\"");
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 4 --speculative-config '{\"method\": \"draft_model\", "
                                "\"model\": \"/nonexistent/draft.gguf\", \"num_speculative_tokens\": 2}'", g_model);
    expect_error(run(args), "draft model", "/nonexistent/draft.gguf");
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 4 --speculative-config '{\"method\": \"ngram\", "
                                "\"num_speculative_tokens\": 99}'", g_model);
    expect_error(run(args), "--speculative-config", "num_speculative_tokens");
    snprintf(args, sizeof args, "generate -m '%s' -p hi --speculative-config", g_model);
    expect_error(run(args), "--speculative-config needs a JSON object", NULL);
    snprintf(args, sizeof args, "generate -m '%s' -p 'The three primary colors are' -n 20 --temp 0 -t 2 --exact "
                                "--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 3, "
                                "\"prompt_lookup_min\": 1, \"prompt_lookup_max\": 3}'", g_model);
    assert_int_equal(run(args), 0);
    const char *want = "The three primary colors are the primary colors of the RGB color model: red, blue, and green.";
    if (strncmp(g_out, want, strlen(want)) != 0) fail_msg("got: %s", g_out);
    assert_non_null(strstr(g_err, "generation: 20 tokens"));
    assert_non_null(strstr(g_err, "speculative (ngram, k 3)"));
    /* the model as its own draft: the same text, every draft kept */
    snprintf(args, sizeof args, "generate -m '%s' -p 'The three primary colors are' -n 20 --temp 0 -t 2 --exact "
                                "--speculative-config '{\"method\": \"draft_model\", \"model\": \"%s\", "
                                "\"num_speculative_tokens\": 3}'", g_model, g_model);
    assert_int_equal(run(args), 0);
    if (strncmp(g_out, want, strlen(want)) != 0) fail_msg("got: %s", g_out);
    assert_non_null(strstr(g_err, "speculative (draft_model, k 3)"));
    /* '' is no config (the flag left out is) */
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 4 --speculative-config ''", g_model);
    expect_error(run(args), "--speculative-config needs a JSON object", NULL);
    /* quantspec over int8_hier pages: plain decoding's text over the same pages, and its cost line */
    snprintf(args, sizeof args, "generate -m '%s' -p 'The three primary colors are' -n 20 --temp 0 -t 2 "
                                "--kv-cache-dtype int8_hier", g_model);
    assert_int_equal(run(args), 0);
    char *plain = strdup(g_out);
    assert_non_null(plain);
    snprintf(args, sizeof args, "generate -m '%s' -p 'The three primary colors are' -n 20 --temp 0 -t 2 "
                                "--kv-cache-dtype int8_hier --speculative-config '{\"method\": \"quantspec\", "
                                "\"num_speculative_tokens\": 3}'", g_model);
    assert_int_equal(run(args), 0);
    assert_string_equal(g_out, plain);
    free(plain);
    assert_non_null(strstr(g_err, "speculative (quantspec, k 3)"));
    /* its staging blocks come out of a memory budget, so a budget of fewer blocks is refused */
    snprintf(args, sizeof args, "serve -m '%s' --port 0 --kv-cache-dtype int8_hier --kv-cache-memory 2M "
                                "--speculative-config '{\"method\": \"quantspec\", \"num_speculative_tokens\": 3}'",
             g_model);
    expect_error(run(args), "quantspec needs 16 of them as staging blocks", NULL);
}

/* osprey plan: 2 x 30 layers x 3 KV heads x 64 dims x 2 bytes (f16) per token; 512 MiB / (16 x 23040) blocks. */
static void test_plan(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "plan -m '%s'", g_model);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "bytes per token: 23040"));
    assert_non_null(strstr(g_out, "536870912 bytes -> 1456 blocks"));
    snprintf(args, sizeof args, "plan -m '%s' --kv-cache-dtype f32 --kv-cache-memory 64M --max-model-len 2048", g_model);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "bytes per token: 46080"));
    assert_non_null(strstr(g_out, "-> 91 blocks"));
    assert_non_null(strstr(g_out, "does not fit"));
    snprintf(args, sizeof args, "plan -m '%s' --kv-cache-dtype q9", g_model);
    expect_error(run(args), "--kv-cache-dtype", NULL);
}

/* --kv-cache-dtype (issue 13) on every command that takes it: an unknown dtype, --exact with a
 * quantized one (either order) and bf16 (no backend has bf16 pages) are one error line at start-up,
 * before the model is read (nothing else on stderr, nothing on stdout); vLLM's aliases are accepted;
 * plan lists every dtype side by side; generate runs with fp8 and nvfp4 pages. */
/* --kv-scales (issue 13): a truncated, corrupt or missing scales file, or one made for another model's
 * shape, is one error line naming the file, for every command that takes the flag; a good one runs. */
static void test_kv_scales(void **state) {
    (void)state;
    char args[2048], good[512], other[512], trunc[512], corrupt[512];
    snprintf(good, sizeof good, "%s/good.kvs", g_dir);
    snprintf(other, sizeof other, "%s/other.kvs", g_dir);
    snprintf(trunc, sizeof trunc, "%s/trunc.kvs", g_dir);
    snprintf(corrupt, sizeof corrupt, "%s/corrupt.kvs", g_dir);
    osp_kv_scales s;
    assert_int_equal(osp_kv_scales_init(&s, 30, 3, 64), OSP_OK); /* SmolLM2-135M's shape */
    assert_int_equal(osp_kv_scales_save(good, &s), OSP_OK);
    assert_int_equal(osp_kv_scales_save(trunc, &s), OSP_OK);
    assert_int_equal(truncate(trunc, 100), 0);
    assert_int_equal(osp_kv_scales_save(corrupt, &s), OSP_OK);
    FILE *f = fopen(corrupt, "r+b");
    assert_non_null(f);
    fseek(f, 40, SEEK_SET);
    fputc(0x7f, f);
    fclose(f);
    osp_kv_scales_free(&s);
    assert_int_equal(osp_kv_scales_init(&s, 2, 2, 16), OSP_OK);
    assert_int_equal(osp_kv_scales_save(other, &s), OSP_OK);
    osp_kv_scales_free(&s);
    char text[512];
    snprintf(text, sizeof text, "%s/text.txt", g_dir);
    f = fopen(text, "w");
    assert_non_null(f);
    for (int i = 0; i < 40; i++) fputs("The quick brown fox jumps over the lazy dog. ", f);
    fclose(f);
    char ppl[600];
    snprintf(ppl, sizeof ppl, "perplexity -f '%s' --ctx 64 --chunks 1", text);
    const char *cmds[] = {"generate -p hi -n 2 --kv-cache-dtype fp8", "chat --kv-cache-dtype nvfp4",
                          "serve --port 0 --kv-cache-dtype fp8", "bench -p 4 -n 2 -r 1 --kv-cache-dtype nvfp4", ppl};
    const struct { const char *path, *what; } bad[] = {
        {trunc, "truncated"}, {corrupt, "corrupt"}, {other, "another model"}, {"/nonexistent/x.kvs", "cannot open"}};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
            snprintf(args, sizeof args, "%s -m '%s' --kv-scales '%s'", cmds[i], g_model, bad[b].path);
            expect_error(run(args), bad[b].path, bad[b].what);
            /* one error line (serve logs its start-up lines before a shape mismatch is seen) */
            const char *e1 = strstr(g_err, "osprey: error:");
            if (strstr(e1 + 1, "osprey: error:") || strchr(e1, '\n') != g_err + strlen(g_err) - 1)
                fail_msg("%s: not one error line: %s", args, g_err);
        }
    /* a good file runs (fp8 and nvfp4 take it; f16 ignores it) */
    const char *ok[] = {"generate -p hi -n 2 --temp 0 --kv-cache-dtype fp8", "generate -p hi -n 2 --temp 0"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        snprintf(args, sizeof args, "%s -m '%s' --kv-scales '%s'", ok[i], g_model, good);
        if (run(args) != 0) fail_msg("%s: %s", args, g_err);
    }
    snprintf(args, sizeof args, "%s -m '%s' --kv-cache-dtype nvfp4 --kv-scales '%s'", ppl, g_model, good);
    if (run(args) != 0) fail_msg("%s: %s", args, g_err);
    assert_non_null(strstr(g_out, "Final estimate"));
    remove(good), remove(other), remove(trunc), remove(corrupt), remove(text);
}

static void test_kv_cache_dtype(void **state) {
    (void)state;
    char args[1024];
    const char *cmds[] = {"generate -p hi -n 2", "chat", "serve --port 0", "bench -p 4 -n 2", "plan"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *bad[][3] = {{"--kv-cache-dtype q9", "--kv-cache-dtype", "'q9'"},
                                {"--kv-cache-dtype bf16", "bf16", "not implemented"},
                                {"--kv-cache-dtype fp8_e5m2", "fp8_e5m2", "nvfp4"}};
        for (int b = 0; b < 3; b++) {
            snprintf(args, sizeof args, "%s -m '%s' %s", cmds[i], g_model, bad[b][0]);
            expect_error(run(args), bad[b][1], bad[b][2]);
            if (strchr(g_err, '\n') != g_err + strlen(g_err) - 1) fail_msg("%s: more than one line: %s", args, g_err);
        }
    }
    const char *exact[] = {"generate -p hi -n 2 --exact --kv-cache-dtype fp8", "generate -p hi --kv-cache-dtype nvfp4 --exact",
                           "bench --exact --kv-cache-dtype nvfp4", "bench --kv-cache-dtype fp8_e4m3 --exact"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        snprintf(args, sizeof args, "%s -m '%s'", exact[i], g_model);
        expect_error(run(args), "--exact", "--kv-cache-dtype");
        if (strchr(g_err, '\n') != g_err + strlen(g_err) - 1) fail_msg("%s: more than one line: %s", args, g_err);
    }
    /* --exact with an exact cache is fine, in either order */
    snprintf(args, sizeof args, "plan -m '%s' --kv-cache-dtype fp8_e4m3", g_model);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "kv cache dtype: fp8"));
    assert_non_null(strstr(g_out, "bytes per token: 11520"));
    /* side by side: 2 x 30 x 3 x 64 x 1/2 + 2 x 30 x 3 x 4 scale bytes = 5760 + 720 for nvfp4 */
    const char *rows[] = {"  f32 ", "  f16 ", "  bf16      not available", "  fp8 ", "  nvfp4 "};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (!strstr(g_out, rows[i])) fail_msg("plan lacks the row '%s':\n%s", rows[i], g_out);
    assert_non_null(strstr(g_out, "6480             720"));
    snprintf(args, sizeof args, "plan -m '%s' --kv-cache-dtype auto", g_model);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "kv cache dtype: f16"));
    for (int d = 0; d < 2; d++) {
        snprintf(args, sizeof args, "generate -m '%s' -p 'The three primary colors are' -n 4 --temp 0 -t 2 --kv-cache-dtype %s",
                 g_model, d ? "nvfp4" : "fp8");
        assert_int_equal(run(args), 0);
        assert_non_null(strstr(g_out, "The three primary colors are"));
        assert_non_null(strstr(g_err, "generation: 4 tokens"));
    }
    snprintf(args, sizeof args, "generate -m '%s' -p hi -n 2 --temp 0 -t 2 --kv-cache-dtype f16 --exact", g_model);
    assert_int_equal(run(args), 0);
}

/* K/V split page dtypes (llama.cpp's -ctk / --cache-type-k, -ctv / --cache-type-v) on every command that
 * takes --kv-cache-dtype: bad values and --exact with a quantized side are one error line before the
 * model loads; a side's flag wins over --kv-cache-dtype in either order; plan sizes the split (SmolLM2:
 * 30 x 3 x 64 x (1 + 1/2) + 30 x 3 x 4 nvfp4 scale bytes = 8640 + 360 per token); generate, bench and
 * perplexity run with K fp8 + V nvfp4 and say so. */
static void test_kv_split_flags(void **state) {
    (void)state;
    char args[1024];
    const char *cmds[] = {"generate -p hi -n 2", "chat", "serve --port 0", "bench -p 4 -n 2", "plan", "perplexity -f /dev/null"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        const char *bad[][3] = {{"-ctk q9", "-ctk", "'q9'"},
                                {"--cache-type-v bf16", "bf16", "not implemented"},
                                {"-ctv", "-ctv", "''"}};
        for (int b = 0; b < 3; b++) {
            snprintf(args, sizeof args, "%s -m '%s' %s", cmds[i], g_model, bad[b][0]);
            expect_error(run(args), bad[b][1], bad[b][2]);
            if (strchr(g_err, '\n') != g_err + strlen(g_err) - 1) fail_msg("%s: more than one line: %s", args, g_err);
        }
    }
    const char *exact[] = {"generate -p hi -n 2 --exact -ctv nvfp4", "generate -p hi -ctk fp8 --exact",
                           "bench --exact --cache-type-v fp8"};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        snprintf(args, sizeof args, "%s -m '%s'", exact[i], g_model);
        expect_error(run(args), "--exact", "--cache-type-");
    }
    /* plan: the split's bytes, in either flag order and with --kv-cache-dtype under a side's flag */
    const char *orders[] = {"-ctk fp8 -ctv nvfp4", "--cache-type-v nvfp4 --kv-cache-dtype fp8",
                            "-ctv nvfp4 --kv-cache-dtype f32 -ctk fp8_e4m3"};
    for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++) {
        snprintf(args, sizeof args, "plan -m '%s' %s", g_model, orders[i]);
        assert_int_equal(run(args), 0);
        if (!strstr(g_out, "kv cache dtype: K fp8, V nvfp4") || !strstr(g_out, "bytes per token: 9000 ") ||
            !strstr(g_out, "  fp8/nvfp4            9000             360"))
            fail_msg("plan %s:\n%s", orders[i], g_out);
    }
    /* the split row is there for any dtype, and another split gets its own row */
    snprintf(args, sizeof args, "plan -m '%s' -ctk f16 -ctv fp8", g_model);
    assert_int_equal(run(args), 0);
    if (!strstr(g_out, "  fp8/nvfp4 ") || !strstr(g_out, "  f16/fp8 ") || !strstr(g_out, "kv cache dtype: K f16, V fp8"))
        fail_msg("plan -ctk f16 -ctv fp8:\n%s", g_out);
    snprintf(args, sizeof args, "generate -m '%s' -p 'The three primary colors are' -n 4 --temp 0 -t 2 -ctk fp8 -ctv nvfp4",
             g_model);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "The three primary colors are"));
    assert_non_null(strstr(g_err, "generation: 4 tokens"));
    snprintf(args, sizeof args, "bench -m '%s' -p 4 -n 2 -r 1 -t 1 -ctk fp8 -ctv nvfp4 -o csv", g_model);
    assert_int_equal(run(args), 0);
    if (!strstr(g_out, ",fp8,nvfp4,4,0,")) fail_msg("bench csv lacks type_k fp8, type_v nvfp4:\n%s", g_out);
    char text[512];
    snprintf(text, sizeof text, "%s/split.txt", g_dir);
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    for (int i = 0; i < 40; i++) fputs("The quick brown fox jumps over the lazy dog. ", f);
    fclose(f);
    snprintf(args, sizeof args, "perplexity -m '%s' -f '%s' --ctx 64 --chunks 1 -t 1 -ctk fp8 -ctv nvfp4", g_model, text);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "Final estimate"));
    assert_non_null(strstr(g_err, "kv K fp8, V nvfp4"));
    remove(text);
}

/* bench: a '#' header, then one line per test; --depth and --batch name their lines */
static void test_bench_lines(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "bench -m '%s' -p 8 -n 4 -r 1 -t 1 --depth 16 --batch 2", g_model);
    assert_int_equal(run(args), 0);
    assert_true(g_out[0] == '#');
    assert_non_null(strstr(g_out, "depth 16, batch 2"));
    const char *want[] = {"\npp8 ", "\ntg4@d16 ", "\npp16@b2 ", "\ntg4@b2@d16 "};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(g_out, want[i])) fail_msg("bench output lacks '%s':\n%s", want[i] + 1, g_out);
    snprintf(args, sizeof args, "bench -m '%s' --depth -1", g_model);
    expect_error(run(args), "--depth", NULL);
    /* --trace: one step a timed forward (pp8, tg4, then the batch's timed round: 2 prefills and 4 decode
     * steps; its warm-up round is not traced: 11), the summary on stderr */
    char path[] = "/tmp/osprey_bench_traceXXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    snprintf(args, sizeof args, "bench -m '%s' -p 8 -n 4 -r 1 -t 1 --depth 16 --batch 2 --trace %s", g_model, path);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_err, "trace: 11 steps"));
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char buf[1 << 16];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    remove(path);
    buf[n] = 0;
    int prepare = 0;
    for (const char *q = buf; (q = strstr(q, "\"name\":\"prepare\"")); q++) prepare++;
    assert_true(buf[0] == '[');
    assert_non_null(strstr(buf, "\n]\n"));
    assert_int_equal(prepare, 11);
    expect_error(run("bench -p 4 -n 2 --trace"), "--trace needs a file", NULL);
}

/* --exact with --cpu-activations q8 (either order; generate, bench, perplexity: the commands that take
 * --exact) is one error line at
 * start-up, before the model is read: the f32 reference path quantizes nothing, so q8 would be ignored
 * silently. --exact with two-level (the default, named) is fine. bench -p 0 -n 0 measures nothing: an
 * error, not a lone header. bench's header names the CPU activation mode. */
static void test_exact_activations_and_bench_shape(void **state) {
    (void)state;
    char args[1024];
    const char *both[] = {"generate -p hi -n 2 --exact --cpu-activations q8", "generate -p hi --cpu-activations q8 --exact",
                          "bench --exact --cpu-activations q8", "bench --cpu-activations q8 --exact -p 4 -n 2",
                          "perplexity -f /dev/null --exact --cpu-activations q8"};
    for (size_t i = 0; i < sizeof both / sizeof both[0]; i++) {
        snprintf(args, sizeof args, "%s -m '%s'", both[i], g_model);
        const int rc = run(args);
        if (rc != 1 || !strstr(g_err, "--exact") || !strstr(g_err, "--cpu-activations q8"))
            fail_msg("%s: exit %d, stderr: %s", args, rc, g_err);
        if (strchr(g_err, '\n') != g_err + strlen(g_err) - 1) fail_msg("%s: more than one line: %s", args, g_err);
    }
    snprintf(args, sizeof args, "bench -m '%s' -p 4 -n 2 -r 1 -t 1 --exact --cpu-activations two-level", g_model);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "cpu activations f32 (exact)"));

    snprintf(args, sizeof args, "bench -m '%s' -p 0 -n 0", g_model);
    expect_error(run(args), "-p 0 and -n 0", "nothing to measure");
    snprintf(args, sizeof args, "bench -m '%s' -p 0 -n 0 --batch 2 --depth 16", g_model);
    expect_error(run(args), "-p 0 and -n 0", NULL);
    /* one of them 0 still measures the other */
    snprintf(args, sizeof args, "bench -m '%s' -p 0 -n 2 -r 1 -t 1", g_model);
    assert_int_equal(run(args), 0);
    assert_non_null(strstr(g_out, "\ntg2 "));
    assert_null(strstr(g_out, "\npp"));
    assert_non_null(strstr(g_out, "cpu activations two-level,")); /* the default, named */
    snprintf(args, sizeof args, "bench -m '%s' -p 4 -n 0 -r 1 -t 1 --cpu-activations q8", g_model);
    assert_int_equal(run(args), 0);
    assert_true(g_out[0] == '#');
    assert_non_null(strstr(g_out, "cpu activations q8,"));
    assert_non_null(strstr(g_out, "\npp4 "));
}

/* `osprey CMD --help` (issue 20): exit 0, CMD's own usage on stdout (not the global command list),
 * naming CMD's own flags and their defaults; nothing on stderr. Also after other flags, and for
 * make-random-model, serve and render-template, which printed their own before. */
static void test_subcommand_help(void **state) {
    (void)state;
    static const struct {
        const char *args, *frags[4];
    } cases[] = {
        {"generate --help", {"usage: osprey generate", "--n-predict", "default: 128", "--top-k"}},
        {"generate -n 4 -h", {"usage: osprey generate", "--temp", "default: 0.8", "--kv-cache-dtype"}},
        /* every flag cli_engine_arg takes for them is listed (the hash flags were taken but not shown) */
        {"generate --help", {"--prefix-caching-hash-seed", "--prefix-caching-hash-algo", "--cpu-activations", "--exact"}},
        {"chat --help", {"usage: osprey chat", "--system", "--chat-template", "default: 0.95"}},
        {"chat --help", {"--prefix-caching-hash-seed", "--prefix-caching-hash-algo", "--kv-offload-disk", NULL}},
        {"chat -h", {"/save FILE", "/load FILE", "--no-history", "Ctrl-C stops a reply"}},
        {"bench --help", {"usage: osprey bench", "--repetitions", "default: 3", "--depth"}},
        {"plan --help", {"usage: osprey plan", "--kv-cache-memory", "default: 512M", "--block-size"}},
        {"tokenize --help", {"usage: osprey tokenize", "--no-special", "--no-bos", "--prompt"}},
        {"info --help", {"usage: osprey info", "--model", NULL, NULL}},
        {"bench-kernels --help", {"usage: osprey bench-kernels", "--gate-only", "--hidden", "(14)"}},
        {"make-random-model --help", {"usage: osprey make-random-model", "--preset", "default: f32", NULL}},
        {"serve --help", {"--port", NULL, NULL, NULL}},
        {"render-template --help", {"--messages", NULL, NULL, NULL}},
        {"perplexity --help", {"usage: osprey perplexity", "--kl-base", "default 512", "--save-kl-base"}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int rc = run(cases[c].args);
        if (rc != 0) fail_msg("osprey %s: exit %d; stderr: %s", cases[c].args, rc, g_err);
        if (strstr(g_out, "commands:")) fail_msg("osprey %s printed the global usage:\n%s", cases[c].args, g_out);
        for (int k = 0; k < 4 && cases[c].frags[k]; k++)
            if (!strstr(g_out, cases[c].frags[k]))
                fail_msg("osprey %s: no '%s' in its help:\n%s", cases[c].args, cases[c].frags[k], g_out);
    }
    /* the global usage still answers `osprey --help` and points at the per-command help */
    assert_int_equal(run("--help"), 0);
    assert_non_null(strstr(g_out, "commands:"));
    assert_non_null(strstr(g_out, "<command> --help"));
}

/* `osprey --version` and `osprey version` (issue 20): exit 0, the same text, naming the library's
 * version (a MAJOR.MINOR.PATCH number) and commit, and saying whether CUDA is built in, as this build is. */
static void test_version(void **state) {
    (void)state;
    static char first[sizeof g_out];
    assert_int_equal(run("--version"), 0);
    assert_string_equal(g_err, "");
    memcpy(first, g_out, sizeof first);
    const char *v = osp_version_string();
    unsigned a, b, c;
    char end;
    if (sscanf(v, "%u.%u.%u%c", &a, &b, &c, &end) != 3) fail_msg("the version '%s' is not MAJOR.MINOR.PATCH", v);
    char want[128];
    snprintf(want, sizeof want, "osprey %s", v);
    if (strncmp(g_out, want, strlen(want)) != 0) fail_msg("--version does not start with '%s':\n%s", want, g_out);
    snprintf(want, sizeof want, "commit %s", osp_version_commit());
    if (!strstr(g_out, want)) fail_msg("--version does not name '%s':\n%s", want, g_out);
    const char *cuda = osp_build_has_cuda() ? "CUDA on" : "CUDA off";
    if (!strstr(g_out, cuda)) fail_msg("--version does not say '%s':\n%s", cuda, g_out);
    if (!strstr(g_out, osp_build_has_cuda() ? "\ncuda: on\n" : "\ncuda: off\n")) fail_msg("no cuda line:\n%s", g_out);
    if (!strstr(g_out, "\nc_flags: ")) fail_msg("--version does not give the C flags:\n%s", g_out);
    assert_int_equal(run("version"), 0);
    assert_string_equal(g_out, first);
}

/* bench --output (issue 20): text keeps '<test> <mean> ...' lines under a '# test  t/s' header (mean ±
 * sd); md is llama-bench's table (header, separator, one '| ... | test | mean ± sd |' row per test);
 * csv a header with llama-bench's column names and one row per test; json an array of one object per
 * test with avg_ts, stddev_ts and one samples_ts entry per repetition. A bad format is an error. */
static bool starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

static void test_bench_output(void **state) {
    (void)state;
    char args[1024];
    snprintf(args, sizeof args, "bench -m '%s' -p 8 -n 4 -r 2 -t 1 --output text", g_model);
    assert_int_equal(run(args), 0);
    if (!strstr(g_out, "\n# test ") || !strstr(g_out, " t/s\n") || !strstr(g_out, "\npp8 ") || !strstr(g_out, " ± "))
        fail_msg("bench --output text:\n%s", g_out);
    double mean;
    const char *tg = strstr(g_out, "\ntg4 ");
    if (!tg || sscanf(tg + 5, "%lf", &mean) != 1 || !(mean > 0)) fail_msg("no tg4 mean in:\n%s", g_out);

    snprintf(args, sizeof args, "bench -m '%s' -p 8 -n 4 -r 2 -t 1 -o md", g_model);
    assert_int_equal(run(args), 0);
    if (!starts(g_out, "| model | backend | threads | type_k | type_v | test | t/s |\n| --") ||
        !strstr(g_out, " | pp8 | ") || !strstr(g_out, " | tg4 | ") || !strstr(g_out, " ± ") || strchr(g_out, '#'))
        fail_msg("bench -o md:\n%s", g_out);

    snprintf(args, sizeof args, "bench -m '%s' -p 8 -n 4 -r 2 -t 1 --output csv", g_model);
    assert_int_equal(run(args), 0);
    int lines = 0;
    for (const char *c = g_out; *c; c++) lines += *c == '\n';
    if (lines != 3 || !starts(g_out, "model_filename,backend,n_threads,type_k,type_v,n_prompt,n_gen,") ||
        !strstr(g_out, ",avg_ts,stddev_ts\n") || !strstr(g_out, ",8,0,0,1,pp8,") || !strstr(g_out, ",0,4,0,1,tg4,"))
        fail_msg("bench --output csv:\n%s", g_out);

    snprintf(args, sizeof args, "bench -m '%s' -p 8 -n 4 -r 2 -t 1 --output json", g_model);
    assert_int_equal(run(args), 0);
    json_error_t err;
    json_t *a = json_loads(g_out, 0, &err);
    if (!json_is_array(a) || json_array_size(a) != 2) fail_msg("bench --output json is not an array of 2: %s\n%s", err.text, g_out);
    const char *want[] = {"pp8", "tg4"};
    for (size_t i = 0; i < 2; i++) {
        json_t *r = json_array_get(a, i);
        assert_string_equal(json_string_value(json_object_get(r, "test")), want[i]);
        assert_true(json_real_value(json_object_get(r, "avg_ts")) > 0);
        assert_true(json_is_real(json_object_get(r, "stddev_ts")));
        assert_int_equal(json_array_size(json_object_get(r, "samples_ts")), 2);
        assert_int_equal(json_integer_value(json_object_get(r, i ? "n_gen" : "n_prompt")), i ? 4 : 8);
    }
    json_decref(a);

    snprintf(args, sizeof args, "bench -m '%s' --output xml", g_model);
    expect_error(run(args), "--output", "xml");
}

static int setup(void **state) {
    (void)state;
    g_bin = getenv("OSPREY_BIN");
    g_model = getenv("OSPREY_MODEL");
    if (!g_bin || access(g_bin, X_OK) != 0) {
        fprintf(stderr, "SKIP: OSPREY_BIN is not set or not executable\n");
        exit(77);
    }
    if (!g_model || access(g_model, R_OK) != 0) {
        fprintf(stderr, "SKIP: model not available (%s); run scripts/fetch-model.sh\n", g_model ? g_model : "OSPREY_MODEL unset");
        exit(77);
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/osprey-cli-XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

/* Output that cannot be written fails the command: `plan` and `tokenize` into /dev/full exit non-zero
 * with one error line (they exited 0 having written nothing). */
static void test_write_error(void **state) {
    (void)state;
    if (access("/dev/full", W_OK) != 0) skip();
    static const char *const cmds[] = {"plan -m '%s'", "tokenize -m '%s' -p 'hello there'"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[1024], cmd[4096], e[512];
        snprintf(args, sizeof args, cmds[i], g_model);
        snprintf(e, sizeof e, "%s/err", g_dir);
        snprintf(cmd, sizeof cmd, "'%s' %s >/dev/full 2>'%s' </dev/null", g_bin, args, e);
        const int st = system(cmd);
        slurp(e, g_err, sizeof g_err);
        assert_true(WIFEXITED(st));
        assert_int_not_equal(WEXITSTATUS(st), 0);
        assert_non_null(strstr(g_err, "cannot write the output"));
    }
}

/* serve takes --kernel-table like generate and chat: a table that cannot be read stops start-up (the
 * flag used to be dropped and the server started anyway; timeout ends such a server) */
static void test_serve_kernel_table(void **state) {
    (void)state;
    char cmd[4096], o[512], e[512];
    snprintf(o, sizeof o, "%s/out", g_dir);
    snprintf(e, sizeof e, "%s/err", g_dir);
    snprintf(cmd, sizeof cmd,
             "timeout 60 '%s' serve -m '%s' --host 127.0.0.1 --port 0 --kernel-table '%s/no-such-table.json' >'%s' 2>'%s' "
             "</dev/null",
             g_bin, g_model, g_dir, o, e);
    const int st = system(cmd);
    slurp(e, g_err, sizeof g_err);
    assert_true(WIFEXITED(st));
    assert_int_not_equal(WEXITSTATUS(st), 0);
    assert_int_not_equal(WEXITSTATUS(st), 124); /* not the timeout: start-up refused */
    assert_non_null(strstr(g_err, "no-such-table.json"));
}

/* `osprey perplexity` (issue 13): llama-perplexity's chunks over Debian's GPL-3 text; a run compared
 * with its own saved base has KL exactly 0 and the same top-1 everywhere; fp8 KV against the f16 base
 * a small positive KL and mostly the same top-1 (test_kv_accuracy's bounds); a base from another run,
 * a corrupt base and too short a text are refused with one error line. */
static double ppl_of(const char *out) {
    const char *p = strstr(out, "Final estimate: PPL = ");
    if (!p) fail_msg("no final estimate in: %s", out);
    return atof(p + strlen("Final estimate: PPL = "));
}
static double field_of(const char *out, const char *key) {
    const char *p = strstr(out, key);
    if (!p) fail_msg("no '%s' in: %s", key, out);
    return atof(p + strlen(key));
}
static void test_perplexity(void **state) {
    (void)state;
    const char *text = "/usr/share/common-licenses/GPL-3";
    if (access(text, R_OK) != 0) {
        printf("SKIP perplexity: %s is absent (Debian's base-files)\n", text);
        return;
    }
    char args[2048], base[512];
    snprintf(base, sizeof base, "%s/f16.klb", g_dir);
    snprintf(args, sizeof args, "perplexity -m '%s' -f %s --ctx 64 --chunks 3 -t 2 --save-kl-base '%s'", g_model, text, base);
    if (run(args) != 0) fail_msg("perplexity: %s", g_err);
    const double ppl = ppl_of(g_out);
    assert_true(ppl > 1.0 && ppl < 1000.0);
    assert_non_null(strstr(g_out, "[1]"));
    assert_non_null(strstr(g_out, "[3]"));
    assert_non_null(strstr(g_out, "(93 scored tokens")); /* 3 chunks x (64 - 1 - 32) */

    snprintf(args, sizeof args, "perplexity -m '%s' -f %s --ctx 64 --chunks 3 -t 2 --kl-base '%s'", g_model, text, base);
    if (run(args) != 0) fail_msg("perplexity --kl-base: %s", g_err);
    assert_true(ppl_of(g_out) == ppl);
    assert_true(field_of(g_out, "Mean KLD: ") == 0.0);
    assert_true(field_of(g_out, "Same top: ") == 100.0);

    snprintf(args, sizeof args, "perplexity -m '%s' -f %s --ctx 64 --chunks 3 -t 2 --kl-base '%s' --kv-cache-dtype fp8",
             g_model, text, base);
    if (run(args) != 0) fail_msg("perplexity fp8: %s", g_err);
    const double kld = field_of(g_out, "Mean KLD: "), same = field_of(g_out, "Same top: ");
    if (!(kld > 0.0 && kld < 0.1 && same >= 80.0)) fail_msg("fp8 against f16: KLD %g, same top %g%%", kld, same);

    /* a base from another chunking, a truncated base, too short a text, a bad ctx */
    snprintf(args, sizeof args, "perplexity -m '%s' -f %s --ctx 64 --chunks 2 -t 2 --kl-base '%s'", g_model, text, base);
    expect_error(run(args), "was made from another run", NULL);
    unsigned char *data;
    size_t size;
    {
        FILE *f = fopen(base, "rb");
        assert_non_null(f);
        fseek(f, 0, SEEK_END);
        size = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        data = malloc(size);
        assert_int_equal(fread(data, 1, size, f), size);
        fclose(f);
    }
    char cut[512];
    snprintf(cut, sizeof cut, "%s/cut.klb", g_dir);
    write_file(cut, data, size - 5);
    free(data);
    snprintf(args, sizeof args, "perplexity -m '%s' -f %s --ctx 64 --chunks 3 --kl-base '%s'", g_model, text, cut);
    expect_error(run(args), "cut.klb", "bytes");
    char shorttext[512];
    snprintf(shorttext, sizeof shorttext, "%s/short.txt", g_dir);
    write_file(shorttext, "Only a few words here.", 22);
    snprintf(args, sizeof args, "perplexity -m '%s' -f '%s' --ctx 64", g_model, shorttext);
    expect_error(run(args), "at least 2 x --ctx", NULL);
    snprintf(args, sizeof args, "perplexity -m '%s' -f %s --ctx 3", g_model, text);
    expect_error(run(args), "--ctx", NULL);
}

static int teardown(void **state) {
    (void)state;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* `osprey serve MODEL` (vllm serve's positional form) and serve's TLS flags (issue 20): the argument
 * errors and bad key/certificate pairs are one error line and exit 1, before any model loads (no
 * "loading model" line), and --help lists the flags. Serving over https: tests/integration/test_tls.py. */
static void test_serve_positional_and_tls_flags(void **state) {
    (void)state;
    char args[2048], fix[600];
    const char *root = getenv("OSPREY_ROOT");
    snprintf(fix, sizeof fix, "%s/tests/integration/fixtures/tls", root ? root : ".");
    assert_int_equal(run("serve --help"), 0);
    assert_non_null(strstr(g_out, "usage: osprey serve MODEL"));
    assert_non_null(strstr(g_out, "--ssl-keyfile FILE"));
    assert_non_null(strstr(g_out, "--ssl-certfile FILE"));
    snprintf(args, sizeof args, "serve '%s' -m '%s/other.gguf' --port 0", g_model, g_dir);
    expect_error(run(args), "two different models", "(positional)");
    snprintf(args, sizeof args, "serve '%s' second.gguf --port 0", g_model);
    expect_error(run(args), "unexpected argument 'second.gguf'", NULL);
    expect_error(run("serve --port 0"), "serve needs a model", "osprey serve MODEL");
    snprintf(args, sizeof args, "serve '%s' --port 0 --device cpu --gpu-memory-utilization 0.5", g_model);
    expect_error(run(args), "--gpu-memory-utilization", "--device cuda");
    snprintf(args, sizeof args, "serve '%s' --port 0 --ssl-keyfile '%s/key.pem'", g_model, fix);
    expect_error(run(args), "--ssl-keyfile needs --ssl-certfile too", NULL);
    snprintf(args, sizeof args, "serve '%s' --port 0 --ssl-certfile '%s/cert.pem'", g_model, fix);
    expect_error(run(args), "--ssl-certfile needs --ssl-keyfile too", NULL);
    snprintf(args, sizeof args, "serve '%s' --port 0 --ssl-keyfile '%s/other-key.pem' --ssl-certfile '%s/cert.pem'", g_model,
             fix, fix);
    expect_error(run(args), "do not match", "other-key.pem");
    assert_null(strstr(g_err, "loading model"));
    snprintf(args, sizeof args, "serve '%s' --port 0 --ssl-keyfile '%s/nope.pem' --ssl-certfile '%s/cert.pem'", g_model,
             g_dir, fix);
    expect_error(run(args), "--ssl-keyfile: cannot open", "nope.pem");
    snprintf(args, sizeof args, "serve '%s' --port 0 --ssl-keyfile '%s/key.pem' --ssl-certfile '%s/cert.pem' "
             "--ssl-ca-certs '%s/cert.pem'", g_model, fix, fix, fix);
    expect_error(run(args), "--ssl-ca-certs", "not implemented");
    snprintf(args, sizeof args, "router --backends http://127.0.0.1:9 --port 0 --ssl-keyfile '%s/cert.pem' "
             "--ssl-certfile '%s/cert.pem'", fix, fix);
    expect_error(run(args), "holds no PEM private key", NULL);
}

/* A run on the CPU maps no cuBLASLt, also in a CUDA-enabled build: gemm.cu opens it with the first GPU
 * GEMM context (linked, it cost every run ~140 MB of resident memory: issue 21's peak RSS). ld.so's
 * LD_DEBUG=libs trace names every library it loads, linked or dlopened; that it names libjansson
 * (always linked) shows the trace was read. */
static void test_cpu_run_loads_no_cublaslt(void **state) {
    (void)state;
    char cmd[4096], path[512];
    snprintf(path, sizeof path, "%s/ld-trace", g_dir);
    snprintf(cmd, sizeof cmd,
             "LD_DEBUG=libs '%s' generate -m '%s' --device cpu -p 'The sky is' -n 2 --temp 0 2>'%s' >/dev/null "
             "</dev/null",
             g_bin, g_model, path);
    const int st = system(cmd);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    int jansson = 0, cublas = 0;
    while (fgets(line, sizeof line, f)) {
        jansson += strstr(line, "libjansson") != NULL;
        if (strstr(line, "libcublas")) {
            cublas++;
            printf("  loaded on the CPU: %s", line);
        }
    }
    fclose(f);
    assert_true(jansson > 0);
    assert_int_equal(cublas, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_empty_and_not_gguf),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_unsupported_architecture_and_type),
        cmocka_unit_test(test_bad_flags),
        cmocka_unit_test(test_tokenize_and_info),
        cmocka_unit_test(test_speculative_config),
        cmocka_unit_test(test_generate_greedy),
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_kv_split_flags),
        cmocka_unit_test(test_bench_lines),
        cmocka_unit_test(test_kv_cache_dtype),
        cmocka_unit_test(test_kv_scales),
        cmocka_unit_test(test_subcommand_help),
        cmocka_unit_test(test_exact_activations_and_bench_shape),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_bench_output),
        cmocka_unit_test(test_write_error),
        cmocka_unit_test(test_serve_kernel_table),
        cmocka_unit_test(test_perplexity),
        cmocka_unit_test(test_serve_positional_and_tls_flags),
        cmocka_unit_test(test_cpu_run_loads_no_cublaslt),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
