/* The kernel proving ground (bench/kernels/) against bugs planted on purpose: a solution that skips
 * the last element (a tail), one whose bits change from run to run (a race between threads or warps),
 * one that ignores part of an input where the tolerance is loose enough to hide it, one that returns
 * a cached result; each must fail the gate at the check meant for it, and the honest solution (the
 * reference itself, rounded to fp32) must pass every definition. Also: the definition loader rejects
 * what it does not know, a hung or crashing child fails alone, and a timed report carries the
 * ceilings, the fraction of them reached, the setup time and the clock its times are by, and --no-big
 * leaves the big listed workloads out. */
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "bench/kernels/kbench.h"

enum { HONEST, TAIL, RACE, IGNORE_LAST_K, CACHED };

typedef struct plant {
    int bug;
    int calls;
    float *cache[KB_MAX_IO];
} plant;

static bool p_supports(kb_solution *s, const kb_case *c, char *why, size_t n) {
    (void)s, (void)c, (void)why, (void)n;
    return true;
}
static bool p_prepare(kb_solution *s, const kb_case *c, char *err, size_t n) {
    (void)s, (void)c, (void)err, (void)n;
    return true;
}

static bool p_run(kb_solution *s, const kb_case *c, float **out, char *err, size_t n) {
    (void)err, (void)n;
    plant *p = s->state;
    p->calls++;
    const int no = c->def->n_out;
    float *tmp[KB_MAX_IO] = {0};
    for (int i = 0; i < no; i++) tmp[i] = malloc(c->out_n[i] * sizeof(float) + 4);
    kb_case_reference_f32(c, tmp);
    switch (p->bug) {
    case TAIL: /* every element but the very last one */
        for (int i = 0; i < no; i++) memcpy(out[i], tmp[i], (c->out_n[i] - (i == no - 1 ? 1 : 0)) * sizeof(float));
        break;
    case RACE: /* every other run, one element one ulp off */
        for (int i = 0; i < no; i++) memcpy(out[i], tmp[i], c->out_n[i] * sizeof(float));
        if (p->calls % 2 == 0) {
            const size_t k = (size_t)p->calls % c->out_n[0];
            out[0][k] = nextafterf(out[0][k], INFINITY);
        }
        break;
    case IGNORE_LAST_K: { /* matmul without the last column of x and w */
        const int64_t T = c->dim[0], K = c->dim[1], N = c->dim[2];
        for (int64_t t = 0; t < T; t++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0.0;
                for (int64_t k = 0; k < K - 1; k++) acc += (double)c->in[0][t * K + k] * (double)c->in[1][j * K + k];
                out[0][t * N + j] = (float)acc;
            }
        break;
    }
    case CACHED: /* the first answer, forever */
        for (int i = 0; i < no; i++) {
            if (!p->cache[i]) {
                p->cache[i] = malloc(c->out_n[i] * sizeof(float) + 4);
                memcpy(p->cache[i], tmp[i], c->out_n[i] * sizeof(float));
            }
            memcpy(out[i], p->cache[i], c->out_n[i] * sizeof(float));
        }
        break;
    default:
        for (int i = 0; i < no; i++) memcpy(out[i], tmp[i], c->out_n[i] * sizeof(float));
    }
    for (int i = 0; i < no; i++) free(tmp[i]);
    return true;
}

static kb_solution planted(plant *p, int bug) {
    memset(p, 0, sizeof *p);
    p->bug = bug;
    return (kb_solution){.name = "planted", .device = "cpu", .state = p, .supports = p_supports,
                         .prepare = p_prepare, .run = p_run};
}
static void plant_free(plant *p) {
    for (int i = 0; i < KB_MAX_IO; i++) free(p->cache[i]);
}

static const char *defs_dir(void) {
    static char dir[512];
    const char *root = getenv("OSPREY_ROOT");
    snprintf(dir, sizeof dir, "%s/bench/kernels/defs", root ? root : ".");
    return dir;
}

static void load(const char *name, kb_def *d) {
    char path[600], err[512];
    snprintf(path, sizeof path, "%s/%s.json", defs_dir(), name);
    if (!kb_def_load(path, d, err, sizeof err)) fail_msg("%s", err);
}

/* the gate over every workload of d (+ hidden); returns the first failing check, KB_OK if none */
static kb_check gate_all(kb_solution *s, kb_def *d, char *detail, size_t n) {
    for (int w = 0; w < d->n_workloads; w++) {
        if (d->wl[w].big) continue; /* device-sized: their references take minutes here (--no-big) */
        const kb_gate_result r = kb_gate(s, d, &d->wl[w], 1000u + (uint64_t)w, 2);
        if (r.check != KB_OK) {
            snprintf(detail, n, "%s: %s", d->wl[w].id, r.detail);
            return r.check;
        }
    }
    return KB_OK;
}

