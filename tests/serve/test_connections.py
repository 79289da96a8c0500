"""What a deployed server needs from its HTTP layer: an API key every client can send (or a refusal at startup),
deadlines for slow or silent clients (408 / close), a connection cap (503), and one rule for empty token-id prompts.

The socket tests run a real ``prodip serve`` on 127.0.0.1 with deadlines of a second or two, so each is bounded.

python -m pytest tests/serve/test_connections.py -q
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from prodip.serve.stage import free_port
from tests.serve.conftest import LOCAL, serve_export

UNICODE_KEY = "ключ-চাবি-1"


@pytest.mark.parametrize("key", [UNICODE_KEY, "two words", "tab\there", ""])
def test_unsendable_api_key_refused_at_startup(tiny_export, key):
    from prodip.base.errors import InvalidInput
    from prodip.serve.app import create_app

    with pytest.raises(InvalidInput, match="API key"):
        create_app(tiny_export[0], "fp32", api_key=key)


def test_unsendable_key_from_env_is_one_line_exit_2(tiny_export):
    """The reported case (N3): the server started, and no request could ever authenticate."""
    env = {**os.environ, "PRODIP_API_KEY": UNICODE_KEY}
    proc = subprocess.run(
        [sys.executable, "-m", "prodip", "serve", str(tiny_export[0]), "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "U+043A" in lines[0] and "$PRODIP_API_KEY" in lines[0], proc.stderr


def test_key_compared_as_sent(tiny_export):
    """Raw header bytes against the key's bytes: the right key passes, its UTF-8 look-alikes do not."""
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app

    with TestClient(create_app(tiny_export[0], "fp32", api_key="k-1~!"), base_url=LOCAL) as c:
        assert c.get("/v1/models", headers={"Authorization": "Bearer k-1~!"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "bearer k-1~!"}).status_code == 200
        assert c.get("/v1/models", headers={"Authorization": "Bearer k-1~"}).status_code == 401
        latin = "Bearer k-1~!é".encode("latin-1")  # noqa: RUF001
        assert c.get("/v1/models", headers={"Authorization": latin}).status_code == 401


@pytest.mark.parametrize(
    ("route", "prompt"),
    [
        ("/v1/completions", []),
        ("/v1/completions", [[]]),
        ("/v1/completions", [[5, 6], []]),
        ("/v1/generate", []),
    ],
)
def test_empty_token_id_prompt_is_400_on_every_route(client, route, prompt):
    from prodip.serve.service import EMPTY_PROMPT

    field = "max_tokens" if route == "/v1/completions" else "max_new_tokens"
    r = client.post(route, json={"prompt": prompt, field: 2})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "prompt" and r.json()["error"]["message"] == EMPTY_PROMPT


def test_empty_text_prompt_starts_at_the_document_start(client):
    for route, field in (("/v1/completions", "max_tokens"), ("/v1/generate", "max_new_tokens")):
        r = client.post(route, json={"prompt": "", field: 2, "temperature": 0})
        assert r.status_code == 200, r.text


REQUEST_S, IDLE_S, MAX_CONN = 1.5, 1.0, 4


@pytest.fixture(scope="module")
def deadline_server(tiny_export):
    limits = ["--request-timeout-s", str(REQUEST_S), "--keep-alive-s", str(IDLE_S), "--max-connections", str(MAX_CONN)]
    args = ["--variant", "fp32", *limits, "--max-header-bytes", "4096", "--log-level", "warning"]
    with serve_export(tiny_export[0], *args, prog=(sys.executable, "-m", "prodip", "serve")) as srv:
        yield srv.port


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.settimeout(10)
    return s


def _answer(s: socket.socket) -> tuple[float, bytes]:
    """Read until the server closes; (seconds it took, bytes received)."""
    t0, data = time.monotonic(), b""
    while chunk := s.recv(65536):
        data += chunk
    return time.monotonic() - t0, data


BODY = json.dumps({"prompt": "a", "max_tokens": 1}).encode()
HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
)


@pytest.mark.slow
@pytest.mark.parametrize("part", ["headers", "body"])
def test_trickled_request_gets_408_then_close(deadline_server, part):
    """The reported case (N4): headers or a body trickled a byte at a time were held open for minutes."""
    s = _connect(deadline_server)
    t0 = time.monotonic()
    if part == "body":
        s.sendall(HEAD % len(BODY) + BODY[:3])
    else:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Pad: a")
    s.settimeout(0.3)
    data = b""
    while time.monotonic() - t0 < REQUEST_S + 5:  # a byte every 0.3 s keeps the socket busy, not complete
        try:
            s.sendall(b"a")
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        except TimeoutError:
            continue
        except OSError:
            break
    took = time.monotonic() - t0
    assert REQUEST_S - 0.1 <= took < REQUEST_S + 3, took
    assert data.startswith(b"HTTP/1.1 408 "), data[:200]
    assert json.loads(data.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


@pytest.mark.slow
def test_silent_and_idle_connections_are_closed(deadline_server):
    s = _connect(deadline_server)  # never sends a byte
    took, data = _answer(s)
    assert data == b"" and IDLE_S - 0.1 <= took < IDLE_S + 3, took
    s = _connect(deadline_server)  # one request, then idle on a kept-alive connection
    s.sendall(HEAD % len(BODY) + BODY)
    took, data = _answer(s)
    assert data.startswith(b"HTTP/1.1 200 ") and took < 30 + IDLE_S + 3


@pytest.mark.slow
def test_slow_but_timely_request_and_connection_cap(deadline_server):
    s = _connect(deadline_server)
    s.sendall(HEAD % len(BODY) + BODY[:5])
    time.sleep(REQUEST_S / 3)
    s.sendall(BODY[5:])  # within the deadline: answered normally
    assert s.recv(65536).startswith(b"HTTP/1.1 200 ")
    s.close()
    held = [_connect(deadline_server) for _ in range(MAX_CONN)]
    for h in held:
        h.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")  # headers never finished
    time.sleep(0.2)
    extra = _connect(deadline_server)
    extra.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    _, data = _answer(extra)
    assert data.startswith(b"HTTP/1.1 503 "), data[:200]
    for h in held:
        h.close()
    time.sleep(0.3)
    again = _connect(deadline_server)
    again.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert _answer(again)[1].startswith(b"HTTP/1.1 200 ")


@pytest.mark.slow
def test_oversized_headers_are_refused(deadline_server):
    """Whole (431, from the app) or still arriving past the cap (400, from h11): never parsed on and on."""
    s = _connect(deadline_server)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nX-Pad: " + b"a" * 5000 + b"\r\n\r\n")
    assert _answer(s)[1].startswith(b"HTTP/1.1 431 ")
    s = _connect(deadline_server)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + b"a" * 5000)  # no end of headers
    assert _answer(s)[1].startswith(b"HTTP/1.1 400 ")
