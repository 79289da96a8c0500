"""How a runtime's greedy ids are judged against the reference's: identical, or parted only at a near tie.

The rule of a row and variant is the row's ``greedy_margins`` (``prodip.base.runtimes.Runtime.greedy_margin``):
None — the ids must be identical; a margin (logits) — they may part at the first step where the reference's
logit of its own pick exceeds its logit of the runtime's pick by at most the margin (a near tie two kernels
may break either way when they sum the same products in another order), and need not agree after it (the
two then continue from different text).

    python -c "from prodip.conformance.runtimes.agreement import margin_agrees; help(margin_agrees)"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import numpy as np


def margin_agrees(
    want: Sequence[int], got: Sequence[int], step_logits: Sequence[np.ndarray], prompt_len: int, margin: float
) -> tuple[bool, str]:
    """Greedy ids that may part where the reference was nearly tied: equal up to the first difference,
    and there the reference's logit of its own pick exceeds its logit of ``got``'s pick by at most ``margin``.

    Args:
        want: the reference's ids (prompt + new); got: the candidate's; step_logits: the reference's
            logits (vocab,) at each new step; prompt_len: tokens of the prompt; margin: logits.
    Returns:
        (agrees, a one-line account naming the step and the gap).
    """
    if list(want[:prompt_len]) != list(got[:prompt_len]):
        return False, "the prompt ids differ"
    for step, (a, b) in enumerate(zip(want[prompt_len:], got[prompt_len:])):
        if a != b:
            if step >= len(step_logits) or not 0 <= b < len(step_logits[step]):
                return False, f"parted at new token {step}: reference {a} vs {b}, no reference logit for it"
            gap = float(step_logits[step][a] - step_logits[step][b])
            return gap <= margin, f"parted at new token {step}: reference {a} vs {b}, gap {gap:.4g} (margin {margin})"
    same = len(want) == len(got)
    return same, "same ids" if same else f"lengths differ: {len(want)} vs {len(got)}"


def greedy_agrees(
    want: Sequence[Sequence[int]],
    got: Optional[Sequence[Sequence[int]]],
    step_logits: Sequence[Sequence[np.ndarray]],
    prompt_lens: Sequence[int],
    margin: Optional[float],
) -> tuple[bool, str]:
    """One runtime's greedy ids on every prompt judged by one rule (``margin`` None: identical).

    Args:
        want: the reference's ids per prompt (prompt + new); got: the runtime's (None: it failed).
        step_logits: the reference's logits at each new step, per prompt (used only with a margin).
        prompt_lens: tokens of each prompt.
        margin: the row's margin for this variant (logits), or None.
    Returns:
        (agrees, an account: ``"identical"``, or per prompt where and by how much the ids parted).
    """
    if got is None:
        return False, "no ids"
    if [list(g) for g in got] == [list(w) for w in want]:
        return True, "identical"
    if margin is None or len(got) != len(want):
        return False, "ids differ"
    verdicts = [margin_agrees(w, g, s, n, margin) for w, g, s, n in zip(want, got, step_logits, prompt_lens)]
    return all(ok for ok, _ in verdicts), "; ".join(f"prompt {i}: {why}" for i, (_, why) in enumerate(verdicts))


def runtime_passed(res: dict[str, Any]) -> bool:
    """A report's runtime record (``prodip.conformance.runtimes.RuntimeResult.to_dict``) met its row's rule:
    ``agrees`` where the variant is judged by a margin, else ``ids_identical``."""
    return bool(res.get("agrees", res.get("ids_identical")))
