"""transformers.js (``@huggingface/transformers`` in Node): greedy ids of every ONNX variant, its chat template.

Each ONNX variant is loaded by the transformers.js ``dtype`` whose file name is the variant's
(``prodip.base.variants``), all in one Node process (``transformersjs_greedy.mjs``); the chat template is
``apply_chat_template`` from tokenizer_config.json (``chat_template.mjs``). Install, in the repository's
``node/``: ``npm install --ignore-scripts --prefix node``.

    python -c "from prodip.conformance.runtimes.transformersjs import transformersjs_greedy; help(transformersjs_greedy)"
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prodip.base.variants import BY_NAME
from prodip.conformance.runtimes.common import (
    ChatJob,
    ChatOutput,
    GreedyJob,
    GreedyOutput,
    RuntimeAdapter,
    node_root,
    run_node,
    truncate_at_eos,
)
from prodip.conformance.runtimes.timing import SpeedJob, Timing, timings_from_node

NAME = "transformers.js"
#: The Node script that runs transformers.js (in the conformance package).
NODE_SCRIPT = "transformersjs_greedy.mjs"
#: The Node script that times transformers.js's generation (in the conformance package).
SPEED_SCRIPT = "transformersjs_speed.mjs"
#: The Node script that renders the chat template in transformers.js and llama.cpp.
CHAT_SCRIPT = "chat_template.mjs"
CHAT_TIMEOUT_S = 300


def transformersjs_greedy(
    export_dir: Path, dtypes: Sequence[str], prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> dict[str, Any]:
    """Greedy ids from transformers.js in Node for each dtype (one Node process for all).

    Returns:
        ``{"versions": {...}, "results": {dtype: {"ids": [[...], ...]} or {"error": str}}}``.
    Raises:
        FileNotFoundError: ``node`` is not on PATH.
        RuntimeError: the Node script failed (its stderr tail is in the message).
    """
    job = {
        "export_dir": str(Path(export_dir).resolve()),
        "dtypes": list(dtypes),
        "prompts": [list(map(int, p)) for p in prompts],
        "max_new_tokens": max_new_tokens,
        "node_root": str(node_root()),
    }
    return run_node(NODE_SCRIPT, job)


def node_chat(job: ChatJob, runtime: str, gguf: Any = None) -> dict[str, Any]:
    """``chat_template.mjs`` for one Node runtime (``transformers.js``, or ``llama.cpp`` on the GGUF file ``gguf``):
    its result, ``{"ids": [[...]], "version", ...}`` or ``{"error"}``, with ``ids`` keyed by conversation."""
    request = {
        "export_dir": str(Path(job.export_dir).resolve()),
        "conversations": list(job.conversations.values()),
        "transformersjs": runtime == NAME,
        "gguf": str(Path(gguf).resolve()) if gguf else None,
        "end_of_turn_id": job.end_of_turn,
        "stop_ids": list(job.stop_ids),
        "node_root": str(node_root()),
    }
    res = run_node(CHAT_SCRIPT, request, CHAT_TIMEOUT_S)[runtime]
    if "ids" in res:
        res["ids"] = dict(zip(job.conversations, res["ids"]))
    return res


class TransformersJsAdapter(RuntimeAdapter):
    name = NAME

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        """Every ONNX candidate by the dtype whose file is its own, all in one Node process
        (``transformersjs_speed.mjs``: ``performance.now()`` around ``generate``, a streamer stamping each token)."""
        dtypes = {c.name: BY_NAME[c.variant].transformersjs_dtype for c in job.candidates}
        request = {
            "export_dir": str(Path(job.export_dir).resolve()),
            "dtypes": sorted(set(dtypes.values())),
            "prompt": [int(i) for i in job.prompt],
            "new_tokens": job.new_tokens,
            "rounds": job.rounds,
            "threads": job.threads,
            "node_root": str(node_root()),
        }
        got = run_node(SPEED_SCRIPT, request)
        v = got.get("versions") or {}
        version = f"transformers.js {v.get('@huggingface/transformers')} (onnxruntime-node {v.get('onnxruntime-node')})"
        return {
            name: timings_from_node(
                got["results"].get(dtype, {"error": "no result"}),
                f"dtype {dtype}",
                job.threads,
                version,
                job.new_tokens,
            )
            for name, dtype in dtypes.items()
        }

    def greedy(self, job: GreedyJob) -> dict[str, GreedyOutput]:
        dtypes = {c.name: BY_NAME[c.variant].transformersjs_dtype for c in job.candidates}
        got = transformersjs_greedy(job.export_dir, list(dtypes.values()), job.prompts, job.max_new_tokens)
        out = {}
        for name, dtype in dtypes.items():
            res = got["results"].get(dtype, {"error": f"no result for {dtype}"})
            if "ids" in res:
                ids = [truncate_at_eos(g, len(p), job.eos) for g, p in zip(res["ids"], job.prompts)]
                out[name] = GreedyOutput(ids=ids, dtype=dtype, versions=got.get("versions"))
            else:
                error = f"transformers.js dtype {dtype}: {res['error']}"
                out[name] = GreedyOutput(error=error, dtype=dtype, versions=got.get("versions"))
        return out

    def chat(self, job: ChatJob) -> ChatOutput:
        """Its ``apply_chat_template``; the stop ids its generate reads: generation_config.json's ``eos_token_id``."""
        res = node_chat(job, NAME)
        if "error" in res:
            return ChatOutput(error=res["error"])
        return ChatOutput(
            ids=res["ids"],
            stop_ids=job.stop_ids,
            end_of_turn_stops=job.end_of_turn in job.stop_ids,
            version=res.get("version"),
        )
