"""One user and eight: prodip serve over HTTP, prodip's engine in-process, onnxruntime-genai on the same export,
and llama.cpp (node-llama-cpp) on the GGUF of the same weights, side by side in one process tree.

For each (variant, threads, streams) it runs the runners one after the other in every round (the order turned
round every other round, so load that drifts over minutes hits them alike), greedy decoding of ``--tokens`` tokens
after a ``--prompt-tokens`` token prompt (the same ids for all; EOS ignored), and reports aggregate decode tokens/s
(tokens after each stream's first, over the time from the last stream's first token to the last token: prefill
excluded), the median over rounds, per-round ratios prodip serve / each other runner (their medians), and CPU time
per generated token (ms; the process that decodes: the server for ``http``, this process for ``engine`` and
``genai``; a figure that load from other programs moves far less than tokens/s). Runners:

* ``http``: ``prodip serve EXPORT_DIR --variant V --intra-op-threads T`` (a child process, started once per
  variant and thread count), ``streams`` concurrent ``POST /v1/generate`` with ``stream: true``;
* ``engine``: serve's BatchScheduler and OnnxDecoder in this process (the decoder opened once per variant and
  thread count, as the server does; a new scheduler per run);
* ``genai``: onnxruntime-genai's Generator on the same export (the variant's ``genai_overlay`` from manifest.json:
  its shared-buffer graph), ``batch_size`` = streams;
* ``llama``: ``node node/llamacpp_decode.mjs`` on the GGUF (int4 -> gguf-q4_k_m, int8 -> gguf-q8_0, fp32 ->
  gguf-f16), one context of ``streams`` sequences.

The server's per-token cost (issue 29: under 5% of a step at one stream) is (HTTP time per token - engine time per
token) / engine time per step, per round: ``(engine / http - 1) / streams`` of the aggregate rates. The summary at the
end checks issue 29's bars: at one stream ``http`` >= 0.95x ``genai`` at each thread count and >= 1.0x ``llama`` at
llama.cpp's best thread count (prodip at its best too).

Without ``--export-dir`` it builds bench/serve.py's random ~109 M-parameter model with the ONNX variants and the
GGUFs of the same weights into ``--work-dir`` (kept there for the next run). The whole grid on a quiet 2-core
machine in about 8 minutes (3 rounds of 64 tokens):

    python bench/serve_side_by_side.py --quick --out bench/results/serve_side_by_side_DATE
    python bench/serve_side_by_side.py --export-dir EXPORT --gguf-dir EXPORT/gguf --variants int4 --rounds 5
"""

from __future__ import annotations

import argparse
import copy
import http.client
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import fields
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

GGUF = {"int4": "model-q4_k_m.gguf", "int8": "model-q8_0.gguf", "fp32": "model-f16.gguf"}
#: (tokens/s, CPU seconds per generated token or None where not measured)
Rate = tuple[float, Optional[float]]


def cpu_line() -> str:
    """``lscpu`` model name, CPU count and the AVX-512 / VNNI flags (what MLAS and llama.cpp pick kernels by)."""
    flags: set[str] = set()
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


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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

    def _one(self, prompt: list[int], tokens: int, out: list[list[float]]) -> None:
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

    def rate(self, prompt: list[int], tokens: int, streams: int) -> Rate:
        out: list[list[float]] = []
        threads = [threading.Thread(target=self._one, args=(prompt, tokens, out)) for _ in range(streams)]
        cpu0 = process_cpu_s(self.proc.pid)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return _aggregate(out), (process_cpu_s(self.proc.pid) - cpu0) / sum(len(s) for s in out)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _aggregate(stamps: list[list[float]]) -> float:
    """Decode tokens/s of streams given each one's token arrival times (seconds)."""
    first, last = max(s[0] for s in stamps), max(s[-1] for s in stamps)
    return sum(len(s) - 1 for s in stamps) / (last - first)


