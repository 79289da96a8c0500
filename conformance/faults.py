"""Planted faults: broken copies of a good export that the conformance suite must reject.

Each ``plant_*`` function copies a good export dir and edits the copy the way a real exporter
bug would leave it (safetensors edits, ONNX graph surgery with the ``onnx`` library), then
refreshes the manifest's file hashes so that only the planted defect differs. Production code
is never changed. Used by ``tests/conformance`` and runnable on any export:

    python -m prodip.conformance.faults runs/demo/export /tmp/faults   # writes one dir per fault
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from safetensors.torch import load_file, save_file

from prodip.base.card import CardLicense
from prodip.base.errors import InvalidInput
from prodip.base.manifest import (
    FileEntry,
    OnnxQuantization,
    PteQuantization,
    file_sha256,
    list_files,
    load_manifest,
    save_manifest,
)
from prodip.base.variants import BY_NAME


def copy_export(src: str | Path, dst: str | Path) -> Path:
    """Copy an export dir (without its ``conformance/`` report) to ``dst`` (must not exist)."""
    dst = Path(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("conformance"))
    return dst


def refresh_manifest(export_dir: Path, **updates) -> None:
    """Re-hash every file into ``manifest.json`` (and apply top-level ``updates``); clears the verdict."""
    manifest = load_manifest(export_dir)
    manifest.files = {rel: FileEntry.model_validate(meta) for rel, meta in list_files(export_dir).items()}
    manifest.conformance = None
    for key, value in updates.items():
        setattr(manifest, key, value)
    save_manifest(export_dir, manifest)


def _config(export_dir: Path) -> dict:
    return json.loads((export_dir / "config.json").read_text(encoding="utf-8"))


def to_interleaved(w, n_heads: int):
    """Rows of a q/k projection from rotate-half to the interleaved (Meta/GPT-J) RoPE layout.

    The inverse of the ``permute`` in transformers' ``convert_llama_weights_to_hf.py``: per head,
    row ``j`` (first half) and ``j + Dh/2`` (second half) become rows ``2j`` and ``2j + 1``.
    """
    out_dim, in_dim = w.shape
    return w.reshape(n_heads, 2, out_dim // n_heads // 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def plant_rope_interleaved(src: Path, dst: Path) -> Path:
    """model.safetensors with q/k rows in the interleaved RoPE layout (export forgot to convert)."""
    dst = copy_export(src, dst)
    cfg = _config(dst)
    tensors = load_file(str(dst / "model.safetensors"))
    for key in list(tensors):
        if key.endswith("self_attn.q_proj.weight"):
            tensors[key] = to_interleaved(tensors[key], cfg["num_attention_heads"]).contiguous()
        elif key.endswith("self_attn.k_proj.weight"):
            tensors[key] = to_interleaved(tensors[key], cfg["num_key_value_heads"]).contiguous()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    refresh_manifest(dst)
    return dst


def _plant_onnx(src: Path, dst: Path, rel: str, edit: Callable) -> Path:
    """Copy the export ``src`` to ``dst``, apply ``edit`` to the ONNX graph ``rel`` in place, and
    refresh the manifest hashes (the planted fault must be found by measuring, not by a hash)."""
    dst = copy_export(src, dst)
    path = dst / rel
    model = onnx.load(str(path))
    edit(model)
    onnx.save(model, str(path))
    refresh_manifest(dst)
    return dst


def _const(model, name: str, value: int) -> str:
    model.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=np.int64), name))
    return name


def plant_static_seq(src: Path, dst: Path, rel: str = BY_NAME["fp32"].path, seq: int = 3) -> Path:
    """The decoder's sequence axis baked to ``seq`` (as a trace without dynamic axes leaves it)."""

    def edit(model):
        for vi in model.graph.input:
            if vi.name in ("input_ids", "position_ids"):
                dim = vi.type.tensor_type.shape.dim[1]
                dim.Clear()
                dim.dim_value = seq

    return _plant_onnx(src, dst, rel, edit)


