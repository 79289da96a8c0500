"""The export dir's ``manifest.json``: the only writer and reader of that file (:class:`ExportManifest`,
format_version 1), and the conformance verdict's one definition (:class:`Verdict`).

Layout (CONTRACTS.md "Export dir")::

    {format_version: 1, prodip_version, created_utc,
     source_checkpoint: {path, step, model_sha256}, tokenizer_sha256,
     versions: {prodip, python, torch, onnx, onnxruntime, onnxscript, safetensors, transformers?},
     files: {relpath: {bytes, sha256}},          # every file of the export but manifest.json
     variants: {name: {path, format, dtype, quantization, external_data: [relpath, ...], ...}},  # VariantEntry;
                                                 # quantization: Onnx-/Gguf-/PteQuantization by writer
     export_config: {variants, ...},             # ExportSettings: the resolved ExportConfig
     card: {license, languages, datasets, tags, base_model, sources, statement, tokens_seen_by_language},  # Card
     conformance: null | {passed, variants: {name: bool}, report, report_sha256, checked_utc,
                         checks: {name: {passed, checked_utc, report, report_sha256}},
                         export_files_sha256},  # Verdict (merged per variant by conformance.verdict.merge_verdict)
     card_quality?: {rows, twin, export_files_sha256}}  # CardQuality: the quality card's figures, by conformance

Every part is typed here, beside the record that holds it (the base imports no stage), though ``card`` is
built by ``prodip.export.card`` and ``card_quality`` by ``prodip.conformance.card``: each declares every key its
writer writes, in the writer's order, and keeps keys a newer writer adds. Every other module reads the file
through :func:`load_manifest` (or :func:`verify_files`) and walks the typed record; an edited record is written back with :func:`save_manifest`. A ``format_version`` newer than
this prodip reads is refused naming the version (:class:`prodip.base.records.NewerFormat`).

Files under ``conformance/`` (the conformance report, written after the export) are not
listed and not checked.

    python -c "from prodip.base.manifest import verify_files; verify_files('runs/demo/export')"
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
    ValidationError,
    model_validator,
)

from prodip import __version__
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import file_sha256
from prodip.base.records import AsWritten, Number, Record, describe_errors

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
#: Sub-folder written by `prodip conformance` after the export; not part of the hashed files.
UNLISTED_DIRS = ("conformance/",)
#: Files conformance rewrites after measuring (the model card with its quality figures).
CARD_FILES = ("README.md",)


def files_table_sha256(files: dict[str, Any]) -> str:
    """sha256 of a manifest ``files`` table as canonical JSON (sorted keys): what a conformance verdict
    records as ``export_files_sha256`` and what ``prodip serve`` compares it with (stable under the
    verdict rewrite, changed by any file's new bytes or sha256). The model card (:data:`CARD_FILES`) is left
    out: conformance writes its quality figures after measuring, so it is hashed in ``files`` (and checked
    by conformance against the manifest) but is not a measured file."""
    measured = {k: v for k, v in files.items() if k not in CARD_FILES}
    return hashlib.sha256(json.dumps(measured, sort_keys=True).encode()).hexdigest()


def utc_now() -> str:
    """Current UTC time as ISO 8601 with a ``Z`` suffix, e.g. ``2026-11-29T21:50:00Z``."""
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def tool_versions() -> dict[str, str]:
    """Installed versions of the packages that shape the exported files (missing ones omitted)."""
    out = {"python": platform.python_version()}
    for dist in (
        "prodip",
        "torch",
        "onnx",
        "onnxruntime",
        "onnxscript",
        "safetensors",
        "transformers",
        "tokenizers",
        "numpy",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def list_files(export_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """``{relpath: {bytes, sha256}}`` for every file under ``export_dir`` but the manifest.

    Relative paths use ``/``; files under :data:`UNLISTED_DIRS` are left out.
    """
    root = Path(export_dir)
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_FILE or rel.startswith(UNLISTED_DIRS) or rel.endswith(".tmp"):
            continue
        files[rel] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return files


class FileEntry(BaseModel):
    """One file of the export: its size and sha256 (``manifest.json`` ``files[relpath]``)."""

    model_config = ConfigDict(extra="allow")

    bytes: StrictInt
    sha256: str


class SourceCheckpoint(BaseModel):
    """The checkpoint an export was made from (``manifest.json`` ``source_checkpoint``)."""

    model_config = ConfigDict(extra="allow")

    path: str | None = None
    step: int | None = None
    model_sha256: str | None = None


class OnnxQuantization(BaseModel):
    """An ONNX variant's ``quantization`` (``prodip.export.quantize``: ``to_fp16``, ``to_int8``, ``to_int4``):
    every key those write, in their order (each writes only its own; the fp32 variant has none). Keys a newer
    export adds are kept."""

    model_config = ConfigDict(extra="allow")

    #: the function or library that rewrote the graph
    tool: str
    #: fp16: float32 inputs and outputs kept; the op types left in float32; nodes kept float32; casts removed
    keep_io_types: StrictBool | None = None
    op_block_list: list[str] | None = None
    rope_nodes_kept_fp32: StrictInt | None = None
    rmsnorm_nodes_kept_fp32: StrictInt | None = None
    fp16_round_trips_removed: StrictInt | None = None
    #: int8/int4: rounding algorithm, the operator format, bits per weight
    algorithm: str | None = None
    format: str | None = None
    bits: StrictInt | None = None
    #: int8: one scale per output channel; activations quantised per row at run time
    weight_granularity: str | None = None
    activation_quantization: str | None = None
    #: int4: weights per block along the input dim
    block_size: StrictInt | None = None
    symmetric: StrictBool | None = None
    #: int8: MatMuls rewritten to MatMulInteger
    matmuls_quantized: StrictInt | None = None
    op_types: list[str] | None = None
    embedding_quantized: StrictBool | None = None
    #: int8: weights per scale of an untied embedding table (None: shared with the lm_head)
    embedding_block_size: StrictInt | None = None
    lm_head_quantized: StrictBool | None = None
    embedding_shared_with_lm_head: StrictBool | None = None
    #: GatherBlockQuantized lookups lowered to standard operators (count)
    embedding_lookup_lowered: StrictInt | None = None
    #: int4: MatMulNBits ``accuracy_level``
    accuracy_level: StrictInt | None = None
    materialized_transposes: StrictInt | None = None
    #: whether the weights are in an external file (set to True when export moved them to ``<file>_data``)
    external_data: StrictBool | None = None
    #: int4: the graph's default-domain opset after quantisation
    opset: StrictInt | None = None
    embedding_layout: str | None = None
    embedding_not_shared_because: str | None = None
    embedding_not_quantized_because: str | None = None


class GgufQuantization(BaseModel):
    """A GGUF variant's ``quantization`` (``prodip.export.gguf.export_gguf``), keys in its order."""

    model_config = ConfigDict(extra="allow")

    #: GGUF tensor type -> number of tensors of it (``{"Q4_K": 14, "F32": 5}``)
    tensor_types: dict[str, StrictInt]
    #: llama.cpp pre-tokenizer type (``tokenizer.ggml.pre``)
    pre: str | None = None
    #: tokens in the GGUF vocabulary (padded to the embedding's rows)
    tokens: StrictInt | None = None
    quantizer: str | None = None
    gguf_py_version: str | None = None


class RunnerMetadata(BaseModel):
    """The constant methods of a ``.pte`` ExecuTorch's LLM runners read (``prodip.export.executorch.runner_metadata``)."""

    model_config = ConfigDict(extra="allow")

    get_bos_id: StrictInt
    get_eos_ids: list[StrictInt]
    get_max_seq_len: StrictInt
    get_max_context_len: StrictInt | None = None
    get_vocab_size: StrictInt | None = None
    get_n_layers: StrictInt | None = None
    use_kv_cache: StrictBool | None = None
    use_sdpa_with_kv_cache: StrictBool | None = None
    enable_dynamic_shape: StrictBool | None = None


class PteQuantization(BaseModel):
    """A ``.pte`` variant's ``quantization`` (``prodip.export.executorch.export_pte``), keys in its order."""

    model_config = ConfigDict(extra="allow")

    #: ``8da4w`` (8-bit dynamic activations, 4-bit grouped weights) or None (float32)
    scheme: str | None
    #: 8da4w: int4 weights per group along each Linear's input dim
    group_size: StrictInt | None = None
    quantizer: str | None = None
    backend: str | None = None
    runner_metadata: RunnerMetadata
    executorch_version: str | None = None
    torchao_version: str | None = None


def _quantization_kind(value: Any) -> str:
    """Which writer's ``quantization`` ``value`` is, by the key only that writer writes."""
    if isinstance(value, BaseModel):
        return {PteQuantization: "pte", GgufQuantization: "gguf"}.get(type(value), "onnx")
    keys = value if isinstance(value, dict) else {}
    return "pte" if "runner_metadata" in keys else "gguf" if "tensor_types" in keys else "onnx"


#: a variant's ``quantization``: which one is told by the keys only its writer writes (an error names the kind
#: in its path: ``variants.int4.quantization.onnx.bits``); :class:`VariantEntry` checks it fits ``format``
Quantization = Annotated[
    Annotated[OnnxQuantization, Tag("onnx")]
    | Annotated[GgufQuantization, Tag("gguf")]
    | Annotated[PteQuantization, Tag("pte")],
    Discriminator(_quantization_kind),
]
_QUANTIZATION_OF = {"onnx": OnnxQuantization, "gguf": GgufQuantization, "pte": PteQuantization}


class VariantEntry(BaseModel):
    """One variant of the export (``manifest.json`` ``variants[name]``): every key ``prodip export`` writes,
    declared in the order it writes them (a variant has only those of its format; the ones it lacks stay
    unset and are not written back). Keys a newer export adds are kept.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    #: the variant's file, relative to the export dir (``onnx/model_q4.onnx``)
    path: str
    #: ``safetensors``, ``onnx``, ``gguf`` or ``pte`` (``prodip.base.variants``)
    format: str
    #: weight dtype as the export names it (``float32``, ``int4``, ``bfloat16``, ``q8_0``, ...)
    dtype: str | None = None
    #: how the weights were converted or quantised (:data:`Quantization`; None: not)
    quantization: Quantization | None = None
    #: files holding the graph's weights (ONNX ``<file>_data``), relative to the export dir
    external_data: list[str] = Field(default_factory=list)
    #: ONNX: dtype of the graph's float inputs and outputs, and of the KV cache
    io_dtype: str | None = None
    kv_cache_dtype: str | None = None
    #: ONNX: the default-domain opset, and every domain's (``{"ai.onnx": 17, "com.microsoft": 1}``)
    opset: StrictInt | None = None
    opset_imports: dict[str, StrictInt] | None = None
    #: ONNX: ``contrib`` (ONNX Runtime's fused operators) or ``standard`` (ONNX operators only)
    graph: str | None = None
    #: ONNX contrib: the shared-buffer graph for onnxruntime-genai
    genai_path: str | None = None
    #: ONNX: the dtype transformers.js loads the variant by (``fp32``, ``q8``, ...)
    transformersjs_dtype: str | None = None
    #: ONNX: what ``og.Config.overlay`` needs to load the variant (``prodip.export.genai.genai_overlay``)
    genai_overlay: dict[str, Any] | None = None
    #: ONNX: whether ``genai_config.json`` names this variant
    genai_default: StrictBool | None = None
    #: ``.pte``: the file its runner reads its tokenizer from (others read ``tokenizer.json``)
    tokenizer: str | None = None

    @model_validator(mode="after")
    def _quantization_fits_format(self) -> VariantEntry:
        want = _QUANTIZATION_OF.get(self.format)
        if self.quantization is not None and want is not None and not isinstance(self.quantization, want):
            kind = _quantization_kind(self.quantization)
            raise ValueError(f"quantization is a {kind} variant's, but the variant's format is {self.format!r}")
        return self

    def files(self) -> list[str]:
        """The variant's file and its external data, relative to the export dir."""
        return [self.path, *self.external_data]


class ToleranceRecord(BaseModel):
    """The tolerance file a conformance run used (``conformance.checks[name].tolerances``)."""

    model_config = ConfigDict(extra="allow")

    path: str | None = None
    sha256: str
    shipped: StrictBool
    #: bounds looser than the shipped file: ``[{table, metric, shipped, used}]``
    loosened: list[dict[str, Any]]


class VariantCheck(BaseModel):
    """One variant's entry of the verdict's ``checks``: which run checked it, and how."""

    model_config = ConfigDict(extra="allow")

    passed: StrictBool
    checked_utc: str | None = None
    report: str | None = None
    report_sha256: str | None = None
    tolerances: ToleranceRecord | None = None
    #: on-device runtime -> whether its ids were identical
    runtimes: dict[str, StrictBool] | None = None


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _is_sha256(value: object) -> bool:
    return isinstance(value, str) and _HEX64.fullmatch(value) is not None


class Verdict(BaseModel):
    """The conformance verdict in the export manifest's ``conformance`` slot: its one definition.

    ``prodip.conformance.verdict.merge_verdict`` builds it, :func:`set_conformance` validates and writes
    it, and ``prodip serve`` asks :meth:`serve_problem` whether it vouches for a variant. Only ``passed``
    is required of a slot (older prodips wrote ``{passed, variants, report, report_sha256}``); what
    ``merge_verdict`` always writes, and serve requires, is checked by :meth:`serve_problem`.
    Fields in the order ``merge_verdict`` writes them.
    """

    model_config = ConfigDict(extra="allow")

    passed: StrictBool
    variants: dict[str, StrictBool] | None = None
    checks: dict[str, VariantCheck] | None = None
    #: :func:`files_table_sha256` of the files table the run measured
    export_files_sha256: str | None = None
    report: str | None = None
    report_sha256: str | None = None
    checked_utc: str | None = None
    tolerances: dict[str, Any] | None = None

    @classmethod
    def parse(cls, slot: Any, where: str = MANIFEST_FILE) -> Verdict:
        """Validate a ``conformance`` slot.

        Raises:
            InvalidInput: not an object, no boolean ``passed``, or a mistyped field (named).
        """
        if not isinstance(slot, dict):
            raise InvalidInput(f"{where}: conformance verdict is {type(slot).__name__}, not an object")
        try:
            return cls.model_validate(slot)
        except ValidationError as err:
            raise InvalidInput(f"{where}: conformance verdict: {describe_errors(err)}") from None

    def to_dict(self) -> dict[str, Any]:
        """The slot as written (fields never set left out)."""
        out: dict[str, Any] = self.model_dump(mode="python", exclude_unset=True)
        return out

    def serve_problem(self, variant: str) -> str | None:
        """What this verdict lacks to vouch for ``variant`` as ``merge_verdict`` writes it (None: complete;
        a verdict that does not mention ``variant`` at all is also None: the caller says so).

        Required: per-variant ``variants`` and ``checks``, ``export_files_sha256`` and ``report_sha256``
        (64 hex digits), a ``report``, and for ``variant`` a consistent entry in both tables naming its
        report and the tolerances it was checked with.
        """
        for key in ("variants", "checks"):
            if getattr(self, key) is None:
                return f"has no per-variant {key!r} table"
        for key in ("export_files_sha256", "report_sha256"):
            if not _is_sha256(getattr(self, key)):
                return f"has no {key!r} (64 hex digits)"
        if not self.report:
            return "names no report"
        per_variant, checks = self.variants or {}, self.checks or {}
        if variant not in per_variant and variant not in checks:
            return None
        ok, check = per_variant.get(variant), checks.get(variant)
        if ok is None or check is None or check.passed is not ok:
            return f"has no consistent entry for variant {variant!r} in 'variants' and 'checks'"
        if not _is_sha256(check.report_sha256) or check.report is None:
            return f"names no report for variant {variant!r}"
        if check.tolerances is None or not _is_sha256(check.tolerances.sha256):
            return (
                f"does not record the tolerances variant {variant!r} was checked with "
                "(made by an older prodip conformance)"
            )
        return None


class ExportSettings(BaseModel):
    """The resolved ``prodip.export.config.ExportConfig`` an export was made with (``manifest.json``
    ``export_config``, ``dataclasses.asdict`` of it): its fields, in its order (a test holds the two equal).
    Only ``variants`` is required (read by the pipeline's done-check); keys a newer export adds are kept."""

    model_config = ConfigDict(extra="allow")

    checkpoint: str | None = None
    out: str | None = None
    #: the variants asked for (``model.safetensors`` is written whatever this says)
    variants: list[str]
    safetensors_dtype: str | None = None
    opset: StrictInt | None = None
    onnx_graph: str | None = None
    onnx_external_data: StrictBool | None = None
    int8_block_size: StrictInt | None = None
    int8_quantize_embeddings: StrictBool | None = None
    int4_block_size: StrictInt | None = None
    int4_symmetric: StrictBool | None = None
    int4_quantize_embeddings: StrictBool | None = None
    int4_quantize_lm_head: StrictBool | None = None
    int4_accuracy_level: StrictInt | None = None
    pte_group_size: StrictInt | None = None
    force: StrictBool | None = None
    base_model_id: str | None = None


class CardLicense(BaseModel):
    """The card's licence for the Hub (``prodip.base.sources.hf_license``): one SPDX id in lower case, or
    ``other`` with ``license_name`` and ``license_link``."""

    model_config = ConfigDict(extra="allow")

    license: str
    license_name: str | None = None
    license_link: str | None = None


class CardSource(AsWritten):
    """One source of the card (``card.sources[i]``): its record's card fields
    (``prodip.base.sources.SourceRecord.card_fields``) with the counts the shards recorded and the tokens
    training saw, or a tokenizer-only input (``stage`` ``tokenizer``) or a fine-tuning one (``sft``). Its
    writers order the keys differently (each entry is copied from the artifact that recorded it), so an entry
    keeps the order it was read in (:class:`~prodip.base.records.AsWritten`)."""

    name: str
    language: str
    variety: str | None = None
    origin: str | None = None
    #: SPDX expression, ``unknown`` or ``other``
    license: str
    license_name: str | None = None
    license_link: str | None = None
    dataset_id: str | None = None
    notes: str | None = None
    #: ``prodip.base.sources.CLASSES``
    license_class: str | None = None
    license_terms: list[str] | None = None
    included_by_choice: StrictBool | None = None
    #: documents, characters and tokens of the source in the shards (all splits), and its shares of its language
    documents: StrictInt | None = None
    chars: StrictInt | None = None
    tokens: StrictInt | None = None
    chars_share_of_language: Number | None = None
    tokens_share_of_language: Number | None = None
    #: ``pretraining``, ``sft`` or ``tokenizer`` (absent: pretraining)
    stage: str | None = None
    #: sft: the number of files the source matched
    files: StrictInt | None = None
    #: tokens of the source the training run saw (None: not counted)
    tokens_seen: StrictInt | None = None


class CardStatement(AsWritten):
    """The card's licence statement of the mix (``prodip.base.sources.licence_statement``)."""

    #: the most restrictive source's class (``prodip.base.sources.CLASSES``); the file's key is ``class``
    class_: str = Field(alias="class")
    licenses: list[str]
    share_alike: list[str]
    non_commercial: list[str]
    attribution: list[str]
    unknown_included: list[str]
    cleared: StrictBool
    #: one paragraph for the cards
    text: str


class Card(BaseModel):
    """The model card's facts (``manifest.json`` ``card``; owner ``prodip.export.card``, which builds it with
    ``build_card`` and writes it into every artifact; ``prodip.conformance.card`` reads it back), keys in
    ``build_card``'s order. Keys a newer export adds are kept."""

    model_config = ConfigDict(extra="allow")

    license: CardLicense
    languages: list[str]
    datasets: list[str]
    tags: list[str]
    #: the checkpoint or Hub id fine-tuning started from (None: trained from scratch)
    base_model: str | None
    sources: list[CardSource]
    statement: CardStatement
    #: language -> tokens of it training saw
    tokens_seen_by_language: dict[str, StrictInt] = Field(default_factory=dict)
    #: a fine-tuning run's replay of pretraining data (``[sft] replay_share``; absent: none): share_of_rows,
    #: share_of_trained_tokens, tokens_by_language, shards_meta_sha256, ...
    replay: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The card as ``manifest.json`` holds it (fields never set left out)."""
        out: dict[str, Any] = self.model_dump(mode="python", exclude_unset=True)
        return out


class QualityRow(BaseModel):
    """One variant and held-out language of the quality card (``card_quality.rows[i]``,
    ``prodip.conformance.card.quality_rows``): bits/char, the training model's and the change, KL(training
    model || variant) mean and 99.9th percentile (nats), top-1 and greedy agreement (shares), the variant's
    bytes on disk and the runtimes that ran it and passed."""

    model_config = ConfigDict(extra="allow")

    variant: str
    language: str
    bpc: Number | None
    bpc_ref: Number | None
    bpc_delta: Number | None
    kl_mean: Number | None
    kl_p999: Number | None
    top1: Number | None
    greedy_agreement: Number | None
    bytes: StrictInt
    runtimes: list[str]


class TwinRow(BaseModel):
    """The trained model against its random-initialised twin for one language (``card_quality.twin[i]``, from
    ``eval.json``): NLL per token (nats) and bits/char of each."""

    model_config = ConfigDict(extra="allow")

    language: str
    nll_token: Number | None
    bpc: Number | None
    random_nll_token: Number | None
    random_bpc: Number | None


class TaskScore(BaseModel):
    """One model's figure on one task (``card_quality.tasks[i].scores[column]``): the metric's value and the
    harness's standard error (None: the harness gave none)."""

    model_config = ConfigDict(extra="allow")

    value: Number | None
    stderr: Number | None = None


