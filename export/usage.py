"""The model card's "How to use" section, generated from the export's variants and its chat contract.

It says which file each runtime loads, whether the model chats (its chat format and end-of-turn token) and
gives one snippet per runtime: transformers, transformers.js, onnxruntime-genai, llama.cpp through
node-llama-cpp, ExecuTorch, and ``prodip serve`` with the openai client. A chat model's snippets send a
conversation (``apply_chat_template`` or the runtime's own chat session, node-llama-cpp's with its system
prompt set: its default is an English one this model never saw); a base model's continue a text. The same
snippets are docs/devices.md's "Chat with the model" (tests/export/test_usage.py runs each against a tiny chat
export and checks the page holds them).

    python -c "from prodip.export.usage import snippets; print(snippets(chat=True, export='.')['transformers'])"
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

#: the example request of every snippet (a chat model: one user turn; a base model: a text to continue)
USER = "Translate into Bangla: I am very happy today."
TEXT = "বাংলাদেশের রাজধানী"
NEW_TOKENS = 40

_TRANSFORMERS_CHAT = """\
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{export}")
model = AutoModelForCausalLM.from_pretrained("{export}")
messages = [{{"role": "user", "content": "{user}"}}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
output = model.generate(**inputs, max_new_tokens={n}, do_sample=False)  # stops at {eot} (generation_config.json)
print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
"""
_TRANSFORMERS_TEXT = """\
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{export}")
model = AutoModelForCausalLM.from_pretrained("{export}")
inputs = tokenizer("{text}", return_tensors="pt")
output = model.generate(**inputs, max_new_tokens={n}, do_sample=False)
print(tokenizer.decode(output[0], skip_special_tokens=True))
"""
_TRANSFORMERSJS_CHAT = """\
import {{ AutoModelForCausalLM, AutoTokenizer, env }} from "@huggingface/transformers";

env.allowRemoteModels = false;
env.localModelPath = "{parent}/"; // the folder that holds the export folder
const tokenizer = await AutoTokenizer.from_pretrained("{name}");
const model = await AutoModelForCausalLM.from_pretrained("{name}", {{ dtype: "{dtype}" }}); // {dtypes}
{q4_wasm}const messages = [{{ role: "user", content: "{user}" }}];
const inputs = tokenizer.apply_chat_template(messages, {{ add_generation_prompt: true, return_dict: true }});
const output = await model.generate({{ ...inputs, max_new_tokens: {n}, do_sample: false }});
const reply = output.slice(null, [inputs.input_ids.dims[1], null]);
console.log(tokenizer.batch_decode(reply, {{ skip_special_tokens: true }})[0]);
"""
_TRANSFORMERSJS_TEXT = """\
import {{ AutoModelForCausalLM, AutoTokenizer, env }} from "@huggingface/transformers";

env.allowRemoteModels = false;
env.localModelPath = "{parent}/"; // the folder that holds the export folder
const tokenizer = await AutoTokenizer.from_pretrained("{name}");
const model = await AutoModelForCausalLM.from_pretrained("{name}", {{ dtype: "{dtype}" }}); // {dtypes}
{q4_wasm}const inputs = tokenizer("{text}");
const output = await model.generate({{ ...inputs, max_new_tokens: {n}, do_sample: false }});
console.log(tokenizer.decode(output[0], {{ skip_special_tokens: true }}));
"""
_GENAI_CHAT = """\
import json

import onnxruntime_genai as og

model = og.Model(og.Config("{export}"))  # genai_config.json: {genai}
tokenizer = og.Tokenizer(model)
messages = json.dumps([{{"role": "user", "content": "{user}"}}])
prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))  # writes <|bos|>
params = og.GeneratorParams(model)
params.set_search_options(max_length=len(prompt) + {n})  # greedy; stops at {eot} (genai_config.json)
generator = og.Generator(model, params)
generator.append_tokens(prompt)
while not generator.is_done():
    generator.generate_next_token()
print(tokenizer.decode(generator.get_sequence(0)[len(prompt) :]))
"""
_GENAI_TEXT = """\
import onnxruntime_genai as og

model = og.Model(og.Config("{export}"))  # genai_config.json: {genai}
tokenizer = og.Tokenizer(model)
tokenizer.update_options(add_special_tokens="true")  # start with <|bos|>, as every training document did
prompt = tokenizer.encode("{text}")
params = og.GeneratorParams(model)
params.set_search_options(max_length=len(prompt) + {n})
generator = og.Generator(model, params)
generator.append_tokens(prompt)
while not generator.is_done():
    generator.generate_next_token()
print(tokenizer.decode(generator.get_sequence(0)))
"""
_LLAMA_CHAT = """\
import {{getLlama, LlamaChatSession}} from "node-llama-cpp";

const llama = await getLlama({{gpu: false, build: "never"}});
const model = await llama.loadModel({{modelPath: "{export}/{gguf}"}});
const context = await model.createContext();
// systemPrompt set: node-llama-cpp's default is an English system prompt this model never saw ("" = none)
const session = new LlamaChatSession({{contextSequence: context.getSequence(), systemPrompt: ""}});
console.log(await session.prompt("{user}", {{maxTokens: {n}, temperature: 0}}));
"""
_LLAMA_TEXT = """\
import {{getLlama, LlamaCompletion}} from "node-llama-cpp";

