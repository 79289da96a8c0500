"""Known answers for the metric functions and the tolerance file.

python -m pytest tests/conformance/test_compare.py -q
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from prodip.conformance.compare import (
    LogitAccumulator,
    bits_per_char,
    check_value,
    greedy_agreement,
    heldout_shift,
    identical_prefix,
    kl_per_position,
    load_tolerances,
    logit_stats,
    nll_per_position,
    tie_margin,
)
from prodip.conformance.config import DEFAULT_TOLERANCES


def test_kl_closed_form():
    # p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3)
    ref = np.log(np.array([[0.5, 0.5]]))
    cand = np.log(np.array([[0.25, 0.75]])) + 7.0  # softmax is shift-invariant
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert kl_per_position(ref, cand)[0] == pytest.approx(expected, rel=1e-12)
    assert kl_per_position(ref, ref + 3.0)[0] == pytest.approx(0.0, abs=1e-15)


def test_nll_and_bits_per_char():
    logits = np.log(np.array([[0.25, 0.75], [0.5, 0.5]]))
    nll = nll_per_position(logits, np.array([1, 0]))
    np.testing.assert_allclose(nll, [-math.log(0.75), math.log(2)])
    assert bits_per_char(2 * math.log(2), 4) == pytest.approx(0.5)


def test_heldout_shift_parts_known_answers():
    """kl + text is the NLL difference; kl is the summed KL; text has mean 0 and variance text_sd**2 over
    targets drawn from the reference (enumerated exactly at one position); 300 positions span two chunks."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(300, 7))
    cand = ref + rng.normal(scale=0.3, size=ref.shape)
    targets = rng.integers(0, 7, size=300)
    s = heldout_shift(ref, cand, targets)
    direct = nll_per_position(cand, targets).sum() - nll_per_position(ref, targets).sum()
    assert s.nll_delta == pytest.approx(direct, rel=1e-12)
    assert s.kl == pytest.approx(kl_per_position(ref, cand).sum(), rel=1e-12)
    assert s.kl + s.text == pytest.approx(s.nll_delta, rel=1e-12)
    p = np.exp(ref - ref.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert s.ref_entropy == pytest.approx(float(-(p * np.log(p)).sum()), rel=1e-12)
    one = [heldout_shift(ref[:1], cand[:1], np.array([y])) for y in range(7)]
    assert sum(pi * o.text for pi, o in zip(p[0], one)) == pytest.approx(0.0, abs=1e-15)
    assert sum(pi * o.text**2 for pi, o in zip(p[0], one)) == pytest.approx(one[0].text_sd ** 2, rel=1e-12)


def test_heldout_shift_text_part_is_noise_on_the_references_own_text_and_not_on_other_text():
    """The same candidate (the reference at temperature 1/1.2: logits x 1.2) on text sampled from the
    reference: |text| within 3 sd, nll_delta ~ kl; on text from a distribution the reference predicts badly
    (a different one): text many sd away from 0, and larger than kl."""
    rng = np.random.default_rng(1)
    ref = rng.normal(scale=2.0, size=(4000, 50))
    cand = 1.2 * ref
    p = np.exp(ref - ref.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    own = (p.cumsum(axis=1) > rng.random((4000, 1))).argmax(axis=1)
    s = heldout_shift(ref, cand, own)
    assert abs(s.text) < 3 * s.text_sd and s.kl > 0
    other = ref.argmin(axis=1)  # the token the reference finds least likely
    t = heldout_shift(ref, cand, other)
    assert t.text > 20 * t.text_sd and t.text > 10 * t.kl


def test_logit_stats_known_values():
    ref = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, -1.0]], np.float32)
    cand = ref.copy()
    cand[0, 0] = 2.5  # flips the argmax of row 0, |delta| = 2.5
    s = logit_stats(ref, cand)
    assert s["max_abs_logit"] == pytest.approx(2.5)
    assert s["mean_abs_logit"] == pytest.approx(2.5 / 3 / 2)
    assert s["rel_max_abs_logit"] == pytest.approx(2.5 / 4.0)  # ref range 3 - (-1)
    assert s["top1"] == 0.5
    assert s["kl_mean"] > 0 and s["kl_p999"] >= s["kl_mean"]