static void test_honest_passes_every_definition(void **state) {
    (void)state;
    kb_def *defs = NULL;
    char err[512];
    const int n = kb_defs_load_dir(defs_dir(), &defs, err, sizeof err);
    if (n < 0) fail_msg("%s", err);
    assert_true(n >= 9);
    bool kinds[OSP_OP_COUNT] = {0};
    for (int i = 0; i < n; i++) {
        kinds[defs[i].kind] = true;
        assert_true(defs[i].n_workloads >= 6); /* listed; the CLI adds the hidden ones */
        kb_def_add_hidden(&defs[i], 4, 77u + (uint64_t)i);
        plant p;
        kb_solution s = planted(&p, HONEST);
        char detail[512] = "";
        const kb_check k = gate_all(&s, &defs[i], detail, sizeof detail);
        if (k != KB_OK) fail_msg("honest solution failed %s (%s): %s", defs[i].name, kb_check_name(k), detail);
        plant_free(&p);
    }
    /* every op kind has a definition */
    for (int k = 0; k < OSP_OP_COUNT; k++)
        if (!kinds[k]) fail_msg("no definition of op %s", osp_op_name((osp_op_kind)k));
    free(defs);
}

static void expect_fail(int bug, kb_def *d, kb_check want) {
    plant p;
    kb_solution s = planted(&p, bug);
    char detail[512] = "";
    const kb_check k = gate_all(&s, d, detail, sizeof detail);
    printf("  planted bug %d on %s: gate says %s: %s\n", bug, d->name, kb_check_name(k), detail);
    assert_int_equal(k, want);
    plant_free(&p);
}

static void test_tail_fails_coverage(void **state) {
    (void)state;
    kb_def d;
    load("add_rmsnorm", &d);
    expect_fail(TAIL, &d, KB_FAIL_COVERAGE);
}

static void test_race_fails_determinism(void **state) {
    (void)state;
    kb_def d;
    load("add_rmsnorm", &d); /* y's tolerance (2^-8) lets one ulp through: only the second run shows it */
    expect_fail(RACE, &d, KB_FAIL_DETERMINISM);
}

static void test_cached_fails_dependence(void **state) {
    (void)state;
    kb_def d;
    load("glu_silu", &d);
    expect_fail(CACHED, &d, KB_FAIL_DEPENDENCE);
}

/* A matmul definition whose tolerance (atol 0.2 of max |y|) is loose enough that dropping one
 * column of K passes the error check: the dependence check must still catch it. */
static void test_ignored_input_fails_dependence(void **state) {
    (void)state;
    char path[] = "/tmp/kbench_defXXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char def[] =
        "{\"name\": \"matmul_loose\", \"op\": \"matmul\", \"description\": \"a test's loose matmul\",\n"
        " \"dims\": {\"T\": {\"min\": 1, \"max\": 4}, \"K\": {\"min\": 32, \"max\": 256}, \"N\": {\"min\": 1, \"max\": 64}},\n"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"K\"], \"dtype\": \"bf16\"},\n"
        "            {\"name\": \"w\", \"shape\": [\"N\", \"K\"], \"dtype\": \"bf16\"}],\n"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"N\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0.2}}],\n"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 2, \"K\": 256, \"N\": 16}}]}\n";
    assert_int_equal(write(fd, def, sizeof def - 1), (ssize_t)(sizeof def - 1));
    close(fd);
    kb_def d;
    char err[512];
    const bool ok = kb_def_load(path, &d, err, sizeof err);
    unlink(path);
    if (!ok) fail_msg("%s", err);
    /* the error check alone passes it ... */
    plant p;
    kb_solution s = planted(&p, IGNORE_LAST_K);
    kb_case c;
    assert_true(kb_case_make(&d, &d.wl[0], 1000u, &c, err, sizeof err));
    float *o[KB_MAX_IO] = {malloc(c.out_n[0] * sizeof(float))};
    assert_true(s.run(&s, &c, o, err, sizeof err));
    double mx = 0.0, worst = 0.0;
    for (size_t k = 0; k < c.out_n[0]; k++) mx = fmax(mx, fabs(c.ref[0][k]));
    for (size_t k = 0; k < c.out_n[0]; k++) worst = fmax(worst, fabs(o[0][k] - c.ref[0][k]));
    assert_true(worst > 0.0 && worst <= 0.2 * mx);
    free(o[0]);
    kb_case_free(&c);
    /* ... the gate does not */
    expect_fail(IGNORE_LAST_K, &d, KB_FAIL_DEPENDENCE);
}

