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


def conformance_config(export_dir, checkpoint, shards_dir, **kw):
    """A ConformanceConfig for the tiny test models: the tiny tolerances, held-out text from ``shards_dir``
    (192 tokens per language, two context windows), 24 greedy tokens, 1 thread, no manifest write, no
    on-device runtimes and no speed table unless ``kw`` says otherwise (tests/conformance/test_runtimes.py
    checks the runtimes, each a Node or onnxruntime-genai run; the shared ``conformed_export`` run and
    tests/conformance/test_speed.py the speed table). ``checkpoint`` / ``shards_dir`` None: none given. The one
    place these settings are spelled out."""
    from prodip.conformance import ConformanceConfig

    base = dict(
        export_dir=str(export_dir),
        checkpoint=None if checkpoint is None else str(checkpoint),
        tolerances=str(TINY_TOLERANCES),
        threads=1,
        greedy_tokens=24,
        write_manifest=False,
        shards_dir=None if shards_dir is None else str(shards_dir),
        heldout_tokens=192,
        runtimes=[],
        speed=False,
    )
    base.update(kw)
    return ConformanceConfig(**base)


def tiny_conf_cfg(tiny_artifacts: dict[str, Path], export_dir, **kw):
    """:func:`conformance_config` for an export of the session's tiny checkpoint, on its shards (``kw`` may
    name another ``checkpoint`` or ``shards_dir``)."""
    checkpoint = kw.pop("checkpoint", tiny_artifacts["checkpoint"])
    return conformance_config(export_dir, checkpoint, kw.pop("shards_dir", tiny_artifacts["shards"]), **kw)


@pytest.fixture
def conf_cfg(tiny_artifacts):
    """Factory: ``conf_cfg(export_dir, **overrides)`` -> :func:`tiny_conf_cfg`."""

    def make(export_dir, **kw):
        return tiny_conf_cfg(tiny_artifacts, export_dir, **kw)

    return make


#: The eval.json figures (trained model vs its random twin, Bangla) the conformed export's card shows.
EVAL_TWIN = {
    "trained": {"nll_nats_per_token": 2.5, "bits_per_char": 1.75},
    "random_init": {"nll_nats_per_token": 5.9, "bits_per_char": 4.25},
}


@pytest.fixture(scope="session")
def conformed_export(tiny_artifacts, tmp_path_factory) -> tuple[Path, dict]:
    """(export, report): a copy of the tiny export after one passing ``run_conformance`` of every variant (no
    runtimes) that wrote its report, verdict and quality card (with :data:`EVAL_TWIN` as eval.json). Shared by
    the tests of the report, the verdict and the card (one run, ~10-20 s); a test that changes it works on a
    copy (``prodip.conformance.faults`` plants into copies)."""
    from prodip.base.files import file_sha256
    from prodip.conformance import run_conformance
    from prodip.conformance.faults import copy_export
    from prodip.train.records import Checkpointed, EvalReport

    root = tmp_path_factory.mktemp("conformed")
    export = copy_export(tiny_artifacts["export"], root / "export")
    ckpt = Path(tiny_artifacts["checkpoint"])
    scored = Checkpointed(path=str(ckpt), step=1, model_sha256=file_sha256(ckpt / "model.safetensors"))
    twin = EvalReport(format_version=EvalReport.FORMAT_VERSION, checkpoint=scored, languages={"bn": EVAL_TWIN})
    eval_json = twin.write(root / "eval.json")  # as `prodip eval` writes it (its record's writer)
    report = run_conformance(
        tiny_conf_cfg(tiny_artifacts, export, write_manifest=True, eval_json=str(eval_json), speed=True)
    )
    return export, report
