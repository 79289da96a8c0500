"""lm-evaluation-harness tasks on a prodip checkpoint (``prodip.train.lmeval``, ``prodip eval --tasks``).

Known answers: a 3-item task written here as ordinary lm-eval YAML over a JSONL file, whose accuracy, chance
level and standard error are computed by hand from the model's own full-sequence log-probabilities (one
unbatched, unpadded forward per choice); the bundled tasks load offline and carry their languages; the
documented Belebele / Global-MMLU-Lite command runs with the Hub download replaced by local files in each
dataset's own layout.

    python -m pytest tests/train/test_lmeval.py -q
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

ITEMS = [  # contexts and choices in both languages; 2, 3 and 4 choices
    {"q": "The capital of Bangladesh is", "choices": ["Dhaka", "a river"], "label": 0},
    {"q": "আমার সোনার", "choices": ["বাংলা", "আকাশ", "নদী"], "label": 2},
    {"q": "A stitch in time", "choices": ["saves nine", "is blue", "runs fast", "sings"], "label": 0},
]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    from tests.fixtures import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path_factory.mktemp("lmeval"), max_position_embeddings=64)


@pytest.fixture(scope="module")
def three_item_task(tmp_path_factory) -> Path:
    """A task folder: ``three_items.yaml`` over ``three_items.jsonl`` (the harness's json loader)."""
    folder = tmp_path_factory.mktemp("tasks")
    data = folder / "three_items.jsonl"
    data.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in ITEMS), encoding="utf-8")
    (folder / "three_items.yaml").write_text(
        "task: three_items\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "output_type: multiple_choice\n"
        "test_split: test\n"
        'doc_to_text: "{{q}}"\n'
        "doc_to_choice: choices\n"
        "doc_to_target: label\n"
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "metadata:\n  version: 1.0\n  language: mixed\n",
        encoding="utf-8",
    )
    return folder


def _by_hand(run: Path) -> tuple[list[list[float]], list[int]]:
    """Per item, each choice's summed log-probability (nats) from one forward of ``<|bos|> context choice``,
    and whether the argmax choice is the label."""
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train.checkpoint import load_model

    model, mcfg, info = load_model(run)
    tok = load_tokenizer(info["tokenizer_dir"])
    lls, hits = [], []
    for item in ITEMS:
        ctx = tok.encode(item["q"]).ids  # <|bos|> first, the tokenizer's default
        row = []
        for choice in item["choices"]:
            whole = tok.encode(item["q"] + " " + choice).ids  # the harness's target_delimiter: one space
            assert whole[: len(ctx)] == ctx
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([whole[:-1]])).float(), -1)[0]
            row.append(sum(float(logp[t - 1, whole[t]]) for t in range(len(ctx), len(whole))))
        lls.append(row)
        hits.append(int(max(range(len(row)), key=lambda j: row[j]) == item["label"]))
    return lls, hits


def test_three_item_task_by_hand(tiny_run, three_item_task):
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train import lmeval
    from prodip.train.checkpoint import load_model

    lls, hits = _by_hand(tiny_run)
    model, mcfg, info = load_model(tiny_run)
    tok = load_tokenizer(info["tokenizer_dir"])
    lm = lmeval.make_lm(
        tok, lmeval.torch_logits(model, torch.device("cpu")), bos_id=1, eos_id=2, max_length=64, batch_size=2
    )
    # the batched, padded, sorted scores equal the unbatched ones
    pairs = [lm._encode_pair(i["q"], " " + c) for i in ITEMS for c in i["choices"]]
    scores = lmeval.continuation_scores(
        lmeval.torch_logits(model, torch.device("cpu")), pairs, max_length=64, batch_size=2
    )
    assert [s for s, _ in scores] == pytest.approx([x for row in lls for x in row], abs=1e-4)

    (row,) = lmeval.run_tasks(lm, ["three_items"], task_paths=[three_item_task])
    n = len(ITEMS)
    acc = sum(hits) / n
    stderr = math.sqrt(sum((h - acc) ** 2 for h in hits) / (n - 1) / n)  # the harness's mean_stderr
    assert row["task"] == "three_items" and row["language"] == "mixed" and row["items"] == 3 and row["shots"] == 0
    assert row["scores"]["acc"]["value"] == acc
    assert row["scores"]["acc"]["stderr"] == pytest.approx(stderr)
    assert row["chance"] == pytest.approx((1 / 2 + 1 / 3 + 1 / 4) / 3)
    assert row["metric"] == "acc" and row["higher_is_better"] is True


