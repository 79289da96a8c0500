"""lm-evaluation-harness tasks on every exported ONNX variant, beside the training model, for the quality card.

Conformance already loads the export's reference (the checkpoint it was made from, in PyTorch) and every ONNX
variant; here each variant gets one ONNX Runtime session (:class:`prodip.conformance.runners.OrtRunner`) under
the same ``lm_eval`` model class as the checkpoint (``prodip.train.lmeval.make_lm``), so the task figures of a
variant differ from the checkpoint's only by what the variant computes: the fp32 variant's equal the
checkpoint's, and a quantised variant's drop is its quantisation's effect on the task.

Which tasks: ``[conformance] tasks`` when given, else the ones ``eval.json`` (``prodip eval --tasks``) scored,
with its few-shot, limit and seed settings; ``eval.json``'s pretrained model and random twin then become the
card's ``base`` and ``random twin`` columns. A variant is ``flagged`` on a task when its drop from the checkpoint
is larger than its own standard error (the harness's).

Generation (chat) tasks run when the export is a chat model (its ``tokenizer_config.json`` has a chat template):
every model answers through the export's own template, greedily, until its end-of-turn token (the same
decoding for the checkpoint in PyTorch and each variant's session). A pretrained model cannot answer them, so
eval.json has no figures for them when it scored one; the ``random twin`` column of such a task (its
"nothing learned" level: chance has no meaning for generated text) is then measured here, on a twin of the
checkpoint's config initialised by ``reset_parameters(seed)`` as ``prodip eval`` makes it.

    python -c "from prodip.conformance.tasks import read_peers; help(read_peers)"
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.manifest import ForgettingRow, TaskPeer, TaskRow, TaskScore
from prodip.conformance.runners import OrtRunner
from prodip.train import lmeval

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

logger = logging.getLogger(__name__)

#: the card's column names for eval.json's two models and the export's own weights in PyTorch
RANDOM, BASE, CHECKPOINT = "random twin", "base", "checkpoint"


def task_plan(cfg: Any, eval_report: Optional[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The settings to score with (:func:`prodip.train.lmeval.task_settings`' layout), or None: no tasks.

    ``cfg.tasks`` (with ``cfg.task_limit``) when given; else ``eval.json``'s ``tasks.settings``.
    """
    if cfg.tasks:
        return lmeval.task_settings(
            cfg.tasks, num_fewshot=None, limit=cfg.task_limit or None, task_paths=cfg.task_paths, seed=0
        )
    settings = ((eval_report or {}).get("tasks") or {}).get("settings")
    return dict(settings) if settings else None


def evaluate_tasks(
    settings: dict[str, Any],
    export_dir: Path,
    onnx_variants: dict[str, str],
    ref_model: Any,
    model_cfg: Any,
    tokenizer: Any,
    threads: int,
    batch_size: int = 16,
    eval_report: Optional[dict[str, Any]] = None,
) -> dict[str, Any]:
    """Score the tasks on the reference (``checkpoint``) and each ONNX variant (one session each), the chat
    tasks through the export's chat template (left out for a base model's export), and a random twin on the
    chat tasks eval.json has no figures for.

    Args:
        settings: from :func:`task_plan`.
        onnx_variants: variant name -> path of its ``.onnx`` file in the export.
        ref_model: prodip's training model of the export's checkpoint.
        tokenizer: the checkpoint's ``tokenizers.Tokenizer``.
        eval_report: eval.json (whose rows, measured with the same settings, make a twin here needless).

    Returns:
        ``{settings, rows}``: :func:`prodip.train.lmeval.side_by_side` rows, a column per model (``random twin``
        first where measured here).
    """
    names = settings["names"]
    tm = lmeval.task_manager(names, settings.get("task_paths") or ())
    chat = lmeval.chat_format(export_dir)  # the export's own template: what every runtime renders
    common = dict(
        bos_id=model_cfg.bos_token_id,
        eos_id=model_cfg.eos_token_id,
        max_length=model_cfg.max_position_embeddings,
        batch_size=batch_size,
        chat=chat,
    )
    kw = dict(
        num_fewshot=settings.get("num_fewshot"),
        limit=settings.get("limit"),
        tm=tm,
        seed=settings.get("seed", 0),
        threads=threads,
    )
    cpu = torch.device("cpu")

    def torch_lm(model: Any) -> Any:
        return lmeval.make_lm(
            tokenizer, lmeval.torch_logits(model, cpu), step_fn=lmeval.torch_step(model, cpu), **common
        )

    per_model = {CHECKPOINT: lmeval.run_tasks(torch_lm(ref_model), names, **kw)}
    for variant, path in onnx_variants.items():
        logger.info("conformance: tasks on %s", variant)
        runner = OrtRunner(
            export_dir / path,
            variant,
            num_layers=model_cfg.num_hidden_layers,
            num_kv_heads=model_cfg.num_key_value_heads,
            head_dim=model_cfg.head_dim,
            threads=threads,
        )
        step = runner.forward
        lm = lmeval.make_lm(tokenizer, lmeval.step_logits(step), step_fn=step, **common)
        per_model[variant] = lmeval.run_tasks(lm, names, **kw)
        del runner, step, lm  # one session per variant, released before the next loads
    rows = lmeval.side_by_side(per_model)
    ev_tasks = (eval_report or {}).get("tasks") or {}
    ev_names = {r["task"] for r in ev_tasks.get("rows", [])} if ev_tasks.get("settings") == settings else set()
    twin_names = [r["task"] for r in rows if r["output_type"] == "generate_until" and r["task"] not in ev_names]
    if twin_names:
        from prodip.train.model import LlamaForCausalLM  # noqa: PLC0415

        logger.info("conformance: chat tasks on a random twin (%s)", ", ".join(twin_names))
        twin = LlamaForCausalLM(model_cfg)
        twin.reset_parameters(seed=settings.get("seed", 0))
        measured = {r["task"]: r for r in lmeval.run_tasks(torch_lm(twin.eval()), twin_names, **kw)}
        for row in rows:
            if row["task"] in measured:
                row["scores"] = {RANDOM: measured[row["task"]]["scores"], **row["scores"]}
                row["seconds"] = {RANDOM: measured[row["task"]]["seconds"], **row["seconds"]}
    return {"settings": settings, "rows": rows}


