"""The export stage's records: it declares none of its own. What it writes, ``manifest.json`` with its
variant entries, model card and (later, by conformance) verdict, is declared in the torch-free base
(:mod:`prodip.base.manifest`, :mod:`prodip.base.variants`, :mod:`prodip.base.card`,
:mod:`prodip.base.verdict`), where every reader finds it. This module holds the export's code that builds
and reads those records: an ONNX variant's manifest entry, the earlier export ``--force`` replaces, and the
size table printed at the end of an export.

    python -c "from prodip.export.records import size_table; print(size_table('runs/demo/export'))"
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

import onnx

from prodip.base.errors import MissingInput, OutputExists
from prodip.base.manifest import MANIFEST_FILE, ExportManifest, load_manifest
from prodip.base.records import NewerFormat, RecordError


def onnx_variant_entry(
    name: str, path: str, dtype: str, quantization: Optional[dict[str, Any]], root: Path
) -> dict[str, Any]:
    """The manifest entry (:class:`prodip.base.variants.VariantEntry`'s keys, in its order) of the ONNX variant
    ``name`` written at ``root/path``: its external data file when there is one, float32 I/O and cache, and the
    opsets the file imports (read without loading its weights)."""
    extra = [f"{path}.data"] if (root / f"{path}.data").is_file() else []
    opsets = {
        o.domain or "ai.onnx": o.version for o in onnx.load(str(root / path), load_external_data=False).opset_import
    }
    return {
        "path": path,
        "format": "onnx",
        "dtype": dtype,
        "quantization": quantization,
        "external_data": extra,
        "io_dtype": "float32",
        "kv_cache_dtype": "float32",
        "opset": opsets.get("ai.onnx"),
        "opset_imports": opsets,
    }


def earlier_export(out: Path) -> ExportManifest:
    """The manifest of the export ``--force`` is asked to replace in the non-empty folder ``out``.

    Raises:
        OutputExists: ``out`` holds no ``manifest.json``; holds one of a newer format_version (an export
            of a newer prodip: the file and the version named); or holds one that is not an export
            manifest this prodip reads (why named). Nothing is deleted in any case.
    """
    path = out / MANIFEST_FILE
    refuse = "--force only replaces an earlier export. Choose another --out, or empty that folder yourself"
    try:
        return ExportManifest.read(path)
    except NewerFormat as err:
        raise OutputExists(
            f"{out}: holds an export of a newer prodip ({path} has format_version {err.found}; this prodip "
            f"reads {', '.join(map(str, err.reads))}); --force does not replace an export it cannot read. "
            f"Upgrade prodip, or choose another --out"
        ) from None
    except MissingInput:
        raise OutputExists(f"{out}: is not empty and holds no export {MANIFEST_FILE}; {refuse}") from None
    except (RecordError, OSError) as err:
        raise OutputExists(
            f"{out}: is not empty and its {MANIFEST_FILE} is not an export manifest this prodip reads ({err}); {refuse}"
        ) from None


def size_table(export_dir: str | os.PathLike) -> str:
    """Text table: variant -> file -> MiB -> size relative to the fp32 ONNX file (external data included),
    from the export's manifest (the sizes its ``files`` table records)."""
    manifest = load_manifest(export_dir)
    sizes = {name: sum(manifest.files[rel].bytes for rel in v.files()) for name, v in manifest.variants.items()}
    base = sizes.get("fp32")
    lines = [f"{'variant':<12} {'file':<26} {'MiB':>9} {'vs fp32':>8}"]
    for name, v in manifest.variants.items():
        ratio = f"{sizes[name] / base:.3f}x" if base and v.format in ("onnx", "gguf", "pte") else "-"
        lines.append(f"{name:<12} {v.path:<26} {sizes[name] / 2**20:>9.2f} {ratio:>8}")
    return "\n".join(lines)
