"""The tolerance file's schema: which tables and metrics exist, which bound each takes, which are required.

A tolerance file is checked strictly before anything is measured or written (``prodip conformance``
exits 2 on any problem): an unknown table, key or metric, a bound of the wrong kind (``min`` on a
metric where lower is better, ``max`` on top-1), a value of the wrong type, and a table that lacks
one of its required checks are errors naming the file, the table and the key. A bound can be
loosened deliberately (its value, with a note in the file saying why); a check cannot be dropped by
leaving it out, and ``[global]`` (the export-wide structural checks) is always required.

Required checks per table (the set the shipped ``conformance/tolerances.toml`` gates):

* ``[global]``: tokenizer_mismatches, tokenizer_sha256_match, manifest_files_ok, config_matches, card_ok;
* exact candidates (``[safetensors]``, ``[transformers]``, ``[fp32]``): max_abs_logit,
  greedy_identical, kv_cache_max_abs, padded_batch_max_abs, bpc_delta_max;
* reduced precision (``[fp16]``, ``[int8]``, ``[int4]``, ``[safetensors_bfloat16]`` ...): top1,
  kl_mean, kv_cache_kl_mean, padded_batch_kl_mean, bpc_delta_max;
* every ONNX table also dynamic_axes;
* a variant's web-only graph (``[int4-wasm]``: the int4's ``wasm_path``, a candidate of its own) its variant's.

Any other measured metric (kl_p999, rel_max_abs_logit, greedy_prefix_min, kv_cache_top1 ...) may be
gated in addition. ``note = "..."`` is allowed in any table and is not gated.

    python -c "from prodip.conformance.tolerances import load_tolerances, DEFAULT; print(sorted(load_tolerances(DEFAULT)))"
"""

from __future__ import annotations

import difflib
import hashlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomllib

from prodip.base.config import ConfigError
from prodip.base.errors import MissingInput
from prodip.base.variants import GGUF_VARIANTS, ONNX_VARIANTS, PTE_VARIANTS, SAFETENSORS_DTYPES

DEFAULT = Path(__file__).with_name("tolerances.toml")
FORMAT_VERSION = 1
NOTE_KEY = "note"

#: metric -> its bound kind: "max" (lower is better), "min" (higher is better, a fraction in [0, 1]
#: unless noted), "true" (a boolean that must hold: ``{equals = true}``), "count" (a non-negative
#: integer: ``{equals = n}`` or ``{max = n}``).
GLOBAL_METRICS = {
    "tokenizer_mismatches": "count",
    "tokenizer_sha256_match": "true",
    "manifest_files_ok": "true",
    "config_matches": "true",
    "card_ok": "true",  # the model card's fields read back from every artifact == the manifest's (conformance.card)
}
CANDIDATE_METRICS = {
    "max_abs_logit": "max",
    "mean_abs_logit": "max",
    "rel_max_abs_logit": "max",
    "kl_mean": "max",
    "kl_p999": "max",
    "top1": "min",
    "greedy_identical": "true",
    "greedy_prefix_min": "min_tokens",
    "kv_cache_max_abs": "max",
    "kv_cache_kl_mean": "max",
    "kv_cache_top1": "min",
    "padded_batch_max_abs": "max",
    "padded_batch_kl_mean": "max",
    "padded_batch_top1": "min",
    "bpc_delta_max": "max",
}
ONNX_METRICS = {"dynamic_axes": "true"}
#: GGUF and .pte: what the runtime reads from the file (context length, vocabulary, BOS/EOS, add-BOS)
#: equals the training model's config (conformance/device_runners.py metadata_problems).
#: runtime_tokenizer_mismatches: prompts whose ids from the runtime's own tokenizer (llama.cpp over the
#: GGUF vocabulary; ExecuTorch's C++ HFTokenizer) differ from ``tokenizers`` (NFC input, BOS included).
DEVICE_METRICS = {"runtime_metadata_ok": "true", "runtime_tokenizer_mismatches": "count"}
#: Device variants held to the exact bounds (same fp32 weights, another runtime).
EXACT_DEVICE = ("pte-fp32",)
#: A variant's web-only graph (its manifest entry's ``wasm_path``: the file the export's page loads on
#: onnxruntime-web's WASM device instead of the variant's) is a candidate of its own, ``<variant>-wasm``, with a
#: table of that name taking the variant's checks. Only int4 has one (``prodip.export.core``'s WASM q4 file).
WASM_SUFFIX = "-wasm"
WASM_VARIANTS = ("int4",)


