"""Every TrainJob and TFJob manifest in the docs (the README and the site's pages) is one the
API server accepts: each is created as a server-side dry run (dryRun=All, strict field
validation) against the real kube-apiserver with both CRDs installed, so the schema, the
defaults and the CEL rules all judge it. A manifest the API server would refuse fails, with
its message and the page and line it is on."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.controlplane.cluster import ControlPlane
from tests.integration.conftest import TFJOB_CRD
from tests.support import markdown

# kind -> (group, version, plural) of the kinds the docs' manifests are checked as
KINDS: dict[str, tuple[str, str, str]] = {
    "TrainJob": ("trainjob.dev", "v1alpha1", "trainjobs"),
    "TFJob": ("kubeflow.org", "v1", "tfjobs"),
}
YAML_LANGS = frozenset({"yaml", "yml"})


def _docs_manifests() -> list[tuple[str, Any]]:
    """(where, document) for every document of kind TrainJob or TFJob in a YAML block; a
    block that names such a kind but is no YAML is kept as its text, and fails."""
    found: list[tuple[str, Any]] = []
    for path in markdown.doc_files():
        for block in markdown.code_blocks(path):
            if block.lang not in YAML_LANGS:
                continue
            try:
                documents = list(yaml.safe_load_all(block.text))
            except yaml.YAMLError:
                if any(f"kind: {kind}" in block.text for kind in KINDS):
                    found.append((block.where, block.text))
                continue
            for number, document in enumerate(documents):
                if isinstance(document, dict) and document.get("kind") in KINDS:
                    found.append((f"{block.where}#{number}", document))
    return found


DOCS_MANIFESTS = _docs_manifests()


@pytest.fixture(scope="module")
def docs_namespace(control_plane: ControlPlane, core_v1: k8s.CoreV1Api) -> Iterator[str]:
    """One namespace for every dry run of this module, with TFJob's CRD served too."""
    control_plane.apply_crds([TFJOB_CRD])
    name = f"docs-{uuid.uuid4().hex[:6]}"
    core_v1.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core_v1.delete_namespace(name)


def test_docs_have_manifests_of_both_kinds() -> None:
    kinds = {doc.get("kind") for _, doc in DOCS_MANIFESTS if isinstance(doc, dict)}
    assert kinds == set(KINDS), DOCS_MANIFESTS
    assert len(DOCS_MANIFESTS) >= 5, DOCS_MANIFESTS


@pytest.mark.parametrize(
    "manifest", [doc for _, doc in DOCS_MANIFESTS], ids=[where for where, _ in DOCS_MANIFESTS]
)
def test_docs_manifest_is_accepted_by_the_api_server(
    custom_objects: k8s.CustomObjectsApi, docs_namespace: str, manifest: Any
) -> None:
    assert isinstance(manifest, dict), f"not YAML, though it names a kind:\n{manifest}"
    group, version, plural = KINDS[manifest["kind"]]
    assert manifest.get("apiVersion") == f"{group}/{version}", manifest.get("apiVersion")
    body = copy.deepcopy(manifest)
    body.setdefault("metadata", {})["namespace"] = docs_namespace
    try:
        custom_objects.create_namespaced_custom_object(
            group, version, docs_namespace, plural, body, dry_run="All", field_validation="Strict"
        )
    except ApiException as exc:
        message = json.loads(exc.body or "{}").get("message", exc.body)
        pytest.fail(f"the API server refused it ({exc.status}): {message}", pytrace=False)
