/* The kernel registry (src/backend/kernel_registry.h) and the runtime selection table
 * (src/backend/kernel_table.h): a table that selects, a table from another arch or driver ignored, a
 * malformed table rejected with a message naming the field, a row whose predicate fails falling back
 * to the default, start-up logging, and `bench-kernels --make-table` (bench/kernels/kb_table.c) on
 * synthetic reports: the fastest version that passed the gate wins, a failed gate disqualifies, two
 * devices in one table are refused. No device is needed: the device is described, not opened. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/kernel_table.h"
#include "bench/kernels/kbench.h"

static const osp_device_info k_h200 = {.device = OSP_DEVICE_CUDA, .name = "NVIDIA H200", .arch = 90, .driver_major = 12};

#define TABLE_HEAD "{\"osprey_kernel_table\": 1, \"device\": \"cuda\", \"gpu\": \"NVIDIA H200\", \"arch\": 90, \"driver_major\": 12, "

static osp_kernel_table *parse_ok(const char *text) {
    osp_kernel_table *t = NULL;
    const osp_status s = osp_kernel_table_parse(text, strlen(text), "test", &t);
    if (s != OSP_OK) fprintf(stderr, "unexpected: %s\n", osp_last_error());
    assert_int_equal(s, OSP_OK);
    assert_non_null(t);
    return t;
}

static void test_registry(void **state) {
    (void)state;
    const osp_kernel_version *v1 = osp_kernel_find(OSP_DEVICE_CUDA, "attention/v1");
    assert_non_null(v1);
    assert_int_equal(v1->kind, OSP_OP_ATTENTION);
    assert_int_equal(v1->number, 1);
    assert_non_null(osp_kernel_find(OSP_DEVICE_CUDA, "attention/v0"));
    assert_non_null(osp_kernel_find(OSP_DEVICE_CUDA, "attention/v2"));
    assert_null(osp_kernel_find(OSP_DEVICE_CPU, "attention/v1"));
    assert_null(osp_kernel_find(OSP_DEVICE_CUDA, "attention/v9"));
    /* every op kind has a default on both backends, and every name is KIND/vN of its kind */
    for (int k = 0; k < OSP_OP_COUNT; k++) {
        const osp_kernel_target t = {.arch = 90, .head_dim = 128, .kv_dtype = OSP_KV_DTYPE_F16};
        assert_non_null(osp_kernel_default(OSP_DEVICE_CPU, (osp_op_kind)k, &t));
        assert_non_null(osp_kernel_default(OSP_DEVICE_CUDA, (osp_op_kind)k, &t));
    }
    for (int i = 0; i < osp_kernel_registry_count(); i++) {
        const osp_kernel_version *v = osp_kernel_registry_at(i);
        char want[64];
        snprintf(want, sizeof want, "%s/v%d", osp_op_name(v->kind), (int)v->number);
        assert_string_equal(v->name, want);
        assert_int_equal(osp_kernel_kind_of(v->name), v->kind);
    }
    /* predicates: v1 needs f16 pages and D 32/64/128, v2 D 64/128; v0 takes D 256 and f32 pages */
    char why[128];
    osp_kernel_target t = {.arch = 90, .head_dim = 256, .kv_dtype = OSP_KV_DTYPE_F16};
    assert_false(osp_kernel_applies(v1, &t, why, sizeof why));
    assert_non_null(strstr(why, "head_dim 256"));
    assert_string_equal(osp_kernel_default(OSP_DEVICE_CUDA, OSP_OP_ATTENTION, &t)->name, "attention/v0");
    t.head_dim = 32;
    assert_false(osp_kernel_applies(osp_kernel_find(OSP_DEVICE_CUDA, "attention/v2"), &t, why, sizeof why));
    assert_true(osp_kernel_applies(v1, &t, why, sizeof why));
    t.head_dim = 128, t.kv_dtype = OSP_KV_DTYPE_F32;
    assert_false(osp_kernel_applies(v1, &t, why, sizeof why));
    assert_string_equal(osp_kernel_default(OSP_DEVICE_CUDA, OSP_OP_ATTENTION, &t)->name, "attention/v0");
    /* quantized pages (issues 13, 14): only v0 reads them; the tensor-core versions never apply, so neither
     * the default nor a table can pick them; the CUDA KV write takes them (nvfp4: head_dim % 16 == 0;
     * int8_hier: an even head_dim) */
    const osp_kv_dtype qdt[3] = {OSP_KV_DTYPE_FP8, OSP_KV_DTYPE_NVFP4, OSP_KV_DTYPE_INT8_HIER};
    for (int q = 0; q < 3; q++) {
        osp_kernel_target tq = {.arch = 90, .head_dim = 128, .kv_dtype = qdt[q]};
        assert_false(osp_kernel_applies(v1, &tq, why, sizeof why));
        assert_false(osp_kernel_applies(osp_kernel_find(OSP_DEVICE_CUDA, "attention/v2"), &tq, why, sizeof why));
        assert_true(osp_kernel_applies(osp_kernel_find(OSP_DEVICE_CUDA, "attention/v0"), &tq, why, sizeof why));
        assert_string_equal(osp_kernel_default(OSP_DEVICE_CUDA, OSP_OP_ATTENTION, &tq)->name, "attention/v0");
        assert_true(osp_kernel_applies(osp_kernel_find(OSP_DEVICE_CUDA, "rope_kv_write/v0"), &tq, why, sizeof why));
    }
    const osp_kernel_target todd = {.arch = 90, .head_dim = 63, .kv_dtype = OSP_KV_DTYPE_INT8_HIER};
    assert_false(osp_kernel_applies(osp_kernel_find(OSP_DEVICE_CUDA, "rope_kv_write/v0"), &todd, why, sizeof why));
    assert_non_null(strstr(why, "even head_dim"));
    t.kv_dtype = OSP_KV_DTYPE_F16, t.arch = 100;
    assert_false(osp_kernel_applies(v1, &t, why, sizeof why));
    assert_non_null(strstr(why, "sm_90a"));
    /* only the CUDA attention versions are the table's to choose */
    assert_int_equal(osp_kernel_choosable_count(OSP_DEVICE_CUDA, OSP_OP_ATTENTION), 3);
    assert_int_equal(osp_kernel_choosable_count(OSP_DEVICE_CPU, OSP_OP_MATMUL), 0);
}

