#!/usr/bin/env python3
"""PNG plot of one job's decode-step appends (`kvcore bench append --json`) against a same-size copy.

  python3 bench/plot_append.py APPEND.jsonl --out bench/results/<date>-<what>

writes <out>-append.png with two panels, batch (sequences of one new token) on the x axis, one line per page
format and way of timing:
  - time of the one-launch store of every layer's K and V, and of a device copy of the same bytes (us, log scale);
  - the store's speed as a share of that copy's, eager (each call from the host) and from a CUDA graph (host time
    out), with the 70% goal as a line.
The copy-from-a-graph rows exist from a1f9c90 on; older files give the eager panel only. Needs matplotlib.
"""
import argparse
import json
import re
import sys

CASE = re.compile(r"^step_(f16|fp8)_b(\d+)(_graph|_copy|_copy_graph)?$")


def rows(path):
    """{(format, batch, kind): (median us, bytes)} with kind '' (eager store), _graph, _copy, _copy_graph."""
    out, devices = {}, set()
    with open(path) as f:
        for line in f:
            if not line.startswith("{"):
                continue
            row = json.loads(line)
            devices.add(row.get("device_name"))
            m = CASE.match(row.get("case", ""))
            if m and row.get("bench") == "append":
                out[(m.group(1), int(m.group(2)), m.group(3) or "")] = (row["median_us"], row["bytes"])
    return out, devices


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("append_jsonl")
    ap.add_argument("--out", required=True, help="path prefix of the PNG file")
    args = ap.parse_args()
    data, devices = rows(args.append_jsonl)
    if not data:
        sys.exit(f"{args.append_jsonl}: no append rows")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(13, 4.8))
    colors = {"f16": "tab:blue", "fp8": "tab:orange"}
    for fmt in ("f16", "fp8"):
        batches = sorted({b for (f, b, _k) in data if f == fmt})
        if not batches:
            continue
        for kind, style, label in (("", "-", "store, eager"), ("_graph", "--", "store, CUDA graph"),
                                   ("_copy", ":", "copy, eager"), ("_copy_graph", "-.", "copy, CUDA graph")):
            pts = [(b, data[(fmt, b, kind)][0]) for b in batches if (fmt, b, kind) in data]
            if pts:
                ax_t.plot(*zip(*pts), style, marker="o", color=colors[fmt], label=f"{fmt} {label}")
        for store, copy, style, label in (("", "_copy", "-", "eager"), ("_graph", "_copy_graph", "--", "CUDA graph")):
            pts = []
            for b in batches:
                if (fmt, b, store) in data and (fmt, b, copy) in data:
                    (ts, bs), (tc, bc) = data[(fmt, b, store)], data[(fmt, b, copy)]
                    pts.append((b, 100.0 * (bs / ts) / (bc / tc)))
            if pts:
                ax_s.plot(*zip(*pts), style, marker="o", color=colors[fmt], label=f"{fmt}, {label}")
    ax_t.set_xscale("log", base=2)
    ax_t.set_yscale("log")
    ax_t.set_xlabel("batch (sequences, one new token each)")
    ax_t.set_ylabel("us (median)")
    ax_t.set_title("store of all 32 layers' K/V vs a copy of the same bytes")
    ax_t.legend(fontsize=7, ncol=2, loc="upper left")
    ax_t.grid(alpha=0.3)
    ax_s.axhline(70, color="gray", lw=1)
    ax_s.text(1, 71, "70% goal", fontsize=8, color="gray")
    ax_s.set_xscale("log", base=2)
    ax_s.set_ylim(0, 110)
    ax_s.set_xlabel("batch (sequences, one new token each)")
    ax_s.set_ylabel("% of the copy's GB/s")
    ax_s.set_title("the store's speed as a share of the copy's")
    ax_s.legend(fontsize=8)
    ax_s.grid(alpha=0.3)
    fig.suptitle(f"Llama-3-8B decode-step append, one launch ({', '.join(sorted(d for d in devices if d))}); higher share is better")
    fig.tight_layout()
    fig.savefig(f"{args.out}-append.png", dpi=110)
    print(f"wrote {args.out}-append.png")


if __name__ == "__main__":
    main()
