#!/usr/bin/env bash
# The GPU check, ready to run on one CUDA machine in under 5 minutes: `benchmarks/gpu_check.sh OUTDIR`.
#  1. `pytest -m gpu` (the CUDA path's verdict: CUDA = CPU for the batched views, the side-stream feeder,
#     compile, channels_last, nvJPEG decoding);
#  2. benchmarks/gpu_throughput.py for CE, LA strong and BAPE+LA (ResNet-32, CIFAR-100-format data,
#     augment_on: batch), ltbench eager and with train.compile: inductor, each side by side with the bare
#     loop in the same process;
# then writes OUTDIR/gpu_check.json and OUTDIR/gpu_check.md. Its first line names the GPU, torch and CUDA.
# Without CUDA it stops at once (exit 2): there is nothing to check. PYTHON picks the interpreter (python3).
# Time limits per part (PYTEST_S, EAGER_S, COMPILED_S seconds) keep the whole under 5 minutes; a part that
# runs out is reported as such in the outputs, not silently dropped.
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

timeout "${PYTEST_S:-100}" "$py" -m pytest -p no:cacheprovider -q -n 0 -m gpu tests/ > "$out/pytest_gpu.txt" 2>&1
pytest_rc=$?
echo "pytest -m gpu: exit $pytest_rc ($(tail -n 1 "$out/pytest_gpu.txt"))"

throughput() {  # $1: eager|compiled, $2: train.compile value, $3: seconds
  timeout "$3" "$py" benchmarks/gpu_throughput.py --device cuda --augment-on batch --epochs 3 \
    --settings cifar_ce cifar_la_strong cifar_bape_la --compile "$2" --json "$out/throughput_$1.json" \
    > "$out/throughput_$1.txt" 2>&1
  echo "throughput $1: exit $? ($(tail -n 2 "$out/throughput_$1.txt" | head -n 1))"
}
throughput eager off "${EAGER_S:-70}"
throughput compiled inductor "${COMPILED_S:-110}"

"$py" - "$out" "$header" "$pytest_rc" "$started" <<'PY'
import json, sys, time
from pathlib import Path

out, header, pytest_rc, started = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
modes = {}
for mode in ("eager", "compiled"):
    path = out / f"throughput_{mode}.json"
    modes[mode] = json.loads(path.read_text()) if path.exists() else None
report = {"header": header, "seconds": round(time.time() - started),
          "pytest_gpu": {"exit": pytest_rc, "last_line": (out / "pytest_gpu.txt").read_text().strip().splitlines()[-1:]},
          "throughput": modes}
(out / "gpu_check.json").write_text(json.dumps(report, indent=1))
rows = {m: {r["setting"]: r for r in (d or {}).get("rows", [])} for m, d in modes.items()}
lines = [header, "",
         f"`pytest -m gpu`: exit {pytest_rc} ({' '.join(report['pytest_gpu']['last_line'])}); {report['seconds']} s in all", "",
         "| setting | views | bare img/s (eager run) | ltbench eager img/s | ratio | bare img/s (compiled run) | ltbench compiled img/s | ratio |",
         "|---|---|---|---|---|---|---|---|"]
for setting in ("cifar_ce", "cifar_la_strong", "cifar_bape_la"):
    e, c = rows["eager"].get(setting), rows["compiled"].get(setting)
    cell = lambda r, k, f: format(r[k], f) if r else "not run"
    views = (e or c or {}).get("views", "?")
    lines.append(f"| {setting} | {views} | {cell(e, 'bare_images_per_s', '.0f')} | {cell(e, 'ltbench_images_per_s', '.0f')} | "
                 f"{cell(e, 'ratio', '.2f')} | {cell(c, 'bare_images_per_s', '.0f')} | {cell(c, 'ltbench_images_per_s', '.0f')} | "
                 f"{cell(c, 'ratio', '.2f')} |")
lines += ["", "ratio: ltbench img/s over the bare loop's in the same process (bare loop eager, data on the GPU); "
          "not run: the part ran out of time or failed (its .txt in this folder says which)"]
(out / "gpu_check.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
