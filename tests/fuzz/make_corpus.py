#!/usr/bin/env python3
"""Writes the fuzz seed corpora in tests/fuzz/corpus/<target>/: a few valid
inputs and a few broken ones per target (the formats of fuzz_*.cpp)."""
import json, os, struct, zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEP = b"\n#~~\n"


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


# ---- config: recipe [#~~ base.yml [#~~ model/m.yml]]
base, demo, model = read("configs/base.yml"), read("configs/demo.yml"), read("configs/model/tiny.yml")
put("config", "valid_demo", demo.replace(b'model_name: "demo"', b'model_name: "m"') + SEP + base + SEP + model)
put("config", "valid_plain", "steps: 3\ndataset_type: synthetic\nmax_target_length: 64\n")
put("config", "valid_usp", "base_config: base.yml\ncontext_parallel_strategy: usp\nici_context_parallelism: 4\n"
    "ici_context_usp_ulysses_parallelism: 2\nici_data_parallelism: 2\nmax_target_length: 64\n"
    "dataset_type: synthetic\nsteps: 1\n#~~\nlearning_rate: 0.5\n")
put("config", "valid_overrides", "steps: 3\ndataset_type: synthetic\n#~~\n\n#~~\n\n#~~\n"
    "max_target_length=64\nici_context_parallelism=4\ncontext_parallel_strategy=ulysses\nrun_name=x")
put("config", "broken_override", "steps: 3\n#~~\n\n#~~\n\n#~~\nsteps\nnum_threads=[1]\ndevice_memory_budget=1e300GiB")
put("config", "broken_unclosed_quote", 'run_name: "abc\nsteps: 3\n')
put("config", "broken_duplicate_key", "steps: 3\nsteps: 4\n")
put("config", "broken_base_list", "base_config: [a, b]\n")
put("config", "broken_base_dir", "base_config: model\n#~~\nsteps: 1\n#~~\nhead_dim: 8\n")
put("config", "broken_mesh_overflow", "ici_data_parallelism: 4611686018427387904\nici_context_parallelism: 4\n"
    "dataset_type: synthetic\nsteps: 1\n")
put("config", "broken_not_map", "- a\n- b\n")
put("config", "broken_cycle", "base_config: base.yml\n#~~\nbase_config: base.yml\n")


# ---- safetensors / checkpoint
def safetensors(tensors, overlap=False):
    header, off, data = {"__metadata__": {"format": "pt"}}, 0, b""
    for name, shape, values in tensors:
        n = 4 * len(values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [0 if overlap else off, (0 if overlap else off) + n]}
        off += n
        data += struct.pack("<%df" % len(values), *values)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


w = [("model.embed_tokens.weight", [2, 2], [1, 2, 3, 4]), ("model.norm.weight", [2], [1, 1])]
m = [(n + s, sh, v) for n, sh, v in w for s in (".exp_avg", ".exp_avg_sq")]
hf = json.dumps({"model_type": "llama", "vocab_size": 2, "hidden_size": 2}).encode()


def state(step):
    return json.dumps({"step": step, "data_cursor": 3, "init_weights_seed": 1, "optimizer_step": step}).encode()


files = [safetensors(w), hf, safetensors(m), state(4), b"steps: 4\n"]
put("checkpoint", "mode0_valid", b"\x00" + safetensors(w))
put("checkpoint", "mode0_overlap", b"\x00" + safetensors(w, overlap=True))
put("checkpoint", "mode0_huge_shape", b"\x00" + safetensors([("a", [2**31, 2**31], [1, 2])]))
put("checkpoint", "mode1_valid_step4", bytes([3 * 4 + 1]) + SEP.join(files))
put("checkpoint", "mode1_step_mismatch", bytes([3 * 5 + 1]) + SEP.join(files))
put("checkpoint", "mode1_bad_state", bytes([1]) + SEP.join(files[:3] + [b"[1]"] + files[4:]))
manifest = {"format": "longctx-checkpoint-1", "step": 4, "files": {
    n: {"bytes": len(b), "crc32": zlib.crc32(b)} for n, b in zip(
        ["model.safetensors", "config.json", "optimizer.safetensors", "train_state.json", "run_config.yml"], files)}}
put("checkpoint", "mode2_valid", bytes([2]) + SEP.join(files + [json.dumps(manifest).encode()]))
manifest["files"]["config.json"]["crc32"] = "x"
put("checkpoint", "mode2_bad_types", bytes([2]) + SEP.join(files + [json.dumps(manifest).encode()]))

# mode 3 (first byte 255): model.safetensors.index.json, then shards model-1.safetensors, ...
def bf16(tensors):
    blob = safetensors(tensors)
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data, out, off = blob[8 + n:], b"", 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        half = b"".join(data[i + 2:i + 4] for i in range(b, e, 4))  # the high halves: bf16
        info.update(dtype="BF16", data_offsets=[off, off + len(half)])
        out, off = out + half, off + len(half)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + out


index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-1.safetensors",
                                        "model.norm.weight": "model-2.safetensors"}}
put("checkpoint", "mode3_valid_index", b"\xff" + SEP.join([json.dumps(index).encode(), bf16(w[:1]), safetensors(w[1:])]))
index["weight_map"]["model.norm.weight"] = "../model-2.safetensors"
put("checkpoint", "mode3_index_outside", b"\xff" + SEP.join([json.dumps(index).encode(), bf16(w[:1]), safetensors(w[1:])]))


# ---- token files
def tokens(ids, vocab=259, eos=257, n=None, magic=b"LCTXTOK1", version=1):
    n = len(ids) if n is None else n
    return magic + struct.pack("<IIIIQ", version, vocab, eos, 0, n) + struct.pack("<%dI" % len(ids), *ids)


put("token_file", "valid", tokens([256, 72, 105, 257, 256, 33, 257]))
put("token_file", "valid_small_vocab", tokens([1, 2, 3, 0, 5, 0], vocab=6, eos=0))
put("token_file", "broken_id_past_header_vocab", tokens([1, 7, 0], vocab=6, eos=0))
put("token_file", "broken_vocab_past_model", tokens([1, 2], vocab=300))
put("token_file", "broken_truncated", tokens([1, 2, 3], n=4))
put("token_file", "broken_magic", tokens([1], magic=b"LCTXTOK2"))
put("token_file", "broken_huge_vocab", tokens([5, 0], vocab=3 << 30, eos=0))

# ---- train_state.json
put("train_state", "valid", state(4))
put("train_state", "valid_zero", state(0))
put("train_state", "broken_negative", '{"step": -1, "data_cursor": 0, "init_weights_seed": 0, "optimizer_step": 0}')
put("train_state", "broken_float", '{"step": 4.5, "data_cursor": 0, "init_weights_seed": 0, "optimizer_step": 0}')
put("train_state", "broken_huge", '{"step": 18446744073709551615, "data_cursor": 0, "init_weights_seed": 0, "optimizer_step": 0}')
put("train_state", "broken_not_object", "[1, 2]")
put("train_state", "broken_missing", '{"step": 1}')
