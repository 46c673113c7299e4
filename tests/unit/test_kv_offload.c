/* Tiered KV offload (src/kv/offload.h, src/engine/offload.h).
 *
 * The store alone: blocks come back byte for byte from host memory and from disk; a full host tier moves
 * its least recently used block to disk, a full disk tier drops its oldest; a flipped byte, a truncated
 * file or a foreign header is detected (a miss, the file deleted, counted), never returned; a second store
 * with the same fingerprint finds the first one's files (oldest first, over-capacity ones deleted), one
 * with another fingerprint does not; leftover temporary files are removed; bad configurations are refused;
 * a store of another hash identity (seed) removes the directory's blocks, a smaller size removes the oldest
 * (both counted), a second store on a locked directory is refused, and a full disk (ENOSPC from a fault
 * hook, a fake clock) frees the tier's oldest blocks, retries once, then pauses writes while loads go on.
 *
 * The engine (tiny f32 model, CPU): a prompt whose blocks the pool evicted is served from the tier on its
 * second run -- its cached-token count says so, and its tokens equal those of the first run and of a run
 * without offload; with every disk file corrupted the blocks are recomputed (same tokens, corrupt blocks
 * counted); a new engine on the same directory serves the prompt from the earlier engine's files (another
 * seed's engine removes them with one line; a second engine on it is refused); mixed
 * batches under preemption give the same tokens with offload on and off. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_test_models.h"
#include "engine/engine_internal.h"
#include "kv/kv_cache.h"
#include "kv/offload.h"
#include "osprey/engine.h"

/* tests/gpu/test_gpu_kv_offload.c compiles this file again with TEST_DEVICE OSP_DEVICE_CUDA: the engine
 * scenarios with the pages on the GPU (to_host / from_host copies; a host-memory tier above the disk),
 * on a 2-layer head_dim-32 model written at start. */
#ifndef TEST_DEVICE
#define TEST_DEVICE OSP_DEVICE_CPU
#endif
static const bool g_gpu = TEST_DEVICE == OSP_DEVICE_CUDA;

#define BB 1000 /* block bytes in the store tests */

static char g_tiny[512];

static osp_block_hash hash_of(uint64_t i) { return (osp_block_hash){.lo = i * 0x9e3779b97f4a7c15ull, .hi = i, .ext = {0, 0}}; }

static void fill(uint8_t *b, uint64_t i) {
    for (int k = 0; k < BB; k++) b[k] = (uint8_t)(i * 31 + (uint64_t)k * 7);
}

static void make_tmpdir(char *dir, size_t n) {
    snprintf(dir, n, "/tmp/osprey-test-offload-XXXXXX");
    assert_non_null(mkdtemp(dir));
}

/* Removes dir and everything under it (two levels: the store's own directory is one level down). */
static void rm_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) rm_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int count_files(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        const size_t l = strlen(de->d_name), s = strlen(suffix);
        n += l > s && !strcmp(de->d_name + l - s, suffix);
    }
    closedir(d);
    return n;
}

static void block_file(const osp_kv_offload *o, uint64_t i, char *out, size_t n) {
    const osp_block_hash h = hash_of(i);
    snprintf(out, n, "%s/%016llx%016llx%016llx%016llx.kv", osp_kv_offload_disk_path(o), (unsigned long long)h.lo,
             (unsigned long long)h.hi, 0ull, 0ull);
}

static void test_host_tier(void **state) {
    (void)state;
    const osp_kv_offload_config cfg = {.host_bytes = 3 * BB};
    osp_kv_offload *o;
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 7, &o), OSP_OK);
    uint8_t b[BB], got[BB];
    const osp_block_hash zero = {0};
    for (uint64_t i = 0; i < 3; i++) { /* the same hash three times is one block */
        fill(b, i);
        osp_kv_offload_put(o, &zero, b);
    }
    assert_int_equal(osp_kv_offload_get_stats(o).blocks[OSP_KV_TIER_HOST], 1);
    for (uint64_t i = 1; i <= 3; i++) {
        const osp_block_hash h = hash_of(i);
        fill(b, i);
        osp_kv_offload_put(o, &h, b);
    }
    /* 4 blocks into 3 slots: the least recently used (the zero hash) is dropped */
    assert_int_equal(osp_kv_offload_where(o, &zero), -1);
    const osp_block_hash h1 = hash_of(1), h2 = hash_of(2), h4 = hash_of(4);
    assert_true(osp_kv_offload_get(o, &h1, got)); /* 1 becomes the most recent */
    fill(b, 1);
    assert_memory_equal(got, b, BB);
    fill(b, 4);
    osp_kv_offload_put(o, &h4, b); /* drops 2, the least recent now */
    assert_int_equal(osp_kv_offload_where(o, &h2), -1);
    assert_int_equal(osp_kv_offload_where(o, &h1), OSP_KV_TIER_HOST);
    const osp_kv_offload_stats st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.dropped, 2);
    assert_int_equal(st.blocks[OSP_KV_TIER_HOST], 3);
    assert_int_equal(st.loaded[OSP_KV_TIER_HOST], 1);
    assert_false(osp_kv_offload_get(o, &(osp_block_hash){.lo = 12345}, got));
    /* written in place: the next slot (making room: drops 3, now the least recent), then put with it */
    const osp_block_hash h5 = hash_of(5), h3 = hash_of(3);
    void *slotp = NULL;
    assert_int_equal(osp_kv_offload_host_slots_next(o, 1, &slotp), 1);
    uint8_t *slot = slotp;
    assert_non_null(slot);
    assert_int_equal(osp_kv_offload_where(o, &h3), -1);
    fill(slot, 5);
    osp_kv_offload_put(o, &h5, slot);
    assert_true(osp_kv_offload_get(o, &h5, got));
    fill(b, 5);
    assert_memory_equal(got, b, BB);
    assert_true(osp_kv_offload_get(o, &h1, got)); /* the others untouched */
    fill(b, 1);
    assert_memory_equal(got, b, BB);
    assert_int_equal(osp_kv_offload_get_stats(o).blocks[OSP_KV_TIER_HOST], 3);
    /* a run of slots: more than the tier holds gives its capacity, distinct slots, the tier emptied first;
       the puts in order fill them in order */
    void *slots[5] = {0};
    assert_int_equal(osp_kv_offload_host_slots_next(o, 5, slots), 3);
    assert_int_equal(osp_kv_offload_get_stats(o).blocks[OSP_KV_TIER_HOST], 0);
    assert_true(slots[0] != slots[1] && slots[1] != slots[2] && slots[0] != slots[2]);
    for (int i = 0; i < 3; i++) fill(slots[i], 10 + i);
    for (int i = 0; i < 3; i++) {
        const osp_block_hash hi = hash_of(900 + (uint64_t)i);
        osp_kv_offload_put(o, &hi, slots[i]);
    }
    for (int i = 0; i < 3; i++) {
        const osp_block_hash hi = hash_of(900 + (uint64_t)i);
        assert_true(osp_kv_offload_get(o, &hi, got));
        fill(b, 10 + i);
        assert_memory_equal(got, b, BB);
    }
    assert_int_equal(osp_kv_offload_host_slots_next(o, 0, slots), 0);
    osp_kv_offload_destroy(o);
    /* no host tier: no slot */
    char dir[] = "/tmp/osprey-kvo-slot-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const osp_kv_offload_config dcfg = {.disk_dir = dir, .disk_bytes = 4 * BB};
    assert_int_equal(osp_kv_offload_create(&dcfg, BB, 7, &o), OSP_OK);
    assert_int_equal(osp_kv_offload_host_slots_next(o, 2, slots), 0);
    osp_kv_offload_destroy(o);
    rm_tree(dir);
}

