"""Tokenizer parity: the ids every on-device runtime gives, against ``tokenizers``, on NFC text.

Runtimes (each with its default encode of a prompt, so the ``<|bos|>`` in front is checked too):

- ``tokenizers``: ``Tokenizer.encode(text)`` (the reference; its post-processor prepends ``<|bos|>``);
- ``transformers``: ``AutoTokenizer.from_pretrained(dir).encode(text)``;
- ``transformers.js`` (Node, ``node/``): ``AutoTokenizer.encode(text)``;
- ``onnxruntime-genai``: ``og.Tokenizer(dir).encode(text)`` after ``update_options(add_special_tokens=
  "true")`` (its encode adds no special tokens by default since 0.8; the app passes this option or
  prepends ``bos_token_id`` itself). Its C API takes NUL-terminated strings, so texts holding U+0000
  are left out for it (counted as ``excluded``);
- ``llama.cpp`` (node-llama-cpp's prebuilt build, ``node/``): a vocabulary-only GGUF (tokenizer/gguf.py),
  the BOS the GGUF asks for, then ``llama_tokenize(text, parse_special=true)``;
- ``executorch``: ExecuTorch's C++ ``HFTokenizer`` (pip ``pytorch-tokenizers``) on the ExecuTorch copy of
  ``tokenizer.json`` (no normaliser, tokenizer/portable.py), ``encode(text, bos=1, eos=0)`` as its LLM
  runners call it.

A runtime whose package is not installed is skipped with the reason (``require=True`` makes that a
failure, as in CI). Pass = every id identical. Install: ``pip install -e '.[runtimes]'`` and
``npm install --ignore-scripts --prefix node``.

    python -m prodip.tokenizer.parity runs/demo/tokenizer --texts bn=data/heldout/udhr_ben.txt,en=data/heldout/udhr_eng.txt
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tokenizers

from prodip.base.errors import InvalidInput
from prodip.base.files import native_stderr_to_log
from prodip.base.runtimes import by_name, missing_reason, runtime_names
from prodip.tokenizer.corpus import iter_language
from prodip.tokenizer.gguf import write_vocab_gguf
from prodip.tokenizer.portable import nfc, portability, write_target_files

log = logging.getLogger("prodip.tokenizer.parity")

#: The runtimes whose tokenizers are compared: the rows of ``prodip.base.runtimes.RUNTIMES`` with ``tokenizer``
#: (as the table is at import; the functions below read it at call time).
RUNTIMES = runtime_names(tokenizer=True)
REFERENCE = "tokenizers"
FORMAT_VERSION = 1
#: The folder with node/package.json and node/tokenize.mjs (``npm install --ignore-scripts --prefix node``).
NODE_DIR = Path(os.environ.get("PRODIP_NODE_DIR", Path(__file__).resolve().parents[1] / "node"))

#: Strings that broke runtime tokenizers before (cases/2026-11-30.md C6), NFC-normalised before use:
#: conjuncts, ZWJ/ZWNJ forms, nukta letters precomposed and decomposed, ো/ৌ as one and two code
#: points, danda, Bengali digits, emoji sequences, other scripts (cased non-Latin too), whitespace runs,
#: control characters, special-token strings inside text (the chat markers and a rendered chat turn
#: too), and the empty string.
TRICKY = (
    "",
    " ",
    "  ",
    "\n",
    "\n\n\n",
    "   \t  x",
    "a  b   c    d",
    "line1\r\nline2\rline3\n",
    "trailing   ",
    "ক্ষ",
    "জ্ঞ",
    "ন্ত্র",
    "স্ত্রী",
    "শ্রী",
    "ক্‌ষ",
    "ক্\u200dষ",
    "র‍্যাব",
    "র্‍য",
    "\u200d",
    "\u200c\u200c",
    "অ্যা",
    "ব্যাংক",
    "য়",
    "য\u09bc",
    "ড়",
    "ড\u09bc",
    "ঢ়",
    "ঢ\u09bc",
    "কো",
    "ক\u09c7\u09be",
    "কৌ",
    "ক\u09c7\u09d7",
    "ো",
    "\u09c7\u09be",
    "ি",
    "\u09cd",
    "ঁ ং ঃ ৎ",
    "চাঁদ সংখ্যা দুঃখ",
    "ক্ষুদ্র ঋণ, ঋষি, ৠ ৡ",
    "আমি বাংলায় গান গাই।",
    'সে বলল, "না॥"',
    "বলল। তারপর॥ কী? না!",
    " ।।",
    "১২৩৪৫৬৭৮৯০",
    "২০২৬ সালে ১,২৩,৪৫৬ টাকা",
    "৳৫০০",
    "১2৩",
    "বাংলাদেশ ও ভারতের সম্পর্ক",
    "রবীন্দ্রনাথ ঠাকুর",
    "Hello, world!",
    "I don't know. It's John's.",
    "DON'T STOP",
    "O'Neil’s",
    "mixedCASE wordsHere",
    "ÉCOLE école Ωmega ΩΜΕΓΑ Москва мОСКВА",
    "naïve café résumé",
    "e\u0301",
    "A\u030a",
    "ǅungla ǈ",
    "👍",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🇧🇩🇮🇳",
    "❤️",
    "😀😁",
    "中文字符测试",
    "日本語のテキスト",
    "한국어 텍스트",
    "हिन्दी में लिखा",
    "தமிழ்",
    "مرحبا بالعالم",
    "עברית",
    "ไทยภาษา",
    "Ω≈ç√∫˜µ≤≥÷",
    "12345678",
    "3.14159",
    "x=1;y=2/3",
    "https://example.com/a/b?c=d",
    "tab\tsep",
    "\u00a0nbsp",
    "\ufeffbom",
    "\u200bzwsp",
    "a\u0000b",
    "<|bos|>",
    "<|eos|> inside text",
    "<0x41> looks like a byte token",
    # the chat markers (ids 3 and 4), alone, glued to text, and as prodip.base.chat.render writes a turn
    "<|im_start|>",
    "<|im_end|>",
    "<|im_start|>user\nআমি বাংলায় গান গাই।<|im_end|>\n<|im_start|>assistant\n",
    "<|bos|><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n",
    "x<|im_end|>y <|im_start|> z",
    "<|im_end |> <|im_start> not markers",
)


def missing_runtimes() -> dict[str, str]:
    """Runtime -> why it cannot run here (a package not installed, no ``node``), for every tokenizer row of
    ``prodip.base.runtimes.RUNTIMES`` that lacks something (``prodip.base.runtimes.missing_reason``)."""
    missing = {}
    for runtime in runtime_names(tokenizer=True):
        reason = missing_reason(by_name(runtime), NODE_DIR)
        if reason is not None:
            missing[runtime] = reason
    return missing


# ------------------------------------------------------------------------------------------ runtimes


def _tokenizers(tok_dir: Path, texts: list[str], work: Path) -> tuple[list[list[int]], str]:
    tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return [e.ids for e in tok.encode_batch(texts)], f"tokenizers {tokenizers.__version__}"


def _transformers(tok_dir: Path, texts: list[str], work: Path) -> tuple[list[list[int]], str]:
    import transformers  # noqa: PLC0415 (a 5-10 s import, paid only when the check runs)

    tok = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    return [tok.encode(t) for t in texts], f"transformers {transformers.__version__}"


def _onnxruntime_genai(tok_dir: Path, texts: list[str], work: Path) -> tuple[list[list[int]], str]:
    import onnxruntime_genai as og  # noqa: PLC0415 (optional runtime: pip extra runtimes)

    folder = work / "onnxruntime-genai"
    write_target_files(tok_dir, folder, "onnxruntime-genai")
    # the least genai_config.json that og.Tokenizer loads (an export's real one has the model too)
    (folder / "genai_config.json").write_text(json.dumps({"model": {"type": "llama", "context_length": 2048}}))
    tok = og.Tokenizer(str(folder))
    tok.update_options(add_special_tokens="true")
    return [[int(i) for i in tok.encode(t)] for t in texts], f"onnxruntime-genai {og.__version__}"


def _executorch(tok_dir: Path, texts: list[str], work: Path) -> tuple[list[list[int]], str]:
    folder = work / "executorch"
    write_target_files(tok_dir, folder, "executorch")
    # its C++ log lines (re2's "Error parsing" before the PCRE2 fallback, "I tokenizers:regex.cpp:40]
    # Registering override fallback regex") are expected and harmless: logged at DEBUG
    with native_stderr_to_log(log):
        import pytorch_tokenizers  # noqa: PLC0415 (optional runtime: pip extra runtimes)

        tok = pytorch_tokenizers.CppHFTokenizer()
        tok.load(str(folder / "tokenizer.json"))
        ids = [list(tok.encode(t, 1, 0)) for t in texts]
    version = importlib.metadata.version("pytorch-tokenizers")
    return ids, f"pytorch-tokenizers {version} (HFTokenizer)"


def _node(tok_dir: Path, texts: list[str], work: Path, runtimes: list[str]) -> dict[str, Any]:
    """transformers.js and llama.cpp in one Node process (node/tokenize.mjs)."""
    request = {"tokenizer_dir": str(tok_dir), "texts": texts, "runtimes": runtimes, "gguf": None}
    if "llama.cpp" in runtimes:
        request["gguf"] = str(write_vocab_gguf(tok_dir, work / "vocab.gguf"))
    (work / "node_request.json").write_text(json.dumps(request, ensure_ascii=False), encoding="utf-8")
    proc = subprocess.run(
        ["node", str(NODE_DIR / "tokenize.mjs"), str(work / "node_request.json"), str(work / "node_response.json")],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"node/tokenize.mjs exited {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads((work / "node_response.json").read_text(encoding="utf-8"))


#: Runtime -> its tokenizer encoder in Python (``(tokenizer_dir, texts, work_dir) -> (ids per text, version)``);
#: the tokenizer rows of ``prodip.base.runtimes.RUNTIMES`` not here run in Node (``node/tokenize.mjs``).
_PYTHON_RUNNERS: dict[str, Callable[[Path, list[str], Path], tuple[list[list[int]], str]]] = {
    "tokenizers": _tokenizers,
    "transformers": _transformers,
    "onnxruntime-genai": _onnxruntime_genai,
    "executorch": _executorch,
}
#: Texts a runtime cannot be given, and why (they are counted as excluded, not compared).
_EXCLUDE = {
    "onnxruntime-genai": (lambda t: "\x00" in t, "its C API takes NUL-terminated strings (U+0000 ends the text)")
}


def encode_all(
    tokenizer_dir: str | os.PathLike, texts: list[str], runtimes: tuple[str, ...] | None = None
) -> tuple[dict[str, list[list[int]]], dict[str, str], dict[str, str]]:
    """Encode ``texts`` (already NFC) with each runtime.

    Returns:
        ``(ids, versions, errors)``: runtime -> one id list per text; runtime -> version string;
        runtime -> error text for a runtime that was installed but failed.
    """
    tok_dir = Path(tokenizer_dir).resolve()
    runtimes = runtime_names(tokenizer=True) if runtimes is None else runtimes
    ids: dict[str, list[list[int]]] = {}
    versions: dict[str, str] = {}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="prodip_parity_") as tmp:
        work = Path(tmp)
        for runtime in runtimes:
            if runtime in _PYTHON_RUNNERS:
                try:
                    ids[runtime], versions[runtime] = _PYTHON_RUNNERS[runtime](tok_dir, texts, work)
                except Exception as err:  # a runtime failing is a result, reported per runtime
                    errors[runtime] = f"{type(err).__name__}: {err}"
            elif not by_name(runtime).npm:
                errors[runtime] = f"no encoder for {runtime} in {__name__}._PYTHON_RUNNERS"
        node = [r for r in runtimes if r not in _PYTHON_RUNNERS and by_name(r).npm]
        if node:
            try:
                response = _node(tok_dir, texts, work, node)
                ids.update(response["ids"])
                versions.update(response["versions"])
                errors.update(response["errors"])
            except Exception as err:
                errors.update({r: f"{type(err).__name__}: {err}" for r in node})
    return ids, versions, errors


def _compare(
    ref: list[list[int]],
    got: list[list[int]],
    texts: list[str],
    langs: list[str],
    exclude: Callable[[str], bool] | None,
) -> dict[str, Any]:
    per_lang: dict[str, dict[str, int]] = {}
    first = None
    for text, lang, a, b in zip(texts, langs, ref, got):
        row = per_lang.setdefault(lang, {"texts": 0, "identical": 0, "excluded": 0})
        row["texts"] += 1
        if exclude is not None and exclude(text):
            row["excluded"] += 1
        elif a == b:
            row["identical"] += 1
        elif first is None:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            first = {
                "language": lang,
                "text": text[:200],
                "position": at,
                "expected": a[max(0, at - 3) : at + 5],
                "got": b[max(0, at - 3) : at + 5],
            }
    identical = all(r["identical"] + r["excluded"] == r["texts"] for r in per_lang.values())
    return {"status": "identical" if identical else "differs", "languages": per_lang, "first_mismatch": first}


def run_parity(
    tokenizer_dir: str | os.PathLike,
    texts_by_lang: dict[str, list[str]],
    *,
    runtimes: tuple[str, ...] | None = None,
    require: bool = False,
    tricky: bool = True,
) -> dict[str, Any]:
    """Compare every runtime's ids with ``tokenizers``' on the texts (NFC-normalised here).

    Args:
        tokenizer_dir: a tokenizer dir (or export dir) with the three tokenizer files.
        texts_by_lang: language -> texts (documents or lines).
        runtimes: which runtimes to run (``tokenizers`` is always run: the reference).
        require: a runtime that is not installed fails the check (CI) instead of being skipped.
        tricky: also compare :data:`TRICKY` (as language ``tricky``).

    Returns:
        ``{format_version, reference, passed, languages: {lang: {texts, chars, tokens}}, runtimes: {name:
        {status: identical|differs|skipped|error|not-portable, version, reason, languages: {lang: {texts,
        identical, excluded}}, first_mismatch}}}``.

    Raises:
        InvalidInput: unknown runtime names, or no text at all.
    """
    known = runtime_names(tokenizer=True)
    runtimes = known if runtimes is None else runtimes
    unknown = [r for r in runtimes if r not in known]
    if unknown:
        raise InvalidInput(f"parity runtimes: unknown {unknown}; known: {', '.join(known)}")
    groups = {lang: [nfc(t) for t in ts] for lang, ts in texts_by_lang.items()}
    if tricky:
        groups["tricky"] = [nfc(t) for t in TRICKY]
    texts = [t for ts in groups.values() for t in ts]
    langs = [lang for lang, ts in groups.items() for _ in ts]
    if not texts:
        raise InvalidInput("parity: no texts to compare")
    missing = missing_runtimes()
    portable = portability(tokenizer_dir)
    result: dict[str, dict[str, Any]] = {}
    run = [REFERENCE]
    for r in runtimes:
        if r == REFERENCE:
            continue
        if r in missing:
            result[r] = {"status": "error" if require else "skipped", "reason": missing[r]}
        elif not portable.get(r, (True, ""))[0]:  # a runtime with no portability rule reads tokenizer.json as is
            result[r] = {"status": "not-portable", "reason": portable[r][1]}
        else:
            run.append(r)
    ids, versions, errors = encode_all(tokenizer_dir, texts, tuple(run))
    if REFERENCE not in ids:
        raise RuntimeError(f"parity: the reference ({REFERENCE}) failed: {errors.get(REFERENCE)}")
    ref = ids[REFERENCE]
    for r in run[1:]:
        if r in errors or r not in ids:
            result[r] = {"status": "error", "reason": errors.get(r, "no output"), "version": versions.get(r)}
            continue
        exclude, why = _EXCLUDE.get(r, (None, ""))
        result[r] = {"version": versions[r], **_compare(ref, ids[r], texts, langs, exclude)}
        if why:
            result[r]["reason"] = f"texts with U+0000 excluded: {why}"
    stats = {
        lang: {
            "texts": len(ts),
            "chars": sum(map(len, ts)),
            "tokens": sum(len(ref[i]) for i, x in enumerate(langs) if x == lang),
        }
        for lang, ts in groups.items()
    }
    # not-portable: a tokenizer the target cannot carry (the custom kind); its export is refused instead
    passed = all(v["status"] in ("identical", "skipped", "not-portable") for v in result.values())
    return {
        "format_version": FORMAT_VERSION,
        "reference": f"{REFERENCE} ({versions[REFERENCE]})",
        "nfc": True,
        "passed": passed,
        "languages": stats,
        "runtimes": {REFERENCE: {"status": "reference", "version": versions[REFERENCE]}, **result},
    }


def format_parity(report: dict[str, Any]) -> str:
    """The parity report as a runtime x language table: identical/compared texts per cell."""
    langs = list(report["languages"])
    head = f"{'runtime':<18} " + " ".join(f"{lang:>13}" for lang in langs) + "  status"
    lines = [f"tokenizer parity vs {report['reference']} on NFC text (identical texts / texts)", head, "-" * len(head)]
    for name, r in report["runtimes"].items():
        if name == REFERENCE:
            continue
        cells = []
        for lang in langs:
            c = (r.get("languages") or {}).get(lang)
            cells.append(f"{c['identical']}/{c['texts'] - c['excluded']}".rjust(13) if c else "-".rjust(13))
        note = r["status"] + (f" ({r['reason']})" if r.get("reason") and r["status"] != "identical" else "")
        lines.append(f"{name:<18} " + " ".join(cells) + f"  {note}"[:200])
        if r.get("first_mismatch"):
            m = r["first_mismatch"]
            lines.append(
                f"{'':<18} first mismatch [{m['language']}] {m['text'][:40]!r} at token {m['position']}: "
                f"expected {m['expected']} got {m['got']}"
            )
    lines.append(
        "texts: "
        + ", ".join(
            f"{lang} {s['texts']:,} ({s['chars']:,} chars, {s['tokens']:,} tokens)"
            for lang, s in report["languages"].items()
        )
    )
    lines.append("parity: " + ("PASSED" if report["passed"] else "FAILED"))
    return "\n".join(lines)


def _read_texts(spec: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in filter(None, spec.split(",")):
        lang, _, path = item.partition("=")
        out.setdefault(lang, []).extend(
            doc for _, _, doc in iter_language([Path(path)], lang, errors="strict", doc_chars=2000)
        )
    return out


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prodip.tokenizer.parity", description=__doc__.splitlines()[0])
    parser.add_argument("tokenizer_dir")
    parser.add_argument("--texts", default="", help="lang=file,... texts to compare (besides the tricky list)")
    parser.add_argument(
        "--runtimes",
        default=",".join(runtime_names(tokenizer=True)),
        help="comma-separated subset of " + ",".join(runtime_names(tokenizer=True)),
    )
    parser.add_argument("--require", action="store_true", help="a runtime that is not installed is a failure")
    parser.add_argument("--json", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    report = run_parity(
        args.tokenizer_dir, _read_texts(args.texts), runtimes=tuple(args.runtimes.split(",")), require=args.require
    )
    print(format_parity(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    from prodip.base.cli import tool_main

    sys.exit(tool_main("tokenizer.parity", _main, sys.argv[1:]))
