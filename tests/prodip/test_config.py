"""prodip.base.config: TOML + flags into dataclasses, with errors that name the key."""

import argparse
import dataclasses
from typing import Optional

import pytest

from prodip.base.config import ConfigError, add_arguments, dump_toml, from_dict, opt, read_toml, resolve


@dataclasses.dataclass
class Cfg:
    steps: int = opt(10, "optimizer steps")
    lr: float = opt(1e-3, "peak learning rate")
    name: str = opt("x", "a name", choices=("x", "y"))
    compile: bool = opt(False, "torch.compile")
    mixture: dict[str, float] = opt(help="language weights", factory=lambda: {"bn": 0.6, "en": 0.4})
    files: list[str] = opt(help="inputs", factory=list)
    seed: Optional[int] = opt(None, "seed")


def _parse(argv):
    p = argparse.ArgumentParser()
    add_arguments(p, Cfg)
    return p.parse_args(argv)


def test_unknown_key_is_named_with_suggestion():
    with pytest.raises(ConfigError, match=r"demo.toml \[train\]: unknown key 'setps'.*did you mean steps"):
        from_dict(Cfg, {"setps": 3}, source="demo.toml [train]")


def test_wrong_type_names_key_and_type():
    with pytest.raises(ConfigError, match=r"\[train\] steps: expected int, got str '3'"):
        from_dict(Cfg, {"steps": "3"}, source="[train]")
    with pytest.raises(ConfigError, match="compile: expected true or false"):
        from_dict(Cfg, {"compile": 1}, source="[train]")
    with pytest.raises(ConfigError, match="name: 'z' is not one of x, y"):
        from_dict(Cfg, {"name": "z"}, source="[train]")


def test_int_promoted_to_float_but_not_bool_to_int():
    assert from_dict(Cfg, {"lr": 1}, source="s").lr == 1.0
    assert isinstance(from_dict(Cfg, {"lr": 1}, source="s").lr, float)
    with pytest.raises(ConfigError):
        from_dict(Cfg, {"steps": True}, source="s")


def test_flags_override_file_and_file_overrides_defaults(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[train]\nsteps = 50\nlr = 0.01\nmixture = {bn = 0.5, en = 0.5}\n")
    cfg = resolve(Cfg, _parse(["--lr", "0.5", "--files", "a.txt,b.txt"]), toml_path=str(path), section="train")
    assert cfg.steps == 50 and cfg.lr == 0.5 and cfg.files == ["a.txt", "b.txt"]
    assert cfg.mixture == {"bn": 0.5, "en": 0.5}
    cfg = resolve(Cfg, _parse(["--mixture", "bn=0.9,en=0.1", "--seed", "7"]))
    assert cfg.mixture == {"bn": 0.9, "en": 0.1} and cfg.seed == 7 and cfg.steps == 10


def test_bad_flag_value_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit):
        _parse(["--steps", "many"])
    assert "--steps: cannot read 'many' as int" in capsys.readouterr().err


def test_toml_errors_name_the_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        read_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("steps = = 3\n")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML"):
        read_toml(bad)


def test_dump_toml_round_trips_and_drops_none(tmp_path):
    cfg = Cfg(steps=3, files=["a"], seed=None)
    text = dump_toml({"train": dataclasses.asdict(cfg)})
    path = tmp_path / "out.toml"
    path.write_text(text)
    back = resolve(Cfg, None, toml_path=str(path), section="train")
    assert back == cfg


def test_bool_flag_alone_means_true():
    assert _parse(["--compile"]).compile is True
    assert _parse(["--compile", "false"]).compile is False


def test_dict_flag_values_may_hold_commas_and_inline_lists():
    @dataclasses.dataclass
    class Run:
        prompts: dict[str, str] = opt(help="prompts", factory=dict)
        inputs: dict[str, list[str]] = opt(help="files per language", factory=dict)

    p = argparse.ArgumentParser()
    add_arguments(p, Run)
    cfg = resolve(
        Run, p.parse_args(["--prompts", "bn=একদিন, সকালে,en=It was cold, and x", "--inputs", "bn=a.txt,b.txt, en=c.txt"])
    )
    assert cfg.prompts == {"bn": "একদিন, সকালে", "en": "It was cold, and x"}
    assert cfg.inputs == {"bn": ["a.txt", "b.txt"], "en": ["c.txt"]}
    with pytest.raises(SystemExit):
        p.parse_args(["--prompts", "no-equals-sign"])


def test_stage_command_reading_a_pipeline_file_uses_its_out_dir(tmp_path):
    """`prodip train --config configs/h100-0.4b.toml` must find what `prodip run ... --stages
    tokenizer,data` wrote under that file's out_dir, not runs/demo/."""
    from prodip.train.trainer import TrainConfig

    path = tmp_path / "pipe.toml"
    path.write_text(f'out_dir = "{tmp_path / "big"}"\n[train]\nsteps = 5\n')
    cfg = resolve(TrainConfig, toml_path=str(path), section="train")
    assert (cfg.shards_dir, cfg.tokenizer_dir, cfg.out_dir, cfg.steps) == (
        str(tmp_path / "big" / "shards"),
        str(tmp_path / "big" / "tokenizer"),
        str(tmp_path / "big" / "train"),
        5,
    )
    path.write_text(f'out_dir = "{tmp_path / "big"}"\n[train]\nshards_dir = "elsewhere"\n')
    assert resolve(TrainConfig, toml_path=str(path), section="train").shards_dir == "elsewhere"  # table wins
    path.write_text("[train]\nsteps = 5\n")  # a stage-only file keeps the stage's own defaults
    assert resolve(TrainConfig, toml_path=str(path), section="train").out_dir == TrainConfig().out_dir


