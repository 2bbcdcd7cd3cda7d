"""A replica's last words, read from a container's log as a person would (issue 32): the last
traceback's exception line, never a Keras progress bar; and the hint for a write a mounted
volume refused."""

from __future__ import annotations

import pathlib

import pytest

from tests.support import kubelet
from trainjob.core import lastwords, termination

LOGS = pathlib.Path(__file__).parents[1] / "corpus" / "logs"
PERMISSION_DENIED = "PermissionDeniedError: /train/checkpoint_temp; Permission denied [Op:SaveV2]"


def keras_log() -> bytes:
    """A real one: tf-keras 2.21 fit whose checkpoint was refused mid-epoch (see capture.py)."""
    return (LOGS / "keras-permission-denied.log").read_bytes()


def test_the_keras_progress_bar_fills_the_termination_message() -> None:
    """The reproduction: the kubelet's 2 KiB tail holds only the redrawn bar, which the cause
    used to quote (`68/70 [====>.] - ETA: 0s - loss: ...`); it is no cause now."""
    message = kubelet.termination_message_from_log(keras_log())
    assert "Traceback" not in message and "\r" in message and "\b" in message
    assert message.rsplit("\r", 1)[-1].startswith("68/70 [=====")
    assert termination.read(message).cause is None


def test_the_keras_logs_tail_gives_the_exception_not_the_bar() -> None:
    assert lastwords.last_exception(kubelet.log_output(keras_log(), 100)) == PERMISSION_DENIED
    # From as few lines as hold the traceback and the bar after it.
    assert lastwords.last_exception(kubelet.log_output(keras_log(), 13)) == PERMISSION_DENIED


def test_a_termination_message_with_the_traceback_then_a_bar_quotes_the_exception() -> None:
    message = (
        "Traceback (most recent call last):\n"
        '  File "/app/train.py", line 9, in <module>\n'
        "    model.fit(x, y)\n"
        "tensorflow.python.framework.errors_impl.PermissionDeniedError: /train/checkpoint; "
        "Permission denied\n"
        "\r 69/70 [============================>.] - ETA: 0s - loss: 1.6131\b\b\b\b\r"
        " 70/70 [==============================] - ETA: 0s - loss: 1.6003"
    )
    assert termination.read(message).cause == (
        "PermissionDeniedError: /train/checkpoint; Permission denied"
    )


def test_chained_exceptions_give_the_last_one() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/app/t.py", line 3, in load\n'
        "KeyError: 'images'\n"
        "\n"
        "During handling of the above exception, another exception occurred:\n"
        "\n"
        "Traceback (most recent call last):\n"
        '  File "/app/t.py", line 9, in <module>\n'
        "    raise ValueError('no images in the dataset')\n"
        "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
        "ValueError: no images in the dataset\n"
        "2026-11-27 01:02:03.123 I tensorflow/core/x.cc:1] shutting down\n"
    )
    assert lastwords.last_exception(log) == "ValueError: no images in the dataset"


def test_an_exception_without_a_message_and_lines_printed_between_frames() -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/app/t.py", line 3, in <module>\n'
        "Epoch 2/3\n"
        "    time.sleep(10)\n"
        "KeyboardInterrupt\n"
    )
    assert lastwords.last_exception(log) == "KeyboardInterrupt"


def test_a_tail_that_cut_off_the_traceback_header_still_names_the_error() -> None:
    log = (
        "    return fn(*args)\n"
        "tensorflow.python.framework.errors_impl.UnavailableError: Socket closed\n"
        "Done\n"
        "\x1b[1m12/70\x1b[0m \x1b[32m━━━━\x1b[0m\x1b[37m━━━━━━━━━━━━━━━━\x1b[0m 1s - loss: 2.3"
    )
    assert lastwords.last_exception(log) == "UnavailableError: Socket closed"


def test_no_exception_anywhere_is_none() -> None:
    assert lastwords.last_exception("Epoch 1/3\nloss: 0.3\nDone\n") is None
    assert lastwords.last_exception("") is None


def test_a_scripts_last_plain_line_is_still_its_cause() -> None:
    assert termination.read("starting\nerror: no data in /data\n").cause == (
        "error: no data in /data"
    )


@pytest.mark.parametrize(
    ("line", "short"),
    [
        ("tensorflow.python.framework.errors_impl.NotFoundError: x", "NotFoundError: x"),
        ("ValueError: a.b.c: d", "ValueError: a.b.c: d"),
        ("requests.exceptions.HTTPError", "HTTPError"),
        (
            "PermissionDeniedError: {{function_node __wrapped__SaveV2_dtypes_11_device_/job:"
            "localhost/replica:0/task:0/device:CPU:0}} /ckpt/x; Permission denied [Op:SaveV2]",
            "PermissionDeniedError: /ckpt/x; Permission denied [Op:SaveV2]",
        ),
    ],
)
def test_short_exception(line: str, short: str) -> None:
    assert lastwords.short_exception(line) == short


def test_is_exception_line() -> None:
    assert lastwords.is_exception_line("PermissionDeniedError: /train; Permission denied")
    assert not lastwords.is_exception_line("error: no data")
    assert not lastwords.is_exception_line(None)


@pytest.mark.parametrize(
    "cause",
    [
        PERMISSION_DENIED,
        "PermissionDeniedError: /train; Permission denied",
        "PermissionError: [Errno 13] Permission denied: '/train/model/ckpt-1.index'",
        "mkdir: cannot create directory '/train/run1': Permission denied",
    ],
)
def test_a_write_refused_under_a_mount_gets_the_fs_group_hint(cause: str) -> None:
    hint = lastwords.ownership_hint(cause, ("/data", "/train/"), "worker")
    assert hint is not None
    assert hint.startswith("/train is a volume the container's user may not write")
    assert "spec.replicaSpecs.worker.template.spec.securityContext.fsGroup" in hint


@pytest.mark.parametrize(
    "cause",
    [
        "PermissionError: [Errno 13] Permission denied: '/etc/passwd'",  # not a volume
        "PermissionError: [Errno 13] Permission denied: '/training/x'",  # beside one
        "FileNotFoundError: [Errno 2] No such file or directory: '/train/x'",  # not refused
        "PermissionDeniedError: {{function_node __wrapped__/job:localhost/train}} nothing",
    ],
)
def test_other_causes_get_no_hint(cause: str) -> None:
    assert lastwords.ownership_hint(cause, ("/train",), "worker") is None
