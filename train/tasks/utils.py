"""Loaders of the bundled lm-evaluation-harness tasks (``custom_dataset: !function utils.load_jsonl`` in the
YAML files here): the task's ``dataset_kwargs.file`` read from this folder, so the tasks run from any working
directory and never touch the network.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

HERE = Path(__file__).resolve().parent


def load_jsonl(file: str, split: str = "test", **_: Any) -> datasets.DatasetDict:
    """``{split: Dataset}`` of the JSONL file ``file`` beside this module (one record per line).

    lm-evaluation-harness calls it with the task's ``metadata`` and ``dataset_kwargs`` as keywords; the other
    keywords are ignored.

    Raises:
        FileNotFoundError: no such file here.
    """
    path = HERE / file
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return datasets.DatasetDict({split: datasets.Dataset.from_list(rows)})


def sentence_chrf(references: list[str], predictions: list[str], **_: Any) -> float:
    """chrF (0-100) of one reply against its reference: sacrebleu's ``sentence_chrf`` at its defaults
    (character 6-grams, no word n-grams, beta 2; Popović 2015, https://aclanthology.org/W15-3049), the per-item
    metric of the chat tasks (``metric: !function utils.sentence_chrf``, aggregation mean).

    The mean over items has the harness's analytic standard error; lm-eval's corpus-level ``chrf`` would need a
    bootstrap of 100 corpus scores for its error bar (about 2 s per task and model for 100 items).
    """
    import sacrebleu  # noqa: PLC0415 (only the chat tasks score with it)

    return float(sacrebleu.sentence_chrf(predictions[0], [references[0]]).score)
