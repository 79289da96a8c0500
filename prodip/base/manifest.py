"""The export dir's ``manifest.json``: the only writer and reader of that file.

Layout (CONTRACTS.md "Export dir")::

    {format_version: 1, prodip_version, created_utc,
     source_checkpoint: {path, step, model_sha256}, tokenizer_sha256,
     versions: {prodip, python, torch, onnx, onnxruntime, onnxscript, safetensors, transformers?},
     files: {relpath: {bytes, sha256}},          # every file of the export but manifest.json
     variants: {name: {path, format, dtype, quantization, external_data: [relpath, ...]}},
     export_config: {...},                       # the resolved ExportConfig
     card: {license, languages, datasets, tags, base_model, sources, statement, tokens_seen_by_language},
     conformance: null | {passed, variants: {name: bool}, report, report_sha256, checked_utc,
                         checks: {name: {passed, checked_utc, report, report_sha256}},
                         export_files_sha256}}  (merged per variant by conformance.suite.merge_verdict)

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
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from prodip import __version__
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.files import file_sha256, writing

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


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    with writing(tmp, shown_as=path, remove_on_error=True):
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def write_manifest(
    export_dir: str | os.PathLike[str],
    *,
    source_checkpoint: dict[str, Any],
    tokenizer_sha256: str | None,
    variants: dict[str, dict[str, Any]],
    export_config: dict[str, Any] | None = None,
    card: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Hash every file of ``export_dir`` and write ``manifest.json`` (atomically).

    Args:
        export_dir: a complete export dir (all artifacts already written).
        source_checkpoint: ``{"path": str, "step": int, "model_sha256": str}``.
        tokenizer_sha256: sha256 of ``tokenizer.json`` (None when the export has no tokenizer).
        variants: name -> ``{path, format, dtype, quantization, ...}`` (paths relative).
        export_config: the resolved ExportConfig as a dict, recorded for reproduction.
        card: the model card's facts (``prodip.export.card.build_card``): licence, languages, sources, ...;
            ``README.md`` is hashed in ``files`` like every other file.
    Returns:
        The manifest dict.
    Raises:
        FileNotFoundError: a variant's ``path`` is not a file of ``export_dir``.
    """
    root = Path(export_dir)
    files = list_files(root)
    for name, variant in variants.items():
        for rel in [variant["path"], *variant.get("external_data", [])]:
            if rel not in files:
                raise MissingInput(f"{root / rel}: file of variant {name!r} missing from the export")
    manifest = {
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
    }
    _write_json_atomic(root / MANIFEST_FILE, manifest)
    return manifest


def read_manifest(export_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and sanity-check ``export_dir/manifest.json``.

    Raises:
        FileNotFoundError: no manifest (the dir was not made by `prodip export`, or is incomplete).
        ValueError: not JSON, a different ``format_version``, or a missing top-level key.
    """
    path = Path(export_dir) / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MissingInput(f"{path}: export manifest not found (made by `prodip export`)") from None
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{path}: not valid JSON: {err}") from None
    if data.get("format_version") != FORMAT_VERSION:
        raise InvalidInput(
            f"{path}: format_version {data.get('format_version')!r}, expected {FORMAT_VERSION} "
            "(re-export with this prodip's `prodip export`)"
        )
    for key in ("files", "variants", "source_checkpoint"):
        if key not in data:
            raise InvalidInput(f"{path}: missing key {key!r} (re-run `prodip export`)")
    out: dict[str, Any] = data
    return out


def verify_files(
    export_dir: str | os.PathLike[str], *, allow_unlisted: bool = False, hash_file: Callable[[Path], str] = file_sha256
) -> dict[str, Any]:
    """Check every listed file's size and sha256, and that no unlisted file was added.

    Args:
        export_dir: an export dir.
        allow_unlisted: accept files the manifest does not list (outside ``conformance/``).
        hash_file: path -> hex sha256 (the pipeline passes a cached one).
    Returns:
        The manifest dict.
    Raises:
        FileNotFoundError: the manifest or a listed file is missing (named).
        ValueError: a file whose bytes or sha256 differ from the manifest, or an unlisted file
            (named, with both values).
    """
    root = Path(export_dir)
    manifest = read_manifest(root)
    for rel, meta in manifest["files"].items():
        path = root / rel
        if not path.is_file():
            raise MissingInput(f"{path}: missing from the export (listed in {root / MANIFEST_FILE})")
        size = path.stat().st_size
        if size != meta["bytes"]:
            raise InvalidInput(f"{path}: {size} bytes, manifest says {meta['bytes']} (truncated or replaced)")
        digest = hash_file(path)
        if digest != meta["sha256"]:
            raise InvalidInput(
                f"{path}: sha256 differs from the export manifest's ({digest[:16]}.. vs "
                f"{meta['sha256'][:16]}..; modified after export)"
            )
    if not allow_unlisted:
        extra = sorted(set(list_files(root)) - set(manifest["files"]))
        if extra:
            raise InvalidInput(f"{root}: file(s) not listed in {MANIFEST_FILE}: {', '.join(extra)}")
    return manifest


def set_conformance(export_dir: str | os.PathLike[str], verdict: dict[str, Any] | None) -> dict[str, Any]:
    """Record a conformance verdict in the manifest's ``conformance`` slot (atomic rewrite).

    Args:
        export_dir: an export dir.
        verdict: ``{"passed": bool, "variants": {name: bool}, "report": path,
            "report_sha256": str, "checked_utc": str}`` (``checked_utc`` is filled in when absent),
            or ``None`` to clear the slot.
    Returns:
        The updated manifest.
    Raises:
        ValueError: ``verdict`` lacks a bool ``passed`` or a ``variants`` dict, or names a variant
            the manifest does not have.
        FileNotFoundError: no manifest.
    """
    root = Path(export_dir)
    manifest = read_manifest(root)
    if verdict is not None:
        if not isinstance(verdict.get("passed"), bool) or not isinstance(verdict.get("variants"), dict):
            raise InvalidInput(
                f"conformance verdict needs 'passed' (bool) and 'variants' ({{name: bool}}), got keys {sorted(verdict)}"
            )
        unknown = sorted(set(verdict["variants"]) - set(manifest["variants"]))
        if unknown:
            raise InvalidInput(
                f"conformance verdict names variant(s) {unknown} not in {root / MANIFEST_FILE} "
                f"(has {sorted(manifest['variants'])})"
            )
        verdict = {**verdict, "checked_utc": verdict.get("checked_utc") or utc_now()}
    manifest["conformance"] = verdict
    _write_json_atomic(root / MANIFEST_FILE, manifest)
    return manifest


def verdict_is_current(manifest: dict[str, Any]) -> bool:
    """Whether the manifest's conformance verdict was measured on the export's current files.

    A verdict records ``export_files_sha256`` (:func:`files_table_sha256` of the files table it
    checked); a re-export or a changed file changes the table, which voids the verdict.

    Args:
        manifest: a manifest dict (:func:`read_manifest`).
    Returns:
        True when there is a verdict and it names the current files table (passed or not).
    """
    verdict = manifest.get("conformance") or {}
    return bool(verdict) and verdict.get("export_files_sha256") == files_table_sha256(manifest.get("files") or {})
