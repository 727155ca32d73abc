"""kvcore.hf under stock generate(): logits at every step of a 64-token greedy generation against
HF's eager attention with its default cache, on tiny random-weight models of each supported family.

Tolerances (rel = max |kvcore - HF| / max |HF| over the vocabulary, at each step):
- f32 pages: 1e-4. Both sides compute the same function in f32; they differ only in summation
  order and in how RoPE's cos/sin are computed (kvcore: float64 then rounded; HF: f32), a few ulp
  per op, and a 2-layer model amplifies that far less than 1e4-fold.
- f16 / bf16 / FP8 pages: HF's K and V pass through the same codec first (forward hooks on k_proj
  / k_norm and v_proj; rounding happens on unrotated keys, as kvcore stores them in rope_mode
  'on_read'), so again only accumulation differs: 1e-4 as for f32. Where a last-ulp difference
  upstream moves a value across a rounding boundary of the codec, one element of one row differs
  by one step of the format; such a flip is rare (about 1e-7 / 2^-8 per bf16 element) and its
  effect on the logits is bounded by that step times one attention weight, so the bound allows
  it for bf16 and FP8 (1e-3 and 1e-2) where a step is 2^-8 and 2^-3 of the value.
- Without the codec on HF's side (the price of the format itself, not a correctness check):
  f16 within 1e-2 of HF eager run over the same tokens.
"""

import pytest

from hf_models import ARCHS, DEVICES, codec, greedy, model, prompt, rel_per_step, round_kv_through

torch = pytest.importorskip("torch")
kvcore_hf = pytest.importorskip("kvcore.hf")
cache_kwargs = kvcore_hf.cache_kwargs

STEPS = 64


def run_kvcore(m, ids, **cache_kw):
    m.set_attn_implementation("kvcore")
    cache = kvcore_hf.KvcoreCache(m, **cache_kw)
    try:
        return greedy(m, ids, STEPS, **cache_kwargs(m, cache)), cache
    finally:
        m.set_attn_implementation("eager")


def run_eager(m, ids, k_codec="f32", v_codec="f32"):
    handles = round_kv_through(m, codec(k_codec), codec(v_codec)) if (k_codec, v_codec) != ("f32", "f32") else []
    try:
        return greedy(m, ids, STEPS)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rope_mode", ["on_read", "stored"])
@pytest.mark.parametrize("arch", ARCHS)
def test_f32_pages_match_eager(arch, rope_mode, device):
    m = model(arch, device=device)
    ids = prompt(12, device=device)
    ref_seq, ref_logits = run_eager(m, ids)
    (seq, logits), cache = run_kvcore(m, ids, window=1024, k_format="f32", rope_mode=rope_mode)
    assert torch.equal(seq, ref_seq)
    rel = rel_per_step(logits, ref_logits)
    assert rel.max().item() < 1e-4, rel
    assert cache.get_seq_length() == 12 + STEPS - 1 and cache.live_tokens() == 12 + STEPS - 1
    assert cache.shifts == 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt,bound", [("f16", 1e-4), ("bf16", 1e-3), ("fp8", 1e-2)])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_narrow_pages_match_eager_through_the_codec(arch, fmt, bound, device):
    m = model(arch, device=device)
    ids = prompt(12, device=device)
    ref_seq, ref_logits = run_eager(m, ids, fmt, fmt)
    (seq, logits), _ = run_kvcore(m, ids, window=1024, k_format=fmt, v_format=fmt)
    assert torch.equal(seq, ref_seq)
    rel = rel_per_step(logits, ref_logits)
    assert rel.max().item() < bound, rel


@pytest.mark.parametrize("device", DEVICES)
def test_f16_pages_near_plain_eager(device):
    """The price of f16 pages themselves: HF eager (no codec, one forward over the tokens kvcore
    generated, so a flipped near-tie changes nothing) against kvcore's logits at each step."""
    m = model("llama", device=device)
    ids = prompt(12, device=device)
    (seq, logits), _ = run_kvcore(m, ids, window=1024, k_format="f16")
    with torch.no_grad():
        ref_logits = m(seq[:, :-1]).logits[:, 11:]
    assert rel_per_step(logits, ref_logits).max().item() < 1e-2


def test_the_codec_oracle_can_fail():
    """HF with FP8-rounded K/V is far from plain f32 pages: the codec oracle tells formats apart."""
    m = model("llama")
    ids = prompt(12)
    _, ref_logits = run_eager(m, ids, "fp8", "fp8")
    (_, logits), _ = run_kvcore(m, ids, window=1024, k_format="f32")
    assert rel_per_step(logits, ref_logits).max().item() > 1e-3


@pytest.mark.parametrize("device", DEVICES)
def test_kv_bytes_per_token(device):
    m = model("llama", device=device)
    (_, _), f16 = run_kvcore(m, prompt(4, device=device), window=256, k_format="f16")
    (_, _), fp8 = run_kvcore(m, prompt(4, device=device), window=256, k_format="fp8", v_format="fp8")
    # 2 layers x 2 kv heads x 64 dims x (K + V): f16 2 bytes each; FP8 1 byte + one scale byte per 64
    assert f16.kv_bytes_per_token == 2 * 2 * 64 * 2 * 2
    assert fp8.kv_bytes_per_token == 2 * 2 * (64 + 1) * 2


def test_cache_keyword_follows_the_transformers_version():
    """cache_kwargs names the keyword the installed transformers takes: `cache` from 5.25 on
    (`past_key_values` is deprecated there, gone from forward in 5.40 and from generate in 6.0),
    `past_key_values` before; generate() through it raises no deprecation warning and uses the
    kvcore cache (its tokens are counted there)."""
    import inspect
    import warnings

    m = model("llama", device="cpu")
    takes_cache = "cache" in inspect.signature(type(m).forward).parameters
    assert kvcore_hf.cache_keyword(m) == ("cache" if takes_cache else "past_key_values")
    ids = prompt(6)
    m.set_attn_implementation("kvcore")
    try:
        cache = kvcore_hf.KvcoreCache(m, window=64)
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            with torch.no_grad():
                out = m.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, pad_token_id=0,
                                 **cache_kwargs(m, cache))
    finally:
        m.set_attn_implementation("eager")
    assert out.shape[1] == 9 and cache.get_seq_length() == 8
    import kvcore

    with pytest.raises(kvcore.InvalidArgumentError, match="model must be a transformers model.*got str"):
        cache_kwargs("not a model", cache)
    assert cache.get_seq_length() == 8
