/* GEMMs through cuBLASLt: y = x w^T with bf16 operands and fp32 accumulation (CUBLAS_COMPUTE_32F),
 * the layout of every linear layer of the forward pass (activations [T, K] row-major, weights stored
 * as N rows of K, as in GGUF).
 *
 * cuBLASLt is column-major. A row-major [T, N] output is a column-major [N, T] matrix, so the product
 * is computed as  D[N, T] = W[N, K] · X^T[K, T]:  A = the weight, viewed column-major as [K, N] and
 * transposed (op T, lda = K); B = the activations, column-major [K, T] (op N, ldb = K); D column-major
 * [N, T] (ldd = N), which is y row-major.
 *
 * Plans (descriptors, layouts and the heuristic's algorithm) are made once per (T, N, K, out type) and
 * cached: the heuristic query is host work and cannot run inside graph capture, so callers run every
 * shape once before capturing. One workspace, allocated at creation, is shared by all calls (calls
 * are serialized on the caller's stream). */
#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

/* cuBLASLt is opened with dlopen when the first GEMM context is created, not linked: mapping it costs a
 * process ~140 MB of resident memory (57 MB of code, 84 MB of relocated data), which a CUDA-enabled
 * build running on the CPU backend never needs (bench/RESULTS.md, issue 21's peak RSS). The functions
 * used are looked up once; their types come from cublasLt.h (decltype names no symbol). */
namespace {

struct LtApi {
#define LT_FN(name) decltype(&::cublasLt##name) name;
    LT_FN(Create)
    LT_FN(Destroy)
    LT_FN(GetStatusString)
    LT_FN(Matmul)
    LT_FN(MatmulAlgoGetHeuristic)
    LT_FN(MatmulAlgoConfigGetAttribute)
    LT_FN(MatmulAlgoConfigSetAttribute)
    LT_FN(MatmulAlgoCheck)
    LT_FN(MatmulDescCreate)
    LT_FN(MatmulDescDestroy)
    LT_FN(MatmulDescSetAttribute)
    LT_FN(MatmulPreferenceCreate)
    LT_FN(MatmulPreferenceDestroy)
    LT_FN(MatmulPreferenceSetAttribute)
    LT_FN(MatrixLayoutCreate)
    LT_FN(MatrixLayoutDestroy)
#undef LT_FN
};

LtApi lt;
pthread_once_t lt_once = PTHREAD_ONCE_INIT;
char lt_error[320]; /* empty once loaded */

#define LT_STR2(x) #x
#define LT_STR(x) LT_STR2(x)

void lt_load_once(void) {
    /* the soname of the cuBLAS this was compiled against, then the unversioned name */
    static const char *const names[] = {"libcublasLt.so." LT_STR(CUBLAS_VER_MAJOR), "libcublasLt.so"};
    void *h = NULL;
    const char *why = "";
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!h) why = dlerror();
    }
    if (!h) {
        snprintf(lt_error, sizeof lt_error, "cuBLASLt: cannot load %s: %s", names[0], why ? why : "?");
        return;
    }
#define LT_SYM(name)                                                                               \
    do {                                                                                           \
        void *f_ = dlsym(h, "cublasLt" #name);                                                     \
        if (!f_) {                                                                                 \
            snprintf(lt_error, sizeof lt_error, "cuBLASLt: %s has no cublasLt" #name, names[0]);  \
            return;                                                                                \
        }                                                                                          \
        memcpy(&lt.name, &f_, sizeof f_);                                                          \
    } while (0)
    LT_SYM(Create);
    LT_SYM(Destroy);
    LT_SYM(GetStatusString);
    LT_SYM(Matmul);
    LT_SYM(MatmulAlgoGetHeuristic);
    LT_SYM(MatmulAlgoConfigGetAttribute);
    LT_SYM(MatmulAlgoConfigSetAttribute);
    LT_SYM(MatmulAlgoCheck);
    LT_SYM(MatmulDescCreate);
    LT_SYM(MatmulDescDestroy);
    LT_SYM(MatmulDescSetAttribute);
    LT_SYM(MatmulPreferenceCreate);
    LT_SYM(MatmulPreferenceDestroy);
    LT_SYM(MatmulPreferenceSetAttribute);
    LT_SYM(MatrixLayoutCreate);
    LT_SYM(MatrixLayoutDestroy);
#undef LT_SYM
    /* the handle stays open for the life of the process */
}

/* OSP_OK once cuBLASLt's functions are in `lt`; else OSP_ERR_UNSUPPORTED with why (every call). */
osp_status lt_load(void) {
    pthread_once(&lt_once, lt_load_once);
    if (lt_error[0]) return osp_set_error(OSP_ERR_UNSUPPORTED, "%s", lt_error);
    return OSP_OK;
}

} /* namespace */

