"""End to end: `prodip run` on a tiny config over real text cut from the bundled corpus.

Every stage runs for real (tokenizer + audit + gate, shards, training, eval, export with all
variants, conformance, HTTP serving); the test then checks that each artifact exists and is
valid by loading it with its owner's reader, and that re-running resumes / refuses as documented.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prodip.tokenizer.corpus import expand_inputs, iter_language
from tests.fixtures import write_sources

REPO = Path(__file__).resolve().parents[1]

TINY_TOML = """\
out_dir = "{out}"
completion_max_tokens = 8
# sampled as in configs/demo.toml: greedy decoding of a 30-step model may emit only spaces
completion_temperature = 0.7
completion_top_p = 0.95
completion_frequency_penalty = 0.5
completion_seed = 0

[tokenizer]
inputs = {{bn = ["{corpus}/bn_train.txt"], en = ["{corpus}/en_train.txt"]}}
vocab_size = 1024
proportions = {{bn = 0.6, en = 0.4}}

[audit]
heldout = {{bn = ["{corpus}/bn_heldout.txt"], en = ["{corpus}/en_heldout.txt"]}}
min_chars_per_token = {{bn = 1.5, en = 1.5}}

[data]
inputs = {{bn = ["{corpus}/bn_train.txt"], en = ["{corpus}/en_train.txt"]}}
val_fraction = 0.1
doc_chars = 2000

[model]
vocab_size = 1024
hidden_size = 64
intermediate_size = 128
num_hidden_layers = 2
num_attention_heads = 4
num_key_value_heads = 2
max_position_embeddings = 128

[train]
steps = 30
batch_size = 4
seq_len = 64
warmup_steps = 3
lr = 3e-3
mixture = {{bn = 0.6, en = 0.4}}
checkpoint_every_steps = 15
progress = false

[eval]
eval_tokens = 2048
seq_len = 64
tasks = ["prodip_tatoeba_en2bn", "prodip_tatoeba_bn2en"]   # the demo's tasks, few items
task_limit = 12

[conformance]
greedy_tokens = 16
tolerances = "{repo}/tests/conformance/tiny_tolerances.toml"   # a 30-step model: see that file
"""


def _cut_corpus(dest: Path, lang: str, train_chars: int, heldout_chars: int) -> None:
    """Real text from the bundled data/<lang> files: the first documents for training, later
    ones (never seen in training) as held-out text. Documents are separated by blank lines."""
    files = expand_inputs({lang: [str(REPO / "data" / lang)]})[lang]
    train, heldout, n_train, n_held = [], [], 0, 0
    for _, _, doc in iter_language(files, lang):
        doc = doc.strip()
        if not doc:
            continue
        if n_train < train_chars:
            train.append(doc)
            n_train += len(doc)
        elif n_held < heldout_chars:
            heldout.append(doc)
            n_held += len(doc)
        else:
            break
    assert n_train >= train_chars // 2 and n_held > 0, f"data/{lang} has too little text"
    (dest / f"{lang}_train.txt").write_text("\n\n".join(train) + "\n", encoding="utf-8")
    (dest / f"{lang}_heldout.txt").write_text("\n\n".join(heldout) + "\n", encoding="utf-8")


def _prodip(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prodip", *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory) -> Path:
    """The tiny runs' corpus folder: text cut from data/, with its sources.toml."""
    corpus = tmp_path_factory.mktemp("corpus")
    _cut_corpus(corpus, "bn", 250_000, 30_000)
    _cut_corpus(corpus, "en", 250_000, 30_000)
    write_sources(corpus, {"bn_*.txt": "bn", "en_*.txt": "en"}, license="LicenseRef-PublicDomain")  # data/'s texts
    return corpus


