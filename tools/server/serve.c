/* osprey serve: the OpenAI-compatible HTTP server; this file holds its flags (vLLM's names), start-up
 * and shutdown.
 *
 * Start-up: the engine (model, KV cache, scheduler) and its loop thread, the tokenizer, the chat
 * template (parsed once), the metrics, then libmicrohttpd listening on --host:--port in its event-loop
 * mode: a pool of --http-threads threads on epoll, each serving many connections, none blocked by a
 * request that waits (it parks its connection: park.c). At most --max-connections-per-client per
 * client address and --max-connections in all (past it requests get 503 + Retry-After; the daemon
 * refuses connections past N + N/16 + 16), each closed after --connection-timeout seconds idle.
 * SIGTERM/SIGINT (taken with sigwait on the main thread): stop taking requests (503), finish those in
 * flight for up to --drain-timeout seconds, exit 0. How a request runs is in serve_internal.h. */
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "osprey/engine.h"
#include "osprey/gguf.h"
#include "osprey/model.h"
#include "osprey/version.h"
#include "osprey_internal.h"
#include "serve_internal.h"
#include "url.h"
#include "tls.h"

double srv_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void srv_log(const srv_server *s, int level, const char *fmt, ...) {
    if (level < s->cfg.log_level) return;
    char ts[32];
    const time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(ts, sizeof ts, "%m-%d %H:%M:%S", &tm);
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %s %s\n", level == SRV_LOG_DEBUG ? "DEBUG" : level == SRV_LOG_INFO ? "INFO" : "WARNING", ts, line);
}

/* ---- flags and main ------------------------------------------------------------------------ */

