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
