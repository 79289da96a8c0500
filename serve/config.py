"""``ServeConfig``: the run config of ``prodip serve`` (fields become ``--kebab-case`` flags).

python -c "from prodip.serve.config import ServeConfig; print(ServeConfig(export_dir='runs/demo/export'))"
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

from prodip.base.config import check_threads, opt
from prodip.base.errors import InvalidInput
from prodip.base.variants import SERVABLE_VARIANTS

VARIANTS = SERVABLE_VARIANTS  # prodip.base.variants owns the table


@dataclass(frozen=True)
class ServeConfig:
    """How to serve one export dir over HTTP."""

    export_dir: str = opt(
        "", "export dir written by `prodip export` (config.json, tokenizer.json, onnx/, manifest.json)"
    )
    variant: str = opt("fp32", "ONNX variant to serve (manifest.json variants key)", choices=VARIANTS)
    host: str = opt("127.0.0.1", "interface to bind; loopback unless you mean to expose the server")
    port: int = opt(8000, "TCP port")
    api_key: Optional[str] = opt(
        None,
        "if set, require `Authorization: Bearer KEY` (also read from $PRODIP_API_KEY); printable ASCII only, as "
        "HTTP clients send header values",
    )
    allowed_hosts: tuple[str, ...] = opt(
        (),
        "without an API key, the Host names served besides the bound address and localhost/127.0.0.1/[::1] "
        "(comma-separated; `*.example.org` for its subdomains, `*` for any): another Host gets 403, so a web page "
        "whose name is rebound to this address (DNS rebinding) cannot use the API",
    )
    allow_unverified: bool = opt(False, "serve a variant whose conformance verdict is missing or failing")
    model_name: Optional[str] = opt(
        None, "model id shown by /v1/models and accepted in requests (default: export dir name)"
    )
    max_batch_size: int = opt(32, "most sequences decoded together in one batch (rows)")
    batch_wait_ms: float = opt(5.0, "when idle, wait this long for more requests to prefill together (milliseconds)")
    stream_interval_ms: float = opt(
        50.0,
        "while a stream runs, turn its tokens into text and hand them to the HTTP side at most this often "
        "(milliseconds; a sequence's first token and its end go at once, as does every token of a request with stop "
        "strings; 0 = every engine step): that work between two model runs slows the next run, and each hand-over "
        "wakes the event loop and the client, whose work takes a core from the model's threads "
        "(bench/results/serve_engine_2026-12-01.md, serve_engine_2026-12-02.md)",
    )
    max_body_bytes: int = opt(1_000_000, "largest request body accepted (bytes); larger -> 413")
    default_max_tokens: int = opt(16, "max_tokens when a completion request gives none (tokens, OpenAI's default)")
    max_n: int = opt(16, "largest `n` (completions per prompt) accepted")
    intra_op_threads: int = opt(0, "ONNX Runtime intra-op threads (0 = ONNX Runtime's default: one per core)")
    intra_op_spinning: bool = opt(
        True,
        "ONNX Runtime's intra-op threads spin while waiting for work (its default, and onnxruntime-genai's): "
        "fastest on idle cores; false on a machine whose cores other programs keep busy (there spinning threads "
        "steal the time the work needs: bench/results/serve_profile_2026-12-01.md)",
    )
    huge_pages: bool = opt(
        True,
        "once the model is loaded, collapse the server's resident anonymous memory (the weights ONNX Runtime "
        "prepacked) into transparent huge pages (Linux 6.1+, prodip.serve.memory): every decode step reads every "
        "weight (bench/results/serve_onestream_2026-12-02.md); outputs are unchanged",
    )
    shared_kv_buffer: bool = opt(
        True,
        "decode on the variant's shared-buffer graph (onnx/*_genai.onnx: the KV cache written in place) when the "
        "export has one; false: the contract graph (present = past ++ new)",
    )
    request_timeout_s: float = opt(
        30.0, "a request's headers and body must arrive within this long of its first byte, else 408 (seconds)"
    )
    keep_alive_s: float = opt(
        5.0, "close a connection idle this long, before its first request or between requests (seconds)"
    )
    max_connections: int = opt(
        512, "most connections and requests in flight; past it new requests get 503 (uvicorn limit_concurrency)"
    )
    max_header_bytes: int = opt(
        16384, "largest request line plus headers accepted (bytes); larger -> 431 (or 400 while still arriving)"
    )
    graceful_shutdown_s: float = opt(10.0, "on SIGTERM/SIGINT, wait this long for in-flight requests (seconds)")
    log_level: str = opt("info", "uvicorn log level", choices=("critical", "error", "warning", "info", "debug"))

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_body_bytes", "max_n", "max_connections", "max_header_bytes"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"ServeConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port < 65536:
            raise InvalidInput(f"ServeConfig.port must be in [0, 65535], got {self.port}")
        for name in ("batch_wait_ms", "stream_interval_ms", "default_max_tokens"):
            if not getattr(self, name) >= 0:
                raise InvalidInput(f"ServeConfig.{name} must be >= 0, got {getattr(self, name)}")
        check_threads("ServeConfig.intra_op_threads", self.intra_op_threads)
        for name in ("request_timeout_s", "keep_alive_s"):
            if not getattr(self, name) > 0:
                raise InvalidInput(f"ServeConfig.{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.api_key is not None:
            check_api_key(self.api_key)
        for name in self.allowed_hosts:
            if not name or any(c in name for c in "/ ") or "*" in name.lstrip("*."):
                raise InvalidInput(
                    f"ServeConfig.allowed_hosts: {name!r} is not a host name (e.g. myhost.lan, 10.0.0.5, "
                    "*.example.org or *)"
                )


def check_api_key(key: str, source: str = "--api-key / $PRODIP_API_KEY") -> None:
    """Refuse a key no client can send: HTTP header values are ASCII in practice (httpx, hence the ``openai``
    client, refuses any other character; RFC 9110 leaves other bytes' meaning open), so a key with a
    non-ASCII character, a space or a control character could never match.

    Raises:
        InvalidInput: naming the first bad character and its position.
    """
    if not key:
        raise InvalidInput(f"{source}: the API key is empty; give a key or none")
    for i, ch in enumerate(key):
        if not "!" <= ch <= "~":
            raise InvalidInput(
                f"{source}: the API key has {ch!r} (U+{ord(ch):04X}) at position {i}; use printable ASCII "
                "characters only (no spaces), which every HTTP client sends unchanged in `Authorization: Bearer KEY`"
            )


#: Host names that always reach this machine's loopback (browsers resolve ``localhost`` themselves).
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
#: Bind addresses that listen on every interface (any of the machine's addresses may be the Host).
_WILDCARD_BINDS = ("", "0.0.0.0", "::")


def host_name(value: str) -> str:
    """The name in a ``Host`` header value: lowercased, without its port, brackets or a trailing dot
    (``[::1]:8000`` -> ``::1``, ``Example.org.:80`` -> ``example.org``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostCheck:
    """Which ``Host`` a server without an API key answers: the address it is bound to, the loopback names,
    and ``allowed_hosts`` (``name``, ``*.domain`` for its subdomains, ``*`` for any). Bound to every
    interface (``0.0.0.0``, ``::``), any IP address literal is its own address too. A DNS name other than
    these is what DNS rebinding sends (a page on attacker.example whose name now resolves to 127.0.0.1 is
    same-origin with the server in the browser); an IP literal cannot be rebound. With an API key the page
    cannot know the key, so every Host is served (``active`` is False).
    """

    def __init__(self, config: ServeConfig) -> None:
        allowed = [host_name(h) for h in config.allowed_hosts]
        self.active = not config.api_key and "*" not in allowed
        bound = host_name(config.host)
        self.any_ip = bound in _WILDCARD_BINDS
        self.names = {*LOOPBACK_HOSTS, *([] if self.any_ip else [bound]), *(h for h in allowed if "*" not in h)}
        self.suffixes = tuple(h[1:] for h in allowed if h.startswith("*."))  # "*.example.org" -> ".example.org"

    def allows(self, host: str) -> bool:
        """Whether a request whose ``Host`` header is ``host`` is served."""
        name = host_name(host)
        return not self.active or name in self.names or name.endswith(self.suffixes) or (self.any_ip and _is_ip(name))
