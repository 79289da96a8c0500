"""Every command README.md, docs/ and the code's docstrings show is checked against the code it names.

A command is a line of a fenced ``bash``/``sh`` block, an inline code span that starts with a command
(``prodip``, ``python -m``, ``make``, ...), or a command line in a docstring. What is checked:

- ``prodip ...`` and ``python -m prodip[.<stage>] ...`` (also under ``torchrun``): the real entry point
  runs (``runpy``) with :func:`prodip.base.cli.run_command` replaced, so the real argparse parser reads
  every option and the command stops where it would start work; ``--help`` prints the real help.
- ``python -m MODULE``: the module is found and runs something under ``__main__``.
- ``python -c CODE``: the code parses, and every ``import`` / ``from M import N`` names a module that
  exists and a name that module defines. Code that imports only ``prodip.base`` and the standard
  library, and reads no run folder, really runs.
- ``make TARGET``: the Makefile has the target. ``pytest`` options are pytest's or the repository's.
- Every repository path a command or inline code span names exists (``configs/*.toml``, ``bench/...``).
- Every relative Markdown link points at a file, and at a heading there.

The Markdown pages are README.md, docs/, CONTRACTS.md, the READMEs beside the code and bench/*.md.

``test_the_checker_fails_on_planted_faults`` shows each check failing on a planted bad command.

    python -m pytest tests/test_docs_commands.py -q
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
import runpy
import shlex
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest

from prodip.cli import _STAGES

ROOT = Path(__file__).resolve().parents[1]
# the manual and the references beside the code (bench/results/ are records of past runs, kept as run)
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "CONTRACTS.md",
    *sorted(ROOT.glob("*/README.md")),
    *sorted((ROOT / "bench").glob("*.md")),
]
CODE_DIRS = ("prodip", "tokenizer", "train", "export", "conformance", "serve", "bench")
# the first folder of a path that names a file of the repository (runs/, onnx/, /tmp/... are not)
REPO_DIRS = ("configs", "data", "bench", "tests", "docs", "prodip", "tokenizer", "train", "export", "conformance",
             "serve", "node", ".ci")  # fmt: skip
# what the reader makes: snippets the docs say to save under these names, and install outputs
MADE_BY_READER = {"node/demo.mjs", "node/llama.mjs", "node/node_modules", ".venv/bin/activate"}
COMMANDS = ("prodip", "python", "python3", "torchrun", "make", "pytest", "npm", "node", "curl", "pip", "source",
            "tensorboard", "llama-cli", "pre-commit", "lm_eval")  # fmt: skip
# the stage folders: importable from the checkout's root only; installed, they are prodip.<stage>
OLD_PACKAGES = ("tokenizer", "train", "export", "conformance", "serve")
# pytest's own options that the docs use; the repository's come from its pytest_addoption hooks
PYTEST_OPTIONS = {"-q", "-x", "-k", "-m", "-p", "-ra", "--pyargs", "--timeout", "-s", "-v"}
# a placeholder the reader fills in: CKPT, EXPORT_DIR, COMMAND
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*")
# what may follow `prodip` on a docstring's command line (so "prodip stage: ..." prose is not one)
PRODIP_WORDS = "|".join(["--help", "--version", "-v", *(name for name, _, _ in _STAGES)])
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)


# ---- where commands are ----


def _join_continuations(text: str) -> list[tuple[int, str]]:
    """(line number, logical line) with ``\\``-continued lines joined."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for i, line in enumerate(text.splitlines(), 1):
        if not pending:
            start = i
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def _is_inline_command(text: str) -> bool:
    """An inline span that is a command line, not the name of one (`prodip run`) or a pattern (`<stage>`)."""
    words = text.split()
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # CONFIG=configs/x.toml make demo
        words = words[1:]
    if not words or words[0] not in COMMANDS or "<" in text:
        return False
    if words[0] == "prodip" and len(words) > 1 and not re.fullmatch(rf"{PRODIP_WORDS}|[A-Z_]+", words[1]):
        return False  # a message it prints ("prodip serve: error: ..."), not a command line
    return len(words) > 2 or (words[0] == "make" and len(words) == 2)


