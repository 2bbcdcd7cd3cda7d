"""The TrainJob CRD on a real kube-apiserver: schema, CEL rules, defaults, status subresource,
printer columns and garbage collection of children (kube-controller-manager's real GC)."""

from __future__ import annotations

import base64
import copy
import json
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import ControlPlane
from tests.controlplane.tools import REPO_ROOT
from tests.support import waits

pytestmark = pytest.mark.integration

GROUP: Final = "trainjob.dev"
VERSION: Final = "v1alpha1"
PLURAL: Final = "trainjobs"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
EXAMPLES: Final = sorted((REPO_ROOT / "examples").glob("*.yaml"))
INVALID: Final = sorted((REPO_ROOT / "tests" / "corpus" / "invalid").glob("*.yaml"))

Obj = dict[str, Any]
M = TypeVar("M", k8s.V1ConfigMap, k8s.V1Service, k8s.V1Pod)


def model(cls: type[M], body: Obj) -> M:
    """A kubernetes-client model from a manifest-shaped dict (camelCase keys)."""
    built = cls.from_dict(body)
    assert built is not None
    return built


def minimal_trainjob(name: str) -> Obj:
    """The smallest TrainJob the schema accepts: an image and one worker."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "image": "registry.example/trainjob-runtime:test",
            "replicaSpecs": {"worker": {"replicas": 1}},
        },
    }


def create_trainjob(api: k8s.CustomObjectsApi, namespace: str, body: Obj) -> Obj:
    created = api.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
    )
    return cast(Obj, created)


def get_trainjob(api: k8s.CustomObjectsApi, namespace: str, name: str) -> Obj:
    return cast(Obj, api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


def server_message(exc: ApiException) -> str:
    """The Status message plus every cause's field and message, as the server sent them."""
    try:
        status = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.body)
    parts = [str(status.get("message", ""))]
    for cause in status.get("details", {}).get("causes", []) or []:
        parts.append(f"{cause.get('field', '')}: {cause.get('message', '')}")
    return "\n".join(parts)


def expected_error(path: Path) -> str:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    prefix = "# expect:"
    assert first.startswith(prefix), f"{path.name}: first line must be '{prefix} <substring>'"
    expect = first[len(prefix) :].strip()
    assert expect, f"{path.name}: empty expectation"
    return expect


# ----------------------------------------------------------------------------- CRD


def test_crds_apply_with_kubectl_and_are_established(control_plane: ControlPlane) -> None:
    # Plain client-side apply, as a user would (the fixture applied them server-side).
    out = control_plane.kubectl("apply", "-f", REPO_ROOT / "crds").stdout
    assert CRD_NAME in out
    crd = json.loads(control_plane.kubectl("get", "crd", CRD_NAME, "-o", "json").stdout)
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions.get("Established") == "True"
    assert conditions.get("NamesAccepted") == "True"
    assert "tj" in crd["spec"]["names"].get("shortNames", [])
    served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    assert VERSION in served
    # Discovery knows the short name (kubectl resolves `tj` through it).
    resources = control_plane.kubectl("api-resources", f"--api-group={GROUP}", "-o", "wide").stdout
    assert "trainjobs" in resources
    assert "tj" in resources.split()


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_is_accepted_by_kubectl_apply(
    control_plane: ControlPlane, namespace: str, example: Path
) -> None:
    result = control_plane.kubectl("apply", "-n", namespace, "-f", example, check=False)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr  # e.g. unknown fields dropped
    docs = [d for d in yaml.safe_load_all(example.read_text(encoding="utf-8")) if d]
    for doc in docs:
        if doc.get("kind") != "TrainJob":
            continue
        got = json.loads(
            control_plane.kubectl(
                "get", "tj", doc["metadata"]["name"], "-n", namespace, "-o", "json"
            ).stdout
        )
        assert got["metadata"]["uid"]
        assert got["spec"]["replicaSpecs"].keys() == doc["spec"]["replicaSpecs"].keys()


def test_examples_exist() -> None:
    assert EXAMPLES, "examples/*.yaml is empty"
    assert INVALID, "tests/corpus/invalid/*.yaml is empty"


