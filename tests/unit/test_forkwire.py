"""The fork server's rules (`trainjob.core.forkwire`): which command lines it forks, what a
replica may differ in from the server, where the replica's PYTHONPATH goes on sys.path."""

from __future__ import annotations

import pytest

from trainjob.core import forkwire

PY = "/venv/bin/python"


@pytest.mark.parametrize(
    ("argv", "module"),
    [
        ([PY, "-m", "trainjob", "train"], "trainjob"),
        ([PY, "-m", "trainjob.runtime", "train"], "trainjob.runtime"),
        (["/other/python", "-m", "trainjob", "train"], None),  # another interpreter
        ([PY, "-m", "trainjob", "train", "--entrypoint=x:y"], None),  # flags: its own process
        ([PY, "-m", "trainjob", "data", "prepare"], None),
        ([PY, "-m", "mypkg", "train"], None),
        ([PY, "train.py"], None),
        ([], None),
    ],
)
def test_only_this_pythons_runtime_train_command_is_forked(
    argv: list[str], module: str | None
) -> None:
    assert forkwire.forkable_module(argv, PY) == module


def test_a_replica_may_differ_only_in_its_identity_and_pythonpath() -> None:
    server = {"TF_CONFIG": "a", "TRAINJOB_REPLICA_INDEX": "0", "PYTHONPATH": "/x", "HOME": "/h"}
    replica = {
        "TF_CONFIG": "b",
        "TRAINJOB_REPLICA_INDEX": "1",
        "DTENSOR_CLIENT_ID": "1",
        "PYTHONPATH": "/y:/x",
        "HOME": "/h",
    }
    assert forkwire.env_difference(server, replica) is None


@pytest.mark.parametrize(
    ("replica", "why"),
    [
        (
            {"HOME": "/h", "TF_ENABLE_ONEDNN_OPTS": "1"},
            "TF_ENABLE_ONEDNN_OPTS is set in the replica's environment only",
        ),
        ({}, "HOME is unset in the replica's environment"),
        ({"HOME": "/other"}, "HOME is different in the replica's environment"),
    ],
)
def test_anything_else_differing_is_named(replica: dict[str, str], why: str) -> None:
    assert forkwire.env_difference({"HOME": "/h"}, replica) == why


def test_the_replicas_pythonpath_replaces_the_servers_right_after_its_working_directory() -> None:
    sys_path = ["/srv-cwd", "/x", "/stdlib", "/site-packages"]
    assert forkwire.child_sys_path(sys_path, "/x", "/y:/x") == [
        "/srv-cwd",
        "/y",
        "/x",
        "/stdlib",
        "/site-packages",
    ]
    assert forkwire.child_sys_path(sys_path, "/x", None) == [
        "/srv-cwd",
        "/stdlib",
        "/site-packages",
    ]


def test_the_switch_is_on_unless_turned_off() -> None:
    assert forkwire.enabled({})
    assert forkwire.enabled({forkwire.SWITCH_ENV: "1"})
    for off in ("0", "false", "No", "off"):
        assert not forkwire.enabled({forkwire.SWITCH_ENV: off})


def test_messages_round_trip_and_garbage_reads_as_nothing() -> None:
    message = forkwire.request(3, ["a"], {"K": "v"}, "/d")
    assert forkwire.decode(forkwire.encode(message)) == message
    assert forkwire.decode(forkwire.encode(forkwire.started(3, 12))) == {"id": 3, "started": 12}
    assert forkwire.decode(forkwire.encode(forkwire.exited(7, -9))) == {
        "exited": 7,
        "returncode": -9,
    }
    assert forkwire.decode(b"\xff") == {}
    assert forkwire.decode(b"[1]") == {}
