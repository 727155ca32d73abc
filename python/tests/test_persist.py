"""Persistence from Python: PagedCache snapshots (files and bytes) load back the same K/V into
another cache (at another position base in rope_mode='on_read', checked against a float64
rotation); refusals (another model id or layout, a flipped byte, a truncated file, too few free
blocks) raise the mapped exception and leave the target unchanged; snapshot_inspect describes a
file; DeepSeek-V4 sequences round-trip; PrefixCache reuses blocks under one salt only, and its
edits make earlier plans stale."""

import numpy as np
import pytest

import kvcore
from conftest import rotate_neox

KW = dict(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=24, block_size=4, rope=kvcore.RopeSpec.plain(64, 1e4))


def filled(rng, rope_mode="on_read", k_format="f32", **extra):
    cache = kvcore.PagedCache(**KW, rope_mode=rope_mode, k_format=k_format, **extra)
    a = cache.create()
    k = rng.standard_normal((2, 11, 2, 64)).astype(np.float32)
    cache.append(a, list(range(11)), k, 0.5 * k)
    cache.shift(a, 2, 4)  # 7 live tokens at positions 0..6 in 11 cells
    b = cache.fork(a)
    kb = rng.standard_normal((2, 3, 2, 64)).astype(np.float32)
    cache.append(b, [7, 8, 9], kb, kb)
    return cache, a, b


def reads(cache, seq):
    return [cache.read(seq, layer) for layer in range(2)]


def assert_same(x, y):
    for (px, kx, vx), (py, ky, vy) in zip(x, y):
        np.testing.assert_array_equal(px, py)
        np.testing.assert_array_equal(kx, ky)
        np.testing.assert_array_equal(vx, vy)


@pytest.mark.parametrize("rope_mode,k_format", [("on_read", "f32"), ("stored", "fp8"), ("stored", "f16")])
def test_save_and_load_give_the_same_sequences(tmp_path, rng, rope_mode, k_format):
    src, a, b = filled(rng, rope_mode, k_format)
    path = tmp_path / "seqs.kvcsnap"
    src.save(path, "model-x", seqs=[a, b])
    dst = kvcore.PagedCache(**KW, rope_mode=rope_mode, k_format=k_format)
    dst.create()  # ids differ from the source's
    ids = dst.load(str(path), "model-x")
    assert list(ids) == [a, b] and len(set(ids.values())) == 2
    assert_same(reads(src, a), reads(dst, ids[a]))
    assert_same(reads(src, b), reads(dst, ids[b]))
    # The fork's shared blocks are shared again.
    assert dst.stats().blocks_shared == src.stats().blocks_shared > 0
    # The same through bytes.
    data = src.snapshot(b"model-x")
    again = kvcore.PagedCache(**KW, rope_mode=rope_mode, k_format=k_format)
    ids2 = again.restore(data, "model-x")
    assert_same(reads(src, b), reads(again, ids2[b]))
    info = kvcore.snapshot_inspect(path)
    assert info["kind"] == "paged" and info["model_id"] == b"model-x" and info["block_size"] == 4
    assert [s["saved_id"] for s in info["seqs"]] == [a, b]
    assert info["seqs"][0]["n_live"] == 7 and info["seqs"][1]["n_live"] == 10
    assert kvcore.snapshot_inspect(data)["seqs"] == info["seqs"]
    assert "model-x" in kvcore.snapshot_describe(path)


def test_rope_on_read_loads_at_another_position_base(tmp_path, rng):
    src, a, _ = filled(rng)
    _, k_src, _ = src.read(a, 0)
    pos_src = src.read(a, 0)[0]
    data = src.snapshot("m", seqs=[a])
    dst = kvcore.PagedCache(**KW, rope_mode="on_read", k_format="f32")
    new = dst.restore(data, "m", position_delta=100)[a]
    pos, k, _ = dst.read(new, 0)
    np.testing.assert_array_equal(pos, pos_src + 100)
    # K read back is rotated at the new positions: rotating the source's K by 100 more is the oracle.
    np.testing.assert_allclose(k, rotate_neox(k_src, np.full(len(pos), 100.0)[:, None], 64, 1e4), atol=2e-5)


def test_refused_loads_change_nothing(tmp_path, rng):
    src, a, b = filled(rng)
    path = tmp_path / "s.kvcsnap"
    src.save(path, "model-x")
    data = path.read_bytes()
    dst, da, _ = filled(np.random.default_rng(9))
    before = dst.debug_state()
    with pytest.raises(kvcore.InvalidArgumentError, match="model"):
        dst.load(path, "model-y")
    other = kvcore.PagedCache(**dict(KW, head_dim=128, rope=kvcore.RopeSpec.plain(128, 1e4)))
    with pytest.raises(ValueError, match="fingerprint|layout"):
        other.restore(data, "model-x")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    for bad in (bytes(flipped), data[: len(data) - 9], data[:40]):
        with pytest.raises(kvcore.CorruptError):
            dst.restore(bad, "model-x")
        with pytest.raises(RuntimeError):
            kvcore.snapshot_inspect(bad)
    small = kvcore.PagedCache(**dict(KW, num_blocks=3), rope_mode="on_read", k_format="f32")
    with pytest.raises(MemoryError):
        small.restore(data, "model-x")
    assert small.stats().blocks_used == 0
    assert dst.debug_state() == before
    with pytest.raises(kvcore.InvalidArgumentError, match="model_id"):
        dst.load(path, 3.5)
    with pytest.raises(TypeError):
        dst.load(42, "model-x")


