/* Tiered KV offload (tests/unit/test_kv_offload.c) with the KV pages on the CUDA device: blocks copied
 * out to a host-memory tier and a disk tier and back, token for token against the same device without
 * offload. Skipped (77) without a CUDA device. */
#define TEST_DEVICE OSP_DEVICE_CUDA
#include "../unit/test_kv_offload.c"
