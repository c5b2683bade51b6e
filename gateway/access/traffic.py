"""Traffic control at the gateway: connection counts and rates, publish rates per user, client id
and address (issue 19).

One module for every door. A door asks three things, each cheap when no limit
is set (one attribute read: :attr:`TrafficControl.active`):

- :meth:`TrafficControl.connect` when a client has logged in: a :class:`Lease`
  on a connection slot of its user, its client id and its IP address (released
  when the connection ends), or :class:`QuotaExceededError` when one of them is
  at its ``connections`` limit (``what="connections"``) or over its
  ``connections_per_s`` rate (``what="connection_rate"``: a token bucket that
  is never run into debt, so a refused attempt costs nothing). Connections are
  counted always, so a limit set later counts the connections already open.
- :meth:`Meter.charge` for every publish (or batch): how long the door should
  hold the client back (seconds; 0.0 within its rate), or
  :class:`QuotaExceededError` when it persists: a client kept over its rate for
  longer than ``refuse_after_s``, or whose backlog alone would take longer than
  that to pay off. The door decides *how* to hold it back, the way its protocol
  allows (stop reading its socket, AMQP ``connection.blocked``, an HTTP or gRPC
  answer made to wait) and how to refuse (MQTT 5 0x97, AMQP basic.nack, HTTP
  429 with Retry-After, RocketMQ TOO_MANY_REQUESTS). A refused message is never
  stored and never acknowledged; a held-back one is stored and acknowledged late.
- :meth:`Meter.subscriptions` for a subscription: the limit on one connection.

Rates are token buckets: ``rate`` tokens a second, at most ``rate * burst_s``
saved up (a client idle for a while may send a second's worth at once). A charge
takes its tokens at once and may leave the bucket in debt; the debt divided by
the rate is the wait. Buckets belong to identities, not connections: a user's
limit is shared by all its connections on this gateway process; a default
(``user:*``, ``client:*``) gives each identity a bucket of its own.

Limits come from the identity store (``gateway.access.store``) and change at run
time: :meth:`TrafficControl.install` bumps a version, and every meter looks its
buckets up again on its next charge, so an open connection gets a new limit at
its next publish (within ``auth_refresh_s`` of the change on every gateway).

Hand-written: a token bucket is a few lines, and the rate-limit libraries there
are own a storage and an API shape (per-call decorators, Redis) that fits none
of the doors' ways of holding a client back.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import TYPE_CHECKING, Callable

from core_broker.errors import UnimqError

from .limits import Limits
from .login_throttle import address_of
from .model import ANONYMOUS

if TYPE_CHECKING:
    from ..metrics import Metrics

__all__ = ["Lease", "Meter", "QuotaExceededError", "TrafficControl"]

_MAX_SHARED_METERS = 10_000


class QuotaExceededError(UnimqError):
    """A limit refuses this (details: ``what`` (connections, publish, subscriptions), ``limit``,
    ``subject`` (``user:NAME`` / ``client:ID``), ``retry_after_s``). RocketMQ's v2 code name, so the
    gRPC door answers TOO_MANY_REQUESTS and the HTTP door 429."""

    code = "TOO_MANY_REQUESTS"

    @property
    def retry_after_s(self) -> float:
        return float(self.details.get("retry_after_s", 1.0))  # type: ignore[arg-type]


class _Bucket:
    __slots__ = ("rate", "capacity", "tokens", "stamp")

    def __init__(self, rate: float, burst_s: float, now: float, floor: float) -> None:
        self.rate = rate
        self.capacity = max(rate * burst_s, floor) if rate > 0 else 0.0
        self.tokens = self.capacity
        self.stamp = now

    def refill(self, now: float) -> float:
        t = self.tokens + (now - self.stamp) * self.rate
        if t > self.capacity:
            t = self.capacity
        self.tokens = t
        self.stamp = now
        return t


# one bucket a meter charges: (bucket, charges messages (else bytes), subject, the limit's figure)
_Charge = tuple[_Bucket, bool, str, float]


class Lease:
    """A connection slot of a user and a client id; :meth:`release` once, when the connection ends."""

    __slots__ = ("_tc", "_keys")

    def __init__(self, tc: TrafficControl, keys: tuple[tuple[str, str], ...]) -> None:
        self._tc = tc
        self._keys: tuple[tuple[str, str], ...] | None = keys

    def release(self) -> None:
        keys, self._keys = self._keys, None
        if keys is None:
            return
        counts = self._tc._conns
        for k in keys:
            n = counts.get(k, 0) - 1
            if n > 0:
                counts[k] = n
            else:
                counts.pop(k, None)


class Meter:
    """The publish budget of one connection (or, for request doors, of one user and client id)."""

    __slots__ = ("tc", "user", "client_id", "version", "charges", "subs", "over_since")

    def __init__(self, tc: TrafficControl, user: str, client_id: str) -> None:
        self.tc = tc
        self.user = user
        self.client_id = client_id
        self.version = -1
        self.charges: tuple[_Charge, ...] = ()
        self.subs: int | None = None
        self.over_since: float | None = None  # since when every charge found its bucket short

    def _resolve(self) -> None:
        tc = self.tc
        self.version = tc.version
        charges: list[_Charge] = []
        subs: int | None = None
        for subject, lim in tc.limits_for(self.user, self.client_id):
            if lim.publish_msgs_per_s is not None:
                charges.append((tc._bucket(subject, "msgs", lim.publish_msgs_per_s, 1.0), True, subject,
                                lim.publish_msgs_per_s))
            if lim.publish_bytes_per_s is not None:
                charges.append((tc._bucket(subject, "bytes", lim.publish_bytes_per_s, 0.0), False, subject,
                                lim.publish_bytes_per_s))
            if lim.subscriptions is not None:
                subs = lim.subscriptions if subs is None else min(subs, lim.subscriptions)
        self.charges = tuple(charges)
        self.subs = subs
        if not charges:
            self.over_since = None

    def subscriptions(self) -> int | None:
        """The most subscriptions (MQTT) or consumers (AMQP) one connection may hold; None: no limit."""
        if self.version != self.tc.version:
            self._resolve()
        return self.subs

    def charge(self, msgs: int, nbytes: int) -> float:
        """Take ``msgs`` messages of ``nbytes`` body bytes from the budget: the seconds to hold the client
        back (0.0: none), or QuotaExceededError (nothing taken) when its excess persists."""
        tc = self.tc
        if self.version != tc.version:
            self._resolve()
        charges = self.charges
        if not charges:
            return 0.0
        now = tc.clock()
        short = False
        wait = 0.0
        retry = 0.0
        worst: _Charge | None = None
        for c in charges:
            b, per_msg = c[0], c[1]
            cost = msgs if per_msg else nbytes
            have = b.refill(now)
            if have < cost:
                short = True
                rate = b.rate
                if rate <= 0:
                    wait, retry, worst = math.inf, 60.0, c
                    continue
                w = (cost - have) / rate
                if w > wait:
                    wait, worst = w, c
                    # when the whole cost fits again (a refused client's Retry-After)
                    retry = max(retry, (cost - have) / rate)
        if not short:
            self.over_since = None
        else:
            if self.over_since is None:
                self.over_since = now
            if wait > tc.refuse_after_s or now - self.over_since > tc.refuse_after_s:
                assert worst is not None
                tc.refused += 1
                raise QuotaExceededError(
                    f"{worst[2]} is over its publish rate of {worst[3]:g} "
                    f"{'messages' if worst[1] else 'bytes'}/s",
                    what="publish", subject=worst[2], limit=worst[3], retry_after_s=max(1.0, min(retry, 3600.0)))
            tc.throttled += 1
        for c in charges:
            c[0].tokens -= msgs if c[1] else nbytes
        return wait


class TrafficControl:
    """Every limit of this process, the buckets of the identities that have one, the connection counts."""

    def __init__(self, refuse_after_s: float = 10.0, burst_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.refuse_after_s = refuse_after_s
        self.burst_s = burst_s
        self.clock = clock
        self.limits: dict[tuple[str, str], Limits] = {}  # (kind, name or "*") -> limits
        self.version = 0
        self.active = False  # any limit at all: the doors' one check on their hot paths
        self._buckets: dict[tuple[str, str], _Bucket] = {}  # (subject, figure) -> bucket
        self._conns: dict[tuple[str, str], int] = {}  # ("user"|"client", name) -> open connections
        self._meters: dict[tuple[str, str], Meter] = {}  # request doors' meters per (user, client id)
        self.throttled = 0  # charges answered with a wait
        self.refused = 0  # charges refused

    # -- limits

    def install(self, limits: dict[tuple[str, str], Limits]) -> None:
        """Take a new set of limits (the identity store calls this after every reload)."""
        if limits == self.limits:
            return
        self.limits = dict(limits)
        self.active = any(not lim.empty for lim in limits.values())
        # a bucket whose rate changed starts afresh; the others keep what they have
        self._buckets.clear()
        self.version += 1

    def limits_for(self, user: str | None, client_id: str) -> list[tuple[str, Limits]]:
        """The limits that apply to a user and a client id: (subject, limits), the user's then the client's."""
        out: list[tuple[str, Limits]] = []
        if not self.limits:
            return out
        name = user if user is not None else ANONYMOUS
        lim = self.limits.get(("user", name)) or self.limits.get(("user", "*"))
        if lim is not None and not lim.empty:
            out.append((f"user:{name}", lim))
        if client_id:
            lim = self.limits.get(("client", client_id)) or self.limits.get(("client", "*"))
            if lim is not None and not lim.empty:
                out.append((f"client:{client_id}", lim))
        return out

    def _bucket(self, subject: str, figure: str, rate: float, floor: float) -> _Bucket:
        key = (subject, figure)
        b = self._buckets.get(key)
        if b is None or b.rate != rate:
            b = self._buckets[key] = _Bucket(rate, self.burst_s, self.clock(), floor)
        return b

    # -- what the doors ask

    def meter(self, user: str | None, client_id: str = "") -> Meter:
        """A new meter for one connection."""
        return Meter(self, user if user is not None else ANONYMOUS, client_id)

    def shared_meter(self, user: str | None, client_id: str = "") -> Meter:
        """The meter of a user and client id across requests (the HTTP and gRPC doors: no connection)."""
        key = (user if user is not None else ANONYMOUS, client_id)
        m = self._meters.get(key)
        if m is None:
            if len(self._meters) >= _MAX_SHARED_METERS:
                self._meters.clear()
            m = self._meters[key] = Meter(self, key[0], client_id)
        return m

    async def admit(self, user: str | None, client_id: str, msgs: int, nbytes: int, protocol: str,
                    metrics: Metrics) -> None:
        """A request door's publish (HTTP, gRPC): its answer waits while the caller is over its rate
        (``quota_throttled``), QuotaExceededError when that persists (``quota_exceeded``)."""
        try:
            wait = self.shared_meter(user, client_id).charge(msgs, nbytes)
        except QuotaExceededError:
            metrics.inc("quota_exceeded", protocol)
            raise
        if wait > 0:
            metrics.inc("quota_throttled", protocol)
            await asyncio.sleep(wait)

    def connect(self, user: str | None, client_id: str = "", *, address: str = "", replaces: bool = False) -> Lease:
        """A connection slot for ``user``, ``client_id`` and ``address`` (a peer ``ip:port`` or an IP), or
        QuotaExceededError: ``what="connections"`` (at a connection limit) or ``"connection_rate"`` (over a
        ``connections_per_s`` rate; ``retry_after_s``: when one more fits).

        ``replaces``: this connection takes over an open one of the same client id (MQTT), which is
        about to end, so that one is not counted against the limits (it is still a new connection
        for the rate)."""
        name = user if user is not None else ANONYMOUS
        ip = address_of(address) if address else ""
        keys: list[tuple[str, str]] = [("user", name)]
        if client_id:
            keys.append(("client", client_id))
        if ip:
            keys.append(("address", ip))
        counts = self._conns
        if self.active:
            rated: list[_Bucket] = []
            subjects = self.limits_for(name, client_id)
            if ip:
                lim = self.limits.get(("address", ip)) or self.limits.get(("address", "*"))
                if lim is not None and not lim.empty:
                    subjects.append((f"address:{ip}", lim))
            for subject, lim in subjects:
                kind, _, who = subject.partition(":")
                if lim.connections is not None and counts.get((kind, who), 0) - replaces >= lim.connections:
                    self.refused += 1
                    raise QuotaExceededError(
                        f"{kind} '{who}' has reached its connection limit ({lim.connections})",
                        what="connections", subject=subject, limit=lim.connections, retry_after_s=1.0)
                rate = lim.connections_per_s
                if rate is not None:
                    b = self._bucket(subject, "conns", rate, 1.0)
                    have = b.refill(self.clock())
                    if have < 1.0:
                        self.refused += 1
                        retry = (1.0 - have) / rate if rate > 0 else 60.0
                        raise QuotaExceededError(
                            f"{kind} '{who}' is over its connection rate ({rate:g}/s)", what="connection_rate",
                            subject=subject, limit=rate, retry_after_s=max(1.0, min(math.ceil(retry), 3600.0)))
                    rated.append(b)
            for b in rated:
                b.tokens -= 1.0
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
        return Lease(self, tuple(keys))

    def connections(self, kind: str, name: str) -> int:
        """Open connections of a user, a client id or an address on this process."""
        return self._conns.get((kind, name), 0)
