"""Session fixtures for tests/conformance: one tiny tokenizer, shards, two checkpoints, one export.

The export (all five variants) is built once per session (~10 s, the ONNX trace dominates);
tests that modify an export work on copies.

    python -m pytest tests/conformance -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import fixtures as tiny

TINY_TOLERANCES = Path(__file__).with_name("tiny_tolerances.toml")


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory) -> dict[str, Path]:
    """{tokenizer, shards, checkpoint, export, other_checkpoint} for a tiny sharp random model."""
    root = tmp_path_factory.mktemp("conformance")
    out = tiny.build_all(root)
    out["other_checkpoint"] = tiny.build_checkpoint(root / "other_run", out["tokenizer"], seed=1)
    return out


@pytest.fixture
def conf_cfg(tiny_artifacts):
    """Factory: a ConformanceConfig for an export dir, with the tiny tolerances, the tiny shards (held-out
    text: 192 tokens per language, two context windows) and 1 thread. No on-device runtimes by default
    (tests/conformance/test_runtimes.py checks them; each adds a Node and an onnxruntime-genai run)."""
    from prodip.conformance import ConformanceConfig

    def make(export_dir, **kw):
        base = dict(
            export_dir=str(export_dir),
            checkpoint=str(tiny_artifacts["checkpoint"]),
            tolerances=str(TINY_TOLERANCES),
            threads=1,
            greedy_tokens=24,
            write_manifest=False,
            shards_dir=str(tiny_artifacts["shards"]),
            heldout_tokens=192,
            runtimes=[],
        )
        base.update(kw)
        return ConformanceConfig(**base)

    return make
