/* osprey serve: jobs, the state between a connection thread and the engine's loop thread.
 *
 * A generation request becomes a job with one engine request per choice (n per prompt; choice k of a
 * prompt is the engine's child k, so seeded choices match the engine's own n). The engine callback
 * (loop thread) appends token ids and logprobs to the choice's inbox under the job's mutex and
 * signals; the connection thread's pump moves them out, detokenizes and checks stop strings
 * (srv_text), ending a choice and aborting its engine request at a stop. The job is reference counted
 * (the connection + every engine request not yet finished): whoever drops the last reference frees
 * it, so a client that goes away leaves nothing behind once its aborted requests end. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "osprey_internal.h"
#include "serve_internal.h"

/* ---- request ids ---------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) { /* the splitmix64 finalizer: a bijection on 64-bit words */
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return x;
}

void srv_id_key_init(srv_id_key *k) {
    uint64_t w[2] = {0, 0};
    size_t got = 0;
    while (got < sizeof w) {
        const ssize_t n = getrandom((char *)w + got, sizeof w - got, 0);
        if (n > 0) got += (size_t)n;
        else if (n < 0 && errno == EINTR) continue;
        else break;
    }
    if (got < sizeof w) {
        const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            while (got < sizeof w) {
                const ssize_t n = read(fd, (char *)w + got, sizeof w - got);
                if (n > 0) got += (size_t)n;
                else if (n < 0 && errno == EINTR) continue;
                else break;
            }
            close(fd);
        }
    }
    if (got < sizeof w) { /* no entropy source: the clock, the pid and an address, mixed */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        w[0] ^= mix64(t ^ ((uint64_t)getpid() << 32));
        w[1] ^= mix64(w[0] + (uint64_t)(uintptr_t)k);
    }
    k->prefix = w[0];
    k->offset = w[1];
}

void srv_id_format(char *out, size_t cap, const char *kind, const srv_id_key *k, uint64_t n) {
    snprintf(out, cap, "%s-%016llx%016llx", kind, (unsigned long long)k->prefix,
             (unsigned long long)mix64(k->offset + n));
}