static const char *k_serve_usage =
    "usage: osprey serve MODEL [options]      (or osprey serve -m MODEL [options], as before)\n"
    "  MODEL, -m, --model FILE          GGUF model (positional as in `vllm serve MODEL`; both forms at\n"
    "                                   once must name the same file)\n"
    "  --host HOST                      address to listen on (127.0.0.1)\n"
    "  --port N                         port (8000; 0 = any free port)\n"
    "  --api-key KEY                    require 'Authorization: Bearer KEY' on /v1/* (empty: no key)\n"
    "  --ssl-keyfile FILE               serve HTTPS with this PEM private key (needs --ssl-certfile; off)\n"
    "  --ssl-certfile FILE              the PEM certificate (chain, leaf first) of --ssl-keyfile (off)\n"
    "                                   (--ssl-ca-certs, client certificates, is not implemented: refused)\n"
    "  --served-model-name NAME         the model's name in the API (the file name)\n"
    "  --max-model-len N                prompt + output tokens (the model's context length)\n"
    "  --max-num-seqs N                 running sequences per step (64)\n"
    "  --max-num-batched-tokens N       token budget per step (2048)\n"
    "  --block-size N                   tokens per KV block (16)\n"
    "  --kv-cache-dtype D               auto|f16|f32|fp8|nvfp4|int8_hier (auto = f16; vLLM's fp16 and\n"
    "                                   fp8_e4m3 too; bf16 is not implemented yet; fp8 / nvfp4 on CPU and\n"
    "                                   CUDA; int8_hier, QuantSpec's 4+4-bit pages, on the CPU)\n"
    "  -ctk, --cache-type-k D           K pages only; -ctv, --cache-type-v D: V pages only (llama.cpp's;\n"
    "                                   win over --kv-cache-dtype; e.g. -ctk fp8 -ctv nvfp4; CPU only)\n"
    "  --kv-scales FILE                 fixed fp8 / nvfp4 KV scales from osprey calibrate-kv (default:\n"
    "                                   the documented constants; a file for another model is refused)\n"
    "  --kv-cache-memory BYTES          KV cache size, K/M/G suffixes (CPU: 1G; GPU: what\n"
    "                                   --gpu-memory-utilization leaves)\n"
    "  --gpu-memory-utilization F       share of GPU memory for weights + KV cache + activations (0.9;\n"
    "                                   GPU only)\n"
    "  --enable-prefix-caching / --no-enable-prefix-caching   (on)\n"
    "  --prefix-caching-hash-algo A     xxh3_128 (default) | sha256 | sha256_cbor (vLLM's: the block hashes\n"
    "                                   vLLM and llm-d compute from token ids under the same seed)\n"
    "  --prefix-caching-hash-seed N     block-hash seed shared by all replicas (else $OSPREY_HASH_SEED, else\n"
    "                                   $PYTHONHASHSEED as vLLM reads it; else random per process)\n"
    "  --kv-events-config JSON          publish KV cache events as vLLM does, e.g. '{\"enable_kv_cache_events\":\n"
    "                                   true, \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\"}'\n"
    "                                   (keys: publisher, endpoint, replay_endpoint, buffer_steps, hwm,\n"
    "                                   max_queue_size, topic; topic default kv@<$POD_IP or host>@<model>)\n"
    "  --kv-events-array-like           KV events in the older positional msgpack form (default: maps tagged \"type\")\n"
    "  --chat-template FILE             Jinja chat template instead of the model's\n"
    "  --trust-request-chat-template    render a request's own chat_template (off: such requests get 400)\n"
    "  --allow-special-tokens-in-content  special-token text in messages (\"<|im_end|>\") becomes control tokens,\n"
    "                                   as before (off: text from the request is tokenized as plain text)\n"
    "  --enable-auto-tool-choice        tool_choice auto: the model decides to call tools (needs --tool-call-parser)\n"
    "  --tool-call-parser NAME          how the model writes calls: hermes (<tool_call>, Qwen2.5/3, Hermes),\n"
    "                                   llama3_json (a bare {\"name\", \"parameters\"}), mistral ([TOOL_CALLS])\n"
    "  --reasoning-parser NAME          deepseek_r1 | qwen3: <think>...</think> goes to reasoning_content\n"
    "  --pooling mean|cls|last          how /v1/embeddings pools the output norm of the input's tokens (default:\n"
    "                                   the GGUF's <arch>.pooling_type, else last)\n"
    "  --no-embd-normalize              /v1/embeddings returns the pooled vectors as they are (default: L2-normalized)\n"
    "  --trace-shapes FILE              append each step's batch shape to FILE, one JSON line a step\n"
    "                                   (workloads for osprey bench-kernels)\n"
    "  --trace FILE                     write the step timeline to FILE (Chrome trace-event JSON: host phases,\n"
    "                                   device spans on the GPU); the GPU's idle share is logged at shutdown\n"
    "  -t, --threads N                  compute threads (all cores)\n"
    "  --device cpu|cuda|auto           where the model runs (auto: cuda when a GPU is present)\n"
    "  --gpu-weights bf16|quant         GPU: every matrix bf16 (default) or Q8_0/Q4_0/Q4_1/Q4_K/Q6_K kept in their\n"
    "                                   blocks (quant: integer tensor cores, activations in two int8 levels)\n"
    "  --cpu-activations two-level|q8   CPU: matmul inputs in two int8 levels (default), or one level (per 256\n"
    "                                   values for K-quants, per 32 for Q8_0/Q4_0/Q4_1/Q5_0/Q5_1: faster\n"
    "                                   prompts, llama.cpp's accuracy; KL in bench/cpu/NOTES.md)\n"
    "  --no-mmap                        CPU: copy the weight matrices out of the file mapping onto 2 MB pages\n"
    "                                   (llama.cpp's --no-mmap, with transparent huge pages: faster decode,\n"
    "                                   a longer load; the same results; with --cpu-activations q8 on\n"
    "                                   AVX512-VNNI the Q8_0/Q4_0/Q4_1/Q5_0/Q5_1 matrices in 16-row strips)\n"
    "  -tp, --tensor-parallel-size N    split the model over N ranks (vLLM's flag; CPU only so far: N threads\n"
    "                                   share the cores; llama / qwen2 / qwen3; default: 1)\n"    "  --kernel-table FILE              kernel selection table (bench-kernels --make-table; else $OSPREY_KERNEL_TABLE)\n"
    "  --speculative-config JSON        vLLM's speculative decoding config, e.g. '{\"method\": \"ngram\",\n"
    "                                   \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 5}' or '{\"method\":\n"
    "                                   \"draft_model\", \"model\": \"DRAFT.gguf\", \"num_speculative_tokens\": 4}' or\n"
    "                                   '{\"method\": \"quantspec\", \"num_speculative_tokens\": 3}' (the target drafts\n"
    "                                   for itself with 4-bit weights; best with --kv-cache-dtype int8_hier)\n"
    "                                   (off; ngram and draft_model also on the GPU, quantspec CPU only)\n"
    "  --sparse-attention S             topk:PAGES[,recent:R][,sink:S]: Quest top-k KV pages per query (off;\n"
    "                                   GPU: f16 pages, head_dim 64 / 128, groups of at most 16 heads)\n"
    "  --kv-offloading-size GIB         host-memory tier for prefix KV blocks the cache evicts (vLLM's; off)\n"
    "  --kv-offload-disk DIR            disk tier below it (files per block, checksummed; off)\n"
    "  --kv-offload-disk-size GIB       the disk tier's size (needed with --kv-offload-disk)\n"
    "  --kv-transfer-config JSON        prefill/decode disaggregation (vLLM's flag), e.g. '{\"kv_connector\":\n"
    "                                   \"OspreyConnector\", \"kv_role\": \"kv_producer\"}' (keys: kv_role kv_producer|\n"
    "                                   kv_consumer|kv_both, kv_ip (127.0.0.1), kv_port (0: any), kv_buffer_size\n"
    "                                   (bytes; 1 GiB), kv_connector_extra_config {\"timeout_s\": 120}; off)\n"
    "  --max-request-body BYTES         request body limit, K/M suffixes (4M)\n"
    "  --max-queued-requests N          generation requests in flight before 503 (1024)\n"
    "  --responses-store-size N         /v1/responses kept in memory for previous_response_id and GET\n"
    "                                   /v1/responses/{id}, least recently used dropped first (256; 0: none)\n"
    "  --queue-wait-timeout S           past --max-queued-requests, wait up to S seconds for a slot before\n"
    "                                   the 503 (0: 503 at once)\n"
    "  --drain-timeout S                on SIGTERM, wait this long for requests in flight (60)\n"
    "  --max-connections N              open HTTP connections; past N a request gets 503 + Retry-After\n"
    "                                   (/health, /metrics, /version still answered) and past N + N/16 + 16\n"
    "                                   new connections are closed at once (1024)\n"
    "  --max-connections-per-client N   open connections from one client address; more are closed at\n"
    "                                   once (512; 0 = no cap)\n"
    "  --connection-timeout S           close a connection idle (nothing received or sent) this long,\n"
    "                                   half-sent requests included; not while its request generates (30)\n"
    "  --http-threads N                 HTTP event-loop threads (epoll), each serving many connections\n"
    "                                   (the cores, 2..16)\n"
    "  --allowed-origins LIST           CORS origins, a JSON list or comma-separated (\"*\": any; the default)\n"
    "  --allowed-methods LIST           CORS methods (\"*\": any; the default)\n"
    "  --allowed-headers LIST           CORS request headers (\"*\": any; the default)\n"
    "  --allow-credentials              CORS: allow credentials (off)\n"
    "  --engine-process                 run the EngineCore (scheduler, KV cache, model) in a child process\n"
    "                                   over ZeroMQ; restarted if it dies (off: a thread of this process)\n"
    "  --api-server-count N             N HTTP frontend processes on one port (SO_REUSEPORT) sharing one\n"
    "                                   engine core process (implies --engine-process; 1)\n"
    "  --engine-heartbeat-timeout MS    with --engine-process: the core aborts the requests of a frontend\n"
    "                                   silent this long (5000)\n"
    "  --no-webui                       no chat page and dashboard at / and /dashboard (on; the page needs no\n"
    "                                   key, its API calls send the key typed in its settings)\n"
    "  --log-level debug|info|warning   (info)\n";

