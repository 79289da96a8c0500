"""Where a decode step's time goes: ONNX Runtime's profiler, summed per operator type, for ONNX decoders.

For each graph: one prefill of ``--prompt`` tokens (``--batch`` identical rows), then ``--steps``
greedy decode steps through ONNX Runtime (CPU, ``--threads`` intra-op threads), feeding each step's
``present.*`` back as ``past_key_values.*``. Prints the median wall time of a decode step (profiling on, so a little
above an unprofiled run) and, per operator type, the kernel time per step (milliseconds, summed
over the step's nodes of that type) and the node count per step. Works on prodip's decoders and
on onnxruntime-genai's model builder's (``position_ids`` is fed when the graph has it).

    python bench/onnx_op_profile.py EXPORT/onnx/model_q4.onnx BUILDER_OUT/model.onnx
    python bench/onnx_op_profile.py EXPORT/onnx/model_quantized.onnx --threads 2 --prompt 48 --batch 8
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort


def _dim(value: int | str, path: str, which: str) -> int:
    """A cache dimension: the graph's own, else genai_config.json / config.json beside the file or above it."""
    if isinstance(value, int):
        return value
    for folder in (os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        for name in ("genai_config.json", "config.json"):
            f = os.path.join(folder, name)
            if os.path.isfile(f):
                with open(f, encoding="utf-8") as fh:
                    c = json.load(fh)
                c = c.get("model", {}).get("decoder", c)
                if which == "kv_heads":
                    return int(c.get("num_key_value_heads", c.get("num_attention_heads")))
                return int(c.get("head_size") or c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    raise ValueError(f"{path}: cache dimension {value!r} is symbolic and no genai_config.json/config.json beside it")


def profile(path: str, *, threads: int, prompt: int, steps: int, batch: int = 1) -> dict:
    """Per-op-type kernel milliseconds per decode step of ``batch`` rows, node counts per step, median step seconds."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    prof_dir = tempfile.mkdtemp(prefix="onnx_op_profile_")
    atexit.register(shutil.rmtree, prof_dir, True)
    opts.profile_file_prefix = os.path.join(prof_dir, "p")
    opts.log_severity_level = 3
    s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    outs = [o.name for o in s.get_outputs()]
    kv = {i.name: i.shape for i in s.get_inputs() if i.name.startswith("past_key_values")}
    ids = np.tile(np.arange(3, 3 + prompt, dtype=np.int64), (batch, 1))
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if "position_ids" in names:
        feed["position_ids"] = np.tile(np.arange(prompt, dtype=np.int64), (batch, 1))
    for name, shape in kv.items():  # (batch, kv_heads, past, head_dim); symbolic dims from the configs
        dims = (batch, _dim(shape[1], path, "kv_heads"), 0, _dim(shape[3], path, "head_dim"))
        feed[name] = np.zeros(dims, np.float32)
    result, past, times = s.run(None, feed), prompt, []
    for _ in range(steps):
        present = dict(zip(outs, result))
        nxt = present["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
        feed = {"input_ids": nxt, "attention_mask": np.ones((batch, past + 1), np.int64)}
        if "position_ids" in names:
            feed["position_ids"] = np.full((batch, 1), past, np.int64)
        for name in kv:
            feed[name] = present[name.replace("past_key_values", "present")]
        t0 = time.perf_counter()
        result = s.run(None, feed)
        times.append(time.perf_counter() - t0)
        past += 1
    trace = s.end_profiling()
    with open(trace, encoding="utf-8") as fh:
        events = json.load(fh)
    os.remove(trace)
    model_runs = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e["name"] == "model_run"
    )
    prefill_end, runs = model_runs[0][1], len(model_runs) - 1  # decode steps only: the prefill run is left out
    kernel_us, nodes = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > prefill_end:
            kernel_us[e["args"]["op_name"]] += e["dur"]
            nodes[e["args"]["op_name"]] += 1
    return {
        "step_s": statistics.median(times),
        "kernel_ms": {op: us / runs / 1e3 for op, us in kernel_us.most_common()},
        "nodes": {op: n / runs for op, n in nodes.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("graphs", nargs="+", help="ONNX decoder files")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens (prefill)")
    p.add_argument("--steps", type=int, default=64, help="decode steps profiled (the prefill is not counted)")
    p.add_argument("--top", type=int, default=14, help="operator types listed per graph")
    p.add_argument("--batch", type=int, default=1, help="rows per step (the same prompt in each)")
    args = p.parse_args(argv)
    for path in args.graphs:
        r = profile(path, threads=args.threads, prompt=args.prompt, steps=args.steps, batch=args.batch)
        total, n = sum(r["kernel_ms"].values()), sum(r["nodes"].values())
        print(
            f"\n{path}: decode step {r['step_s'] * 1e3:.2f} ms median (profiled); kernels {total:.2f} ms, {n:.0f} nodes"
        )
        for op, ms in list(r["kernel_ms"].items())[: args.top]:
            print(f"  {op:34s} {ms:7.3f} ms  x{r['nodes'][op]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
