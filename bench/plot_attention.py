#!/usr/bin/env python3
"""PNG plots of one GPU job's attention results beside its baselines, for readers who want the picture at a glance.

  python3 bench/plot_attention.py --kvcore bench.jsonl --baselines baselines.jsonl --out bench/results/<date>-<what>

writes <out>-decode-time.png (time against context length), <out>-decode-share.png (share of the read ceiling the
same job measured) and, where prefill rows exist, <out>-prefill.png (TFLOP/s against the dense f16 peak). One line
per system and batch. Only rows of one job belong together (the ceiling and the baselines were measured beside
kvcore); the script refuses files from different devices. Needs matplotlib (pip install matplotlib).
"""
import argparse
import collections
import json
import re
import sys

# Llama-3-8B prefill shape of `kvcore bench attention_prefill` and the baselines (bench/attention_prefill_bench.cpp).
Q_HEADS, HEAD_DIM = 32, 128
# Dense f16/bf16 tensor-core peak with f32 accumulation (NVIDIA's H100/H200 SXM datasheet: 989.4 TFLOP/s).
DENSE_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4}

DECODE = re.compile(r"^llama8b_(f16|fp8)_b(\d+)_ctx(\d+)(_graph)?$")
PREFILL = re.compile(r"^llama8b_prefill_f16_b(\d+)_ctx(\d+)_new(\d+)$")
PREFILL_VARIANT = re.compile(r"^(llama8b_prefill_f16_b\d+_ctx\d+_new\d+)(?:_(\w+))?$")


