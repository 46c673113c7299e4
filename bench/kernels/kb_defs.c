/* Definitions (bench/kernels/defs/<name>.json, read with jansson) and hidden workloads.
 *
 *   {"name": "add_rmsnorm_e576", "op": "add_rmsnorm", "description": "...",
 *    "dims": {"T": {"min": 1, "max": 256}, "E": {"min": 1, "max": 2048, "multiple": 1}},
 *    "params": {"eps": 1e-6},
 *    "inputs":  [{"name": "x", "shape": ["T", "E"], "dtype": "f32"}, ...],
 *    "outputs": [{"name": "y", "shape": ["T", "E"], "dtype": "bf16",
 *                 "tol": {"rtol": 0.0078125, "atol": 1e-4, "cpu": {"rtol": ..., "atol": ...}}}],
 *                 (matmul outputs may add "stol": a multiple of each element's sum of |x_k w_k|, the
 *                 bound of a dot product's error from rounded inputs however much its terms cancel)
 *    "workloads": [{"id": "smollm2-decode", "dims": {"T": 1, "E": 576}, "gen": "normal"}, ...]}
 *                 (a workload may add "big": true: skipped under --no-big; every listed workload's
 *                 inputs and outputs must fit the 2^28-element limit of a case, checked here)
 *
 * The op kind's adapter (kb_ops.c) fixes the dimension, input and output names and their order; a
 * definition that differs is rejected, as is any field this loader does not know (a field accepted
 * and ignored would be a silent lie about what was tested). */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "bench/kernels/kb_internal.h"
#include "core/dtype.h"

bool kb_fail(char *err, size_t n, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return false;
}

static const char *const k_gen_names[KB_GEN_COUNT] = {"normal", "heavy", "equal", "large"};
const char *kb_gen_name(kb_gen g) { return (unsigned)g < KB_GEN_COUNT ? k_gen_names[g] : "?"; }

static bool only_keys(json_t *o, const char *const *keys, const char *where, char *err, size_t n) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool known = false;
        for (int i = 0; keys[i]; i++) known |= !strcmp(k, keys[i]);
        if (!known) return kb_fail(err, n, "%s: unknown field '%s'", where, k);
    }
    return true;
}

static bool dtype_of(const char *s, uint32_t *t) {
    static const struct { const char *n; uint32_t t; } m[] = {
        {"f32", OSP_DTYPE_F32}, {"f16", OSP_DTYPE_F16}, {"bf16", OSP_DTYPE_BF16},
        {"q8_0", OSP_DTYPE_Q8_0}, {"q4_0", OSP_DTYPE_Q4_0}, {"q4_1", OSP_DTYPE_Q4_1},
    };
    for (size_t i = 0; i < sizeof m / sizeof m[0]; i++)
        if (!strcmp(s, m[i].n)) return *t = m[i].t, true;
    return false;
}

static int dim_index(const kb_def *d, const char *name) {
    for (int i = 0; i < d->n_dims; i++)
        if (!strcmp(d->dims[i].name, name)) return i;
    return -1;
}

/* "stol" (optional): a number >= 0, only where the op's reference gives an error scale */
static bool tol_stol(json_t *v, double *out, bool ok, const char *where, const char *sol, char *err, size_t n) {
    *out = 0.0;
    if (!v) return true;
    if (!ok) return kb_fail(err, n, "%s: 'stol' needs an op whose reference gives an error scale (matmul)", where);
    if (!json_is_number(v) || !(json_number_value(v) >= 0.0))
        return kb_fail(err, n, "%s: 'stol'%s%s must be a number >= 0", where, *sol ? " of " : "", sol);
    *out = json_number_value(v);
    return true;
}

