"""The batch scheduler: batched rows decode exactly as alone; late arrivals merge; cancel stops a row."""

from __future__ import annotations

import threading
import time

import pytest

from prodip.serve.batching import BatchScheduler, SamplingParams, Sequence, TokenOut
from prodip.serve.engine import OnnxDecoder, load_export, load_tokenizer


@pytest.fixture(scope="module")
def parts(tiny_export):
    info = load_export(tiny_export[0], "fp32")
    return info, OnnxDecoder(info.onnx_path, info.config), load_tokenizer(info)


def run(parts, prompts, params, *, stagger_s=0.0, max_batch_size=32, cancel_after=None):
    """Submit sequences (optionally one by one with a delay) and collect their token ids."""
    info, decoder, tok = parts
    sched = BatchScheduler(decoder, max_batch_size=max_batch_size, batch_wait_ms=20)
    done = [threading.Event() for _ in prompts]
    out = [[] for _ in prompts]
    finish = [None] * len(prompts)
    seqs = []

    def emitter(i):
        def emit(ev):
            if isinstance(ev, TokenOut):
                if ev.token_id is not None:
                    out[i].append(ev.token_id)
                    if cancel_after is not None and len(out[i]) == cancel_after:
                        seqs[i].cancel()
                if ev.finish_reason:
                    finish[i] = ev.finish_reason
                    done[i].set()

        return emit

    seqs.extend(Sequence(p, params, tok, emitter(i), 2) for i, p in enumerate(prompts))
    sched.start()
    try:
        for s in seqs:
            sched.submit([s])
            time.sleep(stagger_s)
        for d in done:
            assert d.wait(30)
    finally:
        sched.shutdown()
    return out, finish


PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46], [1, 50], [1, 60, 61, 62], [1, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79]]


def test_batched_equals_alone_and_late_arrivals_merge(parts):
    params = SamplingParams(max_new_tokens=20, temperature=0, ignore_eos=True)
    alone = [run(parts, [p], params)[0][0] for p in PROMPTS]
    together, _ = run(parts, PROMPTS, params)  # prefilled together (one call per prompt length), decoded together
    staggered, _ = run(parts, PROMPTS, params, stagger_s=0.01)  # continuous batching: merged mid-decode
    capped, _ = run(parts, PROMPTS, params, max_batch_size=2)  # queue waits for free rows
    assert together == alone and staggered == alone and capped == alone


def test_seeded_sampling_independent_of_batch(parts):
    params = SamplingParams(max_new_tokens=15, temperature=1.0, seed=42, ignore_eos=True)
    alone = [run(parts, [p], params)[0][0] for p in PROMPTS[:2]]
    together, _ = run(parts, PROMPTS[:2], params)
    assert together == alone


def test_cancel_stops_within_one_step(parts):
    params = SamplingParams(max_new_tokens=100, temperature=0, ignore_eos=True)
    out, finish = run(parts, PROMPTS[:2], params, cancel_after=3)
    assert finish == ["cancelled", "cancelled"]
    assert all(len(o) <= 4 for o in out)  # cancelled after token 3; at most the step in flight


def test_spinning_changes_no_number(parts):
    """``spinning=False`` (serve's ``--intra-op-spinning false``) only changes how ONNX Runtime's threads
    wait: the same tokens as the default, at 2 threads."""
    info, _, tok = parts
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
    spin = OnnxDecoder(info.onnx_path, info.config, 2)
    still = OnnxDecoder(info.onnx_path, info.config, 2, spinning=False)
    assert run((info, still, tok), PROMPTS, params)[0] == run((info, spin, tok), PROMPTS, params)[0]
