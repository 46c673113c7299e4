/* GGUF reader: parses the header, metadata and tensor infos of a GGUF v2/v3 file mapped read-only,
 * checking every count, length and offset against the bytes that are actually there.
 *
 * Spec: ggml/docs/gguf.md ("GGUF" magic, u32 version, u64 n_tensors, u64 n_kv, kv pairs, tensor
 * infos, alignment padding, data). The parser is a cursor over [base, base + size): every read goes
 * through cur_need(), which fails with OSP_ERR_FORMAT naming the field instead of reading past the
 * end. Counts are also bounded by the bytes left (each element needs at least one byte), so a hostile
 * header cannot make us allocate terabytes. Nested arrays are limited in depth. */
#include "osprey/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/status_internal.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DEPTH 8
#define GGUF_MAX_DIMS 4

struct osp_gguf {
    char *path;           /* owned copy, for messages */
    const uint8_t *base;  /* the mapping (or caller buffer) */
    size_t size;          /* bytes in the mapping */
    bool mapped;          /* true: munmap on close */
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* file offset of the tensor data section */
    uint64_t n_kv;
    osp_gguf_kv *kvs;     /* [n_kv] */
    uint64_t n_tensors;
    osp_gguf_tensor *tensors; /* [n_tensors] */
    /* Owned allocations made while parsing values (string and nested arrays), freed on close. */
    void **allocs;
    size_t n_allocs, cap_allocs;
};

/* ---- cursor ------------------------------------------------------------------------------------ */

typedef struct cursor {
    osp_gguf *g;
    size_t pos;
} cursor;

static osp_status cur_need(cursor *c, uint64_t n, const char *what) {
    if (n > c->g->size - c->pos)
        return osp_set_error(OSP_ERR_FORMAT,
                             "%s: truncated file: %s needs %" PRIu64 " bytes at offset %zu, %zu left",
                             c->g->path, what, n, c->pos, c->g->size - c->pos);
    return OSP_OK;
}

static osp_status cur_read(cursor *c, void *dst, size_t n, const char *what) {
    OSP_TRY(cur_need(c, n, what));
    memcpy(dst, c->g->base + c->pos, n);
    c->pos += n;
    return OSP_OK;
}

static osp_status cur_u32(cursor *c, uint32_t *v, const char *what) { return cur_read(c, v, 4, what); }
static osp_status cur_u64(cursor *c, uint64_t *v, const char *what) { return cur_read(c, v, 8, what); }

static osp_status cur_str(cursor *c, osp_gguf_str *s, const char *what) {
    uint64_t len;
    OSP_TRY(cur_u64(c, &len, what));
    OSP_TRY(cur_need(c, len, what));
    s->data = (const char *)c->g->base + c->pos;
    s->len = len;
    c->pos += len;
    return OSP_OK;
}

static void *g_track(osp_gguf *g, void *p) {
    if (!p) return NULL;
    if (g->n_allocs == g->cap_allocs) {
        size_t cap = g->cap_allocs ? g->cap_allocs * 2 : 64;
        void **na = realloc(g->allocs, cap * sizeof *na);
        if (!na) {
            free(p);
            return NULL;
        }
        g->allocs = na;
        g->cap_allocs = cap;
    }
    g->allocs[g->n_allocs++] = p;
    return p;
}

static char *g_strdup(osp_gguf *g, const osp_gguf_str *s) {
    char *p = malloc(s->len + 1);
    if (!p) return NULL;
    memcpy(p, s->data, s->len);
    p[s->len] = '\0';
    return g_track(g, p);
}

