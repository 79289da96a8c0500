"""The serve stage never rewrites a completions.json a newer prodip wrote (prodip.serve.stage.serve_run)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from prodip.base.errors import OutputExists
from prodip.serve.config import ServeConfig
from prodip.serve.stage import serve_run


def test_serve_run_refuses_a_newer_completions_json_before_starting_a_server(tmp_path):
    path = tmp_path / "completions.json"
    path.write_text(json.dumps({"format_version": 2, "completions": {}}), encoding="utf-8")
    before = path.read_bytes()
    # refused before the config is read or a server is started
    with pytest.raises(OutputExists, match=r"completions.json: written by a newer prodip \(format_version 2; this"):
        serve_run(
            ServeConfig(export_dir=str(tmp_path / "export")),
            prompts={"bn": "x"},
            max_tokens=1,
            timeout_s=1,
            out_dir=tmp_path,
        )
    assert path.read_bytes() == before and not (tmp_path / "serve.log").exists()


def test_serve_stage_writes_completions_json_from_the_real_server(tmp_path):
    """The pipeline's serve stage on a tiny export: the run's requests (RunContext) reach the real server, and
    completions.json holds what it answered, with the sampling the requests used, key for key."""
    from prodip.base.stage import CompletionRequests, RunContext
    from prodip.serve.stage import SERVE, Completions
    from tests.serve.conftest import build_export

    export_dir, _ = build_export(tmp_path / "export", variants=("fp32",))
    requests = CompletionRequests(
        prompts={"en": "It was"},
        chat_prompts={"en": "hello"},
        max_tokens=4,
        sampling={"temperature": 0.0, "top_p": 1.0, "frequency_penalty": 0.0, "seed": 3},
        timeout_s=120.0,
    )
    out = tmp_path / "run"
    out.mkdir()
    cfg = SERVE.own(_Plan(ServeConfig(export_dir=str(export_dir), variant="fp32")))
    record = SERVE.run(cfg, RunContext(out_dir=out, requests=requests))
    doc = json.loads((out / "completions.json").read_text(encoding="utf-8"))
    assert doc["sampling"] == {"max_tokens": 4, "temperature": 0.0, "top_p": 1.0, "frequency_penalty": 0.0, "seed": 3}
    en = doc["completions"]["en"]
    assert en["prompt"] == "It was" and en["usage"]["completion_tokens"] >= 1 and en["seconds"] > 0
    assert Completions.read(out / "completions.json") == record
    # a base export has no chat template: the reply is the server's reason, not a failed run
    chat = doc["chat"]["en"]
    assert "reply" not in chat and chat["error"]["status"] == 400 and chat["error"]["code"] == "chat_not_supported"


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The one table the serve stage reads (a run plan has one attribute per table)."""

    serve: ServeConfig
