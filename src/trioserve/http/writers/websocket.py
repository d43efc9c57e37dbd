"""One request's messages on a shared WebSocket (``/v1/ws``): chunks, then done or error."""

from __future__ import annotations

import json
from typing import Any, Protocol

from ...protocol import OutputItem, Usage
from ..errors import HTTPError
from .openai import StreamFormat, text_of, usage_dict
from .stream import WriterBase, engine_error


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


class MessageSink(Protocol):
    """What a request's writer needs of its WebSocket connection."""

    #: The client closed the socket (or it failed): nothing more can be sent.
    peer_gone: bool

    async def send_text(self, text: str) -> None: ...

    async def send_error(self, client_id: str | None, error: HTTPError) -> None: ...


class WebSocketWriter(WriterBase):
    """One request's messages on a shared WebSocket: chunks, then done or error."""

    transport = "ws"

    def __init__(self, connection: MessageSink, client_id: str, fmt: StreamFormat) -> None:
        self.connection = connection
        self.fmt = fmt
        self.client_id = client_id
        self._head = '{"type":"chunk","id":' + json.dumps(client_id) + ',"data":'
        #: What this request's messages came to (characters), and the status of its
        #: error message if it ended with one (the access log).
        self.sent = 0
        self.status: int | None = None

    async def _send(self, text: str) -> None:
        self.sent += len(text)
        await self.connection.send_text(text)

    def prepare(self) -> None:
        """What can be built before the first output (see ``StreamFormat.prepare``)."""
        self.fmt.prepare()

    async def write(self, batch: list[OutputItem]) -> bool:
        fmt, head, send = self.fmt, self._head, self._send
        for item in batch:
            if item.error is not None:
                raise engine_error(item)
            # The chunks the SSE route sends, one message each (a parsed stream's delta
            # may be several chunks, or none while the parser holds text back).
            if fmt.parser is not None and (item.data or item.logprobs is not None):
                chunks = fmt.chunks(text_of(item.data or ""), item.logprobs)
            else:
                chunk = fmt.item_delta(item)
                chunks = [chunk] if chunk else []
            for chunk in chunks:
                await send(head + chunk.decode() + "}")
            if item.finish_reason is not None:
                for chunk in fmt.flush():
                    await send(head + chunk.decode() + "}")
                end = fmt.finish(item.finish_reason, item.stop_reason)
                await send(head + end.decode() + "}")
                await self.finished(item)
                return True
        return False

    async def finished(self, item: OutputItem) -> None:
        """The request has completed (``item`` its last output): its ``done``."""
        await self.send_done(item.usage)

    async def send_done(self, usage: Usage | None) -> None:
        await self._send(_dumps({"type": "done", "id": self.client_id, "usage": usage_dict(usage)}))

    async def fail(self, error: HTTPError) -> None:
        await self.send_error(error)

    async def send_error(self, error: HTTPError) -> None:
        """The request's end: ``error`` (unless the client has gone)."""
        self.status = error.status
        if not self.connection.peer_gone:
            await self.connection.send_error(self.client_id, error)
