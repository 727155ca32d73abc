#!/usr/bin/env python3
"""PyTorch SDPA baseline for `kvcore bench attention` (same case names).

For every case of bench/attention_bench.cpp this times
torch.nn.functional.scaled_dot_product_attention on the same shapes:
  variant "dense": K/V already dense [batch, kv_heads, ctx, head_dim] f16
                   (GQA through enable_gqa=True, so K/V are read once);
  variant "paged": K/V gathered from a paged pool [blocks, 16, kv_heads, head_dim]
                   through a shuffled block table, then SDPA (FP8 cases also
                   dequantize the e4m3 pages with their per-64 UE8M0 scales).
DeepSeek-V4 cases: q [batch, 64, 1, 512] against [batch, 1, 128 + k, 512]
(K = V; "dense": rows already f16; "paged": index_select of packed rows +
dequantization + concat with the window). SDPA has no sink and no inverse
RoPE, so it does slightly less work than kvcore there.
Prefill cases (`kvcore bench attention_prefill`): q [batch, 32, new, 128] f16
against dense K/V [batch, 8, ctx, 128] f16, causal from the bottom right (query i
of the chunk sees ctx - new + 1 + i keys) through torch.nn.attention.bias.causal_lower_right.
Timing: CUDA events around each call, warm-up, median (and min) of >= 20
reps, rotating among copies of the inputs so that each rep reads from DRAM,
not from the 60 MB L2. Output: one JSON line per (case, variant) with bench,
case, variant, median_us, min_us, bytes (the bytes kvcore's case counts),
bytes_read (what SDPA itself reads), gbps (bytes / median), device_name.

Usage: python bench/attention_sdpa_baseline.py --json out.jsonl [--quick] [--cases substr ...]
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

from attention_baseline_common import BS, D, KVH, QH, copies_for, kv_bytes, time_cuda

DEV = "cuda"


def time_fn(fn, reps, warmup):
    for i in range(warmup):
        fn(i)
    if DEV == "cpu":  # smoke runs only
        import time
        times = []
        for i in range(reps):
            t0 = time.perf_counter()
            fn(i)
            times.append((time.perf_counter() - t0) * 1e6)
        times.sort()
        return times[len(times) // 2], times[0]
    return time_cuda(fn, reps, 0)


def device_name():
    return torch.cuda.get_device_name() if DEV == "cuda" else "cpu"


def e4m3_to_f16(codes_u8):
    return codes_u8.view(torch.float8_e4m3fn).to(torch.float16)


def ue8m0_to_f32(scale_u8):
    return torch.pow(2.0, scale_u8.to(torch.float32) - 127.0)


def emit(out, rec):
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        out.write(line + "\n")
        out.flush()


def llama_case(args, out, batch, ctx, fp8):
    name = f"llama8b_{'fp8' if fp8 else 'f16'}_b{batch}_ctx{ctx}"
    if args.cases and not any(c in name for c in args.cases):
        return
    dev = DEV
    case_bytes = kv_bytes(batch, ctx, fp8)
    f16_bytes = kv_bytes(batch, ctx, False)
    scale = 1.0 / math.sqrt(D)
    q = torch.randn(batch, QH, 1, D, device=dev, dtype=torch.float16)
    # ---- dense
    n = copies_for(f16_bytes)
    if f16_bytes * n <= 40e9:
        ks = [torch.randn(batch, KVH, ctx, D, device=dev, dtype=torch.float16) for _ in range(n)]
        vs = [torch.randn(batch, KVH, ctx, D, device=dev, dtype=torch.float16) for _ in range(n)]
        ref = F.scaled_dot_product_attention(q.float(), ks[0].float().repeat_interleave(QH // KVH, 1),
                                             vs[0].float().repeat_interleave(QH // KVH, 1), scale=scale) \
            if batch * ctx <= 65536 else None
        got = F.scaled_dot_product_attention(q, ks[0], vs[0], scale=scale, enable_gqa=True)
        if ref is not None:
            err = (got.float() - ref).abs().max().item()
            assert err < 2e-2, f"{name}: SDPA dense check failed ({err})"
        med, mn = time_fn(lambda i: F.scaled_dot_product_attention(q, ks[i % n], vs[i % n], scale=scale, enable_gqa=True),
                          args.reps, args.warmup)
        emit(out, dict(bench="attention_sdpa", case=name, variant="dense", median_us=med, min_us=mn, bytes=case_bytes,
                       bytes_read=f16_bytes, gbps=f16_bytes / med / 1e3, copies=n,
                       device_name=device_name()))
        del ks, vs
        if DEV == "cuda":
            torch.cuda.empty_cache()
    # ---- paged (gather [+ dequantize] then SDPA)
    nb = (ctx + BS - 1) // BS
    n = copies_for(case_bytes)
    pool_blocks = n * batch * nb
    if case_bytes * n + 2 * f16_bytes > 60e9:
        return
    if fp8:
        kp = torch.randint(0, 0x58, (pool_blocks, BS, KVH, D), device=dev, dtype=torch.uint8)
        vp = torch.randint(0, 0x58, (pool_blocks, BS, KVH, D), device=dev, dtype=torch.uint8)
        kscale = torch.randint(121, 125, (pool_blocks, BS, KVH, D // 64), device=dev, dtype=torch.uint8)
        vscale = torch.randint(121, 125, (pool_blocks, BS, KVH, D // 64), device=dev, dtype=torch.uint8)
    else:
        kp = torch.randn(pool_blocks, BS, KVH, D, device=dev, dtype=torch.float16)
        vp = torch.randn(pool_blocks, BS, KVH, D, device=dev, dtype=torch.float16)
    perm = torch.randperm(pool_blocks, device=dev, dtype=torch.int64)
    tables = [perm[c * batch * nb:(c + 1) * batch * nb].view(batch, nb) for c in range(n)]

    def gather(pool, scales, table):
        x = pool[table]  # [batch, nb, BS, KVH, D]
        if scales is not None:
            s = ue8m0_to_f32(scales[table]).repeat_interleave(64, -1)
            x = (e4m3_to_f16(x).float() * s).to(torch.float16)
        return x.reshape(batch, nb * BS, KVH, D)[:, :ctx].transpose(1, 2)

    def run(i):
        t = tables[i % n]
        k = gather(kp, kscale if fp8 else None, t)
        v = gather(vp, vscale if fp8 else None, t)
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    run(0)
    med, mn = time_fn(run, args.reps, args.warmup)
    emit(out, dict(bench="attention_sdpa", case=name, variant="paged", median_us=med, min_us=mn, bytes=case_bytes,
                   bytes_read=case_bytes, gbps=case_bytes / med / 1e3, copies=n,
                   device_name=device_name()))
    del kp, vp, tables
    if DEV == "cuda":
        torch.cuda.empty_cache()


def dsv4_case(args, out, batch, tokens, hca):
    name = f"dsv4_{'hca' if hca else 'csa'}_b{batch}_ctx{tokens}"
    if args.cases and not any(c in name for c in args.cases):
        return
    dev = DEV
    H, DD, WIN, ROW = 64, 512, 128, 584
    n_comp = tokens // 128 if hca else tokens // 4
    k = n_comp if hca else min(512, n_comp)
    case_bytes = batch * (WIN * DD * 2 + k * ROW)
    scale = 1.0 / math.sqrt(DD)
    q = torch.randn(batch, H, 1, DD, device=dev, dtype=torch.float16)
    n = copies_for(batch * (WIN + k) * DD * 2)
    dense = [torch.randn(batch, 1, WIN + k, DD, device=dev, dtype=torch.float16) for _ in range(n)]
    med, mn = time_fn(lambda i: F.scaled_dot_product_attention(q, dense[i % n], dense[i % n], scale=scale, enable_gqa=True),
                      args.reps, args.warmup)
    emit(out, dict(bench="attention_sdpa", case=name, variant="dense", median_us=med, min_us=mn, bytes=case_bytes,
                   bytes_read=batch * (WIN + k) * DD * 2, gbps=batch * (WIN + k) * DD * 2 / med / 1e3, copies=n,
                   device_name=device_name()))
    del dense
    # gathered: packed rows -> f16, concat with the window
    nc = copies_for(batch * n_comp * ROW)
    packed = torch.randint(0, 0x58, (nc * batch * n_comp, ROW), device=dev, dtype=torch.uint8)
    packed[:, 576:583] = 123
    win = torch.randn(batch, WIN, DD, device=dev, dtype=torch.float16)
    idx = [torch.randint(c * batch * n_comp, (c + 1) * batch * n_comp, (batch, k), device=dev) for c in range(nc)]

    def run(i):
        rows = packed[idx[i % nc]]  # [batch, k, 584]
        nope = e4m3_to_f16(rows[..., :448]).float().view(batch, k, 7, 64) * \
            ue8m0_to_f32(rows[..., 576:583]).unsqueeze(-1)
        rope = rows[..., 448:576].contiguous().view(torch.bfloat16).float()
        kv = torch.cat([win, torch.cat([nope.view(batch, k, 448), rope], -1).to(torch.float16)], 1).unsqueeze(1)
        return F.scaled_dot_product_attention(q, kv, kv, scale=scale, enable_gqa=True)

    run(0)
    med, mn = time_fn(run, args.reps, args.warmup)
    emit(out, dict(bench="attention_sdpa", case=name, variant="paged", median_us=med, min_us=mn, bytes=case_bytes,
                   bytes_read=case_bytes, gbps=case_bytes / med / 1e3, copies=nc,
                   device_name=device_name()))


def prefill_case(args, out, batch, ctx, n_new):
    name = f"llama8b_prefill_f16_b{batch}_ctx{ctx}_new{n_new}"
    if args.cases and not any(c in name for c in args.cases):
        return
    from torch.nn.attention.bias import causal_lower_right
    dev = DEV
    scale = 1.0 / math.sqrt(D)
    q = torch.randn(batch, QH, n_new, D, device=dev, dtype=torch.float16)
    k = torch.randn(batch, KVH, ctx, D, device=dev, dtype=torch.float16)
    v = torch.randn(batch, KVH, ctx, D, device=dev, dtype=torch.float16)
    mask = causal_lower_right(n_new, ctx)
    # GQA through enable_gqa where the causal-bias path takes it; else K/V expanded to 32 heads
    try:
        fn = lambda i: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        got = fn(0)
        variant = "dense_causal"
    except (RuntimeError, TypeError, ValueError):
        ke, ve = k.repeat_interleave(QH // KVH, 1), v.repeat_interleave(QH // KVH, 1)
        fn = lambda i: F.scaled_dot_product_attention(q, ke, ve, attn_mask=mask, scale=scale)
        got = fn(0)
        variant = "dense_causal_expanded"
    # check the chunk's last rows against float32 math
    r = 16
    qs = q[:, :, -r:].float()
    kf, vf = k.float().repeat_interleave(QH // KVH, 1), v.float().repeat_interleave(QH // KVH, 1)
    s_ = (qs @ kf.transpose(-1, -2)) * scale
    keep = torch.arange(ctx, device=dev)[None, :] <= (ctx - r + torch.arange(r, device=dev))[:, None]
    ref = torch.softmax(s_.masked_fill(~keep, float("-inf")), -1) @ vf
    err = (got[:, :, -r:].float() - ref).abs().max().item()
    assert err < 2e-2, f"{name}: SDPA causal check failed ({err})"
    med, mn = time_fn(fn, args.reps, args.warmup)
    pairs = n_new * (ctx - n_new + 1) + n_new * (n_new - 1) / 2
    flops = 4.0 * D * QH * batch * pairs
    kvb = 2.0 * batch * ctx * KVH * D * 2
    emit(out, dict(bench="attention_sdpa", case=name, variant=variant, median_us=med, min_us=mn, bytes=kvb,
                   bytes_read=kvb, gbps=kvb / med / 1e3, tflops=flops / med / 1e6, copies=1,
                   device_name=device_name()))
    del q, k, v


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default="")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cases", nargs="*", default=[])
    ap.add_argument("--device", default="cuda", help="cuda (measurements) or cpu (a smoke run of the script)")
    args = ap.parse_args()
    global DEV
    DEV = args.device
    if DEV == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    out = open(args.json, "a") if args.json else None
    batches, ctxs, dctx = [1, 16, 64], [1024, 4096, 8192, 32768, 131072], [8192, 65536, 1048576]
    if args.quick:
        batches, ctxs, dctx = [1, 4], [1024], [8192]
    with torch.inference_mode():
        for fp8 in (False, True):
            for b in batches:
                for c in ctxs:
                    if kv_bytes(b, c, fp8) > 40e9:
                        continue
                    llama_case(args, out, b, c, fp8)
        for hca in (False, True):
            for t in dctx:
                dsv4_case(args, out, 1, t, hca)
        if not args.quick:
            for hca in (False, True):
                dsv4_case(args, out, 16, 65536, hca)
        for b, c, n in ([(1, 1024, 128)] if args.quick else [(1, 8192, 512), (1, 8192, 2048), (1, 32768, 2048),
                                                              (4, 4096, 1024)]):
            prefill_case(args, out, b, c, n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
