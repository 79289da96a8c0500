"""Fixtures of the tokenizer tests: a small real corpus (slices of the bundled demo corpus) and a tokenizer."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from prodip.tokenizer.bpe import TokenizerTrainConfig, train_tokenizer

REPO = Path(__file__).resolve().parents[2]


def skip_or_fail(reason: str) -> None:
    """Skip a runtime test whose package is not installed; fail instead under CI's
    ``PRODIP_REQUIRE_RUNTIMES=1`` (.ci/run), where every runtime is installed."""
    if os.environ.get("PRODIP_REQUIRE_RUNTIMES") == "1":
        pytest.fail(f"{reason} (PRODIP_REQUIRE_RUNTIMES=1)")
    pytest.skip(reason)


def _bn_docs(n_chars: int) -> list[str]:
    docs, size = [], 0
    with gzip.open(REPO / "data/bn/bn_pd_literature_majantali_site.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            docs.append(json.loads(line)["text"][:4000])
            size += len(docs[-1])
            if size >= n_chars:
                break
    return docs


def _en_text(n_chars: int) -> str:
    with gzip.open(REPO / "data/en/pg1342_Pride-and-Prejudice.txt.gz", "rt", encoding="utf-8") as fh:
        return fh.read(n_chars)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """{bn: folder with a .jsonl, en: folder with a .txt}: ~60k characters each of the demo corpus."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "bn").mkdir()
    (root / "en").mkdir()
    with open(root / "bn/part.jsonl", "w", encoding="utf-8") as fh:
        for doc in _bn_docs(60_000):
            fh.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
    (root / "en/part.txt").write_text(_en_text(60_000), encoding="utf-8")
    # the records of the slices: the bundled files' own (data/sources.toml), found beside the corpus
    (root / "sources.toml").write_text(
        '[[source]]\nname = "majantali-site"\nfiles = ["bn/part.jsonl"]\nlanguage = "bn"\n'
        'license = "LicenseRef-PublicDomain"\n\n'
        '[[source]]\nname = "gutenberg-pride-and-prejudice"\nfiles = ["en/part.txt"]\nlanguage = "en"\n'
        'license = "LicenseRef-PublicDomain"\n',
        encoding="utf-8",
    )
    return {"bn": root / "bn", "en": root / "en"}


@pytest.fixture(scope="session")
def tok_dir(corpus, tmp_path_factory) -> Path:
    """The default (portable) tokenizer, vocab 1024, trained on ``corpus``."""
    out = tmp_path_factory.mktemp("tok") / "tok"
    cfg = TokenizerTrainConfig(
        inputs={k: [str(v)] for k, v in corpus.items()},
        out_dir=str(out),
        vocab_size=1024,
        proportions={"bn": 0.6, "en": 0.4},
    )
    return train_tokenizer(cfg)


@pytest.fixture(scope="session")
def custom_tok_dir(corpus, tmp_path_factory) -> Path:
    """The opt-in custom tokenizer (vocab 1024, 20% superwords) trained on ``corpus``."""
    out = tmp_path_factory.mktemp("custom") / "tok"
    cfg = TokenizerTrainConfig(
        inputs={k: [str(v)] for k, v in corpus.items()},
        out_dir=str(out),
        vocab_size=1024,
        proportions={"bn": 0.6, "en": 0.4},
        kind="custom",
        superword_share=0.2,
    )
    return train_tokenizer(cfg)


@pytest.fixture(scope="session")
def heldout(tmp_path_factory) -> dict[str, Path]:
    """Held-out files: the bundled UDHR texts (never in ``corpus``)."""
    return {"bn": REPO / "data/heldout/udhr_ben.txt", "en": REPO / "data/heldout/udhr_eng.txt"}


def prepare_args(corpus, tok_dir, out: Path, *more: str) -> list[str]:
    """`prodip data prepare` arguments for the tests' corpus and tokenizer into ``out``, plus ``more``."""
    return [
        "data",
        "prepare",
        "--tokenizer-dir",
        str(tok_dir),
        "--inputs",
        f"bn={corpus['bn']},en={corpus['en']}",
        "--out-dir",
        str(out),
        "--progress",
        "false",
        *more,
    ]
