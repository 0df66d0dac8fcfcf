#!/usr/bin/env python3
"""longctx's attention kernel against PyTorch's CPU scaled_dot_product_attention
(its flash attention), forward and backward, at the same shapes, dtype (fp32 and
bf16) and thread count (1 and 2), in the same run, one after the other. Prints
one table: GFLOP/s of each (counted the same way: forward 4 D, backward 10 D per
unmasked (q, kv) pair per head; causal), the ratio longctx / PyTorch, and each
one's ratio to the GEMM longctx measures in the same run (oneDNN, same dtype and
threads; the best of its rounds). Best of --reps calls after one warm-up, for both, in --rounds rounds
taken in turn (longctx, PyTorch, longctx, ...), each side's best rates kept.

PyTorch comes from PyPI into a virtual environment under the build directory
(peer_env.py), never a dependency of the C++ build.

Grouped-query attention (--kv-heads below --heads): PyTorch runs both ways a
user would (SDPA's enable_gqa, and K, V repeated to every query head, the
repeat timed) and keeps the faster.

Usage: /usr/bin/python3 bench/peers/attention_peer.py [--build build] [--seq 8192]
         [--heads 8] [--kv-heads 8] [--head-dim 128] [--threads 1,2] [--dtypes fp32,bf16]
         [--reps 3] [--rounds 2] [--clock wall|cpu]
"""
import argparse
import json
import os
import sys
import time

from peer_env import best_of, json_line, start


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=0, help="K and V heads (GQA); 0: --heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2,
                   help="longctx then PyTorch, this many times in turn; each side's best rates kept (a shared "
                        "machine's speed drifts within minutes: one round after the other can favour either)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: process CPU seconds / threads, for both (steadier on a shared machine)")
    p.add_argument("--sdpa", action="store_true", help=argparse.SUPPRESS)  # internal: run PyTorch, print JSON
    p.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)      # with --sdpa
    return p.parse_args(argv)


def sdpa(a):
    """One PyTorch measurement (run inside the PyTorch environment)."""
    import torch
    import torch.nn.functional as F

    threads = int(a.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    q = torch.randn(1, a.heads, a.seq, a.head_dim, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(1, a.kv_heads, a.seq, a.head_dim, dtype=dtype, requires_grad=True) for _ in range(2))
    pairs = a.heads * a.seq * (a.seq + 1) // 2

    def now():
        return time.process_time() / threads if a.clock == "cpu" else time.perf_counter()

    def attend():  # one K, V head per query head
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def attend_gqa():  # PyTorch's own grouped-query attention
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    def attend_repeated():  # K and V repeated to every query head, the repeat timed too
        group = a.heads // a.kv_heads
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                              is_causal=True)

    # Grouped-query attention: whichever of PyTorch's two ways is faster here.
    ways = {"": attend} if a.kv_heads == a.heads else {", enable_gqa": attend_gqa,
                                                               ", K/V repeat_interleave": attend_repeated}
    best = None
    for name, attend in ways.items():
        fwd = bwd = float("inf")
        for rep in range(a.reps + 1):  # the first is a warm-up
            t0 = now()
            o = attend()
            t1 = now()
            o.backward(torch.ones_like(o))
            t2 = now()
            q.grad = k.grad = v.grad = None
            if rep > 0:
                fwd, bwd = min(fwd, t1 - t0), min(bwd, t2 - t1)
        if best is None or fwd + bwd < best[1] + best[2]:
            best = (name, fwd, bwd)
    name, fwd, bwd = best
    print(json.dumps({"peer": f"torch {torch.__version__} SDPA ({torch.backends.cpu.get_cpu_capability()}{name})",
                      "fwd_gflops": 4 * a.head_dim * pairs / fwd / 1e9,
                      "bwd_gflops": 10 * a.head_dim * pairs / bwd / 1e9}))


def main():
    a = parse_args(sys.argv[1:])
    a.kv_heads = a.kv_heads or a.heads
    if a.heads % a.kv_heads:
        sys.exit(f"attention_peer: --heads {a.heads} must be a multiple of --kv-heads {a.kv_heads}")
    if a.rounds < 1:
        sys.exit(f"attention_peer: --rounds {a.rounds} must be at least 1")
    if a.sdpa:
        return sdpa(a)
    build, python = start(a.build, "attention_peer.py")
    rows = []
    for dtype in a.dtypes.split(","):
        for threads in a.threads.split(","):
            env = dict(os.environ, OMP_NUM_THREADS=threads)
            shape = ["--seq", str(a.seq), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
                     "--head-dim", str(a.head_dim)]
            ours = theirs = None
            for _ in range(a.rounds):
                ours = best_of(ours, json_line([os.path.join(build, "longctx"), "bench", "attention", "--json",
                                                "--mask", "causal", "--dtype", dtype, "--threads", threads,
                                                "--reps", str(a.reps), "--clock", a.clock] + shape, env))
                theirs = best_of(theirs, json_line([python, os.path.abspath(__file__), "--sdpa", "--dtype", dtype,
                                                    "--threads", threads, "--reps", str(a.reps), "--clock", a.clock]
                                                   + shape, env))
            print(json.dumps(ours))
            print(json.dumps(theirs))
            rows.append((dtype, threads, ours, theirs))
    gemm_of = lambda r: r[2]["gemm_gflops"]
    print(f"\nS={a.seq} H={a.heads} G={a.kv_heads} D={a.head_dim} causal, B=1, best of {a.reps} after a warm-up "
          f"in each of {a.rounds} rounds taken in turn, {a.clock} clock; GEMM: longctx's same-run oneDNN 2048^3 "
          "in the same dtype and threads")
    print(f"longctx tile path ({rows[-1][0]}): {rows[-1][2]['tile_path']}; PyTorch: {rows[-1][3]['peer']}\n")
    print("| dtype | threads | longctx fwd / bwd GFLOP/s | PyTorch fwd / bwd GFLOP/s | longctx / PyTorch fwd / bwd "
          "| GEMM GFLOP/s | longctx / GEMM fwd / bwd | PyTorch / GEMM fwd / bwd |")
    print("|---|---|---|---|---|---|---|---|")
    for dtype, threads, ours, theirs in rows:
        g = ours["gemm_gflops"]
        print(f"| {dtype} | {threads} | {ours['fwd_best_gflops']:.1f} / {ours['bwd_best_gflops']:.1f} "
              f"| {theirs['fwd_gflops']:.1f} / {theirs['bwd_gflops']:.1f} "
              f"| {ours['fwd_best_gflops'] / theirs['fwd_gflops']:.2f} / {ours['bwd_best_gflops'] / theirs['bwd_gflops']:.2f} "
              f"| {g:.1f} | {ours['fwd_best_gflops'] / g:.2f} / {ours['bwd_best_gflops'] / g:.2f} "
              f"| {theirs['fwd_gflops'] / g:.2f} / {theirs['bwd_gflops'] / g:.2f} |")


if __name__ == "__main__":
    main()
