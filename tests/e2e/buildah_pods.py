"""Pods run as containers from buildah's image store on this machine, without a cluster.

What an image does by itself (its libraries load, its TensorFlow trains, its replica exits with
the code and termination message the operator reads) needs no scheduler and no kubelet, and
then no `kind load` either (the CUDA image is 7 GB). Such a check runs the Pod the operator
would create: ``rendered_pods`` gets it from the operator's renderer (``render.render_pod``,
what ``trainjob render`` prints), with TF_CONFIG's hosts on free 127.0.0.1 ports
(``tfconfig.local_host``, as ``trainjob run`` does), and ``run_pods`` runs each Pod's one
container with ``buildah run --network host``: its command, environment, user and dropped
capabilities as rendered; each volume a folder of the test's own (one per claim, shared by the
job's Pods, with its subPath); its termination message a file mounted where the kubelet mounts
one. Every container is removed afterwards, also when the test fails or times out.

Needs root and the images of ``images/build.sh`` in its store (overlay: ``buildah from`` takes
a fraction of a second, whatever the image's size)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tests.controlplane.cluster import ControlPlaneError
from tests.controlplane.e2e_cluster import qualified_image
from tests.controlplane.node import image_store_buildah, image_store_flags
from tests.support import ports
from trainjob.core import progress_events, render, spec, tfconfig

BUILDAH: Final = "/usr/bin/buildah"
RUNC: Final = "runc"  # crun refuses this machine's hybrid cgroups (DESIGN)
KUBELET_TERMINATION_PATH: Final = "/dev/termination-log"  # the Pod API's default
# A stopped container's process gets SIGTERM (buildah run passes it on), then SIGKILL.
STOP_GRACE_SECONDS: Final = 10.0


class PodNotRunnableError(RuntimeError):
    """The Pod asks for what a container here cannot give, or its image is not built."""


@dataclass(frozen=True)
class Exited:
    """How a Pod's container ended: its exit code, its output and its termination message."""

    pod: str
    exit_code: int
    stdout: str
    stderr: str
    termination_message: str

    def events(self) -> list[dict[str, Any]]:
        """The runtime's progress events (one JSON line each) on its stdout."""
        return [e for e in map(progress_events.parse_line, self.stdout.splitlines()) if e]

    def log(self) -> str:
        return f"--- {self.pod} exited {self.exit_code}\n{self.stdout}{self.stderr}"


def rendered_pods(
    manifest: Mapping[str, Any],
    namespace: str = "default",
    tf_ports: Mapping[tuple[str, int], int] | None = None,
) -> list[dict[str, Any]]:
    """The Pods the operator creates for `manifest`, TF_CONFIG's hosts on 127.0.0.1 ports
    (`tf_ports` by replica type and index; free ones by default)."""
    job = spec.parse(manifest)
    if tf_ports is None:
        tf_ports = {key: ports.free_port() for key in job.replica_keys()}
    cluster = tfconfig.cluster_spec(job, tfconfig.local_host(tf_ports))
    options = render.RenderOptions(namespace=namespace)
    return [
        render.render_pod(job, rtype, index, 0, options, None, cluster)
        for rtype, index in job.replica_keys()
    ]


def only_container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = pod["spec"].get("containers") or []
    if len(containers) != 1 or pod["spec"].get("initContainers"):
        raise PodNotRunnableError(f"pod {pod['metadata']['name']}: one container expected")
    container: Mapping[str, Any] = containers[0]
    return container


