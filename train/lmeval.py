"""lm-evaluation-harness tasks on a prodip model: an ``lm_eval`` model class over any batched logits function
(and, for generation, any decoder step with a KV cache), and :func:`run_tasks`, which runs named tasks through
the harness's ``evaluate`` and returns one typed row per task with the harness's standard errors.

The model class scores loglikelihood requests the way the harness's ``hf`` model does on an export
(``TemplateLM``: context and continuation encoded as a whole and split after the context's tokens, trailing
context spaces moved to the continuation, the tokenizer's default encode putting ``<|bos|>`` in front, as it
starts every training document), in batches of right-padded rows (causal attention never looks ahead, so the
padding cannot change a real row's logits), longest first. The same class runs over the training model here
and over each ONNX variant in conformance (``prodip.conformance.tasks``), so their figures differ only by
what the variant computes.

Generation tasks (``output_type: generate_until``) are chat tasks: the harness renders each prompt as a user
turn through the model's own chat template (:class:`ChatFormat`, the ``chat_template`` of its
``tokenizer_config.json``, rendered by :func:`prodip.base.chat.render` as every runtime renders it), and the
reply is decoded greedily in left-padded batches with the KV cache (:func:`greedy_until`) until the end-of-turn
token, the end-of-text token, one of the task's ``until`` strings or ``max_gen_toks``. They run only on a chat
model (a tokenizer with a chat template); :func:`run_tasks` leaves them out for another (logged).

Tasks are found in the bundled folder ``TASKS_DIR`` (offline, data shipped beside the YAML: see its README.md)
and the folders given, then, for a name not found there, in lm-evaluation-harness's own task list (Belebele,
Global-MMLU-Lite, ...: those download their data from the Hugging Face Hub; docs/eval.md).

    python -c "from prodip.train.lmeval import local_tasks; print(local_tasks())"
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, TypedDict

import numpy as np
import torch

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.jsontypes import JSONObject

log = logging.getLogger(__name__)

#: the bundled offline tasks (YAML, their data and loader; README.md there names sources and licences)
TASKS_DIR = Path(__file__).with_name("tasks")
#: the metric the card shows for a task, in order of preference
PRIMARY_METRICS = ("acc", "acc_norm", "sentence_chrf", "chrf", "exact_match", "f1", "bleu")
#: Flores-200 language codes in harness task names (belebele_ben_Beng) -> the ISO 639-1 codes prodip uses
_FLORES = {"ben": "bn", "eng": "en", "hin": "hi", "urd": "ur", "asm": "as"}

#: (B, T) int64 token ids, right-padded -> (B, T, V) float logits
LogitsFn = Callable[[torch.Tensor], torch.Tensor]
#: one decoder call with a KV cache, the conformance runners' contract (``prodip.conformance.runners.Runner``):
#: (input_ids (B, T) int64, attention_mask (B, P+T) int64 with 0 for left padding, position_ids (B, T) int64,
#: state: the previous call's cache or None for P = 0) -> (logits (B, T, V) float32, state)
StepFn = Callable[[np.ndarray, np.ndarray, np.ndarray, Any], tuple[np.ndarray, Any]]


@dataclass(frozen=True)
class ChatFormat:
    """How a chat model's prompts are written and where its reply ends: its chat template (verbatim from its
    ``tokenizer_config.json``), the special-token strings the template may read, and the end-of-turn token."""

    template: str
    end_of_turn_id: int
    variables: dict[str, str] = field(default_factory=dict)

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (:func:`prodip.base.chat.render`; tokenise it without specials)."""
        from prodip.base.chat import render  # noqa: PLC0415

        return render(messages, add_generation_prompt, template=self.template, variables=self.variables)


