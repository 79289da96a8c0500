"""Where a decode step's time goes: ONNX Runtime's profiler, summed per operator type, for ONNX decoders.

For each graph: one prefill of ``--prompt`` tokens, then ``--steps`` greedy decode steps through
ONNX Runtime (CPU, ``--threads`` intra-op threads), feeding each step's ``present.*`` back as
``past_key_values.*``. Prints the median wall time of a decode step (profiling on, so a little
above an unprofiled run) and, per operator type, the kernel time per step (milliseconds, summed
over the step's nodes of that type) and the node count per step. Works on prodip's decoders and
on onnxruntime-genai's model builder's (``position_ids`` is fed when the graph has it).

    python bench/onnx_op_profile.py EXPORT/onnx/model_q4.onnx BUILDER_OUT/model.onnx
"""

from __future__ import annotations

import argparse
import collections
import json
import os
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


def profile(path: str, *, threads: int, prompt: int, steps: int) -> dict:
    """Per-op-type kernel milliseconds per decode step, node counts per step, median step seconds."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.enable_profiling = True
    opts.profile_file_prefix = os.path.join(tempfile.mkdtemp(prefix="onnx_op_profile_"), "p")
    opts.log_severity_level = 3
    s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs()]
    outs = [o.name for o in s.get_outputs()]
    kv = {i.name: i.shape for i in s.get_inputs() if i.name.startswith("past_key_values")}
    ids = np.arange(3, 3 + prompt, dtype=np.int64)[None]
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    if "position_ids" in names:
        feed["position_ids"] = np.arange(prompt, dtype=np.int64)[None]
    for name, shape in kv.items():  # (batch, kv_heads, past, head_dim); symbolic dims from the configs
        feed[name] = np.zeros((1, _dim(shape[1], path, "kv_heads"), 0, _dim(shape[3], path, "head_dim")), np.float32)
    result, past, times = s.run(None, feed), prompt, []
    for _ in range(steps):
        present = dict(zip(outs, result))
        nxt = int(present["logits"][0, -1].argmax())
        feed = {"input_ids": np.array([[nxt]], np.int64), "attention_mask": np.ones((1, past + 1), np.int64)}
        if "position_ids" in names:
            feed["position_ids"] = np.array([[past]], np.int64)
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
    kernel_us, nodes, runs = collections.Counter(), collections.Counter(), 0
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            kernel_us[e["args"]["op_name"]] += e["dur"]
            nodes[e["args"]["op_name"]] += 1
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            runs += 1
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
    p.add_argument("--steps", type=int, default=64, help="decode steps profiled (the prefill is included in the trace)")
    p.add_argument("--top", type=int, default=14, help="operator types listed per graph")
    args = p.parse_args(argv)
    for path in args.graphs:
        r = profile(path, threads=args.threads, prompt=args.prompt, steps=args.steps)
        total, n = sum(r["kernel_ms"].values()), sum(r["nodes"].values())
        print(
            f"\n{path}: decode step {r['step_s'] * 1e3:.2f} ms median (profiled); kernels {total:.2f} ms, {n:.0f} nodes"
        )
        for op, ms in list(r["kernel_ms"].items())[: args.top]:
            print(f"  {op:34s} {ms:7.3f} ms  x{r['nodes'][op]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
