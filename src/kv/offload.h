/* Tiered KV offload: where prefix blocks go when the block pool evicts them, instead of vanishing.
 *
 * A store of whole KV blocks (every layer's K and V pages and scale pools of one block id, as
 * osp_kv_cache_block_read lays them out) keyed by block hash (src/kv/prefix_cache.h), in up to two
 * tiers below the pool: host memory, then local disk (vLLM's --kv-offloading-size buffer; LMCache's
 * local-disk backend). A block the pool evicts is put into the fastest tier; each tier evicts its least
 * recently used block into the next one, and the last tier drops it. A request whose prefix continues
 * past the pool's hits into blocks this store holds gets them loaded back into pool blocks
 * (src/engine/offload.c) instead of recomputing them. Equal hashes mean equal prefixes, so any stored
 * copy of a hash is valid KV for it.
 *
 * Disk tier: one file per block in <disk_dir>/osprey-kv-<fingerprint as 16 hex digits>/, named by the
 * hash's four words in hex, written to a temporary name and renamed (a reader never sees half a file).
 * The file is a 72-byte header -- magic "OSPKVBK1", format version (u32 1), reserved (u32 0), the
 * fingerprint (u64), the hash's four words lo, hi, ext[0], ext[1] (u64 each), the payload's byte count
 * (u64), the payload's XXH3-64 seeded with the fingerprint (u64), all little-endian -- then the payload.
 * A read checks every header field and the checksum; a block that fails (corrupt, truncated, another
 * fingerprint) is deleted and reported as a miss, so it is recomputed, never used. The fingerprint
 * names the model and the cache's page format (the engine computes it), so files of another model or
 * format are never read; with a hash seed shared across restarts (--prefix-caching-hash-seed), the
 * files of an earlier run with the same fingerprint are found again at creation (indexed by file age).
 *
 * One store a directory: creation takes an exclusive advisory lock (flock) on <dir>/lock, held for the
 * store's life, and a second store on the same directory (another server, the same process) is refused
 * (OSP_ERR_IO naming the directory). Stores of other fingerprints use directories of their own beside it.
 *
 * The directory's blocks belong to one hash identity (the block hashes' algorithm and seed: cfg.hash_id),
 * recorded in <dir>/identity. A store created under another one (a restart with another
 * --prefix-caching-hash-seed, or none: a random seed each start) removes the blocks it finds there at
 * creation (stats.foreign_removed): no hash of its own can ever match them, so they would only use the
 * size budget. A directory without the file (an older osprey's) counts as another identity.
 *
 * A full file system (a write failing with ENOSPC or EDQUOT) makes room by removing the tier's own
 * FULL_FREE_BLOCKS oldest blocks and retries once; if that fails too, disk writes pause (10 s, doubling
 * while it stays full, 5 min at most; stats.disk_full counts the pauses): blocks that would have gone to
 * disk are dropped (io_errors), the blocks on disk are still read.
 *
 * The directory removed under a running store (rm -rf), or replaced by a file or another directory, is
 * noticed by the next disk write (which checks the directory's identity first) or the next load that
 * finds its file missing: every disk block the index lists is then forgotten (counted as missing, never
 * as corrupt; their prefixes are recomputed), and the directory is made again; when it cannot be (a file
 * in its place, no permission), the disk tier is turned off for the store's life (stats.disk_off).
 *
 * Not thread-safe: the engine's step thread owns the store (osp_kv_offload_read excepted). */
#ifndef OSP_KV_OFFLOAD_H
#define OSP_KV_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/block_pool.h"
#include "osprey/status.h"

enum { OSP_KV_TIER_HOST = 0, OSP_KV_TIER_DISK = 1, OSP_KV_NUM_TIERS = 2 };

/* Told of every block entering (stored true) or leaving (false) a tier, including the disk blocks found
 * at creation and moves between tiers (a removal from one, then a store into the next): KV events. */
typedef void (*osp_kv_offload_listener)(void *ctx, const osp_block_hash *h, int tier, bool stored);

