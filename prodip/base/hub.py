"""What the Hugging Face Hub accepts in a model card: its licence ids, the SPDX -> Hub licence map, repo ids.

The Hub takes a card's ``license:`` only from its own list of identifiers
(https://huggingface.co/docs/hub/repositories-licenses; :data:`HUB_LICENSE_IDS`, the table of
huggingface/hub-docs ``docs/hub/repositories-licenses.md`` @ 242f4a1e, 2026-08-22), which is not the SPDX
list: ``ODC-By-1.0`` is ``odc-by`` there, ``GPL-3.0-or-later`` is ``gpl-3.0``, ``CC-BY-SA-2.0`` is absent.
:data:`SPDX_TO_HUB` is the explicit map from an SPDX id (as ``license-expression`` spells it once parsed)
to the Hub id of the same licence; every other licence goes on the card as ``license: other`` with a
``license_name`` and ``license_link`` (:func:`hub_license`). ``base_model:`` must be a Hub repo id
(:func:`is_hub_model_id`), never a local path.

    python -c "from prodip.base.hub import hub_license; print(hub_license('ODC-By-1.0'))"
"""

from __future__ import annotations

import re

#: The Hub's licence identifiers (the docs' table, in its order).
HUB_LICENSE_IDS: tuple[str, ...] = (
    *("apache-2.0", "mit", "openrail", "bigscience-openrail-m", "creativeml-openrail-m"),
    *("bigscience-bloom-rail-1.0", "bigcode-openrail-m", "afl-3.0", "artistic-2.0", "bsl-1.0", "bsd"),
    *("bsd-2-clause", "bsd-3-clause", "bsd-3-clause-clear", "c-uda", "cc", "cc0-1.0", "cc-by-2.0", "cc-by-2.5"),
    *("cc-by-3.0", "cc-by-4.0", "cc-by-sa-3.0", "cc-by-sa-4.0", "cc-by-nc-2.0", "cc-by-nc-3.0", "cc-by-nc-4.0"),
    *("cc-by-nd-4.0", "cc-by-nc-nd-3.0", "cc-by-nc-nd-4.0", "cc-by-nc-sa-2.0", "cc-by-nc-sa-3.0"),
    *("cc-by-nc-sa-4.0", "cdla-sharing-1.0", "cdla-permissive-1.0", "cdla-permissive-2.0", "wtfpl", "ecl-2.0"),
    *("epl-1.0", "epl-2.0", "etalab-2.0", "eupl-1.1", "eupl-1.2", "agpl-3.0", "gfdl", "gpl", "gpl-2.0"),
    *("gpl-3.0", "lgpl", "lgpl-2.1", "lgpl-3.0", "isc", "h-research", "intel-research", "lppl-1.3c", "ms-pl"),
    *("apple-ascl", "apple-amlr", "mpl-2.0", "odc-by", "odbl", "openmdw-1.0", "openmdw-1.1", "openrail++"),
    *("osl-3.0", "postgresql", "ofl-1.1", "ncsa", "unlicense", "zlib", "pddl", "lgpl-lr"),
    *("deepfloyd-if-license", "fair-noncommercial-research-license", "llama2", "llama3", "llama3.1"),
    *("llama3.2", "llama3.3", "llama4", "grok2-community", "gemma", "unknown", "other"),
)


def _same_name(*spdx: str) -> dict[str, str]:
    return {s: s.lower() for s in spdx}


