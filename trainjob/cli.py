"""The `trainjob` command. This module is the edge: it parses the command line, reads files and
prints; every decision is made by the pure core. Training and local execution are imported
lazily, so `validate` and `render` never pay for TensorFlow.

Every user mistake ends in one line on stderr naming the file or field, never a traceback, with
the exit codes of `EXIT_CODES_HELP`. About 500 lines, whole: the parser with its help and the
offline commands (validate, render, convert, completion); the local and cluster commands live
in `trainjob.local.cli` and the `trainjob.cluster.cli` package.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

from trainjob import __version__
from trainjob.cliutil import (
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_SIGINT,
    EXIT_SIGPIPE,
    OUTPUT_FORMATS,
    CliError,
    Streams,
    dump,
    dump_all,
    load_documents,
    parse_job,
    source_name,
)
from trainjob.cluster.cli import common as cluster_common
from trainjob.cluster.cli import jobs as cluster_jobs
from trainjob.cluster.cli import logs as cluster_logs
from trainjob.cluster.cli import submit as cluster_submit
from trainjob.cluster.cli import tensorboard as cluster_tensorboard
from trainjob.core import constants, convert, render, spec
from trainjob.local import cli as local_cli
from trainjob.local import plan as local_plan

Handler = Callable[[argparse.Namespace, Streams], int]


def _files(args: argparse.Namespace) -> list[str]:
    files: list[str] = args.file or []
    if files.count("-") > 1:
        raise CliError("-f - (stdin) can be given only once")
    return files


# ----- commands -----
def _document_label(document: Any, number: int) -> str:
    if isinstance(document, dict):
        name = (document.get("metadata") or {}).get("name")
        if isinstance(name, str):
            return f"TrainJob {name}"
    return f"document {number}"


def cmd_validate(args: argparse.Namespace, streams: Streams) -> int:
    out = streams.out
    exit_code = EXIT_OK
    results: list[dict[str, Any]] = []
    for path in _files(args):
        name = source_name(path)
        for number, document in enumerate(load_documents(path, streams.stdin), start=1):
            problems = spec.problems_of(document)
            if problems:
                exit_code = EXIT_FAILED
            results.append(
                {
                    "file": name,
                    "document": number,
                    "name": _document_label(document, number).removeprefix("TrainJob "),
                    "valid": not problems,
                    "problems": [{"field": p.path, "message": p.message} for p in problems],
                }
            )
            if args.output is None:
                label = _document_label(document, number)
                for problem in problems:
                    out.write(f"{name}: {label}: {problem}\n")
                if not problems:
                    out.write(f"{name}: {label}: valid\n")
    if args.output is not None:
        dump(results, out, args.output)
    return exit_code


def _namespace(text: str) -> str:
    """--namespace: a DNS-1123 label, as the API server requires of namespace names."""
    if not _DNS_LABEL.match(text) or len(text) > 63:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid namespace name (lower-case letters, digits and '-', "
            "at most 63, starting and ending with a letter or digit)"
        )
    return text


_DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def cmd_render(args: argparse.Namespace, streams: Streams) -> int:
    out = streams.out
    manifests: list[dict[str, Any]] = []
    for path in _files(args):
        name = source_name(path)
        for document in load_documents(path, streams.stdin):
            job = parse_job(document, name)
            namespace = args.namespace or job.namespace or "default"
            owner = render.Owner(job.name, job.uid) if job.uid else None
            options = render.RenderOptions(
                namespace=namespace, cluster_domain=args.cluster_domain, default_image=args.image
            )
            manifests.extend(render.render_all(job, options, owner))
    if args.output == "json":
        dump_all(manifests, out, "json")
        return EXIT_OK
    out.write(
        "# Rendered by `trainjob render`: the Services and Pods the operator creates.\n"
        "# ownerReferences are added when metadata.uid is known (on the cluster).\n"
    )
    dump_all(manifests, out, "yaml")
    return EXIT_OK


def cmd_convert(args: argparse.Namespace, streams: Streams) -> int:
    results: list[dict[str, Any]] = []
    for path in _files(args):
        name = source_name(path)
        for document in load_documents(path, streams.stdin):
            if not isinstance(document, dict):
                raise CliError(f"{name}: expected a TFJob object, got {type(document).__name__}")
            try:
                conversion = convert.convert_tfjob(document)
            except convert.ConvertError as error:
                raise CliError(f"{name}: {error}") from error
            for note in conversion.notes:
                streams.err.write(f"note: {note}\n")
            problems = spec.problems_of(conversion.trainjob)
            if problems:
                details = "\n".join(f"  {p}" for p in problems)
                raise CliError(f"{name}: the converted TrainJob is not valid:\n{details}")
            results.append(conversion.trainjob)
    dump_all(results, streams.out, args.output or "yaml")
    return EXIT_OK


LOGS_CLUSTER_DESCRIPTION: Final = """\
On a cluster (--cluster, implied by -n/--context/--kubeconfig/--previous/--tail or by a JOB
that is no local run): every replica's Pod log, prefixed with the replica, TensorFlow's
routine messages filtered out unless --verbose; -f follows across restarts and new Pods
until the job ends."""
LOGS_CLUSTER_EXAMPLES: Final = """\
  trainjob logs mnist --cluster -n team-a
  trainjob logs mnist worker-1 --cluster --previous --tail 50
  trainjob logs mnist --cluster -f
  trainjob logs tfjob/mnist worker-0        # a TFJob the TrainJob operator serves"""


