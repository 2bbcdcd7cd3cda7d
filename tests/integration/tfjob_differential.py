"""The TFJob differential test's harness: one corpus manifest, run under one TFJob controller
(Kubeflow's training-operator, or ours with `--tfjob`) on the test control plane, driven by
the manifest's script, observed and normalised so that two controllers' runs compare.

The corpus (tests/corpus/tfjob/):

- `<case>.yaml`: a TFJob, as a user writes it;
- `scripts/<case>.yaml`: what the kubelet (here: the harness) and the user do, step by step:
  ``steps: [{action: run, pods: [worker-0, worker-1]}, {action: exit, pod: worker-0, code: 0}]``
  (pod names are `<replica type>-<index>`: the job's name is prefixed);
- `expected/<case>.json`: the observation under training-operator, recorded by
  ``python -m tests.integration.tfjob_differential --record [CASE...]`` (needs
  `bash bench/kubeflow/install.sh`).

Pods run nowhere: every replica template gets `schedulerName: trainjob-test-no-scheduler`
(the same for both controllers), so no scheduler or kwok touches them, an unbound Pod goes at
once when deleted, and the harness plays the kubelet by patching Pod status, as a kubelet would
for the Pod's own restartPolicy: a container that exits under OnFailure (non-zero) or Always is
restarted in place (restartCount + 1, the Pod stays Running); under Never the Pod ends
Succeeded or Failed. After a retried failure a script runs every Pod of the restarted replica
types again, so that a controller that recreated more Pods than the failed one (ours: the
replicas that fail together) gets them running too, and training-operator sees a no-op.

Each step's action is followed by a wait until the observation settles, and a snapshot:
- recording: until the step's `until` holds (if any) and nothing observed changed for
  RECORD_SETTLE seconds;
- comparing: until the observation equals the golden step (modulo the allowed differences)
  for COMPARE_SETTLE seconds, or nothing changed for COMPARE_QUIET seconds (a difference);
both with a deadline.

The observation: per Pod and Service (first incarnation) the labels, annotations,
ownerReferences and spec (TF_CONFIG parsed; the namespace written `<ns>`); per step the
conditions as (type, status, reason, message) in list order, replicaStatuses, which status
fields are set (startTime, completionTime, ...), what the controller wrote into the TFJob's
metadata, which Pods exist (phase, how many times that name was created), which Services and
(gang cases) the PodGroups; and the trace: every change of the conditions' (type, status,
reason) list as the controller wrote it, from a watch.

Comparing: leaf by leaf, each step by index (the path names the step in words); a difference
matching an entry of ALLOWED (the deliberate differences, each with its reason) is allowed,
any other fails the test with its path and both values.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import fnmatch
import json
import re
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final, cast

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from tests.controlplane.tools import REPO_ROOT
from tests.integration.conftest import create_namespace
from tests.support import kubelet, waits

Obj = dict[str, Any]

CORPUS: Final = REPO_ROOT / "tests" / "corpus" / "tfjob"
SCRIPTS: Final = CORPUS / "scripts"
EXPECTED: Final = CORPUS / "expected"
GROUP: Final = "kubeflow.org"
VERSION: Final = "v1"
PLURAL: Final = "tfjobs"
NO_SCHEDULER: Final = "trainjob-test-no-scheduler"
NAMESPACE_PREFIX: Final = "tfjob-diff"
# The gang cases' namespaces: their controllers run with gang scheduling on.
GANG_NAMESPACE_PREFIX: Final = "tfjob-gang"
PODGROUP: Final = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
KUBEFLOW_LABELS: Final = "training.kubeflow.org/"
TOUCH_ANNOTATION: Final = "tfjob-diff.trainjob.dev/touch"
REFERENCE: Final = "training-operator"
# The test writes each case's observation under ours there (for --diff).
OBSERVED_DIR_ENV: Final = "TRAINJOB_TFJOB_OBSERVED"

RECORD_SETTLE: Final = 2.0
COMPARE_SETTLE: Final = 0.75
COMPARE_QUIET: Final = 3.0
STEP_DEADLINE: Final = 30.0
POLL: Final = 0.1

ACTIONS: Final = (
    "created",
    "run",
    "exit",
    "evict",
    "suspend",
    "resume",
    "touch",
    "patch",
    "wait",
)


class ScriptError(AssertionError):
    """A corpus script that cannot be played (a bad action, a Pod that never came)."""


# --------------------------------------------------------------------------- the corpus


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    manifest: Obj
    steps: tuple[Obj, ...]
    # Run with gang scheduling on (training-operator --gang-scheduler-name, ours
    # --gang-scheduler): the script says `gang: true`.
    gang: bool = False

    @property
    def job(self) -> str:
        return str(self.manifest["metadata"]["name"])

    @property
    def expected_path(self) -> Path:
        return EXPECTED / f"{self.name}.json"


def case_names() -> list[str]:
    return sorted(p.stem for p in CORPUS.glob("*.yaml"))


def load_case(name: str) -> Case:
    manifest = yaml.safe_load((CORPUS / f"{name}.yaml").read_text(encoding="utf-8"))
    script_path = SCRIPTS / f"{name}.yaml"
    if not script_path.is_file():
        raise ScriptError(f"{name}: no script {script_path.relative_to(REPO_ROOT)}")
    script = yaml.safe_load(script_path.read_text(encoding="utf-8")) or {}
    steps = tuple(script.get("steps") or ())
    for index, step in enumerate(steps):
        if step.get("action") not in ACTIONS:
            raise ScriptError(
                f"{name} step {index}: action {step.get('action')!r} not in {ACTIONS}"
            )
    if not steps or steps[0]["action"] != "created":
        raise ScriptError(f"{name}: the first step must be `created`")
    return Case(name=name, manifest=manifest, steps=steps, gang=bool(script.get("gang")))


def prepared(manifest: Obj, namespace: str) -> Obj:
    """The manifest as created: in `namespace`, every template's Pods left unscheduled."""
    body = copy.deepcopy(manifest)
    body["metadata"]["namespace"] = namespace
    for spec in (body["spec"].get("tfReplicaSpecs") or {}).values():
        pod_spec = spec.setdefault("template", {}).setdefault("spec", {})
        pod_spec.setdefault("schedulerName", NO_SCHEDULER)
    return body


