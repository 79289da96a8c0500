"""The export's web page against llama.cpp's WebAssembly build (wllama) and ONNX Runtime native, side by side.

For each model shape (``demo``: configs/demo.toml's model, 7 M parameters at vocab 8192; ``109m``:
bench/serve.py's shape, hidden 1024, 8 layers, GQA 8/4, vocab 16384) a random model is exported by the real
path (:func:`tests.fixtures.build_tiny_export`: ONNX fp32/q8/q4 and GGUF f16/q8_0/q4_k_m from the same
weights), then, per thread count, every runner decodes the same prompt text greedily:

* ``page``: the export's own ``index.html`` (transformers.js + onnxruntime-web WASM, exactly the code path
  a user gets) in Debian's Chromium, headless, driven by puppeteer-core (``conformance/browser_pages.mjs``, the one Chromium driver), with
  ``?dtype=..&threads=..&autorun=1``; ``page default`` is the page with no ``dtype`` (what a user gets);
  ``page, asyncify build`` adds ``&wasm=asyncify``: the WASM build transformers.js picks by itself;
* ``wllama``: npm ``@wllama/wllama`` (llama.cpp compiled to WebAssembly) in the same Chromium, loading the
  export's own GGUF files (``bench/browser/wllama.html``);
* ``ort native``: ONNX Runtime's CPU execution provider in Python on the same ONNX files (the ceiling).

For q4 three more: ``page, q4 fused (MatMulNBits)`` (``&q4=fused``: the q4 file through onnxruntime-web's fused
4-bit kernel), ``page, q4 folded to fp32`` (``&q4=fp32``: the q4 file's weights folded to float32 at load; the
page's default q4 on WASM is the WASM q4 file, 8-bit weights made at load) and ``ort native, MatMulNBits
file`` (the same quantisation written as MatMulNBits, the layout before the qdq one). ``--runners`` picks runners.

Figures: time to first token (TTFT: the generate call to the first new token, prompt prefill included,
model load excluded; seconds) and decode tokens/s (new tokens after the first over the time after the
first). Each cell is run once per round; the order of the cells rotates between rounds; medians over
rounds are reported. The pages are served from 127.0.0.1 with COOP/COEP headers (cross-origin isolated:
SharedArrayBuffer, so WASM threads are possible; wllama's build requires it). End-of-sequence is ignored
(``min_new_tokens`` / ``ignore_eos``) so every runner decodes the same count.

On a shared machine only ratios within one run mean anything: the JSON records the machine and its load.

    python bench/browser.py --quick                       # demo shape, 1 thread, 1 round, 16 tokens (~2 min)
    python bench/browser.py --out bench/results/browser_2026-12-02   # both shapes, 1 and 2 threads, 3 rounds
    python bench/browser.py --shapes 109m --threads 1 --dtypes q4 --runners "page;page, q4 fused (MatMulNBits);wllama"
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: model shapes (tiny_model_config arguments)
SHAPES: dict[str, dict[str, int]] = {
    "demo": dict(vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256),
    "109m": dict(vocab_size=16384, hidden_size=1024, intermediate_size=2048, num_hidden_layers=8,
                 num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024),
}  # fmt: skip
#: bits -> (page dtype, ONNX variant, GGUF variant): the files of one export at comparable weight widths
BITS: dict[str, tuple[str, str, str]] = {
    "4-bit": ("q4", "int4", "gguf-q4_k_m"),
    "8-bit": ("q8", "int8", "gguf-q8_0"),
    "16/32-bit": ("fp32", "fp32", "gguf-f16"),
}
#: the page on the asyncify WASM build (``?wasm=asyncify``): what the page loaded before it chose the plain build
ASYNCIFY = "page, asyncify build"
#: the page's q4 through onnxruntime-web's fused 4-bit kernel (``?q4=fused``): the MatMulNBits the q4 file ran as
#: before the page folded it to fp32 at load
Q4_FUSED = "page, q4 fused (MatMulNBits)"
#: the page's q4 with the q4 file's weights folded to float32 at load (``?q4=fp32``): the WASM path before the
#: WASM q4 file (8-bit weights made at load)
Q4_FP32 = "page, q4 folded to fp32"
#: ONNX Runtime native on the int4 file written as MatMulNBits (``to_int4(layout="matmulnbits")``, the layout
#: before qdq), beside ``ort native`` on the export's own (qdq) file
ORT_MNB = "ort native, MatMulNBits file"
#: where :func:`build` writes that file, relative to the export
MNB_FILE = "onnx/model_q4_matmulnbits.onnx"
RUNNERS = ("page default", "page", Q4_FUSED, Q4_FP32, ASYNCIFY, "wllama", "ort native", ORT_MNB)
PROMPT = "The quick brown fox"  # 18 tokens with the fixtures' tokenizer (BOS included)


def build(work: Path, shape: str) -> Path:
    """The export of a random model of ``shape`` under ``work/shape`` (reused when already there)."""
    from prodip.export.quantize import to_int4
    from tests.fixtures import build_tiny_export

    root = work / shape
    export = root / "export"
    if not (export / "manifest.json").is_file():
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        variants = sorted({v for b in BITS.values() for v in b[1:]})
        export = build_tiny_export(root, seed=7, variants=variants, **SHAPES[shape])
    if not (export / MNB_FILE).is_file():  # the same quantisation as the export's int4, as MatMulNBits in the file
        to_int4(export / "onnx" / "model.onnx", export / MNB_FILE, layout="matmulnbits", **int4_options(export))
    return export


def int4_options(export: Path) -> dict[str, Any]:
    """The export's int4 quantisation options (manifest ``variants.int4.quantization``) as ``to_int4`` arguments."""
    from prodip.base.manifest import load_manifest

    q = load_manifest(export).variants["int4"].quantization
    return {"block_size": q.block_size, "symmetric": q.symmetric, "accuracy_level": q.accuracy_level}


