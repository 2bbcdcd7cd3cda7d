"""Exit codes of the trainjob runtime per failure kind (pure: no TensorFlow).

TF's error classes are matched by name, so stand-ins with the same names are enough here; the
training tier checks the same codes on real processes.
"""

from __future__ import annotations

import math
import signal

import pytest

from trainjob.core import policy
from trainjob.runtime import exitcodes, losscheck, preemption, reporter, settings
from trainjob.runtime.exitcodes import FailureKind


def _tf_error(name: str, message: str = "") -> Exception:
    """An exception whose class is named like tf.errors.<name> (subclass of OpError in TF)."""
    op_error = type("OpError", (Exception,), {})
    error_class: type[Exception] = type(name, (op_error,), {})
    return error_class(message)


PERMANENT = [
    (FailureKind.USER_CODE_ERROR, ValueError("bad shape in the user's model"), 1),
    (FailureKind.USER_CODE_ERROR, _tf_error("InvalidArgumentError", "logits and labels"), 1),
    (FailureKind.USER_CODE_ERROR, _tf_error("NotFoundError", "no such file: data"), 1),
    (FailureKind.INVALID_CONFIG, exitcodes.ConfigError("TRAINJOB_CONFIG is not JSON"), 2),
    (FailureKind.INVALID_ENTRYPOINT, exitcodes.EntrypointError("cannot import 'x'"), 3),
    (FailureKind.UNSUPPORTED, exitcodes.UnsupportedError("Estimator on TF 2.21"), 4),
    (FailureKind.RESOURCE_EXHAUSTED, _tf_error("ResourceExhaustedError", "OOM"), 5),
    (FailureKind.RESOURCE_EXHAUSTED, MemoryError(), 5),
    (FailureKind.NON_FINITE_LOSS, exitcodes.NonFiniteLossError("loss became nan at step 3"), 6),
]
TRANSIENT = [
    (FailureKind.PEER_UNAVAILABLE, _tf_error("UnavailableError", "Connection reset by peer"), 190),
    (FailureKind.PEER_UNAVAILABLE, _tf_error("AbortedError", "task restarted"), 190),
    (FailureKind.PEER_UNAVAILABLE, _tf_error("CancelledError", "cancelled"), 190),
    (
        FailureKind.PEER_UNAVAILABLE,
        _tf_error("InternalError", "Collective ops is aborted by: failed to connect"),
        190,
    ),
    (
        FailureKind.PEER_UNAVAILABLE,
        _tf_error("UnknownError", "Coordination service: task has been disconnected"),
        190,
    ),
    # The coordination service's leader (task 0) was replaced while this task trained: TF 2.21
    # raises it as InvalidArgumentError (seen in the e2e lost-node test, 2026-11-30, where it
    # failed the job as a user error under restartPolicy ExitCode).
    (
        FailureKind.PEER_UNAVAILABLE,
        _tf_error(
            "InvalidArgumentError",
            "{{function_node __wrapped__CollectiveReduceV2_Nordering_token_1_device_/job:worker/"
            "replica:0/task:1/device:CPU:0}} Collective ops is aborted by: Task with task_name="
            "/job:worker/replica:0/task:1 must be registered before sending heartbeat messages. "
            "The service might have restarted, please restart / reset and register again.",
        ),
        190,
    ),
    # A heartbeat timeout names a timeout: the timeout code (both are retryable).
    (FailureKind.COLLECTIVE_TIMEOUT, _tf_error("InternalError", "heartbeat timeout"), 191),
    (FailureKind.COLLECTIVE_TIMEOUT, _tf_error("DeadlineExceededError", "collective"), 191),
    (FailureKind.COLLECTIVE_TIMEOUT, RuntimeError("Collective timed out after 30 s"), 191),
    (FailureKind.PREEMPTED, exitcodes.Preempted("SIGTERM"), 143),
]


