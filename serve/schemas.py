"""Request and response bodies of the HTTP API (pydantic).

Requests are ``extra="forbid"``: an unknown field is a 400.

Ranges are checked here (-> 400 in OpenAI's error form, see ``prodip.serve.app``); limits that need the
model (context window, vocabulary) are checked in ``prodip.serve.service``. As in OpenAI's API, ``null`` for
an optional field means its default, types are strict (a number sent as a string, an integer field
sent as ``2.0`` or a boolean sent as ``1`` is a 400; integers are fine for float fields), and every text (prompt, stop, model, ...) must be valid Unicode:
a lone UTF-16 surrogate (JSON ``"\\ud800"``, which Python's json accepts) is a 400 naming the field.

The response models document the 200 bodies in the OpenAPI document (``responses={200: {"model": ...}}``
on the route); the handlers build the bodies as plain dicts (prodip.serve.completions), and
tests/serve/test_openapi.py checks real answers against these schemas with schemathesis.

    python -c "from prodip.serve.schemas import CompletionRequest as C; print(C(prompt='hi', max_tokens=4))"
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from prodip.base.chat import MessageError, check_message, check_role
from prodip.serve.batching import SamplingParams

#: prompt forms OpenAI accepts: text, several texts, token ids, several token-id lists.
Prompt = Union[str, list[str], list[int], list[list[int]]]
Stop = Optional[Union[str, list[str]]]


class _Strict(BaseModel):
    #: strict types, as OpenAI: ``"max_tokens": "5"``, ``"n": 2.0`` or ``"echo": 1`` are 400s naming the
    #: field; a float field still takes an integer (``"temperature": 1``).
    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """``"temperature": null`` etc. = the field's default (OpenAI accepts null for optional fields)."""
        if isinstance(data, dict):
            return {
                k: v
                for k, v in data.items()
                if not (v is None and k in cls.model_fields and not cls.model_fields[k].is_required())
            }
        return data

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any, info: ValidationInfo) -> Any:
        """Raises: a validation error (-> 400, param = the field) for a lone surrogate in any text."""
        bad = _lone_surrogate(value)
        if bad is not None:
            raise PydanticCustomError(
                "lone_surrogate",
                "{field} contains a lone UTF-16 surrogate U+{code} (not valid Unicode)",
                {"field": info.field_name, "code": f"{bad:04X}"},
            )
        return value


class StreamOptions(_Strict):
    include_usage: bool = False


def _stream_options_need_stream(value: Optional[StreamOptions], info: ValidationInfo) -> Optional[StreamOptions]:
    """The ``stream_options`` validator of the completion requests.

    Raises:
        a validation error (-> 400, param ``stream_options``) without ``stream: true``, as OpenAI's API
        and vLLM answer.
    """
    if value is not None and not info.data.get("stream"):
        raise PydanticCustomError("stream_options", "stream_options is only allowed when stream is true")
    return value


