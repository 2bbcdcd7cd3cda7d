"""A user's labels and annotations on a replica template are the user's: the Pods and Services
of a TrainJob and of a TFJob keep them, ours are added only where the user set none
(`app.kubernetes.io/*`), the labels our selectors rely on cannot be set by a template (a
validation error naming the field), and every selector selects on our own labels only."""

from __future__ import annotations

import io
from typing import Any

import pytest
import yaml

from trainjob import cli
from trainjob.core import isolation, render, spec, tfjob
from trainjob_operator import doors, informer

# What Polyaxon writes on every Pod of a run (it finds them by instance + managed-by).
RECOMMENDED = {
    "app.kubernetes.io/name": "my-model",
    "app.kubernetes.io/instance": "run-42",
    "app.kubernetes.io/managed-by": "my-platform",
}
OURS = {
    "app.kubernetes.io/name": "trainjob",
    "app.kubernetes.io/instance": "labelled",
    "app.kubernetes.io/component": "worker",
    "app.kubernetes.io/managed-by": "trainjob-operator",
    "app.kubernetes.io/part-of": "trainjob",
}
OPTIONS = render.RenderOptions(namespace="team-a")
OWN_PREFIXES = ("trainjob.dev/",)
KUBEFLOW_PREFIXES = ("trainjob.dev/", "training.kubeflow.org/")


def trainjob_manifest(
    labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "labelled"},
        "spec": {
            "image": "tf:2",
            "replicaSpecs": {
                "worker": {
                    "replicas": 2,
                    "template": {
                        "metadata": metadata,
                        "spec": {"containers": [{"name": "tensorflow", "command": ["python"]}]},
                    },
                }
            },
        },
    }


def tfjob_manifest(labels: dict[str, str] | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {"containers": [{"name": "tensorflow", "image": "tf:2", "command": ["python"]}]}
    }
    if labels is not None:
        template["metadata"] = {"labels": labels, "annotations": {"team": "vision"}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "labelled", "namespace": "team-a", "uid": "u1", "generation": 1},
        "spec": {
            "tfReplicaSpecs": {
                "Chief": {"replicas": 1, "template": template},
                "Worker": {"replicas": 2, "template": template},
            }
        },
    }


def app_labels(obj: dict[str, Any]) -> dict[str, str]:
    labels = obj["metadata"].get("labels") or {}
    return {k: v for k, v in labels.items() if k.startswith("app.kubernetes.io/")}


def rendered(manifest: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    objects = render.render_all(spec.parse(manifest), OPTIONS, None)
    return [o for o in objects if o["kind"] == "Pod"], [
        o for o in objects if o["kind"] == "Service"
    ]


def tfjob_rendered(raw: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    job = doors.TFJobDoor().parse(doors.tfjob_view(raw))
    options = render.RenderOptions(
        namespace="team-a", kind_labels=tfjob.KubeflowLabels(tfjob.replica_types(raw))
    )
    owner = render.Owner("labelled", "u1", tfjob.API_VERSION, tfjob.KIND)
    objects = render.render_all(job, options, owner)
    return [o for o in objects if o["kind"] == "Pod"], [
        o for o in objects if o["kind"] == "Service"
    ]


# -- TrainJob ---------------------------------------------------------------------------------


def test_a_templates_recommended_labels_are_kept_on_pods_and_services() -> None:
    pods, services = rendered(trainjob_manifest({**RECOMMENDED, "team": "vision"}))
    assert len(pods) == 2 and len(services) == 2
    for obj in pods + services:
        # The user's set, and none of ours mixed in (no component or part-of of ours).
        assert app_labels(obj) == RECOMMENDED, obj["metadata"]["name"]
    for pod in pods:
        assert pod["metadata"]["labels"]["team"] == "vision"
        assert pod["metadata"]["labels"]["trainjob.dev/job-name"] == "labelled"


def test_without_recommended_labels_ours_are_added() -> None:
    pods, services = rendered(trainjob_manifest({"team": "vision"}))
    for obj in pods + services:
        assert app_labels(obj) == OURS, obj["metadata"]["name"]


def test_one_recommended_label_of_the_users_means_none_of_ours() -> None:
    """The recommended labels describe one application together: `name: my-model` beside our
    `part-of: trainjob` would describe a different one."""
    pods, services = rendered(trainjob_manifest({"app.kubernetes.io/part-of": "recsys"}))
    for obj in pods + services:
        assert app_labels(obj) == {"app.kubernetes.io/part-of": "recsys"}


def test_a_templates_annotations_are_kept_beside_ours() -> None:
    pods, services = rendered(trainjob_manifest(annotations={"team": "vision", "x/y": "z"}))
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert annotations["team"] == "vision" and annotations["x/y"] == "z"
        assert annotations["trainjob.dev/attempt"] == "0"
    assert all("annotations" not in s["metadata"] for s in services)


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("trainjob.dev/job-name", "labels"),
        ("trainjob.dev/replica-type", "labels"),
        ("trainjob.dev/replica-index", "labels"),
        ("trainjob.dev/attempt", "annotations"),
        ("trainjob.dev/progress-ca", "annotations"),
    ],
)
def test_a_template_cannot_set_the_keys_the_operator_relies_on(key: str, kind: str) -> None:
    manifest = trainjob_manifest(**{kind: {key: "x"}})
    problems = spec.problems_of(manifest)
    assert [p.path for p in problems] == [
        f"spec.replicaSpecs.worker.template.metadata.{kind}[{key!r}]"
    ]
    assert "set by TrainJob" in problems[0].message


