"""The generated reference (docs/content/reference/) is current and complete.

Current: docs/generate_reference.py --check finds no stale page. Complete: each set is read
here from its source on its own (not through the generator's walk) and every member must be
named on its page, so a new CRD field, CLI flag, chart value, operator setting, metric, reason,
exit code, config key or environment variable without documentation fails with its name.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from docs import generate_reference as gen
from trainjob import cli
from trainjob.core import constants, policy_terms, reasons, tfjob_status
from trainjob.core import status as st
from trainjob.runtime import configuration, exitcodes

pytestmark = pytest.mark.unit

ROOT: Final = Path(__file__).resolve().parents[2]
PAGES: Final = ROOT / "docs" / "content" / "reference"
REGENERATE: Final = "run .venv/bin/python docs/generate_reference.py"


def page(name: str) -> str:
    return (PAGES / name).read_text(encoding="utf-8")


def missing_from(text: str, names: list[str]) -> list[str]:
    return [name for name in names if name not in text]


# ----- current -----
@pytest.mark.parametrize("hash_seed", ["0", "1"])
def test_check_mode_finds_no_stale_page(hash_seed: str) -> None:
    """Two hash seeds: no page depends on the order a set or a dict of strings iterates in."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONHASHSEED": hash_seed},
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_check_mode_names_a_stale_page(tmp_path: Path) -> None:
    pages = gen.render_all()
    for name, text in pages.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert gen.stale_pages(pages, tmp_path) == []
    (tmp_path / "helm-values.md").write_text(pages["helm-values.md"] + "edited by hand\n")
    (tmp_path / "events.md").unlink()
    assert gen.stale_pages(pages, tmp_path) == ["helm-values.md", "events.md"]


# ----- complete: CRDs -----
def crd_paths(
    schema: Mapping[str, Any], prefix: str = "", stop: frozenset[str] = frozenset()
) -> Iterator[str]:
    """Every field path below `schema`: properties (a.b), map values with fields of their own
    (a.<key>.b), list items' fields (a[].b)."""
    for name, child in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}".lstrip(".")
        yield path
        if path not in stop:
            yield from crd_paths(child, path, stop)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra.get("properties"):
        yield f"{prefix}.<key>"
        yield from crd_paths(extra, f"{prefix}.<key>", stop)
    items = schema.get("items")
    if isinstance(items, dict):
        yield from crd_paths(items, f"{prefix}[]", stop)


