"""Progress reports as data: schema and validation, ETA, status text, the runtime's tracker and
sender (against a loopback HTTP server), the operator's auth decisions, cache, limits and
status patches."""

from __future__ import annotations

import base64
import datetime
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import progress_endpoint
from trainjob.core import constants, policy, progress_events, render, spec, termination, times
from trainjob.core import progress as p
from trainjob.runtime import progress as events
from trainjob.runtime import reporter
from trainjob_operator import children, config, progress_auth, progress_status

pytestmark = pytest.mark.unit

NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.timezone.utc)


# -- schema -----------------------------------------------------------------------------------


def test_a_full_report_round_trips() -> None:
    wire = {
        "replica": "chief-0",
        "state": "Running",
        "epoch": 3,
        "totalEpochs": 10,
        "step": 450,
        "totalSteps": 1000,
        "loss": 0.231,
        "metrics": {"accuracy": 0.9},
        "examplesPerSecond": 800.0,
        "lastCheckpoint": "/c",
        "etaSeconds": 240.0,
        "time": 1.0,
    }
    assert p.to_wire(p.parse_report(wire)) == wire
    assert p.parse_report({}) == p.Report()


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"step": -1}, "step"),
        ({"step": 1.5}, "step"),
        ({"epoch": True}, "epoch"),
        ({"loss": "low"}, "loss"),
        ({"state": "Done"}, "state"),
        ({"percent": 120}, "percent"),
        ({"metrics": [1]}, "metrics"),
        ({"metrics": {str(i): 1 for i in range(9)}}, "metrics"),
        ({"lastCheckpoint": "x" * 600}, "lastCheckpoint"),
        ({"stepz": 1}, "stepz"),
    ],
)
def test_a_bad_report_names_the_field(raw: dict[str, Any], field: str) -> None:
    with pytest.raises(p.ReportError, match=f"^{field}:"):
        p.parse_report(raw)


def test_decode_refuses_what_is_not_one_json_object() -> None:
    for body in (b"[1]", b"{", b"\xff", b" " * (p.MAX_BODY_BYTES + 1)):
        with pytest.raises(p.ReportError):
            p.decode(body)
    assert p.decode(b'{"loss": NaN}').loss is None  # a diverged loss is unknown, not an error


def test_termination_message_round_trips_and_ignores_others() -> None:
    report = p.Report(state="Succeeded", step=10, total_steps=10, metrics={"a": 1.0})
    assert termination.read(termination.with_report(report)).report == report
    assert termination.read("Error: OOM").report is None
    assert termination.read('{"trainjobProgress": {"step": -3}}').report is None
    long = p.Report(state="Failed", last_checkpoint="x" * 500, metrics={"m" * 60: 1.0})
    assert len(termination.with_report(long)) < 4096


# -- derived numbers and text -----------------------------------------------------------------


def test_summary_and_percent() -> None:
    assert p.summary(p.Report(epoch=3, total_epochs=10, step=450, total_steps=1000)) == (
        "45% (3/10)"
    )
    assert p.summary(p.Report(step=30, total_steps=120)) == "25% (30/120)"
    assert p.summary(p.Report(epoch=3, total_epochs=10)) == "20% (3/10)"  # 2 epochs done
    assert p.summary(p.Report(step=7)) == "step 7"
    assert p.summary(p.Report(state="Succeeded", step=7)) == "100% (step 7)"
    assert p.summary(p.Report()) == ""


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, ""),
        (0, "0s"),
        (44.6, "45s"),
        (240, "4m"),
        (3599, "1h"),
        (4800, "1h20m"),
        (90000, "1d1h"),
        (86400 * 2, "2d"),
    ],
)
def test_format_eta(seconds: float | None, text: str) -> None:
    assert times.format_eta(seconds) == text


def test_step_timer_is_a_moving_average_that_survives_a_restart() -> None:
    timer = p.StepTimer()
    for step in range(0, 101, 10):
        timer = timer.observe(step, step * 0.5)  # 0.5 s a step
    assert timer.seconds_per_step == pytest.approx(0.5)
    assert timer.eta(100, 200) == pytest.approx(50.0)
    # Slower now: the average moves towards 1 s a step, not all at once.
    timer = timer.observe(110, 50 + 10 * 1.0)
    assert 0.5 < (timer.seconds_per_step or 0) < 1.0
    # A restart from a checkpoint (the step went back): a new series, the average is kept.
    restarted = timer.observe(40, 100.0)
    assert restarted.last_step == 40 and restarted.seconds_per_step == timer.seconds_per_step
    assert p.StepTimer().eta(1, 10) is None


