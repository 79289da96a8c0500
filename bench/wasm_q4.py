"""Why the page's q4 is slow on WASM, and a 4-bit layout that is not: one weight product, native vs WASM.

One K x N weight (default 1024 x 2048, as in bench/serve.py's 109 M model), 4-bit, block 32, applied to
one row (a decode step), timed in ONNX Runtime native (CPU EP) and in onnxruntime-web's plain WASM build
(Node: the page's kernels), 1 thread, as:

* ``MatMulNBits``: the export's q4 layout (``com.microsoft.MatMulNBits``);
* ``DQ+MatMul``: int4 ``DequantizeLinear`` (opset 21, blocked) feeding ``MatMul``, default session:
  ONNX Runtime's QDQ fusion turns it back into ``MatMulNBits``;
* ``DQ+MatMul, session.disable_quant_qdq=1``: the same file with QDQ fusion off, so constant folding
  dequantises the weight once at load and decode runs a float32 ``MatMul`` (4-bit download, fp32 memory);
* ``fp32 MatMul``: the float32 weight (the baseline);
* ``q8 MatMulInteger``: the export's int8 layout (uint8 weights per column, activations per row:
  :func:`prodip.export.graph.int8.quantize_matmuls_rowwise_int8`);
* ``DQ4->Q8+MatMulInteger``: the int4 weight requantised to that int8 layout by weight-side nodes
  (:func:`prodip.export.graph.int8.requantize_int4_matmuls_int8`), with ``disable_quant_qdq=1`` so
  they fold to uint8 codes at load (4-bit download, 8-bit memory), and with the default session.

Prints microseconds per call (median of 5 runs of 50 calls). Ratios within one run only (shared machine).

    python bench/wasm_q4.py [--k 1024 --n 2048]
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import matmul_nbits_quantizer as mnb

from prodip.export.graph.int8 import quantize_matmuls_rowwise_int8, requantize_int4_matmuls_int8

REPO = Path(__file__).resolve().parents[1]
NODE = r"""
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
const job = JSON.parse(readFileSync(0, 'utf8'));
const ort = await import(pathToFileURL(path.join(job.node_root, 'node_modules/onnxruntime-web/dist/ort.wasm.min.mjs')).href);
ort.env.wasm.numThreads = 1;
const out = {};
for (const c of job.cases) {
  const s = await ort.InferenceSession.create(readFileSync(c.file), { executionProviders: ['wasm'], extra: { session: c.config } });
  const x = new ort.Tensor('float32', Float32Array.from({ length: job.k }, (_, i) => Math.sin(i)), [1, job.k]);
  for (let i = 0; i < 5; i++) await s.run({ x });
  const runs = [];
  for (let r = 0; r < 5; r++) { const t = performance.now(); for (let i = 0; i < 50; i++) await s.run({ x }); runs.push((performance.now() - t) / 50 * 1000); }
  runs.sort((a, b) => a - b);
  out[c.name] = runs[2];
}
console.log(JSON.stringify(out));
"""


def _graph(nodes, inits, k: int, n: int, opset: int = 21):
    g = helper.make_graph(
        nodes, "w", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits,
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    return m


def models(k: int, n: int, block: int, out: Path) -> dict[str, Path]:
    """The files (fp32, MatMulNBits, int4 DQ + MatMul, int8, int4 requantised to int8) of one random weight."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    fp32 = _graph([helper.make_node("MatMul", ["x", "W"], ["y"])], [numpy_helper.from_array(w, "W")], k, n)
    q = mnb.MatMulNBitsQuantizer(copy.deepcopy(fp32), bits=4, block_size=block, is_symmetric=True, accuracy_level=4)
    q.process()
    scale = np.abs(w.reshape(k // block, block, n)).max(1) / 7  # symmetric int4 per block of rows
    codes = np.clip(np.round(w / np.repeat(scale, block, 0)), -8, 7).astype(np.int8)
    dq = _graph(
        [helper.make_node("DequantizeLinear", ["Wq", "Ws"], ["W"], axis=0, block_size=block),
         helper.make_node("MatMul", ["x", "W"], ["y"])],
        [helper.make_tensor("Wq", TensorProto.INT4, [k, n], codes.flatten().tolist()),
         numpy_helper.from_array(scale.astype(np.float32), "Ws")], k, n,
    )  # fmt: skip
    q8, dq8 = copy.deepcopy(fp32), copy.deepcopy(dq)
    quantize_matmuls_rowwise_int8(q8)
    requantize_int4_matmuls_int8(dq8)
    files = {name: out / f"{name}.onnx" for name in ("fp32", "nbits", "dq", "q8", "dq8")}
    for name, model in (("fp32", fp32), ("nbits", q.model.model), ("dq", dq), ("q8", q8), ("dq8", dq8)):
        onnx.save(model, str(files[name]))
    return files


CASES = (
    ("MatMulNBits", "nbits", {}),
    ("DQ+MatMul", "dq", {}),
    ("DQ+MatMul, session.disable_quant_qdq=1", "dq", {"disable_quant_qdq": "1"}),
    ("fp32 MatMul", "fp32", {}),
    ("q8 MatMulInteger", "q8", {}),
    ("DQ4->Q8+MatMulInteger, session.disable_quant_qdq=1", "dq8", {"disable_quant_qdq": "1"}),
    ("DQ4->Q8+MatMulInteger", "dq8", {}),
)


def native(files: dict[str, Path], k: int) -> dict[str, float]:
    out = {}
    x = np.sin(np.arange(k, dtype=np.float32))[None]
    for name, key, config in CASES:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        for key2, value in config.items():
            opts.add_session_config_entry(f"session.{key2}", value)
        s = ort.InferenceSession(str(files[key]), opts, providers=["CPUExecutionProvider"])
        runs = []
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(50):
                s.run(None, {"x": x})
            runs.append((time.perf_counter() - t) / 50 * 1e6)
        out[name] = sorted(runs)[2]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=1024)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--block", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = models(args.k, args.n, args.block, Path(tmp))
        nat = native(files, args.k)
        job = {"node_root": str(REPO / "node"), "k": args.k,
               "cases": [{"name": n, "file": str(files[key]), "config": c} for n, key, c in CASES]}  # fmt: skip
        script = Path(tmp) / "bench.mjs"
        script.write_text(NODE, encoding="utf-8")
        proc = subprocess.run(["node", str(script)], input=json.dumps(job), capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(proc.stderr[-2000:])
        web = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"K={args.k} N={args.n} block {args.block}, 1 row, 1 thread: microseconds per call (median of 5 x 50)\n")
    print("| layout | ONNX Runtime native | onnxruntime-web WASM |\n|---|---:|---:|")
    for name, _, _ in CASES:
        print(f"| {name} | {nat[name]:.0f} | {web[name]:.0f} |")


if __name__ == "__main__":
    main()
