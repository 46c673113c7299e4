/* Tiered KV offload (see offload.h): an index from block hash to entry (kv/hash_index.h, as the block
 * pool's), one LRU list per tier over the entries,
 * host slots in one reservation, disk blocks as checksummed files. */
#include "kv/offload.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/le.h"
#include "core/status_internal.h"
#include "kv/hash_index.h"

#define HDR_BYTES 72
#define FORMAT_VERSION 1u
#define FULL_FREE_BLOCKS 4      /* a full disk: the tier's oldest blocks removed (the write plus a margin) */
#define FULL_PAUSE_FIRST_S 10.0 /* then, still full: disk writes pause this long, */
#define FULL_PAUSE_MAX_S 300.0  /* doubling while it stays full, up to this */
#define IDENTITY_FILE "identity"
#define LOCK_FILE "lock"
static const char MAGIC[8] = {'O', 'S', 'P', 'K', 'V', 'B', 'K', '1'};

typedef struct entry {
    osp_block_hash h;
    int32_t tier;       /* OSP_KV_TIER_HOST / _DISK, -1 while on the free list */
    int32_t prev, next; /* the tier's LRU list (head: least recently used), or the free list (next) */
    int32_t slot;       /* host tier: slot index */
} entry;

typedef struct lru {
    int32_t head, tail;
    int64_t n, cap;
} lru;

struct osp_kv_offload {
    size_t block_bytes;
    uint64_t fp;
    entry *e;
    int32_t cap_e, free_e; /* free_e: first free entry, -1 when none */
    osp_hash_index index;  /* hash -> entry (the hash in e[id].h) */
    int64_t n_table;
    lru tier[OSP_KV_NUM_TIERS];
    uint8_t *host;         /* [tier[HOST].cap * block_bytes] */
    int32_t *free_slots, n_free_slots;
    char *dir;             /* disk tier directory, or NULL */
    dev_t dir_dev;         /* its identity when the index was last true to it (made, found, or made again) */
    ino_t dir_ino;
    char disk_error[640];  /* why the disk tier was turned off, or empty */
    int lock_fd;           /* the directory's lock file, flock'ed (-1: none) */
    uint64_t hash_id;      /* the block hashes' identity (cfg.hash_id), recorded in the directory */
    double full_until;     /* disk writes paused until then (a full disk; clock_s), 0: not paused */
    double full_pause;     /* the current pause's length (doubles while the disk stays full; 0 after a write) */
    char full_error[128];  /* strerror of the write that paused them last, or empty */
    int (*write_fault)(void *ctx); /* tests: cfg.test_* */
    double (*clock)(void *ctx);
    void *test_ctx;
    uint64_t n_writes;     /* temporary file names */
    osp_kv_offload_listener listener;
    void *listener_ctx;
    osp_kv_offload_stats stats;
};

static void tell(const osp_kv_offload *o, const osp_block_hash *h, int tier, bool stored) {
    if (o->listener) o->listener(o->listener_ctx, h, tier, stored);
}

/* ---- index ------------------------------------------------------------------------------------ */

/* The index over the entries (kv/hash_index.h): its base follows the entry array when that grows. */
static int64_t find(const osp_kv_offload *o, const osp_block_hash *h) { return osp_hash_index_find(&o->index, h); }

static void table_put(osp_kv_offload *o, int32_t id) {
    osp_hash_index_put(&o->index, id);
    o->n_table++;
}

static void table_delete_at(osp_kv_offload *o, uint32_t i) {
    osp_hash_index_delete_at(&o->index, i);
    o->n_table--;
}

/* A free entry (growing the entry array and the table as needed), or -1 when out of memory. */
static int32_t entry_new(osp_kv_offload *o) {
    if (o->free_e < 0) {
        if (o->cap_e > INT32_MAX / 2) return -1;
        const int32_t cap = o->cap_e ? 2 * o->cap_e : 256;
        entry *e = realloc(o->e, sizeof *e * (size_t)cap);
        if (!e) return -1;
        o->e = e;
        o->index.base = (const char *)e + offsetof(entry, h);
        for (int32_t i = cap - 1; i >= o->cap_e; i--) e[i] = (entry){.tier = -1, .next = o->free_e};
        o->free_e = o->cap_e;
        for (int32_t i = o->cap_e; i < cap - 1; i++) e[i].next = i + 1;
        e[cap - 1].next = -1;
        o->cap_e = cap;
    }
    if ((uint64_t)(o->n_table + 1) * 2 > (uint64_t)o->index.mask + 1) { /* keep the load under one half */
        const uint32_t cap = 2 * (o->index.mask + 1);
        int32_t *t = malloc(sizeof *t * cap);
        if (!t) return -1;
        int32_t *old = o->index.slot;
        const uint32_t old_cap = o->index.mask + 1;
        memset(t, 0xff, sizeof *t * cap);
        o->index.slot = t;
        o->index.mask = cap - 1;
        for (uint32_t i = 0; i < old_cap; i++)
            if (old[i] >= 0) osp_hash_index_put(&o->index, old[i]);
        free(old);
    }
    const int32_t id = o->free_e;
    o->free_e = o->e[id].next;
    return id;
}