def test_planned_totals() -> None:
    assert p.planned_totals({"epochs": 3, "steps_per_epoch": 40}) == (3, 120)
    assert p.planned_totals({"max_steps": 500}) == (None, 500)
    assert p.planned_totals({"epochs": True}) == (None, None)


def test_status_progress() -> None:
    report = p.Report(
        replica="chief-0",
        epoch=3,
        total_epochs=10,
        step=450,
        total_steps=1000,
        loss=0.231403995,
        eta_seconds=239.6,
        metrics={"acc": 0.912345},
    )
    status = p.status_progress(report, NOW)
    assert status == {
        "summary": "45% (3/10)",
        "state": "Running",
        "lastUpdateTime": "2026-11-23T12:00:00Z",
        "replica": "chief-0",
        "epoch": 3,
        "totalEpochs": 10,
        "step": 450,
        "totalSteps": 1000,
        "percent": 45.0,
        "loss": 0.2314,
        "metrics": {"acc": 0.9123},
        "etaSeconds": 240,
        "eta": "4m",
    }
    done = p.status_progress(p.Report(state="Succeeded", step=1000, total_steps=1000), NOW)
    assert done["percent"] == 100.0 and done["eta"] == "0s"
    failed = p.status_progress(p.Report(state="Failed", step=5, eta_seconds=9), NOW)
    assert "eta" not in failed and "etaSeconds" not in failed


# -- the runtime side -------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_tracker_reports_epoch_eta_and_totals() -> None:
    clock = _Clock()
    tracker = reporter.Tracker("chief-0", clock=clock, wall=lambda: 5.0)
    tracker.plan(total_epochs=4, steps_per_epoch=25)
    for step in range(1, 51):
        clock.now = step * 0.2
        tracker.tick(step)
        if step % 10 == 0:
            tracker.report()  # the sender samples every few seconds
    tracker.update(loss=0.5, metrics={"loss": 0.5, "acc": 0.75, "bad": "x"})
    report = tracker.report()
    assert (report.epoch, report.total_epochs, report.step, report.total_steps) == (2, 4, 50, 100)
    assert report.eta_seconds == pytest.approx(10.0)
    assert report.metrics == {"acc": 0.75} and report.loss == 0.5 and report.time == 5.0


def test_emitter_events_carry_the_report_for_local_mode() -> None:
    import io

    tracker = reporter.Tracker("worker-0", total_epochs=2, steps_per_epoch=10)
    out = io.StringIO()
    emitter = events.Emitter(
        "worker-0", True, stream=out, reporter=reporter.ProgressReporter(tracker, {})
    )
    emitter.emit("start", epoch=0, step=0, initial_epoch=0, initial_step=0)
    for step in range(1, 11):
        emitter.tick(step)
    emitter.emit("epoch", epoch=0, step=10, logs={"loss": 0.4, "acc": 0.8})
    emitter.emit("end", status="succeeded", exit_code=0)
    lines = [progress_events.parse_line(line) for line in out.getvalue().splitlines()]
    assert lines[1] is not None and lines[1]["progress"]["epoch"] == 1
    assert lines[1]["progress"]["totalSteps"] == 20 and lines[1]["progress"]["loss"] == 0.4
    assert lines[2] is not None and lines[2]["progress"]["state"] == "Succeeded"
    assert progress_events.report_state({"event": "end", "status": "preempted"}) == "Running"
    assert progress_events.report_state({"event": "end", "status": "user_code_error"}) == "Failed"


@pytest.fixture
def server() -> Iterator[progress_endpoint.Endpoint]:
    with progress_endpoint.serving() as endpoint:
        yield endpoint


