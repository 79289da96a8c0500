"""Bad input: a clear error naming the problem, and nothing half-written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from prodip.export.config import ExportConfig
from prodip.export.core import export_checkpoint


def _copy_run(export_dir: Path, tmp_path: Path) -> Path:
    return shutil.copytree(export_dir.parent / "run", tmp_path / "run")


def _step_dir(run: Path) -> Path:
    ckpt = run / "checkpoints"
    return ckpt / (ckpt / "latest").read_text().strip()


def _rewrite_weights(run: Path, edit) -> None:
    """Apply ``edit(tensors)`` to the checkpoint's model.safetensors and re-hash its manifest,
    so that only the tensor problem remains."""
    from prodip.train.checkpoint import file_sha256

    step = _step_dir(run)
    tensors = load_file(str(step / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(step / "model.safetensors"), metadata={"format": "pt"})
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["files"]["model.safetensors"] = {
        "bytes": (step / "model.safetensors").stat().st_size,
        "sha256": file_sha256(step / "model.safetensors"),
    }
    (step / "manifest.json").write_text(json.dumps(manifest))


def _nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.*")), "temporary export dir left behind"


def _cfg(run: Path, out: Path, **kw) -> ExportConfig:
    return ExportConfig(checkpoint=str(run), out=str(out), **kw)


def _export_like(out: Path, manifest) -> Path:
    """A folder holding ``model.safetensors`` and the given manifest.json text (no model is built)."""
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"weights")
    (out / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return out


def test_force_refuses_an_export_of_a_newer_prodip_naming_its_version(tmp_path, capsys):
    """`prodip export --force` onto an export whose manifest.json has a newer format_version said the folder
    "holds no export manifest.json"; it is an export this prodip cannot read: the file and version are named,
    and nothing is deleted (checked before the checkpoint is even looked at)."""
    from prodip.cli import main

    newer = {"format_version": 2, "files": {"model.safetensors": {"bytes": 7, "sha256": "0" * 64}}, "variants": {}}
    out = _export_like(tmp_path / "export", newer)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(FileExistsError) as err:
        export_checkpoint(_cfg(tmp_path / "no-run", out, variants=["safetensors"], force=True))
    msg = str(err.value)
    assert f"{out}: holds an export of a newer prodip ({out / 'manifest.json'} has format_version 2;" in msg
    assert "this prodip reads 1" in msg and "Upgrade prodip" in msg and "holds no" not in msg
    assert sorted(p.name for p in out.iterdir()) == before and (out / "model.safetensors").read_bytes() == b"weights"
    rc = main(["export", str(tmp_path / "no-run"), "--out", str(out), "--force"])
    stderr = capsys.readouterr().err
    assert rc == 2 and "format_version 2" in stderr and "Traceback" not in stderr
    assert sorted(p.name for p in out.iterdir()) == before


@pytest.mark.parametrize(
    "manifest, why",
    [
        (None, "is not empty and holds no export manifest.json"),
        ("{not json", "is not an export manifest this prodip reads (.*manifest.json: not valid JSON"),
        ({"format_version": 0, "files": {}}, "is not an export manifest this prodip reads (.*format_version 0"),
        ({"format_version": 1, "files": {}}, "is not an export manifest this prodip reads (.*field 'variants'"),
    ],
)
def test_force_names_why_a_folder_is_not_an_export(tmp_path, manifest, why):
    out = tmp_path / "export"
    if manifest is None:
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"weights")
    else:
        _export_like(out, manifest)
    with pytest.raises(FileExistsError, match=why.replace("(", r"\(")):
        export_checkpoint(_cfg(tmp_path / "no-run", out, variants=["safetensors"], force=True))
    assert (out / "model.safetensors").read_bytes() == b"weights"


def test_checkpoint_hash_mismatch(gqa_export, tmp_path):
    run = _copy_run(gqa_export, tmp_path)
    weights = _step_dir(run) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x40  # inside the last tensor's data: same size, different bytes
    weights.write_bytes(bytes(data))
    out = tmp_path / "export"
    with pytest.raises(ValueError, match=r"model\.safetensors.*sha256"):
        export_checkpoint(_cfg(run, out))
    _nothing_written(out)


@pytest.mark.parametrize("problem", ["missing", "extra", "shape"])
def test_bad_tensor_is_named_with_shapes(gqa_export, tmp_path, problem):
    run = _copy_run(gqa_export, tmp_path)
    key = "model.layers.1.mlp.up_proj.weight"

    def edit(tensors):
        if problem == "missing":
            del tensors[key]
        elif problem == "extra":
            tensors["model.layers.9.mlp.up_proj.weight"] = tensors[key].clone()
        else:
            tensors[key] = torch.zeros(tensors[key].shape[0], tensors[key].shape[1] + 1)

    _rewrite_weights(run, edit)
    out = tmp_path / "export"
    pattern = {
        "missing": key,
        "extra": "model.layers.9.mlp.up_proj.weight",
        "shape": rf"{key}.*\(256, 129\).*\(256, 128\)",
    }[problem]
    with pytest.raises(ValueError, match=pattern):
        export_checkpoint(_cfg(run, out))
    _nothing_written(out)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="prodip train"):
        export_checkpoint(_cfg(tmp_path / "nope", tmp_path / "export"))
    with pytest.raises(ValueError, match="checkpoint"):
        export_checkpoint(ExportConfig(out=str(tmp_path / "export")))


def test_unknown_variant():
    with pytest.raises(ValueError, match="'int3'.*safetensors, fp32, fp16, int8, int4"):
        ExportConfig(checkpoint="x", out="y", variants=["fp32", "int3"])
    with pytest.raises(ValueError, match="int4_block_size"):
        ExportConfig(checkpoint="x", out="y", int4_block_size=24)


def test_non_empty_out_refused_then_forced(gqa_export, tmp_path):
    run = gqa_export.parent / "run"
    out = tmp_path / "export"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="--force"):
        export_checkpoint(_cfg(run, out, variants=["safetensors"]))
    assert (out / "keep.txt").read_text() == "precious"
    with pytest.raises(FileExistsError, match="holds no export manifest.json"):  # not an export: never deleted
        export_checkpoint(_cfg(run, out, variants=["safetensors"], force=True))
    assert (out / "keep.txt").read_text() == "precious"
    out = tmp_path / "export2"
    export_checkpoint(_cfg(run, out, variants=["safetensors"]))
    export_checkpoint(_cfg(run, out, variants=["safetensors"], force=True))  # an export as written: replaced
    (out / "notes.txt").write_text("left by hand in an export")
    with pytest.raises(FileExistsError, match=r"does not list \(notes.txt\)"):  # never deleted silently
        export_checkpoint(_cfg(run, out, variants=["safetensors"], force=True))
    assert (out / "notes.txt").read_text() == "left by hand in an export"
    (out / "notes.txt").unlink()
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "thesis.tex").write_text("precious")
    (fake / "manifest.json").write_text('{"variants": {}}')  # looks like a manifest, is not an export's
    with pytest.raises(FileExistsError, match="its manifest.json is not an export manifest this prodip reads"):
        export_checkpoint(_cfg(run, fake, variants=["safetensors"], force=True))
    assert (fake / "thesis.tex").read_text() == "precious"
    link = tmp_path / "link"
    link.symlink_to(out)
    with pytest.raises(FileExistsError, match="symbolic link"):
        export_checkpoint(_cfg(run, link, variants=["safetensors"], force=True))
    for above in (run, run.parent):  # --out holding the checkpoint being exported
        with pytest.raises((FileExistsError, ValueError)):
            export_checkpoint(_cfg(run, above, variants=["safetensors"], force=True))
    assert (run / "checkpoints" / "latest").exists()
    from prodip.base.manifest import verify_files

    assert set(verify_files(out).variants) == {"safetensors"}


def test_failure_midway_leaves_old_export_intact(gqa_export, tmp_path, monkeypatch):
    """The exporter crashing after the HF files were written leaves no trace (and an old export)."""
    import prodip.export.core

    run = gqa_export.parent / "run"
    out = tmp_path / "export"

    def broken(*args, **kwargs):
        raise RuntimeError("exporter crashed")

    monkeypatch.setattr(prodip.export.core, "export_onnx", broken)
    with pytest.raises(RuntimeError, match="exporter crashed"):
        export_checkpoint(_cfg(run, out, variants=["safetensors", "int8"]))
    _nothing_written(out)
    out.mkdir()
    (out / "old.txt").write_text("old export")
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "source_checkpoint": {},
                "variants": {},
                "files": {"old.txt": {"bytes": 10, "sha256": "0" * 64}},
            }
        )
    )
    with pytest.raises(RuntimeError):
        export_checkpoint(_cfg(run, out, variants=["safetensors", "int8"], force=True))
    assert (out / "old.txt").read_text() == "old export"
    assert not list(tmp_path.glob(".export.*"))


def test_cli_errors_exit_2(gqa_export, tmp_path, capsys):
    from prodip.cli import main

    run = gqa_export.parent / "run"
    assert main(["export", str(run), "--out", str(tmp_path / "e"), "--variants", "fp32,int3"]) == 2
    assert "int3" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["export", str(run), "--out", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err


def test_cli_toml_and_flags(gqa_export, tmp_path, capsys):
    from prodip.cli import main

    run = gqa_export.parent / "run"
    toml = tmp_path / "cfg.toml"
    toml.write_text(
        f'[export]\ncheckpoint = "{run}"\nout = "{tmp_path / "e"}"\nvariants = ["fp32"]\n'
        'safetensors_dtype = "bfloat16"\n'
    )
    assert main(["export", "--config", str(toml), "--variants", "safetensors"]) == 0
    from prodip.base.manifest import load_manifest

    m = load_manifest(tmp_path / "e")
    assert set(m.variants) == {"safetensors"} and m.variants["safetensors"].dtype == "bfloat16"
    assert m.export_config is not None and m.export_config.safetensors_dtype == "bfloat16"
    assert "variant" in capsys.readouterr().out  # the size table


def test_checkpoint_without_tokenizer_is_named(gqa_export, tmp_path):
    run = _copy_run(gqa_export, tmp_path)
    shutil.rmtree(_step_dir(run) / "tokenizer")
    out = tmp_path / "export"
    with pytest.raises(FileNotFoundError, match=r"tokenizer/tokenizer\.json: missing.*`prodip train`"):
        export_checkpoint(_cfg(run, out, variants=["safetensors"]))
    _nothing_written(out)


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_dirs_of_killed_exports_are_removed(gqa_export, tmp_path, caplog):
    """A SIGKILLed export leaves ``.OUT.tmp.<pid>``; the next export deletes it when ``pid`` is gone."""
    import logging
    import os

    run = gqa_export.parent / "run"
    out = tmp_path / "export"
    dead = _dead_pid()
    stale = [tmp_path / f".export.tmp.{dead}", tmp_path / f".export.old.{dead}"]
    live = tmp_path / f".export.tmp.{os.getppid()}"  # the parent process runs: another export, keep it
    other = tmp_path / f".other.tmp.{dead}"  # another target's folder: not ours to judge
    for d in [*stale, live, other]:
        (d / "onnx").mkdir(parents=True)
        (d / "onnx" / "model.onnx").write_bytes(b"\0" * 4096)
    with caplog.at_level(logging.WARNING, logger="export"):
        export_checkpoint(_cfg(run, out, variants=["safetensors"]))
    assert [d.exists() for d in stale] == [False, False]
    assert live.is_dir() and other.is_dir()
    removed = [r.getMessage() for r in caplog.records if "no longer runs" in r.getMessage()]
    assert len(removed) == 2 and all(str(dead) in m for m in removed)
    from prodip.base.manifest import verify_files

    assert set(verify_files(out).variants) == {"safetensors"}


def test_conflicting_checkpoints_are_refused(tmp_path, capsys):
    from prodip.cli import main

    assert main(["export", str(tmp_path / "a"), "--checkpoint", str(tmp_path / "b"), "--out", str(tmp_path / "e")]) == 2
    assert "two checkpoints given" in capsys.readouterr().err and not (tmp_path / "e").exists()


def test_a_hf_folder_without_config_json_names_both_layouts(tmp_path, capsys):
    """A folder with a Hugging Face model's weights and tokenizer but no config.json: the message names
    what a prodip checkpoint holds and what a HF folder holds, and that config.json is the missing file."""
    from prodip.cli import main

    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({"model.embed_tokens.weight": torch.zeros(4, 2)}, str(folder / "model.safetensors"))
    (folder / "tokenizer.json").write_text("{}", encoding="utf-8")
    assert main(["export", str(folder), "--out", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"prodip export: error: {folder}: neither a prodip checkpoint (a step dir with manifest.json, or a "
        "run/checkpoints dir with a 'latest' file; made by `prodip train`) nor a Hugging Face folder "
        "(config.json + model.safetensors + tokenizer.json; missing here: config.json)"
    )
    assert not (tmp_path / "e").exists()


def test_int4_block_size_against_the_matmul_input_sizes():
    """A block size blocks a MatMul weight when it divides the input size K (the qdq layout's DequantizeLinear)
    or, in the MatMulNBits layout, when it is at most K (a padded last block): refused when it blocks none."""
    from prodip.base.errors import InvalidInput
    from prodip.export.limits import check_int4_block_size, matmul_input_sizes
    from prodip.train.config import ModelConfig

    odd = ModelConfig(
        vocab_size=64, hidden_size=96, num_attention_heads=6, num_key_value_heads=2, intermediate_size=160
    )
    assert matmul_input_sizes(odd) == {
        "hidden_size": 96,
        "num_attention_heads * head_dim": 96,
        "intermediate_size": 160,
    }
    for qdq in (True, False):
        check_int4_block_size(odd, 32, qdq=qdq)  # 96 = 3 * 32
    check_int4_block_size(odd, 64, qdq=False)  # MatMulNBits: 96 and 160 in two and three blocks, the last padded
    with pytest.raises(InvalidInput, match=r"= 64 .*no MatMul input size of this model \(hidden_size = 96, .*"
                       r"intermediate_size = 160\) is a multiple of it, .*qdq layout.*; choose one of 16, 32$"):  # fmt: skip
        check_int4_block_size(odd, 64, qdq=True)
    with pytest.raises(InvalidInput, match=r"= 256 .*larger than every MatMul input size.*choose one of 16, 32$"):
        check_int4_block_size(odd, 256, qdq=False)
