"""Exit codes of a trainjob replica, and the pure classification of failures into them.

The ExitCode restart policy (:func:`trainjob.core.policy.retryable_exit_code`) reads a
replica's exit code: 1-127 means "permanent, do not retry" (a bug or a bad spec will fail the
same way again), >= 128 means "transient, recreate the replica" (a lost peer, a timed-out
collective, a preemption). So every failure the runtime can see is first named as a
:class:`FailureKind`, and each kind has exactly one exit code.

Everything here is pure: exceptions are classified by the *names* of their classes and by their
messages, so the rules are unit-tested with stand-in exception classes and without TensorFlow.

=====================  ====  ==========================================================
kind                   code  when
=====================  ====  ==========================================================
SUCCEEDED                0   training (or serving as ps/worker until stopped) ended well
USER_CODE_ERROR          1   the user's build()/model/dataset code raised
INVALID_CONFIG           2   TRAINJOB_* / TF_CONFIG / DTENSOR_* env or the user config is invalid
INVALID_ENTRYPOINT       3   TRAINJOB_ENTRYPOINT cannot be imported or is not callable
UNSUPPORTED              4   e.g. Estimator on TF >= 2.16, a strategy this TF cannot build
RESOURCE_EXHAUSTED       5   TF ran out of memory (retrying the same spec fails the same way)
NON_FINITE_LOSS          6   the training loss became NaN or +/-Inf (the model diverged: a retry
                             from the checkpoint diverges again); opt out with the config key
                             ``stop_on_nonfinite_loss: false``
CHECKPOINT_STORAGE       7   the checkpoint store refused: no such bucket, access denied,
                             credentials missing or wrong (a retry is refused the same way)
PEER_UNAVAILABLE       190   a peer task is unreachable / the collective group was aborted
COLLECTIVE_TIMEOUT     191   a collective or RPC passed its deadline
STORAGE_UNREACHABLE    192   the checkpoint store's endpoint cannot be reached (after the
                             client's own few bounded retries: it may be back for the next try)
PREEMPTED              143   SIGTERM (128 + 15, what Kubernetes reports for a TERM'd container)
=====================  ====  ==========================================================
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from typing import Final

from trainjob.core import constants


class FailureKind(enum.Enum):
    SUCCEEDED = "Succeeded"
    USER_CODE_ERROR = "UserCodeError"
    INVALID_CONFIG = "InvalidConfig"
    INVALID_ENTRYPOINT = "InvalidEntrypoint"
    UNSUPPORTED = "Unsupported"
    RESOURCE_EXHAUSTED = "ResourceExhausted"
    NON_FINITE_LOSS = "NonFiniteLoss"
    CHECKPOINT_STORAGE = "CheckpointStorage"
    STORAGE_UNREACHABLE = "StorageUnreachable"
    PEER_UNAVAILABLE = "PeerUnavailable"
    COLLECTIVE_TIMEOUT = "CollectiveTimeout"
    PREEMPTED = "Preempted"


EXIT_CODES: Final[Mapping[FailureKind, int]] = {
    FailureKind.SUCCEEDED: 0,
    FailureKind.USER_CODE_ERROR: 1,
    FailureKind.INVALID_CONFIG: 2,
    FailureKind.INVALID_ENTRYPOINT: 3,
    FailureKind.UNSUPPORTED: 4,
    FailureKind.RESOURCE_EXHAUSTED: 5,
    # The core's constants: the policy names a job's failure by them (reason NonFiniteLoss,
    # CheckpointStorageRefused, CheckpointStorageUnreachable).
    FailureKind.NON_FINITE_LOSS: constants.EXIT_CODE_NON_FINITE_LOSS,
    FailureKind.CHECKPOINT_STORAGE: constants.EXIT_CODE_CHECKPOINT_STORAGE,
    FailureKind.PEER_UNAVAILABLE: 190,
    FailureKind.COLLECTIVE_TIMEOUT: 191,
    FailureKind.STORAGE_UNREACHABLE: constants.EXIT_CODE_STORAGE_UNREACHABLE,
    FailureKind.PREEMPTED: 143,
}

# tf.errors classes (matched by name anywhere in the exception's MRO) that mean a peer or the
# network went away: another attempt of the same job can succeed.
_PEER_ERROR_CLASSES: Final = frozenset({"UnavailableError", "AbortedError", "CancelledError"})
_TIMEOUT_ERROR_CLASSES: Final = frozenset({"DeadlineExceededError"})
_RESOURCE_ERROR_CLASSES: Final = frozenset({"ResourceExhaustedError", "MemoryError"})

# Messages that TF wraps in InternalError / UnknownError / RuntimeError when a collective or the
# coordination service loses a peer (observed on TF 2.15 and 2.21).
_PEER_MESSAGE_MARKERS: Final = (
    "collective ops is aborted",
    "failed to connect",
    "connection reset",
    "socket closed",
    "connection refused",
    "unavailable",
    "heartbeat",
    "coordination service",
    "task has been disconnected",
    "the cluster has been shut down",
)
_TIMEOUT_MESSAGE_MARKERS: Final = ("deadline exceeded", "timed out", "timeout")

# Errors TF raises in graph code that are wrapped like transient errors but are user bugs.
_USER_TF_ERROR_CLASSES: Final = frozenset(
    {"InvalidArgumentError", "NotFoundError", "FailedPreconditionError", "OutOfRangeError"}
)
# ...except when the coordination service says its leader (task 0) restarted under this task:
# TF 2.21 raises that as InvalidArgumentError, and another attempt of the group succeeds.
_COORDINATION_RESTART_MARKERS: Final = (
    "must be registered before sending heartbeat",
    "the service might have restarted",
)


class Preempted(Exception):  # noqa: N818 - it is an event, not a bug
    """Raised inside the runtime when SIGTERM arrived; maps to :data:`FailureKind.PREEMPTED`."""


class NonFiniteLossError(ArithmeticError):
    """The training loss became NaN or +/-Inf; maps to ``NON_FINITE_LOSS``.

    Named ``...Error`` so local mode's log reader quotes its line as a failure's cause.
    """


class CheckpointStorageError(OSError):
    """The checkpoint store refused (no such bucket, access denied, bad credentials); maps to
    ``CHECKPOINT_STORAGE``. Its message is the whole cause, one line, never a secret."""


class StorageUnreachableError(CheckpointStorageError):
    """The checkpoint store's endpoint cannot be reached; maps to ``STORAGE_UNREACHABLE``."""


