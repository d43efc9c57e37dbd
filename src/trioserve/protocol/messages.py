"""The engine protocol's messages, as plain attrs classes.

Sans-io: nothing here knows about trio, ZeroMQ or HTTP. ``docs/protocol.md`` is the
authority on the wire format; the field names below are the wire names.

Direction:

- frontend → engine: :class:`Hello`, :class:`Submit`, :class:`Abort`, :class:`Ping`
- engine → frontend: :class:`Welcome`, :class:`Reject`, :class:`Outputs`, :class:`Pong`
"""

from __future__ import annotations

from typing import Any

import attrs

#: Bumped on any incompatible change of the wire format. Peers with different versions
#: refuse each other at handshake time (the engine answers :class:`Reject`).
PROTOCOL_VERSION = 1


@attrs.frozen
class Hello:
    """First message of a frontend; also re-sent while the frontend waits for a welcome."""

    protocol_version: int
    frontend_id: str


@attrs.frozen
class ModelCard:
    id: str
    owned_by: str = "trioserve"


@attrs.frozen
class Limits:
    #: Requests the engine will hold at once (running + queued); 0 means no stated limit.
    max_requests: int = 0
    #: Largest ``max_tokens`` the engine accepts; 0 means no stated limit.
    max_tokens: int = 0


@attrs.frozen
class Welcome:
    protocol_version: int
    engine_id: str
    #: Random id of this engine process's lifetime: a new one after every restart, so a
    #: frontend notices a restart even when it happened between two heartbeats.
    session: str
    models: list[ModelCard]
    #: What the engine can do, e.g. ``["chat", "completion"]``; routes check this list.
    capabilities: list[str]
    limits: Limits = Limits()
    #: How long the engine waits without hearing from a frontend before it aborts that
    #: frontend's requests itself (orphan cleanup), in seconds.
    frontend_timeout: float = 0.0
    #: The engine is draining: it takes no new requests (see :class:`Pong`).
    draining: bool = False


@attrs.frozen
class Reject:
    """The engine refuses a :class:`Hello` (protocol version mismatch)."""

    protocol_version: int
    message: str


@attrs.frozen
class Submit:
    request_id: str
    model: str
    #: What to do: ``"chat"`` (``inputs.messages``) or ``"completion"`` (``inputs.prompt``).
    task: str
    inputs: dict[str, Any]
    #: Generation parameters: ``max_tokens``, ``temperature``, ``seed``, ... and, for the
    #: mock engine, ``mock_*`` fault knobs. Unknown keys are the engine's to ignore.
    params: dict[str, Any] = attrs.Factory(dict)
    #: The request's W3C Trace Context when the frontend traces it (``traceparent``, and
    #: ``tracestate`` if any, under those names): an engine's own spans of the request
    #: join the frontend's trace by taking it as their parent. None: not traced.
    trace_context: dict[str, str] | None = None
    #: The client's session (``X-Session-Id``, else the body's ``user``), for the
    #: frontend's affinity routing (docs/deployment.md). **Not on the wire**: the codec
    #: neither sends nor reads it, so an end user's id never reaches an engine.
    session_key: str | None = None

    def with_inputs(self, inputs: dict[str, Any]) -> Submit:
        """This request with ``inputs`` in place of its own (made directly:
        ``attrs.evolve`` introspects the class on every call, and this is every chat
        request's path)."""
        return Submit(
            self.request_id,
            self.model,
            self.task,
            inputs,
            self.params,
            self.trace_context,
            self.session_key,
        )


@attrs.frozen
class Abort:
    request_ids: list[str]


@attrs.frozen
class Ping:
    seq: int


@attrs.frozen
class Pong:
    seq: int
    session: str
    #: Requests the engine is generating for right now (all frontends).
    running: int
    #: Requests accepted but not yet started.
    queued: int
    #: Fraction of the engine's KV cache in use, 0.0 to 1.0, where the engine has one
    #: (vLLM's scheduler figure); absent otherwise.
    kv_cache_usage: float | None = None
    #: The engine is draining (it got SIGTERM): it refuses new requests with a 503
    #: ``engine_draining`` error item and finishes those it has. An engine sends one such
    #: pong unasked to every frontend it knows when its drain begins.
    draining: bool = False


@attrs.frozen
class Usage:
    prompt_tokens: int
    completion_tokens: int
    #: Of ``prompt_tokens``, how many the engine found in its prefix cache, where it
    #: knows (the OpenAI ``prompt_tokens_details.cached_tokens``).
    cached_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen
class ErrorInfo:
    #: The HTTP status the frontend should answer with (4xx: the request's fault,
    #: 5xx: the engine's).
    status: int
    message: str
    type: str = "engine_error"
    #: The request's parameter the error is about (a 400's), as OpenAI's error ``param``;
    #: left out when None (a peer that does not know it reads the error as before).
    param: str | None = None


@attrs.define  # not frozen: one is built per token, and frozen __init__ costs 3x
class OutputItem:
    """One delta of one request. An item with ``finish_reason`` or ``error`` is the last."""

    request_id: str
    seq: int
    modality: str = "text"
    data: str | bytes | None = None
    usage: Usage | None = None
    finish_reason: str | None = None
    error: ErrorInfo | None = None
    #: Media type of a binary ``data`` payload, e.g. ``"image/png"``, ``"video/mp4"`` or
    #: ``"audio/pcm;rate=24000"`` (signed 16-bit little-endian samples).
    mime_type: str | None = None
    #: Log probabilities of this item's tokens, when the request asked for them, in the
    #: OpenAI shape of its task (see docs/protocol.md): ``chat``, a list of
    #: ``{token, logprob, bytes, top_logprobs}``; ``completion``, a map of the parallel
    #: lists ``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``.
    logprobs: Any = None
    #: Seconds the request waited in the engine before its generation began, where the
    #: engine knows (a scheduler's queue); sent with the last item.
    queue_time: float | None = None
    #: What stopped a request that ended ``stop``, where it was not the end of sequence:
    #: the stop string it matched (str) or the stop token it generated (int), as vLLM's
    #: ``stop_reason``; sent with the final item.
    stop_reason: str | int | None = None
    #: The ids of this item's tokens, when the request asked for them
    #: (``return_token_ids``), from engines that have them (vLLM's, on either path).
    token_ids: list[int] | None = None
    #: With a request's first item, when it asked: the prompt's token ids
    #: (``return_token_ids``; a completion's ``echo``), and its log probabilities
    #: (``prompt_logprobs``) as vLLM answers them,
    #: ``[null, {"<id>": {"logprob", "rank", "decoded_token"}}, …]`` (the first prompt
    #: token has none).
    prompt_token_ids: list[int] | None = None
    prompt_logprobs: list[Any] | None = None

    @property
    def final(self) -> bool:
        return self.finish_reason is not None or self.error is not None


@attrs.frozen
class Outputs:
    """A batch: every delta one engine step produced for one frontend."""

    items: list[OutputItem]


Message = Hello | Welcome | Reject | Submit | Abort | Ping | Pong | Outputs

#: Wire tag of each message class (the first element of every frame).
TAGS: dict[type, str] = {
    Hello: "hello",
    Welcome: "welcome",
    Reject: "reject",
    Submit: "submit",
    Abort: "abort",
    Ping: "ping",
    Pong: "pong",
    Outputs: "outputs",
}
