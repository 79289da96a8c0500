"""The card's speed table: the timing rule, the speed.json record, its rendering, and real timings in every runtime.

python -m pytest tests/conformance/test_speed.py -q
"""

from __future__ import annotations

import json
import math

import pytest

from prodip.base.errors import InvalidInput
from prodip.base.records import RecordError
from prodip.conformance.runtimes.timing import Timing, round_figures
from prodip.conformance.speed import SPEED_FILE, SpeedReport, merge_speed, read_previous, render_speed

#: A hand-written speed.json: two runtimes, a failure, a skip.
RECORD = {
    "format_version": 1,
    "export_files_sha256": "ab" * 32,
    "machine": {"cpu": "Test CPU 9000", "cores": 8, "os": "Linux-6.1-x86_64", "python": "3.11.7"},
    "settings": {"prompt_tokens": 12, "new_tokens": 32, "rounds": 3, "warmup_rounds": 1, "threads": 1},
    "rows": [
        {"runtime": "onnxruntime", "variant": "fp32", "decode_tokens_per_s": 250.0, "ttft_s": 0.004,
         "rounds": 3, "new_tokens": 32, "threads": 1, "version": "onnxruntime 1.32.0"},
        {"runtime": "onnxruntime", "variant": "int4", "decode_tokens_per_s": 612.5, "ttft_s": 0.0021,
         "rounds": 3, "new_tokens": 32, "threads": 1, "version": "onnxruntime 1.32.0"},
        {"runtime": "llama.cpp", "variant": "gguf-q8_0", "decode_tokens_per_s": 480.04, "ttft_s": 0.0123,
         "rounds": 3, "new_tokens": 32, "threads": 1, "version": "node-llama-cpp 3.22.1, llama.cpp v0.5.0"},
    ],
    "failed": [{"runtime": "transformers.js", "variant": "fp16", "error": "dtype fp16: no such file"}],
    "skipped": {"executorch": "no pte variant checked"},
    "runtime_seconds": {"onnxruntime": 1.25, "transformers.js": 2.0, "llama.cpp": 1.25},
    "seconds": 4.5,
}  # fmt: skip


def test_round_figures_known_answer_and_refusals():
    # first token 0.5 s after the call; then 2 tokens in 0.2 s
    ttft, rate = round_figures(0.0, [0.5, 0.6, 0.7])
    assert ttft == pytest.approx(0.5) and rate == pytest.approx(10.0)
    timing = Timing()
    timing.add_round(10.0, [10.25, 10.5, 10.75, 11.0])  # 3 steps in 0.75 s
    timing.add_round(20.0, [20.5, 21.0, 21.5, 22.0])  # 3 steps in 1.5 s
    timing.add_round(30.0, [30.1, 30.2, 30.3, 30.4])  # 3 steps in 0.3 s
    assert timing.median_ttft_s == pytest.approx(0.25) and timing.median_decode_tokens_per_s == pytest.approx(4.0)
    assert timing.new_tokens == 4
    with pytest.raises(ValueError, match="at least 2 new tokens"):
        round_figures(0.0, [0.5])
    with pytest.raises(ValueError, match="out of order"):
        round_figures(1.0, [0.5, 0.6])
    with pytest.raises(ValueError, match="not measurable"):
        round_figures(0.0, [0.5, 0.5])  # a clock too coarse for the steps: an infinite rate is refused
    with pytest.raises(ValueError, match="positive finite"):
        Timing().add_figures(0.1, math.nan)
    with pytest.raises(ValueError, match="no timed round"):
        _ = Timing().median_ttft_s


