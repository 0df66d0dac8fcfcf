#!/usr/bin/env python3
"""The peer for `longctx bench attention`: PyTorch's CPU scaled_dot_product_attention
(its flash attention), fp32, causal, the same shape, FLOPs counted as longctx counts
them (forward 4 D per unmasked (q, kv) pair per head, backward 10 D). Run it with
the virtual environment bench/results/attention_peer.sh makes (build/peer)."""
import argparse
import json
import time

import torch
import torch.nn.functional as F

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, required=True)
p.add_argument("--heads", type=int, required=True)
p.add_argument("--seq", type=int, required=True)
p.add_argument("--head-dim", type=int, default=128)
p.add_argument("--reps", type=int, default=3)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(0)
q, k, v = (torch.randn(1, a.heads, a.seq, a.head_dim, requires_grad=True) for _ in range(3))
pairs = a.heads * a.seq * (a.seq + 1) // 2
fwd_best = bwd_best = float("inf")
for rep in range(a.reps + 1):  # the first is a warm-up
    t0 = time.perf_counter()
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t1 = time.perf_counter()
    o.backward(torch.ones_like(o))
    t2 = time.perf_counter()
    q.grad = k.grad = v.grad = None
    if rep > 0:
        fwd_best, bwd_best = min(fwd_best, t1 - t0), min(bwd_best, t2 - t1)
print(json.dumps({"peer": f"torch {torch.__version__} SDPA ({torch.backends.cpu.get_cpu_capability()})",
                  "threads": a.threads, "heads": a.heads, "seq": a.seq, "head_dim": a.head_dim,
                  "fwd_gflops": 4 * a.head_dim * pairs / fwd_best / 1e9,
                  "bwd_gflops": 10 * a.head_dim * pairs / bwd_best / 1e9}))
