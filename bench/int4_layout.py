"""The int4 file natively, qdq layout vs MatMulNBits layout: decode speed side by side, and what ONNX Runtime runs.

The export's int4 file is written as int4 ``DequantizeLinear`` + ``MatMul`` (``to_int4(layout="qdq")``, the
default) so that onnxruntime-web can fold it to fp32 at load; natively ONNX Runtime's QDQ fusion should make
each pair the ``MatMulNBits`` the ``matmulnbits`` layout writes directly. This bench checks that on a
bench/browser.py-shaped export (``--shape``; the same exports, reused from ``--work``): for each layout, the
optimised graph's MatMulNBits count and accuracy levels (``SessionOptions.optimized_model_filepath``), and
greedy decode tokens/s (the first new token, the prefill's, excluded) through

* ``ort``: ONNX Runtime's CPU EP on the contract graph (``prodip.conformance.runners.OrtRunner``);
* ``serve``: prodip serve's decoder (``prodip.serve.engine.OnnxDecoder``) on the shared-buffer graph
  (``<file>_genai.onnx``), as ``prodip serve`` loads an int4 export;
* ``genai``: onnxruntime-genai (``og.Model`` with the variant's overlay, shared buffer).

Each runner x layout once per round, order rotated between rounds; medians; the qdq/matmulnbits ratio per
runner is computed within the run. Greedy ids of the two layouts are compared too (same codes: equal).

    python bench/int4_layout.py --work build/bq --shape 109m --threads 1 --rounds 5 --out bench/results/int4_layout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: the two layouts' files in the export (the matmulnbits one written here, with its weights file and genai graph)
FILES = {"qdq": "onnx/model_q4.onnx", "matmulnbits": "onnx/model_q4_mnb.onnx"}


def prepare(export: Path) -> None:
    """Write the matmulnbits layout of the export's int4 (same quantisation options) as the export lays out a
    variant: weights in ``<file>_data`` and its shared-buffer ``_genai`` graph."""
    from bench.browser import int4_options
    from prodip.export.genai import genai_graph_path, move_weights_out, write_genai_graph
    from prodip.export.quantize import to_int4

    rel = FILES["matmulnbits"]
    if (export / genai_graph_path(rel)).is_file():
        return
    to_int4(export / "onnx" / "model.onnx", export / rel, layout="matmulnbits", **int4_options(export))
    move_weights_out(export, rel)
    write_genai_graph(export, rel)


def fused_nodes(path: Path) -> dict[str, Any]:
    """MatMulNBits / DequantizeLinear counts and accuracy levels in ONNX Runtime's optimised graph of ``path``."""
    import tempfile

    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED  # no hardware-specific layout
        opts.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        opts.add_session_config_entry("session.optimized_model_external_initializers_file_name", "opt.onnx.data")
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        graph = onnx.load(opts.optimized_model_filepath, load_external_data=False).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    levels = sorted({a.i for n in nbits for a in n.attribute if a.name == "accuracy_level"})
    file_ops = [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]
    return {
        "file_MatMulNBits": file_ops.count("MatMulNBits"),
        "file_DequantizeLinear": file_ops.count("DequantizeLinear"),
        "optimised_MatMulNBits": len(nbits),
        "optimised_DequantizeLinear": sum(n.op_type == "DequantizeLinear" for n in graph.node),
        "accuracy_levels": levels,
    }


def greedy(step, prompt: list[int], tokens: int) -> tuple[float, list[int]]:
    """tokens/s after the first new token, and the ids; ``step(ids, past) -> (logits, past)``."""
    ids = list(prompt)
    logits, past = step(ids, None)
    ids.append(int(np.argmax(logits)))
    t0 = time.perf_counter()
    for _ in range(tokens - 1):
        logits, past = step(ids, past)
        ids.append(int(np.argmax(logits)))
    return (tokens - 1) / (time.perf_counter() - t0), ids


def run_ort(export: Path, rel: str, cfg: dict[str, Any], threads: int, prompt: list[int], tokens: int):
    from prodip.conformance.runners import OrtRunner

    runner = OrtRunner(
        export / rel, "int4", num_layers=cfg["num_hidden_layers"], num_kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"], threads=threads,
    )  # fmt: skip

    def step(ids, past):
        n = len(ids)
        if past is None:
            x = np.asarray([ids], np.int64)
            logits, state = runner.forward(x, np.ones_like(x), np.arange(n, dtype=np.int64)[None])
        else:
            logits, state = runner.forward(
                np.asarray([[ids[-1]]], np.int64), np.ones((1, n), np.int64), np.asarray([[n - 1]], np.int64), past
            )
        return logits[0, -1], state

    return greedy(step, prompt, tokens)


