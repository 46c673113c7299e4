/* What crosses the files of `osprey serve` (tools/server/serve*.c, openai_json.c, sse.c, routes.c):
 * the server's state, a generation job and its choices, and the functions one file calls in another.
 *
 *   serve.c        flags, start-up (engine, tokenizer, chat template, HTTP daemon), SIGTERM drain, logging
 *   serve_jobs.c   jobs: prompts -> engine requests, the engine callback, draining tokens into text
 *   openai_json.c  OpenAI response objects: completions, chat completions, stream chunks, logprobs, usage
 *   embed.c        the /v1/embeddings reply (float or base64 vectors, usage)
 *   sse.c          the text/event-stream reply of a streaming job
 *   routes.c       libmicrohttpd's request handler: body upload, auth, routes, error replies
 *   park.c         parked (suspended) connections and the watcher that sees their clients leave
 *   core_proc.c    --engine-process: the EngineCore's child process, its supervisor, --api-server-count
 *   serve_startup.c  the start-up log's memory line and load bar (tls.c: --ssl-keyfile / --ssl-certfile)
 *
 * Threads: libmicrohttpd runs a pool of --http-threads event-loop threads (epoll; many connections
 * each, none blocks), the engine its own loop thread (osp_engine_start), park.c one watcher thread. A
 * generation request becomes a job with one engine request per choice (n per prompt). The engine's
 * per-request callback (on the loop thread) appends the new token ids to the choice's inbox under the
 * job's mutex and wakes the job's parked connection (MHD_resume_connection); the connection's pool
 * thread (in the handler, or the SSE content reader) drains the inboxes, detokenizes, checks stop
 * strings and writes the JSON reply or the SSE chunks, then parks the connection again
 * (MHD_suspend_connection) until the next news. "Connection thread" below means whichever pool thread
 * runs that connection's callbacks (one at a time). A job is reference counted (the connection plus
 * every engine request not yet finished), so a client that disconnects (a failed write, or the
 * watcher's look at its socket) aborts its engine requests and the job is freed by the last finishing
 * callback.
 * With --engine-process the engine is another process: the same callbacks come from the core client's
 * I/O thread (src/engine/core_client.h), and a choice whose core died ends with core_lost set.
 * Not for use outside tools/server/. */
#ifndef OSPREY_TOOLS_SERVE_INTERNAL_H
#define OSPREY_TOOLS_SERVE_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "osprey/engine.h"
#include "server.h"

/* ---- server state -------------------------------------------------------------------------- */

/* The per-process secret behind the public request ids ("cmpl-...", "chatcmpl-..."). */
typedef struct srv_id_key {
    uint64_t prefix; /* random: the first 16 hex digits of every id of this process */
    uint64_t offset; /* random: added to the counter before the bijective mix */
} srv_id_key;

/* Fills *k from getrandom(2) (falling back to /dev/urandom, then to the clock, the pid and k's
 * address mixed, where neither is readable). Two processes get different keys with overwhelming
 * probability, so their ids differ from the first one on; never fails. Thread-safe. */
void srv_id_key_init(srv_id_key *k);

/* Writes "<kind>-<32 lowercase hex digits>" into out (at most cap bytes, NUL-terminated, truncated
 * to fit; 48 bytes always suffice for kind "chatcmpl"): 16 digits of k->prefix, then 16 digits of a
 * bijection of k->offset + n (the splitmix64 finalizer). For one key, distinct n (mod 2^64) give
 * distinct ids; ids of different keys differ in the prefix but for a 2^-64 chance. Pure. */
void srv_id_format(char *out, size_t cap, const char *kind, const srv_id_key *k, uint64_t n);

enum { SRV_LOG_DEBUG = 0, SRV_LOG_INFO = 1, SRV_LOG_WARNING = 2 };

