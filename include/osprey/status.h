/* osprey status codes and the thread-local error message.
 *
 * Library code never exits and never prints to stdout: every fallible call returns an osp_status,
 * and on failure leaves one human-readable line (naming the file and the field at fault) in a
 * thread-local buffer that osp_last_error() returns. Tools print that line and exit non-zero. */
#ifndef OSPREY_STATUS_H
#define OSPREY_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* New values are appended; existing values never change. */
typedef enum osp_status {
    OSP_OK = 0,
    OSP_ERR_IO = 1,          /* file missing, unreadable, mmap failed */
    OSP_ERR_FORMAT = 2,      /* file present but malformed: truncated, bad magic, bad offsets */
    OSP_ERR_UNSUPPORTED = 3, /* well-formed but not handled: tensor type, architecture, version */
    OSP_ERR_NOMEM = 4,       /* allocation failed */
    OSP_ERR_INVALID_ARG = 5, /* caller passed something out of range */
    OSP_ERR_NOT_FOUND = 6,   /* a key or tensor that was asked for is absent */
    OSP_ERR_INTERNAL = 7,    /* a bug in osprey */
} osp_status;

/* Returns a static name for a status ("OSP_ERR_FORMAT", ...). Never NULL. */
const char *osp_status_str(osp_status s);

/* Returns the message of the last failure on this thread (empty string if none). The pointer stays
 * valid until the next failing osprey call on the same thread. */
const char *osp_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
