/* Shared helpers of the osprey CLI subcommands. Only tools/ may print to stdout or exit. */
#ifndef OSPREY_TOOLS_CLI_H
#define OSPREY_TOOLS_CLI_H

#include <stdnoreturn.h>

#include "osprey/engine.h"
#include "osprey/model.h"
#include "osprey/status.h"

/* Prints "osprey: error: <msg>" (and osp_last_error() when s != OSP_OK) to stderr and exits 1. */
noreturn void cli_die(osp_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Parses a number or dies naming the flag. */
long long cli_int(const char *flag, const char *v, long long lo, long long hi);
double cli_float(const char *flag, const char *v, double lo, double hi);
double cli_now_s(void);
/* Parses --device cpu|cuda|auto or dies. */
osp_device cli_device(const char *flag, const char *v);
/* osp_model_params.progress for the CLI: a percentage on stderr while weights go to the GPU. */
void cli_load_progress(void *ctx, float fraction);
/* One stderr line with the device and, on the GPU, the memory of the weights and the KV cache. */
void cli_report_device(const osp_engine *e);

int cmd_generate(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_serve(int argc, char **argv); /* tools/server/serve.c */
int cmd_make_random_model(int argc, char **argv);
int cmd_render_template(int argc, char **argv);

#endif