def run_serve(export: Path, rel: str, cfg: dict[str, Any], threads: int, prompt: list[int], tokens: int):
    from prodip.export.genai import genai_graph_path
    from prodip.serve.engine import OnnxDecoder

    dec = OnnxDecoder(export / genai_graph_path(rel), cfg, threads, shared_buffer=True)
    reserve = len(prompt) + tokens

    def step(ids, past):
        n = len(ids)
        if past is None:
            x = np.asarray([ids], np.int64)
            logits, present = dec.forward(x, np.ones_like(x), np.arange(n)[None], dec.empty_past(1), reserve)
        else:
            logits, present = dec.forward(
                np.asarray([[ids[-1]]], np.int64), np.ones((1, n), np.int64), np.asarray([[n - 1]]), past, reserve
            )
        return np.array(logits[0, -1]), present

    return greedy(step, prompt, tokens)


def run_genai(export: Path, rel: str, cfg: dict[str, Any], threads: int, prompt: list[int], tokens: int):
    import onnxruntime_genai as og

    from prodip.export.genai import genai_graph_path, genai_overlay

    config = og.Config(str(export))
    overlay = genai_overlay(genai_graph_path(rel), share_buffer=True)
    overlay["model"]["decoder"]["session_options"] = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps(overlay))
    model = og.Model(config)
    params = og.GeneratorParams(model)
    total = len(prompt) + tokens
    params.set_search_options(do_sample=False, max_length=total, min_length=total)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    gen.generate_next_token()
    t0, n = time.perf_counter(), 0
    while not gen.is_done():
        gen.generate_next_token()
        n += 1
    rate = n / (time.perf_counter() - t0)
    return rate, [int(i) for i in gen.get_sequence(0)]


RUNNERS = {"ort": run_ort, "serve": run_serve, "genai": run_genai}


def main(argv: list[str] | None = None) -> None:
    from bench.browser import PROMPT, build

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="bench/browser.py's --work folder (exports reused)")
    ap.add_argument("--shape", default="109m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runners", default=",".join(RUNNERS))
    ap.add_argument("--out", type=Path, default=None, help="write the results with the suffixes .json and .md")
    args = ap.parse_args(argv)
    from tokenizers import Tokenizer

    export = build(args.work, args.shape)
    prepare(export)
    cfg = json.loads((export / "config.json").read_text(encoding="utf-8"))
    prompt = Tokenizer.from_file(str(export / "tokenizer.json")).encode(PROMPT).ids
    graphs = {layout: fused_nodes(export / rel) for layout, rel in FILES.items()}
    cells = [(r, layout) for r in args.runners.split(",") for layout in FILES]
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        k = (r * len(cells)) // max(args.rounds, 1)
        got = {}
        for runner, layout in cells[k:] + cells[:k]:
            rate, ids = RUNNERS[runner](export, FILES[layout], cfg, args.threads, prompt, args.tokens)
            got[f"{runner} | {layout}"] = {"tokens_per_s": rate, "ids": ids}
        rounds.append(got)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows = []
    for runner in args.runners.split(","):
        med = {layout: statistics.median(x[f"{runner} | {layout}"]["tokens_per_s"] for x in rounds) for layout in FILES}
        ratios = [x[f"{runner} | qdq"]["tokens_per_s"] / x[f"{runner} | matmulnbits"]["tokens_per_s"] for x in rounds]
        same = all(x[f"{runner} | qdq"]["ids"] == x[f"{runner} | matmulnbits"]["ids"] for x in rounds)
        rows.append(
            {"runner": runner, **{f"{k}_tokens_per_s": v for k, v in med.items()},
             "ratio_qdq_over_matmulnbits_median": statistics.median(ratios),
             "ratio_min_max": [min(ratios), max(ratios)], "same_ids": same}
        )  # fmt: skip
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "argv": argv if argv is not None else sys.argv[1:],
        "loadavg_1_5_15": list(os.getloadavg()),
        "shape": args.shape,
        "threads": args.threads,
        "rounds": args.rounds,
        "tokens": args.tokens,
        "prompt_tokens": len(prompt),
        "graphs": graphs,
        "rows": rows,
    }
    lines = [
        f"int4 layouts natively, {args.shape} shape, {args.threads} thread(s), {args.tokens} new tokens, "
        f"medians of {args.rounds} rotated rounds, load average {report['loadavg_1_5_15'][0]:.1f} at the end",
        "",
        "| layout | MatMulNBits in file | DequantizeLinear in file | MatMulNBits after ORT optimisation | accuracy levels |",
        "|---|---:|---:|---:|---|",
    ]
    for layout, g in graphs.items():
        lines.append(
            f"| {layout} | {g['file_MatMulNBits']} | {g['file_DequantizeLinear']} | {g['optimised_MatMulNBits']} "
            f"| {g['accuracy_levels']} |"
        )
    lines += ["", "| runner | qdq tokens/s | matmulnbits tokens/s | qdq / matmulnbits (median, min-max) | same ids |",
              "|---|---:|---:|---:|---|"]  # fmt: skip
    for row in rows:
        lo, hi = row["ratio_min_max"]
        lines.append(
            f"| {row['runner']} | {row['qdq_tokens_per_s']:.1f} | {row['matmulnbits_tokens_per_s']:.1f} | "
            f"{row['ratio_qdq_over_matmulnbits_median']:.3f} ({lo:.3f}-{hi:.3f}) | {row['same_ids']} |"
        )
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