static void test_loader_rejects(void **state) {
    (void)state;
    static const char *const bad[] = {
        /* unknown top-level field */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"speed\": 1, \"dims\": {}, \"inputs\": [], \"outputs\": [], \"workloads\": []}",
        /* unknown op */
        "{\"name\": \"a\", \"op\": \"conv\", \"description\": \"\", \"dims\": {}, \"inputs\": [], \"outputs\": [], \"workloads\": []}",
        /* wrong input name */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"E\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"z\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1, \"E\": 1}}]}",
        /* wrong shape */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"E\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"E\", \"T\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1, \"E\": 1}}]}",
        /* a workload missing a dimension */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"E\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1}}]}",
        /* an output without a tolerance */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"E\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\"}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1, \"E\": 1}}]}",
        /* an error scale ('stol') on an op whose reference has none */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"E\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0, \"stol\": 0.01}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1, \"E\": 1}}]}",
        /* a negative 'stol', and an unknown field in a solution's tolerance */
        "{\"name\": \"a\", \"op\": \"matmul\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"K\": {\"min\": 1, \"max\": 2}, \"N\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"K\"], \"dtype\": \"f32\"}, {\"name\": \"w\", \"shape\": [\"N\", \"K\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"N\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0, \"stol\": -1}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1, \"K\": 1, \"N\": 1}}]}",
        "{\"name\": \"a\", \"op\": \"matmul\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"K\": {\"min\": 1, \"max\": 2}, \"N\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"K\"], \"dtype\": \"f32\"}, {\"name\": \"w\", \"shape\": [\"N\", \"K\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"N\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0, \"cuda\": {\"rtol\": 0, \"atol\": 0, \"slack\": 1}}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1, \"K\": 1, \"N\": 1}}]}",
        /* 'big' that is not a boolean */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"E\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1, \"E\": 1}, \"big\": 1}]}",
        /* a listed workload past the 2^28 elements of a case (2 x 2^14 x 2^14 = 2^29), big or not */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"E\": {\"min\": 1, \"max\": 2}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 16384, \"E\": 16384}, \"big\": true}]}",
        /* a 'multiple' past the dimension's max (the fuzzer's 3888888888888888882 overflowed the hidden
           workloads' draw) */
        "{\"name\": \"a\", \"op\": \"copy\", \"description\": \"\", \"dims\": {\"T\": {\"min\": 1, \"max\": 2}, \"E\": {\"min\": 1, \"max\": 2048, \"multiple\": 3888888888888888882}},"
        " \"inputs\": [{\"name\": \"x\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\"}],"
        " \"outputs\": [{\"name\": \"y\", \"shape\": [\"T\", \"E\"], \"dtype\": \"f32\", \"tol\": {\"rtol\": 0, \"atol\": 0}}],"
        " \"workloads\": [{\"id\": \"w\", \"dims\": {\"T\": 1, \"E\": 1}}]}",
        "not json",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[] = "/tmp/kbench_badXXXXXX";
        const int fd = mkstemp(path);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
        close(fd);
        kb_def d;
        char err[512] = "";
        const bool ok = kb_def_load(path, &d, err, sizeof err);
        unlink(path);
        printf("  bad definition %zu: %s\n", i, err);
        assert_false(ok);
        assert_true(err[0] != 0);
    }
}

/* Workloads from a serving trace: the most frequent shapes first, the definition's fixed dimensions
 * kept, a line that is not a step rejected. */
