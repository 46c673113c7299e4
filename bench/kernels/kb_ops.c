/* The op kinds the proving ground knows (kbench.h): for each, the dimensions and the inputs and
 * outputs a definition of it must declare, how a case's inputs are made, and the reference: plain
 * loops in fp64 over exactly the values the op reads (inputs already representable in their dtype,
 * quantized weights dequantized), so a solution's only error is its own arithmetic and its output
 * rounding. The semantics are op.h's contracts for each kind; the FLOP and byte counts are the ones a
 * roofline uses (each input and output element read or written once). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/kernels/kb_internal.h"
#include "core/dtype.h"
#include "core/quantize.h"
#include "core/threadpool.h"

/* ---- the kinds' shapes ------------------------------------------------------------------------- */

static const kb_kind k_kinds[] = {
    {OSP_OP_EMBED, {"T", "V", "E"}, 3, {"table"}, 1, {"x"}, 1, {"V,E"}, {"T,E"}, NULL},
    {OSP_OP_ADD_RMSNORM, {"T", "E"}, 2, {"x", "d", "w"}, 3, {"x", "y"}, 2, {"T,E", "T,E", "E"}, {"T,E", "T,E"}, NULL},
    {OSP_OP_GATHER_RMSNORM, {"T", "R", "E"}, 3, {"x", "w"}, 2, {"y"}, 1, {"T,E", "E"}, {"R,E"}, NULL},
    {OSP_OP_MATMUL, {"T", "K", "N"}, 3, {"x", "w"}, 2, {"y"}, 1, {"T,K", "N,K"}, {"T,N"}, NULL},
    {OSP_OP_GLU, {"T", "F"}, 2, {"gu"}, 1, {"y"}, 1, {"T,2*F"}, {"T,F"}, NULL},
    {OSP_OP_ADD, {"T", "E"}, 2, {"x", "d"}, 2, {"x"}, 1, {"T,E", "T,E"}, {"T,E"}, NULL},
    {OSP_OP_COPY, {"T", "E"}, 2, {"x"}, 1, {"y"}, 1, {"T,E"}, {"T,E"}, NULL},
    {OSP_OP_ALL_REDUCE, {"T", "E"}, 2, {"x"}, 1, {"x"}, 1, {"T,E"}, {"T,E"}, NULL},
    {OSP_OP_SCALE, {"R", "V"}, 2, {"x"}, 1, {"y"}, 1, {"R,V"}, {"R,V"}, NULL},
    {OSP_OP_SOFTCAP, {"R", "V"}, 2, {"x"}, 1, {"y"}, 1, {"R,V"}, {"R,V"}, NULL},
    /* one rank (the proving ground runs one process): each logits row copied whole */
    {OSP_OP_ALL_GATHER, {"R", "V"}, 2, {"x"}, 1, {"y"}, 1, {"R,V"}, {"R,V"}, NULL},
    /* T tokens of one sequence from position P: q rotated out, k rotated and v into the pages */
    {OSP_OP_ROPE_KV_WRITE, {"T", "P", "HKV", "G", "D"}, 5, {"qkv"}, 1, {"q", "k", "v"}, 3,
     {"T,HKV*G*D+2*HKV*D"}, {"T,HKV*G*D", "T,HKV*D", "T,HKV*D"}, "P"},
    /* B sequences, each with P cached tokens and Q new ones; HKV kv heads of G query heads each */
    {OSP_OP_ATTENTION, {"B", "P", "Q", "HKV", "G", "D"}, 6, {"q", "k", "v"}, 3, {"o"}, 1,
     {"B*Q,HKV*G*D", "B*P+B*Q,HKV*D", "B*P+B*Q,HKV*D"}, {"B*Q,HKV*G*D"}, "P"},
};

const kb_kind *kb_kind_of(osp_op_kind k) {
    for (size_t i = 0; i < sizeof k_kinds / sizeof k_kinds[0]; i++)
        if (k_kinds[i].kind == k) return &k_kinds[i];
    return NULL;
}

