"""``prodip export HF_FOLDER`` and ``--init-from HF_FOLDER``: an imported model is the same model.

The stand-ins (tests/standins.py) mirror SmolLM2-135M-Instruct, Llama-3.2-1B-Instruct (llama3 RoPE
scaling, both config spellings) and Qwen2.5-0.5B-Instruct. transformers on the original folder is the
independent reference; prodip's model, the export's safetensors (reloaded by transformers), its fp32 ONNX
(ONNX Runtime) and its GGUF (llama.cpp through node-llama-cpp) are each compared with it; Qwen2's q/k/v
biases must survive each.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from prodip.base.errors import InvalidInput
from prodip.base.specials import read_specials
from prodip.train.init import apply_init, load_init
from prodip.train.model import LlamaForCausalLM
from tests.standins import build_standin

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    root = tmp_path_factory.mktemp("import_standins")
    out = {k: build_standin(k, root / k) for k in ("smollm2", "llama32", "qwen25")}
    out["llama32-v4"] = build_standin("llama32", root / "llama32-v4", rope_spelling="v4")
    return out


def _prodip(folder: Path) -> LlamaForCausalLM:
    init = load_init(folder, tokenizer_sha256=None)
    model = LlamaForCausalLM(init.config)
    apply_init(model, init)
    return model.eval()


def _reference(folder: Path, ids: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(ids, position_ids=positions).logits


@pytest.mark.parametrize("kind", ["smollm2", "llama32", "llama32-v4", "qwen25"])
def test_prodip_model_is_the_transformers_model(standins, kind):
    """Same logits as transformers, at short and at long positions (beyond llama3's original 8192,
    where the scaled low frequencies matter); the special ids are the tokenizer's."""
    folder = standins[kind]
    model = _prodip(folder)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=gen)
    for offset in (0, 20_000):
        positions = (torch.arange(48) + offset)[None].expand(2, -1)
        with torch.no_grad():
            mine = model(ids, position_ids=positions)
        diff = (mine - _reference(folder, ids, positions)).abs().max().item()
        assert diff < 1e-4, (kind, offset, diff)
    specials = read_specials(folder)
    assert model.config.eos_token_id == specials.eos_id
    # Qwen2's tokenizer names no bos: config.json's bos_token_id (<|endoftext|>) stands, never prepended
    want_bos = (
        specials.bos_id
        if specials.bos_id is not None
        else json.loads((folder / "config.json").read_text())["bos_token_id"]
    )
    assert model.config.bos_token_id == want_bos


def test_qwen2_biases_are_computed(standins):
    """Qwen2's q/k/v biases are loaded and used (o_proj has none): zeroing them changes the logits."""
    model = _prodip(standins["qwen25"])
    assert model.config.model_type == "qwen2" and model.config.qkv_bias
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias.abs().sum() > 0 and attn.o_proj.bias is None
    ids = torch.arange(1, 33)[None]
    with torch.no_grad():
        before = model(ids)
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.zero_()
        assert (model(ids) - before).abs().max() > 1e-2


def test_llama3_scaling_changes_the_model(standins):
    """The llama3 scaling is computed, not ignored: without it the logits at long positions differ."""
    import dataclasses

    model = _prodip(standins["llama32"])
    plain = LlamaForCausalLM(dataclasses.replace(model.config, rope_scaling=None))
    plain.load_state_dict(model.state_dict())
    ids = torch.arange(1, 33)[None]
    positions = (torch.arange(32) + 20_000)[None]
    with torch.no_grad():
        assert (model(ids, position_ids=positions) - plain.eval()(ids, position_ids=positions)).abs().max() > 1e-2


