/* The engine's flags, parsed once for every subcommand that loads a model into the engine.
 *
 * osprey generate, chat and serve each took -m/--model, -t/--threads and --device (generate also
 * --kv-cache-dtype and --exact) with copied code; here they are parsed in one place so each flag has
 * one meaning, one default and one error message everywhere. A command runs its own flag loop and
 * hands each argument to cli_engine_arg first; what it does not take (a flag outside `accept`) stays
 * the command's to reject, with its own "unknown option" message. */
#include <string.h>

#include "cli.h"

cli_engine_args cli_engine_args_default(void) {
    cli_engine_args a = {.kv_dtype = OSP_KV_DTYPE_F16};
    a.device = cli_device("--device", "auto");
    return a;
}

bool cli_engine_arg(cli_engine_args *a, unsigned accept, int argc, char **argv, int *i) {
    const char *f = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(f, "-m") || !strcmp(f, "--model")) a->model = v, ++*i;
    else if (!strcmp(f, "-t") || !strcmp(f, "--threads")) a->n_threads = (int)cli_int(f, v, 1, 1024), ++*i;
    else if (!strcmp(f, "--device")) a->device = cli_device(f, v), ++*i;
    else if (!strcmp(f, "--kernel-table")) {
        if (!v) cli_die(OSP_OK, "--kernel-table needs a file (osprey bench-kernels --make-table writes one)");
        a->kernel_table = v, ++*i;
    }
    else if ((accept & CLI_ENGINE_EXACT) && !strcmp(f, "--exact")) a->exact = true, a->kv_dtype = OSP_KV_DTYPE_F32;
    else if ((accept & CLI_ENGINE_KV_DTYPE) && !strcmp(f, "--kv-cache-dtype")) {
        if (osp_kv_dtype_parse(v, &a->kv_dtype) != OSP_OK) cli_die(OSP_OK, "--kv-cache-dtype: '%s' is not f16 or f32", v ? v : "");
        ++*i;
    } else return false;
    return true;
}

osp_engine_params cli_engine_params(const cli_engine_args *a) {
    osp_engine_params ep = osp_engine_default_params();
    ep.model_path = a->model;
    ep.n_threads = a->n_threads;
    ep.kv_dtype = a->kv_dtype;
    ep.exact = a->exact;
    ep.device = a->device;
    ep.kernel_table = a->kernel_table;
    ep.load_progress = cli_load_progress;
    return ep;
}
