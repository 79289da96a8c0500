"""Word-frequency tables (word, count) as tokenizer training input: a file, or the ``wordfreq`` package.

BPE was first trained on word-frequency tables (Sennrich et al. 2016, "Neural Machine Translation of
Rare Words with Subword Units"); HF ``tokenizers``' BPE trainer itself works on the pre-tokenized
words' counts. A table enters the training sample as its *equivalent text*: each word, with a space
before it (as a word appears inside running text), repeated ``count`` times, one word per line
(:func:`equivalent_text`). Feeding the table and feeding that text give the same pre-token counts,
hence the same tokenizer (tests/test_tokenizer_wordcounts.py checks it).

Sources (``[tokenizer] word_counts = { bn = [...] }``):

- a file ``*.tsv`` / ``*.tsv.gz``: one ``word<TAB>count`` per line (count a positive integer; blank
  lines skipped); the counts are used as given;
- ``wordfreq:LANG``: the ``large`` (else ``small``) list that the ``wordfreq`` package (PyPI, code
  Apache-2.0, data CC BY-SA 4.0, https://github.com/rspeer/wordfreq) ships inside its wheel: nothing
  is downloaded. Frequencies become counts scaled so the equivalent text has about ``chars``
  characters; entries that are not letters/marks are dropped, except numbers: wordfreq writes every
  digit as ``0`` (``0000`` is any 4-digit number), and each such entry of 1 to 4 digits is spread over
  the concrete numbers by wordfreq's own estimate (``word_frequency``: Benford's law, years apart), in
  the digits the language's text inputs use most (Bangla: ০-৯); without them a tokenizer learns no
  digit merges and spends a token per digit. wordfreq lower-cases, so each word takes the casing the
  language's text inputs use most for it.

Running text does not put a space before every word: a word that starts a line, or follows an opening
quote or bracket, is a pre-token without one (o200k's pattern), and BPE learns those merges apart.
``bare_share`` gives that share of each word's count without the space (:func:`split_bare`). Likewise a
sentence's first word is capitalised, and wordfreq's lists are lower case: ``capitalised_share`` gives
that share of a lower-case word's count as ``Word`` (:func:`occurrences`).

    python -m prodip.tokenizer.wordcounts wordfreq:bn     # words, counts and licence of a source
"""

from __future__ import annotations

import gzip
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import regex

from prodip.base.errors import InvalidInput, MissingInput

WORDFREQ_PREFIX = "wordfreq:"
#: A word a table may hold: letters and combining marks, with internal apostrophes (``don't``).
WORD = regex.compile(r"[\p{L}\p{M}]+(?:['’][\p{L}\p{M}]+)*")
#: A decimal digit of any script (\p{Nd}).
DIGIT = regex.compile(r"\p{Nd}")
#: The most characters of equivalent text in one training document (a frequent word is cut into many).
CHUNK_CHARS = 10_000
#: Digit strings wordfreq stores in place of numbers (every digit written as 0), spread by :func:`numbers`.
NUMBER_DIGITS = (1, 2, 3, 4)
ASCII_DIGITS = "0123456789"
#: Licence record of the ``wordfreq`` source (SPDX ids): the code and the word lists differ.
WORDFREQ_LICENSE = {
    "name": "wordfreq",
    "url": "https://github.com/rspeer/wordfreq",
    "license": "CC-BY-SA-4.0",  # the data that enters the tokenizer
    "code_license": "Apache-2.0",
    "share_alike": True,
    "attribution": "wordfreq by Robyn Speer (Exquisite Corpus word lists), CC BY-SA 4.0",
}


@dataclass
class WordCounts:
    """One loaded table: ``(word, count)`` in table order, where it came from, and its licence."""

    source: str
    counts: list[tuple[str, int]]
    license: dict | None = None
    version: str | None = None

    def chars(self) -> int:
        """Characters of the equivalent text (one space + the word, per occurrence; newlines not counted)."""
        return sum((len(w) + 1) * c for w, c in self.counts)


def is_wordfreq(source: str) -> bool:
    return str(source).startswith(WORDFREQ_PREFIX)


