"""The pipeline's stages as ``prodip run`` sees them: config table, artifact paths, completeness, entry.

Each stage is called through its package's public Python entry with its own config dataclass
(torchtitan-style: a stage receives only its own config). Paths between stages are derived
from the run's ``out_dir`` unless the TOML table sets them.

    python -c "from prodip import stages; print(stages.ORDER)"
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from prodip.config import ConfigError, from_dict

log = logging.getLogger("prodip.run")

ORDER = ["tokenizer", "data", "train", "eval", "export", "conformance", "serve"]

# table name -> "module:ConfigClass"
CONFIG_CLASSES = {
    "tokenizer": "prodip.tokenizer.bpe:TokenizerTrainConfig",
    "audit": "prodip.tokenizer.audit:AuditConfig",
    "data": "prodip.tokenizer.encode:DataPrepareConfig",
    "model": "prodip.train.config:ModelConfig",
    "train": "prodip.train.trainer:TrainConfig",
    "eval": "prodip.train.eval:EvalConfig",
    "export": "prodip.export.config:ExportConfig",
    "conformance": "prodip.conformance.config:ConformanceConfig",
    "serve": "prodip.serve.config:ServeConfig",
}
SECTIONS = list(CONFIG_CLASSES)


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def paths(out_dir: Path) -> dict[str, Path]:
    """Where each artifact of a run lives, relative to the run's ``out_dir``."""
    return {
        "tokenizer": out_dir / "tokenizer",
        "shards": out_dir / "shards",
        "train": out_dir / "train",
        "eval": out_dir / "train" / "eval.json",
        "export": out_dir / "export",
        "conformance": out_dir / "conformance",
    }