static void test_trace_workloads(void **state) {
    (void)state;
    char path[] = "/tmp/kbench_traceXXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char trace[] =
        "{\"step\": 0, \"num_tokens\": 40, \"num_seqs\": 2, \"num_logits\": 2, \"max_seq_len\": 300, \"q_lens\": [39, 1], \"seq_lens\": [39, 300]}\n"
        "{\"step\": 1, \"num_tokens\": 2, \"num_seqs\": 2, \"num_logits\": 2, \"max_seq_len\": 301, \"q_lens\": [1, 1], \"seq_lens\": [40, 301]}\n"
        "{\"step\": 2, \"num_tokens\": 2, \"num_seqs\": 2, \"num_logits\": 2, \"max_seq_len\": 302, \"q_lens\": [1, 1], \"seq_lens\": [41, 302]}\n";
    assert_int_equal(write(fd, trace, sizeof trace - 1), (ssize_t)(sizeof trace - 1));
    close(fd);
    kb_def a, m;
    char err[512];
    load("attention_llama8b", &a);
    load("matmul_q8_0", &m);
    const int na = a.n_workloads, nm = m.n_workloads;
    assert_int_equal(kb_def_add_trace(&a, path, 8, err, sizeof err), 6); /* 6 distinct (P, Q) */
    assert_int_equal(kb_def_add_trace(&m, path, 8, err, sizeof err), 2); /* T = 2 (twice), T = 40 */
    const kb_workload *t0 = &m.wl[nm];
    assert_int_equal(t0->dim[0], 2);                 /* the most frequent first */
    assert_int_equal(t0->dim[1], m.wl[0].dim[1]);    /* K and N from the first listed workload */
    assert_int_equal(m.wl[nm + 1].dim[0], 40);
    for (int w = na; w < a.n_workloads; w++) {
        assert_int_equal(a.wl[w].dim[0], 1);   /* B */
        assert_int_equal(a.wl[w].dim[3], 8);   /* HKV fixed by the definition */
        assert_int_equal(a.wl[w].dim[5], 128); /* D */
        assert_true(a.wl[w].dim[2] == 1 || a.wl[w].dim[2] == 39);
    }
    FILE *f = fopen(path, "w");
    fputs("{\"not\": \"a step\"}\n", f);
    fclose(f);
    assert_int_equal(kb_def_add_trace(&m, path, 8, err, sizeof err), -1);
    printf("  bad trace: %s\n", err);
    unlink(path);
}

static int fn_hang(void *ctx, int fd) {
    (void)ctx, (void)fd;
    for (;;) pause();
    return 0;
}
static int fn_crash(void *ctx, int fd) {
    (void)ctx, (void)fd;
    raise(SIGSEGV);
    return 0;
}
static int fn_ok(void *ctx, int fd) {
    (void)ctx;
    return write(fd, "ok", 2) == 2 ? 0 : 1;
}

static void test_isolation(void **state) {
    (void)state;
    char *text = NULL;
    assert_int_equal(kb_isolate(1, fn_hang, NULL, &text), KB_ISOLATE_TIMEOUT);
    free(text);
    assert_int_equal(kb_isolate(10, fn_crash, NULL, &text), KB_ISOLATE_CRASHED);
    free(text);
    assert_int_equal(kb_isolate(10, fn_ok, NULL, &text), KB_ISOLATE_DONE);
    assert_non_null(text);
    assert_string_equal(text, "ok");
    free(text);
}

/* runs `osprey bench-kernels ARGS --out FILE` (the CPU solution) and loads its report */
static json_t *bench_report(const char *const *args, int n_args) {
    char path[] = "/tmp/osprey_test_kbench_report_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"bench-kernels";
    argv[argc++] = (char *)"--defs";
    argv[argc++] = (char *)defs_dir();
    for (int i = 0; i < n_args; i++) argv[argc++] = (char *)args[i];
    argv[argc++] = (char *)"--out";
    argv[argc++] = path;
    argv[argc] = NULL;
    assert_int_equal(kb_main(argc, argv), 0);
    json_error_t je;
    json_t *r = json_load_file(path, 0, &je);
    unlink(path);
    if (!r) fail_msg("report: %s", je.text);
    return r;
}

/* A short timed run of one small definition with FLOPs (attention) and one without (copy): every timed
 * workload carries setup_us, both ceilings where they apply, the fraction of each and the binding one;
 * the summary has one row per definition. No timed values are asserted beyond their being positive. */
