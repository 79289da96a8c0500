"""The chat contract: conversation markers, the one chat template, and what ends a turn.

Every artifact of a chat model carries the same template text (``CHAT_TEMPLATE``) and the same
end-of-turn token (``END_OF_TURN``); every runtime renders it with its own template engine
(jinja2 in transformers and serve, ``@huggingface/jinja`` in transformers.js and node-llama-cpp,
onnxruntime-genai's renderer, llama.cpp's), and conformance checks they all give the same ids.

The markers are ChatML's (``<|im_start|>role\\n ... <|im_end|>\\n``): the runtimes already know
them by text (llama.cpp treats a token whose text is ``<|im_end|>`` as end-of-generation; its
ChatML detection keys on ``<|im_start|>``). A tokenizer made by ``prodip tokenizer train`` reserves
them at fixed ids after the base specials (``<|pad|>`` 0, ``<|bos|>`` 1, ``<|eos|>`` 2,
``<|im_start|>`` 3, ``<|im_end|>`` 4); a tokenizer that lacks them gets them appended when it is
fine-tuned for chat, so code finds their ids by text (``token_to_id``), never by number.

The template uses only what every renderer above implements: ``for`` over ``messages``, ``if``,
string literals joined with ``+``, subscripts ``message['role']`` / ``message['content']`` and the
``add_generation_prompt`` flag. It writes the document-start token ``<|bos|>`` as a literal (not
``bos_token``, a variable some renderers do not pass), so the rendered text is the whole prompt and
is tokenised without adding special tokens (``add_special_tokens=False``), as transformers'
``apply_chat_template`` does.

    python -c "from prodip.base.chat import render; print(render([{'role': 'user', 'content': 'hi'}]))"
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prodip.base.errors import InvalidInput, MissingInput

if TYPE_CHECKING:
    from jinja2 import Template

#: Conversation markers, in the order new tokenizers reserve them (ids 3 and 4).
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
CHAT_TOKENS: tuple[str, ...] = (IM_START, IM_END)
#: The token that ends an assistant turn: a stop token in every runtime's configuration.
END_OF_TURN = IM_END
#: Roles a conversation may use (OpenAI's messages format, text only).
ROLES: tuple[str, ...] = ("system", "user", "assistant")

#: The one chat template (Jinja), written verbatim into tokenizer_config.json ``chat_template``,
#: ``chat_template.jinja``, the GGUF ``tokenizer.chat_template`` and what onnxruntime-genai and
#: ExecuTorch read. Kept on one line: some renderers keep the newlines of a multi-line template.
CHAT_TEMPLATE = (
    "{{ '<|bos|>' }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class MessageError(InvalidInput):
    """A chat message breaks one of the rules of :func:`check_message`; the one error for it in ``render``,
    ``prodip sft`` (prefixed by FILE:LINE) and ``prodip serve`` (a 400 with this ``param`` and ``code``).

    Attributes:
        param: the field at fault, ``messages[i]``, ``messages[i].role`` or ``messages[i].content``.
        code: serve's error code (``unsupported_content``, ``special_token_in_content``) or None.
    """

    def __init__(self, message: str, param: str, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def check_role(i: int, role: object) -> str:
    """``role`` of ``messages[i]`` when it is one of :data:`ROLES`.

    Raises:
        MessageError: another role (``tool``, ``developer``, ``function``, ...; code ``unsupported_content``).
    """
    if role not in ROLES:
        raise MessageError(
            f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)} (text chat: no tool roles)",
            f"messages[{i}].role",
            "unsupported_content",
        )
    return str(role)


def check_message(i: int, message: object, specials: Iterable[str | None] = ()) -> tuple[str, str]:
    """The rules every chat message obeys, in a request, a fine-tuning record and a rendered prompt alike.

    ``messages[i]`` is an object whose ``role`` is one of :data:`ROLES` and whose ``content`` is a string of
    Unicode text (no lone UTF-16 surrogate, which valid JSON such as ``"\\ud800"`` can hold but no
    tokenizer encodes) holding none of ``specials`` (:func:`special_token_in`).

    Args:
        i: the message's index (named in the error).
        message: the message as read (a mapping, or anything else, which is refused).
        specials: texts of the tokenizer's special tokens (:func:`special_token_texts`); () checks none.
    Returns:
        ``(role, content)``.
    Raises:
        MessageError: the first rule broken, naming ``messages[i]`` and the field.
    """
    if not isinstance(message, Mapping):
        raise MessageError(
            f"messages[{i}] is {type(message).__name__}, expected an object with role and content", f"messages[{i}]"
        )
    role, content = check_role(i, message.get("role")), message.get("content")
    where = f"messages[{i}].content"
    if not isinstance(content, str):
        raise MessageError(f"{where} must be a string (text only), got {type(content).__name__}", where)
    try:
        content.encode("utf-8")
    except UnicodeEncodeError as err:  # half of a UTF-16 pair: no tokenizer can encode it
        raise MessageError(
            f"{where} holds a lone surrogate (U+{ord(content[err.start]):04X}) at character {err.start}: not "
            "Unicode text (a JSON \\uD800-\\uDFFF escape without its pair)",
            where,
        ) from None
    hit = special_token_in(content, specials)
    if hit is not None:
        raise MessageError(
            f"{where} holds {hit!r}, a special token's text; the tokenizer would read it as that token (a forged "
            "turn or document boundary), so it is refused; remove or reword it",
            where,
            "special_token_in_content",
        )
    return role, content


def check_messages(messages: Sequence[object], specials: Iterable[str | None] = ()) -> None:
    """:func:`check_message` on each message, in order.

    Raises:
        MessageError: the first message that breaks a rule.
    """
    specials = tuple(specials)
    for i, message in enumerate(messages):
        check_message(i, message, specials)


def render(
    messages: Sequence[Mapping[str, str]],
    add_generation_prompt: bool = True,
    *,
    template: str | None = None,
    variables: Mapping[str, Any] | None = None,
    specials: Iterable[str | None] = (),
) -> str:
    """Render ``messages`` with :data:`CHAT_TEMPLATE` (or an imported model's ``template``) through
    jinja2's sandbox, as transformers' ``apply_chat_template`` does.

    Args:
        messages: ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
        add_generation_prompt: end with the assistant's header so the model writes the reply.
        template: an imported model's own template (``chat_contract(...)["chat_template"]``); None: prodip's.
        variables: the special-token strings its template may read (:func:`template_variables`).
        specials: texts of the tokenizer's special tokens no content may hold (:func:`check_message`).

    Returns:
        The prompt text; tokenise it with ``add_special_tokens=False`` (the template writes the bos).

    Raises:
        MessageError: a message breaks a rule of :func:`check_message` (a ``ValueError``, named by index).
    """
    check_messages(messages, specials)
    compiled = _compiled(CHAT_TEMPLATE if template is None else template)
    return str(
        compiled.render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **(variables or {})
        )
    )


@functools.cache
def _compiled(template: str) -> Template:
    """A template compiled once (compiling costs ~10 ms; fine-tuning renders thousands of conversations)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415 (serve's only jinja use)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    return env.from_string(template)


def template_variables(tokenizer_dir: str | os.PathLike[str]) -> dict[str, str]:
    """The special-token strings transformers passes a chat template (``bos_token``, ``eos_token``,
    ``pad_token``, ``unk_token``), from ``tokenizer_config.json`` (strings or ``{"content": ...}``)."""
    path = Path(tokenizer_dir) / "tokenizer_config.json"
    return template_variables_of(json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {})


def template_variables_of(config: Mapping[str, Any]) -> dict[str, str]:
    """:func:`template_variables` of a parsed ``tokenizer_config.json``."""
    out = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(key)
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            out[key] = value
    return out


def special_token_texts(tokenizer: Any) -> tuple[str, ...]:
    """The texts of a ``tokenizers.Tokenizer``'s special added tokens (``<|pad|>``, ``<|bos|>``, ``<|eos|>``,
    the chat markers, ...), in id order."""
    decoder = tokenizer.get_added_tokens_decoder()
    return tuple(decoder[i].content for i in sorted(decoder) if decoder[i].special and decoder[i].content)


def special_token_in(content: str, specials: Iterable[str | None]) -> str | None:
    """The first of ``specials`` (texts of special tokens; ``None`` or empty ones are skipped) that ``content``
    holds, or ``None``.

    The one rule for chat content, in training data and in requests alike: a message's content must not
    hold a special token's text. The template inserts content verbatim and the tokenizer matches added
    tokens in the text, so ``"<|im_end|>"`` in a content would forge a turn boundary and ``"<|eos|>"`` would
    be read (and, in a reply, trained) as the end-of-document control token, a stop token in every runtime.
    :func:`check_message` applies it: ``prodip sft`` refuses such a record naming FILE:LINE; ``prodip serve``
    answers 400 ``special_token_in_content``.
    """
    return next((t for t in specials if t and t in content), None)


#: The template as its own file, beside ``tokenizer_config.json`` (transformers >= 4.43 reads it) and the ``.pte``.
CHAT_TEMPLATE_FILE = "chat_template.jinja"


def chat_contract(tokenizer_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The chat contract a tokenizer dir carries, or ``None`` for a base model's.

    A tokenizer dir is a chat model's when its ``tokenizer_config.json`` has a ``chat_template``. The
    template of a tokenizer made by prodip (its config has ``format_version``) must be :data:`CHAT_TEMPLATE` exactly
    and ``tokenizer.json`` must hold both :data:`CHAT_TOKENS` as special added tokens (found by text,
    never by number). An imported model's tokenizer (a Hugging Face folder's, no ``format_version``;
    its template may also be ``chat_template.jinja``) keeps its own template verbatim, and its
    ``eos_token`` is the end of turn (:func:`_imported_contract`).

    Args:
        tokenizer_dir: folder with ``tokenizer.json`` and ``tokenizer_config.json`` (a checkpoint's
            ``tokenizer/`` copy, or an export dir).
    Returns:
        ``None`` (no ``chat_template``), or ``{"chat_template": str, "im_start_id": int (None for an
        imported tokenizer without ``<|im_start|>``), "end_of_turn_id": int, "end_of_turn": str}``.
    Raises:
        InvalidInput: a ``chat_template`` other than :data:`CHAT_TEMPLATE`, or a chat token missing
            from ``tokenizer.json`` or not special (each names the file).
        MissingInput: ``tokenizer.json`` is missing while the config names a template.
    """
    root = Path(tokenizer_dir)
    cfg_path = root / "tokenizer_config.json"
    config = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    template = config.get("chat_template")
    if not template and "format_version" not in config and (root / CHAT_TEMPLATE_FILE).is_file():
        template = (root / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8")  # transformers 5's save_pretrained
    if not template:
        return None
    if "format_version" not in config:  # an imported model's tokenizer: its own template and end of turn
        return _imported_contract(root, config, template)
    if template != CHAT_TEMPLATE:
        raise InvalidInput(
            f"{cfg_path}: chat_template differs from prodip's chat contract (prodip.base.chat.CHAT_TEMPLATE); "
            "every runtime must render one template, so a checkpoint carries that one exactly"
        )
    tok_path = root / "tokenizer.json"
    if not tok_path.is_file():
        raise MissingInput(f"{tok_path}: not found, but {cfg_path} names a chat template")
    added = {a["content"]: a for a in json.loads(tok_path.read_text(encoding="utf-8")).get("added_tokens", [])}
    for token in CHAT_TOKENS:
        if token not in added or not added[token].get("special"):
            raise InvalidInput(
                f"{tok_path}: {token} is not a special added token, but {cfg_path} names a chat template "
                "(a chat model's tokenizer holds both chat markers)"
            )
    return {
        "chat_template": template,
        "im_start_id": added[IM_START]["id"],
        "end_of_turn_id": added[END_OF_TURN]["id"],
        "end_of_turn": END_OF_TURN,
    }


def _imported_contract(root: Path, config: dict[str, Any], template: str) -> dict[str, Any]:
    """The chat contract of an imported (Hugging Face) tokenizer: its template verbatim, and as end of
    turn its ``eos_token`` (SmolLM2/Qwen2 ``<|im_end|>``, Llama 3 ``<|eot_id|>``), which must be a special
    added token the template writes."""
    tok_path, cfg_path = root / "tokenizer.json", root / "tokenizer_config.json"
    if not tok_path.is_file():
        raise MissingInput(f"{tok_path}: not found, but {cfg_path} names a chat template")
    added = {a["content"]: a for a in json.loads(tok_path.read_text(encoding="utf-8")).get("added_tokens", [])}
    eot = config.get("eos_token")
    eot = eot.get("content") if isinstance(eot, dict) else eot
    if not isinstance(eot, str) or eot not in added or not added[eot].get("special"):
        raise InvalidInput(
            f"{cfg_path}: eos_token {eot!r} is not a special added token of {tok_path}; a chat model's "
            "end-of-turn token (its eos_token) must be one"
        )
    if eot not in template and "eos_token" not in template:  # literally, or as the variable (TinyLlama/Zephyr)
        raise InvalidInput(f"{cfg_path}: the chat_template never writes the eos_token {eot!r} (the end of a turn)")
    start = added.get(IM_START)
    return {
        "chat_template": template,
        "im_start_id": start["id"] if start else None,
        "end_of_turn_id": added[eot]["id"],
        "end_of_turn": eot,
    }
