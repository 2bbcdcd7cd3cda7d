"""Where `trainjob run` and `trainjob submit --follow` write: on a TTY, log lines scroll above a
live table redrawn in place; anything else gets plain lines. The only module that writes to the
terminal during a run (the view makes the text, this module puts it on the screen).

A closed window or a closed pipe does not end the run by itself: the terminal just stops
writing, and says whether the reader went away (`| head`), so the run can stop cleanly as a
shell tool would on SIGPIPE.
"""

from __future__ import annotations

import io
import os
import select
import shutil
import stat
import time
from collections.abc import Callable, Sequence
from typing import IO, Final, TextIO

from trainjob.console import view

REDRAW_SECONDS: Final = 0.5  # the live table refreshes at least this often on a TTY


def pipe_reader_gone(stream: IO[str]) -> bool:
    """Whether `stream` is a pipe whose reading end is closed (Linux reports POLLERR on the
    writing end then, without anything having to be written). Not a pipe: never gone."""
    try:
        fd = stream.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
    except (OSError, ValueError, io.UnsupportedOperation):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def terminal_size(stream: TextIO) -> tuple[int, int]:
    """(columns, rows) of the terminal behind `stream`; 80x24 when it cannot be asked."""
    try:
        size = os.get_terminal_size(stream.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        size = shutil.get_terminal_size()
    return size.columns or 80, size.lines or 24


class Terminal:
    """Log lines and the live table on one output stream."""

    def __init__(
        self,
        out: TextIO,
        *,
        tty: bool,
        color: bool,
        size: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.tty = tty
        self.color = color
        self._out = out
        self._size = size or (lambda: terminal_size(out))
        self._pending: list[str] = []
        self._drawn_widths: list[int] = []  # visible width of each table line last drawn
        # The rows known to be above the table on the window, and the visible width of each
        # line printed above it (log lines, blank rows; latest last): the rows a terminal made
        # narrower moves into its scrollback before any of the table's (view.headroom_rows).
        self._above_rows = 0
        self._above_widths: list[int] = []
        self._drawn_size: tuple[int, int] | None = None  # (columns, rows) at the last draw
        self._drawn_at = 0.0
        self._gone = False
        self.reader_gone = False  # the reader of our pipe went away (`| head`)

    def emit(self, text: str) -> None:
        """A line for the terminal; on a TTY it goes above the live table."""
        if self.tty:
            self._pending.append(text)
        else:
            self._write(text + "\n")

    def _write(self, text: str) -> None:
        """Write to the terminal; once it is gone (a closed window, a closed pipe) the run goes
        on without it (it is being stopped, or its logs and status are in the run dir)."""
        if self._gone:
            return
        try:
            self._out.write(text)
            self._out.flush()
        except BrokenPipeError:
            # `trainjob run ... | head`: the reader is gone. Stop as a shell tool would on
            # SIGPIPE, but cleanly: nothing may go on training unseen.
            self._gone = True
            self.reader_gone = True
        except OSError:  # EIO from a hung-up terminal (SIGHUP is on its way)
            self._gone = True

    def notice_reader_gone(self) -> bool:
        """Whether the reader went away. A reader that closed our pipe after taking
        everything we wrote (`| head -3` reads a whole chunk, so a fourth line may already be
        in it) leaves no write to fail: replicas that print nothing more would train on
        unseen. So the pipe itself is asked (once per loop)."""
        if not self._gone and not self.tty and pipe_reader_gone(self._out):
            self._gone = True
            self.reader_gone = True
        return self.reader_gone

    def draw(self, snapshot: Callable[[], view.Snapshot], force: bool = False) -> None:
        """Print the pending lines and redraw the table below them (on a TTY, at most every
        REDRAW_SECONDS unless there are lines or `force`)."""
        if not self.tty:
            return
        mono = time.monotonic()
        if not self._pending and not force and mono - self._drawn_at < REDRAW_SECONDS:
            return
        self._drawn_at = mono
        width, height = self._size()
        segments = view.table_segments(snapshot(), width=width, height=height)
        widths = [len(view.plain(line)) for line in segments]
        self._keep_headroom(widths, width, height)
        self._redraw(width, [view.render_segments(line, self.color) for line in segments])
        self._drawn_widths = widths
        self._drawn_size = (width, height)

    def _keep_headroom(self, widths: Sequence[int], width: int, height: int) -> None:
        """Print blank rows above the table about to be drawn where the rows above it would
        not take what a terminal made narrower moves into its scrollback."""
        if self._drawn_size is not None and self._drawn_size != (width, height):
            self._above_rows = view.rows_above_after_resize(
                self._above_rows,
                self._drawn_widths,
                self._above_widths,
                self._drawn_size,
                (width, height),
            )
        logs = [view.visible_width(line) for line in self._pending]
        rows_above = self._above_rows + view.drawn_height(logs, width)
        blanks = view.headroom_rows(rows_above, widths, width, height)
        self._pending.extend([""] * blanks)
        # Only a window's worth can be on the window.
        self._above_widths = [*self._above_widths, *logs, *[0] * blanks][-height:]
        self._above_rows = min(rows_above + blanks, max(0, height - 1 - len(widths)))

    def erase(self) -> None:
        """Remove the live table and print what is pending: the summary takes its place."""
        if not self.tty:
            return
        width, _ = self._size()
        self._redraw(width, [])
        self._drawn_widths = []

    def _redraw(self, width: int, lines: Sequence[str]) -> None:
        previous = view.drawn_height(self._drawn_widths, width)
        self._write(view.redraw(previous, lines, self._pending))
        self._pending = []
