/* The engine's sampling tests (tests/unit/test_engine_sampling.c) on the GPU: seeded invariance, n > 1
 * children forked on the device's KV cache, logprobs and prompt logprobs against a GPU forward pass,
 * penalties, NaN rows failing alone, bad parameters. Skipped (77) without a CUDA device. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#include "../unit/test_engine_sampling.c"