static long long parse_bytes(const char *flag, const char *v) {
    if (!v) cli_die(OSP_OK, "%s needs a value", flag);
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    double mul = 1;
    if (*end == 'k' || *end == 'K') mul = 1024.0, end++;
    else if (*end == 'm' || *end == 'M') mul = 1024.0 * 1024, end++;
    else if (*end == 'g' || *end == 'G') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B' || *end == 'b') end++;
    if (errno || end == v || *end || !(x >= 0) || x * mul > 9e18) cli_die(OSP_OK, "%s: '%s' is not a byte count", flag, v);
    return (long long)(x * mul);
}

/* Whether two paths name one file: the same text, or the same device and inode. */
static bool same_file(const char *a, const char *b) {
    if (!strcmp(a, b)) return true;
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

srv_config srv_parse_flags(int argc, char **argv) {
    srv_config c = {.host = "127.0.0.1", .port = 8000, .log_level = SRV_LOG_INFO, .max_num_seqs = 64,
                    .max_num_batched_tokens = 2048, .block_size = 16, .kv_cache_memory = 1ll << 30,
                    .prefix_caching = true, .max_body = 4u << 20, .max_queue = 1024, .drain_timeout_s = 60,
                    .max_connections = 1024, .max_connections_per_client = 512, .connection_timeout_s = 30,
                    .core_frontend_timeout_ms = 5000, .api_server_count = 1, .responses_store_size = 256};
    if (srv_cors_default(&c.cors)) cli_die(OSP_OK, "out of memory");
    cli_engine_args eng = cli_engine_args_default();
    const char *positional = NULL; /* osprey serve MODEL */
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            fputs(k_serve_usage, stdout);
            exit(0);
        } else if (cli_engine_arg(&eng, CLI_ENGINE_KV_DTYPE, argc, argv, &i)) {
            /* -m, -t, --device, --kv-cache-dtype, -ctk, -ctv: parsed as osprey generate and chat parse them */
        } else if (!strcmp(f, "--host")) c.host = v, i++;
        else if (!strcmp(f, "--port")) c.port = (int)cli_int(f, v, 0, 65535), i++;
        else if (!strcmp(f, "--api-key")) c.api_key = v[0] ? v : NULL, i++; /* empty: no key (as vLLM) */
        else if (!strcmp(f, "--served-model-name")) c.served_model_name = v, i++;
        else if (!strcmp(f, "--max-model-len")) c.max_model_len = (int32_t)cli_int(f, v, 1, INT32_MAX), i++;
        else if (!strcmp(f, "--max-num-seqs")) c.max_num_seqs = (int32_t)cli_int(f, v, 1, 1 << 16), i++;
        else if (!strcmp(f, "--max-num-batched-tokens")) c.max_num_batched_tokens = (int32_t)cli_int(f, v, 1, 1 << 24), i++;
        else if (!strcmp(f, "--block-size")) c.block_size = (int32_t)cli_int(f, v, 1, 1024), i++;
        else if (!strcmp(f, "--kv-cache-memory") || !strcmp(f, "--kv-cache-memory-bytes")) c.kv_cache_memory = parse_bytes(f, v), c.kv_cache_memory_set = true, i++;
        else if (!strcmp(f, "--enable-prefix-caching")) c.prefix_caching = true;
        else if (!strcmp(f, "--no-enable-prefix-caching")) c.prefix_caching = false;
        else if (!strcmp(f, "--chat-template")) c.chat_template_path = v, i++;
        else if (!strcmp(f, "--kv-events-config")) {
            const osp_status ks = osp_kv_events_config_parse(v ? v : "", &c.kv_events);
            if (ks != OSP_OK) cli_die(ks, "serve");
            c.kv_events_set = true, i++;
        } else if (!strcmp(f, "--kv-events-array-like")) c.kv_events_array_like = true;
        else if (!strcmp(f, "--kv-transfer-config")) {
            char why[320];
            if (srv_kv_transfer_config_parse(v ? v : "", &c.kv_transfer, why, sizeof why)) cli_die(OSP_OK, "%s", why);
            i++;
        }
        else if (!strcmp(f, "--trust-request-chat-template")) c.trust_request_chat_template = true;
        else if (!strcmp(f, "--no-webui")) c.no_webui = true;
        else if (!strcmp(f, "--allow-special-tokens-in-content")) c.allow_special_tokens_in_content = true;
        else if (!strcmp(f, "--enable-auto-tool-choice")) c.enable_auto_tool_choice = true;
        else if (!strcmp(f, "--tool-call-parser")) {
            if (srv_tool_parser_from_name(v, &c.tool_parser))
                cli_die(OSP_OK, "--tool-call-parser: '%s' is not hermes, llama3_json or mistral", v ? v : "");
            i++;
        } else if (!strcmp(f, "--pooling")) {
            if (osp_pooling_parse(v, &c.pooling) != OSP_OK) cli_die(OSP_OK, "--pooling: '%s' is not mean, cls or last", v ? v : "");
            i++;
        } else if (!strcmp(f, "--no-embd-normalize")) {
            c.no_embd_normalize = true;
        } else if (!strcmp(f, "--reasoning-parser")) {
            if (srv_reasoning_parser_from_name(v, &c.reasoning_parser))
                cli_die(OSP_OK, "--reasoning-parser: '%s' is not deepseek_r1 or qwen3", v ? v : "");
            i++;
        }
        else if (!strcmp(f, "--trace-shapes")) c.trace_shapes = v, i++;
        else if (!strcmp(f, "--max-request-body")) c.max_body = (size_t)parse_bytes(f, v), i++;
        else if (!strcmp(f, "--max-queued-requests")) c.max_queue = (int)cli_int(f, v, 1, 1 << 20), i++;
        else if (!strcmp(f, "--responses-store-size")) c.responses_store_size = (int)cli_int(f, v, 0, 1 << 20), i++;
        else if (!strcmp(f, "--queue-wait-timeout")) c.queue_wait_timeout_s = (int)cli_int(f, v, 0, 3600), i++;
        else if (!strcmp(f, "--drain-timeout")) c.drain_timeout_s = (int)cli_int(f, v, 0, 86400), i++;
        else if (!strcmp(f, "--max-connections")) c.max_connections = (int)cli_int(f, v, 1, 1 << 20), i++;
        else if (!strcmp(f, "--max-connections-per-client")) c.max_connections_per_client = (int)cli_int(f, v, 0, 1 << 20), i++;
        else if (!strcmp(f, "--allowed-origins") || !strcmp(f, "--allowed-methods") || !strcmp(f, "--allowed-headers")) {
            char why[256];
            const srv_cors_list which = f[10] == 'o' ? SRV_CORS_ORIGINS : f[10] == 'm' ? SRV_CORS_METHODS : SRV_CORS_HEADERS;
            if (!v) cli_die(OSP_OK, "%s needs a value", f);
            if (srv_cors_set(&c.cors, which, v, why, sizeof why)) cli_die(OSP_OK, "%s: %s", f, why);
            i++;
        } else if (!strcmp(f, "--allow-credentials")) c.cors.credentials = true;
        else if (!strcmp(f, "--engine-process")) c.engine_process = true;
        else if (!strcmp(f, "--no-engine-process")) c.engine_process = false;
        else if (!strcmp(f, "--api-server-count")) c.api_server_count = (int)cli_int(f, v, 1, 64), i++;
        else if (!strcmp(f, "--engine-heartbeat-timeout")) c.core_frontend_timeout_ms = (int)cli_int(f, v, 100, 3600000), i++;
        else if (!strcmp(f, "--connection-timeout")) c.connection_timeout_s = (int)cli_int(f, v, 1, 86400), i++;
        else if (!strcmp(f, "--http-threads")) c.http_threads = (int)cli_int(f, v, 1, 256), i++;
        else if (!strcmp(f, "--log-level")) {
            if (v && !strcmp(v, "debug")) c.log_level = SRV_LOG_DEBUG;
            else if (v && !strcmp(v, "info")) c.log_level = SRV_LOG_INFO;
            else if (v && (!strcmp(v, "warning") || !strcmp(v, "warn"))) c.log_level = SRV_LOG_WARNING;
            else cli_die(OSP_OK, "--log-level: '%s' is not debug, info or warning", v ? v : "");
            i++;
        } else if (!strcmp(f, "--ssl-keyfile")) {
            if (!v || !v[0]) cli_die(OSP_OK, "--ssl-keyfile needs a PEM file");
            c.ssl_keyfile = v, i++;
        } else if (!strcmp(f, "--ssl-certfile")) {
            if (!v || !v[0]) cli_die(OSP_OK, "--ssl-certfile needs a PEM file");
            c.ssl_certfile = v, i++;
        } else if (!strcmp(f, "--ssl-ca-certs")) {
            cli_die(OSP_OK, "--ssl-ca-certs (client certificate verification) is not implemented; serve HTTPS with "
                            "--ssl-keyfile and --ssl-certfile alone, and guard /v1/* with --api-key");
        } else if (!strcmp(f, "--ssl-cert-reqs")) {
            if (!v || strcmp(v, "0") != 0)
                cli_die(OSP_OK, "--ssl-cert-reqs: only 0 (no client certificate, the default) is implemented, not '%s'",
                        v ? v : "");
            i++;
        } else if (f[0] != '-' && f[0]) {
            /* the model as `vllm serve MODEL` takes it */
            if (positional) cli_die(OSP_OK, "serve: unexpected argument '%s' (the model is already '%s')", f, positional);
            positional = f;
        } else cli_die(OSP_OK, "serve: unknown option '%s' (see osprey serve --help)", f);
        if (i >= argc) cli_die(OSP_OK, "%s needs a value", f);
    }
    if (positional && eng.model && !same_file(positional, eng.model))
        cli_die(OSP_OK, "serve: two different models: '%s' (positional) and '%s' (-m); give one", positional, eng.model);
    c.model_path = positional ? positional : eng.model;
    c.n_threads = eng.n_threads;
    c.device = eng.device;
    c.gpu_quant_weights = eng.gpu_quant_weights;
    /* --gpu-memory-utilization (cli_engine_arg parses it for every command): it sizes the GPU's cache only */
    if (eng.gpu_memory_utilization > 0 && c.device != OSP_DEVICE_CUDA)
        cli_die(OSP_OK, "--gpu-memory-utilization sizes the GPU's KV cache: it needs --device cuda (on the CPU "
                        "--kv-cache-memory sizes it)");
    c.gpu_memory_utilization = eng.gpu_memory_utilization;
    c.cpu_activations = eng.cpu_activations;
    c.no_mmap = eng.no_mmap;
    c.tensor_parallel_size = eng.tensor_parallel_size;
    c.kv_dtype = eng.kv_dtype;
    c.kv_dtype_v = eng.kv_dtype_v;
    c.kv_scales = eng.kv_scales;
    c.kernel_table = eng.kernel_table;
    c.trace = eng.trace;
    c.spec = eng.spec;
    c.sparse = eng.sparse; /* was parsed and dropped here: serve ran dense attention under --sparse-attention */
    cli_engine_offload_check(&eng);
    c.kv_offload_host_bytes = eng.kv_offload_host_bytes;
    c.kv_offload_disk = eng.kv_offload_disk;
    c.kv_offload_disk_bytes = eng.kv_offload_disk_bytes;
    cli_engine_env_seed(&eng);
    c.hash_algo = eng.hash_algo, c.hash_seed_set = eng.hash_seed_set, c.hash_seed = eng.hash_seed;
    if (c.enable_auto_tool_choice && c.tool_parser == SRV_TOOL_PARSER_NONE)
        cli_die(OSP_OK, "--enable-auto-tool-choice needs --tool-call-parser (hermes, llama3_json or mistral)");
    if (!c.ssl_keyfile != !c.ssl_certfile)
        cli_die(OSP_OK, "%s needs %s too (TLS takes a private key and its certificate)",
                c.ssl_keyfile ? "--ssl-keyfile" : "--ssl-certfile", c.ssl_keyfile ? "--ssl-certfile" : "--ssl-keyfile");
    if (!c.model_path) cli_die(OSP_OK, "serve needs a model: osprey serve MODEL (or -m MODEL)");
    if (!c.host) cli_die(OSP_OK, "--host needs a value");
    return c;
}