static void test_disk_tier(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    const osp_kv_offload_config cfg = {.host_bytes = 2 * BB, .disk_dir = dir, .disk_bytes = 4 * (BB + 72)};
    osp_kv_offload *o;
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 99, &o), OSP_OK);
    uint8_t b[BB], got[BB];
    for (uint64_t i = 1; i <= 7; i++) { /* 2 in host, 4 on disk, 1 dropped */
        const osp_block_hash h = hash_of(i);
        fill(b, i);
        osp_kv_offload_put(o, &h, b);
    }
    osp_kv_offload_stats st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.blocks[OSP_KV_TIER_HOST], 2);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 4);
    assert_int_equal(st.dropped, 1);
    assert_int_equal(count_files(osp_kv_offload_disk_path(o), ".kv"), 4);
    const osp_block_hash h1 = hash_of(1);
    assert_int_equal(osp_kv_offload_where(o, &h1), -1);
    for (uint64_t i = 2; i <= 7; i++) {
        const osp_block_hash h = hash_of(i);
        assert_int_equal(osp_kv_offload_where(o, &h), i <= 5 ? OSP_KV_TIER_DISK : OSP_KV_TIER_HOST);
        assert_true(osp_kv_offload_get(o, &h, got));
        fill(b, i);
        assert_memory_equal(got, b, BB);
    }
    /* a flipped payload byte, a truncated file, a header naming another hash: all detected */
    char path[1024];
    block_file(o, 2, path, sizeof path);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 72 + 500, SEEK_SET);
    fputc(fgetc(f) ^ 0x10, f), fseek(f, 72 + 500, SEEK_SET);
    fclose(f);
    block_file(o, 3, path, sizeof path);
    assert_int_equal(truncate(path, 72 + BB - 1), 0);
    char p4[1024];
    block_file(o, 4, p4, sizeof p4);
    block_file(o, 5, path, sizeof path);
    assert_int_equal(rename(p4, path), 0); /* 5's name, 4's header */
    for (uint64_t i = 2; i <= 5; i++) {
        const osp_block_hash h = hash_of(i);
        assert_false(osp_kv_offload_get(o, &h, got));
        assert_int_equal(osp_kv_offload_where(o, &h), -1);
    }
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.corrupt, 3); /* 2, 3, 5 failed their checks; 4's file was gone: a miss, forgotten */
    assert_int_equal(st.missing, 1);
    assert_int_equal(st.dir_lost, 0); /* the directory itself stayed */
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 0);
    assert_int_equal(count_files(osp_kv_offload_disk_path(o), ".kv"), 0);
    osp_kv_offload_destroy(o);
    rm_tree(dir);
}

static void test_disk_persists(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    osp_kv_offload_config cfg = {.disk_dir = dir, .disk_bytes = 5 * (BB + 72)};
    osp_kv_offload *o;
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 1234, &o), OSP_OK);
    uint8_t b[BB], got[BB];
    for (uint64_t i = 1; i <= 5; i++) {
        const osp_block_hash h = hash_of(i);
        fill(b, i);
        osp_kv_offload_put(o, &h, b);
    }
    char spath[1024], tmp[1100];
    snprintf(spath, sizeof spath, "%s", osp_kv_offload_disk_path(o));
    snprintf(tmp, sizeof tmp, "%s/%064d.kv.tmp", spath, 0);
    FILE *f = fopen(tmp, "wb");
    assert_non_null(f);
    fclose(f);
    osp_kv_offload_destroy(o);
    /* the same fingerprint finds them, and removes the half-written file */
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 1234, &o), OSP_OK);
    assert_int_equal(osp_kv_offload_get_stats(o).found_at_start, 5);
    assert_int_equal(count_files(spath, ".tmp"), 0);
    for (uint64_t i = 1; i <= 5; i++) {
        const osp_block_hash h = hash_of(i);
        assert_true(osp_kv_offload_get(o, &h, got));
        fill(b, i);
        assert_memory_equal(got, b, BB);
    }
    osp_kv_offload_destroy(o);
    /* a smaller capacity keeps only what fits; another fingerprint sees nothing */
    cfg.disk_bytes = 2 * (BB + 72);
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 1234, &o), OSP_OK);
    assert_int_equal(osp_kv_offload_get_stats(o).blocks[OSP_KV_TIER_DISK], 2);
    assert_int_equal(count_files(spath, ".kv"), 2);
    osp_kv_offload_destroy(o);
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 4321, &o), OSP_OK);
    osp_kv_offload_stats st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.found_at_start, 0);
    assert_int_equal(st.other_dirs, 1); /* the first fingerprint's directory: counted apart, never read */
    assert_int_equal(st.other_bytes, 2 * (BB + 72));
    const osp_block_hash h5 = hash_of(5);
    assert_int_equal(osp_kv_offload_where(o, &h5), -1);
    /* the directory removed under a running store: the next write makes it again */
    char mine[1024];
    snprintf(mine, sizeof mine, "%s", osp_kv_offload_disk_path(o));
    rm_tree(mine);
    fill(b, 5);
    osp_kv_offload_put(o, &h5, b);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.io_errors, 0);
    assert_int_equal(count_files(mine, ".kv"), 1);
    assert_true(osp_kv_offload_get(o, &h5, got));
    assert_memory_equal(got, b, BB);
    osp_kv_offload_destroy(o);
    rm_tree(dir);
}