def cmd_logs(args: argparse.Namespace, streams: Streams) -> int:
    """A local run's logs, or a cluster job's (see LOGS_CLUSTER_DESCRIPTION)."""
    if cluster_logs.wants_cluster(args, os.getcwd(), local_plan.DEFAULT_RUNS_DIR):
        return cluster_logs.cmd_cluster_logs(args, streams)
    if args.verbose:
        raise CliError("--verbose applies to cluster logs; a local run's log files hold everything")
    return local_cli.cmd_logs(args, streams)


TENSORBOARD_DESCRIPTION: Final = """\
Serve a job's TensorBoard logs (Keras' own, the runtime's progress scalars, an Estimator's
model_dir: everything under its checkpoint directory) and print the URL; Ctrl-C stops it.
Locally (JOB a run dir or a run under ./trainjob-runs, or none: the only run there),
TensorBoard runs on this machine. On a cluster (--cluster, implied by -n/--context/
--kubeconfig/--image or by a JOB that is no local run), a short-lived TensorBoard Pod mounts
the job's checkpoint volume read-only (for tfjob/NAME, every PersistentVolumeClaim its
tensorflow containers mount, at /logs/<their mount path>) and is reached through a
port-forward; the Pod is deleted when the command ends. Works while the job runs and after it
finished."""
TENSORBOARD_EXAMPLES: Final = """\
  trainjob tensorboard mnist-multiworker           # a local run, or the cluster job
  trainjob tensorboard mnist -n team-a --port 6006
  trainjob tensorboard tfjob/mnist                 # a TFJob the TrainJob operator serves
  trainjob tensorboard /tmp/run1 --address 0.0.0.0"""


def cmd_tensorboard(args: argparse.Namespace, streams: Streams) -> int:
    if cluster_tensorboard.wants_cluster_tensorboard(
        args, os.getcwd(), local_plan.DEFAULT_RUNS_DIR
    ):
        return cluster_tensorboard.cmd_cluster_tensorboard(args, streams)
    return local_cli.cmd_tensorboard(args, streams)


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535; 0: any free port)")
    return port


def _add_tensorboard_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "job", nargs="?", metavar="JOB",
        help="a local run (dir or name) or a cluster job (tfjob/NAME: a TFJob); default: the "
        "only local run",
    )  # fmt: skip
    parser.add_argument(
        "--port", type=_port,
        help="local port (default: 6006 if free, else any free one; 0: any free one)",
    )  # fmt: skip
    parser.add_argument(
        "--address", default="127.0.0.1",
        help="local address to listen on (default 127.0.0.1; 0.0.0.0: every interface)",
    )  # fmt: skip
    parser.add_argument(
        "--cluster", action="store_true", help="JOB is a cluster job (even if a run has its name)"
    )
    parser.add_argument(
        "--image",
        help="cluster: the image of the TensorBoard Pod (default: the job's; it must have "
        "TensorBoard, as the trainjob image does)",
    )
    cluster_common.add_cluster_flags(parser)


