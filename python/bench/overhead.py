"""What a Python call adds to the C++ call: PagedCache.store, AttentionPlan.run and
PagedCache.shift on the CPU, against the same calls timed in C++ (overhead_cpp, built beside the
module) with the same setup: one token a call, once with tiny work (1 KV head x 64 dims, f16, 1
cached token: the difference is the binding) and once at a Llama-3-8B layer (8 KV heads x 128, 32
query heads, FP8 pages, 64 cached tokens); shift on a 20000-token sequence. The fastest of 15 loops
(each side), timed in process CPU time (run with OMP_NUM_THREADS=1), since the machine may be
shared: time spent descheduled does not count.

    PYTHONPATH=build/python python python/bench/overhead.py build/python/kvcore_overhead_cpp
"""

import subprocess
import sys
import time

import numpy as np

import kvcore

ITERS = 2000


def fastest_ns(f, iters=ITERS):
    t0 = time.process_time_ns()
    for _ in range(5):
        f()
    iters = min(iters, max(5, int(20e6 * 5 / max(time.process_time_ns() - t0, 1))))  # loops of ~20 ms at most
    reps = []
    for _ in range(15):
        t0 = time.process_time_ns()
        for _ in range(iters):
            f()
        reps.append((time.process_time_ns() - t0) / iters)
    return min(reps)  # the least disturbed loop: the machine may be shared


def measure(exe, H, HQ, D, CTX, fmt):
    rng = np.random.default_rng(1)
    rope = kvcore.RopeSpec.plain(D, 500000.0)
    cache = kvcore.PagedCache(1, H, D, 1024, rope=rope, k_format=fmt, rope_mode="on_read")
    s = cache.create()
    k = rng.standard_normal((1, CTX, H, D), dtype=np.float32)
    cache.append(s, list(range(CTX)), k, k)
    t = cache.reserve(s, [CTX])
    plan = cache.plan(t)
    k1 = k[0, :1].copy()
    q = rng.standard_normal((1, HQ, D), dtype=np.float32)
    out = np.empty_like(q)
    py = {
        "store": fastest_ns(lambda: cache.store(t, 0, k1, k1)),
        "attention_run": fastest_ns(lambda: plan.run(0, q, out=out)),
    }
    big = kvcore.PagedCache(1, H, D, 2048, rope=rope, k_format=fmt, rope_mode="on_read")
    b = big.create()
    kk = np.full((1, 20000, H, D), 0.5, np.float32)
    big.append(b, np.arange(20000, dtype=np.int32), kk, kk)
    py["shift"] = fastest_ns(lambda: big.shift(b, 4, 1), 1000)
    cpp = {}
    args = [exe, str(H), str(HQ), str(D), str(CTX), fmt]
    for line in subprocess.run(args, check=True, capture_output=True, text=True).stdout.splitlines():
        name, ns = line.split()
        cpp[name] = float(ns)
    shape = f"{H} kv x {D}, {HQ} q heads, {CTX} cached, {fmt}"
    for name in ("store", "attention_run", "shift"):
        print(f"| {name} | {shape} | {cpp[name] / 1e3:.2f} | {py[name] / 1e3:.2f} | {(py[name] - cpp[name]) / 1e3:.2f} |")


def main():
    print("| call | shape | C++ (us) | Python (us) | added by Python (us) |")
    print("|---|---|---|---|---|")
    measure(sys.argv[1], 1, 1, 64, 1, "f16")  # tiny work: the difference is the binding
    measure(sys.argv[1], 8, 32, 128, 64, "fp8")  # Llama-3-8B layer shape


if __name__ == "__main__":
    main()
