"""CUDA tensors through the Python API (skipped without a GPU, torch with CUDA, or a CUDA build):
work on a side stream runs in that stream's order (the current torch stream, or stream=); an
attention plan's runs captured in a CUDA graph replay what eager runs compute; FP8 pools as
float8_e4m3fn views hold what read() decodes; engine-allocated pools are torch's memory (its
accounting sees them, kvcore adds none to it) and the cache writes into them; outputs come back in
the caller's tensors (zero copy, by data pointer); BlockOffloader's copies follow the stream order.
Every result is also checked against a float64 reference. Run on the GPU machine:

    KVCORE_GIT_COMMIT=<hash> OUT=out bash bench/gpu-all.sh   (its pytest stage: every file, CUDA build)
"""

import gc

import numpy as np
import pytest

import kvcore
from conftest import attention_f64, rotate_neox

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and kvcore.cuda_compiled() and kvcore.cuda_device_count() > 0),
    reason="needs a GPU, torch with CUDA and kvcore built with CUDA",
)

THETA = 10000.0
ROPE = kvcore.RopeSpec.plain(64, THETA)
SLEEP_CYCLES = 100_000_000  # ~50 ms on an H200: long enough for a wrongly ordered call to overtake it


def cuda_cache(**kw):
    args = dict(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=64, block_size=16, rope=ROPE, device="cuda")
    args.update(kw)
    return kvcore.PagedCache(**args)


def reference(cache, seq, layer, q, q_pos):
    """float64 attention of q [n_q_heads, 64] (a CUDA tensor) over the sequence as read() decodes it;
    q is rotated at q_pos first when the cache rotates queries (rope_mode='on_read')."""
    _, k, v = cache.read(seq, layer)
    qh = q.double().cpu().numpy()
    if cache.rope_mode == "on_read":
        qh = rotate_neox(qh, q_pos, 64, THETA)
    return attention_f64(qh, k, v, 64 ** -0.5)


