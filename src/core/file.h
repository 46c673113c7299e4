/* Reading a whole file into memory with a size bound: the one reader behind every small file osprey
 * loads (KV scales, KL base, kernel tables, templates, text corpora), so each gets the same errors and
 * no loader can be made to allocate without limit. */
#ifndef OSP_CORE_FILE_H
#define OSP_CORE_FILE_H

#include <stddef.h>

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads the file at `path` whole into a new buffer, NUL-terminated (*out[*len] == '\0', so text
 * callers may treat it as a string; binary callers use *len). The buffer grows as the file is read
 * (pipes and /proc files work; nothing is trusted from stat), and never past max_bytes + 1.
 * `what` names the file in error messages ("KV scales file", "text"); NULL: "file".
 * Ownership: on OSP_OK the caller frees *out with free(). On error *out is NULL and *len 0.
 * Errors: OSP_ERR_IO (cannot open, read error, or larger than max_bytes: the message names the path
 * and the limit), OSP_ERR_NOMEM. */
osp_status osp_read_file(const char *path, size_t max_bytes, const char *what, char **out, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
