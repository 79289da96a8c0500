"""Issue 12: --init-from (prodip checkpoint, HF Llama folder), training longer without an lr jump,
validation measured or absent, live curves (loss.png, TensorBoard) and the interrupt message."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import numpy as np
import pytest
import torch

from prodip.cli import main as prodip_main
from prodip.train import checkpoint as ck
from prodip.train import trainer as trainer_mod
from prodip.train.checkpoint import file_sha256
from prodip.train.eval import EvalConfig, evaluate
from prodip.train.init import hf_model_config
from prodip.train.trainer import TrainConfig, train
from tests.fixtures import TINY_VOCAB, make_shards, tiny_config


def _cfg(tok, shards, out, **kw) -> TrainConfig:
    base = dict(
        shards_dir=str(shards),
        tokenizer_dir=str(tok),
        out_dir=str(out),
        steps=4,
        batch_size=2,
        seq_len=16,
        lr=3e-3,
        min_lr=3e-4,
        warmup_steps=1,
        checkpoint_every_steps=2,
        device="cpu",
        mixture={"bn": 0.6, "en": 0.4},
        progress=False,
        guards=False,
    )
    base.update(kw)
    return TrainConfig(**base)


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def new_corpus(tmp_path_factory, tiny_tokenizer_dir):
    """Shards of another corpus (one new language) encoded with the same tokenizer."""
    out = tmp_path_factory.mktemp("new_corpus")
    return make_shards(out, file_sha256(tiny_tokenizer_dir / "tokenizer.json"), TINY_VOCAB, {"hi": 6000}, seed=9)


def _eval(run_dir, shards):
    return evaluate(EvalConfig(checkpoint=str(run_dir), shards_dir=str(shards), eval_tokens=256, seq_len=16))


def test_init_from_prodip_checkpoint_on_a_new_corpus(tmp_path, tiny_tokenizer_dir, tiny_shards_dir, new_corpus):
    base = train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "base"), tiny_config())
    src, _, _ = ck.load_model(base)
    ft = tmp_path / "ft"
    corpus = shutil.copytree(new_corpus, tmp_path / "corpus")  # + two source records in its meta.json
    meta = json.loads((corpus / "meta.json").read_text())
    meta["sources"] = [
        {"name": "a", "language": "hi", "license": "CC0-1.0", "tokens_share_of_language": 0.25},
        {"name": "b", "language": "hi", "license": "MIT", "tokens_share_of_language": 0.75},
    ]
    (corpus / "meta.json").write_text(json.dumps(meta))
    argv = ["train", "--shards-dir", str(corpus), "--tokenizer-dir", str(tiny_tokenizer_dir)]
    argv += ["--out-dir", str(ft), "--init-from", str(base), "--steps", "2", "--batch-size", "2", "--seq-len", "16"]
    argv += ["--lr", "1e-9", "--min-lr", "0", "--warmup-steps", "0", "--device", "cpu", "--progress", "false"]
    argv += ["--mixture", "hi=1", "--hidden-size", "64", "--guards", "false"]  # [model] differs: the source wins
    assert prodip_main(argv) == 0
    model, cfg, info = ck.load_model(ft)
    assert info["step"] == 2 and cfg == src.config  # a fresh schedule: step counts from 0
    for (name, a), b in zip(src.named_parameters(), model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)  # lr 1e-9: the source's weights
    state = json.loads((ck.resolve_checkpoint(ft) / "trainer_state.json").read_text())
    assert state["train_config"]["init_from"] == str(base) and state["data_state"]["langs"] == ["hi"]
    card = state["data_card"]  # what the export's model card says about the data
    assert card["tokens_seen_by_language"] == {"hi": state["tokens_seen"]} == {"hi": 2 * 2 * 16}
    assert card["tokens_seen_by_source"] == {"a": 16, "b": 48} and card["sources"] == meta["sources"]
    assert card["init_from"] == {"source": f"{ck.resolve_checkpoint(base)} (step 4)", "kind": "prodip"}
    result = _eval(ft, new_corpus)
    assert result["languages"]["hi"]["trained"]["nll_nats_per_token"] > 0


def test_init_from_prodip_checkpoint_of_another_tokenizer_is_refused(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    base = train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "base", steps=1), tiny_config())
    tok2 = tmp_path / "tok2"
    shutil.copytree(tiny_tokenizer_dir, tok2)
    data = json.loads((tok2 / "tokenizer.json").read_text())
    data["model"]["vocab"]["zzzz-new"] = max(data["model"]["vocab"].values()) + 1
    (tok2 / "tokenizer.json").write_text(json.dumps(data))
    shards2 = make_shards(tmp_path / "s2", file_sha256(tok2 / "tokenizer.json"), TINY_VOCAB, {"bn": 3000})
    with pytest.raises(ValueError, match="tokenizer sha256"):
        train(_cfg(tok2, shards2, tmp_path / "ft", init_from=str(base), mixture={}), tiny_config())


def test_an_export_dir_is_an_hf_folder_to_init_from_and_no_checkpoint(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    """docs/training.md: a prodip export is a Hugging Face folder for --init-from. Its manifest.json is not a
    checkpoint's: export/eval/conformance given one name the checkpoint it came from, not a missing file."""
    from prodip.export.core import ExportConfig, export_checkpoint

    base = train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "base", steps=1), tiny_config())
    exp = export_checkpoint(ExportConfig(checkpoint=str(base), out=str(tmp_path / "exp"), variants=["safetensors"]))
    step_dir = ck.resolve_checkpoint(base)
    with pytest.raises(FileNotFoundError, match="a prodip export dir") as err:
        ck.resolve_checkpoint(exp)
    assert str(step_dir) in str(err.value)  # the checkpoint it was exported from
    src, _, _ = ck.load_model(base)
    ft = tmp_path / "ft"
    cfg = _cfg(tiny_tokenizer_dir, tiny_shards_dir, ft, init_from=str(exp), steps=1, lr=1e-9, min_lr=0.0)
    train(cfg, tiny_config())
    model, _, _ = ck.load_model(ft)
    for (name, a), b in zip(src.named_parameters(), model.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0, msg=name)  # lr 1e-9: the export's weights
    card = json.loads((ck.resolve_checkpoint(ft) / "trainer_state.json").read_text())["data_card"]
    assert card["init_from"]["kind"] == "hf"


