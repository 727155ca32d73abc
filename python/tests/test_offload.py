"""kvcore.BlockOffloader and the stores below it, on the CPU (where every copy is synchronous):
sequences offloaded and loaded back hold exactly the pool bytes, positions and validity they had
(f16 and FP8, rope_mode 'stored' and 'on_read'), from pinned memory and after demotion to a
lower store; another model_id is a miss; bad input raises a kvcore.Error subclass naming the
argument and changes nothing; the offloader keeps its cache and lower store alive."""

import gc
import weakref

import numpy as np
import pytest

import kvcore

KW = dict(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=48, block_size=8, rope=kvcore.RopeSpec.plain(64, 1e4))


def append_random(cache, seq, n, rng, first=None):
    if first is None:
        first = cache.info(seq).last_position + 1
    k = rng.standard_normal((2, n, 2, 64)).astype(np.float32)
    v = rng.standard_normal((2, n, 2, 64)).astype(np.float32)
    cache.append(seq, list(range(first, first + n)), k, v)


def three_sequences(cache, rng):
    """a: truncated (stale cells past its span); b: a fork of a, extended; c: shifted (dead cells)."""
    a = cache.create()
    append_random(cache, a, 37, rng, 0)
    cache.truncate(a, 30)
    b = cache.fork(a)
    append_random(cache, b, 5, rng)
    c = cache.create()
    append_random(cache, c, 26, rng, 0)
    cache.shift(c, 4, 9)
    cache.prepare()
    return [a, b, c]


def pool_arrays(cache):
    out = []
    for layer in range(cache.n_layers):
        for view in (cache.k_pool(layer), cache.k_scales(layer), cache.v_pool(layer), cache.v_scales(layer)):
            if view is not None:
                out.append(view)
    return out


def seq_bytes(cache, seq):
    """Every byte the sequence's cells hold in every pool array (dead cells included), validity and
    live positions: what a round trip must keep bit for bit (cells past the last block's span excluded)."""
    t = cache.block_tables([seq])
    blocks = t["indices"][t["indptr"][0]:t["indptr"][1]]
    spans = [cache.block_size] * (len(blocks) - 1) + [int(t["last_page_len"][0])]
    parts = []
    for arr in pool_arrays(cache) + [cache.valid()]:
        for blk, span in zip(blocks, spans):
            parts.append(np.ascontiguousarray(arr[blk, :span]).view(np.uint8).ravel())
    for blk, span in zip(blocks, spans):  # positions of live cells (a dead cell's position means nothing)
        live = cache.valid()[blk, :span] != 0
        parts.append(np.where(live, cache.positions()[blk, :span], -1).astype(np.int32).view(np.uint8))
    reads = [cache.read(seq, layer) for layer in range(cache.n_layers)]
    return np.concatenate(parts), reads, cache.info(seq).n_live


def assert_same(got, want, what):
    gb, greads, glive = got
    wb, wreads, wlive = want
    assert glive == wlive, what
    assert gb.shape == wb.shape and np.array_equal(gb, wb), f"{what}: pool bytes differ"
    for (p0, k0, v0), (p1, k1, v1) in zip(greads, wreads):
        np.testing.assert_array_equal(p0, p1)
        np.testing.assert_array_equal(k0, k1)
        np.testing.assert_array_equal(v0, v1)


def dirty_free_blocks(cache, rng):
    """Fills every free block with other data and frees it again: a load must overwrite it all."""
    s = cache.create()
    append_random(cache, s, cache.stats().blocks_free * cache.block_size, rng, 0)
    cache.erase(s)


def keys(cache, n):
    return [kvcore.StoreKey.for_tokens(cache, [100 + i] * (i + 1), salt="t") for i in range(n)]


@pytest.mark.parametrize("k_format", ["f16", "fp8"])
@pytest.mark.parametrize("rope_mode", ["stored", "on_read"])
def test_round_trips_are_bit_identical(rng, k_format, rope_mode):
    cache = kvcore.PagedCache(**KW, k_format=k_format, v_format=k_format, rope_mode=rope_mode)
    seqs = three_sequences(cache, rng)
    want = [seq_bytes(cache, s) for s in seqs]
    ks = keys(cache, 3)

    pinned = kvcore.BlockOffloader(cache, pinned_bytes=16 << 20, model_id="model-x")
    assert all(pinned.offload(s, k) for s, k in zip(seqs, ks))
    for i, k in enumerate(ks):
        dirty_free_blocks(cache, rng)
        got = pinned.load(k)
        assert got is not None
        assert_same(seq_bytes(cache, got), want[i], f"value {i} from pinned memory")
        cache.erase(got)
    assert pinned.stats().pinned_hits == 3
    del pinned

    # Room for about one value: the others go down to the lower store as they are evicted.
    lower = kvcore.HostStore(64 << 20)
    off = kvcore.BlockOffloader(cache, pinned_bytes=cache.stats().bytes_per_block * 6, lower=lower, model_id="model-x")
    assert all(off.offload(s, k) for s, k in zip(seqs, ks))
    off.flush()
    for s in seqs:
        cache.erase(s)
    assert cache.stats().sequences == 0  # a CPU offload keeps no holder
    for rnd in range(2):  # the second round finds the promoted values in pinned memory
        for i, k in enumerate(ks):
            dirty_free_blocks(cache, rng)
            assert off.contains(k) and k in off
            got = off.load(k)
            assert got is not None
            assert_same(seq_bytes(cache, got), want[i], f"value {i}, round {rnd}")
            cache.erase(got)
    st = off.stats()
    assert st.offloads == 3 and st.demoted >= 2 and st.lower_hits >= 2
    assert st.pinned_hits + st.lower_hits == 6 and st.misses == 0
    assert lower.stats().puts >= 2 and lower.stats().hits >= 2


