"""Conformance's runtime axis: onnxruntime-genai, transformers.js and onnxruntime-web (WASM) on every ONNX variant, gated.

Real runtimes: onnxruntime-genai (pip extra ``runtimes``) and transformers.js from the repository's
``node/node_modules`` (``npm install --ignore-scripts --prefix node``).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from prodip.base.manifest import load_manifest
from prodip.base.variants import ONNX_VARIANTS
from prodip.conformance.runtimes import (
    GENAI,
    ORT_WEB,
    ORT_WEB_LOGITS_METRIC,
    REFERENCE_METRIC,
    RUNTIME_METRICS,
    TRANSFORMERS_JS,
    genai_greedy,
)
from prodip.conformance.suite import evaluate
from prodip.conformance.verdict import merge_verdict

pytestmark = pytest.mark.slow
BOTH = [GENAI, TRANSFORMERS_JS, ORT_WEB]


@pytest.fixture(scope="module")
def contrib_export(tiny_artifacts, tmp_path_factory):
    """(export, checkpoint) of a hidden-64 model (head_dim 16): the contrib graph, as the demo's (the
    shared conformance fixture's head_dim 12 gets the standard graph)."""
    from prodip.export.config import ExportConfig
    from prodip.export.core import export_checkpoint
    from tests import fixtures as tiny

    root = tmp_path_factory.mktemp("runtimes")
    ckpt = tiny.build_checkpoint(root / "run", tiny_artifacts["tokenizer"], hidden_size=64)
    export = export_checkpoint(ExportConfig(checkpoint=str(ckpt), out=str(root / "export")))
    assert load_manifest(export).variants["fp32"].graph == "contrib"
    return export, ckpt


@pytest.fixture(scope="module")
def report_cfg(tiny_artifacts, contrib_export):
    """The config of :func:`report`: every runtime on every ONNX variant of the contrib export (the tiny
    tolerances, shards and settings of every conformance test: ``conftest.tiny_conf_cfg``)."""
    from tests.conformance.conftest import tiny_conf_cfg

    return tiny_conf_cfg(
        tiny_artifacts,
        contrib_export[0],
        checkpoint=str(contrib_export[1]),
        runtimes=BOTH,
        variants=list(ONNX_VARIANTS),
    )


@pytest.fixture(scope="module")
def report(report_cfg):
    return evaluate(report_cfg)


def test_every_runtime_reproduces_onnx_runtime_on_every_variant(report):
    assert report["runtimes"]["checked"] == BOTH
    assert set(report["runtimes"]["prompts"]) == {"bn", "en"}
    for variant in ONNX_VARIANTS:
        cand = report["candidates"][variant]
        rt = cand["runtimes"]
        for runtime in BOTH:
            got = rt["runtimes"][runtime]
            assert got["error"] is None and got["ids_identical"], (variant, runtime, got)
            # onnxruntime-web on a MatMulNBits file: vs ONNX Runtime with the WASM kernel's fp32 arithmetic
            assert (got["ids"] == rt["onnxruntime"]) or (runtime == ORT_WEB and "accuracy_level 0" in got["reference"])
            check = next(c for c in cand["checks"] if c["metric"] == RUNTIME_METRICS[runtime])
            assert check["passed"] is True
        assert all(len(ids) > len(p) for ids, p in zip(rt["onnxruntime"], rt["prompt_ids"]))
    assert report["candidates"]["fp32"]["runtimes"]["reference_identical"] is True
    assert any(c["metric"] == REFERENCE_METRIC for c in report["candidates"]["fp32"]["checks"])
    assert report["candidates"]["int4"]["runtimes"]["runtimes"][TRANSFORMERS_JS]["dtype"] == "q4"
    assert "accuracy_level 0" in report["candidates"]["int4"]["runtimes"]["runtimes"][ORT_WEB]["reference"]
    # onnxruntime-web runs the int4 variant as the export's page does on WASM: its WASM file (8-bit at load)
    assert "model_wasm_q4.onnx" in report["candidates"]["int4"]["runtimes"]["runtimes"][ORT_WEB]["reference"]
    assert "reference" not in report["candidates"]["int8"]["runtimes"]["runtimes"][ORT_WEB]  # the file as it is
    for variant in ONNX_VARIANTS:  # onnxruntime-web's logits, within the variant's own bound
        check = next(c for c in report["candidates"][variant]["checks"] if c["metric"] == ORT_WEB_LOGITS_METRIC)
        assert check["passed"] is True and check["value"] is not None, (variant, check)
        assert ("max" in check["tolerance"]) and check["value"] <= check["tolerance"]["max"]
    fp32_web = report["candidates"]["fp32"]["runtimes"]["runtimes"][ORT_WEB]["logits"]
    assert fp32_web["max_abs_logit"] < 1e-3  # same fp32 file, another build of ONNX Runtime