/* ---- values ------------------------------------------------------------------------------------ */

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case OSP_GGUF_TYPE_UINT8: case OSP_GGUF_TYPE_INT8: case OSP_GGUF_TYPE_BOOL: return 1;
    case OSP_GGUF_TYPE_UINT16: case OSP_GGUF_TYPE_INT16: return 2;
    case OSP_GGUF_TYPE_UINT32: case OSP_GGUF_TYPE_INT32: case OSP_GGUF_TYPE_FLOAT32: return 4;
    case OSP_GGUF_TYPE_UINT64: case OSP_GGUF_TYPE_INT64: case OSP_GGUF_TYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *osp_gguf_type_name(osp_gguf_type t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                  "bool", "str", "arr", "u64", "i64", "f64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* Decodes a little-endian scalar of type t at p into v. */
static void decode_scalar(uint32_t t, const uint8_t *p, osp_gguf_value *v) {
    v->type = (osp_gguf_type)t;
    switch (t) {
    case OSP_GGUF_TYPE_UINT8: v->v.u64 = p[0]; break;
    case OSP_GGUF_TYPE_BOOL: v->v.u64 = p[0] != 0; break;
    case OSP_GGUF_TYPE_INT8: v->v.i64 = (int8_t)p[0]; break;
    case OSP_GGUF_TYPE_UINT16: { uint16_t x; memcpy(&x, p, 2); v->v.u64 = x; break; }
    case OSP_GGUF_TYPE_INT16: { int16_t x; memcpy(&x, p, 2); v->v.i64 = x; break; }
    case OSP_GGUF_TYPE_UINT32: { uint32_t x; memcpy(&x, p, 4); v->v.u64 = x; break; }
    case OSP_GGUF_TYPE_INT32: { int32_t x; memcpy(&x, p, 4); v->v.i64 = x; break; }
    case OSP_GGUF_TYPE_FLOAT32: { float x; memcpy(&x, p, 4); v->v.f64 = x; break; }
    case OSP_GGUF_TYPE_UINT64: { uint64_t x; memcpy(&x, p, 8); v->v.u64 = x; break; }
    case OSP_GGUF_TYPE_INT64: { int64_t x; memcpy(&x, p, 8); v->v.i64 = x; break; }
    case OSP_GGUF_TYPE_FLOAT64: { double x; memcpy(&x, p, 8); v->v.f64 = x; break; }
    default: break;
    }
}

static osp_status read_value(cursor *c, uint32_t type, osp_gguf_value *v, const char *key, int depth) {
    osp_gguf *g = c->g;
    memset(v, 0, sizeof *v);
    size_t ss = scalar_size(type);
    if (ss) {
        OSP_TRY(cur_need(c, ss, key));
        decode_scalar(type, g->base + c->pos, v);
        c->pos += ss;
        return OSP_OK;
    }
    if (type == OSP_GGUF_TYPE_STRING) {
        v->type = OSP_GGUF_TYPE_STRING;
        return cur_str(c, &v->v.str, key);
    }
    if (type != OSP_GGUF_TYPE_ARRAY)
        return osp_set_error(OSP_ERR_FORMAT, "%s: key '%s': unknown value type %u", g->path, key, type);
    if (depth >= GGUF_MAX_DEPTH)
        return osp_set_error(OSP_ERR_FORMAT, "%s: key '%s': arrays nested deeper than %d", g->path,
                             key, GGUF_MAX_DEPTH);
    uint32_t et;
    uint64_t n;
    OSP_TRY(cur_u32(c, &et, key));
    OSP_TRY(cur_u64(c, &n, key));
    v->type = OSP_GGUF_TYPE_ARRAY;
    v->v.arr.elem_type = (osp_gguf_type)et;
    v->v.arr.n = n;
    size_t es = scalar_size(et);
    if (es) {
        if (n > (g->size - c->pos) / es)
            return osp_set_error(OSP_ERR_FORMAT,
                                 "%s: truncated or corrupt: key '%s': array of %" PRIu64 " %s runs past the end of the file",
                                 g->path, key, n, osp_gguf_type_name((osp_gguf_type)et));
        v->v.arr.raw = g->base + c->pos;
        c->pos += n * es;
        return OSP_OK;
    }
    /* Strings need >= 8 bytes each, arrays >= 12: bound n before allocating. */
    uint64_t min_elem = et == OSP_GGUF_TYPE_STRING ? 8 : 12;
    if (et != OSP_GGUF_TYPE_STRING && et != OSP_GGUF_TYPE_ARRAY)
        return osp_set_error(OSP_ERR_FORMAT, "%s: key '%s': unknown array element type %u", g->path,
                             key, et);
    if (n > (g->size - c->pos) / min_elem)
        return osp_set_error(OSP_ERR_FORMAT,
                             "%s: truncated or corrupt: key '%s': array count %" PRIu64 " needs more bytes than the file holds",
                             g->path, key, n);
    if (et == OSP_GGUF_TYPE_STRING) {
        osp_gguf_str *strs = g_track(g, calloc(n ? n : 1, sizeof *strs));
        if (!strs) return osp_set_error(OSP_ERR_NOMEM, "%s: key '%s': out of memory", g->path, key);
        v->v.arr.strs = strs;
        for (uint64_t i = 0; i < n; i++) OSP_TRY(cur_str(c, &strs[i], key));
        return OSP_OK;
    }
    osp_gguf_value *elems = g_track(g, calloc(n ? n : 1, sizeof *elems));
    if (!elems) return osp_set_error(OSP_ERR_NOMEM, "%s: key '%s': out of memory", g->path, key);
    v->v.arr.elems = elems;
    for (uint64_t i = 0; i < n; i++) {
        /* Nested arrays carry their own element type and count. */
        OSP_TRY(read_value(c, OSP_GGUF_TYPE_ARRAY, &elems[i], key, depth + 1));
    }
    return OSP_OK;
}

/* ---- open / close ------------------------------------------------------------------------------ */

static osp_status parse(osp_gguf *g) {
    cursor c = {g, 0};
    char magic[4];
    if (g->size == 0) return osp_set_error(OSP_ERR_IO, "%s: file is empty", g->path);
    OSP_TRY(cur_read(&c, magic, 4, "magic"));
    if (memcmp(magic, "GGUF", 4) != 0)
        return osp_set_error(OSP_ERR_FORMAT, "%s: not a GGUF file (magic is not \"GGUF\")", g->path);
    OSP_TRY(cur_u32(&c, &g->version, "version"));
    if (g->version != 2 && g->version != 3)
        return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)",
                             g->path, g->version);
    OSP_TRY(cur_u64(&c, &g->n_tensors, "tensor_count"));
    OSP_TRY(cur_u64(&c, &g->n_kv, "metadata_kv_count"));
    /* A kv needs >= 8 (key length) + 4 (type) + 1 bytes; a tensor info >= 8 + 4 + 8 + 4 + 8. */
    if (g->n_kv > (g->size - c.pos) / 13)
        return osp_set_error(OSP_ERR_FORMAT, "%s: truncated or corrupt: metadata_kv_count %" PRIu64 " needs more bytes than the file holds",
                             g->path, g->n_kv);
    if (g->n_tensors > (g->size - c.pos) / 32)
        return osp_set_error(OSP_ERR_FORMAT, "%s: truncated or corrupt: tensor_count %" PRIu64 " needs more bytes than the file holds",
                             g->path, g->n_tensors);
    g->kvs = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kvs);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", g->path);

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        osp_gguf_str key;
        uint32_t type;
        char what[64];
        snprintf(what, sizeof what, "key of metadata pair %" PRIu64, i);
        OSP_TRY(cur_str(&c, &key, what));
        char *k = g_strdup(g, &key);
        if (!k) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", g->path);
        if (strlen(k) != key.len)
            return osp_set_error(OSP_ERR_FORMAT, "%s: metadata key %" PRIu64 " contains a NUL byte",
                                 g->path, i);
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->kvs[j].key, k) == 0)
                return osp_set_error(OSP_ERR_FORMAT, "%s: duplicate metadata key '%s'", g->path, k);
        g->kvs[i].key = k;
        OSP_TRY(cur_u32(&c, &type, k));
        OSP_TRY(read_value(&c, type, &g->kvs[i].value, k, 0));
    }
    const osp_gguf_kv *al = osp_gguf_find(g, "general.alignment");
    if (al) {
        if (al->value.type != OSP_GGUF_TYPE_UINT32)
            return osp_set_error(OSP_ERR_FORMAT, "%s: general.alignment must be u32, is %s", g->path,
                                 osp_gguf_type_name(al->value.type));
        uint64_t a = al->value.v.u64;
        if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 20))
            return osp_set_error(OSP_ERR_FORMAT, "%s: general.alignment %" PRIu64
                                 " is not a power of two in [1, 2^20]", g->path, a);
        g->alignment = (uint32_t)a;
    }

    for (uint64_t i = 0; i < g->n_tensors; i++) {
        osp_gguf_tensor *t = &g->tensors[i];
        osp_gguf_str name;
        char what[64];
        snprintf(what, sizeof what, "name of tensor %" PRIu64, i);
        OSP_TRY(cur_str(&c, &name, what));
        char *nm = g_strdup(g, &name);
        if (!nm) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", g->path);
        t->name = nm;
        OSP_TRY(cur_u32(&c, &t->n_dims, nm));
        if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
            return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s': n_dims %u not in [1, %d]", g->path,
                                 nm, t->n_dims, GGUF_MAX_DIMS);
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            OSP_TRY(cur_u64(&c, &ne, nm));
            if (ne > INT64_MAX || (ne != 0 && nel > (uint64_t)INT64_MAX / ne))
                return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s': dimension %u (%" PRIu64
                                     ") overflows the element count", g->path, nm, d, ne);
            t->ne[d] = (int64_t)ne;
            nel *= ne;
        }
        OSP_TRY(cur_u32(&c, &t->type, nm));
        OSP_TRY(cur_u64(&c, &t->offset, nm));
        const char *tn = osp_dtype_name(t->type);
        if (!tn)
            return osp_set_error(OSP_ERR_UNSUPPORTED, "%s: tensor '%s': unknown tensor type %u",
                                 g->path, nm, t->type);
        int64_t bs = osp_dtype_block_size(t->type);
        if (t->ne[0] % bs != 0)
            return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s': ne[0]=%" PRId64
                                 " is not a multiple of the %s block size %" PRId64, g->path, nm,
                                 t->ne[0], tn, bs);
        uint64_t nblocks = nel / (uint64_t)bs;
        size_t ts = osp_dtype_type_size(t->type);
        if (nblocks > UINT64_MAX / ts)
            return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s': size overflows", g->path, nm);
        t->nbytes = nblocks * ts;
        if (t->offset % g->alignment != 0)
            return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s': offset %" PRIu64
                                 " is not a multiple of the alignment %u", g->path, nm, t->offset,
                                 g->alignment);
        for (uint64_t j = 0; j < i; j++)
            if (strcmp(g->tensors[j].name, nm) == 0)
                return osp_set_error(OSP_ERR_FORMAT, "%s: duplicate tensor name '%s'", g->path, nm);
    }

    uint64_t data = ((uint64_t)c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (g->n_tensors > 0 && data > g->size)
        return osp_set_error(OSP_ERR_FORMAT, "%s: truncated file: tensor data section at offset %" PRIu64
                             " starts past the end (%zu bytes)", g->path, data, g->size);
    g->data_offset = data;
    uint64_t avail = g->size > data ? g->size - data : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        osp_gguf_tensor *t = &g->tensors[i];
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return osp_set_error(OSP_ERR_FORMAT, "%s: tensor '%s': data [%" PRIu64 ", +%" PRIu64
                                 ") runs past the end of the file (data section holds %" PRIu64 " bytes)",
                                 g->path, t->name, t->offset, t->nbytes, avail);
        t->data = g->base + data + t->offset;
    }
    /* Tensor data must not overlap: sort offsets (insertion order is usually sorted already). */
    if (g->n_tensors > 1) {
        uint64_t *idx = malloc(g->n_tensors * sizeof *idx);
        if (!idx) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", g->path);
        for (uint64_t i = 0; i < g->n_tensors; i++) idx[i] = i;
        /* Shell sort by offset: O(n^1.3), no recursion. */
        for (uint64_t gap = g->n_tensors / 2; gap > 0; gap /= 2)
            for (uint64_t i = gap; i < g->n_tensors; i++) {
                uint64_t tmp = idx[i], j = i;
                while (j >= gap && g->tensors[idx[j - gap]].offset > g->tensors[tmp].offset) {
                    idx[j] = idx[j - gap];
                    j -= gap;
                }
                idx[j] = tmp;
            }
        osp_status s = OSP_OK;
        for (uint64_t i = 1; i < g->n_tensors; i++) {
            const osp_gguf_tensor *a = &g->tensors[idx[i - 1]], *b = &g->tensors[idx[i]];
            if (a->nbytes > 0 && b->nbytes > 0 && a->offset + a->nbytes > b->offset) {
                s = osp_set_error(OSP_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", g->path,
                                  a->name, b->name);
                break;
            }
        }
        free(idx);
        if (s != OSP_OK) return s;
    }
    return OSP_OK;
}

