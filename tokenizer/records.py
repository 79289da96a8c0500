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
    #: language -> figures (:func:`prodip.tokenizer.audit.measure`)
    languages: dict[str, dict[str, Any]]
    #: ``train_info.json``'s ``sources`` (absent in audits made before sources were recorded)
    training_sources: list[dict[str, Any]] | None = None
    gate: FertilityGate
    sample: dict[str, Any] | None = None
    sample_warnings: list[str] = Field(default_factory=list)
    baseline: dict[str, Any] | None = None
    parity: dict[str, Any] | None = None
