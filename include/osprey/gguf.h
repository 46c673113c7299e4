/* GGUF reader (versions 2 and 3) over a read-only mmap.
 *
 * Format: ggml/docs/gguf.md. A file is: magic "GGUF", u32 version, u64 tensor count, u64 metadata
 * count, the metadata key/value pairs, the tensor infos (name, n_dims, ne[n_dims], type, offset),
 * padding to `general.alignment` (default 32), then the tensor data section. All integers are
 * little-endian. Every count, length, offset and size is checked against the file before it is used;
 * a malformed file gives OSP_ERR_FORMAT and a message naming the file and the field, never a crash.
 *
 * Strings in the file are not NUL-terminated; the reader copies keys and tensor names into owned,
 * NUL-terminated storage, and exposes string values as (pointer, length) views into the mapping,
 * valid until osp_gguf_close(). */
#ifndef OSPREY_GGUF_H
#define OSPREY_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct osp_gguf osp_gguf;

/* Metadata value types, as numbered by the GGUF spec. */
typedef enum osp_gguf_type {
    OSP_GGUF_TYPE_UINT8 = 0,
    OSP_GGUF_TYPE_INT8 = 1,
    OSP_GGUF_TYPE_UINT16 = 2,
    OSP_GGUF_TYPE_INT16 = 3,
    OSP_GGUF_TYPE_UINT32 = 4,
    OSP_GGUF_TYPE_INT32 = 5,
    OSP_GGUF_TYPE_FLOAT32 = 6,
    OSP_GGUF_TYPE_BOOL = 7,
    OSP_GGUF_TYPE_STRING = 8,
    OSP_GGUF_TYPE_ARRAY = 9,
    OSP_GGUF_TYPE_UINT64 = 10,
    OSP_GGUF_TYPE_INT64 = 11,
    OSP_GGUF_TYPE_FLOAT64 = 12,
} osp_gguf_type;

/* A string view into the mapping (not NUL-terminated). */
typedef struct osp_gguf_str {
    const char *data;
    uint64_t len;
} osp_gguf_str;

/* A metadata value. Scalars are decoded; arrays keep `n` elements of `elem_type`: for fixed-size
 * element types `raw` points at the little-endian elements in the mapping (possibly unaligned: read
 * them with osp_gguf_arr_*); for strings `strs[n]`; for nested arrays `elems[n]`. */
typedef struct osp_gguf_value {
    osp_gguf_type type;
    union {
        uint64_t u64; /* UINT8..UINT64 and BOOL */
        int64_t i64;  /* INT8..INT64 */
        double f64;   /* FLOAT32, FLOAT64 */
        osp_gguf_str str;
        struct {
            osp_gguf_type elem_type;
            uint64_t n;
            const uint8_t *raw;
            osp_gguf_str *strs;
            struct osp_gguf_value *elems;
        } arr;
    } v;
} osp_gguf_value;

typedef struct osp_gguf_kv {
    const char *key; /* owned, NUL-terminated */
    osp_gguf_value value;
} osp_gguf_kv;

/* A tensor's info. ne[] counts elements per dimension, ne[0] fastest (ggml order); unused
 * dimensions are 1. `data` points into the mapping, `nbytes` bytes, already bounds-checked. */
typedef struct osp_gguf_tensor {
    const char *name; /* owned, NUL-terminated */
    uint32_t n_dims;
    int64_t ne[4];
    uint32_t type; /* ggml type id (osp_dtype in src/core/dtype.h) */
    uint64_t offset; /* relative to the data section */
    const void *data;
    uint64_t nbytes;
} osp_gguf_tensor;

/* Opens and validates `path`. On success *out owns the mapping; free with osp_gguf_close().
 * Errors: OSP_ERR_IO (missing, unreadable, empty), OSP_ERR_FORMAT (bad magic, truncated, counts or
 * offsets out of range, duplicate keys or tensor names, misaligned tensor data),
 * OSP_ERR_UNSUPPORTED (version other than 2 or 3, tensor type unknown to ggml), OSP_ERR_NOMEM. */
osp_status osp_gguf_open(const char *path, osp_gguf **out);

