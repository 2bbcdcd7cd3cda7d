"""The TrainJob spec model: parse a manifest (a plain mapping) into frozen, typed data.

Parsing applies the same defaults as the CRD schema and reports *every* problem with its field
path, so `trainjob validate`, the local executor and the operator (InvalidSpec) give the same
messages. The CRD's schema and CEL rules reject most of these at admission already; this module
is the second line for objects that got past an older CRD, and the only line for local mode.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

from trainjob.core import constants, quantity

RESTART_POLICIES: Final = ("Never", "OnFailure", "Always", "ExitCode")
CLEAN_POD_POLICIES: Final = ("All", "Running", "None")
# What runPolicy.progressDeadlineSeconds does to a job whose chief reports no new step.
PROGRESS_DEADLINE_ACTIONS: Final = ("Restart", "Fail")
SUCCESS_POLICIES: Final = ("ChiefOrWorker0", "AllWorkers")
STRATEGIES: Final = (
    "Auto",
    "MultiWorkerMirrored",
    "ParameterServer",
    "Mirrored",
    "OneDevice",
    "DTensor",
)
FRAMEWORKS: Final = ("Keras", "Estimator")

DEFAULT_BACKOFF_LIMIT: Final = 6  # the same default as a Kubernetes batch/v1 Job
DEFAULT_STARTUP_DEADLINE_SECONDS: Final = 600
# Restarts after a preemption or eviction (not counted toward backoffLimit): a bound of their
# own, so a job preempted in a loop still ends.
DEFAULT_DISRUPTION_LIMIT: Final = 10
# Longest child name is "<job>-evaluator-<index>"; with up to 4 index digits it must fit the
# 63-character DNS label that both Pod hostnames and Service names require.
MAX_JOB_NAME_LENGTH: Final = 48
MAX_REPLICAS: Final = 9999
# The fields of a Kubernetes ObjectMeta (their values are the API server's to check).
OBJECT_META_FIELDS: Final = (
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
)
# The CRD's maxItems for a template's containers and a container's ports.
MAX_CONTAINERS: Final = 32
MAX_PORTS: Final = 64

_DNS_1035: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_ENTRYPOINT: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a manifest, at a dotted field path such as `spec.replicaSpecs.ps`."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """A manifest that cannot run; carries every problem found, not only the first."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    replicas: int
    restart_policy: str
    # The PodTemplateSpec exactly as the user wrote it; rendering copies it, never mutates it.
    template: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class RuntimeSpec:
    entrypoint: str
    strategy: str
    framework: str
    config: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class CheckpointSpec:
    path: str
    claim_name: str | None
    sub_path: str | None


