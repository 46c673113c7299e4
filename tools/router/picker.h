/* The endpoint picker of `osprey router`, as a library an EPP plugin could call: filters, then
 * weighted scorers, then the highest total wins (the shape of llm-d's scheduler: filters -> scorers ->
 * picker). Pure functions over a snapshot of the backends; no I/O, no threads, no allocation.
 *
 * Scorers, each in [0, 1], higher is better:
 *   prefix  matched leading blocks of the request / its total blocks (a KV-event index or the
 *           router's own record of routed prompts says how many); 0 for a hot spot: a backend whose
 *           queue (vllm:num_requests_waiting) exceeds hot_queue stops winning on prefix alone
 *   queue   (max_q - q) / (max_q - min_q) over the candidates, 1 when all queues are equal (llm-d's
 *           queue scorer: min-max over vllm:num_requests_waiting)
 *   kv      1 - vllm:kv_cache_usage_perc
 *   active  (max_a - a) / (max_a - min_a): the router's own requests in flight to each backend
 * Filters: healthy, and serves the requested model. */
#ifndef OSPREY_TOOLS_ROUTER_PICKER_H
#define OSPREY_TOOLS_ROUTER_PICKER_H

#include <stdbool.h>
#include <stdint.h>

typedef struct rt_backend_view {
    bool healthy;           /* its last /metrics scrape succeeded */
    bool serves_model;      /* it serves the requested model */
    double num_waiting;     /* vllm:num_requests_waiting */
    double num_running;     /* vllm:num_requests_running */
    double kv_usage;        /* vllm:kv_cache_usage_perc, 0..1 */
    int32_t active;         /* requests this router has in flight to it */
    int32_t prefix_blocks;  /* leading blocks of this request it holds (0..total_blocks) */
} rt_backend_view;

typedef struct rt_weights {
    double prefix, queue, kv, active; /* >= 0; all 0 picks by the tie-break alone (round robin) */
    double hot_queue;                 /* prefix counts 0 where num_waiting > hot_queue; < 0: never */
} rt_weights;

/* The defaults: prefix 3, queue 2, kv 1, active 1, hot_queue 8 (llm-d weighs its
 * prefix-cache scorer above its load scorers in the same spirit; tune with --weights). */
rt_weights rt_default_weights(void);

/* Picks a backend among b[0..n): the candidates pass the filters, each gets sum(w_i * score_i), the
 * highest wins; ties go to the first candidate at or after index `rr` (mod n), so equal backends take
 * turns when the caller advances rr. total_blocks: the request's blocks (0: no prefix score). When
 * scores is not NULL, scores[i] is backend i's total (-1 for one filtered out). Returns the index, or
 * -1 when no backend passes the filters. */
int32_t rt_pick(const rt_backend_view *b, int32_t n, int32_t total_blocks, const rt_weights *w, uint32_t rr,
                double *scores);

#endif
