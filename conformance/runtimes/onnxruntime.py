"""ONNX Runtime (its CPU execution provider, Python): the timed generation of every ONNX variant.

Its ids and logits are the candidates' own checks (``prodip.conformance.runners.OrtRunner``), so it has no greedy or
chat work; its row is ``timed``, so its adapter here is one runtime of the card's speed table
(``prodip.conformance.speed.timers``), timed through the same runner
(:func:`prodip.conformance.runtimes.timing.time_runner`).

    python -c "from prodip.conformance.runtimes.onnxruntime import OnnxRuntimeAdapter; print(OnnxRuntimeAdapter().available())"
"""

from __future__ import annotations

from prodip.conformance.runtimes.common import RuntimeAdapter, error_text
from prodip.conformance.runtimes.timing import SpeedJob, Timing, time_runner

NAME = "onnxruntime"


class OnnxRuntimeAdapter(RuntimeAdapter):
    name = NAME

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        import onnxruntime  # noqa: PLC0415 (heavy)

        from prodip.conformance.runners import OrtRunner  # noqa: PLC0415 (onnxruntime; adapters import this module)

        cfg = job.model_cfg
        out = {}
        for cand in job.candidates:
            timing = Timing(threads=job.threads, version=f"onnxruntime {onnxruntime.__version__}")
            try:
                runner = OrtRunner(
                    job.export_dir / cand.path,
                    cand.name,
                    num_layers=cfg.num_hidden_layers,
                    num_kv_heads=cfg.num_key_value_heads,
                    head_dim=cfg.head_dim,
                    threads=job.threads,
                )
                out[cand.name] = time_runner(runner, job.prompt, job.new_tokens, job.rounds, timing)
            except Exception as err:  # a variant that cannot run has no speed; the others still do
                timing.error = error_text(err)
                out[cand.name] = timing
        return out