class Engine:
    """serve's BatchScheduler and OnnxDecoder in this process, the decoder opened once (as ``prodip serve`` does)."""

    def __init__(self, export_dir: Path, variant: str, threads: int) -> None:
        from prodip.serve.engine import load_export, load_tokenizer, open_decoder

        info = load_export(export_dir, variant, allow_unverified=True, verify_hashes=False)
        self.decoder = open_decoder(info, threads)
        self.tokenizer = load_tokenizer(info)
        try:  # as `prodip serve` does by default (--huge-pages; a revision of serve_ab.py's arms may predate it)
            from prodip.serve.memory import use_huge_pages
        except ImportError:
            pass
        else:
            print(use_huge_pages(), file=sys.stderr)

    def rate(self, prompt: list[int], tokens: int, streams: int) -> Rate:
        from prodip.serve.batching import BatchScheduler, SamplingParams, Sequence, TokenOut
        from prodip.serve.config import ServeConfig

        # as `prodip serve` runs it: tokens emitted every stream_interval_ms, its default (the arms of serve_ab.py
        # may run an older revision, whose scheduler has no such argument)
        kw = {}
        if "stream_interval_ms" in inspect.signature(BatchScheduler).parameters:
            kw["stream_interval_ms"] = next(f.default for f in fields(ServeConfig) if f.name == "stream_interval_ms")
        sched = BatchScheduler(self.decoder, max_batch_size=32, batch_wait_ms=5, **kw)
        stamps: list[list[float]] = [[] for _ in range(streams)]
        left, done, lock = [streams], threading.Event(), threading.Lock()

        def emitter(i: int) -> Any:
            def emit(event: Any) -> None:
                if isinstance(event, TokenOut):
                    if event.token_id is not None:
                        stamps[i].append(time.perf_counter())
                    if event.finish_reason:
                        with lock:
                            left[0] -= 1
                            if left[0] == 0:
                                done.set()

            return emit

        params = SamplingParams(max_new_tokens=tokens, temperature=0, ignore_eos=True)
        seqs = [Sequence(prompt, params, self.tokenizer, emitter(i), 2) for i in range(streams)]
        sched.start()
        try:
            cpu0 = time.process_time()
            sched.submit(seqs)
            if not done.wait(600):
                raise TimeoutError("the engine did not finish in 600 s")
            cpu = time.process_time() - cpu0
        finally:
            sched.shutdown()
        return _aggregate(stamps), cpu / sum(len(s) for s in stamps)


def genai_rate(model: Any, prompt: list[int], tokens: int, streams: int) -> Rate:
    """onnxruntime-genai greedy decode, ``streams`` rows in one batch, aggregate tokens/s (prefill excluded)."""
    import onnxruntime_genai as og

    cpu0 = time.process_time()
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
    rate = streams * n / (time.perf_counter() - t0)
    return rate, (time.process_time() - cpu0) / (streams * (n + 1))


def load_genai(export_dir: Path, variant: str, threads: int) -> Any:
    import onnxruntime_genai as og

    from prodip.base.manifest import load_manifest

    overlay = copy.deepcopy(load_manifest(export_dir).variants[variant].genai_overlay)
    if overlay is None:
        raise SystemExit(f"{export_dir}: variant {variant!r} has no genai_overlay (not an ONNX variant)")
    overlay["model"]["decoder"]["session_options"] = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config = og.Config(str(export_dir))
    config.overlay(json.dumps(overlay))
    return og.Model(config)


def llama_rate(gguf: Path, prompt: list[int], tokens: int, streams: int, threads: int) -> Rate:
    """node-llama-cpp's decode rate (its CPU time is not measured: a new process loads the model each run)."""
    cmd = ["node", str(ROOT / "node" / "llamacpp_decode.mjs"), str(gguf), str(streams), str(threads), str(tokens)]
    out = subprocess.run([*cmd, json.dumps(prompt), "1"], check=True, capture_output=True, text=True, timeout=900)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rate"]), None


