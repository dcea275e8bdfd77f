#!/usr/bin/env bash
# The test command behind `make test` (and so .ci/run): pdflatex and chromium when they can be installed, the whole suite, then the Slurm tests
# against a real one-node cluster when this machine can run one (root with apt-get). The cluster is
# brought down afterwards even when tests fail.
set -uo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
cd "$(dirname "$0")/.."

# The LaTeX tables are compiled by a test when pdflatex exists; install it where this machine can.
# LTBENCH_SKIP_LATEX=1 skips the install (the compile tests then skip); LTBENCH_SKIP_SLURM=1 skips the Slurm part.
if [[ -z "${LTBENCH_SKIP_LATEX:-}" ]] && ! command -v pdflatex >/dev/null && [[ $(id -u) -eq 0 ]] \
    && command -v apt-get >/dev/null; then
  echo "== installing pdflatex (texlive-latex-base, texlive-latex-recommended) for the LaTeX table test"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q texlive-latex-base \
      texlive-latex-recommended >/dev/null 2>&1; then
    apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q texlive-latex-base \
      texlive-latex-recommended >/dev/null 2>&1 || echo "== pdflatex could not be installed: the LaTeX test will skip"
  fi
fi

# report.html is opened in a real headless browser by a test when chromium exists; install it the same way.
# LTBENCH_SKIP_BROWSER=1 skips the install (the browser test then skips).
if [[ -z "${LTBENCH_SKIP_BROWSER:-}" ]] && ! command -v chromium >/dev/null && [[ $(id -u) -eq 0 ]] \
    && command -v apt-get >/dev/null; then
  echo "== installing chromium for the report.html browser test"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1; then
    apt-get update -q >/dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null 2>&1 \
      || echo "== chromium could not be installed: the browser test will skip"
  fi
fi

# The suite runs in one pytest worker per usable core (pytest-xdist), at most 4: its tests mostly wait on
# subprocesses that each import torch, single-threaded, so a 2-core machine takes about half the time
# (README: the figures). No test depends on timing or on sharing a process with another test.
# LTBENCH_TEST_WORKERS=N sets the count (1: one worker; 0: no xdist at all, one process as before).
cores=$(nproc 2>/dev/null || echo 1)  # the cores this process may run on (its affinity mask, as Slurm or taskset set it)
workers=${LTBENCH_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}
parallel=()
[[ $workers -gt 0 ]] && parallel=(-n "$workers")

"$PYTHON" -m pytest -q -m "not slurm" "${parallel[@]}" "$@"
status=$?

if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null && [[ -z "${LTBENCH_SKIP_SLURM:-}" ]]; then
  echo "== Slurm tests: bringing up a one-node cluster (scripts/slurm-local.sh)"
  # its own state folder, never a fixed name in the shared temporary folder; removed afterwards
  export LTBENCH_SLURM_DIR=${LTBENCH_SLURM_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ltbench-slurm.XXXXXX")}
  if conf=$(scripts/slurm-local.sh up); then
    trap 'scripts/slurm-local.sh down --purge >/dev/null 2>&1 || true' EXIT
    eval "$conf"
    export SLURM_CONF
    "$PYTHON" -m pytest -q -m slurm "$@"
    slurm_status=$?
    [[ $slurm_status -eq 5 ]] && slurm_status=0  # no slurm test collected under a -k filter
    [[ $status -eq 0 ]] && status=$slurm_status
  else
    echo "== Slurm tests FAILED: the local cluster did not come up" >&2
    [[ $status -eq 0 ]] && status=1
  fi
else
  echo "== Slurm tests SKIPPED: they need root and apt-get to start a local cluster (or LTBENCH_SKIP_SLURM is set)"
fi
exit $status
