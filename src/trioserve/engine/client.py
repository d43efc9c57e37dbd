"""``open_engine_client``: the frontend's handle on all of its engines.

The engine client holds one link (:class:`~trioserve.engine.link.EngineLink`, made by the
caller's :data:`~trioserve.engine.link.LinkFactory`: trioserve's protocol or vLLM's
EngineCore, per engine) per engine address, and the links it was given ready-made (an
EngineCore it started); the addresses are the fixed ``--engine`` ones plus what each
``dns://NAME:PORT`` resolves to now (:mod:`~trioserve.engine.discovery`), so connections
come and go while it runs: an address that appears is connected to, one that vanishes is
let go of once its requests have ended. A request goes to an engine chosen by the routing
policy (:mod:`~trioserve.engine.routing`) among those that accept requests; if that engine
refuses it or is lost before any output was delivered, it is submitted once more, to
another (see :mod:`~trioserve.engine.subscription`, *Failover*), counted in
``trioserve_engine_failovers_total``. A request is prepared (:meth:`EngineClient.prepare`)
by the chosen engine's preparer before it is submitted (:meth:`EngineClient.submit`);
both choose among the engines of one preparer, since what one prepared is another's to
send only if they share it.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

import trio

from .. import metrics
from ..ends import EndReason
from ..errors import EngineOverloadedError, NoEngineError, TrioserveError
from ..protocol import ModelCard, Submit
from .discovery import DEFAULT_REFRESH, Discovery, Resolver
from .link import EngineLink, LinkFactory, Prepared, Preparer
from .routing import LeastLoad, Policy
from .subscription import DEFAULT_BUFFER, Subscription

log = logging.getLogger(__name__)


class EngineClient:
    """Routes requests to connected engines. Obtain one with :func:`open_engine_client`."""

    def __init__(
        self,
        connect: LinkFactory,
        frontend_id: str | None = None,
        *,
        policy: Policy | None = None,
    ) -> None:
        self.connect = connect
        #: This frontend, to its engines (a stable identity: engines know it again after a
        #: reconnect; the prefix of request ids an engine shared with others sees).
        self.frontend_id = frontend_id or new_frontend_id()
        self.policy: Policy = policy or LeastLoad()
        #: Every engine link, in the order their addresses were first given.
        self.links: list[EngineLink] = []
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        #: The links given ready-made (never let go of by discovery).
        self._fixed: list[EngineLink] = []

    def _notify(self) -> None:
        """Some engine connected, was lost, refused us, began draining, or was let go."""
        self._changed.set()
        self._changed = trio.Event()

    @property
    def ready(self) -> bool:
        """True while at least one engine accepts requests (welcomed, not draining)."""
        return any(link.accepting for link in self.links)

    def models(self) -> list[ModelCard]:
        seen: dict[str, ModelCard] = {}
        for link in self.links:
            for card in link.models:
                seen.setdefault(card.id, card)
        return list(seen.values())

    def offers(self, capability: str) -> bool:
        """Whether a connected engine declares ``capability`` (every generation request
        asks: no set built)."""
        for link in self.links:  # noqa: SIM110 - no generator per request
            if capability in link.capabilities:
                return True
        return False

    def serves_model(self, model: str) -> bool:
        """Whether a connected engine serves ``model`` (every request asks: no list built).
        A draining one counts: its model is known, its requests get a retryable 503."""
        for link in self.links:  # noqa: SIM110 - no generator per request
            if link.serves_model(model):
                return True
        return False

    def capabilities(self) -> set[str]:
        return {cap for link in self.links for cap in link.capabilities}

    def default_model(self) -> str | None:
        """The first model of the first connected engine (what ``models()[0]`` is)."""
        for link in self.links:
            models = link.models
            if models:
                return models[0].id
        return None

    # -- requests ------------------------------------------------------------------------

    def _candidates(
        self, model: str | None, capability: str, by: object, exclude: object = None
    ) -> list[EngineLink]:
        return [
            link
            for link in self.links
            if link.accepting
            and link is not exclude
            and link.preparer is by
            and link.serves(model, capability)
        ]

    def preparer_for(self, message: Submit, capability: str) -> Preparer | None:
        """What must prepare ``message`` before it is submitted: the preparer of the
        engine the routing policy picks now among those that serve it (None: that engine
        takes it as it is, and :class:`Prepared` of it is all there is to do). Raises
        :class:`NoEngineError` when no engine serves it."""
        candidates = [
            link for link in self.links if link.accepting and link.serves(message.model, capability)
        ]
        if not candidates:
            raise self._no_engine(message.model, capability)
        return self.policy.choose(candidates, message).preparer

    async def prepare(self, message: Submit, capability: str) -> Prepared:
        """:meth:`preparer_for`, then its preparation (rendering, tokenization), if any.

        Cancellable, and owes no engine anything. Raises :class:`NoEngineError` when no
        engine serves it, and the preparer's :class:`~trioserve.errors.InputError` (a
        400) for what it refuses.
        """
        preparer = self.preparer_for(message, capability)
        if preparer is None:
            return Prepared(message)
        return await preparer.prepare(message)

    def submit(
        self,
        prepared: Prepared | Submit,
        capability: str,
        *,
        buffer: int = DEFAULT_BUFFER,
        on_failure: Callable[[EndReason], None] | None = None,
    ) -> Subscription:
        """Send the request to the engine the routing policy picks among those that serve
        its model and task, accept requests, and share its preparer (a bare ``Submit``:
        those that need no preparation).

        Returns the subscription at once; its owner ends it with ``abort(reason)`` unless
        the engine finished it (``on_failure(reason)``, called when the link fails it,
        should end the request the same way). Raises :class:`NoEngineError` when no such
        engine is connected. If the engine refuses the request or is lost before any
        output was delivered, the subscription moves to another engine by itself, once,
        and neither its owner nor ``on_failure`` hears of it.
        """
        if isinstance(prepared, Submit):
            prepared = Prepared(prepared)
        message = prepared.message
        candidates = self._candidates(message.model, capability, prepared.by)
        if not candidates:
            raise self._no_engine(message.model, capability)
        engine = self.policy.choose(candidates, message)
        try:
            sub = engine.submit(prepared, buffer, on_failure)
        except EngineOverloadedError:
            # Its link takes nothing more (the engine is not reading): another engine, once.
            candidates.remove(engine)
            if not candidates:
                raise
            metrics.engine_failovers("overloaded").inc()
            log.info(
                "request %s: engine %s is not reading; submitting to another",
                message.request_id,
                engine.address,
            )
            return self.policy.choose(candidates, message).submit(prepared, buffer, on_failure)

        def retry(sub: Subscription, reason: str) -> bool:
            return self._fail_over(sub, prepared, capability, reason)

        sub.retry = retry
        return sub

    def _fail_over(
        self, sub: Subscription, prepared: Prepared, capability: str, reason: str
    ) -> bool:
        """Submit ``sub``'s request to another engine than its own; True if one took it."""
        old = sub.engine
        message = prepared.message
        candidates = self._candidates(message.model, capability, prepared.by, exclude=old)
        if not candidates:
            return False
        engine = self.policy.choose(candidates, message)
        try:
            engine.adopt(sub, prepared)
        except TrioserveError:
            return False
        metrics.engine_failovers(reason).inc()
        log.info(
            "request %s: engine %s did not serve it (%s); submitted to %s",
            message.request_id,
            old.address,
            reason,
            engine.address,
        )
        return True

    def _no_engine(self, model: str, capability: str) -> NoEngineError:
        serving = [link for link in self.links if link.ready and link.serves(model, capability)]
        if serving and all(c.draining for c in serving):
            return NoEngineError(f"every engine that serves model {model!r} is draining")
        if not self.ready:
            return NoEngineError("no engine is connected")
        return NoEngineError(f"no connected engine serves model {model!r}")

    def failures(self) -> dict[str, str]:
        """Why each engine that is out of service failed, by address."""
        return {link.address: link.failure for link in self.links if link.failure is not None}

    async def wait_ready(self) -> None:
        """Wait until every engine has welcomed us or failed (a failed engine is tried
        again in the background; see :meth:`failures`). Raises nothing: no engine can
        stop the frontend."""
        while not all(
            link.ready or link.failure is not None or link.retiring for link in self.links
        ):
            await self._changed.wait()

    # -- membership ----------------------------------------------------------------------

    def set_addresses(self, addresses: Sequence[str]) -> None:
        """Serve exactly the engines at ``addresses`` from now on: connect to the new
        ones, let go of the others once their requests have ended."""
        assert self._nursery is not None, "set_addresses needs a running client"
        wanted = dict.fromkeys(addresses)
        known = {link.address: link for link in self.links}
        for link in self.links:
            if link in self._fixed:
                continue
            if link.address in wanted:
                link.unretire()
            else:
                link.retire()
        for address in wanted:
            old = known.get(address)
            if old is None or old.scope.cancel_called:
                self.add(address, self.connect)
        self._notify()

    def add(self, address: str, connect: LinkFactory, *, fixed: bool = False) -> EngineLink:
        """Serve the link ``connect`` makes for ``address`` from now on (``fixed``:
        whatever the addresses discovery finds; a link the caller chose the kind of)."""
        assert self._nursery is not None, "add needs a running client"
        link = connect(address, self.frontend_id, self._notify)
        if fixed:
            self._fixed.append(link)
        self.links.append(link)
        self._nursery.start_soon(self._serve_link, link)
        return link

    async def _serve_link(self, link: EngineLink) -> None:
        try:
            await link.serve()
        finally:
            # A link let go of leaves the list (and /metrics); when the client itself
            # closes, the list stays as it was, for whoever looks afterwards.
            if link.retiring and link.scope.cancel_called:
                if link in self.links:
                    self.links.remove(link)
                if not any(other.address == link.address for other in self.links):
                    metrics.forget_engine(link.address)
                log.debug("engine %s: link closed", link.address)
                self._notify()


