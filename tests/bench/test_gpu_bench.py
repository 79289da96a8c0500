"""bench/gpu/bench.py (``make gpu-bench``): its fallback rules, its profile split, and its CPU dry run
end to end in a Python that lacks what the GPU image lacks (tests/gpu_image), so it cannot rot
between GPU windows."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_bench", ROOT / "bench" / "gpu" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bench = _bench()

OOM = """Traceback (most recent call last):
  File "x.py", line 3, in <module>
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.8 GiB"""
INDUCTOR = """torch._inductor.exc.InductorError: LoweringException: AssertionError: triton kernel failed
  target: aten.embedding_dense_backward.default"""
INDUCTOR_SDPA = """torch._inductor.exc.InductorError: RuntimeError: cuDNN Frontend error: No execution plans"""
CUDNN = "RuntimeError: cuDNN Frontend error: [cudnn_frontend] Error: No execution plans support the graph."


def test_failures_are_classified_and_each_has_its_fallback():
    kinds = [bench.classify_failure(t) for t in (OOM, INDUCTOR, INDUCTOR_SDPA, CUDNN, "ValueError: bad shard")]
    assert kinds == ["oom", "compile", "attention", "attention", "other"]
    assert bench.error_line(OOM).startswith("torch.OutOfMemoryError: CUDA out of memory")
    s = {"batch_size": 16, "grad_accum_steps": 8, "attention_backend": "cudnn", "compile": True}
    # OOM: half the micro-batch, same tokens per step
    assert bench.next_settings(s, "oom") == {**s, "batch_size": 8, "grad_accum_steps": 16}
    # a compile failure: compile with flash attention first (cuDNN inside Inductor), then eager with flash
    flash = bench.next_settings(s, "compile")
    assert flash == {**s, "attention_backend": "flash"}
    assert bench.next_settings(flash, "compile") == {**flash, "compile": False}
    chain = [s["attention_backend"]]
    while (s := bench.next_settings(s, "other")) is not None:  # cudnn -> flash -> efficient -> math -> give up
        chain.append(s["attention_backend"])
    assert chain == ["cudnn", "flash", "efficient", "math"]
    one = {"batch_size": 1, "grad_accum_steps": 128, "attention_backend": "math", "compile": False}
    assert bench.next_settings(one, "oom") is None and bench.next_settings(one, "compile") is None


def test_a_workers_result_is_found_under_lines_logged_after_it():
    text = 'step 1\n{"tokens_per_s": 5.0}\n[W1202 compile_worker] shutting down\n'
    assert bench.last_json(text) == {"tokens_per_s": 5.0}
    with pytest.raises(RuntimeError, match="no result line.*ValueError: boom"):
        bench.last_json("Traceback (most recent call last):\nValueError: boom\n")


def test_profile_categories():
    names = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmul",
        "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT": "matmul",
        "aten::addmm": "matmul",
        "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4>>": "attention",
        "cudnn_generated_fort_native_sdpa_sm90_knob_7_64x128x64_4x1x1_kernel0_0": "attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
        "triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0": "norm/elementwise",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "norm/elementwise",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
        "aten::_fused_adamw_": "optimizer",
        "Memcpy HtoD (Pinned -> Device)": "other",
    }
    assert {n: bench.categorise(n) for n in names} == names


def test_summary_leaves_out_warm_up_and_saves_and_keeps_a_cut_off_run(tmp_path):
    """Medians over the steps after the warm-up that hold no save; the rows of a run cut short count."""
    rows = []
    for step in range(1, 7):  # a run killed after step 6: saves at 4 (and none later)
        row = {"step": step, "loss": 10.0 - step, "tokens_seen": 100 * step, "tokens_per_s": 1000.0 + step}
        row.update(step_time_s=0.1, elapsed_s=0.1 * step + 5.0, mfu=0.4 + step / 100)
        if step == 4:
            row.update(checkpoint_stall_s=0.5, tokens_per_s=500.0)
        rows.append(row)
    rows[0].update(step_time_s=5.0, attention_kernel="flash (cpu)", loop_start_unix_s=1000.0)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = bench.summarise(tmp_path, skip=2, spawned_unix_s=990.5)
    assert s["steps"] == 6 and s["steps_in_median"] == 3  # steps 3, 5, 6
    assert s["tokens_per_s_median"] == 1005.0 and s["mfu_median"] == 0.45
    assert s["time_to_first_step_s"] == 9.5 and s["first_step_s"] == 5.0 and s["checkpoint_stall_s"] == [0.5]


def test_compile_figures_are_dynamos_own_counts():
    """Compile seconds, graph breaks and graphs as Dynamo counts them in the compiling process."""
    import torch
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    dynamo_utils.compilation_time_metrics.clear()
    assert bench.compile_figures()["compile_s"] is None  # nothing compiled: N/A, not 0

    def f(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    torch.compile(f, backend="eager")(torch.ones(3))
    fig = bench.compile_figures()
    assert fig["compile_s"] > 0 and fig["graph_breaks"] == 1 and fig["unique_graphs"] == 2
    assert fig["backward_compile_s"] == 0 and fig["compile_s"] == fig["forward_compile_s"]  # eager: no backward
    # Inductor's backward compile, lazy at the first backward, counts too (its timer's key, as Inductor names it)
    dynamo_utils.compilation_time_metrics["compile_fx.<locals>.bw_compiler"] = [2.5]
    assert bench.compile_figures()["compile_s"] == round(fig["forward_compile_s"] + 2.5, 2)
    assert "graph_break" in fig["graph_break_reasons"][0]
    torch._dynamo.reset()


def test_site_dir_maps_the_stage_folders(tmp_path):
    site = bench.site_dir(tmp_path)
    assert (site / "prodip" / "train" / "trainer.py").is_file()
    assert (site / "prodip" / "base" / "errors.py").is_file()
    assert (site / "prodip" / "export").resolve() == ROOT / "export"


def _image():
    spec = importlib.util.spec_from_file_location("gpu_image_site", ROOT / "tests" / "gpu_image" / "sitecustomize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # defines the image's finder; inserted into this process's meta path too
    sys.meta_path.remove(mod._ImageFinder)
    return mod


def test_what_the_project_needs_beyond_the_image_is_carried_or_named():
    """pyproject.toml's dependencies (and train extra) minus the committed image list: each one is
    carried as wheels or named as off the bench path, and nothing else is."""
    image = _image()
    lacking = image.project_distributions() - image.image_distributions()
    carried = {image.normalise(module) for module in bench.CARRIED}
    assert lacking == carried | set(bench.NOT_CARRIED), (lacking, carried, set(bench.NOT_CARRIED))
    assert not carried & set(bench.NOT_CARRIED)
    for prefixes in bench.CARRIED.values():  # every wheel is committed, in a form the image's 3.12 takes
        for prefix in prefixes:
            names = [w.name for w in bench.WHEELS.glob(prefix + "*.whl")]
            assert any("-py3-none-any" in n or "-cp312-cp312-" in n for n in names), (prefix, names)


def _imports(tmp_path, code, pythonpath):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "gpu_image"), *pythonpath])}
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True)


def _carried(tmp_path, monkeypatch):
    """bench.python_path as the device runs it: its probes see the image, so it unpacks the wheels."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests" / "gpu_image"))
    return bench.python_path(tmp_path / "work")


