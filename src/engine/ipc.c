/* The frontend <-> EngineCore messages (see ipc.h): msgpack-c's packer on the way out, a strict
 * bounded reader on the way in. Layout of every message: a map whose first key is "t" (the type),
 * then the type's fields in any order. Token ids travel as bin of little-endian int32 (4 bytes a
 * token, no per-element header); logprobs as [token_id, logprob, rank, [top ids], [top logprobs]];
 * the stats as one array of integers in the order of STAT_FIELDS below. */
#include "engine/ipc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status_internal.h"

osp_ipc_limits osp_ipc_default_limits(void) {
    return (osp_ipc_limits){.max_prompt = 1 << 22, .max_tokens = 1 << 20, .max_outputs = 1 << 16, .max_grammar = 1 << 22};
}

/* ---- encoding ------------------------------------------------------------------------------- */

static int pk_key(msgpack_packer *pk, const char *k) { return msgpack_pack_str_with_body(pk, k, strlen(k)); }

static int pk_ids(msgpack_packer *pk, const int32_t *ids, int32_t n) {
    if (msgpack_pack_bin(pk, (size_t)n * 4)) return -1;
    uint8_t tmp[256];
    for (int32_t i = 0; i < n;) {
        int32_t k = 0;
        for (; k < 64 && i < n; k++, i++) {
            const uint32_t u = (uint32_t)ids[i];
            tmp[4 * k] = (uint8_t)u, tmp[4 * k + 1] = (uint8_t)(u >> 8), tmp[4 * k + 2] = (uint8_t)(u >> 16),
            tmp[4 * k + 3] = (uint8_t)(u >> 24);
        }
        if (msgpack_pack_bin_body(pk, tmp, (size_t)k * 4)) return -1;
    }
    return 0;
}

#define PK(expr)                                                                                                       \
    do {                                                                                                               \
        if ((expr) != 0) return osp_set_error(OSP_ERR_NOMEM, "ipc: out of memory while encoding");                    \
    } while (0)

static void start(msgpack_sbuffer *buf, msgpack_packer *pk) {
    msgpack_sbuffer_clear(buf);
    msgpack_packer_init(pk, buf, msgpack_sbuffer_write);
}

osp_status osp_ipc_encode_hello(msgpack_sbuffer *buf, uint32_t fe) {
    msgpack_packer pk;
    start(buf, &pk);
    PK(msgpack_pack_map(&pk, 2));
    PK(pk_key(&pk, "t") || msgpack_pack_uint8(&pk, OSP_IPC_HELLO));
    PK(pk_key(&pk, "fe") || msgpack_pack_uint32(&pk, fe));
    return OSP_OK;
}

osp_status osp_ipc_encode_ready(msgpack_sbuffer *buf, const osp_ipc_ready *r) {
    msgpack_packer pk;
    start(buf, &pk);
    const bool kv = r->kv.role != OSP_KV_ROLE_NONE;
    PK(msgpack_pack_map(&pk, 7 + (kv ? 1 : 0)));
    PK(pk_key(&pk, "t") || msgpack_pack_uint8(&pk, OSP_IPC_READY));
    PK(pk_key(&pk, "epoch") || msgpack_pack_uint32(&pk, r->epoch));
    PK(pk_key(&pk, "mml") || msgpack_pack_int32(&pk, r->max_model_len));
    PK(pk_key(&pk, "vocab") || msgpack_pack_int32(&pk, r->n_vocab));
    PK(pk_key(&pk, "nb") || msgpack_pack_int32(&pk, r->num_blocks));
    PK(pk_key(&pk, "bs") || msgpack_pack_int32(&pk, r->block_size));
    PK(pk_key(&pk, "pid") || msgpack_pack_int64(&pk, r->pid));
    if (kv) {
        PK(pk_key(&pk, "kv") || msgpack_pack_array(&pk, 4) || msgpack_pack_uint8(&pk, (uint8_t)r->kv.role) ||
           msgpack_pack_str_with_body(&pk, r->kv.host, strnlen(r->kv.host, sizeof r->kv.host - 1)) ||
           msgpack_pack_int32(&pk, r->kv.port) || msgpack_pack_uint64(&pk, r->kv.engine_id));
    }
    return OSP_OK;
}

