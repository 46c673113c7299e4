/* The kernel registry (kernel_registry.h): one static table of every op kind's versions per backend.
 *
 * Adding a version: a row below with its predicate and its selection (for CUDA kernels, the value of
 * the environment variable the backend reads). The CUDA attention defaults follow attention_v1.h:
 * OSP_CUDA_ATTN_V1_DEFAULT makes v1 the default where it applies, and OSP_CUDA_ATTN_V2_DEFAULT (when
 * that header defines it) puts v2 before it. */
#include "backend/kernel_registry.h"

#include <stdio.h>
#include <string.h>

#include "backend/cuda/attention_v1.h"

#if defined(OSP_CUDA_ATTN_V2_DEFAULT) && OSP_CUDA_ATTN_V2_DEFAULT
#define RANK_V2 1
#define RANK_V1 2
#define RANK_V0 3
#else
#define RANK_V2 0
#define RANK_V1 1
#define RANK_V0 2
#endif

/* ---- predicates ---------------------------------------------------------------------------------- */

static bool any_shape(const osp_kernel_target *t, char *why, size_t n) {
    (void)t, (void)why, (void)n;
    return true;
}

/* the CUDA kernels are built for sm_90a alone (-gencode arch=compute_90a,code=sm_90a): arch-specific
 * code runs on compute capability 9.0 only */
static bool cuda_sm90(const osp_kernel_target *t, char *why, size_t n) {
    if (t->arch == 90) return true;
    snprintf(why, n, "built for sm_90a only; this device is sm_%d", t->arch);
    return false;
}

/* the KV page dtypes the CUDA KV write and the CUDA-core attention kernel have (issues 13 and 14: fp8,
 * nvfp4 and int8_hier pages are quantized on write and decoded per tile by v0; the tensor-core versions
 * take f16) */
static bool cuda_kv_dtype(const osp_kernel_target *t, char *why, size_t n) {
    if (t->kv_dtype == OSP_KV_DTYPE_F16 || t->kv_dtype == OSP_KV_DTYPE_F32 || t->kv_dtype == OSP_KV_DTYPE_FP8 ||
        t->kv_dtype == OSP_KV_DTYPE_NVFP4 || t->kv_dtype == OSP_KV_DTYPE_INT8_HIER)
        return true;
    snprintf(why, n, "KV pages of dtype %d (f16, f32, fp8, nvfp4 or int8_hier)", (int)t->kv_dtype);
    return false;
}

static bool attn_v0(const osp_kernel_target *t, char *why, size_t n) {
    if (!cuda_sm90(t, why, n)) return false;
    if (t->head_dim != 32 && t->head_dim != 64 && t->head_dim != 128 && t->head_dim != 256) {
        snprintf(why, n, "head_dim %d (32, 64, 128 or 256)", t->head_dim);
        return false;
    }
    return cuda_kv_dtype(t, why, n);
}

static bool attn_v1(const osp_kernel_target *t, char *why, size_t n) {
    if (!cuda_sm90(t, why, n)) return false;
    if (t->kv_dtype != OSP_KV_DTYPE_F16) return snprintf(why, n, "f16 KV pages only"), false;
    if (t->head_dim != 32 && t->head_dim != 64 && t->head_dim != 128) {
        snprintf(why, n, "head_dim %d (32, 64 or 128)", t->head_dim);
        return false;
    }
    return true;
}

static bool attn_v2(const osp_kernel_target *t, char *why, size_t n) {
    if (!cuda_sm90(t, why, n)) return false;
    if (t->kv_dtype != OSP_KV_DTYPE_F16) return snprintf(why, n, "f16 KV pages only"), false;
    if (t->head_dim != 64 && t->head_dim != 128) {
        snprintf(why, n, "head_dim %d (64 or 128)", t->head_dim);
        return false;
    }
    return true;
}

