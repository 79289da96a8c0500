"""The table ``prodip run`` prints at the end, read back from the run's artifacts on disk.

Tokenizer fertility per language (for an adapted base: the base's and the extended tokenizer's, and the
base's and the adapted model's held-out bits/char side by side), held-out bits/char and per-token NLL of
the trained model against its random-initialised twin, the chat fine-tuning's held-out assistant-token loss before and
after, export sizes per variant, conformance per variant, and the completions and chat replies
fetched over HTTP.

    python -c "import json; print(json.dumps(json.load(open('runs/demo/summary.json')), indent=1))"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prodip.base.manifest import MANIFEST_FILE, ExportManifest
from prodip.base.records import Record
from prodip.base.stage import StageTime
from prodip.conformance.records import REPORT_FILE, ConformanceReport
from prodip.conformance.tolerances import loosened_text
from prodip.plan import RunPlan
from prodip.serve.records import COMPLETIONS_FILE, Completions
from prodip.tokenizer.audit import read_fertility_or_none
from prodip.tokenizer.stage import read_extension_or_none
from prodip.train.records import SFT_EVAL_FILE, EvalReport, SftEvalReport


def _as_dict(record: Record | None) -> dict[str, Any] | None:
    return None if record is None else record.to_dict()


def _rule(title: str) -> str:
    return f"\n── {title} " + "─" * max(0, 74 - len(title))


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join("  " + line for line in lines)


def summarise(plan: RunPlan, out_dir: Path) -> dict[str, Any]:
    """Collect the summary figures from the artifacts of a run (missing artifacts are left out)."""
    tok_dir = Path(plan.tokenizer.out_dir)
    export_dir = Path(plan.export.out)
    summary: dict[str, Any] = {"format_version": 1, "out_dir": str(out_dir)}
    summary["fertility"] = _as_dict(read_fertility_or_none(tok_dir))
    summary["eval"] = _as_dict(EvalReport.read_or_none(plan.eval.out) if plan.eval.out else None)
    summary["extension"] = read_extension_or_none(plan.extend.out) if plan.extend.base else None
    summary["adaptation"] = adaptation(summary["extension"], summary["eval"]) if summary["extension"] else None
    sft = plan.sft
    sft_eval = SftEvalReport.read_or_none(Path(sft.out_dir) / SFT_EVAL_FILE) if sft.inputs else None
    summary["sft"] = _as_dict(sft_eval)
    summary["export_manifest"] = _as_dict(ExportManifest.read_or_none(export_dir / MANIFEST_FILE))
    summary["conformance"] = _as_dict(ConformanceReport.read_or_none(plan.conformance.report_dir() / REPORT_FILE))
    summary["completions"] = _as_dict(Completions.read_or_none(out_dir / COMPLETIONS_FILE))
    return summary


def adaptation(extension: dict[str, Any], ev: dict[str, Any] | None) -> dict[str, Any]:
    """The base before adaptation beside the adapted model, per language: chars/token of the base's and the
    extended tokenizer on the held-out files (``extension.json``), and held-out bits/char of the base
    (``eval.json``'s ``baseline``: the base with its own tokenizer, on the same text) and of the
    continued-pretrained model (``trained``). ``{"baseline": eval's --baseline path, "languages": {lang:
    {base_chars_per_token, adapted_chars_per_token, base_bits_per_char, adapted_bits_per_char}}}``; a figure
    not measured is None."""
    fert = extension.get("fertility") or {}
    rows = (ev or {}).get("languages") or {}
    out = {}
    for lang in sorted(set(fert) | set(rows)):
        f, r = fert.get(lang) or {}, rows.get(lang) or {}
        out[lang] = {
            "base_chars_per_token": f.get("chars_per_token_before"),
            "adapted_chars_per_token": f.get("chars_per_token_after"),
            "base_bits_per_char": (r.get("baseline") or {}).get("bits_per_char"),
            "adapted_bits_per_char": (r.get("trained") or {}).get("bits_per_char"),
        }
    return {"baseline": ((ev or {}).get("config") or {}).get("baseline") or None, "languages": out}


def _adaptation_rows(adapt: dict[str, Any]) -> list[list[Any]]:
    def f(x: Any) -> str:
        return "-" if x is None else f"{x:.3f}"

    return [
        [
            lang,
            f(m["base_chars_per_token"]),
            f(m["adapted_chars_per_token"]),
            f(m["base_bits_per_char"]),
            f(m["adapted_bits_per_char"]),
        ]
        for lang, m in adapt["languages"].items()
    ]


def _fertility_rows(fert: dict) -> list[list[Any]]:
    gate = fert.get("gate", {})
    mins = gate.get("min_chars_per_token", {})
    failed = {f.split(":", 1)[0] for f in gate.get("failures", [])}
    baseline = fert.get("baseline") or {}
    # the column is the naive baseline's; another tokenizer audited alongside (--compare-dir) is not shown here
    naive = baseline.get("languages", {}) if baseline.get("kind", "naive") == "naive" else {}
    rows = []
    for lang, m in sorted(fert.get("languages", {}).items()):
        verdict = "" if lang not in mins else ("FAIL" if lang in failed else "pass")
        rows.append(
            [
                lang,
                f"{m['chars_per_token']:.2f}",
                f"{m['bytes_per_token']:.2f}",
                f"{m['tokens_per_word']:.2f}",
                f"{naive[lang]['chars_per_token']:.2f}" if lang in naive else "",
                f"{mins[lang]:.2f}" if lang in mins else "",
                verdict,
            ]
        )
    return rows


def _eval_rows(ev: dict) -> list[list[Any]]:
    rows = []
    for lang, m in sorted(ev.get("languages", {}).items()):
        t, r = m["trained"], m["random_init"]
        rows.append(
            [
                lang,
                f"{t['bits_per_char']:.3f}",
                f"{r['bits_per_char']:.3f}",
                f"{t['nll_nats_per_token']:.3f}",
                f"{r['nll_nats_per_token']:.3f}",
                m.get("tokens", ""),
            ]
        )
    return rows


def _sft_rows(ev: dict) -> list[list[Any]]:
    """Per language: held-out assistant-token loss before and after fine-tuning."""

    def f(x: Any, digits: int = 3) -> str:
        return "" if x is None else f"{x:.{digits}f}"

    rows = []
    for lang, before in sorted((ev.get("before") or {}).items()):
        after = (ev.get("after") or {}).get(lang, {})
        rows.append(
            [
                lang,
                f(before.get("nll_nats_per_token")),
                f(after.get("nll_nats_per_token")),
                f(before.get("bits_per_char")),
                f(after.get("bits_per_char")),
                before.get("assistant_tokens", ""),
            ]
        )
    return rows


def _export_rows(manifest: dict, conformance: dict | None) -> list[list[Any]]:
    files = manifest.get("files", {})
    variants = manifest.get("variants", {})
    base = None
    if "fp32" in variants:
        base = _variant_bytes(variants["fp32"], files)
    verdicts = (conformance or {}).get("variants", {})
    # variants whose pass is under a bound looser than the shipped file's (pass*)
    loosened = {b["table"] for b in ((conformance or {}).get("tolerances") or {}).get("loosened") or []}
    rows = []
    for name, v in variants.items():
        size = _variant_bytes(v, files)
        ratio = f"{size / base:.2f}x" if base and v.get("format") in ("onnx", "gguf", "pte") else ""
        verdict = verdicts.get(name, {})
        passed = verdict.get("passed") if isinstance(verdict, dict) else verdict
        tables = {"global", *(verdict.get("tolerance_tables") or [name] if isinstance(verdict, dict) else [name])}
        rows.append(
            [
                name,
                v.get("format", ""),
                v.get("dtype", ""),
                f"{size / 2**20:.2f}",
                ratio,
                "" if passed is None else ("FAIL" if not passed else "pass*" if tables & loosened else "pass"),
            ]
        )
    return rows


def _variant_bytes(variant: dict, files: dict) -> int:
    path = variant.get("path", "")
    total = sum(f["bytes"] for rel, f in files.items() if rel == path or rel.startswith(path + "."))
    for extra in variant.get("external_data", []) or []:
        total += files.get(extra, {}).get("bytes", 0)
    return total


def _print_card_figures(quality: dict) -> None:
    """The card's fine-tuning cost (pretrained vs fine-tuned bits/char on the same held-out text) and task table
    (``manifest.json`` ``card_quality``, written by conformance), when it has them."""
    if quality.get("forgetting"):
        print(_rule("what fine-tuning cost: pretrained vs fine-tuned model, same held-out text"))
        rows = [
            [f["language"], f"{f['base_bpc']:.3f}", f"{f['bpc']:.3f}", f"{f['change']:+.1%}"]
            for f in quality["forgetting"]
        ]
        print(_table(["lang", "pretrained bits/char", "fine-tuned bits/char", "change"], rows))
    tasks = quality.get("tasks") or []
    if tasks:
        columns = list(dict.fromkeys(c for t in tasks for c in t["scores"]))
        print(_rule("tasks (lm-evaluation-harness; ± standard error, ▼ drop beyond it)"))
        rows = []
        for t in tasks:
            cells = []
            for c in columns:
                sc = t["scores"].get(c)
                flag = " ▼" if c in t.get("flagged", []) else ""
                err = f"±{sc['stderr']:.3f}" if sc and sc.get("stderr") is not None else ""
                cells.append(f"{sc['value']:.3f}{err}{flag}" if sc and sc.get("value") is not None else "-")
            chance = "" if t.get("chance") is None else f"{t['chance']:.2f}"
            rows.append([t["task"], t["language"], t["metric"], chance, *cells])
        print(_table(["task", "lang", "metric", "chance", *columns], rows))


_STAGE_ORDER = ("tokenizer", "data", "train", "eval", "sft", "export", "conformance", "serve")


def _parity_rows(parity: dict) -> tuple[list[str], list[list[Any]]]:
    """Runtime x language cells "identical/compared" of the audit's tokenizer parity check."""
    langs = list(parity.get("languages", {}))
    rows = []
    for name, r in parity.get("runtimes", {}).items():
        if r["status"] == "reference":
            continue
        cells = [
            f"{c['identical']}/{c['texts'] - c['excluded']}" if (c := (r.get("languages") or {}).get(lang)) else "-"
            for lang in langs
        ]
        rows.append([name, *cells, r["status"]])
    return ["runtime", *langs, "ids"], rows


