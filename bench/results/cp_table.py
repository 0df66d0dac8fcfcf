#!/usr/bin/env python3
"""Markdown table of bench/results/cp_sweep/*.json (written by cp_cpu_sweep.sh)."""
import glob, json, os, re, sys

d = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "cp_sweep")
rows = []
single = {}  # seq -> 1-rank step (wall, cpu), for runs made with --no-single
for path in sorted(glob.glob(os.path.join(d, "*.json"))):
    if os.path.getsize(path) == 0:
        continue  # a run in progress
    r = json.load(open(path))
    name = os.path.basename(path)[:-5]
    up = open(os.path.join(d, name + ".uptime")).read().splitlines()
    load = [re.search(r"load average: ([\d.]+)", l).group(1) for l in up]
    r["_load"] = "/".join(load)
    r["_name"] = name
    if "single_rank" in r:
        s = r["single_rank"]
        single.setdefault(r["seq"], (s["forward_s"] + s["backward_s"], s["cpu_s"], s["peak_bytes"]))
    rows.append(r)

order = {"ring": 0, "ulysses": 1, "all_gather": 2}
rows.sort(key=lambda r: (r["ranks"], r["seq"], order.get(r["strategy"], 9), r["ring_chunk_tokens"]))
MiB = 1 << 20
print("| strategy | ranks | S | 1-rank fwd+bwd wall / cpu (s) | per-rank fwd / bwd (s, max rank) | per-rank cpu (s) "
      "| exposed comm (s, % of step) | bytes sent / recv per rank (MiB) | unmasked pairs per rank | peak per rank (MiB) "
      "| peak vs 1 rank | efficiency wall / cpu | load (1-min, before/after) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    pr = r["per_rank"]
    fwd = max(x["forward_s"] for x in pr)
    bwd = max(x["backward_s"] for x in pr)
    cpu = max(x["cpu_s"] for x in pr)
    sent = max(x["bytes_sent"] for x in pr) / MiB
    recv = max(x["bytes_received"] for x in pr) / MiB
    pairs = max(x["unmasked_pairs"] for x in pr)
    peak = max(x["peak_bytes"] for x in pr)
    note = ""
    if "single_rank" in r:
        s = r["single_rank"]
        one_wall, one_cpu, one_peak = s["forward_s"] + s["backward_s"], s["cpu_s"], s["peak_bytes"]
    else:
        one_wall, one_cpu, one_peak = single[r["seq"]]
        note = " *"
    n = r["ranks"]
    eff_w = one_wall / (n * r["step_s"])
    eff_c = one_cpu / (n * cpu)
    name = r["strategy"] + (" zigzag" if r["strategy"] == "ring" else "")
    if r["strategy"] == "ring" or r["strategy"].startswith("usp"):
        name += f", chunk {r['ring_chunk_tokens']}"
    rep = f" (best of {r['repeat']})" if r.get("repeat", 1) > 1 else ""
    print(f"| {name}{rep} | {n} | {r['seq']} | {one_wall:.2f} / {one_cpu:.2f}{note} | {fwd:.2f} / {bwd:.2f} | {cpu:.2f} "
          f"| {r['exposed_comm_s']:.3f} ({100 * r['exposed_fraction']:.1f}%) | {sent:.1f} / {recv:.1f} | {pairs:.3g} "
          f"| {peak / MiB:.1f} | {peak / one_peak:.3f} | {eff_w:.3f} / {eff_c:.3f} | {r['_load']} |")
