"""What every runtime adapter shares: the jobs it is given, the typed outputs it returns, the base class,
and the greedy-decoding helpers the ONNX Runtime reference uses (stop ids, cutting at the end of sequence).

An adapter never raises for its runtime's failure where it can say it: :class:`GreedyOutput` and
:class:`ChatOutput` carry the ids or an ``error``; the loops in :mod:`prodip.conformance.runtimes.check` and
:mod:`prodip.conformance.chat` turn an exception an adapter lets out into such an error too.

    python -c "from prodip.conformance.runtimes.common import stop_ids; print(stop_ids('runs/demo/export'))"
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from prodip.base.runtimes import by_name, missing_reason
from prodip.conformance.runtimes.timing import SpeedJob, Timing

#: The Node scripts (beside the conformance package's modules, shipped as its package data).
SCRIPTS_DIR = Path(__file__).resolve().parents[1]
#: Timeout of one Node run (s): loading 4 variants and decoding 2 prompts of a small model takes seconds.
NODE_TIMEOUT_S = 900


def node_root() -> Path:
    """The folder whose ``node_modules`` holds the Node runtimes: ``$PRODIP_NODE_ROOT``, else the repository's
    ``node/`` (its ``package.json``; ``npm install --ignore-scripts --prefix node``)."""
    env = os.environ.get("PRODIP_NODE_ROOT")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "node"


def error_text(err: BaseException, limit: int = 600) -> str:
    """``"<Type>: <message>"``, the message cut to ``limit`` characters: how a failure is recorded."""
    return f"{type(err).__name__}: {str(err).strip()[:limit]}"


def _stops(eos_id: Union[None, int, Collection[int]]) -> frozenset[int]:
    return frozenset() if eos_id is None else frozenset([eos_id] if isinstance(eos_id, int) else eos_id)


def stop_ids(export_dir: Path) -> list[int]:
    """The ids that end generation by the export's ``generation_config.json`` (``eos_token_id``, an int or a
    list), else ``config.json``'s: what every runner here stops at."""
    for name in ("generation_config.json", "config.json"):
        path = Path(export_dir) / name
        if path.is_file():
            eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
            if eos is not None:
                return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    return []


def truncate_at_eos(ids: Sequence[int], prompt_len: int, eos_id: Union[None, int, Collection[int]]) -> list[int]:
    """``ids`` up to and including the first generated id of ``eos_id`` (an id, or the ids that end generation:
    a chat model's ``<|eos|>`` and ``<|im_end|>``); the prompt is never cut."""
    ids = [int(i) for i in ids]
    stops = _stops(eos_id)
    for j in range(prompt_len, len(ids)):
        if ids[j] in stops:
            return ids[: j + 1]
    return ids


def runner_greedy(
    runner: Any,
    prompt: Sequence[int],
    max_new_tokens: int,
    eos_id: Union[None, int, Collection[int]],
    step_logits: Optional[list] = None,
) -> list[int]:
    """Greedy ids (prompt + new) from a conformance runner, batch 1, no padding, KV cache.

    Args:
        runner: a :class:`prodip.conformance.runners.Runner` (ONNX Runtime or the training model).
        prompt: token ids.
        max_new_tokens: new tokens at most (tokens).
        eos_id: stop after generating this id, or any of these ids (it is included), or None.
        step_logits: if given, each step's last-row logits (float32 [vocab]) are appended to it.
    """
    stops = _stops(eos_id)
    ids = [int(i) for i in prompt]
    x = np.asarray([ids], np.int64)
    logits, state = runner.forward(x, np.ones_like(x), np.arange(len(ids), dtype=np.int64)[None])
    for step in range(max_new_tokens):
        if step_logits is not None:
            step_logits.append(np.asarray(logits[0, -1], np.float32))
        nxt = int(np.argmax(logits[0, -1]))
        ids.append(nxt)
        if nxt in stops or step + 1 == max_new_tokens:
            break
        n = len(ids)
        logits, state = runner.forward(
            np.asarray([[nxt]], np.int64), np.ones((1, n), np.int64), np.asarray([[n - 1]], np.int64), state
        )
    return ids