def test_accumulator_nonfinite_candidate_is_infinite_difference():
    acc = LogitAccumulator()
    acc.add(np.zeros((2, 3), np.float32), np.array([[0, np.nan, 0], [0, 0, 0]], np.float32))
    r = acc.result()
    assert math.isinf(r["max_abs_logit"]) and math.isinf(r["kl_mean"])
    assert not check_value(r["max_abs_logit"], {"max": 1e9})


def test_identical_prefix():
    assert identical_prefix(np.array([1, 2, 3, 4]), np.array([1, 2, 9, 4])) == 2
    assert identical_prefix(np.array([1, 2]), np.array([1, 2])) == 2
    assert identical_prefix(np.array([5]), np.array([6])) == 0


def _steps(*rows):
    """Reference step logits over a 4-token vocabulary."""
    return [np.asarray(r, np.float32) for r in rows]


def test_greedy_agreement_known_answers():
    """Ids may part only where the reference's pick leads the candidate's pick by <= the tie margin; after
    the parting nothing is compared; a clear lead refuses; margin 0 accepts only an exact tie."""
    steps = _steps([5, 1, 0, 0], [2.0, 2.0005, 0, 0], [0, 0, 9, 1])
    prompt = [7, 7]
    ref = prompt + [0, 1, 2]
    # a near tie at step 1 (margin 5e-4 <= 1e-3): agreed, and step 2 (3 vs 2) is never compared
    v = greedy_agreement(ref, prompt + [0, 0, 3], steps, 1e-3, prompt_len=2)
    assert (v.agreed, v.step) == (True, 1) and v.margin == pytest.approx(5e-4, abs=1e-6)
    assert "new token 1" in v.reason and "near tie" in v.reason
    # the same parting under an exact rule (tie 0) and under fp32's 2e-4: refused
    assert not greedy_agreement(ref, prompt + [0, 0, 3], steps, 0.0, prompt_len=2).agreed
    assert not greedy_agreement(ref, prompt + [0, 0, 3], steps, tie_margin({"max_abs_logit": {"max": 1e-4}}), 2).agreed
    # a clear lead at step 0 (5 vs 1: margin 4): refused, whatever a generous margin
    v = greedy_agreement(ref, prompt + [1, 1, 2], steps, 0.1, prompt_len=2)
    assert (v.agreed, v.step, v.margin) == (False, 0, 4.0) and "clear choice" in v.reason
    # the candidate took a token far behind: the margin is to ITS pick (5 - 0)
    assert not greedy_agreement(ref, prompt + [2], steps, 1.0, prompt_len=2).agreed
    # identical ids: agreed with no parting; an exact tie passes even tie 0
    v = greedy_agreement(ref, list(ref), steps, 0.0, prompt_len=2)
    assert (v.agreed, v.step, v.margin, v.reason) == (True, None, None, "identical ids")
    tied = _steps([3.0, 3.0, 0, 0])
    assert greedy_agreement([0], [1], tied, 0.0).agreed
    # refusals: other prompt, same ids cut short, no logits at the parting step, an id outside the vocabulary
    assert greedy_agreement(ref, [7, 8, 0, 1, 2], steps, 1.0, prompt_len=2).reason == "the prompts' ids differ"
    assert "lengths differ" in greedy_agreement(ref, ref[:-1], steps, 1.0, prompt_len=2).reason
    assert "no reference logits" in greedy_agreement([0, 0, 0, 0], [0, 0, 0, 1], steps, 1.0).reason
    assert "outside the vocabulary" in greedy_agreement([0], [9], steps, 1.0).reason
    with pytest.raises(ValueError, match="tie margin"):
        greedy_agreement(ref, ref, steps, -1.0)


def test_tie_margin_is_twice_the_logits_bound():
    """Within |dlogit| <= e a candidate can only overtake where the reference led by <= 2e: the shipped
    fp32 and gguf-f16 tables give 2e-4 and 0.1; a table without a logits bound demands identical ids."""
    tol = load_tolerances(DEFAULT_TOLERANCES)
    assert tie_margin(tol["fp32"]) == pytest.approx(2e-4)
    assert tie_margin(tol["gguf-f16"]) == pytest.approx(0.1)
    assert tie_margin(tol["int8"]) == tie_margin(None) == 0.0