static osp_status make_handle(const char *name, osp_gguf **out) {
    *out = NULL;
    osp_gguf *g = calloc(1, sizeof *g);
    if (!g) return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", name);
    g->path = strdup(name ? name : "<memory>");
    if (!g->path) {
        free(g);
        return osp_set_error(OSP_ERR_NOMEM, "%s: out of memory", name);
    }
    *out = g;
    return OSP_OK;
}

osp_status osp_gguf_open_memory(const void *data, size_t size, const char *name, osp_gguf **out) {
    if (!out) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_gguf_open_memory: out is NULL");
    osp_gguf *g;
    OSP_TRY(make_handle(name, &g));
    g->base = data;
    g->size = data ? size : 0;
    osp_status s = parse(g);
    if (s != OSP_OK) {
        osp_gguf_close(g);
        return s;
    }
    *out = g;
    return OSP_OK;
}

osp_status osp_gguf_open(const char *path, osp_gguf **out) {
    if (!out || !path) return osp_set_error(OSP_ERR_INVALID_ARG, "osp_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return osp_set_error(OSP_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        osp_status s = osp_set_error(OSP_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return osp_set_error(OSP_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return osp_set_error(OSP_ERR_IO, "%s: file is empty", path);
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return osp_set_error(OSP_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
#ifdef MADV_HUGEPAGE
    /* a hint: where the file is not cached yet, the kernel may read it into 2 MB page-cache folios and map
     * them with 2 MB pages (fewer TLB misses when decode streams the weights: bench/cpu/NOTES.md, twelfth
     * pass); a file already cached in small folios stays as it is. Failure changes nothing. */
    (void)madvise(p, (size_t)st.st_size, MADV_HUGEPAGE);
#endif
    osp_gguf *g;
    osp_status s = make_handle(path, &g);
    if (s != OSP_OK) {
        munmap(p, (size_t)st.st_size);
        return s;
    }
    g->base = p;
    g->size = (size_t)st.st_size;
    g->mapped = true;
    s = parse(g);
    if (s != OSP_OK) {
        osp_gguf_close(g);
        return s;
    }
    *out = g;
    return OSP_OK;
}

void osp_gguf_advise_copy_out(osp_gguf *g) {
#ifdef MADV_NOHUGEPAGE
    if (g && g->mapped && g->base) (void)madvise((void *)g->base, g->size, MADV_NOHUGEPAGE);
#else
    (void)g;
#endif
}

void osp_gguf_close(osp_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_allocs; i++) free(g->allocs[i]);
    free(g->allocs);
    free(g->kvs);
    free(g->tensors);
    if (g->mapped && g->base) munmap((void *)g->base, g->size);
    free(g->path);
    free(g);
}

/* ---- accessors --------------------------------------------------------------------------------- */

uint32_t osp_gguf_version(const osp_gguf *g) { return g->version; }
const char *osp_gguf_path(const osp_gguf *g) { return g->path; }
uint32_t osp_gguf_alignment(const osp_gguf *g) { return g->alignment; }
uint64_t osp_gguf_data_offset(const osp_gguf *g) { return g->data_offset; }
uint64_t osp_gguf_n_kv(const osp_gguf *g) { return g->n_kv; }
uint64_t osp_gguf_n_tensors(const osp_gguf *g) { return g->n_tensors; }

const osp_gguf_kv *osp_gguf_kv_at(const osp_gguf *g, uint64_t i) {
    return i < g->n_kv ? &g->kvs[i] : NULL;
}

const osp_gguf_tensor *osp_gguf_tensor_at(const osp_gguf *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const osp_gguf_kv *osp_gguf_find(const osp_gguf *g, const char *key) {
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kvs[i].key && strcmp(g->kvs[i].key, key) == 0) return &g->kvs[i];
    return NULL;
}

const osp_gguf_tensor *osp_gguf_find_tensor(const osp_gguf *g, const char *name) {
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}

static osp_status find_typed(const osp_gguf *g, const char *key, const osp_gguf_kv **kv) {
    *kv = osp_gguf_find(g, key);
    if (!*kv) return osp_set_error(OSP_ERR_NOT_FOUND, "%s: metadata key '%s' is missing", g->path, key);
    return OSP_OK;
}

static bool is_unsigned(osp_gguf_type t) {
    return t == OSP_GGUF_TYPE_UINT8 || t == OSP_GGUF_TYPE_UINT16 || t == OSP_GGUF_TYPE_UINT32 ||
           t == OSP_GGUF_TYPE_UINT64;
}
static bool is_signed(osp_gguf_type t) {
    return t == OSP_GGUF_TYPE_INT8 || t == OSP_GGUF_TYPE_INT16 || t == OSP_GGUF_TYPE_INT32 ||
           t == OSP_GGUF_TYPE_INT64;
}

osp_status osp_gguf_get_i64(const osp_gguf *g, const char *key, int64_t *out) {
    const osp_gguf_kv *kv;
    OSP_TRY(find_typed(g, key, &kv));
    if (is_signed(kv->value.type)) {
        *out = kv->value.v.i64;
        return OSP_OK;
    }
    if (is_unsigned(kv->value.type) && kv->value.v.u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)kv->value.v.u64;
        return OSP_OK;
    }
    return osp_set_error(OSP_ERR_FORMAT, "%s: metadata key '%s' is %s, expected an integer", g->path,
                         key, osp_gguf_type_name(kv->value.type));
}

