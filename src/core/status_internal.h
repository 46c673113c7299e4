/* Internal helpers for setting the thread-local error message (see include/osprey/status.h). */
#ifndef OSP_CORE_STATUS_INTERNAL_H
#define OSP_CORE_STATUS_INTERNAL_H

#include "osprey/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Formats the message into the thread-local buffer and returns `s`, so callers write
 * `return osp_set_error(OSP_ERR_FORMAT, "%s: bad magic", path);`. */
osp_status osp_set_error(osp_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void osp_clear_error(void);

#ifdef __cplusplus
}
#endif

/* Propagate a failing status from a callee, keeping its message. */
#define OSP_TRY(expr)                                                                              \
    do {                                                                                           \
        osp_status osp_try_s_ = (expr);                                                            \
        if (osp_try_s_ != OSP_OK) return osp_try_s_;                                               \
    } while (0)

#endif
