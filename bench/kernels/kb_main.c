/* `osprey bench-kernels`: every (solution, definition) pair in a child process with a timeout (a hung
 * or crashing kernel fails alone), the gate on every workload (listed and hidden), then the timing of
 * those that passed; one JSON report and a table. Exit status 0 only when every gate passed (a
 * solution that does not support a definition is reported, not failed).
 *
 *   osprey bench-kernels [--defs DIR] [--op NAME] [--solution cpu|cpu-exact|cuda]... [--gate-only]
 *                        [--hidden N] [--no-listed] [--no-big] [--seeds K] [--seed S] [--timeout SECONDS] [--out FILE]
 *                        [--min-time SECONDS] [--trace FILE] [--markdown]
 *
 * The hidden workloads are drawn from each definition's ranges with --seed (default: from the clock),
 * which the report logs, so a run can be repeated exactly. --trace FILE adds, to every definition, the
 * 8 most frequent step shapes of a serving trace (`osprey serve --trace-shapes FILE`).
 *
 * Each timed workload's "timing" in the report: median_us, p10_us, p90_us, reps, by the clock named in
 * "clock": "device" (the backend's device time of the op's kernels, CUDA events: backend.h
 * run_device_us) or "wall" (the wall time around each run: the CPU); wall_median_us, the wall clock's
 * median around the same runs either way; gbps and gflops (the adapter's bytes and FLOPs over the
 * median); setup_us (the gate's first prepare + first run of that
 * workload: weights placed, plans made, modules loaded; osprey compiles its kernels ahead of time, so
 * there is no JIT time to add); the ceilings measured once per child at its first timing: copy_gbps
 * (always) and gemm_gflops (matmul and attention only, 0 elsewhere), fraction_of_copy_bw, and
 * fraction_of_gemm_peak where gemm_gflops and gflops are both > 0; "ceiling" ("bw" or "gemm") names the
 * larger fraction, fraction_of_ceiling its value. The report's "summary": per (solution, definition)
 * with timings, the count, best and median fraction_of_ceiling, and how many were bound by each. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "backend/backend.h"
#include "bench/kernels/kb_internal.h"

#include "osprey_commit.h" /* OSPREY_GIT_COMMIT, generated at build time (cmake/git_commit.cmake) */
#ifdef __clang__
#define KB_COMPILER "clang " __clang_version__
#else
#define KB_COMPILER "gcc " __VERSION__
#endif
#ifndef OSPREY_C_FLAGS
#define OSPREY_C_FLAGS "unknown"
#endif

typedef struct opts {
    const char *defs_dir, *op, *out, *trace, *solutions[4];
    int n_solutions, hidden, seeds, timeout_s;
    bool gate_only, markdown, warm, no_listed, no_big;
    uint64_t seed;
    double min_time;
} opts;

static void usage(void) {
    fprintf(stderr, "usage: osprey bench-kernels [--defs DIR] [--op NAME] [--solution cpu|cpu-exact|cuda|DEVICE:KIND/vN[+KEY=VALUE]]... "
                    "[--gate-only] [--hidden N] [--no-listed] [--no-big] [--seeds K] [--seed S] [--timeout SECONDS] [--min-time SECONDS] [--warm] "
                    "[--out FILE] [--trace FILE] [--markdown]\n"
                    "       osprey bench-kernels --list\n"
                    "       osprey bench-kernels --make-table REPORT.json... -o TABLE.json\n");
}

