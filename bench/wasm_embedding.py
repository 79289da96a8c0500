"""Quantised embedding layouts on onnxruntime-web's WASM backend: file size and decode speed.

Builds a demo-shaped untied model (configs/demo.toml: vocab 8192, hidden 256, 4 layers, MHA 4/4,
intermediate 768) through the real export, then writes three int4 (q4) and int8 (q8) files that differ
only in the embedding lookup:

* ``gbq``: com.microsoft.GatherBlockQuantized (ONNX Runtime CPU has it; the WASM build transformers.js
  uses in a browser does not: measured with onnxruntime-web's plain WASM build, which has it);
* ``lowered``: the export's layout, Gather of the quantised rows + dequantise in standard ops;
* ``fp32_table``: Gather on the dequantised float32 table (the issue's first workaround).

Decode speed: Node, onnxruntime-web 1 thread, greedy 32 new tokens after a 16-token prompt, median of
3 runs; ratios within one run (the machine is shared and loaded).

    python bench/wasm_embedding.py --out bench/results/wasm_embedding_2026-12-01.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort
from onnx import numpy_helper

from prodip.export.quantize import to_int4, to_int8

REPO = Path(__file__).resolve().parents[1]
NODE = r"""
import { readFileSync, existsSync } from 'node:fs';
import path from 'node:path';
const job = JSON.parse(readFileSync(0, 'utf8'));
const ort = await import(path.join(job.node_root, 'node_modules/onnxruntime-web/dist', job.build));
ort.env.wasm.numThreads = 1;
const out = {};
for (const f of job.files) {
  try {
    const opts = { executionProviders: ['wasm'] };
    if (existsSync(f + '_data')) opts.externalData = [{ path: path.basename(f) + '_data', data: readFileSync(f + '_data') }];
    const s = await ort.InferenceSession.create(readFileSync(f), opts);
    const times = [];
    for (let rep = 0; rep < 3; rep++) {
      let past = {};
      for (let l = 0; l < job.layers; l++) for (const kv of ['key', 'value'])
        past[`past_key_values.${l}.${kv}`] = new ort.Tensor('float32', new Float32Array(0), [1, job.kv, 0, job.hd]);
      let ids = Array.from({ length: 16 }, (_, i) => 5 + i), total = 0, t0 = 0;
      for (let step = 0; step <= job.new; step++) {
        if (step === 1) t0 = performance.now();
        const n = ids.length; total += n;
        const r = await s.run({ input_ids: new ort.Tensor('int64', BigInt64Array.from(ids.map(BigInt)), [1, n]),
          attention_mask: new ort.Tensor('int64', new BigInt64Array(total).fill(1n), [1, total]),
          position_ids: new ort.Tensor('int64', BigInt64Array.from({ length: n }, (_, i) => BigInt(total - n + i)), [1, n]), ...past });
        const v = r.logits.dims[2], row = r.logits.data.slice((n - 1) * v);
        let best = 0; for (let j = 1; j < v; j++) if (row[j] > row[best]) best = j;
        ids = [best]; past = {};
        for (let l = 0; l < job.layers; l++) for (const kv of ['key', 'value']) past[`past_key_values.${l}.${kv}`] = r[`present.${l}.${kv}`];
      }
      times.push(job.new / ((performance.now() - t0) / 1000));
    }
    times.sort((a, b) => a - b);
    out[f] = { tokens_per_s: times[1] };
  } catch (e) { out[f] = { error: String(e.message).slice(0, 200) }; }
}
console.log(JSON.stringify(out));
"""


def fp32_table(src: Path, dst: Path) -> None:
    """``src`` with its lowered embedding replaced by Gather on the float32 table ORT computes."""
    model = onnx.load(str(src))
    gather_out = next(n.output[0] for n in model.graph.node if n.name.endswith("_dequantized_gather/ReshapeOut"))
    ids = np.arange(8192, dtype=np.int64)[None]
    # the dequantised table: run the lowered lookup on every id (exact: the same arithmetic)
    probe = onnx.utils.Extractor(model).extract_model(["input_ids"], [gather_out])  # the lookup alone
    table = ort.InferenceSession(probe.SerializeToString()).run(None, {"input_ids": ids})[0][0]
    keep = [n for n in model.graph.node if "_dequantized_gather/" not in n.name]
    del model.graph.node[:]
    model.graph.node.extend(keep)
    model.graph.initializer.append(numpy_helper.from_array(table.astype(np.float32), "embedding_table_fp32"))
    model.graph.node.insert(
        0, onnx.helper.make_node("Gather", ["embedding_table_fp32", "input_ids"], [gather_out], axis=0)
    )
    used = {i for n in model.graph.node for i in n.input}
    for t in [t for t in model.graph.initializer if t.name not in used]:
        model.graph.initializer.remove(t)
    onnx.save_model(model, str(dst))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    from tests.fixtures import build_tiny_export

    root = Path(tempfile.mkdtemp(prefix="wasm_emb_"))
    export = build_tiny_export(root, vocab_size=8192, hidden_size=256, num_hidden_layers=4, intermediate_size=768,
                               num_attention_heads=4, num_key_value_heads=4, seed=3, variants=["fp32"])  # fmt: skip
    src = export / "onnx" / "model.onnx"
    files = {}
    for name, fn in (("q4", to_int4), ("q8", to_int8)):
        for layout in ("gbq", "lowered"):
            dst = root / f"{name}_{layout}.onnx"
            fn(src, dst, lower_embedding=layout == "lowered")
            files[f"{name}_{layout}"] = dst
        files[f"{name}_fp32_table"] = root / f"{name}_fp32_table.onnx"
        fp32_table(files[f"{name}_lowered"], files[f"{name}_fp32_table"])
    job = {"node_root": str(REPO / "node"), "files": [str(p) for p in files.values()], "layers": 4, "kv": 4, "hd": 64,
           "new": args.new_tokens}  # fmt: skip
    speed = {}
    for build in ("ort.webgpu.min.mjs", "ort.wasm.min.mjs"):  # transformers.js's browser build; the plain one
        script = root / "bench.mjs"
        script.write_text(NODE, encoding="utf-8")
        t0 = time.time()
        proc = subprocess.run(
            ["node", str(script)], input=json.dumps({**job, "build": build}), capture_output=True, text=True, check=True
        )
        speed[build] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(build, f"{time.time() - t0:.0f} s")
    rows = {k: {"bytes": p.stat().st_size, **{b: speed[b][str(p)] for b in speed}} for k, p in files.items()}
    args.out.write_text(json.dumps({"model": "demo-shaped untied: vocab 8192, hidden 256, 4 layers, MHA 4/4", "new_tokens": args.new_tokens,
                                    "machine": "shared 2-core CPU, loaded by other jobs: compare ratios within this run", "rows": rows}, indent=2))  # fmt: skip
    for k, r in rows.items():
        print(k, r)


if __name__ == "__main__":
    main()