@dataclasses.dataclass(frozen=True)
class SchedulingPolicy:
    min_available: int | None
    queue: str | None
    priority_class: str | None
    schedule_timeout_seconds: int | None
    # What the whole gang needs at once (a ResourceList); None: the operator sums the
    # requests of the first minAvailable Pods, as training-operator does.
    min_resources: Mapping[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class RunPolicy:
    clean_pod_policy: str = "Running"
    backoff_limit: int = DEFAULT_BACKOFF_LIMIT
    active_deadline_seconds: int | None = None
    ttl_seconds_after_finished: int | None = None
    startup_deadline_seconds: int = DEFAULT_STARTUP_DEADLINE_SECONDS
    disruption_limit: int = DEFAULT_DISRUPTION_LIMIT
    # A Running job whose chief reported no new step for this long is stalled (a hung
    # collective, a dead input pipeline): restarted from its checkpoint (counted) or failed.
    progress_deadline_seconds: int | None = None
    progress_deadline_action: str = "Restart"
    suspend: bool = False
    scheduling_policy: SchedulingPolicy | None = None


@dataclasses.dataclass(frozen=True)
class TrainJob:
    """A parsed, defaulted, valid TrainJob."""

    name: str
    namespace: str | None
    uid: str | None
    generation: int | None
    image: str | None
    runtime: RuntimeSpec | None
    replica_specs: Mapping[str, ReplicaSpec]
    checkpoint: CheckpointSpec | None
    run_policy: RunPolicy
    success_policy: str
    labels: Mapping[str, str]
    # The controller that runs the job (spec.managedBy): None is this operator.
    managed_by: str | None = None

    def replicas(self, replica_type: str) -> int:
        spec = self.replica_specs.get(replica_type)
        return spec.replicas if spec else 0

    def replica_keys(self) -> list[tuple[str, int]]:
        """Every (replica type, index) of the job, in TF_CONFIG order."""
        return [
            (rtype, index)
            for rtype in constants.REPLICA_TYPES
            for index in range(self.replicas(rtype))
        ]

    @property
    def uses_parameter_servers(self) -> bool:
        return self.replicas(constants.PS) > 0

    @property
    def total_replicas(self) -> int:
        return sum(self.replicas(rtype) for rtype in constants.REPLICA_TYPES)


class _Collector:
    """Gathers problems while parsing so one pass reports all of them."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def mapping(self, value: object, path: str) -> Mapping[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.add(path, f"must be an object, got {_type_name(value)}")
            return {}
        return value

    def integer(
        self, value: object, path: str, default: int | None, minimum: int, maximum: int | None
    ) -> int | None:
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"must be an integer, got {_type_name(value)}")
            return default
        if value < minimum:
            self.add(path, f"must be >= {minimum}, got {value}")
            return default
        if maximum is not None and value > maximum:
            self.add(path, f"must be <= {maximum}, got {value}")
            return default
        return value

    def string(self, value: object, path: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            self.add(path, f"must be a non-empty string, got {_type_name(value)}")
            return None
        return value

    def enum(self, value: object, path: str, allowed: Sequence[str], default: str) -> str:
        if value is None:
            return default
        if value not in allowed:
            self.add(path, f"must be one of {', '.join(allowed)}, got {value!r}")
            return default
        assert isinstance(value, str)
        return value

    def unknown_keys(self, obj: Mapping[str, Any], path: str, known: Sequence[str]) -> None:
        for key in obj:
            if key not in known:
                self.add(_field(path, key), f"unknown field (known: {', '.join(known)})")


_PLAIN_KEY: Final = re.compile(r"^[A-Za-z0-9_-]+$")


def _field(path: str, key: object) -> str:
    """`path.key`, or `path['odd key']` for a key that is empty, not a string or has dots, so
    the path still reads as one field."""
    if isinstance(key, str) and _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__
    )


class YamlError(ValueError):
    """Text that is not YAML a Kubernetes client would accept; the message names the source."""


MAX_YAML_NODES: Final = 1_000_000


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping, as kubectl does (PyYAML keeps
    the last value silently, so `worker:` twice would run with the second one)."""


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many nodes a document has once its aliases are expanded (memoised: aliases share
    nodes, so this stays cheap while the number it computes can be astronomical)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(child, sizes) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            size += _expanded_size(key, sizes) + _expanded_size(value, sizes)
    sizes[id(node)] = size
    return size


def _no_duplicate_keys(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key; construct_mapping reports it
            break
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                key_node.start_mark,
            )
        seen[key] = key_node
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _no_duplicate_keys,
)


def load_documents(text: str, source: str) -> list[Any]:
    """Every non-empty YAML document of `text`; YamlError naming `source` (a file name, or
    `<stdin>`) and the line when it is not valid YAML or repeats a key."""
    loader = _StrictLoader(text)
    # Marks in messages then say `in "job.yaml", line 3` instead of `<unicode string>`.
    loader.name = source
    documents: list[Any] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is not None and _expanded_size(node, {}) > MAX_YAML_NODES:
                # Nested aliases ("billion laughs") would expand when the job is rendered.
                raise YamlError(
                    f"{source}: its aliases (*name) expand to more than {MAX_YAML_NODES:,} "
                    "values; no manifest needs that"
                )
            document = loader.construct_document(node)
            if document is not None:
                documents.append(document)
    except yaml.YAMLError as error:
        raise YamlError(f"{source} is not valid YAML: {error}") from error
    except RecursionError as error:  # `[[[[...` thousands deep: no manifest nests like that
        raise YamlError(f"{source} is nested too deeply to be a manifest") from error
    finally:
        loader.dispose()
    return documents


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
    c = _Collector()
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
    )
    _check_topology(c, job)
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


