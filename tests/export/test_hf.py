"""HF-layout export: safetensors round trip, tied weights stored once, transformers loads it."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors import safe_open

from prodip.export.hf import load_hf_state
from tests.export.conftest import source_model


def _ids(vocab: int, T: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, min(vocab, 512), (2, T), generator=torch.Generator().manual_seed(seed))


def test_safetensors_round_trip_identical_logits(any_export):
    from prodip.train.model import LlamaForCausalLM

    ref = source_model(any_export)
    config, tensors = load_hf_state(any_export)
    assert config == ref.config
    model = LlamaForCausalLM(config)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.load_state_dict(tensors, strict=True)
    model.eval()
    ids = _ids(config.vocab_size)
    with torch.no_grad():
        assert torch.equal(model(ids), ref(ids))


def test_config_json_and_tied_weight_stored_once(any_export):
    cfg = json.loads((any_export / "config.json").read_text())
    ref = source_model(any_export).config
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["model_type"] == "llama"
    assert cfg["torch_dtype"] == cfg["dtype"] == "float32"
    for key, value in ref.to_dict().items():
        assert cfg[key] == value, key
    with safe_open(str(any_export / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
    assert ("lm_head.weight" in keys) == (not ref.tie_word_embeddings)
    assert "model.embed_tokens.weight" in keys
    gen = json.loads((any_export / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 0)
    # tokenizer_config.json states the model's context (the tokenizer dir's says its own default, 2048)
    tok = json.loads((any_export / "tokenizer_config.json").read_text())
    assert tok["model_max_length"] == cfg["max_position_embeddings"] != 2048
    assert [tok[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")] == [1, 2, 0]


def _hf_load(export_dir, caplog):
    """AutoModelForCausalLM.from_pretrained with transformers' log records routed to caplog.

    Returns:
        (model, loading_info, captured log text).
    """
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.enable_propagation()  # transformers' own handler does not reach pytest otherwise
    try:
        with caplog.at_level(logging.INFO):
            model, info = transformers.AutoModelForCausalLM.from_pretrained(str(export_dir), output_loading_info=True)
    finally:
        hf_logging.disable_propagation()
    return model.eval(), info, caplog.text


@pytest.mark.slow
def test_transformers_loads_offline_without_key_warnings(any_export, monkeypatch, caplog):
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    ref = source_model(any_export)
    hf, info, text = _hf_load(any_export, caplog)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    for word in ("missing", "unexpected", "newly initialized", "not initialized", "mismatch"):
        assert word not in text.lower(), text
    V = ref.config.vocab_size
    ids = _ids(V, T=10)
    # positions near max_position_embeddings too: RoPE mistakes hide at small positions
    for start in (0, ref.config.max_position_embeddings - 10):
        pos = torch.arange(start, start + 10).expand(2, 10)
        with torch.no_grad():
            got = hf(input_ids=ids, position_ids=pos).logits
            want = ref(ids, position_ids=pos)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if ref.config.tie_word_embeddings:
        assert hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()


def test_transformers_key_check_is_not_vacuous(gqa_export, tmp_path, monkeypatch, caplog):
    """Negative control: the same log capture does see a missing and an unexpected key."""
    pytest.importorskip("transformers")
    import shutil

    from safetensors.torch import load_file, save_file

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    broken = shutil.copytree(gqa_export, tmp_path / "broken")
    tensors = load_file(str(broken / "model.safetensors"))
    tensors["extra.weight"] = tensors.pop("model.norm.weight")
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    _, info, text = _hf_load(broken, caplog)
    assert "model.norm.weight" in info["missing_keys"] and "extra.weight" in info["unexpected_keys"]
    assert "missing" in text.lower() and "unexpected" in text.lower()


def test_auto_tokenizer_matches_tokenizer_json(any_export, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from prodip.tokenizer.bpe import load_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(any_export))
    ours = load_tokenizer(any_export)
    text = "আমার সোনার বাংলা, the quick brown fox"
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ours.encode(text, add_special_tokens=False).ids
    assert (hf_tok.pad_token_id, hf_tok.bos_token_id, hf_tok.eos_token_id) == (0, 1, 2)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_safetensors(gqa_export, tmp_path, dtype):
    from prodip.export.hf import write_hf

    ref = source_model(gqa_export)
    write_hf(ref, tmp_path, dtype=dtype)
    config, tensors = load_hf_state(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == dtype
    for key, value in ref.state_dict().items():
        assert tensors[key].dtype == getattr(torch, dtype) and tensors[key].is_contiguous()
        assert torch.equal(tensors[key], value.to(getattr(torch, dtype)))


def test_transformers_generate_with_max_new_tokens_warns_nothing(tmp_path, caplog):
    """generation_config.json sets no max_length, so transformers' generate(max_new_tokens=...) prints no
    "Both max_new_tokens and max_length seem to have been set" (nor any other warning), and its greedy ids
    are prodip's own model's."""
    import warnings

    import transformers
    from transformers.utils import logging as hf_logging

    from tests.fixtures import build_tiny_export

    export = build_tiny_export(tmp_path, variants=["fp32"])
    assert "max_length" not in json.loads((export / "generation_config.json").read_text(encoding="utf-8"))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(export)).eval()
    ids = _ids(model.config.vocab_size, T=6)[:1]
    caplog.clear()
    hf_logging.enable_propagation()
    try:
        with caplog.at_level(logging.WARNING), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8)
    finally:
        hf_logging.disable_propagation()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [str(w.message) for w in caught] == [] and warned == [], warned
    ref = source_model(export)
    want = ids
    with torch.no_grad():
        for _ in range(8):
            want = torch.cat([want, ref(want)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert out.tolist() == want.tolist() and out.shape[1] == 14