class TaskRow(BaseModel):
    """One lm-evaluation-harness task of the quality card (``card_quality.tasks[i]``, owner
    ``prodip.conformance.tasks``): its language, shots, items, metric, chance level (mean 1/choices; None for a
    task that is not multiple choice), the figure of each column in the card's order (``random twin`` and
    ``base`` from ``eval.json``, ``checkpoint`` = the exported weights in PyTorch, then each variant), the variants
    whose drop from the checkpoint exceeds their own standard error (``flagged``) and seconds per column."""

    model_config = ConfigDict(extra="allow")

    task: str
    language: str
    #: the harness's kind: multiple_choice, loglikelihood(_rolling), generate_until (a chat task); None: not recorded
    output_type: str | None = None
    shots: StrictInt
    items: StrictInt
    metric: str
    higher_is_better: bool = True
    chance: Number | None = None
    scores: dict[str, TaskScore]
    flagged: list[str] = Field(default_factory=list)
    seconds: dict[str, Number] = Field(default_factory=dict)


class TaskPeer(BaseModel):
    """A reference model's published task scores, from the user's peers file (``card_quality.task_peers``):
    its name, where the scores come from, and task name -> score (the card's metric of that task)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    source: str
    scores: dict[str, Number]


class ForgettingRow(BaseModel):
    """What fine-tuning cost one language (``card_quality.forgetting[i]``, ``prodip.conformance.tasks``): bits/char
    of the pretrained model (eval.json's checkpoint) and of the exported fine-tuned one on the same held-out
    windows, and the relative change (``bpc / base_bpc - 1``; positive: worse after fine-tuning)."""

    model_config = ConfigDict(extra="allow")

    language: str
    base_bpc: Number
    bpc: Number
    change: Number


class CardQuality(BaseModel):
    """The quality card's figures (``manifest.json`` ``card_quality``; owner ``prodip.conformance.card``,
    written from its report by ``write_quality``), keys in its order. Keys a newer conformance adds are kept."""

    model_config = ConfigDict(extra="allow")

    rows: list[QualityRow]
    twin: list[TwinRow] = Field(default_factory=list)
    #: :func:`files_table_sha256` of the files the figures were measured on
    export_files_sha256: str | None = None
    #: lm-evaluation-harness tasks: one row per task, a column per model and variant
    tasks: list[TaskRow] = Field(default_factory=list)
    #: the settings the task figures were measured with (task names, few-shot, limit, seed, harness version)
    task_settings: dict[str, Any] | None = None
    #: reference models' scores from the user's peers file, shown beside the task table
    task_peers: list[TaskPeer] = Field(default_factory=list)
    #: the pretrained model against the exported fine-tuned one on the same held-out text, per language
    forgetting: list[ForgettingRow] = Field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The figures as ``manifest.json`` holds them (fields never set left out)."""
        out: dict[str, Any] = self.model_dump(mode="python", exclude_unset=True)
        return out


