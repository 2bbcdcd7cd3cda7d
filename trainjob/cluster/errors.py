"""The one error of the cluster side, in a leaf module: the command line and the client catch
it without importing the kubernetes package (that happens only when a command talks to a
cluster, so `trainjob validate` and local runs never pay for it, nor need it installed)."""

from __future__ import annotations

from typing import Final

INSTALL_HINT: Final = "pip install 'trainjob[cluster]'"


class ClusterError(Exception):
    """A call to the cluster that failed; the message names the object and the cause."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
