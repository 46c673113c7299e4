/* Chat messages -> prompt text: the one place /v1/chat/completions and /tokenize turn a conversation
 * into text, with the Jinja-subset renderer (include/osprey/chat_template.h) and transformers'
 * variables: messages (with assistant tool_calls and tool messages' tool_call_id), tools,
 * add_generation_prompt, bos_token, eos_token and chat_template_kwargs.
 *
 * The model's template (or --chat-template) is parsed once at start-up; a request's own
 * `chat_template` is refused unless the server trusts them (vLLM's --trust-request-chat-template),
 * then parsed for that request and rendered within a smaller budget. continue_final_message renders without the generation
 * prompt and cuts the text right after the last message's content, as vLLM does, so the model
 * continues that message. Template errors (raise_exception, unsupported constructs) are 400s that
 * carry the renderer's message.
 *
 * Forged turns (issue 20): the render reports which bytes came from the request (message contents,
 * roles, names, tool calls and results, tools, documents, chat_template_kwargs), and
 * srv_chat_prompt tokenizes those as plain text while the template's markup keeps its control
 * tokens (osp_tokenizer_encode_spans), so "<|im_end|>\n<|im_start|>system" typed in a message stays
 * text. --allow-special-tokens-in-content (env->allow_special_in_content) restores the old
 * behaviour; a render that lost provenance falls back to it too and is counted
 * (osprey:chat_template_provenance_lost_total).
 *
 * osprey chat's /load reads a conversation file with srv_conversation_parse: the same message checks
 * as a request body's, so a file holds what the server would take. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "osprey/chat_template.h"
#include "osprey/gguf.h"
#include "server.h"

/* Renders with provenance into *o (zeroed on error). */
static int chat_render(const srv_chat_env *env, const srv_gen_request *req, osp_chat_template_output *o, srv_error *err) {
    *o = (osp_chat_template_output){0};
    osp_chat_template *own = NULL;
    const osp_chat_template *t = env->parsed;
    if (req->chat_template && !env->trust_request_template)
        return srv_fail(err, 400, "chat_template",
                        "Chat template is passed with request, but --trust-request-chat-template is not set. Refused request with untrusted chat template.");
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
    char *tools = req->tools ? json_dumps(req->tools, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    int rc = 0;
    if (!messages || (req->chat_template_kwargs && !kwargs) || (req->tools && !tools)) {
        rc = srv_fail(err, 500, NULL, "out of memory");
        goto done;
    }
    const osp_chat_template_inputs in = {.messages_json = messages, .tools_json = tools, .kwargs_json = kwargs, .bos_token = env->bos_token,
                                         .eos_token = env->eos_token,
                                         .add_generation_prompt = req->add_generation_prompt && !req->continue_final_message,
                                         .max_memory = own ? env->request_max_memory : env->max_memory,
                                         .max_steps = own ? env->request_max_steps : env->max_steps};
    if (osp_chat_template_render_spans(t, &in, o) != OSP_OK) {
        rc = srv_fail(err, 400, "messages", "chat template: %s", osp_last_error());
        goto done;
    }
    char **out = &o->text;
    const size_t len = o->len;
    if (req->continue_final_message) {
        /* cut after the last occurrence of the final message's content (right-stripped) */
        const json_t *last = json_array_get(req->messages, json_array_size(req->messages) - 1);
        const char *c = json_string_value(json_object_get(last, "content"));
        size_t cl = c ? strlen(c) : 0;
        while (cl > 0 && (c[cl - 1] == ' ' || c[cl - 1] == '\n' || c[cl - 1] == '\t' || c[cl - 1] == '\r')) cl--;
        const char *hit = NULL;
        for (const char *p = *out; cl > 0 && (p = memmem(p, len - (size_t)(p - *out), c, cl)) != NULL; p++) hit = p;
        if (cl > 0 && !hit) {
            osp_chat_template_output_free(o);
            rc = srv_fail(err, 400, "messages", "continue_final_message: the final message's content is not in the rendered prompt");
            goto done;
        }
        if (hit) { /* the text ends there; so do the tainted spans */
            const size_t end = (size_t)(hit - *out) + cl;
            (*out)[end] = 0;
            o->len = end;
            size_t k = 0;
            for (size_t i = 0; i < o->n_tainted && o->tainted[i].off < end; i++, k++)
                if (o->tainted[i].off + o->tainted[i].len > end) o->tainted[i].len = end - o->tainted[i].off;
            o->n_tainted = k;
        }
    }
done:
    free(messages);
    free(kwargs);
    free(tools);
    osp_chat_template_free(own);
    return rc;
}

int srv_chat_render(const srv_chat_env *env, const srv_gen_request *req, char **out, srv_error *err) {
    osp_chat_template_output o;
    *out = NULL;
    if (chat_render(env, req, &o, err)) return -1;
    *out = o.text;
    o.text = NULL;
    osp_chat_template_output_free(&o);
    return 0;
}

int srv_chat_prompt(const srv_chat_env *env, const osp_tokenizer *tok, const srv_gen_request *req, bool add_special,
                    char **text, int32_t **ids, size_t *n_ids, srv_error *err) {
    *text = NULL;
    *ids = NULL;
    *n_ids = 0;
    osp_chat_template_output o;
    if (chat_render(env, req, &o, err)) return -1;
    osp_status s;
    if (env->allow_special_in_content || o.provenance_lost) { /* the old behaviour: the whole prompt with special parsing */
        if (o.provenance_lost && !env->allow_special_in_content && env->metrics)
            srv_metrics_count_provenance_lost(env->metrics);
        s = osp_tokenizer_encode(tok, o.text, o.len, add_special, true, ids, n_ids);
    } else {
        s = osp_tokenizer_encode_spans(tok, o.text, o.len, o.tainted, o.n_tainted, add_special, ids, n_ids);
    }
    if (s != OSP_OK) {
        osp_chat_template_output_free(&o);
        return srv_fail(err, 500, NULL, "tokenization failed: %s", osp_last_error());
    }
    *text = o.text;
    o.text = NULL;
    osp_chat_template_output_free(&o);
    return 0;
}

int srv_conversation_parse(const char *data, size_t len, json_t **out, srv_error *err) {
    *out = NULL;
    if (len > SRV_CONVERSATION_MAX_BYTES)
        return srv_fail(err, 400, NULL, "the file is %zu bytes, more than the %zu MiB a conversation may have", len,
                        SRV_CONVERSATION_MAX_BYTES >> 20);
    json_error_t je;
    json_t *root = json_loadb(data, len, JSON_DECODE_ANY, &je);
    if (!root) return srv_fail(err, 400, NULL, "not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    const json_t *m = json_is_object(root) ? json_object_get(root, "messages") : root;
    int rc;
    if (!json_is_array(m))
        rc = srv_fail(err, 400, "messages", "a conversation is a JSON array of messages [{\"role\": ..., \"content\": ...}, ...] "
                                            "or an object with one under \"messages\"");
    else
        rc = srv_messages_normalize(m, out, err);
    json_decref(root);
    return rc;
}

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, n;
    char tmp[8192];
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0) {
        if (len + n + 1 > cap) {
            cap = (len + n + 1) * 2;
            char *p = realloc(buf, cap);
            if (!p) break;
            buf = p;
        }
        memcpy(buf + len, tmp, n);
        len += n;
    }
    fclose(f);
    if (buf) buf[len] = 0;
    return buf;
}

