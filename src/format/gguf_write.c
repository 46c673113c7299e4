/* GGUF v3 writer (include/osprey/gguf.h, "writer" section; format: ggml/docs/gguf.md).
 *
 * Metadata pairs are serialized into one growing byte buffer as they are added (so copies of the
 * caller's strings are never kept around), tensor infos into a small array. osp_gguf_writer_write()
 * then streams: header, metadata, infos, padding to the alignment, and each tensor's bytes, taken
 * from the caller's buffer or produced by its fill callback a chunk of rows at a time into one
 * bounded scratch buffer. That keeps a multi-GB random model's peak memory at a few MB.
 *
 * Everything is little-endian, as GGUF is and as every machine osprey runs on. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/status_internal.h"
#include "osprey/gguf.h"

enum {
    GGUF_VERSION = 3,
    GGUF_ALIGNMENT = 32,
    GGUF_MAX_NAME = 63,            /* GGML_MAX_NAME is 64 with the NUL */
    GGUF_MAX_DEPTH = 8,            /* nested arrays the reader accepts */
    CHUNK_BYTES = 4 << 20,         /* fill callbacks produce at most this much at a time (>= 1 row) */
};

typedef struct wtensor {
    char *name;      /* owned */
    uint32_t type;   /* ggml type id */
    uint32_t n_dims;
    int64_t ne[4];   /* unused dimensions are 1 */
    uint64_t nbytes; /* row_size(type, ne[0]) * ne[1] * ne[2] * ne[3] */
    uint64_t offset; /* in the data section, a multiple of the alignment */
    const void *data; /* borrowed, or NULL when fill is set */
    osp_gguf_fill_fn fill;
    void *user;
} wtensor;

struct osp_gguf_writer {
    uint8_t *kv;        /* [kv_len] serialized metadata pairs, in the order added */
    size_t kv_len, kv_cap;
    char **keys;        /* [n_kv] owned copies, for the duplicate check */
    uint64_t n_kv;
    size_t keys_cap;
    wtensor *tensors;   /* [n_tensors] */
    uint64_t n_tensors;
    size_t tensors_cap;
    uint64_t data_size; /* bytes of the data section so far (end of the last tensor, padded) */
};

/* ---- serialization buffer ---------------------------------------------------------------------- */

