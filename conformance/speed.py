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
     rows: [{runtime, variant, decode_tokens_per_s, ttft_s, rounds, new_tokens, threads, version}],
     failed: [{runtime, variant, error}], skipped: {runtime: reason}, runtime_seconds: {runtime: s}, seconds}

``runtime`` is the row's name (``transformers.js-browser``: the page on WASM), the card shows its label. An on-device
row not chosen by ``--runtimes`` (nor its ``timed_with`` row: the page is timed when ``onnxruntime-web``, the WASM
build it loads, is chosen, as it is by default), a runtime not installed, or one with no variant of its format is in
``skipped`` with the reason; a variant that failed in a runtime is in ``failed``.

    python -c "from prodip.conformance.speed import SpeedReport; print(SpeedReport.read('runs/demo/export/conformance/speed.json').rows[0])"
"""

from __future__ import annotations

import logging
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Optional

from pydantic import Field, StrictInt

from prodip.base.records import Record, RecordPart
from prodip.base.runtimes import Runtime, by_name, runtime_names
from prodip.conformance.runtimes.adapters import adapter_for
from prodip.conformance.runtimes.common import RuntimeAdapter, error_text
from prodip.conformance.runtimes.timing import SpeedJob, Timing

logger = logging.getLogger(__name__)

SPEED_FILE = "speed.json"
SPEED_HEADING = "## Speed"

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


class SpeedFailure(RecordPart):
    """A variant a runtime could not time."""

    runtime: str
    variant: str
    error: str


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


def _threads(n: int) -> str:
    return "default" if n == 0 else str(n)


def render_speed(report: SpeedReport) -> str:
    """The README's ``## Speed`` section (markdown): a row per runtime and variant, the fastest decode rate of
    each runtime in bold, the machine, how it was measured, and what was not measured and why."""
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
                f"| {runtime_label(runtime)} | {r.variant} | {rate} | {r.ttft_s * 1e3:.1f} | {_threads(r.threads)} |"
            )
    lines.append("")
    versions = dict.fromkeys(f"{runtime_label(r.runtime)}: {r.version}" for r in report.rows if r.version)
    if versions:
        lines += ["Runtimes: " + "; ".join(versions) + ".", ""]
    if report.failed:
        lines += ["Could not be timed:", ""]
        lines += [f"- {runtime_label(f.runtime)}, {f.variant}: {f.error.splitlines()[0][:200]}" for f in report.failed]
        lines.append("")
    if report.skipped:
        lines += ["Not measured here:", ""]
        lines += [f"- {runtime_label(n)}: {why}" for n, why in report.skipped.items()]
        lines.append("")
    return "\n".join(lines)
