#!/usr/bin/env python3
"""Summarize one GPU job: kvcore's records (bench.jsonl) beside the Python baselines
(baselines.jsonl, same bench + case names), as a markdown report with ratios
(ratio = baseline time / kvcore time, both measured in the same job)."""
import json
import os
import sys


def load(path):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    return rows


def label(r):
    """Name of an external baseline record: its bench plus variant (e.g. attention_sdpa/dense)."""
    name = r.get("baseline") or r.get("bench", "?")
    return f"{name}/{r['variant']}" if r.get("variant") else name


def main(out):
    ours = load(os.path.join(out, "bench.jsonl"))
    base = load(os.path.join(out, "baselines.jsonl"))
    ceilings = [r for r in ours if r.get("bench") == "ceilings"]
    ours = [r for r in ours if r.get("bench") != "ceilings"]
    ext = {}
    for r in base:
        ext.setdefault(r.get("case"), []).append(r)
    print("# kvcore GPU job summary\n")
    for c in ceilings:
        print(f"- device {c['device_name']}, commit {c['commit']}: copy ceiling {c['copy_gbps']:.0f} GB/s "
              f"(read+write), read-only ceiling {c['read_gbps']:.0f} GB/s")
    print()
    print("| bench | case | median us | GB/s | share | in-run baseline | ratio | external baseline | ext us | ext ratio |")
    print("|---|---|---:|---:|---:|---|---:|---|---:|---:|")
    for r in ours:
        b = ext.get(r["case"], [])
        ename = ", ".join(label(x) for x in b) or "-"
        eus = ", ".join(f"{x['median_us']:.1f}" for x in b) or "-"
        erat = ", ".join(f"{x['median_us'] / r['median_us']:.2f}" for x in b) or "-"
        ratio = f"{r['ratio']:.2f}" if r.get("ratio") is not None else "-"
        print(f"| {r['bench']} | {r['case']} | {r['median_us']:.1f} | {r['gbps']:.0f} | "
              f"{100 * r['share_of_ceiling']:.1f}% of {r['ceiling']} | {r.get('baseline') or '-'} | {ratio} | "
              f"{ename} | {eus} | {erat} |")
    unmatched = [r for r in base if r.get("case") not in {o["case"] for o in ours}]
    if unmatched:
        print("\nExternal baseline cases with no kvcore counterpart:")
        for r in unmatched:
            print(f"- {r.get('case')}: {r.get('median_us', 0):.1f} us ({label(r)})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "out")
