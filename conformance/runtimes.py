"""The runtime axis of conformance: each ONNX variant run by the on-device runtimes that load an export.

For every ONNX variant, onnxruntime-genai (its Python API, through the export's
``genai_config.json``), transformers.js (``@huggingface/transformers`` in Node, the dtype whose
file name is the variant's) and onnxruntime-web's WASM backend (the build transformers.js loads in a
browser, run under Node from the npm package: ``ortweb_greedy.mjs``) generate greedily from the fixed Bangla and English prompts; their
ids must equal ONNX Runtime's on the same file (onnxruntime-genai runs each variant's
shared-buffer graph ``onnx/<file>_genai.onnx``, as its manifest ``genai_overlay`` says, against ONNX
Runtime on the variant's own file, same weights) (:class:`prodip.conformance.runners.OrtRunner`,
batch 1, unpadded, the same stopping rule: ``max_new_tokens`` new tokens or the end-of-sequence id,
included). onnxruntime-web's logits at every greedy step must also be within the variant's
tolerance of ONNX Runtime's (``max_abs_logit`` where its table bounds it, else ``kl_mean``); a file
the WASM build cannot load fails with ONNX Runtime's error, which names the operator. For the fp32 variant ONNX Runtime's ids must also equal the training model's. Each
runtime is a gated check of the variant's candidate: a runtime that fails, or cannot run (not
installed, load error), fails that variant's verdict.

Installing the runtimes: ``pip install 'prodip[runtimes]'`` (onnxruntime-genai) and, in the
repository's ``node/`` folder, ``npm install --ignore-scripts --prefix node`` (transformers.js and onnxruntime-node's bundled CPU
binaries; the post-install script would download CUDA binaries).

    python -m prodip.conformance runs/demo/export --shards-dir runs/demo/shards --runtimes onnxruntime-genai,transformers.js
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from prodip.base.variants import BY_NAME
from prodip.conformance.compare import check_value
from prodip.conformance.runners import OrtRunner, TorchRunner
from prodip.export.genai import variant_overlay

GENAI, TRANSFORMERS_JS, ORT_WEB = "onnxruntime-genai", "transformers.js", "onnxruntime-web"
RUNTIMES = (GENAI, TRANSFORMERS_JS, ORT_WEB)
#: Prompts (keys of ``prodip.conformance.inputs.PROMPTS``) every runtime decodes.
RUNTIME_PROMPTS = ("bn", "en")
#: The Node script that runs transformers.js (beside this file).
NODE_SCRIPT = Path(__file__).with_name("transformersjs_greedy.mjs")
#: The Node script that runs onnxruntime-web's WASM backend (beside this file).
ORT_WEB_SCRIPT = Path(__file__).with_name("ortweb_greedy.mjs")
#: Timeout of one Node run (s): loading 4 variants and decoding 2 prompts of a small model takes seconds.
NODE_TIMEOUT_S = 900


def node_root() -> Path:
    """The folder whose ``node_modules`` holds ``@huggingface/transformers``: ``$PRODIP_NODE_ROOT``,
    else the repository's ``node/`` (its ``package.json``; ``npm install --ignore-scripts --prefix node``)."""
    env = os.environ.get("PRODIP_NODE_ROOT")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "node"


def _stops(eos_id: Union[None, int, Collection[int]]) -> frozenset[int]:
    return frozenset() if eos_id is None else frozenset([eos_id] if isinstance(eos_id, int) else eos_id)


def stop_ids(export_dir: Path) -> list[int]:
    """The ids that end generation by the export's ``generation_config.json`` (``eos_token_id``, an int or a
    list), else ``config.json``'s: what every runner here stops at."""
    for name in ("generation_config.json", "config.json"):
        path = Path(export_dir) / name
        if path.is_file():
            eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
            if eos is not None:
                return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    return []


def truncate_at_eos(ids: Sequence[int], prompt_len: int, eos_id: Union[None, int, Collection[int]]) -> list[int]:
    """``ids`` up to and including the first generated id of ``eos_id`` (an id, or the ids that end generation:
    a chat model's ``<|eos|>`` and ``<|im_end|>``); the prompt is never cut."""
    ids = [int(i) for i in ids]
    stops = _stops(eos_id)
    for j in range(prompt_len, len(ids)):
        if ids[j] in stops:
            return ids[: j + 1]
    return ids


