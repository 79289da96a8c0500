"""OpenAI presence/frequency penalties and logit_bias: known answers at the sampling level, then over
HTTP against a PyTorch reference decode of the same tiny model (fp32 export)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prodip.serve.sampling import TokenPenalties, adjust_logits, log_softmax, sample_token

PROMPT = "আমি বাংলায়"
GREEDY = {"temperature": 0, "ignore_eos": True}


# ---- sampling level: hand-computed rows ------------------------------------------------------------
ROW = np.array([1.0, 2.0, 3.0, 0.5, -1.0], np.float32)
GENERATED = [2, 2, 1, 2]  # c = {2: 3, 1: 1}


def _penalties_after(tokens, presence=0.0, frequency=0.0, bias=()):
    pen = TokenPenalties(presence, frequency, bias)
    for t in tokens:
        pen.observe(t)
    return pen


@pytest.mark.parametrize(
    "presence, frequency, bias, want, argmax",
    [
        # token 2: 3 - 3 * 0.25 - 0.5 = 1.75; token 1: 2 - 1 * 0.25 - 0.5 = 1.25
        (0.5, 0.25, (), [1.0, 1.25, 1.75, 0.5, -1.0], 2),
        # frequency only: token 2: 3 - 3 = 0; token 1: 2 - 1 = 1 -> tie of ids 0 and 1 at 1.0: first index
        (0.0, 1.0, (), [1.0, 1.0, 0.0, 0.5, -1.0], 0),
        # presence only: once per distinct token, however often it came
        (1.5, 0.0, (), [1.0, 0.5, 1.5, 0.5, -1.0], 2),
        # negative penalties encourage repetition: token 2: 3 + 3 * 0.5 + 1 = 5.5
        (-1.0, -0.5, (), [1.0, 3.5, 5.5, 0.5, -1.0], 2),
        # bias is added (ungenerated ids too); -100 effectively bans, +100 forces
        (0.0, 1.0, ((4, 3.0), (0, -100.0)), [-99.0, 1.0, 0.0, 0.5, 2.0], 4),
        (2.0, 2.0, ((3, 100.0),), [1.0, -2.0, -5.0, 100.5, -1.0], 3),
        # nothing set: the row itself
        (0.0, 0.0, (), [1.0, 2.0, 3.0, 0.5, -1.0], 2),
    ],
)
def test_adjusted_row_known_answers(presence, frequency, bias, want, argmax):
    pen = _penalties_after(GENERATED, presence, frequency, bias)
    got = pen.apply(ROW)
    assert got.dtype == np.float32 and got.shape == ROW.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert sample_token(got, 0.0, 0, 1.0, None) == argmax  # greedy = argmax of the adjusted row
    assert sample_token(got, 0.7, 1, 1.0, None) == argmax  # top_k 1 too
    np.testing.assert_array_equal(ROW, [1.0, 2.0, 3.0, 0.5, -1.0])  # input untouched


def test_adjust_logits_pure_function_known_answer():
    got = adjust_logits(ROW, np.array([2, 1]), np.array([3, 1]), 0.5, 0.25, np.array([4]), np.array([1.0], np.float32))
    np.testing.assert_allclose(got, [1.0, 1.25, 1.75, 0.5, 0.0], atol=1e-6)


def test_inactive_penalties_track_nothing_and_do_not_copy():
    pen = _penalties_after([1, 2, 3])
    assert not pen.active and pen.counts() == {}
    assert pen.apply(ROW) is ROW
    only_bias = _penalties_after([1, 2, 3], bias=((0, 1.0),))
    assert only_bias.active and only_bias.counts() == {}  # bias needs no counts


def test_counts_are_incremental_and_sized_by_distinct_tokens():
    pen = TokenPenalties(0.0, 1.0)
    for i in range(10_000):
        pen.observe(i % 3)
    assert pen.counts() == {0: 3334, 1: 3333, 2: 3333}
    assert pen._ids.shape[0] == 16  # storage grows with distinct tokens, not with the generation
    for t in range(40):
        pen.observe(100 + t)
    assert len(pen.counts()) == 43 and pen._ids.shape[0] == 64


def _reference(row, generated, presence, frequency, bias):
    """The OpenAI formula recomputed from scratch (a recount, as the reference only)."""
    x = row.astype(np.float64).copy()
    for tok, c in Counter(generated).items():
        x[tok] -= c * frequency + (c > 0) * presence
    for tok, b in bias:
        x[tok] += b
    return x


@settings(max_examples=150, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 49), max_size=80),
    presence=st.floats(-2, 2),
    frequency=st.floats(-2, 2),
    bias=st.dictionaries(st.integers(0, 49), st.floats(-100, 100), max_size=5),
    seed=st.integers(0, 2**32 - 1),
)
def test_incremental_equals_recount_at_every_step(tokens, presence, frequency, bias, seed):
    row = np.random.default_rng(seed).normal(size=50).astype(np.float32)
    pen = TokenPenalties(presence, frequency, sorted(bias.items()))
    for i in range(len(tokens) + 1):
        want = _reference(row, tokens[:i], presence, frequency, sorted(bias.items()))
        np.testing.assert_allclose(pen.apply(row), want, rtol=1e-6, atol=1e-4)
        if i < len(tokens):
            pen.observe(tokens[i])


def test_sequence_samples_penalised_but_reports_raw_logprobs(tiny_export):
    """Sequence.step: greedy over the penalised row, logprobs of the raw row. With a row where id 10
    leads id 11 by 0.1 and frequency_penalty 0.2, greedy alternates 10, 11, 10, 11, ..."""
    from tokenizers import Tokenizer

    from prodip.serve.batching import SamplingParams, Sequence, TokenOut

    tok = Tokenizer.from_file(str(tiny_export[0] / "tokenizer.json"))
    row = np.zeros(512, np.float32)
    row[10], row[11] = 1.0, 0.9
    events = []
    seq = Sequence(
        [1],
        SamplingParams(max_new_tokens=6, temperature=0, frequency_penalty=0.2, logprobs=1, ignore_eos=True),
        tok,
        events.append,
        eos_id=2,
    )
    for _ in range(6):
        seq.step(row)
    outs = [e for e in events if isinstance(e, TokenOut) and e.token_id is not None]
    assert [e.token_id for e in outs] == [10, 11, 10, 11, 10, 11]
    raw = log_softmax(row)
    np.testing.assert_allclose([e.logprob for e in outs], [raw[10], raw[11]] * 3)
    # top-1 of the model's own row, plus the chosen token when it is another (logprobs + 1)
    assert [e.top for e in outs] == [[(10, float(raw[10]))], [(10, float(raw[10])), (11, float(raw[11]))]] * 3
    assert seq.penalties.counts() == {10: 3, 11: 3}


# ---- HTTP: against a PyTorch reference ------------------------------------------------------------
def torch_greedy_penalised(model, ids, steps, presence=0.0, frequency=0.0, bias=None, count_prompt=False):
    """Reference: the PyTorch model's greedy decode over logits adjusted by the OpenAI formula,
    counts recomputed from scratch each step (from the generated tokens, plus the prompt's when
    ``count_prompt``, the wrong reading this reference exists to tell apart)."""
    import torch

    out = []
    with torch.no_grad():
        logits, past = model(torch.tensor([ids]), use_cache=True)
        for _ in range(steps):
            row = _reference(
                logits[0, -1].numpy(),
                (list(ids) if count_prompt else []) + out,
                presence,
                frequency,
                sorted((bias or {}).items()),
            )
            tok = int(np.argmax(row))
            out.append(tok)
            logits, past = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
    return out


def _ids(client, text):
    return client.post("/tokenize", json={"text": text}).json()["tokens"]


def _generate(client, prompt, steps, **kw):
    r = client.post("/v1/generate", json={"prompt": prompt, "max_new_tokens": steps, **GREEDY, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_large_frequency_penalty_removes_greedy_repeats(client):
    plain = _generate(client, PROMPT, 40)["token_ids"]
    assert max(Counter(plain).values()) > 1  # the unpenalised greedy output repeats (so this can fail)
    penalised = _generate(client, PROMPT, 40, frequency_penalty=2.0, presence_penalty=2.0)["token_ids"]
    assert len(penalised) == 40 and max(Counter(penalised).values()) == 1
    assert penalised[0] == plain[0]  # nothing generated yet at step 1: same first token


def test_penalised_greedy_equals_pytorch_reference(client, tiny_export):
    ids = _ids(client, PROMPT)
    plain = torch_greedy_penalised(tiny_export[1], ids, 40)
    cases = [
        (0.3, 0.5, None),
        (0.0, 2.0, None),
        (-0.5, -0.25, None),
        (0.0, 0.2, None),
        (1.0, 0.0, {str(plain[0]): -100.0, str(plain[1]): 5.0}),
    ]
    count_dependent = False
    for presence, frequency, bias in cases:
        want = torch_greedy_penalised(
            tiny_export[1], ids, 40, presence, frequency, {int(k): v for k, v in (bias or {}).items()}
        )
        got = _generate(client, ids, 40, presence_penalty=presence, frequency_penalty=frequency, logit_bias=bias)
        assert got["token_ids"] == want, (presence, frequency, bias)
        # a repeat under a frequency penalty that changed the output: the per-token count was used
        count_dependent |= bool(frequency) and want != plain and max(Counter(want).values()) > 1
    assert count_dependent


def test_penalty_counts_generated_tokens_not_the_prompt(client, tiny_export):
    """Prompts made of the model's own greedy output up to a token it is about to repeat: that next
    token is already in the prompt. Penalties must not see the prompt, so the first generated token
    stays the unpenalised one; a reference that counts the prompt changes it for some such prompt."""
    ids, model = _ids(client, PROMPT), tiny_export[1]
    plain = torch_greedy_penalised(model, ids, 40)
    repeats = [k for k in range(1, len(plain)) if plain[k] in plain[:k]]
    assert repeats  # the unpenalised output repeats
    told_apart = 0
    for k in repeats:
        prompt = ids + plain[:k]
        assert _generate(client, prompt, 1)["token_ids"] == [plain[k]]
        got = _generate(client, prompt, 1, presence_penalty=2.0, frequency_penalty=2.0)["token_ids"]
        assert got == [plain[k]]  # in the prompt, not yet generated: not penalised
        told_apart += torch_greedy_penalised(model, prompt, 1, 2.0, 2.0, count_prompt=True) != got
    assert told_apart  # counting the prompt would have given another first token
    prompt = ids + plain[: repeats[0]]
    got = _generate(client, prompt, 12, presence_penalty=2.0, frequency_penalty=2.0)["token_ids"]
    assert got == torch_greedy_penalised(model, prompt, 12, 2.0, 2.0)


def test_each_choice_counts_its_own_tokens(client):
    body = {"prompt": PROMPT, "max_tokens": 24, **GREEDY, "frequency_penalty": 0.5, "presence_penalty": 0.3}
    one = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    three = client.post("/v1/completions", json={**body, "n": 3}).json()["choices"]
    assert [c["text"] for c in three] == [one] * 3  # shared counts would make choices 2 and 3 differ
    two_prompts = client.post("/v1/completions", json={**body, "prompt": [PROMPT, PROMPT]}).json()["choices"]
    assert [c["text"] for c in two_prompts] == [one] * 2


def test_logit_bias_plus_100_forces_a_token(client):
    ka = _ids(client, "ক")[-1]
    assert ka not in (0, 1, 2)
    r = _generate(client, PROMPT, 8, logit_bias={str(ka): 100})
    assert r["token_ids"] == [ka] * 8
    sampled = _generate(client, PROMPT, 8, logit_bias={str(ka): 100}, temperature=1.0, seed=5)
    assert sampled["token_ids"] == [ka] * 8
    c = client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, **GREEDY, "logit_bias": {str(ka): 100}}
    ).json()["choices"][0]
    assert c["text"] == r["text"] == "ক" * 8


def test_logit_bias_minus_100_takes_the_runner_up_and_logprobs_stay_raw(client):
    body = {"prompt": PROMPT, "max_tokens": 1, **GREEDY, "logprobs": 2}
    plain = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    first = _generate(client, PROMPT, 1)["token_ids"][0]
    (best, best_lp), (second, second_lp) = plain["top_logprobs"][0].items()
    svc = client.app.state.service
    # the greedy token is the top one, spelled the same in tokens and top_logprobs
    assert svc.token_text(first) == best and plain["tokens"][0] == svc.token_piece(first)
    r = client.post("/v1/completions", json={**body, "logit_bias": {str(first): -100}}).json()["choices"][0]
    lp = r["logprobs"]
    gen = _generate(client, PROMPT, 1, logit_bias={str(first): -100})
    runner_up = gen["token_ids"][0]
    assert runner_up != first and svc.token_text(runner_up) == second != best  # changed, to the runner-up
    assert lp["tokens"][0] == svc.token_piece(runner_up)
    assert lp["token_logprobs"][0] == pytest.approx(second_lp, abs=1e-6)  # the model's own logprob
    assert lp["top_logprobs"][0] == plain["top_logprobs"][0]  # bias not reflected in logprobs


def test_stream_equals_non_stream_with_penalties(client):
    body = {
        "prompt": PROMPT,
        "max_tokens": 30,
        "temperature": 0.9,
        "seed": 3,
        "ignore_eos": True,
        "n": 2,
        "frequency_penalty": 0.7,
        "presence_penalty": 0.4,
        "logit_bias": {"45": 3.0, "214": -5},
    }
    whole = client.post("/v1/completions", json=body).json()["choices"]
    events = [
        json.loads(line[6:])
        for line in client.post("/v1/completions", json={**body, "stream": True}).text.splitlines()
        if line.startswith("data: {")
    ]
    streamed = ["".join(e["choices"][0]["text"] for e in events if e["choices"][0]["index"] == i) for i in (0, 1)]
    assert streamed == [c["text"] for c in whole] and streamed[0] != streamed[1]
    for extra in ({}, GREEDY):
        gen = {
            "prompt": PROMPT,
            "max_new_tokens": 30,
            "temperature": 0.9,
            "seed": 3,
            "ignore_eos": True,
            "frequency_penalty": 0.7,
            "presence_penalty": 0.4,
            **extra,
        }
        whole = client.post("/v1/generate", json=gen).json()
        chunks = [
            json.loads(line[6:])
            for line in client.post("/v1/generate", json={**gen, "stream": True}).text.splitlines()
            if line.startswith("data: {")
        ]
        assert [c["token_id"] for c in chunks if c["token_id"] is not None] == whole["token_ids"]
        assert "".join(c["text"] for c in chunks) == whole["text"]


@pytest.mark.parametrize(
    "bias",
    [
        {"abc": 1},
        {"-1": 1},
        {"1.5": 1},
        {" 5": 1},
        {"১২": 1},
        {"512": 1},
        {"99999999999999999999999": 1},
        {"5": 100.5},
        {"5": -101},
        {"5": 1, "05": 2},
    ],
)
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/generate"])
def test_invalid_logit_bias_is_400_naming_it(client, route, bias):
    r = client.post(route, json={"prompt": "x", **({"max_tokens": 2} if "compl" in route else {}), "logit_bias": bias})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"] == "logit_bias" and err["message"].startswith("logit_bias ")


def test_logit_bias_edge_values_and_non_numbers(client):
    ok = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "logit_bias": {"511": 100, "0": -100}})
    assert ok.status_code == 200, ok.text
    for raw in (
        b'{"prompt": "x", "logit_bias": {"5": NaN}}',
        b'{"prompt": "x", "logit_bias": {"5": Infinity}}',
        b'{"prompt": "x", "logit_bias": {"5": "high"}}',
        b'{"prompt": "x", "logit_bias": [5]}',
    ):
        r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
        assert r.json()["error"]["param"].split(".")[0] == "logit_bias"
