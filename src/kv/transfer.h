/* KV block transfer between engines: prefill/decode disaggregation (vLLM's KV connector, the role of
 * NIXL there). A producer engine holds host copies of a finished prompt's full KV blocks under a
 * transfer id and serves them over TCP; a consumer engine fetches them by block hash into its own KV
 * cache and computes only the rest of the prompt. Blocks are addressed by their prefix-cache hashes
 * (src/kv/prefix_cache.h), which both sides compute from the same tokens when they share the hash
 * algorithm and seed; the engine id (a fingerprint of the model's content, the page format, the device
 * and the hash seed) must match too, or nothing is served.
 *
 * The interface is the pair below (a server, and one fetch call); TCP is its first transport, CUDA IPC
 * its second (two processes on one GPU: no host copy at all), and an RDMA / NIXL transport would
 * implement the same two.
 *
 * Wire format (osprey's own; integers little-endian):
 *   request  "OSPKVQ01", u64 engine_id, u64 transfer_id, u64 block_bytes, u32 n, u32 flags, then n block
 *            hashes of 32 bytes each (lo, hi, ext[0], ext[1] as u64). flags bit 0: release the transfer
 *            after this answer (the consumer's last fetch). n = 0 with the bit: release only. flags bit 1
 *            (CUDA IPC offered): then 16 bytes of the consumer's device UUID and its u64 process nonce
 *            (osp_kv_xfer_process_nonce). Other bits: malformed.
 *   response "OSPKVR01", u32 status (0 ok, 1 no such transfer, 2 another engine id or block size,
 *            3 a malformed request), u32 n, then per block: u8 found and, when found, block_bytes of
 *            payload followed by the XXH3-64 of that payload.
 *   or, only to a request with bit 1, from the same device (UUID) in another process (nonce), for a
 *   transfer held in the producer's device arena:
 *            "OSPKVD01", u32 status 0, u32 n, u64 arena id, u64 arena bytes, 64 bytes of the arena's IPC
 *            handle, then per block a u64 byte offset into the arena (all ones: not held). The consumer
 *            maps the arena (once per producer and arena id), copies the blocks device to device into
 *            its pages, and answers one byte (1: done with the slots, copied or given up; 0: not copied,
 *            asking again over TCP, so a release bit is not acted on): only then may the producer reuse the
 *            blocks' slots (a consumer that closes the connection instead counts as done: it has
 *            synchronized its copies, or its process is gone).
 *   A producer without an arena, on another device, or holding the transfer in host memory answers a
 *   bit-1 request as above with "OSPKVR01" and the payloads. A producer older than bit 1 answers it
 *   status 3; the consumer then asks again without it (and does not offer IPC to that producer again).
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

#define OSP_KV_XFER_UUID_BYTES 16   /* a device's UUID (kv_cache.h OSP_KV_UUID_BYTES) */
#define OSP_KV_XFER_HANDLE_BYTES 64 /* an arena's IPC handle (kv_cache.h OSP_KV_IPC_HANDLE_BYTES) */

typedef struct osp_kv_xfer_server osp_kv_xfer_server;

/* A producer's device arena for the CUDA IPC transport: memory another process on the device can map
 * (osp_kv_cache_arena_create), cut into bytes / block_bytes slots that hold transfers' blocks. */
typedef struct osp_kv_xfer_device {
    void *base;      /* device address of the arena (owned by the caller: freed after the server) */
    size_t bytes;    /* its size */
    uint8_t handle[OSP_KV_XFER_HANDLE_BYTES]; /* its IPC handle */
    uint8_t uuid[OSP_KV_XFER_UUID_BYTES];     /* the device's UUID */
    /* copies `bytes` of the arena at src (device) to host dst, apart from the engine's runs (any thread):
       the TCP answer of a transfer held there, for a consumer on another device or host */
    osp_status (*to_host)(void *ctx, void *dst, const void *src, size_t bytes);
    void *ctx;
} osp_kv_xfer_device;

typedef struct osp_kv_xfer_server_config {
    const char *ip;        /* listening address (numeric IPv4 or IPv6, or a host name); NULL: 127.0.0.1 */
    int32_t port;          /* 0: any free port (osp_kv_xfer_server_port) */
    size_t block_bytes;    /* one block's bytes (osp_kv_cache_block_bytes) */
    uint64_t engine_id;
    size_t cap_bytes;      /* held copies at most; the oldest transfers are dropped for a new one */
    double timeout_s;      /* a transfer not released this long after it was held is dropped */
    double io_timeout_s;   /* a connection's send / receive stall limit (0: 10 s) */
    const osp_kv_xfer_device *device; /* copied; NULL: no CUDA IPC (osp_kv_xfer_server_hold_device holds nothing) */
} osp_kv_xfer_server_config;