# --------------------------------------------------------------------------- normalising


def _namespaced(value: Obj, namespace: str) -> Obj:
    """`value` with the namespace written `<ns>` wherever it occurs in a string."""
    text = json.dumps(value).replace(namespace, "<ns>")
    return cast(Obj, json.loads(text))


def _owner_refs(meta: Obj) -> list[Obj]:
    keep = ("apiVersion", "kind", "name", "controller", "blockOwnerDeletion")
    return [{k: ref.get(k) for k in keep} for ref in meta.get("ownerReferences") or []]


_API_ACCESS = re.compile(r"^kube-api-access-[a-z0-9]+$")


def normal_pod(pod: Obj) -> Obj:
    """A Pod's metadata and spec, with what differs from run to run taken out."""
    meta = pod.get("metadata") or {}
    spec = copy.deepcopy(pod.get("spec") or {})
    spec.pop("nodeName", None)
    for volume in spec.get("volumes") or []:
        if _API_ACCESS.match(volume.get("name", "")):
            volume["name"] = "kube-api-access-*"
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        for mount in container.get("volumeMounts") or []:
            if _API_ACCESS.match(mount.get("name", "")):
                mount["name"] = "kube-api-access-*"
        for env in container.get("env") or []:
            if env.get("name") == "TF_CONFIG" and "value" in env:
                env["value"] = json.loads(env["value"])
    return {
        "labels": meta.get("labels") or {},
        "annotations": {
            k: v for k, v in (meta.get("annotations") or {}).items() if k != TOUCH_ANNOTATION
        },
        "ownerReferences": _owner_refs(meta),
        "finalizers": meta.get("finalizers") or [],
        "spec": spec,
    }


def normal_service(service: Obj) -> Obj:
    meta = service.get("metadata") or {}
    spec = copy.deepcopy(service.get("spec") or {})
    if spec.get("clusterIP") not in (None, "None"):
        spec["clusterIP"] = "<allocated>"
        spec["clusterIPs"] = ["<allocated>"]
    return {
        "labels": meta.get("labels") or {},
        "annotations": meta.get("annotations") or {},
        "ownerReferences": _owner_refs(meta),
        "spec": spec,
    }


def conditions(status: Obj) -> list[list[str]]:
    return [
        [c.get("type", ""), c.get("status", ""), c.get("reason", ""), c.get("message", "")]
        for c in status.get("conditions") or []
    ]


# --------------------------------------------------------------------------- the run


