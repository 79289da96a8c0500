"""The browser's runtimes held against the training model and ONNX Runtime native.

The export's page runs onnxruntime-web's plain WASM build (``ort.wasm.min.mjs``); :func:`web_logits` and
:func:`web_run` run the same build in Node (``ort_web_logits.mjs``, ``ort_web_run.mjs`` beside this module), 1
thread; :func:`training_logits` (the fp32 checkpoint) and :func:`ort_logits` (ONNX Runtime native) give
what to hold them against, on the same token windows, and :func:`judge` scores a candidate's logits
against a reference's (top-1 agreement, KL, max |logit difference|).

The export's own page in headless Chromium (WebGPU through SwiftShader where there is no GPU, and WASM) is a
conformance runtime row: ``prodip.conformance.runtimes.webgpu``.

    python -c "from prodip.conformance.browser import node_scripts; print(node_scripts())"
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import torch

from prodip.base import onnx_io
from prodip.conformance.compare import kl_per_position
from prodip.conformance.runtimes import node_root
from prodip.train.checkpoint import load_model

#: The Node scripts (beside this file).
LOGITS_SCRIPT = Path(__file__).with_name("ort_web_logits.mjs")
RUN_SCRIPT = Path(__file__).with_name("ort_web_run.mjs")
#: Timeout of one Node run (s).
NODE_TIMEOUT_S = 1800
_NUMPY = {"float32": np.float32, "int64": np.int64, "int32": np.int32, "uint8": np.uint8, "int8": np.int8}


def node_scripts() -> list[Path]:
    """The Node scripts this module runs."""
    return [LOGITS_SCRIPT, RUN_SCRIPT]


def _node(script: Path, job: dict[str, Any]) -> dict[str, Any]:
    node, root = shutil.which("node"), node_root()
    if node is None or not (root / "node_modules" / "onnxruntime-web" / "dist").is_dir():
        raise FileNotFoundError(
            f"onnxruntime-web needs node on PATH and {root}/node_modules/onnxruntime-web "
            f"(`npm install --ignore-scripts` in {root})"
        )
    job = {**job, "node_root": str(root)}
    proc = subprocess.run(
        [node, str(script)], input=json.dumps(job), capture_output=True, text=True, timeout=NODE_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise RuntimeError(f"node {script.name} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def web_logits(model: str | Path, config: dict[str, Any], windows: Sequence[Sequence[int]]) -> np.ndarray:
    """onnxruntime-web (plain WASM build, 1 thread) next-token logits at every position of each window,
    one token per call with the KV cache (the decode path), from an empty cache at each window's start.

    Args:
        model: an ONNX decoder of prodip's KV-cache contract (weights inline or in ``<file>_data``).
        config: the export's ``config.json`` (``num_hidden_layers``, ``num_key_value_heads``, ``head_dim``).
        windows: token ids, equal lengths.
    Returns:
        (windows, tokens, vocab) float32.
    Raises:
        FileNotFoundError: no ``node`` or no onnxruntime-web; RuntimeError: the Node script failed.
    """
    with tempfile.TemporaryDirectory(prefix="prodip_web_logits_") as tmp:
        out = Path(tmp) / "logits.f32"
        job = {
            "model": str(Path(model).resolve()),
            "windows": [[int(i) for i in w] for w in windows],
            "layers": config["num_hidden_layers"],
            "kv_heads": config["num_key_value_heads"],
            "head_dim": config["head_dim"],
            "threads": 1,
            "out": str(out),
        }
        vocab = _node(LOGITS_SCRIPT, job)["vocab"]
        return np.fromfile(out, dtype="<f4").reshape(len(windows), -1, vocab)


def training_logits(run: str | Path, wins: Sequence[Sequence[int]]) -> np.ndarray:
    """The training model's logits (prodip's ``LlamaForCausalLM``, the fp32 checkpoint of ``run``) at every
    position of each window, one forward per window: (windows, tokens, vocab) float32."""

    model, _, _ = load_model(run)
    rows = []
    with torch.inference_mode():
        for w in wins:
            out = model(torch.tensor([w]))
            out = out[0] if isinstance(out, tuple) else out  # (logits, cache) when it returns a cache
            rows.append(out[0].float().numpy())
    return np.stack(rows)


def ort_logits(
    path: str | Path, cfg: dict[str, Any], wins: Sequence[Sequence[int]], optimise: bool = True
) -> np.ndarray:
    """ONNX Runtime native (CPU EP, 1 thread) next-token logits at every position of each window, one token
    per call with the KV cache, as :func:`web_logits`; ``optimise=False``: no graph optimisation (the graph
    as written, no fused kernels). Returns (windows, tokens, vocab) float32."""

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    if not optimise:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    layers, kv, hd = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
    names = [o.name for o in sess.get_outputs()]
    out = []
    for w in wins:
        state = [np.zeros((1, kv, 0, hd), np.float32)] * (2 * layers)
        rows = []
        for t, tok in enumerate(w):
            feed = {
                "input_ids": np.array([[tok]], np.int64),
                "attention_mask": np.ones((1, t + 1), np.int64),
                "position_ids": np.array([[t]], np.int64),
            }
            feed.update(zip(onnx_io.past_names(layers), state))
            res = dict(zip(names, sess.run(None, feed)))
            rows.append(res["logits"][0, -1])
            state = [res[n] for n in onnx_io.present_names(layers)]
        out.append(np.stack(rows))
    return np.stack(out)


def judge(ref: np.ndarray, cand: np.ndarray) -> dict[str, float]:
    """``cand`` judged against ``ref`` (same shape, (..., vocab) logits) over every position: top-1 agreement
    (share), KL(ref || cand) mean and max (nats, :func:`prodip.conformance.compare.kl_per_position`), max |logit difference|."""

    r, c = ref.reshape(-1, ref.shape[-1]), cand.reshape(-1, cand.shape[-1])
    kl = kl_per_position(r, c)
    return {
        "top1": float((r.argmax(-1) == c.argmax(-1)).mean()),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "max_abs_logit": float(np.abs(r - c).max()),
    }


def web_run(model: str | Path, feeds: dict[str, np.ndarray], outputs: Sequence[str]) -> dict[str, np.ndarray]:
    """One run of any ONNX graph (weights inline) on onnxruntime-web's plain WASM build, 1 thread.

    Args:
        model: the ``.onnx`` file; feeds: input name -> array (float32, int64, int32, uint8 or int8);
        outputs: names of the outputs to return.
    Returns:
        output name -> array, with the graph's dtype and shape.
    """
    with tempfile.TemporaryDirectory(prefix="prodip_web_run_") as tmp:
        inputs = {}
        for i, (name, value) in enumerate(feeds.items()):
            path = Path(tmp) / f"in{i}"
            np.ascontiguousarray(value).tofile(path)
            inputs[name] = {"dtype": str(value.dtype), "dims": list(value.shape), "path": str(path)}
        files = {name: str(Path(tmp) / f"out{i}") for i, name in enumerate(outputs)}
        meta = _node(RUN_SCRIPT, {"model": str(Path(model).resolve()), "inputs": inputs, "outputs": files})
        return {
            name: np.fromfile(files[name], dtype=_NUMPY[meta[name]["dtype"]]).reshape(meta[name]["dims"])
            for name in outputs
        }