class ExportManifest(Record):
    """The export dir's ``manifest.json`` (layout in the module docstring). Written by ``prodip export``
    (:func:`write_manifest`), rewritten by conformance (:func:`set_conformance`, :func:`save_manifest` for the
    quality card); fields in the order ``prodip export`` writes them."""

    FILE: ClassVar[str] = MANIFEST_FILE
    FORMAT_VERSION: ClassVar[int] = FORMAT_VERSION
    READS: ClassVar[tuple[int, ...]] = (FORMAT_VERSION,)
    MAKER: ClassVar[str] = "`prodip export`"

    prodip_version: str | None = None
    created_utc: str | None = None
    source_checkpoint: SourceCheckpoint
    tokenizer_sha256: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)
    files: dict[str, FileEntry]
    variants: dict[str, VariantEntry]
    export_config: ExportSettings | None = None
    card: Card | None = None
    #: the conformance verdict (None: conformance has not run on this export, it was cleared, or the file's
    #: verdict is damaged: see :attr:`conformance_problem`)
    conformance: Verdict | None = None
    #: why the file's verdict was set aside (field and reason), not written back. A damaged verdict must not
    #: make the whole export unreadable: serve refuses it by name (or serves with --allow-unverified) and
    #: `prodip conformance` replaces it; the next write of the manifest drops it.
    conformance_problem: str | None = Field(default=None, exclude=True)
    #: the quality card's figures (written by conformance from its report)
    card_quality: CardQuality | None = None

    @model_validator(mode="before")
    @classmethod
    def _set_aside_a_damaged_verdict(cls, data: Any) -> Any:
        """A ``conformance`` object that is not a :class:`Verdict` becomes None with the reason in
        ``conformance_problem``; an empty object is no verdict (what older writers left)."""
        if not isinstance(data, dict) or data.get("conformance") is None:
            return data
        raw = data["conformance"]
        if raw == {}:
            return {**data, "conformance": None}
        try:
            Verdict.model_validate(raw)
        except ValidationError as err:
            return {**data, "conformance": None, "conformance_problem": describe_errors(err)}
        return data

    def files_table(self) -> dict[str, dict[str, Any]]:
        """``files`` as plain dicts (what :func:`files_table_sha256` hashes)."""
        return {rel: entry.model_dump(mode="python") for rel, entry in self.files.items()}

    def formats(self, fmt: str) -> list[str]:
        """Names of the variants of format ``fmt`` (``onnx``, ``gguf``, ...), in the manifest's order."""
        return [name for name, v in self.variants.items() if v.format == fmt]


