"""The operator serves every TrainJob whatever the moment of its start-up it appears at.

Regression test of the stall where an operator started with a namespace glob never served a
TrainJob created in a new matching namespace (kopf's namespace observation ignores its watch's
own first listing, so a namespace created between kopf's initial namespace list and the start
of that watch was never served). Many start-ups, each under CPU load (busy processes), each
with matching namespaces created at a steady pace from the moment the process starts until
well after it serves, plus matching namespaces deleted and one left Terminating meanwhile;
every job in a namespace that exists at the end must be served (its status written).

`TRAINJOB_STARTUP_RUNS` sets the number of start-ups (default 100; they run a few at a time).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.integration.operator_harness import GROUP, PLURAL, VERSION, Operator, trainjob

pytestmark = pytest.mark.integration

RUNS: Final = int(os.environ.get("TRAINJOB_STARTUP_RUNS", "100"))
AT_ONCE: Final = 4  # start-ups running side by side
BUSY: Final = 3  # busy processes loading both cores meanwhile
CREATE_EVERY: Final = 0.25  # seconds between two new matching namespaces of a start-up
CREATE_FOR: Final = 6.0  # seconds after the operator process starts
SERVE_WITHIN: Final = 45.0  # seconds after the last namespace was created
HOLD: Final = "trainjob.dev/test-hold"  # a finalizer that keeps a namespace Terminating
RUN_LABEL: Final = "trainjob.dev/test-startup-run"


@contextlib.contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` processes spinning on a core each; they stop with the block (or after 30 min)."""
    code = "import time\nend = time.monotonic() + 1800\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)


def _namespace(core: k8s.CoreV1Api, name: str, run: str) -> None:
    core.create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={RUN_LABEL: run}))
    )


def _job(custom: k8s.CustomObjectsApi, namespace: str, name: str, run: str) -> None:
    body = trainjob(name, chief=0, workers=1)
    body["metadata"]["labels"] = {RUN_LABEL: run}
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def _served(custom: k8s.CustomObjectsApi, run: str) -> dict[str, bool]:
    """Every TrainJob of this start-up: namespace -> whether the operator wrote its status."""
    listing = custom.list_cluster_custom_object(
        GROUP, VERSION, PLURAL, label_selector=f"{RUN_LABEL}={run}"
    )
    return {
        job["metadata"]["namespace"]: bool((job.get("status") or {}).get("conditions"))
        for job in listing["items"]
    }


class StartUp:
    """One operator start-up with namespaces and jobs appearing all along."""

    def __init__(self, api: k8s.ApiClient, kubeconfig: Path, log: Path, index: int) -> None:
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.kubeconfig = kubeconfig
        self.log = log
        self.run = f"{index}-{uuid.uuid4().hex[:5]}"
        self.prefix = f"su-{self.run}"
        self.namespaces: list[str] = []

    def _add(self, suffix: str) -> str:
        name = f"{self.prefix}-{suffix}"
        _namespace(self.core, name, self.run)
        self.namespaces.append(name)
        _job(self.custom, name, "job", self.run)
        return name

    def __call__(self) -> list[str]:
        """Returns the namespaces whose job was not served (the misses)."""
        # Before the start: a served namespace, one deleted during start-up, and one left
        # Terminating by a finalizer on its content.
        self._add("before")
        doomed = self._add("doomed")
        held = f"{self.prefix}-held"
        _namespace(self.core, held, self.run)
        self.namespaces.append(held)
        self.core.create_namespaced_config_map(
            held, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="hold", finalizers=[HOLD]))
        )
        self.core.delete_namespace(held)
        operator = Operator(self.kubeconfig, self.log, f"--namespace={self.prefix}-*").start()
        try:
            started = time.monotonic()
            count = 0
            while time.monotonic() - started < CREATE_FOR:
                self._add(f"n{count}")
                count += 1
                if count == 4:
                    self.core.delete_namespace(doomed)
                time.sleep(CREATE_EVERY)
            deadline = time.monotonic() + SERVE_WITHIN
            while True:
                served = _served(self.custom, self.run)
                missed = sorted(ns for ns, ok in served.items() if not ok and ns != doomed)
                if not missed or time.monotonic() > deadline or not operator.running():
                    break
                time.sleep(0.5)
            if missed:
                print(f"start-up {self.run}: not served {missed}; log {self.log}\n")
                print(operator.log_tail(40))
            return missed
        finally:
            operator.stop()
            self.clean_up()

    def clean_up(self) -> None:
        with contextlib.suppress(ApiException):
            self.core.patch_namespaced_config_map(
                "hold", f"{self.prefix}-held", {"metadata": {"finalizers": None}}
            )
        for name in self.namespaces:
            with contextlib.suppress(ApiException):
                self.core.delete_namespace(name)


def test_every_job_is_served_whenever_it_appears_during_start_up(
    api_client: k8s.ApiClient, kubeconfig: Path, tmp_path: Path
) -> None:
    misses: dict[str, list[str]] = {}
    with (
        busy_processes(BUSY),
        concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool,
    ):
        runs = {
            pool.submit(StartUp(api_client, kubeconfig, tmp_path / f"op-{i}.log", i)): i
            for i in range(RUNS)
        }
        for future in concurrent.futures.as_completed(runs):
            missed = future.result()
            if missed:
                misses[str(runs[future])] = missed
    print(f"{RUNS} start-ups, {len(misses)} with a job never served")
    assert not misses, f"{len(misses)} of {RUNS} start-ups left jobs unserved: {misses}"