def ort_greedy(path: Path, name: str, job: GreedyJob) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """ONNX Runtime's greedy ids (cut at the job's stop ids) and each step's logits, per prompt, on ``path``."""
    from prodip.conformance.runners import OrtRunner  # noqa: PLC0415 (onnxruntime; adapters import this module)

    cfg = job.model_cfg
    runner = OrtRunner(
        path,
        name,
        num_layers=cfg.num_hidden_layers,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        threads=job.threads,
    )
    logits: list[list[np.ndarray]] = [[] for _ in job.prompts]
    ids = [
        truncate_at_eos(runner_greedy(runner, p, job.max_new_tokens, job.eos, steps), len(p), job.eos)
        for p, steps in zip(job.prompts, logits)
    ]
    return ids, logits


def run_node(script: str, job: dict[str, Any], timeout: int = NODE_TIMEOUT_S) -> dict[str, Any]:
    """Run the Node script ``script`` (in :data:`SCRIPTS_DIR`) with ``job`` as JSON on stdin; its last stdout line
    as JSON.

    Raises:
        FileNotFoundError: ``node`` is not on PATH.
        RuntimeError: the script exited non-zero (its stderr tail in the message).
    """
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError("node is not on PATH (the Node runtimes need Node >= 18)")
    path = SCRIPTS_DIR / script
    proc = subprocess.run(
        [node, str(path)], input=json.dumps(job), capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"node {path.name} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@dataclass
class GreedyJob:
    """What an on-device runtime decodes: every ONNX candidate, greedily, from the same prompts.

    Attributes:
        export_dir: the export dir.
        candidates: the ONNX candidates (``name``, ``variant``, ``path`` relative to the dir, ``tolerance_table``).
        prompts: token ids per prompt (already cut to fit the context with the new tokens).
        max_new_tokens: new tokens per prompt.
        eos: the ids that end generation (the export's stop ids).
        model_cfg: the model's ``ModelConfig`` (layers, kv heads, head dim: the KV-cache inputs' shapes).
        threads: intra-op threads (0 = library default).
    """

    export_dir: Path
    candidates: Sequence[Any]
    prompts: list[list[int]]
    max_new_tokens: int
    eos: list[int]
    model_cfg: Any
    threads: int = 0


@dataclass
class GreedyOutput:
    """One runtime's greedy decoding of one candidate.

    Attributes:
        ids: prompt + new ids per prompt, cut at the runtime's stop ids (None: it failed, see ``error``).
        error: why it failed.
        skipped: why it did not run (not installed, and missing runtimes are skipped).
        logits: each step's last-row logits per prompt (runtimes with a logits metric), else None.
        versions: the runtime's package versions.
        dtype: the runtime's own name of the variant's file (transformers.js's dtype), if it has one.
        reference: what the ids are compared with when it is not ONNX Runtime on the file as it is (described).
        reference_ids / reference_logits: that reference's greedy ids and step logits.
    """

    ids: Optional[list[list[int]]] = None
    error: Optional[str] = None
    skipped: Optional[str] = None
    logits: Optional[list[list[list[float]]]] = None
    versions: Optional[dict[str, Any]] = None
    dtype: Optional[str] = None
    reference: Optional[str] = None
    reference_ids: Optional[list[list[int]]] = None
    reference_logits: Optional[list[list[np.ndarray]]] = None


@dataclass
class ChatJob:
    """What a runtime renders for the chat contract.

    Attributes:
        export_dir: the export dir.
        manifest: its ``ExportManifest``.
        conversations: name -> OpenAI messages.
        reference_texts: name -> the reference's rendered text (for a runtime with no template engine).
        end_of_turn: the end-of-turn token's id (None: the tokenizer lacks it; then it stops nowhere).
        checked: the manifest's records of the variants checked, in manifest order.
        selected: the on-device runtimes ``--runtimes`` chose.
        stop_ids: the export's stop set (generation_config.json ``eos_token_id``; what prodip serve stops at).
    """

    export_dir: Path
    manifest: Any
    conversations: dict[str, list[dict[str, str]]]
    reference_texts: dict[str, str]
    end_of_turn: Optional[int]
    checked: list[Any]
    selected: frozenset[str]
    stop_ids: list[int]

    @property
    def formats(self) -> frozenset[str]:
        """The formats of the variants checked (``"onnx"``, ``"gguf"``, ``"pte"``, ...)."""
        return frozenset(v.format for v in self.checked)

    def first(self, fmt: str) -> Any:
        """The first checked variant of format ``fmt`` (its manifest record).

        Raises:
            LookupError: none is checked (an adapter asked for a format its ``chat_applies`` did not require).
        """
        for v in self.checked:
            if v.format == fmt:
                return v
        raise LookupError(f"no {fmt} variant is checked")


@dataclass
class ChatOutput:
    """One runtime's part of the chat contract.

    Attributes:
        ids: conversation -> ids its own template and tokenizer give (None: it renders none, as prodip serve).
        stop_ids: the ids that end its generation (None: unknown).
        end_of_turn_stops: the end of turn is one of them.
        version: the runtime's version.
        note: what was checked where it differs from the others.
        error: why it failed; skipped: why it did not run (not installed).
    """

    ids: Optional[dict[str, list[int]]] = None
    stop_ids: Optional[list[int]] = None
    end_of_turn_stops: Optional[bool] = None
    version: Optional[str] = None
    note: Optional[str] = None
    error: Optional[str] = None
    skipped: Optional[str] = None

    @property
    def ran(self) -> bool:
        return self.skipped is None

    @property
    def renders(self) -> bool:
        return self.ids is not None or self.error is not None

    def to_dict(self, reference: dict[str, list[int]]) -> dict[str, Any]:
        """The report's form: ``{skipped}``, ``{error}``, or ``{ids, stop_ids, end_of_turn_stops, version?,
        note?, identical?}`` (``identical``: ids equal ``reference``)."""
        if self.skipped is not None:
            return {"skipped": self.skipped}
        if self.error is not None:
            return {"error": self.error}
        out: dict[str, Any] = {"ids": self.ids}
        for key in ("stop_ids", "end_of_turn_stops", "version", "note"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.ids is not None:
            out["identical"] = self.ids == reference
        return out


class RuntimeAdapter:
    """One runtime's work for conformance. Subclasses set ``name`` (a row of ``prodip.base.runtimes.RUNTIMES``)
    and implement :meth:`greedy` (rows with a greedy metric) and/or :meth:`chat` (rows with ``chat``), and
    :meth:`time_generation` (rows marked ``timed``: the card's speed table, on the variants of the row's
    ``formats``)."""

    name: str = ""

    def available(self) -> Optional[str]:
        """Why the runtime cannot run here (not installed; the message says how to install it), or None."""
        return missing_reason(by_name(self.name), node_root())

    def greedy(self, job: GreedyJob) -> dict[str, GreedyOutput]:
        """Candidate name -> its greedy decoding in this runtime (every candidate of ``job``)."""
        raise NotImplementedError(f"{self.name} decodes no ONNX variant")

    def chat_applies(self, job: ChatJob) -> bool:
        """Whether the chat checks run this runtime: by default when a checked variant has a format it runs
        (an on-device runtime also only when ``--runtimes`` chose it)."""
        row = by_name(self.name)
        if row.greedy_metric and self.name not in job.selected:
            return False
        return bool(set(row.formats) & job.formats)

    def chat(self, job: ChatJob) -> ChatOutput:
        """Its rendering of ``job``'s conversations and its stop ids."""
        raise NotImplementedError(f"{self.name} renders no chat template")

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        """Candidate name -> its timed greedy generation in this runtime (every candidate of ``job``; see
        :mod:`prodip.conformance.runtimes.timing`). A candidate that fails gets a :class:`Timing` with ``error``."""
        raise NotImplementedError(f"{self.name} times no generation")