def test_demoted_values_load_through_a_tiered_store_on_disk(rng, tmp_path):
    cache = kvcore.PagedCache(**KW, k_format="fp8", v_format="fp8", rope_mode="on_read")
    seqs = three_sequences(cache, rng)
    want = [seq_bytes(cache, s) for s in seqs]
    ks = keys(cache, 3)
    disk = kvcore.DiskStore(tmp_path / "kv", 64 << 20)
    # The host tier holds about one value: what it evicts goes on to disk.
    lower = kvcore.TieredStore([kvcore.HostStore(cache.stats().bytes_per_block * 6), disk])
    off = kvcore.BlockOffloader(cache, pinned_bytes=cache.stats().bytes_per_block * 6, lower=lower, model_id=b"m")
    for s, k in zip(seqs, ks):
        assert off.offload(s, k)
    off.flush()
    lower.flush()
    for s in seqs:
        cache.erase(s)
    on_disk = [k for k in ks if disk.contains(k)]
    assert len(on_disk) >= 1 and len(list((tmp_path / "kv").glob("*/*.kvo"))) == len(on_disk)
    for i, k in enumerate(ks):
        got = off.load(k)
        assert got is not None
        assert_same(seq_bytes(cache, got), want[i], f"value {i} via the tiered store")
        cache.erase(got)
    assert lower.tier_hits(1) >= 1 and off.stats().lower_hits >= 2
    lower.flush()  # the loads' promotions evict host values, which the worker writes to disk again
    # A value damaged on disk is a miss, never wrong K/V.
    fresh = kvcore.BlockOffloader(cache, pinned_bytes=1 << 20, lower=disk, model_id=b"m")
    path = disk.path_of(on_disk[0])
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0x40
    open(path, "wb").write(bytes(raw))
    before = cache.debug_state()
    assert fresh.load(on_disk[0]) is None
    assert cache.debug_state() == before and fresh.stats().misses == 1
    assert disk.stats().rejected == 1


def test_another_model_id_is_a_miss(rng):
    cache = kvcore.PagedCache(**KW, k_format="f16")
    seqs = three_sequences(cache, rng)
    lower = kvcore.HostStore(64 << 20)
    k = keys(cache, 1)[0]
    # An arena of about one value: offloading seqs[2] after seqs[0] sends seqs[0] down to `lower`.
    writer = kvcore.BlockOffloader(cache, pinned_bytes=cache.stats().bytes_per_block * 5, lower=lower,
                                   model_id="model-x")
    assert writer.offload(seqs[0], k)
    assert writer.offload(seqs[2], keys(cache, 3)[2])
    writer.flush()
    assert writer.stats().demoted == 1 and lower.contains(k)
    other = kvcore.BlockOffloader(cache, pinned_bytes=1 << 20, lower=lower, model_id="model-y")
    before = cache.debug_state()
    assert other.load(k) is None
    assert cache.debug_state() == before
    assert other.stats().misses == 1 and other.stats().lower_hits == 0
    same = kvcore.BlockOffloader(cache, pinned_bytes=1 << 20, lower=lower, model_id="model-x")
    got = same.load(k)
    assert got is not None and cache.info(got).n_live == cache.info(seqs[0]).n_live
    # A key of no value at all, and a key of another salt.
    assert same.load(kvcore.StoreKey.for_tokens(cache, [100], salt="other")) is None


