"""The run's way out of its namespace, as data: pasta's command line, its readiness, and the
hint a replica that failed connecting out gets (trainjob.local.usernet)."""

from __future__ import annotations

import itertools

import pytest

from trainjob.local import usernet

RUN_PORTS = (41235, 41236)
HOST_NET = "--host-network runs the replicas on this machine's network instead"


def _hint(
    line: str | None, problem: str | None = None, exposed: tuple[int, ...] = ()
) -> str | None:
    return usernet.hint(
        "worker-0", line, outbound_problem=problem, exposed=exposed, run_ports=RUN_PORTS
    )


# ----- pasta's command line -----
def test_pasta_forwards_nothing_in_and_only_the_exposed_ports_out() -> None:
    argv = usernet.pasta_argv(
        "/usr/bin/pasta", "/proc/self/fd/5", None, uid=0, gid=0, expose=[5000, 6006, 5000]
    )
    pairs = dict(itertools.pairwise(argv))  # each flag to the word after it
    assert pairs["-t"] == "none" and pairs["-u"] == "none"  # nothing of this machine comes in
    assert pairs["-T"] == "5000,6006" and pairs["-U"] == "none"  # its loopback: those ports only
    assert "--no-map-gw" in argv  # the gateway's address is not this machine's loopback
    assert pairs["--runas"] == "0:0"  # root stays root: `nobody` could not join the namespace
    assert argv[-3:] == ["--netns", "/proc/self/fd/5", "--netns-only"]


def test_an_ordinary_user_joins_their_user_namespace_and_by_default_exposes_nothing() -> None:
    argv = usernet.pasta_argv(
        "pasta", "/proc/self/fd/6", "/proc/self/fd/5", uid=1000, gid=1000, expose=[]
    )
    assert argv[argv.index("-T") + 1] == "none"
    assert argv[-4:] == ["--userns", "/proc/self/fd/5", "--netns", "/proc/self/fd/6"]
    assert "--netns-only" not in argv and argv[argv.index("--runas") + 1] == "1000:1000"


ROUTE_HEADER = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
)


@pytest.mark.parametrize(
    ("ipv4", "ipv6", "expected"),
    [
        (ROUTE_HEADER, "", False),  # lo only: nothing configured yet
        (ROUTE_HEADER + "eth0\t0002000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n", "", False),
        (ROUTE_HEADER + "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n", "", True),
        (
            ROUTE_HEADER,
            f"{'0' * 32} 00 {'0' * 32} 00 fd000000000000000000000000000001 00000400 "
            "00000001 00000000 00000003 eth0\n",
            True,
        ),
        (
            ROUTE_HEADER,
            f"{'0' * 32} 00 {'0' * 32} 00 {'0' * 32} ffffffff 00000001 00000000 00200200 lo\n",
            False,  # the kernel's unreachable default on lo is no route out
        ),
    ],
)
def test_the_network_is_up_once_the_namespace_has_a_default_route(
    ipv4: str, ipv6: str, expected: bool
) -> None:
    assert usernet.routed(ipv4, ipv6) is expected


def test_pastas_failure_is_told_in_its_own_last_words() -> None:
    output = (
        "Failed to send 51 bytes to syslog\nDon't run as root. Changing to nobody...\n"
        "Couldn't open network namespace /proc/self/fd/5\n"
    )
    assert usernet.pasta_problem(output, 1) == (
        "pasta exited with code 1 (Couldn't open network namespace /proc/self/fd/5)"
    )
    assert usernet.pasta_problem("", None) == (
        "pasta did not configure the namespace in time (no message)"
    )


# ----- what a failed connection says -----
@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("urllib.error.URLError: <urlopen error [Errno 111] Connection refused>", usernet.REFUSED),
        ("ConnectionRefusedError: [Errno 111] Connection refused", usernet.REFUSED),
        ("OSError: [Errno 101] Network is unreachable", usernet.UNREACHABLE),
        ("OSError: [Errno 113] No route to host", usernet.UNREACHABLE),
        (
            "urllib.error.URLError: <urlopen error [Errno -3] Temporary failure in name "
            "resolution>",
            usernet.NO_NAME,
        ),
        ("socket.gaierror: [Errno -2] Name or service not known", usernet.NO_NAME),
        ("TimeoutError: [Errno 110] Connection timed out", usernet.TIMED_OUT),
        ("ValueError: learning rate must be > 0, got -1", None),
        (None, None),
    ],
)
def test_a_failure_to_connect_is_recognised_by_its_cause(
    line: str | None, kind: str | None
) -> None:
    assert usernet.connect_failure(line) == kind


