"""How times and durations are written and read (pure, a leaf: every wire schema may import
it). No other module formats a duration.

- :func:`format_time` / :func:`parse_time`: RFC 3339 in UTC, as the API server writes
  metav1.Time.
- Three duration styles, different on purpose, each the one its readers already know:
  :func:`format_eta` (`45s`, `4m`, `1h20m`, `2d3h`: a coarse remaining time, in
  `status.progress.eta` and `kubectl get tj`), :func:`format_age` (kubectl's AGE column:
  `3m20s`, `5h2m`, `2y10d`) and :func:`format_elapsed` (`4.2s`, `2m05s`, `1h02m03s`: how long a
  run has gone, and its ETA, on the console).
- :func:`parse_duration`: `90s`, `5m`, `1h30m` as kubectl's --timeout reads them.
"""

from __future__ import annotations

import datetime
import re
from typing import Final


def format_time(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with a Z, as the API server writes metav1.Time."""
    return value.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.timezone.utc)
    return parsed


def format_eta(seconds: float | None) -> str:
    """`45s`, `4m`, `1h20m`, `2d3h`: coarse enough to read at a glance."""
    if seconds is None:
        return ""
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes = (whole + 30) // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def format_age(seconds: float) -> str:
    """kubectl's AGE: `45s`, `3m20s`, `15m`, `5h2m`, `30h`, `3d4h`, `40d`, `2y10d`."""
    s = int(max(0.0, seconds))
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y{days % 365}d"


_DURATION: Final = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str) -> float:
    """`90`, `90s`, `5m`, `1h30m` as seconds (kubectl's --timeout); ValueError naming it."""
    match = _DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise ValueError(f"{text!r} is not a duration such as 30s, 5m or 1h30m")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def format_elapsed(seconds: float) -> str:
    """How long a run has gone (the live table's time, the summary's `after`): `4.2s`,
    `2m05s`, `1h02m03s`."""
    seconds = max(0.0, seconds)
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    return f"{minutes}m{secs:02d}s" if minutes else f"{seconds:.1f}s"
