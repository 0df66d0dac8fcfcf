#!/usr/bin/env python3
"""Plots `longctx eval` results: loss by position bucket, one line per JSON file.

    scripts/plot_eval.py runs/x/eval.json [other.json ...] -o eval.png

Needs matplotlib (Debian: python3-matplotlib)."""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="eval_output files of longctx eval")
    ap.add_argument("-o", "--output", required=True, help="PNG file to write")
    a = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4))
    for path in a.json:
        # A device (/dev/full, /dev/zero) would be read forever: results are regular files.
        if not os.path.isfile(path):
            sys.exit(f"plot_eval: {path} is not a regular file (an eval_output JSON)")
        with open(path) as f:
            r = json.load(f)
        rows = [b for b in r["buckets"] if b["loss"] is not None]
        ax.plot(range(len(rows)), [b["loss"] for b in rows], marker="o",
                label=f"{os.path.basename(str(r['weights']).rstrip('/'))} (mean {r['loss']:.3f})")
        ax.set_xticks(range(len(rows)), [b["label"] for b in rows], rotation=30)
    ax.set_xlabel("position in sequence (RoPE position)")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title("held-out loss by context position")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.output, dpi=120)


if __name__ == "__main__":
    main()
