"""``ServeConfig``: the run config of ``prodip serve`` (fields become ``--kebab-case`` flags).

python -c "from serve.config import ServeConfig; print(ServeConfig(export_dir='exports/demo'))"
"""

from __future__ import annotations

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
    api_key: Optional[str] = opt(None, "if set, require `Authorization: Bearer KEY` (also read from $PRODIP_API_KEY)")
    allow_unverified: bool = opt(False, "serve a variant whose conformance verdict is missing or failing")
    model_name: Optional[str] = opt(
        None, "model id shown by /v1/models and accepted in requests (default: export dir name)"
    )
    max_batch_size: int = opt(32, "most sequences decoded together in one batch (rows)")
    batch_wait_ms: float = opt(5.0, "when idle, wait this long for more requests to prefill together (milliseconds)")
    max_body_bytes: int = opt(1_000_000, "largest request body accepted (bytes); larger -> 413")
    default_max_tokens: int = opt(16, "max_tokens when a completion request gives none (tokens, OpenAI's default)")
    max_n: int = opt(16, "largest `n` (completions per prompt) accepted")
    intra_op_threads: int = opt(0, "ONNX Runtime intra-op threads (0 = ONNX Runtime's default: one per core)")
    shared_kv_buffer: bool = opt(
        True,
        "decode on the variant's shared-buffer graph (onnx/*_genai.onnx: the KV cache written in place) when the "
        "export has one; false: the contract graph (present = past ++ new)",
    )
    graceful_shutdown_s: float = opt(10.0, "on SIGTERM/SIGINT, wait this long for in-flight requests (seconds)")
    log_level: str = opt("info", "uvicorn log level", choices=("critical", "error", "warning", "info", "debug"))

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_body_bytes", "max_n"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"ServeConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port < 65536:
            raise InvalidInput(f"ServeConfig.port must be in [0, 65535], got {self.port}")
        if self.batch_wait_ms < 0 or self.default_max_tokens < 0:
            raise InvalidInput("ServeConfig.batch_wait_ms and default_max_tokens must be >= 0")
        check_threads("ServeConfig.intra_op_threads", self.intra_op_threads)
