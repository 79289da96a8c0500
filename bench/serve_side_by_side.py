"""One user and eight: prodip serve over HTTP, prodip's engine in-process, onnxruntime-genai on the same export,
and llama.cpp (node-llama-cpp) on the GGUF of the same weights, side by side in one process tree.

For each (variant, threads, streams) it runs the runners one after the other in every round (so load that drifts
over minutes hits them alike), greedy decoding of ``--tokens`` tokens after a ``--prompt-tokens`` token prompt
(the same ids for all; EOS ignored), and reports aggregate decode tokens/s (tokens after each stream's first, over
the time from the last stream's first token to the last token: prefill excluded), the median over rounds, and
per-round ratios prodip serve / each other runner (their medians). Runners:

* ``http``: ``prodip serve EXPORT_DIR --variant V --intra-op-threads T`` (a child process, started once per
  variant and thread count), ``streams`` concurrent ``POST /v1/generate`` with ``stream: true``;
* ``engine``: serve's BatchScheduler and OnnxDecoder in this process (``bench/serve.py``'s engine_decode_rate);
* ``genai``: onnxruntime-genai's Generator on the same export (the variant's ``genai_overlay`` from manifest.json:
  its shared-buffer graph), ``batch_size`` = streams;
* ``llama``: ``node node/llamacpp_decode.mjs`` on the GGUF (int4 -> gguf-q4_k_m, int8 -> gguf-q8_0, fp32 ->
  gguf-f16), one context of ``streams`` sequences.

    python bench/serve_side_by_side.py --export-dir /tmp/x/export --gguf-dir /tmp/x/gguf/gguf \\
        --variants int4,int8 --threads 1,2 --streams 1,8 --rounds 5 --out bench/results/serve_side_by_side_DATE
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

GGUF = {"int4": "model-q4_k_m.gguf", "int8": "model-q8_0.gguf", "fp32": "model-f16.gguf"}


def cpu_line() -> str:
    """``lscpu`` model name, CPU count and the AVX-512 / VNNI flags (what MLAS and llama.cpp pick kernels by)."""
    flags = set()
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = sorted(f for f in flags if f.startswith("avx512") or "vnni" in f or f in ("avx2", "fma"))
    return f"{model}; {os.cpu_count()} CPUs; {' '.join(simd)}"


class Server:
    """``prodip serve`` as a child process on a free port (started in __init__, stopped by close)."""

    def __init__(self, export_dir: Path, variant: str, threads: int, port: int) -> None:
        self.port = port
        cmd = [sys.executable, "-m", "prodip", "serve", str(export_dir), "--variant", variant]
        cmd += ["--intra-op-threads", str(threads), "--port", str(port), "--log-level", "warning"]
        cmd += ["--allow-unverified", "--max-batch-size", "32"]
        self.proc = subprocess.Popen(cmd, cwd=ROOT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"prodip serve exited with {self.proc.returncode}")
            time.sleep(0.2)
        raise TimeoutError("prodip serve not ready after 300 s")

    def _one(self, prompt: list[int], tokens: int, out: list) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        body = {"prompt": prompt, "max_new_tokens": tokens, "temperature": 0, "stream": True, "ignore_eos": True}
        conn.request("POST", "/v1/generate", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        stamps = []
        for line in resp:
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                if event.get("token_id") is not None:
                    stamps.append(time.perf_counter())
        out.append(stamps)

    def rate(self, prompt: list[int], tokens: int, streams: int) -> float:
        out: list = []
        threads = [threading.Thread(target=self._one, args=(prompt, tokens, out)) for _ in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return _aggregate(out)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _aggregate(stamps: list[list[float]]) -> float:
    """Decode tokens/s of streams given each one's token arrival times (seconds)."""
    first, last = max(s[0] for s in stamps), max(s[-1] for s in stamps)
    return sum(len(s) - 1 for s in stamps) / (last - first)


def engine_rate(export_dir: Path, variant: str, prompt: list[int], tokens: int, streams: int, threads: int) -> float:
    """bench/serve.py's engine_decode_rate (serve's scheduler and decoder in this process)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "bench" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.engine_decode_rate(export_dir, variant, prompt, tokens, streams, threads)


def genai_rate(model, prompt: list[int], tokens: int, streams: int) -> float:
    """onnxruntime-genai greedy decode, ``streams`` rows in one batch, aggregate tokens/s (prefill excluded)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    total = len(prompt) + tokens
    params.set_search_options(do_sample=False, max_length=total, min_length=total, batch_size=streams)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([prompt] * streams, np.int32))
    gen.generate_next_token()
    t0, n = time.perf_counter(), 0
    while not gen.is_done():
        gen.generate_next_token()
        n += 1
    return streams * n / (time.perf_counter() - t0)


def load_genai(export_dir: Path, variant: str, threads: int):
    import onnxruntime_genai as og

    from prodip.base.manifest import read_manifest

    overlay = json.loads(json.dumps(read_manifest(export_dir)["variants"][variant]["genai_overlay"]))
    overlay["model"]["decoder"]["session_options"] = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config = og.Config(str(export_dir))
    config.overlay(json.dumps(overlay))
    return og.Model(config)


