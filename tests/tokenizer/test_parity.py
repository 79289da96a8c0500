"""Tokenizer parity in each real runtime: the default tokenizer gives tokenizers' ids, <|bos|> first,
on the held-out UDHR text and the tricky strings (NFC input). A runtime is skipped only when its
package is not installed (CI installs them: pip extra ``runtimes``, ``npm install --ignore-scripts
--prefix node``)."""

from __future__ import annotations

import json

import pytest

from prodip.base.runtimes import runtime_names
from prodip.tokenizer.parity import TRICKY, format_parity, missing_runtimes, run_parity
from tests.tokenizer.conftest import skip_or_fail


@pytest.fixture(scope="module")
def parity_report(tok_dir, heldout):
    texts = {lang: path.read_text(encoding="utf-8").splitlines() for lang, path in heldout.items()}
    return run_parity(tok_dir, texts)


def skip_unless_installed(runtime: str) -> None:
    missing = missing_runtimes()
    if runtime in missing:
        skip_or_fail(f"{runtime}: {missing[runtime]}")


@pytest.mark.parametrize("runtime", [r for r in runtime_names(tokenizer=True) if r != "tokenizers"])
def test_runtime_reproduces_every_id(parity_report, runtime):
    skip_unless_installed(runtime)
    result = parity_report["runtimes"][runtime]
    assert result["status"] == "identical", format_parity(parity_report)
    rows = result["languages"]
    assert set(rows) == {"bn", "en", "tricky"}
    assert all(r["identical"] + r["excluded"] == r["texts"] for r in rows.values())
    assert rows["tricky"]["texts"] == len(TRICKY)
    # only onnxruntime-genai leaves a text out: its C API ends a string at U+0000
    assert rows["tricky"]["excluded"] == (1 if runtime == "onnxruntime-genai" else 0)


def test_report_counts_and_table(parity_report):
    assert parity_report["languages"]["tricky"]["texts"] == len(TRICKY)
    assert parity_report["languages"]["bn"]["tokens"] > parity_report["languages"]["bn"]["texts"]
    table = format_parity(parity_report)
    assert "runtime" in table and "tricky" in table and ("PASSED" in table) == parity_report["passed"]
    json.dumps(parity_report)  # fertility.json stores it


def test_a_broken_runtime_copy_is_caught(tok_dir, tmp_path):
    """A tokenizer.json whose merges were reordered gives other ids: the check must say which runtime."""
    skip_unless_installed("transformers")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (broken / name).write_text((tok_dir / name).read_text())
    tok_json = json.loads((tok_dir / "tokenizer.json").read_text())
    merges = tok_json["model"]["merges"]
    tok_json["model"]["merges"] = merges[len(merges) // 2 :] + merges[: len(merges) // 2]
    (broken / "tokenizer.json").write_text(json.dumps(tok_json))
    # compare the broken file in transformers against the good one in tokenizers: same code, other ids
    from prodip.tokenizer import parity

    texts = ["আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।", "It is a truth universally acknowledged."]
    good, _, _ = parity.encode_all(tok_dir, texts, ("tokenizers",))
    bad, _, _ = parity.encode_all(broken, texts, ("transformers",))
    result = parity._compare(good["tokenizers"], bad["transformers"], texts, ["x", "x"], None)
    assert result["status"] == "differs" and result["first_mismatch"]["position"] >= 1


def test_missing_runtime_is_skipped_or_required(tok_dir, monkeypatch):
    monkeypatch.setattr("prodip.tokenizer.parity.missing_runtimes", lambda: {"llama.cpp": "not here"})
    report = run_parity(tok_dir, {}, runtimes=("tokenizers", "llama.cpp"))
    assert report["runtimes"]["llama.cpp"] == {"status": "skipped", "reason": "not here"} and report["passed"]
    report = run_parity(tok_dir, {}, runtimes=("tokenizers", "llama.cpp"), require=True)
    assert report["runtimes"]["llama.cpp"]["status"] == "error" and not report["passed"]
    with pytest.raises(ValueError, match="unknown"):
        run_parity(tok_dir, {}, runtimes=("mlc",))


def test_chat_markers_are_reserved_ids_in_every_runtime(parity_report, tok_dir):
    """The chat markers are one special token each at ids 3 and 4, and every runtime that ran gives
    those ids for them (alone, glued to text and in a rendered turn: TRICKY's chat strings)."""
    from prodip.base.chat import CHAT_TOKENS, render
    from prodip.tokenizer.bpe import load_tokenizer

    tok = load_tokenizer(tok_dir)
    assert [tok.token_to_id(t) for t in CHAT_TOKENS] == [3, 4]
    assert tok.encode("<|im_start|>").ids == [1, 3] and tok.encode("x<|im_end|>").ids[-1] == 4
    ids = tok.encode(render([{"role": "user", "content": "হ্যালো"}]), add_special_tokens=False).ids
    assert ids[:2] == [1, 3] and ids.count(4) == 1
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    assert config["additional_special_tokens"] == list(CHAT_TOKENS) and "chat_template" not in config
    ran = [r for r, v in parity_report["runtimes"].items() if v["status"] not in ("skipped", "reference")]
    assert all(parity_report["runtimes"][r]["status"] == "identical" for r in ran), format_parity(parity_report)
    assert sum(t.count("<|im_start|>") + t.count("<|im_end|>") for t in TRICKY) >= 8
