"""The export's model card: what it was trained on, under which licences.

The card's facts (``manifest.json``'s ``card``) come from the checkpoint's ``trainer_state.json``
``data_card`` (the shards' source records, tokens seen per language and source, ``--init-from``'s
base model) and are written into every artifact:

- ``README.md``: a Hugging Face model card (YAML front matter through ``huggingface_hub``'s
  ``ModelCardData``: ``license`` or ``license: other`` + ``license_name``/``license_link``, ``language``,
  ``datasets``, ``base_model``, ``pipeline_tag``, ``library_name``, ``tags``), then the data statement;
- each GGUF file: gguf-py's ``general.license``, ``general.license.name``, ``general.license.link``,
  ``general.languages``, ``general.tags``, ``general.dataset.count`` + ``general.dataset.{i}.name`` (and
  ``.repo_url`` / ``.url`` when the record states a URL or a repository @ commit), the model's
  ``general.name`` / ``basename`` / ``size_label`` / ``finetune``, ``general.base_model.0.*`` for a Hub
  base: the keys llama.cpp's ``gguf-py/gguf/metadata.py`` fills from a card;
- each ``.onnx`` file: ``metadata_props`` (:func:`onnx_props`);
- ``executorch/model_card.json``: the card beside the ``.pte`` files.

``conformance.card`` reads every one back and compares it with the manifest.

The card's shape is :class:`prodip.base.manifest.Card` (declared in the base, beside the manifest record that
holds it); :func:`build_card` builds it and every function here reads it by attribute.

    python -c "from prodip.export.card import build_card; print(build_card(None).statement.text)"
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from prodip.base.hub import is_hub_model_id
from prodip.base.manifest import Card
from prodip.base.sources import (
    UNKNOWN_INCLUDED,
    card_license,
    hf_license,
    licence_statement,
    license_class,
    license_terms,
)

if TYPE_CHECKING:
    from prodip.tokenizer.bpe import TrainInfo

README_FILE = "README.md"
PTE_CARD_FILE = "executorch/model_card.json"
LIBRARY_NAME = "transformers"
PIPELINE_TAG = "text-generation"


def tokenizer_sources(train_info: Optional[TrainInfo], known: set[str]) -> list[dict[str, Any]]:
    """The tokenizer's own inputs a card must name besides the model's training data (``stage = "tokenizer"``),
    from its ``train_info.json`` (:func:`prodip.tokenizer.bpe.read_train_info`; None: the tokenizer has none):
    its file inputs' records not among ``known`` names, and each word-count table that states a licence
    (``wordfreq:LANG``: CC-BY-SA-4.0 word lists, share-alike)."""
    if train_info is None:
        return []
    out = [{**r, "stage": "tokenizer"} for r in train_info.source_records if r["name"] not in known]
    for s in train_info.sources:
        lic = s.license or {}
        if s.kind != "word_counts" or not lic.get("license"):
            continue
        out.append(
            {
                "name": s.source,
                "language": s.language,
                "origin": f"{lic.get('url', '')} ({lic.get('wordlist', s.source)}, version {s.version})",
                "license": lic["license"],
                "license_class": license_class(lic["license"]),
                "license_terms": license_terms(lic["license"]),
                "included_by_choice": False,
                "notes": "word-frequency table in the tokenizer's training sample only; " + lic.get("attribution", ""),
                "stage": "tokenizer",
            }
        )
    return out


def _readme_license(folder: Path) -> Optional[str]:
    """The ``license`` of a model folder's ``README.md`` front matter (the Hub card), or None."""
    readme = folder / README_FILE
    if not readme.is_file():
        return None
    text = readme.read_text(encoding="utf-8", errors="replace")
    m = re.match(r"^---\s*\n(.*?)\n---", text, re.S)
    if not m:
        return None
    found = re.search(r"^license:\s*['\"]?([^'\"\n]+?)['\"]?\s*$", m.group(1), re.M)
    return found.group(1).strip() if found else None


