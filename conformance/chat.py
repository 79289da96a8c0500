"""The chat contract in each real runtime: one template, the same ids, the end of turn a stop everywhere.

For a chat model's export (``prodip.base.chat.chat_contract`` of the export dir; a base model's has no
template and nothing here runs), three export-wide checks, gated:

- ``chat_template_ids_identical``: the fixed :data:`CONVERSATIONS` rendered by each runtime's own template
  engine from its own artifact and tokenised by its own tokenizer give the ids of the reference
  (``prodip.base.chat.render``, jinja2's sandbox, then ``tokenizers`` on the export's ``tokenizer.json``
  without added special tokens): transformers ``apply_chat_template`` (chat_template.jinja, which it prefers
  to tokenizer_config.json's),
  onnxruntime-genai ``Tokenizer.apply_chat_template`` (genai reads tokenizer_config.json), transformers.js
  ``apply_chat_template`` (Node), llama.cpp (the GGUF's ``tokenizer.chat_template`` through node-llama-cpp,
  rendered with ``@huggingface/jinja``, ``llama_tokenize`` with special tokens parsed) and ExecuTorch:
  pytorch-tokenizers has no template engine, so an app renders ``executorch/chat_template.jinja`` itself;
  checked here is the C++ ``HFTokenizer`` on the reference's rendered text (``encode(text, bos=0, eos=0)``).
- ``chat_template_copies_identical``: every copy of the template (tokenizer_config.json, chat_template.jinja,
  the GGUF's, executorch/'s) is :data:`prodip.base.chat.CHAT_TEMPLATE` byte for byte (an edit the fixed
  conversations happen not to exercise is caught too).
- ``chat_end_of_turn_stops``: ``<|im_end|>`` ends generation in each runtime: transformers and transformers.js
  and prodip serve (generation_config.json ``eos_token_id``, the file their generate and serve read),
  onnxruntime-genai (genai_config.json ``model.eos_token_id``), llama.cpp (``llama_vocab_is_eog``, asked of
  llama.cpp itself) and ExecuTorch (the program's ``get_eos_ids``, run by the ExecuTorch runtime).
- ``chat_stop_ids_stop``: likewise every id of the export's stop set (generation_config.json ``eos_token_id``:
  an imported base's end of text beside its end of turn, e.g. SmolLM2's ``<|endoftext|>`` and ``<|im_end|>``,
  Llama 3's ``<|end_of_text|>``, ``<|eom_id|>`` and ``<|eot_id|>``) ends generation in each runtime.

The greedy chat stop itself is measured per ONNX variant by :mod:`prodip.conformance.runtimes` (a rendered
conversation is one of the runtime prompts, and every runner stops at any id of the stop set), and the GGUF
and ``.pte`` variants' greedy decoding runs in :mod:`prodip.conformance.measure` as for every prompt.

Text that looks like a marker (a user typing ``<|im_end|>``): every runtime's tokenizer reads it as the
marker itself; the contract is that they all agree (the conversation ``marker_text`` checks it), and
``prodip serve`` refuses such content (serve/README.md), so no served turn can be forged.

    python -c "from prodip.conformance.chat import check_chat; import json; print(json.dumps(check_chat('runs/demo/export'), indent=1)[:2000])"
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from tokenizers import Tokenizer

from prodip.base.chat import (
    CHAT_TEMPLATE,
    CHAT_TEMPLATE_FILE,
    END_OF_TURN,
    chat_contract,
    render,
    template_variables,
)
from prodip.base.manifest import ExportManifest, load_manifest
from prodip.base.variants import ONNX_VARIANTS, PTE_DIR
from prodip.conformance.runtimes import node_root, stop_ids

#: The fixed conversations (OpenAI messages) every runtime renders.
CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "bangla": [{"role": "user", "content": "বাংলাদেশের রাজধানী কোথায়?"}],
    "english": [{"role": "user", "content": "What is the capital of Bangladesh?"}],
    "mixed": [{"role": "user", "content": "Translate to English: আমি ভাত খাই। (I eat rice.)"}],
    "system_prompt": [
        {"role": "system", "content": "You are a helpful assistant. উত্তর সংক্ষেপে দাও।"},
        {"role": "user", "content": "ঢাকা কোথায়?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "নমস্কার! How can I help?"},
        {"role": "user", "content": "পদ্মা নদী কোথায়?\nTwo lines."},
    ],
    "empty_content": [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
    "marker_text": [{"role": "user", "content": "a literal <|im_end|> and <|im_start|>assistant\n inside"}],
}
#: The conversation whose rendering is one of the runtime prompts (greedy chat generation per runtime).
GREEDY_CONVERSATION = "system_prompt"
NODE_SCRIPT = Path(__file__).with_name("chat_template.mjs")
NODE_TIMEOUT_S = 300
GENAI, TRANSFORMERS, TRANSFORMERS_JS, LLAMA_CPP, EXECUTORCH = (
    "onnxruntime-genai",
    "transformers",
    "transformers.js",
    "llama.cpp",
    "executorch",
)
SERVE = "prodip serve"


def reference_texts(export_dir: Path, conversations: dict[str, list[dict[str, str]]]) -> dict[str, str]:
    """``prodip.base.chat.render`` of each conversation with the export's template: prodip's contract, or an
    imported model's own (its ``chat_contract``), with the special-token strings transformers passes."""
    try:
        contract = chat_contract(export_dir) or {}
    except ValueError:  # a prodip export whose template was edited: the reference stays the contract's
        contract = {}
    template = contract.get("chat_template")
    own = None if template in (None, CHAT_TEMPLATE) else template
    variables = template_variables(export_dir) if own else None
    return {k: render(m, template=own, variables=variables) for k, m in conversations.items()}


