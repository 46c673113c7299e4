/* The runtime kernel selection table (kernel_table.h): a strict JSON reader (jansson), the per-kind
 * decision with its fallbacks, and the start-up step that applies it. */
#include "backend/kernel_table.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/file.h"
#include "core/status_internal.h"
#include "osprey/kv_cache.h"

#define MAX_TABLE_BYTES ((size_t)16 << 20)

static bool only_keys(json_t *o, const char *const *keys, const char **bad) {
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        bool known = false;
        for (int i = 0; keys[i] && !known; i++) known = !strcmp(k, keys[i]);
        if (!known) return *bad = k, false;
    }
    return true;
}

/* an integer field in [lo, hi] */
static bool int_field(json_t *o, const char *key, int64_t lo, int64_t hi, int32_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    const json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return false;
    *out = (int32_t)x;
    return true;
}

static osp_status parse_row(json_t *r, const char *where, int i, osp_device dev, osp_kernel_table_row *row) {
    static const char *const keys[] = {"op", "head_dim", "kv_dtype", "version", "evidence", NULL};
    const char *bad = NULL;
    if (!json_is_object(r)) return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d] is not an object", where, i);
    if (!only_keys(r, keys, &bad))
        return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d]: unknown field '%s' (op, head_dim, kv_dtype, version, evidence)",
                             where, i, bad);
    const char *op = json_string_value(json_object_get(r, "op"));
    const char *ver = json_string_value(json_object_get(r, "version"));
    const char *kv = json_string_value(json_object_get(r, "kv_dtype"));
    if (!op || !ver || !kv) return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d]: op, kv_dtype and version must be strings", where, i);
    row->kind = osp_kernel_kind_of(op);
    if (row->kind == OSP_OP_COUNT || strchr(op, '/'))
        return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d]: unknown op kind '%s'", where, i, op);
    if (!int_field(r, "head_dim", 0, 1024, &row->head_dim))
        return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d]: head_dim must be an integer from 0 (any) to 1024", where, i);
    osp_kv_dtype d;
    if (!strcmp(kv, "any")) row->kv_dtype = -1;
    else if (osp_kv_dtype_parse(kv, &d) == OSP_OK) row->kv_dtype = (int32_t)d;
    else return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d]: kv_dtype '%s' (f16, f32, fp8, nvfp4, ... or any)", where, i, kv);
    row->version = osp_kernel_find(dev, ver);
    if (!row->version)
        return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d]: '%s' is not a registered %s version (osprey bench-kernels --list)",
                             where, i, ver, dev == OSP_DEVICE_CUDA ? "cuda" : "cpu");
    if (row->version->kind != row->kind)
        return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d]: version '%s' is not of op '%s'", where, i, ver, op);
    if (!row->version->table_choosable)
        return osp_set_error(OSP_ERR_FORMAT, "%s: rows[%d]: '%s' is not a version a table may choose", where, i, ver);
    return OSP_OK;
}

