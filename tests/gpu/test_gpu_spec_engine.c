/* Speculative decoding through the engine (tests/unit/test_spec_engine.c) on the GPU: the n-gram,
 * draft-model and QuantSpec proposers with the target on the CUDA device (QuantSpec's 4-bit draft on it
 * too, over f32 and int8_hier pages), every verification position drawn by the
 * GPU sampler, the outputs the plain run's token for token (and logprob for logprob). Skipped (77)
 * without a CUDA device. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#include "../unit/test_spec_engine.c"
