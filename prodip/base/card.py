"""The model card's parts of the export manifest: ``card`` (:class:`Card`) and ``card_quality`` (:class:`CardQuality`).

``card`` is built by ``prodip.export.card.build_card`` and written into every artifact; ``card_quality``
holds the quality card's figures, written by ``prodip.conformance.card`` from its report. Each declares every
key its writer writes, in the writer's order, and keeps keys a newer writer adds. Both are read and written
only inside ``manifest.json`` (:class:`prodip.base.manifest.ExportManifest`); this module opens no file.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from prodip.base.jsontypes import JSONObject
from prodip.base.records import AsWritten, Number, RecordPart


class CardLicense(RecordPart):
    """The card's licence for the Hub (``prodip.base.sources.hf_license``): one SPDX id in lower case, or
    ``other`` with ``license_name`` and ``license_link``."""

    license: str
    license_name: str | None = None
    license_link: str | None = None


class CardSource(AsWritten):
    """One source of the card (``card.sources[i]``): its record's card fields
    (``prodip.base.sources.SourceRecord.card_fields``) with the counts the shards recorded and the tokens
    training saw, or a tokenizer-only input (``stage`` ``tokenizer``) or a fine-tuning one (``sft``). Its
    writers order the keys differently (each entry is copied from the artifact that recorded it), so an entry
    keeps the order it was read in (:class:`~prodip.base.records.AsWritten`)."""

    name: str
    language: str
    variety: str | None = None
    origin: str | None = None
    #: SPDX expression, ``unknown`` or ``other``
    license: str
    license_name: str | None = None
    license_link: str | None = None
    dataset_id: str | None = None
    notes: str | None = None
    #: ``prodip.base.sources.CLASSES``
    license_class: str | None = None
    license_terms: list[str] | None = None
    included_by_choice: StrictBool | None = None
    #: documents, characters and tokens of the source in the shards (all splits), and its shares of its language
    documents: StrictInt | None = None
    chars: StrictInt | None = None
    tokens: StrictInt | None = None
    chars_share_of_language: Number | None = None
    tokens_share_of_language: Number | None = None
    #: ``pretraining``, ``sft`` or ``tokenizer`` (absent: pretraining)
    stage: str | None = None
    #: sft: the number of files the source matched
    files: StrictInt | None = None
    #: tokens of the source the training run saw (None: not counted)
    tokens_seen: StrictInt | None = None


class CardStatement(AsWritten):
    """The card's licence statement of the mix (``prodip.base.sources.licence_statement``)."""

    #: the most restrictive source's class (``prodip.base.sources.CLASSES``); the file's key is ``class``
    class_: str = Field(alias="class")
    licenses: list[str]
    share_alike: list[str]
    non_commercial: list[str]
    attribution: list[str]
    unknown_included: list[str]
    cleared: StrictBool
    #: one paragraph for the cards
    text: str


class Card(RecordPart):
    """The model card's facts (``manifest.json`` ``card``; owner ``prodip.export.card``, which builds it with
    ``build_card`` and writes it into every artifact; ``prodip.conformance.card`` reads it back), keys in
    ``build_card``'s order. Keys a newer export adds are kept."""

    #: None: no licence is known (an imported base whose card and config state none); the Hub card's front
    #: matter, the ONNX metadata and the GGUF keys then carry no licence, as the Hub allows
    license: CardLicense | None
    languages: list[str]
    datasets: list[str]
    tags: list[str]
    #: the checkpoint or Hub id fine-tuning started from (None: trained from scratch)
    base_model: str | None
    sources: list[CardSource]
    statement: CardStatement
    #: language -> tokens of it training saw
    tokens_seen_by_language: dict[str, StrictInt] = Field(default_factory=dict)
    #: a fine-tuning run's replay of pretraining data (``[sft] replay_share``; absent: none): share_of_rows,
    #: share_of_trained_tokens, tokens_by_language, shards_meta_sha256, ...
    replay: JSONObject | None = None