typedef struct srv_config {
    const char *model_path, *host, *api_key, *served_model_name, *chat_template_path;
    int port, n_threads, log_level;
    osp_device device; /* --device cpu|cuda|auto (default auto) */
    bool gpu_quant_weights; /* --gpu-weights quant */
    osp_cpu_activations cpu_activations; /* --cpu-activations */
    bool no_mmap;                        /* --no-mmap */
    int32_t tensor_parallel_size;        /* -tp, --tensor-parallel-size */
    osp_kv_dtype kv_dtype; /* K pages: --kv-cache-dtype auto|f16|bf16|f32|fp8|nvfp4 (auto = f16) or -ctk */
    osp_kv_dtype kv_dtype_v; /* V pages: --kv-cache-dtype or -ctv (cli_engine_args.kv_dtype_v) */
    const char *kv_scales; /* --kv-scales FILE (osp_engine_params.kv_scales_path); NULL: default scales */
    const char *kernel_table; /* --kernel-table FILE (or $OSPREY_KERNEL_TABLE): osp_engine_params.kernel_table */
    osp_spec_config spec;     /* --speculative-config JSON: osp_engine_params.speculative */
    osp_sparse_config sparse; /* --sparse-attention: osp_engine_params.sparse_attention */
    int64_t kv_offload_host_bytes, kv_offload_disk_bytes; /* --kv-offloading-size, --kv-offload-disk-size */
    const char *kv_offload_disk;                          /* --kv-offload-disk */
    srv_kv_transfer_config kv_transfer; /* --kv-transfer-config JSON (role NONE: not given) */
    osp_prefix_hash_algo hash_algo; /* --prefix-caching-hash-algo (cli_engine_args) */
    bool hash_seed_set;       /* --prefix-caching-hash-seed, $OSPREY_HASH_SEED or $PYTHONHASHSEED */
    uint64_t hash_seed;
    int32_t max_model_len, max_num_seqs, max_num_batched_tokens, block_size;
    int64_t kv_cache_memory;
    bool kv_cache_memory_set;     /* given on the command line (else 1 GiB on the CPU, auto on the GPU) */
    float gpu_memory_utilization; /* --gpu-memory-utilization (0: the engine's 0.9) */
    bool prefix_caching;
    const char *trace_shapes; /* --trace-shapes FILE, or NULL */
    const char *trace;        /* --trace FILE (the step timeline), or NULL */
    size_t max_body;      /* bytes */
    int max_queue;        /* generation requests in flight (running or waiting) */
    int queue_wait_timeout_s; /* --queue-wait-timeout: over max_queue, wait this long for a slot before 503 (0) */
    int drain_timeout_s;
    int max_connections;            /* --max-connections: open HTTP connections before requests get 503 */
    int max_connections_per_client; /* --max-connections-per-client: per client address (0: no cap) */
    int connection_timeout_s;       /* --connection-timeout: a connection idle this long is closed */
    int http_threads;               /* --http-threads: libmicrohttpd's event-loop threads (0: from the cores) */
    bool trust_request_chat_template; /* --trust-request-chat-template */
    bool allow_special_tokens_in_content; /* --allow-special-tokens-in-content */
    bool enable_auto_tool_choice;   /* --enable-auto-tool-choice: tool_choice auto (needs tool_parser) */
    srv_tool_parser tool_parser;    /* --tool-call-parser hermes|llama3_json|mistral (NONE) */
    srv_reasoning_parser reasoning_parser; /* --reasoning-parser deepseek_r1|qwen3 (NONE) */
    srv_cors cors;                  /* --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials */
    osp_kv_events_config kv_events; /* --kv-events-config JSON (vLLM's KVEventsConfig) */
    bool kv_events_set;
    bool kv_events_array_like;      /* --kv-events-array-like: the older positional msgpack form */
    bool engine_process;            /* --engine-process: the EngineCore runs in a child process (core_proc.c) */
    int core_frontend_timeout_ms;   /* the core aborts a frontend's requests after this long without a heartbeat */
    int api_server_count;           /* --api-server-count: HTTP frontend processes sharing the core (1) */
    const char *attach_endpoint;    /* an extra API server (hidden __api-server): the core's endpoint */
    int fe_index;                   /* this frontend's index at the core (0: the first) */
    const char *ssl_keyfile;        /* --ssl-keyfile PEM (tls.h); NULL: plain HTTP */
    const char *ssl_certfile;       /* --ssl-certfile PEM; given together with ssl_keyfile */
    int responses_store_size;       /* --responses-store-size: stored responses kept (LRU) */
    osp_pooling pooling;            /* --pooling mean|cls|last for /v1/embeddings (NONE: not given: the
                                       GGUF's <arch>.pooling_type, else last) */
    bool no_embd_normalize;         /* --no-embd-normalize: raw pooled vectors (default: L2-normalized) */
    bool no_webui;                  /* --no-webui: no chat page and dashboard at / (then 404 there) */
} srv_config;

