/* `osprey bench-kernels --make-table`: a runtime kernel selection table (src/backend/kernel_table.h)
 * from proving-ground reports (kbench.h: kb_make_table).
 *
 * A workload is the same across reports when its definition, generator and dimensions are (hidden
 * workloads drawn with another seed are other workloads), so reports of one version each, run at
 * different times, compare on what they share. A version measured twice on one workload (the "cuda"
 * default and "cuda:attention/v1" are one kernel) keeps its smaller median.
 *
 * Buckets are (op kind, head_dim, KV dtype) only: never the batch, the query length or the context
 * (a request's bits must not depend on its batch; kernel_table.h). A version must have passed the gate
 * on every workload of the bucket it ran; a report in which a (solution, definition) of a choosable op
 * kind did not run to the end (timed out, crashed, unavailable) is refused: rerun it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "backend/kernel_table.h"
#include "bench/kernels/kb_internal.h"
#include "osprey/status.h"

#define MAX_BUCKETS 64
#define MAX_CANDS 8

typedef struct rec {
    int bucket, cand;
    char key[200]; /* definition | gen | dims */
    double us;
} rec;

typedef struct bucket {
    osp_op_kind kind;
    int32_t head_dim;
    int n_cands;
    const osp_kernel_version *cand[MAX_CANDS];
    bool failed[MAX_CANDS];
    char fail_why[MAX_CANDS][160];
} bucket;

typedef struct mk {
    bucket b[MAX_BUCKETS];
    int n_b;
    rec *r;
    size_t n_r, cap_r;
    bool have_dev;
    osp_device device;
    char gpu[128];
    int32_t arch, driver;
    char clock[8]; /* the timings' clock ("device", "wall"; reports before it: "wall"), one for all */
} mk;


static int bucket_of(mk *m, osp_op_kind k, int32_t D) {
    for (int i = 0; i < m->n_b; i++)
        if (m->b[i].kind == k && m->b[i].head_dim == D) return i;
    if (m->n_b == MAX_BUCKETS) return -1;
    m->b[m->n_b] = (bucket){.kind = k, .head_dim = D};
    return m->n_b++;
}

static int cand_of(bucket *b, const osp_kernel_version *v) {
    for (int i = 0; i < b->n_cands; i++)
        if (b->cand[i] == v) return i;
    if (b->n_cands == MAX_CANDS) return -1;
    b->cand[b->n_cands] = v;
    return b->n_cands++;
}

static bool add_rec(mk *m, int bi, int ci, const char *key, double us) {
    for (size_t i = 0; i < m->n_r; i++)
        if (m->r[i].bucket == bi && m->r[i].cand == ci && !strcmp(m->r[i].key, key)) {
            if (us < m->r[i].us) m->r[i].us = us;
            return true;
        }
    if (m->n_r == m->cap_r) {
        const size_t nc = m->cap_r ? 2 * m->cap_r : 256;
        rec *nr = realloc(m->r, nc * sizeof *nr);
        if (!nr) return false;
        m->r = nr, m->cap_r = nc;
    }
    rec *r = &m->r[m->n_r++];
    r->bucket = bi, r->cand = ci, r->us = us;
    snprintf(r->key, sizeof r->key, "%s", key);
    return true;
}

/* the device a report's results ran on, checked against the others' */
static bool take_device(mk *m, json_t *dev, const char *path, char *err, size_t n) {
    const char *be = json_string_value(json_object_get(dev, "backend")), *name = json_string_value(json_object_get(dev, "name"));
    json_t *arch = json_object_get(dev, "arch"), *drv = json_object_get(dev, "driver_major");
    if (!be || !name || !json_is_integer(arch) || !json_is_integer(drv))
        return kb_fail(err, n, "%s: a result's device lacks backend, name, arch or driver_major", path);
    const osp_device d = !strcmp(be, "cuda") ? OSP_DEVICE_CUDA : OSP_DEVICE_CPU;
    const int32_t a = (int32_t)json_integer_value(arch), dm = (int32_t)json_integer_value(drv);
    if (!m->have_dev) {
        m->have_dev = true, m->device = d, m->arch = a, m->driver = dm;
        snprintf(m->gpu, sizeof m->gpu, "%s", name);
        return true;
    }
    if (d != m->device || a != m->arch || dm != m->driver)
        return kb_fail(err, n,
                    "%s: results from %s %s (arch %d, driver %d) beside %s %s (arch %d, driver %d): a table is for one "
                    "device; make one table per device",
                    path, be, name, (int)a, (int)dm, m->device == OSP_DEVICE_CUDA ? "cuda" : "cpu", m->gpu, (int)m->arch,
                    (int)m->driver);
    return true;
}

