"""The `trainjob` command and `trainjob.client` against the real node, as a user runs them from
a laptop: the 2-worker example submitted and followed on a pseudo-terminal to its summary,
then, on that one finished job (a module-scoped fixture: one training run for every test
here), its logs, `wait`'s exit codes, the Python client from a process of its own, and
`trainjob tensorboard` opened in a real headless browser (Debian's Chromium) showing the
job's loss curve.

Artifacts (the browser's screenshot, the followed screen, the measured times) are written to
$TRAINJOB_E2E_ARTIFACTS when set, else to the test's tmp_path (kept by pytest under
/tmp/pytest-of-<user>/)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pexpect
import pyte
import pytest
import yaml

from tests.controlplane.e2e_cluster import REPO_ROOT, Cluster, create_job_namespace, wait_until
from tests.e2e import browser
from tests.e2e.conftest import IMAGE_TAG

pytestmark = pytest.mark.e2e

JOB: Final = "mnist-multiworker"
EXAMPLE: Final = REPO_ROOT / "examples" / f"{JOB}.yaml"
RUNTIME_IMAGE: Final = f"trainjob/trainjob:{IMAGE_TAG}"
JOB_TIMEOUT: Final = 600.0
ROWS, COLUMNS = 40, 120
# The time series dashboard (TensorBoard's default), filtered to one tag: its card is drawn
# without scrolling, so the browser renders it (cards off screen are not rendered).
TAG: Final = "epoch_loss"


def artifacts(tmp_path: Path) -> Path:
    where = os.environ.get("TRAINJOB_E2E_ARTIFACTS")
    directory = Path(where) if where else tmp_path
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def cli_env(cluster: Cluster) -> dict[str, str]:
    """The cluster's kubeconfig, this checkout's trainjob, and no inherited TRAINJOB_* state."""
    env = {k: v for k, v in cluster.env.items() if not k.startswith("TRAINJOB_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def trainjob(
    cluster: Cluster, *argv: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainjob", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=cli_env(cluster),
        cwd=REPO_ROOT,
    )


def screen_lines(screen: pyte.HistoryScreen) -> list[str]:
    """Every line the terminal holds: scrollback, then the visible screen."""

    def text(line: dict[int, pyte.screens.Char]) -> str:
        return "".join(line[x].data for x in range(screen.columns)).rstrip()

    return [text(line) for line in screen.history.top] + [row.rstrip() for row in screen.display]


@dataclasses.dataclass(frozen=True)
class Followed:
    namespace: str
    exit_code: int | None
    lines: list[str]  # the terminal after `submit --follow` ended
    table: list[str]  # the screen when the table last showed both workers running
    first_progress_s: float | None  # from starting `submit` to a step count in the table
    total_s: float


@pytest.fixture(scope="module")
def followed(
    cluster: Cluster, operator: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Followed]:
    """`trainjob submit -f examples/mnist-multiworker.yaml --follow` on a pseudo-terminal, in
    a restricted namespace of its own, read to the end as a user's screen."""
    del operator  # installed: the job needs it
    namespace = f"e2e-cli-{uuid.uuid4().hex[:6]}"
    create_job_namespace(cluster, namespace)
    screen = pyte.HistoryScreen(COLUMNS, ROWS, history=5000)
    stream = pyte.ByteStream(screen)
    env = {**cli_env(cluster), "TERM": "xterm", "NO_COLOR": "1"}
    started = time.monotonic()
    child = pexpect.spawn(
        sys.executable,
        ["-m", "trainjob", "submit", "-f", str(EXAMPLE), "-n", namespace, "--follow"],
        env=env,
        cwd=str(REPO_ROOT),
        dimensions=(ROWS, COLUMNS),
    )
    first_progress: float | None = None
    table: list[str] = []
    deadline = started + JOB_TIMEOUT
    try:
        while True:
            if time.monotonic() > deadline:
                raise AssertionError(f"submit --follow did not end in {JOB_TIMEOUT:.0f}s")
            try:
                stream.feed(child.read_nonblocking(65536, timeout=1))
            except pexpect.TIMEOUT:
                continue
            except pexpect.EOF:
                break
            shown = [row.rstrip() for row in screen.display]
            job_line = next((line for line in shown if line.startswith(f"TrainJob {JOB}  ")), "")
            if first_progress is None and re.search(r"step \d+/\d+", job_line):
                first_progress = time.monotonic() - started
            if sum(bool(re.match(r"^  worker-[01] +Running", line)) for line in shown) == 2:
                table = shown
    finally:
        child.close(force=True)
    result = Followed(
        namespace,
        child.exitstatus,
        screen_lines(screen),
        table,
        first_progress,
        time.monotonic() - started,
    )
    out = artifacts(tmp_path_factory.mktemp("follow"))
    (out / "submit-follow-screen.txt").write_text("\n".join(result.lines) + "\n")
    (out / "submit-follow-table.txt").write_text("\n".join(result.table).rstrip() + "\n")
    (out / "submit-follow-times.json").write_text(
        json.dumps({"submit_to_first_progress_s": first_progress, "total_s": result.total_s}) + "\n"
    )
    print(f"submit -> first progress in the table: {first_progress}s; to the summary: "
          f"{result.total_s:.1f}s ({out})")  # fmt: skip
    try:
        yield result
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_submit_follow_draws_the_live_table_then_the_summary_on_a_terminal(
    followed: Followed,
) -> None:
    output = "\n".join(followed.lines)
    assert followed.exit_code == 0, output
    assert followed.lines[0] == f"trainjob.trainjob.dev/{JOB} created", output
    # While it ran: the job line with its progress, a row per worker, redrawn in place.
    assert followed.table, f"the table never showed both workers Running:\n{output}"
    job_line = next(line for line in followed.table if line.startswith(f"TrainJob {JOB}  "))
    assert "Running" in job_line, followed.table
    assert followed.first_progress_s is not None, output
    # At the end: the summary of `trainjob run`, in the table's place.
    assert any(line.startswith(f"TrainJob {JOB} Succeeded after") for line in followed.lines)
    assert not any(line.startswith(f"TrainJob {JOB}  ") for line in followed.lines[-12:]), output
    exits = next(line for line in followed.lines if line.lstrip().startswith("last exit:"))
    # Worker 0's success is the job's; worker 1 has either finished too or, lingering at the end
    # of fit (1 run in 4 here), been stopped by cleanPodPolicy Running.
    assert "worker-0=0 (Succeeded" in exits, exits
    assert "worker-1=0 (Succeeded" in exits or "worker-1=- (Stopped" in exits, exits
    assert any("progress:   100% (3/3)" in line for line in followed.lines), output


