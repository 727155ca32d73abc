"""Context shift under transformers: kvcore's shifted cache against a float64 reference built from
HF's own K/V -- un-rotate the keys at their positions, drop [n_keep, n_keep + n_discard), re-rotate
the kept keys at the compacted positions -- which HF's eager attention (float64 model) then reads
for the tokens after the shift. Not a re-prefill of the kept tokens: their K/V were computed while
attending to the dropped ones, and a shift keeps exactly those K/V.

Bound: the kvcore side runs the same weights in f32 (f32 pages), so it is the f32 forward's own
rounding (a few 1e-7 relative per op) plus HF's f32 cos/sin in the reference's prefill: 2e-5."""

import copy

import numpy as np
import pytest

from hf_models import DEVICES, model, prompt, rel_per_step

torch = pytest.importorskip("torch")
kvcore_hf = pytest.importorskip("kvcore.hf")
cache_kwargs = kvcore_hf.cache_kwargs
from transformers import DynamicCache  # noqa: E402

N_KEEP, N_DISCARD, WINDOW = 4, 16, 48
PREFILL, TOTAL = 40, 60  # the token at index WINDOW is the first after the shift


def rotate(x, pos, freqs, sign=1.0):
    """NeoX RoPE in float64: x [..., T, D], pos [T], rotation by sign * pos * freqs."""
    ang = sign * pos[:, None].double() * freqs[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    h = freqs.shape[0]
    a, b = x[..., :h], x[..., h:2 * h]
    return torch.cat([a * c - b * s, a * s + b * c, x[..., 2 * h:]], dim=-1)


def reference_logits(m, ids, shifted=True):
    """Float64 logits of tokens WINDOW..TOTAL-1 after HF prefills ids[:, :WINDOW] (positions
    0..WINDOW-1) and its cache is shifted as kvcore shifts (or, shifted=False, kept whole)."""
    m64 = copy.deepcopy(m).double()
    m64.set_attn_implementation("eager")
    cache = DynamicCache(config=m64.config)
    with_cache = cache_kwargs(m64, cache)  # once: it reads forward()'s signature
    with torch.no_grad():
        m64(ids[:, :WINDOW], **with_cache)
    freqs = torch.tensor(kvcore_hf.rope_spec_from_config(m.config).frequencies_f64(), dtype=torch.float64,
                         device=ids.device)
    pos = torch.arange(WINDOW, device=ids.device)
    keep = torch.cat([torch.arange(N_KEEP), torch.arange(N_KEEP + N_DISCARD, WINDOW)]).to(ids.device)
    next_pos = WINDOW
    if shifted:
        for layer in cache.layers:
            k = rotate(layer.keys, pos, freqs, -1.0)[:, :, keep]
            layer.keys = rotate(k, torch.arange(keep.numel(), device=ids.device), freqs)
            layer.values = layer.values[:, :, keep]
        next_pos = keep.numel()
    out = []
    with torch.no_grad():
        for t in range(WINDOW, TOTAL):
            p = torch.tensor([[next_pos + t - WINDOW]], device=ids.device)
            out.append(m64(ids[:, t:t + 1], **with_cache, position_ids=p).logits[:, -1])
    return torch.stack(out, dim=1)


def kvcore_logits(m, ids, **kw):
    m.set_attn_implementation("kvcore")
    cache = kvcore_hf.KvcoreCache(m, window=WINDOW, n_keep=N_KEEP, n_discard=N_DISCARD, **kw)
    out = []
    try:
        with_cache = cache_kwargs(m, cache)  # once: it reads forward()'s signature
        with torch.no_grad():
            m(ids[:, :PREFILL], **with_cache)
            for t in range(PREFILL, TOTAL):
                logits = m(ids[:, t:t + 1], **with_cache).logits[:, -1]
                if t >= WINDOW:
                    out.append(logits)
                assert cache.shifts == (1 if t >= WINDOW else 0)
    finally:
        m.set_attn_implementation("eager")
    return torch.stack(out, dim=1), cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rope_mode", ["on_read", "stored"])
@pytest.mark.parametrize("arch", ["llama", "llama3_scaled", "qwen3"])
def test_shift_matches_float64_reference_from_hf_kv(arch, rope_mode, device):
    m = model(arch, device=device)
    ids = prompt(TOTAL, device=device)
    ref = reference_logits(m, ids)
    got, cache = kvcore_logits(m, ids, k_format="f32", rope_mode=rope_mode)
    rel = rel_per_step(got, ref)
    assert rel.max().item() < 2e-5, rel
    # the oracle tells a shift from no shift
    assert rel_per_step(got, reference_logits(m, ids, shifted=False)).max().item() > 1e-3
    assert cache.live_tokens() == WINDOW - N_DISCARD + (TOTAL - WINDOW)
    assert cache.get_seq_length() == TOTAL


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,bound", [("f16", 1e-2), ("fp8", 1e-1)])
def test_shift_with_narrow_pages_near_reference(fmt, bound, device):
    m = model("llama", device=device)
    ids = prompt(TOTAL, device=device)
    got, _ = kvcore_logits(m, ids, k_format=fmt, v_format=fmt)
    assert rel_per_step(got, reference_logits(m, ids)).max().item() < bound


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["f32", "fp8"])
def test_generate_goes_on_past_the_window(fmt, device):
    """StreamingLLM-style: 300 tokens through a 64-token window with 4 sinks. With f32 pages the
    tokens before the first shift equal HF's own greedy generation (FP8 may flip a random model's
    near-ties)."""
    m = model("smollm", device=device)
    ids = prompt(20, device=device)
    with torch.no_grad():
        ref = m.generate(ids, max_new_tokens=40, do_sample=False, pad_token_id=0)
    m.set_attn_implementation("kvcore")
    cache = kvcore_hf.KvcoreCache(m, window=64, n_keep=4, k_format=fmt, v_format=fmt)
    try:
        with torch.no_grad():
            out = m.generate(ids, max_new_tokens=300, min_new_tokens=300, do_sample=False, pad_token_id=0,
                             **cache_kwargs(m, cache))
    finally:
        m.set_attn_implementation("eager")
    assert out.shape[1] == 320
    assert cache.shifts >= 8 and cache.live_tokens() <= 64
    if fmt == "f32":
        assert np.array_equal(out[0, :40].cpu().numpy(), ref[0, :40].cpu().numpy())
