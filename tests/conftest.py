"""Marks each test with its tier by directory, so `pytest -m unit` (or integration, training,
local) selects a tier; the README's test command runs them all.

The e2e tier needs a real cluster (kind in .github/workflows/e2e.yaml): it runs only with
`--e2e` (or TRAINJOB_E2E=1) and is otherwise *deselected*, so a run without a cluster neither
passes nor skips it.
"""

from __future__ import annotations

import os
import pathlib
import signal

import pytest

# Each test's tier and time, for the table `bash tests/run` ends with (TRAINJOB_TIMINGS).
pytest_plugins = ["tests.support.timing"]

TIERS = ("unit", "integration", "training", "local", "e2e")
E2E_ENV = "TRAINJOB_E2E"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--e2e",
        action="store_true",
        default=False,
        help="run tests/e2e against the cluster of the current kubeconfig context",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Tests press Ctrl-C on commands as a terminal does, to a foreground process, where SIGINT
    is not ignored. A runner started by a script in the background (`pytest ... &`, nohup)
    inherits SIGINT ignored, and so would every command it starts, which then rightly keeps
    ignoring it (trainjob.signals). Taking SIGINT here gives the commands the terminal's
    default: a handler, unlike "ignored", is not inherited across exec."""
    del config
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def e2e_enabled(config: pytest.Config) -> bool:
    flag = bool(config.getoption("--e2e", default=False))
    return flag or os.environ.get(E2E_ENV, "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    deselected: list[pytest.Item] = []
    kept: list[pytest.Item] = []
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
        if "e2e" in parts and not e2e_enabled(config):
            deselected.append(item)
        else:
            kept.append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept
