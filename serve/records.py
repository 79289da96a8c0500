"""The serve package's record: ``OUT_DIR/completions.json`` (:class:`Completions`), what ``prodip run``'s serve
stage fetched over HTTP from the real server (written by :func:`prodip.serve.stage.serve_run`, read by
``prodip.summary``). The server itself writes no artifact.

    python -c "from prodip.serve.records import Completions; print(Completions.FILE)"
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, StrictInt

from prodip.base.records import Number, Record, RecordPart

COMPLETIONS_FILE = "completions.json"


class Usage(RecordPart):
    """OpenAI's ``usage`` of one answer, as the server gave it (tokens)."""

    prompt_tokens: StrictInt | None = None
    completion_tokens: StrictInt | None = None
    total_tokens: StrictInt | None = None


class ChatError(RecordPart):
    """Why the server gave no chat reply: the HTTP status, OpenAI's error ``code`` and its message."""

    status: StrictInt
    code: str | None = None
    message: str


class Sampling(RecordPart):
    """``completions.json`` ``sampling``: the OpenAI parameters of every request the serve stage sent."""

    #: new tokens per completion and chat reply (tokens)
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    frequency_penalty: Number | None = None
    seed: StrictInt | None = None

    def request(self) -> dict[str, int | float]:
        """The parameters set, as the keys of an OpenAI request body (``max_tokens`` left to the caller)."""
        return {k: v for k, v in self.model_dump(exclude_none=True).items() if k != "max_tokens"}


class Completion(RecordPart):
    """``completions.json`` ``completions[lang]``: one prompt sent to ``/v1/completions`` and its answer."""

    prompt: str
    completion: str
    finish_reason: str | None = None
    usage: Usage | None = None
    #: wall time of the request (seconds)
    seconds: Number | None = None


class ChatReply(RecordPart):
    """``completions.json`` ``chat[lang]``: one user message sent to ``/v1/chat/completions`` and the reply,
    or ``error`` (``{status, code, message}``) when the server cannot chat with the model (:func:`prodip.serve.stage.chat_reply`)."""

    user: str
    reply: str | None = None
    finish_reason: str | None = None
    usage: Usage | None = None
    seconds: Number | None = None
    error: ChatError | None = None


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
    sampling: Sampling = Field(default_factory=Sampling)
    #: language -> the completion of its prompt
    completions: dict[str, Completion] = Field(default_factory=dict)
    #: language -> the chat reply to its user message
    chat: dict[str, ChatReply] = Field(default_factory=dict)