typedef struct srv_core_proc srv_core_proc;

/* A connection that may be parked: suspended in libmicrohttpd while its request waits (park.c).
 * listed, queue, deadline, prev, next: under srv->park_mu; the rest under mu (conn and fd: set once,
 * before it is listed). */
typedef struct srv_park {
    pthread_mutex_t mu;
    bool inited;              /* mu made (srv_park_init); srv_park_destroy undoes it */
    struct MHD_Connection *conn;
    int fd;                   /* the connection's socket (-1: unknown, never seen gone) */
    bool listed;              /* on srv's watch list: its socket and deadline are watched */
    bool queue;               /* waits for a --max-queued-requests slot: woken when one frees */
    bool suspended;           /* MHD_suspend_connection'ed and not resumed yet */
    bool wake;                /* news came while it was not suspended: the next suspend says AGAIN */
    bool gone;                /* the watcher saw its client leave */
    bool expired;             /* its deadline passed */
    double deadline;          /* srv_now_s() seconds (0: none) */
    struct srv_park *prev, *next; /* the watch list */
} srv_park;

typedef struct srv_server {
    srv_config cfg;
    osp_engine *engine;       /* in-process mode (the default): the engine and its loop thread; else NULL */
    struct osp_core_client *core; /* --engine-process: the client of the core process; else NULL */
    srv_core_proc *proc;      /* --engine-process: the core process' supervisor (core_proc.c) */
    int n_api_pids;           /* --api-server-count: the other API servers' pids (the first server only) */
    int api_pids[64];
    osp_kv_publisher *kv_events; /* --kv-events-config, or NULL */
    osp_tokenizer *tok;
    const char *model_name;
    int32_t max_model_len, n_vocab;
    int32_t n_embd;           /* the model's hidden size: the length of an embedding */
    osp_pooling pooling;      /* /v1/embeddings' pooling, resolved at start-up (srv_config.pooling) */
    srv_chat_env chat;
    srv_metrics *metrics;
    srv_resp_store *responses; /* /v1/responses' previous_response_id store (--responses-store-size) */
    pthread_mutex_t mu;
    pthread_cond_t idle;
    int in_flight;            /* generation requests a connection is serving */
    int rendering;            /* chat renders in progress (counted with in_flight against --max-queued-requests) */
    int live_jobs;            /* jobs not yet freed (an aborted one lives until its engine requests end) */
    int sending;              /* generation responses queued but not yet finished on their connection
                               * (the drain waits for them: stopping the daemon would cut them off) */
    uint64_t next_id;         /* the engine's request ids: 1, 2, ... (one per choice; see srv_id_format) */
    srv_id_key id_key;        /* drawn once at start-up: makes the public ids differ between processes */
    int n_connections;        /* open HTTP connections (srv_on_connection) */
    bool draining;
    /* parked connections (park.c) */
    pthread_mutex_t park_mu;
    pthread_cond_t park_cv;
    srv_park *parks;          /* the watch list */
    int n_parks, n_queue_parks;
    atomic_bool park_stopping; /* the daemon stops: nothing parks any more, every park reads GONE */
    bool park_quit;           /* the watcher thread ends */
    bool park_started;
    pthread_t park_thread;
} srv_server;

/* serve's flags (argv[0] is "serve"; exits with a message on a bad one) and the engine parameters
 * they give (serve.c); the core process parses the same flags. */
