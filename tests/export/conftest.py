"""Session fixtures for tests/export: two tiny checkpoints and their complete exports.

* ``gqa_export``: untied, GQA (4 query heads, 2 kv heads), hidden 128, vocab 4096 (weights
  dominate the ONNX files, so the size ratios are meaningful); single-file ONNX.
* ``tied_export``: tied embeddings, MHA (4/4), hidden 64, vocab 70,000 (> 65,536: uint32 token
  ids); every ONNX variant with external data (``onnx_external_data``, the > 2 GB layout).

Both are built by the real path (tokenizer.bpe -> train.checkpoint.save_checkpoint ->
export.export_checkpoint), once per session.

    python -m pytest tests/export -q
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest
import torch

from prodip.export.onnx import io_names


@pytest.fixture(autouse=True, scope="session")
def _two_threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def gqa_export(tmp_path_factory) -> Path:
    from tests.fixtures import build_tiny_export

    return build_tiny_export(
        tmp_path_factory.mktemp("gqa"),
        tie=False,
        vocab_size=4096,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        seed=1,
    )


@pytest.fixture(scope="session")
def tied_export(tmp_path_factory) -> Path:
    from tests.fixtures import build_tiny_export

    return build_tiny_export(
        tmp_path_factory.mktemp("tied"),
        tie=True,
        vocab_size=70_000,
        num_attention_heads=4,
        num_key_value_heads=4,
        seed=2,
        export_options={"onnx_external_data": True},
    )


@pytest.fixture(params=["gqa", "tied"])
def any_export(request) -> Path:
    return request.getfixturevalue(f"{request.param}_export")


@functools.lru_cache(maxsize=4)
def source_model(export_dir: Path):
    """The training model the export was made from (loaded by train.checkpoint from the run dir)."""
    from prodip.train.checkpoint import load_model

    return load_model(export_dir.parent / "run")[0]


def ort_session(export_dir: Path, variant: str):
    import onnxruntime as ort

    from prodip.base.manifest import load_manifest

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    path = export_dir / load_manifest(export_dir).variants[variant].path
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def run_ort(session, config, input_ids, attention_mask, position_ids, past=None):
    """One decoder call. ``past``: list of 2L float32 arrays or None (empty cache, P = 0).

    Returns:
        (logits (B, T, V) float32, present: list of 2L arrays (B, Hkv, P+T, Dh)).
    """
    inputs, _ = io_names(config.num_hidden_layers)
    B = input_ids.shape[0]
    if past is None:
        past = [
            np.zeros((B, config.num_key_value_heads, 0, config.head_dim), np.float32)
            for _ in range(2 * config.num_hidden_layers)
        ]
    feed = {
        "input_ids": np.asarray(input_ids, np.int64),
        "attention_mask": np.asarray(attention_mask, np.int64),
        "position_ids": np.asarray(position_ids, np.int64),
        **dict(zip(inputs[3:], past)),
    }
    out = session.run(None, feed)
    return out[0], out[1:]


def positions(mask: np.ndarray) -> np.ndarray:
    """position_ids for a (left-)padded mask: cumsum(mask) - 1 clipped at 0 (CONTRACTS.md)."""
    return np.clip(np.cumsum(mask, axis=-1) - 1, 0, None)
