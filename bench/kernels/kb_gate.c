/* The gate and the timing (kbench.h). The gate's checks, in order, on n_seeds fresh inputs of one
 * workload:
 *   coverage     outputs poisoned with NaN; an element left NaN where the reference is finite was
 *                never written (a tail the kernel skips)
 *   error        |got - ref| <= rtol |ref| + atol max|ref| for every element, NaN never passing
 *   determinism  (first seed) the same inputs again give the same bits (a race between threads or
 *                warps, an uninitialized accumulator)
 *   dependence   (first seed) for every input, its last element changed: wherever the reference
 *                moves by more than two steps of the output's dtype, the output must move too, and
 *                be right (an ignored input, a skipped tail, a cached result, even where the
 *                tolerance is loose enough to hide it)
 * Timing runs only after the gate: a warm-up, then runs until min_seconds or max_reps, median and
 * the 10th / 90th percentiles of the per-run times: the device's time of each run's kernels where the
 * solution reports one (s->device_us: CUDA events around the op), else the wall clock read around each
 * run (every run returns with its outputs on the host, or, resident, with the device idle); the wall
 * median is kept beside the device's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/kernels/kb_internal.h"
#include "core/dtype.h"

const char *kb_check_name(kb_check k) {
    static const char *const n[] = {"ok", "unsupported", "run", "coverage", "error", "determinism", "dependence"};
    return (unsigned)k < sizeof n / sizeof n[0] ? n[k] : "?";
}

static const kb_tol *tol_for(const kb_io *io, const char *solution) {
    /* "cuda+KEY=VALUE" and "cuda:attention/v1" take cuda's; "cpu:matmul/v0" (the exact path) cpu-exact's */
    kb_solution_spec sp;
    char err[256];
    const char *base = kb_solution_parse(solution, &sp, err, sizeof err) ? sp.base : solution;
    const size_t bl = base == solution ? strcspn(solution, "+:") : strlen(base);
    for (int i = 1; i < io->n_tol; i++)
        if (strlen(io->tol[i].solution) == bl && !strncmp(io->tol[i].solution, base, bl)) return &io->tol[i];
    return &io->tol[0];
}

static float **alloc_outs(const kb_case *c) {
    float **o = calloc(KB_MAX_IO, sizeof(float *));
    for (int i = 0; i < c->def->n_out; i++) o[i] = malloc(c->out_n[i] * sizeof(float) + 4);
    return o;
}
static void free_outs(float **o) {
    if (!o) return;
    for (int i = 0; i < KB_MAX_IO; i++) free(o[i]);
    free(o);
}
static void poison(const kb_case *c, float **o) {
    for (int i = 0; i < c->def->n_out; i++)
        for (size_t k = 0; k < c->out_n[i]; k++) o[i][k] = NAN;
}

/* coverage and error of one run; false with r filled on failure */
static bool check_outputs(const kb_solution *s, const kb_case *c, float **o, kb_gate_result *r) {
    const kb_def *d = c->def;
    for (int i = 0; i < d->n_out; i++) {
        const kb_tol *t = tol_for(&d->out[i], s->name);
        double mx = 0.0;
        for (size_t k = 0; k < c->out_n[i]; k++) mx = fmax(mx, fabs(c->ref[i][k]));
        for (size_t k = 0; k < c->out_n[i]; k++) {
            const double ref = c->ref[i][k], got = o[i][k];
            const double tol =
                t->rtol * fabs(ref) + t->atol * mx + (c->ref_scale[i] ? t->stol * c->ref_scale[i][k] : 0.0);
            if (isnan(got) && isfinite(ref)) {
                r->check = KB_FAIL_COVERAGE;
                snprintf(r->detail, sizeof r->detail, "output '%s' [%zu of %zu] not written (NaN; reference %.6g), seed %llu",
                         d->out[i].name, k, c->out_n[i], ref, (unsigned long long)c->seed);
                return false;
            }
            const double e = fabs(got - ref);
            if (!(e <= tol)) {
                r->check = KB_FAIL_ERROR;
                snprintf(r->detail, sizeof r->detail,
                         "output '%s' [%zu of %zu]: %.8g, reference %.8g: |error| %.3g > tol %.3g (error scale %.3g), seed %llu",
                         d->out[i].name, k, c->out_n[i], got, ref, e, tol, c->ref_scale[i] ? c->ref_scale[i][k] : 0.0,
                         (unsigned long long)c->seed);
                return false;
            }
            if (tol > 0.0) r->worst_ratio = fmax(r->worst_ratio, e / tol);
        }
    }
    return true;
}

