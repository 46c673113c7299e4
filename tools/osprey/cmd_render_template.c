/* osprey render-template: render a chat template (a file, or a GGUF's tokenizer.chat_template) for
 * a conversation and print the prompt exactly as the engine would see it, without a trailing
 * newline. For tests and for users debugging templates. JSON arguments may be given inline or as
 * @FILE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey/chat_template.h"
#include "osprey/gguf.h"
#include "osprey/tokenizer.h"
#include "osprey_internal.h"

static const char *k_render_usage =
    "usage: osprey render-template (--template FILE | --model FILE.gguf) --messages JSON\n"
    "           [--add-generation-prompt] [--bos T] [--eos T] [--kwargs JSON] [--tools JSON]\n"
    "           [--documents JSON] [--now UNIX_SECONDS]\n"
    "  JSON values may be inline or @FILE. --model takes the template and bos/eos from the GGUF;\n"
    "  --template/--bos/--eos override it. --kwargs are chat_template_kwargs (extra variables).\n";

static char *read_file(const char *path, size_t *len) {
    char *buf;
    size_t n;
    const osp_status s = osp_read_file(path, (size_t)64 << 20, "file", &buf, &n);
    if (s != OSP_OK) cli_die(s, "render-template");
    if (len) *len = n;
    return buf;
}

/* An inline value or the contents of @FILE; the result is malloc'd. */
static char *arg_text(const char *v) {
    if (v && v[0] == '@') return read_file(v + 1, NULL);
    return v ? strdup(v) : NULL;
}

static char *dup_gguf_str(const osp_gguf *g, const char *key) {
    osp_gguf_str s;
    if (osp_gguf_get_str(g, key, &s) != OSP_OK) return NULL;
    char *p = malloc(s.len + 1);
    if (!p) cli_die(OSP_OK, "render-template: out of memory");
    memcpy(p, s.data, s.len);
    p[s.len] = 0;
    return p;
}

int cmd_render_template(int argc, char **argv) {
    const char *tmpl_path = NULL, *model = NULL, *messages = NULL, *kwargs = NULL, *tools = NULL,
               *documents = NULL, *bos = NULL, *eos = NULL;
    int agp = 0;
    long long now = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(k_render_usage, stdout);
            return 0;
        } else if (!strcmp(a, "--add-generation-prompt")) agp = 1;
        else if (!v) cli_die(OSP_OK, "render-template: %s needs a value", a);
        else if (!strcmp(a, "--template")) tmpl_path = v, i++;
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v, i++;
        else if (!strcmp(a, "--messages")) messages = v, i++;
        else if (!strcmp(a, "--kwargs") || !strcmp(a, "--chat-template-kwargs")) kwargs = v, i++;
        else if (!strcmp(a, "--tools")) tools = v, i++;
        else if (!strcmp(a, "--documents")) documents = v, i++;
        else if (!strcmp(a, "--bos")) bos = v, i++;
        else if (!strcmp(a, "--eos")) eos = v, i++;
        else if (!strcmp(a, "--now")) now = cli_int(a, v, 1, 1LL << 40), i++;
        else cli_die(OSP_OK, "render-template: unknown option '%s'\n%s", a, k_render_usage);
    }
    if ((!tmpl_path && !model) || !messages)
        cli_die(OSP_OK, "render-template needs --template FILE or --model FILE, and --messages JSON\n%s", k_render_usage);

    char *src = NULL, *gbos = NULL, *geos = NULL;
    size_t src_len = 0;
    if (model) {
        osp_gguf *g;
        osp_status s = osp_gguf_open(model, &g);
        if (s != OSP_OK) cli_die(s, "cannot open model");
        if (!tmpl_path) {
            src = dup_gguf_str(g, "tokenizer.chat_template");
            if (!src) cli_die(OSP_OK, "%s has no tokenizer.chat_template (give one with --template)", model);
            src_len = strlen(src);
        }
        osp_tokenizer *tok;
        s = osp_tokenizer_load(g, &tok);
        osp_gguf_close(g);
        if (s != OSP_OK) cli_die(s, "cannot load the tokenizer");
        const char *t;
        if (osp_tokenizer_bos(tok) >= 0 && (t = osp_tokenizer_token_text(tok, osp_tokenizer_bos(tok)))) gbos = strdup(t);
        if (osp_tokenizer_eos(tok) >= 0 && (t = osp_tokenizer_token_text(tok, osp_tokenizer_eos(tok)))) geos = strdup(t);
        osp_tokenizer_free(tok);
    }
    if (tmpl_path) {
        free(src);
        src = read_file(tmpl_path, &src_len);
    }
    osp_chat_template *t;
    osp_status s = osp_chat_template_parse(src, src_len, &t);
    if (s != OSP_OK) cli_die(s, "cannot parse the template");
    char *msgs = arg_text(messages), *kw = arg_text(kwargs), *tl = arg_text(tools), *docs = arg_text(documents);
    osp_chat_template_inputs in = {.messages_json = msgs, .tools_json = tl, .documents_json = docs,
                                   .kwargs_json = kw, .bos_token = bos ? bos : gbos,
                                   .eos_token = eos ? eos : geos, .add_generation_prompt = agp, .now = now};
    char *out;
    size_t n;
    s = osp_chat_template_render(t, &in, &out, &n);
    if (s != OSP_OK) cli_die(s, "cannot render the template");
    fwrite(out, 1, n, stdout);
    free(out);
    osp_chat_template_free(t);
    free(msgs), free(kw), free(tl), free(docs), free(src), free(gbos), free(geos);
    return 0;
}
