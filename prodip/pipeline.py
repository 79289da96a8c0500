"""``prodip run CONFIG``: the whole pipeline, stage after stage, through artifacts on disk.

corpus -> tokenizer dir (+ fertility audit and gate) -> token shards -> training run dir ->
eval.json -> export dir -> conformance report -> HTTP completions from ``prodip serve``.
Every stage reads only the artifacts of the stages above it. A stage whose artifact is already
complete is skipped, so an interrupted run resumes where it stopped; the resolved config is
saved as ``OUT_DIR/config.toml`` and a re-run with a different config is refused (``--force``
starts over).

    prodip run configs/demo.toml
    prodip run configs/demo.toml --out-dir runs/try2 --stages tokenizer,data
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pydantic import Field, StrictBool, field_validator

from prodip.base.config import (
    ConfigError,
    add_arguments,
    dump_toml,
    from_dict,
    opt,
    read_toml,
    toml_roundtrip,
    write_text_atomic,
)
from prodip.base.errors import MissingInput, OutputExists
from prodip.base.jsontypes import JSONObject, TOMLTable
from prodip.base.layout import TABLES, TOP_LEVEL_TABLE_KEYS, has_sft, stage_defaults
from prodip.base.manifest import MANIFEST_FILE, ExportManifest
from prodip.base.records import Number, Record, refuse_newer
from prodip.base.stage import (
    STAGE_TIMES_FILE,
    CompletionRequests,
    RunContext,
    Stage,
    StageTime,
    StageTimes,
    made_from,
)
from prodip.serve.records import Completions
from prodip.train.records import (
    CHECKPOINT_MANIFEST_FILE,
    SFT_EVAL_FILE,
    TRAINER_STATE_FILE,
    CheckpointManifest,
    EvalReport,
    SftEvalReport,
    TrainerState,
)

if TYPE_CHECKING:
    from prodip.plan import RunPlan

# The stage packages' own modules (their ``stage`` registries, the corpus reader, the summary) import
# torch, onnx and pyarrow: they are imported where a run needs them, not here, so that `prodip run --help`
# and a refused config (checked before any stage runs) do not wait for them (10 s of a 22 s --help under load).
log = logging.getLogger("prodip.run")


#: Every stage's name, in pipeline order (the registry, :func:`_stages`, is checked against it).
ORDER: list[str] = ["tokenizer", "data", "train", "eval", "sft", "export", "conformance", "serve"]
#: The config tables, in pipeline order (``prodip.base.layout.TABLES``; the stages' tables, checked).
SECTIONS: list[str] = list(TABLES)


@functools.cache
def _stages() -> dict[str, Stage[Any]]:
    """Every stage, in pipeline order; each package's ``stage`` module owns its records (imported on first
    use: they import torch and onnx). Also ``prodip.pipeline.STAGES``.

    Raises:
        RuntimeError: the registry disagrees with :data:`ORDER`, :data:`SECTIONS` or the attributes of
            :class:`prodip.plan.RunPlan` (a stage or table added in one place only).
    """
    from prodip.conformance.stage import STAGES as conformance  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.export.stage import STAGES as export  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.plan import RunPlan  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.serve.stage import STAGES as serve  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.tokenizer.stage import STAGES as tokenizer  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.train.stage import STAGES as train  # noqa: PLC0415 (lazy: torch, onnx)

    stages = {s.name: s for s in (*tokenizer, *train, *export, *conformance, *serve)}
    tables = {t: cls for s in stages.values() for t, cls in s.tables.items()}
    if list(stages) != ORDER or list(tables) != SECTIONS or tables != RunPlan.classes():
        raise RuntimeError(
            f"stage registry {list(stages)} / {tables} differs from ORDER {ORDER} / SECTIONS {SECTIONS} / "
            f"RunPlan {RunPlan.classes()}"
        )
    return stages


def _config_classes() -> dict[str, type[Any]]:
    """Config table -> its config class, in pipeline order (also ``prodip.pipeline.CONFIG_CLASSES``)."""
    return {t: cls for s in _stages().values() for t, cls in s.tables.items()}


def __getattr__(name: str) -> Any:
    """``STAGES`` and ``CONFIG_CLASSES`` as module attributes, made on first use (PEP 562)."""
    if name == "STAGES":
        return _stages()
    if name == "CONFIG_CLASSES":
        return _config_classes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _done(stage: Stage[Any], plan: RunPlan) -> bool:
    """Whether ``stage``'s artifact is complete (its ``done`` on its own config)."""
    return stage.done(stage.own(plan))


