"""Pool memory the engine allocates (PagedCache(..., pools=)): PagedCache.pool_specs says what to
allocate; a cache over those arrays writes into them (zero copy, by data pointer) exactly what a
cache with its own pools holds; it keeps them alive; arrays that are not the spec are refused
with the mapped exception naming pools[i], and their bytes stay untouched. Per-call stream=
arguments are taken (and ignored) on the CPU."""

import gc
import sys

import numpy as np
import pytest

import kvcore
from conftest import FakeCudaTensor

KW = dict(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=12, block_size=4, rope=kvcore.RopeSpec.plain(64, 1e4))
NP_DTYPES = {"float8_e4m3fn": np.uint8, "uint8": np.uint8, "float16": np.float16, "float32": np.float32}


def numpy_pools(specs, fill=0xA5):
    pools = []
    for s in specs:
        a = np.empty(s.shape, dtype=NP_DTYPES[s.dtype])
        a.view(np.uint8).fill(fill)
        pools.append(a)
    return pools


def drive(cache, rng):
    """The same edits on any cache: appends, a fork written after the fork, a shift, a decode step."""
    a = cache.create()
    k = rng.standard_normal((2, 9, 2, 64)).astype(np.float32)
    cache.append(a, list(range(9)), k, k * 0.5, stream=None)
    b = cache.fork(a, stream=None)
    t = cache.reserve([a, b], [9, 9], [1, 1], stream=None)
    for layer in range(2):
        x = rng.standard_normal((2, 2, 64)).astype(np.float32)
        cache.store(t, layer, x, -x, stream=None)
    cache.shift(a, 2, 3, stream=None)
    cache.truncate(b, 7, stream=None)
    cache.prepare(stream=None)
    return a, b


@pytest.mark.parametrize("k_format", ["f16", "fp8", "f32"])
def test_pool_specs_then_engine_pools_hold_what_own_pools_hold(k_format):
    kw = dict(KW, k_format=k_format, rope_mode="on_read")
    specs = kvcore.PagedCache.pool_specs(**kw)
    parts = ["k", "k_scales", "v", "v_scales"] if k_format == "fp8" else ["k", "v"]
    assert [s.part for s in specs] == parts * 2 and [s.layer for s in specs] == [0] * len(parts) + [1] * len(parts)
    for s in specs:
        assert s.shape[:3] == (13, 4, 2)  # num_blocks + 1 blocks (the last is the zero block)
        assert s.bytes == np.prod(s.shape) * np.dtype(NP_DTYPES[s.dtype]).itemsize
    pools = numpy_pools(specs)
    given = kvcore.PagedCache(**kw, pools=pools)
    own = kvcore.PagedCache(**kw)
    assert own.pools is None and len(given.pools) == len(specs)
    assert given.stats().bytes_per_block * 13 == sum(s.bytes for s in specs)
    ids_own = drive(own, np.random.default_rng(3))
    ids_given = drive(given, np.random.default_rng(3))
    assert given.debug_state() == own.debug_state()
    for so, sg in zip(ids_own, ids_given):
        for layer in range(2):
            for x, y in zip(own.read(so, layer), given.read(sg, layer)):
                np.testing.assert_array_equal(x, y)
    views = [given.k_pool(0), given.k_scales(0), given.v_pool(0)] if k_format == "fp8" else [given.k_pool(0), given.v_pool(0)]
    for view, mine in zip(views, pools):
        assert view.__array_interface__["data"][0] == mine.__array_interface__["data"][0]  # the engine's memory
        np.testing.assert_array_equal(view.view(np.uint8), mine[:12].view(np.uint8))
        assert not mine[12].view(np.uint8).any()  # the zero block stayed zero
    np.testing.assert_array_equal(given.k_pool(1).view(np.uint8), own.k_pool(1).view(np.uint8))


def test_the_cache_keeps_engine_pools_alive():
    specs = kvcore.PagedCache.pool_specs(**KW)
    pools = numpy_pools(specs)
    first = pools[0]
    before = sys.getrefcount(first)
    cache = kvcore.PagedCache(**KW, pools=pools)
    assert sys.getrefcount(first) > before
    address = first.__array_interface__["data"][0]
    del pools, first
    gc.collect()
    s = cache.create()
    cache.append(s, [0], np.ones((2, 1, 2, 64), np.float32), np.ones((2, 1, 2, 64), np.float32))
    assert cache.k_pool(0).__array_interface__["data"][0] == address
    _, k, _ = cache.read(s, 0)
    np.testing.assert_allclose(k, 1.0)


def test_bad_pools_are_refused_naming_the_array_and_left_untouched():
    kw = dict(KW, k_format="fp8")
    specs = kvcore.PagedCache.pool_specs(**kw)
    good = numpy_pools(specs, fill=0x5A)

    def refused(pools, exc, needle):
        with pytest.raises(exc) as e:
            kvcore.PagedCache(**kw, pools=pools)
        assert needle in str(e.value), str(e.value)
        for p in good:
            assert (p.view(np.uint8) == 0x5A).all()

    def swap(i, x):
        p = list(good)
        p[i] = x
        return p

    refused(good[:-1], ValueError, "pools holds 7 arrays, the config needs 8")
    refused(swap(0, np.zeros(specs[0].shape, np.float16)), ValueError, "pools[0] (layer 0 k) has dtype f16")
    refused(swap(1, np.zeros((12, 4, 2, 1), np.uint8)), ValueError, "pools[1] (layer 0 k_scales) has shape [12, 4, 2, 1]")
    refused(swap(2, np.zeros((13, 2, 4, 64), np.uint8).transpose(0, 2, 1, 3)), ValueError, "pools[2] (layer 0 v) must be contiguous")
    refused(swap(4, good[0]), ValueError, "pools[0] and pools[4] overlap")
    refused(swap(3, "memory"), kvcore.InvalidArgumentError, "argument 'pools[3]' must be a tensor")
    refused(swap(0, FakeCudaTensor(specs[0].shape, code=1, bits=8)), ValueError, "pools[0] (layer 0 k) is on cuda:0")
    refused(good[0], ValueError, "argument 'pools' must be a list of tensors")
    misaligned = np.zeros(specs[0].bytes + 1, np.uint8)[1:].reshape(specs[0].shape)
    refused(swap(0, misaligned), ValueError, "-byte aligned")
    with pytest.raises(ValueError, match="num_blocks"):
        kvcore.PagedCache.pool_specs(**dict(kw, num_blocks=0))
    kvcore.PagedCache(**kw, pools=tuple(good))  # a tuple serves as well


def test_stream_arguments_on_cpu_caches():
    cache = kvcore.PagedCache(**KW)
    s = cache.create()
    t = cache.reserve(s, [0], stream=0)
    cache.store(t, 0, np.ones((1, 2, 64), np.float32), np.ones((1, 2, 64), np.float32), stream=0)
    plan = cache.plan(t, stream=0)
    out = plan.run(0, np.ones((1, 4, 64), np.float32), stream=0)
    np.testing.assert_allclose(out, 1.0, rtol=1e-6)
    cache.block_tables([s], stream=0)