def crd_schema(path: Path) -> Mapping[str, Any]:
    crd = yaml.safe_load(path.read_text())
    schema: Mapping[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_every_trainjob_field_and_rule_is_on_its_page() -> None:
    schema = crd_schema(ROOT / "crds" / "trainjobs.trainjob.dev.yaml")
    paths = list(crd_paths(schema))
    assert "spec.replicaSpecs.worker.template.spec.containers[].ports[].containerPort" in paths
    assert "spec.checkpoint.credentialsSecret" in paths
    text = page("trainjob-api.md")
    assert missing_from(text, [f"| `{p}` |" for p in paths]) == []
    rules = re.findall(
        r"message: \"(.*)\"", (ROOT / "crds" / "trainjobs.trainjob.dev.yaml").read_text()
    )
    assert len(rules) >= 20
    assert missing_from(text, [gen.text(m) for m in rules]) == []


def test_every_tfjob_field_above_the_pod_template_is_on_its_page() -> None:
    schema = crd_schema(ROOT / "crds" / "kubeflow" / "kubeflow.org_tfjobs.yaml")
    paths = list(crd_paths(schema, stop=frozenset({"spec.tfReplicaSpecs.<key>.template"})))
    assert "spec.runPolicy.schedulingPolicy.queue" in paths
    text = page("tfjob-api.md")
    assert missing_from(text, [f"| `{p}` |" for p in paths]) == []
    assert "](../guides/tfjob.md#what-is-different-on-purpose)" in text


# ----- complete: the CLI -----
def flags(parser: argparse.ArgumentParser, command: str) -> Iterator[tuple[str, str]]:
    """(command, option or positional) of a parser and its sub-commands, hidden ones left out."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from flags(sub, f"{command} {name}")
        elif action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
            for option in action.option_strings or [str(action.metavar or action.dest)]:
                yield command, str(option)


def sections(text: str) -> dict[str, str]:
    """A page's sections by their heading's code span (`trainjob run` -> its text)."""
    found: dict[str, str] = {}
    for chunk in re.split(r"\n(?=#+ )", text):
        heading = re.match(r"#+ `([^`]+)`", chunk)
        if heading:
            found[heading[1]] = chunk
    return found


def test_every_command_and_flag_is_on_the_cli_page() -> None:
    from trainjob.runtime import entry

    found = list(flags(cli.build_parser(), "trainjob"))
    found += list(flags(entry.train_parser(), "trainjob train"))
    found += list(flags(entry.data_parser(), "trainjob data"))
    assert ("trainjob submit", "--follow") in found
    assert ("trainjob data prepare", "--data-dir") in found
    by_command = sections(page("cli.md"))
    commands = {command for command, _ in found} - {"trainjob"}
    assert sorted(commands - set(by_command)) == []
    top = page("cli.md").split("## Commands")[0]
    not_named = [
        f"{command} {option}"
        for command, option in found
        if f"`{option}`" not in (top if command == "trainjob" else by_command[command])
    ]
    assert not_named == []


# ----- complete: the chart -----
def leaves(values: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def test_every_chart_value_is_on_its_page_with_its_comment() -> None:
    values_text = (ROOT / "helm" / "trainjob-operator" / "values.yaml").read_text()
    paths = list(leaves(yaml.safe_load(values_text)))
    assert "progress.tls.rotate" in paths
    text = page("helm-values.md")
    assert missing_from(text, [f"| `{p}` |" for p in paths]) == []
    # The comment above a value is its meaning, e.g. leaderElection.leaseDurationSeconds's.
    row = next(
        line for line in text.splitlines() if "`leaderElection.leaseDurationSeconds`" in line
    )
    assert "| `15` |" in row and "Seconds a standby waits" in row


# ----- complete: the operator -----
def test_every_operator_flag_variable_and_metric_is_on_its_page() -> None:
    from trainjob_operator import config

    text = page("operator.md")
    options = [
        option
        for action in config.parser()._actions
        if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction)
        for option in action.option_strings
    ]
    assert missing_from(text, [f"`{o}`" for o in options]) == []
    variables = [v for k, v in vars(config).items() if k.startswith("ENV_") and isinstance(v, str)]
    assert "TRAINJOB_TFJOB_MODE" in variables
    assert missing_from(text, [f"| `{v}` |" for v in variables]) == []
    declared = [
        name for path in (ROOT / "operator").rglob("*.py") for name in metrics_declared(path)
    ]
    assert {"jobs_created", "progress_reports", "reconcile_duration_seconds"} <= set(declared)
    assert missing_from(text, [f"`trainjob_{name}" for name in declared]) == []


def metrics_declared(path: Path) -> Iterator[str]:
    """Names given to prometheus_client's Counter/Gauge/Histogram/Summary (or the operator's
    own `counter(...)` helper) as literals."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("counter", "Counter", "Gauge", "Histogram", "Summary"):
                yield str(node.args[0].value)


# ----- complete: reasons -----
def reason_constants() -> dict[str, str]:
    """Every reason constant the engine, the status model and the TFJob door define."""
    found: dict[str, str] = {}
    for module in (policy_terms, st, tfjob_status, reasons):
        for key, value in vars(module).items():
            if re.match(r"^(TFJOB_)?REASON_|^EVENT_", key) and isinstance(value, str):
                found[f"{module.__name__}.{key}"] = value
    return found