/* ---- values ---------------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double unit(uint64_t *s) { return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0); }
static double normal(uint64_t *s) { return (unit(s) + unit(s) + unit(s) + unit(s) - 2.0) * sqrt(3.0); }

/* x made representable in dtype t (the values an op reading t sees) */
float kb_representable(uint32_t t, float x) {
    if (t == OSP_DTYPE_BF16) return osp_bf16_to_fp32(osp_fp32_to_bf16(x));
    if (t == OSP_DTYPE_F16) return osp_fp16_to_fp32(osp_fp32_to_fp16(x));
    return x;
}

void kb_fill(float *v, size_t n, kb_gen g, double scale, uint32_t dtype, uint64_t *s) {
    const double eq = scale * (0.5 + unit(s));
    for (size_t i = 0; i < n; i++) {
        double x;
        switch (g) {
        case KB_GEN_HEAVY: x = normal(s) * scale * (splitmix(s) % 64 == 0 ? 64.0 : 1.0); break;
        case KB_GEN_EQUAL: x = eq; break;
        case KB_GEN_LARGE: x = normal(s) * scale * 1024.0; break;
        default: x = normal(s) * scale; break;
        }
        v[i] = kb_representable(dtype, (float)x);
    }
}

static int64_t dimv(const kb_case *c, const char *name) {
    for (int i = 0; i < c->def->n_dims; i++)
        if (!strcmp(c->def->dims[i].name, name)) return c->dim[i];
    return 0;
}

static float *alloc_in(kb_case *c, int i, size_t n) {
    c->in[i] = malloc(n * sizeof(float) + 4);
    c->in_n[i] = n;
    return c->in[i];
}

/* ---- references -------------------------------------------------------------------------------- */

int64_t rope_n_rot(const kb_case *c) { return c->def->n_rot > 0 && c->def->n_rot <= c->dim[4] ? c->def->n_rot : c->dim[4]; }
double attn_scale(const kb_case *c) { return c->def->scale > 0.0 ? c->def->scale : 1.0 / sqrt((double)c->dim[5]); }

static void rmsnorm_row(const double *x, const float *w, int64_t E, double eps, double *y) {
    double ss = 0.0;
    for (int64_t j = 0; j < E; j++) ss += x[j] * x[j];
    const double r = 1.0 / sqrt(ss / (double)E + eps);
    for (int64_t j = 0; j < E; j++) y[j] = x[j] * r * (double)w[j];
}

static double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

/* The two references whose cost grows faster than their data (a dot product per output element):
 * items [i0, i1) of a case's outputs, each computed alone in a fixed order, so any split of the items
 * between threads gives the same bits. Matmul: item t N + n is y[t, n] (and its error scale). */
static void matmul_ref(kb_case *c, long long i0, long long i1) {
    const int64_t K = dimv(c, "K"), N = dimv(c, "N");
    const float *w = c->in[1]; /* the stored weight's values (dequantized) [N, K] */
    for (long long i = i0; i < i1; i++) {
        const int64_t t = i / N, n = i % N;
        /* four partial sums in a fixed order (as attention's dot products) */
        double acc[4] = {0.0, 0.0, 0.0, 0.0}, mag[4] = {0.0, 0.0, 0.0, 0.0};
        const float *x = c->in[0] + t * K, *wr = w + n * K;
        int64_t k = 0;
        for (; k + 4 <= K; k += 4)
            for (int u = 0; u < 4; u++) {
                const double p = (double)x[k + u] * (double)wr[k + u];
                acc[u] += p, mag[u] += fabs(p);
            }
        for (; k < K; k++) {
            const double p = (double)x[k] * (double)wr[k];
            acc[0] += p, mag[0] += fabs(p);
        }
        c->ref[0][i] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        if (c->ref_scale[0]) c->ref_scale[0][i] = (mag[0] + mag[1]) + (mag[2] + mag[3]);
    }
}

/* Attention: item (b Q + j) H + h is query head h of sequence b's token j, every `stride`-th item from
 * i0 (causal rows differ in length: interleaved items spread the long ones). Sequence b's token j sits
 * at position P + j and attends to positions lo .. P + j of b (lo = 0, or P + j - window + 1 with a
 * window); softmax(q k^T scale) v in fp64. w: scratch of P + Q doubles. */
