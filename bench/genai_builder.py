"""prodip's ONNX variants vs onnxruntime-genai's model builder on the same weights: decode speed, size, top-1.

Builds a random ~108 M-parameter model through the real export path (hidden 768, 12 layers, GQA
12/4, vocab 32,000, context 1,024: the model of issue 13), runs ``python -m
onnxruntime_genai.models.builder -i EXPORT_DIR -o OUT -p {int4,fp32} -e cpu`` on the export's
safetensors, then for each (variant, graph) measures, all through onnxruntime-genai (the same runtime):

* decode tokens/s: greedy, after a ``--prompt-tokens`` prompt (16), ``--tokens`` new tokens (the first excluded),
  ``--threads`` intra-op threads; runs of all graphs are interleaved and repeated (median and all
  runs reported), so machine load hits them alike;
* size on disk (ONNX file + external data);
* top-1 agreement with the training model on ``--positions`` teacher-forced positions of a fixed random
  token sequence (ONNX Runtime, one prefill).

prodip's variants run as the export's manifest says (``genai_overlay``): each through its graph for
onnxruntime-genai's shared KV buffer, ``onnx/<file>_genai.onnx``, which reads the variant's weights
file (size: graph + weights; top-1: the variant's own graph under ONNX Runtime, the same weights). Optionally also the graph prodip wrote before issue 13 (``--with-standard``: ``onnx_graph=standard``,
int4 ``accuracy_level`` unset) and prodip's int4 with symmetric blocks (``--with-symmetric``). Writes ``OUT_PREFIX.json`` and ``OUT_PREFIX.md``.

    python bench/genai_builder.py --out bench/results/genai_builder_cpu_2026-11-30
"""

from __future__ import annotations

import argparse
import atexit
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fixtures: the real export path

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import onnxruntime_genai as og  # noqa: E402
import torch  # noqa: E402

from prodip.base.manifest import load_manifest  # noqa: E402
from prodip.export import quantize  # noqa: E402
from prodip.export.genai import variant_overlay  # noqa: E402
from prodip.train.checkpoint import load_model  # noqa: E402
from tests.fixtures import build_tiny_export  # noqa: E402

MODEL = dict(
    vocab_size=32000,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=1024,
)


def builder(export_dir: Path, out: Path, precision: str) -> Path:
    """``onnxruntime_genai.models.builder`` on the export's safetensors (its genai_config.json included)."""
    cmd = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(export_dir),
        "-o",
        str(out),
        "-p",
        precision,
        "-e",
        "cpu",
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def load_genai(folder: Path, onnx_file: str | None, threads: int):
    """onnxruntime-genai on ``folder``'s genai_config.json; ``onnx_file``: a variant of a prodip export,
    loaded with the manifest's ``genai_overlay`` (int4: its shared-buffer graph), or a bench file
    outside the manifest (no shared buffer)."""
    config = og.Config(str(folder))
    overlay: dict = variant_overlay(folder, onnx_file) if onnx_file else {"model": {"decoder": {}}}
    overlay["model"]["decoder"]["session_options"] = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps(overlay))
    return og.Model(config)


def decode_rate(model, prompt: list[int], tokens: int) -> float:
    """tokens/s of greedy decoding after the prompt (the first new token, the prefill's, excluded)."""
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + tokens, min_length=len(prompt) + tokens)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    gen.generate_next_token()
    t0, n = time.perf_counter(), 0
    while not gen.is_done():
        gen.generate_next_token()
        n += 1
    return n / (time.perf_counter() - t0)


