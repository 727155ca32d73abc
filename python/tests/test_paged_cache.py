"""PagedCache through Python: a decode loop with shifts, a fork and a batch, checked every layer
and step against float64 attention (over what the test wrote for f32 pools; over the cache's own
read-back for 16-bit and FP8 pools), plus prefill, edits and inspection."""

import numpy as np
import pytest

import kvcore
from conftest import attention_f64, rotate_neox, small_cache

THETA = 10000.0


def run_decode_loop(k_format, rope_mode, rng, steps=70, capacity=30, n_keep=4, n_discard=10, fork_at=25):
    H, HQ, D, L = 2, 4, 64, 2
    cache = small_cache(k_format=k_format, rope_mode=rope_mode, num_blocks=24, n_kv_heads=H, head_dim=D)
    scale = D ** -0.5
    seqs = [cache.create()]
    written = [[[] for _ in range(L)]]  # per seq, per layer: (k, v) rows (unrotated) of live tokens
    ticket = kvcore.Ticket()
    worst = 0.0
    shifts = 0
    for step in range(steps):
        if step == fork_at:
            seqs.append(cache.fork(seqs[0]))
            written.append([list(layer) for layer in written[0]])
        positions = []
        for b, s in enumerate(seqs):
            if cache.info(s).n_live == capacity:
                cache.shift(s, n_keep, n_discard)
                for layer in written[b]:
                    del layer[n_keep:n_keep + n_discard]
                shifts += 1
            positions.append(cache.info(s).last_position + 1)
            assert positions[-1] == len(written[b][0])
        cache.reserve(seqs, positions, [1] * len(seqs), reuse=ticket)
        plan = cache.plan(ticket)
        assert plan.batch == len(seqs) and plan.n_rows == len(seqs) and not plan.prefill
        outs, queries = [], []
        for layer in range(L):
            k = rng.standard_normal((len(seqs), H, D)).astype(np.float32)
            v = rng.standard_normal((len(seqs), H, D)).astype(np.float32)
            q = rng.standard_normal((len(seqs), HQ, D)).astype(np.float32)
            for b in range(len(seqs)):
                written[b][layer].append((k[b], v[b]))
            # store() rotates keys itself in 'stored' mode; queries come rotated there (kvcore
            # rotates them in 'on_read' mode).
            q_in = rotate_neox(q, np.array(positions)[:, None], D, THETA).astype(np.float32) if rope_mode == "stored" else q
            cache.store(ticket, layer, k, v)
            outs.append(plan.run(layer, q_in))
            queries.append(q)
        for layer in range(L):  # read() may fold position offsets: only after the step's runs
            for b in range(len(seqs)):
                qr = rotate_neox(queries[layer][b], positions[b], D, THETA)
                if k_format == "f32":  # independent oracle: what the test wrote
                    ks = np.stack([kv[0] for kv in written[b][layer]])
                    vs = np.stack([kv[1] for kv in written[b][layer]])
                    kr = rotate_neox(ks, np.arange(len(ks))[:, None], D, THETA)
                else:  # the stored values (rounded), as the cache reads them back
                    pos, kr, vs = cache.read(seqs[b], layer)
                    np.testing.assert_array_equal(pos, np.arange(len(pos)))
                ref = attention_f64(qr, kr, vs, scale)
                worst = max(worst, float(np.abs(outs[layer][b] - ref).max()))
    return worst, shifts, cache, seqs


@pytest.mark.parametrize("rope_mode", ["stored", "on_read"])
@pytest.mark.parametrize("k_format,tol", [("f32", 2e-5), ("f16", 2e-3), ("fp8", 2e-3)])
def test_decode_loop_matches_float64(k_format, tol, rope_mode, rng):
    worst, shifts, cache, seqs = run_decode_loop(k_format, rope_mode, rng)
    assert shifts >= 4
    assert worst < tol, worst
    st = cache.stats()
    assert st.sequences == 2 and st.tokens_live == sum(cache.info(s).n_live for s in seqs)


def test_prefill_plan_from_ticket_is_causal(rng):
    H, HQ, D = 2, 4, 64
    cache = small_cache(k_format="f32", rope_mode="on_read")
    a, b = cache.create(), cache.create()
    counts, positions = [5, 3], [0, 1, 2, 3, 4, 0, 1, 2]
    t = cache.reserve([a, b], positions, counts)
    assert t.n_tokens == 8 and t.seqs == [a, b] and t.positions == positions
    plan = cache.plan(t)
    assert plan.prefill and plan.n_rows == 8
    k = rng.standard_normal((8, H, D)).astype(np.float32)
    v = rng.standard_normal((8, H, D)).astype(np.float32)
    q = rng.standard_normal((8, HQ, D)).astype(np.float32)
    cache.store(t, 0, k, v)
    out = plan.run(0, q)
    rows = {a: range(0, 5), b: range(5, 8)}
    for s, r in rows.items():
        ks, vs = k[list(r)], v[list(r)]
        kr = rotate_neox(ks, np.array([positions[i] for i in r])[:, None], D, 10000.0)
        for i in r:
            qr = rotate_neox(q[i], positions[i], D, 10000.0)
            ref = attention_f64(qr, kr, vs, D ** -0.5, causal_q_pos=positions[i], k_pos=[positions[j] for j in r])
            np.testing.assert_allclose(out[i], ref, atol=2e-5)


