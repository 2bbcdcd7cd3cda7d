"""The one error of the cluster side, in a leaf module: the command line and the client catch
it without importing the kubernetes package (that happens only when a command talks to a
cluster, so `trainjob validate` and local runs never pay for it, nor need it installed).
The request timeout lives here too, so `--help` can show its default without that import."""

from __future__ import annotations

from typing import Final

INSTALL_HINT: Final = "pip install 'trainjob[cluster]'"

# How long one API request may wait for the server (`--request-timeout`, the client's
# `request_timeout`). A healthy API server answers in well under a second; 30 s leaves a loaded
# one room, and a stuck one ends any command within that long (kubectl's own retries took
# about 50 s there), since each request is made once under one deadline (`api.within_deadline`)
# and the first failed request ends the command.
DEFAULT_REQUEST_TIMEOUT: Final = 30.0


class ClusterError(Exception):
    """A call to the cluster that failed; the message names the object and the cause."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def no_answer(server: str, seconds: float) -> str:
    """Why a request that timed out failed: where it went, how long it waited, what sets that."""
    return (
        f"no answer from the API server at {server} in {seconds:g}s (--request-timeout, "
        "request_timeout in Python; 0 waits for ever)"
    )
