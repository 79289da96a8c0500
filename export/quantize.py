"""fp16, int8 and int4 variants of the fp32 ONNX decoder, made with ONNX Runtime's own tools.

* fp16: ``onnxruntime.transformers.float16.convert_float_to_float16`` with ``keep_io_types``
  (inputs, outputs and the KV cache stay float32); ops that overflow or lose too much in fp16
  stay fp32 (:func:`fp16_op_block_list`), and so does the RoPE angle computation (every node
  upstream of Cos/Sin: positions * inverse frequencies).
* int8: ``onnxruntime.quantization.quantize_dynamic`` (QOperator, per-channel QInt8 weights,
  activations quantised at run time); MatMul weights and the embedding Gather.
* int4: ``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer`` (weight-only,
  blockwise RTN; MatMul -> com.microsoft.MatMulNBits, embedding Gather -> GatherBlockQuantized).

Tied embeddings (``tie_word_embeddings``: the lm_head weight IS the embedding table): the quantisers
only see the lm_head weight once :func:`materialize_transposed_weights` has made it an initializer of
its own, so they quantise the table twice (embedding Gather and lm_head MatMul). The int8 and int4
variants then rewire the embedding lookup to read the lm_head's quantised tensors and drop the
embedding's own copy (:func:`share_tied_embedding_int4`, :func:`share_tied_embedding_int8`), so the
file holds the quantised table once, as the fp32 file does.

Each function returns the quantisation parameters recorded in the manifest.

    python -c "from export.quantize import fp16_op_block_list; print(fp16_op_block_list())"
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import onnx
import onnx.version_converter
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.quantization import matmul_nbits_quantizer as mnb
from onnxruntime.quantization.quant_utils import QuantFormat
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16
from onnxruntime.transformers.onnx_model import OnnxModel

from prodip.export.graph import (
    _ancestors,
    _rmsnorm_nodes,
    find_tied_embedding,
    fold_fp16_round_trips,
    materialize_transposed_weights,
    share_tied_embedding_int4,
    share_tied_embedding_int8,
)

logger = logging.getLogger(__name__)

#: Ops kept in fp32 in the fp16 variant, on top of ORT's DEFAULT_OP_BLOCK_LIST. Pow/ReduceMean/
#: Sqrt/Reciprocal are RMSNorm's mean of squares (x**2 overflows fp16 above |x| = 256);
#: Softmax sums exponentials; Cos/Sin take RoPE angles up to max_position_embeddings radians,
#: where fp16's spacing (0.5 at 1024) would scramble positions.
# In the contrib graph the same computations are ONNX Runtime's fused operators: RMSNorm inside
# SkipSimplifiedLayerNormalization, softmax inside GroupQueryAttention, the RoPE tables read by
# RotaryEmbedding; they stay fp32 too (their weights are tiny; the MatMul weights are what fp16 halves).
FP16_EXTRA_BLOCKED_OPS = (
    "Pow",
    "ReduceMean",
    "Sqrt",
    "Reciprocal",
    "Softmax",
    "Cos",
    "Sin",
    "SkipSimplifiedLayerNormalization",
    "GroupQueryAttention",
    "RotaryEmbedding",
)
PROTOBUF_LIMIT_BYTES = 2 * 1024**3
#: ONNX opset introducing the INT4/UINT4 tensor types GatherBlockQuantized's weights use.
INT4_MIN_OPSET = 21


def fp16_op_block_list() -> list[str]:
    """Op types the fp16 variant keeps in fp32: ORT's DEFAULT_OP_BLOCK_LIST + :data:`FP16_EXTRA_BLOCKED_OPS`."""
    return sorted(set(DEFAULT_OP_BLOCK_LIST) | set(FP16_EXTRA_BLOCKED_OPS))


def _too_big(model: onnx.ModelProto) -> bool:
    return not _all_inline(model) or model.ByteSize() >= PROTOBUF_LIMIT_BYTES - 64 * 1024**2


def _save(model: onnx.ModelProto, path: Path, external: bool = False) -> bool:
    """Save, with weights in ``<name>.data`` beside it if asked or over 2 GB; True if external."""
    external = external or _too_big(model)
    if external:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=path.name + ".data",
            size_threshold=1024,
        )
        onnx.checker.check_model(str(path))
    else:
        onnx.save_model(model, str(path))
        onnx.checker.check_model(model)
    return external


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _all_inline(model: onnx.ModelProto) -> bool:
    return not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)


