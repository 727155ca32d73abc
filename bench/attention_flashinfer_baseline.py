#!/usr/bin/env python3
"""FlashInfer baseline for `kvcore bench attention` and `attention_prefill` (same case names).

Decode: flashinfer.BatchDecodeWithPagedKVCacheWrapper over Llama-3-8B pages as kvcore's bench
lays them out (NHD, 16-token pages, separate K and V pools, 8 kv heads x 128, 32 query heads),
block tables shuffled over the pool, and as many copies of the pools as it takes to make the
rotation read from DRAM rather than the 60 MB L2 (the same rule as kvcore's bench). Each case runs
with use_tensor_cores False and True; both are printed and the faster is also emitted as variant
"best". Eager timing: CUDA events around each call. Graph timing (the cases kvcore times from a
graph: batch 1, batch 16 up to 8k): one graph of one run per copy, replayed, divided by the copies.
FP8 pages: e4m3 with one scale per tensor (FlashInfer's format; kvcore's FP8 pages also carry a
UE8M0 scale per 64 values, so kvcore reads 130 bytes per 128 values where FlashInfer reads 128).

Prefill: flashinfer.BatchPrefillWithPagedKVCacheWrapper, causal (FlashInfer aligns the causal mask
bottom-right: query i of the chunk sees ctx - new + 1 + i keys, as kvcore's bench).

Host overhead: the wall time one eager run() call costs the host (1000 calls back to back on the
smallest decode shape, divided; the GPU is faster than the host there, so this is host-bound).

Every case is checked once against a float32 reference before it is timed.
JIT: FlashInfer compiles its kernels on first use (set FLASHINFER_CUDA_ARCH_LIST=9.0 and
FLASHINFER_WORKSPACE_BASE to keep the cache). --warm-only compiles the modules and times nothing.

Usage: python bench/attention_flashinfer_baseline.py --json out.jsonl [--quick] [--cases substr ...]
"""
import argparse
import json
import math
import sys
import time

import torch

from attention_baseline_common import BS, D, KVH, QH, copies_for, time_cuda
from attention_baseline_common import kv_bytes as kvcore_case_bytes

WORKSPACE_BYTES = 256 << 20


