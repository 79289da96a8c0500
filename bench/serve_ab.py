"""A/B of decode speed on a noisy machine: each arm in its own long-lived process, one round each in turn.

On a VM whose speed drifts by 10-30 % within minutes (bench/results/serve_engine_2026-12-01.md), only ratios of
runs made side by side mean anything. Every arm here is a process started once (its model loaded once) that decodes
on request; the driver asks the arms in turn, round after round (the order reversed every other round), and prints
each arm's median tokens/s and the quartiles of its per-round ratio to the last arm. An arm may run the code of
another git revision (``@REV``: checked out into a temporary worktree and imported from there, its server too), so a
change is measured against its parent in the same minutes.

Arms, ``NAME=KIND[@REV][,SERVE FLAGS]``:

* ``http``: ``prodip serve`` (a child of the arm's process; flags after the comma go to it, e.g.
  ``i0=http,--stream-interval-ms,0``), one streamed ``POST /v1/generate``; the client in the arm's process reads
  the stream line by line as bench/serve_side_by_side.py's does;
* ``engine``: serve's BatchScheduler and OnnxDecoder in the arm's process;
* ``genai``: onnxruntime-genai's Generator on the same export (its ``@REV`` is ignored).

Greedy, ``--streams`` streams (default 1) of ``--tokens`` tokens after a 16-token prompt, aggregate tokens/s of the
decode (prefill excluded). The model is
bench/serve_side_by_side.py's (built into its work dir when missing).

    python bench/serve_ab.py --variant int4 --threads 2 --rounds 16 before=http@HEAD~1 after=http genai=genai
    python bench/serve_ab.py --variant int8 i0=http,--stream-interval-ms,0 i50=http engine=engine
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

#: pyproject.toml's package-dir: the top-level folders installed as subpackages of prodip
SUBPACKAGES = ("tokenizer", "train", "export", "conformance", "serve")
PROMPT = list(range(5, 21))


def package_root(rev: str, work: Path) -> Path:
    """A folder whose ``prodip`` package is the code of git revision ``rev`` (a detached worktree under ``work``,
    its top-level stage folders linked in as prodip's subpackages, as pyproject.toml's package-dir maps them)."""
    tree = work / f"tree-{len(list(work.iterdir()))}"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
    root = tree / "_pkgroot"
    shutil.copytree(tree / "prodip", root / "prodip")
    for name in SUBPACKAGES:
        (root / "prodip" / name).symlink_to(tree / name)
    return root


def worker(kind: str, variant: str, threads: int, tokens: int, streams: int, serve_args: list[str]) -> None:
    """An arm's process: load once, then print one rate (tokens/s) per line read from stdin. An arm of another
    revision has its package root first on PYTHONPATH: prodip is imported from there before
    bench/serve_side_by_side.py puts this checkout on sys.path, and its server runs there."""
    importlib.import_module("prodip.serve.batching")  # first: from PYTHONPATH's package root, if any (above)
    importlib.import_module("prodip.serve.engine")
    import serve_side_by_side as sbs

    export_dir = sbs.build_models(Path("/tmp/prodip_side_by_side"))
    if kind == "http":
        popen = subprocess.Popen
        cwd = os.environ.get("PYTHONPATH") or str(ROOT)  # `python -m prodip` imports prodip from its cwd first

        def start(cmd: list[str], **kw: object) -> subprocess.Popen[bytes]:
            return popen([*cmd, *serve_args], **{**kw, "cwd": cwd})  # type: ignore[arg-type]

        sbs.subprocess.Popen = start  # type: ignore[attr-defined]
        server = sbs.Server(export_dir, variant, threads, 20000 + os.getpid() % 20000)

        def rate() -> float:
            return server.rate(PROMPT, tokens, streams)[0]
    elif kind == "engine":
        engine = sbs.Engine(export_dir, variant, threads)

        def rate() -> float:
            return engine.rate(PROMPT, tokens, streams)[0]
    else:
        model = sbs.load_genai(export_dir, variant, threads)

        def rate() -> float:
            return sbs.genai_rate(model, PROMPT, tokens, streams)[0]

    try:
        rate()  # warm up
        print("ready", flush=True)
        for _ in sys.stdin:
            print(rate(), flush=True)
    finally:
        if kind == "http":
            server.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("arms", nargs="+", help="NAME=KIND[@REV][,SERVE FLAGS]; ratios are to the last arm")
    p.add_argument("--variant", default="int4")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--streams", type=int, default=1, help="concurrent streams (aggregate tokens/s)")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        kind, *serve_args = args.arms[0].split(",")
        worker(kind, args.variant, args.threads, args.tokens, args.streams, serve_args)
        return 0
    work = Path(tempfile.mkdtemp(prefix="prodip_ab_"))
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for spec in args.arms:
            name, _, rest = spec.partition("=")
            kind_rev, *serve_args = rest.split(",")
            kind, _, rev = kind_rev.partition("@")
            if kind not in ("http", "engine", "genai") or not name:
                p.error(f"{spec!r}: want NAME=http|engine|genai[@REV][,SERVE FLAGS]")
            env = dict(os.environ)
            if rev and kind != "genai":
                env["PYTHONPATH"] = str(package_root(rev, work))
            cmd = [sys.executable, __file__, "--worker", "1", ",".join([kind, *serve_args])]
            cmd += ["--variant", args.variant, "--threads", str(args.threads), "--tokens", str(args.tokens)]
            cmd += ["--streams", str(args.streams)]
            procs[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            assert procs[name].stdout is not None
            if procs[name].stdout.readline().strip() != "ready":
                raise SystemExit(f"arm {name!r} did not start")
        rates: dict[str, list[float]] = {name: [] for name in procs}
        order = list(procs)
        for r in range(args.rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                proc = procs[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write("go\n")
                proc.stdin.flush()
                rates[name].append(float(proc.stdout.readline()))
        base = order[-1]
        print(
            f"{args.variant}, {args.threads} threads, {args.streams} stream(s) of {args.tokens} tokens, "
            f"{args.rounds} rounds; ratios to {base}"
        )
        for name, values in rates.items():
            ratios = sorted(a / b for a, b in zip(values, rates[base]))
            q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
            print(
                f"  {name:12s} {statistics.median(values):7.1f} tok/s  ratio median {statistics.median(ratios):.3f} "
                f"(quartiles {q[0]:.3f}-{q[2]:.3f})"
            )
    finally:
        for proc in procs.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(60)
        for tree in work.glob("tree-*"):
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