@pytest.mark.parametrize(
    ("kind", "exc", "code"),
    PERMANENT,
    ids=[f"{k.value}-{type(e).__name__}" for k, e, _ in PERMANENT],
)
def test_permanent_failures_exit_1_to_127(kind: FailureKind, exc: Exception, code: int) -> None:
    got = exitcodes.classify_exception(exc, default=FailureKind.USER_CODE_ERROR)
    assert got == kind
    assert exitcodes.exit_code(got) == code
    assert 1 <= code <= 127 and not policy.retryable_exit_code(code)


@pytest.mark.parametrize(
    ("kind", "exc", "code"),
    TRANSIENT,
    ids=[f"{k.value}-{type(e).__name__}" for k, e, _ in TRANSIENT],
)
def test_transient_failures_exit_128_or_more(kind: FailureKind, exc: Exception, code: int) -> None:
    got = exitcodes.classify_exception(exc, default=FailureKind.USER_CODE_ERROR)
    assert got == kind
    assert exitcodes.exit_code(got) == code
    assert policy.retryable_exit_code(code)


def test_transient_error_wrapped_by_user_code_is_still_transient() -> None:
    try:
        try:
            raise _tf_error("UnavailableError", "peer gone")
        except Exception as inner:
            raise RuntimeError("my training loop failed") from inner
    except RuntimeError as outer:
        assert (
            exitcodes.classify_exception(outer, default=FailureKind.USER_CODE_ERROR)
            == FailureKind.PEER_UNAVAILABLE
        )


def test_phase_default_applies_to_unknown_exceptions() -> None:
    exc = KeyError("x")
    assert (
        exitcodes.classify_exception(exc, default=FailureKind.INVALID_ENTRYPOINT)
        == FailureKind.INVALID_ENTRYPOINT
    )


def test_every_kind_has_a_distinct_code_and_success_is_zero() -> None:
    codes = [exitcodes.exit_code(kind) for kind in FailureKind]
    assert len(set(codes)) == len(codes)
    assert exitcodes.exit_code(FailureKind.SUCCEEDED) == 0


def test_sigterm_is_preemption_with_the_kubernetes_code() -> None:
    kind = exitcodes.classify_signal(signal.SIGTERM)
    assert exitcodes.exit_code(kind) == 128 + signal.SIGTERM


