"""Small random stand-ins of real Hugging Face base models, built offline with transformers.

Each builder writes a folder as ``save_pretrained`` does (``config.json``, ``model.safetensors``,
``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json`` with the chat template,
``special_tokens_map.json``) whose config mirrors the real model's, scaled down (hidden 64, two
layers) so it loads and runs in well under a second, and whose tokenizer is built the way the real
one is: a byte-level BPE (HF ``tokenizers``) with the real pre-tokenizer (split regex + ByteLevel,
digits rule), trained on a little English from ``data/en`` only, so Bangla falls into the same
fertility trap as on the real base (about one token per UTF-8 byte), and the real special tokens
in their real places (SmolLM2's at ids 0..16, Llama 3's and Qwen2's appended after the vocabulary).
Nothing is downloaded.

- ``smollm2``: SmolLM2-135M-Instruct. ``LlamaConfig``, tied embeddings, GQA 4/2 (real 9/3),
  ``rope_theta`` 1e5, ``max_position_embeddings`` 8192, ``<|endoftext|>`` 0 / ``<|im_start|>`` 1 /
  ``<|im_end|>`` 2 (bos 1, eos 2, pad 2 as the instruct model's configs say), its ChatML template
  with the default system prompt; pre-tokenizer Digits(individual) + ByteLevel(regex).
- ``llama32``: Llama-3.2-1B-Instruct. ``LlamaConfig`` with ``rope_scaling`` type ``llama3`` (factor
  32, low/high frequency factors 1 and 4, original context 8192), ``rope_theta`` 5e5,
  ``max_position_embeddings`` 131072, ``head_dim`` 16, tied; 256 specials appended
  (``<|begin_of_text|>``, ``<|end_of_text|>``, ``<|start_header_id|>``, ``<|end_header_id|>``,
  ``<|eom_id|>``, ``<|eot_id|>``, the reserved ones), eos ids ``[end_of_text, eom_id, eot_id]``,
  the bos prepended by the post-processor, ``ignore_merges``; the Llama 3.x chat template without
  the tool-calling branches and with its fixed fallback date (the real one asks ``strftime_now``,
  which would make the rendered prompt depend on the day). ``config.json`` is written in the
  spelling the installed transformers writes (5.x: ``rope_parameters``); ``rope_spelling="v4"``
  rewrites it in transformers 4's (``rope_theta`` + ``rope_scaling``), as real Hub folders are.
- ``qwen25``: Qwen2.5-0.5B-Instruct. ``Qwen2Config`` (q/k/v biases), tied, GQA 4/2 (real 14/2),
  ``rope_theta`` 1e6, ``max_position_embeddings`` 32768, ``sliding_window`` set but
  ``use_sliding_window`` false (as shipped), ``vocab_size`` padded beyond the tokenizer's length
  (151936 vs 151665 on the real one); NFC normaliser, single-digit split, ``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>`` and the other Qwen specials appended, no bos, eos
  ``<|im_end|>``, pad ``<|endoftext|>``; its ChatML template with the default system prompt.

- ``tinyllama``: TinyLlama-1.1B-Chat-v1.0, Llama 2's SentencePiece-derived fast tokenizer: a BPE with
  byte fallback (``<0x00>`` .. ``<0xFF>`` at ids 3..258), pieces within one word and one script (as
  SentencePiece's trainer makes them: "▁word", ".", never "es."), merges as transformers converts a SentencePiece
  model (every split of every piece, in piece order), the ``Prepend("▁")`` + ``Replace(" ", "▁")``
  normaliser, no pre-tokenizer, ``<unk>`` 0 / ``<s>`` 1 / ``</s>`` 2, the bos prepended; untied,
  GQA, ``rope_theta`` 1e4, ``max_position_embeddings`` 2048; its Zephyr chat template (``eos_token``
  as a variable).

The weights are N(0, ``std``) with norms near 1 (as :func:`tests.fixtures.tiny_model`), biases
N(0, ``std``): a random stand-in's std is 0.125, so logits spread and a fault in RoPE, masks or biases is
not lost in rounding; a trained one (``train_steps``) starts from the real configs' ``initializer_range``
0.02, as the real models were, so that its logits are as spread as a trained model's and its quantised
variants are judged as a real model's would be (:func:`build_standin`).

    python tests/standins.py smollm2 /tmp/standin-smollm2
    python tests/standins.py llama32 /tmp/standin-llama32 [--rope-spelling v4]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

KINDS = ("smollm2", "llama32", "qwen25", "tinyllama")
_REPO = Path(__file__).resolve().parents[1]
_EN_FILES = ("pg11_Alice-s-Adventures-in-Wonderland.txt.gz", "pg35_The-Time-Machine.txt.gz")
_BN_FILE = "bn_pd_poems_bengali_poem_dataset.jsonl.gz"

#: The Hub ids the stand-ins mirror (written as ``_name_or_path`` like ``save_pretrained`` of a loaded model).
HUB_IDS = {
    "smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "llama32": "meta-llama/Llama-3.2-1B-Instruct",
    "qwen25": "Qwen/Qwen2.5-0.5B-Instruct",
    "tinyllama": "TinyLlama/TinyLlama-1.1B-Chat-v1.0",
}

# The pre-tokenizer split patterns, verbatim from the real tokenizer.json files.
LLAMA3_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SMOLLM2_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<repo_name>",
    "<reponame>",
    "<file_sep>",
    "<filename>",
    "<gh_stars>",
    "<issue_start>",
    "<issue_comment>",
    "<issue_closed>",
    "<jupyter_start>",
    "<jupyter_text>",
    "<jupyter_code>",
    "<jupyter_output>",
    "<jupyter_script>",
    "<empty_output>",
]
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

LLAMA3_NAMED = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    2: "<|reserved_special_token_0|>",
    3: "<|reserved_special_token_1|>",
    4: "<|finetune_right_pad_id|>",
    5: "<|reserved_special_token_2|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    8: "<|eom_id|>",
    9: "<|eot_id|>",
    10: "<|python_tag|>",
}
LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n"
    '    {%- set date_string = "26 Jul 2024" %}\n'
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    '    {%- set system_message = "" %}\n'
    "{%- endif %}\n"
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n'
    '{{- "Cutting Knowledge Date: December 2023\\n" }}\n'
    '{{- "Today Date: " + date_string + "\\n\\n" }}\n'
    "{{- system_message }}\n"
    '{{- "<|eot_id|>" }}\n'
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)

QWEN2_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN2_ADDED = [
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "{%- else %}\n"
    "    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'system' and loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def bangla_text(max_chars: int = 200_000) -> str:
    """Bangla poems of the bundled corpus (``data/bn``), at most ``max_chars`` characters."""
    parts, used = [], 0
    with gzip.open(_REPO / "data" / "bn" / _BN_FILE, "rt", encoding="utf-8") as fh:
        for line in fh:
            text = json.loads(line)["text"]
            parts.append(text)
            used += len(text)
            if used >= max_chars:
                break
    return "\n\n".join(parts)[:max_chars]


def _train(model: Any, tok: Any, steps: int, seed: int, seq: int = 128, batch: int = 16, lr: float = 3e-3) -> float:
    """``steps`` AdamW steps of next-token loss on English and Bangla from the bundled corpus.

    A random model's next-token distributions are flat: its top two logits are near ties almost
    everywhere, so any rounding (float16, int8, int4) flips its argmax and moves its bits/char far more
    than it moves a trained model's; briefly trained, the stand-in's distributions peak as a real base's
    do and the quantised variants are judged as a real model's would be. Returns the last loss (nats/token).
    """
    import torch

    ids = tok.encode("".join(english_lines(200_000))).ids + tok.encode(bangla_text(30_000)).ids
    data = torch.tensor(ids, dtype=torch.int64)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # hidden 64: one thread is fastest, and the tests' machine is shared
    try:
        for step in range(steps):
            loss = _step(model, opt, data, gen, step, steps, seq, batch, lr)
    finally:
        torch.set_num_threads(threads)
    model.eval()
    return float(loss)


def _step(model: Any, opt: Any, data: Any, gen: Any, step: int, steps: int, seq: int, batch: int, lr: float) -> Any:
    """One AdamW step on ``batch`` random windows of ``seq + 1`` tokens of ``data``; returns the loss."""
    import torch

    starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=gen)
    rows = torch.stack([data[s : s + seq + 1] for s in starts.tolist()])
    for group in opt.param_groups:  # linear warmup over the first tenth, then constant
        group["lr"] = lr * min(1.0, (step + 1) / max(1, steps // 10))
    loss = model(input_ids=rows[:, :-1], labels=rows[:, :-1].clone()).loss
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.detach()


def english_lines(max_chars: int = 400_000) -> Iterator[str]:
    """Lines of the bundled English corpus (``data/en``), at most ``max_chars`` characters in all."""
    used = 0
    for name in _EN_FILES:
        with gzip.open(_REPO / "data" / "en" / name, "rt", encoding="utf-8") as fh:
            for line in fh:
                if used >= max_chars:
                    return
                used += len(line)
                yield line


def _byte_level_bpe(kind: str, vocab_size: int) -> Any:
    """An untrained-then-trained byte-level BPE with ``kind``'s real normaliser and pre-tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama32"))
    if kind == "smollm2":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
            ]
        )
    else:
        pattern = LLAMA3_PATTERN if kind == "llama32" else QWEN2_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
            ]
        )
    if kind == "qwen25":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SMOLLM2_SPECIALS if kind == "smollm2" else [],
        show_progress=False,
    )
    tok.train_from_iterator(english_lines(), trainer=trainer)
    return tok