def card_rows(measured: dict[str, Any], eval_report: Optional[dict[str, Any]], checkpoint_sha256: str) -> list[TaskRow]:
    """The quality card's task rows: eval.json's random twin (and its trained model as ``base`` when it is
    another checkpoint than the export's), the checkpoint and each variant, flags where a variant's drop from
    the checkpoint exceeds its own standard error.

    eval.json's figures join only when they were measured with the same settings (else those columns are left
    out, not mixed)."""
    ev_tasks = (eval_report or {}).get("tasks") or {}
    same = ev_tasks.get("settings") == measured["settings"]
    ev_rows = {r["task"]: r for r in ev_tasks.get("rows", [])} if same else {}
    ev_sha = ((eval_report or {}).get("checkpoint") or {}).get("model_sha256")
    out = []
    for row in measured["rows"]:
        metric = row["metric"]
        columns: dict[str, TaskScore] = {}
        seconds: dict[str, float] = {}
        ev = ev_rows.get(row["task"])
        if ev is not None and (ev["items"], ev["shots"]) == (row["items"], row["shots"]):
            sources = [(RANDOM, "random_init")] + ([(BASE, "trained")] if ev_sha != checkpoint_sha256 else [])
            for col, key in sources:
                if key in ev["scores"] and metric in ev["scores"][key]:
                    columns[col] = TaskScore(**ev["scores"][key][metric])
                    seconds[col] = ev["seconds"][key]
        for name, scores in row["scores"].items():
            columns[name] = TaskScore(**scores[metric])
            seconds[name] = row["seconds"][name]
        ref = columns[CHECKPOINT].value
        flagged = []
        for name in row["scores"]:
            s = columns[name]
            if name in (CHECKPOINT, RANDOM) or ref is None or s.value is None or s.stderr is None:
                continue
            drop = (ref - s.value) if row["higher_is_better"] else (s.value - ref)
            if drop > s.stderr:
                flagged.append(name)
        out.append(
            TaskRow(
                task=row["task"],
                language=row["language"],
                output_type=row["output_type"],
                shots=row["shots"],
                items=row["items"],
                metric=metric,
                higher_is_better=row["higher_is_better"],
                chance=row["chance"],
                scores=columns,
                flagged=flagged,
                seconds=seconds,
            )
        )
    return out