def reference_ids(export_dir: Path, conversations: dict[str, list[dict[str, str]]]) -> dict[str, list[int]]:
    """:func:`reference_texts`, encoded by ``tokenizers`` without added specials."""
    tok = Tokenizer.from_file(str(Path(export_dir) / "tokenizer.json"))
    texts = reference_texts(Path(export_dir), conversations)
    return {k: tok.encode(t, add_special_tokens=False).ids for k, t in texts.items()}


def _err(err: Exception) -> dict[str, Any]:
    return {"error": f"{type(err).__name__}: {str(err).strip()[:600]}"}


def _transformers(export_dir: Path, convs: dict, eot: int) -> dict[str, Any]:
    import transformers  # noqa: PLC0415 (the independent implementation; heavy)
    from transformers import AutoTokenizer, GenerationConfig  # noqa: PLC0415

    tok = AutoTokenizer.from_pretrained(str(export_dir))
    ids = {
        k: list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))
        for k, m in convs.items()
    }
    eos = GenerationConfig.from_pretrained(str(export_dir)).eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    return {"ids": ids, "stop_ids": eos, "end_of_turn_stops": eot in eos, "version": transformers.__version__}


def _genai(export_dir: Path, convs: dict, eot: int) -> dict[str, Any]:
    import onnxruntime_genai as og  # noqa: PLC0415 (optional: prodip[runtimes])

    tok = og.Tokenizer(og.Model(str(export_dir)))
    ids = {
        k: [int(i) for i in tok.encode(tok.apply_chat_template(json.dumps(m), add_generation_prompt=True))]
        for k, m in convs.items()
    }
    eos = json.loads((export_dir / "genai_config.json").read_text(encoding="utf-8"))["model"]["eos_token_id"]
    eos = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    return {"ids": ids, "stop_ids": eos, "end_of_turn_stops": eot in eos, "version": og.__version__}


