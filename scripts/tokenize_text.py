#!/usr/bin/python3
"""Tokenizes text into a longctx binary token file with any Hugging Face tokenizer.json.

  scripts/tokenize_text.py --tokenizer tokenizer.json -o data/corpus.bin INPUT [INPUT ...]

INPUT is a text file (one document, or several split at --separator), a
directory (its regular files, sorted by name, hidden ones skipped, each read
as a text file) or a JSON lines file (*.jsonl / *.json: one document per line,
its "text" field). Inputs are read in the order given.

Every document becomes: the special tokens the tokenizer's post-processor puts
before a sequence (e.g. BOS), the text's ids, the ones it puts after, and the
EOS token if that did not already end it. The EOS is the last special token
of the post-processor's template, else the first special token named like an
EOS (</s>, <|endoftext|>, <|end_of_text|>, <eos>, ...), or the one --eos
names; none found is an error. Output: the format of src/train/token_file.h
(32-byte header with the vocab size = highest id + 1 and the EOS id, then
uint32 ids), written to OUTPUT.tmp and renamed into place when complete.

Large inputs are streamed: JSON lines a line at a time, text files in pieces
of about 1 MiB cut before a line that starts with a non-space character (for
byte-level BPE, whose pre-tokenizer never joins across such a point, the ids
are those of the whole text; a tokenizer that adds a prefix space to every
call, e.g. Metaspace with prepend_scheme "always", sees one per piece).
Progress (bytes read of the total, tokens/s) goes to stderr.

Runs itself in the virtual environment build/venv-tokenizers (made by
scripts/python_env.sh) when the tokenizers package is not importable.
"""
import os
import sys

import argparse
import json
import struct
import subprocess
import time
from array import array

TOKENIZERS_PACKAGE = "tokenizers==0.23.3"
MAGIC = b"LCTXTOK1"
PIECE_BYTES = 1 << 20  # text is encoded in pieces of about this many bytes
BATCH_BYTES = 8 << 20  # pieces encoded together (encode_batch runs them on all cores)
EOS_NAMES = ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]", "<|end|>"]


class Fail(Exception):
    pass


def tokenizers_python():
    """The python of build/venv-tokenizers, made (once) by scripts/python_env.sh; Fail when it cannot be."""
    env_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python_env.sh")
    made = subprocess.run([env_script, "tokenizers", TOKENIZERS_PACKAGE], stdout=subprocess.PIPE, text=True)
    if made.returncode != 0 or not made.stdout.strip():
        raise Fail(f"cannot make a virtual environment with {TOKENIZERS_PACKAGE} (see above)")
    return made.stdout.strip().splitlines()[-1]


def rerun_with_tokenizers(script):
    """Returns when the tokenizers package is importable; else runs `script` again in the environment."""
    try:
        import tokenizers  # noqa: F401
        return
    except ImportError:
        if os.environ.get("LONGCTX_TOKENIZERS_VENV"):
            raise Fail("the tokenizers package is missing even in its virtual environment")
    python = tokenizers_python()
    os.environ["LONGCTX_TOKENIZERS_VENV"] = "1"
    os.execv(python, [python, os.path.abspath(script)] + sys.argv[1:])


# ---- the tokenizer's special tokens ---------------------------------------------------

def template_specials(processor):
    """(before, after): special token names the post-processor puts around a single sequence."""
    if not processor:
        return [], []
    kind = processor.get("type")
    if kind == "Sequence":
        before, after = [], []
        for p in processor.get("processors", []):
            b, a = template_specials(p)
            before, after = before + b, after + a
        return before, after
    if kind == "TemplateProcessing":
        before, after, seen_text = [], [], False
        for piece in processor.get("single", []):
            if "Sequence" in piece:
                seen_text = True
            elif "SpecialToken" in piece:
                (after if seen_text else before).append(piece["SpecialToken"]["id"])
        return before, after
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [processor["cls"][0]], [processor["sep"][0]]
    return [], []


def special_ids(tok, spec, eos_name):
    """(before ids, after ids, eos id) for a tokenizer and its tokenizer.json."""
    before, after = template_specials(spec.get("post_processor"))

    def id_of(name, what):
        i = tok.token_to_id(name)
        if i is None:
            raise Fail(f"the tokenizer has no token '{name}' ({what})")
        return i

    what = "--eos" if eos_name else "EOS"
    if eos_name is None:
        specials = [t["content"] for t in spec.get("added_tokens", []) if t.get("special")]
        named = [n for n in EOS_NAMES if n in specials]
        if after:
            eos_name = after[-1]
        elif named:
            eos_name = named[0]
        else:
            raise Fail("cannot tell the tokenizer's EOS token: its post-processor adds none after a sequence and "
                       f"no special token is named like one ({', '.join(EOS_NAMES)}); name it with --eos")
    eos = id_of(eos_name, what)
    return ([id_of(n, "post-processor") for n in before], [id_of(n, "post-processor") for n in after], eos)


# ---- documents, as streams of text pieces -----------------------------------------------