/* ---- LRU lists -------------------------------------------------------------------------------- */

static void lru_push_tail(osp_kv_offload *o, int t, int32_t id) {
    lru *l = &o->tier[t];
    entry *x = &o->e[id];
    x->tier = t;
    x->prev = l->tail;
    x->next = -1;
    if (l->tail >= 0) o->e[l->tail].next = id;
    else l->head = id;
    l->tail = id;
    l->n++;
    o->stats.blocks[t] = l->n;
}

static void lru_remove(osp_kv_offload *o, int32_t id) {
    entry *x = &o->e[id];
    lru *l = &o->tier[x->tier];
    if (x->prev >= 0) o->e[x->prev].next = x->next;
    else l->head = x->next;
    if (x->next >= 0) o->e[x->next].prev = x->prev;
    else l->tail = x->prev;
    l->n--;
    o->stats.blocks[x->tier] = l->n;
}

/* Forgets entry id (index and list; the host slot goes back; a disk file is not touched here). */
static void entry_drop(osp_kv_offload *o, int32_t id) {
    const int64_t i = find(o, &o->e[id].h);
    if (i >= 0) table_delete_at(o, (uint32_t)i);
    if (o->e[id].tier == OSP_KV_TIER_HOST) o->free_slots[o->n_free_slots++] = o->e[id].slot;
    lru_remove(o, id);
    o->e[id].tier = -1;
    o->e[id].next = o->free_e;
    o->free_e = id;
}

/* ---- disk files ------------------------------------------------------------------------------- */

static void file_path(const osp_kv_offload *o, const osp_block_hash *h, const char *suffix, char *out, size_t n) {
    snprintf(out, n, "%s/%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%s", o->dir, h->lo, h->hi, h->ext[0],
             h->ext[1], suffix);
}

/* false with errno set (a write of 0 bytes: ENOSPC, as the file system would say next) */
static bool write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n > 0) {
        const ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w == 0) errno = ENOSPC;
        if (w <= 0) return false;
        b += w, n -= (size_t)w;
    }
    return true;
}