def test_reporter_sends_at_once_then_the_final_report_and_never_raises(
    server: progress_endpoint.Endpoint, tmp_path: Any
) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    message = tmp_path / "termination-log"
    env = {
        constants.ENV_PROGRESS_URL: server.url,
        constants.ENV_PROGRESS_TOKEN_FILE: str(token),
        constants.ENV_PROGRESS_INTERVAL: "60",
        constants.ENV_TERMINATION_MESSAGE_PATH: str(message),
        constants.ENV_REPLICA_TYPE: "chief",
    }
    server.answers = [202, 429]  # the final report is first told to wait, then accepted
    progress = reporter.ProgressReporter.from_env(total_steps=10, env=env)
    progress.step(3, loss=1.0)
    progress.finish("Succeeded", loss=0.5)
    progress.finish("Failed")  # once only
    assert [r.get("state") for r in server.received][-2:] == ["Succeeded", "Succeeded"]
    assert server.received[0]["auth"] == "Bearer abc"
    assert server.received[-1]["replica"] == "chief-0"
    final = termination.read(message.read_text()).report
    assert final is not None and final.state == "Succeeded" and final.loss == 0.5


def test_reporter_with_no_operator_costs_only_log_lines(tmp_path: Any) -> None:
    env = {constants.ENV_PROGRESS_URL: "http://127.0.0.1:9/nowhere"}
    progress = reporter.ProgressReporter.from_env(env=env)
    assert progress.sender is not None
    progress.sender.finish_timeout = 0.5
    progress.tick(1)
    progress.epoch_end(1)
    progress.finish()  # returns (within FINISH_TIMEOUT) without raising
    quiet = reporter.ProgressReporter.from_env(env={})
    assert quiet.sender is None
    quiet.finish()


def test_retry_after() -> None:
    assert reporter.retry_after("3", 5.0) == 3.0
    assert reporter.retry_after("Wed, 21 Oct 2015", 5.0) == 5.0
    assert reporter.retry_after(None, 5.0) == 5.0


# -- the operator side ------------------------------------------------------------------------


def _review(**user: Any) -> dict[str, Any]:
    return {"status": {"authenticated": True, "audiences": ["aud"], "user": user}}


def _pod(uid: str) -> children.ChildPod:
    return children.ChildPod(("chief", 0), policy.ObservedReplica(phase="Running"), uid, None)


def test_identity_and_refusals() -> None:
    extra = {progress_auth.POD_NAME_KEY: ["j-chief-0"], progress_auth.POD_UID_KEY: ["u1"]}
    identity = progress_auth.identity_from_review(
        _review(username="system:serviceaccount:ns:default", extra=extra)
    )
    assert identity is not None and identity.pod_uid == "u1" and identity.namespace == "ns"
    assert progress_auth.refusal(identity, "ns", "aud", [_pod("u1")]) is None
    assert "not a current Pod" in str(progress_auth.refusal(identity, "ns", "aud", [_pod("u2")]))
    assert "namespace" in str(progress_auth.refusal(identity, "other", "aud", [_pod("u1")]))
    assert "audiences" in str(progress_auth.refusal(identity, "ns", "aud2", [_pod("u1")]))
    unbound = progress_auth.identity_from_review(_review(username="system:serviceaccount:ns:x"))
    assert unbound is not None
    assert "not bound to a Pod" in str(progress_auth.refusal(unbound, "ns", "aud", []))
    assert progress_auth.identity_from_review({"status": {"authenticated": False}}) is None
    assert progress_auth.identity_from_review(_review(username="alice")) is None


def test_token_expiry_reads_exp_only() -> None:
    claims = base64.urlsafe_b64encode(json.dumps({"exp": 1234}).encode()).rstrip(b"=").decode()
    assert progress_auth.token_expiry(f"h.{claims}.s") == 1234.0
    assert progress_auth.token_expiry("not-a-jwt") is None
    assert progress_auth.token_expiry("a.!!!.c") is None


def test_review_cache_until_expiry_and_briefly_for_refusals() -> None:
    cache = progress_auth.ReviewCache(max_entries=2)
    identity = progress_auth.Identity("ns", "sa", "p", "u", ("aud",))
    cache.put("t1", identity, now=0.0, expires=100.0)
    assert cache.get("t1", 99.0) == (True, identity)
    assert cache.get("t1", 100.0) == (False, None)  # expired token: reviewed again
    cache.put("bad", None, now=0.0, expires=None)
    assert cache.get("bad", 5.0) == (True, None)
    assert cache.get("bad", progress_auth.NEGATIVE_CACHE_SECONDS) == (False, None)
    cache.put("old", identity, now=0.0, expires=-1.0)  # already expired: not kept
    assert len(cache) == 0
    for key in ("a", "b", "c"):
        cache.put(key, identity, now=0.0, expires=None)
    assert len(cache) == 2 and cache.get("a", 1.0) == (False, None)


