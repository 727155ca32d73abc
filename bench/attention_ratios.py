#!/usr/bin/env python3
"""Join `kvcore bench attention --json A` with `attention_sdpa_baseline.py --json B`.

Prints, per case: kvcore median us, GB/s, share of the read-only ceiling,
SDPA dense / paged median us, and the ratios SDPA time / kvcore time (> 1:
kvcore is faster), and writes the joined records as JSON lines with --out.
Usage: python bench/attention_ratios.py A.jsonl B.jsonl [--out joined.jsonl]
"""
import argparse
import json


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvcore")
    ap.add_argument("sdpa")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    ours = {r["case"]: r for r in load(a.kvcore) if r.get("bench") == "attention"}
    base = {}
    for r in load(a.sdpa):
        if r.get("bench") == "attention_sdpa":
            base[(r["case"], r["variant"])] = r
    out = open(a.out, "w") if a.out else None
    print(f"{'case':34s} {'kvcore_us':>10s} {'GB/s':>8s} {'share':>6s} {'sdpa_dense':>10s} {'ratio':>6s} "
          f"{'sdpa_paged':>10s} {'ratio':>6s}")
    for case, r in ours.items():
        d, p = base.get((case, "dense")), base.get((case, "paged"))
        rd = d["median_us"] / r["median_us"] if d else None
        rp = p["median_us"] / r["median_us"] if p else None
        f = lambda x, w=10, n=1: (f"{x:{w}.{n}f}" if x is not None else " " * (w - 1) + "-")
        print(f"{case:34s} {r['median_us']:10.1f} {r['gbps']:8.0f} {100 * r['share_of_ceiling']:5.1f}% "
              f"{f(d['median_us'] if d else None)} {f(rd, 6, 2)} {f(p['median_us'] if p else None)} {f(rp, 6, 2)}")
        if out:
            j = dict(r)
            j.update(sdpa_dense_us=d["median_us"] if d else None, ratio_dense=rd,
                     sdpa_paged_us=p["median_us"] if p else None, ratio_paged=rp)
            out.write(json.dumps(j) + "\n")


if __name__ == "__main__":
    main()
