"""An engine link with a prepare phase and frontend-decided ends, over the real mock engine:
what the EngineCore link does (tokenize before submit, end at a stop string), with
trioserve's protocol underneath, so the seam is tested apart from vLLM."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from trioserve.ends import EndReason
from trioserve.engine import LinkFactory, Prepared, Subscription
from trioserve.errors import InputError
from trioserve.links.protocol import HeartbeatConfig, ProtocolLink
from trioserve.protocol import OutputItem, Outputs, Submit, Usage, decode

#: The prompt words the preparer acts on.
REFUSE, SLOW = "please-refuse", "please-wait"
#: The prompt word that makes the link conclude the request after this many tokens.
STOP_AFTER = 3


def prompt_of(message: Submit) -> str:
    inputs = message.inputs
    if isinstance(inputs.get("prompt"), str):
        return inputs["prompt"]
    return " ".join(str(m.get("content")) for m in inputs.get("messages") or ())


class Preparer:
    """Refuses prompts with :data:`REFUSE` (a 400), holds those with :data:`SLOW` until
    :attr:`release` is set, and counts what it prepared."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.waiting = 0
        self.prepared: list[str] = []

    def prepare_at_once(self, message: Submit) -> Prepared | None:
        """A prompt without :data:`SLOW`, at once (refused at once with :data:`REFUSE`)."""
        prompt = prompt_of(message)
        if REFUSE in prompt:
            raise InputError("the prompt cannot be tokenized", code="invalid_prompt")
        if SLOW in prompt:
            return None
        self.prepared.append(message.request_id)
        return Prepared(message, self, payload=len(prompt))

    async def prepare(self, message: Submit) -> Prepared:
        prepared = self.prepare_at_once(message)
        if prepared is not None:
            return prepared
        self.waiting += 1
        try:
            await self.release.wait()
        finally:
            self.waiting -= 1
        await trio.lowlevel.checkpoint()
        self.prepared.append(message.request_id)
        return Prepared(message, self, payload=len(prompt_of(message)))


class PreparingLink(ProtocolLink):
    """trioserve's protocol with a preparer, ending requests whose prompt says ``stop``
    after :data:`STOP_AFTER` text items as a stop string would (``Subscription.conclude``)."""

    def __init__(self, preparer: Preparer, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.preparer = preparer
        self._stops: dict[str, int] = {}

    def submit(
        self,
        prepared: Prepared | Submit,
        buffer: int = 256,
        on_failure: Callable[[EndReason], None] | None = None,
    ) -> Subscription:
        assert isinstance(prepared, Prepared) and prepared.by is self.preparer
        if "stop" in prompt_of(prepared.message):
            self._stops[prepared.message.request_id] = STOP_AFTER
        return super().submit(prepared, buffer, on_failure)

    def _on_message(self, frames: list[bytes]) -> None:
        message = decode(frames[0]) if len(frames) == 1 else None
        if not isinstance(message, Outputs) or not self._stops:
            return super()._on_message(frames)
        self._unanswered_since = None
        for item in message.items:
            sub = self._subs.get(item.request_id)
            if sub is None:
                continue
            left = self._stops.get(item.request_id)
            if left is None or item.final:
                self._stops.pop(item.request_id, None)
                sub.deliver(item)
            elif left > 1:
                self._stops[item.request_id] = left - 1
                sub.deliver(item)
            else:
                del self._stops[item.request_id]
                sub.conclude(
                    OutputItem(
                        item.request_id,
                        item.seq,
                        data=item.data,
                        finish_reason="stop",
                        usage=Usage(1, STOP_AFTER),
                    )
                )
        return None


def preparing_links(preparer: Preparer, heartbeat: HeartbeatConfig | None = None) -> LinkFactory:
    """The link factory of :class:`PreparingLink` (``serve_frontend(links=...)``)."""

    def connect(address: str, frontend_id: str, on_change: Callable[[], None]) -> PreparingLink:
        return PreparingLink(
            preparer, address, frontend_id, heartbeat or HeartbeatConfig(), on_change
        )

    return connect


__all__ = ["STOP_AFTER", "EndReason", "Preparer", "PreparingLink", "preparing_links"]