class Run:
    """One case under one controller: creates the job in `namespace`, plays the script,
    returns the observation."""

    def __init__(self, api: k8s.ApiClient, case: Case, namespace: str) -> None:
        self.api = api
        self.core = k8s.CoreV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.case = case
        self.namespace = namespace
        self.uids: dict[str, list[str]] = {}
        self.pod_details: dict[str, Obj] = {}
        self.service_details: dict[str, Obj] = {}
        self.step = 0
        self.trace: list[str] = []
        self._listed = threading.Event()
        self._watching = threading.Event()
        self._watch: k8s_watch.Watch | None = None

    # -- the status trace -------------------------------------------------------------------

    def _follow(self) -> None:
        """Every change the controller wrote to the conditions' (type, status, reason) list,
        in order, as `step <i>: Type=Status/Reason, ...` (listed first, then watched from the
        list's resourceVersion: nothing written after `start_trace` returns is missed)."""
        last = ""
        listed = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
        resource_version = cast(Obj, listed)["metadata"]["resourceVersion"]
        self._listed.set()
        while not self._watching.is_set():
            self._watch = k8s_watch.Watch()
            try:
                for event in self._watch.stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    resource_version=resource_version,
                    timeout_seconds=5,
                ):
                    obj = event["object"]
                    resource_version = obj["metadata"]["resourceVersion"]
                    rows = conditions(obj.get("status") or {})
                    text = ", ".join(f"{t}={st}/{r}" for t, st, r, _ in rows)
                    if event["type"] == "DELETED":
                        text = "(deleted)"
                    if text and text != last:
                        self.trace.append(f"step {self.step}: {text}")
                        last = text
            except ApiException as exc:
                if exc.status != 410:
                    raise
                # Too old: go on from what is there now (a gap, at worst, in a long step).
                listed = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL
                )
                resource_version = cast(Obj, listed)["metadata"]["resourceVersion"]
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                # Watch.stop() shuts the stream's socket: the read ends with an error.
                if not self._watching.is_set():
                    self.trace.append(f"step {self.step}: the trace's watch broke: {exc!r}")
                return

    def start_trace(self) -> threading.Thread:
        thread = threading.Thread(target=self._follow, name="tfjob-trace", daemon=True)
        thread.start()
        if not self._listed.wait(timeout=STEP_DEADLINE):
            raise ScriptError("the status trace's first list did not return")
        return thread

    def stop_trace(self, thread: threading.Thread) -> None:
        self._watching.set()
        if self._watch is not None:
            self._watch.stop()
        thread.join(timeout=10)

    # -- reading ------------------------------------------------------------------------

    def _dict(self, obj: Any) -> Obj:
        return cast(Obj, self.api.sanitize_for_serialization(obj))

    def job(self) -> Obj | None:
        try:
            return cast(
                Obj,
                self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, self.case.job
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def pods(self) -> dict[str, Obj]:
        items = self.core.list_namespaced_pod(self.namespace).items
        return {p["metadata"]["name"]: p for p in map(self._dict, items)}

    def services(self) -> dict[str, Obj]:
        items = self.core.list_namespaced_service(self.namespace).items
        return {s["metadata"]["name"]: s for s in map(self._dict, items)}

    def pod_groups(self) -> dict[str, Obj]:
        """scheduler-plugins' PodGroups in the namespace (none without their CRD): name ->
        labels, ownerReferences, spec."""
        try:
            listed = cast(
                Obj,
                self.custom.list_namespaced_custom_object(
                    *PODGROUP[:2], self.namespace, PODGROUP[2]
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return {}
            raise
        return {
            item["metadata"]["name"]: {
                "labels": item["metadata"].get("labels") or {},
                "ownerReferences": _owner_refs(item["metadata"]),
                "spec": item.get("spec") or {},
            }
            for item in listed.get("items") or []
        }

    def state(self) -> Obj:
        """What is observed now (normalised); records each Pod's and Service's details the
        first time its name is seen."""
        job = self.job()
        pods = self.pods()
        services = self.services()
        groups = self.pod_groups() if self.case.gang else {}
        pod_state: Obj = {}
        for name, pod in sorted(pods.items()):
            uid = pod["metadata"]["uid"]
            seen = self.uids.setdefault(name, [])
            if uid not in seen:
                seen.append(uid)
            if name not in self.pod_details:
                self.pod_details[name] = _namespaced(normal_pod(pod), self.namespace)
            pod_state[name] = {
                "phase": (pod.get("status") or {}).get("phase"),
                "incarnation": seen.index(uid) + 1,
                "deleting": bool(pod["metadata"].get("deletionTimestamp")),
            }
        for name, service in services.items():
            if name not in self.service_details:
                self.service_details[name] = _namespaced(normal_service(service), self.namespace)
        extra = {"podGroups": groups} if self.case.gang else {}
        if job is None:
            return _namespaced(
                {"job": "absent", "pods": pod_state, "services": sorted(services), **extra},
                self.namespace,
            )
        status = job.get("status") or {}
        meta = job.get("metadata") or {}
        return _namespaced(
            {
                "job": "present",
                # What a controller wrote into the TFJob's metadata (keys: values may be state).
                "jobMetadata": {
                    "labels": dict.fromkeys(sorted(meta.get("labels") or {}), True),
                    "annotations": dict.fromkeys(sorted(meta.get("annotations") or {}), True),
                    "finalizers": meta.get("finalizers") or [],
                },
                "conditions": conditions(status),
                "replicaStatuses": status.get("replicaStatuses") or {},
                # Which status fields are set (startTime, completionTime, ...), not their times.
                "statusFields": dict.fromkeys(sorted(k for k in status if k != "conditions"), True),
                "pods": pod_state,
                "services": sorted(services),
                **extra,
            },
            self.namespace,
        )

    # -- the kubelet and the user --------------------------------------------------------

    def pod_name(self, short: str) -> str:
        return f"{self.case.job}-{short}"

    def wait_pod(self, short: str) -> Obj:
        name = self.pod_name(short)

        def probe() -> Obj | None:
            try:
                pod = self.core.read_namespaced_pod(name, self.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            body = self._dict(pod)
            return None if body["metadata"].get("deletionTimestamp") else body

        return waits.wait_until(
            probe, timeout=STEP_DEADLINE, what=f"pod {name}", error=ScriptError, interval=POLL
        )

    def _patch_status(self, pod: Obj, phase: str, statuses: list[Obj], **extra: Any) -> None:
        body = {"status": {"phase": phase, **extra, "containerStatuses": statuses}}
        self.core.patch_namespaced_pod_status(pod["metadata"]["name"], self.namespace, body)

    @staticmethod
    def _restarts(pod: Obj, container: str) -> int:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") == container:
                return int(status.get("restartCount") or 0)
        return 0

    @staticmethod
    def _containers(pod: Obj) -> list[Obj]:
        return list((pod.get("spec") or {}).get("containers") or [])

    def run_pod(self, short: str) -> None:
        pod = self.wait_pod(short)
        now = kubelet.now()
        statuses = []
        for container in self._containers(pod):
            status = kubelet.container_status(
                {"running": {"startedAt": now}},
                image=container["image"],
                ready=True,
                name=container["name"],
            )
            status["restartCount"] = self._restarts(pod, container["name"])
            statuses.append(status)
        self._patch_status(pod, "Running", statuses, startTime=now)

    def exit_pod(self, short: str, code: int) -> None:
        """The Pod's main container (`tensorflow`, else the first) exits with `code`; the
        kubelet restarts it in place or ends the Pod, as the Pod's restartPolicy says."""
        pod = self.wait_pod(short)
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        now = kubelet.now()
        containers = self._containers(pod)
        names = [c["name"] for c in containers]
        main = "tensorflow" if "tensorflow" in names else names[0]
        terminated: Obj = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": now,
            "finishedAt": now,
        }
        statuses = []
        for container in containers:
            restarts = self._restarts(pod, container["name"])
            if container["name"] != main:
                state: Obj = {"running": {"startedAt": now}}
                status = kubelet.container_status(
                    state, image=container["image"], ready=True, name=container["name"]
                )
                status["restartCount"] = restarts
            elif restart:
                status = kubelet.container_status(
                    {"running": {"startedAt": now}},
                    image=container["image"],
                    ready=True,
                    name=container["name"],
                )
                status["restartCount"] = restarts + 1
                status["lastState"] = {"terminated": terminated}
            else:
                status = kubelet.container_status(
                    {"terminated": terminated},
                    image=container["image"],
                    ready=False,
                    name=container["name"],
                )
                status["restartCount"] = restarts
            statuses.append(status)
        if restart:
            phase = "Running"
        else:
            phase = "Succeeded" if code == 0 else "Failed"
            # A Pod that never restarts: every container ends with it.
            for status in statuses:
                if "running" in status["state"]:
                    status["state"] = {"terminated": {**terminated, "exitCode": 137}}
                    status["ready"] = False
        self._patch_status(pod, phase, statuses)

    def evict_pod(self, short: str) -> None:
        """The kubelet evicts the Pod (node pressure): Failed, reason Evicted, its containers
        killed (137), a DisruptionTarget condition, whatever the restartPolicy."""
        pod = self.wait_pod(short)
        now = kubelet.now()
        statuses = []
        for container in self._containers(pod):
            terminated = {
                "exitCode": 137,
                "reason": "Error",
                "startedAt": now,
                "finishedAt": now,
            }
            status = kubelet.container_status(
                {"terminated": terminated},
                image=container["image"],
                ready=False,
                name=container["name"],
            )
            status["restartCount"] = self._restarts(pod, container["name"])
            statuses.append(status)
        self._patch_status(
            pod,
            "Failed",
            statuses,
            reason="Evicted",
            message="The node was low on resource: memory.",
            conditions=[
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "TerminationByKubelet",
                    "message": "The node was low on resource: memory.",
                    "lastTransitionTime": now,
                }
            ],
        )

    def touch_pod(self, short: str, index: int) -> None:
        """An update of the Pod that changes nothing a controller reads: an event for it."""
        pod = self.wait_pod(short)
        patch = {"metadata": {"annotations": {TOUCH_ANNOTATION: str(index)}}}
        self.core.patch_namespaced_pod(pod["metadata"]["name"], self.namespace, patch)

    def set_suspend(self, suspend: bool) -> None:
        patch = {"spec": {"runPolicy": {"suspend": suspend}}}
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, self.case.job, patch
        )

    def wait_after_start(self, seconds: float) -> None:
        """Wait until `seconds` have passed since the job's status.startTime (a deadline
        under test)."""

        def passed() -> bool:
            start = ((self.job() or {}).get("status") or {}).get("startTime")
            if not start:
                return False
            started = datetime.datetime.fromisoformat(start.replace("Z", "+00:00"))
            return time.time() >= started.timestamp() + seconds

        waits.wait_until(
            passed,
            timeout=STEP_DEADLINE + seconds,
            what=f"{seconds}s after the job's startTime",
            error=ScriptError,
            interval=POLL,
        )

    def act(self, index: int, step: Obj) -> None:
        action = step["action"]
        if "after_start_seconds" in step:
            self.wait_after_start(float(step["after_start_seconds"]))
        if action == "run":
            for short in step["pods"]:
                self.run_pod(short)
        elif action == "exit":
            self.exit_pod(step["pod"], int(step["code"]))
        elif action == "evict":
            self.evict_pod(step["pod"])
        elif action == "touch":
            self.touch_pod(step["pod"], index)
        elif action in ("suspend", "resume"):
            self.set_suspend(action == "suspend")
        elif action == "patch":
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, self.case.job, step["body"]
            )

    # -- settling -------------------------------------------------------------------------

    def until(self, step: Obj, state: Obj) -> bool:
        """The step's own `until` (recording): `condition: T` (T is True), `job: absent`,
        `pods: [...]` (exactly these exist, not deleting)."""
        want = step.get("until") or {}
        if "job" in want and state["job"] != want["job"]:
            return False
        if "condition" in want and [want["condition"], "True"] not in [
            c[:2] for c in state.get("conditions", [])
        ]:
            return False
        if "pods" in want:
            names = {self.pod_name(p) for p in want["pods"]}
            live = {n for n, p in state["pods"].items() if not p["deleting"]}
            if live != names:
                return False
        return True

    def settle(self, step: Obj, golden: Obj | None, allowed: Callable[[Obj, Obj], bool]) -> Obj:
        """Poll until the observation settles (module docstring); the settled observation,
        or the last one at the deadline with `"settled": false`."""
        deadline = time.monotonic() + STEP_DEADLINE
        last = self.state()
        since = time.monotonic()
        while True:
            now = time.monotonic()
            quiet = now - since
            if golden is None:
                if self.until(step, last) and quiet >= RECORD_SETTLE:
                    return last
            else:
                if allowed(golden, last) and quiet >= COMPARE_SETTLE:
                    return last
                if quiet >= COMPARE_QUIET:
                    return last
            if now >= deadline:
                return {**last, "settled": False}
            time.sleep(POLL)
            state = self.state()
            if state != last:
                last, since = state, time.monotonic()

    def play(
        self,
        golden: Obj | None = None,
        allowed: Callable[[Obj, Obj, str], bool] = lambda golden, state, _: golden == state,
    ) -> Obj:
        """Create the job, play the script; the observation. `golden`: the recorded
        observation to settle on (comparing), None when recording."""
        tracer = self.start_trace()
        self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, prepared(self.case.manifest, self.namespace)
        )
        golden_steps: list[Obj] = list((golden or {}).get("steps") or [])
        steps: list[Obj] = []
        error = None
        for index, step in enumerate(self.case.steps):
            self.step = index
            try:
                self.act(index, step)
            except ScriptError as exc:
                error = f"step {index} ({step['action']}): {exc}"
                steps.append({"step": describe(step), **self.state()})
                break
            want = golden_steps[index] if index < len(golden_steps) else None
            prefix = f"steps/{index} ({describe(step)})"
            observed = self.settle(
                step,
                None if golden is None or want is None else want,
                lambda want, state: allowed(want, state, prefix),  # noqa: B023 (called here)
            )
            steps.append({"step": describe(step), **observed})
        self.stop_trace(tracer)
        observation: Obj = {
            "case": self.case.name,
            "steps": steps,
            "trace": list(self.trace),
            "pods": dict(sorted(self.pod_details.items())),
            "services": dict(sorted(self.service_details.items())),
        }
        if error is not None:
            observation["error"] = error
        return observation


