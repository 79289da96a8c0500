"""onnxruntime-genai (its Python API): greedy ids of every ONNX variant, and its chat template and stop ids.

It loads the export through its ``genai_config.json``, with the manifest's ``genai_overlay`` of the variant
(for a contrib export: its shared-buffer graph ``onnx/<file>_genai.onnx``, same weights), and is compared with
ONNX Runtime on the variant's own file. Install: ``pip install 'prodip[runtimes]'``.

    python -c "from prodip.conformance.runtimes.genai import genai_greedy; help(genai_greedy)"
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prodip.conformance.runtimes.common import (
    ChatJob,
    ChatOutput,
    GreedyJob,
    GreedyOutput,
    RuntimeAdapter,
    error_text,
    truncate_at_eos,
)
from prodip.conformance.runtimes.timing import SpeedJob, Timing
from prodip.export.genai import variant_overlay

NAME = "onnxruntime-genai"


def _load_model(og: Any, export_dir: Path, onnx_file: str, threads: int) -> Any:
    """``og.Model`` of the export's genai_config.json overlaid to run ``onnx_file`` with ``threads`` intra-op threads
    (0: onnxruntime-genai's default)."""
    config = og.Config(str(export_dir))
    overlay = variant_overlay(export_dir, onnx_file)
    if threads:
        overlay["model"]["decoder"]["session_options"] = {"intra_op_num_threads": threads}
    config.overlay(json.dumps(overlay))
    return og.Model(config)


def _eos_ids(export_dir: Path) -> list[int]:
    eos = json.loads((Path(export_dir) / "genai_config.json").read_text(encoding="utf-8"))["model"].get("eos_token_id")
    return [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]


def genai_greedy(
    export_dir: Path, onnx_file: str, prompts: Sequence[Sequence[int]], max_new_tokens: int, threads: int = 0
) -> dict[str, Any]:
    """Greedy ids from onnxruntime-genai: ``og.Config(export_dir)`` (its ``genai_config.json``) with the
    manifest's ``genai_overlay`` of the variant whose file is ``onnx_file`` (for a contrib export: its
    shared-buffer graph, ``onnx/<file>_genai.onnx``); a file no variant lists: that file, no shared buffer.

    Returns:
        ``{"ids": [[prompt + new ids], ...], "stop_ids": genai_config.json's eos ids, "versions": {...}}``,
        each ending with the EOS that stopped
        it, as the other runners' do: onnxruntime-genai (0.18) stops on its ``eos_token_id`` but leaves
        that token out of ``get_sequence()``, so a sequence that stopped before ``max_length`` gets it
        back (a model that ends its text within the new tokens failed every variant's check without).
    Raises:
        ImportError: onnxruntime-genai is not installed (the message says how to install it).
        RuntimeError: onnxruntime-genai refused the config or the model.
    """
    try:
        import onnxruntime_genai as og  # noqa: PLC0415 (optional dependency: prodip[runtimes])
    except ImportError:
        raise ImportError("onnxruntime-genai is not installed: pip install 'prodip[runtimes]'") from None
    eos_ids = _eos_ids(export_dir)
    model = _load_model(og, export_dir, onnx_file, threads)
    out = []
    for prompt in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + max_new_tokens)
        gen = og.Generator(model, params)
        gen.append_tokens(list(prompt))
        while not gen.is_done():
            gen.generate_next_token()
        seq = [int(i) for i in gen.get_sequence(0)]
        stopped_early = len(seq) < len(prompt) + max_new_tokens  # only an EOS stops it before max_length
        if stopped_early:  # which of the eos ids stopped it: the token it chose last (get_next_tokens)
            nxt = [int(t) for t in gen.get_next_tokens()] or eos_ids[:1]
            if nxt[0] in eos_ids and seq[-1:] != nxt[:1]:
                seq.append(nxt[0])
        out.append(seq)
    return {"ids": out, "stop_ids": eos_ids, "versions": {"onnxruntime-genai": getattr(og, "__version__", None)}}


def genai_timing(
    export_dir: Path, onnx_file: str, prompt: Sequence[int], new_tokens: int, rounds: int, threads: int
) -> Timing:
    """Time onnxruntime-genai's greedy generation of the variant whose file is ``onnx_file`` (loaded as
    :func:`genai_greedy` loads it): one untimed warm-up round, then ``rounds`` timed ones of exactly
    ``new_tokens`` tokens (``min_length`` = ``max_length``: its end of sequence does not stop them).
    ``time.perf_counter`` is read before ``append_tokens`` (the prompt's prefill) and after each
    ``generate_next_token``.

    Raises:
        ImportError: onnxruntime-genai is not installed. RuntimeError: it refused the config or the model, or stopped short of ``new_tokens``.
    """
    import onnxruntime_genai as og  # noqa: PLC0415 (optional dependency: prodip[runtimes])

    model = _load_model(og, export_dir, onnx_file, threads)
    timing = Timing(threads=threads, version=f"onnxruntime-genai {getattr(og, '__version__', '?')}")
    length = len(prompt) + new_tokens
    for r in range(rounds + 1):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, min_length=length, max_length=length)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(list(prompt))
        stamps = []
        while not gen.is_done():
            gen.generate_next_token()
            stamps.append(time.perf_counter())
        if len(stamps) != new_tokens:
            raise RuntimeError(f"onnxruntime-genai generated {len(stamps)} new tokens, asked for {new_tokens}")
        if r:  # round 0 warms the session up and is not counted
            timing.add_round(t0, stamps)
    return timing


class GenaiAdapter(RuntimeAdapter):
    name = NAME

    def time_generation(self, job: SpeedJob) -> dict[str, Timing]:
        out = {}
        for cand in job.candidates:
            try:
                out[cand.name] = genai_timing(
                    job.export_dir, cand.path, job.prompt, job.new_tokens, job.rounds, job.threads
                )
            except Exception as err:  # a variant that cannot run has no speed; the others still do
                out[cand.name] = Timing(threads=job.threads, error=error_text(err))
        return out

    def greedy(self, job: GreedyJob) -> dict[str, GreedyOutput]:
        out = {}
        for cand in job.candidates:
            try:
                got = genai_greedy(job.export_dir, cand.path, job.prompts, job.max_new_tokens, job.threads)
            except Exception as err:  # a runtime that cannot run fails this variant
                out[cand.name] = GreedyOutput(error=error_text(err))
                continue
            # cut at genai's own stop ids (genai_config.json), not the export's: an end of turn missing
            # there lets genai run past it, and that must show as different ids
            ids = [truncate_at_eos(g, len(p), got["stop_ids"]) for g, p in zip(got["ids"], job.prompts)]
            out[cand.name] = GreedyOutput(ids=ids)
        return out

    def chat(self, job: ChatJob) -> ChatOutput:
        """``Tokenizer.apply_chat_template`` (genai reads tokenizer_config.json), then its encode; the stop ids of
        genai_config.json ``model.eos_token_id``."""
        import onnxruntime_genai as og  # noqa: PLC0415 (optional: prodip[runtimes])

        tok = og.Tokenizer(og.Model(str(job.export_dir)))
        ids = {
            k: [int(i) for i in tok.encode(tok.apply_chat_template(json.dumps(m), add_generation_prompt=True))]
            for k, m in job.conversations.items()
        }
        eos = _eos_ids(job.export_dir)
        return ChatOutput(ids=ids, stop_ids=eos, end_of_turn_stops=job.end_of_turn in eos, version=og.__version__)