def test_stage_reader_rejects_an_unknown_table_like_prodip_run(tmp_path):
    """Issue 12: a misspelt [trian] was ignored by the stage commands (`prodip run` caught it)."""
    toml = tmp_path / "c.toml"
    toml.write_text('completion_prompts = { bn = "x" }\n[trian]\nsteps = 3\n[data]\nseed = 1\n')
    with pytest.raises(ConfigError, match=r"c.toml: unknown table \[trian\]"):
        resolve(Cfg, None, toml_path=str(toml), section="train")


def test_layout_tables_are_the_pipeline_sections():
    from prodip.base.layout import TABLES
    from prodip.pipeline import SECTIONS

    assert tuple(SECTIONS) == TABLES


def test_stage_commands_alone_chain_through_the_run_layout():
    """Issue 12: `prodip tokenizer train` wrote runs/tokenizer, `prodip train` looked in runs/demo/..."""
    from prodip.tokenizer.audit import AuditConfig
    from prodip.tokenizer.bpe import TokenizerTrainConfig
    from prodip.tokenizer.encode import DataPrepareConfig
    from prodip.train.eval import EvalConfig
    from prodip.train.trainer import TrainConfig

    tok = resolve(TokenizerTrainConfig, None, section="tokenizer")
    data = resolve(DataPrepareConfig, None, section="data")
    train = resolve(TrainConfig, None, section="train")
    assert (
        tok.out_dir
        == data.tokenizer_dir
        == train.tokenizer_dir
        == resolve(AuditConfig, None, section="audit").tokenizer_dir
    )
    assert data.out_dir == train.shards_dir == "runs/demo/shards" and tok.out_dir == "runs/demo/tokenizer"
    ev = resolve(EvalConfig, None, section="eval")
    assert ev.checkpoint == "" and ev.out is None  # inputs the user must name are not filled in


def _serve_config(threads: int):
    from prodip.serve.config import ServeConfig

    return ServeConfig(intra_op_threads=threads)


def _conformance_config(threads: int):
    from prodip.conformance.config import ConformanceConfig

    return ConformanceConfig(threads=threads)


@pytest.mark.parametrize("make", [_serve_config, _conformance_config])
def test_thread_counts_are_checked_against_the_usable_cpus(make):
    """`prodip serve --intra-op-threads 100000` was accepted and ONNX Runtime started 100000 threads
    (16 GB, never answered): every thread option takes 0 (library default) .. the usable CPUs."""
    from prodip.base.config import usable_cpus
    from prodip.base.errors import InvalidInput

    cpus = usable_cpus()
    make(0)
    make(cpus)
    for bad in (-1, cpus + 1, 100_000):
        with pytest.raises(InvalidInput, match=rf"must be in \[0, {cpus}\].*got {bad}"):
            make(bad)


def test_every_stage_config_class_lives_in_its_packages_config_module():
    """One place per kind: each config table's class (and [extend]'s) is declared in its stage's config.py,
    and the corpus-reading / source-record keys are declared once, in the shared parts."""
    from prodip.base.sources import SourceOptions
    from prodip.plan import RunPlan
    from prodip.tokenizer.config import CorpusOptions, ExtendConfig

    classes = {**RunPlan.classes(), "extend": ExtendConfig}
    misplaced = {t: c.__module__ for t, c in classes.items() if not c.__module__.endswith(".config")}
    assert not misplaced, misplaced
    shared = {f.name for f in dataclasses.fields(CorpusOptions)}
    assert shared == {"text_field", "doc_chars", "errors", "sources", "include_unknown_license"}
    readers = [t for t, c in classes.items() if shared <= {f.name for f in dataclasses.fields(c)}]
    assert readers == ["tokenizer", "data"] and all(issubclass(classes[t], CorpusOptions) for t in readers)
    assert issubclass(classes["sft"], SourceOptions)


def test_help_lists_a_configs_own_options_before_the_shared_ones():
    """A config inheriting a shared part (DataPrepareConfig < CorpusOptions) shows its own flags first."""
    from prodip.tokenizer.config import DataPrepareConfig

    p = argparse.ArgumentParser()
    add_arguments(p, DataPrepareConfig)
    flags = [a.option_strings[0] for a in p._actions if a.option_strings and a.dest != "help"]
    assert flags[:3] == ["--tokenizer-dir", "--inputs", "--out-dir"]
    assert flags[-5:] == ["--sources", "--include-unknown-license", "--text-field", "--doc-chars", "--errors"]


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "CKPT"],
        ["conformance", "EXPORT"],
        ["eval", "--checkpoint", "CKPT"],
        ["tokenizer", "train"],
    ],
    ids=lambda argv: argv[0],
)
def test_every_stage_config_is_checked_whole_as_prodip_run_does(tmp_path, capsys, argv):
    """A stage command reads one table of --config, but a typo in another (``[serve] varaint``) is refused as
    `prodip run` refuses it (exit 2, file, table and key named), before the stage reads anything."""
    from prodip.cli import main

    bad = tmp_path / "bad.toml"
    bad.write_text('[export]\nvariants = ["fp32"]\n\n[serve]\nvaraint = "int8"\n', encoding="utf-8")
    argv = [str(tmp_path / a) if a.isupper() else a for a in argv]
    assert main([*argv, "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad} [serve]: unknown key 'varaint'; did you mean variant?" in err, err
