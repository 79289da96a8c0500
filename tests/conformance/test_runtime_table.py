"""The runtimes are one table (``prodip.base.runtimes.RUNTIMES``): a row added to it, with its adapter, is run by
conformance (its greedy check gated on every ONNX variant, its chat rendering compared), by the tokenizer parity
check, named in the model card's "runtimes proven", and, marked ``timed``, timed into speed.json and the card's
speed table, with no other edit (docs/architecture.md "Add a runtime").

The added runtime is real enough to be judged: ONNX Runtime on the variant's file in a session of its own
(``ort_greedy``), the reference's chat rendering, and ``tokenizers`` as its tokenizer; a second row whose
adapter drops the last generated token (renders without the first token, stops only at the end of turn, encodes
without ``<|bos|>``) must fail every one of those checks.

python -m pytest tests/conformance/test_runtime_table.py -q
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import tokenizers

import prodip.base.runtimes as table
from prodip.base.runtimes import Runtime, runtime_names
from prodip.conformance.runtimes import ADAPTERS, ChatJob, ChatOutput, GreedyJob, GreedyOutput, RuntimeAdapter
from prodip.conformance.runtimes.common import ort_greedy
from prodip.conformance.runtimes.onnxruntime import OnnxRuntimeAdapter
from prodip.conformance.runtimes.timing import SpeedJob, Timing

GOOD, BAD = "ort-twin", "ort-twin-broken"
#: report.json's keys as the suite wrote them when it assembled dicts (a tiny export, every runtime, main 2b0deed)
REPORT_KEYS = (
    "format_version entry passed variants export_dir export_manifest_sha256 export_files_sha256 checkpoint "
    "tolerances_file tolerances_sha256 tolerances config versions model inputs reference global chat runtimes "
    "candidates tasks base seconds"
).split()
CANDIDATE_KEYS = "variant kind path tolerance_table metrics errors checks passed seconds cpu_seconds runtimes".split()


class OrtTwin(RuntimeAdapter):
    """ONNX Runtime in a session of its own, as a new runtime; ``broken``: the last new token dropped (and the last
    candidate's timing lost)."""

    def __init__(self, name: str, broken: bool = False) -> None:
        self.name, self.broken = name, broken

    def greedy(self, job: GreedyJob) -> dict[str, GreedyOutput]:
        out = {}
        for cand in job.candidates:
            ids, _ = ort_greedy(Path(job.export_dir) / cand.path, cand.name, job)
            out[cand.name] = GreedyOutput(ids=[i[:-1] for i in ids] if self.broken else ids, versions={"twin": "1"})
        return out

    def chat(self, job: ChatJob) -> ChatOutput:
        tok = tokenizers.Tokenizer.from_file(str(Path(job.export_dir) / "tokenizer.json"))
        ids = {k: tok.encode(t, add_special_tokens=False).ids for k, t in job.reference_texts.items()}
        stops = list(job.stop_ids)  # it stops where the export says (generation_config.json), as ONNX Runtime's users
        if self.broken:  # the first token dropped, and only the end of turn a stop
            ids, stops = {k: v[1:] for k, v in ids.items()}, [job.end_of_turn]
        return ChatOutput(ids=ids, stop_ids=stops, end_of_turn_stops=job.end_of_turn in stops)

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        out = OnnxRuntimeAdapter().time_generation(job)  # ONNX Runtime's timing, in sessions of its own
        for timing in out.values():
            timing.version = "twin 1"
        if self.broken:
            out.pop(job.candidates[-1].name)
        return out


def _encoder(broken: bool):
    def encode(tok_dir: Path, texts: list[str], work: Path) -> tuple[list[list[int]], str]:
        tok = tokenizers.Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=not broken)], "twin 1"

    return encode


@pytest.fixture
def twin_rows(monkeypatch):
    """The table with two more on-device rows, their adapters and their tokenizer encoders."""
    from prodip.tokenizer import parity

    row = Runtime(GOOD, GOOD, ("onnx",), modules=("onnxruntime",), greedy_metric="twin_greedy_identical", chat=True)
    rows = (row, replace(row, name=BAD, package=BAD, greedy_metric="twin_broken_greedy_identical"))
    monkeypatch.setattr(table, "RUNTIMES", (*table.RUNTIMES, *(replace(r, tokenizer=True) for r in rows)))
    monkeypatch.setitem(ADAPTERS, GOOD, OrtTwin(GOOD))
    monkeypatch.setitem(ADAPTERS, BAD, OrtTwin(BAD, broken=True))
    monkeypatch.setitem(parity._PYTHON_RUNNERS, GOOD, _encoder(False))
    monkeypatch.setitem(parity._PYTHON_RUNNERS, BAD, _encoder(True))
    return rows