#define GEMM_MAX_PLANS 256

typedef struct gemm_plan {
    int64_t T, N, K, ldy;
    bool y_f32;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
} gemm_plan;

/* The split-K count every plan of an (N, K, output) shape uses, whatever T. With the skinny kernel on
 * (OSPREY_CUDA_GEMM_SKINNY=M: gemm_skinny.cu takes T <= M and gives cuBLASLt's unsplit bits, measured by
 * test_gpu_gemm on an H100; off by default, slower than the split at decode: bench/gpu/DECODE.md) it is
 * 1: no plan splits, so every T gives a row the
 * same bits and decode's T gets its parallelism from the skinny kernel's N instead of from a split.
 * With it off (the default): what the heuristic picks for T = 1 (decode's shape, where splitting K pays). One count for every T is what keeps a row's bits the
 * same whatever T it is computed in: tiles without split-K accumulate in the same k order (measured,
 * tests/gpu/test_gpu_gemm.c), and a fixed S-way split adds the same fp32 partials in the same order;
 * the heuristic alone splits o and down of an 8B model at T <= 16 / 64 only, which gave a decode row
 * other bits than the same row in a larger step (bench/gpu/DECODE.md, seventh session). */
typedef struct split_rule {
    int64_t N, K, ldy;
    bool y_f32;
    int32_t splitk;
} split_rule;

#define GEMM_MAX_RULES 64

struct osp_cuda_gemm {
    cublasLtHandle_t lt;
    void *workspace;
    size_t workspace_bytes;
    uint64_t generation; /* bumped when the workspace moves (graphs holding the old one are stale) */
    int n_plans;
    gemm_plan plans[GEMM_MAX_PLANS];
    int n_rules;
    split_rule rules[GEMM_MAX_RULES];
    int skinny_max; /* T <= this go to osp_cuda_skinny_bf16 when it supports the call; 0: never */
};

#define LT_TRY(call, what)                                                                         \
    do {                                                                                           \
        cublasStatus_t st_ = (call);                                                               \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                          \
            return osp_set_error(OSP_ERR_INTERNAL, "cublasLt: %s failed: %s (%d)", (what),         \
                                 lt.GetStatusString(st_), (int)st_);                          \
    } while (0)

