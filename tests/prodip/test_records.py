"""prodip.base.records: the one pattern of artifact records (round trip, versions, field errors), and the
export manifest and conformance verdict records of prodip.base.manifest."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

from prodip.base.errors import MissingInput, UserError
from prodip.base.manifest import ExportManifest, OnnxQuantization, PteQuantization, VariantEntry, Verdict
from prodip.base.records import NewerFormat, Number, Record, RecordError


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
    assert m.variants["fp32"].path == "onnx/model.onnx" and m.variants["fp32"].external_data == []
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


#: every key export writes into an ONNX variant entry (export.records.onnx_variant_entry,
#: export.core._write_runtime_configs), in its order, and a .pte entry's (export.core._build_devices)
_ONNX_ENTRY = {
    "path": "onnx/model_q4.onnx",
    "format": "onnx",
    "dtype": "int4",
    "quantization": {  # export.quantize.to_int4's keys, in its order
        "tool": "onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer",
        "algorithm": "RTN (DEFAULT)",
        "format": "QOperator",
        "bits": 4,
        "block_size": 32,
        "symmetric": True,
        "op_types": ["MatMul", "Gather"],
        "embedding_quantized": True,
        "lm_head_quantized": True,
        "embedding_shared_with_lm_head": True,
        "embedding_lookup_lowered": 1,
        "accuracy_level": 4,
        "materialized_transposes": 0,
        "external_data": True,
        "opset": 21,
        "embedding_layout": "Gather of packed 4-bit rows",
    },
    "external_data": ["onnx/model_q4.onnx_data"],
    "io_dtype": "float32",
    "kv_cache_dtype": "float32",
    "opset": 17,
    "opset_imports": {"ai.onnx": 17, "com.microsoft": 1},
    "graph": "contrib",
    "genai_path": "onnx/model_q4_genai.onnx",
    "transformersjs_dtype": "q4",
    "genai_overlay": {"model": {"decoder": {"filename": "onnx/model_q4_genai.onnx"}}},
    "genai_default": True,
}
_PTE_ENTRY = {
    "path": "executorch/model.pte",
    "format": "pte",
    "dtype": "float32",
    "quantization": {  # export.executorch.export_pte's keys for pte-fp32, in its order
        "scheme": None,
        "backend": "xnnpack",
        "runner_metadata": {
            "get_bos_id": 1,
            "get_eos_ids": [2],
            "get_max_seq_len": 96,
            "get_max_context_len": 96,
            "get_vocab_size": 512,
            "get_n_layers": 2,
            "use_kv_cache": True,
            "use_sdpa_with_kv_cache": False,
            "enable_dynamic_shape": True,
        },
        "executorch_version": "1.0.0",
        "torchao_version": None,
    },
    "tokenizer": "executorch/tokenizer.json",
}


def test_export_manifest_variants_and_verdict_are_typed(tmp_path):
    """variants[name] is a VariantEntry with every key export writes, conformance a Verdict: read by attribute,
    written back byte for byte (keys a variant lacks stay absent, a newer export's extra keys are kept)."""
    verdict = {"passed": True, "variants": {"int4": True}, "report": "conformance/report.json"}
    data = _manifest(
        variants={"int4": {**_ONNX_ENTRY, "from_a_newer_export": [1]}, "pte-fp32": _PTE_ENTRY},
        conformance=verdict,
    )
    path = tmp_path / "manifest.json"
    text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
    path.write_text(text)
    m = ExportManifest.read(path)
    int4, pte = m.variants["int4"], m.variants["pte-fp32"]
    assert isinstance(int4, VariantEntry) and isinstance(m.conformance, Verdict)
    assert int4.files() == ["onnx/model_q4.onnx", "onnx/model_q4.onnx_data"]
    assert (int4.opset, int4.opset_imports, int4.graph) == (17, {"ai.onnx": 17, "com.microsoft": 1}, "contrib")
    assert (int4.genai_path, int4.transformersjs_dtype, int4.genai_default) == ("onnx/model_q4_genai.onnx", "q4", True)
    assert int4.genai_overlay == _ONNX_ENTRY["genai_overlay"]
    assert isinstance(int4.quantization, OnnxQuantization) and int4.quantization.block_size == 32
    assert isinstance(pte.quantization, PteQuantization) and pte.quantization.runner_metadata.get_max_seq_len == 96
    assert (pte.tokenizer, pte.genai_path, pte.external_data) == ("executorch/tokenizer.json", None, [])
    assert m.formats("onnx") == ["int4"] and m.formats("pte") == ["pte-fp32"] and m.formats("gguf") == []
    assert m.conformance.passed is True and m.conformance.variants == {"int4": True}
    m.write(path)
    assert path.read_text() == text


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda d: d["variants"]["fp32"].update(opset="17"), "variants.fp32.opset"),
        (lambda d: d["variants"]["fp32"].pop("path"), "variants.fp32.path"),
        (lambda d: d["variants"]["fp32"].update(external_data="onnx/model.onnx_data"), "variants.fp32.external_data"),
        (lambda d: d["variants"]["fp32"].update(genai_default="yes"), "variants.fp32.genai_default"),
    ],
)
def test_export_manifest_names_a_mistyped_variant_field(tmp_path, edit, field):
    data = _manifest()
    edit(data)
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=rf"manifest.json: field '{field}'"):
        ExportManifest.read(path)


