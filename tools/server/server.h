/* osprey serve: an OpenAI-compatible HTTP server over the engine (tools/server/).
 *
 *   request.c      JSON body -> srv_gen_request (validation, OpenAI/vLLM field meanings); no engine,
 *                  no HTTP, so the libFuzzer target (tests/fuzz/fuzz_request.c) drives it directly
 *   text.c         per-choice output text: incremental detokenizer, stop strings found in the text
 *                  (inside or across tokens) and held back until decided
 *   chat.c         messages -> prompt text (the chat-template hook); osprey chat's conversation files
 *   metrics.c      Prometheus text with vLLM V1's metric names, latency histograms
 *   serve.c        flags, start-up, SIGTERM drain; it and the four below share serve_internal.h
 *   serve_jobs.c   jobs between the HTTP threads and the engine's loop thread
 *   openai_json.c  response, stream chunk, logprobs and usage objects
 *   embed.c        the /v1/embeddings reply
 *   sse.c          streaming replies (text/event-stream)
 *   routes.c       libmicrohttpd's request handler: body, auth, routes, error replies
 *   access.c       the API key (constant time) and CORS (vLLM's flags, Starlette's headers)
 *   core_proc.c    --engine-process / --api-server-count: the EngineCore in a child process
 *   kv_transfer.c  prefill/decode disaggregation: --kv-transfer-config, kv_transfer_params in and out
 *   tls.c          --ssl-keyfile / --ssl-certfile (tls.h), shared with osprey router
 *   startup_log.c  the start-up log's load progress bar and URL (pure text)
 *   serve_startup.c  the start-up log's memory line, the load bar on a terminal
 * Everything here is tool code: it may print (stderr) and exit. */
#ifndef OSPREY_TOOLS_SERVER_H
#define OSPREY_TOOLS_SERVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "osprey/engine.h"
#include "osprey/spec.h"
#include "osprey/tokenizer.h"

#define SRV_MAX_LOGPROBS 20
#define SRV_MAX_STOPS 16
#define SRV_MAX_STOP_LEN 256
#define SRV_MAX_N 128 /* choices per request (n times the number of prompts) */

/* ---- errors -------------------------------------------------------------------------------- */

/* An error to send back as OpenAI's {"error": {"message", "type", "param", "code"}}. */
typedef struct srv_error {
    int status;        /* HTTP status: 400, 401, 404, 413, 500, 503 */
    char message[512];
    char param[64];    /* the offending field, "" for none */
} srv_error;

