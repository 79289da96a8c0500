"""Training batches from token shards: memory-mapped, per-language mixture, exactly resumable.

Each language's train shards are one contiguous token stream (``prodip.tokenizer.shards.read_shard``
memmaps, in meta.json order). Sequence ``j`` of global batch ``k`` draws its language from the
mixture weights with a generator seeded with ``(seed, k // 256)`` (a pure function of ``k``), then takes the next ``T + 1``
tokens of that language's stream (inputs ``[:T]``, targets ``[1:]``) and advances it by ``T``
(nanoGPT/llm.c style), wrapping around at the end (counted as an epoch). The whole state is
``{"batch_index", "positions": {lang: token offset}}``, JSON in the checkpoint, so a resume
continues the exact token stream.

Under DDP every rank walks the same global batch and keeps only its rows
``[rank * B, (rank + 1) * B)``, so W ranks with batch B see exactly the tokens one process with
batch W * B sees.

    python -c "from train.data import MixtureBatches as M; b = M('runs/demo/shards', {'bn': 1}, 4, 128); print(b.next_batch()[0].shape)"
"""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np
import torch

from prodip.base.errors import InvalidInput
from prodip.tokenizer.shards import load_meta, read_shard, shard_paths

_BLOCK = 256  # global batches whose language draws are made at once


class _LangStream:
    """One language's train (or val) shards as a single virtual token array."""

    def __init__(self, shards_dir: str | os.PathLike, lang: str, split: str) -> None:

        self.arrays = [a for a in (read_shard(p) for p in shard_paths(shards_dir, lang, split)) if len(a)]
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
        pin_memory: return batches in page-locked host memory (needs CUDA), so that
            ``.to("cuda", non_blocking=True)`` overlaps with compute (nanoGPT's ``get_batch``).

    Raises:
        ValueError: unknown language, no positive weight, a language with fewer than T+1
            tokens, tokenizer hash mismatch (from ``prodip.tokenizer.shards.load_meta``).
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
        pin_memory: bool = False,
    ) -> None:

        self.meta = load_meta(shards_dir, expected_tokenizer_sha256=expected_tokenizer_sha256)
        known = self.meta["languages"]
        if not mixture:
            mixture = {lang: float(sum(e["n_tokens"] for e in v.get(split, []))) for lang, v in known.items()}
        unknown = sorted(set(mixture) - set(known))
        if unknown:
            raise InvalidInput(
                f"mixture names language(s) {', '.join(unknown)} absent from "
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
                rows.append(self.streams[lang].take(self.positions[lang], T + 1))
            self.positions[lang] += T
        self.batch_index += 1
        buf = torch.from_numpy(np.stack(rows))
        x, y = buf[:, :-1].contiguous(), buf[:, 1:].contiguous()
        if self.pin_memory:
            return x.pin_memory(), y.pin_memory()
        return x, y

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: batches drawn and per-language token offsets (not wrapped)."""
        return {
            "batch_index": self.batch_index,
            "positions": dict(self.positions),
            "seed": self.seed,
            "langs": list(self.langs),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`.

        Raises:
            ValueError: the state was made with other languages or another seed.
        """
        if state.get("langs") != self.langs or state.get("seed") != self.seed:
            raise InvalidInput(
                f"data state was saved for languages {state.get('langs')} seed "
                f"{state.get('seed')}, this run uses {self.langs} seed {self.seed}; "
                "resume with the same mixture and seed"
            )
        self.batch_index = int(state["batch_index"])
        self.positions = {lang: int(v) for lang, v in state["positions"].items()}

    def epochs(self) -> dict[str, float]:
        """Passes over each language's stream so far (fractional)."""
        return {lang: self.positions[lang] / self.streams[lang].n_tokens for lang in self.langs}


def val_batches(
    shards_dir: str | os.PathLike, lang: str, seq_len: int, batch_size: int, max_tokens: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed validation batches from the start of ``lang``'s val shards.

    Returns:
        list of (inputs (B', T) int64, targets (B', T) int64), at most ``max_tokens`` input
        tokens in all, non-overlapping windows; empty if the split has < T+1 tokens.
    """
    stream = _LangStream(shards_dir, lang, "val")
    n_seq = min(max(1, max_tokens // seq_len), (stream.n_tokens - 1) // seq_len)
    out = []
    for start in range(0, n_seq, batch_size):
        rows = [stream.take(i * seq_len, seq_len + 1) for i in range(start, min(n_seq, start + batch_size))]
        buf = torch.from_numpy(np.stack(rows))
        out.append((buf[:, :-1].contiguous(), buf[:, 1:].contiguous()))
    return out
