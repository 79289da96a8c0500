"""Chat fine-tuning data: conversations -> token ids with an assistant-only loss mask -> packed rows.

A conversation is OpenAI's messages format, ``{"messages": [{"role": "system"|"user"|"assistant",
"content": str}, ...]}`` (multi-turn, an optional system prompt, at least one assistant turn), read
from JSONL, Parquet, CSV (the field a JSON text) or a ``datasets`` folder
(:func:`prodip.tokenizer.corpus.iter_records`). It is rendered with the one chat template
(:func:`prodip.base.chat.render`, no generation prompt), or an imported model's own (:class:`ChatFormat`:
SmolLM2's and Qwen2's ChatML, Llama 3's ``<|start_header_id|>role<|end_header_id|>`` ... ``<|eot_id|>``), and
tokenised as a whole, exactly as a runtime tokenises a prompt (``add_special_tokens=False``: the template
writes the bos).

**The loss mask.** A target is trained when its token belongs to an assistant reply: the reply's
content and the end of turn that closes it (``<|im_end|>``, ``<|eot_id|>``: so the model learns to end its turn). Everything else
(``<|bos|>``, the markers and role headers, system and user content, the newline after each
``<|im_end|>``) is a target of -100, not counted (:data:`prodip.train.loss.IGNORE_INDEX`). The mask
is made from character spans of the rendered text (:func:`assistant_mask`). :func:`check_loss_mask`
is the guard: it re-derives the roles from the token ids alone (``<|im_start|>`` role-header ...
``<|im_end|>``) and refuses a mask that trains on anything but the assistant's tokens, or on none of
them, before step 1, naming the roles and counts at fault. (nanochat #570: a rewrite silently
dropped the mask and every loss curve still looked fine.)

**Packing.** Conversations are packed whole into rows of ``seq_len`` positions (first fit, in a
seeded order per epoch) and the row's tail is padding. Each conversation keeps its own positions
(0, 1, ... from its ``<|bos|>``) and a document id; the model's block-diagonal causal mask
(``LlamaForCausalLM.forward(document_ids=...)``) lets no token attend across a conversation
boundary, so a conversation's logits in a packed row equal its logits alone. A conversation longer
than ``seq_len + 1`` tokens is cut to that length (counted and warned about).

    python -c "from prodip.train.chat import encode_conversation as e; from prodip.tokenizer.bpe import \
load_tokenizer as l; print(e(l('runs/demo/tokenizer'), [{'role': 'user', 'content': 'hi'}, \
{'role': 'assistant', 'content': 'hello'}]))"
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import torch

from prodip.base.chat import (
    CHAT_TEMPLATE,
    IM_END,
    IM_START,
    MessageError,
    chat_contract,
    check_message,
    check_messages,
    render,
    special_token_texts,
    template_variables,
)
from prodip.base.errors import InvalidInput
from prodip.base.jsontypes import JSONObject, integer, obj
from prodip.tokenizer.corpus import ReadStats, expand_inputs, iter_records
from prodip.train.guards import GuardError
from prodip.train.loss import IGNORE_INDEX

log = logging.getLogger(__name__)
#: How errors name the conversations: the config key and the option (the command line prefixes the command).
INPUTS = "[sft] inputs (--inputs)"

LN2 = math.log(2.0)


# ---- reading ---------------------------------------------------------------------------------


def parse_messages(value: Any, where: str) -> list[dict[str, str]]:
    """Validate one record's ``messages`` (a list, or its JSON text from a CSV cell); NFC the contents.

    Raises:
        InvalidInput: not a non-empty list; a message breaking a rule of every chat message
            (:func:`prodip.base.chat.check_message`: an object, a known role, a string of Unicode text);
            an assistant reply that is empty or whitespace only (it would teach the model to answer
            nothing); or no assistant turn (each naming ``where`` and the message index).
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise InvalidInput(f"{where}: messages is a string but not JSON ({err.msg})") from None
    if not isinstance(value, list) or not value:
        raise InvalidInput(f"{where}: messages must be a non-empty list of {{role, content}} objects")
    out = []
    for i, m in enumerate(value):
        try:
            role, content = check_message(i, m)  # the rules of every chat message (prodip.base.chat)
        except MessageError as err:
            raise InvalidInput(f"{where}: {err}") from None
        if role == "assistant" and not content.strip():  # a fine-tuning rule: a reply is what is trained
            raise InvalidInput(
                f"{where}: messages[{i}].content: an empty (or whitespace-only) assistant reply would teach the "
                "model to answer nothing; write the reply or remove the conversation"
            )
        out.append({"role": role, "content": unicodedata.normalize("NFC", content)})
    if not any(m["role"] == "assistant" for m in out):
        raise InvalidInput(f"{where}: no assistant message: nothing to learn from this conversation")
    return out


