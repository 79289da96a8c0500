"""onnxruntime-web's WASM backend (the build transformers.js runs in a browser), under Node from the npm
package: greedy ids and each step's logits of every ONNX variant (``ortweb_greedy.mjs``).

A file the WASM build cannot load fails with ONNX Runtime's error, which names the operator. Its logits are
held to the variant's tolerance against ONNX Runtime's on the same file; for a file whose ``MatMulNBits``
nodes quantise activations (``accuracy_level`` 4), against ONNX Runtime computing in float32 as the WASM
kernel does (:func:`fp32_compute_copy`). A variant with a WASM file (the int4's ``wasm_path``, which the
export's page loads on the WASM device) is run as that file, with its session options (:func:`wasm_file`),
and compared with ONNX Runtime on that file. Install: it comes with transformers.js (``node/``).

    python -c "from prodip.conformance.runtimes.ortweb import fp32_compute_copy; help(fp32_compute_copy)"
"""

from __future__ import annotations

import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Optional

from prodip.base.jsontypes import JSONObject, obj, text
from prodip.conformance.runtimes.common import (
    GreedyJob,
    GreedyOutput,
    RuntimeAdapter,
    node_root,
    ort_greedy,
    run_node,
)

NAME = "onnxruntime-web"
#: The Node script that runs onnxruntime-web's WASM backend (in the conformance package).
NODE_SCRIPT = "ortweb_greedy.mjs"
#: What the ids and logits are compared with for a file with activation-quantising MatMulNBits.
FP32_COMPUTE = "ONNX Runtime, MatMulNBits accuracy_level 0 (fp32 compute, as the WASM kernel)"


def ortweb_greedy(
    export_dir: Path,
    files: Sequence[str],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    model_cfg: Any,
    stop: Optional[Collection[int]] = None,
    options: Optional[dict[str, dict[str, Any]]] = None,
) -> dict[str, Any]:
    """Greedy ids and per-step logits from onnxruntime-web's WASM backend in Node, for each ONNX file.

    Args:
        export_dir: the export dir; files: ONNX paths relative to it (weights in ``<file>_data``).
        prompts: token ids; max_new_tokens: new tokens per prompt; model_cfg: layers, kv heads,
            head dim and eos id of the model (the KV-cache inputs' shapes); stop: the ids that end
            generation (default: the model's eos id); options: file -> ``session`` (session config entries,
            without the ``session.`` prefix) and ``external_data`` ([name in the graph, path relative to
            ``export_dir``]) for files that need them (:func:`wasm_file`).
    Returns:
        ``{"versions": {...}, "results": {file: {"ids": [[prompt + new ids]], "logits": [[[float] per step]]}
        or {"error": str}}}``.
    Raises:
        FileNotFoundError: ``node`` is not on PATH.
        RuntimeError: the Node script failed (its stderr tail is in the message).
    """
    job = {
        "export_dir": str(Path(export_dir).resolve()),
        "files": list(files),
        "prompts": [list(map(int, p)) for p in prompts],
        "max_new_tokens": max_new_tokens,
        "stop_ids": [int(i) for i in (stop if stop is not None else [model_cfg.eos_token_id]) if i is not None],
        "num_layers": model_cfg.num_hidden_layers,
        "num_kv_heads": model_cfg.num_key_value_heads,
        "head_dim": model_cfg.head_dim,
        "node_root": str(node_root()),
        "options": options or {},
    }
    return run_node(NODE_SCRIPT, job)


def wasm_file(export_dir: Path, path: str) -> Optional[tuple[str, JSONObject]]:
    """The file the export's page loads on the WASM device instead of the variant file ``path``, with its options.

    The int4 variant's manifest entry names it (``wasm_path``: int4 weights requantised to 8-bit at load,
    :func:`prodip.export.quantize.to_int4_wasm`); it reads the variant file's weights file and needs the
    session entries in ``wasm.session_config``. Returns ``(path, ortweb_greedy options)`` or None.
    """
    from prodip.base.manifest import load_manifest  # noqa: PLC0415

    entry = next((v for v in load_manifest(export_dir).variants.values() if v.path == path), None)
    rel, params = (entry.wasm_path, entry.wasm) if entry is not None else (None, None)
    if not rel or params is None:
        return None
    where = f"{export_dir}/manifest.json variant {path} wasm"
    session = obj(params.get("session_config") or {}, where=where)
    options: JSONObject = {"session": {k.removeprefix("session."): v for k, v in session.items()}}
    shared = params.get("shares_weights_with")
    if shared:
        shared = text(shared, where=where)
        options["external_data"] = [[shared, str(Path(path).with_name(shared))]]
    return rel, options


class _TempModel:
    """Context manager: a temporary ONNX file (weights inline), removed on exit."""

    def __init__(self, model: Any) -> None:
        import onnx  # noqa: PLC0415

        self._dir = tempfile.TemporaryDirectory(prefix="prodip_fp32_compute_")
        self.path = Path(self._dir.name) / "model.onnx"
        onnx.save_model(model, str(self.path))

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: Any) -> None:
        self._dir.cleanup()