def filled(cache, seqs_lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = []
    for n in seqs_lengths:
        s = cache.create()
        kv = torch.randn(cache.n_layers, n, 2, 64, generator=g).cuda()
        cache.append(s, list(range(n)), kv, 0.5 * kv)
        seqs.append(s)
    torch.cuda.synchronize()
    return seqs


@pytest.mark.parametrize("explicit", [False, True])
def test_side_stream_work_runs_in_that_streams_order(explicit):
    """store, shift, plan and run issued behind a long kernel on a side stream must wait for it: the
    K and q they read are written on that stream after the kernel. On the default (or any other)
    stream they would read the zeros that were there before."""
    cache = cuda_cache(rope_mode="stored", k_format="f16")
    (s,) = filled(cache, [40])
    g = torch.Generator().manual_seed(1)
    k_true = torch.randn(1, 2, 64, generator=g).cuda()
    q_true = torch.randn(1, 4, 64, generator=g).cuda()
    k, q, out = torch.zeros_like(k_true), torch.zeros_like(q_true), torch.zeros_like(q_true)
    ticket = cache.reserve(s, [40])
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        k.copy_(k_true)
        q.copy_(q_true)
    if explicit:  # the current stream is the default one: stream= names the side stream
        cache.store(ticket, 0, k, k, stream=side)
        cache.shift(s, 4, 3, stream=side)
        plan = cache.plan([s], stream=side)
        assert plan.run(0, q, out=out, stream=side) is out
    else:
        with torch.cuda.stream(side):
            cache.store(ticket, 0, k, k)
            cache.shift(s, 4, 3)
            plan = cache.plan([s])
            assert plan.run(0, q, out=out) is out
    side.synchronize()
    pos, kr, _ = cache.read(s, 0)
    assert list(pos) == list(range(38)) and pos[-1] == 37
    np.testing.assert_allclose(kr[-1], rotate_neox(k_true[0].cpu().numpy(), 37, 64, THETA), atol=2e-2)
    np.testing.assert_allclose(out[0].cpu().numpy(), reference(cache, s, 0, q_true[0], 37), atol=2e-3)


def test_attention_plan_runs_captured_in_a_cuda_graph():
    cache = cuda_cache(rope_mode="on_read", k_format="fp8")
    seqs = filled(cache, [5, 33, 70])
    lengths = [5, 33, 70]
    ticket = cache.reserve(seqs, lengths, [1, 1, 1])
    g = torch.Generator().manual_seed(2)
    for layer in range(2):
        k = torch.randn(3, 2, 64, generator=g).cuda()
        cache.store(ticket, layer, k, -k)
    plan = cache.plan(ticket)
    q = torch.zeros(3, 4, 64, device="cuda")
    outs = [torch.empty_like(q) for _ in range(2)]
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # torch's rule: warm up off the capture stream
        for layer in range(2):
            plan.run(layer, q, out=outs[layer])
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for layer in range(2):
            plan.run(layer, q, out=outs[layer])
    for _ in range(3):
        q.copy_(torch.randn(3, 4, 64, generator=g).cuda())
        graph.replay()
        torch.cuda.synchronize()
        for layer in range(2):
            eager = plan.run(layer, q)
            torch.cuda.synchronize()
            torch.testing.assert_close(outs[layer], eager, rtol=0, atol=0)
            for b, s in enumerate(seqs):
                np.testing.assert_allclose(outs[layer][b].cpu().numpy(), reference(cache, s, layer, q[b], lengths[b]),
                                           atol=3e-3)


def test_fp8_pools_are_float8_views_of_what_read_decodes():
    cache = cuda_cache(rope_mode="stored", k_format="fp8")
    (s,) = filled(cache, [37])
    view = cache.k_pool(1, framework="torch")
    scales = cache.k_scales(1, framework="torch")
    assert view.dtype == torch.float8_e4m3fn and view.device.type == "cuda"
    assert view.shape == (64, 16, 2, 64) and scales.shape == (64, 16, 2, 1) and scales.dtype == torch.uint8
    assert view.data_ptr() == cache.k_pool(1, framework="torch").data_ptr()  # a view, not a copy
    blocks = torch.from_numpy(cache.block_tables([s])["indices"]).long().cuda()
    # (indexing float8 tensors is not implemented everywhere: gather the bytes, then view them)
    codes = view.view(torch.uint8)[blocks].view(torch.float8_e4m3fn).reshape(-1, 2, 64)[:37].float()
    scale = torch.pow(2.0, scales[blocks].reshape(-1, 2, 1)[:37].float() - 127.0)
    _, k, _ = cache.read(s, 1)
    torch.testing.assert_close((codes * scale).cpu(), torch.from_numpy(k), rtol=0, atol=0)
    # dlpack export of the same memory
    assert torch.from_dlpack(cache.k_pool(1, framework="dlpack")).data_ptr() == view.data_ptr()


def test_engine_pools_are_torch_memory():
    kw = dict(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=64, block_size=16, k_format="fp8", rope=ROPE,
              rope_mode="on_read")
    specs = kvcore.PagedCache.pool_specs(**kw)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    pools = [torch.empty(sp.shape, dtype=getattr(torch, sp.dtype), device="cuda") for sp in specs]
    with_pools = torch.cuda.memory_allocated()
    assert with_pools - before >= sum(sp.bytes for sp in specs)
    cache = kvcore.PagedCache(**kw, device="cuda", pools=pools)
    assert torch.cuda.memory_allocated() == with_pools  # the pools are the engine's; kvcore took none of torch's
    assert all(not p.view(torch.uint8).any() for p in pools)
    own = cuda_cache(**{k: v for k, v in kw.items()})
    outs = []
    for c in (cache, own):
        (s,) = filled(c, [50], seed=4)
        q = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(5)).cuda()
        outs.append(c.plan([s]).run(1, q))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert cache.k_pool(0, framework="torch").data_ptr() == pools[0].data_ptr()
    assert pools[0][:4].view(torch.uint8).any()  # written through the engine's tensor
    del pools
    gc.collect()
    held = torch.cuda.memory_allocated()
    assert held >= with_pools  # the cache keeps the engine's tensors alive
    del cache
    gc.collect()
    assert held - torch.cuda.memory_allocated() >= sum(sp.bytes for sp in specs)  # and lets them go with it


