/* serve's start-up warning for a KV cache that cannot hold one max_model_len sequence (contract in
 * serve_internal.h). A file of its own, with no other dependency, so its unit test
 * (tests/unit/test_server_startup.c) links it without the daemon. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "serve_internal.h"

int srv_kv_capacity_warning(char *out, size_t n, int32_t num_blocks, int32_t block_size, int32_t max_model_len,
                            int64_t block_bytes, bool gpu_auto, double utilization) {
    if (n > 0) out[0] = '\0';
    if (num_blocks <= 0 || block_size <= 0 || max_model_len <= 1) return 0;
    const int64_t need = ((int64_t)max_model_len - 1 + block_size - 1) / block_size; /* blocks of one sequence */
    if (need <= num_blocks) return 0;
    const int64_t fits = (int64_t)num_blocks * block_size + 1; /* the longest request (prompt + max_tokens) */
    const double mib = (double)(need * block_bytes) / 1048576.0;
    char how[200];
    if (gpu_auto)
        snprintf(how, sizeof how, "raise --gpu-memory-utilization (now %.2f) or give --kv-cache-memory %.0fM or more", utilization,
                 mib + 0.5);
    else
        snprintf(how, sizeof how, "give --kv-cache-memory %.0fM or more (now %.0fM)", mib + 0.5,
                 (double)((int64_t)num_blocks * block_bytes) / 1048576.0);
    const int w = snprintf(out, n,
                           "the KV cache holds %lld tokens (%d blocks of %d), less than one max_model_len sequence (%d "
                           "tokens): requests whose prompt + max_tokens exceed %lld tokens will be refused (400); "
                           "%s, or lower --max-model-len to %lld",
                           (long long)fits - 1, num_blocks, block_size, max_model_len, (long long)fits, how, (long long)fits);
    return w < 0 ? 0 : (size_t)w < n ? w : (int)strlen(out);
}
