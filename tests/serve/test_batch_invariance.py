"""Issue 14 item 1 (case C1): a request's tokens and logprobs are identical whatever shares its batch,
for every served variant: alone, with 7 other requests of other lengths arriving at the same
moment, with requests joining mid-decode and leaving early, and as one of several choices of
which the others stop; greedy and seeded sampling. Both ways serve can hold the KV cache: the
contract graph (present = past ++ new) and the shared-buffer graph (written in place, caches that
grow and are padded to a common capacity when groups merge)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from prodip.base.variants import variant_names
from prodip.serve.batching import BatchScheduler, SamplingParams, Sequence, TokenOut
from prodip.serve.engine import OnnxDecoder, load_export, load_tokenizer

VARIANTS = variant_names(format="onnx", servable=True)  # every servable row, so a new one is tested
MINE = [1, 40, 41, 42, 43, 44, 45, 46, 47]
#: 7 other prompts, every one of another length than MINE (and than each other)
OTHERS = [[1, 50 + i] + [60 + j for j in range(n)] for i, n in enumerate((0, 2, 4, 9, 12, 15, 20))]
MODES = {
    "greedy": SamplingParams(max_new_tokens=24, temperature=0, logprobs=3, ignore_eos=True),
    "seeded": SamplingParams(max_new_tokens=24, temperature=1.0, seed=7, logprobs=3, ignore_eos=True),
}


@pytest.fixture(scope="module")
def all_variants(tmp_path_factory):
    from tests.serve.conftest import build_export

    return build_export(tmp_path_factory.mktemp("invariance"), variants=VARIANTS)[0]


@pytest.fixture(scope="module")
def decoders(all_variants):
    out = {}
    for variant in VARIANTS:
        info = load_export(all_variants, variant)
        assert info.shared_buffer_path is not None
        tok = load_tokenizer(info)
        out[variant, "contract"] = (OnnxDecoder(info.onnx_path, info.config, 2), tok)
        shared = OnnxDecoder(info.shared_buffer_path, info.config, 2, shared_buffer=True)
        shared.MIN_CAPACITY = 4  # caches grow while decoding; groups merge with unequal capacities
        out[variant, "shared"] = (shared, tok)
    return out


KV = ["contract", "shared"]


def run(parts, jobs, *, max_batch_size=32):
    """Run ``jobs`` = [(prompt, params, delay_s, stream_index)] through one scheduler; submit each
    after its delay (seconds from the start). Returns per job [(token, logprob, top), ...]."""
    decoder, tok = parts
    sched = BatchScheduler(decoder, max_batch_size=max_batch_size, batch_wait_ms=20)
    out = [[] for _ in jobs]
    done = [threading.Event() for _ in jobs]

    def emitter(i):
        def emit(ev):
            if isinstance(ev, TokenOut):
                if ev.token_id is not None:
                    out[i].append((ev.token_id, ev.logprob, ev.top))
                if ev.finish_reason:
                    done[i].set()

        return emit

    seqs = [Sequence(p, params, tok, emitter(i), 2, stream_index=k) for i, (p, params, _, k) in enumerate(jobs)]
    sched.start()
    try:
        t0 = time.monotonic()
        for (_, _, delay, _), seq in sorted(zip(jobs, seqs), key=lambda x: x[0][2]):
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            sched.submit([seq])
        for d in done:
            assert d.wait(60)
    finally:
        sched.shutdown()
    return out


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_same_answer_whatever_shares_the_batch(decoders, variant, mode, kv):
    parts, params = decoders[variant, kv], MODES[mode]
    alone = run(parts, [(MINE, params, 0.0, 0)])[0]
    assert len(alone) == params.max_new_tokens
    assert run(parts, [(MINE, params, 0.0, 0)])[0] == alone  # deterministic
    short = SamplingParams(max_new_tokens=3, temperature=0.8, seed=1, ignore_eos=True)
    crowd = [(MINE, params, 0.0, 0)] + [(p, short if i % 2 else params, 0.0, 0) for i, p in enumerate(OTHERS)]
    assert run(parts, crowd)[0] == alone, "7 others of other lengths, arriving together, some leaving early"
    joining = [(MINE, params, 0.0, 0)] + [(p, params, 0.01 * (i + 1), 0) for i, p in enumerate(OTHERS)]
    assert run(parts, joining)[0] == alone, "others joining mid-decode"
    same_len = [(MINE, params, 0.0, 0)] + [([1] + [90 + i] * (len(MINE) - 1), short, 0.0, 0) for i in range(7)]
    assert run(parts, same_len)[0] == alone, "7 others of the same length in its very batch, leaving after 3 tokens"
    capped = run(parts, [(p, params, 0.0, 0) for p in OTHERS] + [(MINE, params, 0.0, 0)], max_batch_size=3)
    assert capped[-1] == alone, "queued behind others"


@pytest.mark.parametrize("kv", KV)
@pytest.mark.parametrize("variant", VARIANTS)
def test_choices_leaving_do_not_change_the_others(decoders, variant, kv):
    """n choices of one request (stream_index 0..2, seeded): each choice alone equals it among the
    others, when the others stop early (leave the batch) or not."""
    parts = decoders[variant, kv]
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=3, logprobs=1, ignore_eos=True)
    early = SamplingParams(max_new_tokens=2, temperature=1.0, seed=3, logprobs=1, ignore_eos=True)
    alone = [run(parts, [(MINE, params, 0.0, k)])[0] for k in range(3)]
    assert len({tuple(t for t, _, _ in a) for a in alone}) > 1  # the choices differ from each other
    together = run(parts, [(MINE, params, 0.0, k) for k in range(3)])
    assert together == alone
    mixed = run(parts, [(MINE, early, 0.0, 0), (MINE, params, 0.0, 1), (MINE, early, 0.0, 2)])
    assert mixed[1] == alone[1]


@pytest.mark.parametrize("variant", VARIANTS)
def test_shared_buffer_decodes_what_the_contract_graph_decodes(decoders, variant):
    """The shared-buffer graph (cache written in place, grown from 4 slots) gives the contract graph's
    greedy tokens, and its logprobs within 1e-4 nats (the graphs differ in where q/k are rotated:
    tests/export/test_runtime_configs.py), for a crowd of prompts of different lengths."""
    params = SamplingParams(max_new_tokens=24, temperature=0, logprobs=3, ignore_eos=True)
    jobs = [(MINE, params, 0.0, 0)] + [(p, params, 0.005 * i, 0) for i, p in enumerate(OTHERS)]
    want = run(decoders[variant, "contract"], jobs)
    got = run(decoders[variant, "shared"], jobs)
    for w, g in zip(want, got):
        assert [t for t, _, _ in g] == [t for t, _, _ in w]
        assert max(abs(a[1] - b[1]) for a, b in zip(g, w)) < 1e-4


@pytest.mark.parametrize("rule", ["one", "odd"])
@pytest.mark.parametrize("kv", KV)
def test_twin_rows_keep_the_answer(decoders, kv, rule, monkeypatch):
    """Where a CPU's MatMulNBits kernels need it (OnnxDecoder.row_rule), a call runs with a twin of
    its last row, kept in the cache from step to step: the real rows' tokens and logprobs are those
    of the same request alone without twins, whatever shares the batch (groups merging and rows
    leaving drop or re-make the twin), and the twin was used."""
    decoder, tok = decoders["int4", kv]
    params = MODES["seeded"]
    monkeypatch.setattr(decoder, "row_rule", "none")
    plain = run((decoder, tok), [(MINE, params, 0.0, 0)])[0]
    monkeypatch.setattr(decoder, "row_rule", rule)
    calls = []
    real_run = decoder._run
    monkeypatch.setattr(decoder, "_run", lambda ids, *rest: calls.append(ids.shape) or real_run(ids, *rest))
    assert run((decoder, tok), [(MINE, params, 0.0, 0)])[0] == plain
    assert (2, 1) in calls  # a lone row decoded with its twin
    short = SamplingParams(max_new_tokens=3, temperature=0.8, seed=1, ignore_eos=True)
    same_len = [(MINE, params, 0.0, 0)] + [([1] + [90 + i] * (len(MINE) - 1), short, 0.0, 0) for i in range(2)]
    assert run((decoder, tok), same_len)[0] == plain, "3 rows of one length (odd), then alone"
    joining = [(MINE, params, 0.0, 0)] + [(p, params, 0.01 * (i + 1), 0) for i, p in enumerate(OTHERS)]
    assert run((decoder, tok), joining)[0] == plain, "others joining mid-decode"


@pytest.mark.parametrize("variant", VARIANTS)
def test_shared_buffer_decodes_every_length_in_one_call(decoders, variant, monkeypatch):
    """With the shared-buffer graph every running row decodes in one ONNX Runtime call whatever its
    length (its mask right-padded, its own position): requests arriving one by one, each prefilled
    on its own, decode together from the step after each joins, and each gets the tokens and
    logprobs it gets alone."""
    decoder, tok = decoders[variant, "shared"]
    params = SamplingParams(max_new_tokens=48, temperature=0, logprobs=2, ignore_eos=True)
    jobs = [(MINE, params, 0.0, 0)] + [(p, params, 0.003 * (i + 1), 0) for i, p in enumerate(OTHERS)]
    alone = [run((decoder, tok), [job])[0] for job in jobs]
    calls = []
    real_run = decoder._run
    monkeypatch.setattr(
        decoder, "_run", lambda ids, mask, *rest: calls.append(mask.copy()) or real_run(ids, mask, *rest)
    )
    assert run((decoder, tok), jobs) == alone
    lengths = [set(m.sum(axis=1).tolist()) for m in calls if not m.all()]  # rows' lengths in one call
    assert max(map(len, lengths), default=0) >= 3, "no decode call held rows of several lengths"


@pytest.mark.parametrize("variant", VARIANTS)
def test_cache_reserved_for_the_request_decodes_what_a_growing_one_does(decoders, variant, monkeypatch):
    """The scheduler reserves each shared-buffer cache for its rows' most tokens (prompt + max new
    tokens, as onnxruntime-genai allocates max_length): allocated once, at that capacity, and the
    tokens and logprobs are those of a cache grown from 4 slots on the way, alone and in a crowd."""
    decoder, tok = decoders[variant, "shared"]
    params = MODES["seeded"]
    capacities = []
    real = decoder._forward_in_place

    def spy(ids, mask, pos, past, reserve=0):
        logits, caches = real(ids, mask, pos, past, reserve)
        capacities.append(int(caches[0].shape()[2]))
        return logits, caches

    monkeypatch.setattr(decoder, "_forward_in_place", spy)
    reserved = run((decoder, tok), [(MINE, params, 0.0, 0)])[0]
    assert set(capacities) == {len(MINE) + params.max_new_tokens}, "one allocation of the request's maximum"
    crowd = [(MINE, params, 0.0, 0)] + [(p, params, 0.005 * i, 0) for i, p in enumerate(OTHERS)]
    reserved_crowd = run((decoder, tok), crowd)
    capacities.clear()
    monkeypatch.setattr(decoder, "_forward_in_place", lambda ids, mask, pos, past, reserve=0: spy(ids, mask, pos, past))
    grown = run((decoder, tok), [(MINE, params, 0.0, 0)])[0]
    assert len(set(capacities)) > 2, "the cache grew on the way"
    assert grown == reserved
    assert run((decoder, tok), crowd) == reserved_crowd
    # a request allowed more than MAX_RESERVE tokens starts there and doubles, never past its maximum
    monkeypatch.setattr(decoder, "_forward_in_place", spy)
    monkeypatch.setattr(decoder, "MAX_RESERVE", 12)
    capacities.clear()
    assert run((decoder, tok), [(MINE, params, 0.0, 0)])[0] == reserved
    assert sorted(set(capacities)) == [12, 24, len(MINE) + params.max_new_tokens]


@pytest.mark.parametrize("variant", VARIANTS)
def test_kept_decode_binding_computes_what_a_new_binding_does(decoders, variant):
    """Decode steps on the IO binding kept from step to step (input ids and positions written into bound
    buffers, the logits into one bound buffer) give bit for bit the logits of a binding made anew at every
    step; a step's logits are that buffer, overwritten by the next step (OnnxDecoder.forward says so)."""
    decoder, _ = decoders[variant, "shared"]
    T, steps = len(MINE), 6

    def decode(fresh):
        ids = np.array([MINE, MINE[::-1]], np.int64)
        logits, past = decoder.forward(
            ids, np.ones((2, T), np.int64), np.tile(np.arange(T), (2, 1)), decoder.empty_past(2), reserve=T + steps
        )
        out, buffers = [], []
        for step in range(steps):
            nxt = logits[:2, -1].argmax(-1)[:, None]
            if fresh:
                decoder._binding = None
            logits, past = decoder.forward(
                nxt, np.ones((2, T + step + 1), np.int64), np.full((2, 1), T + step), past, reserve=T + steps
            )
            out.append(logits[:2].copy())
            buffers.append(logits)
        return out, buffers

    kept, buffers = decode(fresh=False)
    new, _ = decode(fresh=True)
    assert all(np.array_equal(a, b) for a, b in zip(kept, new))
    assert len({b.__array_interface__["data"][0] for b in buffers}) == 1, "one logits buffer, bound once"
    assert not np.array_equal(buffers[0], kept[0]), "the next step overwrote it"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("graph", ["shared", "contract"])
