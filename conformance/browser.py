"""The browser's runtimes held against the training model and ONNX Runtime native.

The export's page runs onnxruntime-web's plain WASM build (``ort.wasm.min.mjs``); :func:`web_logits` and
:func:`web_run` run the same build in Node (``ort_web_logits.mjs``, ``ort_web_run.mjs`` beside this module), 1
thread; :func:`training_logits` (the fp32 checkpoint) and :func:`ort_logits` (ONNX Runtime native) give
what to hold them against, on the same token windows, and :func:`judge` scores a candidate's logits
against a reference's (top-1 agreement, KL, max |logit difference|).

:func:`webgpu_greedy` runs the export's own page on transformers.js's WebGPU device in headless Chromium
(SwiftShader's adapter where there is no GPU) and :func:`margin_agrees` judges ids that may part at a near
tie: a runner for WebGPU as a conformance runtime.

    python -c "from prodip.conformance.browser import node_scripts; print(node_scripts())"
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

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
PAGES_SCRIPT = Path(__file__).with_name("browser_pages.mjs")
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


#: Chromium flags for WebGPU on a machine without a GPU: Dawn's SwiftShader (Vulkan on the CPU) adapter, which
#: Chromium offers when WebGPU is unsafely enabled and no hardware adapter exists. It has no shader-f16, so
#: transformers.js refuses the fp16 dtype there ("does not support fp16").
WEBGPU_FLAGS = ("--enable-unsafe-webgpu",)


def webgpu_greedy(
    export_dir: str | Path, dtypes: Sequence[str], prompt: str, max_new_tokens: int, timeout_ms: int = 600_000
) -> dict[str, dict[str, Any]]:
    """Greedy ids from the export's own page on transformers.js's WebGPU device, in headless Chromium.

    The page (``index.html?device=webgpu``: onnxruntime-web's asyncify build with its WebGPU execution
    provider) is served from 127.0.0.1 and driven by puppeteer-core (``browser_pages.mjs``) with
    :data:`WEBGPU_FLAGS`; on a CPU-only machine the adapter is SwiftShader. One page per dtype,
    ``min_new_tokens`` = ``max_new_tokens`` (the ids do not stop at end-of-sequence).

    Args:
        export_dir: the export dir (``index.html``, ``web/``, ``config.json``, ``onnx/``).
        dtypes: transformers.js dtypes (``fp32``, ``q8``, ``q4``, ``fp16``).
        prompt: the prompt text (the page tokenizes it with transformers.js: the prompt ids lead ``ids``).
        max_new_tokens: new tokens per page.
    Returns:
        dtype -> ``{"ids": [prompt + new], "adapter": {...}, "error": None}`` or ``{"error": str}``.
    Raises:
        FileNotFoundError: no ``node``, no puppeteer-core or no ``chromium``.
    """

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    root = node_root()
    if shutil.which("node") is None or not (root / "node_modules" / "puppeteer-core").is_dir():
        raise FileNotFoundError(f"the WebGPU page needs node and {root}/node_modules/puppeteer-core")
    if not Path(chromium).is_file():
        raise FileNotFoundError("the WebGPU page needs Chromium (apt-get install -y chromium)")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(export_dir)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    query = f"device=webgpu&prompt={quote(prompt)}&max_new_tokens={max_new_tokens}&min_new_tokens={max_new_tokens}"
    jobs = [
        {"url": f"{base}/index.html?dtype={d}&{query}&autorun=1", "result": "prodipResult", "timeout_ms": timeout_ms}
        for d in dtypes
    ]
    try:
        job = {"jobs": jobs, "node_root": str(root), "chromium": chromium, "args": list(WEBGPU_FLAGS)}
        proc = subprocess.run(
            [shutil.which("node") or "node", str(PAGES_SCRIPT)],
            input=json.dumps(job), capture_output=True, text=True, timeout=NODE_TIMEOUT_S,
        )  # fmt: skip
    finally:
        server.shutdown()
    if proc.returncode != 0:
        raise RuntimeError(f"node browser_pages.mjs exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    answers = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    out: dict[str, dict[str, Any]] = {}
    for dtype, got in zip(dtypes, answers):
        res = got["result"] or {}
        if got["error"]:
            out[dtype] = {"error": got["error"], "console": got["console"][-5:]}
        else:
            out[dtype] = {"ids": res["ids"], "adapter": res.get("adapter"), "device": res.get("device"), "error": None}
    return out


def margin_agrees(
    want: Sequence[int], got: Sequence[int], step_logits: Sequence[np.ndarray], prompt_len: int, margin: float
) -> tuple[bool, str]:
    """Greedy ids that may part where the reference was nearly tied: equal up to the first difference,
    and there the reference's logit of its own pick exceeds its logit of ``got``'s pick by at most ``margin``.

    Args:
        want: the reference's ids (prompt + new); got: the candidate's; step_logits: the reference's
            logits (vocab,) at each new step; prompt_len: tokens of the prompt; margin: logits.
    Returns:
        (agrees, a one-line account naming the step and the gap).
    """
    for step, (a, b) in enumerate(zip(want[prompt_len:], got[prompt_len:])):
        if a != b:
            gap = float(step_logits[step][a] - step_logits[step][b])
            return gap <= margin, f"parted at new token {step}: reference {a} vs {b}, gap {gap:.4g} (margin {margin})"
    same = len(want) == len(got)
    return same, "same ids" if same else f"lengths differ: {len(want)} vs {len(got)}"
