"""Wall time of a full conformance run at 1 thread vs 2 threads (torch + ONNX Runtime), same run.

Prints seconds per setting and the ratio to the 1-thread baseline; nothing is written to the export.

    python bench/conformance_threads.py runs/demo/export --shards-dir runs/demo/shards [--checkpoint CKPT]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    from prodip.conformance import ConformanceConfig, evaluate

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("export_dir")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--shards-dir", required=True, help="the run's shards (held-out text for bits/char)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts; the first is the baseline")
    args = p.parse_args()
    results = []
    for n in [int(x) for x in args.threads.split(",")]:
        cfg = ConformanceConfig(
            export_dir=args.export_dir,
            checkpoint=args.checkpoint,
            shards_dir=args.shards_dir,
            threads=n,
            write_manifest=False,
        )
        t0, c0 = time.perf_counter(), time.process_time()
        report = evaluate(cfg)
        results.append((n, time.perf_counter() - t0, time.process_time() - c0, report["passed"]))
    base = results[0][1]
    print(f"{'threads':>7} {'wall_s':>8} {'cpu_s':>8} {'vs first':>9} passed")
    for n, wall, cpu, passed in results:
        print(f"{n:>7} {wall:8.1f} {cpu:8.1f} {wall / base:8.2f}x {passed}")


if __name__ == "__main__":
    main()