/* --http-threads, or from the cores (2..16): the pool threads detokenize and write JSON for every
 * stream, so more than one; past 16 they would only compete with the engine's threads. */
static unsigned http_threads(const srv_config *cfg) {
    if (cfg->http_threads > 0) return (unsigned)cfg->http_threads;
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 2 ? 2u : n > 16 ? 16u : (unsigned)n;
}

/* The daemon's options (MHD_OPTION_ARRAY, ended by MHD_OPTION_END) into o[cap]; the one place they are
 * built (TLS options go here too). Returns the count, MHD_OPTION_END included. */
static int daemon_options(const srv_config *cfg, const struct sockaddr *addr, struct MHD_OptionItem *o, int cap) {
    int n = 0;
#define OPT(opt, val, ptr) \
    if (n < cap - 1) o[n++] = (struct MHD_OptionItem){(opt), (intptr_t)(val), (ptr)}
    /* past --max-connections requests get a 503 (routes.c); the daemon itself refuses connections only
     * past this, so that there is room to say so (libmicrohttpd splits it over the pool's threads) */
    const unsigned hard_limit = (unsigned)cfg->max_connections + (unsigned)cfg->max_connections / 16 + 16;
    OPT(MHD_OPTION_SOCK_ADDR, 0, (void *)addr);
    const unsigned pool = http_threads(cfg) < hard_limit ? http_threads(cfg) : hard_limit; /* each takes >= 1 */
    OPT(MHD_OPTION_THREAD_POOL_SIZE, pool, NULL);
    OPT(MHD_OPTION_CONNECTION_LIMIT, hard_limit, NULL);
    OPT(MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_connections_per_client, NULL);
    OPT(MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->connection_timeout_s, NULL);
    /* several API servers share the port (SO_REUSEPORT). Otherwise the option is left out: passed as 0 it
     * means "disallow", and libmicrohttpd then skips its default SO_REUSEADDR, so a server restarted at
     * once failed to bind while the old one's connections sat in TIME_WAIT (up to a minute) */
    if (cfg->api_server_count > 1) OPT(MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, NULL);
    OPT(MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)srv_unescape, NULL); /* no NUL in a path (url.h) */