@pytest.mark.parametrize(
    "verdict, field",
    [
        ({"variants": {}}, "passed"),
        ({"passed": True, "variants": {"fp32": "yes"}}, "variants.fp32"),
        ({"passed": "yes"}, "passed"),
    ],
)
def test_a_damaged_verdict_is_set_aside_not_fatal(tmp_path, verdict, field):
    """A damaged conformance verdict leaves the manifest readable (serve refuses it by name or serves it
    with --allow-unverified; conformance replaces it): no verdict, the reason kept beside it, and the next
    write drops it. An empty object is no verdict, as older writers left it."""
    data = _manifest()
    data["conformance"] = verdict
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(data))
    m = ExportManifest.read(path)
    assert m.conformance is None and f"field '{field}'" in m.conformance_problem
    m.write(path)
    assert "conformance" not in json.loads(path.read_text()) or json.loads(path.read_text())["conformance"] is None
    assert "conformance_problem" not in path.read_text()
    data["conformance"] = {}
    path.write_text(json.dumps(data))
    empty = ExportManifest.read(path)
    assert empty.conformance is None and empty.conformance_problem is None


def test_newer_format_version_is_its_own_error(tmp_path):
    """A manifest of a newer prodip: NewerFormat (a RecordError) with the version found, the file named and the
    versions read; an older or non-integer version stays a plain RecordError."""
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(_manifest(format_version=7)))
    with pytest.raises(NewerFormat) as err:
        ExportManifest.read(path)
    assert (err.value.found, err.value.reads) == (7, (1,))
    assert str(err.value).startswith(f"{path}: format_version 7 is not one this prodip reads (reads 1; writes 1)")
    assert "newer prodip (made by `prodip export`); upgrade prodip" in str(err.value)
    for version in (0, "1", None):
        path.write_text(json.dumps(_manifest(format_version=version)))
        with pytest.raises(RecordError) as err:
            ExportManifest.read(path)
        assert not isinstance(err.value, NewerFormat), version


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


