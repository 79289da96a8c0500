"""The tokenizer dir's records that both its writer modules need: ``fertility.json`` (:class:`FertilityReport`,
written by :func:`prodip.tokenizer.audit.run_audit`) and the tokenizer dir's ``format_version``.

They live apart from :mod:`prodip.tokenizer.audit` (which imports :mod:`prodip.tokenizer.bpe`) so that
:mod:`prodip.tokenizer.bpe` can read them too: ``--overwrite`` refuses to delete a tokenizer dir whose
``fertility.json`` a newer prodip wrote (:func:`prodip.tokenizer.bpe.check_tokenizer_out_dir`).

    python -c "from prodip.tokenizer.records import FertilityReport; print(FertilityReport.READS)"
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, StrictBool, StrictInt

from prodip.base.records import Number, Record, RecordPart

#: the tokenizer dir's format_version: ``train_info.json``'s and ``fertility.json``'s
FORMAT_VERSION = 1
FERTILITY_NAME = "fertility.json"


class FertilityGate(RecordPart):
    """``fertility.json`` ``gate``: the minimum characters per token per language, and the verdict."""

    min_chars_per_token: dict[str, Number] = Field(default_factory=dict)
    passed: StrictBool
    failures: list[str] = Field(default_factory=list)


class LanguageFertility(RecordPart):
    """One language's fertility figures on the held-out text (:func:`prodip.tokenizer.audit.measure`)."""

    chars: StrictInt | None = None
    bytes: StrictInt | None = None
    words: StrictInt | None = None
    tokens: StrictInt | None = None
    chars_per_token: Number | None = None
    bytes_per_token: Number | None = None
    tokens_per_word: Number | None = None
    #: share of tokens that end inside a grapheme cluster, and of byte-fallback tokens
    inside_cluster_share: Number | None = None
    byte_fallback_share: Number | None = None
    #: every held-out document decodes back to itself
    lossless: StrictBool | None = None
    #: characters per pre-token: the most chars/token any vocabulary behind this pre-tokenizer reaches
    chars_per_pretoken: Number | None = None
    #: the language's share of the tokens over its share of the characters
    token_share_over_char_share: Number | None = None


class AuditBaseline(RecordPart):
    """``fertility.json`` ``baseline``: a second tokenizer audited on the same text (``kind`` naive: the
    GPT-2-style baseline; compare: ``[audit] compare_dir``)."""

    kind: str | None = None
    tokenizer_dir: str | None = None
    vocab_size: StrictInt | None = None
    tokenizer_sha256: str | None = None
    languages: dict[str, LanguageFertility] = Field(default_factory=dict)


class FertilityReport(Record):
    """A tokenizer dir's ``fertility.json``: the audit (format_version 1, the tokenizer dir's version).
    Written by :func:`prodip.tokenizer.audit.run_audit` (``prodip tokenizer audit``), read by
    :func:`prodip.tokenizer.audit.read_fertility`."""

    FILE: ClassVar[str] = FERTILITY_NAME
    FORMAT_VERSION: ClassVar[int] = FORMAT_VERSION
    READS: ClassVar[tuple[int, ...]] = (FORMAT_VERSION,)
    MAKER: ClassVar[str] = "`prodip tokenizer audit`"

    tokenizer_sha256: str
    vocab_size: StrictInt
    created_utc: str | None = None
    config: dict[str, Any] | None = None
    #: per language, the held-out files read (a folder's files listed one by one)
    heldout_files: dict[str, list[str]] = Field(default_factory=dict)
    languages: dict[str, LanguageFertility]
    #: ``train_info.json``'s ``sources`` (absent in audits made before sources were recorded)
    training_sources: list[dict[str, Any]] | None = None
    gate: FertilityGate
    sample: dict[str, Any] | None = None
    sample_warnings: list[str] = Field(default_factory=list)
    baseline: AuditBaseline | None = None
    parity: dict[str, Any] | None = None
