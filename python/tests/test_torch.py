"""The same entry points with torch tensors (CPU here; CUDA where a GPU is): zero copy by data
pointer, outputs in torch, FP8 pools as float8_e4m3fn views, bf16. Skipped without torch."""

import numpy as np
import pytest

import kvcore
from conftest import attention_f64, bf16_round, fp8_round_trip_ref, rotate_neox, small_cache

torch = pytest.importorskip("torch")
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and kvcore.cuda_device_count() > 0 else [])


@pytest.mark.parametrize("device", DEVICES)
def test_decode_step_with_torch(device):
    g = torch.Generator().manual_seed(0)
    cache = small_cache(k_format="fp8", rope_mode="on_read", device=device)
    s = cache.create()
    ticket = None
    for pos in range(12):
        ticket = cache.reserve(s, [pos], reuse=ticket) if ticket is not None else cache.reserve(s, [pos])
        plan = cache.plan(ticket)
        k = torch.randn(1, 2, 64, generator=g).to(device)
        q = torch.randn(1, 4, 64, generator=g).to(device)
        cache.store(ticket, 0, k, k)
        out = torch.empty_like(q)
        assert plan.run(0, q, out=out) is out
        assert isinstance(plan.run(0, q), torch.Tensor)
    _, kr, vr = cache.read(s, 0)
    ref = attention_f64(rotate_neox(q[0].cpu().numpy(), 11, 64, 10000.0), kr, vr, 64 ** -0.5)
    np.testing.assert_allclose(out[0].cpu().numpy(), ref, atol=2e-3)
    pool = cache.k_pool(0, framework="torch")
    assert pool.dtype == torch.float8_e4m3fn and pool.device.type == device
    assert pool.data_ptr() == cache.k_pool(0, framework="torch").data_ptr()


@pytest.mark.parametrize("device", DEVICES)
def test_ops_with_torch(device):
    x = torch.randn(4, 192, device=device)
    out = torch.empty_like(x)
    p = out.data_ptr()
    assert kvcore.fp8_round_trip_rows(x, 64, out=out) is out and out.data_ptr() == p
    np.testing.assert_array_equal(out.cpu().numpy(), fp8_round_trip_ref(x.cpu().numpy(), 64))
    codes, scales, tail = kvcore.fp8_pack_rows(x, 64, tail_dtype=torch.bfloat16)
    assert tail.dtype == torch.bfloat16 and codes.dtype == torch.uint8
    np.testing.assert_array_equal(tail.float().cpu().numpy(), bf16_round(x[:, 128:].cpu().numpy()))
    xb = torch.randn(3, 2, 64, device=device, dtype=torch.bfloat16)
    before = xb.data_ptr()
    kvcore.rope_apply(xb, torch.arange(3, dtype=torch.int32, device=device), kvcore.RopeSpec.plain(64, 1e4))
    assert xb.data_ptr() == before


@pytest.mark.parametrize("device", DEVICES)
def test_engine_allocated_torch_pools(device):
    """The engine's torch allocator holds the pools (float8_e4m3fn codes as torch allocates them):
    the cache writes into those tensors, and its views are them."""
    kw = dict(n_layers=2, n_kv_heads=2, head_dim=64, num_blocks=16, block_size=8, k_format="fp8",
              rope=kvcore.RopeSpec.plain(64, 10000.0), rope_mode="on_read", device=device)
    specs = kvcore.PagedCache.pool_specs(**{k: v for k, v in kw.items() if k != "device"})
    pools = [torch.full(s.shape, 7, dtype=torch.uint8, device=device).view(getattr(torch, s.dtype)) for s in specs]
    assert pools[0].dtype == torch.float8_e4m3fn
    cache = kvcore.PagedCache(**kw, pools=pools)
    own = kvcore.PagedCache(**kw)
    assert all(not p.view(torch.uint8).any() for p in pools)  # zeroed by the cache
    outs = []
    for c in (cache, own):
        g = torch.Generator().manual_seed(5)
        s = c.create()
        k = torch.randn(2, 5, 2, 64, generator=g).to(device)
        c.append(s, list(range(5)), k, -k)
        plan = c.plan([s])
        q = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(9)).to(device)
        outs.append(plan.run(1, q))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    for i, part in enumerate((cache.k_pool(0, framework="torch"), cache.k_scales(0, framework="torch"))):
        assert part.data_ptr() == pools[i].data_ptr()
    assert cache.k_pool(0, framework="torch").dtype == torch.float8_e4m3fn
    assert pools[0][:16].view(torch.uint8).any()  # K codes landed in the engine's tensor


def test_torch_tensors_that_dlpack_refuses():
    x = torch.randn(4, 192, requires_grad=True)
    before = x.detach().clone()
    with pytest.raises(kvcore.InvalidArgumentError, match="argument 'src'.*requires grad"):
        kvcore.fp8_round_trip_rows(x, 64, out=x.detach())
    assert torch.equal(x.detach(), before)
    p = torch.nn.Parameter(torch.randn(4, 192), requires_grad=False)  # a torch.Tensor subclass
    out = kvcore.fp8_round_trip_rows(p, 64)
    np.testing.assert_array_equal(out.numpy(), fp8_round_trip_ref(p.numpy(), 64))