def describe(step: Obj) -> str:
    """A step in words, for the golden file and the diff."""
    action = step["action"]
    words = {
        "run": lambda: f"run {', '.join(step['pods'])}",
        "exit": lambda: f"{step['pod']} exits {step['code']}",
        "evict": lambda: f"{step['pod']} evicted",
        "touch": lambda: f"{step['pod']} touched",
        "patch": lambda: f"patch {json.dumps(step['body'], sort_keys=True)}",
    }
    text = words[action]() if action in words else action
    if "after_start_seconds" in step:
        text += f" ({step['after_start_seconds']}s after startTime)"
    if step.get("until"):
        text += f" until {json.dumps(step['until'], sort_keys=True)}"
    return text


# --------------------------------------------------------------------------- comparing


@dataclasses.dataclass(frozen=True)
class Allowed:
    """A deliberate difference: observations may differ at paths matching `path` (an
    fnmatch pattern over the flattened path) in the way `kind` says: `extra` (ours has a
    value the reference lacks), `missing` (the reference has one ours lacks), `value`
    (both have one), `prefix` (ours extends the reference's text: it starts with it),
    `quantity` (both are Kubernetes quantities, equal: "5Gi" and "5368709120"), `any`; in the
    cases `cases` names (fnmatch patterns; none: every case); when `values` is given, only
    that (reference, ours) pair of leaves (MISSING for absent)."""

    path: str
    kind: str
    reason: str
    cases: tuple[str, ...] = ()
    values: tuple[Any, Any] | None = None

    def covers(self, case: str, difference: Difference) -> bool:
        if self.cases and not any(fnmatch.fnmatchcase(case, c) for c in self.cases):
            return False
        if not fnmatch.fnmatchcase(difference.path, self.path):
            return False
        ref, ours = difference.reference, difference.ours
        if self.values is not None and (ref, ours) != self.values:
            return False
        if self.kind == "prefix":
            return isinstance(ref, str) and isinstance(ours, str) and ours.startswith(ref)
        if self.kind == "quantity":
            return _same_quantity(ref, ours)
        return self.kind in ("any", difference.kind)


