/* libFuzzer target for the kernel proving ground's definition parser (bench/kernels/kb_defs.c).
 *
 * Input: the text of a definition (the shape of the files in bench/kernels/defs/). It parses or is rejected with a
 * message; a parsed definition then gets hidden workloads drawn and, for one small workload, a case
 * built and its reference computed (dimensions capped here so one input stays cheap). A crash, a
 * sanitizer report or a leak is a bug. Seeds: tests/fuzz/corpus/kbench_def/ (copies of a few of the
 * committed definitions). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bench/kernels/kbench.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static kb_def d;
    char err[512];
    if (!kb_def_parse((const char *)data, size, "fuzz", &d, err, sizeof err)) {
        if (!err[0]) abort(); /* a rejection always says why */
        return 0;
    }
    kb_def_add_hidden(&d, 3, size);
    for (int w = 0; w < d.n_workloads; w++) {
        /* the workload's size, capped as it grows (a product of parsed dims may exceed int64) */
        int64_t n = 1;
        for (int k = 0; k < d.n_dims && n <= (1 << 16); k++)
            n = d.wl[w].dim[k] < 0 || d.wl[w].dim[k] > (1 << 16) ? INT64_MAX : n * d.wl[w].dim[k];
        if (n > (1 << 16)) continue; /* the reference's cost, not the parser's */
        kb_case c;
        if (kb_case_make(&d, &d.wl[w], 1, &c, err, sizeof err)) kb_case_rereference(&c);
        kb_case_free(&c);
        break;
    }
    return 0;
}
