"""/v1/chat/completions on an export of an imported model (``prodip export HF_FOLDER`` of the Llama 3.2
stand-in): the prompt is the model's own template rendered as transformers renders it on the original
folder ({{ bos_token }}, <|start_header_id|>, <|eot_id|>), and generation stops at its stop ids."""

from __future__ import annotations

import pytest

from tests.serve.conftest import LOCAL, make_verdict, wait_ready
from tests.standins import build_standin

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "ঢাকা কোথায়?"}]


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    from prodip import export
    from prodip.export.config import ExportConfig
    from prodip.export.core import export_checkpoint

    root = tmp_path_factory.mktemp("imported")
    folder = build_standin("llama32", root / "llama32")
    out = export_checkpoint(ExportConfig(checkpoint=str(folder), out=str(root / "export"), variants=["fp32"]))
    export.set_conformance(out, make_verdict(out, {"fp32": True}))
    return folder, out


def test_imported_template_and_stops(imported):
    from fastapi.testclient import TestClient
    from transformers import AutoTokenizer

    from prodip.base.specials import read_specials
    from prodip.serve.app import create_app

    folder, out = imported
    want = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    with TestClient(create_app(out, "fp32", batch_wait_ms=2.0), base_url=LOCAL) as client:
        wait_ready(client)
        r = client.post("/v1/chat/completions", json={"messages": MESSAGES, "temperature": 0, "max_tokens": 40})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["prompt_tokens"] == len(want)
        r = client.post("/v1/completions", json={"prompt": want, "temperature": 0, "max_tokens": 40})
        same = r.json()["choices"][0]
        assert body["choices"][0]["message"]["content"] == same["text"]
        assert body["choices"][0]["finish_reason"] == same["finish_reason"]
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "a <|eot_id|> b"}]})
        assert r.status_code == 400 and "special_token_in_content" in r.text
    stops = set(read_specials(out).stop_ids)
    assert stops == set(read_specials(folder).stop_ids) and len(stops) == 3
