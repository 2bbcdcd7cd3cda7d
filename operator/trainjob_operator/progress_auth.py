"""Who may report a job's progress: the decisions, pure (no I/O, `now` passed in).

A report carries a projected service-account token whose audience is its own job
(`progress.audience`). The server (progress_server.py) asks the API server for a TokenReview
with that audience, then decides here:

1. the API server authenticated the token for exactly this job's audience (a token of another
   job, or a plain API token, fails the review: 401);
2. it is a Pod-bound service-account token of this job's namespace (403 otherwise);
3. the Pod named in the token (its name and uid, from the review's `extra`) is a current Pod of
   this job in the operator's index (403 otherwise): a deleted Pod's token, even one still in
   the review cache, is refused, and so is a token of a recreated Pod's predecessor.

Reviews are cached until the token expires (capped), so a job reporting every 5 s costs one
TokenReview an hour, not 720; failed reviews are cached briefly so that a flood of bad tokens
cannot turn into a flood of TokenReviews. Both the cache and the rate limits are bounded.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

from trainjob_operator import children

POD_NAME_KEY: Final = "authentication.kubernetes.io/pod-name"
POD_UID_KEY: Final = "authentication.kubernetes.io/pod-uid"
SERVICE_ACCOUNT_PREFIX: Final = "system:serviceaccount:"

# A positive review is trusted at most this long even for a long-lived token.
MAX_CACHE_SECONDS: Final = 600.0
# A failed review is remembered this long (a bad token is not reviewed again meanwhile).
NEGATIVE_CACHE_SECONDS: Final = 10.0
MAX_CACHE_ENTRIES: Final = 20_000

# Per reporting Pod: a burst of 5, then one report a second (the runtime sends one per 5 s,
# epoch ends at most one a second). Per client address, before any TokenReview: a burst of 20,
# then 10 a second (one node's Pods share an address behind some CNIs' SNAT).
POD_RATE: Final = (5.0, 1.0)
ADDRESS_RATE: Final = (20.0, 10.0)
MAX_BUCKETS: Final = 50_000


@dataclasses.dataclass(frozen=True)
class Identity:
    """What a successful TokenReview says about a token."""

    namespace: str
    service_account: str
    pod_name: str | None
    pod_uid: str | None
    audiences: tuple[str, ...]


def token_digest(token: str, audience: str) -> str:
    """The cache key: a token reviewed for one audience says nothing about another."""
    return hashlib.sha256(f"{audience}\n{token}".encode()).hexdigest()


def identity_from_review(review: Mapping[str, Any]) -> Identity | None:
    """The identity in a TokenReview reply; None when the token was not authenticated."""
    status = review.get("status") or {}
    if not isinstance(status, Mapping) or status.get("authenticated") is not True:
        return None
    user = status.get("user") or {}
    username = str(user.get("username") or "")
    if not username.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, _, account = username[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
    extra = user.get("extra") or {}

    def first(key: str) -> str | None:
        values = extra.get(key) if isinstance(extra, Mapping) else None
        return str(values[0]) if isinstance(values, list) and values else None

    return Identity(
        namespace=namespace,
        service_account=account,
        pod_name=first(POD_NAME_KEY),
        pod_uid=first(POD_UID_KEY),
        audiences=tuple(str(a) for a in status.get("audiences") or ()),
    )


def token_expiry(token: str) -> float | None:
    """The `exp` claim of a JWT, read without verifying it: only ever used to bound how long a
    review the API server already accepted stays cached."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except ValueError:
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool) else None


def refusal(
    identity: Identity, namespace: str, audience: str, pods: Iterable[children.ChildPod]
) -> str | None:
    """Why an authenticated token may not report for the job (None: it may). `pods`: the
    job's Pods in the operator's index now."""
    if audience not in identity.audiences:
        return f"the token's audiences {list(identity.audiences)} do not include {audience}"
    if identity.namespace != namespace:
        return f"the token belongs to namespace {identity.namespace}, not {namespace}"
    if not identity.pod_name or not identity.pod_uid:
        return "the token is not bound to a Pod (a projected token of the job's Pod is needed)"
    for pod in pods:
        if pod.uid == identity.pod_uid:
            return None
    return f"Pod {identity.pod_name} (uid {identity.pod_uid}) is not a current Pod of this job"


class ReviewCache:
    """TokenReview results by token digest, each until its own deadline (wall-clock seconds)."""

    def __init__(self, max_entries: int = MAX_CACHE_ENTRIES) -> None:
        self._entries: collections.OrderedDict[str, tuple[float, Identity | None]] = (
            collections.OrderedDict()
        )
        self._max = max_entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, digest: str, now: float) -> tuple[bool, Identity | None]:
        """(found, identity); an identity of None is a cached refusal."""
        entry = self._entries.get(digest)
        if entry is None:
            return False, None
        if now >= entry[0]:
            del self._entries[digest]
            return False, None
        return True, entry[1]

    def put(
        self, digest: str, identity: Identity | None, now: float, expires: float | None
    ) -> None:
        if identity is None:
            until = now + NEGATIVE_CACHE_SECONDS
        else:
            until = now + MAX_CACHE_SECONDS
            if expires is not None:
                until = min(until, expires)
            if until <= now:
                return
        self._entries[digest] = (until, identity)
        self._entries.move_to_end(digest)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)


class RateLimiter:
    """Token buckets by key: `burst` requests at once, then `rate` a second. Bounded: the
    least recently used buckets are dropped (a dropped bucket starts full again)."""

    def __init__(self, burst: float, rate: float, max_keys: int = MAX_BUCKETS) -> None:
        self.burst = burst
        self.rate = rate
        self._buckets: collections.OrderedDict[str, tuple[float, float]] = collections.OrderedDict()
        self._max = max_keys

    def allow(self, key: str, now: float) -> float:
        """0 when a request of `key` may go now (and counts it), else the seconds to wait."""
        tokens, stamp = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - stamp) * self.rate)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            self._buckets.move_to_end(key)
            return (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens - 1.0, now)
        self._buckets.move_to_end(key)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return 0.0
