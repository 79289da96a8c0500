"""The serve package's record: ``OUT_DIR/completions.json`` (:class:`Completions`), what ``prodip run``'s serve
stage fetched over HTTP from the real server (written by :func:`prodip.serve.stage.serve_run`, read by
``prodip.summary``). The server itself writes no artifact.

    python -c "from prodip.serve.records import Completions; print(Completions.FILE)"
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from prodip.base.records import Number, Record, RecordPart

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
    or ``error`` (``{status, code, message}``) when the server cannot chat with the model (:func:`prodip.serve.stage.chat_reply`)."""

    user: str
    reply: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    seconds: Number | None = None
    error: dict[str, Any] | None = None


class Completions(Record):
    """``OUT_DIR/completions.json`` (format_version 1): what ``prodip run``'s serve stage fetched over HTTP.
    Written by :func:`prodip.serve.stage.serve_run`, read by ``prodip.summary`` through :meth:`Record.read_or_none`.

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
