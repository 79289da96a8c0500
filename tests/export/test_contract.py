"""The decoder's input contract, enforced inside every ONNX graph (case C3 of shared/cases/2026-11-30.md).

A batch of two prompts, the second left-padded, prefilled, then one decode step:
* an ``attention_mask`` whose length is not past + T (1, past, past + 4) is refused by the graph
  (its Reshape named ``attention_mask_length_must_equal_past_plus_sequence_length``);
* NaN or garbage in cache slots the mask excludes (keys and values) changes no output.

Both graphs (``contrib``, the default, and ``standard``) and every ONNX variant.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from prodip.base.manifest import load_manifest
from prodip.base.variants import variant_names
from prodip.export.graph import MASK_CHECK_NODE
from tests.export.conftest import ort_session, positions, run_ort, source_model

VARIANTS = variant_names(format="onnx")  # every ONNX row of the table, so a new one is tested
#: the standard-operator graph is checked on the widest and the narrowest variant
STANDARD = [VARIANTS[0], VARIANTS[-1]]


@pytest.fixture(scope="module")
def standard_export(tmp_path_factory):
    from tests.fixtures import build_tiny_export

    return build_tiny_export(
        tmp_path_factory.mktemp("standard"),
        vocab_size=4096,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        seed=1,
        variants=STANDARD,
        export_options={"onnx_graph": "standard"},
    )


def _prefill(session, config):
    """Row 1 left-padded by 3; returns (mask (2, 8), present, logits)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 300, size=(2, 8))
    mask = np.ones((2, 8), np.int64)
    mask[1, :3] = 0
    logits, present = run_ort(session, config, ids, mask, positions(mask))
    return mask, present, logits


def _step(session, config, mask, present, past_len_mask=None):
    nxt = np.array([[5], [7]], np.int64)
    full = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
    pos = full.sum(-1, keepdims=True) - 1
    use = full if past_len_mask is None else past_len_mask
    return run_ort(session, config, nxt, use, pos, present)[0]


def _cases(request):
    return request.getfixturevalue(request.param[0]), request.param[1]


@pytest.fixture(
    params=[("gqa_export", v) for v in VARIANTS] + [("standard_export", v) for v in STANDARD],
    ids=lambda p: f"{p[0].removesuffix('_export')}-{p[1]}",
)
def graph_variant(request):
    return _cases(request)


def test_graph_kind_recorded(gqa_export, standard_export):
    assert load_manifest(gqa_export).variants["fp32"].graph == "contrib"
    assert load_manifest(standard_export).variants["fp32"].graph == "standard"


@pytest.mark.parametrize("length", ["one", "past", "past+4"])
def test_wrong_mask_length_is_refused(graph_variant, length):
    export_dir, variant = graph_variant
    config = source_model(export_dir).config
    s = ort_session(export_dir, variant)
    mask, present, _ = _prefill(s, config)
    P = mask.shape[1]
    width = {"one": 1, "past": P, "past+4": P + 5}[length]
    bad = np.ones((2, width), np.int64)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.Fail, match=MASK_CHECK_NODE):
        _step(s, config, mask, present, past_len_mask=bad)
    _step(s, config, mask, present)  # the right length still runs


def test_masked_cache_slots_cannot_change_the_output(graph_variant):
    export_dir, variant = graph_variant
    config = source_model(export_dir).config
    s = ort_session(export_dir, variant)
    mask, present, _ = _prefill(s, config)
    want = _step(s, config, mask, present)
    for fill in (np.nan, 1e30, -7.0):
        bad = [p.copy() for p in present]
        for p in bad:  # row 1's three padded slots, keys and values of every layer
            p[1, :, :3] = fill
        got = _step(s, config, mask, bad)
        assert np.isfinite(got).all(), f"{variant}: fill {fill} reached the logits"
        np.testing.assert_array_equal(got, want, err_msg=f"{variant}: fill {fill} in masked slots moved the logits")


def test_graph_choice_follows_the_model_shape():
    from prodip.base.errors import InvalidInput
    from prodip.export.onnx import resolve_graph
    from tests.fixtures import tiny_config

    ok, odd = tiny_config(hidden_size=64, num_attention_heads=4), tiny_config(hidden_size=48, num_attention_heads=4)
    assert (ok.head_dim, odd.head_dim) == (16, 12)
    assert resolve_graph("auto", ok) == "contrib" and resolve_graph("auto", odd) == "standard"
    assert resolve_graph("standard", ok) == "standard"
    with pytest.raises(InvalidInput, match="head_dim 12 is not a multiple of 8"):
        resolve_graph("contrib", odd)
