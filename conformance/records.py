"""The conformance stage's record: ``report.json`` (:class:`ConformanceReport`), owner of its layout
(CONTRACTS.md "Conformance report"); written by :func:`prodip.conformance.report.write_report` (with
``report.md``), read by :func:`read_report`. The verdict conformance writes into the export's manifest is
declared in :mod:`prodip.base.verdict`. Layout of report.json::

    {format_version: 1, entry, passed, variants: {name: bool}, export_dir, export_manifest_sha256
     (before the verdict was written), export_files_sha256 (of the manifest's files table),
     checkpoint: {path, step, model_sha256}, tolerances_file, tolerances_sha256,
     tolerances: {path, sha256, shipped (byte-identical to conformance/tolerances.toml),
                  loosened: [{table, metric, shipped, used}] (bounds looser than the shipped ones,
                  over the tables this run gated)}, config, versions,
     model, inputs, reference, global: {metrics, checks, passed},
     candidates: {name: {variant, kind, path, metrics, errors, checks: [{metric, value, tolerance,
                  passed}], passed, seconds}}, seconds}

Non-finite numbers are written as the strings "inf", "-inf", "nan" (strict JSON).

    python -c "from prodip.conformance.records import read_report; print(read_report('runs/demo/export/conformance').passed)"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from pydantic import StrictBool

from prodip.base.records import Record

REPORT_FILE = "report.json"
FORMAT_VERSION = 1


class ConformanceReport(Record):
    """``report.json`` (format_version 1; layout in the module docstring). Written by
    :func:`prodip.conformance.report.write_report` only; read by :func:`read_report`. The fields every reader needs are typed; the rest (checkpoint,
    tolerances, config, versions, model, inputs, reference, global, chat, runtimes, candidates, ...) follow
    in the order the suite writes them."""

    FILE: ClassVar[str] = REPORT_FILE
    FORMAT_VERSION: ClassVar[int] = FORMAT_VERSION
    READS: ClassVar[tuple[int, ...]] = (FORMAT_VERSION,)
    MAKER: ClassVar[str] = "`prodip conformance EXPORT_DIR`"
    ALLOW_NAN: ClassVar[bool] = (
        False  # non-finite numbers are written as strings (``prodip.conformance.report._clean``)
    )

    entry: str | None = None
    passed: StrictBool
    variants: dict[str, StrictBool]
    export_dir: str | None = None
    #: sha256 of the export's manifest.json before the verdict was written
    export_manifest_sha256: str | None = None
    #: ``prodip.base.manifest.files_table_sha256`` of the files table measured
    export_files_sha256: str


def read_report(path: str | os.PathLike) -> ConformanceReport:
    """A conformance ``report.json`` (a path to the file, or to the folder holding it) as a record.

    Raises:
        FileNotFoundError: no report. ValueError: not a conformance report (file and field named).
    """
    path = Path(path)
    return ConformanceReport.read(path / REPORT_FILE if path.is_dir() else path)