static size_t read_all(int fd, void *p, size_t n) {
    uint8_t *b = p;
    size_t got = 0;
    while (got < n) {
        const ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    return got;
}

static void header_make(const osp_kv_offload *o, const osp_block_hash *h, const void *payload, uint8_t *hdr) {
    memcpy(hdr, MAGIC, 8);
    osp_put_le32(hdr + 8, FORMAT_VERSION);
    osp_put_le32(hdr + 12, 0);
    osp_put_le64(hdr + 16, o->fp);
    osp_put_le64(hdr + 24, h->lo);
    osp_put_le64(hdr + 32, h->hi);
    osp_put_le64(hdr + 40, h->ext[0]);
    osp_put_le64(hdr + 48, h->ext[1]);
    osp_put_le64(hdr + 56, (uint64_t)o->block_bytes);
    osp_put_le64(hdr + 64, XXH3_64bits_withSeed(payload, o->block_bytes, o->fp));
}

/* Whether hdr belongs to this store and names h (the checksum is not looked at). */
static bool header_ok(const osp_kv_offload *o, const osp_block_hash *h, const uint8_t *hdr) {
    return memcmp(hdr, MAGIC, 8) == 0 && osp_get_le32(hdr + 8) == FORMAT_VERSION && osp_get_le64(hdr + 16) == o->fp &&
           osp_get_le64(hdr + 24) == h->lo && osp_get_le64(hdr + 32) == h->hi && osp_get_le64(hdr + 40) == h->ext[0] &&
           osp_get_le64(hdr + 48) == h->ext[1] && osp_get_le64(hdr + 56) == (uint64_t)o->block_bytes;
}

static osp_status mkdir_p(const char *path);
static osp_status dir_lock(osp_kv_offload *o);
static osp_status dir_identity(osp_kv_offload *o);
static void entry_forget_disk_all(osp_kv_offload *o);

/* Whether the disk tier's directory is still the one the index describes (the same device and inode):
 * false when it was removed (rm -rf), or replaced by a file or by another directory. */
static bool dir_same(const osp_kv_offload *o) {
    struct stat sb;
    return stat(o->dir, &sb) == 0 && S_ISDIR(sb.st_mode) && sb.st_dev == o->dir_dev && sb.st_ino == o->dir_ino;
}

/* The directory was removed or replaced under the store, so every file the index lists is gone: forgets
 * them all (counted as missing; their prefixes are recomputed when asked for), then makes the directory
 * again (true). When it cannot be made (a file in its place, no permission) the disk tier is off for the
 * rest of the store's life (false): capacity 0, stats.disk_off, osp_kv_offload_disk_error says why. The
 * owner reports either with one log line (stats.dir_lost counts these; src/engine/offload.c). */
static bool disk_dir_lost(osp_kv_offload *o) {
    o->stats.dir_lost++;
    entry_forget_disk_all(o);
    struct stat sb;
    if (o->lock_fd >= 0) close(o->lock_fd); /* the lock file went with the directory */
    o->lock_fd = -1;
    /* made again, locked again (another store may have taken the new directory meanwhile), identity recorded */
    if (mkdir_p(o->dir) == OSP_OK && stat(o->dir, &sb) == 0 && dir_lock(o) == OSP_OK && dir_identity(o) == OSP_OK) {
        o->dir_dev = sb.st_dev, o->dir_ino = sb.st_ino; /* mkdir_p checked it is a directory */
        return true;
    }
    snprintf(o->disk_error, sizeof o->disk_error, "%s", osp_last_error()); /* which path, why */
    o->tier[OSP_KV_TIER_DISK].cap = 0;
    o->stats.capacity[OSP_KV_TIER_DISK] = 0;
    o->stats.disk_off = true;
    return false;
}

/* Writes h's file: 0, or the errno of what failed (EIO when the directory is gone for good). */
static int disk_write(osp_kv_offload *o, const osp_block_hash *h, const void *bytes) {
    /* the directory gone (or another one in its place): the index's disk blocks are phantoms */
    if (!dir_same(o) && !disk_dir_lost(o)) return EIO;
    const int fault = o->write_fault ? o->write_fault(o->test_ctx) : 0;
    if (fault != 0) return fault;
    char tmp[PATH_MAX], path[PATH_MAX], suffix[64];
    /* a name of this process's own: replicas sharing the directory never write one file together */
    snprintf(suffix, sizeof suffix, ".kv.%ld-%llu.tmp", (long)getpid(), (unsigned long long)++o->n_writes);
    file_path(o, h, suffix, tmp, sizeof tmp);
    file_path(o, h, ".kv", path, sizeof path);
    uint8_t hdr[HDR_BYTES];
    header_make(o, h, bytes, hdr);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errno ? errno : EIO;
    int err = 0;
    if (!write_all(fd, hdr, sizeof hdr) || !write_all(fd, bytes, o->block_bytes)) err = errno ? errno : EIO;
    if (close(fd) != 0 && err == 0) err = errno ? errno : EIO; /* NFS reports a full disk at close */
    if (err == 0 && rename(tmp, path) != 0) err = errno ? errno : EIO;
    if (err != 0) unlink(tmp);
    return err;
}

static void disk_unlink(const osp_kv_offload *o, const osp_block_hash *h) {
    char path[PATH_MAX];
    file_path(o, h, ".kv", path, sizeof path);
    unlink(path);
}

osp_kv_read_result osp_kv_offload_read(const osp_kv_offload *o, const osp_block_hash *h, void *dst) {
    if (!o->dir) return OSP_KV_READ_MISSING;
    char path[PATH_MAX];
    file_path(o, h, ".kv", path, sizeof path);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    /* ENOTDIR: a file where the directory was; both mean the block is gone, not damaged */
    if (fd < 0) return errno == ENOENT || errno == ENOTDIR ? OSP_KV_READ_MISSING : OSP_KV_READ_CORRUPT;
    uint8_t hdr[HDR_BYTES], extra;
    const bool ok = read_all(fd, hdr, sizeof hdr) == sizeof hdr && header_ok(o, h, hdr) &&
                    read_all(fd, dst, o->block_bytes) == o->block_bytes && read_all(fd, &extra, 1) == 0;
    close(fd);
    return ok && XXH3_64bits_withSeed(dst, o->block_bytes, o->fp) == osp_get_le64(hdr + 64) ? OSP_KV_READ_OK
                                                                                       : OSP_KV_READ_CORRUPT;
}

/* ---- tiers ------------------------------------------------------------------------------------ */

/* Makes room in tier t for one more block by moving its least recently used block down (or dropping it
 * from the last tier). */
static void make_room(osp_kv_offload *o, int t);

static double clock_s(const osp_kv_offload *o) {
    if (o->clock) return o->clock(o->test_ctx);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Writes h's file to disk (true), unless writes are paused. A full file system (ENOSPC, EDQUOT) first
 * costs the tier its FULL_FREE_BLOCKS oldest blocks (room for this one and a few more: a disk shared with
 * other files shrinks the tier to what fits) and one retry; failing again, writes pause for full_pause
 * seconds (doubling while it stays full), so the saves in between cost no I/O. The blocks already on
 * disk are still read meanwhile. */
static bool disk_paused(osp_kv_offload *o) {
    if (o->full_until > 0 && clock_s(o) < o->full_until) return true;
    o->full_until = 0;
    return false;
}

static bool disk_store(osp_kv_offload *o, const osp_block_hash *h, const void *bytes) {
    int err = disk_write(o, h, bytes);
    if (err != ENOSPC && err != EDQUOT) {
        if (err == 0) o->full_pause = 0; /* room again: the next full disk pauses for the first length */
        return err == 0;
    }
    int freed = 0;
    for (; freed < FULL_FREE_BLOCKS && o->tier[OSP_KV_TIER_DISK].head >= 0; freed++) make_room(o, OSP_KV_TIER_DISK);
    o->stats.full_freed += freed;
    if (freed > 0 && (err = disk_write(o, h, bytes)) == 0) {
        o->full_pause = 0;
        return true;
    }
    if (err != ENOSPC && err != EDQUOT) return false; /* another failure on the retry: a plain write error */
    o->full_pause = o->full_pause > 0 ? 2 * o->full_pause : FULL_PAUSE_FIRST_S;
    if (o->full_pause > FULL_PAUSE_MAX_S) o->full_pause = FULL_PAUSE_MAX_S;
    o->full_until = clock_s(o) + o->full_pause;
    o->stats.disk_full++;
    o->stats.full_pause_s = o->full_pause;
    snprintf(o->full_error, sizeof o->full_error, "%s", strerror(err));
    return false;
}

/* Puts (h, bytes) into tier t as its most recently used block, entry id given or -1 for a new one;
 * false (entry dropped) when the block could not be stored. */
static bool tier_insert(osp_kv_offload *o, int t, int32_t id, const osp_block_hash *h, const void *bytes) {
    if (o->tier[t].cap == 0) return false;
    const bool paused = t == OSP_KV_TIER_DISK && disk_paused(o); /* a full disk: nothing written, nothing evicted */
    if (paused) o->stats.full_skipped++;
    if (!paused && o->tier[t].n >= o->tier[t].cap) make_room(o, t);
    if (id < 0) {
        id = entry_new(o);
        if (id < 0) return false;
        o->e[id].h = *h;
        table_put(o, id);
    }
    if (t == OSP_KV_TIER_HOST) {
        const int32_t slot = o->free_slots[--o->n_free_slots];
        uint8_t *dst = o->host + (size_t)slot * o->block_bytes;
        if (bytes != dst) memcpy(dst, bytes, o->block_bytes); /* written in place: osp_kv_offload_host_slots_next */
        o->e[id].slot = slot;
    } else if (paused || !disk_store(o, h, bytes)) {
        o->stats.io_errors++;
        const int64_t i = find(o, h);
        if (i >= 0 && o->index.slot[i] == id) table_delete_at(o, (uint32_t)i);
        o->e[id].tier = -1;
        o->e[id].next = o->free_e;
        o->free_e = id;
        return false;
    }
    lru_push_tail(o, t, id);
    o->stats.stored[t]++;
    tell(o, h, t, true);
    return true;
}

/* Forgets every disk-tier entry (their files are gone): each counted as missing and told to the listener. */
static void entry_forget_disk_all(osp_kv_offload *o) {
    while (o->tier[OSP_KV_TIER_DISK].head >= 0) {
        const int32_t id = o->tier[OSP_KV_TIER_DISK].head;
        tell(o, &o->e[id].h, OSP_KV_TIER_DISK, false);
        entry_drop(o, id);
        o->stats.missing++;
    }
}

static void make_room(osp_kv_offload *o, int t) {
    const int32_t id = o->tier[t].head;
    if (id < 0) return;
    if (t == OSP_KV_TIER_HOST && o->tier[OSP_KV_TIER_DISK].cap > 0) {
        /* demote: the entry leaves the host list with its slot and joins the disk tier */
        const int32_t slot = o->e[id].slot;
        tell(o, &o->e[id].h, OSP_KV_TIER_HOST, false);
        lru_remove(o, id);
        o->free_slots[o->n_free_slots++] = slot;
        const osp_block_hash h = o->e[id].h;
        /* the slot's bytes stay intact until the next host insert, which comes after this returns */
        if (!tier_insert(o, OSP_KV_TIER_DISK, id, &h, o->host + (size_t)slot * o->block_bytes)) o->stats.dropped++;
        return;
    }
    if (t == OSP_KV_TIER_DISK) disk_unlink(o, &o->e[id].h);
    tell(o, &o->e[id].h, t, false);
    entry_drop(o, id);
    o->stats.dropped++;
}

/* ---- public ----------------------------------------------------------------------------------- */

typedef struct found {
    osp_block_hash h;
    struct timespec mtime;
} found;

static int found_cmp(const void *a, const void *b) {
    const struct timespec *x = &((const found *)a)->mtime, *y = &((const found *)b)->mtime;
    if (x->tv_sec != y->tv_sec) return x->tv_sec < y->tv_sec ? -1 : 1;
    return x->tv_nsec < y->tv_nsec ? -1 : x->tv_nsec > y->tv_nsec;
}

static bool parse_name(const char *name, osp_block_hash *h) {
    if (strlen(name) != 64 + 3 || strcmp(name + 64, ".kv") != 0) return false;
    uint64_t w[4];
    for (int k = 0; k < 4; k++) {
        w[k] = 0;
        for (int i = 0; i < 16; i++) {
            const char c = name[16 * k + i];
            const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (v < 0) return false;
            w[k] = w[k] << 4 | (uint64_t)v;
        }
    }
    *h = (osp_block_hash){.lo = w[0], .hi = w[1], .ext = {w[2], w[3]}};
    return true;
}

/* Indexes the blocks an earlier run left in the directory, oldest first (LRU order). */
static osp_status disk_scan(osp_kv_offload *o) {
    DIR *d = opendir(o->dir);
    if (!d) return osp_set_error(OSP_ERR_IO, "kv offload: cannot read %s: %s", o->dir, strerror(errno));
    found *f = NULL;
    size_t n = 0, cap = 0;
    osp_status st = OSP_OK;
    const off_t want = (off_t)(HDR_BYTES + o->block_bytes);
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", o->dir, de->d_name);
        const size_t len = strlen(de->d_name);
        if (len > 4 && strcmp(de->d_name + len - 4, ".tmp") == 0 && strstr(de->d_name, ".kv.")) {
            /* a write cut short (or, in a directory shared with a running replica, one in flight: its
               rename then fails and that block is dropped, counted in io_errors) */
            unlink(path);
            continue;
        }
        osp_block_hash h;
        struct stat sb;
        if (!parse_name(de->d_name, &h) || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        uint8_t hdr[HDR_BYTES];
        const int fd = open(path, O_RDONLY | O_CLOEXEC);
        const bool ok = fd >= 0 && sb.st_size == want && read_all(fd, hdr, sizeof hdr) == sizeof hdr &&
                        header_ok(o, &h, hdr);
        if (fd >= 0) close(fd);
        if (!ok) { /* this directory is named by the fingerprint: a file that does not fit it is damaged */
            unlink(path);
            o->stats.corrupt++;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            found *g = realloc(f, sizeof *g * cap);
            if (!g) {
                st = osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory indexing %s", o->dir);
                break;
            }
            f = g;
        }
        f[n++] = (found){.h = h, .mtime = sb.st_mtim};
    }
    closedir(d);
    if (st == OSP_OK) {
        if (n > 1) qsort(f, n, sizeof *f, found_cmp);
        const size_t skip = n > (size_t)o->tier[OSP_KV_TIER_DISK].cap ? n - (size_t)o->tier[OSP_KV_TIER_DISK].cap : 0;
        for (size_t i = 0; i < n && st == OSP_OK; i++) {
            if (i < skip || find(o, &f[i].h) >= 0) {
                if (i < skip) { /* a smaller disk_bytes than the run that wrote them: the oldest go */
                    disk_unlink(o, &f[i].h);
                    o->stats.trimmed++;
                    o->stats.trimmed_bytes += (int64_t)want;
                }
                continue;
            }
            const int32_t id = entry_new(o);
            if (id < 0) {
                st = osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory indexing %s", o->dir);
                break;
            }
            o->e[id].h = f[i].h;
            table_put(o, id);
            lru_push_tail(o, OSP_KV_TIER_DISK, id);
            o->stats.found_at_start++;
            tell(o, &f[i].h, OSP_KV_TIER_DISK, true);
        }
    }
    free(f);
    return st;
}

/* Other fingerprints' directories in the disk tier's parent (their count and files' bytes, one level). */
static void count_others(osp_kv_offload *o, const char *parent) {
    DIR *d = opendir(parent);
    if (!d) return;
    const char *mine = strrchr(o->dir, '/') + 1;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (strncmp(de->d_name, "osprey-kv-", 10) != 0 || !strcmp(de->d_name, mine)) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", parent, de->d_name);
        DIR *sub = opendir(path);
        if (!sub) continue;
        o->stats.other_dirs++;
        for (struct dirent *f; (f = readdir(sub)) != NULL;) {
            char fp[PATH_MAX + 256];
            struct stat sb;
            snprintf(fp, sizeof fp, "%s/%s", path, f->d_name);
            osp_block_hash h;
            if (parse_name(f->d_name, &h) && lstat(fp, &sb) == 0 && S_ISREG(sb.st_mode))
                o->stats.other_bytes += (int64_t)sb.st_size;
        }
        closedir(sub);
    }
    closedir(d);
}

/* Takes the directory's exclusive lock (flock on <dir>/lock, held until destroy: the kernel drops it when
 * the process dies, so a crash leaves nothing to clean up) and writes this process's id in the file for
 * the message of the next one. OSP_ERR_IO when another store holds it (the message names the directory,
 * the flag and the holder) or the file cannot be opened. A file system without flock (some network file
 * systems) is used unlocked (stats.unlocked). */
static osp_status dir_lock(osp_kv_offload *o) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/" LOCK_FILE, o->dir);
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return osp_set_error(OSP_ERR_IO, "kv offload: cannot open the lock file %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
            close(fd);
            o->stats.unlocked = true;
            return OSP_OK;
        }
        char holder[32] = {0};
        const ssize_t r = pread(fd, holder, sizeof holder - 1, 0);
        close(fd);
        for (ssize_t i = 0; i < r; i++)
            if (holder[i] < '0' || holder[i] > '9') holder[i] = '\0';
        if (err != EWOULDBLOCK)
            return osp_set_error(OSP_ERR_IO, "kv offload: cannot lock %s: %s", path, strerror(err));
        return osp_set_error(OSP_ERR_IO,
                             "kv offload: the disk tier's directory %s is in use by another osprey process%s%s%s "
                             "(--kv-offload-disk): a directory serves one server at a time; give each server a "
                             "directory of its own", o->dir, holder[0] ? " (pid " : "", holder, holder[0] ? ")" : "");
    }
    char pid[32];
    const int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) { /* only the message's pid is lost */ }
    o->lock_fd = fd;
    return OSP_OK;
}