def test_logs_of_the_finished_job_come_from_every_replica(
    cluster: Cluster, followed: Followed
) -> None:
    """Every replica that finished on its own and whose Pod is still there. Worker 1 may have
    been stopped by cleanPodPolicy Running (see the test above): its Pod is then deleted, and
    may still be terminating when this runs (its log has no end event, rightly)."""
    pods = cluster.job_pods(followed.namespace, JOB)
    states = {
        p["metadata"]["name"].removeprefix(f"{JOB}-"): (
            (p.get("status") or {}).get("phase"),
            bool(p["metadata"].get("deletionTimestamp")),
        )
        for p in pods
    }
    kept = {
        name for name, (phase, deleting) in states.items() if phase == "Succeeded" and not deleting
    }
    assert "worker-0" in kept, states
    shown = trainjob(cluster, "logs", JOB, "-n", followed.namespace)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    for replica in kept:
        own = [line for line in lines if line.startswith(f"{replica} | ")]
        ends = [line for line in own if '"event": "end"' in line]
        assert ends and '"status": "succeeded"' in ends[-1], (replica, states, shown.stdout[-2000:])
    verbose = trainjob(cluster, "logs", JOB, "-n", followed.namespace, "--verbose")
    assert verbose.returncode == 0, verbose.stderr
    # Filtered, never rewritten. Only the kept replicas' lines are compared: a Pod that was
    # terminating at the first call may be gone by the second (CI saw worker-1 vanish between).
    kept_lines = {line for line in lines if line.split(" | ", 1)[0] in kept}
    assert kept_lines <= set(verbose.stdout.splitlines())
    tail = trainjob(
        cluster, "logs", JOB, "worker-0", "-n", followed.namespace, "--tail", "1", "--verbose"
    )
    assert tail.returncode == 0, tail
    last = [line for line in verbose.stdout.splitlines() if line.startswith("worker-0 | ")][-1]
    assert tail.stdout == last + "\n", (tail.stdout, last)


FAILING: Final = {
    "apiVersion": "trainjob.dev/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "fails"},
    "spec": {
        "replicaSpecs": {
            "worker": {
                "replicas": 1,
                "template": {
                    "spec": {
                        "securityContext": {"runAsNonRoot": True},
                        "containers": [
                            {
                                "name": "tensorflow",
                                "image": RUNTIME_IMAGE,
                                "command": [
                                    "python",
                                    "-c",
                                    "raise SystemExit('bad input file: x.csv')",
                                ],
                            }
                        ],
                    }
                },
            }
        },
        "runPolicy": {"backoffLimit": 0},
    },
}


