"""CORS: which browser origins may call the API, and the preflight answer.

Configured with ``--cors-origin`` (repeatable). ``*`` allows any origin and is never sent
together with ``Access-Control-Allow-Credentials`` (browsers refuse that pair, and echoing
any origin with credentials would hand every site the user's cookies); the CLI refuses
``*`` with ``--cors-allow-credentials``. Without configured origins there is no CORS at all.
"""

from __future__ import annotations

from collections.abc import Iterable

ALLOWED_METHODS = b"GET, POST, DELETE, OPTIONS"
ALLOWED_HEADERS = b"authorization, content-type, x-request-id, x-request-timeout, x-session-id"
EXPOSED_HEADERS = b"x-request-id, retry-after"
#: Seconds a browser may cache a preflight answer.
MAX_AGE = b"600"


class CorsPolicy:
    def __init__(self, origins: Iterable[str], allow_credentials: bool = False) -> None:
        self.origins = frozenset(o.rstrip("/") for o in origins)
        self.any_origin = "*" in self.origins
        if self.any_origin and allow_credentials:
            raise ValueError("CORS credentials cannot be allowed for any origin ('*')")
        self.allow_credentials = allow_credentials

    @property
    def enabled(self) -> bool:
        return bool(self.origins)

    def allows(self, origin: bytes | None) -> bool:
        if origin is None or not self.origins:
            return False
        return self.any_origin or origin.decode("latin-1") in self.origins

    def response_headers(self, origin: bytes | None) -> list[tuple[bytes, bytes]]:
        """Headers for an actual (non-preflight) response to ``origin``."""
        if not self.allows(origin):
            return [(b"vary", b"origin")] if self.origins and not self.any_origin else []
        assert origin is not None
        if self.any_origin:
            return [
                (b"access-control-allow-origin", b"*"),
                (b"access-control-expose-headers", EXPOSED_HEADERS),
            ]
        headers = [
            (b"access-control-allow-origin", origin),
            (b"access-control-expose-headers", EXPOSED_HEADERS),
            (b"vary", b"origin"),
        ]
        if self.allow_credentials:
            headers.append((b"access-control-allow-credentials", b"true"))
        return headers

    def preflight_headers(
        self, origin: bytes | None, requested: bytes | None
    ) -> list[tuple[bytes, bytes]]:
        """Headers of the 204 answer to a preflight from an allowed ``origin``."""
        headers = [
            h for h in self.response_headers(origin) if h[0] != b"access-control-expose-headers"
        ]
        allowed = ALLOWED_HEADERS
        if requested:
            # Whatever the browser asks to send is fine: the server reads only what it knows.
            allowed = requested
        return [
            *headers,
            (b"access-control-allow-methods", ALLOWED_METHODS),
            (b"access-control-allow-headers", allowed),
            (b"access-control-max-age", MAX_AGE),
        ]
