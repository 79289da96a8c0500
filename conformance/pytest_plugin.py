"""pytest plugin: the conformance checks of one export, one test per (candidate, metric).

    pytest conformance/ --export-dir runs/demo/export --checkpoint runs/demo/train --shards-dir runs/demo/shards
    PRODIP_EXPORT_DIR=runs/demo/export pytest conformance/
    pytest -p prodip.conformance.pytest_plugin --pyargs prodip.conformance --export-dir DIR   # from any directory

Without an export dir every test is skipped with the reason. The checks are computed once per
session by :func:`conformance.evaluate` (nothing is written to the export); a refusal (e.g. the
checkpoint differs from the manifest's) errors every test.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from prodip.conformance.checks import plan_checks
from prodip.conformance.config import ConformanceConfig
from prodip.conformance.suite import evaluate

_OPTIONS = [  # (flag, env var, ConformanceConfig field, help)
    ("--export-dir", "PRODIP_EXPORT_DIR", "export_dir", "export dir to check"),
    ("--checkpoint", "PRODIP_CHECKPOINT", "checkpoint", "checkpoint it was exported from (default: manifest's)"),
    ("--tolerances", "PRODIP_TOLERANCES", "tolerances", "tolerance TOML (default: conformance/tolerances.toml)"),
    ("--shards-dir", "PRODIP_SHARDS_DIR", "shards_dir", "shards dir for held-out text (or --heldout: bpc_delta_max)"),
    ("--heldout", "PRODIP_HELDOUT", "heldout", "held-out text files instead of shards: bn=FILE,en=FILE"),
    ("--conformance-threads", "PRODIP_CONFORMANCE_THREADS", "threads", "CPU threads (0 = default)"),
    ("--conformance-variants", "PRODIP_CONFORMANCE_VARIANTS", "variants", "comma-separated candidates (default: all)"),
    (
        "--conformance-runtimes",
        "PRODIP_CONFORMANCE_RUNTIMES",
        "runtimes",
        "comma-separated on-device runtimes (default: all three, as `prodip conformance --runtimes`)",
    ),
]
_LISTS = ("variants", "runtimes")  # comma-separated
SKIP_REASON = "no export dir: pass --export-dir DIR (or set PRODIP_EXPORT_DIR) to run the conformance checks"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("prodip conformance")
    for flag, env, _, help_text in _OPTIONS:
        group.addoption(flag, default=None, help=f"{help_text} [env {env}]")


def conformance_config(config: pytest.Config):
    """The ConformanceConfig from options/env, or None when no export dir is given."""
    values: dict[str, Any] = {}
    for flag, env, field, _ in _OPTIONS:
        value = config.getoption(flag.lstrip("-").replace("-", "_")) or os.environ.get(env)
        if value:
            values[field] = (
                int(value)
                if field == "threads"
                else dict(item.strip().split("=", 1) for item in value.split(",") if item.strip())
                if field == "heldout"
                else [v.strip() for v in value.split(",") if v.strip()]
                if field in _LISTS
                else value
            )
    if not values.get("export_dir"):
        return None
    return ConformanceConfig(write_manifest=False, **values)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_check" not in metafunc.fixturenames:
        return
    cfg = conformance_config(metafunc.config)
    if cfg is None:
        metafunc.parametrize(
            "conformance_check", [pytest.param(None, marks=pytest.mark.skip(reason=SKIP_REASON))], ids=["no-export"]
        )
        return
    plan = plan_checks(cfg)
    metafunc.parametrize("conformance_check", plan, ids=[f"{c}::{m}" for c, m in plan])


@pytest.fixture(scope="session")
def conformance_report(request: pytest.FixtureRequest) -> dict:
    """The report dict of :func:`conformance.evaluate`, computed once per session."""
    cfg = conformance_config(request.config)
    if cfg is None:
        pytest.skip(SKIP_REASON)
    return evaluate(cfg)