/* Counts the disk tier's removals the listener is told of. */
static void count_disk_removals(void *ctx, const osp_block_hash *h, int tier, bool stored) {
    (void)h;
    if (tier == OSP_KV_TIER_DISK && !stored) (*(int64_t *)ctx)++;
}

/* The store's directory removed (rm -rf) or replaced while the store runs: the index forgets every block
 * it listed there (missing, never corrupt; the listener told of each), so the gauge and the size budget
 * count only real files; the directory is made again and blocks are stored there; a file in its place
 * turns the disk tier off (capacity 0, a reason), nothing written, nothing counted as corrupt. */
static void test_disk_dir_removed(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    int64_t removals = 0;
    const osp_kv_offload_config cfg = {.disk_dir = dir, .disk_bytes = 8 * (BB + 72),
                                       .listener = count_disk_removals, .listener_ctx = &removals};
    osp_kv_offload *o;
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 55, &o), OSP_OK);
    char mine[1024];
    snprintf(mine, sizeof mine, "%s", osp_kv_offload_disk_path(o));
    uint8_t b[BB], got[BB];
    for (uint64_t i = 1; i <= 5; i++) {
        const osp_block_hash h = hash_of(i);
        fill(b, i);
        osp_kv_offload_put(o, &h, b);
    }
    assert_int_equal(osp_kv_offload_get_stats(o).blocks[OSP_KV_TIER_DISK], 5);

    /* 1. rm -rf, then a load: a miss; that block and the four others are forgotten, the directory made again */
    rm_tree(mine);
    const osp_block_hash h1 = hash_of(1), h2 = hash_of(2);
    assert_false(osp_kv_offload_get(o, &h1, got));
    osp_kv_offload_stats st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.missing, 5);
    assert_int_equal(st.corrupt, 0);
    assert_int_equal(st.dir_lost, 1);
    assert_false(st.disk_off);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 0);
    assert_int_equal(removals, 5);
    assert_int_equal(osp_kv_offload_where(o, &h2), -1);
    assert_int_equal(count_files(mine, ".kv"), 0); /* made again, empty */
    assert_null(osp_kv_offload_disk_error(o));
    /* the tier works on: a block stored and read back */
    const osp_block_hash h6 = hash_of(6), h7 = hash_of(7), h8 = hash_of(8), h9 = hash_of(9);
    fill(b, 6);
    osp_kv_offload_put(o, &h6, b);
    assert_true(osp_kv_offload_get(o, &h6, got));
    assert_memory_equal(got, b, BB);

    /* 2. rm -rf, then a write: it notices first, forgets h6, writes h7 into the new directory */
    rm_tree(mine);
    fill(b, 7);
    osp_kv_offload_put(o, &h7, b);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.dir_lost, 2);
    assert_int_equal(st.missing, 6);
    assert_int_equal(st.io_errors, 0);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 1);
    assert_int_equal(count_files(mine, ".kv"), 1);
    assert_int_equal(osp_kv_offload_where(o, &h6), -1);
    assert_true(osp_kv_offload_get(o, &h7, got));
    assert_memory_equal(got, b, BB);

    /* 3. replaced by another (empty) directory: moved away before the new one is made, so its inode
       differs; the next write forgets h7 */
    char old[1100];
    snprintf(old, sizeof old, "%s.old", mine);
    assert_int_equal(rename(mine, old), 0);
    assert_int_equal(mkdir(mine, 0755), 0);
    fill(b, 8);
    osp_kv_offload_put(o, &h8, b);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.dir_lost, 3);
    assert_int_equal(st.missing, 7);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 1);
    assert_int_equal(osp_kv_offload_where(o, &h7), -1);
    assert_true(osp_kv_offload_get(o, &h8, got));
    assert_memory_equal(got, b, BB);
    rm_tree(old);

    /* 4. replaced by a file: the load of h8 is a miss (ENOTDIR, not corrupt), and the directory cannot be
       made again: the disk tier is off; later puts store nothing and touch nothing */
    rm_tree(mine);
    FILE *f = fopen(mine, "wb");
    assert_non_null(f);
    fputs("not a directory", f);
    fclose(f);
    assert_false(osp_kv_offload_get(o, &h8, got));
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.missing, 8);
    assert_int_equal(st.corrupt, 0);
    assert_int_equal(st.dir_lost, 4);
    assert_true(st.disk_off);
    assert_int_equal(st.capacity[OSP_KV_TIER_DISK], 0);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 0);
    assert_non_null(osp_kv_offload_disk_error(o));
    assert_non_null(strstr(osp_kv_offload_disk_error(o), "not a directory"));
    const int64_t dropped = st.dropped;
    fill(b, 9);
    osp_kv_offload_put(o, &h9, b);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.dropped, dropped + 1);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 0);
    assert_int_equal(osp_kv_offload_where(o, &h9), -1);
    assert_int_equal(st.dir_lost, 4); /* reported once, not again per put */
    struct stat sb;
    assert_int_equal(stat(mine, &sb), 0);
    assert_true(S_ISREG(sb.st_mode)); /* the file left as it was */
    assert_int_equal(removals, 8);
    osp_kv_offload_destroy(o);
    unlink(mine);
    rm_tree(dir);
}

/* Item: blocks belong to one hash identity. A store under another hash identity (a restart with another
 * --prefix-caching-hash-seed or algorithm) removes the blocks it finds (none of its hashes could match
 * them; they would only use the budget), counted with their bytes; the same identity finds them; a
 * directory without its identity file (an older osprey's) is another identity. */
