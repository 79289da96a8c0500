"""Source records, the licence gate and the licence statement (issue 24).

python -m pytest tests/tokenizer/test_sources.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from prodip.base.errors import InvalidInput
from prodip.base.sources import (
    UNKNOWN_INCLUDED,
    LicenseGateError,
    glob_match,
    hf_license,
    licence_statement,
    license_class,
    license_terms,
    match_sources,
    read_records,
    readme_table,
)
from prodip.cli import main as prodip_main
from prodip.tokenizer.corpus import expand_inputs
from tests.fixtures import write_sources

REPO = Path(__file__).resolve().parents[2]
#: A real corpus file without any licence statement (../shared/data/PROVENANCE.md §14); CI has ../shared
#: beside the clone (a git worktree one level deeper finds it one folder further up).
_REL = Path("shared/data/unlicensed/bluck_bn_mcq.jsonl")
BLUCK = next((p / _REL for p in REPO.parents[:2] if (p / _REL).is_file()), REPO.parent / _REL)


def _bluck(tmp_path: Path) -> Path:
    """A 20-line slice of the real unlicensed file (its content is not shipped in this repository)."""
    if not BLUCK.is_file():
        pytest.skip(f"{BLUCK} absent (the project's shared data sits beside the clone in CI)")
    dst = tmp_path / "unlicensed" / BLUCK.name
    dst.parent.mkdir()
    dst.write_text("".join(BLUCK.read_text(encoding="utf-8").splitlines(keepends=True)[:20]), encoding="utf-8")
    return dst


def test_data_readme_table_is_generated_from_the_records():
    """data/README.md's table and data/sources.toml cannot drift: the table is the records' rendering."""
    records = read_records(REPO / "data" / "sources.toml")
    text = (REPO / "data" / "README.md").read_text(encoding="utf-8")
    assert readme_table(records, REPO / "data") in text
    listed = {Path(f) for r in records for f in r.files}
    shipped = {
        p.resolve()
        for p in (REPO / "data").rglob("*")
        if p.is_file() and p.parent.name in ("bn", "en", "heldout", "chat")
    }
    assert listed == shipped  # every bundled text file has exactly one record, and no record names a missing file


def test_bundled_inputs_match_their_records():
    files = expand_inputs({"bn": [str(REPO / "data/bn")], "en": [str(REPO / "data/en")]})
    matched = match_sources(files)
    assert sorted(matched) == sorted(
        [
            "majantali-site",
            "majantali-wip",
            "bengali-poem-dataset",
            "gutenberg-pride-and-prejudice",
            "gutenberg-frankenstein",
            "gutenberg-time-machine",
            "gutenberg-alice",
            "tinyshakespeare",
        ]
    )
    assert {license_class(rec.license) for rec, _ in matched.values()} == {"public-domain"}
    statement = licence_statement([rec.card_fields() for rec, _ in matched.values()])
    assert statement["cleared"] and statement["class"] == "public-domain"


@pytest.mark.parametrize(
    "expr, cls",
    [
        ("CC0-1.0", "public-domain"),
        ("LicenseRef-PublicDomain", "public-domain"),
        ("MIT", "attribution"),
        ("CC-BY-4.0 AND ODC-By-1.0", "attribution"),
        ("CC-BY-4.0 AND CC-BY-SA-4.0", "share-alike"),  # AND: the more restrictive
        ("GPL-3.0-only OR MIT", "attribution"),  # OR: the user may pick the less restrictive
        ("CC-BY-NC-SA-4.0", "non-commercial"),
        ("unknown", "unknown"),
    ],
)
def test_license_class(expr, cls):
    assert license_class(expr) == cls


def test_non_commercial_share_alike_carries_both_terms_into_the_statement():
    recs = [{"name": "news", "license": "CC-BY-NC-SA-4.0", "license_class": license_class("CC-BY-NC-SA-4.0")}]
    recs[0]["license_terms"] = license_terms("CC-BY-NC-SA-4.0")
    assert recs[0]["license_terms"] == ["non-commercial", "share-alike"]
    st = licence_statement(recs)
    assert st["share_alike"] == st["non_commercial"] == ["news"] and st["class"] == "non-commercial"
    assert license_terms("GPL-3.0-only OR MIT") == [] and license_terms("ODbL-1.0") == ["share-alike"]


def test_bad_records_are_refused_by_name(tmp_path):
    bad = tmp_path / "sources.toml"
    bad.write_text('[[source]]\nname = "x"\nfiles = ["a.txt"]\nlanguage = "en"\nlicense = "CC-BY-5.0"\n')
    with pytest.raises(InvalidInput, match=r"sources.toml \[\[source\]\] 'x': license 'CC-BY-5.0'.*not an SPDX"):
        read_records(bad)
    bad.write_text('[[source]]\nname = "x"\nfiles = ["a.txt"]\nlanguage = "en"\nlicense = "MIT AND"\n')
    with pytest.raises(InvalidInput, match="not an SPDX expression"):
        read_records(bad)
    bad.write_text('[[source]]\nname = "x"\nfiles = ["a.txt"]\nlanguage = "en"\nlicense = "other"\n')
    with pytest.raises(InvalidInput, match='"other" needs license_name and license_link'):
        read_records(bad)
    bad.write_text('[[source]]\nname = "x"\nfiles = ["a.txt"]\nlicense = "MIT"\n')
    with pytest.raises(InvalidInput, match="lacks language"):
        read_records(bad)


def test_statement_is_never_more_permissive_than_a_source():
    recs = [
        {"name": "a", "license": "CC0-1.0", "license_class": "public-domain"},
        {"name": "b", "license": "CC-BY-SA-4.0", "license_class": "share-alike"},
        {"name": "c", "license": "CC-BY-NC-4.0", "license_class": "non-commercial"},
    ]
    st = licence_statement(recs)
    assert st["class"] == "non-commercial" and st["share_alike"] == ["b"] and st["non_commercial"] == ["c"]
    assert "Share-alike terms apply (from b)" in st["text"] and "Non-commercial" in st["text"] and st["cleared"]
    assert hf_license(recs)["license"] == "other"  # no single licence covers the mix
    assert hf_license(recs[1:2]) == {"license": "cc-by-sa-4.0"}  # one source: its own licence
    with_unknown = licence_statement([*recs, {"name": "d", "license": "unknown", "license_class": "unknown"}])
    assert with_unknown["class"] == "unknown" and not with_unknown["cleared"]
    assert f"d: {UNKNOWN_INCLUDED}. The mix is NOT fully cleared" in with_unknown["text"]


def test_gate_stops_an_unlicensed_file_unless_included(tmp_path):
    """The real unlicensed BLUCK file stops the gate by name; listed, it is included and flagged."""
    bluck = _bluck(tmp_path)
    files = expand_inputs({"bn": [str(REPO / "data/bn"), str(bluck)]})
    with pytest.raises(LicenseGateError, match=r"^data.inputs.bn: .*bluck_bn_mcq.jsonl has no source record"):
        match_sources(files, what="data.inputs")
    matched = match_sources(files, include_unknown=[str(bluck)])
    rec, got = matched["bluck_bn_mcq.jsonl"]
    assert rec.included_by_choice and rec.license == "unknown" and got == [bluck]
    st = licence_statement([r.card_fields() for r, _ in matched.values()])
    assert st["unknown_included"] == ["bluck_bn_mcq.jsonl"] and not st["cleared"]
    # a record that says "unknown" is gated the same way; naming the record includes it
    write_sources(bluck.parent, {bluck.name: "bn"}, license="unknown")
    with pytest.raises(LicenseGateError, match="has licence unknown"):
        match_sources(files)
    assert match_sources(files, include_unknown=["test-0"])["test-0"][0].included_by_choice


def test_record_language_must_match_the_input(tmp_path):
    (tmp_path / "a.txt").write_text("hello\n")
    write_sources(tmp_path, {"*.txt": "en"})
    with pytest.raises(InvalidInput, match="listed under 'bn' but its record 'test-0'.*says language 'en'"):
        match_sources({"bn": [tmp_path / "a.txt"]})


def test_tokenizer_train_and_data_prepare_stop_before_reading(tok_dir, tmp_path, capsys):
    """`prodip tokenizer train` / `data prepare` with an unrecorded file: exit 2, one line naming it, nothing written."""
    bluck = _bluck(tmp_path)
    for argv in (
        ["tokenizer", "train", "--out-dir", str(tmp_path / "tok")],
        ["data", "prepare", "--tokenizer-dir", str(tok_dir), "--out-dir", str(tmp_path / "shards")],
    ):
        rc = prodip_main([*argv, "--inputs", f"bn={REPO / 'data/bn'},bn={bluck}", "--progress", "false"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "bluck_bn_mcq.jsonl has no source record" in err[0], err
    assert not (tmp_path / "tok").exists() and not (tmp_path / "shards").exists()


def test_meta_json_counts_characters_and_tokens_per_source(corpus, tok_dir, tmp_path):
    """Included by choice, the unlicensed file travels into meta.json with its own counts."""
    from prodip.tokenizer.encode import DataPrepareConfig, prepare_shards
    from prodip.tokenizer.shards import load_meta

    bluck = _bluck(tmp_path)
    shutil.copy(bluck, tmp_path / "q.jsonl")
    lines = [json.loads(x) for x in bluck.read_text(encoding="utf-8").splitlines()]
    (tmp_path / "q.jsonl").write_text(
        "".join(json.dumps({"text": x["question"]}, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8"
    )
    cfg = DataPrepareConfig(
        tokenizer_dir=str(tok_dir),
        inputs={"bn": [str(corpus["bn"]), str(tmp_path / "q.jsonl")], "en": [str(corpus["en"])]},
        out_dir=str(tmp_path / "shards"),
        include_unknown_license=["q.jsonl"],
        progress=False,
    )
    meta = load_meta(prepare_shards(cfg)).to_dict()
    by = {s["name"]: s for s in meta["sources"]}
    assert set(by) == {"majantali-site", "gutenberg-pride-and-prejudice", "q.jsonl"}
    assert by["q.jsonl"]["included_by_choice"] and by["q.jsonl"]["license"] == "unknown"
    assert by["q.jsonl"]["chars"] == sum(len(x["question"]) for x in lines) and by["q.jsonl"]["documents"] == 20
    for lang, info in meta["languages"].items():
        mine = [s for s in meta["sources"] if s["language"] == lang]
        assert sum(s["chars"] for s in mine) == info["chars"]
        assert sum(s["tokens"] for s in mine) == sum(e["n_tokens"] for sp in ("train", "val") for e in info[sp])
        assert sum(s["tokens_share_of_language"] for s in mine) == pytest.approx(1.0, abs=1e-5)


# (path, pattern, matches): the documented semantics, `*`/`?`/`[...]` within one folder level, `**` across
# levels (Python 3.13's PurePath.full_match, which the test also consults where it exists).
GLOB_CASES = [
    ("/d/news/a.jsonl", "/d/news/*.jsonl", True),
    ("/d/news/private/secret.jsonl", "/d/news/*.jsonl", False),  # `*` never crosses "/" (fnmatch's does)
    ("/d/news/private/secret.jsonl", "/d/news/**", True),
    ("/d/news/a.jsonl", "/d/news/**", True),
    ("/d/news/a/b/c.jsonl", "/d/news/**/*.jsonl", True),
    ("/d/news/a.jsonl", "/d/news/**/*.jsonl", True),  # `**` is zero levels too
    ("/d/news/a/b/c.txt", "/d/news/**/*.jsonl", False),
    ("/d/news/a/b/c.jsonl", "/d/news/*/c.jsonl", False),
    ("/d/news/a/c.jsonl", "/d/news/*/c.jsonl", True),
    ("/d/news/ab.txt", "/d/news/a?.txt", True),
    ("/d/news/a/.txt", "/d/news/a?.txt", False),  # `?` is not "/"
    ("/d/news/a.txt", "/d/news/[ab].txt", True),
    ("/d/news/c.txt", "/d/news/[!ab].txt", True),
    ("/d/news/a.txt", "/d/news/[!ab].txt", False),
    ("/d/x/y", "/d/x[!a]y", False),  # a negated set never matches "/"
    ("/d/x/y", "/d/x[+-0]y", False),  # nor a range that spans it
    ("/d/x-y", "/d/x[+-0]y", True),
    ("/d/news/.hidden.jsonl", "/d/news/*.jsonl", True),
    ("/d/news/A.jsonl", "/d/news/a.jsonl", False),  # case-sensitive
    ("/d/news/a.jsonl.gz", "/d/news/*.jsonl", False),  # the whole path, not a prefix
    ("/d/n[ews/a", "/d/n[ews/a", True),  # an unclosed "[" is a literal
    ("/d/a^b", "/d/a[\\^]b", True),
    ("/d/a-b", "/d/a[--0]b", True),  # "--" is a range from "-", not a set operation
    ("/d/a&b", "/d/a[&&]b", True),
    ("/d/a.b", "/d/a.b", True),
    ("/d/axb", "/d/a.b", False),  # "." is literal
    ("/d/news/a/b/c.jsonl", "/d/news/a**", False),  # "**" inside a level is a plain "*"
    ("/d/news/abc", "/d/news/a**", True),
]


@pytest.mark.parametrize(("path", "pattern", "expected"), GLOB_CASES)
def test_record_globs_keep_star_within_one_folder_level(path, pattern, expected):
    assert glob_match(path, pattern) is expected
    from pathlib import PurePosixPath

    # Python 3.13+: the standard library's answer must agree, except that 3.13.0's full_match lets a
    # negated set or a range match the separator ("/d/x[!a]y" matches "/d/x/y"), which we refuse
    if hasattr(PurePosixPath, "full_match") and "[" not in pattern:
        assert PurePosixPath(path).full_match(pattern) is expected


def _conv(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"text": "hello"}) + "\n", encoding="utf-8")
    return path


def test_a_star_record_does_not_cover_a_subfolder_file(tmp_path):
    """`news/*.jsonl` leaves news/private/ unrecorded: the gate stops on it by name; `news/**` covers it."""
    _conv(tmp_path / "news" / "a.jsonl")
    _conv(tmp_path / "news" / "private" / "secret.jsonl")
    write_sources(tmp_path, {"news/*.jsonl": "en"})
    files = expand_inputs({"en": [str(tmp_path / "news")]})
    with pytest.raises(LicenseGateError, match=r"private/secret.jsonl has no source record"):
        match_sources(files)
    write_sources(tmp_path, {"news/**": "en"})
    rec, got = match_sources(files)["test-0"]
    assert sorted(p.name for p in got) == ["a.jsonl", "secret.jsonl"]
    (tmp_path / "sources.toml").write_text(
        '[[source]]\nname = "x"\nfiles = ["news/[z-a].jsonl"]\nlanguage = "en"\nlicense = "MIT"\n'
    )
    with pytest.raises(InvalidInput, match=r"files entry 'news/\[z-a\].jsonl' is not a valid glob"):
        read_records(tmp_path / "sources.toml")


def test_symlinked_folders_are_read_once(tmp_path, caplog):
    """A loop (lic/loop -> lic) ends where it comes back; a second link to a folder, or a file given twice,
    lists the real file once (with a warning naming the extra path)."""
    lic = tmp_path / "lic"
    a = _conv(lic / "a.jsonl")
    _conv(lic / "sub" / "b.jsonl")
    (lic / "loop").symlink_to(lic, target_is_directory=True)
    (lic / "sub" / "up").symlink_to(lic, target_is_directory=True)
    (tmp_path / "alias").symlink_to(lic / "sub", target_is_directory=True)
    files = expand_inputs({"en": [str(lic)]})["en"]
    assert [p.relative_to(lic).as_posix() for p in files] == ["a.jsonl", "sub/b.jsonl"]
    with caplog.at_level("WARNING"):
        files = expand_inputs({"en": [str(lic), str(tmp_path / "alias"), str(a)]})["en"]
    assert [p.relative_to(lic).as_posix() for p in files] == ["a.jsonl", "sub/b.jsonl"]
    assert "1 path(s) reach a file already listed" in caplog.text and str(a) in caplog.text
    write_sources(lic, {"**": "en"})
    assert [len(fs) for _, fs in match_sources({"en": files}).values()] == [2]


def test_records_that_disagree_on_a_files_licence_are_refused(tmp_path):
    """A config-level record and the sidecar beside the file: different licences are refused, both named;
    the same licence (however spelled) is no conflict, and the config's record describes the file."""
    x = _conv(tmp_path / "data" / "nc" / "x.jsonl")
    write_sources(x.parent, {"x.jsonl": "en"}, license="CC-BY-NC-4.0")
    cfg = tmp_path / "cfg" / "my_sources.toml"
    cfg.parent.mkdir()
    cfg.write_text(
        f'[[source]]\nname = "broad"\nfiles = ["{tmp_path}/data/**/*.jsonl"]\nlanguage = "en"\nlicense = "CC0-1.0"\n'
    )
    files = expand_inputs({"en": [str(tmp_path / "data")]})
    with pytest.raises(
        InvalidInput,
        match=r"x.jsonl is covered by two records with different licences: 'broad' \(.*my_sources.toml.*\) says "
        r"'CC0-1.0' and 'test-0' \(.*nc/sources.toml.*\) says 'CC-BY-NC-4.0'",
    ):
        match_sources(files, [str(cfg)])
    assert list(match_sources(files)) == ["test-0"]  # the sidecar alone: its record holds
    cfg.write_text(cfg.read_text().replace("CC0-1.0", "cc-by-nc-4.0"))
    rec, _ = match_sources(files, [str(cfg)])["broad"]
    assert rec.license == "cc-by-nc-4.0" and rec.card_fields()["license_terms"] == ["non-commercial"]


