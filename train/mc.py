"""Multiple-choice accuracy by per-choice log-likelihood, as lm-evaluation-harness's ``acc``: the
choice whose continuation tokens have the highest summed log-probability wins.

    python -c "from prodip.train.mc import encode_choice; help(encode_choice)"
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypedDict

import torch
from torch import nn

from prodip.base.errors import InvalidInput, MissingInput
from prodip.train.lmeval import continuation_scores, torch_logits


class MCItem(TypedDict):
    """One multiple-choice item: the context, its choices (>= 2) and the index of the right one."""

    context: str
    choices: list[str]
    answer: int


class MCScore(TypedDict):
    """:func:`score_mc`'s figures (accuracies and chance level are shares of the items)."""

    n_items: int
    acc: float
    acc_norm: float
    chance: float


def read_mc(path: str | Path) -> list[MCItem]:
    """Read a multiple-choice JSONL file: one ``{"context": str, "choices": [str, ...], "answer": int}``
    per line (blank lines skipped; other keys ignored). HellaSwag's ``{ctx, endings, label}`` lines
    are accepted too (each ending prefixed with a space, as lm-evaluation-harness does).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not JSON or lacks/mistypes a field, naming ``path:line``.
    """
    path = Path(path)
    if not path.is_file():
        raise MissingInput(f"{path}: multiple-choice file not found (JSONL of {{context, choices, answer}})")
    items: list[MCItem] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidInput(f"{where}: not valid JSON ({err})") from None
        if isinstance(item, dict) and "context" not in item and {"ctx", "endings", "label"} <= item.keys():
            # HellaSwag's own layout (data/eval/hellaswag_val_en.jsonl): endings follow a space
            item = {"context": item["ctx"], "choices": [" " + str(e) for e in item["endings"]], "answer": item["label"]}
        if not isinstance(item, dict) or not isinstance(item.get("context"), str):
            raise InvalidInput(f"{where}: expected an object with a string 'context'")
        choices = item.get("choices")
        if not (isinstance(choices, list) and len(choices) >= 2 and all(isinstance(c, str) and c for c in choices)):
            raise InvalidInput(f"{where}: 'choices' must be a list of >= 2 non-empty strings")
        answer = item.get("answer")
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
            raise InvalidInput(
                f"{where}: 'answer' must be an index into choices (0..{len(choices) - 1}), got {answer!r}"
            )
        items.append({"context": item["context"], "choices": choices, "answer": answer})
    if not items:
        raise InvalidInput(f"{path}: no multiple-choice items")
    return items


def encode_choice(tokenizer: Any, context: str, choice: str, prefix_id: int) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) for one choice, lm-evaluation-harness style.

    ``context + choice`` is encoded as a whole and the continuation is what follows the
    context's own encoding (BPE merges at the boundary stay as in training); if the whole does
    not start with the context's tokens, the choice is encoded on its own. ``prefix_id`` (the
    ``<|bos|>`` that starts every document in the shards) starts the context, as lm-evaluation-harness
    puts its prefix token (the tokenizer's BOS) in front.
    """
    ctx = tokenizer.encode(context, add_special_tokens=False).ids
    whole = tokenizer.encode(context + choice, add_special_tokens=False).ids
    if whole[: len(ctx)] == ctx and len(whole) > len(ctx):
        return [prefix_id] + ctx, whole[len(ctx) :]
    return [prefix_id] + ctx, tokenizer.encode(choice, add_special_tokens=False).ids


def continuation_logprobs(
    model: nn.Module,
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    device: torch.device,
    max_len: int,
    batch_size: int = 8,
) -> list[float]:
    """Summed log-probability (nats) of each continuation given its context: the task runner's scorer
    (:func:`prodip.train.lmeval.continuation_scores`, right-padded batches, longest first) on ``model``.

    Args:
        model: causal LM ``(B, T) int64 -> (B, T, V)``.
        pairs: ``(context_ids, continuation_ids)``; the context must be non-empty. Rows longer than
            ``max_len + 1`` tokens keep their last ``max_len + 1``.
        max_len: the model's longest input (tokens), ``max_position_embeddings``.

    Returns:
        One float per pair: ``sum_t log p(cont_t | context, cont_<t)``.

    Raises:
        InvalidInput: an empty context or continuation, or a continuation longer than ``max_len``.
    """
    scores = continuation_scores(torch_logits(model, device), pairs, max_length=max_len, batch_size=batch_size)
    return [s for s, _ in scores]


def score_mc(
    model: nn.Module,
    tokenizer: Any,
    items: Sequence[MCItem],
    device: torch.device,
    max_len: int,
    prefix_id: int,
    batch_size: int = 8,
) -> MCScore:
    """Accuracy of log-likelihood multiple-choice scoring.

    Returns:
        ``{"n_items", "acc", "acc_norm", "chance"}``: ``acc`` picks the choice with the highest
        summed log-probability; ``acc_norm`` divides it by the choice's Unicode characters (NFC);
        ``chance`` is the mean of 1/len(choices). Ties go to the lowest index.
    """

    pairs = [
        encode_choice(tokenizer, item["context"], choice, prefix_id) for item in items for choice in item["choices"]
    ]
    scores = continuation_logprobs(model, pairs, device, max_len, batch_size)
    hits = hits_norm = 0
    k = 0
    for item in items:
        n = len(item["choices"])
        ll = scores[k : k + n]
        k += n
        chars = [len(unicodedata.normalize("NFC", c)) for c in item["choices"]]
        hits += int(max(range(n), key=lambda j: (ll[j], -j)) == item["answer"])
        hits_norm += int(max(range(n), key=lambda j: (ll[j] / chars[j], -j)) == item["answer"])
    n_items = len(items)
    return {
        "n_items": n_items,
        "acc": hits / n_items,
        "acc_norm": hits_norm / n_items,
        "chance": sum(1 / len(it["choices"]) for it in items) / n_items,
    }