static void test_disk_hash_identity(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    osp_kv_offload_config cfg = {.disk_dir = dir, .disk_bytes = 8 * (BB + 72), .hash_id = 1};
    osp_kv_offload *o;
    uint8_t b[BB], got[BB];
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 77, &o), OSP_OK);
    for (uint64_t i = 1; i <= 3; i++) {
        const osp_block_hash h = hash_of(i);
        fill(b, i);
        osp_kv_offload_put(o, &h, b);
    }
    char sub[1024];
    snprintf(sub, sizeof sub, "%s", osp_kv_offload_disk_path(o));
    osp_kv_offload_destroy(o);
    /* the same identity: found */
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 77, &o), OSP_OK);
    osp_kv_offload_stats st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.found_at_start, 3);
    assert_int_equal(st.foreign_removed, 0);
    osp_kv_offload_destroy(o);
    /* another seed: removed, counted, nothing indexed */
    cfg.hash_id = 2;
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 77, &o), OSP_OK);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.found_at_start, 0);
    assert_int_equal(st.foreign_removed, 3);
    assert_int_equal(st.foreign_bytes, 3 * (BB + 72));
    assert_false(st.foreign_unknown);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 0);
    assert_int_equal(count_files(sub, ".kv"), 0);
    const osp_block_hash h1 = hash_of(1), h9 = hash_of(9);
    assert_int_equal(osp_kv_offload_where(o, &h1), -1);
    fill(b, 9);
    osp_kv_offload_put(o, &h9, b);
    osp_kv_offload_destroy(o);
    /* the new identity is the directory's now: its block is found again */
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 77, &o), OSP_OK);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.found_at_start, 1);
    assert_int_equal(st.foreign_removed, 0);
    assert_true(osp_kv_offload_get(o, &h9, got));
    assert_memory_equal(got, b, BB);
    osp_kv_offload_destroy(o);
    /* no identity file (an older osprey's directory): its blocks are of an unknown identity, removed */
    char idf[1100];
    snprintf(idf, sizeof idf, "%s/identity", sub);
    assert_int_equal(unlink(idf), 0);
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 77, &o), OSP_OK);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.found_at_start, 0);
    assert_int_equal(st.foreign_removed, 1);
    assert_true(st.foreign_unknown);
    osp_kv_offload_destroy(o);
    rm_tree(dir);
}

/* Sets a block file's modification time (seconds): the scan's age order, without depending on the file
 * system's timestamp granularity. */
static void set_mtime(const osp_kv_offload *o, uint64_t i, time_t sec) {
    char path[1024];
    block_file(o, i, path, sizeof path);
    const struct timespec ts[2] = {{.tv_sec = sec}, {.tv_sec = sec}};
    assert_int_equal(utimensat(AT_FDCWD, path, ts, 0), 0);
}

/* Item: a smaller disk size at restart keeps the most recent blocks that fit and counts the others (and
 * their bytes), removed oldest first. */
static void test_disk_smaller_size(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    osp_kv_offload_config cfg = {.disk_dir = dir, .disk_bytes = 5 * (BB + 72)};
    osp_kv_offload *o;
    uint8_t b[BB], got[BB];
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 31, &o), OSP_OK);
    for (uint64_t i = 1; i <= 5; i++) {
        const osp_block_hash h = hash_of(i);
        fill(b, i);
        osp_kv_offload_put(o, &h, b);
    }
    for (uint64_t i = 1; i <= 5; i++) set_mtime(o, i, 1000000 + (time_t)(i == 2 ? 10 : i)); /* 2 is the newest */
    osp_kv_offload_destroy(o);
    /* the same size: nothing removed */
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 31, &o), OSP_OK);
    assert_int_equal(osp_kv_offload_get_stats(o).trimmed, 0);
    osp_kv_offload_destroy(o);
    cfg.disk_bytes = 2 * (BB + 72) + 71; /* 2 blocks */
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 31, &o), OSP_OK);
    const osp_kv_offload_stats st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.found_at_start, 2);
    assert_int_equal(st.trimmed, 3);
    assert_int_equal(st.trimmed_bytes, 3 * (BB + 72));
    assert_int_equal(st.corrupt, 0);
    assert_int_equal(count_files(osp_kv_offload_disk_path(o), ".kv"), 2);
    for (uint64_t i = 1; i <= 5; i++) { /* 1, 3, 4 were the oldest */
        const osp_block_hash h = hash_of(i);
        const bool kept = i == 2 || i == 5;
        assert_int_equal(osp_kv_offload_where(o, &h), kept ? OSP_KV_TIER_DISK : -1);
        if (kept) {
            assert_true(osp_kv_offload_get(o, &h, got));
            fill(b, i);
            assert_memory_equal(got, b, BB);
        }
    }
    osp_kv_offload_destroy(o);
    rm_tree(dir);
}

/* Item: one store a directory. A second store on the same directory (the same fingerprint; the lock is
 * per open file, so the same process shows it, and a forked child too) is refused with a message naming
 * the directory and the flag, and touches nothing; another fingerprint (its own directory) is not; once
 * the first is gone the directory is free. */
static void test_disk_lock(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    const osp_kv_offload_config cfg = {.disk_dir = dir, .disk_bytes = 8 * (BB + 72), .hash_id = 5};
    osp_kv_offload *a, *b2 = (osp_kv_offload *)1, *c;
    uint8_t b[BB], got[BB];
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 42, &a), OSP_OK);
    for (uint64_t i = 1; i <= 3; i++) {
        const osp_block_hash h = hash_of(i);
        fill(b, i);
        osp_kv_offload_put(a, &h, b);
    }
    /* the same directory under another hash identity: refused before it could remove a's blocks */
    osp_kv_offload_config other_seed = cfg;
    other_seed.hash_id = 6;
    assert_int_equal(osp_kv_offload_create(&other_seed, BB, 42, &b2), OSP_ERR_IO);
    assert_null(b2);
    assert_non_null(strstr(osp_last_error(), osp_kv_offload_disk_path(a)));
    assert_non_null(strstr(osp_last_error(), "--kv-offload-disk"));
    assert_non_null(strstr(osp_last_error(), "in use"));
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 42, &b2), OSP_ERR_IO);
    assert_int_equal(count_files(osp_kv_offload_disk_path(a), ".kv"), 3);
    /* another process */
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        osp_kv_offload *x = NULL;
        _exit(osp_kv_offload_create(&cfg, BB, 42, &x) == OSP_ERR_IO && x == NULL ? 0 : 1);
    }
    int wst = 0;
    assert_int_equal(waitpid(pid, &wst, 0), pid);
    assert_true(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    /* a's blocks are intact and served */
    for (uint64_t i = 1; i <= 3; i++) {
        const osp_block_hash h = hash_of(i);
        assert_true(osp_kv_offload_get(a, &h, got));
        fill(b, i);
        assert_memory_equal(got, b, BB);
    }
    /* another fingerprint beside it: its own directory, its own lock */
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 43, &c), OSP_OK);
    osp_kv_offload_destroy(c);
    osp_kv_offload_destroy(a);
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 42, &a), OSP_OK);
    assert_int_equal(osp_kv_offload_get_stats(a).found_at_start, 3);
    osp_kv_offload_destroy(a);
    rm_tree(dir);
}

