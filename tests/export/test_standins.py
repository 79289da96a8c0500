"""The stand-in builders (tests/standins.py) give folders transformers reads as the real models'."""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer

from tests.standins import KINDS, build_standin

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    root = tmp_path_factory.mktemp("standins")
    return {k: build_standin(k, root / k) for k in KINDS}


def test_tokenizers_agree_and_bangla_falls_into_the_trap(standins):
    """transformers' tokenizer gives tokenizers' ids; Bangla gets under 0.5 chars/token, English over 2."""
    bn = open("data/heldout/udhr_ben.txt", encoding="utf-8").read()[:3000]
    en = open("data/heldout/udhr_eng.txt", encoding="utf-8").read()[:3000]
    for kind, folder in standins.items():
        fast = transformers.AutoTokenizer.from_pretrained(folder)
        raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
        for text in (bn, en):
            assert fast(text)["input_ids"] == raw.encode(text).ids, kind
        assert len(bn) / len(raw.encode(bn).ids) < 0.5, kind
        assert len(en) / len(raw.encode(en).ids) > 2.0, kind


def test_special_tokens_where_the_real_ones_are(standins):
    smol = transformers.AutoTokenizer.from_pretrained(standins["smollm2"])
    assert smol.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    llama = transformers.AutoTokenizer.from_pretrained(standins["llama32"])
    n = len(llama) - 256
    assert llama.convert_tokens_to_ids(["<|begin_of_text|>", "<|eot_id|>"]) == [n, n + 9]
    assert llama("a")["input_ids"][0] == n  # the bos is prepended by the post-processor
    cfg = json.loads((standins["llama32"] / "config.json").read_text())
    assert cfg["eos_token_id"] == [n + 1, n + 8, n + 9]
    assert cfg["rope_parameters"]["rope_type"] == "llama3"
    qwen = json.loads((standins["qwen25"] / "config.json").read_text())
    assert qwen["model_type"] == "qwen2" and qwen["vocab_size"] > len(
        transformers.AutoTokenizer.from_pretrained(standins["qwen25"])
    )


def test_rope_spelling_v4_is_the_same_model(standins, tmp_path):
    """The transformers-4 spelling (rope_theta + rope_scaling) loads to the same logits as the 5 one."""
    v4 = build_standin("llama32", tmp_path / "v4", rope_spelling="v4")
    cfg = json.loads((v4 / "config.json").read_text())
    assert "rope_parameters" not in cfg and cfg["rope_scaling"]["rope_type"] == "llama3"
    ids = torch.arange(1, 200)[None] % 1000
    a = transformers.AutoModelForCausalLM.from_pretrained(standins["llama32"])(ids).logits
    b = transformers.AutoModelForCausalLM.from_pretrained(v4)(ids).logits
    assert torch.equal(a, b)