static void job_free(srv_job *j) {
    srv_server *srv = j->srv;
    pthread_mutex_lock(&srv->mu);
    srv->live_jobs--;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
    for (int32_t i = 0; i < j->n_seqs; i++) {
        free(j->seqs[i].inbox);
        free(j->seqs[i].work);
        free(j->seqs[i].lp_inbox);
        free(j->seqs[i].lp_work);
        free(j->seqs[i].plp_inbox);
        json_decref(j->seqs[i].lp);
        free(j->seqs[i].embd);
        srv_text_free(&j->seqs[i].text);
    }
    if (j->echo)
        for (int32_t i = 0; i < j->req.n_prompts; i++) free(j->echo[i]);
    free(j->echo);
    free(j->prompt_lens);
    free(j->seqs);
    free(j->out);
    json_decref(j->resp_final);
    srv_gen_request_free(&j->req);
    srv_park_destroy(&j->park);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

/* Engine loop thread (or the core client's I/O thread): append the new tokens to the choice's inbox.
 * core_lost: the core process died and this is the client's final output for the choice. */
static void on_output_any(srv_seq *s, const osp_request_output *o, bool core_lost) {
    srv_job *j = s->job;
    srv_server *srv = j->srv;
    const double t = srv_now_s();
    bool free_it = false;
    pthread_mutex_lock(&j->mu);
    if (j->prompt_lp && o->prompt_logprobs && o->num_prompt_logprobs > 0 && !s->plp_inbox) {
        s->plp_inbox = malloc(sizeof *s->plp_inbox * (size_t)o->num_prompt_logprobs);
        if (s->plp_inbox) {
            memcpy(s->plp_inbox, o->prompt_logprobs, sizeof *s->plp_inbox * (size_t)o->num_prompt_logprobs);
            s->n_plp_inbox = o->num_prompt_logprobs;
        }
    }
    if (o->num_tokens > 0) {
        if (s->n_inbox + o->num_tokens > s->cap_inbox) {
            int32_t cap = s->cap_inbox ? s->cap_inbox : 16;
            while (cap < s->n_inbox + o->num_tokens) cap *= 2;
            int32_t *p = realloc(s->inbox, sizeof(int32_t) * (size_t)cap);
            if (p) s->inbox = p;
            osp_token_logprobs *q = j->req.logprobs >= 0 ? realloc(s->lp_inbox, sizeof *q * (size_t)cap) : NULL;
            if (q) s->lp_inbox = q;
            if (p && (q || j->req.logprobs < 0)) s->cap_inbox = cap;
        }
        if (s->n_inbox + o->num_tokens <= s->cap_inbox) {
            memcpy(s->inbox + s->n_inbox, o->token_ids, sizeof(int32_t) * (size_t)o->num_tokens);
            if (s->lp_inbox && o->logprobs)
                memcpy(s->lp_inbox + s->n_inbox, o->logprobs, sizeof *o->logprobs * (size_t)o->num_tokens);
            s->n_inbox += o->num_tokens;
        }
        if (j->t_first == 0) {
            j->t_first = t;
            srv_metrics_observe_ttft(srv->metrics, t - j->t_arrival);
        }
    }
    if (o->embedding && o->n_embd > 0 && !s->embd && (s->embd = malloc(sizeof(float) * (size_t)o->n_embd))) {
        memcpy(s->embd, o->embedding, sizeof(float) * (size_t)o->n_embd);
        s->n_embd = o->n_embd;
    }
    if (o->first_scheduled_s > 0 && s->t_sched == 0) s->t_sched = o->first_scheduled_s;
    if (o->num_cached_tokens > s->n_cached) s->n_cached = o->num_cached_tokens;
    if (o->num_tokens > 0 && s->t_first_tok == 0) s->t_first_tok = t;
    if (o->finished) {
        /* vLLM's phases: queued (added -> scheduled), prefill (-> first token), decode (-> finished),
         * inference (scheduled -> finished); one that never began is not observed */
        const bool sched = s->t_sched > 0 && s->t_added > 0, tok = s->t_first_tok > 0;
        srv_metrics_observe_phases(srv->metrics, sched ? s->t_sched - s->t_added : -1, sched && tok ? s->t_first_tok - s->t_sched : -1,
                                   tok ? t - s->t_first_tok : -1, sched ? t - s->t_sched : -1);
        s->eng_finished = true;
        s->eng_reason = o->finish_reason;
        s->kv_transfer_id = o->kv_transfer_id;
        s->kv_transfer_num_blocks = o->kv_transfer_num_blocks;
        s->core_lost = core_lost;
        free_it = --j->refs == 0;
    }
    j->changed = true;
    pthread_cond_broadcast(&j->cv);
    srv_park_wake(srv, &j->park); /* the connection's pool thread pumps the job (a no-op once it left) */
    pthread_mutex_unlock(&j->mu);
    if (free_it) job_free(j);
}

static void on_output(void *user, const osp_request_output *o) { on_output_any(user, o, false); }
static void on_core_output(void *user, const osp_request_output *o, bool core_lost) { on_output_any(user, o, core_lost); }

/* The core client's I/O thread: the core's answer to one choice's add (--engine-process). A refused
 * or lost choice will get no output: its reference goes. An admitted one that nobody wants any more
 * (the connection left, or another choice of the job failed) is aborted at once. */
static void on_core_ack(void *user, osp_status st, const char *why) {
    srv_seq *s = user;
    srv_job *j = s->job;
    srv_server *srv = j->srv;
    bool free_it = false, abort_it = false;
    pthread_mutex_lock(&j->mu);
    j->n_unacked--;
    if (st != OSP_OK) {
        s->refused = true;
        if (j->admit_fail == OSP_OK) {
            j->admit_fail = st;
            snprintf(j->admit_why, sizeof j->admit_why, "%s", why ? why : "");
        }
        free_it = --j->refs == 0;
    } else {
        abort_it = j->conn_done || j->admit_fail != OSP_OK;
    }
    j->changed = true;
    srv_park_wake(srv, &j->park);
    const uint64_t id = s->engine_id;
    pthread_mutex_unlock(&j->mu);
    if (abort_it) srv_engine_abort(srv, id); /* its final output (abort) still comes and drops its reference */
    if (free_it) job_free(j);
}

/* ---- the engine, in this process or in the core process (serve_internal.h) ------------------ */

osp_status srv_engine_add(srv_server *srv, osp_request_params *rp, srv_seq *seq) {
    if (srv->engine) {
        rp->callback = on_output;
        rp->callback_user = seq;
        return osp_engine_add(srv->engine, rp);
    }
    rp->callback = NULL;
    rp->callback_user = NULL;
    /* the pool thread must not wait for the core's ACK: it comes to on_core_ack */
    srv_job *j = seq->job;
    pthread_mutex_lock(&j->mu);
    j->n_unacked++;
    pthread_mutex_unlock(&j->mu);
    const osp_status st = osp_core_client_add_async(srv->core, rp, on_core_output, on_core_ack, seq);
    if (st != OSP_OK) {
        pthread_mutex_lock(&j->mu);
        j->n_unacked--;
        pthread_mutex_unlock(&j->mu);
    }
    return st;
}

int srv_job_admitted(srv_job *j, srv_error *err) {
    pthread_mutex_lock(&j->mu);
    const int32_t pending = j->n_unacked;
    const osp_status fail = j->admit_fail;
    if (pending == 0 && fail != OSP_OK) {
        if (fail == OSP_ERR_IO) srv_fail(err, 503, NULL, "%s; retry later", j->admit_why);
        else srv_fail(err, 400, NULL, "%s", j->admit_why);
    }
    pthread_mutex_unlock(&j->mu);
    return pending > 0 ? 0 : fail == OSP_OK ? 1 : -1;
}

void srv_job_cancel(srv_job *j) {
    srv_server *srv = j->srv;
    if (j->http_done) return;
    j->http_done = true;
    srv_park_unwatch(srv, &j->park);
    pthread_mutex_lock(&j->mu);
    j->conn_done = true;
    bool refused[SRV_MAX_N];
    for (int32_t i = 0; i < j->n_seqs; i++) refused[i] = j->seqs[i].refused;
    pthread_mutex_unlock(&j->mu);
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        if (s->added && !refused[i]) srv_engine_abort(srv, s->engine_id);
        s->done = true;
        if (!s->finish) s->finish = "error";
    }
    pthread_mutex_lock(&srv->mu);
    srv->in_flight--;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
    srv_park_wake_queue(srv);
    pthread_mutex_lock(&j->mu);
    const bool free_it = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (free_it) job_free(j);
}