static void test_report_ceilings_and_setup(void **state) {
    (void)state;
    const char *att[] = {"--op", "attention_tiny_d32", "--hidden", "1", "--seeds", "1", "--seed", "5",
                         "--min-time", "0", "--warm", "--timeout", "120"};
    json_t *r = bench_report(att, (int)(sizeof att / sizeof att[0]));
    json_t *res = json_array_get(json_object_get(r, "results"), 0), *wls = json_object_get(res, "workloads");
    assert_true(json_array_size(wls) >= 2);
    size_t i;
    json_t *e;
    int timed = 0;
    json_array_foreach(wls, i, e) {
        assert_string_equal(json_string_value(json_object_get(e, "gate")), "ok");
        json_t *t = json_object_get(e, "timing");
        assert_non_null(t);
        timed++;
        assert_true(json_number_value(json_object_get(t, "setup_us")) > 0.0);
        const double gemm = json_number_value(json_object_get(t, "gemm_gflops")),
                     gf = json_number_value(json_object_get(t, "gflops")),
                     fb = json_number_value(json_object_get(t, "fraction_of_copy_bw"));
        assert_true(gemm > 0.0); /* measured: attention's FLOPs matter */
        assert_true(gf > 0.0);
        json_t *fg = json_object_get(t, "fraction_of_gemm_peak");
        assert_non_null(fg);
        assert_true(fabs(json_number_value(fg) - gf / gemm) <= 1e-9 * (gf / gemm));
        const char *ceil = json_string_value(json_object_get(t, "ceiling"));
        assert_non_null(ceil);
        const double fc = json_number_value(json_object_get(t, "fraction_of_ceiling"));
        assert_true(fc == (json_number_value(fg) > fb ? json_number_value(fg) : fb));
        assert_string_equal(ceil, json_number_value(fg) > fb ? "gemm" : "bw");
    }
    json_t *sum = json_object_get(r, "summary");
    assert_int_equal(json_array_size(sum), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(sum, 0), "timed")), timed);
    assert_string_equal(json_string_value(json_object_get(json_array_get(sum, 0), "definition")), "attention_tiny_d32");
    json_decref(r);

    /* copy: no FLOPs, so no GEMM ceiling measured and no fraction of it; --no-listed: the hidden one only */
    const char *cp[] = {"--op", "copy", "--hidden", "1", "--no-listed", "--seeds", "1", "--seed", "5",
                        "--min-time", "0", "--warm", "--timeout", "120"};
    r = bench_report(cp, (int)(sizeof cp / sizeof cp[0]));
    wls = json_object_get(json_array_get(json_object_get(r, "results"), 0), "workloads");
    assert_int_equal(json_array_size(wls), 1);
    json_t *t = json_object_get(json_array_get(wls, 0), "timing");
    assert_non_null(t);
    assert_true(json_number_value(json_object_get(t, "gemm_gflops")) == 0.0);
    assert_null(json_object_get(t, "fraction_of_gemm_peak"));
    assert_string_equal(json_string_value(json_object_get(t, "ceiling")), "bw");
    assert_true(json_number_value(json_object_get(t, "setup_us")) > 0.0);

    /* the clock: the CPU solution has no device clock, so its statistics are the wall clock's, and the
     * wall median beside them is the same number */
    assert_string_equal(json_string_value(json_object_get(t, "clock")), "wall");
    assert_true(json_is_number(json_object_get(t, "wall_median_us")));
    assert_true(json_number_value(json_object_get(t, "wall_median_us")) == json_number_value(json_object_get(t, "median_us")));
    json_decref(r);

    /* --no-big: the listed workloads marked big are not run (here, gate only: they are 8B shapes) */
    const char *nb[] = {"--op", "copy", "--hidden", "0", "--seeds", "1", "--seed", "5", "--gate-only", "--no-big"};
    r = bench_report(nb, (int)(sizeof nb / sizeof nb[0]));
    assert_true(json_is_false(json_object_get(r, "big_workloads")));
    kb_def cd;
    load("copy", &cd);
    int n_big = 0;
    for (int w = 0; w < cd.n_workloads; w++) n_big += cd.wl[w].big;
    assert_true(n_big >= 1); /* copy lists a big workload; none would make this check empty */
    wls = json_object_get(json_array_get(json_object_get(r, "results"), 0), "workloads");
    assert_int_equal((int)json_array_size(wls), cd.n_workloads - n_big);
    json_array_foreach(wls, i, e) {
        for (int w = 0; w < cd.n_workloads; w++)
            if (!strcmp(cd.wl[w].id, json_string_value(json_object_get(e, "workload")))) assert_false(cd.wl[w].big);
    }
    json_decref(r);

    /* the gate alone measures nothing and times nothing */
    const char *g[] = {"--op", "copy", "--hidden", "1", "--no-listed", "--seeds", "1", "--seed", "5", "--gate-only"};
    r = bench_report(g, (int)(sizeof g / sizeof g[0]));
    wls = json_object_get(json_array_get(json_object_get(r, "results"), 0), "workloads");
    assert_int_equal(json_array_size(wls), 1);
    assert_null(json_object_get(json_array_get(wls, 0), "timing"));
    assert_int_equal(json_array_size(json_object_get(r, "summary")), 0);
    json_decref(r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_honest_passes_every_definition),
        cmocka_unit_test(test_tail_fails_coverage),
        cmocka_unit_test(test_race_fails_determinism),
        cmocka_unit_test(test_cached_fails_dependence),
        cmocka_unit_test(test_ignored_input_fails_dependence),
        cmocka_unit_test(test_loader_rejects),
        cmocka_unit_test(test_trace_workloads),
        cmocka_unit_test(test_isolation),
        cmocka_unit_test(test_report_ceilings_and_setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