def read_peers(path: str | Path) -> list[TaskPeer]:
    """The user's reference models for the task table, a TOML file::

        [[peer]]
        name = "Qwen3-0.6B"
        source = "https://... (where the scores were published)"
        scores = { belebele_ben_Beng = 0.412, belebele_eng_Latn = 0.655 }

    Raises:
        MissingInput: no such file. InvalidInput: not TOML, or a peer without name, source or scores (named).
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{path}: peers file not found (TOML of [[peer]] name, source, scores)")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise InvalidInput(f"{path}: not valid TOML ({err})") from None
    peers = []
    for i, entry in enumerate(data.get("peer", [])):
        try:
            peers.append(TaskPeer(**entry))
        except Exception as err:  # pydantic's message names the field
            first = str(err).splitlines()[1:3]
            raise InvalidInput(f"{path}: [[peer]] {i + 1} ({entry.get('name', '?')}): {' '.join(first)}") from None
    if not peers:
        raise InvalidInput(f"{path}: no [[peer]] entries")
    return peers


# ---- what fine-tuning cost: the pretrained model on the same held-out text -----------------------


def base_heldout(
    eval_report: Optional[dict[str, Any]], checkpoint_sha256: str, inputs: Any
) -> Optional[dict[str, Any]]:
    """Bits/char of eval.json's checkpoint on conformance's own held-out windows, when it is another model
    than the exported one (the pretrained model a chat model was fine-tuned from): the card then shows both
    models on the same text, per language.

    Returns:
        ``{checkpoint: {path, step, model_sha256}, heldout_bpc: {lang: bits/char}}``, or None (no eval.json, it
        scored the exported checkpoint itself, or its checkpoint is no longer there: logged).
    """
    from prodip.conformance.compare import bits_per_char  # noqa: PLC0415 (compare imports the suite's helpers)
    from prodip.conformance.measure import heldout_nll, run_item  # noqa: PLC0415
    from prodip.conformance.runners import TorchRunner  # noqa: PLC0415
    from prodip.train.checkpoint import load_model  # noqa: PLC0415

    scored = (eval_report or {}).get("checkpoint") or {}
    if not scored.get("model_sha256") or scored["model_sha256"] == checkpoint_sha256 or not inputs.heldout:
        return None
    try:
        model, _, info = load_model(scored["path"])
    except (OSError, ValueError) as err:
        logger.warning(
            "conformance: eval.json's checkpoint %s cannot be loaded (%s); no base figures", scored["path"], err
        )
        return None
    if info["model_sha256"] != scored["model_sha256"]:
        logger.warning("conformance: %s is not the checkpoint eval.json scored; no base figures", scored["path"])
        return None
    runner = TorchRunner(model, "base")
    bpc = {
        item.lang: bits_per_char(heldout_nll(item, run_item(runner, item)), inputs.heldout[item.lang]["chars"])
        for item in inputs.items
        if item.targets is not None
    }
    return {"checkpoint": {k: scored.get(k) for k in ("path", "step", "model_sha256")}, "heldout_bpc": bpc}


def forgetting_rows(report: dict[str, Any]) -> list[ForgettingRow]:
    """Per held-out language: the base model's bits/char and the exported (fine-tuned) model's on the same
    windows, and the relative change (positive: the fine-tuned model is worse at the language)."""
    base = (report.get("base") or {}).get("heldout_bpc") or {}
    ref = (report.get("reference") or {}).get("heldout_bpc") or {}
    return [
        ForgettingRow(language=lang, base_bpc=base[lang], bpc=ref[lang], change=ref[lang] / base[lang] - 1)
        for lang in sorted(base)
        if lang in ref and base[lang]
    ]


def keep_unchecked(rows: list[TaskRow], previous: list[TaskRow], variants: list[str]) -> list[TaskRow]:
    """Task rows of this run with the columns of variants it did not check kept from the previous card (measured
    on the same export files, as the quality rows and verdicts of a run on some variants are kept), columns in
    the card's order: random twin, base, checkpoint, then the manifest's variants.

    A previous row is used only for the same task, items, shots and metric."""
    order = [RANDOM, BASE, CHECKPOINT, *variants]
    before = {(r.task, r.items, r.shots, r.metric): r for r in previous}
    out = []
    for row in rows:
        old = before.get((row.task, row.items, row.shots, row.metric))
        if old is None:
            out.append(row)
            continue
        scores = {**{k: v for k, v in old.scores.items() if k not in row.scores}, **row.scores}
        seconds = {**{k: v for k, v in old.seconds.items() if k not in row.scores}, **row.seconds}
        flagged = row.flagged + [v for v in old.flagged if v not in row.scores]
        ranked = sorted(scores, key=lambda c: order.index(c) if c in order else len(order))
        out.append(
            row.model_copy(
                update={
                    "scores": {c: scores[c] for c in ranked},
                    "seconds": {c: seconds[c] for c in ranked if c in seconds},
                    "flagged": sorted(flagged, key=ranked.index),
                }
            )
        )
    return out
