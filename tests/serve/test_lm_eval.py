"""Issue 14 item 3 (case C5): lm-evaluation-harness itself, run with serve/README.md's command line
verbatim (only the task, port, export dir and max_length substituted), against a real ``prodip
serve``, on a tiny local task of each request kind (loglikelihood, loglikelihood_rolling,
generate_until); compared item by item with ``--model hf`` on the same export's model.safetensors."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve.conftest import serve_export

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
DOCS = [
    {"context": "আমার সোনার", "target": " বাংলা", "text": "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি।"},
    {"context": "The quick brown", "target": " fox", "text": "The quick brown fox jumps over the lazy dog."},
    {"context": "ঢাকা বাংলাদেশের", "target": " রাজধানী", "text": "ঢাকা বাংলাদেশের রাজধানী ও বৃহত্তম শহর।"},
]
TASKS = {
    "tiny_ll": "output_type: loglikelihood\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{target}}'\n"
    "metric_list:\n  - metric: acc\n",
    "tiny_rolling": "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
    "metric_list:\n  - metric: word_perplexity\n",
    "tiny_gen": "output_type: generate_until\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{target}}'\n"
    "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 8\n  do_sample: false\n"
    "metric_list:\n  - metric: exact_match\n",
}


def readme_command() -> list[str]:
    """The lm_eval command of serve/README.md, continuation lines joined."""
    text = (REPO / "serve" / "README.md").read_text(encoding="utf-8")
    m = re.search(r"^lm_eval --model local-completions.*?(?<!\\)$", text, re.S | re.M)
    assert m, "serve/README.md has no `lm_eval --model local-completions` command"
    return shlex.split(m.group(0).replace("\\\n", " "))


def _tasks(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    data = root / "docs.jsonl"
    data.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in DOCS), encoding="utf-8")
    for name, body in TASKS.items():
        (root / f"{name}.yaml").write_text(
            f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n"
            f"test_split: test\n{body}",
            encoding="utf-8",
        )
    return root


def _samples(out: Path) -> dict[str, list[dict]]:
    got = {}
    for name in TASKS:
        path = next(out.rglob(f"samples_{name}_*.jsonl"))
        got[name] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return got


def _run(cmd: list[str], env: dict) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, f"{shlex.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"


def test_lm_eval_readme_command_matches_hf(tiny_export, tmp_path):
    pytest.importorskip("lm_eval")
    export_dir = tiny_export[0]
    max_len = json.loads((export_dir / "config.json").read_text())["max_position_embeddings"]
    tasks = _tasks(tmp_path / "tasks")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["HF_HOME"] = str(tmp_path / "hf_home")
    bin_dir = Path(sys.executable).parent
    with serve_export(export_dir, "--log-level", "warning") as srv:
        cmd = readme_command()
        args = cmd[cmd.index("--model_args") + 1]
        args = args.replace("http://127.0.0.1:8000", srv.base)
        args = args.replace("tokenizer=runs/demo/export", f"tokenizer={export_dir}")
        args = args.replace("max_length=256", f"max_length={max_len}")
        cmd[cmd.index("--model_args") + 1] = args
        cmd[cmd.index("--tasks") + 1] = ",".join(TASKS)
        cmd[0] = str(bin_dir / "lm_eval")
        extra = ["--include_path", str(tasks), "--log_samples", "--batch_size", "1"]
        _run(cmd + extra + ["--output_path", str(tmp_path / "served")], env)
    hf = [
        str(bin_dir / "lm_eval"),
        "--model",
        "hf",
        "--model_args",
        # add_bos_token: every training document starts with <|bos|>, and the served prompt does too
        # (tokenizer.json's post-processor); lm-eval's hf backend leaves BOS out unless asked
        f"pretrained={export_dir},dtype=float32,add_bos_token=True",
        "--device",
        "cpu",
    ]
    _run(hf + ["--tasks", ",".join(TASKS), *extra, "--output_path", str(tmp_path / "hf")], env)
    served, ref = _samples(tmp_path / "served"), _samples(tmp_path / "hf")
    worst = 0.0
    for name in TASKS:
        assert len(served[name]) == len(ref[name]) == len(DOCS)
        for a, b in zip(sorted(served[name], key=lambda s: s["doc_id"]), sorted(ref[name], key=lambda s: s["doc_id"])):
            ra, rb = a["filtered_resps"], b["filtered_resps"]
            if name == "tiny_gen":
                assert ra == rb, (name, ra, rb)  # greedy generations identical
                continue
            for x, y in zip(ra, rb):
                x = x[0] if isinstance(x, list) else x
                y = y[0] if isinstance(y, list) else y
                worst = max(worst, abs(float(x) - float(y)))
    print(f"lm-eval served vs hf: max |log-likelihood difference| {worst:.2e} over {len(DOCS)} docs x 2 tasks")
    assert worst < 1e-3
