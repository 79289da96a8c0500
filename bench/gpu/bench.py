"""One GPU window, one command: ``python3 bench/gpu/bench.py "$OUT"`` (no make needed).

Made to run blind on a lent H100/H200 whose image holds the packages of ``image-packages.txt``
(a copy of the device library's list: torch, triton, transformers, onnx, onnxruntime, onnxscript,
safetensors, tokenizers, tensorboard, pyarrow, matplotlib, pytest, ...) but no package registry:
the repository is imported in place (a folder of links that maps the stage folders to
``prodip.*`` as pyproject.toml's package-dir does) and the dependencies the image lacks
(:data:`CARRIED`: ``tomli_w``; ``pydantic`` with its core for CPython 3.11 and 3.12;
``license_expression`` with ``boolean.py``) are wheels committed beside this file, unpacked into
the work folder. Nothing is installed. Stages, each bounded by what is left of ``--budget-s`` and
each reporting its failure instead of stopping the call:

1. environment: Python, torch / CUDA / cuDNN / triton versions, the GPU, which SDPA kernel each
   ``attention_backend`` runs for the 0.4B attention shapes (``prodip.train.attention``), and a
   GEMM reference: the matrix-product FLOP/s this device reaches (bf16 on CUDA, fp32 on CPU), the
   physical ceiling the MFU is read against;
2. data: a tokenizer (vocab 32000) and shards from the bundled corpus (``data/``) through the
   real ``prodip tokenizer train`` / ``prodip data prepare`` commands;
3. throughput: ``configs/h100-0.4b.toml`` as written (micro-batch 16 x 2048, accumulation 8,
   bf16, torch.compile) for ``--steps`` steps through ``prodip train`` run inside a worker
   process, with a checkpoint twice (mid-run and at the end): median tokens/s and MFU over the
   steps after ``--skip`` that hold no save, time to first step (process start -> loop start),
   Dynamo/Inductor compile seconds and graph breaks as the compiling process counts them, peak
   allocated / reserved memory, the stall of each save. On failure it retries in the same call:
   out of memory -> half the micro-batch (twice the accumulation, same tokens per step); a
   compiler error -> compile with flash attention, then eager; anything else -> the next
   attention backend (cudnn -> flash -> efficient -> math). Each failure is reported with its
   error, and the rows a failed or cut-off attempt did write are summarised;
4. profile, at the end of the same worker process (warm compile caches): the step-1 loss of one
   batch on the device against the same batch and weights on CPU, device-to-host seconds of the
   model and AdamW moments, the writer's seconds for them, then a few steps under torch.profiler:
   the top-15 kernels with milliseconds and the device time split into matrix products,
   attention, normalisation/elementwise, optimizer, other and idle;
5. resume: a small model, N steps straight vs N/2 + ``--resume``, with ``deterministic = true``
   (must be bitwise; flash attention first) and ``false`` (a second straight run measures the
   noise floor; each resumed loss within ``max(5 x floor, 1e-4)`` relative), which also measures
   what determinism costs in tokens/s;
6. export + conformance: the deterministic straight run's checkpoint (trained on this device)
   exported (safetensors, ONNX fp32 and int4) and checked by ``prodip conformance``; runtimes
   not on the machine (Node's transformers.js, onnxruntime-genai) are left out and reported as skipped;
7. with ``--ab``, if time is left: A/B runs of the MFU levers (fused q/k/v and gate/up
   projections, compile per layer, CUDA graphs), each against the throughput stage's settings.

Writes to OUT_DIR (after every stage, so a call cut short still leaves what it measured):
``report.json``, ``report.md`` (ending in one PASS / FAIL / N/A line per item, also in
``verdict.txt``), ``bench.log``, and ``logs.txt``: the tail of every subprocess's output
(150 lines of a failed one, 15 of one that passed). ``--dry`` runs the same stages on CPU with a
tiny model, reporting CPU values where CUDA is absent and N/A where a figure needs CUDA
(``make gpu-bench-dry``, run by the tests).

    python3 bench/gpu/bench.py "$OUT"                              # on the GPU machine, repo root
    python3 bench/gpu/bench.py --dry /tmp/gpu_bench_dry            # CPU, ~1 min
Device tool: ``run(command='python3 bench/gpu/bench.py "$OUT"', timeout_s=570)``; the files come back from $OUT.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "h100-0.4b.toml"
WHEELS = Path(__file__).resolve().parent / "wheels"
ATTENTION_CHAIN = ("cudnn", "flash", "efficient", "math")
#: lines of each subprocess's output kept in OUT/logs.txt (only OUT comes back from the device)
LOG_TAIL_FAILED, LOG_TAIL_OK = 150, 15
#: relative difference allowed between the step-1 loss on the device (bf16 autocast) and on CPU (fp32)
STEP1_LOSS_RTOL = 2e-2

#: The tiny model of ``--dry`` (flags of ``prodip train``), and its training shape.
DRY_MODEL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
#: The small model of the resume / export stage on a GPU (~25 M parameters with vocab 32000).
SMALL_MODEL = dict(
    hidden_size=512,
    intermediate_size=1408,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=512,
)


# ---------------------------------------------------------------------------------------------
# importing the repository in place
# ---------------------------------------------------------------------------------------------
def site_dir(work: Path) -> Path:
    """A folder that makes ``import prodip.*`` work from this checkout without installing it.

    ``prodip/`` there is a real folder holding links to ``prodip/``'s entries and one link per
    stage folder under its package name (pyproject.toml ``[tool.setuptools.package-dir]``);
    the committed ``tomli_w`` wheel goes on the path when the image lacks it.
    """
    site = work / "site"
    pkg = site / "prodip"
    if pkg.exists():
        shutil.rmtree(pkg)
    pkg.mkdir(parents=True)
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for entry in (ROOT / mapping["prodip"]).iterdir():
        (pkg / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        if name != "prodip":
            (pkg / name.split(".", 1)[1]).symlink_to(ROOT / folder)
    return site


#: module the image lacks -> the committed wheels (file-name prefixes) that provide it and its needs
#: (the image has typing-extensions: image-packages.txt lists its packages). tests/bench derives
#: pyproject.toml's dependencies minus that list, and each must be here or in NOT_CARRIED.
CARRIED = {
    "tomli_w": ("tomli_w-",),
    "pydantic": ("pydantic-", "pydantic_core-", "annotated_types-", "typing_inspection-"),
    # prodip.base.sources parses SPDX licence expressions (source records); boolean.py is its one need
    "license_expression": ("license_expression-", "boolean_py-"),
}
#: project dependencies the image lacks that the bench path never imports (distribution -> why);
#: the dry run, whose imports tests/gpu_image refuses outside the image's list, proves it.
NOT_CARRIED = {
    "fastapi": "prodip serve only",
    "uvicorn": "prodip serve only",
    "wordfreq": "only a tokenizer config with word_counts = wordfreq:LANG imports it",
    "tomli": "Python < 3.11 only (the image runs 3.12)",
    "lm-eval": "only task scores import it (`[eval] tasks`; the bench's configs score none)",
}


def wheel_fits(wheel: Path) -> bool:
    """True for a pure-Python wheel or one built for this interpreter (``cp312`` on the image's 3.12)."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return "-py3-none-any" in wheel.name or f"-{tag}-{tag}-" in wheel.name


def python_path(work: Path) -> str:
    """PYTHONPATH for the subprocesses: the in-place package, and the committed wheels for what is missing.

    Wheels are unpacked into ``work/carried`` rather than imported as zips, because pydantic-core
    holds a compiled extension and Python cannot import a ``.so`` from inside a zip.
    """
    parts = [str(site_dir(work))]
    carried = work / "carried"
    for module, prefixes in CARRIED.items():
        probe = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True)
        if not probe.returncode:
            continue
        for wheel in sorted(WHEELS.glob("*.whl")):
            if wheel.name.startswith(prefixes) and wheel_fits(wheel):
                with zipfile.ZipFile(wheel) as archive:
                    archive.extractall(carried)
    if carried.exists():
        parts.append(str(carried))
    return os.pathsep.join(parts + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


# ---------------------------------------------------------------------------------------------
# failures and fallbacks
# ---------------------------------------------------------------------------------------------
OOM_MARKS = ("OutOfMemoryError", "CUDA out of memory", "CUBLAS_STATUS_ALLOC_FAILED")
COMPILE_MARKS = (
    "torch._dynamo",
    "torch._inductor",
    "BackendCompilerFailed",
    "InductorError",
    "TorchRuntimeError",
    "triton",
)


ATTENTION_WORDS = re.compile(r"cudnn|flash|attention|sdpa|fmha", re.IGNORECASE)


def classify_failure(text: str) -> str:
    """``oom`` | ``attention`` | ``compile`` | ``other`` from a failed run's output.

    ``attention``: the final error line names an attention kernel (a cuDNN/flash failure, also
    one raised while Inductor lowers it), so the next backend is tried before giving up compile.
    """
    tail = text[-20000:]
    if any(m in tail for m in OOM_MARKS):
        return "oom"
    if ATTENTION_WORDS.search(error_line(text)):
        return "attention"
    if any(m in tail for m in COMPILE_MARKS):
        return "compile"
    return "other"


def last_json(text: str) -> Any:
    """The last output line that is a JSON object: a worker's result, even when a library logs a
    line after it at exit (compile workers, allocator warnings)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"no result line in the worker's output: {error_line(text)}")


def error_line(text: str) -> str:
    """The last line that looks like an error (one line, for the report)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.search(r"(Error|Exception|error:|Killed|Traceback|timed out)", ln):
            return ln[:400]
    return lines[-1][:400] if lines else "(no output)"


def next_settings(settings: dict[str, Any], kind: str) -> Optional[dict[str, Any]]:
    """The settings to try after a failure of ``kind``; ``None`` when nothing is left to try.

    oom: half the micro-batch and twice the accumulation (tokens per step unchanged), down to 1;
    compile: compile with flash attention (a cuDNN attention problem inside Inductor is the likely
    cause), then eager with flash; attention and other: the next backend of :data:`ATTENTION_CHAIN`.
    """
    s = dict(settings)
    if kind == "oom" and s["batch_size"] > 1:
        s["batch_size"] //= 2
        s["grad_accum_steps"] *= 2
        return s
    if kind == "compile" and s["compile"]:
        if s["attention_backend"] != "flash":
            s["attention_backend"] = "flash"
        else:
            s["compile"] = False
        return s
    chain = list(ATTENTION_CHAIN)
    i = chain.index(s["attention_backend"]) if s["attention_backend"] in chain else -1
    if i + 1 < len(chain):
        s["attention_backend"] = chain[i + 1]
        return s
    return None


# ---------------------------------------------------------------------------------------------
# the bench
# ---------------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.dry = args, args.dry
        self.out, self.work = Path(args.out), Path(args.work)
        self.out.mkdir(parents=True, exist_ok=True)
        if self.work.exists():
            shutil.rmtree(self.work)
        self.work.mkdir(parents=True)
        self.t0 = time.monotonic()
        self.log_fh = open(self.out / "bench.log", "w", encoding="utf-8")
        (self.out / "logs.txt").write_text("", encoding="utf-8")
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": python_path(self.work)}
        self.env.pop("CUBLAS_WORKSPACE_CONFIG", None)
        self.report: dict[str, Any] = {
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "mode": "dry (CPU, tiny model)" if self.dry else "gpu",
            "config": CONFIG.name,
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "budget_s": args.budget_s,
            "stages": {},
        }

    # -- plumbing ------------------------------------------------------------------------------
    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def say(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {msg}"
        print(line, flush=True)
        self.log_fh.write(line + "\n")
        self.log_fh.flush()

    def run(self, name: str, cmd: list[str], timeout: float) -> tuple[int, str, float]:
        """Run ``cmd`` (its output to ``work/NAME.log``, its tail to ``OUT/logs.txt``); returns
        (exit code, output, seconds). ``self.spawned_unix_s``: the wall clock just before the start."""
        log = self.work / f"{name}.log"
        self.say(f"+ {' '.join(str(c) for c in cmd)}  (limit {timeout:.0f}s)")
        start = time.monotonic()
        self.spawned_unix_s = time.time()
        with open(log, "w", encoding="utf-8") as fh:
            try:
                # cwd: the work dir, not the checkout, whose prodip/ (base only) would shadow the mapped package
                rc = subprocess.run(
                    cmd, cwd=self.work, env=self.env, stdout=fh, stderr=subprocess.STDOUT, timeout=max(1.0, timeout)
                ).returncode
            except subprocess.TimeoutExpired:
                rc = 124
                fh.write(f"\ntimed out after {timeout:.0f}s (bench budget)\n")
        text = log.read_text(encoding="utf-8", errors="replace")
        seconds = time.monotonic() - start
        keep = LOG_TAIL_FAILED if rc else LOG_TAIL_OK
        lines = text.splitlines()
        with open(self.out / "logs.txt", "a", encoding="utf-8") as fh:
            fh.write(f"===== {name}: exit {rc}, {seconds:.1f}s, last {min(keep, len(lines))} of {len(lines)} lines\n")
            fh.write("\n".join(lines[-keep:]) + "\n\n")
        return rc, text, seconds

    def stage(self, name: str, fn: Callable[[], dict[str, Any]], need_s: float) -> dict[str, Any]:
        """Run one stage unless too little budget is left; record its result or its error."""
        if self.left() < need_s:
            result = {"status": "skipped", "reason": f"{self.left():.0f}s of the budget left, needs ~{need_s:.0f}s"}
        else:
            self.say(f"== {name}")
            start = time.monotonic()
            try:
                result = {"status": "ok", **fn()}
            except Exception as err:  # a stage's failure is a finding, not the end of the call
                result = {"status": "failed", "error": f"{type(err).__name__}: {err}"[:600]}
                self.log_fh.write(traceback.format_exc())
            result["seconds"] = round(time.monotonic() - start, 1)
        self.report["stages"][name] = result
        self.say(
            f"{name}: {result['status']}"
            + (f" ({result.get('error') or result.get('reason')})" if result["status"] != "ok" else "")
        )
        self.write_reports()
        return result

    def py(self, *args: str) -> list[str]:
        return [sys.executable, *args]

    # -- stages --------------------------------------------------------------------------------
    def environment(self) -> dict[str, Any]:
        code = f"import json,sys; sys.path.insert(0,{str(Path(__file__).parent)!r}); import bench; print(json.dumps(bench.environment_facts({64 if self.dry else 0})))"
        rc, text, _ = self.run("environment", self.py("-c", code), min(120, self.left()))
        if rc:
            raise RuntimeError(error_line(text))
        facts = last_json(text)
        for key, value in facts.items():
            self.say(f"  {key}: {value}")
        return facts

    def data(self) -> dict[str, Any]:
        tok, shards = self.work / "tokenizer", self.work / "shards"
        inputs = ["--inputs", f"bn={ROOT / 'data' / 'bn'},en={ROOT / 'data' / 'en'}"]
        sizes = ["--vocab-size", "2048", "--sample-chars", "300000"] if self.dry else ["--vocab-size", "32000"]
        cli = self.py("-m", "prodip.cli")
        rc, text, t_tok = self.run(
            "tokenizer", cli + ["tokenizer", "train", *inputs, *sizes, "--out-dir", str(tok)], self.left()
        )
        if rc:
            raise RuntimeError(f"tokenizer train: {error_line(text)}")
        prep = cli + ["data", "prepare", "--tokenizer-dir", str(tok), *inputs, "--out-dir", str(shards)]
        rc, text, t_data = self.run("data", prep + ["--val-fraction", "0.02"], self.left())
        if rc:
            raise RuntimeError(f"data prepare: {error_line(text)}")
        meta = json.loads((shards / "meta.json").read_text())
        train_tokens = {lang: sum(f["n_tokens"] for f in d["train"]) for lang, d in meta["languages"].items()}
        self.tok, self.shards = tok, shards
        return {
            "source": "the bundled corpus (data/bn, data/en) through prodip tokenizer train / data prepare "
            "(real tokens; the stream wraps around it)",
            "vocab_size": meta["vocab_size"],
            "train_tokens": train_tokens,
            "tokenizer_s": round(t_tok, 1),
            "data_s": round(t_data, 1),
        }

    def train_flags(self, run_dir: Path, s: dict[str, Any], steps: int, every: int) -> list[str]:
        flags = ["--tokenizer-dir", str(self.tok), "--shards-dir", str(self.shards), "--out-dir", str(run_dir)]
        flags += ["--steps", str(steps), "--warmup-steps", "5", "--checkpoint-every-steps", str(every)]
        flags += ["--keep-last", "2", "--eval-every-steps", "0", "--log-every-steps", "1", "--progress", "false"]
        flags += ["--force"]  # the bench corpus's fertility gate is not what is measured here
        for key in ("batch_size", "grad_accum_steps", "attention_backend", "compile"):
            flags += ["--" + key.replace("_", "-"), str(s[key]).lower()]
        for key in ("compile_scope", "compile_mode", "fused_projections"):
            if key in s:
                flags += ["--" + key.replace("_", "-"), str(s[key]).lower()]
        if self.dry:
            for key, value in DRY_MODEL.items():
                flags += ["--" + key.replace("_", "-"), str(value)]
            flags += ["--device", "cpu", "--dtype", "float32", "--seq-len", "64"]
        return flags

    def throughput(self) -> dict[str, Any]:
        cfg = tomllib.loads(CONFIG.read_text())["train"]
        settings = {
            "batch_size": 2 if self.dry else cfg["batch_size"],
            "grad_accum_steps": cfg["grad_accum_steps"],
            "attention_backend": ATTENTION_CHAIN[0],
            "compile": False if self.dry else cfg["compile"],
        }
        steps = self.args.steps
        attempts, n = [], 0
        while settings is not None:
            n += 1
            run_dir = self.work / f"train_{n}"
            spec = {
                "dry": self.dry,
                "argv": [
                    "--config",
                    str(CONFIG),
                    *self.train_flags(run_dir, settings, steps, every=self.args.save_every),
                ],
                "profile": "profile" in self.args.stages.split(","),
                "tokenizer": str(self.tok),
                "shards": str(self.shards),
                "settings": settings,
            }
            cmd = self.py(__file__, "--worker", "train", "--spec", json.dumps(spec))
            rc, text, wall = self.run(f"train_{n}", cmd, self.left() - self.reserve("throughput"))
            attempt: dict[str, Any] = {"settings": dict(settings), "exit_code": rc, "wall_s": round(wall, 1)}
            attempts.append(attempt)
            if (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().strip():
                attempt.update(summarise(run_dir, skip=self.args.skip, spawned_unix_s=self.spawned_unix_s))
                attempt["partial"] = rc != 0  # a failed or cut-off attempt: the rows it did write
            if rc == 0:
                worker = last_json(text)
                self.profiled = worker.pop("profile", None)
                attempt.update(worker)
                attempt["config_tokens_per_step"] = cfg["batch_size"] * cfg["seq_len"] * cfg["grad_accum_steps"]
                if attempt.get("tokens_per_s_median") and attempt.get("model_flops_per_token"):
                    attempt["model_tflops"] = round(
                        attempt["model_flops_per_token"] * attempt["tokens_per_s_median"] / 1e12, 4
                    )
                gemm = (self.report.get("environment") or {}).get("gemm") or {}
                if gemm.get("tflops") and attempt.get("model_tflops"):
                    attempt["fraction_of_gemm"] = round(attempt["model_tflops"] / gemm["tflops"], 3)
                self.best = settings
                self.say(
                    f"  ok: {attempt['tokens_per_s_median']:,.0f} tokens/s, MFU {attempt.get('mfu_median')}, "
                    f"kernel {attempt.get('attention_kernel')}, peak {attempt.get('peak_allocated_gib')} GiB"
                )
                break
            kind = classify_failure(text)
            if rc == 2 and "attention_backend" not in text[-3000:]:
                kind = "usage"  # a refused invocation: no setting of the chain would change that
            attempt.update({"failure": kind, "error": error_line(text)})
            self.say(f"  failed ({kind}): {attempt['error']}")
            if rc == 124 or kind == "usage":
                break
            settings = next_settings(settings, kind)
        return {"attempts": attempts, "ok_attempt": len(attempts) if attempts[-1]["exit_code"] == 0 else None}

    def reserve(self, stage: str) -> float:
        """Seconds of the budget kept for the stages after ``stage`` (estimates on an H200; dry: a busy CPU)."""
        after = {"throughput": 175.0, "resume_1": 115.0, "resume_2": 45.0, "export": 30.0}
        return after[stage] * (0.6 if self.dry else 1.0)

    def profile(self) -> dict[str, Any]:
        """What the winning throughput attempt's worker measured after training (same process)."""
        prof = self.profiled or {}
        if "error" in prof:
            raise RuntimeError(prof["error"])
        return prof

    def resume(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for i, det in enumerate((True, False), 1):
            spec = {"dry": self.dry, "tokenizer": str(self.tok), "shards": str(self.shards)}
            spec.update(deterministic=det, work=str(self.work / f"resume_det{int(det)}"))
            name = f"resume_deterministic_{str(det).lower()}"
            rc, text, _ = self.run(
                name,
                self.py(__file__, "--worker", "resume", "--spec", json.dumps(spec)),
                self.left() - self.reserve(f"resume_{i}"),
            )
            out[name] = last_json(text) if rc == 0 else {"ok": False, "error": error_line(text)}
            self.say(f"  {name}: {out[name]}")
        self.ckpt_run = self.work / "resume_det1" / "straight"
        return out

    def export_conformance(self) -> dict[str, Any]:
        ckpt, export = self.ckpt_run / "checkpoints" / "latest", self.work / "export"
        rc, text, t_exp = self.run(
            "export",
            self.py(
                "-m",
                "prodip.cli",
                "export",
                "--checkpoint",
                str(self.ckpt_run),
                "--out",
                str(export),
                "--variants",
                "safetensors,fp32,int4",
            ),
            self.left() - self.reserve("export"),
        )
        result: dict[str, Any] = {"checkpoint": str(ckpt), "export_s": round(t_exp, 1), "export_exit_code": rc}
        if rc:
            raise RuntimeError(f"export: {error_line(text)}")
        runtimes, skipped = available_runtimes(self.env)
        result["runtimes"], result["runtimes_skipped"] = runtimes, skipped
        conf = self.work / "conformance"
        cmd = self.py("-m", "prodip.cli", "conformance", str(export), "--checkpoint", str(self.ckpt_run))
        cmd += ["--shards-dir", str(self.shards), "--out", str(conf), "--runtimes", ",".join(runtimes)]
        rc, text, t_conf = self.run("conformance", cmd, self.left())
        result.update({"conformance_exit_code": rc, "conformance_s": round(t_conf, 1)})
        report = conf / "report.json"
        if report.exists():
            result["conformance"] = conformance_summary(json.loads(report.read_text()))
        if rc not in (0, 1) or not report.exists():
            raise RuntimeError(f"conformance: {error_line(text)}")
        return result

    def ab(self) -> dict[str, Any]:
        """Short runs of each MFU lever against the winning settings (GPU only)."""
        levers = [{"fused_projections": True}, {"compile_scope": "layers"}, {"compile_mode": "reduce-overhead"}]
        results = []
        for i, lever in enumerate(levers):
            if self.left() < 90:
                results.append({"lever": lever, "status": "skipped (budget)"})
                continue
            s = {**self.best, **lever}
            run_dir = self.work / f"ab_{i}"
            spec = {
                "dry": False,
                "argv": ["--config", str(CONFIG), *self.train_flags(run_dir, s, self.args.steps, every=0)],
            }
            spec.update(profile=False, tokenizer=str(self.tok), shards=str(self.shards), settings=s)
            cmd = self.py(__file__, "--worker", "train", "--spec", json.dumps(spec))
            rc, text, wall = self.run(f"ab_{i}", cmd, self.left() - 5)
            row = {"lever": lever, "exit_code": rc, "wall_s": round(wall, 1)}
            if rc == 0:
                row.update(summarise(run_dir, skip=self.args.skip, spawned_unix_s=self.spawned_unix_s))
                row.update(last_json(text))
            else:
                row["error"] = error_line(text)
            results.append(row)
        return {"runs": results}

    def main(self) -> int:
        want = set(self.args.stages.split(","))
        env = self.stage("environment", self.environment, 5)
        self.report["environment"] = env
        data = self.stage("data", self.data, 30)
        self.best, self.profiled = None, None
        if data["status"] == "ok":
            if "throughput" in want:
                self.stage("throughput", self.throughput, 60)
            if self.best and self.profiled is not None:
                self.stage("profile", self.profile, 0)
            if "resume" in want:
                self.stage("resume", self.resume, 40)
            ckpt = getattr(self, "ckpt_run", None)
            if "export" in want and ckpt and (ckpt / "checkpoints" / "latest").exists():
                self.stage("export_conformance", self.export_conformance, 20)
            if self.args.ab and not self.dry and self.best:
                self.stage("ab", self.ab, 90)
        self.report["total_s"] = round(time.monotonic() - self.t0, 1)
        self.report["verdict"] = verdict(self.report)
        self.write_reports()
        write_atomic(self.out / "verdict.txt", "\n".join(self.report["verdict"]) + "\n")
        for line in self.report["verdict"]:
            self.say(line)
        self.say(f"report: {self.out / 'report.json'}, {self.out / 'report.md'}")
        bad = [k for k, v in self.report["stages"].items() if v["status"] == "failed"]
        return 1 if bad else 0

    def write_reports(self) -> None:
        write_atomic(self.out / "report.json", json.dumps(self.report, indent=2, default=str) + "\n")
        write_atomic(self.out / "report.md", markdown(self.report))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------
# facts, summaries
# ---------------------------------------------------------------------------------------------
def environment_facts(seq_len: int = 0) -> dict[str, Any]:
    """Versions, the device, and the SDPA kernel each attention_backend runs for the 0.4B shapes
    (at ``seq_len`` tokens, default the config's)."""
    import torch

    from prodip.base.errors import InvalidInput
    from prodip.train import attention, determinism
    from prodip.train.config import ModelConfig

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
    }
    for mod in ("triton", "transformers", "onnx", "onnxruntime", "onnxscript", "safetensors", "tokenizers"):
        try:
            facts[mod] = __import__(mod).__version__
        except Exception:
            facts[mod] = None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        facts["gpu"] = torch.cuda.get_device_name(0)
        facts["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        facts["compute_capability"] = f"{props.major}.{props.minor}"
        facts["driver"] = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
            ).stdout.strip()
            or None
        )
    else:
        facts["gpu"] = None
        facts["cpu_threads"] = torch.get_num_threads()
    model = ModelConfig(**tomllib.loads(CONFIG.read_text())["model"])
    seq = seq_len or tomllib.loads(CONFIG.read_text())["train"]["seq_len"]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    kernels = {}
    for backend in attention.BACKENDS:
        try:
            k = attention.probe(
                backend,
                device,
                dtype,
                heads=model.num_attention_heads,
                kv_heads=model.num_key_value_heads,
                head_dim=model.head_dim,
                seq_len=seq,
            )
            kernels[backend] = f"{k.kernel} ({k.op})"
        except InvalidInput as err:
            kernels[backend] = f"refused: {err}"[:300]
    facts["attention_kernels"] = kernels
    # what deterministic = true tries, in order, for this config on CUDA (a pure choice: no GPU needed)
    gqa = model.num_key_value_heads < model.num_attention_heads
    facts["deterministic_attention_on_cuda"] = determinism.attention_choice("auto", True, torch.device("cuda"), gqa=gqa)
    facts["gemm"] = gemm_reference(device)
    return facts


def gemm_reference(device: Any, n: Optional[int] = None, reps: int = 0) -> dict[str, Any]:
    """The FLOP/s of one square matrix product on ``device``: bf16 8192^3 on CUDA (the ceiling a
    training step's matrix products can reach there), fp32 1024^3 on CPU. Median of ``reps`` timed
    runs after two warm-ups; 2 n^3 FLOP each.

    Returns:
        {"dtype", "n", "ms", "tflops"}.
    """
    import torch

    cuda = device.type == "cuda"
    n = n or (8192 if cuda else 1024)
    reps = reps or (20 if cuda else 5)
    dtype = torch.bfloat16 if cuda else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    times = []
    for i in range(reps + 2):
        if cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        a @ b
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t)
    sec = sorted(times)[len(times) // 2]
    return {
        "dtype": str(dtype).replace("torch.", ""),
        "n": n,
        "ms": round(sec * 1e3, 3),
        "tflops": round(2 * n**3 / sec / 1e12, 3),
    }


def summarise(run_dir: Path, skip: int, spawned_unix_s: Optional[float] = None) -> dict[str, Any]:
    """Steady-state figures of one run's metrics.jsonl: medians over the steps after the first
    ``skip`` that hold no checkpoint save (also of a run cut short: whatever rows it wrote).

    ``spawned_unix_s``: the wall clock at the process's start; with it, ``time_to_first_step_s``
    is the first row's ``loop_start_unix_s`` minus it (imports, data, model, compile, guards).
    """
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steady = rows[skip:] if len(rows) > skip + 1 else rows[1:] or rows
    clean = [r for r in steady if "checkpoint_stall_s" not in r] or steady

    def median(key):
        vals = sorted(r[key] for r in clean if r.get(key) is not None)
        return vals[len(vals) // 2] if vals else None

    tokens = steady[-1]["tokens_seen"] - steady[0]["tokens_seen"]
    wall = steady[-1]["elapsed_s"] - steady[0]["elapsed_s"]
    start = rows[0].get("loop_start_unix_s")
    return {
        "steps": len(rows),
        "steps_in_median": len(clean),
        "tokens_per_step": rows[0]["tokens_seen"],
        "tokens_per_s_median": median("tokens_per_s"),
        "mfu_median": median("mfu"),
        "step_time_s_median": median("step_time_s"),
        "tokens_per_s_wall": tokens / wall if wall > 0 else None,
        "first_step_s": rows[0]["step_time_s"],
        "time_to_first_step_s": round(start - spawned_unix_s, 2) if start and spawned_unix_s else None,
        "checkpoint_stall_s": [round(r["checkpoint_stall_s"], 4) for r in rows if "checkpoint_stall_s" in r],
        "attention_backend": rows[0].get("attention_backend"),
        "attention_kernel": rows[0].get("attention_kernel"),
        "loss_first": rows[0]["loss"],
        "loss_last": rows[-1]["loss"],
    }


def verdict(r: dict[str, Any]) -> list[str]:
    """One ``PASS`` / ``FAIL`` / ``N/A`` line per item of the call, for the end of the report."""
    st, cuda = r["stages"], not r["mode"].startswith("dry")
    lines = []

    def add(ok: Optional[bool], item: str, detail: str) -> None:
        lines.append(f"{'N/A ' if ok is None else 'PASS' if ok else 'FAIL'} {item}: {detail}")

    for name in ("environment", "data"):
        s = st.get(name, {"status": "not run"})
        add(s["status"] == "ok", name, s.get("error") or s.get("reason") or s["status"])
    choice = (st.get("environment") or {}).get("deterministic_attention_on_cuda")
    if choice:  # flash first: math's fp32 probabilities of the 0.4B config do not fit a GPU
        add(choice[0] == "flash", "deterministic attention on CUDA", " -> ".join(choice))
    thr = st.get("throughput", {})
    ok = next((a for a in thr.get("attempts", []) if a["exit_code"] == 0), None)
    if ok:
        add(
            True,
            "throughput",
            f"{_fmt(ok.get('tokens_per_s_median'), ',.0f')} tokens/s median over "
            f"{ok.get('steps_in_median')} steps without a save, settings {ok['settings']}",
        )
        mfu = ok.get("mfu_median")
        add(
            None if mfu is None else mfu >= 0.5,
            "MFU >= 0.5 (the goal)",
            f"{_fmt(mfu, '.3f')}; "
            f"{_fmt(ok.get('fraction_of_gemm'), '.3f')} of the GEMM reference" + ("" if cuda else " (no CUDA peak)"),
        )
        add(
            None if ok.get("compile_s") is None else ok.get("graph_breaks") == 0,
            "compile, no graph breaks",
            f"{_fmt(ok.get('compile_s'))} s, {_fmt(ok.get('graph_breaks'))} graph breaks; time to first step "
            f"{_fmt(ok.get('time_to_first_step_s'))} s" + ("" if ok["settings"]["compile"] else " (compile off)"),
        )
    else:
        last = (thr.get("attempts") or [{}])[-1]
        add(False, "throughput", last.get("error") or thr.get("error") or thr.get("reason") or "not run")
    prof = st.get("profile", {})
    step1 = prof.get("step1_loss")
    if step1:
        add(
            step1["ok"] if cuda else None,
            "step-1 loss, device vs CPU",
            f"{step1['device']:.5f} vs {step1['cpu_fp32']:.5f} (rel {step1['rel_diff']:.1e}, limit {STEP1_LOSS_RTOL})",
        )
    else:
        add(False, "profile", prof.get("error") or prof.get("reason") or "not run")
    for name, res in (st.get("resume") or {}).items():
        if isinstance(res, dict):
            tol = (
                "bitwise"
                if res.get("mode") == "bitwise"
                else f"rtol {_fmt(res.get('rtol'), '.1e')} (noise floor {_fmt(res.get('noise_floor'), '.1e')})"
            )
            add(
                bool(res.get("ok")),
                name,
                res.get("error") or f"max rel diff {_fmt(res.get('max_rel_diff'), '.1e')}, {tol}",
            )
    if "resume" not in st:
        add(False, "resume", "not run")
    exp = st.get("export_conformance", {"status": "not run"})
    variants = (exp.get("conformance") or {}).get("variants") or {}
    if exp["status"] != "ok" or not variants:
        add(False, "export + conformance", exp.get("error") or exp.get("reason") or exp["status"])
    for name, passed in variants.items():  # int4 of a model trained a few steps may miss its top-1 bound
        add(bool(passed), f"conformance {name}", "passed" if passed else "failed (report.json: conformance)")
    return lines


def available_runtimes(env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The conformance runtimes this machine can run, and why the others are skipped."""
    runtimes, skipped = [], {}
    genai = subprocess.run([sys.executable, "-c", "import onnxruntime_genai"], env=env, capture_output=True)
    if genai.returncode == 0:
        runtimes.append("onnxruntime-genai")
    else:
        skipped["onnxruntime-genai"] = "python package onnxruntime_genai not installed here"
    if shutil.which("node") and (ROOT / "node" / "node_modules" / "@huggingface" / "transformers").exists():
        runtimes.append("transformers.js")
    else:
        skipped["transformers.js"] = "Node.js or node/node_modules (transformers.js) not on this machine"
    return runtimes, skipped


def conformance_summary(report: dict[str, Any]) -> dict[str, Any]:
    """The verdict and each variant's verdict from conformance/report.json."""
    out: dict[str, Any] = {"passed": report.get("passed", report.get("verdict"))}
    variants = report.get("variants") or report.get("candidates") or {}
    if isinstance(variants, dict):
        out["variants"] = {
            k: (v.get("passed", v.get("verdict")) if isinstance(v, dict) else v) for k, v in variants.items()
        }
    return out


def _fmt(v: Any, spec: str = "") -> str:
    if v is None:
        return "-"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def markdown(r: dict[str, Any]) -> str:
    env = r.get("environment") or {}
    st = r["stages"]
    lines = [f"# GPU bench: {r['config']} ({r['mode']}, {r['date_utc']})", "", f"`{r['command']}`", ""]
    lines += ["## Environment", ""]
    for k, v in env.items():
        if k not in ("status", "seconds", "attention_kernels"):
            lines.append(f"- {k}: {v}")
    for k, v in (env.get("attention_kernels") or {}).items():
        lines.append(f"- attention_backend = {k}: {v}")
    lines += ["", "## Stages", "", "| stage | status | seconds | note |", "|---|---|---:|---|"]
    for name, s in st.items():
        lines.append(
            f"| {name} | {s['status']} | {_fmt(s.get('seconds'))} | {s.get('error') or s.get('reason') or ''} |"
        )
    thr = st.get("throughput", {})
    if thr.get("attempts"):
        lines += [
            "",
            "## Throughput (0.4B config)",
            "",
            "| # | micro-batch x accum | attention (kernel) | compile | result | tokens/s | MFU | steps in median | "
            "time to step 1 s | compile s | graph breaks | peak alloc / reserved GiB | save stall s |",
            "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        for i, a in enumerate(thr["attempts"], 1):
            s = a["settings"]
            res = "ok" if a["exit_code"] == 0 else f"{a.get('failure')}: {a.get('error')}"
            if a.get("partial"):
                res += " (rows it wrote)"
            lines.append(
                f"| {i} | {s['batch_size']} x {s['grad_accum_steps']} | {s['attention_backend']} "
                f"({_fmt(a.get('attention_kernel'))}) | {s['compile']} | {res} | {_fmt(a.get('tokens_per_s_median'), ',.0f')} | "
                f"{_fmt(a.get('mfu_median'), '.3f')} | {_fmt(a.get('steps_in_median'))} | {_fmt(a.get('time_to_first_step_s'))} | "
                f"{_fmt(a.get('compile_s'))} | {_fmt(a.get('graph_breaks'))} | "
                f"{_fmt(a.get('peak_allocated_gib'))} / {_fmt(a.get('peak_reserved_gib'))} | {_fmt(a.get('checkpoint_stall_s'))} |"
            )
        ok = next((a for a in thr["attempts"] if a["exit_code"] == 0), {})
        gemm = env.get("gemm") or {}
        if ok:
            lines.append("")
            lines.append(
                f"GEMM reference ({gemm.get('dtype')} {gemm.get('n')}^3): {_fmt(gemm.get('tflops'))} TFLOP/s; the model "
                f"ran {_fmt(ok.get('model_tflops'))} TFLOP/s = {_fmt(ok.get('fraction_of_gemm'), '.3f')} of it. "
                f"Peak RSS (CPU): {_fmt(ok.get('peak_rss_gib'))} GiB. N/A without CUDA: MFU, peak allocated/reserved."
            )
    prof = st.get("profile", {})
    if prof.get("split"):
        lines += ["", f"## Profile ({prof.get('basis')})", "", "| part | ms | share |", "|---|---:|---:|"]
        for k, v in prof["split"].items():
            lines.append(f"| {k} | {v['ms']:.1f} | {v['share']:.1%} |")
        lines += ["", "| top kernel / op | ms | calls | part |", "|---|---:|---:|---|"]
        for row in prof.get("top_kernels", []):
            lines.append(f"| `{row['name']}` | {row['ms']:.2f} | {row['calls']} | {row['part']} |")
        io, step1 = prof.get("checkpoint_io") or {}, prof.get("step1_loss") or {}
        lines += [
            "",
            f"- step-1 loss, one batch: device {_fmt(step1.get('device'), '.5f')}, CPU fp32 {_fmt(step1.get('cpu_fp32'), '.5f')} "
            f"(rel {_fmt(step1.get('rel_diff'), '.1e')}; {step1.get('note')})",
            f"- checkpoint I/O of {_fmt(io.get('gb'))} GB (weights + AdamW moments): device-to-host {_fmt(io.get('device_to_host_s'))} s"
            f"{'' if io.get('on_cuda') else ' (N/A: on CPU already)'}, writer {_fmt(io.get('writer_s'))} s",
        ]
    res = st.get("resume", {})
    for k, v in res.items():
        if isinstance(v, dict):
            lines += ["", f"## {k}", "", f"- {json.dumps(v)}"]
    exp = st.get("export_conformance", {})
    if exp.get("status") == "ok" or exp.get("conformance"):
        lines += ["", "## Export + conformance", "", f"- conformance: {json.dumps(exp.get('conformance'))}"]
        lines.append(f"- runtimes checked: {exp.get('runtimes')}; skipped: {json.dumps(exp.get('runtimes_skipped'))}")
    ab = st.get("ab", {})
    for row in ab.get("runs", []):
        lines.append(
            f"- A/B {row['lever']}: {_fmt(row.get('tokens_per_s_median'), ',.0f')} tokens/s, MFU {_fmt(row.get('mfu_median'), '.3f')} {row.get('error', '')}"
        )
    lines += ["", f"Total: {_fmt(r.get('total_s'))} s of a {r['budget_s']} s budget.", ""]
    if r.get("verdict"):
        lines += ["## Verdict", "", "```", *r["verdict"], "```", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# workers (run in subprocesses, so that a CUDA fault or a process-wide switch stays contained)
# ---------------------------------------------------------------------------------------------
def _model_and_train(spec: dict[str, Any], model_over: Optional[dict] = None) -> tuple[Any, dict[str, Any]]:
    from prodip.tokenizer.shards import load_meta
    from prodip.train.config import ModelConfig

    cfg = tomllib.loads(CONFIG.read_text())
    model = dict(cfg["model"])
    model.update(DRY_MODEL if spec["dry"] else (model_over or {}))
    return ModelConfig(**model, vocab_size=load_meta(spec["shards"]).vocab_size), cfg["train"]


def worker_train(spec: dict[str, Any]) -> dict[str, Any]:
    """One throughput attempt: ``prodip train`` (the CLI, ``spec["argv"]``) in this process, then
    the figures only this process can read: Dynamo/Inductor's compile seconds and graph breaks,
    peak memory, and (``spec["profile"]``) :func:`profile_figures` with the caches still warm.

    Exits with ``prodip train``'s exit code when it fails (its error is the last output line).
    """
    import torch

    from prodip.cli import main as prodip_main

    rc = prodip_main(["train", *spec["argv"]])
    if rc:
        raise SystemExit(rc)
    out: dict[str, Any] = {**compile_figures(), **memory_figures()}
    mcfg, tcfg = _model_and_train(spec)
    seq = 64 if spec["dry"] else tcfg["seq_len"]
    out["model_flops_per_token"] = mcfg.flops_per_token(seq)
    if spec.get("profile"):
        try:
            out["profile"] = profile_figures(spec)
        except Exception as err:  # the training figures stand; the profile's failure is reported
            traceback.print_exc()
            out["profile"] = {"error": f"{type(err).__name__}: {err}"[:600]}
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return out


def compile_figures() -> dict[str, Any]:
    """What torch.compile cost this process, by Dynamo's own timers (wherever the compile ran: the
    guards' first call or step 1). ``forward_compile_s``: ``_compile.compile_inner`` (tracing plus
    the Inductor compile of each frame's forward); ``backward_compile_s``: Inductor's backward
    compiler, which AOTAutograd runs lazily at the first backward, outside that timer (measured:
    a Linear's forward 2.8 s, its backward 32.5 s on a 2-core CPU). ``compile_s`` is their sum.
    Graph breaks and graphs as Dynamo counts them. ``None`` when nothing was compiled.
    """
    import torch._dynamo.utils as dynamo_utils

    metrics = dynamo_utils.compilation_time_metrics
    inner = metrics.get("_compile.compile_inner", [])
    backward = [t for k, v in metrics.items() if k.endswith("bw_compiler") for t in v]
    breaks = dynamo_utils.counters.get("graph_break", {})
    stats = dynamo_utils.counters.get("stats", {})
    return {
        "compile_s": round(sum(inner) + sum(backward), 2) if inner else None,
        "forward_compile_s": round(sum(inner), 2) if inner else None,
        "backward_compile_s": round(sum(backward), 2) if inner else None,
        "compiled_frames": len(inner),
        "graph_breaks": sum(breaks.values()) if inner else None,
        "graph_break_reasons": [k.splitlines()[0][:200] for k in list(breaks)[:5]],
        "unique_graphs": stats.get("unique_graphs") if inner else None,
    }


def memory_figures() -> dict[str, Any]:
    """Peak device memory of this process (CUDA: allocated and reserved by PyTorch's allocator),
    else the peak resident set size of the process (CPU), all in GiB."""
    import resource

    import torch

    if torch.cuda.is_available():
        return {
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 2),
            "peak_rss_gib": None,
        }
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {"peak_allocated_gib": None, "peak_reserved_gib": None, "peak_rss_gib": round(rss_kib / 2**20, 2)}


def profile_figures(spec: dict[str, Any]) -> dict[str, Any]:
    """After the throughput run, in its process, with the winning settings (accumulation 1):

    - ``step1_loss``: the loss of one row of the first micro-batch under a seed-1234 initialisation
      on the device (bf16 autocast on CUDA, the run's attention backend, eager) and on CPU in fp32;
    - ``checkpoint_io``: seconds to copy the weights and two AdamW moments (fp32) to pinned host
      memory (device-to-host), and to write them with safetensors (the writer's part of a save);
    - a profile of a few steps: the top-15 kernels (CUDA) or aten ops (CPU) by self time, and the
      time split of :func:`time_split`.
    """
    import contextlib

    import torch

    from prodip.train import attention
    from prodip.train.data import MixtureBatches
    from prodip.train.loop import build_optimizer, train_step
    from prodip.train.model import LlamaForCausalLM
    from prodip.train.trainer import compile_model

    mcfg, tcfg = _model_and_train(spec)
    s = spec["settings"]
    cuda = not spec["dry"] and torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    seq = 64 if spec["dry"] else tcfg["seq_len"]
    amp = torch.bfloat16 if cuda else None
    torch.manual_seed(1234)
    model = LlamaForCausalLM(mcfg)
    data = MixtureBatches(spec["shards"], tcfg.get("mixture", {}), s["batch_size"], seq, seed=0)
    x, y = data.next_batch()
    with torch.no_grad():
        cpu_loss = float(model(x[:1], labels=y[:1]))
    model.to(device)
    model.fuse_projections(bool(s.get("fused_projections", False)))
    cast = torch.autocast(device.type, amp) if amp else contextlib.nullcontext()
    with attention.context(s["attention_backend"]), torch.no_grad(), cast:
        # eager, before compiling: a no-grad batch-1 call of the compiled model would compile more graphs
        dev_loss = float(model(x[:1].to(device), labels=y[:1].to(device)))
    step1 = {"device": dev_loss, "cpu_fp32": cpu_loss, "rel_diff": abs(dev_loss - cpu_loss) / abs(cpu_loss)}
    step1["ok"] = step1["rel_diff"] <= STEP1_LOSS_RTOL
    step1["note"] = "same batch and weights" + ("" if cuda else "; both on CPU here (no CUDA): N/A as a device check")
    fwd = (
        compile_model(model, mode=s.get("compile_mode", "default"), scope=s.get("compile_scope", "model"))
        if s["compile"]
        else model
    )

    opt = build_optimizer(model, lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, device=device)

    def step():
        return train_step(fwd, opt, [data.next_batch()], lr=1e-4, grad_clip=1.0, device=device, autocast_dtype=amp)

    warm, n = (1, 2) if spec["dry"] else (2, 3)
    with attention.context(s["attention_backend"]):
        for _ in range(warm):
            step()
        io = checkpoint_io(model, opt, Path(spec["shards"]).parent / "io_probe")
        if cuda:
            torch.cuda.synchronize()
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        t = time.perf_counter()
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(n):
                step()
            if cuda:
                torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t) * 1e3
    return time_split(prof, wall_ms, cuda) | {
        "top_kernels": top_kernels(prof, cuda),
        "step1_loss": step1,
        "checkpoint_io": io,
        "steps": n,
        "tokens_per_step": s["batch_size"] * seq,
        "wall_ms": round(wall_ms, 1),
    }


def checkpoint_io(model: Any, optimizer: Any, folder: Path) -> dict[str, Any]:
    """Device-to-host seconds of the weights and AdamW moments (fp32, into pinned memory on CUDA)
    and the seconds safetensors takes to write them to ``folder`` (removed after)."""
    import torch
    from safetensors.torch import save_file

    tensors = {f"w.{k}": v for k, v in model.state_dict().items()}
    for i, state in enumerate(optimizer.state.values()):
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                tensors[f"m{i}.{key}"] = state[key]
    cuda = any(v.is_cuda for v in tensors.values())
    host = {k: torch.empty(v.shape, dtype=torch.float32, pin_memory=cuda) for k, v in tensors.items()}
    if cuda:
        torch.cuda.synchronize()
    t = time.perf_counter()
    for k, v in tensors.items():
        host[k].copy_(v, non_blocking=cuda)
    if cuda:
        torch.cuda.synchronize()
    d2h = time.perf_counter() - t
    folder.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    save_file(host, str(folder / "probe.safetensors"))
    write = time.perf_counter() - t
    shutil.rmtree(folder, ignore_errors=True)
    gb = sum(v.numel() * 4 for v in host.values()) / 1e9
    return {"gb": round(gb, 3), "device_to_host_s": round(d2h, 3), "writer_s": round(write, 3), "on_cuda": cuda}


def top_kernels(prof: Any, cuda: bool, k: int = 15) -> list[dict[str, Any]]:
    """The ``k`` kernels (CUDA) or aten ops (CPU) with the most self time, with their part of
    :func:`time_split`. Inductor names fused kernels after the aten ops they hold, so a row's
    name, not only its part, says what it is."""
    rows = []
    for e in prof.key_averages():
        if cuda:
            ms = (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)) / 1e3
            if e.key.startswith("aten::"):
                continue
        else:
            ms = e.self_cpu_time_total / 1e3 if e.key.startswith("aten::") else 0.0
        if ms > 0:
            rows.append({"name": e.key[:160], "ms": round(ms, 3), "calls": e.count, "part": categorise(e.key)})
    return sorted(rows, key=lambda r: -r["ms"])[:k]


#: kernel / op name patterns of each part of the profile split (first match wins).
SPLIT_PATTERNS = (
    ("optimizer", r"adam|multi_tensor|foreach|_fused_adamw|clip_grad|optimizer"),
    ("attention", r"flash|fmha|cudnn_attention|sdpa|scaled_dot_product|attention|fwd_kernel|bwd_kernel"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|wgmma|\bmm\b|aten::mm|aten::addmm|aten::bmm|matmul|linear"),
    (
        "norm/elementwise",
        r"triton|elementwise|vectorized|reduce|norm|softmax|silu|mul|add|copy|cat|fill|pow|rsqrt|mean|embedding|index|cross_entropy|log_softmax|sum|exp",
    ),
)


def categorise(name: str) -> str:
    low = name.lower()
    for part, pattern in SPLIT_PATTERNS:
        if re.search(pattern, low):
            return part
    return "other"


def time_split(prof: Any, wall_ms: float, cuda: bool) -> dict[str, Any]:
    """Split the profiled time: device kernels on CUDA (idle = wall minus busy), leaf CPU ops on CPU."""
    parts: dict[str, float] = {}
    if cuda:
        for e in prof.key_averages():
            dev = getattr(e, "self_device_time_total", None)
            if dev is None:
                dev = getattr(e, "self_cuda_time_total", 0.0)
            if (
                dev
                and e.device_type == getattr(e.device_type, "CUDA", e.device_type)
                and not e.key.startswith("aten::")
            ):
                parts[categorise(e.key)] = parts.get(categorise(e.key), 0.0) + dev / 1e3
        basis = "CUDA kernel time; idle = wall time with no kernel running"
    else:
        for e in prof.key_averages():
            if e.self_cpu_time_total and e.key.startswith("aten::"):
                parts[categorise(e.key)] = parts.get(categorise(e.key), 0.0) + e.self_cpu_time_total / 1e3
        basis = "CPU self time of aten ops; idle = wall time outside them (Python, dispatch, waits)"
    busy = sum(parts.values())
    parts["idle"] = max(0.0, wall_ms - busy)
    total = max(wall_ms, busy)
    split = {k: {"ms": round(v, 2), "share": v / total} for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}
    return {"basis": basis, "split": split}


def worker_resume(spec: dict[str, Any]) -> dict[str, Any]:
    """N straight vs N/2 + resume with ``deterministic`` as given; compares the losses."""
    import dataclasses

    from prodip.train.determinism import compare_resume, noise_floor, resume_rtol
    from prodip.train.trainer import TrainConfig, run_training, train

    mcfg, tcfg = _model_and_train(spec, SMALL_MODEL)
    work, det = Path(spec["work"]), spec["deterministic"]
    n = 6 if spec["dry"] else 8
    base = dict(
        shards_dir=spec["shards"],
        tokenizer_dir=spec["tokenizer"],
        steps=n,
        batch_size=2 if spec["dry"] else 8,
        seq_len=64 if spec["dry"] else 512,
        grad_accum_steps=2,
        lr=1e-3,
        min_lr=1e-4,
        warmup_steps=2,
        checkpoint_every_steps=n // 2,
        mixture=tcfg.get("mixture", {}),
        device="cpu" if spec["dry"] else "cuda",
        dtype="float32" if spec["dry"] else "bfloat16",
        compile=not spec["dry"],
        deterministic=det,
        progress=False,
        force=True,
    )
    t = time.perf_counter()
    straight = train(TrainConfig(out_dir=str(work / "straight"), **base), mcfg)
    straight_s = time.perf_counter() - t
    half = TrainConfig(out_dir=str(work / "halves"), max_steps_this_run=n // 2, **base)
    run_training(half, mcfg)
    resumed = train(dataclasses.replace(half, max_steps_this_run=0, resume=True), mcfg)

    def rows(d):
        return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]

    a, b = rows(straight), rows(resumed)
    # bitwise is the promise on CPU and with deterministic = true on CUDA (prodip.train.determinism)
    bitwise = det or spec["dry"]
    floor = None
    if not det:  # a second straight run: what the non-deterministic kernels alone change
        again = rows(train(TrainConfig(out_dir=str(work / "straight_again"), **base), mcfg))
        floor = noise_floor([r["loss"] for r in a], [r["loss"] for r in again])
    rtol = resume_rtol(floor) if floor is not None else None
    result = compare_resume(
        [r["loss"] for r in a], [r["loss"] for r in b], bitwise=bitwise, **({"rtol": rtol} if rtol else {})
    )
    steady = [r["tokens_per_s"] for r in a[2:]] or [r["tokens_per_s"] for r in a]
    result.update(
        noise_floor=floor,
        deterministic=det,
        steps=n,
        attention_kernel=a[0].get("attention_kernel"),
        tokens_per_s_median=sorted(steady)[len(steady) // 2],
        straight_run_s=round(straight_s, 1),
    )
    return result


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=os.environ.get("OUT") or "/tmp/prodip_gpu_bench", help="report folder")
    ap.add_argument("--dry", action="store_true", help="CPU, tiny model: the same stages, for the test suite")
    ap.add_argument("--budget-s", type=float, default=None, help="wall-clock budget, s (default 510 GPU, 600 dry)")
    ap.add_argument("--steps", type=int, default=None, help="throughput steps (default 13 GPU, 8 dry)")
    ap.add_argument("--skip", type=int, default=None, help="warm-up steps left out of the medians (default 3 / 2)")
    ap.add_argument(
        "--save-every",
        type=int,
        default=None,
        help="throughput checkpoint every N steps, and at the end (default 7 / 4)",
    )
    ap.add_argument("--ab", action="store_true", help="also A/B the MFU levers if time is left (GPU)")
    ap.add_argument(
        "--stages",
        default="throughput,profile,resume,export",
        help="stages after environment + data (a second window: --stages throughput --ab)",
    )
    ap.add_argument("--work", default=None, help="scratch folder (default /tmp/prodip_gpu_bench_work[_dry])")
    ap.add_argument("--worker", choices=("train", "resume"), help=argparse.SUPPRESS)
    ap.add_argument("--spec", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        spec = json.loads(args.spec)
        fn = worker_train if args.worker == "train" else worker_resume
        print(json.dumps(fn(spec), default=str), flush=True)
        return 0
    args.budget_s = args.budget_s or (600.0 if args.dry else 510.0)
    # GPU: 13 steps, saves at 7 and 13: the medians hold steps 4-12 but 7, i.e. 8 steps without a save
    args.steps = args.steps or (8 if args.dry else 13)
    args.save_every = args.save_every or (4 if args.dry else 7)
    args.skip = args.skip if args.skip is not None else (2 if args.dry else 3)
    args.work = args.work or ("/tmp/prodip_gpu_bench_work" + ("_dry" if args.dry else ""))
    return Bench(args).main()


if __name__ == "__main__":
    sys.exit(main())
