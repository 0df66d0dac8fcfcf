#!/usr/bin/env python3
"""Hands `longctx plan --emit FRAMEWORK --json` outputs to the framework's own
configuration code (the oracle of tests/frameworks/test_plan_frameworks.sh).

  validate.py PLAN.json...          every plan, each framework in its own
                                    subprocesses (one per framework and device
                                    count: MaxText's fake CPU devices are fixed
                                    at import); exit 1 if any plan fails

A plan passes when the framework accepts it and, from the framework's own
parsed config, (1) the tokens per device equal the plan's (the batch in the
framework's units), (2) the model is the plan's (layers, width, heads, KV
heads, head dim, MLP width, vocabulary), (3) the context-parallel degree and
kind are the plan's, (4) MaxText's custom remat names only tensors the model
tags, (5) Megatron's all-to-all divides the KV heads and its window is the
plan's.

What each framework's check needs on a CPU-only machine (shims, said here and
nowhere else):
  MaxText 0.2.5: JAX on CPU with as many fake host devices as the plan
    (XLA_FLAGS=--xla_force_host_platform_device_count), the mesh built by its
    get_mesh_from_config; skip_jax_distributed_system=True (on GPU and TPU
    it would join a JAX coordinator); `unittest` imported so that
    pyconfig raises instead of sys.exit(2).
  Megatron-Core 0.19.2: WORLD_SIZE=devices; arguments.get_device_arch_version
    returns 9 (Hopper: validate_args asks the GPU); --no-rope-fusion (no
    TransformerEngine here); the data/optimizer flags a run adds
    (--tokenizer-type NullTokenizer --lr --train-iters). Its cp_comm_type is
    free text there: the value is checked against the ones its TransformerConfig
    documents (TransformerEngine refuses others when the run starts).
  TorchTitan 0.3.0: ConfigManager.parse_args, then ParallelDims.from_config
    for the world size (the product check needs no process group).
"""
import contextlib
import io
import json
import os
import subprocess
import sys
import time


def tokens_per_device(plan):
    rec = plan["recommendation"]
    slices = plan["devices"] // (rec["cp"] * rec["tp"])
    return plan["per_device_batch_size"] * plan["max_target_length"] * slices / plan["devices"]


def expect(errors, what, got, want):
    if got != want:
        errors.append(f"{what}: the framework has {got!r}, the plan {want!r}")


# ---- MaxText ------------------------------------------------------------------

def check_maxtext(plan):
    import yaml
    from maxtext.configs import pyconfig
    from maxtext.utils import maxtext_utils
    from maxtext.utils.globals import MAXTEXT_CONFIGS_DIR
    settings = yaml.safe_load(plan["emit"])
    settings["skip_jax_distributed_system"] = True  # one CPU process: no coordinator to join
    cfg = pyconfig.initialize(["", os.path.join(MAXTEXT_CONFIGS_DIR, "base.yml")], **settings)
    mesh = maxtext_utils.get_mesh_from_config(cfg)
    errors = []
    devices = plan["devices"]
    expect(errors, "devices in the mesh", mesh.devices.size, devices)
    expect(errors, "tokens per device", cfg.global_batch_size_to_train_on * cfg.max_target_length / devices,
           tokens_per_device(plan))
    m = plan["model"]
    for ours, theirs in [("d_model", "emb_dim"), ("num_layers", "num_decoder_layers"), ("num_heads", "num_query_heads"),
                         ("num_kv_heads", "num_kv_heads"), ("head_dim", "head_dim"), ("mlp_dim", "mlp_dim"),
                         ("vocab_size", "vocab_size")]:
        expect(errors, theirs, getattr(cfg, theirs), m[ours])
    # The custom policy's tensors must be ones this model tags, or MaxText
    # recomputes them silently: the names a dense Llama layer tags, from
    # MaxText's layers/attentions.py, layers/linears.py, attention_op.py and
    # models/llama2.py (checkpoint_name calls).
    if cfg.remat_policy == "custom":
        tagged = {"decoder_layer_input", "context", "attention_out", "out_proj", "mlpwo"}
        tagged |= {"qkv_proj"} if cfg.fused_qkv else {"query_proj", "key_proj", "value_proj"}
        acts = len(cfg.mlp_activations)
        tagged |= {"mlpwi"} if cfg.fused_mlp or acts == 1 else {f"mlpwi_{i}" for i in range(acts)}
        untagged = sorted((set(cfg.tensors_on_device or []) | set(cfg.tensors_to_offload or [])) - tagged)
        if untagged:
            errors.append(f"remat_policy 'custom' saves or offloads {untagged}, which this model never tags: "
                          "MaxText would recompute them")
    rec = plan["recommendation"]
    shape = dict(mesh.shape)
    expect(errors, "context ranks (context x context_usp_ulysses)",
           shape.get("context", 1) * shape.get("context_usp_ulysses", 1), rec["cp"])
    expect(errors, "tensor ranks", shape.get("tensor", 1), rec["tp"])
    if rec["cp"] > 1:
        expect(errors, "context_parallel_strategy", cfg.context_parallel_strategy, rec["strategy"])
    return errors


# ---- Megatron-Core --------------------------------------------------------------

def megatron_comm_types():
    """The cp_comm_type values Megatron-Core's TransformerConfig documents, read from its source
    (the flag is free text; TransformerEngine, not installed here, refuses other names at run time)."""
    import re
    import megatron.core.transformer.transformer_config as tc
    source = open(tc.__file__).read()
    doc = re.search(r"cp_comm_type of each layer can be ([^\n]*)", source).group(1)
    return set(re.findall(r'"([^"]+)"', doc))


