/* osprey chat: a terminal chat over the engine and the model's chat template.
 *
 * Each user line is added to the conversation, which is rendered with the same code as osprey
 * serve's /v1/chat/completions (srv_chat_env_load + srv_chat_render in tools/server/chat.c:
 * add_generation_prompt, the model's bos/eos, --chat-template) and tokenized as the server does
 * (srv_chat_prompt: no added BOS, the template's special tokens parsed, text typed in a message kept
 * as plain text unless --allow-special-tokens-in-content). The reply streams through the server's output text
 * (srv_text: incremental detokenizer, special tokens skipped) and stops at end-of-generation; it is
 * kept as the assistant's message. The engine keeps prefix caching on, so a turn re-uses the K/V of
 * the conversation before it. `/reset` forgets the conversation (not --system), `/exit` or EOF
 * quits.
 *
 * stdout carries only the replies, each followed by a newline; the banner, the "> " prompt (when
 * stdin is a terminal) and per-reply speed go to stderr. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "osprey/engine.h"
#include "osprey/model.h"
#include "osprey/tokenizer.h"
#include "server.h"

typedef struct chat_args {
    cli_engine_args eng; /* -m, -t, --device, --kv-cache-dtype */
    const char *system, *chat_template;
    bool allow_special; /* --allow-special-tokens-in-content */
    int32_t max_tokens; /* 0: up to the context length */
    float temperature, top_p;
    int32_t top_k;
    bool seed_set;
    uint64_t seed;
} chat_args;

static const char k_chat_usage[] =
    "usage: osprey chat -m FILE [options]\n"
    "  one line per user message; /reset clears the conversation, /exit or Ctrl-D quits\n"
    "\n"
    CLI_ENGINE_HELP
    CLI_KV_DTYPE_HELP
    CLI_KV_SCALES_HELP
    "  --temp T                temperature, 0 = greedy (default: 0.8)\n"
    "  --top-k K               keep the K most likely tokens, -1 or 0 = all (default: 40)\n"
    "  --top-p P               nucleus sampling mass, 0..1 (default: 0.95)\n"
    "  --seed S                sampler seed, 0..4294967295 (default: from the clock)\n"
    "  --system TEXT           a system message opening the conversation (default: none)\n"
    "  --chat-template FILE    a Jinja chat template (default: the model's tokenizer.chat_template)\n"
    "  -n, --max-tokens N      most tokens per reply, 0 = up to the context (default: 0)\n"
    "  --allow-special-tokens-in-content\n"
    "                          special-token text typed in a message (\"<|im_end|>\") becomes control\n"
    "                          tokens, as before issue 20 (default: off, it stays plain text)\n"
    "  -h, --help              this text\n";

static chat_args parse(int argc, char **argv) {
    /* sampling defaults as osprey generate (llama.cpp's) */
    chat_args a = {.eng = cli_engine_args_default(), .temperature = 0.8f, .top_k = 40, .top_p = 0.95f};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) cli_help(k_chat_usage);
        else if (cli_engine_arg(&a.eng, CLI_ENGINE_KV_DTYPE, argc, argv, &i)) continue;
        else if (!strcmp(f, "--temp")) a.temperature = (float)cli_float(f, v, 0, 100), i++;
        else if (!strcmp(f, "--top-k")) a.top_k = (int32_t)cli_int(f, v, -1, 1 << 30), i++;
        else if (!strcmp(f, "--top-p")) a.top_p = (float)cli_float(f, v, 0, 1), i++;
        else if (!strcmp(f, "--seed")) a.seed = (uint64_t)cli_int(f, v, 0, (long long)UINT32_MAX), a.seed_set = true, i++;
        else if (!strcmp(f, "--system")) {
            if (!v) cli_die(OSP_OK, "--system needs a value");
            a.system = v, i++;
        } else if (!strcmp(f, "--chat-template")) {
            if (!v) cli_die(OSP_OK, "--chat-template needs a value");
            a.chat_template = v, i++;
        } else if (!strcmp(f, "--allow-special-tokens-in-content")) {
            a.allow_special = true;
        } else if (!strcmp(f, "-n") || !strcmp(f, "--n-predict") || !strcmp(f, "--max-tokens"))
            a.max_tokens = (int32_t)cli_int(f, v, 0, 1 << 30), i++;
        else cli_die(OSP_OK, "chat: unknown option '%s'\n%s", f, k_chat_usage);
    }
    if (!a.eng.model) cli_die(OSP_OK, "chat needs -m FILE\n%s", k_chat_usage);
    return a;
}

