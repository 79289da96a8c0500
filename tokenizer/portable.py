"""Which on-device runtimes reproduce a tokenizer id for id, and the tokenizer files each target gets.

A tokenizer is portable when every runtime an export targets encodes NFC text to the ids ``tokenizers``
gives. prodip's default tokenizer is built to be (``kind = "portable"`` in tokenizer/bpe.py): byte-level
BPE whose pre-tokenizer is a regex each runtime already implements (:data:`PRETOKENIZERS`), written in
``tokenizer.json`` as ``Sequence[Split(regex, isolated), ByteLevel(use_regex=false)]``, the form HF's
conversions of GPT-4o/Llama-3 tokenizers use and onnxruntime-extensions, transformers.js, llama.cpp's
converter and ExecuTorch's ``HFTokenizer`` read. :func:`portability` says per target whether a tokenizer
dir qualifies and why not; export targets call :func:`require_portable` before writing anything.

NFC contract: prodip NFC-normalises every text it takes (:func:`nfc`); ``tokenizer.json`` carries an NFC
normaliser for the runtimes that apply it. :data:`RUNTIME_NORMALISES` says which do; for the others the
app must normalise, and for ExecuTorch, whose ``HFTokenizer`` NFC step is broken (it keeps the first code
point of a precomposed character: কো becomes কে), :func:`write_target_files` ships ``tokenizer.json``
without the normaliser.

    python -m prodip.tokenizer.portable runs/demo/tokenizer      # the portability table
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import models

from prodip.base.errors import InvalidInput, MissingInput
from prodip.base.jsontypes import JSONObject, JSONValue, obj


@dataclass(frozen=True)
class Pretokenizer:
    """A standard pre-tokenizer regex and the name llama.cpp knows it by.

    Attributes:
        regex: the pattern, byte for byte as ``tokenizer.json`` holds it (Oniguruma/ECMAScript syntax).
        llama_cpp_pre: the GGUF ``tokenizer.ggml.pre`` value whose built-in pattern matches ``regex``.
        source: where the regex and the llama.cpp type come from.
    """

    regex: str
    llama_cpp_pre: str
    source: str


#: Standard pre-tokenizer patterns. "o200k-marks" is the default: the letter classes include combining
#: marks (\p{M}), so no Bengali vowel sign, virama or nukta is split from its letter (GPT-2's and
#: Llama-3's \p{L}+ split a Bangla word at every vowel sign: 1.4 and 2.1 chars/token).
PRETOKENIZERS: dict[str, Pretokenizer] = {
    "o200k-marks": Pretokenizer(
        regex=(
            r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        ),
        llama_cpp_pre="granite-embed-multi-97m",
        source="tiktoken o200k_base (GPT-4o), as quoted in llama.cpp src/llama-vocab.cpp under "
        "LLAMA_VOCAB_PRE_TYPE_GPT4O ('original regex from tokenizer.json'); llama.cpp's own "
        "LLAMA_VOCAB_PRE_TYPE_GRANITE_EMB_MULTI ('same lookaheads as GPT4O but with \\p{M} added', "
        "tokenizer.ggml.pre = granite-embed-multi-97m, ignore_merges = true) implements it; its "
        "gpt-4o type leaves \\p{M} out and splits Bangla words",
    ),
    "llama3": Pretokenizer(
        regex=(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        ),
        llama_cpp_pre="llama-bpe",
        source="Llama-3 tokenizer.json; llama.cpp src/llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_LLAMA3",
    ),
    "qwen2": Pretokenizer(
        regex=(
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        ),
        llama_cpp_pre="qwen2",
        source="Qwen2/Qwen2.5 tokenizer.json; llama.cpp src/llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_QWEN2",
    ),
    "gpt2": Pretokenizer(
        regex=r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        llama_cpp_pre="gpt-2",
        source="GPT-2 encoder.py; llama.cpp src/llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_GPT2",
    ),
}
#: Every pre-tokenizer :func:`pretokenizer_name` recognises: :data:`PRETOKENIZERS` (which prodip also trains
#: with) and those only met in imported tokenizers: SmolLM/SmolLM2's (Digits(individual) + ByteLevel(use_regex);
#: no Split regex to compare, recognised by its shape; the regex is GPT-2's, digits split first).
RECOGNISED: dict[str, Pretokenizer] = {
    **PRETOKENIZERS,
    "smollm": Pretokenizer(
        regex=PRETOKENIZERS["gpt2"].regex,
        llama_cpp_pre="smollm",
        source="SmolLM2 tokenizer.json; llama.cpp src/llama-vocab.cpp LLAMA_VOCAB_PRE_TYPE_SMOLLM",
    ),
}
DEFAULT_PRETOKENIZER = "o200k-marks"

#: Export targets (runtimes) :func:`portability` answers for; "tokenizers" is the reference.
TARGETS = ("tokenizers", "transformers", "transformers.js", "onnxruntime-genai", "llama.cpp", "executorch")

#: Whether each runtime applies tokenizer.json's NFC normaliser itself (measured with NFD input:
#: ো written as U+09C7 U+09BE, é as e + U+0301). False means the app must NFC-normalise first.
RUNTIME_NORMALISES: dict[str, bool] = {
    "tokenizers": True,
    "transformers": True,
    "transformers.js": True,
    "onnxruntime-genai": False,  # ignores the normaliser (0.18)
    "llama.cpp": False,  # a GGUF has no normaliser
    "executorch": False,  # HFTokenizer's NFC is broken; its file ships without one
}

#: Why a runtime cannot reproduce a tokenizer whose pre-tokenizer regex is not one of PRETOKENIZERS.
_CUSTOM_REGEX_REASON = {
    "onnxruntime-genai": "onnxruntime-extensions' regex engine handles only the patterns it knows "
    "(a custom regex fails with 'Invalid regex')",
    "llama.cpp": "a GGUF names one of llama.cpp's built-in pre-tokenizer types (tokenizer.ggml.pre); "
    "a custom regex cannot be carried",
    "executorch": "prodip verifies ExecuTorch's HFTokenizer only with the standard patterns",
}


def nfc(text: str) -> str:
    """The text in Unicode NFC: what every prodip surface does to text before it is tokenized."""
    return unicodedata.normalize("NFC", text)


def read_tokenizer_json(tokenizer_dir: str | os.PathLike) -> dict[str, Any]:
    """``tokenizer.json`` of a tokenizer (or export) dir as a dict.

    Raises:
        MissingInput: no tokenizer.json (``prodip tokenizer train`` makes one).
        InvalidInput: not valid JSON.
    """
    path = Path(tokenizer_dir) / "tokenizer.json"
    if not path.is_file():
        raise MissingInput(f"{path}: not found; train a tokenizer with `prodip tokenizer train`")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{path}: not valid JSON ({err})") from None


def pretokenizer_name(tok_json: dict[str, Any]) -> str | None:
    """The :data:`RECOGNISED` name of a byte-level ``tokenizer.json``'s pre-tokenizer, else None.

    Recognised form: ``Sequence[Split(Regex=R, behavior=Isolated, invert=false),
    ByteLevel(use_regex=false)]`` with R byte-identical to a known regex.
    """
    pre = tok_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if len(steps) != 2:
        return None
    if (  # SmolLM's (StarCoder's): single digits, then ByteLevel with its built-in GPT-2 regex
        steps[0].get("type") == "Digits"
        and steps[0].get("individual_digits") is True
        and steps[1].get("type") == "ByteLevel"
        and steps[1].get("use_regex") is True
        and not steps[1].get("add_prefix_space")
    ):
        return "smollm"
    split, byte_level = steps
    if (
        split.get("type") != "Split"
        or split.get("behavior") != "Isolated"
        or split.get("invert")
        or byte_level.get("type") != "ByteLevel"
        or byte_level.get("use_regex") is not False
        or byte_level.get("add_prefix_space")
    ):
        return None
    regex = (split.get("pattern") or {}).get("Regex")
    return next((name for name, p in PRETOKENIZERS.items() if p.regex == regex), None)


def merges_reproduce_vocab(tok_json: dict[str, Any]) -> list[str]:
    """Vocabulary tokens that their own merges do not rebuild (empty for a BPE trained by ``tokenizers``).

    llama.cpp encodes with ``ignore_merges`` for the o200k-marks and Llama-3 types (a pre-token found in
    the vocabulary is one token, merges skipped), while onnxruntime-extensions and ExecuTorch always
    merge. Both give the same ids exactly when merging each token's bytes rebuilds that token.
    """
    model = tok_json["model"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    bpe = models.BPE(vocab=model["vocab"], merges=merges, ignore_merges=False)
    specials = {t["content"] for t in tok_json.get("added_tokens", [])}
    return [
        token
        for token, i in model["vocab"].items()
        if token not in specials and [t.id for t in bpe.tokenize(token)] != [i]
    ]


#: The normaliser of Llama 2's (SentencePiece-derived) fast tokenizer: "▁" before the text, spaces as "▁".
_SPM_NORMALIZER = [{"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]


def is_byte_fallback(tok_json: dict[str, Any]) -> bool:
    """Whether ``tokenizer.json`` is a byte-fallback BPE (Llama 2 / TinyLlama: converted from SentencePiece)."""
    model = tok_json.get("model") or {}
    return model.get("type") == "BPE" and bool(model.get("byte_fallback"))


def sentencepiece_problems(tok_json: dict[str, Any]) -> list[str]:
    """Why llama.cpp's SentencePiece tokenizer (``tokenizer.ggml.model = "llama"``) would not give this
    byte-fallback BPE's ids (empty: it gives them).

    llama.cpp merges, at each step, the adjacent pair whose concatenation is the highest-scored vocabulary
    piece (``llm_tokenizer_spm``); HF's BPE merges the lowest-ranked pair of its merge list. They agree
    when the merge list is what transformers writes for a SentencePiece model (``generate_merges``,
    ``LlamaConverter``): every split of every piece into two pieces is a merge, and a piece's merges are
    adjacent in the list, pieces in rank order; the score of a piece is then minus the rank of its first
    merge (:func:`sentencepiece_scores`). Also needed: Llama 2's normaliser (``Prepend("▁")`` +
    ``Replace(" ", "▁")``, llama.cpp's ``add_space_prefix`` and space escaping) and no pre-tokenizer.
    """
    if not is_byte_fallback(tok_json):
        return ["not a byte-fallback BPE"]
    problems = []
    if _normalizer_steps(tok_json) != _SPM_NORMALIZER:
        problems.append("normaliser is not Llama 2's Prepend('▁') + Replace(' ', '▁')")
    if tok_json.get("pre_tokenizer") is not None:
        problems.append("a pre-tokenizer (llama.cpp's SentencePiece tokenizer has none)")
    vocab: dict[str, int] = tok_json["model"]["vocab"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in tok_json["model"]["merges"]]
    pairs = set(merges)
    seen: set[str] = set()
    for i, (a, b) in enumerate(merges):
        piece = a + b
        if piece in seen and a + b != "".join(merges[i - 1]):
            problems.append(f"the merges of {piece!r} are not adjacent in the merge list")
            break
        seen.add(piece)
    skip = {t["content"] for t in tok_json.get("added_tokens", [])} | {f"<0x{i:02X}>" for i in range(256)}
    for piece in vocab:
        if piece in skip:
            continue
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if (
                left in vocab
                and right in vocab
                and left not in skip
                and right not in skip
                and (left, right) not in pairs
            ):
                problems.append(
                    f"{left!r} + {right!r} -> {piece!r} is not a merge (SentencePiece merges every split of a piece; "
                    "this BPE was not converted from a SentencePiece model)"
                )
                return problems
    return problems


#: transformers classes whose constructor (transformers 5) builds the pipeline anew from tokenizer.json's vocabulary
#: and merges instead of running tokenizer.json as written: ``LlamaTokenizer`` sets no normaliser and a
#: ``Metaspace(prepend_scheme="first")`` pre-tokenizer, which turns a leading space into the "▁" it then does not
#: prepend (" Hello" -> ``▁Hello``, not SentencePiece's ``▁▁Hello``) and prepends nothing after a special token.
REBUILT_CLASSES = ("LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast")


def _normalizer_steps(tok_json: JSONObject) -> JSONValue:
    """``tokenizer.json``'s normaliser as a list of steps (a ``Sequence``'s ``normalizers``, else the one)."""
    norm = obj(tok_json.get("normalizer") or {}, where="tokenizer.json normalizer")
    return norm.get("normalizers") if norm.get("type") == "Sequence" else [norm]


def tokenizer_config_as_written(tok_json: JSONObject, tokenizer_config: JSONObject) -> JSONObject:
    """``tokenizer_config.json`` naming a class that runs ``tokenizer.json`` as written: a copy.

    A SentencePiece-derived fast tokenizer (byte fallback, Llama 2's ``Prepend("▁")`` + ``Replace(" ", "▁")``
    normaliser: Llama 2, TinyLlama) whose ``tokenizer_class`` is one of :data:`REBUILT_CLASSES` gets
    ``PreTrainedTokenizerFast``, which transformers 4 and 5 and transformers.js load from ``tokenizer.json``
    as it is. ``tokenizer.json`` is the truth: it is what SentencePiece gives (``add_dummy_prefix`` before the
    text, every space kept), what the chat models were fine-tuned with (transformers 4's fast tokenizer,
    "▁" after ``</s>`` too), and what llama.cpp, onnxruntime-genai, transformers.js and ExecuTorch run.
    transformers 5.24's ``LlamaTokenizer`` rebuilds it (:data:`REBUILT_CLASSES`) and parts from it on a
    leading space and after a special token. Any other tokenizer is returned unchanged.

    Args:
        tok_json: the parsed ``tokenizer.json``; tokenizer_config: the parsed ``tokenizer_config.json``.
    Returns:
        A new dict (the input is not modified).
    """
    out = dict(tokenizer_config)
    if (
        out.get("tokenizer_class") in REBUILT_CLASSES
        and is_byte_fallback(tok_json)
        and _normalizer_steps(tok_json) == _SPM_NORMALIZER
        and tok_json.get("pre_tokenizer") is None
    ):
        out["tokenizer_class"] = "PreTrainedTokenizerFast"
    return out


def sentencepiece_scores(tok_json: dict[str, Any]) -> dict[str, float]:
    """Piece -> llama.cpp score for :func:`sentencepiece_problems`-clean merges: minus the rank of the piece's
    first merge; a piece no merge makes (single characters, bytes) scores below every merged one."""
    merges = tok_json["model"]["merges"]
    scores: dict[str, float] = {}
    for rank, m in enumerate(merges):
        scores.setdefault("".join(m.split(" ", 1)) if isinstance(m, str) else "".join(m), -float(rank))
    floor = -float(len(merges))
    return {piece: scores.get(piece, floor - i) for piece, i in tok_json["model"]["vocab"].items()}


def _byte_level_problems(tok_json: dict[str, Any]) -> list[str]:
    model = tok_json.get("model") or {}
    problems = []
    if model.get("type") != "BPE":
        problems.append(f"model type {model.get('type')!r}, expected BPE")
    if model.get("byte_fallback"):
        problems.append("byte-fallback BPE (SentencePiece-style, not byte-level)")
    if (tok_json.get("decoder") or {}).get("type") != "ByteLevel":
        problems.append("decoder is not ByteLevel")
    norm = (tok_json.get("normalizer") or {}).get("type")
    if norm not in (None, "NFC"):
        problems.append(f"normaliser {norm!r} (only NFC or none is portable)")
    return problems


def portability(tokenizer_dir: str | os.PathLike) -> dict[str, tuple[bool, str]]:
    """Whether each target runtime reproduces the tokenizer's ids on NFC text, and why (not).

    Args:
        tokenizer_dir: a tokenizer dir or export dir (reads its ``tokenizer.json``).

    Returns:
        ``{target: (ok, reason)}`` for every name in :data:`TARGETS`; ``reason`` says what was checked
        or what fails, and whether the app must NFC-normalise.

    Raises:
        MissingInput / InvalidInput: see :func:`read_tokenizer_json`.
    """
    tok_json = read_tokenizer_json(tokenizer_dir)
    name = pretokenizer_name(tok_json)
    problems = _byte_level_problems(tok_json)
    out: dict[str, tuple[bool, str]] = {}
    for target in TARGETS:
        norm = "" if RUNTIME_NORMALISES[target] else "; the app NFC-normalises first"
        if target in ("tokenizers", "transformers", "transformers.js"):
            out[target] = (True, "reads tokenizer.json as written")
        elif problems:
            out[target] = (False, "; ".join(problems))
        elif name is None:
            out[target] = (False, _CUSTOM_REGEX_REASON[target])
        else:
            out[target] = (True, f"standard pre-tokenizer {name!r}" + norm)
    if is_byte_fallback(tok_json):
        spm = sentencepiece_problems(tok_json)
        out["llama.cpp"] = (
            (False, "byte-fallback BPE: " + "; ".join(spm))
            if spm
            else (True, "SentencePiece (tokenizer.ggml.model 'llama', scores from the merge ranks)")
        )
    if name is not None and not problems and out["llama.cpp"][0]:
        stray = merges_reproduce_vocab(tok_json)
        if stray:
            out["llama.cpp"] = (
                False,
                f"{len(stray)} vocabulary tokens are not rebuilt by their own merges "
                f"(e.g. {stray[0]!r}), and llama.cpp skips merges for in-vocabulary words",
            )
        else:
            out["llama.cpp"] = (
                True,
                f"tokenizer.ggml.pre = {RECOGNISED[name].llama_cpp_pre!r} "
                f"(pre-tokenizer {name!r}); the app NFC-normalises first",
            )
    return out


def require_portable(tokenizer_dir: str | os.PathLike, target: str) -> None:
    """Refuse, before anything is written, a tokenizer that ``target`` cannot reproduce.

    Raises:
        InvalidInput: unknown target, or the target cannot reproduce the tokenizer (names both and why).
    """
    if target not in TARGETS:
        raise InvalidInput(f"unknown tokenizer target {target!r}; known: {', '.join(TARGETS)}")
    ok, reason = portability(tokenizer_dir)[target]
    if not ok:
        raise InvalidInput(
            f"{Path(tokenizer_dir) / 'tokenizer.json'}: {target} cannot reproduce this "
            f"tokenizer: {reason}. Train the default portable tokenizer "
            "(`prodip tokenizer train --kind portable`) to export to it"
        )


#: Files of a tokenizer dir that travel with an export.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def write_target_files(tokenizer_dir: str | os.PathLike, out_dir: str | os.PathLike, target: str) -> list[Path]:
    """Write the tokenizer files ``target`` reads into ``out_dir`` (after :func:`require_portable`).

    Every target gets ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json``;
    ExecuTorch's ``tokenizer.json`` has no normaliser (its NFC step is broken; the app normalises).
    llama.cpp reads its vocabulary from the GGUF instead (tokenizer/gguf.py).

    Returns:
        the paths written.

    Raises:
        InvalidInput: the target cannot reproduce the tokenizer. MissingInput: a file is missing.
    """
    require_portable(tokenizer_dir, target)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if not src.is_file():
            raise MissingInput(f"{src}: not found; re-run `prodip tokenizer train`")
        dst = out / name
        if name == "tokenizer.json" and target == "executorch":
            tok_json = read_tokenizer_json(tokenizer_dir)
            tok_json["normalizer"] = None
            dst.write_text(json.dumps(tok_json, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
        else:
            shutil.copyfile(src, dst)
        written.append(dst)
    return written


def format_portability(table: dict[str, tuple[bool, str]]) -> str:
    """The portability table as text, one target per line."""
    return "\n".join(f"{target:<18} {'yes' if ok else 'NO ':<4} {reason}" for target, (ok, reason) in table.items())


def _main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m prodip.tokenizer.portable TOKENIZER_DIR", file=sys.stderr)
        return 2
    table = portability(argv[0])
    print(format_portability(table))
    return 0 if all(ok for ok, _ in table.values()) else 1


if __name__ == "__main__":
    from prodip.base.cli import tool_main

    sys.exit(tool_main("tokenizer.portable", _main, sys.argv[1:]))