static void plan_free(gemm_plan *p) {
    if (p->op) lt.MatmulDescDestroy(p->op);
    if (p->a) lt.MatrixLayoutDestroy(p->a);
    if (p->b) lt.MatrixLayoutDestroy(p->b);
    if (p->d) lt.MatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

extern "C" osp_status osp_cuda_gemm_create(size_t workspace_bytes, osp_cuda_gemm **out) {
    *out = NULL;
    OSP_TRY(lt_load());
    osp_cuda_gemm *g = (osp_cuda_gemm *)calloc(1, sizeof *g);
    if (!g) return osp_set_error(OSP_ERR_NOMEM, "cublasLt: out of memory");
    cublasStatus_t st = lt.Create(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(g);
        return osp_set_error(OSP_ERR_INTERNAL, "cublasLt: cublasLtCreate failed: %s", lt.GetStatusString(st));
    }
    /* OSPREY_CUDA_GEMM_SKINNY: "M" the skinny kernel up to T = M (at most OSP_CUDA_SKINNY_MAX_T) and no
     * split-K anywhere; unset or "0": every T through cuBLASLt with the T = 1 split rule. Opt-in until
     * test_gpu_gemm has passed on a device with it (bench/gpu/DECODE.md, eighth session). */
    const char *sk = getenv("OSPREY_CUDA_GEMM_SKINNY");
    g->skinny_max = sk && sk[0] ? atoi(sk) : 0;
    if (g->skinny_max < 0) g->skinny_max = 0;
    if (g->skinny_max > OSP_CUDA_SKINNY_MAX_T) g->skinny_max = OSP_CUDA_SKINNY_MAX_T;
    g->workspace_bytes = workspace_bytes;
    if (workspace_bytes) {
        osp_status s = osp_cuda_malloc(&g->workspace, workspace_bytes, "the cuBLASLt workspace");
        if (s != OSP_OK) {
            lt.Destroy(g->lt);
            free(g);
            return s;
        }
    }
    *out = g;
    return OSP_OK;
}

extern "C" void osp_cuda_gemm_destroy(osp_cuda_gemm *g) {
    if (!g) return;
    for (int i = 0; i < g->n_plans; i++) plan_free(&g->plans[i]);
    osp_cuda_free(g->workspace);
    lt.Destroy(g->lt);
    free(g);
}

/* The descriptors of a (T, N, K) plan and the heuristic's candidates (best first) into res[0..*n). */
static osp_status plan_describe(osp_cuda_gemm *g, gemm_plan *p, int64_t T, int64_t N, int64_t K, int64_t ldy,
                                bool y_f32, const char *sk, cublasLtMatmulHeuristicResult_t *res, int cap, int *n) {
    memset(p, 0, sizeof *p);
    p->T = T, p->N = N, p->K = K, p->ldy = ldy, p->y_f32 = y_f32;
    LT_TRY(lt.MatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_TRY(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    LT_TRY(lt.MatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    LT_TRY(lt.MatrixLayoutCreate(&p->a, CUDA_R_16BF, (uint64_t)K, (uint64_t)N, K), "layout A");
    LT_TRY(lt.MatrixLayoutCreate(&p->b, CUDA_R_16BF, (uint64_t)K, (uint64_t)T, K), "layout B");
    LT_TRY(lt.MatrixLayoutCreate(&p->d, y_f32 ? CUDA_R_32F : CUDA_R_16BF, (uint64_t)N, (uint64_t)T, ldy),
           "layout D");
    cublasLtMatmulPreference_t pref;
    LT_TRY(lt.MatmulPreferenceCreate(&pref), "PreferenceCreate");
    size_t ws = g->workspace_bytes;
    lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    /* split-K partial sums in fp32 (the compute type) or none: never added up in the output's bf16 (the
     * INPLACE and OUTPUT_TYPE schemes), which would round every partial to 8 bits */
    const uint32_t red = sk && !strcmp(sk, "0") ? (uint32_t)CUBLASLT_REDUCTION_SCHEME_NONE
                                               : (uint32_t)(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE);
    lt.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &red, sizeof red);
    cublasStatus_t st = lt.MatmulAlgoGetHeuristic(g->lt, p->op, p->a, p->b, p->d, p->d, pref, cap, res, n);
    lt.MatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || *n == 0)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "cublasLt: no algorithm for a bf16 GEMM of [%lld, %lld] x [%lld, %lld]^T",
                             (long long)T, (long long)K, (long long)N, (long long)K);
    return OSP_OK;
}

static int32_t splitk_of(const cublasLtMatmulAlgo_t *a) {
    int32_t splitk = 1;
    size_t w = 0;
    lt.MatmulAlgoConfigGetAttribute(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &w);
    return splitk > 1 ? splitk : 1;
}

/* A workspace of at least `bytes` (a new one: the generation moves). cudaFree waits for the device, so
 * no enqueued GEMM still uses the old one. */
static osp_status workspace_grow(osp_cuda_gemm *g, size_t bytes) {
    if (bytes <= g->workspace_bytes) return OSP_OK;
    osp_cuda_free(g->workspace);
    g->workspace = NULL;
    g->workspace_bytes = 0;
    g->generation++;
    OSP_TRY(osp_cuda_malloc(&g->workspace, bytes, "the cuBLASLt workspace (split-K partials)"));
    g->workspace_bytes = bytes;
    return OSP_OK;
}

/* The split-K count of (N, K, ldy, y_f32): the rule's, or (first seen) the heuristic's at T = 1. */
static osp_status split_rule_of(osp_cuda_gemm *g, int64_t N, int64_t K, int64_t ldy, bool y_f32, const char *sk,
                                int32_t *out) {
    for (int i = 0; i < g->n_rules; i++) {
        const split_rule *r = &g->rules[i];
        if (r->N == N && r->K == K && r->ldy == ldy && r->y_f32 == y_f32) {
            *out = r->splitk;
            return OSP_OK;
        }
    }
    /* OSPREY_CUDA_GEMM_SPLITK: 0 none, S >= 2 that many, else the rule (none while the skinny kernel is on) */
    const int force = sk ? atoi(sk) : g->skinny_max > 0 ? 0 : -1;
    int32_t splitk = force == 0 ? 1 : force >= 2 ? force : 0;
    if (splitk == 0) {
        gemm_plan t1;
        cublasLtMatmulHeuristicResult_t res[1];
        int n = 0;
        const osp_status s = plan_describe(g, &t1, 1, N, K, ldy, y_f32, sk, res, 1, &n);
        splitk = s == OSP_OK ? splitk_of(&res[0].algo) : 1;
        plan_free(&t1);
        OSP_TRY(s);
    }
    if (g->n_rules == GEMM_MAX_RULES) { /* forget the oldest (its shapes re-derive the same count) */
        memmove(&g->rules[0], &g->rules[1], sizeof(split_rule) * (GEMM_MAX_RULES - 1));
        g->n_rules--;
    }
    g->rules[g->n_rules++] = (split_rule){.N = N, .K = K, .ldy = ldy, .y_f32 = y_f32, .splitk = splitk};
    *out = splitk;
    return OSP_OK;
}

static osp_status plan_make(osp_cuda_gemm *g, gemm_plan *p, int64_t T, int64_t N, int64_t K, int64_t ldy,
                            bool y_f32) {
    const char *sk = getenv("OSPREY_CUDA_GEMM_SPLITK"); /* a diagnostic, A/B: "0" no split-K, "S" S-way everywhere */
    if (sk && !sk[0]) sk = NULL;
    int32_t want = 1;
    OSP_TRY(split_rule_of(g, N, K, ldy, y_f32, sk, &want));
    cublasLtMatmulHeuristicResult_t res[8];
    int n = 0;
    OSP_TRY(plan_describe(g, p, T, N, K, ldy, y_f32, sk, res, 8, &n));
    bool found = false;
    for (int i = 0; i < n && !found; i++) /* the heuristic's best that already splits as the rule says */
        if (splitk_of(&res[i].algo) == want) p->algo = res[i].algo, found = true;
    for (int i = 0; i < n && !found; i++) { /* else the first candidate that takes the rule's split */
        cublasLtMatmulAlgo_t a = res[i].algo;
        const int32_t split = want;
        const int32_t scheme = want > 1 ? CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE : CUBLASLT_REDUCTION_SCHEME_NONE;
        cublasLtMatmulHeuristicResult_t chk;
        if (lt.MatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof split) != CUBLAS_STATUS_SUCCESS ||
            lt.MatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme) != CUBLAS_STATUS_SUCCESS ||
            lt.MatmulAlgoCheck(g->lt, p->op, p->a, p->b, p->d, p->d, &a, &chk) != CUBLAS_STATUS_SUCCESS)
            continue;
        OSP_TRY(workspace_grow(g, chk.workspaceSize)); /* the partials of a large T */
        p->algo = a, found = true;
    }
    if (!found)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "cublasLt: no %d-way split-K algorithm for a bf16 GEMM of [%lld, %lld] x "
                             "[%lld, %lld]^T (the split its T = 1 plan takes: every T must split alike to keep a row's bits)",
                             want, (long long)T, (long long)K, (long long)N, (long long)K);
    const char *log = getenv("OSPREY_CUDA_GEMM_LOG"); /* "1": each new plan's choice on stderr (a diagnostic) */
    if (log && !strcmp(log, "1")) {
        int32_t scheme = -1, tile = -1, id = -1;
        size_t w = 0;
        lt.MatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof scheme, &w);
        lt.MatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        lt.MatmulAlgoConfigGetAttribute(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w);
        fprintf(stderr, "cublasLt plan T %lld N %lld K %lld: algo %d tile %d split-K %d reduction %d, workspace %zu\n",
                (long long)T, (long long)N, (long long)K, id, tile, splitk_of(&p->algo), scheme, g->workspace_bytes);
    }
    return OSP_OK;
}

