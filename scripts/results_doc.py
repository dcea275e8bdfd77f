"""Build docs/results.md from docs/results.template.md: every table and figure comes from a command.

In the template, a line ``<!-- run: ltbench table ... -->`` is replaced by the command itself and
its output; ``<!-- run: ltbench plot ... --out docs/figures -->`` by the command and the PNG it
wrote. Nothing in the tables is typed by hand, and ``--check`` fails when docs/results.md differs
from what the commands print now (tests/test_results_doc.py runs it).

    python scripts/results_doc.py           # rewrite docs/results.md (and the figures)
    python scripts/results_doc.py --check   # exit 1 if the tables in docs/results.md are stale
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE, OUTPUT = ROOT / "docs" / "results.template.md", ROOT / "docs" / "results.md"
MARKER = re.compile(r"^<!-- run: (ltbench .+?) -->$")


def run_ltbench(command: str) -> str:
    from ltbench.cli import main

    argv = shlex.split(command)[1:]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"'{command}' exited with {code}")
    return out.getvalue().rstrip("\n")


def expand(template: str, figures: bool = True) -> str:
    lines = []
    for line in template.splitlines():
        m = MARKER.match(line.strip())
        if not m:
            lines.append(line)
            continue
        command = m.group(1)
        lines += [f"`{command}`", ""]
        if shlex.split(command)[1] == "plot":
            words = shlex.split(command)
            kind, out = words[words.index("--kind") + 1], Path(words[words.index("--out") + 1])
            written = run_ltbench(command).splitlines() if figures else []
            pngs = [Path(p) for p in written if p.endswith(".png")] or sorted(out.glob(f"{kind}*.png"))
            lines += [f"![{p.stem}]({p.relative_to('docs').as_posix()})" for p in pngs]
        else:
            lines.append(run_ltbench(command).replace("### ", "#### "))
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/results.md, write nothing")
    args = parser.parse_args()
    import os

    os.chdir(ROOT)
    text = expand(TEMPLATE.read_text(), figures=not args.check)
    if args.check:
        if text != OUTPUT.read_text():
            print("docs/results.md is stale: run python scripts/results_doc.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