osp_status osp_gguf_get_u32(const osp_gguf *g, const char *key, uint32_t *out) {
    int64_t v;
    OSP_TRY(osp_gguf_get_i64(g, key, &v));
    if (v < 0 || v > (int64_t)UINT32_MAX)
        return osp_set_error(OSP_ERR_FORMAT, "%s: metadata key '%s' = %" PRId64 " is out of range",
                             g->path, key, v);
    *out = (uint32_t)v;
    return OSP_OK;
}

osp_status osp_gguf_get_f32(const osp_gguf *g, const char *key, float *out) {
    const osp_gguf_kv *kv;
    OSP_TRY(find_typed(g, key, &kv));
    if (kv->value.type == OSP_GGUF_TYPE_FLOAT32 || kv->value.type == OSP_GGUF_TYPE_FLOAT64) {
        *out = (float)kv->value.v.f64;
        return OSP_OK;
    }
    return osp_set_error(OSP_ERR_FORMAT, "%s: metadata key '%s' is %s, expected a float", g->path, key,
                         osp_gguf_type_name(kv->value.type));
}

osp_status osp_gguf_get_bool(const osp_gguf *g, const char *key, bool *out) {
    const osp_gguf_kv *kv;
    OSP_TRY(find_typed(g, key, &kv));
    if (kv->value.type != OSP_GGUF_TYPE_BOOL)
        return osp_set_error(OSP_ERR_FORMAT, "%s: metadata key '%s' is %s, expected bool", g->path, key,
                             osp_gguf_type_name(kv->value.type));
    *out = kv->value.v.u64 != 0;
    return OSP_OK;
}

