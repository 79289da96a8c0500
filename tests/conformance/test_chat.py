"""The chat contract in conformance: on a tiny chat export (fp32 ONNX + a float16 GGUF), every runtime
renders the fixed conversations to the reference's ids, the end of turn is a stop in each, the greedy
chat reply stops at the planted <|im_end|> in onnxruntime-genai and transformers.js, and the two planted
faults (a template edited in one artifact, <|im_end|> missing from one runtime's stop set) fail the export.

python -m pytest tests/conformance/test_chat.py -q
"""

from __future__ import annotations

import pytest

from prodip.conformance import evaluate, faults
from prodip.conformance.chat import CONVERSATIONS
from tests.conformance.conftest import conformance_config

RUNTIMES = ["onnxruntime-genai", "transformers.js"]


@pytest.fixture(scope="module")
def chat_conf(tmp_path_factory):
    """(export dir, planted reply, config factory) of a tiny chat model with fp32 and gguf-f16 variants."""
    from tests.fixtures import build_shards, build_tiny_chat_export

    root = tmp_path_factory.mktemp("chat_conf")
    export, planted = build_tiny_chat_export(root, variants=["fp32", "gguf-f16"])
    shards = build_shards(root / "shards", root / "tokenizer")

    def make(export_dir, **kw):
        settings = dict(greedy_tokens=8, heldout_tokens=64, runtimes=RUNTIMES, runtime_tokens=6, variants=["fp32"])
        return conformance_config(export_dir, root / "run", shards, **{**settings, **kw})

    return export, planted, make


def _chat_check(report: dict, metric: str) -> dict:
    return next(c for c in report["global"]["checks"] if c["metric"] == metric)


@pytest.fixture(scope="module")
def good_report(chat_conf):
    export, _, make = chat_conf
    return evaluate(make(export, variants=["fp32", "gguf-f16"]))


def test_every_runtime_renders_the_same_ids_and_stops_at_end_of_turn(good_report, chat_conf):
    _, planted, _ = chat_conf
    chat = good_report["chat"]
    assert set(chat["runtimes"]) == {"transformers", "prodip serve", *RUNTIMES, "llama.cpp"}
    for name, res in chat["runtimes"].items():
        assert res.get("error") is None, (name, res)
        assert res["end_of_turn_stops"] is True, name
        if name != "prodip serve":
            assert res["ids"] == chat["reference"], name
    assert set(chat["reference"]) == set(CONVERSATIONS)
    # a marker typed in content is read as the marker by every runtime (serve refuses it instead)
    eot = planted["end_of_turn_id"]
    assert chat["reference"]["marker_text"].count(eot) == 2  # the typed one and the turn's own
    assert all(c["passed"] for c in chat["checks"])
    # greedy chat decoding: the planted reply (2 tokens, then <|im_end|>) in ONNX Runtime and each runtime
    rt = good_report["candidates"]["fp32"]["runtimes"]
    i = rt["prompts"].index("chat")
    assert rt["prompt_ids"][i] == planted["prompt_ids"]
    assert rt["onnxruntime"][i] == planted["prompt_ids"] + planted["reply_ids"]
    for name in RUNTIMES:
        assert rt["runtimes"][name]["ids"][i] == planted["prompt_ids"] + planted["reply_ids"], name
    assert good_report["passed"], [c for c in good_report["global"]["checks"] if not c["passed"]]
    from prodip.conformance.report import render_markdown

    md = render_markdown(good_report)
    assert "| llama.cpp | identical | identical |" in md and "end of turn stops" in md


@pytest.mark.parametrize("where", ["gguf-f16", "tokenizer_config.json"])
def test_template_edited_in_one_artifact_fails(chat_conf, tmp_path, where):
    export, _, make = chat_conf
    bad = faults.plant_chat_template_edited(export, tmp_path / "bad", where)
    report = evaluate(make(bad, variants=["fp32", "gguf-f16"] if where.startswith("gguf") else ["fp32"]))
    assert not report["passed"]
    ids, copies = (_chat_check(report, m) for m in ("chat_template_ids_identical", "chat_template_copies_identical"))
    assert ids["passed"] is False and copies["passed"] is False
    if where.startswith("gguf"):
        assert "llama.cpp" in ids["note"] and "transformers" not in ids["note"]
        assert "gguf/model-f16.gguf" in copies["note"]
    else:  # genai and transformers.js read tokenizer_config.json; transformers prefers chat_template.jinja
        assert set(ids["note"].split(": ")[1].split(", ")) == {"onnxruntime-genai", "transformers.js"}
        assert copies["note"].endswith("tokenizer_config.json")


def test_end_of_turn_missing_from_genai_stop_set_fails(chat_conf, tmp_path):
    export, _, make = chat_conf
    bad = faults.plant_end_of_turn_not_a_stop(export, tmp_path / "bad")
    report = evaluate(make(bad))
    assert not report["passed"]
    stops = _chat_check(report, "chat_end_of_turn_stops")
    assert stops["passed"] is False and stops["note"].endswith("onnxruntime-genai")
    # and genai really runs past the end of turn on the chat prompt: its greedy check fails
    failed = {c["metric"] for c in report["candidates"]["fp32"]["checks"] if c["passed"] is False}
    assert "genai_greedy_identical" in failed


def test_base_model_has_no_chat_section(tiny_artifacts, conf_cfg):
    from prodip.conformance.chat import check_chat

    assert check_chat(tiny_artifacts["export"]) is None
