"""The train package's JSON artifacts as typed records (:mod:`prodip.base.records`), torch-free so the
pipeline's done-checks, export and conformance read them without loading the trainer.

- :class:`TrainerState`: a checkpoint's ``trainer_state.json`` (written by ``prodip.train.checkpoint``);
- :class:`CheckpointManifest`: a checkpoint's ``manifest.json`` (``prodip.train.checkpoint``);
- :class:`EvalReport`: ``eval.json`` (``prodip.train.eval``);
- :class:`SftEvalReport`: a fine-tuning run's ``sft_eval.json`` (``prodip.train.sft``).

Each is written by its one writer module only, through :meth:`Record.write`; every other module reads it
with the record's :meth:`Record.read` / :meth:`Record.read_or_none`.

    python -c "from prodip.train.records import TrainerState; print(TrainerState.READS)"
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, StrictInt

from prodip.base.jsontypes import JSONObject
from prodip.base.manifest import FileEntry
from prodip.base.records import Number, Record, RecordPart

TRAINER_STATE_FILE = "trainer_state.json"
CHECKPOINT_MANIFEST_FILE = "manifest.json"
EVAL_FILE = "eval.json"
SFT_EVAL_FILE = "sft_eval.json"


class TrainerState(Record):
    """``checkpoints/step_N/trainer_state.json`` (format_version 1; keys sorted, as the checkpoint hashes it).

    Besides the fields below it holds what the trainer adds (``python_rng``, ``numpy_rng``, ``data_card``,
    ``init_from``, ...), kept as written.
    """

    FILE: ClassVar[str] = TRAINER_STATE_FILE
    MAKER: ClassVar[str] = "`prodip train`"
    SORT_KEYS: ClassVar[bool] = True
    ENSURE_ASCII: ClassVar[bool] = True

    step: StrictInt
    tokens_seen: StrictInt
    tokenizer_sha256: str
    train_config: JSONObject = Field(default_factory=dict)
    #: the data loader's position; ``shards_meta_sha256`` is the shards it read
    data_state: JSONObject | None = None
    #: the model card's data facts: sources, tokens seen by language and source, ``init_from``
    data_card: JSONObject | None = None
    #: processes of the run that saved it (absent in checkpoints saved before it was recorded: 1)
    world_size: StrictInt | None = None

    @property
    def shards_meta_sha256(self) -> str | None:
        """sha256 of the shards' ``meta.json`` the run read (None: not recorded)."""
        value = (self.data_state or {}).get("shards_meta_sha256")
        return value if isinstance(value, str) else None


class CheckpointManifest(Record):
    """``checkpoints/step_N/manifest.json``: every file of the checkpoint with its size and sha256
    (format_version 1; keys sorted)."""

    FILE: ClassVar[str] = CHECKPOINT_MANIFEST_FILE
    MAKER: ClassVar[str] = "`prodip train`"
    SORT_KEYS: ClassVar[bool] = True
    ENSURE_ASCII: ClassVar[bool] = True

    files: dict[str, FileEntry]


class Checkpointed(RecordPart):
    """The checkpoint an evaluation scored (``eval.json`` ``checkpoint``)."""

    path: str
    step: StrictInt
    model_sha256: str


class Figures(RecordPart):
    """One model's held-out figures on one language's scored tokens (``eval.json`` ``languages[lang].trained``,
    ``random_init``, ``baseline``): NLL (nats), perplexity, bits per Unicode character."""

    nll_nats_total: Number | None = None
    nll_nats_per_token: Number | None = None
    perplexity: Number | None = None
    bits_per_char: Number | None = None


class LanguageEval(RecordPart):
    """``eval.json`` ``languages[lang]``: the target tokens and characters scored, and each model's figures."""

    tokens: StrictInt | None = None
    chars: StrictInt | None = None
    trained: Figures | None = None
    random_init: Figures | None = None
    #: ``[eval] baseline``'s figures (with its own tokenizer: on the same text, its ``chars_per_token`` too)
    baseline: Figures | None = None


class AssistantLoss(RecordPart):
    """``sft_eval.json`` ``before[lang]`` / ``after[lang]``: held-out assistant-token loss of one language."""

    conversations: StrictInt | None = None
    assistant_tokens: StrictInt | None = None
    assistant_chars: StrictInt | None = None
    nll_nats_per_token: Number | None = None
    bits_per_char: Number | None = None


class EvalReport(Record):
    """``eval.json`` (format_version 1): held-out NLL and bits/char of a checkpoint and its random twin."""

    FILE: ClassVar[str] = EVAL_FILE
    MAKER: ClassVar[str] = "`prodip eval`"

    created_utc: str | None = None
    out: str | None = None
    checkpoint: Checkpointed
    tokenizer_sha256: str | None = None
    shards_dir: str | None = None
    shards_meta_sha256: str | None = None
    config: JSONObject | None = None
    units: dict[str, str] = Field(default_factory=dict)
    languages: dict[str, LanguageEval] = Field(default_factory=dict)
    skipped_languages: dict[str, str] = Field(default_factory=dict)
    mc: JSONObject | None = None
    #: lm-evaluation-harness tasks: ``{settings, rows: [{task, language, output_type, shots, items, metric, chance,
    #: scores: {model: {metric: {value, stderr}}}, seconds: {model: s}}]}`` (``prodip.train.lmeval``)
    tasks: JSONObject | None = None
    elapsed_s: Number | None = None


class SftEvalReport(Record):
    """A fine-tuning run's ``sft_eval.json`` (format_version 1): held-out assistant-token loss before and
    after (``before``/``after``: language -> :class:`AssistantLoss`)."""

    FILE: ClassVar[str] = SFT_EVAL_FILE
    MAKER: ClassVar[str] = "`prodip sft`"

    init_from: str | None = None
    init_model_sha256: str | None = None
    inputs_sha256: str | None = None
    metric: str | None = None
    train_conversations: StrictInt | None = None
    before: dict[str, AssistantLoss] = Field(default_factory=dict)
    after: dict[str, AssistantLoss] | None = None
    step: StrictInt | None = None
    model_sha256: str | None = None
    #: ``[sft] replay_share`` > 0: share_of_rows, shards_dir, shards_meta_sha256, trained_tokens {chat, replay},
    #: share_of_trained_tokens, tokens_by_language (replayed tokens per language)
    replay: JSONObject | None = None