static bool kv_put(osp_gguf_writer *w, const void *src, size_t n) {
    if (n > SIZE_MAX - w->kv_len) return false;
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n) cap *= 2;
        uint8_t *p = realloc(w->kv, cap);
        if (!p) return false;
        w->kv = p;
        w->kv_cap = cap;
    }
    if (n) memcpy(w->kv + w->kv_len, src, n);
    w->kv_len += n;
    return true;
}
static bool kv_u32(osp_gguf_writer *w, uint32_t v) { return kv_put(w, &v, 4); }
static bool kv_u64(osp_gguf_writer *w, uint64_t v) { return kv_put(w, &v, 8); }
static bool kv_str(osp_gguf_writer *w, const char *s, uint64_t len) {
    return kv_u64(w, len) && kv_put(w, s, (size_t)len);
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case OSP_GGUF_TYPE_UINT8: case OSP_GGUF_TYPE_INT8: case OSP_GGUF_TYPE_BOOL: return 1;
    case OSP_GGUF_TYPE_UINT16: case OSP_GGUF_TYPE_INT16: return 2;
    case OSP_GGUF_TYPE_UINT32: case OSP_GGUF_TYPE_INT32: case OSP_GGUF_TYPE_FLOAT32: return 4;
    case OSP_GGUF_TYPE_UINT64: case OSP_GGUF_TYPE_INT64: case OSP_GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

/* Checks the key, then writes it; on success the caller writes the value. `mark` receives the buffer
 * length before the key so a failed value can be rolled back. */
static osp_status begin_kv(osp_gguf_writer *w, const char *key, size_t *mark) {
    if (!w || !key || !key[0]) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: NULL or empty key");
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: duplicate metadata key '%s'", key);
    if (w->n_kv == w->keys_cap) {
        size_t cap = w->keys_cap ? w->keys_cap * 2 : 32;
        char **k = realloc(w->keys, cap * sizeof *k);
        if (!k) return osp_set_error(OSP_ERR_NOMEM, "gguf writer: out of memory");
        w->keys = k;
        w->keys_cap = cap;
    }
    *mark = w->kv_len;
    if (!kv_str(w, key, strlen(key))) return osp_set_error(OSP_ERR_NOMEM, "gguf writer: out of memory");
    return OSP_OK;
}

/* Records the key once its value is serialized (ok), or rolls the buffer back to `mark`. */
static osp_status end_kv(osp_gguf_writer *w, const char *key, size_t mark, bool ok) {
    char *copy = ok ? strdup(key) : NULL;
    if (!copy) {
        w->kv_len = mark;
        return osp_set_error(OSP_ERR_NOMEM, "gguf writer: out of memory adding key '%s'", key);
    }
    w->keys[w->n_kv++] = copy;
    return OSP_OK;
}

static osp_status add_scalar(osp_gguf_writer *w, const char *key, uint32_t type, const void *v) {
    size_t mark;
    OSP_TRY(begin_kv(w, key, &mark));
    return end_kv(w, key, mark, kv_u32(w, type) && kv_put(w, v, scalar_size(type)));
}

osp_status osp_gguf_writer_add_u32(osp_gguf_writer *w, const char *key, uint32_t v) {
    return add_scalar(w, key, OSP_GGUF_TYPE_UINT32, &v);
}
osp_status osp_gguf_writer_add_i32(osp_gguf_writer *w, const char *key, int32_t v) {
    return add_scalar(w, key, OSP_GGUF_TYPE_INT32, &v);
}
osp_status osp_gguf_writer_add_f32(osp_gguf_writer *w, const char *key, float v) {
    return add_scalar(w, key, OSP_GGUF_TYPE_FLOAT32, &v);
}
osp_status osp_gguf_writer_add_bool(osp_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v ? 1 : 0;
    return add_scalar(w, key, OSP_GGUF_TYPE_BOOL, &b);
}

osp_status osp_gguf_writer_add_str(osp_gguf_writer *w, const char *key, const char *s) {
    if (!s) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: key '%s': NULL string", key ? key : "");
    size_t mark;
    OSP_TRY(begin_kv(w, key, &mark));
    return end_kv(w, key, mark, kv_u32(w, OSP_GGUF_TYPE_STRING) && kv_str(w, s, strlen(s)));
}

osp_status osp_gguf_writer_add_arr_str(osp_gguf_writer *w, const char *key, const char *const *strs,
                                       uint64_t n) {
    if (n && !strs) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: key '%s': NULL array", key ? key : "");
    for (uint64_t i = 0; i < n; i++)
        if (!strs[i])
            return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: key '%s': string %llu is NULL",
                                 key ? key : "", (unsigned long long)i);
    size_t mark;
    OSP_TRY(begin_kv(w, key, &mark));
    bool ok = kv_u32(w, OSP_GGUF_TYPE_ARRAY) && kv_u32(w, OSP_GGUF_TYPE_STRING) && kv_u64(w, n);
    for (uint64_t i = 0; ok && i < n; i++) ok = kv_str(w, strs[i], strlen(strs[i]));
    return end_kv(w, key, mark, ok);
}

static osp_status add_arr_fixed(osp_gguf_writer *w, const char *key, uint32_t et, const void *v, uint64_t n) {
    if (n && !v) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: key '%s': NULL array", key ? key : "");
    if (n > SIZE_MAX / 8) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: key '%s': array too long", key ? key : "");
    size_t mark;
    OSP_TRY(begin_kv(w, key, &mark));
    bool ok = kv_u32(w, OSP_GGUF_TYPE_ARRAY) && kv_u32(w, et) && kv_u64(w, n) &&
              kv_put(w, v, (size_t)n * scalar_size(et));
    return end_kv(w, key, mark, ok);
}

