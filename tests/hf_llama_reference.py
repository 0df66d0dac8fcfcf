#!/usr/bin/env python3
"""An independent reference for longctx checkpoints: Hugging Face's Llama, in numpy.

    python3 tests/hf_llama_reference.py <checkpoint dir> <tokens file> [--token-losses]

Reads <checkpoint dir>/model.safetensors and <checkpoint dir>/config.json the
way transformers' LlamaForCausalLM would (the public safetensors format and
the LlamaConfig keys), runs the forward pass of transformers'
modeling_llama.py in float64 on the tokens (positions 0..S-1, causal, one
sequence) and prints the mean next-token cross-entropy (labels = the tokens,
shifted by one, as in LlamaForCausalLM(input_ids, labels=input_ids)):

    hf_reference_loss <value>     (nats, %.17g)
    hf_reference_tokens <S - 1>   (predictions averaged)
    hf_reference_token_losses <l_0> ... <l_{S-2}>   (with --token-losses: the
                                  loss of each prediction, position 0 first)

The tokens file holds decimal token ids separated by whitespace.

This file is the reference: it imports nothing from longctx and shares no
code with it; everything below follows the public definitions (safetensors'
README, transformers' LlamaConfig / modeling_llama.py / modeling_rope_utils.py).
A checkpoint whose tensor names, shapes or dtypes do not match what
config.json implies is rejected (exit status 1, message on stderr), as
transformers would refuse or warn about it.

Needs python3 and numpy only (Debian: python3-numpy).
"""
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # pragma: no cover
    sys.stderr.write("hf_llama_reference: numpy is missing (Debian: apt-get install python3-numpy)\n")
    sys.exit(2)


class Rejected(Exception):
    """The checkpoint is not a Llama checkpoint that transformers would load as is."""


# ---- safetensors ---------------------------------------------------------------
# Layout: u64 little-endian N; N bytes of UTF-8 JSON {name: {"dtype", "shape",
# "data_offsets": [begin, end]}, optional "__metadata__": {str: str}}; then the
# byte buffer, offsets relative to its start, tensors row-major, little-endian.

_DTYPES = {"F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": (None, 2)}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Rejected(f"{path}: {len(blob)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        raise Rejected(f"{path}: header length {n} runs past the end of the file ({len(blob)} bytes)")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Rejected(f"{path}: header is not UTF-8 JSON: {e}")
    if not isinstance(header, dict):
        raise Rejected(f"{path}: header is not a JSON object")
    data = memoryview(blob)[8 + n:]
    tensors = {}
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise Rejected(f"{path}: tensor '{name}' lacks dtype/shape/data_offsets")
        if dtype not in _DTYPES:
            raise Rejected(f"{path}: tensor '{name}' has dtype {dtype}, not a float type this reference reads")
        if any((not isinstance(d, int)) or d < 0 for d in shape):
            raise Rejected(f"{path}: tensor '{name}' has shape {shape}")
        np_dtype, size = _DTYPES[dtype]
        count = math.prod(shape)
        if not (0 <= begin <= end <= len(data)) or end - begin != count * size:
            raise Rejected(f"{path}: tensor '{name}' data_offsets [{begin}, {end}] do not hold "
                           f"{count} x {dtype} inside a {len(data)}-byte buffer")
        raw = data[begin:end]
        if dtype == "BF16":  # the high half of an IEEE float32
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np_dtype)
        tensors[name] = arr.astype(np.float64).reshape(shape)
        spans.append((begin, end, name))
    # The format forbids holes and overlaps: the buffer is exactly the tensors.
    spans.sort()
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            raise Rejected(f"{path}: tensor '{name}' starts at {begin}, expected {pos} (hole or overlap)")
        pos = end
    if pos != len(data):
        raise Rejected(f"{path}: {len(data) - pos} trailing bytes after the last tensor")
    return tensors


# ---- config.json (transformers' LlamaConfig and its defaults) ---------------------

