/* The entry point of `osprey bench-kernels` (bench/kernels/kb_main.c), for the CLI: the proving
 * ground's internals stay in bench/kernels/. argv[0] is "bench-kernels"; returns the exit status. */
#ifndef OSP_BENCH_KERNELS_KB_MAIN_H
#define OSP_BENCH_KERNELS_KB_MAIN_H

int kb_main(int argc, char **argv);

#endif
