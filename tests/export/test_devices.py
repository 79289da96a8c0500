"""GGUF and ExecuTorch variants: what is refused before anything is written, and the q/k permutation.

The files themselves are measured in llama.cpp and ExecuTorch by tests/conformance/test_devices.py.

    python -m pytest tests/export/test_devices.py -q
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from prodip.base.errors import InvalidInput
from prodip.export import executorch as pte_export
from prodip.export import gguf as gguf_export
from prodip.export.config import ExportConfig
from prodip.export.core import export_checkpoint
from prodip.train.config import ModelConfig
from tests import fixtures

if os.environ.get("PRODIP_REQUIRE_RUNTIMES") != "1":
    pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def gpt2_checkpoint(tmp_path_factory):
    """hidden 48 (not a multiple of Q8_0's 32 nor Q4_K's 256), GPT-2-pattern byte-level tokenizer."""
    root = tmp_path_factory.mktemp("devices")
    tok = fixtures.build_tokenizer(root / "tokenizer")
    return fixtures.build_checkpoint(root / "run", tok)


@pytest.mark.parametrize(
    ("variant", "match"),
    [
        ("gguf-q8_0", r"gguf-q8_0: Q8_0 quantises rows in blocks of 32 .* hidden_size = 48"),
        ("gguf-q4_k_m", r"gguf-q4_k_m: Q4_K quantises rows in super-blocks of 256 .* hidden_size = 48"),
        ("gguf-f16", r"llama.cpp cannot reproduce this tokenizer"),
        ("pte-8da4w", r"pte-8da4w: int4 weight groups of 32 .* hidden_size = 48"),
    ],
)
def test_unrepresentable_model_refused_before_writing(gpt2_checkpoint, tmp_path, variant, match):
    out = tmp_path / "export"
    with pytest.raises(InvalidInput, match=match):
        export_checkpoint(ExportConfig(checkpoint=str(gpt2_checkpoint), out=str(out), variants=[variant]))
    assert not out.exists()
    assert not list(tmp_path.iterdir())  # no temporary folder left either


def test_tokenizer_larger_than_embedding_refused():
    cfg = ModelConfig(vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    with pytest.raises(InvalidInput, match="gguf-f16: the tokenizer has 300 tokens but the embedding only 256"):
        gguf_export.check_representable(cfg, "gguf-f16", 300)
    gguf_export.check_representable(cfg, "gguf-q4_k_m", 256)  # 256 | hidden: fine
    pte_export.check_representable(dataclasses.replace(cfg, intermediate_size=704), "pte-8da4w", 32)
    with pytest.raises(InvalidInput, match="intermediate_size = 704"):
        pte_export.check_representable(dataclasses.replace(cfg, intermediate_size=704), "pte-8da4w", 128)


def test_device_variants_are_opt_in():
    assert not {"gguf-f16", "pte-fp32"} & set(ExportConfig().variants)
    with pytest.raises(InvalidInput, match="pte_group_size must be a power of 2"):
        ExportConfig(pte_group_size=24)


def test_permute_matches_llama_cpp_pair_layout():
    """After the permute, rows (2j, 2j+1) of each head are rotate-half rows (j, j + Dh/2): the pairs
    GGML's normal RoPE rotates together (llama.cpp conversion/llama.py LlamaModel.permute)."""
    heads, dh, d = 3, 8, 5
    w = torch.arange(heads * dh * d, dtype=torch.float32).reshape(heads * dh, d)
    p = gguf_export.permute_qk(w, heads)
    for h in range(heads):
        for j in range(dh // 2):
            assert torch.equal(p[h * dh + 2 * j], w[h * dh + j])
            assert torch.equal(p[h * dh + 2 * j + 1], w[h * dh + j + dh // 2])
    kv = gguf_export.permute_qk(w[: 2 * dh], heads, 2)  # k: the KV head count decides
    assert torch.equal(kv[1], w[dh // 2])
