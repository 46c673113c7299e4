/* Prefill/decode disaggregation at the HTTP edge (server.h): `--kv-transfer-config` (vLLM's
 * KVTransferConfig JSON, with osprey's connector), a request's `kv_transfer_params` (vLLM's
 * NixlConnector names, what a P/D proxy such as llm-d's sends) and the producer's reply naming the KV
 * blocks it holds. The engine does the transfer (osprey/engine.h: osp_kv_transfer_params); nothing
 * here touches the engine or the network. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

/* ---- --kv-transfer-config ------------------------------------------------------------------ */

static int cfg_fail(char *why, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int cfg_fail(char *why, size_t cap, const char *fmt, ...) {
    if (why && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int srv_kv_transfer_config_parse(const char *text, srv_kv_transfer_config *out, char *why, size_t why_cap) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loads(text ? text : "", 0, &jerr);
    if (!root) return cfg_fail(why, why_cap, "--kv-transfer-config: not JSON: %s (column %d)", jerr.text, jerr.column);
    srv_kv_transfer_config c = {0};
    bool connector = false;
    int rc = -1;
    if (!json_is_object(root)) {
        cfg_fail(why, why_cap, "--kv-transfer-config must be a JSON object, e.g. '{\"kv_connector\": \"OspreyConnector\", "
                               "\"kv_role\": \"kv_producer\"}'");
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "kv_connector")) {
            if (!json_is_string(v)) {
                cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_connector' must be a string");
                goto done;
            }
            if (strcmp(json_string_value(v), "OspreyConnector")) {
                cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_connector' '%.64s' is not implemented (only \"OspreyConnector\": "
                                       "osprey's own KV transfer over TCP)", json_string_value(v));
                goto done;
            }
            connector = true;
        } else if (!strcmp(key, "kv_role")) {
            const char *r = json_is_string(v) ? json_string_value(v) : NULL;
            if (r && !strcmp(r, "kv_producer")) c.role = OSP_KV_ROLE_PRODUCER;
            else if (r && !strcmp(r, "kv_consumer")) c.role = OSP_KV_ROLE_CONSUMER;
            else if (r && !strcmp(r, "kv_both")) c.role = OSP_KV_ROLE_BOTH;
            else {
                cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_role' must be \"kv_producer\", \"kv_consumer\" or \"kv_both\"");
                goto done;
            }
        } else if (!strcmp(key, "kv_ip")) {
            const char *ip = json_is_string(v) ? json_string_value(v) : NULL;
            if (!ip || !ip[0] || strlen(ip) >= sizeof c.ip) {
                cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_ip' must be a non-empty string of at most %zu bytes",
                         sizeof c.ip - 1);
                goto done;
            }
            snprintf(c.ip, sizeof c.ip, "%s", ip);
        } else if (!strcmp(key, "kv_port")) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 65535) {
                cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_port' must be an integer in [0, 65535] (0: any free port)");
                goto done;
            }
            c.port = (int32_t)json_integer_value(v);
        } else if (!strcmp(key, "kv_buffer_size")) {
            const double x = json_is_number(v) ? json_number_value(v) : -1;
            if (!(x >= 1) || !isfinite(x) || x > 9e18) {
                cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_buffer_size' must be a number of bytes above 0 (e.g. 1e9)");
                goto done;
            }
            c.buffer_bytes = (int64_t)x;
        } else if (!strcmp(key, "kv_connector_extra_config")) {
            if (!json_is_object(v)) {
                cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_connector_extra_config' must be an object");
                goto done;
            }
            const char *k2;
            json_t *v2;
            json_object_foreach(v, k2, v2) {
                if (strcmp(k2, "timeout_s")) {
                    cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_connector_extra_config.%.64s' is not a known key "
                                           "(only timeout_s)", k2);
                    goto done;
                }
                const double t = json_is_number(v2) ? json_number_value(v2) : -1;
                if (!(t > 0) || !isfinite(t) || t > 86400.0 * 365) {
                    cfg_fail(why, why_cap, "--kv-transfer-config: 'kv_connector_extra_config.timeout_s' must be a number of "
                                           "seconds above 0");
                    goto done;
                }
                c.timeout_s = t;
            }
        } else {
            cfg_fail(why, why_cap, "--kv-transfer-config: '%.64s' is not a known key (kv_connector, kv_role, kv_ip, kv_port, "
                                   "kv_buffer_size, kv_connector_extra_config)", key);
            goto done;
        }
    }
    if (!connector) {
        cfg_fail(why, why_cap, "--kv-transfer-config needs 'kv_connector': \"OspreyConnector\"");
        goto done;
    }
    if (c.role == OSP_KV_ROLE_NONE) {
        cfg_fail(why, why_cap, "--kv-transfer-config needs 'kv_role' (\"kv_producer\", \"kv_consumer\" or \"kv_both\")");
        goto done;
    }
    if (!c.ip[0]) snprintf(c.ip, sizeof c.ip, "127.0.0.1");
    *out = c;
    rc = 0;