def test_bad_input_is_refused_and_changes_nothing(rng):
    cache = kvcore.PagedCache(**dict(KW, num_blocks=16), k_format="bf16", rope_mode="on_read")
    s = cache.create()
    append_random(cache, s, 30, rng, 0)
    lower = kvcore.HostStore(1 << 20)
    for kwargs, name in [(dict(pinned_bytes=0), "pinned_bytes"), (dict(max_queue_bytes=-1), "max_queue_bytes"),
                         (dict(lower="host"), "lower"), (dict(model_id=3.5), "model_id")]:
        with pytest.raises(kvcore.InvalidArgumentError, match=name):
            kvcore.BlockOffloader(cache, **kwargs)
    with pytest.raises(kvcore.InvalidArgumentError, match="cache"):
        kvcore.BlockOffloader(lower)
    off = kvcore.BlockOffloader(cache, pinned_bytes=8 << 20, lower=lower, model_id="m")
    good = kvcore.StoreKey.for_tokens(cache, [1, 2, 3])
    wrong = kvcore.StoreKey(good.content_hi, good.content_lo, good.layout ^ 1)
    assert wrong != good and good == kvcore.StoreKey.for_tokens(cache, [1, 2, 3]) and hash(good) != hash(wrong)
    before = cache.debug_state()
    with pytest.raises(kvcore.InvalidArgumentError, match="layout"):
        off.offload(s, wrong)
    with pytest.raises(ValueError, match="layout"):
        off.load(wrong)
    with pytest.raises(kvcore.InvalidArgumentError):
        off.offload(s + 1000, good)
    with pytest.raises(TypeError):
        off.offload(s, "not a key")
    with pytest.raises(TypeError):
        kvcore.StoreKey(-1, 0, 0)
    assert cache.debug_state() == before
    assert off.stats().offloads == 0 and off.stats().entries == 0

    # Too few free blocks to load: OutOfMemoryError, the cache as it was, the value kept.
    assert off.offload(s, good)
    filler = cache.create()
    append_random(cache, filler, cache.stats().blocks_free * 8 - 3, rng, 0)
    full = cache.debug_state()
    with pytest.raises(kvcore.OutOfMemoryError):
        off.load(good)
    with pytest.raises(MemoryError):
        off.load(good)
    assert cache.debug_state() == full
    cache.erase(filler)
    cache.erase(s)
    got = off.load(good)
    assert got is not None and cache.info(got).n_live == 30

    # The stores' own arguments.
    with pytest.raises(kvcore.InvalidArgumentError, match="first tier"):
        kvcore.TieredStore([kvcore.DiskStore("/tmp/kvcore-unused-dir", 1 << 20), lower])
    with pytest.raises(kvcore.InvalidArgumentError, match=r"tiers\[1\]"):
        kvcore.TieredStore([lower, 5])
    with pytest.raises(kvcore.InvalidArgumentError, match="tiers"):
        kvcore.TieredStore(lower)
    with pytest.raises(kvcore.InvalidArgumentError, match="max_queue_bytes"):
        kvcore.TieredStore([kvcore.HostStore(1 << 20)], max_queue_bytes=0)
    with pytest.raises(TypeError):  # os.fspath's refusal, as for every path argument
        kvcore.DiskStore(42, 1 << 20)
    with pytest.raises(TypeError):
        kvcore.KvStore()


def test_loads_make_earlier_plans_stale_and_offloads_do_not(rng):
    cache = kvcore.PagedCache(**KW, k_format="f32", rope_mode="on_read")
    seqs = three_sequences(cache, rng)
    off = kvcore.BlockOffloader(cache, pinned_bytes=1 << 20)
    k = keys(cache, 1)[0]
    plan = cache.plan([seqs[1]])
    assert off.offload(seqs[0], k)
    off.poll()
    off.flush()
    assert not plan.is_stale  # an offload leaves every sequence as it was
    off.load(k)
    assert plan.is_stale


def test_the_offloader_keeps_its_cache_and_lower_store_alive(rng, tmp_path):
    cache = kvcore.PagedCache(**KW, k_format="f16")
    seqs = three_sequences(cache, rng)
    want = seq_bytes(cache, seqs[2])
    host = kvcore.HostStore(1 << 20)
    tiered = kvcore.TieredStore([host, kvcore.DiskStore(tmp_path, 1 << 24)])
    off = kvcore.BlockOffloader(cache, pinned_bytes=cache.stats().bytes_per_block * 6, lower=tiered, model_id="m")
    ks = keys(cache, 3)
    for s, k in zip(seqs, ks):
        assert off.offload(s, k)
    refs = [weakref.ref(x) for x in (cache, host, tiered)]
    del cache, host, tiered
    gc.collect()
    assert all(r() is not None for r in refs)
    assert off.lower.tiers[0] is refs[1]() and off.cache is refs[0]()
    off.flush()
    got = off.load(ks[2])
    assert_same(seq_bytes(off.cache, got), want, "after the names went away")
    assert off.load(ks[0]) is not None and off.stats().lower_hits == 1  # through the tiered store
    del off
    gc.collect()
    assert all(r() is None for r in refs)


def test_stores_put_get_and_refuse_damaged_values(tmp_path, rng):
    key = kvcore.StoreKey(1, 2, 3)
    data = rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()
    for store in (kvcore.HostStore(1 << 20), kvcore.DiskStore(str(tmp_path), 1 << 20, fsync_each_put=False)):
        assert store.get(key) is None and key not in store
        assert store.put(key, data)
        assert store.get(key) == data and store.contains(key)
        assert store.get(kvcore.StoreKey(1, 2, 4)) is None
        st = store.stats()
        assert (st.puts, st.hits, st.misses, st.items) == (1, 1, 2, 1), st
        assert store.remove(key) and store.get(key) is None
    assert kvcore.HostStore(100).put(key, data) is False  # larger than the store
    assert key.hex() == "0000000000000003" + "0000000000000001" + "0000000000000002"
