"""train/trainer.py: bitwise resume on CPU, guards leave no trace, NaN stop, refusals, CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from prodip.cli import main as prodip_main
from prodip.train import checkpoint as ck
from prodip.train.guards import NonFiniteError
from prodip.train.trainer import TrainConfig, run_training, train
from tests.fixtures import make_shards, tiny_config


def _cfg(tok, shards, out, **kw) -> TrainConfig:
    base = dict(
        shards_dir=str(shards),
        tokenizer_dir=str(tok),
        out_dir=str(out),
        steps=8,
        batch_size=2,
        seq_len=16,
        grad_accum_steps=2,
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=2,
        checkpoint_every_steps=4,
        device="cpu",
        mixture={"bn": 0.6, "en": 0.4},
        progress=False,
    )
    base.update(kw)
    return TrainConfig(**base)


def _losses(run_dir):
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_resume_is_bitwise_identical(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    mcfg = tiny_config()
    straight = train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "a"), mcfg)
    half = _cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "b", max_steps_this_run=4)
    assert run_training(half, mcfg)["step"] == 4
    # a killed run's metrics past its last checkpoint are trimmed on resume
    with open(tmp_path / "b" / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 5, "loss": 99.0}) + "\n" + '{"step": 6, "lo')  # cut by a kill
    resumed = train(dataclasses.replace(half, max_steps_this_run=0, resume=True), mcfg)
    assert _losses(resumed) == _losses(straight) and len(_losses(straight)) == 8
    a = load_file(str(ck.resolve_checkpoint(straight) / "model.safetensors"))
    b = load_file(str(ck.resolve_checkpoint(resumed) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa = load_file(str(ck.resolve_checkpoint(straight) / "optimizer.safetensors"))
    ob = load_file(str(ck.resolve_checkpoint(resumed) / "optimizer.safetensors"))
    assert all(torch.equal(oa[k], ob[k]) for k in oa) and any(k.endswith("exp_avg_sq") for k in oa)
    state = json.loads((ck.resolve_checkpoint(resumed) / "trainer_state.json").read_text())
    assert state["step"] == 8 and state["tokens_seen"] == 8 * 2 * 2 * 16
    assert (resumed / "loss.png").stat().st_size > 1000
    assert "[train]" in (resumed / "config.toml").read_text()


def test_resume_with_changed_lr_warns_naming_it(tmp_path, tiny_tokenizer_dir, tiny_shards_dir, caplog):
    mcfg = tiny_config()
    half = _cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "r", steps=4, max_steps_this_run=2)
    run_training(half, mcfg)
    with caplog.at_level("WARNING", logger="prodip.train"):
        train(dataclasses.replace(half, max_steps_this_run=0, resume=True, lr=half.lr / 2), mcfg)
    warned = [r.getMessage() for r in caplog.records if "changed training settings" in r.getMessage()]
    assert len(warned) == 1 and f"lr {half.lr!r} -> {half.lr / 2!r}" in warned[0]


def test_guards_leave_no_trace(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    mcfg = tiny_config(tie_word_embeddings=True)
    on = run_training(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "on", steps=3), mcfg)["model"]
    off = run_training(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "off", steps=3, guards=False), mcfg)[
        "model"
    ]
    for (name, p), q in zip(on.named_parameters(), off.parameters()):
        assert torch.equal(p, q), name


def test_nan_stops_and_keeps_last_checkpoint(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    cfg = _cfg(
        tiny_tokenizer_dir,
        tiny_shards_dir,
        tmp_path / "run",
        steps=30,
        lr=1e30,
        min_lr=1e30,
        warmup_steps=0,
        grad_clip=0.0,
        checkpoint_every_steps=1,
        guards=False,
    )
    with pytest.raises(NonFiniteError, match="non-finite"):
        train(cfg, tiny_config())
    model, _, info = ck.load_model(tmp_path / "run")  # latest still loads and is finite
    assert info["step"] >= 1 and all(torch.isfinite(p).all() for p in model.parameters())


def test_refusals(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    other = make_shards(tmp_path / "other", "f" * 64, 320, {"bn": 2000})
    with pytest.raises(ValueError, match="tokenizer sha256"):
        train(_cfg(tiny_tokenizer_dir, other, tmp_path / "x"), tiny_config())
    with pytest.raises(ValueError, match="max_position_embeddings"):
        train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "x", seq_len=65), tiny_config())
    cfg = _cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "y", steps=1)
    train(cfg, tiny_config())
    with pytest.raises(FileExistsError, match="--resume"):
        train(cfg, tiny_config())
    with pytest.raises(ValueError, match="min_lr"):
        dataclasses.replace(cfg, min_lr=1.0)
    with pytest.raises(ValueError, match=r"lr must be > 0, got -1"):  # named as lr, not via min_lr
        dataclasses.replace(cfg, lr=-1.0)


def test_a_folder_no_run_made_is_refused_before_anything_is_written(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    """A run writes config.toml, metrics.jsonl, loss.png into --out-dir: a folder of the user's that holds
    such files is refused untouched; an empty folder, and a run stopped before its first checkpoint, are not."""
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "config.toml").write_text('name = "my project"\n')
    (mine / "metrics.jsonl").write_text("mine\n")
    with pytest.raises(FileExistsError, match="is not a training run dir") as err:
        train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, mine, steps=1), tiny_config())
    assert str(mine) in str(err.value)
    assert sorted(p.name for p in mine.iterdir()) == ["config.toml", "metrics.jsonl"]
    assert (mine / "config.toml").read_text() == 'name = "my project"\n' and (
        mine / "metrics.jsonl"
    ).read_text() == "mine\n"
    (tmp_path / "empty").mkdir()
    assert ck.resolve_checkpoint(
        train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "empty", steps=1), tiny_config())
    )
    stopped = tmp_path / "stopped"  # a run killed before its first checkpoint: its config.toml and metrics only
    stopped.mkdir()
    (stopped / "config.toml").write_text((tmp_path / "empty" / "config.toml").read_text())
    (stopped / "metrics.jsonl").write_text("")
    train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, stopped, steps=1), tiny_config())
    assert ck.load_model(stopped)[2]["step"] == 1


@pytest.mark.slow
def test_cli_reads_model_and_train_tables(tmp_path, tiny_tokenizer_dir, tiny_shards_dir, capsys):
    toml = tmp_path / "run.toml"
    toml.write_text(f"""