osp_status osp_ipc_encode_add(msgpack_sbuffer *buf, uint64_t id, uint32_t gen, const osp_request_params *rp) {
    msgpack_packer pk;
    start(buf, &pk);
    const int32_t nb = rp->logit_bias ? rp->num_logit_bias : 0, ns = rp->stop_token_ids ? rp->num_stop_token_ids : 0;
    const bool embed = rp->pooling != OSP_POOLING_NONE;
    const osp_kv_transfer_params *kt = rp->kv_transfer;
    const bool kvt = kt && (kt->do_remote_decode || kt->do_remote_prefill);
    PK(msgpack_pack_map(&pk, 22 + (rp->has_seed ? 1 : 0) + (rp->grammar ? 1 : 0) + (embed ? 2 : 0) + (kvt ? 1 : 0)));
    PK(pk_key(&pk, "t") || msgpack_pack_uint8(&pk, OSP_IPC_ADD));
    PK(pk_key(&pk, "id") || msgpack_pack_uint64(&pk, id));
    PK(pk_key(&pk, "gen") || msgpack_pack_uint32(&pk, gen));
    PK(pk_key(&pk, "prompt") || pk_ids(&pk, rp->prompt, rp->prompt ? rp->num_prompt : 0));
    PK(pk_key(&pk, "temp") || msgpack_pack_float(&pk, rp->temperature));
    PK(pk_key(&pk, "top_k") || msgpack_pack_int32(&pk, rp->top_k));
    PK(pk_key(&pk, "top_p") || msgpack_pack_float(&pk, rp->top_p));
    PK(pk_key(&pk, "min_p") || msgpack_pack_float(&pk, rp->min_p));
    PK(pk_key(&pk, "pres") || msgpack_pack_float(&pk, rp->presence_penalty));
    PK(pk_key(&pk, "freq") || msgpack_pack_float(&pk, rp->frequency_penalty));
    PK(pk_key(&pk, "rep") || msgpack_pack_float(&pk, rp->repetition_penalty));
    PK(pk_key(&pk, "bias") || msgpack_pack_array(&pk, (size_t)nb));
    for (int32_t i = 0; i < nb; i++)
        PK(msgpack_pack_array(&pk, 2) || msgpack_pack_int32(&pk, rp->logit_bias[i].token_id) ||
           msgpack_pack_float(&pk, rp->logit_bias[i].bias));
    if (rp->has_seed) PK(pk_key(&pk, "seed") || msgpack_pack_uint64(&pk, rp->seed));
    PK(pk_key(&pk, "n") || msgpack_pack_int32(&pk, rp->n));
    PK(pk_key(&pk, "sidx") || msgpack_pack_uint32(&pk, rp->sample_index));
    PK(pk_key(&pk, "lp") || msgpack_pack_int32(&pk, rp->logprobs));
    PK(pk_key(&pk, "plp") || msgpack_pack_int32(&pk, rp->prompt_logprobs));
    PK(pk_key(&pk, "max") || msgpack_pack_int32(&pk, rp->max_tokens));
    PK(pk_key(&pk, "min") || msgpack_pack_int32(&pk, rp->min_tokens));
    PK(pk_key(&pk, "ieos") || (rp->ignore_eos ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk)));
    PK(pk_key(&pk, "stop") || pk_ids(&pk, rp->stop_token_ids, ns));
    PK(pk_key(&pk, "prio") || msgpack_pack_int32(&pk, rp->priority));
    PK(pk_key(&pk, "salt") || msgpack_pack_uint64(&pk, rp->cache_salt));
    if (rp->grammar) PK(pk_key(&pk, "gram") || msgpack_pack_str_with_body(&pk, rp->grammar, strlen(rp->grammar)));
    if (embed) {
        PK(pk_key(&pk, "pool") || msgpack_pack_int32(&pk, (int32_t)rp->pooling));
        PK(pk_key(&pk, "enorm") || (rp->embd_normalize ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk)));
    }
    if (kvt) {
        PK(pk_key(&pk, "kvt") || msgpack_pack_array(&pk, 7) ||
           (kt->do_remote_decode ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk)) ||
           (kt->do_remote_prefill ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk)) ||
           msgpack_pack_str_with_body(&pk, kt->remote_host, strnlen(kt->remote_host, sizeof kt->remote_host - 1)) ||
           msgpack_pack_int32(&pk, kt->remote_port) || msgpack_pack_uint64(&pk, kt->remote_engine_id) ||
           msgpack_pack_uint64(&pk, kt->remote_request_id) || msgpack_pack_int32(&pk, kt->remote_num_blocks));
    }
    return OSP_OK;
}

static osp_status encode_id(msgpack_sbuffer *buf, osp_ipc_type t, uint64_t id, uint32_t gen) {
    msgpack_packer pk;
    start(buf, &pk);
    PK(msgpack_pack_map(&pk, 3));
    PK(pk_key(&pk, "t") || msgpack_pack_uint8(&pk, (uint8_t)t));
    PK(pk_key(&pk, "id") || msgpack_pack_uint64(&pk, id));
    PK(pk_key(&pk, "gen") || msgpack_pack_uint32(&pk, gen));
    return OSP_OK;
}

osp_status osp_ipc_encode_abort(msgpack_sbuffer *buf, uint64_t id, uint32_t gen) { return encode_id(buf, OSP_IPC_ABORT, id, gen); }

osp_status osp_ipc_encode_heartbeat(msgpack_sbuffer *buf) {
    msgpack_packer pk;
    start(buf, &pk);
    PK(msgpack_pack_map(&pk, 1));
    PK(pk_key(&pk, "t") || msgpack_pack_uint8(&pk, OSP_IPC_HEARTBEAT));
    return OSP_OK;
}

osp_status osp_ipc_encode_ack(msgpack_sbuffer *buf, uint64_t id, uint32_t gen, bool ok, const char *error) {
    msgpack_packer pk;
    start(buf, &pk);
    const bool has_err = !ok && error;
    PK(msgpack_pack_map(&pk, 4 + (has_err ? 1 : 0)));
    PK(pk_key(&pk, "t") || msgpack_pack_uint8(&pk, OSP_IPC_ACK));
    PK(pk_key(&pk, "id") || msgpack_pack_uint64(&pk, id));
    PK(pk_key(&pk, "gen") || msgpack_pack_uint32(&pk, gen));
    PK(pk_key(&pk, "ok") || (ok ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk)));
    if (has_err) {
        const size_t n = strnlen(error, 159);
        PK(pk_key(&pk, "err") || msgpack_pack_str_with_body(&pk, error, n));
    }
    return OSP_OK;
}

void osp_ipc_outputs_init(osp_ipc_outputs *b) {
    msgpack_sbuffer_init(&b->body);
    b->n = 0;
}
void osp_ipc_outputs_destroy(osp_ipc_outputs *b) { msgpack_sbuffer_destroy(&b->body); }
void osp_ipc_outputs_begin(osp_ipc_outputs *b) {
    msgpack_sbuffer_clear(&b->body);
    b->n = 0;
}

static int pk_logprobs(msgpack_packer *pk, const osp_token_logprobs *lp, int32_t n) {
    if (msgpack_pack_array(pk, (size_t)n)) return -1;
    for (int32_t i = 0; i < n; i++) {
        const osp_token_logprobs *x = &lp[i];
        const int32_t nt = x->n_top < 0 ? 0 : x->n_top > OSP_ENGINE_MAX_LOGPROBS ? OSP_ENGINE_MAX_LOGPROBS : x->n_top;
        if (msgpack_pack_array(pk, 5) || msgpack_pack_int32(pk, x->token_id) || msgpack_pack_float(pk, x->logprob) ||
            msgpack_pack_int32(pk, x->rank) || msgpack_pack_array(pk, (size_t)nt))
            return -1;
        for (int32_t k = 0; k < nt; k++)
            if (msgpack_pack_int32(pk, x->top_ids[k])) return -1;
        if (msgpack_pack_array(pk, (size_t)nt)) return -1;
        for (int32_t k = 0; k < nt; k++)
            if (msgpack_pack_float(pk, x->top_logprobs[k])) return -1;
    }
    return 0;
}

