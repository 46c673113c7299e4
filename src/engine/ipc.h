/* The messages between a frontend (osprey serve's HTTP side) and an EngineCore in another process
 * (vLLM V1's EngineCoreRequest / EngineCoreOutputs split): compact msgpack maps, never tensors. A
 * frontend sends HELLO, ADD (token ids + sampling params), ABORT and HEARTBEAT; the core answers
 * READY, ACK (admission: accepted or why not) and OUTPUTS (per step: each request's new token ids and
 * logprobs, finished/aborted events with their reason, and the step's stats). Every request is named
 * on the wire by (id, gen): the frontend gives each add a fresh generation number, so an output that
 * arrives after its request was cancelled, or after its id was given to a new request, matches no
 * live (id, gen) and is dropped.
 *
 * Encoding uses msgpack-c's packer. Decoding is a strict reader written here rather than
 * msgpack_unpack: every message is hostile input (it may come from a crashed or foreign process), so
 * each declared length is checked against the bytes left before anything is allocated, each field's
 * type is checked, unknown or repeated keys and trailing bytes reject the message, and arrays are
 * bounded (osp_ipc_limits). The msgpack format: github.com/msgpack/msgpack/blob/master/spec.md. */
#ifndef OSPREY_ENGINE_IPC_H
#define OSPREY_ENGINE_IPC_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/engine.h"

typedef enum osp_ipc_type {
    OSP_IPC_HELLO = 1,     /* frontend -> core {t, fe}: register (the core answers READY) */
    OSP_IPC_READY = 2,     /* core -> frontend {t, epoch, mml, vocab, nb, bs, pid, kv?}: the engine is loaded */
    OSP_IPC_ADD = 3,       /* frontend -> core {t, id, gen, prompt, sampling fields..., gram?, pool? enorm?, kvt?} */
    OSP_IPC_ABORT = 4,     /* frontend -> core {t, id, gen} */
    OSP_IPC_HEARTBEAT = 5, /* frontend -> core {t}: I am alive (any message counts) */
    OSP_IPC_ACK = 6,       /* core -> frontend {t, id, gen, ok, err?}: admission of an ADD */
    OSP_IPC_OUTPUTS = 7,   /* core -> frontend {t, outs: [...], stats: [...]}: one step's news */
} osp_ipc_type;

/* Bounds the decoder enforces beyond "fits in the bytes left". */
typedef struct osp_ipc_limits {
    int32_t max_prompt;      /* prompt token ids per ADD (1 << 22) */
    int32_t max_tokens;      /* new token ids per output entry (1 << 20) */
    int32_t max_outputs;     /* entries per OUTPUTS (1 << 16) */
    int32_t max_grammar;     /* grammar bytes (1 << 22) */
} osp_ipc_limits;

osp_ipc_limits osp_ipc_default_limits(void);

/* READY's facts about the core (what the frontend needs to validate requests). */
typedef struct osp_ipc_ready {
    uint32_t epoch;          /* which incarnation of the core (0, 1, ... per restart) */
    int32_t max_model_len, n_vocab, num_blocks, block_size;
    int64_t pid;
    /* osp_engine_kv_transfer_info of the core's engine ("kv": [role, host, port, engine_id], sent only
       with a role; role OSP_KV_ROLE_NONE without) */
    osp_kv_transfer_info kv;
} osp_ipc_ready;

/* One entry of OUTPUTS: what osp_request_output says, for request (id, gen). Arrays owned by the
 * decoded message. */
typedef struct osp_ipc_output {
    uint64_t id;
    uint32_t gen;
    int32_t *tokens;                 /* [num_tokens] */
    int32_t num_tokens;
    osp_token_logprobs *logprobs;    /* [num_tokens] or NULL */
    osp_token_logprobs *prompt_logprobs; /* [num_prompt_logprobs] or NULL */
    int32_t num_prompt_logprobs;
    int32_t num_output_tokens, num_prompt_tokens, num_cached_tokens;
    double first_scheduled_s;        /* CLOCK_MONOTONIC seconds (one machine, one clock) */
    bool finished;
    osp_finish_reason finish_reason;
    char error[160];
    float *embedding;                /* [n_embd]: an embedding request's vector, in its finishing output; or NULL */
    int32_t n_embd;
    uint64_t kv_transfer_id;         /* a finishing output's held KV transfer ("kvid", "kvnb": sent only with
                                        kv_transfer_num_blocks > 0); else 0, 0 */
    int32_t kv_transfer_num_blocks;
} osp_ipc_output;