def test_a_templates_other_trainjob_dev_keys_are_its_own() -> None:
    """Only the keys the operator sets are reserved (the test kubelet reads
    trainjob.dev/kwok-exit-code from templates)."""
    manifest = trainjob_manifest({"trainjob.dev/team": "a"}, {"trainjob.dev/kwok-exit-code": "0"})
    pods, _ = rendered(manifest)
    assert pods[0]["metadata"]["labels"]["trainjob.dev/team"] == "a"
    assert pods[0]["metadata"]["annotations"]["trainjob.dev/kwok-exit-code"] == "0"


def test_every_selector_selects_on_our_own_labels_only() -> None:
    job = spec.parse(trainjob_manifest(RECOMMENDED))
    _, services = rendered(trainjob_manifest(RECOMMENDED))
    for service in services:
        assert all(k.startswith(OWN_PREFIXES) for k in service["spec"]["selector"])
    policy = isolation.render_network_policy(job, "team-a", None)
    selectors = [policy["spec"]["podSelector"]] + [
        peer["podSelector"] for rule in policy["spec"]["ingress"] for peer in rule.get("from", [])
    ]
    for selector in selectors:
        assert all(k.startswith(OWN_PREFIXES) for k in selector["matchLabels"])
    for kind in (*informer.KINDS, informer.WORKLOADS, *informer.KUBEFLOW_KINDS):
        assert "app.kubernetes.io" not in kind.selector


def test_trainjob_render_keeps_the_templates_labels() -> None:
    """`trainjob render -f job.yaml` shows what the operator creates."""
    out, err = io.StringIO(), io.StringIO()
    document = yaml.safe_dump(trainjob_manifest({**RECOMMENDED, "team": "vision"}))
    code = cli.main(["render", "-f", "-"], out=out, stdin=io.StringIO(document), err=err)
    assert code == 0, err.getvalue()
    objects = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    assert [o["kind"] for o in objects] == ["Service", "Service", "Pod", "Pod"]
    for obj in objects:
        assert app_labels(obj) == RECOMMENDED


def test_trainjob_validate_names_a_reserved_label() -> None:
    out, err = io.StringIO(), io.StringIO()
    document = yaml.safe_dump(trainjob_manifest({"trainjob.dev/job-name": "other"}))
    code = cli.main(["validate", "-f", "-"], out=out, stdin=io.StringIO(document), err=err)
    assert code == 1
    assert "spec.replicaSpecs.worker.template.metadata.labels['trainjob.dev/job-name']" in (
        out.getvalue()
    )


# -- TFJob ------------------------------------------------------------------------------------


def test_a_tfjob_templates_recommended_labels_are_kept_as_training_operator_keeps_them() -> None:
    pods, services = tfjob_rendered(tfjob_manifest({**RECOMMENDED, "team": "vision"}))
    assert len(pods) == 3
    for pod in pods:
        assert app_labels(pod) == RECOMMENDED
        assert pod["metadata"]["labels"]["team"] == "vision"
        assert pod["metadata"]["annotations"]["team"] == "vision"
        assert pod["metadata"]["labels"]["training.kubeflow.org/job-name"] == "labelled"
    for service in services:
        # training-operator's Services carry its own labels only: so do ours (and ours).
        assert app_labels(service) == {}
        assert all(k.startswith(KUBEFLOW_PREFIXES) for k in service["metadata"]["labels"])
        assert all(k.startswith("training.kubeflow.org/") for k in service["spec"]["selector"])


def test_a_tfjob_gets_no_recommended_labels_of_ours() -> None:
    """training-operator v1.9.4 sets none: a TFJob's children look as it makes them."""
    pods, services = tfjob_rendered(tfjob_manifest())
    for obj in pods + services:
        assert app_labels(obj) == {}
        assert all(k.startswith(KUBEFLOW_PREFIXES) for k in obj["metadata"]["labels"])


@pytest.mark.parametrize(
    "key",
    [
        "training.kubeflow.org/job-name",
        "training.kubeflow.org/operator-name",
        "training.kubeflow.org/replica-type",
        "training.kubeflow.org/replica-index",
        "training.kubeflow.org/job-role",
        "trainjob.dev/job-name",
    ],
)
def test_a_tfjob_template_cannot_set_the_labels_selectors_rely_on(key: str) -> None:
    raw = tfjob_manifest({key: "other"})
    with pytest.raises(spec.SpecError) as raised:
        doors.TFJobDoor().parse(doors.tfjob_view(raw))
    paths = [p.path for p in raised.value.problems]
    assert f"spec.tfReplicaSpecs[Chief].template.metadata.labels[{key!r}]" in paths
    assert f"spec.tfReplicaSpecs[Worker].template.metadata.labels[{key!r}]" in paths