def test_a_new_row_is_listed_everywhere_the_table_is_read(twin_rows):
    from prodip.conformance.config import ConformanceConfig
    from prodip.conformance.runtimes import planned_metrics

    assert runtime_names(greedy=True)[-2:] == (GOOD, BAD) and GOOD in runtime_names(tokenizer=True)
    assert ConformanceConfig().runtimes[-2:] == [GOOD, BAD]  # the default --runtimes: every on-device row
    assert ConformanceConfig(runtimes=[GOOD]).runtimes == [GOOD]  # accepted by name
    assert planned_metrics("fp32", [GOOD]) == ["twin_greedy_identical", "runtime_prompts_reference_identical"]
    with pytest.raises(ValueError, match="unknown runtime") as err:
        ConformanceConfig(runtimes=["no-such-runtime"])
    assert "to check none" not in str(err.value)
    with pytest.raises(ValueError, match=r"to check none, give an empty list \(--runtimes ''\)"):
        ConformanceConfig(runtimes=["none"])


@pytest.mark.slow  # one conformance run of two ONNX variants (~20 s on 2 cores)
def test_a_new_row_is_gated_by_conformance_and_named_by_the_card(twin_rows, tiny_artifacts, conf_cfg):
    from prodip.base.manifest import load_manifest
    from prodip.conformance import card
    from prodip.conformance.checks import plan_checks
    from prodip.conformance.suite import evaluate_run
    from prodip.conformance.verdict import merge_verdict

    export = tiny_artifacts["export"]
    cfg = conf_cfg(export, runtimes=[GOOD], variants=["fp32", "int8"])
    assert ("int8", "twin_greedy_identical") in plan_checks(cfg)
    report, outcome = evaluate_run(cfg)
    for name in ("fp32", "int8"):
        cand = report["candidates"][name]
        res = cand["runtimes"]["runtimes"][GOOD]
        assert res["ids_identical"] is True and res["ids"] == cand["runtimes"]["onnxruntime"], name
        assert res["versions"] == {"twin": "1"}
        check = next(c for c in cand["checks"] if c["metric"] == "twin_greedy_identical")
        assert check == {
            "metric": "twin_greedy_identical",
            "value": True,
            "tolerance": {"equals": True},
            "passed": True,
        }
    assert report["passed"] and report["runtimes"]["checked"] == [GOOD]
    # report.json's layout, built from the typed records, is the one the dict-assembling suite wrote
    assert list(report) == REPORT_KEYS and list(report["global"]) == ["metrics", "checks", "passed"]
    assert list(report["candidates"]["fp32"]) == CANDIDATE_KEYS
    assert list(report["candidates"]["fp32"]["runtimes"]) == ["prompts", "prompt_ids", "onnxruntime", "runtimes"] + [
        "reference_identical"
    ]
    assert list(report["candidates"]["int8"]["runtimes"]["runtimes"][GOOD]) == ["ids_identical", "ids", "error"] + [
        "versions"
    ]
    rows, _ = card.quality_rows(report, load_manifest(export))
    assert {r.variant for r in rows} == {"fp32", "int8"}
    assert all(r.runtimes == ["ONNX Runtime", GOOD] for r in rows), [r.runtimes for r in rows]
    args = (["fp32", "int8"], "conformance/report.json", "0" * 64, "2026-12-02T00:00:00Z")
    verdict = merge_verdict(None, outcome, *args)
    assert verdict["checks"]["int8"]["runtimes"] == {GOOD: True} and verdict["passed"]
    assert merge_verdict(None, report, *args) == verdict  # the typed outcome and the report it is written to agree

    # the broken twin: its check fails each variant, the verdict records it, the card does not name it
    report, outcome = evaluate_run(conf_cfg(export, runtimes=[GOOD, BAD], variants=["int8"]))
    cand = report["candidates"]["int8"]
    failed = [c["metric"] for c in cand["checks"] if c["passed"] is False]
    assert failed == ["twin_broken_greedy_identical"] and not report["passed"]
    assert cand["runtimes"]["runtimes"][BAD]["ids_identical"] is False
    rows, _ = card.quality_rows(report, load_manifest(export))
    assert all(r.runtimes == [GOOD] for r in rows)  # the variant failed: its own runner is not proven either
    verdict = merge_verdict(None, outcome, ["int8"], "conformance/report.json", "0" * 64)
    assert verdict["checks"]["int8"]["runtimes"] == {GOOD: True, BAD: False} and verdict["passed"] is False