def test_append_read_fork_truncate_erase(rng):
    cache = small_cache(k_format="f32")
    s = cache.create()
    k = rng.standard_normal((2, 5, 2, 64)).astype(np.float32)
    v = rng.standard_normal((2, 5, 2, 64)).astype(np.float32)
    cache.append(s, [0, 1, 2, 3, 4], k, v)
    pos, kr, vr = cache.read(s, 1)
    np.testing.assert_array_equal(pos, np.arange(5))
    np.testing.assert_allclose(kr, rotate_neox(k[1], np.arange(5)[:, None], 64, 10000.0), atol=1e-5)
    np.testing.assert_array_equal(vr, v[1])
    f = cache.fork(s)
    assert cache.stats().blocks_shared >= 1 and f in cache and set(cache.sequences()) == {s, f}
    cache.truncate(f, 2)
    assert cache.info(f).n_live == 2 and cache.info(s).n_live == 5
    np.testing.assert_array_equal(cache.read(f, 0)[2], v[0, :2])
    cache.erase(f)
    assert f not in cache and cache.sequences() == [s]
    tables = cache.block_tables([s])
    assert list(tables["indptr"]) == [0, 1] and list(tables["last_page_len"]) == [5]
    assert tables["indices"].dtype == np.int32


def test_shift_in_stored_mode_defers_rotation(rng):
    cache = small_cache(k_format="f32", rope_mode="stored")
    s = cache.create()
    k = rng.standard_normal((2, 12, 2, 64)).astype(np.float32)
    cache.append(s, list(range(12)), k, k)
    cache.shift(s, 2, 5)
    assert cache.needs_prepare and cache.stats().cells_pending > 0
    cache.prepare()
    assert not cache.needs_prepare
    pos, kr, _ = cache.read(s, 0)
    kept = np.concatenate([k[0, :2], k[0, 7:]])
    np.testing.assert_array_equal(pos, np.arange(7))
    np.testing.assert_allclose(kr, rotate_neox(kept, np.arange(7)[:, None], 64, 10000.0), atol=2e-5)


def test_views_and_properties():
    cache = small_cache(k_format="fp8", v_format="f16", kvcore_attention=False)
    assert cache.k_pool(0).shape == (32, 8, 2, 64) and cache.k_pool(0).dtype == np.uint8
    assert cache.k_scales(0).shape == (32, 8, 2, 1) and cache.v_scales(0) is None
    assert cache.v_pool(1).dtype == np.float16
    assert cache.positions().shape == (32, 8) and cache.valid().dtype == np.uint8
    assert (cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.block_size, cache.num_blocks) == (2, 2, 64, 8, 32)
    assert cache.k_format == "fp8" and cache.v_format == "f16" and cache.rope_mode == "stored"
    assert cache.device == "cpu" and "PagedCache(" in repr(cache)
    assert np.from_dlpack(cache.k_pool(0, framework="dlpack")).shape == (32, 8, 2, 64)


