"""Warnings of ``prodip data prepare`` about languages the tokenizer serves badly.

Two checks per language, made on the encoded shards and a sample of the corpus:

- **fertility**: characters per text token (special ids 0-2 not counted) against the tokenizer's
  gate (``fertility.json`` ``gate.min_chars_per_token``; a language the audit never measured is held
  to the smallest gate there);
- **script coverage**: the share of letters (Unicode categories L and M) in the first
  ``sample_chars`` characters that occur in no vocabulary token; above one half, the tokenizer
  never saw the language's script and encodes it byte by byte (Hindi through a Bangla/English
  tokenizer: ~0.4 chars/token).

Neither stops the encode (the shards are valid); both are logged and kept in meta.json under
``language_warnings``.

    python -c "from prodip.tokenizer.coverage import vocabulary_chars; from prodip.tokenizer.bpe import load_tokenizer; print(len(vocabulary_chars(load_tokenizer('runs/demo/tokenizer'))))"
"""

from __future__ import annotations

import collections
import logging
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np

from prodip.tokenizer import shards
from prodip.tokenizer.audit import read_fertility_or_none
from prodip.tokenizer.corpus import iter_language

log = logging.getLogger(__name__)

_SPECIAL_IDS = 3  # <|pad|> 0, <|bos|> 1, <|eos|> 2 (CONTRACTS.md "Tokenizer dir")
UNSEEN_SCRIPT_SHARE = 0.5


def vocabulary_chars(tok: Any) -> set[str]:
    """Every character that some vocabulary token decodes to (partial UTF-8 pieces excluded)."""
    chars: set[str] = set()
    for i in range(tok.get_vocab_size()):
        chars.update(tok.decode([i], skip_special_tokens=True))
    chars.discard("\ufffd")
    return chars


def text_tokens(shards_dir: Path, entries: dict[str, list[dict]]) -> int:
    """Tokens of a language's shards that are not special ids."""
    n = 0
    for split in shards.SPLITS:
        for entry in entries.get(split, []):
            n += int(np.count_nonzero(shards.read_shard(Path(shards_dir) / entry["file"]) >= _SPECIAL_IDS))
    return n


def _gate(tokenizer_dir: str | Path) -> dict[str, float]:
    report = read_fertility_or_none(tokenizer_dir)
    return {} if report is None else {k: float(v) for k, v in report.gate.min_chars_per_token.items()}


def _unseen_letters(sample: str, known: set[str]) -> tuple[float, str]:
    """Share of letters of ``sample`` in no vocabulary token, and the most common script among them."""
    letters = [c for c in sample if unicodedata.category(c)[0] in "LM"]
    unseen = [c for c in letters if c not in known]
    if not letters:
        return 0.0, ""
    scripts = collections.Counter(unicodedata.name(c, "UNKNOWN").split()[0] for c in unseen)
    return len(unseen) / len(letters), (scripts.most_common(1)[0][0].title() if scripts else "")


def warn_languages(
    tokenizer_dir: str | Path,
    tok: Any,
    files: dict[str, list[Path]],
    meta: dict[str, Any],
    shards_dir: str | Path,
    *,
    text_field: str = "text",
    errors: str = "strict",
    sample_chars: int = 100_000,
) -> list[str]:
    """Check every language of a freshly encoded shards dir; log and return one line per problem.

    Args:
        tokenizer_dir: holds ``fertility.json`` (the gate), if audited.
        tok: the ``tokenizers.Tokenizer`` the shards were encoded with.
        files: ``{lang: [input files]}`` as read (for the script sample).
        meta: the shards' meta dict (``languages.{lang}.chars`` and shard entries).
        shards_dir: where the shard files of ``meta`` are.
        text_field, errors: as for reading the corpus.
        sample_chars: characters read per language for the script check.
    Returns:
        the warnings, e.g. ``"hi: 0.40 chars/token, below the gate's 2.50 ..."``.
    """
    gate = _gate(tokenizer_dir)
    known = vocabulary_chars(tok)
    out = []
    for lang, info in meta["languages"].items():
        n_tokens = text_tokens(Path(shards_dir), info)
        cpt = info.get("chars", 0) / n_tokens if n_tokens else 0.0
        floor = gate.get(lang, min(gate.values()) if gate else None)
        if floor is not None and cpt < floor:
            source = "its gate" if lang in gate else "the smallest gate (the audit never measured this language)"
            out.append(
                f"{lang}: {cpt:.2f} chars/token, below {source} of {floor:.2f} in {tokenizer_dir}/fertility.json: "
                "its text becomes many short tokens (train the tokenizer on it, or with a larger vocabulary)"
            )
        sample = []
        size = 0
        for _, _, doc in iter_language(files[lang], lang, text_field=text_field, errors=errors):
            sample.append(doc[: sample_chars - size])
            size += len(sample[-1])
            if size >= sample_chars:
                break
        share, script = _unseen_letters("".join(sample), known)
        if share > UNSEEN_SCRIPT_SHARE:
            out.append(
                f"{lang}: {share:.0%} of its letters ({script or 'its'} script) occur in no token of the "
                "tokenizer, which never saw this script and encodes it byte by byte; train the tokenizer with it"
            )
    for line in out:
        log.warning("%s", line)
    return out