osp_status osp_ipc_outputs_add(osp_ipc_outputs *b, uint64_t id, uint32_t gen, const osp_request_output *o) {
    msgpack_packer pk;
    msgpack_packer_init(&pk, &b->body, msgpack_sbuffer_write);
    const bool has_err = o->finished && o->finish_reason == OSP_FINISH_ERROR && o->error[0];
    const bool has_lp = o->logprobs && o->num_tokens > 0, has_plp = o->prompt_logprobs && o->num_prompt_logprobs > 0;
    const bool has_embd = o->finished && o->embedding && o->n_embd > 0;
    const bool has_kvt = o->finished && o->kv_transfer_num_blocks > 0;
    PK(msgpack_pack_map(&pk, 9 + has_err + has_lp + has_plp + has_embd + 2 * has_kvt));
    PK(pk_key(&pk, "id") || msgpack_pack_uint64(&pk, id));
    PK(pk_key(&pk, "gen") || msgpack_pack_uint32(&pk, gen));
    PK(pk_key(&pk, "tok") || pk_ids(&pk, o->token_ids, o->token_ids ? o->num_tokens : 0));
    PK(pk_key(&pk, "fin") || (o->finished ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk)));
    PK(pk_key(&pk, "why") || msgpack_pack_uint8(&pk, (uint8_t)(o->finished ? o->finish_reason : OSP_FINISH_NONE)));
    PK(pk_key(&pk, "nout") || msgpack_pack_int32(&pk, o->num_output_tokens));
    PK(pk_key(&pk, "np") || msgpack_pack_int32(&pk, o->num_prompt_tokens));
    PK(pk_key(&pk, "nc") || msgpack_pack_int32(&pk, o->num_cached_tokens));
    PK(pk_key(&pk, "sched") || msgpack_pack_double(&pk, o->first_scheduled_s));
    if (has_err) PK(pk_key(&pk, "err") || msgpack_pack_str_with_body(&pk, o->error, strnlen(o->error, sizeof o->error - 1)));
    if (has_lp) PK(pk_key(&pk, "lp") || pk_logprobs(&pk, o->logprobs, o->num_tokens));
    if (has_plp) PK(pk_key(&pk, "plp") || pk_logprobs(&pk, o->prompt_logprobs, o->num_prompt_logprobs));
    if (has_embd) {
        PK(pk_key(&pk, "embd") || msgpack_pack_array(&pk, (size_t)o->n_embd));
        for (int32_t i = 0; i < o->n_embd; i++) PK(msgpack_pack_float(&pk, o->embedding[i]));
    }
    if (has_kvt) {
        PK(pk_key(&pk, "kvid") || msgpack_pack_uint64(&pk, o->kv_transfer_id));
        PK(pk_key(&pk, "kvnb") || msgpack_pack_int32(&pk, o->kv_transfer_num_blocks));
    }
    b->n++;
    return OSP_OK;
}

/* The stats array: every field of osp_engine_stats that the frontend shows, in this order
 * (kv_transfer_recv_seconds as whole microseconds). */
#define N_STATS (11 + OSP_ENGINE_ITERATION_BUCKETS + 1 + 3 + OSP_SPEC_MAX_TOKENS + 9 + 8)

static void stats_to_array(const osp_engine_stats *s, int64_t *a) {
    int k = 0;
    a[k++] = s->num_steps, a[k++] = s->num_preemptions, a[k++] = s->prefix_queries_tokens, a[k++] = s->prefix_hits_tokens;
    a[k++] = s->num_generated_tokens, a[k++] = s->num_scheduled_tokens, a[k++] = s->num_blocks, a[k++] = s->num_free_blocks;
    a[k++] = s->block_size, a[k++] = s->num_running, a[k++] = s->num_waiting;
    for (int i = 0; i <= OSP_ENGINE_ITERATION_BUCKETS; i++) a[k++] = s->iteration_tokens[i];
    a[k++] = s->spec_num_drafts, a[k++] = s->spec_num_draft_tokens, a[k++] = s->spec_num_accepted_tokens;
    for (int i = 0; i < OSP_SPEC_MAX_TOKENS; i++) a[k++] = s->spec_accepted_per_pos[i];
    a[k++] = s->offload_host_blocks, a[k++] = s->offload_disk_blocks, a[k++] = s->offload_stored_blocks;
    a[k++] = s->offload_loaded_blocks, a[k++] = s->offload_corrupt_blocks, a[k++] = s->offload_hits_tokens;
    a[k++] = s->offload_skipped_tokens, a[k++] = s->offload_write_errors, a[k++] = s->offload_missing_blocks;
    a[k++] = s->kv_transfer_held, a[k++] = s->kv_transfer_held_blocks, a[k++] = s->kv_transfer_sent_blocks;
    a[k++] = s->kv_transfer_dropped, a[k++] = s->kv_transfer_recv_blocks, a[k++] = s->kv_transfer_failed_blocks;
    const double us = s->kv_transfer_recv_seconds * 1e6;
    a[k++] = us > 0 && us < 9e18 ? (int64_t)llround(us) : 0;
    a[k++] = s->kv_transfer_ipc_blocks;
}

static bool stats_from_array(const int64_t *a, osp_engine_stats *s) {
    int k = 0;
    memset(s, 0, sizeof *s);
    s->num_steps = a[k++], s->num_preemptions = a[k++], s->prefix_queries_tokens = a[k++], s->prefix_hits_tokens = a[k++];
    s->num_generated_tokens = a[k++], s->num_scheduled_tokens = a[k++];
    for (int i = 0; i < 5; i++) /* the int32 gauges */
        if (a[k + i] < 0 || a[k + i] > INT32_MAX) return false;
    s->num_blocks = (int32_t)a[k++], s->num_free_blocks = (int32_t)a[k++], s->block_size = (int32_t)a[k++];
    s->num_running = (int32_t)a[k++], s->num_waiting = (int32_t)a[k++];
    for (int i = 0; i <= OSP_ENGINE_ITERATION_BUCKETS; i++) s->iteration_tokens[i] = a[k++];
    s->spec_num_drafts = a[k++], s->spec_num_draft_tokens = a[k++], s->spec_num_accepted_tokens = a[k++];
    for (int i = 0; i < OSP_SPEC_MAX_TOKENS; i++) s->spec_accepted_per_pos[i] = a[k++];
    s->offload_host_blocks = a[k++], s->offload_disk_blocks = a[k++], s->offload_stored_blocks = a[k++];
    s->offload_loaded_blocks = a[k++], s->offload_corrupt_blocks = a[k++], s->offload_hits_tokens = a[k++];
    s->offload_skipped_tokens = a[k++], s->offload_write_errors = a[k++], s->offload_missing_blocks = a[k++];
    s->kv_transfer_held = a[k++], s->kv_transfer_held_blocks = a[k++], s->kv_transfer_sent_blocks = a[k++];
    s->kv_transfer_dropped = a[k++], s->kv_transfer_recv_blocks = a[k++], s->kv_transfer_failed_blocks = a[k++];
    s->kv_transfer_recv_seconds = (double)a[k++] * 1e-6;
    s->kv_transfer_ipc_blocks = a[k++];
    return true;
}

