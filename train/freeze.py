"""Train only the embedding rows a vocabulary extension added, the rest of the model frozen.

A base model extended by ``prodip tokenizer extend`` has new rows in ``embed_tokens`` (and ``lm_head``) that
start as the mean of their pieces' rows. Continued pretraining that updates the whole model from step 1 pushes
the base's weights around while the new rows are still poor. ``[train] new_embeddings_first_steps = N`` trains
only the new rows for the first N optimizer steps. The same optimizer and schedule then train everything.

How: a gradient hook on every parameter zeroes the gradient of each frozen parameter, and of the base rows
(ids below ``first_new_id``) of the embedding and ``lm_head``. Weight decay is set to 0 meanwhile, since
AdamW's decoupled decay would move a weight whose gradient is zero. With zero gradients Adam's moments stay
zero, so a frozen weight gets no update at all. After step N its first updates are damped while Adam's
moments fill, which acts like a warmup. The autograd graph is unchanged, so ``torch.compile`` and DDP see
the same model in both phases. FSDP (sharded rows) is refused.

    python -c "from prodip.train.freeze import read_first_new_id; print(read_first_new_id.__doc__)"
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from prodip.base.errors import InvalidInput, MissingInput
from prodip.train.model import LlamaForCausalLM

#: The record ``prodip tokenizer extend`` writes into the extended folder (tokenizer/extend.py RECORD_FILE).
EXTENSION_FILE = "extension.json"


def read_first_new_id(init_from: str | Path) -> int:
    """The first id the extension added, read from ``INIT_FROM/extension.json``.

    Raises:
        MissingInput: no extension.json (``init_from`` was not made by ``prodip tokenizer extend``).
        InvalidInput: the record has no integer ``first_new_id``.
    """
    path = Path(init_from) / EXTENSION_FILE
    if not path.is_file():
        raise MissingInput(
            f"{path}: not found; [train] new_embeddings_first_steps needs --init-from a folder made by "
            "`prodip tokenizer extend` (it records which embedding rows are new)"
        )
    try:
        first = json.loads(path.read_text(encoding="utf-8"))["first_new_id"]
    except (json.JSONDecodeError, KeyError, TypeError):
        first = None
    if not isinstance(first, int) or isinstance(first, bool) or first < 1:
        raise InvalidInput(f"{path}: first_new_id missing or not a positive integer")
    return first


class NewRowsOnly:
    """Hooks that leave gradient only on the rows ``first_new_id ..`` of the embedding and ``lm_head``.

    Args:
        model: the (unwrapped) prodip ``LlamaForCausalLM``.
        optimizer: its AdamW; every group's ``weight_decay`` is 0 while the hooks are installed.
        first_new_id: the first row that trains.

    Raises:
        InvalidInput: ``first_new_id`` is not inside the embedding.
    """

    def __init__(self, model: LlamaForCausalLM, optimizer: torch.optim.Optimizer, first_new_id: int) -> None:
        self.model, self.optimizer, self.first = model, optimizer, first_new_id
        rows = model.model.embed_tokens.weight.shape[0]
        if not 0 < first_new_id < rows:
            raise InvalidInput(f"first_new_id {first_new_id} is not a row of the {rows}-row embedding")
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        # the configured decay, read before a resume loads a phase-1 optimizer state (whose decay is 0)
        self.decay = [g["weight_decay"] for g in optimizer.param_groups]

    @property
    def active(self) -> bool:
        return bool(self.handles)

    def install(self) -> None:
        """Freeze (hooks on, weight decay off); a second call does nothing."""
        if self.active:
            return
        rows = {id(self.model.model.embed_tokens.weight), id(self.model.lm_head.weight)}
        first = self.first

        def base_rows_zero(grad: torch.Tensor) -> torch.Tensor:
            grad = grad.clone()
            grad[:first] = 0
            return grad

        seen: set[int] = set()
        for p in self.model.parameters():
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            self.handles.append(p.register_hook(base_rows_zero if id(p) in rows else torch.zeros_like))
        for g in self.optimizer.param_groups:
            g["weight_decay"] = 0.0

    def remove(self) -> None:
        """Unfreeze: hooks off, the configured weight decay back (also after resuming a phase-1 state)."""
        for h in self.handles:
            h.remove()
        self.handles = []
        for g, wd in zip(self.optimizer.param_groups, self.decay):
            g["weight_decay"] = wd
