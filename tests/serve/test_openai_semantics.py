"""OpenAI-semantics details of /v1/completions: the empty prompt's start token, strict numeric
fields, logprobs text offsets and pieces, stop strings in logprobs, echo of the prompt as sent."""

from __future__ import annotations

import numpy as np
import pytest

from tests.serve.test_app import sse_events


def test_empty_prompt_starts_from_eos(client, tiny_export):
    """Training shards separate documents with <|eos|> and never contain <|bos|>."""
    import torch
    svc = client.app.state.service
    assert svc.prompt_ids("") == [[svc.eos_id]] == [[2]]
    r = client.post("/v1/completions", json={"prompt": "", "max_tokens": 1, "temperature": 0,
                                             "logprobs": 1}).json()
    assert r["usage"]["prompt_tokens"] == 1
    with torch.no_grad():
        ref = torch.log_softmax(tiny_export[1](torch.tensor([[2]])).double(), -1)[0, -1].numpy()
    np.testing.assert_allclose(r["choices"][0]["logprobs"]["token_logprobs"][0], ref.max(), atol=1e-4)


@pytest.mark.parametrize("route, field, value", [
    ("/v1/completions", "max_tokens", "5"), ("/v1/completions", "max_tokens", 5.0),
    ("/v1/completions", "n", "2"), ("/v1/completions", "logprobs", "1"), ("/v1/completions", "seed", "7"),
    ("/v1/completions", "temperature", "0.5"), ("/v1/completions", "top_p", "1"), ("/v1/completions", "top_k", "3"),
    ("/v1/completions", "presence_penalty", "0"), ("/v1/completions", "echo", 1),
    ("/v1/completions", "stream", "true"), ("/v1/completions", "max_tokens", True),
    ("/v1/completions", "logit_bias", {"5": "10"}),
    ("/v1/generate", "max_new_tokens", "5"), ("/v1/generate", "temperature", "0"),
])
def test_numbers_as_strings_are_400_naming_the_param(client, route, field, value):
    r = client.post(route, json={"prompt": "x", field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert err["param"].split(".")[0] == field


def test_integers_are_fine_for_float_fields(client):
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 1, "top_p": 1,
                                             "presence_penalty": 0, "frequency_penalty": 1,
                                             "logit_bias": {"5": 3}})
    assert r.status_code == 200, r.text
