#!/usr/bin/env python3
"""longctx's training step against the same Llama written in PyTorch, at the
same shape, dtype and thread count, in the same run, one after the other.

The step is what `longctx bench model` times: forward and backward of one
batch (loss and gradients; no optimizer update, which is 0.1% of the FLOPs
here). The PyTorch model is a Llama as torchtitan writes one: RMSNorm, RoPE
(theta from the config, no scaling), GQA by repeating K, V heads (as
transformers' repeat_kv), F.scaled_dot_product_attention(is_causal=True),
SwiGLU, untied embeddings, cross-entropy in fp32. Its parameter count is checked
against longctx's, so the shapes cannot drift apart.

Precision, both sides: fp32 is fp32 throughout. bf16 is longctx's `dtype:
bfloat16` (fp32 master weights, bf16 matmul inputs and activations, fp32
statistics and loss) against PyTorch's autocast to bf16 on fp32 weights (the
usual bf16 recipe on CPU), with Q, K, V given to SDPA in bf16.

Prints one table: tokens/s of each, the ratio longctx / PyTorch, and each
one's MFU against the GEMM longctx measures in the same run (oneDNN, same
dtype and threads; the FLOPs counted the same way: 6 x parameters x tokens
plus causal attention). Best of --steps steps after one warm-up, for both, in
--rounds rounds taken in turn (longctx, PyTorch, longctx, ...), each side's
best kept (the GEMM too).

Usage: /usr/bin/python3 bench/peers/model_peer.py [--build build] [--seq 16384]
         [--threads 2] [--dtypes fp32,bf16] [--steps 3] [--rounds 2]
"""
import argparse
import json
import os
import sys
import time

from peer_env import ROOT, best_of, json_line, start

CONFIG = "configs/model/bench-512.yml"  # bench model's default shape


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--seq", type=int, default=16384)
    p.add_argument("--threads", default="2")
    p.add_argument("--dtypes", default="fp32,bf16")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2,
                   help="longctx then PyTorch, this many times in turn; each side's best kept")
    p.add_argument("--torch", action="store_true", help=argparse.SUPPRESS)   # internal: run PyTorch, print JSON
    p.add_argument("--shape", help=argparse.SUPPRESS)                       # with --torch: longctx's JSON
    p.add_argument("--dtype", default="fp32", help=argparse.SUPPRESS)       # with --torch
    return p.parse_args(argv)


def torch_step(a):
    """One PyTorch measurement (run inside the PyTorch environment)."""
    import warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")  # not needed here
    import torch
    import torch.nn.functional as F
    from torch import nn

    shape = json.loads(a.shape)
    d, H, G, hd, f = shape["d_model"], shape["heads"], shape["kv_heads"], shape["head_dim"], shape["mlp_dim"]
    L, V, S, B, theta = shape["layers"], shape["vocab"], shape["seq"], shape["batch"], shape["rope_theta"]
    threads = int(a.threads)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    bf16 = a.dtype == "bf16"

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = nn.RMSNorm(d, eps=1e-5), nn.RMSNorm(d, eps=1e-5)
            self.wq, self.wo = nn.Linear(d, H * hd, bias=False), nn.Linear(H * hd, d, bias=False)
            self.wk, self.wv = nn.Linear(d, G * hd, bias=False), nn.Linear(d, G * hd, bias=False)
            self.w_gate, self.w_up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
            self.w_down = nn.Linear(f, d, bias=False)

        def forward(self, x, cos, sin):
            h = self.attn_norm(x)
            q = self.wq(h).view(B, S, H, hd).transpose(1, 2)
            k = self.wk(h).view(B, S, G, hd).transpose(1, 2)
            v = self.wv(h).view(B, S, G, hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            if bf16:
                q, k, v = q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16)
            k, v = k.repeat_interleave(H // G, dim=1), v.repeat_interleave(H // G, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(o.transpose(1, 2).reshape(B, S, H * hd))
            h = self.mlp_norm(x)
            return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))

    def rope(t, cos, sin):  # rotate-half form, as transformers' Llama
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return torch.cat((t1 * cos - t2 * sin, t2 * cos + t1 * sin), dim=-1).to(t.dtype)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, d)
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            self.norm = nn.RMSNorm(d, eps=1e-5)
            self.head = nn.Linear(d, V, bias=False)

        def forward(self, tokens, targets):
            pos = torch.arange(S, dtype=torch.float32)
            inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
            angles = torch.outer(pos, inv)
            cos, sin = angles.cos(), angles.sin()
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x, cos, sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    model = Llama()
    params = sum(p.numel() for p in model.parameters())
    if params != shape["parameters"]:
        sys.exit(f"model_peer.py: the PyTorch Llama has {params} parameters, longctx's {shape['parameters']}: "
                 "the shapes differ")
    tokens = torch.randint(0, V, (B, S))
    targets = torch.randint(0, V, (B, S))
    best = float("inf")
    for rep in range(a.steps + 1):  # the first is a warm-up
        for p in model.parameters():
            p.grad = None
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(tokens, targets)
        loss.backward()
        if rep > 0:
            best = min(best, time.perf_counter() - t0)
    print(json.dumps({"peer": f"torch {torch.__version__} eager ({torch.backends.cpu.get_cpu_capability()})"
                              + (", autocast bf16" if bf16 else ""),
                      "best_step_seconds": best, "tokens_per_second": B * S / best, "loss": loss.item()}))


