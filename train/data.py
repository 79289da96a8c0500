"""Training batches from token shards: memory-mapped, per-language mixture, shuffled, exactly resumable.

Each language's train shards are one contiguous token stream (``prodip.tokenizer.shards.read_shard``
memmaps, in meta.json order, each shard's checksum and largest id checked on open). Sequence ``j``
of global batch ``k`` draws its language from the mixture weights with a generator seeded with
``(seed, k // 256)`` (a pure function of ``k``), then takes that language's next window of
``T + 1`` tokens (inputs ``[:T]``, targets ``[1:]``):

- ``order="shuffle"`` (the default): the stream is cut into ``n = (n_tokens - 1) // T``
  non-overlapping windows (window ``w`` starts at token ``w * T``; windows cross document
  boundaries, as packed pretraining does), and each epoch visits all ``n`` in a random order drawn
  from ``(seed, language, epoch)``: a new order every epoch, no window twice in one epoch, and no
  long run of one source (the file order of the corpus no longer shows in the loss curve). The
  last ``< T`` tokens of the stream are left out of that epoch.
- ``order="sequential"``: the stream in file order, advancing by ``T`` and wrapping around at the
  end (nanoGPT/llm.c style; prodip before the shuffle, kept for comparison and for resuming such runs).

Either way a language's position is one counter, ``positions[lang]`` (tokens consumed = windows
consumed x T), so the whole state is ``{"batch_index", "positions", "order", ...}``, JSON in the
checkpoint, and a resume continues the exact token stream.

Under DDP every rank walks the same global batch and keeps only its rows
``[rank * B, (rank + 1) * B)``, so W ranks with batch B see exactly the tokens one process with
batch W * B sees.

    python -c "from prodip.train.data import MixtureBatches as M; b = M('runs/demo/shards', {'bn': 1}, 4, 128); print(b.next_batch()[0].shape)"
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Optional

import numpy as np
import torch

from prodip.base.errors import InvalidInput
from prodip.base.jsontypes import JSONObject, integer, obj
from prodip.tokenizer.shards import load_meta, open_checked_shards
from prodip.train.config import ORDERS

log = logging.getLogger(__name__)

_BLOCK = 256  # global batches whose language draws are made at once
#: How a language's stream is walked (see the module docstring).


class _LangStream:
    """One language's train (or val) shards as a single virtual token array."""

    def __init__(self, shards_dir: str | os.PathLike, lang: str, split: str) -> None:

        self.arrays = [a for a in open_checked_shards(shards_dir, lang, split) if len(a)]
        self.starts = np.cumsum([0] + [len(a) for a in self.arrays])
        self.n_tokens = int(self.starts[-1])

    def take(self, start: int, count: int) -> np.ndarray:
        """``count`` tokens from offset ``start`` (wrapping around the end) as int64."""
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            pos = (start + filled) % self.n_tokens
            i = int(np.searchsorted(self.starts, pos, side="right")) - 1
            local = pos - int(self.starts[i])
            piece = self.arrays[i][local : local + count - filled]
            out[filled : filled + len(piece)] = piece
            filled += len(piece)
        return out


class _WindowOrder:
    """Start token of the ``k``-th window a language serves: a fresh permutation every epoch.

    Args:
        n_tokens: tokens in the language's stream.
        seq_len: T; windows are ``T + 1`` tokens starting every ``T`` tokens.
        seed, lang: with the epoch, seed the permutation (``numpy.random.default_rng``).
    """

    def __init__(self, n_tokens: int, seq_len: int, seed: int, lang: str) -> None:
        self.seq_len = seq_len
        self.n_windows = (n_tokens - 1) // seq_len
        # a stable 32-bit tag per language (Python's hash() of a str changes between processes)
        self.lang_key = int.from_bytes(hashlib.sha256(lang.encode("utf-8")).digest()[:4], "little")
        self.seed = seed
        self._cache: tuple[int, np.ndarray] = (-1, np.empty(0, dtype=np.int64))

    def start(self, k: int) -> int:
        """Token offset of window number ``k`` (0-based, counted over all epochs)."""
        epoch, i = divmod(k, self.n_windows)
        if self._cache[0] != epoch:
            rng = np.random.default_rng([self.seed, self.lang_key, epoch])
            self._cache = (epoch, rng.permutation(self.n_windows))
        return int(self._cache[1][i]) * self.seq_len