osp_status osp_ipc_outputs_finish(osp_ipc_outputs *b, const osp_engine_stats *st, msgpack_sbuffer *out) {
    msgpack_packer pk;
    start(out, &pk);
    PK(msgpack_pack_map(&pk, 3));
    PK(pk_key(&pk, "t") || msgpack_pack_uint8(&pk, OSP_IPC_OUTPUTS));
    PK(pk_key(&pk, "outs") || msgpack_pack_array(&pk, (size_t)b->n));
    if (b->body.size) PK(msgpack_sbuffer_write(out, b->body.data, b->body.size));
    int64_t a[N_STATS];
    stats_to_array(st, a);
    PK(pk_key(&pk, "stats") || msgpack_pack_array(&pk, N_STATS));
    for (int i = 0; i < N_STATS; i++) PK(msgpack_pack_int64(&pk, a[i]));
    return OSP_OK;
}

/* ---- decoding: a bounded reader ---------------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t n, at;
} rd;

typedef enum { K_NIL, K_BOOL, K_UINT, K_INT, K_FLOAT, K_STR, K_BIN, K_ARRAY, K_MAP } kind;

typedef struct val {
    kind k;
    uint64_t u;      /* K_UINT, K_BOOL (0/1), lengths (STR BIN ARRAY MAP) */
    int64_t i;       /* K_INT (negative) */
    double f;        /* K_FLOAT */
    const uint8_t *b; /* STR BIN: the bytes (within the message) */
} val;

#define BAD(...) osp_set_error(OSP_ERR_FORMAT, "ipc: " __VA_ARGS__)

static bool be(rd *r, int nbytes, uint64_t *v) {
    if (r->n - r->at < (size_t)nbytes) return false;
    uint64_t x = 0;
    for (int i = 0; i < nbytes; i++) x = x << 8 | r->p[r->at + (size_t)i];
    r->at += (size_t)nbytes;
    *v = x;
    return true;
}

/* One header (and a STR/BIN body). Lengths are checked against the bytes left: a container of n
 * elements needs at least n bytes (2n for a map). */
static osp_status next(rd *r, val *v) {
    memset(v, 0, sizeof *v);
    if (r->at >= r->n) return BAD("truncated message");
    const uint8_t c = r->p[r->at++];
    uint64_t x = 0;
    if (c <= 0x7f) return v->k = K_UINT, v->u = c, OSP_OK;
    if (c >= 0xe0) return v->k = K_INT, v->i = (int8_t)c, OSP_OK;
    if ((c & 0xf0) == 0x80) v->k = K_MAP, x = c & 0x0f;
    else if ((c & 0xf0) == 0x90) v->k = K_ARRAY, x = c & 0x0f;
    else if ((c & 0xe0) == 0xa0) v->k = K_STR, x = c & 0x1f;
    else switch (c) {
        case 0xc0: return v->k = K_NIL, OSP_OK;
        case 0xc2: case 0xc3: return v->k = K_BOOL, v->u = c == 0xc3, OSP_OK;
        case 0xc4: case 0xc5: case 0xc6:
            v->k = K_BIN;
            if (!be(r, 1 << (c - 0xc4), &x)) return BAD("truncated bin length");
            break;
        case 0xca: {
            uint64_t b;
            if (!be(r, 4, &b)) return BAD("truncated float32");
            const uint32_t u = (uint32_t)b;
            float f;
            memcpy(&f, &u, 4);
            return v->k = K_FLOAT, v->f = f, OSP_OK;
        }
        case 0xcb: {
            uint64_t b;
            if (!be(r, 8, &b)) return BAD("truncated float64");
            double d;
            memcpy(&d, &b, 8);
            return v->k = K_FLOAT, v->f = d, OSP_OK;
        }
        case 0xcc: case 0xcd: case 0xce: case 0xcf:
            if (!be(r, 1 << (c - 0xcc), &x)) return BAD("truncated uint");
            return v->k = K_UINT, v->u = x, OSP_OK;
        case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
            const int nb = 1 << (c - 0xd0);
            if (!be(r, nb, &x)) return BAD("truncated int");
            int64_t s = nb == 8 ? (int64_t)x : (int64_t)(x ^ (1ull << (8 * nb - 1))) - (int64_t)(1ull << (8 * nb - 1));
            if (s >= 0) return v->k = K_UINT, v->u = (uint64_t)s, OSP_OK;
            return v->k = K_INT, v->i = s, OSP_OK;
        }
        case 0xd9: case 0xda: case 0xdb:
            v->k = K_STR;
            if (!be(r, 1 << (c - 0xd9), &x)) return BAD("truncated str length");
            break;
        case 0xdc: case 0xdd:
            v->k = K_ARRAY;
            if (!be(r, 2 << (c - 0xdc), &x)) return BAD("truncated array length");
            break;
        case 0xde: case 0xdf:
            v->k = K_MAP;
            if (!be(r, 2 << (c - 0xde), &x)) return BAD("truncated map length");
            break;
        default: return BAD("msgpack type 0x%02x is not used in these messages", c);
        }
    const size_t left = r->n - r->at;
    v->u = x;
    if (v->k == K_STR || v->k == K_BIN) {
        if (x > left) return BAD("a %s of %llu bytes with %zu left", v->k == K_STR ? "str" : "bin", (unsigned long long)x, left);
        v->b = r->p + r->at;
        r->at += (size_t)x;
    } else if (x > left || (v->k == K_MAP && x > left / 2)) {
        return BAD("a container of %llu entries with %zu bytes left", (unsigned long long)x, left);
    }
    return OSP_OK;
}

static osp_status want(rd *r, val *v, kind k, const char *what) {
    OSP_TRY(next(r, v));
    if (v->k != k) return BAD("%s has the wrong type", what);
    return OSP_OK;
}

static osp_status get_u64(rd *r, uint64_t *out, const char *what) {
    val v;
    OSP_TRY(want(r, &v, K_UINT, what));
    *out = v.u;
    return OSP_OK;
}

static osp_status get_i32(rd *r, int32_t lo, int32_t hi, int32_t *out, const char *what) {
    val v;
    OSP_TRY(next(r, &v));
    int64_t x;
    if (v.k == K_UINT && v.u <= INT32_MAX) x = (int64_t)v.u;
    else if (v.k == K_INT) x = v.i;
    else return BAD("%s is not an int32", what);
    if (x < lo || x > hi) return BAD("%s is %lld, outside [%d, %d]", what, (long long)x, lo, hi);
    *out = (int32_t)x;
    return OSP_OK;
}

