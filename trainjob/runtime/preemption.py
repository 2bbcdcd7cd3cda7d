"""SIGTERM (preemption, or the executor stopping a replica) → exit 143, saving what can be saved.

TensorFlow's coordination service installs its own C++ SIGTERM handler (a preemption notifier)
that swallows the signal, so a plain Python handler or the default disposition is not enough:
measured on TF 2.15, an Estimator worker ignored SIGTERM for good. Instead the runtime blocks
SIGTERM in the main thread *before* TensorFlow starts any thread (threads inherit the mask), and
one watcher thread receives it with ``sigwait``. Then:

* while a Keras ``fit`` is running (:meth:`StopWatcher.cooperative`), the watcher only records
  the request; the runtime's callback saves a backup if it can and raises
  :class:`~trainjob.runtime.exitcodes.Preempted` at the next step boundary (exit 143). If that
  does not happen within the grace period (a step stuck in a collective), the watcher exits 143;
* otherwise (startup, Estimator) it exits 143 at once; ps/worker servers of a ParameterServer job
  wait ``exit_delay`` seconds first, because the variables live on the ps: when a whole job is
  preempted, the chief can still read them for its last backup.

Under MultiWorkerMirrored with several workers no process can save alone (a save reads synced
variables with collectives), so TF's ``PreemptionCheckpointHandler`` makes all workers save at
one agreed step: :func:`checkpoint_handler` builds it with a termination watcher that reads the
runtime's stop request (TF's default would install a Python SIGTERM handler, which never runs
while SIGTERM is blocked) and an exit function that raises ``Preempted`` (TF's default exits 42,
which the ExitCode policy would take for a permanent failure).

Processes that user code starts inherit the blocked mask: a child that must react to SIGTERM
itself should unblock it (``signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

from trainjob.runtime import exitcodes

STOP_SIGNALS: Final = (signal.SIGTERM,)
DEFAULT_GRACE_SECONDS: Final = 20.0


@dataclass
class StopRequest:
    signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None


def on_signal_action(cooperative: bool) -> str:
    """What the watcher does with a stop signal (pure): ``flag`` then wait, or ``exit`` now."""
    return "flag" if cooperative else "exit"


class StopWatcher:
    def __init__(
        self,
        on_exit: Callable[[int], None] | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
    ) -> None:
        self._on_exit = on_exit
        self._grace = grace_seconds
        self._request: StopRequest | None = None
        self._lock = threading.Lock()
        # Seconds to stay up after a stop signal outside training (see serve_until_stopped).
        self.exit_delay = 0.0

    def start(self) -> None:
        """Block the stop signals in this (main) thread and receive them in a watcher thread."""
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        threading.Thread(target=self._watch, name="trainjob-stop-watcher", daemon=True).start()

    @contextmanager
    def cooperative(self, request: StopRequest) -> Iterator[StopRequest]:
        """While inside, a stop signal only sets ``request`` (the training loop acts on it)."""
        with self._lock:
            self._request = request
        try:
            yield request
        finally:
            with self._lock:
                self._request = None

    def _watch(self) -> None:
        signum = signal.sigwait(STOP_SIGNALS)
        with self._lock:
            request = self._request
        if on_signal_action(request is not None) == "flag" and request is not None:
            request.signum = signum
            # Give the loop until the grace period ends to stop at a step boundary.
            threading.Event().wait(self._grace)
        elif self.exit_delay > 0:
            threading.Event().wait(self.exit_delay)
        self._exit(signum)

    def _exit(self, signum: int) -> None:
        code = exitcodes.exit_code(exitcodes.classify_signal(signum))
        if self._on_exit is not None:
            # Exiting anyway: a failing last progress line must not keep the process alive.
            with contextlib.suppress(Exception):
                self._on_exit(code)
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit: the main thread may be blocked in C++ (a server's join, a collective).
        os._exit(code)


# The threads of TF's handler that wait on the job's coordination service (hosted by the first
# worker or the chief): the peers' watcher blocks there for a save step, the poller writes this
# worker's stop request there.
HANDLER_THREAD_PREFIXES: Final = ("PeerTerminationWatcher-", "WorkerTerminationSignalWatcher-")
# What their calls raise once the service's host has ended (TF's own shutdown of the handler
# ignores the same errors, "some worker might have exited already").
LOST_SERVICE_ERRORS: Final = ("UnavailableError", "AbortedError", "CancelledError")


def is_lost_coordination(thread_name: str | None, error_type: type[BaseException]) -> bool:
    """Whether a thread's uncaught error is TF's handler finding the coordination service gone
    (pure): a consequence of a peer's end, never this replica's cause."""
    return (thread_name or "").startswith(HANDLER_THREAD_PREFIXES) and any(
        kind.__name__ in LOST_SERVICE_ERRORS for kind in error_type.__mro__
    )


def lost_coordination_line(thread_name: str | None, error: BaseException | None) -> str:
    """The one line a handler thread's lost coordination service is worth (pure)."""
    first = str(error).strip().splitlines()[0] if error is not None and str(error).strip() else ""
    reason = f"{type(error).__name__}: {first}" if first else type(error).__name__
    return (
        f"TensorFlow's preemption watcher ({thread_name}) stopped: the job's coordination "
        f"service is gone ({reason}), as when the worker hosting it has ended"
    )


def quiet_lost_coordination() -> None:
    """Turn a handler thread's lost coordination service into one log line.

    When the service's host ends first (every worker hits the same NaN and the first exits a
    moment sooner; a peer is killed), the watcher thread of every other worker dies with
    ``UnavailableError: Socket closed``, and Python prints the thread's traceback into the
    replica's log, under the line that says why the replica ended: a traceback that is no
    cause. Every other thread's error still goes to the hook that was there. Idempotent.
    """
    previous = threading.excepthook
    if getattr(previous, "trainjob_lost_coordination", False):
        return
    log = logging.getLogger(__name__)

    def hook(args: threading.ExceptHookArgs) -> None:
        name = args.thread.name if args.thread is not None else None
        if is_lost_coordination(name, args.exc_type):
            log.info(lost_coordination_line(name, args.exc_value))
            return
        previous(args)

    hook.trainjob_lost_coordination = True  # type: ignore[attr-defined]
    threading.excepthook = hook


def checkpoint_handler(
    tf: Any,
    cluster_resolver: Any,
    checkpoint_manager: Any,
    stop: StopRequest,
    *,
    exit_fn: Callable[[], None],
    save_fn: Callable[[], None] | None = None,
) -> Any:
    """TF's ``PreemptionCheckpointHandler`` driven by the runtime's stop request.

    The handler polls ``stop`` (about once a second), tells its peers through the coordination
    service, every worker saves at the agreed step (``save_fn``, else ``checkpoint_manager``)
    and then calls ``exit_fn``. A grace period of 0: save at the first agreed step.
    """
    config = tf.distribute.experimental.TerminationConfig(
        termination_watcher_fn=lambda: stop.requested,
        exit_fn=exit_fn,
        grace_period=0,
        save_fn=save_fn,
    )
    quiet_lost_coordination()  # before the handler starts its threads
    return tf.distribute.experimental.PreemptionCheckpointHandler(
        cluster_resolver, checkpoint_manager, termination_config=config
    )
