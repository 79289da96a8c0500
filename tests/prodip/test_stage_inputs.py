"""A stage is complete only when made from the current upstream artifacts: each done-check compares the hashes its
artifact recorded of what it read with those artifacts now (prodip.base.stage.made_from).

python -m pytest tests/prodip/test_stage_inputs.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prodip.base.errors import StageFailed
from prodip.base.files import file_sha256
from prodip.base.layout import stage_defaults
from prodip.base.manifest import files_table_sha256
from prodip.base.stage import made_from
from prodip.plan import RunPlan


def _plan(out: Path) -> RunPlan:
    base = stage_defaults(out)
    return RunPlan(**{name: cls(**base[name]) for name, cls in RunPlan.classes().items()})


def test_made_from_names_the_changed_input(caplog):
    assert made_from("a", {"x": "1", "y": None}, {"x": "1", "y": "2"})  # y not recorded (older prodip)
    assert not made_from("runs/a", {"x": "1"}, {"x": "3"})
    assert "runs/a was made from another x (sha256 1, now 3)" in caplog.text
    assert not made_from("runs/a", {"x": "1"}, {"x": None})


def _export_with_report(plan: RunPlan, files: dict, variants: list[str], checked: list[str], files_sha: str) -> Path:
    """An export manifest of ``files``/``variants`` and, where the pipeline and `prodip conformance` write it,
    a passing report of ``checked`` measured on ``files_sha``, named by the manifest's verdict."""
    exp = Path(plan.export.out)
    report_dir = Path(plan.conformance.out)
    report_dir.mkdir(parents=True)
    report = {
        "format_version": 1,
        "passed": True,
        "variants": dict.fromkeys(checked, True),
        "export_files_sha256": files_sha,
    }
    (report_dir / "report.json").write_text(json.dumps(report))
    verdict = {
        "passed": set(checked) >= set(variants),
        "export_files_sha256": files_sha,
        "report_sha256": file_sha256(report_dir / "report.json"),
    }
    manifest = {
        "format_version": 1,
        "source_checkpoint": {},
        "files": files,
        "variants": {v: _entry(v) for v in variants},
        "conformance": verdict,
    }
    (exp / "manifest.json").write_text(json.dumps(manifest))
    return exp


def _entry(variant: str) -> dict:
    """A manifest variant entry (path and format are required of one)."""
    return (
        {"path": "onnx/model.onnx", "format": "onnx"} if variant == "fp32" else {"path": "model.gguf", "format": "gguf"}
    )


FILES = {"onnx/model.onnx": {"bytes": 1, "sha256": "a" * 64}}
MORE = {**FILES, "model.gguf": {"bytes": 2, "sha256": "b" * 64}}


def test_conformance_report_must_match_the_export(tmp_path, caplog):
    from prodip.conformance.stage import conformance_done

    plan = _plan(tmp_path)
    assert Path(plan.conformance.out) == tmp_path / "export" / "conformance"  # one place for the report
    exp = _export_with_report(plan, FILES, ["fp32"], ["fp32"], files_table_sha256(FILES))
    assert conformance_done(plan.conformance)

    # the reported case: the export replaced (more files and variants) and checked by `prodip conformance`
    # (a passing verdict on its current files, from a report written elsewhere); the run's old report kept
    manifest = json.loads((exp / "manifest.json").read_text())
    verdict = {"passed": True, "export_files_sha256": files_table_sha256(MORE), "report_sha256": "c" * 64}
    manifest.update(files=MORE, variants={"fp32": _entry("fp32"), "q8_0": _entry("q8_0")}, conformance=verdict)
    (exp / "manifest.json").write_text(json.dumps(manifest))
    assert not conformance_done(plan.conformance)
    assert "made from another export files table" in caplog.text


def test_conformance_report_of_a_subset_or_another_verdict(tmp_path, caplog):
    from prodip.conformance.stage import conformance_done

    plan = _plan(tmp_path)
    exp = _export_with_report(plan, MORE, ["fp32", "q8_0"], ["fp32"], files_table_sha256(MORE))
    assert not conformance_done(plan.conformance) and "did not check variant(s) q8_0" in caplog.text
    report = Path(plan.conformance.out) / "report.json"
    report.write_text(
        json.dumps(
            {
                "format_version": 1,
                "passed": True,
                "variants": {"fp32": True, "q8_0": True},
                "export_files_sha256": files_table_sha256(MORE),
            }
        )
    )
    assert not conformance_done(plan.conformance)  # the verdict in the manifest names another report
    manifest = json.loads((exp / "manifest.json").read_text())
    manifest["conformance"].update(report_sha256=file_sha256(report), passed=True)
    (exp / "manifest.json").write_text(json.dumps(manifest))
    assert conformance_done(plan.conformance)


