"""GPU check of configs/h100-0.4b.toml: a few hundred steps on the bundled corpus, self-contained.

1. Builds a tokenizer (vocab 32000) and shards from ``data/`` unless ``--tokenizer-dir`` and
   ``--shards-dir`` are given (the bundled corpus is ~1 M tokens; the stream wraps around).
2. Trains ``--steps`` optimizer steps of the 0.4B config with ``prodip train`` (bf16 autocast,
   torch.compile, fused AdamW, gradient-flow arbiter first), micro-batch 16 x 2048 tokens and no
   accumulation (so a step is short), and summarises metrics.jsonl: median tokens/s, MFU (against
   the GPU's bf16 dense peak from train.loop.PEAK_BF16_FLOPS), peak memory, compile + guard time.
3. Runs bench/train_throughput.py on the same config for the trainer / bare-loop ratio.
Writes ``summary.json`` (and the logs) to ``--out`` (default ``$OUT`` or /tmp/prodip_gpu).
Budget: about 5 minutes on one H100/H200.

    python3 bench/gpu/run_0p4b.py                 # on the GPU machine, from the repo root
    python3 bench/gpu/run_0p4b.py --smoke         # CPU plumbing check: tiny model, few steps
    (device tool: carry [".whl"], timeout_s 540; add --no-compile if torch.compile fails there)

Needs tomli-w (pure Python; the GPU image lacks it): if ``import tomli_w`` fails, a wheel under
``.whl/`` is installed into /tmp/site (fetch one here with ``pip download --no-deps tomli-w -d .whl``
and carry ``.whl``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "h100-0.4b.toml"
SMOKE_MODEL = [
    "--hidden-size",
    "64",
    "--intermediate-size",
    "128",
    "--num-hidden-layers",
    "2",
    "--num-attention-heads",
    "4",
    "--num-key-value-heads",
    "2",
    "--max-position-embeddings",
    "128",
]


def _ensure_tomli_w(env: dict) -> None:
    try:
        import tomli_w  # noqa: F401

        return
    except ImportError:
        pass
    wheels = glob.glob(str(ROOT / ".whl" / "tomli_w*.whl"))
    if not wheels:
        sys.exit("tomli_w missing and no .whl/tomli_w*.whl to install (see the module docstring)")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", "/tmp/site", *wheels],
        check=True,
    )
    sys.path.insert(0, "/tmp/site")
    env["PYTHONPATH"] = "/tmp/site" + os.pathsep + env.get("PYTHONPATH", "")


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
    inputs = "bn=data/bn,en=data/en"
    if not (tok / "tokenizer.json").exists():
        vocab = "2048" if smoke else "32000"
        _run(
            prodip
            + [
                "tokenizer",
                "train",
                "--inputs",
                inputs,
                "--vocab-size",
                vocab,
                "--out-dir",
                str(tok),
                "--sample-chars",
                "4000000" if not smoke else "300000",
            ],
            env,
            work / "tokenizer.log",
        )
    if not (shards / "meta.json").exists():
        _run(
            prodip
            + [
                "data",
                "prepare",
                "--tokenizer-dir",
                str(tok),
                "--inputs",
                inputs,
                "--out-dir",
                str(shards),
                "--val-fraction",
                "0.02",
            ],
            env,
            work / "data.log",
        )
    return tok, shards


def summarise(run_dir: Path, skip: int) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = rows[skip:] or rows

    def median(key):
        vals = sorted(r[key] for r in steady if key in r)
        return vals[len(vals) // 2] if vals else None

    return {
        "steps": len(rows),
        "tokens_per_s_median": median("tokens_per_s"),
        "mfu_median": median("mfu"),
        "step_time_s_median": median("step_time_s"),
        "peak_memory_gib": max((r.get("peak_memory_gib", 0.0) for r in rows), default=None),
        "first_step_s": rows[0]["step_time_s"],
        "loss_first": rows[0]["loss"],
        "loss_last": rows[-1]["loss"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--bench-steps", type=int, default=60, help="steps per side in train_throughput.py (0: skip)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "/tmp/prodip_gpu")
    ap.add_argument("--work", default="/tmp/prodip_gpu_work")
    ap.add_argument("--tokenizer-dir"), ap.add_argument("--shards-dir")
    ap.add_argument("--smoke", action="store_true", help="tiny model on CPU: checks the plumbing only")
    ap.add_argument("--no-compile", action="store_true", help="eager mode (fallback if torch.compile fails)")
    args = ap.parse_args()
    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    _ensure_tomli_w(env)
    t0 = time.perf_counter()
    if args.tokenizer_dir and args.shards_dir:
        tok, shards = Path(args.tokenizer_dir), Path(args.shards_dir)
    else:
        tok, shards = prepare(work, env, args.smoke)
    prep_s = time.perf_counter() - t0
    run_dir = work / f"run_{int(time.time())}"
    overrides = [
        "--tokenizer-dir",
        str(tok),
        "--shards-dir",
        str(shards),
        "--out-dir",
        str(run_dir),
        "--steps",
        str(args.steps),
        "--grad-accum-steps",
        "1",
        "--warmup-steps",
        "20",
        "--checkpoint-every-steps",
        "0",
        "--eval-every-steps",
        "0",
        "--log-every-steps",
        "1",
    ]
    if args.smoke:
        overrides += SMOKE_MODEL + [
            "--device",
            "cpu",
            "--dtype",
            "float32",
            "--compile",
            "false",
            "--seq-len",
            "64",
            "--batch-size",
            "2",
            "--vocab-size",
            "2048",
        ]
    if args.no_compile:
        overrides += ["--compile", "false"]
    train_s = _run(
        [sys.executable, "-m", "prodip.train", "train", "--config", str(CONFIG), *overrides], env, out / "train.log"
    )
    summary = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": str(CONFIG.name),
        "prepare_s": round(prep_s, 1),
        "train_wall_s": round(train_s, 1),
        **summarise(run_dir, skip=10),
    }
    try:
        import torch

        summary["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        summary["torch"] = torch.__version__
    except Exception as err:  # noqa: BLE001 - informational only
        summary["device"] = f"unknown ({err})"
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2), flush=True)
    if args.bench_steps:
        bench_cfg = out / "bench_config.toml"
        _write_bench_config(bench_cfg, args.smoke, compile_=not args.no_compile)
        _run(
            [
                sys.executable,
                "bench/train_throughput.py",
                "--config",
                str(bench_cfg),
                "--tokenizer-dir",
                str(tok),
                "--shards-dir",
                str(shards),
                "--steps",
                str(args.bench_steps),
                "--skip",
                "10",
                "--repeats",
                "1",
                "--json",
                str(out / "throughput.json"),
            ],
            env,
            out / "throughput.log",
        )
    return 0


def _write_bench_config(path: Path, smoke: bool, compile_: bool = True) -> None:
    """configs/h100-0.4b.toml with accumulation 1 (and the tiny model for --smoke)."""
    import tomli_w
    import tomllib

    doc = tomllib.loads(CONFIG.read_text())
    doc["train"]["grad_accum_steps"] = 1
    doc["train"]["compile"] = compile_ and doc["train"]["compile"]
    if smoke:
        flags = dict(zip(SMOKE_MODEL[::2], SMOKE_MODEL[1::2]))
        doc["model"].update({k[2:].replace("-", "_"): int(v) for k, v in flags.items()}, vocab_size=2048)
        doc["train"].update(device="cpu", dtype="float32", compile=False, seq_len=64, batch_size=2)
    path.write_text(tomli_w.dumps({"model": doc["model"], "train": doc["train"]}))


if __name__ == "__main__":
    sys.exit(main())