def _tiny_pipeline(root: Path, corpus: Path, head: str = "", tail: str = "") -> tuple[Path, Path, str]:
    """`prodip run` in ``root`` of TINY_TOML, with ``head`` (top-level keys) before it and ``tail`` after its
    last table ([conformance], so tail's first lines are that table's keys): (config file, run dir, stdout)."""
    config = root / "tiny.toml"
    text = head + TINY_TOML.format(out=root / "run", corpus=corpus, repo=REPO) + tail
    config.write_text(text, encoding="utf-8")
    proc = _prodip("run", str(config))
    assert proc.returncode == 0, f"prodip run failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return config, root / "run", proc.stdout


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_corpus):
    """The whole pipeline as configured by default: every variant, every on-device runtime in conformance."""
    return _tiny_pipeline(tmp_path_factory.mktemp("pipeline"), tiny_corpus)


@pytest.fixture(scope="module")
def rerun_run(tmp_path_factory, tiny_corpus):
    """A complete tiny run (serve left out) for the tests that damage its export and run stages again.

    What they change is the export's files and the run's records, which no on-device runtime reads, so its
    conformance checks none: each of their re-runs of export + conformance then takes seconds, not the
    minute the runtimes' Node and onnxruntime-genai runs of every variant took (tiny_run checks those).
    It exports the variants they touch.
    """
    return _tiny_pipeline(
        tmp_path_factory.mktemp("rerun"),
        tiny_corpus,
        head='stages = ["tokenizer", "data", "train", "eval", "export", "conformance"]\n',
        tail='runtimes = []\n\n[export]\nvariants = ["safetensors", "fp32", "fp16", "int8"]\n',
    )


@pytest.mark.slow
def test_every_artifact_exists_and_is_valid(tiny_run):
    from prodip.base.manifest import load_manifest, verify_files
    from prodip.tokenizer.bpe import load_tokenizer, tokenizer_sha256
    from prodip.tokenizer.shards import load_meta, read_shard, shard_paths
    from prodip.train.checkpoint import load_model

    _, run, stdout = tiny_run
    tok = load_tokenizer(run / "tokenizer")
    text = "আমার সোনার বাংলা, আমি তোমায় ভালোবাসি। Hello, world!"
    assert tok.decode(tok.encode(text).ids) == text
    fert = json.loads((run / "tokenizer" / "fertility.json").read_text())
    assert fert["gate"]["passed"] and set(fert["languages"]) == {"bn", "en"}

    meta = load_meta(run / "shards", expected_tokenizer_sha256=tokenizer_sha256(run / "tokenizer")).to_dict()
    for lang in ("bn", "en"):
        for split in ("train", "val"):
            tokens = read_shard(shard_paths(run / "shards", lang, split)[0])
            assert tokens.size > 0 and int(tokens.max()) < meta["vocab_size"]

    assert {s["name"]: s["language"] for s in meta["sources"]} == {"test-0": "bn", "test-1": "en"}
    model, cfg, info = load_model(run / "train")  # verifies the checkpoint's sha256 manifest
    assert info["step"] == 30 and cfg.hidden_size == 64
    assert (run / "train" / "loss.png").stat().st_size > 1000
    assert len((run / "train" / "metrics.jsonl").read_text().splitlines()) >= 30

    ev = json.loads((run / "train" / "eval.json").read_text())
    for lang in ("bn", "en"):
        trained, twin = ev["languages"][lang]["trained"], ev["languages"][lang]["random_init"]
        assert trained["bits_per_char"] < twin["bits_per_char"], lang

    manifest = load_manifest(run / "export")
    verify_files(run / "export")
    assert manifest.source_checkpoint.model_sha256 == info["model_sha256"]
    assert {"fp32", "fp16", "int8", "int4"} <= set(manifest.variants)
    assert manifest.conformance is not None and manifest.conformance.passed is True
    card = (run / "export" / "README.md").read_text(encoding="utf-8")  # the model card, with its quality card
    assert "| test-0 | bn | – | `LicenseRef-PublicDomain` |" in card and "| int4 | bn |" in card
    bn = ev["languages"]["bn"]
    assert f"| bn | {bn['trained']['nll_nats_per_token']:.4f} | {bn['trained']['bits_per_char']:.4f} |" in card

    report = json.loads(
        (run / "export" / "conformance" / "report.json").read_text()
    )  # where `prodip conformance` writes
    assert report["passed"] is True and all(report["variants"].values())
    # the card's task table: a bn and an en row, every ONNX variant with its standard error, fp32 = checkpoint
    tasks = manifest.card_quality.tasks
    assert {t.language for t in tasks} == {"bn", "en"}
    for t in tasks:
        assert {"random twin", "checkpoint", "fp32", "fp16", "int8", "int4"} <= set(t.scores)
        assert all(s.stderr is not None for s in t.scores.values()) and t.scores["fp32"] == t.scores["checkpoint"]
        assert f"| {t.task} | {t.language} | 0 | 12 | acc | 0.250 |" in card

    completions = json.loads((run / "completions.json").read_text())["completions"]
    assert set(completions) == {"bn", "en"} and all(c["completion"] for c in completions.values())
    from prodip.pipeline import RunSummary

    summary = RunSummary.read(run / "summary.json")
    assert summary.ok is True and summary.problems == [] and summary.out_dir == str(run)
    assert summary.format_version == 1 and summary.completions is not None
    for heading in (
        "tokenizer fertility",
        "trained model vs random-initialised twin",
        "export variants and conformance",
        "tasks (lm-evaluation-harness",
        "completions over HTTP",
    ):
        assert heading in stdout