void srv_engine_abort(srv_server *srv, uint64_t id) {
    if (srv->engine) (void)osp_engine_abort(srv->engine, id);
    else (void)osp_core_client_abort(srv->core, id);
}

osp_engine_stats srv_engine_stats(srv_server *srv) {
    return srv->engine ? osp_engine_get_stats(srv->engine) : osp_core_client_stats(srv->core);
}

osp_kv_transfer_info srv_engine_kv_transfer_info(srv_server *srv) {
    return srv->engine ? osp_engine_kv_transfer_info(srv->engine) : osp_core_client_kv_transfer_info(srv->core);
}

bool srv_engine_ready(srv_server *srv) { return srv->engine || osp_core_client_ready(srv->core); }

static const char *finish_name(osp_finish_reason r) {
    switch (r) {
    case OSP_FINISH_STOP: return "stop";
    case OSP_FINISH_LENGTH: return "length";
    case OSP_FINISH_ABORT: return "abort";
    default: return "error";
    }
}

/* Connection thread: waits up to timeout_ms for news (0: not at all), then turns new tokens into text.
 * Returns true when something changed. */
bool srv_job_pump(srv_job *j, int timeout_ms) {
    srv_server *srv = j->srv;
    pthread_mutex_lock(&j->mu);
    if (!j->changed && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        ts.tv_sec += timeout_ms / 1000 + ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        while (!j->changed)
            if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT) break;
    }
    const bool changed = j->changed;
    j->changed = false;
    int32_t counts[SRV_MAX_N];
    osp_token_logprobs *plp[SRV_MAX_N];
    int32_t n_plp[SRV_MAX_N];
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        counts[i] = 0;
        plp[i] = s->plp_inbox; /* taken over here: they come with (or before) the first tokens */
        n_plp[i] = s->n_plp_inbox;
        s->plp_inbox = NULL;
        s->n_plp_inbox = 0;
        if (s->n_inbox > s->cap_work) {
            int32_t *p = realloc(s->work, sizeof(int32_t) * (size_t)s->cap_inbox);
            if (p) s->work = p;
            osp_token_logprobs *q = s->lp_inbox ? realloc(s->lp_work, sizeof *q * (size_t)s->cap_inbox) : NULL;
            if (q) s->lp_work = q;
            if (p && (q || !s->lp_inbox)) s->cap_work = s->cap_inbox;
        }
        if (s->n_inbox <= s->cap_work && s->n_inbox > 0) {
            memcpy(s->work, s->inbox, sizeof(int32_t) * (size_t)s->n_inbox);
            if (s->lp_inbox) memcpy(s->lp_work, s->lp_inbox, sizeof *s->lp_work * (size_t)s->n_inbox);
            counts[i] = s->n_inbox;
            s->n_inbox = 0;
        }
        s->seen_finished = s->eng_finished && s->n_inbox == 0;
    }
    pthread_mutex_unlock(&j->mu);
    if (!changed) {
        for (int32_t i = 0; i < j->n_seqs; i++) free(plp[i]);
        return false;
    }

    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        /* a one-token prompt gets no prompt logprobs from the engine (no token precedes it), yet its
         * null entry must still lead the choice's logprobs: lm-eval indexes token_logprobs by prompt
         * position. Added once (a later call finds s->lp made and returns). */
        const srv_prompt *pr = &j->req.prompts[s->prompt_idx];
        if (!s->done && j->prompt_lp && (plp[i] || pr->n_ids == 1))
            srv_json_add_prompt_logprobs(j, s, pr->ids, plp[i], plp[i] ? n_plp[i] : 0);
        free(plp[i]);
        if (s->done) continue;
        for (int32_t k = 0; k < counts[i] && !s->done; k++) {
            if (j->echo_only) continue; /* the one token sampled for an echo-only request is not output */
            s->n_out++;
            if (s->lp_work) srv_json_add_logprobs(j, s, &s->lp_work[k]);
            /* the token that ended the sequence (EOS or a stop id) gives no text, as in vLLM */
            const bool stop_tok = s->seen_finished && s->eng_reason == OSP_FINISH_STOP && k == counts[i] - 1;
            if (stop_tok && !j->req.include_stop_str_in_output) continue;
            const int rc = srv_text_push(&s->text, s->work[k]);
            if (rc == 1) {
                s->done = true;
                s->finish = "stop";
                if (!s->seen_finished) srv_engine_abort(srv, s->engine_id);
            }
        }
        if (!s->done && s->seen_finished) {
            srv_text_finish(&s->text);
            s->done = true;
            s->finish = j->echo_only ? "length" : finish_name(s->eng_reason);
        }
    }
    return true;
}

