"""The tests' port picker: every server a test starts gets a port of its own."""

from __future__ import annotations

from tests.support import ports


def test_free_ports_are_never_handed_out_twice_and_never_ephemeral() -> None:
    # bind(0) returned the same port for two consecutive asks 3 times in 20,000 pairs here,
    # and an operator died binding its liveness port onto its own metrics port.
    handed_out = [ports.free_port() for _ in range(2000)]
    assert len(set(handed_out)) == len(handed_out)
    ephemeral = ports.ephemeral_ports()
    assert not [port for port in handed_out if port in ephemeral]
