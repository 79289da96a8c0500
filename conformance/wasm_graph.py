"""Integrity of a variant's web-only graph (the int4's ``wasm_path``, :func:`prodip.export.quantize.to_int4_wasm`):
the manifest fields conformance measures it by, and the ``config.json`` entry the export's page loads it by.

* :func:`wasm_entry_problems`: the manifest entry (file inside the export, listed, not another file of the
  export, beside its variant's file, ``wasm.file`` its name, and exactly the session config the export
  writes); a problem refuses the run before anything is measured (the candidate would measure another file,
  or the file with arithmetic the WASM build does not do).
* :func:`web_config_differences`: ``config.json`` ``transformers.js_config.prodip_wasm_q4`` (what
  ``export/web/app.js`` passes to transformers.js) against the manifest's entry, part of the export-wide
  ``config_matches`` check.

    python -c "from prodip.conformance.wasm_graph import wasm_entry_problems; from prodip.base.manifest import load_manifest; print(wasm_entry_problems(load_manifest('runs/demo/export'), 'int4'))"
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Optional

from prodip.base.jsontypes import JSONObject, JSONValue
from prodip.base.manifest import ExportManifest
from prodip.base.variants import VariantEntry, wasm_page_entry

#: The variant whose web graph ``config.json`` ``transformers.js_config.prodip_wasm_q4`` names (transformers.js
#: dtype ``q4``), and that entry's key.
WEB_VARIANT = "int4"
WEB_CONFIG_KEY = "prodip_wasm_q4"


def required_session_config() -> dict[str, str]:
    """The ONNX Runtime session entries the web graph must be run with (what the export writes beside it)."""
    from prodip.export.quantize import WASM_INT4_SESSION_CONFIG  # noqa: PLC0415 (onnxruntime.quantization: slow)

    return dict(WASM_INT4_SESSION_CONFIG)


def wasm_entry_problems(manifest: ExportManifest, variant: str) -> list[str]:
    """What is wrong with ``variant``'s ``wasm_path`` / ``wasm`` manifest fields, each naming the field and values.

    Args:
        manifest: the export manifest (its ``files`` table is what the export wrote).
        variant: a variant name whose entry has a ``wasm_path``.
    Returns:
        Problems (empty when the entry is sound): the path is absolute or climbs out of the export dir, is a file
        another manifest field names (a variant's own file, its weights, its onnxruntime-genai graph), is not in
        the variant file's folder (its external-data locations are relative to it), is not listed in ``files``;
        ``wasm`` is missing, its ``file`` is not the path's file name, or its ``session_config`` is not a table
        of strings, lacks a required entry (:func:`required_session_config`) or has an unknown one.
    """
    entry = manifest.variants[variant]
    path, params = entry.wasm_path or "", entry.wasm
    field = f"manifest.json variants.{variant}"
    problems = []
    pure = PurePosixPath(path)
    if pure.is_absolute() or ".." in pure.parts or "\\" in path:
        problems.append(f"{field}.wasm_path = {path!r} leaves the export dir (a path relative to it is expected)")
    for name, other in manifest.variants.items():
        if path in _claimed_files(other):
            problems.append(f"{field}.wasm_path = {path!r} is variant {name!r}'s own file, not a web graph")
    if pure.parent != PurePosixPath(entry.path).parent:
        problems.append(
            f"{field}.wasm_path = {path!r} is not beside the variant's file {entry.path!r} (the web graph reads "
            "its weights from there)"
        )
    if path not in manifest.files:
        problems.append(f"{field}.wasm_path = {path!r} is not in manifest.json's files table (not the export's file)")
    if params is None:
        return [*problems, f"{field}.wasm is missing: the web graph's session config is unknown"]
    file = params.get("file")
    if file is not None and file != pure.name:
        problems.append(f"{field}.wasm.file = {file!r} disagrees with {field}.wasm_path = {path!r}")
    problems += _session_problems(params.get("session_config"), f"{field}.wasm.session_config")
    return problems


def session_entries(params: Optional[JSONObject]) -> tuple[tuple[str, str], ...]:
    """The ``(key, value)`` session entries of a sound ``wasm`` parameter table (:func:`wasm_entry_problems`), sorted."""
    config = (params or {}).get("session_config")
    return tuple(sorted((k, v) for k, v in config.items() if isinstance(v, str))) if isinstance(config, dict) else ()


def _session_problems(config: JSONValue, field: str) -> list[str]:
    required = required_session_config()
    if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
        return [f"{field} = {config!r}: expected a table of ONNX Runtime session config entries with string values"]
    problems = [
        f"{field}[{key!r}] = {config.get(key)!r}, expected {value!r} (the WASM build's arithmetic needs it)"
        for key, value in required.items()
        if config.get(key) != value
    ]
    unknown = sorted(set(config) - set(required))
    if unknown:
        problems.append(f"{field} has unknown key(s) {unknown} (the export writes {sorted(required)} only)")
    return problems


def _claimed_files(entry: VariantEntry) -> set[str]:
    """Files a variant entry names besides its web graph."""
    return {f for f in (*entry.files(), entry.genai_path, entry.tokenizer) if f}


def expected_web_config(entry: VariantEntry) -> Optional[JSONObject]:
    """The ``transformers.js_config.prodip_wasm_q4`` entry that loads ``entry``'s web graph
    (:func:`prodip.base.variants.wasm_page_entry`, as the export writes it), or None without one."""
    if not entry.wasm_path:
        return None
    return wasm_page_entry(entry.path, entry.wasm_path, entry.wasm or {})


def web_config_differences(manifest: ExportManifest, config: JSONObject) -> dict[str, list[JSONValue]]:
    """``config.json`` ``transformers.js_config.prodip_wasm_q4`` fields that disagree with the manifest's web graph.

    Args:
        manifest: the export manifest (its ``int4`` entry's ``wasm_path`` and ``wasm``).
        config: ``config.json``, parsed.
    Returns:
        ``{"config.json transformers.js_config.prodip_wasm_q4.<field>": [expected, found], ...}`` (the whole
        entry's key when one side has no entry at all); empty when they agree.
    """
    where = f"config.json transformers.js_config.{WEB_CONFIG_KEY}"
    tjs = config.get("transformers.js_config")
    found = tjs.get(WEB_CONFIG_KEY) if isinstance(tjs, dict) else None
    entry = manifest.variants.get(WEB_VARIANT)
    want = expected_web_config(entry) if entry is not None else None
    if want is None or not isinstance(found, dict):
        return {} if want is None and found is None else {where: [want, found]}
    diff: dict[str, list[JSONValue]] = {f"{where}.{k}": [v, found.get(k)] for k, v in want.items() if found.get(k) != v}
    diff.update({f"{where}.{k}": [None, v] for k, v in found.items() if k not in want})  # not the export's
    return diff