def chat_format(tokenizer_dir: str | Path) -> Optional[ChatFormat]:
    """The :class:`ChatFormat` of a tokenizer dir (a checkpoint's ``tokenizer/``, an export dir), or None for a
    base model's (no ``chat_template``).

    Raises:
        InvalidInput / MissingInput: a broken chat contract (:func:`prodip.base.chat.chat_contract`).
    """
    from prodip.base.chat import chat_contract, template_variables  # noqa: PLC0415

    contract = chat_contract(tokenizer_dir)
    if contract is None:
        return None
    return ChatFormat(contract["chat_template"], int(contract["end_of_turn_id"]), template_variables(tokenizer_dir))


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
    tokenizer: Any,
    logits_fn: LogitsFn,
    *,
    bos_id: int,
    eos_id: int,
    max_length: int,
    batch_size: int = 32,
    step_fn: Optional[StepFn] = None,
    chat: Optional[ChatFormat] = None,
) -> Any:
    """An ``lm_eval.api.model.TemplateLM`` scoring loglikelihood requests with ``logits_fn`` and, for a chat
    model, answering generation requests greedily with ``step_fn`` through its chat template.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` whose default encode prepends ``<|bos|>``.
        logits_fn: ``(B, T) int64 -> (B, T, V)`` logits (any float dtype; scored in float32).
        bos_id: the token an empty context becomes (lm-eval's ``prefix_token_id``).
        eos_id: the end-of-text token (``eot_token_id``); it ends a generated reply too.
        max_length: the model's longest input (tokens); longer rows keep their last ``max_length + 1`` tokens.
        batch_size: rows per call of ``logits_fn`` and of ``step_fn``.
        step_fn: the model's decoder step with a KV cache (:data:`StepFn`); None: no generation.
        chat: the model's chat format (:func:`chat_format`); None: a base model, no generation tasks.

    Returns:
        The model object; ``choices_seen`` counts requests per ``(task, doc_id)`` since the last reset;
        ``chat`` is the chat format (None for a base model).
    """
    base = _template_lm()

    class ProdipLM(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.tokenizer = tokenizer
            self.choices_seen: Counter[tuple[str, int]] = Counter()
            self.chat = chat if step_fn is not None else None

        @property
        def tokenizer_name(self) -> str:
            # the harness keys its request cache on it (prodip keeps no cache): the template names the format
            digest = hashlib.sha256((chat.template if chat else "").encode()).hexdigest()[:12]
            return f"prodip-{digest}"

        def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
            if chat is None:
                raise InvalidInput("this model has no chat template (not a chat model): no chat prompts")
            return chat.render(chat_history, add_generation_prompt)

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
            if chat is None or step_fn is None:
                raise InvalidInput(
                    "a generation task runs through the model's chat template, and this model has none (not a "
                    "chat model); give a chat checkpoint or export"
                )
            prompts, budgets, until = [], [], []
            for req in requests:
                context, kwargs = req.args[0], dict(req.args[1] or {})
                stops = kwargs.get("until") or []
                until.append([stops] if isinstance(stops, str) else list(stops))
                new = int(kwargs.get("max_gen_toks", 256))
                ids = list(tokenizer.encode(context, add_special_tokens=False).ids)  # the template writes <|bos|>
                budgets.append(new)
                prompts.append(ids[-max(1, max_length - new) :])  # as the harness's hf model: room for the reply
            return greedy_until(
                step_fn,
                prompts,
                max_new=budgets,
                stop_ids={chat.end_of_turn_id, eos_id},
                until=until,
                decode=lambda ids: str(tokenizer.decode(list(ids), skip_special_tokens=True)),
                max_length=max_length,
                batch_size=batch_size,
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


def torch_step(model: torch.nn.Module, device: torch.device) -> StepFn:
    """:data:`StepFn` of prodip's training model (its KV cache, ``use_cache=True``), under ``torch.inference_mode``."""

    def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, state: Any) -> tuple[np.ndarray, Any]:
        with torch.inference_mode():
            logits, present = model(
                torch.from_numpy(ids).to(device),
                position_ids=torch.from_numpy(pos).to(device),
                attention_mask=torch.from_numpy(mask).to(device),
                past_key_values=state,
                use_cache=True,
            )
        return logits.float().cpu().numpy(), present

    return step


def step_logits(step: StepFn) -> LogitsFn:
    """``logits_fn`` of a decoder step: right-padded rows in one call with an empty cache (positions 0..T-1,
    every mask 1: causal attention keeps the padding after a row out of its logits)."""

    def fn(ids: torch.Tensor) -> torch.Tensor:
        x = ids.numpy()
        B, T = x.shape
        pos = np.broadcast_to(np.arange(T, dtype=np.int64), (B, T)).copy()
        logits, _ = step(x, np.ones((B, T), dtype=np.int64), pos, None)
        return torch.from_numpy(np.asarray(logits))

    return fn


def greedy_until(
    step: StepFn,
    prompts: Sequence[Sequence[int]],
    *,
    max_new: Sequence[int],
    stop_ids: set[int],
    until: Sequence[Sequence[str]],
    decode: Callable[[Sequence[int]], str],
    max_length: int,
    batch_size: int,
) -> list[str]:
    """Greedy replies: the argmax token at each step, in left-padded batches (longest prompts first) with the
    step's KV cache, each row until it emits a token of ``stop_ids`` (not part of the reply), its decoded reply
    holds one of its ``until`` strings (cut before the first), or it has ``max_new`` tokens (or reaches
    ``max_length`` positions). A batch stops when every row has; finished rows are fed their last token
    meanwhile (their replies are complete: what follows is discarded).

    Args:
        step: the decoder (:data:`StepFn`).
        prompts: token ids of each prompt (non-empty, at most ``max_length - 1`` tokens).
        max_new: the most tokens of each reply.
        stop_ids: tokens that end a reply (the end-of-turn and end-of-text tokens).
        until: per prompt, strings that end its reply (the harness's ``until``).
        decode: token ids -> text (special tokens skipped).

    Returns:
        The reply text of each prompt, in the prompts' order.

    Raises:
        InvalidInput: an empty prompt, or one of ``max_length`` tokens or more (no room for a reply).
    """
    for i, p in enumerate(prompts):
        if not 0 < len(p) < max_length:
            raise InvalidInput(f"generation request {i}: {len(p)} prompt tokens (want 1..{max_length - 1})")
    order = sorted(range(len(prompts)), key=lambda i: (-len(prompts[i]), i))
    out = [""] * len(prompts)
    for b in range(0, len(order), batch_size):
        group = order[b : b + batch_size]
        T = len(prompts[group[0]])
        ids = np.zeros((len(group), T), dtype=np.int64)
        mask = np.zeros((len(group), T), dtype=np.int64)
        for r, i in enumerate(group):  # left padding: every row's last token at T-1
            ids[r, T - len(prompts[i]) :] = prompts[i]
            mask[r, T - len(prompts[i]) :] = 1
        pos = np.clip(mask.cumsum(-1) - 1, 0, None)
        budget = [min(max_new[i], max_length - len(prompts[i])) for i in group]
        replies: list[list[int]] = [[] for _ in group]
        texts = [""] * len(group)
        done = [n <= 0 for n in budget]
        logits, state = step(ids, mask, pos, None)
        while True:
            nxt = np.asarray(logits)[:, -1].argmax(-1).astype(np.int64)
            for r, i in enumerate(group):
                if done[r]:
                    continue
                token = int(nxt[r])
                if token in stop_ids:
                    done[r] = True
                    continue
                replies[r].append(token)
                texts[r] = decode(replies[r])
                if any(u and u in texts[r] for u in until[i]) or len(replies[r]) >= budget[r]:
                    done[r] = True
            if all(done):
                break
            mask = np.concatenate([mask, np.ones((len(group), 1), dtype=np.int64)], axis=1)
            pos = mask.sum(-1, keepdims=True) - 1
            logits, state = step(nxt[:, None], mask, pos, state)
        for r, i in enumerate(group):
            text = texts[r]
            for u in until[i]:
                if u:
                    text = text.split(u)[0]
            out[i] = text
    return out


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


class Score(TypedDict):
    """One metric of a task: the harness's value and standard error (None when it gives none)."""

    value: float
    stderr: Optional[float]


class TaskResult(TypedDict):
    """One task's figures on one model (:func:`run_tasks`)."""

    task: str
    language: str
    output_type: str
    shots: int
    items: int
    #: the primary metric (:data:`PRIMARY_METRICS`, else the first scored)
    metric: str
    higher_is_better: bool
    #: mean of 1/choices over the items of a multiple-choice task (None for other kinds)
    chance: Optional[float]
    #: metric -> score
    scores: dict[str, Score]
    seconds: float


class TaskRow(TypedDict):
    """One task's figures on several models side by side (:func:`side_by_side`)."""

    task: str
    language: str
    output_type: str
    shots: int
    items: int
    metric: str
    higher_is_better: bool
    chance: Optional[float]
    #: model -> metric -> score
    scores: dict[str, dict[str, Score]]
    #: model -> seconds
    seconds: dict[str, float]


def task_language(name: str, config: Mapping[str, object] | None) -> str:
    """The language a task's scored text is in: its YAML ``metadata.language``, else its name's last part
    (``belebele_ben_Beng`` -> bn, ``global_mmlu_bn`` -> bn), else ``"?"``."""
    metadata = (config or {}).get("metadata")
    lang = metadata.get("language") if isinstance(metadata, dict) else None
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
) -> list[TaskResult]:
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
        One dict per task run: ``{task, language, output_type, shots, items, metric, higher_is_better, chance,
        scores: {metric: {value, stderr}}, seconds}``; ``chance`` is the mean of 1/choices over the items of a
        multiple-choice task (None for other kinds); ``stderr`` is the harness's (the sample standard error for a
        mean; a bootstrap over the items for a corpus metric such as ``chrf``). A generation task on a model
        without a chat template (``lm.chat`` None) is left out (logged): chat tasks run on chat models only.

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
        rows = [
            _run_one(lm_eval, lm, tm, name, seen, num_fewshot=num_fewshot, limit=limit, seed=seed) for name in names
        ]
    finally:
        torch.set_num_threads(before)
    return [r for r in rows if r is not None]