def plant_baked_reshape(src: Path, dst: Path, rel: str = BY_NAME["fp32"].path, seq: int = 7) -> Path:
    """Inputs still declared dynamic, but the first attention reshape baked to batch 1, ``seq``
    tokens (as a trace that captured concrete sizes leaves it): only a run at other lengths shows it.
    The contrib graph has no such Reshape (GroupQueryAttention reads (B, T, H*Dh)): there a Reshape to
    ``[1, seq, -1]`` is planted on the first projection's output instead.

    Raises:
        ValueError: no MatMul found (the graph is not the expected export).
    """
    cfg = _config(Path(src))
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads

    def edit(model):
        producers = {o: n for n in model.graph.node for o in n.output}
        for node in model.graph.node:
            src_node = producers.get(node.input[0]) if node.op_type == "Reshape" else None
            if src_node is not None and src_node.op_type == "MatMul":
                shape = np.array([1, seq, heads, head_dim], dtype=np.int64)
                model.graph.initializer.append(numpy_helper.from_array(shape, "planted_shape"))
                node.input[1] = "planted_shape"
                return
        first = next((n for n in model.graph.node if n.op_type == "MatMul"), None)
        if first is None:
            raise InvalidInput(f"{dst / rel}: no MatMul output to bake a Reshape on")
        out = first.output[0]
        for node in model.graph.node:
            node.input[:] = ["planted_baked" if name == out else name for name in node.input]
        model.graph.initializer.append(numpy_helper.from_array(np.array([1, seq, -1], np.int64), "planted_shape"))
        at = list(model.graph.node).index(first) + 1
        model.graph.node.insert(at, helper.make_node("Reshape", [out, "planted_shape"], ["planted_baked"]))

    return _plant_onnx(src, dst, rel, edit)


def plant_mask_ignores_past(src: Path, dst: Path, rel: str = BY_NAME["fp32"].path) -> Path:
    """Causal mask built as if past = 0: query positions ``arange(T)`` instead of ``arange(P, P+T)``.

    Surgery on the mask subgraph: the ``Range(S - T, S)`` of query positions becomes ``Range(0, T)``.
    Correct for a prefill, wrong for every call with a cache.

    Raises:
        ValueError: no ``Range`` whose start is a ``Sub`` (the graph is not the expected export).
    """

    def edit(model):
        producers = {o: n for n in model.graph.node for o in n.output}
        for node in model.graph.node:
            start = producers.get(node.input[0]) if node.op_type == "Range" else None
            if start is not None and start.op_type == "Sub":
                node.input[0] = _const(model, "planted_zero", 0)
                node.input[1] = start.input[1]  # T
                return
        raise InvalidInput(f"{dst / rel}: no Range(S - T, S) node found to plant the mask fault")

    return _plant_onnx(src, dst, rel, edit)


def plant_position_off_by_one(src: Path, dst: Path, rel: str = BY_NAME["fp32"].path) -> Path:
    """position_ids + 1 whenever more than one token is fed (1-based prefill, 0-based decode steps).

    A uniform shift of every position is invisible to RoPE (it depends on position differences
    only), so the planted bug is the realistic inconsistent one: prefill and decode disagree.
    """

    def edit(model):
        g = model.graph
        for node in g.node:
            for i, name in enumerate(node.input):
                if name == "position_ids":
                    node.input[i] = "planted_position_ids"
        one = _const(model, "planted_one", 1)
        axis = _const(model, "planted_axis", 1)
        new = [
            helper.make_node("Shape", ["input_ids"], ["planted_shape"]),
            helper.make_node("Gather", ["planted_shape", axis], ["planted_seq"], axis=0),
            helper.make_node("Greater", ["planted_seq", one], ["planted_multi"]),
            helper.make_node("Cast", ["planted_multi"], ["planted_offset"], to=7),
            helper.make_node("Add", ["position_ids", "planted_offset"], ["planted_position_ids"]),
        ]
        for n in reversed(new):
            g.node.insert(0, n)

    return _plant_onnx(src, dst, rel, edit)