def markdown_commands(path: Path) -> list[tuple[str, str]]:
    """(``file:line``, command) of a Markdown page: shell blocks and inline spans that start with a command."""
    text = path.read_text(encoding="utf-8")
    rel = path.relative_to(ROOT)
    found = []
    for m in FENCE.finditer(text):
        if m.group(1) in ("bash", "sh", "shell"):
            first = text.count("\n", 0, m.start(2)) + 1
            for n, line in _join_continuations(m.group(2)):
                if line.strip() and not line.lstrip().startswith("#"):
                    found.append((f"{rel}:{first + n - 1}", line.strip()))
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in re.finditer(r"`([^`]+)`", prose):
        span = " ".join(m.group(1).split())
        if _is_inline_command(span):
            found.append((f"{rel}:{prose.count(chr(10), 0, m.start()) + 1}", span))
    return found


def docstring_commands(path: Path) -> list[tuple[str, str]]:
    """(``file:line``, command) of the command lines in a Python file's docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node, clean=False)
        if not doc:
            continue
        line0 = node.body[0].lineno
        for n, line in _join_continuations(doc):
            text = line.strip()
            if re.match(rf"(python3? -[mc] |prodip ({PRODIP_WORDS})\b|torchrun |pytest )", text):
                found.append((f"{path.relative_to(ROOT)}:{line0 + n - 1}", text))
    return found


def all_commands() -> list[tuple[str, str]]:
    cmds = [c for page in PAGES for c in markdown_commands(page)]
    for d in CODE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            cmds += docstring_commands(path)
    return cmds


# ---- what a command must satisfy ----


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*):", text, re.M)}


def _repo_path_problems(token: str) -> list[str]:
    """A token naming a repository path (its first folder is one of :data:`REPO_DIRS`) that does not exist."""
    token = token.split("=", 1)[-1].strip("'\"(),")  # --config=configs/x.toml, bn=data/bn
    problems = []
    for part in token.split(","):
        first = part.split("/", 1)[0]
        if "/" not in part or first not in REPO_DIRS or part in MADE_BY_READER or part.rstrip("/") in MADE_BY_READER:
            continue
        pattern = re.sub(r"\{[^}]*\}", "*", part)  # shell braces, e.g. configs/{demo,h100}.toml
        if not any(ROOT.glob(pattern.rstrip("/"))) and not (ROOT / pattern).exists():
            problems.append(f"{part}: no such file in the repository")
    return problems


def _entry_point_problems(module: str, argv: list[str]) -> list[str]:
    """Run ``python -m module argv`` in this process up to the stage's work: argparse reads every option."""
    ran: list[object] = []
    err = io.StringIO()
    with (
        mock.patch("prodip.base.cli.run_command", lambda func, args, command: ran.append(func) or 0),
        mock.patch("prodip.cli.run_command", lambda func, args, command: ran.append(func) or 0),
        mock.patch("prodip.base.cli.setup_logging", lambda verbose: None),
        mock.patch("prodip.cli.setup_logging", lambda verbose: None),
        mock.patch.object(sys, "argv", [module, *argv]),
        contextlib.redirect_stdout(io.StringIO()),
        contextlib.redirect_stderr(err),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules" for an imported package
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            if exc.code not in (0, None) and not ran:
                lines = err.getvalue().strip().splitlines()
                return [lines[-1] if lines else f"exit {exc.code}"]
    return []


def _module_problems(module: str, argv: list[str]) -> list[str]:
    if module.split(".")[0] in OLD_PACKAGES:
        return [f"python -m {module}: no such module once installed (the old package name; prodip.{module})"]
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return [f"python -m {module}: no such module"]
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        main = importlib.util.find_spec(f"{module}.__main__")
        if main is None:
            return [f"python -m {module}: the package has no __main__"]
        spec = main
    source = Path(spec.origin).read_text(encoding="utf-8") if spec.origin and spec.origin.endswith(".py") else ""
    if spec.origin and str(ROOT) not in spec.origin and "prodip" not in module:
        return []  # the standard library's or an installed tool's (http.server, pytest)
    if "__main__" not in module and '__name__ == "__main__"' not in source:
        return [f"python -m {module}: the module does nothing when run (no __main__ block)"]
    if module == "prodip" or module.startswith("prodip."):
        uses_parser = any(f in source for f in ("stage_main", "tool_main", "main()"))
        if uses_parser:
            return _entry_point_problems(module, argv)
    return []


def _defined_names(module: str) -> set[str] | None:
    """Top-level names a module defines (from its source, without importing it); None = not Python source."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    if spec.submodule_search_locations:  # a package: its submodules are importable names too
        names |= {p.stem for loc in spec.submodule_search_locations for p in Path(loc).iterdir()}
    return names


def _python_c_problems(code: str) -> list[str]:
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return [f"python -c: not valid Python ({err.msg})"]
    problems, modules = [], []
    for node in ast.walk(tree):
        pairs: list[tuple[str, str | None]] = []
        if isinstance(node, ast.Import):
            pairs = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            pairs = [(node.module, a.name) for a in node.names]
        for module, name in pairs:
            modules.append(module)
            if module.split(".")[0] in OLD_PACKAGES:
                problems.append(f"python -c: no module {module} once installed (the old package name; prodip.{module})")
                continue
            try:
                found = importlib.util.find_spec(module) is not None
            except ModuleNotFoundError:
                found = False
            if not found:
                problems.append(f"python -c: no module {module}")
                continue
            defined = _defined_names(module) if name else None
            if defined is not None and name not in defined:
                problems.append(f"python -c: {module} defines no {name}")
    light = all(m.startswith("prodip.base") or m.split(".")[0] in sys.stdlib_module_names for m in modules)
    if not problems and light and modules and not re.search(r"runs/|OUT|raise ", code):
        proc = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            problems.append(f"python -c: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return problems


def _pytest_problems(argv: list[str]) -> list[str]:
    own = set()
    for path in [*ROOT.glob("conformance/*.py"), *ROOT.glob("tests/**/conftest.py")]:
        own |= set(re.findall(r"[\"'](--[\w-]+)[\"']", path.read_text(encoding="utf-8")))
    return [
        f"pytest: unknown option {a}" for a in argv if a.startswith("-") and a.split("=")[0] not in PYTEST_OPTIONS | own
    ]


def check_command(command: str) -> list[str]:
    """What is wrong with one documented command (empty when nothing is)."""
    synopsis = re.sub(r"\[(-[^\]]*)\]", r"\1", command)  # a usage line: [--port 8000] -> --port 8000
    synopsis = re.sub(r"(?<= )([\w.-]+)(\|[\w.-]+)+(?= |$)", r"\1", synopsis)  # --variant fp32|int8 -> fp32
    try:
        argv = shlex.split(synopsis, comments=True)
    except ValueError as err:
        return [f"cannot be split into words: {err}"]
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # CONFIG=... make demo
        argv = argv[1:]
    problems = [p for a in argv for p in _repo_path_problems(a)]
    if not argv:
        return problems
    tool, args = argv[0], argv[1:]
    if tool == "prodip":
        if args and not PLACEHOLDER.fullmatch(args[0]):  # `prodip COMMAND --help` names no command
            problems += _entry_point_problems("prodip", args)
    elif tool in ("python", "python3", "torchrun"):
        if "-c" in args and tool != "torchrun":
            problems += _python_c_problems(args[args.index("-c") + 1])
        elif "-m" in args:
            module, rest = args[args.index("-m") + 1], args[args.index("-m") + 2 :]
            if module == "pytest":
                problems += _pytest_problems(rest)
            elif not PLACEHOLDER.fullmatch(module):
                problems += _module_problems(module, rest)
        elif args and args[0].endswith(".py") and not (ROOT / args[0]).is_file():
            problems.append(f"{args[0]}: no such script")
    elif tool == "make":
        targets = _makefile_targets()
        problems += [
            f"make: no target {a}"
            for a in args
            if not a.startswith("-") and "=" not in a and a not in targets and not PLACEHOLDER.fullmatch(a)
        ]
    elif tool == "pytest":
        problems += _pytest_problems(args)
    return problems


# ---- the tests ----

COMMAND_LIST = all_commands()


def test_the_docs_show_commands():
    """The collection finds the tour, the stage pages and the docstrings (a broken extractor checks nothing)."""
    where = {src.split(":")[0] for src, _ in COMMAND_LIST}
    assert {"README.md", "docs/training.md", "docs/serving.md", "export/cli.py"} <= where, sorted(where)
    assert any(cmd.startswith("torchrun ") for _, cmd in COMMAND_LIST)
    assert any("python -c" in cmd for _, cmd in COMMAND_LIST)
    assert len(COMMAND_LIST) > 100, len(COMMAND_LIST)


@pytest.mark.parametrize(("source", "command"), COMMAND_LIST, ids=[src for src, _ in COMMAND_LIST])
def test_documented_command(source, command):
    problems = check_command(command)
    assert not problems, f"{source}: `{command}`: {problems}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def link_problems(page: Path) -> list[str]:
    """Relative links of a Markdown page whose file or heading does not exist."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            problems.append(f"{page.relative_to(ROOT)}: link {target}: no such file")
        elif anchor and dest.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", FENCE.sub("", dest.read_text(encoding="utf-8")), re.M)
            if anchor not in {_slug(h) for h in headings}:
                problems.append(f"{page.relative_to(ROOT)}: link {target}: no such heading")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_links_point_at_files_and_headings(page):
    assert not link_problems(page)


def test_the_checker_fails_on_planted_faults(tmp_path):
    """Each kind of check catches a planted bad command, and passes the good twin."""
    planted = {
        "prodip export runs/demo/train --out x --no-such-option": "unrecognized arguments: --no-such-option",
        "prodip tokenizer trian --config configs/demo.toml": "invalid choice: 'trian'",
        "prodip train --steps many": "cannot read 'many' as int",
        "python -m prodip.train train --no-such-option 1": "unrecognized arguments",
        "torchrun --nproc_per_node 2 -m prodip.tokenizers train": "no such module",
        "python -m train.model": "the old package name",
        'python -c "from train.config import ModelConfig"': "no module train.config once installed",
        'python -c "from prodip.base.variants import NO_SUCH_TABLE"': "defines no NO_SUCH_TABLE",
        'python -c "from prodip.base.variants import VARIANTS; print(VARIANTS[99])"': "exit 1",
        "make no-such-target": "no target no-such-target",
        "prodip run configs/no-such.toml": "configs/no-such.toml: no such file",
        "pytest conformance/ --no-such-flag": "unknown option --no-such-flag",
    }
    for command, expected in planted.items():
        problems = check_command(command)
        assert any(expected in p for p in problems), (command, problems)
    good = [
        "prodip export runs/demo/train --out x --variants fp32,int4",
        "prodip export --help",
        "python -m prodip.train train --config configs/demo.toml --steps 50",
        'python -c "from prodip.base.variants import VARIANTS; print(len(VARIANTS))"',
        "make test-fast",
        "pytest conformance/ --export-dir runs/demo/export",
    ]
    for command in good:
        assert check_command(command) == [], command
    page = tmp_path / "page.md"
    page.write_text("[a](nope.md) [b](#no-such-heading) [c](#page)\n\n# Page\n", encoding="utf-8")
    with mock.patch(f"{__name__}.ROOT", tmp_path):
        assert link_problems(page) == [
            "page.md: link nope.md: no such file",
            "page.md: link #no-such-heading: no such heading",
        ]


def test_every_docs_page_the_code_cites_exists():
    """A docstring, comment or help text that sends the reader to ``docs/<page>.md`` names a page that exists."""
    missing = []
    for d in (*CODE_DIRS, "tests", "configs", "data"):
        for path in sorted((ROOT / d).rglob("*")):
            if path.suffix in (".py", ".toml", ".md") and path.is_file():
                for page in set(re.findall(r"(?<![\w/])docs/[a-z][\w-]*\.md", path.read_text(encoding="utf-8"))):
                    if not (ROOT / page).is_file():
                        missing.append(f"{path.relative_to(ROOT)} cites {page}")
    for name in ("pyproject.toml", "Makefile", "CONTRACTS.md"):
        for page in set(re.findall(r"(?<![\w/])docs/[a-z][\w-]*\.md", (ROOT / name).read_text(encoding="utf-8"))):
            if not (ROOT / page).is_file():
                missing.append(f"{name} cites {page}")
    assert not missing, missing
