"""The opt-in custom tokenizer (``kind = "custom"``): Bangla-aware regex, byte fallback, superwords.

Character-level BPE with byte fallback (the 256 ``<0xNN>`` tokens, so no ``<unk>`` and
``decode(encode(x)) == NFC(x)`` for any string), an NFC normaliser, and a pre-tokeniser of prodip's own
that keeps every Bengali grapheme cluster whole and lets sentence punctuation and the danda stay on the
word (:data:`WORD_PATTERN`), plus optional multi-word tokens (tokenizer/superword.py). Only ``tokenizers``,
transformers and transformers.js reproduce it: onnxruntime-genai refuses the regex, llama.cpp cannot
carry a custom pre-tokenizer, and superwords make lm-evaluation-harness split context and continuation
non-canonically. prodip's default is the portable tokenizer (tokenizer/bpe.py); export targets refuse
this one (tokenizer/portable.py).

    prodip tokenizer train --kind custom --superword-share 0.2 --inputs bn=data/bn,en=data/en --out-dir runs/tok
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from prodip.base.cli import progress_bars
from prodip.tokenizer.superword import learn_superwords

BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))  # sentencepiece/Llama byte-fallback names

_MARKS = r"\p{M}\x{200C}\x{200D}"  # combining marks (matras, virama, nukta, candrabindu, ...) + ZWNJ/ZWJ
# Pre-tokeniser pieces (Oniguruma syntax, as HF tokenizers uses), tried left to right:
#  1. a word: letters and marks (incl. ZWJ/ZWNJ) together, so no Bengali vowel sign, hasanta, nukta,
#     candrabindu/anusvara/visarga or joiner is ever cut from its cluster (GPT-2's ``\p{L}+`` cuts at
#     every matra: the report's 1.4 chars/token trap); in-word apostrophes kept (don't, it's); one
#     optional leading space or punctuation mark, as GPT-4's pattern, but never a danda; trailing
#     sentence punctuation (. , ! ? ; : and the danda । ॥) may stay on the word, so the very frequent
#     sentence-final "verb + danda" can become one token while a danda never starts a word;
#  2. digits, Bengali ০-৯ treated like ASCII 0-9: runs of at most 3 (GPT-4's choice: numbers get a
#     small closed set of pieces), with any following marks kept on;
#  3. a danda on its own (after a number or a space), 4. other symbols, 5. newlines, 6. whitespace.
_WORD = rf"[\p{{L}}{_MARKS}]+(?:['’][\p{{L}}{_MARKS}]+)*"
_PREFIX = rf"[^\r\n\p{{L}}\p{{N}}{_MARKS}।॥]?"
_END = rf"(?:[.,!?;:।॥][{_MARKS}]*)*"  # marks stay with the punctuation they follow
_REST = (
    rf"|\p{{N}}{{1,3}}[{_MARKS}]*| ?[।॥]+[{_MARKS}]*| ?[^\s\p{{L}}\p{{N}}।॥]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
WORD_PATTERN = _PREFIX + _WORD + _END + _REST
# With superwords (tokenizer/superword.py) a piece is a phrase: words joined by single spaces, up to
# sentence punctuation; everything else is as in WORD_PATTERN.
PHRASE_PATTERN = _PREFIX + _WORD + rf"(?: {_WORD})*" + _END + _REST


def _custom_pipeline(tok: Tokenizer, pattern: str) -> Tokenizer:
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _with_byte_fallback(
    trained: Tokenizer, vocab_size: int, specials: tuple[str, ...], extra_merges: list[tuple[str, str]] = ()
) -> Tokenizer:
    """Rebuild a trained BPE with ids: ``specials`` first (0-4), ``<0x00>``..``<0xFF>`` 5-260, then the learned vocab,
    then the tokens of ``extra_merges`` (superwords; the phrase pre-tokeniser is used if there are any)."""
    model = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = {}
    for token in (*specials, *BYTE_TOKENS):
        vocab[token] = len(vocab)
    for token, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        if token not in vocab:
            vocab[token] = len(vocab)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    n_extra = 0
    for a, b in extra_merges:
        if len(vocab) >= vocab_size:
            break
        if a in vocab and b in vocab:
            vocab.setdefault(a + b, len(vocab))
            merges.append((a, b))
            n_extra += 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=False))
    _custom_pipeline(tok, PHRASE_PATTERN if n_extra else WORD_PATTERN)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return tok


def top_characters(texts: Callable[[], Iterator[str]], limit: int) -> list[str] | None:
    """The ``limit`` most frequent characters of the (NFC) text, ties broken by code point; None
    when the text has at most ``limit`` distinct characters (nothing is cut).

    ``tokenizers``' BpeTrainer cuts an alphabet larger than ``limit_alphabet`` after an unstable
    sort of a hash map by count, so which of the equally rare characters survive differs from run
    to run, and so does the tokenizer. Passing this list as ``initial_alphabet`` (those characters
    rank above every counted one) makes the cut deterministic: exactly the others are removed.

    Args:
        texts: zero-argument callable returning an iterator of documents (one extra pass).
        limit: alphabet size in characters.
    """
    counts: Counter[str] = Counter()
    for doc in texts():
        counts.update(unicodedata.normalize("NFC", doc))
    if len(counts) <= limit:
        return None
    return [ch for ch, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]]


def train_custom(
    texts: Callable[[], Iterator[str]],
    *,
    vocab_size: int,
    special_tokens: tuple[str, ...],
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    superword_share: float = 0.0,
    progress: bool = False,
) -> Tokenizer:
    """Fit the custom tokenizer (see the module docstring) on documents.

    Args:
        texts: zero-argument callable returning an iterator of documents (raw; the normaliser applies
            NFC). Called twice, three times with superwords.
        vocab_size: final vocabulary size in tokens, the special and 256 byte tokens included.
        special_tokens: the special tokens, given ids 0, 1, ... in this order.
        min_frequency: minimum pair count for a merge.
        limit_alphabet: at most this many distinct characters enter the vocabulary.
        superword_share: share of the learned vocabulary given to multi-word tokens (0 = none).
        progress: show the ``tokenizers`` trainer's progress bars (stderr).
    """
    specials = [AddedToken(t, special=True, normalized=False) for t in special_tokens]
    learned = vocab_size - 256  # the byte tokens are added after training
    n_super = int(superword_share * (learned - len(special_tokens)))
    tok = _custom_pipeline(Tokenizer(models.BPE()), WORD_PATTERN)
    limit = max(1, min(limit_alphabet, learned - len(special_tokens)))
    trainer = trainers.BpeTrainer(
        vocab_size=learned - n_super,
        min_frequency=min_frequency,
        special_tokens=specials,
        limit_alphabet=limit,
        initial_alphabet=top_characters(texts, limit) or [],
        show_progress=progress_bars(progress),
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    extra: list[tuple[str, str]] = []
    if n_super:
        stage1 = _with_byte_fallback(tok, vocab_size, special_tokens)
        # ask for 10% more: a merged phrase may already be a stage-1 token and then adds no id
        extra = learn_superwords(
            stage1, texts, int(n_super * 1.1) + 1, min_frequency=max(2, min_frequency), progress=progress
        )
    return _with_byte_fallback(tok, vocab_size, special_tokens, extra)