/* The directory's record of whose blocks it holds: the fingerprint (also the directory's name) and the
 * hash identity. */
static void identity_text(const osp_kv_offload *o, char *out, size_t n) {
    snprintf(out, n, "osprey kv offload directory\nfingerprint %016" PRIx64 "\nhash %016" PRIx64 "\n", o->fp, o->hash_id);
}

/* Makes the directory this store's hash identity's: when its identity file names another one (or is
 * missing: an older osprey's), every block file there is removed (stats.foreign_*: no hash of this store
 * can match them); then the file records this store's (written to a temporary name and renamed).
 * OSP_ERR_IO when the directory cannot be read or the file written. Call with the lock held. */
static osp_status dir_identity(osp_kv_offload *o) {
    char path[PATH_MAX], tmp[PATH_MAX], want[160], have[160] = {0};
    snprintf(path, sizeof path, "%s/" IDENTITY_FILE, o->dir);
    snprintf(tmp, sizeof tmp, "%s/" IDENTITY_FILE ".tmp", o->dir);
    identity_text(o, want, sizeof want);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    const bool known = fd >= 0;
    if (fd >= 0) {
        read_all(fd, have, sizeof have - 1);
        close(fd);
    }
    if (known && !strcmp(have, want)) return OSP_OK;
    DIR *d = opendir(o->dir);
    if (!d) return osp_set_error(OSP_ERR_IO, "kv offload: cannot read %s: %s", o->dir, strerror(errno));
    int64_t n = 0, bytes = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        osp_block_hash h;
        char fp[PATH_MAX + 256];
        struct stat sb;
        snprintf(fp, sizeof fp, "%s/%s", o->dir, de->d_name);
        if (!parse_name(de->d_name, &h) || lstat(fp, &sb) != 0 || !S_ISREG(sb.st_mode) || unlink(fp) != 0) continue;
        n++;
        bytes += (int64_t)sb.st_size;
    }
    closedir(d);
    o->stats.foreign_removed += n;
    o->stats.foreign_bytes += bytes;
    if (n > 0 && !known) o->stats.foreign_unknown = true;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
        if (!write_all(fd, want, strlen(want))) err = errno ? errno : EIO;
        if (close(fd) != 0 && err == 0) err = errno ? errno : EIO;
        if (err == 0 && rename(tmp, path) != 0) err = errno;
        if (err != 0) unlink(tmp);
    }
    if (err != 0) return osp_set_error(OSP_ERR_IO, "kv offload: cannot write %s: %s", path, strerror(err));
    return OSP_OK;
}