osp_status osp_gguf_writer_add_arr_i32(osp_gguf_writer *w, const char *key, const int32_t *v, uint64_t n) {
    return add_arr_fixed(w, key, OSP_GGUF_TYPE_INT32, v, n);
}
osp_status osp_gguf_writer_add_arr_f32(osp_gguf_writer *w, const char *key, const float *v, uint64_t n) {
    return add_arr_fixed(w, key, OSP_GGUF_TYPE_FLOAT32, v, n);
}

/* Serializes the body of v (without its type tag when `tagged` is false). Returns 0 on success,
 * 1 when out of memory, 2 for a malformed value. */
static int put_value(osp_gguf_writer *w, const osp_gguf_value *v, bool tagged, int depth) {
    const uint32_t t = (uint32_t)v->type;
    if (tagged && !kv_u32(w, t)) return 1;
    size_t ss = scalar_size(t);
    if (ss) {
        uint8_t b[8];
        switch (t) {
        case OSP_GGUF_TYPE_UINT8: case OSP_GGUF_TYPE_BOOL: b[0] = (uint8_t)v->v.u64; break;
        case OSP_GGUF_TYPE_INT8: b[0] = (uint8_t)(int8_t)v->v.i64; break;
        case OSP_GGUF_TYPE_UINT16: { uint16_t x = (uint16_t)v->v.u64; memcpy(b, &x, 2); break; }
        case OSP_GGUF_TYPE_INT16: { int16_t x = (int16_t)v->v.i64; memcpy(b, &x, 2); break; }
        case OSP_GGUF_TYPE_UINT32: { uint32_t x = (uint32_t)v->v.u64; memcpy(b, &x, 4); break; }
        case OSP_GGUF_TYPE_INT32: { int32_t x = (int32_t)v->v.i64; memcpy(b, &x, 4); break; }
        case OSP_GGUF_TYPE_FLOAT32: { float x = (float)v->v.f64; memcpy(b, &x, 4); break; }
        case OSP_GGUF_TYPE_UINT64: memcpy(b, &v->v.u64, 8); break;
        case OSP_GGUF_TYPE_INT64: memcpy(b, &v->v.i64, 8); break;
        default: memcpy(b, &v->v.f64, 8); break; /* FLOAT64 */
        }
        return kv_put(w, b, ss) ? 0 : 1;
    }
    if (t == OSP_GGUF_TYPE_STRING) {
        if (v->v.str.len && !v->v.str.data) return 2;
        return kv_str(w, v->v.str.data, v->v.str.len) ? 0 : 1;
    }
    if (t != OSP_GGUF_TYPE_ARRAY || depth >= GGUF_MAX_DEPTH) return 2;
    const uint32_t et = (uint32_t)v->v.arr.elem_type;
    const uint64_t n = v->v.arr.n;
    if (!kv_u32(w, et) || !kv_u64(w, n)) return 1;
    size_t es = scalar_size(et);
    if (es) {
        if (n && !v->v.arr.raw) return 2;
        if (n > SIZE_MAX / es) return 2;
        return kv_put(w, v->v.arr.raw, (size_t)n * es) ? 0 : 1;
    }
    if (et == OSP_GGUF_TYPE_STRING) {
        if (n && !v->v.arr.strs) return 2;
        for (uint64_t i = 0; i < n; i++) {
            const osp_gguf_str *s = &v->v.arr.strs[i];
            if (s->len && !s->data) return 2;
            if (!kv_str(w, s->data, s->len)) return 1;
        }
        return 0;
    }
    if (et != OSP_GGUF_TYPE_ARRAY || (n && !v->v.arr.elems)) return 2;
    for (uint64_t i = 0; i < n; i++) {
        if (v->v.arr.elems[i].type != OSP_GGUF_TYPE_ARRAY) return 2;
        int r = put_value(w, &v->v.arr.elems[i], false, depth + 1); /* nested: no type tag */
        if (r) return r;
    }
    return 0;
}

