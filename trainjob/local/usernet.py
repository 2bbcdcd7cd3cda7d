"""The run's way out of its network namespace (pure): pasta's command line, when its network is
up, and what a replica's failure to connect out tells the user.

Why pasta: the run's namespace (trainjob.local.netns) keeps nothing but loopback so that nobody
outside the run reaches the replicas' TensorFlow servers; rootless Podman gives its containers
outbound connections the same way, with a user-mode network. pasta (Debian package ``passt``;
bookworm ships 0.0~git20230309) attaches to an existing namespace, gives it an interface with
this machine's address and routes, and turns each connection the replicas open into a socket of
its own on this machine's network, as any program of the user's would open. Nothing comes in:
``-t none -u none`` forwards no port of this machine into the namespace (pasta's default,
``auto``, is documented to forward every port bound in the namespace, the TensorFlow ports
included).

This machine's loopback is reachable only on the ports the user names (``-T PORT``: pasta
listens on the namespace's 127.0.0.1 and ::1 and connects to this machine's; ``-T none -U
none`` otherwise, and ``--no-map-gw`` so the gateway's address is not this machine's loopback).
slirp4netns (1.2.0 in bookworm) maps this machine's whole loopback or none of it
(``--disable-host-loopback``): it cannot open one port, so it is not used.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from typing import Final

PASTA: Final = "pasta"
MAX_PORT: Final = 65535
INSTALL: Final = (
    "install passt for pasta (Debian, Ubuntu: apt-get install passt; Fedora: dnf install passt)"
)
EXPOSE_FLAG: Final = "--expose-host-port"
HOST_NETWORK_FLAG: Final = "--host-network"

# Why the run's namespace has no way out, when pasta is not there at all (the remedy: install).
NOT_INSTALLED: Final = "pasta is not installed here"

# Why a connection out failed, from a replica's last exception line.
REFUSED: Final = "refused"
UNREACHABLE: Final = "unreachable"
NO_NAME: Final = "name resolution"
TIMED_OUT: Final = "timed out"
_FAILURES: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    (
        NO_NAME,
        (
            "temporary failure in name resolution",
            "name or service not known",
            "no address associated with hostname",
            "nodename nor servname",
            "getaddrinfo failed",
            "could not resolve host",
            "failed to resolve",
            "name resolution",
        ),
    ),
    (REFUSED, ("connection refused", "errno 111]", "econnrefused")),
    (
        UNREACHABLE,
        ("network is unreachable", "no route to host", "errno 101]", "errno 113]", "enetunreach"),
    ),
    (TIMED_OUT, ("connection timed out", "connect timeout", "connecttimeout", "errno 110]")),
)

# Where a line names the address it failed to reach: urllib3's `host='127.0.0.1', port=5000`
# (requests, MLflow's client), a URL's `//127.0.0.1:5000`, gRPC's `ipv4:127.0.0.1:5000`, or a
# bare `127.0.0.1:5000` / `localhost:5000` / `[::1]:5000`.
_HOST_PORT: Final = (
    re.compile(r"host='(?P<host>[^']+)',\s*port=(?P<port>\d+)"),
    re.compile(r"//(?P<host>\[[0-9A-Fa-f:.]+\]|[0-9A-Za-z._-]+):(?P<port>\d+)"),
    re.compile(r"ipv[46]:(?P<host>\[[0-9A-Fa-f:.]+\]|[0-9.]+):(?P<port>\d+)"),
    re.compile(r"(?P<host>\blocalhost|\b127(?:\.\d+){3}|\[::1\]):(?P<port>\d+)\b"),
)


def pasta_argv(
    pasta: str,
    netns: str,
    userns: str | None,
    *,
    uid: int,
    gid: int,
    expose: Sequence[int],
) -> list[str]:
    """pasta attached to the run's namespace (see the module docstring), given as paths.

    `userns`: the user namespace the holder made (an ordinary user), which pasta joins to reach
    the network namespace; without one (root), pasta joins only the network namespace. Either
    way pasta stays the user it was started as: as uid 0 it would become `nobody`, who can
    join neither.
    """
    tcp_out = ",".join(str(port) for port in sorted(set(expose))) or "none"
    argv = [pasta, "--config-net", "--foreground", "--quiet", "--no-map-gw"]
    argv += ["-t", "none", "-u", "none", "-T", tcp_out, "-U", "none", "--runas", f"{uid}:{gid}"]
    if userns is not None:
        return [*argv, "--userns", userns, "--netns", netns]
    return [*argv, "--netns", netns, "--netns-only"]


def routed(ipv4_routes: str, ipv6_routes: str) -> bool:
    """Whether a namespace's routing tables (/proc/<pid>/net/route and ipv6_route) have a
    default route: pasta has configured its interface."""
    for line in ipv4_routes.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000" and fields[7] == "00000000":
            return True
    for line in ipv6_routes.splitlines():
        fields = line.split()
        if len(fields) > 9 and fields[0] == "0" * 32 and fields[1] == "00" and fields[9] != "lo":
            return True
    return False


def pasta_problem(output: str, exit_code: int | None) -> str:
    """Why pasta did not bring the network up, in its own last words (without the complaints
    of a machine that has no syslog)."""
    lines = [
        line.strip()
        for line in output.splitlines()
        if line.strip() and "syslog" not in line and not line.startswith("Don't run as root")
    ]
    words = "; ".join(lines[-2:]) or "no message"
    if exit_code is None:
        return f"pasta did not configure the namespace in time ({words})"
    return f"pasta exited with code {exit_code} ({words})"


def connect_failure(exception_line: str | None) -> str | None:
    """Why a replica's connection out failed (REFUSED, UNREACHABLE, NO_NAME, TIMED_OUT), read
    from its last exception line; None when the line says no such thing."""
    text = (exception_line or "").lower()
    for kind, words in _FAILURES:
        if any(word in text for word in words):
            return kind
    return None


def target(exception_line: str | None) -> tuple[str, int] | None:
    """The (host, port) the line says it tried to reach, the first one named; else None."""
    text = exception_line or ""
    found = [m for pattern in _HOST_PORT for m in pattern.finditer(text)]
    for match in sorted(found, key=lambda m: m.start()):
        if 0 < int(match["port"]) <= MAX_PORT:
            return match["host"].strip("[]"), int(match["port"])
    return None


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: this machine's loopback (the run has its own)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hint(
    replica: str,
    exception_line: str | None,
    *,
    outbound_problem: str | None,
    exposed: Sequence[int],
    run_ports: Sequence[int],
) -> str | None:
    """The one-line hint for a replica that failed connecting out of the run's network; None
    when its line says nothing of a connection, or when what refused it is the run's own (a
    peer replica's port: its peer is gone) or a port the user exposed (the service said no).
    `outbound_problem`: why the run's network has no way out (None: pasta is up)."""
    kind = connect_failure(exception_line)
    if kind is None:
        return None
    tried = target(exception_line)
    host_net = (
        f"{HOST_NETWORK_FLAG} runs the replicas on this machine's network instead (their "
        "TensorFlow ports then listen on every interface)"
    )
    lead = f"hint: {replica} could not connect ({kind})"
    local = tried is not None and is_loopback(tried[0])
    if local and tried is not None and (tried[1] in run_ports or tried[1] in exposed):
        return None
    if outbound_problem is not None:
        remedy = (
            f"{INSTALL} for outbound connections ({EXPOSE_FLAG} PORT then reaches a service on "
            "this machine's loopback); "
            if outbound_problem == NOT_INSTALLED
            else ""
        )
        return (
            f"{lead}: the run's network has only its own loopback ({outbound_problem}): "
            f"{remedy}{host_net}"
        )
    if local or (tried is None and kind == REFUSED):
        port = str(tried[1]) if local and tried is not None else "PORT"
        return (
            f"{lead}: the run has a loopback of its own, so a service on this machine's "
            f"loopback (127.0.0.1, localhost) is reached only on request: rerun with "
            f"{EXPOSE_FLAG} {port}; {host_net}"
        )
    if kind == NO_NAME:
        return (
            f"{lead}: the run's network resolves names with this machine's /etc/resolv.conf, "
            f"but a resolver on this machine's loopback (systemd-resolved's 127.0.0.53) is not "
            f"the run's; {host_net}"
        )
    return (
        f"{lead}: the run connects out through pasta as this machine itself would, so the "
        f"address may be unreachable from this machine too; a service on this machine's "
        f"loopback needs {EXPOSE_FLAG} PORT; {host_net}"
    )