static void attention_ref(kb_case *c, long long i0, long long n_items, long long stride, double *w) {
    const kb_def *d = c->def;
    const int64_t P = c->dim[1], Q = c->dim[2], HKV = c->dim[3], G = c->dim[4], D = c->dim[5];
    const int64_t H = HKV * G, L = P + Q;
    const double sc = attn_scale(c);
    for (long long it = i0; it < n_items; it += stride) {
        const int64_t h = it % H, j = (it / H) % Q, b = it / (H * Q);
        const int64_t p = P + j, lo = d->window > 0 && p + 1 > d->window ? p + 1 - d->window : 0;
        const float *q = c->in[0] + ((b * Q + j) * H + h) * D;
        const int64_t kh = h / G;
        double mx = -INFINITY, sum = 0.0;
        for (int64_t i = lo; i <= p; i++) {
            const float *k = c->in[1] + ((b * L + i) * HKV + kh) * D;
            /* four partial sums (a fixed order, not one dependent chain of D adds: 4x faster; fp64
             * either way, far below any tolerance) */
            double dot[4] = {0.0, 0.0, 0.0, 0.0};
            int64_t e = 0;
            for (; e + 4 <= D; e += 4)
                for (int u = 0; u < 4; u++) dot[u] += (double)q[e + u] * (double)k[e + u];
            for (; e < D; e++) dot[0] += (double)q[e] * (double)k[e];
            w[i] = ((dot[0] + dot[1]) + (dot[2] + dot[3])) * sc;
            mx = fmax(mx, w[i]);
        }
        for (int64_t i = lo; i <= p; i++) sum += w[i] = exp(w[i] - mx);
        double *o = c->ref[0] + ((b * Q + j) * H + h) * D;
        for (int64_t e = 0; e < D; e++) o[e] = 0.0;
        for (int64_t i = lo; i <= p; i++) {
            const float *v = c->in[2] + ((b * L + i) * HKV + kh) * D;
            const double a = w[i] / sum; /* once a key, not once an element (o may alias w for the compiler) */
            for (int64_t e = 0; e < D; e++) o[e] += a * (double)v[e];
        }
    }
}

typedef struct ref_task {
    kb_case *c;
    long long n_items;
    int failed;
} ref_task;

static void ref_task_fn(void *ctx, int ith, int nth) {
    ref_task *r = ctx;
    if (r->c->def->kind == OSP_OP_MATMUL) {
        long long a, b;
        osp_split(r->n_items, ith, nth, &a, &b);
        matmul_ref(r->c, a, b);
        return;
    }
    double *w = malloc(sizeof(double) * (size_t)(r->c->dim[1] + r->c->dim[2]));
    if (!w) {
        r->failed = 1; /* benign race: any 1 */
        return;
    }
    attention_ref(r->c, ith, r->n_items, nth, w);
    free(w);
}

/* n_items of a matmul or attention reference, on every CPU when the work (multiply-adds) is large
 * enough to repay starting threads (the listed big workloads: a prefill's matmul or attention takes
 * minutes on one core), else on this thread. A pool made and freed per call: the harness forks its
 * children, and a pool made before a fork would have no threads in the child. */
static void ref_parallel(kb_case *c, long long n_items, double work) {
    ref_task r = {c, n_items, 0};
    const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    osp_threadpool *pool = NULL;
    if (work >= (double)(1 << 24) && ncpu > 1 && osp_threadpool_create(ncpu < 64 ? (int)ncpu : 64, &pool) == OSP_OK) {
        osp_threadpool_run(pool, ref_task_fn, &r);
        osp_threadpool_free(pool);
    } else {
        ref_task_fn(&r, 0, 1);
    }
    if (r.failed) /* out of memory for a row of scores: no answer rather than a wrong one */
        for (size_t i = 0; i < c->out_n[0]; i++) c->ref[0][i] = NAN;
}