osp_status osp_gguf_writer_add_value(osp_gguf_writer *w, const char *key, const osp_gguf_value *v) {
    if (!v) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: key '%s': NULL value", key ? key : "");
    size_t mark;
    OSP_TRY(begin_kv(w, key, &mark));
    int r = put_value(w, v, true, 0);
    if (r == 2) {
        w->kv_len = mark;
        return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: key '%s': malformed value (type %u)", key,
                             (unsigned)v->type);
    }
    return end_kv(w, key, mark, r == 0);
}

/* ---- lifecycle --------------------------------------------------------------------------------- */

osp_status osp_gguf_writer_create(osp_gguf_writer **out) {
    if (!out) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: out is NULL");
    *out = NULL;
    osp_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return osp_set_error(OSP_ERR_NOMEM, "gguf writer: out of memory");
    osp_status s = osp_gguf_writer_add_u32(w, "general.alignment", GGUF_ALIGNMENT);
    if (s != OSP_OK) {
        osp_gguf_writer_free(w);
        return s;
    }
    *out = w;
    return OSP_OK;
}

void osp_gguf_writer_free(osp_gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (uint64_t i = 0; i < w->n_tensors; i++) free(w->tensors[i].name);
    free(w->keys);
    free(w->tensors);
    free(w->kv);
    free(w);
}

/* ---- tensors ----------------------------------------------------------------------------------- */

static uint64_t align_up(uint64_t x) { return (x + GGUF_ALIGNMENT - 1) / GGUF_ALIGNMENT * GGUF_ALIGNMENT; }

osp_status osp_gguf_writer_add_tensor(osp_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                      const int64_t *ne, const void *data, osp_gguf_fill_fn fill,
                                      void *user) {
    if (!w || !name || !ne) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: NULL argument");
    const size_t len = strlen(name);
    if (len == 0 || len > GGUF_MAX_NAME)
        return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: tensor name '%s' must have 1..%d bytes", name,
                             GGUF_MAX_NAME);
    if ((data == NULL) == (fill == NULL))
        return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: tensor '%s': give exactly one of data and fill", name);
    if (n_dims < 1 || n_dims > 4)
        return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: tensor '%s': n_dims %u not in [1, 4]", name, n_dims);
    const int64_t bs = osp_dtype_block_size(type);
    if (bs == 0 || osp_dtype_type_size(type) == 0)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "gguf writer: tensor '%s': unknown ggml type %u", name, type);
    wtensor t = {.type = type, .n_dims = n_dims, .ne = {1, 1, 1, 1}, .data = data, .fill = fill, .user = user};
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1 || (uint64_t)ne[d] > (UINT64_MAX >> 2) / nelem)
            return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: tensor '%s': ne[%u] = %lld is out of range",
                                 name, d, (long long)ne[d]);
        t.ne[d] = ne[d];
        nelem *= (uint64_t)ne[d];
    }
    if (t.ne[0] % bs != 0)
        return osp_set_error(OSP_ERR_INVALID_ARG,
                             "gguf writer: tensor '%s': ne[0] = %lld is not a multiple of the %s block size %lld",
                             name, (long long)t.ne[0], osp_dtype_name(type), (long long)bs);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: duplicate tensor name '%s'", name);
    t.nbytes = nelem / (uint64_t)bs * osp_dtype_type_size(type);
    t.offset = w->data_size;
    if (w->n_tensors == w->tensors_cap) {
        size_t cap = w->tensors_cap ? w->tensors_cap * 2 : 64;
        wtensor *p = realloc(w->tensors, cap * sizeof *p);
        if (!p) return osp_set_error(OSP_ERR_NOMEM, "gguf writer: out of memory");
        w->tensors = p;
        w->tensors_cap = cap;
    }
    t.name = strdup(name);
    if (!t.name) return osp_set_error(OSP_ERR_NOMEM, "gguf writer: out of memory");
    w->tensors[w->n_tensors++] = t;
    w->data_size = align_up(t.offset + t.nbytes);
    return OSP_OK;
}

/* ---- writing ----------------------------------------------------------------------------------- */

