#!/usr/bin/env python3
"""Before/after table of two `kvcore bench --json` files from one GPU job (same bench + case
names): median us of each, ratio before / after (> 1: the change is faster), and per bench the
geometric mean and range of the ratios. Cases only one side has are listed apart.
  python bench/compare_runs.py before.jsonl after.jsonl [--label-before X --label-after Y]"""
import argparse
import json
import math


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "case" in r and "median_us" in r:
                rows[(r["bench"], r["case"])] = r
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--label-before", default="before")
    ap.add_argument("--label-after", default="after")
    a = ap.parse_args()
    b, n = load(a.before), load(a.after)
    both = [k for k in n if k in b]
    print(f"| bench | case | {a.label_before} us | {a.label_after} us | before / after |")
    print("|---|---|---:|---:|---:|")
    for k in both:
        rb, rn = b[k]["median_us"], n[k]["median_us"]
        print(f"| {k[0]} | {k[1]} | {rb:.2f} | {rn:.2f} | {rb / rn:.3f} |")
    print("\n| bench | cases | geomean before / after | min | max |")
    print("|---|---:|---:|---:|---:|")
    for bench in sorted({k[0] for k in both}):
        rs = [b[k]["median_us"] / n[k]["median_us"] for k in both if k[0] == bench]
        gm = math.exp(sum(math.log(x) for x in rs) / len(rs))
        print(f"| {bench} | {len(rs)} | {gm:.3f} | {min(rs):.3f} | {max(rs):.3f} |")
    for side, rows, other in ((a.label_before, b, n), (a.label_after, n, b)):
        only = [k for k in rows if k not in other]
        if only:
            print(f"\nOnly in {side}: " + "; ".join(f"{k[0]}/{k[1]} {rows[k]['median_us']:.1f} us" for k in only))


if __name__ == "__main__":
    main()
