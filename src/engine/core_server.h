/* The EngineCore's side of the process split (vLLM V1's EngineCoreProc): one thread that owns an
 * engine and a ZeroMQ ROUTER socket, and loops: read every frontend message (HELLO, ADD, ABORT,
 * HEARTBEAT; src/engine/ipc.h), run one engine step when anything is unfinished, send each frontend
 * the step's outputs for its requests plus the step's stats. Frontends are told apart by their
 * ZeroMQ routing id; a request is owned by exactly the frontend that added it.
 *
 * Lifecycle rules it keeps:
 *   - admission: an ADD is answered by ACK (ok, or the engine's reason for refusing it) before any
 *     output of that request is sent;
 *   - cancellation: ABORT (id, gen) aborts the engine request, whose blocks are freed in the next
 *     step; its final event (finished, reason abort) is still sent, so the frontend can forget it;
 *   - frontend death: a frontend silent for frontend_timeout_ms (it heartbeats) has all its requests
 *     aborted and its outputs dropped until it speaks again;
 *   - a message that does not decode is dropped and counted; the core never trusts one. */
#ifndef OSPREY_ENGINE_CORE_SERVER_H
#define OSPREY_ENGINE_CORE_SERVER_H

#include <stdatomic.h>
#include <stdint.h>

#include "osprey/engine.h"

typedef struct osp_core_server_params {
    const char *endpoint;      /* bound by the core, e.g. "ipc:///tmp/osprey-XXXX/core" */
    uint32_t epoch;            /* sent in READY: which incarnation of the core this is */
    int frontend_timeout_ms;   /* a frontend silent this long is dead (5000) */
    int idle_stats_ms;         /* when idle, send stats to every live frontend this often (250) */
    atomic_int *stop;          /* non-NULL: serve returns OSP_OK soon after *stop becomes nonzero */
    atomic_int *bound;         /* non-NULL: set to 1 once the endpoint is bound (tests wait on it) */
} osp_core_server_params;

/* Counters of a serve call, for tests (read after it returns, or racy but harmless while it runs). */
typedef struct osp_core_server_counters {
    atomic_llong bad_messages;       /* dropped: did not decode */
    atomic_llong frontends_expired;  /* frontends declared dead by heartbeat timeout */
    atomic_llong aborted_for_expiry; /* requests aborted because their frontend died */
} osp_core_server_counters;

/* Serves engine `e` (created, loop thread NOT started: this thread steps it) on p->endpoint until
 * *p->stop, or a step fails. Returns OSP_OK on stop; the step's error (the engine should then be
 * freed: the process exits and its frontend restarts it); OSP_ERR_IO if the endpoint cannot be bound.
 * counters may be NULL. Requests still in the engine when it returns keep callbacks into state this
 * call freed: the engine must then be freed (osp_engine_free calls no callback), never stepped again. */
osp_status osp_core_serve(osp_engine *e, const osp_core_server_params *p, osp_core_server_counters *counters);

#endif