#: SPDX id -> the Hub id of the same licence. A versioned Hub id takes only its own version (``CC-BY-SA-2.0``
#: has none: ``other``); ``-only`` and ``-or-later`` take the version's id (one licence text, the grant differs
#: only in the notice, and ``-only`` is never more permissive than the source); the Hub's family ids take a
#: family only where the Hub lists no version of it (GFDL, ODC-By, ODbL, PDDL), never as a catch-all for an
#: unlisted version (``bsd``, ``cc``, ``gpl`` and ``lgpl`` are never produced).
SPDX_TO_HUB: dict[str, str] = {
    **_same_name("Apache-2.0", "MIT", "AFL-3.0", "Artistic-2.0", "BSL-1.0", "BSD-2-Clause", "BSD-3-Clause"),
    **_same_name("BSD-3-Clause-Clear", "CC0-1.0", "CC-BY-2.0", "CC-BY-2.5", "CC-BY-3.0", "CC-BY-4.0"),
    **_same_name("CC-BY-SA-3.0", "CC-BY-SA-4.0", "CC-BY-NC-2.0", "CC-BY-NC-3.0", "CC-BY-NC-4.0", "CC-BY-ND-4.0"),
    **_same_name("CC-BY-NC-ND-3.0", "CC-BY-NC-ND-4.0", "CC-BY-NC-SA-2.0", "CC-BY-NC-SA-3.0", "CC-BY-NC-SA-4.0"),
    **_same_name("CDLA-Sharing-1.0", "CDLA-Permissive-1.0", "CDLA-Permissive-2.0", "WTFPL", "ECL-2.0"),
    **_same_name("EPL-1.0", "EPL-2.0", "etalab-2.0", "EUPL-1.1", "EUPL-1.2", "ISC", "LPPL-1.3c", "MS-PL"),
    **_same_name("MPL-2.0", "OSL-3.0", "PostgreSQL", "OFL-1.1", "NCSA", "Unlicense", "Zlib"),
    "C-UDA-1.0": "c-uda",
    "OFL-1.1-RFN": "ofl-1.1",
    "OFL-1.1-no-RFN": "ofl-1.1",
    "AGPL-3.0-only": "agpl-3.0",
    "AGPL-3.0-or-later": "agpl-3.0",
    "GPL-2.0-only": "gpl-2.0",
    "GPL-2.0-or-later": "gpl-2.0",
    "GPL-3.0-only": "gpl-3.0",
    "GPL-3.0-or-later": "gpl-3.0",
    "LGPL-2.1-only": "lgpl-2.1",
    "LGPL-2.1-or-later": "lgpl-2.1",
    "LGPL-3.0-only": "lgpl-3.0",
    "LGPL-3.0-or-later": "lgpl-3.0",
    **{
        f"GFDL-{v}{kind}{grant}": "gfdl"
        for v in ("1.1", "1.2", "1.3")
        for kind in ("", "-invariants", "-no-invariants")
        for grant in ("-only", "-or-later")
    },
    "ODC-By-1.0": "odc-by",
    "ODbL-1.0": "odbl",
    "PDDL-1.0": "pddl",
    "LGPLLR": "lgpl-lr",
}

#: Where a card with ``license: other`` points for an SPDX licence's text.
SPDX_LINK = "https://spdx.org/licenses/{}.html"


def license_slug(name: str) -> str:
    """``name`` as a Hub ``license_name``: lower case, runs of anything but ``[a-z0-9.]`` as one ``-``
    (``LicenseRef-CC-BY-2.0-FR`` -> ``cc-by-2.0-fr``; the ``LicenseRef-`` prefix dropped)."""
    bare = re.sub(r"^licenseref-", "", name.strip(), flags=re.I)
    return re.sub(r"[^a-z0-9.]+", "-", bare.lower()).strip("-.") or "unnamed"


def hub_license(spdx_id: str) -> dict[str, str]:
    """The card's licence fields for one SPDX id (``license-expression``'s canonical spelling).

    Returns:
        ``{"license": HUB_ID}`` when :data:`SPDX_TO_HUB` has it, else ``{"license": "other",
        "license_name": slug, "license_link": https://spdx.org/licenses/ID.html}`` (a ``LicenseRef-*``
        id has no SPDX page: its link is the card's data statement, ``README.md#data-statement``).
    """
    if spdx_id in SPDX_TO_HUB:
        return {"license": SPDX_TO_HUB[spdx_id]}
    link = "README.md#data-statement" if spdx_id.startswith("LicenseRef-") else SPDX_LINK.format(spdx_id)
    return {"license": "other", "license_name": license_slug(spdx_id), "license_link": link}


def is_hub_model_id(repo_id: object) -> bool:
    """Whether ``repo_id`` is a Hub model id a card's ``base_model:`` may name: ``owner/name`` and valid for
    ``huggingface_hub.utils.validate_repo_id`` (1-96 of ``[A-Za-z0-9_.-]`` per part, not starting or ending
    with ``-``/``.``, no ``--``/``..``, not ending ``.git``). The same rules are checked here when
    huggingface_hub is not installed (the serve-only install)."""
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        return False
    try:
        from huggingface_hub.utils import HFValidationError, validate_repo_id  # noqa: PLC0415 (train extra)
    except ImportError:
        part = r"(?![-.])[A-Za-z0-9_.-]{1,96}(?<![-.])"
        return (
            re.fullmatch(f"{part}/{part}", repo_id) is not None
            and "--" not in repo_id
            and ".." not in repo_id
            and not repo_id.endswith(".git")
        )
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return False
    return True
