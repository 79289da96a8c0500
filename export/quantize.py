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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
import onnx
import onnx.version_converter
from onnx import numpy_helper

from prodip.base.errors import InvalidInput

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


@dataclass(frozen=True)
class TiedEmbedding:
    """A tied lm_head in the fp32 graph: ``Gather(E, ids)`` and ``MatMul(x, Transpose(E))``, E [V, H].

    Attributes:
        table: name of the embedding initializer E (float32 [vocab, hidden]).
        vocab, hidden: E's shape.
        transposed: name of the ``Transpose(E)`` output, i.e. of the [hidden, vocab] initializer
            :func:`materialize_transposed_weights` creates for the lm_head MatMul.
        gather_node, embedding, indices: the embedding Gather's node name, output and indices input.
        logits: output of the lm_head MatMul.
    """

    table: str
    vocab: int
    hidden: int
    transposed: str
    gather_node: str
    embedding: str
    indices: str
    logits: str


def find_tied_embedding(graph: onnx.GraphProto) -> Optional[TiedEmbedding]:
    """The tied embedding of an fp32 decoder graph (before :func:`materialize_transposed_weights`), or None.

    Tied means: the MatMul producing ``logits`` reads ``Transpose(E)`` (perm [1, 0] or default)
    of a 2-D initializer E that is also the data of exactly one Gather (axis 0).
    """
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    lm_head = next((n for n in graph.node if n.op_type == "MatMul" and "logits" in n.output), None)
    transpose = producer.get(lm_head.input[1]) if lm_head is not None else None
    if transpose is None or transpose.op_type != "Transpose" or transpose.input[0] not in inits:
        return None
    table = inits[transpose.input[0]]
    perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), [1, 0])
    if len(table.dims) != 2 or perm != [1, 0]:
        return None
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[0] == table.name
               and next((a.i for a in n.attribute if a.name == "axis"), 0) == 0]
    if len(gathers) != 1 or not gathers[0].name:
        return None
    gather = gathers[0]
    return TiedEmbedding(table=table.name, vocab=int(table.dims[0]), hidden=int(table.dims[1]),
                         transposed=transpose.output[0], gather_node=gather.name, embedding=gather.output[0],
                         indices=gather.input[1], logits=lm_head.output[0])


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _replace_embedding_nodes(graph: onnx.GraphProto, tied: TiedEmbedding, new_nodes: list[onnx.NodeProto]) -> None:
    """Swap the nodes computing ``tied.embedding`` from ``tied.indices`` for ``new_nodes``, in place.

    Removed: the producer of ``tied.embedding`` and, walking up its first input, every producer
    up to the indices (e.g. int8's ``Gather -> DequantizeLinear``). Initializers only they read
    are dropped. ``new_nodes`` go where the first removed node was (indices and initializers are
    all they read, so the order stays topological).
    """
    producer = {out: node for node in graph.node for out in node.output}
    chain, name = [], tied.embedding
    while name in producer:
        node = producer[name]
        chain.append(node)
        if tied.indices in node.input:
            break
        name = node.input[0]
    else:
        raise InvalidInput(f"no path from {tied.indices!r} to {tied.embedding!r}")
    position = min(list(graph.node).index(n) for n in chain)
    read = {i for n in chain for i in n.input}
    for node in chain:
        graph.node.remove(node)
    for i, node in enumerate(new_nodes):
        graph.node.insert(position + i, node)
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    for init in [t for t in graph.initializer if t.name in read and t.name not in used]:
        graph.initializer.remove(init)


