/* Prefill/decode disaggregation at the server's edge (tools/server/kv_transfer.c): --kv-transfer-config
 * parsed into the engine's terms or refused naming the key; a request's kv_transfer_params through the
 * whole request parser (the role rules, each malformed shape a 400 naming the field, null as "not
 * given"); the producer's reply object. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "server.h"

static void test_config(void **state) {
    (void)state;
    srv_kv_transfer_config c;
    char why[320];
    assert_int_equal(srv_kv_transfer_config_parse("{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\"}", &c,
                                                  why, sizeof why), 0);
    assert_int_equal(c.role, OSP_KV_ROLE_PRODUCER);
    assert_string_equal(c.ip, "127.0.0.1");
    assert_true(c.port == 0 && c.buffer_bytes == 0 && c.timeout_s == 0);
    assert_int_equal(srv_kv_transfer_config_parse("{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_both\", \"kv_ip\": "
                                                  "\"0.0.0.0\", \"kv_port\": 14579, \"kv_buffer_size\": 1e9, "
                                                  "\"kv_connector_extra_config\": {\"timeout_s\": 2.5}}",
                                                  &c, why, sizeof why), 0);
    assert_true(c.role == OSP_KV_ROLE_BOTH && c.port == 14579 && c.buffer_bytes == 1000000000 && c.timeout_s == 2.5);
    assert_string_equal(c.ip, "0.0.0.0");
    assert_int_equal(srv_kv_transfer_config_parse("{\"kv_role\": \"kv_consumer\", \"kv_connector\": \"OspreyConnector\", "
                                                  "\"kv_connector_extra_config\": {}}", &c, why, sizeof why), 0);
    assert_int_equal(c.role, OSP_KV_ROLE_CONSUMER);
    static const struct {
        const char *json, *says;
    } bad[] = {
        {"", "not JSON"},
        {"[1]", "JSON object"},
        {"{\"kv_role\": \"kv_producer\"}", "'kv_connector'"},
        {"{\"kv_connector\": \"OspreyConnector\"}", "'kv_role'"},
        {"{\"kv_connector\": 1, \"kv_role\": \"kv_producer\"}", "'kv_connector'"},
        {"{\"kv_connector\": \"LMCacheConnectorV1\", \"kv_role\": \"kv_producer\"}", "LMCacheConnectorV1"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_leader\"}", "'kv_role'"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\", \"kv_port\": -1}", "'kv_port'"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\", \"kv_port\": 1.5}", "'kv_port'"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\", \"kv_ip\": 4}", "'kv_ip'"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\", \"kv_buffer_size\": -5}", "'kv_buffer_size'"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\", \"kv_buffer_size\": \"1G\"}", "'kv_buffer_size'"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\", \"engine_id\": \"x\"}", "'engine_id'"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\", \"kv_connector_extra_config\": "
         "{\"timeout_s\": -1}}", "timeout_s"},
        {"{\"kv_connector\": \"OspreyConnector\", \"kv_role\": \"kv_producer\", \"kv_connector_extra_config\": "
         "{\"backends\": []}}", "kv_connector_extra_config.backends"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why[0] = 0;
        if (srv_kv_transfer_config_parse(bad[i].json, &c, why, sizeof why) != -1) fail_msg("accepted: %s", bad[i].json);
        if (!strstr(why, bad[i].says) || !strstr(why, "--kv-transfer-config"))
            fail_msg("%s: '%s' does not say %s", bad[i].json, why, bad[i].says);
    }
}

/* Parses body on /v1/completions for a server of `role`: 0, or the 400 (its message in why). */
static int parse(const char *body, osp_kv_role role, srv_gen_request *r, char *why) {
    const srv_parse_limits lim = {.n_vocab = 1000, .kv_role = role};
    srv_error err = {0};
    const int rc = srv_parse_gen_request(body, strlen(body), SRV_ROUTE_COMPLETIONS, &lim, r, &err);
    if (rc) {
        assert_int_equal(err.status, 400);
        assert_string_equal(err.param, "kv_transfer_params");
        strcpy(why, err.message);
    }
    return rc;
}

