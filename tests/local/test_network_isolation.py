"""A local run's TensorFlow ports are the run's own: nothing outside it reaches them.

A TensorFlow server listens on every interface ("0.0.0.0:<port>" in grpc_server_lib.cc, a
dual-stack `*:<port>` socket) and runs any graph it is sent, so `trainjob run` gives its replicas
a network namespace of their own with only loopback (trainjob.local.netns). The proof is made
from another address of this machine, one the tests add themselves (a bridge without ports in
198.18.0.0/15, the benchmarking range, which no router forwards): during a real two-worker run
the replicas' ports listen, yet a connection from that address (and from this machine's
loopback) is refused; with the run on this machine's network (the control) the same connection
is accepted. Where no namespace can be made, the run says so once.
"""

from __future__ import annotations

import copy
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainjob.local import netns, supervisor

from .conftest import (
    REPO_ROOT,
    cli_env,
    command_replica,
    finish_run,
    job_manifest,
    read_json,
    start_run,
    wait_until,
    write_job,
)

EXAMPLE = REPO_ROOT / "examples" / "mnist-multiworker.yaml"
RUN_TIMEOUT = 240
TIMEOUT = 60
CONNECT_TIMEOUT = 5.0
NOTE = "note: network: loopback only, the run's own"
WARNING = "warning: the replicas run on this machine's network"

# A worker that serves its TF_CONFIG port on every interface as a TF server does (a dual-stack
# socket bound to ''), reaches its peer through TF_CONFIG, then waits for the test's go.
SERVES_LIKE_TF = (
    "import json, os, pathlib, socket, sys, time\n"
    "config = json.loads(os.environ['TF_CONFIG'])\n"
    "me = config['task']['index']\n"
    "peers = config['cluster']['worker']\n"
    "s = socket.socket(socket.AF_INET6)\n"
    "s.bind(('', int(peers[me].rsplit(':', 1)[1]))); s.listen()\n"
    "host, port = peers[1 - me].rsplit(':', 1)\n"
    "deadline = time.monotonic() + 30\n"
    "while True:\n"
    "    try:\n"
    "        socket.create_connection((host, int(port)), 1).close(); break\n"
    "    except OSError:\n"
    "        if time.monotonic() > deadline: sys.exit('peer unreachable')\n"
    "        time.sleep(0.05)\n"
    "print('reached', peers[1 - me], flush=True)\n"
    "go = pathlib.Path(os.environ['TRAINJOB_CHECKPOINT_DIR'], 'go')\n"
    "deadline = time.monotonic() + 60\n"
    "while not go.exists() and time.monotonic() < deadline: time.sleep(0.05)\n"
)


# ----- another address of this machine, made by the test -----
@pytest.fixture
def other_address() -> Iterator[str]:
    """A non-loopback address of this machine on a bridge of the test's own (this kernel may
    have no dummy driver; an address on any interface that is up is a local address)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("adding an address of the test's own needs root and ip(8)")
    pid = os.getpid()
    link = f"tjiso{pid % 100000}"
    address = f"198.18.{pid // 254 % 256}.{pid % 254 + 1}"
    subprocess.run(["ip", "link", "add", link, "type", "bridge"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", link], check=True)
        subprocess.run(["ip", "link", "set", link, "up"], check=True)
        _assert_reachable_on_the_host(address)
        yield address
    finally:
        subprocess.run(["ip", "link", "delete", link], check=False)


def _assert_reachable_on_the_host(address: str) -> None:
    """The address works: a server of this machine's network that binds every interface, as
    TensorFlow does, accepts a connection from it."""
    with socket.socket(socket.AF_INET6) as server:
        server.bind(("", 0))
        server.listen()
        assert connect_from(address, server.getsockname()[1]) is None


def connect_from(address: str, port: int) -> str | None:
    """None when a TCP connection from `address` to `address:port` is accepted, else why not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(CONNECT_TIMEOUT)
        sock.bind((address, 0))
        try:
            sock.connect((address, port))
        except OSError as error:
            return f"{type(error).__name__}: {error}"
    return None


def _replicas(run_dir: Path, count: int) -> dict[str, tuple[int, int]] | None:
    """{replica: (pid, port)} once all `count` replicas run."""
    procs = read_json(run_dir / "processes.json")
    if not procs or len(procs) != count or not all(p["alive"] and p["pid"] for p in procs.values()):
        return None
    return {name: (p["pid"], p["port"]) for name, p in procs.items()}


def _same_namespace(pid: int, kind: str) -> bool:
    return os.path.samestat(os.stat(f"/proc/self/ns/{kind}"), os.stat(f"/proc/{pid}/ns/{kind}"))


def _stop(run: subprocess.Popen[bytes]) -> None:
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