static void test_table_selects(void **state) {
    (void)state;
    osp_kernel_table *t = parse_ok(TABLE_HEAD "\"rows\": ["
                                   "{\"op\": \"attention\", \"head_dim\": 128, \"kv_dtype\": \"f16\", \"version\": \"attention/v0\"},"
                                   "{\"op\": \"attention\", \"head_dim\": 0, \"kv_dtype\": \"any\", \"version\": \"attention/v1\", "
                                   "\"evidence\": {\"workloads\": 3}}]}");
    assert_int_equal(t->n_rows, 2);
    osp_kernel_target tg = {.arch = 90, .head_dim = 128, .kv_dtype = OSP_KV_DTYPE_F16};
    osp_kernel_choice c = osp_kernel_table_choose(t, &k_h200, &tg, OSP_OP_ATTENTION);
    assert_true(c.from_table);
    assert_string_equal(c.version->name, "attention/v0"); /* the row, not the default (v1) */
    tg.head_dim = 64; /* the second row: any head_dim */
    c = osp_kernel_table_choose(t, &k_h200, &tg, OSP_OP_ATTENTION);
    assert_true(c.from_table);
    assert_string_equal(c.version->name, "attention/v1");
    /* a kind without a row: its default */
    c = osp_kernel_table_choose(t, &k_h200, &tg, OSP_OP_MATMUL);
    assert_false(c.from_table);
    assert_string_equal(c.version->name, "matmul/v0");
    /* no table: the default */
    c = osp_kernel_table_choose(NULL, &k_h200, &tg, OSP_OP_ATTENTION);
    assert_false(c.from_table);
    assert_string_equal(c.version->name, osp_kernel_default(OSP_DEVICE_CUDA, OSP_OP_ATTENTION, &tg)->name);
    osp_kernel_table_free(t);
}