class SamplingRequest(_Strict):
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1, description="keep the k most likely tokens; -1 or 0 = all (extension)")
    seed: Optional[int] = Field(
        None, ge=-(2**63), le=2**63 - 1, description="same seed, same output (a signed 64-bit integer, as OpenAI)"
    )
    stop: Stop = Field(None, description="stop strings, never included in the output")
    stream: bool = False
    ignore_eos: bool = Field(False, description="keep generating after <|eos|> (benchmarks)")
    presence_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="subtracted once from the logit of every token generated so far (OpenAI)"
    )
    frequency_penalty: float = Field(
        0.0, ge=-2.0, le=2.0, description="subtracted from a token's logit per time it was generated so far (OpenAI)"
    )
    logit_bias: Optional[dict[str, float]] = Field(
        None, description='{"token id": bias in [-100, 100]} added to the logits before sampling (OpenAI)'
    )

    @field_validator("logit_bias", mode="after")
    @classmethod
    def _logit_bias_form(cls, value: Optional[dict[str, float]]) -> Optional[dict[str, float]]:
        """Keys: token ids in ASCII decimal ("50256"), one entry per id; values in [-100, 100].
        Whether an id is inside the vocabulary is checked in ``prodip.serve.service`` (it needs the model).

        Raises: a validation error (-> 400, param ``logit_bias``) naming the offending key.
        """
        if value is None:
            return None
        seen: dict[int, str] = {}
        for key, bias in value.items():
            shown = repr(key[:40].encode("utf-8", "backslashreplace").decode("utf-8"))
            if not (key.isascii() and key.isdigit()):
                raise PydanticCustomError(
                    "logit_bias_key",
                    "logit_bias keys must be token ids written as "
                    'non-negative decimal integers (e.g. "50256"); got {key}',
                    {"key": shown},
                )
            if len(key.lstrip("0")) > 18:
                raise PydanticCustomError(
                    "logit_bias_key", "logit_bias key {key} is too large to be a token id", {"key": shown}
                )
            tid = int(key)
            if tid in seen:
                raise PydanticCustomError(
                    "logit_bias_key",
                    "logit_bias names token id {tid} twice ({a} and {b})",
                    {"tid": tid, "a": seen[tid], "b": shown},
                )
            seen[tid] = shown
            if not -100.0 <= bias <= 100.0:  # NaN fails too
                raise PydanticCustomError(
                    "logit_bias_value",
                    "logit_bias for token id {tid} must be in [-100, 100]; got {bias}",
                    {"tid": tid, "bias": bias},
                )
        return value

    def to_sampling_params(
        self, max_new_tokens: int, logprobs: Optional[int], prompt_logprobs: bool, stop: Sequence[str]
    ) -> SamplingParams:
        """This request's :class:`~prodip.serve.batching.SamplingParams` (vLLM's ``to_sampling_params``).

        Args:
            max_new_tokens: tokens to generate (the default already applied).
            logprobs: top-n alternatives per token, or None for no logprobs.
            prompt_logprobs: also score the prompt (echo).
            stop: the stop strings, checked by the service; as sent (matched in NFC, serve.text.StopMatcher).
        """
        bias = tuple(sorted((int(key), float(value)) for key, value in (self.logit_bias or {}).items()))
        return SamplingParams(
            max_new_tokens=max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.seed,
            stop=tuple(stop),
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            ignore_eos=self.ignore_eos,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=bias,
        )


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions`` (OpenAI legacy completions, plus ``top_k``/``ignore_eos``; ``suffix`` and
    ``best_of != n`` are refused by the route)."""

    model: Optional[str] = None
    prompt: Prompt
    max_tokens: Optional[int] = Field(None, ge=0, description="tokens to generate; default 16")
    n: int = Field(1, ge=1)
    logprobs: Optional[int] = Field(None, ge=0, le=20, description="top-n logprobs per token")
    echo: bool = False
    stream_options: Optional[StreamOptions] = Field(None, description="only with stream: true (as OpenAI)")
    best_of: Optional[int] = Field(None, ge=1)
    suffix: Optional[str] = None
    user: Optional[str] = None

    _only_when_streaming = field_validator("stream_options", mode="after")(_stream_options_need_stream)


def refused(message: str, param: str, code: Optional[str] = None) -> PydanticCustomError:
    """A validation error that ``prodip.serve.app`` answers as a 400 with this ``param`` and ``code`` (a rule
    whose answer OpenAI's form names: ``unsupported``, ``unsupported_content``, ...)."""
    return PydanticCustomError("refused", "{message}", {"message": message, "param": param, "code": code})


class ChatMessage(_Strict):
    """One message of OpenAI's ``messages``: ``role`` and text ``content``.

    ``content`` may be a string or a list of ``{"type": "text", "text": ...}`` parts (joined by
    :class:`ChatCompletionRequest`); other part types (images, audio, files), a missing content (an
    assistant's tool call), other fields and roles outside system/user/assistant are refused there, naming
    ``messages[i]``.
    """

    model_config = ConfigDict(extra="allow", strict=True)  # tool_calls, refusal, ...: refused by name
    role: str
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None


def _request_message(i: int, m: ChatMessage) -> ChatMessage:
    """``messages[i]`` as the chat template reads it: text parts joined into one string.

    The rules of a request only (every chat message's rules are :func:`prodip.base.chat.check_message`'s,
    applied here too and again, with the tokenizer's special tokens, when the prompt is rendered).

    Raises:
        a :func:`refused` error: a role outside system/user/assistant (``unsupported_content``, before
        anything else: a ``tool`` message's ``tool_call_id`` is not the fault), a field beyond
        role/content/name (``unsupported``), no content, a part other than ``{"type": "text", "text": str}``
        (``unsupported_content``), or another rule of :func:`~prodip.base.chat.check_message`.
    """
    where = f"messages[{i}]"
    try:
        check_role(i, m.role)
        if m.model_extra:
            extra = sorted(m.model_extra)[0]
            raise refused(f"{where}.{extra} is not supported", f"{where}.{extra}", "unsupported")
        if m.content is None:
            raise refused(f"{where}.content is missing (text content only)", f"{where}.content")
        if isinstance(m.content, list):
            bad = next((p for p in m.content if p.get("type") != "text" or not isinstance(p.get("text"), str)), None)
            if bad is not None:
                raise refused(
                    f"{where}.content: a {bad.get('type')!r} part is not supported (text parts with a string text "
                    "only: this model reads no images, audio or files)",
                    f"{where}.content",
                    "unsupported_content",
                )
            m.content = "".join(p["text"] for p in m.content)
        check_message(i, {"role": m.role, "content": m.content})
    except MessageError as err:
        raise refused(str(err), err.param, err.code) from None
    return m


#: fields of OpenAI's chat request that call tools: accepted as fields, refused by name (no tool calling)
TOOL_FIELDS = ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls")


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions`` (OpenAI chat completions, text only; plus ``top_k``/``ignore_eos``).

    :data:`TOOL_FIELDS` and a ``response_format`` other than ``{"type": "text"}`` are accepted as fields and
    refused with ``code: "unsupported"`` (a clear answer instead of an unknown-field 400); each message is
    checked by :func:`_request_message`.
    """

    model: Optional[str] = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[int] = Field(None, ge=0, description="tokens to generate (older name)")
    max_completion_tokens: Optional[int] = Field(None, ge=0, description="tokens to generate; wins over max_tokens")
    n: int = Field(1, ge=1)
    logprobs: bool = Field(False, description="return the chosen tokens' logprobs (choices[].logprobs.content)")
    top_logprobs: Optional[int] = Field(None, ge=0, le=20, description="alternatives per token; needs logprobs")
    stream_options: Optional[StreamOptions] = Field(None, description="only with stream: true (as OpenAI)")
    user: Optional[str] = None
    tools: Optional[Any] = None
    tool_choice: Optional[Any] = None
    functions: Optional[Any] = None
    function_call: Optional[Any] = None
    parallel_tool_calls: Optional[Any] = None
    response_format: Optional[Any] = None
    add_generation_prompt: bool = Field(True, description="end the prompt with the assistant's header (vLLM)")
    continue_final_message: bool = Field(
        False,
        description="leave the final message open so the reply continues it (vLLM; not with add_generation_prompt)",
    )
    chat_template_kwargs: Optional[dict[str, Any]] = Field(
        None, description="more variables for the chat template (vLLM), e.g. an imported model's own switches"
    )

    _only_when_streaming = field_validator("stream_options", mode="after")(_stream_options_need_stream)

    @field_validator("messages", mode="after")
    @classmethod
    def _text_messages(cls, messages: list[ChatMessage]) -> list[ChatMessage]:
        return [_request_message(i, m) for i, m in enumerate(messages)]

    @model_validator(mode="after")
    def _no_tools(self) -> ChatCompletionRequest:
        """Raises: a :func:`refused` error for a tool field or a non-text ``response_format``
        (``unsupported``), or ``top_logprobs`` without ``logprobs``."""
        for name in TOOL_FIELDS:
            if getattr(self, name) is not None:
                raise refused(f"{name} is not supported (no tool calling)", name, "unsupported")
        fmt = self.response_format
        if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text" and len(fmt) == 1):
            raise refused('response_format: only {"type": "text"} is supported', "response_format", "unsupported")
        if self.top_logprobs is not None and not self.logprobs:
            raise refused("top_logprobs needs logprobs: true", "top_logprobs")
        return self


class GenerateRequest(SamplingRequest):
    """``POST /v1/generate``: the native form (one prompt, one sequence; same sampling fields)."""

    model: Optional[str] = Field(None, description="this server's model id (GET /v1/models) or omitted")
    prompt: Union[str, list[int]]
    max_new_tokens: Optional[int] = Field(
        None,
        ge=0,
        description="tokens to generate; default (None): the server's default_max_tokens, as for /v1/completions",
    )
    logprobs: Optional[int] = Field(None, ge=0, le=20)


class TokenizeRequest(_Strict):
    """``POST /tokenize`` in vLLM's shape (``prompt``), which lm-eval's ``tokenizer_backend=remote``
    sends; ``text`` is the older prodip name of the same field; or vLLM's chat form, ``messages`` rendered
    with the chat template as /v1/chat/completions renders them (exactly one of the three)."""

    model: Optional[str] = Field(None, description="this server's model id or omitted (vLLM sends it)")
    prompt: Optional[str] = Field(None, description="text to tokenize (vLLM's field)")
    text: Optional[str] = Field(None, description="alias of prompt (prodip's older field)")
    messages: Optional[list[ChatMessage]] = Field(None, min_length=1, description="a conversation to render (vLLM)")
    add_special_tokens: Optional[bool] = Field(
        None,
        description="let the tokenizer's post-processor add its tokens (BOS); default true for text, false for "
        "messages (the chat template writes them), as vLLM",
    )
    add_generation_prompt: bool = Field(True, description="messages: end with the assistant's header (vLLM)")
    continue_final_message: bool = Field(False, description="messages: leave the final message open (vLLM)")
    chat_template_kwargs: Optional[dict[str, Any]] = Field(None, description="messages: more template variables")
    return_token_strs: bool = Field(False, description="also return each token's vocabulary string (vLLM)")

    @field_validator("messages", mode="after")
    @classmethod
    def _text_messages(cls, messages: Optional[list[ChatMessage]]) -> Optional[list[ChatMessage]]:
        return None if messages is None else [_request_message(i, m) for i, m in enumerate(messages)]

    @model_validator(mode="after")
    def _one_text(self) -> TokenizeRequest:
        if sum(x is not None for x in (self.prompt, self.text, self.messages)) != 1:
            raise ValueError("give exactly one of prompt (vLLM's name), text or messages")
        return self

    @property
    def content(self) -> str:
        """The text to tokenize: ``prompt``, else ``text`` (for a ``messages`` request: the service renders)."""
        for value in (self.prompt, self.text):
            if value is not None:
                return value
        raise ValueError("give exactly one of prompt (vLLM's name), text or messages")


class DetokenizeRequest(_Strict):
    """``POST /detokenize`` in vLLM's shape."""

    model: Optional[str] = Field(None, description="this server's model id or omitted (vLLM sends it)")
    tokens: list[int]
    skip_special_tokens: bool = True


def _lone_surrogate(value: Any) -> Optional[int]:
    """The first code point in U+D800..U+DFFF found in ``value`` (str, or lists/dicts/models of them)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return None
        except UnicodeEncodeError as err:
            return ord(value[err.start])
    items: Any = ()
    if isinstance(value, (list, tuple)):
        items = value
    elif isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    for item in items:
        bad = _lone_surrogate(item)
        if bad is not None:
            return bad
    return None


class ErrorDetail(TypedDict):
    """The inside of OpenAI's error body (:data:`prodip.serve.openapi.ERROR_SCHEMA`)."""

    message: str
    type: str
    param: Optional[str]
    code: Union[str, int, None]


class ErrorBody(TypedDict):
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: ErrorDetail


def error_body(
    message: str, type_: str = "invalid_request_error", param: Optional[str] = None, code: Union[str, int, None] = None
) -> ErrorBody:
    """OpenAI's error form: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


# ---- response bodies (documentation: the OpenAPI document's 200 schemas) -----------------------


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy logprobs: per token its text, logprob (nats; None for an echoed first token),
    the top alternatives ``{text: logprob}`` and the character offset in the choice's text."""

    tokens: list[str]
    token_logprobs: list[Optional[float]]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs]
    finish_reason: Optional[str]


