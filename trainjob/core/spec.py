"""The TrainJob spec: parse a manifest (a plain mapping) into frozen, typed data.

Parsing applies the same defaults as the CRD schema and reports *every* problem with its field
path, so `trainjob validate`, the local executor and the operator (InvalidSpec) give the same
messages. The CRD's schema and CEL rules reject most of these at admission already; this module
is the second line for objects that got past an older CRD, and the only line for local mode.

The front door of the spec: the model itself (:mod:`trainjob.core.model`), the field checks
(:mod:`trainjob.core.fieldcheck`) and strict YAML loading (:mod:`trainjob.core.yamlload`) live
beside it, and their public names are re-exported here (`spec.TrainJob`, `spec.SpecError`,
`spec.load_documents`: what the operator, the CLI and the tests import).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from trainjob.core import constants, quantity, storage
from trainjob.core.fieldcheck import Collector, check_template, field_path, type_name
from trainjob.core.model import (
    CLEAN_POD_POLICIES,
    DEFAULT_BACKOFF_LIMIT,
    DEFAULT_DISRUPTION_LIMIT,
    DEFAULT_STARTUP_DEADLINE_SECONDS,
    FRAMEWORKS,
    MAX_JOB_NAME_LENGTH,
    MAX_REPLICAS,
    NETWORK_ISOLATIONS,
    OBJECT_META_FIELDS,
    PROGRESS_DEADLINE_ACTIONS,
    RESTART_POLICIES,
    STRATEGIES,
    SUCCESS_POLICIES,
    CheckpointSpec,
    Problem,
    ReplicaSpec,
    RunPolicy,
    RuntimeSpec,
    SchedulingPolicy,
    SpecError,
    TrainJob,
    tf_container,
    tf_port,
)
from trainjob.core.yamlload import YamlError, load_documents

__all__ = [
    "CLEAN_POD_POLICIES",
    "FRAMEWORKS",
    "NETWORK_ISOLATIONS",
    "PROGRESS_DEADLINE_ACTIONS",
    "RESTART_POLICIES",
    "STRATEGIES",
    "SUCCESS_POLICIES",
    "Problem",
    "SpecError",
    "TrainJob",
    "YamlError",
    "load_documents",
    "parse",
    "problems_of",
    "tf_container",
    "tf_port",
]

_DNS_1035: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_ENTRYPOINT: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")
# A Secret's name: a DNS-1123 subdomain.
_SECRET_NAME: Final = re.compile(
    r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def _kubeflow_hint(obj: Mapping[str, Any]) -> Problem | None:
    """A Kubeflow TFJob is the most common wrong kind: one problem that says how to convert it,
    instead of field errors about a spec it was never meant to match."""
    api_version = obj.get("apiVersion")
    if obj.get("kind") == "TFJob" or (
        isinstance(api_version, str) and api_version.startswith("kubeflow.org/")
    ):
        return Problem(
            "kind",
            f"must be {constants.KIND}, got {obj.get('kind')!r} ({api_version}): a Kubeflow TFJob; "
            "convert it with `trainjob convert -f FILE` (e.g. `trainjob convert -f FILE | "
            "trainjob run -f -`)",
        )
    return None


def parse(manifest: object, *, require_images: bool = True) -> TrainJob:
    """Parse a TrainJob manifest; raise SpecError listing every problem found.

    `require_images=False` for local runs, which start processes and never use an image."""
    c = Collector()
    obj = c.mapping(manifest, "<document>")
    if c.problems:
        raise SpecError(c.problems)
    hint = _kubeflow_hint(obj)
    if hint is not None:
        raise SpecError([hint])
    if obj.get("apiVersion") != constants.API_VERSION:
        c.add("apiVersion", f"must be {constants.API_VERSION}, got {obj.get('apiVersion')!r}")
    if obj.get("kind") != constants.KIND:
        c.add("kind", f"must be {constants.KIND}, got {obj.get('kind')!r}")
    # kubectl and the API server refuse unknown fields (strict field validation): so do we, or
    # `trainjob validate` would pass a typo such as `specs:` or `metadata.lables`.
    c.unknown_keys(obj, "", ("apiVersion", "kind", "metadata", "spec", "status"))
    metadata = c.mapping(obj.get("metadata"), "metadata")
    c.unknown_keys(metadata, "metadata", OBJECT_META_FIELDS)
    name = _parse_name(c, metadata.get("name"))
    namespace = c.string(metadata.get("namespace"), "metadata.namespace")
    labels = c.mapping(metadata.get("labels"), "metadata.labels")
    spec = c.mapping(obj.get("spec"), "spec")
    if "spec" not in obj:
        c.add("spec", "is required")
    c.unknown_keys(
        spec,
        "spec",
        (
            "managedBy",
            "image",
            "runtime",
            "replicaSpecs",
            "checkpoint",
            "runPolicy",
            "successPolicy",
            "networkIsolation",
        ),
    )
    managed_by = c.string(spec.get("managedBy"), "spec.managedBy")
    image = c.string(spec.get("image"), "spec.image")
    replica_specs = _parse_replica_specs(c, spec.get("replicaSpecs"))
    runtime = _parse_runtime(c, spec.get("runtime"))
    checkpoint = _parse_checkpoint(c, spec.get("checkpoint"))
    run_policy = _parse_run_policy(c, spec.get("runPolicy"))
    success_policy = c.enum(
        spec.get("successPolicy"), "spec.successPolicy", SUCCESS_POLICIES, SUCCESS_POLICIES[0]
    )
    network_isolation = c.enum(
        spec.get("networkIsolation"),
        "spec.networkIsolation",
        NETWORK_ISOLATIONS,
        NETWORK_ISOLATIONS[0],
    )
    job = TrainJob(
        name=name,
        namespace=namespace,
        uid=metadata.get("uid") if isinstance(metadata.get("uid"), str) else None,
        generation=(
            metadata.get("generation") if isinstance(metadata.get("generation"), int) else None
        ),
        image=image,
        runtime=runtime,
        replica_specs=replica_specs,
        checkpoint=checkpoint,
        run_policy=run_policy,
        success_policy=success_policy,
        labels={str(k): str(v) for k, v in labels.items()},
        managed_by=managed_by,
        network_isolation=network_isolation,
    )
    _check_topology(c, job)
    _check_checkpoint_framework(c, job)
    if require_images:
        _check_images(c, job)
    if c.problems:
        raise SpecError(c.problems)
    return job


def problems_of(manifest: object) -> list[Problem]:
    """Every problem of a manifest; empty when it is valid."""
    try:
        parse(manifest)
    except SpecError as error:
        return list(error.problems)
    return []


def _parse_name(c: Collector, value: object) -> str:
    name = c.string(value, "metadata.name")
    if name is None:
        if value is None:
            c.add("metadata.name", "is required")
        return ""
    if len(name) > MAX_JOB_NAME_LENGTH:
        c.add(
            "metadata.name",
            f"must be at most {MAX_JOB_NAME_LENGTH} characters so that child names "
            f"<name>-<type>-<index> fit a 63-character DNS label, got {len(name)}",
        )
    if not _DNS_1035.match(name):
        c.add(
            "metadata.name",
            "must be a DNS-1035 label (lower-case letters, digits and '-', starting with a "
            f"letter) because it names Services, got {name!r}",
        )
    return name


def _parse_replica_specs(c: Collector, value: object) -> dict[str, ReplicaSpec]:
    path = "spec.replicaSpecs"
    raw = c.mapping(value, path)
    if value is None:
        c.add(path, "is required")
    elif isinstance(value, Mapping) and all(item is None for item in value.values()):
        c.add(path, "needs a chief or at least one worker (ps and evaluator alone never finish)")
    result: dict[str, ReplicaSpec] = {}
    for key, item in raw.items():
        if item is None:
            continue  # `worker: null` is no worker: the API server prunes nulls before checks
        item_path = field_path(path, key)
        if key not in constants.REPLICA_TYPES:
            # str(): YAML keys can be numbers or booleans (`1:`, `yes:`) in local manifests.
            lower = str(key).lower()
            hint = f" (did you mean {lower!r}?)" if lower in constants.REPLICA_TYPES else ""
            c.add(
                item_path,
                f"unknown replica type{hint}; must be one of {', '.join(constants.REPLICA_TYPES)}",
            )
            continue
        item_map = c.mapping(item, item_path)
        c.unknown_keys(item_map, item_path, ("replicas", "restartPolicy", "template"))
        replicas = c.integer(item_map.get("replicas"), f"{item_path}.replicas", 1, 0, MAX_REPLICAS)
        restart_policy = c.enum(
            item_map.get("restartPolicy"),
            f"{item_path}.restartPolicy",
            RESTART_POLICIES,
            RESTART_POLICIES[0],
        )
        template = c.mapping(item_map.get("template"), f"{item_path}.template")
        check_template(c, template, f"{item_path}.template")
        result[key] = ReplicaSpec(
            replicas=replicas if replicas is not None else 1,
            restart_policy=restart_policy,
            template=template,
        )
    return result


def _parse_runtime(c: Collector, value: object) -> RuntimeSpec | None:
    if value is None:
        return None
    path = "spec.runtime"
    raw = c.mapping(value, path)
    c.unknown_keys(raw, path, ("entrypoint", "strategy", "framework", "config"))
    entrypoint = c.string(raw.get("entrypoint"), f"{path}.entrypoint")
    if entrypoint is None and raw.get("entrypoint") is None:
        c.add(f"{path}.entrypoint", "is required (module:function, e.g. my_pkg.train:build)")
    elif entrypoint is not None and not _ENTRYPOINT.match(entrypoint):
        c.add(
            f"{path}.entrypoint",
            f"must look like package.module:function, got {entrypoint!r}",
        )
    config = c.mapping(raw.get("config"), f"{path}.config")
    return RuntimeSpec(
        entrypoint=entrypoint or "",
        strategy=c.enum(raw.get("strategy"), f"{path}.strategy", STRATEGIES, STRATEGIES[0]),
        framework=c.enum(raw.get("framework"), f"{path}.framework", FRAMEWORKS, FRAMEWORKS[0]),
        config=config,
    )


def _parse_checkpoint(c: Collector, value: object) -> CheckpointSpec | None:
    if value is None:
        return None
    path = "spec.checkpoint"
    raw = c.mapping(value, path)
    c.unknown_keys(raw, path, ("path", "claimName", "subPath", "credentialsSecret"))
    ckpt_path = c.string(raw.get("path"), f"{path}.path") or constants.DEFAULT_CHECKPOINT_PATH
    claim_name = c.string(raw.get("claimName"), f"{path}.claimName")
    sub_path = c.string(raw.get("subPath"), f"{path}.subPath")
    url_problem = storage.problem(ckpt_path)
    if url_problem is not None:
        c.add(f"{path}.path", url_problem)
    if claim_name is not None and not ckpt_path.startswith("/"):
        c.add(f"{path}.path", f"must be an absolute path when claimName is set, got {ckpt_path!r}")
    if sub_path is not None and claim_name is None:
        c.add(f"{path}.subPath", "needs claimName (it is a sub-path inside that volume)")
    secret = c.string(raw.get("credentialsSecret"), f"{path}.credentialsSecret")
    if secret is not None and not storage.is_url(ckpt_path):
        c.add(f"{path}.credentialsSecret", "is only for an s3:// or gs:// path")
    if secret is not None and not _SECRET_NAME.match(secret):
        c.add(f"{path}.credentialsSecret", f"{secret!r} is not a valid Secret name")
    return CheckpointSpec(
        path=ckpt_path, claim_name=claim_name, sub_path=sub_path, credentials_secret=secret
    )


def _parse_run_policy(c: Collector, value: object) -> RunPolicy:
    path = "spec.runPolicy"
    raw = c.mapping(value, path)
    c.unknown_keys(
        raw,
        path,
        (
            "cleanPodPolicy",
            "backoffLimit",
            "activeDeadlineSeconds",
            "ttlSecondsAfterFinished",
            "startupDeadlineSeconds",
            "disruptionLimit",
            "progressDeadlineSeconds",
            "progressDeadlineAction",
            "suspend",
            "schedulingPolicy",
        ),
    )
    # null is "not set", as everywhere: the API server prunes nulls, then applies the default.
    suspend = raw.get("suspend")
    if suspend is None:
        suspend = False
    if not isinstance(suspend, bool):
        c.add(f"{path}.suspend", f"must be a boolean, got {type_name(suspend)}")
        suspend = False
    backoff = c.integer(
        raw.get("backoffLimit"), f"{path}.backoffLimit", DEFAULT_BACKOFF_LIMIT, 0, None
    )
    startup = c.integer(
        raw.get("startupDeadlineSeconds"),
        f"{path}.startupDeadlineSeconds",
        DEFAULT_STARTUP_DEADLINE_SECONDS,
        1,
        None,
    )
    disruptions = c.integer(
        raw.get("disruptionLimit"), f"{path}.disruptionLimit", DEFAULT_DISRUPTION_LIMIT, 0, None
    )
    return RunPolicy(
        clean_pod_policy=c.enum(
            raw.get("cleanPodPolicy"),
            f"{path}.cleanPodPolicy",
            CLEAN_POD_POLICIES,
            "Running",
        ),
        backoff_limit=backoff if backoff is not None else DEFAULT_BACKOFF_LIMIT,
        active_deadline_seconds=c.integer(
            raw.get("activeDeadlineSeconds"), f"{path}.activeDeadlineSeconds", None, 1, None
        ),
        ttl_seconds_after_finished=c.integer(
            raw.get("ttlSecondsAfterFinished"), f"{path}.ttlSecondsAfterFinished", None, 0, None
        ),
        startup_deadline_seconds=(
            startup if startup is not None else DEFAULT_STARTUP_DEADLINE_SECONDS
        ),
        disruption_limit=disruptions if disruptions is not None else DEFAULT_DISRUPTION_LIMIT,
        progress_deadline_seconds=c.integer(
            raw.get("progressDeadlineSeconds"), f"{path}.progressDeadlineSeconds", None, 1, None
        ),
        progress_deadline_action=c.enum(
            raw.get("progressDeadlineAction"),
            f"{path}.progressDeadlineAction",
            PROGRESS_DEADLINE_ACTIONS,
            "Restart",
        ),
        suspend=suspend,
        scheduling_policy=_parse_scheduling(c, raw.get("schedulingPolicy")),
    )


def _parse_scheduling(c: Collector, value: object) -> SchedulingPolicy | None:
    if value is None:
        return None
    path = "spec.runPolicy.schedulingPolicy"
    raw = c.mapping(value, path)
    c.unknown_keys(
        raw,
        path,
        ("minAvailable", "queue", "priorityClass", "scheduleTimeoutSeconds", "minResources"),
    )
    min_resources: dict[str, str] | None = None
    if raw.get("minResources") is not None:
        given = c.mapping(raw.get("minResources"), f"{path}.minResources")
        for name, why in quantity.invalid(given):
            c.add(f"{path}.minResources.{name}", why)
        min_resources = {str(k): str(v) for k, v in given.items()}
    return SchedulingPolicy(
        min_available=c.integer(raw.get("minAvailable"), f"{path}.minAvailable", None, 1, None),
        queue=c.string(raw.get("queue"), f"{path}.queue"),
        priority_class=c.string(raw.get("priorityClass"), f"{path}.priorityClass"),
        schedule_timeout_seconds=c.integer(
            raw.get("scheduleTimeoutSeconds"), f"{path}.scheduleTimeoutSeconds", None, 1, None
        ),
        min_resources=min_resources,
    )


def _check_topology(c: Collector, job: TrainJob) -> None:
    """Cross-field rules; each is also a CEL rule in the CRD (same message)."""
    path = "spec.replicaSpecs"
    chief, workers, ps = (
        job.replicas(t) for t in (constants.CHIEF, constants.WORKER, constants.PS)
    )
    if not job.replica_specs:
        return
    if chief > 1:
        c.add(f"{path}.chief.replicas", f"must be 0 or 1 (TensorFlow has one chief), got {chief}")
    if job.replicas(constants.EVALUATOR) > 1:
        c.add(f"{path}.evaluator.replicas", "must be 0 or 1 (TensorFlow has one evaluator)")
    if chief + workers == 0:
        c.add(path, "needs a chief or at least one worker (ps and evaluator alone never finish)")
    if ps > 0 and chief + workers == 0:
        c.add(f"{path}.ps", "needs a chief or workers to train")
    if job.runtime is None:
        return
    strategy = job.runtime.strategy
    if strategy == "ParameterServer" and (ps == 0 or chief == 0):
        c.add(
            "spec.runtime.strategy",
            "ParameterServer needs replicaSpecs.ps and a chief (the coordinator)",
        )
    if strategy in ("MultiWorkerMirrored", "DTensor", "Mirrored", "OneDevice") and ps > 0:
        c.add(
            "spec.runtime.strategy", f"{strategy} does not use ps replicas; remove replicaSpecs.ps"
        )
    if strategy in ("Mirrored", "OneDevice") and chief + workers > 1:
        c.add(
            "spec.runtime.strategy",
            f"{strategy} runs on one machine; use MultiWorkerMirrored for "
            f"{chief + workers} replicas",
        )
    if job.runtime.framework == "Estimator" and strategy == "DTensor":
        c.add("spec.runtime.framework", "Estimator cannot run with the DTensor strategy")
    if (
        job.runtime.framework == "Estimator"
        and job.replicas(constants.EVALUATOR) > 0
        and chief == 0
    ):
        # TF 2.15 refuses such a cluster on every task ('it must have one "chief" node').
        c.add(f"{path}.chief", "Estimator with an evaluator needs a chief replica")


def _check_checkpoint_framework(c: Collector, job: TrainJob) -> None:
    """A checkpoint location the runtime's framework can use (storage.framework_problem)."""
    if job.checkpoint is None or job.runtime is None:
        return
    problem = storage.framework_problem(job.checkpoint.path, job.runtime.framework)
    if problem is not None:
        c.add("spec.checkpoint.path", problem)


def _check_images(c: Collector, job: TrainJob) -> None:
    """Every replica's TensorFlow container needs an image: its own or spec.image."""
    if job.image is not None:
        return
    for rtype, replica in job.replica_specs.items():
        if replica.replicas == 0:
            continue
        container = tf_container(replica.template)
        if container is None or not isinstance(container.get("image"), str):
            c.add(
                f"spec.replicaSpecs.{rtype}.template",
                "needs a container image (set spec.image or the tensorflow container's image)",
            )