def read_conversations(
    inputs: dict[str, list[str]], field: str = "messages"
) -> dict[str, list[tuple[str, list[dict[str, str]]]]]:
    """``{lang: [(where, messages), ...]}`` from ``{lang: [file or folder, ...]}``.

    Raises:
        InvalidInput, MissingInput: see :func:`prodip.tokenizer.corpus.expand_inputs`,
            :func:`prodip.tokenizer.corpus.iter_records` and :func:`parse_messages`; a JSONL line that is
            not UTF-8 (naming FILE:LINE).
    """
    files = expand_inputs(inputs, what=INPUTS)
    out: dict[str, list[tuple[str, list[dict[str, str]]]]] = {}
    for lang, paths in files.items():
        out[lang] = [conv for p in paths for conv in _read_file(p, field)]
    return out


def _read_file(path: Any, field: str) -> list[tuple[str, list[dict[str, str]]]]:
    """The conversations of one file; invalid UTF-8 is refused naming FILE:LINE.

    The lines are decoded with ``errors="skip"`` only to learn whether and where undecodable bytes are
    (the counter grows as lines are decoded); the first one's line is counted from its byte offset, so a
    conversation is never trained with bytes dropped from it.
    """
    stats, out = ReadStats(), []
    for where, value in iter_records(path, field, errors="skip", stats=stats):
        _refuse_bad_bytes(stats, Path(path))
        out.append((where, parse_messages(value, where)))
    _refuse_bad_bytes(stats, Path(path))  # bytes on a line no record was read from (e.g. a blank one)
    return out


def _refuse_bad_bytes(stats: ReadStats, path: Path) -> None:
    if not stats.skipped_bytes:
        return
    offset = int(stats.skipped_where[0].rsplit("@", 1)[-1])  # in the (decompressed) byte stream
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    with opener(path, "rb") as fh:
        line = fh.read(offset).count(b"\n") + 1
    raise InvalidInput(
        f"{path}:{line}: invalid UTF-8 (byte offset {offset} of the file); conversations are read as UTF-8: "
        "re-save the file as UTF-8"
    )


