"""The tests' port picker: every server a test starts gets a port of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ports


def test_free_ports_are_never_handed_out_twice_and_never_ephemeral() -> None:
    # bind(0) returned the same port for two consecutive asks 3 times in 20,000 pairs here,
    # and an operator died binding its liveness port onto its own metrics port.
    handed_out = [ports.free_port() for _ in range(500)]
    assert len(set(handed_out)) == len(handed_out)
    ephemeral = ports.ephemeral_ports()
    assert not [port for port in handed_out if port in ephemeral]


PICKER = """
import random, sys
from tests.support import ports
random.seed(7)  # both processes try the same ports in the same order
print(" ".join(str(ports.free_port()) for _ in range(50)), flush=True)
sys.stdin.read()  # alive (its ports held) until the test closes its stdin
"""


def test_two_processes_never_hand_out_the_same_port() -> None:
    # The tests' processes pick from one range, and a port is bound only when its server
    # starts; two pytest-xdist workers picking the same port before either bound it failed a
    # TensorFlow server in CI. Both pickers here try the very same ports in the same order.
    pickers = [
        subprocess.Popen(
            [sys.executable, "-c", PICKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(Path(__file__).resolve().parents[2]),
        )
        for _ in range(2)
    ]
    try:
        picked = []
        for picker in pickers:
            assert picker.stdout is not None
            picked.append(set(picker.stdout.readline().split()))
    finally:
        for picker in pickers:
            assert picker.stdin is not None
            picker.stdin.close()
            picker.wait(timeout=30)
    assert len(picked[0]) == len(picked[1]) == 50
    assert not picked[0] & picked[1], sorted(picked[0] & picked[1])
