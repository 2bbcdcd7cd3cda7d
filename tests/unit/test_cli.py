"""The `trainjob` command as users run it: a real subprocess of `python -m trainjob`."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import time

import yaml

ROOT = pathlib.Path(__file__).parents[2]


def trainjob(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainjob", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_validate_accepts_every_example() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        result = trainjob("validate", "-f", str(path))
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.strip().endswith("valid")


def test_validate_prints_one_line_per_problem_naming_the_field_and_exits_1() -> None:
    bad = """
apiVersion: trainjob.dev/v1alpha1
kind: TrainJob
metadata: {name: bad}
spec:
  image: i
  replicaSpecs:
    worker: {replicas: -2, restartPolicy: Sometimes}
"""
    result = trainjob("validate", "-f", "-", stdin=bad)
    assert result.returncode == 1
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "spec.replicaSpecs.worker.replicas: must be >= 0, got -2" in lines[0]
    assert "spec.replicaSpecs.worker.restartPolicy" in lines[1]


def test_validate_reports_unreadable_and_non_yaml_input() -> None:
    missing = trainjob("validate", "-f", "no-such-file.yaml")
    assert missing.returncode != 0 and "cannot read no-such-file.yaml" in missing.stderr
    broken = trainjob("validate", "-f", "-", stdin="spec: [unclosed")
    assert broken.returncode != 0 and "not valid YAML" in broken.stderr


def test_render_prints_services_and_pods_as_multi_document_yaml() -> None:
    result = trainjob(
        "render",
        "-f",
        "examples/mnist-multiworker.yaml",
        "--namespace",
        "ml",
        "--cluster-domain",
        "cluster.local",
    )
    assert result.returncode == 0, result.stderr
    documents = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in documents] == ["Service", "Service", "Pod", "Pod"]
    env = {e["name"]: e["value"] for e in documents[3]["spec"]["containers"][0]["env"]}
    assert "mnist-multiworker-worker-0.ml.svc.cluster.local:2222" in env["TF_CONFIG"]


def test_render_refuses_an_invalid_job() -> None:
    result = trainjob("render", "-f", "tests/corpus/invalid/chief-replicas-two.yaml")
    assert result.returncode != 0
    assert "spec.replicaSpecs.chief.replicas" in result.stderr


def test_convert_reads_stdin_and_prints_a_valid_trainjob() -> None:
    tfjob = (ROOT / "tests/corpus/tfjob/dist-mnist.yaml").read_text()
    result = trainjob("convert", "-f", "-", stdin=tfjob)
    assert result.returncode == 0, result.stderr
    assert "note: runPolicy.backoffLimit" in result.stderr
    converted = yaml.safe_load(result.stdout)
    assert converted["apiVersion"] == "trainjob.dev/v1alpha1"
    check = trainjob("validate", "-f", "-", stdin=result.stdout)
    assert check.returncode == 0, check.stdout


# ----- bad input: one line naming the cause, never a traceback -----
JOB = """\
apiVersion: trainjob.dev/v1alpha1
kind: TrainJob
metadata: {name: ok}
spec:
  image: i
  replicaSpecs:
    worker: {replicas: 2}