void kb_reference(kb_case *c) {
    const kb_def *d = c->def;
    switch (d->kind) {
    case OSP_OP_EMBED: {
        const int64_t E = dimv(c, "E");
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t j = 0; j < E; j++) c->ref[0][t * E + j] = d->scale * (double)c->in[0][c->ids[t] * E + j];
        break;
    }
    case OSP_OP_ADD_RMSNORM: {
        const int64_t E = dimv(c, "E");
        double *row = malloc(sizeof(double) * (size_t)E);
        for (int64_t t = 0; t < c->T; t++) {
            for (int64_t j = 0; j < E; j++) {
                /* the residual stream is fp32: the sum is rounded to fp32 before the norm reads it */
                row[j] = (double)(float)((double)c->in[0][t * E + j] + (double)c->in[1][t * E + j]);
                c->ref[0][t * E + j] = row[j];
            }
            rmsnorm_row(row, c->in[2], E, d->eps, c->ref[1] + t * E);
        }
        free(row);
        break;
    }
    case OSP_OP_GATHER_RMSNORM: {
        const int64_t E = dimv(c, "E");
        double *row = malloc(sizeof(double) * (size_t)E);
        for (int64_t r = 0; r < c->R; r++) {
            for (int64_t j = 0; j < E; j++) row[j] = c->in[0][c->lidx[r] * E + j];
            rmsnorm_row(row, c->in[1], E, d->eps, c->ref[0] + r * E);
        }
        free(row);
        break;
    }
    case OSP_OP_MATMUL: {
        if (!c->ref_scale[0]) c->ref_scale[0] = malloc(sizeof(double) * c->out_n[0]);
        ref_parallel(c, c->T * dimv(c, "N"), (double)c->T * (double)dimv(c, "N") * (double)dimv(c, "K"));
        break;
    }
    case OSP_OP_GLU: {
        const int64_t F = dimv(c, "F");
        for (int64_t t = 0; t < c->T; t++)
            for (int64_t j = 0; j < F; j++) {
                const double g = c->in[0][t * 2 * F + j], u = c->in[0][t * 2 * F + F + j];
                const double a = d->act == OSP_GLU_GELU_TANH ? gelu_tanh(g) : g / (1.0 + exp(-g));
                c->ref[0][t * F + j] = a * u;
            }
        break;
    }
    case OSP_OP_ADD:
        for (size_t i = 0; i < c->out_n[0]; i++) c->ref[0][i] = (double)c->in[0][i] + (double)c->in[1][i];
        break;
    case OSP_OP_COPY:
    case OSP_OP_ALL_REDUCE: /* one rank */
    case OSP_OP_ALL_GATHER: /* one rank */
        for (size_t i = 0; i < c->out_n[0]; i++) c->ref[0][i] = c->in[0][i];
        break;
    case OSP_OP_SCALE:
        for (size_t i = 0; i < c->out_n[0]; i++) c->ref[0][i] = d->scale * (double)c->in[0][i];
        break;
    case OSP_OP_SOFTCAP:
        for (size_t i = 0; i < c->out_n[0]; i++) c->ref[0][i] = d->scale * tanh((double)c->in[0][i] / d->scale);
        break;
    case OSP_OP_ROPE_KV_WRITE: {
        /* RoFormer (Su et al. 2021) eq. 34 per head: pair (a, b) of dims rotated by p inv_freq[i],
         * inv_freq the fp32 table the op reads (c->in[1]); dims past n_rot pass through */
        const int64_t T = c->dim[0], P = c->dim[1], HKV = c->dim[2], G = c->dim[3], D = c->dim[4];
        const int64_t H = HKV * G, QD = H * D, KD = HKV * D, W = QD + 2 * KD, nr = rope_n_rot(c);
        for (int64_t t = 0; t < T; t++) {
            const float *row = c->in[0] + t * W;
            const double p = (double)(P + t);
            for (int64_t part = 0; part < 2; part++) { /* q heads, then k heads */
                const int64_t nh = part ? HKV : H;
                double *dst = part ? c->ref[1] + t * KD : c->ref[0] + t * QD;
                const float *src = row + (part ? QD : 0);
                for (int64_t h = 0; h < nh; h++) {
                    for (int64_t e = 0; e < D; e++) dst[h * D + e] = src[h * D + e];
                    for (int64_t i = 0; i < nr / 2; i++) {
                        const int64_t a = d->neox ? i : 2 * i, b = d->neox ? i + nr / 2 : 2 * i + 1;
                        const double ang = p * (double)c->in[1][i], x = src[h * D + a], y = src[h * D + b];
                        dst[h * D + a] = x * cos(ang) - y * sin(ang);
                        dst[h * D + b] = x * sin(ang) + y * cos(ang);
                    }
                }
            }
            for (int64_t e = 0; e < KD; e++) c->ref[2][t * KD + e] = row[QD + KD + e];
        }
        break;
    }
    case OSP_OP_ATTENTION: {
        const int64_t B = c->dim[0], P = c->dim[1], Q = c->dim[2], H = c->dim[3] * c->dim[4], D = c->dim[5];
        ref_parallel(c, B * Q * H, (double)B * (double)Q * (double)H * (double)(P + Q) * (double)D);
        break;
    }
    default: break;
    }
}

