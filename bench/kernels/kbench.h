/* The kernel proving ground (issue 16; in the spirit of FlashInfer-Bench): a definition says what an op
 * computes (bench/kernels/defs/<name>.json: the op kind, named dimensions with their ranges, inputs and
 * outputs with shapes and dtypes, the tolerance rule, listed workloads), a workload says on which
 * shapes and value distributions, a reference (plain C, fp64 accumulation: kb_ops.c) says the right
 * answer, and a solution (an osprey implementation of the op kind: the CPU backend's fast path, its
 * exact path, the CUDA backend) is timed only after it passes the gate:
 *   coverage     outputs are poisoned with NaN first (the solution's own output buffers: backend
 *                activations and KV page rows); every element must be written
 *   error        |got - ref| <= rtol |ref| + atol max|ref| per output, max over the whole output
 *                tensor (NaN never passes)
 *   determinism  the same inputs twice give the same bits (a race shows here)
 *   dependence   changing one element of any input (the last one: tails) changes the output wherever
 *                it changes the reference (an ignored input or a cached result shows here)
 * on several fresh inputs per workload (--seeds), over the listed workloads and a hidden set drawn
 * fresh from the dimension ranges in every run with a seed the report logs.
 *
 * bench/kernels/kb_main.c drives it (`osprey bench-kernels`): every (solution, definition) in a child
 * process with a timeout, one JSON report per run. tests/unit/test_kbench.c plants bugs and shows the
 * gate failing each. */
#ifndef OSP_BENCH_KERNELS_KBENCH_H
#define OSP_BENCH_KERNELS_KBENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/op.h"
#include "backend/kernel_registry.h"
#include "osprey/batch.h"

#define KB_MAX_DIMS 6
#define KB_MAX_IO 4
#define KB_MAX_WORKLOADS 64
#define KB_MAX_TOLS 4

typedef struct kb_dim {
    char name[16];
    int64_t min, max; /* the range hidden workloads draw from */
    int64_t multiple; /* drawn values are multiples of this (1 by default; quantized rows: 32) */
} kb_dim;

/* A per-solution tolerance: solution "" is the default. */
typedef struct kb_tol {
    char solution[24];
    double rtol, atol;
    /* times the element's error scale where the reference gives one (kb_case.ref_scale: a dot
     * product's sum of |terms|, which bounds the error of rounded inputs however much the terms
     * cancel); 0 elsewhere, and the loader accepts it only for op kinds with a scale (matmul) */
    double stol;
} kb_tol;

typedef struct kb_io {
    char name[24];
    int n_shape;    /* extents, rows first as the op stores them; each a product of dimensions and
                     * integers ("B*Q", "2*F"), the kind's own shape (kb_ops.c) */
    uint32_t dtype; /* OSP_DTYPE_*: the values the op reads (inputs are made representable in it) */
    int n_tol;
    kb_tol tol[KB_MAX_TOLS]; /* outputs */
} kb_io;

typedef enum kb_gen {
    KB_GEN_NORMAL = 0, /* N(0, 1) (Irwin-Hall of 4), times the input's scale */
    KB_GEN_HEAVY,      /* normal with one value in 64 multiplied by 64: outliers */
    KB_GEN_EQUAL,      /* one value everywhere */
    KB_GEN_LARGE,      /* normal times 2^10: near bf16 activations' large end, sums of squares ~ 1e12 */
    KB_GEN_COUNT
} kb_gen;

typedef struct kb_workload {
    char id[48];
    int64_t dim[KB_MAX_DIMS];
    kb_gen gen;
    bool hidden; /* drawn this run from the ranges */
    /* listed with "big": true: a shape large enough for the device's ceilings (an 8B model's prefill),
     * whose fp64 reference and CPU runs take seconds to minutes; `--no-big` skips these (the CPU gate
     * in ctest, the sanitizer samples), and the gate runs them on one input whatever --seeds says.
     * Listed workloads, big or not, may lie outside the dimensions' ranges, which are what hidden
     * workloads draw from. */
    bool big;
} kb_workload;

/* One definition (bench/kernels/defs/<name>.json). Parameters the op kind takes (eps, GLU activation,
 * scale, weight type) are fixed per definition: one definition per variant that matters. */
