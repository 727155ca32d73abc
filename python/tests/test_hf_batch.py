"""kvcore.hf with what generate() does besides plain greedy decoding: left-padded batches, beam
search (reorder_cache -> fork), assisted decoding (crop -> truncate), and refusals."""

import pytest

from hf_models import DEVICES, greedy, model, prompt, rel_per_step

torch = pytest.importorskip("torch")
kvcore_hf = pytest.importorskip("kvcore.hf")
cache_kwargs = kvcore_hf.cache_kwargs
import kvcore  # noqa: E402


def with_kvcore(m, fn, **cache_kw):
    m.set_attn_implementation("kvcore")
    cache = kvcore_hf.KvcoreCache(m, **cache_kw)
    try:
        return fn(cache), cache
    finally:
        m.set_attn_implementation("eager")


@pytest.mark.parametrize("device", DEVICES)
def test_left_padded_batch_rows_equal_their_unpadded_runs(device):
    """Pad tokens are never stored: each row of a left-padded batch equals HF eager on that prompt
    alone (no padding anywhere), tokens and logits (1e-4)."""
    m = model("qwen2", device=device)
    lengths = [5, 12, 9]
    rows = [prompt(n, seed=10 + i, device=device) for i, n in enumerate(lengths)]
    width = max(lengths)
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - r.shape[1]:] = r[0]
        mask[i, width - r.shape[1]:] = 1
    (seq, logits), cache = with_kvcore(m, lambda c: greedy(m, ids, 32, attention_mask=mask, **cache_kwargs(m, c)),
                                       window=512, k_format="f32")
    for i, r in enumerate(rows):
        ref_seq, ref_logits = greedy(m, r, 32)
        assert torch.equal(seq[i, width:], ref_seq[0, r.shape[1]:])
        assert rel_per_step(logits[i:i + 1], ref_logits).max().item() < 1e-4
        assert cache.live_tokens(i) == lengths[i] + 31


@pytest.mark.parametrize("device", DEVICES)
def test_beam_search_matches_eager(device):
    m = model("llama", device=device)
    ids = prompt(10, device=device)
    kw = dict(max_new_tokens=16, num_beams=3, num_return_sequences=3, do_sample=False, pad_token_id=0,
              output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        ref = m.generate(ids, **kw)
    forks = []

    def run(cache):
        original = cache.reorder_cache

        def spy(beam_idx):
            forks.append(beam_idx.tolist())
            return original(beam_idx)

        cache.reorder_cache = spy
        with torch.no_grad():
            return m.generate(ids, **cache_kwargs(m, cache), **kw)

    out, cache = with_kvcore(m, run, window=256, k_format="f32")
    assert forks, "beam search never reordered the cache"
    assert torch.equal(out.sequences, ref.sequences)
    torch.testing.assert_close(out.sequences_scores, ref.sequences_scores, rtol=1e-4, atol=1e-4)
    assert len(cache.paged.sequences()) == 3  # the old rows were erased after each fork


@pytest.mark.parametrize("device", DEVICES)
def test_assisted_decoding_crops_and_matches_plain_greedy(device):
    m = model("llama", device=device)
    assistant = model("llama", seed=7, device=device)
    ids = prompt(10, device=device)
    ref_seq, _ = greedy(m, ids, 40)
    crops = []

    def run(cache):
        original = cache.crop

        def spy(n):
            crops.append(n)
            return original(n)

        cache.crop = spy
        with torch.no_grad():
            return m.generate(ids, max_new_tokens=40, min_new_tokens=40, do_sample=False, pad_token_id=0,
                              assistant_model=assistant, **cache_kwargs(m, cache))

    seq, cache = with_kvcore(m, run, window=256, k_format="f32")
    assert any(c != 0 for c in crops), crops
    assert torch.equal(seq, ref_seq)


def test_crop_then_continue_equals_never_having_seen_the_tokens():
    m = model("llama")
    ids = prompt(30)

    def run(cache, crop):
        with torch.no_grad():
            m(ids[:, :20], **cache_kwargs(m, cache))
            if crop:
                m(ids[:, 20:26], **cache_kwargs(m, cache))
                cache.crop(-6)
            return m(ids[:, 20:30], **cache_kwargs(m, cache)).logits

    cropped, c1 = with_kvcore(m, lambda c: run(c, True), window=128, k_format="f16")
    plain, c2 = with_kvcore(m, lambda c: run(c, False), window=128, k_format="f16")
    assert torch.equal(cropped, plain)
    assert c1.get_seq_length() == c2.get_seq_length() == 30


def test_refusals_name_the_argument_and_change_nothing():
    m = model("llama")
    with pytest.raises(kvcore.InvalidArgumentError, match="window"):
        kvcore_hf.KvcoreCache(m, window=4, n_keep=4)
    with pytest.raises(kvcore.InvalidArgumentError, match="n_discard"):
        kvcore_hf.KvcoreCache(m, window=64, n_keep=4, n_discard=61)
    with pytest.raises(kvcore.InvalidArgumentError, match="k_format"):
        kvcore_hf.KvcoreCache(m, k_format="fp8", v_format="f16")  # attention reads K and V of one type
    with pytest.raises(kvcore.InvalidArgumentError, match="rope_mode"):
        kvcore_hf.KvcoreCache(m, rope_mode="later")
    assert not hasattr(m.model.rotary_emb.forward, "kvcore_original")  # refused before touching the model
    m.set_attn_implementation("kvcore")
    try:
        cache = kvcore_hf.KvcoreCache(m, window=32, n_keep=4)
        with torch.no_grad():
            m(prompt(20), **cache_kwargs(m, cache))
            with pytest.raises(kvcore.InvalidArgumentError, match="new tokens in one step"):
                m(prompt(29), **cache_kwargs(m, cache))
        assert cache.get_seq_length() == 20 and cache.live_tokens() == 20 and cache.shifts == 0
        from transformers import DynamicCache

        with pytest.raises(kvcore.InvalidArgumentError, match="needs a kvcore.hf.KvcoreCache"):
            with torch.no_grad():
                m(prompt(3), **cache_kwargs(m, DynamicCache(config=m.config)))
    finally:
        m.set_attn_implementation("eager")
    # the model's own RoPE is back once the implementation is not "kvcore"
    ref_seq, ref_logits = greedy(model("llama"), prompt(8), 4)
    seq, logits = greedy(m, prompt(8), 4)
    assert torch.equal(seq, ref_seq) and torch.equal(logits, ref_logits)


def test_unsupported_rope_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                      rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                           original_max_position_embeddings=256))
    with pytest.raises(kvcore.NotSupportedError, match="yarn"):
        kvcore_hf.KvcoreCache(LlamaForCausalLM(cfg))