static void usage_long(void) {
    printf("usage: osprey bench-kernels [options]\n"
           "  --defs DIR          definitions (default: $OSPREY_ROOT/bench/kernels/defs, else ./bench/kernels/defs)\n"
           "  --op NAME           only the definitions of this name or op kind (attention, matmul, ...)\n"
           "  --solution S        cpu (default), cpu-exact or cuda (every op kind at the backend's default), or a\n"
           "                      registered version DEVICE:KIND/vN (cuda:attention/v1, cpu:matmul/v0; --list),\n"
           "                      or DEVICE:KIND (that kind's default), each with optional +KEY=VALUE settings\n"
           "                      (cuda+OSPREY_CUDA_ATTENTION=v0); up to 4. A version runs its op kind's\n"
           "                      definitions only and reports shapes its predicate rejects as unsupported\n"
           "  --gate-only         the correctness gate only, no timing\n"
           "  --hidden N          hidden workloads drawn per definition (14)\n"
           "  --no-listed         only the hidden workloads, not the definitions' listed ones (sanitizer samples)\n"
           "  --no-big            not the listed workloads marked \"big\": true (device-sized shapes whose fp64\n"
           "                      reference takes seconds; the CPU gate in ctest, the sanitizer samples)\n"
           "  --seeds K           fresh inputs per workload (3)\n"
           "  --seed S            the hidden workloads' and inputs' seed (default: the clock; logged)\n"
           "  --trace FILE        add the most frequent step shapes of `osprey serve --trace-shapes FILE`\n"
           "  --timeout SECONDS   per (solution, definition) child process (300)\n"
           "  --min-time SECONDS  timing: run each workload at least this long (0.2)\n"           "  --warm              timing: no cache flush between runs (by default the device's last-level cache\n"
           "                      is evicted before each timed run: a copy of twice its size, untimed)\n"
           "  --out FILE          the JSON report\n"
           "  --markdown          the table in markdown\n"           "  --list              the kernel registry: every version of every op kind, its predicate and selection\n"
           "  --make-table R.json... -o TABLE.json\n"
           "                      a runtime selection table from reports (one device): per (op kind, head_dim,\n"
           "                      KV dtype) the fastest version that passed the gate on every workload it ran\n"
           "                      (osprey serve --kernel-table TABLE.json, or OSPREY_KERNEL_TABLE)\n"
           "Exit status 0 when every gate passed; 1 when one failed (or the report could not be written); 2 on\n"
           "bad options.\n");
}

static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(buf, n, "%s", strchr(line, ':') + 2);
            buf[strcspn(buf, "\n")] = 0;
            break;
        }
    fclose(f);
}

