"""The conformance report's writer: ``report.json`` (every metric, tolerance, pass; the record and its
layout: :mod:`prodip.conformance.records`) and ``report.md`` (one table, :func:`render_markdown`).

Non-finite numbers are written as the strings "inf", "-inf", "nan" (strict JSON, :func:`_clean`).

    python -c "from prodip.conformance.report import render_markdown; help(render_markdown)"
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prodip.base.config import dump_toml, to_dict, write_text_atomic
from prodip.conformance.records import REPORT_FILE as REPORT_FILE
from prodip.conformance.records import ConformanceReport as ConformanceReport
from prodip.conformance.records import read_report as read_report
from prodip.conformance.tolerances import bound_change

COLUMNS = [  # (header, metric key, format)
    ("max Δlogit", "max_abs_logit", "{:.1e}"),
    ("rel", "rel_max_abs_logit", "{:.1e}"),
    ("mean KL", "kl_mean", "{:.1e}"),
    ("KL p99.9", "kl_p999", "{:.1e}"),
    ("top-1", "top1", "{:.2%}"),
    ("greedy prefix", "greedy_prefix_min", "{}"),
    ("KV cache max Δ / KL", None, None),
    ("padded max Δ / KL", None, None),
    ("max Δbpc", "bpc_delta_max", "{:.1e}"),
]


def _clean(value: Any) -> Any:
    """JSON-safe copy: numpy scalars to Python, non-finite floats to strings, paths to str."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Path):
        return str(value)
    return value


