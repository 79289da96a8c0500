"""lm-evaluation-harness tasks on a prodip model: an ``lm_eval`` model class over any batched logits function,
and :func:`run_tasks`, which runs named tasks through the harness's ``evaluate`` and returns one typed row per
task with the harness's standard errors.

The model class scores loglikelihood requests the way the harness's ``hf`` model does on an export
(``TemplateLM``: context and continuation encoded as a whole and split after the context's tokens, trailing
context spaces moved to the continuation, the tokenizer's default encode putting ``<|bos|>`` in front, as it
starts every training document), in batches of right-padded rows (causal attention never looks ahead, so the
padding cannot change a real row's logits), longest first. The same class runs over the training model here
and over each ONNX variant in conformance (``prodip.conformance.tasks``), so their figures differ only by
what the variant computes.

Tasks are found in the bundled folder ``TASKS_DIR`` (offline, data shipped beside the YAML: see its README.md)
and the folders given, then, for a name not found there, in lm-evaluation-harness's own task list (Belebele,
Global-MMLU-Lite, ...: those download their data from the Hugging Face Hub; docs/eval.md).

    python -c "from prodip.train.lmeval import local_tasks; print(local_tasks())"
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

import torch

from prodip.base.errors import InvalidInput, MissingInput

log = logging.getLogger(__name__)

#: the bundled offline tasks (YAML, their data and loader; README.md there names sources and licences)
TASKS_DIR = Path(__file__).with_name("tasks")
#: the metric the card shows for a task, in order of preference
PRIMARY_METRICS = ("acc", "acc_norm", "exact_match", "f1", "bleu")
#: Flores-200 language codes in harness task names (belebele_ben_Beng) -> the ISO 639-1 codes prodip uses
_FLORES = {"ben": "bn", "eng": "en", "hin": "hi", "urd": "ur", "asm": "as"}

#: (B, T) int64 token ids, right-padded -> (B, T, V) float logits
LogitsFn = Callable[[torch.Tensor], torch.Tensor]


def _require_lm_eval() -> Any:
    try:
        import lm_eval  # noqa: PLC0415 (optional: only `--tasks` needs it)
    except ImportError:
        raise MissingInput(
            "lm-evaluation-harness is not installed, so tasks cannot run: pip install 'lm-eval==0.4.13' "
            "(or prodip[test])"
        ) from None
    return lm_eval


def _template_lm() -> type:
    _require_lm_eval()
    from lm_eval.api.model import TemplateLM  # noqa: PLC0415

    return TemplateLM


def make_lm(
    tokenizer: Any, logits_fn: LogitsFn, *, bos_id: int, eos_id: int, max_length: int, batch_size: int = 32
) -> Any:
    """An ``lm_eval.api.model.TemplateLM`` scoring loglikelihood requests with ``logits_fn``.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` whose default encode prepends ``<|bos|>``.
        logits_fn: ``(B, T) int64 -> (B, T, V)`` logits (any float dtype; scored in float32).
        bos_id: the token an empty context becomes (lm-eval's ``prefix_token_id``).
        eos_id: the end-of-text token (``eot_token_id``).
        max_length: the model's longest input (tokens); longer rows keep their last ``max_length + 1`` tokens.
        batch_size: rows per call of ``logits_fn``.

    Returns:
        The model object; ``choices_seen`` counts requests per ``(task, doc_id)`` since the last reset.
    """
    base = _template_lm()

    class ProdipLM(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.tokenizer = tokenizer
            self.choices_seen: Counter[tuple[str, int]] = Counter()

        @property
        def eot_token_id(self) -> int:
            return eos_id

        @property
        def prefix_token_id(self) -> int:
            return bos_id

        @property
        def max_length(self) -> int:
            return max_length

        def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs: Any) -> list[int]:
            add = True if add_special_tokens is None else add_special_tokens
            return list(tokenizer.encode(string, add_special_tokens=add).ids)

        def tok_decode(self, ids: Sequence[int], **kwargs: Any) -> str:
            return str(tokenizer.decode(list(ids), skip_special_tokens=False))

        def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
            for req in requests:
                self.choices_seen[(req.task_name, req.doc_id)] += 1
            return super().loglikelihood(requests, disable_tqdm=True)

        def _loglikelihood_tokens(self, requests: list[Any], **kwargs: Any) -> list[tuple[float, bool]]:
            pairs = [(ctx, cont) for _, ctx, cont in requests]
            return continuation_scores(logits_fn, pairs, max_length=max_length, batch_size=batch_size)

        def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
            # the harness's own disjoint windows (as its hf model): each token scored once, <|bos|> first
            from lm_eval.utils import get_rolling_token_windows, make_disjoint_window  # noqa: PLC0415

            out = []
            for req in requests:
                windows = get_rolling_token_windows(
                    token_list=self.tok_encode(req.args[0], add_special_tokens=False),
                    prefix_token=bos_id,
                    max_seq_len=max_length,
                    context_len=1,
                )
                pairs = [make_disjoint_window(w) for w in windows]
                scores = continuation_scores(logits_fn, pairs, max_length=max_length, batch_size=batch_size)
                out.append(sum(s for s, _ in scores))
            return out

        def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
            raise InvalidInput(
                "prodip's task runner scores loglikelihood tasks only (multiple choice, perplexity); a generation "
                "task runs against `prodip serve` (docs/eval.md: lm_eval --model local-chat-completions)"
            )

    return ProdipLM()


@torch.no_grad()
def continuation_scores(
    logits_fn: LogitsFn, pairs: Sequence[tuple[Sequence[int], Sequence[int]]], *, max_length: int, batch_size: int
) -> list[tuple[float, bool]]:
    """Summed log-probability (nats) of each continuation given its context, and whether every continuation
    token is the argmax (lm-eval's ``(logprob, is_greedy)``).

    Rows ``context + continuation`` keep their last ``max_length + 1`` tokens; the model reads all but the last.
    They are scored longest first in right-padded batches, padding id 0.

    Raises:
        InvalidInput: an empty context or continuation, or a continuation longer than ``max_length``.
    """
    rows, firsts = [], []
    for i, (ctx, cont) in enumerate(pairs):
        if not ctx or not cont:
            raise InvalidInput(f"loglikelihood request {i}: empty context or continuation tokens")
        if len(cont) > max_length:
            raise InvalidInput(
                f"loglikelihood request {i}: continuation of {len(cont)} tokens exceeds max_length={max_length}"
            )
        seq = (list(ctx) + list(cont))[-(max_length + 1) :]
        rows.append(seq)
        firsts.append(len(seq) - len(cont))  # index of the first continuation token
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
    for b in range(0, len(order), batch_size):
        group = order[b : b + batch_size]
        T = len(rows[group[0]]) - 1
        ids = torch.zeros((len(group), T), dtype=torch.int64)
        for r, i in enumerate(group):
            ids[r, : len(rows[i]) - 1] = torch.tensor(rows[i][:-1])
        logits = logits_fn(ids)
        for r, i in enumerate(group):
            f, n = firsts[i], len(rows[i])
            lp = torch.log_softmax(logits[r, f - 1 : n - 1].float(), dim=-1)  # (cont, V)
            target = torch.tensor(rows[i][f:])
            out[i] = (float(lp.gather(-1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all()))
    return out


def torch_logits(model: torch.nn.Module, device: torch.device) -> LogitsFn:
    """``logits_fn`` of prodip's training model (``model(ids) -> (B, T, V)``), under ``torch.no_grad``."""

    def fn(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(ids.to(device)).float().cpu()

    return fn


# ---- running tasks ---------------------------------------------------------------------------------


def local_tasks(task_paths: Sequence[str | Path] = ()) -> list[str]:
    """Names of the tasks in the bundled folder and ``task_paths`` (no harness defaults)."""
    return sorted(_task_manager(task_paths, defaults=False).all_tasks)


def _task_manager(task_paths: Sequence[str | Path], defaults: bool) -> Any:
    _require_lm_eval()
    from lm_eval.tasks import TaskManager  # noqa: PLC0415

    for p in task_paths:
        if not Path(p).is_dir():
            raise MissingInput(f"{p}: task folder not found (lm-eval task YAML files)")
    paths = [str(TASKS_DIR), *(str(p) for p in task_paths)]
    return TaskManager(include_path=paths, include_defaults=defaults)


def task_manager(names: Sequence[str], task_paths: Sequence[str | Path] = ()) -> Any:
    """A ``TaskManager`` that knows every name: the bundled and given folders alone when they hold them all
    (fast: the harness's thousands of YAML files are not indexed), else with the harness's own tasks.

    Raises:
        InvalidInput: a name no folder and not the harness knows (the local names listed).
    """
    tm = _task_manager(task_paths, defaults=False)
    if not set(names) <= set(tm.all_tasks):
        tm = _task_manager(task_paths, defaults=True)
        unknown = sorted(set(names) - set(tm.all_tasks))
        if unknown:
            raise InvalidInput(
                f"EvalConfig.tasks: unknown task(s) {unknown}; bundled: {', '.join(local_tasks(task_paths))} "
                "(or any lm-evaluation-harness task name; `lm_eval ls tasks`)"
            )
    return tm


def task_language(name: str, config: dict[str, Any] | None) -> str:
    """The language a task's scored text is in: its YAML ``metadata.language``, else its name's last part
    (``belebele_ben_Beng`` -> bn, ``global_mmlu_bn`` -> bn), else ``"?"``."""
    lang = ((config or {}).get("metadata") or {}).get("language")
    if isinstance(lang, str) and lang:
        return lang
    parts = name.split("_")
    if len(parts) >= 2 and parts[-2] in _FLORES and parts[-1][:1].isupper():
        return _FLORES[parts[-2]]
    if len(parts[-1]) == 2 and parts[-1].isalpha() and parts[-1].islower():
        return parts[-1]
    return "?"


def run_tasks(
    lm: Any,
    names: Sequence[str],
    *,
    num_fewshot: Optional[int] = None,
    limit: Optional[int] = None,
    task_paths: Sequence[str | Path] = (),
    tm: Any = None,
    seed: int = 0,
    threads: int = 1,
) -> list[dict[str, Any]]:
    """Run each task on ``lm`` (one harness evaluation per task, timed; see :func:`_evaluate`).

    Args:
        lm: a model from :func:`make_lm` (or any ``lm_eval`` model: then ``chance`` is None).
        names: task or group names.
        num_fewshot: examples in each prompt; None = the task's own setting (0 unless its YAML says).
        limit: the first N items of each task (None = all).
        task_paths: extra folders of task YAML.
        tm: a ``TaskManager`` to reuse (from :func:`task_manager`).
        seed: the harness's random, numpy, torch and few-shot seeds.
        threads: torch's CPU threads while scoring (restored after; 0 = leave torch's setting). One by default:
            the requests are many small forward passes, and on a busy 2-core machine two OpenMP threads waited
            on each other for 5-14x the one-thread time (a hidden-256 model: 1.5 s per 40-item task at 1
            thread, 9-21 s at 2).

    Returns:
        One dict per task: ``{task, language, output_type, shots, items, metric, higher_is_better, chance, scores: {metric:
        {value, stderr}}, seconds}``; ``chance`` is the mean of 1/choices over the items of a multiple-choice
        task (None for other kinds); ``stderr`` is the harness's (the sample standard error for a mean).

    Raises:
        InvalidInput: an unknown task name (see :func:`task_manager`).
    """
    lm_eval = _require_lm_eval()
    tm = tm or task_manager(names, task_paths)
    seen: Counter[tuple[str, int]] = Counter()  # another LM class than make_lm's: no chance level
    if hasattr(lm, "choices_seen"):
        seen = lm.choices_seen
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return [
            _run_one(lm_eval, lm, tm, name, seen, num_fewshot=num_fewshot, limit=limit, seed=seed) for name in names
        ]
    finally:
        torch.set_num_threads(before)


def _run_one(lm_eval: Any, lm: Any, tm: Any, name: str, seen: Counter[tuple[str, int]], **kw: Any) -> dict[str, Any]:
    """One task, timed (see :func:`run_tasks`)."""
    seen.clear()
    t0 = time.perf_counter()
    level = logging.getLogger("lm_eval").level
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    try:
        res = _evaluate(lm_eval, lm, tm, name, **kw)
    finally:
        logging.getLogger("lm_eval").setLevel(level)
    return _task_row(name, res, seen, time.perf_counter() - t0)


def _evaluate(
    lm_eval: Any, lm: Any, tm: Any, name: str, *, num_fewshot: Optional[int], limit: Optional[int], seed: int
) -> dict[str, Any]:
    """``lm_eval.simple_evaluate``'s steps for a model object: seeds, the task loaded, its few-shot count and
    seed set, then the harness's ``evaluate``; without the environment report simple_evaluate appends (which
    lists the installed packages in subprocesses: about 2 s a call)."""
    import random  # noqa: PLC0415

    import numpy as np  # noqa: PLC0415
    from lm_eval.evaluator import evaluate  # noqa: PLC0415

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    loaded = tm.load([name])
    for task in loaded["tasks"].values():
        if num_fewshot is not None and task.get_config("num_fewshot") != 0:
            task.set_config(key="num_fewshot", value=num_fewshot)
        elif task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
        task.set_fewshot_seed(seed=seed)
    res: dict[str, Any] = evaluate(lm=lm, task_dict=loaded, limit=limit, bootstrap_iters=1000, log_samples=False)
    return res


def _task_row(name: str, res: dict[str, Any], seen: Counter[tuple[str, int]], seconds: float) -> dict[str, Any]:
    """One task's figures from the harness's result (a group's aggregate for a group)."""
    entry = (res.get("groups") or {}).get(name) or res["results"][name]
    subtasks = [t for t in res.get("configs", {})]
    configs = [res["configs"][t] for t in subtasks]
    scores: dict[str, dict[str, Any]] = {}
    for key, value in entry.items():
        metric, _, filt = key.partition(",")
        stderr = entry.get(f"{metric}_stderr,{filt}")
        if metric.endswith("_stderr") or f"{metric}_stderr,{filt}" not in entry or not isinstance(value, (int, float)):
            continue  # the name, and counts such as sample_len: not a metric with an error bar
        scores[metric] = {"value": float(value), "stderr": float(stderr) if isinstance(stderr, (int, float)) else None}
    shots = sorted({int(res.get("n-shot", {}).get(t, 0)) for t in subtasks}) or [0]
    items = sum(int((res.get("n-samples", {}).get(t) or {}).get("effective", 0)) for t in subtasks)
    kinds = {c.get("output_type") for c in configs}
    chance = None
    if kinds == {"multiple_choice"} and seen:
        chance = sum(1 / n for n in seen.values()) / len(seen)
    metric = next((m for m in PRIMARY_METRICS if m in scores), next(iter(scores), ""))
    better = (res.get("higher_is_better") or {}).get(name, {}).get(metric, True)
    return {
        "task": name,
        "language": task_language(name, configs[0] if len(configs) == 1 else None),
        "output_type": kinds.pop() if len(kinds) == 1 else "mixed",
        "shots": shots[0] if len(shots) == 1 else max(shots),
        "items": items,
        "metric": metric,
        "higher_is_better": better is not False,
        "chance": chance,
        "scores": scores,
        "seconds": round(seconds, 3),
    }


# ---- the figures of several models side by side --------------------------------------------------


def task_settings(
    names: Sequence[str], *, num_fewshot: Optional[int], limit: Optional[int], task_paths: Sequence[str], seed: int
) -> dict[str, Any]:
    """What decides a task figure besides the model: the record's ``settings`` (compared to know whether
    recorded figures are current)."""
    return {
        "names": list(names),
        "num_fewshot": num_fewshot,
        "limit": limit,
        "task_paths": [str(p) for p in task_paths],
        "seed": seed,
        "lm_eval_version": _lm_eval_version(),
    }


def _lm_eval_version() -> str | None:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("lm_eval")
    except Exception:  # not installed: the settings say so
        return None


def side_by_side(per_model: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Rows of :func:`run_tasks` for several models (same tasks, same order) as one row per task:
    ``{task, language, output_type, shots, items, metric, higher_is_better, chance, scores: {model: {metric:
    {value, stderr}}}, seconds: {model: s}}``.

    Raises:
        InvalidInput: the models' rows name different tasks or items (not the same evaluation).
    """
    models = list(per_model)
    if not models:
        return []
    first = per_model[models[0]]
    out = []
    for i, row in enumerate(first):
        keys = ("task", "language", "output_type", "shots", "items", "metric", "higher_is_better", "chance")
        merged = {k: row[k] for k in keys}
        merged["scores"], merged["seconds"] = {}, {}
        for m in models:
            other = per_model[m][i]
            if (other["task"], other["items"], other["shots"]) != (row["task"], row["items"], row["shots"]):
                raise InvalidInput(
                    f"task figures of {m!r} ({other['task']}, {other['items']} items, {other['shots']} shots) do not "
                    f"match {models[0]!r}'s ({row['task']}, {row['items']} items, {row['shots']} shots)"
                )
            merged["scores"][m] = other["scores"]
            merged["seconds"][m] = other["seconds"]
        out.append(merged)
    return out
