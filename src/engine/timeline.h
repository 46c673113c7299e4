/* The step timeline (`--trace FILE`; issue 17's "a step timeline"): each engine step's host phases and,
 * where the backend has a device clock (CUDA: events, src/backend/backend.h timeline_enable), its device
 * work, written as Chrome trace-event JSON (the Trace Event Format's array form: one complete event,
 * ph "X", a line, times in microseconds from the trace's start) for chrome://tracing or Perfetto; nsys
 * does not run on every machine osprey runs on.
 *
 * Tracks: pid 1, tid 1 "engine (host)": schedule, prepare (apply the scheduler's diff, build the
 * batch), forward (enqueue: the device's ops are launched, or on the CPU run), sample (on the GPU: pack
 * the rows, wait for the results), update (tokens into requests, the scheduler, drafts); tid 2
 * "device": forward and sample as the device ran them. Every event carries the step number, rows and
 * tokens.
 *
 * The figure the trace exists for: the GPU's idle time between decode steps (the step's device spans
 * against the time from one decode step's end on the device to the next's). osp_timeline_close prints
 * it: over pairs of consecutive steps that are both decode-only (every row one token, or a
 * verification row), idle = (start of the next step's forward - end of this step's last device span)
 * + (the next step's sampler start - its forward end), as a share of the period between the two steps'
 * ends. A process that dies before the close leaves the array
 * unterminated, which the format allows and the viewers read. */
#ifndef OSP_ENGINE_TIMELINE_H
#define OSP_ENGINE_TIMELINE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "osprey/status.h"

typedef struct osp_timeline osp_timeline;

/* One step, host times in CLOCK_MONOTONIC seconds: host[i] .. host[i + 1] is phase i (schedule,
 * prepare, forward, sample, update); a phase the step skipped has equal ends. dev: the backend's spans
 * ({-1, -1}: none, or no device clock). */
enum { OSP_TL_SCHEDULE, OSP_TL_PREPARE, OSP_TL_FORWARD, OSP_TL_SAMPLE, OSP_TL_UPDATE, OSP_TL_PHASES };
typedef struct osp_timeline_step {
    int64_t step;
    int32_t rows, tokens;
    bool decode_only;
    double host[OSP_TL_PHASES + 1];
    osp_backend_step_times dev;
} osp_timeline_step;

/* Opens (truncates) path and writes the array's head and the track names (the device track only with
 * device = true: a backend with a device clock). keep [n_keep] (NULL entries skipped): files the process
 * reads, such as the model, that path must not be: truncating a mapped model kills the process. Errors:
 * OSP_ERR_INVALID_ARG when path is one of keep (the same file, by device and inode); OSP_ERR_IO naming the
 * path; OSP_ERR_NOMEM. */
osp_status osp_timeline_open(const char *path, bool device, const char *const *keep, int n_keep, osp_timeline **out);
/* Appends one step's events (steps in order) and flushes them, so a process killed between steps leaves
 * whole events behind. A failed write is logged once to stderr, stops the writing and is reported by the
 * close. */
void osp_timeline_add(osp_timeline *t, const osp_timeline_step *s);
/* The summary line (decode steps, mean period, device busy and idle share), into buf [n]. */
void osp_timeline_summary(const osp_timeline *t, char *buf, size_t n);
/* Closes the array and the file and frees t (NULL: nothing). Errors: OSP_ERR_IO when a write failed. */
osp_status osp_timeline_close(osp_timeline *t);

#endif
