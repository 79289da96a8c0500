"""Adapting a base model with its own tokenizer, end to end on the SmolLM2 stand-in (tests/standins.py):
extend the vocabulary -> shards in the base's own special-token layout -> continued pretraining from the
extended folder -> eval against the extended base -> export -> conformance on held-out text. Each stage
runs the real CLI with configs/adapt-smollm2.toml, its paths and sizes overridden for a 2-core CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prodip.cli import main as prodip_main
from prodip.tokenizer.bpe import tokenizer_sha256
from prodip.tokenizer.shards import load_meta, read_shard, shard_paths
from prodip.train import checkpoint as ck
from tests.standins import build_standin

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "adapt-smollm2.toml")
HELDOUT = f"bn={ROOT / 'data/heldout/udhr_ben.txt'},en={ROOT / 'data/heldout/udhr_eng.txt'}"


@pytest.mark.slow
def test_continued_pretraining_of_a_base_with_its_own_tokenizer(tmp_path):
    base = build_standin("smollm2", tmp_path / "base")
    ext, shards, run = tmp_path / "extended", tmp_path / "shards", tmp_path / "train"
    bn, en = ROOT / "data/bn", ROOT / "data/en/pg11_Alice-s-Adventures-in-Wonderland.txt.gz"
    extend = ["tokenizer", "extend", "--config", CONFIG, "--base", str(base), "--out", str(ext)]
    assert prodip_main([*extend, "--inputs", f"bn={bn}", "--new-tokens", "300", "--heldout", HELDOUT]) == 0
    prepare = ["data", "prepare", "--config", CONFIG, "--tokenizer-dir", str(ext), "--out-dir", str(shards)]
    assert prodip_main([*prepare, "--inputs", f"bn={bn},en={en}", "--progress", "false"]) == 0

    # the base's layout: SmolLM2 prepends no bos, so each document is `ids <|endoftext|>` (id 0), not its eos
    meta = load_meta(shards, expected_tokenizer_sha256=tokenizer_sha256(ext))
    assert (meta.bos_id, meta.eos_id, meta.document_layout) == (None, 0, "ids <|endoftext|>")
    val = read_shard(shard_paths(shards, "bn", "val")[0])
    assert val[-1] == 0 and 1 not in val.tolist()  # <|im_start|> (the instruct configs' "bos") never written

    flags = ["--init-from", str(ext), "--tokenizer-dir", str(ext), "--shards-dir", str(shards), "--out-dir", str(run)]
    small = ["--steps", "16", "--new-embeddings-first-steps", "4", "--batch-size", "4", "--seq-len", "128"]
    more = ["--warmup-steps", "2", "--lr", "3e-3", "--min-lr", "3e-4", "--checkpoint-every-steps", "16"]
    assert prodip_main(["train", "--config", CONFIG, *flags, *small, *more, "--progress", "false"]) == 0
    _, mcfg, info = ck.load_model(run)
    assert mcfg.vocab_size == 1324 and info["tokenizer_sha256"] == tokenizer_sha256(ext)
    # the checkpoint's tokenizer copy is the extended folder's files but its weights (not a copy of the base)
    kept = {p.name for p in Path(info["tokenizer_dir"]).iterdir()}
    assert "model.safetensors" in {p.name for p in ext.iterdir()} and "model.safetensors" not in kept
    assert kept == {p.name for p in ext.iterdir()} - {"model.safetensors"}

    report = tmp_path / "eval.json"
    ev = ["eval", "--config", CONFIG, "--checkpoint", str(run), "--shards-dir", str(shards), "--baseline", str(ext)]
    assert prodip_main([*ev, "--seq-len", "128", "--eval-tokens", "2048", "--out", str(report)]) == 0
    rows = json.loads(report.read_text())["languages"]
    # continued pretraining on Bangla beats the extended base before it, on the same held-out Bangla tokens
    assert rows["bn"]["trained"]["bits_per_char"] < rows["bn"]["baseline"]["bits_per_char"] - 0.1
    # and the base before adaptation (its own, unextended tokenizer) on the same text, in bits/char
    ev[-1] = str(base)
    assert prodip_main([*ev, "--seq-len", "128", "--eval-tokens", "2048", "--out", str(report)]) == 0
    rows = json.loads(report.read_text())["languages"]
    before = rows["bn"]["baseline"]
    assert before["tokenizer_sha256"] == tokenizer_sha256(base) and before["tokens"] > rows["bn"]["tokens"]
    assert (
        before["chars"] >= rows["bn"]["chars"]
        and before["chars_per_token"] < rows["bn"]["chars"] / rows["bn"]["tokens"]
    )
    assert rows["bn"]["trained"]["bits_per_char"] < before["bits_per_char"] - 0.1

    export = tmp_path / "export"
    assert prodip_main(["export", "--config", CONFIG, "--checkpoint", str(run), "--out", str(export),
                        "--variants", "safetensors,fp32"]) == 0  # fmt: skip
    conf = [
        "conformance",
        "--config",
        CONFIG,
        "--export-dir",
        str(export),
        "--checkpoint",
        str(run),
        "--heldout",
        HELDOUT,
    ]
    assert prodip_main([*conf, "--out", str(tmp_path / "conf"), "--runtimes", ""]) == 0
    result = json.loads((tmp_path / "conf" / "report.json").read_text())
    assert result["passed"] and set(result["variants"]) >= {"safetensors", "fp32"}


@pytest.mark.slow
def test_prodip_run_adapts_the_base_end_to_end(tmp_path, capsys):
    """``prodip run configs/adapt-smollm2.toml`` on the stand-in (its base path, out_dir and sizes changed
    for a 2-core CPU): extend -> shards -> continued pretraining -> eval against the unextended base -> chat
    fine-tuning -> export -> conformance on held-out text -> completions and chat replies over HTTP; the
    summary shows the base's and the adapted model's chars/token and bits/char per language side by side."""
    import tomli_w

    from prodip.base.config import read_toml

    base = build_standin("smollm2", tmp_path / "base")
    run = tmp_path / "run"
    doc = read_toml(CONFIG)
    doc.update(out_dir=str(run), completion_max_tokens=8)
    doc["extend"].update(base=str(base), new_tokens=300)
    doc["extend"]["inputs"] = {"bn": [str(ROOT / "data/bn")]}
    doc["extend"]["heldout"] = {k: [str(ROOT / v[0])] for k, v in doc["extend"]["heldout"].items()}
    doc["data"]["inputs"] = {"bn": [str(ROOT / "data/bn")], "en": [str(ROOT / "data/en/pg11_Alice-s-Adventures-in-Wonderland.txt.gz")]}  # fmt: skip
    # trained enough (400 steps of 8 x 256 tokens, ~70 s) that every variant of the config passes the shipped bounds
    doc["train"].update(init_from=str(run / "tokenizer"), steps=400, new_embeddings_first_steps=50, batch_size=8,
                        seq_len=256, warmup_steps=20, lr=3e-3, min_lr=3e-4, checkpoint_every_steps=400)  # fmt: skip
    doc["eval"].update(baseline=str(base), seq_len=256, eval_tokens=8192)
    doc["sft"]["inputs"] = {k: [str(ROOT / v[0])] for k, v in doc["sft"]["inputs"].items()}
    doc["sft"].update(steps=40, batch_size=8, seq_len=256, warmup_steps=4, lr=1e-3, min_lr=1e-4)
    assert doc["export"]["variants"] == ["safetensors", "fp32", "int8", "gguf-f16"]  # the config's own
    doc["conformance"]["heldout"] = {k: str(ROOT / v) for k, v in doc["conformance"]["heldout"].items()}
    # the shipped tolerances; the 8192-token window checked on a 1024-token prefix (test_import_conformance.py
    # checks a GGUF over a whole 8192-token window)
    doc["conformance"].update(runtimes=[], speed=False, context_tokens=1024)
    config = tmp_path / "adapt.toml"
    config.write_text(tomli_w.dumps(doc), encoding="utf-8")

    assert prodip_main(["run", str(config)]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ok"], summary["problems"]
    ext = json.loads((run / "tokenizer" / "extension.json").read_text())
    assert ext["base"] == str(base) and ext["added_tokens"] == 300
    rows = summary["adaptation"]["languages"]
    assert summary["adaptation"]["baseline"] == str(base)
    for lang in ("bn", "en"):
        fert = ext["fertility"][lang]
        assert rows[lang]["base_chars_per_token"] == fert["chars_per_token_before"]
        assert rows[lang]["adapted_chars_per_token"] == fert["chars_per_token_after"]
        ev = summary["eval"]["languages"][lang]
        assert rows[lang]["base_bits_per_char"] == ev["baseline"]["bits_per_char"]
        assert rows[lang]["adapted_bits_per_char"] == ev["trained"]["bits_per_char"]
    # the extension bought Bangla fertility; continued pretraining bought Bangla bits/char over the base
    assert rows["bn"]["adapted_chars_per_token"] > rows["bn"]["base_chars_per_token"] + 0.3
    assert rows["bn"]["adapted_bits_per_char"] < rows["bn"]["base_bits_per_char"] - 0.1
    assert "adaptation: the base" in out and "base chars/token" in out
    # the chat model: fine-tuned with the base's ChatML template, exported, conformant, replying over HTTP
    assert summary["sft"]["after"] and summary["conformance"]["passed"]
    assert set(summary["conformance"]["variants"]) == {"safetensors", "fp32", "int8", "gguf-f16"}
    # under the shipped bounds: nothing loosened, no pass*
    assert summary["conformance"]["tolerances"]["loosened"] == [] and "pass*" not in out
    assert summary["conformance"]["chat"]["end_of_turn"]["token"] == "<|im_end|>"
    assert summary["conformance"]["chat"]["stop_ids"] == [0, 2]  # <|endoftext|> and <|im_end|>
    completions = summary["completions"]
    assert set(completions["completions"]) == {"bn", "en"} and set(completions["chat"]) == {"bn", "en"}
    assert all("reply" in c for c in completions["chat"].values()), completions["chat"]
    print(json.dumps(summary["adaptation"], indent=1))