static osp_status mkdir_p(const char *path) {
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv offload: directory path too long");
    for (char *p = buf + 1;; p++) {
        const bool end = *p == '\0';
        if (*p == '/' || end) {
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return osp_set_error(OSP_ERR_IO, "kv offload: cannot create %s: %s", buf, strerror(errno));
            if (end) break;
            *p = '/';
        }
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return osp_set_error(OSP_ERR_IO, "kv offload: %s is not a directory", path);
    return OSP_OK;
}

osp_status osp_kv_offload_create(const osp_kv_offload_config *cfg, size_t block_bytes, uint64_t fingerprint,
                                 osp_kv_offload **out) {
    *out = NULL;
    const bool disk = cfg->disk_dir && cfg->disk_dir[0];
    if (block_bytes == 0) return osp_set_error(OSP_ERR_INVALID_ARG, "kv offload: block size 0");
    if (cfg->host_bytes < 0 || (!disk && cfg->host_bytes == 0))
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv offload: no tier (give a host size or a disk directory)");
    const int64_t host_cap = cfg->host_bytes / (int64_t)block_bytes;
    const int64_t disk_cap = disk ? cfg->disk_bytes / (int64_t)(block_bytes + HDR_BYTES) : 0;
    if (cfg->host_bytes > 0 && host_cap == 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv offload: host size %" PRId64 " bytes is less than one block (%zu)",
                             cfg->host_bytes, block_bytes);
    if (disk && disk_cap == 0)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv offload: disk size %" PRId64 " bytes is less than one block (%zu)",
                             cfg->disk_bytes, block_bytes + HDR_BYTES);
    if (host_cap > INT32_MAX / 2 || disk_cap > INT32_MAX / 2 || (uint64_t)host_cap > SIZE_MAX / block_bytes)
        return osp_set_error(OSP_ERR_INVALID_ARG, "kv offload: too many blocks for one store");
    osp_kv_offload *o = calloc(1, sizeof *o);
    if (!o) return osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory");
    o->block_bytes = block_bytes;
    o->fp = fingerprint;
    o->listener = cfg->listener;
    o->listener_ctx = cfg->listener_ctx;
    o->hash_id = cfg->hash_id;
    o->write_fault = cfg->test_write_fault;
    o->clock = cfg->test_clock;
    o->test_ctx = cfg->test_ctx;
    o->lock_fd = -1;
    o->free_e = -1;
    o->index = (osp_hash_index){.slot = malloc(sizeof(int32_t) * 256), .mask = 255, .stride = sizeof(entry)};
    for (int t = 0; t < OSP_KV_NUM_TIERS; t++) o->tier[t] = (lru){.head = -1, .tail = -1};
    o->tier[OSP_KV_TIER_HOST].cap = host_cap;
    o->tier[OSP_KV_TIER_DISK].cap = disk_cap;
    o->stats.capacity[OSP_KV_TIER_HOST] = host_cap;
    o->stats.capacity[OSP_KV_TIER_DISK] = disk_cap;
    osp_status st = o->index.slot ? OSP_OK : osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory");
    if (st == OSP_OK) memset(o->index.slot, 0xff, sizeof(int32_t) * 256);
    if (st == OSP_OK && host_cap > 0) {
        o->host = malloc((size_t)host_cap * block_bytes);
        o->free_slots = malloc(sizeof *o->free_slots * (size_t)host_cap);
        if (!o->host || !o->free_slots)
            st = osp_set_error(OSP_ERR_NOMEM, "kv offload: cannot reserve %" PRId64 " bytes of host memory",
                               host_cap * (int64_t)block_bytes);
        else
            for (int32_t i = 0; i < (int32_t)host_cap; i++) o->free_slots[o->n_free_slots++] = (int32_t)host_cap - 1 - i;
    }
    if (st == OSP_OK && disk) {
        char buf[PATH_MAX];
        if (snprintf(buf, sizeof buf, "%s/osprey-kv-%016" PRIx64, cfg->disk_dir, fingerprint) >= (int)sizeof buf - 70)
            st = osp_set_error(OSP_ERR_INVALID_ARG, "kv offload: directory path too long");
        else if (!(o->dir = strdup(buf)))
            st = osp_set_error(OSP_ERR_NOMEM, "kv offload: out of memory");
        if (st == OSP_OK) st = mkdir_p(o->dir);
        if (st == OSP_OK) st = dir_lock(o);          /* before anything in it is read or removed */
        if (st == OSP_OK) st = dir_identity(o);      /* another hash identity's blocks go first */
        struct stat sb;
        if (st == OSP_OK && stat(o->dir, &sb) != 0)
            st = osp_set_error(OSP_ERR_IO, "kv offload: cannot read %s: %s", o->dir, strerror(errno));
        if (st == OSP_OK) o->dir_dev = sb.st_dev, o->dir_ino = sb.st_ino;
        if (st == OSP_OK) st = disk_scan(o);
        if (st == OSP_OK) count_others(o, cfg->disk_dir);
    }
    if (st != OSP_OK) {
        osp_kv_offload_destroy(o);
        return st;
    }
    *out = o;
    return OSP_OK;
}

