"""What a Python call adds to the C++ call: PagedCache.store, AttentionPlan.run and
PagedCache.shift, against the same calls timed in C++ (overhead_cpp, built beside the module) with
the same setup: one token a call, once with tiny work (1 KV head x 64 dims, f16, 1 cached token:
the difference is the binding) and once at a Llama-3-8B layer (8 KV heads x 128, 32 query heads,
FP8 pages, 64 cached tokens); shift on a 20000-token sequence. The fastest of 15 loops (each side),
timed in process CPU time (run with OMP_NUM_THREADS=1), since the machine may be shared: time spent
descheduled does not count.

--torch: the same with torch CPU tensors. --device cuda: the same on cuda:0 with torch CUDA tensors (calls are launched, not waited for; the
stream is drained between loops, so the figure is a call's host time), plus FlashInfer's
BatchDecodeWithPagedKVCacheWrapper.run() at the same shapes (f16 pages, its NHD layout, planned
once) when flashinfer is importable: the host time of its Python call, beside kvcore's plan.run.

    PYTHONPATH=build/python python python/bench/overhead.py build/python/kvcore_overhead_cpp [--torch | --device cuda]
"""

import argparse
import subprocess
import time

import numpy as np

import kvcore

ITERS = 2000


def fastest_ns(f, iters=ITERS, sync=None):
    t0 = time.process_time_ns()
    for _ in range(5):
        f()
    iters = min(iters, max(5, int(20e6 * 5 / max(time.process_time_ns() - t0, 1))))  # loops of ~20 ms at most
    reps = []
    for _ in range(15):
        if sync:
            sync()  # an empty launch queue at the start of each loop
        t0 = time.process_time_ns()
        for _ in range(iters):
            f()
        reps.append((time.process_time_ns() - t0) / iters)
    return min(reps)  # the least disturbed loop: the machine may be shared


class Host:
    """numpy arrays on the CPU."""

    device, sync = "cpu", None

    def array(self, a):
        return np.ascontiguousarray(a)


class HostTorch(Host):
    """torch tensors on the CPU."""

    def array(self, a):
        import torch

        return torch.from_numpy(np.ascontiguousarray(a))


class Cuda:
    """torch tensors on cuda:0."""

    device = "cuda"

    def __init__(self):
        import torch

        self.torch = torch
        self.sync = torch.cuda.synchronize

    def array(self, a):
        return self.torch.from_numpy(np.ascontiguousarray(a)).cuda()


def cpp_times(exe, H, HQ, D, CTX, fmt, device):
    out = {}
    args = [exe, str(H), str(HQ), str(D), str(CTX), fmt, device]
    for line in subprocess.run(args, check=True, capture_output=True, text=True).stdout.splitlines():
        name, ns = line.split()
        out[name] = float(ns)
    return out


def measure(exe, on, H, HQ, D, CTX, fmt):
    rng = np.random.default_rng(1)
    rope = kvcore.RopeSpec.plain(D, 500000.0)
    cache = kvcore.PagedCache(1, H, D, 1024, rope=rope, k_format=fmt, rope_mode="on_read", device=on.device)
    s = cache.create()
    k = on.array(rng.standard_normal((1, CTX, H, D), dtype=np.float32))
    cache.append(s, list(range(CTX)), k, k)
    t = cache.reserve(s, [CTX])
    plan = cache.plan(t)
    k1 = on.array(rng.standard_normal((1, H, D), dtype=np.float32))
    q = on.array(rng.standard_normal((1, HQ, D), dtype=np.float32))
    out = on.array(np.empty((1, HQ, D), np.float32))
    py = {
        "store": fastest_ns(lambda: cache.store(t, 0, k1, k1), sync=on.sync),
        "attention_run": fastest_ns(lambda: plan.run(0, q, out=out), sync=on.sync),
    }
    big = kvcore.PagedCache(1, H, D, 2048, rope=rope, k_format=fmt, rope_mode="on_read", device=on.device)
    b = big.create()
    kk = on.array(np.full((1, 20000, H, D), 0.5, np.float32))
    big.append(b, np.arange(20000, dtype=np.int32), kk, kk)
    py["shift"] = fastest_ns(lambda: big.shift(b, 4, 1), 1000, sync=on.sync)
    cpp = cpp_times(exe, H, HQ, D, CTX, fmt, on.device)
    shape = f"{H} kv x {D}, {HQ} q heads, {CTX} cached, {fmt}"
    for name in ("store", "attention_run", "shift"):
        print(f"| {name} | {shape} | {cpp[name] / 1e3:.2f} | {py[name] / 1e3:.2f} | {(py[name] - cpp[name]) / 1e3:.2f} |")


