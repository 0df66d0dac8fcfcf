#!/usr/bin/env bash
# Writes the demo corpus: the King James Bible (Debian package bible-kjv),
# one text file per book (66 documents, up to ~250 KB each) into data/kjv/.
# Each file is "Book chapter:verse text" lines, one verse per line. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-data/kjv}
if [ -f "$out/.complete" ]; then exit 0; fi
command -v bible >/dev/null || { echo "prepare_corpus: 'bible' not found (apt-get install bible-kjv)" >&2; exit 1; }
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
# `bible -f` turns pretty-printing off: one verse per line, "Ge1:1 In the ...".
bible -f "gen1:1-rev22:21" | awk -v dir="$out.tmp" '
  NF == 0 { next }
  {
    ref = $1; book = ref; sub(/[0-9]+:[0-9]+$/, "", book)
    if (book != last) { n++; last = book; file = sprintf("%s/%02d_%s.txt", dir, n, book) }
    verse = substr(ref, length(book) + 1)
    $1 = ""; print book " " verse $0 > file
  }'
count=$(ls "$out.tmp" | wc -l)
if [ "$count" -ne 66 ]; then echo "prepare_corpus: expected 66 books, got $count" >&2; exit 1; fi
touch "$out.tmp/.complete"
rm -rf "$out" && mv "$out.tmp" "$out"
echo "prepare_corpus: $count books, $(du -sh "$out" | cut -f1) in $out"