/* Same as osp_gguf_open over a caller-owned buffer that must outlive the handle (used by the fuzzer
 * and tests). `name` is used in error messages. */
osp_status osp_gguf_open_memory(const void *data, size_t size, const char *name, osp_gguf **out);

void osp_gguf_close(osp_gguf *g); /* NULL is fine */

/* Tells the kernel that the caller copies the tensor data out and drops the pages it copied (the CPU
 * backend's --no-mmap): the mapping is then faulted in with small pages only (madvise MADV_NOHUGEPAGE),
 * so that touching one tensor does not map back a whole 2 MB page-cache folio of tensors already copied
 * and dropped (peak RSS: bench/cpu/NOTES.md, twelfth pass). A hint: it changes no data, and does nothing
 * for a handle over a caller buffer (osp_gguf_open_memory) or where the kernel refuses it. NULL is fine. */
void osp_gguf_advise_copy_out(osp_gguf *g);

uint32_t osp_gguf_version(const osp_gguf *g);
const char *osp_gguf_path(const osp_gguf *g);
uint32_t osp_gguf_alignment(const osp_gguf *g);
uint64_t osp_gguf_data_offset(const osp_gguf *g); /* file offset of the tensor data section */

uint64_t osp_gguf_n_kv(const osp_gguf *g);
const osp_gguf_kv *osp_gguf_kv_at(const osp_gguf *g, uint64_t i);
/* Returns the pair with key `key`, or NULL. */
const osp_gguf_kv *osp_gguf_find(const osp_gguf *g, const char *key);

uint64_t osp_gguf_n_tensors(const osp_gguf *g);
const osp_gguf_tensor *osp_gguf_tensor_at(const osp_gguf *g, uint64_t i);
const osp_gguf_tensor *osp_gguf_find_tensor(const osp_gguf *g, const char *name);

/* Typed getters. Absent key: OSP_ERR_NOT_FOUND (message names file and key). A value of another
 * type: OSP_ERR_FORMAT. Integer getters accept any integer type whose value fits. */
osp_status osp_gguf_get_u32(const osp_gguf *g, const char *key, uint32_t *out);
osp_status osp_gguf_get_i64(const osp_gguf *g, const char *key, int64_t *out);
osp_status osp_gguf_get_f32(const osp_gguf *g, const char *key, float *out);
osp_status osp_gguf_get_bool(const osp_gguf *g, const char *key, bool *out);
osp_status osp_gguf_get_str(const osp_gguf *g, const char *key, osp_gguf_str *out);
/* The array under `key`, with elements of `elem_type` (any type if elem_type < 0). */
osp_status osp_gguf_get_arr(const osp_gguf *g, const char *key, int elem_type,
                            const osp_gguf_value **out);

/* Element readers for fixed-size arrays (i < n is the caller's duty). */
int64_t osp_gguf_arr_i64(const osp_gguf_value *arr, uint64_t i);
double osp_gguf_arr_f64(const osp_gguf_value *arr, uint64_t i);

const char *osp_gguf_type_name(osp_gguf_type t);

/* ---- writer ------------------------------------------------------------------------------------
 *
 * A builder for GGUF v3 files (ggml/docs/gguf.md). Metadata and tensor infos are collected in memory
 * (they are small: even a 128k-token vocabulary is a few MB); tensor data is streamed to the file at
 * osp_gguf_writer_write() time, either from a caller buffer or from a fill callback that produces a
 * chunk of rows at a time, so multi-GB files never need the whole file in memory.
 *
 * The writer always emits `general.alignment` = 32 (u32) as the first key; every tensor's offset is
 * a multiple of 32 and the data section starts at a multiple of 32. Tensors are written in the order
 * they were added; keys too. The output is a deterministic function of the calls made. */

typedef struct osp_gguf_writer osp_gguf_writer;

/* Produces rows [row0, row0 + n_rows) of a tensor into `dst`: n_rows * row_size bytes, already in the
 * tensor's ggml type (a row is ne[0] values; rows are numbered over ne[1] * ne[2] * ne[3] in ggml
 * order). Called in increasing row order, each row exactly once, during osp_gguf_writer_write().
 * Returns OSP_OK, or a failing status (with osp_set_error) that aborts the write. */