static bool parse_tol(json_t *t, kb_io *io, const char *where, bool stol_ok, char *err, size_t n) {
    if (!json_is_object(t)) return kb_fail(err, n, "%s: 'tol' must be an object", where);
    io->n_tol = 1;
    snprintf(io->tol[0].solution, sizeof io->tol[0].solution, "%s", "");
    io->tol[0].rtol = json_number_value(json_object_get(t, "rtol"));
    io->tol[0].atol = json_number_value(json_object_get(t, "atol"));
    io->tol[0].stol = 0.0;
    if (!json_is_number(json_object_get(t, "rtol")) || !json_is_number(json_object_get(t, "atol")))
        return kb_fail(err, n, "%s: 'tol' needs numbers 'rtol' and 'atol'", where);
    if (!tol_stol(json_object_get(t, "stol"), &io->tol[0].stol, stol_ok, where, "", err, n)) return false;
    const char *k;
    json_t *v;
    json_object_foreach(t, k, v) { /* per-solution overrides */
        if (!strcmp(k, "rtol") || !strcmp(k, "atol") || !strcmp(k, "stol")) continue;
        if (io->n_tol == KB_MAX_TOLS) return kb_fail(err, n, "%s: too many per-solution tolerances", where);
        kb_tol *o = &io->tol[io->n_tol++];
        snprintf(o->solution, sizeof o->solution, "%s", k);
        if (!json_is_object(v) || !json_is_number(json_object_get(v, "rtol")) ||
            !json_is_number(json_object_get(v, "atol")))
            return kb_fail(err, n, "%s: tolerance for solution '%s' needs 'rtol' and 'atol'", where, k);
        o->rtol = json_number_value(json_object_get(v, "rtol"));
        o->atol = json_number_value(json_object_get(v, "atol"));
        if (!tol_stol(json_object_get(v, "stol"), &o->stol, stol_ok, where, k, err, n)) return false;
        json_t *kv;
        const char *kk;
        json_object_foreach(v, kk, kv) if (strcmp(kk, "rtol") && strcmp(kk, "atol") && strcmp(kk, "stol"))
            return kb_fail(err, n, "%s: tolerance for solution '%s' has an unknown field '%s'", where, k, kk);
    }
    return true;
}

static bool parse_io(kb_def *d, json_t *a, bool out, const kb_kind *kk, char *err, size_t n) {
    const int want = out ? kk->n_out : kk->n_in;
    const char *const *names = out ? kk->out : kk->in;
    const char *what = out ? "outputs" : "inputs";
    if (!json_is_array(a) || (int)json_array_size(a) != want)
        return kb_fail(err, n, "%s: '%s' must list %d entries for op %s", d->name, what, want, osp_op_name(d->kind));
    for (int i = 0; i < want; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        kb_io *io = out ? &d->out[i] : &d->in[i];
        static const char *const keys_in[] = {"name", "shape", "dtype", NULL};
        static const char *const keys_out[] = {"name", "shape", "dtype", "tol", NULL};
        if (!json_is_object(e) || !only_keys(e, out ? keys_out : keys_in, d->name, err, n)) return false;
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (!nm || strcmp(nm, names[i]))
            return kb_fail(err, n, "%s: %s[%d] must be named '%s'", d->name, what, i, names[i]);
        snprintf(io->name, sizeof io->name, "%s", nm);
        const char *dt = json_string_value(json_object_get(e, "dtype"));
        if (!dt || !dtype_of(dt, &io->dtype)) return kb_fail(err, n, "%s: %s '%s': unknown dtype", d->name, what, nm);
        json_t *sh = json_object_get(e, "shape");
        if (!json_is_array(sh) || json_array_size(sh) < 1 || json_array_size(sh) > 3)
            return kb_fail(err, n, "%s: %s '%s': 'shape' must be 1 to 3 dimension names", d->name, what, nm);
        io->n_shape = (int)json_array_size(sh);
        char got[96] = "";
        for (int k = 0; k < io->n_shape; k++) {
            const char *entry = json_string_value(json_array_get(sh, (size_t)k));
            /* an extent: dimension names and positive integers joined by '*' and '+' ("B*Q", "2*F") */
            if (!entry || !entry[0] || strlen(entry) > 40)
                return kb_fail(err, n, "%s: %s '%s': shape entries are strings of dimensions", d->name, what, nm);
            char buf[48];
            snprintf(buf, sizeof buf, "%s", entry);
            for (char *save = NULL, *f = strtok_r(buf, "*+", &save); f; f = strtok_r(NULL, "*+", &save)) {
                char *end;
                const long v = strtol(f, &end, 10);
                if (!(*end == 0 && v > 0) && dim_index(d, f) < 0)
                    return kb_fail(err, n, "%s: %s '%s': '%s' in its shape is no dimension", d->name, what, nm, f);
            }
            const size_t l = strlen(got);
            snprintf(got + l, sizeof got - l, "%s%s", k ? "," : "", entry);
        }
        const char *want_shape = out ? kk->out_shape[i] : kk->in_shape[i];
        if (strcmp(got, want_shape))
            return kb_fail(err, n, "%s: %s '%s' has shape [%s]; op %s's is [%s]", d->name, what, nm, got,
                        osp_op_name(d->kind), want_shape);
        if (out && !parse_tol(json_object_get(e, "tol"), io, d->name, d->kind == OSP_OP_MATMUL, err, n)) return false;
    }
    if (out) d->n_out = want;
    else d->n_in = want;
    return true;
}