def test_every_planned_check_is_in_the_report(report_cfg, report):
    """The pytest plugin names one test per planned check (``plan_checks``) before anything runs: each
    runtime's checks, planned, are the ones the report holds (tests/conformance/test_suite.py runs the
    plugin with one runtime). Whether they pass: test_every_runtime_reproduces_onnx_runtime_on_every_variant."""
    from prodip.conformance.checks import find_check, plan_checks

    plan = plan_checks(report_cfg)
    for runtime in BOTH:
        for variant in ONNX_VARIANTS:
            assert (variant, RUNTIME_METRICS[runtime]) in plan
    assert all((v, ORT_WEB_LOGITS_METRIC) in plan for v in ONNX_VARIANTS)
    for candidate, metric in plan:
        find_check(report, candidate, metric)  # KeyError: planned (a test named) but not reported
    in_report = {(c, k["metric"]) for c, cand in report["candidates"].items() for k in cand["checks"]}
    assert in_report == {(c, m) for c, m in plan if c != "export"}  # nothing reported that was not planned


def test_verdict_and_markdown_name_each_runtime(report):
    from prodip.conformance.report import render_markdown

    verdict = merge_verdict(None, report, list(report["variants"]), "conformance/report.json", "0" * 64)
    for variant in ONNX_VARIANTS:
        assert verdict["checks"][variant]["runtimes"] == {GENAI: True, TRANSFORMERS_JS: True, ORT_WEB: True}
    md = render_markdown(report)
    assert f"| candidate | {GENAI} | {TRANSFORMERS_JS} | {ORT_WEB} | fp32 = training model |" in md
    assert "| int4 | identical | identical | identical (max abs logit diff" in md


def test_a_runtime_that_is_not_installed_is_skipped_or_fails(tiny_artifacts, conf_cfg, tmp_path, monkeypatch):
    """One rule with the tokenizer's parity check: not installed is listed as skipped (make RUNTIMES=0), unless
    missing_runtimes = "fail" (CI); before, it failed every variant while the tokenizer stage said "skipped"."""
    from prodip.conformance.report import render_markdown

    monkeypatch.setenv("PRODIP_NODE_ROOT", str(tmp_path))  # no node_modules there
    rep = evaluate(conf_cfg(tiny_artifacts["export"], runtimes=[TRANSFORMERS_JS], variants=["fp32"]))
    metrics = [c["metric"] for c in rep["candidates"]["fp32"]["checks"]]
    assert RUNTIME_METRICS[TRANSFORMERS_JS] not in metrics and rep["variants"]["fp32"] is True and rep["passed"]
    skipped = rep["candidates"]["fp32"]["runtimes"]["runtimes"][TRANSFORMERS_JS]["skipped"]
    assert skipped.startswith("not installed: ") and "npm install --ignore-scripts" in skipped
    assert "| fp32 | skipped (not installed: " in render_markdown(rep)
    verdict = merge_verdict(None, rep, ["fp32"], "conformance/report.json", "0" * 64)
    assert "runtimes" not in verdict["checks"]["fp32"]  # vouches for no runtime it did not run

    rep = evaluate(
        conf_cfg(tiny_artifacts["export"], runtimes=[TRANSFORMERS_JS], variants=["fp32"], missing_runtimes="fail")
    )
    check = next(c for c in rep["candidates"]["fp32"]["checks"] if c["metric"] == RUNTIME_METRICS[TRANSFORMERS_JS])
    assert check["passed"] is False and "npm install --ignore-scripts" in check["note"]
    assert rep["variants"]["fp32"] is False and rep["passed"] is False


