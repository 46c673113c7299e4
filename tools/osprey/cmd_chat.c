/* osprey chat: a terminal chat over the engine and the model's chat template.
 *
 * Each user line is added to the conversation, which is rendered with the same code as osprey
 * serve's /v1/chat/completions (srv_chat_env_load + srv_chat_render in tools/server/chat.c:
 * add_generation_prompt, the model's bos/eos, --chat-template) and tokenized as the server does
 * (srv_chat_prompt: no added BOS, the template's special tokens parsed, text typed in a message kept
 * as plain text unless --allow-special-tokens-in-content). The reply streams through the server's output text
 * (srv_text: incremental detokenizer, special tokens skipped) and stops at end-of-generation; it is
 * kept as the assistant's message. The engine keeps prefix caching on, so a turn re-uses the K/V of
 * the conversation before it.
 *
 * Keys (chat_input.c: libedit on a terminal, plain lines otherwise): Ctrl-C while a reply runs
 * aborts that request (osp_engine_abort: it finishes at the next step and its KV blocks are freed);
 * the text shown so far stays in the conversation as the assistant's message, as llama.cpp's
 * llama-cli keeps it (nothing shown yet: the user's line is taken back too). Ctrl-C at the prompt
 * drops the line being typed; a second one in a row, Ctrl-D or /exit quits with status 0.
 * Commands: /help, /reset (forget the conversation but --system), /save FILE and /load FILE (the
 * conversation as an OpenAI messages array, JSON; srv_conversation_parse checks a loaded file as the
 * server checks a request's messages), /exit. A line starting with "//" is sent with one "/" less.
 *
 * stdout carries only the replies, each followed by a newline; the banner, the "> " prompt and the
 * line editing (on a terminal), command results and per-reply speed go to stderr. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "chat_input.h"
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
    bool ignore_eos;
    const char *history; /* --history FILE; NULL: ~/.osprey_history */
    bool no_history;
} chat_args;

#define CHAT_KEYS_HELP                                                                                          \
    "  Enter sends the line; Ctrl-C stops a reply (the text shown so far stays in the conversation);\n"     \
    "  Ctrl-C at the prompt drops the line, twice in a row quits; Ctrl-D quits. On a terminal the line\n" \
    "  is edited with libedit (emacs keys, Up/Down for history).\n"                                      \
    "  /help             this list\n"                                                                    \
    "  /reset            forget the conversation (but --system)\n"                                       \
    "  /save FILE        write the conversation as JSON (an OpenAI messages array)\n"                    \
    "  /load FILE        replace the conversation with a saved one (a messages array, or an object\n"    \
    "                    with \"messages\" like a /v1/chat/completions body)\n"                          \
    "  /exit, /quit      quit (so do Ctrl-D and a second Ctrl-C)\n"                                      \
    "  //TEXT            send /TEXT (a line starting with / is otherwise a command)\n"

static const char k_chat_usage[] =
    "usage: osprey chat -m FILE [options]\n"
    "  one line per user message; the reply streams to stdout\n"
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
    "  --ignore-eos            go on past end-of-generation tokens, up to -n (default: stop there)\n"
    "  --history FILE          line history on a terminal (default: ~/.osprey_history, mode 0600)\n"
    "  --no-history            keep no history file\n"
    "  -h, --help              this text\n"
    "\n"
    "keys, and the commands typed at the prompt:\n"
    CHAT_KEYS_HELP;

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
        else if (!strcmp(f, "--ignore-eos")) a.ignore_eos = true;
        else if (!strcmp(f, "--history")) {
            if (!v || !v[0]) cli_die(OSP_OK, "--history needs a file");
            a.history = v, i++;
        } else if (!strcmp(f, "--no-history")) a.no_history = true;
        else cli_die(OSP_OK, "chat: unknown option '%s'\n%s", f, k_chat_usage);
    }
    if (!a.eng.model) cli_die(OSP_OK, "chat needs -m FILE\n%s", k_chat_usage);
    return a;
}

static void add_message(json_t *msgs, const char *role, const char *content) {
    json_t *m = json_pack("{s:s, s:s}", "role", role, "content", content);
    if (!m || json_array_append_new(msgs, m)) cli_die(OSP_OK, "out of memory");
}

/* The conversation in `msgs` rendered with the generation prompt and tokenized as the server does:
 * *ids (malloc'd) [*n_ids]. Returns 0, or -1 after printing why (also when it leaves no room for a
 * reply in the context). */
