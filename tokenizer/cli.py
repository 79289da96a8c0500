"""Command line of the tokenizer stage: ``prodip tokenizer train|audit|extend`` and ``prodip data prepare``.

Each verb reads an optional ``--config TOML`` (sections ``[tokenizer]``, ``[audit]``, ``[data]``) and
``--kebab-case`` flags generated from its config dataclass; flags override the file.

    python -m prodip.tokenizer train --inputs bn=data/bn,en=data/en --vocab-size 8192 --out-dir runs/tok
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from prodip.base.config import add_arguments, resolve
from prodip.base.errors import StageFailed
from prodip.tokenizer.audit import format_table, run_audit
from prodip.tokenizer.bpe import train_tokenizer
from prodip.tokenizer.config import AuditConfig, DataPrepareConfig, ExtendConfig, TokenizerTrainConfig
from prodip.tokenizer.encode import prepare_shards
from prodip.tokenizer.shards import load_meta

# (group, verb, config class, TOML section, one-line help)
_VERBS: list[tuple[str, str, type[Any], str, str]] = [
    (
        "tokenizer",
        "train",
        TokenizerTrainConfig,
        "tokenizer",
        "train the portable BPE tokenizer (or the custom kind, or the naive baseline) into a tokenizer dir",
    ),
    (
        "tokenizer",
        "audit",
        AuditConfig,
        "audit",
        "fertility per language and runtime parity on held-out text -> fertility.json + tables; exit 2 if "
        "the gate fails",
    ),
    (
        "tokenizer",
        "extend",
        ExtendConfig,
        "extend",
        "append tokens learned on a corpus to a base model's byte-level BPE (every base id kept), resize its "
        "embeddings -> a new Hugging Face folder + extension.json; if the fertility gate fails, exit 2 "
        "and write nothing",
    ),
    (
        "data",
        "prepare",
        DataPrepareConfig,
        "data",
        "encode a corpus into per-language train/val token shards + meta.json",
    ),
]
_GROUP_HELP = {
    "tokenizer": "train, audit and gate a Bangla-aware BPE tokenizer, or extend a base model's",
    "data": "encode a corpus into token shards with a tokenizer dir",
}


def _cfg(args: argparse.Namespace) -> Any:
    return resolve(args._cls, args, toml_path=args.config, section=args._section)


def _train(args: argparse.Namespace) -> int:
    out = train_tokenizer(_cfg(args))
    print(f"tokenizer written to {out}")
    return 0


def _audit(args: argparse.Namespace) -> int:
    report = run_audit(_cfg(args))
    print(format_table(report))
    if not report.gate.passed:  # one line, exit 2, as every failed gate (docs/pipeline.md)
        raise StageFailed("fertility gate failed: " + "; ".join(report.gate.failures))
    return 0


def _extend(args: argparse.Namespace) -> int:
    from prodip.tokenizer.extend import extend, format_record  # noqa: PLC0415

    cfg = _cfg(args)
    if args.base_folder:
        cfg = dataclasses.replace(cfg, base=args.base_folder)
    record = extend(cfg)
    print(format_record(record))
    if not record["gate"]["passed"]:  # nothing was written (extend); one line, exit 2, as every failed gate
        raise StageFailed(
            "fertility gate failed: " + "; ".join(record["gate"]["failures"]) + f"; nothing written to {record['out']}"
        )
    return 0


def _prepare(args: argparse.Namespace) -> int:
    out = prepare_shards(_cfg(args))
    meta = load_meta(out)
    for lang, info in meta.languages.items():
        n = {s: sum(e.n_tokens for e in info.split(s)) for s in ("train", "val")}
        print(
            f"{lang}: {n['train']:,} train + {n['val']:,} val tokens from {info.documents.get('train', 0)} + "
            f"{info.documents.get('val', 0)} documents ({info.bytes / 1e6:.2f} MB)"
        )
    print(
        f"shards written to {out} at {meta.mb_per_s or 0:.2f} MB/s"
        + (f"; skipped {meta.skipped_bytes} undecodable bytes" if meta.skipped_bytes else "")
    )
    return 0


_FUNCS = {"train": _train, "audit": _audit, "extend": _extend, "prepare": _prepare}


def add_subcommands(subparsers, only: str | None = None) -> None:
    """Register ``tokenizer`` (train, audit) and ``data`` (prepare) on the ``prodip`` subparsers.

    Args:
        subparsers: the object returned by ``parser.add_subparsers()``.
        only: register just this group (``"tokenizer"`` or ``"data"``); None = both.
    """
    groups = {}
    for group, verb, cls, section, help_text in _VERBS:
        if only is not None and group != only:
            continue
        if group not in groups:
            parser = subparsers.add_parser(group, help=_GROUP_HELP[group], description=_GROUP_HELP[group])
            groups[group] = parser.add_subparsers(dest="verb", metavar="VERB")
        leaf = groups[group].add_parser(verb, help=help_text, description=help_text)
        leaf.add_argument(
            "--config", metavar="TOML", default=None, help=f"TOML file; its [{section}] table sets the options below"
        )
        if verb == "extend":
            leaf.add_argument(
                "base_folder", nargs="?", metavar="BASE", default=None, help="the base folder (overrides [extend] base)"
            )
        add_arguments(leaf, cls, section=section)
        leaf.set_defaults(func=_FUNCS[verb], _cls=cls, _section=section)