def test_bundled_tasks_are_offline_and_carry_their_language():
    from prodip.train import lmeval

    assert {"prodip_tatoeba_en2bn", "prodip_tatoeba_bn2en", "prodip_hellaswag_en"} <= set(lmeval.local_tasks())
    tm = lmeval.task_manager(["prodip_tatoeba_en2bn", "prodip_hellaswag_en"])
    tasks = tm.load(["prodip_tatoeba_en2bn", "prodip_hellaswag_en"])["tasks"]
    en2bn = next(t for name, t in tasks.items() if "en2bn" in str(name))
    doc = next(iter(en2bn.test_docs()))
    choices = en2bn.doc_to_choice(doc)
    assert choices[en2bn.doc_to_target(doc)] == doc["bn"] and len(set(choices)) == 4
    assert en2bn.config.metadata["language"] == "bn"
    assert len(list(en2bn.test_docs())) == 254
    assert lmeval.task_language("belebele_ben_Beng", None) == "bn"
    assert lmeval.task_language("belebele_eng_Latn", None) == "en"
    assert lmeval.task_language("global_mmlu_bn", None) == "bn"


def test_unknown_task_is_named(tiny_run, tmp_path):
    from prodip.base.errors import InvalidInput
    from prodip.train.eval import EvalConfig, evaluate

    with pytest.raises(InvalidInput, match=r"unknown task\(s\) \['no_such_task'\]; bundled: .*prodip_tatoeba_en2bn"):
        evaluate(EvalConfig(checkpoint=str(tiny_run), tasks=["no_such_task"], out=str(tmp_path / "e.json")))
    assert not (tmp_path / "e.json").exists()


def test_eval_tasks_records_both_models(tiny_run, tmp_path):
    """`prodip eval --tasks`: the figures of the checkpoint and its random twin, per language, in eval.json."""
    from prodip.train.eval import EvalConfig, evaluate, format_table
    from prodip.train.records import EvalReport

    cfg = EvalConfig(
        checkpoint=str(tiny_run),
        tasks=["prodip_tatoeba_en2bn", "prodip_tatoeba_bn2en"],
        task_limit=12,
        out=str(tmp_path / "eval.json"),
    )
    result = evaluate(cfg)
    rec = EvalReport.read(tmp_path / "eval.json")
    assert rec.tasks == result["tasks"]
    assert rec.tasks["settings"]["limit"] == 12 and rec.tasks["settings"]["names"] == cfg.tasks
    rows = {r["language"]: r for r in rec.tasks["rows"]}
    assert set(rows) == {"bn", "en"}
    for r in rows.values():
        assert r["items"] == 12 and r["chance"] == 0.25
        for model in ("trained", "random_init"):
            acc = r["scores"][model]["acc"]
            assert 0 <= acc["value"] <= 1 and acc["value"] * 12 == round(acc["value"] * 12)
            assert acc["stderr"] == pytest.approx(math.sqrt(acc["value"] * (1 - acc["value"]) / 11))
            assert r["seconds"][model] > 0
    assert "task prodip_tatoeba_en2bn [bn, 0-shot, 12 items, chance 0.250] acc: trained" in format_table(result)


BELEBELE_ROW = {
    "link": "x",
    "question_number": 1,
    "flores_passage": "{passage}",
    "question": "{question}",
    "mc_answer1": "{a}",
    "mc_answer2": "{b}",
    "mc_answer3": "{c}",
    "mc_answer4": "{d}",
    "correct_answer_num": "2",
    "dialect": "{dialect}",
    "ds": "2023-08-30",
}
GMMLU_CATEGORIES = ["Business", "Humanities", "Medical", "Other", "STEM", "Social Sciences"]


def _stub_hub(lang: str, name: str, split: str) -> list[dict]:
    """Rows in the layout of facebook/belebele and CohereLabs/Global-MMLU-Lite (their dataset cards' fields)."""
    text = {"bn": ("নদী", "ঢাকা", "পদ্মা", "মেঘনা"), "en": ("river", "Dhaka", "Padma", "Meghna")}[lang]
    if name == "belebele":
        return [
            {
                k: (
                    v.format(
                        passage=f"{text[0]} {i}",
                        question=text[1],
                        a=text[0],
                        b=text[1],
                        c=text[2],
                        d=text[3],
                        dialect=lang,
                    )
                    if isinstance(v, str)
                    else v
                )
                for k, v in BELEBELE_ROW.items()
            }  # fmt: skip
            for i in range(3)
        ]
    return [
        {
            "sample_id": f"{cat}/{i}",
            "subject": "x",
            "subject_category": cat,
            "question": f"{text[1]} {i}?",
            "option_a": text[0],
            "option_b": text[1],
            "option_c": text[2],
            "option_d": text[3],
            "answer": "B",
            "required_knowledge": "[]",
            "time_sensitive": "No",
            "reference": "",
            "culture": "[]",
            "region": "[]",
            "country": "[]",
            "cultural_sensitivity_label": "CA",
            "is_annotated": False,
        }  # fmt: skip
        for cat in GMMLU_CATEGORIES
        for i in range(2 if split == "test" else 1)
    ]