def read_jsonl(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    return rows


def visible_pairs(ctx, n_new):
    """(query, key) pairs of one sequence's causal chunk: query i sees ctx - n_new + 1 + i keys."""
    return n_new * (ctx - n_new + 1) + n_new * (n_new - 1) / 2


def collect(kv_rows, base_rows):
    """(system, dtype, timing, batch) -> {ctx: (median_us, gbps)} for decode; prefill rows by case."""
    devices = {r.get("device_name") for r in kv_rows + base_rows if r.get("device_name")}
    if len(devices) > 1:
        sys.exit(f"rows from different devices {sorted(devices)}: plot one job at a time")
    ceilings = [r["read_gbps"] for r in kv_rows if r.get("bench") == "ceilings" and "read_gbps" in r]
    read_ceiling = max(ceilings) if ceilings else None
    decode = collections.defaultdict(dict)
    prefill = collections.defaultdict(dict)

    def put_decode(system, case, us, gbps):
        m = DECODE.match(case)
        if m:
            dtype, batch, ctx, graph = m.group(1), int(m.group(2)), int(m.group(3)), bool(m.group(4))
            decode[(system, dtype, "graph" if graph else "eager", batch)][ctx] = (us, gbps)

    def put_prefill(system, case, us):
        m = PREFILL.match(case)
        if m:
            batch, ctx, n_new = (int(g) for g in m.groups())
            flops = 4.0 * HEAD_DIM * Q_HEADS * batch * visible_pairs(ctx, n_new)
            prefill[case][system] = flops / us / 1e6

    for r in kv_rows:
        if r.get("bench") == "attention":
            put_decode("kvcore", r["case"], r["median_us"], r["gbps"])
        elif r.get("bench") == "attention_prefill":
            # A kernel variant's row names the shape then the variant: <shape case>_<variant>.
            m = PREFILL_VARIANT.match(r["case"])
            if m:
                put_prefill("kvcore" + (f" ({m.group(2)})" if m.group(2) else ""), m.group(1), r["median_us"])
    for r in base_rows:
        bench, variant = r.get("bench"), r.get("variant")
        if bench == "attention_flashinfer" and variant == "best":
            put_decode("FlashInfer", r["case"], r["median_us"], r["gbps"])
        elif bench == "attention_flashinfer" and variant == "prefill":
            put_prefill("FlashInfer", r["case"], r["median_us"])
        elif bench == "attention_sdpa" and variant == "dense":
            put_decode("SDPA (dense)", r["case"], r["median_us"], r["gbps"])
        elif bench == "attention_sdpa" and variant == "dense_causal":
            put_prefill("SDPA", r["case"], r["median_us"])
    return decode, prefill, read_ceiling, (devices.pop() if devices else "GPU")


STYLE = {"kvcore": ("tab:blue", "o"), "FlashInfer": ("tab:orange", "s"), "SDPA (dense)": ("tab:green", "^")}
BATCH_LINE = {1: "-", 16: "--", 64: ":"}


def plot_decode(plt, decode, read_ceiling, device, out, share):
    panels = [(d, t) for d in ("f16", "fp8") for t in ("eager", "graph")]
    fig, axes = plt.subplots(2, 2, figsize=(13, 9), sharex=True)
    for ax, (dtype, timing) in zip(axes.flat, panels):
        for (system, d, t, batch), points in sorted(decode.items()):
            if d != dtype or t != timing or (share and not read_ceiling):
                continue
            ctxs = sorted(points)
            ys = [points[c][1] / read_ceiling if share else points[c][0] for c in ctxs]
            color, marker = STYLE.get(system, ("tab:gray", "x"))
            ax.plot(ctxs, ys, color=color, marker=marker, linestyle=BATCH_LINE.get(batch, "-."),
                    label=f"{system} b{batch}")
        ax.set_xscale("log", base=2)
        if share:
            ax.set_ylim(0, 1.05)
            ax.set_ylabel("share of measured read ceiling")
        else:
            ax.set_yscale("log")
            ax.set_ylabel("median time per call (us)")
        ax.set_title(f"{dtype} pages, {'CUDA graph replay' if timing == 'graph' else 'eager launches'}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, ncol=3)
    for ax in axes[-1]:
        ax.set_xlabel("context tokens per sequence")
    what = "share of read ceiling" if share else "time"
    ceiling = f", read ceiling {read_ceiling:.0f} GB/s" if read_ceiling else ""
    fig.suptitle(f"Llama-3-8B paged decode attention ({what}), {device}{ceiling}; lower time is better")
    fig.tight_layout()
    path = f"{out}-decode-{'share' if share else 'time'}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_prefill(plt, prefill, device, out):
    cases = sorted(prefill)
    systems = sorted({s for c in cases for s in prefill[c]})
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / max(len(systems), 1)
    for i, system in enumerate(systems):
        xs = [k + i * width for k in range(len(cases))]
        ax.bar(xs, [prefill[c].get(system, 0) for c in cases], width, label=system)
    peak = next((v for k, v in DENSE_PEAK_TFLOPS.items() if k in device), None)
    if peak:
        ax.axhline(peak, color="black", linestyle="--", linewidth=1, label=f"dense f16 peak {peak:.0f}")
    ax.set_xticks([k + 0.4 - width / 2 for k in range(len(cases))])
    ax.set_xticklabels([c.replace("llama8b_prefill_f16_", "") for c in cases])
    ax.set_ylabel("TFLOP/s (4 x head_dim flops per visible query-key pair)")
    ax.set_title(f"Llama-3-8B causal prefill over paged f16 KV, {device}; higher is better")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = f"{out}-prefill.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvcore", nargs="+", required=True, help="bench.jsonl of the job (kvcore bench --json)")
    ap.add_argument("--baselines", nargs="*", default=[], help="baselines.jsonl of the same job")
    ap.add_argument("--out", required=True, help="path prefix of the PNG files")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("matplotlib is not installed (pip install matplotlib)")
    decode, prefill, read_ceiling, device = collect(read_jsonl(args.kvcore), read_jsonl(args.baselines))
    written = []
    if decode:
        written.append(plot_decode(plt, decode, read_ceiling, device, args.out, share=False))
        if read_ceiling:
            written.append(plot_decode(plt, decode, read_ceiling, device, args.out, share=True))
    if prefill:
        written.append(plot_prefill(plt, prefill, device, args.out))
    if not written:
        sys.exit("no attention rows in the given files")
    print("\n".join(written))


if __name__ == "__main__":
    main()