static void test_other_arch_ignored(void **state) {
    (void)state;
    osp_kernel_table *t = parse_ok(TABLE_HEAD "\"rows\": [{\"op\": \"attention\", \"head_dim\": 128, \"kv_dtype\": \"f16\", "
                                              "\"version\": \"attention/v0\"}]}");
    const osp_kernel_target tg = {.arch = 100, .head_dim = 128, .kv_dtype = OSP_KV_DTYPE_F16};
    osp_device_info b200 = k_h200;
    b200.arch = 100;
    snprintf(b200.name, sizeof b200.name, "NVIDIA B200");
    char why[256];
    assert_false(osp_kernel_table_matches(t, &b200, why, sizeof why));
    assert_non_null(strstr(why, "arch 90"));
    osp_kernel_choice c = osp_kernel_table_choose(t, &b200, &tg, OSP_OP_ATTENTION);
    assert_false(c.from_table);
    assert_non_null(strstr(c.why, "table ignored"));
    /* another driver major on the same arch: ignored too */
    osp_device_info newer = k_h200;
    newer.driver_major = 13;
    const osp_kernel_target t90 = {.arch = 90, .head_dim = 128, .kv_dtype = OSP_KV_DTYPE_F16};
    c = osp_kernel_table_choose(t, &newer, &t90, OSP_OP_ATTENTION);
    assert_false(c.from_table);
    assert_non_null(strstr(c.why, "driver 12"));
    /* another backend */
    const osp_device_info cpu = {.device = OSP_DEVICE_CPU, .name = "cpu"};
    assert_false(osp_kernel_table_matches(t, &cpu, why, sizeof why));
    osp_kernel_table_free(t);
}

