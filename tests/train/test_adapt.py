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
    conf = ["conformance", "--config", CONFIG, "--export-dir", str(export), "--heldout", HELDOUT]
    assert prodip_main([*conf, "--out", str(tmp_path / "conf"), "--runtimes", ""]) == 0
    result = json.loads((tmp_path / "conf" / "report.json").read_text())
    assert result["passed"] and set(result["variants"]) >= {"safetensors", "fp32"}