def main():
    a = parse_args(sys.argv[1:])
    if a.rounds < 1:
        sys.exit(f"model_peer: --rounds {a.rounds} must be at least 1")
    if a.torch:
        return torch_step(a)
    build, python = start(a.build, "model_peer.py")
    rows = []
    for dtype in a.dtypes.split(","):
        for threads in a.threads.split(","):
            env = dict(os.environ, OMP_NUM_THREADS=threads)
            ours = theirs = None
            for _ in range(a.rounds):
                ours = best_of(ours, json_line([os.path.join(build, "longctx"), "bench", "model", "--json",
                                                "--config", os.path.join(ROOT, CONFIG), "--seq", str(a.seq),
                                                "--dtype", dtype, "--threads", threads, "--steps", str(a.steps)],
                                               env))
                theirs = best_of(theirs, json_line([python, os.path.abspath(__file__), "--torch", "--dtype", dtype,
                                                    "--threads", threads, "--steps", str(a.steps),
                                                    "--shape", json.dumps(ours)], env))
            print(json.dumps(ours))
            print(json.dumps(theirs))
            rows.append((dtype, threads, ours, theirs))
    last = rows[-1][2]
    print(f"\n{CONFIG}: d_model {last['d_model']}, {last['heads']} heads, {last['kv_heads']} KV heads, "
          f"{last['layers']} layers, {last['parameters']} parameters; S={a.seq} causal, B=1, remat none; "
          f"forward + backward, best of {a.steps} after a warm-up in each of {a.rounds} rounds taken in turn, "
          f"wall clock; GEMM: longctx's same-run "
          f"oneDNN 2048^3 in the same dtype and threads")
    print(f"PyTorch: {rows[-1][3]['peer']}\n")
    print("| dtype | threads | longctx tokens/s | PyTorch tokens/s | longctx / PyTorch | GEMM GFLOP/s "
          "| longctx MFU | PyTorch MFU | loss at init, longctx / PyTorch |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dtype, threads, ours, theirs in rows:
        flops = ours["model_flops"] + ours["attention_flops"]
        mfu = lambda seconds: flops / seconds / 1e9 / ours["gemm_gflops"]
        print(f"| {dtype} | {threads} | {ours['tokens_per_second']:.0f} | {theirs['tokens_per_second']:.0f} "
              f"| {ours['tokens_per_second'] / theirs['tokens_per_second']:.2f} | {ours['gemm_gflops']:.1f} "
              f"| {100 * mfu(ours['best_step_seconds']):.0f}% | {100 * mfu(theirs['best_step_seconds']):.0f}% "
              f"| {ours['loss']:.4f} / {theirs['loss']:.4f} |")


if __name__ == "__main__":
    main()
