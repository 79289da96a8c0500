"""The int4's WASM graph (manifest ``wasm_path``) as a conformance candidate of its own, ``int4-wasm``: planned
whenever int4 is checked, run by ONNX Runtime as onnxruntime-web's WASM build runs it, gated against the training
model by its own ``[int4-wasm]`` table, and failed (alone) by a fault planted in that file only.

    python -m pytest tests/conformance/test_wasm_candidate.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from prodip.base.config import ConfigError
from prodip.base.errors import InvalidInput
from prodip.base.manifest import ExportManifest, load_manifest
from prodip.conformance import evaluate, faults
from prodip.conformance.compare import load_tolerances
from prodip.conformance.config import DEFAULT_TOLERANCES
from prodip.conformance.suite import plan_candidates
from prodip.conformance.tolerances import REQUIRED_REDUCED, require_tables, validate_tolerances
from tests.conformance.conftest import TINY_TOLERANCES

WASM = "onnx/model_wasm_q4.onnx"
SESSION = {"session.disable_quant_qdq": "1"}


def _manifest(wasm: object = None) -> ExportManifest:
    int4 = {"path": "onnx/model_q4.onnx", "format": "onnx", "dtype": "int4"}
    if wasm is not None:
        int4.update(wasm_path=WASM, wasm=wasm)
    row = {"bytes": 1, "sha256": "0" * 64}
    return ExportManifest.from_dict(
        {
            "format_version": 1,
            "source_checkpoint": {},
            "files": {p: row for p in ("onnx/model.onnx", "onnx/model_q4.onnx", WASM)},
            "variants": {"fp32": {"path": "onnx/model.onnx", "format": "onnx"}, "int4": int4},
        }
    )


def _failed(report: dict, candidate: str) -> set[str]:
    return {c["metric"] for c in report["candidates"][candidate]["checks"] if c["passed"] is False}


def test_planned_after_int4_with_the_manifests_session_options():
    manifest = _manifest({"file": "model_wasm_q4.onnx", "session_config": SESSION})
    cands = plan_candidates(manifest)
    assert [(c.name, c.variant, c.kind, c.path, c.tolerance_table) for c in cands] == [
        ("fp32", "fp32", "onnx", "onnx/model.onnx", "fp32"),
        ("int4", "int4", "onnx", "onnx/model_q4.onnx", "int4"),
        ("int4-wasm", "int4", "onnx", WASM, "int4-wasm"),
    ]
    wasm = cands[-1]
    assert dict(wasm.session_config) == SESSION and wasm.fp32_matmulnbits and not wasm.is_variant_file
    assert not cands[1].session_config and not cands[1].fp32_matmulnbits and cands[1].is_variant_file
    # int4 brings its web graph; naming the web graph alone checks int4 whole (the verdict is int4's)
    assert [c.name for c in plan_candidates(manifest, ["int4"])] == ["int4", "int4-wasm"]
    assert [c.name for c in plan_candidates(manifest, ["int4-wasm"])] == ["int4", "int4-wasm"]
    assert [c.name for c in plan_candidates(manifest, ["fp32"])] == ["fp32"]
    assert [c.name for c in plan_candidates(_manifest())] == ["fp32", "int4"]  # no wasm_path: no candidate
    with pytest.raises(ValueError, match=r"variants\.int4\.wasm\.session_config = .*string values"):
        plan_candidates(_manifest({"session_config": {"session.disable_quant_qdq": 1}}))


def test_tolerance_tables_accept_int4_wasm_with_int4s_checks():
    shipped = load_tolerances(DEFAULT_TOLERANCES)
    # starts from int4's bounds (never looser)
    assert {k: v for k, v in shipped["int4-wasm"].items() if k != "note"} == shipped["int4"]
    assert load_tolerances(TINY_TOLERANCES)["int4-wasm"] == load_tolerances(TINY_TOLERANCES)["int4"]
    base = {"format_version": 1, "global": shipped["global"]}
    lacking = {**base, "int4-wasm": {k: v for k, v in shipped["int4"].items() if k != "kl_mean"}}
    assert validate_tolerances(lacking, "t.toml") == [
        "t.toml: [int4-wasm] lacks required check(s) kl_mean; a check cannot be dropped by leaving it out "
        "(loosen its bound instead, with a note saying why)"
    ]
    assert "kl_mean" in REQUIRED_REDUCED and "dynamic_axes" in shipped["int4-wasm"]
    (unknown,) = validate_tolerances({**base, "fp32-wasm": shipped["fp32"]}, "t.toml")
    assert unknown.startswith("t.toml: [fp32-wasm]: unknown table")  # only int4 has a WASM graph
    tables = [c.tolerance_table for c in plan_candidates(_manifest({"session_config": SESSION}))]
    without = {k: v for k, v in shipped.items() if k != "int4-wasm"}
    with pytest.raises(ConfigError, match=r"no tolerance table .*\[int4-wasm\] \(required: top1"):
        require_tables(without, tables, "t.toml")


def test_runs_with_float32_matmulnbits_as_the_wasm_kernel(tiny_artifacts):
    """The candidate's runner computes the WASM graph's MatMulNBits in float32 (accuracy_level 0; ONNX Runtime's
    CPU build quantises activations at level 4, the WASM kernel does not): its logits equal ONNX Runtime's on
    ``fp32_compute_copy`` of the file, the copy the onnxruntime-web row is compared with (measured against the
    WASM build in Node: 2.1e-6 on this export)."""
    from prodip.conformance.runners import OrtRunner, wasm_arithmetic_graph
    from prodip.conformance.runtimes import fp32_compute_copy
    from prodip.train.config import ModelConfig

    export = tiny_artifacts["export"]
    cfg = ModelConfig.from_hf_dict(json.loads((export / "config.json").read_text(encoding="utf-8")))
    (wasm,) = [c for c in plan_candidates(load_manifest(export)) if c.name == "int4-wasm"]

    def levels(model: onnx.ModelProto) -> list[int]:
        return [
            a.i
            for n in model.graph.node
            if n.op_type == "MatMulNBits"
            for a in n.attribute
            if a.name == "accuracy_level"
        ]

    shipped = onnx.load(str(export / wasm.path), load_external_data=False)
    assert set(levels(shipped)) == {4}  # hidden 48: K not a multiple of the block, kept as MatMulNBits
    graph = wasm_arithmetic_graph(export / wasm.path)
    assert graph is not None
    edited = onnx.load_from_string(graph)
    assert levels(edited) == [0] * len(levels(shipped))
    assert [n.op_type for n in edited.graph.node] == [n.op_type for n in shipped.graph.node]
    assert "MatMulInteger" in {n.op_type for n in edited.graph.node}  # the web graph, not the q4 file

    def runner(path, **kw):
        dims = dict(num_layers=cfg.num_hidden_layers, num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim)
        return OrtRunner(path, "x", **dims, threads=1, **kw)

    ids = np.array([[1, 17, 42, 99, 7, 5, 33, 8]])
    mask = np.ones_like(ids)
    pos = np.cumsum(mask, 1) - 1
    got = runner(export / wasm.path, session_config=dict(wasm.session_config), fp32_matmulnbits=True)
    level4 = runner(export / wasm.path, session_config=dict(wasm.session_config))
    copy = fp32_compute_copy(export / wasm.path)
    assert copy is not None
    with copy as path:
        want = runner(path, session_config=dict(wasm.session_config)).forward(ids, mask, pos)[0]
    np.testing.assert_allclose(got.forward(ids, mask, pos)[0], want, atol=1e-5, rtol=0)
    assert np.abs(level4.forward(ids, mask, pos)[0] - want).max() > 1e-3  # what the flip changes


@pytest.mark.slow
def test_measured_against_the_training_model_and_a_fault_in_it_fails_it_alone(tiny_artifacts, conf_cfg, tmp_path):
    """Good export: int4-wasm measured like every candidate, passing, near the int4 file's own distance (the 8-bit
    step is finer than every int4 block's). A layer zeroed in the WASM graph only fails int4-wasm (and so the int4
    variant), while the int4 file itself still passes."""
    good = evaluate(conf_cfg(tiny_artifacts["export"], variants=["int4"]))
    assert set(good["candidates"]) == {"int4", "int4-wasm"}
    assert good["passed"] and good["variants"] == {"int4": True}, good["candidates"]["int4-wasm"]["checks"]
    cand = good["candidates"]["int4-wasm"]
    m, q4 = cand["metrics"], good["candidates"]["int4"]["metrics"]
    assert cand["path"] == WASM and cand["tolerance_table"] == "int4-wasm" and cand["variant"] == "int4"
    assert m["session_config"] == SESSION and m["fp32_matmulnbits"] is True and m["dynamic_axes"] is True
    gated = {c["metric"] for c in cand["checks"]}
    assert {"top1", "kl_mean", "kv_cache_kl_mean", "padded_batch_kl_mean", "bpc_delta_max"} <= gated
    assert set(m["heldout"]) == {"bn", "en"}
    assert 0 < m["kl_mean"] <= 1.2 * q4["kl_mean"] and m["top1"] >= q4["top1"] - 0.05, (m, q4)
    assert m["bpc_delta_max"] <= q4["bpc_delta_max"] + 0.01

    bad = faults.FAULTS["zeroed_layer_int4_wasm"](tiny_artifacts["export"], tmp_path / "bad")
    assert (bad / "onnx/model_q4.onnx").read_bytes() == (tiny_artifacts["export"] / "onnx/model_q4.onnx").read_bytes()
    report = evaluate(conf_cfg(bad, variants=["int4"]))
    assert {"kl_mean", "top1"} <= _failed(report, "int4-wasm")
    assert report["candidates"]["int4"]["passed"] and not report["candidates"]["int4-wasm"]["passed"]
    assert report["variants"] == {"int4": False} and not report["passed"]
    assert report["candidates"]["int4-wasm"]["metrics"]["kl_mean"] > 3 * m["kl_mean"]


def _tampered(export: Path, dst: Path, manifest=None, config=None) -> Path:
    """A copy of ``export`` with ``manifest(int4 entry)`` / ``config(prodip_wasm_q4 entry)`` applied in place to
    the parsed file, every file re-hashed into the manifest (the tamper is not caught as a changed file)."""
    bad = faults.copy_export(export, dst)
    for name, edit, part in (
        ("manifest.json", manifest, lambda d: d["variants"]["int4"]),
        ("config.json", config, lambda d: d["transformers.js_config"]),
    ):
        if edit is not None:
            data = json.loads((bad / name).read_text(encoding="utf-8"))
            edit(part(data))
            (bad / name).write_text(json.dumps(data, indent=2), encoding="utf-8")
    faults.refresh_manifest(bad)
    return bad


def _wasm(**kw):
    return lambda e: e["wasm"].update(kw)


_OUTSIDE = "../{export}/" + WASM  # the same file of the untampered export, beside the copy
MANIFEST_TAMPERS = {
    "variant's own file": (
        lambda e: e.update(wasm_path="onnx/model_q4.onnx"),
        r"variants\.int4\.wasm_path = 'onnx/model_q4\.onnx' is variant 'int4''s own file",
    ),
    "outside the export": (None, r"variants\.int4\.wasm_path = '\.\./.*' leaves the export dir"),
    "not listed": (
        lambda e: (e.update(wasm_path="onnx/copy_q4.onnx"), e["wasm"].update(file="copy_q4.onnx")),
        r"variants\.int4\.wasm_path = 'onnx/copy_q4\.onnx' is not in manifest\.json's files table",
    ),
    "wasm.file disagrees": (
        _wasm(file="model_q4.onnx"),
        r"variants\.int4\.wasm\.file = 'model_q4\.onnx' disagrees with .*wasm_path = 'onnx/model_wasm_q4\.onnx'",
    ),
    "no wasm": (lambda e: e.pop("wasm"), r"variants\.int4\.wasm is missing"),
    "empty session config": (
        _wasm(session_config={}),
        r"variants\.int4\.wasm\.session_config\['session\.disable_quant_qdq'\] = None, expected '1'",
    ),
    "unknown session key": (
        _wasm(session_config={"session.bogus_key": "1"}),
        r"session_config\['session\.disable_quant_qdq'\] = None, expected '1' .*; manifest\.json variants\.int4\.wasm"
        r"\.session_config has unknown key\(s\) \['session\.bogus_key'\]",
    ),
    "extra session key": (
        _wasm(session_config={**SESSION, "session.bogus_key": "1"}),
        r"variants\.int4\.wasm\.session_config has unknown key\(s\) \['session\.bogus_key'\]",
    ),
    "session value": (
        _wasm(session_config={"session.disable_quant_qdq": "0"}),
        r"session_config\['session\.disable_quant_qdq'\] = '0', expected '1'",
    ),
}


@pytest.mark.parametrize("tamper", list(MANIFEST_TAMPERS))
def test_a_manifest_entry_naming_another_file_or_arithmetic_is_refused_before_measuring(
    tiny_artifacts, conf_cfg, tmp_path, tamper
):
    """The int4-wasm candidate measures the file and the session options the manifest names: one that is not
    the export's web graph, or options other than the export writes (without session.disable_quant_qdq=1 the
    graph does not run the WASM build's arithmetic), is refused (exit 2) before anything is measured."""
    export = tiny_artifacts["export"]
    edit, message = MANIFEST_TAMPERS[tamper]
    if edit is None:  # a path climbing out of the copy to the untampered export's web graph (a real file)
        edit = lambda e: e.update(wasm_path=_OUTSIDE.format(export=export.name))  # noqa: E731
    bad = _tampered(export, tmp_path / "bad", manifest=edit)
    if tamper == "not listed":  # the file exists, but the export did not write it
        shutil.copyfile(bad / WASM, bad / "onnx/copy_q4.onnx")
    if tamper == "outside the export":
        shutil.copytree(export, tmp_path / export.name)
    with pytest.raises(InvalidInput, match=message) as err:
        evaluate(conf_cfg(bad, variants=["int4"]))
    assert "nothing was measured or written" in str(err.value)
    assert not (bad / "conformance").exists()
    with pytest.raises(InvalidInput, match=message):  # the same refusal for every variant's check
        plan_candidates(load_manifest(bad))


