"""ONNX decoder export with a KV cache: the training model, traced once, run by ONNX Runtime.

Two graphs of the same decoder, with the named inputs and outputs of the contract in
:mod:`prodip.base.onnx_io` (the names optimum and ONNX Runtime GenAI use):

* ``contrib`` (default, :class:`prodip.export.contrib.ContribDecoder`): ONNX Runtime's fused
  operators (GroupQueryAttention, RotaryEmbedding, SkipSimplifiedLayerNormalization, packed q/k/v),
  what its model builder emits; runs in ONNX Runtime (Python, C/C++, onnxruntime-genai,
  onnxruntime-node/-web under transformers.js) and nowhere else.
* ``standard`` (:class:`DecoderWithCache`): standard ONNX operators only, the training model traced
  as is, for an ONNX runtime without ONNX Runtime's ``com.microsoft`` operators.

:func:`export_onnx` traces one with ``torch.onnx.export(dynamo=True)`` (torch.export +
onnxscript) at opset :data:`DEFAULT_OPSET`, with dynamic batch, sequence and past axes, adds the
mask-length check (:func:`prodip.export.graph.add_mask_length_check`) and checks the file with
``onnx.checker``. Both keep the decoder's contract: an ``attention_mask`` whose length is not
``past + T`` is refused, and a cache slot the mask excludes cannot change any output (it is zeroed
before attention, so NaN there changes nothing).

    python -c "from prodip.export.onnx import io_names; print(io_names(2))"
"""

from __future__ import annotations

import copy
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn
from torch.export import Dim

from prodip.base.errors import InvalidInput
from prodip.base.onnx_io import io_names
from prodip.export.contrib import ContribDecoder, unsupported
from prodip.export.graph import add_mask_length_check, drop_unused_outputs

logger = logging.getLogger(__name__)

#: ONNX opset of every exported decoder (default opset of torch.onnx's dynamo exporter; needs
#: ONNX Runtime >= 1.14).
DEFAULT_OPSET = 18
#: protobuf's hard limit on one message; bigger models must keep weights in an external file.
PROTOBUF_LIMIT_BYTES = 2 * 1024**3
#: Symbolic dimension names (optimum's names), written into the ONNX graph's value_info.
BATCH, SEQ, PAST, TOTAL = "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"


class DecoderWithCache(nn.Module):
    """Export wrapper: flat named tensors in, flat named tensors out; the model is unchanged.

    ``forward(input_ids (B, T) int64, attention_mask (B, P+T) int64, position_ids (B, T) int64,
    past: list of 2L tensors (B, Hkv, P, Dh) float32 [k0, v0, k1, v1, ...])
    -> (logits (B, T, V) float32, present k0, v0, ... each (B, Hkv, P+T, Dh))``.

    The attention mask is always passed, so the traced graph takes the model's padding-mask
    path (``build_attention_mask``) for every shape, prefill (P = 0) included, and is never
    specialised to SDPA's ``is_causal`` branch. Cache slots the mask excludes are zeroed first:
    attention gives them weight 0, but 0 * NaN is NaN.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_hidden_layers

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: list[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        keep = attention_mask[:, None, : past[0].shape[2], None].bool()  # (B, 1, P, 1)
        past = [torch.where(keep, p, 0.0) for p in past]
        cache = [(past[2 * i], past[2 * i + 1]) for i in range(self.num_layers)]
        logits, present = self.model(
            input_ids, position_ids=position_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True
        )
        flat = [logits.float()]
        for k, v in present:
            flat += [k.float(), v.float()]
        return tuple(flat)


def example_inputs(
    config: Any, *, batch: int = 2, seq: int = 3, past: int = 4, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Tracing inputs. Sizes are >= 2 on purpose: torch.export specialises dimensions of size 0/1.

    Returns:
        input_ids (B, T) int64, attention_mask (B, P+T) int64 with the first row left-padded,
        position_ids (B, T) int64 = cumsum(mask) - 1 clipped at 0, past: 2L x (B, Hkv, P, Dh) float32.
    """
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen)
    attention_mask = torch.ones(batch, past + seq, dtype=torch.int64)
    attention_mask[0, :2] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
    shape = (batch, config.num_key_value_heads, past, config.head_dim)
    cache = [torch.randn(shape, generator=gen) for _ in range(2 * config.num_hidden_layers)]
    return input_ids, attention_mask, position_ids, cache


def _dynamic_shapes(num_layers: int) -> dict[str, Any]:
    batch, seq, past, total = Dim(BATCH), Dim(SEQ), Dim(PAST), Dim(TOTAL)
    return {
        "input_ids": {0: batch, 1: seq},
        "attention_mask": {0: batch, 1: total},
        "position_ids": {0: batch, 1: seq},
        "past": [{0: batch, 2: past} for _ in range(2 * num_layers)],
    }