osp_status osp_kernel_table_parse(const char *text, size_t len, const char *where, osp_kernel_table **out) {
    *out = NULL;
    if (!where) where = "kernel table";
    json_error_t je;
    json_t *root = text ? json_loadb(text, len, JSON_REJECT_DUPLICATES, &je) : NULL;
    if (!root) return osp_set_error(OSP_ERR_FORMAT, "%s: not JSON (line %d: %s)", where, text ? je.line : 0, text ? je.text : "no text");
    osp_status s = OSP_OK;
    osp_kernel_table *t = calloc(1, sizeof *t);
    if (!t) {
        json_decref(root);
        return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", where);
    }
    static const char *const keys[] = {"osprey_kernel_table", "device", "gpu", "arch", "driver_major", "sources", "rows", NULL};
    const char *bad = NULL;
    int32_t fmt = 0;
    if (!json_is_object(root)) {
        s = osp_set_error(OSP_ERR_FORMAT, "%s: the table is not a JSON object", where);
        goto done;
    }
    if (!only_keys(root, keys, &bad)) {
        s = osp_set_error(OSP_ERR_FORMAT, "%s: unknown field '%s'", where, bad);
        goto done;
    }
    if (!int_field(root, "osprey_kernel_table", 1, 1000, &fmt) || fmt != OSP_KERNEL_TABLE_FORMAT) {
        s = osp_set_error(OSP_ERR_FORMAT, "%s: osprey_kernel_table must be %d (the format version)", where, OSP_KERNEL_TABLE_FORMAT);
        goto done;
    }
    const char *dev = json_string_value(json_object_get(root, "device"));
    if (!dev || (strcmp(dev, "cpu") && strcmp(dev, "cuda"))) {
        s = osp_set_error(OSP_ERR_FORMAT, "%s: device must be \"cpu\" or \"cuda\"", where);
        goto done;
    }
    t->device = !strcmp(dev, "cuda") ? OSP_DEVICE_CUDA : OSP_DEVICE_CPU;
    const char *gpu = json_string_value(json_object_get(root, "gpu"));
    if (!gpu) {
        s = osp_set_error(OSP_ERR_FORMAT, "%s: gpu must be a string (the device's name)", where);
        goto done;
    }
    snprintf(t->gpu, sizeof t->gpu, "%s", gpu);
    if (!int_field(root, "arch", 0, 10000, &t->arch) || !int_field(root, "driver_major", 0, 10000, &t->driver_major)) {
        s = osp_set_error(OSP_ERR_FORMAT, "%s: arch and driver_major must be integers from 0 to 10000", where);
        goto done;
    }
    json_t *src = json_object_get(root, "sources");
    if (src) {
        size_t i;
        json_t *e;
        bool ok = json_is_array(src);
        json_array_foreach(src, i, e) ok &= json_is_string(e);
        if (!ok) {
            s = osp_set_error(OSP_ERR_FORMAT, "%s: sources must be an array of strings", where);
            goto done;
        }
    }
    json_t *rows = json_object_get(root, "rows");
    if (!json_is_array(rows)) {
        s = osp_set_error(OSP_ERR_FORMAT, "%s: rows must be an array", where);
        goto done;
    }
    if (json_array_size(rows) > OSP_KERNEL_TABLE_MAX_ROWS) {
        s = osp_set_error(OSP_ERR_FORMAT, "%s: %zu rows (at most %d)", where, json_array_size(rows), OSP_KERNEL_TABLE_MAX_ROWS);
        goto done;
    }
    for (size_t i = 0; i < json_array_size(rows); i++) {
        osp_kernel_table_row *row = &t->rows[t->n_rows];
        if ((s = parse_row(json_array_get(rows, i), where, (int)i, t->device, row)) != OSP_OK) goto done;
        for (int32_t j = 0; j < t->n_rows; j++)
            if (t->rows[j].kind == row->kind && t->rows[j].head_dim == row->head_dim && t->rows[j].kv_dtype == row->kv_dtype) {
                s = osp_set_error(OSP_ERR_FORMAT, "%s: rows[%zu] repeats the bucket of rows[%d] (%s, head_dim %d)", where, i,
                                  (int)j, osp_op_name(row->kind), (int)row->head_dim);
                goto done;
            }
        t->n_rows++;
    }
done:
    json_decref(root);
    if (s != OSP_OK) free(t);
    else *out = t;
    return s;
}

osp_status osp_kernel_table_load(const char *path, osp_kernel_table **out) {
    *out = NULL;
    char *buf;
    size_t n;
    OSP_TRY(osp_read_file(path, MAX_TABLE_BYTES, "kernel table", &buf, &n));
    const osp_status s = osp_kernel_table_parse(buf, n, path, out);
    free(buf);
    return s;
}

void osp_kernel_table_free(osp_kernel_table *t) { free(t); }

bool osp_kernel_table_matches(const osp_kernel_table *t, const osp_device_info *dev, char *why, size_t n) {
    const char *tn = t->device == OSP_DEVICE_CUDA ? "cuda" : "cpu", *dn = dev->device == OSP_DEVICE_CUDA ? "cuda" : "cpu";
    if (t->device != dev->device) {
        snprintf(why, n, "it was measured on the %s backend, this engine runs on %s", tn, dn);
        return false;
    }
    if (t->arch != dev->arch || t->driver_major != dev->driver_major) {
        snprintf(why, n, "it was measured on %.60s (arch %d, driver %d), this device is %.60s (arch %d, driver %d)", t->gpu,
                 (int)t->arch, (int)t->driver_major, dev->name, (int)dev->arch, (int)dev->driver_major);
        return false;
    }
    return true;
}

