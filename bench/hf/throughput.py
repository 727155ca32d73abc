"""Decode tokens/s of transformers models with kvcore's cache ("kvcore" attention, f16 / FP8 pages)
against HF's default cache (DynamicCache) with sdpa (HF's default) and eager attention, and (with
--hf-paged) HF's own paged continuous batching (generate_batch), at a given context and batch.

The caches are filled with random K/V to `context` tokens (no prefill compute: the prompt's
content does not change a decode step's cost), then `steps` decode steps of the model run, each
one new token per row. With --share, kvcore's part of a step (store + attention, the host work
around them included) is timed too (CPU: wall clock around those calls).

  python bench/hf/throughput.py --model smollm2 --contexts 16 1024 4096 --batches 1 --device cpu
  python bench/hf/throughput.py --model llama3-8b-shape --contexts 1024 8192 32768 --batches 1 16 64 --device cuda
"""

import argparse
import json
import sys
import time


def build(name, device, dtype):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    if name == "smollm2":
        from kvcore.hf import smollm2

        m, _ = smollm2.load(device=device, dtype=dtype)
        return m
    if name == "smollm2-shape":
        cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True,
                          max_position_embeddings=65536, rope_parameters=dict(rope_type="default", rope_theta=100000.0))
    elif name == "llama3-8b-shape":
        cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
                          rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                               high_freq_factor=4.0, original_max_position_embeddings=8192))
    else:
        raise SystemExit(f"unknown model {name}")
    with torch.device(device):
        m = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return m.eval()


def fill_kvcore(model, cache, batch, context, device, dtype):
    """Rows of `context` random tokens straight into the pages (layer by layer)."""
    import torch

    cfg = model.config
    cache._allocate(batch, torch.device(device))
    cache.seqs = [cache.paged.create() for _ in range(batch)]
    step = 4096
    for s0 in range(0, context, step):
        n = min(step, context - s0)
        t = cache.paged.reserve(cache.seqs, list(range(s0, s0 + n)) * batch, [n] * batch)
        for layer in range(cfg.num_hidden_layers):
            k = torch.randn(batch * n, cfg.num_key_value_heads, cfg.head_dim, device=device, dtype=dtype)
            cache.paged.store(t, layer, k, k)
    cache._consumed = context


def fill_dynamic(model, batch, context, device, dtype):
    import torch
    from transformers import DynamicCache

    cfg = model.config
    cache = DynamicCache(config=cfg)
    for layer in range(cfg.num_hidden_layers):
        k = torch.randn(batch, cfg.num_key_value_heads, context, cfg.head_dim, device=device, dtype=dtype)
        cache.update(k, k.clone(), layer)
    return cache


