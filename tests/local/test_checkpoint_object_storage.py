"""`trainjob run` with its checkpoints on a real S3 server (versitygw, built from its Go
module): the replicas restore from and upload to the bucket with the shell's credentials, and
`--dry-run` says where they write and refuses a location the runtime cannot write."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane import objectstore

from .conftest import REPO_ROOT, cli_env, finish_run, read_events, write_job

pytestmark = [pytest.mark.training, pytest.mark.timeout(180)]

EXAMPLE = REPO_ROOT / "examples" / "mnist-multiworker.yaml"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[objectstore.S3Server]:
    with objectstore.s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server


def _job(path: str) -> dict[str, Any]:
    manifest = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    manifest["spec"]["runtime"]["config"].update(epochs=2, steps_per_epoch=10)
    manifest["spec"]["checkpoint"] = {"path": path}
    return dict(manifest)


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    log = cwd / "out.log"
    with open(log, "wb") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "trainjob", "run", *args],
            cwd=str(cwd),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return finish_run(run, log, timeout)


def test_dry_run_refuses_a_scheme_the_runtime_cannot_write(tmp_path: Path) -> None:
    write_job(tmp_path / "job.yaml", _job("hdfs://namenode/ckpt"))
    code, out = _run(["-f", "job.yaml", "--dry-run"], tmp_path, cli_env(), 60)
    assert code != 0, out
    assert "spec.checkpoint.path" in out and "scheme 'hdfs' is not supported" in out, out
    assert "Traceback" not in out


def test_trainjob_run_checkpoints_to_s3(tmp_path: Path, s3: objectstore.S3Server) -> None:
    bucket = s3.make_bucket("local-run")
    url = f"s3://{bucket}/mnist"
    write_job(tmp_path / "job.yaml", _job(url))
    env = {**cli_env(), **s3.env()}
    code, out = _run(["-f", "job.yaml", "--dry-run"], tmp_path, env, 60)
    assert code == 0, out
    assert f"checkpoints:    {url}" in out, out
    assert f"write their checkpoints to {url} from the run's own network" in out, out

    args = ["-f", "job.yaml", "--run-dir", "run", "--host-network"]
    code, out = _run(args, tmp_path, env, 170)
    assert code == 0, out
    assert "TrainJob mnist-multiworker Succeeded" in out
    keys = s3.keys(bucket, "mnist/")
    assert "mnist/export/saved_model.pb" in keys and "mnist/export.complete" in keys, keys
    ends = [e for e in read_events(tmp_path / "run") if e["event"] == "end"]
    assert any(e.get("export") == f"{url}/export" for e in ends), ends
    # Nothing was written beside the run: the checkpoints live in the bucket only.
    assert not (tmp_path / "run" / "checkpoints").exists()
    assert not list(tmp_path.glob("s3:*"))