class MixtureBatches:
    """Deterministic, resumable (B, T) batches mixing languages by weight.

    Args:
        shards_dir: dir written by ``prodip data prepare``.
        mixture: language -> weight (>= 0, normalised here); languages missing from the
            shards are an error; an empty dict means all languages, weighted by token count.
        batch_size: sequences per micro-batch per rank (B).
        seq_len: tokens per sequence (T).
        seed: seeds the language draws.
        rank, world_size: DDP position; each rank yields its own B rows of a W*B global batch.
        split: ``"train"`` or ``"val"``.
        expected_tokenizer_sha256: refuse shards encoded with another tokenizer.
        order: ``"shuffle"`` (windows in a new random order each epoch) or ``"sequential"``
            (file order); see the module docstring.
        pin_memory: return batches in page-locked host memory (needs CUDA), so that
            ``.to("cuda", non_blocking=True)`` overlaps with compute (nanoGPT's ``get_batch``).

    Raises:
        ValueError: unknown language, no positive weight, a language with fewer than T+1
            tokens, an unknown ``order``, tokenizer hash mismatch (from
            ``prodip.tokenizer.shards.load_meta``), a shard whose checksum or largest id does not
            match meta.json (from ``prodip.tokenizer.shards.open_checked_shards``, naming the file).
        FileNotFoundError: meta.json or a shard missing.
    """

    def __init__(
        self,
        shards_dir: str | os.PathLike,
        mixture: dict[str, float],
        batch_size: int,
        seq_len: int,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        split: str = "train",
        expected_tokenizer_sha256: Optional[str] = None,
        order: str = "shuffle",
        pin_memory: bool = False,
    ) -> None:
        if order not in ORDERS:
            raise InvalidInput(f"data order must be one of {ORDERS}, got {order!r}")
        self.order = order
        self.meta = load_meta(shards_dir, expected_tokenizer_sha256=expected_tokenizer_sha256)
        known = self.meta.languages
        if not mixture:
            mixture = {lang: float(sum(e.n_tokens for e in v.split(split))) for lang, v in known.items()}
        unknown = sorted(set(mixture) - set(known))
        if unknown:
            raise InvalidInput(
                f"TrainConfig.mixture ([train] mixture) names language(s) {', '.join(unknown)} absent from "
                f"{shards_dir}/meta.json (has {', '.join(sorted(known))})"
            )
        self.langs = sorted(lang for lang, w in mixture.items() if w > 0)
        if not self.langs:
            raise InvalidInput(f"mixture {mixture} has no language with a positive weight")
        weights = np.array([mixture[lang] for lang in self.langs], dtype=np.float64)
        self.weights = weights / weights.sum()
        self.streams = {lang: _LangStream(shards_dir, lang, split) for lang in self.langs}
        for lang, stream in self.streams.items():
            if stream.n_tokens < seq_len + 1:
                raise InvalidInput(
                    f"{shards_dir}: language {lang!r} split {split!r} has {stream.n_tokens} "
                    f"tokens, fewer than seq_len + 1 = {seq_len + 1}"
                )
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.windows = {lang: _WindowOrder(s.n_tokens, seq_len, seed, lang) for lang, s in self.streams.items()}
        self.rank, self.world_size = rank, world_size
        self.pin_memory = pin_memory
        self.batch_index = 0
        self.positions = {lang: 0 for lang in self.langs}
        self._block_cache: tuple[int, np.ndarray] = (-1, np.empty(0))

    def _languages(self, batch_index: int) -> np.ndarray:
        """Language index of each of the W*B sequences of global batch ``batch_index``.

        Drawn per block of ``_BLOCK`` batches from a generator seeded with ``(seed, block)``
        (cheap per batch, yet a pure function of the batch index, so resuming needs no RNG state).
        """
        block, row = divmod(batch_index, _BLOCK)
        if self._block_cache[0] != block:
            rng = np.random.default_rng([self.seed, block])
            u = rng.random((_BLOCK, self.batch_size * self.world_size))
            cdf = np.cumsum(self.weights)
            cdf[-1] = 1.0  # guard against rounding: every u in [0, 1) maps to a language
            self._block_cache = (block, np.searchsorted(cdf, u, side="right").astype(np.int32))
        return self._block_cache[1][row]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next micro-batch of this rank.

        Returns:
            inputs (B, T) int64 and targets (B, T) int64 (inputs shifted by one token), CPU
            (pinned with ``pin_memory``).
        """
        T = self.seq_len
        rows = []
        lo, hi = self.rank * self.batch_size, (self.rank + 1) * self.batch_size
        for j, li in enumerate(self._languages(self.batch_index)):
            lang = self.langs[li]
            if lo <= j < hi:
                rows.append(self.streams[lang].take(self._start(lang), T + 1))
            self.positions[lang] += T
        self.batch_index += 1
        buf = torch.from_numpy(np.stack(rows))
        x, y = buf[:, :-1].contiguous(), buf[:, 1:].contiguous()
        if self.pin_memory:
            return x.pin_memory(), y.pin_memory()
        return x, y

    def _start(self, lang: str) -> int:
        """Offset in ``lang``'s stream of its next window (``positions[lang]`` counts tokens served)."""
        if self.order == "sequential":
            return self.positions[lang]
        return self.windows[lang].start(self.positions[lang] // self.seq_len)

    def state_dict(self) -> JSONObject:
        """JSON-able position: batches drawn, per-language tokens served (not wrapped), the order."""
        return {
            "batch_index": self.batch_index,
            "positions": {lang: n for lang, n in self.positions.items()},
            "seed": self.seed,
            "langs": [*self.langs],
            "order": self.order,
        }

    def load_state_dict(self, state: JSONObject) -> None:
        """Continue from :meth:`state_dict`.

        A state without ``order`` was written before the shuffle existed: it walked the streams
        sequentially.

        Raises:
            ValueError: the state was made with other languages, another seed or another order.
        """
        if state.get("langs") != self.langs or state.get("seed") != self.seed:
            raise InvalidInput(
                f"data state was saved for languages {state.get('langs')} seed "
                f"{state.get('seed')}, this run uses {self.langs} seed {self.seed}; "
                "resume with the same mixture and seed (or start from its weights with --init-from)"
            )
        saved_order = state.get("order", "sequential")
        if saved_order != self.order:
            raise InvalidInput(
                f"data state was saved with data_order = {saved_order!r}, this run uses {self.order!r}; "
                f"resume with --data-order {saved_order}"
            )
        self.batch_index = integer(state["batch_index"], where="data state batch_index")
        positions = obj(state["positions"], where="data state positions")
        self.positions = {lang: integer(v, where=f"data state positions.{lang}") for lang, v in positions.items()}

    def epochs(self) -> dict[str, float]:
        """Passes over each language's stream so far (fractional)."""
        return {lang: self.positions[lang] / self.streams[lang].n_tokens for lang in self.langs}


def val_batches(
    shards_dir: str | os.PathLike, lang: str, seq_len: int, batch_size: int, max_tokens: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed validation batches from the start of ``lang``'s val shards.

    Returns:
        list of (inputs (B', T) int64, targets (B', T) int64), at most ``max_tokens`` input
        tokens in all, non-overlapping windows; empty if the split has < T+1 tokens (the caller
        then has no validation loss for ``lang``: absent, never 0).
    """
    stream = _LangStream(shards_dir, lang, "val")
    if stream.n_tokens < seq_len + 1:
        return []
    n_seq = min(max(1, max_tokens // seq_len), (stream.n_tokens - 1) // seq_len)
    out = []
    for start in range(0, n_seq, batch_size):
        rows = [stream.take(i * seq_len, seq_len + 1) for i in range(start, min(n_seq, start + batch_size))]
        buf = torch.from_numpy(np.stack(rows))
        out.append((buf[:, :-1].contiguous(), buf[:, 1:].contiguous()))
    return out