def test_a_new_row_is_compared_by_the_tokenizer_parity(twin_rows, tiny_artifacts):
    from prodip.tokenizer.parity import missing_runtimes, run_parity

    assert GOOD not in missing_runtimes()  # its module (onnxruntime) is installed
    texts = {"en": ["It is a truth universally acknowledged.", "a  b"]}
    report = run_parity(tiny_artifacts["tokenizer"], texts, runtimes=("tokenizers", GOOD, BAD))
    assert report["runtimes"][GOOD]["status"] == "identical" and report["runtimes"][GOOD]["version"] == "twin 1"
    assert report["runtimes"][GOOD]["languages"]["en"] == {"texts": 2, "identical": 2, "excluded": 0}
    assert report["runtimes"][BAD]["status"] == "differs" and not report["passed"]  # no <|bos|>: position 0
    assert report["runtimes"][BAD]["first_mismatch"]["position"] == 0


@pytest.mark.slow  # a tiny chat export and transformers' template (~30 s)
def test_a_new_row_renders_the_chat_contract(twin_rows, tmp_path):
    from prodip.conformance.chat import check_chat
    from tests.fixtures import build_tiny_chat_export

    export, _ = build_tiny_chat_export(tmp_path, variants=["fp32"])
    chat = check_chat(export, runtimes=[GOOD, BAD], variants=["fp32"])
    assert list(chat["runtimes"]) == ["transformers", "prodip serve", GOOD, BAD]
    assert chat["runtimes"][GOOD]["identical"] is True and chat["runtimes"][BAD]["identical"] is False
    ids = next(c for c in chat["checks"] if c["metric"] == "chat_template_ids_identical")
    assert ids["passed"] is False and ids["note"].endswith(f"in: {BAD}")
    stops = next(c for c in chat["checks"] if c["metric"] == "chat_stop_ids_stop")
    assert stops["passed"] is False and stops["note"].startswith(f"stop ids that do not end generation: {BAD} [")
    chat = check_chat(export, runtimes=[GOOD], variants=["fp32"])
    assert all(c["passed"] for c in chat["checks"]), chat["checks"]


def test_every_row_has_the_code_its_checks_need():
    """A row that takes part in a check has the code that runs it: an adapter for greedy ids and chat (with the
    method), a Python encoder or a Node package for tokenizer ids; each candidate kind has one row."""
    from prodip.conformance.runtimes.common import RuntimeAdapter as Base
    from prodip.tokenizer import parity

    for row in table.RUNTIMES:
        if row.greedy_metric:
            assert type(ADAPTERS[row.name]).greedy is not Base.greedy, row.name
        if row.chat:
            assert type(ADAPTERS[row.name]).chat is not Base.chat, row.name
        if row.tokenizer:
            assert row.name in parity._PYTHON_RUNNERS or row.npm, row.name
        if row.timed:
            assert type(ADAPTERS[row.name]).time_generation is not Base.time_generation, row.name
            assert row.formats, row.name  # the variants it times
    names = set(runtime_names(greedy=True)) | set(runtime_names(chat=True)) | set(runtime_names(timed=True))
    assert set(ADAPTERS) == names
    # the candidate kinds prodip.conformance.suite.plan_candidates makes, each run by one row (the card's label)
    kinds = [r.candidate_kind for r in table.RUNTIMES if r.candidate_kind]
    assert sorted(kinds) == ["gguf", "onnx", "prodip", "pte", "transformers"]


