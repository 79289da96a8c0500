"""Session fixtures for serve tests: a tiny tokenizer, a tiny model and its export dir (fp32 + int8)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

TEXTS = {
    "bn": ["আমি বাংলায় গান গাই। আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।",
           "চিরদিন তোমার আকাশ, তোমার বাতাস, আমার প্রাণে বাজায় বাঁশি।",
           "ক্ষুধার্ত মানুষ স্বপ্ন দেখে, বিজ্ঞান আর প্রযুক্তি এগিয়ে চলে।"] * 20,
    "en": ["The quick brown fox jumps over the lazy dog.", "Hello world, this is a small test corpus."] * 20,
}


def build_export(out: Path, *, variants=("fp32", "int8"), seed: int = 0, verdict: bool | None = True,
                 hidden_size: int = 32, layers: int = 2, max_pos: int = 128, init_std: float = 0.3):
    """Tiny tokenizer + random model -> export dir through the export/ API; returns (dir, model)."""
    import torch

    from export import hf, manifest
    from export.onnx import export_onnx
    from export.quantize import to_fp16, to_int4, to_int8
    from tokenizer.bpe import tokenizer_sha256, train_tokenizer_from_texts
    from train.config import ModelConfig
    from train.model import LlamaForCausalLM

    tok_dir = train_tokenizer_from_texts(TEXTS, 400, out.parent / f"{out.name}-tokenizer")
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(str(tok_dir / "tokenizer.json")).get_vocab_size()
    cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_pos, initializer_range=init_std)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    out.mkdir(parents=True)
    (out / "onnx").mkdir()
    hf.write_hf(model, out, tokenizer_dir=tok_dir)
    export_onnx(model, out / "onnx" / "model.onnx")
    table = {"fp32": ("onnx/model.onnx", "float32", None)}
    makers = {"fp16": (to_fp16, "float16"), "int8": (to_int8, "int8"), "int4": (to_int4, "int4")}
    for name in variants:
        if name != "fp32":
            path = f"onnx/model_{name}.onnx"
            quant = makers[name][0](out / "onnx" / "model.onnx", out / path)
            table[name] = (path, makers[name][1], quant)
    manifest.write_manifest(out, source_checkpoint={"path": "memory", "step": 0, "model_sha256": "0" * 64},
                            tokenizer_sha256=tokenizer_sha256(tok_dir),
                            variants={k: {"path": p, "format": "onnx", "dtype": d, "quantization": q}
                                      for k, (p, d, q) in table.items()})
    if verdict is not None:
        manifest.set_conformance(out, {"passed": verdict, "variants": {k: verdict for k in table},
                                       "report": "conformance/report.json", "report_sha256": "0" * 64})
    return out, model


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """(export_dir, torch model) with fp32 and int8 variants and a passing conformance verdict."""
    return build_export(tmp_path_factory.mktemp("serve") / "export")


def wait_ready(client, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.get("/health").status_code == 200:
            return
        time.sleep(0.02)
    raise TimeoutError(f"/health not 200 after {timeout_s} s: {client.get('/health').json()}")


@pytest.fixture(scope="module")
def client(tiny_export):
    """A TestClient of the fp32 variant, model loaded."""
    from fastapi.testclient import TestClient

    from serve.app import create_app
    with TestClient(create_app(tiny_export[0], "fp32", batch_wait_ms=2.0)) as c:
        wait_ready(c)
        yield c