@pytest.mark.parametrize("manifest", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_manifest_is_rejected_at_admission(
    custom_objects: k8s.CustomObjectsApi, namespace: str, manifest: Path
) -> None:
    expect = expected_error(manifest)
    docs = [d for d in yaml.safe_load_all(manifest.read_text(encoding="utf-8")) if d]
    assert len(docs) == 1, f"{manifest.name}: one TrainJob per corpus file"
    body = docs[0]
    body.get("metadata", {}).pop("namespace", None)
    with pytest.raises(ApiException) as raised:
        create_trainjob(custom_objects, namespace, body)
    exc = raised.value
    message = server_message(exc)
    # 422 Invalid (schema, CEL) or 400 BadRequest (strict decoding); never 5xx / 404 / 403.
    assert exc.status in (400, 422), f"status {exc.status}: {message}"
    assert expect in message, f"expected {expect!r} in the server's message:\n{message}"
    name = body.get("metadata", {}).get("name")
    if isinstance(name, str) and name:
        with pytest.raises(ApiException) as missing:
            get_trainjob(custom_objects, namespace, name)
        assert missing.value.status == 404


# ----------------------------------------------------------------------------- defaults


def etcd_value(control_plane: ControlPlane, key: str) -> Obj:
    """Read one key straight from etcd (its JSON gRPC gateway): what is really stored."""
    request = urllib.request.Request(
        f"{control_plane.etcd_url}/v3/kv/range",
        data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        reply = json.loads(resp.read())
    kvs = reply.get("kvs", [])
    assert len(kvs) == 1, f"etcd has no key {key}: {reply}"
    return cast(Obj, json.loads(base64.b64decode(kvs[0]["value"])))


def test_defaults_are_persisted(
    control_plane: ControlPlane, custom_objects: k8s.CustomObjectsApi, namespace: str
) -> None:
    body = minimal_trainjob("defaults")
    create_trainjob(custom_objects, namespace, copy.deepcopy(body))
    assert "runPolicy" not in body["spec"]

    read = get_trainjob(custom_objects, namespace, "defaults")
    stored = etcd_value(control_plane, f"/registry/{GROUP}/{PLURAL}/{namespace}/defaults")
    for obj in (read, stored):  # the API's answer and the bytes in etcd agree
        spec = obj["spec"]
        assert spec["runPolicy"]["cleanPodPolicy"] == "Running"
        assert spec["replicaSpecs"]["worker"]["restartPolicy"] == "Never"
        assert spec["replicaSpecs"]["worker"]["replicas"] == 1
        assert spec["successPolicy"] == "ChiefOrWorker0"
    assert stored["spec"] == read["spec"]


# ----------------------------------------------------------------------------- status


def test_status_subresource(custom_objects: k8s.CustomObjectsApi, namespace: str) -> None:
    created = create_trainjob(custom_objects, namespace, minimal_trainjob("status"))
    spec_before = created["spec"]
    generation = created["metadata"]["generation"]

    # Writing /status changes status only: spec and generation untouched.
    patched = cast(
        Obj,
        custom_objects.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            "status",
            {"status": {"state": "Running", "ready": "1/1"}, "spec": {"image": "evil:1"}},
            _content_type="application/merge-patch+json",
        ),
    )
    assert patched["status"]["state"] == "Running"
    now = get_trainjob(custom_objects, namespace, "status")
    assert now["status"] == {"state": "Running", "ready": "1/1"}
    assert now["spec"] == spec_before
    assert now["metadata"]["generation"] == generation

    # Writing the main resource cannot change status, but does change spec (generation +1).
    updated = copy.deepcopy(now)
    updated["status"] = {"state": "Hacked"}
    updated["spec"]["runPolicy"]["backoffLimit"] = 1
    custom_objects.replace_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "status", updated
    )
    after = get_trainjob(custom_objects, namespace, "status")
    assert after["status"] == {"state": "Running", "ready": "1/1"}
    assert after["spec"]["runPolicy"]["backoffLimit"] == 1
    assert after["metadata"]["generation"] == generation + 1

    # A stale resourceVersion is a real conflict (optimistic concurrency).
    with pytest.raises(ApiException) as conflict:
        custom_objects.replace_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "status", now
        )
    assert conflict.value.status == 409


def test_printer_columns(
    control_plane: ControlPlane, custom_objects: k8s.CustomObjectsApi, namespace: str
) -> None:
    create_trainjob(custom_objects, namespace, minimal_trainjob("columns"))
    custom_objects.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "columns",
        {
            "status": {
                "state": "Restarting",
                "ready": "2/3",
                "restartCount": 4,
                "conditions": [
                    {
                        "type": "Running",
                        "status": "False",
                        "reason": "ImagePullBackOff",
                        "message": 'worker 1: ImagePullBackOff: Back-off pulling image "nope:1"',
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
                "progress": {"summary": "70%-(7/10)", "eta": "4m", "loss": 0.2314},
            }
        },
        _content_type="application/merge-patch+json",
    )
    out = control_plane.kubectl("get", "tj", "columns", "-n", namespace).stdout
    header, row = out.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "STATE",
        "READY",
        "RESTARTS",
        "REASON",
        "PROGRESS",
        "ETA",
        "LOSS",
        "DEVICES",
        "AGE",
    ]
    assert row.split()[:8] == [
        "columns",
        "Restarting",
        "2/3",
        "4",
        "ImagePullBackOff",
        "70%-(7/10)",
        "4m",
        "0.2314",
    ]


# ----------------------------------------------------------------------------- GC


def owner_reference(trainjob: Obj) -> Obj:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "name": trainjob["metadata"]["name"],
        "uid": trainjob["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def test_deleting_a_trainjob_garbage_collects_its_children(
    core_v1: k8s.CoreV1Api, custom_objects: k8s.CustomObjectsApi, namespace: str
) -> None:
    owner = create_trainjob(custom_objects, namespace, minimal_trainjob("gc"))
    ref = owner_reference(owner)
    owned = {"metadata": {"name": "gc-owned", "ownerReferences": [ref]}, "data": {"k": "v"}}
    unowned = {"metadata": {"name": "gc-unowned"}, "data": {"k": "v"}}
    service = {
        "metadata": {"name": "gc-worker-0", "ownerReferences": [ref]},
        "spec": {"clusterIP": "None", "selector": {"x": "y"}, "ports": [{"port": 2222}]},
    }
    for body in (owned, unowned):
        core_v1.create_namespaced_config_map(namespace, model(k8s.V1ConfigMap, body))
    core_v1.create_namespaced_service(namespace, model(k8s.V1Service, service))

    custom_objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "gc")

    def names(items: Sequence[k8s.V1ConfigMap | k8s.V1Service]) -> set[str]:
        return {str(item.metadata.name) for item in items if item.metadata is not None}

    def gone() -> bool:
        config_maps = names(core_v1.list_namespaced_config_map(namespace).items)
        services = names(core_v1.list_namespaced_service(namespace).items)
        return "gc-owned" not in config_maps and "gc-worker-0" not in services

    waits.wait_until(
        gone, timeout=60, what="the garbage collector to delete the TrainJob's children"
    )
    # GC, not a blanket wipe: the ConfigMap without an ownerReference stays.
    assert "gc-unowned" in names(core_v1.list_namespaced_config_map(namespace).items)
