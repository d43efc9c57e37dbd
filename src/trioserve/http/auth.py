"""API keys: who may use the server (``--api-key``, ``--api-key-file``, ``TRIOSERVE_API_KEY``).

Sans-io: the configured keys in, a request's header values in, a decision out (the index
of the key it came with, or a 401 to send). The application decides which routes need a
key (``App._http``); this module only answers "which key is this, if any".

A key is compared in constant time against every configured key: both sides are hashed
(SHA-256) first, so ``hmac.compare_digest`` compares two 32-byte digests and learns
nothing from the key's length, and no comparison stops at the first match, so the time
does not say which key matched. What a request sends is hashed in time linear in its
own length, which tells an attacker only what it already knows. This is vLLM's scheme.

A request is known by the *index* of its key among the configured ones, never by the key,
so nothing that logs or stores a request's owner can leak a key.

Browsers cannot set headers on a WebSocket: there, the key may travel as a subprotocol
offered in ``Sec-WebSocket-Protocol``, ``trioserve.bearer.<KEY>`` (the scheme of
Kubernetes' ``base64url.bearer.authorization.k8s.io.<token>`` and OpenAI's
``openai-insecure-api-key.<key>``). The server never selects that token as the
connection's subprotocol (it would echo the key); a client that offers the real one,
``trioserve.v1``, gets it selected, which browsers require when they offer any.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence

from .errors import HTTPError

#: The environment variable that holds one more key.
ENV_VAR = "TRIOSERVE_API_KEY"
#: ``Sec-WebSocket-Protocol`` token that carries a key: this prefix, then the key.
BEARER_SUBPROTOCOL = "trioserve.bearer."
#: The subprotocol the server selects when a client offers it (docs/websocket.md's
#: messages); never the key-bearing token.
SUBPROTOCOL = "trioserve.v1"

_CHALLENGE = b'Bearer realm="trioserve"'
#: RFC 6750 §3.1: no ``error`` attribute when the request carried no credentials at all.
_CHALLENGE_INVALID = b'Bearer realm="trioserve", error="invalid_token"'

#: RFC 7230 ``tchar``: what a key must be made of to travel as a subprotocol token.
_TCHARS = frozenset(
    b"!#$%&'*+-.^_`|~" + bytes(range(48, 58)) + bytes(range(65, 91)) + bytes(range(97, 123))
)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def refusal(message: str, *, invalid: bool = True) -> HTTPError:
    """The 401 of every refused request: OpenAI's shape, and RFC 6750's challenge."""
    challenge = _CHALLENGE_INVALID if invalid else _CHALLENGE
    return HTTPError(
        401,
        message,
        "invalid_api_key",
        type="invalid_request_error",
        headers=[(b"www-authenticate", challenge)],
    )


MISSING = "no API key: send it as 'Authorization: Bearer <key>' (or 'X-Api-Key: <key>')"
MALFORMED = "the Authorization header must be 'Bearer <key>'"
WRONG = "the API key is not valid"
AMBIGUOUS = "more than one API key was sent"


class ApiKeys:
    """The configured keys (held as digests). With none, every request is allowed."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        unique = dict.fromkeys(keys)
        for key in unique:
            check_key(key)
        self._digests = tuple(_digest(key.encode("ascii")) for key in unique)

    def __len__(self) -> int:
        return len(self._digests)

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def match(self, key: bytes) -> int | None:
        """The index of ``key`` among the configured keys, or None; constant time."""
        candidate = _digest(key)
        found = -1
        for index, digest in enumerate(self._digests):
            # No early exit, no branch on the comparison: every key costs the same.
            same = hmac.compare_digest(candidate, digest)
            found += (index - found) * same
        return None if found < 0 else found

    def authenticate(
        self, authorization: Sequence[bytes], api_key: Sequence[bytes] = ()
    ) -> int | None:
        """Which key an HTTP request came with: the values of its ``Authorization``
        headers and of its ``X-Api-Key`` headers (``api_key``: how Anthropic's clients
        send a key) in, the key's index out (None when no keys are configured). One key,
        in one header, or a 401: raises the :class:`HTTPError` to send when the request
        may not pass."""
        if not self._digests:
            return None
        if not authorization and not api_key:
            raise refusal(MISSING, invalid=False)
        if len(authorization) + len(api_key) > 1:
            raise refusal(AMBIGUOUS)
        if api_key:
            return self._check(api_key[0].strip(b" \t"))
        return self._check(bearer_token(authorization[0]))

    def authenticate_websocket(
        self, authorization: Sequence[bytes], protocols: Sequence[bytes]
    ) -> int | None:
        """As :meth:`authenticate`, for a WebSocket handshake: the key in the
        ``Authorization`` header or in a ``trioserve.bearer.<KEY>`` subprotocol
        (``protocols``: the values of its ``Sec-WebSocket-Protocol`` headers), not both."""
        if not self._digests:
            return None
        tokens = [p for p in offered_subprotocols(protocols) if p.startswith(BEARER_SUBPROTOCOL)]
        if not tokens:
            return self.authenticate(authorization)
        if authorization or len(tokens) > 1:
            raise refusal(AMBIGUOUS)
        return self._check(tokens[0].removeprefix(BEARER_SUBPROTOCOL).encode("latin-1"))

    def _check(self, key: bytes | None) -> int:
        if not key:
            raise refusal(MALFORMED)
        index = self.match(key)
        if index is None:
            raise refusal(WRONG)
        return index


