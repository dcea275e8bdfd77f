"""The one writer of the terminal while a launch shows progress: status lines at the bottom, redrawn in
place, and messages printed above them.

Why one writer: with several (tqdm bars at fixed positions, print() from the launcher, the terminal's
own '^C' echo) each moves the cursor under the others, and lines come out cut and interleaved ('f' /
'inished cosine ...'). Here every line a launch prints while its status lines are shown goes through
``Screen.message``, which erases the status lines, prints the message, and draws them again. Each status
line is cut to the terminal's width less one column, so none wraps and the redraw always knows how many
rows to go back up; lines that need cutting are fitted by ``fit`` so the part that matters (the ETA)
stays. Only ANSI cursor-up and erase-below are used (any terminal since the VT100).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
import textwrap
import threading
import unicodedata

CSI = "\x1b["
ELLIPSIS = "…"
VERBOSE_ENV = "LTBENCH_VERBOSE"  # 'ltbench run --verbose' sets it: its workers inherit it


def epoch_lines(tty: bool) -> bool:
    """Whether each epoch gets a line: on a terminal (redrawn in place), or with --verbose; a log file gets
    each run's start, phases and end, not one line per epoch (128 for the quickstart)."""
    return tty or os.environ.get(VERBOSE_ENV) == "1"


def columns(text: str) -> int:
    """Terminal columns ``text`` takes: wide East Asian characters count two, combining marks none."""
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def truncate(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, ending in '…' when cut."""
    if columns(text) <= width:
        return text
    out, used = [], 0
    for c in text:
        if used + columns(c) > width - 1:
            break
        out.append(c)
        used += columns(c)
    return "".join(out) + ELLIPSIS if width >= 1 else ""


KEEP = 9  # a part of this priority or more is never dropped by fit()


def broken(text: str, width: int) -> str:
    """``text`` with each line broken between words to ``width`` less one column, continuations indented by
    two spaces: the terminal never wraps a line mid-word (a path too long for a line is cut at the width)."""
    width = max(width - 1, 20)
    return "".join(wrapped + "\n" for line in text.rstrip("\n").split("\n")
                   for wrapped in (textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False) or [""]))


def say(text: str = "", file=None) -> None:
    """print() for what a launch writes outside its status lines: on a terminal, broken between words to its
    width (``broken``); elsewhere (a file, a pipe) as it is."""
    file = file or sys.stdout
    if file.isatty():
        text = broken(text, shutil.get_terminal_size().columns)[:-1]
    print(text, file=file, flush=True)


MARKUP = re.compile(r"\*\*(.+?)\*\*|<u>(.+?)</u>")


def for_terminal(markdown: str) -> str:
    """A markdown table for a terminal: bold (``**x**``) and underline (``<u>x</u>``) as ANSI bold and
    underline, the columns kept aligned (the markup's characters become spaces after the cell's text)."""
    def styled(m: re.Match) -> str:
        inner, code = (m.group(1), "1") if m.group(1) is not None else (m.group(2), "4")
        return f"{CSI}{code}m{inner}{CSI}0m" + " " * (len(m.group(0)) - len(inner))
    return MARKUP.sub(styled, markdown)


def fit(head: str, parts: list[tuple[str, int]], tail: str, width: int) -> str:
    """``head`` + the parts + ``tail`` in ``width`` columns. ``tail`` (the ETA) is never cut; parts are
    dropped lowest priority first (ties: the later one; priority KEEP or more: never); then ``head`` (the
    run's label) is shortened, and only then what is left of the parts."""
    kept = list(parts)

    def body(h: str) -> str:
        return " ".join(x for x in [h, *(text for text, _ in kept)] if x)

    def whole(h: str) -> str:
        return " ".join(x for x in [body(h), tail] if x)

    while columns(whole(head)) > width and any(p < KEEP for _, p in kept):
        lowest = min(p for _, p in kept)
        kept.pop(max(i for i, (_, p) in enumerate(kept) if p == lowest))
    if columns(whole(head)) <= width:
        return whole(head)
    room = width - columns(tail) - (1 if tail else 0)  # columns for the head and the parts
    rest = columns(body("")) + (1 if head and kept else 0)
    if head and room - rest >= 4:
        return whole(truncate(head, room - rest))
    return truncate(body(head), room) + " " + tail if room > 0 else truncate(tail, width)


class Screen:
    """Owns a terminal: ``update(lines)`` sets the status lines, ``message(text)`` prints above them,
    ``close()`` erases them. Thread-safe (a poller thread draws while the main thread prints)."""

    def __init__(self, out, width: int | None = None, height: int | None = None):
        self.out = out
        self.fixed = (width, height)
        self.lock = threading.RLock()
        self.status: list[str] = []
        self.drawn = 0  # status rows on the terminal now, just above the cursor

    def size(self) -> tuple[int, int]:
        """(columns, rows) of the terminal now (it may be resized while a grid runs)."""
        try:
            real = os.get_terminal_size(self.out.fileno())
            width, height = real.columns, real.lines
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            width, height = 80, 24
        return self.fixed[0] or width or 80, self.fixed[1] or height or 24

    def update(self, lines: list[str]) -> None:
        with self.lock:
            self.status = list(lines)
            self._redraw(None)

    def message(self, text: str) -> None:
        """``text`` above the status lines, broken between words to the terminal's width (``broken``)."""
        with self.lock:
            self._redraw(broken(text, self.size()[0]))

    def close(self) -> None:
        with self.lock:
            self.status = []
            self._redraw(None)

    def _redraw(self, message: str | None) -> None:
        """Erase the status rows, print ``message``, draw the status lines: one write, and the count of rows
        on the terminal changes only once it is done (a Ctrl-C before it leaves the count true)."""
        rows, frame = self._frame()
        erase = "\r" + (f"{CSI}{self.drawn}A" if self.drawn else "") + f"{CSI}J"  # back to the first status row
        self._write(erase + (message or "") + frame)
        self.drawn = rows

    def _frame(self) -> tuple[int, str]:
        """(rows, text) of the status lines, each cut to the width less one column (none wraps)."""
        width, height = self.size()
        lines = self.status
        if len(lines) > height - 1:  # taller than the terminal: cursor-up could not come back
            lines = lines[: max(height - 2, 0)] + [f"… and {len(lines) - max(height - 2, 0)} more"]
        return len(lines), "".join(truncate(line, width - 1) + "\n" for line in lines)

    def _write(self, text: str) -> None:
        """One write to the terminal per redraw: a line-buffered stream would flush at every newline, and
        a frame that reaches the terminal in pieces is what a reader sees half-drawn."""
        buffer = getattr(self.out, "buffer", None)
        if buffer is None:
            self.out.write(text)
            self.out.flush()
            return
        self.out.flush()
        buffer.write(text.encode(getattr(self.out, "encoding", None) or "utf-8", "replace"))
        buffer.flush()


class MessageStream(io.TextIOBase):
    """Stands in for sys.stdout / sys.stderr while a Screen owns the terminal: whatever the process prints
    (a plugin's print, a warning) becomes a message above the status lines, one per line. Not a tty, so
    the engine's own tqdm bar stays off (``engine.progress_bar``): one writer."""

    def __init__(self, screen: Screen):
        super().__init__()
        self.screen, self.pending = screen, ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        self.pending += text
        while "\n" in self.pending:
            line, self.pending = self.pending.split("\n", 1)
            self.screen.message(line.replace("\r", ""))
        return len(text)

    def flush(self) -> None:
        pass

    def close_line(self) -> None:
        if self.pending:
            self.screen.message(self.pending)
            self.pending = ""