def imported_base(folder: str | Path, hub_id: str = "") -> dict[str, Any]:
    """What the card says of an imported Hugging Face folder: its Hub id (``hub_id``, else the config's
    ``_name_or_path`` when it has the ``owner/name`` shape, else None: a local path never becomes
    ``base_model``), its licence (the folder's README front matter, else its ``config.json`` ``license``; None
    when neither states one), and what was added to it.

    Raises:
        InvalidInput: ``hub_id`` given but not of the form ``owner/name``.
    """

    folder = Path(folder)
    check_base_model_id(hub_id)
    hub_id = hub_id or folder_hub_id(folder) or ""
    lic = _readme_license(folder) or _config_license(folder)
    return {"base_model": hub_id or None, "license": lic, "added": "nothing (exported unchanged)"}


def _config_license(folder: Path) -> Optional[str]:
    """A ``license`` string in a model folder's ``config.json`` (some bases state it there), or None."""
    path = folder / "config.json"
    try:
        found = json.loads(path.read_text(encoding="utf-8")).get("license") if path.is_file() else None
    except (ValueError, AttributeError):  # unreadable or not an object: the export itself names it later
        return None
    return found.strip() if isinstance(found, str) and found.strip() else None


def check_base_model_id(hub_id: str) -> None:
    """Refuse a ``--base-model-id`` that is not a Hub model id (:func:`prodip.base.hub.is_hub_model_id`).

    Raises:
        InvalidInput: ``hub_id`` given but not ``owner/name`` as the Hub validates it.
    """
    from prodip.base.errors import InvalidInput  # noqa: PLC0415

    if hub_id and not is_hub_model_id(hub_id):
        raise InvalidInput(f"--base-model-id {hub_id!r}: a Hub id is owner/name (e.g. HuggingFaceTB/SmolLM2-135M)")


def folder_hub_id(folder: Path) -> Optional[str]:
    """A Hugging Face folder's Hub id as transformers recorded it (``config.json`` ``_name_or_path``) when it is
    one and not a path that exists here; else None."""
    try:
        name = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("_name_or_path", "")
    except (OSError, json.JSONDecodeError, AttributeError):
        return None
    return name if is_hub_model_id(name) and not Path(name).exists() else None


_STEP_SUFFIX = re.compile(r"^(.*) \(step (\d+)\)$")


def trained_base(init: Optional[dict[str, Any]], hub_id: str = "", depth: int = 0) -> tuple[Optional[str], str]:
    """What a trained export's card says it started from: ``(base_model, origin)``.

    Args:
        init: the checkpoint's ``data_card.init_from`` (``{"source", "kind"}``: a prodip checkpoint ``PATH (step
            N)`` or a Hugging Face folder ``PATH``), None when trained from scratch.
        hub_id: ``--base-model-id`` (wins over anything derived).
    Returns:
        ``base_model``: ``hub_id``, else the Hub id derived from the source (an HF folder's ``_name_or_path``, a
        prodip checkpoint's own ``init_from`` followed back), else None; ``origin``: one sentence for the card
        naming the local origin without a path of this machine ("" when trained from scratch).
    """
    if not init:
        return (hub_id or None), ""
    source = str(init.get("source", ""))
    m = _STEP_SUFFIX.match(source)
    path = Path(m.group(1) if m else source)
    if init.get("kind") == "hf":
        found = hub_id or folder_hub_id(path)
        named = f"`{found}`" if found else f"a local Hugging Face model folder (`{path.name}`, no Hub id known)"
        return found or None, named + " (its own card states its data)"
    found = hub_id or (_prodip_base_hub_id(path, depth) if depth < 8 else None)
    step = f" at step {m.group(2)}" if m else ""
    origin = f"a prodip checkpoint{step}" + (f", itself trained from `{found}`" if found else "")
    return found or None, origin


def _prodip_base_hub_id(path: Path, depth: int) -> Optional[str]:
    """The Hub id the prodip checkpoint at ``path`` started from, followed back through its ``init_from``."""
    from prodip.train import checkpoint  # noqa: PLC0415
    from prodip.train.records import TrainerState  # noqa: PLC0415

    try:
        ckpt = checkpoint.resolve_checkpoint(path)
        card = TrainerState.read(ckpt / checkpoint.TRAINER_STATE_FILE).data_card or {}
    except (OSError, ValueError):
        return None
    init = card.get("init_from")
    return trained_base(init if isinstance(init, dict) else None, depth=depth + 1)[0]