static osp_status get_i64(rd *r, int64_t *out, const char *what) {
    val v;
    OSP_TRY(next(r, &v));
    if (v.k == K_UINT && v.u <= INT64_MAX) *out = (int64_t)v.u;
    else if (v.k == K_INT) *out = v.i;
    else return BAD("%s is not an int64", what);
    return OSP_OK;
}

static osp_status get_f(rd *r, double *out, const char *what) {
    val v;
    OSP_TRY(next(r, &v));
    if (v.k == K_FLOAT) *out = v.f;
    else if (v.k == K_UINT) *out = (double)v.u;
    else if (v.k == K_INT) *out = (double)v.i;
    else return BAD("%s is not a number", what);
    return OSP_OK;
}

static osp_status get_bool(rd *r, bool *out, const char *what) {
    val v;
    OSP_TRY(want(r, &v, K_BOOL, what));
    *out = v.u != 0;
    return OSP_OK;
}

/* A string into a fixed buffer (at most cap - 1 bytes, NUL-free). */
static osp_status get_text(rd *r, char *out, size_t cap, const char *what) {
    val v;
    OSP_TRY(want(r, &v, K_STR, what));
    if (v.u >= cap) return BAD("%s is %llu bytes, more than %zu", what, (unsigned long long)v.u, cap - 1);
    if (memchr(v.b, 0, (size_t)v.u)) return BAD("%s holds a NUL byte", what);
    memcpy(out, v.b, (size_t)v.u);
    out[v.u] = 0;
    return OSP_OK;
}

/* Token ids: bin of n * 4 bytes, n <= max, every id >= 0. *out malloc'd (NULL when n is 0). */
static osp_status get_ids(rd *r, int32_t max, int32_t **out, int32_t *n, const char *what) {
    val v;
    OSP_TRY(want(r, &v, K_BIN, what));
    if (v.u % 4) return BAD("%s is %llu bytes, not a multiple of 4", what, (unsigned long long)v.u);
    if (v.u / 4 > (uint64_t)max) return BAD("%s holds %llu ids, more than %d", what, (unsigned long long)(v.u / 4), max);
    *n = (int32_t)(v.u / 4);
    *out = NULL;
    if (*n == 0) return OSP_OK;
    int32_t *a = malloc(sizeof *a * (size_t)*n);
    if (!a) return osp_set_error(OSP_ERR_NOMEM, "ipc: out of memory");
    for (int32_t i = 0; i < *n; i++) {
        const uint8_t *b = v.b + 4 * i;
        const uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        if (u > INT32_MAX) {
            free(a);
            return BAD("%s[%d] is negative", what, i);
        }
        a[i] = (int32_t)u;
    }
    *out = a;
    return OSP_OK;
}

/* The key of the next map entry, as an index into names[] (each name once: *seen is the bitmask). */
static osp_status get_key(rd *r, const char *const *names, int n_names, uint64_t *seen, int *idx) {
    val v;
    OSP_TRY(want(r, &v, K_STR, "a map key"));
    for (int i = 0; i < n_names; i++)
        if (strlen(names[i]) == v.u && memcmp(names[i], v.b, (size_t)v.u) == 0) {
            if (*seen >> i & 1) return BAD("field '%s' repeated", names[i]);
            *seen |= 1ull << i;
            *idx = i;
            return OSP_OK;
        }
    return BAD("unknown field '%.*s'", (int)(v.u > 32 ? 32 : v.u), (const char *)v.b);
}

static osp_status get_logprobs(rd *r, int32_t max, osp_token_logprobs **out, int32_t *n_out, const char *what) {
    val v;
    OSP_TRY(want(r, &v, K_ARRAY, what));
    /* an entry takes at least 6 bytes: bounds the calloc to ~30x the message */
    if (v.u > (uint64_t)max || v.u > (r->n - r->at) / 6)
        return BAD("%s has %llu entries, more than %d or the bytes left allow", what, (unsigned long long)v.u, max);
    const int32_t n = (int32_t)v.u;
    *n_out = n;
    if (n == 0) return OSP_OK;
    osp_token_logprobs *a = calloc((size_t)n, sizeof *a);
    if (!a) return osp_set_error(OSP_ERR_NOMEM, "ipc: out of memory");
    *out = a; /* owned by the message from here: freed with it on error too */
    for (int32_t i = 0; i < n; i++) {
        osp_token_logprobs *x = &a[i];
        OSP_TRY(want(r, &v, K_ARRAY, what));
        if (v.u != 5) return BAD("%s entry %d has %llu fields, not 5", what, i, (unsigned long long)v.u);
        double f = 0;
        OSP_TRY(get_i32(r, 0, INT32_MAX, &x->token_id, "logprob token_id"));
        OSP_TRY(get_f(r, &f, "logprob"));
        if (!(f <= 0 && f >= -1e30)) return BAD("%s entry %d: logprob %g is not in [-1e30, 0]", what, i, f);
        x->logprob = (float)f;
        OSP_TRY(get_i32(r, 0, INT32_MAX, &x->rank, "logprob rank"));
        OSP_TRY(want(r, &v, K_ARRAY, "top ids"));
        if (v.u > OSP_ENGINE_MAX_LOGPROBS) return BAD("%s entry %d: %llu top entries", what, i, (unsigned long long)v.u);
        x->n_top = (int32_t)v.u;
        for (int32_t k = 0; k < x->n_top; k++) OSP_TRY(get_i32(r, 0, INT32_MAX, &x->top_ids[k], "top id"));
        OSP_TRY(want(r, &v, K_ARRAY, "top logprobs"));
        if (v.u != (uint64_t)x->n_top) return BAD("%s entry %d: %llu top logprobs for %d ids", what, i, (unsigned long long)v.u, x->n_top);
        for (int32_t k = 0; k < x->n_top; k++) {
            OSP_TRY(get_f(r, &f, "top logprob"));
            if (!(f <= 0 && f >= -1e30)) return BAD("%s entry %d: top logprob %g is not in [-1e30, 0]", what, i, f);
            x->top_logprobs[k] = (float)f;
        }
    }
    return OSP_OK;
}

