"""A chat model's export carries the chat contract in every artifact; a base model's carries none of it;
a checkpoint whose template is not the contract's, or that lacks the markers, is refused before writing.

python -m pytest tests/export/test_chat_export.py -q
"""

from __future__ import annotations

import json
import re

import pytest

from prodip.base.chat import CHAT_TEMPLATE, CHAT_TEMPLATE_FILE
from prodip.base.errors import InvalidInput


@pytest.fixture(scope="module")
def chat_export(tmp_path_factory):
    from tests.fixtures import build_tiny_chat_export

    return build_tiny_chat_export(tmp_path_factory.mktemp("chat_export"), variants=["fp32", "gguf-f16"])


def test_template_and_end_of_turn_in_every_artifact(chat_export):
    import gguf

    from prodip.base.manifest import load_manifest, verify_files

    export, planted = chat_export
    eot = planted["end_of_turn_id"]
    assert (export / CHAT_TEMPLATE_FILE).read_text(encoding="utf-8") == CHAT_TEMPLATE
    assert json.loads((export / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    assert json.loads((export / "generation_config.json").read_text())["eos_token_id"] == [2, eot]
    assert json.loads((export / "genai_config.json").read_text())["model"]["eos_token_id"] == [2, eot]
    reader = gguf.GGUFReader(str(export / "gguf" / "model-f16.gguf"))
    field = reader.fields["tokenizer.chat_template"]
    assert bytes(field.parts[field.data[0]]).decode() == CHAT_TEMPLATE
    eot_field = reader.fields["tokenizer.ggml.eot_token_id"]
    assert int(eot_field.parts[eot_field.data[0]][0]) == eot
    assert CHAT_TEMPLATE_FILE in load_manifest(export).files
    verify_files(export)


def test_base_model_export_has_no_chat_files(tmp_path):
    from tests.fixtures import build_tiny_export

    export = build_tiny_export(tmp_path, variants=["fp32"], max_position_embeddings=64)
    assert not (export / CHAT_TEMPLATE_FILE).exists()
    assert json.loads((export / "generation_config.json").read_text())["eos_token_id"] == 2
    assert "chat_template" not in json.loads((export / "tokenizer_config.json").read_text())


@pytest.mark.parametrize("fault", ["other_template", "no_markers"])
def test_half_chat_checkpoint_refused_before_writing(tmp_path, fault):
    from prodip.export import ExportConfig, export_checkpoint
    from prodip.tokenizer.bpe import train_tokenizer_from_texts
    from prodip.train.checkpoint import save_checkpoint
    from tests.fixtures import TINY_TEXTS, add_chat_tokens, tiny_model, tiny_model_config

    tok = train_tokenizer_from_texts(TINY_TEXTS, 300, tmp_path / "tokenizer")
    add_chat_tokens(tok)
    if fault == "other_template":
        cfg = json.loads((tok / "tokenizer_config.json").read_text())
        cfg["chat_template"] = CHAT_TEMPLATE.replace("<|im_end|>", "</s>")
        (tok / "tokenizer_config.json").write_text(json.dumps(cfg))
    else:
        tj = json.loads((tok / "tokenizer.json").read_text())
        tj["added_tokens"] = [a for a in tj["added_tokens"] if a["content"] != "<|im_start|>"]
        (tok / "tokenizer.json").write_text(json.dumps(tj))
    config = tiny_model_config(vocab_size=320, max_position_embeddings=64)
    save_checkpoint(
        tmp_path / "run" / "checkpoints", step=1, model=tiny_model(config), model_config=config, tokenizer_dir=tok
    )
    why = "differs from prodip's chat contract" if fault == "other_template" else "<|im_start|> is not a special"
    with pytest.raises(InvalidInput, match=re.escape(why)):
        export_checkpoint(ExportConfig(checkpoint=str(tmp_path / "run"), out=str(tmp_path / "out"), variants=["fp32"]))
    assert not (tmp_path / "out").exists()
