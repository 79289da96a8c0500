"""GGUF files in llama.cpp and ExecuTorch programs in ExecuTorch, against the training model.

One export of the device model of tests/fixtures.py ``build_device_set`` (hidden 256, vocab 512 with a
384-token portable tokenizer) with all five device variants, built once per module (~2-5 min on 2 cores:
the two XNNPACK lowerings dominate). Measured there on 2026-11-30 (llama.cpp v0.5.0 through node-llama-cpp
3.22.1, ExecuTorch 1.5.1, greedy 24 tokens):

- gguf-f16: max|dlogit| 6.7e-3, KL 6.4e-7, top1 99.5%, greedy identical; gguf-q8_0: KL 4.0e-4, top1 94.2%;
  gguf-q4_k_m: KL 4.2e-2, top1 59.0% (a random hidden-256 model: no outliers, flat logits);
- pte-fp32: max|dlogit| 7.2e-6, greedy identical; pte-8da4w: KL 5.8e-2, top1 54.6%;
- planted faults: GGUF rope freq_base 500000 (KL 0.18), q/k left unpermuted (KL 0.33), .pte metadata
  get_max_seq_len twice its cache (runtime_metadata_ok false).

    python -m pytest tests/conformance/test_devices.py -q
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prodip.base.manifest import ExportManifest
from prodip.conformance import evaluate, faults
from prodip.conformance.device_runners import NODE_DIR
from prodip.conformance.suite import plan_candidates
from tests import fixtures

if os.environ.get("PRODIP_REQUIRE_RUNTIMES") != "1":
    pytest.importorskip("gguf")
    pytest.importorskip("executorch")
pytestmark = pytest.mark.slow

GGUF = ["gguf-f16", "gguf-q8_0", "gguf-q4_k_m"]
PTE = ["pte-fp32", "pte-8da4w"]
DEVICES_DOC = Path(__file__).resolve().parents[2] / "docs" / "devices.md"
HAS_LLAMA_CPP = shutil.which("node") is not None and (NODE_DIR / "node_modules" / "node-llama-cpp").is_dir()
# CI (.ci/run) sets PRODIP_REQUIRE_RUNTIMES=1: a missing runtime is then a failure, never a skip
needs_llama_cpp = pytest.mark.skipif(
    not HAS_LLAMA_CPP and os.environ.get("PRODIP_REQUIRE_RUNTIMES") != "1",
    reason="needs node and node-llama-cpp (npm install --ignore-scripts --prefix node)",
)


@pytest.fixture(scope="module")
def device_set(tmp_path_factory):
    required = os.environ.get("PRODIP_REQUIRE_RUNTIMES") == "1"
    variants = PTE + (GGUF if HAS_LLAMA_CPP or required else ["gguf-f16", "gguf-q8_0"])
    return fixtures.build_device_set(tmp_path_factory.mktemp("devices"), variants)


@pytest.fixture
def dev_cfg(device_set, conf_cfg):
    def make(export_dir, variants):
        return conf_cfg(
            export_dir,
            variants=variants,
            checkpoint=str(device_set["checkpoint"]),
            shards_dir=str(device_set["shards"]),
        )

    return make


def _failed(report: dict, candidate: str) -> set[str]:
    return {c["metric"] for c in report["candidates"][candidate]["checks"] if c["passed"] is False}


def test_manifest_records_device_variants(device_set):
    manifest = json.loads((device_set["export"] / "manifest.json").read_text())
    v = manifest["variants"]
    assert v["gguf-f16"]["quantization"]["tensor_types"] == {"F16": 16, "F32": 5}
    assert v["gguf-f16"]["quantization"]["tokens"] == 512  # 384 tokens padded to the embedding's 512 rows
    assert v["gguf-f16"]["quantization"]["pre"] == "granite-embed-multi-97m"  # the portable tokenizer's type
    assert v["pte-8da4w"]["quantization"]["runner_metadata"]["get_max_seq_len"] == 96
    assert v["pte-fp32"]["tokenizer"] == "executorch/tokenizer.json"
    assert {c.kind for c in plan_candidates(ExportManifest.from_dict(manifest))} >= {"gguf", "pte"}


@needs_llama_cpp
def test_gguf_in_llama_cpp(device_set, dev_cfg):
    report = evaluate(dev_cfg(device_set["export"], GGUF))
    assert report["passed"], {n: _failed(report, n) for n in GGUF}
    f16 = report["candidates"]["gguf-f16"]["metrics"]
    assert f16["greedy_identical"] and f16["max_abs_logit"] < 5e-2
    assert f16["runtime_tokenizer_mismatches"] == 0 and f16["runtime_metadata_ok"]
    q4 = report["candidates"]["gguf-q4_k_m"]["metrics"]
    assert q4["kl_mean"] > f16["kl_mean"]  # the quantised file really is coarser


def test_pte_in_executorch(device_set, dev_cfg):
    report = evaluate(dev_cfg(device_set["export"], PTE))
    assert report["passed"], {n: _failed(report, n) for n in PTE}
    fp32 = report["candidates"]["pte-fp32"]["metrics"]
    assert fp32["greedy_identical"] and fp32["max_abs_logit"] < 1e-4 and fp32["kv_cache_max_abs"] < 1e-4
    assert fp32["runtime_tokenizer_mismatches"] == 0 and fp32["runtime_metadata_ok"]


@needs_llama_cpp
@pytest.mark.parametrize("fault", ["gguf_rope_theta", "gguf_unpermuted_qk"])
def test_gguf_faults_caught(device_set, dev_cfg, tmp_path, fault):
    bad = faults.FAULTS[fault](device_set["export"], tmp_path / "bad")
    report = evaluate(dev_cfg(bad, ["gguf-f16"]))
    assert not report["passed"]
    assert {"max_abs_logit", "greedy_identical", "kl_mean"} <= _failed(report, "gguf-f16")


def test_pte_wrong_max_seq_len_caught(device_set, dev_cfg, tmp_path):
    bad = faults.plant_pte_max_seq_len(device_set["export"], tmp_path / "bad")
    report = evaluate(dev_cfg(bad, ["pte-fp32"]))
    assert "runtime_metadata_ok" in _failed(report, "pte-fp32")
    problems = report["candidates"]["pte-fp32"]["metrics"]["runtime_metadata_problems"]
    assert problems == ["get_max_seq_len is 192, expected 96"]


def _snippet(name: str, export_dir: Path) -> str:
    """docs/devices.md's code block under ``<!-- snippet: NAME ...-->``, pointed at ``export_dir``."""
    text = DEVICES_DOC.read_text(encoding="utf-8")
    m = re.search(rf"<!-- snippet: {re.escape(name)} [^\n]*-->\n```\w+\n(.*?)```", text, re.S)
    assert m, f"docs/devices.md has no snippet {name!r}"
    return m.group(1).replace("runs/demo-devices/export", str(export_dir))