done:
    json_decref(root);
    return rc;
}

const char *srv_kv_role_name(osp_kv_role r) {
    switch (r) {
    case OSP_KV_ROLE_PRODUCER: return "kv_producer";
    case OSP_KV_ROLE_CONSUMER: return "kv_consumer";
    case OSP_KV_ROLE_BOTH: return "kv_both";
    default: return "none";
    }
}

/* ---- a request's kv_transfer_params -------------------------------------------------------- */

#define KVP "kv_transfer_params"

/* A key of the object, JSON null being "not given" (vLLM's toy proxy sends the remote_* keys as null
 * with do_remote_decode). */
static const json_t *fld(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

/* 16 hex digits (either case) -> *out; 0, or -1 with a 400 naming the key. */
static int get_hex64(const json_t *obj, const char *key, uint64_t *out, srv_error *err) {
    const json_t *v = fld(obj, key);
    const char *s = v && json_is_string(v) ? json_string_value(v) : NULL;
    bool ok = s && strlen(s) == 16;
    uint64_t x = 0;
    for (int i = 0; ok && i < 16; i++) {
        const char c = s[i];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) ok = false;
        x = x << 4 | (uint64_t)(d < 0 ? 0 : d);
    }
    if (!ok) return srv_fail(err, 400, KVP, "'" KVP ".%s' must be a string of 16 hex digits (what the prefill server returned)", key);
    *out = x;
    return 0;
}

