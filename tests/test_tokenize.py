#!/usr/bin/python3
"""scripts/tokenize_text.py end to end (ctest test_tokenize; exit 77 = skipped).

  tests/test_tokenize.py SOURCE_DIR LONGCTX_BINARY

Trains a byte-level BPE tokenizer (vocab 768) on five books of the KJV with
the same library, tokenizes them (a directory and JSON lines), reads the
binary file back here (its own reader, not the engine's) and checks: the
header, documents ending with the EOS, ids decoding back to each book exactly,
text streamed in small pieces giving the ids of the whole text, the EOS taken
from a post-processor template, errors for a tokenizer without an EOS and an
unknown --eos. Then trains longctx 100 steps on the file (dataset_type:
binary): the first loss is near ln(vocab), the mean of the last 10 at least
2 nats below it. Skips (exit 77, with the reason) when the tokenizers package
cannot be installed or bible-kjv (the corpus) is missing.
"""
import importlib.util
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77
root, binary = os.path.abspath(sys.argv[1]), sys.argv[2]
spec = importlib.util.spec_from_file_location("longctx_tokenize", os.path.join(root, "scripts", "tokenize_text.py"))
tokenize_py = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tokenize_py)
try:
    tokenize_py.rerun_with_tokenizers(__file__)
except tokenize_py.Fail as e:
    print(f"SKIP: {e}: the tokenizers package from PyPI is needed")
    sys.exit(SKIP)

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402

