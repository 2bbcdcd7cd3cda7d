"""The operator's two fixes to kopf internals (kopf_fixes.py): pinned to the kopf release they
were written for, and each doing what its docstring says."""

from __future__ import annotations

import asyncio
from pathlib import Path

import kopf
from kopf._cogs.aiokits import aiotoggles
from kopf._cogs.structs import references
from kopf._core.engines import peering
from kopf._core.reactor import observation

from trainjob_operator import kopf_fixes

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_kopf_is_the_release_the_fixes_were_written_for() -> None:
    """A kopf upgrade must re-check both fixes (kopf_fixes' docstring), then move the pin."""
    assert kopf_fixes.installed_kopf() == kopf_fixes.KOPF_VERSION


def test_pyproject_pins_that_kopf_release_exactly() -> None:
    pins = [
        line.strip()
        for line in PYPROJECT.read_text().splitlines()
        if line.strip().startswith('"kopf=')
    ]
    assert pins == [f'"kopf=={kopf_fixes.KOPF_VERSION}",']


def test_namespaces_in_the_namespace_watch_listing_are_served() -> None:
    """kopf ignored the listing that starts its namespace watch; with the fix installed the
    listed namespaces that match count as seen."""
    kopf_fixes.install(lambda toggle: None)
    assert kopf_fixes.installed()

    async def listing() -> set[object]:
        insights = references.Insights()
        for name in ("team-x", "other"):
            await observation.process_discovered_namespace_event(
                raw_event={"type": None, "object": {"metadata": {"name": name}}},
                namespaces=["team-*"],
                insights=insights,
            )
        return set(insights.namespaces)

    assert asyncio.run(listing()) == {"team-x"}


async def _one_peering_event(toggle: aiotoggles.Toggle) -> None:
    # An event kopf ignores (not its peering object): only the toggle's passing is tested.
    await peering.process_peering_event(
        raw_event={"type": "ADDED", "object": {"metadata": {"name": "someone-else"}}},
        namespace=None,
        resource=references.CLUSTER_PEERINGS_K,  # type: ignore[arg-type]
        identity=peering.Identity("me"),
        settings=kopf.OperatorSettings(),
        autoclean=False,
        conflicts_found=toggle,
    )


def test_peering_events_hand_their_pause_toggle_on_and_the_last_install_wins() -> None:
    first: list[aiotoggles.Toggle] = []
    second: list[aiotoggles.Toggle] = []
    kopf_fixes.install(first.append)
    kopf_fixes.install(second.append)
    toggle = aiotoggles.Toggle(False)
    asyncio.run(_one_peering_event(toggle))
    assert first == []
    assert second == [toggle]