typedef struct osp_kv_offload_config {
    int64_t host_bytes;   /* host-memory tier capacity in bytes; 0: no host tier */
    const char *disk_dir; /* disk tier directory (created if missing); NULL or "": no disk tier */
    int64_t disk_bytes;   /* disk tier capacity in bytes (headers included); > 0 with disk_dir */
    osp_kv_offload_listener listener; /* NULL: none */
    void *listener_ctx;
    uint64_t hash_id;     /* the identity of the block hashes (their algorithm and seed; the engine hashes
                             them into one word): disk blocks recorded under another are removed at creation */
    /* tests only (NULL in production): a fault before each disk write (0, or the errno the write then fails
       with: ENOSPC simulates a full disk), and the clock of the full disk's pause (seconds; NULL: monotonic) */
    int (*test_write_fault)(void *ctx);
    double (*test_clock)(void *ctx);
    void *test_ctx;
} osp_kv_offload_config;

typedef struct osp_kv_offload_stats {
    int64_t blocks[OSP_KV_NUM_TIERS];  /* held now, per tier */
    int64_t capacity[OSP_KV_NUM_TIERS]; /* blocks each tier can hold (0: no such tier) */
    int64_t stored[OSP_KV_NUM_TIERS];  /* blocks that entered each tier (puts and demotions) */
    int64_t loaded[OSP_KV_NUM_TIERS];  /* blocks read back from each tier (checked) */
    int64_t dropped;                   /* blocks that fell off the last tier */
    int64_t corrupt;                   /* disk blocks that failed their check and were deleted */
    int64_t missing;                   /* disk blocks whose file was gone (a load found it missing, or the
                                          directory was removed): forgotten, recomputed when asked for */
    int64_t dir_lost;                  /* times the directory was found removed or replaced */
    bool disk_off;                     /* it could not be made again: the disk tier is off (capacity 0) */
    int64_t io_errors;                 /* disk writes that failed, or were skipped while a full disk paused
                                          writing (the block was dropped) */
    int64_t disk_full;                 /* times a write found the disk full (ENOSPC, EDQUOT) even after
                                          removing room: each paused disk writes (full_pause_s) */
    int64_t full_freed;                /* the tier's oldest blocks removed to make room on a full disk */
    int64_t full_skipped;              /* blocks not written while paused (of io_errors) */
    double full_pause_s;               /* the last pause's length in seconds (0: none yet) */
    int64_t foreign_removed, foreign_bytes; /* blocks of another hash identity (seed, algorithm) removed at
                                          creation, and their files' bytes */
    bool foreign_unknown;              /* their identity was unknown (no identity file: an older osprey's) */
    int64_t trimmed, trimmed_bytes;    /* blocks of an earlier run removed at creation (oldest first) to fit a
                                          smaller disk_bytes, and their files' bytes */
    bool unlocked;                     /* the file system has no flock: the directory is not locked */
    int64_t found_at_start;            /* disk blocks of an earlier run indexed at creation */
    int64_t other_dirs, other_bytes;   /* other fingerprints' directories beside this store's in disk_dir
                                          (other models or page formats), and their files' bytes: never
                                          read, not counted in disk_bytes (found at creation) */
} osp_kv_offload_stats;

typedef struct osp_kv_offload osp_kv_offload;

/* Creates a store for blocks of block_bytes bytes (> 0) under `fingerprint`. At least one tier must be
 * configured. The host tier's memory is reserved up front (untouched pages cost nothing until used); the
 * disk tier's directory is created, locked and indexed (files of this fingerprint and hash identity;
 * those of another hash identity, over-capacity ones, oldest first, and leftover temporary files are
 * deleted and counted). Errors: OSP_ERR_INVALID_ARG (no tier, sizes smaller than one block,
 * disk_bytes <= 0 with a directory), OSP_ERR_IO (the directory cannot be created, read or locked, or
 * another store holds it; the message names it), OSP_ERR_NOMEM. */
osp_status osp_kv_offload_create(const osp_kv_offload_config *cfg, size_t block_bytes, uint64_t fingerprint,
                                 osp_kv_offload **out);
void osp_kv_offload_destroy(osp_kv_offload *o); /* NULL is fine; disk files stay */