def _edited(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_refusals_name_the_key(standins, tmp_path):
    folder = _edited(standins["qwen25"], tmp_path / "swa", use_sliding_window=True, sliding_window=4096)
    with pytest.raises(InvalidInput, match="config.json: use_sliding_window = true"):
        load_init(folder, tokenizer_sha256=None)
    layers = ["full_attention", "sliding_attention"]
    folder = _edited(standins["qwen25"], tmp_path / "swa-layers", layer_types=layers)
    with pytest.raises(InvalidInput, match="layer_types holds 'sliding_attention'"):
        load_init(folder, tokenizer_sha256=None)
    folder = _edited(standins["qwen25"], tmp_path / "gemma", model_type="gemma")
    with pytest.raises(InvalidInput, match="model_type = 'gemma'; prodip imports Llama and Qwen2 models"):
        load_init(folder, tokenizer_sha256=None)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192, "rope_theta": 1e5}
    folder = _edited(standins["smollm2"], tmp_path / "yarn", rope_parameters=yarn)
    with pytest.raises(InvalidInput, match="rope_parameters: rope_type 'yarn' is not supported"):
        load_init(folder, tokenizer_sha256=None)
    folder = _edited(standins["smollm2"], tmp_path / "dyn", rope_parameters=None, rope_scaling={"type": "dynamic"})
    with pytest.raises(InvalidInput, match="rope_scaling: rope_type 'dynamic'"):
        load_init(folder, tokenizer_sha256=None)
    folder = _edited(standins["smollm2"], tmp_path / "mistral", model_type="mistral")
    with pytest.raises(InvalidInput, match="model_type = 'mistral': sliding-window"):
        load_init(folder, tokenizer_sha256=None)
    folder = _edited(standins["smollm2"], tmp_path / "bias", attention_bias=True)
    with pytest.raises(InvalidInput, match="attention_bias = True"):
        load_init(folder, tokenizer_sha256=None)


