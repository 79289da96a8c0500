"""Do sessions of the same graph in one process decode at the same speed? Several ONNX Runtime sessions of a
variant's shared-buffer graph, made one after the other in this process, each running the same lean decode loop
(everything bound before the loop: only the ids, the position and a mask made beforehand change per step), in turn
round after round (the order reversed every other round), with onnxruntime-genai's generator on the same export as
a last arm.

Why: bench/serve_ab.py compares arms that each hold one session for their whole life, so a speed that belongs to
the session (where its weights landed) rather than to the code would read as a code difference.
bench/results/serve_engine_2026-12-02.md found the first session of a process 6-13 % slower per run than the ones
made after it, at 1 thread, in one half hour, and within 1.5 % an hour later: run this beside an A/B to see whether
it applies.

Prints each session's median of its per-round mean run time (us) and the quartiles of its per-round ratio to the
first session, and genai's per-step time.

    python bench/session_order.py --variant int4 --threads 1 --sessions 4 --rounds 12
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
PROMPT = list(range(5, 21))


def lean_decode(decoder, tokens: int) -> float:  # noqa: ANN001 (an OnnxDecoder)
    """Mean seconds per ONNX Runtime run over ``tokens`` greedy decode steps on ``decoder``'s session."""
    import onnxruntime as ort

    sess, total, T = decoder.session, len(PROMPT) + tokens, len(PROMPT)
    cache_shape = (1, decoder.num_kv_heads, total, decoder.head_dim)
    caches = [
        ort.OrtValue.ortvalue_from_numpy(np.zeros(cache_shape, np.float32)) for _ in range(2 * decoder.num_layers)
    ]
    io = sess.io_binding()
    io.bind_cpu_input("input_ids", np.array([PROMPT], np.int64))
    io.bind_cpu_input("attention_mask", np.ones((1, T), np.int64))
    io.bind_cpu_input("position_ids", np.arange(T, dtype=np.int64)[None])
    for name, value in zip(decoder.past_names, caches):
        io.bind_ortvalue_input(name, value)
    for name, value in zip(decoder.present_names, caches):
        io.bind_ortvalue_output(name, value)
    first = np.zeros((1, T, decoder.vocab_size), np.float32)
    io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(first))
    sess.run_with_iobinding(io)
    token, n = int(first[0, -1].argmax()), T
    ids, pos = np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64)
    logits = np.zeros((1, 1, decoder.vocab_size), np.float32)
    io.bind_ortvalue_input("input_ids", ort.OrtValue.ortvalue_from_numpy(ids))
    io.bind_ortvalue_input("position_ids", ort.OrtValue.ortvalue_from_numpy(pos))
    io.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits))
    ones = np.ones((1, total), np.int64)
    masks = [ort.OrtValue.ortvalue_from_numpy(ones[:, : m + 1]) for m in range(total)]
    runs = []
    for _ in range(tokens - 1):
        ids[0, 0], pos[0, 0] = token, n
        io.bind_ortvalue_input("attention_mask", masks[n])
        start = time.perf_counter()
        sess.run_with_iobinding(io)
        runs.append(time.perf_counter() - start)
        token, n = int(logits[0, 0].argmax()), n + 1
    return statistics.mean(runs[2:])


def genai_step(model, tokens: int) -> float:  # noqa: ANN001 (an og.Model)
    """Mean seconds per onnxruntime-genai decode step (``generate_next_token``) over ``tokens`` steps."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    total = len(PROMPT) + tokens
    params.set_search_options(do_sample=False, max_length=total, min_length=total, batch_size=1)
    gen = og.Generator(model, params)
    gen.append_tokens(np.array([PROMPT], np.int32))
    gen.generate_next_token()
    steps = []
    while not gen.is_done():
        start = time.perf_counter()
        gen.generate_next_token()
        steps.append(time.perf_counter() - start)
    return statistics.mean(steps[2:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", default="int4")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args(argv)
    import serve_side_by_side as sbs

    from prodip.serve.engine import load_export, open_decoder

    export_dir = sbs.build_models(Path("/tmp/prodip_side_by_side"))
    info = load_export(export_dir, args.variant, allow_unverified=True, verify_hashes=False)
    decoders = [open_decoder(info, args.threads) for _ in range(args.sessions)]
    model = sbs.load_genai(export_dir, args.variant, args.threads)
    times: list[list[float]] = [[] for _ in range(args.sessions + 1)]
    for r in range(args.rounds):
        order = list(range(args.sessions + 1))
        for i in order if r % 2 else order[::-1]:
            times[i].append(
                genai_step(model, args.tokens) if i == args.sessions else lean_decode(decoders[i], args.tokens)
            )
    print(f"{args.variant}, {args.threads} thread(s), {args.rounds} rounds of {args.tokens} tokens")
    for i, t in enumerate(times):
        ratios = [a / b for a, b in zip(t, times[0])]
        q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
        name = "genai step" if i == args.sessions else f"session {i} run"
        print(f"  {name:14s} {statistics.median(t) * 1e6:7.0f} us  / session 0: {q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
