"""The CRD's rule for spec.checkpoint.path URLs, on a real API server: s3:// and gs:// with a
valid bucket are stored as written; any other scheme is refused naming the field (the same
rule as the core's parser: tests/unit/test_checkpoint_storage.py)."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.integration.test_crd import create_trainjob, minimal_trainjob, server_message

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize(
    "path", ["s3://ckpt/team-a/mnist", "s3://ckpt", "gs://my_bucket/a/b", "/checkpoints"]
)
def test_store_urls_are_accepted(
    custom_objects: k8s.CustomObjectsApi, namespace: str, path: str
) -> None:
    body = minimal_trainjob("ok-" + str(abs(hash(path)) % 10_000))
    body["spec"]["checkpoint"] = {"path": path}
    created = create_trainjob(custom_objects, namespace, body)
    assert created["spec"]["checkpoint"]["path"] == path


def test_a_credentials_secret_goes_with_a_store_url_only(
    custom_objects: k8s.CustomObjectsApi, namespace: str
) -> None:
    body = minimal_trainjob("with-secret")
    body["spec"]["checkpoint"] = {"path": "s3://ckpt/x", "credentialsSecret": "store-keys"}
    created = create_trainjob(custom_objects, namespace, body)
    assert created["spec"]["checkpoint"]["credentialsSecret"] == "store-keys"
    body = minimal_trainjob("claim-secret")
    body["spec"]["checkpoint"] = {"path": "/checkpoints", "credentialsSecret": "store-keys"}
    with pytest.raises(ApiException) as refused:
        create_trainjob(custom_objects, namespace, body)
    assert "spec.checkpoint.credentialsSecret: is only for an s3:// or gs:// path" in (
        server_message(refused.value)
    )


@pytest.mark.parametrize("path", ["hdfs://nn/ckpt", "s3://Bad_Bucket/x", "az://c/x", "s3:///x"])
def test_other_urls_are_refused_naming_the_field(
    custom_objects: k8s.CustomObjectsApi, namespace: str, path: str
) -> None:
    body = minimal_trainjob("bad")
    body["spec"]["checkpoint"] = {"path": path}
    with pytest.raises(ApiException) as refused:
        create_trainjob(custom_objects, namespace, body)
    assert refused.value.status == 422
    message = server_message(refused.value)
    assert "spec.checkpoint.path: a URL must be s3://bucket/prefix or gs://bucket/prefix" in message