def wasm_table(variant: str) -> str:
    """The candidate and tolerance-table name of ``variant``'s web-only graph (``int4`` -> ``int4-wasm``)."""
    return variant + WASM_SUFFIX


REQUIRED_GLOBAL = tuple(GLOBAL_METRICS)
REQUIRED_EXACT = ("max_abs_logit", "greedy_identical", "kv_cache_max_abs", "padded_batch_max_abs", "bpc_delta_max")
REQUIRED_REDUCED = ("top1", "kl_mean", "kv_cache_kl_mean", "padded_batch_kl_mean", "bpc_delta_max")

_BOUND_HELP = {
    "max": "{max = x} with x >= 0 (lower is better)",
    "min": "{min = y} with 0 <= y <= 1 (a fraction; higher is better)",
    "min_tokens": "{min = n} with n >= 0 tokens (higher is better)",
    "true": "{equals = true} (a check that must hold; it cannot be turned off)",
    "count": "{equals = n} or {max = n} with n >= 0",
}


def table_spec(table: str) -> tuple[tuple[str, ...], dict[str, str]] | None:
    """``(required metrics, allowed metrics -> bound kind)`` of a tolerance table, None if unknown."""
    if table == "global":
        return REQUIRED_GLOBAL, GLOBAL_METRICS
    if table in ("safetensors", "transformers"):
        return REQUIRED_EXACT, CANDIDATE_METRICS
    reduced_st = {
        f"{base}_{d}" for base in ("safetensors", "transformers") for d in SAFETENSORS_DTYPES if d != "float32"
    }
    if table in reduced_st:
        return REQUIRED_REDUCED, CANDIDATE_METRICS
    if table in (wasm_table(v) for v in WASM_VARIANTS):  # a variant's web graph: the variant's checks
        table = table.removesuffix(WASM_SUFFIX)
    if table in ONNX_VARIANTS:
        required = REQUIRED_EXACT if table == "fp32" else REQUIRED_REDUCED
        return required + tuple(ONNX_METRICS), {**CANDIDATE_METRICS, **ONNX_METRICS}
    if table in GGUF_VARIANTS or table in PTE_VARIANTS:
        required = REQUIRED_EXACT if table in EXACT_DEVICE else REQUIRED_REDUCED
        if table == "gguf-f16":  # float16 weights: greedy ids identical over the greedy tokens, logits bounded
            required = REQUIRED_REDUCED + ("greedy_identical", "max_abs_logit")
        return required + tuple(DEVICE_METRICS), {**CANDIDATE_METRICS, **DEVICE_METRICS}
    return None


def known_tables() -> list[str]:
    return [
        "global",
        "safetensors",
        "transformers",
        *ONNX_VARIANTS,
        *(wasm_table(v) for v in WASM_VARIANTS),
        *GGUF_VARIANTS,
        *PTE_VARIANTS,
        *[f"{b}_{d}" for b in ("safetensors", "transformers") for d in SAFETENSORS_DTYPES if d != "float32"],
    ]


