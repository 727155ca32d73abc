#!/usr/bin/env python3
"""ggml (llama.cpp's CPU kernels) and NumPy baselines for `kvcore bench ... --device cpu`.

Same case names as bench/attention_bench.cpp and bench/rope_bench.cpp, so the
rows line up with kvcore's:
  llama8b_{f16,fp8}_b1_ctxN  decode attention, Llama-3-8B (32 q heads, 8 kv
      heads, head dim 128), one query against N keys:
      ggml_f16   ggml_flash_attn_ext with f16 K/V in llama.cpp's cache layout
                 (a [128 * 8, N] tensor per layer, viewed as [128, N, 8]);
      ggml_q8_0  the same with q8_0 K/V (llama.cpp's 8-bit cache type: blocks of
                 32 int8 with an f16 scale, 34 bytes per 32 values);
      numpy_f32  dense f32 K/V [8, N, 128]: scores by matmul, softmax, matmul.
  llama8b_prefill_f16_b1_ctx1024_new128  causal prefill (bench attention_prefill):
      the last 128 of 1024 tokens as queries, ggml_flash_attn_ext with f16 K/V and
      llama.cpp's f16 causal KQ mask (rows padded to GGML_KQ_MASK_PAD);
  "f16 neox theta 5e5 [T,8,128] T=32768"  ggml_rope_ext in place on f16
      [128, 8, T] (NeoX pairs, theta 5e5), the shape of kvcore's rope bench.
The kvcore fp8 cases read e4m3 bytes plus one UE8M0 byte per 64 values (1.016
bytes a value); q8_0 reads 1.0625: the nearest thing ggml has.

Timing: wall clock around the graph compute (ggml's own thread pool, n_threads
= --threads), warm-up, median and min of --reps calls. One JSON line per
(case, variant): bench, case, variant, threads, median_us, min_us, bytes (the
bytes kvcore's case counts for the same shape), gbps, cpu (ggml's view of the
CPU features).

Usage: ggml_baseline.py [--threads N] [--reps N] [--ctx 1024 4096 ...] [--prefill 1024+128 ...] [--json out.jsonl]
Installs nothing itself: bench/cpu/baselines.sh makes a virtual environment with
ggml-python and numpy and runs this.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import ggml

QH, KVH, D = 32, 8, 128


def timed(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts), min(ts)


class Graph:
    """A ggml context holding tensors and one graph, computed with a reusable work buffer."""

    def __init__(self, mem_bytes):
        params = ggml.ggml_init_params(mem_size=mem_bytes, mem_buffer=None, no_alloc=False)
        self.ctx = ggml.ggml_init(params)
        assert self.ctx, "ggml_init failed"
        self.gf = None

    def build(self, out, n_threads):
        self.gf = ggml.ggml_new_graph(self.ctx)
        ggml.ggml_build_forward_expand(self.gf, out)
        self.plan = ggml.ggml_graph_plan(self.gf, n_threads, None)
        self.work = np.zeros(max(1, self.plan.work_size) + 64, dtype=np.uint8)
        if self.plan.work_size:
            self.plan.work_data = self.work.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))

    def compute(self):
        rc = ggml.ggml_graph_compute(self.gf, ctypes.byref(self.plan))
        assert rc == 0, f"ggml_graph_compute returned {rc}"

    def free(self):
        ggml.ggml_free(self.ctx)


def put(tensor, array):
    ctypes.memmove(ggml.ggml_get_data(tensor), array.ctypes.data, array.nbytes)


def get_f32(tensor, n):
    return np.ctypeslib.as_array(ctypes.cast(ggml.ggml_get_data(tensor), ctypes.POINTER(ctypes.c_float)), (n,)).copy()


def kv_bytes(ctx, fp8):
    rows = ctx * KVH
    return 2.0 * rows * (D + D // 64 if fp8 else 2 * D)


def attention_ggml(ctx_len, kv_type, threads, reps, rng):
    """One decode query (32 heads) over ctx_len cached tokens; returns (median, min, max error vs float64)."""
    kf = rng.standard_normal((ctx_len, KVH, D), dtype=np.float32)
    vf = rng.standard_normal((ctx_len, KVH, D), dtype=np.float32)
    qf = rng.standard_normal((QH, D), dtype=np.float32)
    per_tensor = ctx_len * KVH * D * 2 + (1 << 20)
    g = Graph(2 * per_tensor + QH * D * 64 + (64 << 20))
    # llama.cpp's cache: one [D * KVH] row per token (f16 or q8_0 blocks), viewed per head.
    k = ggml.ggml_new_tensor_2d(g.ctx, kv_type, D * KVH, ctx_len)
    v = ggml.ggml_new_tensor_2d(g.ctx, kv_type, D * KVH, ctx_len)
    if kv_type == ggml.GGML_TYPE_F16:
        put(k, kf.astype(np.float16))
        put(v, vf.astype(np.float16))
    else:
        for t, src in ((k, kf), (v, vf)):
            flat = np.ascontiguousarray(src.reshape(ctx_len, KVH * D))
            ggml.ggml_quantize_chunk(kv_type, flat.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
                                     ggml.ggml_get_data(t), 0, ctx_len, KVH * D, None)
    nb1 = k.contents.nb[1]
    ehead = ggml.ggml_row_size(kv_type, D)
    kview = ggml.ggml_view_3d(g.ctx, k, D, ctx_len, KVH, nb1, ehead, 0)
    vview = ggml.ggml_view_3d(g.ctx, v, D, ctx_len, KVH, nb1, ehead, 0)
    q = ggml.ggml_new_tensor_3d(g.ctx, ggml.GGML_TYPE_F32, D, 1, QH)  # [D, n_tokens, heads]
    put(q, qf)
    out = ggml.ggml_flash_attn_ext(g.ctx, q, kview, vview, None, 1.0 / math.sqrt(D), 0.0, 0.0)
    ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_DEFAULT)
    g.build(out, threads)
    med, mn = timed(g.compute, reps)
    got = get_f32(out, QH * D).reshape(QH, D)
    # float64 reference on the values ggml stored (f16-rounded; q8_0 checked loosely)
    kr = kf.astype(np.float16).astype(np.float64) if kv_type == ggml.GGML_TYPE_F16 else kf.astype(np.float64)
    vr = vf.astype(np.float16).astype(np.float64) if kv_type == ggml.GGML_TYPE_F16 else vf.astype(np.float64)
    ref = np.empty((QH, D))
    for h in range(QH):
        s = kr[:, h // (QH // KVH), :] @ qf[h].astype(np.float64) / math.sqrt(D)
        p = np.exp(s - s.max())
        ref[h] = p @ vr[:, h // (QH // KVH), :] / p.sum()
    err = float(np.abs(got - ref).max() / max(1.0, np.abs(ref).max()))
    g.free()
    return med, mn, err


def attention_prefill_ggml(ctx_len, n_new, threads, reps, rng):
    """Causal prefill: n_new queries (the chunk's tokens, the last n_new of ctx_len) over ctx_len f16 keys in
    llama.cpp's cache layout, with llama.cpp's f16 KQ mask; returns (median, min, max error vs float64)."""
    kf = rng.standard_normal((ctx_len, KVH, D), dtype=np.float32)
    vf = rng.standard_normal((ctx_len, KVH, D), dtype=np.float32)
    qf = rng.standard_normal((QH, n_new, D), dtype=np.float32)
    rows_pad = (n_new + ggml.GGML_KQ_MASK_PAD - 1) // ggml.GGML_KQ_MASK_PAD * ggml.GGML_KQ_MASK_PAD
    g = Graph(2 * ctx_len * KVH * D * 2 + QH * n_new * D * 8 + ctx_len * rows_pad * 2 + (64 << 20))
    k = ggml.ggml_new_tensor_2d(g.ctx, ggml.GGML_TYPE_F16, D * KVH, ctx_len)
    v = ggml.ggml_new_tensor_2d(g.ctx, ggml.GGML_TYPE_F16, D * KVH, ctx_len)
    put(k, kf.astype(np.float16))
    put(v, vf.astype(np.float16))
    nb1 = k.contents.nb[1]
    ehead = ggml.ggml_row_size(ggml.GGML_TYPE_F16, D)
    kview = ggml.ggml_view_3d(g.ctx, k, D, ctx_len, KVH, nb1, ehead, 0)
    vview = ggml.ggml_view_3d(g.ctx, v, D, ctx_len, KVH, nb1, ehead, 0)
    q = ggml.ggml_new_tensor_3d(g.ctx, ggml.GGML_TYPE_F32, D, n_new, QH)  # [D, n_tokens, heads]
    put(q, qf)
    # query i (position ctx_len - n_new + i) sees keys 0 .. ctx_len - n_new + i
    visible = np.arange(ctx_len)[None, :] <= (ctx_len - n_new + np.arange(rows_pad))[:, None]
    mask = ggml.ggml_new_tensor_2d(g.ctx, ggml.GGML_TYPE_F16, ctx_len, rows_pad)
    put(mask, np.where(visible, 0.0, -np.inf).astype(np.float16))
    out = ggml.ggml_flash_attn_ext(g.ctx, q, kview, vview, mask, 1.0 / math.sqrt(D), 0.0, 0.0)
    ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_DEFAULT)
    g.build(out, threads)
    med, mn = timed(g.compute, reps)
    got = get_f32(out, QH * n_new * D).reshape(n_new, QH, D)  # ggml's result: [D, heads, n_tokens]
    kr, vr = kf.astype(np.float16).astype(np.float64), vf.astype(np.float16).astype(np.float64)
    err = 0.0
    for i in (0, n_new - 1):
        for h in (0, QH - 1):
            s = kr[:, h // (QH // KVH), :] @ qf[h, i].astype(np.float64) / math.sqrt(D)
            s[~visible[i]] = -np.inf
            p = np.exp(s - s.max())
            ref = p @ vr[:, h // (QH // KVH), :] / p.sum()
            err = max(err, float(np.abs(got[i, h] - ref).max() / max(1.0, np.abs(ref).max())))
    g.free()
    return med, mn, err


def attention_numpy(ctx_len, reps, rng):
    k = rng.standard_normal((KVH, ctx_len, D), dtype=np.float32)
    v = rng.standard_normal((KVH, ctx_len, D), dtype=np.float32)
    q = rng.standard_normal((KVH, QH // KVH, D), dtype=np.float32)
    scale = np.float32(1.0 / math.sqrt(D))

    def run():
        s = np.matmul(q, k.transpose(0, 2, 1)) * scale  # [8, 4, ctx]
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)
        return np.matmul(s, v)  # [8, 4, 128]

    return timed(run, reps)


def rope_ggml(tokens, threads, reps, rng):
    g = Graph(tokens * 8 * D * 2 + tokens * 4 + (64 << 20))
    x = ggml.ggml_new_tensor_3d(g.ctx, ggml.GGML_TYPE_F16, D, 8, tokens)
    put(x, rng.standard_normal((tokens, 8, D), dtype=np.float32).astype(np.float16))
    pos = ggml.ggml_new_tensor_1d(g.ctx, ggml.GGML_TYPE_I32, tokens)
    put(pos, (np.arange(tokens, dtype=np.int32) % 65536))
    out = ggml.ggml_rope_ext_inplace(g.ctx, x, pos, None, D, ggml.GGML_ROPE_TYPE_NEOX, 0, 500000.0, 1.0, 0.0, 1.0,
                                     32.0, 1.0)
    g.build(out, threads)
    med, mn = timed(g.compute, reps)
    g.free()
    return med, mn


def cpu_features():
    names = ["avx2", "f16c", "fma", "avx512", "avx512_bf16", "avx512_vnni"]
    return ",".join(n for n in names if getattr(ggml, f"ggml_cpu_has_{n}", lambda: 0)())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--ctx", type=int, nargs="*", default=[1024, 4096, 8192, 32768])
    ap.add_argument("--rope-tokens", type=int, default=32768)
    ap.add_argument("--prefill", type=lambda x: tuple(int(v) for v in x.split("+")), nargs="*", default=[(1024, 128)],
                    help="prefill shapes CTX+NEW (the chunk's NEW tokens are the last of CTX)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    out = open(args.json, "a") if args.json else None
    rng = np.random.default_rng(7)
    feats = cpu_features()

    def emit(bench, case, variant, med, mn, nbytes, **extra):
        rec = dict(bench=bench, case=case, variant=variant, threads=args.threads, median_us=med, min_us=mn,
                   bytes=nbytes, gbps=nbytes / med / 1e3, cpu=feats, **extra)
        line = json.dumps(rec)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    for ctx_len in args.ctx:
        for fp8 in (False, True):
            case = f"llama8b_{'fp8' if fp8 else 'f16'}_b1_ctx{ctx_len}"
            kind = ggml.GGML_TYPE_Q8_0 if fp8 else ggml.GGML_TYPE_F16
            med, mn, err = attention_ggml(ctx_len, kind, args.threads, args.reps, rng)
            emit("attention", case, "ggml_q8_0" if fp8 else "ggml_f16", med, mn, kv_bytes(ctx_len, fp8), max_rel_err=err)
        med, mn = attention_numpy(ctx_len, args.reps, rng)
        emit("attention", f"llama8b_f16_b1_ctx{ctx_len}", "numpy_f32", med, mn, kv_bytes(ctx_len, False))
    for ctx_len, n_new in args.prefill:
        med, mn, err = attention_prefill_ggml(ctx_len, n_new, args.threads, max(5, args.reps // 3), rng)
        flops = 4.0 * D * QH * (n_new * (ctx_len - n_new + 1) + n_new * (n_new - 1) / 2)
        emit("attention_prefill", f"llama8b_prefill_f16_b1_ctx{ctx_len}_new{n_new}", "ggml_f16", med, mn,
             2.0 * ctx_len * KVH * D * 2, max_rel_err=err, gflops=flops / med / 1e3)
    t = args.rope_tokens
    med, mn = rope_ggml(t, args.threads, max(5, args.reps // 3), rng)
    emit("rope", f"f16 neox theta 5e5 [T,8,128] T={t}", "ggml_f16", med, mn, 2.0 * 2.0 * t * 8 * D)


if __name__ == "__main__":
    sys.exit(main())