def _same_quantity(left: Any, right: Any) -> bool:
    """Both Kubernetes quantities (a string or a number), of equal value."""
    if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in (left, right)):
        return False
    try:
        return bool(parse_quantity(left) == parse_quantity(right))
    except ValueError:
        return False


MISSING: Final = object()


# The deliberate differences between our TFJobs and training-operator's, each with its reason.
# Paths are fnmatch patterns over the flattened observation (`pods/<pod>/labels/<key>`,
# `steps/<i> (<step>)/conditions/<j>/message`, `trace`, ...); see Allowed for the kinds.
OUR_LABELS: Final = (
    "beside Kubeflow's five training.kubeflow.org labels, which are all any client selects on "
    "(the SDK, Katib, kueuectl): ours, for `trainjob get` and the operator's own informer"
)
RESTART_SCOPE: Final = (
    "restart scope follows the strategy (DESIGN §3), and retried Pods are recreated, not "
    "restarted in place"
)
# The cases with an OnFailure replica that fails (restarted in place by training-operator's
# kubelet), and all the cases with a retried failure.
ONFAILURE_CASES: Final = (
    "backoff-limit",
    "estimator-master-evaluator",
    "failure-onfailure*",
    "kubeflow-simple",
    "multi-worker-run-policy",
)
RESTART_CASES: Final = (*ONFAILURE_CASES, "exitcode-137")
IN_PLACE: Final = (
    "OnFailure replicas: we recreate the Pod (restartPolicy Never) instead of the kubelet "
    "restarting its container in place, so every failure is seen, counted and explained"
)
# A chief under restartPolicy Always (Flyte's documented TFJob config) that exits 0.
CHIEF_ALWAYS: Final = (
    "a chief's success ends the job whatever its restartPolicy (Always restarts it only after "
    "a failure): training-operator leaves an Always chief that exited 0 to the kubelet, which "
    "restarts it in place, so the job runs forever and cleanPodPolicy never applies; ours "
    "succeeds and cleans up. Its Pods are restartPolicy Never, as every Pod of ours"
)
# An eviction under the default restartPolicy Never (the Kubeflow SDK's train_func jobs).
EVICTED_NEVER: Final = (
    "an eviction (DisruptionTarget) is a disruption, not a failure of the training: "
    "training-operator fails a Never job on any Failed Pod; ours creates the Pod again, "
    "uncounted (runPolicy.backoffLimit is untouched; disruptionLimit bounds them), and the "
    "job goes on"
)
ALLOWED: Final[tuple[Allowed, ...]] = (
    Allowed("pods/*/labels/trainjob.dev/*", "extra", OUR_LABELS),
    Allowed("services/*/labels/trainjob.dev/*", "extra", OUR_LABELS),
    Allowed("steps/*/podGroups/*/labels/trainjob.dev/*", "extra", OUR_LABELS),
    Allowed(
        "pods/*/annotations/trainjob.dev/*",
        "extra",
        "our bookkeeping on the Pods (attempt, ...): no client reads these annotations",
    ),
    Allowed(
        "steps/*/jobMetadata/annotations/trainjob.dev/*",
        "extra",
        "the engine's memory lives in an annotation of the TFJob (training-operator keeps it in "
        "memory); the spec is never written",
    ),
    Allowed(
        "steps/*/conditions/*/message",
        "prefix",
        "a condition's message may go on after training-operator's words with the cause (issue "
        "30: extra information goes in condition messages, never in new condition types)",
    ),
    Allowed(
        "pods/*/spec/restartPolicy",
        "value",
        IN_PLACE,
        cases=ONFAILURE_CASES,
        values=("OnFailure", "Never"),
    ),
    # The failure that fails the job (backoffLimit reached): training-operator's Pod was
    # restarted in place and still runs (active); ours ended Failed. The conditions compare.
    Allowed("steps/* (* exits 1 until *)/pods/*/phase", "value", IN_PLACE, ONFAILURE_CASES),
    Allowed("steps/* (* exits 1 until *)/replicaStatuses/*", "any", IN_PLACE, ONFAILURE_CASES),
    Allowed(
        "pods/*/spec/containers/*/terminationMessagePolicy",
        "value",
        "FallbackToLogsOnError on the tensorflow container when its template sets none (the API "
        "server's default is File): a crash that wrote no termination message still leaves its "
        "log's tail, so the cause reaches status and Events after the Pod is gone",
        values=("File", "FallbackToLogsOnError"),
    ),
    Allowed(
        "services/*/spec/publishNotReadyAddresses",
        "extra",
        "the headless Services publish not-ready addresses: peers resolve each other while "
        "TensorFlow starts, before any readiness probe passes",
        values=(MISSING, True),
    ),
    Allowed(
        "pods/*/annotations/scheduling.k8s.io/group-name",
        "extra",
        "gang Pods also carry Volcano's group annotation beside scheduler-plugins' "
        "scheduling.x-k8s.io/pod-group label (one rendering for both gang schedulers)",
    ),
    Allowed(
        "steps/*/podGroups/*",
        "extra",
        "the PodGroup is deleted once no Pod of the job is left running, not as soon as the "
        "job finishes: Pods that cleanPodPolicy leaves running keep their gang",
    ),
    Allowed(
        "steps/*/podGroups/*/spec/minResources/*",
        "quantity",
        "minResources are written as summed quantities in canonical form ('5368709120' for "
        "'5Gi'): equal quantities",
    ),
    Allowed(
        "pods/*/spec/containers/*/env/*/value/*",
        "any",
        "enableDynamicWorker's sparse TF_CONFIG (a worker lists only itself and the PS, the "
        "other tasks neither) is not served: every task gets the whole cluster",
        cases=("estimator-master-evaluator",),
    ),
    Allowed(
        "pods/*-chief-0/spec/restartPolicy",
        "value",
        CHIEF_ALWAYS,
        cases=("chief-restart-always",),
        values=("Always", "Never"),
    ),
    *(
        Allowed(path, kind, CHIEF_ALWAYS, cases=("chief-restart-always",))
        for path, kind in (
            ("steps/* (chief-0 exits 0)/*", "any"),
            ("steps/* (wait)/*", "any"),
            ("trace", "value"),
        )
    ),
    *(
        Allowed(path, kind, EVICTED_NEVER, cases=("evicted-never",))
        for path, kind in (
            ("steps/* (worker-1 evicted*)/*", "any"),
            ("steps/* (worker-0 exits 0)/*", "any"),
            ("trace", "value"),
        )
    ),
    # A retried failure: training-operator deletes and recreates the failed Pod alone (ExitCode
    # >= 128, an evicted Pod) or leaves it to the kubelet (OnFailure: nothing to see), and shows
    # Restarting only until any worker or chief runs again; we restart the replicas that fail
    # together (DESIGN §3 "Restart scope follows the strategy": chief + workers of an
    # all-reduce job), so at the failing step our Pods are new and Pending and the job
    # Restarting, and later those Pods count one more incarnation. The outcome is compared.
    *(
        Allowed(path, kind, RESTART_SCOPE, cases=RESTART_CASES)
        for path, kind in (
            ("steps/* (* exits 1)/*", "any"),
            ("steps/* (* exits 137)/*", "any"),
            ("steps/* (* evicted)/*", "any"),
            ("steps/*/pods/*/incarnation", "value"),
            ("trace", "value"),
        )
    ),
)


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, leaf) pairs; dict keys and list indexes joined by `/`, leaves JSON scalars
    (an empty dict or list is a leaf)."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from flatten(item, f"{prefix}/{key}" if prefix else str(key))
    elif isinstance(value, list) and value:
        for index, item in enumerate(value):
            yield from flatten(item, f"{prefix}/{index}" if prefix else str(index))
    else:
        yield prefix, value


