"""Source records: what each corpus input is, where it came from, under which licence (the data card's facts).

A *records file* (TOML, conventionally ``sources.toml``) lists ``[[source]]`` tables::

    [[source]]
    name = "majantali-site"                              # unique; cards and include lists use it
    files = ["bn/bn_pd_literature_majantali_site.jsonl.gz"]   # relative to this file's folder; globs:
                                                         # ``*``/``?``/``[...]`` within one folder level
                                                         # (``bn/*.txt``), ``**`` across levels (``news/**``)
    language = "bn"                                      # the input language it is listed under
    variety = "literary Bangla (sadhu-bhasha), 1891-1929"   # optional
    origin = "majantali/majantali.github.io@891da50"     # URL or repository@commit
    license = "CC0-1.0"                                  # SPDX expression, "unknown", or "other"
    license_name = ""                                    # "other": the licence's name ...
    license_link = ""                                    # ... and a link to its text
    dataset_id = ""                                      # Hugging Face dataset id, when it has one
    notes = "..."                                        # known gaps, caveats (optional)

plus any ``extra`` keys a table generator wants (``data/sources.toml`` keeps the sizes shown in
``data/README.md``). Licences are parsed and validated with ``license-expression`` against the SPDX
licence list (``LicenseRef-...`` identifiers allowed, e.g. ``LicenseRef-PublicDomain``).

Each input file finds its record in the records files the config names (``sources``) and in any
``sources.toml`` in the file's folder or a folder above it. A file that no record lists has a
*missing* licence. Two records with different licences for one file are refused (both named): which
one holds is the user's to say, by narrowing a record's ``files``. :func:`gate` stops a stage when a file's licence is ``unknown`` or missing, unless
the config's ``include_unknown_license`` names it (its record name or its path): then it is
included by choice, and every card says so and that the mix is not fully cleared.

:func:`licence_statement` derives the overall statement: share-alike and non-commercial terms of any
source flow into it, and its restriction is the most restrictive source's (never more permissive).

    python -m prodip.base.sources data/sources.toml     # print data/README.md's table from the records
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prodip.base.config import opt, read_toml
from prodip.base.errors import InvalidInput, UserError
from prodip.base.hub import HUB_LICENSE_IDS, hub_license, license_slug
from prodip.base.jsontypes import JSONObject, TOMLTable

if TYPE_CHECKING:
    from license_expression import LicenseExpression, Licensing

SOURCES_FILE = "sources.toml"
UNKNOWN = "unknown"
OTHER = "other"
#: Record keys with a meaning here; any other key is kept in ``extra``.
_KEYS = (
    "name",
    "files",
    "language",
    "variety",
    "origin",
    "license",
    "license_name",
    "license_link",
    "dataset_id",
    "notes",
)
#: Restriction classes, least to most restrictive (the order a derived statement may only climb).
CLASSES = ("public-domain", "attribution", "share-alike", "non-commercial", "unknown")
_PUBLIC_DOMAIN = {
    "CC0-1.0",
    "PDDL-1.0",
    "CC-PDDC",
    "Unlicense",
    "LicenseRef-PublicDomain",
    "LicenseRef-scancode-public-domain",  # license-expression's key for LicenseRef-PublicDomain
}
_SHARE_ALIKE_PREFIXES = ("GPL-", "LGPL-", "AGPL-", "CC-BY-SA-", "ODbL-", "MPL-", "EUPL-", "CDLA-Sharing-", "OSL-")
#: What a card prints for a source whose licence is unknown and which the config includes anyway.
UNKNOWN_INCLUDED = "licence unknown, included by choice"

#: Help texts of the source-record options of every stage that reads corpus files (tokenizer train,
#: data prepare, sft): one wording for all of them.
SOURCES_HELP = (
    "source-record files ([[source]] tables, docs/data.md) for the inputs, besides the sources.toml found "
    "beside each input or in a folder above it"
)
INCLUDE_UNKNOWN_HELP = (
    "source names or input paths whose licence is unknown or unrecorded, included knowingly (else such an "
    "input stops the stage); every card then says so"
)


@dataclass(frozen=True)
class SourceOptions:
    """The source-record options of every stage config that reads corpus files (``[tokenizer]``, ``[data]``,
    ``[sft]``): one declaration, inherited, so the keys, defaults and help are the same in each table."""

    sources: list[str] = opt(factory=list, help=SOURCES_HELP)
    include_unknown_license: list[str] = opt(factory=list, help=INCLUDE_UNKNOWN_HELP)


class LicenseGateError(UserError):
    """A corpus input whose licence is unknown or missing, not listed as knowingly included."""


@dataclass(frozen=True)
class SourceRecord:
    """One corpus source (see the module docstring for the TOML form).

    ``files`` are absolute paths once loaded; ``where`` is the records file (or ``"(no record)"``).
    """

    name: str
    files: tuple[str, ...]
    language: str
    license: str
    variety: str = ""
    origin: str = ""
    license_name: str = ""
    license_link: str = ""
    dataset_id: str = ""
    notes: str = ""
    where: str = ""
    included_by_choice: bool = False
    extra: TOMLTable = field(default_factory=dict, compare=False)

    def covers(self, path: str) -> bool:
        """Whether absolute ``path`` is one of ``files`` (a pattern with ``*``/``?``/``[``: a glob, see
        :func:`glob_match`)."""
        return any(path == f or (any(c in f for c in "*?[") and glob_match(path, f)) for f in self.files)

    @property
    def unknown(self) -> bool:
        return self.license == UNKNOWN

    def card_fields(self) -> JSONObject:
        """The JSON-able fields every artifact carries (no file paths: they are the builder's)."""
        out: JSONObject = {k: getattr(self, k) for k in _KEYS if k != "files"}
        out["license_class"] = license_class(self.license)
        out["license_terms"] = [*license_terms(self.license)]
        out["included_by_choice"] = self.included_by_choice
        return out


def _glob_set(body: str) -> str:
    """The members of a glob set ``[body]`` (``a-z`` ranges, anything else literal) as a regex set body, every
    character escaped so ``^``, ``\\``, ``[``, ``--`` and ``&&`` stay plain members.

    Raises:
        re.error: a range whose ends are out of order (``z-a``).
    """
    out, i = [], 0
    while i < len(body):
        if i + 2 < len(body) and body[i + 1] == "-":
            lo, hi = body[i], body[i + 2]
            if lo > hi:
                raise re.error(f"bad character range {lo}-{hi}")
            out.append(f"{re.escape(lo)}-{re.escape(hi)}")
            i += 3
        else:
            out.append(re.escape(body[i]))
            i += 1
    return "".join(out)


@functools.cache
def _glob_regex(pattern: str) -> re.Pattern[str]:
    """``pattern`` (``/``-separated) as a regular expression over a whole path; see :func:`glob_match`."""
    segments = pattern.split("/")
    out = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == "**":
            out.append(".*" if last else "(?:[^/]*/)*")  # any number of whole folder levels, none included
            continue
        k, n = 0, len(seg)
        while k < n:
            c = seg[k]
            k += 1
            if c == "*":
                while k < n and seg[k] == "*":  # "a**b" inside a segment is a plain "*" (as in pathlib)
                    k += 1
                out.append("[^/]*")
            elif c == "?":
                out.append("[^/]")
            elif c == "[":
                j = k + (k < n and seg[k] == "!")
                j += j < n and seg[j] == "]"  # a "]" first in the set is a member
                j = seg.find("]", j)
                if j < 0:  # no closing bracket: a literal "["
                    out.append(re.escape(c))
                    continue
                body, k = seg[k:j], j + 1
                neg = body.startswith("!")
                out.append(
                    f"(?!/)[{'^' if neg else ''}{_glob_set(body[neg:])}]"
                )  # a range like [+-0] must not reach "/"
            else:
                out.append(re.escape(c))
        if not last:
            out.append("/")
    return re.compile("".join(out) + r"\Z", re.DOTALL)


def glob_match(path: str, pattern: str) -> bool:
    """Whether ``path`` matches the glob ``pattern`` as a whole (case-sensitive, ``/``-separated).

    ``*`` matches any run of characters within one folder level, ``?`` one character, ``[...]``/``[!...]``
    one character of (not of) a set, none of them ``/``; a ``**`` level matches any number of folder levels,
    none included (``news/**`` is every file below ``news``; ``data/**/*.jsonl`` includes ``data/a.jsonl``).
    These are the semantics of Python 3.13's ``PurePath.full_match`` (hidden files included); ``fnmatch``'s ``*`` would also cross ``/``, letting ``news/*.jsonl`` cover ``news/private/x.jsonl``.
    """
    sep = os.sep
    if sep != "/":
        path, pattern = path.replace(sep, "/"), pattern.replace(sep, "/")
    return _glob_regex(pattern).match(path) is not None


@functools.cache
def _licensing() -> Licensing:
    # imported here: the train extra's; a config check (SourceOptions) must run in the serve-only install
    from license_expression import get_spdx_licensing  # noqa: PLC0415

    return get_spdx_licensing()  # the SPDX licence list bundled with license-expression (loaded once)


def parse_license(expr: str, where: str) -> LicenseExpression:
    """Parse an SPDX expression (``license-expression``), refusing unknown identifiers.

    Returns:
        The parsed ``LicenseExpression``.
    Raises:
        InvalidInput: not an expression, or an identifier neither on the SPDX list nor ``LicenseRef-*``.
    """
    from license_expression import ExpressionError  # noqa: PLC0415 (the train extra's, see _licensing)

    lic = _licensing()
    try:
        parsed = lic.parse(expr)
    except ExpressionError as err:
        raise InvalidInput(f"{where}: license {expr!r} is not an SPDX expression ({err})") from None
    if parsed is None:
        raise InvalidInput(f"{where}: license is empty; give an SPDX expression, 'unknown' or 'other'")
    bad = [k for k in lic.unknown_license_keys(parsed) if not k.startswith("LicenseRef-")]
    if bad:
        raise InvalidInput(
            f"{where}: license {expr!r}: {', '.join(bad)} is not an SPDX licence identifier "
            '(https://spdx.org/licenses/; a licence not on the list: license = "other" with license_name '
            "and license_link, or LicenseRef-<name>)"
        )
    return parsed


def _symbol_class(key: str) -> str:
    if key in _PUBLIC_DOMAIN:
        return "public-domain"
    if "-NC" in key.upper():
        return "non-commercial"
    if key.startswith(_SHARE_ALIKE_PREFIXES) or "-SA-" in key:
        return "share-alike"
    return "attribution"


def license_class(expr: str) -> str:
    """The restriction class of a licence (one of :data:`CLASSES`).

    ``A AND B`` is as restrictive as the more restrictive; ``A OR B`` lets the user pick, so it is the less
    restrictive; ``other`` counts as non-commercial-level (its terms are unknown to prodip, never less).
    """
    if expr == UNKNOWN:
        return "unknown"
    if expr == OTHER:
        return "non-commercial"
    from license_expression import AND, OR  # noqa: PLC0415 (the train extra's, see _licensing)

    def rank(node: LicenseExpression) -> int:
        if isinstance(node, AND):
            return max(rank(a) for a in node.args)
        if isinstance(node, OR):
            return min(rank(a) for a in node.args)
        key = getattr(node, "key", str(node))
        return CLASSES.index(_symbol_class(key))

    return CLASSES[rank(parse_license(expr, "license"))]


def license_terms(expr: str) -> list[str]:
    """The terms a licence imposes beyond attribution: ``share-alike``, ``non-commercial`` (sorted).

    A non-commercial share-alike licence (CC-BY-NC-SA-4.0) has both. ``A AND B`` carries either's terms,
    ``A OR B`` only the terms both carry; ``other`` is taken to carry both (prodip cannot read its terms).
    """
    if expr == UNKNOWN:
        return []
    if expr == OTHER:
        return ["non-commercial", "share-alike"]
    from license_expression import AND, OR  # noqa: PLC0415 (the train extra's, see _licensing)

    def terms(node: LicenseExpression) -> set[str]:
        if isinstance(node, AND):
            return set().union(*(terms(a) for a in node.args))
        if isinstance(node, OR):
            return set.intersection(*(terms(a) for a in node.args))
        key = getattr(node, "key", str(node))
        out = set()
        if "-NC" in key.upper():
            out.add("non-commercial")
        if key.startswith(_SHARE_ALIKE_PREFIXES) or "-SA-" in key or key.endswith("-SA"):
            out.add("share-alike")
        return out

    return sorted(terms(parse_license(expr, "license")))


def _resolve_pattern(base: Path, pattern: str) -> str:
    """``pattern`` (relative to ``base``) as an absolute path: its folders before the first wildcard resolved
    (symlinks, ``..``) like the input files it is compared with, the wildcard part kept."""
    parts = Path(pattern).parts
    i = next((k for k, p in enumerate(parts) if any(c in p for c in "*?[")), len(parts))
    return str(Path(base, *parts[:i]).resolve().joinpath(*parts[i:]))


def _record(table: object, base: Path, where: str) -> SourceRecord:
    if not isinstance(table, dict):
        raise InvalidInput(f"{where}: source must be an array of tables ([[source]])")
    missing = [k for k in ("name", "files", "language", "license") if k not in table]
    if missing:
        raise InvalidInput(f"{where}: [[source]] {table.get('name', '?')!r} lacks {', '.join(missing)}")
    name = table["name"]
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"{where}: [[source]] name must be a non-empty string")
    where = f"{where} [[source]] {name!r}"
    files = table["files"]
    if isinstance(files, str):
        files = [files]
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise InvalidInput(f"{where}: files must be a non-empty list of paths relative to the records file")
    for key in _KEYS:
        if key != "files" and key in table and not isinstance(table[key], str):
            raise InvalidInput(f"{where}: {key} must be a string, got {table[key]!r}")
    for f in files:
        try:
            _glob_regex(f.replace(os.sep, "/"))
        except re.error as e:  # a set such as [z-a]
            raise InvalidInput(f"{where}: files entry {f!r} is not a valid glob ({e})") from None
    for key in ("origin", "content", "variety", "notes", "license_name", "license_link"):
        # each record travels alone (a card lists only the sources of its run's files, in its own order), so a
        # field that points at another record ("as above") would point at nothing there
        if _BACK_REFERENCE.fullmatch(str(table.get(key, "")).strip()):
            raise InvalidInput(f"{where}: {key} = {table[key]!r} refers to another record; write it out")
    lic = str(table["license"]).strip()  # a string: checked above
    if lic == OTHER and not (table.get("license_name") and table.get("license_link")):
        raise InvalidInput(f'{where}: license = "other" needs license_name and license_link')
    if lic not in (UNKNOWN, OTHER):
        parse_license(lic, where)  # validated; kept as written (the library spells some ids its own way)
    return SourceRecord(
        name=name,
        files=tuple(_resolve_pattern(base, f) for f in files),
        language=str(table["language"]),
        license=lic,
        variety=str(table.get("variety", "")),
        origin=str(table.get("origin", "")),
        license_name=str(table.get("license_name", "")),
        license_link=str(table.get("license_link", "")),
        dataset_id=str(table.get("dataset_id", "")),
        notes=str(table.get("notes", "")),
        where=where,
        extra={k: v for k, v in table.items() if k not in _KEYS},
    )


#: A field that only points at another record: each record is shown alone, in cards and provenance tables.
_BACK_REFERENCE = re.compile(
    r"(?i)((as|same as|see|like) (above|below|before|previous|the previous( one| record| source)?)"
    r"|ditto|same|idem|ibid)[.!;]?"
)
#: The words that make a field refer to another record by its name ("same as majantali-site").
_NAMED_REFERENCE = r"(?i)(same as|as for|as in|see|like) (record |source )?[`'\"]?{name}[`'\"]?[.!;]?"


def read_records(path: str | os.PathLike[str]) -> list[SourceRecord]:
    """Read one records file (``[[source]]`` tables; paths relative to its folder).

    Raises:
        InvalidInput: not TOML, a record lacking name/files/language/license, a bad licence, a name twice.
    """
    path = Path(path)
    doc = read_toml(path)
    unknown = [k for k in doc if k != "source"]
    if unknown:
        raise InvalidInput(f"{path}: unknown key {unknown[0]!r}; a records file holds [[source]] tables only")
    tables = doc.get("source", [])
    if not isinstance(tables, list):
        raise InvalidInput(f"{path}: source must be an array of tables ([[source]])")
    records = [_record(t, path.parent, str(path)) for t in tables]
    names = [r.name for r in records]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InvalidInput(f"{path}: source name {dup[0]!r} is given twice")
    for rec in records:  # a field naming another record ("same as udhr-ben") points at nothing in a card too
        fields = {"origin": rec.origin, "notes": rec.notes, "license_name": rec.license_name}
        fields |= {k: str(rec.extra.get(k, "")) for k in ("content", "variety")}
        for key, value in fields.items():
            other = next(
                (
                    n
                    for n in names
                    if n != rec.name and re.fullmatch(_NAMED_REFERENCE.format(name=re.escape(n)), value.strip())
                ),
                None,
            )
            if other:
                raise InvalidInput(f"{rec.where}: {key} = {value!r} refers to record {other!r}; write it out")
    return records


def _sidecars(path: Path) -> list[Path]:
    return [d / SOURCES_FILE for d in (path.parent, *path.parent.parents) if (d / SOURCES_FILE).is_file()]


def _licence_key(rec: SourceRecord) -> tuple[str, ...]:
    """What two records must agree on to describe one file: the licence (SPDX expressions compared in
    their normalised form, so ``mit`` equals ``MIT``), and for ``other`` its name and link."""
    if rec.license in (UNKNOWN, OTHER):
        return (rec.license, rec.license_name, rec.license_link)
    return (str(_licensing().parse(rec.license, simple=False)),)


def match_sources(
    files: dict[str, list[Path]],
    records_files: list[str] | tuple[str, ...] = (),
    include_unknown: list[str] | tuple[str, ...] = (),
    *,
    what: str = "inputs",
) -> dict[str, tuple[SourceRecord, list[Path]]]:
    """Match every input file to its record, and gate unknown licences.

    Args:
        files: ``{lang: [file, ...]}`` as :func:`prodip.tokenizer.corpus.expand_inputs` returns it.
        records_files: records files the config names (``sources``), besides the ``sources.toml`` sidecars.
        include_unknown: record names or file paths whose unknown/missing licence the user accepts.
        what: the config table named in messages (``data.inputs``).
    Returns:
        ``{source name: (record, [its input files])}`` in input order; a file without a record that
        ``include_unknown`` names becomes a record named after the file, licence ``unknown``. Where several
        records with one licence cover a file, the first describes it: the config's records files in
        order, then the nearest ``sources.toml``.
    Raises:
        LicenseGateError: one line naming the first file whose licence is unknown or missing and not included.
        InvalidInput: a bad records file; a file listed under another language than its record's; a file
            covered by two records with different licences (both named: a config-level record must not
            silently override a stricter one beside the file, or the reverse).
    """
    loaded: dict[Path, list[SourceRecord]] = {}

    def records_of(p: Path) -> list[SourceRecord]:
        p = p.resolve()
        if p not in loaded:
            loaded[p] = read_records(p)
        return loaded[p]

    explicit = [r for f in records_files for r in records_of(Path(f))]
    out: dict[str, tuple[SourceRecord, list[Path]]] = {}
    for lang, lang_files in files.items():
        for f in lang_files:
            real = str(Path(f).resolve())
            candidates = explicit + [r for s in _sidecars(Path(f).resolve()) for r in records_of(s)]
            covering = [r for r in candidates if r.covers(real)]
            rec = covering[0] if covering else None
            other = next((r for r in covering[1:] if _licence_key(r) != _licence_key(covering[0])), None)
            if other is not None:
                raise InvalidInput(
                    f"{what}.{lang}: {f} is covered by two records with different licences: "
                    f"{covering[0].name!r} ({covering[0].where}) says {covering[0].license!r} and "
                    f"{other.name!r} ({other.where}) says {other.license!r}; narrow one record's files so "
                    f"that one record lists it"
                )
            if rec is None:
                rec = SourceRecord(
                    name=Path(f).name, files=(real,), language=lang, license=UNKNOWN, where="(no record)"
                )
            if rec.language != lang:
                raise InvalidInput(
                    f"{what}.{lang}: {f} is listed under {lang!r} but its record {rec.name!r} ({rec.where}) "
                    f"says language {rec.language!r}"
                )
            if rec.unknown:
                hit = [i for i in include_unknown if i in (rec.name, str(f)) or str(Path(i).resolve()) == real]
                if not hit:
                    why = "has no source record" if rec.where == "(no record)" else f"has licence unknown ({rec.where})"
                    raise LicenseGateError(
                        f"{what}.{lang}: {f} {why}: add a [[source]] record with its SPDX licence to a "
                        f"{SOURCES_FILE} beside it (or one named in `sources`), or list it in "
                        f"include_unknown_license to include it knowingly"
                    )
                rec = dataclasses.replace(rec, included_by_choice=True)
            if rec.name in out:
                out[rec.name][1].append(Path(f))
            else:
                out[rec.name] = (rec, [Path(f)])
    return out


def _terms(record: JSONObject) -> list[str]:
    """A card record's ``license_terms`` (records written before they existed: its class alone)."""
    terms = record.get("license_terms", [record["license_class"]])
    return [str(t) for t in terms] if isinstance(terms, list) else []


def licence_statement(records: Sequence[JSONObject]) -> JSONObject:
    """The overall licence statement of a mix (records as :meth:`SourceRecord.card_fields` gives them).

    Returns:
        ``{"class", "licenses", "share_alike", "non_commercial", "attribution", "unknown_included",
        "cleared", "text"}``: ``class`` is the most restrictive source's class (:data:`CLASSES`);
        the name lists say which sources carry each term; ``cleared`` is false when any source's licence is
        unknown; ``text`` is one paragraph for the cards.
    """
    by = {c: [str(r["name"]) for r in records if r["license_class"] == c] for c in CLASSES}
    for term in ("share-alike", "non-commercial"):  # an NC-SA source carries both terms, whatever its class
        by[term] = [str(r["name"]) for r in records if term in _terms(r)]
    worst = max((CLASSES.index(str(r["license_class"])) for r in records), default=0)
    licenses = sorted({str(r["license"]) for r in records if r["license"] != UNKNOWN})
    parts = [f"Training data licences: {', '.join(licenses) or 'none recorded'}."]
    named = [str(r["name"]) for r in records if r["license_class"] in ("attribution", "share-alike", "non-commercial")]
    if named:
        parts.append(f"Attribution is required by: {', '.join(named)}.")
    if by["share-alike"]:
        parts.append(f"Share-alike terms apply (from {', '.join(by['share-alike'])}).")
    if by["non-commercial"]:
        parts.append(f"Non-commercial or unlisted terms apply (from {', '.join(by['non-commercial'])}).")
    if by["unknown"]:
        parts.append(
            f"{', '.join(by['unknown'])}: {UNKNOWN_INCLUDED}. The mix is NOT fully cleared: its licence "
            "cannot be stated as more permissive than the unknown terms of those sources."
        )
    else:
        parts.append("Every source has a recorded licence.")
    return {
        "class": CLASSES[worst],
        "licenses": [*licenses],
        "share_alike": [*by["share-alike"]],
        "non_commercial": [*by["non-commercial"]],
        "attribution": [*named],
        "unknown_included": [*by["unknown"]],
        "cleared": not by["unknown"],
        "text": " ".join(parts),
    }


def card_license(license: str, license_name: str = "", license_link: str = "") -> dict[str, str]:
    """The model card's ``license`` fields for one record's licence (:func:`prodip.base.hub.hub_license`).

    Args:
        license: an SPDX expression, ``unknown``, ``other``, or already a Hub id (an imported model's card).
        license_name / license_link: the record's own, for ``other``.
    Returns:
        ``{"license": HUB_ID}`` for a Hub id or an SPDX id the Hub lists (``unknown`` stays ``unknown``), else
        ``{"license": "other", "license_name", "license_link"}``: an SPDX id's name and spdx.org page, an
        expression's (``A AND B``) name and the card's data statement, ``other``'s own name and link.
    """
    if license in (UNKNOWN, OTHER) or license in HUB_LICENSE_IDS:
        if license != OTHER:
            return {"license": license}
        return {
            "license": OTHER,
            "license_name": license_slug(license_name or "unnamed-licence"),
            "license_link": license_link or "README.md#data-statement",
        }
    try:
        parsed = parse_license(license, "license")
    except InvalidInput:  # a name neither the Hub nor SPDX knows: keep it as the name of an "other" licence
        return {"license": OTHER, "license_name": license_slug(license), "license_link": "README.md#data-statement"}
    key = getattr(parsed, "key", None)
    if key is not None:  # one licence; a LicenseRef keeps the record's spelling (the parser renames some)
        return hub_license(license.strip() if key.startswith("LicenseRef-") else key)
    return {"license": OTHER, "license_name": license_slug(parsed.render()), "license_link": "README.md#data-statement"}


def hf_license(records: Sequence[JSONObject]) -> dict[str, str]:
    """The model card's ``license`` fields for a mix: the one :func:`card_license` every source gives when
    they all give the same, else ``other`` + ``license_name``/``license_link`` (the card's data statement),
    never a licence more permissive than a source's."""
    each = [
        card_license(str(r["license"]), str(r.get("license_name") or ""), str(r.get("license_link") or ""))
        for r in records
    ]
    if each and all(c == each[0] for c in each):
        return each[0]
    return {"license": OTHER, "license_name": "prodip-data-mix", "license_link": "README.md#data-statement"}


def readme_table(records: list[SourceRecord], root: Path) -> str:
    """``data/README.md``'s table (markdown) from ``data/sources.toml``'s records (sizes from ``extra``)."""
    head = (
        "| file | language | content | source (repository @ commit) | licence (SPDX) | note | gz bytes | text bytes "
        "| text chars |\n|---|---|---|---|---|---|---:|---:|---:|"
    )

    def num(v: Any) -> str:
        return f"{v:,}" if isinstance(v, int) else "–"

    rows = []
    for r in records:
        files = ", ".join(f"`{Path(f).relative_to(root.resolve()).as_posix()}`" for f in r.files)
        e = r.extra
        rows.append(
            f"| {files} | {r.language} | {e.get('content', '')} | {r.origin} | `{r.license}` | {r.notes} | "
            f"{num(e.get('gz_bytes'))} | {num(e.get('text_bytes'))} | {num(e.get('text_chars'))} |"
        )
    return "\n".join([head, *rows])


def _main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "data/sources.toml")
    print(readme_table(read_records(path), path.parent))
    return 0


if __name__ == "__main__":
    from prodip.base.cli import tool_main

    sys.exit(tool_main("base.sources", _main, sys.argv[1:]))