"""


def _no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr


def test_binary_and_non_utf8_files_are_refused_in_every_command(tmp_path: pathlib.Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(JOB.replace("name: ok", "name: caf\xe9").encode("latin-1"))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"a: 1\x00\n")
    for command in ("validate", "render", "convert", "run"):
        for path, why in ((latin1, "not UTF-8 text"), (binary, "not UTF-8"), (nul, "binary")):
            result = trainjob(command, "-f", str(path))
            _no_traceback(result)
            assert result.returncode == 2, (command, path, result.stderr)
            assert f"trainjob {command}: cannot read {path}" in result.stderr
            assert why in result.stderr


def test_a_directory_or_missing_file_is_named() -> None:
    result = trainjob("render", "-f", "examples")
    _no_traceback(result)
    assert result.returncode == 2 and "cannot read examples: it is a directory" in result.stderr


def test_duplicate_keys_are_rejected_with_file_and_lines(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(JOB + "    worker: {replicas: 3}\n")
    for command in ("validate", "render", "run"):
        result = trainjob(command, "-f", str(path))
        _no_traceback(result)
        assert result.returncode == 2, result.stderr
        assert f'in "{path}", line 7' in result.stderr
        assert "found duplicate key 'worker' (first at line 7)" in result.stderr
        assert "line 8" in result.stderr


def test_yaml_bombs_are_refused_in_one_line() -> None:
    nested = trainjob("validate", "-f", "-", stdin="[" * 5000 + "]" * 5000)
    assert nested.returncode == 2 and "<stdin> is nested too deeply" in nested.stderr
    _no_traceback(nested)
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
        for p, c in zip("abcdef", "bcdefg", strict=True)
    )
    bomb = trainjob("render", "-f", "-", stdin=laughs)
    assert bomb.returncode == 2, bomb.stderr
    assert "aliases (*name) expand to more than 1,000,000 values" in bomb.stderr


def test_bad_flag_values_are_usage_errors() -> None:
    for args, why in (
        (["render", "-f", "examples/mnist-multiworker.yaml", "--namespace", "Bad NS"], "namespace"),
        (["run", "-f", "examples/mnist-multiworker.yaml", "--max-processes", "0"], "at least 1"),
        (["run", "-f", "examples/mnist-multiworker.yaml", "--run-dir", ""], "must not be empty"),
    ):
        result = trainjob(*args)
        assert result.returncode == 2 and why in result.stderr, (args, result.stderr)
        _no_traceback(result)


def test_yaml_errors_name_the_file_or_stdin() -> None:
    result = trainjob("validate", "-f", "-", stdin="spec: [unclosed")
    assert result.returncode == 2
    assert "<stdin> is not valid YAML" in result.stderr and 'in "<stdin>", line 1' in result.stderr
    assert "<unicode string>" not in result.stderr


def test_several_files_validate_together_and_run_refuses_more_than_one(
    tmp_path: pathlib.Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(JOB.replace("replicas: 2", "replicas: -1"))
    result = trainjob("validate", "-f", "examples/mnist-multiworker.yaml", "-f", str(bad))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "examples/mnist-multiworker.yaml: TrainJob mnist-multiworker: valid"
    assert lines[1].startswith(f"{bad}: TrainJob ok: spec.replicaSpecs.worker.replicas")
    run = trainjob("run", "-f", "examples/mnist-multiworker.yaml", "-f", str(bad))
    _no_traceback(run)
    assert run.returncode == 2 and "give one -f (got 2" in run.stderr


def test_a_tfjob_gets_one_line_pointing_at_convert() -> None:
    result = trainjob("validate", "-f", "tests/corpus/tfjob/dist-mnist.yaml")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 1, lines
    assert "a Kubeflow TFJob; convert it with `trainjob convert -f FILE`" in lines[0]


def test_a_closed_pipe_ends_quietly(tmp_path: pathlib.Path) -> None:
    """`trainjob render ... | head -1`: the reader goes away; no BrokenPipeError traceback.
    The job renders to far more than a pipe holds (64 KiB), so the writer is still writing
    when `head` leaves: with a small job the whole output could fit in the pipe before `head`
    even started (seen under load: exit 0, not 141)."""
    manifest = yaml.safe_load((ROOT / "examples/mnist-parameter-server.yaml").read_text())
    manifest["spec"]["replicaSpecs"]["worker"]["replicas"] = 200
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(manifest))
    shell = subprocess.run(
        f"set -o pipefail; {sys.executable} -m trainjob render -f {big} | head -1",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert shell.stdout.startswith("# Rendered by `trainjob render`")
    assert shell.stderr == ""
    assert shell.returncode == 141


# ----- conventions -----
def test_version_and_help_with_examples_and_exit_codes() -> None:
    version = trainjob("--version")
    assert version.returncode == 0 and version.stdout.strip() == "trainjob 0.1.0"
    for command in ("validate", "render", "convert", "run", "status", "logs", "completion"):
        result = trainjob(command, "--help")
        assert result.returncode == 0, result.stderr
        assert re.search(r"examples:\n  .*trainjob " + command, result.stdout), command
        assert "exit codes:\n  0 " in result.stdout, command


def test_output_formats_are_machine_readable() -> None:
    as_json = trainjob("render", "-f", "examples/mnist-multiworker.yaml", "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    listed = json.loads(as_json.stdout)
    assert listed["kind"] == "List"
    assert [i["kind"] for i in listed["items"]] == ["Service", "Service", "Pod", "Pod"]
    validated = trainjob("validate", "-f", "examples/mnist-multiworker.yaml", "-o", "yaml")
    assert yaml.safe_load(validated.stdout) == [
        {
            "file": "examples/mnist-multiworker.yaml",
            "document": 1,
            "name": "mnist-multiworker",
            "valid": True,
            "problems": [],
        }
    ]
    bad = trainjob("render", "-f", "examples/mnist-multiworker.yaml", "-o", "xml")
    assert bad.returncode == 2 and "invalid choice: 'xml'" in bad.stderr


def test_completion_script_knows_commands_and_flags() -> None:
    result = trainjob("completion", "bash")
    assert result.returncode == 0
    script = result.stdout
    assert "complete -o filenames -F _trainjob trainjob" in script
    assert "run) opts=" in script and "--max-processes" in script and "--rerun" in script
    checked = subprocess.run(
        ["bash", "-n"], input=script, capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr
    assert trainjob("completion", "zsh").stdout.startswith("autoload -Uz bashcompinit")


def test_render_of_a_thousand_replicas_takes_seconds_not_a_minute(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(JOB.replace("replicas: 2", "replicas: 1000"))
    started = time.monotonic()
    result = trainjob("render", "-f", str(path))
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\nkind: Pod\n") == 1000
    assert elapsed < 20, elapsed  # 61 s when TF_CONFIG was rebuilt for every pod