class CompletionResponse(BaseModel):
    """OpenAI's legacy ``text_completion`` object (prodip.serve.completions.completion)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class GenerateResponse(BaseModel):
    """The native ``/v1/generate`` body (prodip.serve.completions.generate); logprobs in nats."""

    model: str
    text: str
    token_ids: list[int]
    finish_reason: Optional[str]
    logprobs: Optional[list[Optional[float]]]
    usage: Usage


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]
    refusal: None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChatLogprobs]
    finish_reason: Optional[str]


class ChatCompletionResponse(BaseModel):
    """OpenAI's ``chat.completion`` object (prodip.serve.completions.chat_completion)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class LoosenedBound(BaseModel):
    """A tolerance bound the served variant's verdict used that is looser than the shipped one."""

    table: str
    metric: str
    shipped: Any
    used: Any


class Conformance(BaseModel):
    """The served variant's conformance: verified by ``prodip conformance``, and any loosened bounds."""

    verified: bool
    loosened_tolerances: list[LoosenedBound]


class Health(BaseModel):
    """``GET /health``: 200 when the model is loaded, else 503 with ``status`` loading or error."""

    status: Literal["ok", "loading", "error"]
    model: str
    variant: str
    verified: bool
    conformance: Conformance
    error: Optional[str] = Field(None, description="why the load failed (status error only)")


class ModelCard(BaseModel):
    """OpenAI's ``model`` object, plus prodip's variant, context window and conformance."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    variant: str
    max_model_len: int
    conformance: Conformance


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    """vLLM's ``/tokenize`` answer."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[Optional[str]]] = Field(None, description="only with return_token_strs")


class DetokenizeResponse(BaseModel):
    """vLLM's ``{prompt}`` plus ``text`` (prodip's older name, the same string)."""

    prompt: str
    text: str


class SpecialToken(BaseModel):
    id: int
    text: Optional[str]


class TokenizerInfo(BaseModel):
    """vLLM's ``/tokenizer_info`` keys, then prodip's."""

    tokenizer_class: str
    bos_token: Optional[str]
    eos_token: Optional[str]
    pad_token: Optional[str]
    model_max_length: int
    add_bos_token: bool
    chat_template: Optional[Union[str, list[dict[str, Any]]]] = Field(
        description="tokenizer_config.json's chat_template (a string, or Hugging Face's list of named templates)"
    )
    vocab_size: int
    model_vocab_size: int
    max_model_len: int
    tokenizer_sha256: str
    special_tokens: dict[str, SpecialToken]
    normalizer: Optional[str]