def test_cuda_views_outlive_the_cache_name():
    cache = cuda_cache(k_format="f16")
    (s,) = filled(cache, [9])
    view = cache.v_pool(0, framework="torch")
    _, _, v = cache.read(s, 0)
    first = int(cache.block_tables([s])["indices"][0])
    del cache
    gc.collect()
    np.testing.assert_allclose(view[first, :9].float().cpu().numpy(), v, rtol=0, atol=0)


def test_cuda_ops_write_in_place_on_the_current_stream():
    x = torch.randn(6, 192, device="cuda")
    out = torch.empty_like(x)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        x.mul_(2.0)
        assert kvcore.fp8_round_trip_rows(x, 64, out=out) is out
    side.synchronize()
    from conftest import fp8_round_trip_ref

    np.testing.assert_array_equal(out.cpu().numpy(), fp8_round_trip_ref(x.cpu().numpy(), 64))


@pytest.mark.parametrize("k_format,rope_mode", [("fp8", "stored"), ("f16", "on_read")])
def test_block_offloader_round_trips_on_side_streams(k_format, rope_mode):
    """offload() on a side stream copies what was queued there before it (K/V appended after a slow
    kernel); a sequence erased right after its offload stays whole (a holder keeps its blocks);
    values evicted to the lower store and values in pinned memory load back on another stream and
    read exactly as before."""
    cache = cuda_cache(k_format=k_format, v_format=k_format, rope_mode=rope_mode)
    a, b = filled(cache, [37, 20], seed=3)
    want = [[cache.read(s, layer) for layer in range(2)] for s in (a, b)]
    lower = kvcore.HostStore(64 << 20)
    # Room for one of the two values: offloading b sends a down to `lower`.
    off = kvcore.BlockOffloader(cache, pinned_bytes=cache.stats().bytes_per_block * 4, lower=lower, model_id="m")
    ka = kvcore.StoreKey.for_tokens(cache, range(37))
    kb = kvcore.StoreKey.for_tokens(cache, range(20))
    side = torch.cuda.Stream()
    late = cache.create()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        kv = torch.randn(2, 5, 2, 64, generator=torch.Generator().manual_seed(9)).cuda()
        cache.append(late, [0, 1, 2, 3, 4], kv, kv)  # queued after the sleep
        assert off.offload(late, kvcore.StoreKey.for_tokens(cache, [7] * 5))
        assert off.offload(a, ka)
        cache.erase(a)  # while the copy may still run: the holder keeps a's blocks
        assert off.offload(b, kb)
        cache.erase(b)
    side.synchronize()
    want_late = [cache.read(late, layer) for layer in range(2)]
    off.flush()
    assert off.stats().holders == 0 and off.stats().demoted >= 1
    other = torch.cuda.Stream()
    got = {}
    for name, key in (("a", ka), ("b", kb), ("late", kvcore.StoreKey.for_tokens(cache, [7] * 5))):
        with torch.cuda.stream(other):
            got[name] = off.load(key, stream=other)
        assert got[name] is not None, name
    other.synchronize()
    for name, expected in (("a", want[0]), ("b", want[1]), ("late", want_late)):
        for layer in range(2):
            for x, y in zip(cache.read(got[name], layer), expected[layer]):
                if y is not None:
                    np.testing.assert_array_equal(x, y)
    assert off.stats().lower_hits >= 1 and off.stats().misses == 0