@pytest.mark.slow
def test_rerun_skips_completed_stages_and_refuses_another_config(tiny_run, tmp_path):
    config, run, _ = tiny_run
    again = _prodip("run", str(config), "--stages", "tokenizer,data,train,eval,export,conformance")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already complete, skipped") == 6
    times = json.loads((run / "stage_times.json").read_text())["stages"]
    assert set(times) == {"tokenizer", "data", "train", "eval", "export", "conformance", "serve"}
    assert all(t["complete"] and t["seconds"] > 0 for t in times.values())
    assert "train*" in again.stdout  # the summary shows earlier invocations' times, marked

    changed = tmp_path / "changed.toml"
    changed.write_text(config.read_text().replace("steps = 30", "steps = 31"), encoding="utf-8")
    refused = _prodip("run", str(changed))
    assert refused.returncode == 2
    assert "holds a run made with a different config" in refused.stderr


@pytest.mark.slow
def test_a_deleted_export_file_is_exported_again(rerun_run):
    config, run, _ = rerun_run
    from prodip.base.manifest import verify_files
    from prodip.base.variants import BY_NAME

    onnx_int8 = run / "export" / BY_NAME["int8"].path
    onnx_int8.unlink()
    again = _prodip("run", str(config), "--stages", "export,conformance")
    assert again.returncode == 0, again.stderr
    assert "already complete" not in again.stdout and "missing from the export" in again.stderr
    assert onnx_int8.exists() and verify_files(run / "export")
    fp16 = run / "export" / BY_NAME["fp16"].path  # same size, other bytes
    data = bytearray(fp16.read_bytes())
    data[len(data) // 2] ^= 0xFF
    fp16.write_bytes(bytes(data))
    again = _prodip("run", str(config), "--stages", "export,conformance")
    assert again.returncode == 0, again.stderr
    assert "sha256 differs from the export manifest" in again.stderr and verify_files(run / "export")
    # a file swapped with its manifest entry updated (as a re-quantising tool would): the export is
    # consistent, but the verdict was measured on other files, so conformance runs again
    import hashlib

    cfg_file = run / "export" / "export_config.toml"
    cfg_file.write_text(cfg_file.read_text() + "\n")
    manifest_path = run / "export" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["export_config.toml"] = {
        "bytes": cfg_file.stat().st_size,
        "sha256": hashlib.sha256(cfg_file.read_bytes()).hexdigest(),
    }
    manifest_path.write_text(json.dumps(manifest, indent=2))
    again = _prodip("run", str(config), "--stages", "export,conformance")
    assert again.returncode == 0, again.stderr
    assert "export: already complete" in again.stdout and "made from another export files table" in again.stderr
    assert "conformance: already complete" not in again.stdout


@pytest.mark.slow
def test_a_report_of_other_variants_is_not_complete(rerun_run):
    """The reported case: the run's export replaced by hand with more variants and checked by `prodip conformance`
    for a subset; `prodip run` skipped conformance as complete and the summary showed blank cells."""
    config, run, _ = rerun_run
    exp = run / "export"
    variants = sorted(json.loads((exp / "manifest.json").read_text())["variants"])
    redo = _prodip("export", str(run / "train"), "--out", str(exp), "--variants", "fp32,int8", "--force")
    assert redo.returncode == 0, redo.stderr
    subset = _prodip(
        "conformance",
        str(exp),
        "--checkpoint",
        str(run / "train"),
        "--shards-dir",
        str(run / "shards"),
        "--variants",
        "fp32",
        "--runtimes",
        "",  # as the run's [conformance]
    )
    assert subset.returncode == 0, subset.stderr
    again = _prodip("run", str(config), "--stages", "export,conformance")
    assert again.returncode == 0, again.stderr
    assert "export: already complete" not in again.stdout and "conformance: already complete" not in again.stdout
    assert sorted(json.loads((exp / "manifest.json").read_text())["variants"]) == variants  # the config's again
    report = json.loads((exp / "conformance" / "report.json").read_text())
    assert sorted(report["variants"]) == variants and report["passed"]


@pytest.mark.slow
def test_serve_stage_samples_with_the_configured_seed(tiny_run):
    config, run, _ = tiny_run
    flags = [
        "--stages",
        "serve",
        "--completion-temperature",
        "0.9",
        "--completion-top-p",
        "0.95",
        "--completion-seed",
        "7",
        "--completion-frequency-penalty",
        "0.5",
        "--completion-prompts",
        "en=It was a cold day, and",
    ]
    texts = []
    for _ in range(2):
        proc = _prodip("run", str(config), *flags)
        assert proc.returncode == 0, proc.stderr
        assert "temperature 0.9, top_p 0.95, seed 7, frequency_penalty 0.5" in proc.stdout  # names the decoding
        doc = json.loads((run / "completions.json").read_text())
        assert doc["sampling"] == {
            "max_tokens": 8,
            "temperature": 0.9,
            "top_p": 0.95,
            "frequency_penalty": 0.5,
            "seed": 7,
        }
        assert set(doc["completions"]) == {"en"} and doc["completions"]["en"]["prompt"] == "It was a cold day, and"
        texts.append(doc["completions"]["en"]["completion"])
    assert texts[0] == texts[1] and texts[0].strip()  # same seed, same text


def test_typo_in_config_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('out_dir = "x"\n[train]\nstesp = 3\n', encoding="utf-8")
    proc = _prodip("run", str(bad), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "[train]: unknown key 'stesp'" in proc.stderr and "did you mean steps" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_missing_corpus_is_named(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'out_dir = "{tmp_path / "run"}"\nstages = ["tokenizer"]\n'
        f'[tokenizer]\ninputs = {{bn = ["{tmp_path / "nope"}"]}}\n',
        encoding="utf-8",
    )
    proc = _prodip("run", str(cfg), timeout=120)
    assert proc.returncode == 2
    assert str(tmp_path / "nope") in proc.stderr
    assert not (tmp_path / "run" / "tokenizer" / "tokenizer.json").exists()


def test_unknown_table_is_named(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[trian]\nsteps = 3\n", encoding="utf-8")
    proc = _prodip("run", str(cfg), timeout=120)
    assert proc.returncode == 2 and "unknown table [trian]" in proc.stderr


def test_force_never_deletes_a_folder_prodip_did_not_make(tmp_path):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "config.toml").write_text('name = "not a prodip run"\n', encoding="utf-8")
    (project / "src" / "main.py").write_text("print(1)\n", encoding="utf-8")
    cfg = tmp_path / "c.toml"
    cfg.write_text('stages = ["tokenizer"]\n[tokenizer]\ninputs = {bn = ["data/bn"]}\n', encoding="utf-8")
    proc = _prodip("run", str(cfg), "--out-dir", str(project), "--force", timeout=120)
    assert proc.returncode == 2 and "is not a prodip run" in proc.stderr
    assert (project / "src" / "main.py").read_text() == "print(1)\n"


@pytest.mark.parametrize(
    ("rel", "version", "reads"),
    [
        ("shards/meta.json", 5, "2"),
        ("completions.json", 3, "1"),
        ("summary.json", 2, "1"),
        ("train/checkpoints/step_0000004/trainer_state.json", 4, "1"),
        ("export/manifest.json", 2, "1"),
    ],
)
@pytest.mark.parametrize("force", [False, True])
def test_run_refuses_artifacts_of_a_newer_prodip_before_removing_any(tmp_path, capsys, rel, version, reads, force):
    """A run dir of this prodip (its marker reads) holding one artifact a newer prodip wrote: `prodip run`
    would take it as "not done" and rewrite it, `--force` (another config) would delete the folder. Both stop
    first: exit 2, one line naming the file and its format_version, every file unchanged."""
    from prodip.cli import main as prodip_main

    run = tmp_path / "run"
    (run / rel).parent.mkdir(parents=True)
    (run / rel).write_text(json.dumps({"format_version": version}), encoding="utf-8")
    (run / "prodip_run.json").write_text('{"format_version": 1, "config": "config.toml"}\n', encoding="utf-8")
    (run / "config.toml").write_text('out_dir = "elsewhere"\n', encoding="utf-8")  # another config
    before = {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    cfg = tmp_path / "c.toml"
    cfg.write_text('stages = ["tokenizer"]\n[tokenizer]\ninputs = {bn = ["data/bn"]}\n', encoding="utf-8")
    assert prodip_main(["run", str(cfg), "--out-dir", str(run), *(["--force"] if force else [])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{run / rel}: written by a newer prodip (format_version {version}; this prodip reads {reads})" in err
    assert ("prodip run --force does not" if force else "prodip run does not") in err
    assert {p.relative_to(run).as_posix(): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_cross_table_errors_come_before_any_stage(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'out_dir = "{tmp_path / "run"}"\n[model]\nmax_position_embeddings = 64\n[train]\nseq_len = 128\n',
        encoding="utf-8",
    )
    proc = _prodip("run", str(cfg), timeout=120)
    assert proc.returncode == 2
    assert "[train] seq_len = 128 exceeds [model] max_position_embeddings = 64" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_mixture_language_without_data_is_refused_before_any_stage(tmp_path):
    """A [train] mixture naming a language the [data] inputs lack failed only when training started,
    after the tokenizer and data stages had run (and the fixed config then differed from the run's)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'out_dir = "{tmp_path / "run"}"\n'
        '[tokenizer]\ninputs = {bn = ["data/bn"], en = ["data/en"]}\n'
        '[data]\ninputs = {bn = ["data/bn"], en = ["data/en"]}\n'
        "[train]\nmixture = {bn = 0.5, de = 0.5}\n",
        encoding="utf-8",
    )
    proc = _prodip("run", str(cfg), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{cfg} [train] mixture names language(s) de that [data] inputs do not have (bn, en)" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_empty_config_or_no_stages_is_refused_before_writing(tmp_path):
    empty = tmp_path / "empty.toml"
    empty.write_text(f'out_dir = "{tmp_path / "run"}"\n', encoding="utf-8")
    proc = _prodip("run", str(empty), "--stages", "tokenizer", timeout=120)
    assert proc.returncode == 2 and "[tokenizer] inputs: no corpus given" in proc.stderr
    proc = _prodip("run", str(empty), "--stages", "", timeout=120)
    assert proc.returncode == 2 and "no stages to run" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_stage_times_count_interrupted_invocations(tmp_path, monkeypatch):
    """Issue 12: stage_times.json lost the interrupted part of training."""
    import dataclasses

    from prodip import pipeline

    calls = []

    def interrupted_then_done(cfg, ctx):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    tok = pipeline.STAGES["tokenizer"]
    fake = dataclasses.replace(tok, run=interrupted_then_done, done=lambda cfg: len(calls) >= 2)
    monkeypatch.setitem(pipeline.STAGES, "tokenizer", fake)
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'out_dir = "{tmp_path / "run"}"\nstages = ["tokenizer"]\n[tokenizer]\ninputs = {{bn = ["data/bn"]}}\n'
        '[audit]\nheldout = {bn = ["data/heldout/udhr_ben.txt"]}\n',
        encoding="utf-8",
    )
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline(str(cfg))
    first = json.loads((tmp_path / "run" / "stage_times.json").read_text())["stages"]["tokenizer"]
    assert first["complete"] is False and first["invocations"] == 1
    pipeline.run_pipeline(str(cfg))
    second = json.loads((tmp_path / "run" / "stage_times.json").read_text())["stages"]["tokenizer"]
    assert second["complete"] is True and second["invocations"] == 2 and second["seconds"] >= first["seconds"]


@pytest.mark.slow
def test_chat_fine_tuning_stage_chains_into_export(tmp_path):
    """Issue 23: an [sft] table adds chat fine-tuning after pretraining and export takes that checkpoint
    (the chat tokenizer and its template with it); a re-run skips it; without the table (every other test
    here) the run exports the pretrained model."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _cut_corpus(corpus, "bn", 120_000, 10_000)
    _cut_corpus(corpus, "en", 120_000, 10_000)
    write_sources(corpus, {"bn_*.txt": "bn", "en_*.txt": "en"}, license="LicenseRef-PublicDomain")  # data/'s texts
    text = TINY_TOML.format(out=tmp_path / "run", corpus=corpus, repo=REPO)
    text = 'stages = ["tokenizer", "data", "train", "sft", "export"]\n' + text.replace("steps = 30", "steps = 8")
    text += f"""
[sft]
inputs = {{bn = ["{REPO}/data/chat/bn.jsonl.gz"], en = ["{REPO}/data/chat/en.jsonl.gz"]}}
steps = 6
batch_size = 4
seq_len = 128
lr = 3e-3
warmup_steps = 1
val_fraction = 0.02
progress = false

[export]
variants = ["safetensors"]
"""
    config = tmp_path / "sft.toml"
    config.write_text(text, encoding="utf-8")
    proc = _prodip("run", str(config))
    assert proc.returncode == 0, f"prodip run failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    from prodip.base.chat import CHAT_TEMPLATE

    run = tmp_path / "run"
    ev = json.loads((run / "sft" / "sft_eval.json").read_text())
    assert set(ev["before"]) == set(ev["after"]) == {"bn", "en"} and ev["step"] == 6
    manifest = json.loads((run / "export" / "manifest.json").read_text())
    assert Path(manifest["source_checkpoint"]["path"]).resolve().is_relative_to((run / "sft").resolve())
    stages = {s["name"]: s.get("stage") for s in manifest["card"]["sources"]}  # the card: both stages' data
    assert stages == {
        "test-0": "pretraining",
        "test-1": "pretraining",
        "tatoeba-chat-bn": "sft",
        "tatoeba-chat-en": "sft",
    }
    exported = json.loads((run / "export" / "tokenizer_config.json").read_text())
    assert exported["chat_template"] == CHAT_TEMPLATE
    assert "chat fine-tuning: held-out loss on assistant tokens" in proc.stdout
    again = _prodip("run", str(config))
    assert again.returncode == 0 and "sft: already complete, skipped" in again.stdout, again.stdout[-2000:]


def test_every_input_is_checked_before_the_first_stage(tmp_path):
    """A missing [data] input was found only after the tokenizer stage had trained; a missing [audit] heldout
    failed without naming the table."""
    data = REPO / "data"
    base = (
        f'out_dir = "{tmp_path / "run"}"\nstages = ["tokenizer", "data"]\n'
        f'[tokenizer]\ninputs = {{bn = ["{data / "bn"}"]}}\n'
        f'[data]\ninputs = {{bn = ["{data / "bn"}", "{tmp_path / "nope.txt"}"]}}\n'
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text(base + f'[audit]\nheldout = {{bn = ["{data / "heldout" / "udhr_ben.txt"}"]}}\n', encoding="utf-8")
    proc = _prodip("run", str(cfg), timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert f"[data] inputs.bn: {tmp_path / 'nope.txt'} does not exist" in proc.stderr
    assert "relative paths are read from the current folder" in proc.stderr
    assert not (tmp_path / "run" / "tokenizer").exists()
    cfg.write_text(base.replace(f', "{tmp_path / "nope.txt"}"', ""), encoding="utf-8")
    proc = _prodip("run", str(cfg), timeout=120)
    assert proc.returncode == 2 and "[audit] heldout: none given" in proc.stderr, proc.stderr
    assert not (tmp_path / "run" / "tokenizer").exists()


def test_run_marker_and_corpus_stamps_are_records_and_old_stamps_still_read(tmp_path, monkeypatch):
    """prodip_run.json and corpus_inputs.json go through their records: a corpus_inputs.json written before
    it had a format_version (the bare table) still says the corpus is unchanged, and a marker of a version
    this prodip does not read is refused naming it (never taken as a run --force may delete)."""
    import dataclasses

    from prodip import pipeline
    from prodip.base.errors import UserError

    calls = []
    tok = pipeline.STAGES["tokenizer"]
    fake = dataclasses.replace(tok, run=lambda cfg, ctx: calls.append(1), done=lambda cfg: bool(calls))
    monkeypatch.setitem(pipeline.STAGES, "tokenizer", fake)
    run = tmp_path / "run"
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        f'out_dir = "{run}"\nstages = ["tokenizer"]\n[tokenizer]\ninputs = {{bn = ["data/bn"]}}\n'
        '[audit]\nheldout = {bn = ["data/heldout/udhr_ben.txt"]}\n',
        encoding="utf-8",
    )
    pipeline.run_pipeline(str(cfg))
    assert (run / "prodip_run.json").read_text() == '{"format_version": 1, "config": "config.toml"}\n'
    stamps = pipeline.CorpusStamps.read(run / "corpus_inputs.json")
    fingerprint = stamps.stages["tokenizer"]
    assert stamps.format_version == 1 and isinstance(fingerprint, str) and len(fingerprint) == 64
    # the layout written before records: the bare table; the corpus is the same, so the stage is skipped
    (run / "corpus_inputs.json").write_text(json.dumps({"tokenizer": fingerprint}, indent=2) + "\n")
    pipeline.run_pipeline(str(cfg))
    assert calls == [1]
    assert json.loads((run / "corpus_inputs.json").read_text()) == {
        "format_version": 1,
        "stages": {"tokenizer": fingerprint},
    }
    (run / "prodip_run.json").write_text('{"format_version": 9, "config": "config.toml"}\n')
    with pytest.raises(
        UserError, match=r"prodip_run.json: written by a newer prodip \(format_version 9; this prodip reads 1"
    ):
        pipeline.run_pipeline(str(cfg))