def _global(export: Path, config_of: Path) -> dict:
    """The export-wide metrics of ``export`` against the model config of ``config_of`` (untampered)."""
    from tokenizers import Tokenizer

    from prodip.conformance.suite import global_metrics
    from prodip.train.config import ModelConfig

    manifest = load_manifest(export)
    cfg = ModelConfig.from_hf_dict(json.loads((config_of / "config.json").read_text(encoding="utf-8")))
    tok = Tokenizer.from_file(str(export / "tokenizer.json"))
    return global_metrics(export, manifest, {"tokenizer_sha256": manifest.tokenizer_sha256}, ["ab"], tok, cfg)


KEY = "config.json transformers.js_config.prodip_wasm_q4"
CONFIG_TAMPERS = {
    "empty session config": (
        lambda t: t["prodip_wasm_q4"].update(session_config={}),
        {f"{KEY}.session_config": [SESSION, {}]},
    ),
    "another model file": (
        lambda t: t["prodip_wasm_q4"].update(model_file_name="model"),
        {f"{KEY}.model_file_name": ["model_wasm", "model"]},
    ),
    "other external data": (  # the tiny export's weights are inside its graphs: it shares none
        lambda t: t["prodip_wasm_q4"].update(external_data=[{"path": "w.onnx_data", "data": "onnx/w.onnx_data"}]),
        {f"{KEY}.external_data": [[], [{"path": "w.onnx_data", "data": "onnx/w.onnx_data"}]]},
    ),
    "unknown field": (lambda t: t["prodip_wasm_q4"].update(dtype="q8"), {f"{KEY}.dtype": [None, "q8"]}),
}


