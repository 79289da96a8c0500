"""The manifest verdict is merged per variant: a ``--variants`` subset run keeps the others' verdicts.

python -m pytest tests/conformance/test_verdict_merge.py -q
"""

from __future__ import annotations

import pytest

from prodip.conformance.faults import copy_export
from prodip.conformance.verdict import merge_verdict
from tests.conformance.conftest import TINY_TOLERANCES

ALL = ["safetensors", "fp32", "fp16", "int8", "int4"]


def _report(variants: dict[str, bool], files_sha: str = "f" * 64) -> dict:
    return {"variants": variants, "export_files_sha256": files_sha}


def test_merge_known_answers():
    full = merge_verdict(None, _report({v: True for v in ALL}), ALL, "r.json", "a" * 64, "2026-01-01T00:00:00Z")
    assert full["passed"] is True and full["variants"] == {v: True for v in ALL}
    sub = merge_verdict(full, _report({"fp32": True}), ALL, "r.json", "b" * 64, "2026-01-02T00:00:00Z")
    assert sub["passed"] is True and sub["variants"] == {v: True for v in ALL}
    assert sub["checks"]["fp32"] == {
        "passed": True,
        "checked_utc": "2026-01-02T00:00:00Z",
        "report": "r.json",
        "report_sha256": "b" * 64,
    }
    assert sub["checks"]["int4"]["checked_utc"] == "2026-01-01T00:00:00Z"  # kept from the full run
    failing = merge_verdict(sub, _report({"int8": False}), ALL, "r.json", "c" * 64)
    assert failing["passed"] is False and failing["variants"] == {**{v: True for v in ALL}, "int8": False}
    # only a subset ever checked: the others are not vouched for
    fresh = merge_verdict(None, _report({"fp32": True}), ALL, "r.json", "d" * 64)
    assert fresh["passed"] is False and fresh["variants"] == {"fp32": True}
    # different export files (a re-export, or files changed): the old verdicts do not carry over
    other = merge_verdict(full, _report({"fp32": True}, files_sha="e" * 64), ALL, "r.json", "d" * 64)
    assert other["variants"] == {"fp32": True} and other["passed"] is False
    # a slot without export_files_sha256 (written before the merge existed) is not trusted
    legacy = {"passed": True, "variants": {v: True for v in ALL}, "report": "r.json", "report_sha256": "a" * 64}
    assert merge_verdict(legacy, _report({"fp32": True}), ALL, "r.json", "d" * 64)["variants"] == {"fp32": True}


@pytest.mark.slow
def test_subset_runs_keep_other_verdicts(tiny_artifacts, conf_cfg, tmp_path):
    """After a (simulated) full run, `--variants fp32` keeps the other verdicts; a failing subset run
    flips the top-level verdict to false (planted fault: the mask ignores the KV cache in fp32)."""

    from prodip.base.manifest import files_table_sha256, load_manifest, set_conformance
    from prodip.cli import main
    from prodip.conformance import run_conformance
    from prodip.conformance.faults import plant_mask_ignores_past

    def seed_full_pass(export):  # stands in for an earlier full run (same export files)
        m = load_manifest(export)
        files_sha = files_table_sha256(m.files_table())  # the fingerprint a verdict records (model card left out)
        set_conformance(
            export,
            merge_verdict(
                None,
                _report({v: True for v in m.variants}, files_sha),
                list(m.variants),
                "conformance/old.json",
                "0" * 64,
                "2026-01-01T00:00:00Z",
            ),
        )
        return list(m.variants)

    good = copy_export(tiny_artifacts["export"], tmp_path / "good")
    names = seed_full_pass(good)
    report = run_conformance(conf_cfg(good, variants=["fp32"], write_manifest=True))
    assert report["passed"] and report["variants"] == {"fp32": True}
    verdict = load_manifest(good).conformance
    assert verdict is not None and verdict.checks is not None
    assert verdict.passed is True and verdict.variants == {v: True for v in names}
    assert verdict.checks["fp32"].checked_utc != "2026-01-01T00:00:00Z"
    assert verdict.checks["int4"].report == "conformance/old.json"

    bad = plant_mask_ignores_past(tiny_artifacts["export"], tmp_path / "bad")
    seed_full_pass(bad)
    rc = main(
        [
            "conformance",
            str(bad),
            "--checkpoint",
            str(tiny_artifacts["checkpoint"]),
            "--variants",
            "fp32",
            "--tolerances",
            str(TINY_TOLERANCES),
            "--shards-dir",
            str(tiny_artifacts["shards"]),
            "--heldout-tokens",
            "96",
            "--threads",
            "1",
            "--greedy-tokens",
            "8",
            "--runtimes",
            "",  # the merge is about variants; the runtimes' own verdicts: tests/conformance/test_runtimes.py
        ]
    )
    assert rc == 1
    verdict = load_manifest(bad).conformance
    assert verdict is not None and verdict.variants is not None
    assert verdict.passed is False and verdict.variants["fp32"] is False
    assert all(verdict.variants[v] for v in names if v != "fp32")


def test_merge_records_the_tolerances_each_variant_was_checked_with():
    """breaker2 D1: each variant's slot says which tolerance file checked it and which of its bounds
    (its own tables and [global]) were looser than the shipped ones; a later subset run keeps them."""
    loose = [
        {"table": "global", "metric": "tokenizer_mismatches", "shipped": {"equals": 0}, "used": {"max": 3}},
        {"table": "int8", "metric": "top1", "shipped": {"min": 0.95}, "used": {"min": 0}},
        {"table": "transformers", "metric": "max_abs_logit", "shipped": {"max": 1e-4}, "used": {"max": 1}},
    ]
    tol = {"path": "/t/loose.toml", "sha256": "1" * 64, "shipped": False, "loosened": loose}
    cands = {
        "safetensors": {"variant": "safetensors", "tolerance_table": "safetensors"},
        "transformers": {"variant": "safetensors", "tolerance_table": "transformers"},
        **{v: {"variant": v, "tolerance_table": v} for v in ALL[1:]},
    }
    report = {**_report({v: True for v in ALL}), "tolerances": tol, "candidates": cands}
    full = merge_verdict(None, report, ALL, "r.json", "a" * 64)
    assert full["tolerances"] == tol
    assert full["checks"]["int8"]["tolerances"] == {**tol, "loosened": loose[:2]}
    assert full["checks"]["safetensors"]["tolerances"]["loosened"] == [loose[0], loose[2]]
    assert full["checks"]["fp32"]["tolerances"]["loosened"] == loose[:1]
    shipped = {"path": "/p/tolerances.toml", "sha256": "2" * 64, "shipped": True, "loosened": []}
    sub = merge_verdict(
        full,
        {**_report({"int8": True}), "tolerances": shipped, "candidates": {"int8": cands["int8"]}},
        ALL,
        "r.json",
        "b" * 64,
    )
    assert sub["checks"]["int8"]["tolerances"] == shipped and sub["tolerances"] == shipped
    assert sub["checks"]["int4"]["tolerances"]["loosened"] == loose[:1]  # kept from the full run
