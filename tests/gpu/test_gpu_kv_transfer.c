/* KV transfer between two engines (tests/unit/test_kv_transfer.c) with the KV pages on the CUDA device:
 * the producer's blocks copied to the host to be held, the consumer's written back to its device
 * pages, token for token against a co-located engine on the same device. Skipped (77) without a CUDA
 * device. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#include "../unit/test_kv_transfer.c"