def routes(node_root: Path) -> dict[str, Path]:
    """The URL prefixes served beside the export: wllama's ESM build and the bench pages."""
    return {
        "/_wllama/": node_root / "node_modules" / "@wllama" / "wllama" / "esm",
        "/_bench/": REPO / "bench" / "browser",
    }


def browser_jobs(jobs: list[dict[str, Any]], node_root: Path, args: list[str]) -> list[dict[str, Any]]:
    """Run ``jobs`` (url, result) in one Chromium, in order; each one's answer (the one Chromium driver,
    ``prodip.conformance.runtimes.browser_page.open_pages``)."""
    from prodip.conformance.runtimes.browser_page import open_pages  # noqa: PLC0415 (after sys.path has the repo)

    return open_pages(jobs, args, root=node_root, timeout_s=24 * 3600)


def ort_native(
    export: Path, variant: str, threads: int, prompt: list[int], new_tokens: int, rel: Optional[str] = None
) -> dict[str, Any]:
    """ONNX Runtime CPU, ``threads`` intra-op threads: greedy decode of ``new_tokens`` after ``prompt``
    (on ``rel``, default the variant's file)."""
    import numpy as np

    from prodip.base.variants import BY_NAME
    from prodip.conformance.runners import OrtRunner

    cfg = json.loads((export / "config.json").read_text(encoding="utf-8"))
    t0 = time.perf_counter()
    runner = OrtRunner(
        export / (rel or BY_NAME[variant].path), variant, num_layers=cfg["num_hidden_layers"],
        num_kv_heads=cfg["num_key_value_heads"], head_dim=cfg["head_dim"], threads=threads,
    )  # fmt: skip
    load = time.perf_counter() - t0
    ids = list(prompt)
    x = np.asarray([ids], np.int64)
    t0 = time.perf_counter()
    logits, state = runner.forward(x, np.ones_like(x), np.arange(len(ids), dtype=np.int64)[None])
    ids.append(int(np.argmax(logits[0, -1])))
    t1 = time.perf_counter()
    for _ in range(new_tokens - 1):
        n = len(ids)
        logits, state = runner.forward(
            np.asarray([[ids[-1]]], np.int64), np.ones((1, n), np.int64), np.asarray([[n - 1]], np.int64), state
        )
        ids.append(int(np.argmax(logits[0, -1])))
    t2 = time.perf_counter()
    return {
        "load_ms": load * 1e3,
        "ttft_ms": (t1 - t0) * 1e3,
        "tokens_per_s": (new_tokens - 1) / (t2 - t1),
        "new_tokens": new_tokens,
        "prompt_tokens": len(prompt),
        "ids": ids,
    }


def cells(dtypes: list[str], default_dtype: str, runners: tuple[str, ...] = RUNNERS) -> list[tuple[str, str, str]]:
    """(runner, bits, file label) for every cell of one shape and thread count, for ``runners`` only."""
    out = [("page default", next(b for b, v in BITS.items() if v[0] == default_dtype), default_dtype)]
    for bits, (dtype, variant, gguf) in BITS.items():
        if dtype not in dtypes:
            continue
        out += [("page", bits, dtype), (ASYNCIFY, bits, dtype), ("wllama", bits, gguf), ("ort native", bits, variant)]
        if dtype == "q4":
            out += [(Q4_FUSED, bits, dtype), (Q4_FP32, bits, dtype), (ORT_MNB, bits, variant)]
    return [c for c in out if c[0] in runners]


