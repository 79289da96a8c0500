"""GGUF metadata as llama.cpp's tools read it, read back with gguf-py: a model-specific ``general.name``,
``basename``, ``size_label`` and ``finetune``; only URLs in ``general.dataset.{i}.repo_url`` / ``.url``;
``general.base_model.*`` (and ``general.source.repo_url`` for an import) for a Hub base.

python -m pytest tests/export/test_gguf_metadata.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prodip.base.sources import read_records
from prodip.export.card import build_card, origin_urls

gguf = pytest.importorskip("gguf")  # the runtimes extra

REPO = Path(__file__).resolve().parents[2]


def _data_records() -> list[dict]:
    """The bundled corpus's real records (data/sources.toml), the chat ones as fine-tuning sources."""
    out = []
    for r in read_records(REPO / "data" / "sources.toml"):
        fields = r.card_fields()
        out.append({**fields, "stage": "sft"} if r.name.startswith("tatoeba-chat") else fields)
    return out


def _write(tmp_path: Path, card, tie: bool = False) -> dict:
    from prodip.export.gguf import write_gguf
    from tests.fixtures import build_tiny_checkpoint, tiny_model, tiny_model_config

    run = build_tiny_checkpoint(tmp_path / "ck", vocab_size=320, tie=tie)
    model = tiny_model(tiny_model_config(vocab_size=320, tie=tie))
    path = tmp_path / "model.gguf"
    write_gguf(model, run.parent / "tokenizer", path, "F32", card=card)
    reader = gguf.GGUFReader(str(path))
    fields = {k: f.contents() for k, f in reader.fields.items() if k.startswith("general.")}
    fields["n_elements"] = sum(int(t.n_elements) for t in reader.tensors)  # the file's own parameter count
    return fields


def test_origin_urls_only_from_a_url_or_a_repository_at_a_commit():
    assert origin_urls("`karpathy/char-rnn` @ `6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e`") == {
        "repo_url": "https://github.com/karpathy/char-rnn/tree/6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e"
    }
    assert origin_urls("GITenberg/Frankenstein_84@c98a483") == {
        "repo_url": "https://github.com/GITenberg/Frankenstein_84/tree/c98a483"
    }
    assert origin_urls("https://example.org/bn-news", "example/bn-news") == {
        "repo_url": "https://huggingface.co/datasets/example/bn-news",
        "url": "https://example.org/bn-news",
    }
    assert origin_urls("as above") == {} and origin_urls("") == {} and origin_urls(None) == {}


@pytest.mark.parametrize("tie", [False, True])
def test_trained_chat_model_gguf_names_it_and_holds_only_urls(tmp_path, tie):
    from gguf.utility import size_label

    records = _data_records()
    card = build_card({"sources": records})
    got = _write(tmp_path, card, tie=tie)
    size = size_label(got["n_elements"], 0, 0, 0)
    assert got["general.name"] == f"prodip-bn-en {size} chat" and size.endswith("K")
    assert (got["general.basename"], got["general.size_label"], got["general.finetune"]) == (
        "prodip-bn-en",
        size,
        "chat",
    )
    assert got["general.dataset.count"] == len(records) == 12
    for i, r in enumerate(records):
        assert got[f"general.dataset.{i}.name"] == r["name"]
        repo_url = got.get(f"general.dataset.{i}.repo_url")
        if r["origin"] == "as above":
            assert repo_url is None, r["name"]
        else:
            assert repo_url.startswith("https://github.com/") and "/tree/" in repo_url, (r["name"], repo_url)
    by_name = {r["name"]: i for i, r in enumerate(records)}
    assert (
        got[f"general.dataset.{by_name['majantali-site']}.repo_url"]
        == "https://github.com/majantali/majantali.github.io/tree/891da504d66cef68045b6a6109afe2d7ca931ad9"
    )
    assert (
        got[f"general.dataset.{by_name['tatoeba-chat-bn']}.repo_url"]
        == "https://github.com/banglanlp/bnlp-resources/tree/29225a343cef6e3975affba8f181f8a25e4414b9"
    )
    assert not any(k.startswith("general.base_model") or k.startswith("general.source") for k in got)


def test_an_import_is_named_after_its_hub_model_with_base_model_keys(tmp_path):
    card = build_card({"imported": {"base_model": "HuggingFaceTB/SmolLM2-135M", "license": "apache-2.0"}})
    got = _write(tmp_path, card)
    assert (got["general.name"], got["general.basename"], got["general.organization"]) == (
        "SmolLM2-135M",
        "SmolLM2-135M",
        "HuggingFaceTB",
    )
    assert got["general.license"] == "apache-2.0" and "general.finetune" not in got
    assert got["general.base_model.count"] == 1
    assert (got["general.base_model.0.name"], got["general.base_model.0.organization"]) == (
        "SmolLM2-135M",
        "HuggingFaceTB",
    )
    assert (
        got["general.base_model.0.repo_url"]
        == got["general.source.repo_url"]
        == "https://huggingface.co/HuggingFaceTB/SmolLM2-135M"
    )


def test_a_model_trained_from_a_hub_base_names_it(tmp_path):
    card = build_card({"sources": _data_records()[:2]}, base_model_id="HuggingFaceTB/SmolLM2-135M")
    got = _write(tmp_path, card)
    assert got["general.base_model.0.repo_url"] == "https://huggingface.co/HuggingFaceTB/SmolLM2-135M"
    assert "general.source.repo_url" not in got and got["general.name"].startswith("prodip-bn ")


def test_exported_gguf_passes_the_card_check(tmp_path):
    """The real export path writes the names; conformance reads them back and agrees (and names the file's
    general.name for a trained model without records: ``prodip`` plus its size)."""
    from prodip.conformance.card import card_problems
    from tests.fixtures import build_tiny_export

    export = build_tiny_export(tmp_path / "tiny", variants=["gguf-f16"])
    assert card_problems(export) == []
    reader = gguf.GGUFReader(str(next(export.rglob("*.gguf"))))
    name = reader.fields["general.name"].contents()
    assert name.startswith("prodip ") and name.split()[1] == reader.fields["general.size_label"].contents()