typedef osp_status (*osp_gguf_fill_fn)(void *user, int64_t row0, int64_t n_rows, void *dst);

/* Creates an empty writer (with general.alignment = 32 already added). *out owns it; free with
 * osp_gguf_writer_free(). Errors: OSP_ERR_INVALID_ARG (out NULL), OSP_ERR_NOMEM. */
osp_status osp_gguf_writer_create(osp_gguf_writer **out);

void osp_gguf_writer_free(osp_gguf_writer *w); /* NULL is fine */

/* Metadata setters. `key` is a NUL-terminated, non-empty string; it is copied. Values are copied
 * (strings and arrays included), so the caller's buffers may be freed right after the call.
 * Errors: OSP_ERR_INVALID_ARG (NULL or empty key, key already added: GGUF keys are unique, NULL
 * array with n > 0, NULL string), OSP_ERR_NOMEM. A failed call leaves the writer unchanged. */
osp_status osp_gguf_writer_add_u32(osp_gguf_writer *w, const char *key, uint32_t v);
osp_status osp_gguf_writer_add_i32(osp_gguf_writer *w, const char *key, int32_t v);
osp_status osp_gguf_writer_add_f32(osp_gguf_writer *w, const char *key, float v);
osp_status osp_gguf_writer_add_bool(osp_gguf_writer *w, const char *key, bool v);
/* `s` is NUL-terminated UTF-8. */
osp_status osp_gguf_writer_add_str(osp_gguf_writer *w, const char *key, const char *s);
/* Arrays of n values: strs[n] NUL-terminated strings, v[n] int32 / float. */
osp_status osp_gguf_writer_add_arr_str(osp_gguf_writer *w, const char *key, const char *const *strs,
                                       uint64_t n);
osp_status osp_gguf_writer_add_arr_i32(osp_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
osp_status osp_gguf_writer_add_arr_f32(osp_gguf_writer *w, const char *key, const float *v, uint64_t n);
/* Any value as decoded by the reader (osp_gguf_find(...)->value), nested arrays included: used to
 * copy keys from one file to another. The value is serialized at once, so the source file may be
 * closed right after. Errors as above, plus OSP_ERR_INVALID_ARG for an unknown value type. */
osp_status osp_gguf_writer_add_value(osp_gguf_writer *w, const char *key, const osp_gguf_value *v);

/* Adds tensor `name` (NUL-terminated, 1..63 bytes, unique) of ggml type `type` (osp_dtype) with
 * n_dims (1..4) dimensions ne[n_dims] (ne[0] fastest, each >= 1, ne[0] a multiple of the type's
 * block size). Exactly one of `data` and `fill` is non-NULL:
 *   data: the tensor's bytes (osp_dtype_row_size(type, ne[0]) * ne[1] * ne[2] * ne[3]); borrowed,
 *         not copied: it must stay valid and unchanged until osp_gguf_writer_write() returns;
 *   fill: called with `user` during osp_gguf_writer_write() to produce the rows (osp_gguf_fill_fn).
 * Errors: OSP_ERR_INVALID_ARG (bad name, duplicate name, bad dims or shape, both or neither of
 * data/fill), OSP_ERR_UNSUPPORTED (type unknown to ggml), OSP_ERR_NOMEM. */
osp_status osp_gguf_writer_add_tensor(osp_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                      const int64_t *ne, const void *data, osp_gguf_fill_fn fill,
                                      void *user);

/* Writes the file: header, metadata, tensor infos, padding, then each tensor's data padded to the
 * alignment. Data is streamed (fill callbacks run here, in tensor order, a bounded chunk of rows at a
 * time). The file is written to "<path>.tmp" and renamed over `path` on success, so a failed or
 * interrupted write never leaves a truncated `path`; on failure the temporary file is removed.
 * May be called more than once. Errors: OSP_ERR_IO (cannot create, write or rename; message names
 * the path and errno text), OSP_ERR_NOMEM, or whatever a fill callback returned. */
osp_status osp_gguf_writer_write(osp_gguf_writer *w, const char *path);

#ifdef __cplusplus
}
#endif
#endif
