/* The kernel registry: every implementation version of every op kind, per backend, stays linked and
 * selectable (llm.c's dev/cuda way: an older version is kept beside the newer one, so a proving-ground
 * run can compare them and a device where the newer one loses can keep the older). Each version says
 * what it needs (a compatibility predicate over the device and the model's shape) and how it is
 * selected; the registry itself selects nothing. Readers: `osprey bench-kernels --list` and
 * `--solution cuda:attention/v1` (bench/kernels/), and the runtime selection table
 * (src/backend/kernel_table.h).
 *
 * Numbering: "<op kind>/v<N>", N from 0 in the order the versions were written. A backend whose op kind
 * has one implementation registers it as v0. */
#ifndef OSP_BACKEND_KERNEL_REGISTRY_H
#define OSP_BACKEND_KERNEL_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/op.h"
#include "osprey/batch.h"

/* What a version's predicate looks at: the device and the model's shape, never the batch (a
 * request's results must not depend on the batch it runs in: see kernel_table.h). */
typedef struct osp_kernel_target {
    int32_t arch;          /* CUDA compute capability, major * 10 + minor (90: sm_90); 0 on the CPU */
    int32_t head_dim;      /* attention, rope_kv_write: the model's head_dim D; 0: unknown or n/a */
    osp_kv_dtype kv_dtype; /* the KV cache's page type (attention, rope_kv_write) */
} osp_kernel_target;

typedef struct osp_kernel_version {
    const char *name;    /* "attention/v1": the op kind's name (osp_op_name), '/', 'v' and number */
    osp_device device;   /* the backend it belongs to */
    osp_op_kind kind;
    int32_t number;      /* N of vN */
    /* > 0: this version is the backend's own default choice where it applies; among several the
     * lowest rank that applies wins (the CUDA attention default is v1 where it applies, else v0). 0:
     * runs only when selected. */
    int32_t default_rank;
    const char *summary; /* one line: what it is */
    /* How it is selected. env_key non-NULL: put env_key=env_value in the process's environment before
     * the backend runs its first op of this kind (the backend reads it once). cpu_exact: the CPU
     * backend's exact path (osp_backend_params.exact / osp_model_params.exact). Neither: it is the only
     * version, always selected. */
    const char *env_key, *env_value;
    bool cpu_exact;
    /* Whether a runtime selection table may choose it instead of the default: true only for drop-in
     * replacements (same inputs, same tolerance class). The CPU's exact path changes the precision the
     * user asked for, so only --exact selects it. */
    bool table_choosable;
    /* The compatibility predicate: true when the version runs this target as itself; false with the
     * reason in why [n] (a backend may then run another version in its place: v1 runs v0 at D 256). */
    bool (*applies)(const osp_kernel_target *t, char *why, size_t n);
} osp_kernel_version;

/* The registered versions, i in [0, count): static storage, never NULL inside the range. */
int osp_kernel_registry_count(void);
const osp_kernel_version *osp_kernel_registry_at(int i);
/* The version of this name ("attention/v1") on device d, or NULL. */
const osp_kernel_version *osp_kernel_find(osp_device d, const char *name);
/* The backend's default for op kind k on target t: the applicable version of lowest default_rank, or
 * the kind's lowest-ranked default when none applies; NULL only for a kind d does not register. */
const osp_kernel_version *osp_kernel_default(osp_device d, osp_op_kind k, const osp_kernel_target *t);
/* Versions of op kind k on d the table may choose (table_choosable): their count. */
int osp_kernel_choosable_count(osp_device d, osp_op_kind k);
/* v's predicate on t (true when v has none); why [n] gets the reason when false. */
bool osp_kernel_applies(const osp_kernel_version *v, const osp_kernel_target *t, char *why, size_t n);
/* "device:name" ("cuda:attention/v1") into buf [n]; returns buf. */
const char *osp_kernel_label(const osp_kernel_version *v, char *buf, size_t n);
/* The op kind of a name ("attention" or "attention/v1": OSP_OP_ATTENTION); OSP_OP_COUNT when unknown. */
osp_op_kind osp_kernel_kind_of(const char *name);

/* The CUDA backend's environment check (backend_cuda.c; the stub returns true): false, with the
 * reason, when OSPREY_CUDA_ATTENTION names a kernel this build does not have, or the attention mode
 * was already fixed in this process to another (the backend reads the variable once). */
bool osp_backend_cuda_attention_env_honoured(char *why, size_t n);

#endif
