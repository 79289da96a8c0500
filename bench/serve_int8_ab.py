"""A/B of two int8 files of one model through serve's scheduler: 1-stream vs 8-stream aggregate
decode tok/s (bench/serve.py's engine_decode_rate, 2 threads, 16 prompt tokens, 32 generated,
greedy), the two interleaved in every repeat so that load drift hits both; medians of 3.

    python bench/serve_int8_ab.py NEW_EXPORT_DIR OLD_EXPORT_DIR   # each with onnx/model_quantized.onnx

Used for bench/results/serve_int8_2026-11-30.md: NEW = bench/serve.py's random ~109 M export (int8 =
8-bit MatMulNBits), OLD = the same export dir with onnx/model_quantized.onnx rebuilt by main's
quantize_dynamic to_int8. And for bench/results/serve_int8_rowwise_2026-11-30.md: NEW = that model
exported by the W8A8 MatMulInteger to_int8, OLD = the same weights exported before it (MatMulNBits).
Both exports: ``tests.fixtures.build_tiny_export(DIR, variants=["fp32", "int8"], vocab_size=16384,
hidden_size=1024, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4,
max_position_embeddings=1024)``.
"""

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.serve import engine_decode_rate  # noqa: E402

runs = {}
exports = {"int8_new": Path(sys.argv[1]), "int8_old": Path(sys.argv[2])}
which = ["int8_old", "int8_new"]
prompt = [int(t) for t in np.random.default_rng(0).integers(3, 300, 16)]
for name in which:
    engine_decode_rate(exports[name], "int8", prompt, 8, 1, 2)  # warm-up
for rep in range(3):
    for name in which:
        one = engine_decode_rate(exports[name], "int8", prompt, 32, 1, 2)
        many = engine_decode_rate(exports[name], "int8", prompt, 32, 8, 2)
        runs.setdefault(name, []).append((one, many, many / one))
        print(name, rep, f"{one:.1f} {many:.1f} {many / one:.2f}x", flush=True)
for name, r in runs.items():
    med = [statistics.median(c) for c in zip(*r)]
    print(
        f"MEDIAN {name}: 1-stream {med[0]:.1f} tok/s, 8-concurrent {med[1]:.1f} tok/s, ratio {med[2]:.2f}x", flush=True
    )