def stage_defaults(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Values ``prodip run`` fills in before the TOML table (the table may override them).

    Also used by the stage commands (``prodip train --config PIPELINE.toml``): a file with a
    top-level ``out_dir`` places every stage's artifacts under it, whichever command reads it.
    """
    p = {k: str(v) for k, v in paths(out_dir).items()}
    return {
        "tokenizer": {"out_dir": p["tokenizer"]},
        "audit": {"tokenizer_dir": p["tokenizer"]},
        "data": {"tokenizer_dir": p["tokenizer"], "out_dir": p["shards"]},
        "model": {},
        "train": {"shards_dir": p["shards"], "tokenizer_dir": p["tokenizer"], "out_dir": p["train"]},
        "eval": {"checkpoint": p["train"], "shards_dir": p["shards"], "out": p["eval"]},
        "export": {"checkpoint": p["train"], "out": p["export"]},
        "conformance": {"export_dir": p["export"], "checkpoint": p["train"], "out": p["conformance"],
                        "shards_dir": p["shards"]},
        "serve": {"export_dir": p["export"]},
    }


def resolve_all(config_path: str, tables: dict[str, dict], out_dir: Path) -> dict[str, Any]:
    """Build every stage's config dataclass: run defaults < TOML table.

    Raises:
        ConfigError: an unknown key or wrong type in a table, naming the file and table.
    """
    base = stage_defaults(out_dir)
    plan = {}
    for name, ref in CONFIG_CLASSES.items():
        cls = _load(ref)
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in base[name].items() if k in fields}
        data.update(tables.get(name, {}))
        plan[name] = from_dict(cls, data, source=f"{config_path} [{name}]")
    return plan


# stage -> the stage whose artifact it reads
DEPENDS = {"data": "tokenizer", "train": "data", "eval": "train", "export": "train",
           "conformance": "export", "serve": "conformance"}


def check_plan(plan: dict[str, Any], wanted: list[str], *, source: str) -> None:
    """Checks that span several tables, made before any stage runs (not hours into training).

    Raises:
        ConfigError: a sequence longer than the context window, a model vocabulary that differs
            from the tokenizer's, a served variant that is not exported, or a requested stage whose
            input stage is neither requested nor complete.
    """
    if not wanted:
        raise ConfigError(f"{source}: no stages to run; stages are {', '.join(ORDER)}")
    model = plan["model"]
    for table in ("train", "eval"):
        if plan[table].seq_len > model.max_position_embeddings:
            raise ConfigError(f"{source} [{table}] seq_len = {plan[table].seq_len} exceeds [model] "
                              f"max_position_embeddings = {model.max_position_embeddings}")
    if plan["tokenizer"].vocab_size != model.vocab_size:
        raise ConfigError(f"{source} [model] vocab_size = {model.vocab_size} differs from [tokenizer] "
                          f"vocab_size = {plan['tokenizer'].vocab_size}; they must be equal")
    exported = plan["export"].variants
    if "serve" in wanted and exported and plan["serve"].variant not in exported:
        raise ConfigError(f"{source} [serve] variant = {plan['serve'].variant!r} is not among [export] "
                          f"variants {exported}")
    for name in wanted:
        dep = DEPENDS.get(name)
        if dep and dep not in wanted and not STAGES[dep].done(plan):
            raise ConfigError(f"stage {name!r} needs the output of stage {dep!r}, which is neither complete "
                              f"in this run's out_dir nor among the stages to run")
    for name, table in (("tokenizer", "tokenizer"), ("data", "data")):
        if name in wanted and not plan[table].inputs:
            raise ConfigError(f"{source} [{table}] inputs: no corpus given; expected e.g. "
                              f"inputs = {{bn = [\"data/bn\"], en = [\"data/en\"]}}")


@dataclass
class Stage:
    """One pipeline stage: ``run(plan)`` produces its artifact; ``done(plan)`` says it is complete."""

    describe: Callable[[dict], str]
    done: Callable[[dict], bool]
    run: Callable[..., Any]


# ---- tokenizer ------------------------------------------------------------------------------

def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def _tokenizer_done(plan: dict) -> bool:
    """Trained, audited and through the fertility gate."""
    fert = _read_json(Path(plan["tokenizer"].out_dir) / "fertility.json")
    return bool(fert and fert.get("gate", {}).get("passed"))


def _data_done(plan: dict) -> bool:
    """Shards exist and were encoded with the current tokenizer."""
    from prodip.tokenizer.bpe import tokenizer_sha256
    meta = _read_json(Path(plan["data"].out_dir) / "meta.json")
    try:
        return bool(meta) and meta.get("tokenizer_sha256") == tokenizer_sha256(plan["data"].tokenizer_dir)
    except (FileNotFoundError, ValueError):
        return False


def _latest_model_sha256(plan: dict) -> str | None:
    """sha256 of the newest checkpoint's weights (None if there is none yet)."""
    from prodip.train import checkpoint
    try:
        weights = checkpoint.resolve_checkpoint(plan["train"].out_dir) / "model.safetensors"
        st = weights.stat()
    except (FileNotFoundError, ValueError):
        return None
    return _file_sha256_cached(str(weights), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=64)
def _file_sha256_cached(path: str, mtime_ns: int, size: int) -> str:
    """The done-checks ask for the same hashes several times per run (GBs at 0.4B scale): hash
    each (path, mtime, size) once per invocation."""
    from prodip.files import file_sha256
    return file_sha256(path)


def _tokenizer_run(plan: dict) -> None:
    """Train the tokenizer, audit it on held-out text and apply the fertility gate.

    Raises:
        ValueError: the gate failed (the message names each language, its figure and the minimum).
    """
    from prodip.tokenizer import audit, bpe
    # Not done means never trained, or audited and failed: (re)train, since the [tokenizer] table
    # may have changed since (a run that never passed this stage takes the new config).
    bpe.train_tokenizer(dataclasses.replace(plan["tokenizer"], overwrite=True))
    report = audit.run_audit(plan["audit"])  # writes fertility.json
    print(audit.format_table(report), flush=True)
    if not report["gate"]["passed"]:
        raise ValueError("tokenizer fertility gate failed: " + "; ".join(report["gate"]["failures"])
                         + f" (see {Path(plan['tokenizer'].out_dir) / 'fertility.json'})")


# ---- data -----------------------------------------------------------------------------------

def _data_run(plan: dict) -> None:
    from prodip.tokenizer import encode
    cfg = plan["data"]
    stale = (Path(cfg.out_dir) / "meta.json").exists()  # shards of an earlier tokenizer of this run
    encode.prepare_shards(dataclasses.replace(cfg, overwrite=True) if stale else cfg)


# ---- train ----------------------------------------------------------------------------------

def _train_done(plan: dict) -> bool:
    from prodip.train import checkpoint
    try:
        ckpt = checkpoint.resolve_checkpoint(plan["train"].out_dir)
    except (FileNotFoundError, ValueError):
        return False
    try:
        state = json.loads((ckpt / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # damaged: training resumes, and names what is wrong
        log.warning("%s: unreadable trainer_state.json (%s); the checkpoint is not complete", ckpt, err)
        return False
    return int(state["step"]) >= plan["train"].steps


def _train_run(plan: dict) -> None:
    from prodip.train import trainer
    cfg = plan["train"]
    if (Path(cfg.out_dir) / "checkpoints" / "latest").exists():
        cfg = dataclasses.replace(cfg, resume=True)  # an interrupted run continues
    trainer.train(cfg, plan["model"])


# ---- eval, export, conformance --------------------------------------------------------------

def _eval_run(plan: dict) -> None:
    from prodip.train import eval as evaluation
    evaluation.evaluate(plan["eval"])


def _export_run(plan: dict) -> None:
    from prodip import export
    cfg = plan["export"]
    stale = (Path(cfg.out) / "manifest.json").exists()  # an export of an earlier checkpoint of this run
    export.export_checkpoint(dataclasses.replace(cfg, force=True) if stale else cfg)


def _eval_done(plan: dict) -> bool:
    """eval.json exists and scores the newest checkpoint."""
    ev = _read_json(Path(plan["eval"].out))
    return bool(ev) and ev.get("checkpoint", {}).get("model_sha256") == _latest_model_sha256(plan)


def _export_done(plan: dict) -> bool:
    """The export exists, every file its manifest lists is there with its recorded size and sha256
    (a deleted, truncated or altered file means export again), and it was made from the newest
    checkpoint. Hashing reads the whole export once per invocation (~10 s at the 0.4B scale)."""
    out = Path(plan["export"].out)
    manifest = _read_json(out / "manifest.json")
    if not manifest:
        return False
    for rel, entry in (manifest.get("files") or {}).items():
        path = out / rel
        try:
            st = path.stat()
        except OSError:
            log.warning("%s: missing from the export; exporting again", path)
            return False
        if st.st_size != entry.get("bytes"):
            log.warning("%s: %d bytes, the export manifest says %s; exporting again", path, st.st_size,
                        entry.get("bytes"))
            return False
        if _file_sha256_cached(str(path), st.st_mtime_ns, st.st_size) != entry.get("sha256"):
            log.warning("%s: sha256 differs from the export manifest's; exporting again", path)
            return False
    return manifest["source_checkpoint"].get("model_sha256") == _latest_model_sha256(plan)


def _conformance_done(plan: dict) -> bool:
    """The current export carries a passing verdict (a re-export clears it) that was measured on
    the export's current files (the sha256 of its manifest's files table)."""
    from prodip.export.manifest import files_table_sha256
    manifest = _read_json(Path(plan["export"].out) / "manifest.json")
    verdict = (manifest or {}).get("conformance") or {}
    if verdict.get("passed") and verdict.get("export_files_sha256") != files_table_sha256(manifest.get("files") or {}):
        log.warning("%s: the conformance verdict was measured on other files; checking again", plan["export"].out)
        return False
    return bool(verdict.get("passed")) and (Path(plan["conformance"].out) / "report.json").exists()


def _conformance_run(plan: dict) -> None:
    from prodip import conformance
    report = conformance.run_conformance(plan["conformance"])
    if not report.get("passed"):
        raise ValueError(f"conformance failed: see {Path(plan['conformance'].out) / 'report.md'}")


# ---- serve ----------------------------------------------------------------------------------

def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released; a tiny race is acceptable here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _http_json(url: str, body: dict | None = None, timeout_s: float = 120.0) -> dict:
    """GET (no body) or POST JSON; an HTTP error raises RuntimeError with the server's error body.

    Sends ``Authorization: Bearer $PRODIP_API_KEY`` when that variable is set (the server reads it too).
    """
    data = None if body is None else json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if os.environ.get("PRODIP_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['PRODIP_API_KEY']}"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"{url}: HTTP {err.code}: {err.read().decode('utf-8', 'replace')[:500]}") from None


def _serve_run(plan: dict, *, prompts: dict[str, str], max_tokens: int, timeout_s: float,
               out_dir: Path, sampling: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start ``prodip serve`` on a free loopback port, fetch one completion per prompt, stop it.

    Args:
        prompts: language -> prompt text.
        max_tokens: new tokens per completion.
        timeout_s: how long to wait for ``/health`` (seconds).
        out_dir: where ``completions.json`` and ``serve.log`` go.
        sampling: extra OpenAI completion parameters (``temperature``, ``top_p``,
            ``frequency_penalty``, ``seed``); default greedy.
    Writes ``OUT_DIR/completions.json`` (with the parameters used). Raises RuntimeError if the
    server does not come up or refuses a request (its message and status are in the error).
    """
    sampling = {"temperature": 0.0, **(sampling or {})}
    cfg = plan["serve"]
    port = free_port()
    cmd = [sys.executable, "-m", "prodip", "serve", str(cfg.export_dir), "--variant", cfg.variant,
           "--host", "127.0.0.1", "--port", str(port)]
    log_path = out_dir / "serve.log"
    with open(log_path, "w", encoding="utf-8") as log_fh:
        # PYTHONSAFEPATH (Python >= 3.11): `-m` must not put the current folder first on sys.path,
        # where a folder named prodip/ (say, the parent of a clone) would shadow the package.
        proc = subprocess.Popen(cmd, stdout=log_fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONSAFEPATH": "1"})
        try:
            base = f"http://127.0.0.1:{port}"
            _wait_healthy(base, proc, timeout_s, log_path)
            model_id = _http_json(f"{base}/v1/models")["data"][0]["id"]
            results = {}
            for lang, prompt in prompts.items():
                t0 = time.perf_counter()
                body = {"model": model_id, "prompt": prompt, "max_tokens": max_tokens, **sampling}
                resp = _http_json(f"{base}/v1/completions", body)
                results[lang] = {"prompt": prompt, "completion": resp["choices"][0]["text"],
                                 "finish_reason": resp["choices"][0].get("finish_reason"),
                                 "usage": resp.get("usage"), "seconds": time.perf_counter() - t0}
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    doc = {"format_version": 1, "variant": cfg.variant, "url": f"http://127.0.0.1:{port}/v1/completions",
           "sampling": {"max_tokens": max_tokens, **sampling}, "completions": results}
    (out_dir / "completions.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False), encoding="utf-8")
    return doc


def _wait_healthy(base: str, proc: subprocess.Popen, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or [""]
            raise RuntimeError(f"prodip serve exited with code {proc.returncode}: {last[0]} (log: {log_path})")
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.25)
    raise RuntimeError(f"prodip serve did not become healthy within {timeout_s:.0f} s; see {log_path}")


STAGES: dict[str, Stage] = {
    "tokenizer": Stage(lambda p: f"train BPE + fertility audit -> {p['tokenizer'].out_dir}",
                       _tokenizer_done, _tokenizer_run),
    "data": Stage(lambda p: f"encode corpus -> {p['data'].out_dir}", _data_done, _data_run),
    "train": Stage(lambda p: f"{p['train'].steps} steps -> {p['train'].out_dir}", _train_done, _train_run),
    "eval": Stage(lambda p: f"held-out NLL and bits/char vs random twin -> {p['eval'].out}",
                  _eval_done, _eval_run),
    "export": Stage(lambda p: f"safetensors + ONNX variants -> {p['export'].out}",
                    _export_done, _export_run),
    "conformance": Stage(lambda p: f"compare every artifact with the training model -> {p['conformance'].out}",
                         _conformance_done, _conformance_run),
    "serve": Stage(lambda p: f"HTTP completions from {p['serve'].export_dir} ({p['serve'].variant})",
                   lambda p: False, _serve_run),
}