osp_status osp_gguf_get_str(const osp_gguf *g, const char *key, osp_gguf_str *out) {
    const osp_gguf_kv *kv;
    OSP_TRY(find_typed(g, key, &kv));
    if (kv->value.type != OSP_GGUF_TYPE_STRING)
        return osp_set_error(OSP_ERR_FORMAT, "%s: metadata key '%s' is %s, expected a string", g->path,
                             key, osp_gguf_type_name(kv->value.type));
    *out = kv->value.v.str;
    return OSP_OK;
}

osp_status osp_gguf_get_arr(const osp_gguf *g, const char *key, int elem_type,
                            const osp_gguf_value **out) {
    const osp_gguf_kv *kv;
    OSP_TRY(find_typed(g, key, &kv));
    if (kv->value.type != OSP_GGUF_TYPE_ARRAY)
        return osp_set_error(OSP_ERR_FORMAT, "%s: metadata key '%s' is %s, expected an array", g->path,
                             key, osp_gguf_type_name(kv->value.type));
    if (elem_type >= 0 && (int)kv->value.v.arr.elem_type != elem_type)
        return osp_set_error(OSP_ERR_FORMAT, "%s: metadata key '%s' is an array of %s, expected %s",
                             g->path, key, osp_gguf_type_name(kv->value.v.arr.elem_type),
                             osp_gguf_type_name((osp_gguf_type)elem_type));
    *out = &kv->value;
    return OSP_OK;
}