static bool rope_cuda(const osp_kernel_target *t, char *why, size_t n) {
    if (!cuda_sm90(t, why, n)) return false;
    if (t->kv_dtype == OSP_KV_DTYPE_NVFP4 && t->head_dim % 16 != 0) {
        snprintf(why, n, "nvfp4 KV pages need head_dim %% 16 == 0 (head_dim %d)", t->head_dim);
        return false;
    }
    if (t->kv_dtype == OSP_KV_DTYPE_INT8_HIER && t->head_dim % 2 != 0) {
        snprintf(why, n, "int8_hier KV pages need an even head_dim (head_dim %d)", t->head_dim);
        return false;
    }
    return cuda_kv_dtype(t, why, n);
}

/* ---- the table ----------------------------------------------------------------------------------- */

#define CPU_ONE(k, nm, what) {nm "/v0", OSP_DEVICE_CPU, k, 0, 1, what, NULL, NULL, false, false, any_shape}
#define CUDA_ONE(k, nm, what, pred) {nm "/v0", OSP_DEVICE_CUDA, k, 0, 1, what, NULL, NULL, false, false, pred}

static const osp_kernel_version k_versions[] = {
    /* the CPU backend (src/backend/cpu/) */
    CPU_ONE(OSP_OP_EMBED, "embed", "row gather and scale"),
    CPU_ONE(OSP_OP_ADD_RMSNORM, "add_rmsnorm", "residual add + RMSNorm, sum of squares in double"),
    CPU_ONE(OSP_OP_GATHER_RMSNORM, "gather_rmsnorm", "RMSNorm of the logits rows"),
    {"matmul/v0", OSP_DEVICE_CPU, OSP_OP_MATMUL, 0, 0, "exact path: fp32 activations against every weight type",
     NULL, NULL, true, false, any_shape},
    {"matmul/v1", OSP_DEVICE_CPU, OSP_OP_MATMUL, 1, 1,
     "fast path: int8 activations (per-row scales) against block-quantized weights (qdot.c)", NULL, NULL, false,
     false, any_shape},
    CPU_ONE(OSP_OP_ROPE_KV_WRITE, "rope_kv_write", "bias, q/k norm, RoPE, K/V page write"),
    CPU_ONE(OSP_OP_ATTENTION, "attention", "paged attention, one query row at a time, online softmax"),
    CPU_ONE(OSP_OP_GLU, "glu", "SiLU / GELU-tanh gate times up"),
    CPU_ONE(OSP_OP_ADD, "add", "elementwise add"),
    CPU_ONE(OSP_OP_COPY, "copy", "memcpy of an activation"),
    CPU_ONE(OSP_OP_SCALE, "scale", "elementwise scale"),
    CPU_ONE(OSP_OP_SOFTCAP, "softcap", "cap * tanh(x / cap)"),
    CPU_ONE(OSP_OP_ALL_REDUCE, "all_reduce", "sum over tensor-parallel ranks in rank order (local communicator)"),
    CPU_ONE(OSP_OP_ALL_GATHER, "all_gather", "tensor-parallel ranks' columns side by side (local communicator)"),
    /* the CUDA backend (src/backend/cuda/) */
    CUDA_ONE(OSP_OP_EMBED, "embed", "bf16 table rows to fp32 (ops.cu)", cuda_sm90),
    CUDA_ONE(OSP_OP_ADD_RMSNORM, "add_rmsnorm", "fused residual add + RMSNorm (ops.cu)", cuda_sm90),
    CUDA_ONE(OSP_OP_GATHER_RMSNORM, "gather_rmsnorm", "RMSNorm of the logits rows (ops.cu)", cuda_sm90),
    CUDA_ONE(OSP_OP_MATMUL, "matmul", "cuBLASLt bf16 x bf16, fp32 accumulation (gemm.cu)", cuda_sm90),
    CUDA_ONE(OSP_OP_ROPE_KV_WRITE, "rope_kv_write", "one launch for q, k and v (ops.cu)", rope_cuda),
    {"attention/v0", OSP_DEVICE_CUDA, OSP_OP_ATTENTION, 0, RANK_V0,
     "CUDA cores, any supported shape (attention.cu)", "OSPREY_CUDA_ATTENTION", "v0", false, true, attn_v0},
    {"attention/v1", OSP_DEVICE_CUDA, OSP_OP_ATTENTION, 1, RANK_V1,
     "tensor cores by mma.sync, f16 pages, head_dim 32/64/128 (attention_mma.cu)", "OSPREY_CUDA_ATTENTION", "v1",
     false, true, attn_v1},
    {"attention/v2", OSP_DEVICE_CUDA, OSP_OP_ATTENTION, 2, RANK_V2,
     "tensor cores by wgmma, f16 pages, head_dim 64/128 (attention_mma.cu)", "OSPREY_CUDA_ATTENTION", "v2", false,
     true, attn_v2},
    CUDA_ONE(OSP_OP_GLU, "glu", "SiLU / GELU-tanh gate times up (ops.cu)", cuda_sm90),
    CUDA_ONE(OSP_OP_ADD, "add", "residual add (ops.cu)", cuda_sm90),
    CUDA_ONE(OSP_OP_COPY, "copy", "device-to-device copy on the stream", cuda_sm90),
    CUDA_ONE(OSP_OP_SCALE, "scale", "elementwise scale (ops.cu)", cuda_sm90),
    CUDA_ONE(OSP_OP_SOFTCAP, "softcap", "cap * tanh(x / cap) (ops.cu)", cuda_sm90),
    CUDA_ONE(OSP_OP_ALL_REDUCE, "all_reduce", "one rank: the identity, nothing launched (NCCL not built)", cuda_sm90),
    CUDA_ONE(OSP_OP_ALL_GATHER, "all_gather", "one rank: a device copy (NCCL not built)", cuda_sm90),
};