static void add_message(json_t *msgs, const char *role, const char *content) {
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    if (!m || json_array_append_new(msgs, m)) cli_die(OSP_OK, "out of memory");
}

/* One reply to the conversation in `msgs`: streamed to stdout, returned (malloc'd) in *reply.
 * Returns 0, or -1 after printing why (the conversation is left as it was). */
static int reply(osp_engine *e, const osp_tokenizer *tok, const srv_chat_env *env, const chat_args *a, json_t *msgs,
                 uint64_t request_id, char **reply_text) {
    srv_gen_request req = {.messages = msgs, .add_generation_prompt = true};
    srv_error err;
    char *prompt = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (srv_chat_prompt(env, tok, &req, false, &prompt, &ids, &n_ids, &err)) {
        fprintf(stderr, "osprey: error: %s\n", err.message);
        return -1;
    }
    free(prompt);
    osp_status s;
    const int32_t max_len = osp_engine_params_get(e)->max_model_len;
    if (n_ids == 0 || (int64_t)n_ids >= max_len) {
        fprintf(stderr, "osprey: error: the conversation is %zu tokens, the context is %d: /reset to start over\n", n_ids,
                max_len);
        free(ids);
        return -1;
    }
    osp_request_params rp = osp_request_default_params();
    rp.request_id = request_id;
    rp.prompt = ids;
    rp.num_prompt = (int32_t)n_ids;
    rp.max_tokens = a->max_tokens;
    rp.temperature = a->temperature;
    rp.top_k = a->top_k;
    rp.top_p = a->top_p;
    rp.seed = a->seed + request_id; /* each reply its own stream, reproducible with --seed */
    rp.has_seed = true;
    srv_text text;
    if (srv_text_init(&text, tok, true, NULL, 0, false)) cli_die(OSP_OK, "out of memory");
    const double t0 = cli_now_s();
    if ((s = osp_engine_add(e, &rp)) != OSP_OK) {
        fprintf(stderr, "osprey: error: cannot run the conversation: %s\n", osp_last_error());
        free(ids);
        srv_text_free(&text);
        return -1;
    }
    int32_t buf[64], n_gen = 0;
    double t_first = 0;
    bool finished = false;
    osp_finish_reason why = OSP_FINISH_LENGTH;
    while (!finished) {
        if ((s = osp_engine_step(e, NULL)) != OSP_OK) cli_die(s, "step failed");
        osp_request_output o;
        do {
            if ((s = osp_engine_poll(e, rp.request_id, buf, (int32_t)(sizeof buf / sizeof buf[0]), &o, 0)) != OSP_OK)
                cli_die(s, "poll failed");
            if (n_gen == 0 && o.num_tokens > 0) t_first = cli_now_s();
            for (int32_t i = 0; i < o.num_tokens; i++) {
                /* the end-of-generation token ends the reply and gives no text */
                if (osp_tokenizer_is_eog(tok, buf[i])) continue;
                if (srv_text_push(&text, buf[i]) < 0) cli_die(OSP_OK, "out of memory");
            }
            n_gen += o.num_tokens;
            finished = o.finished;
            if (finished) why = o.finish_reason;
            if (finished && srv_text_finish(&text) < 0) cli_die(OSP_OK, "out of memory");
            const size_t ready = srv_text_ready(&text);
            if (ready > text.sent) {
                fwrite(text.buf + text.sent, 1, ready - text.sent, stdout);
                fflush(stdout);
                text.sent = ready;
            }
        } while (!finished && o.num_tokens == (int32_t)(sizeof buf / sizeof buf[0]));
    }
    const double t_end = cli_now_s();
    free(ids);
    putchar('\n');
    fflush(stdout);
    if (why == OSP_FINISH_ERROR) fprintf(stderr, "osprey: error: the reply failed\n");
    const double t_prefill = t_first > 0 ? t_first - t0 : 0, t_dec = t_first > 0 ? t_end - t_first : 0;
    fprintf(stderr, "[prompt %zu tokens, %.1f tokens/s | reply %d tokens, %.1f tokens/s%s]\n", n_ids,
            t_prefill > 0 ? (double)n_ids / t_prefill : 0.0, n_gen,
            n_gen > 1 && t_dec > 0 ? (double)(n_gen - 1) / t_dec : 0.0, why == OSP_FINISH_LENGTH ? ", max tokens" : "");
    *reply_text = strdup(text.buf ? text.buf : "");
    srv_text_free(&text);
    if (!*reply_text) cli_die(OSP_OK, "out of memory");
    return 0;
}

