"""Train a Bangla-aware BPE tokenizer with HF ``tokenizers`` and own the tokenizer dir's layout.

The prodip tokenizer is a character-level BPE with byte fallback (the 256 ``<0xNN>`` tokens, so no
``<unk>`` and ``decode(encode(x)) == NFC(x)`` for any string), an NFC normaliser stored inside
``tokenizer.json``, and a pre-tokeniser that keeps every Bengali grapheme cluster whole (see
``WORD_PATTERN``), plus optional multi-word tokens (tokenizer/superword.py). The sample is streamed to
configured per-language proportions.
``kind = "naive"`` trains the GPT-2-style byte-level baseline on the natural (unbalanced) mix instead.

    prodip tokenizer train --inputs bn=data/bn,en=data/en --vocab-size 8192 --out-dir runs/tok
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import resource
import shutil
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from prodip.base.config import dump_toml, opt, to_dict
from prodip.base.errors import InvalidInput, MissingInput, OutputExists
from prodip.base.files import file_sha256
from prodip.tokenizer.corpus import ERROR_POLICIES, ReadStats, expand_inputs, iter_language
from prodip.tokenizer.superword import learn_superwords

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")  # ids 0, 1, 2 (fixed by CONTRACTS.md)
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BYTE_TOKENS = tuple(f"<0x{b:02X}>" for b in range(256))  # sentencepiece/Llama byte-fallback names
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
FORMAT_VERSION = 1

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


@dataclass
class TokenizerTrainConfig:
    """``prodip tokenizer train`` (TOML section ``[tokenizer]``)."""

    inputs: dict[str, list[str]] = opt(
        factory=dict,
        help="language -> files/folders of training text "
        "(.txt/.txt.gz/.jsonl/.jsonl.gz/.tsv), e.g. bn=data/bn,en=data/en",
    )
    out_dir: str = opt("runs/tokenizer", "output tokenizer dir (refused if it holds a tokenizer, unless overwrite)")
    vocab_size: int = opt(32000, "vocabulary size in tokens, incl. 3 special and 256 byte-fallback tokens")
    proportions: dict[str, float] = opt(
        factory=dict,
        help="share of the training sample per language, by "
        "characters, e.g. bn=0.6,en=0.4 (empty: the corpus's natural mix)",
    )
    sample_chars: int = opt(60_000_000, "maximum characters in the training sample (all languages)")
    min_frequency: int = opt(2, "minimum pair count for a merge")
    limit_alphabet: int = opt(
        1000,
        "at most this many distinct characters enter the vocabulary; rarer "
        "characters are encoded as byte-fallback tokens",
    )
    model_max_length: int = opt(2048, "model_max_length written to tokenizer_config.json (tokens)")
    superword_share: float = opt(
        0.2,
        "share of the learned vocabulary given to multi-word tokens (SuperBPE-style second stage; 0 = word-level only)",
    )
    kind: str = opt(
        "prodip",
        "prodip: Bangla-aware; naive: GPT-2 byte-level BPE on the unbalanced mix (the baseline)",
        choices=("prodip", "naive"),
    )
    seed: int = opt(0, "seed of the per-document sampling")
    errors: str = opt(
        "strict",
        "invalid UTF-8: strict = error naming file and byte offset; skip = drop and count the bytes",
        choices=ERROR_POLICIES,
    )
    overwrite: bool = opt(False, "replace an existing tokenizer in out_dir")
    progress: bool = opt(True, "show the trainer's progress bars")


# ---------------------------------------------------------------------------------------------- sampling


def _doc_unit(seed: int, lang: str, path: Path, index: int) -> float:
    """A deterministic uniform [0, 1) number per document (Python's hash() is salted per process)."""
    digest = hashlib.blake2b(f"{seed}\0{lang}\0{path.name}\0{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def plan_sample(chars_by_lang: dict[str, int], proportions: dict[str, float], sample_chars: int) -> dict[str, int]:
    """Characters to draw per language so the sample has ``proportions`` (as large as the corpus allows).

    Args:
        chars_by_lang: characters available per language.
        proportions: wanted share per language (normalised here); empty = the natural mix.
        sample_chars: cap on the total.

    Raises:
        ValueError: a language with no text, or proportions not matching the input languages.
    """
    for lang, n in chars_by_lang.items():
        if n == 0:
            raise InvalidInput(f"inputs.{lang}: language {lang!r} has no text")
    if not proportions:
        proportions = dict(chars_by_lang)
    if set(proportions) != set(chars_by_lang):
        raise InvalidInput(f"proportions: languages {sorted(proportions)} must match inputs {sorted(chars_by_lang)}")
    if any(p < 0 for p in proportions.values()) or sum(proportions.values()) <= 0:
        raise InvalidInput(f"proportions: expected non-negative shares with a positive sum, got {proportions}")
    total_p = sum(proportions.values())
    shares = {lang: p / total_p for lang, p in proportions.items()}
    # the largest total whose every language share is available
    total = min([chars_by_lang[lang] / s for lang, s in shares.items() if s > 0] + [float(sample_chars)])
    return {lang: int(total * s) for lang, s in shares.items()}


def sample_documents(
    files_by_lang: dict[str, list[Path]],
    budget: dict[str, int],
    chars_by_lang: dict[str, int],
    *,
    seed: int,
    errors: str,
    drawn: dict[str, int],
) -> Iterator[str]:
    """Stream documents, languages interleaved, each kept with probability budget/available.

    ``drawn`` is filled with the characters actually yielded per language.
    """
    streams = {}
    for lang, files in files_by_lang.items():
        drawn[lang] = 0
        if budget[lang] > 0:
            streams[lang] = iter_language(files, lang, errors=errors)
    while streams:
        for lang in list(streams):
            keep = budget[lang] / chars_by_lang[lang]
            for path, index, doc in streams[lang]:
                if drawn[lang] >= budget[lang]:
                    break
                if keep >= 1 or _doc_unit(seed, lang, path, index) < keep:
                    doc = doc[: budget[lang] - drawn[lang] + 1000]
                    drawn[lang] += len(doc)
                    yield doc
                    break
            else:
                del streams[lang]
                continue
            if drawn[lang] >= budget[lang]:
                del streams[lang]


def count_chars(
    files_by_lang: dict[str, list[Path]], errors: str, stats: dict[str, ReadStats] | None = None
) -> dict[str, int]:
    """Characters per language (one streamed pass); ``stats`` receives each language's read counters."""
    stats = {} if stats is None else stats
    out = {}
    for lang, files in files_by_lang.items():
        stats[lang] = ReadStats()
        out[lang] = sum(len(doc) for _, _, doc in iter_language(files, lang, errors=errors, stats=stats[lang]))
    return out


# ------------------------------------------------------------------------------------------ building


def _prodip_pipeline(tok: Tokenizer, pattern: str) -> Tokenizer:
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return tok


def _with_byte_fallback(trained: Tokenizer, vocab_size: int, extra_merges: list[tuple[str, str]] = ()) -> Tokenizer:
    """Rebuild a trained BPE with ids: specials 0-2, ``<0x00>``..``<0xFF>`` 3-258, then the learned vocab,
    then the tokens of ``extra_merges`` (superwords; the phrase pre-tokeniser is used if there are any)."""
    model = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = {}
    for token in (*SPECIAL_TOKENS, *BYTE_TOKENS):
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
    _prodip_pipeline(tok, PHRASE_PATTERN if n_extra else WORD_PATTERN)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def check_vocab_size(vocab_size: int, kind: str) -> None:
    """Raise ValueError when ``vocab_size`` cannot hold the special tokens plus the base alphabet."""
    need = len(SPECIAL_TOKENS) + 256 + 1
    if vocab_size < need:
        raise InvalidInput(
            f"vocab_size {vocab_size} is too small: the {kind} tokenizer needs "
            f"{len(SPECIAL_TOKENS)} special + 256 byte tokens + at least 1 learned token = {need}"
        )


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


def train_from_iterator(
    texts: Callable[[], Iterator[str]],
    *,
    vocab_size: int,
    kind: str = "prodip",
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    superword_share: float = 0.0,
    progress: bool = False,
) -> Tokenizer:
    """Fit a tokenizer on documents.

    Args:
        texts: zero-argument callable returning an iterator of documents (raw; NFC is applied by the
            tokenizer's normaliser). Called twice when ``superword_share > 0``.
        vocab_size: final vocabulary size in tokens (may come out smaller on a tiny corpus).
        kind: ``"prodip"`` or ``"naive"`` (GPT-2 byte-level BPE, no normaliser).
        superword_share: share of the learned vocabulary given to multi-word tokens (0 = none).
        progress: show the ``tokenizers`` trainer's progress bars (stderr).

    Raises:
        ValueError: ``vocab_size`` too small, unknown ``kind``, ``superword_share`` outside [0, 0.9].
    """
    check_vocab_size(vocab_size, kind)
    specials = [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    if kind == "naive":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=progress,
        )
        tok.train_from_iterator(texts(), trainer=trainer)
        return tok
    if kind != "prodip":
        raise InvalidInput(f"kind must be 'prodip' or 'naive', got {kind!r}")
    if not 0.0 <= superword_share <= 0.9:
        raise InvalidInput(f"superword_share must be in [0, 0.9], got {superword_share}")
    learned = vocab_size - 256  # the byte tokens are added after training
    n_super = int(superword_share * (learned - len(SPECIAL_TOKENS)))
    tok = _prodip_pipeline(Tokenizer(models.BPE()), WORD_PATTERN)
    limit = max(1, min(limit_alphabet, learned - len(SPECIAL_TOKENS)))
    trainer = trainers.BpeTrainer(
        vocab_size=learned - n_super,
        min_frequency=min_frequency,
        special_tokens=specials,
        limit_alphabet=limit,
        initial_alphabet=top_characters(texts, limit) or [],
        show_progress=progress,
    )
    tok.train_from_iterator(texts(), trainer=trainer)
    extra: list[tuple[str, str]] = []
    if n_super:
        stage1 = _with_byte_fallback(tok, vocab_size)
        # ask for 10% more: a merged phrase may already be a stage-1 token and then adds no id
        extra = learn_superwords(
            stage1, texts, int(n_super * 1.1) + 1, min_frequency=max(2, min_frequency), progress=progress
        )
    return _with_byte_fallback(tok, vocab_size, extra)


def save_tokenizer_dir(
    tok: Tokenizer,
    out_dir: str | os.PathLike,
    *,
    model_max_length: int = 2048,
    extra_files: dict[str, str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the tokenizer dir atomically (a sibling temp dir renamed into place).

    Raises:
        FileExistsError: ``out_dir`` already holds a tokenizer and ``overwrite`` is false.
    """
    out = Path(out_dir)
    if (out / "tokenizer.json").exists() and not overwrite:
        raise OutputExists(f"{out}: already holds a tokenizer; choose another out_dir or pass --overwrite true")
    if out.exists() and any(out.iterdir()) and not (out / "tokenizer.json").exists():
        raise OutputExists(f"{out}: exists and is not a tokenizer dir; refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tok.save(str(tmp / "tokenizer.json"))
        names = dict(zip(("pad_token", "bos_token", "eos_token"), SPECIAL_TOKENS))
        config = {
            "format_version": FORMAT_VERSION,
            "tokenizer_class": "PreTrainedTokenizerFast",
            **names,
            "pad_token_id": PAD_ID,
            "bos_token_id": BOS_ID,
            "eos_token_id": EOS_ID,
            "model_max_length": model_max_length,
            "clean_up_tokenization_spaces": False,
            "add_bos_token": False,
            "add_eos_token": False,
        }
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        (tmp / "special_tokens_map.json").write_text(json.dumps(names, indent=2) + "\n", encoding="utf-8")
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def train_tokenizer(cfg: TokenizerTrainConfig) -> Path:
    """``prodip tokenizer train``: sample the corpus, fit, write the tokenizer dir; returns its path.

    Writes ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``, the resolved
    ``train_config.toml`` and ``train_info.json`` (sample characters per language, time, peak memory;
    ``vocab_size`` = the size obtained, ``requested_vocab_size`` = ``cfg.vocab_size``). A corpus with
    fewer merges than requested gives a smaller vocabulary and a warning naming both sizes.

    Raises:
        ValueError: no inputs, a language without text, invalid UTF-8 (strict), bad proportions,
            vocab_size too small. FileNotFoundError: a missing input. FileExistsError: see save.
    """
    check_vocab_size(cfg.vocab_size, cfg.kind)
    if cfg.sample_chars < 1 or cfg.min_frequency < 1:
        raise InvalidInput(
            f"TokenizerTrainConfig.sample_chars and min_frequency must be >= 1, got "
            f"{cfg.sample_chars}, {cfg.min_frequency}"
        )
    if cfg.kind == "prodip" and not 0.0 <= cfg.superword_share <= 0.9:  # before reading the corpus
        raise InvalidInput(f"TokenizerTrainConfig.superword_share must be in [0, 0.9], got {cfg.superword_share}")
    out = Path(cfg.out_dir)
    if (out / "tokenizer.json").exists() and not cfg.overwrite:
        raise OutputExists(f"{out}: already holds a tokenizer; choose another out_dir or pass --overwrite true")
    start = time.perf_counter()
    files = expand_inputs(cfg.inputs)
    read: dict[str, ReadStats] = {}
    chars = count_chars(files, cfg.errors, read)
    skipped = sum(r.skipped_bytes for r in read.values())
    if skipped:
        log.warning(
            "skipping %d undecodable bytes (first at %s)",
            skipped,
            [w for r in read.values() for w in r.skipped_where][:3],
        )
    proportions = {} if cfg.kind == "naive" else cfg.proportions  # the baseline takes the natural mix
    budget = plan_sample(chars, proportions, cfg.sample_chars)
    drawn: dict[str, int] = {}
    log.info("sampling %s characters per language (available %s)", budget, chars)

    def texts() -> Iterator[str]:  # deterministic, so the superword stage sees the same sample
        drawn.clear()
        return sample_documents(files, budget, chars, seed=cfg.seed, errors=cfg.errors, drawn=drawn)

    tok = train_from_iterator(
        texts,
        vocab_size=cfg.vocab_size,
        kind=cfg.kind,
        min_frequency=cfg.min_frequency,
        limit_alphabet=cfg.limit_alphabet,
        superword_share=cfg.superword_share if cfg.kind == "prodip" else 0.0,
        progress=cfg.progress,
    )
    elapsed = time.perf_counter() - start
    obtained = tok.get_vocab_size()
    if obtained < cfg.vocab_size:
        log.warning(
            "requested vocab_size %d but the corpus sample only supports %d tokens (%d merges short; "
            "too little or too uniform text for the requested size); writing the %d-token tokenizer, "
            "its real size is in train_info.json",
            cfg.vocab_size,
            obtained,
            cfg.vocab_size - obtained,
            obtained,
        )
    info = {
        "format_version": FORMAT_VERSION,
        "kind": cfg.kind,
        "vocab_size": obtained,
        "requested_vocab_size": cfg.vocab_size,
        "sample_chars": drawn,
        "available_chars": chars,
        "skipped_bytes": skipped,
        "skipped_where": [w for r in read.values() for w in r.skipped_where][:10],
        "train_s": round(elapsed, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "files": {lang: [str(f) for f in fs] for lang, fs in files.items()},
    }
    extra = {
        "train_config.toml": dump_toml({"tokenizer": to_dict(cfg)}),
        "train_info.json": json.dumps(info, indent=2, ensure_ascii=False) + "\n",
    }
    save_tokenizer_dir(tok, out, model_max_length=cfg.model_max_length, extra_files=extra, overwrite=cfg.overwrite)
    log.info("tokenizer (%s, %d tokens) written to %s in %.1f s", cfg.kind, tok.get_vocab_size(), out, elapsed)
    return out


def train_tokenizer_from_texts(
    texts_by_lang: dict[str, list[str]],
    vocab_size: int,
    out_dir: str | os.PathLike,
    *,
    kind: str = "prodip",
    min_frequency: int = 1,
    superword_share: float = 0.0,
) -> Path:
    """Build a valid tokenizer dir quickly from in-memory text (test fixtures of every package).

    Args:
        texts_by_lang: language -> documents.
        vocab_size: tokens (>= 260); a tiny corpus may give fewer.
        out_dir: where to write (replaced if it holds a tokenizer).

    Returns:
        ``out_dir`` as a Path.
    """

    def texts() -> Iterator[str]:
        for docs in texts_by_lang.values():
            yield from docs

    tok = train_from_iterator(
        texts, vocab_size=vocab_size, kind=kind, min_frequency=min_frequency, superword_share=superword_share
    )
    return save_tokenizer_dir(tok, out_dir, overwrite=True)


# ------------------------------------------------------------------------------------------ loading


def load_tokenizer(tokenizer_dir: str | os.PathLike) -> Tokenizer:
    """Load ``tokenizer.json`` from a tokenizer dir (or an export dir).

    Raises:
        FileNotFoundError: no tokenizer.json (make one with ``prodip tokenizer train``).
        ValueError: the special tokens do not have ids pad=0, bos=1, eos=2.
    """
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise MissingInput(
            f"{path}: not found; train a tokenizer with `prodip tokenizer train --out-dir {tokenizer_dir}`"
        )
    tok = Tokenizer.from_file(str(path))
    for want_id, token in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(token) != want_id:
            raise InvalidInput(f"{path}: {token} has id {tok.token_to_id(token)}, expected {want_id}")
    return tok


def tokenizer_sha256(tokenizer_dir: str | os.PathLike) -> str:
    """sha256 (hex) of the ``tokenizer.json`` bytes: the tokenizer's identity in every later artifact.

    Raises:
        FileNotFoundError: no tokenizer.json.
    """
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise MissingInput(f"{path}: not found; train a tokenizer with `prodip tokenizer train`")
    return file_sha256(path)