static osp_status dec_output(rd *r, const osp_ipc_limits *lim, osp_ipc_output *o) {
    static const char *const names[] = {"id", "gen", "tok", "fin", "why", "nout", "np", "nc", "sched", "err", "lp", "plp",
                                        "embd", "kvid", "kvnb"};
    val v;
    OSP_TRY(want(r, &v, K_MAP, "an output"));
    const uint64_t n = v.u;
    uint64_t seen = 0;
    int32_t why = 0, n_lp = 0;
    for (uint64_t e = 0; e < n; e++) {
        int k = 0;
        OSP_TRY(get_key(r, names, 15, &seen, &k));
        switch (k) {
        case 0: OSP_TRY(get_u64(r, &o->id, "id")); break;
        case 1: {
            uint64_t g;
            OSP_TRY(get_u64(r, &g, "gen"));
            if (g > UINT32_MAX) return BAD("gen %llu is above 2^32", (unsigned long long)g);
            o->gen = (uint32_t)g;
            break;
        }
        case 2: OSP_TRY(get_ids(r, lim->max_tokens, &o->tokens, &o->num_tokens, "tok")); break;
        case 3: OSP_TRY(get_bool(r, &o->finished, "fin")); break;
        case 4: OSP_TRY(get_i32(r, 0, OSP_FINISH_ERROR, &why, "why")); break;
        case 5: OSP_TRY(get_i32(r, 0, INT32_MAX, &o->num_output_tokens, "nout")); break;
        case 6: OSP_TRY(get_i32(r, 0, INT32_MAX, &o->num_prompt_tokens, "np")); break;
        case 7: OSP_TRY(get_i32(r, 0, INT32_MAX, &o->num_cached_tokens, "nc")); break;
        case 8:
            OSP_TRY(get_f(r, &o->first_scheduled_s, "sched"));
            if (!isfinite(o->first_scheduled_s) || o->first_scheduled_s < 0) return BAD("sched is not a time");
            break;
        case 9: OSP_TRY(get_text(r, o->error, sizeof o->error, "err")); break;
        case 10: OSP_TRY(get_logprobs(r, lim->max_tokens, &o->logprobs, &n_lp, "lp")); break;
        case 11: OSP_TRY(get_logprobs(r, lim->max_prompt, &o->prompt_logprobs, &o->num_prompt_logprobs, "plp")); break;
        case 13: OSP_TRY(get_u64(r, &o->kv_transfer_id, "kvid")); break;
        case 14: OSP_TRY(get_i32(r, 1, INT32_MAX, &o->kv_transfer_num_blocks, "kvnb")); break;
        default: {
            OSP_TRY(want(r, &v, K_ARRAY, "embd"));
            if (v.u == 0 || v.u > 1u << 20) return BAD("embd has %llu values", (unsigned long long)v.u);
            if (!(o->embedding = malloc(sizeof *o->embedding * (size_t)v.u)))
                return osp_set_error(OSP_ERR_NOMEM, "ipc: out of memory");
            o->n_embd = (int32_t)v.u;
            for (int32_t i = 0; i < o->n_embd; i++) {
                double f = 0;
                OSP_TRY(get_f(r, &f, "an embedding value"));
                if (!isfinite(f) || fabs(f) > 3.4e38) return BAD("embd value %d is not a finite float", i);
                o->embedding[i] = (float)f;
            }
            break;
        }
        }
    }
    if (o->embedding && (why != OSP_FINISH_STOP || o->num_tokens > 0))
        return BAD("an output has embd without finishing (stop, no tokens)");
    if ((seen & 0x1ff) != 0x1ff) return BAD("an output lacks one of id, gen, tok, fin, why, nout, np, nc, sched");
    if (o->finished != (why != OSP_FINISH_NONE)) return BAD("an output's fin and why disagree");
    if (o->error[0] && why != OSP_FINISH_ERROR) return BAD("an output has err without finishing on an error");
    if (o->logprobs && n_lp != o->num_tokens) return BAD("an output has %d logprobs for %d tokens", n_lp, o->num_tokens);
    if ((seen >> 13 & 1) != (seen >> 14 & 1)) return BAD("an output has one of kvid and kvnb without the other");
    if ((seen >> 13 & 1) && !o->finished) return BAD("an output has kvid without finishing");
    o->finish_reason = (osp_finish_reason)why;
    return OSP_OK;
}

