# prodip: the two commands of the README, plus the developer habits (make lint, make test-fast).
#   make demo   installs what it needs, then runs the whole pipeline on the bundled corpus (2-core CPU: about 13 min)
#   make test   installs what it needs, then runs the test suite
# Everything goes into a virtual environment (.venv). On a machine without an NVIDIA GPU the CPU
# build of torch is installed (PyTorch's CPU wheel index, or a local wheel that pip already knows);
# with a GPU, torch comes from PyPI the standard way (CUDA build).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_CPU_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
CONFIG ?= configs/demo.toml
PYTEST_ARGS ?=
# The on-device runtimes the tokenizer parity check and conformance run: pip extra "runtimes"
# (onnxruntime-genai, gguf, pytorch-tokenizers) and the Node packages pinned in node/ (transformers.js,
# node-llama-cpp's prebuilt llama.cpp; ~1.2 GB, npm needs no build step). RUNTIMES=0 skips them (the
# parity check and conformance then list those runtimes as skipped).
RUNTIMES ?= 1

.PHONY: install demo test test-fast lint clean gpu-bench gpu-bench-dry

# One GPU window, one call: `python3 bench/gpu/bench.py "$OUT"` (make is not needed, and may be absent
# there); run with the machine's own python3, nothing installed. The report (report.json, report.md,
# bench.log, logs.txt, verdict.txt) goes to $(OUT), e.g. the device tool's $OUT.
OUT ?= /tmp/prodip_gpu_bench
GPU_PYTHON ?= python3
gpu-bench:
	$(GPU_PYTHON) bench/gpu/bench.py $(OUT) $(GPU_BENCH_ARGS)

# the same stages on CPU with a tiny model (tests/bench/test_gpu_bench.py runs it too)
gpu-bench-dry: install
	$(BIN)/python bench/gpu/bench.py --dry $(OUT)_dry

$(BIN)/.installed: pyproject.toml node/package.json node/package-lock.json
	$(PYTHON) -m venv $(VENV)
	@if $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "torch already installed in $(VENV)"; \
	elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "NVIDIA GPU found: installing CUDA torch from PyPI"; \
		$(BIN)/python -m pip install torch; \
	else \
		echo "no NVIDIA GPU: installing the CPU build of torch $(TORCH_CPU_VERSION)"; \
		$(BIN)/python -m pip install --retries 1 "torch==$(TORCH_CPU_VERSION)" --extra-index-url $(TORCH_CPU_INDEX); \
	fi
	@if [ "$(RUNTIMES)" = 1 ]; then \
		$(BIN)/python -m pip install -e ".[train,test,runtimes]"; \
		if command -v npm >/dev/null 2>&1; then npm install --ignore-scripts --no-audit --no-fund --prefix node; \
		else echo "npm not found: the Node runtimes (transformers.js, llama.cpp) will be skipped"; fi; \
	else \
		$(BIN)/python -m pip install -e ".[train,test]"; \
	fi
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/prodip run $(CONFIG)

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=900 tests $(PYTEST_ARGS)

# the fast tier: every test not marked slow
test-fast: install
	$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=300 -m "not slow" tests $(PYTEST_ARGS)

# ruff (lint + format check), then the import contracts of pyproject.toml's [tool.importlinter]
# checked on a regular (non-editable) install, where the stage folders sit inside prodip/ as
# they do for users.
LINT_DIR := build/lint
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(LINT_DIR) && $(BIN)/python -m pip install -q --no-deps --target $(LINT_DIR) .
	cd $(LINT_DIR) && PYTHONPATH=. $(CURDIR)/$(BIN)/lint-imports $(CURDIR)/pyproject.toml
	$(BIN)/python .ci/mypy_gate.py  # mypy: prodip.base and prodip.serve strict, the rest at most .ci/mypy-baseline.json

clean:
	rm -rf $(VENV) runs build *.egg-info node/node_modules
