"""The op families through Python against float64 references written from the specs (or, where
noted, against the same function reached another way), and zero-copy: inputs and outputs are the
caller's memory (checked by data pointer and by in-place effects on strided views)."""

import numpy as np
import pytest

import kvcore
from conftest import (attention_f64, bf16_round, fp8_round_trip_ref, rotate_interleaved_tail, rotate_neox,
                      small_cache)

PLAIN = kvcore.RopeSpec.plain(64, 10000.0)


def ptr(a):
    return a.__array_interface__["data"][0]


def test_rope_apply_matches_float64_and_works_in_place_on_views(rng):
    base = rng.standard_normal((5, 3, 2, 64)).astype(np.float32)
    x = base[:, 1]  # strided tokens: [5, 2, 64] inside base
    x0 = x.astype(np.float64)
    pos = np.array([0, 3, 17, 1000, -5], dtype=np.int32)
    ret = kvcore.rope_apply(x, pos, PLAIN)
    assert ret is x
    # f32 angles: the error grows with the position (~1e-7 relative to |pos * w|)
    np.testing.assert_allclose(base[:, 1], rotate_neox(x0, pos[:, None], 64, 10000.0), atol=1e-4)
    out = np.empty((5, 2, 64), np.float32)
    p = ptr(out)
    assert kvcore.rope_apply(base[:, 0], pos.astype(np.int64), PLAIN, out=out) is out and ptr(out) == p
    np.testing.assert_allclose(out, rotate_neox(base[:, 0].astype(np.float64), pos[:, None], 64, 10000.0), atol=1e-4)


def test_fp8_round_trip_matches_the_e4m3_reference(rng):
    x = (rng.standard_normal((6, 192)) * np.exp(rng.uniform(-8, 8, (6, 1)))).astype(np.float32)
    got = kvcore.fp8_round_trip_rows(x, 64)
    assert got.dtype == np.float32 and got.shape == x.shape and ptr(got) != ptr(x)
    np.testing.assert_array_equal(got.astype(np.float64), fp8_round_trip_ref(x, 64))
    y = x.copy()
    assert kvcore.fp8_round_trip_rows(y, 64, out=y) is y  # in place
    np.testing.assert_array_equal(y, got)


def test_fp8_pack_unpack(rng):
    x = rng.standard_normal((2, 3, 200)).astype(np.float32)
    codes, scales, tail = kvcore.fp8_pack_rows(x, 8)
    assert codes.shape == (2, 3, 192) and codes.dtype == np.uint8 and scales.shape == (2, 3, 3)
    assert tail.dtype == np.float16
    back = kvcore.fp8_unpack_rows(codes, scales, tail)
    ref = fp8_round_trip_ref(x, 8)
    np.testing.assert_array_equal(back[..., :192], ref[..., :192])
    np.testing.assert_array_equal(back[..., 192:], x[..., 192:].astype(np.float16).astype(np.float32))
    # into caller tensors, without a tail
    c2, s2 = np.zeros((2, 3, 200), np.uint8), np.zeros((2, 3, 4), np.uint8)
    r = kvcore.fp8_pack_rows(x, 0, codes=c2, scales=s2)
    assert r[0] is c2 and r[1] is s2 and r[2] is None
    np.testing.assert_array_equal(kvcore.fp8_unpack_rows(c2, s2), fp8_round_trip_ref(x, 0))


def test_dsv4_rows(rng):
    x = rng.standard_normal((4, 512)).astype(np.float32)
    packed = kvcore.dsv4_pack_rows(x)
    assert packed.shape == (4, 584) and packed.dtype == np.uint8
    back = kvcore.dsv4_unpack_rows(packed)
    np.testing.assert_array_equal(back[:, :448], fp8_round_trip_ref(x[:, :448], 0))
    np.testing.assert_array_equal(back[:, 448:], bf16_round(x[:, 448:]))
    assert (packed[:, 583] == 0).all()


def test_shift_dense_matches_float64(rng):
    cap, length, keep, disc = 20, 17, 3, 6
    ks = [rng.standard_normal((cap, 2, 64)).astype(np.float32) for _ in range(2)]
    vs = [rng.standard_normal((cap, 2, 32)).astype(np.float16) for _ in range(2)]
    k0, v0 = [k.copy() for k in ks], [v.copy() for v in vs]
    ropes = [PLAIN, kvcore.RopeSpec.plain(32, 500000.0)]
    kvcore.shift_dense(ks, vs, ropes, length, keep, disc)
    src = np.r_[0:keep, keep + disc:length]
    delta = np.where(np.arange(len(src)) < keep, 0, -disc)
    for layer, (n_rot, theta) in enumerate([(64, 10000.0), (32, 500000.0)]):
        np.testing.assert_array_equal(vs[layer][:len(src)], v0[layer][src])
        ref = rotate_neox(k0[layer][src], delta[:, None], n_rot, theta)
        np.testing.assert_allclose(ks[layer][:len(src)], ref, atol=2e-5)
        np.testing.assert_array_equal(ks[layer][len(src):length], k0[layer][len(src):length])  # stale rows kept