#define N_VERSIONS ((int)(sizeof k_versions / sizeof k_versions[0]))

int osp_kernel_registry_count(void) { return N_VERSIONS; }

const osp_kernel_version *osp_kernel_registry_at(int i) { return i >= 0 && i < N_VERSIONS ? &k_versions[i] : NULL; }

const osp_kernel_version *osp_kernel_find(osp_device d, const char *name) {
    for (int i = 0; name && i < N_VERSIONS; i++)
        if (k_versions[i].device == d && !strcmp(k_versions[i].name, name)) return &k_versions[i];
    return NULL;
}

bool osp_kernel_applies(const osp_kernel_version *v, const osp_kernel_target *t, char *why, size_t n) {
    if (why && n) why[0] = 0;
    char tmp[8];
    if (!why || !n) why = tmp, n = sizeof tmp;
    return !v->applies || v->applies(t, why, n);
}

const osp_kernel_version *osp_kernel_default(osp_device d, osp_op_kind k, const osp_kernel_target *t) {
    const osp_kernel_version *best = NULL, *any = NULL;
    for (int i = 0; i < N_VERSIONS; i++) {
        const osp_kernel_version *v = &k_versions[i];
        if (v->device != d || v->kind != k || v->default_rank <= 0) continue;
        if (!any || v->default_rank < any->default_rank) any = v;
        if ((!best || v->default_rank < best->default_rank) && osp_kernel_applies(v, t, NULL, 0)) best = v;
    }
    return best ? best : any;
}

int osp_kernel_choosable_count(osp_device d, osp_op_kind k) {
    int c = 0;
    for (int i = 0; i < N_VERSIONS; i++) c += k_versions[i].device == d && k_versions[i].kind == k && k_versions[i].table_choosable;
    return c;
}

const char *osp_kernel_label(const osp_kernel_version *v, char *buf, size_t n) {
    snprintf(buf, n, "%s:%s", v->device == OSP_DEVICE_CUDA ? "cuda" : "cpu", v->name);
    return buf;
}

osp_op_kind osp_kernel_kind_of(const char *name) {
    if (!name) return OSP_OP_COUNT;
    const size_t len = strcspn(name, "/");
    for (int k = 0; k < OSP_OP_COUNT; k++) {
        const char *kn = osp_op_name((osp_op_kind)k);
        if (strlen(kn) == len && !strncmp(kn, name, len)) return (osp_op_kind)k;
    }
    return OSP_OP_COUNT;
}
