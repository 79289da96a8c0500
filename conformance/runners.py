"""One calling convention for every implementation under test: the decoder I/O contract.

A runner maps ``(input_ids, attention_mask, position_ids, state)`` to ``(logits, state)`` on
numpy arrays, where ``state`` is the runner's own KV cache (``None`` = empty, past = 0). The
same conformance code then drives prodip's training model, transformers' ``LlamaForCausalLM``
and ONNX Runtime sessions, with no per-variant copy of the comparison loop.

    python -c "from prodip.conformance.runners import onnx_axes_problems; print(onnx_axes_problems('export/onnx/model.onnx'))"
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np
import onnx
import onnxruntime as ort
import torch

from prodip.base import onnx_io
from prodip.base.errors import InvalidInput
from prodip.train import lmeval


class Runner:
    """Base class: ``forward`` is the contract; ``name`` labels the candidate in the report."""

    name = "runner"

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, state: Any = None
    ) -> tuple[np.ndarray, Any]:
        """Next-token logits for ``input_ids`` given the cache ``state``.

        Args:
            input_ids: (B, T) int64 token ids.
            attention_mask: (B, P+T) int64, 1 for real tokens, 0 for (left) padding.
            position_ids: (B, T) int64, ``cumsum(mask) - 1`` clipped at 0 for the new tokens.
            state: the cache returned by the previous call, or ``None`` for P = 0.
        Returns:
            (logits (B, T, V) float32, new state holding P+T positions).
        """
        raise NotImplementedError


class TorchRunner(Runner):
    """prodip's ``prodip.train.model.LlamaForCausalLM`` (the reference, or the safetensors reload)."""

    def __init__(self, model: Any, name: str) -> None:
        self.model = model.eval()
        self.name = name
        self._step = lmeval.torch_step(self.model, torch.device("cpu"))  # the step prodip eval's tasks take

    def forward(self, input_ids, attention_mask, position_ids, state=None):
        return self._step(input_ids, attention_mask, position_ids, state)


class TransformersRunner(Runner):
    """``transformers.AutoModelForCausalLM.from_pretrained(export_dir)`` in float32, SDPA attention
    (transformers' default, i.e. what a user of the export runs): ``LlamaForCausalLM``, or
    ``Qwen2ForCausalLM`` for a ``model_type = "qwen2"`` export."""

    def __init__(self, export_dir: str | Path, name: str = "transformers") -> None:
        try:
            from transformers import AutoModelForCausalLM  # noqa: PLC0415 (optional: transformers is the independent reference)
        except ImportError:
            raise ImportError(
                "transformers is not installed, so the export cannot be checked against an "
                "independent implementation: pip install 'transformers>=4.45' (or prodip[test])"
            ) from None
        self.model = AutoModelForCausalLM.from_pretrained(
            str(export_dir), dtype=torch.float32, attn_implementation="sdpa"
        ).eval()
        self.name = name
        # transformers 5 renamed the cache argument ``past_key_values`` -> ``cache``.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def forward(self, input_ids, attention_mask, position_ids, state=None):
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.from_numpy(input_ids),
                attention_mask=torch.from_numpy(attention_mask),
                position_ids=torch.from_numpy(position_ids),
                use_cache=True,
                **{self._cache_kw: state},
            )
        return out.logits.float().numpy(), getattr(out, "cache", None) or out.past_key_values


