"""The export dir's ``manifest.json``: the only writer and reader of that file (:class:`ExportManifest`,
format_version 1).

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

Every part is typed in the base (which imports no stage), one module per kind: the files, source and
settings here, a variant's entry and its ``quantization`` in :mod:`prodip.base.variants`, the verdict in
:mod:`prodip.base.verdict`, ``card`` (built by ``prodip.export.card``) and ``card_quality`` (by
``prodip.conformance.card``) in :mod:`prodip.base.card`; every part is re-exported here. Only this module
opens the file: every other module reads it through :func:`load_manifest` (or :func:`verify_files`) and walks
the typed record; an edited record is written back with :func:`save_manifest`. A ``format_version`` newer
than this prodip reads is refused naming the version (:class:`prodip.base.records.NewerFormat`).

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
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar, TypedDict

from pydantic import Field, StrictBool, StrictInt, ValidationError, model_validator

from prodip import __version__
from prodip.base.card import Card as Card
from prodip.base.card import CardLicense as CardLicense
from prodip.base.card import CardQuality as CardQuality
from prodip.base.card import CardSource as CardSource
from prodip.base.card import CardStatement as CardStatement
from prodip.base.card import ForgettingRow as ForgettingRow
from prodip.base.card import QualityRow as QualityRow
from prodip.base.card import TaskPeer as TaskPeer
from prodip.base.card import TaskRow as TaskRow
from prodip.base.card import TaskScore as TaskScore
from prodip.base.card import TwinRow as TwinRow
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import file_sha256
from prodip.base.jsontypes import JSONObject
from prodip.base.records import Record, RecordPart, describe_errors
from prodip.base.variants import GgufQuantization as GgufQuantization
from prodip.base.variants import OnnxQuantization as OnnxQuantization
from prodip.base.variants import PteQuantization as PteQuantization
from prodip.base.variants import Quantization as Quantization
from prodip.base.variants import RunnerMetadata as RunnerMetadata
from prodip.base.variants import VariantEntry as VariantEntry
from prodip.base.verdict import ToleranceRecord as ToleranceRecord
from prodip.base.verdict import VariantCheck as VariantCheck
from prodip.base.verdict import Verdict as Verdict

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
#: Sub-folder written by `prodip conformance` after the export; not part of the hashed files.
UNLISTED_DIRS = ("conformance/",)
#: Files conformance rewrites after measuring (the model card with its quality figures).
CARD_FILES = ("README.md",)


def files_table_sha256(files: Mapping[str, object]) -> str:
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


class FileRow(TypedDict):
    """One file as :func:`list_files` measures it (the keys of :class:`FileEntry`)."""

    bytes: int
    sha256: str


def list_files(export_dir: str | os.PathLike[str]) -> dict[str, FileRow]:
    """``{relpath: {bytes, sha256}}`` for every file under ``export_dir`` but the manifest.

    Relative paths use ``/``; files under :data:`UNLISTED_DIRS` are left out.
    """
    root = Path(export_dir)
    files: dict[str, FileRow] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_FILE or rel.startswith(UNLISTED_DIRS) or rel.endswith(".tmp"):
            continue
        files[rel] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return files


class FileEntry(RecordPart):
    """One file of the export: its size and sha256 (``manifest.json`` ``files[relpath]``)."""

    bytes: StrictInt
    sha256: str


class SourceCheckpoint(RecordPart):
    """The checkpoint an export was made from (``manifest.json`` ``source_checkpoint``)."""

    path: str | None = None
    step: int | None = None
    model_sha256: str | None = None


class ExportSettings(RecordPart):
    """The resolved ``prodip.export.config.ExportConfig`` an export was made with (``manifest.json``
    ``export_config``, ``dataclasses.asdict`` of it): its fields, in its order (a test holds the two equal).
    Only ``variants`` is required (read by the pipeline's done-check); keys a newer export adds are kept."""

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
    #: the .pte's KV window (tokens; 0 = the model's whole window)
    pte_max_seq_len: StrictInt | None = None
    force: StrictBool | None = None
    base_model_id: str | None = None


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

    def files_table(self) -> dict[str, JSONObject]:
        """``files`` as plain dicts (what :func:`files_table_sha256` hashes)."""
        return {rel: entry.model_dump(mode="python") for rel, entry in self.files.items()}

    def formats(self, fmt: str) -> list[str]:
        """Names of the variants of format ``fmt`` (``onnx``, ``gguf``, ...), in the manifest's order."""
        return [name for name, v in self.variants.items() if v.format == fmt]


def write_manifest(
    export_dir: str | os.PathLike[str],
    *,
    source_checkpoint: Mapping[str, object],
    tokenizer_sha256: str | None,
    variants: Mapping[str, Mapping[str, object]],
    export_config: Mapping[str, object] | None = None,
    card: Card | Mapping[str, object] | None = None,
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


def set_conformance(export_dir: str | os.PathLike[str], verdict: Mapping[str, object] | None) -> ExportManifest:
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