def check_megatron(plan):
    from megatron.training import arguments
    env, flags = {}, []
    for line in plan["emit"].splitlines():
        if line.startswith("export "):
            key, value = line[len("export "):].split("=", 1)
            env[key] = value
        elif line.startswith("--"):
            flags += line.split()
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(env)
    os.environ["WORLD_SIZE"] = str(plan["devices"])
    os.environ["RANK"] = "0"
    sys.argv = ["pretrain_gpt.py", *flags, "--no-rope-fusion", "--tokenizer-type", "NullTokenizer",
                "--lr", "1e-4", "--train-iters", "10"]
    arguments.get_device_arch_version = lambda: 9
    args = arguments.parse_args()
    arguments.validate_args(args)
    cfg = arguments.core_transformer_config_from_args(args)
    errors = []
    expect(errors, "tokens per device", args.global_batch_size * args.seq_length / plan["devices"],
           tokens_per_device(plan))
    m = plan["model"]
    for ours, theirs in [("d_model", "hidden_size"), ("num_layers", "num_layers"), ("num_heads", "num_attention_heads"),
                         ("num_kv_heads", "num_query_groups"), ("head_dim", "kv_channels"),
                         ("mlp_dim", "ffn_hidden_size")]:
        expect(errors, theirs, getattr(cfg, theirs), m[ours])
    expect(errors, "vocab_size", args.vocab_size, m["vocab_size"])
    rec = plan["recommendation"]
    expect(errors, "context_parallel_size", cfg.context_parallel_size, rec["cp"])
    expect(errors, "tensor_model_parallel_size", cfg.tensor_model_parallel_size, rec["tp"])
    if rec["cp"] > 1:
        comm = cfg.cp_comm_type if isinstance(cfg.cp_comm_type, str) else cfg.cp_comm_type[0]
        known = megatron_comm_types()
        if comm not in known:
            errors.append(f"cp_comm_type {comm!r} is none of the values Megatron-Core documents: {sorted(known)}")
        # The all-to-all splits each tp rank's KV heads (TransformerEngine refuses the rest at run time).
        a2a = {"a2a": cfg.context_parallel_size, "a2a+p2p": (args.hierarchical_context_parallel_sizes or [1])[0]}.get(comm, 1)
        kv = cfg.num_query_groups // cfg.tensor_model_parallel_size
        if a2a > 1 and kv % a2a:
            errors.append(f"the all-to-all degree {a2a} does not divide the {kv} KV heads per tp rank")
    # A sliding window of W tokens (the query and W - 1 before it) is Megatron's window (W - 1, 0).
    window = plan["sliding_window_size"] if plan["attention_type"] == "local" else 0
    expect(errors, "window_size", tuple(args.window_size) if args.window_size else None,
           (window - 1, 0) if window else None)
    return errors


# ---- TorchTitan -------------------------------------------------------------------

def check_torchtitan(plan):
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    argv = []
    for line in plan["emit"].splitlines():
        if line.startswith("--"):
            argv += line.split(" ", 1)
        elif line and not line.startswith("#"):
            argv.append(line)  # a subcommand (activation-checkpoint:full)
    cfg = ConfigManager().parse_args(argv)
    dims = ParallelDims.from_config(cfg.parallelism, plan["devices"])
    errors = []
    t = cfg.training
    expect(errors, "tokens per device", t.global_batch_size * t.seq_len / plan["devices"], tokens_per_device(plan))
    rec = plan["recommendation"]
    expect(errors, "context_parallel_degree", dims.cp, rec["cp"])
    expect(errors, "tensor_parallel_degree", dims.tp, rec["tp"])
    return errors


CHECKS = {"maxtext": check_maxtext, "megatron": check_megatron, "torchtitan": check_torchtitan}


def run_group(framework, paths):
    """In this process: one framework, plans of one device count. Prints one JSON line per plan."""
    import unittest  # noqa: F401  (MaxText's pyconfig raises instead of exiting under a test runner)
    for path in paths:
        plan = json.load(open(path))
        said = io.StringIO()  # argparse and tyro say why on stderr, then exit
        try:
            with contextlib.redirect_stderr(said):
                errors = CHECKS[framework](plan)
        except BaseException as e:  # SystemExit from argparse/tyro too
            errors = [f"{type(e).__name__}: {e}", *said.getvalue().strip().splitlines()[-6:]]
        print(json.dumps({"path": path, "errors": errors}), flush=True)


def main():
    if sys.argv[1] == "--group":
        run_group(sys.argv[2], sys.argv[3:])
        return 0
    # MaxText's fake devices are fixed when JAX starts: a process per device
    # count; the others take the world size per plan.
    groups = {}
    for path in sys.argv[1:]:
        plan = json.load(open(path))
        devices = plan["devices"] if plan["framework"] == "maxtext" else 0
        groups.setdefault((plan["framework"], devices), []).append(path)
    failed = 0
    for (framework, devices), paths in sorted(groups.items()):
        env = dict(os.environ, JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={max(devices, 1)}")
        started = time.monotonic()
        out = subprocess.run([sys.executable, __file__, "--group", framework, *paths], env=env,
                             capture_output=True, text=True)
        print(f"{framework}: {len(paths)} plans checked in {time.monotonic() - started:.0f} s", flush=True)
        results = {}
        for line in out.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                results[r["path"]] = r["errors"]
        for path in paths:
            errors = results.get(path)
            if errors is None:
                errors = [f"the {framework} check crashed (exit {out.returncode}): {out.stderr[-2000:]}"]
            name = os.path.basename(path)
            if errors:
                failed += 1
                print(f"FAIL {framework} {name}:")
                for e in errors:
                    print(f"    {e.strip()[-1500:]}")
            else:
                print(f"ok   {framework} {name}")
    print(f"validate.py: {failed} of {len(sys.argv) - 1} plans refused by their framework")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