def _parse_name(c: _Collector, value: object) -> str:
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


def _parse_replica_specs(c: _Collector, value: object) -> dict[str, ReplicaSpec]:
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
        item_path = _field(path, key)
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
        _check_template(c, template, f"{item_path}.template")
        result[key] = ReplicaSpec(
            replicas=replicas if replicas is not None else 1,
            restart_policy=restart_policy,
            template=template,
        )
    return result


def _check_template(c: _Collector, template: Mapping[str, Any], path: str) -> None:
    """What the CRD's schema checks of a PodTemplateSpec, plus container names (the CRD keeps
    templates open, so the API server checks the rest when the operator creates the Pod)."""
    metadata = c.mapping(template.get("metadata"), f"{path}.metadata")
    for key in ("labels", "annotations"):
        _check_string_map(c, metadata.get(key), f"{path}.metadata.{key}")
    pod_spec = c.mapping(template.get("spec"), f"{path}.spec")
    # The renderer merges its own entries into these: they must have the shape it expects.
    c.mapping(pod_spec.get("securityContext"), f"{path}.spec.securityContext")
    _check_objects(c, pod_spec.get("volumes"), f"{path}.spec.volumes")
    containers = pod_spec.get("containers")
    if containers is None:
        return
    cpath = f"{path}.spec.containers"
    if not isinstance(containers, list) or not containers:
        c.add(cpath, "must be a non-empty array")
        return
    if len(containers) > MAX_CONTAINERS:
        c.add(cpath, f"must have at most {MAX_CONTAINERS} items, got {len(containers)}")
    names = [
        _check_container(c, container, f"{cpath}[{i}]") for i, container in enumerate(containers)
    ]
    if len(containers) > 1 and constants.DEFAULT_CONTAINER_NAME not in names:
        c.add(
            cpath,
            f"with several containers, one must be named {constants.DEFAULT_CONTAINER_NAME} "
            "(it gets TF_CONFIG and the TensorFlow port)",
        )


def _check_container(c: _Collector, container: object, path: str) -> str | None:
    """One container's name, image and ports; returns its name when it is valid."""
    if not isinstance(container, Mapping):
        # The CRD says "must be of type object" for null items too (a YAML `- ` with nothing).
        c.add(path, f"must be an object, got {_type_name(container)}")
        return None
    image = container.get("image")
    if image is not None and not isinstance(image, str):
        c.add(f"{path}.image", f"must be a string, got {_type_name(image)}")
    _check_ports(c, container.get("ports"), f"{path}.ports")
    for j, variable in _check_objects(c, container.get("env"), f"{path}.env"):
        if not isinstance(variable.get("name"), str):
            c.add(f"{path}.env[{j}].name", "is required (a string)")
    _check_objects(c, container.get("volumeMounts"), f"{path}.volumeMounts")
    c.mapping(container.get("securityContext"), f"{path}.securityContext")
    name = container.get("name")
    if not isinstance(name, str) or not _DNS_1123.match(name) or len(name) > 63:
        c.add(f"{path}.name", "is required and must be a DNS-1123 label")
        return None
    return name


def _check_string_map(c: _Collector, value: object, path: str) -> None:
    for key, item in c.mapping(value, path).items():
        if item is not None and not isinstance(item, str):  # null: pruned, as above
            c.add(_field(path, key), f"must be a string, got {_type_name(item)}")


