"""fp16, int8 and int4 variants of the fp32 ONNX decoder, made with ONNX Runtime's own tools.

* fp16: ``onnxruntime.transformers.float16.convert_float_to_float16`` with ``keep_io_types``
  (inputs, outputs and the KV cache stay float32); ops that overflow or lose too much in fp16
  stay fp32 (:func:`fp16_op_block_list`), and so does the RoPE angle computation (every node
  upstream of Cos/Sin: positions * inverse frequencies).
* int8: ``onnxruntime.quantization.quantize_dynamic`` (QOperator, per-channel QInt8 weights,
  activations quantised at run time); MatMul weights and the embedding Gather.
* int4: ``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`` (weight-only,
  blockwise RTN; MatMul -> com.microsoft.MatMulNBits, embedding Gather -> GatherBlockQuantized).

Each function returns the quantisation parameters recorded in the manifest.

    python -c "from export.quantize import fp16_op_block_list; print(fp16_op_block_list())"
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.version_converter
from onnx import numpy_helper

logger = logging.getLogger(__name__)

#: Ops kept in fp32 in the fp16 variant, on top of ORT's DEFAULT_OP_BLOCK_LIST. Pow/ReduceMean/
#: Sqrt/Reciprocal are RMSNorm's mean of squares (x**2 overflows fp16 above |x| = 256);
#: Softmax sums exponentials; Cos/Sin take RoPE angles up to max_position_embeddings radians,
#: where fp16's spacing (0.5 at 1024) would scramble positions.
FP16_EXTRA_BLOCKED_OPS = ("Pow", "ReduceMean", "Sqrt", "Reciprocal", "Softmax", "Cos", "Sin")
PROTOBUF_LIMIT_BYTES = 2 * 1024**3
#: ONNX opset introducing the INT4/UINT4 tensor types GatherBlockQuantized's weights use.
INT4_MIN_OPSET = 21


def fp16_op_block_list() -> list[str]:
    """Op types the fp16 variant keeps in fp32: ORT's DEFAULT_OP_BLOCK_LIST + :data:`FP16_EXTRA_BLOCKED_OPS`."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    return sorted(set(DEFAULT_OP_BLOCK_LIST) | set(FP16_EXTRA_BLOCKED_OPS))


def _too_big(model: onnx.ModelProto) -> bool:
    return not _all_inline(model) or model.ByteSize() >= PROTOBUF_LIMIT_BYTES - 64 * 1024**2


def _save(model: onnx.ModelProto, path: Path, external: bool = False) -> bool:
    """Save, with weights in ``<name>.data`` beside it if asked or over 2 GB; True if external."""
    external = external or _too_big(model)
    if external:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
        onnx.checker.check_model(str(path))
    else:
        onnx.save_model(model, str(path))
        onnx.checker.check_model(model)
    return external


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _all_inline(model: onnx.ModelProto) -> bool:
    return not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def _ancestors(graph: onnx.GraphProto, targets: set[str]) -> set[str]:
    """Names of nodes whose outputs flow into any node of op type in ``targets``."""
    producer = {out: node for node in graph.node for out in node.output}
    seen: set[str] = set()
    stack = [n for n in graph.node if n.op_type in targets]
    while stack:
        node = stack.pop()
        for name in node.input:
            parent = producer.get(name)
            if parent is not None and parent.name not in seen:
                seen.add(parent.name)
                stack.append(parent)
    return seen


