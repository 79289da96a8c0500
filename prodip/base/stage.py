"""The record each stage gives the pipeline driver: what it reads, what it writes, when it is done,
how to run it.

A stage package (``prodip.tokenizer``, ``prodip.train``, ...) lists its stages in its ``stage``
module as :class:`Stage` records; ``prodip run`` (:mod:`prodip.pipeline`) chains them. The
done-check lives beside the code that writes the artifact, so the rule "this artifact is complete
and made from the current upstream artifact" has one owner. (torchtitan's train-spec registry is
the model, kept simpler: a plain tuple per package, no global registration side effects.)

A stage declares the config tables it owns and their config classes (``tables``); the driver builds
one typed run plan from every stage's tables (``prodip.plan.RunPlan``, one attribute per table) and
hands each stage only its own config: the one table's config, or the part that holds its tables
(``config``), and, to ``run``, the run's :class:`RunContext`.

    python -c "from prodip.base.stage import Stage; help(Stage)"
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import Field, StrictBool, StrictInt

from prodip.base.records import Number, Record, RecordPart

log = logging.getLogger("prodip.run")
STAGE_TIMES_FILE = "stage_times.json"
_T = TypeVar("_T", bound="StageTimes")
#: what a stage's functions receive: its table's config class, or the part holding its tables
C = TypeVar("C")


@dataclass(frozen=True)
class CompletionRequests:
    """What the serve stage asks the server for at the end of a run (the pipeline file's top-level
    ``completion_*``, ``chat_prompts`` and ``serve_timeout_s`` keys)."""

    #: language -> prompt sent to ``/v1/completions``
    prompts: dict[str, str]
    #: language -> user message sent to ``/v1/chat/completions`` (empty: none)
    chat_prompts: dict[str, str]
    #: new tokens per completion and chat reply (tokens)
    max_tokens: int
    #: OpenAI sampling parameters of those requests: ``temperature``, ``top_p``, ``frequency_penalty``, ``seed``
    sampling: dict[str, float | int]
    #: how long to wait for the server to come up (seconds)
    timeout_s: float


@dataclass(frozen=True)
class RunContext:
    """What a stage's ``run`` receives besides its own config: the run's folder and its top-level settings."""

    #: the run's folder (``out_dir`` of the pipeline file): ``completions.json``, ``serve.log``
    out_dir: Path
    requests: CompletionRequests


def _own(cfg: Any) -> Any:
    """A one-table stage's config is that table's config itself."""
    return cfg


def _always(cfg: Any) -> bool:
    return True


@dataclass(frozen=True)
class Stage(Generic[C]):
    """One pipeline stage.

    Attributes:
        name: the stage's name in ``stages = [...]`` and ``--stages``.
        tables: config tables this stage owns -> their config classes, in pipeline order (the driver
            reads each ``[table]`` of the pipeline file into its class).
        reads: artifact names (keys of :func:`prodip.base.layout.paths`) the stage reads.
        writes: the artifact name it writes (``""`` for none: serve only answers HTTP).
        needs: the stage whose artifact must be complete before this one runs (``None`` for the first).
        describe: ``config -> str``, one line for the progress log.
        done: ``config -> bool``: the artifact is complete, passed its gate, and was made from the
            current upstream artifacts: the hashes of what it read, recorded in the artifact when it was
            made, equal those artifacts' hashes now (:func:`made_from`). Must not raise for a missing or
            damaged artifact (that is "not done").
        run: ``(config, RunContext) -> object``: produce the artifact. Raises
            :class:`prodip.base.errors.UserError` for what the user can fix.
        active: ``config -> bool``: whether the plan uses this stage at all (an optional stage, such
            as chat fine-tuning without conversations, is left out of the run); default always.
        config: the tables' configs, in ``tables`` order, -> the ``config`` the functions above receive;
            default: a one-table stage receives its table's config itself.
    """

    name: str
    tables: dict[str, type[Any]]
    reads: tuple[str, ...]
    writes: str
    needs: str | None
    describe: Callable[[C], str]
    done: Callable[[C], bool]
    run: Callable[[C, RunContext], object] = field(repr=False)
    active: Callable[[C], bool] = field(default=_always, repr=False)
    config: Callable[..., C] = field(default=_own, repr=False)

    def own(self, plan: object) -> C:
        """This stage's config out of a run plan (an object with one attribute per config table,
        ``prodip.plan.RunPlan``)."""
        return self.config(*(getattr(plan, table) for table in self.tables))


def made_from(artifact: str, recorded: Mapping[str, str | None], current: Mapping[str, str | None]) -> bool:
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


class StageTime(RecordPart):
    """One stage's wall time in ``stage_times.json``, summed over the invocations that made it."""

    #: wall seconds, summed over the invocations since the stage last completed
    seconds: Number
    complete: StrictBool
    invocations: StrictInt


class StageTimes(Record):
    """``OUT_DIR/stage_times.json``: wall time per stage (written by ``prodip run``, shown by its summary).

    format_version 1 is ``{format_version, stages: {name: {seconds, complete, invocations}}}``; files
    written before records existed hold the ``stages`` table alone (no ``format_version``) and still read.
    """

    FILE: ClassVar[str] = STAGE_TIMES_FILE
    MAKER: ClassVar[str] = "`prodip run`"

    stages: dict[str, StageTime] = Field(default_factory=dict)

    @classmethod
    def from_dict(cls: type[_T], data: Any, source: str | os.PathLike[str] | None = None) -> _T:
        """:meth:`Record.from_dict`, reading the unversioned layout (a bare ``{name: {...}}`` table) too."""
        if isinstance(data, dict) and "format_version" not in data and "stages" not in data:
            data = {"format_version": 1, "stages": data}
        return super().from_dict(data, source)

    def add(self, name: str, seconds: float, finished: bool) -> None:
        """Add one invocation's wall time to ``name``'s entry.

        Time of invocations that did not complete the stage (paused, interrupted, failed) is carried
        into the next one; a stage run again after it completed starts over.
        """
        prev = self.stages.get(name)
        resumed = prev is not None and not prev.complete
        carried = prev if resumed and prev is not None else StageTime(seconds=0.0, complete=True, invocations=0)
        self.stages = {
            **self.stages,
            name: StageTime(
                seconds=float(carried.seconds) + seconds, complete=finished, invocations=carried.invocations + 1
            ),
        }
