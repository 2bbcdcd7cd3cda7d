"""The test bed's binaries: where install.sh caches them, keyed by the versions pinned in this
repository (the wrapper modules' go.mod files and install.sh)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

HERE: Final = Path(__file__).resolve().parent
REPO_ROOT: Final = HERE.parent.parent
INSTALL_COMMAND: Final = "bash tests/controlplane/install.sh"


class ToolsMissingError(RuntimeError):
    """The control-plane binaries are not installed."""


def go_mod_version(gomod: Path, module: str) -> str:
    """The version of ``module`` that a go.mod requires (single-line or block form)."""
    pattern = re.compile(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", re.MULTILINE)
    match = pattern.search(gomod.read_text(encoding="utf-8"))
    if match is None:
        raise ToolsMissingError(f"{gomod} does not require {module}")
    return match.group(1)


def install_sh_value(name: str) -> str:
    """A ``NAME="value"`` assignment in install.sh (a literal, not one built from others)."""
    text = (HERE / "install.sh").read_text(encoding="utf-8")
    match = re.search(rf'^{name}="([^"$]+)"', text, re.MULTILINE)
    if match is None:
        raise ToolsMissingError(f"{name} not found in {HERE / 'install.sh'}")
    return match.group(1)


def install_sh_version(name: str) -> str:
    """A ``NAME="vX"`` assignment in install.sh (the one place kwok/helm/kind versions live)."""
    value = install_sh_value(name)
    if not value.startswith("v"):
        raise ToolsMissingError(f"{name} in {HERE / 'install.sh'} is not a version: {value}")
    return value


def tools_dir() -> Path:
    """Where install.sh caches the binaries."""
    env = os.environ.get("TRAINJOB_TOOLS_DIR")
    return Path(env) if env else Path.home() / ".cache" / "trainjob-tools"


@dataclass(frozen=True)
class Tools:
    """Paths of the binaries built by install.sh, keyed by the versions pinned in the repo."""

    kubernetes_version: str
    etcd_version: str
    kwok_version: str
    helm_version: str
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    helm: Path

    @classmethod
    def locate(cls, root: Path | None = None) -> Tools:
        base = root if root is not None else tools_dir()
        k8s = go_mod_version(HERE / "k8s" / "go.mod", "k8s.io/kubernetes")
        etcd = go_mod_version(HERE / "etcd" / "go.mod", "go.etcd.io/etcd/server/v3")
        # Built with a patch of ours (install.sh says why), cached under the patch's name.
        kwok = f"{install_sh_version('KWOK_VERSION')}-{install_sh_value('KWOK_PATCH')}"
        helm = install_sh_version("HELM_VERSION")
        kdir = base / f"kubernetes-{k8s}"
        return cls(
            kubernetes_version=k8s,
            etcd_version=etcd,
            kwok_version=kwok,
            helm_version=helm,
            etcd=base / f"etcd-{etcd}" / "etcd",
            kube_apiserver=kdir / "kube-apiserver",
            kube_controller_manager=kdir / "kube-controller-manager",
            kube_scheduler=kdir / "kube-scheduler",
            kubectl=kdir / "kubectl",
            kwok=base / f"kwok-{kwok}" / "kwok",
            helm=base / f"helm-{helm}" / "helm",
        )

    def all_paths(self) -> list[Path]:
        return [
            self.etcd,
            self.kube_apiserver,
            self.kube_controller_manager,
            self.kube_scheduler,
            self.kubectl,
            self.kwok,
            self.helm,
        ]

    def missing(self) -> list[Path]:
        return [p for p in self.all_paths() if not os.access(p, os.X_OK)]

    def require(self) -> Tools:
        """Raise ToolsMissingError, naming the install command, unless every binary exists."""
        missing = self.missing()
        if missing:
            listed = "\n  ".join(str(p) for p in missing)
            raise ToolsMissingError(
                f"control-plane binaries are missing:\n  {listed}\n"
                f"Build them once (10-20 min cold, cached afterwards) with:\n"
                f"  {INSTALL_COMMAND}\n"
                f"(set TRAINJOB_TOOLS_DIR to use another cache directory)"
            )
        return self