osp_kernel_choice osp_kernel_table_choose(const osp_kernel_table *t, const osp_device_info *dev,
                                          const osp_kernel_target *tg, osp_op_kind kind) {
    osp_kernel_choice c = {.version = osp_kernel_default(dev->device, kind, tg)};
    char why[256] = "";
    if (!t) {
        snprintf(c.why, sizeof c.why, "default (no table)");
        return c;
    }
    if (!osp_kernel_table_matches(t, dev, why, sizeof why)) {
        snprintf(c.why, sizeof c.why, "default (table ignored: %.256s)", why);
        return c;
    }
    for (int32_t i = 0; i < t->n_rows; i++) {
        const osp_kernel_table_row *r = &t->rows[i];
        if (r->kind != kind || (r->head_dim && r->head_dim != tg->head_dim) ||
            (r->kv_dtype >= 0 && r->kv_dtype != (int32_t)tg->kv_dtype))
            continue;
        if (!osp_kernel_applies(r->version, tg, why, sizeof why)) {
            snprintf(c.why, sizeof c.why, "default (the table's row %d names %s, which does not apply: %.120s)", (int)i,
                     r->version->name, why);
            return c;
        }
        c.version = r->version;
        c.from_table = true;
        snprintf(c.why, sizeof c.why, "the table's row %d (head_dim %d, kv %s)", (int)i, (int)r->head_dim,
                 r->kv_dtype < 0 ? "any" : osp_kv_dtype_name((osp_kv_dtype)r->kv_dtype));
        return c;
    }
    snprintf(c.why, sizeof c.why, "default (no row of the table for head_dim %d, kv %s)", (int)tg->head_dim,
             osp_kv_dtype_name(tg->kv_dtype) ? osp_kv_dtype_name(tg->kv_dtype) : "?");
    return c;
}

static void say(void (*log)(void *, const char *), void *ctx, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(void (*log)(void *, const char *), void *ctx, const char *fmt, ...) {
    if (!log) return;
    char line[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log(ctx, line);
}

osp_status osp_kernel_table_apply(const char *path, osp_device device, int32_t head_dim, osp_kv_dtype kv_dtype,
                                  void (*log)(void *ctx, const char *line), void *ctx) {
    if (!path || !path[0]) path = getenv("OSPREY_KERNEL_TABLE");
    if (!path || !path[0]) return OSP_OK;
    osp_kernel_table *t = NULL;
    OSP_TRY(osp_kernel_table_load(path, &t));
    osp_device_info dev;
    osp_status s = osp_backend_device_info(device, &dev);
    if (s != OSP_OK) {
        osp_kernel_table_free(t);
        return s;
    }
    char why[256];
    if (!osp_kernel_table_matches(t, &dev, why, sizeof why)) {
        say(log, ctx, "kernel table %s ignored: %s; every op kind runs its default", path, why);
        osp_kernel_table_free(t);
        return OSP_OK;
    }
    say(log, ctx, "kernel table %s: %s (arch %d, driver %d), %d rows", path, t->gpu, (int)t->arch, (int)t->driver_major,
        (int)t->n_rows);
    const osp_kernel_target tg = {.arch = dev.arch, .head_dim = head_dim, .kv_dtype = kv_dtype};
    for (int k = 0; k < OSP_OP_COUNT; k++) {
        if (osp_kernel_choosable_count(device, (osp_op_kind)k) < 2) continue;
        osp_kernel_choice c = osp_kernel_table_choose(t, &dev, &tg, (osp_op_kind)k);
        if (!c.version) continue;
        char label[96];
        osp_kernel_label(c.version, label, sizeof label);
        const char *key = c.version->env_key;
        /* the variable of this kind's versions (the default may have none of its own) */
        for (int i = 0; !key && i < osp_kernel_registry_count(); i++) {
            const osp_kernel_version *v = osp_kernel_registry_at(i);
            if (v->device == device && v->kind == (osp_op_kind)k && v->env_key) key = v->env_key;
        }
        const char *user = key ? getenv(key) : NULL;
        if (user && user[0]) {
            say(log, ctx, "%s: %s=%s set in the environment: kept (the table would run %s: %s)", osp_op_name((osp_op_kind)k),
                key, user, label, c.why);
            continue;
        }
        const bool is_default = c.version == osp_kernel_default(device, (osp_op_kind)k, &tg);
        if (!c.from_table || is_default || !c.version->env_key) {
            say(log, ctx, "%s: %s, %s", osp_op_name((osp_op_kind)k), label, c.why);
            continue;
        }
        setenv(c.version->env_key, c.version->env_value, 1);
        if (device == OSP_DEVICE_CUDA && !strcmp(c.version->env_key, "OSPREY_CUDA_ATTENTION") &&
            !osp_backend_cuda_attention_env_honoured(why, sizeof why)) {
            unsetenv(c.version->env_key);
            const osp_kernel_version *d = osp_kernel_default(device, (osp_op_kind)k, &tg);
            say(log, ctx, "%s: the table's %s cannot be selected (%s): %s, the default", osp_op_name((osp_op_kind)k), label,
                why, d ? d->name : "?");
            continue;
        }
        say(log, ctx, "%s: %s, %s (%s=%s)", osp_op_name((osp_op_kind)k), label, c.why, c.version->env_key,
            c.version->env_value);
    }
    osp_kernel_table_free(t);
    return OSP_OK;
}