static bool same_bits(const kb_case *c, float **a, float **b, int *which, size_t *at) {
    for (int i = 0; i < c->def->n_out; i++)
        for (size_t k = 0; k < c->out_n[i]; k++)
            if (memcmp(&a[i][k], &b[i][k], sizeof(float))) return *which = i, *at = k, false;
    return true;
}

static bool run_once(kb_solution *s, const kb_case *c, float **o, kb_gate_result *r) {
    char err[256] = "";
    poison(c, o);
    if (!s->run(s, c, o, err, sizeof err)) {
        r->check = KB_FAIL_RUN;
        snprintf(r->detail, sizeof r->detail, "run failed: %.200s", err);
        return false;
    }
    return true;
}

/* The dependence check for input i of case c (whose outputs from the unchanged inputs are in base):
 * the input's last element changed, the reference recomputed. */
static bool check_dependence(kb_solution *s, kb_case *c, int i, float **base, kb_gate_result *r) {
    const kb_def *d = c->def;
    const size_t last = c->in_n[i] - 1;
    const float old = c->in[i][last];
    /* the new value is one the op can read (bf16 and f16 inputs stay representable) */
    const float nv = kb_representable(d->in[i].dtype, (float)((double)old * 1.5 + (old >= 0.0f ? 1.0 : -1.0)));
    double *saved[KB_MAX_IO];
    for (int k = 0; k < d->n_out; k++) {
        saved[k] = malloc(sizeof(double) * c->out_n[k] + 8);
        memcpy(saved[k], c->ref[k], sizeof(double) * c->out_n[k]);
    }
    c->in[i][last] = nv;
    kb_case_rereference(c);
    bool moved_ref = false, ok = true;
    char err[256] = "";
    float **o = alloc_outs(c);
    /* weights are placed at prepare: prepare again whenever an input changes */
    if (!s->prepare(s, c, err, sizeof err) || !run_once(s, c, o, r)) {
        if (r->check == KB_OK) r->check = KB_FAIL_RUN, snprintf(r->detail, sizeof r->detail, "prepare: %.200s", err);
        ok = false;
    }
    for (int k = 0; ok && k < d->n_out; k++) {
        /* moved: by more than two steps of the output's dtype there (a change a correct kernel cannot
         * round away), however loose the tolerance */
        /* one step of the dtype, relative, at worst: bf16 2^-7, f16 2^-10, f32 2^-23 */
        const double step = d->out[k].dtype == OSP_DTYPE_BF16 ? 0x1p-7 : d->out[k].dtype == OSP_DTYPE_F16 ? 0x1p-10 : 0x1p-23;
        for (size_t e = 0; e < c->out_n[k]; e++) {
            const double dref = fabs(c->ref[k][e] - saved[k][e]);
            if (!(dref > 2.0 * step * fmax(fabs(saved[k][e]), fabs(c->ref[k][e])) + 1e-30)) continue;
            moved_ref = true;
            if (o[k][e] == base[k][e]) {
                r->check = KB_FAIL_DEPENDENCE;
                snprintf(r->detail, sizeof r->detail,
                         "input '%s' [%zu] changed (%.6g -> %.6g): the reference's '%s' [%zu] moved by %.3g, the "
                         "output did not, seed %llu",
                         d->in[i].name, last, old, nv, d->out[k].name, e, dref, (unsigned long long)c->seed);
                ok = false;
                break;
            }
        }
    }
    if (ok && !moved_ref) { /* its last element moves no output beyond two steps: not checked, said so */
        const size_t l = strlen(r->unchecked);
        snprintf(r->unchecked + l, sizeof r->unchecked - l, "%s%s", l ? "," : "", d->in[i].name);
    }
    if (ok && !check_outputs(s, c, o, r)) ok = false; /* and the changed inputs' answer is right too */
    free_outs(o);
    c->in[i][last] = old;
    for (int k = 0; k < d->n_out; k++) memcpy(c->ref[k], saved[k], sizeof(double) * c->out_n[k]), free(saved[k]);
    kb_case_rereference(c);
    if (ok && !s->prepare(s, c, err, sizeof err)) {
        r->check = KB_FAIL_RUN, snprintf(r->detail, sizeof r->detail, "prepare: %.200s", err);
        ok = false;
    }
    return ok;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

kb_gate_result kb_gate(kb_solution *s, const kb_def *d, const kb_workload *wl, uint64_t seed0, int n_seeds) {
    kb_gate_result r = {.check = KB_OK};
    for (int k = 0; k < n_seeds && r.check == KB_OK; k++) {
        kb_case c;
        char err[256] = "";
        if (!kb_case_make(d, wl, seed0 + (uint64_t)k, &c, err, sizeof err)) {
            r.check = KB_FAIL_RUN;
            snprintf(r.detail, sizeof r.detail, "case: %.200s", err);
            kb_case_free(&c);
            break;
        }
        if (!s->supports(s, &c, err, sizeof err)) {
            r.check = KB_UNSUPPORTED;
            snprintf(r.detail, sizeof r.detail, "%s", err);
            kb_case_free(&c);
            break;
        }
        float **o = alloc_outs(&c), **o2 = NULL;
        const double t0 = now_s();
        if (!s->prepare(s, &c, err, sizeof err)) {
            r.check = KB_FAIL_RUN;
            snprintf(r.detail, sizeof r.detail, "prepare: %.200s", err);
            if (s->release) s->release(s);
            free_outs(o);
            kb_case_free(&c);
            break;
        }
        bool ok = run_once(s, &c, o, &r);
        if (ok && k == 0) r.setup_us = 1e6 * (now_s() - t0); /* the first contact with this shape */
        ok = ok && check_outputs(s, &c, o, &r);
        if (ok && k == 0) {
            o2 = alloc_outs(&c);
            int which = 0;
            size_t at = 0;
            if ((ok = run_once(s, &c, o2, &r)) && !same_bits(&c, o, o2, &which, &at)) {
                r.check = KB_FAIL_DETERMINISM;
                snprintf(r.detail, sizeof r.detail, "output '%s' [%zu]: %.9g then %.9g from the same inputs",
                         d->out[which].name, at, o[which][at], o2[which][at]);
                ok = false;
            }
            for (int i = 0; ok && i < d->n_in; i++) ok = check_dependence(s, &c, i, o, &r);
        }
        r.seeds++;
        free_outs(o), free_outs(o2);
        if (s->release) s->release(s);
        kb_case_free(&c);
    }
    return r;
}

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

bool kb_time(kb_solution *s, const kb_def *d, const kb_workload *wl, uint64_t seed0, double min_seconds, int max_reps,
             kb_timing *t, char *err, size_t errn) {
    memset(t, 0, sizeof *t);
    kb_case c;
    if (!kb_case_make_inputs(d, wl, seed0, &c, err, errn)) return kb_case_free(&c), false; /* no output checked */
    bool ok = s->prepare(s, &c, err, errn);
    float **o = alloc_outs(&c);
    double *ts = malloc(sizeof(double) * (size_t)(max_reps > 0 ? max_reps : 1));
    double *ds = s->device_us ? malloc(sizeof(double) * (size_t)(max_reps > 0 ? max_reps : 1)) : NULL;
    const bool flush = s->flush && s->flush_between_runs;
    size_t fb = 0;
    for (int w = 0; ok && w < 3; w++) ok = (!flush || s->flush(s, &fb, err, errn)) && s->run(s, &c, o, err, errn); /* warm-up */
    const double t_start = now_s();
    const uint64_t l0 = s->launches ? s->launches(s) : 0;
    int n = 0;
    t->resident = s->run_resident != NULL; /* the warm-up runs left the inputs on the device */
    while (ok && n < max_reps && (n < 5 || now_s() - t_start < min_seconds)) {
        if (flush && !(ok = s->flush(s, &fb, err, errn))) break; /* untimed */
        const double t0 = now_s();
        ok = t->resident ? s->run_resident(s, &c, err, errn) : s->run(s, &c, o, err, errn);
        ts[n] = now_s() - t0;
        if (ok && ds) { /* read after the wall clock: waiting for the events is not the run's time */
            double us = 0.0;
            ok = s->device_us(s, &us, err, errn);
            ds[n] = 1e-6 * us;
        }
        n++;
    }
    t->launches_per_run = s->launches && n > 0 ? (double)(s->launches(s) - l0) / n : -1.0;
    t->flush_bytes = flush ? fb : 0;
    if (ok && n > 0) {
        qsort(ts, (size_t)n, sizeof ts[0], cmp_d);
        t->wall_median_us = 1e6 * ts[n / 2];
        t->device_clock = ds != NULL;
        double *x = ds ? ds : ts; /* the statistics' clock */
        if (ds) qsort(ds, (size_t)n, sizeof ds[0], cmp_d);
        t->reps = n;
        t->median_us = 1e6 * x[n / 2];
        t->p10_us = 1e6 * x[n / 10];
        t->p90_us = 1e6 * x[(n * 9) / 10 < n ? (n * 9) / 10 : n - 1];
        /* a device median below the events' resolution (~0.5 us) may read 0: no rate then */
        t->gflops = t->median_us > 0.0 ? c.flops / (t->median_us * 1e3) : 0.0;
        t->gbps = t->median_us > 0.0 ? c.bytes / (t->median_us * 1e3) : 0.0;
    } else {
        t->launches_per_run = -1.0, t->flush_bytes = 0;
    }
    free(ts), free(ds);
    free_outs(o);
    if (s->release) s->release(s);
    kb_case_free(&c);
    return ok;
}