def test_rope_shift_rows(rng):
    k = rng.standard_normal((6, 2, 64)).astype(np.float32)
    k0 = k.astype(np.float64)
    delta = np.array([0, 1, -1, 7, -300, 12], dtype=np.int32)
    kvcore.rope_shift_rows(k, delta, PLAIN)
    np.testing.assert_allclose(k, rotate_neox(k0, delta[:, None], 64, 10000.0), atol=2e-5)


def test_kv_store_places_rotates_and_quantizes(rng):
    pool = np.zeros((4, 8, 2, 64), np.float32)
    src = rng.standard_normal((3, 2, 64)).astype(np.float32)
    slots = np.array([5, 17, -1], dtype=np.int32)
    pos = np.array([2, 9, 4], dtype=np.int32)
    kvcore.kv_store(src, slots, pool, positions=pos, rope=PLAIN)
    np.testing.assert_allclose(pool[0, 5], rotate_neox(src[0], 2, 64, 10000.0), atol=2e-5)
    np.testing.assert_allclose(pool[2, 1], rotate_neox(src[1], 9, 64, 10000.0), atol=2e-5)
    assert np.count_nonzero(pool) == 2 * 2 * 64  # the skipped row wrote nothing
    codes, scales = np.zeros((4, 8, 2, 64), np.uint8), np.zeros((4, 8, 2, 1), np.uint8)
    kvcore.kv_store(src, slots, codes, scales=scales)
    c, s, _ = kvcore.fp8_pack_rows(src[1], 0)
    np.testing.assert_array_equal(codes[2, 1], c)
    np.testing.assert_array_equal(scales[2, 1], s)


def test_attention_over_caller_pages_equals_the_plan(rng):
    """attention_decode/prefill over pools, tables and positions passed by hand give the same
    bits as the cache's plan, and the float64 value."""
    cache = small_cache(k_format="fp8", rope_mode="on_read")
    a, b = cache.create(), cache.create()
    k = rng.standard_normal((2, 9, 2, 64)).astype(np.float32)
    cache.append(a, list(range(9)), k, k)
    cache.append(b, list(range(4)), k[:, :4], k[:, :4])
    t = cache.reserve([a, b], [9, 4], [1, 1])
    kk = rng.standard_normal((2, 2, 64)).astype(np.float32)
    cache.store(t, 1, kk, kk)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    planned = cache.plan(t).run(1, q)
    tb = cache.block_tables([a, b])
    args = dict(k_scale=cache.k_scales(1), v_scale=cache.v_scales(1), positions=cache.positions(), valid=cache.valid(),
                softmax_scale=64 ** -0.5, q_positions=np.array([9, 4], np.int32), rope_on_read=PLAIN)
    by_hand = kvcore.attention_decode(q, cache.k_pool(1), cache.v_pool(1), tb["indptr"], tb["indices"],
                                      tb["last_page_len"], **args)
    np.testing.assert_array_equal(by_hand, planned)
    pos, kr, vr = cache.read(a, 1)
    ref = attention_f64(rotate_neox(q[0], 9, 64, 10000.0), kr, vr, 64 ** -0.5)
    np.testing.assert_allclose(planned[0], ref, atol=2e-3)
    # prefill form: the same two rows as chunks of one token
    qo = np.array([0, 1, 2], np.int32)
    pre = kvcore.attention_prefill(q, qo, cache.k_pool(1), cache.v_pool(1), tb["indptr"], tb["indices"],
                                   tb["last_page_len"], **args)
    np.testing.assert_allclose(pre, planned, atol=1e-5)
    ws = np.zeros(kvcore.attention_workspace_bytes(2, 4, 64, 2), np.uint8)
    out = np.zeros_like(q)
    kvcore.attention_decode(q, cache.k_pool(1), cache.v_pool(1), tb["indptr"], tb["indices"], tb["last_page_len"],
                            out=out, num_splits=2, workspace=ws, **args)
    np.testing.assert_allclose(out, planned, atol=1e-5)


def test_zero_copy_outputs_and_inputs(rng):
    x = rng.standard_normal((3, 128)).astype(np.float32)
    out = np.zeros_like(x)
    p = ptr(out)
    r = kvcore.fp8_round_trip_rows(x, 0, out=out)
    assert r is out and ptr(r) == p
    # a strided input view is read where it lives (no contiguous copy is made first)
    big = rng.standard_normal((3, 2, 128)).astype(np.float32)
    view = big[:, 1, :]
    np.testing.assert_array_equal(kvcore.fp8_round_trip_rows(view, 0), fp8_round_trip_ref(view, 0))
    cache = small_cache()
    assert ptr(cache.k_pool(0)) == ptr(cache.k_pool(0))  # views of the same memory every time