def build_models(work_dir: Path) -> Path:
    """bench/serve.py's random ~109 M-parameter model exported with fp32/int8/int4 ONNX and the GGUFs of the same
    weights into ``work_dir/export`` (verdict set to passed: a benchmark, not a conformance run); an existing one is
    reused."""
    export_dir = work_dir / "export"
    if (export_dir / "manifest.json").is_file():
        return export_dir
    from prodip import export
    from tests.fixtures import build_tiny_export

    out = build_tiny_export(
        work_dir,
        vocab_size=16384,
        hidden_size=1024,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        variants=["safetensors", "fp32", "int8", "int4", "gguf-f16", "gguf-q8_0", "gguf-q4_k_m"],
    )
    onnx_variants = export.load_manifest(out).formats("onnx")
    verdict = {"passed": True, "variants": dict.fromkeys(onnx_variants, True), "report": "bench (not checked)"}
    export.set_conformance(out, {**verdict, "report_sha256": "0" * 64})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--export-dir", help="export dir (default: build bench/serve.py's model into --work-dir)")
    p.add_argument("--gguf-dir", help="folder with the GGUFs of the same weights (default: EXPORT_DIR/gguf)")
    p.add_argument("--work-dir", default="/tmp/prodip_side_by_side", help="where the default model is built")
    p.add_argument("--variants", default="int4,int8,fp32")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--streams", default="1,8")
    p.add_argument("--runners", default="http,engine,genai,llama")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="3 rounds of 64 tokens (the whole grid in ~8 min)")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--note", default="", help="conditions to record (e.g. 'machine shared with other jobs')")
    p.add_argument("--out", help="path prefix: the results are written to it with .json and .md added")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.tokens = 3, 64
    export_dir = Path(args.export_dir) if args.export_dir else build_models(Path(args.work_dir))
    gguf_dir = Path(args.gguf_dir) if args.gguf_dir else export_dir / "gguf"
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 300, args.prompt_tokens)]
    runners = args.runners.split(",")
    rows = []
    print(f"CPU: {cpu_line()}; load average {os.getloadavg()[0]:.1f} at start", flush=True)
    for variant in args.variants.split(","):
        for threads in (int(t) for t in args.threads.split(",")):
            server = Server(export_dir, variant, threads, args.port) if "http" in runners else None
            try:
                engine = Engine(export_dir, variant, threads) if "engine" in runners else None
                genai = load_genai(export_dir, variant, threads) if "genai" in runners else None
                gguf = gguf_dir / GGUF[variant] if variant in GGUF else None
                use = [r for r in runners if r != "llama" or (gguf is not None and gguf.is_file())]

                def measure(r: str, streams: int, threads: int = threads, **run: Any) -> Rate:
                    if r == "http":
                        return run["server"].rate(prompt, args.tokens, streams)  # type: ignore[no-any-return]
                    if r == "engine":
                        return run["engine"].rate(prompt, args.tokens, streams)  # type: ignore[no-any-return]
                    if r == "genai":
                        return genai_rate(run["genai"], prompt, args.tokens, streams)
                    return llama_rate(run["gguf"], prompt, args.tokens, streams, threads)

                parts = {"server": server, "engine": engine, "genai": genai, "gguf": gguf}
                for streams in (int(s) for s in args.streams.split(",")):
                    row = _row(use, lambda r, s=streams, kw=parts: measure(r, s, **kw), args.rounds)
                    row.update(variant=variant, threads=threads, streams=streams, load_avg=os.getloadavg()[0])
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
    print(summary(rows), flush=True)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(result, indent=1) + "\n")
        Path(args.out + ".md").write_text(render(result))
    return 0


def _row(use: list[str], measure: Any, rounds: int) -> dict[str, Any]:
    """Warm-up, then ``rounds`` rounds of every runner (order reversed every other round); medians and ratios."""
    for r in use:
        measure(r)
    runs: dict[str, list[float]] = {r: [] for r in use}
    cpu: dict[str, list[float]] = {r: [] for r in use}
    for i in range(rounds):
        for r in use if i % 2 == 0 else use[::-1]:
            rate, cpu_s = measure(r)
            runs[r].append(rate)
            if cpu_s is not None:
                cpu[r].append(cpu_s)
    row: dict[str, Any] = {
        "runs": runs,
        "median": {r: statistics.median(v) for r, v in runs.items()},
        "cpu_ms_per_token": {r: 1000 * statistics.median(v) for r, v in cpu.items() if v},
    }
    if "http" in runs:
        row["http_over"] = {
            r: statistics.median(h / o for h, o in zip(runs["http"], v)) for r, v in runs.items() if r != "http"
        }
    return row


def server_cost(row: dict[str, Any]) -> Optional[float]:
    """The server's per-token cost as a share of an engine step: median over rounds of (engine / http - 1) / streams."""
    if "http" not in row["runs"] or "engine" not in row["runs"]:
        return None
    pairs = zip(row["runs"]["http"], row["runs"]["engine"])
    return statistics.median((e / h - 1) / row["streams"] for h, e in pairs)


