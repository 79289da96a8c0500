"""Conformance of the model card: every artifact's licence and source fields read back, and the
quality card written from the conformance report and checked against it.

Read back, each with the library its users have, and compared with ``manifest.json``'s ``card``:

- ``README.md``: front matter through ``huggingface_hub.ModelCard.load`` (``license``, ``license_name``,
  ``license_link``, ``language``, ``datasets``, ``base_model``, ``pipeline_tag``, ``library_name``, ``tags``),
  and the body: the data statement as ``prodip.export.card`` renders it from the manifest, and the quality
  section as :func:`render_quality` renders it from the manifest's ``card_quality`` rows;
- each GGUF file through ``gguf.GGUFReader``: ``general.license``, ``.license.name``, ``.license.link``,
  ``general.languages``, ``general.tags``, ``general.dataset.count`` / ``general.dataset.{i}.name`` and its
  ``.repo_url`` / ``.url`` (URLs or absent), the model's ``general.name`` / ``basename`` / ``size_label`` /
  ``finetune``, ``prodip.sources``;
- each ``.onnx`` file's ``metadata_props`` (``onnx.load(..., load_external_data=False)``);
- ``executorch/model_card.json`` beside the ``.pte`` files.

The quality card (:func:`quality_rows`) takes its numbers from the report: per variant and held-out language,
bits/char and its change against the training model, mean and 99.9th-percentile KL(reference || variant)
over the held-out positions, top-1 agreement, greedy agreement, size on disk and the runtimes that ran it
(llama.cpp's ``llama-perplexity --kl-divergence`` defines "Mean KLD", "99.9% KLD" and "Same top p" the same
way: KL of the base model's token distribution to the quantised one's, per position, in nats), plus the
trained model against its random twin from ``eval.json``.

    python -m prodip.conformance.card runs/demo/export     # print the problems (none: exit 0)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Optional

from prodip.base.errors import InvalidInput
from prodip.base.files import file_sha256
from prodip.base.hub import HUB_LICENSE_IDS, is_hub_model_id
from prodip.base.manifest import (
    Card,
    CardQuality,
    ExportManifest,
    FileEntry,
    QualityRow,
    TwinRow,
    load_manifest,
    save_manifest,
)
from prodip.base.runtimes import by_name, card_label
from prodip.conformance.runtimes.agreement import runtime_passed
from prodip.export.card import (
    LIBRARY_NAME,
    PIPELINE_TAG,
    PTE_CARD_FILE,
    README_FILE,
    data_statement,
    gguf_names,
    onnx_props,
    origin_urls,
    render_readme,
    source_summary,
    usage_section,
)

QUALITY_HEADING = "## Quality"


def _front_matter_expected(card: Card) -> dict[str, Any]:
    lic = card.license
    return {
        "license": lic.license if lic else None,
        "license_name": lic.license_name if lic else None,
        "license_link": lic.license_link if lic else None,
        "language": card.languages or None,
        "datasets": card.datasets or None,
        "base_model": card.base_model,
        "pipeline_tag": PIPELINE_TAG,
        "library_name": LIBRARY_NAME,
        "tags": card.tags,
    }


def _readme_problems(root: Path, manifest: ExportManifest, card: Card) -> list[str]:
    from huggingface_hub import ModelCard  # noqa: PLC0415

    path = root / README_FILE
    if not path.is_file():
        return [f"{README_FILE}: missing"]
    try:
        loaded = ModelCard.load(path)
    except Exception as err:  # a card the Hub's parser refuses is a failed check, named
        return [f"{README_FILE}: huggingface_hub.ModelCard cannot load it ({type(err).__name__}: {err})"]
    data = loaded.data.to_dict()
    problems = hub_problems(data) + [
        f"{README_FILE}: front matter {key} = {data.get(key)!r}, manifest says {want!r}"
        for key, want in _front_matter_expected(card).items()
        if data.get(key) != want
    ]
    if usage_section(root, manifest.variants) not in loaded.text:
        problems.append(f"{README_FILE}: the How to use section differs from the one the manifest's variants give")
    if data_statement(card) not in loaded.text:
        problems.append(f"{README_FILE}: the data statement differs from the one the manifest's card gives")
    for s in card.sources:
        if s.included_by_choice and f"`{s.license}` (licence unknown, included by choice)" not in loaded.text:
            problems.append(f"{README_FILE}: source {s.name} is not named as licence unknown, included by choice")
    quality = manifest.card_quality
    if quality is not None and render_quality(quality) not in loaded.text:
        problems.append(f"{README_FILE}: the quality card differs from the figures conformance measured")
    return problems


def hub_problems(data: dict[str, Any]) -> list[str]:
    """What the Hugging Face Hub would refuse in a card's front matter ``data`` (``ModelCard.load(...).data``):
    a ``license`` not among the Hub's ids (:data:`prodip.base.hub.HUB_LICENSE_IDS`), ``other`` without
    ``license_name``, a ``base_model`` that is not a Hub model id (a local path)."""
    problems = []
    lic = data.get("license")
    if lic is None:  # no licence claimed (an import whose base states none): the Hub allows a card without one
        pass
    elif lic not in HUB_LICENSE_IDS:
        problems.append(
            f"{README_FILE}: license {lic!r} is not a Hub licence id (https://huggingface.co/docs/hub/"
            "repositories-licenses); re-export with this prodip"
        )
    elif lic == "other" and not data.get("license_name"):
        problems.append(f"{README_FILE}: license other without license_name")
    bases = data.get("base_model")
    for base in bases if isinstance(bases, list) else [bases] if bases is not None else []:
        if not is_hub_model_id(base):
            problems.append(f"{README_FILE}: base_model {base!r} is not a Hub model id (owner/name)")
    return problems


def _gguf_problems(path: Path, rel: str, card: Card) -> list[str]:
    from gguf import GGUFReader  # noqa: PLC0415 (runtimes extra; the GGUF candidate needs it anyway)

    reader = GGUFReader(str(path))
    fields = reader.fields
    lic = card.license
    want: dict[str, Any] = {
        "general.license": lic.license if lic else None,
        "general.license.name": lic.license_name if lic else None,
        "general.license.link": lic.license_link if lic else None,
        "general.languages": card.languages or None,
        "general.tags": card.tags,
        "general.dataset.count": len(card.sources),
        "prodip.sources": json.dumps(source_summary(card), ensure_ascii=False, sort_keys=True),
    }
    for i, s in enumerate(card.sources):
        want[f"general.dataset.{i}.name"] = s.name
        urls = origin_urls(s.origin, s.dataset_id)  # a URL or nothing, never the record's free text
        want[f"general.dataset.{i}.repo_url"] = urls.get("repo_url")
        want[f"general.dataset.{i}.url"] = urls.get("url")
    n_params = sum(int(t.n_elements) for t in reader.tensors)
    want.update({f"general.{k}": v for k, v in gguf_names(card, n_params).items()})
    problems = []
    for key, value in want.items():
        got = fields[key].contents() if key in fields else None
        if got != value:
            problems.append(f"{rel}: {key} = {got!r}, manifest says {value!r}")
    return problems


def _onnx_problems(path: Path, rel: str, card: Card) -> list[str]:
    import onnx  # noqa: PLC0415

    props = {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    return [
        f"{rel}: metadata_props[{key!r}] = {props.get(key)!r}, manifest says {value!r}"
        for key, value in onnx_props(card).items()
        if props.get(key) != value
    ]


def card_problems(export_dir: str | Path, manifest: Optional[ExportManifest] = None) -> list[str]:
    """Every way the export's artifacts disagree with its manifest's card (empty: they all agree).

    Raises:
        FileNotFoundError / ValueError: no readable manifest.
    """
    root = Path(export_dir)
    manifest = manifest or load_manifest(root)
    card = manifest.card
    if not card:
        return ["manifest.json: no card (an export made before prodip recorded licences: re-export it)"]
    problems = _readme_problems(root, manifest, card)
    for v in manifest.variants.values():
        path = root / v.path
        if not path.is_file():
            continue  # manifest_files_ok names a missing file
        if v.format == "gguf":
            problems += _gguf_problems(path, v.path, card)
    for path in sorted(root.rglob("*.onnx")):
        problems += _onnx_problems(path, path.relative_to(root).as_posix(), card)
    if manifest.formats("pte"):
        side = root / PTE_CARD_FILE
        if not side.is_file():
            problems.append(f"{PTE_CARD_FILE}: missing beside the .pte files")
        elif json.loads(side.read_text(encoding="utf-8")) != card.to_dict():
            problems.append(f"{PTE_CARD_FILE}: differs from the manifest's card")
    return problems


# ------------------------------------------------------------------------------------------ quality card


def _runtimes_proven(entries: list[dict[str, Any]]) -> list[str]:
    """The runtimes that ran a variant and passed, by their card names in the runtimes table: each candidate's
    own runner (ONNX Runtime, llama.cpp, ExecuTorch, prodip's PyTorch model, transformers) whose checks all
    passed, plus each on-device runtime (onnxruntime-genai, transformers.js in Node and in Chromium on WebGPU
    and WASM, ...) whose greedy ids met its row's rule against ONNX Runtime's (a skipped one is not listed)."""
    out = []
    for entry in entries:
        if entry.get("passed"):
            out.append(card_label(entry["kind"]))
        for name, res in (entry.get("runtimes") or {}).get("runtimes", {}).items():
            if not res.get("skipped") and runtime_passed(res):
                out.append(_row_label(name))
    return list(dict.fromkeys(out))


def _row_label(name: str) -> str:
    """The card's name of the runtime row ``name`` (a report of a runtime no longer in the table: its name)."""
    try:
        return by_name(name).card_label
    except KeyError:
        return name


def quality_rows(
    report: dict[str, Any], manifest: ExportManifest, eval_report: Optional[dict] = None
) -> tuple[list[QualityRow], list[TwinRow]]:
    """The quality card's figures, from one conformance report (and ``eval.json``), written once.

    Returns:
        ``(rows, twin)``: per variant and held-out language a :class:`~prodip.base.manifest.QualityRow`
        (``variant, language, bpc, bpc_ref, bpc_delta, kl_mean, kl_p999, top1, greedy_agreement, bytes,
        runtimes``), and per language of ``eval.json`` a :class:`~prodip.base.manifest.TwinRow`
        (``language, nll_token, bpc, random_nll_token, random_bpc``); ``greedy_agreement`` is the mean share
        of the ``greedy_tokens`` new tokens identical to the training model's before the first difference,
        over the prompts; ``bytes`` the variant's files on disk (``manifest.json``).
    """
    files = manifest.files
    rows = []
    for name, entry in report["candidates"].items():
        # a second program of the same weights (transformers) or a variant's web-only graph (int4-wasm, figures in
        # report.md; its pass is part of the variant's verdict and runtimes): the variant's own file's row only
        if name != entry["variant"]:
            continue
        size = sum(files[r].bytes for r in manifest.variants[name].files() if r in files)
        m = entry["metrics"]
        n = m.get("greedy_tokens") or 0
        prefix = m.get("greedy_prefix") or []
        greedy = sum(prefix) / (len(prefix) * n) if prefix and n else None
        for lang, h in sorted((m.get("heldout") or {}).items()):
            rows.append(
                QualityRow(
                    variant=name,
                    language=lang,
                    bpc=h["bpc"],
                    bpc_ref=h["bpc_ref"],
                    bpc_delta=h["bpc_delta"],
                    kl_mean=h.get("kl_mean"),
                    kl_p999=h.get("kl_p999"),
                    top1=h.get("top1"),
                    greedy_agreement=greedy,
                    bytes=size,
                    runtimes=_runtimes_proven([e for e in report["candidates"].values() if e["variant"] == name]),
                )
            )
    twin = []
    for lang, e in sorted(((eval_report or {}).get("languages") or {}).items()):
        model, rand = e["trained"], e["random_init"]  # eval.json (prodip.train.eval.run_eval)
        twin.append(
            TwinRow(
                language=lang,
                nll_token=model["nll_nats_per_token"],
                bpc=model["bits_per_char"],
                random_nll_token=rand["nll_nats_per_token"],
                random_bpc=rand["bits_per_char"],
            )
        )
    return rows, twin


def _f(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return format(x, spec)


def render_quality(quality: CardQuality) -> str:
    """The README's ``## Quality`` section from :func:`quality_rows`' figures (markdown)."""
    lines = [
        QUALITY_HEADING,
        "",
        "Model: **this export**, the files this card describes (after fine-tuning, the fine-tuned model). "
        "Measured by `prodip conformance` on held-out text (the shards' validation split), each variant in its "
        "runtime against the training model in PyTorch. KL is KL(training model ‖ variant) per position in nats, "
        "its mean and 99.9th percentile; top-1 is the share of positions where both pick the same most likely "
        "token (llama.cpp's `llama-perplexity --kl-divergence`: Mean KLD, 99.9% KLD, Same top p). Greedy is the "
        "share of greedily decoded tokens identical to the training model's before the first difference.",
        "",
        "| variant | language | bits/char | Δ vs training model | mean KL | 99.9% KL | top-1 | greedy | size (MiB) "
        "| runtimes proven |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in quality.rows:
        lines.append(
            f"| {r.variant} | {r.language} | {_f(r.bpc, '.4f')} | {_f(r.bpc_delta, '+.4f')} | "
            f"{_f(r.kl_mean, '.2e')} | {_f(r.kl_p999, '.2e')} | {_f(r.top1, '.4f')} | "
            f"{_f(r.greedy_agreement, '.3f')} | {r.bytes / 2**20:.2f} | {', '.join(r.runtimes) or 'none'} |"
        )
    lines.append("")
    if quality.twin:
        model = (
            "Model: **the pretrained checkpoint** this export was fine-tuned from (eval.json's), not the exported "
            "model. "
            if quality.forgetting
            else "Model: **the checkpoint `prodip eval` scored** (eval.json's). "
        )
        lines += [
            model + "That checkpoint against its random-initialised twin, on the shards' validation split:",
            "",
            "| language | NLL/token (nats) | bits/char | random twin NLL/token | random twin bits/char |",
            "|---|---:|---:|---:|---:|",
        ]
        for t in quality.twin:
            lines.append(
                f"| {t.language} | {_f(t.nll_token, '.4f')} | {_f(t.bpc, '.4f')} | "
                f"{_f(t.random_nll_token, '.4f')} | {_f(t.random_bpc, '.4f')} |"
            )
        lines.append("")
    else:
        lines += ["No eval.json was given to conformance: the random-twin comparison is not in this card.", ""]
    if quality.forgetting:
        lines += [
            "What fine-tuning cost: the pretrained model (eval.json's checkpoint) and the exported fine-tuned model on "
            "the same held-out text as above, in PyTorch (positive: the fine-tuned model is worse at the language):",
            "",
            "| language | pretrained bits/char | fine-tuned bits/char | change |",
            "|---|---:|---:|---:|",
        ]
        lines += [f"| {f.language} | {f.base_bpc:.4f} | {f.bpc:.4f} | {f.change:+.1%} |" for f in quality.forgetting]
        lines.append("")
    if quality.tasks:
        lines += render_tasks(quality)
    return "\n".join(lines)


def _score(s: Any, flagged: bool) -> str:
    if s is None or s.value is None:
        return "–"
    err = f" ± {s.stderr:.3f}" if s.stderr is not None else ""
    return f"{s.value:.3f}{err}{' ▼' if flagged else ''}"


def render_tasks(quality: CardQuality) -> list[str]:
    """The card's task table: a row per lm-evaluation-harness task, a column per model (``random twin``,
    ``base``, ``checkpoint``, each variant) with the harness's standard error, the chance level, and the user's
    peers (lines of markdown)."""
    columns: list[str] = []
    for row in quality.tasks:
        columns += [c for c in row.scores if c not in columns]
    peers = quality.task_peers
    settings = quality.task_settings or {}
    limit = f", the first {settings['limit']} items of each" if settings.get("limit") else ""
    lines = [
        "### Tasks",
        "",
        f"lm-evaluation-harness {settings.get('lm_eval_version') or ''} tasks{limit}, scored by log-likelihood "
        "(`prodip eval --tasks`, then `prodip conformance`): each ONNX variant in ONNX Runtime under the same "
        "harness model class as the checkpoint in PyTorch. ± is the harness's standard error; ▼ marks a variant "
        "whose drop from the checkpoint is larger than its own standard error. `random twin` and `base` (the "
        "pretrained model, when the export is fine-tuned from it) come from eval.json. Seconds per task and model "
        "are in manifest.json (`card_quality.tasks[].seconds`).",
    ]
    if any(r.output_type == "generate_until" for r in quality.tasks):
        lines[-1] += (
            " Chat (generation) tasks have no chance level: each model's replies, greedy through the export's own "
            "chat template until its end-of-turn token, are scored against the reference (chrF 0-100, exact "
            "match); their `random twin` is measured by conformance."
        )
    lines += [
        "",
        "| task | language | shots | items | metric | chance | "
        + " | ".join(columns + [f"{p.name}†" for p in peers])
        + " |",
        "|---|---|---:|---:|---|---:|" + "---:|" * (len(columns) + len(peers)),
    ]
    for r in quality.tasks:
        cells = [_score(r.scores.get(c), c in r.flagged) for c in columns]
        cells += [_f(p.scores.get(r.task), ".3f") for p in peers]
        lines.append(
            f"| {r.task} | {r.language} | {r.shots} | {r.items} | {r.metric} | {_f(r.chance, '.3f')} | "
            + " | ".join(cells)
            + " |"
        )
    lines.append("")
    if peers:
        lines += ["† reference scores from the peers file, as published (not measured here):", ""]
        lines += [f"- {p.name}: {p.source}" for p in peers]
        lines.append("")
    return lines


def write_quality(export_dir: Path, quality: CardQuality, speed: str = "") -> ExportManifest:
    """Rewrite ``README.md`` with the quality card (and ``speed``, the speed table's markdown, after it), record the
    figures in the manifest (``card_quality``) and the card's new hash in ``files``. Returns the updated manifest.

    Raises:
        InvalidInput: the export has no card (made before prodip recorded one).
    """
    root = Path(export_dir)
    manifest = load_manifest(root)
    if not manifest.card:
        raise InvalidInput(f"{root / 'manifest.json'}: no card to write the quality figures into (re-export)")
    path = root / README_FILE
    body = render_quality(quality) + (f"\n{speed}" if speed else "")
    text = render_readme(manifest.card, body, usage_section(root, manifest.variants))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    manifest.card_quality = quality
    manifest.files[README_FILE] = FileEntry(bytes=path.stat().st_size, sha256=file_sha256(path))
    return save_manifest(root, manifest)


def _main(argv: list[str]) -> int:
    problems = card_problems(argv[0])
    print("\n".join(problems) or "card: every artifact agrees with manifest.json")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