def test_an_operator_without_a_wasm_kernel_fails_naming_it(contrib_export, report, conf_cfg, tmp_path):
    """Planted: the int4 file with ONNX Runtime's com.microsoft.GatherBlockQuantized embedding lookup
    (what the export wrote before its lookup was lowered to standard ops). ONNX Runtime's CPU build
    runs it; onnxruntime-web's WASM build has no kernel for it: the WASM check fails and says which."""
    from prodip.conformance.faults import plant_wasm_missing_kernel

    export, ckpt = contrib_export
    planted = plant_wasm_missing_kernel(export, tmp_path / "planted")
    rep = evaluate(conf_cfg(planted, runtimes=[ORT_WEB], variants=["int4"], checkpoint=str(ckpt)))
    checks = {c["metric"]: c for c in rep["candidates"]["int4"]["checks"]}
    failed = checks[RUNTIME_METRICS[ORT_WEB]]
    assert failed["passed"] is False and "GatherBlockQuantized" in failed["note"], failed
    assert checks[ORT_WEB_LOGITS_METRIC]["passed"] is False
    assert rep["variants"]["int4"] is False and rep["passed"] is False
    # the unplanted file passes the same checks (the module's report: the same export, config and runtime)
    ok = {c["metric"]: c for c in report["candidates"]["int4"]["checks"]}
    assert ok[RUNTIME_METRICS[ORT_WEB]]["passed"] is True and ok[ORT_WEB_LOGITS_METRIC]["passed"] is True


def test_no_runtimes_is_said_not_hidden(tiny_artifacts, conf_cfg):
    from prodip.conformance.report import render_markdown

    rep = evaluate(conf_cfg(tiny_artifacts["export"], runtimes=[], variants=["fp32"]))
    assert rep["runtimes"]["checked"] == [] and "runtimes" not in rep["candidates"]["fp32"]
    assert "On-device runtimes: none checked" in render_markdown(rep)


def test_og_model_loads_the_export_dir_as_is(contrib_export):
    """``og.Model(EXPORT_DIR)``: genai_config.json names the int4 variant's shared-buffer graph, no overlay needed."""
    import onnxruntime_genai as og

    export = contrib_export[0]
    config = json.loads((export / "genai_config.json").read_text(encoding="utf-8"))
    assert config["model"]["decoder"]["filename"] == "onnx/model_q4_genai.onnx"
    assert config["search"]["past_present_share_buffer"] is True
    model = og.Model(str(export))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=12)
    gen = og.Generator(model, params)
    gen.append_tokens([1, 40, 41, 42])
    while not gen.is_done():
        gen.generate_next_token()
    direct = [int(i) for i in gen.get_sequence(0)]
    assert direct == genai_greedy(export, "onnx/model_q4.onnx", [[1, 40, 41, 42]], 8)["ids"][0]


def test_shared_buffer_decodes_what_the_contract_graph_decodes(contrib_export):
    """onnxruntime-genai on the default (shared past/present buffer, no per-step cache copy) and on
    int4's contract graph (overlay, no sharing), and ONNX Runtime on the contract graph: the same
    greedy ids for a prompt filling most of the context (60 of 96 positions, 30 new tokens), and
    again with a second generator on the same model (its buffers are reused)."""
    import onnxruntime_genai as og

    from prodip.conformance.runners import OrtRunner
    from prodip.conformance.runtimes import runner_greedy

    export, _ = contrib_export
    cfg = json.loads((export / "config.json").read_text(encoding="utf-8"))
    prompt = [1] + [int(i) for i in np.random.default_rng(3).integers(4, cfg["vocab_size"], 59)]
    runner = OrtRunner(
        export / "onnx" / "model_q4.onnx",
        "int4",
        num_layers=cfg["num_hidden_layers"],
        num_kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        threads=1,
    )
    want = runner_greedy(runner, prompt, 30, None)

    def decode(model):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=90, min_length=90)
        gen = og.Generator(model, params)
        gen.append_tokens(prompt)
        while not gen.is_done():
            gen.generate_next_token()
        return [int(i) for i in gen.get_sequence(0)]

    shared = og.Model(str(export))
    assert decode(shared) == want and decode(shared) == want
    config = og.Config(str(export))
    overlay = {"model": {"decoder": {"filename": "onnx/model_q4.onnx"}}, "search": {"past_present_share_buffer": False}}
    config.overlay(json.dumps(overlay))
    assert decode(og.Model(config)) == want


