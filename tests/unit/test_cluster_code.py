"""`trainjob submit --code DIR` as data: which files go, the ConfigMap that carries them, and
the job's templates that mount it on the replicas' PYTHONPATH."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from trainjob.cliutil import CliError
from trainjob.cluster import code
from trainjob.cluster.cli.submit import read_code


def job(templates: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "mnist"},
        "spec": {"replicaSpecs": {t: {"replicas": 1, "template": v} for t, v in templates.items()}},
    }


def test_caches_vcs_folders_and_hidden_files_stay_home() -> None:
    assert code.wanted("my_pkg/train.py")
    assert code.wanted("my_pkg/data/vocab.txt")
    for path in ("my_pkg/__pycache__/x.py", ".git/config", "my_pkg/.env", "my_pkg/x.pyc",
                 ".venv/lib/site.py"):  # fmt: skip
        assert not code.wanted(path), path


def test_the_configmap_carries_each_file_back_to_its_path() -> None:
    files = {"my_pkg/__init__.py": b"", "my_pkg/train.py": b"x = 1\n", "my_pkg/w.bin": b"\xff\x00"}
    config_map, items = code.bundle("mnist", "team-a", "./my_pkg", files)
    assert config_map["metadata"] == {
        "name": "mnist-code",
        "namespace": "team-a",
        "labels": {"trainjob.dev/code-of": "mnist"},
    }
    by_path = {item["path"]: item["key"] for item in items}
    assert set(by_path) == set(files)
    assert config_map["data"][by_path["my_pkg/train.py"]] == "x = 1\n"
    assert base64.b64decode(config_map["binaryData"][by_path["my_pkg/w.bin"]]) == b"\xff\x00"
    for key in by_path.values():  # ConfigMap keys allow only [-._a-zA-Z0-9]
        assert all(c.isalnum() or c in "-._" for c in key), key


def test_paths_that_sanitize_alike_keep_distinct_keys() -> None:
    _, items = code.bundle("j", "ns", ".", {"a/b.py": b"1", "a_b.py": b"2"})
    assert len({item["key"] for item in items}) == 2


def test_an_empty_or_too_large_tree_is_refused_with_the_way_out() -> None:
    with pytest.raises(code.CodeError, match="no files to ship"):
        code.bundle("j", "ns", "./empty", {})
    with pytest.raises(code.CodeError, match=r"1\.5 MiB in 1 files.*FROM the trainjob image"):
        code.bundle("j", "ns", "./big", {"big.bin": b"\0" * (3 * 1024 * 1024 // 2)})


def test_every_replica_mounts_the_code_and_puts_it_first_on_its_pythonpath() -> None:
    body = job(
        {
            "chief": {},  # the operator renders its tensorflow container
            "worker": {
                "spec": {
                    "containers": [
                        {"name": "sidecar", "image": "busybox"},
                        {"name": "tensorflow", "env": [{"name": "PYTHONPATH", "value": "/mine"}]},
                    ]
                }
            },
        }
    )
    items = [{"key": "k", "path": "my_pkg/train.py"}]
    shipped = code.with_code(body, "mnist-code", items)
    assert body["spec"]["replicaSpecs"]["chief"]["template"] == {}  # not changed in place
    chief = shipped["spec"]["replicaSpecs"]["chief"]["template"]["spec"]
    assert chief["volumes"] == [
        {"name": "trainjob-code", "configMap": {"name": "mnist-code", "items": items}}
    ]
    (tf,) = chief["containers"]
    assert tf["name"] == "tensorflow"
    assert tf["volumeMounts"] == [
        {"name": "trainjob-code", "mountPath": code.CODE_DIR, "readOnly": True}
    ]
    assert tf["env"] == [{"name": "PYTHONPATH", "value": code.CODE_DIR}]
    sidecar, worker_tf = shipped["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"]
    assert "volumeMounts" not in sidecar
    assert worker_tf["env"] == [{"name": "PYTHONPATH", "value": f"{code.CODE_DIR}:/mine"}]
    # Submitted again: one volume, one mount, the path once.
    again = code.with_code(shipped, "mnist-code", items)
    assert again == shipped


def test_a_directory_goes_under_its_name_and_the_current_one_as_its_contents(
    tmp_path: Path,
) -> None:
    package = tmp_path / "my_pkg"
    (package / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("def main(): ...\n")
    (package / "__pycache__" / "train.cpython-312.pyc").write_bytes(b"\0")
    assert set(read_code(str(package), str(tmp_path))) == {"my_pkg/__init__.py", "my_pkg/train.py"}
    assert set(read_code(str(tmp_path), str(tmp_path))) == {
        "my_pkg/__init__.py",
        "my_pkg/train.py",
    }
    assert set(read_code(str(package), str(package))) == {"__init__.py", "train.py"}
    with pytest.raises(CliError, match="not a directory"):
        read_code(str(package / "train.py"), str(tmp_path))


def test_a_huge_tree_is_refused_before_it_is_read(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"\0" * (2 * 1024 * 1024))
    with pytest.raises(CliError, match=r"2\.0 MiB in 1 files, more than a ConfigMap holds"):
        read_code(str(tmp_path), str(tmp_path))
