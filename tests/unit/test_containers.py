"""A Pod's container statuses, read in one place (`trainjob.core.containers`)."""

from __future__ import annotations

from trainjob.core import containers


def _pod(*statuses: object, init: tuple[object, ...] = ()) -> dict[str, object]:
    return {"status": {"containerStatuses": list(statuses), "initContainerStatuses": list(init)}}


def test_the_tensorflow_container_comes_first_and_junk_is_skipped() -> None:
    sidecar = {"name": "proxy", "state": {"running": {}}}
    tf = {"name": "tensorflow", "image": "tf:2", "restartCount": 2, "state": {"waiting": {}}}
    found = containers.of_pod(_pod(sidecar, "junk", tf))
    assert [c.name for c in found] == ["tensorflow", "proxy"]
    assert (found[0].image, found[0].restart_count, found[0].waiting) == ("tf:2", 2, {})
    assert found[1].running == {} and found[1].started and not found[0].started


def test_terminated_is_the_tensorflow_containers_else_the_first_that_ended() -> None:
    ended = {"name": "proxy", "state": {"terminated": {"exitCode": 1}}}
    tf = {"name": "tensorflow", "state": {"terminated": {"exitCode": 137}}}
    assert containers.terminated(_pod(ended, tf)) == {"exitCode": 137}
    assert containers.terminated(_pod(ended)) == {"exitCode": 1}
    assert containers.terminated({"status": {}}) is None


def test_init_containers_and_a_container_by_name() -> None:
    init = {"name": "setup", "state": {"waiting": {"reason": "ErrImagePull"}}}
    pod = _pod({"name": "tensorboard", "state": {}}, init=(init,))
    assert [c.name for c in containers.of_pod(pod, containers.INIT)] == ["setup"]
    board = containers.named(pod, "tensorboard")
    assert board is not None and not board.started
    assert containers.named(pod, "tensorflow") is None