static int conversation_ids(osp_engine *e, const osp_tokenizer *tok, const srv_chat_env *env, json_t *msgs,
                            bool loading, int32_t **ids, size_t *n_ids) {
    srv_gen_request req = {.messages = msgs, .add_generation_prompt = true};
    srv_error err;
    char *prompt = NULL;
    *ids = NULL;
    *n_ids = 0;
    if (srv_chat_prompt(env, tok, &req, false, &prompt, ids, n_ids, &err)) {
        fprintf(stderr, "osprey: error: %s\n", err.message);
        return -1;
    }
    free(prompt);
    const int32_t max_len = osp_engine_params_get(e)->max_model_len;
    if (*n_ids == 0 || (int64_t)*n_ids >= max_len) {
        fprintf(stderr, "osprey: error: the conversation is %zu tokens, the context is %d%s\n", *n_ids, max_len,
                loading ? " (a reply needs room)" : ": /reset to start over");
        free(*ids);
        *ids = NULL;
        return -1;
    }
    return 0;
}

/* After an aborted request: the engine holds no request and every KV block is back in the pool
 * (free, or cached for the prefix cache with no reference), and its invariants hold. */
static bool engine_idle(osp_engine *e) {
    const osp_engine_stats st = osp_engine_get_stats(e);
    return !osp_engine_has_unfinished(e) && st.num_running == 0 && st.num_waiting == 0 &&
           st.num_free_blocks == st.num_blocks && osp_engine_check_invariants(e) == OSP_OK;
}

/* One reply to the conversation in `msgs`: streamed to stdout, returned (malloc'd) in *reply; a
 * Ctrl-C (chat_sigint_take) between steps aborts the request, *interrupted is set and *reply is the
 * text shown until then. Returns 0, or -1 after printing why (the conversation is left as it was). */