const char k_core_lost_message[] = "the engine core process died while this request ran; the server is restarting it (retry later)";

bool srv_job_core_lost(const srv_job *j) {
    for (int32_t i = 0; i < j->n_seqs; i++)
        if (j->seqs[i].done && j->seqs[i].core_lost) return true;
    return false;
}

bool srv_job_all_done(const srv_job *j) {
    for (int32_t i = 0; i < j->n_seqs; i++)
        if (!j->seqs[i].done) return false;
    return true;
}

/* The connection is done with the job (reply sent, or client gone): abort what still runs, log the
 * request, drop the connection's reference. */
void srv_job_http_done(srv_job *j) {
    srv_server *srv = j->srv;
    if (j->http_done) return;
    j->http_done = true;
    srv_park_unwatch(srv, &j->park);
    const double t = srv_now_s();
    int64_t n_prompt = 0, n_out = 0;
    for (int32_t i = 0; i < j->req.n_prompts; i++) n_prompt += j->prompt_lens ? j->prompt_lens[i] : 0;
    const char *finish = j->n_seqs ? (j->seqs[0].finish ? j->seqs[0].finish : "abort") : "error";
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        n_out += s->n_out;
        if (s->added && !s->done) srv_engine_abort(srv, s->engine_id);
    }
    if (j->client_gone) finish = "abort";
    srv_metrics_request_done(srv->metrics, finish, n_prompt, n_out);
    srv_metrics_observe_e2e(srv->metrics, t - j->t_arrival);
    if (n_out > 1 && j->t_first > 0) srv_metrics_observe_itl(srv->metrics, (t - j->t_first) / (double)(n_out - 1), n_out - 1);
    srv_log(srv, SRV_LOG_INFO, "request %s: %lld prompt tokens, %lld output tokens (%d choice%s), ttft %.1f ms, total %.1f ms, finish %s%s",
            j->id, (long long)n_prompt, (long long)n_out, j->n_seqs, j->n_seqs == 1 ? "" : "s",
            j->t_first > 0 ? (j->t_first - j->t_arrival) * 1e3 : 0.0, (t - j->t_arrival) * 1e3, finish,
            j->client_gone ? " (client disconnected)" : "");
    pthread_mutex_lock(&srv->mu);
    srv->in_flight--;
    pthread_cond_broadcast(&srv->idle);
    pthread_mutex_unlock(&srv->mu);
    srv_park_wake_queue(srv); /* a slot is free for a request parked waiting for one */
    pthread_mutex_lock(&j->mu);
    j->conn_done = true; /* a choice admitted from here on is aborted at once (on_core_ack) */
    const bool free_it = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (free_it) job_free(j);
}