#undef OPT
    o[n++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    return n;
}

/* The engine's own lines (kernel choices at start, KV offload and transfer warnings) in the server's log
 * format: a warning when it says what went wrong, else information. ctx: the srv_config. */
static void engine_log(void *ctx, const char *line) {
    const srv_config *cfg = ctx;
    const bool warn = strstr(line, "failed") || strstr(line, "cannot") || strstr(line, "instead") || strstr(line, "no --");
    const int level = warn ? SRV_LOG_WARNING : SRV_LOG_INFO;
    if (level < cfg->log_level) return;
    char ts[32];
    const time_t t = time(NULL);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(ts, sizeof ts, "%m-%d %H:%M:%S", &tm);
    fprintf(stderr, "%s %s %s\n", warn ? "WARNING" : "INFO", ts, line);
}

osp_engine_params srv_engine_params(const srv_config *cfg) {
    osp_engine_params ep = osp_engine_default_params();
    ep.log = engine_log;
    ep.log_ctx = (void *)(uintptr_t)cfg;
    ep.model_path = cfg->model_path;
    ep.n_threads = cfg->n_threads;
    ep.block_size = cfg->block_size;
    /* on the GPU without --kv-cache-memory: sized from free memory (gpu_memory_utilization) */
    ep.kv_cache_memory = cfg->device == OSP_DEVICE_CUDA && !cfg->kv_cache_memory_set ? 0 : cfg->kv_cache_memory;
    ep.gpu_memory_utilization = cfg->gpu_memory_utilization;
    ep.max_num_seqs = cfg->max_num_seqs;
    ep.max_num_batched_tokens = cfg->max_num_batched_tokens;
    ep.max_model_len = cfg->max_model_len;
    ep.enable_prefix_caching = cfg->prefix_caching;
    ep.trace_shapes_path = cfg->trace_shapes;
    ep.trace_path = cfg->trace;
    ep.device = cfg->device;
    ep.gpu_quant_weights = cfg->gpu_quant_weights;
    ep.cpu_activations = cfg->cpu_activations;
    ep.no_mmap = cfg->no_mmap;
    ep.tensor_parallel_size = cfg->tensor_parallel_size;
    ep.kv_dtype = cfg->kv_dtype;
    ep.kv_dtype_v = cfg->kv_dtype_v;
    ep.kv_dtype_v_set = true;
    ep.kv_scales_path = cfg->kv_scales;
    ep.kernel_table = cfg->kernel_table; /* the flag was parsed and then dropped here (fresh-user walkthrough) */
    ep.speculative = cfg->spec;
    /* measurements (bench/spec.sh FIXED_K=1, bench/structured.sh): k drafts every step, no pause or switch */
    const char *fk = getenv("OSPREY_SPEC_FIXED_K");
    ep.speculative_fixed_k = fk && *fk && strcmp(fk, "0") != 0;
    ep.sparse_attention = cfg->sparse;
    ep.kv_offload_host_bytes = cfg->kv_offload_host_bytes;
    ep.kv_offload_disk_dir = cfg->kv_offload_disk;
    ep.kv_offload_disk_bytes = cfg->kv_offload_disk_bytes;
    ep.kv_offload_no_cost_model = cli_offload_always_load();
    ep.kv_role = cfg->kv_transfer.role;
    if (ep.kv_role != OSP_KV_ROLE_NONE) {
        ep.kv_transfer_ip = cfg->kv_transfer.ip;
        ep.kv_transfer_port = cfg->kv_transfer.port;
        ep.kv_transfer_buffer_bytes = cfg->kv_transfer.buffer_bytes;
        ep.kv_transfer_timeout_s = cfg->kv_transfer.timeout_s;
    }
    ep.hash_algo = cfg->hash_algo, ep.hash_seed_set = cfg->hash_seed_set, ep.hash_seed = cfg->hash_seed;
    return ep;
}

