"""llama.cpp's own context shift on SmolLM2's GGUF, through the PyPI package llama-cpp-python (its
quantized CPU matmuls), for the StreamingLLM table beside kvcore, and its decode tokens/s for the
throughput table.

The shift is llama.cpp's (examples/main's context shift): when the window is full, remove
positions [n_keep, n_keep + n_discard) from the KV cache (llama_memory_seq_rm) and move the rest
down by n_discard (llama_memory_seq_add, which re-rotates the cached keys), n_discard = half of the
non-kept part. Tokens between two shifts go in as one batch, as kvcore's side does
(kvcore.hf.streaming.shift_chunks places the same boundaries).

llama-cpp-python is built here from its PyPI sdist (CPU; no wheel on PyPI), kept outside git:
  CMAKE_BUILD_PARALLEL_LEVEL=2 pip wheel --no-deps --no-binary llama-cpp-python llama-cpp-python -w /work/wheels-cache
  pip install --target <dir> /work/wheels-cache/llama_cpp_python-*.whl diskcache jinja2   # then PYTHONPATH=<dir>
  python bench/hf/llamacpp_ppl.py --contexts 16 1024 4096 --threads 1 2
"""

import argparse
import ctypes
import json
import math
import sys
import time

import numpy as np


def _open(path, n_ctx, threads, n_batch):
    from llama_cpp import Llama

    return Llama(model_path=path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=min(n_batch, 512), n_threads=threads,
                 n_threads_batch=threads, logits_all=False, verbose=False)


class _Batch:
    """A llama_batch of up to `cap` tokens of sequence 0 (freed with the object)."""

    def __init__(self, cap):
        import llama_cpp

        self.lib, self.cap = llama_cpp, cap
        self.b = llama_cpp.llama_batch_init(cap, 0, 1)

    def fill(self, tokens, first_pos, all_logits):
        b = self.b
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i] = t
            b.pos[i] = first_pos + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if all_logits or i == len(tokens) - 1 else 0
        return b

    def __del__(self):
        self.lib.llama_batch_free(self.b)


def _decode(llm, batch):
    import llama_cpp

    rc = llama_cpp.llama_decode(llm.ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def streaming_nll(path, tokens, window, n_keep, threads, max_chunk=1024):
    """Per-token NLL of tokens[1:] through llama.cpp with its context shift at `window` live tokens.
    Returns dict(nll, shifts, n_keep, n_discard)."""
    import llama_cpp

    from kvcore.hf.streaming import shift_chunks

    n_discard = max(1, (window - n_keep) // 2)
    cap = min(max_chunk, window - n_keep)
    llm = _open(path, window, threads, cap)
    mem = llama_cpp.llama_get_memory(llm.ctx)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(llm.model))
    batch = _Batch(cap)
    nll, live, pos, start, shifts = [], 0, 0, 0, 0
    for c in shift_chunks(len(tokens), window, n_keep, n_discard, max_chunk):
        if live + c > window:
            llama_cpp.llama_memory_seq_rm(mem, 0, n_keep, n_keep + n_discard)
            llama_cpp.llama_memory_seq_add(mem, 0, n_keep + n_discard, pos, -n_discard)
            live, pos, shifts = live - n_discard, pos - n_discard, shifts + 1
        _decode(llm, batch.fill(tokens[start:start + c], pos, True))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(llm.ctx), shape=(c * n_vocab,))
        logits = logits.reshape(c, n_vocab).astype(np.float64)
        tgt = np.asarray(tokens[start + 1:start + 1 + c])
        rows = logits[:tgt.shape[0]]
        mx = rows.max(axis=1)
        lse = mx + np.log(np.exp(rows - mx[:, None]).sum(axis=1))
        nll.extend((lse - rows[np.arange(tgt.shape[0]), tgt]).tolist())
        live, pos, start = live + c, pos + c, start + c
    return dict(nll=nll, shifts=shifts, n_keep=n_keep, n_discard=n_discard)


def decode_tokens_per_s(path, context, threads, steps=32, rounds=3):
    """Decode tokens/s after a `context`-token prompt (best of `rounds`, each `steps` single-token
    steps), like HF generate()'s steps: one token in, the last token's logits out."""
    llm = _open(path, context + steps + 8, threads, 512)
    import llama_cpp

    batch = _Batch(512)
    prompt = [(7 * i + 11) % 40000 + 100 for i in range(context)]
    best = 0.0
    for _ in range(rounds):
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(llm.ctx), True)
        for s in range(0, context, 512):
            _decode(llm, batch.fill(prompt[s:s + 512], s, False))
        t0 = time.perf_counter()
        for i in range(steps):
            _decode(llm, batch.fill([prompt[i % context]], context + i, False))
        best = max(best, steps / (time.perf_counter() - t0))
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--contexts", type=int, nargs="+", default=[16, 1024, 4096])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.gguf is None:
        import os

        from kvcore.hf import smollm2

        d, name = smollm2.fetch()
        a.gguf = os.path.join(d, name)
    import llama_cpp

    for th in a.threads:
        for ctx in a.contexts:
            tps = decode_tokens_per_s(a.gguf, ctx, th, a.steps)
            row = dict(engine="llama.cpp", version=llama_cpp.__version__, threads=th, context=ctx,
                       tokens_per_s=round(tps, 2))
            print(json.dumps(row), flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    sys.exit(main())