/* The child: one solution, one definition, every workload; one JSON object per workload on fd. */
static int child(const opts *o, const char *sol_name, const kb_def *d, int fd) {
    kb_solution s;
    char err[256];
    json_t *res = json_array(), *dev_j = NULL;
    if (!kb_solution_backend(sol_name, &s, err, sizeof err)) {
        json_array_append_new(res, json_pack("{s:s,s:s}", "status", "unavailable", "detail", err));
    } else {
        s.flush_between_runs = !o->warm;
        osp_device_info di = {0};
        kb_solution_spec sp;
        if (kb_solution_parse(sol_name, &sp, err, sizeof err) && osp_backend_device_info(sp.device, &di) == OSP_OK)
            dev_j = json_pack("{s:s,s:s,s:i,s:i,s:I}", "backend", sp.device == OSP_DEVICE_CUDA ? "cuda" : "cpu", "name",
                              di.name, "arch", di.arch, "driver_major", di.driver_major, "cache_bytes",
                              (json_int_t)di.cache_bytes);
        /* the ceilings, measured once per child at its first timing: the copy bandwidth always, the GEMM
         * rate only where FLOPs can bind (matmul, attention; ~0.1 s on a GPU) */
        double copy_gbps = 0.0, gemm_gflops = 0.0;
        bool measured = false;
        const bool flops_matter = d->kind == OSP_OP_MATMUL || d->kind == OSP_OP_ATTENTION;
        for (int w = 0; w < d->n_workloads; w++) {
            const kb_workload *wl = &d->wl[w];
            if (o->no_listed && !wl->hidden) continue;
            if (o->no_big && wl->big) continue;
            const uint64_t seed0 = o->seed * 1000003ull + (uint64_t)w * 7919ull;
            json_t *dims = json_object();
            for (int k = 0; k < d->n_dims; k++) json_object_set_new(dims, d->dims[k].name, json_integer(wl->dim[k]));
            /* a big workload on one input: its reference costs seconds, the small ones cover the seeds */
            kb_gate_result g = kb_gate(&s, d, wl, seed0, wl->big ? 1 : o->seeds);
            json_t *e = json_pack("{s:s,s:b,s:s,s:o,s:s,s:s,s:f,s:i,s:s}", "workload", wl->id, "hidden", wl->hidden, "gen",
                                  kb_gen_name(wl->gen), "dims", dims, "gate", kb_check_name(g.check), "detail",
                                  g.detail, "worst_err_over_tol", g.worst_ratio, "seeds", g.seeds, "unchecked_inputs",
                                  g.unchecked);
            char ver[64];
            if (kb_solution_version(sol_name, d, wl->dim, di.arch, ver, sizeof ver))
                json_object_set_new(e, "version", json_string(ver));
            if (g.check == KB_OK && !o->gate_only) {
                if (!measured) {
                    copy_gbps = s.copy_gbps ? s.copy_gbps(&s) : 0.0;
                    gemm_gflops = flops_matter && s.gemm_gflops ? s.gemm_gflops(&s) : 0.0;
                    measured = true;
                }
                kb_timing t;
                if (kb_time(&s, d, wl, seed0, o->min_time, 2000, &t, err, sizeof err)) {
                    const double f_bw = copy_gbps > 0.0 ? t.gbps / copy_gbps : 0.0;
                    const double f_gemm = gemm_gflops > 0.0 && t.gflops > 0.0 ? t.gflops / gemm_gflops : -1.0;
                    json_t *tj = json_pack("{s:f,s:f,s:f,s:f,s:i,s:f,s:f,s:f,s:f,s:f,s:f,s:I,s:b}", "median_us", t.median_us,
                                           "p10_us", t.p10_us, "p90_us", t.p90_us, "setup_us", g.setup_us, "reps", t.reps,
                                           "gflops", t.gflops, "gbps", t.gbps, "copy_gbps", copy_gbps,
                                           "fraction_of_copy_bw", f_bw, "gemm_gflops", gemm_gflops, "launches_per_run",
                                           t.launches_per_run, "flush_bytes", (json_int_t)t.flush_bytes, "resident",
                                           t.resident);
                    /* which clock median_us / p10_us / p90_us (and the rates) are of; the wall median beside */
                    json_object_set_new(tj, "clock", json_string(t.device_clock ? "device" : "wall"));
                    json_object_set_new(tj, "wall_median_us", json_real(t.wall_median_us));
                    if (f_gemm >= 0.0) json_object_set_new(tj, "fraction_of_gemm_peak", json_real(f_gemm));
                    /* the binding ceiling: the one the op comes closest to */
                    json_object_set_new(tj, "ceiling", json_string(f_gemm > f_bw ? "gemm" : "bw"));
                    json_object_set_new(tj, "fraction_of_ceiling", json_real(f_gemm > f_bw ? f_gemm : f_bw));
                    json_object_set_new(e, "timing", tj);
                } else {
                    json_object_set_new(e, "timing_error", json_string(err));
                }
            }
            json_array_append_new(res, e);
        }
        s.close(&s);
    }
    json_t *all = json_pack("{s:o,s:o}", "device", dev_j ? dev_j : json_null(), "workloads", res);
    char *txt = json_dumps(all, JSON_COMPACT);
    size_t len = strlen(txt), off = 0;
    while (off < len) {
        const ssize_t k = write(fd, txt + off, len - off);
        if (k <= 0) break;
        off += (size_t)k;
    }
    free(txt);
    json_decref(all);
    close(fd);
    return 0;
}