/* A file system with room for `limit` block files (ENOSPC beyond; full: none at all), and a clock. */
typedef struct fake_disk {
    const char *dir; /* the store's directory, once known */
    int limit;
    bool full;
    int64_t writes;  /* write attempts seen */
    double now;
} fake_disk;
static int fake_fault(void *ctx) {
    fake_disk *f = ctx;
    f->writes++;
    if (f->full || (f->dir && count_files(f->dir, ".kv") >= f->limit)) return ENOSPC;
    return 0;
}
static double fake_clock(void *ctx) { return ((fake_disk *)ctx)->now; }

/* Item: a full disk. A write that fails with ENOSPC removes the tier's oldest blocks (4) and retries: with
 * room then, the block is stored. Still failing, disk writes pause (10 s, doubling while full, back to
 * 10 s after a write succeeds): the saves in between try nothing and evict nothing (counted in
 * io_errors), and the blocks on disk are still read. */
static void test_disk_full(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    fake_disk fd = {.limit = 10, .now = 100.0};
    const osp_kv_offload_config cfg = {.disk_dir = dir, .disk_bytes = 16 * (BB + 72), .test_write_fault = fake_fault,
                                       .test_clock = fake_clock, .test_ctx = &fd};
    osp_kv_offload *o;
    uint8_t b[BB], got[BB];
    assert_int_equal(osp_kv_offload_create(&cfg, BB, 8, &o), OSP_OK);
    fd.dir = osp_kv_offload_disk_path(o);
    for (uint64_t i = 1; i <= 11; i++) { /* the 11th finds the disk full: 1..4 go, then it is written */
        const osp_block_hash h = hash_of(i);
        fill(b, i);
        osp_kv_offload_put(o, &h, b);
    }
    osp_kv_offload_stats st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.io_errors, 0);
    assert_int_equal(st.full_freed, 4);
    assert_int_equal(st.disk_full, 0);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 7);
    assert_int_equal(count_files(fd.dir, ".kv"), 7);
    for (uint64_t i = 1; i <= 11; i++) {
        const osp_block_hash h = hash_of(i);
        assert_int_equal(osp_kv_offload_where(o, &h), i <= 4 ? -1 : OSP_KV_TIER_DISK);
    }
    /* full of other files: 5..8 go, the retry fails too: writes pause 10 s */
    fd.full = true;
    const osp_block_hash h12 = hash_of(12), h13 = hash_of(13), h14 = hash_of(14), h15 = hash_of(15), h16 = hash_of(16);
    fill(b, 12);
    osp_kv_offload_put(o, &h12, b);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.disk_full, 1);
    assert_int_equal(st.io_errors, 1);
    assert_int_equal(st.full_freed, 8);
    assert_true(st.full_pause_s == 10.0);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 3);
    assert_int_equal(osp_kv_offload_where(o, &h12), -1);
    assert_non_null(osp_kv_offload_full_error(o));
    /* paused: no write tried, nothing evicted, the blocks on disk still load */
    fd.now += 5;
    const int64_t writes = fd.writes;
    fill(b, 13);
    osp_kv_offload_put(o, &h13, b);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(fd.writes, writes);
    assert_int_equal(st.io_errors, 2);
    assert_int_equal(st.full_skipped, 1);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 3);
    assert_int_equal(osp_kv_offload_where(o, &h13), -1);
    for (uint64_t i = 9; i <= 11; i++) {
        const osp_block_hash h = hash_of(i);
        assert_true(osp_kv_offload_get(o, &h, got));
        fill(b, i);
        assert_memory_equal(got, b, BB);
    }
    /* past the pause, still full: it tries again, frees what is left, pauses twice as long */
    fd.now += 6;
    fill(b, 14);
    osp_kv_offload_put(o, &h14, b);
    st = osp_kv_offload_get_stats(o);
    assert_true(fd.writes > writes);
    assert_int_equal(st.disk_full, 2);
    assert_true(st.full_pause_s == 20.0);
    assert_int_equal(st.blocks[OSP_KV_TIER_DISK], 0);
    /* room again after the pause: written; the next full disk pauses 10 s again */
    fd.full = false;
    fd.now += 21;
    fill(b, 15);
    osp_kv_offload_put(o, &h15, b);
    assert_true(osp_kv_offload_get(o, &h15, got));
    assert_memory_equal(got, b, BB);
    fd.full = true;
    fill(b, 16);
    osp_kv_offload_put(o, &h16, b);
    st = osp_kv_offload_get_stats(o);
    assert_int_equal(st.disk_full, 3);
    assert_true(st.full_pause_s == 10.0);
    assert_int_equal(st.corrupt, 0);
    assert_int_equal(count_files(fd.dir, ".tmp"), 0);
    osp_kv_offload_destroy(o);
    rm_tree(dir);
}

static void test_bad_config(void **state) {
    (void)state;
    osp_kv_offload *o = (osp_kv_offload *)1;
    const osp_kv_offload_config none = {0}, tiny_host = {.host_bytes = BB - 1},
                                no_size = {.disk_dir = "/tmp/osprey-test-offload-never"},
                                not_dir = {.disk_dir = "/dev/null/x", .disk_bytes = 1 << 20};
    assert_int_equal(osp_kv_offload_create(&none, BB, 1, &o), OSP_ERR_INVALID_ARG);
    assert_null(o);
    assert_int_equal(osp_kv_offload_create(&tiny_host, BB, 1, &o), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_offload_create(&no_size, BB, 1, &o), OSP_ERR_INVALID_ARG);
    assert_int_equal(osp_kv_offload_create(&not_dir, BB, 1, &o), OSP_ERR_IO);
    assert_null(o);
}

/* ---- the engine ---------------------------------------------------------------------------------- */

#define MAXOUT 16

typedef struct job {
    int32_t prompt[96];
    int32_t n_prompt, max_tokens;
    int32_t out[MAXOUT];
    int32_t n_out, cached;
} job;

static void make_job(job *j, uint32_t seed, int32_t n_prompt) {
    memset(j, 0, sizeof *j);
    srand(seed);
    j->n_prompt = n_prompt;
    for (int t = 0; t < n_prompt; t++) j->prompt[t] = 3 + rand() % 500;
    j->max_tokens = 6;
}

