"""ONNX graph surgery behind the fp16/int8/int4 variants (:mod:`prodip.export.quantize` builds them).

- :func:`fold_fp16_round_trips`, :func:`_rmsnorm_nodes`: keep RMSNorm and the RoPE angles in fp32
  inside the fp16 graph without Cast round trips.
- :func:`materialize_transposed_weights`: give the lm_head its own (transposed) initializer so
  ORT's quantisers see it.
- :class:`TiedEmbedding`, :func:`find_tied_embedding`, :func:`share_tied_embedding_int4`,
  :func:`share_tied_embedding_int8`: with ``tie_word_embeddings``, point the embedding lookup at
  the lm_head's quantised tensors so the file holds the table once.
- :func:`quantize_matmuls_rowwise_int8`: the int8 variant's MatMuls (8-bit weights per output
  channel, 8-bit activations per token, MatMulInteger: batch-invariant).
- :func:`add_mask_length_check`: the decoder refuses an ``attention_mask`` whose length is not
  ``past + T`` (case C3); :func:`drop_unused_outputs`: blank the optional outputs nothing reads.
- :func:`shared_buffer_graph`, :func:`fold_rotary_into_attention`, :func:`right_padded_attention`: the
  decoder as onnxruntime-genai runs it (shared past/present buffer, rotary inside GroupQueryAttention,
  padding by sequence length).
- :func:`find_embedding_gather`, :func:`quantize_embedding_int8`: the 8-bit GatherBlockQuantized
  embedding (ORT's quantiser does 4-bit Gathers only).

    python -c "from prodip.export.graph import find_tied_embedding; help(find_tied_embedding)"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_8bits


def onnx_opset(model: onnx.ModelProto) -> int:
    """The model's opset of the default ONNX domain (``""`` or ``"ai.onnx"``); StopIteration if it imports none."""
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _ancestors(graph: onnx.GraphProto, targets: set[str]) -> set[str]:
    """Names of nodes whose outputs flow into any node of op type in ``targets``.

    The targets themselves are not included (unless one feeds another). Used with ``{"Cos", "Sin"}``
    for the fp16 variant's ``node_block_list``: the RoPE angles (positions * inverse frequencies)
    reach ``max_position_embeddings`` radians, where fp16's spacing (0.5 at 1024) would scramble
    positions (:data:`prodip.export.quantize.FP16_EXTRA_BLOCKED_OPS`). Nodes are deduplicated by
    name: unnamed nodes all count as ``""``, and only the first one met is walked through.
    """
    producer = {out: node for node in graph.node for out in node.output}
    seen: set[str] = set()
    stack = [n for n in graph.node if n.op_type in targets]
    while stack:
        node = stack.pop()
        for name in node.input:
            parent = producer.get(name)  # None for graph inputs and initializers: the walk stops there
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

    The walk follows only consumers of the chain's op types, at most four steps from each
    ReduceMean, and stops at a Mul: the Mul that applies 1/rms is kept fp32, the ``* weight`` Mul
    after it is not (it is an ordinary fp16 op). The ReduceMean itself is blocked by type
    (:data:`prodip.export.quantize.FP16_EXTRA_BLOCKED_OPS`), not listed here.
    """
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    # Div: 1/rms as a Div instead of Reciprocal
    chain_ops = {"Add", "Sqrt", "Reciprocal", "Div", "Mul"}
    seen: set[str] = set()
    for start in (n for n in graph.node if n.op_type == "ReduceMean"):
        frontier = [start]
        for _ in range(4):  # ReduceMean -> Add -> Sqrt -> Reciprocal -> Mul
            nxt = [
                c
                for n in frontier
                for out in n.output
                for c in consumers.get(out, [])
                if c.op_type in chain_ops and c.name not in seen
            ]
            seen.update(c.name for c in nxt)
            # the first Mul reached applies 1/rms: the walk ends there, so the ``* weight`` Mul and
            # whatever follows the norm stay in fp16
            frontier = [c for c in nxt if c.op_type != "Mul"]
    return seen


def fold_fp16_round_trips(model: onnx.ModelProto) -> int:
    """Drop ``Cast(to=float16) -> Cast(to=float)`` pairs left between two fp32 (blocked) nodes, in place.

    ORT's converter wraps every blocked node in its own casts, so RMSNorm's Pow (fp32) hands
    its result to ReduceMean (fp32) through fp16: a square above 65504 (|x| > 256) becomes inf,
    1/rms becomes 0 and the row's logits collapse to 0. Consumers of the second Cast read the
    fp32 tensor directly instead (exact); the fp16 Cast stays only if something else uses it.

    Args:
        model: the fp16 graph from ``onnxruntime.transformers.float16.convert_float_to_float16``.
    Returns:
        Number of round trips removed (second Casts whose consumers were rewired).
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    outputs = {o.name for o in graph.output}

    def cast_to(node: onnx.NodeProto) -> int:
        return next((a.i for a in node.attribute if a.name == "to"), -1)

    # second Cast's output -> the fp32 tensor the first Cast read
    rename: dict[str, str] = {}
    for node in graph.node:
        parent = producer.get(node.input[0]) if node.op_type == "Cast" and node.input else None
        if (
            parent is not None
            and parent.op_type == "Cast"
            and cast_to(node) == onnx.TensorProto.FLOAT
            and cast_to(parent) == onnx.TensorProto.FLOAT16
            # a Cast producing a graph output stays (the output keeps its name and producer): not counted
            and node.output[0] not in outputs
        ):
            rename[node.output[0]] = parent.input[0]
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in rename:
                node.input[i] = rename[name]
    # Only Casts were orphaned by the rewiring. Two passes at least: the fp32 Cast is unread once
    # its consumers are rewired, the fp16 Cast before it only once the fp32 Cast is gone.
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
    Every Transpose of an initializer is folded, not only the lm_head's; the original initializer
    is not removed (a tied table's embedding Gather still reads it).

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
        # no perm attribute: ONNX Transpose reverses the axes, as numpy's transpose(None) does
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        # the initializer takes the Transpose's output name, so its consumers (the lm_head MatMul)
        # need no rewiring; C order, as numpy_helper stores it (the lm_head's: [hidden, vocab])
        graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(array.transpose(perm)), node.output[0]))
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

    None also when that Gather has no name: :func:`share_tied_embedding_int4` and
    :func:`share_tied_embedding_int8` name the nodes they write after it.
    """
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    # "logits": the decoder's output name (prodip.base.onnx_io); its producer is the lm_head
    lm_head = next((n for n in graph.node if n.op_type == "MatMul" and "logits" in n.output), None)
    transpose = producer.get(lm_head.input[1]) if lm_head is not None else None
    if transpose is None or transpose.op_type != "Transpose" or transpose.input[0] not in inits:
        return None
    table = inits[transpose.input[0]]
    # absent perm reverses the axes: [1, 0] for a 2-D table
    perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), [1, 0])
    if len(table.dims) != 2 or perm != [1, 0]:
        return None
    gathers = [
        n
        for n in graph.node
        if n.op_type == "Gather"
        and n.input[0] == table.name
        and next((a.i for a in n.attribute if a.name == "axis"), 0) == 0
    ]
    if len(gathers) != 1 or not gathers[0].name:
        return None
    gather = gathers[0]
    return TiedEmbedding(
        table=table.name,
        vocab=int(table.dims[0]),
        hidden=int(table.dims[1]),
        transposed=transpose.output[0],
        gather_node=gather.name,
        embedding=gather.output[0],
        indices=gather.input[1],
        logits=lm_head.output[0],
    )


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    """Attribute ``name`` of ``node`` as a Python value, or ``default`` when absent (pass the spec's default)."""
    return next((onnx.helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _replace_embedding_nodes(graph: onnx.GraphProto, tied: TiedEmbedding, new_nodes: list[onnx.NodeProto]) -> None:
    """Swap the nodes computing ``tied.embedding`` from ``tied.indices`` for ``new_nodes``, in place.

    Removed: the producer of ``tied.embedding`` and, walking up its first input, every producer
    up to the indices (e.g. int8's ``Gather -> DequantizeLinear``). Initializers only they read
    are dropped. ``new_nodes`` go where the first removed node was (indices and initializers are
    all they read, so the order stays topological).

    Raises:
        ValueError: ``tied.embedding`` is not computed from ``tied.indices`` along first inputs (a bug).
    """
    producer = {out: node for node in graph.node for out in node.output}
    chain, name = [], tied.embedding
    while name in producer:
        node = producer[name]
        chain.append(node)
        if tied.indices in node.input:  # the lookup itself (Gather or GatherBlockQuantized)
            break
        name = node.input[0]  # the data path: DequantizeLinear's x, Cast's input, ...
    else:
        raise ValueError(f"no path from {tied.indices!r} to {tied.embedding!r}")  # a bug, not an input error
    position = min(list(graph.node).index(n) for n in chain)
    read = {i for n in chain for i in n.input}
    for node in chain:
        graph.node.remove(node)
    for i, node in enumerate(new_nodes):
        graph.node.insert(position + i, node)
    # computed after the insertion: the lm_head tensors the new nodes read are kept
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

    Args:
        model: the int4 graph after ``MatMulNBitsQuantizer`` (lm_head MatMulNBits, embedding
            GatherBlockQuantized); tied: :func:`find_tied_embedding` of its fp32 graph.
    Returns:
        None when shared, else why not (the graph is then left as it was).
    """
    graph = model.graph
    # the quantiser keeps output names, so the lm_head is found by tied.logits and the lookup by
    # tied.embedding
    mnb = next((n for n in graph.node if n.op_type == "MatMulNBits" and n.output[0] == tied.logits), None)
    producer = {out: node for node in graph.node for out in node.output}
    gbq = producer.get(tied.embedding)
    if mnb is None:
        return "the lm_head is not a MatMulNBits node"
    if gbq is None or gbq.op_type != "GatherBlockQuantized":
        return "the embedding is not a GatherBlockQuantized node"
    block = _attr(mnb, "block_size")
    # K = hidden, N = vocab: B's row n is then vocabulary entry n (the layout above); bits 4 is
    # MatMulNBits's default
    if (_attr(mnb, "K"), _attr(mnb, "N"), _attr(mnb, "bits", 4)) != (tied.hidden, tied.vocab, 4):
        return f"MatMulNBits K/N/bits {_attr(mnb, 'K')}/{_attr(mnb, 'N')}/{_attr(mnb, 'bits')} do not match the table"
    if tied.hidden % block:
        return f"hidden {tied.hidden} is not a multiple of block_size {block} (MatMulNBits pads the last block)"
    weight, scales = mnb.input[1], mnb.input[2]
    # symmetric int4 has none; both ops then use 8, so leaving it out keeps the two in agreement
    zero_points = mnb.input[3] if len(mnb.input) > 3 and mnb.input[3] else None
    shape = f"{weight}_as_embedding_shape"
    data = f"{weight}_as_embedding"
    # Reshape's shape input must be int64 (ONNX Reshape); [vocab, hidden/2] is B [vocab, hidden/b, b/2]
    # with its last two axes merged: the same bytes, no second table in the file
    graph.initializer.append(numpy_helper.from_array(np.array([tied.vocab, tied.hidden // 2], np.int64), shape))
    reshape = onnx.helper.make_node("Reshape", [weight, shape], [data], name=f"{tied.gather_node}_shared_reshape")
    gather = onnx.helper.make_node(
        "GatherBlockQuantized",
        [data, tied.indices, scales] + ([zero_points] if zero_points else []),
        [tied.embedding],
        name=gbq.name,
        domain="com.microsoft",
        bits=4,
        block_size=block,
        # the spec's constraints for packed uint8 data: gather rows (axis 0), blocks along the
        # last axis (the packing axis), as MatMulNBits blocks along K
        gather_axis=0,
        quantize_axis=1,
    )
    _replace_embedding_nodes(graph, tied, [reshape, gather])
    return None


@dataclass(frozen=True)
class EmbeddingGather:
    """The token-embedding lookup of an fp32 decoder: ``Gather(table, input_ids, axis=0)``.

    Attributes:
        node: the Gather's node name; table: its float32 [vocab, hidden] initializer;
        indices: its indices input (``input_ids``); embedding: its output.
    """

    node: str
    table: str
    indices: str
    embedding: str


def find_embedding_gather(graph: onnx.GraphProto) -> Optional[EmbeddingGather]:
    """The Gather (axis 0) of a 2-D float32 initializer by a graph input (``input_ids``), or None.

    Call it on the fp32 graph before quantisation: the first match in node order is returned.
    """
    inits = {t.name: t for t in graph.initializer}
    inputs = {i.name for i in graph.input}
    for n in graph.node:
        if (
            n.op_type == "Gather"
            and n.input[0] in inits
            and n.input[1] in inputs
            and len(inits[n.input[0]].dims) == 2
            and inits[n.input[0]].data_type == onnx.TensorProto.FLOAT
            and _attr(n, "axis", 0) == 0
        ):
            return EmbeddingGather(node=n.name, table=n.input[0], indices=n.input[1], embedding=n.output[0])
    return None


def quantize_embedding_int8(model: onnx.ModelProto, emb: EmbeddingGather, block_size: int) -> None:
    """Replace the fp32 embedding Gather by ``com.microsoft.GatherBlockQuantized`` (bits 8), in place.

    The table E float32 [vocab, hidden] is quantised by ONNX Runtime's own MatMulNBits kernel
    (``onnxruntime.capi._pybind_state.quantize_matmul_8bits`` on E^T, K = hidden, N = vocab,
    symmetric): codes uint8 [vocab, hidden/block, block] (code - 128) * scale, scales float32
    [vocab, hidden/block], i.e. exactly the layout GatherBlockQuantized reads for uint8 data with
    ``bits=8`` (data [vocab, hidden], quantize_axis 1, absent zero points = 128; ORT's
    ContribOperators.md). ORT's ``MatMulNBitsQuantizer`` quantises Gathers at 4 bits only, hence
    this helper.

    Args:
        emb: :func:`find_embedding_gather` of the fp32 graph; block_size: weights per scale, one of
            the sizes GatherBlockQuantized accepts (a power of 2, >= 16; checked by the caller).
    Raises:
        ValueError: ``hidden`` is not a multiple of ``block_size`` (a bug of the caller, who checks it).
    """
    graph = model.graph
    init = next(t for t in graph.initializer if t.name == emb.table)
    table = numpy_helper.to_array(init).astype(np.float32)
    vocab, hidden = table.shape
    if hidden % block_size:
        raise ValueError(f"hidden {hidden} is not a multiple of block_size {block_size}")
    blocks = hidden // block_size
    codes = np.zeros((vocab, blocks, block_size), np.uint8)
    scales = np.zeros((vocab, blocks), np.float32)
    zero_points = np.zeros((vocab, blocks), np.uint8)  # unused when symmetric
    # The kernel quantises a MatMul weight B [K, N] (row-major) in blocks along K and writes the
    # codes and scales per output column n. With B = E^T (K = hidden, N = vocab), column n is
    # vocabulary row n: the codes come out [vocab, blocks, block], rows of E. Arguments as ORT's
    # MatMulNBitsQuantizer passes them: (dst, src, scales, zero_points, block_size, N, K, symmetric).
    quantize_matmul_8bits(codes, np.ascontiguousarray(table.T), scales, zero_points, block_size, vocab, hidden, True)
    data, scale = _int8_names(emb.table)
    # [vocab, blocks, block] -> [vocab, hidden]: the same bytes, the 2-D data GatherBlockQuantized reads
    graph.initializer.extend(
        [numpy_helper.from_array(codes.reshape(vocab, hidden), data), numpy_helper.from_array(scales, scale)]
    )
    gather = onnx.helper.make_node(
        "GatherBlockQuantized",
        # no zero points: GatherBlockQuantized's default for uint8 data is 2^(bits-1) = 128, the
        # kernel's symmetric zero point
        [data, emb.indices, scale],
        [emb.embedding],
        name=emb.node,
        domain="com.microsoft",
        bits=8,
        block_size=block_size,
        gather_axis=0,
        quantize_axis=1,
    )
    # replaced where it stood: it reads only an initializer and a graph input, so the order stays
    # topological (matched by output too, in case the name is empty or shared)
    old = next(n for n in graph.node if n.name == emb.node and emb.embedding in n.output)
    position = list(graph.node).index(old)
    graph.node.remove(old)
    graph.node.insert(position, gather)
    if not any(emb.table in n.input for n in graph.node):
        graph.initializer.remove(init)
    # a node of a domain the model does not import fails onnx.checker and session load; ORT's
    # contrib operators are all registered at version 1 of com.microsoft
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))


#: int8 codes: uint8 with zero point 128, so a code c means (c - 128) * scale (symmetric, |c - 128| <= 127).
INT8_ZERO_POINT = 128
_ROWWISE = "int8_rowwise"


def _int8_names(weight: str) -> tuple[str, str]:
    """Names of the codes and scales initializers that replace MatMul weight ``weight`` in the int8 graph."""
    return f"{weight}_Q8", f"{weight}_Q8_scales"


def _rowwise_constants(graph: onnx.GraphProto) -> None:
    """The scalar initializers the row-wise int8 nodes read (added once).

    ``zero_point`` uint8 128 (MatMulInteger's zero points: same type as its operands) and its
    float32 twin; ``qmax`` 127.0 (symmetric codes); ``tiny`` float32's smallest normal (the floor of
    a row scale); ``code_min``/``code_max`` 0.0/255.0 (uint8's range, clipped in float before the
    Cast); ``last_axis`` int64 [-1] (ReduceMax-18 and Unsqueeze-13 take axes as an int64 input).
    """
    if any(t.name == f"{_ROWWISE}_zero_point" for t in graph.initializer):
        return
    f32 = np.float32
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(INT8_ZERO_POINT, np.uint8), f"{_ROWWISE}_zero_point"),
            numpy_helper.from_array(np.array(INT8_ZERO_POINT, f32), f"{_ROWWISE}_zero_point_f"),
            numpy_helper.from_array(np.array(127.0, f32), f"{_ROWWISE}_qmax"),
            # an all-zero row has amax 0: the scale is floored here so x / scale is 0, not 0/0 = NaN
            numpy_helper.from_array(np.array(np.finfo(f32).tiny, f32), f"{_ROWWISE}_tiny"),
            numpy_helper.from_array(np.array(0.0, f32), f"{_ROWWISE}_code_min"),
            numpy_helper.from_array(np.array(255.0, f32), f"{_ROWWISE}_code_max"),
            numpy_helper.from_array(np.array([-1], np.int64), f"{_ROWWISE}_last_axis"),
        ]
    )


def quantize_weight_per_column_int8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric 8-bit codes of a MatMul weight, one scale per output column.

    Args:
        weight: float32 [K, N] (MatMul's B: K inputs, N outputs).
    Returns:
        ``(codes, scales)``: codes uint8 [K, N] with zero point 128, i.e. weight ~ (codes - 128) *
        scales, |codes - 128| <= 127 (round half to even); scales float32 [N] = max_k |W[k, n]| / 127
        (1.0 for an all-zero column, whose codes are then all 128).
    """
    weight = np.asarray(weight, np.float32)
    amax = np.abs(weight).max(axis=0)
    # 1.0 for a zero column avoids 0/0; its codes are 128 (value 0) whatever the scale
    scales = np.where(amax > 0, amax / np.float32(127.0), np.float32(1.0)).astype(np.float32)
    # np.rint rounds half to even, as ONNX Round does for the activations; -127..127 keeps the
    # codes symmetric (no -128), so the zero point 128 maps them to 1..255
    codes = np.clip(np.rint(weight / scales), -127, 127) + INT8_ZERO_POINT
    return codes.astype(np.uint8), scales


def quantize_matmuls_rowwise_int8(model: onnx.ModelProto) -> int:
    """Every MatMul with a 2-D constant weight -> 8-bit ``MatMulInteger`` with a scale per row, in place.

    W8A8 with dynamic per-token activation scales and per-output-channel weight scales, in
    standard ONNX operators (LLM.int8's vector-wise quantisation without its outlier split:
    Dettmers et al. 2022, arXiv:2208.07339, sec. 3.1; SmoothQuant's "per-token" activation and
    "per-channel" weight granularity, Xiao et al. 2023, arXiv:2211.10438, sec. 2). For ``y = x @ W``,
    x float32 [..., K], W float32 [K, N]:

    * W -> codes uint8 [K, N] and scales s_w float32 [N] (:func:`quantize_weight_per_column_int8`);
    * per row of x (each token of each sequence), at run time: s_x = max(|x|) / 127 over K (at least
      float32's smallest normal), q = uint8(clip(round(x / s_x) + 128, 0, 255));
    * ``y = float(MatMulInteger(q, codes, 128, 128)) * s_x * s_w``.

    MatMulInteger accumulates in int32, exactly, so a row's result depends on that row alone: the
    graph is batch-invariant bit for bit (a scale shared by the batch, as ``quantize_dynamic``'s
    ``DynamicQuantizeLinear``, is not). Both operands are uint8 on purpose: ONNX Runtime's u8 x s8
    kernels on x86 CPUs without AVX-VNNI pair products in int16 (``vpmaddubsw``), which saturates
    with full-range 8-bit weights (ORT's quantisation docs, "reduce_range"); u8 x u8 does not (on
    the 109 M bench model, u8 x s8 had twice the KL of u8 x u8 against fp32).
    Nodes reading the same x share one quantisation of it (q/k/v, gate/up).

    A 2-D initializer weight is required: a weight computed at run time (or a batched 3-D one) is
    left as an fp32 MatMul. Run it after :func:`materialize_transposed_weights`, so the tied lm_head
    is one of them.

    Returns:
        The number of MatMuls replaced. Initializers ``<W>_Q8`` (codes) and ``<W>_Q8_scales`` replace
        each weight ``<W>`` (``<W>`` is dropped when nothing else reads it).
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    _rowwise_constants(graph)
    c = {k: f"{_ROWWISE}_{k}" for k in ("zero_point", "zero_point_f", "qmax", "tiny", "code_min", "code_max")}
    # The node list is rebuilt in order: each activation's quantisation nodes go just before the
    # first MatMul reading it (x is produced earlier), so the result stays topologically sorted.
    nodes: list[onnx.NodeProto] = []
    quantized: dict[str, tuple[str, str]] = {}  # x -> (codes, row scales)
    replaced, dropped = 0, set()
    for node in list(graph.node):
        weight = inits.get(node.input[1]) if node.op_type == "MatMul" else None
        if weight is None or len(weight.dims) != 2:
            nodes.append(node)
            continue
        x, name = node.input[0], node.name or node.output[0]
        if x not in quantized:
            p = f"{_ROWWISE}/{len(quantized)}"
            make = onnx.helper.make_node
            # s_x = max(max|x| / 127, tiny) over the last axis (K): one scale per token, [..., 1]
            # (keepdims) so it broadcasts over K here and over N after the MatMul. Then q = uint8 of
            # clip(round(x / s_x) + 128, 0, 255): Round is half-to-even (ONNX Round), like the
            # weights' np.rint; the Clip comes before the Cast because ONNX's Cast of an
            # out-of-range float to an integer type is undefined (Cast spec), not saturating.
            nodes += [
                make("Abs", [x], [f"{p}/abs"], name=f"{p}/Abs"),
                make(
                    "ReduceMax", [f"{p}/abs", f"{_ROWWISE}_last_axis"], [f"{p}/amax"], name=f"{p}/ReduceMax", keepdims=1
                ),
                make("Div", [f"{p}/amax", c["qmax"]], [f"{p}/scale_raw"], name=f"{p}/DivMax"),
                make("Max", [f"{p}/scale_raw", c["tiny"]], [f"{p}/scale"], name=f"{p}/Max"),
                make("Div", [x, f"{p}/scale"], [f"{p}/scaled"], name=f"{p}/Div"),
                make("Round", [f"{p}/scaled"], [f"{p}/rounded"], name=f"{p}/Round"),
                make("Add", [f"{p}/rounded", c["zero_point_f"]], [f"{p}/shifted"], name=f"{p}/Add"),
                make("Clip", [f"{p}/shifted", c["code_min"], c["code_max"]], [f"{p}/clipped"], name=f"{p}/Clip"),
                make("Cast", [f"{p}/clipped"], [f"{p}/codes"], name=f"{p}/Cast", to=onnx.TensorProto.UINT8),
            ]
            quantized[x] = (f"{p}/codes", f"{p}/scale")
        codes, scales = quantize_weight_per_column_int8(numpy_helper.to_array(weight))
        wq, ws = _int8_names(weight.name)
        graph.initializer.extend([numpy_helper.from_array(codes, wq), numpy_helper.from_array(scales, ws)])
        q, sx = quantized[x]
        out = node.output[0]
        # y = float(MatMulInteger(q, codes, 128, 128)) * s_x * s_w: scalar zero points (one per
        # tensor, MatMulInteger spec); the int32 sums are converted to float32 before the scales
        # ([..., 1] per row, [N] per column) apply. The last Mul writes the MatMul's output name,
        # so its consumers are not rewired.
        nodes += [
            onnx.helper.make_node(
                "MatMulInteger",
                [q, wq, c["zero_point"], c["zero_point"]],
                [f"{out}/int32"],
                name=f"{name}/MatMulInteger",
            ),
            onnx.helper.make_node(
                "Cast", [f"{out}/int32"], [f"{out}/acc"], name=f"{name}/Cast", to=onnx.TensorProto.FLOAT
            ),
            onnx.helper.make_node("Mul", [f"{out}/acc", sx], [f"{out}/row_scaled"], name=f"{name}/MulRowScale"),
            onnx.helper.make_node("Mul", [f"{out}/row_scaled", ws], [out], name=f"{name}/MulColumnScale"),
        ]
        dropped.add(weight.name)
        replaced += 1
    del graph.node[:]
    graph.node.extend(nodes)
    # a replaced weight that some other node still reads stays
    used = {i for n in graph.node for i in n.input}
    for init in [t for t in graph.initializer if t.name in dropped and t.name not in used]:
        graph.initializer.remove(init)
    return replaced


def share_tied_embedding_int8(model: onnx.ModelProto, tied: TiedEmbedding) -> Optional[str]:
    """Make the int8 embedding lookup read the lm_head's row-wise int8 weights, in place.

    After :func:`quantize_matmuls_rowwise_int8` the lm_head is ``MatMulInteger(q, C, 128, 128)`` with
    codes C uint8 [hidden, vocab] and one scale per vocabulary entry s float32 [vocab]: the tied
    table E [vocab, hidden] is ~ (C^T - 128) * s[:, None]. The embedding becomes
    ``(float(Gather(Transpose(C), ids)) - 128) * Unsqueeze(Gather(s, ids), -1)`` in standard
    operators; ONNX Runtime folds the constant Transpose when it loads the session, so the file
    holds the table once. The embedding's fp32 table is dropped.

    Args:
        model: the graph after :func:`quantize_matmuls_rowwise_int8`; tied: :func:`find_tied_embedding`
            of its fp32 graph.
    Returns:
        None when shared, else why not (the graph is then left as it was).
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    # the lm_head's weight is tied.transposed (materialize_transposed_weights)
    codes, scales = (inits.get(name) for name in _int8_names(tied.transposed))
    if codes is None or scales is None:
        return f"no row-wise int8 codes of the lm_head weight {tied.transposed!r}"
    if list(codes.dims) != [tied.hidden, tied.vocab]:
        return f"the lm_head codes {codes.name!r} are {list(codes.dims)}, not [hidden, vocab] = [{tied.hidden}, {tied.vocab}]"
    p = f"{tied.gather_node}_shared"
    make = onnx.helper.make_node
    # C [hidden, vocab] -> [vocab, hidden] so a Gather on axis 0 reads one vocabulary entry per id;
    # the codes are cast to float32 before the zero point is subtracted (in uint8, codes below 128
    # cannot go negative); the row scales s[ids] (B, T) get a trailing axis to broadcast over
    # hidden. The Gather keeps the old lookup's node name.
    new = [
        make("Transpose", [codes.name], [f"{p}/table"], name=f"{p}/Transpose", perm=[1, 0]),
        make("Gather", [f"{p}/table", tied.indices], [f"{p}/codes"], name=tied.gather_node, axis=0),
        make("Cast", [f"{p}/codes"], [f"{p}/codes_f"], name=f"{p}/Cast", to=onnx.TensorProto.FLOAT),
        make("Sub", [f"{p}/codes_f", f"{_ROWWISE}_zero_point_f"], [f"{p}/centred"], name=f"{p}/Sub"),
        make("Gather", [scales.name, tied.indices], [f"{p}/row_scale"], name=f"{p}/GatherScale", axis=0),
        make("Unsqueeze", [f"{p}/row_scale", f"{_ROWWISE}_last_axis"], [f"{p}/row_scale_1"], name=f"{p}/Unsqueeze"),
        make("Mul", [f"{p}/centred", f"{p}/row_scale_1"], [tied.embedding], name=f"{p}/Mul"),
    ]
    _replace_embedding_nodes(graph, tied, new)
    return None


#: Name of the Reshape that enforces the decoder's mask contract: ONNX Runtime's error for a wrong
#: mask length names this node.
MASK_CHECK_NODE = "attention_mask_length_must_equal_past_plus_sequence_length"


def add_mask_length_check(model: onnx.ModelProto) -> None:
    """Make the decoder refuse an ``attention_mask`` whose length is not ``past + T``, in place.

    Every consumer of the ``attention_mask`` input reads ``Reshape(attention_mask, [B, P + T])``
    instead, with B and T from ``input_ids`` and P from ``past_key_values.0.key``: the same tensor
    when the contract holds, and a run-time error otherwise (ONNX Runtime: "Non-zero status code
    returned while running Reshape node. Name:'attention_mask_length_must_equal_past_plus_sequence_length'
    ... The input tensor cannot be reshaped to the requested shape"). Without it a (B, 1) mask is
    silently broadcast over every cache slot (case C3), and GroupQueryAttention reads a shorter mask
    as a preallocated ("static") cache.

    Reshape checks the element count only: a mask of B * (P + T) elements in another 2-D shape
    (e.g. (1, 2 (P + T)) for B = 2) is reshaped, not refused.

    Args:
        model: an exported decoder with the inputs of :mod:`prodip.base.onnx_io`.
    Raises:
        ValueError: the graph has no ``attention_mask`` or no ``past_key_values.0.key`` input.
    """
    graph = model.graph
    checked = "attention_mask_checked"
    names = {i.name for i in graph.input}
    if "attention_mask" not in names or "past_key_values.0.key" not in names:
        raise ValueError("add_mask_length_check: the graph lacks attention_mask or past_key_values.0.key")

    def const(name: str, value: int) -> onnx.NodeProto:
        return onnx.helper.make_node(
            "Constant", [], [name], value=onnx.helper.make_tensor(name, onnx.TensorProto.INT64, [1], [value])
        )

    p = "mask_check/"
    # target shape [B, P + T] (int64 [2]): B = ids_shape[0:1], T = ids_shape[1:2], P = the past
    # axis of (B, Hkv, P, Dh), read with Shape-15's start/end (an int64 [1], no Gather needed).
    # Every entry is positive (B, T >= 1): no 0 or -1, so Reshape infers nothing from the mask.
    nodes = [
        onnx.helper.make_node("Shape", ["input_ids"], [p + "ids_shape"]),
        onnx.helper.make_node("Shape", ["past_key_values.0.key"], [p + "past"], start=2, end=3),
        const(p + "zero", 0),
        const(p + "one", 1),
        const(p + "two", 2),
        onnx.helper.make_node("Slice", [p + "ids_shape", p + "zero", p + "one"], [p + "batch"]),
        onnx.helper.make_node("Slice", [p + "ids_shape", p + "one", p + "two"], [p + "seq"]),
        onnx.helper.make_node("Add", [p + "past", p + "seq"], [p + "total"]),
        onnx.helper.make_node("Concat", [p + "batch", p + "total"], [p + "shape"], axis=0),
        onnx.helper.make_node("Reshape", ["attention_mask", p + "shape"], [checked], name=MASK_CHECK_NODE),
    ]
    # rewire before inserting, so the check itself still reads the raw input
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == "attention_mask":
                node.input[i] = checked
    # at the front: the check reads graph inputs only, and every former mask reader comes after it
    for i, node in enumerate(nodes):
        graph.node.insert(i, node)


def drop_unused_outputs(
    model: onnx.ModelProto, op_types: tuple[str, ...] = ("SkipSimplifiedLayerNormalization",)
) -> int:
    """Blank the optional outputs of ``op_types`` nodes that nothing reads (a kernel then skips them), in place.

    The exporter names every declared output. SkipSimplifiedLayerNormalization (onnxruntime
    docs/ContribOperators.md) has ``output`` and the optional ``mean``, ``inv_std_var`` and
    ``input_skip_bias_sum``; the decoder reads outputs 0 and 3 (:mod:`prodip.export.contrib`).
    An empty name is how ONNX marks an optional output as absent.

    Returns:
        The number of outputs blanked.
    """
    used = {name for node in model.graph.node for name in node.input} | {o.name for o in model.graph.output}
    n = 0
    for node in model.graph.node:
        if node.op_type in op_types:
            for i in range(1, len(node.output)):  # output 0 is required by the op's schema
                if node.output[i] and node.output[i] not in used:
                    node.output[i] = ""
                    n += 1
    return n


def fold_rotary_into_attention(model: onnx.ModelProto) -> int:
    """Let each ``GroupQueryAttention`` rotate its own queries and keys from the packed q/k/v, in place.

    The contrib graph computes ``Split(qkv) -> RotaryEmbedding(q), RotaryEmbedding(k) -> GQA(q, k,
    v)``; this rewrites it as ``GQA(qkv, '', '', ..., cos_cache, sin_cache, position_ids)`` with
    ``do_rotary=1`` (onnxruntime docs/ContribOperators.md, GroupQueryAttention: packed QKV when
    ``key`` and ``value`` are omitted; inputs 7-9), the form onnxruntime-genai's model builder
    writes: three nodes fewer per layer (bench/results/genai_builder_rotary_*).

    The rotation is the same (rotate-half, the same cos/sin tables), with one condition on the
    positions. ONNX Runtime 1.32's CPU kernel rotates a decode step (T = 1) at ``position_ids``
    (B, 1), but a prompt (T > 1) at ``position_ids[0, 0] + t`` for every row: right for every row
    whose positions are consecutive from the same start, which is what onnxruntime-genai feeds
    (positions are column indices, DefaultPositionInputs::CreateAndInitializePositionIDs; its
    padding, on the right, is never read: :func:`right_padded_attention`) and what prodip's serve
    engine feeds (no padding, every row of a batch at the same length), and wrong for a
    left-padded prompt numbered from its first real token (the contract graph's callers may send
    one), so the contract graph keeps the explicit RotaryEmbedding.
    Measured: tests/export/test_runtime_configs.py (prompt and decode, batch 1 and 2, against the
    contract graph).

    Args:
        model: a contrib-graph decoder (:mod:`prodip.export.contrib`), after quantisation.
    Returns:
        The number of GroupQueryAttention nodes folded: one per layer; 0 for an fp16 graph, whose
        contract graph rounds the rotated q/k to fp16 (folding would change its greedy ids).
    """
    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}
    folded = 0
    for node in graph.node:
        # GroupQueryAttention inputs (ContribOperators.md): 0 query (or packed qkv), 1 key, 2 value,
        # 3 past_key, 4 past_value, 5 seqlens_k, 6 total_sequence_length, 7 cos_cache, 8 sin_cache,
        # 9 position_ids, 10 attention_bias. Slots 7-9 must exist (the contrib graph writes them
        # empty ahead of its bias) and be empty: run this before right_padded_attention, which
        # drops trailing empty inputs.
        if node.op_type != "GroupQueryAttention" or _attr(node, "do_rotary", 0) or len(node.input) < 10:
            continue
        if any(node.input[i] for i in (7, 8, 9)):
            continue
        rq, rk = producer.get(node.input[0]), producer.get(node.input[1])
        if rq is None or rk is None or not rq.op_type == rk.op_type == "RotaryEmbedding":
            continue
        # RotaryEmbedding(input, position_ids, cos_cache, sin_cache): GQA takes one set for q and k,
        # so both must read the same three; its rotation here is non-interleaved (rotate-half)
        if list(rq.input[1:4]) != list(rk.input[1:4]) or _attr(rq, "interleaved", 0) or _attr(rk, "interleaved", 0):
            continue
        # q, k, v straight from one Split. An fp16 graph casts them to fp32 first, and there the
        # contract graph's rotated q/k are rounded to fp16 where GroupQueryAttention's are not:
        # logits move by ~1e-3 and greedy ids can differ from the contract graph's, so it keeps
        # its RotaryEmbedding nodes.
        split = producer.get(rq.input[0])
        if split is None or split.op_type != "Split" or list(split.output) != [rq.input[0], rk.input[0], node.input[2]]:
            continue
        position_ids, cos_cache, sin_cache = rq.input[1:4]
        # query = the packed qkv the Split read; key and value empty select GQA's packed mode
        node.input[0], node.input[1], node.input[2] = split.input[0], "", ""
        # the RotaryEmbedding tables are already GQA's layout: (max_position_embeddings, Dh / 2)
        node.input[7], node.input[8], node.input[9] = cos_cache, sin_cache, position_ids
        # replace, not append: the contrib graph sets do_rotary=0 explicitly, and a repeated
        # attribute name is an invalid node
        attrs = [a for a in node.attribute if a.name not in ("do_rotary", "rotary_interleaved")]
        del node.attribute[:]
        node.attribute.extend(attrs)
        node.attribute.extend(
            [onnx.helper.make_attribute("do_rotary", 1), onnx.helper.make_attribute("rotary_interleaved", 0)]
        )
        # The Split and RotaryEmbedding nodes are left unread, not removed: shared_buffer_graph's
        # liveness pass drops them.
        folded += 1
    return folded


def right_padded_attention(model: onnx.ModelProto) -> int:
    """Let every ``GroupQueryAttention`` mask padding by sequence length, as the model builder's graphs do, in place.

    The contrib graph gives GroupQueryAttention every row at full length (``seqlens_k = S - 1``)
    and an ``attention_bias`` (B, 1, T, S) built from the training model's boolean mask, so any
    padding works. ONNX Runtime's CPU kernel takes a slower path with a bias: at a 600-slot
    context one decode call costs 289 us against 213 us without (12 heads, ``head_dim`` 64,
    ONNX Runtime 1.32), ~0.9 ms per step over 12 layers. onnxruntime-genai pads a batch of prompts
    on the right (``PadInputs``, src/models/model.cpp: ``pad_right_`` true) and keeps each row's
    mask as prompt, padding, then generated tokens, which is what GroupQueryAttention's own
    sequence lengths express (onnxruntime docs/ContribOperators.md: ``seqlens_k`` = total
    sequence length - 1 per row): ``seqlens_k = sum(attention_mask) - 1``, ``total_sequence_length``
    = the mask's length, no bias. A row's new token is then written at slot ``seqlens_k`` over its
    first padding slot, and the slots it reads are its real tokens, so right-padded and unpadded
    rows compute what the contract graph computes; a left-padded row does not (it would read its
    padding), which onnxruntime-genai never feeds.

    The nodes that computed the old ``seqlens_k``, ``total_sequence_length`` and bias are left
    unread, not removed (:func:`shared_buffer_graph` prunes them).

    Args:
        model: a contrib-graph decoder (:mod:`prodip.export.contrib`) reading ``attention_mask``.
    Returns:
        The number of GroupQueryAttention nodes rewired.
    """
    graph = model.graph
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    if not gqa:
        return 0
    p = "genai_lengths/"
    int32 = onnx.TensorProto.INT32
    graph.initializer.extend(
        [
            onnx.helper.make_tensor(p + "last", onnx.TensorProto.INT64, [1], [-1]),
            onnx.helper.make_tensor(p + "one", int32, [], [1]),
            onnx.helper.make_tensor(p + "scalar", onnx.TensorProto.INT64, [0], []),
        ]
    )
    # GroupQueryAttention's seqlens_k and total_sequence_length are int32 (type constraint M), the
    # first (B,), the second a scalar: the int64 mask is cast before the sum, and the mask length
    # S (Shape-15 start/end: int64 [1]) is cast and reshaped to shape [] (an empty shape tensor
    # means a scalar, ONNX Reshape).
    nodes = [
        onnx.helper.make_node("Cast", ["attention_mask"], [p + "mask"], to=int32),
        onnx.helper.make_node("ReduceSum", [p + "mask", p + "last"], [p + "count"], keepdims=0),  # (B,)
        onnx.helper.make_node("Sub", [p + "count", p + "one"], [p + "seqlens_k"]),
        onnx.helper.make_node("Shape", ["attention_mask"], [p + "S"], start=1, end=2),
        onnx.helper.make_node("Cast", [p + "S"], [p + "S32"], to=int32),
        onnx.helper.make_node("Reshape", [p + "S32", p + "scalar"], [p + "total"]),  # ()
    ]
    for node in gqa:
        node.input[5], node.input[6] = p + "seqlens_k", p + "total"
        if len(node.input) > 10:
            node.input[10] = ""  # attention_bias: no bias, the kernel's faster path
        while node.input and not node.input[-1]:  # drop the trailing empty optional inputs
            del node.input[-1]
    for i, node in enumerate(nodes):  # at the front: they read a graph input only
        graph.node.insert(i, node)
    return len(gqa)


def shared_buffer_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder as onnxruntime-genai runs it with ``past_present_share_buffer``, in place.

    With a shared buffer, onnxruntime-genai allocates each layer's cache once, ``(B, Hkv,
    max_length, Dh)``, passes it as ``past_key_values.*`` and binds the same memory to
    ``present.*``; ``GroupQueryAttention`` then writes the new keys and values into it at
    ``seqlens_k`` and reads slots ``[0, seqlens_k]`` only (onnxruntime
    docs/ContribOperators.md, GroupQueryAttention's past_key: "When past_key uses same tensor as
    present_key (k-v cache), it is of length max_sequence_length"). No cache is copied per step:
    at a 512-token context int4 decoded at 0.98x the model builder's speed, against 0.54x / 0.42x
    with per-step copies (bench/results/genai_builder_*ctx512*), and with the two rewrites below at
    1.02x / 0.98x (bench/results/genai_builder_rotary_ctx512_cpu_2026-11-30.md). This graph drops
    the two things that copy or refuse such a buffer: the mask-length check (:func:`add_mask_length_check`: the buffer is longer than
    ``past + T`` by design) and the ``Where`` that zeroes masked cache slots before attention
    (it copies every cache tensor each step). Both protect callers that build caches themselves;
    here onnxruntime-genai owns the buffers, and slots past the mask are never read. The
    contract graph (the variant's own file) keeps both for every other runtime. The rotary
    embedding moves into GroupQueryAttention (:func:`fold_rotary_into_attention`), valid for the
    positions onnxruntime-genai feeds, and padding is masked by sequence length, not a bias
    (:func:`right_padded_attention`: onnxruntime-genai pads on the right).

    Args:
        model: a contrib-graph decoder (``GroupQueryAttention``) after :func:`add_mask_length_check`.
    Returns:
        ``model``, edited.
    Raises:
        ValueError: not a GroupQueryAttention decoder, or no mask-length check to remove.
    """
    graph = model.graph
    if not any(n.op_type == "GroupQueryAttention" for n in graph.node):
        raise ValueError("shared_buffer_graph: the decoder has no GroupQueryAttention (standard graph)")
    check = next((n for n in graph.node if n.name == MASK_CHECK_NODE), None)
    if check is None:
        raise ValueError(f"shared_buffer_graph: no {MASK_CHECK_NODE!r} node")
    past = {i.name: i.type.tensor_type.elem_type for i in graph.input if i.name.startswith("past_key_values.")}
    producer = {out: node for node in graph.node for out in node.output}

    def cache_input(name: str) -> Optional[str]:
        """The past input that ``name`` is, through Where(keep, x, 0) and Cast (fp16 graphs cast the
        cache to float16 and back around the Where), when the chain's last type is the input's.

        GroupQueryAttention writes in place only when its past_key/past_value IS the bound buffer;
        any node in between hands it a copy. The type check keeps the dtype GQA reads unchanged
        when the Casts are bypassed."""
        # walking up, the first Cast met is the last one applied: the type GQA reads
        last_cast = None
        while name not in past:
            node = producer.get(name)
            if node is None or node.op_type not in ("Cast", "Where"):
                return None
            if node.op_type == "Cast" and last_cast is None:
                last_cast = _attr(node, "to")
            # Where(condition, X, Y): the cache is X, the zeros Y
            name = node.input[1] if node.op_type == "Where" else node.input[0]
        return name if last_cast in (None, past[name]) else None

    # this order: right_padded_attention drops GQA's trailing empty inputs, and
    # fold_rotary_into_attention needs its empty slots 7-9
    fold_rotary_into_attention(model)
    right_padded_attention(model)
    # the check's readers read the raw mask: P, read from the buffer's shape, is its full length,
    # so the check would refuse every call (the buffer is longer than past + T by design)
    rename = {check.output[0]: "attention_mask"}
    nodes = [node for node in graph.node if node is not check]
    for node in nodes:
        if node.op_type == "GroupQueryAttention":  # past_key, past_value: the buffer itself
            for i in (3, 4):
                source = cache_input(node.input[i]) if len(node.input) > i and node.input[i] else None
                if source is None:
                    raise ValueError(f"shared_buffer_graph: {node.name} input {i} is not a past_key_values input")
                node.input[i] = source
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
    wanted = {o.name for o in graph.output}
    # drop what fed only the removed nodes (the mask slice the Where read, the check's shape) and
    # what the two rewrites left unread (Split, RotaryEmbedding, the bias and the old seqlens_k);
    # repeated until nothing changes, as removing a node can orphan its producers
    while True:
        used = wanted | {name for node in nodes for name in node.input}
        live = [node for node in nodes if any(out in used for out in node.output if out)]
        if len(live) == len(nodes):
            break
        nodes = live
    del graph.node[:]
    graph.node.extend(nodes)
    used = {name for node in nodes for name in node.input} | wanted
    kept = [t for t in graph.initializer if t.name in used]  # the removed nodes' constants go too
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return model


#: The lowered embedding lookup's node names start with the GatherBlockQuantized node's name and this.
LOWERED_GBQ = "_dequantized_gather"


def _uint4_codes(init: onnx.TensorProto) -> tuple[np.ndarray, int]:
    """A 4-bit initializer's codes as unsigned uint8 values 0..15 and the offset added to them.

    UINT4 codes are returned as they are (offset 0); INT4 codes c (-8..7) as c + 8 (offset 8), so
    that ``(c + 8) - (z + 8) == c - z``: one unsigned layout for both.
    """
    # to_array gives ml_dtypes int4/uint4 arrays, which cannot hold c + 8: widen first
    values = numpy_helper.to_array(init).astype(np.int16)
    offset = 8 if init.data_type == onnx.TensorProto.INT4 else 0
    return (values + offset).astype(np.uint8), offset


def _pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 values 0..15 [..., n] -> uint8 [..., ceil(n/2)], element 2i in the low nibble (ORT's packing)."""
    # an odd count leaves the last byte's high nibble 0 (GatherBlockQuantized's zero points are
    # [rows, ceil(blocks / 2)]); unpack() slices it off again
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


def _lower_gbq(graph: onnx.GraphProto, node: onnx.NodeProto, inits: dict, producer: dict) -> list[onnx.NodeProto]:
    """The standard-op nodes computing GatherBlockQuantized ``node``'s output (see
    :func:`lower_gather_block_quantized`); new initializers are appended to ``graph``.

    ``inits`` maps initializer names to tensors, ``producer`` output names to nodes (to find the
    shared tied table's Reshape). The output is float32 (*ids_shape, hidden), with float32 scales
    (what prodip's quantisers write).

    Raises:
        ValueError: another gather/quantize axis, a data type other than uint8/INT4/UINT4, or
            scales whose blocks do not cover the row.
    """
    make = onnx.helper.make_node
    # defaults as in the GatherBlockQuantized schema: bits 4, block_size 128, gather_axis 0,
    # quantize_axis 1
    bits, block = _attr(node, "bits", 4), _attr(node, "block_size", 128)
    if _attr(node, "gather_axis", 0) != 0 or _attr(node, "quantize_axis", 1) not in (1, -1):
        raise ValueError(f"{node.name}: only gather_axis 0 and quantize_axis 1 are lowered")
    data, ids, scales = node.input[0], node.input[1], node.input[2]
    zero_points = node.input[3] if len(node.input) > 3 and node.input[3] else None
    p = f"{node.name}{LOWERED_GBQ}"
    init = inits.get(data)  # None for the shared tied table: a Reshape's output, not an initializer
    # INT4/UINT4 tensors are repacked as uint8 bytes, two codes per byte, low nibble first: the
    # layout unpack() decodes, and GatherBlockQuantized's own for uint8 data with bits 4
    if init is not None and init.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        codes, offset = _uint4_codes(init)
        data = f"{p}/packed_codes"
        graph.initializer.append(numpy_helper.from_array(_pack_nibbles(codes), data))
        if zero_points:  # the same type as data (spec), so the same offset, which cancels in code - zp
            zps, _ = _uint4_codes(inits[zero_points])
            zero_points = f"{p}/packed_zero_points"
            graph.initializer.append(numpy_helper.from_array(_pack_nibbles(zps), zero_points))
        # the spec's default for int4/uint4 data is 0; INT4 codes are shifted by 8, so 0 is 8
        default_zero_point = 8 if offset else 0
    elif init is not None and init.data_type != onnx.TensorProto.UINT8:
        raise ValueError(f"{node.name}: data type {init.data_type} is not lowered")
    else:
        default_zero_point = 1 << (bits - 1)  # the spec's default for uint8 data: 2^(bits-1)
    # blocks per row from the scales [vocab, ceil(hidden / block)], which counts a partial last block
    scale_init = inits.get(scales)
    blocks = int(scale_init.dims[-1]) if scale_init is not None else None
    if init is not None:  # uint8 with bits 4 holds two codes per byte; INT4/UINT4 dims count codes
        hidden = int(init.dims[-1]) * (2 if init.data_type == onnx.TensorProto.UINT8 and bits == 4 else 1)
    else:  # the shared tied table: Reshape(MatMulNBits B, [vocab, hidden / 2])
        shape = inits[producer[data].input[1]]
        hidden = int(numpy_helper.to_array(shape)[-1]) * (2 if bits == 4 else 1)
    blocks = blocks or hidden // block

    def const(name: str, value: Any, dtype: Any = np.int64) -> str:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value, dtype), f"{p}/{name}"))
        return f"{p}/{name}"

    last = const("last_axis", [-1])  # int64 [-1]: Unsqueeze-13 and Slice take axes as inputs
    sixteen = const("sixteen", 16.0, np.float32) if bits == 4 else None
    # the ids' shape (e.g. [B, T]) heads every target shape below: rows are gathered per id
    new = [make("Shape", [ids], [f"{p}/ids_shape"], name=f"{p}/Shape")]

    def rows_float(src: str, tag: str) -> str:
        """Gather rows of ``src`` by the ids, as float32 (exact for uint8 values): nibbles are then
        split and zero points subtracted in float arithmetic, over the ops listed in
        :func:`lower_gather_block_quantized`."""
        new.append(make("Gather", [src, ids], [f"{p}/{tag}_rows"], name=f"{p}/Gather_{tag}", axis=0))
        new.append(
            make("Cast", [f"{p}/{tag}_rows"], [f"{p}/{tag}_f"], name=f"{p}/Cast_{tag}", to=onnx.TensorProto.FLOAT)
        )
        return f"{p}/{tag}_f"

    def unpack(x: str, tag: str, n: int) -> str:
        """float32 packed bytes [..., k] -> float32 nibbles [..., n] (n <= 2k), low nibble first.

        hi = floor(x / 16), lo = x - 16 hi (exact in float32 for 0..255); lo and hi are stacked on
        a new last axis, [..., k, 2], and reshaped to [*ids_shape, 2k], which interleaves them as
        element 2i (low), 2i+1 (high); the Slice drops the padding nibble of an odd count."""
        new.extend(
            [
                make("Div", [x, sixteen], [f"{p}/{tag}_div"], name=f"{p}/Div_{tag}"),
                make("Floor", [f"{p}/{tag}_div"], [f"{p}/{tag}_hi"], name=f"{p}/Floor_{tag}"),
                make("Mul", [f"{p}/{tag}_hi", sixteen], [f"{p}/{tag}_hi16"], name=f"{p}/Mul16_{tag}"),
                make("Sub", [x, f"{p}/{tag}_hi16"], [f"{p}/{tag}_lo"], name=f"{p}/SubLo_{tag}"),
                make("Unsqueeze", [f"{p}/{tag}_lo", last], [f"{p}/{tag}_lo1"], name=f"{p}/UnsqueezeLo_{tag}"),
                make("Unsqueeze", [f"{p}/{tag}_hi", last], [f"{p}/{tag}_hi1"], name=f"{p}/UnsqueezeHi_{tag}"),
                make(
                    "Concat",
                    [f"{p}/{tag}_lo1", f"{p}/{tag}_hi1"],
                    [f"{p}/{tag}_pairs"],
                    name=f"{p}/Concat_{tag}",
                    axis=-1,
                ),
                make(
                    "Concat",
                    [f"{p}/ids_shape", const(f"{tag}_tail", [-1])],
                    [f"{p}/{tag}_shape"],
                    name=f"{p}/Shape_{tag}",
                    axis=0,
                ),
                make(
                    "Reshape",
                    [f"{p}/{tag}_pairs", f"{p}/{tag}_shape"],
                    [f"{p}/{tag}_all"],
                    name=f"{p}/Reshape_{tag}",
                ),
                make(
                    "Slice",
                    [f"{p}/{tag}_all", const(f"{tag}_start", [0]), const(f"{tag}_end", [n]), last],
                    [f"{p}/{tag}_n"],
                    name=f"{p}/Slice_{tag}",
                ),
            ]
        )
        return f"{p}/{tag}_n"

    code_rows = rows_float(data, "codes")  # a tensor name (``codes`` above is the INT4 initializer's array)
    if bits == 4:
        code_rows = unpack(code_rows, "codes", hidden)
    # GBQ quantises a row in blocks of block_size; the last block may be partial (hidden 48, block 32:
    # 2 blocks). Pad the codes to whole blocks so they reshape to [..., blocks, block], and cut the
    # padding off the result; the padded codes are multiplied by the last block's scale and dropped.
    padded = blocks * block
    if padded < hidden:
        raise ValueError(f"{node.name}: {blocks} blocks of {block} do not cover {hidden} columns")
    if padded != hidden:
        pad = [const("pad_widths", [0, padded - hidden]), const("pad_value", 0.0, np.float32), last]
        new.append(make("Pad", [code_rows, *pad], [f"{p}/codes_padded"], name=f"{p}/PadBlocks", mode="constant"))
        code_rows = f"{p}/codes_padded"
    new.append(
        make(
            "Concat",
            [f"{p}/ids_shape", const("block_shape", [blocks, block])],
            [f"{p}/blocked_shape"],
            name=f"{p}/ShapeBlocked",
            axis=0,
        )
    )
    new.append(make("Reshape", [code_rows, f"{p}/blocked_shape"], [f"{p}/blocked"], name=f"{p}/ReshapeBlocked"))
    # zero points and scales are per block, [..., blocks]: a trailing axis broadcasts them over the
    # block's codes in [..., blocks, block]
    if zero_points:
        zp = rows_float(zero_points, "zero_points")
        if bits == 4:
            zp = unpack(zp, "zero_points", blocks)
        new.append(make("Unsqueeze", [zp, last], [f"{p}/zero_points_1"], name=f"{p}/UnsqueezeZeroPoints"))
        zp = f"{p}/zero_points_1"
    else:
        zp = const("default_zero_point", float(default_zero_point), np.float32)  # a scalar broadcasts
    # (code - zero_point) * scale, in this order and in float32: the kernel's computation
    new.append(make("Sub", [f"{p}/blocked", zp], [f"{p}/centred"], name=f"{p}/SubZeroPoint"))
    new.append(make("Gather", [scales, ids], [f"{p}/scale_rows"], name=f"{p}/Gather_scales", axis=0))
    new.append(make("Unsqueeze", [f"{p}/scale_rows", last], [f"{p}/scale_1"], name=f"{p}/UnsqueezeScale"))
    new.append(make("Mul", [f"{p}/centred", f"{p}/scale_1"], [f"{p}/scaled"], name=f"{p}/MulScale"))
    new.append(
        make(
            "Concat",
            [f"{p}/ids_shape", const("hidden", [padded])],
            [f"{p}/out_shape"],
            name=f"{p}/ShapeOut",
            axis=0,
        )
    )
    # the last node writes the GatherBlockQuantized's output name: its consumers are not rewired
    if padded == hidden:
        new.append(make("Reshape", [f"{p}/scaled", f"{p}/out_shape"], [node.output[0]], name=f"{p}/ReshapeOut"))
        return new
    new.append(make("Reshape", [f"{p}/scaled", f"{p}/out_shape"], [f"{p}/out_padded"], name=f"{p}/ReshapeOut"))
    cut = [const("cut_start", [0]), const("cut_end", [hidden]), last]
    new.append(make("Slice", [f"{p}/out_padded", *cut], [node.output[0]], name=f"{p}/SliceBlocks"))
    return new