kb_isolation kb_isolate(int timeout_s, int (*fn)(void *ctx, int fd), void *ctx, char **text) {
    *text = NULL;
    int p[2];
    if (pipe(p)) return KB_ISOLATE_ERROR;
    fflush(stdout), fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) return close(p[0]), close(p[1]), KB_ISOLATE_ERROR;
    if (pid == 0) {
        close(p[0]);
        /* a crash must end the child, whatever handlers the parent installed (a test framework's) */
        static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
        const int rc = fn(ctx, p[1]);
        close(p[1]);
        _exit(rc);
    }
    close(p[1]);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    const time_t t_end = time(NULL) + (timeout_s > 0 ? timeout_s : 1);
    bool timed_out = false;
    for (;;) {
        const time_t left = t_end - time(NULL);
        if (left <= 0) { timed_out = true; break; }
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        const int r = poll(&pf, 1, (int)(left * 1000));
        if (r == 0) { timed_out = true; break; }
        if (r < 0 && errno == EINTR) continue;
        if (cap - len < 65536) {
            cap = cap ? 2 * cap : 1 << 17;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        const ssize_t k = read(p[0], buf + len, cap - len - 1);
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(p[0]);
    if (timed_out) kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
    if (buf) buf[len] = 0;
    *text = buf;
    if (timed_out) return KB_ISOLATE_TIMEOUT;
    if (WIFSIGNALED(st)) return KB_ISOLATE_CRASHED;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? KB_ISOLATE_DONE : KB_ISOLATE_ERROR;
}

typedef struct child_ctx {
    const opts *o;
    const char *sol;
    const kb_def *d;
} child_ctx;

static int child_fn(void *ctx, int fd) {
    const child_ctx *c = ctx;
    return child(c->o, c->sol, c->d, fd);
}

/* Runs (solution, definition) in a child and parses its JSON: the workloads' results (returned) and
 * the device it ran on (*device, NULL when not reported); a timeout or a crash becomes a result of
 * its own. */
static json_t *run_isolated(const opts *o, const char *sol, const kb_def *d, json_t **device) {
    child_ctx cc = {o, sol, d};
    char *text = NULL;
    const kb_isolation r = kb_isolate(o->timeout_s, child_fn, &cc, &text);
    json_t *res = NULL;
    if (r == KB_ISOLATE_TIMEOUT) res = json_pack("[{s:s,s:i}]", "status", "timeout", "after_s", o->timeout_s);
    else if (r == KB_ISOLATE_CRASHED) res = json_pack("[{s:s}]", "status", "crashed");
    else {
        json_error_t je;
        json_t *all = text && r == KB_ISOLATE_DONE ? json_loads(text, 0, &je) : NULL;
        res = json_incref(json_object_get(all, "workloads"));
        if (device && json_is_object(json_object_get(all, "device"))) *device = json_incref(json_object_get(all, "device"));
        json_decref(all);
        if (!json_is_array(res)) {
            json_decref(res);
            res = json_pack("[{s:s,s:s}]", "status", "error", "detail", "the child failed or wrote no report");
        }
    }
    free(text);
    return res;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static bool is_flag_with_value(const char *f) {
    static const char *const k[] = {"--defs", "--op", "--out", "--trace", "--solution", "--hidden", "--seeds",
                                    "--timeout", "--seed", "--min-time", "-o", NULL};
    for (int i = 0; k[i]; i++)
        if (!strcmp(f, k[i])) return true;
    return false;
}

/* A solution name the backends or the registry know (kb_solution_parse; the settings' values are
 * checked in the child), so a typo fails at once. */
static bool known_solution(const char *name, char *err, size_t n) {
    kb_solution_spec sp;
    return kb_solution_parse(name, &sp, err, n);
}

/* --list: the registry, one version a line */
static int list_registry(void) {
    printf("# the kernel registry (src/backend/kernel_registry.c): --solution DEVICE:KIND/vN runs one version\n");
    printf("%-28s %-8s %-34s %s\n", "version", "default", "selected by", "what");
    for (int i = 0; i < osp_kernel_registry_count(); i++) {
        const osp_kernel_version *v = osp_kernel_registry_at(i);
        char label[96], sel[96], rank[24];
        osp_kernel_label(v, label, sizeof label);
        if (v->env_key) snprintf(sel, sizeof sel, "%s=%s", v->env_key, v->env_value);
        else if (v->cpu_exact) snprintf(sel, sizeof sel, "--exact (cpu-exact)");
        else {
            int same = 0;
            for (int j = 0; j < osp_kernel_registry_count(); j++)
                same += osp_kernel_registry_at(j)->device == v->device && osp_kernel_registry_at(j)->kind == v->kind;
            snprintf(sel, sizeof sel, same > 1 ? "(when no other is selected)" : "(the only version)");
        }
        if (v->default_rank > 0) snprintf(rank, sizeof rank, "yes (%d)", (int)v->default_rank);
        else snprintf(rank, sizeof rank, "no");
        printf("%-28s %-8s %-34s %s%s\n", label, rank, sel, v->summary, v->table_choosable ? "; table-choosable" : "");
    }
    printf("# default (N): the backend's choice where the version applies, lowest N first\n");
    return 0;
}

/* --make-table REPORT.json... -o TABLE.json */
static int make_table_main(int argc, char **argv) {
    const char *out = NULL, *reports[64];
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-o") || !strcmp(argv[i], "--out")) {
            if (i + 1 >= argc) return fprintf(stderr, "bench-kernels: %s needs a file\n", argv[i]), 2;
            out = argv[++i];
        } else if (argv[i][0] == '-') {
            return fprintf(stderr, "bench-kernels --make-table: unknown option '%s'\n", argv[i]), 2;
        } else {
            if (n == 64) return fprintf(stderr, "bench-kernels --make-table: at most 64 reports\n"), 2;
            reports[n++] = argv[i];
        }
    }
    if (!n || !out) return fprintf(stderr, "usage: osprey bench-kernels --make-table REPORT.json... -o TABLE.json\n"), 2;
    char err[1024], summary[4096];
    if (!kb_make_table(n, reports, out, summary, sizeof summary, err, sizeof err))
        return fprintf(stderr, "bench-kernels --make-table: %s\n", err), 1;
    printf("%s", summary);
    return 0;
}