def _fmt(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        return fmt.format(value)
    except (ValueError, TypeError):
        return str(value)


_PRECISION = re.compile(r"\{:\.(\d+)([efg%])\}")


def _fmt_failed(value: Any, fmt: str, tolerance: Any) -> str:
    """A failed check's value as :func:`_fmt` writes it, with more digits where that text equals a bound's.

    Rounding is monotonic, so a value on the failing side of a bound prints either beyond it or equal to it
    (top-1 0.94996 against ``min 0.95`` is "95.00%"); equal, the precision of ``fmt`` (``{:.2%}``, ``{:.3g}``,
    ``{:.1e}``) is raised one digit at a time, up to 17 significant digits (a float's ``repr``), until it differs.

    Args:
        value: the measured value (any type; non-numbers are written as :func:`_fmt` does).
        fmt: a format with a precision, e.g. ``"{:.2%}"``; other formats are used unchanged.
        tolerance: the check's tolerance, ``{"min"|"max"|"equals": bound}``; non-numeric bounds are ignored.
    Returns:
        The text, e.g. ``"94.996%"``.
    """
    text = _fmt(value, fmt)
    bounds = [b for b in (tolerance or {}).values() if isinstance(b, (int, float)) and not isinstance(b, bool)]
    m = _PRECISION.fullmatch(fmt)
    if m is None or isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return text
    digits, kind = int(m.group(1)), m.group(2)
    while any(text == _fmt(b, fmt) for b in bounds) and digits < 17:
        digits += 1
        fmt = f"{{:.{digits}{kind}}}"
        text = _fmt(value, fmt)
    return text


def _cell(
    metrics: dict[str, Any], key: str | None, fmt: str | None, header: str, checks: Sequence[dict[str, Any]] = ()
) -> str:
    if key is not None and fmt is not None:
        failed = [c for c in checks if c["metric"] == key and c["passed"] is False]
        return _fmt_failed(metrics.get(key), fmt, failed[0]["tolerance"]) if failed else _fmt(metrics.get(key), fmt)
    prefix = "kv_cache" if header.startswith("KV") else "padded_batch"
    return f"{_fmt(metrics.get(prefix + '_max_abs'), '{:.1e}')} / {_fmt(metrics.get(prefix + '_kl_mean'), '{:.1e}')}"


#: Per-variant metrics whose failure has a detail field saying why (shown under the failed check).
_VARIANT_DETAILS = {"runtime_tokenizer_mismatches": ("runtime_tokenizer_error", "runtime_tokenizer_mismatched_texts")}


def _failed_lines(name: str, checks: list[dict[str, Any]], metrics: dict[str, Any] | None = None) -> list[str]:
    lines = []
    for c in checks:
        if c["passed"] is False:
            lines.append(
                f"- **{name}** `{c['metric']}` = {_fmt_failed(c['value'], '{:.3g}', c['tolerance'])} "
                f"(tolerance {c['tolerance']}){' - ' + c['note'] if c.get('note') else ''}"
            )
            if c["metric"] == "bpc_delta_max":
                lines += _bpc_delta_lines((metrics or {}).get("heldout") or {}, c["tolerance"].get("max"))
            for key in _VARIANT_DETAILS.get(c["metric"], ()):
                if (metrics or {}).get(key):
                    detail = str(metrics[key]).replace("`", "'").replace("\n", " ")
                    lines.append(f"  - {key} = `{detail[:600]}`")
    return lines


def _bpc_delta_lines(heldout: dict[str, dict[str, float]], bound: float | None) -> list[str]:
    """Per language over ``bound``: the shift split as :class:`prodip.conformance.compare.HeldoutShift` splits
    it, so a reader sees whether rounding itself costs (the KL part) or the reference predicts this text badly
    (the text part, many standard deviations from 0, with held-out bits/char far above its own entropy)."""
    lines = []
    for lang, h in heldout.items():
        if bound is None or abs(h.get("bpc_delta", 0.0)) <= bound or "bpc_delta_kl" not in h:
            continue
        sd, text = h["bpc_delta_text_sd"], h["bpc_delta_text"]
        # how far the text part lies from 0 in its own spread on the reference's samples (2 digits: 0.47, 7.3, 23)
        spread = f"{abs(text) / sd:.2g} sd of its spread" if sd > 0 else "its spread is 0"
        lines.append(
            f"  - {lang}: Δbpc {h['bpc_delta']:+.4g} = KL part {h['bpc_delta_kl']:+.3g} (what the candidate's "
            f"difference costs on text the reference itself would write) + text part {text:+.3g} ({spread} on "
            f"such text); the reference: {h['bpc_ref']:.3g} bits/char on this text vs its own entropy "
            f"{h['entropy_bpc_ref']:.3g} (docs/conformance.md#held-out-bitschar)"
        )
    return lines


#: Export-wide metrics whose failure has a detail field naming the file/field/text at fault.
_DETAILS = {
    "manifest_files_ok": ("manifest_files_error",),
    "config_matches": ("config_error", "config_differences"),
    "tokenizer_sha256_match": ("tokenizer_error",),
    "tokenizer_mismatches": ("tokenizer_error", "tokenizer_mismatched_texts"),
}


def _global_details(g: dict[str, Any]) -> list[str]:
    """One line per failed export-wide check with its detail (e.g. the file whose sha256 differs)."""
    lines = []
    for c in g["checks"]:
        if c["passed"] is not False:
            continue
        for key in _DETAILS.get(c["metric"], ()):
            if g["metrics"].get(key):
                detail = str(g["metrics"][key]).replace("`", "'").replace("\n", " ")
                lines.append(f"- **export** `{c['metric']}`: {key} = `{detail[:600]}`")
    return lines


def _tolerance_lines(tol: dict[str, Any] | None) -> list[str]:
    """A LOOSENED TOLERANCES section listing every bound looser than the shipped file's."""

    if not tol:
        return []
    if not tol["loosened"]:
        return (
            []
            if tol["shipped"]
            else [
                f"Tolerances: `{tol['path']}` (not the shipped file; no bound is "
                "looser than the shipped conformance/tolerances.toml).",
                "",
            ]
        )
    rows = [f"- [{b['table']}] `{b['metric']}`: {bound_change(b)}" for b in tol["loosened"]]
    return [
        "## LOOSENED TOLERANCES",
        "",
        f"**{len(tol['loosened'])} bound(s) of `{tol['path']}` are looser than the shipped "
        "conformance/tolerances.toml** (shipped -> used); a pass below is a pass against these bounds:",
        "",
        *rows,
        "",
    ]


def _runtime_lines(report: dict[str, Any]) -> list[str]:
    """The runtime axis: per ONNX candidate, each runtime's greedy ids vs ONNX Runtime's on the same file."""
    checked = (report.get("runtimes") or {}).get("checked")
    if checked is None:
        return []
    if not checked:
        return ["", "On-device runtimes: none checked (`--runtimes` was empty)."]
    rt = report["runtimes"]
    if not any(res.get("runtimes") for res in report["candidates"].values()):
        return ["", f"On-device runtimes ({', '.join(checked)}): no ONNX variant was checked, so none ran."]
    lines = [
        "",
        f"On-device runtimes: greedy ids on the prompts {', '.join(rt['prompts'])} ({rt['new_tokens']} new tokens) "
        "vs ONNX Runtime's on the same file (onnxruntime-genai runs each variant's shared-buffer graph, "
        "`onnx/*_genai.onnx`, as the manifest's `genai_overlay` says; onnxruntime-web is its WASM backend, the build "
        "transformers.js runs in a browser, under Node; fp32: and the training model's).",
        "",
        "| candidate | " + " | ".join(checked) + " | fp32 = training model |",
        "|---|" + "---|" * len(checked) + "---|",
    ]
    for name, res in report["candidates"].items():
        on_device = res.get("runtimes")
        if not on_device:
            continue
        cells = []
        for r in checked:
            got = on_device["runtimes"].get(r) or {}
            cell = (
                f"skipped ({got['skipped'][:80]})"
                if got.get("skipped")
                else "identical"
                if got.get("ids_identical")
                else f"parted at a near tie (margin {got['margin']})"
                if got.get("agrees")
                else f"**FAIL** {str(got.get('error') or got.get('agreement') or 'ids differ')[:80]}"
            )
            if got.get("logits"):  # onnxruntime-web: its logits vs ONNX Runtime's on the same file
                cell += f" (max abs logit diff {got['logits']['max_abs_logit']:.2g}, KL {got['logits']['kl_mean']:.2g})"
            cells.append(cell)
        ref = on_device.get("reference_identical")
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {'-' if ref is None else ('identical' if ref else '**FAIL**')} |"
        )
    return lines