def run_cells(
    export: Path,
    base: str,
    node_root: Path,
    order: list[tuple[str, str, str]],
    threads: int,
    new_tokens: int,
    prompt_ids: list[int],
) -> dict[tuple[str, str, str], dict[str, Any]]:
    """One round: each cell once, in ``order``; consecutive browser cells share one Chromium."""
    from urllib.parse import quote

    from prodip.base.variants import BY_NAME

    results: dict[tuple[str, str, str], dict[str, Any]] = {}
    pending: list[tuple[tuple[str, str, str], dict[str, Any]]] = []

    def flush() -> None:
        if not pending:
            return
        answers = browser_jobs([j for _, j in pending], node_root, ["--disable-gpu"])
        for (cell, _), got in zip(pending, answers):
            res = dict(got["result"] or {})
            res["error"] = got["error"]
            if got["error"]:
                res["console"] = got["console"]
            res.pop("text", None)
            results[cell] = res
        pending.clear()

    q = f"prompt={quote(PROMPT)}&max_new_tokens={new_tokens}&threads={threads}"
    for cell in order:
        runner, _, label = cell
        if runner in ("ort native", ORT_MNB):
            flush()
            rel = MNB_FILE if runner == ORT_MNB else None
            results[cell] = ort_native(export, label, threads, prompt_ids, new_tokens, rel)
            continue
        if runner == "wllama":
            url = f"{base}/_bench/wllama.html?gguf={BY_NAME[label].path}&{q}"
            pending.append((cell, {"url": url, "result": "wllamaResult", "timeout_ms": 900_000}))
        else:
            dtype = "" if runner == "page default" else f"dtype={label}&"
            build = {ASYNCIFY: "&wasm=asyncify", Q4_FUSED: "&q4=fused", Q4_FP32: "&q4=fp32"}.get(runner, "")
            url = f"{base}/index.html?{dtype}{q}{build}&min_new_tokens={new_tokens}&autorun=1"
            pending.append((cell, {"url": url, "result": "prodipResult", "timeout_ms": 900_000}))
    flush()
    return results


def machine() -> dict[str, Any]:
    """The machine and software the figures come from."""
    import onnxruntime

    def version(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
        except OSError:
            return "?"

    cpu = "?"
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    node = REPO / "node" / "node_modules"

    def pkg(name: str) -> str:
        try:
            return json.loads((node / name / "package.json").read_text())["version"]
        except OSError:
            return "?"

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_1_5_15": list(os.getloadavg()),
        "platform": platform.platform(),
        "chromium": version(["chromium", "--version"]),
        "node": version(["node", "--version"]),
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime-web": pkg("onnxruntime-web"),
        "@huggingface/transformers": pkg("@huggingface/transformers"),
        "@wllama/wllama": pkg("@wllama/wllama"),
    }