def plant_zeroed_layer(src: Path, dst: Path, rel: str = BY_NAME["int8"].path, layer: int = 1) -> Path:
    """A quantised model whose decoder layer ``layer`` has all weights zeroed (scales set to 0).

    Layer membership comes from graph order: the quantised MatMuls (MatMulInteger for int8;
    MatMulNBits, or MatMul of an int4 DequantizeLinear in the qdq layout, for int4) are 7 per layer (q, k, v, o, gate, up, down) in the standard graph, 5 in
    the contrib graph (packed qkv, o, gate, up, down), then the lm_head. In the int4's WASM graph
    (``rel`` = the manifest's ``wasm_path``) a MatMulInteger's weight is QuantizeLinear(DequantizeLinear(int4)):
    the int4 scales are zeroed there, in that file only (it is saved with its weights inline, so the int4
    file it shared them with keeps its own).

    Raises:
        ValueError: the count of quantised MatMuls is not 5 or 7 per layer (+ lm_head).
    """
    L = _config(Path(src))["num_hidden_layers"]

    def edit(model):
        g = model.graph
        inits = {i.name: i for i in g.initializer}
        # int4's qdq layout: MatMul(A, DequantizeLinear(constant codes, scales, ...)); its scales are the DQ's input 1
        dq_scales = {n.output[0]: n.input[1] for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
        # the WASM graph's weight side: QuantizeLinear(DequantizeLinear(int4 constants)), folded to uint8 at load
        dq_scales.update(
            {
                n.output[0]: dq_scales[n.input[0]]
                for n in g.node
                if n.op_type == "QuantizeLinear" and n.input[0] in dq_scales
            }
        )
        mm = [
            n
            for n in g.node
            if (n.op_type in ("MatMulInteger", "MatMulNBits") and n.input[1] in inits)
            or (n.op_type in ("MatMul", "MatMulInteger") and n.input[1] in dq_scales)
        ]
        per = next((k for k in (7, 5) if len(mm) in (k * L, k * L + 1)), None)
        if per is None:
            raise InvalidInput(f"{dst / rel}: {len(mm)} quantised MatMuls, expected 5 or 7 per layer x {L} (+ lm_head)")

        def zero(name: str) -> None:
            init = inits[name]
            init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), name))

        zeroed = 0
        for node in mm[per * layer : per * layer + per]:
            if node.input[1] in dq_scales:
                zero(dq_scales[node.input[1]])
                zeroed += 1
                continue
            base = node.input[1].rsplit("_", 1)[0]
            for name in list(inits):
                if name.startswith(base + "_") and name.endswith(("scale", "scales")):
                    zero(name)
                    zeroed += 1
        if zeroed < per:
            raise InvalidInput(f"{dst / rel}: found {zeroed} weight scales for layer {layer}, expected {per}")

    return _plant_onnx(src, dst, rel, edit)


def plant_other_weights(src: Path, dst: Path, other_checkpoint: Path) -> Path:
    """model.safetensors replaced by another checkpoint's weights, manifest still naming the original."""
    dst = copy_export(src, dst)
    shutil.copyfile(Path(other_checkpoint) / "model.safetensors", dst / "model.safetensors")
    refresh_manifest(dst)
    return dst


def plant_config_rope_theta(src: Path, dst: Path, rope_theta: float = 500000.0) -> Path:
    """config.json with another ``rope_theta`` than the model was trained with."""
    dst = copy_export(src, dst)
    cfg = _config(dst)
    cfg["rope_theta"] = rope_theta
    (dst / "config.json").write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    refresh_manifest(dst)
    return dst


