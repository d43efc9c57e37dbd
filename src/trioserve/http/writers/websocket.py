"""One request's messages on a shared WebSocket (``/v1/ws``): chunks, then done or error."""

from __future__ import annotations

import json
from typing import Any, Protocol

from ...protocol import OutputItem
from ..errors import HTTPError
from .openai import StreamFormat, usage_dict
from .stream import WriterBase, engine_error, text_of


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
            if fmt.parser is not None:
                if item.data or item.logprobs is not None:
                    for chunk in fmt.chunks(text_of(item.data or ""), item.logprobs):
                        await send(head + chunk.decode() + "}")
            elif item.logprobs is not None or item.token_ids or item.prompt_token_ids:
                text = text_of(item.data or "")
                chunk = fmt.delta_with_logprobs(text, item.logprobs, item=item)
                await send(head + chunk.decode() + "}")
            elif item.data:
                await send(head + fmt.delta(text_of(item.data)).decode() + "}")
            if item.finish_reason is not None:
                for chunk in fmt.flush():
                    await send(head + chunk.decode() + "}")
                end = fmt.finish(item.finish_reason, item.stop_reason)
                await send(head + end.decode() + "}")
                done = {"type": "done", "id": self.client_id, "usage": usage_dict(item.usage)}
                await send(_dumps(done))
                return True
        return False

    async def fail(self, error: HTTPError) -> None:
        self.status = error.status
        if not self.connection.peer_gone:
            await self.connection.send_error(self.client_id, error)