def test_check_value():
    assert check_value(1e-5, {"max": 1e-4}) and not check_value(2e-4, {"max": 1e-4})
    assert check_value(0.99, {"min": 0.97}) and not check_value(float("nan"), {"min": 0.0})
    assert check_value(True, {"equals": True}) and not check_value(None, {"max": 1.0})
    with pytest.raises(ValueError, match="max, min, equals"):
        check_value(1.0, {"below": 2})


def test_shipped_tolerances_cover_every_candidate():
    from prodip.export.config import VARIANTS

    tol = load_tolerances(DEFAULT_TOLERANCES)
    names = {"transformers", *VARIANTS}
    assert names <= set(tol)
    for exact in ("safetensors", "transformers", "fp32"):  # issue 6: exact candidates
        assert tol[exact]["max_abs_logit"] == {"max": 1e-4}
        assert tol[exact]["greedy_identical"] == {"equals": True}
    assert tol["fp16"]["top1"] == {"min": 0.995} and tol["fp16"]["kl_mean"] == {"max": 1e-3}
    assert tol["int8"]["top1"] == {"min": 0.95} and tol["int8"]["kl_mean"] == {"max": 2e-2}
    assert tol["int4"]["top1"] == {"min": 0.85} and tol["int4"]["kl_mean"] == {"max": 2e-2}


def test_bad_tolerance_file(tmp_path):
    p = tmp_path / "t.toml"
    p.write_text("format_version = 1\n[fp32]\nmax_abs_logit = 1e-4\n")
    with pytest.raises(ValueError, match=r"\[fp32\] max_abs_logit"):
        load_tolerances(p)
    with pytest.raises(FileNotFoundError):
        load_tolerances(tmp_path / "missing.toml")


def test_config_from_toml_table(tmp_path):
    """`prodip run`'s [conformance] table and flags resolve into ConformanceConfig; unknown keys fail."""
    from prodip.base.config import ConfigError, resolve
    from prodip.conformance import ConformanceConfig

    p = tmp_path / "c.toml"
    p.write_text('[conformance]\nexport_dir = "e"\nvariants = ["fp32", "int8"]\ngreedy_tokens = 16\n')
    cfg = resolve(ConformanceConfig, toml_path=str(p), section="conformance")
    assert cfg.variants == ["fp32", "int8"] and cfg.greedy_tokens == 16 and cfg.out is None
    p.write_text("[conformance]\ngreedy_token = 16\n")
    with pytest.raises(ConfigError, match="greedy_tokens"):
        resolve(ConformanceConfig, toml_path=str(p), section="conformance")
    with pytest.raises(ValueError, match="greedy_tokens"):
        ConformanceConfig(greedy_tokens=0)


def test_candidates_of_a_manifest():
    from prodip.base.manifest import ExportManifest
    from prodip.conformance.suite import plan_candidates

    manifest = ExportManifest.from_dict(
        {
            "format_version": 1,
            "source_checkpoint": {},
            "files": {},
            "variants": {
                "safetensors": {"path": "model.safetensors", "format": "safetensors", "dtype": "bfloat16"},
                "fp32": {"path": "onnx/model.onnx", "format": "onnx"},
                "int8": {"path": "onnx/model_quantized.onnx", "format": "onnx"},
            },
        }
    )
    cands = plan_candidates(manifest)
    assert [(c.name, c.variant, c.kind, c.tolerance_table) for c in cands] == [
        ("safetensors", "safetensors", "prodip", "safetensors_bfloat16"),
        ("transformers", "safetensors", "transformers", "transformers_bfloat16"),
        ("fp32", "fp32", "onnx", "fp32"),
        ("int8", "int8", "onnx", "int8"),
    ]
    assert [c.name for c in plan_candidates(manifest, ["safetensors", "int8"])] == [
        "safetensors",
        "transformers",
        "int8",
    ]
    with pytest.raises(ValueError, match="int4"):
        plan_candidates(manifest, ["int4"])