def markdown(report: dict[str, Any]) -> str:
    """Tables: per shape and thread count, runner x bits, decode tokens/s (TTFT s), medians."""
    m = report["machine"]
    lines = [
        f"# The export's page vs wllama vs ONNX Runtime native ({report['date']})",
        "",
        f"`python bench/browser.py {' '.join(report['argv'])}` (raw: `{report['json']}`).",
        f"Machine: {m['cpu']}, {m['cores']} cores, load average {m['loadavg_1_5_15'][0]:.1f} at the start "
        f"({m['platform']}); {m['chromium']}, headless, `--disable-gpu`; onnxruntime-web {m['onnxruntime-web']} "
        f"(transformers.js {m['@huggingface/transformers']}), wllama {m['@wllama/wllama']}, ONNX Runtime "
        f"{m['onnxruntime']}. Prompt {report['prompt_tokens']} tokens, {report['new_tokens']} greedy new "
        f"tokens, medians of {report['rounds']} rotated rounds. **The machine is shared: compare within a table.**",
        "",
        "Cells: decode tokens/s (time to first token, s), file in brackets.",
    ]
    for shape, by_threads in report["results"].items():
        for threads, rows in by_threads.items():
            lines += ["", f"## {shape}, {threads} thread(s)", "", "| runner | " + " | ".join(BITS) + " |",
                      "|---|" + "---:|" * len(BITS)]  # fmt: skip
            for runner in RUNNERS:
                row = []
                for bits in BITS:
                    hit = [c for c in rows if c["runner"] == runner and c["bits"] == bits]
                    if not hit:
                        row.append("")
                        continue
                    c = hit[0]
                    if c.get("tokens_per_s") is None:
                        row.append(f"{c['file']}: error")
                    else:
                        row.append(f"{c['file']} **{c['tokens_per_s']:.1f}** ({c['ttft_ms'] / 1e3:.2f})")
                if any(row):
                    lines.append(f"| {runner} | " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="demo shape, 1 thread, 1 round, 16 new tokens")
    ap.add_argument("--shapes", default="demo,109m", help=f"comma list of {sorted(SHAPES)}")
    ap.add_argument("--dtypes", default="q4,q8,fp32", help="page dtypes (each with its wllama/ORT file)")
    ap.add_argument("--threads", default="1,2", help="comma list of thread counts")
    ap.add_argument("--runners", default=";".join(RUNNERS), help=f"';'-separated list of {RUNNERS}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--work", type=Path, default=None, help="folder for the exports (reused between runs)")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the results to OUT with the suffixes .json and .md (default: print)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.shapes, args.threads, args.rounds, args.new_tokens = "demo", "1", 1, 16
    node_root = Path(os.environ.get("PRODIP_NODE_ROOT", REPO / "node"))
    if not (node_root / "node_modules" / "@wllama" / "wllama").is_dir():
        sys.exit(
            f"error: @wllama/wllama is not installed under {node_root} (npm install --ignore-scripts --prefix node)"
        )
    from tokenizers import Tokenizer

    from prodip.conformance.runtimes.browser_page import serve_dir  # noqa: PLC0415 (after sys.path has the repo)

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_browser_"))
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "argv": argv if argv is not None else sys.argv[1:],
        "json": str(args.out.with_suffix(".json")) if args.out else "-",
        "machine": machine(),
        "rounds": args.rounds,
        "new_tokens": args.new_tokens,
        "units": {
            "tokens_per_s": "new tokens per second after the first",
            "ttft_ms": "milliseconds",
            "load_ms": "milliseconds",
        },  # fmt: skip
        "results": {},
        "raw": {},
    }
    dtypes = args.dtypes.split(",")
    for shape in args.shapes.split(","):
        export = build(work, shape)
        cfg = json.loads((export / "config.json").read_text(encoding="utf-8"))
        tjs = cfg["transformers.js_config"]
        # what the page picks with no ?dtype: the wasm device's entry, else the file's default
        default = tjs.get("device_config", {}).get("wasm", {}).get("dtype") or tjs["dtype"]
        from prodip.export.web import write_web_page

        write_web_page(export)  # this working tree's page (a reused export keeps its model files)
        prompt_ids = Tokenizer.from_file(str(export / "tokenizer.json")).encode(PROMPT).ids
        report["prompt_tokens"] = len(prompt_ids)
        with serve_dir(export, routes(node_root)) as base:
            report["results"][shape], report["raw"][shape] = {}, {}
            for threads in [int(t) for t in args.threads.split(",")]:
                todo = cells(dtypes, default, tuple(args.runners.split(";")))
                rounds = []
                for r in range(args.rounds):
                    k = (r * len(todo)) // max(args.rounds, 1)
                    order = todo[k:] + todo[:k]
                    got = run_cells(export, base, node_root, order, threads, args.new_tokens, prompt_ids)
                    rounds.append({" | ".join(c): v for c, v in got.items()})
                    print(f"{shape} threads={threads} round {r + 1}/{args.rounds} done", file=sys.stderr)
                rows = []
                for c in todo:
                    key = " | ".join(c)
                    runs = [rnd[key] for rnd in rounds if rnd[key].get("tokens_per_s")]
                    row = {"runner": c[0], "bits": c[1], "file": c[2], "runs": len(runs)}
                    paths = {rnd[key].get("q4_path") for rnd in rounds} - {None}
                    if paths:  # the page's q4 path on WASM (fp32-folded or fused)
                        row["q4_path"] = ",".join(sorted(paths))
                    for f in ("tokens_per_s", "ttft_ms", "load_ms"):
                        vals = [x[f] for x in runs if x.get(f) is not None]
                        row[f] = statistics.median(vals) if vals else None
                    errors = [rnd[key].get("error") for rnd in rounds if rnd[key].get("error")]
                    if errors:
                        row["error"] = errors[0]
                    rows.append(row)
                report["results"][shape][str(threads)] = rows
                report["raw"][shape][str(threads)] = rounds
    text = markdown(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str), encoding="utf-8")
        args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
