"""Kubernetes resource quantities (`500m`, `2`, `1Gi`, `1.5e3`) as exact numbers (pure).

Only what TrainJob needs of resource.Quantity: read a quantity exactly (a Fraction, so that
sums of `100m` CPUs never drift) and write a sum back in a form the API server accepts. A
gang's minResources is such a sum of container requests.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Final

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# <sign><digits>[.<digits>]<suffix>, the suffix binary, decimal SI or an exponent (e3, E-2).
_QUANTITY: Final = re.compile(
    r"^(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$"
)


def parse(value: object) -> Fraction:
    """The exact value of a quantity; ValueError says why one is not."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a quantity (e.g. 500m, 2, 1Gi)")
    number = Fraction(match["number"])
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def render(value: Fraction) -> str:
    """A quantity the API server reads back as `value`: whole numbers plain, else in milli
    units, rounded up to the next milli (the API server's own smallest CPU unit), as
    Kubernetes rounds a request up rather than promise less."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{math.ceil(value * 1000)}m"


def add(total: dict[str, Fraction], resources: Mapping[str, object], times: int = 1) -> None:
    """Add `times` x `resources` (a ResourceList) to `total`; an unreadable value is skipped
    (the API server has already refused such a Pod template, or will)."""
    for name, value in resources.items():
        try:
            amount = parse(value)
        except ValueError:
            continue
        total[name] = total.get(name, Fraction(0)) + amount * times


def render_all(total: Mapping[str, Fraction]) -> dict[str, str]:
    return {name: render(value) for name, value in sorted(total.items())}


def invalid(resources: Mapping[str, object]) -> Iterable[tuple[str, str]]:
    """(resource name, why) for every value of `resources` that is not a quantity."""
    for name, value in resources.items():
        try:
            parse(value)
        except ValueError as exc:
            yield name, str(exc)
