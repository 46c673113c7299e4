/* libFuzzer target for osprey chat's conversation files (srv_conversation_parse in
 * tools/server/chat.c, what /load reads): arbitrary bytes as a file. Whatever the input it must not
 * crash or leak, and must return 0 with a messages array or -1 with a 400 (500: out of memory) and a
 * message (rendered as the error JSON). What it accepts holds the normalized shape (each message an object with a known
 * role and a string content), and is a fixed point: dumped as /save writes it and parsed again, it
 * gives the same messages. Seeds: tests/fuzz/corpus/conversation/. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static int known_role(const char *r) {
    return r && (!strcmp(r, "system") || !strcmp(r, "developer") || !strcmp(r, "user") || !strcmp(r, "assistant") ||
                 !strcmp(r, "tool"));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *msgs = NULL;
    srv_error err = {0};
    const int rc = srv_conversation_parse((const char *)data, size, &msgs, &err);
    if (rc != 0) {
        if (rc != -1 || msgs || (err.status != 400 && err.status != 500) || !err.message[0]) abort();
        char *j = srv_error_json(&err);
        if (!j) abort();
        free(j);
        return 0;
    }
    if (!json_is_array(msgs)) abort();
    size_t i;
    const json_t *m;
    json_array_foreach(msgs, i, m) {
        if (!json_is_object(m) || !known_role(json_string_value(json_object_get(m, "role"))) ||
            !json_is_string(json_object_get(m, "content")))
            abort();
    }
    char *text = json_dumps(msgs, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (!text) abort();
    json_t *again = NULL;
    if (srv_conversation_parse(text, strlen(text), &again, &err) != 0 || !json_equal(msgs, again)) abort();
    json_decref(again);
    free(text);
    json_decref(msgs);
    return 0;
}