def runner_greedy(
    runner: Any,
    prompt: Sequence[int],
    max_new_tokens: int,
    eos_id: Union[None, int, Collection[int]],
    step_logits: Optional[list] = None,
) -> list[int]:
    """Greedy ids (prompt + new) from a conformance runner, batch 1, no padding, KV cache.

    Args:
        runner: a :class:`prodip.conformance.runners.Runner` (ONNX Runtime or the training model).
        prompt: token ids.
        max_new_tokens: new tokens at most (tokens).
        eos_id: stop after generating this id, or any of these ids (it is included), or None.
        step_logits: if given, each step's last-row logits (float32 [vocab]) are appended to it.
    """
    stops = _stops(eos_id)
    ids = [int(i) for i in prompt]
    x = np.asarray([ids], np.int64)
    logits, state = runner.forward(x, np.ones_like(x), np.arange(len(ids), dtype=np.int64)[None])
    for step in range(max_new_tokens):
        if step_logits is not None:
            step_logits.append(np.asarray(logits[0, -1], np.float32))
        nxt = int(np.argmax(logits[0, -1]))
        ids.append(nxt)
        if nxt in stops or step + 1 == max_new_tokens:
            break
        n = len(ids)
        logits, state = runner.forward(
            np.asarray([[nxt]], np.int64), np.ones((1, n), np.int64), np.asarray([[n - 1]], np.int64), state
        )
    return ids


def genai_greedy(
    export_dir: Path, onnx_file: str, prompts: Sequence[Sequence[int]], max_new_tokens: int, threads: int = 0
) -> dict[str, Any]:
    """Greedy ids from onnxruntime-genai: ``og.Config(export_dir)`` (its ``genai_config.json``) with the
    manifest's ``genai_overlay`` of the variant whose file is ``onnx_file`` (for a contrib export: its
    shared-buffer graph, ``onnx/<file>_genai.onnx``); a file no variant lists: that file, no shared buffer.

    Returns:
        ``{"ids": [[prompt + new ids], ...], "stop_ids": genai_config.json's eos ids, "versions": {...}}``,
        each ending with the EOS that stopped
        it, as the other runners' do: onnxruntime-genai (0.18) stops on its ``eos_token_id`` but leaves
        that token out of ``get_sequence()``, so a sequence that stopped before ``max_length`` gets it
        back (a model that ends its text within the new tokens failed every variant's check without).
    Raises:
        ImportError: onnxruntime-genai is not installed (the message says how to install it).
        RuntimeError: onnxruntime-genai refused the config or the model.
    """
    try:
        import onnxruntime_genai as og  # noqa: PLC0415 (optional dependency: prodip[runtimes])
    except ImportError:
        raise ImportError("onnxruntime-genai is not installed: pip install 'prodip[runtimes]'") from None
    eos = json.loads((Path(export_dir) / "genai_config.json").read_text(encoding="utf-8"))["model"].get("eos_token_id")
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    config = og.Config(str(export_dir))
    overlay = variant_overlay(export_dir, onnx_file)
    if threads:
        overlay["model"]["decoder"]["session_options"] = {"intra_op_num_threads": threads}
    config.overlay(json.dumps(overlay))
    model = og.Model(config)
    out = []
    for prompt in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + max_new_tokens)
        gen = og.Generator(model, params)
        gen.append_tokens(list(prompt))
        while not gen.is_done():
            gen.generate_next_token()
        seq = [int(i) for i in gen.get_sequence(0)]
        stopped_early = len(seq) < len(prompt) + max_new_tokens  # only an EOS stops it before max_length
        if stopped_early:  # which of the eos ids stopped it: the token it chose last (get_next_tokens)
            nxt = [int(t) for t in gen.get_next_tokens()] or eos_ids[:1]
            if nxt[0] in eos_ids and seq[-1:] != nxt[:1]:
                seq.append(nxt[0])
        out.append(seq)
    return {"ids": out, "stop_ids": eos_ids, "versions": {"onnxruntime-genai": getattr(og, "__version__", None)}}