def test_decode_steps_compute_what_forward_does(decoders, variant, graph, monkeypatch):
    """OnnxDecoder.decode (ids and positions written into the kept binding's buffers, all-ones masks made
    beforehand a few lengths at a time) gives bit for bit the logits of forward with the step's arrays on a
    binding made anew: rows of one length (uniform) and, on the shared-buffer graph, rows of three lengths."""
    decoder, _ = decoders[variant, graph]
    from prodip.serve.engine import _DecodeBinding

    monkeypatch.setattr(_DecodeBinding, "MASKS_AT_ONCE", 2)  # several refills within the steps below
    steps = 7
    prompts = [MINE, MINE[::-1]] if graph == "contract" else [MINE, MINE[:4], MINE[:6]]

    def run(via_decode):
        decoder._binding = None  # no binding kept from another test
        outs = []
        for prompt in prompts if graph == "shared" else [None]:
            group = [prompt] if prompt is not None else prompts
            T = len(group[0])
            logits, past = decoder.forward(
                np.array(group, np.int64),
                np.ones((len(group), T), np.int64),
                np.tile(np.arange(T), (len(group), 1)),
                decoder.empty_past(len(group)),
                reserve=T + steps,
            )
            outs.append((logits[:, -1].argmax(-1), past, T))
        if graph == "shared":  # one ragged group of the rows prefilled apart, as the scheduler merges them
            from prodip.serve.batching import _Batch

            batches = [_Batch([None], past, [T], nxt.tolist(), T + steps) for nxt, past, T in outs]
            merged = batches[0]
            for b in batches[1:]:
                merged = _Batch.merge(merged, b)
            nxt, past, uniform = np.array(merged.next_ids), merged.past, merged.uniform
            lengths = np.array(merged.lengths)
        else:
            nxt, past, T = outs[0]
            lengths, uniform = np.full(len(prompts), T, np.int64), True
        got = []
        for _ in range(steps):
            if via_decode:
                logits, past = decoder.decode(nxt, lengths, past, lengths.max() + steps, uniform)
            else:
                decoder._binding = None
                mask = (np.arange(lengths.max() + 1) <= lengths[:, None]).astype(np.int64)
                logits, past = decoder.forward(nxt[:, None], mask, lengths[:, None], past, lengths.max() + steps)
            got.append(logits[: len(nxt), -1].copy())
            nxt, lengths = got[-1].argmax(-1).astype(np.int64), lengths + 1
        return got, uniform

    (stepped, uniform), (fresh, _) = run(True), run(False)
    assert uniform == (graph == "contract")
    assert all(np.array_equal(a, b) for a, b in zip(stepped, fresh))