int srv_parse_kv_transfer_params(const json_t *root, osp_kv_role role, srv_gen_request *r, srv_error *err) {
    const json_t *o = json_object_get(root, KVP);
    if (!o || json_is_null(o)) return 0;
    if (!json_is_object(o)) return srv_fail(err, 400, KVP, "'" KVP "' must be an object");
    static const char *const known[] = {"do_remote_decode", "do_remote_prefill", "remote_engine_id", "remote_host",
                                        "remote_port", "remote_request_id", "remote_block_ids", "tp_size"};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        bool ok = false;
        for (size_t k = 0; k < sizeof known / sizeof *known && !ok; k++) ok = !strcmp(key, known[k]);
        if (!ok) return srv_fail(err, 400, KVP, "'" KVP ".%.64s' is not supported by this server", key);
    }
    osp_kv_transfer_params kt = {0};
    for (int k = 0; k < 2; k++) {
        const json_t *b = fld(o, known[k]);
        if (b && !json_is_boolean(b)) return srv_fail(err, 400, KVP, "'" KVP ".%s' must be a boolean", known[k]);
        if (b && json_is_true(b)) *(k ? &kt.do_remote_prefill : &kt.do_remote_decode) = true;
    }
    const json_t *tp = fld(o, "tp_size");
    if (tp && !(json_is_integer(tp) && json_integer_value(tp) == 1))
        return srv_fail(err, 400, KVP, "'" KVP ".tp_size' must be 1 (no tensor parallelism here)");
    /* the remote_* fields: checked whenever present, used with do_remote_prefill */
    if (fld(o, "remote_engine_id") && get_hex64(o, "remote_engine_id", &kt.remote_engine_id, err)) return -1;
    if (fld(o, "remote_request_id") && get_hex64(o, "remote_request_id", &kt.remote_request_id, err)) return -1;
    const json_t *h = fld(o, "remote_host");
    if (h) {
        const char *hs = json_is_string(h) ? json_string_value(h) : NULL;
        if (!hs || !hs[0] || strlen(hs) >= sizeof kt.remote_host)
            return srv_fail(err, 400, KVP, "'" KVP ".remote_host' must be a non-empty string of at most %zu bytes",
                            sizeof kt.remote_host - 1);
        snprintf(kt.remote_host, sizeof kt.remote_host, "%s", hs);
    }
    const json_t *p = fld(o, "remote_port");
    if (p) {
        if (!json_is_integer(p) || json_integer_value(p) < 1 || json_integer_value(p) > 65535)
            return srv_fail(err, 400, KVP, "'" KVP ".remote_port' must be an integer in [1, 65535]");
        kt.remote_port = (int32_t)json_integer_value(p);
    }
    const json_t *ids = fld(o, "remote_block_ids");
    if (ids) {
        if (!json_is_array(ids) || json_array_size(ids) > INT32_MAX)
            return srv_fail(err, 400, KVP, "'" KVP ".remote_block_ids' must be a list of block ids");
        size_t i;
        json_t *e;
        json_array_foreach(ids, i, e) {
            if (!json_is_integer(e) || json_integer_value(e) < 0)
                return srv_fail(err, 400, KVP, "'" KVP ".remote_block_ids[%zu]' must be an integer >= 0", i);
        }
        kt.remote_num_blocks = (int32_t)json_array_size(ids);
    }
    if (kt.do_remote_decode && kt.do_remote_prefill)
        return srv_fail(err, 400, KVP, "'" KVP "' cannot set both do_remote_decode and do_remote_prefill");
    if (!kt.do_remote_decode && !kt.do_remote_prefill) return 0; /* nothing asked */
    const bool producer = role == OSP_KV_ROLE_PRODUCER || role == OSP_KV_ROLE_BOTH;
    const bool consumer = role == OSP_KV_ROLE_CONSUMER || role == OSP_KV_ROLE_BOTH;
    if (role == OSP_KV_ROLE_NONE)
        return srv_fail(err, 400, KVP, "this server takes no '" KVP "' (it was started without --kv-transfer-config)");
    if (kt.do_remote_decode && !producer)
        return srv_fail(err, 400, KVP, "do_remote_decode needs a prefill server (kv_role kv_producer or kv_both); this one is %s",
                        srv_kv_role_name(role));
    if (kt.do_remote_prefill && !consumer)
        return srv_fail(err, 400, KVP, "do_remote_prefill needs a decode server (kv_role kv_consumer or kv_both); this one is %s",
                        srv_kv_role_name(role));
    if (kt.do_remote_prefill) {
        static const char *const need[] = {"remote_engine_id", "remote_host", "remote_port", "remote_request_id",
                                           "remote_block_ids"};
        for (size_t k = 0; k < sizeof need / sizeof *need; k++)
            if (!fld(o, need[k]))
                return srv_fail(err, 400, KVP, "'" KVP "' with do_remote_prefill needs '%s' (copy the prefill server's "
                                "kv_transfer_params)", need[k]);
    }
    if (kt.do_remote_decode) {
        if (r->stream) return srv_fail(err, 400, KVP, "'" KVP "' with do_remote_decode cannot be streamed (\"stream\": true)");
        if (r->n > 1 || r->n_prompts > 1)
            return srv_fail(err, 400, KVP, "'" KVP "' with do_remote_decode needs a single prompt and n = 1");
    }
    r->kv_transfer_set = true;
    r->kv_transfer = kt;
    return 0;
}

json_t *srv_json_kv_transfer_params(const osp_kv_transfer_info *info, uint64_t transfer_id, int32_t num_blocks) {
    if (num_blocks <= 0 || !info || info->role == OSP_KV_ROLE_NONE) return json_null();
    char eid[17], rid[17];
    snprintf(eid, sizeof eid, "%016" PRIx64, info->engine_id);
    snprintf(rid, sizeof rid, "%016" PRIx64, transfer_id);
    json_t *ids = json_array();
    for (int32_t i = 0; ids && i < num_blocks; i++)
        if (json_array_append_new(ids, json_integer(i))) {
            json_decref(ids);
            ids = NULL;
        }
    if (!ids) return NULL;
    return json_pack("{s:b, s:b, s:s, s:s, s:i, s:s, s:o, s:i}", "do_remote_prefill", 1, "do_remote_decode", 0,
                     "remote_engine_id", eid, "remote_host", info->host, "remote_port", (int)info->port,
                     "remote_request_id", rid, "remote_block_ids", ids, "tp_size", 1);
}
