/* A frontend's side of the process split (vLLM V1's EngineCoreClient): add and abort requests of an
 * EngineCore in another process (core_server.h) over ZeroMQ, and get their outputs through a
 * per-request callback, as osp_engine_add's callbacks give them in-process.
 *
 * One I/O thread owns the DEALER socket: it forwards what other threads send, decodes what the core
 * sends (every message as hostile input, src/engine/ipc.h), heartbeats, and calls the callbacks.
 * Every callback runs on that thread, one at a time.
 *
 * Lifecycle:
 *   - each add gets a fresh generation number; outputs carry (id, gen), and one that matches no live
 *     (id, gen) (its request was aborted and has ended, its id was reused, or it comes from a core
 *     that was declared dead) is dropped and counted, never delivered to another request;
 *   - osp_core_client_add waits for the core's ACK, so a refused request is an error of the add (as
 *     osp_engine_add's are) and nothing runs; osp_core_client_add_async returns at once and gives the
 *     ACK (or its absence: a lost core, a timeout) to a callback;
 *   - osp_core_client_core_lost (the supervisor saw the core die): every live request gets a final
 *     callback at once (finished, OSP_FINISH_ERROR, core_lost = true), adds fail until a core of a
 *     later epoch says READY. */
#ifndef OSPREY_ENGINE_CORE_CLIENT_H
#define OSPREY_ENGINE_CORE_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/ipc.h"
#include "osprey/engine.h"

typedef struct osp_core_client osp_core_client;

/* Called on the client's I/O thread with each output of a request, as osp_output_cb; core_lost: this
 * final output (finished, OSP_FINISH_ERROR) comes from the client because the core died, not from
 * the core. `o` is valid during the call only. Must not call osp_core_client_free. */
typedef void (*osp_core_output_cb)(void *user, const osp_request_output *o, bool core_lost);

typedef struct osp_core_client_params {
    const char *endpoint;    /* the core's ROUTER, e.g. "ipc:///tmp/osprey-XXXX/core" */
    uint32_t fe;             /* this frontend's index (0..255); its routing id is "fe<fe>-<pid>" */
    int heartbeat_ms;        /* HEARTBEAT this often (200); HELLO every 50 ms until READY */
    int ack_timeout_ms;      /* an add waits this long for its ACK (60000) */
    bool watch_disconnect;   /* a frontend that does not supervise the core process itself: treat the
                                core's connection closing (ZeroMQ socket monitor) as its death, as
                                osp_core_client_core_lost(c, last READY epoch + 1, ...) */
} osp_core_client_params;

/* Starts the I/O thread, which connects and says HELLO until a core answers READY. Errors:
 * OSP_ERR_IO (ZeroMQ), OSP_ERR_NOMEM. */
osp_status osp_core_client_create(const osp_core_client_params *p, osp_core_client **out);
/* Stops the I/O thread (no callback after it returns), frees everything; requests still live get no
 * final callback. NULL is fine. */
void osp_core_client_free(osp_core_client *c);

/* Waits up to timeout_ms (< 0: forever) for a READY of the wanted epoch; true and *info (may be NULL)
 * when ready. */
bool osp_core_client_wait_ready(osp_core_client *c, int timeout_ms, osp_ipc_ready *info);
bool osp_core_client_ready(osp_core_client *c);
/* osp_engine_kv_transfer_info of the core's engine, from its last READY (role OSP_KV_ROLE_NONE before
 * any; a restarted core may listen on another port). Thread-safe. */
osp_kv_transfer_info osp_core_client_kv_transfer_info(osp_core_client *c);

/* Sends request rp (rp->request_id is the id; its callback fields are ignored: cb/user get the
 * outputs) and waits for the core's ACK. OSP_OK: admitted, cb will be called until a finished
 * output. OSP_ERR_INVALID_ARG: the core refused it (osp_last_error says why, the engine's words).
 * OSP_ERR_IO: no ready core, or it died, or no ACK within ack_timeout_ms. Thread-safe. */
osp_status osp_core_client_add(osp_core_client *c, const osp_request_params *rp, osp_core_output_cb cb, void *user);
/* The core's answer to an osp_core_client_add_async, on the client's I/O thread, exactly once:
 * OSP_OK (admitted: the outputs follow through the add's cb, after this call returns),
 * OSP_ERR_INVALID_ARG (refused; why: the engine's words), OSP_ERR_IO (the core died before admitting
 * it, or no ACK within ack_timeout_ms; why says which). `why` is valid during the call only. Must not
 * call osp_core_client_free. */
typedef void (*osp_core_ack_cb)(void *user, osp_status s, const char *why);
/* osp_core_client_add without the wait (an event-loop frontend must not block): sends rp and returns.
 * OSP_OK: sent; ack(user, ...) will be called once with the core's answer, then, if admitted, cb until
 * a finished output. Else (OSP_ERR_IO: no ready core or the message could not be queued;
 * OSP_ERR_NOMEM; OSP_ERR_INVALID_ARG: a NULL argument) nothing was sent and neither callback runs.
 * A request still unanswered when the client is freed gets no ack. Thread-safe. */
osp_status osp_core_client_add_async(osp_core_client *c, const osp_request_params *rp, osp_core_output_cb cb,
                                     osp_core_ack_cb ack, void *user);
/* Aborts every live request with this id (its final output, reason abort, still comes through cb).
 * OSP_ERR_NOT_FOUND when none is live. Thread-safe. */
osp_status osp_core_client_abort(osp_core_client *c, uint64_t id);
/* The core died: fail every live request now (see above); adds fail until a READY of epoch >=
 * next_epoch. `why` goes into each output's error. Thread-safe; returns once the callbacks ran. */
void osp_core_client_core_lost(osp_core_client *c, uint32_t next_epoch, const char *why);

/* The stats of the core's last OUTPUTS (zero before any). Thread-safe. */
osp_engine_stats osp_core_client_stats(osp_core_client *c);
/* Outputs dropped because their (id, gen) was not live; messages that did not decode. */
int64_t osp_core_client_dropped(osp_core_client *c);
int64_t osp_core_client_bad_messages(osp_core_client *c);

#endif
