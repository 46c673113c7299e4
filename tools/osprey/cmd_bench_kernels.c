/* osprey bench-kernels: the kernel proving ground (bench/kernels/: definitions, workloads, fp64
 * references, the correctness gate, then timing; kb_main.c has the flags). */
#include "bench/kernels/kb_main.h"
#include "cli.h"

int cmd_bench_kernels(int argc, char **argv) { return kb_main(argc, argv); }
