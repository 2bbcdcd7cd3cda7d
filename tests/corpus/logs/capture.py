"""Write a program's stdout and stderr as containerd writes a container's log (the CRI format
the kubelet reads: `<RFC3339Nano time> <stream> <F|P> <content>`), so tests read what a real
node's log endpoint and termination message would hold.

As containerd (pkg/cri/io/logger.go) does: each stream is split into lines as they complete,
a line longer than 16 KiB becomes partial (`P`) entries of 16 KiB, and what is left without a
newline when the stream ends is one last `P` entry. Both streams go to one file in the order
their lines completed, so a Keras progress bar (carriage returns and backspaces, no newline)
lands after the traceback that ended the program, as on a real node.

    python tests/corpus/logs/capture.py OUT.log -- python train.py

keras-permission-denied.log was made with tests/corpus/logs/keras_permission_denied.py, run
with TF 2.21 / tf-keras 2.21 by a process that may not write /train (root without
CAP_DAC_OVERRIDE, /train owned by another user):

    setpriv --bounding-set -dac_override,-dac_read_search,-fowner \\
        --inh-caps -dac_override,-dac_read_search,-fowner -- \\
        .venv/bin/python tests/corpus/logs/capture.py \\
        tests/corpus/logs/keras-permission-denied.log \\
        -- .venv/bin/python tests/corpus/logs/keras_permission_denied.py
"""

from __future__ import annotations

import datetime
import os
import selectors
import subprocess
import sys
from typing import IO, Final

# containerd's max_container_log_line_size default.
MAX_LINE: Final = 16 * 1024


def stamp() -> str:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


class Stream:
    """One stream's bytes not yet written as a line."""

    def __init__(self, name: str, out: IO[bytes]) -> None:
        self.name = name
        self.out = out
        self.pending = b""

    def entry(self, tag: str, content: bytes) -> None:
        self.out.write(f"{stamp()} {self.name} {tag} ".encode() + content + b"\n")

    def feed(self, data: bytes) -> None:
        self.pending += data
        while True:
            line, newline, rest = self.pending.partition(b"\n")
            if len(line) > MAX_LINE:
                self.entry("P", line[:MAX_LINE])
                self.pending = self.pending[MAX_LINE:]
            elif newline:
                # bufio.Reader.ReadLine drops the "\r" of a "\r\n" ending too.
                self.entry("F", line.removesuffix(b"\r"))
                self.pending = rest
            else:
                return

    def close(self) -> None:
        if self.pending:
            self.entry("P", self.pending)
            self.pending = b""


def main(argv: list[str]) -> int:
    out_path, separator, *command = argv
    assert separator == "--", "usage: capture.py OUT.log -- COMMAND..."
    with open(out_path, "wb") as out:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert child.stdout is not None and child.stderr is not None
        streams = {
            child.stdout.fileno(): Stream("stdout", out),
            child.stderr.fileno(): Stream("stderr", out),
        }
        selector = selectors.DefaultSelector()
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            for key, _ in selector.select():
                data = os.read(key.fd, 65536)
                if data:
                    streams[key.fd].feed(data)
                else:
                    selector.unregister(key.fd)
                    streams[key.fd].close()
        return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