def _imported_card(imported: dict[str, Any]) -> Card:
    base = imported.get("base_model")
    lic = imported.get("license")
    named = f"`{base}`" if base else "a local Hugging Face model folder (no Hub id was given)"
    text = (
        f"These are the weights and tokenizer of {named}, exported unchanged by prodip; added: "
        f"{imported.get('added', 'nothing')}. Its training data and licence are those its own model card states"
        + (f" (licence: {lic})." if lic else "; that folder's card states no licence, so none is claimed here.")
    )
    statement = {
        "class": "unknown",
        "licenses": [lic] if lic else [],
        "share_alike": [],
        "non_commercial": [],
        "attribution": [],
        "unknown_included": [],
        "cleared": False,
        "text": text,
    }
    # a licence the base names is the card's; none named, the card claims none (no license key: the Hub allows it)
    license_ = (
        None
        if not lic
        else card_license(lic)
        if lic.lower() != "other"
        else {"license": "other", "license_name": "base-model-licence", "license_link": "README.md#data-statement"}
    )
    return Card.model_validate(
        {
            "license": license_,
            "languages": [],
            "datasets": [],
            "tags": ["prodip", "llama", "imported"],
            "base_model": base,
            "sources": [],
            "statement": statement,
            "tokens_seen_by_language": {},
        }
    )


def build_card(
    data_card: Optional[dict[str, Any]], train_info: Optional[TrainInfo] = None, base_model_id: str = ""
) -> Card:
    """The card's facts from a checkpoint's ``data_card`` (None: a checkpoint made before source records),
    its tokenizer's ``train_info.json`` (:func:`tokenizer_sources`) and ``--base-model-id`` (:func:`trained_base`).

    Returns:
        The :class:`~prodip.base.manifest.Card` (``manifest.json``'s ``card``): ``license`` ({license[,
        license_name, license_link]}), ``languages``, ``datasets``, ``tags``, ``base_model``, ``sources``
        (record + chars/tokens/shares/tokens_seen), ``statement`` (``licence_statement(...)``),
        ``tokens_seen_by_language``, and ``base_model_origin`` (the local origin in words) after ``--init-from``.
        Without records every field says so and the mix is not cleared.
    Raises:
        InvalidInput: ``base_model_id`` is not a Hub model id.
        pydantic.ValidationError: a source record that is not a card source (a bug upstream: field named).
    """
    data_card = data_card or {}
    if "imported" in data_card:  # prodip export HF_FOLDER: nothing trained, the base's own card rules
        return _imported_card(data_card["imported"])
    seen = data_card.get("tokens_seen_by_source", {})
    sources = [{**s, "tokens_seen": seen.get(s["name"], s.get("tokens_seen"))} for s in data_card.get("sources", [])]
    sources += tokenizer_sources(train_info, {s["name"] for s in sources}) if sources else []
    if sources:
        statement = licence_statement(sources)
        lic = hf_license(sources)
    else:
        statement = {
            "class": "unknown",
            "licenses": [],
            "share_alike": [],
            "non_commercial": [],
            "attribution": [],
            "unknown_included": [],
            "cleared": False,
            "text": "The training data has no source records (shards made before prodip recorded them): its "
            "licences are unknown and the mix is NOT cleared.",
        }
        lic = {
            "license": "other",
            "license_name": "unrecorded-training-data",
            "license_link": "README.md#data-statement",
        }
    languages = sorted({s["language"] for s in sources} | set(data_card.get("tokens_seen_by_language", {})))
    check_base_model_id(base_model_id)
    base_model, origin = trained_base(data_card.get("init_from"), base_model_id)
    replay = {"replay": data_card["replay"]} if data_card.get("replay") else {}
    return Card.model_validate(
        {
            "license": lic,
            "languages": languages,
            "datasets": sorted({s["dataset_id"] for s in sources if s.get("dataset_id")}),
            "tags": ["prodip", "llama", *(["licence-not-cleared"] if not statement["cleared"] else [])],
            "base_model": base_model,
            "sources": sources,
            "statement": statement,
            "tokens_seen_by_language": data_card.get("tokens_seen_by_language", {}),
            **replay,
            **({"base_model_origin": origin} if origin else {}),
        }
    )


