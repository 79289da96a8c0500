"""``prodip eval``: held-out NLL and bits per character of a checkpoint vs its random-initialised twin.

Per language, the first ``eval_tokens`` validation tokens after the stream's first token
(``prodip.tokenizer.shards``: each document is ``<|bos|> ids <|eos|>`` and a shard starts at a document
start, so the first window's context starts with ``<|bos|>``, as every document in training and every
prompt does; lm-evaluation-harness's rolling windows start with the same token; with a tokenizer that
prepends no bos, meta.json ``bos_id`` null, documents are ``ids eos`` and the first token is context only) are
cut into non-overlapping windows of ``seq_len`` target tokens (each window is a fresh context),
scored in batches under ``torch.no_grad``. Reported per language and model:

- ``nll_nats_per_token``: mean next-token cross-entropy (nats/token);
- ``bits_per_char``: total NLL in bits / Unicode characters of the decoded scored tokens
  (``tokenizer.decode`` of the target tokens, special tokens skipped, so ``<|eos|>`` and ``<|bos|>``
  predictions count in the NLL but add no characters). This is comparable across tokenizers.

The random twin has the same config and is initialised by ``reset_parameters(seed=seed)``; its
NLL is the "nothing learned" baseline (about ln V for a small init std). ``--baseline`` scores a second
model beside them: on the same token ids when it shares the checkpoint's tokenizer; with another tokenizer
(the base before its vocabulary was extended) on the same text, each language's scored documents decoded
and re-encoded in the baseline tokenizer's own layout (:func:`text_stream`), compared in bits/char, the
tokenizer-independent figure (its ``tokens``/``chars`` are its own). Optionally scores a
multiple-choice JSONL file ``{"context": str, "choices": [str, ...], "answer": int}`` by
log-likelihood: ``acc`` (argmax of the summed log-probability of the choice tokens) and
``acc_norm`` (argmax of the summed log-probability divided by the number of Unicode characters of
the choice, the lm-evaluation-harness ``acc_norm`` idea with characters instead of bytes).
Results go to ``eval.json`` (in the run dir, or ``--out``) and are printed as a table.

    prodip eval --checkpoint runs/demo --shards-dir runs/demo/shards --eval-tokens 65536
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional, TypedDict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from prodip.base.errors import InvalidInput
from prodip.base.files import file_sha256
from prodip.base.jsontypes import JSONObject
from prodip.base.records import refuse_newer
from prodip.tokenizer.bpe import document_end_id, load_with_specials
from prodip.tokenizer.shards import load_meta, meta_sha256, open_checked_shards
from prodip.train import lmeval
from prodip.train.checkpoint import load_model
from prodip.train.config import EvalConfig
from prodip.train.mc import read_mc, score_mc
from prodip.train.model import LlamaForCausalLM
from prodip.train.records import EVAL_FILE, EvalReport

log = logging.getLogger("prodip.eval")

FORMAT_VERSION = 1
LN2 = math.log(2.0)


# ---- scoring -------------------------------------------------------------------------------


@torch.no_grad()
def window_nll(
    model: nn.Module, tokens: torch.Tensor, seq_len: int, batch_size: int, device: torch.device, desc: str = ""
) -> tuple[float, int]:
    """Total next-token NLL over a token stream cut into non-overlapping windows.

    Args:
        model: causal LM, ``model(input_ids (B, T) int64) -> logits (B, T, V)``.
        tokens: (N,) int64 stream; targets are ``tokens[1:]`` (N-1 of them), each window's inputs
            are the ``seq_len`` tokens before its targets (windows do not share context).
        seq_len: targets per window (tokens); the last window may be shorter.
        batch_size: windows per forward.
        device: where to run.
        desc: progress-bar label.

    Returns:
        (total NLL in nats, number of target tokens scored).
    """

    n_targets = tokens.numel() - 1
    starts = list(range(0, n_targets, seq_len))
    full = [s for s in starts if s + seq_len <= n_targets]
    total, count = 0.0, 0
    batches = [full[i : i + batch_size] for i in range(0, len(full), batch_size)]
    if len(full) < len(starts):
        batches.append([starts[-1]])  # the shorter tail window, alone
    for group in tqdm(batches, desc=desc, unit="batch", leave=False, disable=None):
        T = min(seq_len, n_targets - group[0])
        rows = torch.stack([tokens[s : s + T + 1] for s in group]).to(device)  # (B, T+1)
        logits = model(rows[:, :-1]).float()  # (B, T, V)
        nll = F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum")
        total += float(nll)
        count += rows[:, 1:].numel()
    return total, count


def read_val_tokens(shards_dir: str | Path, lang: str, budget_tokens: int) -> np.ndarray:
    """The first ``budget_tokens`` validation tokens of ``lang`` (or all there are), (N,) int64.

    Raises:
        ValueError: the language has no validation tokens.
    """

    parts, have = [], 0
    for shard in open_checked_shards(shards_dir, lang, "val"):  # checksum and ids checked, file named
        if have >= budget_tokens:
            break
        take = min(len(shard), budget_tokens - have)
        parts.append(np.asarray(shard[:take], dtype=np.int64))
        have += take
    tokens = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    if len(tokens) == 0:
        raise InvalidInput(
            f"{shards_dir}: language {lang!r} has no validation tokens "
            "(re-run `prodip data prepare` with more validation documents)"
        )
    return tokens


def count_chars(tokenizer: Any, token_ids: Sequence[int]) -> int:
    """Unicode characters (code points) of the decoded tokens, special tokens skipped.

    The whole stream is decoded at once (not per token), so multi-byte characters that a
    byte-level BPE splits across tokens stay whole (a Bangla letter is 3 UTF-8 bytes). A stream
    that starts at a document start has no partial character at the front; a character cut at
    the end of the budget decodes to U+FFFD replacement characters and counts as one character
    (its first byte was scored).
    """
    text = tokenizer.decode([int(t) for t in token_ids], skip_special_tokens=True)
    clean = text.rstrip("\ufffd")
    return len(clean) + (1 if len(clean) < len(text) else 0)


def nll_summary(total_nats: float, n_tokens: int, n_chars: int) -> dict[str, float]:
    """NLL figures from totals: nats/token, perplexity and bits/char (= total / ln 2 / chars)."""
    per_token = total_nats / n_tokens
    return {
        "nll_nats_total": total_nats,
        "nll_nats_per_token": per_token,
        "perplexity": math.exp(per_token) if per_token < 700 else math.inf,
        "bits_per_char": total_nats / LN2 / n_chars if n_chars else math.nan,
    }


# ---- multiple choice -----------------------------------------------------------------------


# ---- the command ---------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available else cpu; anything else as given to ``torch.device``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def default_out(checkpoint_dir: Path) -> Path:
    """``RUN_DIR/eval.json`` for ``RUN_DIR/checkpoints/step_N``; else next to the step dir (never
    inside it: that would add an unlisted file to the checkpoint's manifest)."""
    parent = checkpoint_dir.parent
    return (parent.parent if parent.name == "checkpoints" else parent) / EVAL_FILE


def _eval_languages(
    cfg: EvalConfig,
    models: dict[str, nn.Module],
    tokenizer: Any,
    tokenizer_sha256: str,
    vocab_size: int,
    device: torch.device,
    other: Optional[OwnTokenizerBaseline] = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Per-language rows, and the languages skipped for want of validation tokens (with why); ``other``: a
    baseline with its own tokenizer, scored on the same documents' text."""

    meta = load_meta(cfg.shards_dir, expected_tokenizer_sha256=tokenizer_sha256)
    if meta.vocab_size > vocab_size:
        raise InvalidInput(
            f"{cfg.shards_dir}/meta.json: vocab_size {meta.vocab_size} exceeds the model's "
            f"{vocab_size}; these shards are not for this checkpoint"
        )
    langs = list(cfg.languages) or sorted(meta.languages)
    unknown = [lang for lang in langs if lang not in meta.languages]
    if unknown:
        raise InvalidInput(
            f"EvalConfig.languages: {unknown} not in {cfg.shards_dir}/meta.json "
            f"(has {', '.join(sorted(meta.languages))})"
        )
    results, skipped = {}, {}
    for lang in langs:
        if not cfg.languages and not any(e.n_tokens for e in meta.languages[lang].val):
            log.warning("%s: language %r has no validation tokens; skipped", cfg.shards_dir, lang)
            skipped[lang] = "no validation tokens"
            continue
        # the stream starts at a document start: the bos (the context of the first scored token), or the
        # document's first token where the tokenizer prepends none (meta.json bos_id null)
        stream = torch.from_numpy(read_val_tokens(cfg.shards_dir, lang, cfg.eval_tokens + 1))
        if meta.bos_id is not None and int(stream[0]) != meta.bos_id:
            raise InvalidInput(
                f"{cfg.shards_dir}: {lang} validation tokens start with id {int(stream[0])}, not the bos "
                f"({meta.bos_id}, meta.json bos_id); re-run `prodip data prepare`"
            )
        n_chars = count_chars(tokenizer, stream[1:].tolist())
        row: dict[str, Any] = {"tokens": stream.numel() - 1, "chars": n_chars}
        for name, model in models.items():
            total, count = window_nll(model, stream, cfg.seq_len, cfg.batch_size, device, f"{lang} {name}")
            assert count == row["tokens"]
            row[name] = nll_summary(total, count, n_chars)
        if other is not None:  # a baseline with its own tokenizer: the same documents as text
            docs = stream_documents(tokenizer, stream.tolist(), doc_end=meta.eos_id, bos_id=meta.bos_id)
            own = torch.as_tensor(text_stream(other.tokenizer, other.specials, docs), dtype=torch.int64)
            seq = min(cfg.seq_len, other.max_position_embeddings)
            total, count = window_nll(other.model, own, seq, cfg.batch_size, device, f"{lang} baseline")
            chars = sum(len(text) for text, _ in docs)
            row["baseline"] = {
                **nll_summary(total, count, chars),
                "tokens": count,
                "chars": chars,
                "chars_per_token": chars / count,
                "tokenizer_sha256": other.tokenizer_sha256,
            }
        results[lang] = row
    if not results:
        raise InvalidInput(
            f"{cfg.shards_dir}: no language has validation tokens (re-run `prodip data prepare` "
            "with a larger --val-fraction)"
        )
    return results, skipped


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Score a checkpoint and its random-initialised twin; write ``eval.json`` atomically.

    Returns:
        The dict written to ``eval.json``: ``{format_version, created_utc, out, checkpoint: {path,
        step, model_sha256}, tokenizer_sha256, shards_dir, config, units, languages: {lang:
        {tokens, chars, trained: {nll_nats_total, nll_nats_per_token, perplexity, bits_per_char},
        random_init: {...}}}, skipped_languages: {lang: reason} (languages without validation
        tokens, when ``languages`` is not given), mc: null | {file, normalisation, trained:
        {n_items, acc, acc_norm, chance}, random_init: {...}}, tasks: null | {settings, rows} (lm-evaluation-harness
        tasks on both models: :func:`score_tasks`), elapsed_s}``.

    Raises:
        ValueError: no checkpoint / nothing to score, ``seq_len`` > ``max_position_embeddings``,
            shards from another tokenizer or vocabulary, an unknown language, a bad MC file.
        FileNotFoundError: checkpoint, shards or MC file missing.
        FileExistsError: the ``eval.json`` to write was written by a newer prodip (its format_version named;
            left as it is).
    """

    if not cfg.checkpoint:
        raise InvalidInput("EvalConfig.checkpoint is required (--checkpoint RUN_DIR, made by `prodip train`)")
    if not cfg.shards_dir and not cfg.mc_file and not cfg.tasks:
        raise InvalidInput(
            "nothing to score: give --shards-dir (validation NLL/bpc), --mc FILE.jsonl and/or --tasks NAME[,NAME]"
        )
    tm = lmeval.task_manager(cfg.tasks, cfg.task_paths) if cfg.tasks else None  # unknown names: before any scoring
    t0 = time.perf_counter()
    device = resolve_device(cfg.device)
    model, mcfg, info = load_model(cfg.checkpoint, map_location=device)
    if cfg.seq_len == 0:  # the default: the whole context window the model was trained for
        cfg = dataclasses.replace(cfg, seq_len=mcfg.max_position_embeddings)
    if cfg.shards_dir and cfg.seq_len > mcfg.max_position_embeddings:
        raise InvalidInput(
            f"EvalConfig.seq_len={cfg.seq_len} exceeds the checkpoint's "
            f"max_position_embeddings={mcfg.max_position_embeddings}"
        )
    twin = LlamaForCausalLM(mcfg)
    twin.reset_parameters(seed=cfg.seed)
    models = {"trained": model.eval(), "random_init": twin.to(device).eval()}
    other = None
    if cfg.baseline:
        baseline = load_baseline(cfg.baseline, info["tokenizer_sha256"])
        if isinstance(baseline, OwnTokenizerBaseline):
            if cfg.mc_file or cfg.tasks:
                raise InvalidInput(
                    f"--baseline {cfg.baseline}: its tokenizer differs from the checkpoint's; it is compared on "
                    "held-out text (bits/char) only, not on --mc or --tasks"
                )
            other = dataclasses.replace(baseline, model=baseline.model.to(device).eval())
        else:
            models["baseline"] = baseline.to(device).eval()
    tokenizer, specials = load_with_specials(info["tokenizer_dir"])
    # the token a context follows, as in the shards: the bos, or where the tokenizer prepends none the end of
    # the document before (lm-evaluation-harness's HF model takes the eos then too)
    doc_end = document_end_id(tokenizer, specials)
    prefix = specials.bos_id if specials.add_bos and specials.bos_id is not None else doc_end
    out = Path(cfg.out) if cfg.out else default_out(Path(info["checkpoint_dir"]))
    refuse_newer(EvalReport, out, action="prodip eval", instead="give another --out")  # before the scoring
    result: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "out": str(out),
        "checkpoint": {"path": str(info["checkpoint_dir"]), "step": info["step"], "model_sha256": info["model_sha256"]},
        "tokenizer_sha256": info["tokenizer_sha256"],
        "shards_dir": cfg.shards_dir or None,
        "shards_meta_sha256": meta_sha256(cfg.shards_dir) if cfg.shards_dir else None,
        "config": dataclasses.asdict(cfg),
        "units": {
            "nll_nats_per_token": "nats/token",
            "nll_nats_total": "nats",
            "bits_per_char": "bits per Unicode character of the decoded scored tokens (special tokens skipped)",
            "tokens": "target tokens scored",
        },
        "languages": {},
        "skipped_languages": {},
        "mc": None,
        "tasks": None,
    }
    if cfg.shards_dir:
        result["languages"], result["skipped_languages"] = _eval_languages(
            cfg, models, tokenizer, info["tokenizer_sha256"], mcfg.vocab_size, device, other
        )
    if cfg.mc_file:
        items = read_mc(cfg.mc_file)
        result["mc"] = {
            "file": str(cfg.mc_file),
            "normalisation": "characters of the choice (NFC code points)",
            **{
                name: score_mc(m, tokenizer, items, device, mcfg.max_position_embeddings, prefix, cfg.batch_size)
                for name, m in models.items()
            },
        }
    if cfg.tasks:
        chat = lmeval.chat_format(info["tokenizer_dir"])  # None for a base model: its chat tasks are left out
        result["tasks"] = score_tasks(
            cfg, models, tokenizer, mcfg, device, tm, bos_id=prefix, eos_id=doc_end, chat=chat
        )
    result["elapsed_s"] = round(time.perf_counter() - t0, 3)
    out.parent.mkdir(parents=True, exist_ok=True)
    EvalReport.from_dict(result, out).write(out)
    return result


@dataclass(frozen=True)
class OwnTokenizerBaseline:
    """A ``--baseline`` with a tokenizer of its own (the base before its vocabulary was extended).

    Attributes:
        model: the baseline model (fp32).
        tokenizer: its ``tokenizers.Tokenizer``; specials: its special-token convention.
        tokenizer_sha256: sha256 of its ``tokenizer.json``.
        max_position_embeddings: its context window (tokens): its windows are at most this long.
    """

    model: nn.Module
    tokenizer: Any
    specials: Any
    tokenizer_sha256: str
    max_position_embeddings: int


def load_baseline(path: str, tokenizer_sha256: str) -> nn.Module | OwnTokenizerBaseline:
    """The ``--baseline`` model (fp32, CPU): a prodip checkpoint or a Hugging Face Llama folder
    (:func:`prodip.train.init.load_init`). With the checkpoint's ``tokenizer.json`` it is the model alone
    (scored on the same token ids); with another it comes with its tokenizer (:class:`OwnTokenizerBaseline`,
    scored on the same text).

    Raises:
        InvalidInput: a Hugging Face folder without ``tokenizer.json``; see :func:`prodip.train.init.load_init`.
    """
    from prodip.train import init  # noqa: PLC0415 (only a baseline needs it)

    tok_dir: Optional[Path] = None
    if init.is_prodip_checkpoint(Path(path)):
        _, _, info = load_model(path)
        if info["tokenizer_sha256"] != tokenizer_sha256:
            tok_dir = Path(info["tokenizer_dir"])
    elif Path(path).exists():
        tok_json = Path(path) / "tokenizer.json"
        if not tok_json.is_file():
            raise InvalidInput(
                f"--baseline {path}: no tokenizer.json; a baseline is scored with its own tokenizer or the checkpoint's"
            )
        if file_sha256(tok_json) != tokenizer_sha256:
            tok_dir = Path(path)
    source = init.load_init(path, tokenizer_sha256=tokenizer_sha256 if tok_dir is None else None, option="--baseline")
    model = LlamaForCausalLM(source.config)
    init.apply_init(model, source)
    if tok_dir is None:
        return model
    tok, specials = load_with_specials(tok_dir)
    return OwnTokenizerBaseline(
        model.eval(), tok, specials, file_sha256(tok_dir / "tokenizer.json"), source.config.max_position_embeddings
    )


def stream_documents(
    tokenizer: Any, ids: Sequence[int], *, doc_end: int, bos_id: Optional[int]
) -> list[tuple[str, bool]]:
    """The documents of a shard token stream as text: ``[(text, ended), ...]``, split at ``doc_end`` (``ended``:
    the document's end token is in the stream; the last one, cut by the token budget, may lack it), the
    ``bos_id`` dropped, a character cut at the end of the stream (decoded as U+FFFD) dropped."""
    docs: list[tuple[str, bool]] = []
    cur: list[int] = []
    for t in (int(i) for i in ids):
        if t == doc_end:
            docs.append((tokenizer.decode(cur, skip_special_tokens=True), True))
            cur = []
        elif t != bos_id:
            cur.append(t)
    if cur:
        docs.append((tokenizer.decode(cur, skip_special_tokens=True).rstrip("\ufffd"), False))
    return [(text, ended) for text, ended in docs if text or ended]


def text_stream(tokenizer: Any, specials: Any, docs: Sequence[tuple[str, bool]]) -> list[int]:
    """``docs`` (:func:`stream_documents`) as a token stream in ``tokenizer``'s own shard layout
    (``prodip.tokenizer.encode``): ``bos ids end`` per document where the tokenizer prepends its bos, else
    ``ids end``; an unended last document has no end. The first id is context only: the bos, or (no bos)
    the end of a document before, as ``prodip eval`` and lm-evaluation-harness put before a context."""
    end = document_end_id(tokenizer, specials)
    bos = specials.bos_id if specials.add_bos and specials.bos_id is not None else None
    out = [bos if bos is not None else end]
    for i, (text, ended) in enumerate(docs):
        if bos is not None and i > 0:
            out.append(bos)
        out += tokenizer.encode(text, add_special_tokens=False).ids
        if ended:
            out.append(end)
    return out


def task_settings(cfg: EvalConfig) -> JSONObject:
    """The settings an ``eval.json``'s task figures were measured with (``tasks.settings``)."""
    return lmeval.task_settings(
        cfg.tasks, num_fewshot=cfg.num_fewshot, limit=cfg.task_limit or None, task_paths=cfg.task_paths, seed=cfg.seed
    )


class TaskScores(TypedDict):
    """``eval.json``'s ``tasks``: the settings the figures were measured with, and a row per task."""

    settings: JSONObject
    rows: list[lmeval.TaskRow]


def score_tasks(
    cfg: EvalConfig,
    models: dict[str, nn.Module],
    tokenizer: Any,
    mcfg: Any,
    device: torch.device,
    tm: Any,
    *,
    bos_id: int,
    eos_id: int,
    chat: Optional[lmeval.ChatFormat] = None,
) -> TaskScores:
    """lm-evaluation-harness tasks on each model (``prodip.train.lmeval``): ``{settings, rows}``, a row per
    task with every model's scores and standard errors, and seconds per model. ``bos_id``: the token a
    context follows (the harness's prefix token: the bos, or the end of the document before where the
    tokenizer prepends none); ``eos_id``: the document end (its end-of-text token); ``chat``: the checkpoint's
    chat format, through which every model answers the generation (chat) tasks; None (a base model): those
    tasks are left out (logged), their names stay in ``settings`` for a chat model's conformance run."""
    per_model = {}
    for name, model in models.items():
        lm = lmeval.make_lm(
            tokenizer,
            lmeval.torch_logits(model, device),
            bos_id=bos_id,
            eos_id=eos_id,
            max_length=mcfg.max_position_embeddings,
            batch_size=cfg.batch_size,
            step_fn=lmeval.torch_step(model, device),
            chat=chat,
        )
        per_model[name] = lmeval.run_tasks(
            lm,
            cfg.tasks,
            num_fewshot=cfg.num_fewshot,
            limit=cfg.task_limit or None,
            tm=tm,
            seed=cfg.seed,
            threads=cfg.task_threads,
        )
    return {"settings": task_settings(cfg), "rows": lmeval.side_by_side(per_model)}


def format_table(result: dict[str, Any]) -> str:
    """The eval result as a plain-text table (one row per language, then MC accuracy)."""
    lines = [f"checkpoint step {result['checkpoint']['step']}  ({result['checkpoint']['path']})"]
    if result["languages"]:
        lines.append(
            f"{'lang':<6}{'tokens':>9}{'chars':>10} | {'NLL nats/tok':>12}{'bits/char':>10} | "
            f"{'random NLL':>11}{'bits/char':>10}"
        )
        for lang, row in result["languages"].items():
            t, r, b = row["trained"], row["random_init"], row.get("baseline")
            lines.append(
                f"{lang:<6}{row['tokens']:>9}{row['chars']:>10} | {t['nll_nats_per_token']:>12.4f}"
                f"{t['bits_per_char']:>10.4f} | {r['nll_nats_per_token']:>11.4f}{r['bits_per_char']:>10.4f}"
                + (
                    ""
                    if not b
                    else f" | baseline {b['nll_nats_per_token']:.4f} nats/tok {b['bits_per_char']:.4f} bits/char"
                    if "chars_per_token" not in b
                    else f" | baseline (own tokenizer, {b['chars_per_token']:.2f} chars/tok) {b['bits_per_char']:.4f} bits/char"
                )
            )
    for lang, why in result.get("skipped_languages", {}).items():
        lines.append(f"{lang:<6}  skipped: {why}")
    if result["mc"]:
        mc = result["mc"]
        lines.append(
            f"multiple choice ({mc['trained']['n_items']} items, chance {mc['trained']['chance']:.3f}): "
            f"acc {mc['trained']['acc']:.3f}, acc_norm {mc['trained']['acc_norm']:.3f} | random twin "
            f"acc {mc['random_init']['acc']:.3f}, acc_norm {mc['random_init']['acc_norm']:.3f}"
        )
    for row in (result.get("tasks") or {}).get("rows", []):
        cells = []
        for name, scores in row["scores"].items():
            sc = scores.get(row["metric"]) or {}
            err = f" ± {sc['stderr']:.3f}" if sc.get("stderr") is not None else ""
            cells.append(f"{name} {sc.get('value', float('nan')):.3f}{err} ({row['seconds'][name]:.1f} s)")
        chance = f", chance {row['chance']:.3f}" if row["chance"] is not None else ""
        lines.append(
            f"task {row['task']} [{row['language']}, {row['shots']}-shot, {row['items']} items{chance}] "
            f"{row['metric']}: " + " | ".join(cells)
        )
    return "\n".join(lines)
