"""llama.cpp (node-llama-cpp's prebuilt build, ``node/``): the GGUF's chat template and its end-of-generation ids.

Its stop ids are those of the export's stop set that llama.cpp's ``llama_vocab_is_eog`` says end generation.

Its greedy decoding and logits are a conformance candidate of their own (``prodip.conformance.device_runners``).
The template is the GGUF's ``tokenizer.chat_template``, rendered with ``@huggingface/jinja`` and tokenised by
``llama_tokenize`` with special tokens parsed; the end of turn is llama.cpp's own ``llama_vocab_is_eog``.

    python -c "from prodip.conformance.runtimes.llamacpp import LlamaCppAdapter; help(LlamaCppAdapter.chat)"
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from prodip.conformance.runtimes.common import NODE_TIMEOUT_S, ChatJob, ChatOutput, RuntimeAdapter
from prodip.conformance.runtimes.timing import SpeedJob, Timing, timings_from_node
from prodip.conformance.runtimes.transformersjs import node_chat

NAME = "llama.cpp"
#: The Node script that times llama.cpp's generation (in the repository's ``node/``, beside node-llama-cpp).
SPEED_SCRIPT = "llamacpp_speed.mjs"


class LlamaCppAdapter(RuntimeAdapter):
    name = NAME

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        """Every GGUF candidate in one Node process (``node/llamacpp_speed.mjs``: ``performance.now()`` before the
        prompt's evaluation and at each token the generator yields), on ``job.threads`` threads (0: 1)."""
        from prodip.conformance.device_runners import NODE_DIR  # noqa: PLC0415 (torch, executorch imports)

        node = shutil.which("node")
        if node is None:
            raise FileNotFoundError("node is not on PATH (llama.cpp's runner needs Node >= 20)")
        files = {c.name: str((Path(job.export_dir) / c.path).resolve()) for c in job.candidates}
        request = {
            "files": sorted(set(files.values())),
            "prompt": [int(i) for i in job.prompt],
            "new_tokens": job.new_tokens,
            "rounds": job.rounds,
            "threads": job.threads,
        }
        proc = subprocess.run(
            [node, str(NODE_DIR / SPEED_SCRIPT)], input=json.dumps(request), capture_output=True, text=True,
            timeout=NODE_TIMEOUT_S, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"node {SPEED_SCRIPT} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        threads = job.threads or 1
        return {
            c.name: timings_from_node(
                got["results"].get(files[c.name], {"error": "no result"}),
                c.path,
                threads,
                got["version"],
                job.new_tokens,
            )
            for c in job.candidates
        }

    def chat(self, job: ChatJob) -> ChatOutput:
        gguf = job.first("gguf")
        res = node_chat(job, NAME, Path(job.export_dir) / gguf.path)
        if "error" in res:
            return ChatOutput(error=res["error"])
        return ChatOutput(
            ids=res["ids"],
            stop_ids=res.get("stop_ids"),
            end_of_turn_stops=res.get("end_of_turn_is_eog"),
            version=res.get("version"),
        )