def top1(onnx_path: Path, ids: np.ndarray, want: np.ndarray, kv_heads: int, head_dim: int) -> float:
    """Fraction of positions whose argmax equals the training model's (one prefill, empty cache)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    s = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if "position_ids" in names:
        feed["position_ids"] = np.arange(ids.shape[1], dtype=np.int64)[None]
    for n in names:
        if n.startswith("past_key_values"):
            feed[n] = np.zeros((1, kv_heads, 0, head_dim), np.float32)
    logits = s.run(["logits"], feed)[0][0]
    return float((logits.argmax(-1) == want).mean())


def size_mb(onnx_path: Path) -> float:
    files = [
        onnx_path,
        *onnx_path.parent.glob(onnx_path.name + ".data"),
        *onnx_path.parent.glob(onnx_path.name + "_data"),
    ]
    return sum(f.stat().st_size for f in files if f.is_file()) / 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output prefix (.json and .md are written)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=5, help="interleaved runs per figure (median reported)")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per run")
    p.add_argument("--prompt-tokens", type=int, default=16, help="prompt length before decoding (context < 1024)")
    p.add_argument("--positions", type=int, default=256, help="positions for top-1 agreement")
    p.add_argument(
        "--with-standard", action="store_true", help="also prodip's standard-operator graph (int4 unset accuracy level)"
    )
    p.add_argument("--precisions", default="int4,fp32", help="variants compared with the builder's")
    p.add_argument(
        "--with-symmetric",
        action="store_true",
        help="also prodip's int4 with symmetric blocks (no zero points, as the builder)",
    )
    p.add_argument("--work-dir", help="keep the exports here (default: a temp dir)")
    args = p.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="genai_builder_"))
    if not args.work_dir:  # ~1.5 GB of exports: gone at exit, also on an error
        atexit.register(shutil.rmtree, work, True)
    t0 = time.perf_counter()
    precisions = args.precisions.split(",")
    export = build_tiny_export(work / "contrib", variants=["fp32", "int4"], **MODEL)
    graphs = {}  # label -> (folder for og.Config, onnx file overlay or None, onnx path)
    for v in precisions:
        rel = load_manifest(export).variants[v].path
        graphs[f"{v} prodip"] = (export, rel, export / rel)
        out = builder(export, work / f"builder_{v}", v)
        graphs[f"{v} builder"] = (out, None, out / "model.onnx")
    if args.with_symmetric:
        sym = export / "onnx" / "model_q4_symmetric.onnx"  # outside the manifest: a bench file
        quantize.to_int4(export / "onnx" / "model.onnx", sym, symmetric=True)
        graphs["int4 prodip symmetric"] = (export, "onnx/model_q4_symmetric.onnx", sym)
    if args.with_standard:
        std = build_tiny_export(
            work / "standard",
            variants=["fp32", "int4"],
            export_options={"onnx_graph": "standard", "int4_accuracy_level": 0},
            **MODEL,
        )
        for v in precisions:
            rel = load_manifest(std).variants[v].path
            graphs[f"{v} prodip standard (before)"] = (std, rel, std / rel)
    setup_s = time.perf_counter() - t0
    model = load_model(export.parent / "run")[0].float().eval()
    ids = np.random.default_rng(0).integers(3, MODEL["vocab_size"], size=(1, args.positions)).astype(np.int64)
    with torch.no_grad():
        want = model(torch.from_numpy(ids)).argmax(-1)[0].numpy()
    rng = np.random.default_rng(1)
    prompt = [1] + [int(i) for i in rng.integers(3, MODEL["vocab_size"], args.prompt_tokens - 1)]
    rows = {
        label: {"size_mb": size_mb(path), "top1": top1(path, ids, want, 4, 64), "tok_s": {}}
        for label, (_, _, path) in graphs.items()
    }
    for threads in [int(t) for t in args.threads.split(",")]:
        models = {label: load_genai(folder, rel, threads) for label, (folder, rel, _) in graphs.items()}
        runs = {label: [] for label in graphs}
        for m in models.values():
            decode_rate(m, prompt, 8)  # warm-up
        for r in range(args.repeats):  # the order alternates, so no graph always runs after the same one
            for label, m in list(models.items())[:: -1 if r % 2 else 1]:
                runs[label].append(decode_rate(m, prompt, args.tokens))
        for label in graphs:
            rows[label]["tok_s"][str(threads)] = {"median": statistics.median(runs[label]), "runs": runs[label]}
        del models
    result = {
        "model": MODEL,
        "args": vars(args),
        "setup_s": setup_s,
        "rows": rows,
        "versions": {
            "onnxruntime": ort.__version__,
            "onnxruntime-genai": og.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "machine": platform.machine(),
        "command": "python bench/genai_builder.py " + " ".join(argv or sys.argv[1:]),
    }
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    Path(args.out + ".md").write_text(render(result), encoding="utf-8")
    print(render(result))
    return 0


def render(r: dict) -> str:
    threads = list(next(iter(r["rows"].values()))["tok_s"])
    head = (
        "| variant / graph | "
        + " | ".join(f"tok/s {t} thr (median; runs)" for t in threads)
        + " | MB | top-1 vs training model |"
    )
    lines = [
        f"# prodip vs onnxruntime-genai model builder, decode on CPU ({r['machine']})",
        "",
        f"Command: `{r['command']}`",
        "",
        f"Model: random, hidden {r['model']['hidden_size']}, {r['model']['num_hidden_layers']} layers, GQA "
        f"{r['model']['num_attention_heads']}/{r['model']['num_key_value_heads']}, vocab {r['model']['vocab_size']}; "
        f"greedy decode after a {r['args'].get('prompt_tokens', 16)}-token prompt, {r['args']['tokens']} new tokens, all through onnxruntime-genai "
        f"{r['versions']['onnxruntime-genai']} (ONNX Runtime {r['versions']['onnxruntime']}); graphs interleaved, "
        f"{r['args']['repeats']} runs each. Top-1: {r['args']['positions']} teacher-forced positions.",
        "",
        head,
        "|---|" + "---|" * len(threads) + "---|---|",
    ]
    for label, row in r["rows"].items():
        cells = [
            f"{row['tok_s'][t]['median']:.1f} ({', '.join(f'{x:.0f}' for x in row['tok_s'][t]['runs'])})"
            for t in threads
        ]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {row['size_mb']:.1f} | {row['top1']:.3f} |")
    for v in ("int4", "fp32"):
        a, b = r["rows"].get(f"{v} prodip"), r["rows"].get(f"{v} builder")
        if a and b:
            ratios = ", ".join(f"{t} thr {a['tok_s'][t]['median'] / b['tok_s'][t]['median']:.2f}x" for t in threads)
            paired = ", ".join(
                f"{t} thr {statistics.median(x / y for x, y in zip(a['tok_s'][t]['runs'], b['tok_s'][t]['runs'])):.2f}x"
                for t in threads
            )
            lines.append(
                f"\n{v}: prodip / builder decode speed {ratios}; median of the per-run ratios (runs back to back) "
                f"{paired}; size {a['size_mb'] / b['size_mb']:.2f}x."
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
