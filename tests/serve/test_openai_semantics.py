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