def fp32_compute_copy(path: Path) -> Optional[_TempModel]:
    """A copy of the ONNX file ``path`` that computes its 4-bit MatMuls in float32, or None if none differs.

    ONNX Runtime's CPU build honours ``accuracy_level`` 4 (activations quantised to int8 inside
    MatMulNBits, prodip's int4 default); onnxruntime-web's WASM kernel computes in float32 whatever the
    attribute says. Measured on a tiny export's q4 file: WASM vs CPU at level 4, max |logit diff| 6e-2;
    vs CPU at level 0, 2e-6. So the WASM runtime is compared with ONNX Runtime doing its arithmetic on
    the same weights; the other runtimes with the file as it is. In the copy, ``MatMulNBits`` nodes get
    ``accuracy_level`` 0, and int4 ``DequantizeLinear`` nodes of constant weights (the qdq int4 layout,
    which ONNX Runtime's QDQ fusion would make MatMulNBits at level 4) are replaced by their float32
    weights, ``(code - zero_point) * scale`` per block (the ONNX operator's formula): what
    onnxruntime-web computes either way (its own fusion runs the fp32 MatMulNBits kernel, and with
    ``session.disable_quant_qdq=1`` constant folding dequantises the same way).
    """
    import numpy as np  # noqa: PLC0415
    import onnx  # noqa: PLC0415
    from onnx import numpy_helper  # noqa: PLC0415

    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    four_bit = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)
    changed = False
    for node in list(model.graph.node):
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level" and attr.i != 0:
                    attr.i, changed = 0, True
        elif (
            node.op_type == "DequantizeLinear" and node.input[0] in inits and inits[node.input[0]].data_type in four_bit
        ):
            attrs = {a.name: a.i for a in node.attribute}
            axis, block = attrs.get("axis", 1), attrs.get("block_size", 0)
            codes = numpy_helper.to_array(inits[node.input[0]]).astype(np.float32)
            scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
            zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
            zero = numpy_helper.to_array(inits[zp]).astype(np.float32) if zp else np.zeros_like(scale)
            if block:  # blocked: scales repeat block times along axis (the last block may be partial)
                n = codes.shape[axis]
                scale = np.repeat(scale, block, axis=axis).take(range(n), axis=axis)
                zero = np.repeat(zero, block, axis=axis).take(range(n), axis=axis)
            weight = ((codes - zero) * scale).astype(np.float32)
            model.graph.initializer.append(numpy_helper.from_array(weight, node.output[0]))
            model.graph.node.remove(node)
            changed = True
    if changed:  # initializers only the removed DequantizeLinear nodes read
        used = {i for n in model.graph.node for i in n.input}
        for init in [t for t in model.graph.initializer if t.name not in used]:
            model.graph.initializer.remove(init)
    return _TempModel(model) if changed else None


def set_fp32_compute_reference(res: GreedyOutput, file: str, cand: Any, job: GreedyJob) -> None:
    """Give ``res`` ONNX Runtime's greedy ids and logits on the fp32-compute copy of ``file`` (the export's file
    the browser or WASM runtime ran for candidate ``cand``: the WASM kernels' arithmetic on the same weights), where
    :func:`fp32_compute_copy` makes one; else ``res`` keeps the default reference (ONNX Runtime on the variant)."""
    fp32_compute = fp32_compute_copy(Path(job.export_dir) / file)
    if fp32_compute is None:
        return
    with fp32_compute as path:
        res.reference_ids, res.reference_logits = ort_greedy(path, cand.name, job)
    res.reference = FP32_COMPUTE if file == cand.path else f"{FP32_COMPUTE}, on {file}"


class OrtWebAdapter(RuntimeAdapter):
    name = NAME

    def greedy(self, job: GreedyJob) -> dict[str, GreedyOutput]:
        # a variant with a WASM file (the int4's) runs as the export's page runs it on the WASM device: that file
        wasm = {c.name: wasm_file(Path(job.export_dir), c.path) for c in job.candidates}
        files = {name: w[0] if w else cand.path for (name, w), cand in zip(wasm.items(), job.candidates)}
        options = {files[name]: w[1] for name, w in wasm.items() if w}
        web = ortweb_greedy(
            job.export_dir, list(files.values()), job.prompts, job.max_new_tokens, job.model_cfg, job.eos, options
        )
        out = {}
        for cand in job.candidates:
            file = files[cand.name]
            got = web["results"].get(file, {"error": "no result"})
            res = GreedyOutput(ids=got.get("ids"), logits=got.get("logits"), versions=web.get("versions"))
            if "error" in got:
                res.error = f"onnxruntime-web (WASM) {file}: {got['error']}"
            set_fp32_compute_reference(res, file, cand, job)
            out[cand.name] = res
        return out