@pytest.fixture(scope="module")
def hf_llama_dir(tmp_path_factory):
    """A tiny random Hugging Face Llama folder, written by transformers' save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    out = tmp_path_factory.mktemp("hf_llama")
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    return out


def test_init_from_hf_llama_folder_then_eval(tmp_path, tiny_tokenizer_dir, new_corpus, hf_llama_dir, caplog):
    from transformers import LlamaForCausalLM

    cfg = _cfg(tiny_tokenizer_dir, new_corpus, tmp_path / "ft", init_from=str(hf_llama_dir), mixture={}, steps=1)
    cfg = dataclasses.replace(cfg, lr=1e-9, min_lr=0.0)  # one step that leaves the weights as loaded
    with caplog.at_level(logging.WARNING):
        result = trainer_mod.run_training(cfg, tiny_config(hidden_size=256))
    assert any("tokenizer" in r.getMessage() for r in caplog.records)  # the HF folder has no tokenizer.json
    ours = result["model"].eval()
    hf = LlamaForCausalLM.from_pretrained(hf_llama_dir).eval()
    ids = torch.randint(3, TINY_VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    assert _eval(tmp_path / "ft", new_corpus)["languages"]["hi"]["trained"]["nll_nats_per_token"] > 0


@pytest.fixture(scope="module")
def hf_qwen2_dir(tmp_path_factory):
    """A tiny random Hugging Face Qwen2 folder (q/k/v biases, random rather than HF's zeros), tied."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
    out = tmp_path_factory.mktemp("hf_qwen2")
    model.save_pretrained(out, safe_serialization=True)
    return out


def test_init_from_hf_qwen2_folder_then_eval(tmp_path, tiny_tokenizer_dir, new_corpus, hf_qwen2_dir):
    """A Qwen2 folder trains and evaluates as prodip's model with q/k/v biases: after one step at lr 1e-9
    the checkpoint's logits are transformers' on the folder, and the checkpoint config keeps model_type."""
    from transformers import Qwen2ForCausalLM

    cfg = _cfg(tiny_tokenizer_dir, new_corpus, tmp_path / "ft", init_from=str(hf_qwen2_dir), mixture={}, steps=1)
    cfg = dataclasses.replace(cfg, lr=1e-9, min_lr=0.0)
    result = trainer_mod.run_training(cfg, tiny_config(hidden_size=256))
    ours = result["model"].eval()
    assert ours.config.model_type == "qwen2" and ours.model.layers[0].self_attn.q_proj.bias is not None
    hf = Qwen2ForCausalLM.from_pretrained(hf_qwen2_dir).eval()
    ids = torch.randint(3, TINY_VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    model, config, _ = ck.load_model(tmp_path / "ft")
    assert config.model_type == "qwen2"
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    assert _eval(tmp_path / "ft", new_corpus)["languages"]["hi"]["trained"]["nll_nats_per_token"] > 0


def test_hf_configs_we_cannot_represent_are_refused(tmp_path, hf_llama_dir, tiny_tokenizer_dir, new_corpus):
    data = json.loads((hf_llama_dir / "config.json").read_text())
    hf_model_config(data, source="x")  # as saved: fine
    for key, value in (
        ("rope_scaling", {"rope_type": "linear", "factor": 2.0}),
        ("attention_bias", True),
        ("mlp_bias", True),
        ("hidden_act", "gelu"),
        ("model_type", "mistral"),
    ):
        with pytest.raises(ValueError, match=key):
            hf_model_config({**data, key: value}, source="config.json")
    with pytest.raises(ValueError, match="rope_type"):
        hf_model_config({**data, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, source="config.json")
    other = tmp_path / "hf_other_vocab"
    shutil.copytree(hf_llama_dir, other)
    (other / "config.json").write_text(json.dumps({**data, "vocab_size": 32000}))
    cfg = _cfg(tiny_tokenizer_dir, new_corpus, tmp_path / "ft", init_from=str(other), mixture={}, steps=1)
    with pytest.raises(ValueError, match="differs from the tokenizer"):
        train(cfg, tiny_config())


def test_wsd_run_extends_without_lr_jump_and_cosine_extension_is_refused(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    """Issue 12: "train longer" restarted the cosine schedule (lr 3e-4 -> 1.3e-3) with only a warning."""
    wsd = _cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "wsd", steps=8, lr_schedule="wsd", decay_fraction=0.25)
    train(dataclasses.replace(wsd, max_steps_this_run=4), tiny_config())
    train(dataclasses.replace(wsd, steps=16, resume=True), tiny_config())  # extended before the decay started
    lrs = [r["lr"] for r in _rows(tmp_path / "wsd")]
    assert len(lrs) == 16 and lrs[1:12] == [wsd.lr] * 11  # flat through the old plan's decay window
    assert lrs[-1] == pytest.approx(wsd.min_lr) and all(a >= b for a, b in zip(lrs[12:], lrs[13:]))
    cos = _cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "cos", steps=8)
    train(dataclasses.replace(cos, max_steps_this_run=6), tiny_config())
    with pytest.raises(ValueError, match="jump.*--init-from"):
        train(dataclasses.replace(cos, steps=16, resume=True), tiny_config())


def test_language_without_validation_tokens_is_absent_not_zero(tmp_path, tiny_tokenizer_dir, caplog):
    """Issue 12: val_loss {"en": 0.0} was logged for a language with no validation tokens."""
    from prodip.tokenizer.shards import write_meta, write_shard

    shards = make_shards(
        tmp_path / "s", file_sha256(tiny_tokenizer_dir / "tokenizer.json"), TINY_VOCAB, {"bn": 4000, "en": 4000}
    )
    write_shard(shards / "en/val_000000.bin", np.array([5, 6, 2], dtype=np.int64), "uint16")
    meta = json.loads((shards / "meta.json").read_text())
    meta["languages"]["en"]["val"] = [{"file": "en/val_000000.bin", "n_tokens": 3}]
    write_meta(shards, {k: v for k, v in meta.items() if k != "format_version"})
    with caplog.at_level(logging.WARNING):
        train(_cfg(tiny_tokenizer_dir, shards, tmp_path / "run", eval_every_steps=2, eval_tokens=64), tiny_config())
    evals = [r["val_loss"] for r in _rows(tmp_path / "run") if "val_loss" in r]
    assert len(evals) == 2 and all(set(v) == {"bn"} and v["bn"] > 0 for v in evals)
    assert any("'en'" in r.getMessage() and "not measured" in r.getMessage() for r in caplog.records)


def test_interrupt_keeps_curves_and_names_checkpoint_and_resume_command(
    tmp_path, tiny_tokenizer_dir, tiny_shards_dir, monkeypatch, caplog
):
    """Issue 12: loss.png only at a normal end (none after Ctrl-C); no TensorBoard; no resume hint."""
    real_step = trainer_mod.train_step
    calls = []

    def step_then_interrupt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(trainer_mod, "train_step", step_then_interrupt)
    monkeypatch.setattr("sys.argv", ["prodip", "train", "--config", "c.toml"])
    run = tmp_path / "run"
    cfg = _cfg(tiny_tokenizer_dir, tiny_shards_dir, run, steps=8)
    with caplog.at_level(logging.WARNING), pytest.raises(KeyboardInterrupt):
        train(cfg, tiny_config())
    message = next(r.getMessage() for r in caplog.records if "interrupted" in r.getMessage())
    assert "step_0000002" in message and "prodip train --config c.toml --resume" in message
    assert (run / "loss.png").stat().st_size > 1000
    events = list(run.glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3]


def test_model_vocab_differing_from_the_tokenizer_is_an_error(tmp_path, tiny_tokenizer_dir, tiny_shards_dir):
    """Issue 12: a [model] vocab_size of 32,000 trained on a 4,096-token tokenizer's shards without a word."""
    with pytest.raises(ValueError, match="vocab_size = 32000 differs from the tokenizer's 320"):
        train(_cfg(tiny_tokenizer_dir, tiny_shards_dir, tmp_path / "run", steps=1), tiny_config(vocab_size=32000))


def test_interrupt_message_commands():
    from pathlib import Path

    from prodip.train.observe import interrupt_message

    ck_dir, kept = Path("r/checkpoints"), Path("r/checkpoints/step_0000002")
    assert interrupt_message(ck_dir, kept, ["/x/prodip/__main__.py", "run", "c.toml"]).endswith("-m prodip run c.toml")
    assert interrupt_message(ck_dir, kept, ["/bin/prodip", "train", "--config", "c.toml"]).endswith(
        "prodip train --config c.toml --resume"
    )
    fresh = interrupt_message(ck_dir, None, ["/bin/prodip", "train", "--config", "c.toml"])
    assert "nothing kept" in fresh and fresh.endswith(
        "prodip train --config c.toml"
    )  # no --resume without a checkpoint


def test_the_resume_hint_of_prodip_run_never_holds_force():
    """``prodip run --force`` deletes the run when its config changed: the hint after Ctrl-C leaves it out in
    every spelling, with or without a checkpoint kept."""
    from pathlib import Path

    from prodip.train.observe import interrupt_message

    ck_dir, kept = Path("r/checkpoints"), Path("r/checkpoints/step_0000002")
    for force in (["--force"], ["--force", "true"], ["--force=true"], ["--force", "false"]):
        for where in (kept, None):
            argv = ["/bin/prodip", "run", *force, "c.toml", "--out-dir", "o"]
            message = interrupt_message(ck_dir, where, argv)
            assert "--force" not in message and message.endswith("prodip run c.toml --out-dir o"), message