def _front_matter(card: Card):
    from huggingface_hub import ModelCardData  # noqa: PLC0415 (train extra)

    return ModelCardData(
        **(card.license.model_dump(exclude_unset=True) if card.license is not None else {}),
        language=card.languages or None,
        datasets=card.datasets or None,
        base_model=card.base_model,
        pipeline_tag=PIPELINE_TAG,
        library_name=LIBRARY_NAME,
        tags=card.tags,
    )


def _count(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) and not isinstance(x, bool) else "–"


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "–"


def data_statement(card: Card) -> str:
    """The README's ``## Data statement`` section (markdown)."""
    lines = ["## Data statement", "", card.statement.text, ""]
    if card.sources:
        lines += [
            "| source | language (variety) | origin | licence | characters | tokens | share of language "
            "(chars / tokens) | tokens seen in training |",
            "|---|---|---|---|---:|---:|---:|---:|",
        ]
        for s in card.sources:
            lic = f"`{s.license}`" + (f" ({UNKNOWN_INCLUDED})" if s.included_by_choice else "")
            if s.license == "other":
                lic = f"[{s.license_name}]({s.license_link})"
            variety = f" ({s.variety})" if s.variety else ""
            stage = {"sft": " (fine-tuning)", "tokenizer": " (tokenizer only)"}.get(s.stage or "", "")
            lines.append(
                f"| {s.name}{stage} | {s.language}{variety} | {s.origin or '–'} | {lic} | "
                f"{_count(s.chars)} | {_count(s.tokens)} | {_pct(s.chars_share_of_language)} / "
                f"{_pct(s.tokens_share_of_language)} | {_count(s.tokens_seen)} |"
            )
        lines.append("")
        gaps = [f"- {s.name}: {s.notes}" for s in card.sources if s.notes]
        if gaps:
            lines += ["Notes and known gaps:", "", *gaps, ""]
    if card.statement.unknown_included:
        lines += [f"**Not fully cleared:** {', '.join(card.statement.unknown_included)}: {UNKNOWN_INCLUDED}.", ""]
    seen = card.tokens_seen_by_language
    if seen:
        lines += ["Tokens seen in training per language: " + ", ".join(f"{k} {v:,}" for k, v in seen.items()), ""]
    origin = getattr(card, "base_model_origin", None) or (
        f"`{card.base_model}` (its own card states its data)" if card.base_model else None
    )
    if origin and "imported" not in card.tags:
        lines += [f"Fine-tuned from: {origin}.", ""]
    if card.replay:
        r = card.replay
        tokens = r.get("tokens_by_language")
        by_lang = ", ".join(f"{k} {v:,}" for k, v in sorted((tokens if isinstance(tokens, dict) else {}).items()))
        lines += [
            f"Fine-tuning replayed pretraining data to forget less: {_pct(r.get('share_of_rows'))} of each step's "
            f"rows were windows of the pretraining shards' train split, {_pct(r.get('share_of_trained_tokens'))} "
            f"of the trained tokens ({by_lang}).",
            "",
        ]
    return "\n".join(lines)


def opening(card: Card) -> str:
    """The card's first sentence, as the provenance is: an import exported unchanged (tag ``imported``), a
    model adapted from a base (``base_model`` set), or one trained from scratch."""
    base = f"`{card.base_model}`" if card.base_model else None
    if "imported" in card.tags:
        named = base or "a local Hugging Face model folder"
        return f"The Llama-architecture language model {named}, imported and exported unchanged by prodip (not trained)"
    origin = base or getattr(card, "base_model_origin", None)  # a local start names no Hub id, only its origin
    if origin:
        return f"A Llama-architecture language model adapted from {origin} (further trained) and exported by prodip"
    return "A small Llama-architecture language model trained from scratch and exported by prodip"


def render_readme(card: Card, quality: str = "", usage: str = "") -> str:
    """The whole ``README.md``: front matter, title, ``usage`` (:func:`prodip.export.usage.how_to_use`, may be
    empty), the data statement, then ``quality`` (markdown, may be empty)."""
    from huggingface_hub import ModelCard  # noqa: PLC0415 (train extra)

    body = [
        "# prodip model",
        "",
        f"{opening(card)}: `model.safetensors` "
        "(transformers), `onnx/` (ONNX Runtime, onnxruntime-genai, transformers.js), and any `gguf/` (llama.cpp) "
        "and `executorch/` (ExecuTorch) files listed in `manifest.json`.",
        "",
        *([usage] if usage else []),
        data_statement(card),
        quality
        or "## Quality\n\nNot measured yet: `prodip conformance` writes the per-variant, per-language quality card here.\n",
    ]
    text = f"---\n{_front_matter(card).to_yaml()}\n---\n\n" + "\n".join(body)
    ModelCard(text)  # parse it back now: a card huggingface_hub cannot load is never written
    return text


