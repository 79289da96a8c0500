"""The serve package's pipeline stage: start ``prodip serve`` on the export, fetch completions, stop it.

Uses the standard library only (an HTTP client and a subprocess): the driver's serve stage is a
client of the real server, as a user would be.

    python -c "from prodip.serve.stage import STAGES; print([s.name for s in STAGES])"
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from prodip.base.errors import StageFailed
from prodip.base.records import Number, Record, RecordPart, refuse_newer
from prodip.base.stage import RunContext, Stage
from prodip.serve.config import ServeConfig

COMPLETIONS_FILE = "completions.json"


class Completion(RecordPart):
    """``completions.json`` ``completions[lang]``: one prompt sent to ``/v1/completions`` and its answer."""

    prompt: str
    completion: str
    finish_reason: str | None = None
    #: OpenAI's ``usage`` (prompt_tokens, completion_tokens, total_tokens)
    usage: dict[str, Any] | None = None
    #: wall time of the request (seconds)
    seconds: Number | None = None


class ChatReply(RecordPart):
    """``completions.json`` ``chat[lang]``: one user message sent to ``/v1/chat/completions`` and the reply,
    or ``error`` (``{status, code, message}``) when the server cannot chat with the model (:func:`chat_reply`)."""

    user: str
    reply: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    seconds: Number | None = None
    error: dict[str, Any] | None = None


class Completions(Record):
    """``OUT_DIR/completions.json`` (format_version 1): what ``prodip run``'s serve stage fetched over HTTP.
    Written by :func:`serve_run`, read by ``prodip.summary`` through :meth:`Record.read_or_none`.

    ``sampling`` (the OpenAI parameters used) and ``chat`` are absent in files made before they were recorded.
    """

    FILE: ClassVar[str] = COMPLETIONS_FILE
    MAKER: ClassVar[str] = "`prodip run` (its serve stage)"
    TRAILING_NEWLINE: ClassVar[bool] = False

    variant: str
    #: the completions endpoint the run asked (a loopback port, gone after the run)
    url: str
    #: ``max_tokens``, ``temperature``, ``top_p``, ``frequency_penalty``, ``seed``
    sampling: dict[str, Any] = Field(default_factory=dict)
    #: language -> the completion of its prompt
    completions: dict[str, Completion] = Field(default_factory=dict)
    #: language -> the chat reply to its user message
    chat: dict[str, ChatReply] = Field(default_factory=dict)


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released; a tiny race is acceptable here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _json_object(url: str, text: str) -> dict[str, Any]:
    """``text`` parsed as a JSON object.

    Raises:
        StageFailed: not JSON, or JSON that is not an object (the URL and the start of the text named).
    """
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise StageFailed(f"{url}: the answer is not a JSON object: {text[:300]!r}")
    return doc


def _http_json(url: str, body: dict[str, Any] | None = None, timeout_s: float = 120.0) -> dict[str, Any]:
    """GET (no body) or POST JSON; an HTTP error raises StageFailed with the server's error body.

    Sends ``Authorization: Bearer $PRODIP_API_KEY`` when that variable is set (the server reads it too).
    """
    data = None if body is None else json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if os.environ.get("PRODIP_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['PRODIP_API_KEY']}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return _json_object(url, resp.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        raise StageFailed(f"{url}: HTTP {err.code}: {err.read().decode('utf-8', 'replace')[:500]}") from None


def _http_post_status(url: str, body: dict[str, Any], timeout_s: float = 120.0) -> tuple[int, dict[str, Any]]:
    """POST JSON; returns ``(status, body)`` also for an HTTP error (its JSON body, or ``{"detail": text}``)."""
    headers = {"Content-Type": "application/json"}
    if os.environ.get("PRODIP_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['PRODIP_API_KEY']}"
    req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, _json_object(url, resp.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        text = err.read().decode("utf-8", "replace")
        try:
            return err.code, _json_object(url, text)
        except StageFailed:
            return err.code, {"detail": text[:500]}


def chat_reply(base: str, model_id: str, content: str, max_tokens: int, sampling: dict[str, Any]) -> dict[str, Any]:
    """One user message to ``/v1/chat/completions``; the reply is OpenAI's ``choices[0].message.content``.

    A model the server cannot chat with (an export without a chat template answers 400, OpenAI error
    code ``chat_not_supported``; a server without the route, 404) gives ``{"error": {"status", "code",
    "message"}}`` instead of a reply, so the run shows why rather than failing.

    Raises:
        StageFailed: any other HTTP error (the status and the server's message named).
    """
    body = {"model": model_id, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **sampling}
    t0 = time.perf_counter()
    status, doc = _http_post_status(f"{base}/v1/chat/completions", body)
    if status in (400, 404):
        error = doc.get("error")
        err: dict[str, Any] = error if isinstance(error, dict) else {}
        message = err.get("message") or doc.get("detail") or json.dumps(doc)[:300]
        return {"user": content, "error": {"status": status, "code": err.get("code"), "message": str(message)}}
    if status != 200:
        raise StageFailed(f"{base}/v1/chat/completions: HTTP {status}: {json.dumps(doc)[:500]}")
    choice = doc["choices"][0]
    return {
        "user": content,
        "reply": choice["message"]["content"],
        "finish_reason": choice.get("finish_reason"),
        "usage": doc.get("usage"),
        "seconds": time.perf_counter() - t0,
    }


def serve_run(
    cfg: ServeConfig,
    *,
    prompts: dict[str, str],
    max_tokens: int,
    timeout_s: float,
    out_dir: Path,
    sampling: dict[str, Any] | None = None,
    chat_prompts: dict[str, str] | None = None,
) -> Completions:
    """Start ``prodip serve`` on a free loopback port, fetch one completion per prompt (and one chat
    reply per chat prompt, :func:`chat_reply`), stop it.

    Args:
        cfg: the ``[serve]`` config: the export dir and the variant to serve.
        prompts: language -> prompt text.
        max_tokens: new tokens per completion.
        timeout_s: how long to wait for ``/health`` (seconds).
        out_dir: where ``completions.json`` and ``serve.log`` go.
        sampling: extra OpenAI completion parameters (``temperature``, ``top_p``,
            ``frequency_penalty``, ``seed``); default greedy.
        chat_prompts: language -> a user message sent to ``/v1/chat/completions`` (same sampling).
    Returns:
        the :class:`Completions` it wrote to ``OUT_DIR/completions.json`` (with the parameters used).
    Raises:
        StageFailed: the server does not come up or refuses a request (its message and status named).
        FileExistsError: ``OUT_DIR/completions.json`` was written by a newer prodip (its format_version
            named); checked before the server starts, and the file is left as it is.
    """
    refuse_newer(Completions, out_dir / COMPLETIONS_FILE, action="the serve stage", instead="choose another --out-dir")
    sampling = {"temperature": 0.0, **(sampling or {})}
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "prodip",
        "serve",
        str(cfg.export_dir),
        "--variant",
        cfg.variant,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    log_path = out_dir / "serve.log"
    with open(log_path, "w", encoding="utf-8") as log_fh:
        # PYTHONSAFEPATH (Python >= 3.11): `-m` must not put the current folder first on sys.path,
        # where a folder named prodip/ (say, the parent of a clone) would shadow the package.
        proc = subprocess.Popen(cmd, stdout=log_fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONSAFEPATH": "1"})
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_healthy(base, proc, timeout_s, log_path)
            model_id = _http_json(f"{base}/v1/models")["data"][0]["id"]
            results = {}
            for lang, prompt in prompts.items():
                t0 = time.perf_counter()
                body = {"model": model_id, "prompt": prompt, "max_tokens": max_tokens, **sampling}
                resp = _http_json(f"{base}/v1/completions", body)
                results[lang] = {
                    "prompt": prompt,
                    "completion": resp["choices"][0]["text"],
                    "finish_reason": resp["choices"][0].get("finish_reason"),
                    "usage": resp.get("usage"),
                    "seconds": time.perf_counter() - t0,
                }
            chats = {
                lang: chat_reply(base, model_id, content, max_tokens, sampling)
                for lang, content in (chat_prompts or {}).items()
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    doc = {
        "format_version": Completions.FORMAT_VERSION,
        "variant": cfg.variant,
        "url": f"http://127.0.0.1:{port}/v1/completions",
        "sampling": {"max_tokens": max_tokens, **sampling},
        "completions": results,
        "chat": chats,
    }
    record = Completions.from_dict(doc, out_dir / COMPLETIONS_FILE)
    record.write(out_dir / COMPLETIONS_FILE)
    return record


def _wait_healthy(base: str, proc: subprocess.Popen[bytes], timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or [""]
            raise StageFailed(f"prodip serve exited with code {proc.returncode}: {last[0]} (log: {log_path})")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise StageFailed(f"prodip serve did not become healthy within {timeout_s:.0f} s; see {log_path}")


def serve_stage_run(cfg: ServeConfig, ctx: RunContext) -> Completions:
    """:func:`serve_run` with the run's requests (the pipeline file's ``completion_*`` and ``chat_prompts`` keys)."""
    req = ctx.requests
    return serve_run(
        cfg,
        prompts=req.prompts,
        max_tokens=req.max_tokens,
        sampling=dict(req.sampling),
        timeout_s=req.timeout_s,
        out_dir=ctx.out_dir,
        chat_prompts=req.chat_prompts,
    )


SERVE: Stage[ServeConfig] = Stage(
    name="serve",
    tables={"serve": ServeConfig},
    reads=("export",),
    writes="",
    needs="conformance",
    describe=lambda c: f"HTTP completions from {c.export_dir} ({c.variant})",
    done=lambda c: False,  # always runs: it fetches this invocation's completions
    run=serve_stage_run,
)
STAGES: tuple[Stage[Any], ...] = (SERVE,)