static uint64_t salt_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h ? h : 1;
}

/* Tokenizes the prompts (or renders and tokenizes the chat) and fills j->prompt ids. */
int srv_build_prompts(srv_server *srv, srv_gen_request *r, srv_error *err) {
    if (r->route == SRV_ROUTE_CHAT) { /* rendered and tokenized with provenance (chat.c) */
        char *text;
        int32_t *ids;
        size_t n;
        if (srv_chat_prompt(&srv->chat, srv->tok, r, false, &text, &ids, &n, err)) return -1;
        r->prompts = calloc(1, sizeof(srv_prompt));
        if (!r->prompts) {
            free(text);
            free(ids);
            return srv_fail(err, 500, NULL, "out of memory");
        }
        r->prompts[0].text = text;
        r->prompts[0].ids = ids;
        r->prompts[0].n_ids = (int32_t)n;
        r->n_prompts = 1;
        if (n == 0) return srv_fail(err, 400, "prompt", "the prompt is empty after tokenization");
    }
    for (int32_t i = 0; i < r->n_prompts; i++) {
        srv_prompt *p = &r->prompts[i];
        if (p->ids) continue;
        int32_t *ids;
        size_t n;
        /* a chat prompt already holds its special tokens; a completion prompt gets BOS as usual */
        /* embeddings' inputs too (vLLM's and llama-server's add_special_tokens default) */
        if (osp_tokenizer_encode(srv->tok, p->text, strlen(p->text), r->route != SRV_ROUTE_CHAT, true, &ids, &n) != OSP_OK)
            return srv_fail(err, 500, NULL, "tokenization failed: %s", osp_last_error());
        p->ids = ids;
        p->n_ids = (int32_t)n;
        if (n == 0)
            return r->route == SRV_ROUTE_EMBEDDINGS ? srv_fail(err, 400, "input", "input %d is empty after tokenization", i)
                                                    : srv_fail(err, 400, "prompt", "the prompt is empty after tokenization");
    }
    return 0;
}

char *srv_detok_all(srv_server *srv, const int32_t *ids, int32_t n) {
    srv_text t;
    char *none[1] = {NULL};
    if (srv_text_init(&t, srv->tok, false, none, 0, false)) {
        srv_text_free(&t);
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) srv_text_push(&t, ids[i]);
    srv_text_finish(&t);
    char *s = strdup(t.buf ? t.buf : "");
    srv_text_free(&t);
    return s;
}