def _check_objects(c: _Collector, value: object, path: str) -> list[tuple[int, Mapping[str, Any]]]:
    """An optional array of objects; the items that are objects, with their index."""
    if value is None:
        return []
    if not isinstance(value, list):
        c.add(path, f"must be an array, got {_type_name(value)}")
        return []
    objects: list[tuple[int, Mapping[str, Any]]] = []
    for i, item in enumerate(value):
        if isinstance(item, Mapping):
            objects.append((i, item))
        else:
            c.add(f"{path}[{i}]", f"must be an object, got {_type_name(item)}")
    return objects


def _check_ports(c: _Collector, ports: object, path: str) -> None:
    if ports is None:
        return
    if not isinstance(ports, list):
        c.add(path, f"must be an array, got {_type_name(ports)}")
        return
    if len(ports) > MAX_PORTS:
        c.add(path, f"must have at most {MAX_PORTS} items, got {len(ports)}")
    for j, port in enumerate(ports):
        ppath = f"{path}[{j}]"
        if not isinstance(port, Mapping):
            c.add(ppath, f"must be an object, got {_type_name(port)}")
            continue
        name = port.get("name")
        if name is not None and not isinstance(name, str):
            c.add(f"{ppath}.name", f"must be a string, got {_type_name(name)}")
        if port.get("containerPort") is None:
            c.add(f"{ppath}.containerPort", "is required")
        else:
            c.integer(port.get("containerPort"), f"{ppath}.containerPort", None, 1, 65535)


def _parse_runtime(c: _Collector, value: object) -> RuntimeSpec | None:
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


def _parse_checkpoint(c: _Collector, value: object) -> CheckpointSpec | None:
    if value is None:
        return None
    path = "spec.checkpoint"
    raw = c.mapping(value, path)
    c.unknown_keys(raw, path, ("path", "claimName", "subPath"))
    ckpt_path = c.string(raw.get("path"), f"{path}.path") or constants.DEFAULT_CHECKPOINT_PATH
    claim_name = c.string(raw.get("claimName"), f"{path}.claimName")
    sub_path = c.string(raw.get("subPath"), f"{path}.subPath")
    if claim_name is not None and not ckpt_path.startswith("/"):
        c.add(f"{path}.path", f"must be an absolute path when claimName is set, got {ckpt_path!r}")
    if sub_path is not None and claim_name is None:
        c.add(f"{path}.subPath", "needs claimName (it is a sub-path inside that volume)")
    return CheckpointSpec(path=ckpt_path, claim_name=claim_name, sub_path=sub_path)


def _parse_run_policy(c: _Collector, value: object) -> RunPolicy:
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
        c.add(f"{path}.suspend", f"must be a boolean, got {_type_name(suspend)}")
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


def _parse_scheduling(c: _Collector, value: object) -> SchedulingPolicy | None:
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


def _check_topology(c: _Collector, job: TrainJob) -> None:
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


def _check_images(c: _Collector, job: TrainJob) -> None:
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


def tf_container(template: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container that runs TensorFlow: the one named `tensorflow`, else the only one."""
    pod_spec = template.get("spec")
    if not isinstance(pod_spec, Mapping):
        return None
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return None
    for container in containers:
        if (
            isinstance(container, Mapping)
            and container.get("name") == constants.DEFAULT_CONTAINER_NAME
        ):
            return container
    only = containers[0]
    return only if len(containers) == 1 and isinstance(only, Mapping) else None


def tf_port(template: Mapping[str, Any]) -> int:
    """TensorFlow's port: `tfjob-port` of the TF container, else 2222 (Kubeflow's rule)."""
    container = tf_container(template)
    if container is None:
        return constants.DEFAULT_PORT
    for port in container.get("ports") or []:
        if (
            isinstance(port, Mapping)
            and port.get("name") == constants.DEFAULT_PORT_NAME
            and isinstance(port.get("containerPort"), int)
        ):
            return int(port["containerPort"])
    return constants.DEFAULT_PORT
