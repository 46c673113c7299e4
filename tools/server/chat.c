/* Chat messages -> prompt text: the one place /v1/chat/completions, /tokenize and `osprey chat`
 * turn a conversation into text.
 *
 * Until the Jinja renderer (include/osprey/chat_template.h) is wired in here, this renders ChatML
 * (<|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n) for models whose template uses
 * it (SmolLM2, Qwen), without the template's own extras (such as a default system prompt), and refuses
 * other templates with a 400 that says so. */
#include <stdlib.h>
#include <string.h>

#include "server.h"

typedef struct sb {
    char *p;
    size_t len, cap;
} sb;

static int sb_put(sb *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) return -1;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

static int sb_str(sb *b, const char *s) { return sb_put(b, s, strlen(s)); }

int srv_chat_render(const srv_chat_env *env, const srv_gen_request *req, char **out, srv_error *err) {
    const char *tmpl = req->chat_template ? req->chat_template : env->template_text;
    if (!tmpl) return srv_fail(err, 400, NULL, "the model has no chat template; pass one with --chat-template");
    if (!strstr(tmpl, "<|im_start|>"))
        return srv_fail(err, 400, "chat_template", "only ChatML chat templates are supported for now");
    sb b = {0};
    const size_t n = json_array_size(req->messages);
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const json_t *m = json_array_get(req->messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        const json_t *c = json_object_get(m, "content");
        const bool last_open = req->continue_final_message && i + 1 == n;
        rc |= sb_str(&b, "<|im_start|>");
        rc |= sb_str(&b, !strcmp(role, "developer") ? "system" : role);
        rc |= sb_str(&b, "\n");
        rc |= sb_put(&b, json_string_value(c), json_string_length(c));
        if (!last_open) rc |= sb_str(&b, "<|im_end|>\n");
    }
    if (rc == 0 && req->add_generation_prompt) rc |= sb_str(&b, "<|im_start|>assistant\n");
    if (rc || !b.p) {
        free(b.p);
        return srv_fail(err, 500, NULL, "out of memory");
    }
    *out = b.p;
    return 0;
}