def onnx_props(card: Card) -> dict[str, str]:
    """``metadata_props`` for every ``.onnx`` file (string values; ONNX metadata is ``str -> str``)."""
    lic = card.license
    return {
        "license": lic.license if lic else "",
        "license_name": (lic.license_name if lic else None) or "",
        "license_link": (lic.license_link if lic else None) or "",
        "languages": ",".join(card.languages),
        "datasets": ",".join(card.datasets),
        "tags": ",".join(card.tags),
        "sources": json.dumps(source_summary(card), ensure_ascii=False, sort_keys=True),
    }


def source_summary(card: Card) -> list[dict[str, Any]]:
    """Per source the fields every binary artifact carries: name, language, licence, included by choice."""
    return [
        {"name": s.name, "language": s.language, "license": s.license, "included_by_choice": bool(s.included_by_choice)}
        for s in card.sources
    ]


#: ``owner/repo @ commit`` as a source record's ``origin`` states a repository (backticks optional); the
#: records' repositories are GitHub's (data/README.md's "source (repository @ commit)" column).
_REPO_AT_COMMIT = re.compile(r"`?([A-Za-z0-9][\w.-]*/[\w.-]+)`?\s*@\s*`?([0-9a-f]{7,40})\b`?")
_URL = re.compile(r"^https?://\S+$")


def origin_urls(origin: Optional[str], dataset_id: Optional[str] = None) -> dict[str, str]:
    """The URLs a source record's ``origin`` / ``dataset_id`` state, as gguf-py's ``general.dataset.{i}.*`` keys.

    Returns:
        ``repo_url``: ``https://github.com/OWNER/REPO/tree/COMMIT`` when ``origin`` names ``owner/repo @ commit``
        (the first such, wherever it stands in the text), else ``https://huggingface.co/datasets/ID`` for a
        ``dataset_id``; ``url``: ``origin`` itself when it is nothing but a URL. Free text ("as above", a
        description) gives neither.
    """
    out: dict[str, str] = {}
    text = (origin or "").strip()
    found = _REPO_AT_COMMIT.search(text)
    if found:
        out["repo_url"] = f"https://github.com/{found.group(1)}/tree/{found.group(2)}"
    elif dataset_id:
        out["repo_url"] = f"https://huggingface.co/datasets/{dataset_id}"
    if _URL.match(text):
        out["url"] = text
    return out


def gguf_names(card: Card, n_params: int) -> dict[str, str]:
    """``general.name``, ``basename``, ``size_label``, ``finetune``, ``organization`` for a GGUF (what llama.cpp,
    LM Studio and Ollama show as the model's name), from the card and the model's parameter count.

    An import is its Hub model (``HuggingFaceTB/SmolLM2-135M`` -> name and basename ``SmolLM2-135M``,
    organization ``HuggingFaceTB``); a trained model is ``prodip-LANG-LANG`` (its languages), ``finetune``
    ``chat`` when fine-tuned on conversations. ``size_label`` is gguf-py's own (``gguf.utility.size_label``:
    ``4.2M``, ``135M``).
    """
    from gguf.utility import size_label  # noqa: PLC0415 (runtimes extra)

    size = size_label(n_params, 0, 0, 0)
    if "imported" in card.tags and card.base_model:
        owner, name = card.base_model.split("/", 1)
        return {"name": name, "basename": name, "size_label": size, "organization": owner}
    basename = "-".join(["prodip", *card.languages])
    chat = any(s.stage == "sft" for s in card.sources)
    out = {"name": " ".join([basename, size, *(["chat"] if chat else [])]), "basename": basename, "size_label": size}
    return {**out, **({"finetune": "chat"} if chat else {})}