def plant_tokenizer_context(src: Path, dst: Path, model_max_length: int = 2048) -> Path:
    """tokenizer_config.json stating another context than the model's: the tokenizer stage's default
    ``model_max_length`` left in the export instead of the model's ``max_position_embeddings``."""
    dst = copy_export(src, dst)
    path = dst / "tokenizer_config.json"
    tok = json.loads(path.read_text(encoding="utf-8"))
    tok["model_max_length"] = model_max_length
    path.write_text(json.dumps(tok, indent=2), encoding="utf-8")
    refresh_manifest(dst)
    return dst


def plant_tokenizer_without_nfc(src: Path, dst: Path) -> Path:
    """tokenizer.json with its NFC normaliser dropped (NFD input then tokenizes differently)."""
    dst = copy_export(src, dst)
    tok = json.loads((dst / "tokenizer.json").read_text(encoding="utf-8"))
    tok["normalizer"] = None
    (dst / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    refresh_manifest(dst, tokenizer_sha256=file_sha256(dst / "tokenizer.json"))
    return dst


def _gguf_path(export_dir: Path, variant: str) -> Path:
    manifest = load_manifest(export_dir)
    if variant not in manifest.variants:
        raise InvalidInput(f"{export_dir}: has no {variant} variant to plant a fault in (export it first)")
    return export_dir / manifest.variants[variant].path


def plant_gguf_rope_theta(src: Path, dst: Path, variant: str = "gguf-f16", rope_theta: float = 500000.0) -> Path:
    """A GGUF whose ``llama.rope.freq_base`` is not the model's ``rope_theta`` (edited in place with
    gguf-py's ``GGUFReader(mode="r+")``, as llama.cpp's gguf-py/gguf/scripts/gguf_set_metadata.py does)."""
    import gguf  # noqa: PLC0415 (optional: pip extra runtimes)

    dst = copy_export(src, dst)
    reader = gguf.GGUFReader(str(_gguf_path(dst, variant)), "r+")
    field = reader.get_field(gguf.Keys.Rope.FREQ_BASE.format(arch="llama"))
    field.parts[field.data[0]][0] = rope_theta
    del reader  # flush the memory map
    refresh_manifest(dst)
    return dst


def plant_gguf_unpermuted_qk(src: Path, dst: Path, variant: str = "gguf-f16") -> Path:
    """A float16 GGUF whose q/k rows are left in prodip's rotate-half order (the converter's permute
    forgotten): llama.cpp then rotates the wrong pairs."""
    import gguf  # noqa: PLC0415 (optional: pip extra runtimes)

    dst = copy_export(src, dst)
    cfg = _config(dst)
    reader = gguf.GGUFReader(str(_gguf_path(dst, variant)), "r+")
    done = 0
    for t in reader.tensors:
        heads = {"attn_q": cfg["num_attention_heads"], "attn_k": cfg["num_key_value_heads"]}.get(t.name.split(".")[-2])
        if heads is None:
            continue
        if t.tensor_type != gguf.GGMLQuantizationType.F16:
            raise InvalidInput(f"{variant}: {t.name} is {t.tensor_type.name}; this fault needs float16 rows")
        w = np.array(t.data)  # (rows, cols) in GGUF's llama pair order
        rows = w.shape[0]
        t.data[...] = w.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)
        done += 1
    del reader
    if done != 2 * cfg["num_hidden_layers"]:
        raise InvalidInput(f"{variant}: found {done} q/k tensors, expected {2 * cfg['num_hidden_layers']}")
    refresh_manifest(dst)
    return dst