static osp_engine_params base(const char *disk_dir) {
    osp_engine_params p = osp_engine_default_params();
    p.model_path = g_tiny;
    p.n_threads = 2;
    p.kv_dtype = OSP_KV_DTYPE_F32;
    p.max_model_len = 256;
    p.num_blocks = 8; /* 128 slots: one 80-token request at a time keeps its blocks until the next */
    p.check_invariants = true;
    p.hash_seed_set = true;
    p.hash_seed = 11;
    p.kv_offload_no_cost_model = true; /* the decision must not depend on timing */
    p.device = TEST_DEVICE;
    if (disk_dir) {
        p.kv_offload_host_bytes = 0;
        p.kv_offload_disk_dir = disk_dir;
        p.kv_offload_disk_bytes = 64ll << 20;
    }
    return p;
}

/* Runs the jobs one after another through engine e (each to completion). */
static void run_seq(osp_engine *e, job *j, int n) {
    for (int i = 0; i < n; i++) {
        osp_request_params rp = osp_request_default_params();
        static uint64_t id = 1;
        rp.request_id = id++;
        rp.prompt = j[i].prompt;
        rp.num_prompt = j[i].n_prompt;
        rp.max_tokens = j[i].max_tokens;
        rp.ignore_eos = true;
        assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
        while (osp_engine_has_unfinished(e)) assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
        osp_request_output o;
        assert_int_equal(osp_engine_poll(e, rp.request_id, j[i].out, MAXOUT, &o, 0), OSP_OK);
        assert_true(o.finished);
        j[i].n_out = o.num_tokens;
        j[i].cached = o.num_cached_tokens;
        assert_int_equal(j[i].n_out, j[i].max_tokens);
    }
}

typedef struct events {
    int64_t removed, tier_stored, tier_removed;
    bool media_ok;
} events;
static void ev_removed(void *ctx, uint64_t h) {
    (void)h;
    ((events *)ctx)->removed++;
}
static void ev_tier_stored(void *ctx, uint64_t h, const char *medium) {
    (void)h;
    events *v = ctx;
    v->media_ok = (v->tier_stored == 0 || v->media_ok) && !strcmp(medium, "DISK");
    v->tier_stored++;
}
static void ev_tier_removed(void *ctx, uint64_t h, const char *medium) {
    (void)h, (void)medium;
    ((events *)ctx)->tier_removed++;
}

/* A, then B and C (which evict A's blocks from the 8-block pool), then A again. */
static void scenario(job *j) {
    make_job(&j[0], 1, 80);
    make_job(&j[1], 2, 80);
    make_job(&j[2], 3, 80);
    j[3] = j[0];
}

static void test_engine_offload(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    job ref[4], on[4], again[4], bad[4];
    scenario(ref);
    scenario(on);
    scenario(again);
    scenario(bad);
    osp_engine *e;
    osp_engine_params p = base(NULL);
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    run_seq(e, ref, 4);
    const size_t block_bytes = osp_kv_cache_block_bytes((osp_kv_cache *)osp_engine_kv_cache(e));
    osp_engine_free(e);
    assert_int_equal(ref[3].cached, 0); /* evicted: without offload the second A recomputes */
    assert_memory_equal(ref[0].out, ref[3].out, sizeof ref[0].out);

    p = base(dir);
    p.kv_offload_host_bytes = 2 * (int64_t)block_bytes; /* the CPU backend takes no host tier; CUDA: 2 blocks */
    if (!g_gpu) {
        e = NULL;
        assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_INVALID_ARG);
        assert_null(e);
        p.kv_offload_host_bytes = 0;
    }
    events ev = {0};
    const osp_kv_event_sink sink = {.ctx = &ev, .block_removed = ev_removed, .tier_stored = ev_tier_stored,
                                    .tier_removed = ev_tier_removed};
    p.kv_event_sink = &sink;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    run_seq(e, on, 4);
    osp_engine_stats st = osp_engine_get_stats(e);
    osp_engine_free(e);
    assert_int_equal(on[3].cached, 4 * 16); /* (80 - 1) / 16 blocks, each loaded back */
    assert_int_equal(st.offload_hits_tokens, 4 * 16);
    assert_int_equal(st.offload_loaded_blocks, 4);
    assert_true(st.offload_disk_blocks > 0 && st.offload_host_blocks == (g_gpu ? 2 : 0));
    for (int i = 0; i < 4; i++) assert_memory_equal(on[i].out, ref[i].out, sizeof ref[i].out);
    /* every block evicted from the pool (a removal event) was stored into a tier once (a DISK event on
       the CPU; on CUDA a CPU event, and a CPU removal + DISK store for each move down) */
    assert_int_equal(ev.tier_stored, st.offload_stored_blocks);
    if (!g_gpu) {
        assert_int_equal(ev.tier_stored, ev.removed);
        assert_int_equal(ev.tier_removed, 0);
        assert_true(ev.media_ok);
    } else {
        assert_int_equal(ev.tier_stored, ev.removed + ev.tier_removed);
    }

    /* a new engine on the same directory: A is served from the first engine's files at once (the host
       tier's blocks went with the first engine: B's and C's, the last evicted) */
    p.kv_event_sink = NULL;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    run_seq(e, &again[3], 1);
    st = osp_engine_get_stats(e);
    osp_engine_free(e);
    assert_int_equal(again[3].cached, 4 * 16);
    assert_int_equal(st.offload_hits_tokens, 4 * 16);
    assert_memory_equal(again[3].out, ref[3].out, sizeof ref[3].out);

    /* every file corrupted: recomputed, the same tokens, counted */
    char sub[512];
    DIR *d = opendir(dir);
    assert_non_null(d);
    sub[0] = '\0';
    for (struct dirent *de; (de = readdir(d)) != NULL;)
        if (!strncmp(de->d_name, "osprey-kv-", 10)) snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
    closedir(d);
    assert_true(sub[0] != '\0');
    d = opendir(sub);
    int n_bad = 0;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (de->d_name[0] == '.') continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", sub, de->d_name);
        FILE *f = fopen(path, "r+b");
        assert_non_null(f);
        fseek(f, 100, SEEK_SET);
        const int c = fgetc(f);
        fseek(f, 100, SEEK_SET);
        fputc(c ^ 1, f);
        fclose(f);
        n_bad++;
    }
    closedir(d);
    assert_true(n_bad > 0);
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    run_seq(e, &bad[3], 1);
    st = osp_engine_get_stats(e);
    osp_engine_free(e);
    assert_int_equal(bad[3].cached, 0);
    assert_true(st.offload_corrupt_blocks >= 1);
    assert_memory_equal(bad[3].out, ref[3].out, sizeof ref[3].out);
    rm_tree(dir);
}

