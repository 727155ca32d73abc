"""Host cost of kvcore's per-layer calls at a short context on the CPU, warm and with the caches
cold as they are inside a model's forward (each layer streams megabytes of weights between two
kvcore calls). SmolLM2-135M's attention shape (3 kv heads of 64, 9 query heads, f16 pages), --context
cached tokens (default 17), one new token.

  PYTHONPATH=build/python python bench/hf/layer_call_cost.py [--threads 2] [--context 17]

Prints the mean host time of store() and plan.run() per call: warm (the same call repeated) and
cold (a 64 MB buffer rewritten before each call)."""

import argparse
import time

import torch

import kvcore
from kvcore.hf.rope import rope_spec_from_config


def mean_us(f, n, before=None):
    total = 0.0
    for _ in range(n):
        if before is not None:
            before()
        t0 = time.perf_counter()
        f()
        total += time.perf_counter() - t0
    return 1e6 * total / n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=17, help="cached tokens before the new one")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from transformers import LlamaConfig

    cfg = LlamaConfig(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                      rope_parameters=dict(rope_type="default", rope_theta=100000.0))
    n = a.context
    pc = kvcore.PagedCache(num_blocks=n // 16 + 4, device="cpu", n_layers=30, n_kv_heads=3, head_dim=64,
                           rope=rope_spec_from_config(cfg), block_size=16, k_format="f16", rope_mode="on_read")
    s = pc.create()
    t = pc.reserve([s], list(range(n)), [n])
    k, v = torch.randn(n, 3, 64), torch.randn(n, 3, 64)
    for layer in range(30):
        pc.store(t, layer, k, v)
    t = pc.reserve([s], [n], [1])
    pc.store(t, 0, k[:1], v[:1])
    plan = pc.plan(t, softmax_scale=0.125)
    q, out = torch.randn(1, 9, 64), torch.empty(1, 9, 64)
    big = torch.empty(64 << 20, dtype=torch.uint8)
    calls = {"store": lambda: pc.store(t, 0, k[:1], v[:1]), "run": lambda: plan.run(0, q),
             "run out=": lambda: plan.run(0, q, out=out)}
    for name, f in calls.items():
        mean_us(f, 200)
        warm = mean_us(f, 3000)
        cold = mean_us(f, 300, before=lambda: big.add_(1))
        print(f"{name:9s} warm {warm:6.1f} us   cold {cold:6.1f} us")


if __name__ == "__main__":
    main()