def _add_cluster_commands(commands: Any) -> None:
    """submit, get, describe, wait, delete, attach: TrainJobs on a cluster, as kubectl."""
    cluster_submit.add_submit_parser(
        _sub(
            commands,
            "submit",
            "create (or apply) TrainJobs on the cluster; --follow shows them run",
            cluster_submit.SUBMIT_DESCRIPTION,
            cluster_submit.SUBMIT_EXAMPLES,
        )
    ).set_defaults(handler=cluster_submit.cmd_submit)
    cluster_jobs.add_get_parser(
        _sub(
            commands,
            "get",
            "list TrainJobs on the cluster (kubectl get tj)",
            cluster_jobs.GET_DESCRIPTION,
            cluster_jobs.GET_EXAMPLES,
        )
    ).set_defaults(handler=cluster_jobs.cmd_get)
    cluster_common.add_name_parser(
        _sub(
            commands,
            "describe",
            "conditions, replicas, exit codes, cause, progress and Events of a cluster job",
            cluster_jobs.DESCRIBE_DESCRIPTION,
            cluster_jobs.DESCRIBE_EXAMPLES,
        )
    ).set_defaults(handler=cluster_jobs.cmd_describe)
    cluster_jobs.add_wait_parser(
        _sub(
            commands,
            "wait",
            "wait for a cluster job to succeed, finish or run; the exit code says how it went",
            cluster_jobs.WAIT_DESCRIPTION,
            cluster_jobs.WAIT_EXAMPLES,
        )
    ).set_defaults(handler=cluster_jobs.cmd_wait)
    cluster_common.add_name_parser(
        _sub(
            commands,
            "delete",
            "delete TrainJobs from the cluster",
            cluster_jobs.DELETE_DESCRIPTION,
            cluster_jobs.DELETE_EXAMPLES,
        ),
        several=True,
    ).set_defaults(handler=cluster_jobs.cmd_delete)
    cluster_submit.add_attach_parser(
        _sub(
            commands,
            "attach",
            "follow a cluster job: the live table and summary of trainjob run",
            cluster_submit.ATTACH_DESCRIPTION,
            cluster_submit.ATTACH_EXAMPLES,
        )
    ).set_defaults(handler=cluster_submit.cmd_attach)


def cmd_completion(args: argparse.Namespace, streams: Streams) -> int:
    streams.out.write(completion_script(build_parser(), args.shell))
    return EXIT_OK


# ----- completion -----
# The verbs whose first argument is a cluster job's name (completed from `get -o name`).
NAMED_VERBS: Final = ("get", "describe", "wait", "attach", "delete", "tensorboard")
# How long a Tab waits for the cluster's job names: a stuck API server must not hold the
# shell for the commands' 30 s default (a --request-timeout typed on the line wins).
COMPLETION_REQUEST_TIMEOUT: Final = "5s"


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """A bash completion script (zsh loads it through bashcompinit) for every command's flags;
    `-f`, `--run-dir` and `--data-dir` complete file names."""
    commands: dict[str, list[str]] = {}
    for action in parser._actions:  # argparse has no public API to walk sub-commands
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                commands[name] = sorted(
                    option for act in sub._actions for option in act.option_strings
                )
    top = sorted(option for act in parser._actions for option in act.option_strings)
    cases = "\n".join(
        f'    {name}) opts="{" ".join(options)}" ;;' for name, options in commands.items()
    )
    script = f"""# trainjob shell completion ({shell}); load it with:
#   source <(trainjob completion {shell})
_trainjob() {{
  local cur prev cmd opts
  cur="${{COMP_WORDS[COMP_CWORD]}}"
  prev="${{COMP_WORDS[COMP_CWORD-1]}}"
  cmd="${{COMP_WORDS[1]}}"
  case "$prev" in
    -f|--file|--run-dir|--data-dir|--kubeconfig) COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --for) COMPREPLY=($(compgen -W "{" ".join(cluster_jobs.WAIT_FOR)}" -- "$cur")); return ;;
    -o|--output) COMPREPLY=($(compgen -W "{" ".join(OUTPUT_FORMATS)} wide" -- "$cur")); return ;;
  esac
  if [[ $COMP_CWORD -eq 1 ]]; then
    COMPREPLY=($(compgen -W "{" ".join(commands)} {" ".join(top)}" -- "$cur")); return
  fi
  case "$cmd" in
    {"|".join(NAMED_VERBS)})
      if [[ "$cur" != -* ]]; then
        # Job names from the cluster, with this command line's -n/--context/--kubeconfig.
        local i where=(--request-timeout {COMPLETION_REQUEST_TIMEOUT})
        for ((i = 2; i < COMP_CWORD; i++)); do
          case "${{COMP_WORDS[i]}}" in
            -n|--namespace|--context|--kubeconfig|--request-timeout)
              where+=("${{COMP_WORDS[i]}}" "${{COMP_WORDS[i+1]}}") ;;
            -A|--all-namespaces) where+=(-A) ;;
          esac
        done
        local names
        # A TrainJob by its name, a TFJob as tfjob/NAME (as every command takes them).
        names="$(trainjob get -o name "${{where[@]}}" 2>/dev/null \\
          | sed -e 's|^tfjob\\.kubeflow\\.org/|tfjob/|' -e 's|^[^/]*\\.trainjob\\.dev/||')"
        COMPREPLY=($(compgen -W "$names" -- "$cur"))
        return
      fi ;;
  esac
  case "$cmd" in
{cases}
    *) opts="" ;;
  esac
  if [[ "$cmd" == completion ]]; then opts="bash zsh"; fi
  COMPREPLY=($(compgen -W "$opts" -- "$cur"))
  if [[ ${{#COMPREPLY[@]}} -eq 0 ]]; then COMPREPLY=($(compgen -f -- "$cur")); fi
}}
complete -o filenames -F _trainjob trainjob
"""
    if shell == "zsh":
        script = "autoload -Uz bashcompinit && bashcompinit\n" + script
    return script