@contextlib.asynccontextmanager
async def open_engine_client(
    addresses: Sequence[str],
    connect: LinkFactory,
    *,
    links: Sequence[tuple[str, LinkFactory]] = (),
    frontend_id: str | None = None,
    policy: Policy | None = None,
    resolver: Resolver | None = None,
    refresh: float = DEFAULT_REFRESH,
) -> AsyncIterator[EngineClient]:
    """Serve a link to every engine in ``addresses``, and every link in ``links``.

    ``addresses``: what ``connect`` makes links of (``tcp://``, ``ipc://`` for
    trioserve's protocol), and ``dns://NAME:PORT`` names, resolved now (with
    ``resolver``, by default the system's) and every ``refresh`` seconds
    (:class:`~trioserve.engine.discovery.Discovery`). ``links``: ``(address, factory)``
    of links the caller makes itself (an EngineCore it started, with its own link),
    served beside them and never let go of. Owns the links' tasks; all end when
    the context exits. Does not wait for handshakes (see :meth:`EngineClient.wait_ready`):
    engines may come up after the frontend, and reconnect on their own after a restart.
    ``policy``: the routing policy (default :class:`~trioserve.engine.routing.LeastLoad`).
    """
    if not addresses and not links:
        raise ValueError("open_engine_client needs at least one engine address or link")
    client = EngineClient(connect, frontend_id, policy=policy)
    async with trio.open_nursery() as nursery:
        client._nursery = nursery
        for address, factory in links:
            client.add(address, factory, fixed=True)
        if addresses:
            discovery = Discovery(addresses, resolver=resolver, refresh=refresh)
            await nursery.start(discovery.serve, client.set_addresses)
        try:
            yield client
        finally:
            nursery.cancel_scope.cancel()


def new_frontend_id() -> str:
    return f"frontend-{uuid.uuid4().hex[:12]}"


__all__ = ["EngineClient", "new_frontend_id", "open_engine_client"]