def plant_pte_max_seq_len(src: Path, dst: Path, variant: str = "pte-fp32", factor: int = 2) -> Path:
    """A .pte whose runner metadata ``get_max_seq_len`` is ``factor`` x the cache it was exported with
    (an exporter passing the wrong length): re-exported from the export's source checkpoint."""
    from prodip.export.executorch import export_pte  # noqa: PLC0415 (slow import, only for this fault)
    from prodip.train.checkpoint import load_model  # noqa: PLC0415 (only for this fault)

    dst = copy_export(src, dst)
    manifest = load_manifest(dst)
    entry = manifest.variants.get(variant)
    if entry is None or not isinstance(entry.quantization, PteQuantization):
        raise InvalidInput(f"{src}: has no ExecuTorch variant {variant!r} to plant a fault in")
    if not manifest.source_checkpoint.path:
        raise InvalidInput(f"{src / 'manifest.json'}: names no source_checkpoint.path to re-export {variant} from")
    model, config, _ = load_model(manifest.source_checkpoint.path)
    meta = entry.quantization.runner_metadata
    export_pte(
        model.float().eval(),
        dst / entry.path,
        variant,
        bos_id=meta.get_bos_id,
        eos_ids=meta.get_eos_ids,
        group_size=entry.quantization.group_size or 32,
        metadata_overrides={"get_max_seq_len": factor * config.max_position_embeddings},
    )
    refresh_manifest(dst)
    return dst


def plant_card_licence_dropped(src: Path, dst: Path, rel: str = BY_NAME["fp16"].path) -> Path:
    """One ONNX file's ``metadata_props`` without its ``license`` (an exporter that forgot one artifact)."""
    dst = copy_export(src, dst)
    model = onnx.load(str(dst / rel), load_external_data=False)
    kept = [p for p in model.metadata_props if p.key != "license"]
    if len(kept) == len(model.metadata_props):
        raise InvalidInput(f"{dst / rel}: carries no license metadata to drop (an export made before model cards)")
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(dst / rel))
    refresh_manifest(dst)
    return dst


def plant_card_licence_not_on_hub(src: Path, dst: Path, licence: str = "odc-by-1.0") -> Path:
    """The card's licence a lower-cased SPDX id the Hub does not list (``odc-by-1.0``: the Hub's is ``odc-by``),
    written consistently into the manifest and every artifact, as an exporter that lower-cased SPDX ids did:
    only the Hub's list can catch it."""
    from prodip.export.card import write_card  # noqa: PLC0415

    dst = copy_export(src, dst)
    manifest = load_manifest(dst)
    if manifest.card is None:
        raise InvalidInput(f"{dst}: no card in the manifest (an export made before model cards)")
    manifest.card.license = CardLicense.model_validate({"license": licence})
    save_manifest(dst, manifest)
    write_card(dst, manifest.card, manifest.variants)
    refresh_manifest(dst)
    return dst


#: The template edit the chat faults plant: the newline after a turn's <|im_end|> becomes a space (same length,
#: so a GGUF string can be edited in place); every rendered conversation then has other ids.
_TURN_END, _TURN_END_EDITED = "'<|im_end|>' + '\n'", "'<|im_end|>' + ' '"


def plant_chat_template_edited(src: Path, dst: Path, where: str = "gguf-f16") -> Path:
    """The chat template edited in one artifact only (a converter rewriting it): ``where`` is a GGUF variant
    (its ``tokenizer.chat_template``, edited in place with gguf-py), ``tokenizer_config.json`` (its
    ``chat_template``: what transformers, transformers.js and onnxruntime-genai read) or a ``.jinja`` file."""
    dst = copy_export(src, dst)
    if where.startswith("gguf-"):
        import gguf  # noqa: PLC0415 (optional: pip extra runtimes)

        reader = gguf.GGUFReader(str(_gguf_path(dst, where)), "r+")
        field = reader.get_field("tokenizer.chat_template")
        if field is None:
            raise InvalidInput(f"{where}: has no tokenizer.chat_template (not a chat model's export)")
        raw = field.parts[field.data[0]]
        text = bytes(raw).decode("utf-8")
        if _TURN_END not in text:
            raise InvalidInput(f"{where}: the chat template has no {_TURN_END!r} to edit")
        raw[...] = np.frombuffer(text.replace(_TURN_END, _TURN_END_EDITED, 1).encode("utf-8"), np.uint8)
        del reader  # flush the memory map
    elif where.endswith(".json"):
        path = dst / where
        config = json.loads(path.read_text(encoding="utf-8"))
        if _TURN_END not in (config.get("chat_template") or ""):
            raise InvalidInput(f"{path}: has no chat_template with {_TURN_END!r} to edit (not a chat model's export)")
        config["chat_template"] = config["chat_template"].replace(_TURN_END, _TURN_END_EDITED, 1)
        path.write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    else:
        path = dst / where
        path.write_text(path.read_text(encoding="utf-8").replace(_TURN_END, _TURN_END_EDITED, 1), encoding="utf-8")
    refresh_manifest(dst)
    return dst


