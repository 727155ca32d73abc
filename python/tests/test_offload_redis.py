"""kvcore.RedisStore below a BlockOffloader, against a redis-server of the test's own (a free
loopback port, requirepass): values demoted to the server load back bit for bit; a wrong password
or a killed server makes the tier fail its puts and miss its gets, never raise or serve wrong K/V,
while the offloader goes on. Skipped only where kvcore was built without hiredis; with it, a test
that cannot start its server fails."""

import shutil
import socket
import subprocess
import time

import numpy as np
import pytest

import kvcore
from test_offload import KW, assert_same, keys, seq_bytes, three_sequences

pytestmark = pytest.mark.skipif(not kvcore.redis_compiled(), reason="kvcore built without hiredis (no RedisStore)")
PASSWORD = "kvcore-py-test-pw"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_port(tmp_path):
    exe = shutil.which("redis-server")
    assert exe, "redis-server is not installed (Debian: redis-server; scripts/deps.sh installs it)"
    for _ in range(3):  # another process may take the port between free_port() and the server's bind
        port = free_port()
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", PASSWORD,
                                 "--dir", str(tmp_path), "--save", "", "--appendonly", "no", "--daemonize", "no"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = kvcore.RedisStore("127.0.0.1", port, password=PASSWORD, backoff_initial_ms=1, backoff_max_ms=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None and not probe.ping():
            time.sleep(0.02)
        if proc.poll() is None and probe.ping():
            yield port, proc
            proc.kill()
            proc.wait()
            return
        proc.kill()
        proc.wait()
    pytest.fail("could not start redis-server")


def test_values_demoted_to_redis_load_back_bit_for_bit(rng, redis_port):
    port, proc = redis_port
    cache = kvcore.PagedCache(**KW, k_format="fp8", v_format="fp8", rope_mode="stored")
    seqs = three_sequences(cache, rng)
    want = [seq_bytes(cache, s) for s in seqs]
    ks = keys(cache, 3)
    redis = kvcore.RedisStore("127.0.0.1", port, password=PASSWORD, key_prefix="kvc:pytest:")
    off = kvcore.BlockOffloader(cache, pinned_bytes=cache.stats().bytes_per_block * 6, lower=redis, model_id="m")
    for s, k in zip(seqs, ks):
        assert off.offload(s, k)
    off.flush()
    for s in seqs:
        cache.erase(s)
    assert redis.stats().puts >= 2 and sum(redis.contains(k) for k in ks) >= 2
    for i, k in enumerate(ks):
        got = off.load(k)
        assert got is not None
        assert_same(seq_bytes(cache, got), want[i], f"value {i} via redis")
        cache.erase(got)
    assert off.stats().lower_hits >= 2 and off.stats().misses == 0

    # The server gone: the tier misses and fails its puts; nothing raises, the offloader goes on.
    proc.kill()
    proc.wait()
    fresh = kvcore.BlockOffloader(cache, pinned_bytes=cache.stats().bytes_per_block * 6, lower=redis, model_id="m")
    before = cache.debug_state()
    assert fresh.load(ks[0]) is None and cache.debug_state() == before
    first, second = cache.create(), cache.create()
    for seq, n in ((first, 40), (second, 16)):
        k = rng.standard_normal((2, n, 2, 64)).astype(np.float32)
        cache.append(seq, list(range(n)), k, k)
    assert fresh.offload(first, kvcore.StoreKey.for_tokens(cache, [5] * 40))
    assert fresh.offload(second, kvcore.StoreKey.for_tokens(cache, [6] * 16))  # sends `first` down: refused
    fresh.flush()
    assert fresh.stats().demote_failures == 1 and fresh.stats().demoted == 0
    assert redis.stats().down and fresh.stats().misses == 1


def test_a_wrong_password_is_a_tier_that_misses(rng, redis_port):
    port, _ = redis_port
    cache = kvcore.PagedCache(**KW, k_format="f16")
    seqs = three_sequences(cache, rng)
    ks = keys(cache, 3)
    bad = kvcore.RedisStore("127.0.0.1", port, password="wrong")
    assert not bad.ping()
    off = kvcore.BlockOffloader(cache, pinned_bytes=cache.stats().bytes_per_block * 6, lower=bad, model_id="m")
    for s, k in zip(seqs, ks):
        assert off.offload(s, k)
    off.flush()
    st = off.stats()
    assert st.demoted == 0 and st.demote_failures >= 2
    for s in seqs:
        cache.erase(s)
    assert off.load(ks[0]) is None and off.stats().misses == 1
    assert bad.stats().down