[model]
vocab_size = 320
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 2
max_position_embeddings = 32

[train]
shards_dir = "{tiny_shards_dir}"
tokenizer_dir = "{tiny_tokenizer_dir}"
out_dir = "{tmp_path / "run"}"
steps = 2
batch_size = 2
seq_len = 16
device = "cpu"
progress = false
""")
    assert prodip_main(["train", "--config", str(toml), "--steps", "3"]) == 0
    _, cfg, info = ck.load_model(tmp_path / "run")
    assert info["step"] == 3 and cfg.num_hidden_layers == 1
    assert prodip_main(["train", "--config", str(toml), "--steps", "4", "--resume"]) == 0
    assert ck.load_model(tmp_path / "run")[2]["step"] == 4
    assert prodip_main(["train", "--config", str(toml), "--steps", "5"]) == 2  # exists, no --resume
    assert "--resume" in capsys.readouterr().err


@pytest.mark.slow
def test_failed_tokenizer_gate_refused_unless_forced(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    import shutil

    from prodip.tokenizer.bpe import tokenizer_sha256

    tok = tmp_path / "tok"
    shutil.copytree(tiny_tokenizer_dir, tok)
    (tok / "fertility.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "tokenizer_sha256": tokenizer_sha256(tok),
                "vocab_size": 512,
                "languages": {},
                "gate": {"passed": False, "failures": ["bn: 1.2 chars/token < 2.0"]},
            }
        )
    )
    cfg = _cfg(tok, tiny_shards_dir, tmp_path / "run", steps=1)
    with pytest.raises(ValueError, match="fertility"):
        train(cfg, tiny_config())
    assert ck.load_model(train(dataclasses.replace(cfg, force=True), tiny_config()))[2]["step"] == 1


def test_an_sft_run_stopped_before_its_config_is_its_own_run_dir(tmp_path):
    """prodip sft writes tokenizer/ and sft_eval.json ("before") ahead of config.toml; if it stops there (its
    conversations refused, an interrupt), the same --out-dir must be accepted when it is run again. A folder
    with anything else beside them is still the user's."""
    from prodip.train.trainer import refuse_foreign_run_dir

    run = tmp_path / "sft"
    (run / "tokenizer").mkdir(parents=True)
    (run / "tokenizer" / "tokenizer.json").write_text("{}")
    refuse_foreign_run_dir(run)
    (run / "sft_eval.json").write_text("{}")
    refuse_foreign_run_dir(run)
    (run / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="is not a training run dir"):
        refuse_foreign_run_dir(run)
    (run / "notes.txt").unlink()
    (run / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(FileExistsError, match="is not a training run dir"):
        refuse_foreign_run_dir(run)


@pytest.fixture
def default_signal_handlers():
    """Python's own SIGINT/SIGTERM handlers, whatever an earlier test or library left installed: a process
    that ignores a signal keeps ignoring it in training (StopRequest leaves SIG_IGN alone), so these tests
    start from the handlers a command-line run has."""
    import signal

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for sig, handler in old.items():
        signal.signal(sig, handler)


@pytest.mark.usefixtures("default_signal_handlers")
def test_ctrl_c_saves_the_current_step_and_the_run_resumes_from_it(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    """SIGINT between two checkpoints (every 1000 steps): the step in progress finishes, is saved, and a
    resume continues from it, bitwise like a run that was never interrupted."""
    import os
    import signal
    import threading
    import time

    run = tmp_path / "run"
    cfg = _cfg(tiny_tokenizer_dir, tiny_shards_dir, run, steps=2000, checkpoint_every_steps=1000, guards=False)

    def interrupt_after_step_3():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            path = run / "metrics.jsonl"
            if path.exists() and len(path.read_text().splitlines()) >= 3:
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.01)

    threading.Thread(target=interrupt_after_step_3, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tiny_config())
    step = json.loads((ck.resolve_checkpoint(run) / "trainer_state.json").read_text())["step"]
    assert 3 <= step < 1000 and _losses(run) and len(_losses(run)) == step
    resumed = run_training(dataclasses.replace(cfg, resume=True, max_steps_this_run=2), tiny_config())
    assert resumed["step"] == step + 2
    straight = dataclasses.replace(cfg, out_dir=str(tmp_path / "straight"), max_steps_this_run=step + 2)
    run_training(straight, tiny_config())  # never interrupted: the same losses, step for step
    assert _losses(run) == _losses(tmp_path / "straight")


@pytest.mark.slow
@pytest.mark.usefixtures("default_signal_handlers")  # a child inherits an ignored SIGINT
def test_the_prodip_command_saves_and_exits_at_once_after_ctrl_c(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    """The command, as a user runs it: SIGINT -> the step is saved, `prodip train: interrupted`, and the
    process ends right after that line (its teardown is skipped), exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    toml = tmp_path / "run.toml"
    toml.write_text(f"""
[model]
vocab_size = 320
hidden_size = 32
intermediate_size = 64
num_hidden_layers = 1
num_attention_heads = 2
num_key_value_heads = 2
max_position_embeddings = 32

[train]
shards_dir = "{tiny_shards_dir}"
tokenizer_dir = "{tiny_tokenizer_dir}"
out_dir = "{tmp_path / "run"}"
steps = 5000
batch_size = 2
seq_len = 16
checkpoint_every_steps = 0
device = "cpu"
progress = false
""")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "prodip", "train", "--config", str(toml), "--force"],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 2) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    lines, said = [], None
    for line in proc.stderr:
        lines.append(line.rstrip())
        if line.startswith("prodip train: interrupted"):
            said = time.monotonic()
    assert proc.wait() == 130 and said is not None, lines
    assert time.monotonic() - said < 2.0
    step = json.loads((ck.resolve_checkpoint(tmp_path / "run") / "trainer_state.json").read_text())["step"]
    assert step >= 2 and any(f"saved step {step} on SIGINT" in line for line in lines)
    hint = next(line for line in lines if "resume with:" in line)
    assert hint.endswith(f"-m prodip train --config {toml} --force --resume")  # train's --force: the tokenizer gate


@pytest.mark.usefixtures("default_signal_handlers")
def test_stop_request_first_signal_asks_a_copy_is_ignored_a_later_one_stops_at_once(monkeypatch):
    import os
    import signal
    import time

    from prodip.train.trainer import StopRequest

    monkeypatch.setattr(StopRequest, "REPEAT_S", 0.3)
    before = signal.getsignal(signal.SIGINT)
    with StopRequest(announce=False) as stop:
        assert not stop.requested(torch.device("cpu"))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.signum == signal.SIGTERM and stop.requested(torch.device("cpu"))
        os.kill(os.getpid(), signal.SIGINT)  # within REPEAT_S: the same request (torchrun forwards a copy)
        time.sleep(0.05)
        time.sleep(0.3)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    assert signal.getsignal(signal.SIGINT) is before
