/* Chat messages -> prompt text: the one place /v1/chat/completions and /tokenize turn a conversation
 * into text, with the Jinja-subset renderer (include/osprey/chat_template.h) and transformers'
 * variables: messages, add_generation_prompt, bos_token, eos_token and chat_template_kwargs.
 *
 * The model's template (or --chat-template) is parsed once at start-up; a request's own
 * `chat_template` is parsed for that request. continue_final_message renders without the generation
 * prompt and cuts the text right after the last message's content, as vLLM does, so the model
 * continues that message. Template errors (raise_exception, unsupported constructs) are 400s that
 * carry the renderer's message. */
#include <stdlib.h>
#include <string.h>

#include "osprey/chat_template.h"
#include "server.h"

int srv_chat_render(const srv_chat_env *env, const srv_gen_request *req, char **out, srv_error *err) {
    osp_chat_template *own = NULL;
    const osp_chat_template *t = env->parsed;
    if (req->chat_template) {
        if (osp_chat_template_parse(req->chat_template, strlen(req->chat_template), &own) != OSP_OK)
            return srv_fail(err, 400, "chat_template", "chat_template: %s", osp_last_error());
        t = own;
    } else if (!t) {
        if (env->parse_error) return srv_fail(err, 400, NULL, "the chat template does not parse: %s", env->parse_error);
        return srv_fail(err, 400, NULL, "the model has no chat template; pass one with --chat-template or chat_template");
    }
    char *messages = json_dumps(req->messages, JSON_COMPACT);
    char *kwargs = req->chat_template_kwargs ? json_dumps(req->chat_template_kwargs, JSON_COMPACT) : NULL;
    int rc = 0;
    if (!messages || (req->chat_template_kwargs && !kwargs)) {
        rc = srv_fail(err, 500, NULL, "out of memory");
        goto done;
    }
    const osp_chat_template_inputs in = {.messages_json = messages, .kwargs_json = kwargs, .bos_token = env->bos_token,
                                         .eos_token = env->eos_token,
                                         .add_generation_prompt = req->add_generation_prompt && !req->continue_final_message};
    size_t len = 0;
    if (osp_chat_template_render(t, &in, out, &len) != OSP_OK) {
        rc = srv_fail(err, 400, "messages", "chat template: %s", osp_last_error());
        goto done;
    }
    if (req->continue_final_message) {
        /* cut after the last occurrence of the final message's content (right-stripped) */
        const json_t *last = json_array_get(req->messages, json_array_size(req->messages) - 1);
        const char *c = json_string_value(json_object_get(last, "content"));
        size_t cl = c ? strlen(c) : 0;
        while (cl > 0 && (c[cl - 1] == ' ' || c[cl - 1] == '\n' || c[cl - 1] == '\t' || c[cl - 1] == '\r')) cl--;
        const char *hit = NULL;
        for (const char *p = *out; cl > 0 && (p = memmem(p, len - (size_t)(p - *out), c, cl)) != NULL; p++) hit = p;
        if (cl > 0 && !hit) {
            free(*out);
            *out = NULL;
            rc = srv_fail(err, 400, "messages", "continue_final_message: the final message's content is not in the rendered prompt");
            goto done;
        }
        if (hit) (*out)[hit - *out + cl] = 0;
    }
done:
    free(messages);
    free(kwargs);
    osp_chat_template_free(own);
    return rc;
}
