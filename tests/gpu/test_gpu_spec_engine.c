/* Speculative decoding through the engine (tests/unit/test_spec_engine.c) on the GPU: the n-gram and
 * draft-model proposers with the target on the CUDA device, every verification position drawn by the
 * GPU sampler, the outputs the plain run's token for token (and logprob for logprob). Skipped (77)
 * without a CUDA device. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#include "../unit/test_spec_engine.c"
