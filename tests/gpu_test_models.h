/* The engine tests' models for their GPU runs (tests/gpu/test_gpu_engine*.c compile the unit tests
 * again on the GPU): the CUDA attention takes head_dim >= 32, so instead of tests/models/tiny-llama-*
 * (head_dim 16) they use the preset tiny-d32 (2 layers, head_dim 32) with the same vocabulary size of
 * 512, written at test start by `osprey make-random-model` (OSPREY_BIN). Header-only. */
#ifndef OSPREY_TESTS_GPU_TEST_MODELS_H
#define OSPREY_TESTS_GPU_TEST_MODELS_H

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Writes /tmp/osprey-<tag>-<pid>.gguf (tiny-d32, vocabulary 512, weights of `dtype` drawn with `seed`)
 * into path [cap]. Returns 0, or -1 (with a message on stderr) when OSPREY_BIN is unset or the tool
 * fails. */
static __attribute__((unused)) int gpu_test_model_seeded(const char *tag, const char *dtype, int seed, char *path,
                                                         size_t cap) {
    const char *bin = getenv("OSPREY_BIN");
    if (!bin) {
        fprintf(stderr, "OSPREY_BIN is not set (it writes the GPU test models)\n");
        return -1;
    }
    snprintf(path, cap, "/tmp/osprey-%s-%d.gguf", tag, (int)getpid());
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s make-random-model --preset tiny-d32 --vocab-size 512 --dtype %s --seed %d -o %s 2>/dev/null",
             bin, dtype, seed, path);
    if (system(cmd) != 0) {
        fprintf(stderr, "cannot write a test model: %s\n", cmd);
        return -1;
    }
    return 0;
}

/* The same with seed 3: the engine tests' models (their q4_1 and q8_0 files are the f32 one's twins). */
static __attribute__((unused)) int gpu_test_model(const char *tag, const char *dtype, char *path, size_t cap) {
    return gpu_test_model_seeded(tag, dtype, 3, path, cap);
}

#endif
