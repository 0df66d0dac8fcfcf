#!/usr/bin/python3
"""Calibrates the datasheet profiles' efficiencies on published training runs.

For every published run below, `longctx plan` predicts the step time of the
same configuration (model shape, length, batch, mesh, remat, strategy) on the
profile; the published step time then gives the published MFU in the
planner's own FLOP count (causal attention counts its unmasked pairs: NVIDIA's
tables count the full square, so their MFU reads higher for the same run).

  --fit   solves matmul_efficiency (and, for the TPUs, attention_efficiency)
          so that the anchor runs' predicted step times equal the published
          ones: step time = X / matmul_eff + Y / attention_eff + Z, with X, Y,
          Z found from three plans per anchor (exposed communication is not
          exactly of this form; the table shows what the result predicts).
  default prints bench/results/calibration.md's table: published MFU, MFU
          predicted before calibration (matmul 0.6, attention 0.45, no chunk
          fall-off: the profiles until this calibration) and after (the
          committed profiles).

  /usr/bin/python3 bench/results/calibration.py [--fit] [--build build] > bench/results/calibration.md
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
V5P = "https://github.com/AI-Hypercomputer/tpu-recipes/blob/main/training/v5p/Llama3.1-8B-LongContext-Maxtext/cluster_toolkit/README.md"
V7 = "https://github.com/AI-Hypercomputer/tpu-recipes/blob/main/training/ironwood/Llama3.1-8B-LongContext-Maxtext/cluster_toolkit/README.md"
H100 = "https://github.com/NVIDIA/dgxc-benchmarking/blob/main/llama3.1/README_8b.md (NeMo 24.09)"

# The recipes' Llama 3.1 8B variant: 16 query heads, 4 KV heads, head_dim 256.
WIDE_HEADS = ["head_dim=256", "base_num_query_heads=16", "base_num_kv_heads=4"]


def run(profile, label, seq, cp, fsdp, batch, remat, published_s, published_mfu, role, extra=(), devices=64,
        source=V5P, dp=1, heads=WIDE_HEADS, model="llama3.1-8b"):
    args = ["configs/base.yml", "model_name=" + model, "dtype=bfloat16", "max_target_length=%d" % seq,
            "ici_context_parallelism=%d" % cp, "ici_fsdp_parallelism=%d" % fsdp, "ici_data_parallelism=%d" % dp,
            "per_device_batch_size=%d" % batch, "context_parallel_strategy=ring", "remat_policy=" + remat]
    return dict(profile=profile, label=label, args=args + list(heads) + list(extra), devices=devices,
                published_s=published_s, published_mfu=published_mfu, role=role, source=source)


# Per chip: the v7 recipes count TensorCores (2 per chip) as devices; their
# cp and fsdp over cores are halved here, over chips, and the batch per data
# rank follows (global batch = per_device_batch_size x cores).
CUSTOM = lambda ctx, inputs: ["context=" + ctx, "decoder_layer_input=" + inputs]  # noqa: E731
RUNS = [
    run("tpu-v5p", "64K", 65536, 4, 16, 2, "custom", 10.25, 67.3, "matmul anchor", CUSTOM("device", "device")),
    run("tpu-v5p", "256K", 262144, 16, 4, 2, "custom", 26.31, 68.1, "check", CUSTOM("offload", "offload")),
    run("tpu-v5p", "1M", 1048576, 64, 1, 2, "custom", 95.73, 64.86, "check", CUSTOM("offload", "device")),
    run("tpu-v5p", "2M", 2097152, 64, 1, 2, "custom", 357.68, 67.63, "check", CUSTOM("offload", "offload")),
    run("tpu-v5p", "4M", 4194304, 64, 1, 2, "custom", 1373.73, 69.50, "attention anchor", CUSTOM("offload", "offload")),
    run("tpu-v5p", "10M", 10485760, 64, 1, 1, "full", 8060.20, 36.72, "check"),
    run("tpu-v5p", "14M", 14680064, 64, 1, 1, "custom", 15766.82, 36.73, "check", CUSTOM("remat", "offload")),
    run("tpu-v7", "64K", 65536, 1, 64, 1, "custom", 5.31, 51.7, "matmul anchor", CUSTOM("device", "device"), source=V7),
    run("tpu-v7", "256K", 262144, 4, 16, 1, "custom", 14.08, 50.7, "check", CUSTOM("device", "device"), source=V7),
    run("tpu-v7", "1M", 1048576, 16, 4, 1, "custom", 49.58, 49.98, "check", CUSTOM("device", "device"), source=V7),
    run("tpu-v7", "2M", 2097152, 32, 2, 1, "custom", 94.60, 51.03, "attention anchor", CUSTOM("device", "device"), source=V7),
    run("tpu-v7", "4M", 4194304, 64, 1, 1, "custom", 186.48, 50.93, "check", CUSTOM("device", "device"),
        source=V7),
    run("tpu-v7", "10M", 10485760, 64, 1, 1, "custom", 1124.12, 52.54, "check",
        CUSTOM("device", "device") + ["optimizer_memory_host_offload=true"], source=V7),
    run("tpu-v7", "14M", 14680064, 64, 1, 1, "custom", 2361.05, 48.80, "check",
        CUSTOM("offload", "offload") + ["optimizer_memory_host_offload=true"], source=V7),
    # 8 GPUs, TP 1, PP 1, CP 2 (dp 4), GBS 128 = 32 sequences per data rank
    # (micro-batch 1 x 32 accumulation steps), stock heads, no recompute.
    run("h100", "8K", 8192, 2, 1, 32, "none", 12.91, 59.37, "matmul anchor", devices=8, dp=4, heads=(), source=H100),
]

# What the profiles assumed before this calibration.
BEFORE = {"matmul_efficiency": 0.6, "attention_efficiency": 0.45, "attention_block": 0,
          "attention_half_rate_tokens": 0}


def profile_file(name, overrides, tmp):
    with open(os.path.join(ROOT, "configs/hardware", name + ".yml")) as f:
        p = yaml.safe_load(f)
    p.update(overrides)
    if overrides.get("attention_block", 1) == 0:
        p.pop("attention_partial_tile_cost", None)
    path = os.path.join(tmp, "%s-%d.yml" % (name, abs(hash(json.dumps(overrides, sort_keys=True)))))
    with open(path, "w") as f:
        yaml.safe_dump(p, f)
    return path


def predict(build, r, overrides, tmp):
    hw = profile_file(r["profile"], overrides, tmp)
    out = subprocess.run([os.path.join(build, "longctx"), "plan"] + r["args"] +
                         ["--hardware", hw, "--devices", str(r["devices"]), "--json"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    ring = [c for c in json.loads(out)["candidates"] if c["strategy"] == "ring"]
    return ring[0]


def fit(build, tmp):
    for name in sorted({r["profile"] for r in RUNS}):
        anchors = [r for r in RUNS if r["profile"] == name and r["role"].endswith("anchor")]
        # step(u, v) = X u + Y v + Z, u = 1 / matmul_eff, v = 1 / attention_eff.
        rows = []
        for r in anchors:
            t = {(m, a): predict(build, r, {"matmul_efficiency": m, "attention_efficiency": a}, tmp)["step_seconds"]
                 for m, a in [(0.5, 0.5), (0.25, 0.5), (0.5, 0.25)]}
            X = (t[0.25, 0.5] - t[0.5, 0.5]) / 2
            Y = (t[0.5, 0.25] - t[0.5, 0.5]) / 2
            Z = t[0.5, 0.5] - 2 * X - 2 * Y
            rows.append((X, Y, Z, r["published_s"]))
        if len(rows) == 2:
            (x1, y1, z1, p1), (x2, y2, z2, p2) = rows
            det = x1 * y2 - x2 * y1
            u = ((p1 - z1) * y2 - (p2 - z2) * y1) / det
            v = (x1 * (p2 - z2) - x2 * (p1 - z1)) / det
            print("%s: matmul_efficiency %.3f attention_efficiency %.3f" % (name, 1 / u, 1 / v))
        else:
            with open(os.path.join(ROOT, "configs/hardware", name + ".yml")) as f:
                a = yaml.safe_load(f)["attention_efficiency"]
            x, y, z, p = rows[0]
            print("%s: matmul_efficiency %.3f (attention_efficiency %.3f kept)" % (name, x / (p - z - y / a), a))


def table(build, tmp):
    print("| profile | run (source) | config | published step, MFU as published | published MFU, planner's FLOPs | "
          "predicted MFU before | after | predicted step after | role |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in RUNS:
        before = predict(build, r, BEFORE, tmp)
        after = predict(build, r, {}, tmp)
        # Same FLOPs per step: MFU scales with 1 / step time.
        published = after["mfu"] * after["step_seconds"] / r["published_s"]
        short = {"max_target_length": "S", "ici_context_parallelism": "cp", "ici_fsdp_parallelism": "fsdp",
                 "ici_data_parallelism": "dp", "per_device_batch_size": "B", "remat_policy": "remat",
                 "decoder_layer_input": "inputs", "optimizer_memory_host_offload": "opt offload"}
        cfg = " ".join(short.get(a.split("=")[0], a.split("=")[0]) + "=" + a.split("=")[1] for a in r["args"][1:]
                       if a.split("=")[0] in short or a.startswith("context="))
        print("| %s | %s ([source](%s)) | %s, %d devices | %.2f s, %.1f%% | %.1f%% | %.1f%% | %.1f%% | %.2f s | %s |"
              % (r["profile"], r["label"], r["source"].split(" ")[0], cfg, r["devices"], r["published_s"],
                 r["published_mfu"], 100 * published, 100 * before["mfu"], 100 * after["mfu"],
                 after["step_seconds"], r["role"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fit(args.build, tmp) if args.fit else table(args.build, tmp)


if __name__ == "__main__":
    sys.exit(main())