srv_config srv_parse_flags(int argc, char **argv);
osp_engine_params srv_engine_params(const srv_config *cfg);
/* The start-up log's memory line for an engine of this process: the weights' MiB (device memory on a
 * GPU; on the CPU the GGUF tensors, mapped from the file), the KV cache's MiB and its capacity in
 * tokens (num_blocks x block_size). */
void srv_log_memory(const srv_server *s, const osp_engine *e);
/* The start-up warning for a KV cache smaller than one max_model_len sequence (the scheduler then refuses,
 * with a 400, every request whose prompt + max_tokens needs more blocks than the cache has): written to
 * out (one line, no newline) and its length returned, or 0 when one sequence of max_model_len tokens fits
 * (it needs ceil((max_model_len - 1) / block_size) blocks: the last token is never computed).
 * num_blocks, block_size, max_model_len > 0; block_bytes: one block's bytes (for the size to give);
 * gpu_auto: the cache was sized from free GPU memory (no --kv-cache-memory), so the flag to raise is
 * --gpu-memory-utilization (utilization: its value) as well as --kv-cache-memory. vLLM refuses to start
 * here; osprey serves what fits and says so. */
int srv_kv_capacity_warning(char *out, size_t n, int32_t num_blocks, int32_t block_size, int32_t max_model_len,
                            int64_t block_bytes, bool gpu_auto, double utilization);
/* osp_engine_params.load_progress for a terminal (the caller checks isatty(2); a log file never gets
 * it): srv_progress_bar redrawn in place after '\r', a newline at 1. The engine reports progress while
 * weights are copied to a device; on the CPU they stay mapped from the file (nothing to wait for). */
void srv_load_bar(void *ctx, float fraction);

