# Two entry points for a fresh machine: `make quickstart` and `make test`.
# Both create the virtual environment, install ltbench with its pinned torch/torchvision, and fetch
# Fashion-MNIST when it is missing; nothing needs to be installed by hand first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: setup data quickstart test clean-venv

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

data: setup
	PYTHON=$(BIN)/python scripts/get-fashion-mnist.sh

quickstart: setup data
	$(BIN)/ltbench run recipes/quickstart.yaml

test: setup data
	PYTHON=$(BIN)/python scripts/run-tests.sh

clean-venv:
	rm -rf $(VENV)
