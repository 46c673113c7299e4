/* Little-endian fields of osprey's own binary formats (the offload tier's files, the KV transfer
 * protocol, prefix-hash messages), independent of the host's byte order. Header-only. */
#ifndef OSP_CORE_LE_H
#define OSP_CORE_LE_H

#include <stdint.h>

static inline void osp_put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t osp_get_le32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline void osp_put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t osp_get_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
