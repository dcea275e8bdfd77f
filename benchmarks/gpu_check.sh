#!/usr/bin/env bash
# The GPU check for one CUDA machine (budget: 4 minutes on one H100/H200 with 16 cores): `benchmarks/gpu_check.sh OUTDIR`.
# Case list, budget and what each figure means: docs/gpu.md. In order, each part under its own time limit:
#  1. a CUDA subset of the tests, chosen for time (TESTS_S);
#  2. benchmarks/gpu_cases.py in one process per mode, eager (EAGER_S), inductor (INDUCTOR_S) and reduce-overhead
#     (GRAPHS_S): the bare loop with 1 and 3 views, CE, LA strong, BAPE+LA, a micro-batch case, the evaluation
#     check; compile seconds apart from throughput; launches and host waits per step from the profiler;
# then OUTDIR/gpu_check.json and OUTDIR/gpu_check.md (first line: GPU, torch, CUDA). A part that runs out of time
# keeps the cases it finished; the others are reported as not run. Without CUDA: one line, exit 2, nothing written.
# PYTHON picks the interpreter (python3). Inductor's caches are left where torch puts them: a second run is warmer,
# and says so (its compile seconds are those of a warm cache).
set -uo pipefail
out=${1:-}
if [ -z "$out" ]; then
  echo "usage: benchmarks/gpu_check.sh OUTDIR" >&2
  exit 2
fi
cd "$(dirname "$0")/.." || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
header=$("$py" -c 'import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA device here (torch.cuda.is_available() is False, torch " + torch.__version__ + "); run it on a GPU machine")
print(f"GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")') || exit 2
echo "$header"
mkdir -p "$out" || exit 2
started=$(date +%s)
tests=(tests/test_gpu_graphs.py tests/test_gpu.py::test_each_batched_pipeline_on_cuda_agrees_with_the_cpu
       "tests/test_gpu.py::test_batches_arrive_pinned_and_views_train_on_the_gpu[0]"
       tests/test_gpu.py::test_a_training_run_uses_the_gpu)
timeout "${TESTS_S:-45}" "$py" -m pytest -p no:cacheprovider -q -n 0 "${tests[@]}" > "$out/tests.txt" 2>&1
tests_rc=$?
echo "tests: exit $tests_rc ($(tail -n 1 "$out/tests.txt"))"

for part in "eager ${EAGER_S:-35}" "inductor ${INDUCTOR_S:-80}" "reduce-overhead ${GRAPHS_S:-70}"; do
  set -- $part
  timeout "$2" "$py" benchmarks/gpu_cases.py --mode "$1" --out "$out/cases_$1.json" > "$out/cases_$1.txt" 2>&1
  echo "cases $1: exit $? within ${2} s"
done

"$py" benchmarks/gpu_report.py "$out" "$header" "$tests_rc" "$started"
