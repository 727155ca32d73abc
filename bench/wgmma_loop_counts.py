#!/usr/bin/env python3
"""Counts the instructions of the wgmma prefill kernels' tile loops in a built object, with no GPU:
the instructions a warp issues once around the loop on its shortest path (every tile seen whole,
no retries of a barrier wait: the forward branches that skip the masking are taken, the inner
backward branches never), the loop's static size, and the shortest path's instructions by kind.

Why: these kernels' consumer warps are bounded by instruction issue (a profile's stall samples show
it); the tensor cores' time a tile is fixed by the shape, so the instructions a tile is the lever.
With two consumer warpgroups (8 warps) on an SM's 4 schedulers, a tile costs about 2 x path issue
cycles, against 2 * 2 * 128 * 64 * head_dim / 4096 tensor-core cycles at the dense f16 peak
(4096 FLOP a cycle an SM): 1024 at head dim 128, 512 at 64.

    bench/wgmma_loop_counts.py [--nvcc PATH] OBJECT...   (a markdown table on stdout)
"""
import collections
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "tools"))
from wgmma_sass import BRANCH, command_line, kernels, tile_loop  # noqa: E402

# Kinds worth telling apart in an issue-bound softmax loop, by opcode prefix (first match wins).
KINDS = [("HGMMA", "wgmma"), ("MUFU", "mufu (exp2)"), ("FFMA", "float"), ("FMUL", "float"), ("FADD", "float"),
         ("FMNMX", "float"), ("FSEL", "float"), ("FSETP", "float"), ("F2FP", "pack"), ("SHFL", "shuffle"),
         ("BAR", "barrier"), ("SYNCS", "barrier"), ("WARPGROUP", "wgmma"), ("WARPSYNC", "barrier"),
         ("LD", "memory"), ("ST", "memory"), ("U", "uniform"), ("I", "integer"), ("LOP", "integer"),
         ("SHF", "integer"), ("SEL", "integer"), ("MOV", "move"), ("CS2R", "move"), ("S2R", "move"),
         ("ISETP", "integer"), ("PLOP", "predicate"), ("P2R", "predicate"), ("R2P", "predicate"),
         ("BRA", "branch"), ("BSSY", "branch"), ("BSYNC", "branch")]


def opcode(text):
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0] if words else ""


def kind(op):
    for prefix, name in KINDS:
        if op.startswith(prefix):
            return name
    return "other"


def shortest_path(code, lo, hi):
    """Instructions on the cheapest way from lo to the back edge at hi, forward edges only."""
    body = [(at, text) for at, text in code if lo <= at <= hi]
    index = {at: i for i, (at, _) in enumerate(body)}
    inf = float("inf")
    cost = [inf] * (len(body) + 1)  # cost[i]: fewest instructions issued before reaching body[i]
    via = [None] * (len(body) + 1)
    cost[0] = 0
    for i, (at, text) in enumerate(body):
        if cost[i] == inf:
            continue
        here = cost[i] + 1
        m = BRANCH.search(text)
        conditional = text.lstrip().startswith("@") or bool(m and m.group("pred"))
        if m and at != hi:
            target = int(m.group("target"), 16)
            if target > at and target in index and here < cost[index[target]]:
                cost[index[target]], via[index[target]] = here, i
        if (not m or conditional or at == hi) and here < cost[i + 1]:
            cost[i + 1], via[i + 1] = here, i
    path, i = [], len(body)
    while via[i] is not None:
        i = via[i]
        path.append(body[i])
    return path[::-1], len(body)


def main():
    objects, cuobjdump, nvdisasm = command_line(__doc__)
    names = sorted({k for _, k in KINDS} | {"other"})
    print("| kernel | loop size | shortest path | issue cycles a tile (2 x path) | " + " | ".join(names) + " |")
    print("|---" * (4 + len(names)) + "|")
    found = 0
    for name, code in kernels(objects, cuobjdump, nvdisasm):
        loop = tile_loop(code)
        if not loop:
            print(f"| {name} | no tile loop |")
            continue
        path, size = shortest_path(code, *loop)
        counts = collections.Counter(kind(opcode(text)) for _, text in path)
        print(f"| {name} | {size} | {len(path)} | {2 * len(path)} | " + " | ".join(str(counts[n]) for n in names) + " |")
        found += 1
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