def _artifact_examples():
    """(record class, a minimal file as its writer lays it out, a required field) for every artifact."""
    from prodip.base.stage import StageTimes
    from prodip.conformance.records import ConformanceReport
    from prodip.pipeline import CorpusStamps, RunMarker, RunSummary
    from prodip.serve.records import Completions
    from prodip.tokenizer.audit import FertilityReport
    from prodip.tokenizer.bpe import TrainInfo
    from prodip.tokenizer.shards import ShardsMeta
    from prodip.train.records import CheckpointManifest, EvalReport, SftEvalReport, TrainerState

    shard = {"file": "bn/train_000000.bin", "n_tokens": 5, "max_id": 9, "sha256": "a" * 64}
    return [
        (
            ShardsMeta,
            {
                "format_version": 2,
                "tokenizer_sha256": "a" * 64,
                "vocab_size": 512,
                "token_dtype": "uint16",
                "bos_id": 1,
                "eos_id": 2,
                "languages": {"bn": {"train": [shard], "val": [], "documents": {"train": 1, "val": 0}}},
                "sources": [{"name": "ক", "tokens": 5}],
            },
            "vocab_size",
        ),
        (
            FertilityReport,
            {
                "format_version": 1,
                "tokenizer_sha256": "a" * 64,
                "vocab_size": 512,
                "languages": {"bn": {"chars_per_token": 3.5}},
                "gate": {"min_chars_per_token": {"bn": 2}, "passed": True, "failures": []},
            },
            "gate",
        ),
        (
            TrainerState,
            {
                "data_card": {"sources": []},
                "data_state": {"shards_meta_sha256": "b" * 64},
                "format_version": 1,
                "numpy_rng": [1, 2],
                "step": 3,
                "tokenizer_sha256": "a" * 64,
                "tokens_seen": 96,
                "train_config": {"lr": 0.001},
            },
            "step",
        ),
        (
            CheckpointManifest,
            {"files": {"model.safetensors": {"bytes": 1, "sha256": "c" * 64}}, "format_version": 1},
            "files",
        ),
        (
            EvalReport,
            {
                "format_version": 1,
                "checkpoint": {"path": "/r/step_3", "step": 3, "model_sha256": "d" * 64},
                "shards_meta_sha256": "b" * 64,
                "languages": {"bn": {"trained": {"bits_per_char": 2.5}}},
                "mc": None,
                "elapsed_s": 1,
            },
            "checkpoint",
        ),
        (
            SftEvalReport,
            {"format_version": 1, "init_from": "runs/x", "before": {"bn": {"bits_per_char": 5.5}}, "step": 4},
            "format_version",
        ),
        (
            ConformanceReport,
            {
                "format_version": 1,
                "entry": "conformance.run_conformance",
                "passed": True,
                "variants": {"fp32": True},
                "export_files_sha256": "e" * 64,
                "candidates": {"fp32": {"max_abs_logit": "inf"}},
            },
            "variants",
        ),
        (
            StageTimes,
            {"format_version": 1, "stages": {"train": {"seconds": 1.5, "complete": True, "invocations": 1}}},
            "format_version",  # no required field besides: an empty table is a run that timed nothing yet
        ),
        (
            TrainInfo,
            {
                "format_version": 1,
                "kind": "portable",
                "pretokenizer": "o200k-marks",
                "vocab_size": 510,
                "requested_vocab_size": 512,
                "sample_chars": {"bn": 300, "en": 200},
                "available_chars": {"bn": 300, "en": 900},
                "train_s": 0.5,
                "files": {"bn": ["a.txt", "a.txt"]},
                "sources": [
                    {
                        "language": "bn",
                        "source": "a.txt",
                        "weight": 2,
                        "available_chars": 150,
                        "sample_chars": 300,
                        "kind": "text",
                        "files": ["a.txt"],
                    },
                    {
                        "language": "en",
                        "source": "wordfreq:en",
                        "weight": 1,
                        "available_chars": 900,
                        "sample_chars": 200,
                        "kind": "word_counts",
                        "words": 40,
                        "bare_share": 0.1,
                        "capitalised_share": 0,
                        "license": {"license": "CC-BY-SA-4.0"},
                        "version": "3.1.1",
                    },
                ],
                "source_records": [{"name": "a.txt", "license": "CC0-1.0"}],
            },
            "vocab_size",
        ),
        (
            Completions,
            {
                "format_version": 1,
                "variant": "int8",
                "url": "http://127.0.0.1:5/v1/completions",
                "sampling": {"max_tokens": 4, "temperature": 0.0},
                "completions": {
                    "bn": {
                        "prompt": "একদিন",
                        "completion": " সকালে",
                        "finish_reason": "length",
                        "usage": None,
                        "seconds": 0.25,
                    }
                },
                "chat": {"en": {"user": "hi", "error": {"status": 400, "code": "chat_not_supported", "message": "m"}}},
            },
            "variant",
        ),
        (RunMarker, {"format_version": 1, "config": "config.toml"}, "format_version"),
        (CorpusStamps, {"format_version": 1, "stages": {"tokenizer": "a" * 64, "data": None}}, "format_version"),
        (
            RunSummary,
            {
                "format_version": 1,
                "out_dir": "runs/ক",
                "fertility": {"format_version": 1, "languages": {"bn": {"chars_per_token": 4.38}}},
                "eval": None,
                "sft": None,
                "export_manifest": None,
                "conformance": None,
                "completions": {"format_version": 1, "completions": {"bn": {"completion": "আমি"}}},
                "timings_s": {"tokenizer": 1.5, "serve": 2},
                "stage_times": {"tokenizer": {"seconds": 1.5, "complete": True, "invocations": 1}},
                "ok": False,
                "problems": ["the bn completion is empty or blank"],
            },
            "ok",
        ),
    ]


