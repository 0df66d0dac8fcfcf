#!/usr/bin/env python3
"""Hugging Face transformers itself as the oracle for longctx (run by tests/unit/test_hf_models.cpp
with the venv of scripts/python_env.sh hf torch transformers safetensors).

    hf_transformers_check.py make TOKENS S N UNTIED_DIR TIED_DIR
        Two tiny random Llamas built by transformers (GQA: 4 heads, 2 KV heads; untied and tied
        embeddings), each saved in bfloat16, sharded (model-0000k-of-0000n.safetensors +
        model.safetensors.index.json), then loaded back in float32 and scored as `loss` does.
    hf_transformers_check.py loss TOKENS S N DIR...
        For each DIR, the mean next-token loss transformers computes in float32 on N windows of
        S + 1 tokens of TOKENS (whitespace-separated ids), window k = ids[k S .. k S + S] (longctx's
        unpacked sequences): "hf_loss DIR <value>" (and "hf_model DIR <class>"). A DIR that
        AutoModelForCausalLM cannot load prints "hf_refused DIR <why>".
Torch's import takes seconds: one process does all of a test's work.
"""
import sys

import torch
import transformers


def make(out, tied):
    torch.manual_seed(7 + tied)
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=bool(tied),
                                   max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(cfg)
    # Weights large enough that every op moves the loss (the default init gives ~log(vocab)).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            elif "embed_tokens" in name or "lm_head" in name:
                p.copy_(torch.randn_like(p) * 3.0 / p.shape[1] ** 0.5)
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="60KB")


def loss(path, ids, S, N):
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except Exception as e:  # noqa: BLE001: any refusal is the answer
        print(f"hf_refused {path} {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return
    model.eval()
    total = 0.0
    with torch.no_grad():
        for k in range(N):
            window = torch.tensor([ids[k * S: k * S + S + 1]])
            logits = model(window[:, :-1]).logits.double()
            total += torch.nn.functional.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
    print(f"hf_model {path} {type(model).__name__}")
    print(f"hf_loss {path} {total / (N * S):.17g}")


def main(argv):
    if len(argv) < 6 or argv[1] not in ("make", "loss"):
        sys.stderr.write(__doc__)
        return 2
    ids = [int(t) for t in open(argv[2]).read().split()]
    S, N, dirs = int(argv[3]), int(argv[4]), argv[5:]
    if argv[1] == "make":
        for tied, d in enumerate(dirs[:2]):
            make(d, tied)
    for d in dirs:
        loss(d, ids, S, N)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
