/* osprey tokenize: the ids of a text as a JSON array, from any GGUF with a vocabulary (vocab-only
 * files included: no weights are touched). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "osprey/gguf.h"
#include "osprey/tokenizer.h"

static const char k_help[] =
    "usage: osprey tokenize -m FILE -p TEXT [options]\n"
    "  print the token ids of TEXT as a JSON array (a vocab-only GGUF is enough)\n"
    "\n"
    "  -m, --model FILE        the GGUF file with the vocabulary (required)\n"
    "  -p, --prompt TEXT       the text (required)\n"
    "  --no-special            special tokens written in TEXT stay plain text (default: parsed)\n"
    "  --no-bos                no BOS / added special tokens (default: added as the model says)\n"
    "  -h, --help              this text\n";

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text = NULL;
    bool parse_special = true, add_special = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) cli_help(k_help);
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = i + 1 < argc ? argv[++i] : NULL;
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) text = i + 1 < argc ? argv[++i] : NULL;
        else if (!strcmp(a, "--no-special")) parse_special = false;
        else if (!strcmp(a, "--no-bos")) add_special = false;
        else cli_die(OSP_OK, "tokenize: unknown option '%s'", a);
    }
    if (!model || !text) cli_die(OSP_OK, "tokenize needs -m FILE and -p TEXT");
    osp_gguf *g;
    osp_status s = osp_gguf_open(model, &g);
    if (s != OSP_OK) cli_die(s, "cannot load model");
    osp_tokenizer *tok;
    s = osp_tokenizer_load(g, &tok);
    osp_gguf_close(g);
    if (s != OSP_OK) cli_die(s, "cannot load tokenizer");
    int32_t *ids;
    size_t n;
    s = osp_tokenizer_encode(tok, text, strlen(text), add_special, parse_special, &ids, &n);
    if (s != OSP_OK) cli_die(s, "tokenize failed");
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ", %d" : "%d", ids[i]);
    puts("]");
    free(ids);
    osp_tokenizer_free(tok);
    return 0;
}