def test_store_writes_the_pool_in_place(rng):
    """The pool view sees store()'s bytes: views alias the cache's memory."""
    cache = small_cache(k_format="f32", rope_mode="on_read")
    view = cache.v_pool(0)
    s = cache.create()
    t = cache.reserve(s, [0, 1, 2])
    v = rng.standard_normal((3, 2, 64)).astype(np.float32)
    cache.store(t, 0, v, v)
    for i, slot in enumerate(t.slots):
        np.testing.assert_array_equal(view[slot // 8, slot % 8], v[i])


def test_plan_with_seq_ids_and_options(rng):
    cache = small_cache(k_format="f32", rope_mode="on_read")
    s = cache.create()
    k = rng.standard_normal((2, 6, 2, 64)).astype(np.float32)
    cache.append(s, list(range(6)), k, k)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)
    plan = cache.plan([s], softmax_scale=0.2, window=3, sinks=sinks)
    assert abs(plan.softmax_scale - 0.2) < 1e-7
    out = np.zeros_like(q)
    assert plan.run(1, q, out=out) is out
    kr = rotate_neox(k[1], np.arange(6)[:, None], 64, 10000.0)
    qr = rotate_neox(q[0], 5, 64, 10000.0)
    for h in range(4):  # window 3: keys at positions 3, 4, 5; the sink joins the denominator
        sc = kr[3:, h // 2] @ qr[h] * 0.2
        p = np.exp(sc - sc.max())
        ref = p @ k[1, 3:, h // 2] / (p.sum() + np.exp(sinks[h] - sc.max()))
        np.testing.assert_allclose(out[0, h], ref, atol=2e-5)


def test_help_tells_what_to_do():
    doc = kvcore.PagedCache.__doc__
    for word in ("reserve", "store", "plan", "run", "fork", "shift", "truncate", "__dlpack__"):
        assert word in doc
    assert "n_layers" in kvcore.PagedCache.__init__.__doc__


def test_position_edits_and_can_fit(rng):
    cache = small_cache(k_format="f32", rope_mode="on_read", num_blocks=4)
    s = cache.create()
    k = rng.standard_normal((2, 10, 2, 64)).astype(np.float32)
    cache.append(s, list(range(10)), k, k)
    assert cache.can_fit([s], [22]) and not cache.can_fit([s], [23])
    assert cache.blocks_needed([s], [7]) == 1
    cache.remove_positions(s, 2, 5)  # drop positions 2, 3, 4
    cache.add_positions(s, 5, None, -3)  # close the gap: 5.. become 2..
    pos, kr, vr = cache.read(s, 0)
    np.testing.assert_array_equal(pos, np.arange(7))
    keep = np.r_[0:2, 5:10]
    np.testing.assert_array_equal(vr, k[0, keep])
    np.testing.assert_allclose(kr, rotate_neox(k[0, keep], np.arange(7)[:, None], 64, THETA), atol=2e-5)
    with pytest.raises(kvcore.InvalidArgumentError):
        cache.add_positions(s, 0, None, -1)  # a negative position


@pytest.mark.parametrize("k_format", ["f16", "fp8"])
def test_store_layers_equals_store_per_layer(k_format, rng):
    """store_layers (every layer at once) writes the bytes store() writes layer by layer; a k of
    the wrong layer count is refused, naming k."""
    caches = [small_cache(k_format=k_format, v_format=k_format, rope_mode="stored", n_layers=3) for _ in range(2)]
    tickets = []
    for c in caches:
        seqs = [c.create(), c.create()]
        tickets.append(c.reserve(seqs, [5, 7, 9], [1, 2]))
    k = rng.standard_normal((3, 3, 2, 64)).astype(np.float32)
    v = rng.standard_normal((3, 3, 2, 64)).astype(np.float32)
    for layer in range(3):
        caches[0].store(tickets[0], layer, k[layer], v[layer])
    caches[1].store_layers(tickets[1], k, v)
    for layer in range(3):
        for pool in ("k_pool", "v_pool"):
            a = np.asarray(getattr(caches[0], pool)(layer)).view(np.uint8)
            b = np.asarray(getattr(caches[1], pool)(layer)).view(np.uint8)
            np.testing.assert_array_equal(a, b)
    with pytest.raises(kvcore.InvalidArgumentError, match="store_layers"):
        caches[1].store_layers(tickets[1], k[:2], v)


def test_mla_shared_v_layout_reads_v_from_k(rng):
    """v_from_k_latent (MLA's shared layout): no V pool, stores take K only, V reads back as the
    first v_head_dim dims of K, and attention equals the separate-V layout fed the latent."""
    rope = kvcore.RopeSpec(64, 10000.0, pairing="interleaved", slice="tail")
    kw = dict(rope=rope, v_head_dim=512, k_format="bf16", rope_mode="stored", block_size=8)
    shared = kvcore.PagedCache(1, 1, 576, 8, v_from_k_latent=True, **kw)
    sep = kvcore.PagedCache(1, 1, 576, 8, **kw)
    assert shared.v_from_k_latent and not sep.v_from_k_latent
    assert shared.v_pool(0) is None
    assert [s.part for s in kvcore.PagedCache.pool_specs(1, 1, 576, 8, v_from_k_latent=True, **kw)] == ["k"]
    assert shared.stats().bytes_per_block * (576 + 512) == sep.stats().bytes_per_block * 576
    k = rng.uniform(-1, 1, (1, 6, 1, 576)).astype(np.float32)
    a, b = shared.create(), sep.create()
    with pytest.raises(kvcore.InvalidArgumentError, match="v_from_k_latent"):
        shared.append(a, list(range(6)), k, k[..., :512])
    shared.append(a, list(range(6)), k)
    sep.append(b, list(range(6)), k, np.ascontiguousarray(k[..., :512]))
    _, ka, va = shared.read(a, 0)
    _, kb, vb = sep.read(b, 0)
    np.testing.assert_array_equal(va, ka[..., :512])
    np.testing.assert_array_equal(va, vb)
    q = rng.uniform(-1, 1, (1, 4, 576)).astype(np.float32)
    np.testing.assert_array_equal(shared.plan([a], [6]).run(0, q), sep.plan([b], [6]).run(0, q))