static void test_malformed_rejected(void **state) {
    (void)state;
    static const struct {
        const char *text, *says;
    } bad[] = {
        {"not json", "not JSON"},
        {"[1, 2]", "not a JSON object"},
        {TABLE_HEAD "\"rows\": [], \"colour\": 1}", "unknown field 'colour'"},
        {"{\"osprey_kernel_table\": 2, \"device\": \"cuda\", \"gpu\": \"x\", \"arch\": 90, \"driver_major\": 12, \"rows\": []}",
         "osprey_kernel_table must be 1"},
        {"{\"osprey_kernel_table\": 1, \"device\": \"tpu\", \"gpu\": \"x\", \"arch\": 90, \"driver_major\": 12, \"rows\": []}",
         "device must be"},
        {"{\"osprey_kernel_table\": 1, \"device\": \"cuda\", \"gpu\": \"x\", \"arch\": \"90\", \"driver_major\": 12, \"rows\": []}",
         "arch and driver_major"},
        {TABLE_HEAD "\"rows\": {}}", "rows must be an array"},
        {TABLE_HEAD "\"rows\": [3]}", "rows[0] is not an object"},
        {TABLE_HEAD "\"rows\": [{\"op\": \"attention\", \"head_dim\": 128, \"kv_dtype\": \"f16\", \"version\": \"attention/v7\"}]}",
         "'attention/v7' is not a registered cuda version"},
        {TABLE_HEAD "\"rows\": [{\"op\": \"attentoin\", \"head_dim\": 128, \"kv_dtype\": \"f16\", \"version\": \"attention/v1\"}]}",
         "unknown op kind 'attentoin'"},
        {TABLE_HEAD "\"rows\": [{\"op\": \"matmul\", \"head_dim\": 0, \"kv_dtype\": \"f16\", \"version\": \"attention/v1\"}]}",
         "is not of op 'matmul'"},
        {TABLE_HEAD "\"rows\": [{\"op\": \"matmul\", \"head_dim\": 0, \"kv_dtype\": \"f16\", \"version\": \"matmul/v0\"}]}",
         "not a version a table may choose"},
        {TABLE_HEAD "\"rows\": [{\"op\": \"attention\", \"head_dim\": -4, \"kv_dtype\": \"f16\", \"version\": \"attention/v1\"}]}",
         "head_dim must be"},
        {TABLE_HEAD "\"rows\": [{\"op\": \"attention\", \"head_dim\": 64, \"kv_dtype\": \"q8\", \"version\": \"attention/v1\"}]}",
         "kv_dtype 'q8'"},
        {TABLE_HEAD "\"rows\": [{\"op\": \"attention\", \"head_dim\": 64, \"kv_dtype\": \"f16\", \"version\": \"attention/v1\", "
                    "\"batch\": 8}]}",
         "unknown field 'batch'"},
        {TABLE_HEAD "\"rows\": [{\"op\": \"attention\", \"head_dim\": 64, \"kv_dtype\": \"f16\", \"version\": \"attention/v1\"},"
                    "{\"op\": \"attention\", \"head_dim\": 64, \"kv_dtype\": \"f16\", \"version\": \"attention/v0\"}]}",
         "repeats the bucket"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        osp_kernel_table *t = (osp_kernel_table *)1;
        const osp_status s = osp_kernel_table_parse(bad[i].text, strlen(bad[i].text), "bad.json", &t);
        if (s != OSP_ERR_FORMAT || !strstr(osp_last_error(), bad[i].says))
            fprintf(stderr, "case %zu: status %d, message '%s', wanted '%s'\n", i, (int)s, osp_last_error(), bad[i].says);
        assert_int_equal(s, OSP_ERR_FORMAT);
        assert_null(t);
        assert_non_null(strstr(osp_last_error(), bad[i].says));
        assert_non_null(strstr(osp_last_error(), "bad.json"));
    }
    osp_kernel_table *t = NULL;
    assert_int_equal(osp_kernel_table_load("/nonexistent/table.json", &t), OSP_ERR_IO);
    assert_null(t);
}

static void test_predicate_fallback(void **state) {
    (void)state;
    /* a row for any head_dim naming v1, which needs D 32/64/128 and f16 pages */
    osp_kernel_table *t = parse_ok(TABLE_HEAD "\"rows\": [{\"op\": \"attention\", \"head_dim\": 0, \"kv_dtype\": \"any\", "
                                              "\"version\": \"attention/v1\"}]}");
    osp_kernel_target tg = {.arch = 90, .head_dim = 256, .kv_dtype = OSP_KV_DTYPE_F16};
    osp_kernel_choice c = osp_kernel_table_choose(t, &k_h200, &tg, OSP_OP_ATTENTION);
    assert_false(c.from_table);
    assert_string_equal(c.version->name, "attention/v0");
    assert_non_null(strstr(c.why, "does not apply"));
    tg.head_dim = 128, tg.kv_dtype = OSP_KV_DTYPE_F32;
    c = osp_kernel_table_choose(t, &k_h200, &tg, OSP_OP_ATTENTION);
    assert_false(c.from_table);
    assert_string_equal(c.version->name, "attention/v0");
    tg.kv_dtype = OSP_KV_DTYPE_F16;
    c = osp_kernel_table_choose(t, &k_h200, &tg, OSP_OP_ATTENTION);
    assert_true(c.from_table);
    assert_string_equal(c.version->name, "attention/v1");
    osp_kernel_table_free(t);
}

typedef struct lines {
    int n;
    char text[8][640];
} lines;

static void collect(void *ctx, const char *line) {
    lines *l = ctx;
    if (l->n < 8) snprintf(l->text[l->n++], sizeof l->text[0], "%s", line);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* start-up on this machine's CPU: a CUDA table is ignored with a line, a CPU table is read and
 * logged, a malformed one fails, $OSPREY_KERNEL_TABLE is the default path, none at all is silent */
static void test_apply_at_startup(void **state) {
    (void)state;
    char dir[] = "/tmp/osp_ktable_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char cuda_p[64], cpu_p[64], bad_p[64];
    snprintf(cuda_p, sizeof cuda_p, "%s/cuda.json", dir);
    snprintf(cpu_p, sizeof cpu_p, "%s/cpu.json", dir);
    snprintf(bad_p, sizeof bad_p, "%s/bad.json", dir);
    write_file(cuda_p, TABLE_HEAD "\"rows\": [{\"op\": \"attention\", \"head_dim\": 64, \"kv_dtype\": \"f16\", \"version\": \"attention/v0\"}]}");
    write_file(cpu_p, "{\"osprey_kernel_table\": 1, \"device\": \"cpu\", \"gpu\": \"any\", \"arch\": 0, \"driver_major\": 0, \"rows\": []}");
    write_file(bad_p, "{\"osprey_kernel_table\": 1,");
    unsetenv("OSPREY_KERNEL_TABLE");
    lines l = {0};
    assert_int_equal(osp_kernel_table_apply(NULL, OSP_DEVICE_CPU, 64, OSP_KV_DTYPE_F16, collect, &l), OSP_OK);
    assert_int_equal(l.n, 0);
    assert_int_equal(osp_kernel_table_apply(cuda_p, OSP_DEVICE_CPU, 64, OSP_KV_DTYPE_F16, collect, &l), OSP_OK);
    assert_int_equal(l.n, 1);
    assert_non_null(strstr(l.text[0], "ignored"));
    assert_non_null(strstr(l.text[0], "cuda backend"));
    l.n = 0;
    setenv("OSPREY_KERNEL_TABLE", cpu_p, 1);
    assert_int_equal(osp_kernel_table_apply(NULL, OSP_DEVICE_CPU, 64, OSP_KV_DTYPE_F16, collect, &l), OSP_OK);
    assert_int_equal(l.n, 1);
    assert_non_null(strstr(l.text[0], cpu_p));
    assert_non_null(strstr(l.text[0], "0 rows"));
    unsetenv("OSPREY_KERNEL_TABLE");
    assert_int_equal(osp_kernel_table_apply(bad_p, OSP_DEVICE_CPU, 64, OSP_KV_DTYPE_F16, collect, &l), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "bad.json"));
    unlink(cuda_p), unlink(cpu_p), unlink(bad_p), rmdir(dir);
}

/* ---- --make-table ------------------------------------------------------------------------------- */

/* one result entry: solution on an attention definition at head_dim D, three workloads with these
 * medians (0: gate failed there) */
static void entry(FILE *f, bool comma, const char *sol, const char *ver, int D, const double us[3], const char *dev) {
    fprintf(f, "%s{\"solution\": \"%s\", \"definition\": \"attention_d%d\", \"op\": \"attention\", \"device\": %s, \"workloads\": [",
            comma ? "," : "", sol, D, dev);
    for (int w = 0; w < 3; w++) {
        fprintf(f, "%s{\"workload\": \"w%d\", \"gen\": \"normal\", \"dims\": {\"B\": %d, \"D\": %d}, \"gate\": \"%s\", \"version\": \"%s\"",
                w ? "," : "", w, w + 1, D, us[w] > 0 ? "ok" : "error", ver);
        if (us[w] > 0) fprintf(f, ", \"timing\": {\"median_us\": %g}", us[w]);
        fprintf(f, "}");
    }
    fprintf(f, "]}");
}

#define DEV_H200 "{\"backend\": \"cuda\", \"name\": \"NVIDIA H200\", \"arch\": 90, \"driver_major\": 12}"
#define DEV_B200 "{\"backend\": \"cuda\", \"name\": \"NVIDIA B200\", \"arch\": 100, \"driver_major\": 12}"

static void test_make_table(void **state) {
    (void)state;
    char dir[] = "/tmp/osp_mktable_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char r1[64], r2[64], r3[64], out[64];
    snprintf(r1, sizeof r1, "%s/v0.json", dir);
    snprintf(r2, sizeof r2, "%s/v1.json", dir);
    snprintf(r3, sizeof r3, "%s/b200.json", dir);
    snprintf(out, sizeof out, "%s/table.json", dir);
    /* report 1: v0 everywhere; report 2: v1, faster at D 128, failing one gate at D 64 */
    const double v0_128[3] = {100, 200, 300}, v1_128[3] = {50, 90, 160}, v0_64[3] = {40, 50, 60}, v1_64[3] = {10, 0, 10};
    FILE *f = fopen(r1, "w");
    fprintf(f, "{\"gate_only\": false, \"results\": [");
    entry(f, false, "cuda:attention/v0", "attention/v0", 128, v0_128, DEV_H200);
    entry(f, true, "cuda:attention/v0", "attention/v0", 64, v0_64, DEV_H200);
    fprintf(f, "]}");
    fclose(f);
    f = fopen(r2, "w");
    fprintf(f, "{\"gate_only\": false, \"results\": [");
    entry(f, false, "cuda", "attention/v1", 128, v1_128, DEV_H200);
    entry(f, true, "cuda", "attention/v1", 64, v1_64, DEV_H200);
    fprintf(f, "]}");
    fclose(f);
    const char *both[] = {r1, r2};
    char summary[4096], err[1024];
    if (!kb_make_table(2, both, out, summary, sizeof summary, err, sizeof err)) fprintf(stderr, "%s\n", err);
    osp_kernel_table *t = NULL;
    assert_int_equal(osp_kernel_table_load(out, &t), OSP_OK);
    assert_int_equal(t->arch, 90);
    assert_int_equal(t->driver_major, 12);
    assert_string_equal(t->gpu, "NVIDIA H200");
    /* D 128: v1 wins; D 64: v1 failed a gate, only v0 qualified: no row */
    assert_int_equal(t->n_rows, 1);
    assert_int_equal(t->rows[0].head_dim, 128);
    assert_string_equal(t->rows[0].version->name, "attention/v1");
    assert_non_null(strstr(summary, "attention/v1 out (gate: attention_d64 w1: error)"));
    const osp_kernel_target tg = {.arch = 90, .head_dim = 128, .kv_dtype = OSP_KV_DTYPE_F16};
    osp_kernel_choice c = osp_kernel_table_choose(t, &k_h200, &tg, OSP_OP_ATTENTION);
    assert_true(c.from_table);
    assert_string_equal(c.version->name, "attention/v1");
    osp_kernel_table_free(t);
    /* two devices in one table: refused */
    f = fopen(r3, "w");
    fprintf(f, "{\"gate_only\": false, \"results\": [");
    entry(f, false, "cuda", "attention/v1", 128, v1_128, DEV_B200);
    fprintf(f, "]}");
    fclose(f);
    const char *mixed[] = {r1, r3};
    assert_false(kb_make_table(2, mixed, out, summary, sizeof summary, err, sizeof err));
    assert_non_null(strstr(err, "one device"));
    /* a report that is not one */
    const char *none[] = {"/nonexistent.json"};
    assert_false(kb_make_table(1, none, out, summary, sizeof summary, err, sizeof err));
    assert_non_null(strstr(err, "not a JSON report"));
    unlink(r1), unlink(r2), unlink(r3), unlink(out), rmdir(dir);
}

/* the solution names: versions, kinds, the old +KEY=VALUE form */
static void test_solution_names(void **state) {
    (void)state;
    kb_solution_spec sp;
    char err[256];
    assert_true(kb_solution_parse("cuda:attention/v1", &sp, err, sizeof err));
    assert_string_equal(sp.base, "cuda");
    assert_int_equal(sp.only_kind, OSP_OP_ATTENTION);
    assert_string_equal(sp.version->name, "attention/v1");
    assert_true(kb_solution_parse("cpu:matmul/v0", &sp, err, sizeof err));
    assert_string_equal(sp.base, "cpu-exact");
    assert_true(kb_solution_parse("cuda+OSPREY_CUDA_ATTENTION=v0", &sp, err, sizeof err));
    assert_null(sp.version);
    assert_int_equal(sp.only_kind, OSP_OP_COUNT);
    assert_string_equal(sp.settings, "+OSPREY_CUDA_ATTENTION=v0");
    assert_true(kb_solution_parse("cuda:attention", &sp, err, sizeof err));
    assert_null(sp.version);
    assert_false(kb_solution_parse("cuda:attention/v9", &sp, err, sizeof err));
    assert_non_null(strstr(err, "no version 'attention/v9'"));
    assert_false(kb_solution_parse("cpu:attention/v1", &sp, err, sizeof err));
    assert_false(kb_solution_parse("cuda:atention/v1", &sp, err, sizeof err));
    assert_false(kb_solution_parse("cuda+NOEQUALS", &sp, err, sizeof err));
    assert_false(kb_solution_parse("tpu", &sp, err, sizeof err));
    assert_false(kb_solution_parse("cpu-exact:matmul/v0", &sp, err, sizeof err));
    /* the version a solution runs: named, by setting, or the default for the shape */
    kb_def d = {.kind = OSP_OP_ATTENTION, .n_dims = 2};
    snprintf(d.dims[0].name, sizeof d.dims[0].name, "B");
    snprintf(d.dims[1].name, sizeof d.dims[1].name, "D");
    const int64_t d128[2] = {1, 128}, d256[2] = {1, 256};
    char ver[64];
    assert_true(kb_solution_version("cuda+OSPREY_CUDA_ATTENTION=v0", &d, d128, 90, ver, sizeof ver));
    assert_string_equal(ver, "attention/v0");
    assert_true(kb_solution_version("cuda:attention/v1", &d, d128, 90, ver, sizeof ver));
    assert_string_equal(ver, "attention/v1");
    assert_true(kb_solution_version("cuda", &d, d256, 90, ver, sizeof ver));
    assert_string_equal(ver, "attention/v0");
    assert_true(kb_solution_version("cpu", &d, d128, 0, ver, sizeof ver));
    assert_string_equal(ver, "attention/v0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),          cmocka_unit_test(test_table_selects),
        cmocka_unit_test(test_other_arch_ignored), cmocka_unit_test(test_malformed_rejected),
        cmocka_unit_test(test_predicate_fallback), cmocka_unit_test(test_apply_at_startup),
        cmocka_unit_test(test_make_table),         cmocka_unit_test(test_solution_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