def time_graph(record, n, reps, warmup):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        record()  # warm the allocator outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        record()
    for _ in range(warmup):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / n)
    times.sort()
    return times[len(times) // 2], times[0]


def emit(out, rec):
    rec = dict(rec, device_name=torch.cuda.get_device_name())
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        out.write(line + "\n")
        out.flush()


def reference_decode(q, k_pool, v_pool, table, ctx, k_scale, v_scale):
    """float32 attention of every sequence against its gathered pages (GQA by repeat)."""
    batch = q.shape[0]
    k = (k_pool[table].float() * k_scale).reshape(batch, -1, KVH, D)[:, :ctx].transpose(1, 2)
    v = (v_pool[table].float() * v_scale).reshape(batch, -1, KVH, D)[:, :ctx].transpose(1, 2)
    k, v = k.repeat_interleave(QH // KVH, 1), v.repeat_interleave(QH // KVH, 1)
    s = (q.float().unsqueeze(2) @ k.transpose(-1, -2)) / math.sqrt(D)
    return (torch.softmax(s, -1) @ v).squeeze(2)


def make_pages(batch, ctx, fp8, copies):
    nb = (ctx + BS - 1) // BS
    dt = torch.float8_e4m3fn if fp8 else torch.float16
    pools = []
    for _ in range(copies):
        k = torch.randn(batch * nb, BS, KVH, D, device="cuda", dtype=torch.float16)
        v = torch.randn(batch * nb, BS, KVH, D, device="cuda", dtype=torch.float16)
        if fp8:
            k, v = (k * 0.5).to(dt), (v * 0.5).to(dt)
        pools.append((k, v))
    perm = torch.randperm(batch * nb, device="cuda", dtype=torch.int32)
    table = perm.view(batch, nb)
    indptr = torch.arange(0, batch * nb + 1, nb, device="cuda", dtype=torch.int32)
    last = torch.full((batch,), ctx - (nb - 1) * BS, device="cuda", dtype=torch.int32)
    return pools, table, indptr, last


# (fp8, use_tensor_cores) pairs whose module failed once in this process.
FAILED_VARIANTS = set()


def decode_case(fi, args, out, batch, ctx, fp8, warm_only):
    name = f"llama8b_{'fp8' if fp8 else 'f16'}_b{batch}_ctx{ctx}"
    if args.cases and not any(c in name for c in args.cases):
        return
    fi_bytes = 2.0 * batch * ctx * KVH * D * (1 if fp8 else 2)
    copies = 1 if warm_only else copies_for(kvcore_case_bytes(batch, ctx, fp8))
    if fi_bytes * copies > 40e9:
        return
    pools, table, indptr, last = make_pages(batch, ctx, fp8, copies)
    indices = table.reshape(-1).contiguous()
    q = torch.randn(batch, QH, D, device="cuda", dtype=torch.float16)
    kv_dtype = torch.float8_e4m3fn if fp8 else torch.float16
    k_scale = v_scale = 1.0
    graph_case = batch == 1 or (batch == 16 and ctx <= 8192)
    results = []
    for tc in (False, True):
        if (fp8, tc) in FAILED_VARIANTS:  # a module that failed to build fails again: skip its minutes of JIT
            continue
        try:
            results += decode_variant(fi, args, out, name, batch, ctx, fp8, tc, pools, table, indptr, indices, last, q,
                                      kv_dtype, k_scale, v_scale, copies, fi_bytes, graph_case, warm_only)
        except Exception as e:  # a variant FlashInfer does not build or serve: say so, keep going
            print(f"{name} use_tensor_cores={tc}: FlashInfer failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            FAILED_VARIANTS.add((fp8, tc))
            torch.cuda.synchronize()
    for suffix in ("", "_graph"):
        rs = [r for r in results if r["case"] == name + suffix]
        if rs:
            best = min(rs, key=lambda r: r["median_us"])
            emit(out, dict(best, variant="best", picked=best["variant"]))
    del pools
    torch.cuda.empty_cache()


def decode_variant(fi, args, out, name, batch, ctx, fp8, tc, pools, table, indptr, indices, last, q, kv_dtype, k_scale,
                   v_scale, copies, fi_bytes, graph_case, warm_only):
    """One use_tensor_cores setting: checked, timed eagerly, then (graph cases) from a CUDA graph."""
    results = []
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
    w.plan(indptr, indices, last, QH, KVH, D, BS, q_data_type=torch.float16, kv_data_type=kv_dtype)
    got = w.run(q, pools[0], k_scale=k_scale, v_scale=v_scale)
    torch.cuda.synchronize()
    if warm_only:
        return results
    if batch * ctx <= 65536:
        ref = reference_decode(q, pools[0][0], pools[0][1], table.long(), ctx, k_scale, v_scale)
        err = (got.float() - ref).abs().max().item()
        assert err < 2e-2, f"{name}: FlashInfer check failed (tc={tc}, err {err})"
    outb = torch.empty_like(q)
    med, mn = time_cuda(lambda i: w.run(q, pools[i % copies], k_scale=k_scale, v_scale=v_scale, out=outb),
                          args.reps, args.warmup)
    rec = dict(bench="attention_flashinfer", case=name, variant=f"decode_tc{int(tc)}", median_us=med, min_us=mn,
               bytes=kvcore_case_bytes(batch, ctx, fp8), bytes_read=fi_bytes, gbps=fi_bytes / med / 1e3,
               copies=copies)
    emit(out, rec)
    results.append(rec)
    if not graph_case:
        return results
    try:
        wsg = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        gw = fi.BatchDecodeWithPagedKVCacheWrapper(
            wsg, "NHD", use_cuda_graph=True, use_tensor_cores=tc,
            paged_kv_indptr_buffer=torch.empty_like(indptr), paged_kv_indices_buffer=torch.empty_like(indices),
            paged_kv_last_page_len_buffer=torch.empty_like(last))
        gw.plan(indptr, indices, last, QH, KVH, D, BS, q_data_type=torch.float16, kv_data_type=kv_dtype)

        def record():
            for c in range(copies):
                gw.run(q, pools[c], k_scale=k_scale, v_scale=v_scale, out=outb)

        gmed, gmn = time_graph(record, copies, args.reps, args.warmup)
        grec = dict(rec, case=name + "_graph", median_us=gmed, min_us=gmn, gbps=fi_bytes / gmed / 1e3)
        emit(out, grec)
        results.append(grec)
    except Exception as e:  # eager figures stand; the graph one is missing, and says why
        print(f"{name}_graph use_tensor_cores={tc}: FlashInfer failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
    return results


def host_overhead(fi, args, out):
    pools, table, indptr, last = make_pages(1, 1024, False, 1)
    q = torch.randn(1, QH, D, device="cuda", dtype=torch.float16)
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=False)
    w.plan(indptr, table.reshape(-1).contiguous(), last, QH, KVH, D, BS, q_data_type=torch.float16,
           kv_data_type=torch.float16)
    outb = torch.empty_like(q)
    for _ in range(50):
        w.run(q, pools[0], out=outb)
    torch.cuda.synchronize()
    n, best = 1000, float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            w.run(q, pools[0], out=outb)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / n * 1e6)
    emit(out, dict(bench="attention_flashinfer", case="host_us_per_run_b1_ctx1024", variant="decode_tc0",
                   median_us=best, min_us=best, bytes=0, bytes_read=0, gbps=0, copies=1))


def prefill_case(fi, args, out, batch, ctx, n_new, warm_only):
    name = f"llama8b_prefill_f16_b{batch}_ctx{ctx}_new{n_new}"
    if args.cases and not any(c in name for c in args.cases):
        return
    pools, table, indptr, last = make_pages(batch, ctx, False, 1)
    q = torch.randn(batch * n_new, QH, D, device="cuda", dtype=torch.float16)
    qo = torch.arange(0, batch * n_new + 1, n_new, device="cuda", dtype=torch.int32)
    ws = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(qo, indptr, table.reshape(-1).contiguous(), last, QH, KVH, D, BS, causal=True,
           q_data_type=torch.float16, kv_data_type=torch.float16)
    got = w.run(q, pools[0])
    torch.cuda.synchronize()
    if warm_only:
        return
    # check the last 16 rows of sequence 0 against float32 math
    r = 16
    k = pools[0][0][table[0].long()].float().reshape(-1, KVH, D)[:ctx].repeat_interleave(QH // KVH, 1)
    v = pools[0][1][table[0].long()].float().reshape(-1, KVH, D)[:ctx].repeat_interleave(QH // KVH, 1)
    qs = q[n_new - r:n_new].float()  # [r, QH, D]
    s = torch.einsum("rhd,khd->hrk", qs, k) / math.sqrt(D)
    keep = torch.arange(ctx, device="cuda")[None, :] <= (ctx - r + torch.arange(r, device="cuda"))[:, None]
    ref = torch.einsum("hrk,khd->rhd", torch.softmax(s.masked_fill(~keep, float("-inf")), -1), v)
    err = (got[n_new - r:n_new].float() - ref).abs().max().item()
    assert err < 2e-2, f"{name}: FlashInfer prefill check failed ({err})"
    outb = torch.empty_like(q)
    med, mn = time_cuda(lambda i: w.run(q, pools[0], out=outb), args.reps, args.warmup)
    pairs = n_new * (ctx - n_new + 1) + n_new * (n_new - 1) / 2
    flops = 4.0 * D * QH * batch * pairs
    kvb = 2.0 * batch * ctx * KVH * D * 2
    emit(out, dict(bench="attention_flashinfer", case=name, variant="prefill", median_us=med, min_us=mn, bytes=kvb,
                   bytes_read=kvb, gbps=kvb / med / 1e3, tflops=flops / med / 1e6, copies=1))
    del pools
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--warm-only", action="store_true", help="compile FlashInfer's modules, time nothing")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cases", nargs="*", default=[])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    import flashinfer as fi
    print(f"flashinfer {fi.__version__}, torch {torch.__version__}", flush=True)
    torch.manual_seed(0)
    out = open(args.json, "a") if args.json else None
    batches, ctxs = [1, 16, 64], [1024, 4096, 8192, 32768, 131072]
    prefill = [(1, 8192, 512), (1, 8192, 2048), (1, 32768, 2048), (4, 4096, 1024)]
    if args.quick or args.warm_only:
        batches, ctxs, prefill = [1], [1024], [(1, 1024, 128)]
    with torch.inference_mode():
        for fp8 in (False, True):
            for b in batches:
                for c in ctxs:
                    t0 = time.time()
                    decode_case(fi, args, out, b, c, fp8, args.warm_only)
                    if args.warm_only:
                        print(f"warm decode fp8={fp8}: {time.time() - t0:.0f} s", flush=True)
        for b, c, n in prefill:
            t0 = time.time()
            try:
                prefill_case(fi, args, out, b, c, n, args.warm_only)
            except Exception as e:
                print(f"prefill b{b} ctx{c} new{n}: FlashInfer failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            if args.warm_only:
                print(f"warm prefill: {time.time() - t0:.0f} s", flush=True)
        if not args.warm_only:
            host_overhead(fi, args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
