"""The cluster commands of `trainjob`: submit, get, describe, logs --cluster, wait, delete and
attach, with kubectl's conventions (--kubeconfig, --context, -n/--namespace from the context,
-A, -o wide|json|yaml). `trainjob.cli` adds these parsers and calls these handlers.

Every API call goes through `trainjob.cluster.api`; its `ClusterError` becomes a `CliError`
here (one line naming the cause). Following a job draws the same live table and final summary
as `trainjob run`, from the job's status (`show.snapshot`, `show.summary`); Ctrl-C detaches.

Kept whole (about 550 lines, a third of them help text and parsers): it is the edge of the
cluster verbs, each a parser beside a thin command over `api`, `show` and `describe`, and all
share the connection, the flags and the error handling (`connected`, `add_cluster_flags`).
It is split by verb when the verbs now being added (`tensorboard`) have landed, not under
them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final

from trainjob.cliutil import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_TIMEOUT,
    CliError,
    Streams,
    dump,
    dump_all,
    load_documents,
    parse_job,
    source_name,
)
from trainjob.cluster import board, code, describe, objects, show
from trainjob.cluster.errors import INSTALL_HINT, ClusterError
from trainjob.core import constants
from trainjob.local import logfilter, outcome, view
from trainjob.local.terminal import Terminal

if TYPE_CHECKING:  # imported when a command runs: it imports the kubernetes package
    from trainjob.cluster import api

POLL_SECONDS: Final = 1.0  # how often attach and wait read the job again
KIND: Final = f"trainjob.{constants.GROUP}"  # how kubectl names the resource in its messages
WAIT_FOR: Final = show.WAIT_FOR

SUBMIT_DESCRIPTION: Final = """\
Create the TrainJobs of FILE on the cluster, or apply FILE to jobs that exist (their spec,
labels and annotations are replaced; status is kept). --follow then shows the live table and
final summary of `trainjob run` for the job."""
SUBMIT_EXAMPLES: Final = """\
  trainjob submit -f examples/mnist-multiworker.yaml
  trainjob submit -f job.yaml -n team-a --follow
  trainjob convert -f tfjob.yaml | trainjob submit -f -"""
GET_DESCRIPTION: Final = """\
List TrainJobs (the columns of `kubectl get tj`), or print them as YAML or JSON."""
GET_EXAMPLES: Final = """\
  trainjob get
  trainjob get mnist -o yaml
  trainjob get -A -o wide"""
DESCRIBE_DESCRIPTION: Final = """\
Show a TrainJob's state, cause, progress, conditions, replicas with their exit codes and Pods,
and the Events of the job and its Pods."""
DESCRIBE_EXAMPLES: Final = """\
  trainjob describe mnist
  trainjob describe mnist -n team-a --context prod"""
WAIT_DESCRIPTION: Final = """\
Wait until a TrainJob succeeded (default), finished either way, or is running. Exits 0 when
it got there, 1 when the job Failed (unless --for finished), 124 on --timeout."""
WAIT_EXAMPLES: Final = """\
  trainjob wait mnist --timeout 30m
  trainjob wait mnist --for finished && trainjob describe mnist"""
DELETE_DESCRIPTION: Final = "Delete TrainJobs; their Pods and Services go with them."
DELETE_EXAMPLES: Final = "  trainjob delete mnist\n  trainjob delete a b -n team-a"
ATTACH_DESCRIPTION: Final = """\
Follow a TrainJob on the cluster with the live table and final summary of `trainjob run`,
Events printed as they come. Ctrl-C detaches: the job keeps running. Exits as `trainjob run`
does: 0 Succeeded, 1 Failed, 130 detached."""
ATTACH_EXAMPLES: Final = """\
  trainjob attach mnist
  trainjob attach mnist -n team-a --no-tty | tee mnist.txt"""


# ----- parsers -----
def add_cluster_flags(parser: argparse.ArgumentParser, *, all_namespaces: bool = False) -> None:
    group = parser.add_argument_group("cluster (as kubectl)")
    group.add_argument(
        "--kubeconfig", metavar="FILE",
        help="default: $KUBECONFIG (':'-separated files), else ~/.kube/config",
    )  # fmt: skip
    group.add_argument("--context", help="kubeconfig context (default: the current one)")
    group.add_argument("-n", "--namespace", help="default: the context's namespace, else 'default'")
    if all_namespaces:
        group.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")


def _add_no_tty(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-tty", action="store_true", help="plain lines even on a terminal (no live table)"
    )


def add_submit_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "-f", "--file", action="append", required=True, metavar="FILE",
        help="YAML file, or - for stdin (repeat for several files)",
    )  # fmt: skip
    parser.add_argument(
        "--follow", action="store_true", help="then follow the job (one job only), as attach"
    )
    parser.add_argument("-o", "--output", choices=("yaml", "json"), help="print the objects")
    parser.add_argument(
        "--code",
        metavar="DIR",
        help="ship DIR with the job (a ConfigMap on the replicas' PYTHONPATH, 1 MiB at most): "
        "./my_pkg makes `import my_pkg` work, . ships the current directory's contents",
    )
    _add_no_tty(parser)
    add_cluster_flags(parser)
    return parser


def add_get_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("names", nargs="*", metavar="NAME", help="jobs (default: all)")
    parser.add_argument(
        "-o", "--output", choices=("wide", "yaml", "json", "name"),
        help="name: one trainjob.trainjob.dev/NAME per line, as kubectl (scripts, completion)",
    )  # fmt: skip
    add_cluster_flags(parser, all_namespaces=True)
    return parser


def add_name_parser(parser: argparse.ArgumentParser, *, several: bool = False) -> Any:
    parser.add_argument(
        "names" if several else "name", nargs="+" if several else None, metavar="NAME"
    )
    add_cluster_flags(parser)
    return parser


def add_wait_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_name_parser(parser)
    parser.add_argument("--for", dest="wait_for", choices=show.WAIT_FOR, default="succeeded")
    parser.add_argument(
        "--timeout", type=_duration, help="give up after this long (30s, 5m, 1h; default: never)"
    )
    return parser


def add_attach_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_name_parser(parser)
    _add_no_tty(parser)
    return parser


def add_cluster_log_flags(parser: argparse.ArgumentParser) -> None:
    """The flags `trainjob logs` takes for a cluster job (next to the local ones)."""
    parser.add_argument(
        "--cluster", action="store_true",
        help="read the job's Pod logs on the cluster (implied by -n, --context, --kubeconfig, "
        "--previous, --tail, or a JOB that is no local run)",
    )  # fmt: skip
    parser.add_argument(
        "--previous", action="store_true", help="cluster: the previous container's log"
    )
    parser.add_argument("--tail", type=int, metavar="N", help="cluster: the last N lines")
    parser.add_argument(
        "-v", "--verbose", action="store_true",
        help="cluster: keep TensorFlow's routine messages (filtered out by default)",
    )  # fmt: skip
    add_cluster_flags(parser)


def _duration(text: str) -> float:
    try:
        return objects.parse_duration(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


# ----- helpers -----
def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def load_api() -> Any:
    """`trainjob.cluster.api`, or ClusterError saying how to install the kubernetes package."""
    try:
        from trainjob.cluster import api
    except ImportError as error:
        raise ClusterError(
            f"talking to a cluster needs the kubernetes package ({error}): {INSTALL_HINT}"
        ) from error
    return api


@contextlib.contextmanager
def connected(args: argparse.Namespace) -> Iterator[api.Cluster]:
    """The cluster the flags name; a ClusterError (or a spec the view cannot read) ends the
    command with one line naming the cause."""
    cluster: api.Cluster | None = None
    try:
        cluster_api = load_api()
        cluster = cluster_api.Cluster(
            cluster_api.connect(args.kubeconfig, args.context, args.namespace)
        )
        yield cluster
    except (ClusterError, objects.ShowError) as error:
        raise CliError(str(error), EXIT_FAILED) from error
    finally:
        if cluster is not None:
            cluster.close()


def _manifests(args: argparse.Namespace, streams: Streams) -> list[dict[str, Any]]:
    bodies = []
    for path in args.file:
        name = source_name(path)
        for document in load_documents(path, streams.stdin):
            parse_job(document, name, require_images=False)  # every problem, before any call
            bodies.append(objects.submittable(document))
    return bodies


def read_code(directory: str, cwd: str) -> dict[str, bytes]:
    """The files `--code DIR` ships, by path under code.CODE_DIR: DIR under its own name, or
    the contents of the current directory. Sizes are checked before anything is read."""
    if not os.path.isdir(directory):
        raise CliError(f"--code {directory}: not a directory")
    root = os.path.realpath(directory)
    prefix = "" if root == os.path.realpath(cwd) else os.path.basename(root)
    found: dict[str, str] = {}
    for here, dirs, names in os.walk(root):

        def relative(name: str, here: str = here) -> str:
            return os.path.relpath(os.path.join(here, name), root).replace(os.sep, "/")

        dirs[:] = sorted(d for d in dirs if code.wanted(relative(d)))
        for name in names:
            full = os.path.join(here, name)
            if code.wanted(relative(name)) and os.path.isfile(full):
                found["/".join(p for p in (prefix, relative(name)) if p)] = full
    total = sum(os.path.getsize(full) for full in found.values())
    if total > code.MAX_BYTES:  # before reading: `--code .` may sit on gigabytes of data
        raise CliError(code.too_large(directory, total, len(found)))
    files = {}
    for path, full in found.items():
        with open(full, "rb") as handle:
            files[path] = handle.read()
    return files


# ----- commands -----
def cmd_submit(args: argparse.Namespace, streams: Streams) -> int:
    bodies = _manifests(args, streams)
    if args.follow and len(bodies) != 1:
        raise CliError(f"--follow follows one TrainJob; the files hold {len(bodies)}")
    files = read_code(args.code, os.getcwd()) if args.code else None
    results = []
    with connected(args) as cluster:
        for body in bodies:
            namespace = (body.get("metadata") or {}).get("namespace")
            if namespace and args.namespace and namespace != args.namespace:
                raise CliError(
                    f"TrainJob {objects.name_of(body)}: metadata.namespace is {namespace}, but "
                    f"--namespace says {args.namespace}"
                )
            target = cluster.in_namespace(namespace or cluster.namespace)
            if files is None:
                result, verb = target.apply_job(body)
            else:
                result, verb = apply_with_code(target, body, args.code, files)
            results.append(result)
            if args.output is None:
                streams.out.write(f"{KIND}/{objects.name_of(result)} {verb}\n")
        if args.output is not None and len(results) == 1:
            dump(results[0], streams.out, args.output)
        elif args.output is not None:
            dump_all(results, streams.out, args.output)
        if args.follow:
            follower = cluster.in_namespace(objects.namespace_of(results[0]))
            return follow(follower, objects.name_of(results[0]), streams, args.no_tty)
    return EXIT_OK


def apply_with_code(
    cluster: api.Cluster,
    body: dict[str, Any],
    source: str,
    files: dict[str, bytes],
    *,
    apply: bool = True,
) -> tuple[dict[str, Any], str]:
    """The code's ConfigMap first (the Pods mount it), then the job (created, or with `apply`
    given this spec if it exists), then the ConfigMap owned by the job (deleted with it); a
    job that could not be submitted takes its new ConfigMap away again."""
    name = objects.name_of(body)
    try:
        config_map, items = code.bundle(name, cluster.namespace, source, files)
    except code.CodeError as error:
        raise CliError(str(error)) from error
    if not apply and _exists(cluster, name):  # before its ConfigMap is touched
        raise ClusterError(f"TrainJob {cluster.namespace}/{name} already exists", 409)
    cluster.apply_config_map(config_map)
    shipped = code.with_code(body, code.config_map_name(name), items)
    try:
        if apply:
            result, verb = cluster.apply_job(shipped)
        else:
            result, verb = cluster.create_job(shipped), "created"
    except ClusterError:
        cluster.delete_config_map(code.config_map_name(name))
        raise
    owned = code.owned_by(config_map, result)
    cluster.own_config_map(code.config_map_name(name), owned["metadata"]["ownerReferences"])
    return result, verb


def _exists(cluster: api.Cluster, name: str) -> bool:
    try:
        cluster.get_job(name)
    except ClusterError as error:
        if error.status == 404:
            return False
        raise
    return True


def cmd_get(args: argparse.Namespace, streams: Streams) -> int:
    with connected(args) as cluster:
        if args.names:
            if args.all_namespaces:
                raise CliError("a name cannot be given with -A (names are per namespace)")
            jobs = [cluster.get_job(name) for name in args.names]
        else:
            jobs = cluster.list_jobs(args.all_namespaces)
    if args.output == "name":
        streams.out.writelines(f"{KIND}/{objects.name_of(job)}\n" for job in jobs)
        return EXIT_OK
    if args.output in ("yaml", "json"):
        if len(args.names) == 1:
            dump(jobs[0], streams.out, args.output)
        else:
            dump_all(jobs, streams.out, args.output)
        return EXIT_OK
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"{cluster.namespace} namespace"
        streams.err.write(f"No TrainJobs found in {where}.\n")
        return EXIT_OK
    lines = show.jobs_table(
        jobs, _now(), all_namespaces=args.all_namespaces, wide=args.output == "wide"
    )
    streams.out.write("\n".join(lines) + "\n")
    return EXIT_OK


def cmd_describe(args: argparse.Namespace, streams: Streams) -> int:
    with connected(args) as cluster:
        job = cluster.get_job(args.name)
        pods = describe.order_pods(cluster.pods(args.name))
        events = describe.sort_events(
            cluster.events([args.name, *(objects.name_of(p) for p in pods)])
        )
        streams.out.write(describe.describe_text(job, pods, events, _now()))
    return EXIT_OK


def cmd_delete(args: argparse.Namespace, streams: Streams) -> int:
    with connected(args) as cluster:
        for name in args.names:
            cluster.delete_job(name)
            streams.out.write(f'{KIND} "{name}" deleted\n')
    return EXIT_OK


def wait_for(
    read: Callable[[], dict[str, Any]],
    wait_for_state: str,
    timeout: float | None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, dict[str, Any]]:
    """Read the job until `show.wait_outcome` decides, or `timeout` seconds have passed:
    (exit code, the job as last read)."""
    deadline = None if timeout is None else clock() + timeout
    while True:
        job = read()
        decided = show.wait_outcome(job, wait_for_state)
        if decided is not None:
            return decided, job
        if deadline is not None and clock() >= deadline:
            return EXIT_TIMEOUT, job
        left = POLL_SECONDS if deadline is None else min(POLL_SECONDS, deadline - clock())
        sleep(max(0.0, left))


def cmd_wait(args: argparse.Namespace, streams: Streams) -> int:
    with connected(args) as cluster:
        code, job = wait_for(lambda: cluster.get_job(args.name), args.wait_for, args.timeout)
    status = objects.status_of(job)
    state = (job.get("status") or {}).get("state") or "Pending"
    message = show.state_message(status)
    detail = f" ({message})" if message else ""
    if code == EXIT_TIMEOUT:
        streams.err.write(
            f"trainjob wait: timed out after {args.timeout:g}s waiting for TrainJob "
            f"{args.name} to be {args.wait_for}; it is {state}{detail}\n"
        )
    else:
        streams.out.write(f"TrainJob {args.name} {state}{detail}\n")
    return code


def cmd_attach(args: argparse.Namespace, streams: Streams) -> int:
    with connected(args) as cluster:
        return follow(cluster, args.name, streams, args.no_tty)


def _showing(snapshot: view.Snapshot) -> Callable[[], view.Snapshot]:
    """The terminal asks for the state to draw when it draws; here it is already read."""
    return lambda: snapshot


def follow(cluster: api.Cluster, name: str, streams: Streams, no_tty: bool) -> int:
    """The live table (on a TTY) or one line per Event and progress report, until the job
    ends; then the summary of `trainjob run`. Ctrl-C detaches and says how to attach again."""
    out = streams.out
    tty = out.isatty() and not no_tty and os.environ.get("TERM") != "dumb"
    color = tty and not os.environ.get("NO_COLOR")
    terminal = Terminal(out, tty=tty, color=color)
    seen: set[tuple[str, int]] = set()
    last_progress: str | None = None
    job = cluster.get_job(name)
    try:
        while True:
            now = _now()
            for event in describe.sort_events(cluster.events([name])):
                if show.event_key(event) not in seen:
                    seen.add(show.event_key(event))
                    terminal.emit(show.event_lines([event])[0])
            report = objects.report_of(job.get("status"))
            text = None if report is None else view.progress_line(report)
            if text != last_progress and text is not None and not tty:
                terminal.emit(f"progress: {text}")
            last_progress = text
            terminal.draw(_showing(show.snapshot(job, now)), force=True)
            if objects.finished(job):
                break
            time.sleep(POLL_SECONDS)
            job = cluster.get_job(name)
    except KeyboardInterrupt:
        terminal.erase()
        out.write("\n" + show.attach_hint(job))
        out.flush()
        return EXIT_SIGINT
    terminal.erase()
    summary = show.summary(job, cluster.pods(name), _now())
    out.write(view.summary_text(summary, color=color))
    out.flush()
    return outcome.command_exit_code(summary)


# ----- logs -----
def wants_cluster(args: argparse.Namespace, cwd: str, runs_dir: str) -> bool:
    """Whether `trainjob logs` means a cluster job: --cluster or a cluster-only flag, or a
    first argument that is neither a local run (a directory, or a name under ./trainjob-runs)
    nor a replica name (`trainjob logs worker-1` reads the only local run)."""
    if args.cluster or args.namespace or args.context or args.kubeconfig:
        return True
    if args.previous or args.tail is not None:
        return True
    if not args.targets:
        return False
    target = args.targets[0]
    if show.replica_key(target) is not None:  # `trainjob logs worker-1`: the only local run's
        return False
    return not (os.path.isdir(target) or os.path.isdir(os.path.join(cwd, runs_dir, target)))


def cmd_cluster_logs(args: argparse.Namespace, streams: Streams) -> int:
    if not args.targets or len(args.targets) > 2:
        raise CliError("give the job, and optionally a replica: trainjob logs JOB [worker-0]")
    request = describe.LogRequest(*args.targets)
    with connected(args) as cluster:
        cluster.get_job(request.job)  # a missing job is named as such, not as "no Pods"
        if args.follow:
            return _follow_logs(cluster, request, args, streams)
        pods = [p for p in describe.order_pods(cluster.pods(request.job)) if request.wants(p)]
        if not pods:
            which = f"replica {request.replica}" if request.replica else "any replica"
            raise CliError(
                f"TrainJob {request.job} has no Pod for {which} now (Pods are removed when "
                "the job is cleaned up, per runPolicy.cleanPodPolicy)",
                EXIT_FAILED,
            )
        width = max(len(objects.pod_label(p)) for p in pods)
        missing = []
        for pod in pods:
            replica = objects.pod_label(pod)
            unavailable = describe.log_unavailable(pod)
            if unavailable is not None and not args.previous:
                missing.append(f"no log for {replica}: {unavailable}")
                continue
            try:
                text = cluster.pod_log(objects.name_of(pod), previous=args.previous, tail=args.tail)
            except ClusterError as error:
                missing.append(f"no log for {replica}: {error.message}")
                continue
            for line in filtered(text.splitlines(), args.verbose):
                streams.out.write(view.log_line(replica, line, width) + "\n")
    for note in missing:
        streams.err.write(f"trainjob logs: {note}\n")
    if missing and len(missing) == len(pods):
        return EXIT_FAILED
    return EXIT_OK


def filtered(lines: list[str], verbose: bool) -> Iterator[str]:
    """A replica's lines without TensorFlow's routine noise (unless verbose), as `trainjob run`
    shows them."""
    state = logfilter.FilterState()
    for line in lines:
        shown, state = logfilter.filter_line(line, state, verbose=verbose, stopping=False)
        if shown is not None:
            yield shown


def _follow_logs(
    cluster: api.Cluster, request: describe.LogRequest, args: argparse.Namespace, streams: Streams
) -> int:
    states: dict[str, logfilter.FilterState] = {}
    labels: dict[str, str] = {}
    width = len("worker-0")
    try:
        for pod_name, line in cluster.follow_logs(request.job, args.tail):
            if pod_name not in labels:
                pods = {objects.name_of(p): p for p in cluster.pods(request.job)}
                labels[pod_name] = (
                    objects.pod_label(pods[pod_name]) if pod_name in pods else pod_name
                )
                width = max(width, len(labels[pod_name]))
            replica = labels[pod_name]
            if request.replica is not None and replica != request.replica:
                continue
            if line.startswith(describe.NOTE_PREFIX):
                streams.err.write(
                    f"trainjob logs: {replica}: {line[len(describe.NOTE_PREFIX) :]}\n"
                )
                continue
            shown, states[pod_name] = logfilter.filter_line(
                line, states.get(pod_name, logfilter.FilterState()),
                verbose=args.verbose, stopping=False,
            )  # fmt: skip
            if shown is not None:
                streams.out.write(view.log_line(replica, shown, width) + "\n")
                streams.out.flush()
    except KeyboardInterrupt:
        return EXIT_SIGINT
    return EXIT_OK


# ----- tensorboard -----
TENSORBOARD_START_SECONDS: Final = 180.0  # image on the node, TensorFlow's import: ~10-30 s
TENSORBOARD_POLL_SECONDS: Final = 0.5


def wants_cluster_tensorboard(args: argparse.Namespace, cwd: str, runs_dir: str) -> bool:
    """Whether `trainjob tensorboard` means a cluster job: --cluster or a cluster-only flag,
    or a JOB that is no local run (a directory, or a name under ./trainjob-runs)."""
    if args.cluster or args.namespace or args.context or args.kubeconfig or args.image:
        return True
    if args.job is None:
        return False
    return not (os.path.isdir(args.job) or os.path.isdir(os.path.join(cwd, runs_dir, args.job)))


def cmd_cluster_tensorboard(args: argparse.Namespace, streams: Streams) -> int:
    """A TensorBoard Pod on the job's checkpoint volume, reached through a port-forward, until
    Ctrl-C; the Pod is deleted however the command ends."""
    import secrets

    if args.job is None:
        raise CliError("give the job: trainjob tensorboard JOB")
    with connected(args) as cluster:
        job = cluster.get_job(args.job)
        try:
            body = board.tensorboard_pod(job, secrets.token_hex(3), args.image)
        except board.BoardError as error:
            raise CliError(str(error), EXIT_FAILED) from error
        pods = load_api().Pods(cluster)
        name = objects.name_of(body)
        forwarder = None
        # The handlers first: a signal that comes while the Pod is being created still
        # deletes it (a 404 then is fine).
        with _signals_interrupt():
            try:
                pods.create(body)
                _wait_started(pods, cluster, name)
                forwarder = pods.forward(name, board.PORT, args.address, args.port)
                url = f"http://{forwarder.address}:{forwarder.port}/"
                _wait_serving(pods, forwarder, name, url)
                streams.out.write(
                    f"TensorBoard for TrainJob {cluster.namespace}/{args.job} (Pod {name}): "
                    f"{url}\nCtrl-C stops it and deletes the Pod.\n"
                )
                streams.out.flush()
                while True:
                    pod = pods.read(name)
                    problem = "it was deleted" if pod is None else board.failure(pod)
                    if problem is not None:
                        raise CliError(f"TensorBoard Pod {name} stopped: {problem}", EXIT_FAILED)
                    time.sleep(TENSORBOARD_POLL_SECONDS)
            except KeyboardInterrupt:
                streams.out.write(f"Stopped TensorBoard; deleted Pod {name}.\n")
                return EXIT_OK
            finally:
                if forwarder is not None:
                    forwarder.close()
                with contextlib.suppress(ClusterError):
                    pods.delete(name)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP end the command as Ctrl-C does, so the Pod is deleted then too."""
    import signal
    import threading

    def interrupt(signum: int, frame: object) -> None:
        del signum, frame
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _wait_started(pods: Any, cluster: api.Cluster, name: str) -> None:
    """Until TensorBoard's container runs; CliError with the kubelet's or scheduler's words
    when it cannot (image, volume, refused) or does not in time."""
    deadline = time.monotonic() + TENSORBOARD_START_SECONDS
    while True:
        pod = pods.read(name)
        if pod is None:
            raise CliError(f"TensorBoard Pod {name} was deleted before it started", EXIT_FAILED)
        problem = board.failure(pod)
        if problem is not None:
            raise CliError(f"TensorBoard Pod {name} cannot start: {problem}", EXIT_FAILED)
        if board.started(pod):
            return
        if time.monotonic() > deadline:
            why = board.waiting_reason(pod, describe.sort_events(cluster.events([name])))
            raise CliError(
                f"TensorBoard Pod {name} did not start in {TENSORBOARD_START_SECONDS:.0f}s: {why}",
                EXIT_FAILED,
            )
        time.sleep(TENSORBOARD_POLL_SECONDS)


def _wait_serving(pods: Any, forwarder: Any, name: str, url: str) -> None:
    """Until TensorBoard answers through the port-forward (it imports TensorFlow first)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + TENSORBOARD_START_SECONDS
    last = "no answer yet"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError) as error:
            last = str(getattr(error, "reason", error))
        while not forwarder.errors.empty():
            last = forwarder.errors.get()
        pod = pods.read(name)
        problem = "it was deleted" if pod is None else board.failure(pod)
        if problem is not None:
            raise CliError(f"TensorBoard Pod {name} stopped: {problem}", EXIT_FAILED)
        if time.monotonic() > deadline:
            raise CliError(
                f"TensorBoard in Pod {name} did not answer in {TENSORBOARD_START_SECONDS:.0f}s: "
                f"{last}",
                EXIT_FAILED,
            )
        time.sleep(TENSORBOARD_POLL_SECONDS)
