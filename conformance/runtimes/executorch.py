"""ExecuTorch: the C++ ``HFTokenizer`` (pip ``pytorch-tokenizers``) on the rendered conversations, and the
program's end-of-sequence ids (``get_eos_ids``, run by the ExecuTorch runtime).

pytorch-tokenizers has no template engine: an app renders ``executorch/chat_template.jinja`` itself, so checked
here is its tokenizer on the reference's rendered text (``encode(text, bos=0, eos=0)``). Its greedy decoding is
a conformance candidate of its own (``prodip.conformance.device_runners``).

    python -c "from prodip.conformance.runtimes.executorch import ExecuTorchAdapter; help(ExecuTorchAdapter.chat)"
"""

from __future__ import annotations

from pathlib import Path

from prodip.conformance.runtimes.common import ChatJob, ChatOutput, RuntimeAdapter, error_text
from prodip.conformance.runtimes.timing import SpeedJob, Timing, time_runner

NAME = "executorch"
NOTE = (
    "pytorch-tokenizers has no template engine: the app renders executorch/chat_template.jinja; "
    "checked: its C++ HFTokenizer on the rendered text"
)


def _threadpool(threads: int) -> int:
    """Set ExecuTorch's CPU threadpool (XNNPACK's) to ``threads`` when given (0: leave its default, one per core)
    and return the count it now has."""
    from executorch.extension.pybindings import portable_lib  # noqa: PLC0415 (optional: prodip[runtimes])

    if threads and portable_lib._threadpool_get_thread_count() != threads:
        # "unsafe" only while a method runs on the pool: none does between conformance's calls
        portable_lib._unsafe_reset_threadpool(threads)
    return int(portable_lib._threadpool_get_thread_count())


class ExecuTorchAdapter(RuntimeAdapter):
    name = NAME

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        """Each ``.pte`` through ExecuTorch's Python runtime (``ExecuTorchRunner``: the program's ``forward`` with
        its own KV cache), on ``job.threads`` threads of its pool."""
        from importlib.metadata import version  # noqa: PLC0415

        from prodip.conformance.device_runners import ExecuTorchRunner  # noqa: PLC0415 (torch, executorch)

        out = {}
        for cand in job.candidates:
            timing = Timing(version=f"executorch {version('executorch')}")
            try:
                timing.threads = _threadpool(job.threads)
                runner = ExecuTorchRunner(Path(job.export_dir) / cand.path, cand.name)
                if len(job.prompt) + job.new_tokens > runner.max_seq_len:
                    raise ValueError(
                        f"{cand.path}: {len(job.prompt)} prompt + {job.new_tokens} new tokens exceed its "
                        f"KV-cache window get_max_seq_len {runner.max_seq_len}"
                    )
                out[cand.name] = time_runner(runner, job.prompt, job.new_tokens, job.rounds, timing)
            except Exception as err:  # a program that cannot run has no speed; the others still do
                timing.error = error_text(err)
                out[cand.name] = timing
        return out

    def chat(self, job: ChatJob) -> ChatOutput:
        from pytorch_tokenizers import CppHFTokenizer  # noqa: PLC0415 (installed with executorch)

        from prodip.conformance.device_runners import pte_metadata  # noqa: PLC0415

        pte = job.first("pte")
        tok = CppHFTokenizer()
        tok.load(str(Path(job.export_dir) / (pte.tokenizer or "tokenizer.json")))
        ids = {k: [int(i) for i in tok.encode(text, 0, 0)] for k, text in job.reference_texts.items()}
        eos = [int(e) for e in pte_metadata(Path(job.export_dir) / pte.path)["get_eos_ids"]]
        return ChatOutput(ids=ids, stop_ids=eos, end_of_turn_stops=job.end_of_turn in eos, note=NOTE)