def test_import_errors_name_the_command_and_a_missing_size_key(standins, tmp_path, capsys):
    """``prodip export FOLDER`` reads the folder as ``--init-from`` does, but its errors name the command the
    user typed: a config.json that disagrees with the weights names the tensor and both shapes; one without a
    size key names the key (transformers would fill in a 7B Llama's size) before any tensor is compared."""
    from prodip.cli import main

    vocab = json.loads((standins["smollm2"] / "config.json").read_text())["vocab_size"]
    wide = _edited(standins["smollm2"], tmp_path / "wide", hidden_size=512)
    assert main(["export", str(wide), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"prodip export: error: prodip export {wide.resolve()} (Hugging Face Llama): model.embed_tokens.weight "
        f"has shape ({vocab}, 64), config implies ({vocab}, 512)"
    )
    # train and eval name their own option; --init-from stays the default
    for option in ("--init-from", "--baseline"):
        kw = {} if option == "--init-from" else {"option": option}
        with pytest.raises(InvalidInput, match=rf"^{option} {wide} \(Hugging Face Llama\): model\.embed_tokens"):
            apply_init(
                LlamaForCausalLM(load_init(wide, tokenizer_sha256=None, **kw).config),
                load_init(wide, tokenizer_sha256=None, **kw),
            )
    narrow = _edited(standins["smollm2"], tmp_path / "narrow", hidden_size=None)
    assert main(["export", str(narrow), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"prodip export: error: {narrow.resolve() / 'config.json'}: missing 'hidden_size' (")
    assert "\n" not in err and "shape" not in err
    both = _edited(standins["qwen25"], tmp_path / "both", vocab_size=None, num_hidden_layers=None)
    with pytest.raises(InvalidInput, match=r"both/config\.json: missing 'vocab_size', 'num_hidden_layers' \("):
        load_init(both, tokenizer_sha256=None, option="--baseline")
    assert not (tmp_path / "out").exists()


def test_keys_a_config_may_omit_mean_what_they_mean_to_transformers():
    """A config.json without num_key_value_heads or rms_norm_eps (older Llama configs) is the model transformers
    builds from it: no GQA and epsilon 1e-6, not ModelConfig's own defaults."""
    from prodip.train.init import hf_model_config

    data = {
        "model_type": "llama",
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 256,
    }
    ours = hf_model_config(data, source="config.json")
    theirs = transformers.LlamaConfig(**{k: v for k, v in data.items() if k != "model_type"})
    assert (
        (ours.num_key_value_heads, ours.rms_norm_eps) == (theirs.num_key_value_heads, theirs.rms_norm_eps) == (4, 1e-6)
    )
    given = hf_model_config({**data, "num_key_value_heads": 2, "rms_norm_eps": 1e-5}, source="config.json")
    assert (given.num_key_value_heads, given.rms_norm_eps) == (2, 1e-5)


def test_qwen2_gguf_with_rope_scaling_is_refused_by_name():
    """llama.cpp's qwen2 architecture reads no rope_freqs tensor: a qwen2 model with llama3 scaling has no GGUF."""
    from prodip.export.gguf import check_representable
    from prodip.train.config import ModelConfig

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    cfg = ModelConfig(vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, model_type="qwen2",
                      rope_scaling={**scaling, "original_max_position_embeddings": 8192})  # fmt: skip
    with pytest.raises(InvalidInput, match="gguf-f16: rope_scaling 'llama3' with model_type 'qwen2'"):
        check_representable(cfg, "gguf-f16")
    plain = ModelConfig(
        vocab_size=256, hidden_size=64, num_attention_heads=4, num_key_value_heads=4, model_type="qwen2"
    )
    check_representable(plain, "gguf-f16")


def test_specials_are_read_from_the_tokenizer(standins):
    smol, llama, qwen = (read_specials(standins[k]) for k in ("smollm2", "llama32", "qwen25"))
    assert (smol.bos_id, smol.eos_id, smol.pad_id, smol.add_bos) == (1, 2, 2, False)
    # its configs list only <|im_end|>; its end of text <|endoftext|> (0) ends documents, and so generation
    assert smol.stop_ids == (2, 0) and smol.document_end_id == 0
    n = llama.bos_id
    assert llama.add_bos and llama.eos_id == n + 9 and set(llama.stop_ids) == {n + 1, n + 8, n + 9}
    assert llama.document_end_id == n + 1  # <|end_of_text|>
    assert qwen.bos_id is None and not qwen.add_bos and qwen.document_end_id == 1024 and 1024 in qwen.stop_ids


def _export(folder: Path, out: Path, variants: str, *extra: str) -> Path:
    from prodip.cli import main

    assert main(["export", str(folder), "--out", str(out), "--variants", variants, *extra]) == 0
    return out


def _ort_logits(path: Path, config, ids: np.ndarray) -> np.ndarray:
    from prodip.conformance.runners import OrtRunner

    runner = OrtRunner(
        path,
        path.stem,
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
    )
    mask = np.ones_like(ids)
    return runner.forward(ids, mask, np.arange(ids.shape[1])[None].repeat(ids.shape[0], 0))[0]


_ONNX_FILES = {"fp32": "model.onnx", "fp16": "model_fp16.onnx", "int8": "model_quantized.onnx", "int4": "model_q4.onnx"}
#: Variants that hold the same weights (or float16 ones): the original's argmax almost everywhere.
_EXACT = ("safetensors", "fp32", "fp16", "gguf-f16")


def _gguf_logits(path: Path, ids: np.ndarray) -> np.ndarray:
    from prodip.conformance.device_runners import LlamaCppRunner

    runner = LlamaCppRunner(path, "gguf", context=ids.shape[1], rows=1)
    try:
        return runner.forward(ids, np.ones_like(ids), np.arange(ids.shape[1])[None])[0]
    finally:
        runner.close()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["smollm2", "llama32", "qwen25"])
def test_export_matches_transformers_on_the_original_folder(standins, tmp_path, kind):
    """safetensors (transformers on the export), fp32 and fp16 ONNX (ONNX Runtime) and gguf-f16 (llama.cpp):
    the original folder's logits; the chat template, end of turn and stop ids travel unchanged. The
    quantised variants' figures are printed (conformance gates them, tests/conformance)."""
    pytest.importorskip("gguf")
    folder = standins[kind]
    out = _export(folder, tmp_path / "export", "fp32,fp16,int8,int4,gguf-f16,gguf-q8_0")
    config = _prodip(folder).config
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    text = "Alice was beginning to get very tired. আমার সোনার বাংলা।"
    ids = np.asarray([tok(text)["input_ids"]], dtype=np.int64)
    ref = _reference(folder, torch.from_numpy(ids)).numpy()
    got = {
        "safetensors": _reference(out, torch.from_numpy(ids)).numpy(),
        **{v: _ort_logits(out / "onnx" / f, config, ids) for v, f in _ONNX_FILES.items()},
        **{v: _gguf_logits(out / "gguf" / f"model-{v[5:]}.gguf", ids) for v in ("gguf-f16", "gguf-q8_0")},
    }
    diffs = {k: float(np.abs(v - ref).max()) for k, v in got.items()}
    print(kind, {k: f"{v:.1e}" for k, v in diffs.items()})
    assert diffs["safetensors"] < 1e-5 and diffs["fp32"] < 1e-4, diffs
    assert diffs["fp16"] < 5e-2 and diffs["gguf-f16"] < 5e-2, diffs
    assert all((got[k].argmax(-1) == ref.argmax(-1)).mean() > 0.9 for k in _EXACT), diffs
    hf = json.loads((out / "config.json").read_text())
    src = json.loads((folder / "config.json").read_text())
    assert (hf["model_type"], hf["architectures"]) == (src["model_type"], src["architectures"])
    assert json.loads((out / "genai_config.json").read_text())["model"]["type"] == src["model_type"]
    import gguf

    reader = gguf.GGUFReader(str(out / "gguf" / "model-f16.gguf"))
    assert reader.get_field("general.architecture").contents() == ("qwen2" if kind == "qwen25" else "llama")
    biases = {t.name for t in reader.tensors if t.name.endswith(".bias")}
    want = {f"blk.{i}.attn_{p}.bias" for i in range(config.num_hidden_layers) for p in "qkv"}
    assert biases == (want if kind == "qwen25" else set())
    # every ONNX variant keeps one packed q/k/v bias per layer through the float16/int8/int4 surgery
    width = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    for f in _ONNX_FILES.values():
        proto = onnx.load(str(out / "onnx" / f))
        shapes = {i.name: tuple(i.dims) for i in proto.graph.initializer}
        n = sum(shapes.get(x) == (width,) for node in proto.graph.node if node.op_type == "Add" for x in node.input)
        assert n == (config.num_hidden_layers if kind == "qwen25" else 0), (f, n)
    # the chat template and the stop ids, unchanged
    src_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == src_cfg["chat_template"]
    assert (out / "chat_template.jinja").read_text() == src_cfg["chat_template"]
    want = read_specials(folder).stop_ids
    eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert set(eos if isinstance(eos, list) else [eos]) == set(want)
    genai = json.loads((out / "genai_config.json").read_text())["model"]["eos_token_id"]
    assert set(genai if isinstance(genai, list) else [genai]) == set(want)
    msgs = [{"role": "user", "content": "hi"}]
    assert transformers.AutoTokenizer.from_pretrained(str(out)).apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=False
    ) == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