def _did_you_mean(word: str, choices: Iterable[str], what: str) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(word, choices, n=3)
    return f"; did you mean {', '.join(close)}?" if close else f"; known {what}: {', '.join(choices)}"


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _bound_problem(tol: Any, kind: str) -> str | None:
    """Why ``tol`` is not a valid bound of ``kind`` (None when it is)."""
    if not isinstance(tol, dict) or len(tol) != 1:
        return f"{tol!r} is not a bound; expected {_BOUND_HELP[kind]}"
    ((key, value),) = tol.items()
    if key not in ("max", "min", "equals"):
        return f"unknown bound key {key!r}{_did_you_mean(key, ('max', 'min', 'equals'), 'bound keys')}"
    if kind == "true":
        if key != "equals" or value is not True:
            return f"{tol!r}: expected {_BOUND_HELP[kind]}"
        return None
    if kind == "count":
        if key not in ("equals", "max"):
            return f"a {key} bound is of the wrong kind (fewer is better); expected {_BOUND_HELP[kind]}"
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            return f"{key} = {value!r}: expected a non-negative integer"
        return None
    want = "max" if kind == "max" else "min"
    if key != want:
        better = "lower" if want == "max" else "higher"
        return f"a {key} bound is of the wrong kind ({better} is better); expected {_BOUND_HELP[kind]}"
    if not _is_number(value) or not math.isfinite(value):
        return f"{key} = {value!r}: expected a finite number"
    if value < 0 or (kind == "min" and value > 1):
        return f"{key} = {value!r} out of range; expected {_BOUND_HELP[kind]}"
    if kind == "min_tokens" and not float(value).is_integer():
        return f"{key} = {value!r}: expected a whole number of tokens"
    return None


def validate_tolerances(data: dict[str, Any], source: str) -> list[str]:
    """Every problem of a parsed tolerance file (empty list: valid), each naming source, table and key."""
    errors = []
    version = data.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        errors.append(f"{source}: format_version must be {FORMAT_VERSION}, got {version!r}")
    tables = known_tables()
    for table, entries in data.items():
        if table == "format_version":
            continue
        if not isinstance(entries, dict):
            errors.append(
                f"{source}: top-level key {table!r} = {entries!r}: expected format_version or a "
                f"[table] of metric = {{max|min|equals = value}}{_did_you_mean(table, tables, 'tables')}"
            )
            continue
        spec = table_spec(table)
        if spec is None:
            errors.append(f"{source}: [{table}]: unknown table{_did_you_mean(table, tables, 'tables')}")
            continue
        required, allowed = spec
        for metric, tol in entries.items():
            if metric == NOTE_KEY:
                if not isinstance(tol, str):
                    errors.append(f"{source}: [{table}] {metric} = {tol!r}: a note must be a string")
                continue
            kind = allowed.get(metric)
            if kind is None:
                hint = _did_you_mean(metric, [*allowed, NOTE_KEY], "metrics")
                if metric in ONNX_METRICS or metric in CANDIDATE_METRICS or metric in GLOBAL_METRICS:
                    hint = f" (it does not apply to [{table}]){hint}"
                errors.append(f"{source}: [{table}] {metric}: unknown metric{hint}")
                continue
            problem = _bound_problem(tol, kind)
            if problem:
                errors.append(f"{source}: [{table}] {metric}: {problem}")
        missing = [m for m in required if m not in entries]
        if missing:
            errors.append(
                f"{source}: [{table}] lacks required check(s) {', '.join(missing)}; a check cannot be "
                "dropped by leaving it out (loosen its bound instead, with a note saying why)"
            )
    if "global" not in data:
        errors.append(
            f"{source}: no [global] table; the export-wide checks ({', '.join(REQUIRED_GLOBAL)}) are always required"
        )
    return errors