def read_counts_file(path: str | Path) -> list[tuple[str, int]]:
    """Read a ``word<TAB>count`` table (UTF-8, ``.gz`` allowed).

    Raises:
        MissingInput: no such file. InvalidInput: a line without exactly two tab-separated fields,
            a count that is not a positive integer, a word with whitespace, or no rows at all
            (each message names ``file:line``).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"word_counts: {path} does not exist")
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    out: list[tuple[str, int]] = []
    with opener(path, "rt", encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                raise InvalidInput(f"{path}:{lineno}: expected 'word<TAB>count', got {line[:60]!r}")
            word, count = parts
            if not word or any(ch.isspace() for ch in word):
                raise InvalidInput(f"{path}:{lineno}: the word {word!r} is empty or holds whitespace")
            try:
                n = int(count)
            except ValueError:
                n = 0
            if n < 1:
                raise InvalidInput(f"{path}:{lineno}: count {count!r} is not a positive integer")
            out.append((word, n))
    if not out:
        raise InvalidInput(f"{path}: no 'word<TAB>count' rows; remove it from word_counts")
    return out


def corpus_casing(docs: Iterable[str]) -> dict[str, str]:
    """lower-cased word -> the surface form ``docs`` use most (ties: the first seen), for true-casing."""
    forms: Counter[str] = Counter()
    for doc in docs:
        forms.update(WORD.findall(doc))
    best: dict[str, tuple[int, str]] = {}
    for form, n in forms.items():
        key = form.lower()
        if key not in best or n > best[key][0]:
            best[key] = (n, form)
    return {key: form for key, (_, form) in best.items()}


def corpus_digits(docs: Iterable[str]) -> str:
    """The ten decimal digits (0 to 9, one script) ``docs`` use most; ASCII when they hold none."""
    zeros: Counter[str] = Counter()
    for doc in docs:
        zeros.update(chr(ord(ch) - unicodedata.decimal(ch)) for ch in DIGIT.findall(doc))
    if not zeros:
        return ASCII_DIGITS
    zero = ord(zeros.most_common(1)[0][0])
    return "".join(chr(zero + i) for i in range(10))


def numbers(lang: str, freqs: dict[str, float], wordlist: str, digits: str = ASCII_DIGITS) -> list[tuple[str, float]]:
    """Concrete numbers of 1 to 4 digits with frequencies, from wordfreq's digit-smashed entries.

    wordfreq stores ``0``, ``00``, ... in place of the numbers of that many digits; each entry's
    frequency is spread over its ``10**k`` numbers in proportion to ``wordfreq.word_frequency`` (the
    package's own estimate for a number: Benford's law, with a separate distribution for years),
    so the numbers of ``k`` digits keep the list's total for them. Written with ``digits``
    (``digits[i]`` for digit ``i``).
    """
    import wordfreq  # noqa: PLC0415

    table = str.maketrans(ASCII_DIGITS, digits)
    out: list[tuple[str, float]] = []
    for k in NUMBER_DIGITS:
        mass = freqs.get("0" * k, 0.0)
        if mass <= 0:
            continue
        each = [
            (str(n).zfill(k), wordfreq.word_frequency(str(n).zfill(k), lang, wordlist=wordlist)) for n in range(10**k)
        ]
        total = sum(f for _, f in each)
        out += [(w.translate(table), f * mass / total) for w, f in each if f > 0]
    return out


def wordfreq_counts(
    lang: str, chars: int, casing: dict[str, str] | None = None, digits: str = ASCII_DIGITS
) -> WordCounts:
    """The ``wordfreq`` list of ``lang`` as counts whose equivalent text has about ``chars`` characters.

    count = round(frequency * N), N chosen (a few fixed-point steps) so sum((len(word) + 1) * count) is
    within 0.5 % of ``chars``; words whose count rounds to 0 are dropped, so a larger ``chars`` also
    brings in rarer words. Numbers of 1 to 4 digits come in written with ``digits`` (:func:`numbers`).

    Raises:
        InvalidInput: ``wordfreq`` is not installed, or has no list for ``lang``; ``chars`` < 1.
    """
    if chars < 1:
        raise InvalidInput(f"wordfreq_chars must be >= 1, got {chars}")
    try:
        import wordfreq  # noqa: PLC0415 (its data loads only when a config asks for it)
    except ImportError:
        raise InvalidInput(
            f"word_counts: {WORDFREQ_PREFIX}{lang} needs the wordfreq package (in the train extra: pip install 'prodip[train]')"
        ) from None
    if lang not in wordfreq.available_languages(wordlist="large") and lang not in wordfreq.available_languages():
        raise InvalidInput(f"word_counts: wordfreq ships no list for language {lang!r}")
    wordlist = "large" if lang in wordfreq.available_languages(wordlist="large") else "small"
    table = wordfreq.get_frequency_dict(lang, wordlist=wordlist)
    freqs = [(w, f) for w, f in table.items() if WORD.fullmatch(w)] + numbers(lang, table, wordlist, digits)
    cased = [((casing or {}).get(w, w), f) for w, f in freqs]
    scale = chars / sum((len(w) + 1) * f for w, f in freqs)  # at this N, before rounding
    for _ in range(8):  # rounding drops the rare words: rescale until the rounded table has ~chars
        got = sum((len(w) + 1) * round(f * scale) for w, f in cased)
        if abs(got - chars) <= 0.005 * chars:
            break
        scale *= chars / max(got, 1)
    merged: dict[str, int] = {}
    for w, f in cased:  # two spellings may take the same casing: their counts add up
        if (c := round(f * scale)) > 0:
            merged[w] = merged.get(w, 0) + c
    return WordCounts(
        f"{WORDFREQ_PREFIX}{lang}",
        list(merged.items()),
        license=dict(WORDFREQ_LICENSE, wordlist=f"{wordlist}_{lang}"),
        version=version("wordfreq"),
    )


def load_counts(
    source: str,
    lang: str,
    *,
    wordfreq_chars: int,
    casing: dict[str, str] | None = None,
    digits: str = ASCII_DIGITS,
) -> WordCounts:
    """A ``word_counts`` entry: ``wordfreq:LANG`` or a ``word<TAB>count`` file (see the module docstring).

    Raises:
        InvalidInput: a ``wordfreq:`` language other than the entry's, or see the readers.
    """
    if is_wordfreq(source):
        wf_lang = source[len(WORDFREQ_PREFIX) :]
        if wf_lang != lang:
            raise InvalidInput(f"word_counts.{lang}: {source} is another language's list (expected wordfreq:{lang})")
        return wordfreq_counts(lang, wordfreq_chars, casing, digits)
    return WordCounts(str(source), read_counts_file(source))


def split_bare(count: int, bare_share: float) -> tuple[int, int]:
    """``(spaced, bare)`` occurrences of a word counted ``count`` times: ``round(count * bare_share)`` bare."""
    bare = round(count * bare_share)
    return count - bare, bare


def occurrences(
    counts: Iterable[tuple[str, int]], bare_share: float = 0.0, capitalised_share: float = 0.0
) -> Iterator[tuple[str, int]]:
    """The pieces of text a table stands for, as ``(piece, times)``: ``" word"`` and, for the bare share,
    ``"word\n"`` (:func:`split_bare`); a word written in lower case first gives ``round(count *
    capitalised_share)`` of its occurrences as ``"Word"`` (a sentence's first word), split the same way."""
    for word, count in counts:
        title = word[:1].upper() + word[1:]
        n_title = round(count * capitalised_share) if word[:1].islower() and title != word else 0
        for form, n in ((word, count - n_title), (title, n_title)):
            spaced, bare = split_bare(n, bare_share)
            if spaced:
                yield " " + form, spaced
            if bare:
                yield form + "\n", bare


def count_documents(
    counts: Iterable[tuple[str, int]],
    chunk_chars: int = CHUNK_CHARS,
    bare_share: float = 0.0,
    capitalised_share: float = 0.0,
) -> Iterator[str]:
    """The equivalent text as training documents: each piece of :func:`occurrences` repeated, cut into
    <= ``chunk_chars`` characters."""
    for piece, times in occurrences(counts, bare_share, capitalised_share):
        per_doc = max(1, chunk_chars // len(piece))
        while times > 0:
            n = min(times, per_doc)
            yield piece * n
            times -= n


def equivalent_text(counts: Iterable[tuple[str, int]], bare_share: float = 0.0, capitalised_share: float = 0.0) -> str:
    """The text a table stands for (:func:`occurrences`): a line of ``" word"`` repeated per spaced form,
    one line ``"word"`` per bare occurrence."""
    return "".join(
        piece * n + "\n" if piece.startswith(" ") else piece * n
        for piece, n in occurrences(counts, bare_share, capitalised_share)
    )


def _main(argv: list[str]) -> int:
    source = argv[0] if argv else "wordfreq:bn"
    lang = source[len(WORDFREQ_PREFIX) :] if is_wordfreq(source) else "xx"
    table = load_counts(source, lang, wordfreq_chars=1_000_000)
    print(f"{table.source}: {len(table.counts):,} words, {table.chars():,} chars of equivalent text")
    print(f"first: {table.counts[:8]}")
    print(f"licence: {table.license}, version {table.version}")
    return 0


if __name__ == "__main__":
    from prodip.base.cli import tool_main

    sys.exit(tool_main("tokenizer.wordcounts", _main, sys.argv[1:]))
