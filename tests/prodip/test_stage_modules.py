"""Every stage package has the same four modules: config.py, records.py, stage.py, cli.py (docs/architecture.md
"Code layout"), each a module with content of its kind, not an empty placeholder."""

from __future__ import annotations

import ast
import importlib

import pytest

from prodip.base.records import Record

STAGES = ("tokenizer", "train", "export", "conformance", "serve")


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_has_config_records_stage_and_cli(stage):
    from tests.prodip.test_artifact_owners import ROOT

    for name in ("config", "records", "stage", "cli"):
        path = ROOT / stage / f"{name}.py"
        assert path.is_file(), f"{stage}/{name}.py is missing"
        tree = ast.parse(path.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), f"{stage}/{name}.py has no module docstring"
        defined = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))]
        assert defined, f"{stage}/{name}.py defines no class or function"
    stage_module = importlib.import_module(f"prodip.{stage}.stage")
    assert stage_module.STAGES, f"prodip.{stage}.stage lists no Stage"


@pytest.mark.parametrize("stage", ["tokenizer", "train", "conformance", "serve"])
def test_records_modules_hold_the_stage_records(stage):
    """A stage that owns an artifact declares its record in records.py (export owns none: the base declares
    the manifest's records, and export/records.py says so)."""
    records = importlib.import_module(f"prodip.{stage}.records")
    own = [v for v in vars(records).values() if isinstance(v, type) and issubclass(v, Record) and v is not Record]
    assert any(r.__module__ == records.__name__ for r in own), f"prodip.{stage}.records declares no Record"


def test_export_records_says_it_owns_none():
    import prodip.export.records as records

    assert "declares none of its own" in (records.__doc__ or "")
