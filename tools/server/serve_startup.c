/* The start-up log's report of what `osprey serve` (and its engine core process) loaded: the memory
 * line (weights and KV cache in MiB, KV capacity in tokens) and, on a terminal only, the load bar.
 * Kept apart from serve.c's daemon and flags; contracts in serve_internal.h. */
#include <stdio.h>

#include "osprey/engine.h"
#include "osprey/gguf.h"
#include "osprey/model.h"
#include "serve_internal.h"

void srv_load_bar(void *ctx, float fraction) {
    (void)ctx;
    static int last = -1;
    const int per_mille = (int)(fraction * 1000.0f);
    if (per_mille == last) return;
    last = per_mille;
    char line[96];
    srv_progress_bar(line, sizeof line, fraction);
    fprintf(stderr, "\r%s%s", line, fraction >= 1.0f ? "\n" : "");
}

void srv_log_memory(const srv_server *s, const osp_engine *e) {
    const osp_model *m = osp_engine_model(e);
    const osp_engine_params *pe = osp_engine_params_get(e);
    const bool cuda = osp_model_device(m) == OSP_DEVICE_CUDA;
    uint64_t weights = 0;
    if (cuda) weights = osp_model_device_weight_bytes(m);
    else
        for (uint64_t i = 0, n = osp_gguf_n_tensors(osp_model_gguf(m)); i < n; i++)
            weights += osp_gguf_tensor_at(osp_model_gguf(m), i)->nbytes;
    char kv[48]; /* "fp8", or "K fp8, V nvfp4" for a split cache */
    if (pe->kv_dtype == pe->kv_dtype_v) snprintf(kv, sizeof kv, "%s", osp_kv_dtype_name(pe->kv_dtype));
    else snprintf(kv, sizeof kv, "K %s, V %s", osp_kv_dtype_name(pe->kv_dtype), osp_kv_dtype_name(pe->kv_dtype_v));
    srv_log(s, SRV_LOG_INFO, "memory: weights %.1f MiB (%s), KV cache %.1f MiB (%s), KV capacity %lld tokens (%d blocks of %d)",
            (double)weights / 1048576.0, cuda ? "GPU" : "CPU, mapped from the file", (double)osp_engine_kv_cache_bytes(e) / 1048576.0,
            kv, (long long)pe->num_blocks * pe->block_size, pe->num_blocks, pe->block_size);
    char warn[512];
    const int64_t block_bytes = pe->num_blocks > 0 ? (int64_t)osp_engine_kv_cache_bytes(e) / pe->num_blocks : 0;
    const double util = s->cfg.gpu_memory_utilization > 0 ? s->cfg.gpu_memory_utilization : 0.9;
    if (srv_kv_capacity_warning(warn, sizeof warn, pe->num_blocks, pe->block_size, pe->max_model_len, block_bytes,
                                cuda && !s->cfg.kv_cache_memory_set, util) > 0)
        srv_log(s, SRV_LOG_WARNING, "%s", warn);
    if (pe->kv_offload_host_bytes > 0 || pe->kv_offload_disk_dir) {
        char host[48] = "", disk[1100] = "";
        if (pe->kv_offload_host_bytes > 0)
            snprintf(host, sizeof host, "host memory %.2f GiB", (double)pe->kv_offload_host_bytes / 1073741824.0);
        if (pe->kv_offload_disk_dir)
            snprintf(disk, sizeof disk, "%sdisk %.2f GiB in %s", host[0] ? ", then " : "",
                     (double)pe->kv_offload_disk_bytes / 1073741824.0, pe->kv_offload_disk_dir);
        srv_log(s, SRV_LOG_INFO, "KV offload: evicted prefix blocks go to %s%s (loaded back when %s)", host, disk,
                pe->kv_offload_no_cost_model ? "held: OSPREY_KV_OFFLOAD_ALWAYS_LOAD" : "that beats recomputing them, measured");
    }
}
