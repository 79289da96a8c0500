"""ONNX Runtime's 8-bit weight kernels at 1 row and at 8 rows: why int8 is MatMulInteger.

One weight of a decode step (K x N, default 1024 x 4096 as in bench/serve.py's model), run by
ONNX Runtime on the CPU as:

* fp32 ``MatMul`` (the baseline);
* ``com.microsoft.MatMulNBits`` bits 8, symmetric, block 64, accuracy_level 4 (int8 compute): the
  int8 scheme before 2026-11-30's W8A8;
* ``MatMulInteger`` uint8 x int8 (ONNX Runtime's fast u8s8 path; on x86 without AVX-VNNI it pairs
  products in int16, which saturates for full-range weights: shown for speed only);
* ``MatMulInteger`` uint8 x uint8 with zero points 128: what prodip's int8 runs (exact int32 sums).

Prints the median microseconds per call (``--repeats`` x 50 calls) at M = 1 and M = 8 rows, the
cost of 8 rows over 1 row, and each kernel's time relative to fp32 at the same M. A row here is
a token: 8 rows is the decode step of 8 concurrent streams.

``--decoder GRAPH`` (an int8 decoder of an export, e.g. ``onnx/model_quantized_genai.onnx``) times
instead what bounds serve's 8-stream / 1-stream decode rate: all of the graph's weight products
in one ONNX Runtime call (every ``MatMulInteger`` weight shape, as uint8 x uint8 and as fp32
``MatMul``), and its attention node (``GroupQueryAttention``, cache written in place, ``--past``
tokens held), each at 1 and at 8 rows. ``8 x t(1) / t(8)`` is the rate ratio a decode step made of
that part alone would reach; the other parts of a step (attention, norms, sampling) only add
per-row cost, so the weight products' figure is an upper bound for the whole step.

    python bench/int8_kernels.py [--k 1024 --n 4096 --threads 2]
    python bench/int8_kernels.py --decoder EXPORT/onnx/model_quantized_genai.onnx
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import matmul_nbits_quantizer as mnb


def _matmul(w: np.ndarray):
    k, n = w.shape
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "fp32",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["M", n])],
        [numpy_helper.from_array(w, "W")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _nbits8(w: np.ndarray):
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    q = mnb.MatMulNBitsQuantizer(_matmul(w), bits=8, block_size=64, is_symmetric=True, accuracy_level=4)
    q.process()
    return q.model.model


def _integer(w: np.ndarray, unsigned: bool):
    k, n = w.shape
    scale = np.abs(w).max(0) / 127
    codes = np.clip(np.rint(w / scale), -127, 127)
    inits = [numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    if unsigned:
        inits.append(numpy_helper.from_array((codes + 128).astype(np.uint8), "W"))
        node = helper.make_node("MatMulInteger", ["x", "W", "zp", "zp"], ["y"])
    else:
        inits.append(numpy_helper.from_array(codes.astype(np.int8), "W"))
        node = helper.make_node("MatMulInteger", ["x", "W", "zp"], ["y"])
    g = helper.make_graph(
        [node],
        "int8",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, ["M", k])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, ["M", n])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _time(model, x: np.ndarray, threads: int, repeats: int) -> float:
    """Median microseconds per call."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for _ in range(20):
        sess.run(None, {"x": x})
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(50):
            sess.run(None, {"x": x})
        runs.append((time.perf_counter() - t) / 50 * 1e6)
    return statistics.median(runs)