def is_heldout(messages: Sequence[Mapping[str, str]], fraction: float) -> bool:
    """Held out when the sha256 of the conversation's JSON falls in the first ``fraction`` of the range
    (stable: the same conversation is always on the same side, whatever the file order)."""
    digest = hashlib.sha256(json.dumps(list(messages), ensure_ascii=False, sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


# ---- encoding and the mask -------------------------------------------------------------------


@dataclass(frozen=True)
class ChatFormat:
    """How a chat template marks turns, for the loss mask and its guard.

    Attributes:
        template: the Jinja chat template; None is prodip's (:data:`prodip.base.chat.CHAT_TEMPLATE`).
        variables: the special-token strings it may read (``bos_token``, ...;
            :func:`prodip.base.chat.template_variables`).
        turn_start: the token that opens a turn's role header (``<|im_start|>``, Llama 3's ``<|start_header_id|>``).
        end_of_turn: the token that closes a turn (``<|im_end|>``, Llama 3's ``<|eot_id|>``): trained after a reply.
        header_end: a token that closes the role name before the header's newline (Llama 3's
            ``<|end_header_id|>``), or None (ChatML: ``role\n``).
    """

    template: str | None = None
    variables: Mapping[str, str] = dataclasses.field(default_factory=dict)
    turn_start: str = IM_START
    end_of_turn: str = IM_END
    header_end: str | None = None


#: prodip's own chat format (ChatML markers, :data:`prodip.base.chat.CHAT_TEMPLATE`).
PRODIP_FORMAT = ChatFormat()
#: Llama 3's role header: ``<|start_header_id|>role<|end_header_id|>\n\n``.
LLAMA3_HEADER = ("<|start_header_id|>", "<|end_header_id|>")


def chat_format(tokenizer_dir: str | Path) -> ChatFormat:
    """The chat format of a fine-tuning run's tokenizer dir: prodip's, or an imported model's own template
    with its end of turn (:func:`prodip.base.chat.chat_contract`), whose turns open with ChatML's
    ``<|im_start|>`` (SmolLM2, Qwen2) or Llama 3's ``<|start_header_id|>``.

    Raises:
        InvalidInput: no chat template, or one whose turns open with neither (e.g. Zephyr's ``<|user|>``,
            TinyLlama's): the loss-mask guard reads roles from those tokens (the file named).
    """
    root = Path(tokenizer_dir)
    contract = chat_contract(root)
    if contract is None:
        raise InvalidInput(
            f"{root / 'tokenizer_config.json'}: no chat_template; fine-tuning a base model's tokenizer needs its "
            "chat template (an instruct model's folder has one)"
        )
    if contract["chat_template"] == CHAT_TEMPLATE:
        return PRODIP_FORMAT
    tok = json.loads((root / "tokenizer.json").read_text(encoding="utf-8"))
    added = {a["content"] for a in tok.get("added_tokens", []) if a.get("special")}
    template, eot = contract["chat_template"], contract["end_of_turn"]
    if IM_START in added and IM_START in template:
        start, header_end = IM_START, None
    elif all(t in added and t in template for t in LLAMA3_HEADER):
        start, header_end = LLAMA3_HEADER
    else:
        raise InvalidInput(
            f"{root / 'tokenizer_config.json'}: its chat_template opens turns with neither {IM_START} (ChatML) "
            f"nor {LLAMA3_HEADER[0]} (Llama 3); the loss-mask guard reads the roles from those tokens"
        )
    return ChatFormat(template, template_variables(root), start, eot, header_end)


@dataclass
class Example:
    """One tokenised conversation.

    Attributes:
        ids: (L,) int64 token ids of the rendered conversation.
        trained: (L,) bool, whether token i is a trained target (predicted from token i - 1).
        assistant_chars: characters of the assistant replies kept (NFC), for bits/char.
        where: the record it came from.
    """

    ids: np.ndarray
    trained: np.ndarray
    assistant_chars: int
    where: str = ""


def assistant_spans(
    messages: Sequence[Mapping[str, str]], fmt: ChatFormat = PRODIP_FORMAT
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans ``[start, end)`` of each assistant reply: its
    content and the end of turn closing it (``<|im_end|>``, ``<|eot_id|>``).

    A reply starts where the conversation before it, rendered with the generation prompt (the
    assistant's header), ends; the template may put whitespace there and trim the content (Llama 3's
    does). A template that is not prefix-stable (rendering a prefix of the conversation does not give a
    prefix of its text) is refused: the spans would lie.

    Raises:
        InvalidInput: the template is not prefix-stable, or a reply is not followed by ``fmt.end_of_turn``.
    """

    def draw(msgs: Sequence[Mapping[str, str]], generation: bool) -> str:
        return render(msgs, add_generation_prompt=generation, template=fmt.template, variables=fmt.variables)

    text = draw(messages, False)
    spans = []
    for k, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(draw(messages[:k], True))
        content = m["content"]
        if not text.startswith(content, start):  # a template that trims the content (Llama 3's)
            content = content.strip()
            at = text.find(content, start)
            if at < 0 or text[start:at].strip():
                raise InvalidInput(
                    f"chat template: message {k}'s reply does not follow the conversation before it rendered "
                    "with add_generation_prompt; the loss mask needs a prefix-stable template"
                )
            start = at
        end = start + len(content)
        if not text.startswith(fmt.end_of_turn, end):
            raise InvalidInput(f"chat template: message {k}'s reply is not followed by {fmt.end_of_turn!r}")
        spans.append((start, end + len(fmt.end_of_turn)))
    return text, spans


def assistant_mask(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """(L,) bool: token i is trained when its first character lies in an assistant span.

    Args:
        offsets: each token's ``(start, end)`` characters in the rendered text (``tokenizers``' offsets).
        spans: :func:`assistant_spans`.
    """
    starts = np.array([s for s, _ in offsets], dtype=np.int64)
    out = np.zeros(len(offsets), dtype=bool)
    for a, b in spans:
        out |= (starts >= a) & (starts < b)
    return out


def encode_conversation(
    tokenizer: Any, messages: Sequence[Mapping[str, str]], where: str = "", fmt: ChatFormat = PRODIP_FORMAT
) -> Example:
    """Render with ``fmt``'s template, tokenise (``add_special_tokens=False``) and mask one conversation (see
    the module docstring).

    Raises:
        InvalidInput: a message breaks a rule of :func:`prodip.base.chat.check_message` (the one ``prodip serve``
            applies to requests), such as a content holding the text of one of the tokenizer's special tokens
            (``<|eos|>``, ``<|im_end|>``, ...), naming ``where`` and the message: the tokenizer would read it as
            the control token (a forged turn, or an end-of-document the model learns to emit mid-reply).
    """
    try:
        check_messages(messages, special_token_texts(tokenizer))
    except MessageError as err:
        raise InvalidInput(f"{where}: {err}") from None
    try:
        text, spans = assistant_spans(messages, fmt)
    except InvalidInput as err:
        raise InvalidInput(f"{where}: {err}") from None
    enc = tokenizer.encode(text, add_special_tokens=False)
    ids = np.asarray(enc.ids, dtype=np.int64)
    trained = assistant_mask(enc.offsets, spans)
    chars = sum(len(m["content"]) for m in messages if m["role"] == "assistant")
    return Example(ids=ids, trained=trained, assistant_chars=chars, where=where)


def template_roles(ids: Sequence[int], im_start: int, im_end: int, decode, header_end: str | None = None) -> list[str]:
    """Per token, its part of the template, from the ids alone: ``"marker"`` (``<|bos|>`` before the
    first turn, ``<|im_start|>``, the role header up to its newline, the newline after a turn), or the
    role whose content it is (``"system"``, ``"user"``, ``"assistant"``; the ``<|im_end|>`` closing a
    turn belongs to that turn's role).

    Args:
        ids: a conversation's token ids (possibly cut short).
        im_start, im_end: the markers' ids.
        decode: ``decode([id]) -> str`` with special tokens kept.
        header_end: the text of a token closing the role name (Llama 3's ``<|end_header_id|>``; the
            whitespace tokens after its newline are the header's too: its template trims the content), or None.
    """
    roles = ["marker"] * len(ids)
    role, i = None, 0
    while i < len(ids):
        t = int(ids[i])
        if t == im_start:
            header, j = "", i + 1
            while j < len(ids) and "\n" not in header:
                header += decode([int(ids[j])])
                j += 1
            role = header.split("\n", 1)[0]
            role, i = (role.replace(header_end, "") if header_end else role).strip(), j  # header tokens: "marker"
            while header_end and i < len(ids) and not decode([int(ids[i])]).strip():
                i += 1  # the blank line after Llama 3's header, in as many tokens as the tokenizer splits it
            continue
        if role is not None:
            roles[i] = role
            if t == im_end:
                role = None
        i += 1
    return roles


def check_loss_mask(
    examples: Sequence[Example], *, im_start: int, im_end: int, decode, header_end: str | None = None
) -> dict[str, int]:
    """The loss-mask guard: every trained target is an assistant token, and every assistant token is trained.

    The roles are re-derived from the token ids (:func:`template_roles`), independently of how the
    mask was made, for every conversation. Run before step 1 of a fine-tuning run.

    Returns:
        ``{"conversations", "tokens", "trained"}`` counts.
    Raises:
        GuardError: naming what the mask gets wrong: tokens of other roles trained (per role, with
            the first conversation at fault), assistant tokens left out, or nothing trained at all.
    """
    wrong: dict[str, int] = {}
    missing, trained, tokens, first = 0, 0, 0, None
    for ex in examples:
        roles = template_roles(ex.ids, im_start, im_end, decode, header_end)
        want = np.array([r == "assistant" for r in roles], dtype=bool)
        if ex.trained.shape != want.shape:
            raise GuardError(f"loss mask: {ex.where}: {ex.trained.shape[0]} mask entries for {want.shape[0]} tokens")
        for i in np.flatnonzero(ex.trained & ~want):
            wrong[roles[i]] = wrong.get(roles[i], 0) + 1
            first = first or ex.where
        missing += int((want & ~ex.trained).sum())
        trained += int(ex.trained.sum())
        tokens += len(ex.ids)
    if trained == 0:
        raise GuardError(
            f"loss mask: it masks every token of all {len(examples)} conversations ({tokens} tokens): "
            "nothing would be trained (the assistant replies and their <|im_end|> must be targets)"
        )
    problems = []
    if wrong:
        what = ", ".join(f"{n} {role} tokens" for role, n in sorted(wrong.items()))
        problems.append(f"it trains on tokens that are not the assistant's: {what} (first in {first})")
    if missing:
        problems.append(f"it leaves {missing} assistant tokens (replies or their <|im_end|>) untrained")
    if problems:
        raise GuardError("loss mask: " + "; ".join(problems) + "; the loss must be on assistant tokens only")
    return {"conversations": len(examples), "tokens": tokens, "trained": trained}


def fit_length(ex: Example, max_tokens: int) -> Example:
    """``ex`` cut to ``max_tokens`` tokens (the assistant characters counted only for what is kept)."""
    if len(ex.ids) <= max_tokens:
        return ex
    return Example(ex.ids[:max_tokens], ex.trained[:max_tokens], ex.assistant_chars, ex.where)


# ---- packing ---------------------------------------------------------------------------------


def pack_rows(examples: Sequence[Example], seq_len: int, pad_id: int) -> list[np.ndarray]:
    """Pack whole conversations, in the given order, into rows of ``seq_len`` positions (first fit).

    Each conversation of L tokens takes L - 1 positions (inputs ``ids[:-1]``, targets ``ids[1:]``).

    Returns:
        rows, each a (4, seq_len) int64 array: inputs, targets (-100 where not trained, and on
        padding), position ids (0.. per conversation), document ids (0.. per conversation; -1 on padding).
    Raises:
        ValueError: a conversation longer than ``seq_len + 1`` tokens (cut them with :func:`fit_length`).
    """
    rows: list[np.ndarray] = []
    row: list[Example] = []
    used = 0
    for ex in examples:
        n = len(ex.ids) - 1
        if n > seq_len:
            raise ValueError(f"{ex.where}: {len(ex.ids)} tokens do not fit seq_len {seq_len} + 1")
        if n < 1:
            continue
        if used + n > seq_len:
            rows.append(_row(row, seq_len, pad_id))
            row, used = [], 0
        row.append(ex)
        used += n
    if row:
        rows.append(_row(row, seq_len, pad_id))
    return rows


def _row(examples: Sequence[Example], seq_len: int, pad_id: int) -> np.ndarray:
    out = np.empty((4, seq_len), dtype=np.int64)
    out[0], out[1], out[2], out[3] = pad_id, IGNORE_INDEX, 0, -1
    at = 0
    for doc, ex in enumerate(examples):
        n = len(ex.ids) - 1
        out[0, at : at + n] = ex.ids[:-1]
        out[1, at : at + n] = np.where(ex.trained[1:], ex.ids[1:], IGNORE_INDEX)
        out[2, at : at + n] = np.arange(n)
        out[3, at : at + n] = doc
        at += n
    out[2, at:] = np.arange(seq_len - at)  # padding: its own positions, attended by nothing real
    return out


def to_batch(rows: Sequence[np.ndarray]) -> tuple[torch.Tensor, ...]:
    """``(inputs, targets, position_ids, document_ids)``, each (B, T) int64, from packed rows."""
    stacked = torch.from_numpy(np.stack(rows))  # (B, 4, T)
    return tuple(stacked[:, k].contiguous() for k in range(4))


class ChatBatches:
    """Deterministic, resumable batches of packed conversations (the trainer's ``data``).

    Each epoch shuffles the conversations with ``seed + epoch``, packs them (:func:`pack_rows`) and
    serves the rows ``batch_size * world_size`` at a time (rank r takes its slice); an epoch's last
    partial batch is completed from the next epoch.

    Args:
        examples: training conversations (already cut to ``seq_len + 1`` tokens).
        langs: the languages present (for per-language validation).
    """

    def __init__(
        self,
        examples: Sequence[Example],
        batch_size: int,
        seq_len: int,
        *,
        pad_id: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        langs: Sequence[str] = (),
    ) -> None:
        if not examples:
            raise InvalidInput("no training conversations (all held out, or none given)")
        self.examples, self.batch_size, self.seq_len, self.pad_id = list(examples), batch_size, seq_len, pad_id
        self.seed, self.rank, self.world_size, self.langs = seed, rank, world_size, list(langs)
        self.epoch, self.row = 0, 0
        self._rows = self._epoch_rows(0)

    def _epoch_rows(self, epoch: int) -> list[np.ndarray]:
        order = np.random.default_rng([self.seed, epoch]).permutation(len(self.examples))
        return pack_rows([self.examples[i] for i in order], self.seq_len, self.pad_id)

    def next_batch(self) -> tuple[torch.Tensor, ...]:
        rows = self.take_rows(self.batch_size * self.world_size)
        mine = rows[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]
        return to_batch(mine)

    def take_rows(self, count: int) -> list[np.ndarray]:
        """The next ``count`` packed rows of the global stream (every rank's), advancing the position."""
        rows = []
        for _ in range(count):
            if self.row >= len(self._rows):
                self.epoch, self.row = self.epoch + 1, 0
                self._rows = self._epoch_rows(self.epoch)
            rows.append(self._rows[self.row])
            self.row += 1
        return rows

    def state_dict(self) -> JSONObject:
        """JSON-able position: epoch and row within it, with the seed and languages it was made for."""
        return {"epoch": self.epoch, "row": self.row, "seed": self.seed, "langs": [*self.langs], "kind": "chat"}

    def load_state_dict(self, state: JSONObject) -> None:
        """Continue from :meth:`state_dict`.

        Raises:
            InvalidInput: a state made for another seed or other languages, or by the pretraining loader.
        """
        if state.get("kind") != "chat" or state.get("seed") != self.seed or state.get("langs") != self.langs:
            raise InvalidInput(
                f"data state {state} was not saved by a chat fine-tuning run with seed {self.seed} and "
                f"languages {self.langs}; resume with the same inputs and seed"
            )
        self.epoch = integer(state["epoch"], where="data state epoch")
        self.row = integer(state["row"], where="data state row")
        self._rows = self._epoch_rows(self.epoch)


class ReplayBatches:
    """Chat rows with pretraining windows mixed in (``[sft] replay_share``), deterministic and resumable.

    Global batch ``k`` (``batch_size * world_size`` rows) holds ``r_k = floor((k + 1) n s) - floor(k n s)``
    replay rows (``n`` rows per global batch, ``s`` the share as an exact fraction), so over any run of
    batches the replay rows are the share ``s`` of all rows to within one row; the rest are the next packed
    chat rows of ``chat``. A replay row is the next window of ``seq_len + 1`` tokens of ``pretrain`` (a
    one-row :class:`prodip.train.data.MixtureBatches` over the base's train shards: languages drawn by
    weight, windows in its seeded order), trained on every token exactly like pretraining (positions
    ``0..T-1``, one document id, so it may cross document boundaries as pretraining windows do). The
    chat rows come first in the global batch and the replay rows last; rank r keeps its slice.

    The share is of rows, not of trained tokens: a chat row trains only its assistant tokens, a replay
    row all ``T``, so replay's share of the trained tokens is larger than ``s``; ``tokens`` counts both
    (global, all ranks) and the run records them. The trainer weighs every trained target equally
    (``prodip.train.loop.train_step``), so a replay token weighs what a reply token weighs.

    Args:
        chat: the conversations' :class:`ChatBatches`.
        pretrain: a ``MixtureBatches`` with ``batch_size=1``, ``rank=0``, ``world_size=1``, split train,
            ``seq_len`` equal to ``chat.seq_len``.
        share: replay rows / all rows, in ``(0, 1)``.
    """

    def __init__(self, chat: ChatBatches, pretrain: Any, share: float) -> None:
        if not 0.0 < share < 1.0:
            raise InvalidInput(f"replay_share must be in (0, 1), got {share}")
        if pretrain.seq_len != chat.seq_len or pretrain.batch_size != 1 or pretrain.world_size != 1:
            raise ValueError("ReplayBatches: pretrain must serve one global row of chat.seq_len at a time")
        self.chat, self.pretrain, self.share = chat, pretrain, share
        self.fraction = Fraction(share).limit_denominator(10**6)
        self.langs = chat.langs
        self.batch_index = 0
        self.tokens = {"chat": 0, "replay": 0}  # trained targets served, all ranks
        self.replay_tokens_by_language = {lang: 0 for lang in pretrain.langs}

    def replay_rows(self, k: int) -> int:
        """Replay rows in global batch ``k``."""
        n = self.chat.batch_size * self.chat.world_size
        return math.floor((k + 1) * n * self.fraction) - math.floor(k * n * self.fraction)

    def next_batch(self) -> tuple[torch.Tensor, ...]:
        """This rank's ``(inputs, targets, position_ids, document_ids)``, each (B, T) int64."""
        n, T = self.chat.batch_size * self.chat.world_size, self.chat.seq_len
        r = self.replay_rows(self.batch_index)
        rows = self.chat.take_rows(n - r)
        self.tokens["chat"] += int(sum(int((row[1] != IGNORE_INDEX).sum()) for row in rows))
        for _ in range(r):
            before = dict(self.pretrain.positions)
            x, y = self.pretrain.next_batch()
            (lang,) = [k for k, v in self.pretrain.positions.items() if v != before[k]]  # the one it advanced
            row = np.empty((4, T), dtype=np.int64)
            row[0], row[1], row[2], row[3] = x[0].numpy(), y[0].numpy(), np.arange(T), 0
            rows.append(row)
            self.replay_tokens_by_language[lang] += T
        self.tokens["replay"] += r * T
        self.batch_index += 1
        lo = self.chat.rank * self.chat.batch_size
        return to_batch(rows[lo : lo + self.chat.batch_size])

    def state_dict(self) -> JSONObject:
        """JSON-able position: the chat stream's, the pretraining stream's, the batch count and token counts."""
        return {
            "kind": "chat+replay",
            "share": self.share,
            "batch_index": self.batch_index,
            "chat": self.chat.state_dict(),
            "replay": self.pretrain.state_dict(),
            "tokens": {k: n for k, n in self.tokens.items()},
            "replay_tokens_by_language": {k: n for k, n in self.replay_tokens_by_language.items()},
        }

    def load_state_dict(self, state: JSONObject) -> None:
        """Continue from :meth:`state_dict`.

        Raises:
            InvalidInput: a state saved without replay or with another share (or chat/replay stream).
        """
        if state.get("kind") != "chat+replay" or state.get("share") != self.share:
            raise InvalidInput(
                f"data state (kind {state.get('kind')!r}, replay share {state.get('share')}) was not saved by a "
                f"chat fine-tuning run with replay_share {self.share}; resume with the same replay_share"
            )
        self.chat.load_state_dict(obj(state["chat"], where="data state chat"))
        self.pretrain.load_state_dict(obj(state["replay"], where="data state replay"))
        self.batch_index = integer(state["batch_index"], where="data state batch_index")
        tokens = obj(state["tokens"], where="data state tokens")
        self.tokens = {k: integer(v, where=f"data state tokens.{k}") for k, v in tokens.items()}
        by_lang = obj(state["replay_tokens_by_language"], where="data state replay_tokens_by_language")
        self.replay_tokens_by_language = {
            k: integer(v, where=f"data state replay_tokens_by_language.{k}") for k, v in by_lang.items()
        }


def val_batches(examples: Sequence[Example], batch_size: int, seq_len: int, pad_id: int) -> list[tuple]:
    """Held-out conversations packed in file order, as batches (the last one may be smaller)."""
    rows = pack_rows(examples, seq_len, pad_id)
    return [to_batch(rows[i : i + batch_size]) for i in range(0, len(rows), batch_size)]


@torch.no_grad()
def assistant_loss(
    model: torch.nn.Module,
    examples: Sequence[Example],
    *,
    batch_size: int,
    seq_len: int,
    pad_id: int,
    device: torch.device,
) -> dict[str, float]:
    """Held-out loss on the assistant tokens of ``examples``: summed nats, tokens, characters.

    Returns:
        ``{"conversations", "assistant_tokens", "assistant_chars", "nll_nats_per_token",
        "bits_per_char"}``; bits/char = total nats / ln 2 / assistant characters (the replies' NFC
        characters; the ``<|im_end|>`` token's loss is counted, it has no characters).
    """
    model.eval()
    total, count = 0.0, 0
    for x, y, pos, doc in val_batches(examples, batch_size, seq_len, pad_id):
        x, y, pos, doc = (t.to(device) for t in (x, y, pos, doc))
        n = int((y != IGNORE_INDEX).sum())
        if n:
            total += float(model(x, labels=y, position_ids=pos, document_ids=doc)) * n
            count += n
    model.train()
    chars = sum(ex.assistant_chars for ex in examples)
    return {
        "conversations": len(examples),
        "assistant_tokens": count,
        "assistant_chars": chars,
        "nll_nats_per_token": total / count if count else math.nan,
        "bits_per_char": total / LN2 / chars if chars else math.nan,
    }