/* Runs the server: cfg parsed from argc/argv (serve's flags); with cfg->attach_endpoint an extra API
 * server of --api-server-count (attached to the core its first server started). */
static int serve_run(srv_config cfg_in, int argc, char **argv) {
    srv_server srv = {.cfg = cfg_in};
    const srv_config *cfg = &srv.cfg;
    /* SIGTERM/SIGINT are taken by sigwait() below; every thread started from here inherits the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    const char *base = strrchr(cfg->model_path, '/');
    srv.model_name = cfg->served_model_name ? cfg->served_model_name : base ? base + 1 : cfg->model_path;
    srv_log(&srv, SRV_LOG_INFO, "%s", osp_version_line());
    /* --ssl-keyfile / --ssl-certfile: read and checked before the model loads (a bad pair costs no wait) */
    srv_tls tls;
    char tls_why[768];
    if (srv_tls_load(&tls, cfg->ssl_keyfile, cfg->ssl_certfile, tls_why, sizeof tls_why)) cli_die(OSP_OK, "%s", tls_why);
    srv_log(&srv, SRV_LOG_INFO, "loading model %s ...", cfg->model_path);
    const double t0 = srv_now_s();
    osp_status s;
    const osp_gguf *g;
    osp_gguf *own_gguf = NULL; /* --engine-process: the file opened here for its tokenizer and template */
    const char *arch = "?";
    int32_t n_blocks = 0, blk_size = 0;
    if (!cfg->engine_process) {
        osp_engine_params ep = srv_engine_params(cfg);
        if ((srv.kv_events = srv_kv_events_open(&srv))) ep.kv_event_sink = osp_kv_publisher_sink(srv.kv_events);
        if (isatty(STDERR_FILENO)) ep.load_progress = srv_load_bar; /* a terminal only: never in a log file */
        s = osp_engine_create(&ep, &srv.engine);
        if (s != OSP_OK) cli_die(s, "cannot start the engine");
        cli_report_device(srv.engine);
        srv_log_memory(&srv, srv.engine);
        const osp_engine_params *pe = osp_engine_params_get(srv.engine);
        g = osp_model_gguf(osp_engine_model(srv.engine));
        s = osp_tokenizer_load(g, &srv.tok);
        if (s != OSP_OK) cli_die(s, "cannot load the tokenizer");
        srv.max_model_len = pe->max_model_len;
        srv.n_vocab = osp_tokenizer_n_vocab(srv.tok);
        const osp_model_config *mc = osp_model_config_get(osp_engine_model(srv.engine));
        if (mc->n_vocab < srv.n_vocab) srv.n_vocab = mc->n_vocab;
        arch = mc->arch;
        const osp_engine_stats st = osp_engine_get_stats(srv.engine);
        n_blocks = st.num_blocks, blk_size = st.block_size;
    } else {
        /* the core process loads the model; this one reads the file's tokenizer and chat template */
        osp_ipc_ready info;
        char core_why[200];
        if (cfg->attach_endpoint) {
            if (srv_core_attach(&srv, cfg->attach_endpoint, (uint32_t)cfg->fe_index, &info))
                cli_die(OSP_OK, "API server %d: no engine core at %s", cfg->fe_index, cfg->attach_endpoint);
        } else if (srv_core_start(&srv, argc, argv, &info, core_why, sizeof core_why)) {
            cli_die(OSP_OK, "cannot start the engine core process: %s (its own error is above)", core_why);
        }
        if ((s = osp_gguf_open(cfg->model_path, &own_gguf)) != OSP_OK) cli_die(s, "cannot open %s", cfg->model_path);
        g = own_gguf;
        s = osp_tokenizer_load(g, &srv.tok);
        if (s != OSP_OK) cli_die(s, "cannot load the tokenizer");
        srv.max_model_len = info.max_model_len;
        srv.n_vocab = osp_tokenizer_n_vocab(srv.tok);
        if (info.n_vocab < srv.n_vocab) srv.n_vocab = info.n_vocab;
        arch = "engine core process";
        n_blocks = info.num_blocks, blk_size = info.block_size;
        srv_log(&srv, SRV_LOG_INFO, "engine core process %lld ready (epoch %u): KV cache capacity %lld tokens (%d blocks of %d)",
                (long long)info.pid, info.epoch, (long long)n_blocks * blk_size, n_blocks, blk_size);
    }

    /* /v1/embeddings: the vector's length, and the pooling: --pooling, else the file's own
     * <arch>.pooling_type (what embedding models' GGUFs carry; llama.cpp's enum), else last: a
     * decoder's last token is the one that has seen the whole input (vLLM's default for a decoder LM) */
    {
        osp_gguf_str a = {0};
        char key[96];
        uint32_t u = 0;
        if (osp_gguf_get_str(g, "general.architecture", &a) == OSP_OK && a.len < 48) {
            snprintf(key, sizeof key, "%.*s.embedding_length", (int)a.len, a.data);
            if (osp_gguf_get_u32(g, key, &u) == OSP_OK) srv.n_embd = (int32_t)u;
            snprintf(key, sizeof key, "%.*s.pooling_type", (int)a.len, a.data);
            if (osp_gguf_get_u32(g, key, &u) != OSP_OK || u < OSP_POOLING_MEAN || u > OSP_POOLING_LAST) u = OSP_POOLING_LAST;
        } else {
            u = OSP_POOLING_LAST;
        }
        srv.pooling = cfg->pooling != OSP_POOLING_NONE ? cfg->pooling : (osp_pooling)u;
    }
    if (srv_chat_env_load(&srv.chat, g, srv.tok, cfg->chat_template_path))
        cli_die(OSP_OK, "--chat-template: cannot read '%s'", cfg->chat_template_path);
    /* every render within a budget (the renderer's own is 512 MiB / 50M steps); a request's template
     * within a smaller one (with --trust-request-chat-template) */
    srv.chat.trust_request_template = cfg->trust_request_chat_template;
    srv.chat.allow_special_in_content = cfg->allow_special_tokens_in_content;
    srv.chat.max_memory = (size_t)64 << 20;
    srv.chat.max_steps = 10000000;
    srv.chat.request_max_memory = (size_t)16 << 20;
    srv.chat.request_max_steps = 2000000;
    if (srv.chat.parse_error)
        srv_log(&srv, SRV_LOG_WARNING, "the chat template does not parse (chat requests will fail): %s", srv.chat.parse_error);
    else if (!srv.chat.template_text)
        srv_log(&srv, SRV_LOG_WARNING, "the model has no chat template: /v1/chat/completions needs --chat-template");

    srv.metrics = srv_metrics_new();
    srv.responses = srv_resp_store_new(cfg->responses_store_size);
    if (!srv.metrics || !srv.responses) cli_die(OSP_ERR_NOMEM, "out of memory");
    srv.chat.metrics = srv.metrics;
    pthread_mutex_init(&srv.mu, NULL);
    pthread_cond_init(&srv.idle, NULL);
    srv.next_id = 1;
    srv_id_key_init(&srv.id_key);
    srv_log(&srv, SRV_LOG_INFO, "model loaded in %.2f s: %s, vocab %d, max_model_len %d, KV cache %d blocks of %d tokens, prefix caching %s",
            srv_now_s() - t0, arch, srv.n_vocab, srv.max_model_len, n_blocks, blk_size, cfg->prefix_caching ? "on" : "off");
    if (cfg->spec.method != OSP_SPEC_NONE)
        srv_log(&srv, SRV_LOG_INFO, "speculative decoding: %s, up to %d drafts a step%s%s",
                osp_spec_method_name(cfg->spec.method), cfg->spec.num_speculative_tokens,
                cfg->spec.method == OSP_SPEC_DRAFT_MODEL ? ", draft " : "",
                cfg->spec.method == OSP_SPEC_DRAFT_MODEL ? cfg->spec.model : "");
    srv_log(&srv, SRV_LOG_INFO, "embeddings: %d dimensions, %s pooling of the output norm, %s", srv.n_embd,
            osp_pooling_name(srv.pooling), cfg->no_embd_normalize ? "not normalized" : "L2-normalized");
    if (cfg->kv_transfer.role != OSP_KV_ROLE_NONE) { /* --kv-transfer-config: what the engine bound */
        const osp_kv_transfer_info ki = srv_engine_kv_transfer_info(&srv);
        if (ki.role != cfg->kv_transfer.role)
            cli_die(OSP_OK, "--kv-transfer-config: the engine took kv_role %s, not %s", srv_kv_role_name(ki.role),
                    srv_kv_role_name(cfg->kv_transfer.role));
        if (ki.role == OSP_KV_ROLE_PRODUCER || ki.role == OSP_KV_ROLE_BOTH)
            srv_log(&srv, SRV_LOG_INFO, "kv transfer: producer listening on %s:%d (%s, engine id %016llx)", ki.host, (int)ki.port,
                    srv_kv_role_name(ki.role), (unsigned long long)ki.engine_id);
        else
            srv_log(&srv, SRV_LOG_INFO, "kv transfer: consumer (%s, engine id %016llx): loads prompt KV from the producers "
                    "that requests name", srv_kv_role_name(ki.role), (unsigned long long)ki.engine_id);
    }
    if (srv.engine && (s = osp_engine_start(srv.engine)) != OSP_OK) cli_die(s, "cannot start the engine loop");

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    if (getaddrinfo(cfg->host, port, &hints, &ai) != 0 || !ai) cli_die(OSP_OK, "--host: cannot resolve '%s'", cfg->host);
    /* the event-loop mode: internal threads polling with epoll (MHD_USE_AUTO picks it on Linux), a pool
     * of them (MHD_OPTION_THREAD_POOL_SIZE), and suspend/resume for requests that wait (park.c) */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_ALLOW_SUSPEND_RESUME | srv_tls_daemon_flags(&tls);
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (srv_park_start(&srv)) cli_die(OSP_OK, "cannot start the connection watcher thread");
    struct MHD_OptionItem opts[16];
    daemon_options(cfg, ai->ai_addr, opts, (int)(sizeof opts / sizeof *opts));
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, srv_on_request, &srv,
                                            MHD_OPTION_NOTIFY_COMPLETED, srv_on_completed, &srv,
                                            MHD_OPTION_NOTIFY_CONNECTION, srv_on_connection, &srv, MHD_OPTION_ARRAY, opts,
                                            MHD_OPTION_ARRAY, srv_tls_daemon_options(&tls), MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) cli_die(OSP_OK, "cannot listen on %s:%d (%s)", cfg->host, cfg->port, strerror(errno));
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    const unsigned bound = di ? (unsigned)di->port : (unsigned)cfg->port;
    const bool v6 = strchr(cfg->host, ':') != NULL;
    srv_log(&srv, SRV_LOG_INFO, "serving %s on %s://%s%s%s:%u (%s%s; %u HTTP threads)", srv.model_name, srv_tls_scheme(&tls),
            v6 ? "[" : "", cfg->host, v6 ? "]" : "", bound, cfg->api_key ? "API key required on /v1/*" : "no API key",
            srv_tls_on(&tls) ? ", TLS" : "", http_threads(cfg));
    char url[300];
    srv_local_url(url, sizeof url, srv_tls_scheme(&tls), cfg->host, bound);
    if (!cfg->no_webui) srv_log(&srv, SRV_LOG_INFO, "web chat and dashboard: open %s/ in a browser (--no-webui: off)", url);
    srv_log(&srv, SRV_LOG_INFO, "open %s/v1 as the OpenAI API base, e.g. curl %s%s%s%s/v1/models%s", url,
            srv_tls_on(&tls) ? "--cacert " : "", srv_tls_on(&tls) ? cfg->ssl_certfile : "", srv_tls_on(&tls) ? " " : "", url,
            cfg->api_key ? " -H 'Authorization: Bearer KEY'" : "");

    /* --api-server-count N: the first server starts the other N - 1 on the same port (SO_REUSEPORT) */
    if (cfg->api_server_count > 1 && !cfg->attach_endpoint && srv_api_servers_start(&srv, argc, argv))
        cli_die(OSP_OK, "cannot start the other API servers");
    int sig = 0;
    sigwait(&sigs, &sig);
    srv_log(&srv, SRV_LOG_INFO, "%s: draining %d requests in flight", sig == SIGTERM ? "SIGTERM" : "SIGINT", srv.in_flight);
    pthread_mutex_lock(&srv.mu);
    srv.draining = true;
    pthread_mutex_unlock(&srv.mu);
    srv_park_wake_queue(&srv); /* requests parked for a queue slot get their 503 now */
    pthread_mutex_lock(&srv.mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += cfg->drain_timeout_s;
    /* requests in flight finish; aborted ones end in the engine (their jobs are freed then) */
    while (srv.in_flight > 0 || srv.live_jobs > 0 || srv.sending > 0)
        if (pthread_cond_timedwait(&srv.idle, &srv.mu, &until) == ETIMEDOUT) break;
    const int left = srv.in_flight + srv.live_jobs + srv.sending;
    pthread_mutex_unlock(&srv.mu);
    if (left) srv_log(&srv, SRV_LOG_WARNING, "drain timeout: %d requests still in flight", left);
    srv_park_stop_all(&srv); /* no connection may be suspended when the daemon stops */
    MHD_stop_daemon(d);
    srv_park_join(&srv);
    srv_tls_free(&tls); /* the daemon kept pointers to the PEM text until here */
    srv_api_servers_stop(&srv); /* they drain too (SIGTERM) */
    osp_status ls = OSP_OK;
    if (srv.engine) ls = osp_engine_stop(srv.engine);
    else srv_core_stop(&srv);
    srv_log(&srv, SRV_LOG_INFO, "stopped");
    osp_engine_free(srv.engine);
    osp_kv_publisher_free(srv.kv_events); /* after the engine: its pool reports to it */
    osp_gguf_close(own_gguf);
    osp_tokenizer_free(srv.tok);
    srv_metrics_free(srv.metrics);
    srv_resp_store_free(srv.responses);
    srv_chat_env_free(&srv.chat);
    srv_cors_free(&srv.cfg.cors);
    return ls == OSP_OK ? 0 : 1;
}

int cmd_serve(int argc, char **argv) {
    srv_config cfg = srv_parse_flags(argc, argv);
    if (cfg.api_server_count > 1) {
        cfg.engine_process = true; /* several frontends share one core: it has its own process */
        if (cfg.port == 0) cli_die(OSP_OK, "--api-server-count needs a fixed --port (the servers share it)");
    }
    return serve_run(cfg, argc, argv);
}

int cmd_api_server(int argc, char **argv) {
    if (argc < 4) cli_die(OSP_OK, "__api-server is started by `osprey serve --api-server-count N`, not by hand");
    srv_config cfg = srv_parse_flags(argc - 3, argv + 3);
    cfg.fe_index = (int)cli_int("api server index", argv[1], 1, 255);
    cfg.attach_endpoint = argv[2];
    cfg.engine_process = true;
    return serve_run(cfg, argc - 3, argv + 3);
}
