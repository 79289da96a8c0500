"""Build the bundled lm-evaluation-harness task files (train/tasks/*.jsonl) from the project's shared data.

- ``tatoeba_bn_en.jsonl``: the Tatoeba Bangla-English pairs (OPUS Tatoeba v20190709, CC BY 2.0 FR) of the
  chat conversations that ``prodip sft`` holds out at ``val_fraction = 0.05`` (the demo's;
  ``prodip.train.chat.is_heldout`` on ``data/chat/*.jsonl.gz``), so the demo's chat model never trained on
  them and the pretrained model never saw Tatoeba at all. Each pair is one item of both translation tasks:
  ``bn_choices`` (the pair's Bangla sentence and the 3 other held-out Bangla sentences nearest to it in length)
  and ``en_choices`` likewise, the answer's place chosen by a hash of the pair.
- ``hellaswag_en.jsonl``: the first 200 items of HellaSwag's validation split (MIT), as the shared copy holds
  them (``{ind, activity_label, ctx, endings, label}``).

The output is byte-reproducible (sorted, hashed choices; no time stamps).

    python data/make_eval_tasks.py ../shared/data train/tasks
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

from prodip.train.chat import is_heldout

CHAT_FILES = ("data/chat/bn.jsonl.gz", "data/chat/en.jsonl.gz")
HELDOUT_FRACTION = 0.05  # configs/demo.toml [sft] val_fraction
TATOEBA = "parallel/tatoeba_opus_bn-en.tsv"
HELLASWAG = "eval/hellaswag_val_en.jsonl"
HELLASWAG_ITEMS = 200
CHOICES = 4


def _heldout_lines(repo: Path) -> list[int]:
    """Line numbers (of the shared TSV) of every pair in a held-out chat conversation."""
    lines: list[int] = []
    for rel in CHAT_FILES:
        with gzip.open(repo / rel, "rt", encoding="utf-8") as fh:
            for row in fh:
                rec = json.loads(row)
                if is_heldout(rec["messages"], HELDOUT_FRACTION):
                    lines += rec["tatoeba_line"]
    return sorted(lines)


def _choices(target: int, sentences: list[str], key: str) -> tuple[list[str], int]:
    """The target sentence and the CHOICES-1 other distinct sentences nearest in length (ties: lower index),
    the target at a place a hash of ``key`` picks."""
    want = sentences[target]
    others = sorted(
        (i for i, s in enumerate(sentences) if s != want), key=lambda i: (abs(len(sentences[i]) - len(want)), i)
    )
    picked: list[str] = []
    for i in others:
        if sentences[i] not in picked:
            picked.append(sentences[i])
        if len(picked) == CHOICES - 1:
            break
    place = hashlib.sha256(key.encode()).digest()[0] % CHOICES
    return picked[:place] + [want] + picked[place:], place


def main(shared: str, out: str) -> int:
    repo = Path(__file__).resolve().parents[1]
    rows = (Path(shared) / TATOEBA).read_text(encoding="utf-8").splitlines()
    pairs = []
    for n in _heldout_lines(repo):
        bn, en = (s.strip() for s in rows[n - 1].split("\t"))
        pairs.append((n, bn, en))
    bns, ens = [p[1] for p in pairs], [p[2] for p in pairs]
    dst = Path(out)
    dst.mkdir(parents=True, exist_ok=True)
    with open(dst / "tatoeba_bn_en.jsonl", "w", encoding="utf-8", newline="\n") as fh:
        for i, (n, bn, en) in enumerate(pairs):
            bn_choices, bn_label = _choices(i, bns, f"bn\t{bn}\t{en}")
            en_choices, en_label = _choices(i, ens, f"en\t{bn}\t{en}")
            item = {
                "tatoeba_line": n,
                "bn": bn,
                "en": en,
                "bn_choices": bn_choices,
                "bn_label": bn_label,
                "en_choices": en_choices,
                "en_label": en_label,
            }
            fh.write(json.dumps(item, ensure_ascii=False) + "\n")
    print(f"{dst / 'tatoeba_bn_en.jsonl'}: {len(pairs)} pairs")
    src = (Path(shared) / HELLASWAG).read_text(encoding="utf-8").splitlines()[:HELLASWAG_ITEMS]
    (dst / "hellaswag_en.jsonl").write_text("\n".join(src) + "\n", encoding="utf-8", newline="\n")
    print(f"{dst / 'hellaswag_en.jsonl'}: {len(src)} items")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