/* A decoded message. Fields are filled as the type says; the rest are zero. Free with
 * osp_ipc_msg_free (also after a failed decode). */
typedef struct osp_ipc_msg {
    osp_ipc_type type;
    uint64_t id;             /* ADD ABORT ACK */
    uint32_t gen;            /* ADD ABORT ACK */
    uint32_t fe;             /* HELLO: the frontend's index */
    osp_ipc_ready ready;     /* READY */
    osp_request_params rp;   /* ADD: request_id = id; arrays point into the owned copies below; no
                                callback */
    int32_t *prompt, *stop_ids;
    osp_token_bias *bias;
    char *grammar;
    osp_kv_transfer_params *kvt; /* ADD: rp.kv_transfer's copy ("kvt": [do_remote_decode, do_remote_prefill,
                                host, port, engine_id, request_id, num_blocks], sent only when a flag is
                                set), or NULL */
    bool ok;                 /* ACK */
    char error[160];         /* ACK: why the add was refused */
    osp_ipc_output *outs;    /* OUTPUTS [n_outs] */
    int32_t n_outs;
    bool has_stats;
    osp_engine_stats stats;  /* OUTPUTS */
} osp_ipc_msg;

/* Decodes one message of `len` bytes. OSP_OK and *m filled, or OSP_ERR_FORMAT (a message naming the
 * first thing wrong: truncated, wrong type, unknown/duplicate/missing field, value out of range,
 * bytes after the message) or OSP_ERR_NOMEM; *m is then empty but must still be freed. Never reads
 * outside [data, data + len); allocates at most about 32x len bytes. */
osp_status osp_ipc_decode(const void *data, size_t len, const osp_ipc_limits *lim, osp_ipc_msg *m);
void osp_ipc_msg_free(osp_ipc_msg *m);

/* Encoders: each clears *buf and writes one message into it (msgpack_sbuffer: buf->data, buf->size;
 * the memory is reused across calls). OSP_ERR_NOMEM if the buffer cannot grow. */
osp_status osp_ipc_encode_hello(msgpack_sbuffer *buf, uint32_t fe);
osp_status osp_ipc_encode_ready(msgpack_sbuffer *buf, const osp_ipc_ready *r);
/* rp's arrays are copied into the message; rp->callback and request_id are not sent (id is);
 * rp->kv_transfer only when one of its flags is set (else it means nothing). */
osp_status osp_ipc_encode_add(msgpack_sbuffer *buf, uint64_t id, uint32_t gen, const osp_request_params *rp);
osp_status osp_ipc_encode_abort(msgpack_sbuffer *buf, uint64_t id, uint32_t gen);
osp_status osp_ipc_encode_heartbeat(msgpack_sbuffer *buf);
osp_status osp_ipc_encode_ack(msgpack_sbuffer *buf, uint64_t id, uint32_t gen, bool ok, const char *error);

/* OUTPUTS is built one entry at a time (the engine's callbacks hand them over during a step, their
 * arrays valid only during the call): begin, add each, then finish with the step's stats, which
 * writes the whole message into `out`. The builder keeps its buffers between steps. */
typedef struct osp_ipc_outputs {
    msgpack_sbuffer body;    /* the entries so far */
    int32_t n;
} osp_ipc_outputs;
void osp_ipc_outputs_init(osp_ipc_outputs *b);
void osp_ipc_outputs_destroy(osp_ipc_outputs *b);
void osp_ipc_outputs_begin(osp_ipc_outputs *b);
osp_status osp_ipc_outputs_add(osp_ipc_outputs *b, uint64_t id, uint32_t gen, const osp_request_output *o);
osp_status osp_ipc_outputs_finish(osp_ipc_outputs *b, const osp_engine_stats *st, msgpack_sbuffer *out);

#endif
