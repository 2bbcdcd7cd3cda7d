"""The `trainjob` command. This module is the edge: it reads files and prints; every decision is
made by the pure core. Training and local execution are imported lazily, so `validate` and
`render` never pay for TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

from trainjob.core import constants, convert, render, spec


def _read_documents(path: str) -> list[Any]:
    """Every YAML document of a file (`-` is stdin), empty documents dropped."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except OSError as error:
        raise SystemExit(f"trainjob: cannot read {path}: {error.strerror}") from error
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise SystemExit(f"trainjob: {path} is not valid YAML: {error}") from error


def _trainjobs(path: str) -> list[Any]:
    documents = _read_documents(path)
    if not documents:
        raise SystemExit(f"trainjob: {path} holds no YAML document")
    return documents


def cmd_validate(args: argparse.Namespace, out: TextIO) -> int:
    exit_code = 0
    for number, document in enumerate(_trainjobs(args.file), start=1):
        label = _document_label(document, number)
        problems = spec.problems_of(document)
        if problems:
            exit_code = 1
            for problem in problems:
                out.write(f"{args.file}: {label}: {problem}\n")
        else:
            out.write(f"{args.file}: {label}: valid\n")
    return exit_code


def _document_label(document: Any, number: int) -> str:
    if isinstance(document, dict):
        name = (document.get("metadata") or {}).get("name")
        if isinstance(name, str):
            return f"TrainJob {name}"
    return f"document {number}"


def _parse_or_exit(document: Any, path: str) -> spec.TrainJob:
    try:
        return spec.parse(document)
    except spec.SpecError as error:
        lines = "\n".join(f"{path}: {problem}" for problem in error.problems)
        raise SystemExit(f"{lines}\ntrainjob: {path} is not a valid TrainJob") from error


def cmd_render(args: argparse.Namespace, out: TextIO) -> int:
    manifests: list[dict[str, Any]] = []
    for document in _trainjobs(args.file):
        job = _parse_or_exit(document, args.file)
        namespace = args.namespace or job.namespace or "default"
        owner = render.Owner(job.name, job.uid) if job.uid else None
        options = render.RenderOptions(
            namespace=namespace, cluster_domain=args.cluster_domain, default_image=args.image
        )
        manifests.extend(render.render_all(job, options, owner))
    out.write(
        "# Rendered by `trainjob render`: the Services and Pods the operator creates.\n"
        "# ownerReferences are added when metadata.uid is known (on the cluster).\n"
    )
    yaml.safe_dump_all(manifests, out, sort_keys=False, default_flow_style=False)
    return 0


def cmd_convert(args: argparse.Namespace, out: TextIO) -> int:
    results: list[dict[str, Any]] = []
    for document in _trainjobs(args.file):
        if not isinstance(document, dict):
            raise SystemExit(f"trainjob: {args.file}: expected a TFJob object")
        try:
            conversion = convert.convert_tfjob(document)
        except convert.ConvertError as error:
            raise SystemExit(f"trainjob: {args.file}: {error}") from error
        for note in conversion.notes:
            sys.stderr.write(f"note: {note}\n")
        problems = spec.problems_of(conversion.trainjob)
        if problems:
            details = "\n".join(f"  {p}" for p in problems)
            raise SystemExit(f"trainjob: the converted TrainJob is not valid:\n{details}")
        results.append(conversion.trainjob)
    yaml.safe_dump_all(results, out, sort_keys=False, default_flow_style=False)
    return 0


def _delegate(module: str, function: str, argv: Sequence[str]) -> int:
    """Hand the rest of the command line to a module that imports TensorFlow lazily."""
    import importlib

    target = getattr(importlib.import_module(module), function)
    result: int = target(list(argv))
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainjob",
        description="Run TensorFlow multi-worker training as a TrainJob, on Kubernetes or locally.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    validate = commands.add_parser(
        "validate", help="check TrainJob manifests; one line per problem, naming the field"
    )
    validate.add_argument("-f", "--file", required=True, help="YAML file, or - for stdin")

    render_cmd = commands.add_parser(
        "render", help="print the Pods and Services the operator would create (dry run)"
    )
    render_cmd.add_argument("-f", "--file", required=True, help="YAML file, or - for stdin")
    render_cmd.add_argument("--namespace", help="default: metadata.namespace, else 'default'")
    render_cmd.add_argument(
        "--cluster-domain",
        default=constants.DEFAULT_CLUSTER_DOMAIN,
        help="appended to <svc>.<ns>.svc in TF_CONFIG hosts (e.g. cluster.local)",
    )
    render_cmd.add_argument("--image", help="image for replicas that set none")

    convert_cmd = commands.add_parser(
        "convert", help="turn a Kubeflow TFJob (kubeflow.org/v1) into a TrainJob"
    )
    convert_cmd.add_argument("-f", "--file", required=True, help="YAML file, or - for stdin")

    commands.add_parser(
        "train", help="run one replica's training (inside a pod or process)", add_help=False
    )
    commands.add_parser(
        "data", help="prepare datasets offline (trainjob data prepare mnist)", add_help=False
    )
    commands.add_parser("run", help="run a TrainJob locally as processes", add_help=False)
    return parser


_DELEGATED = {
    "train": ("trainjob.runtime.entry", "train_main"),
    "data": ("trainjob.runtime.entry", "data_main"),
    "run": ("trainjob.local.cli", "run_main"),
}


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments and arguments[0] in _DELEGATED:
        module, function = _DELEGATED[arguments[0]]
        return _delegate(module, function, arguments[1:])
    args = build_parser().parse_args(arguments)
    stream = out or sys.stdout
    handlers = {"validate": cmd_validate, "render": cmd_render, "convert": cmd_convert}
    return handlers[args.command](args, stream)
