#!/usr/bin/env bash
# Fetch the held-out set of the tokenizer issue (#11): Bangla encyclopedia text and English speeches,
# from sources that are not in ../shared/data (so no tokenizer trained on shared data has seen them).
#   bn: Wikipedia sentences of joshua-decoder/indian-parallel-corpora (Post et al. 2012), bn-en dev,
#       devtest and test, Bangla side only (the English side is a translation);
#   en: six State of the Union addresses (1998-2002, the copy of NLTK's state_union corpus in
#       andisheh-partovi/ChangeDetection; US government works, public domain).
# Usage: bench/get_heldout.sh OUT_DIR   then   python bench/tokenizer_fertility.py ... --heldout-dir OUT_DIR
# Needs git and network access to github.com; the files are not shipped in this repository.
set -euo pipefail
out=${1:?usage: bench/get_heldout.sh OUT_DIR}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fetch() {  # repo commit dir
    git init -q "$tmp/$3"
    git -C "$tmp/$3" fetch -q --depth 1 "https://github.com/$1" "$2"
    git -C "$tmp/$3" checkout -q FETCH_HEAD
}
fetch joshua-decoder/indian-parallel-corpora a2cd1a99a4f2dbf3a15fffce8182162cd27c1b7b joshua
fetch andisheh-partovi/ChangeDetection c4038764a15f358fd59ec92d1f8d1befa8d457c3 sotu
mkdir -p "$out.partial/bn" "$out.partial/en"
for split in dev devtest test; do
    cp "$tmp/joshua/bn-en/$split.bn-en.bn" "$out.partial/bn/wiki_bn_$split.txt"
done
for speech in 1998-Clinton 1999-Clinton 2000-Clinton 2001-GWBush-1 2001-GWBush-2 2002-GWBush; do
    cp "$tmp/sotu/ChangeDetection/ChangeDetection/state_union/$speech.txt" "$out.partial/en/sotu_$speech.txt"
done
mv "$out.partial" "$out"
echo "held-out set in $out: $(cat "$out"/bn/* | wc -m) bn chars, $(cat "$out"/en/* | wc -m) en chars"