def test_the_image_refuses_what_it_lacks_unless_the_bench_carries_it(tmp_path, monkeypatch):
    """A module importing a package the image lacks fails under tests/gpu_image, as on the device."""
    (tmp_path / "stage_a.py").write_text("import numpy, onnx\n")
    (tmp_path / "stage_b.py").write_text("import fastapi\n")  # a project dependency, not on the image
    (tmp_path / "stage_c.py").write_text("import license_expression, pydantic, tomli_w\n")
    assert _imports(tmp_path, "import stage_a", [str(tmp_path)]).returncode == 0
    proc = _imports(tmp_path, "import stage_b", [str(tmp_path)])
    assert proc.returncode and "No module named 'fastapi' (not in the GPU image" in proc.stderr
    proc = _imports(tmp_path, "import stage_c", [str(tmp_path)])
    assert proc.returncode and "No module named 'license_expression' (not in the GPU image" in proc.stderr
    assert (tmp_path / "work" / "carried").is_dir() is False
    proc = _imports(tmp_path, "import stage_c", [str(tmp_path), _carried(tmp_path, monkeypatch)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "work" / "carried" / "license_expression").is_dir()


def test_the_bench_path_imports_only_the_image_and_what_is_carried(tmp_path, monkeypatch):
    """Every stage module the bench runs imports, at module level, nothing the image lacks (the
    dry run below covers the imports inside functions)."""
    modules = ["prodip.cli", "prodip.tokenizer.cli", "prodip.train.trainer", "prodip.train.cli", "prodip.export.cli"]
    modules += ["prodip.conformance.cli", "prodip.train.determinism", "prodip.base.sources"]
    code = "import " + ", ".join(modules) + "; import prodip; print(prodip.__file__)"
    proc = _imports(tmp_path, code, [_carried(tmp_path, monkeypatch)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().startswith(str(tmp_path / "work" / "site"))  # in place, not the editable install


@pytest.mark.slow
def test_dry_run_passes_every_stage_without_what_the_gpu_image_lacks(tmp_path):
    """``make gpu-bench-dry``: every stage runs on CPU, prodip imported in place, what the image lacks from the
    committed wheels; the report holds every figure (CPU values, N/A where CUDA is needed)."""
    # the GPU image: no prodip install, no tomli_w / onnxruntime-genai (sitecustomize), no Node (PATH)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests" / "gpu_image"), "PATH": str(Path(sys.executable).parent)}
    out, work = tmp_path / "out", tmp_path / "work"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu" / "bench.py"), "--dry", str(out), "--work", str(work)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    report = json.loads((out / "report.json").read_text())
    stages = report["stages"]
    assert proc.returncode == 0, (proc.stdout[-3000:], {k: v["status"] for k, v in stages.items()})
    assert {k: v["status"] for k, v in stages.items()} == dict.fromkeys(
        ("environment", "data", "throughput", "profile", "resume", "export_conformance"), "ok"
    )
    env_facts = stages["environment"]
    assert env_facts["torch"] and env_facts["attention_kernels"]["math"].startswith("math")
    assert env_facts["attention_kernels"]["cudnn"].startswith("refused: [train] attention_backend = cudnn")
    # the fallback chain ran for real: cuDNN attention is refused on CPU, flash (CPU) then trains
    assert env_facts["gemm"]["dtype"] == "float32" and env_facts["gemm"]["tflops"] > 0
    assert env_facts["deterministic_attention_on_cuda"] == ["flash", "math"]  # the 0.4B config is GQA
    attempts = stages["throughput"]["attempts"]
    assert [a["settings"]["attention_backend"] for a in attempts] == ["cudnn", "flash"]
    assert "attention_backend = cudnn cannot run on cpu" in attempts[0]["error"]
    ok = attempts[1]
    assert ok["exit_code"] == 0 and ok["attention_kernel"] == "flash (cpu)" and ok["tokens_per_s_median"] > 0
    # 8 steps, 2 left out, saves at 4 and 8: the medians hold steps 3, 5, 6, 7
    assert ok["steps"] == 8 and len(ok["checkpoint_stall_s"]) == 2 and ok["steps_in_median"] == 4
    assert 0 < ok["time_to_first_step_s"] < ok["wall_s"]
    assert ok["peak_rss_gib"] > 0 and ok["peak_allocated_gib"] is None and ok["mfu_median"] is None  # no CUDA
    assert ok["compile_s"] is None and ok["graph_breaks"] is None  # compile off on CPU
    assert 0 < ok["fraction_of_gemm"] and ok["model_tflops"] > 0
    prof = stages["profile"]
    split = prof["split"]
    assert split["matmul"]["ms"] > 0 and split["attention"]["ms"] > 0 and split["optimizer"]["ms"] > 0
    assert abs(sum(v["share"] for v in split.values()) - 1) < 0.05
    top = prof["top_kernels"]
    assert len(top) == 15 and top[0]["ms"] >= top[-1]["ms"] > 0
    assert "aten::mm" in [r["name"] for r in top] and {"matmul", "attention"} <= {r["part"] for r in top}
    # on CPU the "device" is the CPU: the same batch and weights give the same loss
    assert prof["step1_loss"]["rel_diff"] == 0.0 and 5 < prof["step1_loss"]["cpu_fp32"] < 10
    assert prof["checkpoint_io"]["gb"] > 0 and prof["checkpoint_io"]["writer_s"] > 0
    res = stages["resume"]
    assert res["resume_deterministic_true"]["ok"] and res["resume_deterministic_true"]["mode"] == "bitwise"
    assert res["resume_deterministic_false"]["ok"] and res["resume_deterministic_false"]["max_abs_diff"] == 0.0
    assert res["resume_deterministic_false"]["noise_floor"] == 0.0  # the second straight run, bitwise on CPU
    exp = stages["export_conformance"]
    # conformance ran on the export of the checkpoint trained in the resume stage; the runtimes the
    # GPU image lacks (onnxruntime-genai; Node, off PATH here) are skipped, not failed
    assert exp["conformance_exit_code"] in (0, 1) and exp["runtimes"] == []
    assert set(exp["runtimes_skipped"]) == {"onnxruntime-genai", "transformers.js"}
    variants = exp["conformance"]["variants"]
    assert variants["safetensors"] is True and variants["fp32"] is True and "int4" in variants
    # everything comes back in OUT: each subprocess's log tail, and one verdict line per item
    logs = (out / "logs.txt").read_text()
    assert "===== train_1: exit 2" in logs and "attention_backend = cudnn cannot run on cpu" in logs
    assert "===== conformance: exit" in logs
    verdict = (out / "verdict.txt").read_text().splitlines()
    assert verdict == report["verdict"] and all(v.split()[0] in ("PASS", "FAIL", "N/A") for v in verdict)
    assert verdict[2] == "PASS deterministic attention on CUDA: flash -> math"
    assert "PASS throughput" in verdict[3] and verdict[4].startswith("N/A  MFU")
    assert "PASS resume_deterministic_false: max rel diff 0.0e+00, bitwise" in verdict
    assert "PASS conformance safetensors: passed" in verdict and "PASS conformance fp32: passed" in verdict
    md = (out / "report.md").read_text()
    assert "## Throughput" in md and "## Profile" in md and "resume_deterministic_true" in md and "## Verdict" in md