def write_manifest(
    export_dir: str | os.PathLike[str],
    *,
    source_checkpoint: dict[str, Any],
    tokenizer_sha256: str | None,
    variants: dict[str, dict[str, Any]],
    export_config: dict[str, Any] | None = None,
    card: Card | dict[str, Any] | None = None,
) -> ExportManifest:
    """Hash every file of ``export_dir`` and write ``manifest.json`` (atomically).

    Args:
        export_dir: a complete export dir (all artifacts already written).
        source_checkpoint: ``{"path": str, "step": int, "model_sha256": str}``.
        tokenizer_sha256: sha256 of ``tokenizer.json`` (None when the export has no tokenizer).
        variants: name -> ``{path, format, dtype, quantization, ...}`` (paths relative; the keys of
            :class:`VariantEntry`, in its order).
        export_config: the resolved ExportConfig as a dict, recorded for reproduction.
        card: the model card's facts (``prodip.export.card.build_card``): licence, languages, sources, ...;
            ``README.md`` is hashed in ``files`` like every other file.
    Returns:
        The manifest written.
    Raises:
        MissingInput: a variant's file is not a file of ``export_dir``.
        RecordError: a variant entry is not a :class:`VariantEntry` (field named).
    """
    root = Path(export_dir)
    files = list_files(root)
    manifest = ExportManifest.from_dict(
        {
            "format_version": FORMAT_VERSION,
            "prodip_version": __version__,
            "created_utc": utc_now(),
            "source_checkpoint": source_checkpoint,
            "tokenizer_sha256": tokenizer_sha256,
            "versions": {**tool_versions(), "prodip": __version__},
            "files": files,
            "variants": variants,
            "export_config": export_config,
            "card": card,
            "conformance": None,
        },
        root / MANIFEST_FILE,
    )
    for name, entry in manifest.variants.items():
        for rel in entry.files():
            if rel not in files:
                raise MissingInput(f"{root / rel}: file of variant {name!r} missing from the export")
    manifest.write(root / MANIFEST_FILE)
    return manifest