/* Creates the job and queues its engine requests. On error nothing runs and *err is set. */
srv_job *srv_job_start(srv_server *srv, srv_gen_request *r, struct MHD_Connection *conn, srv_error *err) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) {
        srv_fail(err, 500, NULL, "out of memory");
        return NULL;
    }
    j->srv = srv;
    pthread_mutex_lock(&srv->mu);
    srv->live_jobs++;
    pthread_mutex_unlock(&srv->mu);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->req = *r;
    memset(r, 0, sizeof *r);
    r = &j->req;
    j->conn = conn;
    srv_park_init(&j->park, conn);
    j->t_arrival = srv_now_s();
    j->created = time(NULL);
    j->refs = 1;
    pthread_mutex_lock(&srv->mu);
    const uint64_t first_id = srv->next_id;
    srv->next_id += (uint64_t)r->n * (uint64_t)r->n_prompts + 1;
    pthread_mutex_unlock(&srv->mu);
    srv_id_format(j->id, sizeof j->id,
                  r->responses                       ? "resp"
                  : r->route == SRV_ROUTE_CHAT       ? "chatcmpl"
                  : r->route == SRV_ROUTE_EMBEDDINGS ? "embd"
                                                     : "cmpl",
                  &srv->id_key, first_id);
    if (r->responses) j->id[4] = '_'; /* OpenAI's "resp_<hex>" */

    j->prompt_lens = calloc((size_t)r->n_prompts, sizeof(int32_t));
    j->n_seqs = r->n * r->n_prompts;
    j->seqs = calloc((size_t)j->n_seqs, sizeof(srv_seq));
    if (!j->prompt_lens || !j->seqs) {
        srv_fail(err, 500, NULL, "out of memory");
        goto fail;
    }
    j->echo_only = r->echo && r->max_tokens == 0 && r->route == SRV_ROUTE_COMPLETIONS;
    j->prompt_lp = r->echo && r->logprobs >= 0 && !r->stream && r->route == SRV_ROUTE_COMPLETIONS;
    for (int32_t p = 0; p < r->n_prompts; p++) {
        const int32_t np = r->prompts[p].n_ids;
        j->prompt_lens[p] = np;
        if (r->route == SRV_ROUTE_EMBEDDINGS) { /* prefill only: the input may fill the context */
            if (np > srv->max_model_len) {
                srv_fail(err, 400, "input",
                         "This model's maximum context length is %d tokens. However, you requested %d tokens in the input "
                         "for embedding generation (input %d). Please reduce the length of the input.",
                         srv->max_model_len, np, p);
                goto fail;
            }
            continue;
        }
        const int32_t max_tokens = j->echo_only ? 1 /* the engine samples one token (dropped), as vLLM */
                                   : r->max_tokens > 0 ? r->max_tokens
                                   : r->route == SRV_ROUTE_COMPLETIONS ? 16
                                                                       : srv->max_model_len - np;
        if (np >= srv->max_model_len || (int64_t)np + max_tokens > srv->max_model_len) {
            srv_fail(err, 400, r->route == SRV_ROUTE_CHAT ? "messages" : "prompt",
                     "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or completion.",
                     srv->max_model_len, (long long)np + (max_tokens > 0 ? max_tokens : 0), np,
                     r->route == SRV_ROUTE_CHAT ? "messages" : "prompt", max_tokens > 0 ? max_tokens : 0,
                     r->route == SRV_ROUTE_CHAT ? "messages" : "prompt");
            goto fail;
        }
        if (r->min_tokens > max_tokens) {
            srv_fail(err, 400, "min_tokens", "'min_tokens' (%d) exceeds the tokens left for the completion (%d)", r->min_tokens,
                     max_tokens);
            goto fail;
        }
    }
    if (r->echo && r->route == SRV_ROUTE_COMPLETIONS) {
        j->echo = calloc((size_t)r->n_prompts, sizeof(char *));
        if (!j->echo) goto oom;
        for (int32_t p = 0; p < r->n_prompts; p++) {
            j->echo[p] = r->prompts[p].text && r->prompts[p].text[0] ? strdup(r->prompts[p].text)
                                                                      : srv_detok_all(srv, r->prompts[p].ids, r->prompts[p].n_ids);
            if (!j->echo[p]) goto oom;
        }
    }
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        s->job = j;
        s->index = i;
        s->prompt_idx = i / r->n;
        s->engine_id = first_id + (uint64_t)i;
        if (srv_text_init(&s->text, srv->tok, r->skip_special_tokens, r->stop, r->n_stop, r->include_stop_str_in_output))
            goto oom;
    }
    osp_token_bias bias[1024];
    for (int32_t b = 0; b < r->n_bias && b < 1024; b++) bias[b] = (osp_token_bias){r->bias_ids[b], r->bias_values[b]};
    /* queue the engine requests; the callbacks may start as soon as the first add returns */
    for (int32_t i = 0; i < j->n_seqs; i++) {
        srv_seq *s = &j->seqs[i];
        const srv_prompt *p = &r->prompts[s->prompt_idx];
        osp_request_params rp = osp_request_default_params();
        rp.request_id = s->engine_id;
        rp.prompt = p->ids;
        rp.num_prompt = p->n_ids;
        rp.temperature = r->temperature;
        rp.top_k = r->top_k;
        rp.top_p = r->top_p;
        rp.min_p = r->min_p;
        rp.presence_penalty = r->presence_penalty;
        rp.frequency_penalty = r->frequency_penalty;
        rp.repetition_penalty = r->repetition_penalty;
        rp.logit_bias = bias;
        rp.num_logit_bias = r->n_bias;
        /* choice k of a prompt is the engine's child k: (seed, sample_index k), so a seeded request
           gives the same choices as the engine's own n would */
        rp.has_seed = r->seed_set;
        rp.seed = r->seed;
        rp.sample_index = (uint32_t)(i % r->n);
        rp.logprobs = r->logprobs;
        rp.prompt_logprobs = j->prompt_lp ? r->logprobs : -1;
        rp.max_tokens = j->echo_only ? 1 : r->max_tokens > 0 ? r->max_tokens : r->route == SRV_ROUTE_COMPLETIONS ? 16 : 0;
        rp.min_tokens = r->min_tokens;
        rp.ignore_eos = r->ignore_eos;
        rp.stop_token_ids = r->stop_token_ids;
        rp.num_stop_token_ids = r->n_stop_token_ids;
        rp.cache_salt = r->cache_salt ? salt_hash(r->cache_salt) : 0;
        rp.grammar = r->grammar;
        /* copied at add; a prompt's first choice only: its KV is pulled once (the producer releases its copies
           after the pull), and the other choices find it in the prefix cache or compute it */
        rp.kv_transfer = r->kv_transfer_set && i % r->n == 0 ? &r->kv_transfer : NULL;
        if (r->route == SRV_ROUTE_EMBEDDINGS) { /* prefill only: nothing sampled */
            rp.pooling = srv->pooling;
            rp.embd_normalize = !srv->cfg.no_embd_normalize;
            rp.max_tokens = 0;
            rp.logprobs = rp.prompt_logprobs = -1;
            rp.grammar = NULL;
        }
        pthread_mutex_lock(&j->mu);
        j->refs++;
        s->t_added = srv_now_s();
        pthread_mutex_unlock(&j->mu);
        const osp_status as = srv_engine_add(srv, &rp, s);
        if (as != OSP_OK) {
            /* the engine refused it (400), or the core process is restarting or died (503) */
            if (as == OSP_ERR_IO) srv_fail(err, 503, NULL, "%s; retry later", osp_last_error());
            else srv_fail(err, 400, NULL, "%s", osp_last_error());
            pthread_mutex_lock(&j->mu);
            j->refs--;
            j->conn_done = true; /* --engine-process: those not admitted yet are aborted when they are */
            pthread_mutex_unlock(&j->mu);
            for (int32_t k = 0; k < i; k++) srv_engine_abort(srv, j->seqs[k].engine_id);
            for (int32_t k = i; k < j->n_seqs; k++) j->seqs[k].done = true, j->seqs[k].finish = "error";
            goto fail_started;
        }
        s->added = true;
    }
    pthread_mutex_lock(&srv->mu);
    srv->in_flight++;
    pthread_mutex_unlock(&srv->mu);
    srv_park_watch(srv, &j->park, false, 0); /* from here a client that leaves is seen (park.c) */
    return j;
oom:
    srv_fail(err, 500, NULL, "out of memory");
fail:
    job_free(j);
    return NULL;
fail_started: /* the added requests hold references; the last finishing callback frees the job */
    j->http_done = true;
    pthread_mutex_lock(&j->mu);
    const bool free_it = --j->refs == 0;
    pthread_mutex_unlock(&j->mu);
    if (free_it) job_free(j);
    return NULL;
}
