"""The card the Hugging Face Hub accepts: every licence a source record can state becomes a Hub licence id (or
``other`` with a name and link), ``base_model`` is a Hub id or absent, and conformance fails a card whose
licence the Hub does not list. The Hub's list is the committed fixture ``data/hub_licenses.tsv``.

python -m pytest tests/export/test_hub_card.py -q
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from prodip.base.hub import HUB_LICENSE_IDS, SPDX_TO_HUB, is_hub_model_id
from prodip.base.sources import card_license, license_class, license_terms, read_records
from prodip.export.card import build_card, render_readme

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _hub_list() -> list[str]:
    lines = (HERE / "data" / "hub_licenses.tsv").read_text(encoding="utf-8").splitlines()
    return [line.split("\t")[0] for line in lines if line and not line.startswith("#")]


HUB = set(_hub_list())


def _spdx_vocabulary() -> list[str]:
    """Every licence id a source record may state: each SPDX id license-expression knows (canonical spelling),
    the LicenseRef ids of data/sources.toml, ``unknown`` and ``other``."""
    from license_expression import get_spdx_licensing

    lic = get_spdx_licensing()
    spdx = sorted({lic.parse(k).key for k in lic.known_symbols})
    refs = sorted({r.license for r in read_records(REPO / "data" / "sources.toml")})
    return [*spdx, *refs, "unknown", "other"]


def _record(license_: str) -> dict:
    named = {"license_name": "My Licence 1.0", "license_link": "https://example.org/l"} if license_ == "other" else {}
    return {
        "name": "src",
        "language": "bn",
        "license": license_,
        "license_class": license_class(license_),
        "license_terms": license_terms(license_),
        **named,
    }


def test_hub_licence_ids_are_the_hubs_documented_list():
    assert list(HUB_LICENSE_IDS) == _hub_list()
    assert set(SPDX_TO_HUB.values()) <= HUB  # the map names only Hub ids
    from license_expression import get_spdx_licensing

    lic = get_spdx_licensing()
    assert all(lic.parse(k).key == k for k in SPDX_TO_HUB)  # keys in the parser's own spelling


@pytest.mark.parametrize(
    ("spdx", "want"),
    [
        ("ODC-By-1.0", {"license": "odc-by"}),  # FineWeb-2's licence
        ("ODbL-1.0", {"license": "odbl"}),
        ("PDDL-1.0", {"license": "pddl"}),
        ("GFDL-1.3-or-later", {"license": "gfdl"}),
        ("GPL-3.0-only", {"license": "gpl-3.0"}),
        ("GPL-3.0-or-later", {"license": "gpl-3.0"}),
        ("LGPL-2.1-only", {"license": "lgpl-2.1"}),
        ("AGPL-3.0-only", {"license": "agpl-3.0"}),
        ("CC-BY-SA-4.0", {"license": "cc-by-sa-4.0"}),
        ("CC0-1.0", {"license": "cc0-1.0"}),
        ("unknown", {"license": "unknown"}),
        (
            "CC-BY-SA-2.0",
            {
                "license": "other",
                "license_name": "cc-by-sa-2.0",
                "license_link": "https://spdx.org/licenses/CC-BY-SA-2.0.html",
            },
        ),
        (
            "CC-PDDC",
            {"license": "other", "license_name": "cc-pddc", "license_link": "https://spdx.org/licenses/CC-PDDC.html"},
        ),
        (
            "LicenseRef-CC-BY-2.0-FR",
            {"license": "other", "license_name": "cc-by-2.0-fr", "license_link": "README.md#data-statement"},
        ),
        (
            "MIT OR Apache-2.0",
            {"license": "other", "license_name": "mit-or-apache-2.0", "license_link": "README.md#data-statement"},
        ),
    ],
)
def test_known_licences_map_to_the_hubs_ids(spdx, want):
    assert card_license(spdx) == want


def test_every_licence_a_record_can_state_gives_a_card_the_hub_accepts():
    """All ~2,400 SPDX ids, the bundled data's LicenseRefs, unknown and other: the card's front matter, read
    back by huggingface_hub, has a Hub licence id (``other`` with a slug name and a link) and conformance's
    Hub check passes."""
    from huggingface_hub import ModelCard

    from prodip.conformance.card import hub_problems

    vocabulary = _spdx_vocabulary()
    assert len(vocabulary) > 2000 and "ODC-By-1.0" in vocabulary and "LicenseRef-PublicDomain" in vocabulary
    rendered = 0
    for i, spdx in enumerate(vocabulary):
        card = build_card({"sources": [_record(spdx)]})
        lic = card.license
        assert lic.license in HUB, spdx
        if lic.license == "other":
            assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", lic.license_name or ""), (spdx, lic)
            assert lic.license_link and (
                lic.license_link.startswith("https://") or lic.license_link.startswith("README.md#")
            )
        if i % 25 == 0 or spdx in SPDX_TO_HUB or not spdx[0].isupper():  # the whole card for a sample
            data = ModelCard(render_readme(card)).data.to_dict()
            assert data["license"] == lic.license and hub_problems(data) == [], spdx
            rendered += 1
    assert rendered > len(SPDX_TO_HUB)


def test_a_mix_of_one_hub_licence_keeps_it_and_other_mixes_are_other():
    assert build_card({"sources": [_record("GPL-3.0-only"), _record("GPL-3.0-or-later")]}).license.license == "gpl-3.0"
    mix = build_card({"sources": [_record("ODC-By-1.0"), _record("CC0-1.0")]}).license
    assert (mix.license, mix.license_name) == ("other", "prodip-data-mix")


def test_validate_repo_id_and_the_fallback_agree():
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    import prodip.base.hub as hub

    cases = [
        "HuggingFaceTB/SmolLM2-135M",
        "owner/name.v2",
        "runs/mine/train/checkpoints/step_0000060 (step 60)",
        "/" + "home/me/models/smol",  # built: test_layout refuses path literals
        "owner/name.git",
        "owner/na--me",
        "-owner/name",
        "owner",
        "a" * 97 + "/b",
    ]
    for case in cases:
        try:
            validate_repo_id(case)
            valid = case.count("/") == 1
        except HFValidationError:
            valid = False
        assert is_hub_model_id(case) is valid, case
    assert [c for c in cases if is_hub_model_id(c)] == ["HuggingFaceTB/SmolLM2-135M", "owner/name.v2"]
    import builtins

    real_import = builtins.__import__

    def no_hub(name, *a, **k):
        if name.startswith("huggingface_hub"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    builtins.__import__ = no_hub
    try:
        assert [c for c in cases if hub.is_hub_model_id(c)] == ["HuggingFaceTB/SmolLM2-135M", "owner/name.v2"]
    finally:
        builtins.__import__ = real_import


def _hf_folder(path: Path, name_or_path: str) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"_name_or_path": name_or_path, "model_type": "llama"}))
    return path


def test_base_model_is_a_hub_id_or_absent_and_the_card_names_no_local_path(tmp_path):
    """After --init-from: a prodip checkpoint gives no base_model (its path stays out of the card), a folder
    transformers saved from the Hub gives its id, a checkpoint trained from that folder gives it too (followed
    back), and --base-model-id wins."""
    from huggingface_hub import ModelCard
    from huggingface_hub.utils import validate_repo_id

    from prodip.base.errors import InvalidInput
    from prodip.train.checkpoint import save_checkpoint
    from tests.fixtures import build_tiny_checkpoint, tiny_model, tiny_model_config

    run = build_tiny_checkpoint(tmp_path / "a")
    step_dir = (run / "checkpoints" / "step_0000010").resolve()
    assert step_dir.is_dir(), sorted((run / "checkpoints").iterdir())
    from_ckpt = {"source": f"{step_dir} (step 10)", "kind": "prodip"}
    card = build_card({"sources": [_record("CC0-1.0")], "init_from": from_ckpt})
    text = render_readme(card)
    assert card.base_model is None and "base_model" not in ModelCard(text).data.to_dict()
    assert "Fine-tuned from: a prodip checkpoint at step 10." in text and str(tmp_path) not in text

    hub_folder = _hf_folder(tmp_path / "smol", "HuggingFaceTB/SmolLM2-135M")
    card = build_card({"sources": [_record("CC0-1.0")], "init_from": {"source": str(hub_folder), "kind": "hf"}})
    data = ModelCard(render_readme(card)).data.to_dict()
    assert data["base_model"] == "HuggingFaceTB/SmolLM2-135M"
    validate_repo_id(data["base_model"])
    local = _hf_folder(tmp_path / "mine", str(tmp_path / "mine"))
    card = build_card({"sources": [_record("CC0-1.0")], "init_from": {"source": str(local), "kind": "hf"}})
    assert card.base_model is None
    assert "a local Hugging Face model folder (`mine`, no Hub id known)" in render_readme(card)

    # a checkpoint trained from the Hub folder, then fine-tuned: the Hub id is followed back
    config = tiny_model_config(vocab_size=512)
    extra = {"data_card": {"sources": [], "init_from": {"source": str(hub_folder), "kind": "hf"}}}
    tok = run.parent / "tokenizer"
    model = tiny_model(config)
    pre = save_checkpoint(
        tmp_path / "pre/checkpoints", step=5, model=model, model_config=config, tokenizer_dir=tok, extra_state=extra
    )
    card = build_card({"sources": [_record("CC0-1.0")], "init_from": {"source": f"{pre} (step 5)", "kind": "prodip"}})
    text = render_readme(card)
    assert card.base_model == "HuggingFaceTB/SmolLM2-135M" and str(tmp_path) not in text
    assert "Fine-tuned from: a prodip checkpoint at step 5, itself trained from `HuggingFaceTB/SmolLM2-135M`." in text

    given = build_card({"sources": [_record("CC0-1.0")], "init_from": from_ckpt}, base_model_id="me/my-base")
    assert given.base_model == "me/my-base"
    with pytest.raises(InvalidInput, match=r"--base-model-id 'runs/x \(step 1\)': a Hub id is owner/name"):
        build_card({"sources": []}, base_model_id="runs/x (step 1)")


def test_conformance_fails_a_card_whose_licence_is_not_a_hub_id(tmp_path):
    from prodip.conformance.card import card_problems
    from prodip.conformance.faults import plant_card_licence_not_on_hub
    from tests.fixtures import build_tiny_export

    export = build_tiny_export(tmp_path / "tiny", variants=["fp32"])
    assert card_problems(export) == []
    bad = plant_card_licence_not_on_hub(export, tmp_path / "bad")
    assert card_problems(bad) == [
        "README.md: license 'odc-by-1.0' is not a Hub licence id "
        "(https://huggingface.co/docs/hub/repositories-licenses); re-export with this prodip"
    ]


def test_the_card_opens_and_licenses_as_its_provenance_is(tmp_path):
    """A plain import opened "trained ... by prodip" while its data statement said "exported unchanged", and
    claimed `license: other` / `base-model-licence` while the text claimed none. The opening now follows the
    provenance (imported unchanged / adapted / trained from scratch); an import's licence is the base's (its
    README, else its config.json), and with none known the front matter has no license key (the Hub allows it)."""
    from huggingface_hub import ModelCard

    from prodip.conformance.card import hub_problems
    from prodip.export.card import imported_base

    folder = _hf_folder(tmp_path / "smol", "HuggingFaceTB/SmolLM2-135M")
    card = build_card({"imported": imported_base(folder)})
    text = render_readme(card)
    data = ModelCard(text).data.to_dict()
    assert card.license is None and "license" not in data and "license_name" not in data
    assert hub_problems(data) == []
    opening = text.split("# prodip model\n\n", 1)[1].split(":", 1)[0]
    assert opening == (
        "The Llama-architecture language model `HuggingFaceTB/SmolLM2-135M`, imported and exported unchanged "
        "by prodip (not trained)"
    )
    assert "that folder's card states no licence, so none is claimed here." in text

    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "license": "apache-2.0"}))
    card = build_card({"imported": imported_base(folder)})
    data = ModelCard(render_readme(card)).data.to_dict()
    assert card.license is not None and card.license.license == "apache-2.0" and data["license"] == "apache-2.0"
    assert "(licence: apache-2.0)." in card.statement.text

    scratch = render_readme(build_card({"sources": [_record("CC0-1.0")]}))
    assert "\nA small Llama-architecture language model trained from scratch and exported by prodip: " in scratch
    adapted = render_readme(
        build_card({"sources": [_record("CC0-1.0")], "init_from": {"source": str(folder), "kind": "hf"}})
    )
    assert (
        "\nA Llama-architecture language model adapted from `HuggingFaceTB/SmolLM2-135M` (further trained) "
        "and exported by prodip: " in adapted
    )
