"""Issue 14 items 2, 3, 6: one normalisation rule on every text path (case C2); vLLM's /tokenize,
/detokenize and /tokenizer_info shapes, which lm-eval's remote tokenizer reads (case C5);
top_logprobs include the chosen token; /v1/chat/completions answers an OpenAI-shaped error; an
empty prompt starts from the document start the export's tokenizer defines."""

from __future__ import annotations

import unicodedata

import pytest

BN = "একদিন সকালে"
YA_NUKTA_NFC = "\u09af\u09bc"  # য় as the model writes it (U+09DF is a composition exclusion)
YA_NUKTA_ONE = "\u09df"  # য় as one code point, as many keyboards type it
O_NFC, O_TWO = "\u09cb", "\u09c7\u09be"  # ো


def _complete(client, **body):
    r = client.post("/v1/completions", json={"max_tokens": 40, "temperature": 1.0, "seed": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_stop_strings_match_in_any_normalisation_form(client):
    """Case C2: a stop string is matched in NFC (serve.text.StopMatcher), so the forms U+09DF and
    U+09AF U+09BC (and U+09C7 U+09BE vs U+09CB) stop at the same place; test_stop_forms.py does
    the same with a tokenizer that has no normaliser."""
    full = _complete(client, prompt=BN, ignore_eos=True)["text"]
    # a stop string the model's text really contains, sent in both forms
    pairs = [(YA_NUKTA_NFC, YA_NUKTA_ONE), (O_NFC, O_TWO)]
    present = [(a, b) for a, b in pairs if a in full]
    # The tiny model's text may lack both letters: then plant one through its own text. An untrained
    # byte-level model can write any code point, some not in NFC (U+F964 -> U+78FB; a trained model
    # writes the NFC it was trained on), so take the first two characters that are already NFC.
    nfc_pairs = [full[i : i + 2] for i in range(len(full) - 1) if unicodedata.is_normalized("NFC", full[i : i + 2])]
    assert nfc_pairs, full
    candidates = present or [(nfc_pairs[0], unicodedata.normalize("NFD", nfc_pairs[0]))]
    for nfc, other in candidates:
        a = _complete(client, prompt=BN, ignore_eos=True, stop=[nfc])
        b = _complete(client, prompt=BN, ignore_eos=True, stop=[other])
        assert a["finish_reason"] == b["finish_reason"] == "stop"
        assert a["text"] == b["text"] == full[: full.find(nfc)]


def test_service_normalises_prompts_to_nfc(client):
    """Prompts: the tokenizer's NFC, on the two forms of case C2 (independent of what the tiny model writes)."""
    svc = client.app.state.service
    assert svc.normalize(YA_NUKTA_ONE) == YA_NUKTA_NFC
    assert svc.normalize(O_TWO) == O_NFC
    assert svc.encode(YA_NUKTA_ONE) == svc.encode(YA_NUKTA_NFC)


@pytest.mark.parametrize("form", ["NFC", "NFD", "NFKD"])
def test_echo_pieces_join_to_the_echoed_text(client, form):
    """Echo of a text prompt in any normalisation form returns the text the model saw (the
    tokenizer's NFC), and its logprobs pieces tile it: each piece sits at its text_offset and runs
    to the next offset; a run of tokens that are not whole characters (OpenAI's ``bytes:\\xNN...``;
    a byte-level token may hold a character and a half) spells the UTF-8 of the characters it
    covers, each at the offset of the character it starts in. The <|bos|> the tokenizer adds is
    the special token's named piece at 0, adding no text."""
    prompt = unicodedata.normalize(form, BN + " " + YA_NUKTA_ONE + O_TWO + " ok")
    ch = _complete(client, prompt=prompt, max_tokens=0, echo=True, logprobs=1)
    text, lp = ch["text"], ch["logprobs"]
    assert text == unicodedata.normalize("NFC", prompt)
    assert lp["tokens"][0] == "<|bos|>" and lp["text_offset"][0] == 0  # named, adding no text
    offsets = lp["text_offset"] + [len(text)]
    i = 1
    while i < len(lp["tokens"]):
        piece, off = lp["tokens"][i], offsets[i]
        if piece.startswith("bytes:"):
            j, raw = i, b""
            while j < len(lp["tokens"]) and lp["tokens"][j].startswith("bytes:"):
                assert offsets[j] == off + len(raw.decode("utf-8", "ignore"))  # its character's start
                raw += bytes.fromhex(lp["tokens"][j][len("bytes:") :].replace("\\x", ""))
                j += 1
            assert text[off : offsets[j]].encode() == raw
            i = j
        else:
            assert text[off : offsets[i + 1]] == piece, (i, piece)
            i += 1


def test_tokenize_detokenize_vllm_shapes(client):
    """Case C5: lm-eval's remote tokenizer sends vLLM's /tokenize body."""
    r = client.post("/tokenize", json={"prompt": "test", "add_special_tokens": False})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) >= {"count", "max_model_len", "tokens"} and body["count"] == len(body["tokens"])
    assert (
        client.post("/tokenize", json={"text": "test", "add_special_tokens": False}).json()["tokens"] == body["tokens"]
    )
    strs = client.post("/tokenize", json={"prompt": "test", "return_token_strs": True}).json()["token_strs"]
    assert all(isinstance(s, str) for s in strs)
    assert client.post("/tokenize", json={"prompt": "a", "text": "b"}).status_code == 400
    assert client.post("/tokenize", json={}).status_code == 400
    back = client.post("/detokenize", json={"tokens": body["tokens"]}).json()
    assert back["prompt"] == back["text"] == "test"
    # /tokenize and /detokenize follow the rule too: caller text is NFC-normalised by the tokenizer
    one = client.post("/tokenize", json={"prompt": YA_NUKTA_ONE, "add_special_tokens": False}).json()["tokens"]
    assert one == client.post("/tokenize", json={"prompt": YA_NUKTA_NFC, "add_special_tokens": False}).json()["tokens"]
    assert client.post("/detokenize", json={"tokens": one}).json()["prompt"] == YA_NUKTA_NFC


def test_tokenizer_info_has_vllm_keys(client):
    info = client.get("/tokenizer_info").json()
    assert info["eos_token"] == "<|eos|>" and info["bos_token"] == "<|bos|>" and info["pad_token"] == "<|pad|>"
    assert info["model_max_length"] == info["max_model_len"] and "tokenizer_class" in info
    assert info["special_tokens"]["eos"]["text"] == "<|eos|>"


def test_top_logprobs_include_the_sampled_token(client):
    """Case C5: with logprobs 1 and sampling, top_logprobs holds the sampled token too (up to 2)."""
    ch = _complete(client, prompt=BN, logprobs=1, max_tokens=30, temperature=1.5, seed=3, ignore_eos=True)
    lp = ch["logprobs"]
    outside = 0
    for tops, v in zip(lp["top_logprobs"], lp["token_logprobs"]):
        assert 1 <= len(tops) <= 2 and v in tops.values()
        outside += len(tops) == 2
    assert outside > 0  # at temperature 1.5 some sampled tokens are not the most likely


def test_chat_completions_is_an_openai_error(client):
    r = client.post("/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "/v1/completions" in err["message"] and "chat template" in err["message"]
    assert err["type"] == "invalid_request_error" and err["code"] == "chat_not_supported"


def test_empty_prompt_starts_a_document(client):
    """The export's tokenizer.json prepends <|bos|>: an empty prompt is [<|bos|>] (tests below)."""
    ch = _complete(client, prompt="", max_tokens=0, echo=True, logprobs=0)
    assert ch["logprobs"]["tokens"] == ["<|bos|>"] and ch["text"] == ""  # one special token, no text
    assert client.app.state.service.prompt_ids("") == [[1]]


def test_document_start_follows_the_tokenizer(tiny_export, tmp_path):
    """The BOS convention: tokenizer.json's post-processor prepends <|bos|> (the default tokenizer's
    does): an empty prompt is [<|bos|>] and every text prompt starts with it; read from the export,
    not hard-coded. A post-processor that adds nothing, with add_bos_token in tokenizer_config.json:
    the config's bos_token is prepended."""
    import json

    from tokenizers import Tokenizer, processors

    from prodip.serve.config import ServeConfig
    from prodip.serve.engine import load_export
    from prodip.serve.metrics import ServeMetrics
    from prodip.serve.service import Service

    info = load_export(tiny_export[0], "fp32")
    tok = Tokenizer.from_file(str(info.tokenizer_path))
    bos = tok.token_to_id("<|bos|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", pair="<|bos|> $A <|bos|> $B", special_tokens=[("<|bos|>", bos)]
    )
    svc = Service(info, ServeConfig(), ServeMetrics())
    svc.tokenizer = tok
    svc.document_start, svc.adds_bos = svc._document_start()
    assert svc.document_start == [bos] and svc.adds_bos
    assert svc.prompt_ids("") == [[bos]] and svc.prompt_ids("hi")[0][0] == bos
    # add_bos_token in tokenizer_config.json without a post-processor: the config's bos_token
    cfg = json.loads((tiny_export[0] / "tokenizer_config.json").read_text())
    svc.tokenizer = Tokenizer.from_file(str(tiny_export[0] / "tokenizer.json"))
    svc.tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)  # one that adds no <|bos|>
    svc.tokenizer_config = {**cfg, "add_bos_token": True, "bos_token": "<|bos|>"}
    svc.document_start, svc.adds_bos = svc._document_start()
    assert svc.document_start == [bos] and not svc.adds_bos
    assert svc.prompt_ids("hi")[0][0] == bos


def test_default_max_tokens_checked_against_the_context_window(tiny_export):
    """Issue 14 item 4: a limit set by the model (max_position_embeddings) is checked at startup."""
    from prodip.base.errors import InvalidInput
    from prodip.serve.app import create_app

    with pytest.raises(InvalidInput, match="default_max_tokens 128 .* context window of 128"):
        create_app(tiny_export[0], "fp32", default_max_tokens=128)