@pytest.mark.parametrize("origin", ["as above", "Same as above", "As Above.", "ditto", "see previous", "same"])
def test_a_field_pointing_at_another_record_is_refused(tmp_path, origin):
    """Each record is shown alone (a card lists only its run's sources), so "as above" would point at nothing."""
    (tmp_path / "a.txt").write_text("x", encoding="utf-8")
    (tmp_path / "sources.toml").write_text(
        f'[[source]]\nname = "a"\nfiles = ["a.txt"]\nlanguage = "en"\nlicense = "CC0-1.0"\norigin = "{origin}"\n',
        encoding="utf-8",
    )
    with pytest.raises(InvalidInput, match=r"\[\[source\]\] .a.: origin = .* refers to another record; write it out"):
        read_records(tmp_path / "sources.toml")


def test_a_field_naming_another_record_is_refused_and_a_plain_origin_is_not(tmp_path):
    (tmp_path / "a.txt").write_text("x", encoding="utf-8")
    (tmp_path / "b.txt").write_text("y", encoding="utf-8")
    head = (
        '[[source]]\nname = "a-site"\nfiles = ["a.txt"]\nlanguage = "en"\nlicense = "CC0-1.0"\norigin = "example.org"\n'
    )
    for origin, refused in (("same as a-site", True), ("see `a-site`.", True), ("same as example.org", False)):
        (tmp_path / "sources.toml").write_text(
            head
            + f'[[source]]\nname = "b"\nfiles = ["b.txt"]\nlanguage = "en"\nlicense = "CC0-1.0"\norigin = "{origin}"\n',
            encoding="utf-8",
        )
        if refused:
            with pytest.raises(
                InvalidInput, match=r"\[\[source\]\] 'b': origin = .* refers to record 'a-site'; write it out"
            ):
                read_records(tmp_path / "sources.toml")
        else:
            assert [r.origin for r in read_records(tmp_path / "sources.toml")] == ["example.org", origin]
