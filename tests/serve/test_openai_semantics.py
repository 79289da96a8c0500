"""OpenAI-semantics details of /v1/completions: the empty prompt's start token, strict numeric
fields, logprobs text offsets and pieces, stop strings in logprobs, echo of the prompt as the model saw it (NFC)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.serve.test_app import sse_events
from tests.serve.test_units import bytes_to_unicode


def test_empty_prompt_starts_from_bos(client, tiny_export):
    """The export's tokenizer.json prepends <|bos|> (the shards hold <|bos|> ids <|eos|>): an empty
    prompt is the document start, [<|bos|>]."""
    import torch

    svc = client.app.state.service
    assert svc.prompt_ids("") == [[svc.bos_id]] == [[1]]
    r = client.post("/v1/completions", json={"prompt": "", "max_tokens": 1, "temperature": 0, "logprobs": 1}).json()
    assert r["usage"]["prompt_tokens"] == 1
    with torch.no_grad():
        ref = torch.log_softmax(tiny_export[1](torch.tensor([[1]])).double(), -1)[0, -1].numpy()
    np.testing.assert_allclose(r["choices"][0]["logprobs"]["token_logprobs"][0], ref.max(), atol=1e-4)


@pytest.mark.parametrize(
    "route, field, value",
    [
        ("/v1/completions", "max_tokens", "5"),
        ("/v1/completions", "max_tokens", 5.0),
        ("/v1/completions", "n", "2"),
        ("/v1/completions", "logprobs", "1"),
        ("/v1/completions", "seed", "7"),
        ("/v1/completions", "temperature", "0.5"),
        ("/v1/completions", "top_p", "1"),
        ("/v1/completions", "top_k", "3"),
        ("/v1/completions", "presence_penalty", "0"),
        ("/v1/completions", "echo", 1),
        ("/v1/completions", "stream", "true"),
        ("/v1/completions", "max_tokens", True),
        ("/v1/completions", "logit_bias", {"5": "10"}),
        ("/v1/generate", "max_new_tokens", "5"),
        ("/v1/generate", "temperature", "0"),
    ],
)
def test_numbers_as_strings_are_400_naming_the_param(client, route, field, value):
    r = client.post(route, json={"prompt": "x", field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"].split(".")[0] == field


def test_integers_are_fine_for_float_fields(client):
    r = client.post(
        "/v1/completions",
        json={
            "prompt": "x",
            "max_tokens": 2,
            "temperature": 1,
            "top_p": 1,
            "presence_penalty": 0,
            "frequency_penalty": 1,
            "logit_bias": {"5": 3},
        },
    )
    assert r.status_code == 200, r.text


def _echo(client, prompt, **extra):
    body = {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0, **extra}
    ch = client.post("/v1/completions", json=body).json()["choices"][0]
    return ch["text"], ch["logprobs"]["tokens"], ch["logprobs"]["text_offset"]


def _check_offsets(text, tokens, offsets, cut_by_stop=False):
    """text_offset[i] indexes the returned text where token i's piece starts; offsets never decrease;
    the non-byte pieces join to the text (a byte token stands where its character starts; a special token or
    an id the tokenizer lacks is its name, ``<|eos|>`` / ``<|id_N|>``, adding no text). With
    ``cut_by_stop`` the last token may straddle the stop string (kept whole, serve/README.md): its
    piece then runs past the end of the text, which must be a prefix of it."""
    assert len(tokens) == len(offsets)
    assert offsets == sorted(offsets) and all(0 <= o <= len(text) for o in offsets)
    for i, (tok, off) in enumerate(zip(tokens, offsets)):
        if tok.startswith("bytes:") or re.fullmatch(r"<\|[a-z_0-9]+\|>", tok):  # a special's name adds no text
            continue
        if cut_by_stop and i == len(tokens) - 1 and not text[off:].startswith(tok):
            assert tok.startswith(text[off:]) and text[off:], (tok, off, text)  # the straddling token
        else:
            assert text[off:].startswith(tok), (tok, off, text)


def _known_pieces(tok, ids):
    """Pieces and offsets computed independently of serve, from each token's bytes (GPT-2's byte
    alphabet): a token that is whole UTF-8 characters is its text; any other is OpenAI's
    ``bytes:\\xNN...`` at the start of the character it starts in; a special token is its name there."""
    alphabet = {c: b for b, c in enumerate(bytes_to_unicode())}
    tokens, offsets, done = [], [], b""
    for t in ids:
        offsets.append(len(done.decode("utf-8", "ignore")))  # complete characters before it
        if t in (0, 1, 2):  # <|pad|> <|bos|> <|eos|>: named, adding no text
            tokens.append(tok.id_to_token(t))
            continue
        raw = bytes(alphabet[c] for c in tok.id_to_token(t))
        try:
            tokens.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            tokens.append("bytes:" + "".join(f"\\x{b:02x}" for b in raw))
        done += raw
    return tokens, offsets


def test_text_offset_known_answers_ascii_bangla_byte_level(client):
    tok = client.app.state.service.tokenizer
    text, tokens, offsets = _echo(client, "hello world")
    assert text == "hello world" and tokens[0] == "<|bos|>" and offsets[0] == 0  # <|bos|>, then the text
    assert "".join(tokens[1:]) == text and offsets[1:] == [len("".join(tokens[1:i])) for i in range(1, len(tokens))]
    # Bangla (3 UTF-8 bytes a character): byte-level tokens may split characters
    split = []
    for prompt in ("আমি বাংলায় গান গাই", "ক্ষুধার্ত মানুষ ৺", "café au lait"):
        ids = client.post("/tokenize", json={"text": prompt}).json()["tokens"]
        assert ids[0] == 1  # the tokenizer prepends <|bos|>
        want_tokens, want_offsets = _known_pieces(tok, ids)
        assert _echo(client, prompt) == (prompt, want_tokens, want_offsets)
        split += [(prompt, p, o) for p, o in zip(want_tokens, want_offsets) if p.startswith("bytes:")]
    assert split  # the case really has tokens that are not whole characters
    # known answers: ্ (e0 a7 8d) and the first 2 bytes of ষ (e0 a6 b7) are one token (a character
    # and a half) at ্'s offset, ষ's last byte is at ষ's; ৺ (U+09FA, e0 a7 ba, not in the tiny
    # corpus) is spelled by tokens of its bytes, all at its offset
    text, tokens, offsets = _echo(client, "ক্ষুধার্ত মানুষ ৺")
    pairs = list(zip(tokens, offsets))
    assert pairs[:4] == [("<|bos|>", 0), ("ক", 0), ("bytes:\\xe0\\xa7\\x8d\\xe0\\xa6", 1), ("bytes:\\xb7", 2)]
    assert pairs[-3:] == [(" ", 15), ("bytes:\\xe0\\xa7", 16), ("bytes:\\xba", 16)]
    # é is c3 a9: two tokens, both at é's offset; " a" starts at 4
    text, tokens, offsets = _echo(client, "café au lait")
    assert tokens == ["<|bos|>", "c", "a", "f", "bytes:\\xc3", "bytes:\\xa9", " ", "a", "u", " ", "l", "a", "i", "t"]
    assert offsets == [0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    # a token that does not continue an unfinished character: that character is U+FFFD (as the
    # tokenizer decodes it) and the token starts after it
    byte = {b: tok.token_to_id(c) for b, c in enumerate(bytes_to_unicode())}
    assert _echo(client, [byte[0xE0], byte[0xA7], byte[ord("a")]]) == (
        "\ufffda",
        ["bytes:\\xe0", "bytes:\\xa7", "a"],
        [0, 0, 1],
    )
    assert _echo(client, [byte[0xE0], byte[0xA7], byte[0xBA]]) == (
        "৺",
        ["bytes:\\xe0", "bytes:\\xa7", "bytes:\\xba"],
        [0, 0, 0],
    )
    # special tokens add no text (decoded with skip_special_tokens): their name at the current length
    ids = client.post("/tokenize", json={"text": "ab", "add_special_tokens": False}).json()["tokens"]
    pieces = _known_pieces(tok, ids)[0]
    assert "".join(pieces) == "ab" and not any(t in (0, 1, 2) for t in ids)
    text, tokens, offsets = _echo(client, [1, ids[0], 2, *ids[1:]])
    assert text == "ab" and tokens == ["<|bos|>", pieces[0], "<|eos|>", *pieces[1:]]
    assert offsets == [0, 0, len(pieces[0]), *_known_pieces(tok, [1, ids[0], 2, *ids[1:]])[1][3:]]


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "আমি বাংলায়", "max_tokens": 24, "temperature": 1.0, "seed": 3, "ignore_eos": True},
        {"prompt": "café", "max_tokens": 24, "temperature": 0.9, "seed": 8, "ignore_eos": True, "echo": True},
        {"prompt": ["hello", "ক্ষুধা"], "max_tokens": 16, "temperature": 0.7, "seed": 1, "n": 2, "echo": True},
        {"prompt": "the", "max_tokens": 20, "temperature": 0},
    ],
)
def test_offsets_index_the_returned_text_and_streaming_matches(client, body):
    whole = client.post("/v1/completions", json={**body, "logprobs": 2}).json()
    chunks = sse_events(client.post("/v1/completions", json={**body, "logprobs": 2, "stream": True}).text)
    for ch in whole["choices"]:
        lp = ch["logprobs"]
        _check_offsets(ch["text"], lp["tokens"], lp["text_offset"])
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == ch["index"]]
        assert "".join(c["text"] for c in mine) == ch["text"]
        streamed = {k: [v for c in mine if c["logprobs"] for v in c["logprobs"][k]] for k in lp}
        assert streamed == lp  # offsets continue over the stream (echoed prompt included)


def test_stop_string_tokens_are_not_in_logprobs(client):
    body = {"prompt": "আমি বাংলায়", "max_tokens": 40, "temperature": 0.8, "seed": 5, "ignore_eos": True, "logprobs": 1}
    full = client.post("/v1/completions", json=body).json()["choices"][0]
    at = full["logprobs"]["text_offset"]
    # a stop string that starts inside a token (straddling) and one that starts on a token boundary
    starts = [o for o in at if 8 <= o < len(full["text"]) - 3]
    for cut in (starts[0], starts[0] + 1):
        stop = full["text"][cut : cut + 3]
        cut = full["text"].find(stop)
        for stream in (False, True):
            r = client.post("/v1/completions", json={**body, "stop": [stop], "stream": stream})
            if stream:
                chunks = [c["choices"][0] for c in sse_events(r.text)]
                text = "".join(c["text"] for c in chunks)
                lp = {k: [v for c in chunks if c["logprobs"] for v in c["logprobs"][k]] for k in full["logprobs"]}
            else:
                ch = r.json()["choices"][0]
                text, lp = ch["text"], ch["logprobs"]
                assert r.json()["usage"]["completion_tokens"] > len(lp["tokens"])  # generated, stop included
            assert text == full["text"][:cut]
            keep = sum(1 for o in at if o < cut)  # tokens with any of their text returned
            assert lp == {k: v[:keep] for k, v in full["logprobs"].items()}
            _check_offsets(text, lp["tokens"], lp["text_offset"], cut_by_stop=True)


def test_echo_returns_the_prompt_as_the_model_saw_it(client):
    """The tokenizer normalises to NFC; echo returns that text (serve/README.md, "Text normalisation"), so the
    pieces tile it whatever form was sent; offsets into it."""
    import unicodedata

    for prompt in ("cafe\u0301 au lait", unicodedata.normalize("NFD", "কো বই"), "\u09df"):
        assert unicodedata.normalize("NFC", prompt) != prompt
        text, tokens, offsets = _echo(client, prompt)
        assert text == unicodedata.normalize("NFC", prompt)
        _check_offsets(text, tokens, offsets)
        r = client.post(
            "/v1/completions", json={"prompt": prompt, "max_tokens": 3, "echo": True, "temperature": 0}
        ).json()["choices"][0]
        plain = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 3, "temperature": 0}).json()[
            "choices"
        ][0]
        assert r["text"] == text + plain["text"]
        chunks = sse_events(
            client.post(
                "/v1/completions",
                json={"prompt": prompt, "max_tokens": 3, "echo": True, "temperature": 0, "stream": True},
            ).text
        )
        assert "".join(c["choices"][0]["text"] for c in chunks) == r["text"]
    text, tokens, offsets = _echo(client, "cafe\u0301 au")
    assert offsets[tokens.index(" ")] == 4  # after "é" (U+00E9), the NFC of "e" + U+0301
