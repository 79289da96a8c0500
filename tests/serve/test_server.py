"""A real server: `python -m prodip.serve serve` on a free loopback port, the `openai` client against it,
32 concurrent requests, client disconnects, CLI refusal, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import socket
import subprocess
import time

import httpx
import pytest

from prodip.serve.stage import free_port
from tests.serve.conftest import SERVE, serve_app, serve_export

pytestmark = pytest.mark.slow
KEY = "test-key"


@pytest.fixture(scope="module")
def server(tiny_export):
    with serve_export(tiny_export[0], "--variant", "int8", "--api-key", KEY, "--log-level", "warning") as srv:
        yield srv.base, srv.proc


def test_openai_client_plain_and_streaming(server):
    import openai

    base, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["export"]
    r = client.completions.create(model="export", prompt="আমি বাংলায়", max_tokens=24, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 1
    stream = client.completions.create(model="export", prompt="আমি বাংলায়", max_tokens=24, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream) == r.choices[0].text
    r = client.completions.create(model="export", prompt="hello", max_tokens=0, echo=True, logprobs=1)
    assert r.choices[0].text == "hello" and r.choices[0].logprobs.token_logprobs[0] is None
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="export", prompt="x", max_tokens=10_000)
    assert "128" in str(err.value)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()


def test_32_concurrent_requests(server):
    base, _ = server
    headers = {"Authorization": f"Bearer {KEY}"}

    async def main():
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=60) as c:
            bodies = [
                {
                    "prompt": f"আমি {i}",
                    "max_tokens": 32,
                    "temperature": 0.7,
                    "seed": i,
                    "ignore_eos": True,
                    "stream": i % 2 == 1,
                }
                for i in range(32)
            ]
            return await asyncio.gather(*(c.post("/v1/completions", json=b) for b in bodies))

    start = time.perf_counter()
    responses = asyncio.run(main())
    elapsed = time.perf_counter() - start
    assert [r.status_code for r in responses] == [200] * 32
    for i, r in enumerate(responses):
        if i % 2 == 0:
            assert r.json()["usage"]["completion_tokens"] == 32
        else:
            assert r.text.rstrip().endswith("data: [DONE]")
    assert elapsed < 30
    # they were decoded together: some decode steps carried more than 8 rows
    metrics = httpx.get(f"{base}/metrics", headers=headers).text
    buckets = {
        line.split('le="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("prodip_decode_batch_rows_bucket")
    }
    assert buckets["+Inf"] > buckets["8.0"]


def test_cli_refuses_unverified_export(tiny_export, tmp_path):
    d = tmp_path / "unverified"
    shutil.copytree(tiny_export[0], d)
    m = json.loads((d / "manifest.json").read_text())
    m["conformance"]["variants"]["fp32"] = m["conformance"]["checks"]["fp32"]["passed"] = False
    (d / "manifest.json").write_text(json.dumps(m))
    r = subprocess.run(
        [*SERVE, str(d), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "FAILED conformance" in r.stderr and "--allow-unverified" in r.stderr


def test_graceful_shutdown_on_sigterm(tiny_export):
    with serve_export(tiny_export[0], "--log-level", "info") as srv:
        srv.proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down (lifespan end: engine thread stopped), then re-raises the signal
        assert srv.proc.wait(15) in (0, -signal.SIGTERM)
        assert srv.proc.stderr is not None
        log = srv.proc.stderr.read().decode()
        assert "Application shutdown complete" in log and "Finished server process" in log


class _SlowDecoder:
    """Wraps the ONNX decoder so that each step takes >= 20 ms (makes a disconnect observable): its two entry
    points, ``forward`` (prefill) and ``decode`` (a decode step)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, *args):
        self.calls += 1
        time.sleep(0.02)
        return self.inner.forward(*args)

    def decode(self, *args):
        self.calls += 1
        time.sleep(0.02)
        return self.inner.decode(*args)


def test_client_disconnect_stops_generation(tiny_export):
    from prodip.serve.app import create_app

    app = create_app(tiny_export[0])
    with serve_app(app) as base:
        sched = app.state.service.scheduler
        sched.decoder = slow = _SlowDecoder(sched.decoder)
        body = {"prompt": "আমি", "max_tokens": 120, "ignore_eos": True, "temperature": 0, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=30) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
        calls_at_close = slow.calls
        time.sleep(0.3)  # ~15 steps' time if it kept going
        assert slow.calls - calls_at_close <= 3
        assert not sched._groups
        # same for a non-streamed request whose client times out
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{base}/v1/completions", json={**body, "stream": False}, timeout=0.3)
        calls_at_close = slow.calls
        time.sleep(0.4)
        assert slow.calls - calls_at_close <= 4


