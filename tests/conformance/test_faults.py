"""Planted faults: broken copies of a good tiny export that the suite must fail, and why.

python -m pytest tests/conformance/test_faults.py -q
"""

from __future__ import annotations

import pytest

from prodip.base.variants import BY_NAME
from prodip.conformance import evaluate, faults
from prodip.conformance.checks import find_check


def _failed(report: dict, candidate: str) -> set[str]:
    return {c["metric"] for c in report["candidates"][candidate]["checks"] if c["passed"] is False}


@pytest.mark.slow
def test_interleaved_rope_layout(tiny_artifacts, conf_cfg, tmp_path):
    bad = faults.plant_rope_interleaved(tiny_artifacts["export"], tmp_path / "bad")
    report = evaluate(conf_cfg(bad, variants=["safetensors", "transformers"]))
    assert not report["passed"]
    for name in ("safetensors", "transformers"):
        assert {"max_abs_logit", "greedy_identical"} <= _failed(report, name)
        by_input = report["candidates"][name]["metrics"]["by_input"]
        # at position 0 RoPE is the identity, so the layout cannot show; it shows at long positions
        assert by_input["prompt:single"]["max_abs_logit"] < 1e-4
        assert by_input["prompt:context"]["max_abs_logit"] > 1e-2


def test_baked_sequence_length(tiny_artifacts, conf_cfg, tmp_path):
    bad = faults.plant_static_seq(tiny_artifacts["export"], tmp_path / "bad")
    report = evaluate(conf_cfg(bad, variants=["fp32"]))
    assert not report["passed"]
    m = report["candidates"]["fp32"]["metrics"]
    assert m["dynamic_axes"] is False and any("input_ids axis 1 is 3" in p for p in m["axes_problems"])
    assert {"dynamic_axes", "run_errors", "max_abs_logit"} <= _failed(report, "fp32")


def test_causal_mask_wrong_with_past(tiny_artifacts, conf_cfg, tmp_path):
    bad = faults.plant_mask_ignores_past(tiny_artifacts["export"], tmp_path / "bad")
    report = evaluate(conf_cfg(bad, variants=["fp32"]))
    assert {"kv_cache_max_abs", "greedy_identical"} <= _failed(report, "fp32")
    # single full passes (past = 0) are still exact: only the cache path is broken
    assert find_check(report, "fp32", "max_abs_logit")["passed"] is True


def test_position_ids_off_by_one(tiny_artifacts, conf_cfg, tmp_path):
    bad = faults.plant_position_off_by_one(tiny_artifacts["export"], tmp_path / "bad")
    report = evaluate(conf_cfg(bad, variants=["fp32"]))
    assert {"kv_cache_max_abs", "greedy_identical"} <= _failed(report, "fp32")
    cand = report["candidates"]["fp32"]
    # the contrib graph's RotaryEmbedding refuses the shifted last position of the full-context
    # sequence (max_position_embeddings): the KV phase errors instead of measuring a difference
    assert cand["metrics"].get("kv_cache_max_abs", 0) > 1e-2 or "out of range" in cand["errors"].get("kv_cache", "")


@pytest.mark.parametrize("variant", ["int8", "int4"])
def test_quantised_layer_zeroed(tiny_artifacts, conf_cfg, tmp_path, variant):
    good = evaluate(conf_cfg(tiny_artifacts["export"], variants=[variant]))
    assert good["passed"], good["candidates"][variant]["checks"]
    bad = faults.plant_zeroed_layer(tiny_artifacts["export"], tmp_path / "bad", rel=BY_NAME[variant].path)
    report = evaluate(conf_cfg(bad, variants=[variant]))
    assert {"kl_mean", "top1"} <= _failed(report, variant)
    kl_good = good["candidates"][variant]["metrics"]["kl_mean"]
    assert report["candidates"][variant]["metrics"]["kl_mean"] > 3 * kl_good