def llama_rate(gguf: Path, prompt: list[int], tokens: int, streams: int, threads: int) -> float:
    cmd = ["node", str(ROOT / "node" / "llamacpp_decode.mjs"), str(gguf), str(streams), str(threads), str(tokens)]
    out = subprocess.run([*cmd, json.dumps(prompt), "1"], check=True, capture_output=True, text=True, timeout=900)
    return json.loads(out.stdout.strip().splitlines()[-1])["rate"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export-dir", required=True, help="export dir (bench/serve.py builds one of the issue's size)")
    p.add_argument("--gguf-dir", help="folder with the GGUFs of the same weights (prodip export --variants gguf-...)")
    p.add_argument("--variants", default="int4,int8")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--runners", default="http,engine,genai,llama")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--note", default="", help="conditions to record (e.g. 'machine shared with other jobs')")
    p.add_argument("--out", help="path prefix: the results are written to it with .json and .md added")
    args = p.parse_args(argv)
    export_dir = Path(args.export_dir)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 300, args.prompt_tokens)]
    runners = args.runners.split(",")
    rows = []
    print(f"CPU: {cpu_line()}; load average {os.getloadavg()[0]:.1f} at start", flush=True)
    for variant in args.variants.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            server = Server(export_dir, variant, threads, args.port) if "http" in runners else None
            genai = load_genai(export_dir, variant, threads) if "genai" in runners else None
            gguf = Path(args.gguf_dir) / GGUF[variant] if args.gguf_dir and variant in GGUF else None
            try:
                for streams in (int(s) for s in args.streams.split(",")):

                    def measure(
                        r: str,
                        streams: int = streams,
                        threads: int = threads,
                        variant: str = variant,
                        server=server,
                        genai=genai,
                        gguf=gguf,
                    ) -> float:
                        if r == "http":
                            return server.rate(prompt, args.tokens, streams)
                        if r == "engine":
                            return engine_rate(export_dir, variant, prompt, args.tokens, streams, threads)
                        if r == "genai":
                            return genai_rate(genai, prompt, args.tokens, streams)
                        return llama_rate(gguf, prompt, args.tokens, streams, threads)

                    use = [r for r in runners if r != "llama" or (gguf is not None and gguf.is_file())]
                    for r in use:  # warm-up
                        measure(r)
                    runs = {r: [] for r in use}
                    for _ in range(args.rounds):
                        for r in use:
                            runs[r].append(measure(r))
                    row = {
                        "variant": variant,
                        "threads": threads,
                        "streams": streams,
                        "load_avg": os.getloadavg()[0],
                        "runs": runs,
                        "median": {r: statistics.median(v) for r, v in runs.items()},
                    }
                    if "http" in runs:
                        row["http_over"] = {
                            r: statistics.median(h / o for h, o in zip(runs["http"], v))
                            for r, v in runs.items()
                            if r != "http"
                        }
                    rows.append(row)
                    print(_line(row), flush=True)
            finally:
                if server is not None:
                    server.close()
    result = {
        "cpu": cpu_line(),
        "note": args.note,
        "tokens": args.tokens,
        "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds,
        "versions": _versions(),
        "rows": rows,
    }
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
        Path(args.out + ".md").write_text(render(result))
    return 0


def _versions() -> dict[str, str]:
    import onnxruntime
    import onnxruntime_genai

    node = json.loads((ROOT / "node" / "node_modules" / "node-llama-cpp" / "package.json").read_text())["version"]
    return {
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime-genai": onnxruntime_genai.__version__,
        "node-llama-cpp": node,
    }


def _line(row: dict) -> str:
    med = " ".join(f"{r} {v:.1f}" for r, v in row["median"].items())
    ratio = " ".join(f"http/{r} {v:.2f}x" for r, v in row.get("http_over", {}).items())
    return f"{row['variant']} {row['threads']} thr {row['streams']} streams: {med} tok/s; {ratio}"


def render(result: dict) -> str:
    names = {
        "http": "prodip serve (HTTP)",
        "engine": "prodip engine",
        "genai": "onnxruntime-genai",
        "llama": "llama.cpp",
    }
    runners = list(dict.fromkeys(r for row in result["rows"] for r in row["median"]))
    out = [
        "# Side by side: prodip serve, its engine, onnxruntime-genai, llama.cpp",
        "",
        f"CPU: {result['cpu']}. {result['note']}",
        f"Greedy, {result['prompt_tokens']}-token prompt, {result['tokens']} tokens per stream; aggregate decode "
        f"tokens/s (prefill excluded), median of {result['rounds']} rounds, runners alternated in every round; ratios "
        f"are medians of per-round ratios. Versions: {result['versions']}. Written by bench/serve_side_by_side.py.",
        "",
        "| variant | threads | streams | "
        + " | ".join(names[r] for r in runners)
        + " | "
        + " | ".join(f"HTTP / {names[r]}" for r in runners if r != "http")
        + " | load |",
        "|---" * (4 + 2 * len(runners) - ("http" in runners)) + "|",
    ]
    for row in result["rows"]:
        cells = [f"{row['median'][r]:.1f}" if r in row["median"] else "–" for r in runners]
        ratios = [f"{row.get('http_over', {}).get(r, float('nan')):.2f}x" for r in runners if r != "http"]
        out.append(
            f"| {row['variant']} | {row['threads']} | {row['streams']} | "
            + " | ".join(cells + ratios)
            + f" | {row['load_avg']:.1f} |"
        )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())
