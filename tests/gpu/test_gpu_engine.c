/* The engine tests (tests/unit/test_engine.c) on the GPU: the same scenarios with the model and its KV
 * cache on the CUDA device, token agreement checked up to the reference's first small top-2 margin
 * (test_engine.c says why and how). Skipped (77) without a CUDA device. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#include "../unit/test_engine.c"
