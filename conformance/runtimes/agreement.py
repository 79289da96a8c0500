"""How a runtime's greedy ids are judged against the reference's, by the one greedy agreement rule
(:func:`prodip.conformance.compare.greedy_agreement`): they may part only at the first step where the
reference's logit of its own pick exceeds its logit of the runtime's pick by at most a tie margin (a near tie
two kernels may break either way when they sum the same products in another order), and need not agree after
it (the two then continue from different text).

The margin of a row and variant is the row's ``greedy_margins`` entry
(``prodip.base.runtimes.Runtime.greedy_margin``) where it names the variant, else none (identical ids).

    python -c "from prodip.conformance.runtimes.agreement import greedy_agrees; help(greedy_agrees)"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np

from prodip.conformance.compare import greedy_agreement


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
    if len(got) != len(want):
        return False, f"{len(got)} sequences for {len(want)} prompts"
    if margin is None:
        return False, "ids differ"
    verdicts = [greedy_agreement(w, g, s, margin, n) for w, g, s, n in zip(want, got, step_logits, prompt_lens)]
    return all(v.agreed for v in verdicts), "; ".join(f"prompt {i}: {v.reason}" for i, v in enumerate(verdicts))


def runtime_passed(res: Mapping[str, object]) -> bool:
    """A report's runtime record (``prodip.conformance.runtimes.RuntimeResult.to_dict``) met its row's rule:
    ``agrees`` where the variant is judged by a margin, else ``ids_identical``."""
    return bool(res.get("agrees", res.get("ids_identical")))