def transformersjs_greedy(
    export_dir: Path, dtypes: Sequence[str], prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> dict[str, Any]:
    """Greedy ids from transformers.js in Node for each dtype (one Node process for all).

    Returns:
        ``{"versions": {...}, "results": {dtype: {"ids": [[...], ...]} or {"error": str}}}``.
    Raises:
        FileNotFoundError: ``node`` is not on PATH, or ``@huggingface/transformers`` is not installed
            under :func:`node_root` (the message says how to install it).
        RuntimeError: the Node script failed (its stderr tail is in the message).
    """
    node = shutil.which("node")
    if node is None:
        raise FileNotFoundError(
            "node is not on PATH: transformers.js needs Node >= 18 "
            "(then `npm install --ignore-scripts --prefix node` in the prodip repository)"
        )
    root = node_root()
    if not (root / "node_modules" / "@huggingface" / "transformers").is_dir():
        raise FileNotFoundError(
            f"{root}/node_modules/@huggingface/transformers: missing; run "
            f"`npm install --ignore-scripts` in {root} (or set PRODIP_NODE_ROOT)"
        )
    job = {
        "export_dir": str(Path(export_dir).resolve()),
        "dtypes": list(dtypes),
        "prompts": [list(map(int, p)) for p in prompts],
        "max_new_tokens": max_new_tokens,
        "node_root": str(root),
    }
    proc = subprocess.run(
        [node, str(NODE_SCRIPT)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"node {NODE_SCRIPT.name} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ortweb_greedy(
    export_dir: Path,
    files: Sequence[str],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    model_cfg: Any,
    stop: Optional[Collection[int]] = None,
) -> dict[str, Any]:
    """Greedy ids and per-step logits from onnxruntime-web's WASM backend in Node, for each ONNX file.

    Args:
        export_dir: the export dir; files: ONNX paths relative to it (weights in ``<file>_data``).
        prompts: token ids; max_new_tokens: new tokens per prompt; model_cfg: layers, kv heads,
            head dim and eos id of the model (the KV-cache inputs' shapes); stop: the ids that end
            generation (default: the model's eos id).
    Returns:
        ``{"versions": {...}, "results": {file: {"ids": [[...]], "logits": [[[float] per step]]}
        or {"error": str}}}``.
    Raises:
        FileNotFoundError: ``node`` is not on PATH, or onnxruntime-web is not installed under
            :func:`node_root` (it comes with transformers.js).
        RuntimeError: the Node script failed (its stderr tail is in the message).
    """
    node = shutil.which("node")
    root = node_root()
    if node is None or not (root / "node_modules" / "onnxruntime-web" / "dist").is_dir():
        raise FileNotFoundError(
            f"onnxruntime-web needs node on PATH and {root}/node_modules/onnxruntime-web "
            f"(`npm install --ignore-scripts` in {root}: it comes with transformers.js)"
        )
    job = {
        "export_dir": str(Path(export_dir).resolve()),
        "files": list(files),
        "prompts": [list(map(int, p)) for p in prompts],
        "max_new_tokens": max_new_tokens,
        "stop_ids": [int(i) for i in (stop if stop is not None else [model_cfg.eos_token_id]) if i is not None],
        "num_layers": model_cfg.num_hidden_layers,
        "num_kv_heads": model_cfg.num_key_value_heads,
        "head_dim": model_cfg.head_dim,
        "node_root": str(root),
    }
    proc = subprocess.run(
        [node, str(ORT_WEB_SCRIPT)], input=json.dumps(job), capture_output=True, text=True, timeout=NODE_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise RuntimeError(f"node {ORT_WEB_SCRIPT.name} exited {proc.returncode}: {proc.stderr.strip()[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class _TempModel:
    """Context manager: a temporary ONNX file (weights inline), removed on exit."""

    def __init__(self, model: Any) -> None:
        import tempfile  # noqa: PLC0415

        self._dir = tempfile.TemporaryDirectory(prefix="prodip_fp32_compute_")
        self.path = Path(self._dir.name) / "model.onnx"
        import onnx  # noqa: PLC0415

        onnx.save_model(model, str(self.path))

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: Any) -> None:
        self._dir.cleanup()


def fp32_compute_copy(path: Path) -> Optional[_TempModel]:
    """A copy of the ONNX file ``path`` whose ``MatMulNBits`` nodes have ``accuracy_level`` 0, or None if none differs.

    ONNX Runtime's CPU build honours ``accuracy_level`` 4 (activations quantised to int8 inside
    MatMulNBits, prodip's int4 default); onnxruntime-web's WASM kernel computes in float32 whatever the
    attribute says. Measured on a tiny export's q4 file: WASM vs CPU at level 4, max |logit diff| 6e-2;
    vs CPU at level 0, 2e-6. So the WASM runtime is compared with ONNX Runtime doing its arithmetic on
    the same weights; the other runtimes with the file as it is.
    """
    import onnx  # noqa: PLC0415

    model = onnx.load(str(path))
    changed = False
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            for attr in node.attribute:
                if attr.name == "accuracy_level" and attr.i != 0:
                    attr.i, changed = 0, True
    return _TempModel(model) if changed else None


def logits_agreement(ref: Sequence[np.ndarray], cand: Sequence[Sequence[float]]) -> dict[str, float]:
    """max |logit difference| and mean KL(ref || cand) (nats) over the steps both decoded.

    ``ref``: ONNX Runtime's last-row logits per step; ``cand``: the runtime's, same steps (greedy
    paths that diverge are compared up to the shorter one; the ids check catches the divergence).
    """
    from prodip.conformance.compare import kl_per_position  # noqa: PLC0415

    n = min(len(ref), len(cand))
    if n == 0:
        return {"max_abs_logit": math.inf, "kl_mean": math.inf}
    a, b = np.stack(ref[:n]).astype(np.float64), np.asarray(cand[:n], np.float64)
    return {"max_abs_logit": float(np.abs(a - b).max()), "kl_mean": float(kl_per_position(a, b).mean())}


#: Metric name of each runtime's check in a candidate's checks (``{equals: true}``, gated).
RUNTIME_METRICS = {
    GENAI: "genai_greedy_identical",
    TRANSFORMERS_JS: "transformersjs_greedy_identical",
    ORT_WEB: "ortweb_wasm_greedy_identical",
}
#: onnxruntime-web's logits vs ONNX Runtime's on the same file, bounded by the variant's own
#: tolerance table: ``max_abs_logit`` where it has one (the exact variants), else ``kl_mean``.
ORT_WEB_LOGITS_METRIC = "ortweb_wasm_logits"
#: fp32 only: ONNX Runtime's ids on the runtime prompts equal the training model's.
REFERENCE_METRIC = "runtime_prompts_reference_identical"


def planned_metrics(variant: str, runtimes: Sequence[str]) -> list[str]:
    """The runtime metrics gated for an ONNX ``variant`` (known before anything runs)."""
    return (
        [RUNTIME_METRICS[r] for r in runtimes]
        + ([ORT_WEB_LOGITS_METRIC] if ORT_WEB in runtimes else [])
        + ([REFERENCE_METRIC] if variant == "fp32" and runtimes else [])
    )


def _not_installed(err: Any) -> bool:
    """The runtime is not installed (onnxruntime-genai's ImportError; ``node`` or its package missing:
    :func:`transformersjs_greedy`'s FileNotFoundError), as opposed to installed and failing."""
    return isinstance(err, (ImportError, FileNotFoundError))


def _result(name: str, got: Any, want: list[list[int]], skip_missing: bool) -> dict[str, Any]:
    """:func:`_compare`, or ``{ids_identical: None, skipped: reason}`` for a runtime that is not installed
    when ``skip_missing`` (the tokenizer parity check's rule: listed as skipped, not a failure)."""
    if skip_missing and _not_installed(got):
        return {
            "ids_identical": None,
            "ids": None,
            "error": None,
            "skipped": f"not installed: {str(got).strip()[:300]}",
        }
    return _compare(name, got, want)


def _compare(name: str, got: Any, want: list[list[int]]) -> dict[str, Any]:
    """One runtime's result: ``{ids_identical, ids, error}``; an exception is a failed result."""
    if isinstance(got, Exception):
        return {"ids_identical": False, "ids": None, "error": f"{type(got).__name__}: {str(got).strip()[:600]}"}
    if "error" in got:
        return {"ids_identical": False, "ids": None, "error": f"{name}: {got['error']}"}
    return {"ids_identical": got["ids"] == want, "ids": got["ids"], "error": None}


def check_runtimes(
    export_dir: Path,
    candidates: Sequence[Any],
    prompts: dict[str, list[int]],
    reference: Any,
    model_cfg: Any,
    runtimes: Sequence[str],
    max_new_tokens: int,
    threads: int = 0,
    missing: str = "skip",
    tolerances: Optional[dict[str, dict[str, Any]]] = None,
) -> dict[str, dict[str, Any]]:
    """Run every ONNX candidate in each runtime and compare greedy ids with ONNX Runtime's on the same file.

    A runtime that is not installed is, with ``missing="skip"``, listed as skipped (``skipped``: the reason)
    and no check (as the tokenizer's parity check does, and ``make RUNTIMES=0`` promises); with
    ``missing="fail"`` it fails every variant's check.

    Args:
        export_dir: the export dir.
        candidates: the suite's candidates (``kind == "onnx"`` ones are run; ``path`` relative to the dir).
        prompts: prompt name -> token ids (the training tokenizer's encoding, special tokens included);
            cut to ``max_position_embeddings - max_new_tokens`` tokens so that prompt + new tokens fit.
        reference: the training model (``prodip.train.model.LlamaForCausalLM``, fp32, eval).
        model_cfg: its ``ModelConfig`` (layers, kv heads, head dim, eos id).
        runtimes: names from :data:`RUNTIMES` (empty: nothing is run).
        max_new_tokens: new tokens per prompt (tokens).
        threads: ONNX Runtime / onnxruntime-genai intra-op threads (0 = library default).
        tolerances: the tolerance file's tables (``candidate.tolerance_table`` -> metric -> bound):
            onnxruntime-web's logits are held to the variant's ``max_abs_logit`` (else ``kl_mean``).
    Returns:
        candidate name -> ``{"prompts": [names], "prompt_ids": [[ids]], "onnxruntime": [[ids]], "runtimes": {runtime:
        {ids_identical, ids, error}}, "reference_identical": bool (fp32 only), "checks": [...]}``, the
        checks in the suite's format, one per runtime (and the fp32 reference check). Never raises for
        a runtime's failure: it is a failed check with the error.
    """
    onnx_cands = [c for c in candidates if c.kind == "onnx"]
    if not runtimes or not onnx_cands:
        return {}
    # prompt + new tokens must fit the context (onnxruntime-genai refuses max_length > context_length)
    room = max(1, model_cfg.max_position_embeddings - max_new_tokens)
    names, ids = list(prompts), [list(prompts[k])[:room] for k in prompts]
    eos = stop_ids(export_dir) or [model_cfg.eos_token_id]  # a chat model's: <|eos|> and <|im_end|>
    ref_ids = [runner_greedy(TorchRunner(reference, "reference"), p, max_new_tokens, eos) for p in ids]
    tjs: Any = None
    if TRANSFORMERS_JS in runtimes:
        dtypes = [BY_NAME[c.variant].transformersjs_dtype for c in onnx_cands]
        try:
            tjs = transformersjs_greedy(export_dir, dtypes, ids, max_new_tokens)
        except Exception as err:  # not installed, node failed: every variant's check fails with it
            tjs = err
    web: Any = None
    if ORT_WEB in runtimes:
        try:
            web = ortweb_greedy(export_dir, [c.path for c in onnx_cands], ids, max_new_tokens, model_cfg, eos)
        except Exception as err:  # not installed, node failed: every variant's check fails with it
            web = err
    out: dict[str, dict[str, Any]] = {}
    for cand in onnx_cands:
        runner = OrtRunner(
            export_dir / cand.path,
            cand.name,
            num_layers=model_cfg.num_hidden_layers,
            num_kv_heads=model_cfg.num_key_value_heads,
            head_dim=model_cfg.head_dim,
            threads=threads,
        )
        ort_logits: list[list[np.ndarray]] = [[] for _ in ids]
        want = [
            truncate_at_eos(runner_greedy(runner, p, max_new_tokens, eos, steps), len(p), eos)
            for p, steps in zip(ids, ort_logits)
        ]
        results: dict[str, dict[str, Any]] = {}
        extra_checks: list[dict[str, Any]] = []
        if GENAI in runtimes:
            try:
                got: Any = genai_greedy(export_dir, cand.path, ids, max_new_tokens, threads)
                # cut at genai's own stop ids (genai_config.json), not the export's: an end of turn missing
                # there lets genai run past it, and that must show as different ids
                got["ids"] = [truncate_at_eos(g, len(p), got["stop_ids"]) for g, p in zip(got["ids"], ids)]
            except Exception as err:  # a runtime that cannot run fails this variant
                got = err
            results[GENAI] = _result(GENAI, got, want, missing == "skip")
        if TRANSFORMERS_JS in runtimes:
            dtype = BY_NAME[cand.variant].transformersjs_dtype
            got = tjs if isinstance(tjs, Exception) else tjs["results"].get(dtype, {"error": f"no result for {dtype}"})
            if isinstance(got, dict) and "ids" in got:
                got = {"ids": [truncate_at_eos(g, len(p), eos) for g, p in zip(got["ids"], ids)]}
            results[TRANSFORMERS_JS] = _result(f"transformers.js dtype {dtype}", got, want, missing == "skip")
            results[TRANSFORMERS_JS]["dtype"] = dtype
            if isinstance(tjs, dict):
                results[TRANSFORMERS_JS]["versions"] = tjs.get("versions")
        skipped_web = ORT_WEB in runtimes and missing == "skip" and _not_installed(web)
        if skipped_web:
            results[ORT_WEB] = _result(ORT_WEB, web, want, True)
        elif ORT_WEB in runtimes:
            got = web if isinstance(web, Exception) else web["results"].get(cand.path, {"error": "no result"})
            web_want, web_logits, fp32_compute = want, ort_logits, fp32_compute_copy(export_dir / cand.path)
            if fp32_compute is not None:  # ONNX Runtime doing the WASM kernels' arithmetic on the same weights
                with fp32_compute as path:
                    again = OrtRunner(
                        path,
                        cand.name,
                        num_layers=model_cfg.num_hidden_layers,
                        num_kv_heads=model_cfg.num_key_value_heads,
                        head_dim=model_cfg.head_dim,
                        threads=threads,
                    )
                    web_logits = [[] for _ in ids]
                    web_want = [
                        truncate_at_eos(runner_greedy(again, p, max_new_tokens, eos, steps), len(p), eos)
                        for p, steps in zip(ids, web_logits)
                    ]
            res = _compare(f"onnxruntime-web (WASM) {cand.path}", got, web_want)
            if fp32_compute is not None:
                res["reference"] = "ONNX Runtime, MatMulNBits accuracy_level 0 (fp32 compute, as the WASM kernel)"
            table = (tolerances or {}).get(cand.tolerance_table, {})
            metric = "max_abs_logit" if "max_abs_logit" in table else "kl_mean"
            bound = table.get(metric)
            value: Any = None
            if isinstance(got, dict) and "logits" in got:
                agreement = [logits_agreement(r, c) for r, c in zip(web_logits, got["logits"])]
                value = max(a[metric] for a in agreement)
                res["logits"] = {m: max(a[m] for a in agreement) for m in ("max_abs_logit", "kl_mean")}
            passed = value is not None and (bound is None or check_value(value, bound))
            extra_checks.append(
                {
                    "metric": ORT_WEB_LOGITS_METRIC,
                    "value": value,
                    "tolerance": bound or {},
                    "passed": passed,
                    "note": res["error"] or f"{metric} vs ONNX Runtime on the same file, max over prompts",
                }
            )
            if isinstance(web, dict):
                res["versions"] = web.get("versions")
            results[ORT_WEB] = res
        checks = [
            {
                "metric": RUNTIME_METRICS[r],
                "value": res["ids_identical"],
                "tolerance": {"equals": True},
                "passed": res["ids_identical"],
                **({"note": res["error"]} if res["error"] else {}),
            }
            for r, res in results.items()
            if not res.get("skipped")
        ] + [c for c in extra_checks if not skipped_web]
        entry = {"prompts": names, "prompt_ids": ids, "onnxruntime": want, "runtimes": results, "checks": checks}
        if cand.variant == "fp32":
            same = want == [truncate_at_eos(r, len(p), eos) for r, p in zip(ref_ids, ids)]
            entry["reference_identical"] = same
            checks.append({"metric": REFERENCE_METRIC, "value": same, "tolerance": {"equals": True}, "passed": same})
        out[cand.name] = entry
    return out