@pytest.mark.parametrize(
    ("value", "word"), [(math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")]
)
def test_a_nonfinite_loss_stops_with_its_own_line(value: float, word: str) -> None:
    with pytest.raises(exitcodes.NonFiniteLossError) as raised:
        exitcodes.check_loss(value, step=57, epoch=2)
    # The line the termination message carries and the Failed condition quotes.
    assert reporter.exception_line(raised.value) == (
        f"NonFiniteLossError: loss became {word} at step 57 (epoch 2)"
    )


@pytest.mark.parametrize("value", [0.0, 1e30, -3.5])
def test_a_finite_loss_passes(value: float) -> None:
    exitcodes.check_loss(value, step=1, epoch=0)  # raises nothing


def test_a_nonfinite_loss_wrapped_by_tf_or_user_code_keeps_its_kind() -> None:
    """Keras may re-raise a callback's error inside its own: the verdict is kept."""
    try:
        try:
            exitcodes.check_loss(math.nan, step=4, epoch=0)
        except exitcodes.NonFiniteLossError as inner:
            raise RuntimeError("fit failed") from inner
    except RuntimeError as outer:
        kind = exitcodes.classify_exception(outer, default=FailureKind.USER_CODE_ERROR)
    assert kind is FailureKind.NON_FINITE_LOSS
    assert exitcodes.exit_code(kind) == 6


def test_the_policy_names_the_same_code_the_runtime_exits_with() -> None:
    code = exitcodes.exit_code(FailureKind.NON_FINITE_LOSS)
    assert code == policy.EXIT_CODE_NON_FINITE_LOSS
    assert FailureKind.NON_FINITE_LOSS.value == policy.REASON_NON_FINITE_LOSS
    assert not policy.retryable_exit_code(code)


def test_the_loss_check_is_on_by_default_and_the_config_turns_it_off() -> None:
    assert settings.stop_on_nonfinite_loss({}) is True
    assert settings.stop_on_nonfinite_loss({"stop_on_nonfinite_loss": False}) is False
    with pytest.raises(exitcodes.ConfigError, match="stop_on_nonfinite_loss must be true or"):
        settings.stop_on_nonfinite_loss({"stop_on_nonfinite_loss": "no"})


def test_a_bad_opt_out_value_is_rejected_with_the_rest_of_the_config() -> None:
    env = {
        "TRAINJOB_ENTRYPOINT": "pkg.train:build",
        "TRAINJOB_CONFIG": '{"stop_on_nonfinite_loss": 0}',
    }
    with pytest.raises(exitcodes.ConfigError, match="stop_on_nonfinite_loss"):
        settings.from_env(env)


def test_keras_checks_each_step_except_under_parameter_server() -> None:
    check = losscheck.loss_check_for
    assert check({}, parameter_server=False) is losscheck.LossCheck.EVERY_STEP
    # The coordinator would wait for each step: checked where logs are fetched anyway.
    assert check({}, parameter_server=True) is losscheck.LossCheck.FETCHED
    off = {"stop_on_nonfinite_loss": False}
    assert check(off, parameter_server=False) is losscheck.LossCheck.OFF
    assert check(off, parameter_server=True) is losscheck.LossCheck.OFF


def test_the_lagged_check_names_the_nan_step_when_the_next_step_ends() -> None:
    lagged = losscheck.LaggedLossCheck()
    lagged.push(0.5, step=6, epoch=1)
    lagged.push(math.nan, step=7, epoch=1)  # step 6 checked: finite
    with pytest.raises(exitcodes.NonFiniteLossError, match=r"at step 7 \(epoch 1\)$"):
        lagged.push(0.5, step=8, epoch=1)


def test_logs_without_a_loss_keep_nothing() -> None:
    lagged = losscheck.LaggedLossCheck()
    lagged.push(None, step=1, epoch=0)
    lagged.flush()  # nothing to check, nothing raised


def test_the_lagged_check_raises_on_flush_and_then_holds_nothing() -> None:
    lagged = losscheck.LaggedLossCheck()
    lagged.push(math.inf, step=10, epoch=0)
    with pytest.raises(exitcodes.NonFiniteLossError, match="loss became inf at step 10"):
        lagged.flush()
    lagged.flush()  # emptied: nothing raised twice


class UnavailableError(Exception):
    """Named as TensorFlow's ``tf.errors.UnavailableError`` (its subclasses count too)."""


class SocketClosedError(UnavailableError):
    pass


@pytest.mark.parametrize(
    ("thread", "error", "quiet"),
    [
        ("PeerTerminationWatcher-1", UnavailableError, True),
        ("WorkerTerminationSignalWatcher-0", SocketClosedError, True),
        # The same error in any other thread is someone's bug: its traceback stays.
        ("Thread-3 (train)", UnavailableError, False),
        (None, UnavailableError, False),
        # Another error in the watcher is TF's or the runtime's bug: its traceback stays.
        ("PeerTerminationWatcher-1", ValueError, False),
    ],
)
def test_only_a_preemption_watcher_losing_the_coordination_service_is_quieted(
    thread: str | None, error: type[BaseException], quiet: bool
) -> None:
    assert preemption.is_lost_coordination(thread, error) is quiet


def test_a_lost_coordination_service_is_one_line_naming_the_thread_and_the_error() -> None:
    error = UnavailableError("Socket closed\nAdditional GRPC error information from ...")
    line = preemption.lost_coordination_line("PeerTerminationWatcher-1", error)
    assert line == (
        "TensorFlow's preemption watcher (PeerTerminationWatcher-1) stopped: the job's "
        "coordination service is gone (UnavailableError: Socket closed), as when the worker "
        "hosting it has ended"
    )