@pytest.mark.slow
def test_documented_hub_command_with_the_download_stubbed(tiny_run, tmp_path, monkeypatch):
    """docs/eval.md's Belebele + Global-MMLU-Lite command, its own code path (the harness's task list, its YAML,
    `datasets.load_dataset`), with the Hub replaced by rows in each dataset's layout."""
    import datasets

    from prodip.train.eval import EvalConfig, evaluate
    from tests.test_docs_commands import ROOT

    doc = (ROOT / "docs" / "eval.md").read_text(encoding="utf-8")
    line = next(x for x in doc.splitlines() if x.startswith("prodip eval ") and "belebele" in x)
    tasks = line.split("--tasks ")[1].split()[0].split(",")
    assert tasks == ["belebele_ben_Beng", "belebele_eng_Latn", "global_mmlu_bn", "global_mmlu_en"]
    calls = []

    def load_dataset(path, name=None, **kw):
        calls.append((path, name))
        langs = {"ben_Beng": "bn", "eng_Latn": "en", "bn": "bn", "en": "en"}
        kind = "belebele" if path == "facebook/belebele" else "gmmlu"
        assert path in ("facebook/belebele", "CohereLabs/Global-MMLU-Lite"), path
        splits = ["test"] if kind == "belebele" else ["test", "dev"]
        return datasets.DatasetDict({s: datasets.Dataset.from_list(_stub_hub(langs[name], kind, s)) for s in splits})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    result = evaluate(EvalConfig(checkpoint=str(tiny_run), tasks=tasks, out=str(tmp_path / "eval.json")))
    rows = {r["task"]: r for r in result["tasks"]["rows"]}
    assert {r["language"] for r in rows.values()} == {"bn", "en"}
    assert rows["belebele_ben_Beng"]["items"] == 3 and rows["global_mmlu_en"]["items"] == 12
    assert ("facebook/belebele", "ben_Beng") in calls and ("CohereLabs/Global-MMLU-Lite", "bn") in calls
    for r in rows.values():
        assert r["chance"] == 0.25 and r["metric"] == "acc"
        assert r["scores"]["trained"]["acc"]["stderr"] is not None


def test_done_checks_follow_the_task_settings(tmp_path, caplog):
    """eval.json without the task figures [eval] tasks asks for is not complete, nor a conformance report
    without the figures eval.json's settings call for."""
    import dataclasses

    from prodip.base.files import file_sha256
    from prodip.base.manifest import files_table_sha256
    from prodip.conformance.stage import conformance_done
    from prodip.train.checkpoint import save_checkpoint
    from prodip.train.eval import task_settings
    from prodip.train.stage import eval_done
    from tests.fixtures import build_tiny_checkpoint, tiny_model, tiny_model_config
    from tests.prodip.test_stage_inputs import FILES, _export_with_report, _plan, _shards

    # the done-checks say why at INFO; capture that level whatever an earlier test set on these loggers
    caplog.set_level(logging.INFO, logger="prodip.train.stage")
    caplog.set_level(logging.INFO, logger="prodip.conformance.stage")

    build_tiny_checkpoint(tmp_path / "t")
    plan = _plan(tmp_path)
    plan = dataclasses.replace(plan, eval=dataclasses.replace(plan.eval, tasks=["prodip_tatoeba_en2bn"], task_limit=10))
    _shards(Path(plan.train.shards_dir), "one")
    config = tiny_model_config(vocab_size=512)
    ckpt = save_checkpoint(
        Path(plan.train.out_dir) / "checkpoints", step=10, model=tiny_model(config), model_config=config,
        tokenizer_dir=str(tmp_path / "t" / "tokenizer"),
    )  # fmt: skip
    doc = {
        "format_version": 1,
        "checkpoint": {"path": str(ckpt), "step": 10, "model_sha256": file_sha256(ckpt / "model.safetensors")},
        "shards_meta_sha256": file_sha256(Path(plan.eval.shards_dir) / "meta.json"),
    }
    eval_json = Path(plan.eval.out)
    eval_json.write_text(json.dumps(doc))
    assert not eval_done(plan.eval) and "task figures are not those [eval] tasks asks for" in caplog.text
    settings = task_settings(plan.eval)
    assert settings["limit"] == 10 and settings["names"] == ["prodip_tatoeba_en2bn"]
    eval_json.write_text(json.dumps({**doc, "tasks": {"settings": settings, "rows": []}}))
    assert eval_done(plan.eval)

    exp = _export_with_report(plan, FILES, ["fp32"], ["fp32"], files_table_sha256(FILES))
    assert not conformance_done(plan.conformance)  # eval.json scored tasks; the report has none
    report = Path(plan.conformance.out) / "report.json"
    data = json.loads(report.read_text())
    report.write_text(json.dumps({**data, "tasks": {"settings": settings, "rows": []}}))
    manifest = json.loads((exp / "manifest.json").read_text())
    manifest["conformance"]["report_sha256"] = file_sha256(report)
    (exp / "manifest.json").write_text(json.dumps(manifest))
    assert conformance_done(plan.conformance)
