"""The card's speed table: each checked variant timed in each runtime that runs it, on the exporting machine.

``prodip conformance`` (after its checks) times greedy generation of every ONNX, GGUF and ExecuTorch variant in
each runtime whose row in the runtime table is ``timed`` (``prodip.base.runtimes.RUNTIMES``: ONNX Runtime,
onnxruntime-genai, transformers.js in Node, the export's web page in Chromium on WASM, llama.cpp, ExecuTorch), on
the variants of the row's ``formats``, each inside its own runtime (``time_generation`` of its adapter;
:mod:`prodip.conformance.runtimes.timing` defines the figures: time to first token and decode tokens/s, medians of
``speed_rounds`` rounds after one warm-up). It writes them to ``speed.json`` beside ``report.json``
(:class:`SpeedReport`, this module its one owner) with the machine named, and the card renders them
(:func:`render_speed`) under the quality card, in the table's order. :func:`timers` is one loop over the table: a
row added with a timing adapter is timed, written and rendered with no edit here. Layout of speed.json::

    {format_version: 1, export_files_sha256,
     machine: {cpu, cores, os, python},
     settings: {prompt_tokens, new_tokens, rounds, warmup_rounds, threads (0 = each runtime's default)},
     rows: [{runtime, variant, decode_tokens_per_s, ttft_s, rounds, new_tokens, threads, version, earlier?}],
     failed: [{runtime, variant, error, earlier?}], skipped: {runtime: reason}, runtime_seconds: {runtime: s}, seconds,
     not_timed: [{runtime, variant, reason}]}

``runtime`` is the row's name (``transformers.js-browser``: the page on WASM), the card shows its label. An on-device
row not chosen by ``--runtimes`` (nor its ``timed_with`` row: the page is timed when ``onnxruntime-web``, the WASM
build it loads, is chosen, as it is by default), a runtime not installed, or one with no variant of its format is in
``skipped`` with the reason; a variant that failed in a runtime is in ``failed``.

A run on some variants or runtimes (``--variants int4,int8``, ``--runtimes onnxruntime-web``) is merged into the
previous speed.json (:func:`merge_speed`), by the rule the manifest verdict (``merge_verdict``) and the quality card
follow: a row or failure this run did not time again is kept, marked ``earlier``, when the previous record belongs
to the same export files (equal ``export_files_sha256``), and, since the card states one machine and one set of
settings for the whole table, was measured on the same machine with the same settings; a row timed again is
replaced. A variant of a runtime that ran but has no figure then is in ``not_timed`` with the reason.

    python -c "from prodip.conformance.speed import SpeedReport; print(SpeedReport.read('runs/demo/export/conformance/speed.json').rows[0])"
"""

from __future__ import annotations

import logging
import math
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Optional

from pydantic import Field, StrictInt

from prodip.base.errors import MissingInput
from prodip.base.records import Record, RecordError, RecordPart
from prodip.base.runtimes import Runtime, by_name, runtime_names
from prodip.conformance.runtimes.adapters import adapter_for
from prodip.conformance.runtimes.common import RuntimeAdapter, error_text
from prodip.conformance.runtimes.timing import SpeedJob, Timing

logger = logging.getLogger(__name__)

SPEED_FILE = "speed.json"
SPEED_HEADING = "## Speed"
#: the card's mark of a row kept from an earlier run (:func:`merge_speed`)
EARLIER_MARK = "‡"

#: A figure of a row: a positive finite number.
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


def timers() -> list[tuple[Runtime, RuntimeAdapter]]:
    """Each ``timed`` row of the runtime table with its adapter, in the table's order (the card's order), read at
    call time (a test may add a row and its adapter).

    Raises:
        KeyError: a timed row with no adapter in ``prodip.conformance.runtimes.adapters.ADAPTERS``.
    """
    return [(by_name(name), adapter_for(name)) for name in runtime_names(timed=True)]


