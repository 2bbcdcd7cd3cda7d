"""Kubeflow's Python SDK (`kubeflow-training`), in a virtual environment of its own.

The SDK pins `kubernetes<36`, and the product's tests need a newer client (kubernetes 35's
requests ignore the request timeout during a stuck TLS handshake: tests/unit/
test_cluster_api.py). So the SDK never enters the project's venv: it gets its own, cached
with the other test tools (`<tools dir>/kubeflow-training-<version>/`), made on first use
from PyPI, and whatever drives it (its wheel's own e2e test, a user's script) runs there as
a process, as a TFJob user's script does.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Final

from tests.controlplane.tools import tools_dir

VERSION: Final = "1.9.4"
# The wheel ships its e2e tests as a top-level `test` package (research/tfjob-dropin.md §3).
UPSTREAM_TEST: Final = Path("test") / "e2e" / "test_e2e_tfjob.py"


def home() -> Path:
    return tools_dir() / f"kubeflow-training-{VERSION}"


def python() -> Path:
    """The SDK venv's interpreter, made (once: a marker file says it is complete) if missing."""
    venv = home()
    done = venv / ".complete"
    interpreter = venv / "bin" / "python"
    if done.exists() and interpreter.exists():
        return interpreter
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [
            str(interpreter),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"kubeflow-training=={VERSION}",
            "pytest",
        ],
        check=True,
        timeout=600,
    )
    done.write_text(f"kubeflow-training=={VERSION}\n", encoding="utf-8")
    return interpreter


def site_packages() -> Path:
    """Where the SDK (and its `test` package) is installed."""
    out = subprocess.run(
        [str(python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def upstream_test() -> Path:
    """The wheel's own TFJob e2e test file (run unmodified)."""
    return site_packages() / UPSTREAM_TEST
