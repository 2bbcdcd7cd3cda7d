"""Progress reporting to the operator: a background sender and the tracker that makes reports.

Standard library only and no TensorFlow, so a bring-your-own training script can use it too::

    from trainjob.runtime import reporter

    progress = reporter.ProgressReporter.from_env(total_steps=1000, total_epochs=10)
    for step in range(1, 1001):
        loss = train_step()
        progress.step(step, loss=loss, epoch=1 + (step - 1) // 100)
    progress.finish("Succeeded")

Outside a TrainJob Pod (no ``TRAINJOB_PROGRESS_URL``) nothing is sent and every call is cheap.

The reporting replica's reports carry the devices it trains on once it knows them
(``Tracker.update(devices=...)``); every other replica sends one report of its devices when it
starts (:func:`announce`), so the job's status shows every replica's.

Guarantees, because reporting must never cost training anything:
- ``tick``/``step``/``update`` only store numbers; building a report and every network call
  happen on one daemon thread, at most every ``interval`` seconds, plus right away (but not
  more than once per ``MIN_GAP``) for epoch ends and the final report.
- Nothing here raises into the caller. An unreachable or refusing operator costs log lines
  (at most one a minute); the latest report waits for the next try, older ones are dropped.
- The token is read from its file at every send (the kubelet rotates it), the CA file when it
  changes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import ssl
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Final

from trainjob.core import constants, termination
from trainjob.core import progress as core_progress
from trainjob.runtime import exitcodes

log = logging.getLogger("trainjob.progress")

DEFAULT_INTERVAL: Final = 5.0
# Epoch ends and the final report go at once, but never closer together than this.
MIN_GAP: Final = 1.0
REQUEST_TIMEOUT: Final = 5.0
# How long `finish` waits for the final report to go out before the process exits.
FINISH_TIMEOUT: Final = 5.0
# How long a replica's one report of its devices is retried (429, 503) in the background.
ANNOUNCE_TIMEOUT: Final = 60.0
LOG_EVERY: Final = 60.0
# Answers that the same report would get again: the final report is not retried after them.
PERMANENT_REFUSALS: Final = (400, 401, 403, 404, 413, 415)


class Tracker:
    """The numbers of the latest report. ``tick`` is lock-free (one tuple assignment) so that
    a training loop can call it every step; everything else takes the lock."""

    def __init__(
        self,
        replica: str | None = None,
        *,
        total_epochs: int | None = None,
        total_steps: int | None = None,
        steps_per_epoch: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.replica = replica
        self.total_epochs = total_epochs
        self.steps_per_epoch = steps_per_epoch
        if total_steps is None:
            total_steps = core_progress.steps_in(total_epochs, steps_per_epoch)
        self.total_steps = total_steps
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._tick: tuple[int, float] | None = None
        self._timer = core_progress.StepTimer()
        self._epoch: int | None = None
        self._loss: float | None = None
        self._metrics: dict[str, float] = {}
        self._rate: float | None = None
        self._checkpoint: str | None = None
        self._state = core_progress.STATE_RUNNING
        self._devices: core_progress.Devices | None = None

    def plan(
        self,
        *,
        total_epochs: int | None = None,
        total_steps: int | None = None,
        steps_per_epoch: int | None = None,
    ) -> None:
        """Totals learnt once training starts (Keras `fit` knows its own)."""
        with self._lock:
            self.total_epochs = total_epochs or self.total_epochs
            self.steps_per_epoch = steps_per_epoch or self.steps_per_epoch
            planned = total_steps or core_progress.steps_in(self.total_epochs, self.steps_per_epoch)
            if planned:
                self.total_steps = planned

    def tick(self, step: int) -> None:
        self._tick = (step, self._clock())

    def update(
        self,
        *,
        step: int | None = None,
        epoch: int | None = None,
        loss: float | None = None,
        metrics: Mapping[str, Any] | None = None,
        examples_per_second: float | None = None,
        checkpoint: str | None = None,
        state: str | None = None,
        devices: core_progress.Devices | None = None,
    ) -> None:
        """New numbers (None: unchanged). `epoch` counts from 1."""
        if step is not None:
            self.tick(step)
        with self._lock:
            if epoch is not None:
                self._epoch = epoch
            if loss is not None:
                self._loss = loss
            if metrics:
                self._metrics = {k: v for k, v in _numbers(metrics).items() if k != "loss"}
            if examples_per_second is not None:
                self._rate = examples_per_second
            if checkpoint is not None:
                self._checkpoint = checkpoint
            if state is not None:
                self._state = state
            if devices is not None:
                self._devices = devices

    def restart_timer(self) -> None:
        """Training (re)started: the step times of a previous attempt say nothing now."""
        with self._lock:
            self._timer = core_progress.StepTimer()
            self._tick = None

    def report(self) -> core_progress.Report:
        with self._lock:
            tick = self._tick
            step = None
            if tick is not None:
                step = tick[0]
                self._timer = self._timer.observe(step, tick[1])
            epoch = self._epoch
            if step is not None and self.steps_per_epoch:
                epoch = core_progress.epoch_at(
                    step, self.steps_per_epoch, reported=epoch, total_epochs=self.total_epochs
                )
            return core_progress.Report(
                replica=self.replica,
                state=self._state,
                epoch=epoch,
                total_epochs=self.total_epochs,
                step=step,
                total_steps=self.total_steps,
                loss=self._loss,
                metrics=dict(list(self._metrics.items())[: core_progress.MAX_METRICS]),
                examples_per_second=self._rate,
                last_checkpoint=self._checkpoint,
                eta_seconds=self._timer.eta(step, self.total_steps),
                time=round(self._wall(), 3),
                devices=self._devices,
            )


def _numbers(values: Mapping[str, Any]) -> dict[str, float]:
    result: dict[str, float] = {}
    for key, value in values.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            result[str(key)[: core_progress.MAX_NAME]] = number
    return result


def retry_after(value: str | None, default: float) -> float:
    """Seconds from a Retry-After header (delta seconds; dates are not used by our server)."""
    try:
        return max(0.0, float(value)) if value else default
    except ValueError:
        return default


class Sender:
    """POSTs the latest report from a daemon thread (see the module docstring)."""

    def __init__(
        self,
        url: str,
        token_file: str | None,
        ca_file: str | None,
        report: Callable[[], core_progress.Report],
        interval: float = DEFAULT_INTERVAL,
        *,
        start: bool = True,
    ) -> None:
        self.url = url
        self.token_file = token_file
        self.ca_file = ca_file
        self.interval = max(interval, MIN_GAP)
        self.finish_timeout = FINISH_TIMEOUT
        self._report = report
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._urgent = False
        self._context: ssl.SSLContext | None = None
        self._ca_stamp: float | None = None
        self._logged_at = -LOG_EVERY
        self.sent = 0
        self.last_status: int | None = None
        self._final_sent = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainjob-progress", daemon=True)
        if start:
            self._thread.start()

    def urgent(self) -> None:
        """Send soon (an epoch ended, or the final report): within MIN_GAP of the last send."""
        self._urgent = True
        self._wake.set()

    def finish(self) -> bool:
        """Send the final report now and wait for it (at most `finish_timeout`); True if it
        went."""
        self._stop.set()
        self._wake.set()
        self._thread.join(self.finish_timeout + REQUEST_TIMEOUT)
        return self._final_sent.is_set()

    def _run(self) -> None:
        # The first report goes at once: the job shows that training started.
        next_at = earliest = time.monotonic()
        while True:
            if self._stop.is_set():
                if self._send_final():
                    self._final_sent.set()
                return
            now = time.monotonic()
            # Due at the interval; an urgent report (epoch end) as soon as the gap after the
            # last send (or the server's Retry-After) allows.
            due = max(earliest, now) if self._urgent else next_at
            if now < due:
                self._wake.wait(due - now)
                self._wake.clear()
                continue
            self._urgent = False
            delay = self._send_once()
            sent_at = time.monotonic()
            earliest = sent_at + max(MIN_GAP, delay)
            next_at = sent_at + max(self.interval, delay)

    def send_one(self) -> bool:
        """Send the report once, retried like the final report; True if it was accepted. For
        a Sender made with ``start=False`` (no thread of its own)."""
        return self._send_final()

    def _send_final(self) -> bool:
        """The final report, retried (network trouble, 429, 503) for `finish_timeout`."""
        deadline = time.monotonic() + self.finish_timeout
        while True:
            delay = self._send_once()
            if self.last_status is not None and 200 <= self.last_status < 300:
                return True
            if self.last_status in PERMANENT_REFUSALS:
                return False
            wait = delay or 0.5
            if time.monotonic() + wait > deadline:
                return False
            time.sleep(wait)

    def _send_once(self) -> float:
        """One POST of the latest report; returns how long the server asked us to wait (0:
        the usual interval). Never raises."""
        try:
            body = json.dumps(core_progress.to_wire(self._report()), separators=(",", ":"))
            request = urllib.request.Request(
                self.url, data=body.encode(), method="POST", headers=self._headers()
            )
            with urllib.request.urlopen(  # the URL is the operator's (https)
                request, timeout=REQUEST_TIMEOUT, context=self._ssl()
            ) as response:
                self.last_status = response.status
                self.sent += 1
                return 0.0
        except urllib.error.HTTPError as exc:
            self.last_status = exc.code
            detail = exc.read(512).decode("utf-8", "replace")
            if exc.code in (429, 503):
                wait = retry_after(exc.headers.get("Retry-After"), self.interval)
                self._log(f"the operator asked to wait {wait:g}s ({exc.code})")
                return wait
            self._log(f"the operator refused a progress report: {exc.code} {detail}")
        except Exception as exc:  # reporting must never raise into training
            self.last_status = None
            self._log(f"could not report progress to {self.url}: {exc}")
        return 0.0

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "User-Agent": "trainjob-runtime"}
        if self.token_file:
            with open(self.token_file, encoding="utf-8") as handle:
                headers["Authorization"] = "Bearer " + handle.read().strip()
        return headers

    def _ssl(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https:"):
            return None
        stamp = os.stat(self.ca_file).st_mtime if self.ca_file else None
        if self._context is None or stamp != self._ca_stamp:
            self._context = ssl.create_default_context(cafile=self.ca_file)
            self._ca_stamp = stamp
        return self._context

    def _log(self, message: str) -> None:
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY:
            self._logged_at = now
            log.warning(
                "%s (training goes on; next such line in %ds at the earliest)", message, LOG_EVERY
            )


def _float_env(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError:
        log.warning("%s: expected seconds, got %r; using %g", name, env.get(name), default)
        return default


def sender_from_env(
    env: Mapping[str, str], report: Callable[[], core_progress.Report]
) -> Sender | None:
    """A Sender when the Pod was given a progress endpoint (`TRAINJOB_PROGRESS_URL`)."""
    url = env.get(constants.ENV_PROGRESS_URL)
    if not url:
        return None
    return Sender(
        url,
        env.get(constants.ENV_PROGRESS_TOKEN_FILE) or None,
        env.get(constants.ENV_PROGRESS_CA_FILE) or None,
        report,
        _float_env(env, constants.ENV_PROGRESS_INTERVAL, DEFAULT_INTERVAL),
    )


def announce(env: Mapping[str, str], report: core_progress.Report) -> threading.Thread | None:
    """Send one report (a replica that does not report the job's progress says which devices
    it trains on) from a daemon thread, retried for ANNOUNCE_TIMEOUT; never raises, never waited
    for. None outside a TrainJob Pod."""
    url = env.get(constants.ENV_PROGRESS_URL)
    if not url:
        return None
    sender = Sender(
        url,
        env.get(constants.ENV_PROGRESS_TOKEN_FILE) or None,
        env.get(constants.ENV_PROGRESS_CA_FILE) or None,
        lambda: report,
        start=False,
    )
    sender.finish_timeout = ANNOUNCE_TIMEOUT
    thread = threading.Thread(target=sender.send_one, name="trainjob-devices", daemon=True)
    thread.start()
    return thread


def write_termination_message(env: Mapping[str, str], report: core_progress.Report) -> None:
    """The final report where the kubelet reads the container's termination message, so the
    operator shows the final figures even when the last POST never arrived."""
    path = env.get(constants.ENV_TERMINATION_MESSAGE_PATH)
    if not path:
        return
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as handle:
        handle.write(termination.with_report(report))


def exception_line(exc: BaseException) -> str:
    """The line Python prints last for an uncaught `exc` (`ValueError: learning rate must be
    > 0`): the cause a failed job quotes. Notes and later lines of a long message are left out."""
    if isinstance(exc, (exitcodes.NonFiniteLossError, exitcodes.CheckpointStorageError)):
        # The runtime's own verdict: its class name says it, its module path is noise.
        return f"{type(exc).__name__}: {exc}"
    lines = traceback.format_exception_only(type(exc), exc)
    first = lines[0].strip().splitlines() if lines else []
    return first[0] if first else type(exc).__name__


def termination_path(env: Mapping[str, str], exists: Callable[[str], bool]) -> str | None:
    """Where the kubelet reads this container's termination message: the path the Pod was
    rendered with, else Kubernetes' default when it exists (a Pod); None elsewhere (a local
    process must not write to /dev)."""
    path = env.get(constants.ENV_TERMINATION_MESSAGE_PATH)
    if path:
        return path
    default = constants.DEFAULT_TERMINATION_MESSAGE_PATH
    return default if exists(default) else None


def write_termination_error(env: Mapping[str, str], exc: BaseException) -> None:
    """Record why this replica failed in its termination message, so the job's status quotes
    it even after cleanPodPolicy deleted the Pod and its log."""
    path = termination_path(env, os.path.exists)
    if path is None:
        return
    previous = ""
    with contextlib.suppress(OSError), open(path, encoding="utf-8") as handle:
        previous = handle.read(termination.LIMIT + 1)
    with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as handle:
        handle.write(termination.with_error(previous, exception_line(exc)))


class ProgressReporter:
    """What a training loop calls: a Tracker and (in a TrainJob Pod) a Sender."""

    def __init__(self, tracker: Tracker, env: Mapping[str, str], *, send: bool = True) -> None:
        self.tracker = tracker
        self._env = env
        self.sender = sender_from_env(env, tracker.report) if send else None
        self._finished = False

    @classmethod
    def from_env(
        cls,
        *,
        total_epochs: int | None = None,
        total_steps: int | None = None,
        steps_per_epoch: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ProgressReporter:
        environ = dict(os.environ if env is None else env)
        replica = None
        if environ.get(constants.ENV_REPLICA_TYPE):
            replica = (
                f"{environ[constants.ENV_REPLICA_TYPE]}-"
                f"{environ.get(constants.ENV_REPLICA_INDEX, '0')}"
            )
        tracker = Tracker(
            replica,
            total_epochs=total_epochs,
            total_steps=total_steps,
            steps_per_epoch=steps_per_epoch,
        )
        return cls(tracker, environ)

    def tick(self, step: int) -> None:
        """The step just completed; cheap enough for every step."""
        self.tracker.tick(step)

    def step(self, step: int, **numbers: Any) -> None:
        """The step with its numbers (`loss`, `metrics`, `epoch`, `examples_per_second`,
        `checkpoint`)."""
        self.tracker.update(step=step, **numbers)

    def started(self, devices: core_progress.Devices | None) -> None:
        """Training (re)started on `devices` (None: not known): reported soon, so the job
        shows them without waiting for the interval."""
        self.tracker.update(devices=devices)
        if self.sender is not None:
            self.sender.urgent()

    def epoch_end(self, epoch: int, **numbers: Any) -> None:
        """Epoch `epoch` (from 1) is done: reported soon, not only at the next interval."""
        self.tracker.update(epoch=epoch, **numbers)
        if self.sender is not None:
            self.sender.urgent()

    def finish(self, state: str = core_progress.STATE_SUCCEEDED, **numbers: Any) -> None:
        """The last report: sent at once (waiting up to FINISH_TIMEOUT) and written as the
        termination message. Call it once, at the end; later calls do nothing."""
        if self._finished:
            return
        self._finished = True
        self.tracker.update(state=state, **numbers)
        try:
            write_termination_message(self._env, self.tracker.report())
            if self.sender is not None:
                self.sender.finish()
        except Exception:  # the end of training must not fail here
            log.exception("Failed to send the final progress report")
