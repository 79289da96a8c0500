"""Issue 22 item 2: the variant-parametrised suites take their variants from the table in
``prodip.base.variants``, so a new row is tested by them without editing a test.

The check runs pytest's own collection of the suites in a child process with a plugin that adds an
ONNX row (``int2``, never built: collection only) to the table, and asserts that every test id
parametrised with ``int4`` has an ``int2`` twin. A suite that lists its variants by hand fails it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prodip.base.variants import GENAI_ORDER, ONNX_VARIANTS, VARIANTS, Variant, variant_names

ROOT = Path(__file__).resolve().parents[2]
SUITES = (
    "tests/export/test_contract.py",
    "tests/export/test_onnx.py",
    "tests/export/test_runtime_configs.py",
    "tests/serve/test_batch_invariance.py",
)
PLUGIN = """
import prodip.base.variants as v

def pytest_configure(config):
    v.VARIANTS = (*v.VARIANTS, v.Variant("int2", "onnx/model_int2.onnx", "onnx", "int2", servable=True))
"""


def _collect(tmp_path: Path, plugin: bool) -> list[str]:
    (tmp_path / "extra_variant_row.py").write_text(PLUGIN, encoding="utf-8")
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *SUITES]
    if plugin:
        args[3:3] = ["-p", "extra_variant_row"]
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


@pytest.mark.slow  # two pytest collections in child processes: ~15 s
def test_a_new_variant_row_is_collected_by_every_variant_suite(tmp_path):
    plain, extended = _collect(tmp_path, plugin=False), _collect(tmp_path, plugin=True)
    with_int4 = [i for i in plain if "int4" in i]
    assert {i.split("::")[0] for i in with_int4} == set(SUITES)  # each suite is parametrised by variant
    assert not any("int2" in i for i in plain)
    for test_id in with_int4:
        assert test_id.replace("int4", "int2") in extended, f"{test_id}: no int2 twin when the table has an int2 row"
    assert len(extended) > len(plain)


def test_variant_names_filters_the_given_table():
    extra = Variant("int2", "onnx/model_int2.onnx", "onnx", "int2", servable=True)
    table = (*VARIANTS, extra)
    assert variant_names(format="onnx", table=table) == (*ONNX_VARIANTS, "int2")
    assert variant_names(format="onnx", servable=True) == ("fp32", "fp16", "int8", "int4")
    assert variant_names(format="gguf", servable=True) == ()
    assert variant_names() == tuple(v.name for v in VARIANTS)


def test_genai_order_is_narrowest_weights_first():
    assert GENAI_ORDER == ("int4", "int8", "fp16", "fp32")  # the smallest file the export has is the default