static osp_status dec_add(rd *r, uint64_t n, const osp_ipc_limits *lim, osp_ipc_msg *m) {
    static const char *const names[] = {"id", "gen", "prompt", "temp", "top_k", "top_p", "min_p", "pres", "freq",
                                        "rep", "bias", "seed", "n", "sidx", "lp", "plp", "max", "min", "ieos",
                                        "stop", "prio", "salt", "gram", "pool", "enorm", "kvt"};
    osp_request_params *rp = &m->rp;
    *rp = osp_request_default_params();
    uint64_t seen = 0;
    for (uint64_t e = 0; e < n; e++) {
        int k = 0;
        double f = 0;
        val v;
        OSP_TRY(get_key(r, names, 26, &seen, &k));
        switch (k) {
        case 0: OSP_TRY(get_u64(r, &m->id, "id")); break;
        case 1: {
            uint64_t g;
            OSP_TRY(get_u64(r, &g, "gen"));
            if (g > UINT32_MAX) return BAD("gen %llu is above 2^32", (unsigned long long)g);
            m->gen = (uint32_t)g;
            break;
        }
        case 2: OSP_TRY(get_ids(r, lim->max_prompt, &m->prompt, &rp->num_prompt, "prompt")); break;
        case 3: case 5: case 6: case 7: case 8: case 9:
            OSP_TRY(get_f(r, &f, names[k]));
            if (!isfinite(f) || fabs(f) > 1e30) return BAD("%s is not a finite number", names[k]);
            if (k == 3) rp->temperature = (float)f;
            else if (k == 5) rp->top_p = (float)f;
            else if (k == 6) rp->min_p = (float)f;
            else if (k == 7) rp->presence_penalty = (float)f;
            else if (k == 8) rp->frequency_penalty = (float)f;
            else rp->repetition_penalty = (float)f;
            break; /* ranges: osp_engine_add checks them as for any caller */
        case 4: OSP_TRY(get_i32(r, INT32_MIN, INT32_MAX, &rp->top_k, "top_k")); break;
        case 10: {
            OSP_TRY(want(r, &v, K_ARRAY, "bias"));
            if (v.u > 1u << 20) return BAD("bias has %llu entries", (unsigned long long)v.u);
            const int32_t nb = (int32_t)v.u;
            if (nb && !(m->bias = calloc((size_t)nb, sizeof *m->bias))) return osp_set_error(OSP_ERR_NOMEM, "ipc: out of memory");
            for (int32_t i = 0; i < nb; i++) {
                OSP_TRY(want(r, &v, K_ARRAY, "a bias entry"));
                if (v.u != 2) return BAD("a bias entry is not [id, bias]");
                OSP_TRY(get_i32(r, 0, INT32_MAX, &m->bias[i].token_id, "bias id"));
                OSP_TRY(get_f(r, &f, "bias"));
                if (!isfinite(f) || fabs(f) > 1e30) return BAD("bias is not a finite number");
                m->bias[i].bias = (float)f;
            }
            rp->logit_bias = m->bias;
            rp->num_logit_bias = nb;
            break;
        }
        case 11: OSP_TRY(get_u64(r, &rp->seed, "seed")); rp->has_seed = true; break;
        case 12: OSP_TRY(get_i32(r, 0, INT32_MAX, &rp->n, "n")); break;
        case 13: {
            uint64_t s;
            OSP_TRY(get_u64(r, &s, "sidx"));
            if (s > UINT32_MAX) return BAD("sidx is above 2^32");
            rp->sample_index = (uint32_t)s;
            break;
        }
        case 14: OSP_TRY(get_i32(r, -1, OSP_ENGINE_MAX_LOGPROBS, &rp->logprobs, "lp")); break;
        case 15: OSP_TRY(get_i32(r, -1, OSP_ENGINE_MAX_LOGPROBS, &rp->prompt_logprobs, "plp")); break;
        case 16: OSP_TRY(get_i32(r, INT32_MIN, INT32_MAX, &rp->max_tokens, "max")); break;
        case 17: OSP_TRY(get_i32(r, 0, INT32_MAX, &rp->min_tokens, "min")); break;
        case 18: OSP_TRY(get_bool(r, &rp->ignore_eos, "ieos")); break;
        case 19: OSP_TRY(get_ids(r, 1 << 16, &m->stop_ids, &rp->num_stop_token_ids, "stop")); rp->stop_token_ids = m->stop_ids; break;
        case 20: OSP_TRY(get_i32(r, INT32_MIN, INT32_MAX, &rp->priority, "prio")); break;
        case 21: OSP_TRY(get_u64(r, &rp->cache_salt, "salt")); break;
        case 23: {
            int32_t p = 0;
            OSP_TRY(get_i32(r, OSP_POOLING_MEAN, OSP_POOLING_LAST, &p, "pool"));
            rp->pooling = (osp_pooling)p;
            break;
        }
        case 24: OSP_TRY(get_bool(r, &rp->embd_normalize, "enorm")); break;
        case 25: {
            OSP_TRY(want(r, &v, K_ARRAY, "kvt"));
            if (v.u != 7) return BAD("kvt has %llu fields, not 7", (unsigned long long)v.u);
            osp_kv_transfer_params *kt = calloc(1, sizeof *kt);
            if (!kt) return osp_set_error(OSP_ERR_NOMEM, "ipc: out of memory");
            m->kvt = kt; /* owned by the message from here: freed with it on error too */
            OSP_TRY(get_bool(r, &kt->do_remote_decode, "kvt do_remote_decode"));
            OSP_TRY(get_bool(r, &kt->do_remote_prefill, "kvt do_remote_prefill"));
            OSP_TRY(get_text(r, kt->remote_host, sizeof kt->remote_host, "kvt remote_host"));
            OSP_TRY(get_i32(r, 0, 65535, &kt->remote_port, "kvt remote_port"));
            OSP_TRY(get_u64(r, &kt->remote_engine_id, "kvt remote_engine_id"));
            OSP_TRY(get_u64(r, &kt->remote_request_id, "kvt remote_request_id"));
            OSP_TRY(get_i32(r, 0, INT32_MAX, &kt->remote_num_blocks, "kvt remote_num_blocks"));
            if (!kt->do_remote_decode && !kt->do_remote_prefill) return BAD("kvt sets neither do_remote_decode nor do_remote_prefill");
            rp->kv_transfer = kt;
            break;
        }
        default:
            OSP_TRY(want(r, &v, K_STR, "gram"));
            if (v.u > (uint64_t)lim->max_grammar) return BAD("gram is %llu bytes", (unsigned long long)v.u);
            if (memchr(v.b, 0, (size_t)v.u)) return BAD("gram holds a NUL byte");
            if (!(m->grammar = malloc((size_t)v.u + 1))) return osp_set_error(OSP_ERR_NOMEM, "ipc: out of memory");
            memcpy(m->grammar, v.b, (size_t)v.u);
            m->grammar[v.u] = 0;
            rp->grammar = m->grammar;
            break;
        }
    }
    if ((seen & 0x7) != 0x7) return BAD("ADD lacks id, gen or prompt");
    if ((seen >> 24 & 1) && !(seen >> 23 & 1)) return BAD("ADD has enorm without pool");
    rp->request_id = m->id;
    rp->prompt = m->prompt;
    return OSP_OK;
}

