"""`seed` is a signed 64-bit integer (OpenAI's range); beyond it, a 400 naming it, not a silent wrap."""

import pytest


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64])
def test_seed_outside_int64_is_400(client, seed):
    r = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "temperature": 1.0, "seed": seed})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "seed"


def test_seed_at_int64_edges_is_accepted(client):
    for seed in (2**63 - 1, -(2**63)):
        r = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2, "temperature": 1.0, "seed": seed})
        assert r.status_code == 200, r.text