def test_wait_exits_0_on_success_and_1_on_failure_with_the_cause(
    cluster: Cluster, followed: Followed, tmp_path: Path
) -> None:
    ns = followed.namespace
    done = trainjob(cluster, "wait", JOB, "-n", ns, "--timeout", "60s")
    assert (done.returncode, done.stdout.split("(")[0]) == (0, f"TrainJob {JOB} Succeeded "), done
    path = tmp_path / "fails.yaml"
    path.write_text(yaml.safe_dump(FAILING))
    assert trainjob(cluster, "submit", "-f", str(path), "-n", ns).returncode == 0
    failed = trainjob(cluster, "wait", "fails", "-n", ns, "--timeout", "5m", timeout=400)
    assert failed.returncode == 1, failed
    assert failed.stdout.startswith("TrainJob fails Failed"), failed.stdout
    finished = trainjob(cluster, "wait", "fails", "-n", ns, "--for", "finished", "--timeout", "30s")
    assert finished.returncode == 0, finished
    described = trainjob(cluster, "describe", "fails", "-n", ns)
    assert "bad input file: x.csv" in described.stdout, described.stdout


CLIENT_SCRIPT: Final = """
import json, sys
from trainjob import client
with client.TrainJobClient(namespace=sys.argv[1]) as jobs:
    result = jobs.wait(sys.argv[2], timeout=60)
    report = jobs.progress(sys.argv[2])
    lines = list(jobs.logs(sys.argv[2], "worker-0"))
    names = [job["metadata"]["name"] for job in jobs.list()]
    try:
        jobs.get("no-such-job")
        missing = None
    except client.TrainJobError as error:
        missing = str(error)
print(json.dumps({
    "state": result.state, "succeeded": result.succeeded, "exit_codes": result.exit_codes,
    "percent": report.percent if report else None, "loss": report.loss if report else None,
    "lines": len(lines), "ended": any('"event": "end"' in l for l in lines),
    "names": names, "missing": missing,
}))
"""


def test_the_python_client_from_a_process_of_its_own(cluster: Cluster, followed: Followed) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CLIENT_SCRIPT, followed.namespace, JOB],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=cli_env(cluster),
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["state"] == "Succeeded" and seen["succeeded"] is True, seen
    assert seen["exit_codes"]["worker-0"] == 0, seen
    assert seen["exit_codes"]["worker-1"] in (0, None), seen  # None: stopped (see above)
    assert seen["percent"] == 100 and isinstance(seen["loss"], float), seen
    assert seen["lines"] > 0 and seen["ended"], seen
    assert JOB in seen["names"], seen
    assert seen["missing"] == f"TrainJob no-such-job not found in namespace {followed.namespace}"


SERIES: Final = re.compile(r'<path d="(M[^"]*)" style="[^"]*stroke: (rgb\([^)]*\))')
CARDS_JS: Final = (
    "Array.from(document.querySelectorAll('scalar-card')).map(c => c.outerHTML).join('\\n')"
)


def loss_card(html: str) -> str | None:
    """The HTML of TAG's scalar card once it has drawn a line for each of two runs."""
    for card in html.split("<scalar-card ")[1:]:
        if f'title="{TAG}"' in card and len({c for _, c in SERIES.findall(card)}) >= 2:
            return card
    return None


