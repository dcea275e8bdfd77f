#!/usr/bin/env bash
# `make setup TORCH=system`: a virtual environment that keeps the torch this node already has.
#
# Why: on a GPU node torch usually comes with the node (a cluster module, a conda env, a vendor container),
# built for its driver and CUDA. `make setup` installs the exact pins of pyproject.toml (torch==2.14.1,
# torchvision==0.29.1) and would replace it. Here the venv sees the interpreter's own packages
# (--system-site-packages), ltbench is installed without its dependencies (--no-deps), and the other
# dependencies (pyproject.toml's, dev extras included, minus torch and torchvision) are installed with
# torch and torchvision held at the versions found, so pip can never swap them.
#
#   PYTHON=/path/to/python VENV=.venv scripts/setup-system-torch.sh   (what the Makefile runs)
#   scripts/setup-system-torch.sh --print-requirements                 (the list installed besides ltbench)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}

refuse() { echo "make setup TORCH=system: $*" >&2; exit 2; }

requirements() {  # pyproject.toml's dependencies and dev extras, without torch and torchvision
  "$1" - <<'PY'
import re
try:
    import tomllib
except ImportError:  # Python 3.10: the TOML reader pip ships
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
    name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")
    if name not in ("torch", "torchvision"):
        print(requirement)
PY
}

if [[ "${1:-}" == "--print-requirements" ]]; then
  requirements "$PYTHON"
  exit 0
fi

[[ ! -e "$VENV/.installed" ]] || refuse "$VENV holds ltbench with the pinned torch (made by make setup); run make clean-venv first, or use another folder: make setup TORCH=system VENV=.venv-system"
why=$("$PYTHON" -c 'import torch' 2>&1 | tail -n 1) || refuse "$PYTHON cannot import torch ($why): load the node's PyTorch first (a module, a conda env), or name its interpreter: make setup TORCH=system PYTHON=/path/to/python"
"$PYTHON" -c 'import torchvision' 2>/dev/null || refuse "$PYTHON imports torch $("$PYTHON" -c 'import torch; print(torch.__version__)') but not torchvision: install the torchvision built for that torch (pip install --no-deps torchvision==<its pair>), then run this again"
read -r torch_version vision_version cuda <<<"$("$PYTHON" -c 'import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.version.cuda or "none")')"

test -x "$VENV/bin/python" || "$PYTHON" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -c 'import torch' 2>/dev/null || refuse "$VENV does not see $PYTHON's torch (was $VENV made earlier without --system-site-packages? run make clean-venv first)"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
printf 'torch==%s\ntorchvision==%s\n' "$torch_version" "$vision_version" >"$constraints"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet --no-deps -e .
mapfile -t needed < <(requirements "$VENV/bin/python")
"$VENV/bin/python" -m pip install --quiet --constraint "$constraints" "${needed[@]}"

"$VENV/bin/python" -c 'import torch, torchvision, ltbench' || refuse "ltbench does not import in $VENV (see the error above)"
echo "ltbench set up in $VENV with the node's torch $torch_version (CUDA $cuda) and torchvision $vision_version"
if [[ "$torch_version" != 2.14.1* || "$vision_version" != 0.29.1* ]]; then
  echo "note: ltbench pins and tests torch 2.14.1 and torchvision 0.29.1; with these versions results can differ in the last bits from runs made with the pins (each result.json records the versions it ran with)"
fi
