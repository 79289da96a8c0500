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

    python bench/int8_kernels.py [--k 1024 --n 4096 --threads 2]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=1024, help="input features (rows of the weight)")
    p.add_argument("--n", type=int, default=4096, help="output features")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
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