typedef struct log_lines {
    int n, n_dir, n_xfer;
    char dir_line[1200];
} log_lines;
static void capture_log(void *ctx, const char *line) {
    log_lines *l = ctx;
    l->n++;
    if (strstr(line, "was removed or replaced")) l->n_dir++, snprintf(l->dir_line, sizeof l->dir_line, "%s", line);
    if (strstr(line, "kv transfer")) l->n_xfer++; /* no P/D here: a block a tier lost is not a remote fetch */
}

/* The disk tier's directory removed (rm -rf) while the engine runs: the prompt whose blocks were there is
 * recomputed with the same tokens, its blocks counted as missing (not corrupt), the disk gauge equals the
 * files really on disk afterwards, and one log line says the directory was made again. */
static void test_engine_dir_removed(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    job j[4];
    scenario(j);
    osp_engine_params p = base(dir);
    log_lines log = {0};
    p.log = capture_log;
    p.log_ctx = &log;
    osp_engine *e;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    run_seq(e, j, 3); /* A, B, C: A's blocks evicted to disk */
    osp_engine_stats st = osp_engine_get_stats(e);
    const int64_t on_disk = st.offload_disk_blocks;
    assert_true(on_disk >= 4);
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/", dir);
    DIR *d = opendir(dir);
    assert_non_null(d);
    sub[0] = '\0';
    for (struct dirent *de; (de = readdir(d)) != NULL;)
        if (!strncmp(de->d_name, "osprey-kv-", 10)) snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
    closedir(d);
    assert_true(sub[0] != '\0');
    assert_int_equal(count_files(sub, ".kv"), on_disk);
    rm_tree(sub);
    run_seq(e, &j[3], 1); /* A again */
    st = osp_engine_get_stats(e);
    osp_engine_free(e);
    assert_int_equal(j[3].cached, 0);
    assert_memory_equal(j[3].out, j[0].out, sizeof j[0].out);
    assert_int_equal(st.offload_corrupt_blocks, 0);
    assert_int_equal(st.offload_missing_blocks, on_disk);
    assert_int_equal(st.offload_write_errors, 0);
    assert_int_equal(st.offload_disk_blocks, count_files(sub, ".kv")); /* made again; only real files */
    assert_int_equal(log.n_dir, 1);
    assert_int_equal(log.n_xfer, 0);
    assert_non_null(strstr(log.dir_line, "made it again"));
    assert_non_null(strstr(log.dir_line, sub));
    rm_tree(dir);
}

typedef struct start_lines {
    int n_foreign, n_trimmed;
    char foreign[1200], trimmed[1200];
} start_lines;
static void capture_start(void *ctx, const char *line) {
    start_lines *l = ctx;
    if (strstr(line, "another prefix-cache hash seed")) l->n_foreign++, snprintf(l->foreign, sizeof l->foreign, "%s", line);
    if (strstr(line, "to fit --kv-offload-disk-size")) l->n_trimmed++, snprintf(l->trimmed, sizeof l->trimmed, "%s", line);
}

/* Restarts on one directory, through the engine: under another --prefix-caching-hash-seed the earlier
 * blocks are removed with one line (nothing found, the prompt recomputed with the same tokens); a smaller
 * --kv-offload-disk-size removes the oldest blocks with one line naming the count; a second engine on the
 * directory while one runs is refused (OSP_ERR_IO, the message naming the directory and the flag). */
static void test_engine_restarts(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    job j[4], k[4];
    scenario(j);
    scenario(k);
    osp_engine_params p = base(dir);
    osp_engine *e, *e2 = (osp_engine *)1;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    run_seq(e, j, 3); /* A's blocks go to disk */
    const int64_t on_disk = osp_engine_get_stats(e).offload_disk_blocks;
    const size_t block_bytes = osp_kv_cache_block_bytes((osp_kv_cache *)osp_engine_kv_cache(e));
    assert_true(on_disk >= 4);
    /* a second engine on the same directory: refused, the first one's blocks untouched */
    osp_engine_params p2 = p;
    p2.hash_seed = 12;
    assert_int_equal(osp_engine_create(&p2, &e2), OSP_ERR_IO);
    assert_null(e2);
    assert_non_null(strstr(osp_last_error(), dir));
    assert_non_null(strstr(osp_last_error(), "--kv-offload-disk"));
    osp_engine_free(e);
    /* another seed: the blocks are removed, one line says so */
    start_lines log = {0};
    p2.log = capture_start;
    p2.log_ctx = &log;
    assert_int_equal(osp_engine_create(&p2, &e), OSP_OK);
    osp_engine_stats st = osp_engine_get_stats(e);
    assert_int_equal(st.offload_disk_blocks, 0);
    assert_int_equal(log.n_foreign, 1);
    char want[64];
    snprintf(want, sizeof want, "removed %lld blocks", (long long)on_disk);
    assert_non_null(strstr(log.foreign, want));
    char log_foreign[1200];
    snprintf(log_foreign, sizeof log_foreign, "%s", log.foreign);
    run_seq(e, &k[3], 1); /* A: nothing of it on disk now */
    run_seq(e, k, 3);     /* B and C push A's blocks (this seed's) to disk */
    osp_engine_free(e);
    assert_int_equal(k[3].cached, 0);
    assert_memory_equal(k[3].out, j[0].out, sizeof j[0].out);
    /* the same seed again with room for 2 blocks: the oldest removed, one line with the count */
    memset(&log, 0, sizeof log);
    p2.kv_offload_disk_bytes = 2 * ((int64_t)block_bytes + 72);
    assert_int_equal(osp_engine_create(&p2, &e), OSP_OK);
    st = osp_engine_get_stats(e);
    osp_engine_free(e);
    assert_int_equal(st.offload_disk_blocks, 2);
    assert_int_equal(log.n_foreign, 0);
    assert_int_equal(log.n_trimmed, 1);
    assert_non_null(strstr(log.trimmed, "oldest"));
    assert_non_null(strstr(log.trimmed, "2 most recent are kept"));
    printf("%s\n%s\n", log_foreign, log.trimmed);
    rm_tree(dir);
}

/* A request whose blocks load from disk in the background waits for them (nothing of it is scheduled
 * in the step that started the load); aborted then, the load is cancelled and every block comes back
 * (invariants checked each step, pending loads' blocks included); an engine freed with a load in flight
 * frees it. The prompt then runs normally, loaded, with the same tokens. */