void osp_kv_offload_destroy(osp_kv_offload *o) {
    if (!o) return;
    if (o->lock_fd >= 0) close(o->lock_fd); /* releases the lock (the file stays: unlinking it would race) */
    free(o->e);
    free(o->index.slot);
    free(o->host);
    free(o->free_slots);
    free(o->dir);
    free(o);
}

size_t osp_kv_offload_block_bytes(const osp_kv_offload *o) { return o->block_bytes; }

static void touch(osp_kv_offload *o, int32_t id) {
    const int t = o->e[id].tier;
    lru_remove(o, id);
    lru_push_tail(o, t, id);
}

void osp_kv_offload_put(osp_kv_offload *o, const osp_block_hash *h, const void *bytes) {
    const int64_t i = find(o, h);
    if (i >= 0) {
        touch(o, o->index.slot[i]);
        return;
    }
    const int t = o->tier[OSP_KV_TIER_HOST].cap > 0 ? OSP_KV_TIER_HOST : OSP_KV_TIER_DISK;
    if (!tier_insert(o, t, -1, h, bytes)) o->stats.dropped++;
}

int32_t osp_kv_offload_host_slots_next(osp_kv_offload *o, int32_t n, void **slots) {
    lru *t = &o->tier[OSP_KV_TIER_HOST];
    const int32_t k = n < 0 ? 0 : n < t->cap ? n : (int32_t)t->cap;
    while (o->n_free_slots < k && t->n > 0) make_room(o, OSP_KV_TIER_HOST);
    const int32_t m = k < o->n_free_slots ? k : o->n_free_slots;
    for (int32_t i = 0; i < m; i++) /* the puts pop the free-slot stack from its top */
        slots[i] = o->host + (size_t)o->free_slots[o->n_free_slots - 1 - i] * o->block_bytes;
    return m;
}

