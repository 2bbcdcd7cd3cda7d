"""Run a planned TrainJob as local processes: the loop that wires local mode together.

Each tick it observes the replicas' processes (`supervisor`), asks the policy engine (the same
`trainjob.core.policy.reconcile` the operator calls) what to do, and does it: a "pod" created
is a process started, a "pod" deleted is a process stopped. Replica output becomes progress
(`replica_progress`) and filtered log lines (`logfilter`); the terminal (`terminal`) shows them
with the live table (`view`); the run directory (`rundir`) records status and processes; how the
run ended is decided by `outcome`.
"""

from __future__ import annotations

import datetime
import os
import queue
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, TextIO

from trainjob.console import logfilter, outcome, replica_progress, view
from trainjob.console.terminal import Terminal
from trainjob.core import policy, progress_events, times
from trainjob.core import progress as core_progress
from trainjob.core import status as st
from trainjob.core.naming import ReplicaKey
from trainjob.local import data, plan, rundir, supervisor, usernet
from trainjob.signals import stop_signals

POLL_SECONDS: Final = 0.1


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class Executor:
    def __init__(
        self,
        run_plan: plan.RunPlan,
        *,
        environ: Mapping[str, str],
        out: TextIO,
        tty: bool,
        show_logs: bool = True,
        verbose: bool = False,
        color: bool = False,
        cwd: str | None = None,
        now: Callable[[], datetime.datetime] = _utc_now,
        size: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.plan = run_plan
        self.job = run_plan.job
        self.environ = dict(environ)
        self.cwd = cwd or os.getcwd()
        self.now = now
        self.show_logs = show_logs
        self.verbose = verbose
        self.terminal = Terminal(out, tty=tty, color=color, size=size)
        self.processes = supervisor.Supervisor(self.environ, self.cwd, now)
        self.recorder = rundir.Recorder(run_plan)
        self.status = st.JobStatus()
        self.stop_signal: str | None = None
        self.problem: str | None = None
        # What replicas reported: their latest numbers, the job's step timer (the ETA), the
        # chief's latest progress report and when it arrived (what the operator would write to
        # status.progress, written to status.json the same way), and the exported model.
        self.progress: dict[ReplicaKey, replica_progress.ReplicaProgress] = {}
        self.timer = core_progress.StepTimer()
        self.report: core_progress.Report | None = None
        self.report_received = self.now()
        self.export: str | None = None
        # When the lead replica's step last moved (its first event counts): what hang
        # detection (runPolicy.progressDeadlineSeconds) measures from, as in the operator.
        self.progress_at: datetime.datetime | None = None
        self._filters: dict[ReplicaKey, logfilter.FilterState] = {}
        self._finished_attempts: set[tuple[ReplicaKey, int]] = set()
        self._network_hinted = False
        keys = plan.all_keys(run_plan)
        self._width = view.prefix_width(keys)
        self._styles = {key: view.prefix_style(i) for i, key in enumerate(keys)}

    # ----- output -----
    def emit(self, text: str) -> None:
        self.terminal.emit(text)
        if self.terminal.reader_gone:  # `| head` took what it wanted: stop as on SIGPIPE
            self.stop_signal = self.stop_signal or "SIGPIPE"

    def _notice_reader_gone(self) -> None:
        if self.terminal.notice_reader_gone():
            self.stop_signal = self.stop_signal or "SIGPIPE"

    def _snapshot(self, started: datetime.datetime) -> view.Snapshot:
        return view.Snapshot(
            self.job,
            self.status,
            self._rows(),
            self.progress,
            view.elapsed(started, self.now()),
            timer=self.timer,
            state=outcome.INTERRUPTED if self.stop_signal else None,
            report=self.report,
        )

    def _draw(self, started: datetime.datetime, force: bool = False) -> None:
        self.terminal.draw(lambda: self._snapshot(started), force=force)

    def _rows(self) -> list[view.ReplicaRow]:
        rows = []
        for key in self.job.replica_keys():
            record = self.status.record(key)
            state = record.state
            if self.processes.stopping(key):
                state = "Stopping"
            elif self.processes.waiting_for_port(key):
                state = "WaitPort"
            rows.append(
                view.ReplicaRow(
                    key=key,
                    state=state,
                    attempt=record.attempt,
                    exit_code=record.exit_code,
                    pid=self.processes.pid(key),
                )
            )
        return rows

    # ----- replica output -----
    def _note_progress(self, event: Mapping[str, Any]) -> None:
        """Keep the job's step timer (for the ETA): started afresh when training (re)starts.
        Replicas report the same global step; the timer ignores steps it has seen."""
        step = event.get("step")
        if event.get("event") == "start":
            self.timer = core_progress.StepTimer()
        elif isinstance(step, int) and not isinstance(step, bool):
            self.timer = self.timer.observe(step, time.monotonic())

    def _note_report(self, event: Mapping[str, Any]) -> None:
        report = progress_events.report_of(event)
        if report is None:
            return  # none, or a foreign or damaged one: the table keeps the last good report
        self.report = report
        self.report_received = self.now()

    def _drain_lines(self) -> None:
        while True:
            try:
                key, attempt, text = self.processes.lines.get_nowait()
            except queue.Empty:
                return
            stopping = self.processes.stopped_by_us(key, attempt) or self.stop_signal is not None
            event = progress_events.parse_line(text)
            if event is not None:
                self._on_event(key, attempt, event, stopping)
            elif self.show_logs:
                self._on_log_line(key, attempt, text, stopping)

    def _on_event(
        self, key: ReplicaKey, attempt: int, event: Mapping[str, Any], stopping: bool
    ) -> None:
        if event.get("event") == "end" and event.get("status") == "succeeded":
            self._finished_attempts.add((key, attempt))
        before = self.progress.get(key)
        self.progress[key] = replica_progress.fold(before, event)
        if key == replica_progress.lead_replica(self.job) and (
            self.progress_at is None or before is None or before.step != self.progress[key].step
        ):
            self.progress_at = self.now()
        self._note_progress(event)
        self._note_report(event)
        if event.get("export") and event.get("chief"):
            self.export = str(event["export"])
        if not self.terminal.tty or (view.keeps_line(key, event, self.job) and not stopping):
            self.emit(view.event_line(key, event, self.job, stopped=stopping))

    def _on_log_line(self, key: ReplicaKey, attempt: int, text: str, stopping: bool) -> None:
        if (key, attempt) in self._finished_attempts and not self.verbose:
            # After its own successful end a replica only tears down; under
            # MultiWorkerMirrored the last one out logs its peers' "crash" (heartbeats).
            return
        shown, self._filters[key] = logfilter.filter_line(
            text,
            self._filters.get(key, logfilter.FilterState()),
            verbose=self.verbose,
            stopping=stopping,
        )
        if shown is not None:
            style = self._styles.get(key)
            color = self.terminal.color
            self.emit(view.prefix_line(key, shown, self._width, color=color, style=style))

    # ----- processes -----
    def _start(self, key: ReplicaKey, attempt: int) -> None:
        process = self.plan.process(key)
        if self.processes.port_in_use(process.port):
            # Like a Pod that cannot get its host port: Pending until the port is free (the
            # startup deadline bounds the wait); starting it would fail in gRPC's bind.
            if self.processes.wait_for_port(key, attempt):
                self.emit(
                    f"! {process.label}: port {process.port} is in use by another process; "
                    f"waiting for it to be free (startupDeadlineSeconds "
                    f"{self.job.run_policy.startup_deadline_seconds})"
                )
            return
        log = self.recorder.open_log(process, attempt, times.format_time(self.now()))
        problem = self.processes.start(process, attempt, log)
        if problem is not None:
            self.emit(view.prefix_line(key, problem, self._width))

    def _poll(self) -> None:
        failures = self.processes.poll()
        if failures and self.stop_signal is None:
            self._drain_lines()  # their last lines before the cause
            for failure in failures:
                cause = self.recorder.cause(failure.key)
                self.emit(view.exit_line(cause, failure.exit_code))
                self._hint_network(cause)
        self.recorder.write_processes(self.processes.records)

    def _network(self) -> None:
        """The replicas' network of their own, or a plain warning, once, that they have none."""
        if not self.plan.private_network:
            return  # the plan's note said so
        problem = self.processes.use_private_network(self.plan.exposed_host_ports)
        if problem is None and self.processes.network is not None:
            outbound = self.processes.network.outbound_problem
            self.emit(f"note: network: {usernet.describe(outbound, self.plan.exposed_host_ports)}")
        else:
            self.emit(
                "warning: the replicas run on this machine's network: a network of their own "
                f"cannot be made here ({problem}). Their TensorFlow ports listen on every "
                "interface, and whoever reaches one can run code as you (the docs' Security "
                "guide; --host-network chooses this and silences the warning)"
            )

    def _hint_network(self, cause: outcome.Cause) -> None:
        """Once: a replica that failed connecting out of the run's network is told what the
        network lets through and what to change (usernet.hint)."""
        network = self.processes.network
        if self._network_hinted or network is None:
            return
        text = usernet.hint(
            cause.replica,
            cause.line,
            outbound_problem=network.outbound_problem,
            exposed=self.plan.exposed_host_ports,
            run_ports=[process.port for process in self.plan.processes],
        )
        if text is not None:
            self._network_hinted = True
            self.emit(text)

    def _on_stop_signal(self, name: str) -> None:
        if self.stop_signal is not None:
            self.processes.kill_all_now()  # a second Ctrl-C: no more grace
        self.stop_signal = name

    def _write_status(self) -> None:
        self.recorder.write_status(
            outcome.status_file_data(
                self.job,
                self.status,
                report=self.report,
                report_received=self.report_received,
                stop_signal=self.stop_signal,
                problem=self.problem,
                devices={
                    f"{key[0]}-{key[1]}": seen.devices
                    for key, seen in sorted(self.progress.items())
                    if seen.devices is not None
                }
                or None,
            )
        )

    # ----- the loop -----
    def _prepare(self, started: datetime.datetime) -> bool:
        """Say what runs and prepare its data; False when the run ends before it starts."""
        for note in self.plan.notes:
            self.emit(f"note: {note}")
        self.emit(
            f"Running TrainJob {self.job.name}: {len(self.plan.processes)} process(es); "
            f"run dir {self.plan.run_dir}"
        )

        def announce(text: str) -> None:
            self.emit(text)
            self._draw(started, force=True)

        if self.stop_signal is None:
            self.problem = data.prepare_mnist(self.plan, self.environ, self.cwd, announce)
        self._notice_reader_gone()
        if self.stop_signal is not None:
            self.problem = None  # Ctrl-C during the preparation is what ended it
        return self.problem is None and self.stop_signal is None

    def _tick(self, keys: set[ReplicaKey]) -> bool:
        """One reconcile: start, stop, record. True when the job is over and nothing runs."""
        for key, attempt in self.processes.waiting():
            self._start(key, attempt)
        decision = policy.reconcile(
            self.job,
            self.status,
            self.processes.observed(),
            keys,
            self.now(),
            progress_at=self.progress_at,
        )
        self.status = decision.status
        for event in decision.events:
            self.emit(view.engine_event_line(event, self.terminal.color))
        for key in decision.delete_pods:
            self.processes.terminate(key)
        for rtype, index, attempt in decision.create_pods:
            if not self.processes.started((rtype, index)):
                self._start((rtype, index), attempt)
        self.recorder.write_processes(self.processes.records)
        self._write_status()
        if not self.status.finished:
            return False
        # Nothing may outlive `trainjob run`, whatever cleanPodPolicy says.
        self.processes.terminate_alive()
        return not self.processes.any_alive()

    def run(self) -> outcome.Summary:
        self.recorder.make_dirs()
        started = self.now()
        keys = set(plan.all_keys(self.plan))
        with stop_signals(self._on_stop_signal):
            if not self._prepare(started):
                self.terminal.erase()
                return self._summary(started)
            stopping = False
            try:
                self._network()
                while True:
                    self._drain_lines()
                    self._notice_reader_gone()
                    self._poll()
                    if self.stop_signal is not None and not stopping:
                        stopping = True
                        self.emit(f"Stopping every replica ({self.stop_signal} received)")
                        self.processes.terminate_all()
                    if stopping and not self.processes.any_alive():
                        break
                    if not stopping and self._tick(keys):
                        break
                    self._draw(started)
                    time.sleep(POLL_SECONDS)
            finally:
                self.processes.shutdown()
                self._drain_lines()
                self.recorder.write_processes(self.processes.records)
            if self.stop_signal is not None and not self.status.finished:
                exit_codes = {key: r.exit_code for key, r in self.processes.records.items()}
                self.status = outcome.stopped_status(
                    self.status, exit_codes, self.stop_signal, self.now()
                )
            self.terminal.erase()
        return self._summary(started)

    def _summary(self, started: datetime.datetime) -> outcome.Summary:
        self._write_status()
        causes: list[outcome.Cause] = []
        if self.status.is_true(st.FAILED):
            failed = outcome.failed_replicas(self.status, self.job)
            causes = [self.recorder.cause(key) for key in failed[:1]]
        reported_checkpoint = any(p.checkpoint or p.initial_step for p in self.progress.values())
        return outcome.Summary(
            job=self.job,
            status=self.status,
            interrupted=self.stop_signal,
            elapsed_seconds=view.elapsed(started, self.now()),
            run_dir=self.plan.run_dir,
            log_dir=self.plan.log_dir,
            checkpoint_dir=self.plan.checkpoint_dir,
            export=self.export or self.recorder.export(),
            progress=self.progress,
            causes=causes,
            has_checkpoint=reported_checkpoint or self.recorder.has_checkpoint(),
            problem=self.problem,
            report=self.report,
        )