def test_every_reason_constant_is_in_the_registry_and_on_the_page() -> None:
    registered = {
        r.name
        for r in (
            *reasons.TRAINJOB_REASONS,
            *reasons.EVENT_REASONS,
            *reasons.TFJOB_CONDITION_REASONS,
            *reasons.TFJOB_EVENT_REASONS,
        )
    }
    constants_found = reason_constants()
    assert "trainjob.core.policy_terms.REASON_BACKOFF" in constants_found
    unregistered = {k: v for k, v in constants_found.items() if v not in registered}
    assert unregistered == {}, (
        "add each to trainjob/core/reasons.py, saying when it is given; then " + REGENERATE
    )
    text = page("events.md")
    assert missing_from(text, sorted(f"| `{name}` |" for name in registered)) == []


def event_calls_with_a_literal_reason(path: Path) -> Iterator[str]:
    """`draft.event("Warning", "Literal", ...)` or `Event("Normal", "Literal", ...)`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or len(node.args) < 2:
            continue
        name = (
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        )
        reason = node.args[1]
        if (
            name in ("event", "Event")
            and isinstance(reason, ast.Constant)
            and isinstance(reason.value, str)
        ):
            yield f"{path.relative_to(ROOT)}:{node.lineno}: {reason.value!r}"


def test_no_event_is_made_with_a_reason_the_registry_does_not_name() -> None:
    files = sorted((ROOT / "trainjob" / "core").glob("*.py"))
    files += sorted((ROOT / "operator" / "trainjob_operator").glob("*.py"))
    literal = [hit for path in files for hit in event_calls_with_a_literal_reason(path)]
    assert literal == [], "use a constant of trainjob/core/reasons.py (and document it there)"


# ----- complete: the runtime -----
def test_every_exit_code_is_on_the_runtime_page() -> None:
    text = page("runtime.md")
    rows = [f"| `{number}` | `{kind.value}` |" for kind, number in exitcodes.EXIT_CODES.items()]
    assert set(exitcodes.FailureKind) == set(exitcodes.EXIT_CODES)
    assert missing_from(text, rows) == []
    assert "| `192` | `StorageUnreachable` | retried |" in text


def config_keys_read(path: Path) -> Iterator[str]:
    """Literal keys of `<...>config.get("key", ...)`, `get_int("key", ...)`, `get_float(...)`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if not node.args or not isinstance(node.args[0], ast.Constant):
            continue
        owner = ast.unparse(node.func.value)
        if (node.func.attr == "get" and owner.endswith("config") and "tf_config" not in owner) or (
            node.func.attr in ("get_int", "get_float")
        ):
            yield str(node.args[0].value)


def environment_read(path: Path) -> Iterator[str]:
    """Literal names of `env.get("X")`, `environ.get("X")`, `env.setdefault("X", ...)`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("get", "setdefault")
            and re.search(r"env(iron)?$", ast.unparse(node.func.value))
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and node.args[0].value.isupper()
        ):
            yield node.args[0].value


def test_every_config_key_and_variable_the_runtime_reads_is_registered_and_on_the_page() -> None:
    runtime = sorted((ROOT / "trainjob" / "runtime").glob("*.py"))
    keys = {key for path in runtime for key in config_keys_read(path)}
    assert {"preemption_grace_seconds", "batch_size"} <= keys
    registered_keys = {k.name for k in configuration.CONFIG_KEYS}
    assert sorted(keys - registered_keys) == [], "add to trainjob/runtime/configuration.py"
    variables = {name for path in runtime for name in environment_read(path)}
    variables |= {
        v for k, v in vars(constants).items() if k.startswith("ENV_") and isinstance(v, str)
    }
    assert {"AWS_REGION", "TRAINJOB_CHECKPOINT_DIR", "GRPC_FAIL_FAST"} <= variables
    registered_variables = {v.name for v in configuration.ENVIRONMENT}
    assert sorted(variables - registered_variables) == [], (
        "add to trainjob/runtime/configuration.py"
    )
    text = page("runtime.md")
    assert missing_from(text, [f"| `{k}` |" for k in sorted(registered_keys)]) == []
    assert missing_from(text, [f"| `{v}` |" for v in sorted(registered_variables)]) == []