int osp_kv_offload_where(const osp_kv_offload *o, const osp_block_hash *h) {
    const int64_t i = find(o, h);
    return i < 0 ? -1 : o->e[o->index.slot[i]].tier;
}

void osp_kv_offload_settle(osp_kv_offload *o, const osp_block_hash *h, osp_kv_read_result r) {
    const int64_t i = find(o, h);
    if (i < 0 || o->e[o->index.slot[i]].tier != OSP_KV_TIER_DISK) { /* dropped meanwhile, or moved: nothing to do */
        if (r == OSP_KV_READ_OK) o->stats.loaded[OSP_KV_TIER_DISK]++;
        return;
    }
    const int32_t id = o->index.slot[i];
    if (r == OSP_KV_READ_OK) {
        touch(o, id);
        o->stats.loaded[OSP_KV_TIER_DISK]++;
        return;
    }
    if (r == OSP_KV_READ_CORRUPT) {
        disk_unlink(o, h);
        o->stats.corrupt++;
    } else {
        o->stats.missing++;
    }
    tell(o, h, OSP_KV_TIER_DISK, false);
    entry_drop(o, id);
    /* a missing file in a directory that is gone or replaced: so are all the others the index lists */
    if (r == OSP_KV_READ_MISSING && !dir_same(o)) disk_dir_lost(o);
}