def flashinfer_run(on, H, HQ, D, CTX, page=16):
    """Host time of FlashInfer's decode run() and of kvcore's plan.run at one shape, both f16 pages
    and an f16 query, one sequence of CTX tokens."""
    import flashinfer

    torch = on.torch
    n_pages = (CTX + page - 1) // page
    kc = torch.randn(n_pages, page, H, D, dtype=torch.float16, device="cuda")
    vc = torch.randn_like(kc)
    indptr = torch.tensor([0, n_pages], dtype=torch.int32, device="cuda")
    indices = torch.arange(n_pages, dtype=torch.int32, device="cuda")
    last = torch.tensor([CTX - (n_pages - 1) * page], dtype=torch.int32, device="cuda")
    workspace = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD")
    wrapper.plan(indptr, indices, last, HQ, H, D, page, pos_encoding_mode="NONE", q_data_type=torch.float16,
                 kv_data_type=torch.float16)
    q = torch.randn(1, HQ, D, dtype=torch.float16, device="cuda")
    out = torch.empty_like(q)
    fi = fastest_ns(lambda: wrapper.run(q, (kc, vc), out=out), sync=on.sync)
    cache = kvcore.PagedCache(1, H, D, n_pages + 1, block_size=page, rope=kvcore.RopeSpec.plain(D, 500000.0),
                              k_format="f16", rope_mode="on_read", device="cuda")
    s = cache.create()
    kk = torch.randn(1, CTX, H, D, dtype=torch.float16, device="cuda")
    cache.append(s, list(range(CTX)), kk, kk)
    plan = cache.plan([s])
    ours = fastest_ns(lambda: plan.run(0, q, out=out), sync=on.sync)
    print(f"| {H} kv x {D}, {HQ} q heads, {CTX} cached, f16 | {fi / 1e3:.2f} | {ours / 1e3:.2f} | "
          f"flashinfer {getattr(flashinfer, '__version__', '?')} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe", help="kvcore_overhead_cpp, built beside the module")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--torch", action="store_true", help="CPU: torch tensors instead of numpy arrays")
    args = ap.parse_args()
    on = Cuda() if args.device == "cuda" else HostTorch() if args.torch else Host()
    print(f"Device: {args.device}, tensors: {'torch' if args.torch or args.device == 'cuda' else 'numpy'}")
    print("| call | shape | C++ (us) | Python (us) | added by Python (us) |")
    print("|---|---|---|---|---|")
    measure(args.exe, on, 1, 1, 64, 1, "f16")  # tiny work: the difference is the binding
    measure(args.exe, on, 8, 32, 128, 64, "fp8")  # Llama-3-8B layer shape
    if args.device != "cuda":
        return
    try:
        import flashinfer  # noqa: F401
    except ImportError as e:
        print(f"\nFlashInfer: not importable ({e}); its run() was not timed.")
        return
    print("\nHost time of one decode run() call from Python (us), same job:")
    print("| shape | FlashInfer run() | kvcore plan.run() | |")
    print("|---|---|---|---|")
    flashinfer_run(on, 1, 1, 64, 1)
    flashinfer_run(on, 8, 32, 128, 64)


if __name__ == "__main__":
    main()
