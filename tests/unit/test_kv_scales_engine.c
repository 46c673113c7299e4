/* --kv-scales at the engine (osp_engine_params.kv_scales_path, issue 13): the scales of a file reach
 * the quantized cache the engine creates (fp8: per layer and KV head; nvfp4: per layer), the defaults
 * stay without one, and a bad file (another model's shape, truncated, missing) fails
 * osp_engine_create with one clear error and no engine. Model: tests/models/tiny-llama-f32.gguf. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/kv_layout.h"
#include "core/status_internal.h"
#include "engine/engine_internal.h"
#include "format/kv_scales.h"
#include "kv/kv_cache.h"
#include "osprey/engine.h"
#include "osprey/model.h"

static char g_tiny[512];
static int32_t g_L, g_H, g_D;

static osp_engine_params base(osp_kv_dtype d, const char *scales) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = g_tiny;
    p.n_threads = 1;
    p.kv_dtype = d;
    p.max_model_len = 64;
    p.num_blocks = 16;
    p.kv_scales_path = scales;
    return p;
}

/* a file for the tiny model (or another shape) with distinct scales; returns its path in buf */
static void write_file(char *buf, size_t n, int32_t L, int32_t H, int32_t D) {
    snprintf(buf, n, "/tmp/osp_kvs_eng_XXXXXX");
    const int fd = mkstemp(buf);
    assert_true(fd >= 0);
    close(fd);
    osp_kv_scales s;
    assert_int_equal(osp_kv_scales_init(&s, (uint32_t)L, (uint32_t)H, (uint32_t)D), OSP_OK);
    for (int32_t i = 0; i < L * H; i++) s.fp8_k[i] = 0.125f + 0.01f * (float)i, s.fp8_v[i] = 0.5f + 0.02f * (float)i;
    for (int32_t i = 0; i < L; i++) s.nvfp4_k[i] = 0.25f * (float)(i + 1), s.nvfp4_v[i] = 0.003f * (float)(i + 1);
    assert_int_equal(osp_kv_scales_save(buf, &s), OSP_OK);
    osp_kv_scales_free(&s);
}

static void test_scales_reach_the_cache(void **st) {
    (void)st;
    char path[64];
    write_file(path, sizeof path, g_L, g_H, g_D);
    osp_kv_scales want;
    assert_int_equal(osp_kv_scales_load(path, &want), OSP_OK);
    const osp_kv_dtype dts[2] = {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4};
    for (int d = 0; d < 2; d++) {
        const int32_t per = dts[d] == OSP_KV_DTYPE_FP8 ? g_H : 1;
        const size_t n = (size_t)g_L * (size_t)per;
        const float *wk, *wv;
        osp_kv_scales_for(&want, dts[d], dts[d], &wk, &wv);
        /* with the file: the cache's fixed scales are the file's */
        osp_engine_params p = base(dts[d], path);
        osp_engine *e = NULL;
        if (osp_engine_create(&p, &e) != OSP_OK) fail_msg("create: %s", osp_last_error());
        const osp_kv_cache *kv = osp_engine_kv_cache(e);
        assert_int_equal(kv->k_fmt.fixed_scales_per_layer, per);
        assert_int_equal(kv->v_fmt.fixed_scales_per_layer, per);
        assert_memory_equal(kv->k_fixed, wk, n * sizeof(float));
        assert_memory_equal(kv->v_fixed, wv, n * sizeof(float));
        osp_engine_free(e);
        /* without: the documented defaults */
        p = base(dts[d], NULL);
        assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
        const float dflt = dts[d] == OSP_KV_DTYPE_FP8 ? OSP_KV_FP8_DEFAULT_SCALE : OSP_KV_NVFP4_DEFAULT_TENSOR_SCALE;
        for (size_t i = 0; i < n; i++) {
            assert_true(osp_engine_kv_cache(e)->k_fixed[i] == dflt);
            assert_true(osp_engine_kv_cache(e)->v_fixed[i] == dflt);
        }
        osp_engine_free(e);
    }
    /* a split cache, K fp8 + V nvfp4: K takes the file's fp8 K scales (per layer and head), V its nvfp4
     * V scales (per layer) */
    osp_engine_params p = base(OSP_KV_DTYPE_FP8, path);
    p.kv_dtype_v = OSP_KV_DTYPE_NVFP4, p.kv_dtype_v_set = true;
    osp_engine *e = NULL;
    if (osp_engine_create(&p, &e) != OSP_OK) fail_msg("create split: %s", osp_last_error());
    const osp_kv_cache *skv = osp_engine_kv_cache(e);
    assert_int_equal(skv->k_fmt.dtype, OSP_KV_DTYPE_FP8), assert_int_equal(skv->v_fmt.dtype, OSP_KV_DTYPE_NVFP4);
    assert_memory_equal(skv->k_fixed, want.fp8_k, (size_t)g_L * (size_t)g_H * sizeof(float));
    assert_memory_equal(skv->v_fixed, want.nvfp4_v, (size_t)g_L * sizeof(float));
    osp_engine_free(e);
    /* an f16 cache takes a valid file and has no fixed scales */
    p = base(OSP_KV_DTYPE_F16, path);
    e = NULL;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    assert_null(osp_engine_kv_cache(e)->k_fixed);
    osp_engine_free(e);
    osp_kv_scales_free(&want);
    remove(path);
}

static void test_bad_files(void **st) {
    (void)st;
    char path[64];
    /* another model's shape: each count in turn */
    const int32_t shapes[3][3] = {{g_L + 1, g_H, g_D}, {g_L, g_H + 1, g_D}, {g_L, g_H, g_D * 2}};
    for (int k = 0; k < 3; k++) {
        write_file(path, sizeof path, shapes[k][0], shapes[k][1], shapes[k][2]);
        osp_engine_params p = base(OSP_KV_DTYPE_FP8, path);
        osp_engine *e = (osp_engine *)1;
        assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_INVALID_ARG);
        assert_null(e);
        assert_non_null(strstr(osp_last_error(), "another model"));
        assert_non_null(strstr(osp_last_error(), path));
        remove(path);
    }
    /* truncated: refused before the model loads */
    write_file(path, sizeof path, g_L, g_H, g_D);
    assert_int_equal(truncate(path, 30), 0);
    osp_engine_params p = base(OSP_KV_DTYPE_NVFP4, path);
    osp_engine *e = (osp_engine *)1;
    assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_FORMAT);
    assert_null(e);
    assert_non_null(strstr(osp_last_error(), "truncated"));
    remove(path);
    /* missing */
    p = base(OSP_KV_DTYPE_FP8, "/nonexistent/scales.kvs");
    assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_IO);
    assert_null(e);
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    snprintf(g_tiny, sizeof g_tiny, "%s/tests/models/tiny-llama-f32.gguf", root ? root : ".");
    osp_model_params mp = osp_model_default_params();
    mp.n_threads = 1;
    mp.device = OSP_DEVICE_CPU;
    osp_model *m;
    if (osp_model_load(g_tiny, &mp, &m) != OSP_OK) {
        fprintf(stderr, "SKIP: %s: %s\n", g_tiny, osp_last_error());
        return 77;
    }
    const osp_model_config *c = osp_model_config_get(m);
    g_L = c->n_layer, g_H = c->n_head_kv, g_D = c->head_dim;
    osp_model_free(m);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scales_reach_the_cache),
        cmocka_unit_test(test_bad_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