const llama = await getLlama({{gpu: false, build: "never"}});
const model = await llama.loadModel({{modelPath: "{export}/{gguf}"}});
const context = await model.createContext();
const completion = new LlamaCompletion({{contextSequence: context.getSequence()}});
console.log(await completion.generateCompletion("{text}", {{maxTokens: {n}, temperature: 0}}));
"""
_EXECUTORCH_CHAT = """\
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner
from transformers import AutoTokenizer

messages = [{{"role": "user", "content": "{user}"}}]
prompt = AutoTokenizer.from_pretrained("{export}").apply_chat_template(
    messages, add_generation_prompt=True, tokenize=False
)  # the chat template's text, <|bos|> included (num_bos=0)
runner = TextLLMRunner(
    "{export}/{pte}",
    "{export}/executorch/tokenizer.json",
)
runner.generate(prompt, GenerationConfig(max_new_tokens={n}, temperature=0, num_bos=0, echo=False))
"""
_EXECUTORCH_TEXT = """\
from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

runner = TextLLMRunner(
    "{export}/{pte}",
    "{export}/executorch/tokenizer.json",
)
runner.generate("{text}", GenerationConfig(max_new_tokens={n}, temperature=0, num_bos=1))
"""
_SERVE_CHAT = """\
# prodip serve {export}   (another shell; http://127.0.0.1:8000/ is its playground)
from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
model = client.models.list().data[0].id
messages = [{{"role": "user", "content": "{user}"}}]
reply = client.chat.completions.create(model=model, messages=messages, max_tokens={n}, temperature=0)
print(reply.choices[0].message.content)
"""
_SERVE_TEXT = """\
# prodip serve {export}   (another shell; http://127.0.0.1:8000/ is its playground)
from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
model = client.models.list().data[0].id
reply = client.completions.create(model=model, prompt="{text}", max_tokens={n}, temperature=0)
print(reply.choices[0].text)
"""

#: The transformers.js snippets' note for q4 in a browser: onnxruntime-web's WASM build has no 4-bit kernel, so the
#: export's page loads the WASM q4 file (``onnx/model_wasm_q4.onnx``: the q4 file's int4 weights, read from its
#: weights file, requantised to 8-bit once at load with the session option below: q8's kernels). Not for Node
#: (onnxruntime-node has fast 4-bit kernels for the q4 file itself).
Q4_WASM = """\
// in a browser (device "wasm"), q4 as the export's page loads it: 4-bit download, 8-bit weights made at load
// { dtype: "q4", device: "wasm", model_file_name: "model_wasm", session_options: {
//   extra: { session: { disable_quant_qdq: "1" } },
//   externalData: [{ path: "model_q4.onnx_data", data: "onnx/model_q4.onnx_data" }] } }
"""

#: runtime -> (language, chat template, text template, the runtime's name in words)
_SNIPPETS: dict[str, tuple[str, str, str, str]] = {
    "transformers": ("python", _TRANSFORMERS_CHAT, _TRANSFORMERS_TEXT, "transformers (Python)"),
    "transformers.js": ("js", _TRANSFORMERSJS_CHAT, _TRANSFORMERSJS_TEXT, "transformers.js (Node)"),
    "onnxruntime-genai": ("python", _GENAI_CHAT, _GENAI_TEXT, "onnxruntime-genai"),
    "llama.cpp": ("js", _LLAMA_CHAT, _LLAMA_TEXT, "llama.cpp through node-llama-cpp"),
    "executorch": ("python", _EXECUTORCH_CHAT, _EXECUTORCH_TEXT, "ExecuTorch (the runner its apps use)"),
    "prodip serve": ("python", _SERVE_CHAT, _SERVE_TEXT, "`prodip serve` and the openai client"),
}


def _files(variants: Mapping[str, Mapping[str, Any]], fmt: str) -> list[tuple[str, str]]:
    return [(name, str(v["path"])) for name, v in variants.items() if v.get("format") == fmt]


def snippets(
    chat: bool,
    export: str,
    variants: Optional[Mapping[str, Mapping[str, Any]]] = None,
    end_of_turn: str = "<|im_end|>",
) -> dict[str, tuple[str, str]]:
    """Runtime -> (fence language, code) for the runtimes ``variants`` hold (None: every runtime, with the
    default file names), reading the export at ``export`` (a path as the reader types it).

    Raises:
        nothing: a runtime with no variant in ``variants`` is left out.
    """
    variants = variants if variants is not None else _DEFAULT_VARIANTS
    onnx = [v for v in variants.values() if v.get("format") == "onnx"]
    dtypes = [str(v["transformersjs_dtype"]) for v in onnx if v.get("transformersjs_dtype")]
    genai = next((v for v in onnx if v.get("genai_default")), onnx[0] if onnx else None)
    gguf, pte = _files(variants, "gguf"), _files(variants, "pte")
    path = Path(export)
    values = {
        "export": export,
        "parent": path.parent.as_posix(),
        "name": path.name,
        "user": USER,
        "text": TEXT,
        "n": NEW_TOKENS,
        "eot": end_of_turn,
        "dtype": "q4" if "q4" in dtypes else (dtypes[0] if dtypes else ""),
        "dtypes": ", ".join(dtypes),
        "q4_wasm": Q4_WASM if "q4" in dtypes else "",
        "genai": (genai or {}).get("genai_path") or (genai or {}).get("path", ""),
        "gguf": next((p for n, p in gguf if "q4" in n), gguf[0][1] if gguf else ""),
        "pte": next((p for n, p in pte if n == "pte-fp32"), pte[0][1] if pte else ""),
    }
    has = {
        "transformers": any(v.get("format") == "safetensors" for v in variants.values()),
        "transformers.js": bool(dtypes),
        "onnxruntime-genai": genai is not None,
        "llama.cpp": bool(gguf),
        "executorch": bool(pte),
        "prodip serve": bool(onnx),
    }
    return {
        runtime: (lang, (chat_code if chat else text_code).format(**values))
        for runtime, (lang, chat_code, text_code, _) in _SNIPPETS.items()
        if has[runtime]
    }


#: every variant with its default file, for docs/devices.md (the demo-devices export's files)
_DEFAULT_VARIANTS: dict[str, dict[str, Any]] = {
    "safetensors": {"format": "safetensors", "path": "model.safetensors"},
    "int4": {
        "format": "onnx",
        "path": "onnx/model_q4.onnx",
        "transformersjs_dtype": "q4",
        "genai_default": True,
        "genai_path": "onnx/model_q4_genai.onnx",
    },
    "gguf-q4_k_m": {"format": "gguf", "path": "gguf/model-q4_k_m.gguf"},
    "pte-fp32": {"format": "pte", "path": "executorch/model.pte"},
}


def _runtime_rows(variants: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = ["| runtime | loads | variants |", "|---|---|---|"]
    fmt = {name: v.get("format") for name, v in variants.items()}
    onnx = [(n, v) for n, v in variants.items() if fmt[n] == "onnx"]
    if "safetensors" in variants:
        rows.append("| transformers | `model.safetensors`, `config.json`, `generation_config.json` | safetensors |")
    if onnx:
        js = ", ".join(
            f"`{v['transformersjs_dtype']}` → `{v['path']}`" for _, v in onnx if v.get("transformersjs_dtype")
        )
        rows.append(
            f"| transformers.js (Node, the browser page `index.html`) | `dtype` {js} | {', '.join(n for n, _ in onnx)} |"
        )
        genai = [
            f"`{v.get('genai_path') or v['path']}`" + (" (default)" if v.get("genai_default") else "") for _, v in onnx
        ]
        rows.append(
            f"| onnxruntime-genai | `genai_config.json`: {', '.join(genai)} | {', '.join(n for n, _ in onnx)} |"
        )
        plain = ", ".join(f"`{v['path']}`" for _, v in onnx)
        rows.append(f"| ONNX Runtime, `prodip serve` | {plain} | {', '.join(n for n, _ in onnx)} |")
    for kind, runtime in (("gguf", "llama.cpp (Ollama, LM Studio, node-llama-cpp)"), ("pte", "ExecuTorch")):
        files = _files(variants, kind)
        if files:
            extra = ", `executorch/tokenizer.json`" if kind == "pte" else ""
            rows.append(
                f"| {runtime} | {', '.join(f'`{p}`' for _, p in files)}{extra} | {', '.join(n for n, _ in files)} |"
            )
    return rows


def how_to_use(variants: Mapping[str, Mapping[str, Any]], contract: Optional[Mapping[str, Any]]) -> str:
    """The README's ``## How to use`` section (markdown).

    Args:
        variants: the manifest's variants (name -> its entry as a dict: ``path``, ``format``,
            ``transformersjs_dtype``, ``genai_path``, ``genai_default``).
        contract: :func:`prodip.base.chat.chat_contract` of the export dir (None: a base model).
    """
    chat = contract is not None
    eot = str(contract["end_of_turn"]) if contract else ""
    eot_id = contract["end_of_turn_id"] if contract else None
    lines = ["## How to use", "", "These files are this model, the one this card describes. Each runtime loads:", ""]
    lines += [*_runtime_rows(variants), ""]
    if chat:
        lines += [
            f"This is a chat model. Its chat template (`tokenizer_config.json` `chat_template`, also in every GGUF) "
            "writes ChatML: `<|bos|>` once, then each message as `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`, then "
            f"`<|im_start|>assistant\\n` for the reply. A reply ends with `{eot}` (id {eot_id}), "
            "the end-of-turn token every runtime's configuration stops at. Send conversations through the template, "
            "not raw text.",
            "",
        ]
    else:
        lines += ["This is a base language model (no chat template): give it text to continue.", ""]
    for runtime, (lang, code) in snippets(chat, "path/to/this/export", variants, eot or "<|eos|>").items():
        lines += [f"{_SNIPPETS[runtime][3]}:", "", f"```{lang}", code.rstrip("\n"), "```", ""]
    return "\n".join(lines)