def volume_folder(pod: Mapping[str, Any], mount: Mapping[str, Any], workdir: Path) -> Path:
    """The folder of `workdir` that stands for a volume mount: one per claim (every Pod of the
    job mounting it sees the same files), one per emptyDir of a Pod; its subPath below."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    volume: Mapping[str, Any] | None = volumes.get(mount["name"])
    if volume is None:
        raise PodNotRunnableError(f"volumeMounts[{mount['name']}]: no volume of that name")
    base: Path
    if "persistentVolumeClaim" in volume:
        base = workdir / "claims" / volume["persistentVolumeClaim"]["claimName"]
    elif "emptyDir" in volume:
        base = workdir / "emptyDirs" / pod["metadata"]["name"] / volume["name"]
    else:
        raise PodNotRunnableError(f"volumes[{volume['name']}]: only claims and emptyDirs run here")
    sub_path: str = mount.get("subPath", "")
    return base / sub_path


def run_arguments(
    pod: Mapping[str, Any], name: str, folders: Sequence[Path], termination: Path
) -> list[str]:
    """`buildah run`'s arguments for the Pod's container in the buildah container `name`,
    its volume mounts backed by `folders` (in order) and its termination message by the file
    `termination`. The hostname is `name`, unique, so that a container whose buildah was
    killed can be found (``_reap``)."""
    container = only_container(pod)
    security = container.get("securityContext") or {}
    pod_security = pod["spec"].get("securityContext") or {}
    args = ["run", "--network", "host", "--runtime", RUNC, "--hostname", name]
    if "ALL" in (security.get("capabilities") or {}).get("drop", []):
        args += ["--cap-drop", "ALL"]
    user = security.get("runAsUser", pod_security.get("runAsUser"))
    group = security.get("runAsGroup", pod_security.get("runAsGroup"))
    if user is not None:  # else the image's USER, as in a Pod
        args += ["--user", str(user) if group is None else f"{user}:{group}"]
    for env in container.get("env") or []:
        if "value" not in env:
            raise PodNotRunnableError(f"env[{env['name']}]: only plain values run here")
        args += ["--env", f"{env['name']}={env['value']}"]
    for mount, folder in zip(container.get("volumeMounts") or [], folders, strict=True):
        read_only = ":ro" if mount.get("readOnly") else ""
        args += ["--volume", f"{folder}:{mount['mountPath']}{read_only}"]
    path = container.get("terminationMessagePath", KUBELET_TERMINATION_PATH)
    args += ["--volume", f"{termination}:{path}"]
    if "workingDir" in container:
        args += ["--workingdir", container["workingDir"]]
    command = [*(container.get("command") or []), *(container.get("args") or [])]
    if not command:
        raise PodNotRunnableError(f"pod {pod['metadata']['name']}: a command is needed here")
    return [*args, name, "--", *command]


@dataclass
class _Started:
    pod: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    termination: Path


def run_pods(pods: Sequence[Mapping[str, Any]], workdir: Path, timeout: float) -> list[Exited]:
    """Run every Pod's container at once and wait until all have exited (AssertionError with
    their output after `timeout` seconds); in the order of `pods`."""
    deadline = time.monotonic() + timeout
    with _containers(pods) as names:
        started: list[_Started] = []
        try:
            for pod, name in zip(pods, names, strict=True):
                started.append(_start(pod, name, workdir))
            for one in started:
                try:
                    one.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logs = "\n".join(_exited(s, s.process.poll()).log() for s in started)
                    raise AssertionError(
                        f"pod {one.pod} still ran after {timeout:.0f} s:\n{logs}"
                    ) from None
        finally:
            for one, name in zip(started, names, strict=False):
                _stop(one.process, name)
        return [_exited(one, one.process.returncode) for one in started]


@contextlib.contextmanager
def _containers(pods: Sequence[Mapping[str, Any]]) -> Iterator[list[str]]:
    """One buildah container per Pod, from its image; all removed on exit."""
    names: list[str] = []
    try:
        for pod in pods:
            image = qualified_image(only_container(pod)["image"])
            name = f"{pod['metadata']['name'][:50]}-{uuid.uuid4().hex[:8]}"
            try:
                image_store_buildah("from", "--pull=never", "--quiet", "--name", name, image)
            except ControlPlaneError as exc:
                raise PodNotRunnableError(
                    f"{image}: not in buildah's store? build it with `bash images/build.sh`\n{exc}"
                ) from exc
            names.append(name)
        yield names
    finally:
        failed = []
        for name in names:
            try:
                image_store_buildah("rm", name, timeout=60)
            except ControlPlaneError as exc:
                failed.append(str(exc))
        if failed:
            raise ControlPlaneError("buildah containers left behind:\n" + "\n".join(failed))


def _start(pod: Mapping[str, Any], name: str, workdir: Path) -> _Started:
    pod_name = pod["metadata"]["name"]
    container = only_container(pod)
    fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
    folders = [volume_folder(pod, m, workdir) for m in container.get("volumeMounts") or []]
    for folder in folders:
        _volume_folder(folder, workdir, fs_group)
    logs = workdir / "pods" / pod_name
    logs.mkdir(parents=True, exist_ok=True)
    termination = logs / "termination-log"
    termination.write_text("", encoding="utf-8")
    termination.chmod(0o666)  # the kubelet's file is writable by the container's user
    stdout, stderr = logs / "stdout", logs / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [BUILDAH, *image_store_flags(), *run_arguments(pod, name, folders, termination)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    return _Started(pod_name, process, stdout, stderr, termination)


def _volume_folder(folder: Path, workdir: Path, fs_group: int | None) -> None:
    """A volume as a fresh disk under fsGroup looks to a Pod: its group's to write (every
    folder from the volume's down to its subPath)."""
    folder.mkdir(parents=True, exist_ok=True)
    for part in [folder, *folder.parents]:
        if part == workdir or workdir not in part.parents:
            break
        if fs_group is None:
            part.chmod(0o777)
        else:
            os.chown(part, -1, fs_group)
            part.chmod(0o2775)


def _exited(one: _Started, code: int | None) -> Exited:
    def read(path: Path) -> str:
        return path.read_text(encoding="utf-8", errors="replace")

    return Exited(
        one.pod,
        -1 if code is None else code,
        read(one.stdout),
        read(one.stderr),
        read(one.termination),
    )


def _stop(process: subprocess.Popen[bytes], name: str) -> None:
    """Stop a container still running: buildah passes SIGTERM on; a buildah that had to be
    killed leaves its runc container behind, which is found by its hostname and deleted."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=STOP_GRACE_SECONDS)
        return
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=STOP_GRACE_SECONDS)
    _reap(name)


def _reap(hostname: str) -> None:
    listed = subprocess.run(
        [RUNC, "list", "--format", "json"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    for entry in json.loads(listed or "null") or []:
        bundle = Path(entry.get("bundle", ""))
        with contextlib.suppress(OSError, ValueError):
            if json.loads((bundle / "config.json").read_text()).get("hostname") == hostname:
                subprocess.run([RUNC, "delete", "--force", entry["id"]], timeout=30, check=False)
                shutil.rmtree(bundle, ignore_errors=True)
