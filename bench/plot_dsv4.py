#!/usr/bin/env python3
"""PNG plot of the DeepSeek-V4 decode step across states of the code, one GPU job per state.

  python3 bench/plot_dsv4.py --job LABEL KVCORE.jsonl HF.jsonl [--job ...] --out bench/results/<date>-<what>

writes <out>.png with three panels, one point per job (state) on the x axis:
  - kvcore's 43-layer decode step with the lightning indexer, 8k and 64k tokens, eager and from a CUDA graph (us);
  - one CSA layer's indexer at 64k and 8k from a CUDA graph: scores and top-k, stacked (us);
  - HF's time over kvcore's, each job's own HF run beside its kvcore run, with the 50x goal as a line.
Each job's kvcore and HF files must come from that one job (`bench/gpu/dsv4.sh`): HF's step is Python-bound and its
time moves with the machine, so ratios are only taken within a job; "-" for HF.jsonl: a state without HF's run
(several states of one job, `bench/gpu/builds.sh`), which gets no ratio. Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import sys

STEP = "decode43 cache step+indexer ctx={ctx}"
SCORES = "indexer scores only one CSA layer ctx={ctx} (CUDA graph replay)"
TOPK = "indexer top-k only one CSA layer ctx={ctx} (CUDA graph replay)"
CONTEXTS = (8192, 65536)


def medians(path):
    out = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                row = json.loads(line)
                if "case" in row:
                    out[row["case"]] = row["median_us"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", nargs=3, action="append", metavar=("LABEL", "KVCORE_JSONL", "HF_JSONL"), required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, kv, hf = [], [], []
    for label, kv_path, hf_path in args.job:
        labels.append(label)
        kv.append(medians(kv_path))
        hf.append(medians(hf_path) if hf_path != "-" else {})
    for label, k in zip(labels, kv):
        missing = [STEP.format(ctx=c) for c in CONTEXTS if STEP.format(ctx=c) not in k]
        if missing:
            sys.exit(f"job {label}: no row {missing[0]!r}")
    x = list(range(len(labels)))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))

    ax = axes[0]
    for ctx, color in zip(CONTEXTS, ("tab:blue", "tab:orange")):
        case = STEP.format(ctx=ctx)
        ax.plot(x, [k[case] for k in kv], "o--", color=color, label=f"{ctx // 1024}k eager")
        ax.plot(x, [k[case + " (CUDA graph replay)"] for k in kv], "o-", color=color, label=f"{ctx // 1024}k CUDA graph")
    ax.set_title("kvcore: 43-layer decode step + indexer")
    ax.set_ylabel("us a step (median)")
    ax.set_ylim(bottom=0)
    ax.legend()

    ax = axes[1]
    width = 0.38
    for off, ctx in ((-width / 2, 65536), (width / 2, 8192)):
        scores = [k.get(SCORES.format(ctx=ctx), 0.0) for k in kv]
        topk = [k.get(TOPK.format(ctx=ctx), 0.0) for k in kv]
        xs = [i + off for i in x]
        ax.bar(xs, scores, width, color="tab:green" if ctx == 65536 else "palegreen", label=f"scores {ctx // 1024}k")
        ax.bar(xs, topk, width, bottom=scores, color="tab:purple" if ctx == 65536 else "plum", label=f"top-k {ctx // 1024}k")
    ax.set_title("one CSA layer's indexer, CUDA graph")
    ax.set_ylabel("us")
    ax.legend(fontsize=8)

    ax = axes[2]
    for ctx, color in zip(CONTEXTS, ("tab:blue", "tab:orange")):
        case = STEP.format(ctx=ctx)
        for suffix, style, name in (("", "o--", "eager"), (" (CUDA graph replay)", "o-", "CUDA graph")):
            ratio = [h.get(case, float("nan")) / k[case + suffix] for k, h in zip(kv, hf)]
            ax.plot(x, ratio, style, color=color, label=f"{ctx // 1024}k {name}")
    ax.axhline(50, color="gray", linewidth=1)
    ax.text(0, 51, "50x goal", color="gray", fontsize=8)
    ax.set_title("HF's time / kvcore's, within each job")
    ax.set_ylabel("x")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)

    devices = set()
    for path in [j[1] for j in args.job]:
        with open(path) as f:
            devices.update(json.loads(l).get("device_name") for l in f if l.strip().startswith("{"))
    devices.discard(None)
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=20, fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"DeepSeek-V4 decode, one job a state ({', '.join(sorted(devices))})")
    fig.tight_layout()
    path = f"{args.out}.png"
    fig.savefig(path, dpi=110)
    print(path)


if __name__ == "__main__":
    main()
