"""The card's speed table: each checked variant timed in each runtime that runs it, on the exporting machine.

``prodip conformance`` (after its checks) times greedy generation of every ONNX, GGUF and ExecuTorch variant in
the runtimes of :data:`TIMERS` (ONNX Runtime, onnxruntime-genai, transformers.js in Node, the export's web page on
WASM in Chromium, llama.cpp, ExecuTorch), each inside its own runtime (``time_generation`` of its adapter;
:mod:`prodip.conformance.runtimes.timing` defines the figures: time to first token and decode tokens/s, medians of
``speed_rounds`` rounds after one warm-up). It writes them to ``speed.json`` beside ``report.json``
(:class:`SpeedReport`, this module its one owner) with the machine named, and the card renders them
(:func:`render_speed`) under the quality card. Layout of speed.json::

    {format_version: 1, export_files_sha256,
     machine: {cpu, cores, os, python},
     settings: {prompt_tokens, new_tokens, rounds, warmup_rounds, threads (0 = each runtime's default)},
     rows: [{runtime, variant, decode_tokens_per_s, ttft_s, rounds, new_tokens, threads, version}],
     failed: [{runtime, variant, error}], skipped: {runtime: reason}, runtime_seconds: {runtime: s}, seconds}

A runtime not chosen by ``--runtimes`` (onnxruntime-web's row stands for the page's WASM build), not installed, or
with no variant of its format is in ``skipped`` with the reason; a variant that failed in a runtime is in ``failed``.

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
from typing import Annotated, Any, ClassVar, Optional, Protocol

from pydantic import Field, StrictInt

from prodip.base.records import Record, RecordPart
from prodip.base.runtimes import by_name
from prodip.conformance.runtimes.adapters import adapter_for
from prodip.conformance.runtimes.common import error_text
from prodip.conformance.runtimes.onnxruntime import OnnxRuntimeAdapter
from prodip.conformance.runtimes.timing import SpeedJob, Timing
from prodip.conformance.web_page import PAGE_WASM, PageWasmTimer

logger = logging.getLogger(__name__)

SPEED_FILE = "speed.json"
SPEED_HEADING = "## Speed"
#: The on-device runtime whose choice in ``--runtimes`` also times the page on WASM: the page runs its WASM build.
PAGE_RUNTIME = "onnxruntime-web"

#: A figure of a row: a positive finite number.
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Timer(Protocol):
    """What the speed table needs of a runtime (a runtime adapter, or :class:`PageWasmTimer`)."""

    # read-only members: an adapter's class attribute ``timed_formats = ("onnx",)`` is a ``tuple[str]``
    @property
    def name(self) -> str: ...

    @property
    def timed_formats(self) -> tuple[str, ...]: ...

    def available(self) -> Optional[str]: ...

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]: ...


def timers() -> list[Timer]:
    """The timed runtimes, in the card's order (looked up at call time: a test may replace an adapter)."""
    own: dict[str, Timer] = {"onnxruntime": OnnxRuntimeAdapter(), PAGE_WASM: PageWasmTimer()}  # no adapter row
    names = ("onnxruntime", "onnxruntime-genai", "transformers.js", PAGE_WASM, "llama.cpp", "executorch")
    return [own[n] if n in own else adapter_for(n) for n in names]


def runtime_label(name: str) -> str:
    """The card's name of a timed runtime (``ONNX Runtime``, ``transformers.js (Node)``, ``web page (WASM)``)."""
    if name == "transformers.js":
        return "transformers.js (Node)"
    try:
        return by_name(name).card_label
    except KeyError:  # the page is not a runtime row
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


def _skip_reason(timer: Timer, cands: Sequence[Any], selected: Sequence[str]) -> Optional[str]:
    row_name = PAGE_RUNTIME if timer.name == PAGE_WASM else timer.name
    if not cands:
        return f"no {' / '.join(timer.timed_formats)} variant checked"
    try:
        on_device = bool(by_name(row_name).greedy_metric)
    except KeyError:
        on_device = False
    if on_device and row_name not in selected:
        return f"not chosen: {row_name} is not in --runtimes"
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
    """Time every candidate in every runtime of :func:`timers` that runs its format.

    Args:
        export_dir: the export dir.
        candidates: conformance's candidates (``name``, ``variant``, ``kind``, ``path``); those of kind ``onnx``,
            ``gguf``, ``pte`` whose name is their variant's are timed (the safetensors ones are the references).
        prompt: the prompt's ids (export tokenizer, BOS included); prompt_text: the same text (for the page).
        model_cfg: the model's ``ModelConfig``.
        runtimes: the on-device runtimes ``--runtimes`` chose (the others are skipped).
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
    for timer in timers():
        cands = [c for c in timed if c.kind in timer.timed_formats]
        reason = _skip_reason(timer, cands, runtimes)
        if reason is not None:
            skipped[timer.name] = reason
            continue
        logger.info("conformance: timing %d variant(s) in %s", len(cands), timer.name)
        started = time.perf_counter()
        job = SpeedJob(Path(export_dir), cands, list(prompt), prompt_text, new_tokens, rounds, threads, model_cfg)
        try:
            got = timer.time_generation(job)
        except Exception as err:  # the runtime as a whole failed: every variant of it failed
            got = {c.name: Timing(error=error_text(err)) for c in cands}
        runtime_seconds[timer.name] = time.perf_counter() - started
        for c in cands:
            res = got.get(c.name) or Timing(error="no timing returned")
            if res.error is None and not res.ttft_s:
                res.error = "no timed round"
            if res.error is not None:
                failed.append(SpeedFailure(runtime=timer.name, variant=c.variant, error=res.error))
                continue
            rows.append(
                SpeedRow(
                    runtime=timer.name,
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
    order = {t.name: i for i, t in enumerate(timers())}
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