# ----- real TensorFlow: the example's two MultiWorkerMirrored workers -----
@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tfds data dir for the module; the first run prepares MNIST there."""
    return tmp_path_factory.mktemp("tfds")


def _example(**spec: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(yaml.safe_load(EXAMPLE.read_text()))
    manifest["spec"].update(spec)
    return dict(manifest)


def _tf_ports_listening(run_dir: Path, log: Path, in_namespace: bool) -> dict[str, tuple[int, int]]:
    """Both workers' (pid, port) once their TensorFlow servers listen, seen in the workers' own
    network namespace (/proc/<pid>/net/tcp6)."""
    replicas = wait_until(lambda: _replicas(run_dir, 2), RUN_TIMEOUT, "both workers", log.read_text)
    wait_until(
        lambda: all(netns.listening(pid, port) for pid, port in replicas.values()),
        RUN_TIMEOUT,
        f"the TensorFlow servers listening on {replicas}",
        log.read_text,
    )
    for pid, _ in replicas.values():
        assert _same_namespace(pid, "net") is not in_namespace
    return replicas


@pytest.mark.training
def test_tf_ports_of_a_run_cannot_be_reached_from_another_address_of_this_machine(
    tmp_path: Path, data_dir: Path, other_address: str
) -> None:
    write_job(tmp_path / "job.yaml", _example())
    log = tmp_path / "out.log"
    run = start_run(
        ["-f", "job.yaml", "--run-dir", "run", "--data-dir", str(data_dir)], tmp_path, log
    )
    try:
        replicas = _tf_ports_listening(tmp_path / "run", log, in_namespace=True)
        refused = {}
        for name, (_, port) in replicas.items():
            # Nothing of this machine's network listens there: the server is in the run's.
            assert not netns.listening(os.getpid(), port), (name, port)
            # From the other address, and from this machine's own loopback.
            refused[name] = (connect_from(other_address, port), connect_from("127.0.0.1", port))
        code, out = finish_run(run, log, RUN_TIMEOUT)
    finally:
        _stop(run)
    for name, outcomes in refused.items():
        assert all(o is not None and "ConnectionRefused" in o for o in outcomes), (name, outcomes)
    assert code == 0, out
    assert "TrainJob mnist-multiworker Succeeded" in out  # the workers still reach each other
    assert out.count(NOTE) == 1 and WARNING not in out, out


@pytest.mark.training
def test_control_on_this_machines_network_the_same_connection_is_accepted(
    tmp_path: Path, data_dir: Path, other_address: str
) -> None:
    write_job(tmp_path / "job.yaml", _example(networkIsolation="None"))
    log = tmp_path / "out.log"
    run = start_run(
        ["-f", "job.yaml", "--run-dir", "run", "--data-dir", str(data_dir)], tmp_path, log
    )
    try:
        replicas = _tf_ports_listening(tmp_path / "run", log, in_namespace=False)
        accepted = {name: connect_from(other_address, port) for name, (_, port) in replicas.items()}
        code, out = finish_run(run, log, RUN_TIMEOUT)
    finally:
        _stop(run)
    assert accepted == {"worker-0": None, "worker-1": None}, accepted
    assert code == 0, out
    assert "the replicas use this machine's network (spec.networkIsolation: None)" in out
    assert NOTE not in out and WARNING not in out


# ----- no TensorFlow: how the namespace is made and joined -----
@pytest.mark.local
def test_a_port_taken_in_the_run_network_is_seen_there_and_free_on_the_host() -> None:
    """What the executor's wait for a port (a restart) looks at: the run's network."""
    network = supervisor.PrivateNetwork.start(cli_env())
    if isinstance(network, str):
        pytest.skip(f"no namespace can be made here: {network}")
    code = "import socket\ns = socket.socket(socket.AF_INET6)\ns.bind(('', 0)); s.listen()\n"
    code += "print(s.getsockname()[1], flush=True)\ninput()\n"
    listener = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        preexec_fn=network.enter,  # noqa: PLW1509 (no thread of this test holds a lock)
    )
    try:
        assert listener.stdout is not None
        port = int(listener.stdout.readline())
        assert network.port_in_use(port)
        assert not supervisor.port_in_use(port)
        assert not _same_namespace(listener.pid, "net")
        assert connect_from("127.0.0.1", port) is not None
    finally:
        listener.kill()
        listener.wait()
        network.close()
    assert not network.port_in_use(port)  # the holder is gone with the namespace


@pytest.mark.local
def test_without_cap_sys_admin_a_user_namespace_of_their_own_gives_the_network(
    tmp_path: Path,
) -> None:
    """What an ordinary user gets: a user namespace (their ids mapped to themselves) holding the
    network namespace. Root is made ordinary here by dropping CAP_SYS_ADMIN."""
    write_job(
        tmp_path / "job.yaml",
        job_manifest("userns", {"worker": command_replica(SERVES_LIKE_TF, 2)}),
    )
    argv = [sys.executable, "-m", "trainjob", "run", "-f", "job.yaml", "--run-dir", "run"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("dropping root's CAP_SYS_ADMIN needs setpriv(1)")
        argv = ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", *argv]
    log = tmp_path / "out.log"
    with open(log, "wb") as out:
        run = subprocess.Popen(
            argv, cwd=tmp_path, env=cli_env(), stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        replicas = wait_until(
            lambda: _replicas(tmp_path / "run", 2), TIMEOUT, "both", log.read_text
        )
        wait_until(lambda: log.read_text().count("reached") == 2, TIMEOUT, "peers", log.read_text)
        if WARNING in log.read_text():
            pytest.skip(f"no user namespace can be made here: {log.read_text()}")
        for pid, port in replicas.values():
            assert not _same_namespace(pid, "user") and not _same_namespace(pid, "net")
            assert netns.listening(pid, port) and not netns.listening(os.getpid(), port)
            assert Path(f"/proc/{pid}").stat().st_uid == os.geteuid()  # their own uid
        (tmp_path / "run" / "checkpoints" / "go").write_text("")
        code, text = finish_run(run, log, TIMEOUT)
    finally:
        _stop(run)
    assert code == 0, text
    assert text.count(NOTE) == 1, text
    assert all(p.stat().st_uid == os.geteuid() for p in (tmp_path / "run" / "logs").iterdir())


# Fails its first attempt, succeeds on the restart: the warning is said once per run, not once
# per process.
FAILS_ONCE = (
    "import os, pathlib, sys\n"
    "marker = pathlib.Path(os.environ['TRAINJOB_CHECKPOINT_DIR'], 'failed-once')\n"
    "if not marker.exists():\n"
    "    marker.write_text(''); sys.exit(1)\n"
    "print('second attempt', flush=True)\n"
)


@pytest.mark.local
def test_where_no_namespace_can_be_made_the_run_says_so_once(tmp_path: Path) -> None:
    """Namespaces made impossible the way a distribution does it, in a user namespace of the
    test's own (its user.max_*_namespaces are its own, this machine's stay as they are)."""
    write_job(
        tmp_path / "job.yaml",
        job_manifest(
            "nonet", {"worker": command_replica(FAILS_ONCE, 1, restart_policy="OnFailure")}
        ),
    )
    argv = [sys.executable, "-m", "trainjob", "run", "-f", "job.yaml", "--run-dir", "run"]
    can_nest = (
        shutil.which("unshare") is not None
        and subprocess.run(
            ["unshare", "--user", "--map-root-user", "true"], capture_output=True, check=False
        ).returncode
        == 0
    )
    if can_nest:
        limits = "/proc/sys/user/max_user_namespaces /proc/sys/user/max_net_namespaces"
        script = f'for f in {limits}; do echo 0 > "$f" || exit 99; done; exec "$@"'
        argv = ["unshare", "--user", "--map-root-user", "sh", "-c", script, "sh", *argv]
    elif os.geteuid() == 0:
        pytest.skip("no user namespace to set limits in, and root makes its network anyway")
    # else: an ordinary user on a machine that makes no user namespaces: the plain run.
    result = subprocess.run(
        argv, cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=TIMEOUT,
        check=False,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert out.count(WARNING) == 1, out
    assert "Their TensorFlow ports listen on every interface" in out
    if can_nest:
        assert "the limit on user or network namespaces is 0 or reached" in out, out
    assert "second attempt" in out and NOTE not in out


@pytest.mark.local
def test_dry_run_names_the_network() -> None:
    job = job_manifest("dry", {"worker": command_replica("pass")})
    for manifest, flags, expected in (
        (job, [], "network:        loopback only, the run's own"),
        (job, ["--host-network"], "the replicas use this machine's network (--host-network)"),
        (
            {**job, "spec": {**job["spec"], "networkIsolation": "None"}},
            [],
            "the replicas use this machine's network (spec.networkIsolation: None)",
        ),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "trainjob", "run", "-f", "-", "--dry-run", *flags],
            input=yaml.safe_dump(manifest), env=cli_env(), capture_output=True, text=True,
            timeout=TIMEOUT, check=False,
        )  # fmt: skip
        assert result.returncode == 0 and expected in result.stdout, result.stdout + result.stderr


# Looks for the network only where it has none (a namespace whose only interface is lo), so the
# test never sends a packet beyond this machine.
WANTS_THE_NETWORK = (
    "import socket, sys\n"
    "if [name for _, name in socket.if_nameindex()] != ['lo']: sys.exit('not isolated')\n"
    "socket.create_connection(('198.18.0.1', 443), 2)\n"
)


@pytest.mark.local
def test_a_replica_that_wanted_the_network_gets_a_hint_to_run_on_the_hosts(tmp_path: Path) -> None:
    write_job(
        tmp_path / "job.yaml",
        job_manifest("net", {"worker": command_replica(WANTS_THE_NETWORK, 2)}),
    )
    result = subprocess.run(
        [sys.executable, "-m", "trainjob", "run", "-f", "job.yaml", "--run-dir", "run"],
        cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=TIMEOUT,
        check=False,
    )  # fmt: skip
    out = result.stdout + result.stderr
    if WARNING in out:
        pytest.skip("no namespace can be made here")
    assert result.returncode != 0, out
    assert "Network is unreachable" in out, out
    assert out.count("looked for a network; the replicas have only the run's loopback") == 1, out
    assert "run with --host-network" in out