def _wasm_path(export_dir: Path, variant: str) -> str:
    """The manifest's ``wasm_path`` of ``variant`` (its web-only graph).

    Raises:
        ValueError: the variant has none (an export without the WASM int4 file).
    """
    entry = load_manifest(export_dir).variants.get(variant)
    if entry is None or not entry.wasm_path:
        raise InvalidInput(f"{export_dir / 'manifest.json'}: variant {variant!r} has no wasm_path (no WASM graph)")
    return entry.wasm_path


def plant_wasm_missing_kernel(src: Path, dst: Path, rel: str = BY_NAME["int4"].path) -> Path:
    """The int4 file re-quantised with ONNX Runtime's ``com.microsoft.GatherBlockQuantized`` embedding
    lookup kept (``lower_embedding=False``): ONNX Runtime's CPU build has the kernel, onnxruntime-web's
    WASM build does not. The WASM int4 file (the manifest's ``wasm_path``) is removed, as an export had none
    before, so onnxruntime-web runs this file. Only the ``model_q4.onnx`` contract graph is
    rewritten (its ``_genai`` twin then reads stale weights: check this file with onnxruntime-web only)."""
    from prodip.export.genai import move_weights_out  # noqa: PLC0415
    from prodip.export.quantize import to_int4  # noqa: PLC0415

    entry = load_manifest(src).variants.get("int4")
    q = entry.quantization if entry is not None else None
    if not isinstance(q, OnnxQuantization) or q.block_size is None or q.symmetric is None or q.accuracy_level is None:
        raise InvalidInput(f"{src / 'manifest.json'}: no int4 variant recording block_size, symmetric, accuracy_level")
    dst = copy_export(src, dst)
    path = dst / rel
    for old in (path, path.with_name(path.name + "_data")):
        old.unlink(missing_ok=True)
    to_int4(
        dst / BY_NAME["fp32"].path,
        path,
        block_size=q.block_size,
        symmetric=q.symmetric,
        accuracy_level=q.accuracy_level,
        lower_embedding=False,
        layout="matmulnbits",  # the qdq layout's tied lookup has no GatherBlockQuantized to keep
    )
    move_weights_out(dst, rel)  # as the export lays it out: weights in <file>_data
    # the export as it was before the WASM int4 file existed: the WASM row then runs the planted file itself
    manifest = load_manifest(dst)
    entry = manifest.variants["int4"]
    if entry.wasm_path:
        (dst / entry.wasm_path).unlink(missing_ok=True)
    kept = entry.model_dump(mode="python", exclude_unset=True, exclude={"wasm_path", "wasm"})
    manifest.variants["int4"] = type(entry).model_validate(kept)
    save_manifest(dst, manifest)
    cfg = _config(dst)
    cfg.get("transformers.js_config", {}).pop("prodip_wasm_q4", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    refresh_manifest(dst)
    return dst


def plant_card_figure_edited(src: Path, dst: Path) -> Path:
    """README.md's quality card with one figure made better than measured (the first bits/char, -0.5)
    while the manifest keeps the measured figures. Needs an export conformance has written a card into."""
    import re  # noqa: PLC0415

    dst = copy_export(src, dst)
    path = dst / "README.md"
    text = path.read_text(encoding="utf-8")
    head, sep, quality = text.partition("\n## Quality\n")
    row = re.search(r"^\| [^|]+ \| [^|]+ \| (\d+\.\d{4}) \|", quality, flags=re.M)
    if not sep or row is None:
        raise InvalidInput(f"{path}: no quality card figures (run `prodip conformance` on the export first)")
    better = f"{float(row.group(1)) - 0.5:.4f}"
    quality = quality[: row.start(1)] + better + quality[row.end(1) :]
    path.write_text(head + sep + quality, encoding="utf-8")
    refresh_manifest(dst)  # the manifest's card_quality keeps the measured figures
    return dst


def plant_end_of_turn_not_a_stop(src: Path, dst: Path, file: str = "genai_config.json") -> Path:
    """``<|im_end|>`` left out of one runtime's stop set (an SFT export that never switched its EOS):
    ``genai_config.json``'s ``model.eos_token_id`` (onnxruntime-genai) or ``generation_config.json``'s
    ``eos_token_id`` (transformers, transformers.js, prodip serve) back to the single ``<|eos|>``."""
    dst = copy_export(src, dst)
    path = dst / file
    config = json.loads(path.read_text(encoding="utf-8"))
    table = config["model"] if file == "genai_config.json" else config
    eos = table["eos_token_id"]
    if not isinstance(eos, list) or len(eos) < 2:
        raise InvalidInput(f"{path}: eos_token_id {eos!r} has no end-of-turn id to remove (not a chat model's)")
    table["eos_token_id"] = eos[0]  # <|eos|> only
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    refresh_manifest(dst)
    return dst


FAULTS = {
    "rope_interleaved": plant_rope_interleaved,
    "static_seq": plant_static_seq,
    "baked_reshape": plant_baked_reshape,
    "mask_ignores_past": plant_mask_ignores_past,
    "position_off_by_one": plant_position_off_by_one,
    "zeroed_layer_int8": plant_zeroed_layer,
    "zeroed_layer_int4": lambda s, d: plant_zeroed_layer(s, d, rel=BY_NAME["int4"].path),
    "zeroed_layer_int4_wasm": lambda s, d: plant_zeroed_layer(s, d, rel=_wasm_path(Path(s), "int4")),
    "config_rope_theta": plant_config_rope_theta,
    "tokenizer_without_nfc": plant_tokenizer_without_nfc,
    "tokenizer_context": plant_tokenizer_context,
    "gguf_rope_theta": plant_gguf_rope_theta,
    "gguf_unpermuted_qk": plant_gguf_unpermuted_qk,
    "pte_max_seq_len": plant_pte_max_seq_len,
    "card_licence_dropped": plant_card_licence_dropped,
    "card_licence_not_on_hub": plant_card_licence_not_on_hub,
    "card_figure_edited": plant_card_figure_edited,
    "chat_template_edited_gguf": plant_chat_template_edited,
    "end_of_turn_not_a_genai_stop": plant_end_of_turn_not_a_stop,
    "wasm_missing_kernel": plant_wasm_missing_kernel,
}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m prodip.conformance.faults EXPORT_DIR OUT_DIR", file=sys.stderr)
        return 2
    for name, fn in FAULTS.items():
        try:
            print(fn(Path(argv[0]), Path(argv[1]) / name))
        except InvalidInput as err:  # e.g. a GGUF/.pte fault on an export without that variant
            shutil.rmtree(Path(argv[1]) / name, ignore_errors=True)
            print(f"{name}: skipped ({err})")
    return 0


if __name__ == "__main__":
    from prodip.base.cli import tool_main

    sys.exit(tool_main("conformance.faults", main, sys.argv[1:]))