def _session(model: onnx.ModelProto, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _time_bound(sess: ort.InferenceSession, io: ort.IOBinding, repeats: int) -> float:
    """Median microseconds per ``run_with_iobinding`` (outputs preallocated: nothing copied to numpy)."""
    for _ in range(5):
        sess.run_with_iobinding(io)
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(10):
            sess.run_with_iobinding(io)
        runs.append((time.perf_counter() - t) / 10 * 1e6)
    return statistics.median(runs)


def _decoder_parts(path: str) -> tuple[list[tuple[int, int]], dict]:
    """The (K, N) weight shapes of every MatMulInteger of an int8 decoder graph (structure only:
    external weights are not read), and the attributes of its first GroupQueryAttention node
    plus its cos cache's shape ({} when it has none)."""
    graph = onnx.load(path, load_external_data=False).graph
    dims = {t.name: list(t.dims) for t in graph.initializer}
    shapes = [tuple(dims[n.input[1]]) for n in graph.node if n.op_type == "MatMulInteger" and n.input[1] in dims]
    if not shapes:
        raise SystemExit(f"{path}: no MatMulInteger with a constant weight; pass an int8 decoder graph")
    gqa = next((n for n in graph.node if n.op_type == "GroupQueryAttention"), None)
    attn = {}
    if gqa is not None:
        attn = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
        attn["layers"] = sum(n.op_type == "GroupQueryAttention" for n in graph.node)
        attn["cos_shape"] = dims.get(gqa.input[7]) or []
    return shapes, attn


def _products(shapes: list[tuple[int, int]], integer: bool) -> onnx.ModelProto:
    """Every weight product of a decoder as independent nodes of one graph (random weights: the
    kernels' speed does not depend on the values)."""
    rng = np.random.default_rng(0)
    nodes, inputs, outputs = [], [], []
    inits = [numpy_helper.from_array(np.array(128, np.uint8), "zp")]
    for i, (k, n) in enumerate(shapes):
        if integer:
            inits.append(numpy_helper.from_array(rng.integers(0, 256, (k, n), dtype=np.uint8), f"w{i}"))
            nodes.append(helper.make_node("MatMulInteger", [f"x{i}", f"w{i}", "zp", "zp"], [f"y{i}"]))
        else:
            inits.append(numpy_helper.from_array(rng.standard_normal((k, n)).astype(np.float32), f"w{i}"))
            nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"y{i}"]))
        x_type, y_type = (TensorProto.UINT8, TensorProto.INT32) if integer else (TensorProto.FLOAT, TensorProto.FLOAT)
        inputs.append(helper.make_tensor_value_info(f"x{i}", x_type, ["M", k]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", y_type, ["M", n]))
    if not integer:
        inits = inits[1:]
    g = helper.make_graph(nodes, "products", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def _time_products(shapes, integer: bool, rows: int, threads: int, repeats: int) -> float:
    sess = _session(_products(shapes, integer), threads)
    rng = np.random.default_rng(1)
    io = sess.io_binding()
    for i, (k, n) in enumerate(shapes):
        if integer:
            x, y = rng.integers(0, 256, (rows, k), dtype=np.uint8), np.empty((rows, n), np.int32)
        else:
            x, y = rng.standard_normal((rows, k)).astype(np.float32), np.empty((rows, n), np.float32)
        io.bind_cpu_input(f"x{i}", x)
        io.bind_ortvalue_output(f"y{i}", ort.OrtValue.ortvalue_from_numpy(y))
    return _time_bound(sess, io, repeats)


def _time_attention(attn: dict, rows: int, past: int, threads: int, repeats: int) -> float:
    """Microseconds of one GroupQueryAttention call as in the shared-buffer decoder: packed q/k/v of
    one new token per row, rotary inside, a cache of 2 * ``past`` slots holding ``past`` tokens."""
    heads, kv_heads = attn["num_heads"], attn["kv_num_heads"]
    max_pos, half = attn["cos_shape"]
    head = 2 * half
    node = helper.make_node(
        "GroupQueryAttention",
        ["qkv", "", "", "k", "v", "seqlens_k", "total", "cos", "sin", "pos"],
        ["out", "k_out", "v_out"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=kv_heads,
        scale=float(attn.get("scale", head**-0.5)),
        do_rotary=int(attn.get("do_rotary", 0)),
    )
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("qkv", f, ["B", 1, (heads + 2 * kv_heads) * head]),
        helper.make_tensor_value_info("k", f, ["B", kv_heads, "C", head]),
        helper.make_tensor_value_info("v", f, ["B", kv_heads, "C", head]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
        helper.make_tensor_value_info("cos", f, [max_pos, half]),
        helper.make_tensor_value_info("sin", f, [max_pos, half]),
        helper.make_tensor_value_info("pos", TensorProto.INT64, ["B", 1]),
    ]
    outputs = [helper.make_tensor_value_info(name, f, None) for name in ("out", "k_out", "v_out")]
    model = helper.make_model(
        helper.make_graph([node], "attention", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    sess = _session(model, threads)
    rng = np.random.default_rng(2)
    cache = [
        ort.OrtValue.ortvalue_from_numpy(rng.standard_normal((rows, kv_heads, 2 * past, head)).astype(np.float32))
        for _ in ("key", "value")
    ]
    angles = rng.uniform(-1, 1, (max_pos, half)).astype(np.float32)
    io = sess.io_binding()
    io.bind_cpu_input("qkv", rng.standard_normal((rows, 1, (heads + 2 * kv_heads) * head)).astype(np.float32))
    io.bind_cpu_input("seqlens_k", np.full(rows, past, np.int32))  # total - 1: the new token is written at slot past
    io.bind_cpu_input("total", np.array(past + 1, np.int32))
    io.bind_cpu_input("cos", np.cos(angles))
    io.bind_cpu_input("sin", np.sin(angles))
    io.bind_cpu_input("pos", np.full((rows, 1), past, np.int64))
    io.bind_output("out")
    io.bind_ortvalue_input("k", cache[0])
    io.bind_ortvalue_input("v", cache[1])
    io.bind_ortvalue_output("k_out", cache[0])
    io.bind_ortvalue_output("v_out", cache[1])
    return _time_bound(sess, io, repeats)


_FLOAT = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16}


def _weight_products_graph(path: str) -> tuple[onnx.ModelProto, dict[str, tuple[int, int, np.dtype]]]:
    """Every weight product of a decoder graph ``path`` as independent nodes of one graph, with the
    variant's own kernels and weights: ``MatMul`` with a constant weight (fp32, fp16),
    ``MatMulInteger`` (int8), ``com.microsoft.MatMulNBits`` (int4). Returns the model and, per
    activation input, ``(K, N, dtype)`` (uint8 for MatMulInteger)."""
    model = onnx.load(path)  # external weights read: the kernels see the variant's real tensors
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes, inputs, outputs, used, acts = [], [], [], {}, {}
    for i, n in enumerate(graph.node):
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type in ("MatMul", "MatMulInteger") and n.input[1] in inits:
            w = inits[n.input[1]]
            k, m = w.dims[0], w.dims[1]
            dtype = np.uint8 if n.op_type == "MatMulInteger" else _FLOAT.get(w.data_type)
        elif n.op_type == "MatMulNBits" and n.input[1] in inits:
            k, m = attrs["K"], attrs["N"]
            dtype = _FLOAT.get(inits[n.input[2]].data_type)
        else:
            continue
        if dtype is None:
            continue
        x, y = f"x{i}", f"y{i}"
        out_type = TensorProto.INT32 if dtype == np.uint8 else helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        nodes.append(helper.make_node(n.op_type, [x, *n.input[1:]], [y], domain=n.domain, **attrs))
        inputs.append(helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), ["M", k]))
        outputs.append(helper.make_tensor_value_info(y, out_type, ["M", m]))
        used.update({name: inits[name] for name in n.input[1:] if name in inits})
        acts[x] = (k, m, np.dtype(dtype))
    if not nodes:
        raise SystemExit(f"{path}: no weight product with a constant weight")
    g = helper.make_graph(nodes, "products", inputs, outputs, list(used.values()))
    return helper.make_model(g, opset_imports=list(model.opset_import)), acts


def products_bound(path: str, rows: int, threads: int, repeats: int) -> tuple[float, float, float]:
    """The bound of a decode step's ``rows``-stream / 1-stream rate set by the weight products of the
    decoder graph ``path``, whatever its variant (:func:`_weight_products_graph`): ``(t1 us, t_rows us,
    rows * t1 / t_rows)``. The other parts of a step only add per-row cost, so a served variant's
    measured ratio can approach this figure but not pass it (bench/serve.py compares the two)."""
    model, acts = _weight_products_graph(path)
    sess = _session(model, threads)
    rng = np.random.default_rng(1)

    def timed(m: int) -> float:
        io = sess.io_binding()
        for x, (k, n, dtype) in acts.items():
            a = rng.integers(0, 256, (m, k), dtype=np.uint8) if dtype == np.uint8 else rng.standard_normal((m, k))
            io.bind_cpu_input(x, a.astype(dtype))
            y = np.empty((m, n), np.int32 if dtype == np.uint8 else dtype)
            io.bind_ortvalue_output("y" + x[1:], ort.OrtValue.ortvalue_from_numpy(y))
        return _time_bound(sess, io, repeats)

    one, many = timed(1), timed(rows)
    return one, many, rows * one / many


def decoder_bound(path: str, threads: int, repeats: int, past: int) -> None:
    """Print what bounds the 8-row / 1-row decode rate of the int8 decoder ``path`` (module docstring)."""
    shapes, attn = _decoder_parts(path)
    weights = sum(k * n for k, n in shapes)
    print(
        f"{path}: {len(shapes)} weight products, {weights / 1e6:.1f} M weights; {threads} intra-op threads, "
        f"onnxruntime {ort.__version__}, {platform.processor() or platform.machine()}; "
        f"median us per call of {repeats} x 10"
    )
    print(f"{'part of a decode step':<44}{'1 row us':>10}{'8 rows us':>11}{'8 x t1 / t8':>13}")
    parts = {
        "weight products, uint8 x uint8 MatMulInteger": lambda m: _time_products(shapes, True, m, threads, repeats),
        "weight products, fp32 MatMul (same shapes)": lambda m: _time_products(shapes, False, m, threads, repeats),
    }
    if attn:
        label = f"attention, {attn['layers']} x GroupQueryAttention, past {past}"
        parts[label] = lambda m: attn["layers"] * _time_attention(attn, m, past, threads, repeats)
    for name, timed in parts.items():
        one, eight = timed(1), timed(8)
        print(f"{name:<44}{one:>10.0f}{eight:>11.0f}{8 * one / eight:>12.2f}x", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=1024, help="input features (rows of the weight)")
    p.add_argument("--n", type=int, default=4096, help="output features")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--decoder", help="an int8 decoder graph: time its weight products and attention (see above)")
    p.add_argument("--past", type=int, default=48, help="--decoder: tokens in the cache (attention)")
    args = p.parse_args(argv)
    if args.decoder:
        decoder_bound(args.decoder, args.threads, args.repeats, args.past)
        return 0
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((args.k, args.n)) * 0.02).astype(np.float32)
    kernels = {
        "fp32 MatMul": (_matmul(w), np.float32),
        "MatMulNBits 8-bit acc 4": (_nbits8(w), np.float32),
        "MatMulInteger u8 x s8": (_integer(w, False), np.uint8),
        "MatMulInteger u8 x u8": (_integer(w, True), np.uint8),
    }
    print(
        f"K {args.k} x N {args.n}, {args.threads} intra-op threads, onnxruntime {ort.__version__}, "
        f"{platform.processor() or platform.machine()}; median us per call of {args.repeats} x 50"
    )
    print(f"{'kernel':<26}{'M=1 us':>10}{'M=8 us':>10}{'M=8 / M=1':>11}{'vs fp32 M=1':>13}{'vs fp32 M=8':>13}")
    base = None
    for name, (model, dtype) in kernels.items():
        cost = []
        for m in (1, 8):
            x = rng.standard_normal((m, args.k)).astype(np.float32)
            if dtype == np.uint8:
                x = rng.integers(0, 256, (m, args.k)).astype(np.uint8)
            cost.append(_time(model, x, args.threads, args.repeats))
        base = base or cost
        print(
            f"{name:<26}{cost[0]:>10.1f}{cost[1]:>10.1f}{cost[1] / cost[0]:>10.2f}x"
            f"{cost[0] / base[0]:>12.2f}x{cost[1] / base[1]:>12.2f}x",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