bool osp_kv_offload_get_host(osp_kv_offload *o, const osp_block_hash *h, void *dst) {
    const int64_t i = find(o, h);
    if (i < 0 || o->e[o->index.slot[i]].tier != OSP_KV_TIER_HOST) return false;
    const int32_t id = o->index.slot[i];
    memcpy(dst, o->host + (size_t)o->e[id].slot * o->block_bytes, o->block_bytes);
    touch(o, id);
    o->stats.loaded[OSP_KV_TIER_HOST]++;
    return true;
}

const void *osp_kv_offload_host_block(osp_kv_offload *o, const osp_block_hash *h) {
    const int64_t i = find(o, h);
    if (i < 0 || o->e[o->index.slot[i]].tier != OSP_KV_TIER_HOST) return NULL;
    const int32_t id = o->index.slot[i];
    touch(o, id);
    o->stats.loaded[OSP_KV_TIER_HOST]++;
    return o->host + (size_t)o->e[id].slot * o->block_bytes;
}

void osp_kv_offload_host_arena(const osp_kv_offload *o, void **p, size_t *bytes) {
    *p = o->host;
    *bytes = o->host ? (size_t)o->tier[OSP_KV_TIER_HOST].cap * o->block_bytes : 0;
}

bool osp_kv_offload_get(osp_kv_offload *o, const osp_block_hash *h, void *dst) {
    if (osp_kv_offload_get_host(o, h, dst)) return true;
    if (osp_kv_offload_where(o, h) != OSP_KV_TIER_DISK) return false;
    const osp_kv_read_result r = osp_kv_offload_read(o, h, dst);
    osp_kv_offload_settle(o, h, r);
    return r == OSP_KV_READ_OK;
}

osp_kv_offload_stats osp_kv_offload_get_stats(const osp_kv_offload *o) { return o->stats; }

const char *osp_kv_offload_disk_path(const osp_kv_offload *o) { return o->dir; }

const char *osp_kv_offload_disk_error(const osp_kv_offload *o) { return o->disk_error[0] ? o->disk_error : NULL; }

const char *osp_kv_offload_full_error(const osp_kv_offload *o) { return o->full_error[0] ? o->full_error : NULL; }
