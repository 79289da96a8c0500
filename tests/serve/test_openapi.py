"""Issue 14 item 4: the served OpenAPI document describes what the server does. schemathesis
generates requests from it against a real ``prodip serve`` (bounded: a few examples per operation,
fixed seed) and checks every answer: no server error, status codes and content types documented,
bodies matching the documented schemas."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import serve_export

pytestmark = pytest.mark.slow
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


@pytest.fixture(scope="module")
def base_url(tiny_export):
    with serve_export(tiny_export[0], "--log-level", "error") as srv:
        yield srv.base


def test_document_lists_real_status_codes_and_types(base_url):
    doc = httpx.get(f"{base_url}/openapi.json").json()
    ops = doc["paths"]
    for path in ("/v1/completions", "/v1/generate", "/tokenize", "/detokenize"):
        codes = set(ops[path]["post"]["responses"])
        assert {"200", "400", "401", "413", "500", "503"} <= codes and "422" not in codes, (path, codes)
        assert ops[path]["post"]["responses"]["400"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorResponse"
        }
    assert set(ops["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert "text/event-stream" in ops["/v1/completions"]["post"]["responses"]["200"]["content"]
    assert "400" in ops["/v1/chat/completions"]["post"]["responses"]
    r = httpx.post(f"{base_url}/v1/completions", json={"prompt": "x", "max_tokens": -1})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{base_url}/metrics").headers["content-type"].startswith("text/plain")


def test_schemathesis_finds_no_mismatch(base_url, tmp_path):
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    report = tmp_path / "report.json"
    cmd = [
        exe,
        "run",
        f"{base_url}/openapi.json",
        "--checks",
        CHECKS,
        "--max-examples",
        "12",
        "--seed",
        "14",
        "--generation-deterministic",
        "--request-timeout",
        "60",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
        "--no-color",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=tmp_path)  # its cache dir goes there
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    events = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    assert events, "no schemathesis events recorded"