def test_card_base_model_is_a_hub_id_or_absent(standins, tmp_path, capsys):
    from prodip.base.manifest import load_manifest

    out = _export(standins["smollm2"], tmp_path / "with-id", "fp32", "--base-model-id", "HuggingFaceTB/SmolLM2-135M")
    card = load_manifest(out).card
    assert card.base_model == "HuggingFaceTB/SmolLM2-135M"
    readme = (out / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M" in readme and "exported unchanged" in readme
    out = _export(standins["smollm2"], tmp_path / "no-id", "fp32")
    assert load_manifest(out).card.base_model is None
    readme = (out / "README.md").read_text()
    assert "base_model" not in readme and str(standins["smollm2"]) not in readme
    assert "a local Hugging Face model folder" in readme
    from prodip.cli import main

    bad = ["export", str(standins["smollm2"]), "--out", str(tmp_path / "bad"), "--base-model-id", str(tmp_path / "m")]
    assert main(bad) == 2
    assert "a Hub id is owner/name" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_prodips_tokenizer_reader_names_an_imported_tokenizer_in_one_line(standins):
    """``load_tokenizer`` holds a tokenizer to prodip's special-token ids; an imported one is named as such (the
    stages read it with ``load_with_specials``, tests/tokenizer/test_encode.py), not as a bad id."""
    from prodip.tokenizer.bpe import load_tokenizer

    with pytest.raises(InvalidInput, match="an imported model's own tokenizer .*prodip export FOLDER"):
        load_tokenizer(standins["llama32"])


def test_a_pte_window_too_large_to_plan_is_refused_before_any_work(standins, tmp_path, capsys, monkeypatch):
    """ExecuTorch plans memory for a whole-window prompt; at Llama 3.2's 131072 tokens the attention scores alone
    (3 float32 tensors of H x S x 2S) are 1536 GiB, known from config.json: refused in one line before the ONNX
    export or the lowering start (both of which took 38 s before the plan was looked at), nothing written."""
    pytest.importorskip("executorch")
    from prodip.cli import main
    from prodip.export import core
    from prodip.export.executorch import PLANNED_MEMORY_LIMIT, planned_memory_floor

    config = _prodip(standins["llama32"]).config
    H, S = config.num_attention_heads, config.max_position_embeddings
    assert (H, S) == (4, 131072)
    assert planned_memory_floor(config) == 3 * H * S * 2 * S * 4 == 1536 * 2**30
    assert planned_memory_floor(config, 8192) == 6 * 2**30 and planned_memory_floor(config, 1024) == 3 * 2**25

    def never(*args, **kwargs):
        raise AssertionError("the export started before the plan size was checked")

    monkeypatch.setattr(core, "export_onnx", never)
    monkeypatch.setattr(core.pte_export, "export_pte", never)
    # the longest window whose floor fits: 3 * 4 * 2 * 4 * N^2 <= 4 GiB; the advice leaves room for the plan's
    # measured excess over the floor (1.6x), in steps of 64 tokens
    longest = max(n for n in range(6000, 7000) if 96 * n * n <= PLANNED_MEMORY_LIMIT)
    advised = max(n for n in range(0, longest, 64) if 96 * n * n * 1.6 <= PLANNED_MEMORY_LIMIT)
    assert (longest, advised) == (6688, 5248)
    out = tmp_path / "pte"
    assert main(["export", str(standins["llama32"]), "--out", str(out), "--variants", "fp32,pte-fp32"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "prodip export: error: pte-fp32: the program would plan at least 1536.0 GiB of working memory for a window "
        "of 131072 tokens (max_position_embeddings = 131072; ExecuTorch sizes its buffers for a whole-window "
        "prompt, attention scores S x 2S per head), over the 4 GiB a device runtime can allocate; export the .pte "
        f"with a shorter window: --pte-max-seq-len N ([export] pte_max_seq_len), N at most {advised} for 4 "
        "attention heads (allowing 1.6x these scores for the whole plan)"
    )
    assert not out.exists() and not list(tmp_path.glob(".pte.*"))
    args = ["export", str(standins["smollm2"]), "--out", str(out), "--variants", "pte-8da4w"]
    assert main([*args, "--pte-max-seq-len", str(longest + 1)]) == 2
    assert "plan at least 4.0 GiB of working memory for a window of 6689 tokens (pte_max_seq_len" in (
        capsys.readouterr().err
    )
    assert not out.exists()


def test_the_advised_pte_window_fits_the_plan_limit():
    """The refusals advise a window that fits when followed. Up front (config only): the floor 96 * N^2 bytes
    (4 heads) times the allowance for the rest of the plan, 1.6, is within 4 GiB at the advice and over it 64
    tokens later. After the lowering, from the real plan: the Llama 3.2 stand-in's at S = 6688, 4.68 GiB (the
    window the floor alone had advised), gives 6144, whose lowered plan measured 3.95 GiB; and a plan whose
    excess over the floor is linear in S is solved exactly, where scaling it as S^2 would overshoot."""
    from types import SimpleNamespace

    from prodip.export.executorch import PLANNED_MEMORY_LIMIT as limit
    from prodip.export.executorch import longest_window

    config = SimpleNamespace(num_attention_heads=4, max_position_embeddings=131072)
    n = longest_window(config)
    assert n == 5248 and n % 64 == 0
    assert 96 * n**2 * 1.6 <= limit < 96 * (n + 64) ** 2 * 1.6
    # measured with ExecuTorch 1.5 (XNNPACK, fp32): non_const_buffer_sizes of the stand-in's lowered program
    plan_6688, plan_6144 = 5_024_293_184, 4_241_276_992
    late = longest_window(config, plan_6688, 6688)
    assert late == 6144 < 6688 and plan_6144 < limit
    # a plan of 96 S^2 + 128 KiB * S bytes at S = 8192 (7 GiB): the linear part is kept in proportion
    S, e = 8192, 2**17
    late = longest_window(config, 96 * S * S + e * S, S)
    assert late % 64 == 0 and 96 * late**2 + e * late <= limit < 96 * (late + 64) ** 2 + e * (late + 64)
    naive = int(S * (limit / (96 * S * S + e * S)) ** 0.5) // 64 * 64
    assert naive > late and 96 * naive**2 + e * naive > limit
    # the window just refused is never advised, however close to the limit its plan is
    assert longest_window(config, limit + 1, 4160) < 4160


def test_an_int4_block_size_that_blocks_no_weight_is_refused_before_any_work(standins, tmp_path, capsys, monkeypatch):
    """SmolLM2's stand-in (hidden 64, intermediate 128) with --int4-block-size 256 was accepted, exported fp32 and
    int4, then failed at step 4/6 ("no int4 DequantizeLinear + MatMul to requantise"): refused up front naming the
    option and the sizes. 128 divides intermediate_size, so down_proj is blocked: accepted (and exported)."""
    from prodip.cli import main
    from prodip.export import core

    real = core.export_onnx
    monkeypatch.setattr(core, "export_onnx", lambda *a, **k: pytest.fail("the export started"))
    out = tmp_path / "int4"
    args = ["export", str(standins["smollm2"]), "--out", str(out), "--variants", "fp32,int4"]
    assert main([*args, "--int4-block-size", "256"]) == 2
    assert capsys.readouterr().err.strip() == (
        "prodip export: error: ExportConfig.int4_block_size = 256 (--int4-block-size): larger than every MatMul "
        "input size of this model (hidden_size = 64, num_attention_heads * head_dim = 64, intermediate_size = 128): "
        "each weight column would be one block, mostly padding; choose one of 16, 32, 64, 128"
    )
    assert not out.exists() and not list(tmp_path.glob(".int4.*"))
    monkeypatch.setattr(core, "export_onnx", real)
    assert main([*args, "--int4-block-size", "128", "--variants", "int4"]) == 0
    quant = json.loads((out / "manifest.json").read_text())["variants"]["int4"]["quantization"]
    assert quant["block_size"] == 128 and quant["matmuls_as_qdq"] == 2  # the two down_proj MatMuls (K = 128)


@pytest.mark.slow
def test_pte_plan_over_the_limit_is_refused_by_name(standins, tmp_path):
    """The up-front floor is a floor: a window it lets through whose lowered program still plans more than a
    device runtime can allocate is refused after the lowering, with ExecuTorch's own plan size (larger than the
    floor), and the shorter window that refusal advises is exported."""
    pytest.importorskip("executorch")
    from prodip.export.config import ExportConfig
    from prodip.export.core import export_checkpoint
    from prodip.export.executorch import PLANNED_MEMORY_LIMIT, planned_memory_floor

    # a window longer than the model's is refused before anything is written
    long = ExportConfig(
        checkpoint=str(standins["smollm2"]), out=str(tmp_path / "long"), variants=["pte-fp32"], pte_max_seq_len=8193
    )
    with pytest.raises(InvalidInput, match="pte_max_seq_len = 8193 exceeds the model's max_position_embeddings = 8192"):
        export_checkpoint(long)
    # SmolLM2's own 8192-token window: over the limit by the floor already (the lowered plan: 7 GiB)
    whole = ExportConfig(checkpoint=str(standins["smollm2"]), out=str(tmp_path / "whole"), variants=["pte-fp32"])
    with pytest.raises(InvalidInput, match=r"plan at least 6\.0 GiB .*max_position_embeddings = 8192.*over the 4 GiB"):
        export_checkpoint(whole)
    # 6600 tokens: a floor of 3.9 GiB passes; the lowered program's plan (activations, caches) does not
    config = _prodip(standins["smollm2"]).config
    floor = planned_memory_floor(config, 6600)
    assert floor < PLANNED_MEMORY_LIMIT
    near = ExportConfig(
        checkpoint=str(standins["smollm2"]), out=str(tmp_path / "near"), variants=["pte-fp32"], pte_max_seq_len=6600
    )
    with pytest.raises(InvalidInput, match=r"would plan (\d+\.\d) GiB .*pte_max_seq_len = 6600") as err:
        export_checkpoint(near)
    planned = float(re.search(r"would plan (\d+\.\d) GiB", str(err.value)).group(1)) * 2**30
    assert PLANNED_MEMORY_LIMIT < planned and floor < planned < 1.6 * floor
    # the window the late refusal advises is shorter than the one refused, and followed, it exports
    advised = int(re.search(r"N at most (\d+) ", str(err.value)).group(1))
    assert 0 < advised < 6600 and advised % 64 == 0
    short = ExportConfig(
        checkpoint=str(standins["smollm2"]), out=str(tmp_path / "short"), variants=["pte-fp32"], pte_max_seq_len=advised
    )
    assert export_checkpoint(short) is not None and (tmp_path / "short" / "executorch" / "model.pte").is_file()
    assert not (tmp_path / "long").exists() and not (tmp_path / "near").exists()
    with pytest.raises(InvalidInput, match="pte_max_seq_len must be >= 0"):
        ExportConfig(pte_max_seq_len=-1)


def test_tinyllama_style_sentencepiece_tokenizer(tmp_path):
    """A Llama 2 / TinyLlama fast tokenizer (byte-fallback BPE, "▁" normaliser, <s> prepended) exports
    with its ids and Zephyr template (eos_token as a variable); its GGUF is llama.cpp's SentencePiece
    vocabulary (tests/export/test_import_hf.py::test_tinyllama_gguf_ids)."""
    from prodip.base.chat import chat_contract

    folder = build_standin("tinyllama", tmp_path / "tinyllama")
    out = _export(folder, tmp_path / "export", "fp32")
    config = _prodip(folder).config
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = np.asarray([tok("Hello world 123. আমার সোনার বাংলা।")["input_ids"]], dtype=np.int64)
    assert ids[0, 0] == 1 and read_specials(out).add_bos
    ref = _reference(folder, torch.from_numpy(ids)).numpy()
    assert np.abs(_reference(out, torch.from_numpy(ids)).numpy() - ref).max() < 1e-5
    assert np.abs(_ort_logits(out / "onnx" / "model.onnx", config, ids) - ref).max() < 1e-4
    assert chat_contract(out)["end_of_turn"] == "</s>"
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert transformers.AutoTokenizer.from_pretrained(str(out)).apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=False
    ) == tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


@pytest.mark.slow
def test_tinyllama_gguf_ids(tmp_path, capsys):
    """The byte-fallback BPE's GGUF (tokenizer.ggml.model llama: pieces, scores from the merge ranks, byte
    and control types) gives llama.cpp the ids of tokenizer.json on the held-out text, edge cases too, and
    logits as the original folder's under transformers; a byte-fallback BPE whose merges are not a
    SentencePiece model's (one split missing) is refused in one line naming it, nothing written."""
    pytest.importorskip("gguf")
    import unicodedata

    from tokenizers import Tokenizer

    from prodip.cli import main
    from prodip.conformance.device_runners import LlamaCppRunner

    folder = build_standin("tinyllama", tmp_path / "tinyllama")
    out = _export(folder, tmp_path / "export", "gguf-f16")
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    root = Path(__file__).resolve().parents[2] / "data" / "heldout"
    texts = [
        unicodedata.normalize("NFC", (root / f).read_text(encoding="utf-8")) for f in ("udhr_ben.txt", "udhr_eng.txt")
    ]
    texts += [" leading space", "two  spaces\nand a line", "</s> after a special", "aaaa bbbb"]
    runner = LlamaCppRunner(out / "gguf" / "model-f16.gguf", "gguf", context=64, rows=1)
    try:
        got = runner.tokenize(texts)
    finally:
        runner.close()
    assert got == [raw.encode(t).ids for t in texts]
    assert len(got[0]) > 20_000  # the Bangla held-out text: byte fallback throughout
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = np.asarray([tok("Hello world 123. আমার সোনার বাংলা।")["input_ids"]], dtype=np.int64)
    ref = _reference(folder, torch.from_numpy(ids)).numpy()
    gguf_logits = _gguf_logits(out / "gguf" / "model-f16.gguf", ids)
    assert np.abs(gguf_logits - ref).max() < 5e-2 and (gguf_logits.argmax(-1) == ref.argmax(-1)).mean() > 0.9

    bad = tmp_path / "trainer-merges"
    shutil.copytree(folder, bad)
    data = json.loads((bad / "tokenizer.json").read_text(encoding="utf-8"))
    dropped = data["model"]["merges"].pop(100)
    (bad / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    assert main(["export", str(bad), "--out", str(tmp_path / "bad-export"), "--variants", "gguf-f16"]) == 2
    err = capsys.readouterr().err
    assert f"{dropped[0]!r} + {dropped[1]!r} -> {dropped[0] + dropped[1]!r} is not a merge" in err, err
    assert not (tmp_path / "bad-export").exists()


def test_card_states_the_base_licence_and_hub_name(standins, tmp_path):
    """The folder's README front matter licence and a Hub-shaped _name_or_path reach the card."""
    from prodip.base.manifest import load_manifest

    folder = _edited(standins["smollm2"], tmp_path / "folder", _name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct")
    (folder / "README.md").write_text("---\nlicense: apache-2.0\nlanguage:\n- en\n---\n# SmolLM2\n", "utf-8")
    out = _export(folder, tmp_path / "export", "fp32")
    card = load_manifest(out).card
    assert card.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.license.license == "apache-2.0" and "(licence: apache-2.0)" in card.statement.text
    readme = (out / "README.md").read_text()
    assert "license: apache-2.0" in readme and "`HuggingFaceTB/SmolLM2-135M-Instruct`" in readme


def test_a_truncated_weights_file_is_named_in_one_line(tmp_path, capsys):
    """A cut-short model.safetensors in a HF folder: every command reading it (export, --init-from,
    tokenizer extend) names the file and both sizes, as a truncated training checkpoint does."""
    from prodip.cli import main

    folder = build_standin("smollm2", tmp_path / "S")
    weights = folder / "model.safetensors"
    whole = weights.stat().st_size
    with open(weights, "r+b") as fh:
        fh.truncate(whole // 2)
    want = f"{weights}: {whole // 2} bytes, its safetensors header says {whole} (truncated or tampered)"
    with pytest.raises(InvalidInput) as err:
        load_init(folder, tokenizer_sha256=None)
    assert str(err.value) == want
    corpus = tmp_path / "bn.txt"
    corpus.write_text("আমার সোনার বাংলা আমি তোমায় ভালোবাসি\n" * 50, encoding="utf-8")
    runs = (
        ["export", str(folder), "--out", str(tmp_path / "X")],
        [
            "tokenizer",
            "extend",
            str(folder),
            "--inputs",
            f"bn={corpus}",
            "--new-tokens",
            "20",
            "--out",
            str(tmp_path / "E"),
        ],
    )
    for args in runs:
        assert main(args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[-1].endswith(want) and "Traceback" not in "\n".join(lines), (args, lines)
        assert not (tmp_path / "X").exists() and not (tmp_path / "E").exists()
    # cut inside the header, or a header naming no data_offsets: named too, not a parser's traceback
    with open(weights, "r+b") as fh:
        fh.truncate(20)
    with pytest.raises(InvalidInput, match=r"model\.safetensors: 20 bytes, not a safetensors file"):
        load_init(folder, tokenizer_sha256=None)
    header = json.dumps({"w": {"dtype": "F32", "shape": [1]}}).encode()
    weights.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(InvalidInput, match="without a tensor's data_offsets"):
        load_init(folder, tokenizer_sha256=None)


def test_an_import_without_a_known_licence_claims_none_and_passes_the_card_check(standins, tmp_path):
    """No README licence and none in config.json: the card, its front matter, the ONNX metadata agree on no
    licence (no `license: other` / `base-model-licence`), the opening says imported unchanged, and conformance's
    card check finds nothing."""
    from huggingface_hub import ModelCard

    from prodip.base.manifest import load_manifest
    from prodip.conformance.card import card_problems

    folder = _edited(standins["smollm2"], tmp_path / "folder", license=None)
    (folder / "README.md").unlink(missing_ok=True)
    out = _export(folder, tmp_path / "export", "fp32")
    assert load_manifest(out).card.license is None
    text = (out / "README.md").read_text(encoding="utf-8")
    assert "license" not in ModelCard(text).data.to_dict() and "base-model-licence" not in text
    assert "imported and exported unchanged by prodip (not trained)" in text and "trained from scratch" not in text
    assert card_problems(out) == []
