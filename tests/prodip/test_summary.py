"""The run summary's verdict (prodip.summary.print_summary) read back from artifacts on disk.

python -m pytest tests/prodip/test_summary.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

from prodip.summary import print_summary
from prodip.train.records import EvalReport


def _plan(tmp_path):
    """The parts of a ``prodip.plan.RunPlan`` the summary reads (a base-model run: no extension, no chat)."""
    return SimpleNamespace(
        tokenizer=SimpleNamespace(out_dir=str(tmp_path / "tok")),
        extend=SimpleNamespace(base="", out=str(tmp_path / "tok")),
        data=SimpleNamespace(out_dir=str(tmp_path / "shards")),
        eval=SimpleNamespace(out=str(tmp_path / "eval.json")),
        sft=SimpleNamespace(inputs={}, out_dir=str(tmp_path / "sft")),
        export=SimpleNamespace(out=str(tmp_path / "export")),
        conformance=SimpleNamespace(report_dir=lambda: tmp_path / "conformance"),
    )


def _eval(tmp_path, skipped):
    figures = {"bits_per_char": 1.5, "nll_nats_per_token": 2.5}
    EvalReport(
        format_version=EvalReport.FORMAT_VERSION,
        checkpoint={"path": "ckpt", "step": 30, "model_sha256": "0" * 64},
        languages={"en": {"trained": figures, "random_init": figures, "tokens": 64}},
        skipped_languages=skipped,
    ).write(tmp_path / "eval.json")


def test_a_language_without_held_out_text_is_not_an_ok_run(tmp_path, capsys):
    """eval skipped bn (no validation tokens): the verdict is not OK, and says which language and why."""
    _eval(tmp_path, {"bn": "no validation tokens"})
    s = print_summary(_plan(tmp_path), tmp_path, {})
    out = capsys.readouterr().out
    assert not s["ok"] and len(s["problems"]) == 1
    assert s["problems"][0].startswith("bn was not evaluated (no validation tokens: its text went to the training")
    assert "split_warnings" in s["problems"][0] and str(tmp_path / "shards" / "meta.json") in s["problems"][0]
    assert "  bn: not evaluated: no validation tokens" in out
    assert out.rstrip().endswith("FAILED: " + s["problems"][0])
    _eval(tmp_path, {})
    s = print_summary(_plan(tmp_path), tmp_path, {})
    assert s["ok"] and s["problems"] == [] and capsys.readouterr().out.rstrip().endswith("OK")


def test_a_pass_under_loosened_bounds_says_so():
    """A variant that passed under a tolerance file looser than the shipped one is "pass*", not "pass"."""
    from prodip.summary import _export_rows

    manifest = {
        "files": {"onnx/model.onnx": {"bytes": 2**20}, "onnx/model_quantized.onnx": {"bytes": 2**19}},
        "variants": {
            "fp32": {"format": "onnx", "dtype": "float32", "path": "onnx/model.onnx"},
            "int8": {"format": "onnx", "dtype": "int8", "path": "onnx/model_quantized.onnx"},
        },
    }
    loosened = [{"table": "int8", "metric": "top1", "shipped": {"min": 0.95}, "used": {"min": 0.5}}]
    conformance = {
        "variants": {
            "fp32": {"passed": True, "tolerance_tables": ["fp32"]},
            "int8": {"passed": True, "tolerance_tables": ["int8"]},
        },
        "tolerances": {"path": "tiny.toml", "loosened": loosened},
    }
    rows = _export_rows(manifest, conformance)
    assert [r[0] for r in rows] == ["fp32", "int8"] and [r[-1] for r in rows] == ["pass", "pass*"]
    conformance["tolerances"]["loosened"] = [{**loosened[0], "table": "global"}]
    assert [r[-1] for r in _export_rows(manifest, conformance)] == ["pass*", "pass*"]
    assert [r[-1] for r in _export_rows(manifest, {**conformance, "tolerances": None})] == ["pass", "pass"]
