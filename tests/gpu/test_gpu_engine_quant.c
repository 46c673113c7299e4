/* The engine tests (tests/unit/test_engine.c) on the GPU with --gpu-weights quant (issue 17): the
 * SmolLM2 Q4_1 scenarios, batch invariance among them, run every matrix through qmma at every step
 * size, so a request must give the same tokens alone and in any batch. (The tiny random models are
 * 32 wide, not whole qmma units, and stay bf16 on the device.) Skipped (77) without a CUDA device. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#define TEST_GPU_QUANT 1
#include "../unit/test_engine.c"