@pytest.mark.parametrize("variant", ONNX_VARIANTS)
def test_genai_batch_decodes_what_each_prompt_decodes_alone(contrib_export, variant):
    """onnxruntime-genai on each variant's ``_genai`` graph (shared buffer, rotary inside
    GroupQueryAttention, padding by sequence length): three prompts of 3, 7 and 10 tokens in one
    batch, padded on the right with the pad id as onnxruntime-genai's own ``PadInputs`` pads (it
    masks pad ids), give each prompt's greedy ids alone."""
    import onnxruntime_genai as og

    from prodip.export.genai import variant_overlay

    export, _ = contrib_export
    pad = json.loads((export / "config.json").read_text(encoding="utf-8"))["pad_token_id"]
    config = og.Config(str(export))
    config.overlay(json.dumps(variant_overlay(export, load_manifest(export).variants[variant].path)))
    model = og.Model(config)
    prompts = [[1, 8, 4], [1, 5, 9, 14, 3, 22, 7], [1, 30, 31, 32, 33, 34, 35, 36, 37, 38]]
    width, new = max(map(len, prompts)), 14

    def greedy(rows: np.ndarray) -> list[list[int]]:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=rows.shape[1] + new, batch_size=len(rows))
        gen = og.Generator(model, params)
        gen.append_tokens(rows)
        while not gen.is_done():
            gen.generate_next_token()
        return [[int(i) for i in gen.get_sequence(b)[rows.shape[1] :]] for b in range(len(rows))]

    batch = np.full((len(prompts), width), pad, np.int32)
    for row, prompt in zip(batch, prompts):
        row[: len(prompt)] = prompt
    alone = [greedy(np.array([p], np.int32))[0] for p in prompts]  # shorter if <|eos|> came
    together = greedy(batch)
    assert all(alone) and [t[: len(a)] for t, a in zip(together, alone)] == alone


def test_markdown_says_why_a_check_failed_and_skips_an_empty_runtime_table():
    """A runtime tokenizer that could not load showed only ``runtime_tokenizer_mismatches = 3`` in
    report.md (the cause was in report.json alone); a device-only export got an empty table."""
    from prodip.conformance.report import _failed_lines, _runtime_lines

    checks = [{"metric": "runtime_tokenizer_mismatches", "value": 3, "tolerance": {"equals": 0}, "passed": False}]
    metrics = {"runtime_tokenizer_error": "RuntimeError: Failed to load HF tokenizer"}
    lines = _failed_lines("pte-fp32", checks, metrics)
    assert lines[0].startswith("- **pte-fp32** `runtime_tokenizer_mismatches` = 3")
    assert "Failed to load HF tokenizer" in lines[1]
    report = {"runtimes": {"checked": [GENAI, TRANSFORMERS_JS]}, "candidates": {"pte-fp32": {"checks": checks}}}
    assert _runtime_lines(report) == [
        "",
        f"On-device runtimes ({GENAI}, {TRANSFORMERS_JS}): no ONNX variant was checked, so none ran.",
    ]


def test_genai_sequences_keep_the_eos_that_stopped_them(contrib_export, tmp_path):
    """A model that ends its text within the new tokens failed every variant's onnxruntime-genai check:
    genai stops on EOS but leaves it out of get_sequence(), while ONNX Runtime's ids keep it. Here the
    genai EOS is made the token greedy decoding emits second, so genai stops on it."""
    import shutil

    export = tmp_path / "export"
    shutil.copytree(contrib_export[0], export)
    prompt = [1, 5, 9, 13]
    free = genai_greedy(export, "onnx/model.onnx", [prompt], 6)["ids"][0]
    assert len(free) == len(prompt) + 6, free  # the tiny model does not stop by itself here
    stop = free[len(prompt) + 1]
    assert stop not in free[: len(prompt) + 1], "pick a prompt whose second new token is new"
    cfg_path = export / "genai_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    cfg["model"]["eos_token_id"] = stop
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    assert genai_greedy(export, "onnx/model.onnx", [prompt], 6)["ids"][0] == free[: len(prompt) + 2]