def decode(model, cache, batch, steps, device, mask_len=None):
    import torch

    from kvcore.hf import cache_kwargs

    tok = torch.randint(0, 1000, (batch, 1), device=device)
    kw = cache_kwargs(model, cache)
    times = []
    with torch.no_grad():
        for i in range(steps + 2):
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = model(tok, **kw).logits
            tok = logits[:, -1:].argmax(-1)
            if device != "cpu":
                torch.cuda.synchronize()
            if i >= 2:  # two warm-up steps
                times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def hf_paged_tok_s(model, batch, context, steps, device):
    """Decode tokens/s of HF's own paged continuous batching (generate_batch) on `batch` prompts of
    `context` random tokens: the generated tokens stamped after every request got its first one
    (prefill done), over the time from then to the last stamp."""
    import torch
    from transformers import GenerationConfig

    gc = GenerationConfig(max_new_tokens=steps + 1, do_sample=False, eos_token_id=-1, pad_token_id=0)
    prompts = torch.randint(10, 1000, (batch, context)).tolist()
    with torch.no_grad():
        out = model.generate_batch(inputs=prompts, generation_config=gc, record_timestamps=True)
    stamps = [o.timestamps for o in out.values()]
    if len(stamps) != batch or any(not t or len(t) != steps + 1 for t in stamps):
        raise RuntimeError(f"generate_batch returned {[len(t or []) for t in stamps]} stamps, wanted {steps + 1} each")
    start = max(t[0] for t in stamps)
    end = max(t[-1] for t in stamps)
    n = sum(1 for t in stamps for x in t if x > start)
    return n / (end - start), model.config._attn_implementation


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--contexts", type=int, nargs="+", default=[16, 1024, 4096])
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="model dtype (default: f32 on cpu, bf16 on cuda)")
    ap.add_argument("--formats", nargs="+", default=["f16", "fp8"])
    ap.add_argument("--hf-impls", nargs="+", default=["sdpa", "eager"], help="HF attention with DynamicCache")
    ap.add_argument("--hf-paged", action="store_true",
                    help="also HF's paged continuous batching (generate_batch), prompts of the context's length")
    ap.add_argument("--hf-paged-max-tokens", type=int, default=1 << 18,
                    help="skip generate_batch where batch x context (its prefill) exceeds this")
    ap.add_argument("--share", action="store_true", help="time kvcore's part of a step")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=1, help="best (fastest median) of this many rounds of steps")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    import torch

    import kvcore
    import kvcore.hf

    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.float32 if a.device == "cpu" else torch.bfloat16)
    model = build(a.model, a.device, dtype)
    rows = []
    for batch in a.batches:
        for ctx in a.contexts:
            row = dict(model=a.model, device=a.device, dtype=str(dtype).split(".")[-1], batch=batch, context=ctx,
                       threads=torch.get_num_threads(), torch=torch.__version__,
                       transformers=__import__("transformers").__version__)
            for impl in a.hf_impls:
                try:
                    model.set_attn_implementation(impl)
                    cache = fill_dynamic(model, batch, ctx, a.device, dtype)
                    t = min(decode(model, cache, batch, a.steps, a.device) for _ in range(a.rounds))
                    row[f"hf_{impl}_dynamic_tok_s"] = batch / t
                    del cache
                except torch.OutOfMemoryError:
                    row[f"hf_{impl}_dynamic_tok_s"] = None
            if a.device != "cpu":
                torch.cuda.empty_cache()
            for fmt in a.formats:
                model.set_attn_implementation("kvcore")
                cache = kvcore.hf.KvcoreCache(model, window=ctx + a.rounds * (a.steps + 2) + 8, k_format=fmt,
                                              v_format=fmt)
                try:
                    fill_kvcore(model, cache, batch, ctx, a.device, dtype)
                except kvcore.OutOfMemoryError:
                    row[f"kvcore_{fmt}_tok_s"] = None
                    continue
                spent = [0.0]
                if a.share:
                    inner = cache.attend

                    def timed(*args, **kw):
                        if a.device != "cpu":
                            torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        r = inner(*args, **kw)
                        if a.device != "cpu":
                            torch.cuda.synchronize()
                        spent[0] += time.perf_counter() - t0
                        return r

                    cache.attend = timed
                t = min(decode(model, cache, batch, a.steps, a.device) for _ in range(a.rounds))
                row[f"kvcore_{fmt}_tok_s"] = batch / t
                row[f"kvcore_{fmt}_kv_bytes_per_token"] = cache.kv_bytes_per_token
                if a.share:
                    row[f"kvcore_{fmt}_share"] = spent[0] / (a.rounds * (a.steps + 2)) / t
                del cache
                if a.device != "cpu":
                    torch.cuda.empty_cache()
            model.set_attn_implementation("sdpa")
            if a.hf_paged and batch * ctx <= a.hf_paged_max_tokens:
                try:
                    row["hf_paged_cb_tok_s"], row["hf_paged_cb_attn"] = hf_paged_tok_s(model, batch, ctx, a.steps,
                                                                                      a.device)
                except Exception as e:  # noqa: BLE001 -- a failure is a row entry, the sweep goes on
                    row["hf_paged_cb_tok_s"], row["hf_paged_cb_error"] = None, f"{type(e).__name__}: {str(e)[:200]}"
                model.set_attn_implementation("sdpa")
                if a.device != "cpu":
                    torch.cuda.empty_cache()
            print(json.dumps(row), flush=True)
            rows.append(row)
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    sys.exit(main())