int cmd_chat(int argc, char **argv) {
    chat_args a = parse(argc, argv);
    if (!a.seed_set) a.seed = (uint64_t)(cli_now_s() * 1e6);

    const double t0 = cli_now_s();
    osp_engine_params ep = cli_engine_params(&a.eng);
    ep.max_num_seqs = 1;
    osp_engine *e;
    osp_status s = osp_engine_create(&ep, &e);
    if (s != OSP_OK) cli_die(s, "cannot start the engine");
    cli_report_device(e);
    const osp_gguf *g = osp_model_gguf(osp_engine_model(e));
    osp_tokenizer *tok;
    if ((s = osp_tokenizer_load(g, &tok)) != OSP_OK) cli_die(s, "cannot load tokenizer");
    srv_chat_env env;
    if (srv_chat_env_load(&env, g, tok, a.chat_template)) cli_die(OSP_OK, "--chat-template: cannot read '%s'", a.chat_template);
    env.allow_special_in_content = a.allow_special;
    if (env.parse_error) cli_die(OSP_OK, "the chat template does not parse: %s", env.parse_error);
    if (!env.template_text) cli_die(OSP_OK, "%s has no chat template; give one with --chat-template FILE", a.eng.model);

    const char *base = strrchr(a.eng.model, '/');
    fprintf(stderr, "osprey chat: %s loaded in %.2f s, context %d tokens\n"
                    "  type a message and Enter; /reset clears the conversation, /exit or Ctrl-D quits\n",
            base ? base + 1 : a.eng.model, cli_now_s() - t0, osp_engine_params_get(e)->max_model_len);

    json_t *msgs = json_array();
    if (!msgs) cli_die(OSP_OK, "out of memory");
    if (a.system) add_message(msgs, "system", a.system);
    const bool tty = isatty(STDIN_FILENO);
    char *line = NULL;
    size_t line_cap = 0;
    uint64_t next_id = 1;
    for (;;) {
        if (tty) fputs("> ", stderr);
        ssize_t n = getline(&line, &line_cap, stdin);
        if (n < 0) break;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
        if (n == 0) continue;
        if (!strcmp(line, "/exit") || !strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(msgs);
            if (a.system) add_message(msgs, "system", a.system);
            fputs("[conversation cleared]\n", stderr);
            continue;
        }
        add_message(msgs, "user", line);
        char *r = NULL;
        if (reply(e, tok, &env, &a, msgs, next_id++, &r)) {
            json_array_remove(msgs, json_array_size(msgs) - 1); /* the conversation stays as it was */
            continue;
        }
        add_message(msgs, "assistant", r);
        free(r);
    }
    free(line);
    json_decref(msgs);
    srv_chat_env_free(&env);
    osp_tokenizer_free(tok);
    osp_engine_free(e);
    return 0;
}
