"""Every JSON artifact is read and written only by its owner, through its typed record (CONTRACTS.md).

An AST scan of the package and of bench/ (the benchmarks, the bare-python orchestrator of bench/gpu/bench.py
exempted in :data:`EXEMPT`): a call that opens, parses or writes an artifact's text (``open``, ``.read_text``,
``json.load(s)``, ``read_json_or_none``, ``write_text_atomic``, ``.write_text``, or any function whose name
says json, such as a private ``_read_json``) whose arguments or receiver name an artifact's
file (the literal ``"meta.json"``, or a constant such as ``TRAINER_STATE_FILE``) is allowed only in that
artifact's owner modules. Everyone else goes through the record (``ShardsMeta.read``, ``load_manifest``,
``EvalReport.read_or_none``, ...). The scan finds nothing on the tree beyond :data:`EXEMPT` (each entry
still needed), and a planted violation of each kind is caught.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the package's source folders (pyproject's [tool.setuptools.package-dir])
PACKAGE_DIRS = ("prodip", "tokenizer", "train", "export", "conformance", "serve")
#: the benchmarks, run with the package importable: they read artifacts through the records too
SCANNED_DIRS = (*PACKAGE_DIRS, "bench")

#: (module, top-level class or function, artifact): JSON calls on an artifact allowed outside its owners.
#: Each is there by design; the scan fails when one is no longer needed (so none outlives its reason).
EXEMPT = {
    # bench/gpu/bench.py's orchestrator (class Bench) runs on the GPU image's bare python3, without the
    # prodip package or pydantic on its path (it unpacks them for the workers it starts, which read through
    # the records): it reads the shards' meta.json itself. (Its read of conformance's report.json names the
    # file through a variable, which the scan does not see.)
    ("bench/gpu/bench.py", "Bench", "meta.json"),
}

#: artifact file name -> the modules that may read or write it with JSON calls (its owners)
OWNERS: dict[str, tuple[str, ...]] = {
    "meta.json": ("tokenizer/shards.py",),
    "fertility.json": ("tokenizer/audit.py",),
    "trainer_state.json": ("train/records.py", "train/checkpoint.py"),
    # both manifests share the name: the export's (prodip.base.manifest; its parts declared in base.variants,
    # base.verdict and base.card open no file, so they are not owners) and a checkpoint's
    "manifest.json": ("prodip/base/manifest.py", "train/records.py", "train/checkpoint.py"),
    "eval.json": ("train/records.py", "train/eval.py"),
    "sft_eval.json": ("train/records.py", "train/sft.py"),
    "report.json": ("conformance/records.py", "conformance/report.py"),
    "speed.json": ("conformance/speed.py",),
    "stage_times.json": ("prodip/base/stage.py",),
    "train_info.json": ("tokenizer/bpe.py",),
    "completions.json": ("serve/records.py", "serve/stage.py"),
    "prodip_run.json": ("prodip/pipeline.py",),
    "corpus_inputs.json": ("prodip/pipeline.py",),
    "summary.json": ("prodip/pipeline.py",),
}
#: the constants the code names those files by -> the file
CONSTANTS = {
    "META_NAME": "meta.json",
    "FERTILITY_NAME": "fertility.json",
    "TRAINER_STATE_FILE": "trainer_state.json",
    "MANIFEST_FILE": "manifest.json",
    "CHECKPOINT_MANIFEST_FILE": "manifest.json",
    "EVAL_FILE": "eval.json",
    "SFT_EVAL_FILE": "sft_eval.json",
    "REPORT_FILE": "report.json",
    "SPEED_FILE": "speed.json",
    "STAGE_TIMES_FILE": "stage_times.json",
    "TRAIN_INFO_FILE": "train_info.json",
    "COMPLETIONS_FILE": "completions.json",
    "RUN_MARKER": "prodip_run.json",
    "CORPUS_STAMPS": "corpus_inputs.json",
    "SUMMARY_FILE": "summary.json",
}
#: calls that open, parse or write an artifact's text
JSON_CALLS = {
    "json.load",
    "json.loads",
    "json.dump",
    "read_json_or_none",
    "write_text_atomic",
    "write_text",
    "read_text",
    "read_bytes",
    "open",
}


def _call_name(func: ast.expr) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id == "json":
            return f"json.{func.attr}"
        return func.attr
    return ""


def _artifacts_named(node: ast.AST) -> set[str]:
    """Artifact files a subtree names: by literal (``"x/meta.json"``, an f-string part) or by constant."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found |= {name for name in OWNERS if sub.value == name or sub.value.endswith("/" + name)}
        elif isinstance(sub, (ast.Name, ast.Attribute)):
            ident = sub.id if isinstance(sub, ast.Name) else sub.attr
            if ident in CONSTANTS:
                found.add(CONSTANTS[ident])
    return found