static int reply(osp_engine *e, const osp_tokenizer *tok, const srv_chat_env *env, const chat_args *a, json_t *msgs,
                 uint64_t request_id, char **reply_text, bool *interrupted) {
    *interrupted = false;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (conversation_ids(e, tok, env, msgs, false, &ids, &n_ids)) return -1;
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
    rp.ignore_eos = a->ignore_eos;
    srv_text text;
    if (srv_text_init(&text, tok, true, NULL, 0, false)) cli_die(OSP_OK, "out of memory");
    const double t0 = cli_now_s();
    osp_status s;
    if ((s = osp_engine_add(e, &rp)) != OSP_OK) {
        fprintf(stderr, "osprey: error: cannot run the conversation: %s\n", osp_last_error());
        free(ids);
        srv_text_free(&text);
        return -1;
    }
    int32_t buf[64], n_gen = 0;
    double t_first = 0;
    bool finished = false, aborted = false;
    osp_finish_reason why = OSP_FINISH_LENGTH;
    while (!finished) {
        /* Ctrl-C (also one pressed since Enter): abort; the request finishes (OSP_FINISH_ABORT) at
         * the next step, which frees its blocks. OSP_ERR_NOT_FOUND: it finished in the last step, the
         * reply is whole (and that Ctrl-C is lost: the prompt does not see it). */
        if (!aborted && chat_sigint_take()) aborted = osp_engine_abort(e, rp.request_id) == OSP_OK;
        if ((s = osp_engine_step(e, NULL)) != OSP_OK) cli_die(s, "step failed");
        osp_request_output o;
        do {
            if ((s = osp_engine_poll(e, rp.request_id, buf, (int32_t)(sizeof buf / sizeof buf[0]), &o, 0)) != OSP_OK)
                cli_die(s, "poll failed");
            if (n_gen == 0 && o.num_tokens > 0) t_first = cli_now_s();
            finished = o.finished;
            if (finished) why = o.finish_reason;
            if (aborted) continue; /* tokens after the Ctrl-C are dropped: the reply is what was shown */
            for (int32_t i = 0; i < o.num_tokens; i++) {
                /* the end-of-generation token ends the reply and gives no text */
                if (osp_tokenizer_is_eog(tok, buf[i])) continue;
                if (srv_text_push(&text, buf[i]) < 0) cli_die(OSP_OK, "out of memory");
            }
            n_gen += o.num_tokens;
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
    *interrupted = aborted && why == OSP_FINISH_ABORT;
    if (why == OSP_FINISH_ERROR) fprintf(stderr, "osprey: error: the reply failed\n");
    const double t_prefill = t_first > 0 ? t_first - t0 : 0, t_dec = t_first > 0 ? t_end - t_first : 0;
    fprintf(stderr, "[prompt %zu tokens, %.1f tokens/s | reply %d tokens, %.1f tokens/s%s", n_ids,
            t_prefill > 0 ? (double)n_ids / t_prefill : 0.0, n_gen,
            n_gen > 1 && t_dec > 0 ? (double)(n_gen - 1) / t_dec : 0.0, why == OSP_FINISH_LENGTH ? ", max tokens" : "");
    if (*interrupted) {
        if (engine_idle(e)) fputs(" | interrupted: the text shown is kept, the KV blocks are freed]\n", stderr);
        else fputs(" | interrupted]\nosprey: error: the aborted reply still holds the engine's KV blocks\n", stderr);
    } else {
        fputs("]\n", stderr);
    }
    *reply_text = strndup(text.buf ? text.buf : "", text.buf ? text.sent : 0);
    srv_text_free(&text);
    if (!*reply_text) cli_die(OSP_OK, "out of memory");
    return 0;
}

/* ---- /save and /load -------------------------------------------------------------------------- */

/* A command's FILE argument: leading "~/" becomes $HOME/. Returns a malloc'd path or NULL. */
static char *expand_path(const char *arg) {
    const char *home = getenv("HOME");
    if (arg[0] == '~' && arg[1] == '/' && home && home[0]) {
        char *p = malloc(strlen(home) + strlen(arg));
        if (p) sprintf(p, "%s%s", home, arg + 1);
        return p;
    }
    return strdup(arg);
}

/* Writes msgs to path as an indented JSON array (UTF-8), through a temporary file in the same
 * directory renamed over path, so a failed save leaves an older file whole. Returns 0, or -1 with
 * errno's reason printed. */
static int save_conversation(const json_t *msgs, const char *path) {
    char *text = json_dumps(msgs, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    char *tmp = malloc(strlen(path) + 32);
    if (!text || !tmp) cli_die(OSP_OK, "out of memory");
    sprintf(tmp, "%s.tmp-%ld", path, (long)getpid());
    int rc = -1;
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        fprintf(stderr, "osprey: error: /save %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd), unlink(tmp);
        goto done;
    }
    const bool wrote = fputs(text, f) >= 0 && fputc('\n', f) != EOF;
    const int werr = errno;
    if (fclose(f) != 0 || !wrote) {
        fprintf(stderr, "osprey: error: /save %s: %s\n", path, strerror(wrote ? errno : werr));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        fprintf(stderr, "osprey: error: /save %s: %s\n", path, strerror(errno));
        unlink(tmp);
        goto done;
    }
    rc = 0;
done:
    free(tmp);
    free(text);
    return rc;
}

/* Reads path (a regular file of at most SRV_CONVERSATION_MAX_BYTES) and parses it as a
 * conversation (srv_conversation_parse). Returns the messages (new reference), or NULL after
 * printing why. */
static json_t *load_conversation(const char *path) {
    /* O_NONBLOCK: opening a FIFO does not wait for a writer (it is refused below) */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        fprintf(stderr, "osprey: error: /load %s: %s\n", path, strerror(errno));
        if (fd >= 0) close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        fprintf(stderr, "osprey: error: /load %s: not a regular file\n", path);
        close(fd);
        return NULL;
    }
    const size_t max = SRV_CONVERSATION_MAX_BYTES;
    if ((unsigned long long)st.st_size > max) {
        fprintf(stderr, "osprey: error: /load %s: the file is %lld bytes, more than the %zu MiB a conversation may have\n",
                path, (long long)st.st_size, max >> 20);
        close(fd);
        return NULL;
    }
    char *buf = malloc(max + 1);
    if (!buf) cli_die(OSP_OK, "out of memory");
    size_t len = 0;
    for (;;) { /* up to max + 1 bytes: a file that grew past the limit is still refused */
        const ssize_t n = read(fd, buf + len, max + 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            fprintf(stderr, "osprey: error: /load %s: %s\n", path, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (n == 0 || (len += (size_t)n) == max + 1) break;
    }
    close(fd);
    json_t *msgs = NULL;
    srv_error err;
    if (srv_conversation_parse(buf, len, &msgs, &err))
        fprintf(stderr, "osprey: error: /load %s: %s\n", path, err.message);
    free(buf);
    return msgs;
}

/* ---- the session ------------------------------------------------------------------------------ */

/* A command line: "/word" or "/word ARG" with a word of letters only. *name and *arg point into
 * line (arg: the rest with its spaces trimmed, "" when none); line's space after the word is cut. */
static bool command(char *line, char **name, char **arg) {
    if (line[0] != '/') return false;
    size_t n = 1;
    while ((line[n] >= 'a' && line[n] <= 'z') || (line[n] >= 'A' && line[n] <= 'Z')) n++;
    if (n == 1 || (line[n] && line[n] != ' ' && line[n] != '\t')) return false;
    char *rest = line + n;
    while (*rest == ' ' || *rest == '\t') *rest++ = 0;
    size_t rl = strlen(rest);
    while (rl > 0 && (rest[rl - 1] == ' ' || rest[rl - 1] == '\t')) rest[--rl] = 0;
    line[n] = 0;
    *name = line + 1;
    *arg = rest;
    return true;
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

    const bool tty = isatty(STDIN_FILENO);
    char *history = NULL;
    if (tty && !a.no_history) {
        const char *home = getenv("HOME");
        if (a.history) history = expand_path(a.history);
        else if (home && home[0] && (history = malloc(strlen(home) + 32))) sprintf(history, "%s/.osprey_history", home);
    }
    chat_input *in = chat_input_open(tty, history);
    if (!in && tty) {
        fprintf(stderr, "osprey: warning: libedit cannot start on this terminal: reading plain lines\n");
        in = chat_input_open(false, NULL);
    }
    if (!in) cli_die(OSP_OK, "out of memory");
    free(history);
    chat_sigint_install(); /* from here on Ctrl-C stops a reply, not the program */

    const char *base = strrchr(a.eng.model, '/');
    fprintf(stderr, "osprey chat: %s loaded in %.2f s, context %d tokens\n"
                    "  type a message and Enter; Ctrl-C stops a reply; /help lists the commands; Ctrl-D or /exit quits\n",
            base ? base + 1 : a.eng.model, cli_now_s() - t0, osp_engine_params_get(e)->max_model_len);

    json_t *msgs = json_array();
    if (!msgs) cli_die(OSP_OK, "out of memory");
    if (a.system) add_message(msgs, "system", a.system);
    uint64_t next_id = 1;
    bool armed = false; /* the last thing at the prompt was a Ctrl-C: another one quits */
    for (;;) {
        const char *got;
        const chat_input_status st = chat_input_read(in, &got);
        if (st == CHAT_INPUT_EOF) break;
        if (st == CHAT_INPUT_INTERRUPT) {
            if (armed) break;
            armed = true;
            fputs("[Ctrl-C again, Ctrl-D or /exit quits]\n", stderr);
            continue;
        }
        armed = false;
        if (!got[strspn(got, " \t\r")]) continue; /* empty or blank: nothing to send */
        chat_input_remember(in, got);
        char *line = strdup(got), *name, *arg;
        if (!line) cli_die(OSP_OK, "out of memory");
        if (command(line, &name, &arg)) {
            if (!strcmp(name, "exit") || !strcmp(name, "quit")) {
                free(line);
                break;
            } else if (!strcmp(name, "help")) {
                fputs(CHAT_KEYS_HELP, stderr);
            } else if (!strcmp(name, "reset")) {
                json_array_clear(msgs);
                if (a.system) add_message(msgs, "system", a.system);
                fputs("[conversation cleared]\n", stderr);
            } else if (!strcmp(name, "save") || !strcmp(name, "load")) {
                char *path = arg[0] ? expand_path(arg) : NULL;
                if (!arg[0]) {
                    fprintf(stderr, "osprey: error: /%s needs a file: /%s FILE\n", name, name);
                } else if (!path) {
                    cli_die(OSP_OK, "out of memory");
                } else if (!strcmp(name, "save")) {
                    if (save_conversation(msgs, path) == 0)
                        fprintf(stderr, "[saved %zu messages to %s]\n", json_array_size(msgs), path);
                } else {
                    json_t *loaded = load_conversation(path);
                    int32_t *ids = NULL;
                    size_t n_ids = 0;
                    /* it must render with this model's template and leave room for a reply */
                    if (loaded && json_array_size(loaded) > 0 && conversation_ids(e, tok, &env, loaded, true, &ids, &n_ids)) {
                        fprintf(stderr, "osprey: error: /load %s: the conversation was not loaded\n", path);
                        json_decref(loaded);
                        loaded = NULL;
                    }
                    free(ids);
                    if (loaded) {
                        json_decref(msgs);
                        msgs = loaded;
                        fprintf(stderr, "[loaded %zu messages from %s, %zu tokens]\n", json_array_size(msgs), path, n_ids);
                    }
                }
                free(path);
            } else {
                fprintf(stderr, "osprey: error: unknown command '/%s'; /help lists them (//TEXT sends /TEXT)\n", name);
            }
            free(line);
            continue;
        }
        add_message(msgs, "user", line[0] == '/' && line[1] == '/' ? line + 1 : line);
        free(line);
        char *r = NULL;
        bool interrupted = false;
        if (reply(e, tok, &env, &a, msgs, next_id++, &r, &interrupted)) {
            json_array_remove(msgs, json_array_size(msgs) - 1); /* the conversation stays as it was */
            continue;
        }
        if (interrupted && !r[0]) json_array_remove(msgs, json_array_size(msgs) - 1); /* nothing shown: taken back */
        else add_message(msgs, "assistant", r);
        free(r);
    }
    chat_input_close(in);
    json_decref(msgs);
    srv_chat_env_free(&env);
    osp_tokenizer_free(tok);
    osp_engine_free(e);
    return 0;
}