def test_rate_limiter() -> None:
    limiter = progress_auth.RateLimiter(burst=3, rate=1.0, max_keys=10)
    assert [limiter.allow("k", 0.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.allow("k", 0.0) == pytest.approx(1.0)
    assert limiter.allow("k", 1.0) == 0.0
    assert limiter.allow("other", 1.0) == 0.0


def test_supersedes_and_status_patch() -> None:
    old = p.Report(step=5, time=10.0)
    assert progress_status.supersedes(None, old)
    assert progress_status.supersedes(old, p.Report(step=6, time=11.0))
    assert not progress_status.supersedes(old, p.Report(step=4, time=9.0))  # late, older
    assert not progress_status.supersedes(old, p.Report(step=5, time=12.0))  # same numbers
    final = p.Report(state="Succeeded", step=10)
    assert not progress_status.supersedes(final, p.Report(step=9))
    patch = progress_status.status_patch(
        p.Report(step=1, metrics={"b": 1.0}), NOW, frozenset({"a"})
    )["progress"]
    assert patch["metrics"] == {"a": None, "b": 1.0} and patch["eta"] is None
    assert set(patch) == {*p.STATUS_FIELDS, "metrics"}


def test_report_of_pod_reads_the_termination_message() -> None:
    message = termination.with_report(p.Report(state="Succeeded", step=3))
    body = {"status": {"containerStatuses": [{"state": {"terminated": {"message": message}}}]}}
    report = progress_status.report_of_pod(body)
    assert report is not None and report.step == 3
    assert progress_status.report_of_pod({"status": {}}) is None


def test_pods_get_the_progress_volume_env_and_ca() -> None:
    job = spec.parse(
        {
            "apiVersion": constants.API_VERSION,
            "kind": "TrainJob",
            "metadata": {"name": "j", "namespace": "ns"},
            "spec": {
                "image": "img",
                "runtime": {"entrypoint": "m:build"},
                "replicaSpecs": {"worker": {"replicas": 1}},
            },
        }
    )
    endpoint = render.ProgressEndpoint("https://op.sys.svc:8443", "PEM", 5.0)
    pod = render.render_pod(
        job, "worker", 0, 0, render.RenderOptions("ns", progress=endpoint), None
    )
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == constants.PROGRESS_VOLUME_NAME)
    sources = volume["projected"]["sources"]
    assert sources[0]["serviceAccountToken"]["audience"] == "trainjob.dev/progress/ns/j"
    assert pod["metadata"]["annotations"][constants.ANNOTATION_PROGRESS_CA] == "PEM"
    assert pod["spec"]["automountServiceAccountToken"] is False
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env[constants.ENV_PROGRESS_URL] == (
        "https://op.sys.svc:8443/v1/namespaces/ns/trainjobs/j/progress"
    )
    plain = render.render_pod(job, "worker", 0, 0, render.RenderOptions("ns"), None)
    assert constants.ENV_PROGRESS_URL not in str(plain)


def test_operator_progress_flags() -> None:
    on = config.from_args(
        ["--progress-port=8443", "--progress-url=https://x:8443", "--progress-cert-dir=/c"], {}
    )
    assert on.progress_enabled and on.progress_writes_per_second == 20.0
    assert not config.from_args([], {}).progress_enabled
    for argv, field in (
        (["--progress-port=8443", "--progress-cert-dir=/c"], "--progress-url"),
        (["--progress-port=8443", "--progress-url=https://x"], "--progress-cert-dir"),
        (["--progress-url=http://x"], "--progress-url"),
        (["--progress-status-writes=0"], "--progress-status-writes"),
        (["--progress-interval=abc"], "--progress-interval"),
    ):
        with pytest.raises(config.ConfigError, match=field):
            config.from_args(argv, {})


def test_a_missing_or_broken_certificate_is_one_clear_line(tmp_path: Any) -> None:
    from trainjob_operator import progress_server

    problem = progress_server.certificate_problem(str(tmp_path))
    assert problem is not None and problem.startswith("--progress-cert-dir:")
    assert "tls.crt does not exist" in problem
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (tmp_path / name).write_text("not a PEM\n")
    broken = progress_server.certificate_problem(str(tmp_path))
    assert broken is not None and "no usable certificate" in broken