def lower_gather_block_quantized(model: onnx.ModelProto) -> int:
    """Replace every ``com.microsoft.GatherBlockQuantized`` (GBQ) by standard ONNX operators, in place.

    onnxruntime-web's WebGPU/JSEP WASM build -- the one transformers.js loads in a browser, also
    for its ``wasm`` device -- has no CPU kernel for GBQ ("Could not find an implementation for
    GatherBlockQuantized(1)"), while Gather, Cast, Floor, Sub, Mul, Reshape, Concat, Shape, Slice
    and Unsqueeze it has. The quantised bytes stay as they are (a 4-bit table stays 4 bits per
    weight in the file and in memory, a table shared with a tied lm_head stays shared); only rows
    indexed by the ids are dequantised, at run time:

    * gather the code rows (uint8 [..., H] for 8 bits; packed uint8 [..., H/2] for 4 bits, element
      2i in the low nibble: unpacked in float32 as ``hi = floor(x / 16)``, ``lo = x - 16 hi``, exact
      for 0..255), the zero-point rows (packed the same way for 4 bits) and the scale rows;
    * ``(code - zero_point) * scale`` per block of ``block_size`` along the last axis, in float32,
      the operation GBQ's CPU kernel performs (contrib_ops/cpu/quantization/gather_block_quantized.cc),
      so the embedding is bit-identical to GBQ's on ONNX Runtime CPU.

    Absent zero points are GBQ's defaults: 2^(bits-1) for uint8 data, 0 for INT4 data. INT4/UINT4
    initializers are rewritten as packed uint8 (INT4 codes and zero points offset by 8, which the
    subtraction cancels). Only GBQs with ``gather_axis`` 0 over 2-D data quantised along its last
    axis occur in prodip's graphs; any other raises ValueError (a bug, not an input error).

    Returns:
        The number of GBQ nodes replaced.
    """
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    nodes, lowered, read = [], 0, set()
    for node in graph.node:
        if node.op_type != "GatherBlockQuantized":
            nodes.append(node)
            continue
        read.update(node.input)
        # in the GBQ's place: the new nodes read what it read, so the order stays topological
        nodes.extend(_lower_gbq(graph, node, inits, producer))
        lowered += 1
    if lowered:
        del graph.node[:]
        graph.node.extend(nodes)
        # INT4/UINT4 tables and zero points were repacked under new names: the originals go;
        # uint8 data and the scales are still read by the Gathers and stay
        used = {i for n in graph.node for i in n.input}
        for init in [t for t in graph.initializer if t.name in read and t.name not in used]:
            graph.initializer.remove(init)
    return lowered
