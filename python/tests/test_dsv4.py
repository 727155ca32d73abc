"""DeepSeek-V4 through Python: Dsv4Cache against the same ops called directly, the ops against
float64 references where the math is plain (quant off), and the refused shift."""

import numpy as np
import pytest

import kvcore
from conftest import fp8_round_trip_ref, rotate_interleaved_tail


def weights(rng, comp):
    ape = (rng.standard_normal((comp.ratio, comp.width)) * 0.1).astype(np.float32)
    norm = (1 + 0.1 * rng.standard_normal(comp.head_dim)).astype(np.float32)
    return ape, norm


def test_window_layer_ring_and_refused_shift(rng):
    cache = kvcore.Dsv4Cache(["window", "window"], max_context=512)
    assert cache.n_layers == 2 and cache.kind(0) == "window" and cache.raw_row_bytes == 1024
    kv = rng.standard_normal((5, 512)).astype(np.float32)
    raw = kv.copy()
    s = cache.create()
    cache.append(s, 0, 0, kv.copy())
    cache.append(s, 1, 0, kv)
    assert cache.length(s, 1) == 5 and s in cache
    np.testing.assert_array_equal(kv[:, :448], fp8_round_trip_ref(raw[:, :448], 0))  # FP8-rounded in place
    np.testing.assert_array_equal(cache.read_window(s, 1), kv.astype(np.float16).astype(np.float32))
    before = cache.debug_state()
    with pytest.raises(kvcore.InvalidArgumentError):  # past the end (window-only stacks shift by any count)
        cache.shift(s, 0, 6)
    with pytest.raises(kvcore.InvalidArgumentError):
        cache.append(s, 1, 7, kv)
    assert cache.length(s, 1) == 5 and cache.debug_state() == before
    with pytest.raises(kvcore.NotSupportedError):  # compressor states cannot be rewound
        cache.truncate(s, 2)
    cache.truncate(s, 0)
    assert cache.length(s, 1) == 0
    cache.erase(s)
    assert s not in cache


def test_csa_layer_equals_the_compressor_ops(rng):
    """A CSA layer's compressed rows equal dsv4_compress_prefill run by hand on the same inputs."""
    cache = kvcore.Dsv4Cache(["csa"], max_context=256, index_topk=16, quant=False)
    comp, idx = cache.compressor(0), cache.indexer()
    ape, norm = weights(rng, comp)
    iape, inorm = weights(rng, idx)
    cache.set_weights(0, ape, norm, iape, inorm)
    n = 11
    kv = rng.standard_normal((n, 512)).astype(np.float32)
    c = rng.standard_normal((n, comp.width)).astype(np.float32)
    z = rng.standard_normal((n, comp.width)).astype(np.float32)
    ic = rng.standard_normal((n, idx.width)).astype(np.float32)
    iz = rng.standard_normal((n, idx.width)).astype(np.float32)
    s = cache.create()
    cache.append(s, 0, 0, kv, c, z, ic, iz)
    assert cache.compressed_rows(s, 0) == n // 4 and cache.indexer_rows(s, 0) == n // 4
    state_kv = np.zeros((comp.state_rows, comp.width), np.float32)
    state_sc = np.zeros_like(state_kv)
    kvcore.dsv4_compressor_reset(state_kv, state_sc, comp)
    assert np.isneginf(state_sc).all()
    rows = np.zeros((64, 512), np.float32)
    rope = kvcore.RopeSpec.deepseek_v4_compressed()
    kvcore.dsv4_compress_prefill(c, z, state_kv, state_sc, 0, comp, ape, norm, rope, rows, quant=False)
    np.testing.assert_array_equal(cache.read_compressed(s, 0), rows[:n // 4])
    # token by token with the separate ops gives the same rows
    sk, ss = np.zeros_like(state_kv), np.zeros_like(state_sc)
    kvcore.dsv4_compressor_reset(sk, ss, comp)
    rows2 = np.zeros_like(rows)
    for p in range(n):
        kvcore.dsv4_compressor_store_one(c[p], z[p], ape, sk, ss, p, comp)
        if p % 4 == 3:
            kvcore.dsv4_compressor_emit(sk, ss, comp, ape, norm, rope, p // 4, rows2, quant=False)
            kvcore.dsv4_compressor_shift(sk, ss, comp)
    np.testing.assert_array_equal(rows2, rows)


def test_kv_finalize(rng):
    kv = rng.standard_normal((3, 512)).astype(np.float32)
    raw = kv.copy()
    ring = np.zeros((4, 512), np.float16)
    kvcore.dsv4_kv_finalize(kv, ring, 2, 64)
    np.testing.assert_array_equal(kv[:, :448], fp8_round_trip_ref(raw[:, :448], 0))
    np.testing.assert_array_equal(kv[:, 448:], raw[:, 448:])
    np.testing.assert_array_equal(ring[[2, 3, 0]], kv.astype(np.float16))


def test_indexer_topk_matches_float64(rng):
    nq, H, D, cap, n_rows = 3, 4, 128, 16, 6
    q = rng.standard_normal((nq, H, D)).astype(np.float32)
    w = rng.standard_normal((nq, H)).astype(np.float32)
    rows = rng.standard_normal((cap, D)).astype(np.float32)
    top, scores = kvcore.dsv4_indexer_topk(q, w, rows, n_rows, 17, 4, 3, quant=False)
    for i in range(nq):
        t = 17 + i
        visible = min(n_rows, (t + 1) // 4)
        ref = np.full(cap, -np.inf)
        for s in range(visible):
            ref[s] = sum(w[i, h] * max(float(q[i, h] @ rows[s]), 0.0) for h in range(H))
        np.testing.assert_allclose(scores[i], ref, rtol=1e-5, atol=1e-4)
        assert list(top[i]) == list(np.argsort(-ref[:visible], kind="stable")[:3])


def test_dsv4_attention_matches_float64(rng):
    n_heads, n_win = 4, 5
    q = (rng.standard_normal((1, n_heads, 512)) * 0.05).astype(np.float32)
    win = (rng.standard_normal((1, 8, 512)) * 0.5).astype(np.float32)
    comp = kvcore.dsv4_pack_rows((rng.standard_normal((6, 512)) * 0.5).astype(np.float32))
    idx = np.array([[4, -1, 1]], np.int32)
    rope = kvcore.RopeSpec.deepseek_v4_window()
    out = kvcore.attention_dsv4_decode(q, win, np.array([n_win], np.int32), np.array([40], np.int32), rope,
                                       softmax_scale=0.04, comp_rows=comp, comp_idx=idx)
    keys = np.concatenate([win[0, :n_win], kvcore.dsv4_unpack_rows(comp[[4, 1]])]).astype(np.float64)
    for h in range(n_heads):
        s = keys @ q[0, h].astype(np.float64) * 0.04
        p = np.exp(s - s.max())
        o = p @ keys / p.sum()
        ref = rotate_interleaved_tail(o, -40, 64, 10000.0)
        np.testing.assert_allclose(out[0, h], ref, atol=2e-5)