extern "C" uint64_t osp_cuda_gemm_generation(const osp_cuda_gemm *g) { return g->generation; }

extern "C" osp_status osp_cuda_gemm_bf16(osp_cuda_gemm *g, const uint16_t *d_x, const uint16_t *d_w, void *d_y,
                                         bool y_f32, int64_t T, int64_t N, int64_t K, void *stream) {
    return osp_cuda_gemm_bf16_ld(g, d_x, d_w, d_y, y_f32, T, N, K, N, stream);
}

extern "C" osp_status osp_cuda_gemm_bf16_ld(osp_cuda_gemm *g, const uint16_t *d_x, const uint16_t *d_w, void *d_y,
                                            bool y_f32, int64_t T, int64_t N, int64_t K, int64_t ldy, void *stream) {
    if (!g || !d_x || !d_w || !d_y || T <= 0 || N <= 0 || K <= 0 || ldy < N)
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_gemm_bf16: bad arguments (T %lld, N %lld, K %lld, ldy %lld)",
                             (long long)T, (long long)N, (long long)K, (long long)ldy);
    if (T <= g->skinny_max && osp_cuda_skinny_supported(d_x, d_w, T, N, K))
        return osp_cuda_skinny_bf16(d_x, d_w, d_y, y_f32, T, N, K, ldy, stream);
    gemm_plan *p = NULL;
    for (int i = 0; i < g->n_plans && !p; i++) {
        gemm_plan *q = &g->plans[i];
        if (q->T == T && q->N == N && q->K == K && q->ldy == ldy && q->y_f32 == y_f32) p = q;
    }
    if (!p) {
        if (g->n_plans == GEMM_MAX_PLANS) { /* evict the oldest: shapes this many are a workload change */
            plan_free(&g->plans[0]);
            memmove(&g->plans[0], &g->plans[1], sizeof(gemm_plan) * (GEMM_MAX_PLANS - 1));
            g->n_plans--;
        }
        p = &g->plans[g->n_plans];
        osp_status s = plan_make(g, p, T, N, K, ldy, y_f32);
        if (s != OSP_OK) {
            plan_free(p);
            return s;
        }
        g->n_plans++;
    }
    const float alpha = 1.0f, beta = 0.0f;
    LT_TRY(lt.Matmul(g->lt, p->op, &alpha, d_w, p->a, d_x, p->b, &beta, d_y, p->d, d_y, p->d, &p->algo,
                          g->workspace, g->workspace_bytes, (cudaStream_t)stream),
           "Matmul");
    return OSP_OK;
}

