"""A tmux server of a test's own (its own socket, no configuration file, so tmux's defaults:
`scroll-on-clear` on, lines re-wrapped when the window is resized), running one command in a
window of a given size, for tests that look at what a live view leaves on a real terminal: the
window, its scrollback, after resizes.

tmux must be installed (Debian: apt-get install -y tmux; `bash tests/controlplane/install.sh
--node-packages` installs it); `Tmux` raises `TmuxMissingError` saying so."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

DEADLINE_S = 30.0


class TmuxMissingError(RuntimeError):
    pass


class Tmux:
    """tmux with one session, `t`, whose window runs `command` in `cwd` with `env` added."""

    def __init__(
        self,
        socket_dir: Path,
        columns: int,
        rows: int,
        command: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
    ) -> None:
        found = shutil.which("tmux")
        if found is None:
            raise TmuxMissingError(
                "tmux is not installed (Debian: apt-get install -y tmux; `bash "
                "tests/controlplane/install.sh --node-packages` installs it as root)"
            )
        self.tmux = found
        self.socket = str(socket_dir / "tmux.sock")
        # new-session -x/-y fix the window's size (no client is attached to resize it).
        self.run(
            "new-session", "-d", "-s", "t", "-x", str(columns), "-y", str(rows), "-c", str(cwd),
            *[item for key, value in env.items() for item in ("-e", f"{key}={value}")],
            *command,
        )  # fmt: skip

    def run(self, *args: str) -> str:
        done = subprocess.run(
            [self.tmux, "-S", self.socket, "-f", "/dev/null", *args],
            capture_output=True,
            text=True,
            timeout=DEADLINE_S,
            check=True,
        )
        return done.stdout

    def history_size(self) -> int:
        return int(self.run("display-message", "-p", "-t", "t", "#{history_size}"))

    def history(self) -> list[str]:
        """The lines in the scrollback (above the window), each joined if tmux wrapped it."""
        if not self.history_size():
            return []
        return self.run("capture-pane", "-p", "-J", "-t", "t", "-S", "-", "-E", "-1").splitlines()

    def screen(self) -> list[str]:
        """The window's rows as shown (a wrapped line takes several)."""
        return self.run("capture-pane", "-p", "-t", "t").splitlines()

    def resize(self, columns: int, rows: int) -> None:
        self.run("resize-window", "-t", "t", "-x", str(columns), "-y", str(rows))

    def close(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.run("kill-server")


@contextlib.contextmanager
def running(
    socket_dir: Path,
    columns: int,
    rows: int,
    command: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
) -> Iterator[Tmux]:
    server = Tmux(socket_dir, columns, rows, command, cwd=cwd, env=env)
    try:
        yield server
    finally:
        server.close()
