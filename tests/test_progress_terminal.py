"""The progress display as a user sees it: `ltbench run --jobs 2` in a pseudo-terminal of 80 columns, its
output fed to a terminal emulator (pyte), the screen read at each state of the runs.

No timing: the runs use a plugin method that stops at named gates (while being built, at the start of
its second epoch, at its first prediction on the test set) and goes on only when the test creates the
gate's file, so the test sees each state as long as it needs to. Every wait polls with a generous bound.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, TINY, deep_update

pyte = pytest.importorskip("pyte", reason="pip install pyte (in the dev extras) reads the terminal's screen")

GATED = '''
import os
import time
from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F

from ltbench.method import Method
from ltbench.registry import METHODS


@dataclass
class GatedConfig:
    tag: str = ""  # names this run's gates
    gates: str = ""  # folder of the gate files


@METHODS.register("gated")
class Gated(Method):
    """Cross-entropy that stops at three gates: built, epoch 2 starts, first test prediction."""

    Config = GatedConfig

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.head = nn.Linear(ctx.feature_dim, ctx.num_classes)
        self.predictions = 0
        if not self.head.weight.is_meta:  # the launcher's memory estimate builds it on the meta device first
            self.wait("built")

    def wait(self, gate):
        base = os.path.join(self.cfg.gates, f"{gate}-{self.cfg.tag}")
        open(base + ".reached", "w").close()
        deadline = time.monotonic() + 600  # a forgotten gate never hangs the suite
        while not os.path.exists(base + ".go") and time.monotonic() < deadline:
            time.sleep(0.05)

    def on_epoch_start(self, epoch):
        if epoch == 1:
            self.wait("epoch2")

    def loss(self, features, labels, *, epoch):
        logits = self.head(features[0])
        return {"loss": F.cross_entropy(logits, labels), "logits": logits.detach()}

    def predict(self, features, *, target_prior=None):
        self.predictions += 1
        if self.predictions == 2:  # the first is the contract check at the first step
            self.wait("predict")
        return self.head(features)
'''

COLUMNS, ROWS = 80, 30
LONG_TAG = "a-long-option-value-that-makes-the-label-wider-than-the-terminal"
BOUND_S = 240  # generous: the machine may be shared; a wait that succeeds returns at once


def _as_a_terminal_session() -> None:
    """In the child: the pseudo-terminal becomes its controlling terminal, and Ctrl-C's SIGINT has its default
    action, as in a shell on a terminal. (A suite started in the background of a non-interactive shell,
    `make test &`, inherits SIGINT ignored, and so would the launcher: it would never see the Ctrl-C.)"""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """A process on the slave side of a pseudo-terminal (its controlling terminal, so ^C is SIGINT to its
    process group), and the screen a VT100 terminal of COLUMNS x ROWS would show."""

    def __init__(self, argv: list[str], cwd: Path, env: dict):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=env,
                                     start_new_session=True, preexec_fn=_as_a_terminal_session)
        os.close(slave)
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self.stream = pyte.ByteStream(self.screen)
        self.seen: list[str] = []  # every state of the screen, one text each

    def read(self, timeout: float = 0.2) -> None:
        """Everything the process has written so far; the screen is recorded once no more is pending
        (each redraw is one write, so a recorded screen is never a half-drawn one)."""
        got = False
        while select.select([self.master], [], [], timeout if not got else 0.02)[0]:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the process closed its side
                break
            if not data:
                break
            self.stream.feed(data)
            got = True
        if got:
            self.seen.append(self.text())

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display).rstrip("\n")

    def wait_for(self, predicate, what: str) -> str:
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            self.read()
            if predicate(self.text()):
                return self.text()
            if self.proc.poll() is not None:
                self.read(0)
                if predicate(self.text()):
                    return self.text()
                break
        raise AssertionError(f"never saw {what}; the screen:\n{self.text()}")

    def finish(self) -> int:
        deadline = time.monotonic() + BOUND_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.read()
        for _ in range(20):
            self.read(0.05)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the launcher did not exit; the screen:\n{self.text()}") from None


def wait_file(path: Path) -> None:
    deadline = time.monotonic() + BOUND_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never reached"
        time.sleep(0.05)


def logical_lines(text: str) -> list[str]:
    """The screen's lines with a message's continuation rows joined again: ltbench breaks a message longer
    than the terminal between words and indents the rest by two spaces (the terminal itself never wraps one:
    no row fills the last column); a state line is never longer than the terminal."""
    out: list[str] = []
    for row in text.splitlines():
        assert len(row) < COLUMNS, f"a row filled to the last column (wrapped by the terminal): {row!r}"
        if row.startswith("  ") and out:
            out[-1] += " " + row.strip()
        else:
            out.append(row)
    return out


def state_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^\[\d\] |^\d+/\d+ done", line)]


@pytest.mark.slow
def test_pool_progress_in_an_80_column_terminal(tmp_path):
    plugins, gates = tmp_path / "plugins", tmp_path / "gates"
    plugins.mkdir()
    gates.mkdir()
    (plugins / "gated.py").write_text(GATED)
    tags = [f"{LONG_TAG}-{i}" for i in range(3)]
    recipe = deep_update(TINY, {"results_dir": str(tmp_path / "results"), "plugins": ["./plugins"],
                                "method": {"name": "gated", "gates": str(gates)}, "train": {"progress": True},
                                "grid": {"method.tag": tags}})
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "TERM": "xterm", "COLUMNS": str(COLUMNS), "LINES": str(ROWS)}
    term = Terminal([sys.executable, "-m", "ltbench", "run", str(tmp_path / "tiny.yaml"), "--jobs", "2"], ROOT, env)
    try:
        _drive(term, gates, tags)
        code = term.finish()
    finally:
        if term.proc.poll() is None:
            os.killpg(term.proc.pid, signal.SIGKILL)
    final = term.text()
    assert code == 130, final
    assert "ltbench: interrupted; run the same command again to resume" in final
    assert re.search(r"^stopped 2 worker\(s\): \w+, \w+; their runs resume", final, re.M), final
    # Nothing garbled: every line left on the screen is one whole message (no state line, no '^C', no
    # fragment such as 'inished ...' or 'topped ...').
    starts = ("recipe tiny:", "started gated", "finished gated", "stopping 2 worker(s)", "stopped 2 worker(s)",
              "ltbench: interrupted")
    for line in filter(None, logical_lines(final)):
        assert line.startswith(starts), f"garbled line {line!r} in:\n{final}"
    for text in term.seen:  # at every moment: state lines fit 80 columns and end with their ETA
        for line in state_lines(text):
            assert len(line) < COLUMNS and re.search(r"ETA (\?|\d+:\d\d)$", line), f"{line!r} in:\n{text}"


def _drive(term: Terminal, gates: Path, tags: list[str]) -> None:
    """The states in order: starting -> epoch 1/2 -> evaluating -> a slot ends and takes the third run ->
    Ctrl-C while two runs are in flight."""
    for tag in tags[:2]:
        wait_file(gates / f"built-{tag}.reached")
    text = term.wait_for(lambda t: len([x for x in state_lines(t) if "starting (data, model)" in x]) == 2,
                         "two slots starting")
    assert re.search(r"^0/3 done · 2 running · 1 queued · grid ETA \?$", text, re.M), text
    for tag in tags[:2]:
        (gates / f"built-{tag}.go").touch()
    for tag in tags[:2]:
        wait_file(gates / f"epoch2-{tag}.reached")
    text = term.wait_for(lambda t: len([x for x in state_lines(t) if " epoch 1/2 " in x]) == 2, "epoch 1/2 twice")
    slot0 = next(x for x in state_lines(text) if x.startswith("[0] "))
    assert "gated (tag=a-long-option" in slot0 and "…" in slot0 and re.search(r"ETA \d+:\d\d$", slot0), slot0
    assert re.search(r"^0/3 done .*grid ETA \d+:\d\d$", text, re.M), text  # an estimate once epochs are timed
    (gates / f"epoch2-{tags[0]}.go").touch()
    wait_file(gates / f"predict-{tags[0]}.reached")
    text = term.wait_for(lambda t: any("evaluating test set 1/1" in x for x in state_lines(t)), "evaluating")
    (gates / f"predict-{tags[0]}.go").touch()
    wait_file(gates / f"built-{tags[2]}.reached")
    text = term.wait_for(lambda t: re.search(r"^finished gated .*: done, All \d+\.\d\d %$", "\n".join(logical_lines(t)), re.M)
                         and re.search(r"^1/3 done", t, re.M), "a slot ending")
    term.wait_for(lambda t: any(x.startswith("[0] ") and "starting" in x for x in state_lines(t)),
                  "the freed slot starting the third run")
    os.write(term.master, b"\x03")  # Ctrl-C: SIGINT to the launcher and its workers


def test_a_message_above_the_state_lines_is_broken_between_words_to_the_width():
    """Issue 40: a long line printed above the state lines (the Ctrl-C message, say) never wraps mid-word."""
    import io

    from ltbench.run.screen import Screen

    out = io.StringIO()
    screen = Screen(out)
    screen.size = lambda: (40, 24)
    screen.message("interrupted: stopping 2 worker(s); every run keeps its last checkpoint and resumes")
    lines = [line for line in out.getvalue().split("\n") if line.strip()]
    assert len(lines) > 1 and all(len(line.split("\x1b[J")[-1]) <= 39 for line in lines), lines
    assert "checkpoint" in out.getvalue() and "checkpo\n" not in out.getvalue()