/* Fills *err (status, printf message, param may be NULL); returns -1 for `return srv_fail(...)`. */
int srv_fail(srv_error *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The error JSON body (malloc'd string). */
char *srv_error_json(const srv_error *err);

/* ---- requests ------------------------------------------------------------------------------ */

typedef enum srv_route {
    SRV_ROUTE_COMPLETIONS = 0,
    SRV_ROUTE_CHAT = 1,
    SRV_ROUTE_EMBEDDINGS = 2, /* /v1/embeddings: prompts from `input`, prefill-only engine requests */
} srv_route;

/* vLLM's --tool-call-parser (toolcall.c): how a model writes tool calls in its text. */
typedef enum srv_tool_parser {
    SRV_TOOL_PARSER_NONE = 0,
    SRV_TOOL_PARSER_HERMES,      /* <tool_call>{"name": .., "arguments": {..}}</tool_call> (Hermes, Qwen2.5/3) */
    SRV_TOOL_PARSER_LLAMA3_JSON, /* {"name": .., "parameters": {..}} as the whole reply (Llama 3.1+) */
    SRV_TOOL_PARSER_MISTRAL,     /* [TOOL_CALLS][{"name": .., "arguments": {..}}, ...] (Mistral) */
} srv_tool_parser;

/* vLLM's --reasoning-parser (toolcall.c): where a reasoning model's <think>...</think> ends. */
typedef enum srv_reasoning_parser {
    SRV_REASONING_NONE = 0,
    SRV_REASONING_DEEPSEEK_R1, /* the template opens <think>: text up to </think> is reasoning */
    SRV_REASONING_QWEN3,       /* reasoning only inside an explicit <think>...</think> */
} srv_reasoning_parser;

/* tool_choice (OpenAI): none, auto, required, or one named function. */
typedef enum srv_tool_choice {
    SRV_TOOL_CHOICE_NONE = 0,
    SRV_TOOL_CHOICE_AUTO,
    SRV_TOOL_CHOICE_REQUIRED,
    SRV_TOOL_CHOICE_NAMED,
} srv_tool_choice;

typedef struct srv_prompt {
    char *text;     /* a text prompt (NUL-terminated, valid UTF-8), or NULL */
    int32_t *ids;   /* [n_ids] token ids when the prompt was given as ids */
    int32_t n_ids;
} srv_prompt;

typedef struct srv_gen_request {
    srv_route route;
    char *model;                /* NULL when absent */
    srv_prompt *prompts;        /* completions, embeddings (`input`): [n_prompts] */
    int32_t n_prompts;
    json_t *messages;           /* chat: normalized [{"role": str, "content": str}, ...] (owned) */
    bool add_generation_prompt; /* chat: true */
    bool continue_final_message;
    char *chat_template;        /* per-request template, or NULL */
    json_t *chat_template_kwargs; /* object or NULL (owned) */
    int32_t max_tokens;         /* -1: default (16 for completions, the rest of the context for chat) */
    int32_t n;
    float temperature, top_p, min_p;
    int32_t top_k;              /* -1 or 0: off */
    float presence_penalty, frequency_penalty, repetition_penalty;
    bool seed_set;
    uint64_t seed;
    char **stop;                /* [n_stop] non-empty strings */
    int32_t n_stop;
    int32_t *stop_token_ids;
    int32_t n_stop_token_ids;
    bool include_stop_str_in_output, ignore_eos, skip_special_tokens, echo;
    bool stream, include_usage;
    int32_t min_tokens;
    int32_t *bias_ids;          /* logit_bias: [n_bias] token ids and values (clamped to [-100, 100]) */
    float *bias_values;
    int32_t n_bias;
    int32_t logprobs;           /* -1: none; else the number of top logprobs (0..20) */
    char *user, *cache_salt;
    char *grammar;              /* structured output as GBNF (structured.c, toolcall.c), or NULL */
    json_t *tools;              /* chat: [{"type": "function", "function": {name, description?, parameters?}}]
                                   as given (validated), or NULL (owned) */
    srv_tool_choice tool_choice; /* NONE without tools; AUTO by default with tools */
    char *tool_name;            /* SRV_TOOL_CHOICE_NAMED: the function's name */
    bool parallel_tool_calls;   /* true (OpenAI's default); false: at most one call */
    srv_tool_parser tool_parser; /* the server's --tool-call-parser, used with tool_choice auto */
    srv_reasoning_parser reasoning_parser; /* the server's --reasoning-parser (chat only) */
    bool embd_base64;           /* embeddings: encoding_format "base64" (little-endian float32), else "float" */
    char **unknown;             /* top-level fields that were ignored, for the debug log */
    int32_t n_unknown;
    /* /v1/responses (responses.c): the request came as a Responses API body, turned into this chat
     * request; route is SRV_ROUTE_CHAT, n 1 */
    bool responses;
    json_t *resp_echo;          /* the fields the response object repeats (instructions, tools in the
                                   flat shape, metadata, ...: srv_responses_to_chat) (owned) */
    json_t *resp_conversation;  /* the conversation so far without instructions: the previous
                                   response's, then this input (normalized chat messages) (owned) */
    bool resp_store;            /* keep the response for previous_response_id */
    /* kv_transfer_params (srv_parse_kv_transfer_params): set when it asks for do_remote_decode or
       do_remote_prefill (the engine's rp.kv_transfer); both false or absent: not set */
    bool kv_transfer_set;
    osp_kv_transfer_params kv_transfer;
} srv_gen_request;

typedef struct srv_parse_limits {
    int32_t n_vocab;            /* token ids (prompt, stop_token_ids, logit_bias) must be below it */
    bool auto_tool_choice;      /* --enable-auto-tool-choice */
    srv_tool_parser tool_parser; /* --tool-call-parser (NONE: not given) */
    srv_reasoning_parser reasoning_parser; /* --reasoning-parser (NONE: not given) */
    int32_t n_embd;             /* embeddings: the model's hidden size (named in the 'dimensions' refusal) */
    osp_kv_role kv_role;        /* --kv-transfer-config's kv_role (NONE: not given): which kv_transfer_params
                                   flags the server takes */
} srv_parse_limits;

/* Parses and validates a /v1/completions, /v1/chat/completions or /v1/embeddings body. Embeddings
 * (OpenAI's and vLLM's request): `input` a string, a list of strings, a list of token ids or a list of
 * token-id lists (at most SRV_MAX_N inputs, none empty, ids below lim->n_vocab), `encoding_format`
 * "float" (default) or "base64", `model`, `user` (advisory: no effect); `dimensions` is refused (no
 * model here was trained for shortened embeddings), as is every other field but those set to null.
 * Returns 0 and fills *req (free it with srv_gen_request_free, also after an error), or -1 with *err
 * set (400 for malformed JSON, wrong types and out-of-range values). */
int srv_parse_gen_request(const char *body, size_t len, srv_route route, const srv_parse_limits *lim,
                          srv_gen_request *req, srv_error *err);
void srv_gen_request_free(srv_gen_request *req);
/* The structured-output fields of a request body (response_format, vLLM's guided_* and
 * structured_outputs) -> req->grammar (GBNF, checked to compile). Returns 0, or -1 with a 400 naming
 * the field for anything it cannot honour (structured.c lists what). */
int srv_parse_structured(const json_t *root, srv_gen_request *req, srv_error *err);

/* The tool fields of a chat request body (toolcall.c): tools, tool_choice, parallel_tool_calls. Fills
 * req->tools, tool_choice, tool_name, parallel_tool_calls, tool_parser; for tool_choice required or a
 * named function also req->grammar (the calls' JSON under the tools' parameter schemas), so that any
 * model answers with valid calls. Returns 0, or -1 with a 400 naming the field: tools that are not
 * [{"type": "function", "function": {"name", "parameters": object}}], duplicate or bad names, a
 * tool_choice naming a function not in tools, tool_choice auto without --enable-auto-tool-choice and
 * --tool-call-parser (vLLM's message), required / named with response_format or guided_* (two
 * grammars), a parameters schema the grammar compiler cannot enforce (forced choices only). */
int srv_parse_tools(const json_t *root, const srv_parse_limits *lim, srv_gen_request *req, srv_error *err);

/* Validates a chat messages array as /v1/chat/completions does and returns its normalized form in
 * *out (new reference; NULL on error): [{"role", "content": string, "name"?, "tool_calls"?,
 * "tool_call_id"?}], roles system, developer, user, assistant or tool; a list of text parts becomes
 * their texts joined with "\n" (as vLLM does); an assistant's null or absent content becomes "";
 * tool_calls' arguments given as JSON text become the object. The empty array is accepted (the
 * request parser refuses it itself). Returns 0, or -1 with a 400 naming the message
 * ("messages[3].role ...") for anything else, 500 when out of memory. m is not changed. */
int srv_messages_normalize(const json_t *m, json_t **out, srv_error *err);

/* Parses an optional integer/real/bool/string field of `obj` (JSON null = absent). Return 0 when
 * absent or valid (value written), -1 with *err on a wrong type or a value outside [lo, hi]. */
int srv_get_int(const json_t *obj, const char *key, long long lo, long long hi, long long *out, srv_error *err);
int srv_get_bool(const json_t *obj, const char *key, bool *out, srv_error *err);

/* ---- prefill/decode disaggregation (kv_transfer.c) ------------------------------------------- */

/* --kv-transfer-config (vLLM's KVTransferConfig JSON): what osp_engine_params.kv_* get. */
typedef struct srv_kv_transfer_config {
    osp_kv_role role;           /* kv_role: kv_producer | kv_consumer | kv_both; NONE: no flag given */
    char ip[256];               /* kv_ip: the producer's listening address (127.0.0.1) */
    int32_t port;               /* kv_port (0: any free port) */
    int64_t buffer_bytes;       /* kv_buffer_size in bytes (0: not given: the engine's 1 GiB) */
    double timeout_s;           /* kv_connector_extra_config.timeout_s (0: not given: the engine's 120 s) */
} srv_kv_transfer_config;

/* Parses --kv-transfer-config's JSON: an object with kv_connector "OspreyConnector" and kv_role
 * (required), kv_ip (a string), kv_port (0..65535), kv_buffer_size (a number of bytes > 0),
 * kv_connector_extra_config ({"timeout_s": seconds > 0}). Returns 0 and fills *out, or -1 with a
 * message naming the offending key in why[why_cap] (not JSON, not an object, an unknown key, a wrong
 * type or value, a required key missing). Pure. */
int srv_kv_transfer_config_parse(const char *text, srv_kv_transfer_config *out, char *why, size_t why_cap);
/* "kv_producer", "kv_consumer", "kv_both" or "none". */
const char *srv_kv_role_name(osp_kv_role r);
/* A request body's `kv_transfer_params` (vLLM's NixlConnector fields: do_remote_decode,
 * do_remote_prefill, remote_engine_id and remote_request_id as 16 hex digits, remote_host,
 * remote_port 1..65535, remote_block_ids (ints >= 0; only their number is used), tp_size 1; JSON null
 * is "not given") -> req->kv_transfer / kv_transfer_set. Call once req->stream, n and the prompts are
 * parsed. Absent, null, or both flags false: 0 and nothing set. 400 naming the field for: not an
 * object, an unknown key, a wrong type or value, both flags, do_remote_prefill without every remote_*
 * field, do_remote_decode streamed or with n > 1 or several prompts, a flag the server's role
 * (`role`) does not take (none: no flag at all). */
int srv_parse_kv_transfer_params(const json_t *root, osp_kv_role role, srv_gen_request *req, srv_error *err);
/* The producer's reply for a do_remote_decode request (what vLLM's NixlConnector returns, for the proxy
 * to copy into the decode request): {"do_remote_prefill": true, "do_remote_decode": false,
 * "remote_engine_id", "remote_host", "remote_port" (from info), "remote_request_id" (transfer_id),
 * "remote_block_ids": [0..num_blocks), "tp_size": 1}; JSON null when num_blocks <= 0 or info has no
 * role (nothing held). New reference; NULL when out of memory. */
json_t *srv_json_kv_transfer_params(const osp_kv_transfer_info *info, uint64_t transfer_id, int32_t num_blocks);

/* ---- the Responses API (responses.c) --------------------------------------------------------- */

/* A /v1/responses body, checked and turned into the chat route's terms. */
typedef struct srv_responses_request {
    json_t *chat;               /* a /v1/chat/completions body without "messages" (owned) */
    json_t *input;              /* `input` as normalized chat messages (owned) */
    char *instructions;         /* or NULL */
    char *previous_response_id; /* or NULL */
    bool store;                 /* true unless "store": false */
    json_t *echo;               /* the response object's echoed fields (owned) */
} srv_responses_request;

/* Parses a /v1/responses body (OpenAI's Responses API) into *out (free with
 * srv_responses_request_free, also after an error). input: a string (one user message) or a list of
 * items: messages (role user, system, developer or assistant; content a string or input_text /
 * output_text parts), function_call and function_call_output (the tool round trip: an assistant
 * message's tool_calls and a tool message), reasoning items (dropped: the chat templates drop past
 * reasoning). instructions, max_output_tokens, temperature, top_p, tools (function tools in the flat
 * shape {"type": "function", "name", "description", "parameters", "strict"}), tool_choice,
 * parallel_tool_calls, text.format (text, json_object, json_schema), stream, store,
 * previous_response_id, model become their chat fields or out's; metadata (at most 16 string values,
 * keys <= 64 and values <= 512 characters), user, service_tier, safety_identifier, prompt_cache_key,
 * truncation "disabled" and an empty include are accepted with no effect. Anything else (reasoning,
 * background, built-in tools such as web_search, conversation, prompt, image or file inputs, ...) is
 * a 400 naming the field. Returns 0, or -1 with *err (400; 500 when out of memory). Pure: no
 * engine, no store. */
int srv_responses_parse(const char *body, size_t len, srv_responses_request *out, srv_error *err);
void srv_responses_request_free(srv_responses_request *rq);

/* The chat request of rq: messages = [instructions as a system message] + history (the previous
 * response's conversation, normalized messages, or NULL) + rq->input, the rest from rq->chat, parsed
 * by srv_parse_gen_request (so every chat rule holds: tools, structured output, sampling ranges); a
 * 400's param is given in Responses terms (max_output_tokens, text.format, input). Fills *req with
 * responses set and resp_echo, resp_conversation (history + input), resp_store. Returns 0, or -1
 * with *err (free *req either way with srv_gen_request_free). */
int srv_responses_to_chat(const srv_responses_request *rq, const json_t *history, const srv_parse_limits *lim,
                          srv_gen_request *req, srv_error *err);

/* The store behind previous_response_id: the last `capacity` stored responses, least recently used
 * evicted first; thread-safe. Each entry holds a response object and the conversation it ends
 * (normalized chat messages: its input and history, then its output as an assistant message);
 * message objects are shared between entries by reference count, never changed. */
typedef struct srv_resp_store srv_resp_store;
/* capacity >= 0 (0: nothing is kept). NULL when out of memory. */
srv_resp_store *srv_resp_store_new(int32_t capacity);
void srv_resp_store_free(srv_resp_store *st);
/* Stores (id, response, conversation), taking both references (also on failure); an existing id is
 * replaced. Evicts the least recently used entry when full. 0, or -1 when out of memory. */
int srv_resp_store_put(srv_resp_store *st, const char *id, json_t *response, json_t *conversation);
/* Deep copies of entry id's response and conversation (either pointer may be NULL: not wanted; the
 * caller owns them); marks it most recently used. 0, or -1 when id is not stored (or out of memory). */
int srv_resp_store_get(srv_resp_store *st, const char *id, json_t **response, json_t **conversation);
/* Removes id: 0, or -1 when it is not stored. */
int srv_resp_store_delete(srv_resp_store *st, const char *id);
/* Entries stored now. */
int32_t srv_resp_store_size(srv_resp_store *st);

/* ---- output text --------------------------------------------------------------------------- */

/* One choice's text as tokens arrive. Text before `sent` was handed out; text in [sent, ready) can be
 * handed out now; the rest is held back because it might be the start of a stop string. */
typedef struct srv_text {
    osp_detokenizer *dt;
    char *buf;                  /* [len] the output so far (valid UTF-8; cut at a matched stop) */
    size_t len, cap;
    size_t sent;
    char **stops;               /* borrowed from the request */
    int32_t n_stops;
    bool include_stop;
    bool stopped;               /* a stop string matched; no more text is appended */
    bool flushed;
    char *tmp;                  /* detokenizer output scratch */
    size_t tmp_cap;
} srv_text;

int srv_text_init(srv_text *t, const osp_tokenizer *tok, bool skip_special, char **stops, int32_t n_stops,
                  bool include_stop);
void srv_text_free(srv_text *t);
/* Appends the text of `id`. Returns 1 when a stop string matched (the text is cut there, after the
 * stop when include_stop), 0 otherwise, -1 on allocation failure. Ignored once stopped. */
int srv_text_push(srv_text *t, int32_t id);
/* End of the sequence: flushes the detokenizer and releases the held-back text. */
int srv_text_finish(srv_text *t);
/* Bytes that can be handed out now: [t->sent, srv_text_ready(t)). */
size_t srv_text_ready(const srv_text *t);

/* ---- chat ---------------------------------------------------------------------------------- */

struct osp_chat_template;
typedef struct srv_chat_env {
    const char *template_text;  /* --chat-template contents or the model's tokenizer.chat_template */
    const struct osp_chat_template *parsed; /* template_text parsed once at start-up, or NULL */
    const char *parse_error;    /* why template_text did not parse, or NULL */
    const char *bos_token, *eos_token;
    bool trust_request_template; /* a request's own chat_template is rendered (else 400, as vLLM) */
    /* per-render budgets (osp_chat_template_inputs; 0: the renderer's 512 MiB / 50M steps): the
     * model's (or --chat-template's) template, and a template that came with the request */
    size_t max_memory, request_max_memory;
    uint64_t max_steps, request_max_steps;
    /* --allow-special-tokens-in-content: tokenize the whole prompt with special-token parsing, so
     * control-token text in message content becomes control tokens (the old behaviour; off) */
    bool allow_special_in_content;
    struct srv_metrics *metrics; /* counts renders that lost provenance; NULL: not counted */
} srv_chat_env;

/* Fills *env for a model: the template from template_path when given, else the GGUF's
 * tokenizer.chat_template (none: template_text NULL), parsed once (parse_error set when it does not
 * parse), and the tokenizer's BOS/EOS texts; all owned by env (srv_chat_env_free). Returns -1 only
 * when template_path cannot be read. Shared by osprey serve and osprey chat. */
struct osp_gguf;
int srv_chat_env_load(srv_chat_env *env, const struct osp_gguf *g, const osp_tokenizer *tok, const char *template_path);
void srv_chat_env_free(srv_chat_env *env);

/* Renders req->messages into a prompt (malloc'd, *out) within env's budgets. Returns 0, or -1 with
 * *err (400 for a template error, a budget exceeded, a conversation it cannot render, or a request's
 * chat_template when env does not trust them). */
int srv_chat_render(const srv_chat_env *env, const srv_gen_request *req, char **out, srv_error *err);

/* Renders req->messages as srv_chat_render does and tokenizes the prompt: the bytes that came from
 * the request (message contents, tool calls, ...: osp_chat_template_render_spans) as plain text,
 * the template's markup with its special tokens (osp_tokenizer_encode_spans). With
 * env->allow_special_in_content, or when the render lost provenance (then counted in
 * env->metrics), the whole prompt is tokenized with special parsing, as before issue 20.
 * add_special: BOS/EOS as osp_tokenizer_encode. On success *text (the prompt, malloc'd) and *ids
 * ([*n_ids], malloc'd; NULL when empty) belong to the caller. Returns 0, or -1 with *err (400 as
 * srv_chat_render, 500 when tokenization fails) and nothing allocated. */
int srv_chat_prompt(const srv_chat_env *env, const osp_tokenizer *tok, const srv_gen_request *req, bool add_special,
                    char **text, int32_t **ids, size_t *n_ids, srv_error *err);

/* ---- conversation files (osprey chat's /save and /load) ------------------------------------- */

#define SRV_CONVERSATION_MAX_BYTES ((size_t)8 << 20) /* a larger file is refused unread */

/* A conversation file's bytes data[len] (need not be NUL-terminated) -> normalized messages in *out
 * (new reference; NULL on error). The file is a JSON array of OpenAI chat messages, as /save writes
 * it, or an object with such an array under "messages" (a /v1/chat/completions body: its other fields
 * are ignored); each message is checked and normalized by srv_messages_normalize, so what loads is
 * exactly what the server would accept, and dumping *out and parsing it again gives *out. An empty
 * array is an empty conversation. Returns 0, or -1 with *err (400): more than
 * SRV_CONVERSATION_MAX_BYTES, malformed JSON (with line and column), another top-level shape, a bad
 * message; 500 when out of memory. */
int srv_conversation_parse(const char *data, size_t len, json_t **out, srv_error *err);

/* ---- tool calls and reasoning in the output (toolcall.c) ----------------------------------- */

/* Parser names as vLLM spells them: "hermes", "llama3_json", "mistral"; "deepseek_r1", "qwen3".
 * Return 0, or -1 for an unknown name. */
int srv_tool_parser_from_name(const char *name, srv_tool_parser *out);
int srv_reasoning_parser_from_name(const char *name, srv_reasoning_parser *out);

/* A byte range [off, off + len) of a text; len 0 = absent. */
typedef struct srv_span {
    size_t off, len;
} srv_span;

/* Splits generated text[len] into reasoning and content (offsets into text). final = false for a
 * prefix still growing (streaming): a piece that may be the start of <think> or </think> is held
 * back (in neither span), so spans only grow as text arrives and the final split equals the
 * non-streamed one. deepseek_r1: text up to </think> is reasoning (a leading <think> dropped), all of
 * it when there is no </think>; qwen3: reasoning only when the text opens with <think> (then up to
 * </think>, or all of it when unterminated). NONE: all content. Source: vLLM's
 * reasoning/deepseek_r1_reasoning_parser.py and qwen3_reasoning_parser.py. */
void srv_reasoning_split(srv_reasoning_parser p, const char *text, size_t len, bool final, srv_span *reasoning,
                         srv_span *content);

/* The outcome of a tool-call parse. */
typedef struct srv_tool_result {
    char *content; /* malloc'd text outside the calls, or NULL when it is empty or only whitespace */
    json_t *calls; /* [{"id", "type": "function", "function": {"name", "arguments": JSON text}}] (new
                      ref), or NULL when the text holds no call */
} srv_tool_result;
void srv_tool_result_free(srv_tool_result *r);

/* Parses a finished reply text[len] with parser p (tool_choice auto). Calls get ids derived from
 * id_seed and their index ("call_" + 24 alphanumerics; mistral: 9, as its templates require). A reply
 * whose calls do not parse (bad JSON, no "name") is all content, no calls, as in vLLM. Returns 0, or
 * -1 when out of memory. Sources: vLLM's tool_parsers/hermes_tool_parser.py, llama_tool_parser.py,
 * mistral_tool_parser.py; OpenAI's ChatCompletionMessageToolCall. */
int srv_tool_parse(srv_tool_parser p, const char *text, size_t len, uint64_t id_seed, srv_tool_result *out);
/* The reply of a forced tool choice (text generated under srv_parse_tools' grammar): required: a JSON
 * array of {"name", "parameters"}; named: the arguments object of function `name`. Text that is not
 * such JSON (cut by max_tokens) gives no calls and the text as content; named always gives its one
 * call with the text as arguments (as vLLM). Returns 0, or -1 when out of memory. */
int srv_tool_parse_forced(srv_tool_choice choice, const char *name, const char *text, size_t len, uint64_t id_seed,
                          srv_tool_result *out);
/* Streaming (tool_choice auto): how many leading bytes of a growing text[len] are surely content
 * (before anything that is or may become a call's start marker). */
size_t srv_tool_content_prefix(srv_tool_parser p, const char *text, size_t len);
/* An OpenAI-style call id ("call_" + 24 alphanumerics, or 9 alphanumerics for mistral) from a seed
 * and an index, into out[cap >= 32]. */
void srv_tool_call_id(srv_tool_parser p, uint64_t seed, size_t index, char *out, size_t cap);

/* ---- access (access.c) ----------------------------------------------------------------------- */

/* given == secret, in time that depends on strlen(secret) only (not on where they differ). given may
 * be NULL (not equal). */
bool srv_secret_equal(const char *given, const char *secret);
/* Does the Authorization header value (or NULL) carry "Bearer <api_key>"? true when api_key is NULL
 * (no key configured). Constant time in the key. */
bool srv_bearer_ok(const char *authorization, const char *api_key);

/* The CORS policy (vLLM's --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials;
 * each list may hold "*" = any). Header names compare without case. */
typedef struct srv_cors {
    char **origins, **methods, **headers;
    int n_origins, n_methods, n_headers;
    bool credentials;
} srv_cors;
typedef enum srv_cors_list { SRV_CORS_ORIGINS, SRV_CORS_METHODS, SRV_CORS_HEADERS } srv_cors_list;
/* vLLM's defaults: every origin, method and header, no credentials. 0, or -1 when out of memory. */
int srv_cors_default(srv_cors *c);
/* Replaces one list from a flag's value: a JSON list of strings (vLLM's '["a","b"]') or a
 * comma-separated list. 0, or -1 with a reason in why. */
int srv_cors_set(srv_cors *c, srv_cors_list which, const char *value, char *why, size_t why_cap);
void srv_cors_free(srv_cors *c);
/* Adds one response header (name, value are copied by the callee). */
typedef void (*srv_header_fn)(void *ctx, const char *name, const char *value);
/* A preflight from origin asking for method and req_headers (the Access-Control-Request-Headers value,
 * or NULL): adds the response headers through add and writes the body ("OK" or "Disallowed CORS ...");
 * returns the status, 200 or 400. */
int srv_cors_preflight(const srv_cors *c, const char *origin, const char *method, const char *req_headers,
                       srv_header_fn add, void *ctx, char *body, size_t body_cap);
/* The headers of any other response to a request from origin (NULL: none are added). */
void srv_cors_simple(const srv_cors *c, const char *origin, bool has_cookie, srv_header_fn add, void *ctx);

/* ---- metrics ------------------------------------------------------------------------------- */

typedef struct srv_metrics srv_metrics;
srv_metrics *srv_metrics_new(void);
void srv_metrics_free(srv_metrics *m);
void srv_metrics_observe_ttft(srv_metrics *m, double seconds);
void srv_metrics_observe_itl(srv_metrics *m, double seconds, int64_t count);
void srv_metrics_observe_e2e(srv_metrics *m, double seconds);
/* One finished sequence's phases (vLLM's request_{queue,prefill,decode,inference}_time_seconds); a
 * negative value is not observed (a phase the sequence never reached). */
void srv_metrics_observe_phases(srv_metrics *m, double queue, double prefill, double decode, double inference);
void srv_metrics_request_done(srv_metrics *m, const char *finish_reason, int64_t prompt_tokens,
                              int64_t generation_tokens);
/* One chat render whose provenance was lost (osprey:chat_template_provenance_lost_total): its
 * prompt was tokenized the old way, special tokens parsed in message content too. */
void srv_metrics_count_provenance_lost(srv_metrics *m);

typedef struct srv_metrics_gauges {
    int32_t num_running, num_waiting;
    int32_t num_blocks, num_free_blocks;
    int64_t prefix_queries, prefix_hits, num_preemptions;
    int32_t in_flight;          /* HTTP generation requests being served */
    int32_t connections;        /* open HTTP connections */
    int64_t num_steps, num_scheduled_tokens;
    int64_t iteration_tokens[OSP_ENGINE_ITERATION_BUCKETS + 1]; /* the engine's steps by scheduled tokens */
    /* speculative decoding (vLLM's vllm:spec_decode_* counters), shown when spec_k > 0 */
    int32_t spec_k;
    int64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    int64_t spec_accepted_per_pos[OSP_SPEC_MAX_TOKENS];
    /* tiered KV offload (osp_engine_stats.offload_*), shown when a tier is configured */
    bool offload;
    int64_t offload_host_blocks, offload_disk_blocks, offload_stored, offload_loaded, offload_corrupt;
    int64_t offload_hits_tokens, offload_skipped_tokens, offload_write_errors, offload_missing;
    /* prefill/decode disaggregation (osp_engine_stats.kv_transfer_*), shown with --kv-transfer-config */
    bool kv_transfer;
    int64_t kv_transfer_held, kv_transfer_held_blocks, kv_transfer_sent_blocks, kv_transfer_dropped;
    int64_t kv_transfer_recv_blocks, kv_transfer_failed_blocks, kv_transfer_ipc_blocks;
    double kv_transfer_recv_seconds;
    bool engine_process;        /* --engine-process: show the core's restarts */
    int64_t core_restarts;
} srv_metrics_gauges;
/* The /metrics body (malloc'd). */
char *srv_metrics_render(srv_metrics *m, const char *model_name, const srv_metrics_gauges *g);

/* ---- the web page (webui.c; the files in tools/server/webui/, embedded by cmake/embed_webui.cmake) ---- */

/* One embedded static file: served at path ("/webui/<name>") with this Content-Type; bytes[len] is
 * NUL-terminated beyond len; etag is the quoted strong ETag ("\"<16 hex digits of SHA-256>\""). */
typedef struct srv_webui_asset {
    const char *path, *content_type;
    const unsigned char *bytes;
    size_t len;
    const char *etag;
} srv_webui_asset;
/* The generated table (build-dir/generated/webui_assets.c), sorted by name. */
extern const srv_webui_asset srv_webui_assets[];
extern const int srv_webui_n_assets;
/* The asset a GET of url serves, or NULL: "/" and "/dashboard" give the page (index.html; its script
 * opens the tab the path names), "/webui/<name>" that file. url is libmicrohttpd's, without the query
 * string. Pure. */
const srv_webui_asset *srv_webui_find(const char *url);
/* Does an If-None-Match header value (or NULL) match etag (RFC 9110 §13.1.2: "*", or a comma-separated
 * list of entity tags compared weakly, so W/"x" matches "x")? Pure. */
bool srv_webui_etag_match(const char *if_none_match, const char *etag);

/* ---- start-up log (startup_log.c) ---------------------------------------------------------- */

/* Writes "loading weights [####......]  40%" (a 30-character bar; fraction clamped to [0, 1], NaN as
 * 0) into out[cap], NUL-terminated and truncated to fit; returns the length written. The caller draws
 * it only on a terminal (isatty(2)), after a '\r'. Pure. */
size_t srv_progress_bar(char *out, size_t cap, double fraction);
/* Writes "<scheme>://<host>:<port>" into out[cap] (truncated to fit; returns the length): the address
 * a client on this machine opens. A wildcard host ("0.0.0.0", "::", empty or NULL) becomes loopback
 * (127.0.0.1, [::1]); an IPv6 literal gets brackets (RFC 3986 §3.2.2). Pure. */
size_t srv_local_url(char *out, size_t cap, const char *scheme, const char *host, unsigned port);

#endif