def _text(cls, data):
    text = json.dumps(data, indent=cls.INDENT, ensure_ascii=cls.ENSURE_ASCII, sort_keys=cls.SORT_KEYS)
    return text + "\n" if cls.TRAILING_NEWLINE else text


def test_every_artifact_record_round_trips_byte_for_byte(tmp_path):
    for cls, data, _ in _artifact_examples():
        path = tmp_path / cls.FILE
        path.write_text(_text(cls, data), encoding="utf-8")
        record = cls.read(path)
        record.write(tmp_path / "again.json")
        assert (tmp_path / "again.json").read_text(encoding="utf-8") == _text(cls, data), cls.__name__


def test_every_artifact_record_refuses_another_version_and_names_a_missing_field(tmp_path):
    for cls, data, required in _artifact_examples():
        path = tmp_path / cls.FILE
        newer = max(cls.READS) + 1
        path.write_text(json.dumps({**data, "format_version": newer}))
        with pytest.raises(RecordError) as err:
            cls.read(path)
        reads = ", ".join(map(str, cls.READS))
        assert f"{path}: format_version {newer} is not one this prodip reads (reads {reads}" in str(err.value)
        assert cls.MAKER and cls.MAKER in str(err.value)
        if required == "format_version":
            continue
        path.write_text(json.dumps({k: v for k, v in data.items() if k != required}))
        with pytest.raises(RecordError, match=rf"{cls.FILE}: field '{required}': field required"):
            cls.read(path)


def test_mistyped_nested_fields_are_named_with_their_path(tmp_path):
    from prodip.tokenizer.shards import ShardsMeta

    cls, data, _ = _artifact_examples()[0]
    assert cls is ShardsMeta
    data["languages"]["bn"]["train"][0]["n_tokens"] = "five"
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=r"meta.json: field 'languages.bn.train.0.n_tokens'.*\(got 'five'\)"):
        ShardsMeta.read(path)


