"""ExecuTorch: the C++ ``HFTokenizer`` (pip ``pytorch-tokenizers``) on the rendered conversations, and the
program's end-of-sequence ids (``get_eos_ids``, run by the ExecuTorch runtime).

pytorch-tokenizers has no template engine: an app renders ``executorch/chat_template.jinja`` itself, so checked
here is its tokenizer on the reference's rendered text (``encode(text, bos=0, eos=0)``). Its greedy decoding is
a conformance candidate of its own (``prodip.conformance.device_runners``).

    python -c "from prodip.conformance.runtimes.executorch import ExecuTorchAdapter; help(ExecuTorchAdapter.chat)"
"""

from __future__ import annotations

from pathlib import Path

from prodip.conformance.runtimes.common import ChatJob, ChatOutput, RuntimeAdapter

NAME = "executorch"
NOTE = (
    "pytorch-tokenizers has no template engine: the app renders executorch/chat_template.jinja; "
    "checked: its C++ HFTokenizer on the rendered text"
)


class ExecuTorchAdapter(RuntimeAdapter):
    name = NAME

    def chat(self, job: ChatJob) -> ChatOutput:
        from pytorch_tokenizers import CppHFTokenizer  # noqa: PLC0415 (installed with executorch)

        from prodip.conformance.device_runners import pte_metadata  # noqa: PLC0415

        pte = job.first("pte")
        tok = CppHFTokenizer()
        tok.load(str(Path(job.export_dir) / (pte.tokenizer or "tokenizer.json")))
        ids = {k: [int(i) for i in tok.encode(text, 0, 0)] for k, text in job.reference_texts.items()}
        eos = [int(e) for e in pte_metadata(Path(job.export_dir) / pte.path)["get_eos_ids"]]
        return ChatOutput(ids=ids, stop_ids=eos, end_of_turn_stops=job.end_of_turn in eos, note=NOTE)
