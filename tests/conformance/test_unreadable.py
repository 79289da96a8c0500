"""Issue 12: a truncated ONNX file is exit 2 naming it (was exit 1 with a protobuf traceback), a previous
report does not survive a new run, and model.safetensors is a variant of every export."""

from __future__ import annotations

import json

import pytest

from prodip.base.manifest import load_manifest, save_manifest
from prodip.cli import main as prodip_main
from prodip.conformance.faults import copy_export
from tests import fixtures as tiny
from tests.conformance.conftest import TINY_TOLERANCES


def test_truncated_onnx_is_exit_2_and_the_old_report_is_kept(tiny_artifacts, tmp_path, capsys):
    export = copy_export(tiny_artifacts["export"], tmp_path / "export")
    old = export / "conformance"
    old.mkdir(exist_ok=True)
    (old / "report.md").write_text("# Conformance PASSED\n")
    (old / "report.json").write_text(json.dumps({"passed": True}))
    onnx_path = export / "onnx" / "model.onnx"
    data = onnx_path.read_bytes()
    onnx_path.write_bytes(data[: len(data) // 3])
    manifest = load_manifest(export)  # as if the manifest had been refreshed: size agrees, content is cut
    manifest.files["onnx/model.onnx"].bytes = onnx_path.stat().st_size
    save_manifest(export, manifest)
    argv = ["conformance", str(export), "--checkpoint", str(tiny_artifacts["checkpoint"])]
    argv += ["--shards-dir", str(tiny_artifacts["shards"]), "--tolerances", str(TINY_TOLERANCES), "--variants", "fp32"]
    assert prodip_main(argv) == 2
    err = capsys.readouterr().err
    assert "model.onnx: not a readable ONNX model" in err and "Traceback" not in err
    # a refused run changes nothing: manifest.json may name that report and its sha256
    assert (old / "report.md").read_text() == "# Conformance PASSED\n" and (old / "report.json").is_file()
    manifest.files["onnx/model.onnx"].bytes = len(data)  # the size no longer matches: named too
    save_manifest(export, manifest)
    assert prodip_main(argv) == 2
    assert "truncated or replaced" in capsys.readouterr().err


def test_model_safetensors_is_always_a_variant(tmp_path):
    """Issue 12: `prodip export --variants fp32,int4` left model.safetensors out of conformance."""
    from prodip.conformance.suite import plan_candidates

    export = tiny.build_tiny_export(tmp_path, variants=["fp32"])
    manifest = load_manifest(export)
    assert manifest.variants["safetensors"].path == "model.safetensors"
    assert {c.name for c in plan_candidates(manifest)} == {"safetensors", "transformers", "fp32"}


def test_a_newer_export_or_report_is_refused_before_the_old_report_is_removed(tmp_path):
    """Running an older prodip's conformance on an export (or a report) of a newer prodip removed the earlier
    report.json/report.md first and then failed on the manifest; now nothing is removed, and the error names
    the file and its format_version (no checkpoint or model needed: refused before either is read)."""
    from prodip.base.errors import OutputExists
    from prodip.base.records import NewerFormat
    from prodip.conformance import ConformanceConfig, run_conformance

    export = tmp_path / "export"
    (export / "conformance").mkdir(parents=True)
    report, md = export / "conformance" / "report.json", export / "conformance" / "report.md"
    report.write_text(json.dumps({"format_version": 1, "passed": True, "variants": {}}))
    md.write_text("# Conformance PASSED\n")
    (export / "manifest.json").write_text(json.dumps({"format_version": 5, "files": {}, "variants": {}}))
    cfg = ConformanceConfig(export_dir=str(export), checkpoint=str(tmp_path / "none"))
    with pytest.raises(NewerFormat, match=r"export/manifest.json: format_version 5 is not one this prodip reads"):
        run_conformance(cfg)
    assert report.is_file() and md.is_file()
    (export / "manifest.json").write_text(
        json.dumps({"format_version": 1, "source_checkpoint": {}, "files": {}, "variants": {}})
    )
    report.write_text(json.dumps({"format_version": 3, "passed": True, "variants": {}}))
    with pytest.raises(OutputExists, match=r"conformance/report.json: written by a newer prodip \(format_version 3;"):
        run_conformance(cfg)
    assert report.is_file() and md.is_file()


def test_a_refused_run_keeps_the_previous_report(tiny_artifacts, tmp_path, capsys):
    """`prodip conformance EXPORT` without --shards-dir/--heldout, or with a variant's ``_data`` file missing,
    logged "removing the previous report.json" and then refused, leaving manifest.json naming a deleted
    report; now the refusal comes first (exit 2) and the report, its sha256 in the manifest, stay as they were."""
    import hashlib

    export = tiny.build_tiny_export(tmp_path / "ext", variants=["fp32"], export_options={"onnx_external_data": True})
    manifest = load_manifest(export)
    data_files = manifest.variants["fp32"].external_data
    assert data_files, "the fixture's fp32 variant has no external data file"
    out = export / "conformance"
    out.mkdir(exist_ok=True)
    (out / "report.json").write_text(json.dumps({"passed": True}))
    (out / "report.md").write_text("# Conformance PASSED\n")
    sha = hashlib.sha256((out / "report.json").read_bytes()).hexdigest()
    base = ["conformance", str(export), "--checkpoint", str(tmp_path / "ext" / "run"), "--variants", "fp32"]
    base += ["--tolerances", str(TINY_TOLERANCES)]
    assert prodip_main(base) == 2  # no held-out text
    assert "pass --shards-dir" in capsys.readouterr().err
    assert hashlib.sha256((out / "report.json").read_bytes()).hexdigest() == sha and (out / "report.md").is_file()
    (export / data_files[0]).unlink()
    assert prodip_main([*base, "--shards-dir", str(tiny_artifacts["shards"])]) == 2
    err = capsys.readouterr().err
    assert f"missing file(s) listed in manifest.json: {data_files[0]} of variant 'fp32'" in err, err
    assert "removing the previous" not in err
    assert hashlib.sha256((out / "report.json").read_bytes()).hexdigest() == sha and (out / "report.md").is_file()


def test_a_heldout_folder_is_named_as_a_folder_in_one_line(tmp_path, capsys):
    """``--heldout bn=data/heldout`` (a folder that exists) said "no such file"; held-out figures are per language
    and that folder holds both languages' files, so it is refused saying it is a folder and naming what it holds,
    before the export is read (exit 2)."""
    from prodip.base.errors import InvalidInput, MissingInput
    from prodip.conformance import ConformanceConfig

    folder = tmp_path / "heldout"
    folder.mkdir()
    for name in ("udhr_eng.txt", "udhr_ben.txt"):
        (folder / name).write_text("text\n", encoding="utf-8")
    (folder / "sub").mkdir()  # not a file: not listed
    argv = ["conformance", str(tmp_path / "export"), "--heldout", f"bn={folder},en={folder / 'udhr_eng.txt'}"]
    assert prodip_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        f"ConformanceConfig.heldout bn={folder}: is a folder, and held-out figures are per language: give bn's "
        "UTF-8 text file, bn=FILE (it holds udhr_ben.txt, udhr_eng.txt)"
    )
    assert "\n" not in err and "no such file" not in err
    (folder / "sub").rmdir()
    for f in folder.iterdir():
        f.unlink()
    with pytest.raises(InvalidInput, match=r"is a folder, .* \(it holds no file\)$"):
        ConformanceConfig(export_dir="x", heldout={"en": str(folder)})
    with pytest.raises(MissingInput, match=r"heldout en=\S*none\.txt: no such file$"):
        ConformanceConfig(export_dir="x", heldout={"en": str(folder / "none.txt")})
