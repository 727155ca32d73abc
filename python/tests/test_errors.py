"""kvcore::Error through Python: the exception hierarchy, messages that name the argument, and
every class of bad input (not a tensor, wrong dtype, device, contiguity, CUDA tensors on a CPU
build, bad values) raising the mapped exception with the cache unchanged."""

import numpy as np
import pytest

import kvcore
from conftest import FakeCudaTensor, small_cache


def test_hierarchy():
    assert issubclass(kvcore.InvalidArgumentError, kvcore.Error) and issubclass(kvcore.InvalidArgumentError, ValueError)
    assert issubclass(kvcore.OutOfMemoryError, MemoryError)
    assert issubclass(kvcore.NotSupportedError, NotImplementedError)
    assert issubclass(kvcore.CorruptError, RuntimeError) and issubclass(kvcore.DeviceError, RuntimeError)
    assert kvcore.InvalidArgumentError.code == "InvalidArgument" and kvcore.OutOfMemoryError.code == "OutOfMemory"
    assert kvcore.Error.__module__ == "kvcore"


@pytest.fixture
def filled(rng):
    cache = small_cache(k_format="f32", rope_mode="on_read", num_blocks=4)
    s = cache.create()
    k = rng.standard_normal((2, 10, 2, 64)).astype(np.float32)
    cache.append(s, list(range(10)), k, k)
    t = cache.reserve(s, [10])
    return cache, s, t


def unchanged(cache, fn, exc, *words):
    before = cache.debug_state()
    pools = [cache.k_pool(0).copy(), cache.v_pool(1).copy()]
    with pytest.raises(exc) as info:
        fn()
    assert isinstance(info.value, kvcore.Error)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert cache.debug_state() == before
    np.testing.assert_array_equal(cache.k_pool(0), pools[0])
    np.testing.assert_array_equal(cache.v_pool(1), pools[1])
    return info.value


def test_not_a_tensor(filled):
    cache, s, t = filled
    for bad in ([1.0] * 128, "k", 3, object()):
        unchanged(cache, lambda: cache.store(t, 0, bad, None), kvcore.InvalidArgumentError, "'k'", "__dlpack__")


def test_wrong_dtype(filled):
    cache, s, t = filled
    k = np.zeros((1, 2, 64), dtype=np.float64)
    unchanged(cache, lambda: cache.store(t, 0, k, k), kvcore.NotSupportedError, "'k'", "element type")
    k = np.zeros((1, 2, 64), dtype=np.int32)
    unchanged(cache, lambda: cache.store(t, 0, k, k), kvcore.Error)


def test_wrong_shape_and_layer(filled):
    cache, s, t = filled
    k = np.zeros((1, 2, 32), dtype=np.float32)
    unchanged(cache, lambda: cache.store(t, 0, k, k), kvcore.InvalidArgumentError, "k")
    k = np.zeros((1, 2, 64), dtype=np.float32)
    unchanged(cache, lambda: cache.store(t, 7, k, k), kvcore.InvalidArgumentError, "layer")


def test_non_contiguous_rows(filled):
    cache, s, t = filled
    k = np.zeros((1, 2, 128), dtype=np.float32)[:, :, ::2]  # last dim strided
    unchanged(cache, lambda: cache.store(t, 0, k, k), kvcore.InvalidArgumentError)


def test_cuda_tensor_on_a_cpu_build(filled):
    cache, s, t = filled
    fake = FakeCudaTensor((1, 2, 64))
    unchanged(cache, lambda: cache.store(t, 0, fake, fake), kvcore.Error)
    if kvcore.cuda_compiled() and kvcore.cuda_device_count() > 0:
        return  # an op on fake CUDA tensors alone would launch on their made-up addresses
    x = FakeCudaTensor((3, 2, 64))
    pos = FakeCudaTensor((3,), code=0, bits=32, address=0x90000)
    with pytest.raises(kvcore.Error) as e:
        kvcore.rope_apply(x, pos, kvcore.RopeSpec.plain(64, 10000.0))
    if not kvcore.cuda_compiled():
        assert isinstance(e.value, kvcore.NotSupportedError), e.value


def test_bad_values(filled):
    cache, s, t = filled
    unchanged(cache, lambda: cache.shift(s, 4, 100), kvcore.InvalidArgumentError, "n_discard")
    unchanged(cache, lambda: cache.truncate(s, 50), kvcore.InvalidArgumentError)
    unchanged(cache, lambda: cache.fork(999), kvcore.InvalidArgumentError, "999")
    unchanged(cache, lambda: cache.reserve(s, [3]), kvcore.InvalidArgumentError)  # positions must increase
    unchanged(cache, lambda: cache.reserve(s, list(range(11, 200))), kvcore.OutOfMemoryError)
    unchanged(cache, lambda: cache.plan([s], softmax_scale=-1.0), kvcore.InvalidArgumentError, "softmax_scale")
    with pytest.raises(kvcore.InvalidArgumentError, match="k_format"):
        small_cache(k_format="int4")
    with pytest.raises(kvcore.InvalidArgumentError, match="device"):
        small_cache(device="tpu")
    with pytest.raises(kvcore.InvalidArgumentError, match="block_size"):
        small_cache(block_size=0)


def test_stale_plan(filled, rng):
    cache, s, t = filled
    plan = cache.plan(t)
    cache.store(t, 0, np.zeros((1, 2, 64), np.float32), np.zeros((1, 2, 64), np.float32))
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    plan.run(0, q)
    assert not plan.is_stale
    cache.reserve(s, [11])
    assert plan.is_stale
    unchanged(cache, lambda: plan.run(0, q), kvcore.InvalidArgumentError, "stale")


def test_ops_reject_bad_input_and_write_nothing(rng):
    x = rng.standard_normal((4, 192)).astype(np.float32)
    out = np.full_like(x, 7.0)
    with pytest.raises(kvcore.InvalidArgumentError, match="n_rot"):
        kvcore.fp8_round_trip_rows(x, 3, out=out)
    assert (out == 7.0).all()
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.fp8_round_trip_rows(x, 0, out=np.zeros((4, 191), np.float32))
    with pytest.raises(kvcore.InvalidArgumentError, match="'src'"):
        kvcore.dsv4_pack_rows(None)
    k = rng.standard_normal((8, 2, 64)).astype(np.float32)
    k0 = k.copy()
    with pytest.raises(kvcore.InvalidArgumentError):
        kvcore.shift_dense([k], [k], kvcore.RopeSpec.plain(64, 10000.0), 8, 4, 5)
    np.testing.assert_array_equal(k, k0)
    with pytest.raises(kvcore.InvalidArgumentError, match="'positions'"):
        kvcore.rope_apply(k, [0, 1, 2], kvcore.RopeSpec.plain(64, 10000.0))
    np.testing.assert_array_equal(k, k0)


def test_read_only_array_is_refused(filled):
    cache, s, t = filled
    k = np.zeros((1, 2, 64), dtype=np.float32)
    k.flags.writeable = False
    unchanged(cache, lambda: cache.store(t, 0, k, k), kvcore.InvalidArgumentError, "'k'")
