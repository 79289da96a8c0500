"""GPU check of configs/h100-0.4b.toml in one short window: tokens/s, MFU, peak memory, save stall.

1. Installs what the GPU image lacks from ``bench/gpu/requirements.txt`` (wheels carried in
   ``.whl/``, no network there) and this repository itself (``pip install --no-deps
   --no-build-isolation --target /tmp/site``), unless ``prodip`` already imports.
2. Builds a tokenizer (vocab 32000) and shards from ``data/`` unless ``--tokenizer-dir`` and
   ``--shards-dir`` are given (the bundled corpus is ~1 M tokens; the stream wraps around).
3. Trains the config as written (micro-batch 16 x 2048, accumulation 8, bf16 autocast,
   torch.compile, fused AdamW, guards first) for ``--steps-acc8`` steps, then the same at
   accumulation 1 for ``--steps-acc1`` steps, each with a checkpoint every few steps (written in
   the background), and summarises each run's metrics.jsonl after ``--skip`` warm-up steps:
   median tokens/s and MFU per step (save stall excluded), tokens/s over the wall clock of the
   steady steps (stalls and background writes included), peak memory (probes excluded) and each
   save's stall (``checkpoint_stall_s``: seconds the training thread was held).
Writes ``summary.json``, ``summary.md`` and the logs to ``--out`` (default ``$OUT`` or
/tmp/prodip_gpu). Budget: about 6 minutes on one H100/H200 (compile ~1 min per run).

    python3 bench/gpu/run_0p4b.py                 # on the GPU machine, from the repo root
    python3 bench/gpu/run_0p4b.py --smoke         # CPU plumbing check: tiny model, few steps

Before the GPU call, here: ``pip download --no-deps -r bench/gpu/requirements.txt -d .whl`` (and
``echo /.whl/ >> .git/info/exclude``); device tool: carry [".whl"], timeout_s 540.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "h100-0.4b.toml"
SITE = Path("/tmp/site")
SMOKE = ["--hidden-size", "64", "--intermediate-size", "128", "--num-hidden-layers", "2"]
SMOKE += ["--num-attention-heads", "4", "--num-key-value-heads", "2", "--max-position-embeddings", "128"]
SMOKE += ["--device", "cpu", "--dtype", "float32", "--compile", "false", "--seq-len", "64", "--batch-size", "2"]


def ensure_installed(env: dict) -> None:
    """Make ``prodip`` and bench/gpu/requirements.txt importable in subprocesses (``env``)."""
    probe = [sys.executable, "-c", "import prodip.train.trainer, tomli_w"]
    if subprocess.run(probe, env=env, capture_output=True).returncode == 0:
        return
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(SITE)]
    reqs = ROOT / "bench" / "gpu" / "requirements.txt"
    subprocess.run(pip + ["--find-links", str(ROOT / ".whl"), "-r", str(reqs)], check=True)
    subprocess.run(pip + ["--no-build-isolation", str(ROOT)], check=True)
    env["PYTHONPATH"] = str(SITE) + os.pathsep + env.get("PYTHONPATH", "")
    subprocess.run(probe, env=env, check=True)


def _run(cmd: list[str], env: dict, log: Path) -> float:
    """Run a command, tee its output to ``log``; returns seconds taken. Exits on failure."""
    print("+", " ".join(cmd), flush=True)
    start = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            fh.write(line)
            if "step/s" not in line and "s/step" not in line:  # keep the tqdm bar out of the tail
                sys.stdout.write(line)
        if proc.wait():
            sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}; log: {log}")
    return time.perf_counter() - start


def prepare(work: Path, env: dict, smoke: bool) -> tuple[Path, Path]:
    """Tokenizer + shards from data/ (skipped when already there)."""
    tok, shards = work / "tokenizer", work / "shards"
    prodip = [sys.executable, "-m", "prodip.cli"]
    inputs = ["--inputs", "bn=data/bn,en=data/en"]
    if not (tok / "tokenizer.json").exists():
        sizes = ["--vocab-size", "2048", "--sample-chars", "300000"] if smoke else ["--vocab-size", "32000"]
        cmd = prodip + ["tokenizer", "train", *inputs, *sizes, "--out-dir", str(tok)]
        _run(cmd, env, work / "tokenizer.log")
    if not (shards / "meta.json").exists():
        cmd = prodip + ["data", "prepare", "--tokenizer-dir", str(tok), *inputs, "--out-dir", str(shards)]
        _run(cmd + ["--val-fraction", "0.02"], env, work / "data.log")
    return tok, shards


def summarise(run_dir: Path, skip: int) -> dict:
    """Steady-state figures of one run's metrics.jsonl (the first ``skip`` steps left out)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = rows[skip:] if len(rows) > skip + 1 else rows

    def median(key):
        vals = sorted(r[key] for r in steady if key in r)
        return vals[len(vals) // 2] if vals else None

    tokens = steady[-1]["tokens_seen"] - steady[0]["tokens_seen"]
    wall = steady[-1]["elapsed_s"] - steady[0]["elapsed_s"]
    stalls = [round(r["checkpoint_stall_s"], 4) for r in rows if "checkpoint_stall_s" in r]
    return {
        "steps": len(rows),
        "steady_steps": len(steady) - 1,
        "tokens_per_step": rows[0]["tokens_seen"],
        "tokens_per_s_median": median("tokens_per_s"),
        "mfu_median": median("mfu"),
        "step_time_s_median": median("step_time_s"),
        "tokens_per_s_wall": tokens / wall if wall > 0 else None,
        "peak_memory_gib": max((r.get("peak_memory_gib", 0.0) for r in rows), default=None),
        "checkpoint_stall_s": stalls,
        "first_step_s": rows[0]["step_time_s"],
        "loss_first": rows[0]["loss"],
        "loss_last": rows[-1]["loss"],
    }


def train_run(name: str, args, tok: Path, shards: Path, env: dict, accum: int, steps: int, every: int) -> dict:
    run_dir = Path(args.work) / f"{name}_{int(time.time())}"
    flags = ["--tokenizer-dir", str(tok), "--shards-dir", str(shards), "--out-dir", str(run_dir)]
    flags += ["--steps", str(steps), "--grad-accum-steps", str(accum), "--warmup-steps", "5"]
    flags += ["--checkpoint-every-steps", str(every), "--keep-last", "2", "--eval-every-steps", "0"]
    flags += ["--log-every-steps", "1", "--progress", "false"]
    flags += SMOKE if args.smoke else []
    flags += ["--compile", "false"] if args.no_compile else []
    cmd = [sys.executable, "-m", "prodip.train", "train", "--config", str(CONFIG), *flags]
    wall = _run(cmd, env, Path(args.out) / f"{name}.log")
    return {"grad_accum_steps": accum, "wall_s": round(wall, 1), **summarise(run_dir, args.skip)}


def markdown(summary: dict) -> str:
    lines = [
        f"# {summary['config']} on {summary['device']} ({summary['date_utc']}, torch {summary['torch']})",
        "",
        "| run | tokens/step | tokens/s (median step) | MFU | tokens/s (wall, saves incl.) | peak GiB | "
        "save stall s (each) | first step s |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for name, r in summary["runs"].items():
        mfu = f"{r['mfu_median']:.3f}" if r["mfu_median"] else "-"
        peak = f"{r['peak_memory_gib']:.1f}" if r["peak_memory_gib"] else "-"
        lines.append(
            f"| {name} | {r['tokens_per_step']:,} | {r['tokens_per_s_median']:,.0f} | {mfu} | "
            f"{r['tokens_per_s_wall']:,.0f} | {peak} | {r['checkpoint_stall_s']} | {r['first_step_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps-acc8", type=int, default=14, help="steps at the config's accumulation 8")
    ap.add_argument("--steps-acc1", type=int, default=60, help="steps at accumulation 1")
    ap.add_argument("--skip", type=int, default=3, help="warm-up steps left out of the medians")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/prodip_gpu")
    ap.add_argument("--work", default="/tmp/prodip_gpu_work")
    ap.add_argument("--tokenizer-dir"), ap.add_argument("--shards-dir")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU: checks the plumbing only")
    ap.add_argument("--no-compile", action="store_true", help="eager mode (fallback if torch.compile fails)")
    args = ap.parse_args()
    for d in (args.out, args.work):
        Path(d).mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ensure_installed(env)
    t0 = time.perf_counter()
    if args.tokenizer_dir and args.shards_dir:
        tok, shards = Path(args.tokenizer_dir), Path(args.shards_dir)
    else:
        tok, shards = prepare(Path(args.work), env, args.smoke)
    import torch

    summary = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": CONFIG.name,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() and not args.smoke else "cpu",
        "torch": torch.__version__,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "prepare_s": round(time.perf_counter() - t0, 1),
        "runs": {},
    }
    for name, accum, steps, every in (("acc8", 8, args.steps_acc8, 5), ("acc1", 1, args.steps_acc1, 20)):
        summary["runs"][name] = train_run(name, args, tok, shards, env, accum, steps, every)
        (Path(args.out) / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")  # partial results too
    (Path(args.out) / "summary.md").write_text(markdown(summary))
    print(json.dumps(summary, indent=2), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
