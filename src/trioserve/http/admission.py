"""Admission control: a bound on generation requests served at once, and on the request
bodies held in memory across requests.

A request past the bound is refused at once (503, ``Retry-After``), never queued: a queue
in front of the engines only hides overload from the load balancer and the client. The
slot is taken once the request's body is complete, just before its engine request is
submitted (a client sending its body slowly holds no slot), and held until its last byte.
Operations routes (health, liveness, metrics, models) never take a slot. With API keys,
each key may hold its share of the slots (``--max-requests-per-key``, by default an equal
share): past it that key is refused (429), and the others still find theirs.

Request bodies held in memory draw on one budget for the whole server
(``--max-body-memory-mb``: ``memory.py``), held until their request ends.
"""

from __future__ import annotations

from .. import metrics
from ..config import per_key_bound
from .errors import HTTPError
from .memory import RETRY_AFTER

#: The liveness and readiness probes: answered outside every limit a client can exhaust
#: (no admission slot, no body budget; the built-in server answers them even past
#: ``--max-connections``), since a probe that fails gets the pod restarted or drained.
PROBE_PATHS = frozenset({"/live", "/health"})


class Admission:
    """The slots, and each API key's share of them: ``per_key`` (default: ``limit``
    divided by ``keys``, the number of configured keys, so that every key can always
    have its share however busy the others are; with one key or none, all of ``limit``)."""

    def __init__(self, limit: int, *, keys: int = 0, per_key: int = 0) -> None:
        self.limit = limit
        self.in_use = 0
        # No bound per key (0) is a share of all the slots: the 429's message names it.
        self.per_key = per_key_bound(per_key, limit, keys) or limit
        #: Slots in use by key index (requests without a key are not in it).
        self.by_key: dict[int, int] = {}

    def overloaded(self) -> HTTPError:
        return HTTPError(
            503,
            f"the server is serving its limit of {self.limit} concurrent requests; retry later",
            "server_overloaded",
            headers=[(b"retry-after", str(RETRY_AFTER).encode())],
        )

    def key_overloaded(self) -> HTTPError:
        return HTTPError(
            429,
            f"this API key has its limit of {self.per_key} requests in flight "
            "(--max-requests-per-key); retry once one has ended",
            "too_many_requests_for_key",
            headers=[(b"retry-after", str(RETRY_AFTER).encode())],
        )

    def take(self, key: int | None = None) -> Slot:
        """A slot for a request of ``key`` (the 503 :class:`HTTPError` if the server is
        full, the 429 if this key has its share), held until the end of a ``with`` block
        over it or its :meth:`Slot.release`: the one way every generation request,
        whatever its route or transport, is admitted."""
        if key is not None and self.by_key.get(key, 0) >= self.per_key:
            metrics.ADMISSION_REFUSED.inc()
            raise self.key_overloaded()
        if self.in_use >= self.limit:
            metrics.ADMISSION_REFUSED.inc()
            raise self.overloaded()
        self.in_use += 1
        if key is not None:
            self.by_key[key] = self.by_key.get(key, 0) + 1
        return Slot(self, key)

    def _release(self, key: int | None) -> None:
        self.in_use -= 1
        if key is not None:
            left = self.by_key[key] - 1
            if left:
                self.by_key[key] = left
            else:
                del self.by_key[key]


class Slot:
    """One admitted request's slot (:meth:`Admission.take`). A WebSocket message takes it
    in the connection's reader, so a refusal is answered before anything starts, and
    hands it to the request's task, which releases it when the request has ended."""

    def __init__(self, admission: Admission, key: int | None) -> None:
        self._admission: Admission | None = admission
        self._key = key

    def release(self) -> None:
        """Give the slot back; idempotent."""
        if self._admission is not None:
            admission, self._admission = self._admission, None
            admission._release(self._key)

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class KeyShares:
    """Each API key's share of something it holds open (connections, WebSockets): at most
    ``per_key`` each, 0 for no bound. Past it, :meth:`take` raises the 429 ``code``,
    whose message names the ``flag`` that sets it. Holders without a key count nowhere."""

    def __init__(self, per_key: int, what: str, flag: str, code: str, *, closes: bool) -> None:
        self.per_key = per_key
        self.what = what
        self.flag = flag
        self.code = code
        #: The 429 closes the connection it is sent on (a connection's own share).
        self.closes = closes
        self.by_key: dict[int, int] = {}

    def refused(self) -> HTTPError:
        headers = [(b"retry-after", str(RETRY_AFTER).encode())]
        if self.closes:
            headers.append((b"connection", b"close"))
        return HTTPError(
            429,
            f"this API key has its limit of {self.per_key} {self.what} open ({self.flag}); "
            "close one or retry later",
            self.code,
            headers=headers,
        )

    def take(self, key: int | None) -> KeyShare:
        """One of ``key``'s share, held until :meth:`KeyShare.release` (or the end of a
        ``with`` block over it); the 429 :class:`HTTPError` past the share."""
        if key is not None:
            held = self.by_key.get(key, 0)
            if self.per_key and held >= self.per_key:
                metrics.ADMISSION_REFUSED.inc()
                raise self.refused()
            self.by_key[key] = held + 1
        return KeyShare(self, key)

    def _release(self, key: int) -> None:
        left = self.by_key[key] - 1
        if left:
            self.by_key[key] = left
        else:
            del self.by_key[key]


def connection_shares(per_key: int) -> KeyShares:
    """Each API key's share of the connections (``--max-connections-per-key``); a refusal
    closes its connection."""
    return KeyShares(
        per_key,
        "connections",
        "--max-connections-per-key",
        "too_many_connections_for_key",
        closes=True,
    )


class ConnectionKeyHold:
    """One connection's place in its API key's share of connections (``shares``), on
    either server: it counts against the key of the first request on it that carries one,
    moves to another key's share when a request of that key comes (if that share has
    room), and leaves with :meth:`release` when the connection closes."""

    def __init__(self, shares: KeyShares) -> None:
        self.shares = shares
        self.key: int | None = None
        self._share: KeyShare | None = None

    def hold_for_key(self, key: int) -> None:
        """Count the connection against ``key`` from now on; the 429
        :class:`~trioserve.http.errors.HTTPError` if ``key`` holds its share (the connection
        then stays where it was)."""
        if key == self.key:
            return
        share = self.shares.take(key)
        if self._share is not None:
            self._share.release()
        self.key, self._share = key, share

    def release(self) -> None:
        """The connection has closed; idempotent."""
        if self._share is not None:
            self._share.release()
            self._share = None


class KeyShare:
    """What one holder holds of its key's share (:meth:`KeyShares.take`)."""

    def __init__(self, shares: KeyShares, key: int | None) -> None:
        self._shares: KeyShares | None = shares if key is not None else None
        self._key = key

    def release(self) -> None:
        """Give it back; idempotent."""
        if self._shares is not None and self._key is not None:
            shares, self._shares = self._shares, None
            shares._release(self._key)

    def __enter__(self) -> KeyShare:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