def add_gguf_metadata(writer: Any, card: Card, model: Any = None) -> None:
    """Write the card's keys into a ``gguf.GGUFWriter`` before its header is written (gguf-py's names, as
    llama.cpp's ``gguf-py/gguf/metadata.py`` fills them from a Hub card): the licence, languages, tags, the
    model's names (:func:`gguf_names`; ``model``: the ``LlamaForCausalLM`` being written, for its size),
    ``general.base_model.0.*`` for a Hub base (an import, or ``--init-from`` one), ``general.source.repo_url``
    for an import, and per source ``general.dataset.{i}.name`` plus only URLs (:func:`origin_urls`)."""
    from gguf import Keys  # noqa: PLC0415 (runtimes extra)

    lic = card.license
    if model is not None:
        n_params = sum(p.numel() for p in model.parameters())  # parameters() counts a tied weight once
        for kv in writer.kv_data:  # the writer's placeholder name gives way to the model's own
            kv.pop(Keys.General.NAME, None)
        names = gguf_names(card, n_params)
        writer.add_name(names["name"])
        writer.add_basename(names["basename"])
        writer.add_size_label(names["size_label"])
        if "finetune" in names:
            writer.add_finetune(names["finetune"])
        if "organization" in names:
            writer.add_organization(names["organization"])
    if card.base_model:
        url = f"https://huggingface.co/{card.base_model}"
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, card.base_model.split("/", 1)[1])
        writer.add_base_model_organization(0, card.base_model.split("/", 1)[0])
        writer.add_base_model_repo_url(0, url)
        if "imported" in card.tags:
            writer.add_source_repo_url(url)
    if lic is not None:
        writer.add_license(lic.license)
    if lic is not None and lic.license_name:
        writer.add_license_name(lic.license_name)
    if lic is not None and lic.license_link:
        writer.add_license_link(lic.license_link)
    if card.languages:
        writer.add_languages(card.languages)
    writer.add_tags(card.tags)
    writer.add_dataset_count(len(card.sources))
    for i, s in enumerate(card.sources):  # llama.cpp's metadata.py: one general.dataset.{i}.* per dataset
        writer.add_dataset_name(i, s.name)
        urls = origin_urls(s.origin, s.dataset_id)
        if "repo_url" in urls:
            writer.add_dataset_repo_url(i, urls["repo_url"])
        if "url" in urls:
            writer.add_dataset_url(i, urls["url"])
    writer.add_string("prodip.sources", json.dumps(source_summary(card), ensure_ascii=False, sort_keys=True))


def set_onnx_metadata(path: Path, card: Card) -> None:
    """Put :func:`onnx_props` into ``path``'s ``metadata_props`` (graph, weights location untouched)."""
    import onnx  # noqa: PLC0415

    model = onnx.load(str(path), load_external_data=False)
    props = onnx_props(card)
    kept = [p for p in model.metadata_props if p.key not in props]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    for key, value in props.items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


def usage_section(root: Path, variants: Any) -> str:
    """The README's "How to use" of export ``root`` (:func:`prodip.export.usage.how_to_use`): ``variants`` as
    the manifest lists them (name -> dict, or its ``VariantEntry`` records), the chat contract from the
    export's tokenizer files."""
    from prodip.base.chat import chat_contract  # noqa: PLC0415
    from prodip.export.usage import how_to_use  # noqa: PLC0415

    plain = {n: v if isinstance(v, dict) else v.model_dump(exclude_none=True) for n, v in variants.items()}
    return how_to_use(plain, chat_contract(root))


def write_card(root: Path, card: Card, variants: Any = None) -> None:
    """Write ``README.md`` (with "How to use" when ``variants``, the manifest's, are given), every ``.onnx``
    file's metadata and the ``.pte`` sidecar into export ``root``.

    GGUF files get theirs when written (:func:`add_gguf_metadata`)."""
    usage = usage_section(root, variants) if variants else ""
    (root / README_FILE).write_text(render_readme(card, usage=usage), encoding="utf-8")
    for path in sorted(root.rglob("*.onnx")):
        set_onnx_metadata(path, card)
    if any(root.rglob("*.pte")):
        text = json.dumps(card.to_dict(), indent=2, ensure_ascii=False) + "\n"
        (root / PTE_CARD_FILE).write_text(text, encoding="utf-8")