typedef struct sink {
    FILE *f;
    const char *path; /* for messages */
    uint64_t pos;     /* bytes written so far */
} sink;

static osp_status sink_put(sink *s, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, s->f) != n)
        return osp_set_error(OSP_ERR_IO, "%s: write failed: %s", s->path, strerror(errno));
    s->pos += n;
    return OSP_OK;
}
static osp_status sink_pad(sink *s) {
    static const uint8_t zeros[GGUF_ALIGNMENT];
    return sink_put(s, zeros, (size_t)(align_up(s->pos) - s->pos));
}

static osp_status write_tensor_data(sink *s, const wtensor *t, uint8_t **scratch) {
    if (t->data) return sink_put(s, t->data, (size_t)t->nbytes);
    const size_t row = osp_dtype_row_size(t->type, t->ne[0]);
    const int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
    int64_t per = (int64_t)(CHUNK_BYTES / row);
    if (per < 1) per = 1;
    if (per > rows) per = rows;
    uint8_t *buf = malloc((size_t)per * row);
    if (!buf) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory for tensor '%s'", s->path, t->name);
    *scratch = buf;
    for (int64_t r = 0; r < rows; r += per) {
        const int64_t n = rows - r < per ? rows - r : per;
        OSP_TRY(t->fill(t->user, r, n, buf));
        OSP_TRY(sink_put(s, buf, (size_t)n * row));
    }
    return OSP_OK;
}

static osp_status write_all(const osp_gguf_writer *w, sink *s) {
    const uint32_t magic_version[2] = {0x46554747u /* "GGUF" */, GGUF_VERSION};
    OSP_TRY(sink_put(s, magic_version, 8));
    OSP_TRY(sink_put(s, &w->n_tensors, 8));
    OSP_TRY(sink_put(s, &w->n_kv, 8));
    OSP_TRY(sink_put(s, w->kv, w->kv_len));
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        const uint64_t len = strlen(t->name);
        OSP_TRY(sink_put(s, &len, 8));
        OSP_TRY(sink_put(s, t->name, (size_t)len));
        OSP_TRY(sink_put(s, &t->n_dims, 4));
        for (uint32_t d = 0; d < t->n_dims; d++) {
            const uint64_t x = (uint64_t)t->ne[d];
            OSP_TRY(sink_put(s, &x, 8));
        }
        OSP_TRY(sink_put(s, &t->type, 4));
        OSP_TRY(sink_put(s, &t->offset, 8));
    }
    OSP_TRY(sink_pad(s));
    const uint64_t data_start = s->pos;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        if (s->pos - data_start != t->offset)
            return osp_set_error(OSP_ERR_INTERNAL, "%s: tensor '%s' lands at %llu, expected %llu", s->path, t->name,
                                 (unsigned long long)(s->pos - data_start), (unsigned long long)t->offset);
        uint8_t *scratch = NULL;
        osp_status st = write_tensor_data(s, t, &scratch);
        free(scratch);
        if (st != OSP_OK) return st;
        OSP_TRY(sink_pad(s));
    }
    return OSP_OK;
}

osp_status osp_gguf_writer_write(osp_gguf_writer *w, const char *path) {
    if (!w || !path || !path[0]) return osp_set_error(OSP_ERR_INVALID_ARG, "gguf writer: NULL or empty path");
    const size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return osp_set_error(OSP_ERR_NOMEM, "gguf writer: out of memory");
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    osp_status st = OSP_OK;
    sink s = {.f = fopen(tmp, "wb"), .path = tmp};
    if (!s.f) {
        st = osp_set_error(OSP_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    setvbuf(s.f, NULL, _IOFBF, 1 << 20);
    st = write_all(w, &s);
    if (fclose(s.f) != 0 && st == OSP_OK) st = osp_set_error(OSP_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    if (st == OSP_OK && rename(tmp, path) != 0)
        st = osp_set_error(OSP_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (st != OSP_OK) unlink(tmp);
done:
    free(tmp);
    return st;
}
