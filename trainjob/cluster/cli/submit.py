"""`trainjob submit` (with `--code`) and `trainjob attach`, and `follow`, which both use: the
live table (on a TTY) or one line per Event and progress report, then the final summary of
`trainjob run`, drawn from the job's status (`show.snapshot`, `show.summary`); Ctrl-C detaches."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from trainjob.cliutil import (
    EXIT_OK,
    EXIT_SIGINT,
    CliError,
    Streams,
    dump,
    dump_all,
    load_documents,
    parse_job,
    source_name,
)
from trainjob.cluster import code, describe, objects, show
from trainjob.cluster.cli.common import (
    KIND,
    POLL_SECONDS,
    add_cluster_flags,
    add_name_parser,
    add_no_tty,
    connected,
    utc_now,
)
from trainjob.cluster.errors import ClusterError
from trainjob.console import outcome, view
from trainjob.console.terminal import Terminal

if TYPE_CHECKING:  # imported when a command runs: it imports the kubernetes package
    from trainjob.cluster import api

SUBMIT_DESCRIPTION: Final = """\
Create the TrainJobs of FILE on the cluster, or apply FILE to jobs that exist (their spec,
labels and annotations are replaced; status is kept). --follow then shows the live table and
final summary of `trainjob run` for the job."""

SUBMIT_EXAMPLES: Final = """\
  trainjob submit -f examples/mnist-multiworker.yaml
  trainjob submit -f job.yaml -n team-a --follow
  trainjob convert -f tfjob.yaml | trainjob submit -f -"""

ATTACH_DESCRIPTION: Final = """\
Follow a TrainJob (or tfjob/NAME) on the cluster with the live table and final summary of
`trainjob run`, Events printed as they come. Ctrl-C detaches: the job keeps running. Exits as
`trainjob run` does: 0 Succeeded, 1 Failed, 130 detached."""

ATTACH_EXAMPLES: Final = """\
  trainjob attach mnist
  trainjob attach mnist -n team-a --no-tty | tee mnist.txt
  trainjob attach tfjob/mnist"""


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
    add_no_tty(parser)
    add_cluster_flags(parser)
    return parser


def add_attach_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_name_parser(parser)
    add_no_tty(parser)
    return parser


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
    said: list[str] = []  # the messages of the Events printed
    told: tuple[str, str] | None = None  # the hold last explained (reason, message)
    last_progress: str | None = None
    job = cluster.get_job(name)
    try:
        while True:
            now = utc_now()
            for event in describe.sort_events(cluster.events([objects.name_of(job)])):
                if show.event_key(event) not in seen:
                    seen.add(show.event_key(event))
                    said.append(str(event.get("message") or ""))
                    terminal.emit(show.event_lines([event])[0])
            hold = objects.hold_of(job)
            if hold is not None and (hold.reason, hold.message) != told:
                told = (hold.reason, hold.message)
                for line in show.hold_lines(hold, said):
                    terminal.emit(line)
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
    summary = show.summary(job, cluster.pods(name), utc_now())
    out.write(view.summary_text(summary, color=color))
    out.flush()
    return outcome.command_exit_code(summary)