@dataclasses.dataclass(frozen=True)
class Difference:
    path: str
    reference: Any
    ours: Any

    @property
    def kind(self) -> str:
        if self.reference is MISSING:
            return "extra"
        if self.ours is MISSING:
            return "missing"
        return "value"

    def render(self, left: str = REFERENCE, right: str = "ours") -> str:
        def show(v: Any) -> str:
            if v is MISSING:
                return "(absent)"
            if isinstance(v, str) and "\n" in v:
                return "\n      " + v.replace("\n", "\n      ")
            return json.dumps(v)

        return f"{self.path}:\n    {left}: {show(self.reference)}\n    {right}: {show(self.ours)}"


def differences(reference: Any, ours: Any, prefix: str = "") -> list[Difference]:
    """Leaf by leaf. An empty dict or list on one side where the other has entries is not a
    difference of its own: the entries are (each an `extra` or `missing`)."""
    ref_flat = dict(flatten(reference, prefix))
    our_flat = dict(flatten(ours, prefix))
    result = []
    for path in sorted(set(ref_flat) | set(our_flat)):
        left = ref_flat.get(path, MISSING)
        right = our_flat.get(path, MISSING)
        if left == right:
            continue
        inside = f"{path}/"
        if (
            left in ({}, []) and right is MISSING and any(p.startswith(inside) for p in our_flat)
        ) or (
            right in ({}, []) and left is MISSING and any(p.startswith(inside) for p in ref_flat)
        ):
            continue
        result.append(Difference(path, left, right))
    return result