def load_manifest(export_dir: str | os.PathLike[str]) -> ExportManifest:
    """The export dir's ``manifest.json`` as a typed record: the one reader.

    Raises:
        MissingInput: no manifest (the dir was not made by `prodip export`, or is incomplete).
        NewerFormat: a ``format_version`` newer than this prodip reads (found and read versions named).
        RecordError: not JSON, another ``format_version`` this prodip does not read, or a missing or
            mistyped field (file and field named; a :class:`~prodip.base.errors.InvalidInput`).
    """
    return ExportManifest.read(Path(export_dir) / MANIFEST_FILE)


def save_manifest(export_dir: str | os.PathLike[str], manifest: ExportManifest) -> ExportManifest:
    """Write back a manifest read with :func:`load_manifest` and edited (conformance's quality card, a
    planted fault's re-hash): revalidated, then written atomically in the layout export wrote.

    Raises:
        RecordError: the edited manifest is no longer one (field named).
        WriteFailed: no room to write it.
    """
    path = Path(export_dir) / MANIFEST_FILE
    record = ExportManifest.from_dict(manifest.to_dict(), path)
    record.write(path)
    return record


def verify_files(
    export_dir: str | os.PathLike[str], *, allow_unlisted: bool = False, hash_file: Callable[[Path], str] = file_sha256
) -> ExportManifest:
    """Check every listed file's size and sha256, and that no unlisted file was added.

    Args:
        export_dir: an export dir.
        allow_unlisted: accept files the manifest does not list (outside ``conformance/``).
        hash_file: path -> hex sha256 (the pipeline passes a cached one).
    Returns:
        The manifest (:func:`load_manifest`).
    Raises:
        MissingInput: the manifest or a listed file is missing (named).
        InvalidInput: an unreadable manifest (:func:`load_manifest`), a file whose bytes or sha256 differ
            from the manifest, or an unlisted file (named, with both values).
    """
    root = Path(export_dir)
    manifest = load_manifest(root)
    for rel, meta in manifest.files.items():
        path = root / rel
        if not path.is_file():
            raise MissingInput(f"{path}: missing from the export (listed in {root / MANIFEST_FILE})")
        size = path.stat().st_size
        if size != meta.bytes:
            raise InvalidInput(f"{path}: {size} bytes, manifest says {meta.bytes} (truncated or replaced)")
        digest = hash_file(path)
        if digest != meta.sha256:
            raise InvalidInput(
                f"{path}: sha256 differs from the export manifest's ({digest[:16]}.. vs "
                f"{meta.sha256[:16]}..; modified after export)"
            )
    if not allow_unlisted:
        extra = sorted(set(list_files(root)) - set(manifest.files))
        if extra:
            raise InvalidInput(f"{root}: file(s) not listed in {MANIFEST_FILE}: {', '.join(extra)}")
    return manifest