static void test_engine_abort_while_loading(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    job ref[4], j[4];
    scenario(ref);
    scenario(j);
    osp_engine_params p = base(NULL);
    osp_engine *e;
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    run_seq(e, ref, 1);
    osp_engine_free(e);
    p = base(dir);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
        if (round == 0) run_seq(e, j, 3); /* A's blocks go to disk */
        osp_request_params rp = osp_request_default_params();
        rp.request_id = 999;
        rp.prompt = j[3].prompt;
        rp.num_prompt = j[3].n_prompt;
        rp.max_tokens = j[3].max_tokens;
        rp.ignore_eos = true;
        assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
        bool did = true;
        assert_int_equal(osp_engine_step(e, &did), OSP_OK);
        assert_false(did); /* the load started; nothing ran */
        const osp_engine_stats st = osp_engine_get_stats(e);
        assert_true(st.num_free_blocks < st.num_blocks); /* its blocks are held meanwhile */
        if (round == 1) { /* freed with the load in flight */
            osp_engine_free(e);
            continue;
        }
        assert_int_equal(osp_engine_abort(e, 999), OSP_OK);
        while (osp_engine_has_unfinished(e)) assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
        assert_int_equal(osp_engine_step(e, NULL), OSP_OK); /* the cancelled buffers are collected */
        const osp_engine_stats st2 = osp_engine_get_stats(e);
        assert_int_equal(st2.num_free_blocks, st2.num_blocks);
        osp_engine_free(e);
    }
    assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
    run_seq(e, &j[3], 1);
    osp_engine_free(e);
    assert_int_equal(j[3].cached, 4 * 16);
    assert_memory_equal(j[3].out, ref[0].out, sizeof ref[0].out);
    rm_tree(dir);
}

/* Eight requests at once, half sharing prefixes, in a pool that forces preemption: offload on and off
 * give the same tokens. */
static void test_engine_offload_batch(void **state) {
    (void)state;
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    job j[2][8];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 8; i++) {
            make_job(&j[k][i], 40 + (uint32_t)i / 2, 20 + 9 * i);
            j[k][i].max_tokens = 10 + i % 5;
        }
        osp_engine_params p = base(k ? dir : NULL);
        p.num_blocks = 12;
        osp_engine *e;
        assert_int_equal(osp_engine_create(&p, &e), OSP_OK);
        for (int round = 0; round < 2; round++) { /* the second round finds its prefixes in the tier */
            for (int i = 0; i < 8; i++) {
                osp_request_params rp = osp_request_default_params();
                rp.request_id = (uint64_t)(100 * round + i);
                rp.prompt = j[k][i].prompt;
                rp.num_prompt = j[k][i].n_prompt;
                rp.max_tokens = j[k][i].max_tokens;
                rp.ignore_eos = true;
                assert_int_equal(osp_engine_add(e, &rp), OSP_OK);
            }
            while (osp_engine_has_unfinished(e)) assert_int_equal(osp_engine_step(e, NULL), OSP_OK);
            for (int i = 0; i < 8; i++) {
                osp_request_output o;
                int32_t out[MAXOUT] = {0};
                assert_int_equal(osp_engine_poll(e, (uint64_t)(100 * round + i), out, MAXOUT, &o, 0), OSP_OK);
                assert_int_equal(o.num_tokens, j[k][i].max_tokens);
                if (round == 0) memcpy(j[k][i].out, out, sizeof out);
                else assert_memory_equal(out, j[k][i].out, sizeof(int32_t) * (size_t)o.num_tokens);
            }
        }
        const osp_engine_stats st = osp_engine_get_stats(e);
        if (k) assert_true(st.offload_stored_blocks > 0 && st.offload_hits_tokens > 0);
        printf("offload %s: preemptions %lld, stored %lld, loaded %lld, hits %lld tokens\n", k ? "on" : "off", (long long)st.num_preemptions, (long long)st.offload_stored_blocks, (long long)st.offload_loaded_blocks, (long long)st.offload_hits_tokens);
        osp_engine_free(e);
    }
    for (int i = 0; i < 8; i++) assert_memory_equal(j[0][i].out, j[1][i].out, sizeof j[0][i].out);
    rm_tree(dir);
}

static void test_engine_refusals(void **state) {
    (void)state;
    osp_engine_params p = base("/tmp/osprey-test-offload-refused");
    p.enable_prefix_caching = false;
    osp_engine *e = NULL;
    assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_UNSUPPORTED);
    assert_null(e);
    p = base("/tmp/osprey-test-offload-refused");
    p.kv_offload_disk_bytes = 100; /* less than one block */
    assert_int_equal(osp_engine_create(&p, &e), OSP_ERR_INVALID_ARG);
    rmdir("/tmp/osprey-test-offload-refused");
}

int main(void) {
    const char *root = getenv("OSPREY_ROOT");
    snprintf(g_tiny, sizeof g_tiny, "%s/tests/models/tiny-llama-f32.gguf", root ? root : ".");
    if (g_gpu && osp_device_count(OSP_DEVICE_CUDA) == 0) {
        printf("test_gpu_kv_offload: skipped: no CUDA device\n");
        return 77;
    }
    if (g_gpu && gpu_test_model("gpu-offload-f32", "f32", g_tiny, sizeof g_tiny) != 0) return 1;
    const struct CMUnitTest store[] = {
        cmocka_unit_test(test_host_tier),
        cmocka_unit_test(test_disk_tier),
        cmocka_unit_test(test_disk_persists),
        cmocka_unit_test(test_disk_dir_removed),
        cmocka_unit_test(test_disk_hash_identity),
        cmocka_unit_test(test_disk_smaller_size),
        cmocka_unit_test(test_disk_lock),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_bad_config),
    };
    int rc = cmocka_run_group_tests(store, NULL, NULL);
    FILE *f = fopen(g_tiny, "rb");
    if (!f) {
        fprintf(stderr, "SKIP engine tests: %s missing\n", g_tiny);
        return rc;
    }
    fclose(f);
    const struct CMUnitTest engine[] = {
        cmocka_unit_test(test_engine_offload),
        cmocka_unit_test(test_engine_dir_removed),
        cmocka_unit_test(test_engine_restarts),
        cmocka_unit_test(test_engine_offload_batch),
        cmocka_unit_test(test_engine_abort_while_loading),
        cmocka_unit_test(test_engine_refusals),
    };
    rc |= cmocka_run_group_tests(engine, NULL, NULL);
    if (g_gpu) remove(g_tiny);
    return rc;
}
