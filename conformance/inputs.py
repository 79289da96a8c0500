"""The fixed conformance inputs: prompt texts, how they become batches, and held-out windows.

The prompt set is fixed in this file (so every report compares like with like): Bangla,
English, mixed script, a single token, a prompt that fills the context window, and a left-padded
batch of unequal lengths. Held-out text comes from the validation shards when a shards dir is
given. All token ids come from the *training* tokenizer (the checkpoint's ``tokenizer/``).

    python -c "from prodip.conformance.inputs import PROMPTS; print(list(PROMPTS))"
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from prodip.base.errors import InvalidInput
from prodip.tokenizer.shards import load_meta, open_checked_shards

#: Prompt texts (NFC). Short on purpose: long-position behaviour is covered by the context prompt.
PROMPTS = {
    "bn": "বাংলাদেশের রাজধানী ঢাকা। নদীমাতৃক এই দেশে পদ্মা, মেঘনা আর যমুনা বয়ে চলে, আর বর্ষায় গ্রামের মাঠ সবুজ হয়ে ওঠে।",
    "en": "The old ferry crosses the wide river every morning, carrying farmers, students and "
    "baskets of fresh fish to the market town.",
    "mixed": "আমি Python দিয়ে একটি small language model train করছি; loss এখন 2.5, আর Dhaka-র weather আজ বেশ ভালো।",
}
#: Rows of the left-padded batch: (prompt, number of leading tokens kept); unequal on purpose.
PADDED_ROWS = (("bn", None), ("en", 5), ("mixed", 12))
#: Prompts decoded greedily (as one left-padded batch).
GREEDY_PROMPTS = ("bn", "en", "mixed")


@dataclass
class Item:
    """One batch fed to every runner.

    Attributes:
        name: label in the report (``prompt:bn``, ``padded_batch``, ``heldout:en``).
        input_ids: (B, T) int64, left-padded with ``pad_id``.
        attention_mask: (B, T) int64, 0 on padding.
        targets: (B, T) int64 next tokens for NLL (-1 where there is none), held-out items only.
        n_chars: characters of the text the targets spell (held-out items only).
    """

    name: str
    input_ids: np.ndarray
    attention_mask: np.ndarray
    targets: Optional[np.ndarray] = None
    n_chars: int = 0
    lang: str = ""

    @property
    def position_ids(self) -> np.ndarray:
        """(B, T) int64: ``cumsum(mask) - 1`` clipped at 0 (CONTRACTS.md left-padding rule)."""
        return np.clip(np.cumsum(self.attention_mask, axis=-1) - 1, 0, None).astype(np.int64)

    @property
    def valid(self) -> np.ndarray:
        return self.attention_mask.astype(bool)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad token lists into ``(input_ids (B, T) int64, attention_mask (B, T) int64)``."""
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), T), dtype=np.int64)
    for i, r in enumerate(rows):
        if r:
            ids[i, T - len(r) :] = r
            mask[i, T - len(r) :] = 1
    return ids, mask


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` without special tokens (the model sees exactly these)."""
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


@dataclass
class InputSet:
    """Everything the suite feeds the runners, built once from the training tokenizer."""

    items: list[Item]
    padded_rows: list[list[int]]
    greedy: Item
    kv_ids: np.ndarray
    texts: dict[str, str] = field(default_factory=dict)
    heldout: dict[str, dict[str, int]] = field(default_factory=dict)

    def longest(self, greedy_tokens: int) -> int:
        """Tokens of the longest sequence any check feeds one row: an item, the greedy batch plus the
        ``greedy_tokens`` it decodes, or the KV-cache sequence (what a runtime's context must hold)."""
        return max(
            max(i.input_ids.shape[1] for i in self.items),
            self.greedy.input_ids.shape[1] + greedy_tokens,
            self.kv_ids.shape[1],
        )

    def rows(self) -> int:
        """The most rows (sequences) of any batch fed at once."""
        return max(max(i.input_ids.shape[0] for i in self.items), self.greedy.input_ids.shape[0], 1)


def build_inputs(
    tokenizer: Any,
    *,
    context_tokens: int,
    pad_id: int,
    greedy_tokens: int,
    kv_tokens: int,
    shards_dir: Optional[str | Path] = None,
    heldout_files: Optional[dict[str, str]] = None,
    heldout_tokens: int = 0,
    tokenizer_sha256: Optional[str] = None,
) -> InputSet:
    """Build the prompt items, the greedy batch, the KV-cache sequence and held-out windows.

    Args:
        tokenizer: the training tokenizer (``tokenizers.Tokenizer``).
        context_tokens: the model's ``max_position_embeddings`` (tokens); the context prompt
            has exactly this many tokens and no prompt is longer.
        pad_id: id used for left padding.
        greedy_tokens: new tokens to decode; greedy prompts are cut to leave room for them.
        kv_tokens: length (tokens) of the KV-cache check sequence (capped by the context; 0 = the
            whole context window).
        shards_dir: optional shards dir; its ``val`` split gives held-out windows per language.
        heldout_files: or language -> UTF-8 text file (:func:`heldout_file_items`).
        heldout_tokens: tokens per language taken from the start of the validation shards.
        tokenizer_sha256: the training tokenizer's hash; shards encoded with another are refused.
    Raises:
        ValueError: a prompt encodes to no tokens, or the shards' tokenizer differs.
    """
    ids = {name: encode(tokenizer, text)[:context_tokens] for name, text in PROMPTS.items()}
    for name, row in ids.items():
        if not row:
            raise InvalidInput(f"conformance prompt {name!r} encodes to no tokens with the training tokenizer")
    stream: list[int] = []
    while len(stream) < context_tokens:
        for name in PROMPTS:
            stream += ids[name]
    items = [Item(f"prompt:{n}", *left_pad([row], pad_id)) for n, row in ids.items()]
    items.append(Item("prompt:single", *left_pad([ids["bn"][:1]], pad_id)))
    items.append(Item("prompt:context", *left_pad([stream[:context_tokens]], pad_id)))
    padded_rows = [ids[n][:k] if k else ids[n] for n, k in PADDED_ROWS]
    items.append(Item("padded_batch", *left_pad(padded_rows, pad_id)))
    room = max(1, context_tokens - greedy_tokens)
    greedy = Item("greedy", *left_pad([ids[n][:room] for n in GREEDY_PROMPTS], pad_id))
    kv_len = context_tokens if kv_tokens == 0 else min(kv_tokens, context_tokens)
    kv_ids = np.asarray([stream[: max(2, kv_len)]], dtype=np.int64)
    heldout: dict[str, dict[str, int]] = {}
    if shards_dir and heldout_tokens > 0:
        for item in heldout_items(
            tokenizer,
            shards_dir,
            context_tokens=context_tokens,
            heldout_tokens=heldout_tokens,
            tokenizer_sha256=tokenizer_sha256,
        ):
            items.append(item)
            heldout[item.lang] = {"tokens": int(item.attention_mask.sum()), "chars": item.n_chars}
    elif heldout_files and heldout_tokens > 0:
        for item in heldout_file_items(
            tokenizer, heldout_files, context_tokens=context_tokens, heldout_tokens=heldout_tokens
        ):
            items.append(item)
            heldout[item.lang] = {"tokens": int(item.attention_mask.sum()), "chars": item.n_chars}
    return InputSet(items, padded_rows, greedy, kv_ids, texts=dict(PROMPTS), heldout=heldout)


def heldout_file_items(
    tokenizer: Any, files: dict[str, str], *, context_tokens: int, heldout_tokens: int
) -> list[Item]:
    """One item per language from a held-out text file, windowed as :func:`heldout_items` does.

    The file is read as UTF-8, NFC-normalised and encoded with the tokenizer's default encode (the
    bos its post-processor prepends, if any, starts the stream as a document's does in the shards);
    the first ``heldout_tokens`` tokens are cut into windows of ``min(context_tokens, heldout_tokens)``.

    Raises:
        InvalidInput: a file that is not UTF-8 or encodes to fewer than 2 tokens (file named).
    """
    out = []
    for lang in sorted(files):
        path = Path(files[lang])
        try:
            text = unicodedata.normalize("NFC", path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise InvalidInput(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
        flat = np.asarray(tokenizer.encode(text).ids[:heldout_tokens], dtype=np.int64)
        item = _windows_item(tokenizer, lang, flat, min(context_tokens, heldout_tokens))
        if item is None:
            raise InvalidInput(f"{path}: held-out text for {lang!r} encodes to {len(flat)} tokens; at least 2 needed")
        out.append(item)
    return out


def heldout_items(
    tokenizer: Any, shards_dir: str | Path, *, context_tokens: int, heldout_tokens: int, tokenizer_sha256: Optional[str]
) -> list[Item]:
    """One item per language: the first ``heldout_tokens`` validation tokens cut into windows.

    Windows are ``min(context_tokens, heldout_tokens)`` long (a shorter last window is dropped,
    unless it is the only one). The targets are each window's next tokens; characters are
    counted on the decoded target text, for bits per character.

    Raises:
        FileNotFoundError, ValueError: from ``prodip.tokenizer.shards`` (missing/corrupt shards, hash mismatch).
    """

    meta = load_meta(shards_dir, expected_tokenizer_sha256=tokenizer_sha256)
    out = []
    for lang in sorted(meta.languages):
        tokens = []
        for shard in open_checked_shards(shards_dir, lang, "val"):
            tokens.append(np.asarray(shard[: heldout_tokens - sum(map(len, tokens))], dtype=np.int64))
            if sum(map(len, tokens)) >= heldout_tokens:
                break
        flat = np.concatenate(tokens) if tokens else np.zeros(0, np.int64)
        item = _windows_item(tokenizer, lang, flat, min(context_tokens, heldout_tokens))
        if item is not None:
            out.append(item)
    return out


def _windows_item(tokenizer: Any, lang: str, flat: np.ndarray, window: int) -> Optional[Item]:
    """``flat`` (int64 token ids) cut into windows of ``min(window, len(flat))`` tokens (a shorter last
    window dropped), as one ``heldout:LANG`` item: targets are each window's next tokens (-1 after the last),
    characters counted on the decoded target text (for bits per character). None when under 2 tokens."""
    W = min(window, len(flat))
    if W < 2:
        return None
    windows = flat[: (len(flat) // W) * W].reshape(-1, W)
    targets = np.full_like(windows, -1)
    targets[:, :-1] = windows[:, 1:]
    n_chars = sum(len(tokenizer.decode([int(t) for t in w[1:]], skip_special_tokens=False)) for w in windows)
    return Item(f"heldout:{lang}", windows, np.ones_like(windows), targets=targets, n_chars=n_chars, lang=lang)