MLFLOW = (
    "mlflow.exceptions.MlflowException: API request to http://127.0.0.1:5000/api/2.0/mlflow/"
    "experiments/get-by-name failed with exception HTTPConnectionPool(host='127.0.0.1', "
    "port=5000): Max retries exceeded with url: /api/2.0/mlflow/experiments/get-by-name "
    "(Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at 0x7f>: "
    "Failed to establish a new connection: [Errno 111] Connection refused'))"
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (MLFLOW, ("127.0.0.1", 5000)),
        (
            "requests.exceptions.ConnectionError: HTTPConnectionPool(host='localhost', port=8080)",
            ("localhost", 8080),
        ),
        ("OSError: could not reach http://[::1]:9000/data", ("::1", 9000)),
        (
            "tensorflow.python.framework.errors_impl.UnavailableError: failed to connect to all "
            "addresses; last error: UNKNOWN: ipv4:127.0.0.1:41236: Failed to connect to remote "
            "host: Connection refused",
            ("127.0.0.1", 41236),
        ),
        ("ConnectionRefusedError: [Errno 111] Connection refused", None),
        ("ValueError: port=5000", None),
    ],
)
def test_the_address_a_line_names(line: str, expected: tuple[str, int] | None) -> None:
    assert usernet.target(line) == expected


def test_a_refused_service_of_this_machines_loopback_gets_the_flag_with_its_port() -> None:
    text = _hint(MLFLOW)
    assert text is not None
    assert text.startswith("hint: worker-0 could not connect (refused): the run has a loopback")
    assert "rerun with --expose-host-port 5000;" in text and HOST_NET in text


def test_a_bare_refusal_names_the_flag_without_a_port() -> None:
    text = _hint("ConnectionRefusedError: [Errno 111] Connection refused")
    assert text is not None and "rerun with --expose-host-port PORT" in text


def test_a_refusal_by_what_the_user_exposed_or_by_a_peer_replica_is_not_the_networks() -> None:
    assert _hint(MLFLOW, exposed=(5000,)) is None  # the service itself said no
    tf_peer = "UnavailableError: ipv4:127.0.0.1:41236: Failed to connect: Connection refused"
    assert _hint(tf_peer) is None  # the run's own peer is gone: nothing to do with the network


def test_name_resolution_and_unreachable_addresses_get_hints_of_their_own() -> None:
    name = _hint("socket.gaierror: [Errno -3] Temporary failure in name resolution")
    assert name is not None and "(name resolution)" in name and "/etc/resolv.conf" in name
    assert "127.0.0.53" in name and HOST_NET in name
    far = _hint("OSError: [Errno 101] Network is unreachable")
    assert far is not None and "(unreachable)" in far and "through pasta" in far
    assert "--expose-host-port PORT" in far and HOST_NET in far


@pytest.mark.parametrize(
    "line",
    [
        MLFLOW,
        "OSError: [Errno 101] Network is unreachable",
        "socket.gaierror: [Errno -2] Name or service not known",
    ],
)
def test_without_pasta_every_failure_to_connect_says_what_to_install(line: str) -> None:
    text = _hint(line, problem=usernet.NOT_INSTALLED)
    assert text is not None
    assert "the run's network has only its own loopback (pasta is not installed here)" in text
    assert "apt-get install passt" in text and HOST_NET in text


def test_when_pasta_failed_the_hint_quotes_it_and_does_not_ask_to_install_it() -> None:
    problem = "pasta exited with code 1 (No routable interface)"
    text = _hint("OSError: [Errno 101] Network is unreachable", problem=problem)
    assert text is not None and f"({problem})" in text and "install" not in text


def test_a_failure_that_is_no_connection_gets_no_hint() -> None:
    assert _hint("ValueError: learning rate must be > 0, got -1") is None
    assert _hint(None) is None


# ----- what the run says of its network -----
def test_the_note_says_what_goes_out_and_what_of_this_machine_is_reached() -> None:
    up = usernet.describe(None, [6006, 5000])
    assert "connect out through pasta" in up and "(5000, 6006)" in up
    down = usernet.describe(usernet.NOT_INSTALLED, [])
    assert down.startswith("the run's own, loopback only") and "apt-get install passt" in down
    failed = usernet.describe("pasta exited with code 1 (x)", [])
    assert "install" not in failed and failed.endswith("or use --host-network")


def test_exposing_a_port_without_pasta_is_refused_in_one_line() -> None:
    assert usernet.exposure_refusal([], None) is None
    assert usernet.exposure_refusal([5000], "/usr/bin/pasta") is None
    refusal = usernet.exposure_refusal([5000], None)
    assert refusal is not None and "\n" not in refusal
    assert refusal.startswith("--expose-host-port 5000 needs pasta, which is not installed here")
