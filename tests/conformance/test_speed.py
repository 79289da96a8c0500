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
from prodip.conformance.speed import SPEED_FILE, SpeedReport, render_speed

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
