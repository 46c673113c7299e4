/* The runtime kernel selection table: which registered version (kernel_registry.h) of an op kind to
 * run, per model shape, on one kind of device, as measured by the proving ground. Made by
 * `osprey bench-kernels --make-table REPORT.json... -o TABLE.json` from reports whose gate passed;
 * loaded at engine start from osp_engine_params.kernel_table or $OSPREY_KERNEL_TABLE.
 *
 * The file (JSON):
 *   { "osprey_kernel_table": 1,            format version (1)
 *     "device": "cuda",                     the backend it was measured on ("cpu" or "cuda")
 *     "gpu": "NVIDIA H200",                 the device's name (logged; not matched)
 *     "arch": 90, "driver_major": 12,       compute capability x 10 and CUDA driver major: a table is
 *                                           used only on a device with both equal (0 and 0 on the CPU)
 *     "sources": ["run1.json", ...],        optional: the reports it was made from
 *     "rows": [ { "op": "attention",        an op kind with more than one table-choosable version
 *                 "head_dim": 128,           the model's head_dim, 0: any
 *                 "kv_dtype": "f16",         the KV page type: "f16", "f32", "fp8", "nvfp4", "int8_hier" or "any"
 *                 "version": "attention/v1", a registered, table-choosable version of that op kind
 *                 "evidence": ... } ] }      optional, any JSON: what the choice rests on
 * Unknown fields, kinds, versions, dtypes, or two rows for one bucket are errors (a typo must not pass
 * as a silent default). At most OSP_KERNEL_TABLE_MAX_ROWS rows.
 *
 * A bucket is (op kind, head_dim, KV page type) and nothing else, on purpose: a request's results must
 * never depend on its batch, and attention versions do not round alike (mma.sync, wgmma and CUDA-core
 * folds differ in the last bits), so a table may choose by the model's shape and the device, never by
 * batch size, query length (decode or prefill) or context length. One choice per op kind holds for the
 * whole process. */
#ifndef OSP_BACKEND_KERNEL_TABLE_H
#define OSP_BACKEND_KERNEL_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/kernel_registry.h"

#define OSP_KERNEL_TABLE_MAX_ROWS 256
#define OSP_KERNEL_TABLE_FORMAT 1

typedef struct osp_kernel_table_row {
    osp_op_kind kind;
    int32_t head_dim;  /* 0: any */
    int32_t kv_dtype;  /* osp_kv_dtype, or -1: any */
    const osp_kernel_version *version;
} osp_kernel_table_row;

typedef struct osp_kernel_table {
    osp_device device;
    char gpu[128];
    int32_t arch, driver_major;
    int32_t n_rows;
    osp_kernel_table_row rows[OSP_KERNEL_TABLE_MAX_ROWS];
} osp_kernel_table;

/* Parses a table from text [len] (not NUL-terminated necessarily); `where` names it in messages.
 * *out is allocated (osp_kernel_table_free). Errors: OSP_ERR_FORMAT with the field at fault (bad JSON,
 * a missing or unknown field, an unknown op kind or version, a version the table may not choose, a
 * duplicate bucket, too many rows), OSP_ERR_NOMEM. */
osp_status osp_kernel_table_parse(const char *text, size_t len, const char *where, osp_kernel_table **out);
/* Reads and parses the file at path. Errors: OSP_ERR_IO when it cannot be read (or is over 16 MiB),
 * those of osp_kernel_table_parse. */
osp_status osp_kernel_table_load(const char *path, osp_kernel_table **out);
void osp_kernel_table_free(osp_kernel_table *t); /* NULL is fine */

/* true when t was measured on a device like dev (same backend, arch and driver major); false with
 * the reason in why [n]. */
bool osp_kernel_table_matches(const osp_kernel_table *t, const osp_device_info *dev, char *why, size_t n);

/* One op kind's decision. */
typedef struct osp_kernel_choice {
    const osp_kernel_version *version; /* what runs; NULL only for a kind the device does not register */
    bool from_table;                   /* the table's row (else the default) */
    char why[384];                     /* one line: the row, or why the default */
} osp_kernel_choice;

/* Decides op kind `kind` for a model of target tg on device dev: the first row of t whose bucket
 * matches tg (head_dim equal or 0, kv_dtype equal or any) when t matches dev and that row's version
 * applies to tg (its predicate); otherwise the registry's default (osp_kernel_default). t may be NULL. */
osp_kernel_choice osp_kernel_table_choose(const osp_kernel_table *t, const osp_device_info *dev,
                                          const osp_kernel_target *tg, osp_op_kind kind);

/* Engine start-up: path (NULL or "": $OSPREY_KERNEL_TABLE; neither set: nothing happens) is loaded and
 * every op kind of `device` with more than one table-choosable version is decided for a model of
 * head_dim and kv_dtype, then applied (a version selected by environment gets its variable set unless
 * the user set that variable already: the user's wins). Each decision is one line to log(ctx, line)
 * (may be NULL). A table for another device, arch or driver major is ignored with a line. Must run
 * before the backend's first op of the kinds decided (the CUDA backend reads its variables once).
 * Errors: those of osp_kernel_table_load (a malformed table fails start-up: it was asked for), those
 * of osp_backend_device_info. */
osp_status osp_kernel_table_apply(const char *path, osp_device device, int32_t head_dim, osp_kv_dtype kv_dtype,
                                  void (*log)(void *ctx, const char *line), void *ctx);

#endif