#: Decoder graphs :func:`export_onnx` can trace (``ExportConfig.onnx_graph``); ``auto`` = contrib
#: where ONNX Runtime's fused operators support the model's shapes, else standard.
GRAPHS = ("auto", "contrib", "standard")


def resolve_graph(graph: str, config: Any) -> str:
    """The graph :func:`export_onnx` traces for ``graph`` and a model ``config``.

    Raises:
        InvalidInput: an unknown ``graph``, or ``contrib`` for a model its operators cannot run
            (e.g. ``head_dim`` not a multiple of 8), naming the reason.
    """
    if graph not in GRAPHS:
        raise InvalidInput(f"ONNX graph {graph!r}: choose one of {', '.join(GRAPHS)}")
    why = unsupported(config)
    if graph == "contrib" and why:
        raise InvalidInput(f"--onnx-graph contrib: {why}; use --onnx-graph standard (or auto)")
    if graph == "auto":
        return "standard" if why else "contrib"
    return graph


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    *,
    opset: int = DEFAULT_OPSET,
    external_data: bool | None = None,
    graph: str = "contrib",
) -> Path:
    """Trace ``model`` (a ``prodip.train.model.LlamaForCausalLM``) into an ONNX decoder with KV cache.

    The model is exported in float32 whatever its parameter dtype (quantised and fp16 variants
    are derived from this file by :mod:`prodip.export.quantize`).

    Args:
        model: the training model; it is copied to float32 and put in eval mode, not modified.
        path: destination ``.onnx`` file; weights go to ``<path>.data`` beside it when external.
        opset: ONNX opset (default :data:`DEFAULT_OPSET`).
        external_data: keep weights in an external file; ``None`` = only when the parameters
            exceed protobuf's 2 GB limit.
        graph: ``"contrib"`` (ONNX Runtime's fused operators), ``"standard"`` (standard ONNX
            operators only) or ``"auto"`` (:func:`resolve_graph`); see the module docstring.
    Returns:
        ``path``.
    Raises:
        RuntimeError: the exporter failed or ``onnx.checker`` rejected the graph.
    """

    graph = resolve_graph(graph, model.config)
    path = Path(path)
    model = copy.deepcopy(model).float().eval()
    L = model.config.num_hidden_layers
    n_bytes = sum(p.numel() * 4 for p in model.parameters())
    if external_data is None:
        external_data = n_bytes >= PROTOBUF_LIMIT_BYTES - 64 * 1024**2  # leave room for the graph
    inputs, outputs = io_names(L)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            ContribDecoder(model) if graph == "contrib" else DecoderWithCache(model),
            example_inputs(model.config),
            dynamo=True,
            opset_version=opset,
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=_dynamic_shapes(L),
            optimize=True,
            verbose=False,
        )
    program.save(str(path), external_data=external_data)
    proto = onnx.load(str(path), load_external_data=False)  # external tensors stay references
    _drop_stack_traces(proto)
    add_mask_length_check(proto)
    drop_unused_outputs(proto)
    onnx.save_model(proto, str(path))
    if external_data:
        onnx.checker.check_model(str(path))  # path form: the checker reads the external weights
    else:
        onnx.checker.check_model(onnx.load(str(path)))
    logger.info("ONNX decoder (opset %d, %s) -> %s", opset, "external data" if external_data else "single file", path)
    return path


def _drop_stack_traces(model: onnx.ModelProto) -> None:
    """Remove the exporter's per-node Python stack traces (``pkg.torch.onnx.stack_trace``), in place:
    they hold the build machine's paths, so the same checkpoint would give different files elsewhere."""
    for node in model.graph.node:
        keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        if len(keep) != len(node.metadata_props):
            del node.metadata_props[:]
            node.metadata_props.extend(keep)


def check_io(path: str | os.PathLike, config: Any) -> None:
    """Assert that the ONNX file at ``path`` has exactly the contract's inputs and outputs.

    Raises:
        ValueError: naming the first input/output whose name, dtype or static dims differ.
    """
    graph = onnx.load(str(path), load_external_data=False).graph
    want_in, want_out = io_names(config.num_hidden_layers)
    got_in, got_out = [i.name for i in graph.input], [o.name for o in graph.output]
    if got_in != want_in or got_out != want_out:
        raise InvalidInput(
            f"{path}: ONNX I/O names {got_in} -> {got_out} differ from the contract "
            f"{want_in} -> {want_out} (re-run `prodip export`)"
        )
    kv = [config.num_key_value_heads, config.head_dim]
    for value in list(graph.input)[3:] + list(graph.output)[1:]:
        t = value.type.tensor_type
        dims = [d.dim_value for d in t.shape.dim]
        if t.elem_type != onnx.TensorProto.FLOAT or dims[1] != kv[0] or dims[3] != kv[1]:
            raise InvalidInput(
                f"{path}: {value.name} is {onnx.TensorProto.DataType.Name(t.elem_type)} "
                f"dims {dims}, expected FLOAT [batch, {kv[0]}, past, {kv[1]}]"
            )