def test_a_rows_margin_is_its_rule_for_the_variants_it_names(monkeypatch):
    """A row's ``greedy_margins`` judge those variants' ids by the near-tie rule (they may part where the
    reference's pick led the runtime's by at most the margin), every other variant's by identity; the report
    records the rule, and the card names the row by its label when the rule passed."""
    import numpy as np

    from prodip.conformance import card
    from prodip.conformance.runtimes.agreement import runtime_passed
    from prodip.conformance.runtimes.check import _judge

    row = Runtime(GOOD, GOOD, ("onnx",), greedy_metric="twin_greedy_identical", greedy_margins=(("int4", 0.05),))
    monkeypatch.setattr(table, "RUNTIMES", (*table.RUNTIMES, replace(row, label="Twin (GPU)")))
    want = [[7, 8, 1, 2, 3]]  # prompt [7, 8], then 1, 2, 3
    logits = [[np.array([0.0, 1.0, 0.97, 0.2, -1.0]), np.zeros(5), np.zeros(5)]]  # step 0: 1 leads 2 by 0.03, 4 by 2
    near, far = [[7, 8, 2, 4, 4]], [[7, 8, 4, 2, 3]]

    def judge(variant, ids):
        return _judge(row, variant, GreedyOutput(ids=ids), want, logits, {}, [2])

    res, [check] = judge("int4", near)
    assert check.passed is True and res.ids_identical is False and res.agrees is True and res.margin == 0.05
    assert res.agreement == (
        "prompt 0: parted at new token 0: reference 1 vs 2, reference margin 0.03 (a near tie; tie margin 0.05)"
    )
    record = {"kind": "onnx", "passed": False, "runtimes": {"runtimes": {GOOD: res.to_dict()}}}
    assert runtime_passed(res.to_dict()) and card._runtimes_proven([record]) == ["Twin (GPU)"]
    res, [check] = judge("int4", far)
    assert (
        check.passed is False
        and res.agrees is False
        and "reference margin 2 (a clear choice; tie margin 0.05)" in check.note
    )
    assert card._runtimes_proven([{"kind": "onnx", "runtimes": {"runtimes": {GOOD: res.to_dict()}}}]) == []
    res, [check] = judge("int8", near)  # not named: the table's tie margin (none without a logits bound)
    assert check.passed is False and res.agrees is False and res.to_dict()["margin"] == 0.0
    res, [check] = judge("int8", want)
    assert check.passed is True and res.ids_identical is True


def test_the_browser_rows_are_skipped_with_the_reason_when_chromium_or_puppeteer_is_missing(monkeypatch, tmp_path):
    """The page rows (WebGPU, WASM in Chromium) need node, puppeteer-core under the node folder and Chromium; without
    one, conformance lists them as skipped with what is missing and how to install it (``missing="fail"``: failed)."""
    from types import SimpleNamespace

    from prodip.conformance.runtimes import browser_page
    from prodip.conformance.runtimes.check import _decode

    job = SimpleNamespace(candidates=[SimpleNamespace(name="fp32")])
    monkeypatch.setattr(browser_page, "chromium_path", lambda: str(tmp_path / "no-chromium"))
    for name in ("transformers.js-webgpu", "transformers.js-browser"):
        reason = ADAPTERS[name].available()
        assert reason is not None and ("chromium not installed" in reason or "not installed in" in reason), reason
        out = _decode(name, job, "skip")["fp32"]
        assert out.skipped == f"not installed: {reason}" and out.error is None
        assert _decode(name, job, "fail")["fp32"].error == f"not installed: {reason}"
    monkeypatch.setenv("PRODIP_NODE_ROOT", str(tmp_path))  # no node_modules there
    reason = ADAPTERS["transformers.js-webgpu"].available()
    assert reason == f"puppeteer-core not installed in {tmp_path} (npm install --ignore-scripts --prefix node)"


@pytest.mark.parametrize("runtimes", [["onnxruntime-web"], ["transformers.js-browser"]])
def test_the_page_on_wasm_is_timed_by_default_and_the_webgpu_page_is_not(runtimes):
    """The speed table's rows are the table's ``timed`` rows in the card's order; the page on WASM (the
    ``transformers.js-browser`` row, whose greedy check is opt-in) is timed by a default run, which chooses
    onnxruntime-web (the WASM build the page loads), or when chosen itself; the WebGPU page is not timed."""
    from types import SimpleNamespace

    from prodip.base.runtimes import by_name, default_on_device
    from prodip.conformance.speed import _skip_reason

    assert runtime_names(timed=True) == (
        "onnxruntime", "onnxruntime-genai", "transformers.js", "transformers.js-browser", "llama.cpp", "executorch"
    )  # fmt: skip
    page, adapter = by_name("transformers.js-browser"), ADAPTERS["transformers.js-browser"]
    assert not page.default and "onnxruntime-web" in default_on_device()
    fp32 = [SimpleNamespace(name="fp32", variant="fp32", kind="onnx")]
    for chosen in (default_on_device(), runtimes):
        assert _skip_reason(page, adapter, fp32, chosen) == adapter.available()  # None where Chromium is here
    assert _skip_reason(page, adapter, fp32, ["transformers.js"]) == (
        "not chosen: neither transformers.js-browser nor onnxruntime-web is in --runtimes"
    )
    assert _skip_reason(page, adapter, [], runtimes) == "no onnx variant checked"
    assert not by_name("transformers.js-webgpu").timed