def read_config(path):
    with open(path) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "llama":
        raise Rejected(f"{path}: model_type is {cfg.get('model_type')!r}, not 'llama'")
    if "LlamaForCausalLM" not in cfg.get("architectures", ["LlamaForCausalLM"]):
        raise Rejected(f"{path}: architectures {cfg.get('architectures')} lack LlamaForCausalLM")
    c = {}
    try:
        c["vocab_size"] = int(cfg["vocab_size"])
        c["hidden_size"] = int(cfg["hidden_size"])
        c["intermediate_size"] = int(cfg["intermediate_size"])
        c["num_hidden_layers"] = int(cfg["num_hidden_layers"])
        c["num_attention_heads"] = int(cfg["num_attention_heads"])
    except KeyError as e:
        raise Rejected(f"{path}: missing {e}")
    nkv = cfg.get("num_key_value_heads")
    c["num_key_value_heads"] = int(nkv) if nkv is not None else c["num_attention_heads"]
    hd = cfg.get("head_dim")
    c["head_dim"] = int(hd) if hd is not None else c["hidden_size"] // c["num_attention_heads"]
    c["rms_norm_eps"] = float(cfg.get("rms_norm_eps", 1e-6))
    c["rope_theta"] = float(cfg.get("rope_theta", 10000.0))
    c["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    c["rope_scaling"] = cfg.get("rope_scaling")
    if cfg.get("hidden_act", "silu") != "silu":
        raise Rejected(f"{path}: hidden_act {cfg.get('hidden_act')!r}; Llama uses silu")
    if cfg.get("attention_bias", False) or cfg.get("mlp_bias", False):
        raise Rejected(f"{path}: attention_bias/mlp_bias set; this reference (and longctx) has no biases")
    if cfg.get("pretraining_tp", 1) != 1:
        raise Rejected(f"{path}: pretraining_tp {cfg.get('pretraining_tp')} is not 1")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise Rejected(f"{path}: partial_rotary_factor {cfg.get('partial_rotary_factor')} is not 1")
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim"):
        if c[k] < 1:
            raise Rejected(f"{path}: {k} = {c[k]}")
    if c["num_attention_heads"] % c["num_key_value_heads"]:
        raise Rejected(f"{path}: num_attention_heads {c['num_attention_heads']} is not a multiple of "
                       f"num_key_value_heads {c['num_key_value_heads']}")
    if c["head_dim"] % 2:
        raise Rejected(f"{path}: head_dim {c['head_dim']} is odd; rotate_half needs it even")
    rs = c["rope_scaling"]
    if rs is not None:
        kind = rs.get("rope_type", rs.get("type"))
        if kind not in ("llama3", "default"):
            raise Rejected(f"{path}: rope_scaling type {kind!r}; this reference implements default and llama3")
        if kind == "llama3":
            for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                if k not in rs:
                    raise Rejected(f"{path}: llama3 rope_scaling lacks {k}")
        else:
            c["rope_scaling"] = None
    return c


def expected_shapes(c):
    """The state dict LlamaForCausalLM(config) has: name -> shape ([out, in] for Linear)."""
    d, v, f = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    q = c["num_attention_heads"] * c["head_dim"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    s = {"model.embed_tokens.weight": [v, d], "model.norm.weight": [d]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = [d]
        s[p + "self_attn.q_proj.weight"] = [q, d]
        s[p + "self_attn.k_proj.weight"] = [kv, d]
        s[p + "self_attn.v_proj.weight"] = [kv, d]
        s[p + "self_attn.o_proj.weight"] = [d, q]
        s[p + "post_attention_layernorm.weight"] = [d]
        s[p + "mlp.gate_proj.weight"] = [f, d]
        s[p + "mlp.up_proj.weight"] = [f, d]
        s[p + "mlp.down_proj.weight"] = [d, f]
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = [v, d]
    return s


def check_weights(c, w):
    want = expected_shapes(c)
    problems = []
    for name, shape in want.items():
        if name not in w:
            problems.append(f"missing tensor {name} (shape {shape})")
        elif list(w[name].shape) != shape:
            problems.append(f"{name}: shape {list(w[name].shape)} in the file, {shape} from config.json")
    for name in sorted(set(w) - set(want)):
        problems.append(f"unexpected tensor {name} (shape {list(w[name].shape)})"
                        + (" with tie_word_embeddings=true" if name == "lm_head.weight" else ""))
    if problems:
        raise Rejected("checkpoint does not match config.json:\n  " + "\n  ".join(problems))


# ---- the forward pass of modeling_llama.py ------------------------------------------

def rope_inv_freq(c):
    """_compute_default_rope_parameters, then _compute_llama3_parameters if configured."""
    dim = c["head_dim"]
    inv_freq = 1.0 / (c["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float64) / dim))
    rs = c["rope_scaling"]
    if rs is None:
        return inv_freq
    factor = float(rs["factor"])
    low_freq_factor = float(rs["low_freq_factor"])
    high_freq_factor = float(rs["high_freq_factor"])
    old_context_len = float(rs["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rms_norm(x, weight, eps):  # LlamaRMSNorm
    variance = np.mean(x * x, axis=-1, keepdims=True)
    return weight * (x / np.sqrt(variance + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward_logits(c, w, ids):
    S = len(ids)
    H, G, D = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    n_rep = H // G
    eps = c["rms_norm_eps"]

    # LlamaRotaryEmbedding: freqs = positions x inv_freq, emb = cat(freqs, freqs).
    positions = np.arange(S, dtype=np.float64)
    freqs = positions[:, None] * rope_inv_freq(c)[None, :]    # [S, D/2]
    emb = np.concatenate([freqs, freqs], axis=-1)              # [S, D]
    cos, sin = np.cos(emb), np.sin(emb)                        # attention_scaling is 1 (default, llama3)

    causal = np.triu(np.ones((S, S), dtype=bool), k=1)        # True above the diagonal: masked
    scaling = D ** -0.5

    x = w["model.embed_tokens.weight"][ids]                    # [S, d]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        # LlamaAttention
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(S, H, D).transpose(1, 0, 2)  # [H, S, D]
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(S, G, D).transpose(1, 0, 2)  # [G, S, D]
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(S, G, D).transpose(1, 0, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = np.repeat(k, n_rep, axis=0)                        # repeat_kv: head j uses KV head j // n_rep
        v = np.repeat(v, n_rep, axis=0)
        scores = (q @ k.transpose(0, 2, 1)) * scaling          # [H, S, S]
        scores = np.where(causal[None], -np.inf, scores)
        scores = scores - scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        ctx = (probs @ v).transpose(1, 0, 2).reshape(S, H * D)
        x = x + ctx @ w[p + "self_attn.o_proj.weight"].T
        # LlamaMLP
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c["tie_word_embeddings"] else w["lm_head.weight"]
    return x @ head.T                                          # [S, vocab]


def token_losses(logits, ids):
    """Each prediction's cross-entropy (ForCausalLMLoss averages them): logits[:-1] predict ids[1:]."""
    z = logits[:-1]
    targets = np.asarray(ids[1:])
    m = z.max(axis=-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=-1, keepdims=True)))[:, 0]
    return lse - z[np.arange(len(targets)), targets]


def read_tokens(path, vocab):
    with open(path) as f:
        text = f.read().split()
    try:
        ids = [int(t) for t in text]
    except ValueError as e:
        raise Rejected(f"{path}: not whitespace-separated integers: {e}")
    if len(ids) < 2:
        raise Rejected(f"{path}: {len(ids)} tokens; need at least 2 for one next-token prediction")
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise Rejected(f"{path}: token {bad[0]} outside [0, vocab_size={vocab})")
    return np.asarray(ids, dtype=np.int64)


def main(argv):
    per_token = "--token-losses" in argv[3:]
    if len(argv) != 3 + per_token:
        sys.stderr.write(__doc__)
        return 2
    ckpt, tokens_path = argv[1], argv[2]
    try:
        c = read_config(os.path.join(ckpt, "config.json"))
        w = read_safetensors(os.path.join(ckpt, "model.safetensors"))
        check_weights(c, w)
        ids = read_tokens(tokens_path, c["vocab_size"])
        logits = forward_logits(c, w, ids)
        losses = token_losses(logits, ids)
        loss = float(np.mean(losses))
    except (Rejected, OSError, ValueError, TypeError, KeyError) as e:
        sys.stderr.write(f"hf_llama_reference: rejected: {e}\n")
        return 1
    if not math.isfinite(loss):
        sys.stderr.write(f"hf_llama_reference: loss is {loss}\n")
        return 1
    print(f"hf_reference_loss {loss:.17g}")
    print(f"hf_reference_tokens {len(ids) - 1}")
    if per_token:
        print("hf_reference_token_losses " + " ".join(f"{x:.17g}" for x in losses))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