static bool parse_root(json_t *root, const char *path, kb_def *d, char *err, size_t errn);

bool kb_def_load(const char *path, kb_def *d, char *err, size_t errn) {
    memset(d, 0, sizeof *d);
    if (strlen(path) >= sizeof d->path) return kb_fail(err, errn, "definition path too long: %s", path);
    memcpy(d->path, path, strlen(path) + 1);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) return kb_fail(err, errn, "%s:%d: %s", path, je.line, je.text);
    return parse_root(root, path, d, err, errn);
}

bool kb_def_parse(const char *text, size_t len, const char *where, kb_def *d, char *err, size_t errn) {
    memset(d, 0, sizeof *d);
    if (strlen(where) >= sizeof d->path) return kb_fail(err, errn, "definition name too long: %s", where);
    memcpy(d->path, where, strlen(where) + 1);
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return kb_fail(err, errn, "%s:%d: %s", where, je.line, je.text);
    return parse_root(root, where, d, err, errn);
}

/* takes the reference to root */
static bool parse_root(json_t *root, const char *path, kb_def *d, char *err, size_t errn) {
    bool ok = false;
    static const char *const keys[] = {"name", "op", "description", "dims", "params", "inputs", "outputs", "workloads", NULL};
    if (!json_is_object(root) || !only_keys(root, keys, path, err, errn)) goto done;
    const char *name = json_string_value(json_object_get(root, "name")), *op = json_string_value(json_object_get(root, "op"));
    if (!name || !op || !json_is_string(json_object_get(root, "description"))) {
        kb_fail(err, errn, "%s: 'name', 'op' and 'description' are required strings", path);
        goto done;
    }
    snprintf(d->name, sizeof d->name, "%s", name);
    int kind = -1;
    for (int k = 0; k < OSP_OP_COUNT; k++)
        if (!strcmp(op, osp_op_name((osp_op_kind)k))) kind = k;
    const kb_kind *kk = kind >= 0 ? kb_kind_of((osp_op_kind)kind) : NULL;
    if (!kk) {
        kb_fail(err, errn, "%s: op '%s' is not an op kind the proving ground has an adapter for", path, op);
        goto done;
    }
    d->kind = (osp_op_kind)kind;
    /* dimensions: the kind's, in its order */
    json_t *dims = json_object_get(root, "dims");
    if (!json_is_object(dims) || (int)json_object_size(dims) != kk->n_dims) {
        kb_fail(err, errn, "%s: 'dims' must give the %d dimensions of op %s", path, kk->n_dims, op);
        goto done;
    }
    d->n_dims = kk->n_dims;
    for (int i = 0; i < kk->n_dims; i++) {
        json_t *dv = json_object_get(dims, kk->dims[i]);
        static const char *const dkeys[] = {"min", "max", "multiple", NULL};
        if (!json_is_object(dv) || !only_keys(dv, dkeys, path, err, errn)) {
            if (!json_is_object(dv)) kb_fail(err, errn, "%s: dimension '%s' missing", path, kk->dims[i]);
            goto done;
        }
        kb_dim *dm = &d->dims[i];
        snprintf(dm->name, sizeof dm->name, "%s", kk->dims[i]);
        dm->min = json_integer_value(json_object_get(dv, "min"));
        dm->max = json_integer_value(json_object_get(dv, "max"));
        dm->multiple = json_is_integer(json_object_get(dv, "multiple")) ? json_integer_value(json_object_get(dv, "multiple")) : 1;
        const int64_t lo = kk->may_be_zero && !strcmp(kk->may_be_zero, dm->name) ? 0 : 1;
        if (dm->min < lo || dm->max < dm->min || dm->multiple < 1 || dm->multiple > dm->max || dm->max > (1 << 24) ||
            (dm->max == 0)) {
            kb_fail(err, errn, "%s: dimension '%s': need %lld <= min <= max <= 2^24, max >= 1, 1 <= multiple <= max", path,
                 dm->name, (long long)lo);
            goto done;
        }
    }
    /* parameters by kind */
    json_t *pr = json_object_get(root, "params");
    static const char *const pkeys[] = {"eps", "scale", "act", "wtype", "window", "neox", "theta", "n_rot", NULL};
    if (pr && (!json_is_object(pr) || !only_keys(pr, pkeys, path, err, errn))) {
        if (!json_is_object(pr)) kb_fail(err, errn, "%s: 'params' must be an object", path);
        goto done;
    }
    d->eps = pr && json_is_number(json_object_get(pr, "eps")) ? json_number_value(json_object_get(pr, "eps")) : 1e-6;
    d->scale = pr && json_is_number(json_object_get(pr, "scale")) ? json_number_value(json_object_get(pr, "scale"))
               : d->kind == OSP_OP_ATTENTION                      ? 0.0
                                                                  : 1.0;
    d->window = pr && json_is_integer(json_object_get(pr, "window")) ? (int)json_integer_value(json_object_get(pr, "window")) : 0;
    d->neox = pr && json_is_true(json_object_get(pr, "neox"));
    d->theta = pr && json_is_number(json_object_get(pr, "theta")) ? json_number_value(json_object_get(pr, "theta")) : 10000.0;
    d->n_rot = pr && json_is_integer(json_object_get(pr, "n_rot")) ? (int)json_integer_value(json_object_get(pr, "n_rot")) : 0;
    if (d->n_rot < 0 || d->n_rot % 2 || !(d->theta > 1.0)) {
        kb_fail(err, errn, "%s: 'n_rot' must be even and >= 0, 'theta' > 1", path);
        goto done;
    }
    if (d->window < 0) {
        kb_fail(err, errn, "%s: 'window' must be >= 0", path);
        goto done;
    }
    const char *act = pr ? json_string_value(json_object_get(pr, "act")) : NULL;
    d->act = act && !strcmp(act, "gelu_tanh") ? OSP_GLU_GELU_TANH : OSP_GLU_SILU;
    if (act && strcmp(act, "gelu_tanh") && strcmp(act, "silu")) {
        kb_fail(err, errn, "%s: 'act' is silu or gelu_tanh", path);
        goto done;
    }
    const char *wt = pr ? json_string_value(json_object_get(pr, "wtype")) : NULL;
    d->wtype = OSP_DTYPE_F32;
    if (wt && !dtype_of(wt, &d->wtype)) {
        kb_fail(err, errn, "%s: unknown 'wtype' %s", path, wt);
        goto done;
    }
    if ((d->kind == OSP_OP_SCALE || d->kind == OSP_OP_SOFTCAP) && !(d->scale > 0.0)) {
        kb_fail(err, errn, "%s: 'scale' must be > 0", path);
        goto done;
    }
    if (!parse_io(d, json_object_get(root, "inputs"), false, kk, err, errn) ||
        !parse_io(d, json_object_get(root, "outputs"), true, kk, err, errn))
        goto done;
    /* workloads */
    json_t *wls = json_object_get(root, "workloads");
    if (!json_is_array(wls) || json_array_size(wls) < 1 || json_array_size(wls) > KB_MAX_WORKLOADS / 2) {
        kb_fail(err, errn, "%s: 'workloads' must list 1 to %d workloads", path, KB_MAX_WORKLOADS / 2);
        goto done;
    }
    for (size_t w = 0; w < json_array_size(wls); w++) {
        json_t *e = json_array_get(wls, w);
        static const char *const wkeys[] = {"id", "dims", "gen", "big", NULL};
        if (!json_is_object(e) || !only_keys(e, wkeys, path, err, errn)) {
            if (!json_is_object(e)) kb_fail(err, errn, "%s: workload %zu is not an object", path, w);
            goto done;
        }
        kb_workload *wl = &d->wl[d->n_workloads++];
        const char *id = json_string_value(json_object_get(e, "id"));
        if (!id) {
            kb_fail(err, errn, "%s: workload %zu has no 'id'", path, w);
            goto done;
        }
        snprintf(wl->id, sizeof wl->id, "%s", id);
        const char *gen = json_string_value(json_object_get(e, "gen"));
        wl->gen = KB_GEN_NORMAL;
        if (gen) {
            int gi = -1;
            for (int g = 0; g < KB_GEN_COUNT; g++)
                if (!strcmp(gen, k_gen_names[g])) gi = g;
            if (gi < 0) {
                kb_fail(err, errn, "%s: workload '%s': unknown generator '%s'", path, id, gen);
                goto done;
            }
            wl->gen = (kb_gen)gi;
        }
        json_t *wd = json_object_get(e, "dims");
        if (!json_is_object(wd) || (int)json_object_size(wd) != d->n_dims) {
            kb_fail(err, errn, "%s: workload '%s' must give every dimension", path, id);
            goto done;
        }
        for (int i = 0; i < d->n_dims; i++) {
            json_t *v = json_object_get(wd, d->dims[i].name);
            const int64_t lo = kk->may_be_zero && !strcmp(kk->may_be_zero, d->dims[i].name) ? 0 : 1;
            if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > (1 << 24)) {
                kb_fail(err, errn, "%s: workload '%s': dimension '%s' must be an integer in [%lld, 2^24]", path, id,
                     d->dims[i].name, (long long)lo);
                goto done;
            }
            wl->dim[i] = json_integer_value(v);
        }
        json_t *big = json_object_get(e, "big");
        if (big && !json_is_boolean(big)) {
            kb_fail(err, errn, "%s: workload '%s': 'big' must be true or false", path, id);
            goto done;
        }
        wl->big = json_is_true(big);
        /* the case's size limit, here rather than at the first run (a big workload skipped by the CPU
         * gate would otherwise first fail on the device) */
        const double elems = kb_case_elements(d, wl->dim);
        if (!(elems <= KB_MAX_CASE_ELEMENTS)) {
            kb_fail(err, errn, "%s: workload '%s' needs %.3g elements (inputs and outputs); the proving ground takes at "
                               "most 2^28 a case", path, id, elems);
            goto done;
        }
    }
    ok = true;
