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
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from prodip.base.errors import StageFailed
from prodip.base.jsontypes import JSONObject, JSONValue
from prodip.base.records import refuse_newer
from prodip.base.stage import RunContext, Stage
from prodip.serve.config import ServeConfig
from prodip.serve.records import COMPLETIONS_FILE, ChatError, ChatReply, Completion, Completions, Sampling


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released; a tiny race is acceptable here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _json_object(url: str, text: str) -> JSONObject:
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


def _http_json(url: str, body: JSONObject | None = None, timeout_s: float = 120.0) -> JSONObject:
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


def _http_post_status(url: str, body: JSONObject, timeout_s: float = 120.0) -> tuple[int, JSONObject]:
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


_M = TypeVar("_M", bound=BaseModel)


def _at(url: str, doc: JSONObject, *path: str | int) -> JSONValue:
    """``doc[path[0]][path[1]]...`` of a server answer.

    Raises:
        StageFailed: a key or index on the way is missing, or a value there is of another kind (the URL and
            the path named).
    """
    value: JSONValue = doc
    for i, key in enumerate(path):
        if isinstance(key, int) and isinstance(value, list) and -len(value) <= key < len(value):
            value = value[key]
        elif isinstance(key, str) and isinstance(value, dict) and key in value:
            value = value[key]
        else:
            raise StageFailed(f"{url}: unexpected answer: no {'.'.join(map(str, path[: i + 1]))}")
    return value


def _object_at(url: str, doc: JSONObject, *path: str | int) -> JSONObject:
    """:func:`_at`, which must be a JSON object.

    Raises:
        StageFailed: as :func:`_at`, or the value is not an object (the URL and the path named).
    """
    value = _at(url, doc, *path)
    if not isinstance(value, dict):
        raise StageFailed(f"{url}: unexpected answer: {'.'.join(map(str, path))} is not an object")
    return value


def _answer(url: str, record: type[_M], **fields: Any) -> _M:
    """``record`` made from the fields read off a server answer.

    Raises:
        StageFailed: a field of the answer has the wrong type (the URL, field and why named).
    """
    try:
        return record(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise StageFailed(f"{url}: unexpected answer: {where}: {first['msg']}") from None


def chat_reply(base: str, model_id: str, content: str, max_tokens: int, sampling: Sampling) -> ChatReply:
    """One user message to ``/v1/chat/completions``; the reply is OpenAI's ``choices[0].message.content``.

    A model the server cannot chat with (an export without a chat template answers 400, OpenAI error
    code ``chat_not_supported``; a server without the route, 404) gives a reply with ``error`` (status, code,
    message) instead, so the run shows why rather than failing.

    Raises:
        StageFailed: any other HTTP error (the status and the server's message named).
    """
    messages: list[JSONValue] = [{"role": "user", "content": content}]
    body: JSONObject = {"model": model_id, "messages": messages, "max_tokens": max_tokens, **sampling.request()}
    t0 = time.perf_counter()
    status, doc = _http_post_status(f"{base}/v1/chat/completions", body)
    if status in (400, 404):
        error = doc.get("error")
        err = error if isinstance(error, dict) else {}
        message = err.get("message") or doc.get("detail") or json.dumps(doc)[:300]
        code = err.get("code")  # OpenAI's error code: a string (or null)
        return ChatReply(
            user=content,
            error=ChatError(status=status, code=None if code is None else str(code), message=str(message)),
        )
    if status != 200:
        raise StageFailed(f"{base}/v1/chat/completions: HTTP {status}: {json.dumps(doc)[:500]}")
    url = f"{base}/v1/chat/completions"
    choice = _object_at(url, doc, "choices", 0)
    return _answer(
        url,
        ChatReply,
        user=content,
        reply=_at(url, choice, "message", "content"),
        finish_reason=choice.get("finish_reason"),
        usage=doc.get("usage"),
        seconds=time.perf_counter() - t0,
    )


def serve_run(
    cfg: ServeConfig,
    *,
    prompts: dict[str, str],
    max_tokens: int,
    timeout_s: float,
    out_dir: Path,
    sampling: Mapping[str, int | float] | None = None,
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
    used = Sampling.model_validate({"max_tokens": max_tokens, "temperature": 0.0, **(sampling or {})})
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
            model_id = _at(f"{base}/v1/models", _http_json(f"{base}/v1/models"), "data", 0, "id")
            if not isinstance(model_id, str):
                raise StageFailed(f"{base}/v1/models: unexpected answer: data.0.id is not a string")
            results = {}
            for lang, prompt in prompts.items():
                t0 = time.perf_counter()
                body: JSONObject = {"model": model_id, "prompt": prompt, "max_tokens": max_tokens, **used.request()}
                url = f"{base}/v1/completions"
                resp = _http_json(url, body)
                choice = _object_at(url, resp, "choices", 0)
                results[lang] = _answer(
                    url,
                    Completion,
                    prompt=prompt,
                    completion=_at(url, choice, "text"),
                    finish_reason=choice.get("finish_reason"),
                    usage=resp.get("usage"),
                    seconds=time.perf_counter() - t0,
                )
            chats = {
                lang: chat_reply(base, model_id, content, max_tokens, used)
                for lang, content in (chat_prompts or {}).items()
            }
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    record = Completions(
        format_version=Completions.FORMAT_VERSION,
        variant=cfg.variant,
        url=f"http://127.0.0.1:{port}/v1/completions",
        sampling=used,
        completions=results,
        chat=chats,
    )
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
        sampling=req.sampling,
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
