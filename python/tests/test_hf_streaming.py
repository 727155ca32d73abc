"""Chunked streaming (kvcore.hf.streaming) is token-by-token decoding, faster: feeding the tokens
between two context shifts as one prefill chunk gives the logits that feeding them one at a time
gives, shift for shift.

Bound: f32 pages and an f32 model, so the two differ only in accumulation order (a prefill tile
against single-row decode, GEMMs over different row counts): a few 1e-7 relative per op, 30 layers
of it at most; 2e-5 of the largest |log-probability|, as the shift oracle uses. The control chunks
(fixed 24-token chunks that cross shift points) must miss the bound by far, so the test can fail."""

import pytest

from hf_models import DEVICES, model, prompt

torch = pytest.importorskip("torch")
kvcore_hf = pytest.importorskip("kvcore.hf")
from kvcore.hf.streaming import shift_chunks, stream_log_probs, stream_nll  # noqa: E402

WINDOW, N_KEEP, N_DISCARD, TOKENS = 32, 4, 14, 120
BOUND = 2e-5


def run(m, ids, chunks, rope_mode):
    m.set_attn_implementation("kvcore")
    cache = kvcore_hf.KvcoreCache(m, window=WINDOW, n_keep=N_KEEP, n_discard=N_DISCARD, k_format="f32",
                                  v_format="f32", rope_mode=rope_mode)
    lp = torch.cat([x for _, x in stream_log_probs(m, ids, cache, list(chunks))])
    return lp, cache.shifts


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rope_mode", ["on_read", "stored"])
def test_chunks_between_shifts_equal_token_by_token(device, rope_mode):
    m = model("smollm", device=device)
    ids = prompt(TOKENS, device=device)
    chunks = list(shift_chunks(TOKENS, WINDOW, N_KEEP, N_DISCARD))
    assert len(chunks) < TOKENS // 8
    one, shifts_one = run(m, ids, [1] * TOKENS, rope_mode)
    chunked, shifts_chunked = run(m, ids, chunks, rope_mode)
    assert shifts_one == shifts_chunked == (TOKENS - WINDOW + N_DISCARD - 1) // N_DISCARD
    assert rel(chunked, one) < BOUND
    crossing, _ = run(m, ids, [24] * (TOKENS // 24), rope_mode)
    assert rel(crossing, one) > 100 * BOUND


def test_shift_chunks_boundaries():
    # window 10, 2 sinks, discard 4: fill to 8 (the cap window - n_keep), +2 to 10, then 4 per shift
    assert list(shift_chunks(24, 10, 2, 4)) == [8, 2, 4, 4, 4, 2]
    assert list(shift_chunks(24, 10, 2, 4, max_chunk=3)) == [3, 3, 3, 1, 3, 1, 3, 1, 3, 1, 2]
    assert sum(shift_chunks(1000, 256, 4, 126)) == 1000
    with pytest.raises(ValueError):
        list(shift_chunks(10, 8, 8, 1))
    with pytest.raises(ValueError):
        list(shift_chunks(10, 8, 2, 7))


def test_stream_nll_scores_every_token_once():
    m = model("smollm")
    ids = prompt(50)
    m.set_attn_implementation("kvcore")
    cache = kvcore_hf.KvcoreCache(m, window=64, n_keep=4, k_format="f32")
    nll = stream_nll(m, ids, cache, shift_chunks(50, 64, 4, 30))
    with torch.no_grad():
        m.set_attn_implementation("eager")
        lp = torch.log_softmax(m(ids).logits[0].float(), dim=-1)
    ref = (-lp[:-1].gather(1, ids[0, 1:, None])[:, 0]).tolist()
    assert len(nll) == 49
    assert max(abs(a - b) for a, b in zip(nll, ref)) < 1e-4
