"""Runners for the on-device targets: llama.cpp (GGUF) and ExecuTorch (``.pte``), in their real runtimes.

Both follow the decoder calling convention of :mod:`prodip.conformance.runners` (``forward(input_ids,
attention_mask, position_ids, state) -> (logits, state)``), so the same conformance code measures them.
Neither runtime takes a padding mask: each row of a batch runs as its own sequence (llama.cpp: one
sequence id per row of one context; ExecuTorch: one loaded program per row, whose KV-cache buffers are
its own). A row's real tokens are those whose mask is 1; left padding (the only padding conformance uses)
therefore gives them positions ``cumsum(mask) - 1``, as the contract says. Logits of padded positions
are zero (conformance never reads them).

- :class:`LlamaCppRunner` drives ``node/llamacpp_eval.mjs``: node-llama-cpp's prebuilt CPU llama.cpp,
  float32 KV cache, flash attention off, raw logits (no sampler).
- :class:`ExecuTorchRunner` runs ``forward(tokens, input_pos)`` with ExecuTorch's Python runtime
  (``executorch.runtime.Runtime``; XNNPACK delegate), and :func:`pte_metadata` reads the constant
  methods the LLM runners read.

    python -c "from prodip.conformance.device_runners import pte_metadata; print(pte_metadata('OUT/executorch/model.pte'))"
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional

import numpy as np

from prodip.base.errors import MissingInput
from prodip.base.files import native_stderr_to_log
from prodip.conformance.runners import Runner
from prodip.export.executorch import quiet_optional_imports

log = logging.getLogger("prodip.conformance.device_runners")

NODE_DIR = Path(os.environ.get("PRODIP_NODE_DIR", Path(__file__).resolve().parents[1] / "node"))
EVAL_SCRIPT = "llamacpp_eval.mjs"
#: Sequences (rows) one llama.cpp context holds by default; conformance batches have at most a few rows.
MAX_ROWS = 8


def _new_tokens(input_ids: np.ndarray, attention_mask: np.ndarray) -> list[np.ndarray]:
    """Per row, the column indices of the real (mask 1) tokens among the T new ones."""
    T = input_ids.shape[1]
    return [np.nonzero(attention_mask[b, -T:])[0] for b in range(input_ids.shape[0])]


class LlamaCppRunner(Runner):
    """A GGUF file under llama.cpp (node-llama-cpp 3.22.1, llama.cpp v0.5.0 CPU build) in a Node subprocess.

    Args:
        path: the ``.gguf`` file.
        name: label in the report.
        context: tokens per sequence: the longest sequence the checks feed (at most the model's
            ``max_position_embeddings``); it is also the batch size, so llama.cpp's logits buffer is
            ``context x n_vocab``, not that of ``rows`` whole windows (65536 x 49152 floats, 12 GB, for
            SmolLM2's 8192 window and 8 rows).
        rows: sequences the context holds (the most rows of a batch; at most :data:`MAX_ROWS` are
            needed); the context has ``context * rows`` cells.
        threads: llama.cpp threads (0 = 1).
    Raises:
        MissingInput: Node or node-llama-cpp is not installed (names the command).
    """

    def __init__(self, path: str | Path, name: str, *, context: int, rows: int = MAX_ROWS, threads: int = 0) -> None:
        node = shutil.which("node")
        if node is None or not (NODE_DIR / "node_modules" / "node-llama-cpp" / "package.json").is_file():
            raise MissingInput(
                f"llama.cpp runner: needs Node >= 20 and node-llama-cpp in {NODE_DIR}/node_modules "
                "(npm install --ignore-scripts --prefix node)"
            )
        self.name, self.rows = name, rows
        self.proc = subprocess.Popen(
            [node, str(NODE_DIR / EVAL_SCRIPT), str(Path(path).resolve()), str(rows),
             str(context * rows), str(threads or 1), str(context)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        self.info = self.request({"op": "info"})
        self.vocab = int(self.info["n_vocab"])

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        """Send one request line, read one reply line.

        Raises:
            RuntimeError: the Node process died or answered with an error (its text included).
        """
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        if not line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            raise RuntimeError(f"llama.cpp runner exited (code {self.proc.poll()}): {err.strip()[-800:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"llama.cpp: {reply['error'][:800]}")
        return reply

    def forward(self, input_ids, attention_mask, position_ids, state=None):
        B, T = input_ids.shape
        if B > self.rows:
            raise ValueError(f"llama.cpp runner: batch of {B} rows, at most {self.rows}")
        logits = np.zeros((B, T, self.vocab), np.float32)
        for b, cols in enumerate(_new_tokens(input_ids, attention_mask)):
            if len(cols) == 0:
                continue
            reply = self.request(
                {"op": "eval", "seq": b, "tokens": input_ids[b, cols].tolist(), "reset": state is None}
            )
            rows = np.frombuffer(base64.b64decode(reply["logits"]), np.float32).reshape(len(cols), self.vocab)
            logits[b, cols] = rows
        return logits, {"rows": B}

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """llama.cpp's default encode of each text (BOS as the GGUF asks, special tokens parsed)."""
        return self.request({"op": "tokenize", "texts": texts})["ids"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing left to clean
            pass


class ExecuTorchRunner(Runner):
    """An ExecuTorch program (``forward(tokens (1, T) int64, input_pos (1,) int64) -> logits (1, T, V)``).

    One program instance per batch row (each keeps its own KV-cache buffers); a new sequence starts at
    ``input_pos = 0``, which the program's mask treats as an empty cache.
    """

    def __init__(self, path: str | Path, name: str) -> None:
        quiet_optional_imports()
        from executorch.runtime import Runtime  # noqa: PLC0415 (optional: pip extra runtimes)

        self.path, self.name = Path(path), name
        self.runtime = Runtime.get()
        self.methods: list[Any] = []
        self.max_seq_len = int(pte_metadata(self.path)["get_max_seq_len"])

    def _method(self, row: int) -> Any:
        while len(self.methods) <= row:
            self.methods.append(self.runtime.load_program(self.path).load_method("forward"))
        return self.methods[row]

    def forward(self, input_ids, attention_mask, position_ids, state=None):
        import torch  # noqa: PLC0415 (ExecuTorch's Python runtime takes torch tensors)

        B, T = input_ids.shape
        pos = [0] * B if state is None else list(state["pos"])
        logits = None
        for b, cols in enumerate(_new_tokens(input_ids, attention_mask)):
            if len(cols) == 0:
                continue
            if pos[b] + len(cols) > self.max_seq_len:
                raise ValueError(
                    f"{self.path}: {pos[b] + len(cols)} positions exceed get_max_seq_len {self.max_seq_len}"
                )
            tokens = torch.from_numpy(np.ascontiguousarray(input_ids[b, cols]))[None]
            out = self._method(b).execute([tokens, torch.tensor([pos[b]], dtype=torch.int64)])[0]
            out = out.float().numpy().reshape(len(cols), -1)
            if logits is None:
                logits = np.zeros((B, T, out.shape[-1]), np.float32)
            logits[b, cols] = out
            pos[b] += len(cols)
        return logits, {"pos": pos}


def pte_metadata(path: str | Path) -> dict[str, Any]:
    """The LLM-runner constant methods of a ``.pte`` (``get_max_seq_len``, ``get_bos_id``, ...), as Python values.

    Raises:
        RuntimeError: the program cannot be loaded.
    """
    quiet_optional_imports()
    from executorch.runtime import Runtime  # noqa: PLC0415 (optional: pip extra runtimes)

    program = Runtime.get().load_program(Path(path))
    out = {}
    for name in sorted(program.method_names - {"forward"}):
        values = program.load_method(name).execute([])
        vals = [v.item() if hasattr(v, "item") else v for v in values]
        out[name] = vals if name == "get_eos_ids" else vals[0]
    return out


def runtime_version(kind: str, runner: Any) -> str:
    """The runtime that measured a candidate, e.g. ``node-llama-cpp 3.22.1, llama.cpp v0.5.0`` or ``executorch 1.5.1``."""
    if kind == "gguf":
        return runner.info["version"]
    from importlib.metadata import version  # noqa: PLC0415 (only for the report)

    return f"executorch {version('executorch')}"


def runtime_token_ids(kind: str, runner: Any, tokenizer_json: Path, texts: list[str]) -> list[list[int]]:
    """Each text encoded as the runtime's own tokenizer encodes a prompt (BOS included).

    llama.cpp: BOS as the GGUF asks, then ``llama_tokenize`` over the GGUF's vocabulary (node script).
    ExecuTorch: the C++ ``HFTokenizer`` its LLM runners use (``pytorch_tokenizers.CppHFTokenizer``)
    on ``tokenizer_json`` (the file shipped beside the ``.pte``), ``encode(text, bos=1, eos=0)``, i.e.
    ``GenerationConfig(num_bos=1)`` in ``TextLLMRunner``.
    """
    if kind == "gguf":
        return runner.tokenize(texts)
    from pytorch_tokenizers import CppHFTokenizer  # noqa: PLC0415 (optional: installed with executorch)

    tok = CppHFTokenizer()
    with native_stderr_to_log(log):  # its re2 "Error parsing" before the PCRE2 fallback: expected, harmless
        tok.load(str(tokenizer_json))
    return [list(tok.encode(t, 1, 0)) for t in texts]


def metadata_problems(
    kind: str,
    runner: Any,
    config: Any,
    eos_ids: Optional[list[int]] = None,
    *,
    add_bos: bool = True,
    max_seq_len: int = 0,
) -> list[str]:
    """What a runtime reads from the artifact that differs from the training model's config.

    Args:
        kind: ``gguf`` or ``pte``; runner: its runner; config: the checkpoint's ``ModelConfig``.
        eos_ids: the ids that end generation (a chat model's ``<|eos|>`` and ``<|im_end|>``, from the
            export's generation_config.json): the ``.pte``'s ``get_eos_ids``; None: ``[eos_token_id]``.
        add_bos: whether the tokenizer prepends the bos (``prodip.base.specials.read_specials``; prodip's
            do; an imported one may not, e.g. SmolLM2, Qwen2): the GGUF's ``add_bos_token``.
        max_seq_len: the ``.pte``'s KV-cache window the manifest records (tokens); 0 = ``max_position_embeddings``.
    Returns:
        Human-readable problems (empty: the runtime sees the right context, vocabulary and special tokens).
    """
    if kind == "gguf":
        info = runner.info
        got = {
            "train_context": info["train_context"],
            "n_vocab": info["n_vocab"],
            "bos": info["bos"],
            "eos": info["eos"],
            "add_bos": info["add_bos"],
        }
        want = {
            "train_context": config.max_position_embeddings,
            "n_vocab": config.vocab_size,
            "bos": config.bos_token_id,
            "eos": config.eos_token_id,
            "add_bos": add_bos,
        }
    else:
        from prodip.export.executorch import runner_metadata  # noqa: PLC0415 (the expected values' one owner)

        got = pte_metadata(runner.path)
        want = runner_metadata(
            config, bos_id=config.bos_token_id, eos_ids=eos_ids or [config.eos_token_id], max_seq_len=max_seq_len
        )
    return [f"{k} is {got.get(k)!r}, expected {v!r}" for k, v in want.items() if got.get(k) != v]
