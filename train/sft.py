"""``prodip sft``: supervised chat fine-tuning of a prodip checkpoint or a Hugging Face Llama folder.

Order of a run: read the conversations (``prodip.train.chat``), hold out a hash-chosen share ->
make the run's chat tokenizer (the source's, with the chat markers appended when it lacks them and
``chat_template`` set; :func:`prodip.tokenizer.bpe.add_chat_tokens`), staged beside ``OUT_DIR`` -> load
the weights of ``--init-from`` and give the new markers embedding and lm_head rows (:func:`extend_vocabulary`)
-> encode, refuse when no conversation is left to train (saying why), and check the loss mask against
the template's role spans (the guard; before step 1) -> only then move the tokenizer to
``OUT_DIR/tokenizer``: a refused run writes nothing to ``OUT_DIR`` -> held-out assistant-token loss of
the starting weights (``sft_eval.json``, once the batches are built) -> the pretraining loop of
``prodip.train.trainer`` (gradient-flow arbiter and update probe, AdamW with a fresh schedule,
checkpoints with the chat tokenizer copied in, resume, ``metrics.jsonl``, ``loss.png``, TensorBoard)
on packed conversations -> held-out assistant-token loss after -> ``OUT_DIR/sft_eval.json``.

A checkpoint of this run is a chat model: its ``tokenizer/`` holds the chat markers and its
``tokenizer_config.json`` has ``chat_template`` = :data:`prodip.base.chat.CHAT_TEMPLATE` (what
``prodip export`` carries into every artifact).

    prodip sft --init-from runs/demo/train --inputs bn=data/chat/bn.jsonl.gz,en=data/chat/en.jsonl.gz --out-dir runs/sft
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prodip.base.chat import CHAT_TOKENS, chat_contract
from prodip.base.config import dump_toml, write_text_atomic
from prodip.base.errors import InvalidInput, MissingInput, OutputExists
from prodip.base.files import file_sha256_cached
from prodip.base.jsontypes import JSONObject
from prodip.base.sources import match_sources
from prodip.tokenizer.bpe import PAD_ID, add_chat_tokens, load_with_specials
from prodip.tokenizer.corpus import expand_inputs
from prodip.tokenizer.shards import meta_sha256
from prodip.train import chat, checkpoint, distributed, init
from prodip.train.config import ModelConfig, SFTConfig
from prodip.train.data import MixtureBatches
from prodip.train.records import SFT_EVAL_FILE, AssistantLoss, SftEvalReport, TrainerState
from prodip.train.trainer import RunResult, _Run

log = logging.getLogger("prodip.sft")

FORMAT_VERSION = 1
EVAL_FILE = SFT_EVAL_FILE  # the name other modules import from here


def source_tokenizer_dir(cfg: SFTConfig) -> Path:
    """The tokenizer of ``--init-from``: ``--tokenizer-dir``, a checkpoint's ``tokenizer/`` copy, or the HF folder.

    Raises:
        MissingInput: none found (naming where it was looked for).
    """
    if cfg.tokenizer_dir:
        return Path(cfg.tokenizer_dir)
    src = Path(cfg.init_from)
    try:
        return checkpoint.resolve_checkpoint(src) / checkpoint.TOKENIZER_SUBDIR
    except (FileNotFoundError, ValueError):
        pass
    if (src / "tokenizer.json").is_file():
        return src
    raise MissingInput(
        f"--init-from {src}: no tokenizer found (neither a prodip checkpoint's tokenizer/ nor tokenizer.json "
        "in the folder); pass --tokenizer-dir"
    )


def extend_vocabulary(weights: init.InitWeights, vocab_size: int, new_ids: list[int], old_vocab: int) -> None:
    """Give ``new_ids`` rows in the embedding and lm_head (in place), growing them to ``vocab_size`` rows.

    Each new row is the mean of the rows of the ``old_vocab`` tokens the model was trained with. A
    random row (N(0, initializer_range)) would have a norm unrelated to the trained rows and, in the
    lm_head, a logit that can dominate or vanish; the mean row gives the new token a logit equal to
    the average token's at every position, so the model's distribution over the old tokens barely
    moves before fine-tuning and the new rows start where gradient descent reaches them quickly
    (Hewitt 2021, "Initializing new word embeddings for pretrained language models"; the approach of
    transformers' ``resize_token_embeddings(mean_resizing=True)``). A tied model has one matrix, so
    the lm_head follows the embedding.

    Args:
        weights: the source's tensors and config (``config.vocab_size`` updated).
        vocab_size: rows after (>= the source's).
        new_ids: the token ids that are new (rows set to the mean, wherever they are).
        old_vocab: tokens of the source tokenizer: rows ``[0, old_vocab)`` are averaged.
    """
    keys = ["model.embed_tokens.weight"]
    if not weights.config.tie_word_embeddings and "lm_head.weight" in weights.tensors:
        keys.append("lm_head.weight")
    for key in keys:
        w = weights.tensors[key]
        mean = w[:old_vocab].mean(dim=0)
        grown = torch.cat([w, mean.expand(vocab_size - w.shape[0], -1)]) if vocab_size > w.shape[0] else w.clone()
        grown[new_ids] = mean
        weights.tensors[key] = grown
    weights.config = dataclasses.replace(weights.config, vocab_size=vocab_size)


class _SFTRun(_Run):
    """The trainer's run with chat data, a chat tokenizer, extended vocabulary and before/after eval."""

    def __init__(self, sft_cfg: SFTConfig, info: distributed.DistInfo) -> None:
        super().__init__(sft_cfg.train_config(), ModelConfig(), info)
        self.sft = sft_cfg
        self.replay_dir: Path | None = None  # the replayed shards (_prepare), None without replay

    def _prepare(self) -> None:
        sft, cfg = self.sft, self.cfg
        if not sft.inputs:
            raise InvalidInput(f"{chat.INPUTS}: no conversations given; expected e.g. bn=data/chat/bn.jsonl")
        if not sft.init_from:
            raise InvalidInput(
                "[sft] init_from (--init-from): none given; fine-tuning starts from a checkpoint or HF Llama folder"
            )
        if not cfg.resume and (self.ckpt_dir / checkpoint.LATEST_FILE).exists():
            raise OutputExists(f"{self.ckpt_dir} already holds checkpoints; pass --resume, or choose another --out-dir")
        matched = match_sources(  # the licence gate, before any conversation is read
            expand_inputs(sft.inputs, what=chat.INPUTS), sft.sources, sft.include_unknown_license, what="sft.inputs"
        )
        conversations = chat.read_conversations(sft.inputs, sft.messages_field)
        self.sources = _base_sources(sft.init_from) + [
            {**rec.card_fields(), "stage": "sft", "files": len(files)} for rec, files in matched.values()
        ]
        self.init_sha256, self.inputs_sha256 = source_sha256(sft.init_from), inputs_sha256(sft.inputs)
        self.shards_meta_sha256 = None  # no shards: the conversations' hash is in sft_eval.json
        src_tok = source_tokenizer_dir(sft)
        src_sha = checkpoint.file_sha256(src_tok / "tokenizer.json")
        if chat_contract(src_tok) is not None:  # its own template: refused naming the source's file, not a copy
            chat.chat_format(src_tok)
        run_tok = Path(cfg.tokenizer_dir)
        staged = None if cfg.resume and (run_tok / "tokenizer.json").is_file() else staging_dir(run_tok)
        if staged is not None and self.info.is_main:
            shutil.rmtree(staged, ignore_errors=True)  # a crashed run's, never a user's: the name is private
            added = add_chat_tokens(src_tok, staged)
            if added["added"]:
                log.info("appended %s to the tokenizer (ids %s)", added["added"], added["ids"])
        distributed.barrier()  # the other ranks read the tokenizer rank 0 wrote
        try:
            self._load(src_tok, staged or run_tok, src_sha, conversations)
        except BaseException:
            if staged is not None and self.info.is_main:
                shutil.rmtree(staged, ignore_errors=True)  # refused: nothing of this run is left behind
            raise
        if staged is not None:  # every input accepted: the chat tokenizer moves into the run dir
            distributed.barrier()
            if self.info.is_main:
                commit_dir(staged, run_tok)
            distributed.barrier()

    def _load(
        self,
        src_tok: Path,
        tok_dir: Path,
        src_sha: str,
        conversations: dict[str, list[tuple[str, list[dict[str, str]]]]],
    ) -> None:
        """Read the chat tokenizer (``tok_dir``, staged or the run's), the weights, and encode; every refusal of
        the inputs happens here, before the run dir is written."""
        sft, cfg = self.sft, self.cfg
        self.tok_sha = checkpoint.file_sha256(tok_dir / "tokenizer.json")
        old_tok, tok = load_with_specials(src_tok)[0], load_with_specials(tok_dir)[0]
        self.tokenizer, self.chat_format = tok, chat.chat_format(tok_dir)
        source = init.load_init(sft.init_from, tokenizer_sha256=src_sha)
        new_ids = [i for t in CHAT_TOKENS if old_tok.token_to_id(t) is None and (i := tok.token_to_id(t)) is not None]
        vocab = max(source.config.vocab_size, tok.get_vocab_size())
        if new_ids or vocab != source.config.vocab_size:
            extend_vocabulary(source, vocab, new_ids, old_tok.get_vocab_size())
            log.info(
                "embedding and lm_head grown to %d rows; new rows %s = the mean of the trained rows", vocab, new_ids
            )
        self.init, self.model_cfg = source, source.config
        self.replay_dir = replay_shards_dir(sft) if sft.replay_share > 0 else None
        self.replay_tokenizer_sha = src_sha
        if cfg.seq_len > self.model_cfg.max_position_embeddings:
            raise InvalidInput(
                f"[sft] seq_len (--seq-len) {cfg.seq_len} exceeds max_position_embeddings "
                f"{self.model_cfg.max_position_embeddings} of --init-from {source.source}"
            )
        self._encode(conversations)

    def _encode(self, conversations: dict[str, list[tuple[str, list[dict[str, str]]]]]) -> None:
        tok, sft = self.tokenizer, self.sft
        every, self.train_examples, self.val_examples, cut, cut_away = [], [], {}, 0, []
        for lang, convs in conversations.items():
            for where, messages in convs:
                ex = chat.encode_conversation(tok, messages, where, self.chat_format)
                every.append(ex)
                fitted = chat.fit_length(ex, sft.seq_len + 1)
                cut += fitted is not ex
                if not fitted.trained.any():  # cut before its first reply: nothing to learn
                    cut_away.append(where)
                    continue
                if chat.is_heldout(messages, sft.val_fraction):
                    self.val_examples.setdefault(lang, []).append(fitted)
                else:
                    self.train_examples.append(fitted)
        # the guard, before step 1: the mask against the template's role spans, read from the ids
        counts = chat.check_loss_mask(
            every,
            im_start=tok.token_to_id(self.chat_format.turn_start),
            im_end=tok.token_to_id(self.chat_format.end_of_turn),
            decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
            header_end=self.chat_format.header_end,
        )
        log.info(
            "loss-mask guard: %d conversations, %d of %d tokens trained, all of them assistant tokens",
            counts["conversations"],
            counts["trained"],
            counts["tokens"],
        )
        if not self.train_examples:  # after the guard: a mask that trains nothing is its fault, named there
            raise InvalidInput(no_training_reason(every, len(cut_away), sft.seq_len, sft.val_fraction))
        if cut:
            log.warning("%d conversations longer than seq_len + 1 = %d tokens were cut to it", cut, sft.seq_len + 1)
        if cut_away:
            log.warning(
                "skipped %d conversations whose every reply lies beyond seq_len + 1 = %d tokens (nothing of them "
                "would be trained; first %s); raise --seq-len to keep them",
                len(cut_away),
                sft.seq_len + 1,
                ", ".join(cut_away[:3]),
            )
        self.langs = sorted(conversations)
        missing = [lang for lang in self.langs if not self.val_examples.get(lang)]
        if missing and sft.val_fraction > 0:
            log.warning("no held-out conversations for %s: raise val_fraction to measure them", ", ".join(missing))

    def _make_data(self):
        batches = chat.ChatBatches(
            self.train_examples,
            self.cfg.batch_size,
            self.cfg.seq_len,
            pad_id=PAD_ID,
            seed=self.cfg.seed,
            rank=self.info.rank,
            world_size=self.info.world_size,
            langs=self.langs,
        )
        if self.replay_dir is None:
            self._score_before()
            return batches
        pretrain = MixtureBatches(  # one global row at a time; every rank walks the same stream
            self.replay_dir,
            {},
            1,
            self.cfg.seq_len,
            seed=self.cfg.seed,
            expected_tokenizer_sha256=self.replay_tokenizer_sha,
        )
        log.info(
            "replay: %.1f%% of each step's rows are pretraining windows from %s (%s)",
            100 * self.sft.replay_share,
            self.replay_dir,
            ", ".join(pretrain.langs),
        )
        self._score_before()
        return chat.ReplayBatches(batches, pretrain, self.sft.replay_share)

    def _score_before(self) -> None:
        """The starting weights' held-out score into sft_eval.json: after the data is accepted (the batches
        and replay shards built), so a refused run writes no sft_eval.json."""
        if not self.cfg.resume and self.info.is_main:
            self.before = self._assistant_eval()
            self._write_eval({"before": self.before})

    def replay_record(self) -> JSONObject | None:
        """What the run's records say of replay (None without it): share (of rows), shards, their meta.json
        sha256, trained tokens served so far (chat vs replay, and replay per language)."""
        data = getattr(self, "data", None)
        if self.replay_dir is None or not isinstance(data, chat.ReplayBatches):
            return None
        total = data.tokens["chat"] + data.tokens["replay"]
        return {
            "share_of_rows": self.sft.replay_share,
            "shards_dir": str(self.replay_dir),
            "shards_meta_sha256": meta_sha256(self.replay_dir),
            "trained_tokens": {k: n for k, n in data.tokens.items()},
            "share_of_trained_tokens": data.tokens["replay"] / total if total else None,
            "tokens_by_language": {lang: n for lang, n in data.replay_tokens_by_language.items()},
        }

    def _data_card(self) -> JSONObject:
        card = super()._data_card()
        replay = self.replay_record()
        if replay is not None:
            card["replay"] = replay
        return card

    def _val_sets(self) -> dict[str, list]:
        self.no_val = [lang for lang in self.langs if not self.val_examples.get(lang)]
        return {
            lang: chat.val_batches(exs, self.cfg.batch_size, self.cfg.seq_len, PAD_ID)
            for lang, exs in self.val_examples.items()
        }

    def _write_config(self) -> None:
        text = dump_toml({"model": self.model_cfg.to_dict(), "sft": dataclasses.asdict(self.sft)})
        write_text_atomic(self.run_dir / "config.toml", text)

    def _assistant_eval(self) -> dict[str, dict[str, float]]:
        return {
            lang: chat.assistant_loss(
                self.model,
                exs,
                batch_size=self.cfg.batch_size,
                seq_len=self.cfg.seq_len,
                pad_id=PAD_ID,
                device=self.device,
            )
            for lang, exs in sorted(self.val_examples.items())
        }

    def _write_eval(self, update: dict[str, Any]) -> None:
        path = self.run_dir / EVAL_FILE
        earlier = SftEvalReport.read_or_none(path)
        doc = earlier.to_dict() if earlier is not None else {}
        doc.update(update)
        doc.update(
            format_version=FORMAT_VERSION,
            init_from=self.init.source if self.init else self.sft.init_from,
            init_model_sha256=self.init_sha256,
            inputs_sha256=self.inputs_sha256,
            metric="held-out loss on assistant tokens (replies and their <|im_end|>): nats/token and bits/char",
            train_conversations=len(self.train_examples),
        )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        SftEvalReport.from_dict(_finite(doc), path).write(path)

    def execute(self) -> RunResult:
        result = super().execute()
        if self.info.is_main and self.step >= self.cfg.steps:
            after = self._assistant_eval()
            update = {"after": after, "step": self.step, "model_sha256": _latest_sha(self.run_dir)}
            replay = self.replay_record()
            self._write_eval({**update, **({"replay": replay} if replay is not None else {})})
            for lang, a in after.items():
                b = SftEvalReport.read(self.run_dir / EVAL_FILE).before.get(lang, AssistantLoss())
                log.info(
                    "%s held-out assistant-token loss %.3f -> %.3f nats/token (%.3f -> %.3f bits/char)",
                    lang,
                    math.nan if b.nll_nats_per_token is None else b.nll_nats_per_token,
                    a["nll_nats_per_token"],
                    math.nan if b.bits_per_char is None else b.bits_per_char,
                    a["bits_per_char"],
                )
        return result


def staging_dir(run_tok: Path) -> Path:
    """Where the chat tokenizer is built before the inputs are accepted: a private sibling of the run dir
    (``.RUN.tokenizer.tmp``), so a refused run leaves nothing in ``--out-dir`` and the accepted one is a
    rename away. The same name on every rank (they read what rank 0 wrote)."""
    run_dir = run_tok.parent
    return run_dir.parent / f".{run_dir.name}.{run_tok.name}.tmp"


def commit_dir(staged: Path, final: Path) -> None:
    """Move the folder ``staged`` to ``final`` (its parent made), replacing an earlier one there."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        shutil.rmtree(final)  # an earlier stopped run's chat tokenizer (refuse_foreign_run_dir allowed it)
    os.replace(staged, final)


def no_training_reason(every: list[chat.Example], skipped: int, seq_len: int, val_fraction: float) -> str:
    """Why no conversation is left to train on, with the figures: all cut away by ``seq_len`` (and the
    ``--seq-len`` that keeps the first one), or held out by ``val_fraction``.

    Args:
        every: each conversation encoded whole; ``skipped``: how many :func:`chat.fit_length` cut before their
            first trained token; the rest were held out.
    """
    n = len(every)
    held = n - skipped
    if skipped == n:
        # trained[i]: token i is a target; a window of seq_len + 1 tokens keeps targets 1..seq_len
        first = min(int(np.flatnonzero(ex.trained)[0]) for ex in every if ex.trained.any())
        return (
            f"all {n} conversations are longer than --seq-len {seq_len} tokens before their first reply "
            f"(nothing of them would be trained); the earliest first reply starts at token {first}, so "
            f"--seq-len {first} keeps at least one"
        )
    why = f"{held} held out (val_fraction {val_fraction})"
    if skipped:
        why += f", {skipped} longer than --seq-len {seq_len} tokens before their first reply"
    return f"no training conversations: of {n}, {why}; lower val_fraction or give more conversations"


def replay_shards_dir(cfg: SFTConfig) -> Path:
    """The shards replayed: ``--replay-shards-dir``, else the ``shards_dir`` the ``--init-from`` prodip run
    recorded in its checkpoint's ``trainer_state.json``.

    Raises:
        MissingInput: neither given nor recorded (a Hugging Face folder), or the folder has no meta.json.
    """
    if cfg.replay_shards_dir:
        path = Path(cfg.replay_shards_dir)
    else:
        try:
            ckpt = checkpoint.resolve_checkpoint(cfg.init_from)
        except (FileNotFoundError, ValueError):
            raise MissingInput(
                f"[sft] replay_share (--replay-share) {cfg.replay_share}: --init-from {cfg.init_from} is not a "
                "prodip run, so its shards are unknown; pass --replay-shards-dir"
            ) from None
        recorded = (TrainerState.read(ckpt / checkpoint.TRAINER_STATE_FILE).train_config or {}).get("shards_dir")
        if not isinstance(recorded, str) or not recorded:
            raise MissingInput(
                f"[sft] replay_share (--replay-share) {cfg.replay_share}: "
                f"{ckpt / checkpoint.TRAINER_STATE_FILE} records no shards_dir; pass --replay-shards-dir"
            )
        path = Path(recorded)
    if not (path / "meta.json").is_file():
        raise MissingInput(f"{path}: no meta.json (the replayed token shards, made by `prodip data prepare`)")
    return path


def _finite(doc: Any) -> Any:
    """NaN (no held-out conversation) as null: JSON has no NaN."""
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    return doc


def _base_sources(init_from: str | Path) -> list[JSONObject]:
    """The pretraining sources a prodip checkpoint recorded (its ``data_card``), marked ``stage =
    "pretraining"``; [] for a Hugging Face folder (its own card states its data) or an older checkpoint."""
    try:
        ckpt = checkpoint.resolve_checkpoint(init_from)
    except (FileNotFoundError, ValueError):
        return []
    card = TrainerState.read(ckpt / checkpoint.TRAINER_STATE_FILE).data_card or {}
    seen = card.get("tokens_seen_by_source")
    seen = seen if isinstance(seen, dict) else {}
    sources = card.get("sources")
    return [
        {**s, "stage": "pretraining", "tokens_seen": seen.get(str(s["name"]))}
        for s in (sources if isinstance(sources, list) else [])
        if isinstance(s, dict)
    ]


def source_sha256(init_from: str | Path) -> str | None:
    """sha256 of the starting weights: a prodip checkpoint's newest ``model.safetensors``, an HF folder's
    ``model.safetensors`` (or its shard index); None when there is nothing there."""
    path = Path(init_from)
    try:
        return checkpoint.model_sha256(checkpoint.resolve_checkpoint(path))
    except (FileNotFoundError, ValueError):
        pass
    for name in ("model.safetensors", "model.safetensors.index.json"):
        if (path / name).is_file():
            return file_sha256_cached(path / name)
    return None


def inputs_sha256(inputs: dict[str, list[str]]) -> str | None:
    """One sha256 over the conversation files (language, path, each file's sha256); None if one is missing."""
    h = hashlib.sha256()
    try:
        for lang, paths in sorted(expand_inputs(inputs, what=chat.INPUTS).items()):
            for p in paths:
                files = sorted(f for f in Path(p).rglob("*") if f.is_file()) if Path(p).is_dir() else [Path(p)]
                for f in files:
                    h.update(f"{lang}\t{f}\t{file_sha256_cached(f)}\n".encode())
    except (OSError, InvalidInput, MissingInput):
        return None
    return h.hexdigest()


def _latest_sha(run_dir: Path) -> str | None:
    try:
        return checkpoint.model_sha256(checkpoint.resolve_checkpoint(run_dir))
    except (FileNotFoundError, ValueError):
        return None


def sft(cfg: SFTConfig) -> Path:
    """Run (or resume) a chat fine-tuning run; returns its run dir. See the module docstring.

    Raises:
        InvalidInput, MissingInput: bad conversations, inputs, tokenizer or source (named).
        prodip.train.guards.GuardError: the loss mask is wrong (before step 1), or a parameter gets no
            gradient / update.
    """
    return run_sft(cfg)["run_dir"]


def run_sft(cfg: SFTConfig) -> RunResult:
    """:func:`sft`, returning the trainer's ``{"run_dir", "model", "step", "last"}``."""
    info = distributed.setup(cfg.device)
    clean = False
    try:
        run = _SFTRun(cfg, info)
        result = run.execute()
        del run
        clean = True
        return result
    finally:
        distributed.teardown(clean=clean)


def sft_done(cfg: SFTConfig) -> bool:
    """The newest checkpoint reached ``steps`` and ``sft_eval.json`` scores it (after)."""
    doc = SftEvalReport.read_or_none(Path(cfg.out_dir) / EVAL_FILE)
    if doc is None or doc.step is None:
        return False
    return doc.step >= cfg.steps and doc.model_sha256 == _latest_sha(Path(cfg.out_dir))