def test_stage_times_written_before_records_still_read(tmp_path):
    from prodip.base.stage import StageTimes

    path = tmp_path / "stage_times.json"
    path.write_text(json.dumps({"tokenizer": {"seconds": 2.0, "complete": False, "invocations": 1}}))
    times = StageTimes.read(path)
    assert times.format_version == 1 and times.stages["tokenizer"].complete is False
    times.add("tokenizer", 3.0, True)  # the interrupted invocation's time is carried
    times.add("train", 1.0, False)
    assert (times.stages["tokenizer"].seconds, times.stages["tokenizer"].invocations) == (5.0, 2)
    times.write(path)
    again = StageTimes.read(path)
    assert json.loads(path.read_text())["format_version"] == 1 and again.stages == times.stages
    times.add("tokenizer", 1.0, True)  # run again after completing: starts over
    assert (times.stages["tokenizer"].seconds, times.stages["tokenizer"].invocations) == (1.0, 1)


def test_files_written_before_their_records_still_read(tmp_path):
    """corpus_inputs.json without format_version (the bare table), completions.json before sampling and chat
    were recorded, train_info.json of the first tokenizers (no sources, pretokenizer, ...), prodip_run.json as
    prodip run wrote it: each reads, and a version this prodip does not read is refused naming it."""
    from prodip.pipeline import CorpusStamps, RunMarker
    from prodip.serve.records import Completions, Sampling
    from prodip.tokenizer.bpe import TrainInfo

    path = tmp_path / "corpus_inputs.json"
    path.write_text(json.dumps({"tokenizer": "a" * 64, "data": None}, indent=2) + "\n")
    stamps = CorpusStamps.read(path)
    assert stamps.format_version == 1 and stamps.stages == {"tokenizer": "a" * 64, "data": None}
    stamps.write(path)
    assert json.loads(path.read_text()) == {"format_version": 1, "stages": {"tokenizer": "a" * 64, "data": None}}

    path = tmp_path / "completions.json"
    old = {"format_version": 1, "variant": "fp32", "url": "http://127.0.0.1:9/v1/completions",
           "completions": {"en": {"prompt": "It", "completion": " was", "finish_reason": "length",
                                  "usage": {"total_tokens": 3}, "seconds": 0.5}}}  # fmt: skip
    path.write_text(json.dumps(old, indent=2, ensure_ascii=False))
    said = Completions.read(path)
    assert said.sampling == Sampling() and said.chat == {} and said.completions["en"].completion == " was"
    assert said.completions["en"].usage is not None and said.completions["en"].usage.total_tokens == 3
    assert said.to_dict() == old  # nothing added on the way back

    path = tmp_path / "train_info.json"
    first = {"format_version": 1, "kind": "bytelevel_bpe", "vocab_size": 300, "sample_chars": {"bn": 10},
             "available_chars": {"bn": 10}, "train_s": 0.1, "peak_rss_mb": 80.5, "files": {"bn": ["x.txt"]}}  # fmt: skip
    path.write_text(json.dumps(first, indent=2))
    info = TrainInfo.read(path)
    assert info.sources == [] and info.sources_as_dicts() is None and info.training_files() == ["x.txt"]
    assert info.to_dict() == first
    path.write_text(json.dumps({**first, "format_version": 2}))
    with pytest.raises(RecordError, match=r"train_info.json: format_version 2 is not one this prodip reads \(reads 1"):
        TrainInfo.read(path)

    path = tmp_path / "prodip_run.json"
    path.write_text(json.dumps({"format_version": 1, "config": "config.toml"}) + "\n")
    assert RunMarker.read(path).config == "config.toml"
    RunMarker.read(path).write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == path.read_text()


@pytest.mark.parametrize("name", ["../elsewhere.toml", "/etc/passwd", "sub/config.toml", ".."])
def test_a_run_marker_names_a_file_beside_it_only(tmp_path, name):
    """prodip_run.json's ``config`` is joined to the run dir: a path out of it is refused, naming the field."""
    from prodip.pipeline import RunMarker

    path = tmp_path / "prodip_run.json"
    path.write_text(json.dumps({"format_version": 1, "config": name}))
    with pytest.raises(RecordError, match="field 'config'"):
        RunMarker.read(path)
    path.write_text(json.dumps({"format_version": 1, "config": "config.toml"}))
    assert RunMarker.read(path).config == "config.toml"