def split(
    case: str, found: Sequence[Difference], allowances: Sequence[Allowed]
) -> tuple[list[Difference], list[tuple[Difference, Allowed]]]:
    """(unexplained differences, allowed ones with their allowance)."""
    unexplained: list[Difference] = []
    allowed: list[tuple[Difference, Allowed]] = []
    for difference in found:
        allowance = next((a for a in allowances if a.covers(case, difference)), None)
        if allowance is None:
            unexplained.append(difference)
        else:
            allowed.append((difference, allowance))
    return unexplained, allowed


def comparable(step: Obj) -> Obj:
    """A step's observation as compared: each condition a {type, status, reason, message}."""
    keys = ("type", "status", "reason", "message")
    rows = [dict(zip(keys, row, strict=True)) for row in step.get("conditions") or []]
    return {k: (rows if k == "conditions" else v) for k, v in step.items() if k != "step"}


def compare(
    case: str, reference: Obj, ours: Obj, allowances: Sequence[Allowed]
) -> tuple[list[Difference], list[tuple[Difference, Allowed]]]:
    """The observations' differences (reference first), split as `split` does; steps are
    compared by index with the step's words in the path, the status traces as a whole."""
    skip = ("steps", "controller", "trace")
    ref = {k: v for k, v in reference.items() if k not in skip}
    our = {k: v for k, v in ours.items() if k not in skip}
    found = differences(ref, our)
    ref_trace = "\n".join(reference.get("trace") or [])
    our_trace = "\n".join(ours.get("trace") or [])
    if ref_trace != our_trace:
        found.append(Difference("trace", ref_trace, our_trace))
    ref_steps = reference.get("steps") or []
    our_steps = ours.get("steps") or []
    for index in range(max(len(ref_steps), len(our_steps))):
        left = ref_steps[index] if index < len(ref_steps) else {}
        right = our_steps[index] if index < len(our_steps) else {}
        words = left.get("step") or right.get("step") or ""
        found += differences(comparable(left), comparable(right), f"steps/{index} ({words})")
    return split(case, found, allowances)


def report(
    case: str, unexplained: Sequence[Difference], left: str = REFERENCE, right: str = "ours"
) -> str:
    lines = [f"{case}: {len(unexplained)} unexplained difference(s), {left} vs {right}:"]
    lines += [f"  {d.render(left, right)}" for d in unexplained]
    return "\n".join(lines)


# --------------------------------------------------------------------------- running cases