def runtime_label(name: str) -> str:
    """The card's name of a timed runtime: its row's label (``ONNX Runtime``, ``transformers.js (Node)``,
    ``transformers.js (Chromium, WASM)``); a name no row has (a record from an older table) as it is."""
    try:
        return by_name(name).card_label
    except KeyError:
        return name


class Machine(RecordPart):
    """The machine the figures were measured on."""

    #: CPU model (``/proc/cpuinfo`` ``model name``; elsewhere ``platform.processor()``)
    cpu: str
    #: logical CPUs (``os.cpu_count()``)
    cores: StrictInt
    #: ``platform.platform()``
    os: str
    python: str


class SpeedSettings(RecordPart):
    """How every row was measured."""

    prompt_tokens: StrictInt = Field(gt=0)
    new_tokens: StrictInt = Field(ge=2)
    rounds: StrictInt = Field(gt=0)
    warmup_rounds: StrictInt = Field(ge=0)
    #: CPU threads each runtime was asked to use (0 = each runtime's own default)
    threads: StrictInt = Field(ge=0)


class SpeedRow(RecordPart):
    """One variant in one runtime: medians over the rounds."""

    #: the runtime's row name in ``prodip.base.runtimes.RUNTIMES`` (the card shows its label)
    runtime: str
    variant: str
    #: new tokens after the first per second, median over the rounds
    decode_tokens_per_s: Positive
    #: generate call to the first new token (prompt prefill included, model load excluded), seconds, median
    ttft_s: Positive
    rounds: StrictInt = Field(gt=0)
    new_tokens: StrictInt = Field(ge=2)
    #: CPU threads the runtime used (0 = its own default)
    threads: StrictInt = Field(ge=0)
    version: str
    #: true: kept from an earlier run on the same export files, machine and settings (this run did not time it)
    earlier: bool = False


class SpeedFailure(RecordPart):
    """A variant a runtime could not time."""

    runtime: str
    variant: str
    error: str
    #: true: kept from an earlier run on the same export files, machine and settings (as :attr:`SpeedRow.earlier`)
    earlier: bool = False


class NotTimed(RecordPart):
    """A variant of a runtime that ran with no figure in the table: this run did not time it and no earlier run's
    figure could be kept."""

    runtime: str
    variant: str
    reason: str


class SpeedReport(Record):
    """``speed.json`` (format_version 1; layout in the module docstring). Written by ``prodip conformance`` through
    :func:`measure_speed`; read by the card (:func:`render_speed`)."""

    FILE: ClassVar[str] = SPEED_FILE
    MAKER: ClassVar[str] = "`prodip conformance EXPORT_DIR`"
    ALLOW_NAN: ClassVar[bool] = False

    #: ``prodip.base.manifest.files_table_sha256`` of the export files timed
    export_files_sha256: str
    machine: Machine
    settings: SpeedSettings
    rows: list[SpeedRow]
    failed: list[SpeedFailure] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict)
    #: wall time each runtime's timing took (loading, warm-up and rounds; seconds): what the table costs
    runtime_seconds: dict[str, Positive] = Field(default_factory=dict)
    #: wall time of the whole measurement (seconds)
    seconds: Positive
    #: variants of a runtime that ran, with no row or failure, and why (:func:`merge_speed`)
    not_timed: list[NotTimed] = Field(default_factory=list)

    def entries(self) -> list[SpeedRow | SpeedFailure]:
        """Every (runtime, variant) the record has a figure or a failure of: ``rows``, then ``failed``."""
        return [*self.rows, *self.failed]


