"""What the Python attention baselines (SDPA, FlashInfer) share with kvcore's bench: the
Llama-3-8B decode shape, the bytes a case counts, how many input copies make a rotation read
from DRAM rather than the 60 MB L2, and CUDA-event timing (median and min of reps)."""
import math

import torch

QH, KVH, D, BS = 32, 8, 128, 16  # query heads, kv heads, head_dim, tokens a page
L2 = 60e6


def kv_bytes(batch, ctx, fp8):
    """K and V bytes of a case as kvcore counts them (FP8: codes plus one UE8M0 scale per 64)."""
    rows = batch * ctx * KVH
    return 2.0 * rows * (D + D // 64 if fp8 else 2 * D)


def copies_for(nbytes):
    return max(1, min(64, math.ceil(4 * L2 / nbytes)))


def time_cuda(fn, reps, warmup):
    """fn(i) timed with CUDA events around each call: (median us, min us)."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    times.sort()
    return times[len(times) // 2], times[0]
