"""The engine-link interface: what the engine client needs of one engine, whatever it speaks.

The engine client (:mod:`~trioserve.engine.client`) routes, fails over, counts and shows
requests over :class:`EngineLink` alone, as httpcore's pool works over a connection
interface; it never imports a link. Two links implement it, in ``trioserve.links``:
trioserve's own protocol to an SDK engine (``links/protocol.py``) and vLLM's EngineCore
boundary (``links/vllm.py``). Which one serves an address is the caller's choice
(:data:`LinkFactory`), per engine.

A request reaches a link in two phases:

1. **prepare** (:class:`Preparer`, awaited in the request's scope): what must happen
   before the engine hears of the request: for EngineCore, rendering the chat template
   and tokenizing. It is cancellable and owes the engine nothing (nothing was sent); its
   :class:`~trioserve.errors.InputError` is the response (a 400 for what the text pipeline
   refuses). A link that needs none (``preparer`` None) takes the submit as it is, and
   the phase costs nothing.
2. **submit** (synchronous): the subscription is registered and the request queued; from
   here the request ends exactly once (:mod:`~trioserve.engine.subscription`).

What was prepared by one preparer can be submitted to any link with that same preparer:
failover stays among those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import attrs
import trio

from ..ends import EndReason
from ..protocol import ErrorInfo, ModelCard, Submit
from .subscription import Subscription


@attrs.frozen
class Prepared:
    """A submit made ready for the links of one preparer (``by``; None: any link that
    needs no preparation). ``payload``: what that preparer made of it (the link's own)."""

    message: Submit
    by: Preparer | None = None
    payload: Any = None


class Preparer(Protocol):
    """Turns a submit into what its links send (tokenization, rendering)."""

    def prepare_at_once(self, message: Submit) -> Prepared | None:
        """The submit prepared here and now, when that costs less than the watched,
        cancellable :meth:`prepare` around it (a short prompt: no thread, no hang-up
        watch); None when it does not. Raises as :meth:`prepare` does."""
        ...

    async def prepare(self, message: Submit) -> Prepared:
        """Cancellable; raises :class:`~trioserve.errors.InputError` for what it refuses."""
        ...


class EngineLink(Protocol):
    """One engine, as the engine client sees it. Created by a :data:`LinkFactory`, served
    by the client (:meth:`serve`) until it is let go of or the client closes."""

    #: Where it is (logs, /metrics labels, routing's rendezvous hash).
    address: str
    #: It said it is draining: nothing new is routed to it.
    draining: bool
    #: The client no longer wants it (:meth:`retire`).
    retiring: bool
    #: The scope :meth:`serve` runs in; cancelled once a retiring link is idle.
    scope: trio.CancelScope
    #: The engine's KV-cache usage (0.0 to 1.0) where it reports one.
    kv_cache_usage: float | None
    #: What prepares its submits (None: it takes them as they are).
    preparer: Preparer | None

    @property
    def failure(self) -> str | None:
        """Why it is out of service, while it is (see :meth:`EngineClient.failures`)."""

    @property
    def ready(self) -> bool:
        """Handshake done: it says what it serves."""
        ...

    @property
    def accepting(self) -> bool:
        """Ready, not draining, not retiring: new requests may be routed here."""
        ...

    @property
    def load(self) -> int:
        """Requests at the engine (all frontends'), for routing."""
        ...

    @property
    def in_flight(self) -> int:
        """This frontend's requests there."""
        ...

    @property
    def models(self) -> Sequence[ModelCard]:
        """What it serves (empty until ready)."""
        ...

    @property
    def capabilities(self) -> Sequence[str]:
        """The tasks it serves (``chat``, ``completion``, …; empty until ready)."""
        ...

    def serves(self, model: str | None, capability: str) -> bool: ...

    def serves_model(self, model: str) -> bool: ...

    def retire(self) -> None:
        """Route nothing more here; stop serving once its requests have ended."""
        ...

    def unretire(self) -> None: ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the link's sockets and tasks until cancelled (or :attr:`scope` is)."""
        ...

    def submit(
        self,
        prepared: Prepared,
        buffer: int,
        on_failure: Callable[[EndReason], None] | None,
    ) -> Subscription:
        """Register a subscription and queue the request. Does not wait. Raises
        :class:`~trioserve.errors.EngineOverloadedError` if it takes nothing more."""
        ...

    def adopt(self, sub: Subscription, prepared: Prepared) -> None:
        """Take over ``sub``, whose engine did not start it (failover). Raises as
        :meth:`submit` does, with ``sub`` unchanged."""
        ...

    # What a subscription needs of its link (subscription.RequestLink):

    def forget(self, request_id: str) -> None: ...

    def queue_abort(self, request_id: str) -> None: ...

    def hold(self, sub: Subscription) -> None: ...

    def refusal(self, error: ErrorInfo) -> str | None: ...


#: Makes the link for one engine address: ``(address, frontend_id, on_change)``, where
#: ``on_change`` is to be called whenever the link connects, is lost, fails, drains or is
#: let go of.
LinkFactory = Callable[[str, str, Callable[[], None]], EngineLink]
