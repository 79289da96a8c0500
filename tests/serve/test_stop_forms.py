"""Case C2: a stop string stops generation at the same place whichever Unicode form the client writes
it in and whichever form the model writes the text in, for a tokenizer with no normaliser (a byte-level
BPE base's ``"normalizer": null``: SmolLM2, Llama 3, Qwen2), through the real server: completions and
chat, streamed or not, ``n`` > 1. The matcher's known answers are in test_units.py."""

from __future__ import annotations

import json

import pytest

from tests.serve.conftest import LOCAL, make_verdict, wait_ready

O_ONE, O_TWO = "\u09cb", "\u09c7\u09be"  # ো, as one code point and as U+09C7 U+09BE (NFD)
#: the characters the requests below make the model write: ে, া (together: ো in NFD) and ো (NFC)
FORCED = ("\u09c7", "\u09be", O_ONE)


def first_o(text: str) -> int:
    """Where ো first starts in ``text``, in either spelling (an independent reference: plain search
    for both spellings; U+09C7 U+09BE is always composed by NFC, and nothing composes with U+09CB)."""
    hits = [i for i in (text.find(O_ONE), text.find(O_TWO)) if i >= 0]
    assert hits, f"the forced text holds no ো: {text!r}"
    return min(hits)


def forcing_bias(tokenizer) -> dict[str, float]:
    """logit_bias that makes the model write only :data:`FORCED` (each of them a token of the tiny tokenizer)."""
    ids = {tokenizer.decode([i]): i for i in range(tokenizer.get_vocab_size())}
    assert all(c in ids for c in FORCED), "the tiny tokenizer lacks a single-character token of ে, া or ো"
    return {str(ids[c]): 100.0 for c in FORCED}


def sse_texts(body: str, key) -> dict[int, str]:
    """Choice index -> the streamed text deltas joined (``key`` picks a chunk choice's text)."""
    out: dict[int, str] = {}
    for line in body.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:])["choices"]:
                out[choice["index"]] = out.get(choice["index"], "") + (key(choice) or "")
    return out


def check_both_forms(post, text_of, delta_of) -> None:
    """The same request without a stop string, then with ো as the stop string in each form, streamed
    and not: each choice is cut right before its first ো, whichever form the model wrote it in."""
    full = post({}).json()
    texts = [text_of(c) for c in full["choices"]]
    assert all(O_ONE in t for t in texts) and any(O_TWO in t for t in texts), texts  # both forms written
    want = [t[: first_o(t)] for t in texts]
    for stop in (O_ONE, O_TWO):
        body = post({"stop": [stop]}).json()
        got = sorted(body["choices"], key=lambda c: c["index"])
        assert [text_of(c) for c in got] == want, stop
        assert all(c["finish_reason"] == "stop" for c in got)
        streamed = post({"stop": stop, "stream": True}).text
        assert sse_texts(streamed, delta_of) == dict(enumerate(want)), stop


@pytest.fixture(scope="module")
def bare_export(tiny_export, tmp_path_factory):
    """The tiny export with ``"normalizer": null`` in tokenizer.json, re-hashed, with a verdict."""
    from tokenizers import Tokenizer

    from prodip import export
    from prodip.base.files import file_sha256
    from prodip.conformance.faults import copy_export, refresh_manifest

    out = copy_export(tiny_export[0], tmp_path_factory.mktemp("bare") / "export")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.normalizer = None
    tok.save(str(out / "tokenizer.json"))
    assert json.loads((out / "tokenizer.json").read_text())["normalizer"] is None
    refresh_manifest(out, tokenizer_sha256=file_sha256(out / "tokenizer.json"))
    export.set_conformance(out, make_verdict(out, {"fp32": True, "int8": True}))
    return out


@pytest.fixture(scope="module")
def bare_client(bare_export):
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app

    with TestClient(create_app(bare_export, "fp32", batch_wait_ms=2.0), base_url=LOCAL) as c:
        wait_ready(c)
        yield c


def test_completions_stop_in_either_form_with_no_normaliser(bare_client):
    svc = bare_client.app.state.service
    assert svc.tokenizer.normalizer is None
    # the tokenizer leaves both spellings as written: nothing but the matcher brings them together
    assert svc.encode(O_ONE, False) != svc.encode(O_TWO, False)
    base = {"prompt": "একদিন সকালে", "max_tokens": 24, "temperature": 1.0, "seed": 0, "n": 2}
    base |= {"ignore_eos": True, "logit_bias": forcing_bias(svc.tokenizer)}

    def post(extra):
        r = bare_client.post("/v1/completions", json={**base, **extra})
        assert r.status_code == 200, r.text
        return r

    check_both_forms(post, lambda c: c["text"], lambda c: c["text"])


@pytest.fixture(scope="module")
def prepend_export(tiny_export, tmp_path_factory):
    """The tiny export with a normaliser that is not idempotent (Llama 2's ``Prepend("▁")``: normalising twice
    prepends twice), re-hashed, with a verdict."""
    from tokenizers import Tokenizer, normalizers

    from prodip import export
    from prodip.base.files import file_sha256
    from prodip.conformance.faults import copy_export, refresh_manifest

    out = copy_export(tiny_export[0], tmp_path_factory.mktemp("prepend") / "export")
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Prepend("▁")])
    tok.save(str(out / "tokenizer.json"))
    refresh_manifest(out, tokenizer_sha256=file_sha256(out / "tokenizer.json"))
    export.set_conformance(out, make_verdict(out, {"fp32": True, "int8": True}))
    return out


def test_echo_keeps_typed_special_tokens_with_a_normaliser_applied_once(prepend_export):
    """Echo of a text prompt with special-token text typed in it: that token's piece is the text as typed, at its
    place in the echoed text, and the echoed ids are the prompt's ids, with a normaliser that must run once."""
    from fastapi.testclient import TestClient

    from prodip.serve.app import create_app

    with TestClient(create_app(prepend_export, "fp32", batch_wait_ms=2.0), base_url=LOCAL) as client:
        wait_ready(client)
        svc = client.app.state.service
        prompt = "ab<|eos|>cd"
        ids = svc.encode(prompt)
        assert svc.encode(svc.normalize(prompt)) != ids  # normalising twice gives other ids
        r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        tokens, offsets, text = choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"], choice["text"]
        assert len(tokens) == len(ids)
        k = tokens.index("<|eos|>")
        assert ids[k] == svc.tokenizer.token_to_id("<|eos|>")
        assert text[offsets[k] : offsets[k] + len("<|eos|>")] == "<|eos|>"  # typed text, in the echoed text