osp_status osp_ipc_decode(const void *data, size_t len, const osp_ipc_limits *lim_in, osp_ipc_msg *m) {
    memset(m, 0, sizeof *m);
    const osp_ipc_limits lim = lim_in ? *lim_in : osp_ipc_default_limits();
    rd r = {.p = data, .n = data ? len : 0};
    val v;
    osp_status s;
    uint64_t seen = 0;
    int k = 0;
    if ((s = want(&r, &v, K_MAP, "the message")) != OSP_OK) goto fail;
    const uint64_t n = v.u;
    static const char *const tkey[] = {"t"};
    if (n == 0) {
        s = BAD("an empty map");
        goto fail;
    }
    if ((s = get_key(&r, tkey, 1, &seen, &k)) != OSP_OK) goto fail;
    int32_t t = 0;
    if ((s = get_i32(&r, OSP_IPC_HELLO, OSP_IPC_OUTPUTS, &t, "the message type t")) != OSP_OK) goto fail;
    m->type = (osp_ipc_type)t;
    seen = 0;
    switch (m->type) {
    case OSP_IPC_HELLO: {
        static const char *const names[] = {"fe"};
        for (uint64_t e = 1; e < n && s == OSP_OK; e++) {
            uint64_t fe = 0;
            if ((s = get_key(&r, names, 1, &seen, &k)) == OSP_OK && (s = get_u64(&r, &fe, "fe")) == OSP_OK && fe > 255)
                s = BAD("fe %llu is above 255", (unsigned long long)fe);
            m->fe = (uint32_t)fe;
        }
        if (s == OSP_OK && seen != 1) s = BAD("HELLO lacks fe");
        break;
    }
    case OSP_IPC_READY: {
        static const char *const names[] = {"epoch", "mml", "vocab", "nb", "bs", "pid", "kv"};
        for (uint64_t e = 1; e < n && s == OSP_OK; e++) {
            if ((s = get_key(&r, names, 7, &seen, &k)) != OSP_OK) break;
            uint64_t u = 0;
            switch (k) {
            case 0:
                if ((s = get_u64(&r, &u, "epoch")) == OSP_OK && u > UINT32_MAX) s = BAD("epoch is above 2^32");
                m->ready.epoch = (uint32_t)u;
                break;
            case 1: s = get_i32(&r, 2, INT32_MAX, &m->ready.max_model_len, "mml"); break;
            case 2: s = get_i32(&r, 1, INT32_MAX, &m->ready.n_vocab, "vocab"); break;
            case 3: s = get_i32(&r, 1, INT32_MAX, &m->ready.num_blocks, "nb"); break;
            case 4: s = get_i32(&r, 1, INT32_MAX, &m->ready.block_size, "bs"); break;
            case 5: s = get_i64(&r, &m->ready.pid, "pid"); break;
            default: {
                osp_kv_transfer_info *kv = &m->ready.kv;
                int32_t role = 0;
                if ((s = want(&r, &v, K_ARRAY, "kv")) == OSP_OK && v.u != 4) s = BAD("kv has %llu fields, not 4", (unsigned long long)v.u);
                if (s == OSP_OK) s = get_i32(&r, OSP_KV_ROLE_PRODUCER, OSP_KV_ROLE_BOTH, &role, "kv role");
                if (s == OSP_OK) s = get_text(&r, kv->host, sizeof kv->host, "kv host");
                if (s == OSP_OK) s = get_i32(&r, 0, 65535, &kv->port, "kv port");
                if (s == OSP_OK) s = get_u64(&r, &kv->engine_id, "kv engine_id");
                kv->role = (osp_kv_role)role;
                break;
            }
            }
        }
        if (s == OSP_OK && (seen & 0x3f) != 0x3f) s = BAD("READY lacks a field");
        break;
    }
    case OSP_IPC_ADD: s = dec_add(&r, n - 1, &lim, m); break;
    case OSP_IPC_ABORT:
    case OSP_IPC_ACK: {
        static const char *const names[] = {"id", "gen", "ok", "err"};
        const int nn = m->type == OSP_IPC_ACK ? 4 : 2;
        for (uint64_t e = 1; e < n && s == OSP_OK; e++) {
            if ((s = get_key(&r, names, nn, &seen, &k)) != OSP_OK) break;
            uint64_t u = 0;
            if (k == 0) s = get_u64(&r, &m->id, "id");
            else if (k == 1) {
                if ((s = get_u64(&r, &u, "gen")) == OSP_OK && u > UINT32_MAX) s = BAD("gen is above 2^32");
                m->gen = (uint32_t)u;
            } else if (k == 2) s = get_bool(&r, &m->ok, "ok");
            else s = get_text(&r, m->error, sizeof m->error, "err");
        }
        if (s == OSP_OK && (seen & 3) != 3) s = BAD("a message lacks id or gen");
        if (s == OSP_OK && m->type == OSP_IPC_ACK && !(seen & 4)) s = BAD("ACK lacks ok");
        if (s == OSP_OK && m->ok && m->error[0]) s = BAD("ACK ok with an error");
        break;
    }
    case OSP_IPC_HEARTBEAT:
        if (n != 1) s = BAD("HEARTBEAT has fields");
        break;
    case OSP_IPC_OUTPUTS: {
        static const char *const names[] = {"outs", "stats"};
        for (uint64_t e = 1; e < n && s == OSP_OK; e++) {
            if ((s = get_key(&r, names, 2, &seen, &k)) != OSP_OK) break;
            if (k == 0) {
                if ((s = want(&r, &v, K_ARRAY, "outs")) != OSP_OK) break;
                /* an entry takes at least 40 bytes (its 9 required fields): bounds the calloc */
                if (v.u > (uint64_t)lim.max_outputs || v.u > (r.n - r.at) / 40) {
                    s = BAD("outs has %llu entries, more than %d", (unsigned long long)v.u, lim.max_outputs);
                    break;
                }
                if (v.u && !(m->outs = calloc((size_t)v.u, sizeof *m->outs))) {
                    s = osp_set_error(OSP_ERR_NOMEM, "ipc: out of memory");
                    break;
                }
                for (uint64_t i = 0; i < v.u && s == OSP_OK; i++) {
                    s = dec_output(&r, &lim, &m->outs[i]);
                    m->n_outs = (int32_t)i + 1;
                }
            } else {
                if ((s = want(&r, &v, K_ARRAY, "stats")) != OSP_OK) break;
                if (v.u != N_STATS) {
                    s = BAD("stats has %llu entries, not %d", (unsigned long long)v.u, N_STATS);
                    break;
                }
                int64_t a[N_STATS];
                for (int i = 0; i < N_STATS && s == OSP_OK; i++)
                    if ((s = get_i64(&r, &a[i], "a stat")) == OSP_OK && a[i] < 0) s = BAD("stat %d is negative", i);
                if (s == OSP_OK && !stats_from_array(a, &m->stats)) s = BAD("a stats gauge is above 2^31");
                m->has_stats = true;
            }
        }
        if (s == OSP_OK && !(seen & 1)) s = BAD("OUTPUTS lacks outs");
        break;
    }
    }
    if (s == OSP_OK && r.at != r.n) s = BAD("%zu bytes after the message", r.n - r.at);
    if (s != OSP_OK) goto fail;
    return OSP_OK;
fail:
    osp_ipc_msg_free(m);
    return s;
}

void osp_ipc_msg_free(osp_ipc_msg *m) {
    if (!m) return;
    free(m->prompt);
    free(m->stop_ids);
    free(m->bias);
    free(m->grammar);
    free(m->kvt);
    for (int32_t i = 0; i < m->n_outs; i++) {
        free(m->outs[i].tokens);
        free(m->outs[i].logprobs);
        free(m->outs[i].prompt_logprobs);
        free(m->outs[i].embedding);
    }
    free(m->outs);
    memset(m, 0, sizeof *m);
}
