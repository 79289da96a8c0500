"""The conformance suite end to end on a tiny export: report, manifest verdict, CLI, pytest plugin.

python -m pytest tests/conformance/test_suite.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prodip.conformance.faults import copy_export
from tests.conformance.conftest import TINY_TOLERANCES

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_good_export_passes_and_records_verdict(conformed_export):
    from prodip.base.manifest import file_sha256, load_manifest, verify_files
    from prodip.conformance.results import RunOutcome

    export, report = conformed_export  # run_conformance of every variant, write_manifest=True
    assert report["passed"], json.dumps({k: v["checks"] for k, v in report["candidates"].items()}, default=str)
    assert set(report["candidates"]) == {"safetensors", "transformers", "fp32", "fp16", "int8", "int4", "int4-wasm"}
    fp32 = report["candidates"]["fp32"]["metrics"]
    assert fp32["max_abs_logit"] < 1e-4 and fp32["greedy_identical"] and fp32["top1"] == 1.0
    assert report["candidates"]["safetensors"]["metrics"]["max_abs_logit"] == 0.0  # same weights, same code
    assert set(fp32["heldout"]) == {"bn", "en"} and fp32["heldout"]["bn"]["bpc_ref"] > 0
    assert report["inputs"]["items"]["prompt:context"] == [1, 96]  # fills the context window
    assert report["inputs"]["items"]["prompt:single"] == [1, 1]
    out = export / "conformance"
    strict = json.loads((out / "report.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert strict["passed"] is True and "versions" in strict and strict["entry"] == "conformance.run_conformance"
    md = (out / "report.md").read_text()
    assert md.startswith("# Conformance PASSED") and "| int4 | pass |" in md and "| int4-wasm | pass |" in md
    verdict = load_manifest(export).conformance
    assert verdict is not None and verdict.passed is True and verdict.report == "conformance/report.json"
    assert verdict.variants == {"safetensors": True, "fp32": True, "fp16": True, "int8": True, "int4": True}
    # the WASM graph is part of int4's verdict, gated by its own table; the card's rows are the variants' own files
    (int4,) = [v for v in RunOutcome.from_report(strict).variants if v.name == "int4"]
    assert int4.tolerance_tables == ["int4", "int4-wasm"]
    quality = load_manifest(export).card_quality
    assert quality is not None and {r.variant for r in quality.rows} == {"safetensors", "fp32", "fp16", "int8", "int4"}
    assert verdict.report_sha256 == file_sha256(out / "report.json")
    verify_files(export)  # the report dir is not part of the hashed export


def test_refuses_checkpoint_other_than_the_manifests(tiny_artifacts, conf_cfg, tmp_path):
    """Planted fault: an export made from a different checkpoint than the one given."""
    from prodip.cli import main
    from prodip.conformance import evaluate

    cfg = conf_cfg(tiny_artifacts["export"], checkpoint=str(tiny_artifacts["other_checkpoint"]))
    with pytest.raises(ValueError, match="refusing to compare"):
        evaluate(cfg)
    rc = main(
        [
            "conformance",
            str(tiny_artifacts["export"]),
            "--checkpoint",
            str(tiny_artifacts["other_checkpoint"]),
            "--shards-dir",
            str(tiny_artifacts["shards"]),
            "--out",
            str(tmp_path / "rep"),
            "--threads",
            "1",
        ]
    )
    assert rc == 2 and not (tmp_path / "rep").exists()  # refused: nothing written


@pytest.mark.slow
def test_cli_exit_code_on_failure(tiny_artifacts, tmp_path, capsys):
    """`prodip conformance` exits 1 on a failing check and still writes the report + verdict."""
    from prodip.base.manifest import load_manifest
    from prodip.cli import main
    from prodip.conformance.faults import plant_mask_ignores_past

    export = plant_mask_ignores_past(tiny_artifacts["export"], tmp_path / "bad")
    rc = main(
        [
            "conformance",
            str(export),
            "--checkpoint",
            str(tiny_artifacts["checkpoint"]),
            "--variants",
            "fp32",
            "--runtimes",
            "onnxruntime-genai",  # in process; the Node runtimes' failures: tests/conformance/test_runtimes.py
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
        ]
    )
    assert rc == 1
    assert "# Conformance FAILED" in capsys.readouterr().out
    assert load_manifest(export).conformance.variants == {"fp32": False}
    assert (export / "conformance" / "config.toml").is_file()


def _pytest(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for var in (
        "PRODIP_EXPORT_DIR",
        "PRODIP_CHECKPOINT",
        "PRODIP_TOLERANCES",
        "PRODIP_SHARDS_DIR",
        "PRODIP_CONFORMANCE_VARIANTS",
        "PRODIP_CONFORMANCE_RUNTIMES",
    ):
        env.pop(var, None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(REPO / "conformance"),
            "-q",
            "-p",
            "no:cacheprovider",
            "--conformance-threads",
            "1",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


@pytest.mark.slow
def test_pytest_collection_on_tiny_export(tiny_artifacts, tmp_path):
    """`pytest conformance/ --export-dir DIR` runs one test per check; a planted fault fails its tests.

    One on-device runtime (onnxruntime-genai, in process) shows its checks become tests too; each runtime's
    checks are planned and reported alike (tests/conformance/test_runtimes.py checks the plan against a
    report of all three, whose Node runs would double this test's time)."""
    from prodip.conformance import ConformanceConfig
    from prodip.conformance.checks import plan_checks
    from prodip.conformance.faults import plant_position_off_by_one
    from prodip.conformance.runtimes import GENAI, RUNTIME_METRICS

    shards = ["--shards-dir", str(tiny_artifacts["shards"])]
    good = _pytest(
        [
            "--export-dir",
            str(tiny_artifacts["export"]),
            "--checkpoint",
            str(tiny_artifacts["checkpoint"]),
            "--tolerances",
            str(TINY_TOLERANCES),
            "--conformance-runtimes",
            GENAI,
            *shards,
        ]
    )
    assert good.returncode == 0, good.stdout[-3000:]
    assert "test_check[fp32::kv_cache_max_abs]" not in good.stdout  # -q: passing tests are not listed
    n_passed = int(good.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert n_passed >= 40  # 6 candidates x ~6 metrics + export-wide checks
    plan = plan_checks(
        ConformanceConfig(
            export_dir=str(tiny_artifacts["export"]),
            tolerances=str(TINY_TOLERANCES),
            shards_dir=str(tiny_artifacts["shards"]),
            runtimes=[GENAI],
        )
    )
    assert n_passed == len(plan) and ("int4", RUNTIME_METRICS[GENAI]) in plan  # one test per check, runtime's too

    bad = plant_position_off_by_one(tiny_artifacts["export"], tmp_path / "bad")
    failed = _pytest(
        [
            "--export-dir",
            str(bad),
            "--checkpoint",
            str(tiny_artifacts["checkpoint"]),
            "--tolerances",
            str(TINY_TOLERANCES),
            "--conformance-variants",
            "fp32,int8",
            "--conformance-runtimes",
            GENAI,
            *shards,
        ]
    )
    assert failed.returncode == 1
    assert "FAILED conformance/test_conformance.py::test_check[fp32::kv_cache_max_abs]" in failed.stdout
    assert "FAILED conformance/test_conformance.py::test_check[int8::" not in failed.stdout  # fault is in fp32 only


def test_pytest_collection_skips_without_export_dir():
    res = _pytest([])
    assert res.returncode == 0 and "1 skipped" in res.stdout and "no export dir" in res.stdout


def test_module_entry_help():
    res = subprocess.run(
        [sys.executable, "-m", "prodip.conformance", "--help"], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert res.returncode == 0 and "EXPORT_DIR" in res.stdout and "--tolerances" in res.stdout


@pytest.mark.slow
def test_loosened_tolerances_are_visible_and_recorded(tiny_artifacts, tmp_path, capsys):
    """breaker2 D1: a run with bounds looser than the shipped file still passes, but report.md lists
    them under LOOSENED TOLERANCES, report.json and the manifest verdict record them, the CLI warns,
    and `prodip serve` (serve.engine.load_export) carries them; a run with the shipped file lists none."""
    from prodip.base.manifest import load_manifest
    from prodip.cli import main
    from prodip.conformance.tolerances import compare_with_shipped, load_tolerances
    from prodip.serve.engine import load_export

    export = copy_export(tiny_artifacts["export"], tmp_path / "export")
    rc = main(
        [
            "conformance",
            str(export),
            "--checkpoint",
            str(tiny_artifacts["checkpoint"]),
            "--variants",
            "int8",
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
            "",  # what is tested is the tolerance file; no runtime check reads one
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, out
    want = compare_with_shipped(load_tolerances(TINY_TOLERANCES), TINY_TOLERANCES, ["global", "int8"])
    assert [(b["table"], b["metric"]) for b in want["loosened"]] == [("int8", "top1"), ("int8", "bpc_delta_max")]
    assert "## LOOSENED TOLERANCES" in out and "- [int8] `top1`: min 0.95 -> min 0.8" in out
    assert "WARNING: 2 tolerance bound(s) looser than the shipped" in err and "[int8] top1 min 0.95 -> min 0.8" in err
    report = json.loads((export / "conformance" / "report.json").read_text())
    assert report["tolerances"] == want and report["candidates"]["int8"]["tolerance_table"] == "int8"
    verdict = load_manifest(export).conformance.to_dict()
    assert verdict["tolerances"] == want and verdict["checks"]["int8"]["tolerances"] == want
    # serve: verified (the other variants have no verdict), with the loosened bounds named
    info = load_export(export, "int8")
    assert info.verified and info.loosened_tolerances == want["loosened"]
    assert any("LOOSENED tolerances" in w and "[int8] top1 min 0.95 -> min 0.8" in w for w in info.warnings)

    # the shipped file (fp32 only: its bounds hold for the tiny model): no section, no warning
    rc = main(
        [
            "conformance",
            str(export),
            "--checkpoint",
            str(tiny_artifacts["checkpoint"]),
            "--variants",
            "fp32",
            "--shards-dir",
            str(tiny_artifacts["shards"]),
            "--heldout-tokens",
            "96",
            "--threads",
            "1",
            "--greedy-tokens",
            "8",
            "--runtimes",
            "",  # what is tested is the tolerance file; no runtime check reads one
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 0, out
    assert "LOOSENED" not in out and "WARNING" not in err
    verdict = load_manifest(export).conformance.to_dict()
    assert verdict["checks"]["fp32"]["tolerances"]["shipped"] is True
    assert verdict["checks"]["int8"]["tolerances"] == want  # kept from the earlier run
    assert load_export(export, "fp32").loosened_tolerances == []
