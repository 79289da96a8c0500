"""manifest.json: contents, verify_files naming the bad file, set_conformance."""

from __future__ import annotations

import json
import shutil

import pytest

from prodip.base.manifest import OnnxQuantization, load_manifest, set_conformance, verify_files


def test_manifest_contents(any_export):
    from prodip.train.checkpoint import model_sha256

    m = load_manifest(any_export)
    assert m.format_version == 1 and m.conformance is None
    run = any_export.parent / "run"
    assert m.source_checkpoint.model_sha256 == model_sha256(run)
    assert m.source_checkpoint.step == 10
    assert m.tokenizer_sha256 == m.files["tokenizer.json"].sha256
    for key in ("prodip", "torch", "onnx", "onnxruntime"):
        assert m.versions[key]
    listed = {p.relative_to(any_export).as_posix() for p in any_export.rglob("*") if p.is_file()}
    assert set(m.files) == listed - {"manifest.json"}
    assert set(m.variants) == {"safetensors", "fp32", "fp16", "int8", "int4"}
    assert m.variants["fp32"].path == "onnx/model.onnx" and m.variants["fp32"].quantization is None
    q8, q4, q16 = (m.variants[name].quantization for name in ("int8", "int4", "fp16"))
    assert isinstance(q8, OnnxQuantization) and isinstance(q4, OnnxQuantization) and isinstance(q16, OnnxQuantization)
    assert q8.bits == 8 and q8.symmetric is True and q8.weight_granularity == "per output channel"
    assert (q8.activation_quantization or "").startswith("dynamic, per row") and (q8.matmuls_quantized or 0) >= 5
    assert q4.bits == 4 and q4.block_size == 32 and q4.embedding_quantized is True
    assert "Softmax" in (q16.op_block_list or [])
    assert m.export_config is not None and set(m.export_config.variants) <= set(m.variants)
    assert m.card is not None and m.card.statement.text
    verify_files(any_export)


def test_verify_files_names_the_tampered_file(gqa_export, tmp_path):
    copy = shutil.copytree(gqa_export, tmp_path / "export")
    verify_files(copy)
    target = copy / "onnx" / "model_quantized.onnx"
    data = bytearray(target.read_bytes())
    data[-1] ^= 1
    target.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model_quantized.onnx.*sha256"):
        verify_files(copy)
    target.write_bytes(bytes(data[:-1]))
    with pytest.raises(ValueError, match="model_quantized.onnx.*bytes"):
        verify_files(copy)
    target.unlink()
    with pytest.raises(FileNotFoundError, match="model_quantized.onnx"):
        verify_files(copy)


def test_verify_files_refuses_unlisted_files(gqa_export, tmp_path):
    copy = shutil.copytree(gqa_export, tmp_path / "export")
    (copy / "onnx" / "stray.onnx").write_bytes(b"x")
    with pytest.raises(ValueError, match="stray.onnx"):
        verify_files(copy)
    verify_files(copy, allow_unlisted=True)
    (copy / "onnx" / "stray.onnx").unlink()
    (copy / "conformance").mkdir()
    (copy / "conformance" / "report.json").write_text("{}")  # written after the export: not listed
    verify_files(copy)


def test_set_conformance_atomic_rewrite(gqa_export, tmp_path):
    copy = shutil.copytree(gqa_export, tmp_path / "export")
    before = load_manifest(copy)
    verdict = {
        "passed": False,
        "variants": {"fp32": True, "int4": False},
        "report": "conformance/report.json",
        "report_sha256": "0" * 64,
    }
    set_conformance(copy, verdict)
    after = load_manifest(copy)
    assert after.conformance is not None and after.conformance.variants is not None
    assert after.conformance.passed is False and after.conformance.variants["int4"] is False
    assert str(after.conformance.checked_utc).endswith("Z")
    assert {k: v for k, v in after.to_dict().items() if k != "conformance"} == {
        k: v for k, v in before.to_dict().items() if k != "conformance"
    }
    assert not list(copy.glob(".manifest.json.tmp*"))
    verify_files(copy)  # the verdict does not invalidate the file hashes
    with pytest.raises(ValueError, match="int3"):
        set_conformance(copy, {"passed": True, "variants": {"int3": True}})
    with pytest.raises(ValueError, match="passed"):
        set_conformance(copy, {"variants": {}})
    set_conformance(copy, None)
    assert load_manifest(copy).conformance is None


def test_load_manifest_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="prodip export"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format_version": 2}))
    with pytest.raises(ValueError, match="format_version"):
        load_manifest(tmp_path)
