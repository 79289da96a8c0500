"""prodip.base.records: the one pattern of artifact records (round trip, versions, field errors), and the
export manifest and conformance verdict records of prodip.base.manifest."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from prodip.base.errors import MissingInput, UserError
from prodip.base.manifest import ExportManifest, Verdict
from prodip.base.records import Number, Record, RecordError


class _Toy(Record):
    FILE: ClassVar[str] = "toy.json"
    FORMAT_VERSION: ClassVar[int] = 3
    READS: ClassVar[tuple[int, ...]] = (2, 3)
    MAKER: ClassVar[str] = "`make toy`"

    name: str
    count: int
    ratio: Number
    note: str | None = None


def test_round_trip_keeps_bytes_order_and_extra_keys(tmp_path):
    text = '{\n  "format_version": 3,\n  "name": "bn",\n  "count": 2,\n  "ratio": 3,\n  "newer": [1, "x"]\n}\n'
    text = json.dumps(json.loads(text), indent=2) + "\n"  # the writer's layout
    (tmp_path / "toy.json").write_text(text)
    toy = _Toy.read(tmp_path / "toy.json")
    assert (toy.name, toy.count, toy.ratio) == ("bn", 2, 3) and isinstance(toy.ratio, int)
    toy.write(tmp_path / "again.json")
    # an int stays an int (no "3.0"), an unset optional stays absent, an unknown key survives in place
    assert (tmp_path / "again.json").read_text() == text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp file left


def test_old_version_still_read_unknown_version_refused(tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps({"format_version": 2, "name": "a", "count": 1, "ratio": 0.5}))
    assert _Toy.read(path).format_version == 2
    for bad in (4, 1, "3", True, None):
        path.write_text(json.dumps({"format_version": bad, "name": "a", "count": 1, "ratio": 0.5}))
        with pytest.raises(RecordError) as err:
            _Toy.read(path)
        message = str(err.value)
        assert message.startswith(f"{path}: format_version {bad!r} ") and "reads 2, 3" in message
        assert "`make toy`" in message and isinstance(err.value, UserError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "data, field, got",
    [
        ({"name": "a", "ratio": 1}, "'count': field required", None),
        ({"name": "a", "count": "many", "ratio": 1}, "'count'", "'many'"),
        ({"name": 5, "count": 1, "ratio": 1}, "'name'", "5"),
    ],
)
def test_missing_or_mistyped_field_is_named(tmp_path, data, field, got):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps({"format_version": 3, **data}))
    with pytest.raises(RecordError) as err:
        _Toy.read(path)
    assert str(err.value).startswith(f"{path}: field {field}")
    if got is not None:
        assert f"(got {got})" in str(err.value)


def test_missing_damaged_and_read_or_none(tmp_path):
    path = tmp_path / "toy.json"
    with pytest.raises(MissingInput, match=r"toy.json: not found \(made by `make toy`\)"):
        _Toy.read(path)
    assert _Toy.read_or_none(path) is None
    path.write_text("{not json")
    with pytest.raises(RecordError, match=r"toy.json: not valid JSON"):
        _Toy.read(path)
    assert _Toy.read_or_none(path) is None
    path.write_text("[1, 2]")
    with pytest.raises(RecordError, match=r"toy.json: holds list, not a JSON object"):
        _Toy.read(path)


def _manifest(**extra):
    return {
        "format_version": 1,
        "prodip_version": "0.1.0",
        "created_utc": "2026-12-01T00:00:00Z",
        "source_checkpoint": {"path": "/r/step_1", "step": 1, "model_sha256": "a" * 64},
        "tokenizer_sha256": "b" * 64,
        "versions": {"python": "3.12.0"},
        "files": {"onnx/model.onnx": {"bytes": 10, "sha256": "c" * 64}},
        "variants": {"fp32": {"path": "onnx/model.onnx", "format": "onnx", "dtype": "float32", "opset": 17}},
        "export_config": {"variants": ["fp32"]},
        "card": None,
        "conformance": None,
        **extra,
    }


def test_export_manifest_round_trip_and_errors(tmp_path):
    path = tmp_path / "manifest.json"
    data = _manifest(card_quality={"rows": []})
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"  # export's layout, byte for byte
    path.write_text(text)
    m = ExportManifest.read(path)
    assert m.variant("fp32").path == "onnx/model.onnx" and m.variant("fp32").external_data == []
    assert m.files["onnx/model.onnx"].bytes == 10 and m.source_checkpoint.step == 1
    m.write(path)
    assert path.read_text() == text
    path.write_text(json.dumps({**data, "format_version": 2}))
    with pytest.raises(RecordError, match=r"manifest.json: format_version 2 is not one this prodip reads \(reads 1"):
        ExportManifest.read(path)
    broken = _manifest()
    del broken["files"]["onnx/model.onnx"]["sha256"]
    path.write_text(json.dumps(broken))
    with pytest.raises(RecordError, match=r"manifest.json: field 'files.onnx/model.onnx.sha256': field required"):
        ExportManifest.read(path)


def test_verdict_parse_and_serve_problem():
    full = {
        "passed": True,
        "variants": {"fp32": True},
        "checks": {
            "fp32": {
                "passed": True,
                "checked_utc": "t",
                "report": "r.json",
                "report_sha256": "d" * 64,
                "tolerances": {"path": "t.toml", "sha256": "e" * 64, "shipped": True, "loosened": []},
            }
        },
        "export_files_sha256": "f" * 64,
        "report": "r.json",
        "report_sha256": "d" * 64,
        "checked_utc": "t",
    }
    v = Verdict.parse(full)
    assert v.to_dict() == full and list(v.to_dict()) == list(full)  # keys in merge_verdict's order
    assert v.serve_problem("fp32") is None and v.serve_problem("int8") is None
    assert "no per-variant 'checks'" in Verdict.parse({"passed": True, "variants": {}}).serve_problem("fp32")
    with pytest.raises(ValueError, match=r"conformance verdict: field 'passed': field required"):
        Verdict.parse({"variants": {}})
    with pytest.raises(ValueError, match=r"field 'variants.fp32'"):
        Verdict.parse({"passed": True, "variants": {"fp32": "yes"}})
    with pytest.raises(ValueError, match=r"is list, not an object"):
        Verdict.parse([])
