/* libFuzzer target for the EngineCore IPC decoder (src/engine/ipc.c): every message a frontend or a
 * core receives is hostile input. Whatever the bytes, osp_ipc_decode must not crash, must leave no
 * leak, and must either refuse them (OSP_ERR_FORMAT or OSP_ERR_NOMEM, with a message) or give a
 * message that respects its own bounds (ids >= 0, logprobs <= 0, counts within the limits, an
 * embedding only in a stop output) and that encodes back to bytes decoding to the same fields.
 * Seeds: tests/fuzz/corpus/ipc/ (one of each message type, written by tests/fuzz/make_ipc_seeds.py
 * with msgpack). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/ipc.h"
#include "osprey/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_lp(const osp_token_logprobs *lp, int32_t n) {
    for (int32_t i = 0; lp && i < n; i++) {
        if (lp[i].token_id < 0 || !(lp[i].logprob <= 0) || lp[i].n_top < 0 || lp[i].n_top > OSP_ENGINE_MAX_LOGPROBS) abort();
        for (int32_t k = 0; k < lp[i].n_top; k++)
            if (lp[i].top_ids[k] < 0 || !(lp[i].top_logprobs[k] <= 0)) abort();
    }
}

/* Encodes m again (by its type) into b. */
static void reencode(const osp_ipc_msg *m, msgpack_sbuffer *b) {
    osp_status s = OSP_OK;
    switch (m->type) {
    case OSP_IPC_HELLO: s = osp_ipc_encode_hello(b, m->fe); break;
    case OSP_IPC_READY: s = osp_ipc_encode_ready(b, &m->ready); break;
    case OSP_IPC_ADD: s = osp_ipc_encode_add(b, m->id, m->gen, &m->rp); break;
    case OSP_IPC_ABORT: s = osp_ipc_encode_abort(b, m->id, m->gen); break;
    case OSP_IPC_HEARTBEAT: s = osp_ipc_encode_heartbeat(b); break;
    case OSP_IPC_ACK: s = osp_ipc_encode_ack(b, m->id, m->gen, m->ok, m->error); break;
    case OSP_IPC_OUTPUTS: {
        osp_ipc_outputs ob;
        osp_ipc_outputs_init(&ob);
        osp_ipc_outputs_begin(&ob);
        for (int32_t i = 0; i < m->n_outs && s == OSP_OK; i++) {
            const osp_ipc_output *x = &m->outs[i];
            osp_request_output o = {.token_ids = x->tokens, .num_tokens = x->num_tokens, .logprobs = x->logprobs,
                                    .prompt_logprobs = x->prompt_logprobs, .num_prompt_logprobs = x->num_prompt_logprobs,
                                    .num_output_tokens = x->num_output_tokens, .num_prompt_tokens = x->num_prompt_tokens,
                                    .num_cached_tokens = x->num_cached_tokens, .first_scheduled_s = x->first_scheduled_s,
                                    .finished = x->finished, .finish_reason = x->finish_reason,
                                    .embedding = x->embedding, .n_embd = x->n_embd,
                                    .kv_transfer_id = x->kv_transfer_id, .kv_transfer_num_blocks = x->kv_transfer_num_blocks};
            memcpy(o.error, x->error, sizeof o.error);
            s = osp_ipc_outputs_add(&ob, x->id, x->gen, &o);
        }
        if (s == OSP_OK) s = osp_ipc_outputs_finish(&ob, &m->stats, b);
        osp_ipc_outputs_destroy(&ob);
        break;
    }
    }
    if (s != OSP_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    osp_ipc_msg m;
    const osp_status s = osp_ipc_decode(data, size, NULL, &m);
    if (s != OSP_OK) {
        if (s != OSP_ERR_FORMAT && s != OSP_ERR_NOMEM) abort();
        if (!osp_last_error()[0]) abort(); /* a refusal says why */
        osp_ipc_msg_free(&m);
        return 0;
    }
    const osp_ipc_limits lim = osp_ipc_default_limits();
    if (m.type == OSP_IPC_ADD) {
        if (m.rp.num_prompt < 0 || m.rp.num_prompt > lim.max_prompt || (m.rp.num_prompt && !m.rp.prompt)) abort();
        for (int32_t i = 0; i < m.rp.num_prompt; i++)
            if (m.rp.prompt[i] < 0) abort();
    }
    for (int32_t i = 0; i < m.n_outs; i++) {
        const osp_ipc_output *x = &m.outs[i];
        if (x->num_tokens < 0 || x->num_tokens > lim.max_tokens || x->finished != (x->finish_reason != OSP_FINISH_NONE)) abort();
        for (int32_t k = 0; k < x->num_tokens; k++)
            if (x->tokens[k] < 0) abort();
        check_lp(x->logprobs, x->num_tokens);
        check_lp(x->prompt_logprobs, x->num_prompt_logprobs);
        if ((x->embedding != NULL) != (x->n_embd > 0) || (x->embedding && x->finish_reason != OSP_FINISH_STOP)) abort();
        if (x->kv_transfer_num_blocks < 0 || (x->kv_transfer_num_blocks > 0 && !x->finished) ||
            (x->kv_transfer_num_blocks == 0 && x->kv_transfer_id != 0))
            abort();
    }
    if (m.type == OSP_IPC_ADD && m.rp.kv_transfer) { /* only with a flag set, a port, a NUL-terminated host */
        const osp_kv_transfer_params *kt = m.rp.kv_transfer;
        if ((!kt->do_remote_decode && !kt->do_remote_prefill) || kt->remote_port < 0 || kt->remote_port > 65535 ||
            kt->remote_num_blocks < 0 || !memchr(kt->remote_host, 0, sizeof kt->remote_host))
            abort();
    }
    if (m.ready.kv.role != OSP_KV_ROLE_NONE &&
        (m.ready.kv.role > OSP_KV_ROLE_BOTH || m.ready.kv.port < 0 || m.ready.kv.port > 65535 ||
         !memchr(m.ready.kv.host, 0, sizeof m.ready.kv.host)))
        abort();
    /* round trip: what decoded encodes, and decodes to the same fields */
    msgpack_sbuffer b;
    msgpack_sbuffer_init(&b);
    reencode(&m, &b);
    osp_ipc_msg m2;
    if (osp_ipc_decode(b.data, b.size, NULL, &m2) != OSP_OK) abort();
    if (m2.type != m.type || m2.id != m.id || m2.gen != m.gen || m2.n_outs != m.n_outs || m2.rp.num_prompt != m.rp.num_prompt ||
        m2.ok != m.ok || strcmp(m2.error, m.error) != 0 || m2.fe != m.fe || m2.ready.epoch != m.ready.epoch ||
        m2.rp.pooling != m.rp.pooling || m2.rp.embd_normalize != m.rp.embd_normalize ||
        !m2.rp.kv_transfer != !m.rp.kv_transfer || memcmp(&m2.ready.kv, &m.ready.kv, sizeof m.ready.kv) ||
        m2.stats.kv_transfer_failed_blocks != m.stats.kv_transfer_failed_blocks)
        abort();
    if (m.rp.kv_transfer) {
        const osp_kv_transfer_params *a = m.rp.kv_transfer, *b2 = m2.rp.kv_transfer;
        if (a->do_remote_decode != b2->do_remote_decode || a->do_remote_prefill != b2->do_remote_prefill ||
            strcmp(a->remote_host, b2->remote_host) || a->remote_port != b2->remote_port ||
            a->remote_engine_id != b2->remote_engine_id || a->remote_request_id != b2->remote_request_id ||
            a->remote_num_blocks != b2->remote_num_blocks)
            abort();
    }
    if (m.rp.num_prompt && memcmp(m.rp.prompt, m2.rp.prompt, sizeof(int32_t) * (size_t)m.rp.num_prompt)) abort();
    for (int32_t i = 0; i < m.n_outs; i++)
        if (m2.outs[i].num_tokens != m.outs[i].num_tokens || m2.outs[i].finish_reason != m.outs[i].finish_reason ||
            (m.outs[i].num_tokens && memcmp(m.outs[i].tokens, m2.outs[i].tokens, sizeof(int32_t) * (size_t)m.outs[i].num_tokens)) ||
            m2.outs[i].n_embd != m.outs[i].n_embd || m2.outs[i].kv_transfer_id != m.outs[i].kv_transfer_id ||
            m2.outs[i].kv_transfer_num_blocks != m.outs[i].kv_transfer_num_blocks ||
            (m.outs[i].n_embd && memcmp(m.outs[i].embedding, m2.outs[i].embedding, sizeof(float) * (size_t)m.outs[i].n_embd)))
            abort();
    osp_ipc_msg_free(&m2);
    msgpack_sbuffer_destroy(&b);
    osp_ipc_msg_free(&m);
    return 0;
}