def test_weights_from_another_checkpoint(tiny_artifacts, conf_cfg, tmp_path):
    """The manifest names checkpoint A but model.safetensors holds checkpoint B's weights."""
    bad = faults.plant_other_weights(tiny_artifacts["export"], tmp_path / "bad", tiny_artifacts["other_checkpoint"])
    report = evaluate(conf_cfg(bad, variants=["safetensors", "transformers", "fp32"]))
    assert "max_abs_logit" in _failed(report, "safetensors") and "max_abs_logit" in _failed(report, "transformers")
    assert report["variants"] == {"safetensors": False, "fp32": True}


def test_tampered_file_fails_every_variant(tiny_artifacts, conf_cfg, tmp_path):
    bad = faults.copy_export(tiny_artifacts["export"], tmp_path / "bad")
    with open(bad / "tokenizer_config.json", "a") as fh:
        fh.write(" ")
    report = evaluate(conf_cfg(bad, variants=["fp32"]))
    assert find_check(report, "export", "manifest_files_ok")["passed"] is False
    assert report["variants"] == {"fp32": False} and not report["passed"]
    from prodip.conformance.report import render_markdown

    md = render_markdown(report)
    assert "manifest_files_ok = NO" in md  # the summary line, and the file at fault in the Failed list:
    assert any(
        "manifest_files_ok" in line and "tokenizer_config.json" in line and "bytes" in line
        for line in md.split("## Failed")[1].splitlines()
    ), md


def test_config_with_wrong_rope_theta(tiny_artifacts, conf_cfg, tmp_path):
    bad = faults.plant_config_rope_theta(tiny_artifacts["export"], tmp_path / "bad")
    report = evaluate(conf_cfg(bad, variants=["safetensors", "transformers"]))
    assert find_check(report, "export", "config_matches")["passed"] is False
    assert report["global"]["metrics"]["config_differences"] == {"rope_theta": [10000.0, 500000.0]}
    assert "max_abs_logit" in _failed(report, "transformers")  # it reads config.json


def test_tokenizer_config_with_another_context(tiny_artifacts, conf_cfg, tmp_path):
    """tokenizer_config.json says model_max_length 2048 for a model whose context is shorter."""
    bad = faults.plant_tokenizer_context(tiny_artifacts["export"], tmp_path / "bad")
    report = evaluate(conf_cfg(bad, variants=["safetensors"]))
    assert find_check(report, "export", "config_matches")["passed"] is False
    context = report["global"]["metrics"].get("config_differences", {}).get("tokenizer_config.json model_max_length")
    assert context is not None and context[1] == 2048 and context[0] < 2048
    good = evaluate(conf_cfg(tiny_artifacts["export"], variants=["safetensors"]))
    assert find_check(good, "export", "config_matches")["passed"] is True


def test_tokenizer_without_normaliser(tiny_artifacts, conf_cfg, tmp_path):
    """The exported tokenizer lost NFC: NFD Bangla input tokenizes differently from training."""
    bad = faults.plant_tokenizer_without_nfc(tiny_artifacts["export"], tmp_path / "bad")
    report = evaluate(conf_cfg(bad, variants=["fp32"]))
    assert find_check(report, "export", "tokenizer_mismatches")["passed"] is False
    assert find_check(report, "export", "tokenizer_sha256_match")["passed"] is False
    assert report["variants"] == {"fp32": False}


def test_baked_reshape_behind_dynamic_inputs(tiny_artifacts, conf_cfg, tmp_path):
    """Declared axes look dynamic; only running other lengths exposes the baked size."""
    bad = faults.plant_baked_reshape(tiny_artifacts["export"], tmp_path / "bad")
    report = evaluate(conf_cfg(bad, variants=["fp32"]))
    assert report["candidates"]["fp32"]["metrics"]["dynamic_axes"] is True
    assert {"run_errors", "max_abs_logit", "kv_cache_max_abs"} <= _failed(report, "fp32")