VOCAB = 768
BOOKS = ["08_Ruth.txt", "31_Obad.txt", "32_Jonah.txt", "57_Phmn.txt", "65_Jude.txt"]
failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def read_token_file(path):
    """(vocab, eos, ids) of a token file, by the layout in src/train/token_file.h."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, vocab, eos, reserved, n = struct.unpack("<8sIIIIQ", data[:32])
    assert magic == b"LCTXTOK1" and version == 1 and reserved == 0, (magic, version, reserved)
    assert len(data) == 32 + 4 * n, f"{path}: {len(data)} bytes for {n} ids"
    return vocab, eos, list(struct.unpack(f"<{n}I", data[32:]))


def split_documents(ids, eos):
    docs, start = [], 0
    for i, t in enumerate(ids):
        if t == eos:
            docs.append(ids[start:i + 1])
            start = i + 1
    assert start == len(ids), "the file does not end with the EOS"
    return docs


def run_tokenize(*args, expect_ok=True):
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "tokenize_text.py"), *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if expect_ok and r.returncode != 0:
        sys.exit(f"tokenize_text.py failed:\n{r.stderr}")
    return r


def save_tokenizer(tok, path):
    tok.save(path)
    return path


def main(tmp):
    kjv = os.path.join(tmp, "kjv")
    prepared = subprocess.run([os.path.join(root, "scripts", "prepare_corpus.sh"), kjv],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if prepared.returncode != 0:
        print(f"SKIP: the corpus cannot be made (apt-get install bible-kjv): {prepared.stderr.strip()}")
        return SKIP
    books = os.path.join(tmp, "books")
    os.makedirs(books)
    for b in BOOKS:
        shutil.copy(os.path.join(kjv, b), books)
    texts = []
    for b in BOOKS:
        with open(os.path.join(books, b), encoding="utf-8", newline="") as f:
            texts.append(f.read())

    # A byte-level BPE trained on the books themselves.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([os.path.join(books, b) for b in BOOKS],
              trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    plain = save_tokenizer(tok, os.path.join(tmp, "bpe.json"))
    eos = tok.token_to_id("<|endoftext|>")

    out = os.path.join(tmp, "books.bin")
    r = run_tokenize("--tokenizer", plain, "-o", out, books)
    check("tok/s" in r.stderr and "100.0%" in r.stderr, "progress with tokens/s on stderr")
    vocab, file_eos, ids = read_token_file(out)
    check(vocab == tok.get_vocab_size() and file_eos == eos, f"header: vocab {vocab}, EOS {file_eos} (named)")
    docs = split_documents(ids, eos)
    check(len(docs) == len(BOOKS), f"{len(docs)} documents for {len(BOOKS)} books, each ending with the EOS")
    check(all(tok.decode(d) == t for d, t in zip(docs, texts)), "every book decodes back exactly (round trip)")
    check(all(d[:-1] == tok.encode(t).ids for d, t in zip(docs, texts)), "ids are those of the whole text")

    # JSON lines: the same documents.
    jsonl = os.path.join(tmp, "books.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "id": 0}) + "\n")
    run_tokenize("--tokenizer", plain, "-o", os.path.join(tmp, "jsonl.bin"), jsonl)
    check(read_token_file(os.path.join(tmp, "jsonl.bin"))[2] == ids, "JSON lines input gives the same file")

    # Streaming: pieces of ~4 KiB (cut before lines that start with a non-space) give the same ids.
    tokenize_py.PIECE_BYTES, tokenize_py.BATCH_BYTES = 4096, 16384
    args = type("Args", (), dict(tokenizer=plain, output=os.path.join(tmp, "pieces.bin"), eos=None, separator="",
                                 inputs=[books]))
    tokenize_py.tokenize(args)
    check(read_token_file(args.output)[2] == ids, "text streamed in 4 KiB pieces gives the same ids")

    # EOS from the post-processor's template (BOS before, EOS after each document).
    tok.add_special_tokens(["<s>", "</doc>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </doc>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</doc>", tok.token_to_id("</doc>"))])
    templated = save_tokenizer(tok, os.path.join(tmp, "templated.json"))
    run_tokenize("--tokenizer", templated, "-o", os.path.join(tmp, "t.bin"), books)
    _, t_eos, t_ids = read_token_file(os.path.join(tmp, "t.bin"))
    t_docs = split_documents(t_ids, t_eos)
    check(t_eos == tok.token_to_id("</doc>") and all(d[0] == tok.token_to_id("<s>") for d in t_docs) and
          len(t_docs) == len(BOOKS), "EOS from the post-processor template; BOS starts every document")

    # No EOS to be found, and an unknown --eos: errors naming the cause, no file left behind.
    bare = Tokenizer(models.BPE())
    bare.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bare.train([os.path.join(books, BOOKS[0])], trainers.BpeTrainer(vocab_size=300, show_progress=False))
    bare_path = save_tokenizer(bare, os.path.join(tmp, "bare.json"))
    r = run_tokenize("--tokenizer", bare_path, "-o", os.path.join(tmp, "x.bin"), books, expect_ok=False)
    check(r.returncode != 0 and "name it with --eos" in r.stderr and not os.path.exists(os.path.join(tmp, "x.bin")),
          "a tokenizer without an EOS is an error: " + r.stderr.strip())
    r = run_tokenize("--tokenizer", plain, "--eos", "<nope>", "-o", os.path.join(tmp, "x.bin"), books,
                     expect_ok=False)
    check(r.returncode != 0 and "no token '<nope>' (--eos)" in r.stderr, "an unknown --eos: " + r.stderr.strip())

    # A script run from scripts/ (plot.py) that imports the standard tokenize gets the standard one.
    r = subprocess.run([sys.executable, "-c", "import tokenize; print(tokenize.open.__name__)"],
                       cwd=os.path.join(root, "scripts"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(r.returncode == 0 and r.stdout.strip() == "open", "import tokenize from scripts/: the standard one (no script there may shadow it)")

    # longctx learns from the file: the loss falls from ln(vocab).
    metrics = os.path.join(tmp, "metrics.jsonl")
    train = subprocess.run(
        [binary, "train", os.path.join(root, "configs", "base.yml"), "model_name=tiny", f"vocab_size={VOCAB}",
         "dataset_type=binary", f"dataset_path={out}", "max_target_length=256", "per_device_batch_size=4",
         "steps=100", "learning_rate=0.01", "enable_checkpointing=false", f"metrics_file={metrics}",
         "peak_tflops_per_device=1", "num_threads=1", f"base_output_directory={tmp}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if train.returncode != 0:
        sys.exit(f"longctx train failed:\n{train.stdout}")
    with open(metrics) as f:
        losses = [json.loads(line)["loss"] for line in f]
    ln_v = math.log(VOCAB)
    check(abs(losses[0] - ln_v) < 0.1 * ln_v, f"first loss {losses[0]:.3f} is near ln({VOCAB}) = {ln_v:.3f}")
    last = sum(losses[-10:]) / 10
    check(last < ln_v - 2.0, f"mean loss of steps {len(losses) - 9}-{len(losses)} {last:.3f} < ln({VOCAB}) - 2")
    return 1 if failures else 0


with tempfile.TemporaryDirectory() as tmp:
    code = main(tmp)
if failures:
    print(f"{len(failures)} check(s) failed")
sys.exit(code)