/* ---- cases ------------------------------------------------------------------------------------- */

static double dtype_bytes(uint32_t t, int64_t n) { return (double)osp_dtype_row_size(t, n); }

/* The element count of an extent ("B*P+B*Q": sums of products of dimensions and integers) */
static double extent(const kb_def *d, const int64_t *dim, const char *e) {
    double sum = 0.0, prod = 1.0;
    char tok[24];
    size_t t = 0;
    for (const char *p = e;; p++) {
        if (*p && *p != '*' && *p != '+' && *p != ',') {
            if (t + 1 < sizeof tok) tok[t++] = *p;
            continue;
        }
        tok[t] = 0, t = 0;
        double v = atof(tok);
        for (int k = 0; k < d->n_dims; k++)
            if (!strcmp(d->dims[k].name, tok)) v = (double)dim[k];
        prod *= v;
        if (*p != '*') sum += prod, prod = 1.0;
        if (!*p || *p == ',') break;
    }
    return sum;
}

double kb_case_elements(const kb_def *d, const int64_t *dim) {
    const kb_kind *kk = kb_kind_of(d->kind);
    double total = 0.0;
    for (int io = 0; io < 2; io++)
        for (int i = 0; i < (io ? kk->n_out : kk->n_in); i++) {
            const char *shape = io ? kk->out_shape[i] : kk->in_shape[i];
            double n = 1.0;
            for (const char *p = shape; p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) n *= extent(d, dim, p);
            total += n;
        }
    return total;
}

