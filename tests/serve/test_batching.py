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


def _events_by_step(parts, prompts, params, interval_ms):
    """Run ``prompts`` together at ``stream_interval_ms=interval_ms``; each sequence's events as (engine step
    at which it was emitted, token id, text, piece, finish reason): steps counted by ``on_step`` calls."""
    info, decoder, tok = parts
    steps = [0]
    sched = BatchScheduler(
        decoder,
        batch_wait_ms=20,
        on_step=lambda idle: steps.__setitem__(0, steps[0] + 1),
        stream_interval_ms=interval_ms,
    )
    out = [[] for _ in prompts]
    done = [threading.Event() for _ in prompts]

    def emitter(i):
        def emit(ev):
            out[i].append((steps[0], ev.token_id, ev.text, ev.piece, ev.finish_reason))
            if ev.finish_reason:
                done[i].set()

        return emit

    sched.start()
    try:
        sched.submit([Sequence(p, params, tok, emitter(i), 2) for i, p in enumerate(prompts)])
        assert all(d.wait(30) for d in done)
    finally:
        sched.shutdown()
    return out


def test_tokens_wait_for_the_stream_interval_and_come_whole(parts):
    """stream_interval_ms: a sequence's first token is emitted at once, the ones after it together (with a
    minute, at its end), and the events, text and pieces included, are those of an emission per step."""
    params = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
    each = _events_by_step(parts, PROMPTS[:2], params, 0.0)
    held = _events_by_step(parts, PROMPTS[:2], params, 60_000.0)
    for e, h in zip(each, held):
        assert [x[1:] for x in h] == [x[1:] for x in e]  # the same tokens, text and pieces, in order
        assert len(h) == 13 and "".join(x[2] for x in h)  # 12 tokens and the end; some text
        assert len({x[0] for x in e[:12]}) == 12  # at 0: one token per step
        assert h[0][0] < h[1][0] and len({x[0] for x in h[1:]}) == 1  # the first at once, the rest with the end


def test_a_sequence_with_stop_strings_emits_each_token_at_once(parts):
    """A stop string must end a sequence at the token that completes it, so a request with stop strings
    is not held by stream_interval_ms: one token per step, and it stops where it stops at interval 0."""
    free = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True)
    pieces = [x[3] for x in _events_by_step(parts, PROMPTS[:1], free, 0.0)[0] if x[3]]
    stop = pieces[len(pieces) // 2]  # the text of a token in the middle of the answer
    params = SamplingParams(max_new_tokens=12, temperature=0, ignore_eos=True, stop=(stop,))
    each = _events_by_step(parts, PROMPTS[:1], params, 0.0)[0]
    held = _events_by_step(parts, PROMPTS[:1], params, 60_000.0)[0]
    assert [x[1:] for x in held] == [x[1:] for x in each] and held[-1][4] == "stop"
    assert len(held) < 13  # stopped early
    tokens = [x for x in held if x[1] is not None]
    assert len({x[0] for x in tokens}) == len(tokens)  # each token at its own step


def test_queue_depth_is_told_as_rows_arrive_and_leave(parts):
    """on_queue_depth hears the running count change as rows join and as each one finishes (told when it
    changes, not at every step)."""
    info, decoder, tok = parts
    told = []
    sched = BatchScheduler(decoder, batch_wait_ms=20, on_queue_depth=lambda w, r: told.append((w, r)))
    done = threading.Event()
    ends = []

    def emit(ev):
        if isinstance(ev, TokenOut) and ev.finish_reason:
            ends.append(ev)
            if len(ends) == 2:
                done.set()

    short = SamplingParams(max_new_tokens=3, temperature=0, ignore_eos=True)
    long = SamplingParams(max_new_tokens=9, temperature=0, ignore_eos=True)
    sched.start()
    try:
        sched.submit([Sequence(PROMPTS[0], short, tok, emit, 2), Sequence(PROMPTS[1], long, tok, emit, 2)])
        assert done.wait(30)
    finally:
        sched.shutdown()
    assert [r for _, r in told] == [2, 1, 0]
    assert all(w == 0 for w, _ in told)


def test_queue_depth_comes_back_when_an_arrival_is_cancelled_before_its_prefill(parts):
    """A sequence taken from the queue counts as running; cancelled before its prefill, it leaves at once, and
    on_queue_depth hears so without waiting for another step."""
    info, decoder, tok = parts
    told, done = [], threading.Event()
    sched = BatchScheduler(decoder, batch_wait_ms=20, on_queue_depth=lambda w, r: told.append((w, r)))
    seq = Sequence(PROMPTS[0], SamplingParams(max_new_tokens=5, temperature=0), tok, lambda ev: done.set(), 2)
    seq.cancel()
    sched.start()
    try:
        sched.submit([seq])
        assert done.wait(30)
        deadline = time.monotonic() + 5
        while told[-1:] != [(0, 0)] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert told == [(0, 1), (0, 0)]
    finally:
        sched.shutdown()