TINYLLAMA_TEMPLATE = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}"
    "\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)


def _sentencepiece_bpe(vocab_size: int) -> Any:
    """Llama 2's fast tokenizer layout: byte-fallback BPE over "▁"-joined text, bytes at ids 3..258."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers.tokenization_utils_base import generate_merges

    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    # SentencePiece's trainer keeps a piece within a word and a script (split_by_whitespace,
    # split_by_unicode_script): "▁word", "ord", ".", "▁(", never "d▁", "o▁w" or "es." (Latin + punctuation).
    # Trained over the whole "▁"-joined line instead, BPE learns pieces no SentencePiece model has, and a
    # runtime that splits text as SentencePiece does (onnxruntime-genai) gives other ids. So train on runs of
    # one script, each with its "▁" (the training text is English: Latin, and the rest), then ship no
    # pre-tokenizer, as Llama 2's tokenizer.json.
    runs = Regex("▁?\\p{Latin}+|▁?[^\\p{L}\\p{M}▁]+|▁?[\\p{L}\\p{M}&&[^\\p{Latin}]]+|▁")
    tok.pre_tokenizer = pre_tokenizers.Split(runs, behavior="isolated")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials + byte_tokens, show_progress=False)
    tok.train_from_iterator(english_lines(), trainer=trainer)
    data = json.loads(tok.to_str())  # the byte tokens are vocabulary entries, not added tokens, in Llama 2's
    data["pre_tokenizer"] = None
    data["added_tokens"] = [a for a in data["added_tokens"] if a["content"] in specials]
    # The merges as transformers' LlamaConverter writes a SentencePiece model's: every split of every
    # piece into two pieces, in the pieces' order (generate_merges); a trainer's own list has one per piece
    vocab = data["model"]["vocab"]
    data["model"]["merges"] = [list(m) for m in generate_merges(vocab, skip_tokens=[*specials, *byte_tokens])]
    tok = Tokenizer.from_str(json.dumps(data))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def build_tokenizer(kind: str, vocab_size: int = 1024) -> Any:
    """``kind``'s stand-in ``tokenizers.Tokenizer``: BPE of ``vocab_size`` entries plus its specials.

    Returns:
        ``tokenizers.Tokenizer`` (SmolLM2: specials at ids 0..16 inside ``vocab_size``; Llama 3:
        256 specials after it; Qwen2: 14 specials and 8 other added tokens after it).
    """
    from tokenizers import AddedToken, processors

    if kind == "tinyllama":
        return _sentencepiece_bpe(vocab_size)
    tok = _byte_level_bpe(kind, vocab_size)
    if kind == "llama32":
        n = tok.get_vocab_size()
        names = [LLAMA3_NAMED.get(i, f"<|reserved_special_token_{i - 8}|>") for i in range(256)]
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in names])
        bos = n
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
                processors.TemplateProcessing(
                    single="<|begin_of_text|> $A",
                    pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
                    special_tokens=[("<|begin_of_text|>", bos)],
                ),
            ]
        )
    elif kind == "qwen25":
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in QWEN2_SPECIALS])
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in QWEN2_ADDED])
        tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def _tokenizer_files(kind: str, tok: Any, out: Path) -> dict[str, Any]:
    """Write ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``; return the ids."""
    ids = {}
    if kind == "smollm2":
        kw = dict(bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>", unk_token="<|endoftext|>")
        kw["additional_special_tokens"] = ["<|im_start|>", "<|im_end|>"]
        template = SMOLLM2_TEMPLATE
    elif kind == "llama32":
        kw = dict(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        template = LLAMA3_TEMPLATE
    elif kind == "tinyllama":
        kw = dict(bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>")
        template = TINYLLAMA_TEMPLATE
    else:
        kw = dict(eos_token="<|im_end|>", pad_token="<|endoftext|>")
        kw["additional_special_tokens"] = [s for s in QWEN2_SPECIALS if s not in ("<|endoftext|>",)]
        template = QWEN2_TEMPLATE
    # The transformers-4 layout of the real Hub folders (transformers 5 writes "TokenizersBackend" and a
    # separate chat_template.jinja, which other runtimes such as transformers.js do not read).
    added = {
        str(tok.token_to_id(a.content)): {
            "content": a.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": a.special,
        }
        for a in tok.get_added_tokens_decoder().values()
    }
    cfg: dict[str, Any] = {"add_prefix_space": False} if kind not in ("llama32", "tinyllama") else {}
    cfg["added_tokens_decoder"] = added
    cfg.update({k: kw.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token") if k in kw})
    if kind == "qwen25":
        cfg["bos_token"] = None
    if "additional_special_tokens" in kw:
        cfg["additional_special_tokens"] = kw["additional_special_tokens"]
    cfg["chat_template"] = template
    cfg["clean_up_tokenization_spaces"] = False
    cfg["model_max_length"] = {"smollm2": 8192, "llama32": 131072, "qwen25": 131072, "tinyllama": 2048}[kind]
    cfg["tokenizer_class"] = {
        "smollm2": "GPT2Tokenizer",
        "llama32": "PreTrainedTokenizerFast",
        "qwen25": "Qwen2Tokenizer",
        "tinyllama": "LlamaTokenizer",
    }[kind]
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", "utf-8")
    smap = {k: v for k, v in kw.items() if k.endswith("_token") or k == "additional_special_tokens"}
    (out / "special_tokens_map.json").write_text(json.dumps(smap, indent=2, ensure_ascii=False) + "\n", "utf-8")
    for key in ("bos_token", "eos_token", "pad_token"):
        ids[key] = tok.token_to_id(kw[key]) if key in kw else None
    return ids


def build_standin(
    kind: str,
    out_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    vocab_size: int = 1024,
    max_position_embeddings: Optional[int] = None,
    rope_spelling: str = "v5",
    std: Optional[float] = None,
    seed: int = 0,
    train_steps: int = 0,
) -> Path:
    """Write ``kind``'s stand-in Hugging Face folder to ``out_dir`` (see the module docstring).

    Args:
        kind: one of :data:`KINDS`.
        vocab_size: the BPE's size before the appended specials (SmolLM2: including its 17).
        max_position_embeddings: default the real model's (8192, 131072, 32768).
        rope_spelling: ``"v5"`` (as the installed transformers writes) or ``"v4"`` (``rope_theta``
            and ``rope_scaling`` at the top level, as transformers 4 and most Hub folders have).
        std: weight standard deviation (and biases'); default 0.125 for a random stand-in, 0.02 (the real
            configs' ``initializer_range``) for a trained one. Trained 300 steps from 0.125, the Qwen2.5
            stand-in's int4 KL is 0.024-0.027 nats (the shipped bound 0.02); from 0.02 it is 0.009-0.016:
            quantisation noise in a logit scales with the weights' spread, and 300 steps do not shrink
            weights drawn 6x wider than any real model's.
        train_steps: AdamW steps of next-token training on the bundled English and Bangla text after the
            random init (0: random weights); see :func:`_train` for why a trained stand-in is what the
            quantised variants' tolerances are for.
    Returns:
        ``out_dir`` as a Path.
    Raises:
        ValueError: an unknown ``kind`` or ``rope_spelling``.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if kind not in KINDS:
        raise ValueError(f"stand-in kind {kind!r}: one of {', '.join(KINDS)}")
    if rope_spelling not in ("v4", "v5"):
        raise ValueError(f"rope_spelling {rope_spelling!r}: 'v4' or 'v5'")
    if std is None:
        std = 0.02 if train_steps else 0.125
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(kind, vocab_size)
    ids = _tokenizer_files(kind, tok, out)
    n_tok = tok.get_vocab_size()
    common = dict(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_act="silu",
        tie_word_embeddings=True,
        initializer_range=std,
    )
    if kind == "tinyllama":
        config = LlamaConfig(
            **{**common, "tie_word_embeddings": False},
            vocab_size=n_tok,
            max_position_embeddings=max_position_embeddings or 2048,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            bos_token_id=1,
            eos_token_id=2,
        )
        gen = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0, max_length=2048)
        model_cls: Any = LlamaForCausalLM
    elif kind == "smollm2":
        config = LlamaConfig(
            **common,
            vocab_size=n_tok,
            max_position_embeddings=max_position_embeddings or 8192,
            rms_norm_eps=1e-5,
            rope_theta=100000.0,
            bos_token_id=ids["bos_token"],
            eos_token_id=ids["eos_token"],
            pad_token_id=ids["pad_token"],
        )
        gen = dict(bos_token_id=ids["bos_token"], eos_token_id=ids["eos_token"], pad_token_id=ids["pad_token"])
        model_cls = LlamaForCausalLM
    elif kind == "llama32":
        eos_ids = [tok.token_to_id(s) for s in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
        config = LlamaConfig(
            **common,
            head_dim=hidden_size // 4,
            vocab_size=n_tok,
            max_position_embeddings=max_position_embeddings or 131072,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            },
            bos_token_id=ids["bos_token"],
            eos_token_id=eos_ids,
            mlp_bias=False,
            attention_bias=False,
        )
        gen = dict(bos_token_id=ids["bos_token"], eos_token_id=eos_ids, do_sample=True, temperature=0.6, top_p=0.9)
        model_cls = LlamaForCausalLM
    else:
        padded = -(-n_tok // 64) * 64 + 64  # the real vocab_size is padded past the tokenizer's length
        config = Qwen2Config(
            **common,
            vocab_size=padded,
            max_position_embeddings=max_position_embeddings or 32768,
            max_window_layers=num_hidden_layers,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            sliding_window=max_position_embeddings or 32768,
            use_sliding_window=False,
            bos_token_id=tok.token_to_id("<|endoftext|>"),
            eos_token_id=ids["eos_token"],
        )
        gen = dict(
            bos_token_id=tok.token_to_id("<|endoftext|>"),
            eos_token_id=[ids["eos_token"], tok.token_to_id("<|endoftext|>")],
            pad_token_id=ids["pad_token"],
            do_sample=True,
            temperature=0.7,
            top_p=0.8,
            repetition_penalty=1.05,
        )
        model_cls = Qwen2ForCausalLM
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, std)
    if train_steps:
        _train(model, tok, train_steps, seed)
    model.config._name_or_path = HUB_IDS[kind]
    model.generation_config = GenerationConfig(**gen)
    model.save_pretrained(str(out))
    if rope_spelling == "v4":
        _respell_v4(out / "config.json")
    return out


def _respell_v4(path: Path) -> None:
    """Rewrite transformers 5's ``rope_parameters`` as transformers 4's ``rope_theta`` + ``rope_scaling``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rope = dict(data.pop("rope_parameters", None) or {})
    data["rope_theta"] = rope.pop("rope_theta", 10000.0)
    data["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    data["transformers_version"] = "4.45.0"
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="Write a small random stand-in of a real HF base model.")
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("out_dir")
    parser.add_argument("--rope-spelling", choices=("v4", "v5"), default="v5")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--max-position-embeddings", type=int, default=None)
    parser.add_argument("--train-steps", type=int, default=0, help="AdamW steps on the bundled text (0: random)")
    args = parser.parse_args(argv)
    out = build_standin(
        args.kind,
        args.out_dir,
        hidden_size=args.hidden_size,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
        rope_spelling=args.rope_spelling,
        train_steps=args.train_steps,
    )
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
