"""The serve stage never rewrites a completions.json a newer prodip wrote (prodip.serve.stage.serve_run)."""

from __future__ import annotations

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