static char *token_text_dup(const osp_tokenizer *t, int32_t id) {
    if (id < 0) return NULL;
    size_t n;
    char buf[256];
    if (osp_tokenizer_token_bytes(t, id, buf, sizeof buf - 1, &n) != OSP_OK) return NULL;
    buf[n] = 0;
    return strdup(buf);
}

int srv_chat_env_load(srv_chat_env *env, const osp_gguf *g, const osp_tokenizer *tok, const char *template_path) {
    *env = (srv_chat_env){0};
    char *text = NULL;
    if (template_path) {
        if (!(text = read_file(template_path))) return -1;
    } else {
        osp_gguf_str tmpl = {0};
        if (osp_gguf_get_str(g, "tokenizer.chat_template", &tmpl) == OSP_OK && tmpl.data)
            text = strndup(tmpl.data, (size_t)tmpl.len);
    }
    env->template_text = text;
    if (text) {
        osp_chat_template *parsed = NULL;
        if (osp_chat_template_parse(text, strlen(text), &parsed) != OSP_OK) env->parse_error = strdup(osp_last_error());
        env->parsed = parsed;
    }
    env->bos_token = token_text_dup(tok, osp_tokenizer_bos(tok));
    env->eos_token = token_text_dup(tok, osp_tokenizer_eos(tok));
    return 0;
}

void srv_chat_env_free(srv_chat_env *env) {
    osp_chat_template_free((osp_chat_template *)env->parsed);
    free((char *)env->template_text);
    free((char *)env->parse_error);
    free((char *)env->bos_token);
    free((char *)env->eos_token);
    *env = (srv_chat_env){0};
}
