"""Marks each test with its tier by directory, so `pytest -m unit` (or integration, training)
selects a tier; the README's test command runs them all."""

from __future__ import annotations

import pathlib

import pytest

TIERS = ("unit", "integration", "training", "local", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parts = pathlib.Path(str(item.fspath)).parts
        for tier in TIERS:
            if tier in parts:
                item.add_marker(getattr(pytest.mark, tier))
