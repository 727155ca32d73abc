#!/usr/bin/env python3
"""Markdown tables from a bench/cpu/compare.sh directory.

Usage: summarize.py OUT_DIR [--threads 1 2]
Per thread count: the ceilings each run measured, then per case the kvcore build under
test ("after"), the older build ("before") and the baselines (ggml, NumPy): median and min
microseconds, GB/s of the case's bytes at the median, the share of the ceiling (read for
attention, copy for the rest), and ggml's time over kvcore's (> 1: kvcore faster).
The share is taken of the highest ceiling any run at that thread count measured (also
OUT_DIR/ceilings-check-t{N}.jsonl where present): the host's bandwidth drifts with the
load of other processes, and the highest reading is the conservative denominator.
Repeated rounds: the smallest median and min of each (case, variant).
"""
import argparse
import collections
import json
import os


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def best(records):
    """(case) -> record with the smallest median (min of min kept too)."""
    out = {}
    for r in records:
        key = (r["bench"], r["case"], r.get("variant", ""))
        cur = out.get(key)
        if cur is None or r["median_us"] < cur["median_us"]:
            keep_min = min(r["min_us"], cur["min_us"]) if cur else r["min_us"]
            out[key] = dict(r, min_us=keep_min)
        else:
            cur["min_us"] = min(cur["min_us"], r["min_us"])
    return out


def fmt_us(r):
    return f"{r['median_us']:.0f} / {r['min_us']:.0f}" if r else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--threads", nargs="*", default=["1", "2"])
    a = ap.parse_args()
    for t in a.threads:
        after_all = load(f"{a.dir}/after-t{t}.jsonl")
        before_all = load(f"{a.dir}/before-t{t}.jsonl")
        base = best(load(f"{a.dir}/baselines-t{t}.jsonl"))
        ceil = [r for r in after_all + load(f"{a.dir}/ceilings-check-t{t}.jsonl") if r["bench"] == "ceilings"]
        after = best([r for r in after_all if r["bench"] != "ceilings"])
        before = best([r for r in before_all if r["bench"] != "ceilings"])
        if not after:
            continue
        print(f"\n### {t} thread{'s' if t != '1' else ''}\n")
        if ceil:
            rd = [c["read_gbps"] for c in ceil]
            cp = [c["copy_gbps"] for c in ceil]
            print(f"Ceilings measured by the runs (kvcore harness): read {min(rd):.1f}-{max(rd):.1f} GB/s, "
                  f"copy {min(cp):.1f}-{max(cp):.1f} GB/s; shares below are of the highest.\n")
            top = {"read": max(rd), "copy": max(cp)}
        print("| bench | case | before us (median / min) | after us (median / min) | speed-up | after GB/s | "
              "share of ceiling | ggml us | ggml / after | NumPy us |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for (bench, case, _), r in sorted(after.items()):
            b = before.get((bench, case, ""))
            g16 = base.get((bench, case, "ggml_f16")) or base.get((bench, case, "ggml_q8_0"))
            npy = base.get((bench, case, "numpy_f32"))
            sp = f"{b['median_us'] / r['median_us']:.1f}x" if b else "-"
            share = r.get("share_of_ceiling")
            if ceil and share is not None and r.get("ceiling") in top:
                share = r["gbps"] / top[r["ceiling"]]
            gr = f"{g16['median_us'] / r['median_us']:.2f}" if g16 else "-"
            gname = f" ({g16['variant']})" if g16 else ""
            print(f"| {bench} | {case} | {fmt_us(b)} | {fmt_us(r)} | {sp} | {r['gbps']:.1f} | "
                  f"{100 * share:.0f}% ({r.get('ceiling', '')}) | {fmt_us(g16)}{gname} | {gr} | {fmt_us(npy)} |"
                  if share is not None else
                  f"| {bench} | {case} | {fmt_us(b)} | {fmt_us(r)} | {sp} | {r['gbps']:.1f} | - | {fmt_us(g16)}{gname} | {gr} | {fmt_us(npy)} |")
        extra = [(k, v) for k, v in base.items() if (k[0], k[1], "") not in after]
        for (bench, case, var), r in sorted(extra):
            print(f"| {bench} | {case} | - | - | - | - | - | {fmt_us(r)} ({var}) | - | - |")


if __name__ == "__main__":
    main()