typedef struct kb_def {
    char name[48];
    char path[256];
    osp_op_kind kind;
    int n_dims;
    kb_dim dims[KB_MAX_DIMS];
    int n_in, n_out;
    kb_io in[KB_MAX_IO], out[KB_MAX_IO];
    double eps;     /* norms */
    double scale;   /* embed, scale, softcap (the cap), attention (0: 1 / sqrt(D)) */
    int window;     /* attention: sliding window (0: none) */
    bool neox;      /* rope_kv_write: rotate pairs (i, i + n_rot / 2) instead of (2i, 2i + 1) */
    double theta;   /* rope_kv_write: inv_freq[i] = theta^(-2i / n_rot) */
    int n_rot;      /* rope_kv_write: dimensions rotated per head (0: all of D) */
    int act;        /* GLU: osp_glu_act */
    uint32_t wtype; /* matmul: the stored weight type */
    int n_workloads;
    kb_workload wl[KB_MAX_WORKLOADS];
} kb_def;

/* Loads one definition; checks it against the op kind's adapter (kb_ops.c: the inputs, outputs and
 * dimensions the kind has). false with a message in err. */
bool kb_def_load(const char *path, kb_def *d, char *err, size_t errn);
/* The same from text (len bytes; `where` names it in messages): what the fuzz target drives. */
bool kb_def_parse(const char *text, size_t len, const char *where, kb_def *d, char *err, size_t errn);
/* Every *.json under dir, sorted by name, into *defs (caller frees). Returns the count, -1 on error. */
int kb_defs_load_dir(const char *dir, kb_def **defs, char *err, size_t errn);
/* Appends n hidden workloads drawn from the ranges with seed (generators cycle through kb_gen). */
void kb_def_add_hidden(kb_def *d, int n, uint64_t seed);
const char *kb_gen_name(kb_gen g);
/* Appends up to max_new workloads from a serving trace (`osprey serve --trace-shapes FILE`: one JSON
 * line a step), the most frequent step shapes first: token rows for row-wise kinds, (P, Q) per
 * sequence for attention and RoPE + KV write (B = 1), logits rows for scale and softcap; the
 * definition's fixed dimensions keep their values, the rest come from its first listed workload.
 * Returns the number added, -1 with a message on a bad trace. */
int kb_def_add_trace(kb_def *d, const char *path, int max_new, char *err, size_t errn);

/* ---- cases: one workload's inputs for one seed, and the reference's answer ---------------------- */

typedef struct kb_case {
    const kb_def *def;
    const kb_workload *wl;
    uint64_t seed;
    int64_t dim[KB_MAX_DIMS];
    int64_t T, R;            /* token rows and logits rows of the step */
    float *in[KB_MAX_IO];    /* inputs as the op reads them (representable in their dtype) */
    size_t in_n[KB_MAX_IO];
    void *wq;                /* matmul: the weight stored in def->wtype, rows of wq_row_bytes */
    size_t wq_row_bytes;
    int32_t *ids;            /* embed: token ids [T] */
    int32_t *lidx;           /* gather: logits_indices [R] */
    double *ref[KB_MAX_IO];  /* the reference's outputs */
    double *ref_scale[KB_MAX_IO]; /* per output element, the error scale (matmul: sum_k |x_k w_k|), or NULL */
    size_t out_n[KB_MAX_IO];
    double flops, bytes;     /* per run, for the timing's rates */
} kb_case;

/* Builds the case of workload wl for seed (inputs drawn, the reference computed). */
bool kb_case_make(const kb_def *d, const kb_workload *wl, uint64_t seed, kb_case *c, char *err, size_t errn);
/* The same inputs without the reference (c->ref and c->ref_scale NULL): for the timing, which checks no
 * output (a big workload's reference costs seconds). */
bool kb_case_make_inputs(const kb_def *d, const kb_workload *wl, uint64_t seed, kb_case *c, char *err, size_t errn);
/* Recomputes the reference after an input was changed (and the stored weight, for matmul). */
void kb_case_rereference(kb_case *c);
void kb_case_free(kb_case *c);
/* The reference's outputs rounded to fp32 into out[i] (out_n[i] each): what a correct solution writes.
 * For tests that plant bugs. */
void kb_case_reference_f32(const kb_case *c, float **out);

/* ---- solutions --------------------------------------------------------------------------------- */

