"""Second BPE stage that learns multi-word tokens ("superwords", after SuperBPE, Liu et al. 2025,
arXiv:2503.13423), built on HF ``tokenizers`` without a custom trainer.

Stage 1 is ordinary word-level BPE. Stage 2 re-encodes the same sample with it, maps every stage-1 token
to one private-use character (U+F0000 + id), cuts the result into phrases (runs of word tokens; a token
without letters, or one ending in sentence punctuation, ends a phrase) and runs the ``tokenizers`` BPE
trainer over those phrases. Its merges, mapped back to text, are appended after stage 1's merges, and the
pre-tokeniser switches to phrases (:data:`PHRASE_PATTERN` in custom.py): since no stage-1 merge pairs a
symbol with a following space-initial symbol, stage 1 still segments words exactly as before, and the
stage-2 merges then join whole words.

    python -c "from prodip.tokenizer.superword import PUA_BASE; print(hex(PUA_BASE))"
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Iterator

import numpy as np
from tokenizers import Tokenizer, models, trainers

from prodip.base.cli import progress_bars
from prodip.base.errors import InvalidInput

PUA_BASE = 0xF0000  # supplementary private use areas A and B: 2 x 65534 code points
_MAX_IDS = 2 * 65534
_SENTENCE_END = tuple(".,!?;:।॥")


def _pua(i: int) -> str:
    return chr(PUA_BASE + i) if i < 65534 else chr(0x100000 + i - 65534)


def _unpua(c: str) -> int:
    o = ord(c)
    return o - PUA_BASE if o < 0x100000 else o - 0x100000 + 65534


def token_roles(tok: Tokenizer) -> np.ndarray:
    """Per stage-1 token id: 0 = breaks a phrase, 1 = word token, 2 = word token ending a phrase,
    3 = word token starting a phrase (it begins with punctuation, e.g. ``-word``: the phrase pattern only
    joins words across single spaces)."""

    def letter(c: str) -> bool:
        return unicodedata.category(c).startswith("L")

    def word_start(c: str) -> bool:
        return c in " \u200c\u200d" or unicodedata.category(c)[0] in "LM"

    roles = np.zeros(tok.get_vocab_size(), dtype=np.int8)
    for i in range(tok.get_vocab_size()):
        piece = tok.id_to_token(i)
        if piece.startswith("<0x") or piece.startswith("<|") or not any(map(letter, piece)):
            continue
        roles[i] = 2 if piece.endswith(_SENTENCE_END) else 1
        if not word_start(piece[0]):
            roles[i] = 3 if roles[i] == 1 else 0
    return roles


def phrases(tok: Tokenizer, roles: np.ndarray, docs: Iterator[str], batch: int = 512) -> Iterator[str]:
    """Yield stage-2 training phrases (strings of private-use characters, >= 2 tokens each)."""
    pua = [_pua(i) for i in range(tok.get_vocab_size())]
    buf: list[str] = []

    def emit(texts: list[str]) -> Iterator[str]:
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets: faster (tokenizers >= 0.20.1)
        for enc in encode(texts, add_special_tokens=False):
            run: list[str] = []
            for i in enc.ids:
                role = roles[i]
                if role == 3:
                    if len(run) > 1:
                        yield "".join(run)
                    run, role = [], 1
                if role:
                    run.append(pua[i])
                if role != 1:
                    if len(run) > 1:
                        yield "".join(run)
                    run = []
            if len(run) > 1:
                yield "".join(run)

    for doc in docs:
        buf.append(doc)
        if len(buf) >= batch:
            yield from emit(buf)
            buf = []
    if buf:
        yield from emit(buf)


def learn_superwords(
    stage1: Tokenizer, docs: Callable[[], Iterator[str]], n_new: int, min_frequency: int = 2, progress: bool = False
) -> list[tuple[str, str]]:
    """Learn up to ``n_new`` stage-2 merges on the phrases of ``docs()``; returns them as text pairs.

    Raises:
        ValueError: the stage-1 vocabulary exceeds the private-use range (131,068 tokens).
    """
    if stage1.get_vocab_size() > _MAX_IDS:
        raise InvalidInput(f"superword stage supports at most {_MAX_IDS} stage-1 tokens")
    roles = token_roles(stage1)
    alphabet = [_pua(i) for i in np.flatnonzero(roles)]
    trainer = trainers.BpeTrainer(
        vocab_size=len(alphabet) + n_new,
        min_frequency=min_frequency,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=progress_bars(progress),
    )
    stage2 = Tokenizer(models.BPE())  # no normaliser, no pre-tokeniser: a phrase is one "word"
    stage2.train_from_iterator(phrases(stage1, roles, docs()), trainer=trainer)
    merges = json.loads(stage2.to_str())["model"]["merges"]
    text = [stage1.id_to_token(i) for i in range(stage1.get_vocab_size())]

    def decode(s: str) -> str:
        return "".join(text[_unpua(c)] for c in s)

    pairs = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]
    return [(decode(a), decode(b)) for a, b in pairs]