def summary(rows: list[dict[str, Any]]) -> str:
    """Issue 29's bars, one line each: at one stream http >= 0.95x genai at each thread count, best http >= 1.0x
    llama.cpp at its best thread count, the server's per-token cost < 5% of a step; 8 streams for the record."""
    out = ["", "issue 29 bars (same-run ratios; medians of per-round ratios):"]
    for row in rows:
        cost = server_cost(row)
        over = row.get("http_over", {})
        bits = [f"{row['variant']} {row['threads']} thr {row['streams']} streams:"]
        one = row["streams"] == 1  # the bars are for one stream; 8 streams are for the record
        if "genai" in over:
            ok = ("met" if over["genai"] >= 0.95 else "NOT met") if one else "no bar"
            bits.append(f"http/genai {over['genai']:.2f}x (>= 0.95: {ok})")
        if cost is not None:
            ok = ("met" if cost < 0.05 else "NOT met") if one else "no bar"
            bits.append(f"server cost {100 * cost:.1f}% of a step (< 5%: {ok})")
        out.append(" ".join(bits))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        for streams in dict.fromkeys(r["streams"] for r in rows):
            mine = [r for r in rows if r["variant"] == variant and r["streams"] == streams]
            best = {k: max((r["median"].get(k, 0.0) for r in mine), default=0.0) for k in ("http", "llama")}
            if best["http"] and best["llama"]:
                ok = "met" if best["http"] >= best["llama"] else "NOT met"
                out.append(
                    f"{variant} {streams} streams, each at its best thread count: http {best['http']:.1f} vs llama.cpp "
                    f"{best['llama']:.1f} tok/s = {best['http'] / best['llama']:.2f}x (>= 1.0: {ok})"
                )
    return "\n".join(out)


def _versions() -> dict[str, str]:
    import onnxruntime
    import onnxruntime_genai

    node = json.loads((ROOT / "node" / "node_modules" / "node-llama-cpp" / "package.json").read_text())["version"]
    return {
        "onnxruntime": onnxruntime.__version__,
        "onnxruntime-genai": onnxruntime_genai.__version__,
        "node-llama-cpp": node,
    }


def _line(row: dict[str, Any]) -> str:
    med = " ".join(f"{r} {v:.1f}" for r, v in row["median"].items())
    ratio = " ".join(f"http/{r} {v:.2f}x" for r, v in row.get("http_over", {}).items())
    cpu = " ".join(f"{r} {v:.2f}" for r, v in row["cpu_ms_per_token"].items())
    cost = server_cost(row)
    tail = f"; server cost {100 * cost:.1f}% of a step" if cost is not None else ""
    return (
        f"{row['variant']} {row['threads']} thr {row['streams']} streams: {med} tok/s; {ratio}; "
        f"CPU ms/token {cpu}{tail} (load {row['load_avg']:.1f})"
    )


def render(result: dict[str, Any]) -> str:
    names = {
        "http": "prodip serve (HTTP)",
        "engine": "prodip engine",
        "genai": "onnxruntime-genai",
        "llama": "llama.cpp",
    }
    runners = list(dict.fromkeys(r for row in result["rows"] for r in row["median"]))
    cpu_runners = list(dict.fromkeys(r for row in result["rows"] for r in row["cpu_ms_per_token"]))
    out = [
        "# Side by side: prodip serve, its engine, onnxruntime-genai, llama.cpp",
        "",
        f"CPU: {result['cpu']}. {result['note']}",
        f"Greedy, {result['prompt_tokens']}-token prompt, {result['tokens']} tokens per stream; aggregate decode "
        f"tokens/s (prefill excluded), median of {result['rounds']} rounds, runners alternated in every round; ratios "
        f"are medians of per-round ratios; CPU ms per generated token of the decoding process (median); server cost "
        f"= (HTTP time per token - engine time per token) / engine step. Versions: {result['versions']}. Written by "
        "bench/serve_side_by_side.py.",
        "",
        "| variant | threads | streams | "
        + " | ".join(names[r] for r in runners)
        + " | "
        + " | ".join(f"HTTP / {names[r]}" for r in runners if r != "http")
        + " | server cost | "
        + " | ".join(f"CPU ms/token {r}" for r in cpu_runners)
        + " | load |",
        "|---" * (5 + 2 * len(runners) - ("http" in runners) + len(cpu_runners)) + "|",
    ]
    for row in result["rows"]:
        cells = [f"{row['median'][r]:.1f}" if r in row["median"] else "–" for r in runners]
        ratios = [f"{row.get('http_over', {}).get(r, float('nan')):.2f}x" for r in runners if r != "http"]
        cost = server_cost(row)
        cpu = [f"{row['cpu_ms_per_token'][r]:.2f}" if r in row["cpu_ms_per_token"] else "–" for r in cpu_runners]
        out.append(
            f"| {row['variant']} | {row['threads']} | {row['streams']} | "
            + " | ".join([*cells, *ratios, f"{100 * cost:.1f}%" if cost is not None else "–", *cpu])
            + f" | {row['load_avg']:.1f} |"
        )
    return "\n".join(out) + "\n" + summary(result["rows"]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