def _active(stage: Stage[Any], plan: RunPlan) -> bool:
    """Whether the plan uses ``stage`` at all (its ``active`` on its own config)."""
    return stage.active(stage.own(plan))


def resolve_all(config_path: str, tables: dict[str, TOMLTable], out_dir: Path) -> RunPlan:
    """Build every stage's config dataclass: run defaults < TOML table. ``[tokenizer]`` and ``[audit]``
    read the corpus as ``[data]`` does (its ``READ_OPTIONS``: ``text_field``, ``doc_chars``, ``errors``, those
    each has) unless their own tables say otherwise.

    Raises:
        ConfigError: an unknown key or wrong type in a table, naming the file and table.
    """
    from prodip.plan import RunPlan  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.tokenizer.config import READ_OPTIONS  # noqa: PLC0415 (lazy: pyarrow)

    base = stage_defaults(out_dir, chat=has_sft(tables))
    # one set of corpus-reading options: [data]'s, unless [tokenizer] or [audit] set their own
    reader = {k: v for k, v in tables.get("data", {}).items() if k in READ_OPTIONS}
    configs = {}
    # RunPlan's classes, not the stage registry's (_stages checks they agree): the registry imports every
    # stage's modules (torch), and `prodip serve --config` checks the whole file with this in an install without it
    for name, cls in RunPlan.classes().items():
        fields = {f.name for f in dataclasses.fields(cls)}
        data: dict[str, object] = {k: v for k, v in base[name].items() if k in fields}
        if name in ("tokenizer", "audit"):
            data.update({k: v for k, v in reader.items() if k in fields})
        data.update(tables.get(name, {}))
        configs[name] = from_dict(cls, data, source=f"{config_path} [{name}]")
    return RunPlan(**configs)


def check_plan(plan: RunPlan, wanted: list[str], *, source: str) -> None:
    """Checks that span several tables, made before any stage runs (not hours into training).

    The model's vocabulary is not among them: it comes from the tokenizer dir when training starts
    (``ModelConfig.with_vocab_size``), the one place it is checked.

    Raises:
        ConfigError: a sequence longer than the context window, a served variant that is not
            exported, or a requested stage whose input stage is neither requested nor complete.
    """
    if not wanted:
        raise ConfigError(f"{source}: no stages to run; stages are {', '.join(ORDER)}")
    model = plan.model
    for table, seq_len in (("train", plan.train.seq_len), ("eval", plan.eval.seq_len)):
        if seq_len > model.max_position_embeddings:
            raise ConfigError(
                f"{source} [{table}] seq_len = {seq_len} exceeds [model] "
                f"max_position_embeddings = {model.max_position_embeddings}"
            )
    exported = plan.export.variants
    if "serve" in wanted and exported and plan.serve.variant not in exported:
        raise ConfigError(
            f"{source} [serve] variant = {plan.serve.variant!r} is not among [export] variants {exported}"
        )
    stages = _stages()
    for name in wanted:
        dep = stages[name].needs
        if dep and _active(stages[name], plan) and dep not in wanted and not _done(stages[dep], plan):
            raise ConfigError(
                f"stage {name!r} needs the output of stage {dep!r}, which is neither complete "
                f"in this run's out_dir nor among the stages to run"
            )
    extending = bool(plan.extend.base)  # an imported base: the tokenizer stage extends its vocabulary
    if extending and Path(plan.extend.out) != Path(plan.tokenizer.out_dir):
        raise ConfigError(
            f"{source} [extend] out = {plan.extend.out!r}: the extended folder is the run's tokenizer dir "
            f"({plan.tokenizer.out_dir}, what [data] and [train] read); leave [extend] out unset"
        )
    corpora = (
        ("tokenizer", "extend", plan.extend.inputs) if extending else ("tokenizer", "tokenizer", plan.tokenizer.inputs),
        ("data", "data", plan.data.inputs),
    )
    for stage_name, table, inputs in corpora:
        if stage_name in wanted and not inputs:
            raise ConfigError(
                f"{source} [{table}] inputs: no corpus given; expected e.g. "
                f'inputs = {{bn = ["data/bn"], en = ["data/en"]}}'
            )
    # the shards hold the [data] inputs' languages: a mixture naming another fails only when training
    # starts, after the tokenizer and data stages ran
    unknown = sorted(set(plan.train.mixture) - set(plan.data.inputs))
    if "data" in wanted and "train" in wanted and unknown:
        raise ConfigError(
            f"{source} [train] mixture names language(s) {', '.join(unknown)} that [data] inputs do not have "
            f"({', '.join(sorted(plan.data.inputs))})"
        )


