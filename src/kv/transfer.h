/* KV block transfer between engines: prefill/decode disaggregation (vLLM's KV connector, the role of
 * NIXL there). A producer engine holds host copies of a finished prompt's full KV blocks under a
 * transfer id and serves them over TCP; a consumer engine fetches them by block hash into its own KV
 * cache and computes only the rest of the prompt. Blocks are addressed by their prefix-cache hashes
 * (src/kv/prefix_cache.h), which both sides compute from the same tokens when they share the hash
 * algorithm and seed; the engine id (a fingerprint of the model's content, the page format, the device
 * and the hash seed) must match too, or nothing is served.
 *
 * The interface is the pair below (a server, and one fetch call); TCP is its first transport, and an
 * RDMA / NIXL or CUDA IPC transport would implement the same two.
 *
 * Wire format (osprey's own; integers little-endian):
 *   request  "OSPKVQ01", u64 engine_id, u64 transfer_id, u64 block_bytes, u32 n, u32 flags, then n block
 *            hashes of 32 bytes each (lo, hi, ext[0], ext[1] as u64). flags bit 0: release the transfer
 *            after this answer (the consumer's last fetch). n = 0 with the bit: release only.
 *   response "OSPKVR01", u32 status (0 ok, 1 no such transfer, 2 another engine id or block size,
 *            3 a malformed request), u32 n, then per block: u8 found and, when found, block_bytes of
 *            payload followed by the XXH3-64 of that payload.
 * One request per connection (a consumer fetches a request's blocks in one round trip). The server
 * answers each connection on a thread of its own (16 at once); every read and write has a stall limit
 * and a deadline for the whole exchange, on both sides, so a stuck or trickling peer holds neither. */
#ifndef OSP_KV_TRANSFER_H
#define OSP_KV_TRANSFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/block_pool.h"
#include "kv/offload.h"
#include "osprey/status.h"

#define OSP_KV_XFER_HASH_BYTES 32
#define OSP_KV_XFER_MAX_BLOCKS 65536 /* blocks in one request (a 1M-token prompt of 16-token blocks) */

typedef struct osp_kv_xfer_server osp_kv_xfer_server;

typedef struct osp_kv_xfer_server_config {
    const char *ip;        /* listening address (numeric IPv4 or IPv6, or a host name); NULL: 127.0.0.1 */
    int32_t port;          /* 0: any free port (osp_kv_xfer_server_port) */
    size_t block_bytes;    /* one block's bytes (osp_kv_cache_block_bytes) */
    uint64_t engine_id;
    size_t cap_bytes;      /* held copies at most; the oldest transfers are dropped for a new one */
    double timeout_s;      /* a transfer not released this long after it was held is dropped */
    double io_timeout_s;   /* a connection's send / receive stall limit (0: 10 s) */
} osp_kv_xfer_server_config;

typedef struct osp_kv_xfer_server_stats {
    int64_t held, held_blocks;  /* now */
    int64_t sent_blocks;        /* blocks sent (found) */
    int64_t dropped;            /* transfers dropped before their release: timed out or pushed out */
    int64_t released;           /* transfers released by their consumer */
    int64_t bad_requests;       /* connections that sent a malformed or foreign request */
} osp_kv_xfer_server_stats;

/* Binds, listens and starts the serving thread. Errors: OSP_ERR_INVALID_ARG (block_bytes 0, a port
 * outside 0..65535), OSP_ERR_IO (resolve / bind / listen failed: the message names the address),
 * OSP_ERR_NOMEM. */
osp_status osp_kv_xfer_server_create(const osp_kv_xfer_server_config *cfg, osp_kv_xfer_server **out);
/* Stops the thread (an answer in progress ends first), closes the socket, frees every transfer. NULL ok. */
void osp_kv_xfer_server_destroy(osp_kv_xfer_server *s);
int32_t osp_kv_xfer_server_port(const osp_kv_xfer_server *s); /* the bound port */

/* Copies n blocks (read(ctx, i, dst) writes block i's block_bytes into dst, OSP_OK or an error) with
 * their hashes under a new transfer id, dropping the oldest transfers when the copies would not fit.
 * Returns the id (nonzero), or 0 when nothing is held: n <= 0, more than cap_bytes or
 * OSP_KV_XFER_MAX_BLOCKS, out of memory, or a read failed (*err set to its status; otherwise OSP_OK).
 * Thread-safe against the serving thread. */
uint64_t osp_kv_xfer_server_hold(osp_kv_xfer_server *s, const osp_block_hash *hashes, int32_t n,
                                 osp_status (*read)(void *ctx, int32_t i, void *dst), void *ctx, osp_status *err);

osp_kv_xfer_server_stats osp_kv_xfer_server_get_stats(osp_kv_xfer_server *s);

/* A consumer's fetch: asks host:port for transfer `transfer_id`'s blocks of hashes[0..n) (and the
 * release of the transfer afterwards when `release`). dst: [n * block_bytes]; res[i]: OSP_KV_READ_OK
 * (dst's block i written, its checksum verified), OSP_KV_READ_CORRUPT (a checksum that does not match)
 * or OSP_KV_READ_MISSING (not held there, or the answer broke off before it). The whole exchange ends
 * within 2 x timeout_s plus the payload at 50 MB/s. Returns OSP_OK when an answer was read (res says what came), else
 * OSP_ERR_IO (connect, timeout, a cut or malformed answer; every res MISSING) or OSP_ERR_INVALID_ARG
 * (the producer refused: another engine id or block size, an unknown transfer; the message says
 * which). Blocking, with timeout_s (0: 10 s) per connect / send / receive stall. n = 0 with release:
 * releases only (block_bytes may then be 0: a proxy that knows only the kv_transfer_params). Thread-safe
 * (no shared state). */
osp_status osp_kv_xfer_fetch(const char *host, int32_t port, uint64_t engine_id, uint64_t transfer_id,
                             size_t block_bytes, const osp_block_hash *hashes, int32_t n, bool release,
                             double timeout_s, uint8_t *dst, osp_kv_read_result *res);

#endif