static bool read_report(mk *m, const char *path, char *err, size_t n) {
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return kb_fail(err, n, "%s: not a JSON report (line %d: %s)", path, je.line, je.text);
    bool ok = true;
    json_t *results = json_object_get(root, "results");
    if (!json_is_array(results)) ok = kb_fail(err, n, "%s: no 'results' array (not an osprey bench-kernels report)", path);
    else if (json_is_true(json_object_get(root, "gate_only")))
        ok = kb_fail(err, n, "%s: a --gate-only report has no timings", path);
    size_t i;
    json_t *e;
    json_array_foreach(results, i, e) {
        if (!ok) break;
        const char *op = json_string_value(json_object_get(e, "op")), *def = json_string_value(json_object_get(e, "definition"));
        const char *sol = json_string_value(json_object_get(e, "solution"));
        json_t *wls = json_object_get(e, "workloads"), *dev = json_object_get(e, "device");
        const osp_op_kind k = osp_kernel_kind_of(op);
        if (!op || !def || !sol || k == OSP_OP_COUNT || !json_is_array(wls)) {
            ok = kb_fail(err, n, "%s: results[%zu] lacks op, definition, solution or workloads", path, i);
            break;
        }
        kb_solution_spec sp;
        char serr[256];
        if (!kb_solution_parse(sol, &sp, serr, sizeof serr)) {
            ok = kb_fail(err, n, "%s: results[%zu]: %s", path, i, serr);
            break;
        }
        if (osp_kernel_choosable_count(sp.device, k) < 2) continue; /* one version: nothing to choose */
        size_t j;
        json_t *w;
        json_array_foreach(wls, j, w) {
            const char *st = json_string_value(json_object_get(w, "status"));
            if (st) {
                ok = kb_fail(err, n, "%s: %s on %s did not run to the end (%s): rerun it before making a table", path, sol,
                          def, st);
                break;
            }
        }
        if (!ok) break;
        if (!json_is_object(dev)) {
            ok = kb_fail(err, n, "%s: results[%zu] (%s on %s) names no device (a report from before the kernel registry?)",
                      path, i, sol, def);
            break;
        }
        if (!(ok = take_device(m, dev, path, err, n))) break;
        json_array_foreach(wls, j, w) {
            const char *gate = json_string_value(json_object_get(w, "gate"));
            const char *ver = json_string_value(json_object_get(w, "version"));
            json_t *dims = json_object_get(w, "dims"), *t = json_object_get(w, "timing");
            if (!gate || !strcmp(gate, "unsupported")) continue;
            const osp_kernel_version *v = ver ? osp_kernel_find(m->device, ver) : NULL;
            if (!v || v->kind != k) {
                ok = kb_fail(err, n, "%s: %s on %s, workload %zu: no registered version '%s'", path, sol, def, j, ver ? ver : "");
                break;
            }
            json_t *dj = json_object_get(dims, "D");
            const int32_t D = json_is_integer(dj) ? (int32_t)json_integer_value(dj) : 0;
            const int bi = bucket_of(m, k, D);
            const int ci = bi >= 0 ? cand_of(&m->b[bi], v) : -1;
            if (bi < 0 || ci < 0) {
                ok = kb_fail(err, n, "%s: more than %d buckets or %d versions in one", path, MAX_BUCKETS, MAX_CANDS);
                break;
            }
            bucket *b = &m->b[bi];
            const double us = json_number_value(json_object_get(t, "median_us"));
            if (strcmp(gate, "ok") || !(us > 0.0)) {
                if (!b->failed[ci])
                    snprintf(b->fail_why[ci], sizeof b->fail_why[ci], "%s %s: %s", def,
                             json_string_value(json_object_get(w, "workload")) ? json_string_value(json_object_get(w, "workload")) : "?",
                             strcmp(gate, "ok") ? gate : "not timed");
                b->failed[ci] = true;
                continue;
            }
            /* medians by two clocks are not comparable: the device's leaves out the host's work */
            const char *clk = json_string_value(json_object_get(t, "clock"));
            if (!clk) clk = "wall";
            if (!m->clock[0]) snprintf(m->clock, sizeof m->clock, "%s", clk);
            else if (strcmp(m->clock, clk)) {
                ok = kb_fail(err, n, "%s: %s on %s: timings by the %s clock beside timings by the %s clock (reports "
                                     "of other builds?): make a table from one kind", path, sol, def, clk, m->clock);
                break;
            }
            char *dtxt = json_dumps(dims, JSON_COMPACT | JSON_SORT_KEYS);
            char key[200];
            snprintf(key, sizeof key, "%s|%s|%s", def, json_string_value(json_object_get(w, "gen")) ? json_string_value(json_object_get(w, "gen")) : "",
                     dtxt ? dtxt : "");
            free(dtxt);
            if (!add_rec(m, bi, ci, key, us)) {
                ok = kb_fail(err, n, "out of memory");
                break;
            }
        }
    }
    json_decref(root);
    return ok;
}