def _rmsnorm_nodes(graph: onnx.GraphProto) -> set[str]:
    """Names of the nodes between each ReduceMean (RMSNorm's mean of squares) and the Mul that
    applies 1/rms: the ``+ eps`` Add, Sqrt, Reciprocal (or Div) and that Mul.

    Blocking op *types* is not enough: the ``mean + eps`` Add would run in fp16, and a mean of
    squares above 65504 (rms > 256, which trained models reach at "massive activation" tokens)
    becomes inf, 1/rms becomes 0 and the whole row of logits collapses to 0.
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    chain_ops = {"Add", "Sqrt", "Reciprocal", "Div", "Mul"}
    seen: set[str] = set()
    for start in (n for n in graph.node if n.op_type == "ReduceMean"):
        frontier = [start]
        for _ in range(4):  # ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul
            nxt = [c for n in frontier for out in n.output for c in consumers.get(out, [])
                   if c.op_type in chain_ops and c.name not in seen]
            seen.update(c.name for c in nxt)
            frontier = [c for c in nxt if c.op_type != "Mul"]
    return seen


def fold_fp16_round_trips(model: onnx.ModelProto) -> int:
    """Drop ``Cast(to=float16) -> Cast(to=float)`` pairs left between two fp32 (blocked) nodes, in place.

    ORT's converter wraps every blocked node in its own casts, so RMSNorm's Pow (fp32) hands
    its result to ReduceMean (fp32) through fp16: a square above 65504 (|x| > 256) becomes inf,
    1/rms becomes 0 and the row's logits collapse to 0. Consumers of the second Cast read the
    fp32 tensor directly instead (exact); the fp16 Cast stays only if something else uses it.

    Returns:
        Number of round trips removed.
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}

    def cast_to(node: onnx.NodeProto) -> int:
        return next((a.i for a in node.attribute if a.name == "to"), -1)

    rename: dict[str, str] = {}
    for node in graph.node:
        parent = producer.get(node.input[0]) if node.op_type == "Cast" and node.input else None
        if (parent is not None and parent.op_type == "Cast" and cast_to(node) == onnx.TensorProto.FLOAT
                and cast_to(parent) == onnx.TensorProto.FLOAT16 and node.output[0] not in outputs):
            rename[node.output[0]] = parent.input[0]
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
    used = {name for node in graph.node for name in node.input} | outputs
    while True:  # prune casts nobody reads any more
        dead = [n for n in graph.node if n.op_type == "Cast" and not any(o in used for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
        used = {name for node in graph.node for name in node.input} | outputs
    return len(rename)


def materialize_transposed_weights(model: onnx.ModelProto) -> int:
    """Replace ``Transpose(initializer)`` by a transposed initializer, in place.

    The exporter leaves the tied lm_head as ``MatMul(x, Transpose(embed_tokens.weight))`` (one
    stored copy); weight quantisers only touch MatMuls whose weight *is* an initializer, so the
    quantised variants get their own transposed copy (quantised, it costs far less than fp32).

    Returns:
        Number of Transpose nodes folded.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    folded = 0
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.input[0] not in inits:
            continue
        array = numpy_helper.to_array(inits[node.input[0]])
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array.transpose(perm)),
                                                         node.output[0]))
        graph.node.remove(node)
        folded += 1
    return folded


def to_fp16(src: str | os.PathLike, dst: str | os.PathLike, *, external_data: bool = False) -> dict[str, Any]:
    """Write an fp16 copy of the fp32 decoder ``src`` to ``dst``; float32 inputs and outputs.

    Args:
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).

    Returns:
        Quantisation parameters: tool, keep_io_types, blocked op types and the number of nodes
        kept fp32 for RoPE.
    """
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel
    model = onnx.load(str(src))
    rope_nodes = sorted(_ancestors(model.graph, {"Cos", "Sin"}))
    norm_nodes = sorted(_rmsnorm_nodes(model.graph))
    blocked = fp16_op_block_list()
    big = _too_big(model)  # onnx.shape_inference serialises the model: impossible above 2 GB
    model16 = convert_float_to_float16(model, keep_io_types=True, op_block_list=blocked,
                                       node_block_list=rope_nodes + norm_nodes, disable_shape_infer=big)
    folded = fold_fp16_round_trips(model16)
    OnnxModel(model16).topological_sort()  # the converter appends its input Casts at the end
    del model16.graph.value_info[:]  # some of the converter's value_info entries are stale
    if not big:
        model16 = onnx.shape_inference.infer_shapes(model16)
    external = _save(model16, Path(dst), external_data)
    return {"tool": "onnxruntime.transformers.float16.convert_float_to_float16", "keep_io_types": True,
            "op_block_list": blocked, "rope_nodes_kept_fp32": len(rope_nodes),
            "rmsnorm_nodes_kept_fp32": len(norm_nodes), "fp16_round_trips_removed": folded,
            "external_data": external}


def to_int8(src: str | os.PathLike, dst: str | os.PathLike, *, per_channel: bool = True,
            quantize_embeddings: bool = True, external_data: bool = False) -> dict[str, Any]:
    """Dynamic int8 quantisation of the fp32 decoder ``src`` into ``dst``.

    Args:
        per_channel: one scale per output channel of each MatMul weight.
        quantize_embeddings: also quantise the token embedding (Gather, per tensor).
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).
    Returns:
        Quantisation parameters (tool, weight type, per_channel, op types, reduce_range).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic
    dst = Path(dst)
    model = onnx.load(str(src))
    folded = materialize_transposed_weights(model)
    ops = ["MatMul", "Gather"] if quantize_embeddings else ["MatMul"]
    large = external_data or _too_big(model)
    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(max(level, logging.ERROR))  # quantize_dynamic narrates every tensor on the root logger
    try:
        quantize_dynamic(model, dst, op_types_to_quantize=ops, per_channel=per_channel, reduce_range=False,
                         weight_type=QuantType.QInt8, use_external_data_format=large,
                         extra_options={"MatMulConstBOnly": True})
    finally:
        root.setLevel(level)
    onnx.checker.check_model(str(dst))
    return {"tool": "onnxruntime.quantization.quantize_dynamic", "format": "QOperator",
            "weight_type": "QInt8", "activation_type": "QUInt8 (dynamic, per tensor)",
            "per_channel": per_channel, "reduce_range": False, "op_types": ops,
            "embedding_quantized": quantize_embeddings, "materialized_transposes": folded,
            "external_data": large}


