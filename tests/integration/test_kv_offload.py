"""Tiered KV offload through the server (issue 18): `osprey serve --kv-offload-disk DIR
--kv-offload-disk-size GIB` with a KV cache of a few blocks. A prompt whose blocks later prompts evicted
is served from the disk tier on its second run (osprey:kv_offload_hit_tokens and vLLM's prefix-cache
hits rise) with the same greedy text; a restarted server on the same directory, with the same hash seed,
serves it from the first server's files; a corrupted file is recomputed (counted), never used. Loads
are forced (OSPREY_KV_OFFLOAD_ALWAYS_LOAD=1) so the outcome does not depend on the measured costs. Runs
in both suite modes (with OSPREY_ENGINE_PROCESS=1 the flags reach the engine core child too)."""
import glob
import os
import shutil
import tempfile

import pytest
import requests

from conftest import TINY, Server


def metric(server, name):
    for line in requests.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.split()[-1])
    return None


PROMPTS = [" ".join(f"{w}{i}" for i in range(40)) for w in ("alpha", "beta", "gamma")]


@pytest.fixture(scope="module")
def tier_dir():
    d = tempfile.mkdtemp(prefix="osprey-offload-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


def start(tier_dir, seed="7"):
    os.environ["OSPREY_KV_OFFLOAD_ALWAYS_LOAD"] = "1"
    try:
        # 16 blocks of 16 tokens (the tiny model's f16 blocks are 4 KiB): one ~100-token request at a time
        return Server(TINY, "--kv-cache-memory", "64K", "--kv-offload-disk", tier_dir,
                      "--kv-offload-disk-size", "0.01", "--prefix-caching-hash-seed", seed)
    finally:
        del os.environ["OSPREY_KV_OFFLOAD_ALWAYS_LOAD"]


def complete(s, prompt):
    r = s.client().completions.create(model=s.model, prompt=prompt, max_tokens=8, temperature=0)
    assert r.usage.completion_tokens == 8
    return r.choices[0].text


def stop(s):
    rc = s.stop()
    assert rc == 0, s.read_log()[-4000:]


def test_evicted_prefix_comes_back_from_disk(tier_dir):
    s = start(tier_dir)
    try:
        assert "KV offload: evicted prefix blocks go to disk" in s.read_log()
        first = complete(s, PROMPTS[0])
        complete(s, PROMPTS[1])
        complete(s, PROMPTS[2])  # the two later prompts evict the first one's blocks
        assert metric(s, "osprey:kv_offload_stored_blocks_total") > 0
        hits0 = metric(s, "vllm:prefix_cache_hits_total") or 0
        again = complete(s, PROMPTS[0])
        assert again == first
        assert metric(s, "osprey:kv_offload_hit_tokens_total") >= 16
        assert metric(s, "vllm:prefix_cache_hits_total") >= hits0 + 16
    finally:
        stop(s)


def test_restart_reads_the_files_and_skips_corrupt_ones(tier_dir):
    s = start(tier_dir)
    try:
        ref = complete(s, PROMPTS[1])
        # the first server's files: found at start, and this prompt's blocks are among them
        assert metric(s, "osprey:kv_offload_hit_tokens_total") >= 16, s.read_log()[-2000:]
    finally:
        stop(s)
    files = glob.glob(os.path.join(tier_dir, "osprey-kv-*", "*.kv"))
    assert files
    for f in files:  # one byte flipped in every block's payload
        with open(f, "r+b") as fh:
            fh.seek(100)
            b = fh.read(1)
            fh.seek(100)
            fh.write(bytes([b[0] ^ 1]))
    s = start(tier_dir)
    try:
        for p in PROMPTS:
            complete(s, p)  # loads fail their checksums: recomputed
        assert metric(s, "osprey:kv_offload_corrupt_blocks_total") >= 1
        assert complete(s, PROMPTS[1]) == ref
    finally:
        stop(s)


def test_directory_removed_while_serving():
    """rm -rf of the tier's directory under a running server: the prompt whose blocks were there is
    recomputed with the same text, its blocks counted as missing (not corrupt), the disk gauge equals
    the files really on disk afterwards, and one log line says the directory was made again. The KV
    cache (16 blocks) is smaller than the tiny model's max_model_len: the start-up warning says so."""
    d = tempfile.mkdtemp(prefix="osprey-offload-rm-")
    s = start(d)
    try:
        log = s.read_log()
        assert "less than one max_model_len sequence" in log and "--kv-cache-memory" in log, log[-3000:]
        first = complete(s, PROMPTS[0])
        complete(s, PROMPTS[1])
        complete(s, PROMPTS[2])  # PROMPTS[0]'s blocks are on disk now
        sub = glob.glob(os.path.join(d, "osprey-kv-*"))
        assert len(sub) == 1 and glob.glob(os.path.join(sub[0], "*.kv"))
        shutil.rmtree(sub[0])
        assert complete(s, PROMPTS[0]) == first
        assert metric(s, "osprey:kv_offload_missing_blocks_total") >= 1
        assert metric(s, "osprey:kv_offload_corrupt_blocks_total") == 0
        on_disk = len(glob.glob(os.path.join(sub[0], "*.kv")))
        gauge = None
        for line in requests.get(s.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("osprey:kv_offload_blocks{") and 'tier="disk"' in line:
                gauge = float(line.split()[-1])
        assert gauge == on_disk
        lines = [l for l in s.read_log().splitlines() if "was removed or replaced while serving" in l]
        assert len(lines) == 1 and "made it again" in lines[0], s.read_log()[-3000:]
    finally:
        stop(s)
        shutil.rmtree(d, ignore_errors=True)


def test_one_server_a_directory_and_one_seed():
    """A second server on a directory a running one uses does not start: the error names the directory
    and --kv-offload-disk, and the first server's files are untouched. A restart under another
    --prefix-caching-hash-seed removes the earlier blocks (no hash of its own could match them) with one
    start-up line, and computes the prompt again with the same text."""
    d = tempfile.mkdtemp(prefix="osprey-offload-lock-")
    s = start(d)
    try:
        first = complete(s, PROMPTS[0])
        complete(s, PROMPTS[1])
        complete(s, PROMPTS[2])
        files = sorted(glob.glob(os.path.join(d, "osprey-kv-*", "*.kv")))
        assert files
        with pytest.raises(RuntimeError) as err:
            start(d).stop()
        msg = str(err.value)
        assert "in use by another osprey process" in msg and d in msg and "--kv-offload-disk" in msg, msg[-3000:]
        assert sorted(glob.glob(os.path.join(d, "osprey-kv-*", "*.kv"))) == files
        assert complete(s, PROMPTS[0]) == first  # the first server serves on
    finally:
        stop(s)
    n = len(glob.glob(os.path.join(d, "osprey-kv-*", "*.kv")))
    s = start(d, seed="8")
    try:
        lines = [l for l in s.read_log().splitlines() if "another prefix-cache hash seed" in l]
        assert len(lines) == 1 and f"removed {n} blocks" in lines[0], s.read_log()[-3000:]
        disk = [l for l in requests.get(s.url + "/metrics", timeout=10).text.splitlines()
                if l.startswith("osprey:kv_offload_blocks{") and 'tier="disk"' in l]
        assert disk and float(disk[0].split()[-1]) == 0
        assert complete(s, PROMPTS[0]) == first
    finally:
        stop(s)
        shutil.rmtree(d, ignore_errors=True)
