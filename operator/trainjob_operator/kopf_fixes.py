"""The only place the operator reaches into kopf's private modules: two functions kopf resolves
by name when its watches start, replaced for this process by `install` (called from the
start-up handler, before kopf starts its namespace observer and peering watches, which wait for
start-up to finish). Written for kopf `KOPF_VERSION`, which pyproject.toml pins exactly;
tests/unit/test_kopf_fixes.py fails when the installed kopf differs, so a kopf upgrade is a
conscious step: re-check both reasons below against the new release, then move the pin.

1. **Namespaces listed by kopf's namespace watch are observed** (kopf 1.45.2,
   `observation.process_discovered_namespace_event`). kopf drops every event of its namespace
   watch's own listing (type None), assuming the one-shot namespace list just before covered
   them. A namespace created between that list and the watch's listing, or while the watch was
   down and listed again, was never observed (measured, when kopf still watched the TrainJobs:
   such namespaces got no TrainJob watch at all). kopf now observes namespaces only for
   peering in namespaces given as patterns; the replacement counts the listing's namespaces
   as seen, exactly as a later ADDED event would.
2. **Peering's pause is visible to the job loop** (`peering.process_peering_event`). kopf tells
   only its own daemons and watchers when peering pauses this replica; the operator's job loop
   is neither, so it reads the same switch: kopf hands each peering watch its pause toggle with
   every peering event, and the wrapper passes the toggle on before kopf's own handling flips it.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any, Final

import kopf
from kopf._cogs.aiokits.aiotoggles import Toggle
from kopf._core.engines import peering
from kopf._core.reactor import observation

logger = logging.getLogger(__name__)

# The kopf release both fixes were written and checked for (pyproject.toml pins it).
KOPF_VERSION: Final = "1.45.2"


async def observe_namespace_event(
    *,
    raw_event: kopf.RawEvent,
    namespaces: Any,
    insights: Any,
    **_: Any,
) -> None:
    """kopf's handler of namespace watch events, with the listing's events counted (fix 1)."""
    async with insights.revised:
        observation.revise_namespaces(
            raw_events=[raw_event], insights=insights, namespaces=namespaces
        )
        insights.revised.notify_all()


_KOPF_PEERING_EVENT: Final = peering.process_peering_event


def _tracking_pause(track: Callable[[Toggle], None]) -> Callable[..., Any]:
    async def process_peering_event(*, conflicts_found: Any = None, **kwargs: Any) -> None:
        if conflicts_found is not None:
            track(conflicts_found)
        await _KOPF_PEERING_EVENT(conflicts_found=conflicts_found, **kwargs)

    process_peering_event.tracks = track  # type: ignore[attr-defined]  # for `installed`
    return process_peering_event


def install(track_pause: Callable[[Toggle], None]) -> None:
    """Apply both fixes for this process; `track_pause` receives every peering pause toggle.
    Idempotent (a process may start the operator more than once, e.g. in tests); the last
    `track_pause` wins. Refuses, naming this module, when kopf no longer has the functions."""
    if not callable(getattr(observation, "process_discovered_namespace_event", None)):
        raise RuntimeError(f"kopf's namespace observation moved; see {__name__} (fix 1)")
    if not callable(getattr(peering, "process_peering_event", None)):
        raise RuntimeError(f"kopf's peering moved; see {__name__} (fix 2)")
    if installed_kopf() != KOPF_VERSION:
        logger.warning(
            "kopf %s is installed; %s was written for kopf %s",
            installed_kopf(),
            __name__,
            KOPF_VERSION,
        )
    observation.process_discovered_namespace_event = observe_namespace_event
    peering.process_peering_event = _tracking_pause(track_pause)


def installed_kopf() -> str:
    return importlib.metadata.version("kopf")


def installed() -> bool:
    """Whether `install` has run in this process."""
    return observation.process_discovered_namespace_event is observe_namespace_event and hasattr(
        peering.process_peering_event, "tracks"
    )