def _shards(out: Path, tag: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps({"format_version": 1, "tag": tag}))


def test_train_and_eval_are_tied_to_their_shards(tmp_path, caplog):
    import dataclasses

    from prodip.train.checkpoint import save_checkpoint
    from prodip.train.stage import TrainStageConfig, eval_done, train_done, train_run
    from tests.fixtures import build_tiny_checkpoint, tiny_model, tiny_model_config

    build_tiny_checkpoint(tmp_path / "t")
    plan = _plan(tmp_path)
    train = dataclasses.replace(plan.train, steps=10, tokenizer_dir=str(tmp_path / "t" / "tokenizer"))
    plan = dataclasses.replace(plan, train=train)
    _shards(Path(plan.train.shards_dir), "one")
    config = tiny_model_config(vocab_size=512)
    ckpt = save_checkpoint(
        Path(plan.train.out_dir) / "checkpoints",
        step=10,
        model=tiny_model(config),
        model_config=config,
        tokenizer_dir=plan.train.tokenizer_dir,
        data_state={"shards_meta_sha256": file_sha256(Path(plan.train.shards_dir) / "meta.json")},
    )
    assert train_done(TrainStageConfig(plan.model, plan.train))
    eval_json = Path(plan.eval.out)
    eval_json.write_text(
        json.dumps(
            {
                "format_version": 1,
                "checkpoint": {"path": str(ckpt), "step": 10, "model_sha256": file_sha256(ckpt / "model.safetensors")},
                "shards_meta_sha256": file_sha256(Path(plan.eval.shards_dir) / "meta.json"),
            }
        )
    )
    assert eval_done(plan.eval)

    _shards(Path(plan.train.shards_dir), "two")  # the data stage ran again (e.g. on another corpus)
    assert not train_done(TrainStageConfig(plan.model, plan.train)) and "was made from another shards" in caplog.text
    assert not eval_done(plan.eval)
    with pytest.raises(StageFailed, match="was trained on another shards"):
        train_run(TrainStageConfig(plan.model, plan.train))  # neither resumed on other data nor deleted
    assert (ckpt / "model.safetensors").is_file()


def test_a_changed_corpus_makes_the_tokenizer_and_data_stages_again(tmp_path, caplog):
    """The tokenizer and data stages read corpus files, not artifacts with recorded hashes: `prodip run` stamps
    the corpus each was made from (OUT_DIR/corpus_inputs.json) and makes them again when it changed."""
    import dataclasses

    from prodip.pipeline import _corpus_unchanged, _stamp_corpus, corpus_fingerprint

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("আমার সোনার বাংলা\n", encoding="utf-8")
    held = tmp_path / "held.txt"
    held.write_text("held out\n", encoding="utf-8")
    plan = _plan(tmp_path / "run")
    plan = dataclasses.replace(
        plan,
        tokenizer=dataclasses.replace(plan.tokenizer, inputs={"bn": [str(corpus)]}),
        audit=dataclasses.replace(plan.audit, heldout={"bn": [str(held)]}),
        data=dataclasses.replace(plan.data, inputs={"bn": [str(corpus)]}),
    )
    out = tmp_path / "run"
    out.mkdir()
    assert _corpus_unchanged(out, plan, "tokenizer")  # nothing recorded yet (a run from before the stamps)
    for name in ("tokenizer", "data"):
        _stamp_corpus(out, plan, name)
    first = corpus_fingerprint(plan, "tokenizer")
    assert first and _corpus_unchanged(out, plan, "tokenizer") and _corpus_unchanged(out, plan, "data")

    (corpus / "b.txt").write_text("another file\n", encoding="utf-8")  # a file added to an input folder
    assert corpus_fingerprint(plan, "tokenizer") != first
    assert not _corpus_unchanged(out, plan, "tokenizer") and not _corpus_unchanged(out, plan, "data")
    assert "was made from another corpus" in caplog.text
    _stamp_corpus(out, plan, "tokenizer")
    assert _corpus_unchanged(out, plan, "tokenizer")
    held.write_text("held out, edited\n", encoding="utf-8")  # the audit's text is the tokenizer stage's input too
    assert not _corpus_unchanged(out, plan, "tokenizer") and not _corpus_unchanged(out, plan, "data")
    assert _corpus_unchanged(out, plan, "train")  # no corpus: its inputs are artifacts with their own hashes
