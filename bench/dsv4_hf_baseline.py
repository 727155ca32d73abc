#!/usr/bin/env python3
"""HF transformers 5.17 doing DeepSeek-V4-Flash's cache work in PyTorch: the baseline of `kvcore bench dsv4`.

Times, on the same GPU, what HF's own modules do for the cache per decode token:
  - window-only layer: the sliding-window cache update (DynamicSlidingWindowLayer.update);
  - CSA layer: the update + DeepseekV4CSACompressor (compressor state, pooling, norm, RoPE,
    the indexer's own compressor, its scores and top-k);
  - HCA layer: the update + DeepseekV4HCACompressor.
Projections are excluded: every nn.Linear the compressors call (kv_proj, gate_proj,
q_b_proj, weights_proj) is replaced by a stub that returns precomputed outputs, as
kvcore receives the engine's projections. The 43-layer step of V4-Flash is composed as
2 window + 21 CSA + 20 HCA layers (each layer's cache work is independent).

Cases (names as kvcore's bench prints them, so the lead can divide):
  decode43 cache step+indexer ctx=N   full HF cache work per token at context N
  decode43 cache step ctx=N           the same with the indexer scorer stubbed (zeros)
  prefill csa n=N / prefill hca n=N   one compressor over N tokens (CSA without its indexer)
  hf csa layer ... / hf hca layer ... / hf window layer ...   the per-layer parts

Writes JSON lines in the format of bench/harness.cpp (bench, case, backend, device_name,
commit, median_us, min_us, reps, ...). Usage:
  python bench/dsv4_hf_baseline.py --device cuda --json bench/results/dsv4_hf.jsonl
  python bench/dsv4_hf_baseline.py --device cpu --quick        # smoke run
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

from transformers import DeepseekV4Config, DynamicCache
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdl

YARN = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536, "beta_fast": 32.0,
        "beta_slow": 1.0}


class Stub(nn.Module):
    """Stands in for an nn.Linear: returns whatever output was set for this call."""

    def __init__(self):
        super().__init__()
        self.value = None

    def forward(self, x):
        return self.value


class ZeroScorer(nn.Module):
    def forward(self, q, compressed_kv, hidden_states):
        return torch.zeros(q.shape[0], q.shape[1], compressed_kv.shape[1], device=q.device)


def flash_config(max_pos):
    # V4-Flash's attention geometry; hidden size is irrelevant (projections are stubbed).
    return DeepseekV4Config(
        hidden_size=64, num_attention_heads=64, num_key_value_heads=1, num_hidden_layers=3, head_dim=512,
        partial_rotary_factor=64 / 512, q_lora_rank=64, o_groups=8, o_lora_rank=16, n_routed_experts=4,
        n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32, max_position_embeddings=max_pos,
        mlp_layer_types=["moe"] * 3,
        layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
        sliding_window=128, index_n_heads=64, index_head_dim=128, index_topk=512, num_nextn_predict_layers=0,
        rope_theta=10000.0, compress_rope_theta=160000.0, rope_parameters=dict(YARN))


class Layer:
    """One layer's HF cache machinery with stubbed projections."""

    def __init__(self, cfg, layer_idx, device, stub_scorer=False):
        self.kind = cfg.layer_types[layer_idx]
        self.idx = layer_idx
        self.comp = None
        self.stubs = {}
        if self.kind != "sliding_attention":
            cls = mdl.COMPRESSOR_CLASSES[self.kind]
            self.comp = cls(cfg).to(device).eval()
            with torch.no_grad():
                self.comp.position_bias.normal_()
            self._stub(self.comp, "kv_proj")
            self._stub(self.comp, "gate_proj")
            if hasattr(self.comp, "indexer"):
                ix = self.comp.indexer
                self._stub(ix, "kv_proj", "idx_kv")
                self._stub(ix, "gate_proj", "idx_gate")
                self._stub(ix, "q_b_proj", "idx_q")
                self._stub(ix.scorer, "weights_proj", "idx_w")
                if stub_scorer:
                    ix.scorer = ZeroScorer()
        self.cfg = cfg
        self.device = device

    def _stub(self, mod, name, key=None):
        s = Stub()
        setattr(mod, name, s)
        self.stubs[key or name] = s

    def make_inputs(self, n, gen):
        """Precomputed projections of n tokens (on the device)."""
        cfg, d = self.cfg, self.device
        hd, ihd, ih = cfg.head_dim, cfg.index_head_dim, cfg.index_n_heads
        r = lambda *s: torch.randn(*s, generator=gen).to(d)
        out = {"kv": r(1, 1, n, hd)}
        if self.kind == "compressed_sparse_attention":
            out.update(kv_proj=r(1, n, 2 * hd), gate_proj=r(1, n, 2 * hd), idx_kv=r(1, n, 2 * ihd),
                       idx_gate=r(1, n, 2 * ihd), idx_q=r(1, n, ih * ihd), idx_w=r(1, n, ih))
        elif self.kind == "heavily_compressed_attention":
            out.update(kv_proj=r(1, n, hd), gate_proj=r(1, n, hd))
        return out

    def step(self, cache, inputs, t0, n, sl=None):
        """HF's cache work for tokens t0..t0+n-1 (inputs sliced by sl)."""
        sl = sl if sl is not None else slice(None)
        kv = inputs["kv"][:, :, sl]
        cache.update(kv, kv, self.idx)
        if self.comp is None:
            return
        for k, s in self.stubs.items():
            s.value = inputs[k][:, sl]
        pid = torch.arange(t0, t0 + n, device=self.device).unsqueeze(0)
        hidden = torch.empty(1, n, self.cfg.hidden_size, device=self.device)
        self.comp(hidden, hidden, pid, cache, self.idx)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps, device):
    """Median and min microseconds of fn() (CUDA events on a GPU)."""
    us = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            us.append(a.elapsed_time(b) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            us.append((time.perf_counter() - t) * 1e6)
    return statistics.median(us), min(us), len(us)


def decode_per_token(cfg, layer_idx, device, context, n_tokens, reps, stub_scorer, gen):
    """Per-token HF cache work of one layer at `context`, averaged over n_tokens decode steps."""
    layer = Layer(cfg, layer_idx, device, stub_scorer)
    cache = DynamicCache(config=cfg)
    pre = layer.make_inputs(context, gen) if context else None
    chunk = 512  # the scorer materialises [chunk, heads, rows] floats
    with torch.no_grad():
        for t0 in range(0, context, chunk):  # bring the cache to `context` tokens
            n = min(chunk, context - t0)
            layer.step(cache, pre, t0, n, slice(t0, t0 + n))
        del pre
        dec = layer.make_inputs(n_tokens * (reps + 1), gen)
        pos = [context]

        def run():
            for _ in range(n_tokens):
                i = pos[0] - context
                layer.step(cache, dec, pos[0], 1, slice(i, i + 1))
                pos[0] += 1
        run()  # warm-up
        sync(device)
        med, mn, r = timed(run, reps, device)
    return med / n_tokens, mn / n_tokens, r


def prefill_time(cfg, layer_idx, device, n, reps, gen):
    layer = Layer(cfg, layer_idx, device)
    if layer.comp is not None and hasattr(layer.comp, "indexer"):
        class NoIndexer(nn.Module):  # time the attention compressor only (kvcore's "prefill csa")
            def forward(self, hidden_states, q_residual, position_ids, past_key_values, layer_idx):
                return torch.zeros(1, hidden_states.shape[1], 1, dtype=torch.long, device=hidden_states.device)
        layer.comp.indexer = NoIndexer()
        layer.stubs = {k: v for k, v in layer.stubs.items() if not k.startswith("idx")}
    inputs = layer.make_inputs(n, gen)
    inputs["kv"] = inputs["kv"][:, :, :1]  # the window update is not part of this case

    def run():
        for k, s in layer.stubs.items():
            s.value = inputs[k]
        pid = torch.arange(0, n, device=device).unsqueeze(0)
        hidden = torch.empty(1, n, cfg.hidden_size, device=device)
        layer.comp(hidden, hidden, pid, DynamicCache(config=cfg), layer.idx)
    with torch.no_grad():
        run()
        sync(device)
        return timed(run, reps, device)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default="")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--contexts", type=int, nargs="*", default=None)
    args = ap.parse_args()
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    contexts = args.contexts or ([256] if args.quick else [8192, 65536])
    n_prefill = 4096 if args.quick else 65536
    n_tokens = 8 if args.quick else 128
    reps = 2 if args.quick else args.reps
    cfg = flash_config(1 << 20)
    # The job's commit as the GPU scripts pass it (a device's copy of the tree may carry an older
    # .git), else the checkout's.
    commit = os.environ.get("KVCORE_GIT_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.check_output(["git", "rev-parse", "--short=12", "HEAD"], text=True).strip()
        except Exception:
            commit = "unknown"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = open(args.json, "a") if args.json else None

    def report(case, med, mn, r):
        rec = {"bench": "dsv4", "case": case, "backend": "hf-transformers-" + device.type, "device_name": name,
               "commit": commit, "median_us": med, "min_us": mn, "reps": r, "bytes": None, "gbps": None,
               "ceiling": None, "ceiling_gbps": None, "share_of_ceiling": None, "baseline": None,
               "baseline_median_us": None, "ratio": None, "torch": torch.__version__,
               "transformers": __import__("transformers").__version__}
        print(f"{case:48s} {med:12.1f} us (min {mn:.1f})", flush=True)
        if out:
            out.write(json.dumps(rec) + "\n")
            out.flush()

    for ctx in contexts:
        for stub_scorer, label in ((False, "decode43 cache step+indexer"), (True, "decode43 cache step")):
            w = decode_per_token(cfg, 0, device, ctx, n_tokens, reps, stub_scorer, gen)
            c = decode_per_token(cfg, 1, device, ctx, n_tokens, reps, stub_scorer, gen)
            h = decode_per_token(cfg, 2, device, ctx, n_tokens, reps, stub_scorer, gen)
            suffix = "" if not stub_scorer else " (scorer stubbed)"
            report(f"hf window layer decode ctx={ctx}", *w)
            report(f"hf csa layer decode ctx={ctx}{suffix}", *c)
            report(f"hf hca layer decode ctx={ctx}", *h)
            report(f"{label} ctx={ctx}", 2 * w[0] + 21 * c[0] + 20 * h[0], 2 * w[1] + 21 * c[1] + 20 * h[1], reps)
    for li, nm in ((1, "csa"), (2, "hca")):
        report(f"prefill {nm} n={n_prefill}", *prefill_time(cfg, li, device, n_prefill, reps, gen))
    if out:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