def _chat_lines(report: dict[str, Any]) -> list[str]:
    """The chat contract (a chat model's export): per runtime, the fixed conversations' template ids vs the
    reference and whether the end of turn ends generation there; the template copies."""
    chat = report.get("chat")
    if not chat:
        return []
    convs = list(chat["conversations"])
    eot = chat["end_of_turn"]
    lines = [
        "",
        f"Chat contract: the conversations {', '.join(convs)} rendered by each runtime's own template engine "
        f"and tokenizer vs `prodip.base.chat.render` + tokenizers ({', '.join(str(len(chat['reference'][k])) for k in convs)} "
        f"tokens); end of turn `{eot['token']}` (id {eot['id']}) in each runtime's stop set.",
        "",
        "| runtime | " + " | ".join(convs) + " | stop ids | end of turn stops |",
        "|---|" + "---|" * len(convs) + "---|---|",
    ]
    for name, res in chat["runtimes"].items():
        ids = res.get("ids")
        if res.get("skipped"):
            cells = [f"skipped ({res['skipped'][:80]})"] + ["-"] * (len(convs) - 1)
        elif res.get("error"):
            cells = [f"**FAIL** {res['error'][:80]}"] + ["-"] * (len(convs) - 1)
        elif ids is None:
            cells = ["(renders none: serves with prodip.base.chat.render)"] + ["-"] * (len(convs) - 1)
        else:
            cells = ["identical" if ids.get(k) == chat["reference"][k] else "**differ**" for k in convs]
        stops = res.get("stop_ids")
        stop_cell = "-" if res.get("skipped") else ("yes" if res.get("end_of_turn_stops") else "**NO**")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'-' if stops is None else stops} | {stop_cell} |")
    copies = ", ".join(f"{k} {'ok' if ok else '**DIFFERS**'}" for k, ok in chat["template_copies"].items())
    lines += ["", f"Template copies (= prodip.base.chat.CHAT_TEMPLATE): {copies}."]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The ten-second view: verdict, one row per candidate, then what failed and why."""
    verdict = "PASSED" if report["passed"] else "FAILED"
    ck = report["checkpoint"]
    lines = [
        f"# Conformance {verdict}",
        "",
        f"Export `{report['export_dir']}` vs checkpoint step {ck['step']} "
        f"(`{ck['model_sha256'][:12]}`), tolerances `{report['tolerances_file']}`, "
        f"{report['seconds']:.1f} s.",
        "",
        *_tolerance_lines(report.get("tolerances")),
        "| candidate | verdict | " + " | ".join(h for h, _, _ in COLUMNS) + " | s |",
        "|---|---|" + "---|" * len(COLUMNS) + "---|",
    ]
    for name, res in report["candidates"].items():
        m = res["metrics"]
        cells = [_cell(m, key, fmt, h, res["checks"]) for h, key, fmt in COLUMNS]
        lines.append(
            f"| {name} | {'pass' if res['passed'] else '**FAIL**'} | "
            + " | ".join(cells)
            + f" | {res['seconds']:.1f} |"
        )
    lines += _runtime_lines(report)
    lines += _chat_lines(report)
    g = report["global"]
    lines += [
        "",
        "Export-wide: "
        + ", ".join(
            f"{c['metric']} = {_fmt(c['value'], '{}')} ({'ok' if c['passed'] else 'FAIL'})" for c in g["checks"]
        ),
    ]
    failed = _failed_lines("export", g["checks"]) + _global_details(g)
    for name, res in report["candidates"].items():
        failed += _failed_lines(name, res["checks"], res["metrics"])
        failed += [f"- **{name}** error in {phase}: `{msg[:200]}`" for phase, msg in res["errors"].items()]
        for problem in res["metrics"].get("axes_problems", []):
            failed.append(f"- **{name}** {problem}")
    if failed:
        lines += ["", "## Failed", *failed]
    lines += [
        "",
        "Variants: " + ", ".join(f"{k} {'pass' if v else 'FAIL'}" for k, v in report["variants"].items()),
        "",
        "KL in nats per position (reference || candidate); greedy prefix = identical leading tokens "
        f"of {report['config'].get('greedy_tokens')} (min over prompts); KV-cache and padded columns "
        "compare the candidate with itself (cache vs full pass, batch vs alone). Full figures in "
        "report.json.",
        "",
    ]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out_dir: str | os.PathLike, cfg: Any = None) -> dict[str, Any]:
    """Write ``report.json``, ``report.md`` (and the resolved ``config.toml``) atomically.

    Returns:
        ``{"json": Path, "md": Path, "sha256": hex of report.json's bytes}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = ConformanceReport.from_dict(_clean(report), out / REPORT_FILE)
    text = record.to_json()
    record.write(out / REPORT_FILE)
    write_text_atomic(out / "report.md", render_markdown(report))
    if cfg is not None:
        write_text_atomic(out / "config.toml", dump_toml({"conformance": to_dict(cfg)}))
    return {
        "json": out / REPORT_FILE,
        "md": out / "report.md",
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
    }