def to_fp16(src: str | os.PathLike, dst: str | os.PathLike, *, external_data: bool = False) -> dict[str, Any]:
    """Write an fp16 copy of the fp32 decoder ``src`` to ``dst``; float32 inputs and outputs.

    Args:
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).

    Returns:
        Quantisation parameters: tool, keep_io_types, blocked op types and the number of nodes
        kept fp32 for RoPE.
    """
    model = onnx.load(str(src))
    rope_nodes = sorted(_ancestors(model.graph, {"Cos", "Sin"}))
    norm_nodes = sorted(_rmsnorm_nodes(model.graph))
    blocked = fp16_op_block_list()
    big = _too_big(model)  # onnx.shape_inference serialises the model: impossible above 2 GB
    model16 = convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=blocked,
        node_block_list=rope_nodes + norm_nodes,
        disable_shape_infer=big,
    )
    folded = fold_fp16_round_trips(model16)
    OnnxModel(model16).topological_sort()  # the converter appends its input Casts at the end
    del model16.graph.value_info[:]  # some of the converter's value_info entries are stale
    if not big:
        model16 = onnx.shape_inference.infer_shapes(model16)
    external = _save(model16, Path(dst), external_data)
    return {
        "tool": "onnxruntime.transformers.float16.convert_float_to_float16",
        "keep_io_types": True,
        "op_block_list": blocked,
        "rope_nodes_kept_fp32": len(rope_nodes),
        "rmsnorm_nodes_kept_fp32": len(norm_nodes),
        "fp16_round_trips_removed": folded,
        "external_data": external,
    }


def to_int8(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    per_channel: bool = True,
    quantize_embeddings: bool = True,
    share_tied_embedding: bool = True,
    external_data: bool = False,
) -> dict[str, Any]:
    """Dynamic int8 quantisation of the fp32 decoder ``src`` into ``dst``.

    Args:
        per_channel: one scale per output channel of each MatMul weight.
        quantize_embeddings: also quantise the token embedding (Gather; per tensor, or per row
            when shared with a tied lm_head).
        share_tied_embedding: with tied embeddings, store the int8 table once: the embedding
            reads the lm_head's weights (:func:`share_tied_embedding_int8`). False keeps
            quantize_dynamic's two copies (for comparison).
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).
    Returns:
        Quantisation parameters (tool, weight type, per_channel, op types, reduce_range,
        ``embedding_shared_with_lm_head`` and, for a tied model that is not shared, why not).
    """
    dst = Path(dst)
    model = onnx.load(str(src))
    tied = find_tied_embedding(model.graph)
    folded = materialize_transposed_weights(model)
    ops = ["MatMul", "Gather"] if quantize_embeddings else ["MatMul"]
    large = external_data or _too_big(model)
    root, level = logging.getLogger(), logging.getLogger().level
    root.setLevel(max(level, logging.ERROR))  # quantize_dynamic narrates every tensor on the root logger
    try:
        quantize_dynamic(
            model,
            dst,
            op_types_to_quantize=ops,
            per_channel=per_channel,
            reduce_range=False,
            weight_type=QuantType.QInt8,
            use_external_data_format=large,
            extra_options={"MatMulConstBOnly": True},
        )
    finally:
        root.setLevel(level)
    shared, why = False, None
    if tied is not None:
        why = (
            "share_tied_embedding=False"
            if not share_tied_embedding
            else "quantize_embeddings=False"
            if not quantize_embeddings
            else None
        )
        if why is None:
            qmodel = onnx.load(str(dst))
            why = share_tied_embedding_int8(qmodel, tied)
            if why is None:
                _resave(qmodel, dst, large)
                shared = True
        if why is not None:
            logger.info("int8: tied embedding stored twice (%s)", why)
    onnx.checker.check_model(str(dst))
    params = {
        "tool": "onnxruntime.quantization.quantize_dynamic",
        "format": "QOperator",
        "weight_type": "QInt8",
        "activation_type": "QUInt8 (dynamic, per tensor)",
        "per_channel": per_channel,
        "reduce_range": False,
        "op_types": ops,
        "embedding_quantized": quantize_embeddings,
        "embedding_shared_with_lm_head": shared,
        "materialized_transposes": folded,
        "external_data": large,
    }
    if shared:
        params["embedding_layout"] = (
            "the lm_head's int8 weights [hidden, vocab] and per-vocab-row scales, "
            "read by Gather(axis=1) -> Transpose -> Cast -> Mul(scale)"
        )
    elif tied is not None:
        params["embedding_not_shared_because"] = why
    return params


