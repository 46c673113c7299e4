/* osprey serve's KV cache events (--kv-events-config, vLLM's flag): opens the publisher
 * (include/osprey/kv_events.h) that the engine's block pool reports to, with the topic llm-d's
 * deployments give vLLM, "kv@<pod>@<model>" (pod: $POD_IP as the Downward API sets it, else the host
 * name; model: the served model name), unless the config names its own topic. medium: "GPU" when the
 * model runs on CUDA, "CPU" otherwise (the pool is the first KV tier either way). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "serve_internal.h"

osp_kv_publisher *srv_kv_events_open(const srv_server *srv) {
    const srv_config *cfg = &srv->cfg;
    const char *model_name = srv->model_name;
    if (!cfg->kv_events_set || !cfg->kv_events.enable_kv_cache_events) return NULL;
    char pod[256] = "";
    const char *ip = getenv("POD_IP");
    if (ip && ip[0]) snprintf(pod, sizeof pod, "%s", ip);
    else if (gethostname(pod, sizeof pod - 1) != 0) strcpy(pod, "localhost");
    pod[sizeof pod - 1] = 0;
    char topic[600];
    snprintf(topic, sizeof topic, "kv@%s@%s", pod, model_name);
    const osp_kv_publisher_params pp = {.block_size = cfg->block_size,
                                        .medium = cfg->device == OSP_DEVICE_CUDA ? "GPU" : "CPU",
                                        .array_like = cfg->kv_events_array_like, .topic = topic};
    osp_kv_publisher *pub = NULL;
    const osp_status s = osp_kv_publisher_create(&cfg->kv_events, &pp, &pub);
    if (s != OSP_OK) cli_die(s, "serve");
    srv_log(srv, SRV_LOG_INFO, "KV events: %s on %s%s%s, topic '%s', %s form", cfg->kv_events.publisher_zmq ? "ZeroMQ PUB" : "dropped (publisher null)",
            cfg->kv_events.endpoint, cfg->kv_events.replay_endpoint[0] ? ", replay on " : "", cfg->kv_events.replay_endpoint,
            cfg->kv_events.topic_set ? cfg->kv_events.topic : topic, cfg->kv_events_array_like ? "array_like" : "map");
    return pub;
}