@pytest.mark.slow
def test_quantised_agreement_needs_a_trained_standin(tmp_path):
    """Why the quantised variants of the random stand-ins miss conformance/tolerances.toml: a random model's
    next-token distributions are flat (top-1 probability ~1/V), its top two logits near ties, and int8's
    rounding flips the argmax at more than 5% of held-out positions; after 300 AdamW steps on the bundled
    text (``train_steps``, from the real configs' initializer_range 0.02) the same int8 scheme keeps the
    shipped int8 bound (top1 >= 0.95) and int4 the shipped int4 KL bound (kl_mean <= 0.02 per language;
    from the random stand-ins' std 0.125 it was 0.024-0.027)."""
    import unicodedata

    import numpy as np

    from prodip.conformance.compare import (
        bits_per_char,
        heldout_shift,
        kl_per_position,
        load_tolerances,
        nll_per_position,
    )
    from prodip.conformance.config import DEFAULT_TOLERANCES
    from prodip.conformance.runners import OrtRunner
    from prodip.export.config import ExportConfig
    from prodip.export.core import export_checkpoint
    from prodip.train.init import apply_init, load_init
    from prodip.train.model import LlamaForCausalLM

    texts = [
        unicodedata.normalize("NFC", open(f"data/heldout/udhr_{lang}.txt", encoding="utf-8").read())
        for lang in ("ben", "eng")
    ]
    figures: dict = {}
    shifts: dict = {}
    for steps in (0, 300):
        folder = build_standin("qwen25", tmp_path / f"qwen25-{steps}", max_position_embeddings=1024, train_steps=steps)
        out = export_checkpoint(
            ExportConfig(checkpoint=str(folder), out=str(tmp_path / f"export-{steps}"), variants=["int8", "int4"])
        )
        init = load_init(folder, tokenizer_sha256=None)
        model = LlamaForCausalLM(init.config)
        apply_init(model, init)
        c = init.config
        runners = {
            name: OrtRunner(
                out / "onnx" / f,
                name,
                num_layers=c.num_hidden_layers,
                num_kv_heads=c.num_key_value_heads,
                head_dim=c.head_dim,
                threads=1,
            )
            for name, f in (("int8", "model_quantized.onnx"), ("int4", "model_q4.onnx"))
        }
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        agree, p_top1, kl4 = [], [], []
        for lang, text in zip(("bn", "en"), texts):
            ids = np.asarray([tok.encode(text).ids[:512]], dtype=np.int64)
            with torch.no_grad():
                ref = model.eval()(torch.from_numpy(ids))[0]
            pos = np.arange(ids.shape[1])[None]
            got = runners["int8"].forward(ids, np.ones_like(ids), pos)[0][0]
            if steps and lang == "bn":
                r, y = ref.numpy()[:-1], ids[0, 1:]
                shifts[lang] = (
                    heldout_shift(r, got[:-1], y),
                    nll_per_position(r, y).sum(),
                    len(tok.decode(y.tolist())),
                )
            agree.append(float((got.argmax(-1) == ref.argmax(-1).numpy()).mean()))
            p_top1.append(float(torch.softmax(ref, -1).max(-1).values.median()))
            q4 = runners["int4"].forward(ids, np.ones_like(ids), pos)[0][0]
            kl4.append(float(kl_per_position(ref.numpy(), q4).mean()))
        figures[steps] = (min(agree), max(p_top1), max(kl4))
    print(figures)
    assert figures[0][0] < 0.95 <= figures[300][0], figures
    assert figures[0][1] < 0.05 < figures[300][1], figures
    assert figures[300][2] <= load_tolerances(DEFAULT_TOLERANCES)["int4"]["kl_mean"]["max"], figures
    # the trained stand-in's int8 Bangla bits/char change (what misses the shipped 0.01, docs/adapt.md) is the
    # model's, not the quantiser's: the KL part is far inside the bound; the rest is many standard deviations of
    # what the model's own text would give, on a text it predicts far worse than its own entropy says
    shift, ref_nll, chars = shifts["bn"]
    bound = load_tolerances(DEFAULT_TOLERANCES)["int8"]["bpc_delta_max"]["max"]
    assert bits_per_char(shift.kl, chars) < bound / 5, (shift, chars)
    assert abs(shift.text) > 3 * shift.text_sd, shift
    assert shift.ref_entropy < 0.6 * ref_nll, (shift, ref_nll)


#: Texts where a SentencePiece-derived tokenizer's runtimes part if they rebuild its pipeline: leading and
#: repeated spaces (SentencePiece keeps each as "▁"), text after a special token (tokenizer.json prepends "▁").
SPACE_TEXTS = (" leading", "  two leading", "a  b", "a</s>b", "a</s> b", "</s>\n<|user|>\nHi", "x\n y", "আমি ভাত খাই")