def _resave(model: onnx.ModelProto, dst: Path, external: bool) -> None:
    """Rewrite ``dst`` (and a fresh ``dst.data``: onnx appends to an existing data file)."""
    data = dst.with_name(dst.name + ".data")
    dst.unlink()
    if data.exists():
        data.unlink()
    _save(model, dst, external)


def _lm_head_node(graph: onnx.GraphProto) -> str | None:
    return next((n.name for n in graph.node if n.op_type == "MatMul" and "logits" in n.output), None)


def to_int4(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    *,
    block_size: int = 32,
    symmetric: bool = False,
    quantize_embeddings: bool = True,
    quantize_lm_head: bool = True,
    share_tied_embedding: bool = True,
    accuracy_level: int = 4,
    external_data: bool = False,
) -> dict[str, Any]:
    """Weight-only 4-bit blockwise quantisation (MatMulNBits) of the fp32 decoder ``src``.

    Args:
        block_size: weights per block along the input (K) dimension; a power of 2 >= 16.
        symmetric: no zero points (int4) instead of asymmetric (uint4 + zero point per block).
        quantize_embeddings: embedding Gather -> GatherBlockQuantized (blocks along hidden).
        quantize_lm_head: quantise the MatMul producing ``logits``; otherwise it stays fp32.
        share_tied_embedding: with tied embeddings (and both of the above), store the 4-bit table
            once: GatherBlockQuantized reads the lm_head's MatMulNBits weights, scales and zero
            points (:func:`share_tied_embedding_int4`). False keeps two copies (for comparison).
        accuracy_level: MatMulNBits ``accuracy_level`` (0 = unset; 4 = int8 compute, the model builder's
            choice and ~3x faster on CPU; see ORT ContribOperators.md).
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).
    Returns:
        Quantisation parameters, with ``embedding_shared_with_lm_head`` (and, for a tied model that
        is not shared, why not).
    """
    model = onnx.load(str(src))
    tied = find_tied_embedding(model.graph)
    folded = materialize_transposed_weights(model)
    if _opset(model) < INT4_MIN_OPSET and not _too_big(model):
        # int4/uint4 tensors need opset 21: convert properly rather than let ORT relabel the opset
        # (the converter serialises the model, so above 2 GB ORT's relabelling is what happens)
        model = onnx.version_converter.convert_version(model, INT4_MIN_OPSET)
    ops = ("MatMul", "Gather") if quantize_embeddings else ("MatMul",)
    lm_head = _lm_head_node(model.graph)
    exclude = [] if quantize_lm_head or lm_head is None else [lm_head]
    quant = mnb.MatMulNBitsQuantizer(
        model,
        bits=4,
        block_size=block_size,
        is_symmetric=symmetric,
        accuracy_level=accuracy_level or None,
        nodes_to_exclude=exclude,
        quant_format=QuantFormat.QOperator,
        op_types_to_quantize=ops,
        quant_axes=(("MatMul", 0), ("Gather", 1)),
    )
    quant.process()
    shared, why = False, None
    if tied is not None:
        why = (
            "share_tied_embedding=False"
            if not share_tied_embedding
            else "quantize_embeddings=False"
            if not quantize_embeddings
            else "quantize_lm_head=False"
            if not quantize_lm_head
            else share_tied_embedding_int4(quant.model.model, tied)
        )
        shared = why is None
        if not shared:
            logger.info("int4: tied embedding stored twice (%s)", why)
    external = _save(quant.model.model, Path(dst), external_data)
    params = {
        "tool": "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer",
        "algorithm": "RTN (DEFAULT)",
        "format": "QOperator",
        "bits": 4,
        "block_size": block_size,
        "symmetric": symmetric,
        "op_types": list(ops),
        "embedding_quantized": quantize_embeddings,
        "lm_head_quantized": quantize_lm_head,
        "embedding_shared_with_lm_head": shared,
        "accuracy_level": accuracy_level,
        "materialized_transposes": folded,
        "external_data": external,
        "opset": _opset(quant.model.model),
    }
    if shared:
        params["embedding_layout"] = (
            "GatherBlockQuantized(bits=4, uint8 data) on Reshape(lm_head MatMulNBits B "
            "[vocab, hidden/block, block/2] -> [vocab, hidden/2]), the same scales "
            "and zero points"
        )
    elif tied is not None:
        params["embedding_not_shared_because"] = why
    return params