class OrtRunner(Runner):
    """An ONNX decoder under ONNX Runtime's CPU execution provider (:mod:`prodip.base.onnx_io`).

    Args:
        path: the ``.onnx`` file (its external data beside it, as the export lays it out).
        name: the candidate's label.
        num_layers, num_kv_heads, head_dim: the KV-cache inputs' shapes.
        threads: intra-op threads (0: ONNX Runtime's default).
        session_config: ONNX Runtime session config entries to load the file with (full keys, e.g.
            ``{"session.disable_quant_qdq": "1"}``: a web file's manifest ``wasm.session_config``).
        fp32_matmulnbits: compute every ``MatMulNBits`` in float32 (``accuracy_level`` 0), as
            onnxruntime-web's WASM kernel does whatever the attribute says (:func:`wasm_arithmetic_graph`).
    Raises:
        InvalidInput: the graph's inputs are not the decoder contract's.
    """

    def __init__(
        self,
        path: str | Path,
        name: str,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        threads: int = 0,
        session_config: Optional[Mapping[str, str]] = None,
        fp32_matmulnbits: bool = False,
    ) -> None:
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        # No spin-waiting: torch's threads run between ORT calls in this process, and spinning
        # pool threads would steal their cores (and vice versa).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for key, value in (session_config or {}).items():
            opts.add_session_config_entry(key, str(value))
        source: str | bytes = str(path)
        graph = wasm_arithmetic_graph(path) if fp32_matmulnbits else None
        if graph is not None:
            # the edited graph is loaded from memory; its external data (offsets into files beside the
            # original) is read from the original's folder
            source = graph
            opts.add_session_config_entry(
                "session.model_external_initializers_file_folder_path", str(Path(path).resolve().parent)
            )
        self.session = ort.InferenceSession(source, sess_options=opts, providers=["CPUExecutionProvider"])
        self.name = name
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.output_names = [o.name for o in self.session.get_outputs()]
        expected = set(onnx_io.io_names(num_layers)[0])
        got = {i.name for i in self.session.get_inputs()}
        if got != expected:
            raise InvalidInput(
                f"{path}: ONNX inputs {sorted(got ^ expected)} differ from the decoder contract "
                "(prodip.base.onnx_io; re-export with `prodip export`)"
            )

    def forward(self, input_ids, attention_mask, position_ids, state=None):
        B = input_ids.shape[0]
        if state is None:
            empty = np.zeros((B, self.num_kv_heads, 0, self.head_dim), dtype=np.float32)
            state = [empty] * (2 * self.num_layers)
        feed = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
        feed.update(zip(onnx_io.past_names(self.num_layers), state))
        outs = dict(zip(self.output_names, self.session.run(None, feed)))
        present = [outs[name] for name in onnx_io.present_names(self.num_layers)]
        return outs["logits"].astype(np.float32, copy=False), present


def wasm_arithmetic_graph(path: str | Path) -> Optional[bytes]:
    """The ONNX graph ``path`` with every ``MatMulNBits`` at ``accuracy_level`` 0 (float32 compute), serialised,
    or None when none has another level.

    ONNX Runtime's CPU build honours ``accuracy_level`` 4 (activations quantised to int8 inside
    ``MatMulNBits``); onnxruntime-web's WASM kernel computes in float32 whatever the attribute says
    (measured in :func:`prodip.conformance.runtimes.ortweb.fp32_compute_copy`). Only the attribute changes:
    the weights stay where they are (external data is not loaded), so the graph is small.
    """
    model = onnx.load(str(path), load_external_data=False)
    changed = False
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level" and attr.i != 0:
                    attr.i, changed = 0, True
    return model.SerializeToString() if changed else None


def _dims(value_info: Any) -> list:
    return [
        d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
        for d in value_info.type.tensor_type.shape.dim
    ]


def onnx_axes_problems(
    path: str | Path, *, num_kv_heads: Optional[int] = None, head_dim: Optional[int] = None
) -> list[str]:
    """Inputs/outputs of an ONNX decoder whose batch, sequence or past axis is baked to a number.

    A traced graph with a fixed sequence length runs only at that length; ONNX Runtime then
    rejects (or worse, mis-reshapes) every other length. Reads only the graph, not the weights.

    Args:
        path: the ``.onnx`` file.
        num_kv_heads, head_dim: if given, the cache tensors' fixed axes are checked too.
    Returns:
        Human-readable problems, empty when every dynamic axis is symbolic.
    """
    model = onnx.load(str(path), load_external_data=False)
    problems = []
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = _dims(vi)
        if vi.name in ("input_ids", "attention_mask", "position_ids", "logits"):
            dynamic = [0, 1]
        elif vi.name.startswith(("past_key_values.", "present.")):
            dynamic = [0, 2]
            fixed = {1: num_kv_heads, 3: head_dim}
            for axis, want in fixed.items():
                if want is not None and len(dims) > axis and dims[axis] != want:
                    problems.append(f"{vi.name} axis {axis} is {dims[axis]!r}, expected {want}")
        else:
            continue
        for axis in dynamic:
            if len(dims) <= axis or not isinstance(dims[axis], str) or not dims[axis]:
                shown = dims[axis] if len(dims) > axis else "missing"
                problems.append(f"{vi.name} axis {axis} is {shown!r}, expected a symbolic (dynamic) size")
    return problems