# Failures whose own line says everything: logged without a traceback.
VERDICTS: Final = frozenset(
    {FailureKind.NON_FINITE_LOSS, FailureKind.CHECKPOINT_STORAGE, FailureKind.STORAGE_UNREACHABLE}
)


class ConfigError(ValueError):
    """Invalid runtime configuration (env or user config); maps to ``INVALID_CONFIG``."""


class EntrypointError(ImportError):
    """TRAINJOB_ENTRYPOINT cannot be loaded; maps to ``INVALID_ENTRYPOINT``."""


class UnsupportedError(RuntimeError):
    """The requested mode cannot run on this TensorFlow; maps to ``UNSUPPORTED``."""


def exit_code(kind: FailureKind) -> int:
    return EXIT_CODES[kind]


def class_names(exc: BaseException) -> list[str]:
    """Names of the exception's classes, most specific first."""
    return [cls.__name__ for cls in type(exc).__mro__]


def _chain(exc: BaseException) -> Iterable[BaseException]:
    """The exception and its causes/contexts: TF and Keras often re-raise a wrapped error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def classify_names(names: Iterable[str], message: str) -> FailureKind | None:
    """Classify one exception from its class names and message; ``None`` if nothing specific."""
    name_set = set(names)
    lowered = message.lower()
    if "Preempted" in name_set or "KeyboardInterrupt" in name_set:
        return FailureKind.PREEMPTED
    if name_set & _RESOURCE_ERROR_CLASSES:
        return FailureKind.RESOURCE_EXHAUSTED
    if name_set & _TIMEOUT_ERROR_CLASSES:
        return FailureKind.COLLECTIVE_TIMEOUT
    if name_set & _PEER_ERROR_CLASSES:
        return FailureKind.PEER_UNAVAILABLE
    if name_set & _USER_TF_ERROR_CLASSES:
        if any(marker in lowered for marker in _COORDINATION_RESTART_MARKERS):
            return FailureKind.PEER_UNAVAILABLE
        return None
    if {"InternalError", "UnknownError", "RuntimeError"} & name_set:
        if any(marker in lowered for marker in _TIMEOUT_MESSAGE_MARKERS):
            return FailureKind.COLLECTIVE_TIMEOUT
        if any(marker in lowered for marker in _PEER_MESSAGE_MARKERS):
            return FailureKind.PEER_UNAVAILABLE
    return None


def classify_exception(exc: BaseException, *, default: FailureKind) -> FailureKind:
    """Classify an exception from the phase that raised it.

    ``default`` is the kind for the phase (``INVALID_ENTRYPOINT`` while importing user code,
    ``USER_CODE_ERROR`` while building or training): runtime-level exceptions and TF's
    transient errors override it wherever in the cause chain they appear.
    """
    for link in _chain(exc):
        if isinstance(link, NonFiniteLossError):
            return FailureKind.NON_FINITE_LOSS
        if isinstance(link, StorageUnreachableError):
            return FailureKind.STORAGE_UNREACHABLE
        if isinstance(link, CheckpointStorageError):
            return FailureKind.CHECKPOINT_STORAGE
        if isinstance(link, ConfigError):
            return FailureKind.INVALID_CONFIG
        if isinstance(link, EntrypointError):
            return FailureKind.INVALID_ENTRYPOINT
        if isinstance(link, UnsupportedError):
            return FailureKind.UNSUPPORTED
        kind = classify_names(class_names(link), str(link))
        if kind is not None:
            return kind
    return default


def classify_signal(signum: int) -> FailureKind:
    """A replica told to stop (SIGTERM/SIGINT) was preempted: retryable, never a failure."""
    del signum  # every stop signal the runtime handles means the same
    return FailureKind.PREEMPTED


def nonfinite_loss_message(value: float, *, step: int, epoch: int) -> str:
    """`loss became nan at step 57 (epoch 2)`: the cause a job that diverged quotes. ``step``
    counts completed steps, the bad one included; ``epoch`` is 0-based, as progress events."""
    return f"loss became {value!r} at step {step} (epoch {epoch})"


def check_loss(value: float, *, step: int, epoch: int) -> None:
    """Raise :class:`NonFiniteLossError` when ``value`` is NaN or +/-Inf."""
    if not math.isfinite(value):
        raise NonFiniteLossError(nonfinite_loss_message(value, step=step, epoch=epoch))
