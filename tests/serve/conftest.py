"""Session fixtures for serve tests: a tiny tokenizer, a tiny model and its export dir (fp32 + int8)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


def make_verdict(
    export_dir: Path, variants: dict[str, bool], loosened: list | None = None, files_sha256: str | None = None
) -> dict:
    """A manifest verdict as ``prodip conformance`` writes it (prodip.conformance.verdict.merge_verdict) for the
    export's current files, checked with the shipped tolerances (plus ``loosened`` bounds, if any)."""
    from prodip.base.manifest import files_table_sha256, read_manifest
    from prodip.conformance.verdict import merge_verdict

    m = read_manifest(export_dir)
    tol = {"path": "/x/tolerances.toml", "sha256": "1" * 64, "shipped": not loosened, "loosened": loosened or []}
    report = {
        "variants": variants,
        "tolerances": tol,
        "export_files_sha256": files_sha256 or files_table_sha256(m["files"]),
        "candidates": {v: {"variant": v, "tolerance_table": v} for v in variants},
    }
    return merge_verdict(None, report, list(m["variants"]), "conformance/report.json", "0" * 64)


def build_export(tmp_dir: Path, *, variants=("fp32", "int8"), verdict: bool | None = True, **kwargs):
    """A tiny export through the real ``tests.fixtures.build_tiny_export`` path (vocab 512 > the tokenizer's
    ~300 tokens, as in padded training vocabularies), max_position_embeddings 128, plus a conformance
    verdict; returns (export_dir, the PyTorch model loaded from its checkpoint)."""
    from prodip import export
    from prodip.train.checkpoint import load_model
    from tests.fixtures import build_tiny_export

    kwargs.setdefault("max_position_embeddings", 128)
    out = build_tiny_export(tmp_dir, variants=list(variants), **kwargs)
    if verdict is not None:
        export.set_conformance(out, make_verdict(out, {k: verdict for k in variants}))
    model, _, _ = load_model(Path(tmp_dir) / "run")
    return out, model.eval()


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """(export_dir, torch model) with fp32 and int8 variants and a passing conformance verdict."""
    return build_export(tmp_path_factory.mktemp("serve"))


def wait_ready(client, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get("/health").status_code == 200:
            return
        time.sleep(0.02)
    raise TimeoutError(f"/health not 200 after {timeout_s} s: {client.get('/health').json()}")


@pytest.fixture(scope="module")
def client(tiny_export):
    """A TestClient of the fp32 variant, model loaded."""
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app

    with TestClient(create_app(tiny_export[0], "fp32", batch_wait_ms=2.0)) as c:
        wait_ready(c)
        yield c