def test_record_round_trips_byte_for_byte(tmp_path):
    path = tmp_path / SPEED_FILE
    text = json.dumps(RECORD, indent=2, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    record = SpeedReport.read(path)
    assert [r.decode_tokens_per_s for r in record.rows] == [250.0, 612.5, 480.04]
    assert record.machine.cpu == "Test CPU 9000" and record.skipped == {"executorch": "no pte variant checked"}
    record.write(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text(encoding="utf-8") == text


@pytest.mark.parametrize(
    "edit, names",
    [
        (lambda d: d["rows"][0].update(decode_tokens_per_s=-1.0), "rows.0.decode_tokens_per_s"),
        (lambda d: d["rows"][1].update(ttft_s=0), "rows.1.ttft_s"),
        (lambda d: d["rows"][2].update(decode_tokens_per_s=math.inf), "rows.2.decode_tokens_per_s"),
        (lambda d: d["machine"].pop("cpu"), "machine.cpu"),
        (lambda d: d["settings"].update(new_tokens=1), "settings.new_tokens"),
        (lambda d: d["rows"][0].update(rounds="3"), "rows.0.rounds"),
        (lambda d: d["runtime_seconds"].update(onnxruntime=math.nan), "runtime_seconds.onnxruntime"),
    ],
)
def test_malformed_record_is_refused_naming_file_and_field(tmp_path, edit, names):
    data = json.loads(json.dumps(RECORD))
    edit(data)
    path = tmp_path / SPEED_FILE
    path.write_text(json.dumps(data), encoding="utf-8")  # json writes inf as Infinity, which json.loads reads back
    with pytest.raises(RecordError) as err:
        SpeedReport.read(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and names in message and "prodip conformance" in message
    path.write_text(json.dumps({**RECORD, "format_version": 2}), encoding="utf-8")
    with pytest.raises(RecordError, match="format_version 2 is not one this prodip reads"):
        SpeedReport.read(path)


def test_card_renders_the_rows_fastest_in_bold_and_the_machine():
    text = render_speed(SpeedReport.from_dict(RECORD))
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table == [
        "| runtime | variant | decode (tokens/s) | time to first token (ms) | threads |",
        "| ONNX Runtime | int4 | **612.5** | 2.1 | 1 |",
        "| ONNX Runtime | fp32 | 250.0 | 4.0 | 1 |",
        "| llama.cpp | gguf-q8_0 | **480.0** | 12.3 | 1 |",
    ]
    assert text.startswith("## Speed\n\nMeasured by `prodip conformance` on the exporting machine: Test CPU 9000, 8 ")
    assert "a 12-token prompt, then 32 new tokens" in text and "medians of 3 round(s) after 1 warm-up" in text
    assert "- transformers.js (Node), fp16: dtype fp16: no such file" in text
    assert "- ExecuTorch: no pte variant checked" in text
    assert "ONNX Runtime: onnxruntime 1.32.0; llama.cpp: node-llama-cpp 3.22.1, llama.cpp v0.5.0." in text


def test_speed_options_are_checked(tiny_artifacts, conf_cfg):
    with pytest.raises(InvalidInput, match="speed_tokens must be >= 2"):
        conf_cfg(tiny_artifacts["export"], speed_tokens=1)
    with pytest.raises(InvalidInput, match="speed_rounds must be >= 1"):
        conf_cfg(tiny_artifacts["export"], speed_rounds=0)


def _positive(x: float) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_conformance_writes_the_speed_record_and_the_card_table(conformed_export):
    """run_conformance (no on-device runtimes chosen) times every ONNX variant in ONNX Runtime, says why each other
    runtime did not run, writes speed.json beside report.json and the table into README.md under the quality card."""
    from prodip.base.manifest import files_table_sha256, load_manifest

    export, report = conformed_export
    record = SpeedReport.read(export / "conformance" / SPEED_FILE)
    manifest = load_manifest(export)
    onnx = sorted(n for n, v in manifest.variants.items() if v.format == "onnx")
    assert sorted(r.variant for r in record.rows if r.runtime == "onnxruntime") == onnx
    assert all(_positive(r.decode_tokens_per_s) and _positive(r.ttft_s) for r in record.rows)
    assert all(r.rounds == record.settings.rounds == 3 and r.new_tokens == 32 and r.threads == 1 for r in record.rows)
    assert record.failed == []
    assert record.skipped == {
        "onnxruntime-genai": "not chosen: onnxruntime-genai is not in --runtimes",
        "transformers.js": "not chosen: transformers.js is not in --runtimes",
        "transformers.js-browser": "not chosen: neither transformers.js-browser nor onnxruntime-web is in --runtimes",
        "llama.cpp": "no gguf variant checked",
        "executorch": "no pte variant checked",
    }
    assert record.export_files_sha256 == files_table_sha256(manifest.files_table()) == report["export_files_sha256"]
    assert report["speed"]["file"] == SPEED_FILE and report["speed"]["rows"] == len(onnx)
    readme = (export / "README.md").read_text(encoding="utf-8")
    assert render_speed(record) in readme and readme.index("## Quality") < readme.index("## Speed")


@pytest.fixture(scope="module")
def every_format_export(tmp_path_factory):
    """A tiny export with ONNX (external data: the web page loads it), GGUF and ExecuTorch variants (~60 s)."""
    from tests.fixtures import build_tiny_export

    variants = ["safetensors", "fp32", "int8", "int4", "gguf-q8_0", "pte-fp32"]
    return build_tiny_export(
        tmp_path_factory.mktemp("speed"), vocab_size=512, hidden_size=64, seed=5, variants=variants
    )


@pytest.mark.slow
def test_every_installed_runtime_times_every_variant_it_runs(every_format_export):
    """Each runtime that is installed times each variant of its format with positive finite figures; one that is not
    installed is skipped with the reason (so the test holds where `make RUNTIMES=0` installed none)."""
    from tokenizers import Tokenizer

    from prodip.base.manifest import files_table_sha256, load_manifest
    from prodip.conformance.inputs import PROMPTS
    from prodip.conformance.speed import measure_speed, timers
    from prodip.conformance.suite import plan_candidates
    from prodip.train.config import ModelConfig

    export = every_format_export
    manifest = load_manifest(export)
    model_cfg = ModelConfig.from_hf_dict(json.loads((export / "config.json").read_text(encoding="utf-8")))
    prompt = Tokenizer.from_file(str(export / "tokenizer.json")).encode(PROMPTS["en"]).ids
    record = measure_speed(
        export,
        plan_candidates(manifest),
        prompt,
        PROMPTS["en"],
        model_cfg,
        runtimes=["onnxruntime-genai", "transformers.js", "onnxruntime-web"],
        threads=1,
        new_tokens=8,
        rounds=2,
        export_files_sha256=files_table_sha256(manifest.files_table()),
    )
    assert record.failed == [], record.failed
    formats = {"onnx": ["fp32", "int4", "int8"], "gguf": ["gguf-q8_0"], "pte": ["pte-fp32"]}
    assert [row.name for row, _ in timers()] == [
        "onnxruntime", "onnxruntime-genai", "transformers.js", "transformers.js-browser", "llama.cpp", "executorch"
    ]  # fmt: skip
    for row, timer in timers():
        reason = timer.available()
        got = sorted(r.variant for r in record.rows if r.runtime == row.name)
        if reason is not None:
            assert record.skipped[row.name] == reason and got == []
            continue
        assert got == formats[row.formats[0]], row.name
        assert row.name not in record.skipped
    for r in record.rows:
        assert _positive(r.decode_tokens_per_s) and _positive(r.ttft_s), r
        assert r.rounds == 2 and r.new_tokens == 8 and r.version, r
    assert record.settings.prompt_tokens == len(prompt)
    record.write(export / SPEED_FILE)
    assert SpeedReport.read(export / SPEED_FILE) == record


# ------------------------------------------------------------------------------------------ partial runs

#: The export's variants as manifest.json lists them (name -> format), for the merge tests.
FORMATS = {"safetensors": "safetensors", "fp32": "onnx", "fp16": "onnx", "int8": "onnx", "int4": "onnx"}


def _row(runtime: str, variant: str, rate: float) -> dict:
    return {"runtime": runtime, "variant": variant, "decode_tokens_per_s": rate, "ttft_s": 0.01, "rounds": 3,
            "new_tokens": 32, "threads": 1, "version": f"{runtime} 1.0"}  # fmt: skip


def _run(rows: list[dict], skipped: dict, sha: str = "ab" * 32, **kw) -> SpeedReport:
    """A speed.json as measure_speed returns it: every runtime that ran in ``runtime_seconds``."""
    ran = {r["runtime"]: 1.0 for r in rows} | {f["runtime"]: 1.0 for f in kw.get("failed", [])}
    return SpeedReport.from_dict(
        {**RECORD, "export_files_sha256": sha, "rows": rows, "skipped": skipped, "runtime_seconds": ran,
         "failed": [], **kw}
    )  # fmt: skip


#: A full run: every ONNX variant in ONNX Runtime and transformers.js (Node, fp16 failed there), the rest skipped.
FULL = _run(
    [_row("onnxruntime", v, r) for v, r in [("fp32", 100.0), ("fp16", 90.0), ("int8", 200.0), ("int4", 300.0)]]
    + [_row("transformers.js", v, r) for v, r in [("fp32", 50.0), ("int8", 80.0), ("int4", 120.0)]],
    {"llama.cpp": "no gguf variant checked"},
    failed=[{"runtime": "transformers.js", "variant": "fp16", "error": "dtype fp16: no such file"}],
)
#: `--variants int4,int8 --runtimes onnxruntime-web`: ONNX Runtime times int4/int8 again, transformers.js is not chosen.
PARTIAL = _run(
    [_row("onnxruntime", "int8", 210.0), _row("onnxruntime", "int4", 310.0)],
    {"transformers.js": "not chosen: transformers.js is not in --runtimes", "llama.cpp": "no gguf variant checked"},
)


def _pairs(record: SpeedReport) -> dict[tuple[str, str], tuple[float, bool]]:
    return {(r.runtime, r.variant): (r.decode_tokens_per_s, r.earlier) for r in record.rows}


def test_partial_run_keeps_the_rows_it_did_not_time_from_the_same_export_files(tmp_path):
    merged = merge_speed(FULL, PARTIAL, FORMATS)
    assert _pairs(merged) == {
        ("onnxruntime", "fp32"): (100.0, True),
        ("onnxruntime", "fp16"): (90.0, True),
        ("onnxruntime", "int8"): (210.0, False),  # timed again: this run's figure replaces the earlier one
        ("onnxruntime", "int4"): (310.0, False),
        ("transformers.js", "fp32"): (50.0, True),  # a runtime this run did not choose keeps its rows
        ("transformers.js", "int8"): (80.0, True),
        ("transformers.js", "int4"): (120.0, True),
    }
    assert [(r.runtime, r.variant) for r in merged.rows][:4] == [
        ("onnxruntime", v) for v in ("fp32", "fp16", "int8", "int4")
    ]
    assert [(f.variant, f.earlier) for f in merged.failed] == [("fp16", True)]
    assert merged.not_timed == [] and merged.skipped == PARTIAL.skipped
    assert merged.runtime_seconds == {"onnxruntime": 1.0} and merged.export_files_sha256 == FULL.export_files_sha256
    # the file round-trips with the marks; a full run's file gains no key
    merged.write(tmp_path / SPEED_FILE)
    assert SpeedReport.read(tmp_path / SPEED_FILE) == merged
    assert "earlier" not in json.dumps(FULL.to_dict()) and "not_timed" not in FULL.to_dict()
    text = render_speed(merged)
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[1:] == [
        "| ONNX Runtime | int4 | **310.0** | 10.0 | 1 |",
        "| ONNX Runtime | int8 | 210.0 | 10.0 | 1 |",
        "| ONNX Runtime | fp32 ‡ | 100.0 | 10.0 | 1 |",
        "| ONNX Runtime | fp16 ‡ | 90.0 | 10.0 | 1 |",
        "| transformers.js (Node) | int4 ‡ | **120.0** | 10.0 | 1 |",
        "| transformers.js (Node) | int8 ‡ | 80.0 | 10.0 | 1 |",
        "| transformers.js (Node) | fp32 ‡ | 50.0 | 10.0 | 1 |",
    ]
    assert "‡ Measured by an earlier `prodip conformance` run on these same export files" in text
    assert "- transformers.js (Node), fp16 ‡: dtype fp16: no such file" in text
    assert "- transformers.js (Node): not chosen: transformers.js is not in --runtimes (its ‡ figures are from" in text
    # the same partial run again on the merged file keeps the same rows (a merge of a merge)
    assert _pairs(merge_speed(merged, PARTIAL, FORMATS)) == _pairs(merged)
    # and a full run after it replaces every mark
    assert not any(e for _, e in _pairs(merge_speed(merged, FULL, FORMATS)).values())


@pytest.mark.parametrize(
    "previous, reason",
    [
        (_run(FULL.to_dict()["rows"], FULL.skipped, sha="cd" * 32), "the earlier speed.json timed other export files"),
        (
            SpeedReport.from_dict({**FULL.to_dict(), "machine": {**RECORD["machine"], "cores": 4}}),
            "the earlier speed.json was measured on another machine",
        ),
        (
            SpeedReport.from_dict({**FULL.to_dict(), "settings": {**RECORD["settings"], "new_tokens": 64}}),
            "the earlier speed.json was measured with other settings",
        ),
        (None, "no earlier speed.json to keep its figure from"),
    ],
)
def test_partial_run_drops_rows_it_cannot_keep_and_says_why(previous, reason):
    merged = merge_speed(previous, PARTIAL, FORMATS)
    assert _pairs(merged) == {("onnxruntime", "int8"): (210.0, False), ("onnxruntime", "int4"): (310.0, False)}
    assert merged.failed == []
    # the runtime that ran names each variant it has no figure of; one not chosen is named by its skip reason
    assert [(g.runtime, g.variant) for g in merged.not_timed] == [("onnxruntime", "fp32"), ("onnxruntime", "fp16")]
    assert all(g.reason.startswith(f"not in this run's --variants; {reason}") for g in merged.not_timed)
    text = render_speed(merged)
    assert f"- ONNX Runtime, fp32, fp16: not in this run's --variants; {reason}" in text
    assert "- transformers.js (Node): not chosen: transformers.js is not in --runtimes\n" in text
    assert "‡" not in text


def test_unreadable_previous_speed_json_is_not_kept(tmp_path, caplog):
    assert read_previous(tmp_path / SPEED_FILE) is None  # none: nothing to keep, no warning
    (tmp_path / SPEED_FILE).write_text("{not json", encoding="utf-8")
    with caplog.at_level("WARNING"):
        assert read_previous(tmp_path / SPEED_FILE) is None
    assert f"the earlier {tmp_path / SPEED_FILE} cannot be read" in caplog.text
    FULL.write(tmp_path / SPEED_FILE)
    assert read_previous(tmp_path / SPEED_FILE) == FULL


def test_partial_conformance_run_keeps_the_card_rows_of_the_other_variants(conformed_export, conf_cfg, tmp_path):
    """run_conformance on one variant of a conformed export: speed.json and the card keep the other ONNX variants'
    rows from the full run (marked), the variant timed again gets this run's figure."""
    from prodip.base.manifest import load_manifest
    from prodip.conformance import run_conformance
    from prodip.conformance.faults import copy_export

    export = copy_export(conformed_export[0], tmp_path / "export")
    full = SpeedReport.read(conformed_export[0] / "conformance" / SPEED_FILE)
    (export / "conformance").mkdir(exist_ok=True)  # copy_export leaves the conformance folder out
    full.write(export / "conformance" / SPEED_FILE)
    onnx = sorted(n for n, v in load_manifest(export).variants.items() if v.format == "onnx")
    assert len(onnx) >= 2 and sorted(r.variant for r in full.rows) == onnx
    run_conformance(conf_cfg(export, variants=[onnx[0]], write_manifest=True, speed=True))
    merged = SpeedReport.read(export / "conformance" / SPEED_FILE)
    assert sorted(r.variant for r in merged.rows) == onnx and merged.not_timed == []
    kept = {r.variant: r for r in merged.rows if r.earlier}
    assert sorted(kept) == onnx[1:]
    assert all(kept[r.variant] == r.model_copy(update={"earlier": True}) for r in full.rows if r.variant in kept)
    readme = (export / "README.md").read_text(encoding="utf-8")
    assert render_speed(merged) in readme and f"| ONNX Runtime | {onnx[1]} ‡ |" in readme