static bool case_make(const kb_def *d, const kb_workload *wl, uint64_t seed, kb_case *c, bool with_ref, char *err,
                      size_t errn) {
    memset(c, 0, sizeof *c);
    c->def = d, c->wl = wl, c->seed = seed;
    for (int i = 0; i < d->n_dims; i++) c->dim[i] = wl->dim[i];
    /* the inputs, outputs (fp32) and the reference (fp64) of one case: at most KB_MAX_CASE_ELEMENTS, 3 GiB */
    const double elems = kb_case_elements(d, c->dim);
    if (!(elems <= KB_MAX_CASE_ELEMENTS)) {
        snprintf(err, errn, "%s: workload '%s' needs %.3g elements; the proving ground takes at most 2^28", d->name,
                 wl->id, elems);
        return false;
    }
    uint64_t s = seed ^ 0x6b62656e6368ull;
    const kb_gen g = wl->gen;
    switch (d->kind) {
    case OSP_OP_EMBED: {
        const int64_t T = dimv(c, "T"), V = dimv(c, "V"), E = dimv(c, "E");
        c->T = T;
        kb_fill(alloc_in(c, 0, (size_t)(V * E)), (size_t)(V * E), g, 1.0, d->in[0].dtype, &s);
        c->ids = malloc(sizeof(int32_t) * (size_t)T);
        for (int64_t t = 0; t < T; t++) c->ids[t] = (int32_t)(splitmix(&s) % (uint64_t)V);
        c->ids[T - 1] = (int32_t)(V - 1); /* the table's last row is always read: a tail */
        c->out_n[0] = (size_t)(T * E);
        c->bytes = dtype_bytes(d->in[0].dtype, T * E) + 4.0 * (double)(T * E) + 4.0 * (double)T;
        break;
    }
    case OSP_OP_ADD_RMSNORM: {
        const int64_t T = dimv(c, "T"), E = dimv(c, "E");
        c->T = T;
        kb_fill(alloc_in(c, 0, (size_t)(T * E)), (size_t)(T * E), g, 3.0, d->in[0].dtype, &s);
        kb_fill(alloc_in(c, 1, (size_t)(T * E)), (size_t)(T * E), g, 1.0, d->in[1].dtype, &s);
        float *w = alloc_in(c, 2, (size_t)E);
        for (int64_t j = 0; j < E; j++) w[j] = kb_representable(d->in[2].dtype, (float)(1.0 + 0.1 * normal(&s)));
        c->out_n[0] = c->out_n[1] = (size_t)(T * E);
        c->flops = 4.0 * (double)(T * E);
        c->bytes = (double)(T * E) * (4.0 + 4.0 + 4.0) + dtype_bytes(d->in[1].dtype, T * E) +
                   dtype_bytes(d->out[1].dtype, T * E) + 4.0 * (double)E;
        break;
    }
    case OSP_OP_GATHER_RMSNORM: {
        const int64_t T = dimv(c, "T"), R = dimv(c, "R"), E = dimv(c, "E");
        c->T = T, c->R = R;
        kb_fill(alloc_in(c, 0, (size_t)(T * E)), (size_t)(T * E), g, 2.0, d->in[0].dtype, &s);
        float *w = alloc_in(c, 1, (size_t)E);
        for (int64_t j = 0; j < E; j++) w[j] = kb_representable(d->in[1].dtype, (float)(1.0 + 0.1 * normal(&s)));
        c->lidx = malloc(sizeof(int32_t) * (size_t)R);
        for (int64_t r = 0; r < R; r++) c->lidx[r] = (int32_t)(splitmix(&s) % (uint64_t)T);
        c->lidx[R - 1] = (int32_t)(T - 1); /* the last token row is always gathered: a tail */
        c->out_n[0] = (size_t)(R * E);
        c->flops = 3.0 * (double)(R * E);
        c->bytes = 4.0 * (double)(R * E) + dtype_bytes(d->out[0].dtype, R * E) + 4.0 * (double)E;
        break;
    }
    case OSP_OP_MATMUL: {
        const int64_t T = dimv(c, "T"), K = dimv(c, "K"), N = dimv(c, "N");
        c->T = T;
        if (K % osp_dtype_block_size(d->wtype)) {
            snprintf(err, errn, "%s: K = %lld is not a multiple of %s's block of %lld", d->name, (long long)K,
                     osp_dtype_name(d->wtype), (long long)osp_dtype_block_size(d->wtype));
            return false;
        }
        kb_fill(alloc_in(c, 0, (size_t)(T * K)), (size_t)(T * K), g, 1.0, d->in[0].dtype, &s);
        float *w = alloc_in(c, 1, (size_t)(N * K));
        kb_fill(w, (size_t)(N * K), g == KB_GEN_LARGE ? KB_GEN_NORMAL : g, 0.2, OSP_DTYPE_BF16, &s);
        c->wq_row_bytes = osp_dtype_row_size(d->wtype, K);
        c->wq = malloc(c->wq_row_bytes * (size_t)N);
        for (int64_t n = 0; n < N; n++) { /* stored, then read back: the reference sees what the op sees */
            char *row = (char *)c->wq + (size_t)n * c->wq_row_bytes;
            if (d->wtype == OSP_DTYPE_F32) memcpy(row, w + n * K, (size_t)K * 4);
            else if (osp_quantize_row(d->wtype, w + n * K, row, K) != OSP_OK ||
                     osp_dequant_row(d->wtype, row, w + n * K, K) != OSP_OK) {
                snprintf(err, errn, "%s: cannot store weights as %s", d->name, osp_dtype_name(d->wtype));
                return false;
            }
        }
        c->out_n[0] = (size_t)(T * N);
        c->flops = 2.0 * (double)T * (double)K * (double)N;
        c->bytes = (double)c->wq_row_bytes * (double)N + dtype_bytes(d->in[0].dtype, T * K) +
                   dtype_bytes(d->out[0].dtype, T * N);
        break;
    }
    case OSP_OP_GLU: {
        const int64_t T = dimv(c, "T"), F = dimv(c, "F");
        c->T = T;
        kb_fill(alloc_in(c, 0, (size_t)(T * 2 * F)), (size_t)(T * 2 * F), g, 2.0, d->in[0].dtype, &s);
        c->out_n[0] = (size_t)(T * F);
        c->flops = 8.0 * (double)(T * F);
        c->bytes = dtype_bytes(d->in[0].dtype, T * 2 * F) + dtype_bytes(d->out[0].dtype, T * F);
        break;
    }
    case OSP_OP_ADD:
    case OSP_OP_COPY:
    case OSP_OP_ALL_REDUCE: {
        const int64_t T = dimv(c, "T"), E = dimv(c, "E");
        c->T = T;
        for (int i = 0; i < d->n_in; i++)
            kb_fill(alloc_in(c, i, (size_t)(T * E)), (size_t)(T * E), g, i ? 1.0 : 3.0, d->in[i].dtype, &s);
        c->out_n[0] = (size_t)(T * E);
        c->flops = d->kind == OSP_OP_ADD ? (double)(T * E) : 0.0;
        c->bytes = 0.0;
        for (int i = 0; i < d->n_in; i++) c->bytes += dtype_bytes(d->in[i].dtype, T * E);
        c->bytes += dtype_bytes(d->out[0].dtype, T * E);
        break;
    }
    case OSP_OP_SCALE:
    case OSP_OP_SOFTCAP:
    case OSP_OP_ALL_GATHER: {
        const int64_t R = dimv(c, "R"), V = dimv(c, "V");
        c->T = R, c->R = R;
        kb_fill(alloc_in(c, 0, (size_t)(R * V)), (size_t)(R * V), g, 20.0, d->in[0].dtype, &s);
        c->out_n[0] = (size_t)(R * V);
        c->flops = (d->kind == OSP_OP_SOFTCAP ? 3.0 : d->kind == OSP_OP_SCALE ? 1.0 : 0.0) * (double)(R * V);
        c->bytes = dtype_bytes(d->in[0].dtype, R * V) + dtype_bytes(d->out[0].dtype, R * V);
        break;
    }
    case OSP_OP_ROPE_KV_WRITE: {
        const int64_t T = c->dim[0], HKV = c->dim[2], G = c->dim[3], D = c->dim[4];
        const int64_t QD = HKV * G * D, KD = HKV * D, W = QD + 2 * KD;
        if (D % 2) {
            snprintf(err, errn, "%s: D must be even", d->name);
            return false;
        }
        c->T = T;
        kb_fill(alloc_in(c, 0, (size_t)(T * W)), (size_t)(T * W), g, 0.5, d->in[0].dtype, &s);
        /* the frequency table the op reads: not an input a definition varies, but the reference must
         * use the same fp32 values (in[1], outside the declared inputs: never perturbed) */
        const int64_t nr = rope_n_rot(c);
        float *f = malloc(sizeof(float) * (size_t)(nr / 2 + 1));
        for (int64_t i = 0; i < nr / 2; i++) f[i] = (float)pow(d->theta, -2.0 * (double)i / (double)nr);
        c->in[1] = f, c->in_n[1] = (size_t)(nr / 2);
        c->out_n[0] = (size_t)(T * QD), c->out_n[1] = c->out_n[2] = (size_t)(T * KD);
        c->flops = 6.0 * (double)T * (double)(QD + KD) * (double)nr / (double)D;
        c->bytes = 4.0 * (double)(T * W) + dtype_bytes(d->out[0].dtype, T * QD) + 2.0 * dtype_bytes(OSP_DTYPE_F16, T * KD);
        break;
    }
    case OSP_OP_ATTENTION: {
        const int64_t B = c->dim[0], P = c->dim[1], Q = c->dim[2], HKV = c->dim[3], G = c->dim[4], D = c->dim[5];
        const int64_t H = HKV * G, L = P + Q;
        c->T = B * Q;
        /* |q|, |k| elements ~ 0.5: scores ~ 0.25 sqrt(D) apart, a softmax neither flat nor one-hot. The
         * large generator scales v only: scores of 1e5 (q and k at 2^10) leave fp32's softmax a
         * rounding of 1e5 ulp-sized steps, a test of exp's input precision, not of the kernel. */
        const kb_gen gqk = g == KB_GEN_LARGE ? KB_GEN_NORMAL : g;
        kb_fill(alloc_in(c, 0, (size_t)(B * Q * H * D)), (size_t)(B * Q * H * D), gqk, 0.5, d->in[0].dtype, &s);
        kb_fill(alloc_in(c, 1, (size_t)(B * L * HKV * D)), (size_t)(B * L * HKV * D), gqk, 0.5, d->in[1].dtype, &s);
        kb_fill(alloc_in(c, 2, (size_t)(B * L * HKV * D)), (size_t)(B * L * HKV * D), g, 1.0, d->in[2].dtype, &s);
        c->out_n[0] = (size_t)(B * Q * H * D);
        double keys = 0.0; /* key rows each query reads */
        for (int64_t j = 0; j < Q; j++) {
            const int64_t p = P + j;
            keys += (double)(d->window > 0 && p + 1 > d->window ? d->window : p + 1);
        }
        c->flops = 4.0 * (double)B * keys * (double)(H * D);
        c->bytes = 2.0 * dtype_bytes(d->in[1].dtype, B * L * HKV * D) + dtype_bytes(d->in[0].dtype, B * Q * H * D) +
                   dtype_bytes(d->out[0].dtype, B * Q * H * D);
        break;
    }
    default:
        snprintf(err, errn, "%s: op kind %s has no adapter in the proving ground yet", d->name, osp_op_name(d->kind));
        return false;
    }
    if (!with_ref) return true;
    for (int i = 0; i < d->n_out; i++) c->ref[i] = malloc(sizeof(double) * c->out_n[i] + 8);
    kb_reference(c);
    return true;
}

