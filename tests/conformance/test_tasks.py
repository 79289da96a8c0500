"""Task figures per variant (``prodip.conformance.tasks``): the tiny export's ONNX variants scored on the bundled
lm-evaluation-harness tasks beside its checkpoint, the tasks and settings taken from a real ``prodip eval --tasks``
eval.json; fp32's figures equal the checkpoint's exactly; the card's task table has a bn and an en row with every
variant and its standard error, its figures are in the manifest's typed record, and an edited figure fails
conformance. The flag rule and the peers file on known values.

    python -m pytest tests/conformance/test_tasks.py -q
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

TASKS = ["prodip_tatoeba_en2bn", "prodip_tatoeba_bn2en"]
LIMIT = 16
ONNX = ("fp32", "fp16", "int8", "int4")


@pytest.fixture(scope="module")
def tasked_export(tiny_artifacts, tmp_path_factory) -> tuple[Path, dict, dict]:
    """(export, report, eval.json): `prodip eval --tasks` on the tiny checkpoint, then a conformance run of every
    variant with that eval.json, writing the card."""
    from prodip.conformance import run_conformance
    from prodip.conformance.faults import copy_export
    from prodip.train.eval import EvalConfig, evaluate
    from tests.conformance.conftest import tiny_conf_cfg

    root = tmp_path_factory.mktemp("tasked")
    export = copy_export(tiny_artifacts["export"], root / "export")
    ev = evaluate(
        EvalConfig(
            checkpoint=str(tiny_artifacts["checkpoint"]), tasks=TASKS, task_limit=LIMIT, out=str(root / "eval.json")
        )
    )
    report = run_conformance(tiny_conf_cfg(tiny_artifacts, export, write_manifest=True, eval_json=ev["out"]))
    return export, report, ev


def test_variants_score_the_tasks_of_eval_json(tasked_export):
    export, report, ev = tasked_export
    assert report["passed"], report["global"]
    assert report["tasks"]["settings"] == ev["tasks"]["settings"]  # the same tasks, items, shots and seed
    ev_rows = {r["task"]: r for r in ev["tasks"]["rows"]}
    for row in report["tasks"]["rows"]:
        assert set(row["scores"]) == {"checkpoint", *ONNX}
        assert row["items"] == LIMIT and row["shots"] == 0 and row["chance"] == 0.25
        # the same weights through the same harness model class: eval.json's trained model, to the last bit
        assert row["scores"]["checkpoint"] == ev_rows[row["task"]]["scores"]["trained"]
        # fp32 ONNX equals the checkpoint exactly (the argmax of every item is the same)
        assert row["scores"]["fp32"] == row["scores"]["checkpoint"]
        for v in ONNX:
            acc = row["scores"][v]["acc"]
            assert acc["stderr"] == pytest.approx(math.sqrt(acc["value"] * (1 - acc["value"]) / (LIMIT - 1)))
            assert row["seconds"][v] > 0


def test_card_task_table_is_read_back_and_an_edit_fails(tasked_export, conf_cfg, tmp_path):
    from prodip.base.manifest import load_manifest, verdict_is_current
    from prodip.conformance import evaluate
    from prodip.conformance.card import card_problems
    from prodip.conformance.faults import copy_export

    export, report, ev = tasked_export
    manifest = load_manifest(export)
    assert verdict_is_current(manifest)
    rows = manifest.card_quality.tasks
    assert {r.language for r in rows} == {"bn", "en"}
    text = (export / "README.md").read_text(encoding="utf-8")
    assert (
        "| task | language | shots | items | metric | chance | random twin | checkpoint | fp32 | fp16 | int8 | int4 |"
        in text
    )
    measured = {r["task"]: r for r in report["tasks"]["rows"]}
    for r in rows:
        # no `base` column: eval.json scored the exported checkpoint itself
        assert list(r.scores) == ["random twin", "checkpoint", *ONNX]
        assert r.scores["int4"].value == measured[r.task]["scores"]["int4"]["acc"]["value"]
        twin = ev["tasks"]["rows"][[x["task"] for x in ev["tasks"]["rows"]].index(r.task)]["scores"]["random_init"]
        assert r.scores["random twin"].value == twin["acc"]["value"]
        cp = r.scores["checkpoint"]
        line = f"| {r.task} | {r.language} | 0 | {LIMIT} | acc | 0.250 | "
        assert line in text
        assert f"{cp.value:.3f} ± {cp.stderr:.3f}" in text.split(line)[1].splitlines()[0]
    assert card_problems(export) == []

    bad = copy_export(export, tmp_path / "bad")
    readme = bad / "README.md"
    r0 = rows[0]
    line = next(x for x in readme.read_text(encoding="utf-8").splitlines() if x.startswith(f"| {r0.task} |"))
    cells = line.split(" | ")
    cells[-2] = "0.999 ± 0.001"  # the fp16 column's figure
    readme.write_text(readme.read_text(encoding="utf-8").replace(line, " | ".join(cells)), encoding="utf-8")
    assert card_problems(bad) == ["README.md: the quality card differs from the figures conformance measured"]
    assert not evaluate(conf_cfg(bad, variants=["fp32"]))["passed"]


def test_flag_only_where_the_drop_exceeds_the_error_bar():
    from prodip.conformance.tasks import card_rows

    def sc(v, e):
        return {"acc": {"value": v, "stderr": e}}

    measured = {
        "settings": {"names": ["t"]},
        "rows": [
            {
                "task": "t", "language": "bn", "output_type": "multiple_choice", "shots": 0, "items": 100,
                "metric": "acc", "higher_is_better": True, "chance": 0.25,
                "scores": {"checkpoint": sc(0.50, 0.05), "fp32": sc(0.50, 0.05), "int8": sc(0.46, 0.05),
                           "int4": sc(0.44, 0.0496)},
                "seconds": {"checkpoint": 1.0, "fp32": 1.0, "int8": 1.0, "int4": 1.0},
            }
        ],
    }  # fmt: skip
    eval_json = {
        "checkpoint": {"model_sha256": "pretrained"},
        "tasks": {
            "settings": {"names": ["t"]},
            "rows": [
                {"task": "t", "items": 100, "shots": 0, "seconds": {"trained": 2.0, "random_init": 2.0},
                 "scores": {"trained": sc(0.55, 0.05), "random_init": sc(0.26, 0.044)}}
            ],
        },
    }  # fmt: skip
    (row,) = card_rows(measured, eval_json, checkpoint_sha256="finetuned")
    assert row.flagged == ["int4"]  # 0.06 > 0.0496; int8's 0.04 is within its 0.05
    assert list(row.scores) == ["random twin", "base", "checkpoint", "fp32", "int8", "int4"]
    assert row.scores["base"].value == 0.55  # the pretrained model beside the fine-tuned one
    (same,) = card_rows(measured, eval_json, checkpoint_sha256="pretrained")
    assert "base" not in same.scores  # eval.json scored the exported checkpoint: no second column
    other = {**eval_json, "tasks": {**eval_json["tasks"], "settings": {"names": ["t"], "limit": 5}}}
    (alone,) = card_rows(measured, other, checkpoint_sha256="finetuned")
    assert list(alone.scores) == ["checkpoint", "fp32", "int8", "int4"]  # other settings: never mixed in


def test_peers_file(tmp_path):
    from prodip.base.errors import InvalidInput
    from prodip.base.manifest import CardQuality, TaskRow, TaskScore
    from prodip.conformance.card import render_quality
    from prodip.conformance.tasks import read_peers

    good = tmp_path / "peers.toml"
    good.write_text(
        '[[peer]]\nname = "Qwen3-0.6B"\nsource = "https://example.org/card"\nscores = { t = 0.412 }\n', encoding="utf-8"
    )
    peers = read_peers(good)
    row = TaskRow(task="t", language="bn", shots=0, items=10, metric="acc", chance=0.25,
                  scores={"checkpoint": TaskScore(value=0.3, stderr=0.15)})  # fmt: skip
    text = render_quality(CardQuality(rows=[], tasks=[row], task_peers=peers, task_settings={"limit": None}))
    assert "| chance | checkpoint | Qwen3-0.6B† |" in text
    assert "| t | bn | 0 | 10 | acc | 0.250 | 0.300 ± 0.150 | 0.412 |" in text
    assert "- Qwen3-0.6B: https://example.org/card" in text
    bad = tmp_path / "bad.toml"
    bad.write_text('[[peer]]\nname = "X"\nscores = { t = 0.4 }\n', encoding="utf-8")
    with pytest.raises(InvalidInput, match=r"bad.toml: \[\[peer\]\] 1 \(X\): source"):
        read_peers(bad)


def test_base_model_beside_the_fine_tuned_one(tiny_artifacts, tasked_export, tmp_path):
    """eval.json of another checkpoint (standing in for the pretrained model a chat export was tuned from): the
    card's task table gets its `base` column and the held-out text table both models' bits/char; the base path
    computes the reference's own figure when given the reference's weights."""
    from prodip.base.manifest import load_manifest
    from prodip.conformance import run_conformance
    from prodip.conformance.faults import copy_export
    from prodip.conformance.inputs import build_inputs
    from prodip.conformance.tasks import base_heldout
    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train.checkpoint import load_model
    from prodip.train.eval import EvalConfig, evaluate
    from tests.conformance.conftest import tiny_conf_cfg

    export = copy_export(tiny_artifacts["export"], tmp_path / "export")
    base_ev = evaluate(
        EvalConfig(
            checkpoint=str(tiny_artifacts["other_checkpoint"]),
            tasks=TASKS,
            task_limit=LIMIT,
            out=str(tmp_path / "e.json"),
        )
    )
    report = run_conformance(
        tiny_conf_cfg(tiny_artifacts, export, write_manifest=True, eval_json=base_ev["out"], variants=["fp32"])
    )
    assert report["passed"]
    quality = load_manifest(export).card_quality
    base_rows = {r["task"]: r["scores"]["trained"]["acc"] for r in base_ev["tasks"]["rows"]}
    for row in quality.tasks:
        assert list(row.scores) == ["random twin", "base", "checkpoint", "fp32"]
        assert row.scores["base"].value == base_rows[row.task]["value"]
    assert {f.language for f in quality.forgetting} == {"bn", "en"}
    for f in quality.forgetting:
        assert f.bpc == report["reference"]["heldout_bpc"][f.language]
        assert f.base_bpc == report["base"]["heldout_bpc"][f.language] != f.bpc
        assert f.change == pytest.approx(f.bpc / f.base_bpc - 1)
    text = (export / "README.md").read_text(encoding="utf-8")
    assert f"| {f.language} | {f.base_bpc:.4f} | {f.bpc:.4f} | {f.change:+.1%} |" in text

    # the base path on the reference's own weights gives the reference's figure
    _, own, ev = tasked_export
    model, mcfg, info = load_model(tiny_artifacts["checkpoint"])
    inputs = build_inputs(
        load_tokenizer(info["tokenizer_dir"]),
        context_tokens=mcfg.max_position_embeddings,
        pad_id=mcfg.pad_token_id,
        greedy_tokens=24,
        kv_tokens=0,
        shards_dir=str(tiny_artifacts["shards"]),
        heldout_tokens=192,
        tokenizer_sha256=info["tokenizer_sha256"],
    )
    same = base_heldout(ev, checkpoint_sha256="another model", inputs=inputs)
    assert same["heldout_bpc"] == pytest.approx(own["reference"]["heldout_bpc"], rel=1e-6)
    assert base_heldout(ev, checkpoint_sha256=info["model_sha256"], inputs=inputs) is None


def test_run_summary_shows_the_task_table(tasked_export, capsys):
    from prodip.base.manifest import load_manifest
    from prodip.summary import _print_card_figures

    export, _, _ = tasked_export
    quality = load_manifest(export).card_quality
    _print_card_figures(quality.to_dict())
    out = capsys.readouterr().out
    header = next(x for x in out.splitlines() if x.strip().startswith("task "))
    assert header.split()[-6:] == ["twin", "checkpoint", "fp32", "fp16", "int8", "int4"]
    for row in quality.tasks:
        fp32 = row.scores["fp32"]
        line = next(x for x in out.splitlines() if x.strip().startswith(row.task))
        assert f"{fp32.value:.3f}±{fp32.stderr:.3f}" in line and f" {row.language} " in line


def test_loglikelihoods_equal_the_harness_hf_model_on_the_export(tiny_artifacts):
    """The harness's own ``hf`` model (transformers, on the export's model.safetensors and tokenizer files) gives
    the same log-likelihoods and greedy flags as prodip's model class on the checkpoint, request by request, on
    the bundled tasks' real requests (contexts, choices, the empty-context case)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from prodip.tokenizer.bpe import load_tokenizer
    from prodip.train import lmeval
    from prodip.train.checkpoint import load_model

    model, mcfg, info = load_model(tiny_artifacts["checkpoint"])
    ours = lmeval.make_lm(
        load_tokenizer(info["tokenizer_dir"]),
        lmeval.torch_logits(model, torch.device("cpu")),
        bos_id=mcfg.bos_token_id,
        eos_id=mcfg.eos_token_id,
        max_length=mcfg.max_position_embeddings,
        batch_size=5,
    )
    hf = HFLM(pretrained=str(tiny_artifacts["export"]), dtype="float32", device="cpu", batch_size=5, add_bos_token=True)
    tm = lmeval.task_manager(["prodip_tatoeba_en2bn", "prodip_hellaswag_en"])
    args = [("", "আমার সোনার বাংলা")]
    for task in tm.load(["prodip_tatoeba_en2bn", "prodip_hellaswag_en"])["tasks"].values():
        for doc in list(task.test_docs())[:3]:
            args += [(task.doc_to_text(doc), " " + c) for c in task.doc_to_choice(doc)]
    requests = [Instance("loglikelihood", {}, a, i, ("t", i, 1)) for i, a in enumerate(args)]
    got, want = ours.loglikelihood(requests), hf.loglikelihood(requests)
    assert [g for _, g in got] == [g for _, g in want]
    assert [s for s, _ in got] == pytest.approx([s for s, _ in want], abs=2e-4)


def test_a_run_of_some_variants_keeps_the_others_task_figures(tiny_artifacts, tasked_export, tmp_path):
    from prodip.base.manifest import load_manifest
    from prodip.conformance import run_conformance
    from prodip.conformance.faults import copy_export
    from tests.conformance.conftest import tiny_conf_cfg

    export, _, ev = tasked_export
    before = {r.task: r for r in load_manifest(export).card_quality.tasks}
    again = copy_export(export, tmp_path / "again")
    report = run_conformance(
        tiny_conf_cfg(tiny_artifacts, again, write_manifest=True, eval_json=ev["out"], variants=["int8"])
    )
    assert report["passed"] and {r["task"]: set(r["scores"]) for r in report["tasks"]["rows"]} == {
        t: {"checkpoint", "int8"} for t in TASKS
    }
    after = {r.task: r for r in load_manifest(again).card_quality.tasks}
    for task, row in after.items():
        assert list(row.scores) == list(before[task].scores)  # random twin, checkpoint, fp32, fp16, int8, int4
        assert row.scores == before[task].scores  # the same weights, the same figures; the others kept
    assert (again / "README.md").read_text(encoding="utf-8").count("| prodip_tatoeba_") == 2