def set_conformance(export_dir: str | os.PathLike[str], verdict: dict[str, Any] | None) -> ExportManifest:
    """Record a conformance verdict in the manifest's ``conformance`` slot (atomic rewrite).

    Args:
        export_dir: an export dir.
        verdict: a :class:`Verdict` as a dict (``prodip.conformance.verdict.merge_verdict``;
            ``checked_utc`` is filled in when absent), or ``None`` to clear the slot.
    Returns:
        The updated manifest.
    Raises:
        InvalidInput: ``verdict`` is not a :class:`Verdict` (field named), or names a variant the manifest
            does not have.
        MissingInput: no manifest.
    """
    root = Path(export_dir)
    manifest = load_manifest(root)
    record = None
    if verdict is not None:
        record = Verdict.parse(verdict, str(root / MANIFEST_FILE))
        unknown = sorted(set(record.variants or {}) - set(manifest.variants))
        if unknown:
            raise InvalidInput(
                f"conformance verdict names variant(s) {unknown} not in {root / MANIFEST_FILE} "
                f"(has {sorted(manifest.variants)})"
            )
        if not record.checked_utc:
            record.checked_utc = utc_now()
    manifest.conformance = record
    manifest.conformance_problem = None
    manifest.write(root / MANIFEST_FILE)
    return manifest


def verdict_is_current(manifest: ExportManifest) -> bool:
    """Whether the manifest's conformance verdict was measured on the export's current files.

    A verdict records ``export_files_sha256`` (:func:`files_table_sha256` of the files table it
    checked); a re-export or a changed file changes the table, which voids the verdict.

    Returns:
        True when there is a verdict and it names the current files table (passed or not).
    """
    verdict = manifest.conformance
    return verdict is not None and verdict.export_files_sha256 == files_table_sha256(manifest.files_table())