def describe_machine() -> Machine:
    """This machine: CPU model, logical cores, OS, Python."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:  # not Linux
        pass
    return Machine(
        cpu=cpu or platform.processor() or platform.machine() or "?",
        cores=os.cpu_count() or 0,
        os=platform.platform(),
        python=sys.version.split()[0],
    )


def _skip_reason(row: Runtime, timer: RuntimeAdapter, cands: Sequence[Any], selected: Sequence[str]) -> Optional[str]:
    """Why ``row`` is not timed (None: it is): no variant of its formats, not chosen by ``--runtimes`` (the row
    :meth:`~prodip.base.runtimes.Runtime.timing_choosers` names), or not installed (its adapter's words)."""
    if not cands:
        return f"no {' / '.join(row.formats)} variant checked"
    choosers = row.timing_choosers()
    if choosers and not set(choosers) & set(selected):
        if len(choosers) == 1:
            return f"not chosen: {choosers[0]} is not in --runtimes"
        return f"not chosen: neither {' nor '.join(choosers)} is in --runtimes"
    return timer.available()


def measure_speed(
    export_dir: Path,
    candidates: Sequence[Any],
    prompt: list[int],
    prompt_text: str,
    model_cfg: Any,
    *,
    runtimes: Sequence[str],
    threads: int,
    new_tokens: int,
    rounds: int,
    export_files_sha256: str,
) -> SpeedReport:
    """Time every candidate in every runtime of :func:`timers` whose row runs its format.

    Args:
        export_dir: the export dir.
        candidates: conformance's candidates (``name``, ``variant``, ``kind``, ``path``); those of kind ``onnx``,
            ``gguf``, ``pte`` whose name is their variant's are timed (the safetensors ones are the references).
        prompt: the prompt's ids (export tokenizer, BOS included); prompt_text: the same text (for the page).
        model_cfg: the model's ``ModelConfig``.
        runtimes: the on-device runtimes ``--runtimes`` chose (a timed on-device row is skipped unless it or its
            ``timed_with`` row is among them).
        threads: CPU threads per runtime (0 = each one's default); new_tokens: >= 2; rounds: >= 1.
        export_files_sha256: the export's files table hash (what the figures belong to).
    Returns:
        The record (not written).
    """
    t0 = time.perf_counter()
    rows: list[SpeedRow] = []
    failed: list[SpeedFailure] = []
    skipped: dict[str, str] = {}
    runtime_seconds: dict[str, float] = {}
    timed = [c for c in candidates if c.kind in ("onnx", "gguf", "pte") and c.name == c.variant]
    for row, timer in timers():
        cands = [c for c in timed if c.kind in row.formats]
        reason = _skip_reason(row, timer, cands, runtimes)
        if reason is not None:
            skipped[row.name] = reason
            continue
        logger.info("conformance: timing %d variant(s) in %s", len(cands), row.name)
        started = time.perf_counter()
        job = SpeedJob(Path(export_dir), cands, list(prompt), prompt_text, new_tokens, rounds, threads, model_cfg)
        try:
            got = timer.time_generation(job)
        except Exception as err:  # the runtime as a whole failed: every variant of it failed
            got = {c.name: Timing(error=error_text(err)) for c in cands}
        runtime_seconds[row.name] = time.perf_counter() - started
        for c in cands:
            res = got.get(c.name) or Timing(error="no timing returned")
            if res.error is None and not res.ttft_s:
                res.error = "no timed round"
            if res.error is not None:
                failed.append(SpeedFailure(runtime=row.name, variant=c.variant, error=res.error))
                continue
            rows.append(
                SpeedRow(
                    runtime=row.name,
                    variant=c.variant,
                    decode_tokens_per_s=res.median_decode_tokens_per_s,
                    ttft_s=res.median_ttft_s,
                    rounds=len(res.ttft_s),
                    new_tokens=res.new_tokens,
                    threads=res.threads,
                    version=res.version,
                )
            )
    return SpeedReport(
        format_version=SpeedReport.FORMAT_VERSION,
        export_files_sha256=export_files_sha256,
        machine=describe_machine(),
        settings=SpeedSettings(
            prompt_tokens=len(prompt), new_tokens=new_tokens, rounds=rounds, warmup_rounds=1, threads=threads
        ),
        rows=rows,
        failed=failed,
        skipped=skipped,
        runtime_seconds=runtime_seconds,
        seconds=time.perf_counter() - t0,
    )


def read_previous(path: Path) -> Optional[SpeedReport]:
    """The speed.json an earlier run left at ``path``, for :func:`merge_speed`: None when there is none or it cannot
    be read (damaged, or of a format_version this prodip does not read; logged as a warning: its rows are not kept,
    and the variants this run does not time are listed as not measured)."""
    try:
        return SpeedReport.read(path)
    except MissingInput:
        return None
    except (RecordError, OSError) as err:
        logger.warning("conformance: the earlier %s cannot be read; its rows are not kept: %s", path, err)
        return None


def _cannot_keep(previous: Optional[SpeedReport], run: SpeedReport) -> Optional[str]:
    """Why ``previous``'s figures cannot stand in one table with ``run``'s (None: they can): the card states one
    export, one machine and one set of settings for every row."""
    if previous is None:
        return "no earlier speed.json to keep its figure from"
    if previous.export_files_sha256 != run.export_files_sha256:
        return "the earlier speed.json timed other export files"
    if previous.machine != run.machine:
        return "the earlier speed.json was measured on another machine (CPU, cores, OS or Python)"
    if previous.settings != run.settings:
        return "the earlier speed.json was measured with other settings (prompt, new tokens, rounds or threads)"
    return None


def merge_speed(previous: Optional[SpeedReport], run: SpeedReport, variant_formats: Mapping[str, str]) -> SpeedReport:
    """The speed.json after a run that timed ``run``'s rows: the earlier record's rows and failures this run did not
    time again are kept (marked ``earlier``) when it belongs to the same export files, machine and settings, as
    :func:`prodip.conformance.verdict.merge_verdict` keeps the verdicts of variants a subset run did not check;
    a (runtime, variant) this run timed replaces the earlier one.

    Args:
        previous: the earlier speed.json (:func:`read_previous`), or None.
        run: this run's record (:func:`measure_speed`): a (runtime, variant) it timed is in its ``rows`` or
            ``failed``; a runtime it ran is in ``runtime_seconds``.
        variant_formats: the export's variants, name -> format (``manifest.json``), in the manifest's order.
    Returns:
        ``run`` with the kept rows and failures added (in the runtime table's order, then the manifest's), and
        ``not_timed``: each variant of a runtime this run ran that has neither, with the reason. ``machine``,
        ``settings``, ``skipped``, ``runtime_seconds`` and ``seconds`` stay this run's.
    """
    order = {name: i for i, name in enumerate(runtime_names(timed=True))}
    names = {name: i for i, name in enumerate(variant_formats)}

    def key(r: SpeedRow | SpeedFailure) -> tuple[int, int, str, str]:
        return order.get(r.runtime, len(order)), names.get(r.variant, len(names)), r.runtime, r.variant

    timed_now = {(r.runtime, r.variant) for r in run.entries()}
    why_not = _cannot_keep(previous, run)
    rows, failed = list(run.rows), list(run.failed)
    if previous is not None and why_not is None:
        rows += [
            r.model_copy(update={"earlier": True})
            for r in previous.rows
            if (r.runtime, r.variant) not in timed_now and r.variant in variant_formats
        ]
        failed += [
            f.model_copy(update={"earlier": True})
            for f in previous.failed
            if (f.runtime, f.variant) not in timed_now and f.variant in variant_formats
        ]
    have = {(r.runtime, r.variant) for r in rows} | {(f.runtime, f.variant) for f in failed}
    missing = why_not or "the earlier speed.json of these export files has no figure of it either"
    not_timed = [
        NotTimed(runtime=name, variant=variant, reason=f"not in this run's --variants; {missing}")
        for name in sorted(run.runtime_seconds, key=lambda n: (order.get(n, len(order)), n))
        if name in order
        for variant, fmt in variant_formats.items()
        if fmt in by_name(name).formats and (name, variant) not in have
    ]
    update: dict[str, object] = {"rows": sorted(rows, key=key), "failed": sorted(failed, key=key)}
    if not_timed:  # left out when empty, as a full run's record always was
        update["not_timed"] = not_timed
    return run.model_copy(update=update)


def _threads(n: int) -> str:
    return "default" if n == 0 else str(n)


def _mark(earlier: bool) -> str:
    return f" {EARLIER_MARK}" if earlier else ""


def render_speed(report: SpeedReport) -> str:
    """The README's ``## Speed`` section (markdown): a row per runtime and variant, the fastest decode rate of
    each runtime in bold, the machine, how it was measured, and what was not measured and why. A row or failure
    kept from an earlier run (:func:`merge_speed`) is marked ``‡`` and the mark explained under the table."""
    m, s = report.machine, report.settings
    lines = [
        SPEED_HEADING,
        "",
        f"Measured by `prodip conformance` on the exporting machine: {m.cpu}, {m.cores} logical cores, {m.os}, "
        f"Python {m.python}. Each variant generates greedily in each runtime that runs it: a {s.prompt_tokens}-token "
        f"prompt, then {s.new_tokens} new tokens (end of sequence ignored), {_threads(s.threads)} CPU thread(s); "
        f"medians of {s.rounds} round(s) after {s.warmup_rounds} warm-up. Decode is new tokens per second after the "
        "first; time to first token runs from the generate call (model loaded) to the first new token, the prompt's "
        "prefill included. **Bold**: the fastest variant in each runtime. Other machines differ: compare within "
        "this table.",
        "",
        "| runtime | variant | decode (tokens/s) | time to first token (ms) | threads |",
        "|---|---|---:|---:|---:|",
    ]
    order = {name: i for i, name in enumerate(runtime_names(timed=True))}
    by_runtime: dict[str, list[SpeedRow]] = {}
    for r in report.rows:
        by_runtime.setdefault(r.runtime, []).append(r)
    for runtime in sorted(by_runtime, key=lambda n: (order.get(n, len(order)), n)):
        rows = by_runtime[runtime]
        best = max(r.decode_tokens_per_s for r in rows)
        for r in sorted(rows, key=lambda r: -r.decode_tokens_per_s):
            rate = f"{r.decode_tokens_per_s:.1f}"
            rate = f"**{rate}**" if math.isclose(r.decode_tokens_per_s, best) else rate
            lines.append(
                f"| {runtime_label(runtime)} | {r.variant}{_mark(r.earlier)} | {rate} | {r.ttft_s * 1e3:.1f} | "
                f"{_threads(r.threads)} |"
            )
    lines.append("")
    if any(r.earlier for r in report.entries()):
        lines += [
            f"{EARLIER_MARK} Measured by an earlier `prodip conformance` run on these same export files, on this "
            "machine with these settings: the latest run did not time that variant in that runtime.",
            "",
        ]
    versions = dict.fromkeys(f"{runtime_label(r.runtime)}: {r.version}" for r in report.rows if r.version)
    if versions:
        lines += ["Runtimes: " + "; ".join(versions) + ".", ""]
    if report.failed:
        lines += ["Could not be timed:", ""]
        lines += [
            f"- {runtime_label(f.runtime)}, {f.variant}{_mark(f.earlier)}: {f.error.splitlines()[0][:200]}"
            for f in report.failed
        ]
        lines.append("")
    if report.skipped or report.not_timed:
        lines += ["Not measured here:", ""]
        kept = {r.runtime for r in report.entries() if r.earlier}
        lines += [
            f"- {runtime_label(n)}: {why}"
            + (f" (its {EARLIER_MARK} figures are from an earlier run)" if n in kept else "")
            for n, why in report.skipped.items()
        ]
        gaps: dict[tuple[str, str], list[str]] = {}
        for g in report.not_timed:
            gaps.setdefault((g.runtime, g.reason), []).append(g.variant)
        lines += [f"- {runtime_label(n)}, {', '.join(variants)}: {why}" for (n, why), variants in gaps.items()]
        lines.append("")
    return "\n".join(lines)
