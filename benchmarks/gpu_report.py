"""The GPU check's report: OUTDIR/cases_<mode>.json (benchmarks/gpu_cases.py) into OUTDIR/gpu_check.json and
OUTDIR/gpu_check.md, one row per case and mode. A case a part did not reach (its time limit) or that failed is
said so in its row, never left out.

    python benchmarks/gpu_report.py OUTDIR HEADER TESTS_EXIT STARTED_EPOCH_S
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

MODES = ("eager", "inductor", "reduce-overhead")
CASES = ("bare_1", "bare_3", "ce", "la_strong", "bape_la", "ce_micro", "eval_check")
BARE_OF = {"ce": "bare_1", "la_strong": "bare_1", "ce_micro": "bare_1", "bape_la": "bare_3"}


def load(out: Path) -> dict:
    modes = {}
    for mode in MODES:
        path = out / f"cases_{mode}.json"
        try:
            modes[mode] = json.loads(path.read_text())["cases"]
        except (OSError, ValueError, KeyError):
            modes[mode] = None
    return modes


def rows(modes: dict) -> list[dict]:
    """One row per (case, mode): img/s, ratios to the bare loop in the same mode (measured alongside) and to the
    eager bare loop (from the eager part), compile seconds, launches and host waits per step."""
    table = []
    for case in CASES:
        if case == "eval_check":
            continue
        for mode in MODES:
            got = (modes[mode] or {}).get(case)
            row = {"case": case, "mode": mode}
            if got is None:
                row["status"] = "not run" if modes[mode] is not None else "part not run"
            elif "error" in got or "refused" in got or "skipped" in got:
                row["status"] = got.get("error") or ("refused at load" if got.get("refused") else "not refused")
            else:
                bare = BARE_OF.get(case, case)
                eager_bare = ((modes["eager"] or {}).get(bare) or {}).get("images_per_s")
                row.update({k: got.get(k) for k in ("views", "images_per_s", "compile_s", "launches_per_step",
                                                    "graph_replays_per_step", "host_waits_per_step")})
                row["ratio_same_mode"] = got.get("ratio_same_mode", 1.0 if case.startswith("bare_") else None)
                row["ratio_eager_bare"] = round(got["images_per_s"] / eager_bare, 3) if eager_bare else None
                row["status"] = "measured"
            table.append(row)
    return table


def cell(value, fmt: str = "") -> str:
    return "-" if value is None else format(value, fmt)


def markdown(header: str, report: dict) -> str:
    lines = [header, "", f"tests (CUDA subset): exit {report['tests_exit']}; {report['seconds']} s in all", "",
             "| case | mode | img/s | ratio to bare, same mode | ratio to eager bare | compile s | launches/step "
             "| graph replays/step | host waits/step | status |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        lines.append(f"| {r['case']} | {r['mode']} | {cell(r.get('images_per_s'), '.0f')} | "
                     f"{cell(r.get('ratio_same_mode'), '.2f')} | {cell(r.get('ratio_eager_bare'), '.2f')} | "
                     f"{cell(r.get('compile_s'))} | {cell(r.get('launches_per_step'))} | "
                     f"{cell(r.get('graph_replays_per_step'))} | {cell(r.get('host_waits_per_step'))} | {r['status']} |")
    lines += ["", "Evaluation check (test features through the compiled backbone against the eager one):"]
    for mode, check in report["eval_check"].items():
        lines.append(f"- {mode}: " + (json.dumps(check) if check is not None else "not run"))
    lines += ["", "ratio to bare, same mode: img/s over the bare loop's with as many views, compiled in the same mode, "
              "measured alternately in the same process; ratio to eager bare: over the eager part's bare loop "
              "(another process, minutes apart). compile s: the first steps less as many steady ones. "
              "launches and host waits: torch.profiler's CUDA runtime calls per step."]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    out, header, tests_exit, started = Path(argv[0]), argv[1], int(argv[2]), int(argv[3])
    modes = load(out)
    report = {"header": header, "seconds": round(time.time() - started), "tests_exit": tests_exit,
              "rows": rows(modes),
              "eval_check": {m: (modes[m] or {}).get("eval_check") for m in ("inductor", "reduce-overhead")},
              "parts_run": [m for m in MODES if modes[m] is not None]}
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    text = markdown(header, report)
    (out / "gpu_check.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