def test_config_json_web_entry_agrees_with_the_manifest(tiny_artifacts, tmp_path):
    """config.json's prodip_wasm_q4 (what the export's page loads on the WASM device) is compared field by field
    with the manifest's web graph in the export-wide config_matches check: [manifest's, config.json's]."""
    export = tiny_artifacts["export"]
    good = _global(export, export)
    assert good["config_matches"] is True and "config_differences" not in good, good
    tjs = json.loads((export / "config.json").read_text(encoding="utf-8"))["transformers.js_config"]
    entry = load_manifest(export).variants["int4"]
    assert entry.wasm is not None and entry.wasm["shares_weights_with"] is None  # as tampered below
    assert tjs["prodip_wasm_q4"]["session_config"] == SESSION

    for i, (edit, want) in enumerate(CONFIG_TAMPERS.values()):
        bad = _tampered(export, tmp_path / f"bad{i}", config=edit)
        g = _global(bad, export)
        assert g["config_matches"] is False and g["config_differences"] == want
    gone = _tampered(export, tmp_path / "gone", config=lambda t: t.pop("prodip_wasm_q4"))
    g = _global(gone, export)
    assert list(g["config_differences"]) == [KEY] and g["config_differences"][KEY][1] is None
    assert g["config_differences"][KEY][0]["model_file_name"] == "model_wasm"
    # a web entry without a web graph in the manifest: the page would load a file nothing measured
    unmeasured = _tampered(export, tmp_path / "unmeasured", manifest=lambda e: (e.pop("wasm"), e.pop("wasm_path")))
    g = _global(unmeasured, export)
    assert g["config_differences"] == {KEY: [None, tjs["prodip_wasm_q4"]]}


def test_expected_web_entry_names_the_shared_weights_and_the_file_transformersjs_loads():
    from prodip.conformance.wasm_graph import web_config_differences

    shared = {"file": "model_wasm_q4.onnx", "shares_weights_with": "model_q4.onnx_data", "session_config": SESSION}
    page = {
        "model_file_name": "model_wasm",
        "external_data": [{"path": "model_q4.onnx_data", "data": "onnx/model_q4.onnx_data"}],
        "session_config": SESSION,
    }
    manifest = _manifest(shared)
    assert web_config_differences(manifest, {"transformers.js_config": {"prodip_wasm_q4": page}}) == {}
    assert web_config_differences(_manifest(), {"transformers.js_config": {}}) == {}  # neither has one
    # a graph no model_file_name loads (transformers.js reads onnx/<model_file_name>_q4.onnx)
    manifest.variants["int4"].wasm_path = "onnx/web.onnx"
    (diff,) = web_config_differences(manifest, {"transformers.js_config": {"prodip_wasm_q4": page}}).items()
    assert diff == (
        "config.json transformers.js_config.prodip_wasm_q4.model_file_name",
        ["(none: transformers.js loads onnx/<model_file_name>_q4.onnx, not onnx/web.onnx)", "model_wasm"],
    )