# ----- the parser -----
def _formatter(prog: str) -> argparse.HelpFormatter:
    return argparse.RawDescriptionHelpFormatter(prog, max_help_position=30)


def _add_file(parser: argparse.ArgumentParser, *, several: bool) -> None:
    parser.add_argument(
        "-f",
        "--file",
        action="append",
        required=True,
        metavar="FILE",
        help="YAML file, or - for stdin" + (" (repeat for several files)" if several else ""),
    )


def _add_output(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "-o", "--output", choices=OUTPUT_FORMATS, help=f"print {what} as YAML or JSON"
    )


def _sub(
    commands: Any, name: str, summary: str, description: str, examples: str
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog=f"examples:\n{examples}\n\n{EXIT_CODES_HELP}",
        formatter_class=_formatter,
    )
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainjob",
        description=(
            "Run TensorFlow multi-worker training as a TrainJob: on Kubernetes (the operator) "
            "or on this machine (trainjob run)."
        ),
        epilog=(
            "examples:\n"
            "  trainjob run -f examples/mnist-multiworker.yaml\n"
            "  trainjob status\n"
            "  trainjob submit -f examples/mnist-multiworker.yaml -n team-a --follow\n"
            "  trainjob render -f examples/mnist-multiworker.yaml | kubectl apply --dry-run=client -f -\n"  # noqa: E501
            "  source <(trainjob completion bash)\n\n" + EXIT_CODES_HELP
        ),
        formatter_class=_formatter,
    )
    parser.add_argument("--version", action="version", version=f"trainjob {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    local_cli.add_run_parser(
        _sub(
            commands,
            "run",
            "run a TrainJob on this machine, one process per replica",
            local_cli.RUN_DESCRIPTION,
            local_cli.RUN_EXAMPLES,
        )
    ).set_defaults(handler=local_cli.cmd_run)
    local_cli.add_status_parser(
        _sub(
            commands,
            "status",
            "show the state of local runs (trainjob run)",
            local_cli.STATUS_DESCRIPTION,
            local_cli.STATUS_EXAMPLES,
        )
    ).set_defaults(handler=local_cli.cmd_status)
    logs = local_cli.add_logs_parser(
        _sub(
            commands,
            "logs",
            "print (or follow) the replica logs of a local run or a cluster job",
            local_cli.LOGS_DESCRIPTION + "\n\n" + LOGS_CLUSTER_DESCRIPTION,
            local_cli.LOGS_EXAMPLES + "\n" + LOGS_CLUSTER_EXAMPLES,
        )
    )
    cluster_logs.add_cluster_log_flags(logs)
    logs.set_defaults(handler=cmd_logs)
    _add_cluster_commands(commands)
    tensorboard = _sub(
        commands,
        "tensorboard",
        "serve a local run's or a cluster job's TensorBoard logs; prints the URL",
        TENSORBOARD_DESCRIPTION,
        TENSORBOARD_EXAMPLES,
    )
    _add_tensorboard_parser(tensorboard)
    tensorboard.set_defaults(handler=cmd_tensorboard)

    validate = _sub(
        commands,
        "validate",
        "check TrainJob manifests; one line per problem, naming the field",
        "Check TrainJob manifests with the same rules as the CRD and the operator. Prints one\n"
        "line per document (`valid`) or per problem, naming the field.",
        "  trainjob validate -f examples/mnist-multiworker.yaml\n"
        "  trainjob validate -f a.yaml -f b.yaml -o json\n"
        "  trainjob convert -f tfjob.yaml | trainjob validate -f -",
    )
    _add_file(validate, several=True)
    _add_output(validate, "the results")
    validate.set_defaults(handler=cmd_validate)

    render_cmd = _sub(
        commands,
        "render",
        "print the Pods and Services the operator would create (dry run)",
        "Print, as multi-document YAML (or a JSON List), the headless Services and Pods the\n"
        "operator creates for each TrainJob, with their TF_CONFIG.",
        "  trainjob render -f examples/mnist-multiworker.yaml --namespace team-a\n"
        "  trainjob render -f job.yaml -o json | jq '.items[].metadata.name'",
    )
    _add_file(render_cmd, several=True)
    _add_output(render_cmd, "the manifests")
    render_cmd.add_argument(
        "--namespace", type=_namespace, help="default: metadata.namespace, else 'default'"
    )
    render_cmd.add_argument(
        "--cluster-domain",
        default=constants.DEFAULT_CLUSTER_DOMAIN,
        help="appended to <svc>.<ns>.svc in TF_CONFIG hosts (e.g. cluster.local)",
    )
    render_cmd.add_argument("--image", help="image for replicas that set none")
    render_cmd.set_defaults(handler=cmd_render)

    convert_cmd = _sub(
        commands,
        "convert",
        "turn a Kubeflow TFJob (kubeflow.org/v1) into a TrainJob",
        "Turn Kubeflow TFJobs (kubeflow.org/v1) into equivalent TrainJobs; notes on stderr say\n"
        "what differs.",
        "  trainjob convert -f tfjob.yaml > trainjob.yaml\n"
        "  trainjob convert -f tfjob.yaml | trainjob run -f -",
    )
    _add_file(convert_cmd, several=True)
    _add_output(convert_cmd, "the TrainJobs")
    convert_cmd.set_defaults(handler=cmd_convert)

    completion = _sub(
        commands,
        "completion",
        "print a shell completion script (bash or zsh)",
        "Print a completion script for the `trainjob` command.",
        "  source <(trainjob completion bash)            # this shell\n"
        "  trainjob completion bash > ~/.local/share/bash-completion/completions/trainjob\n"
        "  source <(trainjob completion zsh)             # zsh",
    )
    completion.add_argument("shell", choices=("bash", "zsh"))
    completion.set_defaults(handler=cmd_completion)

    commands.add_parser(
        "train", help="run one replica's training (inside a pod or process)", add_help=False
    )
    commands.add_parser(
        "data", help="prepare datasets offline (trainjob data prepare mnist)", add_help=False
    )
    return parser


_DELEGATED: Final = {
    "train": ("trainjob.runtime.entry", "train_main"),
    "data": ("trainjob.runtime.entry", "data_main"),
}


def _delegate(module: str, function: str, argv: Sequence[str]) -> int:
    """Hand the rest of the command line to a module that imports TensorFlow lazily."""
    import importlib

    target = getattr(importlib.import_module(module), function)
    result: int = target(list(argv))
    return result


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush is quiet."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(
    argv: Sequence[str] | None = None,
    out: TextIO | None = None,
    stdin: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] in _DELEGATED:
        module, function = _DELEGATED[arguments[0]]
        return _delegate(module, function, arguments[1:])
    errors = err or sys.stderr
    try:
        args = build_parser().parse_args(arguments)
        handler: Handler = args.handler
        return handler(args, Streams(out or sys.stdout, stdin or sys.stdin, errors))
    except CliError as error:
        command = arguments[0] if arguments and not arguments[0].startswith("-") else ""
        errors.write(f"trainjob {command}: {error.message}\n".replace("trainjob : ", "trainjob: "))
        return error.code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_SIGPIPE
    except KeyboardInterrupt:
        errors.write("\n")
        return EXIT_SIGINT