class QualityRow(RecordPart):
    """One variant and held-out language of the quality card (``card_quality.rows[i]``,
    ``prodip.conformance.card.quality_rows``): bits/char, the training model's and the change, KL(training
    model || variant) mean and 99.9th percentile (nats), top-1 and greedy agreement (shares), the variant's
    bytes on disk and the runtimes that ran it and passed."""

    variant: str
    language: str
    bpc: Number | None
    bpc_ref: Number | None
    bpc_delta: Number | None
    kl_mean: Number | None
    kl_p999: Number | None
    top1: Number | None
    greedy_agreement: Number | None
    bytes: StrictInt
    runtimes: list[str]


class TwinRow(RecordPart):
    """The trained model against its random-initialised twin for one language (``card_quality.twin[i]``, from
    ``eval.json``): NLL per token (nats) and bits/char of each."""

    language: str
    nll_token: Number | None
    bpc: Number | None
    random_nll_token: Number | None
    random_bpc: Number | None


class TaskScore(RecordPart):
    """One model's figure on one task (``card_quality.tasks[i].scores[column]``): the metric's value and the
    harness's standard error (None: the harness gave none)."""

    value: Number | None
    stderr: Number | None = None


class TaskRow(RecordPart):
    """One lm-evaluation-harness task of the quality card (``card_quality.tasks[i]``, owner
    ``prodip.conformance.tasks``): its language, shots, items, metric, chance level (mean 1/choices; None for a
    task that is not multiple choice), the figure of each column in the card's order (``random twin`` and
    ``base`` from ``eval.json``, ``checkpoint`` = the exported weights in PyTorch, then each variant), the variants
    whose drop from the checkpoint exceeds their own standard error (``flagged``) and seconds per column."""

    task: str
    language: str
    #: the harness's kind: multiple_choice, loglikelihood(_rolling), generate_until (a chat task); None: not recorded
    output_type: str | None = None
    shots: StrictInt
    items: StrictInt
    metric: str
    higher_is_better: bool = True
    chance: Number | None = None
    scores: dict[str, TaskScore]
    flagged: list[str] = Field(default_factory=list)
    seconds: dict[str, Number] = Field(default_factory=dict)


class TaskPeer(BaseModel):
    """A reference model's published task scores, from the user's peers file (``card_quality.task_peers``):
    its name, where the scores come from, and task name -> score (the card's metric of that task)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    source: str
    scores: dict[str, Number]


class ForgettingRow(RecordPart):
    """What fine-tuning cost one language (``card_quality.forgetting[i]``, ``prodip.conformance.tasks``): bits/char
    of the pretrained model (eval.json's checkpoint) and of the exported fine-tuned one on the same held-out
    windows, and the relative change (``bpc / base_bpc - 1``; positive: worse after fine-tuning)."""

    language: str
    base_bpc: Number
    bpc: Number
    change: Number


class CardQuality(RecordPart):
    """The quality card's figures (``manifest.json`` ``card_quality``; owner ``prodip.conformance.card``,
    written from its report by ``write_quality``), keys in its order. Keys a newer conformance adds are kept."""

    rows: list[QualityRow]
    twin: list[TwinRow] = Field(default_factory=list)
    #: :func:`prodip.base.manifest.files_table_sha256` of the files the figures were measured on
    export_files_sha256: str | None = None
    #: lm-evaluation-harness tasks: one row per task, a column per model and variant
    tasks: list[TaskRow] = Field(default_factory=list)
    #: the settings the task figures were measured with (task names, few-shot, limit, seed, harness version)
    task_settings: JSONObject | None = None
    #: reference models' scores from the user's peers file, shown beside the task table
    task_peers: list[TaskPeer] = Field(default_factory=list)
    #: the pretrained model against the exported fine-tuned one on the same held-out text, per language
    forgetting: list[ForgettingRow] = Field(default_factory=list)
