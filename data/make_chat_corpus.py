"""Build the bundled chat fine-tuning corpus (data/chat/) from Tatoeba's Bangla-English pairs (see README.md here).

Each pair of ../shared/data/parallel/tatoeba_opus_bn-en.tsv (OPUS Tatoeba v20190709, CC BY 2.0 FR) becomes one
translation conversation in OpenAI's messages format: half the pairs ask for the Bangla of an English sentence
(the reply is Bangla: ``bn.jsonl.gz``), the other half for the English of a Bangla one (``en.jsonl.gz``), chosen by
a hash of the pair. Every fourth conversation opens with a system prompt, and every fifth carries a second request
(the next pair, then not used on its own) in the same conversation, so multi-turn and system prompts are
trained and no pair is in two conversations. The sentences are copied
verbatim; each record keeps its attribution (``source``, ``licence``, ``tatoeba_line``). gzip'd with mtime 0, so
the output is byte-reproducible.

    python data/make_chat_corpus.py ../shared/data data
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
from pathlib import Path

SOURCE = "parallel/tatoeba_opus_bn-en.tsv"
ATTRIBUTION = "Tatoeba (tatoeba.org) sentences, OPUS Tatoeba v20190709"
LICENCE = "CC BY 2.0 FR"
SYSTEM = "You translate between Bangla and English."
ASK_BN = "Translate into Bangla: "  # the reply is Bangla
ASK_EN = "ইংরেজিতে অনুবাদ করো: "  # "translate into English": the reply is English


def _turn(bn: str, en: str, reply_lang: str) -> list[dict[str, str]]:
    if reply_lang == "bn":
        return [{"role": "user", "content": ASK_BN + en}, {"role": "assistant", "content": bn}]
    return [{"role": "user", "content": ASK_EN + bn}, {"role": "assistant", "content": en}]


def _gzip_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write(data)


def main(shared: str, out: str) -> int:
    lines = (Path(shared) / SOURCE).read_text(encoding="utf-8").splitlines()
    if lines[0].split("\t") != ["bn", "en"]:
        raise SystemExit(f"{SOURCE}: expected the header 'bn<TAB>en', got {lines[0]!r}")
    pairs = [(i + 2, *line.split("\t")) for i, line in enumerate(lines[1:]) if line.count("\t") == 1]
    pairs = [(n, bn.strip(), en.strip()) for n, bn, en in pairs if bn.strip() and en.strip()]
    records: dict[str, list[str]] = {"bn": [], "en": []}
    k = i = 0
    while i < len(pairs):
        n, bn, en = pairs[i]
        lang = "bn" if hashlib.sha256(f"{bn}\t{en}".encode()).digest()[0] % 2 == 0 else "en"
        messages = ([{"role": "system", "content": SYSTEM}] if k % 4 == 0 else []) + _turn(bn, en, lang)
        used = [n]
        if k % 5 == 0 and i + 1 < len(pairs):  # the next pair as a second request in the same conversation
            n2, bn2, en2 = pairs[i + 1]
            messages += _turn(bn2, en2, lang)
            used.append(n2)
        record = {"messages": messages, "source": ATTRIBUTION, "licence": LICENCE, "tatoeba_line": used}
        records[lang].append(json.dumps(record, ensure_ascii=False))
        i, k = i + len(used), k + 1
    dst = Path(out) / "chat"
    dst.mkdir(parents=True, exist_ok=True)
    for lang, recs in records.items():
        _gzip_write(dst / f"{lang}.jsonl.gz", ("\n".join(recs) + "\n").encode("utf-8"))
        print(
            f"{dst / f'{lang}.jsonl.gz'}: {len(recs)} conversations, {(dst / f'{lang}.jsonl.gz').stat().st_size:,} bytes"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
