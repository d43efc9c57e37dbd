"""trioserve's error tree: one place, each name saying whose fault it was.

::

    TrioserveError            neutral: no HTTP status of its own
      InputError              a request refused for what it holds (the client's to change)
        TextInputError        what the text layer refuses: a sampling parameter vLLM
                              would reject, a prompt too long, a template's raise_exception
          ChatTemplateError, PromptTooLongError, UnsupportedContentError
      EngineError             about an engine: the request did not complete
        NoEngineError, EngineLostError, EngineOverloadedError, UnencodableRequestError,
        EngineCallError,
        EngineFailedError > ProtocolVersionError
      SlowClientError         the client fell behind its buffer bound
      WriterFailedError       a bug in one response's writer
      ClientGone              the client went away (its request ends quietly)
      PeerProtocolError       an engine-link message the protocol does not allow (the peer's)
      ZmtpProtocolError       the engine link broke ZeroMQ's wire protocol (the peer's)
        ZmtpRefusedError      the engine refused this frontend (ZMTP ERROR; a CURVE key)
      RequestError            raised by an engine backend (SDK) to end a request with a status
      CommandError            a command's usage or environment error (the CLI's exit status)

What reaches a client carries a machine-readable ``code`` (:class:`InputError`,
:class:`EngineError`, :class:`SlowClientError`, :class:`WriterFailedError`), and nothing
here an HTTP status: which status each is answered with, and the error answers of the
HTTP layer itself (``HTTPError``), are ``http/errors.py``'s; the bodies a client reads,
``http/error_bodies.py``'s; the built-in server's HTTP/1.1 parser has its own
(``server/http1/protocol.py``: ``HttpProtocolError``, a 4xx). One carries a status of its
own protocol: :class:`RequestError` (the engine protocol's error item carries an HTTP
status on the wire). This module imports nothing of trioserve.
"""

from __future__ import annotations


class TrioserveError(Exception):
    """Base of every error trioserve raises on purpose. Neutral: the errors that reach a
    client carry a machine-readable ``code``; their HTTP status and how a client reads
    them are the HTTP layer's (``http/errors.py``, ``http/error_bodies.py``)."""


class EngineError(TrioserveError):
    """Something about an engine; the request did not complete."""

    #: Machine-readable: what the client reads as the error's ``code``.
    code = "engine_unavailable"


class NoEngineError(EngineError):
    """No connected engine serves what the request asks for."""


class EngineLostError(EngineError):
    """The engine stopped answering heartbeats (or went away) while the request ran."""

    code = "engine_lost"


class EngineOverloadedError(EngineError):
    """The engine's send queue is full: the engine is not reading."""

    code = "engine_overloaded"


class UnencodableRequestError(EngineError):
    """The request holds a value the engine protocol cannot carry (an integer beyond 64
    bits, say): the client's to change. Raised before anything reaches the engine."""

    code = "invalid_request"


class EngineCallError(EngineError):
    """The engine answered a call with a failure (a vLLM EngineCore UTILITY call's
    message): that call failed, the engine serves on."""

    code = "engine_call_failed"


class EngineFailedError(EngineError):
    """The engine broke the protocol (refused our version, changed it, sent a frame over
    the bound): it is out of service, and tried again after a backoff."""

    code = "engine_failed"


class ProtocolVersionError(EngineFailedError):
    """The engine speaks another protocol version (an :class:`EngineFailedError`)."""

    code = "protocol_version_mismatch"


class SlowClientError(TrioserveError):
    """The client fell further behind than the per-request buffer allows."""

    code = "slow_client"


class WriterFailedError(TrioserveError):
    """A bug in one response's writer (its synchronous path, run by the engine link):
    that request ends with an internal error and one abort; nothing else is affected."""

    code = "internal_error"


class ClientGone(TrioserveError):
    """The client disconnected (or was dropped: a write that could not finish)."""


class PeerProtocolError(TrioserveError, ValueError):
    """A frame from the other end of an engine link (engine or frontend) that is not a
    valid message of this protocol version: the peer's fault."""


class ZmtpProtocolError(TrioserveError):
    """The engine link's peer broke ZeroMQ's wire protocol (greeting, handshake, framing,
    CURVE's boxes and nonces): that connection is dropped."""


class ZmtpRefusedError(ZmtpProtocolError):
    """The engine link's peer refused us with an ERROR command (under CURVE, usually a key
    its ZAP handler does not authorize)."""


class RequestError(TrioserveError):
    """Raised by an engine backend (the SDK) to end a request with an HTTP status the
    client will see."""

    def __init__(
        self, status: int, message: str, type: str = "engine_error", *, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        #: The machine-readable code the client reads (OpenAI's ``code``).
        self.type = type
        #: The request's parameter at fault, if one is (OpenAI's ``param``).
        self.param = param


class InputError(TrioserveError):
    """A request refused for what it holds, before anything reaches an engine: the
    client's to change. ``message`` says what is wrong, ``code`` is machine-readable,
    ``param`` names the parameter (or None)."""

    default_code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.param = param


class TextInputError(InputError):
    """A request the text layer refuses: a sampling parameter vLLM would reject, a prompt
    it cannot take, with vLLM's own message where vLLM refuses the same."""


class ChatTemplateError(TextInputError):
    """The chat template refused the conversation (its ``raise_exception``), failed to
    render it, or the model has none: the template's own message."""

    default_code = "chat_template_error"


class PromptTooLongError(TextInputError):
    """The prompt leaves no room in the model's context (or ``max_tokens`` asks for more
    than there is)."""

    default_code = "context_length_exceeded"


class UnsupportedContentError(TextInputError):
    """A content part the text pipeline cannot render (an image, audio: multimodal input
    is not served on the token-id path)."""

    default_code = "unsupported_content"


class CommandError(TrioserveError):
    """A usage or environment error of a ``trioserve`` command: one line that names the
    cause and the fix, and the exit status (2: the command line is wrong; 1: something it
    names cannot be used), without a traceback (but with it under ``--log-level debug``)."""

    def __init__(self, message: str, exit_status: int = 1) -> None:
        super().__init__(message)
        self.exit_status = exit_status
