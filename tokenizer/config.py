"""The tokenizer package's configs: ``[tokenizer]`` (``prodip tokenizer train``), ``[audit]`` (``prodip
tokenizer audit``), ``[data]`` (``prodip data prepare``) and ``[extend]`` (``prodip tokenizer extend``), and
:class:`CorpusOptions`, the corpus-reading and source-record options ``[tokenizer]`` and ``[data]`` share.

    python -c "from prodip.tokenizer.config import DataPrepareConfig; print(DataPrepareConfig())"
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from prodip.base.config import opt
from prodip.base.errors import InvalidInput
from prodip.base.sources import SourceOptions
from prodip.tokenizer.corpus import DOC_CHARS_HELP, ERROR_POLICIES, ERRORS_HELP, FORMATS_HELP, TEXT_FIELD_HELP
from prodip.tokenizer.portable import DEFAULT_PRETOKENIZER, PRETOKENIZERS

#: ``[tokenizer] kind`` choices.
KINDS = ("portable", "custom", "naive")


@dataclass(frozen=True)
class CorpusOptions(SourceOptions):
    """How a stage reads its corpus files, and their source records: one declaration the tokenizer's and the
    data stage's configs inherit (same keys, defaults and help in ``[tokenizer]`` and ``[data]``). In a pipeline
    file ``[tokenizer]`` (and ``[audit]``'s ``text_field`` and ``errors``) take ``[data]``'s reading options
    unless their own table sets them (``prodip.pipeline.resolve_all``)."""

    text_field: str = opt("text", TEXT_FIELD_HELP)
    doc_chars: int = opt(20000, DOC_CHARS_HELP)
    errors: str = opt("strict", ERRORS_HELP, choices=ERROR_POLICIES)


#: The corpus-reading keys of :class:`CorpusOptions` (``text_field``, ``doc_chars``, ``errors``; not its
#: source-record ones): in a pipeline file ``[tokenizer]`` and ``[audit]`` take ``[data]``'s.
READ_OPTIONS = tuple(
    f.name
    for f in dataclasses.fields(CorpusOptions)
    if f.name not in {g.name for g in dataclasses.fields(SourceOptions)}
)


@dataclass(frozen=True)
class TokenizerTrainConfig(CorpusOptions):
    """``prodip tokenizer train`` (TOML section ``[tokenizer]``)."""

    inputs: dict[str, list[str]] = opt(
        factory=dict,
        help=f"language -> files/folders of training text ({FORMATS_HELP}), e.g. bn=data/bn,en=data/en",
    )
    out_dir: str = opt("runs/tokenizer", "output tokenizer dir (refused if it holds a tokenizer, unless overwrite)")
    vocab_size: int = opt(32000, "vocabulary size in tokens, incl. the 5 special and 256 byte tokens")
    proportions: dict[str, float] = opt(
        factory=dict,
        help="share of the training sample per language, by "
        "characters, e.g. bn=0.6,en=0.4 (empty: the corpus's natural mix)",
    )
    word_counts: dict[str, list[str]] = opt(
        factory=dict,
        help="language -> word-frequency tables (word, count) trained on as their equivalent text (each word "
        "repeated count times): a word<TAB>count .tsv(.gz) file, or wordfreq:LANG for the list the wordfreq "
        "package ships (data CC BY-SA 4.0, share-alike: opt-in), e.g. bn=wordfreq:bn",
    )
    wordfreq_chars: int = opt(
        2_000_000, "characters of equivalent text each wordfreq:LANG table gives (before its weight)"
    )
    bare_share: dict[str, float] = opt(
        factory=dict,
        help="language -> share of each word_counts word's occurrences given without the leading space, as a "
        "word that starts a line or follows an opening quote or bracket is (a pre-token BPE learns apart; "
        "data/bn: 8.9%% of words start a line, 3.2%% follow a mark), e.g. bn=0.12 (default 0: all spaced)",
    )
    capitalised_share: dict[str, float] = opt(
        factory=dict,
        help="language -> share of each lower-case word_counts word's occurrences given capitalised (Word), as "
        "a sentence's first word is (wordfreq's lists are lower case; data/en: 7.1%% of words are capitalised "
        "words otherwise written in lower case), e.g. en=0.07 (default 0)",
    )
    weights: dict[str, int] = opt(
        factory=dict,
        help="source -> repeat count in the sample (a source is an entry of inputs or word_counts, as written; "
        "2 = the source listed twice), e.g. data/bn=2,wordfreq:bn=2",
    )
    sample_chars: int = opt(60_000_000, "maximum characters in the training sample (all languages)")
    min_frequency: int = opt(2, "minimum pair count for a merge")
    limit_alphabet: int = opt(
        1000,
        "custom kind: at most this many distinct characters enter the vocabulary; rarer "
        "characters are encoded as byte-fallback tokens (byte-level kinds start from the 256 bytes)",
    )
    model_max_length: int = opt(2048, "model_max_length written to tokenizer_config.json (tokens)")
    kind: str = opt(
        "portable",
        "portable: byte-level BPE with a standard pre-tokenizer every export runtime reproduces (default); "
        "custom: prodip's own Bangla-aware regex (+ superwords), which only tokenizers/transformers(.js) "
        "reproduce, refused by the other export targets; naive: GPT-2 byte-level BPE on the unbalanced mix "
        "(the audit's baseline)",
        choices=KINDS,
    )
    pretokenizer: str = opt(
        DEFAULT_PRETOKENIZER,
        "portable kind: the standard pre-tokenizer regex (o200k-marks: GPT-4o's, combining marks kept "
        "with their letters; llama3 and gpt2 split Bangla words at every vowel sign, for comparison)",
        choices=tuple(PRETOKENIZERS),
    )
    superword_share: float = opt(
        0.0,
        "custom kind: share of the learned vocabulary given to multi-word tokens (SuperBPE-style second "
        "stage; 0 = word-level only)",
    )
    seed: int = opt(0, "seed of the per-document sampling")
    overwrite: bool = opt(False, "replace an existing tokenizer in out_dir")
    progress: bool = opt(True, "show the trainer's progress bars")

    def corpus_only(self) -> TokenizerTrainConfig:
        """This config without its word-count tables and the options that only shape them or the mix
        (``word_counts``, ``wordfreq_chars``'s tables, ``bare_share``, ``capitalised_share``, ``weights``) and
        without sample ``proportions``: the text corpus's natural mix, what the audit's naive baseline trains on
        (proportions could name a language that only a word-count table brought). A new option that only
        applies to word-count tables must be reset here too (tests/tokenizer/test_audit.py trains the
        baseline from a config that sets every one)."""
        return dataclasses.replace(
            self, word_counts={}, bare_share={}, capitalised_share={}, weights={}, proportions={}
        )


@dataclass
class AuditConfig:
    """``prodip tokenizer audit`` (TOML section ``[audit]``)."""

    tokenizer_dir: str = opt(
        "runs/demo/tokenizer",
        "tokenizer to audit: a prodip tokenizer dir, a Hugging Face model folder or a tokenizer.json "
        "(fertility.json is written beside it unless --report says where)",
    )
    report: str = opt("", "where to write fertility.json (default: in the tokenizer's folder)")
    compare_dir: str = opt(
        "",
        "a second tokenizer (dir, folder or tokenizer.json) audited on the same held-out text and shown side by "
        "side, e.g. the prodip tokenizer trained on the corpus you adapt a base model to",
    )
    heldout: dict[str, list[str]] = opt(
        factory=dict,
        help=f"language -> held-out files/folders never used in training ({FORMATS_HELP}; .tsv: the column named "
        "after the language); every file under a folder counts as that language, and the audit names the files read",
    )
    min_chars_per_token: dict[str, float] = opt(
        factory=dict, help="gate: minimum characters/token per language, e.g. bn=4.0,en=3.8 (empty: no gate)"
    )
    baseline: str = opt(
        "none",
        "naive: also audit a GPT-2-style byte-level BPE trained on the same inputs and "
        "vocabulary with the unbalanced mix, side by side",
        choices=("none", "naive"),
    )
    baseline_dir: str = opt("", "where the naive baseline lives or is trained (default: TOKENIZER_DIR-naive)")
    max_chars: int = opt(3_000_000, "at most this many held-out characters per language")
    parity: str = opt(
        "auto",
        "tokenizer parity with the on-device runtimes on the held-out text + tricky strings: auto = every "
        "installed runtime (the others are listed as skipped); require = a runtime that is not installed "
        "fails the gate (CI); off = no parity check",
        choices=("auto", "require", "off"),
    )
    parity_max_chars: int = opt(1_000_000, "at most this many held-out characters per language for the parity check")
    errors: str = opt("strict", "invalid UTF-8 in held-out files: strict or skip", choices=ERROR_POLICIES)
    text_field: str = opt(
        "text", "JSONL field, or Parquet/CSV/`datasets` column, holding held-out text (as [data] text_field)"
    )


@dataclass(frozen=True)
class DataPrepareConfig(CorpusOptions):
    """``prodip data prepare`` (TOML section ``[data]``)."""

    tokenizer_dir: str = opt("runs/demo/tokenizer", "tokenizer dir written by `prodip tokenizer train`")
    inputs: dict[str, list[str]] = opt(
        factory=dict,
        help=f"language -> files/folders of text to encode ({FORMATS_HELP}), e.g. bn=data/bn,en=data/en",
    )
    out_dir: str = opt("runs/demo/shards", "output shards dir (refused if it holds shards, unless overwrite)")
    val_fraction: float = opt(0.02, "share of documents sent to the validation split (0-0.5)")
    seed: int = opt(0, "seed of the train/val document split")
    shard_tokens: int = opt(50_000_000, "maximum tokens per shard file")
    batch_chars: int = opt(4_000_000, "characters sent to the batch encoder at once (memory vs overhead)")
    overwrite: bool = opt(False, "replace existing shards in out_dir")
    progress: bool = opt(True, "show a progress bar")

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction <= 0.5:
            raise InvalidInput(f"val_fraction must be in [0, 0.5], got {self.val_fraction}")
        if self.shard_tokens < 1 or self.batch_chars < 1:
            raise InvalidInput("shard_tokens and batch_chars must be positive")


@dataclass
class ExtendConfig:
    """``prodip tokenizer extend`` (TOML section ``[extend]``)."""

    base: str = opt(
        "", "the base: a Hugging Face folder (tokenizer.json, config.json, model.safetensors) or a tokenizer.json"
    )
    out: str = opt("", "the extended folder to write (default: BASE-extended)")
    inputs: dict[str, list[str]] = opt(
        factory=dict, help=f"language -> files/folders to learn the new tokens from ({FORMATS_HELP})"
    )
    new_tokens: int = opt(4000, "how many tokens to add at most (fewer when the corpus offers fewer pairs)")
    min_frequency: int = opt(2, "a merge must occur at least this many times in the corpus (occurrences)")
    max_chars: int = opt(20_000_000, "read at most this many characters of each language's inputs")
    heldout: dict[str, list[str]] = opt(
        factory=dict,
        help="language -> held-out files/folders for the before/after fertility audit (never trained on; every file "
        "under a folder counts as that language)",
    )
    min_chars_per_token: dict[str, float] = opt(
        factory=dict, help="the fertility gate on the extended tokenizer (chars/token per language), as [audit]'s"
    )
    parity: str = opt(
        "auto",
        "runtime parity of the extended tokenizer on the held-out text (as [audit] parity): auto, require, off",
        choices=("auto", "require", "off"),
    )
    heldout_max_chars: int = opt(1_000_000, "at most this many held-out characters per language")
    errors: str = opt("strict", "invalid UTF-8 in input files: strict or skip", choices=ERROR_POLICIES)
    text_field: str = opt("text", "JSONL field, or Parquet/CSV/`datasets` column, holding the text")
    overwrite: bool = opt(False, "replace an existing OUT folder")
