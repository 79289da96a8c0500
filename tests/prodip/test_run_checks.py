"""`prodip run`'s checks before any stage: what --help imports, and how a changed config is named.

python -m pytest tests/prodip/test_run_checks.py -q
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from prodip.base.config import dump_toml
from prodip.base.errors import OutputExists
from prodip.pipeline import (
    RUN_MARKER,
    RunMarker,
    _check_out_dir,
    describe_changes,
    load_run_config,
    resolve_all,
)

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "onnx", "onnxruntime", "transformers", "pyarrow")


@pytest.mark.parametrize("argv", [["run", "--help"], ["--help"]])
def test_help_imports_no_torch_or_onnx(argv):
    """`prodip run --help` took 22 s under load, 10 s of it importing conformance -> torch and onnx."""
    code = (
        "import sys\nfrom prodip.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout, r.stdout[-500:]
    if argv[0] == "run":
        flat = "".join(r.stdout.split())  # argparse wraps the help text
        assert "--stages" in r.stdout and "tokenizer,data,train,eval,sft,export,conformance,serve" in flat


def _resolved(config: Path, out_dir: Path):
    run, tables = load_run_config(str(config))
    plan = resolve_all(str(config), tables, out_dir)
    resolved = {**{k: v for k, v in dataclasses.asdict(run).items() if k != "force"}, **plan.to_dict()}
    return resolved, plan, tables


def test_a_changed_config_names_the_keys_the_user_changed(tmp_path):
    """hidden_size 256 -> 512 also changes the derived [model] head_dim, which the user never wrote: it is
    counted, not named; a key the user removed (back to its default) is named."""
    out = tmp_path / "run"
    demo = (REPO / "configs" / "demo.toml").read_text(encoding="utf-8")
    first = tmp_path / "first.toml"
    first.write_text(demo.replace("hidden_size = 256", "hidden_size = 256\nrope_theta = 5000.0"), encoding="utf-8")
    resolved, _, _ = _resolved(first, out)
    out.mkdir()
    RunMarker(format_version=RunMarker.FORMAT_VERSION, config="config.toml").write(out / RUN_MARKER)
    (out / "config.toml").write_text(dump_toml(resolved), encoding="utf-8")

    changed = tmp_path / "changed.toml"
    changed.write_text(demo.replace("hidden_size = 256", "hidden_size = 512").replace("steps = 450", "steps = 451"))
    now, plan, tables = _resolved(changed, out)
    with pytest.raises(OutputExists) as err:
        _check_out_dir(out, now, False, started=lambda: True, plan=plan, tables=tables)
    msg = str(err.value)
    assert "([model] hidden_size, [model] rope_theta, [train] steps (and 1 setting derived from them) differ" in msg
    assert "head_dim" not in msg
    asked = []
    _check_out_dir(out, resolved, False, started=lambda: asked.append(1) or True, plan=plan, tables=tables)
    assert asked == []  # an unchanged config never asks whether the run started (that imports every stage)


def test_every_changed_key_is_counted():
    changed = [f"[train] k{i:02d}" for i in range(15)]
    text = describe_changes(changed, None, {"train": {k.split("] ")[1]: 1 for k in changed}})
    assert text == ", ".join(changed[:12]) + " and 3 more"


def test_a_key_a_newer_prodip_added_at_its_default_is_no_change(tmp_path):
    """A run whose saved config predates a key ([sft] replay_share, [eval] baseline) is the same run while the
    key keeps its default; set to another value, the same key is a change."""
    out = tmp_path / "run"
    config = REPO / "configs" / "demo.toml"
    resolved, plan, tables = _resolved(config, out)
    old = {k: dict(v) if isinstance(v, dict) else v for k, v in resolved.items()}
    del old["sft"]["replay_share"], old["eval"]["baseline"]
    out.mkdir()
    RunMarker(format_version=RunMarker.FORMAT_VERSION, config="config.toml").write(out / RUN_MARKER)
    (out / "config.toml").write_text(dump_toml(old), encoding="utf-8")
    plan = dataclasses.replace(plan, sft=dataclasses.replace(plan.sft, replay_share=0.0))
    now = {**resolved, "sft": {**resolved["sft"], "replay_share": 0.0}}
    _check_out_dir(out, now, False, started=lambda: True, plan=plan, tables=tables)
    plan = dataclasses.replace(plan, sft=dataclasses.replace(plan.sft, replay_share=0.25))
    now = {**resolved, "sft": {**resolved["sft"], "replay_share": 0.25}}
    with pytest.raises(OutputExists, match=r"\[sft\] replay_share"):
        _check_out_dir(out, now, False, started=lambda: True, plan=plan, tables=tables)