/* Seconds on CLOCK_MONOTONIC (for durations only). */
double srv_now_s(void);
/* One stderr line "LEVEL mm-dd HH:MM:SS message" when level >= s->cfg.log_level (serve.c). */
void srv_log(const srv_server *s, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ---- KV cache events (kv_events_serve.c) -------------------------------------------------- */

/* The publisher for srv->cfg's --kv-events-config (topic "kv@<pod>@<srv->model_name>" unless the
 * config sets one), or NULL when events are off; logs where it publishes. Dies (cli_die) when an
 * endpoint cannot be opened. */
osp_kv_publisher *srv_kv_events_open(const srv_server *srv);
typedef struct srv_seq srv_seq;
struct osp_core_client;
struct osp_ipc_ready;

/* ---- the engine, in this process or in the core process ------------------------------------- */

/* Queues one engine request (rp's callback fields are set here to the job's): osp_engine_add in
 * process, osp_core_client_add with --engine-process. Returns the engine's status (INVALID_ARG: the
 * engine refused it; IO: the core process is not ready or died). */
osp_status srv_engine_add(srv_server *srv, osp_request_params *rp, srv_seq *seq);
/* Aborts engine request id (either mode); an unknown or finished id is ignored. */
void srv_engine_abort(srv_server *srv, uint64_t id);
/* The engine's stats (either mode: the core's last report with --engine-process). */
osp_engine_stats srv_engine_stats(srv_server *srv);
/* osp_engine_kv_transfer_info (either mode: from the core's last READY with --engine-process). */
osp_kv_transfer_info srv_engine_kv_transfer_info(srv_server *srv);
/* Can generation requests be served now? (false while the core process restarts) */
bool srv_engine_ready(srv_server *srv);

/* ---- the core process (core_proc.c) -------------------------------------------------------- */

/* --engine-process start-up: makes a private directory for the ipc:// endpoint, starts the client
 * (srv->core) and a supervisor thread that runs `argv0 __engine-core ENDPOINT EPOCH <serve args>`
 * (fork + exec of this binary), restarts it when it dies (after failing its requests, counted in
 * srv_core_restarts) and waits for its first READY; fills *info. Returns 0, or -1 when the first core
 * could not start, with how it ended (exit status or signal) in why[why_cap] (the core's own error is
 * on the shared stderr before it). serve_argc/argv: serve's own arguments (argv[0] "serve"). */
int srv_core_start(srv_server *srv, int serve_argc, char **serve_argv, struct osp_ipc_ready *info, char *why,
                   size_t why_cap);
/* An extra API server of --api-server-count: only a client of the core at `endpoint` (no supervisor;
 * the core's connection closing counts as its death). Waits for READY. 0, or -1. */
int srv_core_attach(srv_server *srv, const char *endpoint, uint32_t fe, struct osp_ipc_ready *info);
/* The first server of --api-server-count N: starts `__api-server k ENDPOINT <serve args>` for k = 1..N-1
 * (fork + exec, each dies with this process); 0, or -1. stop: SIGTERM to each, then waits (they drain). */
int srv_api_servers_start(srv_server *srv, int serve_argc, char **serve_argv);
void srv_api_servers_stop(srv_server *srv);
/* Stops the core process (SIGTERM, then waits), the supervisor and the client; removes the directory.
 * For an attached API server: just the client. */
void srv_core_stop(srv_server *srv);
/* Restarts of the core process so far. */
int64_t srv_core_restarts(srv_server *srv);

/* ---- jobs (serve_jobs.c) ------------------------------------------------------------------- */

typedef struct srv_job srv_job;

struct srv_seq {
    srv_job *job;
    int32_t index, prompt_idx;
    uint64_t engine_id;
    bool added;               /* osp_engine_add succeeded (--engine-process: sent; see refused) */
    bool refused;             /* --engine-process: the core refused it or died before admitting it (job->mu) */
    /* shared with the engine callback (job->mu) */
    int32_t *inbox;
    int32_t n_inbox, cap_inbox;
    osp_token_logprobs *lp_inbox; /* [cap_inbox] when the request asked for logprobs */
    osp_token_logprobs *plp_inbox; /* [n_plp_inbox] the prompt's logprobs (tokens 1..), once, when asked */
    int32_t n_plp_inbox;
    bool eng_finished;
    osp_finish_reason eng_reason;
    bool core_lost;           /* --engine-process: it ended because the core process died */
    double t_added, t_sched, t_first_tok; /* osp_engine_add, first scheduled (engine), first token (0: not yet) */
    /* connection thread only */
    int32_t *work;
    int32_t cap_work;
    osp_token_logprobs *lp_work;  /* [cap_work] */
    json_t *lp;                   /* logprobs of the consumed tokens: chat [{token, logprob, bytes,
                                     top_logprobs}], completions {tokens, token_logprobs, top_logprobs,
                                     text_offset} */
    size_t lp_sent;               /* entries already streamed */
    bool seen_finished;
    srv_text text;
    int32_t n_out;            /* tokens consumed (counted as completion tokens) */
    bool done;
    const char *finish;       /* "stop", "length", "abort", "error" */
    bool final_sent;
    /* a chat streamed through the tool or reasoning parsers (sse.c): bytes of the reasoning and of the
     * content (the tool calls' text, for a named tool_choice: its arguments) already streamed */
    size_t r_sent, c_sent;
    bool tool_head_sent;      /* named tool_choice: the call's id and name went out */
    int32_t n_cached;         /* prompt tokens the prefix cache served (job->mu) */
    float *embd;              /* an embedding input: its vector [n_embd] from the finishing output (job->mu) */
    int32_t n_embd;
    uint64_t kv_transfer_id;  /* do_remote_decode: the finishing output's held transfer (job->mu) */
    int32_t kv_transfer_num_blocks;
};

struct srv_job {
    srv_server *srv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                 /* the connection + engine requests not yet finished */
    int32_t n_unacked;        /* --engine-process: choices sent whose ACK has not come (job->mu) */
    osp_status admit_fail;    /* the first refusal (INVALID_ARG) or loss (IO) of a choice (job->mu) */
    char admit_why[160];
    bool conn_done;           /* the connection let the job go (job->mu) */
    bool changed;             /* new tokens or a finish since the last drain */
    srv_gen_request req;
    char id[48];
    time_t created;
    double t_arrival, t_first;
    int32_t *prompt_lens;     /* [n_prompts] */
    char **echo;              /* [n_prompts] prompt texts when echo */
    bool echo_only;           /* echo with max_tokens 0: the engine samples one token, which is dropped */
    bool prompt_lp;           /* echo + logprobs (not streamed): the prompt tokens' logprobs lead each
                                 choice's logprobs, the first token's null (OpenAI's and vLLM's form) */
    int32_t n_seqs;
    srv_seq *seqs;
    struct MHD_Connection *conn;
    srv_park park;            /* the connection, parked while the job waits for the engine; watched
                                 from srv_job_start to srv_job_http_done */
    bool http_done, client_gone;
    /* SSE */
    char *out;
    size_t out_len, out_off, out_cap;
    bool started, finished_stream;
    /* /v1/responses (responses_out.c) */
    int64_t resp_seq;         /* the next stream event's sequence_number */
    int resp_stage;           /* streaming: 0 nothing sent, 1 created, 2 the message item opened, 3 done */
    json_t *resp_final;       /* the finished response object, built (and stored) once */
};

/* Renders the chat (chat route) into r->prompts[0] and tokenizes every text prompt into its ids
 * (completions get BOS, a rendered chat does not). Returns 0, or -1 with *err (400: empty after
 * tokenization or a chat template error; 500: out of memory, tokenizer failure). */
int srv_build_prompts(srv_server *srv, srv_gen_request *r, srv_error *err);
/* The text of ids[0..n) with special tokens kept (malloc'd), or NULL when out of memory. */
char *srv_detok_all(srv_server *srv, const int32_t *ids, int32_t n);
/* Creates the job for a request whose prompts are built and queues its engine requests; takes over
 * *r (left zeroed). Counts the job in srv->in_flight. Returns NULL with *err set (400: context length,
 * min_tokens, the engine refused a request; 500: out of memory), in which case nothing runs. */
srv_job *srv_job_start(srv_server *srv, srv_gen_request *r, struct MHD_Connection *conn, srv_error *err);
/* --engine-process: have the core's answers to the job's adds come? 0: not all yet (park and look
 * again on news); 1: every choice admitted; -1: one was refused or lost, *err says why (400: refused;
 * 503: the core died or did not answer), and the caller gives the job up with srv_job_cancel. In
 * process the engine admits at add: always 1. Connection thread. */
int srv_job_admitted(srv_job *j, srv_error *err);
/* Gives up a job whose admission failed (srv_job_admitted -1) before any reply: aborts its admitted
 * choices, undoes srv_job_start's accounting (in_flight, the watch list) without counting a request,
 * drops the connection's reference. Connection thread. */
void srv_job_cancel(srv_job *j);
/* Connection thread: waits up to timeout_ms for news (0: does not wait; the pool threads never do),
 * then turns new tokens into text (stop strings end a choice and abort its engine request). Returns
 * true when something changed. */
bool srv_job_pump(srv_job *j, int timeout_ms);
/* Every choice has its finish reason. */
bool srv_job_all_done(const srv_job *j);
/* Did a choice end because the core process died? (Then the reply is an error: 503 JSON, or an SSE
 * error event and [DONE].) */
bool srv_job_core_lost(const srv_job *j);
extern const char k_core_lost_message[];
/* The connection is done with the job (reply sent, or client gone): takes its park off the watch list,
 * aborts what still runs, logs the request and its metrics, drops the connection's reference (the job
 * may be freed: do not touch it after). Idempotent. Connection thread. */
void srv_job_http_done(srv_job *j);

/* ---- OpenAI JSON (openai_json.c) ----------------------------------------------------------- */

/* Completions with echo: appends the prompt's logprobs to s->lp, which must hold no entry yet (else it
 * does nothing): the first prompt token (ids[0]) with a null logprob and null top_logprobs, then
 * plp[0..n) (prompt tokens 1..n, top entries capped at req.logprobs, the token itself always among its
 * top_logprobs as vLLM does); plp may be NULL with n 0 (a one-token prompt: the null entry alone).
 * text_offset counts the bytes of the token texts from 0. */
void srv_json_add_prompt_logprobs(srv_job *j, srv_seq *s, const int32_t *ids, const osp_token_logprobs *plp, int32_t n);
/* Appends one consumed token's logprobs (capped at req.logprobs top entries) to s->lp in the route's
 * format. Connection thread. */
void srv_json_add_logprobs(srv_job *j, srv_seq *s, const osp_token_logprobs *lp);
/* The /v1/embeddings reply (embed.c): {"object": "list", "data": [{"object": "embedding", "index",
 * "embedding": floats or base64 of little-endian float32}], "model", "usage": {prompt_tokens,
 * total_tokens}}, from a finished job whose every choice has its vector. New ref; NULL when out of
 * memory. */
json_t *srv_json_embeddings(const srv_job *j);
/* The bytes of v[0..n) as little-endian float32, base64-encoded (RFC 4648, padded): what OpenAI's
 * encoding_format "base64" returns. malloc'd, NUL-terminated; NULL when out of memory. */
char *srv_embd_base64(const float *v, int32_t n);
/* The whole non-streaming reply: a text_completion or chat.completion object with usage (new ref). */
json_t *srv_json_final(srv_job *j);
/* A stream chunk for choice i: text piece [len] (or NULL), finish reason (or NULL), role (the chat's
 * first chunk). Takes the logprobs streamed since the last chunk (advances s->lp_sent). New ref. */
json_t *srv_json_chunk(srv_job *j, int32_t i, const char *text, size_t len, const char *finish, bool role);
/* A chat stream chunk for choice i with this delta object (stolen; NULL: {}) and finish reason (or
 * NULL); takes the logprobs streamed since the last chunk, as srv_json_chunk. New ref. */
json_t *srv_json_chunk_delta(srv_job *j, int32_t i, json_t *delta, const char *finish);
/* Does the chat's output go through a tool parse (tool_choice required or named, or auto with
 * --tool-call-parser)? */
bool srv_job_tool_mode(const srv_job *j);
/* Choice i's finished text through the reasoning and tool parsers: content (NULL: none), reasoning
 * (NULL: none) and tool calls (NULL: none), and the finish reason ("tool_calls" when calls ended the
 * reply). Strings are malloc'd, calls a new ref. 0, or -1 when out of memory. */
int srv_job_chat_parts(const srv_job *j, int32_t i, char **content, char **reasoning, json_t **calls, const char **finish);
/* The seed of choice i's tool-call ids (from the job id: ids differ between jobs and choices). */
uint64_t srv_job_call_seed(const srv_job *j, int32_t i);
/* The last stream chunk when stream_options.include_usage: no choices, the usage. New ref. */
json_t *srv_json_usage_chunk(const srv_job *j);

/* ---- the Responses API's output (responses_out.c) ------------------------------------------- */

/* The finished response object of a /v1/responses job (status completed, incomplete with
 * incomplete_details when max_output_tokens or the context cut it, failed when the generation
 * failed): output items (a message with its output_text, function_call items, a reasoning item with
 * --reasoning-parser), usage, and the request's echoed fields. Built once; with store, the response
 * and its conversation go to srv->responses (previous_response_id) then. New reference. */
json_t *srv_responses_final(srv_job *j);
/* Streaming: turns what the pump produced into OpenAI's typed SSE events in j->out (response.created,
 * response.in_progress, then per output item: output_item.added, content_part.added,
 * output_text.delta..., output_text.done, content_part.done, output_item.done; function_call items
 * with function_call_arguments.delta / .done; response.completed, .incomplete or .failed last), each
 * "event: TYPE" + "data: {..., "sequence_number": n}". Sets j->finished_stream after the last. */
void srv_responses_stream_fill(srv_job *j);
/* Ends a Responses stream with an "error" event ({"code": "server_error", "message"}). */
void srv_responses_stream_error(srv_job *j, const char *message);
/* Appends bytes to a streaming job's output buffer (sse.c). */
void srv_sse_put(srv_job *j, const char *s, size_t n);

/* ---- parked connections (park.c) ---------------------------------------------------------- */

typedef enum {
    SRV_PARK_SUSPENDED, /* parked: return to libmicrohttpd; the handler or reader is called again on wake */
    SRV_PARK_AGAIN,     /* news came since the last look: not parked, look again */
    SRV_PARK_GONE,      /* the client left (or the daemon stops): not parked, give the request up */
    SRV_PARK_EXPIRED,   /* the deadline passed: not parked */
} srv_park_result;

/* Starts the watcher thread (and inits park_mu, park_cv): 0, or -1 when the thread cannot start. */
int srv_park_start(srv_server *srv);
/* The daemon is about to stop: every listed park is resumed and none parks again (GONE). Before
 * MHD_stop_daemon, which must not find a suspended connection. */
void srv_park_stop_all(srv_server *srv);
/* Ends the watcher thread (after MHD_stop_daemon). */
void srv_park_join(srv_server *srv);
/* p for connection c, not listed, not suspended; its fd from libmicrohttpd. srv_park_destroy when
 * its owner (a job, a connection's context) goes (idempotent, and a no-op on a zeroed park). */
void srv_park_init(srv_park *p, struct MHD_Connection *c);
void srv_park_destroy(srv_park *p);
/* Lists p (idempotent): its socket is watched for its client leaving; queue: woken by
 * srv_park_wake_queue; deadline (srv_now_s() seconds, 0: none) marks it expired and wakes it. Clears
 * a past expiry (a pending wake stays). Connection thread. */
void srv_park_watch(srv_server *srv, srv_park *p, bool queue, double deadline);
/* Takes p off the list (idempotent). Connection thread, p not suspended; before the connection can
 * close (the watcher polls listed sockets). */
void srv_park_unwatch(srv_server *srv, srv_park *p);
/* Connection thread, from the access handler or the content reader only: suspends p's connection
 * unless there is news, its client left, or its deadline passed (see srv_park_result). A wake between
 * the caller's last look and this call is never lost: it makes this call say AGAIN. */
srv_park_result srv_park_suspend(srv_server *srv, srv_park *p);
/* Has p's client left (or does the daemon stop)? */
bool srv_park_gone(srv_server *srv, srv_park *p);
/* Any thread: resumes p's connection if suspended, else the next srv_park_suspend says AGAIN. p must
 * be alive (its job or connection context); a job's mutex may be held. Takes p's lock only. */
void srv_park_wake(srv_server *srv, srv_park *p);
/* Any thread: wakes every park waiting for a queue slot (a slot freed, or the server drains). */
void srv_park_wake_queue(srv_server *srv);
/* Is the peer of socket fd still there? poll(POLLRDHUP): a peer that closed or half-closed its end is
 * gone even with bytes of its own still unread; so is a reset socket; readable with a peek that reads
 * 0 bytes is an orderly close. fd < 0: true. Does not read or block. */
bool srv_fd_alive(int fd);

/* ---- SSE (sse.c) --------------------------------------------------------------------------- */

/* Queues the text/event-stream reply of a streaming job on c; the response's callbacks pump the job
 * and release it (srv_job_http_done) when the stream ends or the client goes. Returns MHD's result
 * (MHD_NO after releasing the job when the response cannot be made). */
enum MHD_Result srv_sse_queue(srv_job *j, struct MHD_Connection *c);

/* ---- routes (routes.c) --------------------------------------------------------------------- */

/* Queues response r on c with what every reply carries (a 503: Retry-After, Connection: close). */
enum MHD_Result srv_queue_response(srv_server *srv, struct MHD_Connection *c, unsigned status, struct MHD_Response *r);
/* MHD_NotifyConnectionCallback (cls: the srv_server): counts open connections in srv->n_connections. */
void srv_on_connection(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);
/* MHD_AccessHandlerCallback (cls: the srv_server) and MHD_RequestCompletedCallback for the daemon. */
enum MHD_Result srv_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls);
void srv_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);

#endif