bool kb_case_make(const kb_def *d, const kb_workload *wl, uint64_t seed, kb_case *c, char *err, size_t errn) {
    return case_make(d, wl, seed, c, true, err, errn);
}

bool kb_case_make_inputs(const kb_def *d, const kb_workload *wl, uint64_t seed, kb_case *c, char *err, size_t errn) {
    return case_make(d, wl, seed, c, false, err, errn);
}

void kb_case_rereference(kb_case *c) {
    if (c->def->kind == OSP_OP_MATMUL && c->def->wtype != OSP_DTYPE_F32) {
        /* the weight input changed: store it again and read back what the op will see */
        const int64_t K = dimv(c, "K"), N = dimv(c, "N");
        for (int64_t n = 0; n < N; n++) {
            char *row = (char *)c->wq + (size_t)n * c->wq_row_bytes;
            osp_quantize_row(c->def->wtype, c->in[1] + n * K, row, K);
            osp_dequant_row(c->def->wtype, row, c->in[1] + n * K, K);
        }
    } else if (c->def->kind == OSP_OP_MATMUL) {
        memcpy(c->wq, c->in[1], c->in_n[1] * 4);
    }
    kb_reference(c);
}

void kb_case_free(kb_case *c) {
    for (int i = 0; i < KB_MAX_IO; i++) free(c->in[i]), free(c->ref[i]), free(c->ref_scale[i]);
    free(c->wq), free(c->ids), free(c->lidx);
    memset(c, 0, sizeof *c);
}

void kb_case_reference_f32(const kb_case *c, float **out) {
    for (int i = 0; i < c->def->n_out; i++)
        for (size_t k = 0; k < c->out_n[i]; k++) out[i][k] = kb_representable(c->def->out[i].dtype, (float)c->ref[i][k]);
}
