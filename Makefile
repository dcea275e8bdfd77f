# Two entry points for a fresh machine: `make quickstart` and `make test`.
# Both create the virtual environment, install ltbench with its pinned torch/torchvision, and fetch
# Fashion-MNIST when it is missing; nothing needs to be installed by hand first.
#
# On a GPU node whose own CUDA build of torch should stay (a cluster module, a conda env, a vendor image):
# `make setup TORCH=system` makes the venv with --system-site-packages and installs ltbench and its other
# dependencies without torch/torchvision (scripts/setup-system-torch.sh; docs/performance.md). It refuses
# when $(PYTHON) cannot import torch and torchvision. The venv remembers the choice: a later `make test`
# or `make quickstart` keeps the system torch, and the pinned set-up never overwrites it (nor the reverse).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= $(if $(wildcard $(VENV)/.installed-system),system,pinned)

ifeq ($(filter $(TORCH),pinned system),)
$(error TORCH=$(TORCH): expected TORCH=pinned (the default: torch and torchvision as pinned in pyproject.toml) or TORCH=system (keep the torch that $(PYTHON) imports))
endif

.PHONY: setup data quickstart test clean-venv

$(VENV)/.installed: pyproject.toml
	@test ! -e $(VENV)/.installed-system || { echo "make setup: $(VENV) keeps the system torch (made by make setup TORCH=system); installing the pinned torch there would replace it: run make clean-venv first, or use another folder (VENV=.venv-pinned)" >&2; exit 2; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade --quiet pip
	@echo "== make setup: ltbench, torch and the other dependencies into $(VENV) (about 6 GB; a few minutes, mostly the torch download); pip's lines follow"
	@start=$$(date +%s); $(BIN)/python -m pip install --progress-bar on -e ".[dev]" && \
	  echo "== make setup: installed in $$(( $$(date +%s) - start )) s"
	touch $@

$(VENV)/.installed-system: pyproject.toml scripts/setup-system-torch.sh
	PYTHON=$(PYTHON) VENV=$(VENV) scripts/setup-system-torch.sh
	touch $@

setup: $(VENV)/.installed$(if $(filter system,$(TORCH)),-system)

data: setup
	PYTHON=$(BIN)/python scripts/get-fashion-mnist.sh

quickstart: setup data
	$(BIN)/ltbench run recipes/quickstart.yaml
	@echo "Against the README's table (docs/claims.md: one seed each side cannot confirm a match; the line says how far it is and which numerics differ):"
	$(BIN)/ltbench verify recipes/quickstart.yaml --claims ltbench/claims/29-ltbench-readme-quickstart --format lines

test: setup data
	PYTHON=$(BIN)/python scripts/run-tests.sh

clean-venv:
	rm -rf $(VENV)