def test_a_timed_row_is_timed_into_speed_json_and_the_card(twin_rows, tiny_artifacts, monkeypatch, tmp_path):
    """Rows marked ``timed`` with a timing adapter reach speed.json and the card's speed table with no edit to the
    speed module: an on-device row when ``--runtimes`` chose it or its ``timed_with`` row, a row without a greedy
    check whenever it is installed (not installed: skipped with how to install it); a variant its runtime returned
    no timing for is listed as not timed."""
    import json
    import math

    from tokenizers import Tokenizer

    from prodip.base.manifest import load_manifest
    from prodip.conformance.inputs import PROMPTS
    from prodip.conformance.speed import SPEED_FILE, SpeedReport, measure_speed, render_speed
    from prodip.conformance.suite import plan_candidates
    from prodip.train.config import ModelConfig

    good, bad = twin_rows
    absent = Runtime("twin-absent", "twin-absent", ("onnx",), modules=("prodip_no_such_module",), timed=True)
    rows = (
        replace(good, label="Twin (ONNX Runtime)", timed=True),
        replace(bad, timed=True, timed_with=GOOD),  # not chosen itself: timed because the good twin is
        absent,
    )
    monkeypatch.setattr(table, "RUNTIMES", (*table.RUNTIMES[:-2], *rows))
    monkeypatch.setitem(ADAPTERS, absent.name, OrtTwin(absent.name))
    export = tiny_artifacts["export"]
    model_cfg = ModelConfig.from_hf_dict(json.loads((export / "config.json").read_text(encoding="utf-8")))
    prompt = Tokenizer.from_file(str(export / "tokenizer.json")).encode(PROMPTS["en"]).ids[:16]
    cands = plan_candidates(load_manifest(export), ["fp32", "int8"])

    def measure(runtimes: list[str]) -> SpeedReport:
        return measure_speed(
            export, cands, prompt, PROMPTS["en"], model_cfg, runtimes=runtimes, threads=1, new_tokens=4, rounds=2,
            export_files_sha256="0" * 64,
        )  # fmt: skip

    record = measure([GOOD])
    assert sorted((r.runtime, r.variant) for r in record.rows) == [
        ("onnxruntime", "fp32"), ("onnxruntime", "int8"), (GOOD, "fp32"), (GOOD, "int8"), (BAD, "fp32")
    ]  # fmt: skip
    for r in record.rows:
        assert math.isfinite(r.decode_tokens_per_s) and r.decode_tokens_per_s > 0 and r.ttft_s > 0, r
        assert (r.rounds, r.new_tokens, r.threads) == (2, 4, 1), r
    versions = {r.runtime: r.version for r in record.rows}
    assert versions[GOOD] == versions[BAD] == "twin 1" and versions["onnxruntime"].startswith("onnxruntime 1.")
    assert [(f.runtime, f.variant, f.error) for f in record.failed] == [(BAD, "int8", "no timing returned")]
    assert record.skipped[absent.name] == "Python package prodip_no_such_module not installed " + (
        "(pip install 'prodip[runtimes]')"
    )
    assert set(record.runtime_seconds) == {"onnxruntime", GOOD, BAD}

    path = record.write(tmp_path / SPEED_FILE)
    again = SpeedReport.read(path)
    assert again == record
    text = render_speed(again)
    table_runtimes = [line.split(" | ")[0][2:] for line in text.splitlines() if line.startswith("| ")][1:]
    # the table's order (ONNX Runtime's row before the twins'), each row by its card label
    assert table_runtimes == ["ONNX Runtime"] * 2 + ["Twin (ONNX Runtime)"] * 2 + [BAD]
    assert "Twin (ONNX Runtime): twin 1" in text and f"- {BAD}, int8: no timing returned" in text
    assert "- twin-absent: Python package prodip_no_such_module not installed" in text

    skipped = measure([]).skipped
    assert skipped[GOOD] == f"not chosen: {GOOD} is not in --runtimes"
    assert skipped[BAD] == f"not chosen: neither {BAD} nor {GOOD} is in --runtimes"