def test_sentencepiece_standin_runs_as_written_everywhere(standins, tmp_path):
    """TinyLlama's tokenizer.json (SentencePiece-derived) is the truth; its export names a class that runs it as
    written, so transformers 5 gives its ids on leading spaces and after </s> (its LlamaTokenizer rebuilds the
    pipeline with Metaspace "first" and drops them); the stand-in's pieces never cross a "▁" (as SentencePiece's),
    so onnxruntime-genai, which splits at "▁", gives them too; a byte-level BPE's config is left as it is."""
    from prodip.export.config import ExportConfig
    from prodip.export.core import export_checkpoint
    from prodip.tokenizer.portable import tokenizer_config_as_written

    folder = standins["tinyllama"]
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    crossing = [p for p in raw.get_vocab() if "▁" in p.lstrip("▁")]
    assert not crossing, crossing[:5]
    out = export_checkpoint(ExportConfig(checkpoint=str(folder), out=str(tmp_path / "export"), variants=["fp32"]))
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"] == "LlamaTokenizer"
    tok = transformers.AutoTokenizer.from_pretrained(out)
    for text in SPACE_TEXTS:
        assert tok(text)["input_ids"] == raw.encode(text).ids, text
        assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == raw.decode(raw.encode(text).ids)
    assert "".join(raw.encode(" leading").tokens[1:]) == "▁▁leading"  # SentencePiece's: dummy prefix + the space
    smol = json.loads((standins["smollm2"] / "tokenizer.json").read_text())
    smol_cfg = json.loads((standins["smollm2"] / "tokenizer_config.json").read_text())
    assert tokenizer_config_as_written(smol, smol_cfg) == smol_cfg
    try:
        import onnxruntime_genai as og
    except ImportError:
        return
    genai = og.Tokenizer(og.Model(str(out)))  # genai's encode adds no bos
    for text in SPACE_TEXTS:
        assert [int(i) for i in genai.encode(text)] == raw.encode(text, add_special_tokens=False).ids, text


@pytest.mark.slow
def test_sentencepiece_chat_ids_in_every_runtime(standins, tmp_path):
    """TinyLlama's Zephyr conversations, rendered and tokenised by each runtime from its own artifact: transformers
    (now loading tokenizer.json as written), transformers.js and llama.cpp give the reference's ids. onnxruntime-genai
    renders the template without jinja's trim_blocks (the newline after each ``{% ... %}`` tag stays), so its ids
    are exactly ``tokenizers``' on that text, and the contract fails naming it alone."""
    pytest.importorskip("gguf")
    import jinja2

    from prodip.base.chat import template_variables
    from prodip.conformance.chat import CONVERSATIONS, check_chat, reference_ids
    from prodip.export.config import ExportConfig
    from prodip.export.core import export_checkpoint

    folder = standins["tinyllama"]
    out = export_checkpoint(
        ExportConfig(checkpoint=str(folder), out=str(tmp_path / "export"), variants=["fp32", "gguf-f16"])
    )
    chat = check_chat(out, missing="skip")
    want = reference_ids(out, CONVERSATIONS)
    ran = {k: v for k, v in chat["runtimes"].items() if v.get("ids") is not None}
    assert {"transformers", "llama.cpp"} <= set(ran), sorted(chat["runtimes"])
    for name in set(ran) - {"onnxruntime-genai"}:
        assert ran[name]["ids"] == want, name
    ids_check = next(c for c in chat["checks"] if c["metric"] == "chat_template_ids_identical")
    if "onnxruntime-genai" not in ran:
        assert ids_check["passed"] is True
        return
    template = json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    untrimmed = jinja2.Environment(trim_blocks=False, lstrip_blocks=False).from_string(template)
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    variables = template_variables(out)
    genai_want = {
        k: raw.encode(
            untrimmed.render(messages=m, add_generation_prompt=True, **variables), add_special_tokens=False
        ).ids
        for k, m in CONVERSATIONS.items()
    }
    assert ran["onnxruntime-genai"]["ids"] == genai_want
    assert ids_check["passed"] is False and ids_check["note"] == "ids differ from the reference in: onnxruntime-genai"
