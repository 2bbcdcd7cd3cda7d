"""The NetworkPolicy that keeps a job's TensorFlow servers to the job itself (pure).

Why: TensorFlow's distributed server "accepts connections from anywhere, and executes the
graphs it is sent without performing any checks" (TensorFlow's SECURITY.md): anyone who
reaches a replica's TensorFlow port runs code with the replica's privileges (its service
account token, mounted Secrets, the checkpoint volume). So every job gets one policy, owned
by the job (garbage-collected with it), that selects the job's Pods and:

- lets the job's own Pods reach them on every port (TensorFlow's gRPC port, and the ports
  NCCL and other collectives open for themselves);
- lets anyone reach every *other* port, as before (a Pod a policy selects is isolated for
  every port no rule allows, so the rule lists the complement of the TensorFlow ports as
  TCP port ranges, and every UDP and SCTP port): metrics, a user's own servers, probes
  on any port keep working. Traffic from the Pod's own node (the kubelet's probes) is
  allowed by every enforcing implementation regardless of policy.
- leaves egress alone (DNS, data, storage, the progress server).

So the only thing refused is a connection to a TensorFlow port from outside the job: a
Pod of another job (its job-name label differs) or of another namespace.
"""

from __future__ import annotations

from typing import Any, Final

from trainjob.core import constants, model, naming

# spec.networkIsolation: only the job's replicas reach its TensorFlow ports (default), or
# no policy at all (the user opted out; a cluster that manages policies itself uses the
# operator's --no-network-policy instead).
ISOLATION_JOB, ISOLATION_NONE = model.NETWORK_ISOLATIONS

API_VERSION: Final = "networking.k8s.io/v1"
PLURAL: Final = "networkpolicies"
LAST_PORT: Final = 65535


def tf_ports(job: model.TrainJob) -> list[int]:
    """Every port a TensorFlow server of the job listens on (one per replica type)."""
    return sorted({model.tf_port(rs.template) for rs in job.replica_specs.values()})


def open_port_ranges(closed: list[int]) -> list[tuple[int, int]]:
    """The TCP port ranges (first, last) that are not in `closed` (sorted ports), in
    1..65535: the ports that stay open to everyone."""
    ranges: list[tuple[int, int]] = []
    start = 1
    for port in closed:
        if port > start:
            ranges.append((start, port - 1))
        start = max(start, port + 1)
    if start <= LAST_PORT:
        ranges.append((start, LAST_PORT))
    return ranges


def _port(first: int, last: int) -> dict[str, Any]:
    port: dict[str, Any] = {"protocol": "TCP", "port": first}
    if last > first:
        port["endPort"] = last
    return port


def policy_name(job: model.TrainJob) -> str:
    """The policy is named after its job, as the job's PodGroup is (one per job)."""
    return job.name


def render_network_policy(
    job: model.TrainJob, namespace: str, owner_reference: dict[str, Any] | None
) -> dict[str, Any]:
    """The job's NetworkPolicy (see the module docstring)."""
    selector = {"matchLabels": naming.job_selector(job.name)}
    metadata: dict[str, Any] = {
        "name": policy_name(job),
        "namespace": namespace,
        "labels": {
            **naming.job_selector(job.name),
            constants.LABEL_APP_NAME: constants.APP_NAME,
            constants.LABEL_APP_INSTANCE: job.name,
            constants.LABEL_APP_MANAGED_BY: constants.MANAGED_BY,
        },
    }
    if owner_reference is not None:
        metadata["ownerReferences"] = [owner_reference]
    other_ports = [_port(first, last) for first, last in open_port_ranges(tf_ports(job))]
    return {
        "apiVersion": API_VERSION,
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": selector}]},
                {"ports": [*other_ports, {"protocol": "UDP"}, {"protocol": "SCTP"}]},
            ],
        },
    }