def input_files(inputs):
    files = []
    for path in inputs:
        if os.path.isdir(path):
            names = sorted(n for n in os.listdir(path) if not n.startswith("."))
            files += [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise Fail(f"input '{path}' does not exist (or is not a file or directory)")
    if not files:
        raise Fail("no input files (the directories given are empty)")
    return files


def text_pieces(f):
    """Yields (piece, bytes read) of one text file, cut before lines that start with a non-space."""
    piece, size = [], 0
    for line in f:
        if size >= PIECE_BYTES and not line[:1].isspace():
            yield "".join(piece), size
            piece, size = [], 0
        piece.append(line)
        size += len(line.encode("utf-8", "surrogateescape"))
    yield "".join(piece), size


def documents(path, separator):
    """Yields each document of one input file as a generator of (text piece, bytes read)."""
    if path.endswith((".jsonl", ".json")):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (ValueError, KeyError, TypeError) as e:
                    raise Fail(f"{path} line {number}: not a JSON object with a \"text\" string ({e})")
                if not isinstance(text, str):
                    raise Fail(f"{path} line {number}: \"text\" is not a string")
                yield iter([(text, len(line.encode("utf-8")))])
        return
    with open(path, encoding="utf-8", newline="") as f:
        if not separator:
            yield text_pieces(f)
            return
        # Documents split at the separator: read a piece at a time, cut where it occurs.
        pending = ""
        while True:
            block = f.read(PIECE_BYTES)
            pending += block
            while (at := pending.find(separator)) >= 0:
                yield iter([(pending[:at], len(pending[:at].encode("utf-8")) + len(separator.encode("utf-8")))])
                pending = pending[at + len(separator):]
            if not block:
                yield iter([(pending, len(pending.encode("utf-8")))])
                return
            if len(pending) > 64 * PIECE_BYTES:
                raise Fail(f"{path}: no separator {separator!r} in {len(pending)} characters: a document that long "
                           "is not split (drop --separator to read the file as one document)")


# ---- progress on stderr -------------------------------------------------------------------

class Progress:
    def __init__(self, total_bytes):
        self.total, self.done, self.tokens = max(total_bytes, 1), 0, 0
        self.start = self.last = time.monotonic()
        self.tty = sys.stderr.isatty()

    def add(self, nbytes, ntokens, final=False):
        self.done += nbytes
        self.tokens += ntokens
        now = time.monotonic()
        if not final and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(30 * frac)
        rate = self.tokens / max(now - self.start, 1e-9)
        unit, scale = ("MiB", 2**20) if self.total >= 2**20 else ("KiB", 2**10)
        line = (f"tokenize [{bar:<30}] {100 * frac:5.1f}% {self.done / scale:.1f}/{self.total / scale:.1f} {unit} "
                f"{self.tokens} tokens {rate:,.0f} tok/s")
        sys.stderr.write(("\r" + line + ("\n" if final else "")) if self.tty else line + "\n")
        sys.stderr.flush()


# ---- the binary file --------------------------------------------------------------------------

def tokenize(args):
    from tokenizers import Tokenizer

    try:
        with open(args.tokenizer, encoding="utf-8") as f:
            spec = json.load(f)
        tok = Tokenizer.from_file(args.tokenizer)
    except Exception as e:  # OSError, bad JSON, or the library's own error type
        raise Fail(f"cannot load tokenizer '{args.tokenizer}': {e}")
    before, after, eos = special_ids(tok, spec, args.eos)
    vocab = max(tok.get_vocab(with_added_tokens=True).values()) + 1
    if vocab > 2**31:
        raise Fail(f"vocab size {vocab} exceeds 2^31 (the format's ids are int32 in memory)")
    ending = after + ([eos] if not after or after[-1] != eos else [])
    files = input_files(args.inputs)
    progress = Progress(sum(os.path.getsize(p) for p in files))
    tmp = args.output + ".tmp"
    count = 0
    with open(tmp, "wb") as out:
        out.write(b"\0" * 32)  # the header, written when the count is known

        def write(ids):
            nonlocal count
            array("I", ids).tofile(out)
            count += len(ids)

        # Pieces are encoded in batches (in parallel); the document structure
        # (prefix, pieces, ending) is kept as a list of ("ids", ...) / ("text", ...).
        queue, queued_bytes, queued_read = [], 0, 0

        def flush():
            nonlocal queue, queued_bytes, queued_read
            texts = [x for kind, x in queue if kind == "text"]
            encoded = iter(tok.encode_batch(texts, add_special_tokens=False)) if texts else iter(())
            ntokens = count
            for kind, x in queue:
                write(next(encoded).ids if kind == "text" else x)
            progress.add(queued_read, count - ntokens)
            queue, queued_bytes, queued_read = [], 0, 0

        for path in files:
            try:
                for doc in documents(path, args.separator):
                    start, has_text = len(queue), False
                    queue.append(("ids", before))
                    for piece, nread in doc:
                        queue.append(("text", piece))
                        has_text = has_text or bool(piece)
                        queued_bytes += len(piece)
                        queued_read += nread
                        if queued_bytes >= BATCH_BYTES:
                            flush()
                    if has_text:
                        queue.append(("ids", ending))
                    else:  # an empty document is dropped (nothing of it was flushed: it added no bytes)
                        del queue[start:]
            except UnicodeDecodeError as e:
                raise Fail(f"{path}: not UTF-8 text ({e})")
        flush()
        if count == 0:
            raise Fail("the inputs hold no tokens")
        out.seek(0)
        out.write(MAGIC + struct.pack("<IIIIQ", 1, vocab, eos, 0, count))
    os.replace(tmp, args.output)
    progress.add(0, 0, final=True)
    print(f"{args.output}: {count} tokens, vocab {vocab}, EOS id {eos}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("inputs", nargs="+", help="text files, directories of them, JSON lines files")
    ap.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
    ap.add_argument("-o", "--output", required=True, help="the token file to write (.bin)")
    ap.add_argument("--eos", help="the EOS token's name, when the tokenizer does not tell")
    ap.add_argument("--separator", default="", help="split text files into documents at this string")
    args = ap.parse_args()
    try:
        rerun_with_tokenizers(__file__)
        tokenize(args)
    except Fail as e:
        if os.path.exists(args.output + ".tmp"):
            os.remove(args.output + ".tmp")
        sys.exit(f"tokenize_text.py: {e}")


if __name__ == "__main__":
    main()