def announcement(process: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """The two lines `process` prints once it serves (the URL; how to stop it), or what it
    said when it ended instead. Both read here: `communicate` later reads the pipe itself,
    past what this reader's buffer already took."""
    got: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        while len(got) < 2 and (line := process.stdout.readline()):
            got.append(line)
        got.append("")  # the end, or both lines

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        process.kill()
        raise AssertionError(f"trainjob tensorboard printed {got} in {timeout:.0f}s")
    if len(got) < 3:  # it ended
        return "".join(got), process.stderr.read() if process.stderr else ""
    return got[0], got[1]


def test_tensorboard_serves_the_finished_jobs_loss_curve_to_a_real_browser(
    cluster: Cluster, followed: Followed, tmp_path: Path
) -> None:
    ns = followed.namespace
    final = [e for e in cluster.progress(ns, f"{JOB}-worker-0") if e["event"] == "end"][-1]
    out = artifacts(tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-m", "trainjob", "tensorboard", JOB, "-n", ns, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGABRT then dumps every thread's stack: see the exit below.
        env={**cli_env(cluster), "PYTHONFAULTHANDLER": "1"},
        cwd=str(REPO_ROOT),
    )
    started = time.monotonic()
    try:
        first, second = announcement(server, timeout=400)
        served_s = time.monotonic() - started
        assert first.startswith(f"TensorBoard for TrainJob {ns}/{JOB} (Pod "), (first, second)
        assert second == "Ctrl-C stops it and deletes the Pod.\n", second
        url = first.split(": ", 1)[1].strip()
        pods = cluster.get_json("pods", "-n", ns, "-l", f"trainjob.dev/tensorboard-for={JOB}")
        (pod,) = pods["items"]
        mount = pod["spec"]["containers"][0]["volumeMounts"][0]
        assert mount["readOnly"] is True and mount["subPath"] == JOB, mount
        # TensorBoard's own API: Keras' logs and the runtime's progress scalars are both there.
        with urllib.request.urlopen(f"{url}data/plugin/scalars/tags", timeout=30) as response:
            tags = json.load(response)
        assert TAG in tags.get("tensorboard/train", {}), tags
        assert TAG in tags.get("tensorboard/progress", {}), tags
        # The browser: the loss card with a line per run, drawn from the job's numbers.
        with browser.headless(out / "chromium-profile") as page:
            page.open(f"{url}?tagFilter={TAG}#timeseries")
            card = wait_until(
                lambda: loss_card(page.evaluate(CARDS_JS) or ""),
                timeout=90,
                what=f"TensorBoard's {TAG} card with its lines in the browser",
                interval=0.5,
            )
            shot = out / "tensorboard-epoch-loss.png"
            page.screenshot(shot)
        (out / "tensorboard-epoch-loss-card.html").write_text(card)
        # Three epochs: every line (each run's raw and smoothed) has three points.
        lines = SERIES.findall(card)
        assert lines and all(d.count("L") == 2 for d, _ in lines), lines
        text = " ".join(re.sub(r"<[^>]+>", " ", card).split())
        assert "tensorboard/train" in text and "tensorboard/progress" in text, text
        # The table shows 4 significant digits (0.4304, 1.593): either way, the run's last loss.
        shown = {f"{final['loss']:.4g}", f"{final['loss']:.4f}"}
        assert any(value in text for value in shown), (final["loss"], text)
        assert shot.stat().st_size > 10_000, shot  # a drawn page, not a blank one
        print(f"TensorBoard served in {served_s:.1f}s; screenshot {shot}")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            rest, errors = server.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            # Where the command waits is the finding, so its threads' stacks go into the
            # failure. (Found so: the runner had been started with SIGINT ignored, which the
            # command inherited; tests/conftest.py now gives commands the terminal's default.)
            server.send_signal(signal.SIGABRT)
            try:
                _, stacks = server.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                stacks = "(no stacks: it did not stop on SIGABRT either)"
            raise AssertionError(
                f"trainjob tensorboard did not exit within 60 s of Ctrl-C; its threads:\n"
                f"{stacks[-8000:]}"
            ) from None
    assert server.returncode == 0, rest
    assert "Traceback" not in errors, errors  # the port-forward's threads end quietly too
    assert "Stopped TensorBoard; deleted Pod" in rest, rest
    wait_until(
        lambda: (
            not cluster.get_json("pods", "-n", ns, "-l", f"trainjob.dev/tensorboard-for={JOB}").get(
                "items"
            )
        ),
        timeout=60,
        what="the TensorBoard Pod to be deleted",
    )


def test_tensorboard_says_why_a_job_without_a_checkpoint_volume_has_none(
    cluster: Cluster, followed: Followed
) -> None:
    cluster.apply(followed.namespace, json.dumps(FAILING))  # the wait test's job, if not there
    shown = trainjob(cluster, "tensorboard", "fails", "-n", followed.namespace)
    assert (shown.returncode, shown.stdout) == (1, ""), shown
    assert shown.stderr == (
        "trainjob tensorboard: TrainJob fails has no checkpoint volume (spec.checkpoint."
        "claimName), so its TensorBoard logs were written inside its Pods and are not kept; give "
        "the job a PersistentVolumeClaim in spec.checkpoint to see them\n"
    ), shown.stderr
    missing = trainjob(cluster, "tensorboard", "no-such-job", "-n", followed.namespace)
    assert missing.returncode == 1, missing
    assert missing.stderr == (
        f"trainjob tensorboard: TrainJob no-such-job not found in namespace {followed.namespace}\n"
    ), missing.stderr
