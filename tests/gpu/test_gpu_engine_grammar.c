/* Structured output through the engine (tests/unit/test_engine_grammar.c) with SmolLM2 on the GPU: grammar
 * rows sampled on the host from their logits, with and without speculative decoding. Skipped (77) without
 * a CUDA device; its tests skip without OSPREY_MODEL. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#include "../unit/test_engine_grammar.c"
