"""The record each stage gives the pipeline driver: what it reads, what it writes, when it is done,
how to run it.

A stage package (``prodip.tokenizer``, ``prodip.train``, ...) lists its stages in its ``stage``
module as :class:`Stage` records; ``prodip run`` (:mod:`prodip.pipeline`) chains them. The
done-check lives beside the code that writes the artifact, so the rule "this artifact is complete
and made from the current upstream artifact" has one owner. (torchtitan's train-spec registry is
the model, kept simpler: a plain tuple per package, no global registration side effects.)

A ``plan`` is the resolved configuration of one run: config table name (``tokenizer``, ``audit``,
``data``, ``model``, ``train``, ``eval``, ``export``, ``conformance``, ``serve``) -> that
table's config dataclass instance.

    python -c "from prodip.base.stage import Stage; help(Stage)"
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

Plan = dict[str, Any]
log = logging.getLogger("prodip.run")


@dataclass(frozen=True)
class Stage:
    """One pipeline stage.

    Attributes:
        name: the stage's name in ``stages = [...]`` and ``--stages``.
        tables: config tables this stage owns -> ``"module:ConfigClass"`` (imported by the driver).
        reads: artifact names (keys of :func:`prodip.base.layout.paths`) the stage reads.
        writes: the artifact name it writes (``""`` for none: serve only answers HTTP).
        needs: the stage whose artifact must be complete before this one runs (``None`` for the first).
        describe: ``plan -> str``, one line for the progress log.
        done: ``plan -> bool``: the artifact is complete, passed its gate, and was made from the
            current upstream artifacts: the hashes of what it read, recorded in the artifact when it was
            made, equal those artifacts' hashes now (:func:`made_from`). Must not raise for a missing or
            damaged artifact (that is "not done").
        run: ``plan -> Any`` (serve takes keyword options too): produce the artifact. Raises
            :class:`prodip.base.errors.UserError` for what the user can fix.
        active: ``plan -> bool``: whether the plan uses this stage at all (an optional stage, such
            as chat fine-tuning without conversations, is left out of the run); default always.
    """

    name: str
    tables: dict[str, str]
    reads: tuple[str, ...]
    writes: str
    needs: str | None
    describe: Callable[[Plan], str]
    done: Callable[[Plan], bool]
    run: Callable[..., Any] = field(repr=False)
    active: Callable[[Plan], bool] = field(default=lambda plan: True, repr=False)


def made_from(artifact: str, recorded: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether an artifact was made from the current upstream artifacts: each input's hash the artifact
    recorded when it was made equals that input's hash now.

    The one rule every stage's ``done`` applies to what it read (a shards dir's tokenizer, a checkpoint's
    shards and tokenizer, an export's checkpoint, a conformance report's export files). An input the
    artifact did not record (written by an older prodip) is not held against it.

    Args:
        artifact: the artifact's path, for the log line.
        recorded: input name -> the hash the artifact recorded (None: not recorded).
        current: input name -> the input's hash now (None: the input is missing or unreadable).
    Returns:
        True when every recorded input matches; else False, after logging which input changed.
    """
    for name, now in current.items():
        then = recorded.get(name)
        if then is not None and then != now:
            log.warning(
                "%s was made from another %s (sha256 %s, now %s): not complete; making it again",
                artifact,
                name,
                str(then)[:12],
                str(now)[:12] if now else "missing",
            )
            return False
    return True