def bearer_token(value: bytes) -> bytes | None:
    """The token of ``Authorization: Bearer <token>`` (the scheme in any case, RFC 7235),
    or None when the header is not that (another scheme, no token, spaces in it)."""
    scheme, _, token = value.strip().partition(b" ")
    token = token.strip(b" \t")
    if scheme.lower() != b"bearer" or not token or b" " in token or b"\t" in token:
        return None
    return token


def offered_subprotocols(values: Sequence[bytes]) -> list[str]:
    """The subprotocols a WebSocket client offers, in its order (every header's values)."""
    offered = []
    for value in values:
        for part in value.decode("latin-1").split(","):
            part = part.strip()
            if part:
                offered.append(part)
    return offered


def select_subprotocol(values: Sequence[bytes]) -> str | None:
    """The subprotocol to accept a WebSocket with: :data:`SUBPROTOCOL` if offered,
    else none (never a key-bearing token)."""
    return SUBPROTOCOL if SUBPROTOCOL in offered_subprotocols(values) else None


def header_values(headers: Iterable[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    """Every value of header ``name`` (lower case) in an ASGI header list."""
    return [value for key, value in headers if key.lower() == name]


def check_key(key: str) -> None:
    """Raise ValueError (a message for the command line) if ``key`` cannot be a key."""
    if not key:
        raise ValueError("an API key cannot be empty")
    if not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ValueError(
            "an API key must be printable ASCII without spaces (it travels in an HTTP header)"
        )


def subprotocol_safe(key: str) -> bool:
    """Whether ``key`` can travel as a ``trioserve.bearer.<KEY>`` subprotocol (browsers
    accept only RFC 7230 token characters there: no ``/``, ``=``, ``:`` or quotes)."""
    return all(c in _TCHARS for c in key.encode("ascii"))


def read_key_file(path: str) -> list[str]:
    """The keys in ``path``: one a line (``KEY`` or ``LABEL: KEY``); blank lines and ``#``
    comments are skipped. Raises ValueError with a message for the command line."""
    return [key for _, key in read_labelled_keys(path)]


def read_labelled_keys(path: str, text: str | None = None) -> list[tuple[str | None, str]]:
    """The ``(label, key)`` pairs of key file ``path`` (or of its ``text``): a line is
    ``KEY``, or ``LABEL: KEY``, the label being what the access log
    and ``/debug/requests`` call the key (never the key itself). Raises ValueError with a
    message for the command line."""
    if text is None:
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ValueError(f"cannot read the API key file {path}: {reason}") from None
    pairs: list[tuple[str | None, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        # "LABEL: KEY": a key has no spaces, so ": " cannot be in one; a line with a
        # stray space and no ": " is still refused (never read as a shorter key).
        label, _, key = line.rpartition(": ")
        label, key = label.strip(), key.strip()
        try:
            check_key(key)
            if label and not _printable_label(label):
                raise ValueError("a key's label must be printable, without quotes")
        except ValueError as exc:
            raise ValueError(f"{path}, line {number}: {exc}") from None
        pairs.append((label or None, key))
    if not pairs:
        raise ValueError(f"the API key file {path} holds no key")
    return pairs


#: Longest label kept (a longer one is cut).
MAX_LABEL = 64


def _printable_label(label: str) -> bool:
    return label.isprintable() and '"' not in label


def key_labels(keys: Sequence[str], key_file: str | None) -> list[str]:
    """What each of ``keys`` is called in logs: its label in ``key_file``, else
    ``key-N`` (its position, from 1). Never the key."""
    named: dict[str, str] = {}
    if key_file is not None:
        for label, key in read_labelled_keys(key_file):
            if label:
                named.setdefault(key, label[:MAX_LABEL])
    return [named.get(key, f"key-{index + 1}") for index, key in enumerate(keys)]


def load_keys(keys: Iterable[str], key_file: str | None, environ: Mapping[str, str]) -> list[str]:
    """Every configured key: ``--api-key`` values, the ``--api-key-file`` lines and
    ``TRIOSERVE_API_KEY`` (if set and not empty), each once, in that order. Raises
    ValueError with a message for the command line."""
    found = list(keys)
    for key in found:
        check_key(key)
    if key_file is not None:
        found += read_key_file(key_file)
    from_env = environ.get(ENV_VAR, "").strip()
    if from_env:
        try:
            check_key(from_env)
        except ValueError as exc:
            raise ValueError(f"{ENV_VAR}: {exc}") from None
        found.append(from_env)
    return list(dict.fromkeys(found))