def new_namespace(core: k8s.CoreV1Api, case: Case) -> str:
    prefix = GANG_NAMESPACE_PREFIX if case.gang else NAMESPACE_PREFIX
    name = f"{prefix}-{case.name[:40].rstrip('-')}-{uuid.uuid4().hex[:5]}"
    create_namespace(core, name)
    return name


def run_case(
    api: k8s.ApiClient,
    case: Case,
    *,
    golden: Obj | None = None,
    allowances: Sequence[Allowed] = (),
) -> Obj:
    """`case` in a fresh namespace (deleted afterwards) under whichever controller runs."""
    core = k8s.CoreV1Api(api)
    namespace = new_namespace(core, case)

    def allowed(want: Obj, state: Obj, prefix: str) -> bool:
        found = differences(comparable(want), comparable(state), prefix)
        return not split(case.name, found, allowances)[0]

    try:
        return Run(api, case, namespace).play(golden, allowed)
    finally:
        core.delete_namespace(namespace)


def load_expected(case: Case) -> Obj:
    return cast(Obj, json.loads(case.expected_path.read_text(encoding="utf-8")))


def write_expected(case: Case, observation: Obj, controller: str) -> None:
    EXPECTED.mkdir(parents=True, exist_ok=True)
    body = {"controller": controller, **observation}
    case.expected_path.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")


def _record_or_check(api: k8s.ApiClient, case: Case, *, check: bool) -> int:
    """Run `case` under the training-operator running; write its golden file, or compare
    with it. 1 if there was a problem (printed), else 0."""
    from tests.controlplane.training_operator import version

    t0 = time.monotonic()
    golden = load_expected(case) if check else None
    observation = run_case(api, case, golden=golden)
    unsettled = [s["step"] for s in observation["steps"] if s.get("settled") is False]
    trouble = [observation["error"]] if observation.get("error") else []
    trouble += [f"never settled: {step}" for step in unsettled]
    if golden is not None:
        found = compare(case.name, golden, observation, ())[0]
        trouble += [d.render("recorded", "now") for d in found]
    else:
        write_expected(case, observation, f"{REFERENCE} {version()}")
    print(f"{case.name}: {time.monotonic() - t0:.1f}s", flush=True)
    for line in trouble:
        print(f"  {line}", flush=True)
    return 1 if trouble else 0


def _diff(directory: Path, cases: Sequence[Case]) -> int:
    """Print every case's differences between its golden file and DIR/<case>.json."""
    unexplained_total = 0
    for case in cases:
        observed_path = directory / f"{case.name}.json"
        if not observed_path.is_file():
            print(f"{case.name}: not observed")
            continue
        observed = cast(Obj, json.loads(observed_path.read_text(encoding="utf-8")))
        unexplained, allowed = compare(case.name, load_expected(case), observed, ALLOWED)
        unexplained_total += len(unexplained)
        if observed.get("error"):
            print(f"{case.name}: ERROR {observed['error']}")
        print(report(case.name, unexplained) if unexplained else f"{case.name}: same")
        reasons: dict[str, int] = {}
        for _, allowance in allowed:
            reasons[allowance.path] = reasons.get(allowance.path, 0) + 1
        for pattern, count in reasons.items():
            print(f"  allowed: {count} x {pattern}")
    return 1 if unexplained_total else 0


def _main(argv: Sequence[str]) -> int:
    from tests.controlplane.cluster import ControlPlane
    from tests.controlplane.gang import SCHEDULER_NAME as GANG_SCHEDULER
    from tests.controlplane.gang import crd_files as gang_crds
    from tests.controlplane.training_operator import start_training_operator

    parser = argparse.ArgumentParser(
        prog="python -m tests.integration.tfjob_differential",
        description="Run the TFJob corpus under training-operator on a control plane of its "
        "own: --record writes the golden files, --check compares with them (is the reference "
        "deterministic, are the golden files current?).",
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true")
    mode.add_argument("--check", action="store_true")
    mode.add_argument(
        "--diff",
        metavar="DIR",
        type=Path,
        help=f"no cluster: compare the observations the test wrote to DIR ({OBSERVED_DIR_ENV}) "
        "with the golden files, listing the allowed differences too",
    )
    parser.add_argument("cases", nargs="*", help="case names (default: the whole corpus)")
    args = parser.parse_args(list(argv))
    names = args.cases or case_names()
    cases = [load_case(name) for name in names]
    if args.diff is not None:
        return _diff(args.diff, cases)
    started = time.monotonic()
    problems = 0
    with ControlPlane() as plane:
        api = k8s_config.new_client_from_config(config_file=str(plane.kubeconfig))
        try:
            for gang in (False, True):
                batch = [case for case in cases if case.gang == gang]
                if not batch:
                    continue
                flags = []
                if gang:
                    plane.apply_crds(gang_crds())
                    flags = [f"--gang-scheduler-name={GANG_SCHEDULER}"]
                operator = start_training_operator(plane, *flags)
                try:
                    for case in batch:
                        problems += _record_or_check(api, case, check=args.check)
                finally:
                    operator.stop()
        finally:
            api.close()
    verb = "checked" if args.check else f"recorded into {EXPECTED.relative_to(REPO_ROOT)}"
    print(
        f"{verb}: {len(cases)} case(s) in {time.monotonic() - started:.0f}s, "
        f"{problems} with problems"
    )
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    return _main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
