"""The model card (issue 24): licence and sources in every artifact, read back with each format's own
library; the quality card written from the conformance report; planted card faults fail the export.

python -m pytest tests/conformance/test_card.py -q
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from prodip.conformance.faults import plant_card_figure_edited, plant_card_licence_dropped
from tests.fixtures import DATA_CARD


def test_export_writes_the_card_into_every_artifact(tiny_artifacts):
    import onnx
    from huggingface_hub import ModelCard

    from prodip.base.manifest import verify_files
    from prodip.conformance.card import card_problems

    export = tiny_artifacts["export"]
    manifest = verify_files(export)  # README.md is hashed like every other file
    assert "README.md" in manifest.files
    card = ModelCard.load(export / "README.md")
    data = card.data.to_dict()
    assert data["license"] == "other" and data["license_name"] == "prodip-data-mix"
    assert data["language"] == ["bn", "en"] and data["datasets"] == ["example/bn-news"]
    assert data["pipeline_tag"] == "text-generation" and "licence-not-cleared" in data["tags"]
    assert "| bluck_bn_mcq.jsonl | bn | – | `unknown` (licence unknown, included by choice) | 200 | 100 |" in card.text
    assert "Share-alike terms apply (from bn-news)" in card.text and "NOT fully cleared" in card.text
    assert "| bn-news | bn (news Bangla) |" in card.text and "| 3,000 |" in card.text  # tokens seen in training
    onnx_files = sorted(export.rglob("*.onnx"))
    onnx_variants = [manifest.variants[name] for name in manifest.formats("onnx")]
    listed = {v.path for v in onnx_variants} | {p for v in onnx_variants for p in (v.genai_path, v.wasm_path) if p}
    assert {p.relative_to(export).as_posix() for p in onnx_files} == listed and len(listed) >= 4
    for path in onnx_files:
        props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
        assert props["license"] == "other" and props["languages"] == "bn,en", path
        sources = {s["name"]: s for s in json.loads(props["sources"])}
        assert sources["bluck_bn_mcq.jsonl"]["included_by_choice"] and sources["bn-news"]["license"] == "CC-BY-SA-4.0"
    assert manifest.card is not None and manifest.card.statement.unknown_included == ["bluck_bn_mcq.jsonl"]
    assert [s.name for s in manifest.card.sources] == [s["name"] for s in DATA_CARD["sources"]]
    assert card_problems(export) == []


def test_licence_dropped_from_one_artifact_fails(tiny_artifacts, conf_cfg, tmp_path):
    from prodip.conformance import evaluate
    from prodip.conformance.card import card_problems

    bad = plant_card_licence_dropped(tiny_artifacts["export"], tmp_path / "bad")
    assert card_problems(bad) == ["onnx/model_fp16.onnx: metadata_props['license'] = None, manifest says 'other'"]
    report = evaluate(conf_cfg(bad, variants=["fp16"]))
    assert not report["passed"] and report["global"]["metrics"]["card_ok"] is False


@pytest.mark.slow
def test_quality_card_comes_from_the_report_and_an_edited_figure_fails(conformed_export, conf_cfg, tmp_path):
    from prodip.base.manifest import load_manifest, verdict_is_current, verify_files
    from prodip.conformance import evaluate
    from prodip.conformance.card import card_problems

    export, report = conformed_export  # run_conformance with write_manifest and eval.json = EVAL_TWIN
    assert report["passed"], report["global"]
    manifest = verify_files(export)
    assert verdict_is_current(manifest)  # the card written after measuring does not void the verdict
    assert manifest.card_quality is not None
    rows = {(r.variant, r.language): r for r in manifest.card_quality.rows}
    assert set(rows) == {(v, lang) for v in ("safetensors", "fp32", "fp16", "int8", "int4") for lang in ("bn", "en")}
    text = (export / "README.md").read_text(encoding="utf-8")
    for (variant, lang), row in rows.items():
        h = report["candidates"][variant]["metrics"]["heldout"][lang]
        assert row.bpc == h["bpc"] and row.kl_p999 == h["kl_p999"] and row.top1 == h["top1"]
        assert f"| {variant} | {lang} | {h['bpc']:.4f} | {h['bpc_delta']:+.4f} | {h['kl_mean']:.2e} |" in text
    assert "ONNX Runtime" in rows[("int4", "bn")].runtimes
    on_disk = sum((export / f).stat().st_size for f in manifest.variants["int4"].files())
    assert rows[("int4", "bn")].bytes == on_disk
    assert "| bn | 2.5000 | 1.7500 | 5.9000 | 4.2500 |" in text  # trained vs random twin, from eval.json (EVAL_TWIN)
    assert card_problems(export) == []
    bad = plant_card_figure_edited(export, tmp_path / "bad")
    assert card_problems(bad) == ["README.md: the quality card differs from the figures conformance measured"]
    assert not evaluate(conf_cfg(bad, variants=["fp32"]))["passed"]
    assert load_manifest(bad).card_quality == manifest.card_quality


def test_kl_percentile_is_llama_cpps():
    """The card's 99.9% KL is llama-perplexity --kl-divergence's: sorted values, linear interpolation at
    fraction * (n - 1) (tools/perplexity/perplexity.cpp's ``percentile`` lambda), KL(base || quantised)."""
    import torch

    from prodip.conformance.compare import LogitAccumulator

    rng = np.random.default_rng(0)
    ref, cand = rng.normal(size=(1537, 50)), rng.normal(size=(1537, 50))
    acc = LogitAccumulator()
    acc.add(ref, cand)
    got = acc.result()
    lp, lq = torch.log_softmax(torch.tensor(ref), -1), torch.log_softmax(torch.tensor(cand), -1)
    kld = torch.nn.functional.kl_div(lq, lp, log_target=True, reduction="none").sum(-1).numpy()
    values = np.sort(kld)
    p = 0.999 * (len(values) - 1)
    ip = int(p)
    want = (1 - (p - ip)) * values[ip] + (p - ip) * values[min(ip + 1, len(values) - 1)]
    assert got["kl_p999"] == pytest.approx(want, rel=1e-12)
    assert got["kl_mean"] == pytest.approx(kld.mean(), rel=1e-12)
    assert got["top1"] == np.mean(ref.argmax(-1) == cand.argmax(-1))


def test_tokenizer_word_lists_flow_into_the_statement():
    """A tokenizer trained on wordfreq's CC BY-SA 4.0 lists (train_info.json, as tokenizer train writes it)
    makes the card name them and share-alike terms, though the model's data is public domain."""
    from prodip.export.card import build_card
    from prodip.tokenizer.bpe import TrainInfo
    from prodip.tokenizer.wordcounts import WORDFREQ_LICENSE

    data = {"sources": [dict(DATA_CARD["sources"][2])], "tokens_seen_by_source": {"en-novels": 5}}
    raw = {
        "format_version": 1,
        "kind": "portable",
        "vocab_size": 512,
        "source_records": [dict(DATA_CARD["sources"][2]), {**DATA_CARD["sources"][0], "name": "tok-only"}],
        "sources": [
            {"language": "en", "source": "data/en", "kind": "text"},
            {
                "language": "bn",
                "source": "wordfreq:bn",
                "kind": "word_counts",
                "license": dict(WORDFREQ_LICENSE, wordlist="large_bn"),
                "version": "3.1.1",
            },
        ],
    }
    info = TrainInfo.from_dict(raw)
    assert build_card(data).statement.share_alike == []
    card = build_card(data, info)
    assert [(s.name, s.stage) for s in card.sources] == [
        ("en-novels", None),
        ("tok-only", "tokenizer"),
        ("wordfreq:bn", "tokenizer"),
    ]
    assert card.statement.share_alike == ["tok-only", "wordfreq:bn"] and card.license.license == "other"