def check_inputs(plan: RunPlan, wanted: list[str], *, source: str) -> None:
    """Every corpus path of every stage to run exists, checked before the first stage starts (a missing
    [data] input was found only after the tokenizer had trained). Relative paths are read from the
    current folder, as every prodip command reads them.

    Raises:
        MissingInput: a path that does not exist, naming the table, key and the current folder.
        ConfigError: the tokenizer stage without ``[audit] heldout`` (its gate audits on text it never saw).
    """
    from prodip.tokenizer.corpus import expand_inputs  # noqa: PLC0415 (lazy: torch, onnx)

    checks = [(f"[{table}] {key}", inputs) for name in wanted for table, key, inputs in corpus_inputs(plan, name)]
    for what, inputs in checks:
        try:
            expand_inputs(inputs, what=f"{source} {what}")
        except MissingInput as err:
            raise MissingInput(f"{err} (relative paths are read from the current folder, {Path.cwd()})") from None
    if "tokenizer" in wanted and not plan.extend.base and not plan.audit.heldout:
        raise ConfigError(
            f"{source} [audit] heldout: none given; the tokenizer stage audits its fertility gate on text of each "
            f'language it never trained on, e.g. heldout = {{bn = ["data/heldout/udhr_ben.txt"], '
            f'en = ["data/heldout/udhr_eng.txt"]}} (files outside [tokenizer] inputs)'
        )


def corpus_inputs(plan: RunPlan, name: str) -> list[tuple[str, str, dict[str, list[str]]]]:
    """The corpus files (not artifacts with their own hashes) stage ``name`` reads: ``(table, key, language ->
    files/folders)`` per config field naming them, left out where empty; none for a stage that reads no corpus."""
    tokenizer = (
        [("extend", "inputs", plan.extend.inputs), ("extend", "heldout", plan.extend.heldout)]
        if plan.extend.base
        else [("tokenizer", "inputs", plan.tokenizer.inputs), ("audit", "heldout", plan.audit.heldout)]
    )
    fields = {
        "tokenizer": tokenizer,
        "data": [("data", "inputs", plan.data.inputs)],
    }
    return [(table, key, inputs) for table, key, inputs in fields.get(name, []) if inputs]


#: the stages :func:`corpus_inputs` names files of
CORPUS_STAGES = ("tokenizer", "data")
CORPUS_STAMPS = "corpus_inputs.json"  # in OUT_DIR: stage -> corpus_fingerprint it was made from

_C = TypeVar("_C", bound="CorpusStamps")


class CorpusStamps(Record):
    """``OUT_DIR/corpus_inputs.json``: per stage that reads corpus files (:data:`CORPUS_INPUTS`), the
    :func:`corpus_fingerprint` of the corpus it was made from (None: it read none, or one was missing).

    format_version 1 is ``{format_version, stages: {name: fingerprint}}``; files written before records
    existed hold the ``{name: fingerprint}`` table alone (no ``format_version``) and still read.
    Written and read by ``prodip run`` only (:func:`_stamp_corpus`, :func:`_corpus_unchanged`).
    """

    FILE: ClassVar[str] = CORPUS_STAMPS
    MAKER: ClassVar[str] = "`prodip run`"

    stages: dict[str, str | None] = Field(default_factory=dict)

    @classmethod
    def from_dict(cls: type[_C], data: Any, source: str | os.PathLike[str] | None = None) -> _C:
        """:meth:`Record.from_dict`, reading the unversioned layout (a bare ``{name: fingerprint}`` table) too."""
        if isinstance(data, dict) and "format_version" not in data and "stages" not in data:
            data = {"format_version": 1, "stages": data}
        return super().from_dict(data, source)


def corpus_fingerprint(plan: RunPlan, name: str) -> str | None:
    """sha256 over (path, bytes, mtime) of every corpus file stage ``name`` reads (:func:`corpus_inputs`), or
    None when it reads none or one is missing. Sizes and times, not contents: a corpus can be tens of GB, and
    an edited, replaced, added or removed file changes them (a file only touched is read again)."""
    from prodip.tokenizer.corpus import expand_inputs  # noqa: PLC0415 (lazy: torch, onnx)

    rows = []
    for table, key, inputs in corpus_inputs(plan, name):
        try:
            files = expand_inputs(inputs, what=f"[{table}] {key}")
        except (MissingInput, ConfigError, ValueError):
            return None
        for lang, paths in sorted(files.items()):
            for f in sorted(map(str, paths)):
                st = Path(f).stat()
                rows.append([table, key, lang, str(Path(f).resolve()), st.st_size, st.st_mtime_ns])
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest() if rows else None


