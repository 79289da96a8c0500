"""ConformanceConfig: the settings of ``prodip conformance`` (flags, the ``[conformance]`` TOML table).

python -c "from prodip.conformance.config import ConformanceConfig; print(ConformanceConfig(export_dir='runs/demo/export'))"
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from prodip.base.config import check_threads, opt
from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.runtimes import NPM_HINT, PIP_HINT, Runtime, by_name, default_on_device, on_device
from prodip.base.variants import VARIANT_NAMES


def _runtimes_help() -> str:
    """``runtimes``' help, written from the runtime table (``prodip.base.runtimes.RUNTIMES``): each on-device
    row with what installs it and whether its logits are gated too, and the default."""

    def one(r: Runtime) -> str:
        how = f"Node; `{NPM_HINT}` in the prodip repository" if r.package.startswith("npm:") else PIP_HINT
        logits = "; also gates its logits by the variant's tolerance" if r.logits_metric else ""
        return f"{r.name} ({how}{logits})"

    return (
        "on-device runtimes that must reproduce ONNX Runtime's greedy ids on each ONNX variant: "
        + ", ".join(one(by_name(name)) for name in on_device())
        + ". Each is a gated check; a runtime that cannot run fails the variant (one that is not installed: see "
        f"missing_runtimes). Default: {', '.join(default_on_device()) or 'none'}; an empty list checks none "
        "(the report says so)"
    )


#: The tolerance file shipped with prodip (justified on the trained demo model; see its notes).
DEFAULT_TOLERANCES = Path(__file__).with_name("tolerances.toml")


@dataclass
class ConformanceConfig:
    """What to check and where to write the report (see CONTRACTS.md "Conformance report")."""

    export_dir: str = opt("", "export dir to check (made by `prodip export`)")
    checkpoint: Optional[str] = opt(
        None,
        "checkpoint the export was made from (step, checkpoints or run dir); "
        "default: the manifest's source_checkpoint.path",
    )
    out: Optional[str] = opt(None, "report dir for report.json + report.md (default: EXPORT_DIR/conformance)")
    tolerances: Optional[str] = opt(
        None, "tolerance TOML file (default: conformance/tolerances.toml, set from the trained demo model)"
    )
    shards_dir: Optional[str] = opt(
        None,
        "shards dir whose validation split gives held-out text "
        "(perplexity and bits/char per language): required, since every "
        "candidate table gates bpc_delta_max (`prodip run` passes the run's "
        "shards; without it nothing is measured, exit 2)",
    )
    heldout: dict[str, str] = opt(
        help="held-out text files per language instead of shards, e.g. bn=data/heldout/udhr_ben.txt,"
        "en=data/heldout/udhr_eng.txt (UTF-8 text, NFC-normalised, encoded with the export's tokenizer): "
        "what a model fine-tuned from a downloaded base has when it has no pretraining shards",
        factory=dict,
    )
    context_tokens: int = opt(
        0,
        "longest sequence the checks feed (the context prompt and held-out windows; tokens; 0 = the model's "
        "max_position_embeddings): a model with a very long window (Llama 3.2's 131072) is checked on a prefix",
    )
    heldout_tokens: int = opt(1024, "held-out tokens per language read from the validation shards (tokens)")
    greedy_tokens: int = opt(64, "new tokens decoded greedily per prompt (tokens)")
    kv_tokens: int = opt(
        0,
        "length of the KV-cache check sequence: prefill, a 4-token chunk, then "
        "single steps, so the cache is checked at the far positions (tokens; 0 = the "
        "whole context window)",
    )
    kv_steps: int = opt(8, "single-token decode steps in the KV-cache check (steps)")
    variants: list[str] = opt(
        help="candidates to check: safetensors, transformers, or manifest variant "
        f"names ({', '.join(v for v in VARIANT_NAMES if v != 'safetensors')}; int4 includes int4-wasm, its "
        "WASM graph, and naming int4-wasm checks int4 whole); default: every one in the manifest",
        factory=list,
    )
    threads: int = opt(
        1,
        "CPU threads for torch and ONNX Runtime (0 = library default); 1 is the default "
        "because the work is many small latency-bound calls and two thread pools in one "
        "process contend (bench/conformance_threads.py, demo-size export on 2 busy cores: "
        "31 s at 1 thread, 166 s at 2)",
    )
    runtimes: list[str] = opt(
        help=_runtimes_help(),
        factory=default_on_device,
    )
    missing_runtimes: str = opt(
        "skip",
        "a runtime of `runtimes` that is not installed: skip = listed as skipped in the report, not a failure "
        "(as the tokenizer's parity check; `make RUNTIMES=0` installs none); fail = it fails every ONNX variant (CI)",
        choices=("skip", "fail"),
    )
    runtime_tokens: int = opt(16, "new tokens each runtime decodes greedily per prompt (tokens)")
    speed: bool = opt(
        True,
        "time greedy generation of every variant in every runtime that runs it (speed.json beside report.json, "
        "the card's speed table): ONNX Runtime, llama.cpp, ExecuTorch, and the on-device runtimes `runtimes` "
        "chose (onnxruntime-web also times the export's web page in Chromium on WASM); false = no speed table",
    )
    speed_rounds: int = opt(3, "timed rounds per variant and runtime, after one warm-up; the card shows medians")
    speed_tokens: int = opt(32, "new tokens per timed round (tokens; >= 2: the decode rate is after the first)")
    write_manifest: bool = opt(
        True,
        "record the verdict in the export's manifest.json conformance slot and the quality card in its README.md",
    )
    eval_json: Optional[str] = opt(
        None,
        "eval.json of `prodip eval` on the same checkpoint: the card's trained-vs-random-twin table (absent: "
        "the card says so)",
    )

    tasks: list[str] = opt(
        help="lm-evaluation-harness tasks to score on the checkpoint and every ONNX variant for the card's task "
        "table (as `prodip eval --tasks`); default: the tasks eval_json scored, with its settings",
        factory=list,
    )
    task_paths: list[str] = opt(help="more folders of lm-eval task YAML for `tasks`", factory=list)
    task_limit: int = opt(0, "with `tasks`: score only the first N items of each (items; 0 = all)")
    task_peers: Optional[str] = opt(
        None,
        "TOML file of reference models' published task scores ([[peer]] name, source, scores = {task = score}), "
        "shown as columns beside the card's task table (docs/eval.md)",
    )

    def report_dir(self) -> Path:
        """Where report.json and report.md go: ``out``, else ``EXPORT_DIR/conformance``."""
        return Path(self.out) if self.out else Path(self.export_dir) / "conformance"

    def __post_init__(self) -> None:
        known = on_device()
        unknown = [r for r in self.runtimes if r not in known]
        if unknown:
            raise InvalidInput(
                f"ConformanceConfig.runtimes: unknown runtime(s) {unknown}; choose from {', '.join(known)}"
                + ("; to check none, give an empty list (--runtimes '')" if "none" in unknown else "")
            )
        if self.speed_tokens < 2:
            raise InvalidInput(f"ConformanceConfig.speed_tokens must be >= 2, got {self.speed_tokens}")
        for name in ("greedy_tokens", "kv_steps", "runtime_tokens", "speed_rounds"):
            if getattr(self, name) < 1:
                raise InvalidInput(f"ConformanceConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("heldout_tokens", "kv_tokens", "context_tokens"):
            if getattr(self, name) < 0:
                raise InvalidInput(f"ConformanceConfig.{name} must be >= 0, got {getattr(self, name)}")
        check_threads("ConformanceConfig.threads", self.threads)
        if self.heldout and self.shards_dir:
            raise InvalidInput("ConformanceConfig: give held-out text as shards_dir or as heldout files, not both")
        for lang, path in self.heldout.items():
            if Path(path).is_dir():  # held-out figures are per language; a folder may hold several languages' files
                names = sorted(f.name for f in Path(path).iterdir() if f.is_file())
                held = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
                raise InvalidInput(
                    f"ConformanceConfig.heldout {lang}={path}: is a folder, and held-out figures are per language: "
                    f"give {lang}'s UTF-8 text file, {lang}=FILE ({'it holds ' + held if names else 'it holds no file'})"
                )
            if not Path(path).is_file():
                raise MissingInput(f"ConformanceConfig.heldout {lang}={path}: no such file")
