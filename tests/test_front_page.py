"""The README is a front page (issue 40): at most 120 lines, the two commands unchanged, the sections a new user
needs; everything else is in docs/, each document reachable from docs/README.md, and no link of either is broken."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def test_the_readme_is_a_front_page_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    assert "make quickstart   # venv + ltbench + Fashion-MNIST" in text and "make test         # venv" in text
    for heading in ("## Two commands on a fresh machine", "## What the quickstart prints", "## Write your own method",
                    "## No ImageNet? Run the headline recipe on a generated tree", "## Commands"):
        assert heading in text
    assert "ltbench check my_methods" in text and "docs/README.md" in text


def test_every_document_is_reachable_from_the_index_and_no_link_is_broken():
    index = (ROOT / "docs" / "README.md").read_text()
    linked = {m.group(1) for m in LINK.finditer(index)}
    documents = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md", "results.template.md"}
    assert documents - linked == set()
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for m in LINK.finditer(page.read_text()):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)}: broken link {target}"


# ------------------------------------------------------------------------------------------------
# Every shell block of the README, run (issue 51). Which blocks run, and how:
#   make quickstart / make test   not run here: they install the venv and train for minutes (.ci runs make test)
#   the plugin block              run as printed, with 'optim.epochs=1 optim.warmup_epochs=0 data.max_per_class=100' added to its
#                                 'ltbench run' (real Fashion-MNIST; skipped when it is not on this machine)
#   No ImageNet?                  run exactly as printed, in a folder of the test's own
#   Commands                      each line parsed by ltbench's own argument parser (RECIPE and RESULTS are
#                                 placeholders, so they cannot run as printed)

BLOCK = re.compile(r"```(bash|python)\n(.*?)```", re.S)


def readme_blocks() -> list[tuple[str, str]]:
    return BLOCK.findall((ROOT / "README.md").read_text())


def block_with(text: str) -> str:
    found = [body for kind, body in readme_blocks() if kind == "bash" and text in body]
    assert len(found) == 1, f"one README block holds {text!r}"
    return found[0]


def run_block(body: str, cwd: Path, timeout: float = 900):
    """A README block in bash -e, in ``cwd``, where recipes/, scripts/ and .venv are the checkout's (as in a clone)."""
    import os
    import subprocess
    import sys

    for name in ("recipes", "scripts"):
        (cwd / name).symlink_to(ROOT / name)
    (cwd / ".venv").symlink_to(Path(sys.prefix))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-e", "-c", body], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_readme_blocks_are_the_ones_this_file_runs():
    kinds = [kind for kind, _ in readme_blocks()]
    assert kinds == ["bash", "python", "bash", "bash", "bash"], "a block was added: run it below, or say why not"
    assert "/tmp/" not in (ROOT / "README.md").read_text()  # no fixed name in the shared temporary folder


def test_the_commands_block_parses_line_by_line(tmp_path):
    from ltbench import cli

    for line in block_with("ltbench status RECIPE").splitlines():
        command = line.split("#")[0].split()
        if not command or command[0] != "ltbench":
            continue
        args = [w.replace("RECIPE", "r.yaml").replace("RESULTS/NAME", "results/r").replace("RESULTS", "results")
                for w in command[1:] if w not in ("[key=value", "...]", "[NAME", "--options]", "[--dry-run]")]
        args = [w.replace("[", "").replace("]", "").split("|")[0] for w in args]
        cli.parse_args(args)  # an option the parser does not know exits 2 here


@pytest.mark.slow  # trains two ResNet-50 runs on 48 generated images (about 1 min idle, 4 min at load 11)
def test_the_no_imagenet_block_runs_as_printed(tmp_path):
    done = run_block(block_with("make_imagenet_lt.py"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 done" in done.stdout or "2 run(s)" in done.stdout
    table = done.stdout.split("ImageNet-LT with ResNet-50 by shot group")[-1]
    assert "| CE " in table and "| LA " in table and "1/1" in table


@pytest.mark.slow  # checks the plugin and trains two one-epoch runs on real Fashion-MNIST
def test_the_plugin_block_runs_as_printed_with_one_epoch(tmp_path):
    from ltbench.data import fashion_mnist
    from ltbench.errors import LtbenchError

    try:
        fashion_mnist.locate(None)
    except LtbenchError:
        pytest.skip("real Fashion-MNIST is not on this machine (make data fetches it)")
    plugin = next(body for kind, body in readme_blocks() if kind == "python")
    (tmp_path / "my_methods").mkdir()
    (tmp_path / "my_methods" / "focal.py").write_text(plugin)
    body = block_with("ltbench check my_methods")
    run_line = next(line for line in body.splitlines() if "ltbench run recipes/quickstart.yaml" in line)
    done = run_block(body.replace(run_line, run_line + " optim.epochs=1 optim.warmup_epochs=0 data.max_per_class=100"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 of 1 plugin(s) pass the contract" in done.stdout
    assert "| Focal" in done.stdout and "| CE" in done.stdout