/* whether candidate ci of bucket bi timed key */
static const rec *find_rec(const mk *m, int bi, int ci, const char *key) {
    for (size_t i = 0; i < m->n_r; i++)
        if (m->r[i].bucket == bi && m->r[i].cand == ci && !strcmp(m->r[i].key, key)) return &m->r[i];
    return NULL;
}

bool kb_make_table(int n, const char *const *reports, const char *out, char *summary, size_t sn, char *err, size_t errn) {
    mk *m = calloc(1, sizeof *m);
    if (!m) return kb_fail(err, errn, "out of memory");
    summary[0] = 0;
    bool ok = true;
    for (int i = 0; ok && i < n; i++) ok = read_report(m, reports[i], err, errn);
    if (ok && !m->have_dev) ok = kb_fail(err, errn, "no timed results of an op kind with more than one version in the reports");
    json_t *rows = json_array(), *srcs = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(srcs, json_string(reports[i]));
    size_t sl = 0;
#define SUM(...) (sl += (size_t)snprintf(summary + sl, sl < sn ? sn - sl : 0, __VA_ARGS__), sl = sl < sn ? sl : sn)
    for (int bi = 0; ok && bi < m->n_b; bi++) {
        bucket *b = &m->b[bi];
        const char *kn = osp_op_name(b->kind);
        int live[MAX_CANDS], n_live = 0;
        for (int ci = 0; ci < b->n_cands; ci++) {
            if (b->failed[ci]) SUM("%s head_dim %d: %s out (gate: %s)\n", kn, (int)b->head_dim, b->cand[ci]->name, b->fail_why[ci]);
            else live[n_live++] = ci;
        }
        if (n_live < 2) {
            SUM("%s head_dim %d: %d version(s) qualified, nothing compared: no row (the default runs)\n", kn,
                (int)b->head_dim, n_live);
            continue;
        }
        /* the workloads every live candidate timed */
        double logsum[MAX_CANDS] = {0};
        int common = 0;
        for (size_t i = 0; i < m->n_r; i++) {
            const rec *r = &m->r[i];
            if (r->bucket != bi || r->cand != live[0]) continue;
            double us[MAX_CANDS];
            bool all = true;
            for (int l = 0; l < n_live && all; l++) {
                const rec *q = find_rec(m, bi, live[l], r->key);
                all = q != NULL;
                if (q) us[l] = q->us;
            }
            if (!all) continue;
            for (int l = 0; l < n_live; l++) logsum[l] += log(us[l]);
            common++;
        }
        if (!common) {
            SUM("%s head_dim %d: the versions share no timed workload: no row\n", kn, (int)b->head_dim);
            continue;
        }
        int best = 0;
        for (int l = 1; l < n_live; l++)
            if (logsum[l] < logsum[best]) best = l;
        json_t *ev = json_object();
        json_object_set_new(ev, "workloads", json_integer(common));
        json_t *gm = json_object();
        for (int l = 0; l < n_live; l++)
            json_object_set_new(gm, b->cand[live[l]]->name, json_real(exp(logsum[l] / common)));
        json_object_set_new(ev, "geomean_median_us", gm);
        json_array_append_new(rows, json_pack("{s:s,s:i,s:s,s:s,s:o}", "op", kn, "head_dim", (int)b->head_dim, "kv_dtype",
                                              "f16", "version", b->cand[live[best]]->name, "evidence", ev));
        SUM("%s head_dim %d kv f16: %s (geomean of medians over %d shared workloads:", kn, (int)b->head_dim,
            b->cand[live[best]]->name, common);
        for (int l = 0; l < n_live; l++) SUM(" %s %.2f us", b->cand[live[l]]->name, exp(logsum[l] / common));
        SUM(")\n");
    }
#undef SUM
    if (ok) {
        json_t *t = json_pack("{s:i,s:s,s:s,s:i,s:i,s:o,s:o}", "osprey_kernel_table", OSP_KERNEL_TABLE_FORMAT, "device",
                              m->device == OSP_DEVICE_CUDA ? "cuda" : "cpu", "gpu", m->gpu, "arch", (int)m->arch,
                              "driver_major", (int)m->driver, "sources", srcs, "rows", rows);
        srcs = rows = NULL;
        if (json_dump_file(t, out, JSON_INDENT(1)) != 0) ok = kb_fail(err, errn, "cannot write %s", out);
        json_decref(t);
        osp_kernel_table *back = NULL;
        if (ok && osp_kernel_table_load(out, &back) != OSP_OK)
            ok = kb_fail(err, errn, "the table written to %s does not read back: %s", out, osp_last_error());
        osp_kernel_table_free(back);
    }
    json_decref(rows);
    json_decref(srcs);
    free(m->r);
    free(m);
    return ok;
}