/* ---- the measured bf16 GEMM ceiling ------------------------------------------------------------- */

/* v[i] = a uniform value in [-1, 1) from a hash of (seed, i), as bf16: non-constant, finite data (a
 * GEMM over constant or zero data toggles fewer bits, draws less power and holds higher clocks, so it
 * would overstate the peak). */
__global__ void peak_fill_kernel(uint16_t *v, int64_t n, uint64_t seed) {
    osp_pdl_begin();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = seed + (uint64_t)(i + 1) * 0x9e3779b97f4a7c15ull;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        v[i] = osp_f_to_bf16((float)((int32_t)(z >> 40) - 8388608) * (1.0f / 8388608.0f)); /* 24 bits: [-1, 1) */
    }
}

extern "C" osp_status osp_cuda_gemm_peak_gflops(int64_t T, int64_t N, int64_t K, int reps, double *gflops) {
    if (!gflops || T <= 0 || N <= 0 || K <= 0 || reps <= 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "osp_cuda_gemm_peak_gflops: bad arguments (T %lld, N %lld, K %lld, reps %d)",
                             (long long)T, (long long)N, (long long)K, reps);
    *gflops = 0.0;
    osp_cuda_gemm *g = NULL;
    void *x = NULL, *w = NULL, *y = NULL, *stream = NULL, *e0 = NULL, *e1 = NULL;
    osp_status s = osp_cuda_gemm_create(32u << 20, &g); /* the backend's workspace size (backend_cuda.c) */
    if (s == OSP_OK) s = osp_cuda_malloc(&x, sizeof(uint16_t) * (size_t)(T * K), "the GEMM peak's x");
    if (s == OSP_OK) s = osp_cuda_malloc(&w, sizeof(uint16_t) * (size_t)(N * K), "the GEMM peak's w");
    if (s == OSP_OK) s = osp_cuda_malloc(&y, sizeof(uint16_t) * (size_t)(T * N), "the GEMM peak's y");
    if (s == OSP_OK) s = osp_cuda_stream_create(&stream);
    if (s == OSP_OK) s = osp_cuda_event_create(&e0);
    if (s == OSP_OK) s = osp_cuda_event_create(&e1);
    if (s == OSP_OK) {
        osp_launch(peak_fill_kernel, 1024, 256, 0, (cudaStream_t)stream, (uint16_t *)x, T * K, 0x5eedull);
        osp_launch(peak_fill_kernel, 1024, 256, 0, (cudaStream_t)stream, (uint16_t *)w, N * K, 0xfeedull);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess)
            s = osp_set_error(OSP_ERR_INTERNAL, "cuda: launching peak_fill_kernel failed: %s", cudaGetErrorString(e));
    }
    /* warm-up: the plan (heuristic) is made by the first call; the rest bring the clocks up */
    for (int i = 0; s == OSP_OK && i < 5; i++)
        s = osp_cuda_gemm_bf16(g, (const uint16_t *)x, (const uint16_t *)w, y, false, T, N, K, stream);
    if (s == OSP_OK) s = osp_cuda_stream_sync(stream);
    if (s == OSP_OK) s = osp_cuda_event_record(e0, stream);
    for (int i = 0; s == OSP_OK && i < reps; i++)
        s = osp_cuda_gemm_bf16(g, (const uint16_t *)x, (const uint16_t *)w, y, false, T, N, K, stream);
    if (s == OSP_OK) s = osp_cuda_event_record(e1, stream);
    float ms = 0.0f;
    if (s == OSP_OK) s = osp_cuda_event_elapsed_ms(e0, e1, &ms);
    if (s == OSP_OK && ms > 0.0f) *gflops = 2.0 * (double)T * (double)N * (double)K * reps / ((double)ms * 1e6);
    if (stream) osp_cuda_stream_sync(stream);
    osp_cuda_event_destroy(e0), osp_cuda_event_destroy(e1);
    osp_cuda_stream_destroy(stream);
    osp_cuda_free(x), osp_cuda_free(w), osp_cuda_free(y);
    osp_cuda_gemm_destroy(g);
    return s;
}