@needs_llama_cpp
def test_readme_llama_cpp_snippet_runs(device_set):
    script = NODE_DIR / "_readme_snippet_test.mjs"  # in node/, so node finds node_modules
    script.write_text(_snippet("llama.cpp", device_set["export"]), encoding="utf-8")
    try:
        run = subprocess.run(["node", str(script)], capture_output=True, timeout=600, check=False)
    finally:
        script.unlink()
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    assert run.stdout.strip()


def test_readme_executorch_snippet_runs(device_set, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(_snippet("executorch", device_set["export"]), encoding="utf-8")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, timeout=600, check=False)
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    assert b"Generated" in run.stdout + run.stderr  # the runner's statistics: it decoded tokens


def test_gguf_and_pte_carry_the_card(device_set, tmp_path):
    """general.license / languages / datasets / tags read back with gguf-py's GGUFReader (llama.cpp's quantizer
    keeps them in gguf-q4_k_m); the .pte sidecar is the manifest's card; a sidecar without its licence fails."""
    import gguf

    from prodip.conformance.card import card_problems
    from prodip.conformance.faults import copy_export, refresh_manifest

    export = device_set["export"]
    manifest = json.loads((export / "manifest.json").read_text())
    assert card_problems(export) == []
    for name in (v for v in GGUF if v in manifest["variants"]):
        fields = gguf.GGUFReader(str(export / manifest["variants"][name]["path"])).fields
        assert fields["general.license"].contents() == "other", name
        assert fields["general.license.name"].contents() == "prodip-data-mix", name
        assert fields["general.languages"].contents() == ["bn", "en"], name
        assert fields["general.dataset.count"].contents() == 3, name
        assert fields["general.dataset.1.name"].contents() == "bluck_bn_mcq.jsonl", name
        assert "licence-not-cleared" in fields["general.tags"].contents(), name
    side = json.loads((export / "executorch" / "model_card.json").read_text())
    assert side == manifest["card"]
    bad = copy_export(export, tmp_path / "bad")
    side["license"] = {}
    (bad / "executorch" / "model_card.json").write_text(json.dumps(side))
    refresh_manifest(bad)
    assert card_problems(bad) == ["executorch/model_card.json: differs from the manifest's card"]
