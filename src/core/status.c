/* The thread-local error message behind osp_last_error(), and osp_set_error() which library code
 * calls right before returning a failing osp_status. */
#include "core/status_internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char g_error[1024];

const char *osp_status_str(osp_status s) {
    switch (s) {
    case OSP_OK: return "OSP_OK";
    case OSP_ERR_IO: return "OSP_ERR_IO";
    case OSP_ERR_FORMAT: return "OSP_ERR_FORMAT";
    case OSP_ERR_UNSUPPORTED: return "OSP_ERR_UNSUPPORTED";
    case OSP_ERR_NOMEM: return "OSP_ERR_NOMEM";
    case OSP_ERR_INVALID_ARG: return "OSP_ERR_INVALID_ARG";
    case OSP_ERR_NOT_FOUND: return "OSP_ERR_NOT_FOUND";
    case OSP_ERR_INTERNAL: return "OSP_ERR_INTERNAL";
    }
    return "OSP_ERR_UNKNOWN";
}

const char *osp_last_error(void) { return g_error; }

osp_status osp_set_error(osp_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_error, sizeof g_error, fmt, ap);
    va_end(ap);
    return s;
}

void osp_clear_error(void) { g_error[0] = '\0'; }