def print_summary(
    plan: RunPlan, out_dir: Path, timings: dict[str, float], stage_times: dict[str, StageTime] | None = None
) -> dict[str, Any]:
    """Print the run's summary table to stdout and return it as a dict (with an ``ok`` verdict)."""
    s = summarise(plan, out_dir)
    print(_rule(f"prodip run summary: {out_dir}"))
    if s["fertility"]:
        print(_rule("tokenizer fertility (held-out text)"))
        print(
            _table(
                ["lang", "chars/token", "bytes/token", "tokens/word", "naive BPE chars/token", "gate min", "gate"],
                _fertility_rows(s["fertility"]),
            )
        )
        if s["fertility"].get("parity"):
            print(_rule("tokenizer parity with the runtimes (identical/texts, NFC)"))
            print(_table(*_parity_rows(s["fertility"]["parity"])))
    if s["adaptation"]:
        base = s["extension"].get("base", "")
        print(_rule(f"adaptation: the base ({base}) before vs the adapted model, held-out text"))
        print(
            _table(
                ["lang", "base chars/token", "adapted chars/token", "base bits/char", "adapted bits/char"],
                _adaptation_rows(s["adaptation"]),
            )
        )
        print(
            "  chars/token: the base's tokenizer and the extended one on the held-out files; bits/char: the base "
            "with its own tokenizer and the continued-pretrained model on the same validation text"
        )
    if s["eval"]:
        print(_rule("held-out quality: trained model vs random-initialised twin"))
        print(
            _table(
                ["lang", "bits/char", "twin bits/char", "NLL/token (nats)", "twin NLL/token", "tokens"],
                _eval_rows(s["eval"]),
            )
        )
        for lang, why in sorted((s["eval"].get("skipped_languages") or {}).items()):
            print(f"  {lang}: not evaluated: {why}")
    if s["sft"]:
        print(_rule("chat fine-tuning: held-out loss on assistant tokens, before -> after"))
        print(
            _table(
                ["lang", "NLL/token before", "after (nats)", "bits/char before", "after", "tokens"],
                _sft_rows(s["sft"]),
            )
        )
    if s["export_manifest"]:
        print(_rule("export variants and conformance"))
        print(
            _table(
                ["variant", "format", "dtype", "MiB", "vs fp32", "conformance"],
                _export_rows(s["export_manifest"], s["conformance"]),
            )
        )
    _print_card_figures((s["export_manifest"] or {}).get("card_quality") or {})
    problems = []
    for lang, why in sorted(((s["eval"] or {}).get("skipped_languages") or {}).items()):
        # a language of the corpus without held-out text was never evaluated: not an OK run (a Bangla-first
        # run whose Bangla is one .txt document would otherwise report English alone and pass)
        problems.append(
            f"{lang} was not evaluated ({why}: its text went to the training split whole; see [data] "
            f"split_warnings in {Path(plan.data.out_dir) / 'meta.json'})"
        )
    if s["conformance"] is not None and not s["conformance"].get("passed"):
        problems.append(f"conformance failed (see {plan.conformance.report_dir() / 'report.md'})")
    loosened = ((s["conformance"] or {}).get("tolerances") or {}).get("loosened") or []
    if loosened:  # a pass under bounds looser than the shipped ones says so wherever the verdict is shown
        tol = s["conformance"]["tolerances"]
        print(
            f"  pass* = within {tol.get('path')}, {len(loosened)} bound(s) looser than the shipped "
            f"conformance/tolerances.toml: {loosened_text(loosened)}"
        )
    if s["completions"]:
        samp = s["completions"].get("sampling") or {}
        how = (
            "greedy"
            if not samp.get("temperature")
            else ", ".join(f"{k} {samp[k]}" for k in ("temperature", "top_p", "seed") if k in samp)
        )
        if samp.get("frequency_penalty"):
            how += f", frequency_penalty {samp['frequency_penalty']}"
        print(_rule(f"completions over HTTP ({s['completions'].get('variant')}, {how})"))
        for lang, c in s["completions"]["completions"].items():
            text = c["completion"].replace("\n", " ⏎ ")
            print(f"  [{lang}] {c['prompt']}\u2502{text}")
            if not c["completion"].strip():
                problems.append(f"the {lang} completion is empty or blank")
        chats = s["completions"].get("chat") or {}
        if chats:
            print(_rule("chat replies over HTTP (/v1/chat/completions, choices[0].message.content)"))
        for lang, c in chats.items():
            print(f"  [{lang}] user: {c['user']}")
            if "error" in c:  # e.g. 400 chat_not_supported: an export without a chat template
                e = c["error"]
                print(f"       no reply: HTTP {e['status']} {e.get('code') or ''}: {e['message']}".rstrip())
            else:
                print(f"       assistant: {c['reply'].replace(chr(10), ' ⏎ ')}")
    times = stage_times or {}
    shown = {n: float(t.seconds) for n, t in times.items()} or dict(timings)
    if shown:
        print(_rule("stage wall time (seconds; * = an earlier invocation)"))
        names = [n for n in _STAGE_ORDER if n in shown] + [n for n in shown if n not in _STAGE_ORDER]
        earlier = {n for n in names if n not in timings or (n in times and times[n].invocations > 1)}
        print(_table(["stage", "seconds"], [[n + ("*" if n in earlier else ""), f"{shown[n]:.1f}"] for n in names]))
    s["timings_s"] = timings
    s["stage_times"] = {n: t.model_dump() for n, t in times.items()}
    s["ok"] = not problems
    s["problems"] = problems
    print(_rule("verdict"))
    print("  OK" if s["ok"] else "  FAILED: " + "; ".join(problems))
    print()
    return s
