"""A long token stream through a KvcoreCache that shifts when its window fills (llama.cpp's context
shift: keep n_keep sink tokens, discard the next n_discard, move the rest down), scored in as few
forwards as that allows.

Between two shifts the cache only grows, so feeding the tokens between them as one chunk (a prefill
against the cache) computes the same function as feeding them one at a time: every token attends to
the same cached keys at the same positions plus the tokens before it in the chunk (causal). What
makes it the same is where the chunks end: exactly where token-by-token decoding would shift, i.e.
a chunk fills the cache to `window` and the next chunk's first token triggers the shift.
shift_chunks() places those boundaries; stream_log_probs() runs the model over them."""

import torch

from .compat import cache_kwargs


def shift_chunks(n_tokens, window, n_keep, n_discard, max_chunk=None):
    """Chunk lengths that feed n_tokens through a cache of `window` live tokens so that no chunk
    spans a shift and every shift happens where token-by-token decoding would do it (the cache holds
    exactly `window` tokens and one more arrives). A chunk is at most window - n_keep tokens (what
    KvcoreCache takes in one step) and at most max_chunk (splitting between shifts changes nothing)."""
    if not 0 <= n_keep < window or not 0 < n_discard <= window - n_keep:
        raise ValueError(f"shift_chunks: window {window}, n_keep {n_keep}, n_discard {n_discard}")
    cap = window - n_keep if max_chunk is None else min(max_chunk, window - n_keep)
    live, fed = 0, 0
    while fed < n_tokens:
        if live == window:
            live -= n_discard
        c = min(window - live, cap, n_tokens - fed)
        yield c
        live += c
        fed += c


def stream_log_probs(model, ids, cache, chunks, logits_rows=512):
    """Feed ids [1, n] through `cache` in the given chunk lengths; yields (start, log_probs) with
    log_probs [c, vocab] float32: row i is the distribution of token start + i + 1. The vocabulary
    projection runs logits_rows rows at a time (a whole 8k-token chunk's logits would be 1.6 GB)."""
    body, head = model.get_decoder(), model.get_output_embeddings()
    kw = cache_kwargs(body, cache)
    start = 0
    with torch.no_grad():
        for c in chunks:
            hidden = body(input_ids=ids[:, start:start + c], **kw, use_cache=True).last_hidden_state[0]
            rows = [torch.log_softmax(head(hidden[r:r + logits_rows]).float(), dim=-1)
                    for r in range(0, c, logits_rows)]
            yield start, torch.cat(rows)
            start += c


def stream_nll(model, ids, cache, chunks):
    """Per-token negative log-likelihood of ids[0, 1:] (a list of n - 1 floats)."""
    target = ids[0]
    out = []
    for start, lp in stream_log_probs(model, ids, cache, chunks):
        nxt = target[start + 1:start + 1 + lp.shape[0]]
        out.extend((-lp[:nxt.shape[0]].gather(1, nxt[:, None])[:, 0]).tolist())
    return out