done:
    json_decref(root);
    return ok;
}

void kb_def_add_hidden(kb_def *d, int n, uint64_t seed) {
    uint64_t s = seed ^ 0x68696464656eull;
    for (int i = 0; i < n && d->n_workloads < KB_MAX_WORKLOADS; i++) {
        kb_workload *wl = &d->wl[d->n_workloads++];
        memset(wl, 0, sizeof *wl);
        wl->hidden = true;
        wl->gen = (kb_gen)(i % KB_GEN_COUNT);
        for (int k = 0; k < d->n_dims; k++) {
            const kb_dim *dm = &d->dims[k];
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            /* half the draws small (the tails of little shapes), half over the whole range */
            const int64_t hi = (s >> 63) ? dm->max : (dm->min + 16 * dm->multiple < dm->max ? dm->min + 16 * dm->multiple : dm->max);
            int64_t v = dm->min + (int64_t)((s >> 20) % (uint64_t)(hi - dm->min + 1));
            v = (v + dm->multiple - 1) / dm->multiple * dm->multiple;
            if (v > dm->max) v = dm->max / dm->multiple * dm->multiple;
            wl->dim[k] = v < dm->multiple && dm->min > 0 ? dm->multiple : v;
        }
        snprintf(wl->id, sizeof wl->id, "hidden-%d-%s", i, kb_gen_name(wl->gen));
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int kb_defs_load_dir(const char *dir, kb_def **defs, char *err, size_t errn) {
    DIR *dp = opendir(dir);
    if (!dp) return kb_fail(err, errn, "cannot open the definitions directory %s", dir), -1;
    char *names[256];
    int n = 0;
    struct dirent *e;
    bool too_many = false;
    while ((e = readdir(dp))) {
        const size_t l = strlen(e->d_name);
        if (l <= 5 || strcmp(e->d_name + l - 5, ".json")) continue;
        if (n == 256) {
            too_many = true;
            break;
        }
        names[n++] = strdup(e->d_name);
    }
    closedir(dp);
    if (too_many) {
        for (int i = 0; i < n; i++) free(names[i]);
        return kb_fail(err, errn, "%s: more than 256 definitions", dir), -1;
    }
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    *defs = calloc((size_t)(n ? n : 1), sizeof(kb_def));
    int rc = n;
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (rc >= 0 && !kb_def_load(path, &(*defs)[i], err, errn)) rc = -1;
        free(names[i]);
    }
    if (rc < 0) free(*defs), *defs = NULL;
    return rc;
}

/* ---- workloads from a serving trace ------------------------------------------------------------ */

typedef struct shape_count {
    int64_t v[3];
    int n;
} shape_count;

static void count_shape(shape_count *sc, int *n_sc, int cap, int64_t a, int64_t b, int64_t c) {
    for (int i = 0; i < *n_sc; i++)
        if (sc[i].v[0] == a && sc[i].v[1] == b && sc[i].v[2] == c) {
            sc[i].n++;
            return;
        }
    if (*n_sc < cap) sc[(*n_sc)++] = (shape_count){{a, b, c}, 1};
}

static int cmp_count(const void *x, const void *y) {
    const shape_count *a = x, *b = y;
    return a->n != b->n ? b->n - a->n : memcmp(a->v, b->v, sizeof a->v);
}

/* the definition's fixed dimensions (min == max) keep their value; the trace gives the others */
static int64_t fixed_or(const kb_def *d, int k, int64_t v) {
    if (d->dims[k].min == d->dims[k].max) return d->dims[k].min;
    if (v < d->dims[k].min) v = d->dims[k].min;
    return v;
}

int kb_def_add_trace(kb_def *d, const char *path, int max_new, char *err, size_t errn) {
    FILE *f = fopen(path, "r");
    if (!f) return kb_fail(err, errn, "cannot open the trace %s", path), -1;
    enum { CAP = 4096 };
    shape_count *sc = calloc(CAP, sizeof *sc);
    int n_sc = 0, line_no = 0;
    char *line = NULL;
    size_t lcap = 0;
    while (getline(&line, &lcap, f) > 0) {
        line_no++;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        json_t *ql = json_object_get(o, "q_lens"), *sl = json_object_get(o, "seq_lens");
        const int64_t T = json_integer_value(json_object_get(o, "num_tokens")), R = json_integer_value(json_object_get(o, "num_logits"));
        if (!o || !json_is_array(ql) || !json_is_array(sl) || json_array_size(ql) != json_array_size(sl) || T < 1) {
            json_decref(o);
            free(line), free(sc), fclose(f);
            return kb_fail(err, errn, "%s:%d: not a step of osprey serve --trace-shapes", path, line_no), -1;
        }
        switch (d->kind) {
        case OSP_OP_ATTENTION: /* per sequence: (P, Q) */
        case OSP_OP_ROPE_KV_WRITE:
            for (size_t i = 0; i < json_array_size(ql); i++) {
                const int64_t q = json_integer_value(json_array_get(ql, i)), L = json_integer_value(json_array_get(sl, i));
                if (q > 0 && L >= q) count_shape(sc, &n_sc, CAP, L - q, q, 0);
            }
            break;
        case OSP_OP_GATHER_RMSNORM: count_shape(sc, &n_sc, CAP, T, R > 0 ? R : 1, 0); break;
        case OSP_OP_SCALE:
        case OSP_OP_SOFTCAP: count_shape(sc, &n_sc, CAP, R > 0 ? R : 1, 0, 0); break;
        default: count_shape(sc, &n_sc, CAP, T, 0, 0); break; /* token rows */
        }
        json_decref(o);
    }
    free(line);
    fclose(f);
    qsort(sc, (size_t)n_sc, sizeof *sc, cmp_count);
    int added = 0;
    for (int i = 0; i < n_sc && added < max_new && d->n_workloads < KB_MAX_WORKLOADS; i++) {
        kb_workload *wl = &d->wl[d->n_workloads];
        memset(wl, 0, sizeof *wl);
        for (int k = 0; k < d->n_dims; k++) {
            const char *nm = d->dims[k].name;
            int64_t v = d->wl[0].dim[k]; /* dimensions a trace does not give: the first listed workload's */
            if (d->kind == OSP_OP_ATTENTION) v = !strcmp(nm, "B") ? 1 : !strcmp(nm, "P") ? sc[i].v[0] : !strcmp(nm, "Q") ? sc[i].v[1] : v;
            else if (d->kind == OSP_OP_ROPE_KV_WRITE) v = !strcmp(nm, "P") ? sc[i].v[0] : !strcmp(nm, "T") ? sc[i].v[1] : v;
            else if (d->kind == OSP_OP_GATHER_RMSNORM) v = !strcmp(nm, "T") ? sc[i].v[0] : !strcmp(nm, "R") ? sc[i].v[1] : v;
            else if (d->kind == OSP_OP_SCALE || d->kind == OSP_OP_SOFTCAP) v = !strcmp(nm, "R") ? sc[i].v[0] : v;
            else if (!strcmp(nm, "T")) v = sc[i].v[0];
            wl->dim[k] = fixed_or(d, k, v);
        }
        snprintf(wl->id, sizeof wl->id, "trace-%d-x%d", i, sc[i].n);
        d->n_workloads++, added++;
    }
    free(sc);
    return added;
}
