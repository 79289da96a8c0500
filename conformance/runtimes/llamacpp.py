"""llama.cpp (node-llama-cpp's prebuilt build, ``node/``): the GGUF's chat template and its end-of-generation ids.

Its stop ids are those of the export's stop set that llama.cpp's ``llama_vocab_is_eog`` says end generation.

Its greedy decoding and logits are a conformance candidate of their own (``prodip.conformance.device_runners``).
The template is the GGUF's ``tokenizer.chat_template``, rendered with ``@huggingface/jinja`` and tokenised by
``llama_tokenize`` with special tokens parsed; the end of turn is llama.cpp's own ``llama_vocab_is_eog``.

    python -c "from prodip.conformance.runtimes.llamacpp import LlamaCppAdapter; help(LlamaCppAdapter.chat)"
"""

from __future__ import annotations

from pathlib import Path

from prodip.conformance.runtimes.common import ChatJob, ChatOutput, RuntimeAdapter
from prodip.conformance.runtimes.transformersjs import node_chat

NAME = "llama.cpp"


class LlamaCppAdapter(RuntimeAdapter):
    name = NAME

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
