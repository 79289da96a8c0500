"""Which int8 (q8) is closer to the training model at width 1024: ONNX Runtime native or onnxruntime-web (WASM)?

For an export and its checkpoint (``EXPORT/../run``, as :func:`tests.fixtures.build_tiny_export` lays
them out), held-out text (``data/heldout/udhr_eng.txt``: never trained on) is cut into ``--windows``
windows of ``--tokens`` tokens; the training model (prodip's ``LlamaForCausalLM``, fp32, the checkpoint)
gives the reference logits of every position. Each candidate runs the same windows one token per call
with its KV cache (teacher forcing: the decode path, where the page differs), and is judged against the
reference: top-1 agreement, mean and max KL(reference || candidate) in nats, max |logit difference|.

Candidates: ONNX Runtime native (CPU EP) on fp32 and q8, with its default graph optimisations and with
none (``ORT_DISABLE_ALL``: the graph as written, no fused kernels); onnxruntime-web's plain WASM build in
Node (``conformance/ort_web_logits.mjs``: the kernels the export's page runs) on fp32 and q8.

    python bench/q8_width.py EXPORT --out bench/results/q8_width_2026-12-02.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def windows(export: Path, text: Path, n: int, tokens: int) -> list[list[int]]:
    """``n`` windows of ``tokens`` ids of ``text`` (BOS first, as the tokenizer adds it), consecutive."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(export / "tokenizer.json")).encode(text.read_text(encoding="utf-8")).ids
    bos, body = ids[0], ids[1:]
    step = tokens - 1
    if len(body) < n * step:
        raise SystemExit(f"error: {text}: {len(body)} tokens, need {n * step}")
    return [[bos, *body[i * step : (i + 1) * step]] for i in range(n)]


from prodip.conformance.browser import judge, ort_logits, training_logits, web_logits  # noqa: E402


def candidates(export: Path, wins: list[list[int]]) -> dict[str, np.ndarray]:
    """Every candidate's logits on ``wins`` (see the module docstring)."""
    cfg = json.loads((export / "config.json").read_text(encoding="utf-8"))
    fp32, q8 = export / "onnx" / "model.onnx", export / "onnx" / "model_quantized.onnx"
    return {
        "ORT native fp32": ort_logits(fp32, cfg, wins, True),
        "ORT native q8": ort_logits(q8, cfg, wins, True),
        "ORT native q8, no graph optimisation": ort_logits(q8, cfg, wins, False),
        "onnxruntime-web (WASM) fp32": web_logits(fp32, cfg, wins),
        "onnxruntime-web (WASM) q8": web_logits(q8, cfg, wins),
    }


def code_flips(export: Path, window: list[int]) -> list[dict[str, Any]]:
    """Where the two q8 runtimes part: the q8 file's prefill of ``window`` in ONNX Runtime native and in
    onnxruntime-web, with every activation quantisation point's fp32 input, scale and int8 codes made graph
    outputs; per point (in graph order): max |native - web| of the fp32 input, codes that differ, and how
    far the farthest-from-tie differing value was from a rounding tie (``|x / scale - (k + 0.5)|``)."""
    import onnx
    import onnxruntime as ort

    from prodip.conformance.browser import web_run

    cfg = json.loads((export / "config.json").read_text(encoding="utf-8"))
    model = onnx.load(str(export / "onnx" / "model_quantized.onnx"))
    divs = [
        n
        for n in model.graph.node
        if n.op_type == "Div" and n.name.startswith("int8_rowwise/") and n.name.endswith("/Div")
    ]
    names = []
    for n in divs:
        codes = n.name.rsplit("/", 1)[0] + "/codes"
        names.append((n.input[0], n.input[1], codes))
        for name, elem in (
            (n.input[0], onnx.TensorProto.FLOAT),
            (n.input[1], onnx.TensorProto.FLOAT),
            (codes, onnx.TensorProto.UINT8),
        ):
            model.graph.output.append(onnx.helper.make_tensor_value_info(name, elem, None))
    ids = np.asarray([window], np.int64)
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.arange(ids.shape[1], dtype=np.int64)[None],
    }
    empty = np.zeros((1, cfg["num_key_value_heads"], 0, cfg["head_dim"]), np.float32)
    feeds.update(
        {f"past_key_values.{i}.{kv}": empty for i in range(cfg["num_hidden_layers"]) for kv in ("key", "value")}
    )
    outs = [x for triple in names for x in triple]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "traced.onnx"
        onnx.save_model(model, str(path))  # weights inline: one file for both runtimes
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        native = dict(
            zip(outs, ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(outs, feeds))
        )
        web = web_run(path, feeds, outs)
    rows = []
    for x, scale, codes in names:
        differ = native[codes] != web[codes]
        tie = np.abs((native[x] / native[scale]) % 1 - 0.5)
        rows.append({
            "point": codes.split("/")[1], "fp32_input_max_abs_diff": float(np.abs(native[x] - web[x]).max()),
            "codes_differing": int(differ.sum()), "codes": int(differ.size),
            "farthest_from_tie": float(tie[differ].max()) if differ.any() else None,
        })  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("export", type=Path)
    ap.add_argument("--run", type=Path, default=None, help="checkpoint (default: EXPORT/../run)")
    ap.add_argument("--text", type=Path, default=REPO / "data" / "heldout" / "udhr_eng.txt")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="write OUT (markdown) and OUT.json")
    args = ap.parse_args()
    wins = windows(args.export, args.text, args.windows, args.tokens)
    ref = training_logits(args.run or args.export.parent / "run", wins)
    got = candidates(args.export, wins)
    rows = {name: judge(ref, logits) for name, logits in got.items()}
    web, native = got["onnxruntime-web (WASM) q8"], got["ORT native q8"]
    rows["web q8 vs native q8 (each other)"] = judge(native, web)
    rows["web q8 vs native q8 unoptimised"] = judge(got["ORT native q8, no graph optimisation"], web)
    cfg = json.loads((args.export / "config.json").read_text(encoding="utf-8"))
    shape = {k: cfg[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")}
    lines = [
        f"Against the training model (fp32 checkpoint), {args.windows} x {args.tokens} held-out tokens of "
        f"`{args.text.relative_to(REPO) if args.text.is_relative_to(REPO) else args.text}`, model {shape}:",
        "",
        "| candidate | top-1 agreement | KL mean (nats) | KL max | max abs logit diff |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in rows.items():
        lines.append(
            f"| {name} | {m['top1']:.2%} | {m['kl_mean']:.2e} | {m['kl_max']:.2e} | {m['max_abs_logit']:.3f} |"
        )
    flips = code_flips(args.export, wins[0])
    lines += [
        "",
        f"Where native and web q8 part (prefill of the first window, {args.tokens} tokens): per activation "
        "quantisation point in graph order, the fp32 input's max |native - web|, int8 codes that differ, and the "
        "largest distance from a rounding tie among them (0 = exactly on a tie, 0.5 = mid-step).",
        "",
        "| point | fp32 input max diff | codes differing | farthest from a tie |",
        "|---:|---:|---:|---:|",
    ]
    for r in flips:
        tie = "" if r["farthest_from_tie"] is None else f"{r['farthest_from_tie']:.1e}"
        lines.append(
            f"| {r['point']} | {r['fp32_input_max_abs_diff']:.2e} | {r['codes_differing']} of {r['codes']} | {tie} |"
        )
    rows["code_flips"] = flips  # type: ignore[assignment]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps({"shape": shape, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