int64_t osp_gguf_arr_i64(const osp_gguf_value *arr, uint64_t i) {
    osp_gguf_value v = {0};
    uint32_t t = arr->v.arr.elem_type;
    size_t es = scalar_size(t);
    if (!es || !arr->v.arr.raw) return 0;
    decode_scalar(t, arr->v.arr.raw + i * es, &v);
    if (t == OSP_GGUF_TYPE_FLOAT32 || t == OSP_GGUF_TYPE_FLOAT64) {
        /* Converting an out-of-range double (or NaN) to int64 is undefined: saturate instead. */
        double d = v.v.f64;
        if (d != d) return 0;
        if (d >= 9223372036854775807.0) return INT64_MAX;
        if (d <= -9223372036854775808.0) return INT64_MIN;
        return (int64_t)d;
    }
    return is_signed((osp_gguf_type)t) ? v.v.i64 : (int64_t)v.v.u64;
}

double osp_gguf_arr_f64(const osp_gguf_value *arr, uint64_t i) {
    osp_gguf_value v = {0};
    uint32_t t = arr->v.arr.elem_type;
    size_t es = scalar_size(t);
    if (!es || !arr->v.arr.raw) return 0;
    decode_scalar(t, arr->v.arr.raw + i * es, &v);
    if (t == OSP_GGUF_TYPE_FLOAT32 || t == OSP_GGUF_TYPE_FLOAT64) return v.v.f64;
    return is_signed((osp_gguf_type)t) ? (double)v.v.i64 : (double)v.v.u64;
}