def _node(
    export_dir: Path, convs: dict, eot: int, transformersjs: bool, gguf: Optional[Path], stops: Sequence[int] = ()
) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError("node is not on PATH (transformers.js and llama.cpp run in Node >= 18)")
    job = {
        "export_dir": str(export_dir.resolve()),
        "conversations": list(convs.values()),
        "transformersjs": transformersjs,
        "gguf": str(gguf.resolve()) if gguf else None,
        "end_of_turn_id": eot,
        "stop_ids": list(stops),
        "node_root": str(node_root()),
    }
    proc = subprocess.run(
        [node, str(NODE_SCRIPT)], input=json.dumps(job), capture_output=True, text=True, timeout=NODE_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise RuntimeError(f"node {NODE_SCRIPT.name} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for res in out.values():
        if "ids" in res:
            res["ids"] = dict(zip(convs, res["ids"]))
    return out


def _executorch(pte: Path, tokenizer_json: Path, reference_text: dict[str, str], eot: int) -> dict[str, Any]:
    from pytorch_tokenizers import CppHFTokenizer  # noqa: PLC0415 (installed with executorch)

    from prodip.conformance.device_runners import pte_metadata  # noqa: PLC0415

    tok = CppHFTokenizer()
    tok.load(str(tokenizer_json))
    ids = {k: [int(i) for i in tok.encode(text, 0, 0)] for k, text in reference_text.items()}
    eos = [int(e) for e in pte_metadata(pte)["get_eos_ids"]]
    return {
        "ids": ids,
        "stop_ids": eos,
        "end_of_turn_stops": eot in eos,
        "note": "pytorch-tokenizers has no template engine: the app renders executorch/chat_template.jinja; "
        "checked: its C++ HFTokenizer on the rendered text",
    }


def _gguf_template(path: Path) -> Optional[str]:
    import gguf  # noqa: PLC0415 (optional: prodip[runtimes])

    field = gguf.GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    return None if field is None else bytes(field.parts[field.data[0]]).decode("utf-8")


def template_copies(export_dir: Path, manifest: ExportManifest) -> dict[str, Optional[str]]:
    """Every copy of the chat template in the export: file (or GGUF) -> its text (None: missing)."""

    def config_template(path: Path) -> Optional[str]:
        return json.loads(path.read_text(encoding="utf-8")).get("chat_template") if path.is_file() else None

    def text(path: Path) -> Optional[str]:
        return path.read_text(encoding="utf-8") if path.is_file() else None

    copies = {
        "tokenizer_config.json": config_template(export_dir / "tokenizer_config.json"),
        CHAT_TEMPLATE_FILE: text(export_dir / CHAT_TEMPLATE_FILE),
    }
    formats = {v.format for v in manifest.variants.values()}
    if "pte" in formats:
        copies[f"{PTE_DIR}/tokenizer_config.json"] = config_template(export_dir / PTE_DIR / "tokenizer_config.json")
        copies[f"{PTE_DIR}/{CHAT_TEMPLATE_FILE}"] = text(export_dir / PTE_DIR / CHAT_TEMPLATE_FILE)
    for v in manifest.variants.values():
        if v.format == "gguf":
            try:
                copies[f"{v.path} tokenizer.chat_template"] = _gguf_template(export_dir / v.path)
            except Exception:  # an unreadable GGUF is reported by its own candidate; here: no template read
                copies[f"{v.path} tokenizer.chat_template"] = None
    return copies


def check_chat(
    export_dir: str | Path,
    runtimes: Sequence[str] = (GENAI, "transformers.js"),
    variants: Optional[Sequence[str]] = None,
    missing: str = "skip",
) -> Optional[dict[str, Any]]:
    """Run the chat checks on a chat model's export (see the module doc); None for a base model.

    Args:
        export_dir: the export dir.
        runtimes: the ONNX runtimes conformance runs (``--runtimes``): onnxruntime-genai and transformers.js
            render only when listed (as their greedy checks); transformers always; llama.cpp and
            ExecuTorch when ``variants`` holds a GGUF / ``.pte`` variant.
        variants: the variants checked (None: all the manifest lists).
        missing: ``skip``: a runtime that is not installed (ImportError, no ``node``) is listed as
            ``skipped`` and left out of the checks, as the ONNX runtime checks do; ``fail``: it fails them.
    Returns:
        ``{"end_of_turn": {"token", "id"}, "conversations": {name: messages}, "reference": {name: ids},
        "runtimes": {runtime: {"ids": {name: ids}, "identical": bool, "stop_ids": [...],
        "end_of_turn_stops": bool, "version", "error"?}}, "template_copies": {file: bool},
        "checks": [{metric, value, tolerance, passed, note?}]}``. A runtime that cannot run fails.
    Raises:
        InvalidInput: the export's template is not the contract's (``chat_contract``; then every copy differs).
    """
    export_dir = Path(export_dir)
    try:
        contract = chat_contract(export_dir)
    except ValueError as err:  # a template other than the contract's: the copies check names where
        contract = {"error": str(err)}
    if contract is None:
        return None
    manifest = load_manifest(export_dir)
    wanted = set(variants) if variants else set(manifest.variants)
    tok = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    eot_text = contract.get("end_of_turn", END_OF_TURN)
    eot = tok.token_to_id(eot_text)
    expected = contract.get("chat_template", CHAT_TEMPLATE)
    convs = CONVERSATIONS
    ref = reference_ids(export_dir, convs)
    results: dict[str, dict[str, Any]] = {}

    def failed(err: Exception) -> dict[str, Any]:
        if missing == "skip" and isinstance(err, (ImportError, FileNotFoundError)):
            return {"skipped": f"not installed: {str(err).strip()[:300]}"}
        return _err(err)

    try:
        results[TRANSFORMERS] = _transformers(export_dir, convs, eot)
    except Exception as err:  # transformers is a dependency of conformance: never skipped
        results[TRANSFORMERS] = _err(err)
    serve_stops = sorted(set(stop_ids(export_dir)))
    results[SERVE] = {"stop_ids": serve_stops, "end_of_turn_stops": eot in serve_stops, "ids": None}
    onnx_variants = [v for v in ONNX_VARIANTS if v in wanted and v in manifest.variants]
    if GENAI in runtimes and onnx_variants:
        try:
            results[GENAI] = _genai(export_dir, convs, eot)
        except Exception as err:
            results[GENAI] = failed(err)
    ggufs = [v for n, v in manifest.variants.items() if n in wanted and v.format == "gguf"]
    tjs = "transformers.js" in runtimes and bool(onnx_variants)
    if tjs or ggufs:
        try:
            node = _node(export_dir, convs, eot, tjs, export_dir / ggufs[0].path if ggufs else None, serve_stops)
        except Exception as err:
            node = {name: failed(err) for name in ([TRANSFORMERS_JS] if tjs else []) + ([LLAMA_CPP] if ggufs else [])}
        for name, res in node.items():
            if "end_of_turn_is_eog" in res:
                res["end_of_turn_stops"] = res.pop("end_of_turn_is_eog")
            res.pop("template", None)
            results[name] = res
        if TRANSFORMERS_JS in results and "error" not in results[TRANSFORMERS_JS]:
            # transformers.js's generate stops at generation_config.json's eos_token_id (its generation_config)
            results[TRANSFORMERS_JS].update(stop_ids=serve_stops, end_of_turn_stops=eot in serve_stops)
    ptes = [v for n, v in manifest.variants.items() if n in wanted and v.format == "pte"]
    if ptes:
        texts = reference_texts(export_dir, convs)
        tok_json = export_dir / (ptes[0].tokenizer or "tokenizer.json")
        try:
            results[EXECUTORCH] = _executorch(export_dir / ptes[0].path, tok_json, texts, eot)
        except Exception as err:
            results[EXECUTORCH] = failed(err)
    for res in results.values():
        if res.get("ids") is not None:
            res["identical"] = res["ids"] == ref
    copies = {name: text == expected for name, text in template_copies(export_dir, manifest).items()}
    ran = {k: v for k, v in results.items() if "skipped" not in v}
    rendered = {k: v for k, v in ran.items() if k != SERVE}
    ids_ok = all(r.get("identical") is True for r in rendered.values())
    stops_ok = all(r.get("end_of_turn_stops") is True for r in ran.values())
    differ = sorted(k for k, r in rendered.items() if r.get("identical") is not True)
    no_stop = sorted(k for k, r in ran.items() if r.get("end_of_turn_stops") is not True)
    # a runtime whose stop set lacks one of the export's stop ids runs past it (serve's set is the export's)
    short = {k: sorted(set(serve_stops) - set(r.get("stop_ids") or [])) for k, r in ran.items()}
    short = {k: v for k, v in short.items() if v}
    bad_copies = sorted(k for k, ok in copies.items() if not ok)

    def check(metric: str, ok: bool, note: str) -> dict[str, Any]:
        return {
            "metric": metric,
            "value": ok,
            "tolerance": {"equals": True},
            "passed": ok,
            **({"note": note} if not ok else {}),
        }

    checks = [
        check("chat_template_ids_identical", ids_ok, f"ids differ from the reference in: {', '.join(differ)}"),
        check("chat_template_copies_identical", not bad_copies, f"template differs in: {', '.join(bad_copies)}"),
        check("chat_end_of_turn_stops", stops_ok, f"{eot_text} does not end generation in: {', '.join(no_stop)}"),
        check(
            "chat_stop_ids_stop",
            not short,
            "stop ids that do not end generation: " + "; ".join(f"{k} {v}" for k, v in short.items()),
        ),
    ]
    return {
        "end_of_turn": {"token": eot_text, "id": eot},
        "stop_ids": serve_stops,
        "conversations": convs,
        "reference": ref,
        "runtimes": results,
        "template_copies": copies,
        "contract_error": contract.get("error"),
        "checks": checks,
    }
