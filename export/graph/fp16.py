"""The fp16 variant's graph fixes: RMSNorm and the RoPE angles stay fp32 without Cast round trips.

:func:`_ancestors` and :func:`_rmsnorm_nodes` name the nodes :mod:`prodip.export.quantize` keeps in
fp32 (its ``node_block_list``); :func:`fold_fp16_round_trips` removes the fp32 -> fp16 -> fp32 Casts
ORT's converter leaves between two blocked nodes.
"""

from __future__ import annotations

import onnx


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