static void test_params(void **state) {
    (void)state;
    srv_gen_request r;
    char why[600];
    assert_int_equal(parse("{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_decode\": true, \"do_remote_prefill\": "
                           "false, \"remote_engine_id\": null, \"remote_block_ids\": null, \"remote_host\": null, "
                           "\"remote_port\": null}}", OSP_KV_ROLE_PRODUCER, &r, why), 0);
    assert_true(r.kv_transfer_set && r.kv_transfer.do_remote_decode && !r.kv_transfer.do_remote_prefill);
    srv_gen_request_free(&r);
    assert_int_equal(parse("{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_prefill\": true, \"remote_engine_id\": "
                           "\"00112233aabbccdd\", \"remote_host\": \"10.0.0.7\", \"remote_port\": 5555, \"remote_request_id\": "
                           "\"ffffffffffffffff\", \"remote_block_ids\": [0, 1, 2, 3], \"tp_size\": 1}}", OSP_KV_ROLE_BOTH, &r, why), 0);
    assert_true(r.kv_transfer_set && r.kv_transfer.do_remote_prefill && r.kv_transfer.remote_port == 5555);
    assert_true(r.kv_transfer.remote_engine_id == 0x00112233aabbccddull && r.kv_transfer.remote_request_id == UINT64_MAX);
    assert_true(r.kv_transfer.remote_num_blocks == 4);
    assert_string_equal(r.kv_transfer.remote_host, "10.0.0.7");
    srv_gen_request_free(&r);
    /* nothing asked: nothing set, on any server */
    assert_int_equal(parse("{\"prompt\": \"x\", \"kv_transfer_params\": {}}", OSP_KV_ROLE_NONE, &r, why), 0);
    assert_false(r.kv_transfer_set);
    srv_gen_request_free(&r);
    assert_int_equal(parse("{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_decode\": false}}", OSP_KV_ROLE_NONE, &r, why), 0);
    assert_false(r.kv_transfer_set);
    srv_gen_request_free(&r);
    static const struct {
        const char *body;
        osp_kv_role role;
        const char *says;
    } bad[] = {
        {"{\"prompt\": \"x\", \"kv_transfer_params\": 1}", OSP_KV_ROLE_BOTH, "object"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_decode\": true, \"zz\": 1}}", OSP_KV_ROLE_BOTH, "zz"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_decode\": true, \"do_remote_prefill\": true}}", OSP_KV_ROLE_BOTH, "both"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_decode\": true}}", OSP_KV_ROLE_NONE, "--kv-transfer-config"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_decode\": true}}", OSP_KV_ROLE_CONSUMER, "kv_producer"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_prefill\": true}}", OSP_KV_ROLE_PRODUCER, "kv_consumer"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_prefill\": true}}", OSP_KV_ROLE_CONSUMER, "remote_engine_id"},
        {"{\"prompt\": \"x\", \"stream\": true, \"kv_transfer_params\": {\"do_remote_decode\": true}}", OSP_KV_ROLE_PRODUCER, "stream"},
        {"{\"prompt\": \"x\", \"n\": 3, \"kv_transfer_params\": {\"do_remote_decode\": true}}", OSP_KV_ROLE_PRODUCER, "n = 1"},
        {"{\"prompt\": [\"x\", \"y\"], \"kv_transfer_params\": {\"do_remote_decode\": true}}", OSP_KV_ROLE_PRODUCER, "single prompt"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"tp_size\": 2}}", OSP_KV_ROLE_BOTH, "tp_size"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"remote_engine_id\": \"abc\"}}", OSP_KV_ROLE_BOTH, "remote_engine_id"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"remote_request_id\": \"00112233aabbccdz\"}}", OSP_KV_ROLE_BOTH, "remote_request_id"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"remote_port\": 65536}}", OSP_KV_ROLE_BOTH, "remote_port"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"remote_host\": \"\"}}", OSP_KV_ROLE_BOTH, "remote_host"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"remote_block_ids\": [1, \"2\"]}}", OSP_KV_ROLE_BOTH, "remote_block_ids[1]"},
        {"{\"prompt\": \"x\", \"kv_transfer_params\": {\"do_remote_decode\": 1}}", OSP_KV_ROLE_BOTH, "boolean"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        why[0] = 0;
        if (parse(bad[i].body, bad[i].role, &r, why) != -1) fail_msg("accepted: %s", bad[i].body);
        if (!strstr(why, bad[i].says)) fail_msg("%s: '%s' does not say %s", bad[i].body, why, bad[i].says);
        srv_gen_request_free(&r);
    }
}

static void test_reply(void **state) {
    (void)state;
    osp_kv_transfer_info info = {.role = OSP_KV_ROLE_PRODUCER, .port = 4321, .engine_id = 0xabcdef0123456789ull};
    strcpy(info.host, "127.0.0.1");
    json_t *j = srv_json_kv_transfer_params(&info, 0x10, 3);
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(s, "{\"do_remote_decode\":false,\"do_remote_prefill\":true,\"remote_block_ids\":[0,1,2],"
                           "\"remote_engine_id\":\"abcdef0123456789\",\"remote_host\":\"127.0.0.1\",\"remote_port\":4321,"
                           "\"remote_request_id\":\"0000000000000010\",\"tp_size\":1}");
    free(s);
    json_decref(j);
    j = srv_json_kv_transfer_params(&info, 0x10, 0);
    assert_true(json_is_null(j));
    json_decref(j);
    info.role = OSP_KV_ROLE_NONE;
    j = srv_json_kv_transfer_params(&info, 0x10, 2);
    assert_true(json_is_null(j));
    json_decref(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_config), cmocka_unit_test(test_params),
                                       cmocka_unit_test(test_reply)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