typedef struct kb_solution kb_solution;
struct kb_solution {
    const char *name;  /* "cpu", "cpu-exact", "cuda", or a test's */
    const char *device; /* "cpu" or "cuda" */
    void *state;
    /* false when the solution cannot run this case (why says it): reported, not a failure */
    bool (*supports)(kb_solution *s, const kb_case *c, char *why, size_t n);
    /* untimed setup for the case (weights placed, op list built) */
    bool (*prepare)(kb_solution *s, const kb_case *c, char *err, size_t n);
    /* one run: inputs from c, outputs to out[i] [c->out_n[i]]; returns when they are on the host. Under
     * kb_time, c has no reference (kb_case_make_inputs): a solution must not read c->ref */
    bool (*run)(kb_solution *s, const kb_case *c, float **out, char *err, size_t n);
    /* one run on what the last run left on the device (its inputs in the backend's activation buffers
     * and KV pages): no activation crosses between host and device, only the step's metadata (positions,
     * slots, block table), as in an engine step; returns once the device is idle. The timing uses it
     * after warm-up runs through `run`; NULL: every timed run is a whole run, host copies included. */
    bool (*run_resident)(kb_solution *s, const kb_case *c, char *err, size_t n);
    void (*release)(kb_solution *s);
    void (*close)(kb_solution *s);
    /* the device's measured copy bandwidth, GB/s (read + write), or NULL */
    double (*copy_gbps)(kb_solution *s);
    /* the device's measured GEMM rate, GFLOP/s (the compute ceiling: CUDA, a bf16 cuBLASLt GEMM of
     * 8192^3; CPU, the backend's own matmul op at T 128, K = N = 1024), 0 when it could not be measured;
     * or NULL. Takes ~0.1 s: the harness asks only for definitions whose FLOPs matter */
    double (*gemm_gflops)(kb_solution *s);
    /* Evicts the device's last-level cache (untimed; before each timed run when flush_between_runs),
     * returning once done; bytes written per flush in *bytes. NULL: cannot. */
    bool (*flush)(kb_solution *s, size_t *bytes, char *err, size_t n);
    bool flush_between_runs;
    /* launches the device has started so far (osp_backend.launches), or NULL: not reported */
    uint64_t (*launches)(kb_solution *s);
    /* The device time of the last run's or run_resident's kernels, microseconds, into *us (waits for
     * them): the backend's run_device_us (backend.h), which leaves out the run's host work, host copies
     * and sync. NULL: the solution has no device clock, and the timing uses the wall clock around each
     * run. false with a message when it cannot tell. */
    bool (*device_us)(kb_solution *s, double *us, char *err, size_t n);
};

/* A solution name taken apart. The forms: "cpu", "cpu-exact", "cuda" (every op kind at the backend's
 * default), "DEVICE:KIND" (the default of that op kind only) and "DEVICE:KIND/vN" (a version of the
 * kernel registry, src/backend/kernel_registry.h: "cuda:attention/v1", "cpu:matmul/v0"), each optionally
 * followed by "+KEY=VALUE" settings ("cuda+OSPREY_CUDA_ATTENTION=v0"). */
typedef struct kb_solution_spec {
    char base[16];                     /* the backend solution: "cpu", "cpu-exact" or "cuda" */
    osp_device device;
    osp_op_kind only_kind;             /* DEVICE:KIND forms: the definitions it runs; else OSP_OP_COUNT */
    const osp_kernel_version *version; /* the registered version named, or NULL */
    const char *settings;              /* "+KEY=VALUE..." inside the name, or "" */
} kb_solution_spec;

/* Parses a solution name. false with a message (unknown backend, kind or version; a version of
 * another kind's; settings without '=') in err. */
bool kb_solution_parse(const char *name, kb_solution_spec *spec, char *err, size_t errn);
/* The registered version a solution runs for definition d at workload dims (head_dim from dimension
 * "D", f16 pages: the harness's) on a device of compute capability arch (x10; 0 on the CPU): the version
 * it names, the one its settings select, or the backend's default for that shape. Into out [n]; false
 * (out "") when the registry has none. */
bool kb_solution_version(const char *solution, const kb_def *d, const int64_t *dims, int32_t arch, char *out, size_t n);
/* The registry's target of definition d at dims on arch (kernel_registry.h). */
osp_kernel_target kb_target(const kb_def *d, const int64_t *dims, int32_t arch);

/* The backend solutions: name "cpu" (fast path), "cpu-exact" or "cuda", or a registered version
 * ("cuda:attention/v1": kb_solution_spec), each optionally followed by "+KEY=VALUE" settings; a
 * version's selection and the settings are put in this process's environment before the backend is
 * made (so call it in the child: "cuda+OSPREY_CUDA_ATTENTION=v0" is the CUDA-core attention kernel). A
 * solution naming a version reports a case its predicate rejects as unsupported (never times another
 * version under its name). A per-solution tolerance in a definition applies by the base name ("cuda").
 * false: unknown, malformed, a version this build cannot select, or no device. */
