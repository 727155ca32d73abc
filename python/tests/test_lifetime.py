"""Lifetimes: views, plans and tickets keep what they need alive; nothing dangles after the cache's
last Python reference goes away."""

import gc
import weakref

import numpy as np

import kvcore
from conftest import small_cache


def test_pool_view_outlives_the_cache_name(rng):
    cache = small_cache(k_format="f32")
    s = cache.create()
    k = rng.standard_normal((2, 3, 2, 64)).astype(np.float32)
    cache.append(s, [0, 1, 2], k, k)
    view = cache.v_pool(1)
    positions = cache.positions()
    ref = weakref.ref(cache)
    del cache
    gc.collect()
    assert ref() is not None  # the views hold the cache
    np.testing.assert_array_equal(view[0, :3], k[1])
    assert list(positions[0, :3]) == [0, 1, 2]
    view[0, 0] = 5.0  # still writable memory of the live cache
    del view, positions
    gc.collect()
    assert ref() is None  # and let it go with the last view


def test_plan_keeps_its_cache(rng):
    cache = small_cache(k_format="f32", rope_mode="on_read")
    s = cache.create()
    k = rng.standard_normal((2, 4, 2, 64)).astype(np.float32)
    cache.append(s, [0, 1, 2, 3], k, k)
    plan = cache.plan([s])
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    expected = plan.run(0, q)
    ref = weakref.ref(cache)
    del cache
    gc.collect()
    assert ref() is not None
    np.testing.assert_array_equal(plan.run(0, q), expected)


def test_dlpack_view_keeps_the_cache(rng):
    cache = small_cache(k_format="f16")
    arr = np.from_dlpack(cache.k_pool(0, framework="dlpack"))
    ref = weakref.ref(cache)
    del cache
    gc.collect()
    assert ref() is not None and arr.shape == (32, 8, 2, 64)
    arr[...] = 1.0
    assert float(arr.sum()) == arr.size


def test_dsv4_views_keep_the_cache():
    cache = kvcore.Dsv4Cache(["window"], max_context=256)
    ring = cache.raw_ring(cache.create(), 0)
    ref = weakref.ref(cache)
    del cache
    gc.collect()
    assert ref() is not None and ring.shape == (128, 512)