typedef struct osp_kv_xfer_server_stats {
    int64_t held, held_blocks;  /* now */
    int64_t sent_blocks;        /* blocks sent (found) */
    int64_t dropped;            /* transfers dropped before their release: timed out or pushed out */
    int64_t released;           /* transfers released by their consumer */
    int64_t bad_requests;       /* connections that sent a malformed or foreign request */
    int64_t held_device_blocks; /* now: of held_blocks, those in the device arena */
    int64_t ipc_blocks;         /* of sent_blocks, those answered by an arena offset (CUDA IPC) */
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

/* As osp_kv_xfer_server_hold, into free slots of the device arena (the oldest transfers held there are
 * dropped to make room): copy(ctx, n, dsts) writes block i's block_bytes at device address dsts[i] and
 * returns when they are there. The slots stay taken until the transfer is released, dropped or timed out
 * and no consumer is still copying from them (its done byte). Returns the id, or 0 when nothing is held:
 * no arena, n <= 0 or more blocks than the arena has slots or than are free after every droppable
 * transfer went, or copy failed (*err its status; otherwise OSP_OK): the caller may hold in host memory
 * instead. Thread-safe against the serving thread. */
uint64_t osp_kv_xfer_server_hold_device(osp_kv_xfer_server *s, const osp_block_hash *hashes, int32_t n,
                                        osp_status (*copy)(void *ctx, int32_t n, void *const *dsts), void *ctx,
                                        osp_status *err);

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

/* ---- the consumer's side of CUDA IPC ------------------------------------------------------------ */

/* A random number drawn once per process (again in a forked child; never 0): a producer answers by arena
 * offset only to another process, since an arena cannot be mapped in the process that made it. */
uint64_t osp_kv_xfer_process_nonce(void);

/* A consumer's producers: their mapped arenas (one mapping per producer address and arena id, kept until
 * that producer fails a fetch, shows another arena, or the table goes) and those that refused the IPC
 * offer. Used by one thread at a time (the consumer's loader). */
typedef struct osp_kv_xfer_peers osp_kv_xfer_peers;

typedef struct osp_kv_xfer_ipc {
    uint8_t uuid[OSP_KV_XFER_UUID_BYTES]; /* this consumer's device */
    /* maps a producer's arena by its handle (osp_kv_cache_ipc_open), unmaps it */
    osp_status (*open)(void *ctx, const uint8_t handle[OSP_KV_XFER_HANDLE_BYTES], void **base);
    void (*close)(void *ctx, void *base);
    void *ctx;
} osp_kv_xfer_ipc;

/* Errors: OSP_ERR_NOMEM. */
osp_status osp_kv_xfer_peers_create(const osp_kv_xfer_ipc *ipc, osp_kv_xfer_peers **out);
void osp_kv_xfer_peers_destroy(osp_kv_xfer_peers *p); /* unmaps every arena; NULL ok */
int32_t osp_kv_xfer_peers_mapped(const osp_kv_xfer_peers *p); /* arenas mapped now (tests) */

/* osp_kv_xfer_fetch offering CUDA IPC (flags bit 1) unless `peers` knows the producer refuses it. When
 * the producer answers by arena offsets, write(wctx, n, srcs) is called once with srcs[i] the device
 * address of block i in the mapped arena (NULL: not held there) and must write the blocks into the
 * consumer's pages and return when they are there (or return an error having started no copy, e.g. its
 * request went away: every res MISSING); res[i] is then OSP_KV_READ_OK for the written ones and dst is
 * not touched. Otherwise (another device, a transfer in host memory, a producer without IPC) the answer
 * is osp_kv_xfer_fetch's: dst [n * block_bytes] receives the payloads. An arena that does not map
 * (another IPC namespace, or the producer's own process) makes the consumer ask again over TCP and not
 * offer IPC to that producer again. *via_ipc (may be NULL): the blocks came by arena offsets. Returns as
 * osp_kv_xfer_fetch; a failed write returns its status (every res MISSING). A producer that dies before
 * the consumer's done byte fails the fetch (OSP_ERR_IO, every res MISSING) and its mapping is dropped. */
osp_status osp_kv_xfer_fetch_ipc(osp_kv_xfer_peers *peers, const char *host, int32_t port, uint64_t engine_id,
                                 uint64_t transfer_id, size_t block_bytes, const osp_block_hash *hashes, int32_t n,
                                 bool release, double timeout_s,
                                 osp_status (*write)(void *wctx, int32_t n, const void *const *srcs), void *wctx,
                                 uint8_t *dst, osp_kv_read_result *res, bool *via_ipc);

#endif