size_t osp_kv_offload_block_bytes(const osp_kv_offload *o);

/* Stores block_bytes bytes under h. A hash already held is only marked recently used (its copy is
 * equally valid; bytes may then be NULL). A disk write that fails is counted (io_errors) and the block dropped: the store is a
 * cache, so nothing is reported to the caller. */
void osp_kv_offload_put(osp_kv_offload *o, const osp_block_hash *h, const void *bytes);
/* The host slots the next n puts of blocks not held will fill, in put order, into slots[0..k); returns k,
 * which is n, or the host tier's capacity when n exceeds it, or 0 without a host tier (or n <= 0). Makes
 * room first (the host tier's least recently used blocks move to disk or are dropped until k slots are
 * free). A caller may write the blocks' bytes there and then put each with bytes = its slot (no copy): a
 * GPU engine reads evicted blocks straight from the device into them, in one transfer. Valid until the
 * next call that stores, moves or drops a block other than those k puts (a put of a hash already held takes
 * no slot). */
int32_t osp_kv_offload_host_slots_next(osp_kv_offload *o, int32_t n, void **slots);

/* The tier holding h (OSP_KV_TIER_HOST or OSP_KV_TIER_DISK), or -1. Index only: no I/O. */
int osp_kv_offload_where(const osp_kv_offload *o, const osp_block_hash *h);

/* Reads h's block_bytes bytes into dst and marks it recently used: true, or false on a miss or a disk
 * block that failed its check (then deleted and counted). dst may be written on failure. */
bool osp_kv_offload_get(osp_kv_offload *o, const osp_block_hash *h, void *dst);

/* A host-tier block's bytes in place (no copy), or NULL when h is not in the host tier; marks it recently
 * used and counts a load. The pointer is valid until the next call that stores, moves or drops a block. */
const void *osp_kv_offload_host_block(osp_kv_offload *o, const osp_block_hash *h);
/* The host tier's slots, one reservation (*p NULL and *bytes 0 without a host tier): what a GPU engine
 * page-locks so its loads and stores are DMA. */
void osp_kv_offload_host_arena(const osp_kv_offload *o, void **p, size_t *bytes);

/* Reading a disk block away from the step thread (a loader thread): osp_kv_offload_read touches only
 * what never changes after creation (the directory, the fingerprint, the block size), so it may run
 * while the owner thread uses the store; the owner then reports the outcome with osp_kv_offload_settle,
 * which does the index's bookkeeping (recency and counts on success; a corrupt block deleted and
 * counted; a file found missing forgotten and counted as missing, and when the directory itself is gone,
 * every disk block with it). A file that cannot be opened because the directory is gone or is now a file
 * (ENOENT, ENOTDIR) is MISSING; one that opens but fails a check is CORRUPT. */
typedef enum osp_kv_read_result { OSP_KV_READ_OK = 0, OSP_KV_READ_MISSING = 1, OSP_KV_READ_CORRUPT = 2 } osp_kv_read_result;
osp_kv_read_result osp_kv_offload_read(const osp_kv_offload *o, const osp_block_hash *h, void *dst);
void osp_kv_offload_settle(osp_kv_offload *o, const osp_block_hash *h, osp_kv_read_result r);

/* A host-tier block's bytes copied to dst (true), or false when h is not in the host tier. Marks it
 * recently used and counts a load. */
bool osp_kv_offload_get_host(osp_kv_offload *o, const osp_block_hash *h, void *dst);

osp_kv_offload_stats osp_kv_offload_get_stats(const osp_kv_offload *o);

/* The disk tier's directory (<disk_dir>/osprey-kv-<fingerprint>), or NULL without a disk tier. */
const char *osp_kv_offload_disk_path(const osp_kv_offload *o);
/* Why the disk tier was turned off (stats.disk_off: its directory could not be made again or locked), or NULL. */
const char *osp_kv_offload_disk_error(const osp_kv_offload *o);
/* Why disk writes paused last (stats.disk_full: strerror of the write, e.g. "No space left on device"),
 * or NULL when they never did. */
const char *osp_kv_offload_full_error(const osp_kv_offload *o);

#endif