bool kb_solution_backend(const char *name, kb_solution *s, char *err, size_t errn);

/* ---- the gate and the timing -------------------------------------------------------------------- */

typedef enum kb_check { KB_OK = 0, KB_UNSUPPORTED, KB_FAIL_RUN, KB_FAIL_COVERAGE, KB_FAIL_ERROR,
                        KB_FAIL_DETERMINISM, KB_FAIL_DEPENDENCE } kb_check;
const char *kb_check_name(kb_check k);

typedef struct kb_gate_result {
    kb_check check;      /* the first check that failed, KB_OK if none */
    char detail[256];    /* where and by how much */
    double worst_ratio;  /* max |got - ref| / tol over every output element checked */
    char unchecked[64];  /* inputs the dependence check could not exercise (changing their last element
                          * moved no output beyond two steps of its dtype), comma-separated */
    int seeds;           /* fresh inputs run */
    double setup_us;     /* wall time of the first input's prepare and first run: what a user waits for
                          * once per shape (weights placed, plans made, modules loaded); 0: none ran */
} kb_gate_result;

/* The gate for one workload: n_seeds fresh inputs (seed0 + k), each checked for coverage and error;
 * the first also for determinism and dependence on every input. */
kb_gate_result kb_gate(kb_solution *s, const kb_def *d, const kb_workload *wl, uint64_t seed0, int n_seeds);

typedef struct kb_timing {
    double median_us, p10_us, p90_us; /* by the clock below */
    bool device_clock;                /* true: the device's time of each run's kernels (s->device_us);
                                       * false: the wall time around each run */
    double wall_median_us;            /* the wall clock's median around the same runs, for comparison */
    int reps;
    double gflops, gbps; /* per the adapter's counts at the median */
    double launches_per_run; /* the device's launches per timed run (osp_backend.launches), -1: unknown */
    size_t flush_bytes;      /* bytes written to evict the last-level cache before each run, 0: none */
    bool resident;           /* the timed runs were run_resident (device-resident inputs, no host copies) */
} kb_timing;

/* Times the workload (seed0's inputs) after a warm-up: runs until ~min_seconds or max_reps (at least 5),
 * each after an untimed cache flush when s->flush and s->flush_between_runs (so weights and KV pages
 * come from memory, as in a model where the other layers' data evicted them; the inputs still arrive
 * through the run's own host copies). The statistics are of the device clock where the solution has one
 * (s->device_us), else of the wall clock around each run; the wall median is kept either way. */
bool kb_time(kb_solution *s, const kb_def *d, const kb_workload *wl, uint64_t seed0, double min_seconds, int max_reps,
             kb_timing *t, char *err, size_t errn);

/* Runs fn(ctx, fd) in a child process (fork) with a timeout; what it writes to fd comes back in
 * *text (NUL-terminated, caller frees; NULL when nothing). A hung child is killed (SIGKILL). The
 * caller must not have initialized a CUDA context before (the child would inherit it). */
typedef enum kb_isolation { KB_ISOLATE_DONE = 0, KB_ISOLATE_TIMEOUT, KB_ISOLATE_CRASHED, KB_ISOLATE_ERROR } kb_isolation;
kb_isolation kb_isolate(int timeout_s, int (*fn)(void *ctx, int fd), void *ctx, char **text);

/* ---- the runtime selection table (kb_table.c) ---------------------------------------------------- */

/* Writes a kernel selection table (src/backend/kernel_table.h) to out from n reports of
 * `osprey bench-kernels --out`, all from one device (same backend, arch and driver major: otherwise an
 * error). Per bucket (op kind, head_dim, KV dtype) of the op kinds with more than one table-choosable
 * version, the candidates are the versions that passed the gate on every workload of the bucket they
 * ran and were timed on every one; the winner has the lowest geometric mean of median times over the
 * workloads every candidate timed (a bucket where fewer than two versions qualify gets no row). The written
 * table is read back with osp_kernel_table_parse before returning. A human summary (one line a bucket)
 * goes to summary [sn]. false with a message in err. */
bool kb_make_table(int n, const char *const *reports, const char *out, char *summary, size_t sn, char *err, size_t errn);

/* `osprey bench-kernels` (kb_main.c); argv[0] is "bench-kernels". */
int kb_main(int argc, char **argv);

#endif
