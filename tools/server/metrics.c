/* /metrics: Prometheus text exposition (format 0.0.4) with the names vLLM's V1 server exposes, so
 * dashboards and routers built for vLLM read osprey unchanged. Every series carries
 * model_name="<served model name>". Histogram buckets are vLLM's (vllm/v1/metrics/loggers.py).
 * Counters and histograms live here behind one mutex; gauges come from the engine at scrape time.
 * osprey:* series are osprey's own (KV blocks free/total, requests in flight, open connections) for
 * tests and debugging; process_* are prometheus_client's process collector's (vLLM exports them).
 * vLLM V0's vllm:num_requests_swapped has no meaning here (V1 and osprey preempt by recompute). */
#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "osprey/engine.h"
#include "server.h"

static const double k_ttft_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                        1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double k_itl_buckets[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                       0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
static const double k_e2e_buckets[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                       30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
#define MAX_BUCKETS 24

typedef struct histogram {
    const double *le;
    int n_le;
    int64_t counts[MAX_BUCKETS]; /* per bucket (not cumulative); the last one is +Inf */
    int64_t count;
    double sum;
} histogram;

enum { FIN_STOP, FIN_LENGTH, FIN_ABORT, FIN_ERROR, FIN_N };
static const char *const k_fin_names[FIN_N] = {"stop", "length", "abort", "error"};

struct srv_metrics {
    pthread_mutex_t mu;
    histogram ttft, itl, e2e, queue, prefill, decode, inference;
    int64_t prompt_tokens, generation_tokens;
    int64_t success[FIN_N];
    int64_t provenance_lost; /* chat renders tokenized the old way because provenance was lost */
};

srv_metrics *srv_metrics_new(void) {
    srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    m->ttft = (histogram){.le = k_ttft_buckets, .n_le = (int)(sizeof k_ttft_buckets / sizeof(double))};
    m->itl = (histogram){.le = k_itl_buckets, .n_le = (int)(sizeof k_itl_buckets / sizeof(double))};
    m->e2e = (histogram){.le = k_e2e_buckets, .n_le = (int)(sizeof k_e2e_buckets / sizeof(double))};
    m->queue = m->prefill = m->decode = m->inference = m->e2e; /* vLLM's request_latency_buckets */
    return m;
}

void srv_metrics_free(srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static void observe(srv_metrics *m, histogram *h, double x, int64_t count) {
    int b = 0;
    while (b < h->n_le && x > h->le[b]) b++;
    pthread_mutex_lock(&m->mu);
    h->counts[b] += count;
    h->count += count;
    h->sum += x * (double)count;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_count_provenance_lost(srv_metrics *m) {
    pthread_mutex_lock(&m->mu);
    m->provenance_lost++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_observe_ttft(srv_metrics *m, double s) { observe(m, &m->ttft, s, 1); }
void srv_metrics_observe_itl(srv_metrics *m, double s, int64_t count) { observe(m, &m->itl, s, count); }
void srv_metrics_observe_e2e(srv_metrics *m, double s) { observe(m, &m->e2e, s, 1); }

void srv_metrics_observe_phases(srv_metrics *m, double queue, double prefill, double decode, double inference) {
    if (queue >= 0) observe(m, &m->queue, queue, 1);
    if (prefill >= 0) observe(m, &m->prefill, prefill, 1);
    if (decode >= 0) observe(m, &m->decode, decode, 1);
    if (inference >= 0) observe(m, &m->inference, inference, 1);
}

void srv_metrics_request_done(srv_metrics *m, const char *finish_reason, int64_t prompt_tokens,
                              int64_t generation_tokens) {
    int f = FIN_ERROR;
    for (int i = 0; i < FIN_N; i++)
        if (finish_reason && !strcmp(finish_reason, k_fin_names[i])) f = i;
    pthread_mutex_lock(&m->mu);
    m->success[f]++;
    m->prompt_tokens += prompt_tokens;
    m->generation_tokens += generation_tokens;
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering ----------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        const int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        const size_t cap = (b->cap + (size_t)n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void gauge(sbuf *b, const char *name, const char *help, const char *model, double v) {
    put(b, "# HELP %s %s\n# TYPE %s gauge\n%s{model_name=\"%s\"} %.17g\n", name, help, name, name, model, v);
}

static void counter(sbuf *b, const char *name, const char *help, const char *model, double v) {
    put(b, "# HELP %s %s\n# TYPE %s counter\n%s_total{model_name=\"%s\"} %.17g\n", name, help, name, name, model, v);
}

static void hist(sbuf *b, const char *name, const char *help, const char *model, const histogram *h) {
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    int64_t cum = 0;
    for (int i = 0; i < h->n_le; i++) {
        cum += h->counts[i];
        put(b, "%s_bucket{le=\"%g\",model_name=\"%s\"} %lld\n", name, h->le[i], model, (long long)cum);
    }
    cum += h->counts[h->n_le];
    put(b, "%s_bucket{le=\"+Inf\",model_name=\"%s\"} %lld\n", name, model, (long long)cum);
    put(b, "%s_count{model_name=\"%s\"} %lld\n%s_sum{model_name=\"%s\"} %.17g\n", name, model, (long long)h->count, name,
        model, h->sum);
}

/* prometheus_client's process collector: CPU seconds, resident and virtual memory, start time, open
 * and maximum file descriptors (from /proc/self; nothing where /proc is absent). */
static void process_metrics(sbuf *b) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f) return;
    char buf[4096];
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces; fields 3.. follow it */
    unsigned long long utime = 0, stime = 0, start = 0, vsize = 0;
    long long rss = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu %llu %lld", &utime,
                     &stime, &start, &vsize, &rss) != 5)
        return;
    const double hz = (double)sysconf(_SC_CLK_TCK), page = (double)sysconf(_SC_PAGESIZE);
    double boot = 0; /* btime of /proc/stat: the boot time in Unix seconds */
    if ((f = fopen("/proc/stat", "r"))) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "btime ", 6)) boot = strtod(line + 6, NULL);
        fclose(f);
    }
    int fds = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        for (struct dirent *e; (e = readdir(d));) fds += e->d_name[0] != '.';
        closedir(d);
        fds--; /* the directory's own descriptor */
    }
    struct rlimit rl = {0};
    getrlimit(RLIMIT_NOFILE, &rl);
    put(b, "# HELP process_cpu_seconds Total user and system CPU time spent in seconds.\n# TYPE process_cpu_seconds counter\n"
           "process_cpu_seconds_total %.17g\n", (double)(utime + stime) / hz);
    put(b, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n# TYPE process_virtual_memory_bytes gauge\n"
           "process_virtual_memory_bytes %.17g\n", (double)vsize);
    put(b, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n# TYPE process_resident_memory_bytes gauge\n"
           "process_resident_memory_bytes %.17g\n", (double)rss * page);
    put(b, "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
           "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.17g\n", boot + (double)start / hz);
    put(b, "# HELP process_open_fds Number of open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds %d\n", fds);
    put(b, "# HELP process_max_fds Maximum number of open file descriptors.\n# TYPE process_max_fds gauge\nprocess_max_fds %.17g\n",
        rl.rlim_cur == RLIM_INFINITY ? -1.0 : (double)rl.rlim_cur);
}