def _corpus_unchanged(out_dir: Path, plan: RunPlan, name: str) -> bool:
    """The corpus stage ``name`` read when it was made is the one its config names now (made_from)."""
    if name not in CORPUS_STAGES:
        return True
    stamps = _read_stamps(out_dir)
    return made_from(
        f"{out_dir}/{name}", {"corpus": stamps.stages.get(name)}, {"corpus": corpus_fingerprint(plan, name)}
    )


def _read_stamps(out_dir: Path) -> CorpusStamps:
    """The run's corpus stamps; none yet (or a damaged file) is an empty table, so the stages are stamped anew."""
    empty = CorpusStamps(format_version=CorpusStamps.FORMAT_VERSION)
    return CorpusStamps.read_or_none(out_dir / CORPUS_STAMPS) or empty


def _stamp_corpus(out_dir: Path, plan: RunPlan, name: str) -> None:
    if name in CORPUS_STAGES:
        stamps = _read_stamps(out_dir)
        stamps.stages = {**stamps.stages, name: corpus_fingerprint(plan, name)}
        stamps.write(out_dir / CORPUS_STAMPS)


@dataclass
class RunConfig:
    """Top-level keys of a pipeline TOML file (stage settings live in its tables)."""

    out_dir: str = opt("runs/demo", "folder receiving every artifact of the run")
    stages: list[str] = opt(help="stages to run, in pipeline order", factory=lambda: list(ORDER))
    force: bool = opt(False, "start over even if OUT_DIR holds a run made with a different config")
    completion_prompts: dict[str, str] = opt(
        help="language -> prompt sent to the HTTP endpoint at the end of the run",
        factory=lambda: {"bn": "একদিন সকালে", "en": "It was a bright cold day in April, and"},
    )
    completion_max_tokens: int = opt(40, "new tokens per completion (and chat reply) fetched over HTTP (tokens)")
    chat_prompts: dict[str, str] = opt(
        help="language -> a user message sent to /v1/chat/completions at the end of the run (a chat model's "
        "reply is shown in the summary); empty = none",
        factory=dict,
    )
    completion_temperature: float = opt(0.0, "sampling temperature of those completions (0 = greedy)")
    completion_top_p: float = opt(1.0, "nucleus sampling mass of those completions, in (0, 1]")
    completion_frequency_penalty: float = opt(
        0.0, "OpenAI frequency_penalty of those completions, -2..2 (nats per earlier occurrence)"
    )
    completion_seed: int = opt(0, "sampling seed of those completions (same seed, same text)")
    serve_timeout_s: float = opt(120.0, "how long to wait for the server to come up (seconds)")


def load_run_config(path: str, args: argparse.Namespace | None = None) -> tuple[RunConfig, dict[str, TOMLTable]]:
    """Split a pipeline TOML file into the top-level RunConfig and the per-stage tables.

    Raises:
        ConfigError: an unknown table, an unknown key or a wrong type, naming the file and key.
    """
    doc = read_toml(path)
    top = {k: v for k, v in doc.items() if not isinstance(v, dict) or k in TOP_LEVEL_TABLE_KEYS}
    tables = {k: v for k, v in doc.items() if isinstance(v, dict) and k not in top}
    for name in tables:
        if name not in SECTIONS:
            raise ConfigError(f"{path}: unknown table [{name}]; known tables: {', '.join(SECTIONS)}")
    if args is not None:
        names = {f.name for f in dataclasses.fields(RunConfig)}
        top.update({k: v for k, v in vars(args).items() if k in names})
    run = from_dict(RunConfig, top, source=str(path))
    unknown = [s for s in run.stages if s not in ORDER]
    if unknown:
        raise ConfigError(f"{path}: unknown stage(s) {unknown}; stages are {', '.join(ORDER)}")
    return run, tables


