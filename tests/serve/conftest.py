"""Session fixtures for serve tests: a tiny tokenizer, a tiny model and its export dir (fp32 + int8),
and the one way the tests start a real server (:func:`serve_export`: ``prodip serve`` in a process;
:func:`serve_app`: an app under uvicorn in a thread). tests/browser imports these too."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

from prodip.serve.stage import free_port

#: ``prodip serve`` through the serve-only command line (``python -m prodip.serve``)
SERVE = (sys.executable, "-m", "prodip.serve", "serve")
#: The base URL of in-process test clients: a Host the server answers without an API key (TestClient's own
#: default, ``testserver``, is a foreign name, refused like any other: serve/config.py HostCheck).
LOCAL = "http://localhost"


def make_verdict(
    export_dir: Path, variants: dict[str, bool], loosened: list | None = None, files_sha256: str | None = None
) -> dict:
    """A manifest verdict as ``prodip conformance`` writes it (prodip.conformance.verdict.merge_verdict) for the
    export's current files, checked with the shipped tolerances (plus ``loosened`` bounds, if any)."""
    from prodip.base.manifest import files_table_sha256, load_manifest
    from prodip.conformance.verdict import merge_verdict

    m = load_manifest(export_dir)
    tol = {"path": "/x/tolerances.toml", "sha256": "1" * 64, "shipped": not loosened, "loosened": loosened or []}
    report = {
        "variants": variants,
        "tolerances": tol,
        "export_files_sha256": files_sha256 or files_table_sha256(m.files_table()),
        "candidates": {v: {"variant": v, "tolerance_table": v} for v in variants},
    }
    return merge_verdict(None, report, list(m.variants), "conformance/report.json", "0" * 64)


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

    with TestClient(create_app(tiny_export[0], "fp32", batch_wait_ms=2.0), base_url=LOCAL) as c:
        wait_ready(c)
        yield c


def wait_http(url: str, timeout_s: float = 60.0, proc: Optional[subprocess.Popen[bytes]] = None) -> None:
    """Poll ``url`` until it answers 200.

    Raises:
        RuntimeError: ``proc`` exited first (its exit code and the end of its stderr named).
        TimeoutError: no 200 within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise RuntimeError(f"server exited with {proc.returncode}: {err}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(url)


@dataclass
class Served:
    """A running ``prodip serve``: its process and its loopback port."""

    proc: subprocess.Popen[bytes]
    port: int

    @property
    def base(self) -> str:
        """``http://127.0.0.1:PORT``"""
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def serve_export(
    export_dir: Path | str,
    *args: str,
    prog: Sequence[str] = SERVE,
    timeout_s: float = 60.0,
    stdout: Any = subprocess.DEVNULL,
    **popen: Any,
) -> Iterator[Served]:
    """``PROG EXPORT_DIR --port PORT ARGS`` on a free loopback port, yielded once ``/health`` is 200;
    on exit SIGTERM, then a kill after 15 s. stderr is a pipe (read it after the process ends, as
    the shutdown test does); ``popen``: more ``subprocess.Popen`` arguments (``env``, ``cwd``).

    Raises:
        RuntimeError / TimeoutError: the server exited or was not healthy in time (:func:`wait_http`).
    """
    port = free_port()
    cmd = [*prog, str(export_dir), "--port", str(port), *args]
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.PIPE, **popen)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=timeout_s, proc=proc)
        yield Served(proc, port)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def serve_app(app: Any) -> Iterator[str]:
    """``app`` under uvicorn in a thread of this process (so a test can reach into it) on a free
    loopback port; yields the base URL once ``/health`` is 200, and stops the server on exit."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