char *srv_metrics_render(srv_metrics *m, const char *model, const srv_metrics_gauges *g) {
    sbuf b = {.p = malloc(8192), .cap = 8192};
    if (!b.p) return NULL;
    const double usage = g->num_blocks > 0 ? (double)(g->num_blocks - g->num_free_blocks) / g->num_blocks : 0.0;
    gauge(&b, "vllm:num_requests_running", "Number of requests in model execution batches.", model, g->num_running);
    gauge(&b, "vllm:num_requests_waiting", "Number of requests waiting to be processed.", model, g->num_waiting);
    gauge(&b, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", model, usage);
    counter(&b, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", model,
            (double)g->prefix_queries);
    counter(&b, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", model,
            (double)g->prefix_hits);
    counter(&b, "vllm:num_preemptions", "Cumulative number of preemption from the engine.", model,
            (double)g->num_preemptions);
    pthread_mutex_lock(&m->mu);
    counter(&b, "vllm:prompt_tokens", "Number of prefill tokens processed.", model, (double)m->prompt_tokens);
    counter(&b, "vllm:generation_tokens", "Number of generation tokens processed.", model, (double)m->generation_tokens);
    put(&b, "# HELP vllm:request_success Count of successfully processed requests.\n# TYPE vllm:request_success counter\n");
    for (int i = 0; i < FIN_N; i++)
        put(&b, "vllm:request_success_total{finished_reason=\"%s\",model_name=\"%s\"} %lld\n", k_fin_names[i], model,
            (long long)m->success[i]);
    hist(&b, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", model, &m->ttft);
    hist(&b, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", model, &m->itl);
    hist(&b, "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", model, &m->itl);
    hist(&b, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", model, &m->e2e);
    hist(&b, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", model, &m->queue);
    hist(&b, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", model, &m->prefill);
    hist(&b, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", model, &m->decode);
    hist(&b, "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", model,
         &m->inference);
    pthread_mutex_unlock(&m->mu);
    { /* the engine's step counts by scheduled tokens */
        histogram it = {.n_le = OSP_ENGINE_ITERATION_BUCKETS, .count = g->num_steps, .sum = (double)g->num_scheduled_tokens};
        double le[OSP_ENGINE_ITERATION_BUCKETS];
        for (int i = 0; i < OSP_ENGINE_ITERATION_BUCKETS; i++) le[i] = osp_engine_iteration_token_buckets[i];
        it.le = le;
        for (int i = 0; i <= OSP_ENGINE_ITERATION_BUCKETS; i++) it.counts[i] = g->iteration_tokens[i];
        hist(&b, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", model, &it);
    }
    process_metrics(&b);
    if (g->spec_k > 0) { /* vLLM registers these only with a speculative config */
        counter(&b, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", model, (double)g->spec_drafts);
        counter(&b, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", model, (double)g->spec_draft_tokens);
        counter(&b, "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", model,
                (double)g->spec_accepted_tokens);
        put(&b, "# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.\n"
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n");
        for (int i = 0; i < g->spec_k && i < OSP_SPEC_MAX_TOKENS; i++)
            put(&b, "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"%s\",position=\"%d\"} %lld\n", model,
                i, (long long)g->spec_accepted_per_pos[i]);
    }
    if (g->offload) { /* --kv-offloading-size / --kv-offload-disk */
        put(&b, "# HELP osprey:kv_offload_blocks KV blocks held in each offload tier.\n"
                "# TYPE osprey:kv_offload_blocks gauge\n"
                "osprey:kv_offload_blocks{model_name=\"%s\",tier=\"cpu\"} %lld\n"
                "osprey:kv_offload_blocks{model_name=\"%s\",tier=\"disk\"} %lld\n",
            model, (long long)g->offload_host_blocks, model, (long long)g->offload_disk_blocks);
        counter(&b, "osprey:kv_offload_stored_blocks", "KV blocks stored into an offload tier (evicted from the pool, or moved down).",
                model, (double)g->offload_stored);
        counter(&b, "osprey:kv_offload_loaded_blocks", "KV blocks loaded back from an offload tier.", model,
                (double)g->offload_loaded);
        counter(&b, "osprey:kv_offload_corrupt_blocks", "Disk KV blocks that failed their checksum or header check (recomputed).",
                model, (double)g->offload_corrupt);
        counter(&b, "osprey:kv_offload_missing_blocks",
                "Disk KV blocks whose file was gone, e.g. the directory removed while serving (forgotten, recomputed).",
                model, (double)g->offload_missing);
        counter(&b, "osprey:kv_offload_hit_tokens", "Prompt tokens served by blocks loaded back from an offload tier.", model,
                (double)g->offload_hits_tokens);
        counter(&b, "osprey:kv_offload_write_errors", "Disk KV block writes that failed (the block was dropped).", model,
                (double)g->offload_write_errors);
        counter(&b, "osprey:kv_offload_recomputed_tokens",
                "Prompt tokens an offload tier held that the cost model chose to recompute.", model,
                (double)g->offload_skipped_tokens);
    }
    if (g->kv_transfer) { /* --kv-transfer-config: a producer's held transfers, a consumer's loads */
        gauge(&b, "osprey:kv_transfer_held", "KV transfers a producer holds for consumers to pull.", model,
              (double)g->kv_transfer_held);
        gauge(&b, "osprey:kv_transfer_held_blocks", "KV blocks in the transfers a producer holds.", model,
              (double)g->kv_transfer_held_blocks);
        counter(&b, "osprey:kv_transfer_sent_blocks", "KV blocks a producer sent to consumers.", model,
                (double)g->kv_transfer_sent_blocks);
        counter(&b, "osprey:kv_transfer_dropped", "KV transfers a producer dropped unpulled (timed out or pushed out).", model,
                (double)g->kv_transfer_dropped);
        counter(&b, "osprey:kv_transfer_recv_blocks", "KV blocks a consumer loaded from producers.", model,
                (double)g->kv_transfer_recv_blocks);
        counter(&b, "osprey:kv_transfer_ipc_blocks",
                "Of the KV blocks a consumer loaded, those copied device to device from a producer's arena (CUDA IPC).", model,
                (double)g->kv_transfer_ipc_blocks);
        counter(&b, "osprey:kv_transfer_failed_blocks", "KV blocks a consumer asked a producer for that did not load (recomputed).",
                model, (double)g->kv_transfer_failed_blocks);
        counter(&b, "osprey:kv_transfer_recv_seconds", "Seconds a consumer spent loading KV blocks from producers.", model,
                g->kv_transfer_recv_seconds);
    }
    gauge(&b, "osprey:kv_cache_free_blocks", "KV blocks free (cached-but-unreferenced blocks count as free).", model,
          g->num_free_blocks);
    gauge(&b, "osprey:kv_cache_total_blocks", "KV blocks in the pool.", model, g->num_blocks);
    gauge(&b, "osprey:requests_in_flight", "HTTP generation requests being served.", model, g->in_flight);
    gauge(&b, "osprey:http_connections", "Open HTTP connections (--max-connections).", model, g->connections);
    pthread_mutex_lock(&m->mu);
    const int64_t prov_lost = m->provenance_lost;
    pthread_mutex_unlock(&m->mu);
    counter(&b, "osprey:chat_template_provenance_lost",
            "Chat renders whose provenance was lost: the prompt was tokenized with special tokens parsed in message content too.",
            model, (double)prov_lost);
    if (g->engine_process)
        counter(&b, "osprey:engine_core_restarts", "Times the engine core process died and was restarted (--engine-process).",
                model, (double)g->core_restarts);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