int kb_main(int argc, char **argv) {
    opts o = {.defs_dir = NULL, .hidden = 14, .seeds = 3, .timeout_s = 300, .min_time = 0.2};
    o.seed = (uint64_t)time(NULL);
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) return usage_long(), 0;
        if (!strcmp(f, "--list")) return list_registry();
        if (!strcmp(f, "--make-table")) return make_table_main(argc - i - 1, argv + i + 1);
        if (!strcmp(f, "--gate-only")) o.gate_only = true;
        else if (!strcmp(f, "--warm")) o.warm = true;
        else if (!strcmp(f, "--markdown")) o.markdown = true;
        else if (!strcmp(f, "--no-listed")) o.no_listed = true;
        else if (!strcmp(f, "--no-big")) o.no_big = true;
        else if (!is_flag_with_value(f)) return usage(), fprintf(stderr, "bench-kernels: unknown option '%s'\n", f), 2;
        else if (!v) return usage(), fprintf(stderr, "bench-kernels: %s needs a value\n", f), 2;
        else if (!strcmp(f, "--defs")) o.defs_dir = v, i++;
        else if (!strcmp(f, "--op")) o.op = v, i++;
        else if (!strcmp(f, "--out") || !strcmp(f, "-o")) o.out = v, i++;
        else if (!strcmp(f, "--trace")) o.trace = v, i++;
        else if (!strcmp(f, "--solution")) {
            if (o.n_solutions == 4) return fprintf(stderr, "bench-kernels: at most 4 --solution\n"), 2;
            char serr[256];
            if (!known_solution(v, serr, sizeof serr)) return fprintf(stderr, "bench-kernels: %s\n", serr), 2;
            o.solutions[o.n_solutions++] = v, i++;
        } else if (!strcmp(f, "--hidden") || !strcmp(f, "--seeds") || !strcmp(f, "--timeout")) {
            char *end;
            const long x = strtol(v, &end, 10);
            const long lo = strcmp(f, "--hidden") ? 1 : 0;
            if (*end || end == v || x < lo || x > 100000)
                return fprintf(stderr, "bench-kernels: %s takes a whole number from %ld to 100000, not '%s'\n", f, lo, v), 2;
            if (!strcmp(f, "--hidden")) o.hidden = (int)x;
            else if (!strcmp(f, "--seeds")) o.seeds = (int)x;
            else o.timeout_s = (int)x;
            i++;
        } else if (!strcmp(f, "--seed")) {
            char *end;
            o.seed = strtoull(v, &end, 10);
            if (*end || end == v || v[0] == '-')
                return fprintf(stderr, "bench-kernels: --seed takes a whole number >= 0, not '%s'\n", v), 2;
            i++;
        } else if (!strcmp(f, "--min-time")) {
            char *end;
            o.min_time = strtod(v, &end);
            if (*end || !(o.min_time >= 0.0 && o.min_time <= 60.0))
                return fprintf(stderr, "bench-kernels: --min-time takes seconds from 0 to 60, not '%s'\n", v), 2;
            i++;
        }
    }
    if (o.n_solutions == 0) o.solutions[o.n_solutions++] = "cpu";
    char dir[512];
    if (o.defs_dir) snprintf(dir, sizeof dir, "%s", o.defs_dir);
    else snprintf(dir, sizeof dir, "%s/bench/kernels/defs", getenv("OSPREY_ROOT") ? getenv("OSPREY_ROOT") : ".");
    kb_def *defs = NULL;
    char err[512];
    const int n_defs = kb_defs_load_dir(dir, &defs, err, sizeof err);
    if (n_defs < 0) return fprintf(stderr, "bench-kernels: %s\n", err), 1;
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    json_t *report = json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:i,s:i,s:b}", "tool", "osprey bench-kernels", "commit",
                               OSPREY_GIT_COMMIT, "compiler", KB_COMPILER, "c_flags", OSPREY_C_FLAGS, "host_cpu", cpu,
                               "seed", (json_int_t)o.seed, "hidden_per_def", o.hidden, "seeds_per_workload", o.seeds,
                               "gate_only", o.gate_only);
    int matching = 0;
    for (int di = 0; di < n_defs; di++)
        matching += !o.op || !strcmp(o.op, defs[di].name) || !strcmp(o.op, osp_op_name(defs[di].kind));
    /* a definition holds at most KB_MAX_WORKLOADS: the listed ones, the hidden ones and a trace's 8 */
    for (int di = 0; di < n_defs; di++) {
        const int room = KB_MAX_WORKLOADS - defs[di].n_workloads - (o.trace ? 8 : 0);
        if (o.hidden > room) {
            fprintf(stderr, "bench-kernels: --hidden %d: definition %s has room for %d hidden workloads (%d listed%s, "
                            "at most %d in all)\n",
                    o.hidden, defs[di].name, room < 0 ? 0 : room, defs[di].n_workloads, o.trace ? " + 8 from the trace" : "",
                    KB_MAX_WORKLOADS);
            free(defs);
            json_decref(report);
            return 2;
        }
    }
    /* the report's file, opened before the first run: a path that cannot be written fails now, not
     * after the whole gate (the file is rewritten at the end) */
    if (o.out) {
        FILE *f = fopen(o.out, "w");
        if (!f) {
            fprintf(stderr, "bench-kernels: cannot write the report %s: %s\n", o.out, strerror(errno));
            free(defs);
            json_decref(report);
            return 1;
        }
        fclose(f);
    }
    if (!matching) {
        fprintf(stderr, "bench-kernels: no definition in %s is named or of op '%s'; the definitions:", dir, o.op);
        for (int di = 0; di < n_defs; di++) fprintf(stderr, " %s", defs[di].name);
        fprintf(stderr, "\n");
        free(defs);
        return 1;
    }
    for (int di = 0; di < n_defs; di++) {
        /* the hidden set of a definition depends on the seed and its name, not on its neighbours */
        uint64_t h = 1469598103934665603ull;
        for (const char *p = defs[di].name; *p; p++) h = (h ^ (uint8_t)*p) * 1099511628211ull;
        kb_def_add_hidden(&defs[di], o.hidden, o.seed ^ h);
        if (o.trace && kb_def_add_trace(&defs[di], o.trace, 8, err, sizeof err) < 0)
            return fprintf(stderr, "bench-kernels: %s\n", err), free(defs), 1;
    }
    json_t *results = json_array();
    printf("# osprey bench-kernels: defs %s, seed %llu, %d hidden workloads a definition%s, %d inputs a workload, %s\n",
           dir, (unsigned long long)o.seed, o.hidden,
           o.no_listed ? " (and no listed one)" : o.no_big ? " (and the listed ones but the big)" : "", o.seeds,
           o.gate_only ? "gate only" : o.warm ? "gate, then timing (warm caches)" : "gate, then timing (cache flushed before each run)");
    json_object_set_new(report, "cache_flush", json_boolean(!o.gate_only && !o.warm));
    json_object_set_new(report, "listed_workloads", json_boolean(!o.no_listed));
    json_object_set_new(report, "big_workloads", json_boolean(!o.no_listed && !o.no_big));
    int failed = 0, passed = 0, ran_defs = 0;
    json_t *summary = json_array();
    if (o.markdown)
        printf("| solution | definition | workload | gate | median us (clock) | wall median us | setup us | GB/s | GFLOP/s | "
               "%% of ceiling |\n"
               "|---|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < o.n_solutions; si++)
        for (int di = 0; di < n_defs; di++) {
            kb_def *d = &defs[di];
            if (o.op && strcmp(o.op, d->name) && strcmp(o.op, osp_op_name(d->kind))) continue;
            kb_solution_spec sp;
            char serr[256];
            if (kb_solution_parse(o.solutions[si], &sp, serr, sizeof serr) && sp.only_kind != OSP_OP_COUNT &&
                sp.only_kind != d->kind)
                continue; /* a version of another op kind */
            ran_defs++;
            json_t *device = NULL;
            json_t *r = run_isolated(&o, o.solutions[si], d, &device);
            size_t i;
            json_t *e;
            double fr[KB_MAX_WORKLOADS];
            double best = 0.0;
            int n_fr = 0, n_gemm = 0;
            const char *best_ceiling = "bw";
            json_array_foreach(r, i, e) {
                const char *gate = json_string_value(json_object_get(e, "gate"));
                const char *status = json_string_value(json_object_get(e, "status"));
                const char *wl = json_string_value(json_object_get(e, "workload"));
                json_t *t = json_object_get(e, "timing");
                const bool ok = gate && (!strcmp(gate, "ok") || !strcmp(gate, "unsupported"));
                if (gate && !strcmp(gate, "ok")) passed++;
                if (!ok) failed++;
                const char *detail = json_string_value(json_object_get(e, "detail"));
                const double us = json_number_value(json_object_get(t, "median_us")),
                             setup = json_number_value(json_object_get(t, "setup_us")),
                             gbps = json_number_value(json_object_get(t, "gbps")),
                             gf = json_number_value(json_object_get(t, "gflops")),
                             frac = json_number_value(json_object_get(t, "fraction_of_ceiling"));
                const char *ceil = json_string_value(json_object_get(t, "ceiling"));
                const char *clock = json_string_value(json_object_get(t, "clock"));
                const double wall = json_number_value(json_object_get(t, "wall_median_us"));
                if (t && ok && ceil && n_fr < KB_MAX_WORKLOADS) {
                    if (n_fr == 0 || frac > best) best = frac, best_ceiling = ceil;
                    fr[n_fr++] = frac;
                    n_gemm += !strcmp(ceil, "gemm");
                }
                if (o.markdown) {
                    printf("| %s | %s | %s | %s |", o.solutions[si], d->name, wl ? wl : "-", gate ? gate : status);
                    if (t)
                        printf(" %.2f (%s) | %.2f | %.0f | %.2f | %.2f | %.1f (%s) |\n", us, clock ? clock : "-", wall, setup,
                               gbps, gf, 100.0 * frac, ceil ? ceil : "-");
                    else printf(" - | - | - | - | - | - |\n");
                } else {
                    printf("%-10s %-26s %-28s %-12s", o.solutions[si], d->name, wl ? wl : "-", gate ? gate : status);
                    if (t)
                        printf(" %10.2f us (%s clock; wall %.2f us) %8.2f GB/s %8.2f GFLOP/s (%5.1f%% of %s) setup %.0f us", us,
                               clock ? clock : "-", wall, gbps, gf, 100.0 * frac, ceil ? ceil : "-", setup);
                    const double lpr = json_number_value(json_object_get(t, "launches_per_run"));
                    if (t && lpr > 0.0) printf(" %5.1f launches", lpr);
                    if (!ok && detail) printf("  %s", detail);
                    const char *unc = json_string_value(json_object_get(e, "unchecked_inputs"));
                    if (ok && unc && unc[0]) printf("  (dependence not exercised for: %s)", unc);
                    printf("\n");
                }
                if (o.markdown && !ok && detail) fprintf(stderr, "%s %s %s: %s\n", o.solutions[si], d->name, wl ? wl : "-", detail);
            }
            json_array_append_new(results, json_pack("{s:s,s:s,s:s,s:o,s:o}", "solution", o.solutions[si], "definition",
                                                     d->name, "op", osp_op_name(d->kind), "device",
                                                     device ? device : json_null(), "workloads", r));
            if (n_fr > 0) { /* the per-definition summary: best and median fraction of the binding ceiling */
                qsort(fr, (size_t)n_fr, sizeof fr[0], cmp_double);
                const double med = n_fr % 2 ? fr[n_fr / 2] : 0.5 * (fr[n_fr / 2 - 1] + fr[n_fr / 2]);
                json_array_append_new(summary, json_pack("{s:s,s:s,s:s,s:i,s:f,s:s,s:f,s:i,s:i}", "solution",
                                                         o.solutions[si], "definition", d->name, "op",
                                                         osp_op_name(d->kind), "timed", n_fr, "best_fraction",
                                                         fr[n_fr - 1], "best_ceiling", best_ceiling, "median_fraction",
                                                         med, "bound_by_bw", n_fr - n_gemm, "bound_by_gemm", n_gemm));
            }
        }
    json_object_set_new(report, "results", results);
    if (json_array_size(summary) > 0) {
        /* per (solution, definition): how close its timed workloads came to the binding ceiling */
        printf(o.markdown ? "\n| solution | definition | timed | best %% of ceiling | median %% of ceiling | bound by (bw / gemm) |\n"
                            "|---|---|---|---|---|---|\n"
                          : "# per definition: timed workloads, best and median %% of the binding ceiling\n");
        size_t i;
        json_t *e;
        json_array_foreach(summary, i, e) {
            const char *sol = json_string_value(json_object_get(e, "solution")), *def = json_string_value(json_object_get(e, "definition")),
                       *bc = json_string_value(json_object_get(e, "best_ceiling"));
            const int timed = (int)json_integer_value(json_object_get(e, "timed")),
                      nbw = (int)json_integer_value(json_object_get(e, "bound_by_bw")),
                      ng = (int)json_integer_value(json_object_get(e, "bound_by_gemm"));
            const double best = 100.0 * json_number_value(json_object_get(e, "best_fraction")),
                         med = 100.0 * json_number_value(json_object_get(e, "median_fraction"));
            if (o.markdown) printf("| %s | %s | %d | %.1f (%s) | %.1f | %d / %d |\n", sol, def, timed, best, bc, med, nbw, ng);
            else printf("%-10s %-26s %3d timed  best %5.1f%% (%s)  median %5.1f%%  bound by bw %d, gemm %d\n", sol, def, timed,
                        best, bc, med, nbw, ng);
        }
    }
    json_object_set_new(report, "summary", summary);
    if (ran_defs == 0) {
        fprintf(stderr, "bench-kernels: no (solution, definition) pair to run: every solution names a version of an "
                        "op kind that no selected definition has\n");
        json_decref(report);
        free(defs);
        return 1;
    }
    bool report_failed = false;
    if (o.out && json_dump_file(report, o.out, JSON_INDENT(1)) != 0)
        fprintf(stderr, "bench-kernels: cannot write the report %s\n", o.out), report_failed = true;
    json_decref(report);
    free(defs);
    printf("# %d (solution, definition) runs: %d workloads passed the gate, %d failed (a run that could not start, timed "
           "out or crashed counts as one)\n", ran_defs, passed, failed);
    return failed || report_failed ? 1 : 0;
}