def test_plans_go_stale_when_a_load_adds_sequences(rng):
    src, a, _ = filled(rng)
    data = src.snapshot("m")
    plan = src.plan([a])
    src.restore(data, "m")
    assert plan.is_stale
    with pytest.raises(ValueError, match="stale"):
        plan.run(0, np.zeros((1, 4, 64), np.float32))


def test_dsv4_sequence_round_trip(tmp_path):
    cfg = dict(head_dim=512, n_rot=64, window=8, max_context=64, max_seqs=2)
    src = kvcore.Dsv4Cache(["window", "window"], **cfg)
    dst = kvcore.Dsv4Cache(["window", "window"], **cfg)
    s = src.create()
    d = dst.create()
    rng = np.random.default_rng(4)
    for pos in range(11):  # past the window: the ring wraps
        for layer in range(2):
            src.append(s, layer, pos, rng.standard_normal((1, 512)).astype(np.float32))
    src.save(s, tmp_path / "d.kvcsnap", "v4")
    with pytest.raises(kvcore.InvalidArgumentError):
        dst.load(d, tmp_path / "d.kvcsnap", "v3")
    assert dst.length(d, 1) == 0
    dst.load(d, tmp_path / "d.kvcsnap", "v4")
    for layer in range(2):
        assert dst.length(d, layer) == 11
        np.testing.assert_array_equal(dst.read_window(d, layer), src.read_window(s, layer))
    info = kvcore.snapshot_inspect(tmp_path / "d.kvcsnap")
    assert info["kind"] == "dsv4" and info["dsv4_lengths"] == [11, 11]
    other = dst.create()
    dst.restore(other, src.snapshot(s, "v4"), "v4")
    np.testing.assert_array_equal(dst.read_window(other, 0), src.read_window(s, 0))


def test_prefix_cache_reuses_blocks_under_one_salt(rng):
    cache = kvcore.PagedCache(**KW)
    prefix = kvcore.PrefixCache(cache, seed=7)
    prompt = list(range(500, 510))
    seq, reused = prefix.create(prompt, salt="tenant-a")
    assert reused == 0
    k = rng.standard_normal((2, 10, 2, 64)).astype(np.float32)
    cache.append(seq, list(range(10)), k, k)
    assert prefix.publish(seq, prompt, salt="tenant-a") == 8
    hit, reused = prefix.create(prompt + [1, 2], salt="tenant-a")
    assert reused == 8 and cache.info(hit).n_live == 8
    miss, reused_b = prefix.create(prompt, salt=b"tenant-b")
    assert reused_b == 0
    for layer in range(2):
        p0, k0, v0 = cache.read(seq, layer)
        p1, k1, v1 = cache.read(hit, layer)
        np.testing.assert_array_equal(p1, p0[:8])
        np.testing.assert_array_equal(k1, k0[:8])
    st = prefix.stats()
    assert (st.queries, st.hit_queries, st.blocks_hit, st.blocks_published, st.holders) == (3, 1, 2, 2, 1)
    # Edits through the prefix cache: a plan made before is stale; an edited prefix is not published.
    plan = cache.plan([hit])
    prefix.truncate(seq, 5)
    assert plan.is_stale
    assert prefix.publish(seq, prompt[:5], salt="tenant-a") == 4
    for s in (seq, hit, miss):
        prefix.erase(s)
    assert cache.stats().blocks_used > 0  # held for later prompts
    assert prefix.evict(KW["num_blocks"])
    assert cache.stats().blocks_used == 0
    with pytest.raises(kvcore.InvalidArgumentError):
        prefix.publish(12345, prompt)
    with pytest.raises(TypeError):
        kvcore.PrefixCache("not a cache")


def test_prefix_cache_keeps_its_cache_alive(rng):
    cache = kvcore.PagedCache(**KW)
    prefix = kvcore.PrefixCache(cache)
    seq, _ = prefix.create([1, 2, 3, 4])
    del cache
    c = prefix.cache
    c.append(seq, [0, 1, 2, 3], np.ones((2, 4, 2, 64), np.float32), np.ones((2, 4, 2, 64), np.float32))
    assert prefix.publish(seq, [1, 2, 3, 4]) == 4
    del prefix  # erases its holders; the cache stays usable through c
    assert c.stats().sequences == 1
