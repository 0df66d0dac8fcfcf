#!/usr/bin/python3
"""Plots of training metrics and of the benchmark results (matplotlib).

  scripts/plot.py metrics runs/demo/metrics.jsonl [more.jsonl ...] [-o plots/]
      loss, tokens/s per device, MFU and peak memory per step, one line per
      file (compare runs by passing several).
  scripts/plot.py bench [-o plots/]
      from bench/results: CP parallel efficiency by sequence length and
      strategy (cp_sweep/*.json), attention GFLOP/s by mask over the
      same-run GEMM (attention_cpu.json), planner predicted vs measured step
      time (plan_cpu.md).

Writes PNGs and prints their paths. Needs python3-matplotlib (scripts/setup.sh
installs it).
"""
import argparse
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "results")


def read_json_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def save(fig, out_dir, name):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(path)
    return path


def plot_metrics(files, out_dir):
    panels = [("loss", "loss (nats)", 1.0), ("tokens_per_second_per_device", "tokens/s per device", 1.0),
              ("mfu", "MFU (%)", 100.0), ("peak_memory_bytes", "peak memory (MiB)", 1.0 / 2**20)]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for path in files:
        rows = read_json_lines(path)
        if not rows:
            sys.exit(f"plot.py: {path} has no metrics lines")
        steps = [r["step"] for r in rows]
        label = os.path.basename(os.path.dirname(os.path.abspath(path))) or path
        for ax, (key, title, scale) in zip(axes.flat, panels):
            if key not in rows[0]:
                sys.exit(f"plot.py: {path}: no '{key}' in the metrics (is it a longctx metrics_file?)")
            ax.plot(steps, [r[key] * scale for r in rows], label=label)
    for ax, (_, title, _) in zip(axes.flat, panels):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if len(files) > 1:
        axes.flat[0].legend()
    return [save(fig, out_dir, "metrics.png")]


def plot_cp_efficiency(out_dir):
    # Runs without their own 1-rank baseline (--no-single) have no efficiency;
    # one point per (strategy, ranks, length).
    runs = {}
    for p in sorted(glob.glob(os.path.join(RESULTS, "cp_sweep", "*.json"))):
        r = json.load(open(p))
        if "parallel_efficiency" in r:
            runs[(r["strategy"], r["ranks"], r["seq"])] = r
    runs = list(runs.values())
    if not runs:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (strategy, ranks) in sorted({(r["strategy"], r["ranks"]) for r in runs}):
        points = sorted((r["seq"], r["parallel_efficiency"]) for r in runs
                        if r["strategy"] == strategy and r["ranks"] == ranks)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{strategy}, {ranks} ranks" + (" (2 per core)" if ranks > 2 else ""))
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("parallel efficiency (1-rank step / (N x N-rank step))")
    ax.set_title("context-parallel attention (bench/results/cp_cpu.md)")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.grid(alpha=0.3)
    ax.legend()
    return [save(fig, out_dir, "cp_efficiency.png")]


def plot_attention(out_dir):
    path = os.path.join(RESULTS, "attention_cpu.json")
    if not os.path.exists(path):
        return []
    rows = [r for r in read_json_lines(path) if r.get("threads") == 2 and r.get("head_dim") == 128]
    if not rows:
        return []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for mask in sorted({r["mask"] for r in rows}):
        points = sorted((r["seq"], r["fwd_ratio"], r["bwd_ratio"]) for r in rows if r["mask"] == mask)
        line, = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=f"{mask} forward")
        ax.plot([p[0] for p in points], [p[2] for p in points], marker="s", ls="--", color=line.get_color(),
                label=f"{mask} backward")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("attention FLOP/s over the same-run GEMM")
    ax.set_title("attention kernel by mask, 2 threads (bench/results/attention_cpu.md)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return [save(fig, out_dir, "attention_by_mask.png")]


def plot_planner(out_dir):
    path = os.path.join(RESULTS, "plan_cpu.md")
    if not os.path.exists(path):
        return []
    predicted, measured, labels = [], [], []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 11 or not re.fullmatch(r"\d+", cells[0]):
            continue
        predicted.append(float(cells[8]))
        measured.append(float(cells[9]))
        labels.append(f"{cells[0]}r {cells[3]} S={cells[4]}")
    if not predicted:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 5))
    ax.scatter(measured, predicted)
    top = max(predicted + measured) * 1.1
    ax.plot([0, top], [0, top], color="gray", lw=0.8, label="predicted = measured")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step (s)")
    ax.set_ylabel("planner's prediction (s)")
    ax.set_title("planner vs real steps (bench/results/plan_cpu.md)")
    ax.grid(alpha=0.3)
    ax.legend()
    return [save(fig, out_dir, "planner_vs_measured.png")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("metrics", help="plots of one or more metrics files")
    m.add_argument("files", nargs="+")
    m.add_argument("-o", "--out", default="plots")
    b = sub.add_parser("bench", help="plots of bench/results")
    b.add_argument("-o", "--out", default="plots")
    args = parser.parse_args()
    if args.what == "metrics":
        plot_metrics(args.files, args.out)
    else:
        written = plot_cp_efficiency(args.out) + plot_attention(args.out) + plot_planner(args.out)
        if not written:
            sys.exit("plot.py: nothing to plot in bench/results")


if __name__ == "__main__":
    main()