def load_tolerances(path: str | Path) -> dict[str, Any]:
    """Read and strictly validate a tolerance TOML file.

    Returns:
        ``{table: {metric: {"max"|"min"|"equals": value}}}`` (``format_version`` removed; a table's
        ``note`` string kept as written).
    Raises:
        FileNotFoundError: no such file.
        ConfigError (a ValueError): not TOML, or any problem :func:`validate_tolerances` finds (all
            of them, one per line).
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise MissingInput(f"{path}: tolerance file not found (see conformance/tolerances.toml)") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    errors = validate_tolerances(data, str(path))
    if errors:
        raise ConfigError("bad tolerance file:\n  " + "\n  ".join(errors) if len(errors) > 1 else errors[0])
    data.pop("format_version")
    return data


def require_tables(tolerances: dict[str, Any], tables: Iterable[str], path: str | Path) -> None:
    """Every candidate being checked has its table (present tables are complete by validation).

    Raises:
        ConfigError: the tables missing, named with the file.
    """
    missing = sorted({t for t in tables if t not in tolerances})
    if missing:
        hints = []
        for t in missing:
            spec = table_spec(t)
            hints.append(f"[{t}] (required: {', '.join(spec[0])})" if spec else f"[{t}] (no such table is known)")
        raise ConfigError(
            f"{path}: no tolerance table for the candidate(s) being checked: {'; '.join(hints)}. "
            "Add the table with bounds set from a measured run, or leave the variant out "
            "with --variants"
        )


def is_looser(kind: str, used: dict[str, Any], shipped: dict[str, Any]) -> bool:
    """Whether bound ``used`` admits a value that bound ``shipped`` (both valid for ``kind``) refuses."""
    if kind == "true":
        return used != shipped
    if kind in ("max", "count"):  # {max = x} or (count) {equals = n}: the largest value admitted
        return float(next(iter(used.values()))) > float(next(iter(shipped.values())))
    return float(used["min"]) < float(shipped["min"])  # min, min_tokens


def compare_with_shipped(
    used: dict[str, Any], path: str | Path, tables: Iterable[str] | None = None, shipped_path: str | Path = DEFAULT
) -> dict[str, Any]:
    """How a validated tolerance file compares with the shipped ``conformance/tolerances.toml``.

    Args:
        used: the loaded tolerance file (:func:`load_tolerances`).
        path: its path.
        tables: only these tables (those gated in a run); None = every table of either file.
        shipped_path: the shipped file.
    Returns:
        ``{path, sha256, shipped: bool (byte-identical to the shipped file), loosened: [{table, metric,
        shipped, used}]}``: ``loosened`` lists each bound that admits a value the shipped file refuses
        (``shipped`` None: the shipped file has no such table/bound and so refuses the candidate;
        ``used`` None: a check the shipped file gates is left out). Tightened bounds are not listed.
    """

    sha = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    shipped_sha = hashlib.sha256(Path(shipped_path).read_bytes()).hexdigest()
    ref = load_tolerances(shipped_path)
    names = list(dict.fromkeys([*used, *ref])) if tables is None else list(dict.fromkeys(tables))
    loosened = []
    for table in names:
        spec = table_spec(table)
        if spec is None or (table not in used and table not in ref):
            continue
        _, kinds = spec
        u_tab, s_tab = used.get(table), ref.get(table)
        if u_tab is None:
            continue  # not gated by the used file: such a candidate is refused (require_tables)
        metrics = [m for m in dict.fromkeys([*u_tab, *(s_tab or {})]) if m != NOTE_KEY]
        for metric in metrics:
            u, s = u_tab.get(metric), (s_tab or {}).get(metric)
            if s_tab is not None and s is None:
                continue  # gated in addition to the shipped checks: stricter
            if s is None or u is None or is_looser(kinds[metric], u, s):
                loosened.append({"table": table, "metric": metric, "shipped": s, "used": u})
    return {"path": str(Path(path).resolve()), "sha256": sha, "shipped": sha == shipped_sha, "loosened": loosened}


def _bound_text(bound: Any) -> str:
    if isinstance(bound, dict) and len(bound) == 1:
        ((key, value),) = bound.items()
        return f"{key} {value}"
    return "none (not gated)" if bound is None else str(bound)


def bound_change(entry: dict[str, Any]) -> str:
    """``min 0.95 -> min 0.0`` for a loosened entry (shipped -> used)."""
    return f"{_bound_text(entry['shipped'])} -> {_bound_text(entry['used'])}"


def loosened_text(loosened: Iterable[dict[str, Any]]) -> str:
    """``[int8] top1 min 0.95 -> min 0.0; ...`` (shipped -> used; "none" where there is no bound)."""
    return "; ".join(f"[{b['table']}] {b['metric']} {bound_change(b)}" for b in loosened)