def _top_level_names(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each top-level class and function."""
    return [
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in tree.body
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def _exempt(module: str, tree: ast.Module, line: int, artifact: str, used: set | None) -> bool:
    for first, last, name in _top_level_names(tree):
        if first <= line <= last and (module, name, artifact) in EXEMPT:
            if used is not None:
                used.add((module, name, artifact))
            return True
    return False


def violations(source: str, module: str, used: set | None = None) -> list[str]:
    """``module:line: call names artifact`` for each JSON call outside the artifact's owners (and not in
    :data:`EXEMPT`; the exemptions that matched are added to ``used``)."""
    out = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        name = _call_name(node.func) if isinstance(node, ast.Call) else ""
        if not (name in JSON_CALLS or "json" in name.lower()):
            continue  # a private helper such as _read_json / _write_json_atomic counts as a JSON call
        named = set()
        for part in [*node.args, *(k.value for k in node.keywords)]:
            named |= _artifacts_named(part)
        if isinstance(node.func, ast.Attribute):  # (path / "meta.json").write_text(...)
            named |= _artifacts_named(node.func.value)
        for artifact in sorted(named):
            if module not in OWNERS[artifact] and not _exempt(module, tree, node.lineno, artifact, used):
                out.append(
                    f"{module}:{node.lineno}: {_call_name(node.func)} on {artifact} (owners: {OWNERS[artifact]})"
                )
    return out


def _scanned_modules() -> list[Path]:
    return sorted(p for d in SCANNED_DIRS for p in (ROOT / d).rglob("*.py"))


def test_no_artifact_is_read_or_written_outside_its_owner():
    modules = _scanned_modules()
    assert len(modules) > 60  # the scan sees the package (not an empty folder)
    assert ROOT / "bench" / "gpu" / "bench.py" in modules and ROOT / "bench" / "train_perf_cpu.py" in modules
    used: set = set()
    found = [
        v for p in modules for v in violations(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix(), used)
    ]
    assert found == [], "\n".join(found)
    assert used == EXEMPT, f"exemptions no longer needed (remove them): {sorted(EXEMPT - used)}"


def test_an_exemption_covers_only_its_own_class():
    """bench/gpu/bench.py's orchestrator may read meta.json; a worker function in the same file may not."""
    source = (
        "import json\n"
        "class Bench:\n"
        "    def data(self, shards):\n"
        "        return json.loads((shards / 'meta.json').read_text())\n"
        "def worker_train(shards):\n"
        "    return json.loads((shards / 'meta.json').read_text())\n"
    )
    found = violations(source, "bench/gpu/bench.py")
    assert found and all(v.startswith("bench/gpu/bench.py:6: ") for v in found), found


def test_owners_exist_and_still_own_their_artifact():
    """Each owner module exists and names its artifact (so a renamed owner cannot leave a stale exception)."""
    for artifact, owners in OWNERS.items():
        for owner in owners:
            path = ROOT / owner
            assert path.is_file(), owner
            assert artifact in _artifacts_named(ast.parse(path.read_text(encoding="utf-8"))) or any(
                artifact in _artifacts_named(ast.parse((ROOT / o).read_text(encoding="utf-8"))) for o in owners
            ), (owner, artifact)


PLANTED = """
import json
from prodip.base.files import read_json_or_none, write_text_atomic
from prodip.train.checkpoint import TRAINER_STATE_FILE

def bad(d, ckpt, out, plan):
    n = json.loads((d / "meta.json").read_text())["vocab_size"]
    ok = read_json_or_none(d / "fertility.json")
    step = json.loads((ckpt / TRAINER_STATE_FILE).read_text(encoding="utf-8"))["step"]
    with open(out / "conformance/report.json") as fh:
        passed = json.load(fh)
    write_text_atomic(out / "eval.json", json.dumps({}))
    (out / "stage_times.json").write_text("{}")
    info = json.loads((d / "train_info.json").read_text(encoding="utf-8"))
    said = read_json_or_none(out / "completions.json")
    write_text_atomic(out / RUN_MARKER, "{}")
    stamps = read_json_or_none(out / CORPUS_STAMPS) or {}
    verdict = json.loads((out / "summary.json").read_text())["ok"]
    fast = json.loads((out / SPEED_FILE).read_text())["rows"]
    return n, ok, step, passed, info, said, stamps, verdict, fast
"""


def test_a_planted_violation_of_each_kind_is_caught():
    found = violations(PLANTED, "serve/fake.py")
    joined = "\n".join(found)
    for artifact in (
        "meta.json",
        "fertility.json",
        "trainer_state.json",
        "report.json",
        "eval.json",
        "stage_times.json",
        "train_info.json",
        "completions.json",
        "prodip_run.json",
        "corpus_inputs.json",
        "summary.json",
        "speed.json",
    ):
        assert f"on {artifact}" in joined, (artifact, joined)
    assert all(v.startswith("serve/fake.py:") for v in found)
    # the owner of an artifact may use JSON on it; the others in the same file are still caught
    owned = violations(PLANTED, "tokenizer/shards.py")
    assert not any("on meta.json" in v for v in owned) and any("on fertility.json" in v for v in owned)


def test_text_read_then_parsed_is_caught_where_the_file_is_named():
    """The text read in one statement and parsed in another: the read names the file."""
    source = 'import json\ntext = (d / "report.json").read_text()\nr = json.loads(text)\n'
    assert violations(source, "prodip/summary.py") == [
        "prodip/summary.py:2: read_text on report.json (owners: ('conformance/records.py', 'conformance/report.py'))"
    ]