def _lm_head_node(graph: onnx.GraphProto) -> str | None:
    return next((n.name for n in graph.node if n.op_type == "MatMul" and "logits" in n.output), None)


def to_int4(src: str | os.PathLike, dst: str | os.PathLike, *, block_size: int = 32,
            symmetric: bool = False, quantize_embeddings: bool = True, quantize_lm_head: bool = True,
            accuracy_level: int = 0, external_data: bool = False) -> dict[str, Any]:
    """Weight-only 4-bit blockwise quantisation (MatMulNBits) of the fp32 decoder ``src``.

    Args:
        block_size: weights per block along the input (K) dimension; a power of 2 >= 16.
        symmetric: no zero points (int4) instead of asymmetric (uint4 + zero point per block).
        quantize_embeddings: embedding Gather -> GatherBlockQuantized (blocks along hidden).
        quantize_lm_head: quantise the MatMul producing ``logits``; otherwise it stays fp32.
        accuracy_level: MatMulNBits ``accuracy_level`` (0 = unset; see ORT ContribOperators.md).
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).
    Returns:
        Quantisation parameters.
    """
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb
    from onnxruntime.quantization.quant_utils import QuantFormat
    model = onnx.load(str(src))
    folded = materialize_transposed_weights(model)
    if _opset(model) < INT4_MIN_OPSET and not _too_big(model):
        # int4/uint4 tensors need opset 21: convert properly rather than let ORT relabel the opset
        # (the converter serialises the model, so above 2 GB ORT's relabelling is what happens)
        model = onnx.version_converter.convert_version(model, INT4_MIN_OPSET)
    ops = ("MatMul", "Gather") if quantize_embeddings else ("MatMul",)
    lm_head = _lm_head_node(model.graph)
    exclude = [] if quantize_lm_head or lm_head is None else [lm_head]
    quant = mnb.MatMulNBitsQuantizer(
        model, bits=4, block_size=block_size, is_symmetric=symmetric,
        accuracy_level=accuracy_level or None, nodes_to_exclude=exclude, quant_format=QuantFormat.QOperator,
        op_types_to_quantize=ops, quant_axes=(("MatMul", 0), ("Gather", 1)))
    quant.process()
    external = _save(quant.model.model, Path(dst), external_data)
    return {"tool": "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer",
            "algorithm": "RTN (DEFAULT)", "format": "QOperator", "bits": 4, "block_size": block_size,
            "symmetric": symmetric, "op_types": list(ops), "embedding_quantized": quantize_embeddings,
            "lm_head_quantized": quantize_lm_head, "accuracy_level": accuracy_level,
            "materialized_transposes": folded, "external_data": external,
            "opset": _opset(quant.model.model)}