def _run_one(
    lm_eval: Any, lm: Any, tm: Any, name: str, seen: Counter[tuple[str, int]], **kw: Any
) -> Optional[TaskResult]:
    """One task, timed (see :func:`run_tasks`); None: a chat task and not a chat model."""
    seen.clear()
    t0 = time.perf_counter()
    level = logging.getLogger("lm_eval").level
    logging.getLogger("lm_eval").setLevel(logging.ERROR)
    try:
        res = _evaluate(lm_eval, lm, tm, name, **kw)
    finally:
        logging.getLogger("lm_eval").setLevel(level)
    if res is None:
        log.info("task %s: a generation task runs through a chat template, and this model has none; left out", name)
        return None
    return _task_row(name, res, seen, time.perf_counter() - t0)


def _evaluate(
    lm_eval: Any, lm: Any, tm: Any, name: str, *, num_fewshot: Optional[int], limit: Optional[int], seed: int
) -> Optional[dict[str, Any]]:
    """``lm_eval.simple_evaluate``'s steps for a model object: seeds, the task loaded, its few-shot count and
    seed set, then the harness's ``evaluate``; without the environment report simple_evaluate appends (which
    lists the installed packages in subprocesses: about 2 s a call).

    A task (or group) with a generation subtask is a chat task: its prompts go through ``lm``'s chat template
    (the harness's ``apply_chat_template``, few-shot examples as earlier turns); None when ``lm`` has none.
    The bootstrap of a corpus metric's standard error runs in this process (``DISABLE_MULTIPROC``: no pool of
    processes for 100 resamples; its seeds are fixed), its printed line silenced."""
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
    chat = any(t.OUTPUT_TYPE == "generate_until" for t in loaded["tasks"].values())
    if chat and getattr(lm, "chat", "its own") is None:
        return None
    quiet = {"DISABLE_MULTIPROC": "1"}
    saved = {k: os.environ.get(k) for k in quiet}
    os.environ.update(quiet)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the harness prints "bootstrapping for stddev: chrf"
            res: dict[str, Any] = evaluate(
                lm=lm,
                task_dict=loaded,
                limit=limit,
                bootstrap_iters=1000,
                log_samples=False,
                apply_chat_template=chat,
                fewshot_as_multiturn=chat,
            )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return res


def _task_row(name: str, res: dict[str, Any], seen: Counter[tuple[str, int]], seconds: float) -> TaskResult:
    """One task's figures from the harness's result (a group's aggregate for a group)."""
    entry = (res.get("groups") or {}).get(name) or res["results"][name]
    subtasks = [t for t in res.get("configs", {})]
    configs = [res["configs"][t] for t in subtasks]
    scores: dict[str, Score] = {}
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
) -> JSONObject:
    """What decides a task figure besides the model: the record's ``settings`` (compared to know whether
    recorded figures are current)."""
    return {
        "names": [*names],
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


def side_by_side(per_model: Mapping[str, Sequence[TaskResult]]) -> list[TaskRow]:
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
    out: list[TaskRow] = []
    for i, row in enumerate(first):
        merged: TaskRow = {
            "task": row["task"],
            "language": row["language"],
            "output_type": row["output_type"],
            "shots": row["shots"],
            "items": row["items"],
            "metric": row["metric"],
            "higher_is_better": row["higher_is_better"],
            "chance": row["chance"],
            "scores": {},
            "seconds": {},
        }
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