def _ports(ports: Sequence[int]) -> str:
    return ", ".join(str(port) for port in sorted(set(ports))) or "none"


def describe(outbound_problem: str | None, exposed: Sequence[int]) -> str:
    """The run's network in one line (`note: network: ...`): with pasta up (no problem), or
    loopback only and why."""
    if outbound_problem is None:
        return (
            "the run's own: no one outside the run reaches the replicas' TensorFlow ports; they "
            "connect out through pasta as this machine would, and reach this machine's loopback "
            f"only on the ports given to {EXPOSE_FLAG} ({_ports(exposed)})"
        )
    remedy = (
        f"{INSTALL} to let them connect out, or use"
        if outbound_problem == NOT_INSTALLED
        else "or use"
    )
    return (
        "the run's own, loopback only: no one outside the run reaches the replicas' TensorFlow "
        f"ports, and they connect nowhere else ({outbound_problem}); {remedy} "
        f"{HOST_NETWORK_FLAG}"
    )


def planned(exposed: Sequence[int]) -> str:
    """The run's network as `--dry-run` shows it (whether pasta works is known only once the
    run starts)."""
    loopback = (
        f"this machine's loopback on ports {_ports(exposed)}"
        if exposed
        else f"none of this machine's loopback ({EXPOSE_FLAG} PORT opens one)"
    )
    return (
        "the run's own: no one outside the run reaches the replicas' TensorFlow ports; they "
        f"connect out through pasta (if installed) and reach {loopback}"
    )


def exposure_refusal(exposed: Sequence[int], pasta: str | None) -> str | None:
    """Why `--expose-host-port` cannot be kept in a run of the run's own network: pasta, which
    makes the exposure, is missing; None when it can (or nothing is exposed)."""
    if not exposed or pasta is not None:
        return None
    return (
        f"{EXPOSE_FLAG} {_ports(exposed)} needs pasta, which is not installed here: {INSTALL}, "
        f"or run with {HOST_NETWORK_FLAG}"
    )
