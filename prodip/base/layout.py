"""Where each artifact of a ``prodip run`` lives under the run's ``out_dir``.

Both ``prodip run`` and the stage commands read this: a stage command given a pipeline file
(a TOML file with a top-level ``out_dir``, such as ``configs/demo.toml``) reads and writes the
same paths ``prodip run`` would, so ``prodip tokenizer train --config configs/demo.toml`` and
then ``prodip train --config configs/demo.toml`` chain; a stage command without one uses the
paths of ``DEFAULT_OUT_DIR`` (``runs/demo``), so ``prodip tokenizer train``, ``prodip data
prepare`` and ``prodip train`` alone chain too.

    python -c "from prodip.base.layout import paths; print(paths('runs/demo'))"
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

#: Default ``out_dir`` of a pipeline file that names none, and of a stage command run without one.
DEFAULT_OUT_DIR = Path("runs") / "demo"

#: The config tables of a pipeline file, one per stage config (``prodip.pipeline.SECTIONS`` lists the same).
TABLES = ("tokenizer", "audit", "extend", "data", "model", "train", "eval", "sft", "export", "conformance", "serve")
#: Tables a stage command reads that ``prodip run`` does not run (none now: ``[extend]``, the vocabulary
#: extension of an imported base, is the tokenizer stage's when it names a ``base``).
COMMAND_TABLES: tuple[str, ...] = ()
#: Top-level keys of a pipeline file whose value is a TOML table but that are not stage tables.
TOP_LEVEL_TABLE_KEYS = ("completion_prompts", "chat_prompts")


def paths(out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Artifact paths of a run: ``{"tokenizer", "shards", "train", "eval", "export", "conformance"}``.

    Args:
        out_dir: the run's folder (``out_dir`` of the pipeline file).
    Returns:
        Stage artifact name -> path (folders, except ``eval``: ``train/eval.json``; ``sft`` is the
        chat fine-tuning run dir).
    """
    out = Path(out_dir)
    return {
        "tokenizer": out / "tokenizer",
        "shards": out / "shards",
        "train": out / "train",
        "eval": out / "train" / "eval.json",
        "sft": out / "sft",
        "export": out / "export",
        # inside the export, where `prodip conformance EXPORT_DIR` writes it too: one place, and a
        # re-export (which replaces the folder) takes the old report with it
        "conformance": out / "export" / "conformance",
    }


def has_sft(doc: Mapping[str, object]) -> bool:
    """Whether a pipeline file fine-tunes for chat: its ``[sft]`` table names conversations (``inputs``)."""
    table = doc.get("sft")
    return isinstance(table, dict) and bool(table.get("inputs"))


def stage_defaults(out_dir: str | os.PathLike[str], *, chat: bool = False) -> dict[str, dict[str, str]]:
    """Path fields each config table gets before its TOML table is applied (the table may override them).

    Args:
        out_dir: the run's folder.
        chat: the run fine-tunes for chat (:func:`has_sft`): export and conformance take the
            fine-tuned checkpoint (``sft``) instead of the pretrained one (``train``).
    Returns:
        Table name (``tokenizer``, ``audit``, ``data``, ``model``, ``train``, ``eval``, ``export``,
        ``conformance``, ``serve``) -> ``{field: path string}``.
    """
    p = {k: str(v) for k, v in paths(out_dir).items()}
    final = p["sft"] if chat else p["train"]  # the checkpoint that is exported
    return {
        "tokenizer": {"out_dir": p["tokenizer"]},
        "audit": {"tokenizer_dir": p["tokenizer"]},
        # an adapted base: the extended folder (tokenizer and resized weights) is the run's tokenizer dir
        "extend": {"out": p["tokenizer"]},
        "data": {"tokenizer_dir": p["tokenizer"], "out_dir": p["shards"]},
        "model": {},
        "train": {"shards_dir": p["shards"], "tokenizer_dir": p["tokenizer"], "out_dir": p["train"]},
        "eval": {"checkpoint": p["train"], "shards_dir": p["shards"], "out": p["eval"]},
        "sft": {"init_from": p["train"], "out_dir": p["sft"]},
        "export": {"checkpoint": final, "out": p["export"]},
        "conformance": {
            "export_dir": p["export"],
            "checkpoint": final,
            "out": p["conformance"],
            "shards_dir": p["shards"],
            "eval_json": p["eval"],
        },
        "serve": {"export_dir": p["export"]},
    }