def test_unhandled_error_logs_one_traceback(tiny_export, monkeypatch):
    """A bug in a route: a 500 in OpenAI's form, and one traceback in the logs. (Starlette's
    ServerErrorMiddleware re-raises after answering, so uvicorn's "Exception in ASGI application"
    used to log the same error a second time after serve.app's own.) Once a stream has started the
    status cannot change: then the server's log is the only one and the connection is cut."""
    import logging

    from prodip.serve.app import create_app

    app = create_app(tiny_export[0])
    seen: dict[int, logging.LogRecord] = {}

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info:
                seen[id(record)] = record  # a record reaching several of the loggers counts once

    def tracebacks() -> list:
        time.sleep(0.3)  # uvicorn logs after the app returns
        out = [r for r in seen.values() if "planted" in str(r.exc_info[1])]
        seen.clear()
        return out

    handler = Collect(logging.ERROR)
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error", "serve", "prodip.serve.app")]
    with serve_app(app) as base, contextlib.ExitStack() as handlers:
        # uvicorn has configured its loggers by now
        for lg in loggers:
            lg.addHandler(handler)
            handlers.callback(lg.removeHandler, handler)

        def boom(*args, **kwargs):
            raise RuntimeError("planted")

        svc = app.state.service
        monkeypatch.setattr(svc, "prompt_ids", boom)
        r = httpx.post(f"{base}/v1/completions", json={"prompt": "x"}, timeout=10)
        assert r.status_code == 500
        assert r.json()["error"] == {
            "message": "internal error: RuntimeError",
            "type": "server_error",
            "param": None,
            "code": None,
        }
        logged = tracebacks()
        assert len(logged) == 1 and logged[0].name == "prodip.serve.app", [(x.name, x.getMessage()) for x in logged]
        assert "POST /v1/completions" in logged[0].getMessage()
        monkeypatch.undo()
        monkeypatch.setattr(svc, "token_text", boom)  # fails after the stream's 200 went out
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(
                f"{base}/v1/completions",
                json={"prompt": "x", "stream": True, "logprobs": 1},
                timeout=10,
            )
        logged = tracebacks()
        assert len(logged) == 1 and logged[0].name == "uvicorn.error", [(x.name, x.getMessage()) for x in logged]
        monkeypatch.undo()
        assert (
            httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10).status_code == 200
        )


@pytest.mark.parametrize("host", ["127.0.0.1", "no-such-host.invalid", "203.0.113.7"])
def test_cli_bind_failure_is_one_line_exit_2(tiny_export, host):
    with socket.socket() as held:  # the port is in use (only matters for the loopback case)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run(
            [
                *SERVE,
                str(tiny_export[0]),
                "--host",
                host,
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith(f"prodip serve: error: cannot bind {host}:{port} ("), r.stderr
    assert "Traceback" not in r.stderr and "Errno" not in r.stderr


def test_pipeline_chat_reply_on_a_base_model_shows_why(server, monkeypatch):
    """The run's chat fetch (prodip.serve.stage.chat_reply) against the real server: an export without a
    chat template gets no reply but the server's reason (400 chat_not_supported; 404 on a server without the
    route), not a crashed run; any other failure still raises."""
    from prodip.base.errors import StageFailed
    from prodip.serve.stage import Sampling, _http_json, chat_reply

    base, _ = server
    monkeypatch.setenv("PRODIP_API_KEY", KEY)
    model_id = _http_json(f"{base}/v1/models")["data"][0]["id"]
    got = chat_reply(base, model_id, "হ্যালো", 4, Sampling(temperature=0.0))
    assert got.reply is None and got.user == "হ্যালো" and got.error is not None and got.error.message, got
    assert got.error.status in (400, 404)
    if got.error.status == 400:
        assert got.error.code == "chat_not_supported", got
    assert "reply" not in got.model_dump(exclude_unset=True)  # completions.json holds no reply key for it
    monkeypatch.setenv("PRODIP_API_KEY", "wrong-key")  # 401: a real failure, named
    with pytest.raises(StageFailed, match="HTTP 401"):
        chat_reply(base, model_id, "hi", 4, Sampling())