def validate_config_file(path: str) -> RunPlan:
    """Check a whole TOML file as ``prodip run`` does (:func:`load_run_config`, then :func:`resolve_all`): every
    table and key, also those of tables the calling stage command does not read, so a ``[serve] varaint``
    typo is refused by ``prodip export --config`` as by ``prodip run``.

    Returns:
        The plan ``prodip run`` would build from the file (the caller's own table is resolved again with
        its flags).
    Raises:
        ConfigError: an unknown table, an unknown key or a wrong type, naming the file, table and key.
    """
    run, tables = load_run_config(path)
    return resolve_all(path, tables, Path(run.out_dir))


# Settings that change how a run goes but not what its artifacts are: they may differ between an
# interrupted run and its re-run without making the output folder "a different run".
_NOT_IDENTITY = (
    "stages",
    "force",
    "completion_prompts",
    "chat_prompts",
    "completion_max_tokens",
    "completion_temperature",
    "completion_top_p",
    "completion_frequency_penalty",
    "completion_seed",
    "serve_timeout_s",
    "serve",
)
_RUNTIME_KEYS = (
    "progress",
    "max_steps_this_run",
    "resume",
    "force",
    "overwrite",
    "threads",
    "write_manifest",
    "checkpoint_every_s",  # when a save happens, not what is trained (a resume is bitwise)
)
RUN_MARKER = "prodip_run.json"  # written by `prodip run` only: --force deletes nothing without it
SUMMARY_FILE = "summary.json"


