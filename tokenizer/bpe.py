"""Train the tokenizer with HF ``tokenizers`` and own the tokenizer dir's layout and special tokens.

The default (``kind = "portable"``) is byte-level BPE behind a standard pre-tokenizer regex that every
on-device runtime prodip exports to reproduces id for id (tokenizer/portable.py: o200k's pattern with
combining marks in its letter classes, so no Bengali vowel sign or virama is cut from its letter), an
NFC normaliser, trained on a sample streamed to per-language proportions (the Bangla-aware part, with
the audit and its gate). ``kind = "custom"`` is the opt-in Bangla-aware regex with superwords that only
``tokenizers`` and transformers(.js) reproduce (tokenizer/custom.py); ``kind = "naive"`` is the
GPT-2-style baseline on the natural (unbalanced) mix.

Special-token convention (one for shards, tokenizer files, exports and servers): ids ``<|pad|>`` 0,
``<|bos|>`` 1, ``<|eos|>`` 2, then the chat markers ``<|im_start|>`` 3 and ``<|im_end|>`` 4
(:data:`prodip.base.chat.CHAT_TOKENS`, reserved by every kind; a tokenizer made before them gets them
appended when it is fine-tuned for chat, :func:`add_chat_tokens`); each document in the shards is ``<|bos|> ids <|eos|>``; ``tokenizer.json``'s
post-processor prepends ``<|bos|>``, so every runtime's default encode starts a prompt with the token that
starts a document in training (an empty prompt is ``[<|bos|>]``); ``tokenizer_config.json`` says
``add_bos_token: true, add_eos_token: false``; the model generates ``<|eos|>`` at a document's end.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, StrictInt
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from prodip.base.chat import CHAT_TEMPLATE, CHAT_TEMPLATE_FILE, CHAT_TOKENS, chat_contract
from prodip.base.cli import progress_bars
from prodip.base.config import dump_toml, to_dict
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import file_sha256, raise_for_room
from prodip.base.records import Number, Record, RecordPart, check_replaceable_dir
from prodip.base.sources import match_sources
from prodip.base.specials import Specials, read_specials
from prodip.tokenizer.config import KINDS, TokenizerTrainConfig
from prodip.tokenizer.corpus import (
    ReadStats,
    expand_inputs,
    iter_language,
)
from prodip.tokenizer.custom import train_custom
from prodip.tokenizer.portable import DEFAULT_PRETOKENIZER, PRETOKENIZERS
from prodip.tokenizer.records import FORMAT_VERSION, FertilityReport
from prodip.tokenizer.wordcounts import (
    ASCII_DIGITS,
    WordCounts,
    corpus_casing,
    corpus_digits,
    count_documents,
    is_wordfreq,
    load_counts,
)

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>")  # ids 0, 1, 2 (fixed by CONTRACTS.md)
#: What a new tokenizer reserves, in id order: the base specials, then the chat markers (ids 3, 4).
RESERVED_TOKENS = SPECIAL_TOKENS + CHAT_TOKENS
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
TRAIN_INFO_FILE = "train_info.json"
#: The files of a tokenizer dir, all that :func:`add_chat_tokens` copies from its source (an HF model folder
#: also holds the weights, no part of a tokenizer): :data:`FILES`, the template transformers 5's
#: ``save_pretrained`` writes apart, a slow tokenizer's vocabulary (``vocab.json`` + ``merges.txt``,
#: ``tokenizer.model``, ``added_tokens.json``), the configs :func:`prodip.base.specials.read_specials` reads
#: the stop ids from (``generation_config.json``, else ``config.json``), and prodip's records of the tokenizer.
TOKENIZER_DIR_FILES = (
    *FILES,
    CHAT_TEMPLATE_FILE,
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "generation_config.json",
    "config.json",
    TRAIN_INFO_FILE,
    FertilityReport.FILE,
)


class TrainSource(RecordPart):
    """One entry of ``train_info.json`` ``sources`` (:meth:`Source.record`): an ``inputs`` or ``word_counts``
    entry of one language with its weight and characters; a word-count table adds ``words``, the shares and,
    for ``wordfreq:LANG``, ``license`` (``license`` SPDX id, ``url``, ``wordlist``, ``attribution``, ...)
    and ``version``. Fields in the order the file has them; those a kind does not write stay unset."""

    language: str
    source: str
    weight: StrictInt = 1
    #: characters of one copy
    available_chars: StrictInt = 0
    #: characters drawn into the sample (all copies)
    sample_chars: StrictInt = 0
    #: ``text`` | ``word_counts``
    kind: str = "text"
    files: list[str] | None = None
    words: StrictInt | None = None
    bare_share: Number | None = None
    capitalised_share: Number | None = None
    license: dict[str, Any] | None = None
    version: str | None = None


class TrainInfo(Record):
    """A tokenizer dir's ``train_info.json`` (format_version 1, the tokenizer dir's version): what
    ``prodip tokenizer train`` sampled and made. Written by :func:`train_tokenizer` (into the tokenizer dir
    before it is renamed into place), read by :func:`read_train_info`.

    Tokenizers made before a field existed lack it (``pretokenizer``, ``requested_vocab_size``,
    ``skipped_*``, ``train_cpu_s``, ``sources``, ``source_records``): those read as their defaults.
    """

    FILE: ClassVar[str] = TRAIN_INFO_FILE
    FORMAT_VERSION: ClassVar[int] = FORMAT_VERSION
    READS: ClassVar[tuple[int, ...]] = (FORMAT_VERSION,)
    MAKER: ClassVar[str] = "`prodip tokenizer train`"

    kind: str
    pretokenizer: str | None = None
    #: the size obtained (a small corpus may give fewer tokens than requested)
    vocab_size: StrictInt
    requested_vocab_size: StrictInt | None = None
    #: language -> characters drawn into the sample
    sample_chars: dict[str, StrictInt] = Field(default_factory=dict)
    #: language -> characters available (all copies of every source)
    available_chars: dict[str, StrictInt] = Field(default_factory=dict)
    skipped_bytes: StrictInt = 0
    skipped_where: list[Any] = Field(default_factory=list)
    #: wall and CPU seconds, peak resident memory (MiB)
    train_s: Number | None = None
    train_cpu_s: Number | None = None
    peak_rss_mb: Number | None = None
    #: language -> text files, each listed once per copy (its weight)
    files: dict[str, list[str]] = Field(default_factory=dict)
    sources: list[TrainSource] = Field(default_factory=list)
    #: the inputs' source records (``prodip.base.sources``' card fields: name, language, license, ...)
    source_records: list[dict[str, Any]] = Field(default_factory=list)

    def training_files(self) -> list[str]:
        """Every text file the tokenizer was trained on (each as often as its weight)."""
        return [f for fs in self.files.values() for f in fs]

    def sources_as_dicts(self) -> list[dict[str, Any]] | None:
        """``sources`` as the JSON objects the file holds (for ``fertility.json``'s ``training_sources``), or
        None for a tokenizer made before sources were recorded."""
        if "sources" not in self.model_fields_set:
            return None
        return [s.model_dump(mode="python", exclude_unset=True) for s in self.sources]


def read_train_info(tokenizer_dir: str | os.PathLike) -> TrainInfo | None:
    """``tokenizer_dir/train_info.json`` as a record, or None when the dir has none (a tokenizer not made by
    ``prodip tokenizer train``: a test fixture's, or one copied from elsewhere).

    Raises:
        RecordError (ValueError): the file is there but damaged, of another format_version (named), or a field
            is missing or mistyped (file and field named).
    """
    path = Path(tokenizer_dir) / TRAIN_INFO_FILE
    return TrainInfo.read(path) if path.is_file() else None


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


@dataclass
class Source:
    """One entry of ``inputs`` or ``word_counts``: its documents, characters and weight.

    ``files`` (text) or ``table`` (word counts) is set; ``chars`` is one copy's characters and the
    sample sees ``weight`` consecutive copies, so a weight of 2 is the entry listed twice.
    """

    lang: str
    name: str
    weight: int = 1
    files: list[Path] | None = None
    table: WordCounts | None = None
    chars: int = 0
    stats: ReadStats | None = None
    read_options: dict[str, Any] | None = None  # iter_language's text_field and doc_chars, as `data prepare`'s
    bare_share: float = 0.0  # tables: share of each word's count without its leading space
    capitalised_share: float = 0.0  # tables: share of a lower-case word's count capitalised

    def documents(self, errors: str) -> Iterator[tuple[Path, int, str]]:
        """``(key, index, document)``: the key and index seed the per-document sampling draw."""
        if self.table is not None:
            key = Path(self.name)
            docs = count_documents(
                self.table.counts, bare_share=self.bare_share, capitalised_share=self.capitalised_share
            )
            yield from ((key, i, doc) for i, doc in enumerate(docs))
        else:
            yield from iter_language(self.files or [], self.lang, errors=errors, **(self.read_options or {}))

    def record(self, drawn: int) -> dict:
        """This source in ``train_info.json`` / ``fertility.json``: characters available (one copy) and drawn."""
        out = {"language": self.lang, "source": self.name, "weight": self.weight, "available_chars": self.chars}
        out["sample_chars"] = drawn
        if self.table is not None:
            out.update(kind="word_counts", words=len(self.table.counts))
            out.update(bare_share=self.bare_share, capitalised_share=self.capitalised_share)
            if self.table.license:
                out.update(license=self.table.license, version=self.table.version)
        else:
            out.update(kind="text", files=[str(f) for f in self.files or []])
        return out


def build_sources(
    inputs: dict[str, list[str]],
    word_counts: dict[str, list[str]],
    weights: dict[str, int],
    *,
    errors: str,
    wordfreq_chars: int,
    read_options: dict[str, Any] | None = None,
    bare_share: dict[str, float] | None = None,
    capitalised_share: dict[str, float] | None = None,
) -> dict[str, list[Source]]:
    """Resolve the text inputs and word-count tables into sources per language, counting their characters.
    ``read_options``: :func:`iter_language`'s ``text_field`` and ``doc_chars`` for the text sources;
    ``bare_share``, ``capitalised_share``: language -> share of a table's word occurrences without the
    leading space, and capitalised.

    A ``wordfreq:LANG`` table takes its casing and its digits from that language's text sources (one
    extra pass).

    Raises:
        InvalidInput: a weight naming no source, or a weight < 1; a bare or capitalised share outside
            [0, 1] or for a language without word_counts; see ``expand_inputs`` and ``wordcounts.load_counts`` for the
            inputs' own errors.
    """
    for option, shares in (("bare_share", bare_share), ("capitalised_share", capitalised_share)):
        for lang, share in (shares or {}).items():
            if lang not in word_counts:
                raise InvalidInput(
                    f"{option}.{lang}: {lang!r} has no word_counts table (languages: {sorted(word_counts)})"
                )
            if not 0.0 <= share <= 1.0:
                raise InvalidInput(f"{option}.{lang}: {share} must be a share in [0, 1]")
    names = {str(p) for ps in inputs.values() for p in ([ps] if isinstance(ps, str) else ps)}
    names |= {str(p) for ps in word_counts.values() for p in ps}
    for name, w in weights.items():
        if name not in names:
            raise InvalidInput(
                f"weights.{name}: not a source; sources are the entries of inputs and word_counts: {sorted(names)}"
            )
        if w < 1:
            raise InvalidInput(f"weights.{name}: {w} must be an integer >= 1 (remove the source to leave it out)")
    if not inputs:
        expand_inputs(inputs)  # raises, naming the expected form
    out: dict[str, list[Source]] = {}
    for lang, paths in inputs.items():
        for p in [paths] if isinstance(paths, str) else paths:
            files = expand_inputs({lang: [p]})[lang]
            src = Source(
                lang, str(p), weights.get(str(p), 1), files=files, stats=ReadStats(), read_options=read_options
            )
            docs = iter_language(files, lang, errors=errors, stats=src.stats, **(read_options or {}))
            src.chars = sum(len(doc) for _, _, doc in docs)
            out.setdefault(lang, []).append(src)
    for lang, entries in word_counts.items():
        casing, digits = None, ASCII_DIGITS
        if any(is_wordfreq(e) for e in entries) and out.get(lang):
            texts = [doc for s in out[lang] for _, _, doc in s.documents(errors)]
            casing, digits = corpus_casing(texts), corpus_digits(texts)
        for e in entries:
            table = load_counts(str(e), lang, wordfreq_chars=wordfreq_chars, casing=casing, digits=digits)
            src = Source(lang, str(e), weights.get(str(e), 1), table=table, chars=table.chars())
            src.bare_share = (bare_share or {}).get(lang, 0.0)
            src.capitalised_share = (capitalised_share or {}).get(lang, 0.0)
            out.setdefault(lang, []).append(src)
    return out


def sample_documents(
    sources: dict[str, list[Source]],
    budget: dict[str, int],
    chars_by_lang: dict[str, int],
    *,
    seed: int,
    errors: str,
    drawn: dict[str, int],
    drawn_by_source: dict[tuple[str, int], int] | None = None,
) -> Iterator[str]:
    """Stream documents, languages interleaved, each kept with probability budget/available.

    Each source is read ``weight`` times in a row (both copies of a document get the same draw,
    as when the source is listed twice). ``drawn`` is filled with the characters actually yielded
    per language, ``drawn_by_source`` per ``(language, index of the source in sources[language])``.
    """

    def stream(lang: str) -> Iterator[tuple[int, Path, int, str]]:
        for k, src in enumerate(sources[lang]):
            for _ in range(src.weight):
                for key, index, doc in src.documents(errors):
                    yield k, key, index, doc

    by_source = {} if drawn_by_source is None else drawn_by_source
    by_source.clear()
    streams = {}
    for lang in sources:
        drawn[lang] = 0
        by_source.update({(lang, k): 0 for k in range(len(sources[lang]))})
        if budget[lang] > 0:
            streams[lang] = stream(lang)
    while streams:
        for lang in list(streams):
            keep = budget[lang] / chars_by_lang[lang]
            for k, key, index, doc in streams[lang]:
                if drawn[lang] >= budget[lang]:
                    break
                if keep >= 1 or _doc_unit(seed, lang, key, index) < keep:
                    doc = doc[: budget[lang] - drawn[lang] + 1000]
                    drawn[lang] += len(doc)
                    by_source[(lang, k)] += len(doc)
                    yield doc
                    break
            else:
                del streams[lang]
                continue
            if drawn[lang] >= budget[lang]:
                del streams[lang]


# ------------------------------------------------------------------------------------------ building


def _byte_level(pre_tokenizer) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    return tok


def _byte_level_trainer(vocab_size: int, min_frequency: int, progress: bool) -> trainers.BpeTrainer:
    return trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in RESERVED_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress_bars(progress),
    )


def portable_pipeline(pretokenizer: str = DEFAULT_PRETOKENIZER) -> Tokenizer:
    """An untrained portable tokenizer: NFC, ``Split(regex) + ByteLevel(use_regex=false)``, ByteLevel decoder.

    The pre-tokenizer is written as HF's conversions of tiktoken/Llama-3 tokenizers write it, the form
    onnxruntime-extensions, transformers.js and ExecuTorch read (tokenizer/portable.py checks it).

    Raises:
        InvalidInput: unknown ``pretokenizer`` (the message lists the known ones).
    """
    if pretokenizer not in PRETOKENIZERS:
        raise InvalidInput(f"pretokenizer {pretokenizer!r} is not one of {', '.join(PRETOKENIZERS)}")
    split = pre_tokenizers.Split(Regex(PRETOKENIZERS[pretokenizer].regex), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    tok = _byte_level(pre_tokenizers.Sequence([split, byte_level]))
    tok.normalizer = normalizers.NFC()
    return tok


def with_bos_convention(tok: Tokenizer) -> Tokenizer:
    """Set the post-processor that prepends ``<|bos|>`` (pairs: ``<|bos|> A <|bos|> B``), in place.

    Every runtime's default encode then starts a prompt with the token that starts each document in
    the shards (``encode("")`` is ``[<|bos|>]``).
    """
    bos = SPECIAL_TOKENS[BOS_ID]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, BOS_ID)]
    )
    return tok


def check_vocab_size(vocab_size: int, kind: str) -> None:
    """Raise InvalidInput when ``vocab_size`` cannot hold the special tokens plus the 256 byte tokens."""
    need = len(RESERVED_TOKENS) + 256 + 1
    if vocab_size < need:
        raise InvalidInput(
            f"vocab_size {vocab_size} is too small: the {kind} tokenizer needs "
            f"{len(RESERVED_TOKENS)} special + 256 byte tokens + at least 1 learned token = {need}"
        )


def train_from_iterator(
    texts: Callable[[], Iterator[str]],
    *,
    vocab_size: int,
    kind: str = "portable",
    pretokenizer: str = DEFAULT_PRETOKENIZER,
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
    superword_share: float = 0.0,
    progress: bool = False,
) -> Tokenizer:
    """Fit a tokenizer on documents; its post-processor prepends ``<|bos|>`` (:func:`with_bos_convention`).

    Args:
        texts: zero-argument callable returning an iterator of documents (raw; the tokenizer's NFC
            normaliser applies). Called more than once by the custom kind.
        vocab_size: final vocabulary size in tokens (may come out smaller on a tiny corpus).
        kind: one of :data:`KINDS` (see :class:`TokenizerTrainConfig`).
        pretokenizer: the portable kind's regex, a name in ``portable.PRETOKENIZERS``.
        min_frequency: minimum pair count for a merge.
        limit_alphabet: custom kind only (see tokenizer/custom.py).
        superword_share: custom kind only: share of the learned vocabulary given to multi-word tokens.
        progress: show the ``tokenizers`` trainer's progress bars (stderr).

    Raises:
        InvalidInput: ``vocab_size`` too small, unknown ``kind`` or ``pretokenizer``, superwords asked
            of a kind other than custom, ``superword_share`` outside [0, 0.9].
    """
    check_vocab_size(vocab_size, kind)
    if kind not in KINDS:
        raise InvalidInput(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not 0.0 <= superword_share <= 0.9:
        raise InvalidInput(f"superword_share must be in [0, 0.9], got {superword_share}")
    if superword_share and kind != "custom":
        raise InvalidInput(
            f"superword_share {superword_share}: multi-word tokens exist only for kind = 'custom' "
            "(no runtime but tokenizers reproduces them); set superword_share = 0"
        )
    if kind == "custom":
        tok = train_custom(
            texts,
            vocab_size=vocab_size,
            special_tokens=RESERVED_TOKENS,
            min_frequency=min_frequency,
            limit_alphabet=limit_alphabet,
            superword_share=superword_share,
            progress=progress,
        )
        return with_bos_convention(tok)
    if kind == "naive":
        tok = _byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        tok = portable_pipeline(pretokenizer)
    tok.train_from_iterator(texts(), trainer=_byte_level_trainer(vocab_size, min_frequency, progress))
    return with_bos_convention(tok)


def tokenizer_config(model_max_length: int = 2048, *, chat_tokens: bool = True) -> dict:
    """``tokenizer_config.json``: the special tokens, their ids and the BOS convention.

    ``add_bos_token: true`` is what transformers, onnxruntime-extensions and lm-evaluation-harness read
    to put ``<|bos|>`` in front of a prompt (the post-processor in tokenizer.json does the same for
    ``tokenizers`` and transformers.js); ``add_eos_token: false``: a prompt does not end a document.
    ``additional_special_tokens`` lists the chat markers (when the tokenizer has them), so transformers
    keeps them whole and ``skip_special_tokens`` drops them. No ``chat_template`` here: a tokenizer
    is a chat tokenizer only once a model was fine-tuned for chat with it (:func:`add_chat_tokens`).
    """
    names = dict(zip(("pad_token", "bos_token", "eos_token"), SPECIAL_TOKENS))
    extra = {"additional_special_tokens": list(CHAT_TOKENS)} if chat_tokens else {}
    return {
        "format_version": FORMAT_VERSION,
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": True,
        "add_eos_token": False,
        **extra,
    }


def check_tokenizer_out_dir(out: Path, overwrite: bool, *, option: str = "--overwrite true") -> bool:
    """May the tokenizer dir ``out`` be (re)written? (:func:`prodip.base.records.check_replaceable_dir`).

    Returns:
        True when ``out`` holds an earlier tokenizer that will be replaced; False when absent or empty.
    Raises:
        FileExistsError (``OutputExists``, nothing deleted): ``out`` already holds a tokenizer and ``overwrite``
            is false; is not empty and holds no ``tokenizer.json``; holds a ``train_info.json`` (the tokenizer
            dir's version) or ``fertility.json`` written by a newer prodip (the file and its format_version
            named); or is a file or a symbolic link.
    """
    return check_replaceable_dir(
        out,
        what="tokenizer dir",
        marker="tokenizer.json",
        holds="a tokenizer",
        records=[TrainInfo, FertilityReport],
        replace=overwrite,
        option=option,
    )


def save_tokenizer_dir(
    tok: Tokenizer,
    out_dir: str | os.PathLike,
    *,
    model_max_length: int = 2048,
    extra_files: dict[str, str | Record] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the tokenizer dir atomically (a sibling temp dir renamed into place).

    ``extra_files``: file name -> text, or a record (written by its :meth:`Record.write`).

    Raises:
        FileExistsError: see :func:`check_tokenizer_out_dir` (nothing is deleted then).
    """
    out = Path(out_dir)
    check_tokenizer_out_dir(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        tok.save(str(tmp / "tokenizer.json"))
        chat = all(tok.token_to_id(t) is not None for t in CHAT_TOKENS)
        config = tokenizer_config(model_max_length, chat_tokens=chat)
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        keys = ("pad_token", "bos_token", "eos_token", "additional_special_tokens")
        names = {k: config[k] for k in keys if k in config}
        (tmp / "special_tokens_map.json").write_text(json.dumps(names, indent=2) + "\n", encoding="utf-8")
        for name, content in (extra_files or {}).items():
            if isinstance(content, Record):
                content.write(tmp / name)
            else:
                (tmp / name).write_text(content, encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except Exception as err:
        raise_for_room(err, tmp, shown_as=out)  # a full disk: one line naming the file
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process, all its threads (the trainer's Rayon pool included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
        prodip.base.sources.LicenseGateError: an input whose licence is unknown or unrecorded and not in
            ``include_unknown_license`` (before any text is read).
    """
    check_vocab_size(cfg.vocab_size, cfg.kind)
    if cfg.sample_chars < 1 or cfg.min_frequency < 1:
        raise InvalidInput(
            f"TokenizerTrainConfig.sample_chars and min_frequency must be >= 1, got "
            f"{cfg.sample_chars}, {cfg.min_frequency}"
        )
    if not 0.0 <= cfg.superword_share <= 0.9:  # before reading the corpus
        raise InvalidInput(f"TokenizerTrainConfig.superword_share must be in [0, 0.9], got {cfg.superword_share}")
    if cfg.superword_share and cfg.kind != "custom":
        raise InvalidInput(
            f"TokenizerTrainConfig.superword_share = {cfg.superword_share} needs kind = 'custom' (got "
            f"{cfg.kind!r}): multi-word tokens are reproduced by no runtime but tokenizers"
        )
    out = Path(cfg.out_dir)
    check_tokenizer_out_dir(out, cfg.overwrite)  # before the corpus is read (save checks again)
    start, cpu_start = time.perf_counter(), _cpu_s()
    text_files = expand_inputs(cfg.inputs) if cfg.inputs else {}
    count_files = {
        lang: [Path(e) for e in entries if not is_wordfreq(e) and Path(e).is_file()]  # missing: named below
        for lang, entries in cfg.word_counts.items()
    }
    matched = match_sources(  # the licence gate, before any text is read (wordfreq:LANG: see its option)
        {
            lang: text_files.get(lang, []) + count_files.get(lang, [])
            for lang in dict.fromkeys([*text_files, *count_files])
        },
        cfg.sources,
        cfg.include_unknown_license,
        what="tokenizer.inputs",
    )
    sources = build_sources(
        cfg.inputs,
        cfg.word_counts,
        cfg.weights,
        errors=cfg.errors,
        wordfreq_chars=cfg.wordfreq_chars,
        bare_share=cfg.bare_share,
        capitalised_share=cfg.capitalised_share,
        read_options={"text_field": cfg.text_field, "doc_chars": cfg.doc_chars},  # as `data prepare` reads them
    )
    read = [s.stats for ss in sources.values() for s in ss if s.stats is not None]
    chars = {lang: sum(s.chars * s.weight for s in ss) for lang, ss in sources.items()}
    skipped = sum(r.skipped_bytes for r in read)
    if skipped:
        log.warning(
            "skipping %d undecodable bytes (first at %s)", skipped, [w for r in read for w in r.skipped_where][:3]
        )
    proportions = {} if cfg.kind == "naive" else cfg.proportions  # the baseline takes the natural mix
    budget = plan_sample(chars, proportions, cfg.sample_chars)
    drawn: dict[str, int] = {}
    by_source: dict[tuple[str, int], int] = {}
    log.info("sampling %s characters per language (available %s)", budget, chars)

    def texts() -> Iterator[str]:  # deterministic, so the superword stage sees the same sample
        drawn.clear()
        return sample_documents(
            sources, budget, chars, seed=cfg.seed, errors=cfg.errors, drawn=drawn, drawn_by_source=by_source
        )

    tok = train_from_iterator(
        texts,
        vocab_size=cfg.vocab_size,
        kind=cfg.kind,
        pretokenizer=cfg.pretokenizer,
        min_frequency=cfg.min_frequency,
        limit_alphabet=cfg.limit_alphabet,
        superword_share=cfg.superword_share,
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
    info = {  # the record validates it (a field this code forgot to fill in is a bug named here)
        "format_version": FORMAT_VERSION,
        "kind": cfg.kind,
        "pretokenizer": cfg.pretokenizer if cfg.kind == "portable" else None,
        "vocab_size": obtained,
        "requested_vocab_size": cfg.vocab_size,
        "sample_chars": drawn,
        "available_chars": chars,
        "skipped_bytes": skipped,
        "skipped_where": [w for r in read for w in r.skipped_where][:10],
        "train_s": round(elapsed, 2),
        "train_cpu_s": round(_cpu_s() - cpu_start, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "files": {
            lang: [str(f) for s in ss for f in s.files or [] for _ in range(s.weight)] for lang, ss in sources.items()
        },
        "sources": [s.record(by_source[(lang, k)]) for lang, ss in sources.items() for k, s in enumerate(ss)],
        "source_records": [rec.card_fields() for rec, _ in matched.values()],
    }
    extra: dict[str, str | Record] = {
        "train_config.toml": dump_toml({"tokenizer": to_dict(cfg)}),
        TRAIN_INFO_FILE: TrainInfo.from_dict(info, out / TRAIN_INFO_FILE),
    }
    save_tokenizer_dir(tok, out, model_max_length=cfg.model_max_length, extra_files=extra, overwrite=cfg.overwrite)
    log.info("tokenizer (%s, %d tokens) written to %s in %.1f s", cfg.kind, tok.get_vocab_size(), out, elapsed)
    return out


def train_tokenizer_from_texts(
    texts_by_lang: dict[str, list[str]],
    vocab_size: int,
    out_dir: str | os.PathLike,
    *,
    kind: str = "portable",
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
        InvalidInput: an imported model's tokenizer (none of prodip's special tokens), the special
            tokens do not have ids pad=0, bos=1, eos=2, or the post-processor
            does not prepend ``<|bos|>`` (the special-token convention in the module docstring).
    """
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise MissingInput(
            f"{path}: not found; train a tokenizer with `prodip tokenizer train --out-dir {tokenizer_dir}`"
        )
    tok = Tokenizer.from_file(str(path))
    if all(tok.token_to_id(t) is None for t in SPECIAL_TOKENS):
        raise InvalidInput(
            f"{path}: an imported model's own tokenizer (none of {', '.join(SPECIAL_TOKENS)}) where prodip's is "
            "expected (shards, training, eval, sft and `prodip export FOLDER` read it with its own special "
            "tokens: docs/adapt.md)"
        )
    for want_id, token in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(token) != want_id:
            raise InvalidInput(f"{path}: {token} has id {tok.token_to_id(token)}, expected {want_id}")
    if tok.encode("").ids != [BOS_ID]:
        raise InvalidInput(
            f"{path}: its post-processor does not prepend {SPECIAL_TOKENS[BOS_ID]} (encode('') gives "
            f"{tok.encode('').ids}, expected [{BOS_ID}]): made before the special-token convention; "
            "re-run `prodip tokenizer train`"
        )
    return tok


def load_with_specials(tokenizer_dir: str | os.PathLike) -> tuple[Tokenizer, Specials]:
    """A tokenizer dir's tokenizer and its special-token convention, for shards and evaluation.

    A prodip tokenizer (it has ``<|pad|>``, ``<|bos|>`` or ``<|eos|>``) is held to prodip's convention
    (:func:`load_tokenizer`): bos 1 prepended, eos 2, pad 0. Any other ``tokenizer.json`` (an imported
    Hugging Face model's, or one extended from it) has its own, read from its files by
    :func:`prodip.base.specials.read_specials`: its bos only where its post-processor prepends one.

    Raises:
        MissingInput: no tokenizer.json. InvalidInput: see :func:`load_tokenizer` and
            :func:`prodip.base.specials.read_specials`.
    """
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        return load_tokenizer(tokenizer_dir), read_specials(tokenizer_dir)  # raises MissingInput naming the file
    tok = Tokenizer.from_file(str(path))
    if any(tok.token_to_id(t) is not None for t in SPECIAL_TOKENS):
        return load_tokenizer(tokenizer_dir), Specials(
            BOS_ID, EOS_ID, PAD_ID, (EOS_ID,), True, str(tokenizer_dir), EOS_ID
        )
    return tok, read_specials(tokenizer_dir)


def document_end_id(tok: Tokenizer, specials: Specials) -> int:
    """The id that ends each document in shards: prodip's ``<|eos|>``; for another tokenizer its end-of-text
    token (``specials.document_end_id``, :data:`prodip.base.specials.DOCUMENT_END_TOKENS`) when it has one,
    else its ``eos_token``. An instruct model's ``eos_token`` is its end of turn (SmolLM2's ``<|im_end|>``,
    Llama 3's ``<|eot_id|>``), which would teach continued pretraining to end every document as a chat reply
    ends."""
    if tok.token_to_id(SPECIAL_TOKENS[EOS_ID]) == EOS_ID:
        return EOS_ID
    return specials.document_end_id


def tokenizer_sha256(tokenizer_dir: str | os.PathLike) -> str:
    """sha256 (hex) of the ``tokenizer.json`` bytes: the tokenizer's identity in every later artifact.

    Raises:
        FileNotFoundError: no tokenizer.json.
    """
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise MissingInput(f"{path}: not found; train a tokenizer with `prodip tokenizer train`")
    return file_sha256(path)


def add_chat_tokens(src_dir: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Copy a tokenizer dir to ``out_dir`` as a chat tokenizer: the chat markers present, the template set.

    The markers (:data:`prodip.base.chat.CHAT_TOKENS`) a tokenizer lacks (one made before they were
    reserved) are appended as special tokens after its last id; ``tokenizer.json`` is rewritten only
    then, so a tokenizer that has them keeps its bytes (and its sha256: shards encoded with it stay
    valid). ``tokenizer_config.json`` gets ``additional_special_tokens`` and ``"chat_template"`` =
    :data:`prodip.base.chat.CHAT_TEMPLATE` (the mark of a chat model that export carries into every
    artifact); ``special_tokens_map.json`` lists the markers. The source's other tokenizer files
    (:data:`TOKENIZER_DIR_FILES`) are copied as they are; nothing else (an HF folder's weights stay there).
    Written to a sibling temp dir and renamed into place (an existing tokenizer in ``out_dir`` is replaced;
    any other non-empty folder, or a tokenizer of a newer prodip, is refused: :func:`check_tokenizer_out_dir`).

    An imported model's tokenizer (none of prodip's special tokens) is copied unchanged: it keeps its own
    chat template and markers, which it must have (an instruct model's folder).

    Args:
        src_dir: a tokenizer dir with prodip's special-token convention (:func:`load_tokenizer`), or an
            imported model's with a ``chat_template`` (:func:`prodip.base.chat.chat_contract`).
        out_dir: where the chat tokenizer goes (e.g. a fine-tuning run's ``tokenizer/``).
    Returns:
        ``{"added": [tokens appended], "ids": {token: id}, "vocab_size": tokens after}``.
    Raises:
        FileNotFoundError, InvalidInput: see :func:`load_tokenizer`.
        FileExistsError: ``out_dir`` is not a tokenizer dir, or one of a newer prodip (nothing deleted).
    """
    src, out = Path(src_dir), Path(out_dir)
    tok = load_with_specials(src)[0]
    imported = all(tok.token_to_id(t) is None for t in SPECIAL_TOKENS)
    if imported and chat_contract(src) is None:
        raise InvalidInput(
            f"{src / 'tokenizer_config.json'}: an imported model's tokenizer without a chat_template; fine-tuning "
            "it for chat uses its own template (start from an instruct model's folder)"
        )
    check_tokenizer_out_dir(out, True, option="fine-tuning")
    missing = [] if imported else [t for t in CHAT_TOKENS if tok.token_to_id(t) is None]
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for name in TOKENIZER_DIR_FILES:
            if (src / name).is_file():
                shutil.copy2(src / name, tmp / name)
        if missing:
            tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in missing])
            tok.save(str(tmp / "tokenizer.json"))
        if imported:  # its own template and markers, copied as they are
            if out.exists():
                shutil.rmtree(out)
            os.replace(tmp, out)
            return {"added": [], "ids": {}, "vocab_size": tok.get_vocab_size()}
        path = tmp / "tokenizer_config.json"
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else tokenizer_config()
        listed = [t for t in config.get("additional_special_tokens") or [] if t not in CHAT_TOKENS]
        config["additional_special_tokens"] = [*listed, *CHAT_TOKENS]
        config["chat_template"] = CHAT_TEMPLATE
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        path = tmp / "special_tokens_map.json"
        names = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        names.update({k: config[k] for k in ("pad_token", "bos_token", "eos_token") if k in config})
        names["additional_special_tokens"] = config["additional_special_tokens"]
        path.write_text(json.dumps(names, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"added": missing, "ids": {t: tok.token_to_id(t) for t in CHAT_TOKENS}, "vocab_size": tok.get_vocab_size()}