def share_tied_embedding_int4(model: onnx.ModelProto, tied: TiedEmbedding) -> Optional[str]:
    """Make the int4 embedding lookup read the lm_head's MatMulNBits weights, in place.

    Layouts (ONNX Runtime's contrib-op spec, docs/ContribOperators.md (the schemas registered in
    onnxruntime 1.32), and its CPU kernel contrib_ops/cpu/quantization/gather_block_quantized.cc):

    * ``com.microsoft.MatMulNBits`` (lm_head, K = hidden, N = vocab, bits 4, block_size b):
      B uint8 [vocab, hidden/b, b/2], blocks along K, two 4-bit codes per byte, element 2i in the
      low nibble and 2i+1 in the high one; scales float32 [vocab, hidden/b]; zero_points uint8
      [vocab, ceil((hidden/b)/2)] packed the same way, absent = 8 (2^(bits-1)). Weight =
      (code - zero_point) * scale, i.e. row n of B holds vocab entry n's embedding vector.
    * ``com.microsoft.GatherBlockQuantized`` with uint8 data and ``bits=4`` follows MatMulNBits's
      conventions exactly: data uint8 [vocab, hidden/2] packed along the last axis, low nibble
      first; quantize_axis must be the last axis and gather_axis 0; scales [vocab, hidden/b];
      zero_points uint8 [vocab, ceil((hidden/b)/2)], low nibble first, absent = 8.

    With hidden a multiple of b, B's bytes read row-major ARE that data tensor, so the Gather reads
    ``Reshape(B, [vocab, hidden/2])`` (no copy in the file; ORT may fold it at session load) and
    the very same scales and zero points. The embedding's own uint4 tensors are dropped. The
    embedding then holds the lm_head's codes (ORT's C++ RTN), bit for bit; ORT's numpy Gather
    quantiser differed from them only at rounding ties (2 of 2.1 M codes on a random demo-shaped
    model).

    Returns:
        None when shared, else why not (the graph is then left as it was).
    """
    graph = model.graph
    mnb = next((n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] == tied.logits), None)
    producer = {out: node for node in graph.node for out in node.output}
    gbq = producer.get(tied.embedding)
    if mnb is None:
        return "the lm_head is not a MatMulNBits node"
    if gbq is None or gbq.op_type != "GatherBlockQuantized":
        return "the embedding is not a GatherBlockQuantized node"
    block = _attr(mnb, "block_size")
    if (_attr(mnb, "K"), _attr(mnb, "N"), _attr(mnb, "bits", 4)) != (tied.hidden, tied.vocab, 4):
        return f"MatMulNBits K/N/bits {_attr(mnb, 'K')}/{_attr(mnb, 'N')}/{_attr(mnb, 'bits')} do not match the table"
    if tied.hidden % block:
        return f"hidden {tied.hidden} is not a multiple of block_size {block} (MatMulNBits pads the last block)"
    weight, scales = mnb.input[1], mnb.input[2]
    zero_points = mnb.input[3] if len(mnb.input) > 3 and mnb.input[3] else None
    shape = f"{weight}_as_embedding_shape"
    data = f"{weight}_as_embedding"
    graph.initializer.append(numpy_helper.from_array(np.array([tied.vocab, tied.hidden // 2], np.int64), shape))
    reshape = onnx.helper.make_node("Reshape", [weight, shape], [data], name=f"{tied.gather_node}_shared_reshape")
    gather = onnx.helper.make_node(
        "GatherBlockQuantized", [data, tied.indices, scales] + ([zero_points] if zero_points else []),
        [tied.embedding], name=gbq.name, domain="com.microsoft", bits=4, block_size=block, gather_axis=0,
        quantize_axis=1)
    _replace_embedding_nodes(graph, tied, [reshape, gather])
    return None


def share_tied_embedding_int8(model: onnx.ModelProto, tied: TiedEmbedding) -> Optional[str]:
    """Make the int8 embedding lookup read the lm_head's MatMulInteger weights, in place.

    quantize_dynamic (QOperator) leaves the lm_head as ``MatMulInteger(DynamicQuantizeLinear(x),
    W_q, x_zp, W_zp)`` then ``Cast`` and ``Mul(x_scale * W_scale)``: W_q int8 [hidden, vocab]
    (``<weight>_quantized``, the transposed table), W_scale float32 [vocab] per output channel
    (or a scalar per tensor), W_zp int8 zeros (QInt8 weights are symmetric). Vocab entry v is
    column v of W_q times W_scale[v], so the embedding becomes, with standard ONNX ops::

        Gather(W_q, ids, axis=1)            int8 [hidden, *ids]
        Transpose(perm=[1, .., r, 0])       int8 [*ids, hidden]
        Cast(to=float) * Unsqueeze(Gather(W_scale, ids), -1)   float32 [*ids, hidden]

    which is DequantizeLinear of the lm_head's weights, exactly. Only the gathered rows move at run
    time; W_q stays a plain initializer of MatMulInteger. This replaces quantize_dynamic's per-tensor
    uint8 embedding (one scale for the whole table) by per-row int8, so it is also more accurate.

    Returns:
        None when shared, else why not (the graph is then left as it was).
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    weight, scale, zp = (f"{tied.transposed}_quantized", f"{tied.transposed}_scale",
                         f"{tied.transposed}_zero_point")
    mmi = next((n for n in graph.node if n.op_type == "MatMulInteger" and n.input[1] == weight), None)
    if mmi is None or weight not in inits or scale not in inits:
        return "the lm_head is not a MatMulInteger with quantize_dynamic's weight initializers"
    w = inits[weight]
    if list(w.dims) != [tied.hidden, tied.vocab] or w.data_type != onnx.TensorProto.INT8:
        return f"lm_head weight {weight} is not int8 [{tied.hidden}, {tied.vocab}]"
    scales = numpy_helper.to_array(inits[scale])
    if scales.shape not in ((), (1,), (tied.vocab,)):
        return f"lm_head weight scale has shape {scales.shape}"
    if zp in inits and np.any(numpy_helper.to_array(inits[zp])):
        return "lm_head weight zero points are not all 0"
    if len(mmi.input) > 3 and mmi.input[3] and mmi.input[3] != zp:
        return "MatMulInteger reads an unexpected weight zero point"
    if not any(scale in n.input for n in graph.node if n.op_type == "Mul"):
        return f"no Mul applies {scale} to the lm_head output"
    rank = next((len(i.type.tensor_type.shape.dim) for i in graph.input if i.name == tied.indices), None)
    if rank is None:
        rank = 2  # the decoder's input_ids [batch, seq] (intermediate indices have no declared type here)
    name = tied.gather_node + "_shared"
    nodes = [onnx.helper.make_node("Gather", [weight, tied.indices], [f"{name}_columns"], name=f"{name}_gather",
                                   axis=1),
             onnx.helper.make_node("Transpose", [f"{name}_columns"], [f"{name}_rows"], name=f"{name}_transpose",
                                   perm=[*range(1, rank + 1), 0]),
             onnx.helper.make_node("Cast", [f"{name}_rows"], [f"{name}_float"], name=f"{name}_cast",
                                   to=onnx.TensorProto.FLOAT)]
    if scales.shape == (tied.vocab,) and tied.vocab != 1:
        if _opset(model) >= 13:  # Unsqueeze's axes became an input in opset 13
            axes = f"{name}_axes"
            graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), axes))
            unsqueeze = onnx.helper.make_node("Unsqueeze", [f"{name}_scale", axes], [f"{name}_scale_col"],
                                              name=f"{name}_unsqueeze_scale")
        else:
            unsqueeze = onnx.helper.make_node("Unsqueeze", [f"{name}_scale"], [f"{name}_scale_col"],
                                              name=f"{name}_unsqueeze_scale", axes=[-1])
        nodes += [onnx.helper.make_node("Gather", [scale, tied.indices], [f"{name}_scale"],
                                        name=f"{name}_gather_scale", axis=0),
                  unsqueeze,
                  onnx.helper.make_node("Mul", [f"{name}_float", f"{name}_scale_col"], [tied.embedding],
                                        name=f"{name}_mul")]
    else:  # per-tensor weights: one scale
        nodes.append(onnx.helper.make_node("Mul", [f"{name}_float", scale], [tied.embedding], name=f"{name}_mul"))
    _replace_embedding_nodes(graph, tied, nodes)
    return None


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
            quantize_embeddings: bool = True, share_tied_embedding: bool = True,
            external_data: bool = False) -> dict[str, Any]:
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
    from onnxruntime.quantization import QuantType, quantize_dynamic
    dst = Path(dst)
    model = onnx.load(str(src))
    tied = find_tied_embedding(model.graph)
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
    shared, why = False, None
    if tied is not None:
        why = ("share_tied_embedding=False" if not share_tied_embedding
               else "quantize_embeddings=False" if not quantize_embeddings else None)
        if why is None:
            qmodel = onnx.load(str(dst))
            why = share_tied_embedding_int8(qmodel, tied)
            if why is None:
                _resave(qmodel, dst, large)
                shared = True
        if why is not None:
            logger.info("int8: tied embedding stored twice (%s)", why)
    onnx.checker.check_model(str(dst))
    params = {"tool": "onnxruntime.quantization.quantize_dynamic", "format": "QOperator",
              "weight_type": "QInt8", "activation_type": "QUInt8 (dynamic, per tensor)",
              "per_channel": per_channel, "reduce_range": False, "op_types": ops,
              "embedding_quantized": quantize_embeddings, "embedding_shared_with_lm_head": shared,
              "materialized_transposes": folded, "external_data": large}
    if shared:
        params["embedding_layout"] = ("the lm_head's int8 weights [hidden, vocab] and per-vocab-row scales, "
                                      "read by Gather(axis=1) -> Transpose -> Cast -> Mul(scale)")
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


def to_int4(src: str | os.PathLike, dst: str | os.PathLike, *, block_size: int = 32,
            symmetric: bool = False, quantize_embeddings: bool = True, quantize_lm_head: bool = True,
            share_tied_embedding: bool = True, accuracy_level: int = 0,
            external_data: bool = False) -> dict[str, Any]:
    """Weight-only 4-bit blockwise quantisation (MatMulNBits) of the fp32 decoder ``src``.

    Args:
        block_size: weights per block along the input (K) dimension; a power of 2 >= 16.
        symmetric: no zero points (int4) instead of asymmetric (uint4 + zero point per block).
        quantize_embeddings: embedding Gather -> GatherBlockQuantized (blocks along hidden).
        quantize_lm_head: quantise the MatMul producing ``logits``; otherwise it stays fp32.
        share_tied_embedding: with tied embeddings (and both of the above), store the 4-bit table
            once: GatherBlockQuantized reads the lm_head's MatMulNBits weights, scales and zero
            points (:func:`share_tied_embedding_int4`). False keeps two copies (for comparison).
        accuracy_level: MatMulNBits ``accuracy_level`` (0 = unset; see ORT ContribOperators.md).
        external_data: keep weights in ``<dst>.data`` (automatic above 2 GB).
    Returns:
        Quantisation parameters, with ``embedding_shared_with_lm_head`` (and, for a tied model that
        is not shared, why not).
    """
    from onnxruntime.quantization import matmul_nbits_quantizer as mnb
    from onnxruntime.quantization.quant_utils import QuantFormat
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
        model, bits=4, block_size=block_size, is_symmetric=symmetric,
        accuracy_level=accuracy_level or None, nodes_to_exclude=exclude, quant_format=QuantFormat.QOperator,
        op_types_to_quantize=ops, quant_axes=(("MatMul", 0), ("Gather", 1)))
    quant.process()
    shared, why = False, None
    if tied is not None:
        why = ("share_tied_embedding=False" if not share_tied_embedding
               else "quantize_embeddings=False" if not quantize_embeddings
               else "quantize_lm_head=False" if not quantize_lm_head
               else share_tied_embedding_int4(quant.model.model, tied))
        shared = why is None
        if not shared:
            logger.info("int4: tied embedding stored twice (%s)", why)
    external = _save(quant.model.model, Path(dst), external_data)
    params = {"tool": "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer",
              "algorithm": "RTN (DEFAULT)", "format": "QOperator", "bits": 4, "block_size": block_size,
              "symmetric": symmetric, "op_types": list(ops), "embedding_quantized": quantize_embeddings,
              "lm_head_quantized": quantize_lm_head, "embedding_shared_with_lm_head": shared,
              "accuracy_level": accuracy_level, "materialized_transposes": folded, "external_data": external,
              "opset": _opset(quant.model.model)}
    if shared:
        params["embedding_layout"] = ("GatherBlockQuantized(bits=4, uint8 data) on Reshape(lm_head MatMulNBits B "
                                      "[vocab, hidden/block, block/2] -> [vocab, hidden/2]), the same scales "
                                      "and zero points")
    elif tied is not None:
        params["embedding_not_shared_because"] = why
    return params