class RunMarker(Record):
    """``OUT_DIR/prodip_run.json`` (format_version 1): marks a folder ``prodip run`` made, so ``--force``
    deletes nothing else; ``config`` names the resolved config saved beside it. Written by
    :func:`run_pipeline`, read by :func:`_check_out_dir` (a marker this prodip cannot read is refused,
    naming its version, rather than taken as a run it may delete)."""

    FILE: ClassVar[str] = RUN_MARKER
    MAKER: ClassVar[str] = "`prodip run`"
    INDENT: ClassVar[int | None] = None

    config: str = "config.toml"

    @field_validator("config")
    @classmethod
    def _bare_file_name(cls, name: str) -> str:
        """The saved config lies beside the marker: a bare file name, never a path out of the run dir."""
        if not name or name in (".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"must be a file name in the run dir, got {name!r}")
        return name


class RunSummary(Record):
    """``OUT_DIR/summary.json`` (format_version 1): the figures ``prodip run`` printed at its end, read back
    from the run's artifacts (:func:`prodip.summary.print_summary`), with the verdict. Written by
    :func:`run_pipeline` when every stage asked for completed (a paused run writes none); read with
    ``RunSummary.read``. The artifacts' parts are kept as their files hold them (``None``: not made)."""

    FILE: ClassVar[str] = SUMMARY_FILE
    MAKER: ClassVar[str] = "`prodip run`"
    TRAILING_NEWLINE: ClassVar[bool] = False

    out_dir: str
    #: fertility.json, eval.json, sft_eval.json, the export's manifest.json, conformance's report.json and
    #: completions.json as their records' dicts
    fertility: JSONObject | None = None
    #: an adapted base's extension.json (``prodip tokenizer extend``), and the base vs adapted model per language
    extension: JSONObject | None = None
    adaptation: JSONObject | None = None
    eval: JSONObject | None = None
    sft: JSONObject | None = None
    export_manifest: JSONObject | None = None
    conformance: JSONObject | None = None
    completions: JSONObject | None = None
    #: stage -> wall seconds of this invocation
    timings_s: dict[str, Number] = Field(default_factory=dict)
    #: stage -> {seconds, complete, invocations} over every invocation (``stage_times.json``)
    stage_times: dict[str, StageTime] = Field(default_factory=dict)
    ok: StrictBool
    problems: list[str] = Field(default_factory=list)


def _run_artifacts(plan: RunPlan, out_dir: Path) -> list[tuple[type[Record], Path]]:
    """Every JSON artifact a run (re)writes or ``--force`` removes, with its record: ``OUT_DIR``'s own files,
    then each stage's (the plan's paths), the checkpoints of the training and fine-tuning runs included."""
    from prodip.conformance.records import REPORT_FILE, ConformanceReport  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.tokenizer.bpe import TRAIN_INFO_FILE, TrainInfo  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.tokenizer.records import FERTILITY_NAME, FertilityReport  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.tokenizer.shards import META_NAME, ShardsMeta  # noqa: PLC0415 (lazy: torch, onnx)
    from prodip.train.checkpoint import CHECKPOINTS_DIRNAME  # noqa: PLC0415 (lazy: torch, onnx)

    found: list[tuple[type[Record], Path]] = [
        (record, out_dir / record.FILE) for record in (RunMarker, StageTimes, CorpusStamps, Completions, RunSummary)
    ]
    tok = Path(plan.tokenizer.out_dir)
    found += [(TrainInfo, tok / TRAIN_INFO_FILE), (FertilityReport, tok / FERTILITY_NAME)]
    found.append((ShardsMeta, Path(plan.data.out_dir) / META_NAME))
    if plan.eval.out:
        found.append((EvalReport, Path(plan.eval.out)))
    runs = [Path(plan.train.out_dir), Path(plan.sft.out_dir)]
    found.append((SftEvalReport, Path(plan.sft.out_dir) / SFT_EVAL_FILE))
    for run in runs:
        for step in sorted((run / CHECKPOINTS_DIRNAME).glob("step_*")):
            found += [(TrainerState, step / TRAINER_STATE_FILE), (CheckpointManifest, step / CHECKPOINT_MANIFEST_FILE)]
    found.append((ExportManifest, Path(plan.export.out) / MANIFEST_FILE))
    found.append((ConformanceReport, plan.conformance.report_dir() / REPORT_FILE))
    return found


def _refuse_newer_artifacts(plan: RunPlan, out_dir: Path, force: bool) -> None:
    """Refuse a run over artifacts a newer prodip wrote, before anything is written or removed: a stage's
    done-check takes one as "not done" and would rewrite it, and ``--force`` would delete it.

    Raises:
        OutputExists: one of :func:`_run_artifacts` has a format_version newer than this prodip reads (the
            file and the version named; :func:`prodip.base.records.refuse_newer`).
    """
    action = "prodip run --force" if force else "prodip run"
    for record, path in _run_artifacts(plan, out_dir):
        refuse_newer(record, path, action=action, instead="choose another --out-dir")


def _identity(doc: TOMLTable) -> TOMLTable:
    return {
        k: ({kk: vv for kk, vv in v.items() if kk not in _RUNTIME_KEYS} if isinstance(v, dict) else v)
        for k, v in doc.items()
        if k not in _NOT_IDENTITY
    }


def _changed_keys(before: TOMLTable, now: TOMLTable) -> list[str]:
    keys = []
    for k in sorted(set(before) | set(now)):
        a, b = before.get(k), now.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            keys += [f"[{k}] {kk}" for kk in sorted(set(a) | set(b)) if a.get(kk) != b.get(kk)]
        elif a != b:
            keys.append(k)
    return keys


#: How many changed keys a refusal names before "and N more".
_SHOWN_CHANGES = 12


_NO_DEFAULT = object()


def _field_default(cfg: Any, name: str) -> Any:
    """The default of dataclass ``cfg``'s field ``name``, or :data:`_NO_DEFAULT` (no such field, no default)."""
    field = next((f for f in dataclasses.fields(cfg) if f.name == name), None)
    if field is None:
        return _NO_DEFAULT
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return _NO_DEFAULT


def _derived(key: str, plan: RunPlan | None, tables: dict[str, TOMLTable]) -> bool:
    """Whether changed ``key`` (``"[table] name"``) is one the user did not write now and whose value was
    derived from other settings (``[model] head_dim`` from hidden_size and the heads; a stage's paths from
    out_dir): its value is not the field's default. A key the user removed (back to its default) is not."""
    if not key.startswith("["):
        return False
    table, _, name = key[1:].partition("] ")
    cfg = plan.table(table) if plan is not None else None
    if name in tables.get(table, {}) or cfg is None or not dataclasses.is_dataclass(cfg):
        return False
    default = _field_default(cfg, name)
    return default is not _NO_DEFAULT and getattr(cfg, name) != default


def _added_at_default(key: str, before: TOMLTable, plan: RunPlan | None) -> bool:
    """Whether changed ``key`` (``"[table] name"``) is one the saved config does not have at all and whose
    value now is its field's default: a key a newer prodip added, whose default keeps what the run did before
    (``[sft] replay_share = 0``), is not a change of config, so upgrading prodip does not refuse an old run."""
    if not key.startswith("[") or plan is None:
        return False
    table, _, name = key[1:].partition("] ")
    saved, cfg = before.get(table), plan.table(table)
    if not isinstance(saved, dict) or name in saved or cfg is None or not dataclasses.is_dataclass(cfg):
        return False
    default = _field_default(cfg, name)
    return default is not _NO_DEFAULT and bool(getattr(cfg, name) == default)


def describe_changes(changed: list[str], plan: RunPlan | None, tables: dict[str, TOMLTable]) -> str:
    """The changed keys a user can act on, for a refusal: every key they wrote (or removed), the first
    :data:`_SHOWN_CHANGES` then "and N more"; keys derived from them are counted, not named (all are named
    when only derived keys changed, e.g. a newer prodip derives a default otherwise)."""
    derived = [k for k in changed if _derived(k, plan, tables)]
    named = [k for k in changed if k not in derived] or changed
    text = ", ".join(named[:_SHOWN_CHANGES])
    if len(named) > _SHOWN_CHANGES:
        text += f" and {len(named) - _SHOWN_CHANGES} more"
    rest = len(changed) - len(named)
    return text + (f" (and {rest} setting{'s' if rest > 1 else ''} derived from them)" if rest else "")


def _check_out_dir(
    out_dir: Path,
    resolved: Mapping[str, object],
    force: bool,
    started: Callable[[], bool],
    plan: RunPlan | None = None,
    tables: dict[str, TOMLTable] | None = None,
) -> None:
    """Refuse to mix two different runs in one folder (nothing is overwritten without --force).

    Args:
        started: whether any stage of the earlier run completed (asked only when the config changed: it
            imports the stages); a run that never completed a stage (e.g. a typo'd corpus path) is simply
            replaced.
        plan, tables: the resolved configs and the tables the user wrote, to name the changes they made
            (:func:`describe_changes`).
    Raises:
        FileExistsError: OUT_DIR is not a prodip run, or holds one made with another config.
    """
    marker = out_dir / RUN_MARKER
    if not marker.exists():
        if out_dir.exists() and not out_dir.is_dir():
            raise OutputExists(f"--out-dir {out_dir} is a file, not a folder")
        if out_dir.exists() and any(out_dir.iterdir()):
            raise OutputExists(
                f"{out_dir} is not empty and is not a prodip run (no {RUN_MARKER}); "
                f"choose another --out-dir (--force never deletes a folder prodip did not make)"
            )
        return
    saved = out_dir / RunMarker.read(marker).config
    before = _identity(read_toml(saved))
    # a table a newer prodip added ([extend]) that the saved config lacks and the user did not write: no change
    added = {k for k in SECTIONS if k not in before and k not in (tables or {})}
    changed = [
        k
        for k in _changed_keys(before, _identity(toml_roundtrip(resolved)))
        if not _added_at_default(k, before, plan) and k not in added
    ]
    if not changed or not started():
        return
    if not force:
        raise OutputExists(
            f"{out_dir} holds a run made with a different config ({describe_changes(changed, plan, tables or {})} "
            f"differ from {saved}); use another --out-dir, or --force to start over there"
        )
    log.warning("--force: removing the earlier run in %s", out_dir)
    shutil.rmtree(out_dir)


def _requests(run: RunConfig) -> CompletionRequests:
    """What the serve stage asks the server for: the pipeline file's top-level request keys."""
    sampling = {
        "temperature": run.completion_temperature,
        "top_p": run.completion_top_p,
        "frequency_penalty": run.completion_frequency_penalty,
        "seed": run.completion_seed,
    }
    return CompletionRequests(
        prompts=run.completion_prompts,
        chat_prompts=run.chat_prompts,
        max_tokens=run.completion_max_tokens,
        sampling=sampling,
        timeout_s=run.serve_timeout_s,
    )


def _run_stage(stage: Stage[Any], plan: RunPlan, ctx: RunContext) -> bool:
    """Run one stage on its own config; returns whether it is complete afterwards (serve always is)."""
    cfg = stage.own(plan)
    stage.run(cfg, ctx)
    return stage.name == "serve" or stage.done(cfg)


def run_pipeline(config_path: str, args: argparse.Namespace | None = None) -> JSONObject:
    """Run every configured stage of the pipeline described by ``config_path``.

    Returns:
        the summary dict (also written as ``OUT_DIR/summary.json``).

    Raises:
        ConfigError, FileExistsError, FileNotFoundError, ValueError: from the stages, naming the
        file or key at fault; the artifacts of completed stages are kept.
        FileExistsError: an artifact of the run was written by a newer prodip (file and format_version
        named; :func:`_refuse_newer_artifacts`), before anything is written or removed.
    """
    run, tables = load_run_config(config_path, args)
    out_dir = Path(run.out_dir)
    plan = resolve_all(config_path, tables, out_dir)
    resolved = {**{k: v for k, v in dataclasses.asdict(run).items() if k != "force"}, **plan.to_dict()}
    out_dir_check = functools.partial(
        _check_out_dir,
        out_dir,
        resolved,
        run.force,
        started=lambda: any(_active(_stages()[n], plan) and _done(_stages()[n], plan) for n in ORDER[:-1]),
        plan=plan,
        tables=tables,
    )
    if not run.force and RunMarker.read_or_none(out_dir / RUN_MARKER) is not None:
        out_dir_check()  # a changed config is refused first, before the plan's checks import every stage
    check_plan(plan, run.stages, source=str(config_path))
    _refuse_newer_artifacts(plan, out_dir, run.force)
    out_dir_check()  # again (cheap): --force removes the earlier run only once nothing in it is refused as newer
    to_run = [n for n in run.stages if n in CORPUS_STAGES and not _done(_stages()[n], plan)]  # they read corpora
    check_inputs(plan, to_run, source=str(config_path))
    out_dir.mkdir(parents=True, exist_ok=True)
    RunMarker(format_version=RunMarker.FORMAT_VERSION, config="config.toml").write(out_dir / RUN_MARKER)
    write_text_atomic(out_dir / "config.toml", dump_toml(resolved))

    times_path = out_dir / STAGE_TIMES_FILE  # wall time per stage, summed over invocations
    times = StageTimes.read_or_none(times_path) or StageTimes(format_version=StageTimes.FORMAT_VERSION)
    timings: dict[str, float] = {}
    ctx = RunContext(out_dir=out_dir, requests=_requests(run))
    wanted = [s for s in ORDER if s in run.stages]
    for i, name in enumerate(wanted, 1):
        stage = _stages()[name]
        if not _active(stage, plan):
            print(f"[{i}/{len(wanted)}] {name}: not configured, skipped", flush=True)
            continue
        cfg = stage.own(plan)
        if name != "serve" and stage.done(cfg) and _corpus_unchanged(out_dir, plan, name):
            _stamp_corpus(out_dir, plan, name)  # a run made before corpus stamps: stamped now
            print(f"[{i}/{len(wanted)}] {name}: already complete, skipped ({stage.describe(cfg)})", flush=True)
            continue
        print(f"[{i}/{len(wanted)}] {name}: {stage.describe(cfg)}", flush=True)
        t0 = time.perf_counter()
        finished = False
        try:  # an interrupted or failed invocation counts too (its time is carried into the next one)
            finished = _run_stage(stage, plan, ctx)
        finally:
            timings[name] = time.perf_counter() - t0
            times.add(name, timings[name], finished)
            times.write(times_path)
        if not finished:  # e.g. training stopped at max_steps_this_run
            print(
                f"[{i}/{len(wanted)}] {name}: stopped before completion after {timings[name]:.1f} s; "
                f"re-run the same command to continue",
                flush=True,
            )
            return {"ok": False, "paused_at": name}
        _stamp_corpus(out_dir, plan, name)
        print(f"[{i}/{len(wanted)}] {name}: done in {timings[name]:.1f} s", flush=True)
    from prodip.summary import print_summary  # noqa: PLC0415 (lazy: torch, onnx)

    summary = print_summary(plan, out_dir, timings, {k: v for k, v in times.stages.items() if k in run.stages})
    RunSummary.from_dict(summary, out_dir / SUMMARY_FILE).write(out_dir / SUMMARY_FILE)
    return summary


def add_subcommands(subparsers: argparse._SubParsersAction, only: str | None = None) -> None:
    """Register ``prodip run`` on the ``prodip`` parser."""
    p = subparsers.add_parser(
        "run",
        help="run the whole pipeline from one TOML config",
        description="Run tokenizer -> data -> train -> eval -> export -> conformance -> serve from one "
        "TOML file whose tables ([tokenizer], [audit], [data], [model], [train], [eval], "
        "[export], [conformance], [serve]) hold each stage's settings. Completed stages are "
        "skipped, so an interrupted run resumes.",
    )
    p.add_argument("config", help="pipeline TOML file, e.g. configs/demo.toml")
    add_arguments(p, RunConfig)
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    summary = run_pipeline(args.config, args)
    if summary.get("paused_at"):
        return 0  # a time-sliced run (max_steps_this_run): not a failure
    return 0 if summary.get("ok", False) else 1
