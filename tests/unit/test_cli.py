"""The `trainjob` command as users run it: a real subprocess of `python -m trainjob`."""

from __future__ import annotations

import pathlib
import subprocess
import sys

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
